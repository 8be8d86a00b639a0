//! [`examine`]: what a device holds, as far as writing to it goes. One rule for the GPT
//! writer (before every change) and the drive inventory's classification, so a disk
//! called managed is never refused by the writer (see the rules of [`super`]).

use super::*;

/// Opens a device to inspect it before a change: read-only, so that refusing or finding
/// nothing to do never looks like a write to udev (closing a disk opened for writing
/// makes udev re-read its partition table).
pub(super) fn open_to_inspect(dev: &Path, sector: u64) -> Result<(File, u64), DiskError> {
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
pub(super) enum Judged<'f> {
    Blank,
    Drivelet(Box<GptDisk<&'f File>>),
    Foreign(String),
}

/// The one rule: what is on an open device, as far as writing to it goes. Both
/// [`add_partition`] (through it, [`remove_partition`] and [`resize_partition`]) and
/// [`examine`] (the drive inventory's classification) come here.
pub(super) fn judge<'f>(dev: &Path, file: &'f File, size: u64, sector: u64) -> Result<Judged<'f>, DiskError> {
    let parsed = {
        let _t = crate::disk::timing::step("gpt.parse");
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
pub(super) fn judge_gpt<'f>(dev: &Path, disk: GptDisk<&'f File>) -> Result<Result<GptDisk<&'f File>, String>, DiskError> {
    if !is_drivelet_disk_guid(disk.guid()) {
        return Ok(Err(describe_foreign_gpt(&disk)));
    }
    if let Some(words) = crate::disk::fs::probe(dev)?.and_then(|p| p.signature_words()) {
        return Ok(Err(format!("{words} beside a drivelet GPT")));
    }
    Ok(Ok(disk))
}

/// Words for a GPT drivelet did not write: which copy was read, how many partitions it
/// lists (from the table, not the kernel), and its disk GUID.
fn describe_foreign_gpt(disk: &GptDisk<&File>) -> String {
    let n = disk.partitions().values().filter(|p| p.is_used()).count();
    let parts = crate::disk::signature::count(n, "partition");
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
pub(super) fn judge_no_gpt<'f>(dev: &Path, file: &File, size: u64) -> Result<Judged<'f>, DiskError> {
    if size < 512 {
        return Ok(Judged::Foreign(format!("only {size} bytes")));
    }
    let lba0 = read_at(dev, file, 0, 512)?;
    if let Some(p) = crate::disk::fs::probe(dev)? {
        if let Some(words) = p.signature_words() {
            return Ok(Judged::Foreign(words));
        }
        if let Some(t) = p.pt_type.as_deref() {
            let n = (t == "dos").then(|| {
                crate::disk::signature::count_mbr_partitions(&lba0, |lba| {
                    lba.checked_mul(512).filter(|o| o + 512 <= size).and_then(|o| read_at(dev, file, o, 512).ok())
                })
            });
            return Ok(Judged::Foreign(crate::disk::signature::describe_table(t, n)));
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
    let contents = match judge(dev, &file, size, sector)? {
        Judged::Blank => Contents::Blank,
        Judged::Foreign(found) => Contents::Foreign(found),
        Judged::Drivelet(disk) => Contents::Drivelet(to_table(dev, &file, &disk, sector)?),
    };
    unchanged(dev, &file, size)?;
    Ok(contents)
}

/// The writer's refusal of what [`judge`] found foreign.
pub(super) fn refuse(dev: &Path, found: String) -> DiskError {
    DiskError::Foreign { device: dev.to_path_buf(), found }
}
