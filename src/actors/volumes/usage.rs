//! Drive usage and the release and attach policy, as pure functions over the shared
//! words ([`DriveUse`], [`DriveUseState`], [`Health`]).
//!
//! Drive usage: `active` (no record), `cordoned` (no new volumes; an admin asked; its
//! volumes are served as before), `releasing` (no new volumes; its volumes say so),
//! `released` (empty or force-released; may be pulled). Transitions:
//! - health turns BAD: active/cordoned -> releasing;
//! - cordon ([`cordon`]): active -> cordoned; a releasing or released drive stays as it
//!   is (it takes no new volumes already); uncordon: cordoned -> active, and nothing
//!   else (a release is not undone by an uncordon);
//! - `ctl drive release`: active/releasing -> released when it holds no volume,
//!   otherwise -> releasing (or, with force, released with its volumes failed);
//! - the last volume of a releasing drive is deleted: -> released when auto-release
//!   is on (or the release was asked for);
//! - a released drive disappears: its record is forgotten.
//!
//! Attaching (ControllerPublishVolume, [`attach_refusal`]): a volume is attached only
//! while its drive is present and it was not failed by a forced release; a new
//! attachment also needs a drive that is not BAD and not releasing or released; on a
//! drive being evacuated it waits (a refusal the attacher retries soon) until the
//! volume has moved off it. Repeating
//! the attachment a node already holds succeeds on a drive that is merely closed to new
//! work, so a retrying attacher never detaches a running workload.

use super::conditions::lost;
use super::model::VolumeRecord;
use super::error::VolumeError;
use crate::actors::inventory::model::Drive;
use crate::words::{DriveUse, DriveUseState, Health};

/// Why a volume may not be attached to `node` now (`None`: it may).
pub(crate) fn attach_refusal(rec: &VolumeRecord, drive: Option<&Drive>, usage: Option<&DriveUse>, node: &str) -> Option<VolumeError> {
    let volume_id = rec.id.clone();
    if rec.lost {
        return Some(lost(rec));
    }
    if rec.failed {
        return Some(VolumeError::FailedByRelease { volume_id, drive_id: rec.drive_id.clone() });
    }
    let Some(d) = drive else {
        if rec.adopted.is_some() && rec.drive_id.is_empty() {
            return None;
        }
        return Some(VolumeError::DriveMissing { volume_id, drive_id: rec.drive_id.clone() });
    };
    if rec.published_node.as_deref() == Some(node) {
        return None;
    }
    // Its drive is being evacuated: the volume moves to a healthy drive once no pod
    // uses it, and is attached from there (a retry soon passes).
    if let Some(u) = usage.filter(|u| u.evacuate.is_some() && u.state == DriveUseState::Releasing) {
        return Some(VolumeError::Evacuating { volume_id, drive_id: u.drive_id.clone() });
    }
    if d.health.health == Health::Bad {
        return Some(VolumeError::DriveFailing { volume_id, drive_id: d.id.clone(), health: d.health.reason.clone() });
    }
    if let Some(u) = usage.filter(|u| u.state != DriveUseState::Cordoned) {
        return Some(VolumeError::DriveReleasing {
            volume_id,
            drive_id: u.drive_id.clone(),
            state: u.state,
            reason: u.reason.clone(),
        });
    }
    None
}

/// What health turning to `h` does to a drive's usage: BAD starts releasing it.
pub(crate) fn usage_after_health(current: Option<&DriveUse>, drive_id: &str, h: Health, reason: &str) -> Option<DriveUse> {
    let open = current.is_none_or(|u| u.state == DriveUseState::Cordoned);
    (h == Health::Bad && open).then(|| DriveUse {
        drive_id: drive_id.to_string(),
        state: DriveUseState::Releasing,
        reason: format!("health is BAD: {reason}"),
        requested: false,
        evacuate: None,
    })
}

