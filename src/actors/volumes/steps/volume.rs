//! The controller side's disk steps of a volume: create (and its rollback), delete,
//! attach and expand, each in an order that survives `kill -9` anywhere (the rules are
//! [`super`]'s).

use std::path::PathBuf;
use std::sync::Arc;

use tracing::{info, warn};

use super::clone::CloneFrom;
use super::node::{backing, Backing};
use super::{disk, save, Outcome};
use crate::actors::volumes::book::Guards;
use crate::actors::volumes::error::VolumeError;
use crate::actors::volumes::model::{next, Op, VolumeRecord};
use crate::disk::lock::DiskLock;
use crate::disk::{blkpg, fs, gpt, snapshot_note, DiskError};
use crate::failpoint::crash_point;
use crate::store::Store;
use crate::words::DriveLoc;

/// Creates the partition of a `Creating` record: intent, GPT entry, kernel partition,
/// wipe, then `Available`.
/// A clone (`from`) copies its source onto the wiped partition before it is marked
/// `Available` ([`super::clone::copy`]); until then a restart rolls it back.
pub fn create(store: &Store, drive: &DriveLoc, rec: VolumeRecord, from: Option<&CloneFrom>) -> Outcome<VolumeRecord> {
    if let Err(e) = save(store, &rec) {
        return Outcome { record: None, result: Err(e) };
    }
    crash_point!("create.intent_saved");
    match create_steps(store, drive, rec.clone(), from) {
        Ok(done) => Outcome { record: Some(done.clone()), result: Ok(done) },
        Err(e) if e.refused_drive().is_some() => match store.remove(&rec.id) {
            Ok(()) => Outcome { record: None, result: Err(e) },
            Err(undo) => Outcome { record: Some(rec), result: Err(VolumeError::Store(undo)) },
        },
        Err(e) => match rollback_create(store, drive, &rec) {
            Ok(()) => Outcome { record: None, result: Err(e) },
            Err(undo) => {
                warn!(volume.id = %rec.id, error = %undo, "cannot roll back a failed create; a retry or restart finishes it");
                Outcome { record: Some(rec), result: Err(e) }
            }
        },
    }
}

fn create_steps(store: &Store, drive: &DriveLoc, mut rec: VolumeRecord, from: Option<&CloneFrom>) -> Result<VolumeRecord, VolumeError> {
    let (kp, wiped) = {
        let _udev = DiskLock::exclusive(&drive.path).map_err(disk(&rec.id, "lock the drive"))?;
        // The new partition's signature areas are zeroed in the table's own commit.
        let attrs = if rec.snapshot.is_some() { gpt::SNAPSHOT_ATTR } else { 0 };
        let note = rec.snapshot.is_none().then(|| crate::actors::volumes::notes::note_of(&rec));
        let added = gpt::add_partition_wiped(&drive.path, drive.sector, rec.part_guid, &gpt::partition_label(&rec.name), rec.start, rec.size, attrs, note)
            .map_err(disk(&rec.id, "write the partition table"))?;
        crash_point!("create.gpt_written");
        let (kp, new) = blkpg::ensure_kernel_partition_added(&drive.path, rec.start, rec.size)
            .map_err(disk(&rec.id, "add the kernel partition"))?;
        // A kernel partition that was there before may hold stale blocks in its cache.
        (kp, added == gpt::Added::Wiped && new)
    };
    crash_point!("create.partition_visible");
    if !wiped {
        // An entry left by an earlier try, or a kernel partition that was already there:
        // wipe through the partition itself.
        fs::wipe_signatures(&kp.devnode).map_err(disk(&rec.id, "wipe the new partition"))?;
    }
    crash_point!("create.wiped");
    if let Some(from) = from {
        super::clone::copy(&mut rec, &kp, from)?;
    }
    if let Some(snap) = &rec.snapshot {
        // The note last: a snapshot whose note reads back whole is whole.
        let note = snapshot_note::SnapshotNote {
            name: rec.name.clone(),
            source_volume_id: snap.source_volume_id.clone(),
            restore_size: snap.restore_size,
            block: rec.block,
            fs_type: if rec.formatted { rec.fs_type.clone() } else { String::new() },
            created_unix_nanos: snap.created_unix_nanos,
        };
        snapshot_note::write(&kp.devnode, snap.restore_size, &note).map_err(disk(&rec.id, "write the snapshot's note"))?;
        crash_point!("snapshot.noted");
    }
    rec.state = next(rec.state, Op::CreateDone).map_err(|r| VolumeError::refused(&rec, r))?;
    save(store, &rec)?;
    crash_point!("create.saved");
    Ok(rec)
}

