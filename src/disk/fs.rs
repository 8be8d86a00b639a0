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

impl Usage {
    /// The usage a `statvfs` answered.
    pub fn of(st: &nix::sys::statvfs::Statvfs) -> Usage {
        let frsize = st.fragment_size() as u64;
        let total_bytes = st.blocks() as u64 * frsize;
        let free_bytes = st.blocks_free() as u64 * frsize;
        Usage {
            total_bytes,
            available_bytes: st.blocks_available() as u64 * frsize,
            used_bytes: total_bytes.saturating_sub(free_bytes),
            total_inodes: st.files() as u64,
            free_inodes: st.files_free() as u64,
            used_inodes: (st.files() as u64).saturating_sub(st.files_free() as u64),
        }
    }
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
        (_, code) => {
            tracing::debug!(device = %dev.display(), fsck.output = %summary(&text), "a read-only check could not decide");
            Fsck::Undecided(match code {
                Some(c) => format!("the checker ended with exit code {c}"),
                None => "the checker was killed".to_string(),
            })
        }
    }
}

/// Filesystems [`mkfs`] makes.
pub const SUPPORTED_FS: &[&str] = &["ext4", "xfs"];

/// Bytes zeroed at each end of a device by [`wipe_signatures`].
pub const WIPE_LEN: u64 = 1 << 20;

pub(super) fn run(tool: &str, cmd: &mut Command) -> Result<Output, DiskError> {
    cmd.stdin(Stdio::null())
        .output()
        .map_err(DiskError::io(format!("run {tool}")))
}

/// A tool's failure in drivelet's words: the tool, the device and how it ended. What the
/// tool printed goes to the log (one warn line), never into the error a user reads.
pub(super) fn tool_error(tool: &str, dev: &Path, out: &Output) -> DiskError {
    use std::os::unix::process::ExitStatusExt;
    let ended = match (out.status.code(), out.status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => "ended abnormally".to_string(),
    };
    tracing::warn!(tool, device = %dev.display(), ended = %ended, tool.stderr = %String::from_utf8_lossy(&out.stderr).trim(), "a tool failed");
    DiskError::Tool { tool: tool.to_string(), message: format!("{ended} on {}; what it printed is in drivelet's log", dev.display()) }
}

/// The signature `blkid -p -o export` reports: `TYPE` (filesystem, swap, RAID or LVM
/// member, ...), or else a partition table as `partition-table:<PTTYPE>`.
pub(crate) fn signature_of(export: &str) -> Option<String> {
    let get = |key| export_value(export, key);
    get("TYPE").map(str::to_string).or_else(|| get("PTTYPE").map(|t| format!("partition-table:{t}")))
}

/// The non-empty value of `key` in `blkid -o export` output.
pub(super) fn export_value<'a>(export: &'a str, key: &str) -> Option<&'a str> {
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
pub(crate) fn probed_of(export: &str) -> Probed {
    let get = |key| export_value(export, key).map(str::to_string);
    Probed { fs_type: get("TYPE"), usage: get("USAGE"), version: get("VERSION"), pt_type: get("PTTYPE"), ambivalent: false }
}

thread_local! {
    /// What [`probe`] answers on this thread instead of running blkid: set only by the
    /// fuzz targets ([`crate::fuzz`]), which judge thousands of images a second.
    static PROBE_STAND_IN: std::cell::RefCell<Option<Option<Probed>>> = const { std::cell::RefCell::new(None) };
}

/// Makes [`probe`] answer `answer` on this thread without running blkid (`None`: run
/// blkid again). For the fuzz targets only.
#[doc(hidden)]
pub fn set_probe_stand_in(answer: Option<Option<Probed>>) {
    PROBE_STAND_IN.with(|s| *s.borrow_mut() = answer);
}

/// Everything a low-level `blkid -p` probe (every superblock and partition-table
/// prober, no cache) finds on a device; `Ok(None)` when it finds nothing.
pub fn probe(dev: &Path) -> Result<Option<Probed>, DiskError> {
    if let Some(answer) = PROBE_STAND_IN.with(|s| s.borrow().clone()) {
        return Ok(answer);
    }
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
    mkfs_with(dev, fs, &[])
}

