//! The GPT writer: adds, removes and resizes drivelet partitions. Every change is
//! judged first ([`judge`]), written backup copy first and fsynced (see the rules of
//! [`super`]).
//!
//! Rule: the caller of every writer here ([`mark_clean`], [`add_partition`],
//! [`add_partition_wiped`], [`remove_partition`], [`set_partition_attrs`],
//! [`resize_partition`], [`write_note`]) holds the drive's exclusive
//! [`DiskLock`](crate::disk::lock::DiskLock) across the call (and the kernel update that
//! follows). That lock is what serialises writers: it is exclusive between processes
//! (`flock`) and between threads of this one (its in-process hold), per disk, so no
//! mutex of the writer's own is needed and writes to different disks run in parallel.
//! Tests and benches that write an image file no other thread touches need no lock.

use super::examine::{judge, judge_gpt, open_to_inspect, refuse, Judged};
use super::*;
use crate::disk::{clean, note};
use crate::failpoint::crash_point;

/// [`judge`] for a write: a drivelet table whose note names another owner, or cannot
/// be read, is refused ([`check_owner`]).
fn judge_to_write<'f>(dev: &Path, file: &'f File, size: u64, sector: u64) -> Result<Judged<'f>, DiskError> {
    let judged = judge(dev, file, size, sector)?;
    if let Judged::Drivelet(disk) = &judged {
        check_owner(dev, file, disk)?;
    }
    Ok(judged)
}

/// Refuses a write to the drivelet table `disk` on `file` unless this node owns it or
/// may claim it ([`note::verdict`]: a disk with no note is the inventory's to judge,
/// which calls one with volumes this node does not know owned elsewhere, so it never
/// reaches a writer). Without an identity (unit tests of this layer) nothing is checked.
fn check_owner(dev: &Path, file: &File, disk: &GptDisk<&File>) -> Result<(), DiskError> {
    let Some(me) = note::identity() else { return Ok(()) };
    let state = note::state_of(&note::read_slots(file), *disk.guid());
    match note::verdict(&state, me, 0, true) {
        note::Verdict::Elsewhere(o) => Err(refuse(dev, format!("a drivelet disk that {}", note::whose(&o, me)))),
        note::Verdict::Ours | note::Verdict::Claim => Ok(()),
    }
}

fn check_extent(dev: &Path, start: u64, size: u64) -> Result<(), DiskError> {
    if size == 0 || !start.is_multiple_of(ALIGN) || !size.is_multiple_of(ALIGN) || start.checked_add(size).is_none() {
        return Err(DiskError::invalid(format!(
            "{}: partition [{start}, +{size}) bytes is empty or not aligned to {ALIGN} bytes",
            dev.display()
        )));
    }
    Ok(())
}

/// Checks `[first, last]` (LBAs) lies in the usable area of the GPT and within the device.
fn check_usable(dev: &Path, disk: &GptDisk<&File>, first: u64, last: u64, size: u64, sector: u64) -> Result<(), DiskError> {
    let h = disk.header();
    if first < h.first_usable || last > h.last_usable || (last + 1) * sector > size {
        return Err(DiskError::Conflict {
            device: dev.to_path_buf(),
            start: first * sector,
            size: (last + 1 - first) * sector,
            reason: format!(
                "outside the usable area of the GPT, bytes [{}, {})",
                h.first_usable * sector,
                (h.last_usable + 1) * sector
            ),
        });
    }
    Ok(())
}

fn overlaps(p: &Partition, first: u64, last: u64) -> bool {
    p.first_lba <= last && first <= p.last_lba
}

/// Replaces the entries of the table in memory (headers follow the device's size). A
/// table of fewer than [`TABLE_ENTRIES`] entries grows to that many here when nothing
/// lies where its larger arrays go ([`growth_blocker`]); the write that follows puts it
/// on the device as crash-safely as any other (backup copy whole first, then the
/// primary, each header beside the array it describes).
pub(super) fn set_entries(dev: &Path, disk: &mut GptDisk<&File>, parts: BTreeMap<u32, Partition>) -> Result<(), DiskError> {
    let sector = disk.logical_block_size().as_u64();
    let file: &File = *disk.device_ref();
    let size = len_of(dev, file)?;
    let h = disk.header();
    if h.num_parts < TABLE_ENTRIES && growth_blocker(h.part_size, parts.values().filter(|p| p.is_used()).map(|p| (p.first_lba, p.last_lba)), size, sector).is_none() {
        tracing::debug!(disk.path = %dev.display(), from = h.num_parts, to = TABLE_ENTRIES, "the partition table grows");
        *disk = table_of(dev, file, size, sector, *disk.guid(), TABLE_ENTRIES)?;
    }
    let entries = disk.header().num_parts;
    let used = parts.values().filter(|p| p.is_used()).count();
    if used as u64 > u64::from(entries) {
        return Err(DiskError::Gpt { device: dev.to_path_buf(), reason: format!("{used} partitions do not fit a table of {entries} entries") });
    }
    disk.update_partitions(padded(parts, entries)).map_err(gpt_error(dev, "update the partition table"))?;
    // The headers now place the backup at the device's end; a device that shrank below
    // the table's usable area would put the backup entries over partitions.
    let h = disk.header();
    let entry_lbs = (u64::from(h.num_parts) * u64::from(h.part_size)).div_ceil(disk.logical_block_size().as_u64());
    if h.last_usable + entry_lbs >= h.backup_lba || h.num_parts != entries {
        return Err(DiskError::Gpt {
            device: dev.to_path_buf(),
            reason: format!(
                "the device is smaller than its GPT says (usable area ends at LBA {}, backup header at LBA {})",
                h.last_usable, h.backup_lba
            ),
        });
    }
    Ok(())
}

