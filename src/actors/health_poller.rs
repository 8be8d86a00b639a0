//! HealthPoller: owns the probing schedule. It reads each managed drive's SMART data
//! and checks each volume, and reports what it found; it never changes state itself.
//!
//! Rules:
//! - SMART: every `health.interval` (spread by `health.jitter_percent`), `smartctl
//!   --json -a` on each managed drive, at most `health.concurrency` at once, each bounded
//!   by `health.command_timeout`; the verdict goes to the drive inventory. A drive
//!   without SMART (loop, virtual, RAID volume) is UNKNOWN, never BAD.
//! - Volumes: every `health.volume_check_interval`, for each staged volume: staging
//!   path still mounted, readable, usage under the threshold; each published target
//!   still mounted. Each path is opened once beneath the allowed roots, following no
//!   symlink ([`crate::disk::beneath`]), and must be the root of a mount of the volume's
//!   own device (statx on that descriptor); it is then read (`getdents`) and measured
//!   (`fstatvfs`) through that descriptor only, never by its name again. A path refused
//!   (a symlink swapped in) is reported as replaced, and nothing is read through it. An
//!   adopted volume's directory (the admin's) is opened once, the same way, its last
//!   component not followed. For a formatted filesystem that is mounted nowhere: a read-only fsck,
//!   `health.fsck_runs` times, corruption reported only when every run agrees; it is
//!   re-run only after the volume was mounted again, or after [`FSCK_EVERY`].
//! - Probing and judging are apart: the cycle probes the host (opens, reads,
//!   fstatvfs, mountinfo, fsck) into a [`Seen`] per volume and the pure [`judge`] turns that into
//!   findings; the pure [`to_check`], [`staged_filesystem`] and [`fsck_candidate`]
//!   decide what is probed. All four are table-tested.
//! - Findings go to the volume manager, which turns them into conditions.
//! - Slow work runs off the actor thread; a cycle still running skips the next tick;
//!   volume checks (and their fsck runs) go one at a time on one blocking thread;
//! - tests make the poller fail at the start of a volume check cycle (fail point
//!   `actor.health.stop`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use super::inventory::model::{Drive, DriveHealth};
use super::inventory::DriveInventory;
use super::messages::{DriveHealthObserved, ListDrives};
use super::volumes::conditions::Finding;
use super::volumes::model::{VolumeRecord, VolumeState};
use super::volumes::book::claim::Check;
use super::volumes::{Guards, ListVolumes, VolumeChecked, VolumeManager};
use crate::config::HealthConfig;
use crate::disk::fs::Fsck;
use crate::disk::smart;
use crate::disk::beneath::{self, Node, PathError};
use crate::disk::{blkpg, fs, mounts};
use crate::words::{DriveClass, Health};

/// An unmounted filesystem found clean is checked again after this long.
pub(crate) const FSCK_EVERY: Duration = Duration::from_secs(6 * 3600);

/// The health poller actor.
pub(crate) struct HealthPoller {
    cfg: HealthConfig,
    inventory: Addr<DriveInventory>,
    volumes: Addr<VolumeManager>,
    limit: Arc<Semaphore>,
    smart_running: bool,
    volumes_running: bool,
    /// When each unmounted volume was last fsck'd, and the verdict.
    fscked: HashMap<String, (Instant, Option<Finding>)>,
    /// The volume book's guards: a check runs only while no call or step holds the volume.
    guards: Arc<Guards>,
    /// The allowed roots (`volumes.allowed_roots`) staging and target paths are opened
    /// beneath.
    roots: Arc<[PathBuf]>,
}

impl HealthPoller {
    /// A poller reporting to the inventory and the volume manager, checking volumes
    /// under the volume book's `guards`, their paths opened beneath `roots`.
    pub(crate) fn new(cfg: HealthConfig, roots: Vec<PathBuf>, inventory: Addr<DriveInventory>, volumes: Addr<VolumeManager>, guards: Arc<Guards>) -> HealthPoller {
        let limit = Arc::new(Semaphore::new(cfg.concurrency));
        HealthPoller { cfg, inventory, volumes, limit, smart_running: false, volumes_running: false, fscked: HashMap::new(), guards, roots: roots.into() }
    }

