//! The disk side of start-up: open the store, reconcile its records with the drives'
//! GPTs and the host's mounts, and find what is dirty on each managed drive; the same
//! for one drive that appears or changes media ([`settle`]).
//!
//! Rules: [`reconcile::plan`] decides, [`settle`] carries the plan out (a record whose
//! create or delete was cut short is finished or rolled back, a move cut short is
//! finished or its copy removed); only managed drives are read for drivelet
//! partitions; the caller holds the claims of a drive's records while it is settled.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use tracing::{error, info, warn};

use crate::actors::inventory::model::Drive;
use crate::actors::volumes::book::{drive_loc, now_unix, Guards};
use crate::actors::volumes::cleaner;
use crate::actors::volumes::error::VolumeError;
use crate::actors::volumes::model::{VolumeRecord, VolumeState};
use crate::actors::volumes::reconcile;
use crate::disk::{clean, gpt};
use crate::store::{Kind, Store};
use crate::words::{DriveClass, DriveUse};

/// What start-up reconciliation hands the actor.
pub(crate) struct Started {
    /// The store, open.
    pub store: Store,
    /// The records to serve.
    pub records: Vec<VolumeRecord>,
    /// The drives' usage records; `None` when they cannot be read.
    pub uses: Option<Vec<DriveUse>>,
    /// What is dirty on each managed drive.
    pub dirty: Vec<DriveDirty>,
}

/// What is dirty on one managed drive, as read from it, and whether the cleaner may
/// zero it now.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DriveDirty {
    /// The drive.
    pub drive_id: String,
    /// Dirty extents (never one a record or another partition holds).
    pub extents: Vec<(u64, u64)>,
    /// What the drive must hold for the cleaner to zero them; `None`: not now (the
    /// drive could not be read, or it is blank but records of lost volumes point at
    /// it), and the space stays unavailable.
    pub expect: Option<cleaner::Expect>,
}

/// The drives this node's store has records of (volumes, snapshots, usage): a drivelet
/// disk of these without a note is this node's own from before disks carried one. Read
/// once before the volume manager opens the store; empty when there is none yet.
pub(crate) fn known_drives(dir: &std::path::Path) -> BTreeSet<String> {
    if !Store::path_in(dir).exists() {
        return BTreeSet::new();
    }
    let store = match Store::open(dir) {
        Ok(s) => s,
        Err(e) => {
            warn!(actor = "volumes", error = %e, "cannot read the store to tell this node's drives from others'");
            return BTreeSet::new();
        }
    };
    let mut known: BTreeSet<String> = store.load::<VolumeRecord>().map(|(r, _)| r.into_iter().map(|r| r.drive_id).collect()).unwrap_or_default();
    if let Ok((uses, _)) = store.load_in::<DriveUse>(Kind::Drive) {
        known.extend(uses.into_iter().map(|u| u.drive_id));
    }
    known
}

/// Opens the store and carries out the start-up plan.
pub(crate) fn startup(dir: &std::path::Path, drives: &[Drive], guards: &Arc<Guards>, clean_blank: bool) -> Result<Started, VolumeError> {
    let store = Store::open(dir).map_err(VolumeError::Store)?;
    let (records, bad) = store.load::<VolumeRecord>().map_err(VolumeError::Store)?;
    for b in bad {
        error!(actor = "volumes", volume.id = %b.id, error = %b.reason, "unreadable volume record kept aside");
    }
    let (keep, dirty) = settle(&store, guards, records, drives, clean_blank, &reconcile::Others::default())?;
    let uses = match store.load_in::<DriveUse>(Kind::Drive) {
        Ok((uses, bad)) => {
            for b in bad {
                error!(actor = "volumes", drive.id = %b.id, error = %b.reason, "unreadable drive record kept aside");
            }
            Some(uses)
        }
        Err(e) => {
            error!(actor = "volumes", error = %e, "cannot read drive usage records");
            None
        }
    };
    Ok(Started { store, records: keep, uses, dirty })
}

