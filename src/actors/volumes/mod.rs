//! VolumeManager: owns volumes — their records in memory and in the store, the state
//! machine, placement, and every destructive disk operation.
//!
//! Rules:
//! - one operation per volume at a time: a second call on a volume that is busy gets
//!   `Aborted` at once (the volume id is derived from the name, so two CreateVolume
//!   calls with one name collide here too); different volumes proceed in parallel;
//! - placement is decided on the actor thread, and the new record reserves its extent
//!   before any disk is touched, so parallel creates never pick the same space;
//! - slow steps (GPT writes, mkfs, mount) run in `spawn_blocking`; the continuation
//!   stores the record the step hands back;
//! - nothing is served until start-up reconciliation of the store with the drives'
//!   GPTs and the host's mounts is done (calls get `NotReady`);
//! - the drive set comes from the inventory's [`DriveEvent`]s; only managed drives
//!   take new volumes; a drive the GPT writer refuses at CreateVolume time turns
//!   foreign at once (the inventory hears [`DriveRefused`]) and the same CreateVolume
//!   goes on to the next drive, leaving no record behind;
//! - subscribers hear [`VolumesChanged`] for a drive whenever what it holds changes: a
//!   volume on it is handed out (created or adopted), deleted or failed, or its usage
//!   record changes (the `Drive` objects list a drive's volumes);
//! - on restart (supervisor) the book is rebuilt from the store, the drives and the
//!   mounts; calls in flight are answered UNAVAILABLE, and their disk steps run on to
//!   their end, holding the store, which the rebuild waits for; tests make the actor
//!   fail while answering `GetVolumeStatus` (fail point `actor.volumes.stop`);
//! - what may run beside what, outside in (nothing takes a guard above one it holds):
//!   the book's [`Guards`] (one call per volume; health checks only of volumes no call or
//!   step holds), then the drive's [`DiskLock`](crate::disk::lock::DiskLock) (one table
//!   change per drive, in this process and against udev), then the store's write
//!   transaction; docs/architecture.md explains each;
//! - after each change of what the cheap CSI calls read, the book publishes a
//!   [`view::VolumesView`] of itself, which they read without a message.
//!
//! The actor is a thin shell: [`book::VolumeBook`] holds the state and decides, the
//! handlers forward to it and run the disk steps it asks for ([`ops`]) off the actor
//! thread; [`messages`] are what it answers, [`startup`] how it starts.

pub(crate) mod binding;
pub(crate) mod book;
pub(crate) mod cleaner;
pub(crate) mod clone;
pub mod error;
pub(crate) mod conditions;
pub(crate) mod drive_actions;
pub mod drive_view;
pub mod evacuate;
pub(crate) mod messages;
pub(crate) mod notes;
pub mod model;
pub(crate) mod moves;
pub mod ops;
pub(crate) mod placement;
pub(crate) mod usage;
pub(crate) mod reconcile;
pub(crate) mod scrape;
pub mod snapshot;
pub(crate) mod startup;
pub(crate) mod view;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use actix::prelude::*;
use tracing::{error, info, warn};

pub use self::book::claim::Guards;
pub use self::scrape::{ScrapeVolumes, VolumesScrape};
pub use self::error::VolumeError;
pub use self::messages::*;
pub use self::evacuate::{EvacuateDrive, Evacuation, ListEvacuations, MovedVolume, PendingMove, PendingState, SubscribeMoves, VolumeMoved};
pub use self::drive_actions::{volume_detail, volume_kind, volume_state, VolumeDetail};

use self::book::{Claim, CreatePlan, VolumeBook};

use self::model::VolumeRecord;
use self::ops::Outcome;
use super::inventory::DriveInventory;
use super::messages::{DriveEvent, DriveRefused, SubscribeDrives};
use crate::config::VolumesConfig;
use crate::disk::gpt;
use crate::store::{Kind, Store, StoreError};
use crate::words::DriveUse;

/// The answer of a handler that runs on: a future on the actor.
type Reply<T> = ResponseActFuture<VolumeManager, Result<T, VolumeError>>;

/// An answer known at once, as a [`Reply`].
fn reply<T: 'static>(res: Result<T, VolumeError>) -> Reply<T> {
    Box::pin(fut::ready(res))
}

/// Writes drive usage records off the actor thread in the order they were decided:
/// a write that finds a newer one of the same drive done already is skipped.
#[derive(Default)]
struct UseWriter {
    seq: u64,
    written: HashMap<String, Arc<Mutex<u64>>>,
}

impl UseWriter {
    /// The blocking job that stores (`None`: forgets) `drive_id`'s usage record.
    fn job(&mut self, store: Arc<Store>, drive_id: &str, u: Option<DriveUse>) -> impl FnOnce() -> Result<(), StoreError> + Send + 'static {
        self.seq += 1;
        let seq = self.seq;
        let written = self.written.entry(drive_id.to_string()).or_default().clone();
        let drive_id = drive_id.to_string();
        move || {
            let mut last = written.lock().unwrap_or_else(|p| p.into_inner());
            if *last > seq {
                return Ok(());
            }
            *last = seq;
            let res = match &u {
                Some(u) => store.put_in(Kind::Drive, &drive_id, u),
                None => store.remove_in(Kind::Drive, &drive_id),
            };
            if let Err(e) = &res {
                error!(drive.id = %drive_id, error = %e, "cannot store the drive's usage record");
            }
            res
        }
    }
}

