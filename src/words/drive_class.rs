//! What drivelet may do with a drive (managed, system, foreign, excluded,
//! owned-elsewhere): the
//! inventory decides it, everything else reads it.

use serde::{Deserialize, Serialize};

/// What drivelet may do with a drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum DriveClass {
    /// Blank or carrying a drivelet GPT: drivelet may write to it.
    Managed,
    /// Backs the running system (a mounted filesystem, swap, or a holder that does).
    System,
    /// Holds data or structures drivelet did not create; never touched.
    Foreign,
    /// Ruled out by a configured filter.
    Excluded,
    /// A drivelet disk whose note names another node or cluster as its owner, or whose
    /// owner cannot be read: shown with what it holds, never written, placed on,
    /// cleaned or served until an admin adopts it.
    OwnedElsewhere,
}

impl DriveClass {
    /// Lower-case name for output.
    pub fn as_str(self) -> &'static str {
        match self {
            DriveClass::Managed => "managed",
            DriveClass::System => "system",
            DriveClass::Foreign => "foreign",
            DriveClass::Excluded => "excluded",
            DriveClass::OwnedElsewhere => "owned-elsewhere",
        }
    }
}
