//! The errors of volume operations: what went wrong, in plain words naming the volume.
//!
//! Rules: every variant is one domain fact and carries the ids it is about (the volume,
//! its drive, the paths); there is no catch-all "failed precondition with a reason".
//! `grpc::status` maps each variant to one CSI code (the only place that builds a
//! `tonic::Status`), and the attach queue decides retry or wait from the variant
//! (`k8s::attach::kind_of`), never from the words. A refusal of the volume's state says
//! "volume ID" and then [`VolumeError::why`], the words `attachError` repeats.

use std::path::PathBuf;

use super::model::{Refusal, VolumeRecord};
use crate::disk::DiskError;
use crate::store::StoreError;
use crate::words::DriveUseState;

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
    /// A volume in use cannot grow in place, and only a move (to another drive, or
    /// elsewhere on its own) could
    /// grow it: it grows once no pod uses it (the resizer asks again).
    #[error("volume {volume_id} cannot grow to {} ({size} bytes) while it is in use ({why}): the space after it on its drive is taken, and it grows by moving to a bigger free extent on drive {drive_id}, which needs it unused; it grows at its next stage, once no pod uses it (unstaged and detached)", crate::config::human_bytes(*size))]
    GrowsWhenUnused {
        /// The volume.
        volume_id: String,
        /// The size asked, bytes.
        size: u64,
        /// The drive a move would take it to now.
        drive_id: String,
        /// Where it is in use, in words.
        why: String,
    },
    /// NodePublishVolume of a volume that is not staged (the state machine's refusal).
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    PublishBeforeStage {
        /// The volume.
        volume_id: String,
    },
    /// NodeUnstageVolume or DeleteVolume while targets are published.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    StillPublished {
        /// The volume.
        volume_id: String,
        /// Where it is published.
        targets: Vec<PathBuf>,
    },
    /// DeleteVolume while the volume is staged.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    StillStaged {
        /// The volume.
        volume_id: String,
    },
    /// CreateVolume of a name whose volume is being deleted.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    DeleteUnfinished {
        /// The volume.
        volume_id: String,
    },
    /// DeleteVolume while the volume's partition is mounted somewhere.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    PartitionMounted {
        /// The volume.
        volume_id: String,
        /// Its partition's device node.
        device: PathBuf,
    },
    /// The drive a volume was being created on went away before the partition was made.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    DriveGoneDuringCreate {
        /// The volume.
        volume_id: String,
        /// Its drive.
        drive_id: String,
    },
    /// Attaching a volume whose drive is not on this node (nothing to serve it from).
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    DriveMissing {
        /// The volume.
        volume_id: String,
        /// Its drive.
        drive_id: String,
    },
    /// Attaching a volume whose drive's health is BAD.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    DriveFailing {
        /// The volume.
        volume_id: String,
        /// Its drive.
        drive_id: String,
        /// The health verdict's reason.
        health: String,
    },
    /// Attaching a volume whose drive is releasing or released.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    DriveReleasing {
        /// The volume.
        volume_id: String,
        /// Its drive.
        drive_id: String,
        /// Releasing or released.
        state: DriveUseState,
        /// Why the drive is being released.
        reason: String,
    },
    /// A call on a volume failed by a forced release of its drive.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    FailedByRelease {
        /// The volume.
        volume_id: String,
        /// The drive that was released.
        drive_id: String,
    },
    /// Staging or attaching for the other access type (block or filesystem) than the
    /// volume was created for.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    WrongAccessType {
        /// The volume.
        volume_id: String,
        /// It was created for block access.
        block: bool,
        /// The call: `staged` or `published`.
        call: &'static str,
    },
    /// Staging or attaching with another filesystem than the volume's record names.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    WrongFilesystem {
        /// The volume.
        volume_id: String,
        /// Its filesystem.
        holds: String,
        /// The filesystem asked for.
        asked: String,
    },
    /// An encrypted volume whose key cannot be had: no key-encryption key given, one
    /// that does not open it, its key header erased or unreadable.
    #[error("volume {volume_id} is encrypted and cannot be opened: {reason}")]
    EncryptionKey {
        /// The volume.
        volume_id: String,
        /// Why, in words that never hold a key.
        reason: String,
    },
    /// Staging with another filesystem than the one found on the partition.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    FilesystemFound {
        /// The volume.
        volume_id: String,
        /// The filesystem on the partition.
        found: String,
        /// The filesystem asked for.
        asked: String,
    },
    /// NodePublishVolume from another staging path than the volume's.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    StagedElsewhere {
        /// The volume.
        volume_id: String,
        /// Where it is staged.
        staged_at: PathBuf,
        /// The staging path the call names.
        asked: PathBuf,
    },
    /// NodePublishVolume for the other access type than the volume was staged for.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    StagedForOtherAccess {
        /// The volume.
        volume_id: String,
    },
    /// A block target with the other read-only setting than the volume's other targets.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    BlockReadOnlyMixed {
        /// The volume.
        volume_id: String,
    },
    /// A second target of a SINGLE_NODE_SINGLE_WRITER volume.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    SingleWriterInUse {
        /// The volume.
        volume_id: String,
    },
    /// An adopted volume's directory cannot be read.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    AdoptedUnreadable {
        /// The volume.
        volume_id: String,
        /// The adopted directory.
        path: PathBuf,
        /// The OS error, in words.
        reason: String,
    },
    /// An adopted volume's directory is no longer a directory.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    AdoptedNotDirectory {
        /// The volume.
        volume_id: String,
        /// The adopted path.
        path: PathBuf,
    },
    /// Growing an adopted volume: its size is its filesystem's.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    AdoptedFixedSize {
        /// The volume.
        volume_id: String,
        /// The adopted directory.
        path: PathBuf,
    },
    /// NodeExpandVolume of an adopted volume: its filesystem is not drivelet's.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    AdoptedFilesystem {
        /// The volume.
        volume_id: String,
    },
    /// NodeExpandVolume before ControllerExpandVolume grew the kernel's partition.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    ExpandUnfinished {
        /// The volume.
        volume_id: String,
        /// The partition's size in the kernel.
        kernel_size: u64,
        /// The volume's size.
        size: u64,
    },
    /// Growing a mounted ext4 without CAP_SYS_RESOURCE.
    #[error("volume {volume_id} {}", self.why().unwrap_or_default())]
    CannotGrowExt4 {
        /// The volume.
        volume_id: String,
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
    /// The GPT writer refused the drive: it carries data drivelet did not write (a fact
    /// about the drive, not a fault of drivelet's; CreateVolume goes on to another drive).
    #[error("volume {volume_id}: cannot {op}: {}: not a drivelet drive, refusing to write to it: {found}", device.display())]
    ForeignData {
        /// The volume.
        volume_id: String,
        /// The step.
        op: &'static str,
        /// The drive's device.
        device: PathBuf,
        /// What the writer found on it, in words.
        found: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(StoreError),
    /// A disk step ended in a panic (a bug; the record is reloaded at restart).
    #[error("volume {volume_id}: the operation failed unexpectedly: {reason}")]
    Panicked {
        /// The volume.
        volume_id: String,
        /// The panic, in words.
        reason: String,
    },
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
    /// The source's partition does not hold the filesystem its record names.
    #[error(
        "volume {volume_id} cannot be cloned from volume {source_id}: it should hold {expected} but holds {}",
        found.as_deref().unwrap_or("nothing")
    )]
    SourceChanged {
        /// The clone.
        volume_id: String,
        /// The source.
        source_id: String,
        /// The filesystem the source's record names.
        expected: String,
        /// What its partition holds.
        found: Option<String>,
    },
    /// The source is in use, and its clone's class says not to copy it now (or the
    /// copy would freeze its writers too long): a copy taken now would not be
    /// consistent, or not within the limit.
    #[error("{}", in_use_words(source_id, path, why))]
    SourceInUse {
        /// The source.
        source_id: String,
        /// Where it is mounted read-write.
        path: PathBuf,
        /// Why it is not copied now.
        why: InUse,
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
    /// A snapshot of a volume in use was asked without a freeze, or of a block volume in
    /// use (which cannot be frozen): the copy would be torn.
    #[error(
        "cannot snapshot volume {volume_id} now: it is {} at {}, and a copy of it taken while it is written would be torn; {}",
        if *block { "a block device in use" } else { "mounted read-write" },
        path.display(),
        if *block {
            "drivelet cannot freeze a block volume: stop the pods using it (for example scale the workload to 0) and snapshot again"
        } else {
            "use a VolumeSnapshotClass with the parameter drivelet.io/freeze: \"true\" to freeze its filesystem for the copy (writers pause for the copy's length), or stop the pods using it"
        }
    )]
    SnapshotSourceInUse {
        /// The source volume.
        volume_id: String,
        /// Where it is in use.
        path: PathBuf,
        /// A block volume (cannot be frozen).
        block: bool,
    },
    /// A snapshot of the name exists, taken of another volume.
    #[error("snapshot {name} already exists, taken of volume {existing_source}, not of volume {asked_source}")]
    SnapshotNameTaken {
        /// The CSI name.
        name: String,
        /// The volume it was taken of.
        existing_source: String,
        /// The volume asked for now.
        asked_source: String,
    },
    /// No snapshot with that id on this node.
    #[error("snapshot {snapshot_id} does not exist on this node; a volume is restored from a snapshot on the node that holds it")]
    SnapshotNotFound {
        /// The id asked for.
        snapshot_id: String,
    },
    /// The snapshot exists but cannot be read now.
    #[error("snapshot {snapshot_id} cannot be restored from: {reason}")]
    SnapshotUnusable {
        /// The snapshot.
        snapshot_id: String,
        /// Why, in plain words.
        reason: String,
    },
    /// A copy under a freeze took longer than the freeze limit: the filesystem was
    /// thawed at the limit and the copy discarded.
    #[error(
        "cannot {} volume {volume_id}: the copy needed longer than the freeze limit of {}, so its filesystem was thawed and the copy discarded; {}",
        if *clone { "clone" } else { "snapshot" },
        format!("{:.1} s", *limit_millis as f64 / 1000.0),
        if *clone {
            "raise drivelet.io/clone-freeze-limit on the StorageClass (or the node's volumes.freeze_limit), or stop the pods using it and the clone is made without a freeze"
        } else {
            "raise volumes.freeze_limit or stop the pods using it"
        }
    )]
    FreezeExpired {
        /// The source volume.
        volume_id: String,
        /// The limit, milliseconds.
        limit_millis: u64,
        /// A clone's copy (else a snapshot's).
        clone: bool,
    },
    /// A new attachment of a volume whose drive is being evacuated: it moves first.
    #[error(
        "volume {volume_id} lives on drive {drive_id}, which is being evacuated: the volume moves to another drive of this node once no pod uses it (seconds per GiB), and is attached from there; retrying"
    )]
    Evacuating {
        /// The volume.
        volume_id: String,
        /// Its drive.
        drive_id: String,
    },
    /// Blocks of a volume on an evacuated drive could not be read: it is not moved
    /// (unless the evacuation is forced) and stays where it is.
    #[error(
        "volume {volume_id} is not moved off drive {drive_id}: {} of it cannot be read ({}); it stays on that drive; evacuate with force to move it with zeros in those ranges, or restore it from a backup",
        crate::config::human_bytes(ranges.iter().map(|r| r.1).sum::<u64>()),
        crate::disk::mover::ranges_words(ranges)
    )]
    Unreadable {
        /// The volume.
        volume_id: String,
        /// The drive it is on.
        drive_id: String,
        /// Byte ranges `(start, length)` of the volume that could not be read.
        ranges: Vec<(u64, u64)>,
    },
    /// An evacuation cannot be done on this drive.
    #[error("drive {drive_id} cannot be evacuated: {reason}")]
    CannotEvacuate {
        /// The drive.
        drive_id: String,
        /// Why, in plain words, and what would work.
        reason: String,
    },
}

