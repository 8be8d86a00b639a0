//! DriveInventory: owns the set of drives. udev is the source of truth: a full scan at
//! start, live udev events afterwards, and a slow periodic rescan as a safety net.
//!
//! Rules:
//! - probes run off the actor thread, one at a time; events that arrive while a probe
//!   runs are coalesced per disk and probed right after, so the newest state wins and
//!   queries are never stuck behind a burst of events;
//! - a disk is probed at most once per [`PROBE_GAP`]: the first event after a quiet
//!   spell is probed at once, the burst after it (udev sends a change for every
//!   partition of a disk after each table write, 255 on a full drive) once the gap is
//!   over, so the inventory's probes, which read the whole disk under its shared lock,
//!   do not grow with the partitions a drive holds;
//! - every change is logged once, naming what changed (a health verdict only when the
//!   verdict, its reason or the first check is new), and sent to subscribers as a
//!   [`DriveEvent`];
//! - a drive the GPT writer refused ([`DriveRefused`]) turns foreign at once, with the
//!   writer's words; its next probe judges it again by the writer's own rule;
//! - on restart (supervisor) the actor forgets everything and rebuilds from the host;
//!   tests make it fail while answering `ListDrives` (fail point
//!   `actor.inventory.stop`, armed through the admin socket when the test wants it);
//! - whether the first full scan is done is published on every change (false again
//!   at a restart), for Probe to read without a message.

/// The eligibility policy: which block devices are drives, and which drivelet may manage.
pub mod classify;
/// The set of drives as plain data: built from probes, diffed into events.
pub mod model;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::watch;
use tracing::{error, info, warn};

use self::model::{Drive, DriveChange, Inventory};
use super::messages::*;
use crate::config::DrivesConfig;
use crate::disk::mounts::HostUsage;
use crate::disk::udev::{self, DiskProbe};

/// The shortest time between two probes of one disk on its own (a full scan is not
/// held back): a burst of events for a disk is probed once per gap, the newest state
/// winning.
pub const PROBE_GAP: Duration = Duration::from_millis(250);

/// What one probe round should look at.
enum ProbeJob {
    All,
    Disks(BTreeSet<String>),
}

/// Result of a probe round, made off the actor thread.
enum ProbeResult {
    All(Vec<DiskProbe>),
    /// Per disk: gone or not a drive (`Ok(None)`), probed, or the probe failed.
    Disks(Vec<(String, Result<Option<DiskProbe>, crate::disk::DiskError>)>),
}

/// The drive inventory actor.
pub struct DriveInventory {
    cfg: DrivesConfig,
    /// Who this node is, for whose each drivelet disk is.
    own: classify::Ownership,
    inv: Inventory,
    subscribers: Vec<Recipient<DriveEvent>>,
    monitor_stop: Option<Arc<AtomicBool>>,
    probing: bool,
    want_full: bool,
    dirty: BTreeSet<String>,
    /// When each disk was last probed on its own ([`PROBE_GAP`]).
    probed: BTreeMap<String, std::time::Instant>,
    /// A kick is scheduled for when the first waiting disk's gap is over.
    kick_later: bool,
    /// Health verdicts by drive id, kept across rescans and re-appearances.
    health: BTreeMap<String, model::DriveHealth>,
    /// Where whether the first full scan is done is published (Probe reads it).
    scanned: ScanPublisher,
}

/// Where the drive inventory publishes whether its first full scan is done.
#[derive(Debug)]
pub struct ScanPublisher(watch::Sender<bool>);

impl Default for ScanPublisher {
    fn default() -> Self {
        ScanPublisher(watch::Sender::new(false))
    }
}

impl ScanPublisher {
    /// Says whether the first full scan is done.
    pub fn publish(&self, scanned: bool) {
        self.0.send_if_modified(|s| std::mem::replace(s, scanned) != scanned);
    }

    /// A reader from now on.
    pub fn reader(&self) -> ScanReader {
        ScanReader(self.0.subscribe())
    }
}

/// Reads whether the inventory's first full scan is done.
#[derive(Debug, Clone)]
pub struct ScanReader(watch::Receiver<bool>);

impl ScanReader {
    /// Whether the first full scan is done; `None` when the inventory is gone for good.
    pub fn get(&self) -> Option<bool> {
        self.0.has_changed().ok()?;
        Some(*self.0.borrow())
    }
}

impl DriveInventory {
    /// A new inventory for the given drive policy.
    pub fn new(cfg: DrivesConfig, own: classify::Ownership) -> Self {
        Self {
            cfg,
            own,
            inv: Inventory::default(),
            subscribers: Vec::new(),
            monitor_stop: None,
            probing: false,
            want_full: true,
            dirty: BTreeSet::new(),
            probed: BTreeMap::new(),
            kick_later: false,
            health: BTreeMap::new(),
            scanned: ScanPublisher::default(),
        }
    }

