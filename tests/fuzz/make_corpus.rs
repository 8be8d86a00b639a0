//! Makes the fuzz targets' seed corpus again from real samples (it replaces
//! `tests/fuzz/corpus`, whose files are checked in); run by hand when a format changes,
//! never by `cargo test`:
//!
//! ```sh
//! cargo test --features failpoints --test fuzz_corpus
//! ```
//!
//! Disk images are made by drivelet's own writer on image files, then made hostile
//! (huge or zero entry counts and sizes, reversed, overlapping and out-of-range
//! partitions, bad CRCs, invalid UTF-16 names, a looping EBR chain, a 4 KiB-sector GPT
//! read with 512-byte sectors); text seeds are the fixtures under `tests/fixtures`,
//! `config/`, and samples of each tool's output.

use std::os::unix::fs::FileExt;
use std::path::Path;

use drivelet::disk::{clean, gpt, note, snapshot_note, volume_key};
use drivelet::fuzz::Image;

const MIB: u64 = 1 << 20;
/// Flags of an image input: 4 KiB sectors.
const SECTOR_4K: u8 = 1;
/// Flags of an image input: repair checksums.
const REPAIR: u8 = 2;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

struct Out {
    dir: std::path::PathBuf,
}

impl Out {
    fn new(target: &str) -> Out {
        let dir = root().join("tests/fuzz/corpus").join(target);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("corpus dir");
        Out { dir }
    }
    fn put(&self, name: &str, bytes: &[u8]) {
        std::fs::write(self.dir.join(name), bytes).expect("write a seed");
    }
    fn copy_dir(&self, dir: &Path, prefix: &str) {
        let mut n = 0;
        for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let p = e.expect("entry").path();
            if p.is_file() && p.extension().is_none_or(|x| x != "md") {
                self.put(&format!("{prefix}{}", p.file_name().expect("name").to_string_lossy()), &std::fs::read(&p).expect("read a fixture"));
                n += 1;
            }
        }
        assert!(n > 0, "{}: no fixture", dir.display());
    }
}

/// A drivelet disk made by drivelet's writer: two volumes added, one removed (so the
/// journal lists dirty space), a note naming its owner and volume.
fn drivelet_image(dir: &Path, sector: u64) -> Vec<u8> {
    let img = dir.join(format!("drivelet-{sector}.img"));
    std::fs::File::create(&img).expect("image").set_len(64 * MIB).expect("size");
    drivelet::disk::fs::set_probe_stand_in(Some(None));
    let (a, b) = (gpt::volume_partition_guid("pvc-a"), gpt::volume_partition_guid("pvc-b"));
    gpt::add_partition(&img, sector, a, &gpt::partition_label("pvc-a"), MIB, 4 * MIB).expect("add a");
    gpt::add_partition(&img, sector, b, &gpt::partition_label("pvc-b"), 8 * MIB, 4 * MIB).expect("add b");
    assert!(gpt::remove_partition(&img, sector, b).expect("remove b"));
    let owner = drivelet::words::Owner { cluster: "c0ffee".into(), node: "node-1".into() };
    gpt::write_note(&img, sector, true, |_| note::DiskNote {
        owner: owner.clone(),
        adopted_from: None,
        volumes: vec![note::VolumeNote {
            id: a,
            name: "pvc-a".into(),
            size: 4 * MIB,
            block: false,
            fs_type: "ext4".into(),
            created_unix: 1_700_000_000,
            parameters: [("csi.storage.k8s.io/fstype".to_string(), "ext4".to_string())].into(),
            snapshot: false,
            binding: drivelet::words::Binding { pv: "pv-a".into(), claim_namespace: "db".into(), claim_name: "data-0".into(), ..Default::default() },
        }],
    })
    .expect("write the note");
    drivelet::disk::fs::set_probe_stand_in(None);
    match gpt::examine(&img, sector) {
        Ok(gpt::Contents::Drivelet(t)) => assert!(matches!(t.note, note::NoteState::Note(_)), "{t:?}"),
        other => panic!("drivelet's own image examined as {other:?}"),
    }
    std::fs::read(&img).expect("read the image")
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8"))
}