/// Undoes a creation that was never handed out: kernel partition, GPT entry, record.
pub(crate) fn rollback_create(store: &Store, drive: &DriveLoc, rec: &VolumeRecord) -> Result<(), VolumeError> {
    {
        let _udev = DiskLock::exclusive(&drive.path).map_err(disk(&rec.id, "lock the drive"))?;
        blkpg::remove_kernel_partition(&drive.path, rec.start).map_err(disk(&rec.id, "remove the kernel partition"))?;
        gpt::remove_partition(&drive.path, drive.sector, rec.part_guid).map_err(disk(&rec.id, "update the partition table"))?;
    }
    store.remove(&rec.id).map_err(VolumeError::Store)
}

/// Deletes a volume: intent, wipe, kernel partition, GPT entry, record. With the drive
/// absent (`drive` is `None`) only the record goes.
pub fn delete(store: &Store, guards: &Arc<Guards>, drive: Option<&DriveLoc>, mut rec: VolumeRecord) -> Outcome<()> {
    let prev = rec.clone();
    if let Some(node) = &rec.published_node {
        let e = VolumeError::StillAttached { volume_id: rec.id.clone(), node: node.clone() };
        return Outcome { record: Some(prev), result: Err(e) };
    }
    match next(rec.state, Op::Delete) {
        Ok(s) => rec.state = s,
        Err(r) => return Outcome { record: Some(prev), result: Err(VolumeError::refused(&rec, r)) },
    }
    if let Some(a) = &rec.adopted {
        // Retain: an adopted volume's data was never drivelet's; only its record goes.
        return match store.remove(&rec.id) {
            Ok(()) => {
                info!(volume.id = %rec.id, volume.path = %a.path.display(), "adopted volume released; its data is kept where it is");
                Outcome { record: None, result: Ok(()) }
            }
            Err(e) => Outcome { record: Some(prev), result: Err(VolumeError::Store(e)) },
        };
    }
    if let Err(e) = save(store, &rec) {
        return Outcome { record: Some(prev), result: Err(e) };
    }
    crash_point!("delete.intent_saved");
    match delete_steps(store, guards, drive, &rec) {
        Ok(()) => Outcome { record: None, result: Ok(()) },
        Err(e) => Outcome { record: Some(rec), result: Err(e) },
    }
}