/// Makes an ext4 filesystem that can encrypt directories (the `encrypt` feature, for
/// fscrypt) on `dev`.
pub fn mkfs_encrypting(dev: &Path) -> Result<(), DiskError> {
    mkfs_with(dev, "ext4", &["-O", "encrypt"])
}

fn mkfs_with(dev: &Path, fs: &str, extra: &[&str]) -> Result<(), DiskError> {
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
    let out = run(tool, Command::new(tool).args(args).args(extra).arg(dev))?;
    if !out.status.success() {
        return Err(tool_error(tool, dev, &out));
    }
    Ok(())
}

/// Grows the mounted filesystem on `dev` to fill the device, online, through ioctls on
/// a descriptor of `mounted_at` (the directory opened beneath the allowed roots, which
/// must still be the root of a mount of `dev`): ext4 as `resize2fs` does it, xfs as
/// `xfs_growfs`. Neither tool is run: each would look the mount point up again by name
/// (resize2fs in /proc/mounts, then opening it). Growing a filesystem that already
/// fills its device changes nothing.
pub fn grow(dev: &Path, mounted_at: &super::beneath::Node, fs: &str) -> Result<(), DiskError> {
    match fs {
        "ext4" => grow_ext4(dev, mounted_at),
        "xfs" => grow_xfs(dev, mounted_at),
        other => Err(DiskError::invalid(format!(
            "cannot grow a {other:?} filesystem on {}: supported are {}",
            dev.display(),
            SUPPORTED_FS.join(", ")
        ))),
    }
}

/// The device number `(major, minor)` of the block device node `dev`.
pub(crate) fn devnum_of(dev: &Path) -> Result<(u32, u32), DiskError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let md = std::fs::metadata(dev).map_err(DiskError::io(format!("stat {}", dev.display())))?;
    if !md.file_type().is_block_device() {
        return Err(DiskError::invalid(format!("{} is not a block device", dev.display())));
    }
    Ok((nix::sys::stat::major(md.rdev()) as u32, nix::sys::stat::minor(md.rdev()) as u32))
}

/// Refuses, before `what` is done through it, a node that is not (any more) the root of
/// a mount of the device `dev` (statx on its descriptor).
pub(crate) fn require_mount_of(at: &super::beneath::Node, dev: &Path, what: &str) -> Result<(), DiskError> {
    let devnum = devnum_of(dev)?;
    let st = at.stat()?;
    if st.mount_root && st.dev == devnum {
        return Ok(());
    }
    Err(DiskError::invalid(format!(
        "{} is not the root of a mount of {} ({}:{}); it shows {}:{}{}; not {what}",
        at.shown().display(),
        dev.display(),
        devnum.0,
        devnum.1,
        st.dev.0,
        st.dev.1,
        if st.mount_root { "" } else { ", not a mount's root" }
    )))
}

mod ext4 {
    // EXT4_IOC_RESIZE_FS = _IOW('f', 16, __u64): the new block count.
    nix::ioctl_write_ptr!(resize_fs, b'f', 16, u64);
}

/// Grows the ext4 filesystem shown at `at` (its mount's root) to fill `dev`, online, to
/// the block count resize2fs would ([`ext4_grow_target`]), through `EXT4_IOC_RESIZE_FS`
/// on a descriptor of that very directory. The kernel grows a mounted ext4 only for a
/// caller with CAP_SYS_RESOURCE; without it the call is refused in those words.
fn grow_ext4(dev: &Path, at: &super::beneath::Node) -> Result<(), DiskError> {
    require_mount_of(at, dev, "grown")?;
    let g = ext4_geometry(dev)?;
    let target = ext4_grow_target(&g, device_size(dev)?);
    if target <= g.block_count {
        return Ok(());
    }
    let dir = at.reopen_dir()?;
    let what = format!("grow the ext4 filesystem at {} to {target} blocks (EXT4_IOC_RESIZE_FS)", at.shown().display());
    // SAFETY: the descriptor is open for the call; the kernel reads one u64 from
    // `target`, which lives on this frame.
    unsafe { ext4::resize_fs(dir.as_raw_fd(), &target) }.map_err(|e| match e {
        nix::errno::Errno::EPERM => DiskError::Io {
            what: format!("{what}: the kernel grows a mounted ext4 only for a process with CAP_SYS_RESOURCE"),
            source: e.into(),
        },
        _ => DiskError::Io { what, source: e.into() },
    })?;
    Ok(())
}

