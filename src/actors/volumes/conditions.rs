//! Volume conditions and storage health, as pure data and functions (drive usage and
//! the release and attach policy are in [`super::usage`]).
//!
//! A volume's condition is abnormal when any of these holds, and its message names each
//! finding and what to do (findings in this order):
//! 1. the volume was failed by a forced drive release;
//! 2. its partition is gone from its drive (lost);
//! 3. its drive is missing from the node, or its health is BAD or SUSPECT (UNKNOWN is
//!    normal: virtual drives have no SMART);
//! 4. its drive is being released or was released;
//! 5. a check found its staging or a target path not mounted, a path unreadable, the
//!    filesystem corrupt, or the filesystem over the usage threshold.
//!
//! One model serves both CSI generations: [`condition`] gathers the findings once as
//! [`Reason`]s with their messages; CSI v1.12's `VolumeCondition` is their messages
//! joined, CSI v1.13's `VolumeHealth` is the same list as entries, each with the fixed
//! status of its reason ([`Reason::status`]) and one entry per reason (two findings of
//! one reason, such as two unmounted target paths, share an entry: the spec forbids a
//! repeated (status, reason)). A healthy volume has no entry. [`storage_health`] judges
//! the managed drives themselves for NodeGetStorageHealth: a missing drive that still
//! holds volumes is STORAGE_UNREACHABLE, a BAD or SUSPECT one STORAGE_DEGRADED; a drive
//! being released is an admin's choice, not a fault, and is not reported there.

use serde::{Deserialize, Serialize};

use super::model::VolumeRecord;
use super::error::VolumeError;
use crate::actors::inventory::model::Drive;
use crate::words::{DriveUse, DriveUseState, Health};

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
    /// A staging or target path no longer leads to what drivelet mounted there: a part
    /// of it was replaced (a symbolic link drivelet does not follow, a path that leaves
    /// the allowed roots), so nothing is read through it.
    PathReplaced {
        /// The path.
        path: String,
        /// Why it is refused, in words.
        reason: String,
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
    /// The reason a finding is reported under.
    fn reason(&self) -> Reason {
        match self {
            Finding::StagingNotMounted { .. } | Finding::TargetNotMounted { .. } | Finding::PathReplaced { .. } => Reason::MountLost,
            Finding::Unreadable { .. } => Reason::PathUnreadable,
            Finding::OutOfSpace { .. } => Reason::FilesystemFull,
            Finding::Corrupt { .. } => Reason::FilesystemCorrupt,
        }
    }

    fn message(&self) -> String {
        match self {
            Finding::StagingNotMounted { path } => format!(
                "staging path {path} is not mounted: the filesystem was unmounted behind drivelet's back; restart the pods using it so kubelet stages it again"
            ),
            Finding::TargetNotMounted { path } => {
                format!("target path {path} is not mounted: the pod sees an empty directory; restart the pod")
            }
            Finding::PathReplaced { path, reason } => format!(
                "{path} no longer leads to the volume's mount ({reason}): drivelet reads nothing through it; restart the pods using it so kubelet stages and publishes it again"
            ),
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

/// How bad a volume health entry is (CSI v1.13 `VolumeHealthErrorType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum HealthStatus {
    /// The data cannot be reached.
    Inaccessible,
    /// Data loss is known or strongly suspected.
    DataLoss,
    /// Usable, but not operating optimally.
    Degraded,
}

impl HealthStatus {
    /// The spec's name.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthStatus::Inaccessible => "INACCESSIBLE",
            HealthStatus::DataLoss => "DATA_LOSS",
            HealthStatus::Degraded => "DEGRADED",
        }
    }
}

/// Why a volume or a drive is reported: stable CamelCase names (docs/csi.md lists them);
/// each has one status, so the v1.13 answer follows from the finding alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reason {
    /// A forced drive release failed the volume: its data was given up.
    VolumeFailed,
    /// The volume's partition is gone from its drive.
    PartitionLost,
    /// The volume's drive is missing from the node.
    DriveMissing,
    /// The volume's drive is failing (SMART BAD).
    DriveFailed,
    /// The volume's drive health is suspect (SMART SUSPECT).
    DriveSuspect,
    /// The volume's drive is being released: the data should move.
    DriveReleasing,
    /// The volume's drive was released.
    DriveReleased,
    /// The staging path or a target path is no longer mounted.
    MountLost,
    /// A path of the volume cannot be read.
    PathUnreadable,
    /// The filesystem is fuller than the threshold.
    FilesystemFull,
    /// Every read-only fsck run found corruption.
    FilesystemCorrupt,
}

