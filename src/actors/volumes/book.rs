//! The volume book: what the volume manager knows (records, present drives, busy
//! volumes, drive uses, check findings, conditions) and every decision about it, as
//! plain code without an actor or a disk.
//!
//! Rules it enforces:
//! - nothing is served until start-up reconciliation loaded the book (`NotReady`);
//! - one operation per volume at a time: [`VolumeBook::claim`] hands out a [`Claim`]
//!   that releases the volume when dropped, whatever path the call takes; a second
//!   claim of a busy volume is `Aborted`;
//! - a `Creating` record is never shown (it was never handed out), but it reserves its
//!   extent for placement;
//! - a repeated CreateVolume or AdoptVolume of an existing volume answers it when the
//!   request matches and `AlreadyExists` when it does not; a lost volume is never a
//!   success;
//! - a clone (CreateVolume naming a source volume) is decided with its source: what
//!   may be copied, and how large the clone is ([`clone`]'s rules);
//! - attach, expand, detach and release are decided here; the actor runs the disk and
//!   store steps the decision asks for and hands their outcome back
//!   ([`VolumeBook::finish`]);
//! - while a drive's volumes are reconciled with its partitions (it appeared, or its
//!   media changed) their conditions keep the verdict they had: a drive that comes back
//!   turns its volumes normal only once they are checked and free to stage again.
//!
//! What lives where: this file holds the book's fields and the decisions of the
//! ordinary calls (attach, expand, detach, adopt, node calls, statuses); [`create`] a
//! CreateVolume's attempts ([`VolumeBook::begin_create`]); [`clone`] a clone's source;
//! [`snapshot`] snapshots; [`drives`] drive events, release and cordon; [`cleaning`]
//! dirty space; [`evacuate`] every bit of an evacuation's state and its moves;
//! [`grow`] how an expansion grows a volume (in place, or by a move to another drive);
//! [`claim`] the guards.

pub(crate) mod claim;
mod cleaning;
mod clone;
mod create;
mod drives;
mod evacuate;
mod grow;
mod snapshot;
#[cfg(test)]
mod tests;

use crate::words::{DriveClass, DriveLoc, DriveUse, Health, Media};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::{info, warn};

use super::conditions::{self, Condition, Finding};
use super::usage;
use super::messages::{AdoptVolume, AttachVolume, DetachVolume, NodeExpandVolume, VolumeStatus};
use super::model::{self, Refusal, VolumeRecord, VolumeState};

use super::placement::Candidate;
use super::view::{DriveRoom, Listed, ViewPublisher, ViewReader, VolumesView};
use super::error::VolumeError;

use crate::actors::inventory::model::Drive;
use super::messages::VolumeConditionChanged;
use crate::config::VolumesConfig;

pub(crate) use self::claim::Guards;
pub(crate) use self::clone::{InUsePlan, Source, ENCRYPTED_COPY};
pub(crate) use self::claim::Claim;
pub(crate) use self::cleaning::Dirty;
pub(crate) use self::create::{CreateCall, CreateStart};
pub(crate) use self::evacuate::MovePlan;
pub(crate) use self::grow::ExpandPlan;

/// What a CreateVolume asks for, decided.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CreatePlan {
    /// The volume exists as asked (or is being created by this very name): answer it.
    Existing(VolumeRecord),
    /// A new record, placed: reserve it and run the disk steps.
    New(VolumeRecord),
}

