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
//!   take new volumes.

pub mod model;
pub mod ops;
pub mod reconcile;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use tracing::{error, info, warn};

use self::model::{CapacityRange, Candidate, NoRoom, Refusal, VolumeRecord, VolumeState};
use self::ops::{DriveLoc, Outcome, PublishArgs, StageArgs};
use super::inventory::classify::DriveClass;
use super::inventory::model::{Drive, LayoutKind};
use super::inventory::DriveInventory;
use super::messages::{DriveEvent, GetInventoryStatus, ListDrives, SubscribeDrives};
use crate::config::{Media, VolumesConfig};
use crate::disk::{gpt, DiskError};
use crate::store::{Store, StoreError};

/// Errors of volume operations; each maps to one CSI code in `grpc::status`.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// No volume with that id.
    #[error("volume {volume_id} does not exist")]
    NotFound {
        /// The id asked for.
        volume_id: String,
    },
    /// The request is malformed or cannot apply to this volume.
    #[error("{reason}")]
    InvalidArgument {
        /// What is wrong.
        reason: String,
    },
    /// A volume with this name or at this path exists with other properties.
    #[error("volume {volume} {reason}")]
    AlreadyExists {
        /// Volume name or id.
        volume: String,
        /// What differs.
        reason: String,
    },
    /// No drive has room (or none is eligible) now.
    #[error("cannot place the volume: {reason}")]
    ResourceExhausted {
        /// Why.
        reason: String,
    },
    /// The capacity range can never be met here.
    #[error("capacity range cannot be met: {reason}")]
    OutOfRange {
        /// Why.
        reason: String,
    },
    /// The volume is not in a state that allows the call.
    #[error("volume {volume_id} {reason}")]
    FailedPrecondition {
        /// The volume.
        volume_id: String,
        /// Why, and what to do.
        reason: String,
    },
    /// Another operation on the volume is in flight.
    #[error("another operation on volume {volume_id} is in progress; retry")]
    Aborted {
        /// The volume.
        volume_id: String,
    },
    /// Start-up reconciliation has not finished.
    #[error("the volume manager is still starting; retry shortly")]
    NotReady,
    /// A disk step failed.
    #[error("volume {volume_id}: cannot {op}: {source}")]
    Disk {
        /// The volume.
        volume_id: String,
        /// The step.
        op: &'static str,
        /// The OS error.
        source: DiskError,
    },
    /// The store failed.
    #[error(transparent)]
    Store(StoreError),
}

impl VolumeError {
    /// A state-machine refusal for a volume.
    pub fn refused(volume_id: &str, r: Refusal) -> VolumeError {
        match r {
            Refusal::BeingCreated | Refusal::BeingDeleted => VolumeError::Aborted { volume_id: volume_id.to_string() },
            r => VolumeError::FailedPrecondition { volume_id: volume_id.to_string(), reason: r.to_string() },
        }
    }
}

/// Command: create (or return the existing) volume with this name.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<VolumeRecord, VolumeError>")]
pub struct CreateVolume {
    /// CSI name.
    pub name: String,
    /// Capacity bounds.
    pub range: CapacityRange,
    /// Media, `None` for any.
    pub media: Option<Media>,
    /// Layout.
    pub layout: LayoutKind,
    /// Every capability is block access.
    pub block: bool,
    /// Filesystem for mount access (validated ext4/xfs, or empty for the default).
    pub fs_type: String,
    /// The StorageClass parameters as given.
    pub parameters: BTreeMap<String, String>,
}

/// Command: delete a volume (idempotent).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), VolumeError>")]
pub struct DeleteVolume {
    /// Volume id.
    pub volume_id: String,
}

/// Command: NodeStageVolume.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), VolumeError>")]
pub struct StageVolume {
    /// Volume id.
    pub volume_id: String,
    /// What to do.
    pub args: StageArgs,
}

/// Command: NodeUnstageVolume.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), VolumeError>")]
pub struct UnstageVolume {
    /// Volume id.
    pub volume_id: String,
    /// Staging path.
    pub path: PathBuf,
}