impl VolumeError {
    /// Why the volume is not in a state that allows the call, in the words after its
    /// name (`attachError` shows them); `None` for errors of another kind.
    pub fn why(&self) -> Option<String> {
        Some(match self {
            VolumeError::DriveAbsent { drive_id, .. } => format!("lives on drive {drive_id} which is absent from this node"),
            VolumeError::Lost { part_guid, drive_id, .. } => format!(
                "its partition {part_guid} is missing from drive {drive_id}: the data is gone (the drive was wiped or replaced); delete the volume and restore from backup"
            ),
            VolumeError::StillAttached { node, .. } => format!("is still attached to node {node}; call ControllerUnpublishVolume first"),
            VolumeError::AttachedElsewhere { node, .. } => format!("is already attached to node {node}; a local volume serves one node"),
            VolumeError::NotStaged { .. } => "is not staged; its filesystem grows when it is staged and published".into(),
            VolumeError::AlreadyStaged { path, .. } => format!("is already staged at {}; unstage it there first", path.display()),
            VolumeError::PublishBeforeStage { .. } => Refusal::NotStaged.to_string(),
            VolumeError::StillPublished { targets, .. } if targets.is_empty() => Refusal::StillPublished.to_string(),
            VolumeError::StillPublished { targets, .. } => {
                let at: Vec<String> = targets.iter().map(|t| t.display().to_string()).collect();
                format!("is still published (at {}); unpublish every target first", at.join(", "))
            }
            VolumeError::StillStaged { .. } => Refusal::StillStaged.to_string(),
            VolumeError::DeleteUnfinished { .. } => "is being deleted; retry CreateVolume once DeleteVolume finished".into(),
            VolumeError::PartitionMounted { device, .. } => {
                format!("its partition {} is still mounted; unpublish and unstage it first", device.display())
            }
            VolumeError::DriveGoneDuringCreate { drive_id, .. } => format!("was being created on drive {drive_id} which is absent now"),
            VolumeError::DriveMissing { drive_id, .. } => format!("lives on drive {drive_id} which is missing from this node; put the drive back"),
            VolumeError::DriveFailing { drive_id, health, .. } => format!(
                "lives on drive {drive_id} which is failing ({health}); it takes no new attachments: move the data to another volume"
            ),
            VolumeError::DriveReleasing { drive_id, state, reason, .. } => format!(
                "lives on drive {drive_id} which is {} ({reason}); it takes no new attachments: move the data to another volume",
                state.as_str()
            ),
            VolumeError::FailedByRelease { drive_id, .. } => {
                format!("was failed by a forced release of drive {drive_id}; delete it and restore from backup")
            }
            VolumeError::WrongAccessType { block, call, .. } => {
                let (was, asked) = if *block { ("block", "filesystem") } else { ("filesystem", "block") };
                format!("was created for {was} access; it cannot be {call} for {asked} access")
            }
            VolumeError::WrongFilesystem { holds, asked, .. } => format!("holds {holds}, not {asked}"),
            VolumeError::FilesystemFound { found, asked, .. } => format!("holds a {found} filesystem, not {asked}"),
            VolumeError::StagedElsewhere { staged_at, asked, .. } => {
                format!("is staged at {}, not at {}", staged_at.display(), asked.display())
            }
            VolumeError::StagedForOtherAccess { .. } => "was staged for a different access type (block or filesystem)".into(),
            VolumeError::BlockReadOnlyMixed { .. } => "is published as a block device with the other read-only setting elsewhere; \
                                                       a block volume is read-only or read-write for all its targets"
                .into(),
            VolumeError::SingleWriterInUse { .. } => {
                "has access mode SINGLE_NODE_SINGLE_WRITER and is already published at another target".into()
            }
            VolumeError::AdoptedUnreadable { path, reason, .. } => {
                format!("is adopted from {}, which cannot be read: {reason}; put the data back", path.display())
            }
            VolumeError::AdoptedNotDirectory { path, .. } => format!("is adopted from {}, which is no longer a directory", path.display()),
            VolumeError::AdoptedFixedSize { path, .. } => {
                format!("is adopted from {}: its size is its filesystem's, which drivelet does not manage", path.display())
            }
            VolumeError::AdoptedFilesystem { .. } => "is adopted: its filesystem is not drivelet's to grow".into(),
            VolumeError::ExpandUnfinished { kernel_size, size, .. } => format!(
                "has a {kernel_size} byte partition in the kernel but should have {size}: ControllerExpandVolume has not finished; retry it first"
            ),
            VolumeError::CannotGrowExt4 { .. } => "cannot grow its mounted ext4 filesystem: the kernel grows ext4 online only for a process \
                                                   with CAP_SYS_RESOURCE, which drivelet lacks here; it grows offline when next staged \
                                                   (stop the pods using it), or run drivelet with that capability"
                .into(),
            _ => return None,
        })
    }

