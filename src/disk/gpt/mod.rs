//! drivelet's GPT conventions, layout arithmetic, and the reading and writing of its
//! partition tables.
//!
//! Rules:
//! - a drivelet GPT is recognised by its disk GUID, whose first group is
//!   [`DISK_GUID_PREFIX`]; a drivelet partition by its type GUID [`PARTITION_TYPE`] and a
//!   name starting with [`LABEL_PREFIX`];
//! - a volume's partition GUID is a UUID v5 of its CSI name in [`VOLUME_GUID_NAMESPACE`],
//!   so the same name always finds the same partition;
//! - usable space starts at 1 MiB and ends before the backup GPT, and every partition
//!   starts and ends on a 1 MiB boundary ([`ALIGN`]);
//! - free extents are computed from the partitions the kernel reports, so capacity can
//!   be answered without reading the disk;
//! - one rule, [`examine`], says what a device holds, and both the writer and the
//!   drive inventory's classification apply it, so a disk called managed is never
//!   refused by the writer: writes go only to a drivelet GPT (its primary copy, or its
//!   backup when the primary is gone) beside which a full `blkid -p` probe finds no
//!   other signature, or to a device where nothing at all is found (no MBR signature,
//!   no GPT header of either copy for either sector size, nothing `blkid -p` knows);
//!   anything else — a GPT of someone else, even only its backup copy at the end of
//!   the disk, a GPT drivelet cannot parse, a signature at either end — is foreign,
//!   named in plain words; a fresh table gets a protective MBR and a drivelet disk GUID;
//! - writes touch only the GPT structures (LBA 0, the primary header and entry array,
//!   the backup entry array and header) and the journal of dirty extents in the rest of
//!   the first MiB ([`crate::disk::clean`]: a removal lists the freed extent there in
//!   the same commit, before its first flush), are serialised by the caller's exclusive
//!   [`super::lock::DiskLock`] on the drive (no lock of the writer's own), and are
//!   fsynced before returning; the backup copy is written (array, then header) and
//!   flushed before the primary copy, so a process killed mid-write leaves one copy
//!   whose header matches its entry array; a device is inspected read-only and opened for writing
//!   only to write, so a refusal or a change already made never looks like a write to
//!   udev; callers hold a [`super::lock::DiskLock`] across the
//!   write and the kernel update that follows, so udev neither probes a half-written
//!   table nor re-reads it behind drivelet's back;
//! - a table drivelet writes has [`TABLE_ENTRIES`] (256) entries, as many partitions
//!   as the kernel gives a disk ([`KERNEL_MAX_PARTITIONS`], 255, is what a table holds);
//!   one of 128 (written before) grows to 256 at its next write when no partition lies
//!   where the larger arrays go ([`growth_blocker`]), in the same crash-safe order as
//!   every write, else keeps 128 and says why ([`GptTable::cannot_grow`]);
//! - only partitions of drivelet's type are ever removed or resized.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use gpt::disk::LogicalBlockSize;
use gpt::partition::Partition;
use gpt::{GptConfig, GptDisk};
use uuid::Uuid;

use super::DiskError;

/// What a device holds, by the one rule the writer applies ([`examine`]).
mod examine;
/// Adding, removing and resizing drivelet partitions, crash-safely.
mod write;

pub use self::examine::{examine, Contents};
pub use self::write::{add_partition, add_partition_wiped, read_note, write_note, NoteEdit, mark_clean, read_dirty, remove_partition, rename_copy, resize_partition, set_partition_attrs, Added, DirtyState};

/// Alignment of every partition start and size.
pub const ALIGN: u64 = 1 << 20;

/// First group of the disk GUID of every GPT drivelet writes ("drvl" in ASCII).
pub const DISK_GUID_PREFIX: &str = "6472766c";

/// Partition type GUID of drivelet volumes.
pub const PARTITION_TYPE: &str = "df8e4bd2-b4f6-46af-b301-8bcbff739f75";

/// Whether a partition-table UUID (udev `ID_PART_TABLE_UUID`) marks a drivelet GPT.
pub fn is_drivelet_table(table_type: Option<&str>, table_uuid: Option<&str>) -> bool {
    table_type == Some("gpt")
        && table_uuid.map(|u| u.to_ascii_lowercase().starts_with(DISK_GUID_PREFIX)).unwrap_or(false)
}

/// The aligned region `[start, end)` of a disk of `size` bytes where partitions may go:
/// after the primary GPT (first MiB), before the backup GPT of [`TABLE_ENTRIES`]
/// entries and the 33 sectors an ordinary one takes (the last 65 sectors of 512 B, or
/// 33 of 4 KiB), rounded to [`ALIGN`].
pub fn usable_region(size: u64, sector: u64) -> Option<(u64, u64)> {
    let sector = sector.max(512);
    let backup = (33 * sector).max((1 + array_sectors(TABLE_ENTRIES, sector)) * sector);
    let end = size.checked_sub(backup)? / ALIGN * ALIGN;
    (end > ALIGN).then_some((ALIGN, end))
}

/// Free aligned extents `(start, len)` of a disk, given its used `(start, len)` ranges.
pub fn free_extents(size: u64, sector: u64, used: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let Some((lo, hi)) = usable_region(size, sector) else { return Vec::new() };
    let mut used: Vec<(u64, u64)> = used.to_vec();
    used.sort();
    let mut free = Vec::new();
    let mut cursor = lo;
    for (s, l) in used {
        let s_al = s / ALIGN * ALIGN;
        let e_al = (s + l).div_ceil(ALIGN) * ALIGN;
        if s_al > cursor {
            free.push((cursor, s_al.min(hi) - cursor));
        }
        cursor = cursor.max(e_al);
        if cursor >= hi {
            break;
        }
    }
    if cursor < hi {
        free.push((cursor, hi - cursor));
    }
    free.retain(|&(_, l)| l >= ALIGN);
    free
}

/// The partition type GUID of drivelet volumes, parsed ([`PARTITION_TYPE`]).
pub const PARTITION_TYPE_GUID: Uuid = uuid::uuid!("df8e4bd2-b4f6-46af-b301-8bcbff739f75");

/// Namespace of the UUID v5 partition GUIDs derived from CSI volume names. Never change
/// it: existing volumes are found by the GUIDs it yields.
pub const VOLUME_GUID_NAMESPACE: Uuid = uuid::uuid!("3148d51a-bb5a-497e-a7d1-3d6d10985865");

/// Namespace of the UUID v5 GUIDs of snapshot partitions, derived from CSI snapshot
/// names (distinct from volumes', so a volume and a snapshot of one name never meet).
/// Never change it.
pub const SNAPSHOT_GUID_NAMESPACE: Uuid = uuid::uuid!("9f0b6a51-3c2e-4d57-9a8e-6c1f40d2b7a3");

