//! The kernel's view of a disk's partitions (sysfs) and the `BLKPG` ioctl that adds,
//! deletes and resizes one partition at a time.
//!
//! Why not re-read the whole table (`BLKRRPART`): it fails with `EBUSY` as soon as any
//! partition of the disk is mounted, and on loop devices it may create no nodes at all.
//! `BLKPG` changes one partition and leaves the others, mounted or not, alone.
//!
//! Rules:
//! - partitions are identified by their extent (start, size), never by number: numbers
//!   and device nodes are the kernel's, and a re-read of the table (udev runs one after a
//!   tool closes a written whole disk, when nothing on it is open) may renumber them;
//! - the number a partition had when this process last saw it is a hint ([`SEEN`]):
//!   it saves reading every partition's sysfs directory (500 reads on a full drive) to
//!   find one, and is used only once that number's own directory shows the same start
//!   (and size, when known); a stale hint is dropped and the directories are read;
//! - a partition is added only where no kernel partition overlaps it, with the lowest
//!   free partition number, and is returned only once its device node exists and is the
//!   right device;
//! - a partition in use (mounted, held, open) is never deleted: the error names it and,
//!   when known, where it is mounted; a short wait covers udev's own brief probes;
//! - a GPT change and the BLKPG call that follows it belong under one
//!   [`super::lock::DiskLock`]: BLKPG needs no write descriptor, but the GPT write
//!   does, and without the lock udev answers its close with a re-read that drops (or,
//!   with a kernel GPT parser, renumbers) every partition not in use;
//! - sysfs `start` and `size` are in 512-byte units whatever the logical block size.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::errno::Errno;

use super::{block_devnum, parse_devnum, sysfs_attr, DiskError};

/// How long to wait for a new partition's device node.
const NODE_WAIT: Duration = Duration::from_secs(10);
/// How often to look for it.
const POLL: Duration = Duration::from_millis(10);
/// How long a partition may stay busy (udev probing it) before deleting it gives up.
const BUSY_WAIT: Duration = Duration::from_secs(3);

/// Where this process last saw each kernel partition: (its disk's sysfs directory, its
/// start in bytes) to its number. A hint, checked before use ([`remembered`]).
static SEEN: Mutex<Option<HashMap<(PathBuf, u64), u32>>> = Mutex::new(None);
/// Most partitions [`SEEN`] holds (a drive holds at most 255); past it, it starts again.
const SEEN_MAX: usize = 16 * 1024;

/// `BLKPG` operations (`linux/blkpg.h`).
const BLKPG_ADD_PARTITION: libc::c_int = 1;
const BLKPG_DEL_PARTITION: libc::c_int = 2;
const BLKPG_RESIZE_PARTITION: libc::c_int = 3;

/// `struct blkpg_partition`: offsets and lengths in bytes.
#[repr(C)]
struct BlkpgPartition {
    start: libc::c_longlong,
    length: libc::c_longlong,
    pno: libc::c_int,
    devname: [libc::c_char; 64],
    volname: [libc::c_char; 64],
}

/// `struct blkpg_ioctl_arg`.
#[repr(C)]
struct BlkpgIoctlArg {
    op: libc::c_int,
    flags: libc::c_int,
    datalen: libc::c_int,
    data: *mut libc::c_void,
}

/// The raw ioctl, kept private to this file.
mod sys {
    nix::ioctl_write_ptr_bad!(
        /// `BLKPG`: `_IO(0x12, 105)`, taking a pointer to `struct blkpg_ioctl_arg`.
        blkpg_ioctl,
        nix::request_code_none!(0x12, 105),
        super::BlkpgIoctlArg
    );
}

/// A partition as the kernel knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelPartition {
    /// Kernel name, e.g. `loop0p1`.
    pub name: String,
    /// Partition number.
    pub number: u32,
    /// First byte on the disk.
    pub start: u64,
    /// Length in bytes.
    pub size: u64,
    /// Device node, e.g. `/dev/loop0p1`.
    pub devnode: PathBuf,
    /// `major:minor`.
    pub devnum: (u32, u32),
}