/// The volume manager actor.
pub struct VolumeManager {
    state_dir: PathBuf,
    store: Option<Arc<Store>>,
    inventory: Addr<DriveInventory>,
    book: VolumeBook,
    /// Writes of drive usage records, off the actor thread, newest last.
    uses: UseWriter,
    reconciling: bool,
    /// Who hears of condition changes (the Kubernetes Event reporter).
    condition_subscribers: Vec<Recipient<VolumeConditionChanged>>,
    /// Who hears of changes to what a drive holds (the Drive object sync).
    volume_subscribers: Vec<Recipient<VolumesChanged>>,
    /// Callers of [`WaitReady`] waiting for start-up reconciliation.
    ready_waiters: Vec<tokio::sync::oneshot::Sender<()>>,
    /// Zeroes freed space in the background.
    cleaner: cleaner::Cleaner,
    /// Creates waiting for the cleaner's next step.
    clean_waiters: Vec<tokio::sync::oneshot::Sender<()>>,
    /// Whether a drive taken as blank is cleaned whole first.
    clean_blank_drives: bool,
    /// How long a create that fits only in space being cleaned waits for it.
    cleaning_wait: std::time::Duration,
    /// The longest a snapshot holds a frozen filesystem.
    freeze_limit: std::time::Duration,
    /// Evacuations: the move running, the moves done and failed, who hears of them.
    evacuations: evacuate::Evacuations,
}

impl VolumeManager {
    /// A manager keeping its store under `state_dir`.
    pub fn new(cfg: VolumesConfig, state_dir: PathBuf, inventory: Addr<DriveInventory>, auto_release: bool) -> VolumeManager {
        VolumeManager {
            cleaner: cleaner::Cleaner::new(cfg.cleaning_step),
            clean_waiters: Vec::new(),
            clean_blank_drives: cfg.clean_blank_drives,
            cleaning_wait: cfg.cleaning_wait,
            freeze_limit: cfg.freeze_limit,
            evacuations: evacuate::Evacuations::default(),
            state_dir,
            store: None,
            inventory,
            book: VolumeBook::new(cfg, auto_release),
            uses: UseWriter::default(),
            reconciling: false,
            condition_subscribers: Vec::new(),
            volume_subscribers: Vec::new(),
            ready_waiters: Vec::new(),
        }
    }

    /// A reader of the views the manager publishes for the cheap CSI calls.
    pub fn view_reader(&self) -> view::ViewReader {
        self.book.view_reader()
    }

    /// The book's guards, which the health poller's checks go through (one instance for
    /// the life of the process: a restart of the manager clears its claims, not them).
    pub fn guards(&self) -> Arc<Guards> {
        self.book.guards()
    }

    /// The store, once the book is ready.
    fn store(&self) -> Result<Arc<Store>, VolumeError> {
        self.store.clone().filter(|_| self.book.is_ready()).ok_or(VolumeError::NotReady)
    }