/// How many partitions the table `disk` holds once written with the used entries at
/// `used` (`(first, last)` LBAs): [`partition_slots`] of its entries, or of
/// [`TABLE_ENTRIES`] when it grows at that write.
fn table_slots(disk: &GptDisk<&File>, used: impl IntoIterator<Item = (u64, u64)>, size: u64, sector: u64) -> u32 {
    let h = disk.header();
    let grows = h.num_parts < TABLE_ENTRIES && growth_blocker(h.part_size, used, size, sector).is_none();
    partition_slots(if grows { TABLE_ENTRIES } else { h.num_parts })
}

/// The used entries of `parts` with unused ones after them up to `entries` in all: the
/// GPT library sizes a table's entry array by the entries it is given (at least 128),
/// so a table of 256 keeps its 256 only when handed that many.
pub(super) fn padded(parts: BTreeMap<u32, Partition>, entries: u32) -> BTreeMap<u32, Partition> {
    let mut parts: BTreeMap<u32, Partition> = parts.into_iter().filter(|(_, p)| p.is_used()).collect();
    let mut key = parts.keys().next_back().copied().unwrap_or(0);
    while (parts.len() as u64) < u64::from(entries) {
        key += 1;
        parts.insert(key, Partition::zero());
    }
    parts
}

/// An empty drivelet table of `entries` entries with disk GUID `guid` for `file` (a
/// device of `size` bytes), its headers laid out for that many entries: the first
/// usable LBA after the primary array, the last before the backup array. (The GPT
/// library makes only 128-entry tables, and keeps an older header's usable region, which
/// a larger backup array would overlap.) Nothing is written.
pub(super) fn table_of<'f>(dev: &Path, file: &'f File, size: u64, sector: u64, guid: Uuid, entries: u32) -> Result<GptDisk<&'f File>, DiskError> {
    let lb = block_size(dev, sector)?;
    let bad = |what: &str, e: String| DiskError::Gpt { device: dev.to_path_buf(), reason: format!("{what}: {e}") };
    let backup = (size / sector).checked_sub(1).ok_or_else(|| bad("lay out a partition table", format!("the device has only {size} bytes")))?;
    let mut header = gpt::header::HeaderBuilder::new()
        .num_parts(entries)
        .backup_lba(backup)
        .disk_guid(guid)
        .primary(true)
        .build(lb.clone())
        .map_err(|e| bad("lay out a partition table", e.to_string()))?;
    // The library opens a table only from a device: lay the header and an empty entry
    // array over the real one, in memory.
    let array = vec![0u8; (u64::from(entries) * u64::from(header.part_size)) as usize];
    let mut staged = Staged { dev: file, size, pos: 0, writes: vec![(header.part_start * sector, array)] };
    header.write_primary(&mut staged, lb.clone()).map_err(|e| bad("lay out a partition table", e.to_string()))?;
    let disk = GptConfig::new()
        .logical_block_size(lb)
        .change_partition_count(true)
        .open_from_device(&mut staged)
        .map_err(gpt_error(dev, "lay out a partition table"))?;
    if disk.header().num_parts != entries || disk.header().current_lba != 1 {
        return Err(bad("lay out a partition table", format!("the library read back {} entries", disk.header().num_parts)));
    }
    Ok(disk.with_disk_device(file, false))
}

/// Stands in for the device while the GPT library writes a table: reads go through to
/// the device with the writes made so far laid over them (the library reads the entry
/// array back to checksum it), and writes are kept in memory, in order, for [`commit`]
/// to put on the device in a crash-safe order.
#[derive(Debug)]
struct Staged<'f> {
    dev: &'f File,
    size: u64,
    pos: u64,
    writes: Vec<(u64, Vec<u8>)>,
}

impl std::io::Read for Staged<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.dev.read_at(buf, self.pos)?;
        let (from, to) = (self.pos, self.pos + n as u64);
        for (off, data) in &self.writes {
            let (start, end) = ((*off).max(from), (off + data.len() as u64).min(to));
            if start < end {
                buf[(start - from) as usize..(end - from) as usize].copy_from_slice(&data[(start - off) as usize..(end - off) as usize]);
            }
        }
        self.pos = to;
        Ok(n)
    }
}

impl std::io::Write for Staged<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.writes.push((self.pos, buf.to_vec()));
        self.pos += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Seek for Staged<'_> {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let at = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::End(d) => self.size.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = at.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "seek before the start of the device"))?;
        Ok(self.pos)
    }
}

/// The writes that put the table prepared in `disk` on a device of `size` bytes
/// (read through `file`), in the order they must reach it: first everything in the
/// backup half (entry array, then header), then everything in the primary half (entry
/// array, then header). So at every moment one of the two headers describes the entry
/// array beside it, and a process killed in the middle leaves a readable table: the
/// old one, or the new one. (The GPT library writes both arrays before either header;
/// a kill between them left both copies failing their checksums, and the drive, with
/// every volume on it, looking foreign to blkid and the kernel.)
pub(super) fn ordered_writes(dev: &Path, disk: &GptDisk<&File>, file: &File, size: u64) -> Result<Vec<(u64, Vec<u8>)>, DiskError> {
    let mut staged = Staged { dev: file, size, pos: 0, writes: Vec::new() };
    disk.with_disk_device(&mut staged, true).write_inplace().map_err(gpt_error(dev, "write the partition table"))?;
    let half = size / 2;
    let (backup, primary): (Vec<_>, Vec<_>) = staged.writes.into_iter().partition(|(off, _)| *off >= half);
    Ok(backup.into_iter().chain(primary).collect())
}