impl Reason {
    /// Every reason, in report order.
    pub const ALL: [Reason; 11] = [
        Reason::VolumeFailed,
        Reason::PartitionLost,
        Reason::DriveMissing,
        Reason::DriveFailed,
        Reason::DriveSuspect,
        Reason::DriveReleasing,
        Reason::DriveReleased,
        Reason::MountLost,
        Reason::PathUnreadable,
        Reason::FilesystemFull,
        Reason::FilesystemCorrupt,
    ];

    /// The CamelCase name CSI v1.13 carries.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::VolumeFailed => "VolumeFailed",
            Reason::PartitionLost => "PartitionLost",
            Reason::DriveMissing => "DriveMissing",
            Reason::DriveFailed => "DriveFailed",
            Reason::DriveSuspect => "DriveSuspect",
            Reason::DriveReleasing => "DriveReleasing",
            Reason::DriveReleased => "DriveReleased",
            Reason::MountLost => "MountLost",
            Reason::PathUnreadable => "PathUnreadable",
            Reason::FilesystemFull => "FilesystemFull",
            Reason::FilesystemCorrupt => "FilesystemCorrupt",
        }
    }

    /// The kebab-case name the metrics carry (`drive-missing`).
    pub fn kebab(self) -> &'static str {
        match self {
            Reason::VolumeFailed => "volume-failed",
            Reason::PartitionLost => "partition-lost",
            Reason::DriveMissing => "drive-missing",
            Reason::DriveFailed => "drive-failed",
            Reason::DriveSuspect => "drive-suspect",
            Reason::DriveReleasing => "drive-releasing",
            Reason::DriveReleased => "drive-released",
            Reason::MountLost => "mount-lost",
            Reason::PathUnreadable => "path-unreadable",
            Reason::FilesystemFull => "filesystem-full",
            Reason::FilesystemCorrupt => "filesystem-corrupt",
        }
    }

    /// The status a volume reported for this reason has: gone data is DATA_LOSS,
    /// unreachable data INACCESSIBLE, anything still usable DEGRADED.
    pub fn status(self) -> HealthStatus {
        match self {
            Reason::VolumeFailed | Reason::PartitionLost | Reason::DriveFailed | Reason::FilesystemCorrupt => HealthStatus::DataLoss,
            Reason::DriveMissing | Reason::MountLost | Reason::PathUnreadable => HealthStatus::Inaccessible,
            Reason::DriveSuspect | Reason::DriveReleasing | Reason::DriveReleased | Reason::FilesystemFull => HealthStatus::Degraded,
        }
    }
}

/// One adverse condition of a volume (CSI v1.13 `VolumeHealthEntry`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthEntry {
    /// How bad.
    pub status: HealthStatus,
    /// Why (unique per volume).
    pub reason: Reason,
    /// What, and what to do.
    pub message: String,
}

/// A volume's condition: CSI v1.12's `VolumeCondition` (`abnormal`, `message`) and
/// CSI v1.13's `VolumeHealth` entries, from the same findings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Condition {
    /// Something is wrong.
    pub abnormal: bool,
    /// What, and what to do.
    pub message: String,
    /// The same findings by reason (empty when healthy).
    #[serde(default)]
    pub entries: Vec<HealthEntry>,
}

impl Condition {
    /// The condition of a volume with no adverse finding.
    pub(crate) fn healthy() -> Condition {
        Condition { abnormal: false, message: "volume is healthy".into(), entries: Vec::new() }
    }

    /// The condition of findings given in report order: one entry per reason (messages
    /// of one reason joined), and every message joined for v1.12.
    fn of(found: Vec<(Reason, String)>) -> Condition {
        if found.is_empty() {
            return Condition::healthy();
        }
        let message = found.iter().map(|(_, m)| m.as_str()).collect::<Vec<_>>().join("; ");
        let mut entries: Vec<HealthEntry> = Vec::new();
        for (reason, m) in found {
            match entries.iter_mut().find(|e| e.reason == reason) {
                Some(e) => {
                    e.message.push_str("; ");
                    e.message.push_str(&m);
                }
                None => entries.push(HealthEntry { status: reason.status(), reason, message: m }),
            }
        }
        Condition { abnormal: true, message, entries }
    }
}

