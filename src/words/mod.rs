//! The shared words of drivelet: the domain values that configuration, the disk layer,
//! the actors and both fronts speak, each in a file of its own.
//!
//! Rules: a word here depends on nothing else in the crate (only `std` and serde), so
//! every layer may import it without an import pointing the wrong way; a new value that
//! more than one layer names belongs here, one file per word.

/// What a clone of a volume in use does (StorageClass parameters: freeze, refuse,
/// crash-inconsistent for block).
pub mod clone_in_use;
/// What drivelet may do with a drive (managed, system, foreign, excluded).
pub mod drive_class;
/// A drive's health verdict (good, unknown, suspect, bad).
pub mod drive_health;
/// Where a drive is, for the blocking disk steps.
pub mod drive_loc;
/// A drive's usage other than active (releasing, released).
pub mod drive_use;
/// Encryption at rest asked by a StorageClass (none, fscrypt).
pub mod encryption;
/// A volume's layout: a partition or a whole drive.
pub mod layout;
/// A drive's media class (hdd, ssd, nvme, virtual).
pub mod media;
/// What happens to a claim once its node is deleted (a StorageClass parameter).
pub mod on_node_deleted;
/// Who a drive belongs to (a node of a cluster), from the drive's own note.
pub mod owner;

pub use drive_class::DriveClass;
pub use drive_health::Health;
pub use drive_loc::DriveLoc;
pub use drive_use::{DriveUse, DriveUseState, Evacuate};
pub use layout::LayoutKind;
pub use media::Media;
pub use on_node_deleted::OnNodeDeleted;
pub use owner::{Binding, DriveOwner, HeldVolume, Owner};