/// The steps of a deletion whose intent is recorded; also finishes one at start-up.
pub(crate) fn delete_steps(store: &Store, guards: &Arc<Guards>, drive: Option<&DriveLoc>, rec: &VolumeRecord) -> Result<(), VolumeError> {
    if let Some(drive) = drive {
        // A health check's read-only fsck holds the partition: the wipe waits for it.
        let _unchecked = guards.step(&rec.id);
        // A move within its drive switched but not finished (its finish failed): the
        // finish first, so the volume's GUID names the partition it serves from.
        if rec.moving.as_ref().is_some_and(|m| m.switched && m.copy_guid.is_some()) {
            super::moves::finish_move(store, Some(drive), drive, &mut rec.clone())?;
        }
        // The table is read, and changed, under both locks: a parallel delete on the
        // same drive rewrites it.
        let _udev = DiskLock::exclusive(&drive.path).map_err(disk(&rec.id, "lock the drive"))?;
        let on_disk = gpt::read_table(&drive.path, drive.sector)
            .map_err(disk(&rec.id, "read the partition table"))?
            .is_some_and(|t| t.partitions.iter().any(|q| q.guid == rec.part_guid));
        if on_disk {
            let kp = blkpg::ensure_kernel_partition(&drive.path, rec.start, rec.size)
                .map_err(disk(&rec.id, "find the kernel partition"))?;
            let mounts = crate::disk::mounts::read_mountinfo()
                .map_err(|e| disk(&rec.id, "read mounts")(DiskError::Io { what: "/proc/self/mountinfo".into(), source: e }))?;
            if mounts.iter().any(|m| m.devnum == kp.devnum) {
                return Err(VolumeError::PartitionMounted { volume_id: rec.id.clone(), device: kp.devnode.clone() });
            }
            if blkpg::is_read_only(&kp.devnode) {
                blkpg::set_read_only(&kp.devnode, false).map_err(disk(&rec.id, "mark the partition writable"))?;
            }
            // Durable with the GPT commit below, which flushes the disk. Its first write
            // is the partition's first MiB: for an encrypted volume that is the
            // crypto-erase, its wrapped key destroyed before anything else changes (a
            // kill after it leaves ciphertext no key opens; the retry finishes).
            fs::wipe_signatures_direct(&kp.devnode).map_err(disk(&rec.id, "wipe the partition"))?;
        }
        crash_point!("delete.wiped");
        blkpg::remove_kernel_partition(&drive.path, rec.start).map_err(disk(&rec.id, "remove the kernel partition"))?;
        crash_point!("delete.partition_hidden");
        gpt::remove_partition(&drive.path, drive.sector, rec.part_guid).map_err(disk(&rec.id, "update the partition table"))?;
        crash_point!("delete.gpt_removed");
    } else {
        warn!(volume.id = %rec.id, drive.id = %rec.drive_id, "drive is absent: only the record is removed; the partition is listed again if the drive returns");
    }
    store.remove(&rec.id).map_err(VolumeError::Store)
}

/// Attaches a volume to `node` (ControllerPublishVolume): makes sure the kernel has its
/// partition, then records the attachment. Returns the partition's device node.
pub(crate) fn controller_publish(store: &Store, drive: Option<&DriveLoc>, mut rec: VolumeRecord, node: String) -> Outcome<PathBuf> {
    let prev = rec.clone();
    let res = (|| {
        let at = match backing(drive, &rec)? {
            Backing::Partition(kp) => kp.devnode,
            Backing::Dir { path, .. } => path,
        };
        if rec.published_node.as_deref() != Some(node.as_str()) {
            rec.published_node = Some(node);
            save(store, &rec)?;
        }
        Ok(at)
    })();
    match res {
        Ok(dev) => Outcome { record: Some(rec), result: Ok(dev) },
        Err(e) => Outcome { record: Some(prev), result: Err(e) },
    }
}

/// Grows a volume's partition in place to `new_size` (ControllerExpandVolume): the GPT
/// entry, then the kernel's partition, then the record. Every step is a no-op when
/// already done, so a retry after a crash anywhere finishes the job (a restart in
/// between takes the size from the GPT). `rec` is the record before the call.
pub(crate) fn expand(store: &Store, drive: &DriveLoc, mut rec: VolumeRecord, new_size: u64) -> Outcome<u64> {
    let prev = rec.clone();
    let res = (|| {
        {
            let _udev = DiskLock::exclusive(&drive.path).map_err(disk(&rec.id, "lock the drive"))?;
            gpt::resize_partition(&drive.path, drive.sector, rec.part_guid, new_size)
                .map_err(disk(&rec.id, "grow the partition in the partition table"))?;
            crash_point!("expand.gpt_resized");
            match blkpg::resize_kernel_partition(&drive.path, rec.start, new_size) {
                Ok(()) => {}
                // No kernel partition (it is made again at stage): nothing to tell.
                Err(DiskError::NotFound { .. }) => {}
                Err(e) => return Err(disk(&rec.id, "grow the kernel partition")(e)),
            }
        }
        crash_point!("expand.kernel_resized");
        if rec.size != new_size {
            info!(volume.id = %rec.id, volume.size = new_size, volume.old_size = rec.size, "volume grown");
            rec.size = new_size;
            save(store, &rec)?;
        }
        Ok(new_size)
    })();
    match res {
        Ok(size) => Outcome { record: Some(rec), result: Ok(size) },
        Err(e) => Outcome { record: Some(prev), result: Err(e) },
    }
}
