//! Every message the volume manager answers (commands imperative, queries, the
//! notifications it takes and the subscriptions to those it sends), with the answers
//! they carry (`publish_context`, a volume's status, a metrics scrape). A front sends
//! only what is defined here; the handlers are in [`super::calls`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use actix::prelude::*;

use super::conditions::{Condition, Finding, Reason, StorageEntry};
use super::model::{CapacityRange, VolumeRecord};
use super::error::VolumeError;
use super::evacuate::{Evacuation, MoveProgress};
use super::snapshot::SnapshotRecord;
use super::view::VolumesView;
use crate::config::human_bytes;
use crate::words::{DriveUse, LayoutKind, Media};

/// Command: create (or return the existing) volume with this name.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<VolumeRecord, VolumeError>")]
pub struct CreateVolume {
    /// CSI name.
    pub name: String,
    /// Capacity bounds.
    pub range: CapacityRange,
    /// Media, `None` for any.
    pub media: Option<Media>,
    /// Layout.
    pub layout: LayoutKind,
    /// Every capability is block access.
    pub block: bool,
    /// Filesystem for mount access (validated ext4/xfs, or empty for the default).
    pub fs_type: String,
    /// The StorageClass parameters as given.
    pub parameters: BTreeMap<String, String>,
    /// A clone: the id of the volume (or, with `from_snapshot`, of the snapshot) whose
    /// data the new one starts with.
    pub source: Option<String>,
    /// `source` names a snapshot (a restore), not a volume.
    pub from_snapshot: bool,
    /// The PV and claim it is made for, as far as the request says (the provisioner's
    /// `csi.storage.k8s.io/pv/name`, `pvc/name` and `pvc/namespace`).
    pub binding: crate::words::Binding,
    /// The call's secrets (the key-encryption keys a copy into or out of an encrypted
    /// volume needs).
    pub secrets: Secrets,
}

#[cfg(test)]
impl CreateVolume {
    /// A CreateVolume of `name` with no size, source or parameters, for unit tests.
    pub(crate) fn for_test(name: &str) -> CreateVolume {
        CreateVolume {
            name: name.into(),
            range: super::model::CapacityRange { required: 0, limit: 0 },
            media: None,
            layout: crate::words::LayoutKind::Partition,
            block: false,
            fs_type: String::new(),
            parameters: Default::default(),
            source: None,
            from_snapshot: false,
            binding: Default::default(),
            secrets: Default::default(),
        }
    }
}

impl CreateVolume {
    /// Whether its StorageClass asks for encryption (`drivelet.io/encryption: fscrypt`).
    pub fn encrypting(&self) -> bool {
        crate::words::encryption::Encryption::of(self.parameters.iter()) == crate::words::encryption::Encryption::Fscrypt
    }
}

/// Command: copy a volume's data into a snapshot of this name (or return the snapshot
/// of the name, taken of the same volume).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<SnapshotRecord, VolumeError>")]
pub struct CreateSnapshot {
    /// CSI name.
    pub name: String,
    /// The volume to copy.
    pub source_volume_id: String,
    /// The snapshot class's parameters (`csi.storage.k8s.io/` ones left out).
    pub parameters: BTreeMap<String, String>,
}

/// Command: delete a snapshot (idempotent: an unknown id is done).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), VolumeError>")]
pub struct DeleteSnapshot {
    /// Snapshot id.
    pub snapshot_id: String,
}

/// Query: every record of what the drives hold, volumes and snapshots (the Drive
/// objects list both).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Vec<VolumeRecord>")]
pub struct ListHeld;

/// Query: every snapshot this node holds, by id.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Result<Vec<SnapshotRecord>, VolumeError>")]
pub struct ListSnapshots;

/// Command: delete a volume (idempotent).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), VolumeError>")]
pub struct DeleteVolume {
    /// Volume id.
    pub volume_id: String,
}

/// Command: NodeStageVolume.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), VolumeError>")]
pub struct StageVolume {
    /// Volume id.
    pub volume_id: String,
    /// What to do.
    pub args: StageArgs,
}

/// Command: NodeUnstageVolume.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), VolumeError>")]
pub struct UnstageVolume {
    /// Volume id.
    pub volume_id: String,
    /// Staging path.
    pub path: PathBuf,
}

/// Command: NodePublishVolume.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), VolumeError>")]
pub struct PublishVolume {
    /// Volume id.
    pub volume_id: String,
    /// What to do.
    pub args: PublishArgs,
}

/// Command: NodeUnpublishVolume.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), VolumeError>")]
pub struct UnpublishVolume {
    /// Volume id.
    pub volume_id: String,
    /// Target path.
    pub target: PathBuf,
}

