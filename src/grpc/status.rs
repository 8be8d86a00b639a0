//! The one place where domain errors become `tonic::Status` codes (CSI spec tables),
//! and where the front's own words live.
//!
//! Rules: the message is the whole error chain in plain words and names the object;
//! client input is repeated in it only through [`echo`] (quoted, at most 64
//! characters); errors are logged once, here at the boundary, by the handler's
//! `instrument(err)`. A reason the front gives at more than one place (a missing field,
//! a field too long, a bad capacity range, an unsupported capability, a StorageClass
//! parameter it does not take) is a typed [`FrontError`] variant whose words are written
//! once, here; [`FrontError::InvalidArgument`] is left for the one-off reasons, worded
//! where they are found.

use tonic::{Code, Status};

use crate::actors::volumes::VolumeError;
use crate::words::on_node_deleted::ON_NODE_DELETED;

/// Errors the CSI front can return, each mapped to one gRPC code.
#[derive(Debug, thiserror::Error)]
pub enum FrontError {
    /// A one-off malformed request, in the words of the check that found it (a reason
    /// given at more than one place has a variant of its own below).
    #[error("{0}")]
    InvalidArgument(String),
    /// A required field is empty or absent.
    #[error("{field} is required")]
    Required {
        /// The field, as the request names it.
        field: &'static str,
    },
    /// A name, id or path longer than its limit.
    #[error("{field} is {len} bytes long; the limit is {limit}")]
    TooLong {
        /// The field, as the request names it.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The longest allowed.
        limit: usize,
    },
    /// A capacity range with a negative bound.
    #[error("capacity_range has required_bytes {required} and limit_bytes {limit}; neither may be negative (0: no bound)")]
    NegativeRange {
        /// `required_bytes` as given.
        required: i64,
        /// `limit_bytes` as given.
        limit: i64,
    },
    /// A capacity range whose limit is below what it requires.
    #[error("capacity_range limit_bytes {limit} is below required_bytes {required}")]
    LimitBelowRequired {
        /// `required_bytes` as given.
        required: i64,
        /// `limit_bytes` as given.
        limit: i64,
    },
    /// A well-formed capability drivelet cannot serve.
    #[error("unsupported volume capability: {reason}")]
    UnsupportedCapability {
        /// Why, naming the value asked for and what is accepted
        /// ([`super::params::unsupported_reason`]).
        reason: String,
    },
    /// A StorageClass parameter drivelet knows, with a value it does not take.
    #[error("parameter \"{key}\" is {}; it must be {allowed}", echo(value))]
    BadParameter {
        /// The parameter.
        key: &'static str,
        /// The value as given.
        value: String,
        /// The values it takes, in words.
        allowed: &'static str,
    },
    /// A StorageClass parameter drivelet does not know (a typo, most likely).
    #[error("unknown parameter {}; drivelet understands media, layout and {}", echo(key), ON_NODE_DELETED)]
    UnknownParameter {
        /// The key as given.
        key: String,
    },
    /// A list call's negative page size.
    #[error("max_entries is {max_entries}; it must be 0 (no limit) or more")]
    NegativeMaxEntries {
        /// `max_entries` as given.
        max_entries: i32,
    },
    /// NodePublishVolume without a staging path (STAGE_UNSTAGE_VOLUME is advertised).
    #[error("staging_target_path is required: stage the volume first (NodeStageVolume)")]
    StagingPathMissing,
    /// NodeExpandVolume asked for more than the partition holds.
    #[error("volume {volume_id} is {size} bytes, less than the {asked} asked for: grow it with ControllerExpandVolume first")]
    NotGrownYet {
        /// The volume.
        volume_id: String,
        /// Its size now.
        size: u64,
        /// The size asked for.
        asked: i64,
    },
    /// CreateVolume's requisite topologies leave out this node.
    #[error("none of the requisite topologies includes this node ({node}); drivelet creates volumes only on the node it runs on")]
    OtherTopology {
        /// This node.
        node: String,
    },
    /// A controller call names another node.
    #[error("node {node_id} is unknown to this driver instance: it serves only node {here}, where its drives are")]
    UnknownNode {
        /// The node asked for.
        node_id: String,
        /// This node.
        here: String,
    },
    /// A ListVolumes starting token that is not one of ours (or from before a restart).
    #[error("starting_token {} is not valid (malformed, or from before a restart); list again from the start", echo(token))]
    BadToken {
        /// The token as given.
        token: String,
    },
    /// An actor behind the front did not answer (it is restarting or stopped).
    #[error("{actor} is not answering ({reason}); retry shortly")]
    Unavailable {
        /// Which actor.
        actor: &'static str,
        /// The mailbox error.
        reason: String,
    },
}