/// Command: NodePublishVolume.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), VolumeError>")]
pub struct PublishVolume {
    /// Volume id.
    pub volume_id: String,
    /// What to do.
    pub args: PublishArgs,
}

/// Command: NodeUnpublishVolume.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), VolumeError>")]
pub struct UnpublishVolume {
    /// Volume id.
    pub volume_id: String,
    /// Target path.
    pub target: PathBuf,
}

/// Query: one volume.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<VolumeRecord, VolumeError>")]
pub struct GetVolume {
    /// Volume id.
    pub volume_id: String,
}

/// Query: every volume, by id.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Vec<VolumeRecord>")]
pub struct ListVolumes;

/// Query: whether start-up reconciliation is done.
#[derive(Message, Debug, Clone)]
#[rtype(result = "bool")]
pub struct VolumesReady;

/// The volume manager actor.
pub struct VolumeManager {
    cfg: VolumesConfig,
    state_dir: PathBuf,
    store: Option<Arc<Store>>,
    inventory: Addr<DriveInventory>,
    /// Present drives by stable id.
    drives: BTreeMap<String, Drive>,
    book: BTreeMap<String, VolumeRecord>,
    busy: HashSet<String>,
    locks: HashMap<String, Arc<Mutex<()>>>,
    ready: bool,
    reconciling: bool,
}

fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl VolumeManager {
    /// A manager keeping its store under `state_dir`.
    pub fn new(cfg: VolumesConfig, state_dir: PathBuf, inventory: Addr<DriveInventory>) -> VolumeManager {
        VolumeManager {
            cfg,
            state_dir,
            store: None,
            inventory,
            drives: BTreeMap::new(),
            book: BTreeMap::new(),
            busy: HashSet::new(),
            locks: HashMap::new(),
            ready: false,
            reconciling: false,
        }
    }

    fn lock_of(&mut self, drive_id: &str) -> Arc<Mutex<()>> {
        self.locks.entry(drive_id.to_string()).or_default().clone()
    }

    fn loc_of(&self, drive_id: &str) -> Option<DriveLoc> {
        self.drives.get(drive_id).map(|d| DriveLoc { path: d.path.clone(), sector: d.logical_block_size })
    }

    /// Checks readiness and busyness, and marks the volume busy.
    fn claim(&mut self, id: &str) -> Result<Arc<Store>, VolumeError> {
        let store = match (&self.store, self.ready) {
            (Some(s), true) => s.clone(),
            _ => return Err(VolumeError::NotReady),
        };
        if !self.busy.insert(id.to_string()) {
            return Err(VolumeError::Aborted { volume_id: id.to_string() });
        }
        Ok(store)
    }

    /// Runs a blocking step for volume `id` and stores the record it hands back.
    fn run<T: Send + 'static>(
        &mut self,
        id: String,
        job: impl FnOnce() -> Outcome<T> + Send + 'static,
    ) -> ResponseActFuture<Self, Result<T, VolumeError>> {
        Box::pin(async move { tokio::task::spawn_blocking(job).await }.into_actor(self).map(move |joined, act, _| {
            act.busy.remove(&id);
            match joined {
                Ok(out) => {
                    match out.record {
                        Some(r) => {
                            act.book.insert(r.id.clone(), r);
                        }
                        None => {
                            act.book.remove(&id);
                        }
                    }
                    out.result
                }
                Err(e) => {
                    error!(volume.id = %id, error = %e, "volume operation panicked; the record is reloaded at restart");
                    Err(VolumeError::FailedPrecondition { volume_id: id, reason: format!("operation failed unexpectedly: {e}") })
                }
            }
        }))
    }

    fn candidates(&self) -> Vec<Candidate<'_>> {
        self.drives
            .values()
            .filter(|d| d.class == DriveClass::Managed)
            .map(|d| {
                let mut used: Vec<(u64, u64)> =
                    self.book.values().filter(|r| r.drive_id == d.id).map(|r| (r.start, r.size)).collect();
                used.extend(d.extents.iter().copied());
                Candidate { drive: d, used, closed: false }
            })
            .collect()
    }

    fn create(&mut self, m: CreateVolume) -> Result<(VolumeRecord, bool), VolumeError> {
        let guid = gpt::volume_partition_guid(&m.name);
        let id = guid.to_string();
        let fs_type = if m.block { String::new() } else if m.fs_type.is_empty() { self.cfg.default_fs.clone() } else { m.fs_type.clone() };
        if let Some(rec) = self.book.get(&id) {
            return match rec.state {
                VolumeState::Deleting => Err(VolumeError::FailedPrecondition {
                    volume_id: id,
                    reason: "is being deleted; retry CreateVolume once DeleteVolume finished".into(),
                }),
                VolumeState::Creating => Ok((rec.clone(), true)),
                _ => {
                    let same_kind = rec.rebuilt || (rec.block == m.block && (m.block || rec.fs_type == fs_type));
                    let same_params = rec.rebuilt || rec.parameters == m.parameters;
                    if !m.range.admits(rec.size) {
                        Err(VolumeError::AlreadyExists {
                            volume: m.name,
                            reason: format!("exists with {} bytes, outside the requested capacity range", rec.size),
                        })
                    } else if !same_kind || !same_params || rec.layout != m.layout {
                        Err(VolumeError::AlreadyExists {
                            volume: m.name,
                            reason: "exists with different parameters or access type".into(),
                        })
                    } else {
                        Ok((rec.clone(), false))
                    }
                }
            };
        }
        let minimum = model::minimum_size(m.block, &fs_type);
        let size = model::size_for(m.range, self.cfg.default_size, minimum).map_err(|reason| VolumeError::OutOfRange { reason })?;
        let want = if m.layout == LayoutKind::Drive { m.range.required.max(minimum) } else { size };
        let p = model::place(&self.candidates(), m.media, m.layout, want).map_err(|e| match e {
            NoRoom::TooBig(reason) => VolumeError::OutOfRange { reason },
            NoRoom::Full(reason) => VolumeError::ResourceExhausted { reason },
        })?;
        if m.layout == LayoutKind::Drive && m.range.limit != 0 && p.size > m.range.limit {
            return Err(VolumeError::OutOfRange {
                reason: format!("a whole drive here is {} bytes, above limit_bytes {}", p.size, m.range.limit),
            });
        }
        let media = self.drives.get(&p.drive_id).map(|d| d.media).unwrap_or(Media::Virtual);
        let rec = VolumeRecord {
            id,
            name: m.name,
            drive_id: p.drive_id,
            part_guid: guid,
            start: p.start,
            size: p.size,
            layout: m.layout,
            media,
            block: m.block,
            fs_type,
            parameters: m.parameters,
            state: VolumeState::Creating,
            formatted: false,
            staging: None,
            targets: BTreeMap::new(),
            created_unix: now_unix(),
            rebuilt: false,
        };
        Ok((rec, true))
    }

    fn wait_for_inventory(&mut self, ctx: &mut Context<Self>) {
        let inv = self.inventory.clone();
        ctx.spawn(
            async move {
                loop {
                    match inv.send(GetInventoryStatus).await {
                        Ok(s) if s.scanned => break,
                        _ => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
                inv.send(ListDrives).await.unwrap_or_default()
            }
            .into_actor(self)
            .map(|drives, act, ctx| {
                for d in drives {
                    act.drives.insert(d.id.clone(), d);
                }
                act.reconcile(ctx);
            }),
        );
    }

    fn reconcile(&mut self, ctx: &mut Context<Self>) {
        if self.reconciling {
            return;
        }
        self.reconciling = true;
        let dir = self.state_dir.clone();
        let drives: Vec<Drive> = self.drives.values().filter(|d| d.class == DriveClass::Managed).cloned().collect();
        let locks: HashMap<String, Arc<Mutex<()>>> = drives.iter().map(|d| (d.id.clone(), self.lock_of(&d.id))).collect();
        let job = move || startup(&dir, &drives, &locks);
        ctx.spawn(async move { tokio::task::spawn_blocking(job).await }.into_actor(self).map(|res, act, ctx| {
            act.reconciling = false;
            match res {
                Ok(Ok((store, records))) => {
                    act.store = Some(Arc::new(store));
                    act.book = records.into_iter().map(|r| (r.id.clone(), r)).collect();
                    act.ready = true;
                    info!(actor = "volumes", volumes = act.book.len(), "volume manager ready");
                }
                Ok(Err(e)) => {
                    error!(actor = "volumes", error = %e, "start-up reconciliation failed; retrying in 5s");
                    ctx.run_later(Duration::from_secs(5), |act, ctx| act.reconcile(ctx));
                }
                Err(e) => {
                    error!(actor = "volumes", error = %e, "start-up reconciliation panicked; restarting the actor");
                    ctx.stop();
                }
            }
        }));
    }
}

/// Opens the store and carries out the start-up plan; returns the records to serve.
fn startup(
    dir: &std::path::Path,
    drives: &[Drive],
    locks: &HashMap<String, Arc<Mutex<()>>>,
) -> Result<(Store, Vec<VolumeRecord>), VolumeError> {
    let store = Store::open(dir).map_err(VolumeError::Store)?;
    let (records, bad) = store.load::<VolumeRecord>().map_err(VolumeError::Store)?;
    for b in bad {
        error!(actor = "volumes", volume.id = %b.id, error = %b.reason, "unreadable volume record kept aside");
    }
    let mut tables = reconcile::Tables::new();
    for d in drives {
        match gpt::read_table(&d.path, d.logical_block_size) {
            Ok(Some(t)) if t.is_drivelet() => {
                tables.insert(d.id.clone(), t.partitions.into_iter().filter(|q| q.is_drivelet()).collect());
            }
            Ok(_) => {
                tables.insert(d.id.clone(), Vec::new());
            }
            Err(e) => warn!(actor = "volumes", drive.id = %d.id, error = %e, "cannot read the partition table"),
        }
    }
    let mounted: BTreeSet<PathBuf> =
        crate::disk::mounts::read_mountinfo().unwrap_or_default().into_iter().map(|m| m.mount_point).collect();
    let plan = reconcile::plan(records, drives, &tables, &mounted, now_unix());
    for line in &plan.reports {
        warn!(actor = "volumes", "{line}");
    }
    let loc = |id: &str| drives.iter().find(|d| d.id == id).map(|d| DriveLoc { path: d.path.clone(), sector: d.logical_block_size });
    let nolock = Mutex::new(());
    let lock = |id: &str| locks.get(id).map(|l| l.as_ref()).unwrap_or(&nolock);
    let mut keep = plan.keep;
    for rec in plan.rollback {
        let res = match loc(&rec.drive_id) {
            Some(d) => ops::rollback_create(&store, &d, lock(&rec.drive_id), &rec),
            None => Ok(()),
        };
        if let Err(e) = res {
            error!(actor = "volumes", volume.id = %rec.id, error = %e, "cannot roll back an unfinished create; kept");
            keep.push(rec);
        }
    }
    for rec in plan.finish_delete {
        if let Err(e) = ops::delete_steps(&store, loc(&rec.drive_id).as_ref(), lock(&rec.drive_id), &rec) {
            error!(actor = "volumes", volume.id = %rec.id, error = %e, "cannot finish an interrupted delete; kept");
            keep.push(rec);
        }
    }
    for id in plan.drop {
        store.remove(&id).map_err(VolumeError::Store)?;
    }
    for rec in keep.iter_mut() {
        if rec.rebuilt && rec.fs_type.is_empty() && rec.state == VolumeState::Available {
            if let Some(d) = loc(&rec.drive_id) {
                if let Ok(kp) = crate::disk::blkpg::ensure_kernel_partition(&d.path, rec.start, rec.size) {
                    match crate::disk::fs::probe_fs(&kp.devnode) {
                        Ok(Some(fs)) => {
                            rec.fs_type = fs;
                            rec.formatted = true;
                        }
                        Ok(None) => rec.fs_type = String::new(),
                        Err(e) => warn!(actor = "volumes", volume.id = %rec.id, error = %e, "cannot probe the filesystem"),
                    }
                }
            }
        }
        if plan.changed.contains(&rec.id) {
            store.put(&rec.id, rec).map_err(VolumeError::Store)?;
        }
    }
    Ok((store, keep))
}

impl Actor for VolumeManager {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.inventory.do_send(SubscribeDrives(ctx.address().recipient()));
        self.wait_for_inventory(ctx);
    }
}

