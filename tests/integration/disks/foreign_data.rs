//! Foreign data end to end: loop drives carrying what a node's disks commonly carry
//! (other filesystems, swap, encryption, volume managers, caches, RAID members, Ceph,
//! ZFS, partition tables, a GPT of which only the backup copy at the end is left), next
//! to blank drives. Each must be classified foreign with a plain reason, and be
//! byte-for-byte unchanged after drivelet has filled every blank drive; and a disk the
//! GPT writer still refuses at CreateVolume time turns foreign at once while the same
//! CreateVolume goes on to the next drive.
//!
//! Where the real tool cannot run here, the test writes the on-disk format itself and
//! proves it faithful with the tools that read it: md superblocks (mdadm cannot create
//! an array without the kernel's md driver) are checked by `blkid -p` and `mdadm
//! --examine` (checksums correct); the ZFS labels (no ZFS tools in Debian main) and the
//! Ceph BlueStore label (ceph-osd is far too heavy to install for a test) by `blkid -p`.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common::*;
use drivelet::grpc::proto::csi;
use tonic::Code;

/// A sparse image file of `size` bytes.
fn image(dir: &Path, name: &str, size: u64) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().set_len(size).unwrap();
    p
}

/// Attaches an existing image file as a loop device.
fn attach(file: &Path) -> LoopDrive {
    let dev = PathBuf::from(sh("losetup", &["--find", "--show", file.to_str().unwrap()]));
    LoopDrive { file: file.to_path_buf(), dev }
}

/// Writes `bytes` into `file` at `offset`.
fn write_at(file: &Path, offset: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    f.write_all_at(bytes, offset).unwrap();
    f.sync_all().unwrap();
}