    /// Runs a blocking step for the claimed volume and stores the record it hands back;
    /// the claim is released once the record is in the book.
    fn run<T: Send + 'static>(&mut self, claim: Claim, id: String, job: impl FnOnce() -> Outcome<T> + Send + 'static) -> Reply<T> {
        self.run_with(claim, id, true, job)
    }

    /// [`run`](Self::run); `clear_findings`: the step changes what the checks of the
    /// volume look at, so their findings are stale.
    fn run_with<T: Send + 'static>(
        &mut self,
        claim: Claim,
        id: String,
        clear_findings: bool,
        job: impl FnOnce() -> Outcome<T> + Send + 'static,
    ) -> Reply<T> {
        let drive_id = self.book.drive_of(&id);
        let before = self.book.shown(&id);
        Box::pin(async move { tokio::task::spawn_blocking(job).await }.into_actor(self).then(move |joined, act, _| {
            drop(claim);
            let (record, res) = match joined {
                Ok(out) => (out.record, out.result),
                Err(e) => {
                    error!(volume.id = %id, error = %e, "volume operation panicked; the record is reloaded at restart");
                    let e = VolumeError::Panicked { volume_id: id.clone(), reason: e.to_string() };
                    // The book keeps the record as it was.
                    (act.book.records().find(|r| r.id == id).cloned(), Err(e))
                }
            };
            let freed = act.freed_by(&id, record.as_ref(), res.as_ref().err());
            if let Some((drive_id, extent)) = &freed {
                // Dirty before the record leaves the book: no placement ever sees the
                // extent free in between.
                act.book.add_dirty(drive_id, *extent);
            }
            for drive in act.book.finish(&id, before, record, clear_findings) {
                act.announce(&drive);
            }
            let written = drive_id.and_then(|d| act.settle_drive(&d));
            act.refresh(|r| r.id == id);
            act.book.forget_condition(&id);
            // The drive's usage record is stored before the call is answered.
            async move {
                if let Some(w) = written {
                    let _ = w.await;
                }
                res
            }
            .into_actor(act)
        }))
    }

    /// The extent a step freed, when the record `id` leaves the book with it (a delete,
    /// a create rolled back) while its drive is present: it is dirty until cleaned, and
    /// handed to the cleaner. Nothing for an adopted volume, or a create the GPT writer
    /// refused (it wrote nothing).
    fn freed_by(&mut self, id: &str, after: Option<&VolumeRecord>, err: Option<&VolumeError>) -> Option<(String, (u64, u64))> {
        if after.is_some() || err.is_some_and(|e| e.refused_drive().is_some()) {
            return None;
        }
        let rec = self.book.records().find(|r| r.id == id)?.clone();
        let loc = self.book.loc_of(&rec)?;
        self.cleaner.add(&rec.drive_id, loc, (rec.start, rec.size));
        Some((rec.drive_id, (rec.start, rec.size)))
    }

    /// Wakes the creates waiting for the cleaner.
    fn wake_clean_waiters(&mut self) {
        for w in self.clean_waiters.drain(..) {
            let _ = w.send(());
        }
    }

    /// Hands what start-up or a drive's reconciliation found dirty to the book and the
    /// cleaner.
    /// `hotplug`: the drives were read because they appeared (or changed) while running:
    /// a blank one is zeroed only after [`cleaner::BLANK_GRACE`].
    fn take_dirty(&mut self, found: Vec<startup::DriveDirty>, hotplug: bool) {
        for dd in found {
            let Some(loc) = self.book.drives().find(|d| d.id == dd.drive_id).map(|d| crate::words::DriveLoc { path: d.path.clone(), sector: d.logical_block_size }) else {
                continue;
            };
            // What the book holds dirty stays so: an extent freed while the drive was
            // read (a create rolled back meanwhile) is not lost; one the drive says is
            // clean already is found so by the cleaner and reported.
            let extents = crate::disk::clean::union(&dd.extents, &self.book.dirty_extents(&dd.drive_id));
            self.book.set_dirty(&dd.drive_id, extents.clone());
            match dd.expect {
                Some(expect) => {
                    let delay = (hotplug && expect == cleaner::Expect::Blank).then_some(cleaner::BLANK_GRACE);
                    self.cleaner.set(&dd.drive_id, loc, extents, expect, delay)
                }
                None => self.cleaner.set(&dd.drive_id, loc, Vec::new(), cleaner::Expect::AnyTable, None),
            }
        }
        self.wake_clean_waiters();
    }

    /// Recomputes the conditions of the matching volumes and tells the subscribers.
    fn refresh(&mut self, which: impl Fn(&VolumeRecord) -> bool) {
        for event in self.book.refresh(which) {
            self.condition_subscribers.retain(|s| s.try_send(event.clone()).is_ok() || s.connected());
        }
    }

    /// Tells the subscribers that what `drive_id` holds changed.
    fn announce(&mut self, drive_id: &str) {
        let event = VolumesChanged { drive_id: drive_id.to_string() };
        self.volume_subscribers.retain(|s| s.try_send(event.clone()).is_ok() || s.connected());
    }

    /// Stores a drive's usage record (`None`: forgets it) off the actor thread; the
    /// handle answers once it is written (awaiting it is up to the caller).
    fn write_use(&mut self, drive_id: &str, u: Option<DriveUse>) -> Option<tokio::task::JoinHandle<()>> {
        let store = self.store.clone()?;
        let job = self.uses.job(store, drive_id, u);
        Some(tokio::task::spawn_blocking(move || {
            let _ = job();
        }))
    }

    /// Completes the release of a releasing drive that holds no volume any more;
    /// answers the write of its usage record.
    fn settle_drive(&mut self, drive_id: &str) -> Option<tokio::task::JoinHandle<()>> {
        let u = self.book.settle_drive(drive_id)?;
        let written = self.write_use(drive_id, Some(u));
        self.announce(drive_id);
        written
    }

    /// One attempt of a claimed CreateVolume, on the drive placement picks now. When the
    /// GPT writer refuses that drive (it holds data drivelet did not write that the last
    /// probe had not seen), nothing is left of the attempt, the drive turns foreign at
    /// once (here, and in the inventory by [`DriveRefused`]), and the same CreateVolume
    /// goes on to the next candidate; `refused` says which drives were refused so far,
    /// for the answer when no candidate is left (RESOURCE_EXHAUSTED, never INTERNAL).
    /// A clone also claims its source (`held`, once claimed) until the copy is done.
    /// A create that fits only in space still being cleaned waits for the cleaner until
    /// `deadline`, then answers RESOURCE_EXHAUSTED naming that space.
    fn create_attempt(
        &mut self,
        m: CreateVolume,
        claim: Claim,
        store: Arc<Store>,
        mut refused: Vec<String>,
        mut held: Option<Claim>,
        deadline: std::time::Instant,
    ) -> Reply<VolumeRecord> {
        let rec = match self.book.plan_create(&m) {
            Ok(CreatePlan::Existing(rec)) => return reply(Ok(rec)),
            Ok(CreatePlan::New(rec)) => rec,
            Err(VolumeError::ResourceExhausted { .. }) if std::time::Instant::now() < deadline && self.book.fits_after_cleaning(&m) => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                self.clean_waiters.push(tx);
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                return Box::pin(
                    async move {
                        let _ = tokio::time::timeout(left, rx).await;
                    }
                    .into_actor(self)
                    .then(move |_, act, _| act.create_attempt(m, claim, store, refused, held, deadline)),
                );
            }
            Err(VolumeError::ResourceExhausted { reason }) if !refused.is_empty() => {
                let reason = format!("{reason}; refused when written to: {}", refused.join("; "));
                return reply(Err(VolumeError::ResourceExhausted { reason }));
            }
            Err(e) => return reply(Err(e)),
        };
        let id = rec.id.clone();
        let Some(loc) = self.book.loc_of(&rec) else {
            return reply(Err(VolumeError::DriveGoneDuringCreate { volume_id: id, drive_id: rec.drive_id }));
        };
        let from = match rec.clone_of.as_ref().or(rec.restored_from.as_ref()) {
            Some(src) => match self.book.clone_start(src, &m, &mut held) {
                Ok((source, loc)) => Some(clone::CloneFrom { source, loc, freeze: None, roots: Vec::new() }),
                Err(e) => return reply(Err(e)),
            },
            None => None,
        };
        let drive_id = rec.drive_id.clone();
        info!(volume.id = %rec.id, volume.name = %rec.name, drive.id = %rec.drive_id, volume.size = rec.size, volume.clone_of = ?rec.clone_of, "creating volume");
        self.book.reserve(rec.clone());
        let job_store = store.clone();
        Box::pin(self.run(claim, id.clone(), move || ops::create(&job_store, &loc, rec, from.as_ref())).then(move |res, act, _| {
            let Some(found) = res.as_ref().err().and_then(VolumeError::refused_drive) else {
                return reply(res);
            };
            warn!(volume.id = %id, drive.id = %drive_id, drive.reason = %found,
                  "the GPT writer refused the drive: it is foreign from now on; trying the next drive");
            act.book.drive_refused(&drive_id, found);
            act.inventory.do_send(DriveRefused { drive_id: drive_id.clone(), found: found.to_string() });
            refused.push(format!("drive {drive_id} holds {found}"));
            // The attempt's record is gone and the call is still this one: claim the
            // volume again for the next attempt.
            match act.book.claim(&id) {
                Ok(claim) => act.create_attempt(m, claim, store, refused, held, deadline),
                Err(_) => reply(Err(VolumeError::Busy { volume_id: id })),
            }
        }))
    }

    /// Claims a volume for a node call: ready, known, not busy; the drive when present.
    fn node_call(&mut self, id: &str, need_drive: bool) -> Result<(Claim, Arc<Store>, VolumeRecord, Option<crate::words::DriveLoc>), VolumeError> {
        let (rec, loc) = self.book.node_call(id, need_drive)?;
        let claim = self.book.claim(id)?;
        Ok((claim, self.store()?, rec, loc))
    }
}

