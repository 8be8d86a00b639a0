//! A whole disk opened for writing where udev's watch does not see it.
//!
//! udev watches every disk node (`OPTIONS+="watch"` in its 60-block rules): the close of
//! a descriptor that wrote to `/dev/loop5` makes udev try to re-read the disk's table
//! and, when the drive lock refuses it that, send a change event for the disk and for
//! each of its partitions. Every table write on a drive holding N partitions cost N+1
//! probes, N²/2 over filling a drive: 250 partitions queued about 31,000 events, the
//! node's load rose past 20 and a create took a second (BENCHMARKS.md).
//!
//! So drivelet writes a disk through a device node of its own: the path is opened once
//! read-only, its descriptor says which device it is (a block device, `major:minor`),
//! a node for that very device is made in a private directory (`<state dir>/devices`,
//! mode 0700, emptied at start), opened read-write by name relative to that directory's
//! descriptor, checked to be the same device, and unlinked at once; the kernel shares one
//! page cache between every node of a device, so readers see the write. The watch is on
//! the inode of `/dev/loop5`, not this one: nothing is synthesised. BLKPG announces each
//! partition added or removed itself. And once the disk has had no write for
//! [`QUIET`] (a burst of creates is one), it gets one change event of its own
//! (`/sys/dev/block/M:m/uevent`), so udev's database and the inventory read its new table
//! once; sent from a thread of its own, after any drive lock of this process on it is let
//! go, so no call on the drive waits for udev's probe of it.
//!
//! Without the directory (a tool or test that never called [`init`]), or where the node
//! cannot be made (no `CAP_MKNOD`, a `nodev` mount, the seccomp filter of an older
//! build), the disk's own node is opened as before, and the drive lock's wait for udev's
//! answer covers it (said once in the log).

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::DiskError;

/// The private directory, opened once.
static DIR: OnceLock<OwnedFd> = OnceLock::new();
/// Set once a node could not be made there: every later write uses the disk's node.
static REFUSED: AtomicBool = AtomicBool::new(false);
static SEQ: AtomicU64 = AtomicU64::new(0);

/// How long a disk written through a private node stays unwritten before it gets its
/// change event.
pub const QUIET: Duration = Duration::from_millis(100);

/// Disks owed a change event: when it is due, and whether a drive lock of this process
/// still holds them (then it waits for the lock to go).
struct Owed {
    due: Mutex<HashMap<u64, (Instant, bool)>>,
    wake: Condvar,
}

fn owed() -> &'static Owed {
    static O: OnceLock<Owed> = OnceLock::new();
    O.get_or_init(|| {
        let _ = std::thread::Builder::new().name("disk-announce".into()).spawn(announcer);
        Owed { due: Mutex::new(HashMap::new()), wake: Condvar::new() }
    })
}

/// Sends each owed change event once its disk has been quiet for [`QUIET`] and no lock of
/// this process holds it.
fn announcer() {
    let o = owed();
    let mut due = o.due.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        let now = Instant::now();
        let ready: Vec<u64> = due.iter().filter(|(_, (at, locked))| !locked && *at <= now).map(|(r, _)| *r).collect();
        for r in &ready {
            due.remove(r);
        }
        if !ready.is_empty() {
            drop(due);
            ready.into_iter().for_each(announce);
            due = o.due.lock().unwrap_or_else(PoisonError::into_inner);
            continue;
        }
        let next = due.values().filter(|(_, locked)| !locked).map(|(at, _)| *at).min();
        due = match next {
            Some(at) => o.wake.wait_timeout(due, at.saturating_duration_since(now)).unwrap_or_else(PoisonError::into_inner).0,
            None => o.wake.wait(due).unwrap_or_else(PoisonError::into_inner),
        };
    }
}

/// Makes `dir` (mode 0700) the private directory for device nodes, removing what a
/// killed run left in it. Called once at start, before any write.
pub fn init(dir: &Path) -> Result<(), DiskError> {
    use std::os::unix::fs::DirBuilderExt;
    let io = |what: &str| DiskError::io(format!("{what} {}", dir.display()));
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io("create"))?;
    let md = std::fs::symlink_metadata(dir).map_err(io("stat"))?;
    if !md.is_dir() || md.uid() != 0 && md.uid() != nix::unistd::geteuid().as_raw() {
        return Err(DiskError::invalid(format!("{} is not a directory of this user's", dir.display())));
    }
    for e in std::fs::read_dir(dir).map_err(io("read"))?.flatten() {
        let _ = std::fs::remove_file(e.path());
    }
    let fd = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(io("open"))?;
    let _ = DIR.set(OwnedFd::from(fd));
    Ok(())
}