/// What the book holds.
pub(crate) struct VolumeBook {
    cfg: VolumesConfig,
    /// Release a releasing drive once its last volume is gone, even unasked.
    auto_release: bool,
    ready: bool,
    /// Present drives by stable id.
    drives: BTreeMap<String, Drive>,
    /// Records by id, shared with the published views (a change replaces a record).
    records: BTreeMap<String, Arc<VolumeRecord>>,
    guards: Arc<Guards>,
    /// Drives that are releasing or released, by id (persisted).
    drive_use: BTreeMap<String, DriveUse>,
    /// Latest check findings by volume id (from the health poller), of the volumes
    /// where a check found something.
    findings: HashMap<String, Vec<Finding>>,
    /// Last condition logged per volume, to log each change once; abnormal ones only
    /// (a volume without an entry is healthy), so a healthy volume costs nothing here.
    conditions: HashMap<String, Condition>,
    /// Drives whose volumes are being reconciled, with how many reconciliations of
    /// each are pending: their volumes' conditions hold still meanwhile.
    reconciling: BTreeMap<String, u32>,
    /// Where each change of what the cheap calls read is published.
    view: ViewPublisher,
    /// Space per drive that may still hold a former tenant's bytes: never placed on,
    /// never counted as capacity, until the cleaner zeroed it.
    dirty: BTreeMap<String, Dirty>,
    /// The moves of evacuations: running, done, failed.
    evac: evacuate::Evacuations,
    /// Where freezes of copies are recorded and watched from outside the agent.
    freeze_journal: crate::disk::freeze::Journal,
}

/// Where a drive is, for a disk step.
pub(crate) fn drive_loc(d: &Drive) -> DriveLoc {
    DriveLoc { path: d.path.clone(), sector: d.logical_block_size }
}

/// Seconds since the epoch, for records.
pub(crate) fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// What a Drive object shows of a volume that changes with a call on it: the drive it is
/// on, whether it failed, and, while that drive is evacuated, whether the move waits for
/// its unstage (`status.evacuation`'s `waiting` and `queued`). A call that changes any
/// of them is announced to the Drive sync ([`VolumeBook::finish`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shown {
    drive_id: String,
    failed: bool,
    waits_for_unstage: bool,
}

impl VolumeBook {
    /// An empty book, not ready.
    pub(crate) fn new(cfg: VolumesConfig, auto_release: bool) -> VolumeBook {
        VolumeBook {
            cfg,
            auto_release,
            ready: false,
            drives: BTreeMap::new(),
            records: BTreeMap::new(),
            guards: Arc::default(),
            drive_use: BTreeMap::new(),
            findings: HashMap::new(),
            conditions: HashMap::new(),
            reconciling: BTreeMap::new(),
            view: ViewPublisher::default(),
            dirty: BTreeMap::new(),
            evac: evacuate::Evacuations::default(),
            freeze_journal: crate::disk::freeze::Journal::under(std::path::Path::new("/var/lib/drivelet")),
        }
    }

    /// The book of an agent whose freezes are recorded in `journal`.
    pub(crate) fn with_freeze_journal(self, journal: crate::disk::freeze::Journal) -> VolumeBook {
        VolumeBook { freeze_journal: journal, ..self }
    }

    /// A reader of the views this book publishes.
    pub(crate) fn view_reader(&self) -> ViewReader {
        self.view.reader()
    }

    /// Publishes a view of the book as it is now. Every `&mut self` method that changes
    /// what a view shows (readiness, records, drives, drive uses, findings) ends here.
    fn publish(&self) {
        if !self.ready {
            return self.view.publish(VolumesView::not_ready());
        }
        // One condition shared by every healthy volume: a view costs a record pointer and
        // a condition pointer per volume.
        let healthy = Arc::new(conditions::Condition::healthy());
        let volumes = self
            .records
            .values()
            .filter(|r| r.state != VolumeState::Creating && r.is_volume())
            .map(|r| {
                let c = self.condition_of(r);
                let condition = if c.abnormal { Arc::new(c) } else { healthy.clone() };
                Listed { record: r.clone(), condition }
            })
            .collect();
        let drives = self
            .candidates()
            .into_iter()
            .map(|c| DriveRoom { drive: c.drive.clone(), used: c.used.into_owned(), closed: c.closed, slots_used: c.slots_used })
            .collect();
        self.view.publish(VolumesView::ready(volumes, drives));
    }

