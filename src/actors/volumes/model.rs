//! Volumes as plain data: the persisted record, the lifecycle state machine and its one
//! transition function, capacity arithmetic and placement. No I/O here.
//!
//! Legal transitions ([`next`]):
//!
//! | from        | op          | to          |
//! |-------------|-------------|-------------|
//! | Creating    | CreateDone  | Available   |
//! | Available   | Stage       | Staged      |
//! | Staged      | Stage       | Staged      |
//! | Staged      | Publish     | Published   |
//! | Published   | Publish     | Published   |
//! | Published   | Unpublish   | Published (targets remain) or Staged (last one) |
//! | Staged      | Unpublish   | Staged      |
//! | Available   | Unpublish   | Available   |
//! | Staged      | Unstage     | Available   |
//! | Available   | Unstage     | Available   |
//! | Creating, Available, Deleting | Delete | Deleting |
//! | Deleting    | DeleteDone  | (record removed) |
//!
//! Everything else is refused with the reason: publishing an unstaged volume, unstaging
//! or deleting a volume that is still staged or published, touching a volume that is
//! being created or deleted.
//!
//! Where a new volume goes, and what GetCapacity promises, is [`super::placement`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use serde::{Deserialize, Serialize};

use crate::disk::gpt;
use crate::words::{LayoutKind, Media};

/// Where a volume is in its life. Persisted with the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VolumeState {
    /// The intent is recorded; the partition may or may not exist yet. Such a volume
    /// was never returned to anyone, so a restart rolls it back.
    Creating,
    /// The partition exists and was wiped; nothing is mounted.
    Available,
    /// Staged: the filesystem is mounted at the staging path (block volumes: the
    /// staging path is recorded).
    Staged,
    /// Staged and bind-mounted to at least one target path.
    Published,
    /// Deletion has started; a restart finishes it.
    Deleting,
}

impl VolumeState {
    /// Lower-case name for output.
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeState::Creating => "creating",
            VolumeState::Available => "available",
            VolumeState::Staged => "staged",
            VolumeState::Published => "published",
            VolumeState::Deleting => "deleting",
        }
    }
}

/// An operation on a volume, as the state machine sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// The partition is in place and wiped.
    CreateDone,
    /// NodeStageVolume.
    Stage,
    /// NodeUnstageVolume.
    Unstage,
    /// NodePublishVolume.
    Publish,
    /// NodeUnpublishVolume; `remaining` targets stay published afterwards.
    Unpublish {
        /// Targets left after this one.
        remaining: usize,
    },
    /// DeleteVolume starts.
    Delete,
}

/// Why a transition is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Publish before stage.
    #[error("is not staged; call NodeStageVolume first")]
    NotStaged,
    /// Unstage or delete while targets are published.
    #[error("is still published; unpublish every target first")]
    StillPublished,
    /// Delete while staged.
    #[error("is still staged; unstage it first")]
    StillStaged,
    /// The volume is being created.
    #[error("is still being created; retry CreateVolume")]
    BeingCreated,
    /// The volume is being deleted.
    #[error("is being deleted")]
    BeingDeleted,
}

/// The one transition function of the volume lifecycle.
pub fn next(s: VolumeState, op: Op) -> Result<VolumeState, Refusal> {
    use Op::*;
    use VolumeState::*;
    match (s, op) {
        (Creating, CreateDone) => Ok(Available),
        (Creating | Available | Deleting, Delete) => Ok(Deleting),
        (Creating, _) => Err(Refusal::BeingCreated),
        (Deleting, _) => Err(Refusal::BeingDeleted),
        (Available | Staged, Stage) => Ok(Staged),
        (Published, Stage) => Ok(Published),
        (Staged | Published, Publish) => Ok(Published),
        (Available, Publish) => Err(Refusal::NotStaged),
        (Published, Unpublish { remaining }) => Ok(if remaining == 0 { Staged } else { Published }),
        (Staged | Available, Unpublish { .. }) => Ok(s),
        (Staged | Available, Unstage) => Ok(Available),
        (Published, Unstage) => Err(Refusal::StillPublished),
        (Staged, Delete) => Err(Refusal::StillStaged),
        (Published, Delete) => Err(Refusal::StillPublished),
        (Available | Staged | Published, CreateDone) => Ok(s),
    }
}

/// The staging of a volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Staging {
    /// The staging path.
    pub path: PathBuf,
    /// Block access (nothing mounted at the staging path).
    pub block: bool,
    /// Mount flags used.
    pub flags: Vec<String>,
    /// Mounted read-only.
    pub readonly: bool,
    /// False while the stage is in progress (intent recorded, mount not confirmed).
    pub done: bool,
}

