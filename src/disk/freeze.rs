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
//! - the bound holds when drivelet dies: before the freeze a watchdog process of its own
//!   ([`watch`], `drivelet freeze-watch`) is started holding a descriptor of the same
//!   mount, and is told when the filesystem is frozen and when it is thawed. When
//!   drivelet goes away without saying it thawed (kill -9, an OOM kill, an abort), the
//!   watchdog sees its pipe close and thaws at once; if drivelet lives but hangs, the
//!   watchdog thaws at the limit plus [`MARGIN`] (after drivelet's own watchdog thread,
//!   so an expiry is always reported). In a container drivelet is not PID 1 (see
//!   `drivelet::guardian`), so the watchdog outlives drivelet there too;
//! - every freeze is recorded in the freeze journal (`<state dir>/freezes`, one file a
//!   mount, [`Record`]) before `FIFREEZE` and removed after the thaw: a restarted drivelet
//!   thaws whatever a freeze of its own left frozen ([`thaw_left`], through a descriptor
//!   of the staged mount opened beneath the allowed roots, only when it is still a mount
//!   of the recorded device), so even the watchdog's death leaves no frozen filesystem
//!   past the next start;
//! - the thaw happens exactly once, on [`Frozen::thaw`], on drop, or by the watchdog;
//!   the stall (freeze to thaw) is measured and answered.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::DiskError;

mod sys {
    // FIFREEZE = _IOWR('X', 119, int), FITHAW = _IOWR('X', 120, int).
    nix::ioctl_readwrite!(fifreeze, b'X', 119, libc::c_int);
    nix::ioctl_readwrite!(fithaw, b'X', 120, libc::c_int);
}

/// How long after the limit the watchdog process thaws a filesystem whose drivelet
/// lives but has not thawed it (its own watchdog thread thaws at the limit).
pub const MARGIN: Duration = Duration::from_millis(250);

/// Longest journal record read back (a path of at most 4096 bytes and two short lines).
pub const MAX_RECORD: usize = 8192;

/// What the agent tells its watchdog process (one byte each on its stdin).
const FROZEN: u8 = b'F';
const THAWED: u8 = b'T';
/// What the watchdog answers once it holds the mount (one byte on its stdout).
const WATCHING: u8 = b'W';

/// The shared state of a freeze: whether it is thawed, and when.
struct State {
    thawed: Option<Instant>,
    /// The watchdog thawed it (the limit passed before the copy was done).
    expired: bool,
}

/// Where freezes are recorded and how their watchdog is started: the freeze journal
/// (a directory of the state dir) and the program that is `drivelet freeze-watch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Journal {
    /// The journal directory.
    pub dir: PathBuf,
    /// The drivelet binary (`/proc/self/exe` in the agent).
    pub program: PathBuf,
}

impl Journal {
    /// The journal under `state_dir`, watched by this very binary.
    pub fn under(state_dir: &Path) -> Journal {
        Journal { dir: state_dir.join("freezes"), program: PathBuf::from("/proc/self/exe") }
    }

    fn entry(&self, device: (u32, u32)) -> PathBuf {
        self.dir.join(format!("{}-{}", device.0, device.1))
    }
}

/// One freeze as the journal keeps it: the mount frozen, and its device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The staging path frozen (opened again beneath the allowed roots to thaw).
    pub path: PathBuf,
    /// The device (`major:minor`) mounted there when it was frozen.
    pub device: (u32, u32),
}

impl Record {
    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        format!("drivelet freeze 1\ndevice {}:{}\npath {}\n", self.device.0, self.device.1, self.path.display()).into_bytes()
    }

    /// A record read back (bounded, strict: anything else is refused in words).
    pub fn decode(bytes: &[u8]) -> Result<Record, String> {
        if bytes.len() > MAX_RECORD {
            return Err(format!("{} bytes, more than a freeze record holds ({MAX_RECORD})", bytes.len()));
        }
        let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_string())?;
        let mut lines = text.strip_suffix('\n').ok_or("not ended by a newline")?.split('\n');
        if lines.next() != Some("drivelet freeze 1") {
            return Err("not a freeze record of this version".into());
        }
        let device = lines.next().and_then(|l| l.strip_prefix("device ")).ok_or("no device line")?;
        let (major, minor) = device.split_once(':').ok_or("a device is major:minor")?;
        let device = (major.parse::<u32>().map_err(|_| "a bad major number")?, minor.parse::<u32>().map_err(|_| "a bad minor number")?);
        let path = lines.next().and_then(|l| l.strip_prefix("path ")).ok_or("no path line")?;
        if !path.starts_with('/') || path.len() > super::beneath::MAX_PATH || path.contains('\0') {
            return Err("the path is not an absolute path of at most 4096 bytes".into());
        }
        if lines.next().is_some() {
            return Err("more lines than a freeze record has".into());
        }
        Ok(Record { path: PathBuf::from(path), device })
    }
}

