//! Values shared by the decision tests and the fake API server tests.

use crate::actors::inventory::model::{Drive, DriveHealth};
use crate::actors::volumes::model::{VolumeRecord, VolumeState};
use crate::k8s::crd;
use crate::words::{DriveClass, DriveUse, DriveUseState, Health, Media};

use super::desired::desired;

pub(crate) const NODE: &str = "node-a";

/// An inventory drive of `class` with a serial, a model and a good health verdict.
pub(crate) fn drive(id: &str, class: DriveClass, reason: &str) -> Drive {
    let mut d = Drive::for_test(id, Media::Ssd, 1 << 40);
    d.class = class;
    d.reason = reason.into();
    d.serial = Some(format!("SN-{id}"));
    d.model = Some("Samsung SSD 870".into());
    d.health = DriveHealth { health: Health::Good, reason: "SMART overall-health passed".into(), checked_unix: 1, smart: Default::default() };
    d
}

/// A volume `n` on drive `drive_id`.
pub(crate) fn volume(n: u8, drive_id: &str, state: VolumeState) -> VolumeRecord {
    let mut r = VolumeRecord::for_test(n, state);
    r.drive_id = drive_id.into();
    r
}

/// The object `desired` makes of a lone drive without volumes.
pub(crate) fn object_of(d: &Drive) -> crd::Drive {
    desired(NODE, std::slice::from_ref(d), &[], &[]).remove(0)
}

/// A usage record of `drive_id` in `state`, not asked by an admin.
pub(crate) fn use_of(drive_id: &str, state: DriveUseState, reason: &str) -> DriveUse {
    DriveUse { drive_id: drive_id.into(), state, reason: reason.into(), requested: false, evacuate: None }
}
