//! An exclusive BSD lock on a whole disk while its partition table changes, following
//! systemd's block-device locking protocol.
//!
//! Why: closing a disk that was open for writing makes udev re-read its partition
//! table (BLKRRPART). That re-read drops every unused partition and adds back only
//! what the kernel's own parser finds, which is racy against the BLKPG adds drivelet
//! does and, on kernels that cannot parse the table, loses partitions outright. udev
//! re-reads only when its `flock(LOCK_EX|LOCK_NB)` on the disk succeeds; while any
//! process holds a lock on it, udev skips the re-read and only sends change events.
//!
//! Rules: the lock is taken on a read-only descriptor (closing it never counts as a
//! write). When a write was closed on the disk under an exclusive lock, dropping the
//! guard does not unlock: it turns the lock shared and keeps the descriptor for
//! [`LINGER`]. udev answers a close in its own time, after the lock is gone if it is
//! busy, and an answer seen under the lock may be the one for an older close (a tool
//! that configured the disk, say): a shared lock held for seconds after the last write
//! refuses udev's re-read whenever it comes, and lets udev's own probes (which take
//! the lock shared) run meanwhile. The next exclusive lock of the disk takes over the
//! lingering descriptor (so this process never waits on itself); a reaper thread closes
//! it once its time is up. No write: unlocked and closed at once. Callers hold the
//! drive's own mutex around an exclusive lock, so two of them never wait on each
//! other's descriptor. Readers that must not see a table half written (the inventory's
//! check of what a disk holds) take it shared, as udev's own probes do.
//!
//! A loop device that is detached (`losetup -d`) while open is released by the kernel
//! at its last close: the reaper checks a lingering loop device's `autoclear` flag
//! every 50 ms and lets go as soon as a detach was asked for (none lingers on one that
//! already has it). A real disk that is pulled goes at once whatever is open.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::DiskError;

/// How long a shared lock outlives the last write on a disk, for udev's answer.
pub const LINGER: Duration = Duration::from_secs(5);

/// How long taking the lock may wait for another holder.
pub const WAIT: Duration = Duration::from_secs(10);

/// Holds `LOCK_EX` (or `LOCK_SH`) on a whole disk until dropped.
pub struct DiskLock {
    /// `None` only while being dropped.
    file: Option<File>,
    disk: PathBuf,
    exclusive: bool,
    /// For an exclusive lock: a watch for closes after writes on the disk's node, set
    /// up when the lock is taken; `None` when it could not be (a write is assumed).
    closes: Option<OwnedFd>,
}

/// A descriptor still holding `LOCK_SH` after a write: until when, and for a loop
/// device the sysfs flag that says someone asked for its detach.
struct Linger {
    file: File,
    until: Instant,
    autoclear: Option<PathBuf>,
}

/// Lingering descriptors by disk.
struct Lingering {
    held: Mutex<HashMap<PathBuf, Linger>>,
    wake: Condvar,
}

/// How often lingering loop devices are checked for a detach request.
const DETACH_POLL: Duration = Duration::from_millis(50);

/// A loop device's `autoclear` flag file (`None`: not a loop device).
fn autoclear_flag(file: &File) -> Option<PathBuf> {
    let rdev = file.metadata().ok()?.rdev();
    let p = PathBuf::from(format!("/sys/dev/block/{}:{}/loop/autoclear", libc::major(rdev), libc::minor(rdev)));
    p.exists().then_some(p)
}

/// Whether a loop device is to be detached at its last close (`losetup -d` of an open
/// device sets this): a lingering lock must not hold that up.
fn detach_asked(flag: &Path) -> bool {
    std::fs::read_to_string(flag).is_ok_and(|v| v.trim() == "1")
}

fn lingering() -> &'static Lingering {
    static L: std::sync::OnceLock<Lingering> = std::sync::OnceLock::new();
    L.get_or_init(|| {
        let _ = std::thread::Builder::new().name("disk-lock-linger".into()).spawn(reap);
        Lingering { held: Mutex::new(HashMap::new()), wake: Condvar::new() }
    })
}

/// Closes lingering descriptors whose time is up, or whose loop device is being
/// detached.
fn reap() {
    let l = lingering();
    let mut held = l.held.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        let now = Instant::now();
        held.retain(|_, g| g.until > now && !g.autoclear.as_deref().is_some_and(detach_asked));
        let poll = held.values().any(|g| g.autoclear.is_some()).then(|| now + DETACH_POLL);
        let next = held.values().map(|g| g.until).chain(poll).min();
        held = match next {
            Some(until) => l.wake.wait_timeout(held, until.saturating_duration_since(now)).unwrap_or_else(PoisonError::into_inner).0,
            None => l.wake.wait(held).unwrap_or_else(PoisonError::into_inner),
        };
    }
}

/// The lingering descriptor of `disk`, if it is still the same device node.
fn take_lingering(disk: &Path) -> Option<File> {
    let file = lingering().held.lock().unwrap_or_else(PoisonError::into_inner).remove(disk)?.file;
    let same = match (file.metadata(), std::fs::metadata(disk)) {
        (Ok(a), Ok(b)) => a.rdev() == b.rdev() && a.ino() == b.ino(),
        _ => false,
    };
    same.then_some(file)
}

