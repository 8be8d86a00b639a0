//! The disk steps of moving a volume (or snapshot) to another drive of the node, or to
//! another place on its own drive, run off the actor thread, in an order that survives
//! `kill -9` anywhere: either the old or the new copy serves, never both, never
//! neither. Two callers: an evacuation (to another drive only), and a growth by moving
//! (ControllerExpandVolume of an unused volume with no room after it, `book::grow`),
//! whose copy's extent is larger than the volume: the volume's bytes are copied to its
//! start, and the switch, which gives the record the copy's extent, is the growth.
//!
//! Steps ([`move_volume`]), with the crash points between them:
//! 1. the record gets its [`Move`] (where the copy goes) and is stored
//!    (`move.intent_saved`);
//! 2. the copy's GPT entry is written with the move mark [`gpt::MOVE_ATTR`], its
//!    signature areas zeroed (`move.gpt_written`): on another drive with the volume's
//!    partition GUID and its entry in that drive's note; on the volume's own drive with
//!    a temporary GUID of its own ([`Move::copy_guid`]) and no note entry, as two
//!    partitions of one drive cannot carry one GUID;
//! 3. every byte is copied and verified ([`crate::disk::mover`]; `move.copied`); a
//!    volume with unreadable blocks stops here unless forced;
//! 4. the switch: the record now points at the copy, and its `Move` names the old
//!    partition, in one store write (`move.switched`);
//! 5. to another drive: the copy's move mark is cleared (`move.marked`), then the old
//!    partition is removed from its drive, its space dirty in the same GPT commit
//!    (`move.source_removed`); on its own drive, one GPT commit does both and gives the
//!    copy the volume's GUID (`move.renamed`: the old entry goes, the copy's takes the
//!    volume's GUID and loses its mark, the note takes the new size, the old space is
//!    dirty); an encrypted volume's old copy of its key is erased (its new copy is
//!    the one that opens) before the old kernel partition goes;
//! 6. the record drops its `Move` and is stored; the old extent goes to the cleaner.
//!
//! Until step 4 the old partition serves, and a restart (or a failure here) rolls the
//! copy back ([`remove_copy`]: only a partition carrying the copy's GUID and the move
//! mark at the copy's start is removed). From step 4 on the copy serves, and a restart
//! finishes step 5 and 6 ([`finish_move`]; a commit already made is no write).
//! Without the store, a partition carrying the move mark is never taken for a volume
//! (reconciliation rolls it back); the mark is cleared only after the switch is stored,
//! and on one drive only in the commit that removes the old partition.
//!
//! The source must not be mounted anywhere (a filesystem cannot change device under
//! its mount): the caller moves only volumes that are not staged, and this checks the
//! host's mounts again under the volume's claim.

use std::sync::Arc;
use std::time::Instant;

use tracing::{info, warn};

use super::{disk_io as disk, save, Outcome};
use crate::actors::volumes::book::{Guards, MovePlan};
use crate::actors::volumes::error::VolumeError;
use crate::actors::volumes::model::{Move, VolumeRecord};
use crate::disk::lock::DiskLock;
use crate::disk::{blkpg, gpt, mover, DiskError};
use crate::failpoint::crash_point;
use crate::store::Store;
use crate::words::DriveLoc;

/// What a finished move did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MoveDone {
    /// The drive the volume left.
    pub from_drive: String,
    /// Its extent there `(start, size)`: dirty now, to be cleaned.
    pub from_extent: (u64, u64),
    /// The drive it is on now.
    pub to_drive: String,
    /// Bytes copied.
    pub bytes: u64,
    /// How long the move took, milliseconds.
    pub millis: u64,
    /// Byte ranges that could not be read (a forced move only).
    pub unreadable: Vec<(u64, u64)>,
}

/// The attribute bits of the record's partition when it serves.
fn serving_attrs(rec: &VolumeRecord) -> u64 {
    if rec.snapshot.is_some() { gpt::SNAPSHOT_ATTR } else { 0 }
}

