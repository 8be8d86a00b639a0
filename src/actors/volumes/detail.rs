//! What an admin's listings show of a volume ([`VolumeDetail`]: `ctl volumes`, the
//! Drive objects, `kubectl drivelet volumes`), so all three say the same in the same
//! words.
//!
//! Rules: a volume's kind is `block`, its filesystem, or `fs`; its state is `lost`
//! over the state of its record; the reason shows only for an abnormal volume.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::model::VolumeRecord;
use super::messages::VolumeStatus;

/// One volume as an admin's listing shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeDetail {
    /// The volume id.
    pub id: String,
    /// The name it was created with (the PV's name).
    pub name: String,
    /// The drive it lives on.
    pub drive_id: String,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// Bytes its filesystem uses, when staged (see [`super::messages::VolumesUsed`]).
    pub used_bytes: Option<u64>,
    /// `block`, its filesystem, or `fs` ([`volume_kind`]).
    pub kind: String,
    /// Its state, or `lost` ([`volume_state`]).
    pub state: String,
    /// Something is wrong with it.
    pub abnormal: bool,
    /// What, in plain words (abnormal only).
    pub reason: Option<String>,
}

/// What an admin's listing shows of `v`, with the bytes staged filesystems use.
pub fn volume_detail(v: &VolumeStatus, used: &BTreeMap<String, u64>) -> VolumeDetail {
    let r = &v.record;
    VolumeDetail {
        id: r.id.clone(),
        name: r.name.clone(),
        drive_id: r.drive_id.clone(),
        size_bytes: r.size,
        used_bytes: used.get(&r.id).copied(),
        kind: volume_kind(r),
        state: volume_state(r),
        abnormal: v.condition.abnormal,
        reason: v.condition.abnormal.then(|| v.condition.message.clone()),
    }
}

/// A volume's kind: `block`, its filesystem, or `fs`.
pub fn volume_kind(r: &VolumeRecord) -> String {
    if r.block {
        "block".into()
    } else if r.fs_type.is_empty() {
        "fs".into()
    } else {
        r.fs_type.clone()
    }
}

/// A volume's state: `lost` over the state of its record.
pub fn volume_state(r: &VolumeRecord) -> String {
    if r.lost { "lost".into() } else { r.state.as_str().into() }
}
