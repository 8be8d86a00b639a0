//! The disk step of a clone: the source's data copied onto the new volume's wiped
//! partition, inside CreateVolume, before the volume is handed out.
//!
//! Rules (crash safety is the create's: the record stays `Creating`, with its source
//! named, until the copy is complete and on disk, and a restart rolls a `Creating`
//! record back, so a half copy is never served; a retried CreateVolume copies again
//! from the start onto a freshly wiped partition):
//! - a filesystem source is copied by the filesystem's own tool, used blocks only
//!   ([`crate::disk::copy`]), given a fresh UUID, grown to the clone's size, fsynced and
//!   checked read-only; a copy that does not check clean fails the create (which then
//!   rolls back);
//! - a block source is copied byte for byte, its whole length, then fsynced; what a
//!   larger clone holds past that length is not defined (as for any new block volume);
//! - a filesystem source that was never formatted holds no data: nothing is copied and
//!   the clone is formatted at its first stage, like any new volume;
//! - the source is read and never written; the caller has checked that it is not
//!   mounted read-write, or asks for it to be frozen for the copy (a snapshot whose
//!   class asks for a freeze, a clone of a filesystem in use: [`crate::disk::freeze`],
//!   bounded, the stall recorded in the snapshot or the clone's record), or to be copied
//!   live (a block clone whose class accepts a crash-inconsistent copy, marked so), and
//!   holds its claim while this runs;
//! - a freeze never outlives its limit: before it, the copy's length is estimated (the
//!   bytes the filesystem uses, at the rate a short read of the source's device
//!   shows, read and write counted) and a copy estimated longer than the limit is
//!   refused unfrozen, saying how long it would take; during it, a watchdog thaws at the
//!   limit and a copy that outlives it is an error, never kept;
//! - the same step makes a snapshot (the target is a snapshot's partition: its data is
//!   never grown into the note that follows it) and restores one (the source is a
//!   snapshot: only its data, `restore_size` bytes, is copied).

use std::time::Instant;

use tracing::info;

use super::disk_io as disk;
use crate::actors::volumes::error::InUse;
use crate::actors::volumes::model::{InUseCopy, VolumeRecord};

use crate::actors::volumes::error::VolumeError;
use crate::disk::{blkpg, copy, freeze, fs, volume_key, DiskError};
use crate::failpoint::crash_point;
use crate::words::DriveLoc;

/// The source of a clone, for the disk step.
#[derive(Debug, Clone)]
pub struct CloneFrom {
    /// The source's record, as it was when the clone began.
    pub source: VolumeRecord,
    /// Its drive.
    pub loc: DriveLoc,
    /// Freeze the source's filesystem, mounted at this path, for at most this long
    /// while it is copied.
    pub freeze: Option<(std::path::PathBuf, std::time::Duration)>,
    /// A block source copied while a pod writes to it (the clone is marked
    /// crash-inconsistent).
    pub live: bool,
    /// The allowed roots the freeze path is opened beneath.
    pub roots: Vec<std::path::PathBuf>,
    /// Where a freeze is recorded and watched from outside the agent.
    pub journal: freeze::Journal,
    /// The create's secrets: the key-encryption keys a copy into an encrypted volume
    /// needs (to open the source's key, and to wrap the copy's own).
    pub secrets: crate::actors::volumes::messages::Secrets,
}

impl CloneFrom {
    /// The source the book found, its copy's freeze opened beneath `roots`.
    pub(crate) fn of(
        s: crate::actors::volumes::book::Source,
        roots: Vec<std::path::PathBuf>,
        journal: freeze::Journal,
        secrets: crate::actors::volumes::messages::Secrets,
    ) -> CloneFrom {
        use crate::actors::volumes::book::InUsePlan;
        let (freeze, live) = match s.in_use {
            InUsePlan::Idle => (None, false),
            InUsePlan::Freeze(path, limit) => (Some((path, limit)), false),
            InUsePlan::Live => (None, true),
        };
        CloneFrom { source: s.rec, loc: s.loc, freeze, live, roots, journal, secrets }
    }
}