impl Actor for VolumeManager {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.inventory.do_send(SubscribeDrives(ctx.address().recipient()));
        self.cleaner.start(ctx.address().recipient(), ctx.address().recipient());
        self.wait_for_inventory(ctx);
        ctx.run_interval(evacuate::EVACUATION_TICK, |act, ctx| act.evacuate_next(ctx));
    }
}

impl Supervised for VolumeManager {
    fn restarting(&mut self, _: &mut Context<Self>) {
        warn!(actor = "volumes", "restarting: rebuilding volumes from the store, the drives and the mounts");
        self.store = None;
        self.reconciling = false;
        self.evacuations.moving = None;
        self.book.reset();
    }
}

impl Handler<DriveEvent> for VolumeManager {
    type Result = ();
    fn handle(&mut self, ev: DriveEvent, ctx: &mut Context<Self>) {
        let (id, fx) = self.book.drive_event(ev);
        if let Some(u) = fx.save {
            self.write_use(&id, Some(u));
        }
        if let Some(d) = fx.forget {
            self.write_use(&d, None);
        }
        if let Some(d) = fx.announce {
            self.announce(&d);
        }
        if let Some(d) = fx.reread {
            self.reconcile_drive(d, ctx);
        }
        if !self.book.drives().any(|d| d.id == id) {
            self.cleaner.forget(&id);
        }
        self.refresh(|r| r.drive_id == id);
    }
}

impl Handler<cleaner::ExtentCleaned> for VolumeManager {
    type Result = ();
    fn handle(&mut self, m: cleaner::ExtentCleaned, _: &mut Context<Self>) {
        self.book.cleaned(&m.drive_id, m.extent);
        self.wake_clean_waiters();
        // The Drive object shows how far cleaning is.
        self.announce(&m.drive_id);
    }
}