    /// What the GPT writer found on the drive when it refused to write to it (data
    /// drivelet did not write); `None` for every other error.
    pub fn refused_drive(&self) -> Option<&str> {
        match self {
            VolumeError::ForeignData { found, .. } => Some(found),
            _ => None,
        }
    }

    /// A state-machine refusal for a volume.
    pub fn refused(rec: &VolumeRecord, r: Refusal) -> VolumeError {
        let volume_id = rec.id.clone();
        match r {
            Refusal::BeingCreated | Refusal::BeingDeleted => VolumeError::Busy { volume_id },
            Refusal::NotStaged => VolumeError::PublishBeforeStage { volume_id },
            Refusal::StillPublished => VolumeError::StillPublished { volume_id, targets: rec.targets.keys().cloned().collect() },
            Refusal::StillStaged => VolumeError::StillStaged { volume_id },
        }
    }
}

/// Why a clone of a volume in use is not made now ([`VolumeError::SourceInUse`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InUse {
    /// Its StorageClass says `drivelet.io/clone-in-use: refuse`.
    Refused,
    /// A block volume a pod writes to: nothing to freeze, and the class does not
    /// accept a crash-inconsistent copy.
    Block,
    /// An encrypted volume mounted read-write: copied file by file through a mount of
    /// its own, which a mounted filesystem refuses.
    Encrypted,
    /// Copying what its filesystem uses would freeze its writers longer than allowed.
    TooLong {
        /// Bytes its filesystem uses.
        used: u64,
        /// The copy's estimated length, milliseconds.
        estimate_millis: u64,
        /// The freeze limit, milliseconds.
        limit_millis: u64,
    },
}