    fn jittered(&self, base: Duration) -> Duration {
        let spread = base.as_secs_f64() * f64::from(self.cfg.jitter_percent) / 100.0;
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let unit = f64::from(nanos % 1000) / 1000.0 * 2.0 - 1.0;
        Duration::from_secs_f64((base.as_secs_f64() + spread * unit).max(0.1))
    }

    fn schedule_smart(&mut self, ctx: &mut Context<Self>, after: Duration) {
        ctx.run_later(after, |act, ctx| {
            act.smart_cycle(ctx);
            let next = act.jittered(act.cfg.interval);
            act.schedule_smart(ctx, next);
        });
    }

    fn smart_cycle(&mut self, ctx: &mut Context<Self>) {
        if self.smart_running {
            return;
        }
        self.smart_running = true;
        let inv = self.inventory.clone();
        let cfg = self.cfg.clone();
        let limit = self.limit.clone();
        ctx.spawn(
            async move {
                let start = Instant::now();
                let drives = inv.send(ListDrives).await.unwrap_or_default();
                let mut tasks = Vec::new();
                for d in drives.into_iter().filter(|d| d.class == DriveClass::Managed) {
                    let (cfg, limit, inv) = (cfg.clone(), limit.clone(), inv.clone());
                    tasks.push(tokio::spawn(async move {
                        let _permit = limit.acquire_owned().await;
                        let verdict = poll_drive(&cfg, &d).await;
                        inv.do_send(DriveHealthObserved { drive_id: d.id.clone(), health: verdict });
                    }));
                }
                for t in tasks {
                    let _ = t.await;
                }
                crate::metrics::metrics().record_health_poll(start.elapsed());
            }
            .into_actor(self)
            .map(|_, act, _| act.smart_running = false),
        );
    }

    fn volume_cycle(&mut self, ctx: &mut Context<Self>) {
        if crate::failpoint::injected_failure("actor.health.stop") {
            warn!(actor = "health", "failure injected: stopping at a volume check cycle");
            ctx.stop();
            return;
        }
        if self.volumes_running {
            return;
        }
        self.volumes_running = true;
        let (inv, vols, guards, roots) = (self.inventory.clone(), self.volumes.clone(), self.guards.clone(), self.roots.clone());
        let cfg = self.cfg.clone();
        let fscked = std::mem::take(&mut self.fscked);
        ctx.spawn(
            async move {
                let drives: HashMap<String, Drive> =
                    inv.send(ListDrives).await.unwrap_or_default().into_iter().map(|d| (d.id.clone(), d)).collect();
                let records = vols.send(ListVolumes).await.unwrap_or_default();
                let job = move || check_all(&cfg, &roots, &guards, &drives, records, fscked);
                match tokio::task::spawn_blocking(job).await {
                    Ok((results, fscked)) => {
                        for (volume_id, findings) in results {
                            vols.do_send(VolumeChecked { volume_id, findings });
                        }
                        fscked
                    }
                    Err(e) => {
                        warn!(actor = "health", error = %e, "volume checks failed");
                        HashMap::new()
                    }
                }
            }
            .into_actor(self)
            .map(|fscked, act, _| {
                act.fscked = fscked;
                act.volumes_running = false;
            }),
        );
    }
}

/// Runs smartctl on one drive and judges the output.
async fn poll_drive(cfg: &HealthConfig, d: &Drive) -> DriveHealth {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let run = tokio::process::Command::new(&cfg.smartctl)
        .arg("--json")
        .arg("-a")
        .arg(&d.path)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let (health, reason, smart) = match tokio::time::timeout(cfg.command_timeout, run).await {
        Err(_) => (
            Health::Unknown,
            format!(
                "no health data: smartctl did not answer within {} (health.command_timeout)",
                crate::config::human_duration(cfg.command_timeout)
            ),
            Default::default(),
        ),
        Ok(Err(e)) => {
            debug!(actor = "health", drive.id = %d.id, program = %cfg.smartctl.display(), error = %e, "smartctl could not be run");
            (Health::Unknown, cannot_run_words(&cfg.smartctl, &e), Default::default())
        }
        Ok(Ok(out)) => {
            let json = String::from_utf8_lossy(&out.stdout);
            let r = smart::assess_for(&json, out.status.code().unwrap_or(-1), &d.transport, &cfg.smart);
            if !r.tool_messages.is_empty() {
                debug!(actor = "health", drive.id = %d.id, drive.path = %d.path.display(), smartctl.messages = ?r.tool_messages, "what smartctl said");
            }
            (r.health, r.reason(), r.figures)
        }
    };
    debug!(actor = "health", drive.id = %d.id, drive.health = health.as_str(), drive.health_reason = %reason, "SMART polled");
    DriveHealth { health, reason, checked_unix: now, smart }
}

