//! A drive's usage other than active (releasing, released) and its persisted record.

use serde::{Deserialize, Serialize};

/// Usage state of a drive other than active.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriveUseState {
    /// Takes no new volumes; its volumes are asked to move.
    Releasing,
    /// Holds no live volume; may be pulled.
    Released,
}

impl DriveUseState {
    /// Lower-case name for output.
    pub fn as_str(self) -> &'static str {
        match self {
            DriveUseState::Releasing => "releasing",
            DriveUseState::Released => "released",
        }
    }
}

/// A drive's usage record (persisted; absent means active).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriveUse {
    /// Stable drive id.
    pub drive_id: String,
    /// Releasing or released.
    pub state: DriveUseState,
    /// Why.
    pub reason: String,
    /// An admin asked for the release (so it completes when the drive empties).
    pub requested: bool,
}