/// What to do about a source in use, said at the end of every refusal.
const ONCE_IDLE: &str = "the clone is made once no pod writes to it (stop or scale down the pods using it; the provisioner retries)";

/// The words of [`VolumeError::SourceInUse`].
fn in_use_words(source_id: &str, path: &std::path::Path, why: &InUse) -> String {
    let at = path.display();
    match why {
        InUse::Refused => format!(
            "cannot clone volume {source_id} now: it is mounted read-write at {at}, and its StorageClass says \
             drivelet.io/clone-in-use: refuse; {ONCE_IDLE} (with drivelet.io/clone-in-use: freeze its filesystem would be frozen for the copy instead)"
        ),
        InUse::Block => format!(
            "cannot clone block volume {source_id} now: a pod writes to it at {at}, and a block volume has no filesystem \
             drivelet could freeze, so a copy taken now would not be consistent; {ONCE_IDLE}; or, if the application accepts an \
             inconsistent copy, set drivelet.io/clone-in-use-block: crash-inconsistent on the StorageClass"
        ),
        InUse::Encrypted => format!(
            "cannot clone encrypted volume {source_id} now: it is mounted read-write at {at}, and an encrypted volume is copied \
             file by file through a mount of its own, which a mounted filesystem does not allow; {ONCE_IDLE}"
        ),
        InUse::TooLong { used, estimate_millis, limit_millis } => format!(
            "cannot clone volume {source_id} now: it is mounted read-write at {at}, and copying the {} its filesystem uses \
             would freeze its writers for about {}, longer than the {} allowed (drivelet.io/clone-freeze-limit on the \
             StorageClass, else the node's volumes.freeze_limit); {ONCE_IDLE}, or raise the limit",
            crate::config::human_bytes(*used),
            seconds(*estimate_millis),
            seconds(*limit_millis)
        ),
    }
}

/// A length in milliseconds as people read it: `5 ms`, `1.4 s`, `14 s`.
fn seconds(millis: u64) -> String {
    if millis < 1000 {
        format!("{millis} ms")
    } else if millis < 10_000 {
        format!("{:.1} s", millis as f64 / 1000.0)
    } else {
        format!("{} s", (millis + 500) / 1000)
    }
}