/// One publish target of a volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// Bind-mounted read-only.
    pub readonly: bool,
    /// Block access (the device node is bound onto a file).
    pub block: bool,
    /// False while the publish is in progress.
    pub done: bool,
}

/// A volume as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    /// CSI volume id: the partition GUID.
    pub id: String,
    /// CSI name the volume was created with (from the GPT label when rebuilt, then
    /// possibly shortened).
    pub name: String,
    /// Stable id of the drive it lives on.
    pub drive_id: String,
    /// Partition GUID.
    pub part_guid: uuid::Uuid,
    /// Start on the drive, bytes.
    pub start: u64,
    /// Size, bytes.
    pub size: u64,
    /// Partition or whole drive.
    pub layout: LayoutKind,
    /// Media of its drive.
    pub media: Media,
    /// Created for block access only.
    pub block: bool,
    /// Filesystem for mount access (ext4 or xfs).
    pub fs_type: String,
    /// StorageClass parameters it was created with.
    pub parameters: Parameters,
    /// The PV and claim it serves, as far as known: from CreateVolume's metadata, then
    /// from the cluster; kept in its drive's note too.
    #[serde(default, skip_serializing_if = "crate::words::Binding::is_empty")]
    pub binding: crate::words::Binding,
    /// Lifecycle state.
    pub state: VolumeState,
    /// drivelet made the filesystem (mkfs completed), so an existing one is data.
    pub formatted: bool,
    /// Staging, if staged or being staged.
    pub staging: Option<Staging>,
    /// Publish targets by path.
    pub targets: BTreeMap<PathBuf, Target>,
    /// Unix time of creation.
    pub created_unix: u64,
    /// Rebuilt from the drive's GPT (the store had no record).
    pub rebuilt: bool,
    /// Failed by a forced release of its drive: its condition stays abnormal.
    #[serde(default)]
    pub failed: bool,
    /// The node the volume is controller-published (attached) to, by
    /// ControllerPublishVolume; cleared by ControllerUnpublishVolume. A volume attached
    /// to a node is not deleted.
    #[serde(default)]
    pub published_node: Option<String>,
    /// An adopted volume (an in-tree `local` PV brought under drivelet's care): its
    /// data is a directory of the host that drivelet never created and never deletes.
    #[serde(default)]
    pub adopted: Option<Adopted>,
    /// Its drive is here but the partition is not in the drive's GPT (the drive was
    /// wiped or replaced): the data is gone. Found by reconciliation (at start-up and
    /// whenever a drive appears); shown as state `lost`; only DeleteVolume is served.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lost: bool,
    /// A clone: the id of the volume whose data it carries. While the record is
    /// `Creating` the copy is in progress (a restart rolls it back, so a half copy is
    /// never served); once it is `Available` the copy is complete and on disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_of: Option<String>,
    /// Restored from this snapshot (its id): the volume started as the snapshot's copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_from: Option<String>,
    /// A clone of a volume that was in use when copied: how the copy was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copied_in_use: Option<InUseCopy>,
    /// Not a volume but a snapshot: a read-only copy of a volume's data, never staged,
    /// published or attached, only restored from (see [`super::snapshot`]). `size` is
    /// its partition's: the data and one more MiB for its note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotOf>,
    /// Being moved to another drive of the node (evacuation), or to another place on
    /// its own drive (a growth): see [`Move`]. Its extent
    /// is reserved for placement as long as this is set. Boxed: a rare state, so a
    /// record pays one pointer for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving: Option<Box<Move>>,
}

/// A move of a volume (or snapshot) to another drive, or to another place on its own
/// drive, as its record keeps it, so a restart finishes or rolls back what a kill cut
/// short.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Move {
    /// Before the switch: where the copy goes. After it (`switched`): where the volume
    /// was, whose partition is still to be removed.
    pub drive_id: String,
    /// Start of that extent on its drive, bytes.
    pub start: u64,
    /// Its size, bytes.
    pub size: u64,
    /// The record already points at the copy (the switch is stored).
    pub switched: bool,
    /// Byte ranges of the volume that could not be read (zeros on the copy).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<(u64, u64)>,
    /// A move within the volume's own drive: the temporary partition GUID its copy
    /// carries until the finish gives it the volume's (two partitions of one drive
    /// cannot carry one GUID). `None` for a move to another drive, whose copy carries
    /// the volume's GUID from the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_guid: Option<uuid::Uuid>,
}