/// Attribute bit (one of the 16 the GPT leaves to the partition type) marking a
/// drivelet partition that holds a snapshot: written only by drivelet, in its own
/// table, so no tenant can make a volume look like one.
pub const SNAPSHOT_ATTR: u64 = 1 << 48;

/// Attribute bit marking a drivelet partition that is the copy of a volume being moved
/// to this drive (evacuation) and not yet switched to: never the volume itself. A
/// partition found with it at start-up is a copy cut short (rolled back) unless the
/// volume's record already points at it (then the mark is cleared).
pub const MOVE_ATTR: u64 = 1 << 49;

/// Partition GUID of a CSI snapshot name: deterministic, distinct per name.
pub fn snapshot_partition_guid(name: &str) -> Uuid {
    Uuid::new_v5(&SNAPSHOT_GUID_NAMESPACE, name.as_bytes())
}

/// Start of the GPT partition name of every drivelet volume.
pub const LABEL_PREFIX: &str = "drivelet:";

/// Longest GPT partition name, in UTF-16 code units.
pub const MAX_LABEL_UNITS: usize = 36;

/// Size in bytes of one partition entry: the usual 128, the only size handled.
const ENTRY_SIZE: u32 = 128;

/// Entries of the partition entry array of every table drivelet writes: 256 (32 KiB),
/// twice the usual 128, so a drive holds as many volumes as the kernel gives one disk
/// ([`KERNEL_MAX_PARTITIONS`]). A table drivelet wrote with 128 entries grows to this
/// many at its next write when the space around its arrays allows ([`growth_blocker`]).
pub const TABLE_ENTRIES: u32 = 256;

/// The most partitions Linux gives one disk: partition numbers 1 to 255 (256 minors
/// with the whole disk, `DISK_MAX_PARTS`), for loop, SCSI and NVMe disks alike through
/// extended device numbers. Measured on kernel 6.18 with a loop device (`max_part=0`):
/// BLKPG adds partitions 1, 200 and 255 and refuses 256 and above (EINVAL); the
/// kernel's own GPT reader stops at entry 255 too.
pub const KERNEL_MAX_PARTITIONS: u32 = 255;

/// How many partitions (volumes, snapshots, copies) a table of `entries` entries holds
/// on Linux: its entries, at most [`KERNEL_MAX_PARTITIONS`].
pub fn partition_slots(entries: u32) -> u32 {
    entries.min(KERNEL_MAX_PARTITIONS)
}

/// Sectors of a partition entry array of `entries` entries, for `sector`-byte sectors.
fn array_sectors(entries: u32, sector: u64) -> u64 {
    (u64::from(entries) * u64::from(ENTRY_SIZE)).div_ceil(sector.max(512))
}

/// Why a drivelet table of fewer than [`TABLE_ENTRIES`] entries on a device of `size`
/// bytes cannot grow to that many, in words; `None` when it can. Its primary array
/// grows into drivelet's reserved first MiB (before the note, [`crate::disk::note::SLOTS`]),
/// its backup array towards the start of the disk from the backup header: every
/// partition must lie between the two, and the entries must be of the usual size.
/// `used`: the used entries' `(first, last)` LBAs.
pub fn growth_blocker(part_size: u32, used: impl IntoIterator<Item = (u64, u64)>, size: u64, sector: u64) -> Option<String> {
    if part_size != ENTRY_SIZE {
        return Some(format!("its entries are {part_size} bytes, not {ENTRY_SIZE}"));
    }
    let lbs = array_sectors(TABLE_ENTRIES, sector);
    let first = 2 + lbs;
    let last = (size / sector).checked_sub(2 + lbs).filter(|&l| l >= first);
    let Some(last) = last else {
        return Some(format!("the disk is too small for a {TABLE_ENTRIES}-entry table"));
    };
    for (a, b) in used {
        if a < first {
            return Some(format!(
                "a partition starts at byte {}, inside the first {} bytes a {TABLE_ENTRIES}-entry array needs",
                a * sector,
                first * sector
            ));
        }
        if b > last {
            return Some(format!(
                "a partition ends at byte {}, inside the last {} bytes of the disk, where the backup copy of a {TABLE_ENTRIES}-entry array goes",
                (b + 1) * sector,
                size - (last + 1) * sector
            ));
        }
    }
    None
}

/// One used entry of a GPT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GptPartition {
    /// Unique partition GUID.
    pub guid: Uuid,
    /// Partition type GUID.
    pub type_guid: Uuid,
    /// Partition name.
    pub name: String,
    /// First byte.
    pub start: u64,
    /// Length in bytes.
    pub size: u64,
    /// Attribute bits; of drivelet's partitions, [`SNAPSHOT_ATTR`] marks a snapshot.
    pub attrs: u64,
}

impl GptPartition {
    /// Whether this drivelet partition holds a snapshot, not a volume.
    pub fn is_snapshot(&self) -> bool {
        self.attrs & SNAPSHOT_ATTR != 0
    }

    /// Whether this drivelet partition is a moving volume's copy not yet switched to.
    pub fn is_move_copy(&self) -> bool {
        self.attrs & MOVE_ATTR != 0
    }

    /// Whether this entry is a drivelet volume (type and name).
    pub fn is_drivelet(&self) -> bool {
        self.type_guid == PARTITION_TYPE_GUID && self.name.starts_with(LABEL_PREFIX)
    }
}

/// A GPT as read from a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GptTable {
    /// Disk GUID.
    pub disk_guid: Uuid,
    /// Used entries, in on-disk order.
    pub partitions: Vec<GptPartition>,
    /// The disk's note of itself: its owner and volumes ([`crate::disk::note`]).
    pub note: crate::disk::note::NoteState,
    /// Entries of its partition entry array ([`TABLE_ENTRIES`]; 128 in a table written
    /// before drivelet made 256).
    pub entries: u32,
    /// Why a table of fewer than [`TABLE_ENTRIES`] entries cannot grow to that many at
    /// its next write, in words ([`growth_blocker`]); `None` when it can or has them.
    pub cannot_grow: Option<String>,
}

impl GptTable {
    /// How many partitions this table holds from its next write on: the kernel's limit
    /// once it has (or grows to) [`TABLE_ENTRIES`] entries, else its own entries.
    pub fn slots(&self) -> u32 {
        let entries = if self.cannot_grow.is_none() { self.entries.max(TABLE_ENTRIES) } else { self.entries };
        partition_slots(entries)
    }

