//! The disk steps: every destructive step of a volume operation, run off the actor
//! thread (`spawn_blocking`), in an order that survives `kill -9` anywhere. Each takes
//! what the book decided (a record, its drive's [`DriveLoc`]) and hands back an
//! [`Outcome`]: the record as it now is and the call's result; none knows the actor.
//!
//! What lives where:
//! - [`volume`]: create (and its rollback), delete, attach (controller publish), expand;
//! - [`node`]: stage, unstage, publish, unpublish, node expand, and what backs a
//!   volume on this host;
//! - [`clone`]: the copy inside a create of a clone, a restore or a snapshot;
//! - [`keys`]: an encrypted volume's key: made, opened, added and removed, erased;
//! - [`moves`]: moving a volume to another drive (an evacuation), and finishing or
//!   rolling back a move cut short;
//! - [`startup`]: opening the store and reconciling it with the drives and mounts;
//! - [`uses`]: the ordered write of a drive's usage record.
//!
//! Rules:
//! - the intent is written to the store before the first change on disk, and the
//!   result after the last, so a restart always knows what may be half done;
//! - every step is idempotent (an existing partition, filesystem or mount that is
//!   already what the step would make counts as done), so a retried call finishes what
//!   a killed one started;
//! - a step that fails undoes what this call changed, where it can, and leaves the
//!   record in a state a retry or a restart can finish; a create the GPT writer refused
//!   changed nothing on the disk (the drive holds data drivelet did not write), so only
//!   its record goes, and the disk is not touched at all, not even its kernel
//!   partitions, which are someone else's;
//! - GPT writes on one drive are serialised by that drive's lock;
//! - nothing is formatted that drivelet did not wipe itself: an existing filesystem
//!   on a volume drivelet formatted is data and is never overwritten;
//! - named crash points (`fail` crate, feature `failpoints`) sit between the steps; a
//!   test arms one to kill the process right there.

pub(crate) mod clone;
pub(crate) mod keys;
pub(crate) mod moves;
pub(crate) mod node;
pub(crate) mod startup;
pub(crate) mod uses;
pub(crate) mod volume;

pub use self::clone::CloneFrom;
pub(crate) use self::node::{is_device_of, node_expand, publish, stage, unpublish, unstage};
pub use self::volume::{create, delete};
pub(crate) use self::volume::{controller_publish, expand};

use crate::actors::volumes::error::VolumeError;
use crate::actors::volumes::model::VolumeRecord;
use crate::disk::DiskError;
use crate::store::Store;
#[cfg(doc)]
use crate::words::DriveLoc;

/// What a blocking step hands back: the record as it now is (`None`: removed) and the
/// call's result.
pub struct Outcome<T> {
    /// The record after the step.
    pub record: Option<VolumeRecord>,
    /// The call's result.
    pub result: Result<T, VolumeError>,
}

/// A disk error of a step of volume `id`, `op` naming the step; data drivelet did not
/// write, found by the GPT writer, is named as such.
fn disk(id: &str, op: &'static str) -> impl FnOnce(DiskError) -> VolumeError {
    let volume_id = id.to_string();
    move |source| match source {
        DiskError::Foreign { device, found } => VolumeError::ForeignData { volume_id, op, device, found },
        source => VolumeError::Disk { volume_id, op, source },
    }
}

/// Stores a record.
fn save(store: &Store, rec: &VolumeRecord) -> Result<(), VolumeError> {
    store.put(&rec.id, rec).map_err(VolumeError::Store)
}


/// A disk error of a copy's step (a clone, a move) of volume `id`, as it is.
fn disk_io(id: &str, op: &'static str) -> impl FnOnce(DiskError) -> VolumeError {
    let volume_id = id.to_string();
    move |source| VolumeError::Disk { volume_id, op, source }
}