    /// Forgets what restarting must rebuild from the host: records, drives, claims.
    pub(crate) fn reset(&mut self) {
        self.ready = false;
        self.records.clear();
        self.drives.clear();
        self.reconciling.clear();
        self.dirty.clear();
        self.evac.restarted();
        self.guards.clear_claims();
        self.publish();
    }

    /// Whether start-up reconciliation is done.
    pub(crate) fn is_ready(&self) -> bool {
        self.ready
    }

    /// The roots node paths must lie under.
    pub(crate) fn allowed_roots(&self) -> &[PathBuf] {
        &self.cfg.allowed_roots
    }

    /// Takes in the drives the inventory knows.
    pub(crate) fn add_drives(&mut self, drives: Vec<Drive>) {
        for d in drives {
            self.drives.insert(d.id.clone(), d);
        }
        self.publish();
    }

    /// Every present drive.
    pub(crate) fn drives(&self) -> impl Iterator<Item = &Drive> {
        self.drives.values()
    }

    /// Loads what start-up reconciliation kept and opens the book; answers the usage
    /// records to store for drives whose health was found bad before they were loaded.
    /// `uses`: `None` when they could not be read (the ones known are kept).
    pub(crate) fn load(&mut self, records: Vec<VolumeRecord>, uses: Option<Vec<DriveUse>>) -> Vec<DriveUse> {
        if let Some(uses) = uses {
            self.drive_use = uses.into_iter().map(|u| (u.drive_id.clone(), u)).collect();
        }
        self.records = records.into_iter().map(|r| (r.id.clone(), Arc::new(r))).collect();
        let bad: Vec<(String, String)> =
            self.drives.values().filter(|d| d.health.health == Health::Bad).map(|d| (d.id.clone(), d.health.reason.clone())).collect();
        let mut save = Vec::new();
        for (id, reason) in bad {
            if let Some(u) = usage::usage_after_health(self.drive_use.get(&id), &id, Health::Bad, &reason) {
                self.drive_use.insert(id, u.clone());
                save.push(u);
            }
        }
        self.ready = true;
        self.publish();
        save
    }

    /// The number of records.
    pub(crate) fn volume_count(&self) -> usize {
        self.records.len()
    }

    /// Every record, by id.
    pub(crate) fn records(&self) -> impl Iterator<Item = &VolumeRecord> {
        self.records.values().map(|r| &**r)
    }

    /// The usage records of releasing and released drives.
    pub(crate) fn drive_uses(&self) -> Vec<DriveUse> {
        self.drive_use.values().cloned().collect()
    }

    /// Claims volume `id` for one call: the book is ready and no other call holds it.
    pub(crate) fn claim(&self, id: &str) -> Result<Claim, VolumeError> {
        if !self.ready {
            return Err(VolumeError::NotReady);
        }
        self.try_claim(id).ok_or_else(|| VolumeError::Busy { volume_id: id.to_string() })
    }

    fn try_claim(&self, id: &str) -> Option<Claim> {
        self.guards.try_claim(id)
    }

    /// The book's guards, for the disk steps that need a volume unused and for the
    /// health poller's checks (one instance for the life of the process).
    pub(crate) fn guards(&self) -> Arc<Guards> {
        self.guards.clone()
    }

    /// Whether a call holds volume `id`.
    pub(crate) fn is_busy(&self, id: &str) -> bool {
        self.guards.is_claimed(id)
    }

    /// Where a volume's drive is, for its disk steps. An adopted volume's drive (if
    /// drivelet knows it) is never handed to a disk step: it is not drivelet's to change.
    pub(crate) fn loc_of(&self, rec: &VolumeRecord) -> Option<DriveLoc> {
        if rec.adopted.is_some() {
            return None;
        }
        self.drive_loc(&rec.drive_id)
    }

    /// Where the present drive `drive_id` is.
    pub(crate) fn drive_loc(&self, drive_id: &str) -> Option<DriveLoc> {
        self.drives.get(drive_id).map(drive_loc)
    }

