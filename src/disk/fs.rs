//! Filesystems and signatures on a device, through the real tools (`blkid`,
//! `mkfs.ext4`, `mkfs.xfs`) and plain reads and writes.
//!
//! Rules:
//! - probing is low-level (`blkid -p`, no cache), so it sees what is on the device now;
//!   a partition table inside a device counts as a signature, so it is never mistaken
//!   for a blank device;
//! - only ext4 and xfs are made, without discards (discarding a large device is slow,
//!   and on loop devices it punches holes in the backing file);
//! - wiping opens the device exclusively (`O_EXCL`), so a mounted or held device is
//!   refused rather than wiped, and fsyncs before returning;
//! - a tool's failure carries its exit status and stderr.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use super::DiskError;

/// Space and inode usage of a mounted filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    /// Total bytes.
    pub total_bytes: u64,
    /// Bytes available to unprivileged users.
    pub available_bytes: u64,
    /// Bytes used.
    pub used_bytes: u64,
    /// Total inodes.
    pub total_inodes: u64,
    /// Free inodes.
    pub free_inodes: u64,
    /// Used inodes.
    pub used_inodes: u64,
}

impl Usage {
    /// Percent used, of blocks or of inodes, whichever is higher (0 to 100).
    pub fn percent_used(&self) -> u8 {
        let pct = |used: u64, total: u64| if total == 0 { 0 } else { (used.saturating_mul(100) / total).min(100) };
        // Blocks reserved for root count as used: an application sees them as gone.
        let blocks = pct(self.total_bytes.saturating_sub(self.available_bytes), self.total_bytes);
        blocks.max(pct(self.used_inodes, self.total_inodes)) as u8
    }
}

/// Usage of the filesystem mounted at `path` (statvfs).
pub fn usage(path: &Path) -> Result<Usage, DiskError> {
    let st = nix::sys::statvfs::statvfs(path)
        .map_err(|e| DiskError::Io { what: format!("statvfs {}", path.display()), source: e.into() })?;
    let frsize = st.fragment_size() as u64;
    let total_bytes = st.blocks() as u64 * frsize;
    let free_bytes = st.blocks_free() as u64 * frsize;
    Ok(Usage {
        total_bytes,
        available_bytes: st.blocks_available() as u64 * frsize,
        used_bytes: total_bytes.saturating_sub(free_bytes),
        total_inodes: st.files() as u64,
        free_inodes: st.files_free() as u64,
        used_inodes: (st.files() as u64).saturating_sub(st.files_free() as u64),
    })
}

/// Verdict of one read-only filesystem check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fsck {
    /// No problem found.
    Clean,
    /// The checker found corruption; its words.
    Corrupt(String),
    /// The checker could not run or judge (busy device, unknown fs, tool error).
    Undecided(String),
}

/// Runs a read-only check (`e2fsck -n -f`, `xfs_repair -n`) of an unmounted
/// filesystem; nothing is written to the device.
pub fn check_readonly(dev: &Path, fs: &str) -> Fsck {
    let mut cmd = match fs {
        "ext4" | "ext3" | "ext2" => {
            let mut c = Command::new("e2fsck");
            c.arg("-n").arg("-f").arg(dev);
            c
        }
        "xfs" => {
            let mut c = Command::new("xfs_repair");
            c.arg("-n").arg(dev);
            c
        }
        other => return Fsck::Undecided(format!("no read-only checker for {other}")),
    };
    let out = match run(fs, cmd.stdout(Stdio::piped()).stderr(Stdio::piped())) {
        Ok(o) => o,
        Err(e) => return Fsck::Undecided(e.to_string()),
    };
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let summary = |t: &str| {
        t.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("Pass ") && !l.starts_with("e2fsck ") && !l.starts_with("Phase "))
            .filter(|l| !l.starts_with("- ") && !l.starts_with("Warning: skipping"))
            .take(3)
            .collect::<Vec<_>>()
            .join(" / ")
    };
    match (fs, out.status.code()) {
        (_, Some(0)) => Fsck::Clean,
        // e2fsck: 4 = errors left uncorrected (with -n, any error found).
        ("ext4" | "ext3" | "ext2", Some(c)) if c & 4 != 0 && c & 8 == 0 => Fsck::Corrupt(summary(&text)),
        // xfs_repair -n: 1 = corruption found.
        ("xfs", Some(1)) => Fsck::Corrupt(summary(&text)),
        (_, code) => Fsck::Undecided(format!("exit {code:?}: {}", summary(&text))),
    }
}