/// A whole disk open for writing (and reading); see the module doc.
pub struct Writer {
    file: Option<File>,
    /// Made through a private node: a change event is owed when it closes.
    rdev: Option<u64>,
    disk: PathBuf,
}

impl std::ops::Deref for Writer {
    type Target = File;
    fn deref(&self) -> &File {
        self.file.as_ref().expect("a writer holds its file until dropped")
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.file.take());
        let Some(rdev) = self.rdev else { return };
        let locked = super::lock::held_here(&self.disk);
        let o = owed();
        o.due.lock().unwrap_or_else(PoisonError::into_inner).insert(rdev, (Instant::now() + QUIET, locked));
        o.wake.notify_one();
    }
}

/// The drive lock of this process on the disk `rdev` was let go: its owed change event,
/// if any, may go once the disk is quiet.
pub(crate) fn unlocked(rdev: u64) {
    let o = owed();
    let mut due = o.due.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((at, locked)) = due.get_mut(&rdev) {
        *locked = false;
        *at = (*at).max(Instant::now() + QUIET);
        o.wake.notify_one();
    }
}

/// One change event for the block device `rdev`.
fn announce(rdev: u64) {
    let path = format!("/sys/dev/block/{}:{}/uevent", libc::major(rdev), libc::minor(rdev));
    if let Err(e) = std::fs::write(&path, "change") {
        debug!(path, error = %e, "no change event for a written disk");
    }
}

/// Opens the whole disk `dev` to write it (see the module doc).
pub fn open(dev: &Path) -> Result<Writer, DiskError> {
    let probe = File::options()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(dev)
        .map_err(DiskError::io(format!("open {}", dev.display())))?;
    // The disk's own node, opened again through the descriptor just opened (the same
    // file, not a second lookup of the path).
    let own = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(format!("/proc/self/fd/{}", probe.as_raw_fd()))
            .map(|f| Writer { file: Some(f), rdev: None, disk: dev.to_path_buf() })
            .map_err(DiskError::io(format!("open {} for writing", dev.display())))
    };
    let Some(dir) = DIR.get() else { return own() };
    if REFUSED.load(Ordering::Relaxed) {
        return own();
    }
    let md = probe.metadata().map_err(DiskError::io(format!("stat {}", dev.display())))?;
    if !md.file_type().is_block_device() {
        // An image file (tests, the demo's tools): no udev watch, nothing to avoid.
        return own();
    }
    let rdev = md.rdev();
    match private_node(dir, rdev) {
        Ok(f) => Ok(Writer { file: Some(f), rdev: Some(rdev), disk: dev.to_path_buf() }),
        Err(e) => {
            if !REFUSED.swap(true, Ordering::Relaxed) {
                warn!(error = %e, "cannot make a private device node to write disks through; writing through the disks' own nodes (udev then probes every partition after each table write)");
            }
            own()
        }
    }
}

/// A node for the block device `rdev` in the private directory, opened read-write and
/// unlinked.
fn private_node(dir: &OwnedFd, rdev: u64) -> std::io::Result<File> {
    use nix::fcntl::{openat, OFlag};
    use nix::sys::stat::{mknodat, Mode, SFlag};
    let name = format!("{}-{}.{}", libc::major(rdev), libc::minor(rdev), SEQ.fetch_add(1, Ordering::Relaxed));
    mknodat(dir, name.as_str(), SFlag::S_IFBLK, Mode::S_IRUSR | Mode::S_IWUSR, rdev)?;
    let opened = openat(dir, name.as_str(), OFlag::O_RDWR | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW, Mode::empty());
    let _ = nix::unistd::unlinkat(dir, name.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
    let file = File::from(opened?);
    let md = file.metadata()?;
    if !md.file_type().is_block_device() || md.rdev() != rdev {
        return Err(std::io::Error::other("the private node is not the device it was made for"));
    }
    Ok(file)
}