impl FrontError {
    /// A mailbox error from `actor`.
    pub fn mailbox(actor: &'static str) -> impl FnOnce(actix::MailboxError) -> FrontError {
        move |e| FrontError::Unavailable { actor, reason: e.to_string() }
    }
}

/// Longest piece of client input an error message repeats.
const MAX_ECHO: usize = 64;

/// A piece of client input as an error message shows it: quoted and escaped, cut to
/// [`MAX_ECHO`] characters with the full length said, so that hostile input (a 1 MiB
/// parameter) never makes a reply too large to read or a log line of a megabyte.
pub(crate) fn echo(input: &str) -> String {
    if input.chars().count() <= MAX_ECHO {
        return format!("{input:?}");
    }
    let head: String = input.chars().take(MAX_ECHO).collect();
    format!("{head:?}... ({} bytes)", input.len())
}

impl From<VolumeError> for Status {
    fn from(e: VolumeError) -> Status {
        let code = match &e {
            VolumeError::NotFound { .. } | VolumeError::PathNotFound { .. } | VolumeError::SourceNotFound { .. } | VolumeError::SnapshotNotFound { .. } => Code::NotFound,
            VolumeError::InvalidArgument { .. } | VolumeError::SourceIncompatible { .. } => Code::InvalidArgument,
            VolumeError::AlreadyExists { .. } | VolumeError::SnapshotNameTaken { .. } => Code::AlreadyExists,
            VolumeError::ResourceExhausted { .. } => Code::ResourceExhausted,
            VolumeError::OutOfRange { .. } | VolumeError::CloneTooSmall { .. } => Code::OutOfRange,
            // The volume's state (or its drive's) does not allow the call.
            VolumeError::PublishBeforeStage { .. }
            | VolumeError::StillPublished { .. }
            | VolumeError::StillStaged { .. }
            | VolumeError::DeleteUnfinished { .. }
            | VolumeError::PartitionMounted { .. }
            | VolumeError::GrowsWhenUnused { .. }
            | VolumeError::DriveGoneDuringCreate { .. }
            | VolumeError::DriveAbsent { .. }
            | VolumeError::DriveMissing { .. }
            | VolumeError::DriveFailing { .. }
            | VolumeError::DriveReleasing { .. }
            | VolumeError::FailedByRelease { .. }
            | VolumeError::Lost { .. }
            | VolumeError::StillAttached { .. }
            | VolumeError::AttachedElsewhere { .. }
            | VolumeError::NotStaged { .. }
            | VolumeError::AlreadyStaged { .. }
            | VolumeError::WrongAccessType { .. }
            | VolumeError::WrongFilesystem { .. }
            | VolumeError::FilesystemFound { .. }
            | VolumeError::EncryptionKey { .. }
            | VolumeError::StagedElsewhere { .. }
            | VolumeError::StagedForOtherAccess { .. }
            | VolumeError::BlockReadOnlyMixed { .. }
            | VolumeError::SingleWriterInUse { .. }
            | VolumeError::AdoptedUnreadable { .. }
            | VolumeError::AdoptedNotDirectory { .. }
            | VolumeError::AdoptedFixedSize { .. }
            | VolumeError::AdoptedFilesystem { .. }
            | VolumeError::ExpandUnfinished { .. }
            | VolumeError::CannotGrowExt4 { .. }
            | VolumeError::SourceInUse { .. }
            | VolumeError::SnapshotSourceInUse { .. }
            | VolumeError::SnapshotUnusable { .. }
            | VolumeError::FreezeExpired { .. }
            | VolumeError::Unreadable { .. }
            | VolumeError::CannotEvacuate { .. }
            | VolumeError::SourceChanged { .. } => Code::FailedPrecondition,
            // The drive holds data drivelet did not write: a fact about the drive, not a
            // fault of drivelet's (CreateVolume goes on to another drive instead).
            VolumeError::ForeignData { .. } => Code::FailedPrecondition,
            VolumeError::Busy { .. } | VolumeError::Evacuating { .. } => Code::Aborted,
            VolumeError::NotReady => Code::Unavailable,
            VolumeError::Disk { .. } | VolumeError::Store(_) | VolumeError::Panicked { .. } => Code::Internal,
        };
        Status::new(code, e.to_string())
    }
}