impl Move {
    /// The partition GUID of the copy of the volume whose GUID is `volume`.
    pub fn copy_part_guid(&self, volume: uuid::Uuid) -> uuid::Uuid {
        self.copy_guid.unwrap_or(volume)
    }
}

/// How a clone of a volume in use was copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InUseCopy {
    /// Its source's filesystem was frozen for the copy, this many milliseconds: the copy
    /// is consistent (as after a clean unmount).
    Frozen {
        /// How long the source's writers were held.
        millis: u64,
    },
    /// A block volume copied while it was written: not even crash-consistent (its class
    /// says `drivelet.io/clone-in-use-block: crash-inconsistent`).
    CrashInconsistent,
}

impl InUseCopy {
    /// The value of the clone's `drivelet.io/clone-consistency` volume attribute.
    pub fn as_str(self) -> &'static str {
        match self {
            InUseCopy::Frozen { .. } => "frozen",
            InUseCopy::CrashInconsistent => "crash-inconsistent",
        }
    }
}

/// What a snapshot record knows of its snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotOf {
    /// The volume it was taken of.
    pub source_volume_id: String,
    /// Bytes of data (the source's size when taken): the smallest volume restored from it.
    pub restore_size: u64,
    /// When it was taken, nanoseconds since the epoch.
    pub created_unix_nanos: i64,
    /// How long the source's filesystem was frozen for the copy, when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freeze_millis: Option<u64>,
    /// Freeze the source's filesystem for the copy when it is mounted read-write (the
    /// snapshot class asked for it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub freeze: bool,
}

/// Where an adopted volume's data lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Adopted {
    /// The directory (canonical) that staging binds.
    pub path: PathBuf,
    /// The PersistentVolume it came from.
    pub pv_name: String,
}

#[cfg(test)]
impl VolumeRecord {
    /// An ext4 partition volume of 1 MiB at `n` MiB on drive `d1`, for unit tests.
    pub(crate) fn for_test(n: u8, state: VolumeState) -> VolumeRecord {
        let guid = uuid::Uuid::from_bytes([n; 16]);
        VolumeRecord {
            drive_id: "d1".into(),
            part_guid: guid,
            start: n as u64 * gpt::ALIGN,
            size: gpt::ALIGN,
            fs_type: "ext4".into(),
            formatted: true,
            ..VolumeRecord::new(guid.to_string(), format!("pvc-{n}"), state, 0)
        }
    }
}

/// The StorageClass parameters a volume was created with (the `csi.storage.k8s.io/`
/// ones left out), compared when a CreateVolume of the same name comes again. The
/// volumes of one StorageClass carry the same few parameters, so equal sets share one
/// map: a volume holds a pointer, not a map of its own (about 700 bytes of heap with
/// two parameters). Stored, shown and compared as the plain map.
#[derive(Clone, PartialEq, Eq)]
pub struct Parameters(Arc<BTreeMap<String, String>>);

impl Parameters {
    /// The shared map equal to `map`: the one already held by another volume, else
    /// `map` itself, from now on shared.
    fn shared(map: BTreeMap<String, String>) -> Parameters {
        // Every distinct set in use, weakly: a set no volume holds any more is dropped
        // here on the next lookup. Parameters are checked before a volume is made (known
        // keys and values only), so there are only ever a few sets.
        static SETS: Mutex<Vec<Weak<BTreeMap<String, String>>>> = Mutex::new(Vec::new());
        let mut sets = SETS.lock().unwrap_or_else(PoisonError::into_inner);
        sets.retain(|w| w.strong_count() > 0);
        if let Some(held) = sets.iter().filter_map(Weak::upgrade).find(|held| **held == map) {
            return Parameters(held);
        }
        let new = Arc::new(map);
        sets.push(Arc::downgrade(&new));
        Parameters(new)
    }
}

impl Default for Parameters {
    fn default() -> Parameters {
        Parameters::shared(BTreeMap::new())
    }
}

impl From<BTreeMap<String, String>> for Parameters {
    fn from(map: BTreeMap<String, String>) -> Parameters {
        Parameters::shared(map)
    }
}

impl FromIterator<(String, String)> for Parameters {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Parameters {
        Parameters::shared(iter.into_iter().collect())
    }
}

impl std::ops::Deref for Parameters {
    type Target = BTreeMap<String, String>;
    fn deref(&self) -> &BTreeMap<String, String> {
        &self.0
    }
}