/// The byte offsets of both GPT headers of `img`.
fn headers(img: &[u8], sector: usize) -> [usize; 2] {
    [sector, img.len() / sector * sector - sector]
}

/// Edits both headers.
fn each_header(img: &mut [u8], sector: usize, edit: impl Fn(&mut [u8])) {
    for h in headers(img, sector) {
        edit(&mut img[h..h + 92]);
    }
}

/// Edits entry `i` of both entry arrays.
fn each_entry(img: &mut [u8], sector: usize, i: usize, edit: impl Fn(&mut [u8])) {
    for h in headers(img, sector) {
        let start = le64(img, h + 72) as usize * sector + 128 * i;
        edit(&mut img[start..start + 128]);
    }
}

/// The checksums made right again (through the target's own repair).
fn repaired(dir: &Path, img: &[u8]) -> Vec<u8> {
    let p = dir.join("repair.img");
    std::fs::write(&p, img).expect("write");
    let f = std::fs::File::options().read(true).write(true).open(&p).expect("open");
    drivelet::fuzz::repair_checksums(&f, img.len() as u64).expect("repair");
    let mut out = vec![0u8; img.len()];
    f.read_exact_at(&mut out, 0).expect("read");
    out
}

fn gpt_seeds(dir: &Path) {
    let out = Out::new("gpt");
    let d512 = drivelet_image(dir, 512);
    let d4k = drivelet_image(dir, 4096);
    out.put("drivelet-512", &Image::encode_bytes(&d512, REPAIR));
    out.put("drivelet-4096", &Image::encode_bytes(&d4k, SECTOR_4K | REPAIR));
    out.put("drivelet-512-blkid-finds-ext4", &Image::encode_bytes(&d512, 2 << 2));
    out.put("gpt-4096-read-with-512-byte-sectors", &Image::encode_bytes(&d4k, 0));
    out.put("gpt-512-read-with-4096-byte-sectors", &Image::encode_bytes(&d512, SECTOR_4K));
    out.put("blank-64mib", &Image::encode_bytes(&vec![0u8; 64 << 20], 0));
    let mut tiny = 1000u64.to_le_bytes().to_vec();
    tiny.push(0);
    out.put("blank-1000-bytes", &tiny);

    let hostile: Vec<(&str, Box<dyn Fn(&mut Vec<u8>)>, bool)> = vec![
        ("entries-4294967295", Box::new(|i: &mut Vec<u8>| each_header(i, 512, |h| h[80..84].copy_from_slice(&u32::MAX.to_le_bytes()))), true),
        ("entries-0", Box::new(|i: &mut Vec<u8>| each_header(i, 512, |h| h[80..84].fill(0))), true),
        ("entry-size-0", Box::new(|i: &mut Vec<u8>| each_header(i, 512, |h| h[84..88].fill(0))), true),
        ("entry-size-256", Box::new(|i: &mut Vec<u8>| each_header(i, 512, |h| h[84..88].copy_from_slice(&256u32.to_le_bytes()))), true),
        ("entry-size-4294967295", Box::new(|i: &mut Vec<u8>| each_header(i, 512, |h| h[84..88].copy_from_slice(&u32::MAX.to_le_bytes()))), true),
        ("entries-4096-past-the-end", Box::new(|i: &mut Vec<u8>| each_header(i, 512, |h| h[80..84].copy_from_slice(&4096u32.to_le_bytes()))), true),
        ("entry-array-at-lba-max", Box::new(|i: &mut Vec<u8>| each_header(i, 512, |h| h[72..80].copy_from_slice(&u64::MAX.to_le_bytes()))), true),
        (
            "partition-reversed",
            Box::new(|i: &mut Vec<u8>| {
                each_entry(i, 512, 0, |e| {
                    let (f, l) = (le64(e, 32), le64(e, 40));
                    e[32..40].copy_from_slice(&l.to_le_bytes());
                    e[40..48].copy_from_slice(&f.to_le_bytes());
                })
            }),
            true,
        ),
        (
            "partitions-overlapping",
            Box::new(|i: &mut Vec<u8>| {
                for h in headers(i, 512) {
                    let start = le64(i, h + 72) as usize * 512;
                    let first = i[start..start + 128].to_vec();
                    i[start + 128..start + 256].copy_from_slice(&first);
                    i[start + 128 + 16] ^= 0xff;
                }
            }),
            true,
        ),
        ("partition-past-the-end", Box::new(|i: &mut Vec<u8>| each_entry(i, 512, 0, |e| e[40..48].copy_from_slice(&u64::MAX.to_le_bytes()))), true),
        ("partition-at-lba-2-62", Box::new(|i: &mut Vec<u8>| each_entry(i, 512, 0, |e| e[32..40].copy_from_slice(&(1u64 << 62).to_le_bytes()))), true),
        ("partition-in-the-reserved-mib", Box::new(|i: &mut Vec<u8>| each_entry(i, 512, 0, |e| e[32..40].copy_from_slice(&34u64.to_le_bytes()))), true),
        ("name-lone-surrogate", Box::new(|i: &mut Vec<u8>| each_entry(i, 512, 0, |e| e[56..58].copy_from_slice(&0xd800u16.to_le_bytes()))), true),
        ("first-usable-after-last-usable", Box::new(|i: &mut Vec<u8>| each_header(i, 512, |h| h[40..48].copy_from_slice(&u64::MAX.to_le_bytes()))), true),
        ("header-crc-bad", Box::new(|i: &mut Vec<u8>| each_header(i, 512, |h| h[16] ^= 1)), false),
        ("entries-crc-bad", Box::new(|i: &mut Vec<u8>| each_header(i, 512, |h| h[88] ^= 1)), false),
        ("primary-gone", Box::new(|i: &mut Vec<u8>| i[512..1024].fill(0)), true),
        ("backup-gone", Box::new(|i: &mut Vec<u8>| {
            let h = headers(i, 512)[1];
            i[h..h + 512].fill(0)
        }), true),
        ("foreign-disk-guid", Box::new(|i: &mut Vec<u8>| each_header(i, 512, |h| h[56] = b'x')), true),
        ("note-length-4294967295", Box::new(|i: &mut Vec<u8>| i[(64 << 10) + 12..(64 << 10) + 16].copy_from_slice(&u32::MAX.to_le_bytes())), true),
        ("journal-count-4294967295", Box::new(|i: &mut Vec<u8>| {
            for at in clean::SLOTS {
                i[at as usize + 12..at as usize + 16].copy_from_slice(&u32::MAX.to_le_bytes());
            }
        }), true),
    ];
    for (name, edit, repair) in hostile {
        let mut img = d512.clone();
        edit(&mut img);
        let img = if repair { repaired(dir, &img) } else { img };
        out.put(name, &Image::encode_bytes(&img, 0));
    }

    // MBRs: primary partitions, an extended chain, a chain that loops.
    for (name, img) in mbr_images() {
        let mut big = img.clone();
        big.resize(64 << 20, 0);
        out.put(&format!("mbr-{name}"), &Image::encode_bytes(&big, 1 << 2));
    }
    // A GPT not drivelet's, as sfdisk writes it, when sfdisk is there.
    if let Some(img) = sfdisk_image(dir, "label: gpt\n,8MiB\n,8MiB\n") {
        out.put("sfdisk-gpt", &Image::encode_bytes(&img, 3 << 2));
    }
    if let Some(img) = sfdisk_image(dir, "label: dos\n,8MiB\n,,E\n,4MiB\n,4MiB\n") {
        out.put("sfdisk-dos-extended", &Image::encode_bytes(&img, 1 << 2));
    }
}

