//! A freeze that always ends: the agent killed in the middle of a freeze (a clone and a
//! frozen snapshot of a volume in use, ext4 and xfs), on real loop drives.
//!
//! - killed with its filesystem frozen (crash point `freeze.frozen`, right after
//!   `FIFREEZE`): a writer on the source resumes at once, with no agent running (the
//!   freeze's watchdog process sees the agent go and thaws); the restarted agent makes
//!   the copy when asked again, and nothing is left in the freeze journal;
//! - killed before the freeze (`freeze.recorded`, the journal entry written): nothing was
//!   frozen, the restart empties the journal, the copy is made when asked again;
//! - the agent and its watchdog both killed with the filesystem frozen (what a whole
//!   container's death would do without its guardian): the writer stays held until the
//!   agent starts again, which thaws it from the journal before anything else.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::clone::Bed;
use crate::common::*;
use drivelet::grpc::proto::csi;

/// The crash points of a freeze (`src/disk/freeze.rs`).
pub(crate) const FREEZE_POINTS: &[&str] = &["freeze.recorded", "freeze.frozen"];

/// A thread appending a line and syncing it, as fast as it can; counts its writes.
struct Writer {
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
    _thread: std::thread::JoinHandle<()>,
}

impl Writer {
    fn start(path: PathBuf) -> Writer {
        let (stop, written) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let (s, w) = (stop.clone(), written.clone());
        let thread = std::thread::spawn(move || {
            let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path).unwrap();
            let mut n = 0u64;
            while !s.load(Ordering::Relaxed) {
                f.write_all(format!("{n}\n").as_bytes()).unwrap();
                f.sync_data().unwrap();
                n += 1;
                w.store(n, Ordering::Relaxed);
            }
        });
        Writer { stop, written, _thread: thread }
    }

    fn count(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// How long until it writes again (`None`: not within `within`).
    fn resumes_within(&self, within: Duration) -> Option<Duration> {
        let (from, t) = (self.count(), Instant::now());
        while t.elapsed() < within {
            if self.count() > from + 1 {
                return Some(t.elapsed());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Thaws `path` on drop whatever happened, so a failing test never leaves the machine
/// with a frozen filesystem (and its writer thread) behind.
struct ThawOnDrop(PathBuf);

impl Drop for ThawOnDrop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("fsfreeze").arg("-u").arg(&self.0).output();
    }
}

fn journal(bed: &Bed) -> Vec<PathBuf> {
    let dir = bed.tmp.path().join("state/freezes");
    std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default()
}

fn snapshot(bed: &Bed, q: csi::CreateSnapshotRequest) -> Result<csi::Snapshot, tonic::Status> {
    rt().block_on(async {
        let mut c = Csi::connect(&bed.agent).await;
        c.ctrl.create_snapshot(q).await.map(|r| r.into_inner().snapshot.expect("snapshot"))
    })
}

/// The copy asked of `src`: a clone, or a frozen snapshot.
fn copy(bed: &Bed, kind: &str, fs: &str, src: &str) -> Result<String, tonic::Status> {
    match kind {
        "clone" => bed.create(clone_req(&format!("pvc-copy-{fs}"), 64 * MIB, 0, mount_cap(fs), src)).map(|v| v.volume_id),
        _ => snapshot(bed, snapshot_req(&format!("snap-{fs}"), src, &[("drivelet.io/freeze", "true")])).map(|s| s.snapshot_id),
    }
}

/// The pids of the freeze watchdogs whose parent is `agent`.
fn watchdogs_of(agent: u32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            cmd.windows(12).any(|w| w == b"freeze-watch") && status.lines().any(|l| l.strip_prefix("PPid:").is_some_and(|p| p.trim() == agent.to_string()))
        })
        .collect()
}

fn source(bed: &Bed, fs: &str, size: u64) -> (String, PathBuf) {
    let src = bed.create(create_req(&format!("pvc-frozen-{fs}"), size, mount_cap(fs))).expect("the source").volume_id;
    let st = bed.stage(&src, &format!("stage-{fs}"), mount_cap(fs));
    (src, st)
}

