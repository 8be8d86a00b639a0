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
//!   volume on it is handed out (created or adopted), deleted or failed, a move off it
//!   starts, ends or fails, a volume on it is staged or unstaged while it is being
//!   evacuated, or its usage record changes (the `Drive` objects list a
//!   drive's volumes and where its evacuation stands);
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
//! The actor is a thin shell. What lives where:
//! - this file: the actor's fields, its start, and the few things every handler shares
//!   ([`VolumeManager::run`]: a disk step off the actor thread, its record handed back
//!   to the book; the fan-out to subscribers; the hand-over of freed space to the
//!   cleaner; the ordered write of a drive's usage record);
//! - [`calls`]: the handlers, one file per feature (controller, node, snapshots,
//!   drives, evacuation, listing, start-up), each a few lines: ask the book, run the
//!   steps it asks for;
//! - [`messages`]: every message a front sends, and the answers they carry;
//! - [`book`]: the state and every decision, plain code; [`model`], [`conditions`],
//!   [`placement`], [`reconcile`], [`usage`]: the pure rules it uses; [`view`]: what it
//!   publishes;
//! - [`steps`]: the disk steps, run off the actor thread; [`cleaner`]: the thread that
//!   zeroes freed space; [`notes`]: the keeper of the drives' notes.
//!
//! Only [`calls`] reaches back into this file (the handlers are the shell's); every
//! other module depends on its siblings alone.
//!
//! A create: the handler claims the volume id the book derives from the name
//! ([`book::CreateCall`]), the book decides the attempt ([`book::VolumeBook::begin_create`]:
//! the existing volume, a refusal, a wait for the cleaner, or a new record placed and
//! reserved), [`steps::create`] writes it off the actor thread, and [`VolumeManager::run`]
//! hands the record back to the book; a drive the GPT writer refused sends the same call
//! to the next drive.
//!
//! An evacuation: [`EvacuateDrive`] is decided by the book (room for everything, the
//! intent in the drive's usage record, stored); every [`evacuate::EVACUATION_TICK`] and
//! after each move the shell asks the book for the next move
//! ([`book::VolumeBook::start_move`]), runs [`steps::moves`] off the actor thread, and
//! hands the end back ([`book::VolumeBook::move_ended`]): the freed extent goes to the
//! cleaner, subscribers hear [`VolumeMoved`]; the drive is released when empty.

pub(crate) mod book;
pub(crate) mod calls;
pub(crate) mod cleaner;
pub(crate) mod conditions;
/// What an admin's listings show of a volume (ctl volumes, the Drive objects, kubectl drivelet volumes).
pub(crate) mod detail;
/// VolumeError: one variant per refusal, in plain words naming the volume.
pub mod error;
pub mod evacuate;
pub(crate) mod messages;
pub mod model;
pub(crate) mod notes;
pub(crate) mod placement;
pub(crate) mod reconcile;
/// Snapshots as the volume manager keeps them: a book record marked as one.
pub mod snapshot;
pub mod steps;
pub(crate) mod usage;
pub(crate) mod view;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use actix::prelude::*;
use tracing::{error, warn};

pub use self::book::claim::Guards;
pub use self::detail::{volume_detail, volume_kind, volume_state, VolumeDetail};
pub use self::error::VolumeError;
pub use self::evacuate::{Evacuation, MovedVolume, PendingMove, PendingState};
pub use self::messages::*;
pub(crate) use self::steps::startup;

use self::book::{Claim, VolumeBook};
use self::model::VolumeRecord;
use self::steps::uses::UseWriter;
use self::steps::Outcome;
use super::inventory::DriveInventory;
use super::messages::SubscribeDrives;
use crate::config::VolumesConfig;
use crate::disk::clean::Extent;
use crate::store::{Store, StoreError};
use crate::words::DriveUse;

/// The answer of a handler that runs on: a future on the actor.
type Reply<T> = ResponseActFuture<VolumeManager, Result<T, VolumeError>>;

/// An answer known at once, as a [`Reply`].
fn reply<T: 'static>(res: Result<T, VolumeError>) -> Reply<T> {
    Box::pin(fut::ready(res))
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
    /// Who hears of each move of an evacuation.
    move_subscribers: Vec<Recipient<VolumeMoved>>,
    /// Who hears of clones of volumes in use (made or refused).
    clone_subscribers: Vec<Recipient<messages::CloneNotice>>,
    /// Callers of [`WaitReady`] waiting for start-up reconciliation.
    ready_waiters: Vec<tokio::sync::oneshot::Sender<()>>,
    /// Zeroes freed space in the background.
    cleaner: cleaner::Cleaner,
    /// Creates waiting for the cleaner's next step.
    clean_waiters: Vec<tokio::sync::oneshot::Sender<()>>,
    /// Whether a drive taken as blank is cleaned whole first.
    clean_blank_drives: bool,
    /// The longest a snapshot holds a frozen filesystem.
    freeze_limit: std::time::Duration,
}