/// Why smartctl could not be started, in words (the OS error goes to the debug log).
pub(crate) fn cannot_run_words(program: &Path, e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => format!(
            "no health data: smartctl is not installed ({} not found): install smartmontools or set health.smartctl",
            program.display()
        ),
        std::io::ErrorKind::PermissionDenied => format!(
            "no health data: {} may not be run by the agent (permission denied): check the file's mode or set health.smartctl",
            program.display()
        ),
        _ => format!("no health data: {} could not be started: set health.smartctl to smartmontools' smartctl", program.display()),
    }
}

/// The kernel partition of a volume on its drive: device node and number.
fn partition_of(drive: &Drive, rec: &VolumeRecord) -> Option<(PathBuf, (u32, u32))> {
    blkpg::kernel_partitions(&drive.path)
        .ok()?
        .into_iter()
        .find(|p| p.start == rec.start && p.size == rec.size)
        .map(|p| (p.devnode, p.devnum))
}

/// The device a mount of the volume shows (`st_dev` of its root, `st_rdev` of a bind
/// of its device node): its kernel partition on its drive (at its start, whatever its
/// size: a growth may be under way), or the filesystem of its adopted directory.
fn volume_dev(drive: Option<&Drive>, rec: &VolumeRecord, adopted: Option<&Node>) -> Option<(u32, u32)> {
    if rec.adopted.is_some() {
        return adopted.and_then(|n| n.stat().ok()).map(|s| s.dev);
    }
    blkpg::kernel_partitions(&drive?.path).ok()?.into_iter().find(|p| p.start == rec.start).map(|p| p.devnum)
}

/// What shows at `path` beneath `roots`, opened once (no symlink followed): `Err` with
/// the words of a refusal (a symlink, a path leaving the roots), `Ok(None)` when nothing
/// of the volume's device `dev` is mounted there (when `dev` is not known, when nothing
/// is mounted there), else the mount's root, through which all else is read.
fn open_mount(path: &Path, roots: &[PathBuf], dev: Option<(u32, u32)>) -> Result<Option<Node>, String> {
    let node = match beneath::open(path, roots) {
        Ok(Some(n)) => n,
        Ok(None) => return Ok(None),
        Err(PathError::Refused(reason)) => return Err(reason),
        Err(PathError::Disk(e)) => {
            debug!(actor = "health", path = %path.display(), error = %e, "cannot open a volume's path");
            return Ok(None);
        }
    };
    let shows = node.stat().is_ok_and(|s| s.mount_root && dev.is_none_or(|d| s.dev == d || s.rdev == Some(d)));
    Ok(shows.then_some(node))
}

/// Reads the directory `dir` (through its descriptor) with a deadline: a hung
/// filesystem (dead drive) must not hang the poller. The reading thread keeps the
/// volume's check (`held`) until the read ends, also when the poller stopped waiting for
/// it: the directory is open until then.
fn readable(dir: &Node, within: Duration, held: Arc<Check>) -> Result<(), String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let p = dir.shown().to_path_buf();
    let node = dir.try_clone().map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        // A test holds the directory open here, as a slow read would.
        let r = node.read_first(|| hold_readable(&p)).map(drop);
        drop(held);
        let _ = tx.send(r);
    });
    match rx.recv_timeout(within) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            debug!(actor = "health", path = %dir.shown().display(), error = %e, "volume directory unreadable");
            Err(read_error_words(&e))
        }
        Err(_) => Err(format!("no answer within {}", crate::config::human_duration(within))),
    }
}

/// Where a test holds a volume's directory open, as a slow read would (fail point
/// `health.readable.hold`).
fn hold_readable(path: &Path) {
    let _ = path;
    fail::fail_point!("health.readable.hold", |ms| hold_for(path, ms, ()));
}

/// Why an open failed, in words.
fn disk_words(e: &crate::disk::DiskError) -> String {
    match e {
        crate::disk::DiskError::Io { source, .. } => read_error_words(source),
        other => other.to_string(),
    }
}

