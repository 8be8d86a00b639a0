//! Volume conditions and drive usage states, as pure data and functions.
//!
//! A volume's condition is abnormal when any of these holds, and its message names each
//! finding and what to do (findings in this order):
//! 1. its drive is missing from the node;
//! 2. the volume was failed by a forced drive release;
//! 3. its drive's health is BAD or SUSPECT (UNKNOWN is normal: virtual drives have no
//!    SMART);
//! 4. its drive is being released or was released;
//! 5. a check found its staging or a target path not mounted, a path unreadable, the
//!    filesystem corrupt, or the filesystem over the usage threshold.
//!
//! Drive usage: `active` (no record), `releasing` (no new volumes; its volumes say so),
//! `released` (empty or force-released; may be pulled). Transitions:
//! - health turns BAD: active -> releasing;
//! - `ctl drive release`: active/releasing -> released when it holds no volume,
//!   otherwise -> releasing (or, with force, released with its volumes failed);
//! - the last volume of a releasing drive is deleted: -> released when auto-release
//!   is on (or the release was asked for);
//! - a released drive disappears: its record is forgotten.
//!
//! Attaching (ControllerPublishVolume, [`attach_refusal`]): a volume is attached only
//! while its drive is present and it was not failed by a forced release; a new
//! attachment also needs a drive that is not BAD and not releasing or released. Repeating
//! the attachment a node already holds succeeds on a drive that is merely closed to new
//! work, so a retrying attacher never detaches a running workload.

use serde::{Deserialize, Serialize};

use super::model::VolumeRecord;
use super::VolumeError;
use crate::actors::inventory::model::Drive;
use crate::disk::smart::Health;

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

/// One finding of a volume check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Finding {
    /// The staging path is not mounted.
    StagingNotMounted {
        /// The path.
        path: String,
    },
    /// A target path is not mounted.
    TargetNotMounted {
        /// The path.
        path: String,
    },
    /// A path could not be read.
    Unreadable {
        /// The path.
        path: String,
        /// The error.
        error: String,
    },
    /// The filesystem is fuller than the threshold.
    OutOfSpace {
        /// Percent used (blocks or inodes, whichever is higher).
        percent: u8,
        /// The threshold.
        threshold: u8,
    },
    /// Every read-only fsck run found corruption.
    Corrupt {
        /// What fsck said.
        detail: String,
    },
}

impl Finding {
    fn message(&self) -> String {
        match self {
            Finding::StagingNotMounted { path } => format!(
                "staging path {path} is not mounted: the filesystem was unmounted behind drivelet's back; restart the pods using it so kubelet stages it again"
            ),
            Finding::TargetNotMounted { path } => {
                format!("target path {path} is not mounted: the pod sees an empty directory; restart the pod")
            }
            Finding::Unreadable { path, error } => {
                format!("{path} cannot be read ({error}): the drive or filesystem is failing; move the data off")
            }
            Finding::OutOfSpace { percent, threshold } => {
                format!("the filesystem is {percent}% full (threshold {threshold}%): free space or move to a bigger volume")
            }
            Finding::Corrupt { detail } => {
                format!("the filesystem is corrupt ({detail}): run fsck on it before using it again, or restore from backup")
            }
        }
    }
}

/// A volume's condition (CSI `VolumeCondition`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Condition {
    /// Something is wrong.
    pub abnormal: bool,
    /// What, and what to do.
    pub message: String,
}

/// Derives a volume's condition from its record, its drive (if present on the node),
/// the drive's usage record and the latest check findings.
pub fn condition(rec: &VolumeRecord, drive: Option<&Drive>, usage: Option<&DriveUse>, findings: &[Finding]) -> Condition {
    let mut why: Vec<String> = Vec::new();
    match drive {
        // An adopted volume on storage drivelet does not manage has no drive to judge.
        None if rec.adopted.is_some() && rec.drive_id.is_empty() => {}
        None => why.push(format!(
            "drive {} is missing from this node: the data is unreachable; put the drive back, or if it failed, delete the volume and restore from backup",
            rec.drive_id
        )),
        Some(d) => match d.health.health {
            Health::Bad => why.push(format!(
                "drive {} is failing ({}): move the data to another volume and delete this one",
                d.id, d.health.reason
            )),
            Health::Suspect => {
                why.push(format!("drive {} health is suspect ({}): back up the data", d.id, d.health.reason))
            }
            Health::Good | Health::Unknown => {}
        },
    }
    if rec.lost {
        why.insert(0, lost_reason(rec));
    }
    if rec.failed {
        why.insert(0, "volume failed: its drive was force-released; delete the volume and restore from backup".into());
    }
    if let Some(u) = usage.filter(|u| !(u.state == DriveUseState::Releasing && drive.is_some_and(|d| d.health.health == Health::Bad) && !u.requested)) {
        why.push(format!(
            "drive {} is {} ({}): move the data to another volume and delete this one",
            u.drive_id,
            u.state.as_str(),
            u.reason
        ));
    }
    why.extend(findings.iter().map(Finding::message));
    if why.is_empty() {
        Condition { abnormal: false, message: "volume is healthy".into() }
    } else {
        Condition { abnormal: true, message: why.join("; ") }
    }
}

