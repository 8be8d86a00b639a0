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
//! write); it is held for a short grace period after the last write so udev sees the
//! close while the lock is still held; dropping the guard releases it. Readers that
//! must not see a table half written (the inventory's check of what a disk holds) take
//! it shared, as udev's own probes do.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use super::DiskError;

/// How long the lock outlives the last write, so udev handles the close under it.
const GRACE: Duration = Duration::from_millis(50);

/// How long taking the lock may wait for another holder.
pub const WAIT: Duration = Duration::from_secs(10);

/// Holds `LOCK_EX` (or `LOCK_SH`) on a whole disk until dropped.
pub struct DiskLock {
    file: File,
    exclusive: bool,
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
                return Ok(DiskLock { file, exclusive });
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
            std::thread::sleep(GRACE);
        }
        // SAFETY: as above; unlocking a descriptor this guard owns.
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
    }
}
