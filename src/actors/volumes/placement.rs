//! Placement: where a new volume goes, and what GetCapacity promises. One model for both,
//! so the capacity the scheduler is told is exactly what CreateVolume accepts.
//!
//! Rules:
//! - Eligible drives ([`open_drives`]): managed, of the requested media (any when none is
//!   asked), present (a missing drive is no candidate at all) and open to new volumes: not
//!   releasing or released, not BAD. The same filter serves [`place`] and [`capacity`].
//! - What a drive can take ([`room_on`]): for `layout=partition`, its free extents
//!   (aligned to 1 MiB, between the primary and the backup GPT), each usable only if it
//!   holds the smallest volume asked for, and nothing at all once its partition table
//!   has no free slot ([`free_slots`]: a partition takes one whatever its size, so a
//!   drive full of small volumes offers 0 bytes however much space is left); for
//!   `layout=drive`, its whole usable region, and only while nothing is on it (an empty
//!   table always has a slot).
//! - [`place`]: among eligible drives with room for the volume, the one with the least
//!   free space left (best fit, keeping large extents for large volumes); ties go to the
//!   drive id in order. A whole-drive volume takes the drive's usable region. A partition
//!   goes at the start of a free extent, so whatever the extent holds beyond it follows
//!   it (room to grow in place, never a volume pushed to an extent's very end), and
//!   the extent is picked to leave it room to grow ([`pick_extent`]): the lowest one
//!   with room for the volume twice over (it can double in place), else the one that
//!   leaves the most room after it (the largest, lowest first among equals), never a
//!   tight hole while a roomier extent exists.
//! - [`capacity`]: `maximum_volume_size` is the largest single volume [`place`] accepts
//!   now, `available` the sum of every usable extent, on each drive at most as many
//!   (the largest) as it has free partition slots (what volumes of the largest size,
//!   one after another, would fill). No I/O here.

use std::borrow::Cow;

use crate::actors::inventory::model::Drive;

use crate::disk::gpt;
use crate::words::{DriveClass, LayoutKind, Media};

/// Where a new volume goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placement {
    /// Drive id.
    pub drive_id: String,
    /// Start, bytes.
    pub start: u64,
    /// Size, bytes.
    pub size: u64,
}

/// Why no placement was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NoRoom {
    /// No eligible drive could ever hold it (too big): OUT_OF_RANGE.
    TooBig(String),
    /// Eligible drives exist but none has room now: RESOURCE_EXHAUSTED.
    Full(String),
}

/// A drive as placement sees it.
#[derive(Debug, Clone)]
pub(crate) struct Candidate<'a> {
    /// The drive.
    pub drive: &'a Drive,
    /// Extents in use (records and kernel partitions), `(start, len)`: the book's own,
    /// or borrowed from a published view.
    pub used: Cow<'a, [(u64, u64)]>,
    /// The drive must not take new volumes (releasing, failing).
    pub closed: bool,
    /// Partition-table slots taken on it: one per partition (volumes, snapshots, move
    /// copies, the kernel's other partitions), whatever its size.
    pub slots_used: u32,
}

/// Partition-table slots still free on `c`: what its table holds
/// ([`Drive::partition_slots`]) less what is taken.
pub(crate) fn free_slots(c: &Candidate<'_>) -> u32 {
    c.drive.partition_slots.saturating_sub(c.slots_used)
}

/// Words for a drive with no free slot left.
fn slots_full(c: &Candidate<'_>) -> String {
    format!(
        "drive {} holds {} partitions (volumes and snapshots), the most its partition table can",
        c.drive.path.display(),
        c.slots_used
    )
}

/// What GetCapacity answers for one set of parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capacity {
    /// Sum of every extent a volume could be placed in now.
    pub available: u64,
    /// The largest volume CreateVolume accepts now.
    pub maximum_volume_size: u64,
}

/// Managed candidates of `media` (any when `None`), present or closed alike.
fn managed<'c, 'a>(cands: &'c [Candidate<'a>], media: Option<Media>) -> impl Iterator<Item = &'c Candidate<'a>> {
    cands.iter().filter(move |c| c.drive.class == DriveClass::Managed && media.is_none_or(|m| c.drive.media == m))
}