/// Reconciles `records` with the GPTs of `drives` (the drives present) and the host's
/// mounts ([`reconcile::plan`]) and carries the plan out; returns the records to serve.
/// At start-up for every record and drive; later for one drive that appeared. Also
/// answers what is dirty on each managed drive once the plan is carried out.
pub(crate) fn settle(
    store: &Store,
    guards: &Arc<Guards>,
    records: Vec<VolumeRecord>,
    drives: &[Drive],
    clean_blank: bool,
    others: &reconcile::Others,
) -> Result<(Vec<VolumeRecord>, Vec<DriveDirty>), VolumeError> {
    let mut tables = reconcile::Tables::new();
    let mut notes = reconcile::Notes::new();
    let mut others = others.clone();
    // Only managed drives are read for drivelet partitions (and so only they are ever
    // written to or adopted from); a drive carrying a drivelet GPT is classified
    // managed from the table on the disk itself, even before udev has caught up. A
    // drive records point at that is not managed now is only looked at: without a
    // drivelet table there (wiped, or made something else), its volumes are lost.
    let held: BTreeSet<&str> = records.iter().map(|r| r.drive_id.as_str()).collect();
    for d in drives.iter().filter(|d| d.class == DriveClass::Managed || held.contains(d.id.as_str())) {
        let managed = d.class == DriveClass::Managed;
        match gpt::read_table(&d.path, d.logical_block_size) {
            Ok(Some(t)) if t.is_drivelet() && managed => {
                if let crate::disk::note::NoteState::Note(n) = t.note {
                    notes.insert(d.id.clone(), n.volumes);
                }
                tables.insert(d.id.clone(), t.partitions.into_iter().filter(|q| q.is_drivelet()).collect());
            }
            Ok(Some(t)) if t.is_drivelet() => {
                others.unread.insert(d.id.clone(), format!("is {} now ({}) though it carries a drivelet table", d.class.as_str(), d.reason));
            }
            Ok(_) => {}
            Err(e) => {
                warn!(actor = "volumes", drive.id = %d.id, error = %e, "cannot read the partition table");
                others.unread.insert(d.id.clone(), format!("cannot be read now ({e})"));
            }
        }
    }
    let mounted: BTreeSet<PathBuf> =
        crate::disk::mounts::read_mountinfo().unwrap_or_default().into_iter().map(|m| m.mount_point).collect();
    let plan = reconcile::plan(records, drives, &tables, &mounted, now_unix(), &notes, &others);
    for line in &plan.reports {
        warn!(actor = "volumes", "{line}");
    }
    let loc = |id: &str| drives.iter().find(|d| d.id == id).map(drive_loc);
    let mut keep = plan.keep;
    for rec in plan.rollback {
        // Without a drivelet table on the drive, nothing was written: only the record goes.
        let res = match (loc(&rec.drive_id), tables.contains_key(&rec.drive_id)) {
            (Some(d), true) => super::volume::rollback_create(store, &d, &rec),
            _ => store.remove(&rec.id).map_err(VolumeError::Store),
        };
        if let Err(e) = res {
            error!(actor = "volumes", volume.id = %rec.id, error = %e, "cannot roll back an unfinished create; kept");
            keep.push(rec);
        }
    }
    for rec in plan.finish_delete {
        let d = if tables.contains_key(&rec.drive_id) { loc(&rec.drive_id) } else { None };
        if let Err(e) = super::volume::delete_steps(store, guards, d.as_ref(), &rec) {
            error!(actor = "volumes", volume.id = %rec.id, error = %e, "cannot finish an interrupted delete; kept");
            keep.push(rec);
        }
    }
    for id in plan.drop {
        store.remove(&id).map_err(VolumeError::Store)?;
    }
    for (drive_id, guid, start) in &plan.stray_copies {
        if let Some(d) = loc(drive_id) {
            if let Err(e) = super::moves::remove_copy(&d, *guid, *start) {
                error!(actor = "volumes", drive.id = %drive_id, partition = %guid, error = %e, "cannot remove the copy of a move cut short");
            }
        }
    }
    for rec in keep.iter_mut().filter(|r| plan.finish_moves.contains(&r.id)) {
        let Some(dst) = loc(&rec.drive_id) else { continue };
        let src = rec.moving.as_ref().and_then(|m| loc(&m.drive_id));
        match super::moves::finish_move(store, src.as_ref(), &dst, rec) {
            Ok(()) if rec.moving.is_none() => info!(actor = "volumes", volume.id = %rec.id, drive.id = %rec.drive_id, "move finished"),
            Ok(()) => warn!(actor = "volumes", volume.id = %rec.id, drive.id = %rec.drive_id, "move finished but for the old partition, on a drive that is absent: it is removed when the drive is back"),
            Err(e) => error!(actor = "volumes", volume.id = %rec.id, error = %e, "cannot finish an interrupted move; the volume serves from its new drive"),
        }
    }
    // A snapshot taken back from its drive is named by its note; one without a whole
    // note was cut short and is rolled back (it holds a copy, never anyone's data).
    let mut unfinished = Vec::new();
    keep.retain_mut(|rec| {
        let Some(snap) = rec.snapshot.as_mut().filter(|s| rec.rebuilt && s.source_volume_id.is_empty()) else { return true };
        let Some(d) = loc(&rec.drive_id) else { return true };
        let note = crate::disk::blkpg::ensure_kernel_partition(&d.path, rec.start, rec.size)
            .and_then(|kp| crate::disk::snapshot_note::read(&kp.devnode, snap.restore_size));
        match note {
            Ok(Some(n)) => {
                info!(actor = "volumes", snapshot.id = %rec.id, snapshot.name = %n.name, volume.id = %n.source_volume_id, "snapshot taken back from its note");
                snap.source_volume_id = n.source_volume_id;
                snap.restore_size = n.restore_size;
                snap.created_unix_nanos = n.created_unix_nanos;
                rec.name = n.name;
                rec.block = n.block;
                rec.formatted = !n.fs_type.is_empty();
                rec.fs_type = n.fs_type;
                true
            }
            Ok(None) => {
                warn!(actor = "volumes", snapshot.id = %rec.id, drive.id = %rec.drive_id, "a snapshot partition without a whole note: a snapshot cut short; rolling it back");
                unfinished.push((rec.clone(), d));
                false
            }
            Err(e) => {
                warn!(actor = "volumes", snapshot.id = %rec.id, error = %e, "cannot read the snapshot's note; kept as it is");
                true
            }
        }
    });
    for (rec, d) in unfinished {
        if let Err(e) = super::volume::rollback_create(store, &d, &rec) {
            error!(actor = "volumes", snapshot.id = %rec.id, error = %e, "cannot roll back an unfinished snapshot; kept");
            keep.push(rec);
        }
    }
    for rec in keep.iter_mut() {
        // A rebuilt volume that may hold a filesystem nobody recorded (rebuilt from its
        // label, or from a note written before its first stage): a filesystem found is
        // data, never formatted again.
        if rec.rebuilt && rec.is_volume() && !rec.block && !rec.formatted && rec.state == VolumeState::Available {
            if let Some(d) = loc(&rec.drive_id) {
                if let Ok(kp) = crate::disk::blkpg::ensure_kernel_partition(&d.path, rec.start, rec.size) {
                    match crate::disk::fs::probe_fs(&kp.devnode) {
                        Ok(Some(fs)) => {
                            rec.fs_type = fs;
                            rec.formatted = true;
                        }
                        Ok(None) => {}
                        Err(e) => warn!(actor = "volumes", volume.id = %rec.id, error = %e, "cannot probe the filesystem"),
                    }
                }
            }
        }
        if plan.changed.contains(&rec.id) {
            store.put(&rec.id, rec).map_err(VolumeError::Store)?;
        }
    }
    let dirty = drives.iter().filter(|d| d.class == DriveClass::Managed).map(|d| dirty_on(d, &keep, clean_blank)).collect();
    Ok((keep, dirty))
}