fn sfdisk_image(dir: &Path, script: &str) -> Option<Vec<u8>> {
    use std::io::Write;
    let img = dir.join("sfdisk.img");
    std::fs::File::create(&img).ok()?.set_len(64 * MIB).ok()?;
    let mut child = std::process::Command::new("sfdisk").arg("-q").arg(&img).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::null()).spawn().ok()?;
    child.stdin.take()?.write_all(script.as_bytes()).ok()?;
    child.wait().ok()?.success().then(|| std::fs::read(&img).ok())?
}

/// An MBR entry: type, start LBA, sectors.
fn mbr_entry(s: &mut [u8], i: usize, kind: u8, start: u32, len: u32) {
    let e = &mut s[446 + 16 * i..446 + 16 * (i + 1)];
    e[4] = kind;
    e[8..12].copy_from_slice(&start.to_le_bytes());
    e[12..16].copy_from_slice(&len.to_le_bytes());
}

fn mbr_images() -> Vec<(&'static str, Vec<u8>)> {
    let sector = |img: &mut Vec<u8>, lba: usize| -> usize {
        if img.len() < (lba + 1) * 512 {
            img.resize((lba + 1) * 512, 0);
        }
        img[lba * 512 + 510] = 0x55;
        img[lba * 512 + 511] = 0xaa;
        lba * 512
    };
    let mut out = Vec::new();
    let mut primary = Vec::new();
    sector(&mut primary, 0);
    mbr_entry(&mut primary, 0, 0x83, 2048, 2048);
    mbr_entry(&mut primary, 1, 0x82, 4096, 2048);
    out.push(("primary", primary));

    let mut chain = Vec::new();
    sector(&mut chain, 0);
    mbr_entry(&mut chain, 0, 0x05, 100, 1000);
    for (k, lba) in [100usize, 110, 120].into_iter().enumerate() {
        let at = sector(&mut chain, lba);
        mbr_entry(&mut chain[at..], 0, 0x83, 1, 8);
        if k < 2 {
            mbr_entry(&mut chain[at..], 1, 0x05, (lba + 10 - 100) as u32, 10);
        }
    }
    out.push(("extended-chain-of-3", chain));

    let mut looping = Vec::new();
    sector(&mut looping, 0);
    mbr_entry(&mut looping, 0, 0x0f, 100, 1000);
    let a = sector(&mut looping, 100);
    mbr_entry(&mut looping[a..], 0, 0x83, 1, 8);
    mbr_entry(&mut looping[a..], 1, 0x05, 10, 10);
    let b = sector(&mut looping, 110);
    mbr_entry(&mut looping[b..], 0, 0x83, 1, 8);
    mbr_entry(&mut looping[b..], 1, 0x05, 10, 10);
    out.push(("ebr-chain-looping", looping));

    let mut selfloop = Vec::new();
    sector(&mut selfloop, 0);
    mbr_entry(&mut selfloop, 0, 0x85, 4, 1000);
    mbr_entry(&mut selfloop, 1, 0x05, 4, 1000);
    let a = sector(&mut selfloop, 4);
    mbr_entry(&mut selfloop[a..], 0, 0x83, 1, 8);
    mbr_entry(&mut selfloop[a..], 1, 0x05, u32::MAX, 10);
    out.push(("ebr-two-extended-pointing-out-of-range", selfloop));
    out
}

