//! The errors of volume operations: what went wrong, in plain words naming the volume.
//!
//! Rules: every variant names the object it is about; `grpc::status` maps each to one
//! CSI code (the only place that builds a `tonic::Status`).

use std::path::PathBuf;

use super::model::Refusal;
use crate::disk::DiskError;
use crate::store::StoreError;

/// Errors of volume operations; each maps to one CSI code in `grpc::status`.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// No volume with that id.
    #[error("volume {volume_id} does not exist")]
    NotFound {
        /// The id asked for.
        volume_id: String,
    },
    /// The request is malformed or cannot apply to this volume.
    #[error("{reason}")]
    InvalidArgument {
        /// What is wrong.
        reason: String,
    },
    /// A volume with this name or at this path exists with other properties.
    #[error("volume {volume} {reason}")]
    AlreadyExists {
        /// Volume name or id.
        volume: String,
        /// What differs.
        reason: String,
    },
    /// No drive has room (or none is eligible) now.
    #[error("cannot place the volume: {reason}")]
    ResourceExhausted {
        /// Why.
        reason: String,
    },
    /// The capacity range can never be met here.
    #[error("capacity range cannot be met: {reason}")]
    OutOfRange {
        /// Why.
        reason: String,
    },
    /// The volume is not in a state that allows the call, for the refusals that have
    /// no variant of their own yet (the named ones follow [`VolumeError::Busy`]).
    #[error("volume {volume_id} {reason}")]
    FailedPrecondition {
        /// The volume.
        volume_id: String,
        /// Why, and what to do.
        reason: String,
    },
    /// The volume is neither staged nor published at the path a node call names.
    #[error("volume {volume_id} is not staged or published at {}", path.display())]
    PathNotFound {
        /// The volume.
        volume_id: String,
        /// The path asked about.
        path: PathBuf,
    },
    /// Another operation on the volume is in flight.
    #[error("another operation on volume {volume_id} is in progress; retry")]
    Busy {
        /// The volume.
        volume_id: String,
    },
    /// The volume's drive is not on this node now.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    DriveAbsent {
        /// The volume.
        volume_id: String,
        /// Its drive.
        drive_id: String,
    },
    /// The volume's partition is gone from its present drive: its data is gone.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    Lost {
        /// The volume.
        volume_id: String,
        /// The partition that is missing.
        part_guid: uuid::Uuid,
        /// The drive it was on.
        drive_id: String,
    },
    /// The volume is still attached to a node (DeleteVolume).
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    StillAttached {
        /// The volume.
        volume_id: String,
        /// The node.
        node: String,
    },
    /// The volume is attached to another node (a local volume serves one).
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    AttachedElsewhere {
        /// The volume.
        volume_id: String,
        /// The node it is attached to.
        node: String,
    },
    /// NodeExpandVolume of a volume that is not staged.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    NotStaged {
        /// The volume.
        volume_id: String,
    },
    /// NodeStageVolume at another path than the one the volume is staged at.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    AlreadyStaged {
        /// The volume.
        volume_id: String,
        /// Where it is staged.
        path: PathBuf,
    },
    /// Start-up reconciliation has not finished.
    #[error("the volume manager is still starting; retry shortly")]
    NotReady,
    /// A disk step failed.
    #[error("volume {volume_id}: cannot {op}: {source}")]
    Disk {
        /// The volume.
        volume_id: String,
        /// The step.
        op: &'static str,
        /// The OS error.
        source: DiskError,
    },
    /// The store failed.
    #[error(transparent)]
    Store(StoreError),
    /// CreateVolume names a source volume this node does not hold.
    #[error("source volume {source_id} does not exist on this node; a clone is made on the node that holds its source")]
    SourceNotFound {
        /// The source asked for.
        source_id: String,
    },
    /// A clone of the source cannot be made as asked (block or filesystem, another
    /// filesystem, an adopted directory).
    #[error("cannot clone volume {source_id}: {reason}")]
    SourceIncompatible {
        /// The source.
        source_id: String,
        /// Why, and what would work.
        reason: String,
    },
    /// The source is mounted read-write: a copy taken now would not be consistent.
    #[error(
        "cannot clone volume {source_id} now: it is mounted read-write at {}, and a copy of a filesystem being written is not consistent; clone it once nothing writes to it (unpublished and unstaged, or staged read-only)",
        path.display()
    )]
    SourceInUse {
        /// The source.
        source_id: String,
        /// Where it is mounted read-write.
        path: PathBuf,
    },
    /// The capacity range leaves no room for the source's data.
    #[error(
        "a clone of volume {source_id} needs at least {} (the size of the source), but limit_bytes allows {}",
        crate::config::human_bytes(*source_size),
        crate::config::human_bytes(*limit)
    )]
    CloneTooSmall {
        /// The source.
        source_id: String,
        /// Its size, bytes.
        source_size: u64,
        /// The limit asked for, bytes.
        limit: u64,
    },
}

impl VolumeError {
    /// Why the volume is not in a state that allows the call, in the words after its
    /// name (`attachError` shows them); `None` for errors of another kind.
    pub fn why(&self) -> Option<String> {
        Some(match self {
            VolumeError::FailedPrecondition { reason, .. } => reason.clone(),
            VolumeError::DriveAbsent { drive_id, .. } => format!("lives on drive {drive_id} which is absent from this node"),
            VolumeError::Lost { part_guid, drive_id, .. } => format!(
                "its partition {part_guid} is missing from drive {drive_id}: the data is gone (the drive was wiped or replaced); delete the volume and restore from backup"
            ),
            VolumeError::StillAttached { node, .. } => format!("is still attached to node {node}; call ControllerUnpublishVolume first"),
            VolumeError::AttachedElsewhere { node, .. } => format!("is already attached to node {node}; a local volume serves one node"),
            VolumeError::NotStaged { .. } => "is not staged; its filesystem grows when it is staged and published".into(),
            VolumeError::AlreadyStaged { path, .. } => format!("is already staged at {}; unstage it there first", path.display()),
            _ => return None,
        })
    }

    /// What the GPT writer found on the drive when it refused to write to it (data
    /// drivelet did not write); `None` for every other error.
    pub fn refused_drive(&self) -> Option<&str> {
        match self {
            VolumeError::Disk { source: DiskError::Foreign { found, .. }, .. } => Some(found),
            _ => None,
        }
    }

    /// A state-machine refusal for a volume.
    pub fn refused(volume_id: &str, r: Refusal) -> VolumeError {
        match r {
            Refusal::BeingCreated | Refusal::BeingDeleted => VolumeError::Busy { volume_id: volume_id.to_string() },
            r => VolumeError::FailedPrecondition { volume_id: volume_id.to_string(), reason: r.to_string() },
        }
    }
}