impl Handler<cleaner::CleaningStalled> for VolumeManager {
    type Result = ();
    fn handle(&mut self, m: cleaner::CleaningStalled, ctx: &mut Context<Self>) {
        self.wake_clean_waiters();
        if !m.changed {
            return;
        }
        // The drive holds something else than the job was made for: read it again,
        // as when it appears, and clean what that finds by the same rules.
        let found = self.book.drives().find(|d| d.id == m.drive_id).cloned();
        if let Some(d) = found {
            self.book.reconciling_started(&d.id);
            self.reconcile_drive(d, ctx);
        }
    }
}

impl Handler<ListCleaning> for VolumeManager {
    type Result = MessageResult<ListCleaning>;
    fn handle(&mut self, _: ListCleaning, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.book.cleaning())
    }
}

impl Handler<VolumeChecked> for VolumeManager {
    type Result = ();
    fn handle(&mut self, m: VolumeChecked, _: &mut Context<Self>) {
        let id = m.volume_id.clone();
        if self.book.checked(m.volume_id, m.findings) {
            self.refresh(|r| r.id == id);
        }
    }
}

impl Handler<ReleaseDrive> for VolumeManager {
    type Result = Reply<DriveUse>;
    fn handle(&mut self, m: ReleaseDrive, _: &mut Context<Self>) -> Self::Result {
        let (plan, store) = match self.book.release(&m).and_then(|p| Ok((p, self.store()?))) {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        // Decided (and closed to placement) here; stored off the actor thread.
        let write_use = self.uses.job(store.clone(), &m.drive_id, Some(plan.usage.clone()));
        let job = move || -> Result<DriveUse, VolumeError> {
            for r in &plan.failed {
                store.put(&r.id, r).map_err(VolumeError::Store)?;
            }
            write_use().map_err(VolumeError::Store)?;
            Ok(plan.usage)
        };
        Box::pin(async move { tokio::task::spawn_blocking(job).await }.into_actor(self).map(move |res, act, _| {
            act.announce(&m.drive_id);
            act.refresh(|r| r.drive_id == m.drive_id);
            res.unwrap_or_else(|e| {
                let what = format!("write of the release of drive {}", m.drive_id);
                Err(VolumeError::Store(crate::store::StoreError::Txn { what, reason: e.to_string() }))
            })
        }))
    }
}

impl Handler<GetVolumeStatus> for VolumeManager {
    type Result = Result<VolumeStatus, VolumeError>;
    fn handle(&mut self, m: GetVolumeStatus, ctx: &mut Context<Self>) -> Self::Result {
        let status = self.book.status(&m.volume_id);
        if crate::failpoint::injected_failure("actor.volumes.stop") {
            warn!(actor = "volumes", "failure injected: stopping after this answer");
            ctx.stop();
        }
        status
    }
}

impl Handler<ListVolumeStatuses> for VolumeManager {
    type Result = Result<(Vec<VolumeStatus>, Option<String>), VolumeError>;
    fn handle(&mut self, m: ListVolumeStatuses, _: &mut Context<Self>) -> Self::Result {
        self.book.page_where(m.after.as_deref(), m.max, m.abnormal_only)
    }
}

impl Handler<GetStorageHealth> for VolumeManager {
    type Result = Result<Vec<conditions::StorageEntry>, VolumeError>;
    fn handle(&mut self, _: GetStorageHealth, _: &mut Context<Self>) -> Self::Result {
        self.book.storage_health()
    }
}

impl Handler<ListDriveUses> for VolumeManager {
    type Result = MessageResult<ListDriveUses>;
    fn handle(&mut self, _: ListDriveUses, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.book.drive_uses())
    }
}

impl Handler<VolumeStats> for VolumeManager {
    type Result = Reply<(VolumeStatus, Option<crate::disk::fs::Usage>)>;
    fn handle(&mut self, m: VolumeStats, _: &mut Context<Self>) -> Self::Result {
        let status = match self.book.status(&m.volume_id) {
            Ok(s) => s,
            Err(e) => return reply(Err(e)),
        };
        let rec = &status.record;
        let known = rec.staging.as_ref().is_some_and(|s| s.path == m.path) || rec.targets.contains_key(&m.path);
        let not_found = VolumeError::NotFound { volume_id: format!("{} at path {}", m.volume_id, m.path.display()) };
        if !known {
            // kubelet asks for a block volume at its own bind of the published device.
            let Some(loc) = self.book.loc_of(rec).filter(|_| rec.block) else { return reply(Err(not_found)) };
            let roots = self.book.allowed_roots().to_vec();
            let path = m.path;
            return Box::pin(
                async move {
                    let rec = status.record.clone();
                    let found = tokio::task::spawn_blocking(move || ops::is_device_of(&path, &roots, &loc, &rec)).await;
                    (status, found)
                }
                .into_actor(self)
                .map(move |(status, found), _, _| match found {
                    Ok(true) => Ok((status, None)),
                    _ => Err(not_found),
                }),
            );
        }
        if status.record.block {
            return reply(Ok((status, None)));
        }
        let path = m.path;
        let roots = self.book.allowed_roots().to_vec();
        let usage = move || match crate::disk::beneath::open(&path, &roots) {
            Ok(Some(node)) => node.usage(),
            Ok(None) => Err(crate::disk::DiskError::NotFound { device: path.clone(), what: "the volume's path".into() }),
            Err(crate::disk::beneath::PathError::Refused(reason)) => Err(crate::disk::DiskError::invalid(reason)),
            Err(crate::disk::beneath::PathError::Disk(e)) => Err(e),
        };
        Box::pin(async move { tokio::task::spawn_blocking(usage).await }.into_actor(self).map(
            move |res, _, _| match res {
                Ok(Ok(u)) => Ok((status, Some(u))),
                Ok(Err(e)) => {
                    let mut st = status;
                    st.condition.abnormal = true;
                    st.condition.message = format!("{}; usage cannot be read: {e}", st.condition.message);
                    Ok((st, None))
                }
                Err(e) => Err(VolumeError::Panicked { volume_id: status.record.id.clone(), reason: e.to_string() }),
            },
        ))
    }
}