/// The sysfs directory of a whole disk, from its device node.
fn sysfs_dir(disk: &Path) -> Result<PathBuf, DiskError> {
    let (major, minor) = block_devnum(disk)
        .ok_or_else(|| DiskError::invalid(format!("{} is not a block device", disk.display())))?;
    let link = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let dir = link.canonicalize().map_err(DiskError::io(format!("resolve {} for {}", link.display(), disk.display())))?;
    if dir.join("partition").exists() {
        return Err(DiskError::invalid(format!("{} is a partition, not a whole disk", disk.display())));
    }
    Ok(dir)
}

/// Parses one partition directory of a disk in sysfs; `None` for other entries.
fn parse_partition_dir(dir: &Path) -> Option<KernelPartition> {
    let number = sysfs_attr(dir, "partition")?.parse().ok()?;
    let start = sysfs_attr(dir, "start")?.parse::<u64>().ok()? * 512;
    let size = sysfs_attr(dir, "size")?.parse::<u64>().ok()? * 512;
    let name = dir.file_name()?.to_string_lossy().into_owned();
    let devnum = sysfs_attr(dir, "dev").as_deref().and_then(parse_devnum)?;
    let devname = sysfs_attr(dir, "uevent")
        .and_then(|u| u.lines().find_map(|l| l.strip_prefix("DEVNAME=").map(str::to_string)))
        .unwrap_or_else(|| name.clone());
    Some(KernelPartition { name, number, start, size, devnode: Path::new("/dev").join(devname), devnum })
}

fn partitions_in(sys: &Path, disk: &Path) -> Result<Vec<KernelPartition>, DiskError> {
    let rd = std::fs::read_dir(sys).map_err(DiskError::io(format!("list {} for {}", sys.display(), disk.display())))?;
    let mut parts: Vec<KernelPartition> =
        rd.filter_map(|e| e.ok()).filter_map(|e| parse_partition_dir(&e.path())).collect();
    parts.sort_by_key(|p| p.number);
    for p in &parts {
        see(sys, p.start, p.number);
    }
    Ok(parts)
}

/// Where one partition of a disk lies, as its sysfs directory says: two reads of a full
/// drive's 255 directories, not six (a create or delete scans them twice); the rest
/// ([`parse_partition_dir`]) is read for the partition a caller wants.
struct Extent {
    dir: PathBuf,
    number: u32,
    start: u64,
    size: u64,
}

impl Extent {
    fn ends(&self) -> u64 {
        self.start + self.size
    }

    /// The whole partition; an error when its directory went meanwhile.
    fn full(&self, disk: &Path) -> Result<KernelPartition, DiskError> {
        parse_partition_dir(&self.dir).ok_or_else(|| DiskError::NotFound {
            device: disk.to_path_buf(),
            what: format!("kernel partition {} (gone while it was looked at)", self.number),
        })
    }
}

/// The number of the partition whose sysfs directory, in its disk's (named `base`), is
/// `name`: the disk's name and the number (`sda3`; `loop0p3`, `nvme0n1p3` after a
/// digit). `None` for the disk's other entries.
fn partition_number(base: &str, name: &str) -> Option<u32> {
    let rest = name.strip_prefix(base)?;
    let digits = rest.strip_prefix('p').unwrap_or(rest);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The partitions of the disk whose sysfs directory is `sys`, by number, with their
/// `start` and `size`.
fn extents_in(sys: &Path, disk: &Path) -> Result<Vec<Extent>, DiskError> {
    let base = sys.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let rd = std::fs::read_dir(sys).map_err(DiskError::io(format!("list {} for {}", sys.display(), disk.display())))?;
    let mut out: Vec<Extent> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let number = partition_number(&base, e.file_name().to_str()?)?;
            let dir = e.path();
            let start = sysfs_attr(&dir, "start")?.parse::<u64>().ok()?.checked_mul(512)?;
            let size = sysfs_attr(&dir, "size")?.parse::<u64>().ok()?.checked_mul(512)?;
            Some(Extent { dir, number, start, size })
        })
        .collect();
    out.sort_by_key(|p| p.number);
    for p in &out {
        see(sys, p.start, p.number);
    }
    Ok(out)
}