/// Why a read failed, in words (the OS's own text goes to the debug log).
pub(crate) fn read_error_words(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EIO) => "an I/O error".into(),
        Some(libc::ENOTCONN | libc::ESTALE | libc::ENODEV | libc::ENXIO) => "its device is gone".into(),
        Some(libc::EACCES | libc::EPERM) => "permission denied".into(),
        Some(libc::ENOENT | libc::ENOTDIR) => "it is missing".into(),
        Some(libc::EUCLEAN) => "the filesystem reports itself corrupt".into(),
        _ => "the filesystem refused the read".into(),
    }
}

/// Holds `what` for `ms` milliseconds (a fail point's argument, 1000 if none), saying
/// so first (tests wait for the line), then returns `r`.
#[cfg(feature = "failpoints")]
fn hold_for<R>(what: &Path, ms: Option<String>, r: R) -> R {
    let ms = ms.and_then(|m| m.parse().ok()).unwrap_or(1000);
    warn!(actor = "health", path = %what.display(), hold_ms = ms, "fail point: a volume check holds this open");
    std::thread::sleep(Duration::from_millis(ms));
    r
}

type Fscked = HashMap<String, (Instant, Option<Finding>)>;

/// Whether a volume is looked at this cycle: not while it is being created or deleted,
/// nor while its drive is unknown to the inventory (an adopted volume has no drive of
/// ours and is always looked at).
pub(crate) fn to_check(rec: &VolumeRecord, drive_known: bool) -> bool {
    !matches!(rec.state, VolumeState::Creating | VolumeState::Deleting) && (drive_known || rec.adopted.is_some())
}

/// The staging path whose mount is checked: a finished stage of a filesystem volume.
pub(crate) fn staged_filesystem(rec: &VolumeRecord) -> Option<&Path> {
    rec.staging.as_ref().filter(|s| s.done && !s.block).map(|s| s.path.as_path())
}

/// Whether a read-only fsck may look at the volume: a formatted filesystem of ours that
/// no stage or publish holds (whether it is mounted elsewhere is probed separately).
pub(crate) fn fsck_candidate(rec: &VolumeRecord) -> bool {
    rec.staging.is_none() && rec.targets.is_empty() && rec.formatted && !rec.block && !rec.fs_type.is_empty() && rec.adopted.is_none()
}

/// What the staging path showed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StagingSeen {
    /// Nothing of the volume is mounted there.
    NotMounted,
    /// The path is refused (a symlink on the way, a path leaving the roots): why.
    Replaced(String),
    /// Mounted, but a read of it failed (or did not end in time).
    Unreadable(String),
    /// Mounted and readable; the percent used, when statvfs answered.
    Readable(Option<u8>),
}

/// What the probes of one volume saw on the host: the input of [`judge`].
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Seen {
    /// An adopted volume's directory and the result of reading it.
    pub adopted: Option<(PathBuf, Result<(), String>)>,
    /// The staging path of a staged filesystem, and what it showed.
    pub staging: Option<(PathBuf, StagingSeen)>,
    /// Each target path, whether its publish finished, and whether the volume is
    /// mounted there (`Err`: the path is refused, why).
    pub targets: Vec<(PathBuf, bool, Result<bool, String>)>,
    /// The verdict of the read-only fsck runs, when they were run (or remembered).
    pub fsck: Option<Finding>,
}

/// The findings of one volume from what its probes saw (pure; the poller's judgement).
pub(crate) fn judge(seen: Seen, usage_threshold_percent: u8) -> Vec<Finding> {
    let mut findings = Vec::new();
    if let Some((path, Err(error))) = seen.adopted {
        findings.push(Finding::Unreadable { path: path.display().to_string(), error });
    }
    match seen.staging {
        Some((path, StagingSeen::NotMounted)) => findings.push(Finding::StagingNotMounted { path: path.display().to_string() }),
        Some((path, StagingSeen::Replaced(reason))) => findings.push(Finding::PathReplaced { path: path.display().to_string(), reason }),
        Some((path, StagingSeen::Unreadable(error))) => findings.push(Finding::Unreadable { path: path.display().to_string(), error }),
        Some((_, StagingSeen::Readable(Some(pct)))) if pct >= usage_threshold_percent => {
            findings.push(Finding::OutOfSpace { percent: pct, threshold: usage_threshold_percent })
        }
        _ => {}
    }
    for (path, done, mounted) in seen.targets {
        match mounted {
            Ok(false) if done => findings.push(Finding::TargetNotMounted { path: path.display().to_string() }),
            Err(reason) if done => findings.push(Finding::PathReplaced { path: path.display().to_string(), reason }),
            _ => {}
        }
    }
    findings.extend(seen.fsck);
    findings
}

