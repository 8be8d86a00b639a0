//! An exclusive BSD lock on a whole disk while its partition table changes, following
//! systemd's block-device locking protocol.
//!
//! Why: closing a disk that was open for writing makes udev re-read its partition
//! table (BLKRRPART). That re-read drops every unused partition and adds back only
//! what the kernel's own parser finds, which is racy against the BLKPG adds drivelet
//! does and, on kernels that cannot parse the table, loses partitions outright. While
//! a process holds `LOCK_EX` on the disk, udev skips the re-read and only sends change
//! events.
//!
//! Rules: the lock is taken on a read-only descriptor (closing it never counts as a
//! write); dropping the guard releases it, but not before udev has answered the close
//! of every write made under it: an exclusive lock watches the disk's node for
//! `IN_CLOSE_WRITE` (as udev does) and listens to the kernel's uevents from the moment
//! it is taken, and when a write was closed on a disk udev watches, it is released
//! only once the "change" udev synthesises for the disk arrives (`SYNTH_UUID` set):
//! udev writes that change only after its own try at the lock failed, so it re-read
//! nothing. No write, or a disk udev does not watch: released at once. This waits for
//! exactly the event that matters (a fixed grace period was 50 ms on every change,
//! and too short under load); should the answer not come within [`ANSWER_WAIT`], or
//! the watch not be set up, the lock is released after the old grace period. Callers
//! make one write per lock (one GPT commit). Readers that must not see a table half
//! written (the inventory's check of what a disk holds) take it shared, as udev's own
//! probes do.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::DiskError;

/// How long the lock outlives the last write when udev's answer cannot be watched for.
const GRACE: Duration = Duration::from_millis(50);

/// How long a lock waits for udev's answer to a write before it is released anyway.
pub const ANSWER_WAIT: Duration = Duration::from_secs(2);

/// How long taking the lock may wait for another holder.
pub const WAIT: Duration = Duration::from_secs(10);

/// Holds `LOCK_EX` (or `LOCK_SH`) on a whole disk until dropped.
pub struct DiskLock {
    file: File,
    exclusive: bool,
    /// For an exclusive lock: the watch for udev's answer, `None` when it could not be
    /// set up (the old grace period applies).
    answer: Option<Answer>,
}

impl DiskLock {
    /// Locks `disk`, waiting up to [`WAIT`] for another holder (udev probes hold
    /// `LOCK_SH` briefly; a partitioning tool may hold `LOCK_EX`).
    pub fn exclusive(disk: &Path) -> Result<DiskLock, DiskError> {
        Self::take(disk, true)
    }

    /// Locks `disk` shared, waiting up to [`WAIT`] for a writer holding it exclusive;
    /// other readers do not wait for each other.
    pub fn shared(disk: &Path) -> Result<DiskLock, DiskError> {
        Self::take(disk, false)
    }

    fn take(disk: &Path, exclusive: bool) -> Result<DiskLock, DiskError> {
        let _t = super::timing::step("lock.take");
        let file = File::open(disk).map_err(DiskError::io(format!("open {} to lock it", disk.display())))?;
        let op = if exclusive { libc::LOCK_EX } else { libc::LOCK_SH };
        let t0 = std::time::Instant::now();
        loop {
            // SAFETY: flock on a descriptor this function owns; no memory is passed.
            let r = unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) };
            if r == 0 {
                let answer = if exclusive { Answer::watch(disk) } else { None };
                return Ok(DiskLock { file, exclusive, answer });
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => {}
                Some(libc::EWOULDBLOCK) if t0.elapsed() < WAIT => std::thread::sleep(Duration::from_millis(10)),
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
        if self.exclusive {
            let _t = super::timing::step("lock.grace");
            match self.answer.take() {
                Some(a) => a.wait(),
                None => std::thread::sleep(GRACE),
            }
        }
        // SAFETY: as above; unlocking a descriptor this guard owns.
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// What an exclusive lock needs to see udev answer a write: an inotify watch for
/// `IN_CLOSE_WRITE` on the disk's node and a socket on the kernel's uevents, both set
/// up when the lock is taken, before any write under it.
struct Answer {
    inotify: OwnedFd,
    uevents: OwnedFd,
    devnum: (u32, u32),
}

/// Takes ownership of a descriptor a libc call returned, `None` on failure.
fn owned(fd: libc::c_int) -> Option<OwnedFd> {
    // SAFETY: a non-negative descriptor just returned by the kernel is owned by no one else.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Answer {
    fn watch(disk: &Path) -> Option<Answer> {
        let devnum = super::block_devnum(disk)?;
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
        let want = format!("b{}:{}", self.devnum.0, self.devnum.1);
        let Ok(rd) = std::fs::read_dir("/run/udev/watch") else { return false };
        rd.filter_map(|e| e.ok()).any(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.as_os_str().as_bytes() == want.as_bytes()))
    }

    /// Whether a uevent is the change udev synthesises for this disk.
    fn is_answer(&self, msg: &[u8]) -> bool {
        let (maj, min) = (format!("MAJOR={}", self.devnum.0), format!("MINOR={}", self.devnum.1));
        let (mut change, mut synth, mut major, mut minor) = (false, false, false, false);
        for f in msg.split(|b| *b == 0).skip(1) {
            change |= f == b"ACTION=change";
            synth |= f.starts_with(b"SYNTH_UUID=");
            major |= f == maj.as_bytes();
            minor |= f == min.as_bytes();
        }
        change && synth && major && minor
    }

    /// Waits, if the disk was written and udev watches it, for udev's answer.
    fn wait(self) {
        if !self.written() || !self.udev_watches() {
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
            disk.devnum = %format!("{}:{}", self.devnum.0, self.devnum.1),
            waited_ms = ANSWER_WAIT.as_millis() as u64,
            "udev did not answer a partition table write in time; releasing the disk lock anyway"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_change_udev_synthesises_for_the_disk_is_its_answer() {
        // SAFETY: plain syscalls; any two descriptors do, the test reads neither.
        let (inotify, uevents) = unsafe { (libc::inotify_init1(libc::IN_CLOEXEC), libc::inotify_init1(libc::IN_CLOEXEC)) };
        let (inotify, uevents) = (owned(inotify).unwrap(), owned(uevents).unwrap());
        let a = Answer { inotify, uevents, devnum: (7, 3) };
        let msg = |fields: &str| -> Vec<u8> { format!("change@/devices/virtual/block/loop3;{fields}").replace(';', "\0").into_bytes() };
        assert!(a.is_answer(&msg("ACTION=change;SYNTH_UUID=0;MAJOR=7;MINOR=3;DEVTYPE=disk")));
        assert!(!a.is_answer(&msg("ACTION=change;MAJOR=7;MINOR=3;DEVTYPE=disk")), "a change of the kernel's own");
        assert!(!a.is_answer(&msg("ACTION=change;SYNTH_UUID=0;MAJOR=7;MINOR=30")), "another disk");
        assert!(!a.is_answer(&msg("ACTION=add;SYNTH_UUID=0;MAJOR=7;MINOR=3")), "not a change");
        assert!(!a.is_answer(&msg("ACTION=change;SYNTH_UUID=0;MAJOR=259;MINOR=3")), "another major");
    }
}