mod xfs {
    /// `struct xfs_fsop_geom_v1` (xfs_fs.h): what the grow needs of the geometry.
    #[repr(C)]
    #[derive(Default)]
    pub(super) struct GeomV1 {
        pub blocksize: u32,
        pub rtextsize: u32,
        pub agblocks: u32,
        pub agcount: u32,
        pub logblocks: u32,
        pub sectsize: u32,
        pub inodesize: u32,
        pub imaxpct: u32,
        pub datablocks: u64,
        pub rtblocks: u64,
        pub rtextents: u64,
        pub logstart: u64,
        pub uuid: [u8; 16],
        pub sunit: u32,
        pub swidth: u32,
        pub version: i32,
        pub flags: u32,
        pub logsectsize: u32,
        pub rtsectsize: u32,
        pub dirblocksize: u32,
    }
    /// `struct xfs_growfs_data`.
    #[repr(C)]
    pub(super) struct GrowData {
        pub newblocks: u64,
        pub imaxpct: u32,
    }
    // XFS_IOC_FSGEOMETRY_V1 = _IOR('X', 100, struct xfs_fsop_geom_v1);
    // XFS_IOC_FSGROWFSDATA = _IOW('X', 110, struct xfs_growfs_data).
    nix::ioctl_read!(geometry_v1, b'X', 100, GeomV1);
    nix::ioctl_write_ptr!(grow_data, b'X', 110, GrowData);
}

/// Grows the xfs filesystem shown at `at` (its mount's root) to the size of `dev`, as
/// `xfs_growfs -d` does, through ioctls on a descriptor of that very directory (the tool
/// would look the mount point up again by name).
fn grow_xfs(dev: &Path, at: &super::beneath::Node) -> Result<(), DiskError> {
    require_mount_of(at, dev, "grown")?;
    let dir = at.reopen_dir()?;
    let size = {
        let f = std::fs::File::open(dev).map_err(DiskError::io(format!("open {}", dev.display())))?;
        let mut f = &f;
        std::io::Seek::seek(&mut f, std::io::SeekFrom::End(0)).map_err(DiskError::io(format!("size of {}", dev.display())))?
    };
    let mut geo = xfs::GeomV1::default();
    // SAFETY: the descriptor is open for the call; the kernel writes one GeomV1 into
    // `geo`, which lives on this frame.
    unsafe { xfs::geometry_v1(std::os::fd::AsRawFd::as_raw_fd(&dir), &mut geo) }
        .map_err(DiskError::errno(format!("read the xfs geometry at {}", at.shown().display())))?;
    if geo.blocksize == 0 {
        return Err(DiskError::invalid(format!("the xfs filesystem at {} reports a block size of 0", at.shown().display())));
    }
    let newblocks = size / u64::from(geo.blocksize);
    if newblocks <= geo.datablocks {
        return Ok(());
    }
    let arg = xfs::GrowData { newblocks, imaxpct: geo.imaxpct };
    // SAFETY: the descriptor is open for the call; `arg` lives on this frame.
    unsafe { xfs::grow_data(std::os::fd::AsRawFd::as_raw_fd(&dir), &arg) }
        .map_err(DiskError::errno(format!("grow the xfs filesystem at {} to {newblocks} blocks", at.shown().display())))?;
    Ok(())
}