/// Command: ControllerPublishVolume, attach a volume to this node.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<PublishContext, VolumeError>")]
pub struct AttachVolume {
    /// Volume id.
    pub volume_id: String,
    /// The node (validated by the caller to be this one).
    pub node_id: String,
    /// The capability asks for block access.
    pub block: bool,
    /// Filesystem the capability names (empty: any).
    pub fs_type: String,
}

/// What an attachment hands the node calls (CSI `publish_context`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishContext {
    /// Kernel device node of the volume's partition.
    pub device: PathBuf,
    /// The partition GUID.
    pub part_guid: uuid::Uuid,
}

/// `publish_context` key: the kernel device node of the volume's partition.
pub const PUBLISH_DEVICE_KEY: &str = "drivelet.io/device";
/// `publish_context` key: the volume's GPT partition GUID.
pub const PUBLISH_PARTITION_GUID_KEY: &str = "drivelet.io/partition-guid";

/// `publish_context` key of an adopted volume: the host directory it binds.
pub const PUBLISH_LOCAL_PATH_KEY: &str = "drivelet.io/local-path";

impl PublishContext {
    /// As the CSI `publish_context` map (also a VolumeAttachment's `attachmentMetadata`).
    /// An adopted volume (no partition: a nil GUID) names its directory instead.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        if self.part_guid.is_nil() {
            return BTreeMap::from([(PUBLISH_LOCAL_PATH_KEY.to_string(), self.device.display().to_string())]);
        }
        BTreeMap::from([
            (PUBLISH_DEVICE_KEY.to_string(), self.device.display().to_string()),
            (PUBLISH_PARTITION_GUID_KEY.to_string(), self.part_guid.to_string()),
        ])
    }
}

/// Command: ControllerUnpublishVolume, detach a volume (idempotent; an unknown volume
/// or one not attached to the node is done already).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), VolumeError>")]
pub struct DetachVolume {
    /// Volume id.
    pub volume_id: String,
    /// Detach from this node only; `None`: from every node.
    pub node_id: Option<String>,
}

/// Command: ControllerExpandVolume, grow a volume's partition in place. Answers the new
/// size and whether the node must grow a filesystem.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(u64, bool), VolumeError>")]
pub struct ExpandVolume {
    /// Volume id.
    pub volume_id: String,
    /// The size asked for.
    pub range: CapacityRange,
}

/// Command: NodeExpandVolume, grow a staged volume's filesystem to its partition.
/// Answers the size.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<u64, VolumeError>")]
pub struct NodeExpandVolume {
    /// Volume id.
    pub volume_id: String,
    /// The staging or a target path the request names.
    pub path: PathBuf,
}

/// Query: one volume.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<VolumeRecord, VolumeError>")]
pub struct GetVolume {
    /// Volume id.
    pub volume_id: String,
}

/// Query: every volume, by id.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Vec<VolumeRecord>")]
pub struct ListVolumes;

/// Query: the volumes this node serves now: on a drive that is here and this node's
/// (managed), their partition there. A record of a volume whose drive is gone (pulled,
/// or moved to another node and adopted there) is not one: its claim is not this
/// node's to re-home.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Vec<VolumeRecord>")]
pub struct ListServedVolumes;

/// Query: whether start-up reconciliation is done.
#[derive(Message, Debug, Clone)]
#[rtype(result = "bool")]
pub struct VolumesReady;

/// Notification from the health poller: what the checks of one volume found.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct VolumeChecked {
    /// Volume id.
    pub volume_id: String,
    /// Findings (empty: all well).
    pub findings: Vec<Finding>,
}

/// Command: release a drive (`drivelet ctl drive release`).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<DriveUse, VolumeError>")]
pub struct ReleaseDrive {
    /// Stable drive id.
    pub drive_id: String,
    /// Fail the volumes still on it instead of waiting for their deletion.
    pub force: bool,
}

/// Command: cordon a drive (no new volumes; its volumes stay) or uncordon it
/// (`drivelet ctl drive cordon|uncordon`, or the Drive object's `spec.action`). Answers
/// the drive's usage from then on (`None`: active).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<Option<DriveUse>, VolumeError>")]
pub struct CordonDrive {
    /// Stable drive id.
    pub drive_id: String,
    /// Cordon (`true`) or uncordon (`false`).
    pub cordon: bool,
}

/// Query: the bytes each staged filesystem volume uses (statvfs of its staging path),
/// by volume id; volumes not staged, block volumes and filesystems that do not answer
/// in time are left out.
#[derive(Message, Debug, Clone)]
#[rtype(result = "BTreeMap<String, u64>")]
pub struct VolumesUsed;

/// A volume with its live status.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VolumeStatus {
    /// The record.
    pub record: VolumeRecord,
    /// Its condition now.
    pub condition: Condition,
}