fn killed_while_frozen(fs: &str, size: u64) {
    let mut bed = Bed::new(2 * GIB);
    let (src, st) = source(&bed, fs, size);
    let _thaw = ThawOnDrop(st.clone());
    let writer = Writer::start(st.join("seq"));
    for kind in ["clone", "snapshot"] {
        assert!(writer.resumes_within(Duration::from_secs(5)).is_some(), "{fs} {kind}: the writer writes");
        bed.agent.arm("freeze.frozen", "return");
        assert!(copy(&bed, kind, fs, &src).is_err(), "{fs} {kind}: the agent dies frozen");
        assert!(bed.agent.wait_exit(Duration::from_secs(10)).is_some(), "{fs} {kind}: killed at freeze.frozen");
        // No agent runs: the watchdog alone ends the freeze, at once (not at the limit).
        let resumed = writer.resumes_within(Duration::from_secs(3));
        assert!(resumed.is_some(), "{fs} {kind}: the writer is still held 3 s after the agent died; log:\n{}", bed.agent.log_tail(20));
        println!("{fs} {kind}: agent killed frozen; the writer resumed {:?} after its death", resumed.unwrap_or_default());
        assert!(bed.agent.logs().contains("thawed the filesystem its agent left frozen"), "{fs} {kind}: the watchdog says what it did");
        bed.agent.spawn();
        assert!(journal(&bed).is_empty(), "{fs} {kind}: the journal is emptied at start: {:?}", journal(&bed));
        copy(&bed, kind, fs, &src).unwrap_or_else(|e| panic!("{fs} {kind}: asked again: {e:?}"));
        assert!(journal(&bed).is_empty(), "{fs} {kind}: a freeze that ended leaves no journal entry");
        assert!(writer.resumes_within(Duration::from_secs(5)).is_some(), "{fs} {kind}: the writer writes after the copy");
    }
}

#[test]
fn an_ext4_freeze_ends_at_once_when_its_agent_is_killed_and_the_copy_is_made_when_asked_again() {
    killed_while_frozen("ext4", 64 * MIB);
}

#[test]
fn an_xfs_freeze_ends_at_once_when_its_agent_is_killed_and_the_copy_is_made_when_asked_again() {
    killed_while_frozen("xfs", 320 * MIB);
}