/// What resize2fs reads of an ext4 superblock to decide how far the filesystem grows
/// (`dumpe2fs -h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ext4Geometry {
    /// Block size in bytes.
    pub block_size: u64,
    /// Blocks in the filesystem.
    pub block_count: u64,
    /// The first data block (1 for 1 KiB blocks, else 0).
    pub first_block: u64,
    /// Blocks per block group.
    pub blocks_per_group: u64,
    /// Inode table blocks per group.
    pub inode_blocks_per_group: u64,
    /// Blocks reserved for growing the group descriptor table.
    pub reserved_gdt_blocks: u64,
    /// Bytes per group descriptor (32, or 64 with the 64bit feature).
    pub desc_size: u64,
    /// Superblock backups only in groups 0, 1 and powers of 3, 5 and 7.
    pub sparse_super: bool,
    /// The filesystem is clean (unmounted cleanly, no errors recorded).
    pub clean: bool,
}

/// Parses `dumpe2fs -h` output.
pub(crate) fn ext4_geometry_of(text: &str) -> Option<Ext4Geometry> {
    let field = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(':'))).map(str::trim)
    };
    let num = |name: &str| field(name).and_then(|v| v.parse::<u64>().ok());
    let features = field("Filesystem features").unwrap_or("");
    // ext4's limits: blocks of 1 to 64 KiB, descriptors of 32 bytes to a block's size;
    // anything else is no ext4 geometry (and would divide by zero below).
    let block_size = num("Block size").filter(|b| b.is_power_of_two() && (1024..=65536).contains(b))?;
    Some(Ext4Geometry {
        block_size,
        block_count: num("Block count")?,
        first_block: num("First block").unwrap_or(0),
        blocks_per_group: num("Blocks per group").filter(|b| *b > 0)?,
        inode_blocks_per_group: num("Inode blocks per group")?,
        reserved_gdt_blocks: num("Reserved GDT blocks").unwrap_or(0),
        desc_size: num("Group descriptor size").unwrap_or(32).clamp(32, block_size),
        sparse_super: features.split_whitespace().any(|f| f == "sparse_super"),
        clean: field("Filesystem state") == Some("clean"),
    })
}

/// The superblock geometry of the ext4 filesystem on `dev` (`dumpe2fs -h`).
pub fn ext4_geometry(dev: &Path) -> Result<Ext4Geometry, DiskError> {
    let out = run("dumpe2fs", Command::new("dumpe2fs").arg("-h").arg(dev).stdout(Stdio::piped()).stderr(Stdio::piped()))?;
    if !out.status.success() {
        return Err(tool_error("dumpe2fs", dev, &out));
    }
    ext4_geometry_of(&String::from_utf8_lossy(&out.stdout))
        .ok_or_else(|| DiskError::Tool { tool: "dumpe2fs".into(), message: format!("no ext4 geometry in its output for {}", dev.display()) })
}

fn power_of(mut n: u64, base: u64) -> bool {
    while n > 1 && n % base == 0 {
        n /= base;
    }
    n == 1
}

/// The block count resize2fs grows an ext4 filesystem to on a device of `dev_bytes`
/// (e2fsprogs' rule): the device's blocks, rounded down to whole pages, less a last
/// block group too small to hold its own metadata and 50 blocks more.
pub fn ext4_grow_target(g: &Ext4Geometry, dev_bytes: u64) -> u64 {
    let page_blocks = (4096 / g.block_size).max(1);
    let mut blocks = (dev_bytes / g.block_size) & !(page_blocks - 1);
    loop {
        let data = blocks.saturating_sub(g.first_block);
        let groups = data.div_ceil(g.blocks_per_group);
        if groups <= 1 {
            return blocks;
        }
        let desc_blocks = groups.div_ceil(g.block_size / g.desc_size.max(1));
        let last = groups - 1;
        let has_super = !g.sparse_super || last <= 1 || power_of(last, 3) || power_of(last, 5) || power_of(last, 7);
        let mut overhead = g.inode_blocks_per_group.saturating_add(2);
        if has_super {
            overhead = overhead.saturating_add(desc_blocks).saturating_add(g.reserved_gdt_blocks).saturating_add(1);
        }
        let rem = data % g.blocks_per_group;
        if rem == 0 || rem >= overhead.saturating_add(50) {
            return blocks;
        }
        blocks -= rem;
    }
}