/// Filesystems [`mkfs`] makes.
pub const SUPPORTED_FS: &[&str] = &["ext4", "xfs"];

/// Bytes zeroed at each end of a device by [`wipe_signatures`].
pub const WIPE_LEN: u64 = 1 << 20;

fn run(tool: &str, cmd: &mut Command) -> Result<Output, DiskError> {
    cmd.stdin(Stdio::null())
        .output()
        .map_err(DiskError::io(format!("run {tool}")))
}

fn tool_error(tool: &str, dev: &Path, out: &Output) -> DiskError {
    DiskError::Tool {
        tool: tool.to_string(),
        message: format!("{} on {}: {}", out.status, dev.display(), String::from_utf8_lossy(&out.stderr).trim()),
    }
}

/// The signature `blkid -p -o export` reports: `TYPE` (filesystem, swap, RAID or LVM
/// member, ...), or else a partition table as `partition-table:<PTTYPE>`.
fn signature_of(export: &str) -> Option<String> {
    let get = |key| export_value(export, key);
    get("TYPE").map(str::to_string).or_else(|| get("PTTYPE").map(|t| format!("partition-table:{t}")))
}

/// The non-empty value of `key` in `blkid -o export` output.
fn export_value<'a>(export: &'a str, key: &str) -> Option<&'a str> {
    export
        .lines()
        .find_map(|l| l.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// What a low-level `blkid -p` probe found on a device.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Probed {
    /// `TYPE`: a filesystem, swap, RAID or volume-manager member, encrypted volume...
    pub fs_type: Option<String>,
    /// `USAGE`: filesystem, raid, crypto, other.
    pub usage: Option<String>,
    /// `VERSION` of that signature (md superblock format, LUKS version, FAT size).
    pub version: Option<String>,
    /// `PTTYPE`: a partition table (`gpt`, `dos`, `PMBR`, ...).
    pub pt_type: Option<String>,
    /// More than one signature where only one may be: blkid names none of them.
    pub ambivalent: bool,
}

impl Probed {
    /// The signature in plain words ("an ext4 filesystem"); `None` when the probe found
    /// only a partition table or nothing.
    pub fn signature_words(&self) -> Option<String> {
        if self.ambivalent {
            return Some("more than one signature (blkid calls the result ambivalent; `wipefs` lists them)".into());
        }
        let t = self.fs_type.as_deref()?;
        Some(super::signature::describe(t, self.usage.as_deref(), self.version.as_deref()))
    }
}

/// Parses `blkid -p -o export` output.
fn probed_of(export: &str) -> Probed {
    let get = |key| export_value(export, key).map(str::to_string);
    Probed { fs_type: get("TYPE"), usage: get("USAGE"), version: get("VERSION"), pt_type: get("PTTYPE"), ambivalent: false }
}

/// Everything a low-level `blkid -p` probe (every superblock and partition-table
/// prober, no cache) finds on a device; `Ok(None)` when it finds nothing.
pub fn probe(dev: &Path) -> Result<Option<Probed>, DiskError> {
    let _t = super::timing::step("blkid.probe");
    let out = run("blkid", Command::new("blkid").arg("-p").arg("-o").arg("export").arg(dev))?;
    match out.status.code() {
        Some(0) => Ok(Some(probed_of(&String::from_utf8_lossy(&out.stdout)))),
        Some(2) => Ok(None),
        // blkid's "ambivalent result": several signatures that exclude each other.
        Some(8) => Ok(Some(Probed { ambivalent: true, ..Default::default() })),
        _ => Err(tool_error("blkid", dev, &out)),
    }
}