impl DiskLock {
    /// Locks `disk`, waiting up to [`WAIT`] for another holder (udev probes hold
    /// `LOCK_SH` briefly; a partitioning tool may hold `LOCK_EX`).
    pub fn exclusive(disk: &Path) -> Result<DiskLock, DiskError> {
        Self::take(disk, true)
    }

    /// Locks `disk` shared, waiting up to [`WAIT`] for a writer holding it exclusive;
    /// other readers (and a lingering lock) do not wait for each other.
    pub fn shared(disk: &Path) -> Result<DiskLock, DiskError> {
        Self::take(disk, false)
    }

    fn take(disk: &Path, exclusive: bool) -> Result<DiskLock, DiskError> {
        let _t = super::timing::step("lock.take");
        let open = || File::open(disk).map_err(DiskError::io(format!("open {} to lock it", disk.display())));
        let mut file = match exclusive.then(|| take_lingering(disk)).flatten() {
            Some(f) => f,
            None => open()?,
        };
        let op = if exclusive { libc::LOCK_EX } else { libc::LOCK_SH };
        let t0 = std::time::Instant::now();
        loop {
            // SAFETY: flock on a descriptor this function owns; no memory is passed.
            let r = unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) };
            if r == 0 {
                let closes = if exclusive { watch_closes(disk) } else { None };
                return Ok(DiskLock { file: Some(file), disk: disk.to_path_buf(), exclusive, closes });
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => {}
                Some(libc::EWOULDBLOCK) if t0.elapsed() < WAIT => {
                    // This process's own lingering lock, left since: take it over.
                    if let Some(f) = exclusive.then(|| take_lingering(disk)).flatten() {
                        file = f;
                        continue;
                    }
                    std::thread::sleep(Duration::from_millis(10))
                }
                Some(libc::EWOULDBLOCK) => {
                    return Err(DiskError::Io {
                        what: format!("lock {}: another process has held it for {}s", disk.display(), WAIT.as_secs()),
                        source: e,
                    })
                }
                _ => return Err(DiskError::Io { what: format!("lock {}", disk.display()), source: e }),
            }
        }
    }

    /// Whether anyone closed the disk after writing to it since the lock was taken.
    fn written(&self) -> bool {
        let Some(fd) = &self.closes else { return true };
        let mut buf = [0u8; 4096];
        // SAFETY: reads into a buffer on this frame, at most its length.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        n > 0
    }
}

impl Drop for DiskLock {
    fn drop(&mut self) {
        let Some(file) = self.file.take() else { return };
        if self.exclusive && self.written() {
            let _t = super::timing::step("lock.grace");
            let autoclear = autoclear_flag(&file);
            // SAFETY: as above; turning this descriptor's own lock shared.
            if !autoclear.as_deref().is_some_and(detach_asked) && unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH) } == 0 {
                let l = lingering();
                let g = Linger { file, until: Instant::now() + LINGER, autoclear };
                l.held.lock().unwrap_or_else(PoisonError::into_inner).insert(self.disk.clone(), g);
                l.wake.notify_one();
                return;
            }
        }
        // SAFETY: as above; unlocking a descriptor this guard owns.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// An inotify watch for `IN_CLOSE_WRITE` on the disk's node, `None` on failure.
fn watch_closes(disk: &Path) -> Option<OwnedFd> {
    let path = std::ffi::CString::new(disk.as_os_str().as_bytes()).ok()?;
    // SAFETY: plain syscalls; `path` is a NUL-terminated string that outlives the call,
    // and a non-negative descriptor just returned is owned by no one else.
    unsafe {
        let fd = libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC);
        if fd < 0 {
            return None;
        }
        let fd = OwnedFd::from_raw_fd(fd);
        (libc::inotify_add_watch(fd.as_raw_fd(), path.as_ptr(), libc::IN_CLOSE_WRITE) >= 0).then_some(fd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock_state(f: &File, op: libc::c_int) -> bool {
        // SAFETY: flock on a descriptor the test owns.
        unsafe { libc::flock(f.as_raw_fd(), op | libc::LOCK_NB) == 0 }
    }

    #[test]
    fn a_write_leaves_a_shared_lock_that_refuses_exclusive_lockers_and_the_next_exclusive_lock_takes_it_over() {
        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join("disk");
        std::fs::write(&disk, b"x").unwrap();
        let other = File::open(&disk).unwrap();
        {
            let _l = DiskLock::exclusive(&disk).unwrap();
            assert!(!lock_state(&other, libc::LOCK_SH), "exclusive while held");
            std::fs::OpenOptions::new().write(true).open(&disk).unwrap(); // a write closed
        }
        assert!(!lock_state(&other, libc::LOCK_EX), "udev's re-read is refused after the write");
        assert!(lock_state(&other, libc::LOCK_SH), "probes share the lingering lock");
        unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_UN) };
        // The next exclusive lock is not held up by its own process's linger.
        let t0 = Instant::now();
        let again = DiskLock::exclusive(&disk).unwrap();
        assert!(t0.elapsed() < Duration::from_secs(1), "took over the lingering lock");
        assert!(!lock_state(&other, libc::LOCK_SH), "exclusive again");
        drop(again); // no write: released at once
        assert!(lock_state(&other, libc::LOCK_EX), "nothing lingers after a lock with no write");
    }
}
