//! The note a snapshot partition carries of itself, so a snapshot is rebuilt from its
//! drive alone when the store is lost, and a half-made one is known as such.
//!
//! Rules:
//! - a snapshot partition is the copied data (`restore_size` bytes from its start) and
//!   one more [`crate::disk::gpt::ALIGN`] of its own; the note sits at the start of that
//!   last part, one 4 KiB block: a magic, a version, the length and CRC-32 of a JSON body;
//! - the note is written and flushed after the copy is complete and flushed, so a note
//!   that reads back whole means a whole snapshot; anything else (no magic, a bad CRC,
//!   a body that does not parse) means a snapshot that was never finished;
//! - the note is read and written with O_DIRECT, past any cache of the device.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::DiskError;

/// The first bytes of a note.
const MAGIC: &[u8; 8] = b"DRVLSNAP";
/// The note's format.
const VERSION: u32 = 1;
/// Bytes of a note.
pub const NOTE_LEN: usize = 4096;

/// What a snapshot says of itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotNote {
    /// CSI snapshot name (whole, not the GPT label's shortened one).
    pub name: String,
    /// The volume it was taken of.
    pub source_volume_id: String,
    /// Bytes of data: the source's size when taken.
    pub restore_size: u64,
    /// A block volume's bytes (else a filesystem).
    pub block: bool,
    /// The filesystem copied (empty for block, or a source never formatted).
    pub fs_type: String,
    /// When it was taken, nanoseconds since the epoch.
    pub created_unix_nanos: i64,
}

/// A 4 KiB-aligned buffer for O_DIRECT.
#[repr(C, align(4096))]
struct Block([u8; NOTE_LEN]);

/// Encodes a note into its block; `None` if its body does not fit.
pub fn encode(note: &SnapshotNote) -> Option<Vec<u8>> {
    let body = serde_json::to_vec(note).ok()?;
    if body.len() > NOTE_LEN - 20 {
        return None;
    }
    let mut b = vec![0u8; NOTE_LEN];
    b[..8].copy_from_slice(MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&(body.len() as u32).to_le_bytes());
    b[16..20].copy_from_slice(&super::clean::crc32(&body).to_le_bytes());
    b[20..20 + body.len()].copy_from_slice(&body);
    Some(b)
}

/// Decodes a block; `None` unless it is a whole note.
pub fn decode(b: &[u8]) -> Option<SnapshotNote> {
    if b.len() < 20 || &b[..8] != MAGIC {
        return None;
    }
    let le = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let len = le(12) as usize;
    if le(8) != VERSION || len > b.len() - 20 {
        return None;
    }
    let body = &b[20..20 + len];
    if super::clean::crc32(body) != le(16) {
        return None;
    }
    serde_json::from_slice(body).ok()
}

/// Writes `note` at byte `at` of the partition `dev` and flushes it.
pub fn write(dev: &Path, at: u64, note: &SnapshotNote) -> Result<(), DiskError> {
    let bytes = encode(note).ok_or_else(|| DiskError::invalid(format!("the note of snapshot {} does not fit in {NOTE_LEN} bytes", note.name)))?;
    let mut block = Box::new(Block([0u8; NOTE_LEN]));
    block.0.copy_from_slice(&bytes);
    let f = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
        .open(dev)
        .map_err(DiskError::io(format!("open {}", dev.display())))?;
    f.write_all_at(&block.0, at).map_err(DiskError::io(format!("write the snapshot note on {} at byte {at}", dev.display())))?;
    f.sync_all().map_err(DiskError::io(format!("fsync {}", dev.display())))
}

/// Reads the note at byte `at` of the partition `dev`: `Ok(None)` when there is no
/// whole note there.
pub fn read(dev: &Path, at: u64) -> Result<Option<SnapshotNote>, DiskError> {
    let mut block = Box::new(Block([0u8; NOTE_LEN]));
    let f = File::options()
        .read(true)
        .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
        .open(dev)
        .map_err(DiskError::io(format!("open {}", dev.display())))?;
    match f.read_exact_at(&mut block.0, at) {
        Ok(()) => Ok(decode(&block.0)),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(DiskError::io(format!("read the snapshot note on {} at byte {at}", dev.display()))(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note() -> SnapshotNote {
        SnapshotNote {
            name: "snapshot-1".into(),
            source_volume_id: "v1".into(),
            restore_size: 1 << 30,
            block: false,
            fs_type: "ext4".into(),
            created_unix_nanos: 1_700_000_000_000_000_000,
        }
    }

    #[test]
    fn a_note_round_trips_and_any_damage_makes_it_no_note() {
        let b = encode(&note()).unwrap();
        assert_eq!(b.len(), NOTE_LEN);
        assert_eq!(decode(&b), Some(note()));
        for i in [0, 9, 13, 17, 25] {
            let mut d = b.clone();
            d[i] ^= 1;
            assert_eq!(decode(&d), None, "byte {i} flipped");
        }
        assert_eq!(decode(&[0u8; NOTE_LEN]), None);
        let long = SnapshotNote { name: "x".repeat(NOTE_LEN), ..note() };
        assert!(encode(&long).is_none());
    }
}