    /// A volume callers may see: the book is ready and the volume exists and is not
    /// still being created (a `Creating` record was never handed out).
    pub(crate) fn visible(&self, id: &str) -> Result<&VolumeRecord, VolumeError> {
        if !self.ready {
            return Err(VolumeError::NotReady);
        }
        match self.records.get(id) {
            Some(r) if r.state != VolumeState::Creating && r.is_volume() => Ok(r),
            _ => Err(VolumeError::NotFound { volume_id: id.to_string() }),
        }
    }

    /// The condition of a volume now: the last one logged while its drive is being
    /// reconciled (no new verdict before its partitions are checked), else judged.
    pub(crate) fn condition_of(&self, rec: &VolumeRecord) -> Condition {
        if self.reconciling.contains_key(&rec.drive_id) {
            if let Some(c) = self.conditions.get(&rec.id) {
                return c.clone();
            }
        }
        let f = self.findings.get(&rec.id).map(Vec::as_slice).unwrap_or(&[]);
        conditions::condition(rec, self.drives.get(&rec.drive_id), self.drive_use.get(&rec.drive_id), f)
    }

    /// A visible volume with its condition.
    pub(crate) fn status(&self, id: &str) -> Result<VolumeStatus, VolumeError> {
        let r = self.visible(id)?;
        Ok(VolumeStatus { record: r.clone(), condition: self.condition_of(r) })
    }

    #[cfg(test)]
    /// A page of shown volumes after `after` (by id), at most `max` (0: all), and the
    /// id to go on after when more follow: the page of the view published last.
    pub(crate) fn page(&self, after: Option<&str>, max: usize) -> Result<(Vec<VolumeStatus>, Option<String>), VolumeError> {
        self.page_where(after, max, false)
    }

    /// [`VolumeBook::page`], of the abnormal volumes only when `abnormal_only`
    /// (ControllerListVolumeHealth omits healthy volumes).
    pub(crate) fn page_where(&self, after: Option<&str>, max: usize, abnormal_only: bool) -> Result<(Vec<VolumeStatus>, Option<String>), VolumeError> {
        use std::ops::Bound;
        if !self.ready {
            return Err(VolumeError::NotReady);
        }
        let lower = match after {
            Some(a) => Bound::Excluded(a.to_string()),
            None => Bound::Unbounded,
        };
        let max = if max == 0 { usize::MAX } else { max };
        let mut out: Vec<VolumeStatus> = Vec::new();
        let mut next = None;
        for r in self.records.range((lower, Bound::Unbounded)).map(|(_, r)| r) {
            if r.state == VolumeState::Creating || !r.is_volume() {
                continue;
            }
            let condition = self.condition_of(r);
            if abnormal_only && !condition.abnormal {
                continue;
            }
            if out.len() == max {
                next = out.last().map(|s| s.record.id.clone());
                break;
            }
            out.push(VolumeStatus { record: VolumeRecord::clone(r), condition });
        }
        Ok((out, next))
    }

    /// The health of this node's storage (NodeGetStorageHealth): its managed drives,
    /// and the drives that hold shown volumes but are missing.
    pub(crate) fn storage_health(&self) -> Result<Vec<conditions::StorageEntry>, VolumeError> {
        if !self.ready {
            return Err(VolumeError::NotReady);
        }
        let present: Vec<&Drive> = self.drives.values().filter(|d| d.class == DriveClass::Managed).collect();
        let mut missing: BTreeMap<String, usize> = BTreeMap::new();
        for r in self.records.values() {
            let adopted_elsewhere = r.adopted.is_some() && r.drive_id.is_empty();
            if r.state != VolumeState::Creating && !adopted_elsewhere && !self.drives.contains_key(&r.drive_id) {
                *missing.entry(r.drive_id.clone()).or_default() += 1;
            }
        }
        Ok(conditions::storage_health(&present, &missing.into_iter().collect::<Vec<_>>()))
    }

