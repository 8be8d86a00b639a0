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
//!   fail while answering `ListVolumeStatuses` (fail point `actor.volumes.stop`).

pub mod health;
pub mod model;
pub mod ops;
pub mod placement;
pub mod reconcile;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use tracing::{error, info, warn};

use self::health::{Condition, DriveUse, DriveUseState, Finding};
use self::model::{CapacityRange, Refusal, VolumeRecord, VolumeState};
use self::placement::{Candidate, NoRoom};
use self::ops::{DriveLoc, Outcome, PublishArgs, StageArgs};
use super::inventory::classify::DriveClass;
use super::inventory::model::{Drive, LayoutKind};
use super::inventory::DriveInventory;
use super::messages::{
    DriveEvent, DriveRefused, GetCapacity, GetInventoryStatus, ListDrives, SubscribeConditions, SubscribeDrives, SubscribeVolumes, VolumeConditionChanged,
    VolumesChanged,
};
use crate::config::{Media, VolumesConfig};
use crate::disk::{gpt, DiskError};
use crate::store::{Kind, Store, StoreError};

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
    /// The volume is neither staged nor published at the path a node call names.
    #[error("volume {volume_id} is not staged or published at {}", path.display())]
    PathNotFound {
        /// The volume.
        volume_id: String,
        /// The path asked about.
        path: PathBuf,
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
    /// What the GPT writer found on the drive when it refused to write to it (data
    /// drivelet did not write); `None` for every other error.
    pub fn refused_drive(&self) -> Option<&str> {
        match self {
            VolumeError::Disk { source: DiskError::Foreign { found, .. }, .. } => Some(found),
            _ => None,
        }
    }

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

/// Command: ControllerPublishVolume, attach a volume to this node.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<PublishContext, VolumeError>")]
pub struct AttachVolume {
    /// Volume id.
    pub volume_id: String,
    /// The node (validated by the caller to be this one).
    pub node_id: String,
    /// The capability asks for block access.
    pub block: bool,
    /// Filesystem the capability names (empty: any).
    pub fs_type: String,
}

/// What an attachment hands the node calls (CSI `publish_context`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishContext {
    /// Kernel device node of the volume's partition.
    pub device: PathBuf,
    /// The partition GUID.
    pub part_guid: uuid::Uuid,
}

/// `publish_context` key: the kernel device node of the volume's partition.
pub const PUBLISH_DEVICE_KEY: &str = "drivelet.io/device";
/// `publish_context` key: the volume's GPT partition GUID.
pub const PUBLISH_PARTITION_GUID_KEY: &str = "drivelet.io/partition-guid";

/// `publish_context` key of an adopted volume: the host directory it binds.
pub const PUBLISH_LOCAL_PATH_KEY: &str = "drivelet.io/local-path";

impl PublishContext {
    /// As the CSI `publish_context` map (also a VolumeAttachment's `attachmentMetadata`).
    /// An adopted volume (no partition: a nil GUID) names its directory instead.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        if self.part_guid.is_nil() {
            return BTreeMap::from([(PUBLISH_LOCAL_PATH_KEY.to_string(), self.device.display().to_string())]);
        }
        BTreeMap::from([
            (PUBLISH_DEVICE_KEY.to_string(), self.device.display().to_string()),
            (PUBLISH_PARTITION_GUID_KEY.to_string(), self.part_guid.to_string()),
        ])
    }
}

/// Command: ControllerUnpublishVolume, detach a volume (idempotent; an unknown volume
/// or one not attached to the node is done already).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), VolumeError>")]
pub struct DetachVolume {
    /// Volume id.
    pub volume_id: String,
    /// Detach from this node only; `None`: from every node.
    pub node_id: Option<String>,
}

/// Command: ControllerExpandVolume, grow a volume's partition in place. Answers the new
/// size and whether the node must grow a filesystem.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(u64, bool), VolumeError>")]
pub struct ExpandVolume {
    /// Volume id.
    pub volume_id: String,
    /// The size asked for.
    pub range: CapacityRange,
}

/// Command: NodeExpandVolume, grow a staged volume's filesystem to its partition.
/// Answers the size.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<u64, VolumeError>")]
pub struct NodeExpandVolume {
    /// Volume id.
    pub volume_id: String,
    /// The staging or a target path the request names.
    pub path: PathBuf,
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
    /// Drives that are releasing or released, by id (persisted).
    drive_use: BTreeMap<String, DriveUse>,
    /// Latest check findings by volume id (from the health poller).
    findings: HashMap<String, Vec<Finding>>,
    /// Last condition logged per volume, to log each change once.
    conditions: HashMap<String, Condition>,
    /// Release a releasing drive once its last volume is gone, even unasked.
    auto_release: bool,
    /// Who hears of condition changes (the Kubernetes Event reporter).
    condition_subscribers: Vec<Recipient<VolumeConditionChanged>>,
    /// Who hears of changes to what a drive holds (the Drive object sync).
    volume_subscribers: Vec<Recipient<VolumesChanged>>,
    /// Callers of [`WaitReady`] waiting for start-up reconciliation.
    ready_waiters: Vec<tokio::sync::oneshot::Sender<()>>,
}

/// What the Drive objects show of one volume: its drive and whether it failed; `None`
/// while it is unknown or still being created (never handed out).
fn shown(rec: Option<&VolumeRecord>) -> Option<(String, bool)> {
    rec.filter(|r| r.state != VolumeState::Creating).map(|r| (r.drive_id.clone(), r.failed))
}

fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl VolumeManager {
    /// A manager keeping its store under `state_dir`.
    pub fn new(cfg: VolumesConfig, state_dir: PathBuf, inventory: Addr<DriveInventory>, auto_release: bool) -> VolumeManager {
        VolumeManager {
            drive_use: BTreeMap::new(),
            findings: HashMap::new(),
            conditions: HashMap::new(),
            condition_subscribers: Vec::new(),
            volume_subscribers: Vec::new(),
            ready_waiters: Vec::new(),
            auto_release,
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

    /// Where a volume's drive is, for its disk steps. An adopted volume's drive (if
    /// drivelet knows it) is never handed to a disk step: it is not drivelet's to change.
    fn loc_of(&self, rec: &VolumeRecord) -> Option<DriveLoc> {
        if rec.adopted.is_some() {
            return None;
        }
        self.drives.get(&rec.drive_id).map(|d| DriveLoc { path: d.path.clone(), sector: d.logical_block_size })
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
        let drive_id = self.book.get(&id).map(|r| r.drive_id.clone());
        let before = shown(self.book.get(&id));
        Box::pin(async move { tokio::task::spawn_blocking(job).await }.into_actor(self).map(move |joined, act, _| {
            act.busy.remove(&id);
            act.findings.remove(&id);
            let res = match joined {
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
                    Err(VolumeError::FailedPrecondition { volume_id: id.clone(), reason: format!("operation failed unexpectedly: {e}") })
                }
            };
            let after = shown(act.book.get(&id));
            if before != after {
                let drives: BTreeSet<String> = before.into_iter().chain(after).map(|(drive, _)| drive).collect();
                for drive in drives {
                    act.announce(&drive);
                }
            }
            if let Some(d) = drive_id {
                act.settle_drive(&d);
            }
            act.refresh(|r| r.id == id);
            if !act.book.contains_key(&id) {
                act.conditions.remove(&id);
            }
            res
        }))
    }

    /// A volume callers may see: the manager is ready and the volume exists and is not
    /// still being created (a `Creating` record was never handed out).
    fn visible(&self, id: &str) -> Result<&VolumeRecord, VolumeError> {
        if !self.ready {
            return Err(VolumeError::NotReady);
        }
        match self.book.get(id) {
            Some(r) if r.state != VolumeState::Creating => Ok(r),
            _ => Err(VolumeError::NotFound { volume_id: id.to_string() }),
        }
    }

    /// The condition of a volume now.
    fn condition_of(&self, rec: &VolumeRecord) -> Condition {
        let f = self.findings.get(&rec.id).map(Vec::as_slice).unwrap_or(&[]);
        health::condition(rec, self.drives.get(&rec.drive_id), self.drive_use.get(&rec.drive_id), f)
    }

    /// Recomputes the conditions of the matching volumes and logs each change once.
    fn refresh(&mut self, which: impl Fn(&VolumeRecord) -> bool) {
        let mut changed = Vec::new();
        for rec in self.book.values().filter(|r| which(r) && r.state != VolumeState::Creating) {
            let c = self.condition_of(rec);
            let before = self.conditions.get(&rec.id);
            if before != Some(&c) && (before.is_some() || c.abnormal) {
                changed.push((rec.id.clone(), rec.drive_id.clone(), c));
            } else if before.is_none() {
                self.conditions.insert(rec.id.clone(), c);
            }
        }
        for (id, drive, c) in changed {
            if c.abnormal {
                warn!(volume.id = %id, drive.id = %drive, volume.abnormal = true, volume.condition = %c.message, "volume condition changed");
            } else {
                info!(volume.id = %id, drive.id = %drive, volume.abnormal = false, volume.condition = %c.message, "volume condition changed");
            }
            let event = VolumeConditionChanged { volume_id: id.clone(), abnormal: c.abnormal, message: c.message.clone() };
            self.condition_subscribers.retain(|s| s.try_send(event.clone()).is_ok() || s.connected());
            self.conditions.insert(id, c);
        }
    }

    /// Tells the subscribers that what `drive_id` holds changed.
    fn announce(&mut self, drive_id: &str) {
        let event = VolumesChanged { drive_id: drive_id.to_string() };
        self.volume_subscribers.retain(|s| s.try_send(event.clone()).is_ok() || s.connected());
    }

    fn save_use(&self, u: &DriveUse) {
        if let Some(store) = &self.store {
            if let Err(e) = store.put_in(Kind::Drive, &u.drive_id, u) {
                error!(drive.id = %u.drive_id, error = %e, "cannot record the drive's usage state");
            }
        }
    }

    /// Completes the release of a releasing drive that holds no volume any more.
    fn settle_drive(&mut self, drive_id: &str) {
        let Some(u) = self.drive_use.get(drive_id).cloned() else { return };
        let holds = self.book.values().any(|r| r.drive_id == drive_id && !r.failed);
        if u.state == DriveUseState::Releasing && !holds && (u.requested || self.auto_release) {
            let done = DriveUse { state: DriveUseState::Released, ..u };
            info!(drive.id = %drive_id, drive.usage = "released", "drive released: it holds no volume and may be pulled");
            self.save_use(&done);
            self.drive_use.insert(drive_id.to_string(), done);
            self.announce(drive_id);
        }
    }

    /// Reconciles the records of `drive`, which just appeared, with its GPT and the
    /// mounts, as start-up does for all ([`settle`]); its records are busy meanwhile.
    fn reconcile_drive(&mut self, drive: Drive, ctx: &mut Context<Self>) {
        let Some(store) = self.store.clone() else { return };
        let ids: Vec<String> = self.book.values().filter(|r| r.drive_id == drive.id).map(|r| r.id.clone()).collect();
        if ids.iter().any(|id| self.busy.contains(id)) {
            // A call is changing one of them: look again once it is done.
            ctx.run_later(Duration::from_secs(1), move |act, ctx| {
                if act.drives.get(&drive.id).is_some_and(|d| d.path == drive.path) {
                    act.reconcile_drive(drive, ctx);
                }
            });
            return;
        }
        self.busy.extend(ids.iter().cloned());
        let records: Vec<VolumeRecord> = ids.iter().filter_map(|id| self.book.get(id).cloned()).collect();
        let drive_id = drive.id.clone();
        let locks = HashMap::from([(drive.id.clone(), self.lock_of(&drive.id))]);
        let job = move || settle(&store, records, std::slice::from_ref(&drive), &locks);
        ctx.spawn(async move { tokio::task::spawn_blocking(job).await }.into_actor(self).map(move |res, act, _| {
            for id in &ids {
                act.busy.remove(id);
            }
            match res {
                Ok(Ok(keep)) => {
                    for id in ids.iter().filter(|id| !keep.iter().any(|r| r.id == **id)) {
                        act.book.remove(id);
                    }
                    for r in keep {
                        if !ids.contains(&r.id) && act.book.contains_key(&r.id) {
                            warn!(actor = "volumes", volume.id = %r.id, drive.id = %drive_id, "a partition of this volume is on another drive too; ignored here");
                            continue;
                        }
                        act.book.insert(r.id.clone(), r);
                    }
                    act.refresh(|r| r.drive_id == drive_id);
                    act.announce(&drive_id);
                }
                Ok(Err(e)) => error!(actor = "volumes", drive.id = %drive_id, error = %e, "cannot reconcile the drive's volumes"),
                Err(e) => error!(actor = "volumes", drive.id = %drive_id, error = %e, "reconciling the drive's volumes panicked"),
            }
        }));
    }

    fn candidates(&self) -> Vec<Candidate<'_>> {
        self.drives
            .values()
            .filter(|d| d.class == DriveClass::Managed)
            .map(|d| {
                let mut used: Vec<(u64, u64)> =
                    self.book.values().filter(|r| r.drive_id == d.id && r.adopted.is_none()).map(|r| (r.start, r.size)).collect();
                used.extend(d.extents.iter().copied());
                let closed = self.drive_use.contains_key(&d.id) || d.health.health == crate::disk::smart::Health::Bad;
                Candidate { drive: d, used, closed }
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
                // Never a success for a volume that does not exist: the CO sees why, and
                // DeleteVolume clears the way for a new one of the same name.
                _ if rec.lost => Err(VolumeError::FailedPrecondition { volume_id: id, reason: health::lost_reason(rec) }),
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
        let p = placement::place(&self.candidates(), m.media, m.layout, want).map_err(|e| match e {
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
            failed: false,
            published_node: None,
            adopted: None,
            lost: false,
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
        // Every present drive: presence decides what happens to a record, and the
        // on-disk table (not the inventory's class, which may lag) decides whether
        // drivelet's own partitions are there.
        let drives: Vec<Drive> = self.drives.values().cloned().collect();
        let locks: HashMap<String, Arc<Mutex<()>>> = drives.iter().map(|d| (d.id.clone(), self.lock_of(&d.id))).collect();
        let job = move || startup(&dir, &drives, &locks);
        ctx.spawn(async move { tokio::task::spawn_blocking(job).await }.into_actor(self).map(|res, act, ctx| {
            act.reconciling = false;
            match res {
                Ok(Ok((store, records))) => {
                    match store.load_in::<DriveUse>(Kind::Drive) {
                        Ok((uses, bad)) => {
                            for b in bad {
                                error!(actor = "volumes", drive.id = %b.id, error = %b.reason, "unreadable drive record kept aside");
                            }
                            act.drive_use = uses.into_iter().map(|u| (u.drive_id.clone(), u)).collect();
                        }
                        Err(e) => error!(actor = "volumes", error = %e, "cannot read drive usage records"),
                    }
                    act.store = Some(Arc::new(store));
                    act.book = records.into_iter().map(|r| (r.id.clone(), r)).collect();
                    // Health verdicts that arrived before the usage records were loaded.
                    let bad: Vec<(String, String)> = act
                        .drives
                        .values()
                        .filter(|d| d.health.health == crate::disk::smart::Health::Bad)
                        .map(|d| (d.id.clone(), d.health.reason.clone()))
                        .collect();
                    for (id, reason) in bad {
                        if let Some(u) = health::usage_after_health(act.drive_use.get(&id), &id, crate::disk::smart::Health::Bad, &reason) {
                            act.save_use(&u);
                            act.drive_use.insert(id, u);
                        }
                    }
                    act.refresh(|_| true);
                    act.ready = true;
                    info!(actor = "volumes", volumes = act.book.len(), "volume manager ready");
                    for waiter in act.ready_waiters.drain(..) {
                        let _ = waiter.send(());
                    }
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
    let keep = settle(&store, records, drives, locks)?;
    Ok((store, keep))
}

/// Reconciles `records` with the GPTs of `drives` (the drives present) and the host's
/// mounts ([`reconcile::plan`]) and carries the plan out; returns the records to serve.
/// At start-up for every record and drive; later for one drive that appeared.
fn settle(
    store: &Store,
    records: Vec<VolumeRecord>,
    drives: &[Drive],
    locks: &HashMap<String, Arc<Mutex<()>>>,
) -> Result<Vec<VolumeRecord>, VolumeError> {
    let mut tables = reconcile::Tables::new();
    // Only managed drives are read for drivelet partitions (and so only they are ever
    // written to or adopted from); a drive carrying a drivelet GPT is classified
    // managed from the table on the disk itself, even before udev has caught up.
    for d in drives.iter().filter(|d| d.class == DriveClass::Managed) {
        match gpt::read_table(&d.path, d.logical_block_size) {
            Ok(Some(t)) if t.is_drivelet() => {
                tables.insert(d.id.clone(), t.partitions.into_iter().filter(|q| q.is_drivelet()).collect());
            }
            Ok(_) => {}
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
        // Without a drivelet table on the drive, nothing was written: only the record goes.
        let res = match (loc(&rec.drive_id), tables.contains_key(&rec.drive_id)) {
            (Some(d), true) => ops::rollback_create(store, &d, lock(&rec.drive_id), &rec),
            _ => store.remove(&rec.id).map_err(VolumeError::Store),
        };
        if let Err(e) = res {
            error!(actor = "volumes", volume.id = %rec.id, error = %e, "cannot roll back an unfinished create; kept");
            keep.push(rec);
        }
    }
    for rec in plan.finish_delete {
        let d = if tables.contains_key(&rec.drive_id) { loc(&rec.drive_id) } else { None };
        if let Err(e) = ops::delete_steps(store, d.as_ref(), lock(&rec.drive_id), &rec) {
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
    Ok(keep)
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
    fn handle(&mut self, ev: DriveEvent, ctx: &mut Context<Self>) {
        // A drive that appears, has new media under the same name (its disk sequence
        // number changed: swapped, or attached again faster than its removal was seen),
        // turns blank or changes class.
        let reread = match &ev {
            DriveEvent::DriveAppeared(d) => !self.drives.contains_key(&d.id),
            DriveEvent::DriveChanged { old, new } => {
                old.diskseq != new.diskseq || (new.blank && !old.blank) || old.class != new.class
            }
            DriveEvent::DriveRemoved(_) => false,
        };
        let id = match ev {
            DriveEvent::DriveAppeared(d) | DriveEvent::DriveChanged { new: d, .. } => {
                let id = d.id.clone();
                if self.ready {
                    if let Some(u) = health::usage_after_health(self.drive_use.get(&id), &id, d.health.health, &d.health.reason) {
                        warn!(drive.id = %id, drive.usage = "releasing", drive.health_reason = %d.health.reason,
                              "drive health is BAD: it takes no new volumes and its volumes are asked to move");
                        self.save_use(&u);
                        self.drive_use.insert(id.clone(), u);
                        self.announce(&id);
                    }
                }
                self.drives.insert(id.clone(), d.clone());
                // Such a drive is read as at start-up: its partitions may be back, or
                // gone, or unknown to the store.
                if reread && self.ready {
                    self.reconcile_drive(d, ctx);
                }
                id
            }
            DriveEvent::DriveRemoved(d) => {
                let n = self.book.values().filter(|r| r.drive_id == d.id).count();
                if n > 0 {
                    warn!(actor = "volumes", drive.id = %d.id, volumes = n, "drive holding volumes is gone");
                }
                if self.drive_use.get(&d.id).is_some_and(|u| u.state == DriveUseState::Released) {
                    info!(drive.id = %d.id, "released drive pulled: forgotten");
                    self.drive_use.remove(&d.id);
                    if let Some(store) = &self.store {
                        if let Err(e) = store.remove_in(Kind::Drive, &d.id) {
                            error!(drive.id = %d.id, error = %e, "cannot forget the drive's usage record");
                        }
                    }
                }
                self.drives.remove(&d.id);
                d.id
            }
        };
        self.refresh(|r| r.drive_id == id);
    }
}

/// Notification from the health poller: what the checks of one volume found.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct VolumeChecked {
    /// Volume id.
    pub volume_id: String,
    /// Findings (empty: all well).
    pub findings: Vec<Finding>,
}

impl Handler<VolumeChecked> for VolumeManager {
    type Result = ();
    fn handle(&mut self, m: VolumeChecked, _: &mut Context<Self>) {
        // A check that raced with an operation on the volume is stale: drop it.
        if self.busy.contains(&m.volume_id) || !self.book.contains_key(&m.volume_id) {
            return;
        }
        self.findings.insert(m.volume_id.clone(), m.findings);
        let id = m.volume_id;
        self.refresh(|r| r.id == id);
    }
}

/// Command: release a drive (`drivelet ctl drive release`).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<DriveUse, VolumeError>")]
pub struct ReleaseDrive {
    /// Stable drive id.
    pub drive_id: String,
    /// Fail the volumes still on it instead of waiting for their deletion.
    pub force: bool,
}

impl Handler<ReleaseDrive> for VolumeManager {
    type Result = Result<DriveUse, VolumeError>;
    fn handle(&mut self, m: ReleaseDrive, _: &mut Context<Self>) -> Self::Result {
        if !self.ready {
            return Err(VolumeError::NotReady);
        }
        let known = self.drives.contains_key(&m.drive_id) || self.book.values().any(|r| r.drive_id == m.drive_id);
        if !known {
            return Err(VolumeError::InvalidArgument { reason: format!("no drive with id {} is known on this node", m.drive_id) });
        }
        let live: Vec<&VolumeRecord> = self.book.values().filter(|r| r.drive_id == m.drive_id && !r.failed).collect();
        let (u, fail) = health::release(self.drive_use.get(&m.drive_id), &m.drive_id, &live, m.force);
        for id in fail {
            if let Some(r) = self.book.get_mut(&id) {
                r.failed = true;
                if let Some(store) = &self.store {
                    store.put(&r.id, r).map_err(VolumeError::Store)?;
                }
                warn!(volume.id = %id, drive.id = %m.drive_id, "volume failed by a forced drive release");
            }
        }
        info!(drive.id = %m.drive_id, drive.usage = u.state.as_str(), volumes = live_count(&self.book, &m.drive_id), "drive release requested");
        self.save_use(&u);
        self.drive_use.insert(m.drive_id.clone(), u.clone());
        self.announce(&m.drive_id);
        let d = m.drive_id;
        self.refresh(|r| r.drive_id == d);
        Ok(u)
    }
}

fn live_count(book: &BTreeMap<String, VolumeRecord>, drive_id: &str) -> usize {
    book.values().filter(|r| r.drive_id == drive_id && !r.failed).count()
}

/// A volume with its live status.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VolumeStatus {
    /// The record.
    pub record: VolumeRecord,
    /// Its condition now.
    pub condition: Condition,
}

/// Query: one volume with its condition.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<VolumeStatus, VolumeError>")]
pub struct GetVolumeStatus {
    /// Volume id.
    pub volume_id: String,
}

impl Handler<GetVolumeStatus> for VolumeManager {
    type Result = Result<VolumeStatus, VolumeError>;
    fn handle(&mut self, m: GetVolumeStatus, _: &mut Context<Self>) -> Self::Result {
        let r = self.visible(&m.volume_id)?;
        Ok(VolumeStatus { record: r.clone(), condition: self.condition_of(r) })
    }
}

/// Query: a page of volumes (by id order) with their conditions.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(Vec<VolumeStatus>, Option<String>), VolumeError>")]
pub struct ListVolumeStatuses {
    /// Start after this volume id.
    pub after: Option<String>,
    /// At most this many (0: all).
    pub max: usize,
}

impl Handler<ListVolumeStatuses> for VolumeManager {
    type Result = Result<(Vec<VolumeStatus>, Option<String>), VolumeError>;
    fn handle(&mut self, m: ListVolumeStatuses, ctx: &mut Context<Self>) -> Self::Result {
        if !self.ready {
            return Err(VolumeError::NotReady);
        }
        if crate::failpoint::injected_failure("actor.volumes.stop") {
            warn!(actor = "volumes", "failure injected: stopping after this answer");
            ctx.stop();
        }
        use std::ops::Bound;
        let lower = match &m.after {
            Some(a) => Bound::Excluded(a.clone()),
            None => Bound::Unbounded,
        };
        let max = if m.max == 0 { usize::MAX } else { m.max };
        let mut out = Vec::new();
        let mut next = None;
        for (id, r) in self.book.range((lower, Bound::Unbounded)) {
            if r.state == VolumeState::Creating {
                continue;
            }
            if out.len() == max {
                next = out.last().map(|s: &VolumeStatus| s.record.id.clone());
                break;
            }
            let _ = id;
            out.push(VolumeStatus { record: r.clone(), condition: self.condition_of(r) });
        }
        Ok((out, next))
    }
}

/// Query: the usage records of releasing and released drives.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Vec<DriveUse>")]
pub struct ListDriveUses;

impl Handler<ListDriveUses> for VolumeManager {
    type Result = MessageResult<ListDriveUses>;
    fn handle(&mut self, _: ListDriveUses, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.drive_use.values().cloned().collect())
    }
}

impl Handler<GetCapacity> for VolumeManager {
    type Result = Result<placement::Capacity, VolumeError>;
    fn handle(&mut self, m: GetCapacity, _: &mut Context<Self>) -> Self::Result {
        if !self.ready {
            return Err(VolumeError::NotReady);
        }
        Ok(placement::capacity(&self.candidates(), m.media, m.layout, m.minimum))
    }
}

/// Query: filesystem usage of a volume at one of its paths (NodeGetVolumeStats).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(VolumeStatus, Option<crate::disk::fs::Usage>), VolumeError>")]
pub struct VolumeStats {
    /// Volume id.
    pub volume_id: String,
    /// The staging or a target path of the volume; for a block volume also any device
    /// node of its partition under the allowed roots (kubelet's bind of the device).
    pub path: PathBuf,
}

impl Handler<VolumeStats> for VolumeManager {
    type Result = ResponseActFuture<Self, Result<(VolumeStatus, Option<crate::disk::fs::Usage>), VolumeError>>;
    fn handle(&mut self, m: VolumeStats, _: &mut Context<Self>) -> Self::Result {
        if !self.ready {
            return Box::pin(fut::ready(Err(VolumeError::NotReady)));
        }
        let Some(rec) = self.book.get(&m.volume_id).filter(|r| r.state != VolumeState::Creating).cloned() else {
            return Box::pin(fut::ready(Err(VolumeError::NotFound { volume_id: m.volume_id })));
        };
        let known = rec.staging.as_ref().is_some_and(|s| s.path == m.path) || rec.targets.contains_key(&m.path);
        let not_found = VolumeError::NotFound { volume_id: format!("{} at path {}", m.volume_id, m.path.display()) };
        if !known {
            // kubelet asks for a block volume at its own bind of the published device.
            let Some(loc) = self.loc_of(&rec).filter(|_| rec.block) else { return Box::pin(fut::ready(Err(not_found))) };
            let roots = self.cfg.allowed_roots.clone();
            let status = VolumeStatus { condition: self.condition_of(&rec), record: rec };
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
        let status = VolumeStatus { condition: self.condition_of(&rec), record: rec };
        if status.record.block {
            return Box::pin(fut::ready(Ok((status, None))));
        }
        let path = m.path;
        Box::pin(
            async move { tokio::task::spawn_blocking(move || crate::disk::fs::usage(&path)).await }
                .into_actor(self)
                .map(move |res, _, _| match res {
                    Ok(Ok(u)) => Ok((status, Some(u))),
                    Ok(Err(e)) => {
                        let mut st = status;
                        st.condition = Condition {
                            abnormal: true,
                            message: format!("{}; usage cannot be read: {e}", st.condition.message),
                        };
                        Ok((st, None))
                    }
                    Err(e) => Err(VolumeError::FailedPrecondition { volume_id: status.record.id.clone(), reason: e.to_string() }),
                }),
        )
    }
}

impl Handler<CreateVolume> for VolumeManager {
    type Result = ResponseActFuture<Self, Result<VolumeRecord, VolumeError>>;
    fn handle(&mut self, m: CreateVolume, _: &mut Context<Self>) -> Self::Result {
        let id = gpt::volume_partition_guid(&m.name).to_string();
        match self.claim(&id) {
            Ok(store) => self.create_attempt(m, store, Vec::new()),
            Err(e) => Box::pin(fut::ready(Err(e))),
        }
    }
}

impl VolumeManager {
    /// One attempt of a claimed CreateVolume, on the drive placement picks now. When the
    /// GPT writer refuses that drive (it holds data drivelet did not write that the last
    /// probe had not seen), nothing is left of the attempt, the drive turns foreign at
    /// once (here, and in the inventory by [`DriveRefused`]), and the same CreateVolume
    /// goes on to the next candidate; `refused` says which drives were refused so far,
    /// for the answer when no candidate is left (RESOURCE_EXHAUSTED, never INTERNAL).
    fn create_attempt(
        &mut self,
        m: CreateVolume,
        store: Arc<Store>,
        mut refused: Vec<String>,
    ) -> ResponseActFuture<Self, Result<VolumeRecord, VolumeError>> {
        let id = gpt::volume_partition_guid(&m.name).to_string();
        let rec = match self.create(m.clone()) {
            Ok((rec, false)) => {
                self.busy.remove(&id);
                return Box::pin(fut::ready(Ok(rec)));
            }
            Ok((rec, true)) => rec,
            Err(VolumeError::ResourceExhausted { reason }) if !refused.is_empty() => {
                self.busy.remove(&id);
                let reason = format!("{reason}; refused when written to: {}", refused.join("; "));
                return Box::pin(fut::ready(Err(VolumeError::ResourceExhausted { reason })));
            }
            Err(e) => {
                self.busy.remove(&id);
                return Box::pin(fut::ready(Err(e)));
            }
        };
        let Some(loc) = self.loc_of(&rec) else {
            self.busy.remove(&id);
            return Box::pin(fut::ready(Err(VolumeError::FailedPrecondition {
                volume_id: id,
                reason: format!("was being created on drive {} which is absent now", rec.drive_id),
            })));
        };
        let lock = self.lock_of(&rec.drive_id);
        let drive_id = rec.drive_id.clone();
        info!(volume.id = %rec.id, volume.name = %rec.name, drive.id = %rec.drive_id, volume.size = rec.size, "creating volume");
        self.book.insert(rec.id.clone(), rec.clone());
        let job_store = store.clone();
        Box::pin(self.run(id.clone(), move || ops::create(&job_store, &loc, &lock, rec)).then(move |res, act, _| {
            let Some(found) = res.as_ref().err().and_then(VolumeError::refused_drive) else {
                return Box::pin(fut::ready(res)) as ResponseActFuture<Self, _>;
            };
            warn!(volume.id = %id, drive.id = %drive_id, drive.reason = %found,
                  "the GPT writer refused the drive: it is foreign from now on; trying the next drive");
            act.drive_refused(&drive_id, found);
            refused.push(format!("drive {drive_id} holds {found}"));
            // The attempt's record is gone and the call is still this one: claim the
            // volume again for the next attempt.
            if !act.busy.insert(id.clone()) {
                return Box::pin(fut::ready(Err(VolumeError::Aborted { volume_id: id })));
            }
            act.create_attempt(m, store, refused)
        }))
    }

    /// Marks a drive the GPT writer refused foreign here at once (so placement skips it
    /// from the next attempt on) and tells the inventory, which publishes the change.
    fn drive_refused(&mut self, drive_id: &str, found: &str) {
        let reason = super::inventory::classify::holds(found);
        if let Some(d) = self.drives.get_mut(drive_id) {
            d.class = DriveClass::Foreign;
            d.reason = reason;
            d.free_bytes = 0;
            d.largest_free_bytes = 0;
        }
        self.inventory.do_send(DriveRefused { drive_id: drive_id.to_string(), found: found.to_string() });
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
        let loc = self.loc_of(&rec);
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
        let loc = self.loc_of(&rec);
        if need_drive && loc.is_none() && rec.adopted.is_none() {
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
        self.run(m.volume_id, move || ops::stage(&store, loc.as_ref(), &roots, rec, m.args))
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
        self.run(m.volume_id, move || ops::publish(&store, loc.as_ref(), &roots, rec, m.args))
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

impl Handler<AttachVolume> for VolumeManager {
    type Result = ResponseActFuture<Self, Result<PublishContext, VolumeError>>;
    fn handle(&mut self, m: AttachVolume, _: &mut Context<Self>) -> Self::Result {
        match self.attach_check(&m) {
            Ok((store, rec, loc)) => {
                let guid = rec.part_guid;
                let (id, node) = (m.volume_id, m.node_id);
                if rec.published_node.is_none() {
                    info!(volume.id = %id, node.name = %node, "attaching volume to node");
                }
                Box::pin(
                    self.run(id, move || ops::controller_publish(&store, loc.as_ref(), rec, node))
                        .map(move |res, _, _| res.map(|device| PublishContext { device, part_guid: guid })),
                )
            }
            Err(e) => Box::pin(fut::ready(Err(e))),
        }
    }
}

impl VolumeManager {
    /// Whether a volume may be attached as asked: it exists, serves the access type and
    /// filesystem, is attached to no other node, and its drive takes the attachment.
    fn attach_refusal(&self, m: &AttachVolume) -> Result<VolumeRecord, VolumeError> {
        let id = m.volume_id.as_str();
        let refuse = |reason: String| VolumeError::FailedPrecondition { volume_id: id.to_string(), reason };
        let rec = self.visible(id)?.clone();
        if rec.state == VolumeState::Deleting {
            return Err(VolumeError::refused(id, model::Refusal::BeingDeleted));
        }
        if m.block != rec.block && !rec.rebuilt {
            let (was, asked) = if rec.block { ("block", "filesystem") } else { ("filesystem", "block") };
            return Err(refuse(format!("was created for {was} access; it cannot be published for {asked} access")));
        }
        if !m.block && !m.fs_type.is_empty() && !rec.fs_type.is_empty() && m.fs_type != rec.fs_type {
            return Err(refuse(format!("holds {}, not {}", rec.fs_type, m.fs_type)));
        }
        if let Some(other) = rec.published_node.as_deref().filter(|n| *n != m.node_id) {
            return Err(refuse(format!("is already attached to node {other}; a local volume serves one node")));
        }
        let d = self.drives.get(&rec.drive_id);
        if let Some(reason) = health::attach_refusal(&rec, d, self.drive_use.get(&rec.drive_id), &m.node_id) {
            return Err(refuse(reason));
        }
        if rec.adopted.is_none() && self.loc_of(&rec).is_none() {
            return Err(refuse(format!("lives on drive {} which is missing", rec.drive_id)));
        }
        Ok(rec)
    }

    fn attach_check(&mut self, m: &AttachVolume) -> Result<(Arc<Store>, VolumeRecord, Option<DriveLoc>), VolumeError> {
        let rec = self.attach_refusal(m)?;
        let loc = self.loc_of(&rec);
        let store = self.claim(&m.volume_id)?;
        Ok((store, rec, loc))
    }
}

/// Query: would [`AttachVolume`] be accepted now? Changes nothing; the answer is the
/// error the attach would fail with, if any (before any disk step).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), VolumeError>")]
pub struct AttachPreview(pub AttachVolume);

impl Handler<AttachPreview> for VolumeManager {
    type Result = Result<(), VolumeError>;
    fn handle(&mut self, m: AttachPreview, _: &mut Context<Self>) -> Self::Result {
        self.attach_refusal(&m.0).map(|_| ())
    }
}

/// Command: adopt a host directory holding an existing volume's data (an in-tree
/// `local` PV translated by `migration`) as volume `volume_id`. Idempotent for the same
/// directory. The data is never formatted, moved or deleted.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<VolumeRecord, VolumeError>")]
pub struct AdoptVolume {
    /// The volume id (the translated PV's volume handle).
    pub volume_id: String,
    /// The PersistentVolume it came from.
    pub pv_name: String,
    /// The directory holding the data.
    pub path: PathBuf,
    /// The filesystem the PV names (may be empty).
    pub fs_type: String,
}

impl Handler<AdoptVolume> for VolumeManager {
    type Result = ResponseActFuture<Self, Result<VolumeRecord, VolumeError>>;
    fn handle(&mut self, m: AdoptVolume, _: &mut Context<Self>) -> Self::Result {
        let refuse = |reason: String| VolumeError::InvalidArgument { reason: format!("cannot adopt {}: {reason}", m.path.display()) };
        let canonical = match std::fs::canonicalize(&m.path) {
            Ok(p) => p,
            Err(e) => return Box::pin(fut::ready(Err(refuse(e.to_string())))),
        };
        if !canonical.is_dir() || canonical == std::path::Path::new("/") {
            return Box::pin(fut::ready(Err(refuse("not a directory other than /; block local volumes cannot be adopted".into()))));
        }
        if let Some(r) = self.book.get(&m.volume_id) {
            let same = r.adopted.as_ref().is_some_and(|a| a.path == canonical && a.pv_name == m.pv_name);
            return Box::pin(fut::ready(if same {
                Ok(r.clone())
            } else {
                Err(VolumeError::AlreadyExists { volume: m.volume_id.clone(), reason: "exists with other data".into() })
            }));
        }
        if let Some(r) = self.book.values().find(|r| r.adopted.as_ref().is_some_and(|a| a.path == canonical)) {
            let e = VolumeError::AlreadyExists { volume: r.id.clone(), reason: format!("already adopts {}", canonical.display()) };
            return Box::pin(fut::ready(Err(e)));
        }
        let store = match self.claim(&m.volume_id) {
            Ok(s) => s,
            Err(e) => return Box::pin(fut::ready(Err(e))),
        };
        let drive = crate::disk::whole_disk_of(&canonical).and_then(|n| self.drives.values().find(|d| d.devnum == n));
        let size = crate::disk::fs::usage(&canonical).map(|u| u.total_bytes).unwrap_or(0);
        let rec = VolumeRecord {
            id: m.volume_id.clone(),
            name: m.pv_name.clone(),
            drive_id: drive.map(|d| d.id.clone()).unwrap_or_default(),
            part_guid: uuid::Uuid::nil(),
            start: 0,
            size,
            layout: LayoutKind::Partition,
            media: drive.map(|d| d.media).unwrap_or(Media::Virtual),
            block: false,
            fs_type: m.fs_type.clone(),
            parameters: BTreeMap::new(),
            state: VolumeState::Available,
            formatted: true,
            staging: None,
            targets: BTreeMap::new(),
            created_unix: now_unix(),
            rebuilt: false,
            failed: false,
            published_node: None,
            adopted: Some(model::Adopted { path: canonical, pv_name: m.pv_name }),
            lost: false,
        };
        info!(volume.id = %rec.id, volume.path = ?rec.adopted.as_ref().map(|a| &a.path), drive.id = %rec.drive_id, "adopting volume");
        self.run(m.volume_id, move || match store.put(&rec.id, &rec) {
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

impl VolumeManager {
    /// The size a volume may grow to as asked: the range rounded like a create, never
    /// below the current size; room after it on its drive (OUT_OF_RANGE past the end of
    /// the drive, RESOURCE_EXHAUSTED when another extent is in the way).
    fn expand_check(&self, m: &ExpandVolume) -> Result<(VolumeRecord, DriveLoc, u64), VolumeError> {
        let id = m.volume_id.as_str();
        let rec = self.visible(id)?.clone();
        if rec.state == VolumeState::Deleting {
            return Err(VolumeError::refused(id, model::Refusal::BeingDeleted));
        }
        if let Some(a) = &rec.adopted {
            return Err(VolumeError::FailedPrecondition {
                volume_id: id.to_string(),
                reason: format!("is adopted from {}: its size is its filesystem's, which drivelet does not manage", a.path.display()),
            });
        }
        let new_size = model::size_for(m.range, rec.size, rec.size).map_err(|reason| VolumeError::OutOfRange {
            reason: format!("volume {id} is {} bytes and cannot shrink: {reason}", rec.size),
        })?;
        let d = self.drives.get(&rec.drive_id).ok_or_else(|| VolumeError::FailedPrecondition {
            volume_id: id.to_string(),
            reason: format!("lives on drive {} which is absent from this node; it cannot grow until the drive is back", rec.drive_id),
        })?;
        let loc = DriveLoc { path: d.path.clone(), sector: d.logical_block_size };
        if new_size == rec.size {
            return Ok((rec, loc, new_size));
        }
        let region_end = gpt::usable_region(d.size_bytes, d.logical_block_size).map_or(0, |(_, e)| e);
        let mut others: Vec<(u64, u64)> =
            self.book.values().filter(|r| r.drive_id == rec.drive_id && r.id != rec.id).map(|r| (r.start, r.size)).collect();
        others.extend(d.extents.iter().copied());
        let room = model::grow_room(rec.start, rec.size, &others, region_end);
        // Past the end of the drive it can never grow, whatever follows it now.
        let blocked = room.blocked && new_size <= region_end.saturating_sub(rec.start);
        if new_size > room.max_size {
            let reason = format!(
                "volume {id} can grow in place to at most {} bytes on drive {}, not {new_size}",
                room.max_size, rec.drive_id
            );
            return Err(if blocked {
                VolumeError::ResourceExhausted { reason: format!("{reason}: another volume or partition follows it") }
            } else if room.blocked {
                VolumeError::OutOfRange { reason: format!("{reason}, and {new_size} bytes from its start run past the end of the drive") }
            } else {
                VolumeError::OutOfRange { reason: format!("{reason}: the drive ends there") }
            });
        }
        Ok((rec, loc, new_size))
    }
}

impl Handler<ExpandVolume> for VolumeManager {
    type Result = ResponseActFuture<Self, Result<(u64, bool), VolumeError>>;
    fn handle(&mut self, m: ExpandVolume, _: &mut Context<Self>) -> Self::Result {
        let (rec, loc, new_size) = match self.expand_check(&m) {
            Ok(x) => x,
            Err(e) => return Box::pin(fut::ready(Err(e))),
        };
        let store = match self.claim(&m.volume_id) {
            Ok(s) => s,
            Err(e) => return Box::pin(fut::ready(Err(e))),
        };
        let lock = self.lock_of(&rec.drive_id);
        let node_step = !rec.block;
        // The space is the volume's from now on: a create placed meanwhile sees it taken.
        let mut reserved = rec.clone();
        reserved.size = new_size;
        self.book.insert(reserved.id.clone(), reserved);
        Box::pin(
            self.run(m.volume_id, move || ops::expand(&store, &loc, &lock, rec, new_size))
                .map(move |res, _, _| res.map(|size| (size, node_step))),
        )
    }
}

impl Handler<NodeExpandVolume> for VolumeManager {
    type Result = ResponseActFuture<Self, Result<u64, VolumeError>>;
    fn handle(&mut self, m: NodeExpandVolume, _: &mut Context<Self>) -> Self::Result {
        let (store, rec, loc) = match self.node_call(&m.volume_id, true) {
            Ok(x) => x,
            Err(e) => return Box::pin(fut::ready(Err(e))),
        };
        drop(store);
        let at_path = rec.staging.as_ref().is_some_and(|s| s.path == m.path) || rec.targets.contains_key(&m.path);
        if !at_path {
            self.busy.remove(&m.volume_id);
            return Box::pin(fut::ready(Err(VolumeError::PathNotFound { volume_id: m.volume_id, path: m.path })));
        }
        let Some(loc) = loc else {
            // node_call answered without a drive: only an adopted volume has none.
            self.busy.remove(&m.volume_id);
            return Box::pin(fut::ready(Err(VolumeError::FailedPrecondition {
                volume_id: m.volume_id,
                reason: "is adopted: its filesystem is not drivelet's to grow".into(),
            })));
        };
        self.run(m.volume_id, move || ops::node_expand(&loc, rec))
    }
}

impl Handler<DetachVolume> for VolumeManager {
    type Result = Result<(), VolumeError>;
    fn handle(&mut self, m: DetachVolume, _: &mut Context<Self>) -> Self::Result {
        let (store, ready) = (self.store.clone(), self.ready);
        let Some(store) = store.filter(|_| ready) else { return Err(VolumeError::NotReady) };
        let Some(rec) = self.book.get(&m.volume_id) else { return Ok(()) };
        let Some(attached) = rec.published_node.clone() else { return Ok(()) };
        if m.node_id.as_ref().is_some_and(|n| *n != attached) {
            return Ok(());
        }
        if self.busy.contains(&m.volume_id) {
            return Err(VolumeError::Aborted { volume_id: m.volume_id });
        }
        let mut rec = rec.clone();
        rec.published_node = None;
        store.put(&rec.id, &rec).map_err(VolumeError::Store)?;
        info!(volume.id = %rec.id, node.name = %attached, "volume detached from node");
        self.book.insert(rec.id.clone(), rec);
        Ok(())
    }
}

impl Handler<GetVolume> for VolumeManager {
    type Result = Result<VolumeRecord, VolumeError>;
    fn handle(&mut self, m: GetVolume, _: &mut Context<Self>) -> Self::Result {
        self.visible(&m.volume_id).cloned()
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

/// Query: answers once start-up reconciliation is done (at once when it is): `true`, or
/// `false` if the manager went away before it was ready.
#[derive(Message, Debug, Clone)]
#[rtype(result = "bool")]
pub struct WaitReady;

impl Handler<WaitReady> for VolumeManager {
    type Result = ResponseFuture<bool>;
    fn handle(&mut self, _: WaitReady, _: &mut Context<Self>) -> Self::Result {
        if self.ready {
            return Box::pin(async { true });
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.ready_waiters.push(tx);
        Box::pin(async move { rx.await.is_ok() })
    }
}