impl Supervised for VolumeManager {
    fn restarting(&mut self, _: &mut Context<Self>) {
        warn!(actor = "volumes", "restarting: rebuilding volumes from the store, the drives and the mounts");
        self.store = None;
        self.ready = false;
        self.reconciling = false;
        self.book.clear();
        self.busy.clear();
        self.drives.clear();
    }
}

impl Handler<DriveEvent> for VolumeManager {
    type Result = ();
    fn handle(&mut self, ev: DriveEvent, _: &mut Context<Self>) {
        match ev {
            DriveEvent::DriveAppeared(d) | DriveEvent::DriveChanged { new: d, .. } => {
                self.drives.insert(d.id.clone(), d);
            }
            DriveEvent::DriveRemoved(d) => {
                let n = self.book.values().filter(|r| r.drive_id == d.id).count();
                if n > 0 {
                    warn!(actor = "volumes", drive.id = %d.id, volumes = n, "drive holding volumes is gone");
                }
                self.drives.remove(&d.id);
            }
        }
    }
}

impl Handler<CreateVolume> for VolumeManager {
    type Result = ResponseActFuture<Self, Result<VolumeRecord, VolumeError>>;
    fn handle(&mut self, m: CreateVolume, _: &mut Context<Self>) -> Self::Result {
        let id = gpt::volume_partition_guid(&m.name).to_string();
        let store = match self.claim(&id) {
            Ok(s) => s,
            Err(e) => return Box::pin(fut::ready(Err(e))),
        };
        let rec = match self.create(m) {
            Ok((rec, false)) => {
                self.busy.remove(&id);
                return Box::pin(fut::ready(Ok(rec)));
            }
            Ok((rec, true)) => rec,
            Err(e) => {
                self.busy.remove(&id);
                return Box::pin(fut::ready(Err(e)));
            }
        };
        let Some(loc) = self.loc_of(&rec.drive_id) else {
            self.busy.remove(&id);
            return Box::pin(fut::ready(Err(VolumeError::FailedPrecondition {
                volume_id: id,
                reason: format!("was being created on drive {} which is absent now", rec.drive_id),
            })));
        };
        let lock = self.lock_of(&rec.drive_id);
        info!(volume.id = %rec.id, volume.name = %rec.name, drive.id = %rec.drive_id, volume.size = rec.size, "creating volume");
        self.book.insert(rec.id.clone(), rec.clone());
        self.run(id, move || ops::create(&store, &loc, &lock, rec))
    }
}