    /// A reader of whether the first full scan is done.
    pub fn scan_reader(&self) -> ScanReader {
        self.scanned.reader()
    }

    fn start_monitor(&mut self, ctx: &mut Context<Self>) {
        let stop = Arc::new(AtomicBool::new(false));
        let addr = ctx.address();
        let fail_addr = ctx.address();
        match udev::spawn_monitor(
            move |ev| addr.do_send(BlockEventSeen(ev)),
            move |why| fail_addr.do_send(MonitorFailed(why)),
            stop.clone(),
        ) {
            Ok(_) => self.monitor_stop = Some(stop),
            Err(e) => {
                error!(actor = "inventory", error = %e, "cannot follow udev events; restarting in 5s");
                ctx.run_later(Duration::from_secs(5), |_, ctx| ctx.stop());
            }
        }
    }

    fn stop_monitor(&mut self) {
        if let Some(s) = self.monitor_stop.take() {
            s.store(true, Ordering::Relaxed);
        }
    }

    /// Starts the next probe round if none is running and there is work.
    fn kick(&mut self, ctx: &mut Context<Self>) {
        if self.probing {
            return;
        }
        let job = if self.want_full {
            self.want_full = false;
            self.dirty.clear();
            ProbeJob::All
        } else if !self.dirty.is_empty() {
            let now = std::time::Instant::now();
            let wait = |name: &String| self.probed.get(name).map_or(Duration::ZERO, |at| PROBE_GAP.saturating_sub(now.duration_since(*at)));
            let (ready, waiting): (BTreeSet<String>, BTreeSet<String>) = std::mem::take(&mut self.dirty).into_iter().partition(|n| wait(n).is_zero());
            if let Some(first) = waiting.iter().map(wait).min().filter(|_| !self.kick_later) {
                self.kick_later = true;
                ctx.run_later(first, |act, ctx| {
                    act.kick_later = false;
                    act.kick(ctx);
                });
            }
            self.dirty = waiting;
            if ready.is_empty() {
                return;
            }
            for n in &ready {
                self.probed.insert(n.clone(), now);
            }
            ProbeJob::Disks(ready)
        } else {
            return;
        };
        self.probing = true;
        let first = !self.inv.scanned();
        let fut = async move {
            tokio::task::spawn_blocking(move || {
                if first {
                    // Tests hold the first scan here (`FAILPOINTS=inventory.first_scan=sleep(N)`)
                    // to watch readiness wait for it.
                    fail::fail_point!("inventory.first_scan");
                    // Let udev finish what is queued (a previous run's writes, say), so
                    // the first scan judges settled properties.
                    let _ = std::process::Command::new("udevadm")
                        .args(["settle", "--timeout=5"])
                        .stdin(std::process::Stdio::null())
                        .status();
                }
                let usage = HostUsage::read().unwrap_or_default();
                let res = match job {
                    ProbeJob::All => udev::probe_all().map(ProbeResult::All),
                    ProbeJob::Disks(names) => Ok(ProbeResult::Disks(
                        names
                            .into_iter()
                            .map(|n| {
                                let p = udev::probe_disk(&n);
                                (n, p)
                            })
                            .collect(),
                    )),
                };
                (res, usage)
            })
            .await
        };
        ctx.spawn(fut.into_actor(self).map(|joined, act, ctx| {
            act.probing = false;
            match joined {
                Ok((Ok(res), usage)) => act.apply(res, &usage),
                Ok((Err(e), _)) => {
                    warn!(actor = "inventory", error = %e, "probe failed; retrying at next rescan");
                }
                Err(e) => warn!(actor = "inventory", error = %e, "probe task failed"),
            }
            act.kick(ctx);
        }));
    }

    fn drive_of(&self, p: &DiskProbe, usage: &HostUsage) -> Option<Drive> {
        let mut d = Drive::from_probe(p, usage, &self.cfg.filters, self.cfg.allow_loop, &self.own)?;
        if let Some(h) = self.health.get(&d.id) {
            d.health = h.clone();
        }
        Some(d)
    }

    fn apply(&mut self, res: ProbeResult, usage: &HostUsage) {
        let first = !self.inv.scanned();
        let changes = match res {
            ProbeResult::All(probes) => {
                let scan: BTreeMap<String, Drive> = probes
                    .iter()
                    .filter_map(|p| self.drive_of(p, usage).map(|d| (p.name.clone(), d)))
                    .collect();
                self.inv.apply_scan(scan)
            }
            ProbeResult::Disks(list) => list
                .into_iter()
                .filter_map(|(name, p)| match p {
                    Ok(p) => {
                        let d = p.as_ref().and_then(|p| self.drive_of(p, usage));
                        self.inv.apply_one(&name, d)
                    }
                    Err(e) => {
                        // A failed probe says nothing about the disk: keep what is known
                        // and look again at the next rescan.
                        warn!(actor = "inventory", drive.name = %name, error = %e, "probe failed; keeping the last known state");
                        None
                    }
                })
                .collect(),
        };
        crate::metrics::metrics().record_scan();
        if first && self.inv.scanned() {
            info!(actor = "inventory", drives = self.inv.list().len(), "first drive scan complete");
        }
        self.scanned.publish(self.inv.scanned());
        for c in changes {
            self.publish(c);
        }
    }