impl Handler<CreateVolume> for VolumeManager {
    type Result = Reply<VolumeRecord>;
    fn handle(&mut self, m: CreateVolume, _: &mut Context<Self>) -> Self::Result {
        let id = gpt::volume_partition_guid(&m.name).to_string();
        match self.book.claim(&id).and_then(|c| Ok((c, self.store()?))) {
            Ok((claim, store)) => {
                let deadline = std::time::Instant::now() + self.cleaning_wait;
                self.create_attempt(m, claim, store, Vec::new(), None, deadline)
            }
            Err(e) => reply(Err(e)),
        }
    }
}

impl Handler<CreateSnapshot> for VolumeManager {
    type Result = Reply<snapshot::SnapshotRecord>;
    fn handle(&mut self, m: CreateSnapshot, _: &mut Context<Self>) -> Self::Result {
        let id = gpt::snapshot_partition_guid(&m.name).to_string();
        let (claim, store) = match self.book.claim(&id).and_then(|c| Ok((c, self.store()?))) {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        let shown = |rec: &VolumeRecord| {
            snapshot::SnapshotRecord::of(rec, None).ok_or_else(|| VolumeError::Busy { volume_id: rec.id.clone() })
        };
        let (rec, from) = match self.book.plan_snapshot(&m, self.freeze_limit) {
            Ok((CreatePlan::Existing(rec), _)) => return reply(shown(&rec)),
            Ok((CreatePlan::New(rec), Some(from))) => (rec, from),
            Ok((CreatePlan::New(rec), None)) => return reply(Err(VolumeError::Busy { volume_id: rec.id })),
            Err(e) => return reply(Err(e)),
        };
        // The source is held for the copy: no stage, unstage or delete of it meanwhile.
        let held = match self.book.claim(&m.source_volume_id) {
            Ok(c) => c,
            Err(e) => return reply(Err(e)),
        };
        let Some(loc) = self.book.loc_of(&rec) else {
            return reply(Err(VolumeError::DriveGoneDuringCreate { volume_id: id, drive_id: rec.drive_id }));
        };
        info!(snapshot.id = %rec.id, snapshot.name = %rec.name, volume.id = %m.source_volume_id, drive.id = %rec.drive_id,
              snapshot.size = rec.size, snapshot.freeze = from.freeze.is_some(), "taking snapshot");
        self.book.reserve(rec.clone());
        Box::pin(self.run(claim, id, move || ops::create(&store, &loc, rec, Some(&from))).map(move |res, _, _| {
            drop(held);
            res.and_then(|r| shown(&r))
        }))
    }
}

impl Handler<DeleteSnapshot> for VolumeManager {
    type Result = Reply<()>;
    fn handle(&mut self, m: DeleteSnapshot, _: &mut Context<Self>) -> Self::Result {
        let id = m.snapshot_id;
        let (claim, store) = match self.book.claim(&id).and_then(|c| Ok((c, self.store()?))) {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        let rec = match self.book.plan_delete_snapshot(&id) {
            Ok(Some(rec)) => rec,
            Ok(None) => return reply(Ok(())),
            Err(e) => return reply(Err(e)),
        };
        let loc = self.book.loc_of(&rec);
        info!(snapshot.id = %id, drive.id = %rec.drive_id, "deleting snapshot");
        let guards = self.book.guards();
        self.run(claim, id, move || ops::delete(&store, &guards, loc.as_ref(), rec))
    }
}

impl Handler<ListSnapshots> for VolumeManager {
    type Result = Result<Vec<snapshot::SnapshotRecord>, VolumeError>;
    fn handle(&mut self, _: ListSnapshots, _: &mut Context<Self>) -> Self::Result {
        self.book.snapshots()
    }
}

impl Handler<DeleteVolume> for VolumeManager {
    type Result = Reply<()>;
    fn handle(&mut self, m: DeleteVolume, _: &mut Context<Self>) -> Self::Result {
        let id = m.volume_id;
        let (claim, store) = match self.book.claim(&id).and_then(|c| Ok((c, self.store()?))) {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        let Some(rec) = self.book.plan_delete(&id) else { return reply(Ok(())) };
        let loc = self.book.loc_of(&rec);
        info!(volume.id = %id, drive.id = %rec.drive_id, "deleting volume");
        let guards = self.book.guards();
        self.run(claim, id, move || ops::delete(&store, &guards, loc.as_ref(), rec))
    }
}

impl Handler<StageVolume> for VolumeManager {
    type Result = Reply<()>;
    fn handle(&mut self, m: StageVolume, _: &mut Context<Self>) -> Self::Result {
        let (claim, store, rec, loc) = match self.node_call(&m.volume_id, true) {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        let roots = self.book.allowed_roots().to_vec();
        let guards = self.book.guards();
        self.run(claim, m.volume_id, move || ops::stage(&store, &guards, loc.as_ref(), &roots, rec, m.args))
    }
}

impl Handler<UnstageVolume> for VolumeManager {
    type Result = Reply<()>;
    fn handle(&mut self, m: UnstageVolume, _: &mut Context<Self>) -> Self::Result {
        match self.node_call(&m.volume_id, false) {
            Ok((claim, store, rec, loc)) => {
                let guards = self.book.guards();
                let roots = self.book.allowed_roots().to_vec();
                self.run(claim, m.volume_id, move || ops::unstage(&store, &guards, loc.as_ref(), &roots, rec, &m.path))
            }
            Err(e) => reply(Err(e)),
        }
    }
}

impl Handler<PublishVolume> for VolumeManager {
    type Result = Reply<()>;
    fn handle(&mut self, m: PublishVolume, _: &mut Context<Self>) -> Self::Result {
        let (claim, store, rec, loc) = match self.node_call(&m.volume_id, true) {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        let roots = self.book.allowed_roots().to_vec();
        self.run(claim, m.volume_id, move || ops::publish(&store, loc.as_ref(), &roots, rec, m.args))
    }
}

impl Handler<UnpublishVolume> for VolumeManager {
    type Result = Reply<()>;
    fn handle(&mut self, m: UnpublishVolume, _: &mut Context<Self>) -> Self::Result {
        match self.node_call(&m.volume_id, false) {
            Ok((claim, store, rec, loc)) => {
                let roots = self.book.allowed_roots().to_vec();
                self.run(claim, m.volume_id, move || ops::unpublish(&store, loc.as_ref(), &roots, rec, &m.target))
            }
            Err(e) => reply(Err(e)),
        }
    }
}

impl Handler<AttachVolume> for VolumeManager {
    type Result = Reply<PublishContext>;
    fn handle(&mut self, m: AttachVolume, _: &mut Context<Self>) -> Self::Result {
        let checked = self.book.attach_refusal(&m).and_then(|rec| Ok((self.book.claim(&m.volume_id)?, self.store()?, rec)));
        let (claim, store, rec) = match checked {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        let loc = self.book.loc_of(&rec);
        let guid = rec.part_guid;
        let (id, node) = (m.volume_id, m.node_id);
        if rec.published_node.is_none() {
            info!(volume.id = %id, node.name = %node, "attaching volume to node");
        }
        Box::pin(
            self.run(claim, id, move || ops::controller_publish(&store, loc.as_ref(), rec, node))
                .map(move |res, _, _| res.map(|device| PublishContext { device, part_guid: guid })),
        )
    }
}

impl Handler<AttachPreview> for VolumeManager {
    type Result = Result<(), VolumeError>;
    fn handle(&mut self, m: AttachPreview, _: &mut Context<Self>) -> Self::Result {
        self.book.attach_refusal(&m.0).map(|_| ())
    }
}

impl Handler<AdoptVolume> for VolumeManager {
    type Result = Reply<VolumeRecord>;
    fn handle(&mut self, m: AdoptVolume, _: &mut Context<Self>) -> Self::Result {
        let shown = m.path.display().to_string();
        let refuse = move |reason: String| VolumeError::InvalidArgument { reason: format!("cannot adopt {shown}: {reason}") };
        // The directory is looked at off the actor thread (statvfs may hang on a sick
        // filesystem); the book decides once it is known.
        let path = m.path.clone();
        let probe = move || -> Result<_, String> {
            let canonical = std::fs::canonicalize(&path).map_err(|e| e.to_string())?;
            if !canonical.is_dir() || canonical == std::path::Path::new("/") {
                return Err("not a directory other than /; block local volumes cannot be adopted".into());
            }
            let devnum = crate::disk::whole_disk_of(&canonical);
            let size = crate::disk::fs::usage(&canonical).map(|u| u.total_bytes).unwrap_or(0);
            Ok((canonical, devnum, size))
        };
        Box::pin(async move { tokio::task::spawn_blocking(probe).await }.into_actor(self).then(move |probed, act, _| {
            match probed.map_err(|e| e.to_string()).and_then(|p| p) {
                Ok((canonical, devnum, size)) => act.adopt(m, &canonical, devnum, size),
                Err(e) => reply(Err(refuse(e))),
            }
        }))
    }
}

impl VolumeManager {
    /// Adopts the probed directory `canonical` as the book decides.
    fn adopt(&mut self, m: AdoptVolume, canonical: &std::path::Path, devnum: Option<(u32, u32)>, size: u64) -> Reply<VolumeRecord> {
        let rec = match self.book.plan_adopt(&m, canonical, devnum, size) {
            Ok(CreatePlan::Existing(rec)) => return reply(Ok(rec)),
            Ok(CreatePlan::New(rec)) => rec,
            Err(e) => return reply(Err(e)),
        };
        let (claim, store) = match self.book.claim(&m.volume_id).and_then(|c| Ok((c, self.store()?))) {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        info!(volume.id = %rec.id, volume.path = ?rec.adopted.as_ref().map(|a| &a.path), drive.id = %rec.drive_id, "adopting volume");
        self.run(claim, m.volume_id, move || match store.put(&rec.id, &rec) {
            Ok(()) => Outcome { record: Some(rec.clone()), result: Ok(rec) },
            Err(e) => Outcome { record: None, result: Err(VolumeError::Store(e)) },
        })
    }
}

impl Handler<SubscribeConditions> for VolumeManager {
    type Result = ();
    fn handle(&mut self, m: SubscribeConditions, _: &mut Context<Self>) {
        self.condition_subscribers.push(m.0);
    }
}

impl Handler<SubscribeVolumes> for VolumeManager {
    type Result = ();
    fn handle(&mut self, m: SubscribeVolumes, _: &mut Context<Self>) {
        self.volume_subscribers.push(m.0);
    }
}

impl Handler<ExpandVolume> for VolumeManager {
    type Result = Reply<(u64, bool)>;
    fn handle(&mut self, m: ExpandVolume, _: &mut Context<Self>) -> Self::Result {
        let checked = self.book.expand_check(&m).and_then(|x| Ok((self.book.claim(&m.volume_id)?, self.store()?, x)));
        let (claim, store, (rec, loc, new_size)) = match checked {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        let node_step = !rec.block;
        // The space is the volume's from now on: a create placed meanwhile sees it taken.
        self.book.reserve(VolumeRecord { size: new_size, ..rec.clone() });
        Box::pin(
            self.run(claim, m.volume_id, move || ops::expand(&store, &loc, rec, new_size))
                .map(move |res, _, _| res.map(|size| (size, node_step))),
        )
    }
}

impl Handler<NodeExpandVolume> for VolumeManager {
    type Result = Reply<u64>;
    fn handle(&mut self, m: NodeExpandVolume, _: &mut Context<Self>) -> Self::Result {
        let checked = self.node_call(&m.volume_id, true).and_then(|(claim, _, rec, loc)| {
            let loc = VolumeBook::node_expand_check(&m, &rec, loc)?;
            Ok((claim, rec, loc))
        });
        match checked {
            Ok((claim, rec, loc)) => {
                let roots = self.book.allowed_roots().to_vec();
                self.run(claim, m.volume_id, move || ops::node_expand(&loc, &roots, rec))
            }
            Err(e) => reply(Err(e)),
        }
    }
}

impl Handler<DetachVolume> for VolumeManager {
    type Result = Reply<()>;
    fn handle(&mut self, m: DetachVolume, _: &mut Context<Self>) -> Self::Result {
        let planned = self.store().and_then(|store| Ok((store, self.book.plan_detach(&m)?)));
        let (store, (rec, attached)) = match planned {
            Ok((store, Some(plan))) => (store, plan),
            Ok((_, None)) => return reply(Ok(())),
            Err(e) => return reply(Err(e)),
        };
        let claim = match self.book.claim(&m.volume_id) {
            Ok(c) => c,
            Err(e) => return reply(Err(e)),
        };
        // The store commit runs off the actor thread; the checks' findings still hold.
        self.run_with(claim, m.volume_id, false, move || {
            let result = store.put(&rec.id, &rec).map_err(VolumeError::Store);
            let record = match &result {
                Ok(()) => {
                    info!(volume.id = %rec.id, node.name = %attached, "volume detached from node");
                    rec
                }
                Err(_) => VolumeRecord { published_node: Some(attached), ..rec },
            };
            Outcome { record: Some(record), result }
        })
    }
}

impl Handler<GetVolume> for VolumeManager {
    type Result = Result<VolumeRecord, VolumeError>;
    fn handle(&mut self, m: GetVolume, _: &mut Context<Self>) -> Self::Result {
        self.book.visible(&m.volume_id).cloned()
    }
}

impl Handler<ListHeld> for VolumeManager {
    type Result = MessageResult<ListHeld>;
    fn handle(&mut self, _: ListHeld, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.book.records().cloned().collect())
    }
}

impl Handler<ListVolumes> for VolumeManager {
    type Result = MessageResult<ListVolumes>;
    fn handle(&mut self, _: ListVolumes, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.book.records().filter(|r| r.is_volume()).cloned().collect())
    }
}

impl Handler<VolumesReady> for VolumeManager {
    type Result = bool;
    fn handle(&mut self, _: VolumesReady, _: &mut Context<Self>) -> bool {
        self.book.is_ready()
    }
}

impl Handler<WaitReady> for VolumeManager {
    type Result = ResponseFuture<bool>;
    fn handle(&mut self, _: WaitReady, _: &mut Context<Self>) -> Self::Result {
        if self.book.is_ready() {
            return Box::pin(async { true });
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.ready_waiters.push(tx);
        Box::pin(async move { rx.await.is_ok() })
    }
}