/// One volume check cycle: probes the host for each volume (opens, reads, fstatvfs,
/// read-only fsck) and judges what was seen; returns each volume's findings and the
/// fsck verdicts to remember.
fn check_all(
    cfg: &HealthConfig,
    roots: &[PathBuf],
    guards: &Arc<Guards>,
    drives: &HashMap<String, Drive>,
    records: Vec<VolumeRecord>,
    mut fscked: Fscked,
) -> (Vec<(String, Vec<Finding>)>, Fscked) {
    let mountinfo = mounts::read_mountinfo().unwrap_or_default();
    let mut out = Vec::new();
    let mut keep: Fscked = HashMap::new();
    for rec in records {
        let drive = drives.get(&rec.drive_id);
        if !to_check(&rec, drive.is_some()) {
            continue;
        }
        // A stage, unstage or delete of the volume is under way: checked next cycle.
        let Some(held) = guards.try_check(&rec.id).map(Arc::new) else { continue };
        let mut seen = Seen::default();
        // An adopted volume's data is a directory of the host: it must still be there.
        let adopted = rec.adopted.as_ref().map(|a| (a.path.clone(), beneath::open_outside(&a.path)));
        if let Some((path, dir)) = &adopted {
            let r = match dir {
                Ok(dir) => readable(dir, cfg.command_timeout, held.clone()),
                Err(e) => Err(disk_words(e)),
            };
            seen.adopted = Some((path.clone(), r));
        }
        let dev = volume_dev(drive, &rec, adopted.as_ref().and_then(|(_, d)| d.as_ref().ok()));
        if let Some(st) = staged_filesystem(&rec) {
            // Opened once beneath the roots and checked to be the volume's mount; read
            // and measured through that descriptor only.
            let what = match open_mount(st, roots, dev) {
                Err(reason) => StagingSeen::Replaced(reason),
                Ok(None) => StagingSeen::NotMounted,
                Ok(Some(at)) => {
                    // A test swaps the staging path here: the check goes on through `at`.
                    crate::failpoint::hold("health.staging.hold", st);
                    match readable(&at, cfg.command_timeout, held.clone()) {
                        Err(error) => StagingSeen::Unreadable(error),
                        Ok(()) => StagingSeen::Readable(at.usage().ok().map(|u| u.percent_used())),
                    }
                }
            };
            seen.staging = Some((st.to_path_buf(), what));
        }
        seen.targets = rec
            .targets
            .iter()
            .map(|(path, t)| {
                let mounted = open_mount(path, roots, dev).map(|n| n.is_some());
                (path.clone(), t.done, mounted)
            })
            .collect();
        if let (true, Some(drive)) = (fsck_candidate(&rec), drive) {
            let fresh = fscked.remove(&rec.id).filter(|(at, _)| at.elapsed() < FSCK_EVERY);
            seen.fsck = match fresh {
                Some((at, v)) => {
                    keep.insert(rec.id.clone(), (at, v.clone()));
                    v
                }
                None => {
                    let v = partition_of(drive, &rec).and_then(|(dev, devnum)| {
                        if mountinfo.iter().any(|m| m.devnum == devnum) {
                            return None;
                        }
                        fsck_agreed(&dev, &rec.fs_type, cfg.fsck_runs)
                    });
                    keep.insert(rec.id.clone(), (Instant::now(), v.clone()));
                    v
                }
            };
        }
        out.push((rec.id, judge(seen, cfg.usage_threshold_percent)));
    }
    (out, keep)
}

/// Corruption only if every one of `runs` read-only checks reports it.
fn fsck_agreed(dev: &Path, fs_type: &str, runs: u32) -> Option<Finding> {
    // A test holds the partition open exclusively here, as `xfs_repair -n` does.
    fail::fail_point!("health.fsck.hold", |ms| {
        use std::os::unix::fs::OpenOptionsExt;
        let _held = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_EXCL).open(dev);
        hold_for(dev, ms, None)
    });
    let mut found = None;
    for _ in 0..runs {
        match fs::check_readonly(dev, fs_type) {
            Fsck::Corrupt(d) => found = Some(d),
            Fsck::Clean | Fsck::Undecided(_) => return None,
        }
    }
    let output = found?;
    // The checker's own lines are for the log; the condition says it in words.
    warn!(actor = "health", device = %dev.display(), fsck.output = %output, "a read-only filesystem check found errors");
    Some(Finding::Corrupt { detail: corrupt_words(fs_type, runs) })
}