/// What is dirty on the managed drive `d` whose records are among `keep`: by its
/// journal; all of its free space when that cannot be read (unknown is dirty); for a
/// blank drive, by policy (`clean_blank`). Extents records or other partitions hold
/// are never dirty.
fn dirty_on(d: &Drive, keep: &[VolumeRecord], clean_blank: bool) -> DriveDirty {
    let held: Vec<(u64, u64)> = keep
        .iter()
        .filter(|r| r.adopted.is_none())
        .flat_map(|r| std::iter::once((r.drive_id.as_str(), (r.start, r.size))).chain(r.moving.as_ref().map(|m| (m.drive_id.as_str(), (m.start, m.size)))))
        .filter(|(drive, _)| *drive == d.id)
        .map(|(_, e)| e)
        .chain(d.extents.iter().copied())
        .collect();
    let region: Vec<(u64, u64)> = gpt::usable_region(d.size_bytes, d.logical_block_size).map(|(s, e)| (s, e - s)).into_iter().collect();
    let (extents, expect) = match gpt::read_dirty(&d.path, d.logical_block_size) {
        Ok(gpt::DirtyState::Drivelet { disk_guid, dirty, .. }) => (clean::subtract(&dirty, &held), Some(cleaner::Expect::Table(disk_guid))),
        Ok(gpt::DirtyState::Blank) if !clean_blank => (Vec::new(), None),
        Ok(gpt::DirtyState::Blank) if held.is_empty() => {
            info!(actor = "volumes", drive.id = %d.id, "blank drive taken: it is zeroed whole before its first volume (volumes.clean_blank_drives)");
            (region, Some(cleaner::Expect::Blank))
        }
        Ok(gpt::DirtyState::Blank) => {
            warn!(actor = "volumes", drive.id = %d.id, "the drive is blank but volumes are recorded on it: it takes no new volume and is not cleaned until they are deleted");
            (clean::subtract(&region, &held), None)
        }
        Err(crate::disk::DiskError::Foreign { .. }) => (Vec::new(), None),
        Err(e) => {
            warn!(actor = "volumes", drive.id = %d.id, error = %e, "cannot read what is dirty on the drive: its free space stays unavailable");
            (clean::subtract(&region, &held), None)
        }
    };
    DriveDirty { drive_id: d.id.clone(), extents, expect }
}
