//! The note every drivelet disk carries of itself: who owns it (a node of a cluster)
//! and, for each volume on it, what it is and which claim it serves. The disk is the
//! source of truth for its data's identity; a node's state dir and the cluster's objects
//! are caches that can be rebuilt from it.
//!
//! Rules:
//! - the note lives in drivelet's reserved first MiB, in two slots ([`SLOTS`]) between
//!   the primary GPT (of either sector size, up to 256 entries) and the journal of dirty
//!   extents ([`super::clean`]); neither `blkid`, the kernel nor `sfdisk` looks there;
//! - each slot holds a header (magic, version, body length, sequence number, the disk
//!   GUID of the table it belongs to, a CRC-32 over header and body) and a JSON body;
//!   a reader takes the valid slot of this table with the highest sequence, a writer
//!   the other slot, so a write cut short (kill -9, power) leaves the previous note;
//! - a note of another table (another disk GUID: the disk was wiped and given a new
//!   table) is no note of this one;
//! - a slot with the magic that fails any check (torn, corrupt, a newer version) makes
//!   the note [`NoteState::Unreadable`] unless the other slot holds a valid note: a
//!   disk whose owner cannot be read is nobody's to take;
//! - every length read from the disk is bounded before anything is allocated for it
//!   ([`SLOT_LEN`], [`MAX_VOLUMES`]); names and ids read from a note are data, never
//!   paths: a volume id must be a UUID;
//! - the owner decision ([`verdict`]) is one pure function: the drive inventory's
//!   classification applies it with what this node's store knows, the writer's refusal
//!   with `known = true` (it has no store), so the writer refuses another owner's note
//!   and an unreadable one, and a disk with partitions and no note that this node does
//!   not know is kept from writes by its class (`owned-elsewhere`) only; see
//!   `actors::inventory::classify`.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::words::{Binding, DriveOwner, HeldVolume, Owner};

/// Byte offsets of the two note slots: past a primary GPT of 256 entries of 4 KiB
/// sectors (40 KiB), before the journal of dirty extents (512 KiB).
pub const SLOTS: [u64; 2] = [64 << 10, 288 << 10];

/// Longest a slot may be (header and body).
pub const SLOT_LEN: usize = 224 << 10;

/// Most volume entries a note may hold (a GPT of drivelet's holds fewer).
pub const MAX_VOLUMES: usize = 1024;

const MAGIC: &[u8; 8] = b"DRVLNOTE";
const VERSION: u32 = 1;
const HEADER: usize = 64;
const BLOCK: usize = 4096;

/// What a disk says of itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskNote {
    /// Who owns the disk.
    pub owner: Owner,
    /// Who owned it before it was last adopted, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopted_from: Option<Owner>,
    /// The volumes and snapshots on it, by partition GUID.
    #[serde(default)]
    pub volumes: Vec<VolumeNote>,
}

/// What a volume (or snapshot) on a disk is, as its note keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeNote {
    /// The volume id, which is its partition GUID.
    pub id: Uuid,
    /// The CSI name it was created with (the whole name, not the GPT label's).
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Block access (else a filesystem).
    #[serde(default)]
    pub block: bool,
    /// The filesystem drivelet made or will make (empty for block). Whether it was made
    /// yet is the disk's to say: a volume rebuilt from its note is probed for it.
    #[serde(default)]
    pub fs_type: String,
    /// Unix time of creation.
    #[serde(default)]
    pub created_unix: u64,
    /// The StorageClass parameters it was created with.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: BTreeMap<String, String>,
    /// A snapshot, not a volume.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub snapshot: bool,
    /// Its PV and claim.
    #[serde(default, skip_serializing_if = "Binding::is_empty")]
    pub binding: Binding,
}

/// One slot as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot {
    /// No magic: nothing was ever written there.
    Empty,
    /// The magic, and a failed check (in words).
    Bad(String),
    /// A whole note.
    Valid {
        /// Sequence number.
        seq: u64,
        /// Disk GUID of the table it belongs to.
        disk_guid: Uuid,
        /// The note.
        note: DiskNote,
    },
}

/// What a disk's note is, for its table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoteState {
    /// No note of this table.
    Absent,
    /// A note that cannot be read (why, in words).
    Unreadable(String),
    /// The current note.
    Note(DiskNote),
}