/// Whether the ext4 filesystem on `dev` already fills it as far as resize2fs would
/// grow it.
pub fn ext4_fills_device(dev: &Path) -> Result<bool, DiskError> {
    let g = ext4_geometry(dev)?;
    Ok(ext4_grow_target(&g, device_size(dev)?) <= g.block_count)
}

/// Grows the unmounted ext4 filesystem on `dev` to fill its device, offline (no
/// CAP_SYS_RESOURCE needed): `e2fsck -f -p` (resize2fs insists on a checked filesystem),
/// then `resize2fs`. Does nothing when resize2fs would not grow it. Returns whether it
/// grew.
pub fn grow_ext4_offline(dev: &Path) -> Result<bool, DiskError> {
    if ext4_fills_device(dev)? {
        return Ok(false);
    }
    let out = run("e2fsck", Command::new("e2fsck").args(["-f", "-p"]).arg(dev).stdout(Stdio::piped()).stderr(Stdio::piped()))?;
    // 0: clean; 1: errors corrected. Anything else leaves the filesystem as it is.
    if !matches!(out.status.code(), Some(0 | 1)) {
        return Err(tool_error("e2fsck", dev, &out));
    }
    let out = run("resize2fs", Command::new("resize2fs").arg(dev).stdout(Stdio::piped()).stderr(Stdio::piped()))?;
    if !out.status.success() {
        return Err(tool_error("resize2fs", dev, &out));
    }
    Ok(true)
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

pub(crate) fn size_of_open(dev: &Path, file: &File) -> Result<u64, DiskError> {
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
pub(crate) fn wipe_ranges(size: u64) -> Vec<(u64, u64)> {
    if size <= 2 * WIPE_LEN {
        return vec![(0, size)];
    }
    vec![(0, WIPE_LEN), (size - WIPE_LEN, WIPE_LEN)]
}

/// Writes zeros over `ranges` (offset, length in bytes) of `dev` through `file`; the
/// caller flushes. The zeros sit at a 4 KiB-aligned address, so `file` may be opened
/// `O_DIRECT` (the ranges must then be whole logical blocks).
pub(crate) fn zero_ranges(dev: &Path, file: &File, ranges: &[(u64, u64)]) -> Result<(), DiskError> {
    const PAGE: usize = 4096;
    let buf = vec![0u8; WIPE_LEN as usize + PAGE];
    let at = buf.as_ptr().align_offset(PAGE).min(PAGE);
    let zeros = &buf[at..at + WIPE_LEN as usize];
    for &(start, len) in ranges {
        let mut off = start;
        while off < start + len {
            let n = (start + len - off).min(WIPE_LEN) as usize;
            file.write_all_at(&zeros[..n], off).map_err(DiskError::io(format!("zero {} at byte {off}", dev.display())))?;
            off += n as u64;
        }
    }
    Ok(())
}

/// Opens a partition to wipe it: for writing, exclusively (`O_EXCL`: a mounted or held
/// device is refused, [`DiskError::Busy`]), with `flags` added.
fn open_to_wipe(dev: &Path, flags: libc::c_int) -> Result<File, DiskError> {
    OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_EXCL | libc::O_CLOEXEC | flags)
        .open(dev)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EBUSY) => DiskError::Busy {
                path: dev.to_path_buf(),
                reason: "it is mounted or held by another device; not wiping it".into(),
            },
            _ => DiskError::Io { what: format!("open {} to wipe it", dev.display()), source: e },
        })
}

/// Zeroes the first and the last MiB of a block device (all of it if smaller) and
/// fsyncs, so no filesystem, partition-table or RAID signature survives. A device that
/// is mounted or held is refused ([`DiskError::Busy`]).
pub fn wipe_signatures(dev: &Path) -> Result<(), DiskError> {
    let _t = super::timing::step("wipe");
    let file = open_to_wipe(dev, 0)?;
    let size = size_of_open(dev, &file)?;
    zero_ranges(dev, &file, &wipe_ranges(size))?;
    let _t = super::timing::step("wipe.flush");
    file.sync_all().map_err(DiskError::io(format!("fsync {}", dev.display())))
}

