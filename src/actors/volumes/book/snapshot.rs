//! The book's decisions about snapshots (CreateSnapshot, DeleteSnapshot, ListSnapshots).
//!
//! Rules:
//! - the source must be a volume this node shows (NOT_FOUND otherwise), not being
//!   deleted (ABORTED), not adopted (its data is a host directory: FAILED_PRECONDITION),
//!   not lost, on a present drive that is not failing (FAILED_PRECONDITION, saying why);
//! - consistency: a source mounted read-write is copied only under a freeze the class
//!   asks for, and never when it is a block volume in use (FAILED_PRECONDITION naming
//!   the path and how to get a consistent snapshot); unused or read-only it is copied
//!   as it is; while the copy runs the source is claimed (stage, delete: ABORTED);
//! - idempotency: a snapshot of the name taken of the same volume is answered as it is
//!   (one still `Creating`, after a failure, is taken again); of another volume it is
//!   ALREADY_EXISTS;
//! - placement: the source's size plus one MiB for the note, on an open managed drive
//!   other than the source's when one has room (it then outlives the loss of the
//!   source's drive), else on the source's.

use std::path::PathBuf;

use super::{now_unix, CreatePlan, VolumeBook, VolumeError};
use crate::actors::volumes::clone::CloneFrom;
use crate::actors::volumes::messages::CreateSnapshot;
use crate::actors::volumes::model::{SnapshotOf, VolumeRecord, VolumeState};
use crate::actors::volumes::placement::{self, NoRoom};
use crate::actors::volumes::snapshot::{wants_freeze, SnapshotRecord};
use crate::disk::gpt;
use crate::words::{Health, LayoutKind, Media};