/// Copies `from`'s data onto `dst`, the new volume `rec`'s wiped partition, and
/// records in `rec` what the copy made (a formatted filesystem of the source's type).
pub(crate) fn copy(rec: &mut VolumeRecord, dst: &blkpg::KernelPartition, from: &CloneFrom) -> Result<(), VolumeError> {
    let src = &from.source;
    let id = rec.id.clone();
    let began = Instant::now();
    let data = src.snapshot.as_ref().map_or(src.size, |s| s.restore_size);
    let kp = blkpg::ensure_kernel_partition(&from.loc.path, src.start, src.size).map_err(disk(&id, "find the source's partition"))?;
    if let Some((path, _)) = &from.freeze {
        if rec.block || !src.formatted || src.fs_type.is_empty() {
            return Err(VolumeError::SnapshotSourceInUse { volume_id: src.id.clone(), path: path.clone(), block: true });
        }
    }
    copy::drop_cache(&kp.devnode).map_err(disk(&id, "read the source from the disk"))?;
    // The source is encrypted when its class says so or its partition holds a key
    // header (a snapshot rebuilt from its disk knows no class).
    let key_of = src.snapshot.as_ref().map_or(src.id.as_str(), |s| s.source_volume_id.as_str());
    let src_encrypted = !rec.block && (src.encrypted() || src_key_header(&kp)?);
    if rec.snapshot.is_none() && (src_encrypted || rec.encrypted()) {
        if let Some((path, _)) = &from.freeze {
            // Its files are copied through a mount of its own, which a mounted
            // filesystem does not allow.
            return Err(VolumeError::SourceInUse { source_id: src.id.clone(), path: path.clone(), why: InUse::Encrypted });
        }
        return copy_encrypted(rec, dst, from, &kp, src_encrypted.then_some(key_of));
    }
    if rec.block {
        info!(volume.id = %id, volume.source = %src.id, volume.size = data, "cloning a block volume, every byte");
        if from.live {
            info!(volume.id = %id, volume.source = %src.id, "the source is written to as it is copied: the clone is crash-inconsistent, as its class accepts");
        }
        let bytes = copy::copy_bytes(&kp.devnode, &dst.devnode, Some(data)).map_err(disk(&id, "copy the source's bytes"))?;
        copy::sync(&dst.devnode).map_err(disk(&id, "flush the copy"))?;
        crash_point!("clone.copied");
        if from.live {
            rec.copied_in_use = Some(InUseCopy::CrashInconsistent);
        }
        info!(volume.id = %id, volume.source = %src.id, clone.bytes = bytes, clone.millis = began.elapsed().as_millis() as u64, "volume cloned");
        return Ok(());
    }
    if !src.formatted || src.fs_type.is_empty() {
        info!(volume.id = %id, volume.source = %src.id, "the source was never formatted: the clone starts empty");
        return Ok(());
    }
    let fs_type = src.fs_type.clone();
    let found = fs::probe_fs(&kp.devnode).map_err(disk(&id, "probe the source's filesystem"))?;
    if found.as_deref() != Some(fs_type.as_str()) {
        return Err(VolumeError::SourceChanged { volume_id: id, source_id: src.id.clone(), expected: fs_type, found });
    }
    info!(volume.id = %id, volume.source = %src.id, volume.fs = %fs_type, volume.size = rec.size, "cloning a filesystem, used blocks only");
    let uuid = copy::fs_uuid(&kp.devnode).map_err(disk(&id, "read the source's filesystem UUID"))?;
    // Frozen as late as can be: the probes above read what a writer does not change
    // (the filesystem's type and UUID), so writers pause for the copy alone.
    let frozen = match &from.freeze {
        Some((path, limit)) => {
            let at = crate::disk::beneath::open(path, &from.roots).map_err(|e| disk(&id, "open the source's mount")(match e {
                crate::disk::beneath::PathError::Refused(reason) => DiskError::invalid(reason),
                crate::disk::beneath::PathError::Disk(e) => e,
            }))?;
            let Some(at) = at else {
                return Err(disk(&id, "open the source's mount")(DiskError::NotFound { device: path.clone(), what: "the source's staging path".into() }));
            };
            if rec.snapshot.is_none() {
                refuse_a_long_freeze(&at, &kp, &src.id, path, *limit)?;
            }
            info!(volume.id = %src.id, fs.path = %path.display(), freeze.limit_millis = limit.as_millis() as u64, "freezing the filesystem for the copy");
            let f = freeze::Frozen::freeze(&at, *limit, kp.devnum, &from.journal).map_err(disk(&id, "freeze the source's filesystem"))?;
            // What the filesystem flushed at the freeze is read from the disk, not from
            // blocks the device cached before it.
            copy::drop_cache(&kp.devnode).map_err(disk(&id, "read the source from the disk"))?;
            // A test swaps the staging path here: the copy goes on through `at`.
            crate::failpoint::hold("clone.frozen.hold", path);
            Some((f, *limit, at))
        }
        None => None,
    };
    // The frozen filesystem is read through the directory opened and checked above,
    // never by the staging path's name again.
    let copied = copy::copy_filesystem(&kp.devnode, &dst.devnode, &fs_type, frozen.as_ref().map(|(_, _, at)| at)).map_err(disk(&id, "copy the source's filesystem"));
    if let Some((f, limit, _)) = frozen {
        let thawed = f.thaw().map_err(disk(&id, "thaw the source's filesystem"))?;
        info!(volume.id = %src.id, freeze.millis = thawed.stall.as_millis() as u64, freeze.expired = thawed.expired, "filesystem thawed");
        if thawed.expired {
            return Err(VolumeError::FreezeExpired { volume_id: src.id.clone(), limit_millis: limit.as_millis() as u64, clone: rec.snapshot.is_none() });
        }
        let millis = thawed.stall.as_millis() as u64;
        match rec.snapshot.as_mut() {
            Some(snap) => snap.freeze_millis = Some(millis),
            None => rec.copied_in_use = Some(InUseCopy::Frozen { millis }),
        }
    }
    copied?;
    crash_point!("clone.copied");
    // A snapshot's data is never grown into the note that follows it.
    let grow = rec.snapshot.is_none() && rec.size > data;
    copy::finish_filesystem(&dst.devnode, &fs_type, uuid.as_deref(), grow).map_err(disk(&id, "make the copy a filesystem of its own"))?;
    if src_encrypted {
        // A snapshot of an encrypted volume: ciphertext under the volume's key, whose
        // wrapped copy (bound to the volume's id) goes with it.
        copy_key_header(&id, &kp, dst)?;
    }
    crash_point!("clone.finished");
    rec.formatted = true;
    rec.fs_type = fs_type;
    info!(volume.id = %id, volume.source = %src.id, clone.millis = began.elapsed().as_millis() as u64, "volume cloned");
    Ok(())
}

