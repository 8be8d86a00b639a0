//! Volumes through their whole life on real drives: create, place, grow, clone, release, health conditions, migration, concurrent calls.

/// The volume lifecycle: create, stage, publish, unpublish, unstage, delete.
mod volumes;
/// GetCapacity promises exactly what CreateVolume accepts.
mod capacity;
/// Partition slots are capacity: a drive full of partitions offers nothing more.
pub(crate) mod slots;
/// Clones: CreateVolume with a source volume.
mod clone;
/// Clones of volumes in use: frozen, refused in words, or crash-inconsistent by choice.
mod clone_in_use;
/// A freeze that always ends: the agent killed in the middle of one.
pub(crate) mod freeze_crash;
/// Online volume expansion.
mod expansion;
/// Growth by moving: a volume with no room after it moves to a bigger extent elsewhere.
mod growth_by_move;
/// Drive release with `drivelet ctl drive release`.
mod release;
/// Drive evacuation with `drivelet ctl drive evacuate`: volumes move keeping id and data.
pub(crate) mod evacuation;
/// Volume conditions from drives dying, detaching and failing SMART.
mod health;
/// Migration of an in-tree `local` volume.
mod migration;
/// Concurrent calls on one agent.
mod concurrency;
/// Clean extents: no volume shows bytes its tenant did not write.
mod cleaning;
/// Snapshots: CreateSnapshot and restores.
mod snapshots;
/// Encryption at rest: ciphertext only on the drive, keys from the Secret, crypto-erase.
mod encryption;