/// Moves the plan's record (whose `moving` names where its copy goes, on `dst`, of
/// media `dst_media`) off `src`; see the module's steps. `force`: switch even when
/// blocks could not be read. `progress` counts the bytes copied and then verified. The
/// record handed back is the volume as it now is (moved or not).
pub(crate) fn move_volume(store: &Store, guards: &Arc<Guards>, plan: MovePlan, force: bool, progress: &std::sync::atomic::AtomicU64) -> Outcome<MoveDone> {
    let MovePlan { mut rec, src, dst, dst_media } = plan;
    let (src, dst) = (&src, &dst);
    let began = Instant::now();
    let Some(to) = rec.moving.clone().filter(|m| !m.switched) else {
        let e = VolumeError::InvalidArgument { reason: format!("volume {} has no move planned", rec.id) };
        return Outcome { record: Some(rec), result: Err(e) };
    };
    // A health check's read-only fsck holds the partition: the copy waits for it.
    let _unchecked = guards.step(&rec.id);
    if let Err(e) = save(store, &rec) {
        rec.moving = None;
        return Outcome { record: Some(rec), result: Err(e) };
    }
    crash_point!("move.intent_saved");
    let copied = match copy_steps(src, dst, &rec, &to, force, progress) {
        Ok(c) => c,
        Err(e) => return Outcome { record: Some(abandon(store, dst, rec, &to)), result: Err(e) },
    };
    // The switch: one store write.
    let from = Move {
        drive_id: rec.drive_id.clone(),
        start: rec.start,
        size: rec.size,
        switched: true,
        unreadable: copied.unreadable.clone(),
        copy_guid: to.copy_guid,
    };
    let before = rec.clone();
    rec.drive_id = to.drive_id.clone();
    rec.start = to.start;
    rec.size = to.size;
    rec.media = dst_media;
    rec.moving = Some(Box::new(from.clone()));
    if let Err(e) = save(store, &rec) {
        return Outcome { record: Some(abandon(store, dst, before, &to)), result: Err(e) };
    }
    crash_point!("move.switched");
    info!(volume.id = %rec.id, drive.from = %from.drive_id, drive.to = %rec.drive_id, move.bytes = copied.bytes, "volume switched to its copy");
    let done = MoveDone {
        from_drive: from.drive_id.clone(),
        from_extent: (from.start, from.size),
        to_drive: rec.drive_id.clone(),
        bytes: copied.bytes,
        millis: began.elapsed().as_millis() as u64,
        unreadable: copied.unreadable,
    };
    match finish_move(store, Some(src), dst, &mut rec) {
        Ok(()) => Outcome { record: Some(rec), result: Ok(done) },
        Err(e) => {
            warn!(volume.id = %rec.id, error = %e, "the volume serves from its new drive; its old partition is removed at the next start");
            Outcome { record: Some(rec), result: Ok(done) }
        }
    }
}