impl std::fmt::Debug for Parameters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl Serialize for Parameters {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Parameters {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Parameters, D::Error> {
        BTreeMap::deserialize(d).map(Parameters::shared)
    }
}

impl VolumeRecord {
    /// Whether its StorageClass asked for encryption (`drivelet.io/encryption: fscrypt`):
    /// then its data directory is encrypted under a key kept wrapped in its partition.
    pub fn encrypted(&self) -> bool {
        crate::words::encryption::Encryption::of(self.parameters.iter()) == crate::words::encryption::Encryption::Fscrypt
    }

    /// A record with nothing placed, staged, published, formatted or flagged: where every
    /// record starts (a volume just placed, adopted, or rebuilt from a GPT). The caller
    /// sets what its volume has besides.
    pub fn new(id: String, name: String, state: VolumeState, created_unix: u64) -> VolumeRecord {
        VolumeRecord {
            id,
            name,
            drive_id: String::new(),
            part_guid: uuid::Uuid::nil(),
            start: 0,
            size: 0,
            layout: LayoutKind::Partition,
            media: Media::Virtual,
            block: false,
            fs_type: String::new(),
            parameters: Parameters::default(),
            binding: Default::default(),
            state,
            formatted: false,
            staging: None,
            targets: BTreeMap::new(),
            created_unix,
            rebuilt: false,
            failed: false,
            published_node: None,
            adopted: None,
            lost: false,
            clone_of: None,
            restored_from: None,
            copied_in_use: None,
            snapshot: None,
            moving: None,
        }
    }

    /// Whether this record is a volume (not a snapshot).
    pub fn is_volume(&self) -> bool {
        self.snapshot.is_none()
    }

    /// Published targets that are confirmed.
    pub fn published_targets(&self) -> usize {
        self.targets.values().filter(|t| t.done).count()
    }
}

/// Capacity bounds of a CreateVolume call (bytes; 0 = not set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacityRange {
    /// At least this many bytes.
    pub required: u64,
    /// At most this many bytes.
    pub limit: u64,
}

impl CapacityRange {
    /// Whether an existing size satisfies the range.
    pub fn admits(&self, size: u64) -> bool {
        size >= self.required && (self.limit == 0 || size <= self.limit)
    }
}

/// Smallest volume of a kind: xfs needs 300 MiB, ext4 a few MiB, block one extent.
pub fn minimum_size(block: bool, fs: &str) -> u64 {
    match (block, fs) {
        (true, _) => gpt::ALIGN,
        (false, "xfs") => 300 << 20,
        _ => 16 << 20,
    }
}

/// The partition size for a range: `required` rounded up to the alignment (the
/// default size when nothing is asked), at least `minimum`, within `limit`.
pub fn size_for(range: CapacityRange, default: u64, minimum: u64) -> Result<u64, String> {
    let al = gpt::ALIGN;
    if range.limit != 0 && range.limit < range.required {
        return Err(format!("limit_bytes {} is below required_bytes {}", range.limit, range.required));
    }
    let want = if range.required == 0 {
        if range.limit != 0 { default.min(range.limit) } else { default }
    } else {
        range.required
    };
    let size = want
        .max(minimum)
        .div_ceil(al)
        .checked_mul(al)
        .ok_or_else(|| format!("required_bytes {} is larger than any drive", range.required))?;
    if range.limit != 0 && size > range.limit {
        return Err(format!(
            "the smallest aligned size that fits is {size} bytes (1 MiB alignment, minimum {minimum}), above limit_bytes {}",
            range.limit
        ));
    }
    Ok(size)
}

/// How far a volume at `start` can grow in place: up to the first extent in use that
/// begins at or after its end, or the end of the usable region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrowRoom {
    /// The largest size the volume can take.
    pub max_size: u64,
    /// Another extent (a volume or foreign partition) sets the limit, not the end of
    /// the drive: deleting it would make room.
    pub blocked: bool,
}