/// Refuses, before any freeze, a copy of the filesystem mounted at `at` (on `kp`)
/// estimated to outlive `limit`: the bytes it uses (`fstatvfs`), read and written at
/// the rate a short direct read of its device shows.
fn refuse_a_long_freeze(at: &crate::disk::beneath::Node, kp: &blkpg::KernelPartition, source_id: &str, path: &std::path::Path, limit: std::time::Duration) -> Result<(), VolumeError> {
    let used = at.usage().map_err(disk(source_id, "measure what the source's filesystem uses"))?.used_bytes;
    let rate = copy::read_rate(&kp.devnode).map_err(disk(source_id, "measure the source drive's read rate"))?;
    let estimate = copy::estimate(used, rate);
    info!(volume.id = %source_id, fs.used = used, drive.read_rate = rate, freeze.estimate_millis = estimate.as_millis() as u64,
          freeze.limit_millis = limit.as_millis() as u64, "estimated the freeze of a clone of a volume in use");
    if estimate > limit {
        return Err(VolumeError::SourceInUse {
            source_id: source_id.to_string(),
            path: path.to_path_buf(),
            why: InUse::TooLong { used, estimate_millis: estimate.as_millis() as u64, limit_millis: limit.as_millis() as u64 },
        });
    }
    Ok(())
}

