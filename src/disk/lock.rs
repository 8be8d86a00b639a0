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
//! write). An exclusive lock watches the disk's node for `IN_CLOSE_WRITE` (as udev
//! does) and listens to the kernel's uevents from the moment it is taken. When a write
//! was closed on the disk under it, dropping the guard:
//! 1. waits (if udev watches the disk, at most [`ANSWER_WAIT`]) for the "change" udev
//!    synthesises for the disk (`SYNTH_UUID` set), which udev sends after its own try
//!    at the lock failed; meanwhile udev's workers, which take the lock shared, put
//!    their events off, so the next call on the drive usually finds it free;
//! 2. then does not unlock but turns the lock shared and keeps the descriptor for
//!    [`LINGER`]: the answer seen may have been the one to an older close (a tool
//!    that configured the disk, say) while udev still has this one to handle, and a
//!    shared lock refuses its re-read whenever it comes. udev's probes share it.
//!
//! The next exclusive lock of the disk takes the lingering descriptor over (this
//! process never waits on itself); a reaper thread closes it once its time is up. No
//! write: unlocked and closed at once. An exclusive lock is exclusive inside this process
//! too: it first takes the disk's in-process hold (threads of this process wait for each
//! other there, never on each other's descriptor) and gives it back only after its
//! drop has handed the descriptor to the linger, so no caller needs a mutex of its own
//! around it. Readers that
//! must not see a table half written (the inventory's check of what a disk holds) take
//! it shared, as udev's own probes do.
//!
//! A loop device that is detached (`losetup -d`) while open is released by the kernel
//! at its last close: the reaper checks a lingering loop device's `autoclear` flag
//! every 50 ms and lets go as soon as a detach was asked for (none lingers on one that
//! already has it). A real disk that is pulled goes at once whatever is open.

use std::collections::{HashMap, HashSet};
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

/// How long an exclusive lock waits for udev's answer to a write before it turns
/// shared anyway.
pub const ANSWER_WAIT: Duration = Duration::from_secs(2);

/// How long taking the lock may wait for another holder.
pub const WAIT: Duration = Duration::from_secs(10);

/// Holds `LOCK_EX` (or `LOCK_SH`) on a whole disk until dropped.
pub struct DiskLock {
    /// `None` only while being dropped.
    file: Option<File>,
    disk: PathBuf,
    exclusive: bool,
    /// For an exclusive lock: the watch for writes on the disk and udev's answer to
    /// them, set up when the lock is taken; `None` when it could not be (a write is
    /// assumed, and lingers without waiting for an answer).
    answer: Option<Answer>,
    /// For an exclusive lock: the disk's in-process hold, given back when the lock's
    /// drop is done (fields drop after `Drop::drop`).
    _hold: Option<Hold>,
}

/// The disks an exclusive [`DiskLock`] of this process holds, and a wake-up for the
/// threads waiting for one of them.
struct Holders {
    held: Mutex<HashSet<PathBuf>>,
    freed: Condvar,
}

fn holders() -> &'static Holders {
    static H: std::sync::OnceLock<Holders> = std::sync::OnceLock::new();
    H.get_or_init(|| Holders { held: Mutex::new(HashSet::new()), freed: Condvar::new() })
}

/// One thread's in-process hold of a disk; dropping it wakes the next waiter.
struct Hold(PathBuf);

impl Hold {
    /// Waits until no other thread of this process holds `disk`, then holds it.
    fn take(disk: &Path) -> Hold {
        let h = holders();
        let mut held = h.held.lock().unwrap_or_else(PoisonError::into_inner);
        while held.contains(disk) {
            held = h.freed.wait(held).unwrap_or_else(PoisonError::into_inner);
        }
        held.insert(disk.to_path_buf());
        Hold(disk.to_path_buf())
    }
}

/// Whether a thread of this process holds `disk`'s exclusive lock now.
pub(crate) fn held_here(disk: &Path) -> bool {
    holders().held.lock().unwrap_or_else(PoisonError::into_inner).contains(disk)
}

impl Drop for Hold {
    fn drop(&mut self) {
        let h = holders();
        h.held.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.0);
        h.freed.notify_all();
    }
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
    let p = autoclear_path(file.metadata().ok()?.rdev());
    p.exists().then_some(p)
}

