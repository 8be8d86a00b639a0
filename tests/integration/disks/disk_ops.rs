//! The disk operations the volume manager builds on, against real devices: GPT writing
//! (on image files and loop devices), kernel partitions through BLKPG, mkfs, mount,
//! bind mounts, unmount, wipe.
//!
//! Preconditions are checked, never skipped: the loop-device tests need root and fail
//! saying so. Every loop device and mount a test makes is undone when the test ends,
//! also when it fails (drop guards).
//!
//! On loop devices the tests follow the volume manager's contract: a GPT change and the
//! BLKPG call that follows it happen under one [`DiskLock`], so udev does not re-read
//! the table in between (this kernel has no GPT parser: a re-read drops every unused
//! partition; elsewhere it renumbers them).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use drivelet::disk::blkpg::{self, KernelPartition};
use drivelet::disk::gpt::{self, GptTable};
use drivelet::disk::lock::DiskLock;
use drivelet::disk::beneath;
use drivelet::disk::mount::{self, parse_mount_flags};
use drivelet::disk::{fs, DiskError};
use uuid::Uuid;

const MIB: u64 = 1 << 20;

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests make loop devices, filesystems and mounts: run them as root"
    );
    assert!(Path::new("/dev/loop-control").exists(), "no /dev/loop-control: the kernel has no loop device support");
}

/// Runs a command, returns stdout; panics with stderr on failure.
fn sh(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn sha256(path: &Path) -> String {
    sh("sha256sum", &[path.to_str().unwrap()]).split_whitespace().next().unwrap().to_string()
}

/// `losetup --find` races with itself across parallel tests; one at a time.
static LOSETUP: Mutex<()> = Mutex::new(());

/// A loop device over a sparse file in a temporary directory, with the mounts a test
/// makes; on drop, unmounts them (lazily) and detaches the device.
struct Scene {
    dir: tempfile::TempDir,
    dev: PathBuf,
    mounts: Vec<PathBuf>,
}

impl Scene {
    fn new(size: u64) -> Scene {
        require_root();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("drive.img");
        File::create(&file).unwrap().set_len(size).unwrap();
        let dev = {
            let _one = LOSETUP.lock().unwrap_or_else(|e| e.into_inner());
            PathBuf::from(sh("losetup", &["--find", "--show", "--partscan", file.to_str().unwrap()]))
        };
        Scene { dir, dev, mounts: Vec::new() }
    }

    /// A new directory (or file) in the scene, to mount on; remembered for cleanup.
    fn mount_point(&mut self, name: &str, file: bool) -> PathBuf {
        let p = self.dir.path().join(name);
        if file {
            File::create(&p).unwrap();
        } else {
            std::fs::create_dir(&p).unwrap();
        }
        self.mounts.push(p.clone());
        p
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        for m in self.mounts.iter().rev() {
            for _ in 0..16 {
                if nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH).is_err() {
                    break;
                }
            }
        }
        let _ = Command::new("losetup").arg("--detach").arg(&self.dev).status();
    }
}

fn table(dev: &Path) -> GptTable {
    gpt::read_table(dev, 512).unwrap().expect("a GPT")
}

/// What `sfdisk --json` (an independent GPT implementation) reads: (start, size,
/// uuid, name) in bytes.
fn sfdisk_view(dev: &Path) -> (String, Vec<(u64, u64, String, String)>) {
    let json: serde_json::Value = serde_json::from_str(&sh("sfdisk", &["--json", dev.to_str().unwrap()])).unwrap();
    let t = &json["partitiontable"];
    assert_eq!(t["label"], "gpt");
    let parts = t["partitions"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    (
                        p["start"].as_u64().unwrap() * 512,
                        p["size"].as_u64().unwrap() * 512,
                        p["uuid"].as_str().unwrap().to_ascii_lowercase(),
                        p["name"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    (t["id"].as_str().unwrap().to_ascii_lowercase(), parts)
}

fn devnum(p: &KernelPartition) -> (u32, u32) {
    p.devnum
}

/// A volume's partition as the volume manager makes it: GPT entry and kernel partition
/// under one disk lock.
fn create(dev: &Path, name: &str, start: u64, size: u64) -> KernelPartition {
    let _udev = DiskLock::exclusive(dev).unwrap();
    gpt::add_partition(dev, 512, gpt::volume_partition_guid(name), &gpt::partition_label(name), start, size).unwrap();
    blkpg::ensure_kernel_partition(dev, start, size).unwrap()
}

/// Gives udev time to act on anything it was told (and to re-read a table, if it would).
fn let_udev_act() {
    std::thread::sleep(Duration::from_millis(500));
}

fn wait_gone(path: &Path) {
    let t0 = Instant::now();
    while path.exists() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!path.exists(), "{} still exists", path.display());
}

// ---------------------------------------------------------------------------------
// GPT writing on image files: no root needed.

fn image(size: u64, fill: u8) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk.img");
    let mut f = File::create(&path).unwrap();
    let chunk = vec![fill; MIB as usize];
    for _ in 0..size / MIB {
        f.write_all(&chunk).unwrap();
    }
    (dir, path)
}

#[test]
fn a_primary_table_torn_by_a_kill_is_read_from_the_backup_and_mended_by_the_next_write() {
    // A process killed after the primary copy's entry array and before its header leaves
    // the primary failing its checksum; the backup was written whole before it.
    let (_d, img) = image(64 * MIB, 0);
    let a = gpt::volume_partition_guid("torn-a");
    gpt::add_partition(&img, 512, a, &gpt::partition_label("torn-a"), MIB, 8 * MIB).unwrap();
    let whole = gpt::read_table(&img, 512).unwrap().unwrap();
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&img).unwrap();
    use std::os::unix::fs::FileExt;
    let mut entry = [0u8; 1];
    f.read_exact_at(&mut entry, 2 * 512 + 40).unwrap();
    f.write_all_at(&[entry[0] ^ 0xff], 2 * 512 + 40).unwrap(); // the first entry's start LBA
    drop(f);
    let read = gpt::read_table(&img, 512).expect("the backup copy is read").expect("a table");
    assert_eq!(read.partitions, whole.partitions, "the backup's table");
    assert_eq!(read.disk_guid, whole.disk_guid);
    let b = gpt::volume_partition_guid("torn-b");
    gpt::add_partition(&img, 512, b, &gpt::partition_label("torn-b"), 16 * MIB, 8 * MIB).unwrap();
    let out = Command::new("sfdisk").arg("--json").arg(&img).output().unwrap();
    assert!(out.status.success() && !String::from_utf8_lossy(&out.stderr).contains("corrupt"), "both copies whole again: {}", String::from_utf8_lossy(&out.stderr));
    let after = gpt::read_table(&img, 512).unwrap().unwrap();
    assert_eq!(after.partitions.iter().map(|p| p.guid).collect::<Vec<_>>(), vec![a, b]);
}

