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
//!   the backup entry array and header), are serialised within the process, and are
//!   fsynced before returning; the backup copy is written (array, then header) and
//!   flushed before the primary copy, so a process killed mid-write leaves one copy
//!   whose header matches its entry array; a device is inspected read-only and opened for writing
//!   only to write, so a refusal or a change already made never looks like a write to
//!   udev; callers hold a [`super::lock::DiskLock`] across the
//!   write and the kernel update that follows, so udev neither probes a half-written
//!   table nor re-reads it behind drivelet's back;
//! - only partitions of drivelet's type are ever removed or resized.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use gpt::disk::LogicalBlockSize;
use gpt::partition::Partition;
use gpt::{GptConfig, GptDisk};
use uuid::Uuid;

use super::DiskError;

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
/// after the primary GPT (first MiB), before the backup GPT (last 33 sectors of 512 B,
/// or 5 of 4 KiB), rounded to [`ALIGN`].
pub fn usable_region(size: u64, sector: u64) -> Option<(u64, u64)> {
    let backup = 33 * sector.max(512);
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

/// Start of the GPT partition name of every drivelet volume.
pub const LABEL_PREFIX: &str = "drivelet:";

/// Longest GPT partition name, in UTF-16 code units.
pub const MAX_LABEL_UNITS: usize = 36;

/// Size in bytes of one partition entry: the usual 128, the only size handled.
const ENTRY_SIZE: u32 = 128;

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
}

impl GptPartition {
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
}

impl GptTable {
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

fn to_table(dev: &Path, disk: &GptDisk<&File>, sector: u64) -> Result<GptTable, DiskError> {
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
        });
    }
    Ok(GptTable { disk_guid: *disk.guid(), partitions })
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
    GptConfig::new()
        .logical_block_size(lb)
        .open_from_device(file)
        .map(Some)
        .map_err(gpt_error(dev, "cannot read the partition table"))
}

/// Reads the GPT of a device; `Ok(None)` when it has none. `sector` is the device's
/// logical block size (512 or 4096).
pub fn read_table(dev: &Path, sector: u64) -> Result<Option<GptTable>, DiskError> {
    let _t = super::timing::step("gpt.read_table");
    let file = File::open(dev).map_err(DiskError::io(format!("open {}", dev.display())))?;
    check_sector(dev, &file, sector)?;
    let size = len_of(dev, &file)?;
    match open_gpt(dev, &file, size, sector)? {
        Some(disk) => to_table(dev, &disk, sector).map(Some),
        None => Ok(None),
    }
}

/// Serialises GPT changes within this process; the callers' [`super::lock::DiskLock`]
/// keeps udev and other processes out.
static GPT_WRITE: Mutex<()> = Mutex::new(());

/// Opens a device to inspect it before a change: read-only, so that refusing or finding
/// nothing to do never looks like a write to udev (closing a disk opened for writing
/// makes udev re-read its partition table).
fn open_to_inspect(dev: &Path, sector: u64) -> Result<(File, u64), DiskError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(dev)
        .map_err(DiskError::io(format!("open {}", dev.display())))?;
    check_sector(dev, &file, sector)?;
    let size = len_of(dev, &file)?;
    Ok((file, size))
}

/// What a device holds, by the one rule the writer applies before every change
/// ([`examine`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Contents {
    /// Nothing at all: no MBR signature, no GPT header (either copy, either sector
    /// size), nothing a full `blkid -p` probe knows. A fresh drivelet GPT may go on it.
    Blank,
    /// A drivelet GPT and nothing else a full probe finds: drivelet may change it.
    Drivelet(GptTable),
    /// Something drivelet did not write, in plain words ("a GPT partition table with 2
    /// partitions not made by drivelet (disk GUID ...)", "an ext4 filesystem").
    Foreign(String),
}

/// The writer's verdict on an open device, with the GPT it may change.
enum Judged<'f> {
    Blank,
    Drivelet(Box<GptDisk<&'f File>>),
    Foreign(String),
}

