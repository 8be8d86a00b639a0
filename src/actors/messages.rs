//! Messages between actors and from the gRPC front. Commands are imperative, queries
//! are questions, notifications are past tense.

use actix::prelude::*;

use super::inventory::model::Drive;
use super::volumes::conditions::Reason;
use crate::disk::udev::BlockEvent;
use crate::words::{LayoutKind, Media};

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

/// The question GetCapacity asks of the volume manager's published view: what volumes
/// of `media` and `layout` whose smallest size is `minimum` could use (see
/// `actors::volumes::placement` and `actors::volumes::view`).
#[derive(Debug, Clone, Copy)]
pub struct GetCapacity {
    /// Restrict to one media class; `None` is any.
    pub media: Option<Media>,
    /// Partition or whole-drive volumes.
    pub layout: LayoutKind,
    /// The smallest volume the request's capabilities allow.
    pub minimum: u64,
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

/// Command: send every future [`DriveEvent`] to this recipient.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SubscribeDrives(pub Recipient<DriveEvent>);

/// Notification from the volume manager: a volume's condition turned abnormal, or back
/// to normal.
#[derive(Message, Debug, Clone, PartialEq, Eq)]
#[rtype(result = "()")]
pub struct VolumeConditionChanged {
    /// The volume id.
    pub volume_id: String,
    /// Something is wrong now.
    pub abnormal: bool,
    /// What, and what to do (the CSI volume condition message).
    pub message: String,
    /// Why, typed: the reasons of the findings behind it, in report order (empty when
    /// normal). What the Event side compares; the message is only for people.
    pub reasons: Vec<Reason>,
}

/// Command: send every future [`VolumeConditionChanged`] to this recipient.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SubscribeConditions(pub Recipient<VolumeConditionChanged>);

/// Notification from the volume manager: what a drive holds changed (a volume on it was
/// created, deleted or failed, or the drive's usage record changed).
#[derive(Message, Debug, Clone, PartialEq, Eq)]
#[rtype(result = "()")]
pub struct VolumesChanged {
    /// The drive's stable id.
    pub drive_id: String,
}

/// Command: send every future [`VolumesChanged`] to this recipient.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SubscribeVolumes(pub Recipient<VolumesChanged>);