/// Encodes a note for the slot of sequence `seq`, padded to whole 4 KiB blocks; an
/// error in words when it does not fit.
pub fn encode(note: &DiskNote, seq: u64, disk_guid: Uuid) -> Result<Vec<u8>, String> {
    if note.volumes.len() > MAX_VOLUMES {
        return Err(format!("{} volumes are more than a note holds ({MAX_VOLUMES})", note.volumes.len()));
    }
    let body = serde_json::to_vec(note).map_err(|e| format!("cannot encode the note: {e}"))?;
    if body.len() > SLOT_LEN - HEADER {
        return Err(format!("the note is {} bytes, more than a slot holds ({})", body.len(), SLOT_LEN - HEADER));
    }
    let used = HEADER + body.len();
    let mut b = vec![0u8; used.div_ceil(BLOCK) * BLOCK];
    b[..8].copy_from_slice(MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&(body.len() as u32).to_le_bytes());
    b[16..24].copy_from_slice(&seq.to_le_bytes());
    b[24..40].copy_from_slice(disk_guid.as_bytes());
    b[HEADER..used].copy_from_slice(&body);
    let crc = super::clean::crc32(&b[..used]);
    b[40..44].copy_from_slice(&crc.to_le_bytes());
    Ok(b)
}

/// The body length a slot's header announces, bounded: `None` without the magic.
fn body_len(head: &[u8]) -> Option<usize> {
    if head.len() < HEADER || &head[..8] != MAGIC {
        return None;
    }
    Some(u32::from_le_bytes([head[12], head[13], head[14], head[15]]) as usize)
}

/// Decodes a slot's bytes (at least its header; the body as long as announced).
pub fn decode(bytes: &[u8]) -> Slot {
    let Some(len) = body_len(bytes) else { return Slot::Empty };
    let le32 = |o: usize| u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
    let version = le32(8);
    if version != VERSION {
        return Slot::Bad(format!("a note of format {version}, which this drivelet does not know (it knows {VERSION})"));
    }
    if len > SLOT_LEN - HEADER || HEADER + len > bytes.len() {
        return Slot::Bad(format!("a note that says it is {len} bytes long, which its slot cannot hold"));
    }
    let used = HEADER + len;
    let mut check = bytes[..used].to_vec();
    check[40..44].fill(0);
    if super::clean::crc32(&check) != le32(40) {
        return Slot::Bad("a note whose checksum does not match (torn or corrupt)".into());
    }
    let seq = u64::from_le_bytes([bytes[16], bytes[17], bytes[18], bytes[19], bytes[20], bytes[21], bytes[22], bytes[23]]);
    let mut guid = [0u8; 16];
    guid.copy_from_slice(&bytes[24..40]);
    let note: DiskNote = match serde_json::from_slice(&bytes[HEADER..used]) {
        Ok(n) => n,
        Err(e) => return Slot::Bad(format!("a note whose body cannot be read ({e})")),
    };
    if note.volumes.len() > MAX_VOLUMES {
        return Slot::Bad(format!("a note listing {} volumes, more than {MAX_VOLUMES}", note.volumes.len()));
    }
    if !plain(&note) {
        return Slot::Bad("a note whose names hold control characters".into());
    }
    Slot::Valid { seq, disk_guid: Uuid::from_bytes(guid), note }
}

/// Whether every name in `n` is free of control characters: names read from a disk are
/// shown to admins in tables and reasons, where a newline or an escape would forge
/// lines. drivelet never writes such a name (CSI names and Kubernetes names have none).
fn plain(n: &DiskNote) -> bool {
    let ok = |s: &str| !s.chars().any(char::is_control);
    let mut owners = std::iter::once(&n.owner).chain(n.adopted_from.iter());
    owners.all(|o| ok(&o.cluster) && ok(&o.node))
        && n.volumes.iter().all(|v| {
            let b = &v.binding;
            [v.name.as_str(), &v.fs_type, &b.pv, &b.claim_namespace, &b.claim_name, &b.claim_uid, &b.storage_class].into_iter().all(ok)
                && v.parameters.iter().all(|(k, val)| ok(k) && ok(val))
        })
}