/// Steps 2 and 3: the copy's entry, then the verified copy.
fn copy_steps(src: &DriveLoc, dst: &DriveLoc, rec: &VolumeRecord, to: &Move, force: bool, progress: &std::sync::atomic::AtomicU64) -> Result<mover::Copied, VolumeError> {
    let id = rec.id.as_str();
    let skp = blkpg::ensure_kernel_partition(&src.path, rec.start, rec.size).map_err(disk(id, "find the volume's partition"))?;
    let mounts = crate::disk::mounts::read_mountinfo()
        .map_err(|e| disk(id, "read mounts")(DiskError::Io { what: "/proc/self/mountinfo".into(), source: e }))?;
    if mounts.iter().any(|m| m.devnum == skp.devnum) {
        return Err(VolumeError::PartitionMounted { volume_id: id.to_string(), device: skp.devnode });
    }
    let dkp = {
        let _udev = DiskLock::exclusive(&dst.path).map_err(disk(id, "lock the new drive"))?;
        // A copy on the volume's own drive carries a GUID of its own and no note entry
        // (the volume's entry is the old partition's until the finish renames it).
        let note = (rec.snapshot.is_none() && to.copy_guid.is_none()).then(|| crate::actors::volumes::notes::note_of(rec));
        let guid = to.copy_part_guid(rec.part_guid);
        gpt::add_partition_wiped(&dst.path, dst.sector, guid, &gpt::partition_label(&rec.name), to.start, to.size, serving_attrs(rec) | gpt::MOVE_ATTR, note)
            .map_err(disk(id, "write the copy's partition entry"))?;
        crash_point!("move.gpt_written");
        blkpg::ensure_kernel_partition(&dst.path, to.start, to.size).map_err(disk(id, "add the copy's kernel partition"))?
    };
    info!(volume.id = %id, drive.to = %to.drive_id, volume.size = rec.size, "copying the volume to its new drive, every byte, verified");
    let copied = mover::copy_and_verify(&skp.devnode, &dkp.devnode, rec.size, progress).map_err(disk(id, "copy the volume"))?;
    crash_point!("move.copied");
    if !copied.unreadable.is_empty() {
        let e = VolumeError::Unreadable { volume_id: id.to_string(), drive_id: rec.drive_id.clone(), ranges: copied.unreadable.clone() };
        if !force {
            return Err(e);
        }
        warn!(volume.id = %id, error = %e, "forced: switching to the copy with zeros where the old drive could not be read");
    }
    Ok(copied)
}

/// Rolls a move back before its switch: the copy goes, the record drops its `Move`.
/// When the copy cannot be removed the record keeps it (a restart removes it).
fn abandon(store: &Store, dst: &DriveLoc, mut rec: VolumeRecord, to: &Move) -> VolumeRecord {
    match remove_copy(dst, to.copy_part_guid(rec.part_guid), to.start) {
        Ok(()) => {
            rec.moving = None;
            if let Err(e) = save(store, &rec) {
                warn!(volume.id = %rec.id, error = %e, "cannot store the end of a move rolled back; a restart does");
            }
        }
        Err(e) => warn!(volume.id = %rec.id, error = %e, "cannot remove the copy of a move rolled back; a restart does"),
    }
    rec
}

/// Removes a copy cut short from `drive`: the partition with `guid` at `start`, only
/// when it carries the move mark (never a volume); nothing there is success.
pub(crate) fn remove_copy(drive: &DriveLoc, guid: uuid::Uuid, start: u64) -> Result<(), DiskError> {
    let _udev = DiskLock::exclusive(&drive.path)?;
    let Some(t) = gpt::read_table(&drive.path, drive.sector)? else { return Ok(()) };
    let Some(q) = t.partitions.iter().find(|q| q.guid == guid) else { return Ok(()) };
    if !q.is_move_copy() || q.start != start {
        return Err(DiskError::invalid(format!(
            "{}: partition {guid} at byte {} is not the move's copy at byte {start}; left alone",
            drive.path.display(),
            q.start
        )));
    }
    blkpg::remove_kernel_partition(&drive.path, start)?;
    gpt::remove_partition(&drive.path, drive.sector, guid)?;
    Ok(())
}

