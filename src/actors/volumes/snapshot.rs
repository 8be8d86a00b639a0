//! Snapshots as the volume manager keeps them: a snapshot is a record of the book like a
//! volume's (its extent reserved, stored, rebuilt from its drive, freed and cleaned like
//! one), marked by [`VolumeRecord::snapshot`], and never shown, staged, published,
//! attached or expanded as a volume. This file holds what callers see of one
//! ([`SnapshotRecord`]) and the parameters a snapshot class may give.
//!
//! Rules:
//! - a snapshot's id is the UUID v5 of its CSI name in its own namespace
//!   ([`crate::disk::gpt::snapshot_partition_guid`]): the same name always finds the
//!   same snapshot, and no volume id is ever a snapshot id;
//! - its partition holds the source's data (a filesystem's used blocks, a block
//!   volume's every byte) and, after it, the note that makes it whole
//!   ([`crate::disk::snapshot_note`]); a snapshot is `Creating` until that note is on
//!   the disk, and a restart rolls a `Creating` one back, so a half snapshot is never
//!   served;
//! - a snapshot of a volume in use (mounted read-write) is taken only under a freeze
//!   the class asks for (`drivelet.io/freeze: "true"`), never of a block volume in use,
//!   otherwise refused (FAILED_PRECONDITION) saying how to get one;
//! - it goes on any open managed drive of the node with room, a drive other than its
//!   source's first (so it outlives the loss of that drive), and counts in capacity.

use std::collections::BTreeMap;

use super::model::{VolumeRecord, VolumeState};
use super::error::VolumeError;

/// The snapshot class parameter that asks for a freeze of a volume in use.
pub const FREEZE_PARAM: &str = "drivelet.io/freeze";

/// A snapshot as callers see it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SnapshotRecord {
    /// CSI snapshot id.
    pub id: String,
    /// CSI name.
    pub name: String,
    /// The volume it was taken of.
    pub source_volume_id: String,
    /// Bytes of data: the smallest volume it restores into.
    pub restore_size: u64,
    /// Bytes it takes on its drive.
    pub size: u64,
    /// When it was taken, nanoseconds since the epoch.
    pub created_unix_nanos: i64,
    /// Where it is.
    pub state: SnapshotState,
    /// A block volume's bytes (else a filesystem).
    pub block: bool,
    /// The filesystem it holds (empty for block, or a source never formatted).
    pub fs_type: String,
    /// How long the source's filesystem was frozen for the copy, when it was.
    pub freeze_millis: Option<u64>,
    /// The drive it is on.
    pub drive_id: String,
    /// Why it cannot be restored from now, if it cannot (drive absent or failing,
    /// partition lost).
    pub unusable: Option<String>,
}

/// Where a snapshot is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotState {
    /// Being taken.
    Creating,
    /// Taken, whole: ready to use.
    Ready,
    /// Being deleted.
    Deleting,
}

impl SnapshotState {
    /// Lower-case name for output.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotState::Creating => "creating",
            SnapshotState::Ready => "ready",
            SnapshotState::Deleting => "deleting",
        }
    }
}

impl SnapshotRecord {
    /// Whether it can be restored from (CSI `ready_to_use`).
    pub fn is_ready(&self) -> bool {
        self.state == SnapshotState::Ready
    }

    /// What callers see of a snapshot record (`None` for a volume's); `unusable` is why
    /// it cannot be restored from now.
    pub fn of(rec: &VolumeRecord, unusable: Option<String>) -> Option<SnapshotRecord> {
        let s = rec.snapshot.as_ref()?;
        Some(SnapshotRecord {
            id: rec.id.clone(),
            name: rec.name.clone(),
            source_volume_id: s.source_volume_id.clone(),
            restore_size: s.restore_size,
            size: rec.size,
            created_unix_nanos: s.created_unix_nanos,
            state: match rec.state {
                VolumeState::Creating => SnapshotState::Creating,
                VolumeState::Deleting => SnapshotState::Deleting,
                _ => SnapshotState::Ready,
            },
            block: rec.block,
            fs_type: if rec.formatted { rec.fs_type.clone() } else { String::new() },
            freeze_millis: s.freeze_millis,
            drive_id: rec.drive_id.clone(),
            unusable,
        })
    }
}

/// Whether a snapshot class's parameters ask for a freeze; an error naming any key or
/// value drivelet does not know.
pub fn wants_freeze(parameters: &BTreeMap<String, String>) -> Result<bool, VolumeError> {
    let mut freeze = false;
    for (k, v) in parameters {
        match (k.as_str(), v.as_str()) {
            (FREEZE_PARAM, "true") => freeze = true,
            (FREEZE_PARAM, "false") => freeze = false,
            (FREEZE_PARAM, other) => {
                return Err(VolumeError::InvalidArgument { reason: format!("parameter {FREEZE_PARAM} is {other:?}; it takes \"true\" or \"false\"") })
            }
            (other, _) => {
                return Err(VolumeError::InvalidArgument {
                    reason: format!("unknown snapshot parameter {other:?}; drivelet takes {FREEZE_PARAM} (\"true\" or \"false\")"),
                })
            }
        }
    }
    Ok(freeze)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_freeze_parameter_is_taken_with_true_or_false() {
        let p = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>();
        assert_eq!(wants_freeze(&p(&[])).ok(), Some(false));
        assert_eq!(wants_freeze(&p(&[(FREEZE_PARAM, "true")])).ok(), Some(true));
        assert_eq!(wants_freeze(&p(&[(FREEZE_PARAM, "false")])).ok(), Some(false));
        let e = wants_freeze(&p(&[(FREEZE_PARAM, "yes")])).unwrap_err().to_string();
        assert!(e.contains("\"yes\"") && e.contains("\"true\" or \"false\""), "{e}");
        let e = wants_freeze(&p(&[("color", "blue")])).unwrap_err().to_string();
        assert!(e.contains("\"color\"") && e.contains(FREEZE_PARAM), "{e}");
    }
}