    /// Recomputes the conditions of the matching volumes, logs each change once and
    /// answers the changes to tell.
    pub(crate) fn refresh(&mut self, which: impl Fn(&VolumeRecord) -> bool) -> Vec<VolumeConditionChanged> {
        let mut changed = Vec::new();
        for rec in self.records.values().filter(|r| which(r) && r.state != VolumeState::Creating && r.is_volume()) {
            let c = self.condition_of(rec);
            // Only abnormal conditions are kept: none logged means healthy.
            let change = match self.conditions.get(&rec.id) {
                Some(before) => *before != c,
                None => c.abnormal,
            };
            if change {
                changed.push((rec.id.clone(), rec.drive_id.clone(), c));
            }
        }
        let mut events = Vec::new();
        for (id, drive, c) in changed {
            if c.abnormal {
                warn!(volume.id = %id, drive.id = %drive, volume.abnormal = true, volume.condition = %c.message, "volume condition changed");
            } else {
                info!(volume.id = %id, drive.id = %drive, volume.abnormal = false, volume.condition = %c.message, "volume condition changed");
            }
            let reasons = c.entries.iter().map(|e| e.reason).collect();
            events.push(VolumeConditionChanged { volume_id: id.clone(), abnormal: c.abnormal, message: c.message.clone(), reasons });
            if c.abnormal {
                self.conditions.insert(id, c);
            } else {
                self.conditions.remove(&id);
            }
        }
        events
    }

    /// Takes in what a volume's checks found; `false` when the check raced with an
    /// operation on the volume (or the volume is gone) and was dropped as stale.
    pub(crate) fn checked(&mut self, volume_id: String, findings: Vec<Finding>) -> bool {
        if self.is_busy(&volume_id) || !self.records.contains_key(&volume_id) {
            return false;
        }
        // Only volumes with findings have an entry: none means nothing found.
        if self.findings.get(&volume_id).map_or(&[][..], Vec::as_slice) != findings.as_slice() {
            if findings.is_empty() {
                self.findings.remove(&volume_id);
            } else {
                self.findings.insert(volume_id, findings);
            }
            self.publish();
        }
        true
    }

    /// Stores what a volume's operation handed back (`None`: the volume is gone) and
    /// answers the drives whose shown volumes changed.
    /// `before` is what [`VolumeBook::shown`] said when the operation began.
    pub(crate) fn finish(&mut self, id: &str, before: Option<Shown>, record: Option<VolumeRecord>, clear_findings: bool) -> BTreeSet<String> {
        if clear_findings {
            self.findings.remove(id);
        }
        match record {
            Some(r) => {
                self.records.insert(r.id.clone(), Arc::new(r));
            }
            None => {
                self.records.remove(id);
            }
        }
        self.publish();
        let after = self.shown(id);
        if before == after {
            return BTreeSet::new();
        }
        before.into_iter().chain(after).map(|s| s.drive_id).collect()
    }

    /// Forgets the logged condition of a volume that is gone.
    pub(crate) fn forget_condition(&mut self, id: &str) {
        if !self.records.contains_key(id) {
            self.conditions.remove(id);
        }
    }

    /// What the Drive objects show of one volume (or snapshot) that its drive's sync must
    /// hear about at once; `None` while it is unknown or still being created (never
    /// handed out).
    pub(crate) fn shown(&self, id: &str) -> Option<Shown> {
        self.records.get(id).filter(|r| r.state != VolumeState::Creating).map(|r| Shown {
            drive_id: r.drive_id.clone(),
            failed: r.failed,
            waits_for_unstage: r.staging.is_some() && self.drive_use.get(&r.drive_id).is_some_and(|u| u.evacuate.is_some()),
        })
    }

    /// The drive a volume lives on, if it is known.
    pub(crate) fn drive_of(&self, id: &str) -> Option<String> {
        self.records.get(id).map(|r| r.drive_id.clone())
    }