/// The candidates a new volume of `media` may go to.
pub(crate) fn open_drives<'c, 'a>(cands: &'c [Candidate<'a>], media: Option<Media>) -> impl Iterator<Item = &'c Candidate<'a>> {
    managed(cands, media).filter(|c| !c.closed)
}

/// The extents `(start, len)` of `c` a volume of at least `minimum` bytes could take.
pub(crate) fn room_on(c: &Candidate<'_>, layout: LayoutKind, minimum: u64) -> Vec<(u64, u64)> {
    match layout {
        LayoutKind::Partition if free_slots(c) == 0 => Vec::new(),
        LayoutKind::Partition => {
            let mut free = gpt::free_extents(c.drive.size_bytes, c.drive.logical_block_size, &c.used);
            free.retain(|e| e.1 >= minimum);
            free
        }
        LayoutKind::Drive => match gpt::usable_region(c.drive.size_bytes, c.drive.logical_block_size) {
            Some((s, e)) if c.used.is_empty() && e - s >= minimum => vec![(s, e - s)],
            _ => Vec::new(),
        },
    }
}

/// The extent of `room` (free extents that hold `size`, in drive order) a partition of
/// `size` bytes takes, at its start: the lowest with room for `size` after the volume
/// (it can double in place), else the one leaving the most room after it, lowest first
/// among equals. `None` when `room` is empty.
pub(crate) fn pick_extent(room: &[(u64, u64)], size: u64) -> Option<(u64, u64)> {
    let after = |e: &(u64, u64)| e.1.saturating_sub(size);
    room.iter().find(|e| after(e) >= size).or_else(|| room.iter().rev().max_by_key(|e| after(e))).copied()
}