/// The `autoclear` flag file of the block device `rdev` (present for loop devices only).
fn autoclear_path(rdev: u64) -> PathBuf {
    PathBuf::from(format!("/sys/dev/block/{}:{}/loop/autoclear", libc::major(rdev), libc::minor(rdev)))
}

/// Whether `dev` is a loop device someone asked to detach, or is gone: a descriptor
/// opened on it now would hold its removal up (the note keeper leaves it alone).
pub(crate) fn detach_pending(dev: &Path) -> bool {
    match std::fs::metadata(dev) {
        Ok(md) => detach_asked(&autoclear_path(md.rdev())),
        Err(_) => true,
    }
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
        let hold = exclusive.then(|| Hold::take(disk));
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
                let answer = if exclusive { Answer::watch(disk) } else { None };
                return Ok(DiskLock { file: Some(file), disk: disk.to_path_buf(), exclusive, answer, _hold: hold });
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
                    std::thread::sleep(Duration::from_millis(1))
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

}

impl Drop for DiskLock {
    fn drop(&mut self) {
        let rdev = if self.exclusive { self.file.as_ref().and_then(|f| f.metadata().ok()).map(|m| m.rdev()) } else { None };
        self.release();
        // The change event a private writer owes the disk may go once it is quiet.
        drop(self._hold.take());
        if let Some(rdev) = rdev {
            super::writer::unlocked(rdev);
        }
    }
}

impl DiskLock {
    /// Lets the lock go: at once, or after udev's answer to a write and then shared for
    /// [`LINGER`].
    fn release(&mut self) {
        let Some(file) = self.file.take() else { return };
        let written = match self.answer.take() {
            Some(a) if a.written() => {
                let _t = super::timing::step("lock.grace");
                a.wait();
                true
            }
            Some(_) => false,
            None => self.exclusive,
        };
        if written {
            let _t = super::timing::step("lock.linger");
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

/// What an exclusive lock needs to see udev answer a write: an inotify watch for
/// `IN_CLOSE_WRITE` on the disk's node and a socket on the kernel's uevents, both set
/// up when the lock is taken, before any write under it.
struct Answer {
    inotify: OwnedFd,
    uevents: OwnedFd,
    /// `None` for a file that is no block device (udev watches none).
    devnum: Option<(u32, u32)>,
}

/// Takes ownership of a descriptor a libc call returned, `None` on failure.
fn owned(fd: libc::c_int) -> Option<OwnedFd> {
    // SAFETY: a non-negative descriptor just returned by the kernel is owned by no one else.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Answer {
    fn watch(disk: &Path) -> Option<Answer> {
        let devnum = super::block_devnum(disk);
        let path = std::ffi::CString::new(disk.as_os_str().as_bytes()).ok()?;
        // SAFETY: plain syscalls; `path` is a NUL-terminated string that outlives the call.
        let inotify = owned(unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) })?;
        if unsafe { libc::inotify_add_watch(inotify.as_raw_fd(), path.as_ptr(), libc::IN_CLOSE_WRITE) } < 0 {
            return None;
        }
        let uevents = owned(unsafe {
            libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, libc::NETLINK_KOBJECT_UEVENT)
        })?;
        // SAFETY: a zeroed sockaddr_nl is valid; it is filled in and passed with its size.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = 1; // the kernel's own uevents, before udev handles them
        let buf: libc::c_int = 1 << 20;
        // SAFETY: the socket is open; the option value and address live on this frame.
        unsafe {
            libc::setsockopt(uevents.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, (&buf as *const libc::c_int).cast(), 4);
            if libc::bind(uevents.as_raw_fd(), (&addr as *const libc::sockaddr_nl).cast(), std::mem::size_of::<libc::sockaddr_nl>() as u32) < 0 {
                return None;
            }
        }
        Some(Answer { inotify, uevents, devnum })
    }

