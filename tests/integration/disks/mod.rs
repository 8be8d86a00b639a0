//! The disk layer and the drive inventory against real loop devices: GPT, BLKPG, mkfs, mount, what a disk holds and how it is classified, partitions that go missing.

/// GPT, BLKPG, mkfs, mount, wipe on image files and loop devices.
mod disk_ops;
/// The drive inventory: classification and live udev changes.
mod inventory;
/// What a node's disks commonly carry, each foreign in plain words and untouched.
mod foreign_data;
/// A volume's partition going missing from a present drive.
mod lost_partitions;
/// Whose a disk is: another node's disk never written, adopted on purpose; volumes
/// served again from their disk's note.
pub(crate) mod ownership;