/// Writes the table prepared in `disk` (and, for a fresh table on a device of `fresh`
/// bytes, the protective MBR) through a read-write descriptor opened only for this,
/// backup copy first and flushed, then the primary copy, and flushes it to the device.
/// The byte ranges in `zero` are zeroed first, so the first flush carries them too.
/// The journal of dirty extents ([`crate::disk::clean`]), when given, goes with the
/// zeros: on the device before the first flush, so before the primary copy, which a
/// reader trusts, can say an extent is free.
fn commit(dev: &Path, disk: &GptDisk<&File>, fresh: Option<u64>, zero: &[(u64, u64)], journal: Option<&clean::Journal>, edit: &NoteEdit) -> Result<(), DiskError> {
    let writer = open_for_writing(dev)?;
    let rw: &File = &writer;
    let size = len_of(dev, rw)?;
    let journal = match journal {
        Some(j) => Some((j.slot(), encode_journal(dev, j)?)),
        None => None,
    };
    // The note changes in the same commit as the table: a fresh table names its owner,
    // a new volume is in the note from the flush that makes it exist, a removed one
    // leaves it then.
    let note = edited_note(&rw, *disk.guid(), fresh.is_some(), edit).map_err(|reason| DiskError::Gpt { device: dev.to_path_buf(), reason })?;
    if !zero.is_empty() || journal.is_some() || note.is_some() {
        let _t = crate::disk::timing::step("gpt.zero");
        // Straight to the device: zeros left in the whole disk's page cache would go
        // stale once the partition writes the same blocks through its own cache (the
        // kernel keeps the two apart), and a later read through the disk would see them.
        let direct = set_direct(&rw, true);
        crate::disk::fs::zero_ranges(dev, &rw, zero)?;
        for (at, bytes) in journal.iter().chain(note.iter()) {
            write_aligned(dev, &rw, *at, bytes)?;
        }
        if direct {
            set_direct(&rw, false);
        }
    }
    let half = size / 2;
    let mut in_backup = true;
    let grows = entries_on(&rw, size, disk.logical_block_size().as_u64()).is_some_and(|n| n < disk.header().num_parts);
    let writes = ordered_writes(dev, disk, &rw, size)?;
    let last = writes.len();
    for (i, (off, data)) in writes.into_iter().enumerate() {
        if in_backup && off < half {
            // The backup copy is whole on the device before the primary is touched.
            let _t = crate::disk::timing::step("gpt.flush");
            rw.sync_data().map_err(DiskError::io(format!("fsync {}", dev.display())))?;
            in_backup = false;
            if grows {
                // The grown backup copy is whole and flushed; the primary still has the
                // old entry count.
                crash_point!("grow.backup_written");
            }
        }
        if grows && i + 1 == last {
            // The primary's larger entry array is written; its header (the last write)
            // still describes the old one.
            crash_point!("grow.primary_array_written");
        }
        rw.write_all_at(&data, off).map_err(DiskError::io(format!("write {} at byte {off}", dev.display())))?;
    }
    if let Some(size) = fresh {
        let sectors = size / disk.logical_block_size().as_u64();
        let pmbr = gpt::mbr::ProtectiveMBR::with_lb_size(u32::try_from(sectors - 1).unwrap_or(u32::MAX));
        pmbr.overwrite_lba0(&mut &*rw).map_err(|e| DiskError::Gpt {
            device: dev.to_path_buf(),
            reason: format!("write the protective MBR: {e}"),
        })?;
    }
    let _t = crate::disk::timing::step("gpt.flush");
    rw.sync_all().map_err(DiskError::io(format!("fsync {}", dev.display())))
}

/// The entry count the table on the device open as `file` has now: its primary
/// header's, else its backup's; `None` when neither header is there.
fn entries_on(file: &File, size: u64, sector: u64) -> Option<u32> {
    [Some(sector), (size / sector).checked_sub(1).map(|l| l * sector)].into_iter().flatten().find_map(|at| {
        let mut h = [0u8; 92];
        file.read_exact_at(&mut h, at).ok()?;
        (&h[..8] == b"EFI PART").then(|| u32::from_le_bytes([h[80], h[81], h[82], h[83]]))
    })
}

/// How a change of the table changes the disk's note ([`note`]), written in the same
/// commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoteEdit {
    /// The volume entries stay as they are.
    Keep,
    /// This volume's entry is added, or replaces the one with its id.
    Upsert(Box<note::VolumeNote>),
    /// The entry with this id goes.
    Remove(Uuid),
    /// The entry with this id has a new size.
    Resize(Uuid, u64),
}