/// Partitions the kernel knows for a whole disk, by number.
pub fn kernel_partitions(disk: &Path) -> Result<Vec<KernelPartition>, DiskError> {
    partitions_in(&sysfs_dir(disk)?, disk)
}

/// Opens a whole disk for `BLKPG`. Read-only on purpose: closing a block device opened
/// for writing makes udev re-read its partition table.
fn open_disk(disk: &Path) -> Result<File, DiskError> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(disk)
        .map_err(DiskError::io(format!("open {}", disk.display())))
}

fn blkpg(disk: &Path, file: &File, op: libc::c_int, number: u32, start: u64, length: u64) -> Result<(), Errno> {
    let field = |v: u64| libc::c_longlong::try_from(v).map_err(|_| Errno::EOVERFLOW);
    let mut part = BlkpgPartition {
        start: field(start)?,
        length: field(length)?,
        pno: libc::c_int::try_from(number).map_err(|_| Errno::EOVERFLOW)?,
        devname: [0; 64],
        volname: [0; 64],
    };
    let arg = BlkpgIoctlArg {
        op,
        flags: 0,
        datalen: std::mem::size_of::<BlkpgPartition>() as libc::c_int,
        data: (&mut part as *mut BlkpgPartition).cast(),
    };
    tracing::debug!(disk = %disk.display(), op, number, start, length, "BLKPG");
    // SAFETY: the fd is open for the whole call; `arg` and the `part` it points to live
    // on this stack frame until the ioctl returns, have the kernel's `repr(C)` layout,
    // and `datalen` is the size of `part`. The kernel only reads them.
    unsafe { sys::blkpg_ioctl(file.as_raw_fd(), &arg) }.map(drop)
}

/// The sysfs directory of partition `number` of the disk whose directory is `sys`: the
/// disk's name and the number, with a `p` between when the name ends in a digit (the
/// kernel's rule).
fn partition_dir(sys: &Path, number: u32) -> Option<PathBuf> {
    let base = sys.file_name()?.to_str()?;
    let sep = if base.ends_with(|c: char| c.is_ascii_digit()) { "p" } else { "" };
    Some(sys.join(format!("{base}{sep}{number}")))
}

/// Runs `f` on the remembered partition numbers.
fn with_seen<T>(f: impl FnOnce(&mut HashMap<(PathBuf, u64), u32>) -> T) -> T {
    let mut g = SEEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    f(g.get_or_insert_with(HashMap::new))
}

/// Remembers that partition `number` of the disk whose directory is `sys` starts at `start`.
fn see(sys: &Path, start: u64, number: u32) {
    with_seen(|m| {
        if m.len() >= SEEN_MAX && !m.contains_key(&(sys.to_path_buf(), start)) {
            m.clear();
        }
        m.insert((sys.to_path_buf(), start), number);
    });
}

/// Forgets the partition at `start` of the disk whose directory is `sys`.
fn forget(sys: &Path, start: u64) {
    with_seen(|m| m.remove(&(sys.to_path_buf(), start)));
}