/// What a release request does: `Ok(new usage, volumes to fail)` or an error message.
pub(crate) fn release(current: Option<&DriveUse>, drive_id: &str, live_volumes: &[&VolumeRecord], force: bool) -> (DriveUse, Vec<String>) {
    let reason = current
        .filter(|u| u.state != DriveUseState::Cordoned)
        .map(|u| u.reason.clone())
        .unwrap_or_else(|| "release requested".into());
    // An evacuation asked before goes on (a release does not cancel it).
    let evacuate = current.and_then(|u| u.evacuate);
    if live_volumes.is_empty() {
        return (DriveUse { drive_id: drive_id.into(), state: DriveUseState::Released, reason, requested: true, evacuate }, vec![]);
    }
    if force {
        let failed = live_volumes.iter().map(|v| v.id.clone()).collect();
        return (
            DriveUse { drive_id: drive_id.into(), state: DriveUseState::Released, reason: format!("{reason}; forced"), requested: true, evacuate: None },
            failed,
        );
    }
    (DriveUse { drive_id: drive_id.into(), state: DriveUseState::Releasing, reason, requested: true, evacuate }, vec![])
}

/// What a cordon (`on`) or uncordon request does to a drive's usage: `Ok(Some(record))`
/// to store, `Ok(None)` to forget the record (active again), `Err(unchanged)` when it
/// changes nothing (already so, or a release that an uncordon does not undo).
pub(crate) fn cordon(current: Option<&DriveUse>, drive_id: &str, on: bool) -> Result<Option<DriveUse>, Option<DriveUse>> {
    match (current.map(|u| u.state), on) {
        (None, true) => Ok(Some(DriveUse {
            drive_id: drive_id.to_string(),
            state: DriveUseState::Cordoned,
            reason: "cordoned by an admin".into(),
            requested: true,
            evacuate: None,
        })),
        (Some(DriveUseState::Cordoned), false) => Ok(None),
        _ => Err(current.cloned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::inventory::model::DriveHealth;
    use crate::actors::volumes::model::VolumeState;
    use crate::words::Media;

    fn rec() -> VolumeRecord {
        let mut r = VolumeRecord::for_test(1, VolumeState::Published);
        r.id = "v1".into();
        r
    }

    fn drive(h: Health) -> Drive {
        let mut d = Drive::for_test("d1", Media::Ssd, 1 << 40);
        d.health = DriveHealth { health: h, reason: "12 reallocated sectors".into(), checked_unix: 1, smart: Default::default() };
        d
    }

    #[test]
    fn attachments_need_a_present_usable_drive_unless_they_are_repeats() {
        let releasing = DriveUse { drive_id: "d1".into(), state: DriveUseState::Releasing, reason: "asked".into(), requested: true, evacuate: None };
        let released = DriveUse { state: DriveUseState::Released, ..releasing.clone() };
        let cordoned = DriveUse { state: DriveUseState::Cordoned, ..releasing.clone() };
        let evacuating = DriveUse { evacuate: Some(crate::words::Evacuate { force: false }), ..releasing.clone() };
        let fresh = rec();
        let mut attached = rec();
        attached.published_node = Some("n1".into());
        let mut failed = rec();
        failed.failed = true;
        // (case, volume, its drive, the drive's usage, what the refusal must say or None)
        type Case<'a> = (&'a str, &'a VolumeRecord, Option<Drive>, Option<&'a DriveUse>, Option<&'a str>);
        let table: Vec<Case<'_>> = vec![
            ("healthy drive", &fresh, Some(drive(Health::Good)), None, None),
            ("no SMART", &fresh, Some(drive(Health::Unknown)), None, None),
            ("suspect drive", &fresh, Some(drive(Health::Suspect)), None, None),
            ("missing drive", &fresh, None, None, Some("drive d1 which is missing")),
            ("failing drive", &fresh, Some(drive(Health::Bad)), None, Some("failing (12 reallocated sectors)")),
            ("releasing drive", &fresh, Some(drive(Health::Good)), Some(&releasing), Some("is releasing (asked)")),
            ("released drive", &fresh, Some(drive(Health::Good)), Some(&released), Some("is released")),
            ("force-failed volume", &failed, Some(drive(Health::Good)), None, Some("forced release")),
            ("repeat on a releasing drive", &attached, Some(drive(Health::Good)), Some(&releasing), None),
            ("evacuated drive: waits for the move", &fresh, Some(drive(Health::Good)), Some(&evacuating), Some("being evacuated")),
            ("evacuated failing drive: waits too", &fresh, Some(drive(Health::Bad)), Some(&evacuating), Some("moves to another drive")),
            ("repeat on an evacuated drive", &attached, Some(drive(Health::Good)), Some(&evacuating), None),
            ("cordoned drive", &fresh, Some(drive(Health::Good)), Some(&cordoned), None),
            ("repeat on a failing drive", &attached, Some(drive(Health::Bad)), None, None),
            ("repeat with the drive missing", &attached, None, None, Some("missing")),
        ];
        for (what, r, d, u, want) in table {
            let got = attach_refusal(r, d.as_ref(), u, "n1");
            match (want, &got) {
                (None, None) => {}
                (Some(w), Some(g)) => assert!(g.to_string().contains(w), "{what}: {g} should contain {w:?}"),
                _ => panic!("{what}: want {want:?}, got {got:?}"),
            }
        }
        assert!(attach_refusal(&attached, Some(&drive(Health::Bad)), None, "n2").is_some(), "another node is no repeat");
        let e = attach_refusal(&fresh, Some(&drive(Health::Good)), Some(&evacuating), "n1").expect("refused");
        assert_eq!(crate::k8s::attach::kind_of(&e), crate::k8s::attach::RefusalKind::Transient, "retried soon, not after the terminal backoff");
    }

    #[test]
    fn bad_health_starts_a_release_and_release_requests_follow_the_volumes() {
        let u = usage_after_health(None, "d1", Health::Bad, "SMART failed").unwrap();
        assert_eq!(u.state, DriveUseState::Releasing);
        assert!(usage_after_health(None, "d1", Health::Suspect, "x").is_none());
        assert!(usage_after_health(Some(&u), "d1", Health::Bad, "x").is_none(), "already releasing");
        let r = rec();
        let (u2, failed) = release(Some(&u), "d1", &[], false);
        assert_eq!((u2.state, failed.len()), (DriveUseState::Released, 0));
        let (u3, failed) = release(Some(&u), "d1", &[&r], false);
        assert_eq!((u3.state, failed.len()), (DriveUseState::Releasing, 0));
        assert!(u3.requested);
        let (u4, failed) = release(None, "d1", &[&r], true);
        assert_eq!((u4.state, failed), (DriveUseState::Released, vec!["v1".to_string()]));
    }

    #[test]
    fn cordon_closes_an_active_drive_and_uncordon_opens_only_a_cordoned_one() {
        let of = |state| DriveUse { drive_id: "d1".into(), state, reason: "asked".into(), requested: true, evacuate: None };
        let (cordoned, releasing, released) =
            (of(DriveUseState::Cordoned), of(DriveUseState::Releasing), of(DriveUseState::Released));
        // (case, current usage, cordon?, the state after, or None: active; changed?)
        type Case<'a> = (&'a str, Option<&'a DriveUse>, bool, Option<DriveUseState>, bool);
        let table: Vec<Case<'_>> = vec![
            ("cordon an active drive", None, true, Some(DriveUseState::Cordoned), true),
            ("cordon it again", Some(&cordoned), true, Some(DriveUseState::Cordoned), false),
            ("cordon a releasing drive", Some(&releasing), true, Some(DriveUseState::Releasing), false),
            ("cordon a released drive", Some(&released), true, Some(DriveUseState::Released), false),
            ("uncordon a cordoned drive", Some(&cordoned), false, None, true),
            ("uncordon an active drive", None, false, None, false),
            ("uncordon does not undo a release", Some(&releasing), false, Some(DriveUseState::Releasing), false),
            ("nor a completed one", Some(&released), false, Some(DriveUseState::Released), false),
        ];
        for (case, current, on, want, changed) in table {
            let got = cordon(current, "d1", on);
            assert_eq!(got.is_ok(), changed, "{case}");
            let after = match got {
                Ok(u) | Err(u) => u.map(|u| u.state),
            };
            assert_eq!(after, want, "{case}");
        }
        // A cordoned drive that turns BAD starts releasing; a release of it says so.
        let u = usage_after_health(Some(&cordoned), "d1", Health::Bad, "SMART failed").expect("releasing");
        assert_eq!((u.state, u.reason.as_str()), (DriveUseState::Releasing, "health is BAD: SMART failed"));
        let (u, _) = release(Some(&cordoned), "d1", &[], false);
        assert_eq!((u.state, u.reason.as_str()), (DriveUseState::Released, "release requested"));
    }
}