/// The offset and bytes of the note after `edit`, for the table with `disk_guid` read
/// through `file`; `None` when nothing changes, or without an identity (unit tests of
/// this layer), or when the current note cannot be read (the writer refused such a
/// disk before it got here). A disk with no note gets one naming this node.
fn edited_note(file: &File, disk_guid: Uuid, fresh: bool, edit: &NoteEdit) -> Result<Option<(u64, Vec<u8>)>, String> {
    let Some(me) = note::identity() else { return Ok(None) };
    let slots = note::read_slots(file);
    let current = match (fresh, note::state_of(&slots, disk_guid)) {
        (true, _) | (false, note::NoteState::Absent) => None,
        (false, note::NoteState::Note(n)) => Some(n),
        (false, note::NoteState::Unreadable(_)) => return Ok(None),
    };
    let mut n = current.clone().unwrap_or_else(|| note::DiskNote { owner: me.clone(), adopted_from: None, volumes: Vec::new() });
    n.owner = me.clone();
    match edit {
        NoteEdit::Keep => {}
        NoteEdit::Upsert(v) => {
            n.volumes.retain(|x| x.id != v.id);
            n.volumes.push(v.as_ref().clone());
            n.volumes.sort_by_key(|x| x.id);
        }
        NoteEdit::Remove(id) => n.volumes.retain(|x| x.id != *id),
        NoteEdit::Resize(id, size) => n.volumes.iter_mut().filter(|x| x.id == *id).for_each(|x| x.size = *size),
    }
    if current.as_ref() == Some(&n) {
        return Ok(None);
    }
    note::prepare(&slots, disk_guid, &n).map(Some)
}

/// Writes `bytes` (whole 4 KiB blocks) at `at` through `file` (open for writing),
/// straight to the device where it allows: drivelet's own records in its reserved first
/// MiB (the note of [`crate::disk::note`]).
pub(crate) fn write_direct(dev: &Path, file: &File, at: u64, bytes: &[u8]) -> Result<(), DiskError> {
    let direct = set_direct(file, true);
    let res = write_aligned(dev, file, at, bytes);
    if direct {
        set_direct(file, false);
    }
    res
}

/// Writes `bytes` (whole 4 KiB blocks) at `at` from a 4 KiB-aligned buffer, so `file`
/// may be `O_DIRECT`.
fn write_aligned(dev: &Path, file: &File, at: u64, bytes: &[u8]) -> Result<(), DiskError> {
    const PAGE: usize = 4096;
    let mut buf = vec![0u8; bytes.len() + PAGE];
    let off = buf.as_ptr().align_offset(PAGE).min(PAGE);
    buf[off..off + bytes.len()].copy_from_slice(bytes);
    file.write_all_at(&buf[off..off + bytes.len()], at).map_err(DiskError::io(format!("write {} at byte {at}", dev.display())))
}

/// The used entries of `disk` as `(start, len)` byte extents.
fn used_extents(disk: &GptDisk<&File>, sector: u64) -> Vec<(u64, u64)> {
    disk.partitions().values().filter(|p| p.is_used()).map(|p| (p.first_lba * sector, (p.last_lba + 1 - p.first_lba) * sector)).collect()
}

/// What is dirty on a device holding the drivelet table `disk` (see [`clean::dirty_of`]),
/// with the journal slots as read.
fn dirty_on(file: &File, disk: &GptDisk<&File>, size: u64, sector: u64) -> (Vec<Option<clean::Journal>>, Vec<(u64, u64)>) {
    let slots = clean::read_slots(file);
    let free = free_extents(size, sector, &used_extents(disk, sector));
    let dirty = clean::dirty_of(clean::current(&slots, *disk.guid()).map(|j| j.dirty.as_slice()), &free);
    (slots, dirty)
}

/// What a device holds, as far as cleaning goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirtyState {
    /// No table at all: whatever its last owner wrote.
    Blank,
    /// A drivelet table with disk GUID `disk_guid`; `dirty` may hold old bytes.
    Drivelet {
        /// The table's disk GUID.
        disk_guid: Uuid,
        /// Dirty extents, merged.
        dirty: Vec<(u64, u64)>,
        /// Free extents of the table (no partition there).
        free: Vec<(u64, u64)>,
    },
}

/// What is dirty on `dev`, read-only. A device drivelet may not write to is refused
/// ([`DiskError::Foreign`]).
pub fn read_dirty(dev: &Path, sector: u64) -> Result<DirtyState, DiskError> {
    let (file, size) = open_to_inspect(dev, sector)?;
    let file: &File = &file;
    match judge_to_write(dev, file, size, sector)? {
        Judged::Blank => Ok(DirtyState::Blank),
        Judged::Foreign(found) => Err(refuse(dev, found)),
        Judged::Drivelet(disk) => {
            let (_, dirty) = dirty_on(file, &disk, size, sector);
            let free = free_extents(size, sector, &used_extents(&disk, sector));
            Ok(DirtyState::Drivelet { disk_guid: *disk.guid(), dirty, free })
        }
    }
}