    /// Whether drivelet wrote this table (its disk GUID carries [`DISK_GUID_PREFIX`]).
    pub fn is_drivelet(&self) -> bool {
        is_drivelet_disk_guid(&self.disk_guid)
    }
}

/// Whether a disk GUID marks a drivelet GPT.
pub fn is_drivelet_disk_guid(guid: &Uuid) -> bool {
    guid.to_string().starts_with(DISK_GUID_PREFIX)
}

/// [`DISK_GUID_PREFIX`] as the first four bytes of a GUID (its text form's first group).
const DISK_GUID_PREFIX_BYTES: [u8; 4] = *b"drvl";

/// A fresh disk GUID for a drivelet GPT: [`DISK_GUID_PREFIX`] then random bits.
pub fn new_disk_guid() -> Uuid {
    let mut bytes = *Uuid::new_v4().as_bytes();
    bytes[..4].copy_from_slice(&DISK_GUID_PREFIX_BYTES);
    Uuid::from_bytes(bytes)
}

/// Partition GUID of a CSI volume name: deterministic, distinct per name.
pub fn volume_partition_guid(name: &str) -> Uuid {
    Uuid::new_v5(&VOLUME_GUID_NAMESPACE, name.as_bytes())
}

/// GPT partition name marking a drivelet volume: [`LABEL_PREFIX`] and as many whole
/// characters of the volume name as fit in [`MAX_LABEL_UNITS`] UTF-16 units.
pub fn partition_label(name: &str) -> String {
    let mut label = String::from(LABEL_PREFIX);
    let mut units = LABEL_PREFIX.encode_utf16().count();
    for c in name.chars() {
        if c == '\0' {
            break;
        }
        units += c.len_utf16();
        if units > MAX_LABEL_UNITS {
            break;
        }
        label.push(c);
    }
    label
}

fn block_size(dev: &Path, sector: u64) -> Result<LogicalBlockSize, DiskError> {
    LogicalBlockSize::try_from(sector).map_err(|_| {
        DiskError::invalid(format!("{}: unsupported logical block size {sector} (512 or 4096)", dev.display()))
    })
}

fn gpt_error(dev: &Path, what: &str) -> impl FnOnce(gpt::GptError) -> DiskError {
    let device = dev.to_path_buf();
    let what = what.to_string();
    move |e| DiskError::Gpt { device, reason: format!("{what}: {e}") }
}

/// Length in bytes of an open device or image file.
fn len_of(dev: &Path, file: &File) -> Result<u64, DiskError> {
    let mut f = file;
    f.seek(SeekFrom::End(0)).map_err(DiskError::io(format!("size of {}", dev.display())))
}

/// Checks that `sector` is the device's logical block size (block devices only; image
/// files have none).
fn check_sector(dev: &Path, file: &File, sector: u64) -> Result<(), DiskError> {
    let md = file.metadata().map_err(DiskError::io(format!("stat {}", dev.display())))?;
    if !md.file_type().is_block_device() {
        return Ok(());
    }
    nix::ioctl_read_bad!(blksszget, 0x1268, libc::c_int);
    let mut ssz: libc::c_int = 0;
    // SAFETY: the fd is open for the duration of the call and BLKSSZGET writes one int
    // into `ssz`, which lives on this stack frame.
    unsafe { blksszget(file.as_raw_fd(), &mut ssz) }
        .map_err(DiskError::errno(format!("logical block size of {}", dev.display())))?;
    if u64::try_from(ssz).ok() != Some(sector) {
        return Err(DiskError::invalid(format!(
            "{}: logical block size is {ssz}, not the {sector} asked for",
            dev.display()
        )));
    }
    Ok(())
}

fn read_at(dev: &Path, file: &File, offset: u64, len: usize) -> Result<Vec<u8>, DiskError> {
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, offset)
        .map_err(DiskError::io(format!("read {} at byte {offset}", dev.display())))?;
    Ok(buf)
}

/// Where a GPT header signature ("EFI PART") could sit, for both sector sizes.
fn header_offsets(size: u64) -> Vec<u64> {
    [512, 4096, size.saturating_sub(512), size.saturating_sub(4096)]
        .into_iter()
        .filter(|&o| o >= 512 && o + 512 <= size)
        .collect()
}

/// Whether the primary or backup header of a GPT for `sector` carries the signature;
/// an error for a header this module cannot handle (the GPT library asserts 128-byte
/// entries, so that is checked before it reads anything).
fn sniff_header(dev: &Path, file: &File, size: u64, sector: u64) -> Result<bool, DiskError> {
    if size < 3 * sector {
        return Ok(false);
    }
    let mut found = false;
    for off in [sector, size / sector * sector - sector] {
        let h = read_at(dev, file, off, 92)?;
        if &h[..8] != b"EFI PART" {
            continue;
        }
        found = true;
        let num_parts = u32::from_le_bytes([h[80], h[81], h[82], h[83]]);
        let part_size = u32::from_le_bytes([h[84], h[85], h[86], h[87]]);
        if part_size != ENTRY_SIZE || num_parts == 0 || num_parts > 4096 {
            return Err(DiskError::Gpt {
                device: dev.to_path_buf(),
                reason: format!(
                    "header at byte {off} has {num_parts} entries of {part_size} bytes; only {ENTRY_SIZE}-byte entries are handled"
                ),
            });
        }
    }
    Ok(found)
}

fn to_table(dev: &Path, file: &File, disk: &GptDisk<&File>, sector: u64) -> Result<GptTable, DiskError> {
    let mut partitions = Vec::new();
    for p in disk.partitions().values().filter(|p| p.is_used()) {
        let len = p.sectors_len().map_err(|e| DiskError::Gpt {
            device: dev.to_path_buf(),
            reason: format!("partition {}: {e}", p.part_guid),
        })?;
        partitions.push(GptPartition {
            guid: p.part_guid,
            type_guid: p.part_type_guid.guid,
            name: p.name.clone(),
            start: p.first_lba * sector,
            size: len * sector,
            attrs: p.flags,
        });
    }
    let note = crate::disk::note::state_of(&crate::disk::note::read_slots(file), *disk.guid());
    let h = disk.header();
    let size = len_of(dev, file)?;
    let cannot_grow = (h.num_parts < TABLE_ENTRIES)
        .then(|| growth_blocker(h.part_size, disk.partitions().values().filter(|p| p.is_used()).map(|p| (p.first_lba, p.last_lba)), size, sector))
        .flatten()
        .map(|why| format!("its partition table has {} entries and cannot grow to {TABLE_ENTRIES}: {why}", h.num_parts));
    Ok(GptTable { disk_guid: *disk.guid(), partitions, note, entries: h.num_parts, cannot_grow })
}