impl Handler<DeleteVolume> for VolumeManager {
    type Result = ResponseActFuture<Self, Result<(), VolumeError>>;
    fn handle(&mut self, m: DeleteVolume, _: &mut Context<Self>) -> Self::Result {
        let id = m.volume_id;
        let store = match self.claim(&id) {
            Ok(s) => s,
            Err(e) => return Box::pin(fut::ready(Err(e))),
        };
        let Some(rec) = self.book.get(&id).cloned() else {
            self.busy.remove(&id);
            return Box::pin(fut::ready(Ok(())));
        };
        let loc = self.loc_of(&rec.drive_id);
        let lock = self.lock_of(&rec.drive_id);
        info!(volume.id = %id, drive.id = %rec.drive_id, "deleting volume");
        self.run(id, move || ops::delete(&store, loc.as_ref(), &lock, rec))
    }
}

impl VolumeManager {
    /// Common start of a node call: ready, known, not busy; the drive when present.
    fn node_call(&mut self, id: &str, need_drive: bool) -> Result<(Arc<Store>, VolumeRecord, Option<DriveLoc>), VolumeError> {
        if !self.ready {
            return Err(VolumeError::NotReady);
        }
        let rec = self.book.get(id).cloned().ok_or_else(|| VolumeError::NotFound { volume_id: id.to_string() })?;
        let loc = self.loc_of(&rec.drive_id);
        if need_drive && loc.is_none() {
            return Err(VolumeError::FailedPrecondition {
                volume_id: id.to_string(),
                reason: format!("lives on drive {} which is absent from this node", rec.drive_id),
            });
        }
        let store = self.claim(id)?;
        Ok((store, rec, loc))
    }
}