    /// Sends a change to subscribers without the generic log line.
    fn publish_quiet(&mut self, change: DriveChange) {
        let event = match change {
            DriveChange::Appeared(d) => DriveEvent::DriveAppeared(d),
            DriveChange::Changed { old, new } => DriveEvent::DriveChanged { old, new },
            DriveChange::Gone(d) => DriveEvent::DriveRemoved(d),
        };
        super::tell_all(&mut self.subscribers, &event);
    }

    fn publish(&mut self, change: DriveChange) {
        let event = match change {
            DriveChange::Appeared(d) => {
                info!(drive.id = %d.id, drive.path = %d.path.display(), drive.class = d.class.as_str(),
                      drive.reason = %d.reason, drive.size = d.size_bytes, "drive appeared");
                DriveEvent::DriveAppeared(d)
            }
            DriveChange::Changed { old, new } => {
                info!(drive.id = %new.id, drive.path = %new.path.display(), drive.class = new.class.as_str(),
                      drive.reason = %new.reason, drive.old_class = old.class.as_str(),
                      drive.changed = %new.changed_from(&old).join(", "), "drive changed");
                DriveEvent::DriveChanged { old, new }
            }
            DriveChange::Gone(d) => {
                info!(drive.id = %d.id, drive.path = %d.path.display(), drive.class = d.class.as_str(), "drive gone");
                DriveEvent::DriveRemoved(d)
            }
        };
        super::tell_all(&mut self.subscribers, &event);
    }
}

impl Actor for DriveInventory {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Monitor first, so no event between the scan and the monitor is lost.
        self.start_monitor(ctx);
        self.want_full = true;
        self.kick(ctx);
        ctx.run_interval(self.cfg.rescan_interval, |_, ctx| ctx.notify(Rescan));
    }

    fn stopping(&mut self, _: &mut Context<Self>) -> Running {
        self.stop_monitor();
        Running::Stop
    }
}

impl Supervised for DriveInventory {
    fn restarting(&mut self, _: &mut Context<Self>) {
        warn!(actor = "inventory", "restarting: rebuilding the drive set from udev");
        self.stop_monitor();
        self.inv = Inventory::default();
        self.scanned.publish(false);
        self.probing = false;
        self.dirty.clear();
    }
}

impl Handler<ListDrives> for DriveInventory {
    type Result = Vec<Drive>;
    fn handle(&mut self, _: ListDrives, ctx: &mut Context<Self>) -> Vec<Drive> {
        if crate::failpoint::injected_failure("actor.inventory.stop") {
            warn!(actor = "inventory", "failure injected: stopping after this answer");
            ctx.stop();
        }
        self.inv.list()
    }
}

impl Handler<GetInventoryStatus> for DriveInventory {
    type Result = InventoryStatus;
    fn handle(&mut self, _: GetInventoryStatus, _: &mut Context<Self>) -> InventoryStatus {
        InventoryStatus { scanned: self.inv.scanned(), drives: self.inv.list().len() }
    }
}

impl Handler<BlockEventSeen> for DriveInventory {
    type Result = ();
    fn handle(&mut self, m: BlockEventSeen, ctx: &mut Context<Self>) {
        tracing::debug!(actor = "inventory", udev.action = %m.0.action, drive.name = %m.0.disk, "udev event");
        self.dirty.insert(m.0.disk);
        self.kick(ctx);
    }
}

impl Handler<Rescan> for DriveInventory {
    type Result = ();
    fn handle(&mut self, _: Rescan, ctx: &mut Context<Self>) {
        self.want_full = true;
        self.kick(ctx);
    }
}

impl Handler<MonitorFailed> for DriveInventory {
    type Result = ();
    fn handle(&mut self, m: MonitorFailed, ctx: &mut Context<Self>) {
        error!(actor = "inventory", error = %m.0, "udev monitor failed; restarting the inventory");
        ctx.stop();
    }
}