/// The kernel partition at `start` (of `size`, when given) of the disk whose directory
/// is `sys`, by the number it had when this process last saw it, checked by that
/// number's own directory: one directory read instead of every partition's. `None` when
/// nothing is remembered or the hint is stale (then forgotten): the caller reads them all.
fn remembered(sys: &Path, start: u64, size: Option<u64>) -> Option<Extent> {
    let number = with_seen(|m| m.get(&(sys.to_path_buf(), start)).copied())?;
    let dir = partition_dir(sys, number)?;
    let bytes = |attr| sysfs_attr(&dir, attr)?.parse::<u64>().ok()?.checked_mul(512);
    match (bytes("start"), bytes("size")) {
        (Some(s), Some(z)) if s == start && size.is_none_or(|want| want == z) => Some(Extent { dir, number, start, size: z }),
        _ => {
            forget(sys, start);
            None
        }
    }
}

/// The partition at `start` of the disk whose directory is `sys`: by its remembered
/// number, else by reading every partition's directory.
fn find_at(sys: &Path, disk: &Path, start: u64) -> Result<Option<Extent>, DiskError> {
    if let Some(e) = remembered(sys, start, None) {
        return Ok(Some(e));
    }
    Ok(extents_in(sys, disk)?.into_iter().find(|p| p.start == start))
}

/// The lowest partition number no partition directory of the disk has (names only).
fn free_number(sys: &Path) -> Option<u32> {
    let base = sys.file_name()?.to_str()?.to_string();
    let used: std::collections::HashSet<u32> = std::fs::read_dir(sys)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| partition_number(&base, e.file_name().to_str()?))
        .collect();
    (1u32..).find(|n| !used.contains(n))
}

/// Waits until the kernel partition at exactly `[start, start+size)` has a device node
/// of the right device; it may be renumbered meanwhile by a re-read of the table. Just
/// added as `number`: its own directory is looked at first.
fn wait_for_node(sys: &Path, disk: &Path, start: u64, size: u64, number: Option<u32>) -> Result<KernelPartition, DiskError> {
    let _t = super::timing::step("blkpg.node");
    let t0 = Instant::now();
    let added = number.and_then(|n| partition_dir(sys, n));
    loop {
        let here = added.as_deref().and_then(parse_partition_dir).filter(|p| p.start == start && p.size == size);
        let found = match here {
            Some(p) => Some(p),
            None => extents_in(sys, disk)?.into_iter().find(|p| p.start == start && p.size == size).and_then(|e| parse_partition_dir(&e.dir)),
        };
        if let Some(p) = found {
            if block_devnum(&p.devnode) == Some(p.devnum) {
                see(sys, p.start, p.number);
                return Ok(p);
            }
        }
        if t0.elapsed() >= NODE_WAIT {
            return Err(DiskError::Timeout {
                what: format!("the device node of the partition at [{start}, +{size}) of {}", disk.display()),
                waited: NODE_WAIT,
            });
        }
        std::thread::sleep(POLL);
    }
}

/// Makes sure the kernel has a partition at exactly `[start, start+size)` (bytes) on
/// `disk` and returns it once its device node exists. A missing one is added with the
/// lowest free partition number; one overlapping it differently is a
/// [`DiskError::Conflict`].
pub fn ensure_kernel_partition(disk: &Path, start: u64, size: u64) -> Result<KernelPartition, DiskError> {
    ensure_kernel_partition_added(disk, start, size).map(|(p, _)| p)
}

