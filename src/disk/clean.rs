//! Clean extents: the record, on each drive, of the space that may still hold a former
//! tenant's bytes ("dirty"), the arithmetic over it, and the zeroing that makes it clean.
//!
//! Rules:
//! - the record lives on the drive, in drivelet's own reserved first MiB (after the
//!   primary GPT, before the first partition): a journal of dirty extents in two slots
//!   ([`SLOTS`]), each with a sequence number, the disk GUID of the GPT it belongs to and
//!   a CRC; a reader takes the valid slot with the highest sequence, a writer the other
//!   one, so a write cut short leaves the previous journal readable. Neither `blkid`,
//!   the kernel nor `sfdisk` looks there, so a drive shows the same partitions as before;
//! - the journal is written in the same commit as the GPT change that frees an extent,
//!   before the commit's first flush, and the primary GPT copy (the one a reader
//!   trusts) is written only after that flush: a freed extent is never free in the
//!   table without being dirty in the journal;
//! - what is dirty ([`dirty_of`]): the journal's extents that are free in the table;
//!   with no valid journal (a drive written before journals existed, a torn pair, a
//!   journal of another table) every free extent is dirty: an unknown state is dirty;
//! - a blank drive (no table at all) holds whatever its last owner wrote: the caller
//!   decides by policy whether it is dirty; cleaning it writes a fresh drivelet GPT
//!   whose journal lists what is still dirty;
//! - zeroing ([`choose`]) uses the fastest primitive that guarantees zeros:
//!   BLKZEROOUT (write-zeroes offload where the device has it); BLKDISCARD only where
//!   reads after a discard are zeros (a loop device over a regular file punches holes;
//!   a device reporting `discard_zeroes_data`); plain `O_DIRECT` writes where the
//!   device offers no write-zeroes, or refuses BLKZEROOUT.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use uuid::Uuid;

use super::DiskError;

/// Byte offsets of the two journal slots on a drivelet drive: inside the first MiB,
/// which no partition ever takes ([`super::gpt::ALIGN`]), past the primary GPT of
/// either sector size.
pub const SLOTS: [u64; 2] = [512 << 10, 768 << 10];

/// Longest a slot may be.
pub const SLOT_LEN: u64 = 256 << 10;

const MAGIC: &[u8; 8] = b"DRVLDRTY";
const VERSION: u32 = 1;
const HEADER: usize = 64;
const ENTRY: usize = 16;

/// Most extents one journal holds.
pub const MAX_EXTENTS: usize = (SLOT_LEN as usize - HEADER) / ENTRY;

/// An extent `(start, len)` in bytes.
pub type Extent = (u64, u64);

/// The extents sorted, empty ones dropped, overlapping and adjacent ones merged; an
/// extent reaching past the last byte a u64 counts (read from a disk) ends there.
pub fn normalize(extents: &[Extent]) -> Vec<Extent> {
    let mut v: Vec<Extent> = extents.iter().map(|&(s, l)| (s, l.min(u64::MAX - s))).filter(|e| e.1 > 0).collect();
    v.sort_unstable();
    let mut out: Vec<Extent> = Vec::with_capacity(v.len());
    for (s, l) in v {
        match out.last_mut() {
            Some((ps, pl)) if s <= *ps + *pl => *pl = (*pl).max(s + l - *ps),
            _ => out.push((s, l)),
        }
    }
    out
}

/// `a` and `b` together, merged.
pub fn union(a: &[Extent], b: &[Extent]) -> Vec<Extent> {
    normalize(&[a, b].concat())
}

/// What of `a` lies outside `b`.
pub fn subtract(a: &[Extent], b: &[Extent]) -> Vec<Extent> {
    let b = normalize(b);
    let mut out = Vec::new();
    for (s, l) in normalize(a) {
        let (mut cur, end) = (s, s + l);
        for &(bs, bl) in &b {
            let be = bs + bl;
            if be <= cur || bs >= end {
                continue;
            }
            if bs > cur {
                out.push((cur, bs - cur));
            }
            cur = cur.max(be);
            if cur >= end {
                break;
            }
        }
        if cur < end {
            out.push((cur, end - cur));
        }
    }
    out
}

/// What of `a` lies inside `b`.
pub fn intersect(a: &[Extent], b: &[Extent]) -> Vec<Extent> {
    let outside = subtract(a, b);
    subtract(a, &outside)
}