impl Handler<DriveHealthObserved> for DriveInventory {
    type Result = ();
    fn handle(&mut self, m: DriveHealthObserved, _: &mut Context<Self>) {
        self.health.insert(m.drive_id.clone(), m.health.clone());
        if let Some(change) = self.inv.set_health(&m.drive_id, m.health) {
            if let DriveChange::Changed { old, new } = &change {
                let (id, path, health, reason) = (&new.id, new.path.display(), new.health.health.as_str(), &new.health.reason);
                match new.health.change_from(&old.health) {
                    model::HealthChange::Verdict => info!(drive.id = %id, drive.path = %path, drive.health = health,
                        drive.health_reason = %reason, drive.old_health = old.health.health.as_str(), "drive health changed"),
                    model::HealthChange::FirstCheck => info!(drive.id = %id, drive.path = %path, drive.health = health,
                        drive.health_reason = %reason, "drive health checked"),
                    model::HealthChange::Reason => info!(drive.id = %id, drive.path = %path, drive.health = health,
                        drive.health_reason = %reason, drive.old_health_reason = %old.health.reason, "drive health reason changed"),
                    model::HealthChange::Nothing => {}
                }
            }
            self.publish_quiet(change);
        }
    }
}

impl Handler<DriveRefused> for DriveInventory {
    type Result = ();
    fn handle(&mut self, m: DriveRefused, _: &mut Context<Self>) {
        if let Some(change) = self.inv.mark_foreign(&m.drive_id, classify::holds(&m.found)) {
            self.publish(change);
        }
    }
}

impl Handler<AdoptDrive> for DriveInventory {
    type Result = ResponseActFuture<Self, Result<Adopted, String>>;
    fn handle(&mut self, m: AdoptDrive, _: &mut Context<Self>) -> Self::Result {
        let found = self.inv.list().into_iter().find(|d| d.id == m.drive_id);
        let decided = match (&self.own.me, found) {
            (None, _) => Err("this node does not know which cluster it belongs to, so it adopts no drive".to_string()),
            (_, None) => Err(format!("there is no drive {} on this node", m.drive_id)),
            (Some(_), Some(d)) if d.class == crate::words::DriveClass::Managed => {
                Ok(Err(Adopted { drive_id: d.id, from: "this node".into(), volumes: Vec::new(), already: true }))
            }
            (Some(_), Some(d)) if d.class != crate::words::DriveClass::OwnedElsewhere => Err(format!(
                "drive {} is {}: {}; only a drivelet disk owned elsewhere is adopted",
                d.id,
                d.class.as_str(),
                d.reason
            )),
            (Some(me), Some(d)) => Ok(Ok((me.clone(), d))),
        };
        let (me, d) = match decided {
            Err(e) => return Box::pin(fut::ready(Err(e))),
            Ok(Err(done)) => return Box::pin(fut::ready(Ok(done))),
            Ok(Ok(x)) => x,
        };
        let name = d.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let from = match &d.owner {
            crate::words::DriveOwner::Elsewhere { owner, .. } => owner.words(&me),
            crate::words::DriveOwner::Unreadable { reason } => format!("nobody drivelet can tell ({reason})"),
            _ => "nobody drivelet can tell (no note)".into(),
        };
        let volumes = match &d.owner {
            crate::words::DriveOwner::Elsewhere { volumes, .. } => volumes.clone(),
            _ => Vec::new(),
        };
        let (id, path, sector) = (d.id.clone(), d.path.clone(), d.logical_block_size);
        let work = async move {
            tokio::task::spawn_blocking(move || {
                let _lock = crate::disk::lock::DiskLock::exclusive(&path).map_err(|e| e.to_string())?;
                crate::failpoint::crash_point!("adopt.before_note");
                let wrote = crate::disk::gpt::write_note(&path, sector, true, |cur| crate::disk::note::DiskNote {
                    owner: me.clone(),
                    adopted_from: cur.map(|c| c.owner.clone()).filter(|o| *o != me),
                    volumes: cur.map(|c| c.volumes.clone()).unwrap_or_default(),
                })
                .map_err(|e| e.to_string())?;
                // The note is on the disk (flushed): a restart finds the drive this
                // node's and serves its volumes; the adoption is done.
                crate::failpoint::crash_point!("adopt.note_written");
                Ok(wrote)
            })
            .await
            .map_err(|e| format!("the adoption's task failed: {e}"))?
        };
        Box::pin(work.into_actor(self).map(move |res: Result<bool, String>, act, ctx| {
            res?;
            info!(actor = "inventory", drive.id = %id, drive.owner_was = %from, volumes = volumes.len(), "drive adopted by this node: its note names this node now; its volumes are served here once it is read again");
            act.dirty.insert(name);
            act.kick(ctx);
            Ok(Adopted { drive_id: id, from, volumes, already: false })
        }))
    }
}

impl Handler<SubscribeDrives> for DriveInventory {
    type Result = ();
    fn handle(&mut self, m: SubscribeDrives, _: &mut Context<Self>) {
        self.subscribers.push(m.0);
    }
}