/// Runs `cmd` with `input` on its stdin; panics with stderr on failure.
fn sh_in(cmd: &str, args: &[&str], input: &str) {
    let mut child = Command::new(cmd)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{cmd} {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// `blkid -p -o export` of a file or device: its keys.
fn blkid(p: &Path) -> BTreeMap<String, String> {
    let out = Command::new("blkid").args(["-p", "-o", "export"]).arg(p).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const MD_MAGIC: u32 = 0xa92b_4efc;

/// mdadm's superblock checksum: the 32-bit little-endian words summed into 64 bits,
/// folded once.
fn md_csum(bytes: &[u8]) -> u32 {
    let sum: u64 = bytes.chunks(4).map(|w| u64::from(u32::from_le_bytes(w.try_into().unwrap()))).sum();
    ((sum & 0xffff_ffff) + (sum >> 32)) as u32
}

/// An md 0.90 superblock (`mdp_super_t`, 4 KiB) of a two-disk RAID1 member of a
/// device of `size` bytes; it lives 64 KiB before the device's 64 KiB-aligned end.
fn md090(size: u64) -> (u64, Vec<u8>) {
    let mut b = vec![0u8; 4096];
    let mut w = |i: usize, v: u32| b[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
    let off = (size & !0xffff) - 0x10000;
    // Constant generic part: magic, version 0.90.0, set uuid word 0, ctime, level 1,
    // component size (KiB), nr_disks, raid_disks, set uuid words 1..3.
    for (i, v) in [(0, MD_MAGIC), (1, 0), (2, 90), (3, 0), (5, 0x1234_5678), (6, 1_700_000_000), (7, 1)] {
        w(i, v);
    }
    w(8, (off / 1024) as u32);
    for (i, v) in [(9, 2), (10, 2), (13, 0x9abc_def0), (14, 0x0fed_cba9), (15, 0x8765_4321)] {
        w(i, v);
    }
    // Generic state: utime, state clean, active, working, failed, events.
    for (i, v) in [(32, 1_700_000_000), (33, 1), (34, 1), (35, 1), (36, 1), (40, 1)] {
        w(i, v);
    }
    // disks[0] and this_disk: number 0, major 7, minor 0, raid disk 0, active and in sync.
    for base in [128, 992] {
        for (k, v) in [0, 7, 0, 0, 6].into_iter().enumerate() {
            w(base + k, v);
        }
    }
    let csum = md_csum(&b);
    b[38 * 4..38 * 4 + 4].copy_from_slice(&csum.to_le_bytes());
    (off, b)
}

/// An md 1.x superblock (`mdp_superblock_1`, 256 bytes and two device roles) of a
/// two-disk RAID1 member at byte `off`, with its data at `data_offset` (sectors) for
/// `data_size` sectors.
fn md1(off: u64, data_offset: u64, data_size: u64) -> Vec<u8> {
    let mut b = vec![0u8; 256 + 2 * 2];
    let put = |b: &mut Vec<u8>, at: usize, bytes: &[u8]| b[at..at + bytes.len()].copy_from_slice(bytes);
    put(&mut b, 0, &MD_MAGIC.to_le_bytes());
    put(&mut b, 4, &1u32.to_le_bytes()); // major version
    put(&mut b, 16, uuid::Uuid::new_v4().as_bytes()); // set uuid
    put(&mut b, 32, b"node-1:data0"); // set name
    put(&mut b, 64, &1_700_000_000u64.to_le_bytes()); // ctime
    put(&mut b, 72, &1u32.to_le_bytes()); // level: RAID1
    put(&mut b, 80, &data_size.to_le_bytes()); // size
    put(&mut b, 92, &2u32.to_le_bytes()); // raid disks
    put(&mut b, 128, &data_offset.to_le_bytes());
    put(&mut b, 136, &data_size.to_le_bytes());
    put(&mut b, 144, &(off / 512).to_le_bytes()); // super_offset
    put(&mut b, 168, uuid::Uuid::new_v4().as_bytes()); // device uuid
    put(&mut b, 192, &1_700_000_000u64.to_le_bytes()); // utime
    put(&mut b, 200, &1u64.to_le_bytes()); // events
    put(&mut b, 208, &u64::MAX.to_le_bytes()); // resync offset: in sync
    put(&mut b, 220, &2u32.to_le_bytes()); // max_dev
    put(&mut b, 256, &0u16.to_le_bytes()); // this device: role 0
    put(&mut b, 258, &0xffffu16.to_le_bytes()); // the other: missing
    let csum = md_csum(&b);
    put(&mut b, 216, &csum.to_le_bytes());
    b
}

/// Writes an md superblock of `version` ("0.90", "1.0", "1.2") onto the image `file`.
fn write_md(file: &Path, version: &str) {
    let size = std::fs::metadata(file).unwrap().len();
    match version {
        "0.90" => {
            let (off, sb) = md090(size);
            write_at(file, off, &sb);
        }
        "1.0" => {
            let off = (size & !0xfff) - 0x2000;
            write_at(file, off, &md1(off, 0, off / 512));
        }
        "1.2" => write_at(file, 4096, &md1(4096, 2048, size / 512 - 2048)),
        other => panic!("md {other}"),
    }
}

/// ZFS vdev labels as a pool member carries them: four 256 KiB labels (two at the start,
/// two at the end), each with its uberblock ring at 128 KiB holding uberblocks
/// (magic 0x00bab10c, version 5000).
fn write_zfs_labels(file: &Path) {
    const LABEL: u64 = 256 << 10;
    let size = std::fs::metadata(file).unwrap().len() / LABEL * LABEL;
    for label in [0, LABEL, size - 2 * LABEL, size - LABEL] {
        for slot in 0..8u64 {
            let mut ub = Vec::new();
            ub.extend_from_slice(&0x00ba_b10cu64.to_le_bytes()); // ub_magic
            ub.extend_from_slice(&5000u64.to_le_bytes()); // ub_version
            ub.extend_from_slice(&(100 + slot).to_le_bytes()); // ub_txg
            ub.extend_from_slice(&0x1234_5678_9abc_def0u64.to_le_bytes()); // ub_guid_sum
            ub.extend_from_slice(&1_700_000_000u64.to_le_bytes()); // ub_timestamp
            write_at(file, label + (128 << 10) + slot * 1024, &ub);
        }
    }
}

/// The start of a Ceph BlueStore device's label, as ceph-osd writes it: the text
/// "bluestore block device", the OSD's uuid, then the encoded label.
fn write_bluestore_label(file: &Path) {
    let osd = "2d4a7c3e-5b1f-4e2a-9c6d-8f0e1a2b3c4d";
    let mut label = format!("bluestore block device\n{osd}\n").into_bytes();
    // bluestore_bdev_label_t, encoded: version 2, compat 1, length, then the uuid,
    // size, birth time and description.
    let mut body = Vec::new();
    body.extend_from_slice(uuid::Uuid::parse_str(osd).unwrap().as_bytes());
    body.extend_from_slice(&std::fs::metadata(file).unwrap().len().to_le_bytes());
    body.extend_from_slice(&1_700_000_000u32.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    body.extend_from_slice(&4u32.to_le_bytes());
    body.extend_from_slice(b"main");
    label.extend_from_slice(&[2, 1]);
    label.extend_from_slice(&(body.len() as u32).to_le_bytes());
    label.extend_from_slice(&body);
    write_at(file, 0, &label);
}

/// One foreign drive: its loop device, the words its reason must hold, and what
/// `blkid -p` calls it (checked before drivelet starts: the test's own set-up is
/// proven first).
struct Foreign {
    drive: LoopDrive,
    words: Vec<String>,
}

fn foreign(drive: LoopDrive, words: &[&str]) -> Foreign {
    Foreign { drive, words: words.iter().map(|w| w.to_string()).collect() }
}

/// Size of the blank drives.
const SIZE: u64 = 512 * MIB;

/// Size of a foreign drive: small (each is hashed twice), but as large as its tool needs.
fn foreign_size(kind: &str) -> u64 {
    match kind {
        "xfs" => 320 * MIB,
        "btrfs" => 128 * MIB,
        _ => 64 * MIB,
    }
}

/// Makes every kind of foreign drive under `dir`.
fn foreign_drives(dir: &Path) -> Vec<Foreign> {
    let mut out = Vec::new();
    let arg = |p: &Path| p.to_str().unwrap().to_string();

    // Filesystems and swap, made by their own tools on the image files.
    for (name, tool, args, words) in [
        ("ext4", "mkfs.ext4", vec!["-q", "-F"], vec!["holds an ext4 filesystem;"]),
        ("xfs", "mkfs.xfs", vec!["-q", "-f"], vec!["holds an xfs filesystem;"]),
        ("btrfs", "mkfs.btrfs", vec!["-q", "-f"], vec!["holds a btrfs filesystem;"]),
        ("vfat", "mkfs.vfat", vec![], vec!["holds a FAT", "filesystem;"]),
        ("swap", "mkswap", vec![], vec!["holds swap space;"]),
    ] {
        let f = image(dir, &format!("f-{name}.img"), foreign_size(name));
        let mut a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        a.push(arg(&f));
        sh(tool, &a.iter().map(String::as_str).collect::<Vec<_>>());
        out.push(foreign(attach(&f), &words));
    }

    // LUKS2, on the image file (cryptsetup needs no device-mapper to format).
    let f = image(dir, "f-luks.img", foreign_size("luks"));
    sh_in("cryptsetup", &["luksFormat", "--batch-mode", "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000", &arg(&f), "-"], "secret");
    out.push(foreign(attach(&f), &["holds a LUKS encrypted volume (LUKS2);"]));

    // An LVM physical volume and a bcache backing device: their tools want a block device.
    let pv = attach(&image(dir, "f-lvm.img", foreign_size("lvm")));
    sh("pvcreate", &["-q", "-f", pv.dev.to_str().unwrap()]);
    out.push(foreign(pv, &["holds an LVM physical volume;"]));
    let bc = attach(&image(dir, "f-bcache.img", foreign_size("bcache")));
    sh("make-bcache", &["-B", bc.dev.to_str().unwrap()]);
    out.push(foreign(bc, &["holds a bcache backing device;"]));

    // md RAID members of each superblock format: 0.90 and 1.0 at the end of the disk,
    // 1.2 at 4 KiB from its start.
    for v in ["0.90", "1.0", "1.2"] {
        let f = image(dir, &format!("f-md{v}.img"), foreign_size("md"));
        write_md(&f, v);
        let examine = Command::new("mdadm").arg("--examine").arg(&f).output().unwrap();
        let text = String::from_utf8_lossy(&examine.stdout);
        assert!(text.contains("Checksum") && text.contains("correct") && !text.contains("expected"), "mdadm --examine md {v}:\n{text}");
        let want = format!("holds a Linux RAID member (md superblock {v});");
        out.push(foreign(attach(&f), &[&want]));
    }

    // A ZFS pool member and a Ceph BlueStore OSD device.
    let f = image(dir, "f-zfs.img", foreign_size("zfs"));
    write_zfs_labels(&f);
    out.push(foreign(attach(&f), &["holds a ZFS pool member;"]));
    let f = image(dir, "f-ceph.img", foreign_size("ceph"));
    write_bluestore_label(&f);
    out.push(foreign(attach(&f), &["holds a Ceph BlueStore device;"]));

    // Partition tables: a GPT of someone else with two partitions, an MBR with two
    // primary partitions and one logical, and a GPT whose primary copy (the first MiB)
    // was destroyed while its backup at the end and the data behind it are intact.
    let gpt = "label: gpt\nlabel-id: 0BADC0DE-1234-4234-8234-123456789ABC\nstart=2048, size=32768, type=L\nstart=34816, size=32768, type=L\n";
    let f = image(dir, "f-gpt.img", foreign_size("gpt"));
    sh_in("sfdisk", &["-q", &arg(&f)], gpt);
    out.push(foreign(
        attach(&f),
        &["holds a GPT partition table with 2 partitions not made by drivelet (disk GUID 0badc0de-1234-4234-8234-123456789abc);"],
    ));
    let f = image(dir, "f-dos.img", foreign_size("dos"));
    sh_in("sfdisk", &["-q", &arg(&f)], "label: dos\nstart=2048, size=16384, type=83\nstart=18432, size=16384, type=83\nstart=34816, size=65536, type=5\nstart=36864, size=16384, type=83\n");
    out.push(foreign(attach(&f), &["holds an MBR (DOS) partition table with 3 partitions;"]));
    let f = image(dir, "f-backup-gpt.img", foreign_size("backup-gpt"));
    sh_in("sfdisk", &["-q", &arg(&f)], &gpt.replace("0BADC0DE", "0BADBEEF"));
    let part = image(dir, "part.fs", 16 * MIB);
    sh("mkfs.ext4", &["-q", "-F", &arg(&part)]);
    write_at(&f, MIB, &std::fs::read(&part).unwrap());
    std::fs::remove_file(&part).unwrap();
    write_at(&f, 0, &vec![0u8; MIB as usize]);
    out.push(foreign(
        attach(&f),
        &["holds a backup GPT at the end of the disk (its primary copy at the start is gone) with 2 partitions not made by drivelet (disk GUID 0badbeef-1234-4234-8234-123456789abc);"],
    ));
    out
}

/// What `blkid -p` must find on each foreign drive the test made (the backup-only GPT
/// is exactly what it does not find).
fn check_setup(drives: &[Foreign]) {
    let want: &[(&str, &str)] = &[
        ("f-ext4", "ext4"),
        ("f-xfs", "xfs"),
        ("f-btrfs", "btrfs"),
        ("f-vfat", "vfat"),
        ("f-swap", "swap"),
        ("f-luks", "crypto_LUKS"),
        ("f-lvm", "LVM2_member"),
        ("f-bcache", "bcache"),
        ("f-md0.90", "linux_raid_member"),
        ("f-md1.0", "linux_raid_member"),
        ("f-md1.2", "linux_raid_member"),
        ("f-zfs", "zfs_member"),
        ("f-ceph", "ceph_bluestore"),
    ];
    for f in drives {
        let name = f.drive.file.file_stem().unwrap().to_string_lossy().into_owned();
        let found = blkid(&f.drive.dev);
        match want.iter().find(|(n, _)| *n == name) {
            Some((_, t)) => assert_eq!(found.get("TYPE").map(String::as_str), Some(*t), "set-up of {name}: blkid -p finds {found:?}"),
            None if name == "f-backup-gpt" => assert!(found.is_empty(), "blkid -p finds nothing on a backup-only GPT: {found:?}"),
            None => assert!(found.contains_key("PTTYPE"), "set-up of {name}: {found:?}"),
        }
    }
}

/// CreateVolume of `name`, `size` bytes, block, with `params`.
fn create(name: &str, size: u64, params: &[(&str, &str)]) -> csi::CreateVolumeRequest {
    let mut r = create_req(name, size, block_cap());
    r.parameters = params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    r
}

/// Creates volumes named `prefix-N` until RESOURCE_EXHAUSTED; every other answer fails
/// the test. Returns how many were made and the exhausted message.
async fn fill(c: &mut Csi, prefix: &str, size: u64, params: &[(&str, &str)]) -> (usize, String) {
    for n in 0..64 {
        match c.ctrl.create_volume(create(&format!("{prefix}-{n}"), size, params)).await {
            Ok(_) => {}
            Err(s) if s.code() == Code::ResourceExhausted => return (n, s.message().to_string()),
            Err(s) => panic!("CreateVolume {prefix}-{n}: {:?} {}", s.code(), s.message()),
        }
    }
    panic!("{prefix}: 64 volumes and still not exhausted");
}

/// The drive entry of `dev` from `ctl drives`.
fn entry(drives: &serde_json::Value, dev: &Path) -> serde_json::Value {
    drive_by_path(drives, dev).unwrap_or_else(|| panic!("{} not listed in {drives}", dev.display())).clone()
}

#[test]
fn every_kind_of_foreign_data_is_foreign_in_plain_words_and_unchanged_after_the_blank_drives_are_filled() {
    require_host();
    let tmp = short_tempdir();
    let drives = foreign_drives(tmp.path());
    let blank: Vec<LoopDrive> = (0..3).map(|i| LoopDrive::new(tmp.path(), &format!("blank-{i}.img"), SIZE)).collect();
    for d in drives.iter().map(|f| &f.drive).chain(&blank) {
        sh("udevadm", &["trigger", "--action=change", "--settle", d.dev.to_str().unwrap()]);
    }
    check_setup(&drives);
    let before: Vec<String> = drives.iter().map(|f| digest(&f.drive.file)).collect();

    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    let listed = agent.ctl_drives();
    for f in &drives {
        let d = entry(&listed, &f.drive.dev);
        let reason = d["reason"].as_str().unwrap();
        eprintln!("{:<18} {}", f.drive.file.file_name().unwrap().to_string_lossy(), reason);
        assert_eq!(d["class"], "foreign", "{}: {d}", f.drive.file.display());
        for w in &f.words {
            assert!(reason.contains(w.as_str()), "{}: reason {reason:?} lacks {w:?}", f.drive.file.display());
        }
        assert!(!reason.contains("signature"), "{}: the kind of data in words, not a prober's name: {reason}", f.drive.file.display());
        assert_eq!(d["free_bytes"], 0, "{d}");
    }
    for b in &blank {
        let d = entry(&listed, &b.dev);
        assert_eq!(d["class"], "managed", "{d}");
    }

    // Fill every blank drive: partitions on one, whole drives, then partitions again.
    let rt = rt();
    let (partitions, drives_taken, rest, exhausted) = rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let first = fill_n(&mut c, "part-a", 2).await;
        let (whole, exhausted) = fill(&mut c, "whole", 0, &[("layout", "drive")]).await;
        let (rest, last) = fill(&mut c, "part-b", 64 * MIB, &[]).await;
        (first, whole, rest, format!("{exhausted} / {last}"))
    });
    let (_, usable_end) = drivelet::disk::gpt::usable_region(SIZE, 512).unwrap();
    let per_drive = ((usable_end - first_volume_start(SIZE)) / (64 * MIB)) as usize;
    assert_eq!(partitions, 2);
    assert_eq!(drives_taken, 2, "the two drives left empty are taken whole; {exhausted}");
    assert_eq!(partitions + rest, per_drive, "the first drive is filled with partitions; {exhausted}");
    assert!(exhausted.contains("drive"), "RESOURCE_EXHAUSTED says why: {exhausted}");

    // Classification alone kept the writer off the foreign drives: it refused none.
    assert!(!agent.logs().contains("GPT writer refused"), "{}", agent.log_tail(40));
    // Every volume is on a blank drive; the foreign ones are still foreign.
    let volumes: usize = blank.iter().map(|b| gpt_entries(&b.dev).len()).sum();
    assert_eq!(volumes, partitions + drives_taken + rest);
    let listed = agent.ctl_drives();
    for f in &drives {
        assert_eq!(entry(&listed, &f.drive.dev)["class"], "foreign");
    }
    assert_eq!(agent.stop(), 0, "clean exit; log:\n{}", agent.log_tail(40));
    for (f, h) in drives.iter().zip(&before) {
        assert_eq!(&digest(&f.drive.file), h, "{} is byte-for-byte unchanged", f.drive.file.display());
    }
}

/// Creates `n` partition volumes of 64 MiB named `prefix-N`; each must succeed.
async fn fill_n(c: &mut Csi, prefix: &str, n: usize) -> usize {
    for i in 0..n {
        c.ctrl
            .create_volume(create(&format!("{prefix}-{i}"), 64 * MIB, &[]))
            .await
            .unwrap_or_else(|s| panic!("CreateVolume {prefix}-{i}: {:?} {}", s.code(), s.message()));
    }
    n
}

#[test]
fn a_disk_the_writer_refuses_at_create_time_turns_foreign_and_the_create_goes_on_to_the_next_drive() {
    require_host();
    let tmp = short_tempdir();
    // Best fit takes the drive with the least free space first: the small one.
    let small = LoopDrive::new(tmp.path(), "a-small.img", 256 * MIB);
    let big = LoopDrive::new(tmp.path(), "b-big.img", SIZE);
    sh("udevadm", &["settle"]);
    // The drives stay blank until the first create (not zeroed whole when taken): the
    // small one is changed behind the agent's back while it still is.
    let mut agent = Agent::start_env(tmp.path(), AgentOpts::default(), &[("DRIVELET__VOLUMES__CLEAN_BLANK_DRIVES", "false")]);
    let listed = agent.ctl_drives();
    assert_eq!(entry(&listed, &small.dev)["class"], "managed");
    assert_eq!(entry(&listed, &big.dev)["class"], "managed");

    // Behind udev's back (into the backing file, so no event and no re-probe): the
    // backup copy of someone else's GPT at the end of the small drive, as a disk whose
    // start was wiped keeps it. Then drop the device's cached blocks so reads see it.
    let theirs = image(tmp.path(), "theirs.raw", 256 * MIB);
    sh_in("sfdisk", &["-q", theirs.to_str().unwrap()], "label: gpt\nlabel-id: 0BADBEEF-1234-4234-8234-123456789ABC\nstart=2048, size=65536, type=L\n");
    let tail = 34 * 512;
    let raw = std::fs::read(&theirs).unwrap();
    write_at(&small.file, 256 * MIB - tail, &raw[raw.len() - tail as usize..]);
    sh("blockdev", &["--flushbufs", small.dev.to_str().unwrap()]);
    let before = digest(&small.file);

    let rt = rt();
    let (first, second) = rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let first = c.ctrl.create_volume(create("whole-0", 0, &[("layout", "drive")])).await;
        let second = c.ctrl.create_volume(create("whole-1", 0, &[("layout", "drive")])).await;
        (first, second)
    });
    let first = first.unwrap_or_else(|s| panic!("the create goes on to the big drive: {:?} {}; log:\n{}", s.code(), s.message(), agent.log_tail(30)));
    let id = first.into_inner().volume.unwrap().volume_id;
    assert_eq!(gpt_entries(&big.dev).len(), 1, "the volume is on the big drive");
    let second = second.expect_err("no empty drive is left");
    assert_eq!(second.code(), Code::ResourceExhausted, "{}", second.message());

    // The small drive is foreign at once, with the writer's words, and no record of
    // the refused attempt is left.
    let d = entry(&agent.ctl_drives(), &small.dev);
    assert_eq!(d["class"], "foreign", "{d}");
    let reason = d["reason"].as_str().unwrap();
    assert!(reason.contains("a backup GPT at the end of the disk") && reason.contains("0badbeef"), "{reason}");
    if let Some(ids) = agent.ctl_volume_ids() {
        assert_eq!(ids, vec![id], "only the volume made is recorded");
    }
    assert_eq!(agent.stop(), 0, "clean exit; log:\n{}", agent.log_tail(40));
    assert_eq!(digest(&small.file), before, "the refused drive is byte-for-byte unchanged");
}

#[test]
fn old_data_in_a_managed_drives_free_space_never_reaches_a_new_volume() {
    require_host();
    let tmp = short_tempdir();
    let drive = LoopDrive::new(tmp.path(), "d.img", SIZE);
    sh("udevadm", &["settle"]);
    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    assert_eq!(entry(&agent.ctl_drives(), &drive.dev)["class"], "managed");

    // Behind udev's back, where the first volume will go: an ext4 filesystem at its
    // start and garbage over its last MiB (where an md 1.0 superblock would be), as a
    // drive's earlier life leaves them; then drop the device's cached blocks.
    let vol = 64 * MIB;
    let start = first_volume_start(SIZE);
    let fs_img = image(tmp.path(), "old-fs.raw", 8 * MIB);
    sh("mkfs.ext4", &["-F", "-q", fs_img.to_str().unwrap()]);
    let old = std::fs::read(&fs_img).unwrap();
    write_at(&drive.file, start, &old[..2 * MIB as usize]);
    write_at(&drive.file, start + vol - MIB, &vec![0xee; MIB as usize]);
    sh("blockdev", &["--flushbufs", drive.dev.to_str().unwrap()]);
    assert_eq!(entry(&agent.ctl_drives(), &drive.dev)["class"], "managed", "data in free space is not seen on the whole disk");

    let rt = rt();
    let id = rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        c.ctrl.create_volume(create("fresh", vol, &[])).await.unwrap_or_else(|s| panic!("create: {} {}", s.code(), s.message())).into_inner().volume.unwrap().volume_id
    });
    let parts = kernel_parts(&drive.dev);
    let (name, _, _) = parts.iter().find(|(_, s, _)| *s == start).unwrap_or_else(|| panic!("no kernel partition at {start}: {parts:?}"));
    let part = Path::new("/dev").join(name);
    let zeroed = |when: &str| {
        let file = std::fs::File::open(&drive.file).unwrap();
        for at in [start, start + vol - MIB] {
            let mut buf = vec![0xffu8; MIB as usize];
            file.read_exact_at(&mut buf, at).unwrap();
            assert!(buf.iter().all(|&b| b == 0), "{when}: the MiB at byte {at} of the drive (the volume's first or last) is zero");
        }
    };
    zeroed("after CreateVolume");
    let probed = blkid(&part);
    assert!(!probed.contains_key("TYPE") && !probed.contains_key("PTTYPE"), "volume {id}: the new partition shows nothing: {probed:?}");

    // What the volume held does not outlive it either: DeleteVolume zeroes the same
    // areas on the drive.
    sh("mkfs.ext4", &["-F", "-q", part.to_str().unwrap()]);
    write_at(&part, vol - 4096, &[0xee; 4096]);
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        c.ctrl.delete_volume(csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() }).await.unwrap_or_else(|s| panic!("delete: {} {}", s.code(), s.message()));
    });
    zeroed("after DeleteVolume");
    assert_eq!(agent.stop(), 0, "clean exit; log:\n{}", agent.log_tail(40));
}