/// Reads both slots through `file`: the header first, then only as much as it
/// announces, bounded by [`SLOT_LEN`].
pub fn read_slots(file: &File) -> [Slot; 2] {
    SLOTS.map(|at| {
        let mut head = vec![0u8; BLOCK];
        if let Err(e) = file.read_exact_at(&mut head, at) {
            return Slot::Bad(format!("the note cannot be read ({e})"));
        }
        let Some(len) = body_len(&head) else { return Slot::Empty };
        let want = (HEADER + len.min(SLOT_LEN - HEADER)).div_ceil(BLOCK) * BLOCK;
        if want > head.len() {
            head = vec![0u8; want];
            if let Err(e) = file.read_exact_at(&mut head, at) {
                return Slot::Bad(format!("the note cannot be read ({e})"));
            }
        }
        decode(&head)
    })
}

/// The note of the table with `disk_guid`, from its two slots (see the rules).
pub fn state_of(slots: &[Slot], disk_guid: Uuid) -> NoteState {
    let best = slots
        .iter()
        .filter_map(|s| match s {
            Slot::Valid { seq, disk_guid: g, note } if *g == disk_guid => Some((*seq, note)),
            _ => None,
        })
        .max_by_key(|(seq, _)| *seq);
    if let Some((_, note)) = best {
        return NoteState::Note(note.clone());
    }
    match slots.iter().find_map(|s| if let Slot::Bad(why) = s { Some(why) } else { None }) {
        Some(why) => NoteState::Unreadable(why.clone()),
        None => NoteState::Absent,
    }
}

/// Where the next note of the table with `disk_guid` goes after `slots`: the slot not
/// holding its current note, with a sequence number above every valid slot's (a stale
/// note of an earlier table included).
fn next_write(slots: &[Slot], disk_guid: Uuid) -> (usize, u64) {
    let seq = slots.iter().filter_map(|s| if let Slot::Valid { seq, .. } = s { Some(*seq) } else { None }).max().map_or(1, |s| s + 1);
    let current = slots
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s {
            Slot::Valid { seq, disk_guid: g, .. } if *g == disk_guid => Some((*seq, i)),
            _ => None,
        })
        .max()
        .map(|(_, i)| i);
    (current.map_or(0, |i| 1 - i), seq)
}

/// The offset and bytes of the next write of `note` for the table with `disk_guid`,
/// given the slots as read now.
pub fn prepare(slots: &[Slot], disk_guid: Uuid, note: &DiskNote) -> Result<(u64, Vec<u8>), String> {
    let (slot, seq) = next_write(slots, disk_guid);
    Ok((SLOTS[slot], encode(note, seq, disk_guid)?))
}

/// This process's own identity, set once at start ([`set_identity`]).
static IDENTITY: OnceLock<Owner> = OnceLock::new();

/// Sets who this process is; the first call wins (a second, different one is an error).
pub fn set_identity(me: Owner) -> Result<(), Owner> {
    let set = IDENTITY.get_or_init(|| me.clone());
    if *set == me { Ok(()) } else { Err(set.clone()) }
}

/// Who this process is, once set. Unset only in unit tests of the disk layer, which
/// then write no notes.
pub fn identity() -> Option<&'static Owner> {
    IDENTITY.get()
}

/// Whether this node may write to a drivelet disk with note `state`, which holds
/// `volumes` drivelet partitions, and what it is: the one decision the inventory's
/// classification and the writer apply. `known`: this node's store has records of the
/// disk (a disk of its own from before notes); the writer passes `true`, as it cannot
/// tell, so for a disk with no note only the classification's answer counts.
pub fn verdict(state: &NoteState, me: &Owner, volumes: usize, known: bool) -> Verdict {
    match state {
        NoteState::Note(n) if n.owner == *me => Verdict::Ours,
        NoteState::Note(n) => Verdict::Elsewhere(DriveOwner::Elsewhere { owner: n.owner.clone(), volumes: held(n) }),
        NoteState::Unreadable(why) => Verdict::Elsewhere(DriveOwner::Unreadable { reason: why.clone() }),
        NoteState::Absent if volumes == 0 || known => Verdict::Claim,
        NoteState::Absent => Verdict::Elsewhere(DriveOwner::NoNote),
    }
}

/// The answer of [`verdict`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// This node's: its note names this node of this cluster.
    Ours,
    /// This node's to take: no note, and nothing on it this node does not know; it gets
    /// a note naming this node with its next write.
    Claim,
    /// Someone else's, or nobody can tell: never written, placed on, cleaned or served.
    Elsewhere(DriveOwner),
}