#[test]
fn a_blank_image_gets_a_drivelet_gpt_that_other_tools_read_the_same_way() {
    let (_d, img) = image(64 * MIB, 0);
    let a = gpt::volume_partition_guid("pvc-a");
    let b = gpt::volume_partition_guid("pvc-b");
    assert_eq!(gpt::read_table(&img, 512).unwrap(), None);
    gpt::add_partition(&img, 512, a, &gpt::partition_label("pvc-a"), MIB, 8 * MIB).unwrap();
    gpt::add_partition(&img, 512, b, &gpt::partition_label("pvc-b"), 9 * MIB, 4 * MIB).unwrap();

    let t = table(&img);
    assert!(t.is_drivelet() && t.disk_guid.to_string().starts_with(gpt::DISK_GUID_PREFIX), "{t:?}");
    assert_eq!(t.partitions.len(), 2);
    assert_eq!((t.partitions[0].guid, t.partitions[0].start, t.partitions[0].size), (a, MIB, 8 * MIB));
    assert_eq!((t.partitions[1].guid, t.partitions[1].start, t.partitions[1].size), (b, 9 * MIB, 4 * MIB));
    assert!(t.partitions.iter().all(|p| p.is_drivelet()));
    assert_eq!(t.partitions[1].name, "drivelet:pvc-b");

    let (id, parts) = sfdisk_view(&img);
    assert_eq!(id, t.disk_guid.to_string());
    assert_eq!(
        parts,
        vec![
            (MIB, 8 * MIB, a.to_string(), "drivelet:pvc-a".to_string()),
            (9 * MIB, 4 * MIB, b.to_string(), "drivelet:pvc-b".to_string())
        ]
    );
    // The protective MBR is there, and blkid sees a GPT.
    assert_eq!(fs::probe_fs(&img).unwrap().as_deref(), Some("partition-table:gpt"));
    let raw = std::fs::read(&img).unwrap();
    assert_eq!(&raw[510..512], &[0x55, 0xaa]);
    assert_eq!(raw[446 + 4], 0xee);
}

#[test]
fn a_drivelet_gpt_works_with_4096_byte_sectors() {
    let (_d, img) = image(64 * MIB, 0);
    let g = gpt::volume_partition_guid("big-sectors");
    gpt::add_partition(&img, 4096, g, "drivelet:big-sectors", MIB, 16 * MIB).unwrap();
    let t = gpt::read_table(&img, 4096).unwrap().unwrap();
    assert_eq!((t.partitions[0].start, t.partitions[0].size), (MIB, 16 * MIB));
    let raw = std::fs::read(&img).unwrap();
    assert_eq!(&raw[4096..4104], b"EFI PART");
    // Read with the wrong sector size, it is an error, not "no GPT".
    assert!(matches!(gpt::read_table(&img, 512), Err(DiskError::Gpt { .. })));
}

#[test]
fn adding_the_same_partition_again_changes_no_byte() {
    let (_d, img) = image(32 * MIB, 0);
    let g = gpt::volume_partition_guid("again");
    gpt::add_partition(&img, 512, g, "drivelet:again", 2 * MIB, 4 * MIB).unwrap();
    let before = sha256(&img);
    gpt::add_partition(&img, 512, g, "drivelet:again", 2 * MIB, 4 * MIB).unwrap();
    assert_eq!(sha256(&img), before);
}

#[test]
fn overlaps_reused_guids_and_unaligned_extents_are_refused() {
    let (_d, img) = image(64 * MIB, 0);
    let a = gpt::volume_partition_guid("a");
    gpt::add_partition(&img, 512, a, "drivelet:a", 4 * MIB, 8 * MIB).unwrap();
    let before = sha256(&img);
    let b = gpt::volume_partition_guid("b");
    let e = gpt::add_partition(&img, 512, b, "drivelet:b", 11 * MIB, 4 * MIB).unwrap_err();
    assert!(matches!(e, DiskError::Conflict { .. }) && e.to_string().contains(&a.to_string()), "{e}");
    let e = gpt::add_partition(&img, 512, a, "drivelet:a", 20 * MIB, 8 * MIB).unwrap_err();
    assert!(matches!(e, DiskError::Conflict { .. }) && e.to_string().contains("already exists"), "{e}");
    let e = gpt::add_partition(&img, 512, b, "drivelet:b", 20 * MIB + 512, 8 * MIB).unwrap_err();
    assert!(matches!(e, DiskError::Invalid { .. }), "{e}");
    let e = gpt::add_partition(&img, 512, b, "drivelet:b", 60 * MIB, 8 * MIB).unwrap_err();
    assert!(matches!(e, DiskError::Conflict { .. }) && e.to_string().contains("usable"), "{e}");
    let e = gpt::add_partition(&img, 512, b, &"x".repeat(37), 20 * MIB, 8 * MIB).unwrap_err();
    assert!(matches!(e, DiskError::Invalid { .. }), "{e}");
    assert_eq!(sha256(&img), before, "refused requests wrote nothing");
}