/// The filesystem (or other) signature on a device by a low-level `blkid -p` probe:
/// `ext4`, `xfs`, `swap`, `linux_raid_member`, ..., or `partition-table:gpt` when the
/// device holds a partition table. `Ok(None)` when blkid finds nothing.
pub fn probe_fs(dev: &Path) -> Result<Option<String>, DiskError> {
    let out = run("blkid", Command::new("blkid").arg("-p").arg("-o").arg("export").arg(dev))?;
    match out.status.code() {
        Some(0) => Ok(signature_of(&String::from_utf8_lossy(&out.stdout))),
        Some(2) => Ok(None),
        _ => Err(tool_error("blkid", dev, &out)),
    }
}

/// Makes an ext4 (`mkfs.ext4 -F -q -E nodiscard`) or xfs (`mkfs.xfs -f -q -K`)
/// filesystem on a device; any other type is refused.
pub fn mkfs(dev: &Path, fs: &str) -> Result<(), DiskError> {
    let (tool, args): (&str, &[&str]) = match fs {
        "ext4" => ("mkfs.ext4", &["-F", "-q", "-E", "nodiscard"]),
        "xfs" => ("mkfs.xfs", &["-f", "-q", "-K"]),
        other => {
            return Err(DiskError::invalid(format!(
                "cannot make a {other:?} filesystem on {}: supported are {}",
                dev.display(),
                SUPPORTED_FS.join(", ")
            )))
        }
    };
    let out = run(tool, Command::new(tool).args(args).arg(dev))?;
    if !out.status.success() {
        return Err(tool_error(tool, dev, &out));
    }
    Ok(())
}

/// Grows the mounted filesystem on `dev` to fill the device: `resize2fs` (ext4, online
/// through the device) or `xfs_growfs` (xfs, through its mount point `mounted_at`).
/// Growing a filesystem that already fills its device changes nothing.
pub fn grow(dev: &Path, mounted_at: &Path, fs: &str) -> Result<(), DiskError> {
    let (tool, target): (&str, &Path) = match fs {
        "ext4" => ("resize2fs", dev),
        "xfs" => ("xfs_growfs", mounted_at),
        other => {
            return Err(DiskError::invalid(format!(
                "cannot grow a {other:?} filesystem on {}: supported are {}",
                dev.display(),
                SUPPORTED_FS.join(", ")
            )))
        }
    };
    let out = run(tool, Command::new(tool).arg(target))?;
    if !out.status.success() {
        return Err(tool_error(tool, target, &out));
    }
    Ok(())
}

/// The raw ioctl, kept private to this file.
mod sys {
    nix::ioctl_read!(
        /// `BLKGETSIZE64`: the size of a block device in bytes.
        blkgetsize64,
        0x12,
        114,
        u64
    );
}

fn size_of_open(dev: &Path, file: &File) -> Result<u64, DiskError> {
    let mut size: u64 = 0;
    // SAFETY: the fd is open for the whole call and BLKGETSIZE64 writes one u64 into
    // `size`, which lives on this stack frame.
    unsafe { sys::blkgetsize64(file.as_raw_fd(), &mut size) }
        .map_err(DiskError::errno(format!("size of {} (BLKGETSIZE64)", dev.display())))?;
    Ok(size)
}

/// Size of a block device in bytes (`BLKGETSIZE64`).
pub fn device_size(dev: &Path) -> Result<u64, DiskError> {
    let file = File::open(dev).map_err(DiskError::io(format!("open {}", dev.display())))?;
    size_of_open(dev, &file)
}

