//! The drive inventory's messages: its queries, commands and notifications, and the
//! health poller's word to it. (The volume manager's are in `volumes::messages`.)
//! Commands are imperative, queries are questions, notifications are past tense.

use actix::prelude::*;

use super::inventory::model::Drive;
use crate::disk::udev::BlockEvent;

/// Query: every drive the inventory knows, with classification.
#[derive(Message)]
#[rtype(result = "Vec<Drive>")]
pub struct ListDrives;

/// Query: whether the inventory has finished its first full scan.
#[derive(Message)]
#[rtype(result = "InventoryStatus")]
pub struct GetInventoryStatus;

/// Answer to [`GetInventoryStatus`].
#[derive(Debug, Clone, Copy, MessageResponse)]
pub struct InventoryStatus {
    /// First scan done (the `Probe` readiness signal).
    pub scanned: bool,
    /// Number of drives of any class.
    pub drives: usize,
}

/// Notification from the udev monitor thread.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct BlockEventSeen(pub BlockEvent);

/// Notification: the udev monitor broke; the inventory restarts itself.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct MonitorFailed(pub String);

/// Command: probe every disk again now.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Rescan;

/// Notification to subscribers: the drive set changed.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub enum DriveEvent {
    /// A drive was found.
    DriveAppeared(Drive),
    /// A drive changed.
    DriveChanged {
        /// Before.
        old: Drive,
        /// After.
        new: Drive,
    },
    /// A drive went away.
    DriveRemoved(Drive),
}

/// Notification from the health poller: a drive's SMART verdict.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct DriveHealthObserved {
    /// Stable drive id.
    pub drive_id: String,
    /// The verdict.
    pub health: super::inventory::model::DriveHealth,
}

/// Notification from the volume manager: the GPT writer refused a drive placement had
/// picked (it found data drivelet did not write, which the last probe had not seen).
/// The inventory marks the drive foreign at once, with the writer's words.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct DriveRefused {
    /// Stable drive id.
    pub drive_id: String,
    /// What the writer found, in words ("a backup GPT at the end of the disk ...").
    pub found: String,
}

/// Command: an admin adopts a drivelet disk owned elsewhere (another node, another
/// cluster, or nobody can tell): its note names this node from now on, keeping whose
/// it was and what its volumes are, and it is read again, so it turns managed and its
/// volumes are served here. Nothing else on the disk is written.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<Adopted, String>")]
pub struct AdoptDrive {
    /// Stable drive id.
    pub drive_id: String,
}

/// What [`AdoptDrive`] did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Adopted {
    /// The drive.
    pub drive_id: String,
    /// Whose it was, in words ("node node-2 of this cluster").
    pub from: String,
    /// The volumes its note listed.
    pub volumes: Vec<crate::words::HeldVolume>,
    /// It was this node's already: nothing was written.
    pub already: bool,
}

/// Command: send every future [`DriveEvent`] to this recipient.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SubscribeDrives(pub Recipient<DriveEvent>);