/// Steps 5 and 6 of a switched move: the copy (on `dst`, the record's drive) loses its
/// mark, the old partition goes from `src` (when present), the record drops its `Move`;
/// a move within one drive is finished by [`finish_on_its_drive`]. Idempotent: a
/// restart runs it again.
pub(crate) fn finish_move(store: &Store, src: Option<&DriveLoc>, dst: &DriveLoc, rec: &mut VolumeRecord) -> Result<(), VolumeError> {
    let Some(from) = rec.moving.clone().filter(|m| m.switched) else { return Ok(()) };
    if let Some(copy) = from.copy_guid {
        return finish_on_its_drive(store, dst, rec, &from, copy);
    }
    let id = rec.id.clone();
    {
        let _udev = DiskLock::exclusive(&dst.path).map_err(disk(&id, "lock the new drive"))?;
        gpt::set_partition_attrs(&dst.path, dst.sector, rec.part_guid, serving_attrs(rec)).map_err(disk(&id, "clear the copy's move mark"))?;
    }
    crash_point!("move.marked");
    let Some(src) = src else {
        warn!(volume.id = %id, drive.id = %from.drive_id, "the old drive is absent: its partition of the volume stays until it is wiped");
        return Ok(());
    };
    {
        let _udev = DiskLock::exclusive(&src.path).map_err(disk(&id, "lock the old drive"))?;
        let there = gpt::read_table(&src.path, src.sector)
            .map_err(disk(&id, "read the old drive's partition table"))?
            .and_then(|t| t.partitions.into_iter().find(|q| q.guid == rec.part_guid));
        if let Some(q) = there {
            if q.start != from.start {
                return Err(VolumeError::Disk {
                    volume_id: id,
                    op: "remove the old partition",
                    source: DiskError::invalid(format!("partition {} on {} is at byte {}, not {}; left alone", q.guid, src.path.display(), q.start, from.start)),
                });
            }
            // An encrypted volume's old copy of its wrapped key goes before its
            // extent is handed to the cleaner: the key lives on its new drive only.
            if rec.encrypted() {
                erase_old_key(&id, src, &from)?;
            }
            blkpg::remove_kernel_partition(&src.path, from.start).map_err(disk(&id, "remove the old kernel partition"))?;
            gpt::remove_partition(&src.path, src.sector, rec.part_guid).map_err(disk(&id, "remove the old partition"))?;
        }
    }
    crash_point!("move.source_removed");
    rec.moving = None;
    save(store, rec)
}

/// Steps 5 and 6 of a switched move within one drive (`drive`): one GPT commit removes
/// the old partition and gives the copy the volume's GUID, its mark cleared
/// (`move.renamed`); then an encrypted volume's old copy of its wrapped key is erased
/// and the old kernel partition goes; the record drops its `Move`. Until the commit the
/// old partition is whole (a table read without the store takes it for the volume, and
/// the marked copy for a copy cut short); from it on the copy is the volume's only
/// partition. Idempotent: a restart runs it again (the commit done is no write).
fn finish_on_its_drive(store: &Store, drive: &DriveLoc, rec: &mut VolumeRecord, from: &Move, copy: uuid::Uuid) -> Result<(), VolumeError> {
    let id = rec.id.clone();
    {
        let _udev = DiskLock::exclusive(&drive.path).map_err(disk(&id, "lock the drive"))?;
        gpt::rename_copy(&drive.path, drive.sector, rec.part_guid, copy, rec.start, serving_attrs(rec))
            .map_err(disk(&id, "give the copy the volume's partition GUID"))?;
        crash_point!("move.renamed");
        // The old extent is free in the table but still the record's (its `Move`): no
        // one else is placed there, and the cleaner takes it only once the key is gone.
        if rec.encrypted() {
            erase_old_key(&id, drive, from)?;
        }
        blkpg::remove_kernel_partition(&drive.path, from.start).map_err(disk(&id, "remove the old kernel partition"))?;
    }
    rec.moving = None;
    save(store, rec)
}

/// Erases the wrapped key of volume `id` in its old extent `from` on `drive` (the
/// caller holds the drive's lock). A kernel partition the kernel dropped meanwhile
/// (udev re-reads a table no partition of which is open) is found again.
fn erase_old_key(id: &str, drive: &DriveLoc, from: &Move) -> Result<(), VolumeError> {
    let mut tries = 0;
    loop {
        let kp = blkpg::ensure_kernel_partition(&drive.path, from.start, from.size).map_err(disk(id, "find the old kernel partition"))?;
        match super::keys::erase(id, &kp) {
            Ok(()) => return Ok(()),
            Err(_) if tries < 3 => tries += 1,
            Err(e) => return Err(e),
        }
    }
}