/// [`ensure_kernel_partition`], saying whether this call added the partition (`true`):
/// a partition added now is a new block device whose page cache holds nothing, so it
/// reads what is on the disk.
pub fn ensure_kernel_partition_added(disk: &Path, start: u64, size: u64) -> Result<(KernelPartition, bool), DiskError> {
    if size == 0 || !start.is_multiple_of(512) || !size.is_multiple_of(512) || start.checked_add(size).is_none() {
        return Err(DiskError::invalid(format!(
            "{}: partition [{start}, +{size}) bytes is empty or not in whole 512-byte sectors",
            disk.display()
        )));
    }
    let _t = super::timing::step("blkpg.ensure");
    let sys = sysfs_dir(disk)?;
    let file = open_disk(disk)?;
    let conflict = |reason: String| DiskError::Conflict { device: disk.to_path_buf(), start, size, reason };
    // A partition this process added or saw before (a delete's, a stage's): one look.
    if let Some(e) = remembered(&sys, start, Some(size)) {
        return wait_for_node(&sys, disk, start, size, Some(e.number)).map(|p| (p, false));
    }
    // Then the common case, without reading every partition's extent: the lowest number
    // no partition directory has, added; the kernel refuses an overlap itself (EBUSY),
    // and then the look below says what is there.
    if let Some(number) = free_number(&sys) {
        if blkpg(disk, &file, BLKPG_ADD_PARTITION, number, start, size).is_ok() {
            return wait_for_node(&sys, disk, start, size, Some(number)).map(|p| (p, true));
        }
    }
    // A re-read of the table by udev may race with the add (EBUSY): look again.
    for _ in 0..50 {
        let parts = extents_in(&sys, disk)?;
        if let Some(p) = parts.iter().find(|p| p.start == start && p.size == size) {
            return wait_for_node(&sys, disk, start, size, Some(p.number)).map(|p| (p, false));
        }
        if let Some(p) = parts.iter().find(|p| p.start < start + size && start < p.ends()) {
            let p = p.full(disk)?;
            return Err(conflict(format!(
                "the kernel has partition {} ({}) at [{}, +{}) over it",
                p.number,
                p.devnode.display(),
                p.start,
                p.size
            )));
        }
        let number = (1u32..).find(|n| parts.iter().all(|p| p.number != *n)).unwrap_or(1);
        match blkpg(disk, &file, BLKPG_ADD_PARTITION, number, start, size) {
            Ok(()) => return wait_for_node(&sys, disk, start, size, Some(number)).map(|p| (p, true)),
            Err(Errno::EBUSY) => std::thread::sleep(POLL * 5),
            Err(e) => {
                return Err(DiskError::Io {
                    what: format!("add partition {number} at [{start}, +{size}) to {} (BLKPG)", disk.display()),
                    source: e.into(),
                })
            }
        }
    }
    Err(conflict("the kernel kept refusing the partition as busy (overlap or number in use)".into()))
}

/// What holds a partition for good: its mount points and holders.
fn users_of(p: &KernelPartition, sys: &Path) -> Vec<String> {
    let mut users: Vec<String> = super::mounts::read_mountinfo()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.devnum == p.devnum)
        .map(|m| format!("mounted at {}", m.mount_point.display()))
        .collect();
    if let Ok(rd) = std::fs::read_dir(sys.join(&p.name).join("holders")) {
        users.extend(rd.filter_map(|e| e.ok()).map(|e| format!("held by {}", e.file_name().to_string_lossy())));
    }
    users
}

/// Removes the kernel partition of `disk` that starts at `start` (bytes); success when
/// there is none. A partition in use is a [`DiskError::Busy`] naming it.
pub fn remove_kernel_partition(disk: &Path, start: u64) -> Result<(), DiskError> {
    let _t = super::timing::step("blkpg.remove");
    let sys = sysfs_dir(disk)?;
    let file = open_disk(disk)?;
    let t0 = Instant::now();
    loop {
        let Some(p) = find_at(&sys, disk, start)? else { return Ok(()) };
        let p = match p.full(disk) {
            Ok(p) => p,
            // Gone meanwhile: the next look finds it gone.
            Err(_) if t0.elapsed() < BUSY_WAIT => continue,
            Err(e) => return Err(e),
        };
        match blkpg(disk, &file, BLKPG_DEL_PARTITION, p.number, 0, 0) {
            Ok(()) | Err(Errno::ENXIO) => {
                forget(&sys, start);
                return Ok(());
            }
            Err(Errno::EBUSY) => {
                let users = users_of(&p, &sys);
                // udev opens a partition briefly to probe it; a mount or holder stays.
                if t0.elapsed() >= BUSY_WAIT || !users.is_empty() {
                    let users = if users.is_empty() { "open by a process".to_string() } else { users.join(", ") };
                    return Err(DiskError::Busy {
                        path: p.devnode.clone(),
                        reason: format!("cannot delete partition {} of {}: {users}", p.number, disk.display()),
                    });
                }
                std::thread::sleep(POLL * 5);
            }
            Err(e) => {
                return Err(DiskError::Io {
                    what: format!("delete partition {} ({}) of {} (BLKPG)", p.number, p.devnode.display(), disk.display()),
                    source: e.into(),
                })
            }
        }
    }
}