/// What a read-only check that found errors says in a volume's condition.
pub(crate) fn corrupt_words(fs_type: &str, runs: u32) -> String {
    let tool = if fs_type == "xfs" { "xfs_repair -n" } else { "e2fsck -n" };
    let times = if runs == 1 { "once".to_string() } else { format!("in each of {runs} runs") };
    format!("a read-only check ({tool}) found errors {times}")
}

impl Actor for HealthPoller {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // First SMART poll soon after start (the inventory needs its first scan).
        self.schedule_smart(ctx, Duration::from_secs(1));
        ctx.run_interval(self.cfg.volume_check_interval, |act, ctx| act.volume_cycle(ctx));
    }
}

impl Supervised for HealthPoller {
    fn restarting(&mut self, _: &mut Context<Self>) {
        warn!(actor = "health", "restarting the health poller");
        self.smart_running = false;
        self.volumes_running = false;
        self.fscked.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::volumes::model::{Adopted, Staging, Target};

    fn staged(block: bool, done: bool) -> Staging {
        Staging { path: "/k/stage".into(), block, flags: vec![], readonly: false, done }
    }

    #[test]
    fn what_a_user_reads_about_a_drive_or_volume_is_drivelets_words_not_the_tools() {
        let gone = std::io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(
            cannot_run_words(Path::new("/usr/sbin/smartctl"), &gone),
            "no health data: smartctl is not installed (/usr/sbin/smartctl not found): install smartmontools or set health.smartctl"
        );
        let denied = std::io::Error::from_raw_os_error(libc::EACCES);
        assert!(cannot_run_words(Path::new("smartctl"), &denied).contains("permission denied"));
        for (errno, words) in [(libc::EIO, "an I/O error"), (libc::ENOTCONN, "its device is gone"), (libc::EACCES, "permission denied")] {
            let w = read_error_words(&std::io::Error::from_raw_os_error(errno));
            assert_eq!(w, words);
            assert!(!w.contains("os error"), "{w}");
        }
        assert_eq!(corrupt_words("xfs", 3), "a read-only check (xfs_repair -n) found errors in each of 3 runs");
        assert_eq!(corrupt_words("ext4", 1), "a read-only check (e2fsck -n) found errors once");
    }

    #[test]
    fn which_volumes_are_checked_staged_and_fscked() {
        let base = || {
            let mut r = VolumeRecord::for_test(1, VolumeState::Available);
            r.formatted = true;
            r.fs_type = "ext4".into();
            r.block = false;
            r
        };
        let adopted = |mut r: VolumeRecord| {
            r.adopted = Some(Adopted { path: "/data".into(), pv_name: "pv".into() });
            r
        };
        let state = |s: VolumeState| {
            let mut r = base();
            r.state = s;
            r
        };
        // (case, record, drive known, checked)
        let checked: Vec<(&str, VolumeRecord, bool, bool)> = vec![
            ("an available volume on a known drive", base(), true, true),
            ("its drive unknown", base(), false, false),
            ("being created", state(VolumeState::Creating), true, false),
            ("being deleted", state(VolumeState::Deleting), true, false),
            ("adopted, no drive of ours", adopted(base()), false, true),
        ];
        for (what, rec, known, want) in checked {
            assert_eq!(to_check(&rec, known), want, "{what}");
        }
        let with_staging = |st: Option<Staging>| {
            let mut r = base();
            r.staging = st;
            r
        };
        assert_eq!(staged_filesystem(&with_staging(Some(staged(false, true)))), Some(Path::new("/k/stage")));
        assert_eq!(staged_filesystem(&with_staging(Some(staged(false, false)))), None, "a stage in progress");
        assert_eq!(staged_filesystem(&with_staging(Some(staged(true, true)))), None, "block: nothing is mounted there");
        assert_eq!(staged_filesystem(&with_staging(None)), None);
        let mut published = base();
        published.targets.insert("/k/t".into(), Target { readonly: false, block: false, done: true });
        let mut raw = base();
        raw.block = true;
        let mut blank = base();
        blank.formatted = false;
        // (case, record, fsck may look)
        let fsck: Vec<(&str, VolumeRecord, bool)> = vec![
            ("a formatted filesystem nobody holds", base(), true),
            ("staged", with_staging(Some(staged(false, true))), false),
            ("published", published, false),
            ("block", raw, false),
            ("never formatted", blank, false),
            ("adopted (not ours to fsck)", adopted(base()), false),
        ];
        for (what, rec, want) in fsck {
            assert_eq!(fsck_candidate(&rec), want, "{what}");
        }
    }

    #[test]
    fn what_was_seen_is_judged_into_findings() {
        let p = |s: &str| PathBuf::from(s);
        let corrupt = Finding::Corrupt { detail: "bad inode".into() };
        // (case, seen, findings)
        let table: Vec<(&str, Seen, Vec<Finding>)> = vec![
            ("nothing to look at", Seen::default(), vec![]),
            ("a healthy staged volume", Seen { staging: Some((p("/s"), StagingSeen::Readable(Some(40)))), ..Seen::default() }, vec![]),
            ("statvfs did not answer", Seen { staging: Some((p("/s"), StagingSeen::Readable(None))), ..Seen::default() }, vec![]),
            (
                "staging unmounted",
                Seen { staging: Some((p("/s"), StagingSeen::NotMounted)), ..Seen::default() },
                vec![Finding::StagingNotMounted { path: "/s".into() }],
            ),
            (
                "staging unreadable",
                Seen { staging: Some((p("/s"), StagingSeen::Unreadable("EIO".into()))), ..Seen::default() },
                vec![Finding::Unreadable { path: "/s".into(), error: "EIO".into() }],
            ),
            (
                "at the threshold is full",
                Seen { staging: Some((p("/s"), StagingSeen::Readable(Some(80)))), ..Seen::default() },
                vec![Finding::OutOfSpace { percent: 80, threshold: 80 }],
            ),
            ("just under it is not", Seen { staging: Some((p("/s"), StagingSeen::Readable(Some(79)))), ..Seen::default() }, vec![]),
            (
                "a finished target unmounted, one in progress ignored, one mounted fine",
                Seen { targets: vec![(p("/t1"), true, Ok(false)), (p("/t2"), false, Ok(false)), (p("/t3"), true, Ok(true))], ..Seen::default() },
                vec![Finding::TargetNotMounted { path: "/t1".into() }],
            ),
            (
                "a staging path replaced by a symlink is not read",
                Seen { staging: Some((p("/s"), StagingSeen::Replaced("a symlink".into()))), ..Seen::default() },
                vec![Finding::PathReplaced { path: "/s".into(), reason: "a symlink".into() }],
            ),
            (
                "a finished target replaced, one in progress ignored",
                Seen { targets: vec![(p("/t1"), true, Err("a symlink".into())), (p("/t2"), false, Err("a symlink".into()))], ..Seen::default() },
                vec![Finding::PathReplaced { path: "/t1".into(), reason: "a symlink".into() }],
            ),
            (
                "an adopted directory gone",
                Seen { adopted: Some((p("/data"), Err("No such file or directory".into()))), ..Seen::default() },
                vec![Finding::Unreadable { path: "/data".into(), error: "No such file or directory".into() }],
            ),
            ("an adopted directory readable", Seen { adopted: Some((p("/data"), Ok(()))), ..Seen::default() }, vec![]),
            ("fsck agreed on corruption", Seen { fsck: Some(corrupt.clone()), ..Seen::default() }, vec![corrupt.clone()]),
            (
                "everything at once, in order",
                Seen {
                    adopted: Some((p("/data"), Err("EIO".into()))),
                    staging: Some((p("/s"), StagingSeen::NotMounted)),
                    targets: vec![(p("/t1"), true, Ok(false))],
                    fsck: Some(corrupt.clone()),
                },
                vec![
                    Finding::Unreadable { path: "/data".into(), error: "EIO".into() },
                    Finding::StagingNotMounted { path: "/s".into() },
                    Finding::TargetNotMounted { path: "/t1".into() },
                    corrupt,
                ],
            ),
        ];
        for (what, seen, want) in table {
            assert_eq!(judge(seen, 80), want, "{what}");
        }
    }
}