/// Query: one volume with its condition.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<VolumeStatus, VolumeError>")]
pub struct GetVolumeStatus {
    /// Volume id.
    pub volume_id: String,
}

/// Query: a page of volumes (by id order) with their conditions.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(Vec<VolumeStatus>, Option<String>), VolumeError>")]
pub struct ListVolumeStatuses {
    /// Start after this volume id.
    pub after: Option<String>,
    /// At most this many (0: all).
    pub max: usize,
    /// Only volumes whose condition is abnormal (ControllerListVolumeHealth).
    pub abnormal_only: bool,
}

/// Query: the health of this node's storage, one entry per reason (empty: all well).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<Vec<StorageEntry>, VolumeError>")]
pub struct GetStorageHealth;

/// Query: the usage records of releasing and released drives.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Vec<DriveUse>")]
pub struct ListDriveUses;

/// Query: how far the cleaning of freed space is, per drive that has some.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "Vec<Cleaning>")]
pub struct ListCleaning;

/// Query: filesystem usage of a volume at one of its paths (NodeGetVolumeStats).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(VolumeStatus, Option<crate::disk::fs::Usage>), VolumeError>")]
pub struct VolumeStats {
    /// Volume id.
    pub volume_id: String,
    /// The staging or a target path of the volume; for a block volume also any device
    /// node of its partition under the allowed roots (kubelet's bind of the device).
    pub path: PathBuf,
}

/// Query: would [`AttachVolume`] be accepted now? Changes nothing; the answer is the
/// error the attach would fail with, if any (before any disk step).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), VolumeError>")]
pub struct AttachPreview(pub AttachVolume);

/// Command: adopt a host directory holding an existing volume's data (an in-tree
/// `local` PV translated by `migration`) as volume `volume_id`. Idempotent for the same
/// directory. The data is never formatted, moved or deleted.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<VolumeRecord, VolumeError>")]
pub struct AdoptVolume {
    /// The volume id (the translated PV's volume handle).
    pub volume_id: String,
    /// The PersistentVolume it came from.
    pub pv_name: String,
    /// The directory holding the data.
    pub path: PathBuf,
    /// The filesystem the PV names (may be empty).
    pub fs_type: String,
}

/// Query: answers once start-up reconciliation is done (at once when it is): `true`, or
/// `false` if the manager went away before it was ready.
#[derive(Message, Debug, Clone)]
#[rtype(result = "bool")]
pub struct WaitReady;

/// What NodeStageVolume asks.
#[derive(Debug, Clone)]
pub struct StageArgs {
    /// Staging path.
    pub path: PathBuf,
    /// Block access.
    pub block: bool,
    /// Filesystem asked for (mount access); empty means the volume's own.
    pub fs_type: String,
    /// Mount flags (validated).
    pub flags: Vec<String>,
    /// Mount read-only (reader-only access mode).
    pub readonly: bool,
    /// The call's secrets (an encrypted volume's key-encryption keys).
    pub secrets: Secrets,
}

/// A CSI call's secrets, handed to the step that needs them: never shown (`Debug`
/// prints how many) and wiped from memory when dropped.
#[derive(Clone, Default)]
pub struct Secrets(pub std::collections::HashMap<String, String>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} secrets, not shown>", self.0.len())
    }
}

impl Drop for Secrets {
    fn drop(&mut self) {
        use zeroize::Zeroize;
        for v in self.0.values_mut() {
            v.zeroize();
        }
    }
}