/// Records `[start, start+len)` of `dev` clean (it was zeroed): the journal loses it.
/// A blank device gets a fresh drivelet GPT whose journal lists the rest of its space
/// as dirty. `expect`: the disk GUID the caller zeroed under (`None`: the device was
/// blank); a different table is refused. Answers the table's disk GUID and what is still
/// dirty.
/// The caller holds the drive's exclusive [`DiskLock`](crate::disk::lock::DiskLock).
pub fn mark_clean(dev: &Path, sector: u64, start: u64, len: u64, expect: Option<Uuid>) -> Result<(Uuid, Vec<(u64, u64)>), DiskError> {
    let _t = crate::disk::timing::step("gpt.mark_clean");
    let lb = block_size(dev, sector)?;
    let (file, size) = open_to_inspect(dev, sector)?;
    let file: &File = &file;
    let changed = |found: String| DiskError::Foreign { device: dev.to_path_buf(), found };
    match (judge_to_write(dev, file, size, sector)?, expect) {
        (Judged::Foreign(found), _) => Err(refuse(dev, found)),
        (Judged::Blank, None) => {
            let mut disk = GptConfig::new()
                .logical_block_size(lb)
                .create_from_device(file, Some(new_disk_guid()))
                .map_err(gpt_error(dev, "create a partition table"))?;
            set_entries(dev, &mut disk, BTreeMap::new())?;
            let free = free_extents(size, sector, &[]);
            let dirty = clean::subtract(&free, &[(start, len)]);
            let j = clean::next_journal(&[], *disk.guid(), dirty.clone());
            commit(dev, &disk, Some(size), &[], Some(&j), &NoteEdit::Keep)?;
            Ok((*disk.guid(), dirty))
        }
        (Judged::Blank, Some(g)) => Err(changed(format!("no partition table any more (drivelet's, disk GUID {g}, was there)"))),
        (Judged::Drivelet(disk), e) if e.is_some_and(|g| g != *disk.guid()) || e.is_none() => {
            Err(changed(format!("another drivelet partition table (disk GUID {}) than the one being cleaned", disk.guid())))
        }
        (Judged::Drivelet(disk), _) => {
            let (slots, dirty) = dirty_on(file, &disk, size, sector);
            let left = clean::subtract(&dirty, &[(start, len)]);
            let had_journal = clean::current(&slots, *disk.guid()).is_some();
            if left != dirty || !had_journal {
                let j = clean::next_journal(&slots, *disk.guid(), left.clone());
                write_journal(dev, &j)?;
            }
            Ok((*disk.guid(), left))
        }
    }
}

/// A device opened read-write for one commit, through a node udev does not watch
/// ([`crate::disk::writer`]).
fn open_for_writing(dev: &Path) -> Result<crate::disk::writer::Writer, DiskError> {
    crate::disk::writer::open(dev)
}

/// A journal's bytes; an error when it lists more extents than its slot holds.
fn encode_journal(dev: &Path, j: &clean::Journal) -> Result<Vec<u8>, DiskError> {
    j.encode().ok_or_else(|| DiskError::Gpt {
        device: dev.to_path_buf(),
        reason: format!("more than {} separate extents are waiting to be cleaned", clean::MAX_EXTENTS),
    })
}

/// Writes a journal alone (no table change) and flushes it.
fn write_journal(dev: &Path, j: &clean::Journal) -> Result<(), DiskError> {
    let bytes = encode_journal(dev, j)?;
    let rw = open_for_writing(dev)?;
    let direct = set_direct(&rw, true);
    write_aligned(dev, &rw, j.slot(), &bytes)?;
    if direct {
        set_direct(&rw, false);
    }
    rw.sync_all().map_err(DiskError::io(format!("fsync {}", dev.display())))
}

/// Turns `O_DIRECT` on or off for `file`; whether it was changed (a file system that
/// cannot do direct I/O, as an image file may sit on, says no, and buffered writes
/// serve there). One descriptor for the zeros and the table: udev answers each close
/// of a descriptor written to, and the drive lock waits for one answer.
fn set_direct(file: &File, on: bool) -> bool {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let Ok(bits) = fcntl(file, FcntlArg::F_GETFL) else { return false };
    let mut flags = OFlag::from_bits_truncate(bits);
    flags.set(OFlag::O_DIRECT, on);
    fcntl(file, FcntlArg::F_SETFL(flags)).is_ok()
}

/// Adds a drivelet partition `[start, start+size)` (bytes, [`ALIGN`]-aligned) with
/// `guid` and the GPT name `label`.
///
/// A device without a GPT first gets a fresh drivelet GPT and protective MBR, but only
/// if nothing at all is found on it. A GPT that is not drivelet's is refused. A
/// partition with the same GUID, start and size already there is success; the same GUID
/// elsewhere, or an overlap with another partition, is a [`DiskError::Conflict`].
/// The caller holds the drive's exclusive [`DiskLock`](crate::disk::lock::DiskLock).
pub fn add_partition(dev: &Path, sector: u64, guid: Uuid, label: &str, start: u64, size: u64) -> Result<(), DiskError> {
    add(dev, sector, guid, label, start, size, 0, false, &NoteEdit::Keep).map(drop)
}

/// What [`add_partition_wiped`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    /// The entry was written now, and the partition's signature areas (its first and
    /// last MiB, as [`crate::disk::fs::wipe_signatures`] zeroes) were zeroed on the
    /// device in the same commit, before the table's first flush.
    Wiped,
    /// The same entry was already in the table: nothing was written or zeroed.
    AlreadyThere,
}