/// The one rule: what is on an open device, as far as writing to it goes. Both
/// [`add_partition`] (through it, [`remove_partition`] and [`resize_partition`]) and
/// [`examine`] (the drive inventory's classification) come here.
fn judge<'f>(dev: &Path, file: &'f File, size: u64, sector: u64) -> Result<Judged<'f>, DiskError> {
    let parsed = {
        let _t = super::timing::step("gpt.parse");
        open_gpt(dev, file, size, sector)
    };
    match parsed {
        Ok(Some(disk)) => Ok(match judge_gpt(dev, disk)? {
            Ok(disk) => Judged::Drivelet(Box::new(disk)),
            Err(found) => Judged::Foreign(found),
        }),
        Ok(None) => judge_no_gpt(dev, file, size),
        // A GPT this module cannot read or handle is still someone's table.
        Err(DiskError::Gpt { reason, .. }) => Ok(Judged::Foreign(format!("a GPT partition table drivelet cannot use ({reason})"))),
        Err(e) => Err(e),
    }
}

/// A device with a GPT: drivelet's (`Ok(Ok(table))`) only if its disk GUID says so
/// and a full probe finds nothing else on the device (a RAID superblock at its end,
/// say); else what was found, in words.
fn judge_gpt<'f>(dev: &Path, disk: GptDisk<&'f File>) -> Result<Result<GptDisk<&'f File>, String>, DiskError> {
    if !is_drivelet_disk_guid(disk.guid()) {
        return Ok(Err(describe_foreign_gpt(&disk)));
    }
    if let Some(words) = super::fs::probe(dev)?.and_then(|p| p.signature_words()) {
        return Ok(Err(format!("{words} beside a drivelet GPT")));
    }
    Ok(Ok(disk))
}

/// Words for a GPT drivelet did not write: which copy was read, how many partitions it
/// lists (from the table, not the kernel), and its disk GUID.
fn describe_foreign_gpt(disk: &GptDisk<&File>) -> String {
    let n = disk.partitions().values().filter(|p| p.is_used()).count();
    let parts = super::signature::count(n, "partition");
    let guid = disk.guid();
    if disk.primary_header().is_err() {
        format!(
            "a backup GPT at the end of the disk (its primary copy at the start is gone) with {parts} not made by drivelet (disk GUID {guid})"
        )
    } else {
        format!("a GPT partition table with {parts} not made by drivelet (disk GUID {guid})")
    }
}

/// A device without a GPT: blank only if nothing at all is found on it.
fn judge_no_gpt<'f>(dev: &Path, file: &File, size: u64) -> Result<Judged<'f>, DiskError> {
    if size < 512 {
        return Ok(Judged::Foreign(format!("only {size} bytes")));
    }
    let lba0 = read_at(dev, file, 0, 512)?;
    if let Some(p) = super::fs::probe(dev)? {
        if let Some(words) = p.signature_words() {
            return Ok(Judged::Foreign(words));
        }
        if let Some(t) = p.pt_type.as_deref() {
            let n = (t == "dos").then(|| {
                super::signature::count_mbr_partitions(&lba0, |lba| {
                    lba.checked_mul(512).filter(|o| o + 512 <= size).and_then(|o| read_at(dev, file, o, 512).ok())
                })
            });
            return Ok(Judged::Foreign(super::signature::describe_table(t, n)));
        }
    }
    if lba0[510..512] == [0x55, 0xaa] {
        return Ok(Judged::Foreign("a boot sector or MBR (0x55aa at byte 510) with no partition table blkid knows".into()));
    }
    for off in header_offsets(size) {
        if read_at(dev, file, off, 8)? == b"EFI PART" {
            return Ok(Judged::Foreign(format!("a GPT header at byte {off} that cannot be used")));
        }
    }
    Ok(Judged::Blank)
}