#[test]
fn a_freeze_left_by_a_dead_agent_and_a_dead_watchdog_is_thawed_by_the_next_start_and_one_killed_before_it_freezes_nothing() {
    let mut bed = Bed::new(2 * GIB);
    let (src, st) = source(&bed, "ext4", 64 * MIB);
    let _thaw = ThawOnDrop(st.clone());
    let writer = Writer::start(st.join("seq"));

    // Killed after the journal entry, before FIFREEZE: nothing frozen, entry removed.
    bed.agent.arm("freeze.recorded", "return");
    assert!(copy(&bed, "clone", "ext4", &src).is_err());
    assert!(bed.agent.wait_exit(Duration::from_secs(10)).is_some(), "killed at freeze.recorded");
    assert_eq!(journal(&bed).len(), 1, "the freeze was recorded before anything was frozen");
    assert!(writer.resumes_within(Duration::from_secs(3)).is_some(), "nothing is frozen");
    bed.agent.spawn();
    assert!(journal(&bed).is_empty(), "the restart empties the journal");

    // Held frozen (the agent paused right after FIFREEZE), its watchdog killed, then the
    // agent: nothing runs that could thaw it, until the agent starts again.
    bed.agent.arm("freeze.frozen", "sleep(3000)");
    let pid = bed.agent.child.as_ref().expect("running").id();
    let asked = {
        let sock = bed.agent.csi_socket.clone();
        let src = src.clone();
        std::thread::spawn(move || {
            rt().block_on(async {
                let Ok(ch) = channel(&sock).await else { return };
                let q = clone_req("pvc-held", 64 * MIB, 0, mount_cap("ext4"), &src);
                let _ = csi::controller_client::ControllerClient::new(ch).create_volume(q).await;
            })
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let dogs = loop {
        let d = watchdogs_of(pid);
        if !d.is_empty() && !journal(&bed).is_empty() {
            break d;
        }
        assert!(Instant::now() < deadline, "no freeze watchdog of agent {pid} within 5 s");
        std::thread::sleep(Duration::from_millis(10));
    };
    // Frozen now (the writer stops), the watchdog killed first, then the agent.
    std::thread::sleep(Duration::from_millis(300));
    for d in dogs {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(d), nix::sys::signal::Signal::SIGKILL);
    }
    bed.agent.kill();
    let _ = asked.join();
    assert!(writer.resumes_within(Duration::from_secs(2)).is_none(), "the filesystem is frozen with nothing left to thaw it");
    let t = Instant::now();
    bed.agent.spawn_with(&[]);
    let resumed = writer.resumes_within(Duration::from_secs(10));
    assert!(resumed.is_some(), "the restarted agent did not thaw what the earlier run left frozen; log:\n{}", bed.agent.log_tail(20));
    println!("the restart thawed the freeze an earlier run left: the writer resumed {:?} after the start", t.elapsed());
    bed.agent.wait_ready();
    assert!(bed.agent.logs().contains("which an earlier run left frozen"), "the start says what it thawed");
    assert!(journal(&bed).is_empty());
    copy(&bed, "clone", "ext4", &src).expect("asked again");
}

/// Replaces `bed`'s agent by one started as PID 1 of a new PID namespace (as in a
/// container): `unshare --pid --fork` (the mount namespace is the host's, so its mounts
/// are the test's). Returns the guardian's pid as this test sees it.
fn start_as_pid_1(bed: &mut Bed) -> u32 {
    if bed.agent.child.is_some() {
        bed.agent.stop();
    }
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&bed.agent.log).unwrap();
    let child = std::process::Command::new("unshare")
        .args(["--pid", "--fork", bin(), "run", "--config", bed.agent.config.to_str().unwrap()])
        .env_remove("RUST_LOG")
        .env_remove("FAILPOINTS")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("unshare (util-linux) starts drivelet in a PID namespace of its own");
    let unshare = child.id();
    bed.agent.child = Some(child);
    bed.agent.wait_ready();
    let children = |parent: u32| -> Vec<u32> {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
            .filter(|pid| {
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                status.lines().any(|l| l.strip_prefix("PPid:").is_some_and(|p| p.trim() == parent.to_string()))
            })
            .collect()
    };
    let guardian = *children(unshare).first().expect("drivelet under unshare");
    let agents = children(guardian);
    assert_eq!(agents.len(), 1, "as PID 1, drivelet runs the agent as its one child: {agents:?}");
    let cmdline = |pid: u32| std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    assert_eq!(cmdline(agents[0]), cmdline(guardian), "the agent runs with PID 1's very command line");
    guardian
}

#[test]
fn as_pid_1_drivelet_keeps_its_agent_as_a_child_so_a_freeze_ends_when_the_agent_dies_and_it_exits_as_the_agent_did() {
    let mut bed = Bed::new(2 * GIB);
    let (src, st) = source(&bed, "ext4", 64 * MIB);
    let _thaw = ThawOnDrop(st.clone());
    let writer = Writer::start(st.join("seq"));
    start_as_pid_1(&mut bed);

    // The agent killed frozen: PID 1 stays until the watchdog thawed, then exits as the
    // agent did (128 + SIGKILL), as a container's main process would.
    bed.agent.arm("freeze.frozen", "return");
    assert!(copy(&bed, "clone", "ext4", &src).is_err(), "the agent dies frozen");
    let resumed = writer.resumes_within(Duration::from_secs(3));
    assert!(resumed.is_some(), "the writer is still held 3 s after the agent died under PID 1; log:\n{}", bed.agent.log_tail(20));
    let status = bed.agent.wait_exit(Duration::from_secs(15)).expect("PID 1 exits once the agent is gone");
    assert_eq!(status.code(), Some(128 + 9), "PID 1 exits as its agent did (killed): {status}");

    // SIGTERM to PID 1 reaches the agent, which stops cleanly: exit 0.
    let guardian = start_as_pid_1(&mut bed);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(guardian as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = bed.agent.wait_exit(Duration::from_secs(20)).expect("PID 1 ends after SIGTERM");
    assert_eq!(status.code(), Some(0), "the agent stopped cleanly on the forwarded SIGTERM: {status}; log:\n{}", bed.agent.log_tail(20));
    bed.agent.spawn();
    assert!(journal(&bed).is_empty());
}