impl Handler<StageVolume> for VolumeManager {
    type Result = ResponseActFuture<Self, Result<(), VolumeError>>;
    fn handle(&mut self, m: StageVolume, _: &mut Context<Self>) -> Self::Result {
        let (store, rec, loc) = match self.node_call(&m.volume_id, true) {
            Ok(x) => x,
            Err(e) => return Box::pin(fut::ready(Err(e))),
        };
        let roots = self.cfg.allowed_roots.clone();
        let loc = loc.expect("checked");
        self.run(m.volume_id, move || ops::stage(&store, &loc, &roots, rec, m.args))
    }
}

impl Handler<UnstageVolume> for VolumeManager {
    type Result = ResponseActFuture<Self, Result<(), VolumeError>>;
    fn handle(&mut self, m: UnstageVolume, _: &mut Context<Self>) -> Self::Result {
        let (store, rec, loc) = match self.node_call(&m.volume_id, false) {
            Ok(x) => x,
            Err(e) => return Box::pin(fut::ready(Err(e))),
        };
        self.run(m.volume_id, move || ops::unstage(&store, loc.as_ref(), rec, &m.path))
    }
}

impl Handler<PublishVolume> for VolumeManager {
    type Result = ResponseActFuture<Self, Result<(), VolumeError>>;
    fn handle(&mut self, m: PublishVolume, _: &mut Context<Self>) -> Self::Result {
        let (store, rec, loc) = match self.node_call(&m.volume_id, true) {
            Ok(x) => x,
            Err(e) => return Box::pin(fut::ready(Err(e))),
        };
        let roots = self.cfg.allowed_roots.clone();
        let loc = loc.expect("checked");
        self.run(m.volume_id, move || ops::publish(&store, &loc, &roots, rec, m.args))
    }
}

impl Handler<UnpublishVolume> for VolumeManager {
    type Result = ResponseActFuture<Self, Result<(), VolumeError>>;
    fn handle(&mut self, m: UnpublishVolume, _: &mut Context<Self>) -> Self::Result {
        let (store, rec, loc) = match self.node_call(&m.volume_id, false) {
            Ok(x) => x,
            Err(e) => return Box::pin(fut::ready(Err(e))),
        };
        self.run(m.volume_id, move || ops::unpublish(&store, loc.as_ref(), rec, &m.target))
    }
}

impl Handler<GetVolume> for VolumeManager {
    type Result = Result<VolumeRecord, VolumeError>;
    fn handle(&mut self, m: GetVolume, _: &mut Context<Self>) -> Self::Result {
        if !self.ready {
            return Err(VolumeError::NotReady);
        }
        match self.book.get(&m.volume_id) {
            Some(r) if r.state != VolumeState::Creating => Ok(r.clone()),
            _ => Err(VolumeError::NotFound { volume_id: m.volume_id }),
        }
    }
}

impl Handler<ListVolumes> for VolumeManager {
    type Result = MessageResult<ListVolumes>;
    fn handle(&mut self, _: ListVolumes, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.book.values().cloned().collect())
    }
}

impl Handler<VolumesReady> for VolumeManager {
    type Result = bool;
    fn handle(&mut self, _: VolumesReady, _: &mut Context<Self>) -> bool {
        self.ready
    }
}