/// [`add_partition`], zeroing the new partition's signature areas through the same
/// descriptor and flushes as the table: a wipe that costs no flush of its own. The
/// space was free in drivelet's own table until this write; nothing outside the new
/// partition is zeroed.
/// `attrs`: the entry's attribute bits ([`super::SNAPSHOT_ATTR`] for a snapshot, else 0).
/// `volume`: the volume's entry in the disk's note, written in the same commit (`None`
/// for a snapshot, which carries a note of its own).
/// The caller holds the drive's exclusive [`DiskLock`](crate::disk::lock::DiskLock).
#[allow(clippy::too_many_arguments)]
pub fn add_partition_wiped(dev: &Path, sector: u64, guid: Uuid, label: &str, start: u64, size: u64, attrs: u64, volume: Option<note::VolumeNote>) -> Result<Added, DiskError> {
    let edit = volume.map_or(NoteEdit::Keep, |v| NoteEdit::Upsert(Box::new(v)));
    add(dev, sector, guid, label, start, size, attrs, true, &edit)
}

#[allow(clippy::too_many_arguments)]
fn add(dev: &Path, sector: u64, guid: Uuid, label: &str, start: u64, size: u64, attrs: u64, wipe: bool, edit: &NoteEdit) -> Result<Added, DiskError> {
    let _t = crate::disk::timing::step("gpt.add");
    check_extent(dev, start, size)?;
    if label.encode_utf16().count() > MAX_LABEL_UNITS || label.contains('\0') {
        return Err(DiskError::invalid(format!(
            "{}: partition name {label:?} is longer than {MAX_LABEL_UNITS} UTF-16 units or holds NUL",
            dev.display()
        )));
    }
    let lb = block_size(dev, sector)?;
    let (file, dev_size) = open_to_inspect(dev, sector)?;
    let file: &File = &file;
    let conflict = |reason: String| DiskError::Conflict { device: dev.to_path_buf(), start, size, reason };

    let (mut disk, fresh) = match judge_to_write(dev, file, dev_size, sector)? {
        Judged::Drivelet(disk) => (*disk, None),
        Judged::Foreign(found) => return Err(refuse(dev, found)),
        Judged::Blank => {
            let disk = GptConfig::new()
                .logical_block_size(lb)
                .create_from_device(file, Some(new_disk_guid()))
                .map_err(gpt_error(dev, "create a partition table"))?;
            (disk, Some(dev_size))
        }
    };

    let first = start / sector;
    let last = (start + size) / sector - 1;
    let mut parts = disk.partitions().clone();
    parts.retain(|_, p| p.is_used());
    for p in parts.values() {
        if p.part_guid == guid {
            if p.first_lba == first && p.last_lba == last && p.part_type_guid.guid == PARTITION_TYPE_GUID && p.flags == attrs {
                return Ok(Added::AlreadyThere);
            }
            return Err(conflict(format!(
                "a partition with GUID {guid} already exists at [{}, +{})",
                p.first_lba * sector,
                (p.last_lba + 1 - p.first_lba) * sector
            )));
        }
        if overlaps(p, first, last) {
            return Err(conflict(format!(
                "overlaps partition {} {:?} at [{}, +{})",
                p.part_guid,
                p.name,
                p.first_lba * sector,
                (p.last_lba + 1 - p.first_lba) * sector
            )));
        }
    }
    let slots = table_slots(&disk, parts.values().map(|p| (p.first_lba, p.last_lba)), dev_size, sector);
    if parts.len() as u64 >= u64::from(slots) {
        return Err(conflict(format!("no free partition slot: the partition table holds {} partitions, the most it can ({slots})", parts.len())));
    }
    let key = parts.keys().next_back().map_or(1, |k| k + 1);
    parts.insert(
        key,
        Partition {
            part_type_guid: PARTITION_TYPE_GUID.into(),
            part_guid: guid,
            first_lba: first,
            last_lba: last,
            flags: attrs,
            name: label.to_string(),
        },
    );
    set_entries(dev, &mut disk, parts)?;
    check_usable(dev, &disk, first, last, dev_size, sector)?;
    let zero: Vec<(u64, u64)> = if wipe {
        crate::disk::fs::wipe_ranges(size).into_iter().map(|(off, len)| (start + off, len)).collect()
    } else {
        Vec::new()
    };
    // A fresh table on a blank device: placement only puts a volume there once the
    // device counts as clean (cleaned, or trusted by policy), so nothing is dirty.
    let journal = fresh.map(|_| clean::next_journal(&[], *disk.guid(), Vec::new()));
    commit(dev, &disk, fresh, &zero, journal.as_ref(), edit)?;
    Ok(Added::Wiped)
}

/// Finds the used entry with `guid`: its key and entry.
fn find_by_guid(disk: &GptDisk<&File>, guid: Uuid) -> Option<(u32, Partition)> {
    disk.partitions().iter().find(|(_, p)| p.is_used() && p.part_guid == guid).map(|(k, p)| (*k, p.clone()))
}

fn ensure_ours(dev: &Path, p: &Partition) -> Result<(), DiskError> {
    if p.part_type_guid.guid == PARTITION_TYPE_GUID {
        Ok(())
    } else {
        Err(DiskError::Gpt {
            device: dev.to_path_buf(),
            reason: format!("partition {} has type {}, not drivelet's; leaving it alone", p.part_guid, p.part_type_guid.guid),
        })
    }
}