/// What is said of a volume whose partition is gone from its drive ([`VolumeRecord::lost`]).
pub fn lost_reason(rec: &VolumeRecord) -> String {
    lost(rec).why().unwrap_or_default()
}

/// The error of a call on a lost volume.
pub fn lost(rec: &VolumeRecord) -> VolumeError {
    VolumeError::Lost { volume_id: rec.id.clone(), part_guid: rec.part_guid, drive_id: rec.drive_id.clone() }
}

/// Why a volume may not be attached to `node` now (`None`: it may).
pub fn attach_refusal(rec: &VolumeRecord, drive: Option<&Drive>, usage: Option<&DriveUse>, node: &str) -> Option<VolumeError> {
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
    if d.health.health == Health::Bad {
        return Some(VolumeError::DriveFailing { volume_id, drive_id: d.id.clone(), health: d.health.reason.clone() });
    }
    if let Some(u) = usage {
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
pub fn usage_after_health(current: Option<&DriveUse>, drive_id: &str, h: Health, reason: &str) -> Option<DriveUse> {
    match (current, h) {
        (None, Health::Bad) => Some(DriveUse {
            drive_id: drive_id.to_string(),
            state: DriveUseState::Releasing,
            reason: format!("health is BAD: {reason}"),
            requested: false,
        }),
        _ => None,
    }
}

/// What a release request does: `Ok(new usage, volumes to fail)` or an error message.
pub fn release(current: Option<&DriveUse>, drive_id: &str, live_volumes: &[&VolumeRecord], force: bool) -> (DriveUse, Vec<String>) {
    let reason = current.map(|u| u.reason.clone()).unwrap_or_else(|| "release requested".into());
    if live_volumes.is_empty() {
        return (DriveUse { drive_id: drive_id.into(), state: DriveUseState::Released, reason, requested: true }, vec![]);
    }
    if force {
        let failed = live_volumes.iter().map(|v| v.id.clone()).collect();
        return (
            DriveUse { drive_id: drive_id.into(), state: DriveUseState::Released, reason: format!("{reason}; forced"), requested: true },
            failed,
        );
    }
    (DriveUse { drive_id: drive_id.into(), state: DriveUseState::Releasing, reason, requested: true }, vec![])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::inventory::model::DriveHealth;
    use crate::actors::volumes::model::VolumeState;
    use crate::config::Media;

    fn rec() -> VolumeRecord {
        let mut r = VolumeRecord::for_test(1, VolumeState::Published);
        r.id = "v1".into();
        r
    }

    fn drive(h: Health) -> Drive {
        let mut d = Drive::for_test("d1", Media::Ssd, 1 << 40);
        d.health = DriveHealth { health: h, reason: "12 reallocated sectors".into(), checked_unix: 1 };
        d
    }

    #[test]
    fn conditions_name_every_finding_with_what_to_do() {
        let r = rec();
        let ok = condition(&r, Some(&drive(Health::Good)), None, &[]);
        assert!(!ok.abnormal);
        assert!(!condition(&r, Some(&drive(Health::Unknown)), None, &[]).abnormal, "no SMART is not a failure");
        let table: Vec<(Option<Drive>, Option<DriveUse>, Vec<Finding>, bool, &str)> = vec![
            (None, None, vec![], false, "drive d1 is missing"),
            (Some(drive(Health::Bad)), None, vec![], false, "drive d1 is failing (12 reallocated sectors)"),
            (Some(drive(Health::Suspect)), None, vec![], false, "suspect"),
            (
                Some(drive(Health::Good)),
                Some(DriveUse { drive_id: "d1".into(), state: DriveUseState::Releasing, reason: "r".into(), requested: true }),
                vec![],
                false,
                "drive d1 is releasing",
            ),
            (Some(drive(Health::Good)), None, vec![Finding::StagingNotMounted { path: "/s".into() }], false, "staging path /s is not mounted"),
            (Some(drive(Health::Good)), None, vec![Finding::TargetNotMounted { path: "/t".into() }], false, "target path /t is not mounted"),
            (Some(drive(Health::Good)), None, vec![Finding::Unreadable { path: "/s".into(), error: "EIO".into() }], false, "cannot be read (EIO)"),
            (Some(drive(Health::Good)), None, vec![Finding::OutOfSpace { percent: 95, threshold: 90 }], false, "95% full"),
            (Some(drive(Health::Good)), None, vec![Finding::Corrupt { detail: "bad inode".into() }], false, "corrupt (bad inode)"),
            (Some(drive(Health::Good)), None, vec![], true, "volume failed"),
        ];
        for (d, u, f, failed, want) in table {
            let mut r = rec();
            r.failed = failed;
            let c = condition(&r, d.as_ref(), u.as_ref(), &f);
            assert!(c.abnormal, "{want}");
            assert!(c.message.contains(want), "{} should contain {want}", c.message);
        }
        let c = condition(&r, None, None, &[Finding::OutOfSpace { percent: 99, threshold: 90 }]);
        assert!(c.message.contains("missing") && c.message.contains("99%"), "{}", c.message);
    }

    #[test]
    fn attachments_need_a_present_usable_drive_unless_they_are_repeats() {
        let releasing = DriveUse { drive_id: "d1".into(), state: DriveUseState::Releasing, reason: "asked".into(), requested: true };
        let released = DriveUse { state: DriveUseState::Released, ..releasing.clone() };
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
}
