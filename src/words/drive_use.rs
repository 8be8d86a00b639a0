//! A drive's usage other than active (cordoned, releasing, released) and its persisted
//! record.

use serde::{Deserialize, Serialize};

/// Usage state of a drive other than active.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriveUseState {
    /// Takes no new volumes because an admin asked (`cordon`); its volumes stay and are
    /// served as before; `uncordon` makes it active again.
    Cordoned,
    /// Takes no new volumes; its volumes are asked to move.
    Releasing,
    /// Holds no live volume; may be pulled.
    Released,
}

impl DriveUseState {
    /// Lower-case name for output.
    pub fn as_str(self) -> &'static str {
        match self {
            DriveUseState::Cordoned => "cordoned",
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
    /// Cordoned, releasing or released.
    pub state: DriveUseState,
    /// Why.
    pub reason: String,
    /// An admin asked for the release (so it completes when the drive empties).
    pub requested: bool,
    /// An admin asked for the drive's volumes to be moved off it (an evacuation); the
    /// drive is releasing until they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evacuate: Option<Evacuate>,
}

/// An evacuation asked for, as the drive's usage record keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evacuate {
    /// Switch volumes with unreadable blocks anyway (they read as zeros there).
    pub force: bool,
}
