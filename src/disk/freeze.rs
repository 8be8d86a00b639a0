//! Freezing a mounted filesystem for a consistent copy of the device under it.
//!
//! Rules:
//! - a freeze (`FIFREEZE` on the mount point) flushes the filesystem's dirty data and
//!   journal to the device and holds every writer until the thaw, so the device then
//!   reads as a clean, consistent filesystem;
//! - a freeze is bounded: a watchdog thaws the filesystem when the limit passes even if
//!   the copy is still running, and the copy is then reported expired (the caller
//!   discards it: a copy read past a thaw may be torn), so writers never stall longer
//!   than the limit;
//! - the thaw happens exactly once, on [`Frozen::thaw`], on drop, or by the watchdog;
//!   the stall (freeze to thaw) is measured and answered.

use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::DiskError;

mod sys {
    // FIFREEZE = _IOWR('X', 119, int), FITHAW = _IOWR('X', 120, int).
    nix::ioctl_readwrite!(fifreeze, b'X', 119, libc::c_int);
    nix::ioctl_readwrite!(fithaw, b'X', 120, libc::c_int);
}

/// The shared state of a freeze: whether it is thawed, and when.
struct State {
    thawed: Option<Instant>,
    /// The watchdog thawed it (the limit passed before the copy was done).
    expired: bool,
}

/// A frozen filesystem; thawed when dropped.
pub struct Frozen {
    path: PathBuf,
    dir: Arc<File>,
    began: Instant,
    state: Arc<(Mutex<State>, Condvar)>,
}

/// How a freeze ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thawed {
    /// How long writers were held.
    pub stall: Duration,
    /// The limit passed before the thaw was asked: the copy made meanwhile is not
    /// consistent.
    pub expired: bool,
}

fn thaw_fd(dir: &File) -> Result<(), nix::Error> {
    let mut arg: libc::c_int = 0;
    // SAFETY: the fd is open for the call; FITHAW ignores its argument, which lives on
    // this frame.
    unsafe { sys::fithaw(dir.as_raw_fd(), &mut arg) }.map(drop)
}

impl Frozen {
    /// Freezes the filesystem shown at `at` (a mount's root, opened beneath the allowed
    /// roots) for at most `limit`, only if it is the root of a mount of `device`
    /// (`major:minor`): a path whose mount is gone, or not yet there, shows the
    /// filesystem under it (the node's own), which is never frozen.
    pub fn freeze(at: &super::beneath::Node, limit: Duration, device: (u32, u32)) -> Result<Frozen, DiskError> {
        let path = at.shown();
        let st = at.stat()?;
        if !st.mount_root || st.dev != device {
            return Err(DiskError::invalid(format!(
                "{} is not a mount of the volume's device {}:{} (it shows {}:{}{}); nothing was frozen",
                path.display(),
                device.0,
                device.1,
                st.dev.0,
                st.dev.1,
                if st.mount_root { "" } else { ", not a mount's root" }
            )));
        }
        let dir = at.reopen_dir()?;
        let mut arg: libc::c_int = 0;
        // SAFETY: the fd is open for the call; FIFREEZE ignores its argument, which
        // lives on this frame.
        unsafe { sys::fifreeze(dir.as_raw_fd(), &mut arg) }
            .map_err(DiskError::errno(format!("freeze the filesystem at {} (FIFREEZE)", path.display())))?;
        let began = Instant::now();
        let dir = Arc::new(dir);
        let state = Arc::new((Mutex::new(State { thawed: None, expired: false }), Condvar::new()));
        let (d, s, p) = (dir.clone(), state.clone(), path.to_path_buf());
        std::thread::spawn(move || {
            let (lock, cv) = &*s;
            let mut st = lock.lock().unwrap_or_else(PoisonError::into_inner);
            while st.thawed.is_none() {
                let left = limit.saturating_sub(began.elapsed());
                if left.is_zero() {
                    if let Err(e) = thaw_fd(&d) {
                        tracing::error!(fs.path = %p.display(), error = %e, "cannot thaw a filesystem frozen past its limit");
                    }
                    st.thawed = Some(Instant::now());
                    st.expired = true;
                    tracing::warn!(fs.path = %p.display(), freeze.limit_millis = limit.as_millis() as u64, "thawed a filesystem at its freeze limit; the copy made meanwhile is discarded");
                    break;
                }
                st = cv.wait_timeout(st, left).unwrap_or_else(PoisonError::into_inner).0;
            }
        });
        Ok(Frozen { path: path.to_path_buf(), dir, began, state })
    }

    /// Thaws the filesystem (unless the watchdog did) and says how the freeze went.
    pub fn thaw(self) -> Result<Thawed, DiskError> {
        self.end()
    }

    fn end(&self) -> Result<Thawed, DiskError> {
        let (lock, cv) = &*self.state;
        let mut st = lock.lock().unwrap_or_else(PoisonError::into_inner);
        let res = if st.thawed.is_none() {
            let r = thaw_fd(&self.dir).map_err(DiskError::errno(format!("thaw the filesystem at {} (FITHAW)", self.path.display())));
            st.thawed = Some(Instant::now());
            cv.notify_all();
            r
        } else {
            Ok(())
        };
        let stall = st.thawed.map(|t| t.duration_since(self.began)).unwrap_or_default();
        res.map(|()| Thawed { stall, expired: st.expired })
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if let Err(e) = self.end() {
            tracing::error!(fs.path = %self.path.display(), error = %e, "cannot thaw a frozen filesystem");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_that_is_not_a_mount_of_the_device_is_never_frozen() {
        let dir = tempfile::tempdir().unwrap();
        let stage = dir.path().join("stage");
        std::fs::create_dir(&stage).unwrap();
        let at = super::super::beneath::open(&stage, &[dir.path().to_path_buf()]).unwrap().expect("the directory exists");
        let st = at.stat().unwrap();
        // A plain directory: the filesystem under it is the node's own. (The limit is
        // tiny, so even a wrong freeze would be thawed at once.)
        let e = Frozen::freeze(&at, Duration::from_millis(10), st.dev).err().expect("refused: not a mount's root");
        assert!(e.to_string().contains("not a mount's root") && e.to_string().contains("nothing was frozen"), "{e}");
        let e = Frozen::freeze(&at, Duration::from_millis(10), (7, 12345)).err().expect("refused: another device");
        assert!(e.to_string().contains("is not a mount of the volume's device 7:12345"), "{e}");
    }
}