#[test]
fn removing_a_partition_keeps_the_others_and_a_second_removal_finds_nothing() {
    let (_d, img) = image(64 * MIB, 0);
    let [a, b, c] = ["a", "b", "c"].map(gpt::volume_partition_guid);
    for (i, g) in [a, b, c].into_iter().enumerate() {
        gpt::add_partition(&img, 512, g, "drivelet:x", (1 + 10 * i as u64) * MIB, 10 * MIB).unwrap();
    }
    assert!(gpt::remove_partition(&img, 512, b).unwrap());
    assert!(!gpt::remove_partition(&img, 512, b).unwrap());
    let t = table(&img);
    assert_eq!(t.partitions.iter().map(|p| (p.guid, p.start)).collect::<Vec<_>>(), vec![(a, MIB), (c, 21 * MIB)]);
    assert_eq!(sfdisk_view(&img).1.len(), 2);
    // The freed space can be used again.
    let d = gpt::volume_partition_guid("d");
    gpt::add_partition(&img, 512, d, "drivelet:d", 11 * MIB, 10 * MIB).unwrap();
    assert_eq!(table(&img).partitions.len(), 3);
    // Nothing to remove on a device without a GPT.
    let (_d2, blank) = image(8 * MIB, 0);
    assert!(!gpt::remove_partition(&blank, 512, a).unwrap());
}

#[test]
fn a_partition_grows_only_into_free_space_and_never_shrinks() {
    let (_d, img) = image(64 * MIB, 0);
    let [a, b] = ["a", "b"].map(gpt::volume_partition_guid);
    gpt::add_partition(&img, 512, a, "drivelet:a", MIB, 4 * MIB).unwrap();
    gpt::add_partition(&img, 512, b, "drivelet:b", 10 * MIB, 4 * MIB).unwrap();
    gpt::resize_partition(&img, 512, a, 9 * MIB).unwrap();
    gpt::resize_partition(&img, 512, a, 9 * MIB).unwrap();
    assert_eq!(table(&img).partitions[0].size, 9 * MIB);
    let e = gpt::resize_partition(&img, 512, a, 10 * MIB).unwrap_err();
    assert!(matches!(e, DiskError::Conflict { .. }) && e.to_string().contains(&b.to_string()), "{e}");
    let e = gpt::resize_partition(&img, 512, a, 4 * MIB).unwrap_err();
    assert!(e.to_string().contains("shrinking"), "{e}");
    let e = gpt::resize_partition(&img, 512, gpt::volume_partition_guid("nope"), 4 * MIB).unwrap_err();
    assert!(matches!(e, DiskError::NotFound { .. }), "{e}");
    assert_eq!(sfdisk_view(&img).1[0].1, 9 * MIB);
}

#[test]
fn writing_a_gpt_never_touches_bytes_outside_its_structures() {
    let size = 32 * MIB;
    let (_d, img) = image(size, 0xa5);
    let g = gpt::volume_partition_guid("pattern");
    gpt::add_partition(&img, 512, g, "drivelet:pattern", MIB, 8 * MIB).unwrap();
    gpt::resize_partition(&img, 512, g, 16 * MIB).unwrap();
    assert!(gpt::remove_partition(&img, 512, g).unwrap());
    let raw = std::fs::read(&img).unwrap();
    assert!(outside_structures(&raw).all(|&b| b == 0xa5), "bytes between the GPT structures and the cleaning journal changed");
}

/// The bytes of a drivelet drive image outside its own structures: LBA 0 to 65 (MBR,
/// header, 256 entries), the cleaning journal's slots in the rest of the first MiB, and
/// the last 65 sectors (entries, header).
fn outside_structures(raw: &[u8]) -> impl Iterator<Item = &u8> {
    let journal = (drivelet::disk::clean::SLOTS[0] as usize, (drivelet::disk::clean::SLOTS[1] + drivelet::disk::clean::SLOT_LEN) as usize);
    raw[66 * 512..journal.0].iter().chain(&raw[journal.1..raw.len() - 65 * 512])
}

#[test]
fn a_removed_partition_is_dirty_in_the_same_commit_until_marked_clean_and_its_bytes_stay_until_zeroed() {
    let size = 64 * MIB;
    let (_d, img) = image(size, 0xa5);
    let (a, b) = (gpt::volume_partition_guid("a"), gpt::volume_partition_guid("b"));
    gpt::add_partition(&img, 512, a, "drivelet:a", MIB, 8 * MIB).unwrap();
    gpt::add_partition(&img, 512, b, "drivelet:b", 9 * MIB, 8 * MIB).unwrap();
    let dirty = |img: &Path| match gpt::read_dirty(img, 512).unwrap() {
        gpt::DirtyState::Drivelet { dirty, .. } => dirty,
        other => panic!("a drivelet table: {other:?}"),
    };
    // A fresh table trusts its free space (placement only puts a volume on a drive
    // known clean).
    assert_eq!(dirty(&img), vec![]);
    assert!(gpt::remove_partition(&img, 512, a).unwrap());
    assert_eq!(dirty(&img), vec![(MIB, 8 * MIB)], "the freed extent is dirty");
    assert!(gpt::remove_partition(&img, 512, b).unwrap());
    assert_eq!(dirty(&img), vec![(MIB, 16 * MIB)], "adjacent freed extents merge");
    let raw = std::fs::read(&img).unwrap();
    assert!(raw[(2 * MIB) as usize..(8 * MIB) as usize].iter().all(|&b| b == 0xa5), "a remove zeroes nothing: the cleaner does");

    // The cleaner's record: a step clean, then the rest.
    let guid = gpt::read_table(&img, 512).unwrap().unwrap().disk_guid;
    let (g, left) = gpt::mark_clean(&img, 512, MIB, 4 * MIB, Some(guid)).unwrap();
    assert_eq!((g, left.clone()), (guid, vec![(5 * MIB, 12 * MIB)]));
    assert_eq!(dirty(&img), left, "what is dirty survives a re-read");
    // Another table than the one being cleaned is refused, and nothing changes.
    let other = uuid::Uuid::from_u128(7);
    assert!(matches!(gpt::mark_clean(&img, 512, 5 * MIB, MIB, Some(other)), Err(DiskError::Foreign { .. })));
    assert_eq!(dirty(&img), left);
    gpt::mark_clean(&img, 512, 5 * MIB, 12 * MIB, Some(guid)).unwrap();
    assert_eq!(dirty(&img), vec![]);
    // A volume over clean space does not make it dirty; only its removal does.
    gpt::add_partition(&img, 512, a, "drivelet:a", MIB, 8 * MIB).unwrap();
    assert_eq!(dirty(&img), vec![]);
}