impl From<FrontError> for Status {
    fn from(e: FrontError) -> Status {
        let code = match &e {
            FrontError::InvalidArgument(_)
            | FrontError::Required { .. }
            | FrontError::TooLong { .. }
            | FrontError::NegativeRange { .. }
            | FrontError::LimitBelowRequired { .. }
            | FrontError::UnsupportedCapability { .. }
            | FrontError::BadParameter { .. }
            | FrontError::UnknownParameter { .. }
            | FrontError::NegativeMaxEntries { .. } => Code::InvalidArgument,
            FrontError::StagingPathMissing => Code::FailedPrecondition,
            FrontError::NotGrownYet { .. } => Code::OutOfRange,
            FrontError::OtherTopology { .. } => Code::ResourceExhausted,
            FrontError::UnknownNode { .. } => Code::NotFound,
            FrontError::BadToken { .. } => Code::Aborted,
            FrontError::Unavailable { .. } => Code::Unavailable,
        };
        Status::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::volumes::error::InUse;

    #[test]
    fn each_error_maps_to_its_csi_code_with_a_plain_message() {
        let table: Vec<(FrontError, Code, &str)> = vec![
            (FrontError::InvalidArgument("parameter \"media\" must be one of".into()), Code::InvalidArgument, "media"),
            (
                FrontError::Unavailable { actor: "inventory", reason: "Mailbox has closed".into() },
                Code::Unavailable,
                "inventory is not answering",
            ),
            (FrontError::StagingPathMissing, Code::FailedPrecondition, "staging_target_path is required"),
            (FrontError::NotGrownYet { volume_id: "v1".into(), size: 5, asked: 9 }, Code::OutOfRange, "volume v1 is 5 bytes, less than the 9"),
            (FrontError::OtherTopology { node: "n1".into() }, Code::ResourceExhausted, "includes this node (n1)"),
            (FrontError::UnknownNode { node_id: "n2".into(), here: "n1".into() }, Code::NotFound, "node n2 is unknown"),
            (FrontError::BadToken { token: "x".repeat(100) }, Code::Aborted, "starting_token \"xxxx"),
        ];
        for (err, code, text) in table {
            let s: Status = err.into();
            assert_eq!(s.code(), code);
            assert!(s.message().contains(text), "{}", s.message());
        }
    }

    /// The typed reasons say exactly the words the checks said when each built its own
    /// string (tests, users and the cluster duties' Warning Events read them).
    #[test]
    fn typed_reasons_keep_their_words() {
        let table: Vec<(FrontError, &str)> = vec![
            (FrontError::Required { field: "volume_id" }, "volume_id is required"),
            (FrontError::TooLong { field: "name", len: 130, limit: 128 }, "name is 130 bytes long; the limit is 128"),
            (
                FrontError::NegativeRange { required: -1, limit: 0 },
                "capacity_range has required_bytes -1 and limit_bytes 0; neither may be negative (0: no bound)",
            ),
            (FrontError::LimitBelowRequired { required: 9, limit: 5 }, "capacity_range limit_bytes 5 is below required_bytes 9"),
            (FrontError::UnsupportedCapability { reason: "filesystem \"vfat\"".into() }, "unsupported volume capability: filesystem \"vfat\""),
            (
                FrontError::BadParameter { key: "layout", value: "stripe".into(), allowed: "partition or drive" },
                "parameter \"layout\" is \"stripe\"; it must be partition or drive",
            ),
            (
                FrontError::UnknownParameter { key: "meda".into() },
                "unknown parameter \"meda\"; drivelet understands media, layout and drivelet.io/on-node-deleted",
            ),
            (FrontError::NegativeMaxEntries { max_entries: -1 }, "max_entries is -1; it must be 0 (no limit) or more"),
        ];
        for (err, words) in table {
            let s: Status = err.into();
            assert_eq!(s.code(), Code::InvalidArgument);
            assert_eq!(s.message(), words);
        }
    }

    #[test]
    fn echoed_input_is_quoted_and_cut() {
        assert_eq!(echo("ssd"), "\"ssd\"");
        assert_eq!(echo("a\0b"), "\"a\\0b\"");
        let long = echo(&"v".repeat(1 << 20));
        assert!(long.len() < 100 && long.ends_with("... (1048576 bytes)"), "{long}");
    }

    #[test]
    fn each_volume_error_maps_to_its_csi_code() {
        let id = || "v1".to_string();
        let table: Vec<(VolumeError, Code, &str)> = vec![
            (VolumeError::NotFound { volume_id: id() }, Code::NotFound, "volume v1 does not exist"),
            (VolumeError::InvalidArgument { reason: "path x is not absolute".into() }, Code::InvalidArgument, "not absolute"),
            (VolumeError::AlreadyExists { volume: "pvc-1".into(), reason: "exists with 5 bytes".into() }, Code::AlreadyExists, "pvc-1"),
            (VolumeError::ResourceExhausted { reason: "no managed drive".into() }, Code::ResourceExhausted, "no managed drive"),
            (VolumeError::OutOfRange { reason: "too big".into() }, Code::OutOfRange, "too big"),
            (VolumeError::StillStaged { volume_id: id() }, Code::FailedPrecondition, "v1 is still staged; unstage it first"),
            (VolumeError::PublishBeforeStage { volume_id: id() }, Code::FailedPrecondition, "v1 is not staged; call NodeStageVolume first"),
            (
                VolumeError::StillPublished { volume_id: id(), targets: vec!["/t1".into(), "/t2".into()] },
                Code::FailedPrecondition,
                "v1 is still published (at /t1, /t2); unpublish every target first",
            ),
            (VolumeError::DeleteUnfinished { volume_id: id() }, Code::FailedPrecondition, "v1 is being deleted; retry CreateVolume"),
            (VolumeError::PartitionMounted { volume_id: id(), device: "/dev/sdb1".into() }, Code::FailedPrecondition, "partition /dev/sdb1 is still mounted"),
            (
                VolumeError::GrowsWhenUnused { volume_id: id(), size: 2 << 30, drive_id: "d2".into(), why: "it is staged at /s".into() },
                Code::FailedPrecondition,
                "volume v1 cannot grow to 2.0 GiB (2147483648 bytes) while it is in use (it is staged at /s): the space after it on its drive is taken, and it grows by moving to a bigger free extent on drive d2, which needs it unused; it grows at its next stage, once no pod uses it",
            ),
            (VolumeError::DriveGoneDuringCreate { volume_id: id(), drive_id: "d1".into() }, Code::FailedPrecondition, "created on drive d1 which is absent now"),
            (VolumeError::DriveMissing { volume_id: id(), drive_id: "d1".into() }, Code::FailedPrecondition, "drive d1 which is missing from this node"),
            (
                VolumeError::DriveFailing { volume_id: id(), drive_id: "d1".into(), health: "12 reallocated sectors".into() },
                Code::FailedPrecondition,
                "drive d1 which is failing (12 reallocated sectors); it takes no new attachments",
            ),
            (
                VolumeError::DriveReleasing {
                    volume_id: id(),
                    drive_id: "d1".into(),
                    state: crate::words::DriveUseState::Releasing,
                    reason: "asked".into(),
                },
                Code::FailedPrecondition,
                "drive d1 which is releasing (asked)",
            ),
            (VolumeError::FailedByRelease { volume_id: id(), drive_id: "d1".into() }, Code::FailedPrecondition, "failed by a forced release of drive d1"),
            (
                VolumeError::WrongAccessType { volume_id: id(), block: true, call: "staged" },
                Code::FailedPrecondition,
                "v1 was created for block access; it cannot be staged for filesystem access",
            ),
            (VolumeError::WrongFilesystem { volume_id: id(), holds: "ext4".into(), asked: "xfs".into() }, Code::FailedPrecondition, "v1 holds ext4, not xfs"),
            (VolumeError::FilesystemFound { volume_id: id(), found: "xfs".into(), asked: "ext4".into() }, Code::FailedPrecondition, "holds a xfs filesystem, not ext4"),
            (
                VolumeError::StagedElsewhere { volume_id: id(), staged_at: "/s1".into(), asked: "/s2".into() },
                Code::FailedPrecondition,
                "v1 is staged at /s1, not at /s2",
            ),
            (VolumeError::StagedForOtherAccess { volume_id: id() }, Code::FailedPrecondition, "staged for a different access type"),
            (VolumeError::BlockReadOnlyMixed { volume_id: id() }, Code::FailedPrecondition, "with the other read-only setting"),
            (VolumeError::SingleWriterInUse { volume_id: id() }, Code::FailedPrecondition, "SINGLE_NODE_SINGLE_WRITER"),
            (
                VolumeError::AdoptedUnreadable { volume_id: id(), path: "/mnt/d".into(), reason: "permission denied".into() },
                Code::FailedPrecondition,
                "adopted from /mnt/d, which cannot be read: permission denied",
            ),
            (VolumeError::AdoptedNotDirectory { volume_id: id(), path: "/mnt/d".into() }, Code::FailedPrecondition, "no longer a directory"),
            (VolumeError::AdoptedFixedSize { volume_id: id(), path: "/mnt/d".into() }, Code::FailedPrecondition, "adopted from /mnt/d: its size"),
            (VolumeError::AdoptedFilesystem { volume_id: id() }, Code::FailedPrecondition, "is adopted: its filesystem is not drivelet's"),
            (
                VolumeError::ExpandUnfinished { volume_id: id(), kernel_size: 5, size: 9 },
                Code::FailedPrecondition,
                "has a 5 byte partition in the kernel but should have 9",
            ),
            (VolumeError::CannotGrowExt4 { volume_id: id() }, Code::FailedPrecondition, "CAP_SYS_RESOURCE"),
            (VolumeError::Panicked { volume_id: id(), reason: "task panicked".into() }, Code::Internal, "v1: the operation failed unexpectedly"),
            (VolumeError::Busy { volume_id: id() }, Code::Aborted, "another operation on volume v1 is in progress; retry"),
            (VolumeError::DriveAbsent { volume_id: id(), drive_id: "d1".into() }, Code::FailedPrecondition, "volume v1 lives on drive d1 which is absent from this node"),
            (
                VolumeError::Lost { volume_id: id(), part_guid: uuid::Uuid::nil(), drive_id: "d1".into() },
                Code::FailedPrecondition,
                "volume v1 its partition 00000000-0000-0000-0000-000000000000 is missing from drive d1: the data is gone",
            ),
            (VolumeError::StillAttached { volume_id: id(), node: "n1".into() }, Code::FailedPrecondition, "volume v1 is still attached to node n1; call ControllerUnpublishVolume first"),
            (VolumeError::AttachedElsewhere { volume_id: id(), node: "n2".into() }, Code::FailedPrecondition, "volume v1 is already attached to node n2; a local volume serves one node"),
            (VolumeError::NotStaged { volume_id: id() }, Code::FailedPrecondition, "volume v1 is not staged; its filesystem grows"),
            (VolumeError::AlreadyStaged { volume_id: id(), path: "/s".into() }, Code::FailedPrecondition, "volume v1 is already staged at /s; unstage it there first"),
            (VolumeError::NotReady, Code::Unavailable, "starting"),
            (VolumeError::SourceNotFound { source_id: id() }, Code::NotFound, "source volume v1 does not exist on this node"),
            (
                VolumeError::SourceIncompatible { source_id: id(), reason: "it is a block volume".into() },
                Code::InvalidArgument,
                "cannot clone volume v1: it is a block volume",
            ),
            (
                VolumeError::SourceInUse { source_id: id(), path: "/s".into(), why: InUse::Refused },
                Code::FailedPrecondition,
                "cannot clone volume v1 now: it is mounted read-write at /s, and its StorageClass says drivelet.io/clone-in-use: refuse; the clone is made once no pod writes to it",
            ),
            (
                VolumeError::SourceInUse { source_id: id(), path: "/t".into(), why: InUse::Block },
                Code::FailedPrecondition,
                "cannot clone block volume v1 now: a pod writes to it at /t, and a block volume has no filesystem drivelet could freeze",
            ),
            (
                VolumeError::SourceInUse { source_id: id(), path: "/t".into(), why: InUse::Encrypted },
                Code::FailedPrecondition,
                "cannot clone encrypted volume v1 now: it is mounted read-write at /t",
            ),
            (
                VolumeError::SourceInUse { source_id: id(), path: "/s".into(), why: InUse::TooLong { used: 3 << 30, estimate_millis: 14_200, limit_millis: 10_000 } },
                Code::FailedPrecondition,
                "copying the 3.0 GiB its filesystem uses would freeze its writers for about 14 s, longer than the 10 s allowed",
            ),
            (
                VolumeError::FreezeExpired { volume_id: id(), limit_millis: 2_000, clone: true },
                Code::FailedPrecondition,
                "cannot clone volume v1: the copy needed longer than the freeze limit of 2.0 s, so its filesystem was thawed and the copy discarded; raise drivelet.io/clone-freeze-limit",
            ),
            (
                VolumeError::CloneTooSmall { source_id: id(), source_size: 1 << 30, limit: 512 << 20 },
                Code::OutOfRange,
                "a clone of volume v1 needs at least 1.0 GiB (the size of the source), but limit_bytes allows 512.0 MiB",
            ),
            (
                VolumeError::Disk {
                    volume_id: id(),
                    op: "make the filesystem",
                    source: crate::disk::DiskError::Tool { tool: "mkfs.ext4".into(), message: "exit 1".into() },
                },
                Code::Internal,
                "cannot make the filesystem: mkfs.ext4 failed",
            ),
            (
                VolumeError::ForeignData {
                    volume_id: id(),
                    op: "update the partition table",
                    device: "/dev/sdb".into(),
                    found: "a Linux RAID member (md superblock 1.0) beside a drivelet GPT".into(),
                },
                Code::FailedPrecondition,
                "refusing to write to it: a Linux RAID member",
            ),
        ];
        for (err, code, text) in table {
            let s: Status = err.into();
            assert_eq!(s.code(), code, "{}", s.message());
            assert!(s.message().contains(text), "{}", s.message());
        }
    }
}