/// Total bytes of `extents` (merged first).
pub fn total(extents: &[Extent]) -> u64 {
    normalize(extents).iter().map(|e| e.1).sum()
}

/// What is dirty on a drive whose table leaves `free` unused, given its journal
/// (`None`: no valid journal, so every free byte is dirty).
pub fn dirty_of(journal: Option<&[Extent]>, free: &[Extent]) -> Vec<Extent> {
    match journal {
        Some(j) => intersect(j, free),
        None => normalize(free),
    }
}

/// CRC-32 (ISO-HDLC, as GPT uses).
pub(crate) fn crc32(bytes: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let t = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 == 1 { (c >> 1) ^ 0xEDB8_8320 } else { c >> 1 };
            }
            *e = c;
        }
        t
    });
    let mut c = !0u32;
    for b in bytes {
        c = t[((c ^ u32::from(*b)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

/// A journal as read from or written to one slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Journal {
    /// Sequence number: the higher of two valid slots is the current one.
    pub seq: u64,
    /// Disk GUID of the GPT it belongs to.
    pub disk_guid: Uuid,
    /// Dirty extents, merged.
    pub dirty: Vec<Extent>,
}

impl Journal {
    /// The slot this journal is written to.
    pub fn slot(&self) -> u64 {
        SLOTS[(self.seq % 2) as usize]
    }

    /// The bytes of the slot, padded to whole 4 KiB blocks; `None` when it holds more
    /// extents than a slot can.
    pub fn encode(&self) -> Option<Vec<u8>> {
        if self.dirty.len() > MAX_EXTENTS {
            return None;
        }
        let used = HEADER + ENTRY * self.dirty.len();
        let mut b = vec![0u8; used.div_ceil(4096) * 4096];
        b[..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(self.dirty.len() as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..40].copy_from_slice(self.disk_guid.as_bytes());
        for (i, (s, l)) in self.dirty.iter().enumerate() {
            let at = HEADER + ENTRY * i;
            b[at..at + 8].copy_from_slice(&s.to_le_bytes());
            b[at + 8..at + 16].copy_from_slice(&l.to_le_bytes());
        }
        let crc = crc32(&b[..used]);
        b[40..44].copy_from_slice(&crc.to_le_bytes());
        Some(b)
    }

    /// The journal in a slot's bytes; `None` unless magic, version, length and CRC hold.
    pub fn decode(bytes: &[u8]) -> Option<Journal> {
        if bytes.len() < HEADER || &bytes[..8] != MAGIC {
            return None;
        }
        let le32 = |o: usize| u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
        let le64 = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap_or([0; 8]));
        let count = le32(12) as usize;
        if le32(8) != VERSION || count > MAX_EXTENTS || HEADER + ENTRY * count > bytes.len() {
            return None;
        }
        let used = HEADER + ENTRY * count;
        let mut check = bytes[..used].to_vec();
        check[40..44].fill(0);
        if crc32(&check) != le32(40) {
            return None;
        }
        let dirty = (0..count).map(|i| (le64(HEADER + ENTRY * i), le64(HEADER + ENTRY * i + 8))).collect::<Vec<_>>();
        Some(Journal { seq: le64(16), disk_guid: Uuid::from_bytes(bytes[24..40].try_into().ok()?), dirty: normalize(&dirty) })
    }
}

/// Of the two slots' bytes, the current journal of the table with `disk_guid`.
pub fn current(slots: &[Option<Journal>], disk_guid: Uuid) -> Option<&Journal> {
    slots.iter().flatten().filter(|j| j.disk_guid == disk_guid).max_by_key(|j| j.seq)
}

/// Reads both journal slots through `file` (`None` for a slot that cannot be read or
/// holds no valid journal).
pub fn read_slots(file: &File) -> Vec<Option<Journal>> {
    SLOTS
        .iter()
        .map(|&at| {
            let mut head = vec![0u8; 4096];
            file.read_exact_at(&mut head, at).ok()?;
            let count = u32::from_le_bytes([head[12], head[13], head[14], head[15]]) as usize;
            let used = HEADER + ENTRY * count.min(MAX_EXTENTS);
            if used > head.len() {
                head = vec![0u8; used.div_ceil(4096) * 4096];
                file.read_exact_at(&mut head, at).ok()?;
            }
            Journal::decode(&head)
        })
        .collect()
}

/// The next journal after `slots` for the table with `disk_guid`, listing `dirty`.
pub fn next_journal(slots: &[Option<Journal>], disk_guid: Uuid, dirty: Vec<Extent>) -> Journal {
    let seq = slots.iter().flatten().map(|j| j.seq).max().map_or(1, |s| s + 1);
    Journal { seq, disk_guid, dirty: normalize(&dirty) }
}

/// How a drive is zeroed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Primitive {
    /// `BLKZEROOUT`: the device's write-zeroes command where it has one.
    ZeroOut,
    /// `BLKDISCARD`: only where a discarded block reads back as zeros.
    Discard,
    /// Plain `O_DIRECT` writes of zeros.
    Write,
}

impl Primitive {
    /// The name in logs and documentation.
    pub fn as_str(self) -> &'static str {
        match self {
            Primitive::ZeroOut => "write-zeroes (BLKZEROOUT)",
            Primitive::Discard => "discard (BLKDISCARD)",
            Primitive::Write => "plain writes",
        }
    }
}

/// What the kernel says of a device's queue (`/sys/block/X/queue/...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueLimits {
    /// `write_zeroes_max_bytes`: 0 when the device has no write-zeroes command.
    pub write_zeroes_max_bytes: u64,
    /// `discard_max_bytes`: 0 when it cannot discard.
    pub discard_max_bytes: u64,
    /// `discard_zeroes_data` (always 0 on kernels since 4.12, kept for older ones).
    pub discard_zeroes_data: bool,
    /// A loop device whose backing file is a regular file: a discard punches a hole,
    /// which reads back as zeros.
    pub loop_over_file: bool,
}