/// Opens the GPT on an already open device; `Ok(None)` when it has none.
fn open_gpt<'f>(
    dev: &Path,
    file: &'f File,
    size: u64,
    sector: u64,
) -> Result<Option<GptDisk<&'f File>>, DiskError> {
    let lb = block_size(dev, sector)?;
    if !sniff_header(dev, file, size, sector)? {
        let other = if sector == 512 { 4096 } else { 512 };
        if sniff_header(dev, file, size, other)? {
            return Err(DiskError::Gpt {
                device: dev.to_path_buf(),
                reason: format!("the GPT on it was written for {other}-byte sectors, not {sector}"),
            });
        }
        return Ok(None);
    }
    match GptConfig::new().logical_block_size(lb.clone()).open_from_device(file) {
        Ok(disk) => check_entries(dev, &disk, size, sector).map(|()| Some(disk)),
        Err(e) => match from_backup(file, size, sector, lb) {
            // drivelet writes the backup copy whole before the primary: a process killed
            // in the primary's writes leaves its entry array failing the checksum, and the
            // backup holds the table. (The library reads the primary's entries only.) The
            // next write rewrites both.
            Some(disk) => {
                check_entries(dev, &disk, size, sector)?;
                tracing::warn!(disk.path = %dev.display(), error = %e, "the primary partition table is damaged; reading the backup copy");
                Ok(Some(disk))
            }
            None => Err(gpt_error(dev, "cannot read the partition table")(e)),
        },
    }
}

/// Refuses a table whose used entries cannot be reasoned about, before any arithmetic
/// on them: an entry that ends before it starts, lies outside the usable region its
/// header names or reaches the device's last sector (the backup header), or overlaps
/// another. Every LBA of a table that passes times the sector size fits the device.
fn check_entries(dev: &Path, disk: &GptDisk<&File>, size: u64, sector: u64) -> Result<(), DiskError> {
    let bad = |reason: String| DiskError::Gpt { device: dev.to_path_buf(), reason };
    let (lo, hi) = match disk.primary_header().or_else(|_| disk.backup_header()) {
        Ok(h) => (h.first_usable, h.last_usable),
        Err(_) => (0, u64::MAX),
    };
    let end = (size / sector).saturating_sub(1);
    // The headers say where the library writes the next table (each header at its own
    // LBA, each entry array at its start): a header that names any other place than
    // the one the specification gives it would have the writer put a header or an
    // entry array into the reserved area or over partitions.
    // A device that grew keeps its backup where its end was: the backup may lie before
    // the end, never inside the usable region (the next write moves it to the end).
    for (which, h) in [("primary", disk.primary_header()), ("backup", disk.backup_header())] {
        let Ok(h) = h else { continue };
        let entry_lbs = (u64::from(h.num_parts) * u64::from(h.part_size)).div_ceil(sector);
        let (at, copy) = if which == "primary" { (h.current_lba, h.backup_lba) } else { (h.backup_lba, h.current_lba) };
        if at != 1 || copy <= h.last_usable || copy > end {
            return Err(bad(format!(
                "its {which} header says it lies at LBA {} with its copy at LBA {}: the primary belongs at LBA 1 and the backup after the usable region, by LBA {end}",
                h.current_lba, h.backup_lba
            )));
        }
        let array_fits = if which == "primary" {
            h.part_start >= 2 && h.part_start.checked_add(entry_lbs).is_some_and(|e| e <= h.first_usable)
        } else {
            h.part_start > h.last_usable && h.part_start.checked_add(entry_lbs).is_some_and(|e| e <= h.current_lba)
        };
        if !array_fits || h.first_usable > h.last_usable || h.last_usable >= end {
            return Err(bad(format!(
                "its {which} header puts its entry array (LBA {}, {entry_lbs} sectors) or its usable region (LBA {} to {}) where the table cannot be",
                h.part_start, h.first_usable, h.last_usable
            )));
        }
    }
    let mut used: Vec<(u64, u64, u32)> = Vec::new();
    for (n, p) in disk.partitions().iter().filter(|(_, p)| p.is_used()) {
        if p.first_lba > p.last_lba {
            return Err(bad(format!("partition {n} ends (LBA {}) before it starts (LBA {})", p.last_lba, p.first_lba)));
        }
        if p.first_lba < lo || p.last_lba > hi || p.last_lba >= end {
            return Err(bad(format!(
                "partition {n} (LBA {} to {}) lies outside the usable region (LBA {lo} to {})",
                p.first_lba,
                p.last_lba,
                hi.min(end.saturating_sub(1))
            )));
        }
        used.push((p.first_lba, p.last_lba, *n));
    }
    used.sort_unstable();
    if let Some(w) = used.windows(2).find(|w| w[1].0 <= w[0].1) {
        return Err(bad(format!("partitions {} and {} overlap", w[0].2, w[1].2)));
    }
    Ok(())
}

/// The table held by the backup copy at the end of a device of `size` bytes, as a disk
/// ready to be written whole; `None` when the backup is not a valid table either.
fn from_backup<'f>(file: &'f File, size: u64, sector: u64, lb: gpt::disk::LogicalBlockSize) -> Option<GptDisk<&'f File>> {
    // The library reads a header only at the second sector of a device: read the last
    // sector into that place of a buffer.
    let mut buf = vec![0u8; 2 * sector as usize];
    file.read_exact_at(&mut buf[sector as usize..], size.checked_sub(sector)?).ok()?;
    let backup = gpt::header::read_header_from_arbitrary_device(&mut std::io::Cursor::new(buf), lb.clone()).ok()?;
    if backup.current_lba != size / sector - 1 {
        return None;
    }
    let mut f = file;
    let parts = gpt::partition::file_read_partitions(&mut f, &backup, lb).ok()?;
    // A table of the backup's own entry count, headers laid out for it (the library's
    // fresh table has 128 entries, and its headers keep an older one's usable region).
    let mut disk = write::table_of(Path::new("(backup)"), file, size, sector, backup.disk_guid, backup.num_parts).ok()?;
    disk.update_partitions(write::padded(parts, backup.num_parts)).ok()?;
    Some(disk)
}

/// Reads the GPT of a device; `Ok(None)` when it has none. `sector` is the device's
/// logical block size (512 or 4096).
pub fn read_table(dev: &Path, sector: u64) -> Result<Option<GptTable>, DiskError> {
    let _t = crate::disk::timing::step("gpt.read_table");
    let file = File::open(dev).map_err(DiskError::io(format!("open {}", dev.display())))?;
    check_sector(dev, &file, sector)?;
    let size = len_of(dev, &file)?;
    let table = match open_gpt(dev, &file, size, sector)? {
        Some(disk) => to_table(dev, &file, &disk, sector).map(Some)?,
        None => None,
    };
    unchanged(dev, &file, size)?;
    Ok(table)
}