/// Derives a volume's condition from its record, its drive (if present on the node),
/// the drive's usage record and the latest check findings.
pub(crate) fn condition(rec: &VolumeRecord, drive: Option<&Drive>, usage: Option<&DriveUse>, findings: &[Finding]) -> Condition {
    let mut found: Vec<(Reason, String)> = Vec::new();
    if rec.failed {
        found.push((Reason::VolumeFailed, "volume failed: its drive was force-released; delete the volume and restore from backup".into()));
    }
    if rec.lost {
        found.push((Reason::PartitionLost, lost_reason(rec)));
    }
    match drive {
        // An adopted volume on storage drivelet does not manage has no drive to judge.
        None if rec.adopted.is_some() && rec.drive_id.is_empty() => {}
        None => found.push((Reason::DriveMissing, format!(
            "drive {} is missing from this node: the data is unreachable; put the drive back, or if it failed, delete the volume and restore from backup",
            rec.drive_id
        ))),
        Some(d) => match d.health.health {
            Health::Bad => found.push((Reason::DriveFailed, format!(
                "drive {} is failing ({}): have it evacuated (the volume moves to another drive with its data), or move the data to another volume and delete this one",
                d.id, d.health.reason
            ))),
            Health::Suspect => found
                .push((Reason::DriveSuspect, format!("drive {} health is suspect ({}): back up the data", d.id, d.health.reason))),
            Health::Good | Health::Unknown => {}
        },
    }
    // A cordoned drive only takes no new volumes: its volumes are as well as before.
    let usage = usage.filter(|u| u.state != DriveUseState::Cordoned);
    if let Some(u) = usage.filter(|u| !(u.state == DriveUseState::Releasing && drive.is_some_and(|d| d.health.health == Health::Bad) && !u.requested)) {
        let reason = match u.state {
            DriveUseState::Releasing | DriveUseState::Cordoned => Reason::DriveReleasing,
            DriveUseState::Released => Reason::DriveReleased,
        };
        let message = if u.evacuate.is_some() && u.state == DriveUseState::Releasing {
            format!(
                "drive {} is being evacuated: this volume moves to another drive of this node with its data and id, once no pod uses it",
                u.drive_id
            )
        } else {
            format!("drive {} is {} ({}): move the data to another volume and delete this one", u.drive_id, u.state.as_str(), u.reason)
        };
        found.push((reason, message));
    }
    found.extend(findings.iter().map(|f| (f.reason(), f.message())));
    Condition::of(found)
}

/// How bad a storage health entry is (CSI v1.13 `StorageHealthErrorType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum StorageStatus {
    /// The storage cannot be reached from this node.
    StorageUnreachable,
    /// The storage works, degraded.
    StorageDegraded,
}

impl StorageStatus {
    /// The spec's name.
    pub fn as_str(self) -> &'static str {
        match self {
            StorageStatus::StorageUnreachable => "STORAGE_UNREACHABLE",
            StorageStatus::StorageDegraded => "STORAGE_DEGRADED",
        }
    }
}

/// One adverse condition of this node's storage (CSI v1.13 `StorageBackendHealth`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageEntry {
    /// How bad.
    pub status: StorageStatus,
    /// Why: DriveMissing, DriveFailed or DriveSuspect (unique in one answer).
    pub reason: Reason,
    /// Which drives, and what to do.
    pub message: String,
}