/// The fastest primitive that guarantees zeros on a device with `q` (see the rules).
pub fn choose(q: QueueLimits) -> Primitive {
    let discard_zeroes = q.discard_max_bytes > 0 && (q.loop_over_file || q.discard_zeroes_data);
    if discard_zeroes {
        Primitive::Discard
    } else if q.write_zeroes_max_bytes > 0 {
        Primitive::ZeroOut
    } else {
        Primitive::Write
    }
}

/// What the kernel says of the queue of the whole disk `dev` (all zero where sysfs
/// cannot tell: plain writes then).
pub fn queue_limits(dev: &Path) -> QueueLimits {
    let Some((major, minor)) = super::block_devnum(dev) else { return QueueLimits::default() };
    let dir = std::path::PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let num = |a: &str| super::sysfs_attr(&dir.join("queue"), a).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let loop_over_file = super::sysfs_attr(&dir.join("loop"), "backing_file")
        .is_some_and(|f| std::fs::metadata(f.trim_end_matches(" (deleted)")).is_ok_and(|m| m.is_file()));
    QueueLimits {
        write_zeroes_max_bytes: num("write_zeroes_max_bytes"),
        discard_max_bytes: num("discard_max_bytes"),
        discard_zeroes_data: num("discard_zeroes_data") == 1,
        loop_over_file,
    }
}

/// The block-device ioctls that zero or discard a byte range.
mod ioctls {
    #![allow(missing_docs)]
    nix::ioctl_write_ptr_bad!(blkzeroout, 0x127f, [u64; 2]);
    nix::ioctl_write_ptr_bad!(blkdiscard, 0x1277, [u64; 2]);
}
use ioctls::{blkdiscard, blkzeroout};

/// Zeroes `[start, start+len)` of `dev` through `file` (open for writing) with `how`;
/// a device that refuses the ioctl is written to instead. Answers what was used.
pub fn zero(dev: &Path, file: &File, start: u64, len: u64, how: Primitive) -> Result<Primitive, DiskError> {
    let range = [start, len];
    let res = match how {
        // SAFETY: the fd is open for the call; the ioctls read two u64 from `range`.
        Primitive::ZeroOut => unsafe { blkzeroout(file.as_raw_fd(), &range) }.map(|_| how),
        // SAFETY: as above.
        Primitive::Discard => unsafe { blkdiscard(file.as_raw_fd(), &range) }.map(|_| how),
        Primitive::Write => Err(nix::errno::Errno::ENOTTY),
    };
    match res {
        Ok(p) => Ok(p),
        Err(e @ (nix::errno::Errno::EIO | nix::errno::Errno::ENXIO | nix::errno::Errno::ENODEV)) => {
            Err(DiskError::Io { what: format!("zero {} at byte {start}", dev.display()), source: e.into() })
        }
        Err(_) => write_zeros(dev, file, start, len).map(|_| Primitive::Write),
    }
}