/// See [`GrowRoom`]. `others` are the drive's other used extents `(start, len)`.
pub fn grow_room(start: u64, size: u64, others: &[(u64, u64)], region_end: u64) -> GrowRoom {
    let end = start.saturating_add(size);
    let next = others.iter().map(|(s, _)| *s).filter(|s| *s >= end).min();
    match next {
        Some(n) if n < region_end => GrowRoom { max_size: n - start, blocked: true },
        _ => GrowRoom { max_size: region_end.saturating_sub(start), blocked: false },
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn grow_room_ends_at_the_next_extent_or_the_drive() {
        const M: u64 = 1 << 20;
        // (start, size, others, region end) -> (max size, blocked)
        let table: [(u64, u64, &[(u64, u64)], u64, u64, bool); 5] = [
            (M, 10 * M, &[], 100 * M, 99 * M, false),
            (M, 10 * M, &[(20 * M, 5 * M)], 100 * M, 19 * M, true),
            (M, 10 * M, &[(11 * M, 5 * M), (50 * M, M)], 100 * M, 10 * M, true),
            (30 * M, 10 * M, &[(M, 5 * M)], 100 * M, 70 * M, false),
            (M, 99 * M, &[], 100 * M, 99 * M, false),
        ];
        for (start, size, others, end, max_size, blocked) in table {
            assert_eq!(grow_room(start, size, others, end), GrowRoom { max_size, blocked }, "{start}+{size} among {others:?}");
        }
    }

    use super::*;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn the_transition_table_holds() {
        use Op::*;
        use VolumeState::*;
        let ok = [
            (Creating, CreateDone, Available),
            (Available, Stage, Staged),
            (Staged, Stage, Staged),
            (Staged, Publish, Published),
            (Published, Publish, Published),
            (Published, Unpublish { remaining: 1 }, Published),
            (Published, Unpublish { remaining: 0 }, Staged),
            (Staged, Unpublish { remaining: 0 }, Staged),
            (Staged, Unstage, Available),
            (Available, Unstage, Available),
            (Available, Delete, Deleting),
            (Creating, Delete, Deleting),
            (Deleting, Delete, Deleting),
        ];
        for (s, op, want) in ok {
            assert_eq!(next(s, op), Ok(want), "{s:?} {op:?}");
        }
        let refused = [
            (Available, Publish, Refusal::NotStaged),
            (Published, Unstage, Refusal::StillPublished),
            (Staged, Delete, Refusal::StillStaged),
            (Published, Delete, Refusal::StillPublished),
            (Creating, Stage, Refusal::BeingCreated),
            (Deleting, Stage, Refusal::BeingDeleted),
            (Deleting, Publish, Refusal::BeingDeleted),
        ];
        for (s, op, why) in refused {
            assert_eq!(next(s, op), Err(why), "{s:?} {op:?}");
        }
    }

    #[test]
    fn sizes_round_up_to_the_alignment_and_respect_the_limit() {
        let r = |required, limit| CapacityRange { required, limit };
        assert_eq!(size_for(r(0, 0), GIB, MIB), Ok(GIB));
        assert_eq!(size_for(r(0, 100 * MIB), GIB, MIB), Ok(100 * MIB));
        assert_eq!(size_for(r(MIB + 1, 0), GIB, MIB), Ok(2 * MIB));
        assert_eq!(size_for(r(MIB + 1, 3 * MIB), GIB, MIB), Ok(2 * MIB));
        assert_eq!(size_for(r(10 * MIB, 0), GIB, 300 * MIB), Ok(300 * MIB));
        assert!(size_for(r(MIB + 1, MIB + 100), GIB, MIB).is_err());
        assert!(size_for(r(10 * MIB, 5 * MIB), GIB, MIB).is_err());
        assert!(size_for(r(10 * MIB, 100 * MIB), GIB, 300 * MIB).is_err());
        assert!(size_for(r(u64::MAX, 0), GIB, MIB).is_err());
        assert_eq!(size_for(r(i64::MAX as u64, 0), GIB, MIB), Ok(1 << 63));
    }

    #[test]
    fn volumes_of_one_storage_class_share_their_parameters_stored_as_a_plain_map() {
        let class = |media: &str| -> Parameters {
            [("layout", "partition"), ("media", media)].into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        let (a, b, other) = (class("ssd"), class("ssd"), class("hdd"));
        assert!(Arc::ptr_eq(&a.0, &b.0), "equal sets are one map");
        assert!(!Arc::ptr_eq(&a.0, &other.0));
        assert_eq!(a, b);
        assert_ne!(a, other);
        assert!(Arc::ptr_eq(&Parameters::default().0, &Parameters::from(BTreeMap::new()).0));

        // The store's format is the map's: records written before read back, and equal.
        let plain: BTreeMap<String, String> = a.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, serde_json::to_string(&plain).unwrap());
        let back: Parameters = serde_json::from_str(&json).unwrap();
        assert!(Arc::ptr_eq(&back.0, &a.0), "a record read from the store shares the set too");
        assert_eq!(format!("{a:?}"), format!("{plain:?}"));

        // A set no volume holds any more is let go (a value no other test uses).
        let lone = class("only-this-test");
        let gone = Arc::downgrade(&lone.0);
        drop(lone);
        let _ = class("ssd");
        assert_eq!(gone.strong_count(), 0);
        assert!(!class("only-this-test").is_empty());
    }
}