/// Judges this node's managed drives: `present` are the managed drives on the node,
/// `missing` the ids of drives that hold volumes but are gone (with how many volumes).
/// One entry per reason; its message names every drive it covers. Empty: all well.
pub(crate) fn storage_health(present: &[&Drive], missing: &[(String, usize)]) -> Vec<StorageEntry> {
    let mut found: Vec<(StorageStatus, Reason, String)> = Vec::new();
    for (id, n) in missing {
        let vols = if *n == 1 { "1 volume".to_string() } else { format!("{n} volumes") };
        found.push((
            StorageStatus::StorageUnreachable,
            Reason::DriveMissing,
            format!("drive {id} holding {vols} is missing from this node: put it back, or restore its volumes from backup"),
        ));
    }
    for d in present {
        match d.health.health {
            Health::Bad => found.push((
                StorageStatus::StorageDegraded,
                Reason::DriveFailed,
                format!("drive {} ({}) is failing ({}): it takes no new volumes; move its data off and replace it", d.id, d.path.display(), d.health.reason),
            )),
            Health::Suspect => found.push((
                StorageStatus::StorageDegraded,
                Reason::DriveSuspect,
                format!("drive {} ({}) health is suspect ({}): back up its data", d.id, d.path.display(), d.health.reason),
            )),
            Health::Good | Health::Unknown => {}
        }
    }
    let mut out: Vec<StorageEntry> = Vec::new();
    for (status, reason, m) in found {
        match out.iter_mut().find(|e| e.reason == reason) {
            Some(e) => {
                e.message.push_str("; ");
                e.message.push_str(&m);
            }
            None => out.push(StorageEntry { status, reason, message: m }),
        }
    }
    out
}

/// What is said of a volume whose partition is gone from its drive ([`VolumeRecord::lost`]).
pub(crate) fn lost_reason(rec: &VolumeRecord) -> String {
    lost(rec).why().unwrap_or_default()
}

