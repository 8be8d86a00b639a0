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
//!   still mounted. For a formatted filesystem that is mounted nowhere: a read-only fsck,
//!   `health.fsck_runs` times, corruption reported only when every run agrees; it is
//!   re-run only after the volume was mounted again, or after [`FSCK_EVERY`].
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

use super::inventory::classify::DriveClass;
use super::inventory::model::{Drive, DriveHealth};
use super::inventory::DriveInventory;
use super::messages::{DriveHealthObserved, ListDrives};
use super::volumes::health::Finding;
use super::volumes::model::{VolumeRecord, VolumeState};
use super::volumes::{gate, ListVolumes, VolumeChecked, VolumeManager};
use crate::config::HealthConfig;
use crate::disk::fs::Fsck;
use crate::disk::smart::{self, Health};
use crate::disk::{blkpg, fs, mounts};

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
}

impl HealthPoller {
    /// A poller reporting to the inventory and the volume manager.
    pub(crate) fn new(cfg: HealthConfig, inventory: Addr<DriveInventory>, volumes: Addr<VolumeManager>) -> HealthPoller {
        let limit = Arc::new(Semaphore::new(cfg.concurrency));
        HealthPoller { cfg, inventory, volumes, limit, smart_running: false, volumes_running: false, fscked: HashMap::new() }
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
        let (inv, vols) = (self.inventory.clone(), self.volumes.clone());
        let cfg = self.cfg.clone();
        let fscked = std::mem::take(&mut self.fscked);
        ctx.spawn(
            async move {
                let drives: HashMap<String, Drive> =
                    inv.send(ListDrives).await.unwrap_or_default().into_iter().map(|d| (d.id.clone(), d)).collect();
                let records = vols.send(ListVolumes).await.unwrap_or_default();
                let job = move || check_all(&cfg, &drives, records, fscked);
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
    let (health, reason) = match tokio::time::timeout(cfg.command_timeout, run).await {
        Err(_) => (Health::Unknown, format!("smartctl did not answer within {:?}", cfg.command_timeout)),
        Ok(Err(e)) => (Health::Unknown, format!("cannot run {}: {e}", cfg.smartctl.display())),
        Ok(Ok(out)) => {
            let json = String::from_utf8_lossy(&out.stdout);
            let r = smart::assess(&json, out.status.code().unwrap_or(-1), &cfg.smart);
            (r.health, r.reason())
        }
    };
    debug!(actor = "health", drive.id = %d.id, drive.health = health.as_str(), drive.health_reason = %reason, "SMART polled");
    DriveHealth { health, reason, checked_unix: now }
}

/// The kernel partition of a volume on its drive: device node and number.
fn partition_of(drive: &Drive, rec: &VolumeRecord) -> Option<(PathBuf, (u32, u32))> {
    blkpg::kernel_partitions(&drive.path)
        .ok()?
        .into_iter()
        .find(|p| p.start == rec.start && p.size == rec.size)
        .map(|p| (p.devnode, p.devnum))
}

/// Reads a directory with a deadline: a hung filesystem (dead drive) must not hang the
/// poller. The reading thread keeps the volume's check (`held`) until the read ends,
/// also when the poller stopped waiting for it: the directory is open until then.
fn readable(path: &Path, within: Duration, held: Arc<gate::Check>) -> Result<(), String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.to_path_buf();
    std::thread::spawn(move || {
        let r = std::fs::read_dir(&p).and_then(|mut it| {
            // A test holds the directory open here, as a slow read would.
            fail::fail_point!("health.readable.hold", |ms| hold_for(&p, ms, Ok(())));
            it.next().transpose().map(|_| ())
        });
        drop(held);
        let _ = tx.send(r);
    });
    match rx.recv_timeout(within) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {within:?}")),
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

fn check_all(
    cfg: &HealthConfig,
    drives: &HashMap<String, Drive>,
    records: Vec<VolumeRecord>,
    mut fscked: Fscked,
) -> (Vec<(String, Vec<Finding>)>, Fscked) {
    let mountinfo = mounts::read_mountinfo().unwrap_or_default();
    let mounted_at = |p: &Path| mountinfo.iter().any(|m| m.mount_point == p);
    let mut out = Vec::new();
    let mut keep: Fscked = HashMap::new();
    for rec in records {
        if matches!(rec.state, VolumeState::Creating | VolumeState::Deleting) {
            continue;
        }
        let drive = drives.get(&rec.drive_id);
        if drive.is_none() && rec.adopted.is_none() {
            continue;
        }
        // A stage, unstage or delete of the volume is under way: checked next cycle.
        let Some(held) = gate::try_check(&rec.id).map(Arc::new) else { continue };
        let mut findings = Vec::new();
        // An adopted volume's data is a directory of the host: it must still be there.
        if let Some(a) = &rec.adopted {
            if let Err(error) = readable(&a.path, cfg.command_timeout, held.clone()) {
                findings.push(Finding::Unreadable { path: a.path.display().to_string(), error });
            }
        }
        if let Some(st) = rec.staging.as_ref().filter(|s| s.done && !s.block) {
            if !mounted_at(&st.path) {
                findings.push(Finding::StagingNotMounted { path: st.path.display().to_string() });
            } else if let Err(error) = readable(&st.path, cfg.command_timeout, held.clone()) {
                findings.push(Finding::Unreadable { path: st.path.display().to_string(), error });
            } else if let Ok(u) = fs::usage(&st.path) {
                let pct = u.percent_used();
                if pct >= cfg.usage_threshold_percent {
                    findings.push(Finding::OutOfSpace { percent: pct, threshold: cfg.usage_threshold_percent });
                }
            }
        }
        for (path, t) in &rec.targets {
            if t.done && !mounted_at(path) {
                findings.push(Finding::TargetNotMounted { path: path.display().to_string() });
            }
        }
        let idle = rec.staging.is_none() && rec.targets.is_empty() && rec.formatted && !rec.block && !rec.fs_type.is_empty();
        if let (true, Some(drive), None) = (idle, drive, &rec.adopted) {
            let fresh = fscked.remove(&rec.id).filter(|(at, _)| at.elapsed() < FSCK_EVERY);
            let verdict = match fresh {
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
            findings.extend(verdict);
        }
        out.push((rec.id, findings));
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
    let mut detail = None;
    for _ in 0..runs {
        match fs::check_readonly(dev, fs_type) {
            Fsck::Corrupt(d) => detail = Some(d),
            Fsck::Clean | Fsck::Undecided(_) => return None,
        }
    }
    detail.map(|detail| Finding::Corrupt { detail })
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