/// Tells the kernel the partition of `disk` starting at `start` is now `new_size` bytes.
pub fn resize_kernel_partition(disk: &Path, start: u64, new_size: u64) -> Result<(), DiskError> {
    if new_size == 0 || !new_size.is_multiple_of(512) {
        return Err(DiskError::invalid(format!(
            "{}: new partition size {new_size} is empty or not in whole 512-byte sectors",
            disk.display()
        )));
    }
    let sys = sysfs_dir(disk)?;
    let file = open_disk(disk)?;
    let p = find_at(&sys, disk, start)?.ok_or_else(|| DiskError::NotFound {
        device: disk.to_path_buf(),
        what: format!("kernel partition starting at byte {start}"),
    })?;
    let p = p.full(disk)?;
    if p.size == new_size {
        return Ok(());
    }
    match blkpg(disk, &file, BLKPG_RESIZE_PARTITION, p.number, start, new_size) {
        Ok(()) => Ok(()),
        Err(Errno::EBUSY) => Err(DiskError::Conflict {
            device: disk.to_path_buf(),
            start,
            size: new_size,
            reason: format!("growing partition {} ({}) would overlap another", p.number, p.devnode.display()),
        }),
        Err(e) => Err(DiskError::Io {
            what: format!("resize partition {} ({}) of {} to {new_size} bytes (BLKPG)", p.number, p.devnode.display(), disk.display()),
            source: e.into(),
        }),
    }
}

nix::ioctl_write_ptr_bad!(
    /// `BLKROSET`: `_IO(0x12, 93)`, taking a pointer to an `int` (1: read-only).
    blkroset_ioctl,
    nix::request_code_none!(0x12, 93),
    libc::c_int
);

/// Marks a block device (a partition) read-only or read-write in the kernel: every
/// opener, every bind of its node, sees the same setting until it is changed back.
pub fn set_read_only(dev: &Path, ro: bool) -> Result<(), DiskError> {
    let file = open_disk(dev)?;
    let v: libc::c_int = ro.into();
    // SAFETY: the fd is open for the call and `v` lives on this frame; the kernel reads
    // one int through the pointer.
    unsafe { blkroset_ioctl(file.as_raw_fd(), &v) }
        .map(drop)
        .map_err(|e| DiskError::Io { what: format!("set {} read-only={ro} (BLKROSET)", dev.display()), source: e.into() })
}