/// The error of a call on a lost volume.
pub(crate) fn lost(rec: &VolumeRecord) -> VolumeError {
    VolumeError::Lost { volume_id: rec.id.clone(), part_guid: rec.part_guid, drive_id: rec.drive_id.clone() }
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
                Some(DriveUse { drive_id: "d1".into(), state: DriveUseState::Releasing, reason: "r".into(), requested: true, evacuate: None }),
                vec![],
                false,
                "drive d1 is releasing",
            ),
            (Some(drive(Health::Good)), None, vec![Finding::StagingNotMounted { path: "/s".into() }], false, "staging path /s is not mounted"),
            (Some(drive(Health::Good)), None, vec![Finding::TargetNotMounted { path: "/t".into() }], false, "target path /t is not mounted"),
            (Some(drive(Health::Good)), None, vec![Finding::Unreadable { path: "/s".into(), error: "EIO".into() }], false, "cannot be read (EIO)"),
            (
                Some(drive(Health::Good)),
                None,
                vec![Finding::PathReplaced { path: "/s".into(), reason: "a symbolic link".into() }],
                false,
                "/s no longer leads to the volume's mount (a symbolic link): drivelet reads nothing through it",
            ),
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
    fn every_reason_has_one_fixed_status() {
        use HealthStatus::*;
        let want = [
            (Reason::VolumeFailed, DataLoss),
            (Reason::PartitionLost, DataLoss),
            (Reason::DriveMissing, Inaccessible),
            (Reason::DriveFailed, DataLoss),
            (Reason::DriveSuspect, Degraded),
            (Reason::DriveReleasing, Degraded),
            (Reason::DriveReleased, Degraded),
            (Reason::MountLost, Inaccessible),
            (Reason::PathUnreadable, Inaccessible),
            (Reason::FilesystemFull, Degraded),
            (Reason::FilesystemCorrupt, DataLoss),
        ];
        assert_eq!(want.len(), Reason::ALL.len());
        for (r, st) in want {
            assert_eq!(r.status(), st, "{}", r.as_str());
            assert!(r.as_str().chars().next().is_some_and(|c| c.is_ascii_uppercase()) && !r.as_str().contains('_'), "CamelCase");
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(json, format!("\"{}\"", r.as_str()), "the JSON name is the CSI name");
        }
    }

    #[test]
    fn the_v13_entries_carry_the_same_findings_as_the_v12_condition() {
        let r = rec();
        let healthy = condition(&r, Some(&drive(Health::Good)), None, &[]);
        assert!(healthy.entries.is_empty(), "a healthy volume has no entry");
        let releasing = DriveUse { drive_id: "d1".into(), state: DriveUseState::Releasing, reason: "r".into(), requested: true, evacuate: None };
        // (drive, usage, findings, failed, lost, the reasons expected in order)
        type Case = (Option<Drive>, Option<DriveUse>, Vec<Finding>, bool, bool, Vec<Reason>);
        let table: Vec<Case> = vec![
            (None, None, vec![], false, false, vec![Reason::DriveMissing]),
            (Some(drive(Health::Bad)), None, vec![], false, false, vec![Reason::DriveFailed]),
            (Some(drive(Health::Suspect)), None, vec![], false, false, vec![Reason::DriveSuspect]),
            (Some(drive(Health::Good)), Some(releasing.clone()), vec![], false, false, vec![Reason::DriveReleasing]),
            (Some(drive(Health::Good)), None, vec![Finding::StagingNotMounted { path: "/s".into() }], false, false, vec![Reason::MountLost]),
            (Some(drive(Health::Good)), None, vec![Finding::PathReplaced { path: "/s".into(), reason: "r".into() }], false, false, vec![Reason::MountLost]),
            (Some(drive(Health::Good)), None, vec![Finding::Corrupt { detail: "bad inode".into() }], false, false, vec![Reason::FilesystemCorrupt]),
            (Some(drive(Health::Good)), None, vec![Finding::OutOfSpace { percent: 95, threshold: 90 }], false, false, vec![Reason::FilesystemFull]),
            (Some(drive(Health::Good)), None, vec![Finding::Unreadable { path: "/s".into(), error: "EIO".into() }], false, false, vec![Reason::PathUnreadable]),
            (Some(drive(Health::Good)), None, vec![], true, false, vec![Reason::VolumeFailed]),
            (Some(drive(Health::Good)), None, vec![], false, true, vec![Reason::PartitionLost]),
            (
                None,
                Some(releasing),
                vec![Finding::TargetNotMounted { path: "/t1".into() }, Finding::TargetNotMounted { path: "/t2".into() }],
                true,
                false,
                vec![Reason::VolumeFailed, Reason::DriveMissing, Reason::DriveReleasing, Reason::MountLost],
            ),
        ];
        for (d, u, f, failed, lost, want) in table {
            let mut r = rec();
            r.failed = failed;
            r.lost = lost;
            let c = condition(&r, d.as_ref(), u.as_ref(), &f);
            let got: Vec<Reason> = c.entries.iter().map(|e| e.reason).collect();
            assert_eq!(got, want, "{}", c.message);
            assert!(c.abnormal);
            for e in &c.entries {
                assert_eq!(e.status, e.reason.status());
                for part in e.message.split("; ") {
                    assert!(c.message.contains(part), "entry message {part:?} is in the condition {:?}", c.message);
                }
            }
            let joined: Vec<&str> = c.entries.iter().map(|e| e.message.as_str()).collect();
            assert_eq!(joined.join("; ").len(), c.message.len(), "every finding is in exactly one entry");
        }
        let two = condition(&r, Some(&drive(Health::Good)), None, &[
            Finding::TargetNotMounted { path: "/t1".into() },
            Finding::TargetNotMounted { path: "/t2".into() },
        ]);
        assert_eq!(two.entries.len(), 1, "one entry per (status, reason)");
        assert!(two.entries[0].message.contains("/t1") && two.entries[0].message.contains("/t2"));
    }

    #[test]
    fn storage_health_reports_missing_failing_and_suspect_drives_once_per_reason() {
        let good = drive(Health::Good);
        let unknown = drive(Health::Unknown);
        assert!(storage_health(&[&good, &unknown], &[]).is_empty(), "healthy and SMART-less drives are all well");
        let mut bad2 = drive(Health::Bad);
        bad2.id = "d2".into();
        let bad = drive(Health::Bad);
        let suspect = drive(Health::Suspect);
        let got = storage_health(&[&good, &bad, &suspect, &bad2], &[("gone".into(), 2), ("gone2".into(), 1)]);
        let kinds: Vec<(StorageStatus, Reason)> = got.iter().map(|e| (e.status, e.reason)).collect();
        assert_eq!(kinds, vec![
            (StorageStatus::StorageUnreachable, Reason::DriveMissing),
            (StorageStatus::StorageDegraded, Reason::DriveFailed),
            (StorageStatus::StorageDegraded, Reason::DriveSuspect),
        ]);
        assert!(got[0].message.contains("drive gone holding 2 volumes") && got[0].message.contains("drive gone2 holding 1 volume "), "{}", got[0].message);
        assert!(got[1].message.contains("d1") && got[1].message.contains("d2") && got[1].message.contains("12 reallocated sectors"), "{}", got[1].message);
    }

}