    fn candidates(&self) -> Vec<Candidate<'_>> {
        self.candidates_with(true)
    }

    /// The candidates for placement; `with_dirty`: space still being cleaned counts as
    /// used (always, but to tell whether a create waits for the cleaner).
    fn candidates_with(&self, with_dirty: bool) -> Vec<Candidate<'_>> {
        // One pass over the records, not one per drive.
        // Each record's extent (and a move's other one) is a partition: one slot each.
        let mut by_drive: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
        for r in self.records.values().filter(|r| r.adopted.is_none()) {
            by_drive.entry(r.drive_id.as_str()).or_default().push((r.start, r.size));
            // A move's other extent (its copy, or the partition it leaves) is taken too.
            if let Some(m) = &r.moving {
                by_drive.entry(m.drive_id.as_str()).or_default().push((m.start, m.size));
            }
        }
        self.drives
            .values()
            .filter(|d| d.class == DriveClass::Managed)
            .map(|d| {
                let mut used = by_drive.remove(d.id.as_str()).unwrap_or_default();
                used.extend(d.extents.iter().copied());
                let slots_used = u32::try_from(used.len()).unwrap_or(u32::MAX);
                if with_dirty {
                    used.extend(self.dirty.get(&d.id).into_iter().flat_map(|x| x.extents.iter().copied()));
                }
                let closed = self.drive_use.contains_key(&d.id) || d.health.health == Health::Bad;
                Candidate { drive: d, used: used.into(), closed, slots_used }
            })
            .collect()
    }

    /// Reserves a record's extent (a new volume being created, or the size an expansion
    /// grows to): a create placed meanwhile sees the space taken.
    pub(crate) fn reserve(&mut self, rec: VolumeRecord) {
        self.records.insert(rec.id.clone(), Arc::new(rec));
        self.publish();
    }

    /// Decides a DeleteVolume: the record to delete, `None` when it is gone already.
    pub(crate) fn plan_delete(&self, id: &str) -> Option<VolumeRecord> {
        self.records.get(id).filter(|r| r.is_volume()).map(|r| VolumeRecord::clone(r))
    }

    /// Common start of a node call: ready, known; the drive when present (required
    /// unless the volume is adopted when `need_drive`).
    pub(crate) fn node_call(&self, id: &str, need_drive: bool) -> Result<(VolumeRecord, Option<DriveLoc>), VolumeError> {
        if !self.ready {
            return Err(VolumeError::NotReady);
        }
        let rec = self.records.get(id).filter(|r| r.is_volume()).map(|r| VolumeRecord::clone(r)).ok_or_else(|| VolumeError::NotFound { volume_id: id.to_string() })?;
        let loc = self.loc_of(&rec);
        if need_drive && loc.is_none() && rec.adopted.is_none() {
            return Err(VolumeError::DriveAbsent { volume_id: id.to_string(), drive_id: rec.drive_id });
        }
        Ok((rec, loc))
    }

    /// Decides a NodeExpandVolume of a node call's volume: the path must be one the
    /// volume is staged or published at, and its filesystem drivelet's.
    pub(crate) fn node_expand_check(m: &NodeExpandVolume, rec: &VolumeRecord, loc: Option<DriveLoc>) -> Result<DriveLoc, VolumeError> {
        let at_path = rec.staging.as_ref().is_some_and(|s| s.path == m.path) || rec.targets.contains_key(&m.path);
        if !at_path {
            return Err(VolumeError::PathNotFound { volume_id: m.volume_id.clone(), path: m.path.clone() });
        }
        // node_call answered without a drive: only an adopted volume has none.
        loc.ok_or_else(|| VolumeError::AdoptedFilesystem { volume_id: m.volume_id.clone() })
    }

    /// Whether a volume may be attached as asked: it exists, serves the access type and
    /// filesystem, is attached to no other node, and its drive takes the attachment.
    pub(crate) fn attach_refusal(&self, m: &AttachVolume) -> Result<VolumeRecord, VolumeError> {
        let id = m.volume_id.as_str();
        let rec = self.visible(id)?.clone();
        if rec.state == VolumeState::Deleting {
            return Err(VolumeError::refused(&rec, Refusal::BeingDeleted));
        }
        if m.block != rec.block && !rec.rebuilt {
            return Err(VolumeError::WrongAccessType { volume_id: id.to_string(), block: rec.block, call: "published" });
        }
        if !m.block && !m.fs_type.is_empty() && !rec.fs_type.is_empty() && m.fs_type != rec.fs_type {
            return Err(VolumeError::WrongFilesystem { volume_id: id.to_string(), holds: rec.fs_type.clone(), asked: m.fs_type.clone() });
        }
        if let Some(other) = rec.published_node.as_deref().filter(|n| *n != m.node_id) {
            return Err(VolumeError::AttachedElsewhere { volume_id: id.to_string(), node: other.to_string() });
        }
        let d = self.drives.get(&rec.drive_id);
        if let Some(refusal) = usage::attach_refusal(&rec, d, self.drive_use.get(&rec.drive_id), &m.node_id) {
            return Err(refusal);
        }
        if rec.adopted.is_none() && self.loc_of(&rec).is_none() {
            return Err(VolumeError::DriveMissing { volume_id: id.to_string(), drive_id: rec.drive_id.clone() });
        }
        Ok(rec)
    }

    /// Decides a DetachVolume: the record without its attachment, to store, and the node
    /// it was attached to; `None` when the volume is unknown or not attached to the node
    /// (detached already).
    pub(crate) fn plan_detach(&self, m: &DetachVolume) -> Result<Option<(VolumeRecord, String)>, VolumeError> {
        if !self.ready {
            return Err(VolumeError::NotReady);
        }
        let Some(rec) = self.records.get(&m.volume_id).filter(|r| r.is_volume()) else { return Ok(None) };
        let Some(attached) = rec.published_node.clone() else { return Ok(None) };
        if m.node_id.as_ref().is_some_and(|n| *n != attached) {
            return Ok(None);
        }
        let mut rec = VolumeRecord::clone(rec);
        rec.published_node = None;
        Ok(Some((rec, attached)))
    }

    /// Decides an AdoptVolume of the directory `canonical` (what `m.path` resolves to):
    /// the existing volume adopting it, or a new record of `size` bytes on `devnum`'s
    /// drive (if drivelet knows it).
    pub(crate) fn plan_adopt(&self, m: &AdoptVolume, canonical: &Path, devnum: Option<(u32, u32)>, size: u64) -> Result<CreatePlan, VolumeError> {
        if let Some(r) = self.records.get(&m.volume_id) {
            let same = r.adopted.as_ref().is_some_and(|a| a.path == canonical && a.pv_name == m.pv_name);
            return if same {
                Ok(CreatePlan::Existing(VolumeRecord::clone(r)))
            } else {
                Err(VolumeError::AlreadyExists { volume: m.volume_id.clone(), reason: "exists with other data".into() })
            };
        }
        if let Some(r) = self.records.values().find(|r| r.adopted.as_ref().is_some_and(|a| a.path == canonical)) {
            return Err(VolumeError::AlreadyExists { volume: r.id.clone(), reason: format!("already adopts {}", canonical.display()) });
        }
        let drive = devnum.and_then(|n| self.drives.values().find(|d| d.devnum == n));
        Ok(CreatePlan::New(VolumeRecord {
            drive_id: drive.map(|d| d.id.clone()).unwrap_or_default(),
            size,
            media: drive.map(|d| d.media).unwrap_or(Media::Virtual),
            fs_type: m.fs_type.clone(),
            formatted: true,
            adopted: Some(model::Adopted { path: canonical.to_path_buf(), pv_name: m.pv_name.clone() }),
            ..VolumeRecord::new(m.volume_id.clone(), m.pv_name.clone(), VolumeState::Available, now_unix())
        }))
    }
}