/// Checks that the device open as `file` still has the `size` it had when reading began:
/// a device whose media goes away while it is read (a loop device being detached, a disk
/// pulled) reads as zeros or as nothing before it is gone, and what was read then says
/// nothing about the disk.
fn unchanged(dev: &Path, file: &File, size: u64) -> Result<(), DiskError> {
    let now = len_of(dev, file)?;
    if now == size {
        return Ok(());
    }
    Err(DiskError::Io {
        what: format!("read {}", dev.display()),
        source: std::io::Error::other(format!(
            "its size changed from {size} to {now} bytes while it was read: its media went away or was replaced"
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::write::{ordered_writes, set_entries};
    use super::*;
    const MIB: u64 = 1 << 20;

    #[test]
    fn a_device_whose_size_changed_while_read_is_an_error_not_a_reading() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        let f = File::create(&path).unwrap();
        f.set_len(8 * MIB).unwrap();
        let file = File::open(&path).unwrap();
        assert!(unchanged(&path, &file, 8 * MIB).is_ok());
        // The media goes away (a loop device being detached reads as size 0).
        f.set_len(0).unwrap();
        let e = unchanged(&path, &file, 8 * MIB).unwrap_err().to_string();
        assert!(e.contains("changed from 8388608 to 0 bytes while it was read"), "{e}");
    }

    #[test]
    fn blank_disk_is_one_extent_between_the_two_tables() {
        assert_eq!(free_extents(1024 * MIB, 512, &[]), vec![(MIB, 1022 * MIB)]);
    }

    #[test]
    fn tiny_disks_have_no_room() {
        assert!(free_extents(MIB, 512, &[]).is_empty());
        assert!(free_extents(0, 512, &[]).is_empty());
    }

    #[test]
    fn partitions_split_the_free_space() {
        let used = [(MIB, 100 * MIB), (301 * MIB, 100 * MIB)];
        assert_eq!(
            free_extents(1024 * MIB, 512, &used),
            vec![(101 * MIB, 200 * MIB), (401 * MIB, 622 * MIB)]
        );
    }

    #[test]
    fn unaligned_partitions_round_outwards() {
        let used = [(MIB + 512, MIB)];
        assert_eq!(free_extents(16 * MIB, 512, &used), vec![(3 * MIB, 12 * MIB)]);
    }

    #[test]
    fn drivelet_tables_are_recognised_by_disk_guid() {
        assert!(is_drivelet_table(Some("gpt"), Some("6472766C-1111-4222-8333-444455556666")));
        assert!(!is_drivelet_table(Some("gpt"), Some("12345678-1111-4222-8333-444455556666")));
        assert!(!is_drivelet_table(Some("dos"), Some("6472766c")));
        assert!(!is_drivelet_table(None, None));
    }

    #[test]
    fn volume_guids_are_deterministic_and_distinct_per_name() {
        let a = volume_partition_guid("pvc-1b2c");
        assert_eq!(a, volume_partition_guid("pvc-1b2c"));
        assert_ne!(a, volume_partition_guid("pvc-1b2d"));
        assert_ne!(a, volume_partition_guid("PVC-1B2C"));
        assert_eq!(a.get_version_num(), 5);
        // Pinned: changing the namespace would orphan every existing volume.
        assert_eq!(volume_partition_guid("pvc-1b2c"), Uuid::new_v5(&VOLUME_GUID_NAMESPACE, b"pvc-1b2c"));
        assert_eq!(VOLUME_GUID_NAMESPACE.to_string(), "3148d51a-bb5a-497e-a7d1-3d6d10985865");
    }

    #[test]
    fn labels_keep_the_prefix_and_as_much_of_the_name_as_fits_in_36_utf16_units() {
        assert_eq!(partition_label("pvc-a"), "drivelet:pvc-a");
        let long = "pvc-0123456789abcdef0123456789abcdef";
        let l = partition_label(long);
        assert_eq!(l.encode_utf16().count(), MAX_LABEL_UNITS);
        assert_eq!(l, format!("drivelet:{}", &long[..27]));
        // A character outside the BMP takes two units and is never split.
        let emoji = format!("{}\u{1F600}", "a".repeat(26));
        assert_eq!(partition_label(&emoji), format!("drivelet:{}", "a".repeat(26)));
        assert_eq!(partition_label(&format!("{}\u{1F600}", "a".repeat(25))).encode_utf16().count(), 36);
        assert_eq!(partition_label(""), LABEL_PREFIX);
        assert_eq!(partition_label("a\0b"), "drivelet:a");
    }

    #[test]
    fn fresh_disk_guids_carry_the_drivelet_prefix_and_differ() {
        let (a, b) = (new_disk_guid(), new_disk_guid());
        assert!(a.to_string().starts_with(DISK_GUID_PREFIX), "{a}");
        assert!(is_drivelet_disk_guid(&a) && is_drivelet_table(Some("gpt"), Some(&a.to_string().to_uppercase())));
        assert_ne!(a, b);
        assert!(!is_drivelet_disk_guid(&Uuid::nil()));
    }

    #[test]
    fn the_parsed_partition_type_is_the_documented_one() {
        assert_eq!(PARTITION_TYPE_GUID.to_string(), PARTITION_TYPE);
    }

    #[test]
    fn drivelet_partitions_need_both_the_type_and_the_name_prefix() {
        let p = |type_guid, name: &str| GptPartition { guid: Uuid::nil(), type_guid, name: name.into(), start: 0, size: 0, attrs: 0 };
        assert!(p(PARTITION_TYPE_GUID, "drivelet:x").is_drivelet());
        assert!(!p(PARTITION_TYPE_GUID, "x").is_drivelet());
        assert!(!p(Uuid::nil(), "drivelet:x").is_drivelet());
    }

    /// CRC-32 (ISO-HDLC), as the GPT checksums use it.
    fn crc32(bytes: &[u8]) -> u32 {
        let mut c = !0u32;
        for b in bytes {
            c ^= u32::from(*b);
            for _ in 0..8 {
                c = if c & 1 == 1 { (c >> 1) ^ 0xEDB8_8320 } else { c >> 1 };
            }
        }
        !c
    }

    /// The partition GUIDs a GPT header at `lba` of `img` lists, when the header and
    /// the entry array it names both pass their checksums.
    fn consistent_copy(img: &[u8], lba: u64) -> Option<Vec<Uuid>> {
        let h = &img[(lba * 512) as usize..(lba * 512 + 512) as usize];
        let le32 = |o: usize| u32::from_le_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
        let le64 = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap());
        if &h[..8] != b"EFI PART" {
            return None;
        }
        let mut hdr = h[..le32(12) as usize].to_vec();
        hdr[16..20].fill(0);
        let (start, count, size) = (le64(72) as usize * 512, le32(80) as usize, le32(84) as usize);
        let array = &img[start..start + count * size];
        if crc32(&hdr) != le32(16) || crc32(array) != le32(88) {
            return None;
        }
        let used = array.chunks(size).filter(|e| e[..16] != [0u8; 16]);
        Some(used.map(|e| Uuid::from_bytes_le(e[16..32].try_into().unwrap())).collect())
    }

    #[test]
    fn a_drivelet_table_with_a_reversed_or_overlapping_entry_is_refused_before_its_lbas_are_used() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk.img");
        let size = 64 * MIB;
        std::fs::File::create(&img).unwrap().set_len(size).unwrap();
        add_partition(&img, 512, volume_partition_guid("a"), "drivelet:a", MIB, 4 * MIB).unwrap();
        add_partition(&img, 512, volume_partition_guid("b"), "drivelet:b", 8 * MIB, 4 * MIB).unwrap();
        let base = std::fs::read(&img).unwrap();
        // Edits entry 0 or 1 of both copies' arrays (LBA 2, and the 32 sectors before the
        // backup header), then makes every checksum right again.
        let edited = |entry: usize, edit: &dyn Fn(&mut [u8])| {
            let mut b = base.clone();
            for array in [1024, (size - 33 * 512) as usize] {
                edit(&mut b[array + 128 * entry..array + 128 * (entry + 1)]);
            }
            std::fs::write(&img, &b).unwrap();
            let f = std::fs::File::options().read(true).write(true).open(&img).unwrap();
            crate::fuzz::repair_checksums(&f, size).unwrap();
            examine(&img, 512).unwrap()
        };
        let swap = |e: &mut [u8]| {
            let (first, last) = (e[32..40].to_vec(), e[40..48].to_vec());
            e[32..40].copy_from_slice(&last);
            e[40..48].copy_from_slice(&first);
        };
        let past_the_end = |e: &mut [u8]| e[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
        let over_a = |e: &mut [u8]| e[32..40].copy_from_slice(&(2 * MIB / 512).to_le_bytes());
        for (what, entry, edit, words) in [
            ("reversed", 0, &swap as &dyn Fn(&mut [u8]), "before it starts"),
            ("past the end", 0, &past_the_end, "outside the usable region"),
            ("overlapping", 1, &over_a, "overlap"),
        ] {
            match edited(entry, edit) {
                Contents::Foreign(found) => assert!(found.contains("cannot use") && found.contains(words), "{what}: {found}"),
                other => panic!("{what}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_drivelet_table_whose_headers_name_other_places_is_refused_and_never_written() {
        // Found by the fuzzer: a primary header at LBA 1 saying it lies at LBA 16 had the
        // writer put the "primary" there (drivelet's note slot) while the reader kept
        // reading LBA 1; an entry array placed elsewhere would be written over data.
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk.img");
        let size = 64 * MIB;
        std::fs::File::create(&img).unwrap().set_len(size).unwrap();
        add_partition(&img, 512, volume_partition_guid("a"), "drivelet:a", MIB, 4 * MIB).unwrap();
        let base = std::fs::read(&img).unwrap();
        let backup = (size - 512) as usize;
        let put = |b: &mut Vec<u8>, at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        for (what, edit) in [
            ("primary says LBA 16", &(|b: &mut Vec<u8>| put(b, 512 + 24, 16)) as &dyn Fn(&mut Vec<u8>)),
            ("primary's copy inside the usable region", &|b: &mut Vec<u8>| put(b, 512 + 32, 4096)),
            ("primary's entry array over a partition", &|b: &mut Vec<u8>| put(b, 512 + 72, 2048)),
            ("backup's entry array over a partition", &|b: &mut Vec<u8>| put(b, backup + 72, 2048)),
        ] {
            let mut b = base.clone();
            edit(&mut b);
            std::fs::write(&img, &b).unwrap();
            let f = std::fs::File::options().read(true).write(true).open(&img).unwrap();
            crate::fuzz::repair_checksums(&f, size).unwrap();
            let before = std::fs::read(&img).unwrap();
            match examine(&img, 512).unwrap() {
                Contents::Foreign(found) => assert!(found.contains("cannot use") && found.contains("header"), "{what}: {found}"),
                other => panic!("{what}: {other:?}"),
            }
            assert!(add_partition(&img, 512, volume_partition_guid("b"), "drivelet:b", 8 * MIB, MIB).is_err(), "{what}: written");
            assert!(std::fs::read(&img).unwrap() == before, "{what}: not a byte changed");
        }
    }

    #[test]
    fn a_table_write_cut_short_anywhere_leaves_one_copy_that_passes_its_checksums() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk.img");
        let size = 64 * MIB;
        std::fs::File::create(&img).unwrap().set_len(size).unwrap();
        let (a, b) = (volume_partition_guid("a"), volume_partition_guid("b"));
        add_partition(&img, 512, a, "drivelet:a", MIB, 4 * MIB).unwrap();
        let base = std::fs::read(&img).unwrap();
        let backup_lba = size / 512 - 1;
        assert_eq!(consistent_copy(&base, 1), Some(vec![a]));
        assert_eq!(consistent_copy(&base, backup_lba), Some(vec![a]));

        // The writes adding a second partition, in the order commit makes them.
        let file = std::fs::File::open(&img).unwrap();
        let mut disk = open_gpt(&img, &file, size, 512).unwrap().unwrap();
        let mut parts = disk.partitions().clone();
        parts.retain(|_, p| p.is_used());
        let next = parts.keys().next_back().unwrap() + 1;
        let mut entry = parts.values().next().unwrap().clone();
        (entry.part_guid, entry.first_lba, entry.last_lba, entry.name) = (b, 8 * MIB / 512, 12 * MIB / 512 - 1, "drivelet:b".into());
        parts.insert(next, entry);
        set_entries(&img, &mut disk, parts).unwrap();
        let writes = ordered_writes(&img, &disk, &file, size).unwrap();
        assert!(writes.len() > 2, "the table is written in pieces: {}", writes.len());

        for cut in 0..=writes.len() {
            let mut now = base.clone();
            for (off, data) in &writes[..cut] {
                now[*off as usize..*off as usize + data.len()].copy_from_slice(data);
            }
            let copies = [consistent_copy(&now, 1), consistent_copy(&now, backup_lba)];
            assert!(copies.iter().any(Option::is_some), "cut after {cut} of {} writes: neither copy passes its checksums", writes.len());
            for c in copies.into_iter().flatten() {
                assert!(c == vec![a] || c == vec![a, b], "cut after {cut}: a copy lists {c:?}");
            }
        }
        let mut end = base.clone();
        for (off, data) in &writes {
            end[*off as usize..*off as usize + data.len()].copy_from_slice(data);
        }
        assert_eq!(consistent_copy(&end, 1), Some(vec![a, b]));
        assert_eq!(consistent_copy(&end, backup_lba), Some(vec![a, b]));
    }

    /// An image of `size` bytes holding a drivelet GPT of 128 entries (as drivelet wrote
    /// them before it made 256) with partitions `(name, start, size)`.
    fn legacy_table(img: &Path, size: u64, parts: &[(&str, u64, u64)]) {
        std::fs::File::create(img).unwrap().set_len(size).unwrap();
        let file = OpenOptions::new().read(true).write(true).open(img).unwrap();
        let mut disk = GptConfig::new().writable(true).logical_block_size(LogicalBlockSize::Lb512).create_from_device(&file, Some(new_disk_guid())).unwrap();
        let entries: BTreeMap<u32, Partition> = parts
            .iter()
            .enumerate()
            .map(|(i, (name, start, len))| {
                let p = Partition {
                    part_type_guid: PARTITION_TYPE_GUID.into(),
                    part_guid: volume_partition_guid(name),
                    first_lba: start / 512,
                    last_lba: (start + len) / 512 - 1,
                    flags: 0,
                    name: partition_label(name),
                };
                (i as u32 + 1, p)
            })
            .collect();
        disk.update_partitions(entries).unwrap();
        assert_eq!(disk.header().num_parts, 128);
        disk.write_inplace().unwrap();
        gpt::mbr::ProtectiveMBR::with_lb_size(u32::try_from(size / 512 - 1).unwrap()).overwrite_lba0(&mut &file).unwrap();
    }

    fn drivelet_table_of(img: &Path) -> GptTable {
        match examine(img, 512).unwrap() {
            Contents::Drivelet(t) => t,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_new_table_has_256_entries_within_the_reserved_first_mib_and_the_backup_at_the_end() {
        // The primary array of 256 entries ends before drivelet's note, for both sector sizes.
        for sector in [512u64, 4096] {
            assert!((2 + array_sectors(TABLE_ENTRIES, sector)) * sector <= crate::disk::note::SLOTS[0], "{sector}");
        }
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk.img");
        let size = 64 * MIB + 20 * 1024; // not a whole MiB: the backup array reaches into the last one
        std::fs::File::create(&img).unwrap().set_len(size).unwrap();
        add_partition(&img, 512, volume_partition_guid("a"), "drivelet:a", MIB, 4 * MIB).unwrap();
        let t = drivelet_table_of(&img);
        assert_eq!((t.entries, t.cannot_grow.as_deref(), t.slots()), (256, None, 255));
        let bytes = std::fs::read(&img).unwrap();
        let backup_lba = size / 512 - 1;
        assert_eq!(consistent_copy(&bytes, 1), Some(vec![volume_partition_guid("a")]));
        assert_eq!(consistent_copy(&bytes, backup_lba), Some(vec![volume_partition_guid("a")]));
        let h = |lba: u64, at: usize| u64::from_le_bytes(bytes[(lba * 512) as usize + at..(lba * 512) as usize + at + 8].try_into().unwrap());
        // first usable, last usable, entry array start; the backup array right before its header
        assert_eq!((h(1, 40), h(1, 48), h(1, 72)), (66, backup_lba - 65, 2));
        assert_eq!((h(backup_lba, 40), h(backup_lba, 48), h(backup_lba, 72)), (66, backup_lba - 65, backup_lba - 64));
        // The usable region leaves the larger backup array alone.
        let (_, end) = usable_region(size, 512).unwrap();
        assert!(end <= (backup_lba - 64) * 512, "{end}");
    }

    #[test]
    fn a_table_holds_as_many_partitions_as_the_kernel_allows_and_the_next_is_refused_in_words() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk.img");
        std::fs::File::create(&img).unwrap().set_len(300 * MIB).unwrap();
        for i in 0..u64::from(KERNEL_MAX_PARTITIONS) {
            add_partition(&img, 512, volume_partition_guid(&format!("v{i}")), &format!("drivelet:v{i}"), MIB + i * MIB, MIB).unwrap();
        }
        let t = drivelet_table_of(&img);
        assert_eq!(t.partitions.len(), 255);
        let e = add_partition(&img, 512, volume_partition_guid("one-more"), "drivelet:one-more", 280 * MIB, MIB).unwrap_err().to_string();
        assert!(e.contains("no free partition slot: the partition table holds 255 partitions, the most it can (255)"), "{e}");
        // Removing one frees its slot.
        assert!(remove_partition(&img, 512, volume_partition_guid("v7")).unwrap());
        add_partition(&img, 512, volume_partition_guid("one-more"), "drivelet:one-more", 280 * MIB, MIB).unwrap();
    }

    #[test]
    fn a_128_entry_table_grows_to_256_at_its_next_write_keeping_every_partition() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk.img");
        let size = 64 * MIB;
        legacy_table(&img, size, &[("a", MIB, 4 * MIB), ("b", 8 * MIB, 4 * MIB)]);
        let t = drivelet_table_of(&img);
        assert_eq!((t.entries, t.cannot_grow.as_deref(), t.slots()), (128, None, 255), "it can grow, so it counts 255 slots");
        add_partition(&img, 512, volume_partition_guid("c"), "drivelet:c", 16 * MIB, MIB).unwrap();
        let t = drivelet_table_of(&img);
        assert_eq!(t.entries, 256);
        let names: Vec<&str> = t.partitions.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["drivelet:a", "drivelet:b", "drivelet:c"]);
        let bytes = std::fs::read(&img).unwrap();
        let all = Some(["a", "b", "c"].map(volume_partition_guid).to_vec());
        assert_eq!((consistent_copy(&bytes, 1), consistent_copy(&bytes, size / 512 - 1)), (all.clone(), all));
    }

    #[test]
    fn a_128_entry_table_with_a_partition_where_the_larger_backup_array_goes_keeps_128_and_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk.img");
        // 20 KiB past a whole MiB: the old rule let a partition end 17 KiB before the
        // end, inside the 33 KiB a 256-entry backup copy needs.
        let size = 16 * MIB + 20 * 1024;
        legacy_table(&img, size, &[("a", MIB, 15 * MIB)]);
        let t = drivelet_table_of(&img);
        assert_eq!((t.entries, t.slots()), (128, 128));
        let why = t.cannot_grow.expect("cannot grow");
        assert_eq!(why, "its partition table has 128 entries and cannot grow to 256: a partition ends at byte 16777216, inside the last 33280 bytes of the disk, where the backup copy of a 256-entry array goes");
        // Writes still work, at 128 entries.
        assert!(remove_partition(&img, 512, volume_partition_guid("a")).unwrap());
        let t = drivelet_table_of(&img);
        assert_eq!(t.entries, 256, "with the partition gone, the next write grew it");
    }

    #[test]
    fn a_growth_cut_short_anywhere_leaves_a_table_that_reads_with_every_partition() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk.img");
        let size = 64 * MIB;
        let (a, b) = (volume_partition_guid("a"), volume_partition_guid("b"));
        legacy_table(&img, size, &[("a", MIB, 4 * MIB)]);
        let base = std::fs::read(&img).unwrap();

        // The writes adding b and growing the table, in the order commit makes them.
        let file = std::fs::File::open(&img).unwrap();
        let mut disk = open_gpt(&img, &file, size, 512).unwrap().unwrap();
        let mut parts = disk.partitions().clone();
        parts.retain(|_, p| p.is_used());
        let mut entry = parts.values().next().unwrap().clone();
        (entry.part_guid, entry.first_lba, entry.last_lba, entry.name) = (b, 8 * MIB / 512, 12 * MIB / 512 - 1, "drivelet:b".into());
        parts.insert(2, entry);
        set_entries(&img, &mut disk, parts).unwrap();
        assert_eq!(disk.header().num_parts, 256);
        let writes = ordered_writes(&img, &disk, &file, size).unwrap();
        drop(file);

        let cut_img = dir.path().join("cut.img");
        for cut in 0..=writes.len() {
            let mut now = base.clone();
            for (off, data) in &writes[..cut] {
                now[*off as usize..*off as usize + data.len()].copy_from_slice(data);
            }
            std::fs::write(&cut_img, &now).unwrap();
            let t = match examine(&cut_img, 512) {
                Ok(Contents::Drivelet(t)) => t,
                other => panic!("cut after {cut} of {} writes: {other:?}", writes.len()),
            };
            let got: Vec<Uuid> = t.partitions.iter().map(|p| p.guid).collect();
            assert!(got == vec![a] || got == vec![a, b], "cut after {cut}: {got:?}");
            // The next write (the retried create, say) succeeds and grows the table.
            add_partition(&cut_img, 512, b, "drivelet:b", 8 * MIB, 4 * MIB).unwrap_or_else(|e| panic!("cut after {cut}: {e}"));
            let t = drivelet_table_of(&cut_img);
            assert_eq!((t.entries, t.partitions.iter().map(|p| p.guid).collect::<Vec<_>>()), (256, vec![a, b]), "cut after {cut}");
        }
    }

    #[test]
    fn growth_needs_every_partition_between_the_larger_arrays() {
        let size = 64 * MIB;
        let end = size / 512;
        assert_eq!(growth_blocker(128, [(2048, 4095)], size, 512), None);
        assert_eq!(growth_blocker(128, [(2048, end - 66)], size, 512), None);
        assert!(growth_blocker(128, [(2048, end - 65)], size, 512).unwrap().contains("backup copy of a 256-entry array"));
        assert!(growth_blocker(128, [(40, 4095)], size, 512).unwrap().contains("starts at byte 20480, inside the first 33792 bytes"));
        assert!(growth_blocker(256, [], size, 512).unwrap().contains("entries are 256 bytes"));
        assert!(growth_blocker(128, [], 64 * 512, 512).unwrap().contains("too small"));
        // 4 KiB sectors: an array of 8 sectors.
        assert_eq!(growth_blocker(128, [(256, 511)], size, 4096), None);
        assert_eq!(growth_blocker(128, [(256, size / 4096 - 10)], size, 4096), None);
        assert!(growth_blocker(128, [(256, size / 4096 - 9)], size, 4096).is_some());
    }

    #[test]
    fn a_move_within_one_drive_finishes_in_one_commit_that_gives_the_copy_the_volume_guid() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk.img");
        std::fs::File::create(&img).unwrap().set_len(64 * MIB).unwrap();
        let (v, next, copy) = (volume_partition_guid("v"), volume_partition_guid("next"), Uuid::from_u128(0xc0b1));
        add_partition(&img, 512, v, "drivelet:v", MIB, MIB).unwrap();
        add_partition(&img, 512, next, "drivelet:next", 2 * MIB, MIB).unwrap();
        add_partition_wiped(&img, 512, copy, "drivelet:v", 8 * MIB, 4 * MIB, MOVE_ATTR, None).unwrap();
        // The copy elsewhere than said, or a partition that is not a marked copy: refused.
        let e = rename_copy(&img, 512, v, copy, 9 * MIB, 0).unwrap_err().to_string();
        assert!(e.contains("is not the move's marked copy at byte 9437184; left alone"), "{e}");
        let e = rename_copy(&img, 512, v, next, 2 * MIB, 0).unwrap_err().to_string();
        assert!(e.contains("left alone"), "{e}");
        assert!(rename_copy(&img, 512, v, copy, 8 * MIB, 0).unwrap(), "renamed now");
        let t = drivelet_table_of(&img);
        let mut got: Vec<(Uuid, u64, u64, u64)> = t.partitions.iter().map(|q| (q.guid, q.start, q.size, q.attrs)).collect();
        got.sort_by_key(|g| g.1);
        assert_eq!(got, vec![(next, 2 * MIB, MIB, 0), (v, 8 * MIB, 4 * MIB, 0)], "the volume's GUID once, at the copy's place, unmarked");
        match read_dirty(&img, 512).unwrap() {
            DirtyState::Drivelet { dirty, .. } => assert!(dirty.contains(&(MIB, MIB)), "the old extent is dirty: {dirty:?}"),
            DirtyState::Blank => panic!("a drivelet table"),
        }
        // Again (a restart after the commit): done already, nothing written.
        let before = std::fs::read(&img).unwrap();
        assert!(!rename_copy(&img, 512, v, copy, 8 * MIB, 0).unwrap());
        assert!(std::fs::read(&img).unwrap() == before, "no write");
        // Neither the copy nor the volume at the copy's place: refused.
        assert!(rename_copy(&img, 512, v, copy, 16 * MIB, 0).is_err());
    }
}