/// What a device holds, by the rule the writer applies before every change: read-only,
/// through a descriptor that is never opened for writing. `sector` is the device's
/// logical block size (512 or 4096). An error means the device could not be read.
pub fn examine(dev: &Path, sector: u64) -> Result<Contents, DiskError> {
    let (file, size) = open_to_inspect(dev, sector)?;
    Ok(match judge(dev, &file, size, sector)? {
        Judged::Blank => Contents::Blank,
        Judged::Foreign(found) => Contents::Foreign(found),
        Judged::Drivelet(disk) => Contents::Drivelet(to_table(dev, &disk, sector)?),
    })
}

/// The writer's refusal of what [`judge`] found foreign.
fn refuse(dev: &Path, found: String) -> DiskError {
    DiskError::Foreign { device: dev.to_path_buf(), found }
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

/// Replaces the entries of the table in memory (headers follow the device's size).
fn set_entries(dev: &Path, disk: &mut GptDisk<&File>, parts: BTreeMap<u32, Partition>) -> Result<(), DiskError> {
    disk.update_partitions(parts).map_err(gpt_error(dev, "update the partition table"))?;
    // The headers now place the backup at the device's end; a device that shrank below
    // the table's usable area would put the backup entries over partitions.
    let h = disk.header();
    let entry_lbs = (u64::from(h.num_parts) * u64::from(h.part_size)).div_ceil(disk.logical_block_size().as_u64());
    if h.last_usable + entry_lbs >= h.backup_lba {
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
fn ordered_writes(dev: &Path, disk: &GptDisk<&File>, file: &File, size: u64) -> Result<Vec<(u64, Vec<u8>)>, DiskError> {
    let mut staged = Staged { dev: file, size, pos: 0, writes: Vec::new() };
    disk.with_disk_device(&mut staged, true).write_inplace().map_err(gpt_error(dev, "write the partition table"))?;
    let half = size / 2;
    let (backup, primary): (Vec<_>, Vec<_>) = staged.writes.into_iter().partition(|(off, _)| *off >= half);
    Ok(backup.into_iter().chain(primary).collect())
}

/// Writes the table prepared in `disk` (and, for a fresh table on a device of `fresh`
/// bytes, the protective MBR) through a read-write descriptor opened only for this,
/// backup copy first and flushed, then the primary copy, and flushes it to the device.
fn commit(dev: &Path, disk: &GptDisk<&File>, fresh: Option<u64>) -> Result<(), DiskError> {
    let rw = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(dev)
        .map_err(DiskError::io(format!("open {} for writing", dev.display())))?;
    let size = len_of(dev, &rw)?;
    let half = size / 2;
    let mut in_backup = true;
    for (off, data) in ordered_writes(dev, disk, &rw, size)? {
        if in_backup && off < half {
            // The backup copy is whole on the device before the primary is touched.
            let _t = super::timing::step("gpt.flush");
            rw.sync_data().map_err(DiskError::io(format!("fsync {}", dev.display())))?;
            in_backup = false;
        }
        rw.write_all_at(&data, off).map_err(DiskError::io(format!("write {} at byte {off}", dev.display())))?;
    }
    if let Some(size) = fresh {
        let sectors = size / disk.logical_block_size().as_u64();
        let pmbr = gpt::mbr::ProtectiveMBR::with_lb_size(u32::try_from(sectors - 1).unwrap_or(u32::MAX));
        pmbr.overwrite_lba0(&mut &rw).map_err(|e| DiskError::Gpt {
            device: dev.to_path_buf(),
            reason: format!("write the protective MBR: {e}"),
        })?;
    }
    let _t = super::timing::step("gpt.flush");
    rw.sync_all().map_err(DiskError::io(format!("fsync {}", dev.display())))
}

/// Adds a drivelet partition `[start, start+size)` (bytes, [`ALIGN`]-aligned) with
/// `guid` and the GPT name `label`.
///
/// A device without a GPT first gets a fresh drivelet GPT and protective MBR, but only
/// if nothing at all is found on it. A GPT that is not drivelet's is refused. A
/// partition with the same GUID, start and size already there is success; the same GUID
/// elsewhere, or an overlap with another partition, is a [`DiskError::Conflict`].
pub fn add_partition(dev: &Path, sector: u64, guid: Uuid, label: &str, start: u64, size: u64) -> Result<(), DiskError> {
    let _t = super::timing::step("gpt.add");
    check_extent(dev, start, size)?;
    if label.encode_utf16().count() > MAX_LABEL_UNITS || label.contains('\0') {
        return Err(DiskError::invalid(format!(
            "{}: partition name {label:?} is longer than {MAX_LABEL_UNITS} UTF-16 units or holds NUL",
            dev.display()
        )));
    }
    let lb = block_size(dev, sector)?;
    let _serial = GPT_WRITE.lock().unwrap_or_else(PoisonError::into_inner);
    let (file, dev_size) = open_to_inspect(dev, sector)?;
    let file: &File = &file;
    let conflict = |reason: String| DiskError::Conflict { device: dev.to_path_buf(), start, size, reason };

    let (mut disk, fresh) = match judge(dev, file, dev_size, sector)? {
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
            if p.first_lba == first && p.last_lba == last && p.part_type_guid.guid == PARTITION_TYPE_GUID {
                return Ok(());
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
    if parts.len() as u64 >= u64::from(disk.header().num_parts) {
        return Err(conflict(format!("the GPT is full ({} entries)", disk.header().num_parts)));
    }
    let key = parts.keys().next_back().map_or(1, |k| k + 1);
    parts.insert(
        key,
        Partition {
            part_type_guid: PARTITION_TYPE_GUID.into(),
            part_guid: guid,
            first_lba: first,
            last_lba: last,
            flags: 0,
            name: label.to_string(),
        },
    );
    set_entries(dev, &mut disk, parts)?;
    check_usable(dev, &disk, first, last, dev_size, sector)?;
    commit(dev, &disk, fresh)
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
pub fn remove_partition(dev: &Path, sector: u64, guid: Uuid) -> Result<bool, DiskError> {
    let _t = super::timing::step("gpt.remove");
    let _serial = GPT_WRITE.lock().unwrap_or_else(PoisonError::into_inner);
    let (file, dev_size) = open_to_inspect(dev, sector)?;
    let file: &File = &file;
    let parsed = {
        let _t = super::timing::step("gpt.parse");
        open_gpt(dev, file, dev_size, sector)?
    };
    let Some(disk) = parsed else { return Ok(false) };
    let mut disk = judge_gpt(dev, disk)?.map_err(|found| refuse(dev, found))?;
    let Some((key, p)) = find_by_guid(&disk, guid) else { return Ok(false) };
    ensure_ours(dev, &p)?;
    let mut parts = disk.partitions().clone();
    parts.retain(|k, p| p.is_used() && *k != key);
    set_entries(dev, &mut disk, parts)?;
    commit(dev, &disk, None)?;
    Ok(true)
}

/// Grows the drivelet partition with `guid` in place to `new_size` bytes; the space
/// after it must be free and inside the GPT's usable area. The same size is success;
/// shrinking is refused.
pub fn resize_partition(dev: &Path, sector: u64, guid: Uuid, new_size: u64) -> Result<(), DiskError> {
    let _serial = GPT_WRITE.lock().unwrap_or_else(PoisonError::into_inner);
    let (file, dev_size) = open_to_inspect(dev, sector)?;
    let file: &File = &file;
    let not_found = || DiskError::NotFound { device: dev.to_path_buf(), what: format!("partition {guid}") };
    let disk = open_gpt(dev, file, dev_size, sector)?.ok_or_else(not_found)?;
    let mut disk = judge_gpt(dev, disk)?.map_err(|found| refuse(dev, found))?;
    let (key, p) = find_by_guid(&disk, guid).ok_or_else(not_found)?;
    ensure_ours(dev, &p)?;
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
    set_entries(dev, &mut disk, parts)?;
    check_usable(dev, &disk, p.first_lba, last, dev_size, sector)?;
    commit(dev, &disk, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB: u64 = 1 << 20;

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
        let p = |type_guid, name: &str| GptPartition { guid: Uuid::nil(), type_guid, name: name.into(), start: 0, size: 0 };
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
}