/// Removes the drivelet partition with `guid`; `Ok(false)` when there is none (also when
/// the device has no GPT). A GPT that is not drivelet's is refused.
/// The caller holds the drive's exclusive [`DiskLock`](crate::disk::lock::DiskLock).
pub fn remove_partition(dev: &Path, sector: u64, guid: Uuid) -> Result<bool, DiskError> {
    let _t = crate::disk::timing::step("gpt.remove");
    let (file, dev_size) = open_to_inspect(dev, sector)?;
    let file: &File = &file;
    let parsed = {
        let _t = crate::disk::timing::step("gpt.parse");
        open_gpt(dev, file, dev_size, sector)?
    };
    let Some(disk) = parsed else { return Ok(false) };
    let mut disk = judge_gpt(dev, disk)?.map_err(|found| refuse(dev, found))?;
    check_owner(dev, file, &disk)?;
    let Some((key, p)) = find_by_guid(&disk, guid) else { return Ok(false) };
    ensure_ours(dev, &p)?;
    // The freed extent is dirty from the same commit on: it holds the tenant's bytes
    // until the cleaner zeroes it.
    let (slots, dirty) = dirty_on(file, &disk, dev_size, sector);
    let freed = (p.first_lba * sector, (p.last_lba + 1 - p.first_lba) * sector);
    let journal = clean::next_journal(&slots, *disk.guid(), clean::union(&dirty, &[freed]));
    let mut parts = disk.partitions().clone();
    parts.retain(|k, p| p.is_used() && *k != key);
    set_entries(dev, &mut disk, parts)?;
    commit(dev, &disk, None, &[], Some(&journal), &NoteEdit::Remove(guid))?;
    Ok(true)
}

/// Sets the attribute bits of the drivelet partition with `guid` (a moved volume's copy
/// loses [`super::MOVE_ATTR`] at its switch); the same bits are success, no write.
/// `NotFound` when there is no such partition.
/// The caller holds the drive's exclusive [`DiskLock`](crate::disk::lock::DiskLock).
pub fn set_partition_attrs(dev: &Path, sector: u64, guid: Uuid, attrs: u64) -> Result<(), DiskError> {
    change_ours(dev, sector, guid, |disk, key, p, _| {
        if p.flags == attrs {
            return Ok(());
        }
        let mut parts = disk.partitions().clone();
        parts.retain(|_, p| p.is_used());
        if let Some(entry) = parts.get_mut(&key) {
            entry.flags = attrs;
        }
        set_entries(dev, disk, parts)?;
        commit(dev, disk, None, &[], None, &NoteEdit::Keep)
    })
}

/// The finish of a move within one drive, in one commit: the volume's partition
/// `volume` (its old place, when still there) goes, its extent dirty, and the copy
/// `copy` at `copy_start` takes the volume's GUID and the attribute bits `attrs` (its
/// move mark gone); the disk's note gives the volume the copy's size. The table holds
/// the volume's GUID once before and once after, never twice. Already done (no `copy`,
/// the volume at `copy_start`) is success, `Ok(false)`; anything else (the copy
/// elsewhere or unmarked, neither partition there) is refused, nothing written.
/// The caller holds the drive's exclusive [`DiskLock`](crate::disk::lock::DiskLock).
pub fn rename_copy(dev: &Path, sector: u64, volume: Uuid, copy: Uuid, copy_start: u64, attrs: u64) -> Result<bool, DiskError> {
    let _t = crate::disk::timing::step("gpt.rename");
    let (file, dev_size) = open_to_inspect(dev, sector)?;
    let file: &File = &file;
    let not_found = || DiskError::NotFound { device: dev.to_path_buf(), what: format!("the move's copy {copy} at byte {copy_start}") };
    let disk = open_gpt(dev, file, dev_size, sector)?.ok_or_else(not_found)?;
    let mut disk = judge_gpt(dev, disk)?.map_err(|found| refuse(dev, found))?;
    check_owner(dev, file, &disk)?;
    let at = |p: &Partition| p.first_lba * sector;
    let Some((copy_key, c)) = find_by_guid(&disk, copy) else {
        return match find_by_guid(&disk, volume) {
            Some((_, v)) if at(&v) == copy_start => Ok(false),
            _ => Err(not_found()),
        };
    };
    ensure_ours(dev, &c)?;
    if at(&c) != copy_start || c.flags & super::MOVE_ATTR == 0 {
        return Err(DiskError::invalid(format!(
            "{}: partition {copy} at byte {} is not the move's marked copy at byte {copy_start}; left alone",
            dev.display(),
            at(&c)
        )));
    }
    let old = find_by_guid(&disk, volume);
    if let Some((_, v)) = &old {
        ensure_ours(dev, v)?;
    }
    // The old extent is dirty from the same commit on: it holds the volume's bytes
    // until the cleaner zeroes it.
    let journal = old.as_ref().map(|(_, v)| {
        let (slots, dirty) = dirty_on(file, &disk, dev_size, sector);
        let freed = (at(v), (v.last_lba + 1 - v.first_lba) * sector);
        clean::next_journal(&slots, *disk.guid(), clean::union(&dirty, &[freed]))
    });
    let mut parts = disk.partitions().clone();
    parts.retain(|k, p| p.is_used() && old.as_ref().is_none_or(|(old_key, _)| k != old_key));
    if let Some(entry) = parts.get_mut(&copy_key) {
        entry.part_guid = volume;
        entry.flags = attrs;
    }
    set_entries(dev, &mut disk, parts)?;
    let size = (c.last_lba + 1 - c.first_lba) * sector;
    commit(dev, &disk, None, &[], journal.as_ref(), &NoteEdit::Resize(volume, size))?;
    Ok(true)
}