/// Whether the kernel has a block device marked read-only (`/sys/.../ro`).
pub fn is_read_only(dev: &Path) -> bool {
    let Some((major, minor)) = block_devnum(dev) else { return false };
    std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/ro")).map(|s| s.trim() == "1").unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_directory_is_named_by_its_disk_and_number() {
        let cases = [
            ("sda", "sda3", Some(3)),
            ("loop0", "loop0p12", Some(12)),
            ("nvme0n1", "nvme0n1p255", Some(255)),
            ("sda", "sda", None),
            ("sda", "sdab1", None),
            ("loop0", "loop0p", None),
            ("loop0", "loop0p+1", None),
            ("sda", "holders", None),
            ("sda", "sda99999999999", None),
        ];
        for (base, name, want) in cases {
            assert_eq!(partition_number(base, name), want, "{base} {name}");
        }
        assert_eq!(partition_dir(Path::new("/sys/block/loop0"), 4), Some(PathBuf::from("/sys/block/loop0/loop0p4")));
        assert_eq!(partition_dir(Path::new("/sys/block/sda"), 4), Some(PathBuf::from("/sys/block/sda/sda4")));
    }

    /// A fake sysfs directory of partition `number` of disk `loop9` under `sys`.
    fn fake_partition(sys: &Path, number: u32, start_sectors: u64, size_sectors: u64) {
        let p = sys.join(format!("loop9p{number}"));
        std::fs::create_dir_all(&p).unwrap();
        for (f, v) in [("partition", number.to_string()), ("start", start_sectors.to_string()), ("size", size_sectors.to_string())] {
            std::fs::write(p.join(f), format!("{v}\n")).unwrap();
        }
    }

    #[test]
    fn a_remembered_partition_number_is_used_only_while_its_directory_agrees() {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("loop9");
        fake_partition(&sys, 1, 2048, 2048);
        fake_partition(&sys, 7, 8192, 4096);
        let disk = Path::new("/dev/loop9");
        // Nothing remembered: not found by the hint; the full read finds it and remembers all.
        assert!(remembered(&sys, 8192 * 512, None).is_none());
        let found = find_at(&sys, disk, 8192 * 512).unwrap().expect("found by reading every directory");
        assert_eq!((found.number, found.size), (7, 4096 * 512));
        let hint = remembered(&sys, 8192 * 512, Some(4096 * 512)).expect("remembered after the read");
        assert_eq!(hint.number, 7);
        assert!(remembered(&sys, 2048 * 512, Some(2048 * 512)).is_some());
        // Another size at that start: not this partition.
        assert!(remembered(&sys, 8192 * 512, Some(512 * 512)).is_none());
        // Renumbered by a re-read of the table: the stale hint is dropped, the full read
        // finds the partition under its new number.
        see(&sys, 8192 * 512, 7);
        std::fs::remove_dir_all(sys.join("loop9p7")).unwrap();
        fake_partition(&sys, 2, 8192, 4096);
        assert!(remembered(&sys, 8192 * 512, None).is_none());
        assert_eq!(find_at(&sys, disk, 8192 * 512).unwrap().map(|e| e.number), Some(2));
        assert_eq!(remembered(&sys, 8192 * 512, None).map(|e| e.number), Some(2));
        // Gone: nothing at that start.
        forget(&sys, 2048 * 512);
        std::fs::remove_dir_all(sys.join("loop9p1")).unwrap();
        assert!(find_at(&sys, disk, 2048 * 512).unwrap().is_none());
    }

    #[test]
    fn blkpg_structures_have_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<BlkpgPartition>(), 152);
        assert_eq!(std::mem::size_of::<BlkpgIoctlArg>(), 24);
        assert_eq!(nix::request_code_none!(0x12, 105), 0x1269);
    }

    #[test]
    fn sysfs_partition_directories_parse_in_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("loop7p2");
        std::fs::create_dir(&p).unwrap();
        for (f, v) in [("partition", "2\n"), ("start", "2048\n"), ("size", "4096\n"), ("dev", "259:3\n")] {
            std::fs::write(p.join(f), v).unwrap();
        }
        std::fs::write(p.join("uevent"), "MAJOR=259\nMINOR=3\nDEVNAME=loop7p2\nDEVTYPE=partition\n").unwrap();
        std::fs::create_dir(dir.path().join("queue")).unwrap();
        let parts = partitions_in(dir.path(), Path::new("/dev/loop7")).unwrap();
        assert_eq!(
            parts,
            vec![KernelPartition {
                name: "loop7p2".into(),
                number: 2,
                start: 1 << 20,
                size: 2 << 20,
                devnode: PathBuf::from("/dev/loop7p2"),
                devnum: (259, 3),
            }]
        );
    }
}