#[test]
fn a_table_without_a_journal_counts_all_free_space_dirty_and_a_blank_image_is_taken_by_its_first_clean_step() {
    let size = 64 * MIB;
    let (_d, img) = image(size, 0xa5);
    let g = gpt::volume_partition_guid("a");
    gpt::add_partition(&img, 512, g, "drivelet:a", 4 * MIB, 8 * MIB).unwrap();
    // Both journal slots torn (or a drive written before journals existed): unknown is
    // dirty, everything free.
    let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
    for at in drivelet::disk::clean::SLOTS {
        std::os::unix::fs::FileExt::write_all_at(&f, &[0xa5; 4096], at).unwrap();
    }
    drop(f);
    let free = gpt::free_extents(size, 512, &[(4 * MIB, 8 * MIB)]);
    assert_eq!(gpt::read_dirty(&img, 512).unwrap(), gpt::DirtyState::Drivelet { disk_guid: table(&img).disk_guid, dirty: free.clone(), free });

    // A blank image: the first step writes drivelet's table, the rest stays dirty.
    let (_d2, blank) = image(size, 0);
    assert_eq!(gpt::read_dirty(&blank, 512).unwrap(), gpt::DirtyState::Blank);
    let (guid, left) = gpt::mark_clean(&blank, 512, MIB, 16 * MIB, None).unwrap();
    let region = gpt::usable_region(size, 512).map(|(s, e)| (s, e - s)).unwrap();
    assert_eq!(left, vec![(17 * MIB, region.0 + region.1 - 17 * MIB)]);
    assert_eq!(gpt::read_dirty(&blank, 512).unwrap(), gpt::DirtyState::Drivelet { disk_guid: guid, dirty: left, free: vec![region] });
    assert!(table(&blank).partitions.is_empty(), "no partition, only the table");
    // Expecting a blank drive that has a table since is refused.
    assert!(matches!(gpt::mark_clean(&blank, 512, 17 * MIB, MIB, None), Err(DiskError::Foreign { .. })));
}

#[test]
fn a_partition_added_wiped_has_its_first_and_last_mib_zeroed_and_nothing_else_changed() {
    let size = 64 * MIB;
    let (_d, img) = image(size, 0xa5);
    let (start, len) = (4 * MIB, 16 * MIB);
    let g = gpt::volume_partition_guid("wiped");
    assert_eq!(gpt::add_partition_wiped(&img, 512, g, "drivelet:wiped", start, len, 0, None).unwrap(), gpt::Added::Wiped);
    let raw = std::fs::read(&img).unwrap();
    let (s, e, m) = (start as usize, (start + len) as usize, MIB as usize);
    assert!(raw[s..s + m].iter().all(|&b| b == 0), "the partition's first MiB is zero");
    assert!(raw[e - m..e].iter().all(|&b| b == 0), "the partition's last MiB is zero");
    assert!(raw[s + m..e - m].iter().all(|&b| b == 0xa5), "the middle of the partition is not written");
    let mut outside = raw.clone();
    outside[s..e].fill(0xa5);
    assert!(outside_structures(&outside).all(|&b| b == 0xa5), "nothing outside the partition, the GPT and the cleaning journal changed");
    let parts = gpt::read_table(&img, 512).unwrap().unwrap().partitions;
    assert_eq!(parts.iter().map(|p| (p.guid, p.start, p.size)).collect::<Vec<_>>(), vec![(g, start, len)]);

    // The same entry again: nothing is written, not even zeros over what is there now.
    let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0x5a; 512], start).unwrap();
    drop(f);
    let before = sha256(&img);
    assert_eq!(gpt::add_partition_wiped(&img, 512, g, "drivelet:wiped", start, len, 0, None).unwrap(), gpt::Added::AlreadyThere);
    assert_eq!(sha256(&img), before, "an entry already there is left as it is");
}

#[test]
fn an_image_with_a_filesystem_or_a_foreign_gpt_is_refused_untouched() {
    let (_d, img) = image(32 * MIB, 0);
    sh("mkfs.ext4", &["-F", "-q", img.to_str().unwrap()]);
    let before = sha256(&img);
    let g = gpt::volume_partition_guid("x");
    let e = gpt::add_partition(&img, 512, g, "drivelet:x", MIB, MIB).unwrap_err();
    assert!(matches!(e, DiskError::Foreign { .. }) && e.to_string().contains("ext4"), "{e}");
    assert_eq!(sha256(&img), before);

    let (_d2, img2) = image(32 * MIB, 0);
    let script = "label: gpt\nlabel-id: 12345678-1234-4234-8234-123456789abc\nstart=2048, size=4096, type=L\n";
    let mut child = Command::new("sfdisk")
        .arg("-q")
        .arg(&img2)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    assert!(child.wait().unwrap().success());
    let before = sha256(&img2);
    let e = gpt::add_partition(&img2, 512, g, "drivelet:x", 8 * MIB, MIB).unwrap_err();
    assert!(matches!(e, DiskError::Foreign { .. }) && e.to_string().contains("12345678"), "{e}");
    assert!(matches!(gpt::remove_partition(&img2, 512, g), Err(DiskError::Foreign { .. })));
    assert!(matches!(gpt::resize_partition(&img2, 512, g, 2 * MIB), Err(DiskError::Foreign { .. })));
    assert_eq!(sha256(&img2), before);
    assert!(!gpt::read_table(&img2, 512).unwrap().unwrap().is_drivelet());
}

#[test]
fn an_image_with_an_mbr_signature_only_is_refused() {
    let (_d, img) = image(8 * MIB, 0);
    let mut raw = std::fs::read(&img).unwrap();
    raw[510] = 0x55;
    raw[511] = 0xaa;
    std::fs::write(&img, &raw).unwrap();
    let e = gpt::add_partition(&img, 512, Uuid::new_v4(), "drivelet:x", MIB, MIB).unwrap_err();
    assert!(matches!(e, DiskError::Foreign { .. }), "{e}");
    assert_eq!(std::fs::read(&img).unwrap(), raw);
}