/// [`wipe_signatures`] without a flush of its own, for a partition whose disk is
/// flushed next anyway (DeleteVolume: the GPT commit that removes its entry). The zeros
/// go past the page cache straight to the device (`O_DIRECT`, which also drops the
/// partition's cached copies of those blocks), so they are on the device when this
/// returns and durable at that next flush of the disk; a flush of the whole disk does
/// not write back a partition's page cache, so buffered zeros would not be.
pub fn wipe_signatures_direct(dev: &Path) -> Result<(), DiskError> {
    let _t = super::timing::step("wipe");
    let file = open_to_wipe(dev, libc::O_DIRECT)?;
    let size = size_of_open(dev, &file)?;
    zero_ranges(dev, &file, &wipe_ranges(size))
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

    const DUMPE2FS: &str = "dumpe2fs 1.47.0 (5-Feb-2023)\nFilesystem volume name:   <none>\nFilesystem features:      has_journal ext_attr resize_inode dir_index filetype extent 64bit flex_bg sparse_super large_file huge_file dir_nlink extra_isize metadata_csum\nFilesystem state:         clean\nBlock count:              262144\nFirst block:              0\nBlock size:               4096\nReserved GDT blocks:      127\nBlocks per group:         32768\nInode blocks per group:   512\nGroup descriptor size:    64\n";

    #[test]
    fn dumpe2fs_header_gives_the_geometry() {
        let g = ext4_geometry_of(DUMPE2FS).expect("geometry");
        assert_eq!(
            g,
            Ext4Geometry {
                block_size: 4096,
                block_count: 262144,
                first_block: 0,
                blocks_per_group: 32768,
                inode_blocks_per_group: 512,
                reserved_gdt_blocks: 127,
                desc_size: 64,
                sparse_super: true,
                clean: true,
            }
        );
        assert_eq!(ext4_geometry_of("Block size: 4096\n"), None, "a header without the counts");
        for size in ["0", "512", "3000", "131072"] {
            let text = DUMPE2FS.replace("Block size:               4096", &format!("Block size: {size}"));
            assert_ne!(text, DUMPE2FS, "the sample names its block size");
            assert_eq!(ext4_geometry_of(&text), None, "a block size of {size} is no ext4's");
        }
        let huge_desc = ext4_geometry_of(&format!("{DUMPE2FS}Group descriptor size: 1000000\n")).expect("geometry");
        assert!(huge_desc.desc_size <= huge_desc.block_size);
        let _ = ext4_grow_target(&huge_desc, u64::MAX);
    }

    #[test]
    fn resize2fs_leaves_out_a_last_group_too_small_for_its_metadata() {
        let g = ext4_geometry_of(DUMPE2FS).expect("geometry");
        const MIB: u64 = 1 << 20;
        // (device size, blocks resize2fs grows to)
        let table = [
            (1024 * MIB, 262144),            // exactly the filesystem: nothing to grow
            (2048 * MIB, 524288),            // whole groups
            (1025 * MIB, 262144),            // 256 blocks in a new group 8: under 514 + 50
            (1028 * MIB, 262144 + 1024),     // 1024 blocks: enough for group 8 (no backup)
            (1042 * MIB, 262144 + 4608),     // group 8 fits
            (1152 * MIB + MIB, 294912),      // 256 blocks in group 9 (a backup group): left out
            (1024 * MIB + 4095, 262144),     // a partial block never counts
        ];
        for (dev, want) in table {
            assert_eq!(ext4_grow_target(&g, dev), want, "device of {dev} bytes");
        }
        let small = Ext4Geometry { block_size: 1024, first_block: 1, blocks_per_group: 8192, inode_blocks_per_group: 256, ..g };
        assert_eq!(ext4_grow_target(&small, 16 * MIB + 1024), 16384, "rounded down to whole pages, then whole groups");
    }

    #[test]
    fn unsupported_filesystems_are_refused_before_running_anything() {
        let err = mkfs(Path::new("/dev/null"), "btrfs").unwrap_err();
        assert!(err.to_string().contains("btrfs") && err.to_string().contains("/dev/null"), "{err}");
    }
}