/// Plain writes of zeros, 1 MiB at a time, straight to the device where it allows.
fn write_zeros(dev: &Path, file: &File, start: u64, len: u64) -> Result<(), DiskError> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let direct = fcntl(file, FcntlArg::F_GETFL).ok().map(OFlag::from_bits_truncate).is_some_and(|mut f| {
        f.insert(OFlag::O_DIRECT);
        fcntl(file, FcntlArg::F_SETFL(f)).is_ok()
    });
    super::fs::zero_ranges(dev, file, &[(start, len)])?;
    if !direct {
        file.sync_data().map_err(DiskError::io(format!("fsync {}", dev.display())))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB: u64 = 1 << 20;

    #[test]
    fn extents_merge_when_they_touch_or_overlap_and_stay_apart_otherwise() {
        // (input, merged)
        let cases: Vec<(Vec<Extent>, Vec<Extent>)> = vec![
            (vec![], vec![]),
            (vec![(MIB, 0)], vec![]),
            (vec![(2 * MIB, MIB), (MIB, MIB)], vec![(MIB, 2 * MIB)]),
            (vec![(MIB, 4 * MIB), (2 * MIB, MIB)], vec![(MIB, 4 * MIB)]),
            (vec![(MIB, MIB), (3 * MIB, MIB)], vec![(MIB, MIB), (3 * MIB, MIB)]),
            (vec![(MIB, 2 * MIB), (2 * MIB, 5 * MIB)], vec![(MIB, 6 * MIB)]),
        ];
        for (i, (input, want)) in cases.into_iter().enumerate() {
            assert_eq!(normalize(&input), want, "case {i}");
        }
    }

    #[test]
    fn an_extent_read_past_the_last_u64_byte_ends_there() {
        let end = u64::MAX;
        assert_eq!(normalize(&[(end - 10, 100), (end - 20, 5)]), vec![(end - 20, 5), (end - 10, 10)]);
        assert_eq!(subtract(&[(end - 10, u64::MAX)], &[(end - 5, 1)]), vec![(end - 10, 5), (end - 4, 4)]);
        assert_eq!(total(&[(end, 7)]), 0);
    }

    #[test]
    fn subtracting_cuts_holes_ends_and_whole_extents() {
        let a = vec![(MIB, 10 * MIB)];
        // (taken away, left)
        let cases: Vec<(Vec<Extent>, Vec<Extent>)> = vec![
            (vec![], vec![(MIB, 10 * MIB)]),
            (vec![(MIB, MIB)], vec![(2 * MIB, 9 * MIB)]),
            (vec![(10 * MIB, 5 * MIB)], vec![(MIB, 9 * MIB)]),
            (vec![(3 * MIB, 2 * MIB)], vec![(MIB, 2 * MIB), (5 * MIB, 6 * MIB)]),
            (vec![(0, 20 * MIB)], vec![]),
            (vec![(2 * MIB, MIB), (4 * MIB, MIB)], vec![(MIB, MIB), (3 * MIB, MIB), (5 * MIB, 6 * MIB)]),
            (vec![(20 * MIB, MIB)], vec![(MIB, 10 * MIB)]),
        ];
        for (i, (b, want)) in cases.into_iter().enumerate() {
            assert_eq!(subtract(&a, &b), want, "case {i}");
        }
        assert_eq!(intersect(&a, &[(0, 2 * MIB), (10 * MIB, 4 * MIB)]), vec![(MIB, MIB), (10 * MIB, MIB)]);
        assert_eq!(union(&[(MIB, MIB)], &[(2 * MIB, MIB)]), vec![(MIB, 2 * MIB)], "a freed extent next to a dirty one joins it");
        assert_eq!(total(&[(MIB, MIB), (MIB, 2 * MIB)]), 2 * MIB);
    }

    #[test]
    fn dirty_is_the_journal_within_free_space_or_all_free_space_when_unknown() {
        let free = vec![(MIB, 4 * MIB), (9 * MIB, 4 * MIB)];
        // No journal: every free byte may hold old data.
        assert_eq!(dirty_of(None, &free), free);
        // A journal naming space a partition took again (a commit cut short) counts only
        // what is free.
        assert_eq!(dirty_of(Some(&[(3 * MIB, 8 * MIB)]), &free), vec![(3 * MIB, 2 * MIB), (9 * MIB, 2 * MIB)]);
        assert_eq!(dirty_of(Some(&[]), &free), vec![]);
    }

    #[test]
    fn a_journal_round_trips_and_any_damage_makes_it_unreadable() {
        let g = Uuid::from_u128(0x6472766c_0000_4000_8000_000000000001);
        let j = Journal { seq: 7, disk_guid: g, dirty: vec![(MIB, MIB), (5 * MIB, 3 * MIB)] };
        let b = j.encode().unwrap();
        assert_eq!(b.len(), 4096);
        assert_eq!(Journal::decode(&b), Some(j.clone()));
        assert_eq!(j.slot(), SLOTS[1]);
        for at in [0, 9, 13, 17, 30, 41, 64, 79] {
            let mut bad = b.clone();
            bad[at] ^= 0x10;
            assert_eq!(Journal::decode(&bad), None, "byte {at} flipped");
        }
        assert_eq!(Journal::decode(&[0u8; 4096]), None, "zeros are no journal");
        let big = Journal { seq: 1, disk_guid: g, dirty: (0..1000).map(|i| (i * 2 * MIB, MIB)).collect() };
        assert_eq!(Journal::decode(&big.encode().unwrap()), Some(big));
        let too_big = Journal { seq: 1, disk_guid: g, dirty: (0..MAX_EXTENTS as u64 + 1).map(|i| (i * 2 * MIB, MIB)).collect() };
        assert!(too_big.encode().is_none());
    }

    #[test]
    fn the_newest_valid_journal_of_this_table_wins_and_the_next_goes_to_the_other_slot() {
        let (g, other) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let a = Journal { seq: 4, disk_guid: g, dirty: vec![(MIB, MIB)] };
        let b = Journal { seq: 5, disk_guid: g, dirty: vec![] };
        let stale = Journal { seq: 9, disk_guid: other, dirty: vec![] };
        assert_eq!(current(&[Some(a.clone()), Some(b.clone())], g), Some(&b));
        assert_eq!(current(&[Some(a.clone()), None], g), Some(&a), "a torn newer slot leaves the older");
        assert_eq!(current(&[Some(stale.clone()), None], g), None, "a journal of another table is no journal");
        let n = next_journal(&[Some(a.clone()), Some(b.clone())], g, vec![(2 * MIB, MIB), (MIB, MIB)]);
        assert_eq!((n.seq, n.dirty.clone()), (6, vec![(MIB, 2 * MIB)]));
        assert_ne!(n.slot(), b.slot(), "never over the current one");
        assert_eq!(next_journal(&[None, None], g, vec![]).seq, 1);
    }

    #[test]
    fn the_primitive_is_the_fastest_that_guarantees_zeros() {
        let q = |wz, dm, dz, lf| QueueLimits { write_zeroes_max_bytes: wz, discard_max_bytes: dm, discard_zeroes_data: dz, loop_over_file: lf };
        // (limits, choice)
        let cases = [
            // NVMe/SCSI with write-zeroes offload, discard without a zeroing guarantee.
            (q(1 << 30, 1 << 30, false, false), Primitive::ZeroOut),
            // A loop device over a file: a discard punches a hole.
            (q(4 << 30, 4 << 30, false, true), Primitive::Discard),
            // A loop device over a file system that cannot punch holes.
            (q(4 << 30, 0, false, true), Primitive::ZeroOut),
            // An old kernel that promises zeros after discard.
            (q(0, 1 << 30, true, false), Primitive::Discard),
            // A SATA HDD: no write-zeroes, no discard.
            (q(0, 0, false, false), Primitive::Write),
            // Discard without a guarantee is never used.
            (q(0, 1 << 30, false, false), Primitive::Write),
        ];
        for (i, (limits, want)) in cases.into_iter().enumerate() {
            assert_eq!(choose(limits), want, "case {i}");
        }
    }
}