/// Writes an sfdisk script onto an image.
fn sfdisk(img: &Path, script: &str) {
    let mut child = Command::new("sfdisk").arg("-q").arg(img).stdin(std::process::Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    assert!(child.wait().unwrap().success(), "sfdisk {}", img.display());
}

/// Overwrites bytes of an image at `offset`.
fn poke(img: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    std::fs::OpenOptions::new().write(true).open(img).unwrap().write_all_at(bytes, offset).unwrap();
}

/// The writer refuses exactly what `gpt::examine` (the inventory's classification)
/// calls foreign, in the same words, and changes no byte of it; what examine calls
/// blank or drivelet's, the writer takes.
#[test]
fn the_writer_and_classification_judge_a_disk_by_one_rule() {
    let g = gpt::volume_partition_guid("rule");
    let foreign_gpt = "label: gpt\nlabel-id: 0BADBEEF-1234-4234-8234-123456789ABC\nstart=2048, size=4096, type=L\n";

    // A GPT whose primary copy (the first MiB) is gone: blkid sees nothing, the GPT
    // library reads the backup at the last LBA.
    let (_d1, backup_only) = image(32 * MIB, 0);
    sfdisk(&backup_only, foreign_gpt);
    poke(&backup_only, 0, &vec![0u8; MIB as usize]);
    assert_eq!(fs::probe_fs(&backup_only).unwrap(), None, "blkid -p finds nothing");

    let (_d2, dos) = image(32 * MIB, 0);
    sfdisk(&dos, "label: dos\nstart=2048, size=4096, type=83\nstart=8192, size=4096, type=83\n");

    // A drivelet GPT, and then an md 0.90 superblock (64 KiB before the 64 KiB-aligned
    // end, outside the GPT's structures): blkid -p finds the RAID member beside it.
    let (_d3, with_raid) = image(32 * MIB, 0);
    gpt::add_partition(&with_raid, 512, g, "drivelet:rule", MIB, 4 * MIB).unwrap();
    let mut sb = vec![0u8; 4096];
    for (word, v) in [(0usize, 0xa92b_4efcu32), (1, 0), (2, 90), (7, 1), (8, 16 * 1024), (9, 2), (10, 2)] {
        sb[word * 4..word * 4 + 4].copy_from_slice(&v.to_le_bytes());
    }
    poke(&with_raid, 32 * MIB - 64 * 1024, &sb);

    // A GPT written for 4096-byte sectors, read as a 512-byte disk.
    let (_d4, big_sectors) = image(32 * MIB, 0);
    gpt::add_partition(&big_sectors, 4096, g, "drivelet:rule", MIB, 4 * MIB).unwrap();

    let refused: [(&Path, &str); 4] = [
        (&backup_only, "a backup GPT at the end of the disk (its primary copy at the start is gone) with 1 partition not made by drivelet (disk GUID 0badbeef-1234-4234-8234-123456789abc)"),
        (&dos, "an MBR (DOS) partition table with 2 partitions"),
        (&with_raid, "a Linux RAID member (md superblock 0.90) beside a drivelet GPT"),
        (&big_sectors, "a GPT partition table drivelet cannot use ("),
    ];
    for (img, words) in refused {
        let gpt::Contents::Foreign(found) = gpt::examine(img, 512).unwrap() else { panic!("{}: foreign", img.display()) };
        assert!(found.starts_with(words), "{}: {found}", img.display());
        let before = sha256(img);
        let e = gpt::add_partition(img, 512, gpt::volume_partition_guid("other"), "drivelet:other", 8 * MIB, MIB).unwrap_err();
        assert!(matches!(&e, DiskError::Foreign { found: f, .. } if *f == found), "{}: the writer's words are examine's: {e}", img.display());
        assert_eq!(sha256(img), before, "{} untouched", img.display());
    }
    assert!(matches!(gpt::remove_partition(&with_raid, 512, g), Err(DiskError::Foreign { .. })), "no change beside a RAID member");

    let (_d5, blank) = image(32 * MIB, 0);
    assert_eq!(gpt::examine(&blank, 512).unwrap(), gpt::Contents::Blank);
    gpt::add_partition(&blank, 512, g, "drivelet:rule", MIB, 4 * MIB).unwrap();
    let gpt::Contents::Drivelet(t) = gpt::examine(&blank, 512).unwrap() else { panic!("a drivelet GPT") };
    assert_eq!(t.partitions.iter().map(|p| p.guid).collect::<Vec<_>>(), vec![g]);
    // Its primary copy gone, a drivelet GPT is still drivelet's, read from the backup.
    poke(&blank, 0, &vec![0u8; MIB as usize]);
    assert!(matches!(gpt::examine(&blank, 512).unwrap(), gpt::Contents::Drivelet(t) if t.partitions.len() == 1));
    gpt::add_partition(&blank, 512, gpt::volume_partition_guid("second"), "drivelet:second", 8 * MIB, MIB).unwrap();
    assert_eq!(table(&blank).partitions.len(), 2, "the writer takes it and rewrites both copies");
}

// ---------------------------------------------------------------------------------
// Loop devices: root.

#[test]
fn two_volumes_go_through_partitions_mkfs_mounts_binds_unmount_wipe_and_removal() {
    let mut s = Scene::new(1024 * MIB);
    let dev = s.dev.clone();
    let [ga, gb, gc] = ["vol-a", "vol-b", "vol-c"].map(gpt::volume_partition_guid);
    let (sa, za) = (MIB, 256 * MIB);
    let (sb, zb) = (257 * MIB, 320 * MIB);

    // GPT and kernel: two partitions with device nodes, as other tools see them.
    let pa = create(&dev, "vol-a", sa, za);
    let pb = create(&dev, "vol-b", sb, zb);
    let t = table(&dev);
    assert!(t.is_drivelet());
    assert_eq!(t.partitions.iter().map(|p| (p.guid, p.start, p.size)).collect::<Vec<_>>(), vec![(ga, sa, za), (gb, sb, zb)]);
    assert_eq!(sfdisk_view(&dev).1.len(), 2);
    for p in [&pa, &pb] {
        assert!(p.devnode.exists(), "{} has no node", p.devnode.display());
        assert_eq!(fs::device_size(&p.devnode).unwrap(), p.size);
    }
    let kp = blkpg::kernel_partitions(&dev).unwrap();
    assert!(kp.iter().any(|p| p.start == sa && p.size == za) && kp.iter().any(|p| p.start == sb && p.size == zb), "{kp:?}");

    // Asking again, without the lock, changes nothing and disturbs nothing.
    gpt::add_partition(&dev, 512, ga, &gpt::partition_label("vol-a"), sa, za).unwrap();
    assert_eq!(blkpg::ensure_kernel_partition(&dev, sa, za).unwrap(), pa);
    let_udev_act();
    assert_eq!(blkpg::kernel_partitions(&dev).unwrap().len(), 2, "udev re-read the table after a no-op");
    let e = blkpg::ensure_kernel_partition(&dev, sa, za + MIB).unwrap_err();
    assert!(matches!(e, DiskError::Conflict { .. }), "{e}");

    // Filesystems.
    fs::mkfs(&pa.devnode, "ext4").unwrap();
    fs::mkfs(&pb.devnode, "xfs").unwrap();
    assert_eq!(fs::probe_fs(&pa.devnode).unwrap().as_deref(), Some("ext4"));
    assert_eq!(fs::probe_fs(&pb.devnode).unwrap().as_deref(), Some("xfs"));

    // Mounts.
    let stage_a = s.mount_point("stage-a", false);
    let stage_b = s.mount_point("stage-b", false);
    let pub_a = s.mount_point("publish-a", false);
    // Every path is opened beneath the scene's directory, and used by descriptor.
    let roots = vec![s.dir.path().to_path_buf()];
    let node = |p: &Path| beneath::open(p, &roots).unwrap().unwrap_or_else(|| panic!("{} is there", p.display()));
    // What shows at a path: (a mount's root, its filesystem's device, the device node's).
    let shows = |p: &Path| {
        let st = node(p).stat().unwrap();
        (st.mount_root, st.dev, st.rdev)
    };
    let opts = parse_mount_flags(&["noatime".into(), "discard".into(), "commit=30".into()]).unwrap();
    beneath::mount_fs(&pa.devnode, &node(&stage_a), "ext4", &opts).unwrap();
    beneath::mount_fs(&pb.devnode, &node(&stage_b), "xfs", &parse_mount_flags(&["nouuid".into()]).unwrap()).unwrap();
    assert_eq!(shows(&stage_a), (true, devnum(&pa), None));
    assert_eq!(shows(&stage_b), (true, devnum(&pb), None));
    assert!(mount::mounts_at(&stage_a).unwrap()[0].options.contains("noatime"));
    std::fs::write(stage_a.join("hello"), b"world").unwrap();

    // Read-only bind: reads work, writes fail with EROFS, the staging mount stays writable.
    beneath::bind_node(&node(&stage_a), &node(&pub_a), beneath::attrs_of(nix::mount::MsFlags::empty(), true)).unwrap();
    assert_eq!(shows(&pub_a), (true, devnum(&pa), None));
    let top = mount::mounts_at(&pub_a).unwrap().pop().unwrap();
    assert!(mount::is_readonly(&top), "{top:?}");
    assert!(top.options.contains("noatime"), "the copy kept the atime flag: {top:?}");
    assert_eq!(std::fs::read(pub_a.join("hello")).unwrap(), b"world");
    let e = std::fs::write(pub_a.join("nope"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    std::fs::write(stage_a.join("still-rw"), b"x").unwrap();

    // A third partition added while the others are mounted (the table cannot be
    // re-read now): BLKPG still adds it. Published as a block volume onto a file.
    let pc = create(&dev, "vol-c", 600 * MIB, 16 * MIB);
    assert!(pc.devnode.exists());
    let block_target = s.mount_point("block-c", true);
    beneath::bind(&beneath::open_source(&pc.devnode).unwrap(), &pc.devnode, &node(&block_target), (0, 0)).unwrap();
    let entry = mount::mounts_at(&block_target).unwrap().pop().unwrap();
    eprintln!("block bind mount entry: {entry:?}");
    let (root, _, rdev) = shows(&block_target);
    assert!(root && rdev == Some(devnum(&pc)), "{entry:?}");

    // A mounted partition cannot be deleted or wiped; the error names it.
    let e = blkpg::remove_kernel_partition(&dev, sa).unwrap_err();
    assert!(matches!(e, DiskError::Busy { .. }) && e.to_string().contains(&pa.name) && e.to_string().contains("stage-a"), "{e}");
    let e = fs::wipe_signatures(&pa.devnode).unwrap_err();
    assert!(matches!(e, DiskError::Busy { .. }), "{e}");

    // Unmount: several layers at one path, then nothing left; again is fine.
    nix::mount::mount(Some("tmpfs"), &stage_b, Some("tmpfs"), nix::mount::MsFlags::empty(), None::<&str>).unwrap();
    assert_eq!(mount::mounts_at(&stage_b).unwrap().len(), 2);
    for m in [&pub_a, &stage_a, &stage_b, &block_target] {
        beneath::unmount_all(m, &roots, None).unwrap();
        assert!(mount::mounts_at(m).unwrap().is_empty());
        beneath::unmount_all(m, &roots, None).unwrap();
    }
    assert!(!shows(&stage_a).0);

    // Wipe: no signature survives.
    fs::wipe_signatures(&pa.devnode).unwrap();
    fs::wipe_signatures(&pb.devnode).unwrap();
    assert_eq!(fs::probe_fs(&pa.devnode).unwrap(), None);
    assert_eq!(fs::probe_fs(&pb.devnode).unwrap(), None);

    // Removal from the GPT and the kernel, under the lock, each idempotent.
    {
        let _udev = DiskLock::exclusive(&dev).unwrap();
        assert!(gpt::remove_partition(&dev, 512, ga).unwrap());
        assert!(!gpt::remove_partition(&dev, 512, ga).unwrap());
        blkpg::remove_kernel_partition(&dev, sa).unwrap();
        blkpg::remove_kernel_partition(&dev, sa).unwrap();
    }
    assert!(blkpg::kernel_partitions(&dev).unwrap().iter().all(|p| p.start != sa));
    wait_gone(&pa.devnode);
    let_udev_act();
    let left: Vec<u64> = blkpg::kernel_partitions(&dev).unwrap().iter().map(|p| p.start).collect();
    assert_eq!(left, vec![sb, 600 * MIB], "the other partitions stay");
    let t = table(&dev);
    assert_eq!(t.partitions.iter().map(|p| p.guid).collect::<Vec<_>>(), vec![gb, gc]);
}

#[test]
fn a_partition_added_under_the_lock_survives_udev_answering_an_older_write_late() {
    // A tool closed the disk after writing just before drivelet took the lock (as
    // losetup does when it sets a disk up): udev's answer to that close can arrive while
    // the lock is held and look like the answer to drivelet's own write. udev then
    // handles drivelet's close after the exclusive lock is gone: the lock must still
    // refuse its re-read, which would drop the partition just added.
    let s = Scene::new(64 * MIB);
    let_udev_act();
    for round in 0..5 {
        drop(std::fs::OpenOptions::new().write(true).open(&s.dev).unwrap());
        let name = format!("late-{round}");
        let p = create(&s.dev, &name, MIB, 8 * MIB);
        let udev_reread = Command::new("flock").args(["--nonblock", "--exclusive"]).arg(&s.dev).arg("true").status().unwrap();
        assert!(!udev_reread.success(), "round {round}: the disk could be locked exclusive right after the write");
        let _ = Command::new("udevadm").arg("settle").status();
        let_udev_act();
        assert_eq!(blkpg::kernel_partitions(&s.dev).unwrap(), vec![p.clone()], "round {round}: the partition is still there");
        let _udev = DiskLock::exclusive(&s.dev).unwrap();
        blkpg::remove_kernel_partition(&s.dev, MIB).unwrap();
        assert!(gpt::remove_partition(&s.dev, 512, gpt::volume_partition_guid(&name)).unwrap());
    }
}

#[test]
fn a_loop_device_with_ext4_on_it_is_refused_and_left_byte_for_byte_unchanged() {
    let s = Scene::new(64 * MIB);
    sh("mkfs.ext4", &["-F", "-q", s.dev.to_str().unwrap()]);
    let before = sha256(&s.dev);
    let g = gpt::volume_partition_guid("x");
    let e = gpt::add_partition(&s.dev, 512, g, "drivelet:x", MIB, 8 * MIB).unwrap_err();
    assert!(matches!(e, DiskError::Foreign { .. }) && e.to_string().contains("ext4"), "{e}");
    assert!(!gpt::remove_partition(&s.dev, 512, g).unwrap());
    assert_eq!(gpt::read_table(&s.dev, 512).unwrap(), None);
    assert_eq!(sha256(&s.dev), before);
}

#[test]
fn a_loop_device_with_someone_elses_gpt_is_refused_and_left_unchanged() {
    let s = Scene::new(64 * MIB);
    let script = "label: gpt\nlabel-id: 0badc0de-1234-4234-8234-123456789abc\nstart=2048, size=8192, type=L\n";
    // The kernel cannot parse GPTs here: give it the foreign partition by hand, under
    // the disk lock so udev's answer to sfdisk's write cannot drop it afterwards.
    let theirs = {
        let _udev = DiskLock::exclusive(&s.dev).unwrap();
        let mut child = Command::new("sfdisk")
            .args(["-q", "--no-reread", "--lock=no"])
            .arg(&s.dev)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
        assert!(child.wait().unwrap().success());
        blkpg::ensure_kernel_partition(&s.dev, MIB, 4 * MIB).unwrap()
    };
    let_udev_act();
    assert_eq!(blkpg::kernel_partitions(&s.dev).unwrap(), vec![theirs.clone()], "set-up");
    let before = sha256(&s.dev);
    let g = gpt::volume_partition_guid("x");
    let e = gpt::add_partition(&s.dev, 512, g, "drivelet:x", 16 * MIB, 8 * MIB).unwrap_err();
    assert!(matches!(e, DiskError::Foreign { .. }) && e.to_string().contains("0badc0de"), "{e}");
    assert!(matches!(gpt::remove_partition(&s.dev, 512, g), Err(DiskError::Foreign { .. })));
    assert!(matches!(gpt::resize_partition(&s.dev, 512, g, 2 * MIB), Err(DiskError::Foreign { .. })));
    assert_eq!(sha256(&s.dev), before);
    // Refusing never opened the disk for writing, so udev did not re-read its table.
    let_udev_act();
    assert_eq!(blkpg::kernel_partitions(&s.dev).unwrap(), vec![theirs]);
}

#[test]
fn a_partition_grows_in_the_gpt_and_then_in_the_kernel() {
    let s = Scene::new(128 * MIB);
    let a = gpt::volume_partition_guid("grow-a");
    let pa = create(&s.dev, "grow-a", MIB, 16 * MIB);
    create(&s.dev, "grow-b", 64 * MIB, 16 * MIB);
    fs::mkfs(&pa.devnode, "ext4").unwrap();
    let stage = tempfile::tempdir().unwrap();
    let roots = vec![stage.path().parent().unwrap().to_path_buf()];
    beneath::mount_fs(&pa.devnode, &beneath::open(stage.path(), &roots).unwrap().unwrap(), "ext4", &Default::default()).unwrap();
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let _guard = Unmount(stage.path());

    // Online: the partition is mounted while it grows.
    {
        let _udev = DiskLock::exclusive(&s.dev).unwrap();
        gpt::resize_partition(&s.dev, 512, a, 48 * MIB).unwrap();
        blkpg::resize_kernel_partition(&s.dev, MIB, 48 * MIB).unwrap();
        blkpg::resize_kernel_partition(&s.dev, MIB, 48 * MIB).unwrap();
    }
    assert_eq!(fs::device_size(&pa.devnode).unwrap(), 48 * MIB);
    let kp = blkpg::kernel_partitions(&s.dev).unwrap();
    assert!(kp.iter().any(|p| p.start == MIB && p.size == 48 * MIB), "{kp:?}");
    // Into the next partition: refused by both.
    assert!(matches!(gpt::resize_partition(&s.dev, 512, a, 64 * MIB), Err(DiskError::Conflict { .. })));
    assert!(matches!(blkpg::resize_kernel_partition(&s.dev, MIB, 64 * MIB), Err(DiskError::Conflict { .. })));
    assert!(matches!(blkpg::resize_kernel_partition(&s.dev, 2 * MIB, 4 * MIB), Err(DiskError::NotFound { .. })));
    beneath::unmount_all(stage.path(), &roots, None).unwrap();
    assert_eq!(table(&s.dev).partitions[0].size, 48 * MIB);
}

#[test]
fn many_partitions_come_and_go_under_the_disk_lock_and_the_kernel_keeps_the_rest() {
    let s = Scene::new(512 * MIB);
    let extent = |i: u64| (MIB + i * 16 * MIB, 16 * MIB);
    let made: Vec<KernelPartition> = (0..12).map(|i| create(&s.dev, &format!("churn-{i}"), extent(i).0, extent(i).1)).collect();
    let_udev_act();
    let now = blkpg::kernel_partitions(&s.dev).unwrap();
    assert_eq!(now.len(), 12, "{now:?}");
    assert!(made.iter().all(|p| now.contains(p)), "a partition was renumbered or lost: {now:?}");

    // Delete every other one as the volume manager does: wipe, then GPT and kernel.
    for i in (0..12).step_by(2) {
        fs::wipe_signatures(&made[i as usize].devnode).unwrap();
        let _udev = DiskLock::exclusive(&s.dev).unwrap();
        assert!(gpt::remove_partition(&s.dev, 512, gpt::volume_partition_guid(&format!("churn-{i}"))).unwrap());
        blkpg::remove_kernel_partition(&s.dev, extent(i).0).unwrap();
    }
    // And make new ones in the holes, with the lowest free numbers.
    for i in (0..12).step_by(4) {
        create(&s.dev, &format!("again-{i}"), extent(i).0, extent(i).1);
    }
    let_udev_act();
    let now = blkpg::kernel_partitions(&s.dev).unwrap();
    let kept: Vec<&KernelPartition> = made.iter().skip(1).step_by(2).collect();
    assert!(kept.iter().all(|p| now.contains(p)), "an untouched partition changed: {now:?}");
    assert_eq!(now.len(), 6 + 3, "{now:?}");
    let gpt_starts: Vec<u64> = table(&s.dev).partitions.iter().map(|p| p.start).collect();
    let mut kernel_starts: Vec<u64> = now.iter().map(|p| p.start).collect();
    kernel_starts.sort();
    let mut sorted = gpt_starts.clone();
    sorted.sort();
    assert_eq!(kernel_starts, sorted, "the kernel and the GPT agree");
}

/// The udev events for block devices seen while `f` runs and for 1.5 s after (udev's
/// probes, and the change event a quiet disk gets after `disk::writer::QUIET`): (action,
/// kernel name) pairs.
fn udev_events_during(f: impl FnOnce()) -> Vec<(String, String)> {
    use std::io::Read;
    let mut mon = Command::new("udevadm")
        .args(["monitor", "--udev", "--subsystem-match=block"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("udevadm monitor");
    std::thread::sleep(Duration::from_millis(500));
    f();
    std::thread::sleep(Duration::from_millis(1500));
    let _ = mon.kill();
    let mut out = String::new();
    mon.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let _ = mon.wait();
    // "UDEV  [1234.5678] change   /devices/virtual/block/loop3/loop3p2 (block)"
    out.lines()
        .filter(|l| l.starts_with("UDEV"))
        .filter_map(|l| {
            let mut w = l.split_whitespace().skip(2);
            let action = w.next()?.to_string();
            let name = w.next()?.rsplit('/').next()?.to_string();
            Some((action, name))
        })
        .collect()
}

#[test]
fn a_table_written_through_a_private_node_makes_udev_look_at_the_disk_once_not_at_every_partition() {
    let s = Scene::new(256 * MIB);
    let disk = s.dev.file_name().unwrap().to_string_lossy().into_owned();
    for i in 0..30u64 {
        create(&s.dev, &format!("v{i}"), (1 + i) * MIB, MIB);
    }
    sh("udevadm", &["settle"]);
    let partition_changes = |events: &[(String, String)]| {
        events.iter().filter(|(a, n)| a == "change" && n.starts_with(&format!("{disk}p"))).count()
    };

    // Through the disk's own node (udev watches it): udev answers the write with a change
    // for the disk and every partition.
    let own = udev_events_during(|| {
        create(&s.dev, "own-node", 40 * MIB, MIB);
    });
    assert!(partition_changes(&own) >= 30, "udev did not answer a write of the disk's own node for each partition: {own:?}");
    sh("udevadm", &["settle"]);

    // Through a private node: the new partition's add and one change of the disk.
    let devices = s.dir.path().join("devices");
    drivelet::disk::writer::init(&devices).unwrap();
    let mut made = None;
    let private = udev_events_during(|| {
        made = Some(create(&s.dev, "private-node", 42 * MIB, MIB));
    });
    let made = made.unwrap();
    let ours: Vec<&(String, String)> = private.iter().filter(|(_, n)| n.starts_with(&disk)).collect();
    assert_eq!(partition_changes(&private), 0, "partitions probed again after a write through a private node: {ours:?}");
    assert_eq!(ours.iter().filter(|(a, n)| a == "add" && *n == made.name).count(), 1, "{ours:?}");
    let disk_changes = ours.iter().filter(|(a, n)| a == "change" && *n == disk).count();
    assert!((1..=2).contains(&disk_changes), "the disk itself gets one change event: {ours:?}");

    // What was written is on the disk, as another reader of the disk's own node sees it.
    let (_, parts) = sfdisk_view(&s.dev);
    assert_eq!(parts.len(), 32);
    assert!(parts.iter().any(|p| p.0 == 42 * MIB && p.1 == MIB), "{parts:?}");
    assert_eq!(table(&s.dev).partitions.len(), 32);
    assert_eq!(blkpg::kernel_partitions(&s.dev).unwrap().len(), 32);
    // The node the write went through is gone.
    assert_eq!(std::fs::read_dir(&devices).unwrap().count(), 0, "a private node was left");
}