/// The byte ranges [`wipe_signatures`] zeroes on a device of `size` bytes.
fn wipe_ranges(size: u64) -> Vec<(u64, u64)> {
    if size <= 2 * WIPE_LEN {
        return vec![(0, size)];
    }
    vec![(0, WIPE_LEN), (size - WIPE_LEN, WIPE_LEN)]
}

/// Zeroes the first and the last MiB of a block device (all of it if smaller) and
/// fsyncs, so no filesystem, partition-table or RAID signature survives. A device that
/// is mounted or held is refused ([`DiskError::Busy`]).
pub fn wipe_signatures(dev: &Path) -> Result<(), DiskError> {
    let _t = super::timing::step("wipe");
    let file = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_EXCL | libc::O_CLOEXEC)
        .open(dev)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EBUSY) => DiskError::Busy {
                path: dev.to_path_buf(),
                reason: "it is mounted or held by another device; not wiping it".into(),
            },
            _ => DiskError::Io { what: format!("open {} to wipe it", dev.display()), source: e },
        })?;
    let size = size_of_open(dev, &file)?;
    let zeros = vec![0u8; WIPE_LEN as usize];
    for (start, len) in wipe_ranges(size) {
        let mut off = start;
        while off < start + len {
            let n = (start + len - off).min(WIPE_LEN) as usize;
            file.write_all_at(&zeros[..n], off)
                .map_err(DiskError::io(format!("zero {} at byte {off}", dev.display())))?;
            off += n as u64;
        }
    }
    let _t = super::timing::step("wipe.flush");
    file.sync_all().map_err(DiskError::io(format!("fsync {}", dev.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blkid_export_yields_the_filesystem_type() {
        let out = "DEVNAME=/dev/loop0p1\nUUID=1234\nBLOCK_SIZE=4096\nTYPE=ext4\nPART_ENTRY_SCHEME=gpt\n";
        assert_eq!(signature_of(out), Some("ext4".into()));
    }

    #[test]
    fn a_partition_table_counts_as_a_signature() {
        assert_eq!(signature_of("DEVNAME=/dev/loop0\nPTUUID=ab\nPTTYPE=gpt\n"), Some("partition-table:gpt".into()));
    }

    #[test]
    fn a_probe_keeps_type_usage_version_and_table() {
        let out = "DEVNAME=/dev/loop3\nUUID=x\nVERSION=1.0\nTYPE=linux_raid_member\nUSAGE=raid\n";
        let p = probed_of(out);
        assert_eq!(p.signature_words().as_deref(), Some("a Linux RAID member (md superblock 1.0)"));
        let p = probed_of("DEVNAME=/dev/loop0\nPTUUID=ab\nPTTYPE=gpt\n");
        assert_eq!((p.pt_type.as_deref(), p.signature_words()), (Some("gpt"), None));
        let p = Probed { ambivalent: true, ..Default::default() };
        assert!(p.signature_words().unwrap().contains("more than one signature"));
    }

    #[test]
    fn partition_entry_fields_alone_are_no_signature() {
        assert_eq!(signature_of("DEVNAME=/dev/loop0p1\nPART_ENTRY_SCHEME=gpt\nPART_ENTRY_TYPE=x\n"), None);
        assert_eq!(signature_of(""), None);
    }

    #[test]
    fn wiping_covers_both_ends_or_the_whole_small_device() {
        assert_eq!(wipe_ranges(10 * WIPE_LEN), vec![(0, WIPE_LEN), (9 * WIPE_LEN, WIPE_LEN)]);
        assert_eq!(wipe_ranges(WIPE_LEN + 5), vec![(0, WIPE_LEN + 5)]);
        assert_eq!(wipe_ranges(0), vec![(0, 0)]);
    }

    #[test]
    fn unsupported_filesystems_are_refused_before_running_anything() {
        let err = mkfs(Path::new("/dev/null"), "btrfs").unwrap_err();
        assert!(err.to_string().contains("btrfs") && err.to_string().contains("/dev/null"), "{err}");
    }
}