/// Writes `bytes` to `path` whole or not at all (a temporary file, synced, renamed, the
/// directory synced).
fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    File::open(dir)?.sync_all()
}

fn remove_durably(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {
            if let Some(dir) = path.parent() {
                let _ = File::open(dir).and_then(|d| d.sync_all());
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(path = %path.display(), error = %e, "cannot remove a freeze journal entry; the next start looks at it again"),
    }
}

/// The watchdog process of one freeze.
struct Watchdog {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Watchdog {
    /// Starts `drivelet freeze-watch` on `dir` and waits until it holds it.
    fn start(program: &Path, dir: &File, limit: Duration) -> Result<Watchdog, DiskError> {
        use std::os::unix::process::CommandExt;
        let fd = dir.as_raw_fd();
        let mut cmd = Command::new(program);
        cmd.args(["freeze-watch", "--fd", &fd.to_string(), "--limit-ms", &limit.as_millis().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // SAFETY: between fork and exec only fcntl runs (async-signal-safe): the mount's
        // descriptor is kept open across the exec, every other one closes as opened.
        unsafe {
            cmd.pre_exec(move || {
                if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let what = || "start the freeze watchdog (drivelet freeze-watch)".to_string();
        let mut child = cmd.spawn().map_err(DiskError::io(what()))?;
        let mut ready = [0u8; 1];
        let answered = child.stdout.take().map(|mut out| out.read(&mut ready));
        if !matches!(answered, Some(Ok(1))) || ready[0] != WATCHING {
            let _ = child.kill();
            let _ = child.wait();
            return Err(DiskError::invalid(format!("{} failed: it did not answer; nothing was frozen", what())));
        }
        let stdin = child.stdin.take();
        Ok(Watchdog { child, stdin })
    }

    fn tell(&mut self, what: u8) {
        if let Some(s) = self.stdin.as_mut() {
            if let Err(e) = s.write_all(&[what]) {
                tracing::warn!(error = %e, "cannot reach the freeze watchdog");
            }
        }
    }

    /// Tells it the filesystem is thawed and waits for it to end.
    fn done(mut self) {
        self.tell(THAWED);
        self.stdin = None;
        if let Err(e) = self.child.wait() {
            tracing::warn!(error = %e, "cannot reap the freeze watchdog");
        }
    }
}

/// A frozen filesystem; thawed when dropped.
pub struct Frozen {
    path: PathBuf,
    dir: Arc<File>,
    began: Instant,
    state: Arc<(Mutex<State>, Condvar)>,
    watchdog: Mutex<Option<Watchdog>>,
    entry: PathBuf,
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
    pub fn freeze(at: &super::beneath::Node, limit: Duration, device: (u32, u32), journal: &Journal) -> Result<Frozen, DiskError> {
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
        // The watchdog first, then the journal entry, then the freeze: whatever dies
        // after FIFREEZE, something that will thaw it exists already.
        let mut watchdog = Watchdog::start(&journal.program, &dir, limit)?;
        let entry = journal.entry(device);
        let record = Record { path: path.to_path_buf(), device };
        if let Err(e) = write_durably(&entry, &record.encode()) {
            watchdog.done();
            return Err(DiskError::io(format!("record the freeze of {} in {}", path.display(), entry.display()))(e));
        }
        crate::failpoint::crash_point!("freeze.recorded");
        let mut arg: libc::c_int = 0;
        // SAFETY: the fd is open for the call; FIFREEZE ignores its argument, which
        // lives on this frame.
        if let Err(e) = unsafe { sys::fifreeze(dir.as_raw_fd(), &mut arg) } {
            watchdog.done();
            remove_durably(&entry);
            return Err(DiskError::errno(format!("freeze the filesystem at {} (FIFREEZE)", path.display()))(e));
        }
        let began = Instant::now();
        watchdog.tell(FROZEN);
        crate::failpoint::crash_point!("freeze.frozen");
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
        Ok(Frozen { path: path.to_path_buf(), dir, began, state, watchdog: Mutex::new(Some(watchdog)), entry })
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
        let expired = st.expired;
        drop(st);
        if res.is_ok() {
            // Thawed: the watchdog is told and reaped, then the journal entry goes.
            if let Some(w) = self.watchdog.lock().unwrap_or_else(PoisonError::into_inner).take() {
                w.done();
            }
            remove_durably(&self.entry);
        }
        res.map(|()| Thawed { stall, expired })
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if let Err(e) = self.end() {
            tracing::error!(fs.path = %self.path.display(), error = %e, "cannot thaw a frozen filesystem");
        }
    }
}

/// `drivelet freeze-watch`: the watchdog process of one freeze (see the rules). `fd` is
/// the frozen mount's descriptor, inherited; `limit` the freeze's bound. Answers
/// [`WATCHING`] on stdout, then reads stdin: [`FROZEN`] starts the clock, [`THAWED`]
/// ends it without a thaw; the pipe closing without [`THAWED`] (the agent died) thaws at
/// once, and the limit plus [`MARGIN`] after [`FROZEN`] thaws too. Returns the exit code.
pub fn watch(fd: std::os::unix::io::RawFd, limit: Duration) -> i32 {
    use std::os::fd::{BorrowedFd, FromRawFd};
    // SAFETY: the agent handed this descriptor over open (its number on the command
    // line); nothing else in this process owns it.
    let dir = unsafe { File::from_raw_fd(fd) };
    if std::io::stdout().write_all(&[WATCHING]).and_then(|()| std::io::stdout().flush()).is_err() {
        return 1;
    }
    let mut deadline: Option<Instant> = None;
    let thaw = |why: &str| {
        match thaw_fd(&dir) {
            Ok(()) => eprintln!("drivelet freeze-watch: thawed the filesystem {why}"),
            // EINVAL: it is not frozen (thawed already).
            Err(nix::errno::Errno::EINVAL) => {}
            Err(e) => eprintln!("drivelet freeze-watch: cannot thaw the filesystem {why}: {e}"),
        }
    };
    loop {
        let timeout: libc::c_int = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    thaw("at its freeze limit: the agent did not thaw it in time");
                    return 0;
                }
                left.as_millis().min(i32::MAX as u128 - 1) as libc::c_int + 1
            }
        };
        let mut fds = [libc::pollfd { fd: 0, events: libc::POLLIN, revents: 0 }];
        // SAFETY: one pollfd on this frame, for stdin, which stays open.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 1, timeout) };
        if rc == 0 {
            continue;
        }
        if rc < 0 {
            if nix::errno::Errno::last() == nix::errno::Errno::EINTR {
                continue;
            }
            thaw("as its agent cannot be watched");
            return 1;
        }
        // SAFETY: stdin stays open for the life of this process.
        let stdin = unsafe { BorrowedFd::borrow_raw(0) };
        let mut b = [0u8; 1];
        match nix::unistd::read(stdin, &mut b) {
            Ok(1) if b[0] == FROZEN => deadline = Some(Instant::now() + limit + MARGIN),
            Ok(1) if b[0] == THAWED => return 0,
            Ok(1) => {}
            Err(nix::errno::Errno::EINTR) => {}
            // The pipe closed without a thaw: the agent is gone.
            _ => {
                thaw("its agent left frozen (the agent ended without thawing it)");
                return 0;
            }
        }
    }
}

/// At start: thaws every filesystem a freeze of an earlier run left frozen, from the
/// journal (see the rules), and empties it. Says what it did, one line a record.
pub fn thaw_left(journal: &Journal, roots: &[PathBuf]) -> Vec<String> {
    let mut said = Vec::new();
    let Ok(entries) = std::fs::read_dir(&journal.dir) else { return said };
    for e in entries.flatten() {
        let entry = e.path();
        if entry.extension().is_some_and(|x| x == "tmp") {
            remove_durably(&entry);
            continue;
        }
        let mut bytes = Vec::new();
        let read = File::open(&entry).and_then(|f| f.take(MAX_RECORD as u64 + 1).read_to_end(&mut bytes));
        let record = match read.map_err(|e| e.to_string()).and_then(|_| Record::decode(&bytes)) {
            Ok(r) => r,
            Err(why) => {
                said.push(format!("freeze journal entry {} is unreadable ({why}); removed, nothing thawed", entry.display()));
                remove_durably(&entry);
                continue;
            }
        };
        said.push(thaw_recorded(&record, roots));
        remove_durably(&entry);
    }
    said
}

fn thaw_recorded(r: &Record, roots: &[PathBuf]) -> String {
    let shown = r.path.display();
    let node = match super::beneath::open(&r.path, roots) {
        Ok(Some(n)) => n,
        Ok(None) => return format!("{shown}, frozen by an earlier run, is gone: nothing to thaw"),
        Err(e) => return format!("{shown}, frozen by an earlier run, cannot be opened: {e}; nothing thawed"),
    };
    match node.stat() {
        Ok(st) if st.mount_root && st.dev == r.device => {}
        Ok(_) => return format!("{shown} is no longer a mount of device {}:{}: nothing thawed", r.device.0, r.device.1),
        Err(e) => return format!("{shown}: {e}; nothing thawed"),
    }
    match node.reopen_dir().map_err(|e| e.to_string()).and_then(|d| thaw_fd(&d).map_err(|e| e.to_string())) {
        Ok(()) => format!("thawed the filesystem at {shown}, which an earlier run left frozen"),
        Err(e) if e.contains("EINVAL") || e.contains("Invalid argument") => format!("{shown}, frozen by an earlier run, was thawed already"),
        Err(e) => format!("cannot thaw {shown}, which an earlier run left frozen: {e}"),
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
        let journal = Journal { dir: dir.path().join("freezes"), program: "/nonexistent".into() };
        let e = Frozen::freeze(&at, Duration::from_millis(10), st.dev, &journal).err().expect("refused: not a mount's root");
        assert!(e.to_string().contains("not a mount's root") && e.to_string().contains("nothing was frozen"), "{e}");
        let e = Frozen::freeze(&at, Duration::from_millis(10), (7, 12345), &journal).err().expect("refused: another device");
        assert!(e.to_string().contains("is not a mount of the volume's device 7:12345"), "{e}");
    }

    #[test]
    fn a_journal_record_reads_back_as_written_and_nothing_else_is_taken_for_one() {
        let r = Record { path: "/var/lib/kubelet/plugins/kubernetes.io/csi/x/globalmount".into(), device: (259, 3) };
        assert_eq!(Record::decode(&r.encode()), Ok(r.clone()));
        let bad: [&[u8]; 8] = [
            b"",
            b"drivelet freeze 2\ndevice 1:2\npath /a\n",
            b"drivelet freeze 1\ndevice 1-2\npath /a\n",
            b"drivelet freeze 1\ndevice 1:2\npath a\n",
            b"drivelet freeze 1\ndevice 1:2\npath /a",
            b"drivelet freeze 1\ndevice 1:2\npath /a\nmore\n",
            b"drivelet freeze 1\ndevice 99999999999:2\npath /a\n",
            b"\xff\xfe",
        ];
        for b in bad {
            assert!(Record::decode(b).is_err(), "{:?} taken for a record", String::from_utf8_lossy(b));
        }
        assert!(Record::decode(&vec![b'a'; MAX_RECORD + 1]).unwrap_err().contains("more than"));
    }

    #[test]
    fn the_journal_is_emptied_at_start_and_a_path_no_longer_mounted_is_not_thawed() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal { dir: dir.path().join("freezes"), program: "/nonexistent".into() };
        let stage = dir.path().join("stage");
        std::fs::create_dir(&stage).unwrap();
        write_durably(&journal.entry((7, 1)), &Record { path: stage.clone(), device: (7, 1) }.encode()).unwrap();
        write_durably(&journal.dir.join("junk"), b"not a record").unwrap();
        let said = thaw_left(&journal, &[dir.path().to_path_buf()]);
        assert_eq!(said.len(), 2, "{said:?}");
        assert!(said.iter().any(|l| l.contains("no longer a mount of device 7:1") && l.contains("nothing thawed")), "{said:?}");
        assert!(said.iter().any(|l| l.contains("unreadable")), "{said:?}");
        assert_eq!(std::fs::read_dir(&journal.dir).unwrap().count(), 0, "the journal is emptied");
    }
}