impl VolumeManager {
    /// A manager keeping its store under `state_dir`.
    pub fn new(cfg: VolumesConfig, state_dir: PathBuf, inventory: Addr<DriveInventory>, auto_release: bool) -> VolumeManager {
        let journal = crate::disk::freeze::Journal::under(&state_dir);
        VolumeManager {
            cleaner: cleaner::Cleaner::new(cfg.cleaning_step),
            clean_waiters: Vec::new(),
            clean_blank_drives: cfg.clean_blank_drives,
            freeze_limit: cfg.freeze_limit,
            state_dir,
            store: None,
            inventory,
            book: VolumeBook::new(cfg, auto_release).with_freeze_journal(journal),
            uses: UseWriter::default(),
            reconciling: false,
            condition_subscribers: Vec::new(),
            volume_subscribers: Vec::new(),
            move_subscribers: Vec::new(),
            clone_subscribers: Vec::new(),
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

    /// Claims volume `id` for one call, with the store its steps write to.
    fn claim(&self, id: &str) -> Result<(Claim, Arc<Store>), VolumeError> {
        let claim = self.book.claim(id)?;
        Ok((claim, self.store()?))
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
            // Dirty before the record leaves the book: no placement ever sees the
            // extent free in between.
            if let Some((drive_id, extent)) = act.book.freed_by(&id, record.as_ref(), res.as_ref().err()) {
                act.clean_freed(&drive_id, extent);
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

    /// Hands an extent freed on `drive_id` to the cleaner: dirty in the book until it
    /// is zeroed. Nothing while the drive is absent (it is read again when it is back).
    fn clean_freed(&mut self, drive_id: &str, extent: Extent) {
        if let Some(loc) = self.book.free_extent(drive_id, extent) {
            self.cleaner.add(drive_id, loc, extent);
        }
    }

    /// Wakes the creates waiting for the cleaner.
    fn wake_clean_waiters(&mut self) {
        for w in self.clean_waiters.drain(..) {
            let _ = w.send(());
        }
    }

    /// Recomputes the conditions of the matching volumes and tells the subscribers.
    fn refresh(&mut self, which: impl Fn(&VolumeRecord) -> bool) {
        for event in self.book.refresh(which) {
            super::tell_all(&mut self.condition_subscribers, &event);
        }
    }

    /// Tells the subscribers that what `drive_id` holds changed.
    fn announce(&mut self, drive_id: &str) {
        super::tell_all(&mut self.volume_subscribers, &VolumesChanged { drive_id: drive_id.to_string() });
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

    /// Stores a drive's usage record the book just decided (`None`: forgets it), off
    /// the actor thread; the future answers once it is written. `what` names the change
    /// for an error ("cordon").
    fn store_use(&mut self, drive_id: &str, u: Option<DriveUse>, what: &'static str) -> Result<impl Future<Output = Result<(), VolumeError>>, VolumeError> {
        let job = self.uses.job(self.store()?, drive_id, u);
        Ok(off_thread(drive_id, what, move || job().map_err(VolumeError::Store)))
    }

    /// Completes the release of a releasing drive that holds no volume any more;
    /// answers the write of its usage record.
    fn settle_drive(&mut self, drive_id: &str) -> Option<tokio::task::JoinHandle<()>> {
        let u = self.book.settle_drive(drive_id)?;
        let written = self.write_use(drive_id, Some(u));
        self.announce(drive_id);
        written
    }
}

/// Runs a store write about drive `drive_id` off the actor thread; `what` names the
/// change for an error ("release").
fn off_thread<T: Send + 'static>(
    drive_id: &str,
    what: &'static str,
    job: impl FnOnce() -> Result<T, VolumeError> + Send + 'static,
) -> impl Future<Output = Result<T, VolumeError>> {
    let drive_id = drive_id.to_string();
    async move {
        tokio::task::spawn_blocking(job).await.unwrap_or_else(|e| {
            let what = format!("write of the {what} of drive {drive_id}");
            Err(VolumeError::Store(StoreError::Txn { what, reason: e.to_string() }))
        })
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
        self.book.reset();
    }
}

#[cfg(doc)]
use super::messages::{DriveEvent, DriveRefused};