/// What NodePublishVolume asks.
#[derive(Debug, Clone)]
pub struct PublishArgs {
    /// Target path.
    pub target: PathBuf,
    /// Staging path given with the call.
    pub staging: PathBuf,
    /// Block access.
    pub block: bool,
    /// Read-only bind.
    pub readonly: bool,
    /// Only one target may be published (SINGLE_NODE_SINGLE_WRITER).
    pub single_writer: bool,
    /// Mount flags of the capability (validated; generic ones apply to the bind).
    pub flags: Vec<String>,
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

/// Command: record what a volume serves in Kubernetes (its PV and claim, read from the
/// API), so its drive's note says it too. Idempotent: the same binding writes nothing.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<(), VolumeError>")]
pub struct SetBinding {
    /// Volume id.
    pub volume_id: String,
    /// The binding from now on.
    pub binding: crate::words::Binding,
}

/// Command: evacuate a drive (idempotent: asking again retries the volumes that failed
/// and answers where it stands).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<Evacuation, VolumeError>")]
pub struct EvacuateDrive {
    /// Stable drive id.
    pub drive_id: String,
    /// Switch a volume even when blocks of it could not be read (they read as zeros on
    /// its new drive).
    pub force: bool,
}

/// Query: where every evacuation asked for stands, by drive id.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Vec<Evacuation>")]
pub struct ListEvacuations;

/// Notification: a volume moved to another drive of the node (an evacuation), or to a
/// bigger extent of another drive or its own (a growth by moving).
#[derive(Message, Debug, Clone, PartialEq, Eq)]
#[rtype(result = "()")]
pub struct VolumeMoved {
    /// The volume.
    pub volume_id: String,
    /// Its name (the PV's).
    pub name: String,
    /// The drive it left.
    pub from_drive: String,
    /// The drive it is on now.
    pub to_drive: String,
    /// Bytes copied.
    pub bytes: u64,
    /// Byte ranges that could not be read and read as zeros now (forced only).
    pub unreadable: Vec<(u64, u64)>,
    /// A growth by moving: the size the volume has now.
    pub grown_to: Option<u64>,
}

/// Notification: a clone of a volume in use was made, or refused because its source is
/// in use; said on the clone's claim (known from CreateVolume's metadata).
#[derive(Message, Debug, Clone, PartialEq, Eq)]
#[rtype(result = "()")]
pub struct CloneNotice {
    /// The clone's claim (namespace and name).
    pub claim: crate::words::Binding,
    /// The clone's CSI name (the PV's).
    pub name: String,
    /// The source volume.
    pub source_id: String,
    /// What happened.
    pub what: CloneOutcome,
}

/// What happened to a clone of a volume in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloneOutcome {
    /// Copied under a freeze of the source's filesystem, this many milliseconds.
    Frozen {
        /// How long the source's writers were held.
        millis: u64,
    },
    /// A block volume copied while written (its class accepts it).
    CrashInconsistent,
    /// Not made now: why, and what to do (the refusal's words).
    Refused {
        /// The kind of refusal (one Event per claim and kind).
        kind: &'static str,
        /// The refusal's words.
        reason: String,
    },
}

/// Command: send every future [`CloneNotice`] to this recipient.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SubscribeClones(pub Recipient<CloneNotice>);

/// Command: send every future [`VolumeMoved`] to this recipient.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SubscribeMoves(pub Recipient<VolumeMoved>);

/// Query: what a metrics scrape reads from the volume manager.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "VolumesScrape")]
pub struct ScrapeVolumes;

/// The volume manager at one moment, as the metrics read it.
#[derive(Debug, Clone, Default)]
pub struct VolumesScrape {
    /// The published view: shown volumes with their conditions, managed drives with
    /// their room (not ready: empty).
    pub view: Arc<VolumesView>,
    /// Usage records of cordoned, releasing and released drives.
    pub uses: Vec<DriveUse>,
    /// Snapshots (empty until start-up reconciliation is done).
    pub snapshots: Vec<SnapshotRecord>,
    /// Drives with space still to be zeroed.
    pub cleaning: Vec<Cleaning>,
    /// Every evacuation asked for.
    pub evacuations: Vec<Evacuation>,
    /// The move copying now, if one is.
    pub(crate) moving: Option<MoveProgress>,
}

/// How far the cleaning of one drive is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cleaning {
    /// The drive.
    pub drive_id: String,
    /// Bytes still to be zeroed.
    pub left_bytes: u64,
    /// Bytes this round of cleaning has held.
    pub round_bytes: u64,
}

impl Cleaning {
    /// Percent of the round done, rounded down.
    pub fn percent_done(&self) -> u64 {
        if self.round_bytes == 0 {
            return 100;
        }
        (self.round_bytes - self.left_bytes.min(self.round_bytes)) * 100 / self.round_bytes
    }

    /// In words: "512 MiB being cleaned (40% done)".
    pub fn words(&self) -> String {
        format!("{} being cleaned ({}% done)", human_bytes(self.left_bytes), self.percent_done())
    }
}

/// Query: the volume side of this node's `Drive` objects, in one answer.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "DriveView")]
pub struct GetDriveView;

/// What the `Drive` objects show of the volume manager (see the rules of the handler, `calls/drive_view.rs`).
#[derive(Debug, Clone, Default)]
pub struct DriveView {
    /// The start-up reconciliation is done; when not, every list is empty.
    pub ready: bool,
    /// The usage records of cordoned, releasing and released drives.
    pub uses: Vec<DriveUse>,
    /// Every record the book holds (volumes and snapshots, `Creating` ones too).
    pub volumes: Vec<VolumeRecord>,
    /// Every shown volume with its condition, in id order.
    pub statuses: Vec<VolumeStatus>,
    /// Bytes each staged filesystem uses, by volume id.
    pub used: BTreeMap<String, u64>,
    /// How far the cleaning of freed space is, per drive that has some.
    pub cleaning: Vec<Cleaning>,
    /// Where every evacuation asked for stands.
    pub evacuations: Vec<Evacuation>,
}