    /// Whether anyone closed the disk after writing to it since the watch was set up.
    fn written(&self) -> bool {
        let mut buf = [0u8; 4096];
        // SAFETY: reads into a buffer on this frame, at most its length.
        let n = unsafe { libc::read(self.inotify.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        n > 0
    }

    /// Whether udev watches the disk (its rules say `OPTIONS+="watch"`): then udev
    /// answers a close after a write by trying to re-read the partition table.
    fn udev_watches(&self) -> bool {
        let Some((major, minor)) = self.devnum else { return false };
        let want = format!("b{major}:{minor}");
        let Ok(rd) = std::fs::read_dir("/run/udev/watch") else { return false };
        rd.filter_map(|e| e.ok()).any(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.as_os_str().as_bytes() == want.as_bytes()))
    }

    /// Whether a uevent is the change udev synthesises for this disk.
    fn is_answer(&self, msg: &[u8]) -> bool {
        let Some((major, minor)) = self.devnum else { return false };
        let (maj, min) = (format!("MAJOR={major}"), format!("MINOR={minor}"));
        let (mut change, mut synth, mut major, mut minor) = (false, false, false, false);
        for f in msg.split(|b| *b == 0).skip(1) {
            change |= f == b"ACTION=change";
            synth |= f.starts_with(b"SYNTH_UUID=");
            major |= f == maj.as_bytes();
            minor |= f == min.as_bytes();
        }
        change && synth && major && minor
    }

    /// Waits, if udev watches the disk (it was written), for udev's answer.
    fn wait(self) {
        if !self.udev_watches() {
            return;
        }
        let t0 = Instant::now();
        let mut buf = vec![0u8; 16 << 10];
        while let Some(left) = ANSWER_WAIT.checked_sub(t0.elapsed()) {
            let mut pfd = libc::pollfd { fd: self.uevents.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one pollfd on this frame; the descriptor is open.
            if unsafe { libc::poll(&mut pfd, 1, left.as_millis().max(1) as libc::c_int) } <= 0 {
                continue;
            }
            loop {
                // SAFETY: reads into a buffer on this frame, at most its length.
                let n = unsafe { libc::recv(self.uevents.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                if n < 0 {
                    break; // EAGAIN: drained; ENOBUFS: some were dropped, keep listening
                }
                if self.is_answer(&buf[..n as usize]) {
                    return;
                }
            }
        }
        tracing::warn!(
            disk.devnum = %self.devnum.map(|(a, b)| format!("{a}:{b}")).unwrap_or_default(),
            waited_ms = ANSWER_WAIT.as_millis() as u64,
            "udev did not answer a partition table write in time; releasing the disk lock anyway"
        );
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

    #[test]
    fn an_exclusive_lock_is_exclusive_between_threads_of_this_process_too() {
        // Two threads of this process never hold one disk at once, whatever they hold
        // around it: the lock takes its in-process hold itself.
        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join("disk");
        std::fs::write(&disk, b"x").unwrap();
        let first = DiskLock::exclusive(&disk).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let d = disk.clone();
        let waiter = std::thread::spawn(move || {
            let l = DiskLock::exclusive(&d).unwrap();
            tx.send(Instant::now()).unwrap();
            drop(l);
        });
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "a second thread got the disk while the first held it");
        let released = Instant::now();
        drop(first);
        let got = rx.recv_timeout(Duration::from_secs(10)).expect("the second thread gets the disk once the first lets go");
        assert!(got >= released, "not before the first let go");
        waiter.join().unwrap();
        // And the hold is given back: a third lock is had at once.
        let t0 = Instant::now();
        drop(DiskLock::exclusive(&disk).unwrap());
        assert!(t0.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn only_the_change_udev_synthesises_for_the_disk_is_its_answer() {
        // SAFETY: plain syscalls; any two descriptors do, the test reads neither.
        let (inotify, uevents) = unsafe { (libc::inotify_init1(libc::IN_CLOEXEC), libc::inotify_init1(libc::IN_CLOEXEC)) };
        let (inotify, uevents) = (owned(inotify).unwrap(), owned(uevents).unwrap());
        let a = Answer { inotify, uevents, devnum: Some((7, 3)) };
        let msg = |fields: &str| -> Vec<u8> { format!("change@/devices/virtual/block/loop3;{fields}").replace(';', "\0").into_bytes() };
        assert!(a.is_answer(&msg("ACTION=change;SYNTH_UUID=0;MAJOR=7;MINOR=3;DEVTYPE=disk")));
        assert!(!a.is_answer(&msg("ACTION=change;MAJOR=7;MINOR=3;DEVTYPE=disk")), "a change of the kernel's own");
        assert!(!a.is_answer(&msg("ACTION=change;SYNTH_UUID=0;MAJOR=7;MINOR=30")), "another disk");
        assert!(!a.is_answer(&msg("ACTION=add;SYNTH_UUID=0;MAJOR=7;MINOR=3")), "not a change");
        assert!(!a.is_answer(&msg("ACTION=change;SYNTH_UUID=0;MAJOR=259;MINOR=3")), "another major");
    }
}