/// Whose a disk is, in words an admin reads ("belongs to node node-2 of this cluster").
pub fn whose(o: &DriveOwner, me: &Owner) -> String {
    match o {
        DriveOwner::Elsewhere { owner, .. } => format!("belongs to {}", owner.words(me)),
        DriveOwner::NoNote => "carries drivelet volumes but no note of whose they are (written by a drivelet from before disks named their owner, or not by drivelet)".into(),
        DriveOwner::Unreadable { reason } => format!("carries a note of its owner that cannot be read: {reason}"),
        DriveOwner::Ours => format!("belongs to {}", me.words(me)),
        DriveOwner::Unknown => "has no owner drivelet can tell".into(),
    }
}

/// What a note says its volumes are, for listings.
pub fn held(n: &DiskNote) -> Vec<HeldVolume> {
    n.volumes
        .iter()
        .filter(|v| !v.snapshot)
        .map(|v| HeldVolume {
            id: v.id.to_string(),
            size_bytes: v.size,
            claim: v.binding.claim(),
            pv: (!v.binding.pv.is_empty()).then(|| v.binding.pv.clone()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn me() -> Owner {
        Owner { cluster: "c1".into(), node: "node-1".into() }
    }

    fn note(node: &str, n: usize) -> DiskNote {
        DiskNote {
            owner: Owner { cluster: "c1".into(), node: node.into() },
            adopted_from: None,
            volumes: (0..n)
                .map(|i| VolumeNote {
                    id: Uuid::from_u128(i as u128 + 1),
                    name: format!("pvc-{i}"),
                    size: 32 << 20,
                    block: i % 2 == 0,
                    fs_type: if i % 2 == 0 { String::new() } else { "ext4".into() },
                    created_unix: 1_700_000_000,
                    parameters: BTreeMap::new(),
                    snapshot: false,
                    binding: Binding {
                        pv: format!("pvc-{i}"),
                        claim_namespace: "default".into(),
                        claim_name: format!("data-{i}"),
                        claim_uid: "8d3c6f9e-0000-4000-8000-000000000000".into(),
                        storage_class: "drivelet-virtual".into(),
                    },
                })
                .collect(),
        }
    }

    #[test]
    fn round_trip_and_slot_choice() {
        let g = Uuid::from_u128(7);
        let n = note("node-1", 3);
        let b = encode(&n, 5, g).unwrap();
        assert_eq!(b.len() % BLOCK, 0);
        assert_eq!(decode(&b), Slot::Valid { seq: 5, disk_guid: g, note: n.clone() });
        // The higher sequence wins; a torn newer slot leaves the older readable.
        let older = Slot::Valid { seq: 4, disk_guid: g, note: note("node-1", 1) };
        let newer = Slot::Valid { seq: 5, disk_guid: g, note: n.clone() };
        assert_eq!(state_of(&[older.clone(), newer], g), NoteState::Note(n));
        assert_eq!(state_of(&[older, Slot::Bad("torn".into())], g), NoteState::Note(note("node-1", 1)));
        // The next write goes beside the current note of this table, above every seq.
        let stale = Slot::Valid { seq: 9, disk_guid: Uuid::from_u128(8), note: note("x", 0) };
        let ours = Slot::Valid { seq: 1, disk_guid: g, note: note("node-1", 0) };
        assert_eq!(next_write(&[Slot::Empty, stale.clone()], g), (0, 10));
        assert_eq!(next_write(&[stale.clone(), ours.clone()], g), (0, 10));
        assert_eq!(next_write(&[ours, stale], g), (1, 10));
    }

    #[test]
    fn a_note_of_another_table_is_none_and_a_bad_one_unreadable() {
        let g = Uuid::from_u128(7);
        let other = Slot::Valid { seq: 3, disk_guid: Uuid::from_u128(8), note: note("node-2", 1) };
        assert_eq!(state_of(&[other.clone(), Slot::Empty], g), NoteState::Absent);
        assert!(matches!(state_of(&[other, Slot::Bad("x".into())], g), NoteState::Unreadable(_)));
        let mut b = encode(&note("node-1", 2), 1, g).unwrap();
        b[HEADER + 3] ^= 1;
        assert!(matches!(decode(&b), Slot::Bad(w) if w.contains("checksum")));
        let mut b = encode(&note("node-1", 2), 1, g).unwrap();
        b[8] = 9;
        assert!(matches!(decode(&b), Slot::Bad(w) if w.contains("format 9")));
    }

    #[test]
    fn verdicts() {
        let cases: Vec<(&str, NoteState, usize, bool, &str)> = vec![
            ("our note", NoteState::Note(note("node-1", 2)), 2, false, "ours"),
            ("another node's note", NoteState::Note(note("node-2", 2)), 2, false, "elsewhere"),
            ("another node's empty disk", NoteState::Note(note("node-2", 0)), 0, false, "elsewhere"),
            ("another cluster's", NoteState::Note(DiskNote { owner: Owner { cluster: "c2".into(), node: "node-1".into() }, ..note("x", 0) }), 0, false, "elsewhere"),
            ("unreadable", NoteState::Unreadable("torn".into()), 0, true, "elsewhere"),
            ("no note, nothing on it", NoteState::Absent, 0, false, "claim"),
            ("no note, volumes this node knows", NoteState::Absent, 3, true, "claim"),
            ("no note, volumes nobody here knows", NoteState::Absent, 3, false, "elsewhere"),
        ];
        for (what, st, vols, known, want) in cases {
            let got = match verdict(&st, &me(), vols, known) {
                Verdict::Ours => "ours",
                Verdict::Claim => "claim",
                Verdict::Elsewhere(_) => "elsewhere",
            };
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn too_many_volumes_or_bytes_do_not_encode() {
        assert!(encode(&note("n", MAX_VOLUMES + 1), 1, Uuid::nil()).is_err());
        let mut n = note("n", 1);
        n.volumes[0].name = "x".repeat(SLOT_LEN);
        assert!(encode(&n, 1, Uuid::nil()).is_err());
        // 250 volumes with full bindings fit.
        assert!(encode(&note("node-1", 250), 1, Uuid::nil()).is_ok());
    }

    #[test]
    fn a_hostile_body_is_data() {
        // A note naming paths and control characters decodes as plain strings; the
        // volume id must be a UUID.
        let g = Uuid::from_u128(1);
        let mut n = note("../../../../etc", 1);
        n.volumes[0].name = "../../../../etc/passwd".into();
        let b = encode(&n, 1, g).unwrap();
        assert!(matches!(decode(&b), Slot::Valid { note, .. } if note.volumes[0].name.contains("passwd")));
        // A name that would forge a line in a table or a reason: no note to trust.
        n.volumes[0].binding.claim_name = "data\nnode-1  managed".into();
        assert!(matches!(decode(&encode(&n, 1, g).unwrap()), Slot::Bad(w) if w.contains("control characters")));
        let body = br#"{"owner":{"cluster":"c","node":"n"},"volumes":[{"id":"../etc","name":"x","size":1}]}"#;
        let mut b = vec![0u8; BLOCK];
        b[..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(body.len() as u32).to_le_bytes());
        b[HEADER..HEADER + body.len()].copy_from_slice(body);
        let crc = crate::disk::clean::crc32(&b[..HEADER + body.len()]);
        b[40..44].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(decode(&b), Slot::Bad(w) if w.contains("cannot be read")));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Any bytes: no panic, and a slot is valid only with magic, version and CRC.
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..9000), magic in any::<bool>(), len in any::<u32>()) {
            let mut b = bytes;
            if magic && b.len() >= HEADER {
                b[..8].copy_from_slice(MAGIC);
                b[8..12].copy_from_slice(&VERSION.to_le_bytes());
                b[12..16].copy_from_slice(&len.to_le_bytes());
            }
            if let Slot::Valid { note, .. } = decode(&b) {
                prop_assert!(note.volumes.len() <= MAX_VOLUMES);
            }
        }

        /// A valid note with any one byte changed is never read as another valid note.
        #[test]
        fn one_flipped_byte_is_caught(vols in 0usize..20, at in any::<prop::sample::Index>(), bit in 0u8..8) {
            let g = Uuid::from_u128(3);
            let n = note("node-1", vols);
            let mut b = encode(&n, 2, g).unwrap();
            let used = HEADER + u32::from_le_bytes([b[12], b[13], b[14], b[15]]) as usize;
            let i = at.index(used);
            b[i] ^= 1 << bit;
            match decode(&b) {
                Slot::Valid { .. } => prop_assert!(false, "a flipped byte at {} was not caught", i),
                Slot::Empty => prop_assert!(i < 8),
                Slot::Bad(_) => {}
            }
        }
    }
}