fn slot_seeds() {
    let guid = gpt::new_disk_guid();
    let owner = drivelet::words::Owner { cluster: "c0ffee".into(), node: "node-1".into() };
    let vol = |n: u8| note::VolumeNote {
        id: gpt::volume_partition_guid(&format!("pvc-{n}")),
        name: format!("pvc-{n}"),
        size: u64::from(n) << 30,
        block: n % 2 == 0,
        fs_type: if n % 2 == 0 { String::new() } else { "xfs".into() },
        created_unix: 1_700_000_000,
        parameters: Default::default(),
        snapshot: n == 3,
        binding: drivelet::words::Binding { pv: format!("pv-{n}"), claim_namespace: "ns".into(), claim_name: format!("c-{n}"), claim_uid: "u".into(), storage_class: "drivelet-nvme".into() },
    };
    let out = Out::new("note");
    for (name, volumes) in [("empty", vec![]), ("one-volume", vec![vol(1)]), ("four-volumes", (1..=4).map(vol).collect())] {
        let n = note::DiskNote { owner: owner.clone(), adopted_from: Some(drivelet::words::Owner { cluster: "old".into(), node: "node-0".into() }), volumes };
        let mut b = vec![1u8];
        b.extend(note::encode(&n, 7, guid).expect("encode a note"));
        out.put(name, &b);
    }
    let mut bad = vec![0u8];
    bad.extend(note::encode(&note::DiskNote { owner: owner.clone(), adopted_from: None, volumes: vec![vol(2)] }, 1, guid).expect("encode"));
    bad[1 + 70] ^= 0x20;
    out.put("checksum-bad", &bad);

    let out = Out::new("journal");
    for (name, dirty) in [("none", vec![]), ("one", vec![(MIB, 4 * MIB)]), ("many", (1..200u64).map(|i| (i * 3 * MIB, MIB)).collect::<Vec<_>>())] {
        let j = clean::Journal { seq: 3, disk_guid: guid, dirty };
        let mut b = vec![1u8];
        b.extend(j.encode().expect("encode a journal"));
        out.put(name, &b);
    }

    let out = Out::new("snapshot_note");
    let s = snapshot_note::SnapshotNote {
        name: "snapshot-1".into(),
        source_volume_id: gpt::volume_partition_guid("pvc-1").to_string(),
        restore_size: 1 << 30,
        block: false,
        fs_type: "ext4".into(),
        created_unix_nanos: 1_700_000_000_000_000_000,
    };
    let mut b = vec![1u8];
    b.extend(snapshot_note::encode(&s).expect("encode a snapshot note"));
    out.put("ext4", &b);
    let mut b = vec![1u8];
    b.extend(snapshot_note::encode(&snapshot_note::SnapshotNote { block: true, fs_type: String::new(), created_unix_nanos: -1, ..s }).expect("encode"));
    out.put("block", &b);

    let out = Out::new("key_header");
    let volume = uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
    let kek = volume_key::Kek::new([0x5a; 32]);
    let key = volume_key::new_key().expect("a key");
    let a = volume_key::encode(&volume_key::wrap(&key, volume, &kek, 1).expect("wrap"));
    let b2 = volume_key::encode(&volume_key::wrap(&key, volume, &kek, 2).expect("wrap"));
    out.put("both", &[&[0u8][..], &a, &b2].concat());
    let mut torn = [&[0u8][..], &a, &b2].concat();
    torn[1 + 512 + 100] ^= 0xff;
    out.put("second-torn", &torn);
    out.put("erased", &[0u8; 1 + volume_key::HEADER_LEN]);
    let other = volume_key::encode(&volume_key::wrap(&key, uuid::Uuid::from_u128(1), &kek, 3).expect("wrap"));
    out.put("another-volume", &[&[1u8][..], &other, &[0u8; 512]].concat());
}