/// Whether the partition `kp` starts with an encrypted volume's key header.
fn src_key_header(kp: &blkpg::KernelPartition) -> Result<bool, VolumeError> {
    let read = || volume_key::present(&std::fs::File::open(&kp.devnode)?);
    read().map_err(|e| disk("source", "read the source's first KiB")(DiskError::Io { what: kp.devnode.display().to_string(), source: e }))
}

/// Copies the source's key header (its first KiB) onto the snapshot `dst`, synced.
fn copy_key_header(id: &str, kp: &blkpg::KernelPartition, dst: &blkpg::KernelPartition) -> Result<(), VolumeError> {
    use std::os::unix::fs::FileExt;
    let io = |what: &str, e: std::io::Error| disk(id, "copy the source's key header")(DiskError::Io { what: what.to_string(), source: e });
    let mut b = vec![0u8; volume_key::HEADER_LEN];
    std::fs::File::open(&kp.devnode).and_then(|f| f.read_exact_at(&mut b, 0)).map_err(|e| io(&kp.devnode.display().to_string(), e))?;
    let f = volume_key::open_partition(&dst.devnode, dst.devnum).map_err(disk(id, "open the snapshot for its key header"))?;
    f.write_all_at(&b, 0).and_then(|()| f.sync_data()).map_err(|e| io(&dst.devnode.display().to_string(), e))?;
    b.fill(0);
    Ok(())
}

/// A clone or a restore that is, or whose source is, encrypted: the copy gets a key of
/// its own, made here and wrapped with the create's key-encryption key, and the
/// source's files are copied into its encrypted data directory (opened with the
/// source's key when the source is encrypted: `key_of` names the volume its header is
/// bound to). A copy of an encrypted volume is never plaintext.
fn copy_encrypted(rec: &mut VolumeRecord, dst: &blkpg::KernelPartition, from: &CloneFrom, kp: &blkpg::KernelPartition, key_of: Option<&str>) -> Result<(), VolumeError> {
    let id = rec.id.clone();
    let src = &from.source;
    let began = Instant::now();
    if !rec.encrypted() {
        return Err(VolumeError::SourceIncompatible { source_id: src.id.clone(), reason: crate::actors::volumes::book::ENCRYPTED_COPY.into() });
    }
    if !src.formatted || src.fs_type.is_empty() {
        info!(volume.id = %id, volume.source = %src.id, "the source was never formatted: the clone starts empty");
        return Ok(());
    }
    if src.fs_type != "ext4" {
        return Err(VolumeError::SourceIncompatible {
            source_id: src.id.clone(),
            reason: format!("it holds {}, and an encrypted copy is ext4 (fscrypt is ext4's)", src.fs_type),
        });
    }
    let keks = super::keys::keks(&id, &from.secrets, "provisioner")?;
    // Opened as a stage opens it (and rewrapped after a rotation, unless the source is
    // staged, so mounted: a snapshot never is).
    let src_key = match key_of {
        Some(owner) => {
            let owner = uuid::Uuid::parse_str(owner).map_err(|_| VolumeError::SourceIncompatible { source_id: src.id.clone(), reason: "its key header names no volume id".into() })?;
            Some(super::keys::open_bound(&src.id, owner, kp, &keks, src.staging.is_some())?)
        }
        None => None,
    };
    fs::mkfs_encrypting(&dst.devnode).map_err(disk(&id, "make the copy's filesystem"))?;
    let key = super::keys::make(rec, dst, &keks)?;
    info!(volume.id = %id, volume.source = %src.id, source.encrypted = src_key.is_some(), "copying the source's files into the encrypted copy under its own key");
    copy::copy_files_encrypted(&kp.devnode, src_key.as_ref(), &dst.devnode, &key).map_err(disk(&id, "copy the source's files"))?;
    crash_point!("clone.copied");
    rec.formatted = true;
    rec.fs_type = "ext4".into();
    info!(volume.id = %id, volume.source = %src.id, clone.millis = began.elapsed().as_millis() as u64, "volume cloned, re-encrypted under its own key");
    Ok(())
}