/// Picks a drive and extent for a volume of `size` (for `layout=drive`, `size` is the
/// minimum and the whole usable region is taken).
pub(crate) fn place(cands: &[Candidate<'_>], media: Option<Media>, layout: LayoutKind, size: u64) -> Result<Placement, NoRoom> {
    let what = media.map(|m| format!("{} ", m.as_str())).unwrap_or_default();
    if managed(cands, media).next().is_none() {
        return Err(NoRoom::Full(format!("no managed {what}drive is available on this node")));
    }
    // Too big is judged against every managed drive, closed ones included: a volume
    // that would fit a drive being released is a matter of room, not of range.
    let region = |c: &Candidate<'_>| gpt::usable_region(c.drive.size_bytes, c.drive.logical_block_size);
    let biggest = managed(cands, media).filter_map(|c| region(c).map(|(s, e)| e - s)).max().unwrap_or(0);
    if size > biggest {
        return Err(NoRoom::TooBig(format!(
            "{size} bytes is more than the largest managed {what}drive can hold ({biggest} bytes)"
        )));
    }
    if open_drives(cands, media).next().is_none() {
        return Err(NoRoom::Full(format!(
            "every managed {what}drive is closed to new volumes (failing or being released)"
        )));
    }
    let mut best: Option<(u64, &str, Placement)> = None;
    for c in open_drives(cands, media) {
        let room = room_on(c, layout, size);
        let (start, size) = match layout {
            LayoutKind::Drive => match room.first() {
                Some(&(start, len)) => (start, len),
                None => continue,
            },
            LayoutKind::Partition => match pick_extent(&room, size) {
                Some((start, _)) => (start, size),
                None => continue,
            },
        };
        let total: u64 = gpt::free_extents(c.drive.size_bytes, c.drive.logical_block_size, &c.used).iter().map(|e| e.1).sum();
        let key = (total, c.drive.id.as_str());
        if best.as_ref().is_none_or(|(t, id, _)| key < (*t, *id)) {
            best = Some((total, c.drive.id.as_str(), Placement { drive_id: c.drive.id.clone(), start, size }));
        }
    }
    best.map(|b| b.2).ok_or_else(|| match layout {
        LayoutKind::Drive => NoRoom::Full(format!("no empty managed {what}drive of at least {size} bytes is free")),
        LayoutKind::Partition => {
            let (full, other): (Vec<_>, Vec<_>) = open_drives(cands, media).partition(|c| free_slots(c) == 0);
            let full: Vec<String> = full.into_iter().map(slots_full).collect();
            match (full.is_empty(), other.is_empty()) {
                (true, _) => NoRoom::Full(format!("no managed {what}drive has {size} contiguous free bytes")),
                (false, true) => NoRoom::Full(format!("no free partition slot: {}", full.join("; "))),
                (false, false) => NoRoom::Full(format!(
                    "no managed {what}drive has {size} contiguous free bytes, and the others have no free partition slot: {}",
                    full.join("; ")
                )),
            }
        }
    })
}

/// What GetCapacity answers for volumes of `media` and `layout` whose smallest size is
/// `minimum`: see the module rules.
pub(crate) fn capacity(cands: &[Candidate<'_>], media: Option<Media>, layout: LayoutKind, minimum: u64) -> Capacity {
    let mut cap = Capacity::default();
    for c in open_drives(cands, media) {
        let mut room = room_on(c, layout, minimum);
        if layout == LayoutKind::Partition {
            // One volume per slot: the largest extents are what the slots can fill.
            room.sort_by(|a, b| b.1.cmp(&a.1));
            room.truncate(usize::try_from(free_slots(c)).unwrap_or(usize::MAX));
        }
        for (_, len) in room {
            cap.available += len;
            cap.maximum_volume_size = cap.maximum_volume_size.max(len);
        }
    }
    cap
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn drive(id: &str, media: Media, size: u64) -> Drive {
        Drive::for_test(id, media, size)
    }

    #[test]
    fn placement_prefers_the_tightest_drive_that_fits() {
        let a = drive("a", Media::Ssd, 10 * GIB);
        let b = drive("b", Media::Ssd, 4 * GIB);
        let c = drive("c", Media::Hdd, 2 * GIB);
        let cands = vec![
            Candidate { drive: &a, used: vec![].into(), closed: false, slots_used: 0 },
            Candidate { drive: &b, used: vec![(MIB, GIB)].into(), closed: false, slots_used: 0 },
            Candidate { drive: &c, used: vec![].into(), closed: false, slots_used: 0 },
        ];
        let p = place(&cands, None, LayoutKind::Partition, GIB).unwrap();
        assert_eq!((p.drive_id.as_str(), p.start), ("c", MIB));
        let p = place(&cands, Some(Media::Ssd), LayoutKind::Partition, GIB).unwrap();
        assert_eq!((p.drive_id.as_str(), p.start), ("b", MIB + GIB));
        let p = place(&cands, Some(Media::Ssd), LayoutKind::Partition, 5 * GIB).unwrap();
        assert_eq!(p.drive_id, "a");
        assert!(matches!(place(&cands, None, LayoutKind::Partition, 11 * GIB), Err(NoRoom::TooBig(_))));
        assert!(matches!(place(&cands, Some(Media::Nvme), LayoutKind::Partition, MIB), Err(NoRoom::Full(_))));
    }

    #[test]
    fn a_partition_goes_where_it_can_grow_at_the_start_of_its_extent() {
        // (free extents in drive order, size) -> start of the extent taken
        let cases: Vec<(&str, Vec<(u64, u64)>, u64, Option<u64>)> = vec![
            ("one extent: its start, the rest follows", vec![(MIB, GIB)], 100 * MIB, Some(MIB)),
            ("the lowest that can double", vec![(MIB, 300 * MIB), (400 * MIB, GIB)], 100 * MIB, Some(MIB)),
            ("a tight hole is skipped for room to grow", vec![(MIB, 100 * MIB), (200 * MIB, GIB)], 100 * MIB, Some(200 * MIB)),
            ("a hole too small to double is skipped too", vec![(MIB, 150 * MIB), (200 * MIB, GIB)], 100 * MIB, Some(200 * MIB)),
            ("none can double: the most room after it", vec![(MIB, 150 * MIB), (200 * MIB, 190 * MIB), (500 * MIB, 120 * MIB)], 100 * MIB, Some(200 * MIB)),
            ("equal room: the lowest", vec![(MIB, 150 * MIB), (200 * MIB, 150 * MIB)], 100 * MIB, Some(MIB)),
            ("only exact fits: the lowest", vec![(MIB, 100 * MIB), (200 * MIB, 100 * MIB)], 100 * MIB, Some(MIB)),
            ("nothing", vec![], 100 * MIB, None),
        ];
        for (what, room, size, want) in cases {
            assert_eq!(pick_extent(&room, size).map(|e| e.0), want, "{what}");
        }
        // And place takes that extent, at its start: a 100 MiB volume on a drive whose
        // first free hole fits it exactly goes to the large extent after the other volume.
        let a = drive("a", Media::Ssd, 2 * GIB);
        let cands = vec![Candidate { drive: &a, used: vec![(101 * MIB, 50 * MIB)].into(), closed: false, slots_used: 1 }];
        let p = place(&cands, None, LayoutKind::Partition, 100 * MIB).unwrap();
        assert_eq!((p.start, p.size), (151 * MIB, 100 * MIB));
        // Space still being cleaned before a free extent: the volume goes at the start
        // of the clean extent, the rest of it free after the volume, not at its end.
        let cands = vec![Candidate { drive: &a, used: vec![(MIB, 700 * MIB)].into(), closed: false, slots_used: 0 }];
        let p = place(&cands, None, LayoutKind::Partition, 100 * MIB).unwrap();
        assert_eq!(p.start, 701 * MIB);
    }

    #[test]
    fn whole_drive_placement_takes_an_empty_drive_entirely() {
        let a = drive("a", Media::Ssd, 4 * GIB);
        let b = drive("b", Media::Ssd, 2 * GIB);
        let cands = vec![
            Candidate { drive: &a, used: vec![].into(), closed: false, slots_used: 0 },
            Candidate { drive: &b, used: vec![(MIB, MIB)].into(), closed: false, slots_used: 0 },
        ];
        let p = place(&cands, None, LayoutKind::Drive, MIB).unwrap();
        assert_eq!(p.drive_id, "a");
        assert_eq!(p.start, MIB);
        assert_eq!(p.size, gpt::usable_region(4 * GIB, 512).map(|(s, e)| e - s).unwrap());
        let cands = vec![Candidate { drive: &b, used: vec![(MIB, MIB)].into(), closed: false, slots_used: 0 }];
        assert!(matches!(place(&cands, None, LayoutKind::Drive, MIB), Err(NoRoom::Full(_))));
    }

    #[test]
    fn closed_and_unmanaged_drives_are_never_chosen() {
        let a = drive("a", Media::Ssd, 4 * GIB);
        let mut f = drive("f", Media::Ssd, 4 * GIB);
        f.class = DriveClass::Foreign;
        let cands = vec![
            Candidate { drive: &a, used: vec![].into(), closed: true, slots_used: 0 },
            Candidate { drive: &f, used: vec![].into(), closed: false, slots_used: 0 },
        ];
        assert!(matches!(place(&cands, None, LayoutKind::Partition, MIB), Err(NoRoom::Full(_))));
    }

    /// The region of a `size` drive with 512-byte sectors.
    fn region(size: u64) -> u64 {
        gpt::usable_region(size, 512).map(|(s, e)| e - s).unwrap()
    }

    #[test]
    fn capacity_counts_only_what_placement_would_take() {
        let a = drive("a", Media::Ssd, 2 * GIB);
        let b = drive("b", Media::Ssd, 2 * GIB);
        let h = drive("h", Media::Hdd, 4 * GIB);
        let mut f = drive("f", Media::Ssd, 8 * GIB);
        f.class = DriveClass::Foreign;
        let p = LayoutKind::Partition;
        // (candidates, media, layout, minimum) -> (available, maximum)
        let cases: Vec<(Vec<Candidate<'_>>, Option<Media>, LayoutKind, u64, u64, u64)> = vec![
            // Empty drives: everything, the biggest whole region is the maximum.
            (vec![Candidate { drive: &a, used: vec![].into(), closed: false, slots_used: 0 }, Candidate { drive: &h, used: vec![].into(), closed: false, slots_used: 0 }], None, p, MIB, region(2 * GIB) + region(4 * GIB), region(4 * GIB)),
            // Media filter.
            (vec![Candidate { drive: &a, used: vec![].into(), closed: false, slots_used: 0 }, Candidate { drive: &h, used: vec![].into(), closed: false, slots_used: 0 }], Some(Media::Ssd), p, MIB, region(2 * GIB), region(2 * GIB)),
            // A releasing or BAD drive (closed) promises nothing; a foreign one neither.
            (vec![Candidate { drive: &h, used: vec![].into(), closed: true, slots_used: 0 }, Candidate { drive: &a, used: vec![].into(), closed: false, slots_used: 0 }], None, p, MIB, region(2 * GIB), region(2 * GIB)),
            (vec![Candidate { drive: &h, used: vec![].into(), closed: true, slots_used: 0 }, Candidate { drive: &f, used: vec![].into(), closed: false, slots_used: 0 }], None, p, MIB, 0, 0),
            // A volume in the middle splits the free space: the maximum is the larger side.
            (vec![Candidate { drive: &a, used: vec![(MIB + 512 * MIB, 512 * MIB)].into(), closed: false, slots_used: 0 }], None, p, MIB, region(2 * GIB) - 512 * MIB, region(2 * GIB) - 1024 * MIB),
            // Extents below the smallest volume (xfs: 300 MiB) are not counted.
            (vec![Candidate { drive: &a, used: vec![(MIB + 100 * MIB, region(2 * GIB) - 100 * MIB)].into(), closed: false, slots_used: 0 }], None, p, 300 * MIB, 0, 0),
            (vec![Candidate { drive: &a, used: vec![(MIB + 100 * MIB, region(2 * GIB) - 100 * MIB)].into(), closed: false, slots_used: 0 }], None, p, 16 * MIB, 100 * MIB, 100 * MIB),
            // Whole drives: only empty ones, each entirely.
            (vec![Candidate { drive: &a, used: vec![(MIB, MIB)].into(), closed: false, slots_used: 0 }, Candidate { drive: &b, used: vec![].into(), closed: false, slots_used: 0 }], None, LayoutKind::Drive, MIB, region(2 * GIB), region(2 * GIB)),
            (vec![Candidate { drive: &a, used: vec![(MIB, MIB)].into(), closed: false, slots_used: 0 }, Candidate { drive: &b, used: vec![].into(), closed: true, slots_used: 0 }], None, LayoutKind::Drive, MIB, 0, 0),
        ];
        for (i, (cands, media, layout, minimum, available, maximum)) in cases.iter().enumerate() {
            let got = capacity(cands, *media, *layout, *minimum);
            assert_eq!(got, Capacity { available: *available, maximum_volume_size: *maximum }, "case {i}");
        }
    }

    /// Takes `p` on its drive, as a created volume would.
    fn take(cands: &mut [Candidate<'_>], p: &Placement) {
        let c = cands.iter_mut().find(|c| c.drive.id == p.drive_id).unwrap();
        c.used.to_mut().push((p.start, p.size));
    }

    #[test]
    fn the_maximum_is_accepted_one_byte_more_is_not_and_volumes_of_the_maximum_fill_the_available_space() {
        let a = drive("a", Media::Ssd, 3 * GIB);
        let b = drive("b", Media::Ssd, 2 * GIB);
        let c = drive("c", Media::Hdd, GIB);
        let d = drive("d", Media::Ssd, 5 * GIB);
        for layout in [LayoutKind::Partition, LayoutKind::Drive] {
            for minimum in [MIB, 16 * MIB, 300 * MIB] {
                let mut cands = vec![
                    Candidate { drive: &a, used: vec![(MIB + 700 * MIB, 300 * MIB)].into(), closed: false, slots_used: 0 },
                    Candidate { drive: &b, used: vec![].into(), closed: false, slots_used: 0 },
                    Candidate { drive: &c, used: vec![(MIB + 900 * MIB, 20 * MIB)].into(), closed: false, slots_used: 0 },
                    Candidate { drive: &d, used: vec![].into(), closed: true, slots_used: 0 },
                ];
                let start = capacity(&cands, None, layout, minimum);
                let mut filled = 0;
                loop {
                    let cap = capacity(&cands, None, layout, minimum);
                    if cap.maximum_volume_size == 0 {
                        assert_eq!(cap.available, 0, "{layout:?}/{minimum}: nothing fits, nothing promised");
                        assert!(place(&cands, None, layout, minimum).is_err());
                        break;
                    }
                    if layout == LayoutKind::Partition {
                        let over = place(&cands, None, layout, cap.maximum_volume_size + MIB);
                        assert!(over.is_err(), "{layout:?}/{minimum}: {} bytes more than the maximum placed: {over:?}", MIB);
                    }
                    let want = if layout == LayoutKind::Drive { minimum } else { cap.maximum_volume_size };
                    let p = place(&cands, None, layout, want).unwrap_or_else(|e| panic!("{layout:?}/{minimum}: the maximum {cap:?} refused: {e:?}"));
                    assert!(p.size <= cap.maximum_volume_size, "{layout:?}: placed {} > maximum {}", p.size, cap.maximum_volume_size);
                    filled += p.size;
                    take(&mut cands, &p);
                }
                assert_eq!(filled, start.available, "{layout:?}/{minimum}: volumes of the maximum fill exactly what was available");
            }
        }
    }

    #[test]
    fn a_drive_with_no_free_slot_offers_nothing_and_a_create_says_so_in_words() {
        let mut a = drive("a", Media::Ssd, 2 * GIB);
        a.path = "/dev/loop3".into();
        let b = drive("b", Media::Ssd, 2 * GIB);
        let slots = a.partition_slots;
        // 255 small volumes take every slot of a, with most of its bytes still free.
        let used: Vec<(u64, u64)> = (0..u64::from(slots)).map(|i| (MIB + i * MIB, MIB)).collect();
        let full = Candidate { drive: &a, used: used.clone().into(), closed: false, slots_used: slots };
        let p = LayoutKind::Partition;
        assert_eq!(capacity(std::slice::from_ref(&full), None, p, MIB), Capacity::default(), "0 bytes, however many are free");
        assert!(room_on(&full, p, MIB).is_empty());
        match place(std::slice::from_ref(&full), None, p, MIB) {
            Err(NoRoom::Full(why)) => assert_eq!(why, "no free partition slot: drive /dev/loop3 holds 255 partitions (volumes and snapshots), the most its partition table can"),
            other => panic!("{other:?}"),
        }
        // Another drive with room still takes the volume, and is all the capacity there is.
        let cands = vec![full.clone(), Candidate { drive: &b, used: vec![].into(), closed: false, slots_used: 0 }];
        assert_eq!(place(&cands, None, p, MIB).unwrap().drive_id, "b");
        assert_eq!(capacity(&cands, None, p, MIB), Capacity { available: region(2 * GIB), maximum_volume_size: region(2 * GIB) });
        // b full of bytes but not of slots: both reasons are named.
        let cands = vec![full.clone(), Candidate { drive: &b, used: vec![(MIB, region(2 * GIB))].into(), closed: false, slots_used: 1 }];
        match place(&cands, None, p, MIB) {
            Err(NoRoom::Full(why)) => assert!(why.contains("contiguous free bytes") && why.contains("no free partition slot: drive /dev/loop3"), "{why}"),
            other => panic!("{other:?}"),
        }
        // A whole-drive volume needs an empty drive, not a slot count.
        let empty = Candidate { drive: &b, used: vec![].into(), closed: false, slots_used: 0 };
        assert_eq!(place(std::slice::from_ref(&empty), None, LayoutKind::Drive, MIB).unwrap().drive_id, "b");
    }

    #[test]
    fn the_last_free_slots_offer_only_the_largest_extents_they_can_fill() {
        let a = drive("a", Media::Ssd, 2 * GIB);
        // Free: [1, 101) MiB, [201, 501) MiB and the rest after 601 MiB; two slots left.
        let used = vec![(101 * MIB, 100 * MIB), (501 * MIB, 100 * MIB)];
        let rest = region(2 * GIB) + MIB - 601 * MIB;
        let c = |slots_used| Candidate { drive: &a, used: used.clone().into(), closed: false, slots_used };
        let p = LayoutKind::Partition;
        let n = a.partition_slots;
        assert_eq!(capacity(&[c(n - 3)], None, p, MIB).available, 100 * MIB + 300 * MIB + rest);
        assert_eq!(capacity(&[c(n - 2)], None, p, MIB), Capacity { available: 300 * MIB + rest, maximum_volume_size: rest });
        assert_eq!(capacity(&[c(n - 1)], None, p, MIB), Capacity { available: rest, maximum_volume_size: rest });
        assert_eq!(capacity(&[c(n)], None, p, MIB), Capacity::default());
        // And placement agrees: volumes of the maximum, one after another, fill what
        // was available with the last slot.
        let mut cands = vec![c(n - 2)];
        let start = capacity(&cands, None, p, MIB).available;
        let mut filled = 0;
        while let Ok(pl) = place(&cands, None, p, capacity(&cands, None, p, MIB).maximum_volume_size.max(MIB)) {
            filled += pl.size;
            take(&mut cands, &pl);
            cands[0].slots_used += 1;
        }
        assert_eq!(filled, start);
        assert_eq!(free_slots(&cands[0]), 0);
    }
}