/// Runs `change` on drivelet's own partition with `guid` of drivelet's own table on
/// `dev` (`NotFound` when there is none), with the table parsed and judged (the
/// caller holds the drive's exclusive `DiskLock`): `change` gets the table, the entry's
/// key and the entry, and the device's size.
fn change_ours(
    dev: &Path,
    sector: u64,
    guid: Uuid,
    change: impl FnOnce(&mut GptDisk<&File>, u32, Partition, u64) -> Result<(), DiskError>,
) -> Result<(), DiskError> {
    let (file, dev_size) = open_to_inspect(dev, sector)?;
    let file: &File = &file;
    let not_found = || DiskError::NotFound { device: dev.to_path_buf(), what: format!("partition {guid}") };
    let disk = open_gpt(dev, file, dev_size, sector)?.ok_or_else(not_found)?;
    let mut disk = judge_gpt(dev, disk)?.map_err(|found| refuse(dev, found))?;
    check_owner(dev, file, &disk)?;
    let (key, p) = find_by_guid(&disk, guid).ok_or_else(not_found)?;
    ensure_ours(dev, &p)?;
    change(&mut disk, key, p, dev_size)
}

/// Grows the drivelet partition with `guid` in place to `new_size` bytes; the space
/// after it must be free and inside the GPT's usable area. The same size is success;
/// shrinking is refused.
/// The caller holds the drive's exclusive [`DiskLock`](crate::disk::lock::DiskLock).
pub fn resize_partition(dev: &Path, sector: u64, guid: Uuid, new_size: u64) -> Result<(), DiskError> {
    change_ours(dev, sector, guid, |disk, key, p, dev_size| {
        let start = p.first_lba * sector;
        check_extent(dev, start, new_size)?;
        let old_size = (p.last_lba + 1 - p.first_lba) * sector;
        let conflict = |reason: String| DiskError::Conflict { device: dev.to_path_buf(), start, size: new_size, reason };
        if new_size == old_size {
            return Ok(());
        }
        if new_size < old_size {
            return Err(conflict(format!("partition {guid} is {old_size} bytes; shrinking is not supported")));
        }
        let last = (start + new_size) / sector - 1;
        let mut parts = disk.partitions().clone();
        parts.retain(|_, p| p.is_used());
        if let Some(other) = parts.iter().find(|(k, o)| **k != key && overlaps(o, p.first_lba, last)).map(|(_, o)| o) {
            return Err(conflict(format!(
                "the space after it is taken by partition {} at [{}, +{})",
                other.part_guid,
                other.first_lba * sector,
                (other.last_lba + 1 - other.first_lba) * sector
            )));
        }
        if let Some(entry) = parts.get_mut(&key) {
            entry.last_lba = last;
        }
        set_entries(dev, disk, parts)?;
        check_usable(dev, disk, p.first_lba, last, dev_size, sector)?;
        commit(dev, disk, None, &[], None, &NoteEdit::Resize(guid, new_size))
    })
}

/// Writes drivelet's note of itself on `dev` ([`note`]): `make` gets the current note
/// (`None`: none, or unreadable) and answers the one to write; nothing is written when
/// they are the same. Only a drivelet table is written to; one whose note names another
/// owner (or cannot be read) only when `adopt` (an admin's adoption, or one the config
/// allows). Answers whether a note was written.
/// The caller holds the drive's exclusive [`DiskLock`](crate::disk::lock::DiskLock).
pub fn write_note(dev: &Path, sector: u64, adopt: bool, make: impl FnOnce(Option<&note::DiskNote>) -> note::DiskNote) -> Result<bool, DiskError> {
    let _t = crate::disk::timing::step("gpt.write_note");
    let (file, size) = open_to_inspect(dev, sector)?;
    let file: &File = &file;
    let disk = match judge(dev, file, size, sector)? {
        Judged::Drivelet(disk) => disk,
        Judged::Blank => return Err(DiskError::NotFound { device: dev.to_path_buf(), what: "a drivelet partition table".into() }),
        Judged::Foreign(found) => return Err(refuse(dev, found)),
    };
    if !adopt {
        check_owner(dev, file, &disk)?;
    }
    let slots = note::read_slots(file);
    let current = match note::state_of(&slots, *disk.guid()) {
        note::NoteState::Note(n) => Some(n),
        _ => None,
    };
    let new = make(current.as_ref());
    if current.as_ref() == Some(&new) {
        return Ok(false);
    }
    let (at, bytes) = note::prepare(&slots, *disk.guid(), &new).map_err(|reason| DiskError::Gpt { device: dev.to_path_buf(), reason })?;
    let rw = open_for_writing(dev)?;
    write_direct(dev, &rw, at, &bytes)?;
    rw.sync_all().map_err(DiskError::io(format!("fsync {}", dev.display())))?;
    Ok(true)
}

/// The newest note on `dev`, read without a lock and without judging the disk (the
/// keeper's check whether a write is needed at all; [`write_note`] judges before it
/// writes). `None` when there is none or it cannot be read.
pub fn read_note(dev: &Path) -> Option<note::DiskNote> {
    let file = OpenOptions::new().read(true).custom_flags(libc::O_CLOEXEC).open(dev).ok()?;
    note::read_slots(&file)
        .into_iter()
        .filter_map(|s| if let note::Slot::Valid { seq, note, .. } = s { Some((seq, note)) } else { None })
        .max_by_key(|(seq, _)| *seq)
        .map(|(_, n)| n)
}
