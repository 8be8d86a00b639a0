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
use crate::actors::volumes::steps::CloneFrom;
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
        let from = CloneFrom { source: VolumeRecord::clone(src), loc, freeze: freeze_at, live: false, roots: self.cfg.allowed_roots.clone(), journal: self.freeze_journal.clone(), secrets: Default::default() };
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
            // A snapshot of an encrypted volume is ciphertext under that volume's key
            // (its header copied with it), and says so: deleting it erases that key.
            parameters: if src.encrypted() { src.parameters.clone() } else { Default::default() },
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
        if r.failed {
            return Some(format!("its drive {} was released by force", r.drive_id));
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;
    use crate::actors::inventory::model::Drive;
    use crate::actors::volumes::model::{Staging, Target};
    use crate::config::VolumesConfig;

    const GIB: u64 = 1 << 30;

    fn book(drives: &[&str], records: Vec<VolumeRecord>) -> VolumeBook {
        let mut b = VolumeBook::new(VolumesConfig::default(), false);
        b.add_drives(drives.iter().map(|d| Drive::for_test(d, Media::Ssd, GIB)).collect());
        b.load(records, Some(Vec::new()));
        b
    }

    fn snap(name: &str, source: &str, params: &[(&str, &str)]) -> CreateSnapshot {
        CreateSnapshot {
            name: name.into(),
            source_volume_id: source.into(),
            parameters: params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
        }
    }

    fn source(n: u8) -> VolumeRecord {
        VolumeRecord::for_test(n, VolumeState::Available)
    }

    fn staged(mut r: VolumeRecord, block: bool, readonly: bool) -> VolumeRecord {
        r.block = block;
        r.state = VolumeState::Staged;
        r.staging = Some(Staging { path: "/k/stage".into(), block, flags: vec![], readonly, done: true });
        r
    }

    const LIMIT: Duration = Duration::from_secs(10);

    #[test]
    fn a_snapshot_is_placed_off_its_sources_drive_with_room_for_its_note() {
        let src = source(1);
        let b = book(&["d1", "d2"], vec![src.clone()]);
        let (plan, from) = b.plan_snapshot(&snap("s1", &src.id, &[]), LIMIT).unwrap();
        let CreatePlan::New(rec) = plan else { panic!("a new snapshot") };
        assert_eq!(rec.drive_id, "d2", "another drive than the source's when one has room");
        assert_eq!(rec.size, src.size + gpt::ALIGN, "the source's size and one MiB for the note");
        assert_eq!(rec.id, gpt::snapshot_partition_guid("s1").to_string());
        let s = rec.snapshot.as_ref().unwrap();
        assert_eq!((s.source_volume_id.as_str(), s.restore_size, s.freeze), (src.id.as_str(), src.size, false));
        assert_eq!(rec.state, VolumeState::Creating);
        assert!(from.is_some_and(|f| f.freeze.is_none() && f.source.id == src.id));
        // With one drive only, on the source's.
        let b = book(&["d1"], vec![src.clone()]);
        let (CreatePlan::New(rec), _) = b.plan_snapshot(&snap("s1", &src.id, &[]), LIMIT).unwrap() else { panic!() };
        assert_eq!(rec.drive_id, "d1");
    }

    #[test]
    fn snapshot_decisions() {
        let src = source(1);
        let mut taken = src.clone();
        taken.id = gpt::snapshot_partition_guid("taken").to_string();
        taken.name = "taken".into();
        taken.start = 40 << 20;
        taken.snapshot = Some(SnapshotOf { source_volume_id: src.id.clone(), restore_size: src.size, created_unix_nanos: 1, freeze_millis: None, freeze: false });
        let mut lost = source(2);
        lost.lost = true;
        let mut adopted = source(3);
        adopted.adopted = Some(crate::actors::volumes::model::Adopted { path: "/data".into(), pv_name: "pv".into() });
        let rw_fs = staged(source(4), false, false);
        let ro_fs = staged(source(5), false, true);
        let rw_block = staged(source(6), true, false);
        let mut published = source(7);
        published.state = VolumeState::Published;
        published.targets.insert("/k/t".into(), Target { readonly: false, block: false, done: true });
        let b = book(&["d1"], vec![src.clone(), taken.clone(), lost.clone(), adopted.clone(), rw_fs.clone(), ro_fs.clone(), rw_block.clone(), published.clone()]);
        let freeze = [(crate::actors::volumes::snapshot::FREEZE_PARAM, "true")];
        // (request, Ok(freeze path) or Err(words))
        let table: Vec<(CreateSnapshot, Result<Option<&str>, &str>)> = vec![
            (snap("new", &src.id, &[]), Ok(None)),
            (snap("new", "nope", &[]), Err("source volume nope does not exist on this node")),
            (snap("new", &taken.id, &[]), Err("does not exist on this node")),
            (snap("taken", &lost.id, &[]), Err("already exists, taken of volume")),
            (snap("new", &lost.id, &[]), Err("the data is gone")),
            (snap("new", &adopted.id, &[]), Err("adopted from /data")),
            (snap("new", &rw_fs.id, &[]), Err("mounted read-write at /k/stage")),
            (snap("new", &rw_fs.id, &freeze), Ok(Some("/k/stage"))),
            (snap("new", &ro_fs.id, &[]), Ok(None)),
            (snap("new", &rw_block.id, &freeze), Err("cannot freeze a block volume")),
            (snap("new", &published.id, &[]), Err("mounted read-write at /k/t")),
            (snap("new", &src.id, &[("color", "red")]), Err("unknown snapshot parameter")),
        ];
        for (m, want) in table {
            let what = format!("{} of {}", m.name, m.source_volume_id);
            match (b.plan_snapshot(&m, LIMIT), want) {
                (Ok((CreatePlan::New(_), Some(from))), Ok(path)) => {
                    assert_eq!(from.freeze.as_ref().map(|(p, _)| p.to_str().unwrap()), path, "{what}")
                }
                (Err(e), Err(words)) => assert!(e.to_string().contains(words), "{what}: {e} lacks {words:?}"),
                (got, want) => panic!("{what}: got {:?}, want {want:?}", got.map(|(p, _)| matches!(p, CreatePlan::New(_)))),
            }
        }
        // The same name and source: the snapshot as it is.
        assert!(matches!(b.plan_snapshot(&snap("taken", &src.id, &[]), LIMIT), Ok((CreatePlan::Existing(_), None))));
        // Listed as snapshots, never as volumes.
        let listed = b.snapshots().unwrap();
        assert_eq!(listed.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), vec![taken.id.as_str()]);
        assert!(listed[0].is_ready() && listed[0].unusable.is_none());
        assert!(b.visible(&taken.id).is_err(), "a snapshot is no visible volume");
        assert!(b.plan_delete(&taken.id).is_none(), "DeleteVolume does not delete a snapshot");
        assert_eq!(b.plan_delete_snapshot(&taken.id).unwrap().map(|r| r.id), Some(taken.id.clone()));
        assert_eq!(b.plan_delete_snapshot(&src.id).unwrap(), None, "DeleteSnapshot does not delete a volume");
    }
}
