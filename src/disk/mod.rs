//! Plain functions over the operating system: udev and sysfs, mounts, GPT layout and
//! writing, the kernel's partitions (BLKPG), filesystems, mount(2), loop devices.
//! Nothing here knows about actors or CSI, and nothing here holds state; the functions
//! are synchronous, meant to run off the async runtime (`spawn_blocking`).

/// Staging and target paths opened once beneath an allowed root, then used only by descriptor.
pub mod beneath;
/// The kernel's partitions of a disk (sysfs) and the BLKPG ioctl.
pub mod blkpg;
/// Clean extents: each drive's record of space that may hold a former tenant's bytes, and its zeroing.
pub mod clean;
/// Copies of one device's data onto another, for clones: filesystem tools or bytes.
pub(crate) mod copy;
/// A bounded FIFREEZE of a mounted filesystem, for a consistent copy.
pub mod freeze;
/// The kernel's filesystem encryption (fscrypt v2) on a mounted ext4: keys and the encrypted data directory.
pub mod fscrypt;
/// The note a snapshot partition carries of itself.
pub mod snapshot_note;
/// Filesystems and signatures on a device: blkid, mkfs, fsck, grow.
pub mod fs;
/// drivelet's GPT conventions, layout arithmetic, reading and writing (gpt/: examine.rs, write.rs).
pub mod gpt;
/// The exclusive BSD lock on a whole disk while its partition table changes.
pub mod lock;
/// Loop devices over sparse files, for the demo and tests.
pub(crate) mod loopdev;
/// CSI mount flags, and what mountinfo lists at a path.
pub mod mount;
/// The verified byte copy of a moving volume onto its new partition.
pub mod mover;
/// What the kernel has mounted and swapped (mountinfo, /proc/swaps).
pub mod mounts;
/// Every drivelet disk's note of itself: its owner, and each volume's identity and claim.
pub mod note;
/// A disk's signatures in plain words (what libblkid names, as an admin calls it).
pub(crate) mod signature;
/// Drive health from smartctl's JSON and exit status (smart/: families.rs, figures.rs).
pub mod smart;
/// Per-step timings of disk work, for the disk_steps benchmark and debugging.
pub mod timing;
/// An encrypted volume's key, wrapped by a key-encryption key, in its partition's first KiB; crypto-erase.
pub mod volume_key;
/// Block devices as udev and sysfs see them: probes and the monitor thread.
pub mod udev;
/// A whole disk opened for writing through a private node, where udev's watch does not see it.
pub mod writer;

/// A sysfs attribute of a device directory, trimmed; `None` when it cannot be read.
pub(crate) fn sysfs_attr(dir: &std::path::Path, attr: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(attr)).ok().map(|s| s.trim().to_string())
}

/// `"8:16"` -> `(8, 16)`.
pub(crate) fn parse_devnum(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// The `major:minor` of a block device node; `None` when the path is not one.
pub(crate) fn block_devnum(path: &std::path::Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let md = std::fs::metadata(path).ok()?;
    if !md.file_type().is_block_device() {
        return None;
    }
    let rdev = md.rdev();
    Some((nix::sys::stat::major(rdev) as u32, nix::sys::stat::minor(rdev) as u32))
}

/// The whole disk a filesystem lives on, from its device number `(major, minor)` (its
/// `st_dev`, read on a descriptor): `major:minor` of the disk, going up from a partition
/// through sysfs. `None` for filesystems on no block device (tmpfs, overlay) or when
/// sysfs cannot tell.
pub fn whole_disk_of_dev((major, minor): (u32, u32)) -> Option<(u32, u32)> {
    let dir = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    let disk_dir = if dir.join("partition").exists() { dir.parent()?.to_path_buf() } else { dir };
    parse_devnum(&sysfs_attr(&disk_dir, "dev")?)
}

/// Errors from talking to the OS about disks.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// A libudev call failed.
    #[error("udev: {what}: {source}")]
    Udev {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file or device operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, naming the path.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// An external tool failed.
    #[error("{tool} failed: {message}")]
    Tool {
        /// The command, e.g. `losetup`.
        tool: String,
        /// Its exit status and stderr.
        message: String,
    },
    /// The device carries something drivelet did not write (another partition table, a
    /// GPT of someone else, a filesystem, a RAID member); drivelet will not write to it.
    #[error("{device}: not a drivelet drive, refusing to write to it: {found}")]
    Foreign {
        /// The device.
        device: std::path::PathBuf,
        /// What was found on it.
        found: String,
    },
    /// A GPT is damaged or of a shape drivelet does not handle.
    #[error("{device}: GPT: {reason}")]
    Gpt {
        /// The device.
        device: std::path::PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A partition asked for clashes with one the GPT or the kernel already has.
    #[error("{device}: partition [{start}, +{size}) bytes: {reason}")]
    Conflict {
        /// The whole disk.
        device: std::path::PathBuf,
        /// Start of the requested partition, bytes.
        start: u64,
        /// Size of the requested partition, bytes.
        size: u64,
        /// The clash, naming the other partition.
        reason: String,
    },
    /// A partition asked for by its identity is not there.
    #[error("{device}: {what} not found")]
    NotFound {
        /// The disk looked at.
        device: std::path::PathBuf,
        /// What was looked for (partition GUID, partition start).
        what: String,
    },
    /// A device or mount point is in use and the operation needs it idle.
    #[error("{path} is busy: {reason}")]
    Busy {
        /// The device or mount point.
        path: std::path::PathBuf,
        /// Who holds it, when known (mount points, holders).
        reason: String,
    },
    /// A request drivelet does not support: an unaligned extent, a sector size, a
    /// filesystem type, a path of the wrong kind.
    #[error("{what}")]
    Invalid {
        /// The request and why it is refused, naming the path involved.
        what: String,
    },
    /// The kernel did not reach the expected state in time.
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout {
        /// What was awaited, naming the device.
        what: String,
        /// How long it was awaited.
        waited: std::time::Duration,
    },
}

impl DiskError {
    pub(crate) fn udev(what: &'static str) -> impl FnOnce(std::io::Error) -> DiskError {
        move |source| DiskError::Udev { what: what.to_string(), source }
    }

    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> DiskError {
        let what = what.into();
        move |source| DiskError::Io { what, source }
    }

    pub(crate) fn errno(what: impl Into<String>) -> impl FnOnce(nix::errno::Errno) -> DiskError {
        let what = what.into();
        move |e| DiskError::Io { what, source: std::io::Error::from(e) }
    }

    pub(crate) fn invalid(what: impl Into<String>) -> DiskError {
        DiskError::Invalid { what: what.into() }
    }
}

/// `CAP_SYS_RESOURCE`: the kernel grows a mounted ext4 filesystem only for a caller
/// that has it.
pub const CAP_SYS_RESOURCE: u32 = 24;

/// Whether this process has the capability numbered `cap` in its effective set (from
/// `/proc/self/status`); `false` when that cannot be read.
pub fn has_capability(cap: u32) -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return false };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|mask| cap < 64 && mask & (1 << cap) != 0)
}