fn text_seeds() {
    let out = Out::new("freeze_record");
    let r = drivelet::disk::freeze::Record { path: "/var/lib/kubelet/plugins/kubernetes.io/csi/csi.drivelet.io/abc/globalmount".into(), device: (259, 3) };
    out.put("record-0", &r.encode());

    let out = Out::new("mbr");
    for (name, img) in mbr_images() {
        out.put(name, &img);
    }

    let out = Out::new("mountinfo");
    out.copy_dir(&root().join("tests/fixtures/mountinfo"), "");
    out.put("escapes-and-btrfs", b"30 1 0:31 /@/var/lib/kubelet /var/lib/kubelet rw,relatime shared:1 - btrfs /dev/vda2 rw,subvol=/@\n31 30 0:32 / /mnt/a\\040b\\134c rw - tmpfs tmp\\011fs rw\nbroken line\n");
    out.put("swaps", b"Filename\tType\tSize\tUsed\tPriority\n/dev/vda3 partition 1048572 0 -2\n/swap\\040file file 1024 0 -3\n");

    let out = Out::new("udev");
    out.copy_dir(&root().join("tests/fixtures/udev"), "");

    let out = Out::new("smartctl");
    out.copy_dir(&root().join("tests/fixtures/smartctl"), "");
    let shared = root().join("../shared/fixtures/smartctl");
    if shared.is_dir() {
        out.copy_dir(&shared, "shared-");
    }

    let out = Out::new("blkid");
    for (name, text) in [
        ("ext4", "DEVNAME=/dev/sdb\nUUID=0b1c\nVERSION=1.0\nBLOCK_SIZE=4096\nTYPE=ext4\nUSAGE=filesystem\n"),
        ("gpt", "DEVNAME=/dev/sdc\nPTUUID=6472766c-1111-4222-8333-444455556666\nPTTYPE=gpt\n"),
        ("raid", "DEVNAME=/dev/sdd\nUUID=a\nUUID_SUB=b\nLABEL=host:0\nVERSION=1.2\nTYPE=linux_raid_member\nUSAGE=raid\n"),
        ("luks", "DEVNAME=/dev/sde\nVERSION=2\nUUID=x\nTYPE=crypto_LUKS\nUSAGE=crypto\n"),
        ("dos", "DEVNAME=/dev/sdf\nPTUUID=1234abcd\nPTTYPE=dos\n"),
    ] {
        out.put(name, text.as_bytes());
    }

    let out = Out::new("dumpe2fs");
    out.put(
        "mkfs-ext4-1g",
        b"dumpe2fs 1.47.0 (5-Feb-2023)\nFilesystem volume name:   <none>\nFilesystem state:         clean\nFilesystem features:      has_journal ext_attr resize_inode dir_index filetype extent 64bit flex_bg sparse_super large_file huge_file dir_nlink extra_isize metadata_csum\nBlock count:              262144\nReserved block count:     13107\nFirst block:              0\nBlock size:               4096\nReserved GDT blocks:      127\nBlocks per group:         32768\nInode blocks per group:   512\nGroup descriptor size:    64\n",
    );
    out.put(
        "mkfs-ext4-1k-blocks",
        b"Filesystem state:         not clean\nFilesystem features:      has_journal sparse_super\nBlock count:              65536\nFirst block:              1\nBlock size:               1024\nReserved GDT blocks:      255\nBlocks per group:         8192\nInode blocks per group:   256\n",
    );

    let out = Out::new("config");
    out.copy_dir(&root().join("config"), "");
    out.put("small", b"[driver]\nnode_name = \"node-1\"\n[drives]\nallow_loop = true\ninclude_paths = [\"/var/tmp/*.img\"]\n");

    let out = Out::new("admin_request");
    out.put(
        "every-request",
        br#"{"cmd":"drives"}
{"cmd":"volumes"}
{"cmd":"volume-details"}
{"cmd":"snapshots"}
{"cmd":"release-drive","drive_id":"wwn-0x5000c500a1b2c3d4","force":false}
{"cmd":"evacuate-drive","drive_id":"wwn-1","force":true}
{"cmd":"evacuations"}
{"cmd":"adopt-drive","drive_id":"wwn-1"}
{"cmd":"cordon-drive","drive_id":"wwn-1","cordon":true}
{"cmd":"adopt","volume_id":"local-node-1-pv-a","pv_name":"pv-a","node":"node-1","path":"/mnt/disks/a","fs_type":"ext4"}
{"cmd":"fail-point","name":"actor.inventory.stop","actions":"1*return"}
"#,
    );
    out.put("hostile", b"{\"cmd\":\"adopt\",\"volume_id\":\"../../etc\",\"pv_name\":\"\\u0000\",\"node\":\"n\",\"path\":\"/../../etc/passwd\",\"fs_type\":\"\"}\n{\"cmd\":1}\n[]\n");

    let out = Out::new("migration_pv");
    out.copy_dir(&root().join("tests/fixtures/pv"), "");

    let out = Out::new("store_record");
    for (i, r) in drivelet::fuzz::sample_store_records().into_iter().enumerate() {
        out.put(&format!("record-{i}"), &r);
    }
}

fn main() {
    let dir = tempfile::tempdir().expect("a temp dir");
    gpt_seeds(dir.path());
    slot_seeds();
    text_seeds();
    println!("wrote {}", root().join("tests/fuzz/corpus").display());
}