impl VolumeBook {
    /// Decides a CreateSnapshot: the existing snapshot of the name, or a new record
    /// placed on a drive with room, with how to copy its source.
    pub(crate) fn plan_snapshot(&self, m: &CreateSnapshot, freeze_limit: std::time::Duration) -> Result<(CreatePlan, Option<CloneFrom>), VolumeError> {
        if !self.ready {
            return Err(VolumeError::NotReady);
        }
        let freeze = wants_freeze(&m.parameters)?;
        let guid = gpt::snapshot_partition_guid(&m.name);
        let id = guid.to_string();
        let existing = self.records.get(&id);
        if let Some(rec) = existing {
            let snap = rec.snapshot.as_ref().ok_or_else(|| VolumeError::Busy { volume_id: id.clone() })?;
            if snap.source_volume_id != m.source_volume_id {
                return Err(VolumeError::SnapshotNameTaken {
                    name: m.name.clone(),
                    existing_source: snap.source_volume_id.clone(),
                    asked_source: m.source_volume_id.clone(),
                });
            }
            match rec.state {
                VolumeState::Deleting => return Err(VolumeError::DeleteUnfinished { volume_id: id }),
                VolumeState::Creating => {}
                _ => return Ok((CreatePlan::Existing(VolumeRecord::clone(rec)), None)),
            }
        }
        let src_id = m.source_volume_id.as_str();
        let src = match self.records.get(src_id) {
            Some(r) if r.is_volume() && r.state != VolumeState::Creating => r,
            _ => return Err(VolumeError::SourceNotFound { source_id: src_id.to_string() }),
        };
        if src.state == VolumeState::Deleting {
            return Err(VolumeError::Busy { volume_id: src_id.to_string() });
        }
        if let Some(a) = &src.adopted {
            return Err(VolumeError::SourceIncompatible {
                source_id: src_id.to_string(),
                reason: format!("it is adopted from {}, a host directory drivelet does not manage; back up its files instead", a.path.display()),
            });
        }
        if src.lost {
            return Err(crate::actors::volumes::conditions::lost(src));
        }
        let d = self
            .drives
            .get(&src.drive_id)
            .ok_or_else(|| VolumeError::DriveAbsent { volume_id: src_id.to_string(), drive_id: src.drive_id.clone() })?;
        if d.health.health == Health::Bad {
            return Err(VolumeError::DriveFailing { volume_id: src_id.to_string(), drive_id: src.drive_id.clone(), health: d.health.reason.clone() });
        }
        let loc = self.loc_of(src).ok_or_else(|| VolumeError::DriveAbsent { volume_id: src_id.to_string(), drive_id: src.drive_id.clone() })?;
        let freeze_at = match writer(src) {
            None => None,
            Some((path, block)) if block || !freeze => {
                return Err(VolumeError::SnapshotSourceInUse { volume_id: src_id.to_string(), path, block });
            }
            Some((path, _)) => Some((path, freeze_limit)),
        };
        let from = CloneFrom { source: VolumeRecord::clone(src), loc, freeze: freeze_at };
        if let Some(rec) = existing {
            // A snapshot still being taken (a failed try): take it again, in its place.
            return Ok((CreatePlan::New(VolumeRecord::clone(rec)), Some(from)));
        }
        let size = src.size + gpt::ALIGN;
        let others: Vec<_> = self.candidates().into_iter().filter(|c| c.drive.id != src.drive_id).collect();
        let p = placement::place(&others, None, LayoutKind::Partition, size)
            .or_else(|_| placement::place(&self.candidates(), None, LayoutKind::Partition, size))
            .map_err(|e| match e {
                NoRoom::TooBig(reason) | NoRoom::Full(reason) => VolumeError::ResourceExhausted {
                    reason: format!("no room for a snapshot of volume {src_id} ({} with its note): {reason}", crate::config::human_bytes(size)),
                },
            })?;
        let media = self.drives.get(&p.drive_id).map(|d| d.media).unwrap_or(Media::Virtual);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0);
        let rec = VolumeRecord {
            drive_id: p.drive_id,
            part_guid: guid,
            start: p.start,
            size: p.size,
            layout: LayoutKind::Partition,
            media,
            block: src.block,
            fs_type: src.fs_type.clone(),
            snapshot: Some(SnapshotOf {
                source_volume_id: src_id.to_string(),
                restore_size: src.size,
                created_unix_nanos: now,
                freeze_millis: None,
                freeze,
            }),
            ..VolumeRecord::new(id, m.name.clone(), VolumeState::Creating, now_unix())
        };
        Ok((CreatePlan::New(rec), Some(from)))
    }

    /// Decides a DeleteSnapshot: the record to delete, `None` when it is gone already
    /// (or the id is a volume's: no snapshot of that id exists).
    pub(crate) fn plan_delete_snapshot(&self, id: &str) -> Result<Option<VolumeRecord>, VolumeError> {
        if !self.ready {
            return Err(VolumeError::NotReady);
        }
        Ok(self.records.get(id).filter(|r| r.snapshot.is_some()).map(|r| VolumeRecord::clone(r)))
    }

    /// Every snapshot, by id, with why it cannot be restored from now.
    pub(crate) fn snapshots(&self) -> Result<Vec<SnapshotRecord>, VolumeError> {
        if !self.ready {
            return Err(VolumeError::NotReady);
        }
        Ok(self.records.values().filter_map(|r| SnapshotRecord::of(r, self.unusable(r))).collect())
    }

    /// Why a snapshot cannot be restored from now, if it cannot.
    fn unusable(&self, r: &VolumeRecord) -> Option<String> {
        if r.lost {
            return Some(format!("its partition is gone from drive {}: its data is lost", r.drive_id));
        }
        match self.drives.get(&r.drive_id) {
            None => Some(format!("its drive {} is absent from this node", r.drive_id)),
            Some(d) if d.health.health == Health::Bad => Some(format!("its drive {} is failing: {}", r.drive_id, d.health.reason)),
            Some(_) => None,
        }
    }
}

/// Where a volume is in use for writing, and whether as a block device.
fn writer(rec: &VolumeRecord) -> Option<(PathBuf, bool)> {
    if let Some(st) = rec.staging.as_ref().filter(|s| !s.readonly) {
        return Some((st.path.clone(), st.block));
    }
    rec.targets.iter().find(|(_, t)| !t.readonly).map(|(p, t)| (p.clone(), t.block))
}
