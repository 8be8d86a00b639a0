//! Copies of one device's data onto another, for clones: the filesystem's own copy
//! tools where they exist, bytes otherwise.
//!
//! Rules:
//! - only what the filesystem uses is copied where a tool allows it: ext4 by
//!   `e2image -ra` (used blocks), xfs by `xfs_copy` (used blocks); anything else (a
//!   block volume) byte for byte, the whole length of the source;
//! - the source is only read, from the disk itself ([`drop_cache`] first: a filesystem
//!   writes file data past the device's cache, so cached blocks may be stale); that
//!   nothing writes to it meanwhile is the caller's rule (it is not mounted
//!   read-write);
//! - a filesystem copy gets a fresh UUID (`xfs_copy` makes one; ext4 by
//!   `tune2fs -U random`), because two filesystems with one UUID confuse udev's
//!   `by-uuid` links and the kernel refuses to mount a second xfs with the same UUID;
//! - it then grows to fill the target: ext4 offline (`e2fsck -fp`, then `resize2fs`),
//!   xfs through a mount that exists only in a mount namespace of its own
//!   (`unshare -m`, a slave of the node's mounts), so nothing is left mounted on the
//!   host if drivelet dies midway;
//! - the target is fsynced, and a filesystem copy must then check clean read-only
//!   (`e2fsck -fn`, `xfs_repair -n`), or the copy is an error;
//! - a copy into an encrypted volume (a clone or a restore of one, or into an encrypting
//!   class) is a copy of files, not of blocks ([`copy_files_encrypted`]): the new volume
//!   has a key of its own, so every byte is read in plaintext and written again under
//!   it, both filesystems mounted detached (in no namespace, gone with their descriptors);
//! - no tool is given a path a request named: a frozen source's mount is read (its space
//!   map, `FS_IOC_GETFSMAP`) through the descriptor checked to be the root of a mount of
//!   the source's device, never by the staging path's name; the tools take devices;
//! - a tool's failure carries its exit status and stderr.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;

use super::fs::{self, Fsck};
use super::volume_key::VolumeKey;
use super::DiskError;

/// Bytes read and written at a time by [`copy_bytes`].
const CHUNK: usize = 4 << 20;

/// Runs a tool and fails with its words unless it exits 0 (or with one of `ok`). The
/// tool dies with the thread that runs it (`PR_SET_PDEATHSIG`): after a `kill -9` of
/// drivelet no copy goes on writing to a partition a restart rolls back or a retry
/// copies onto again.
fn tool(name: &str, cmd: &mut Command, on: &Path, ok: &[i32]) -> Result<(), DiskError> {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only calls prctl,
    // which is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = fs::run(name, cmd)?;
    match out.status.code() {
        Some(0) => Ok(()),
        Some(c) if ok.contains(&c) => Ok(()),
        _ => Err(fs::tool_error(name, on, &out)),
    }
}

/// Runs `script` under `sh` in a private mount namespace whose `/var/tmp` is a fresh
/// tmpfs: whatever it mounts there, and any file a tool leaves there, is gone with the
/// namespace. `args` are the script's `$1`, `$2`, ...
fn in_private_namespace(name: &str, script: &str, args: &[&Path], on: &Path) -> Result<(), DiskError> {
    let full = format!("mount -t tmpfs -o mode=0700 drivelet-clone /var/tmp && {script}");
    let mut cmd = Command::new("unshare");
    // A slave of the node's mounts: an unmount on the node reaches the namespace's copy
    // (where the node's mounts are shared, as kubelet's are), so an unstaged volume is
    // not kept mounted here; nothing mounted here reaches the node.
    cmd.args(["--mount", "--propagation", "slave", "sh", "-c", &full, "sh"]).args(args);
    tool(name, &mut cmd, on, &[])
}

/// The raw ioctl, kept private to this file.
mod sys {
    nix::ioctl_none!(
        /// `BLKFLSBUF`: write out and drop a block device's buffer cache.
        blkflsbuf,
        0x12,
        97
    );
}

/// Drops what the kernel caches of a device's blocks (`BLKFLSBUF`, as `blockdev
/// --flushbufs`), so the next reads come from the disk. A filesystem writes file data
/// past the device's cache: blocks cached before (by mkfs, a probe, a check) would
/// otherwise be read stale by a copy after the filesystem is unmounted.
pub(crate) fn drop_cache(dev: &Path) -> Result<(), DiskError> {
    use std::os::unix::io::AsRawFd;
    let f = File::open(dev).map_err(DiskError::io(format!("open {}", dev.display())))?;
    // SAFETY: the fd is open for the whole call and BLKFLSBUF takes no argument.
    unsafe { sys::blkflsbuf(f.as_raw_fd()) }.map_err(DiskError::errno(format!("drop the cache of {} (BLKFLSBUF)", dev.display())))?;
    Ok(())
}

/// How many bytes a second `dev` reads from the disk itself: 16 reads of 1 MiB spread
/// over it, `O_DIRECT` (no cache, no read-ahead), timed. What a copy of it can expect,
/// measured in a few milliseconds; at least 1 byte a second.
pub(crate) fn read_rate(dev: &Path) -> Result<u64, DiskError> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    const CHUNK: usize = 1 << 20;
    const SAMPLES: u64 = 16;
    const PAGE: usize = 4096;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(dev)
        .map_err(DiskError::io(format!("open {} (O_DIRECT)", dev.display())))?;
    let len = fs::size_of_open(dev, &f)?;
    let mut buf = vec![0u8; CHUNK + PAGE];
    let at = buf.as_ptr().align_offset(PAGE).min(PAGE);
    let chunk = &mut buf[at..at + CHUNK];
    let chunks = len / CHUNK as u64;
    let began = std::time::Instant::now();
    let mut read = 0u64;
    for i in 0..SAMPLES.min(chunks) {
        let off = i * (chunks / SAMPLES.min(chunks)) * CHUNK as u64;
        f.read_exact_at(chunk, off).map_err(DiskError::io(format!("read {} at byte {off}", dev.display())))?;
        read += CHUNK as u64;
    }
    let secs = began.elapsed().as_secs_f64().max(1e-6);
    Ok(((read as f64 / secs) as u64).max(1))
}

/// How long a copy of `used` bytes takes at `rate` bytes a second of reading: each
/// byte read and written (the copy may share the drive), and a tenth of a second for
/// the tools and the flushes.
pub(crate) fn estimate(used: u64, rate: u64) -> std::time::Duration {
    std::time::Duration::from_millis(100) + std::time::Duration::from_secs_f64(used as f64 * 2.0 / rate.max(1) as f64)
}

/// The filesystem UUID on a device (`blkid -p`), if it has one.
pub(crate) fn fs_uuid(dev: &Path) -> Result<Option<String>, DiskError> {
    let out = fs::run("blkid", Command::new("blkid").arg("-p").arg("-o").arg("export").arg(dev))?;
    match out.status.code() {
        Some(0) => Ok(fs::export_value(&String::from_utf8_lossy(&out.stdout), "UUID").map(str::to_string)),
        Some(2) => Ok(None),
        _ => Err(fs::tool_error("blkid", dev, &out)),
    }
}

/// Copies the used blocks of the `fs` filesystem on `src` onto `dst` (which must be
/// at least as large and hold nothing of value): `e2image -ra` for ext4, `xfs_copy`
/// for xfs (its log goes to a file of drivelet's, removed after). Neither runs in a
/// mount namespace of its own: a namespace holds a copy of every mount of the node for
/// as long as the copy runs, and an unstaged volume's filesystem would stay alive in it
/// (a mount read-only or a wipe of that volume meanwhile found it busy).
///
/// `frozen`: the source is mounted there (the directory opened beneath the allowed roots
/// and checked to be the root of a mount of `src`) and frozen ([`super::freeze`]), so
/// its device reads as a consistent filesystem whose xfs log may still need replaying:
/// ext4 is copied with `e2image -raf` (the tool refuses a mounted source otherwise);
/// xfs, whose copy tool refuses a dirty log, is copied extent by extent, every extent
/// the filesystem's space map does not call free (what `xfs_copy` would copy), and its
/// log is replayed on the copy by a mount in a namespace of its own. The space map is
/// read through the descriptor checked ([`space_map`]), never by the path's name: what
/// shows at the path by then may be another filesystem.
pub(crate) fn copy_filesystem(src: &Path, dst: &Path, fs_type: &str, frozen: Option<&super::beneath::Node>) -> Result<(), DiskError> {
    match (fs_type, frozen) {
        ("ext4", Some(_)) => tool("e2image", Command::new("e2image").arg("-raf").arg(src).arg(dst), src, &[]),
        ("ext4", None) => tool("e2image", Command::new("e2image").arg("-ra").arg(src).arg(dst), src, &[]),
        ("xfs", Some(mounted)) => {
            let used = space_map(mounted, src)?;
            copy_ranges(src, dst, &used)?;
            sync(dst)?;
            let script = r#"mkdir /var/tmp/m && mount -t xfs -o nouuid "$1" /var/tmp/m && umount /var/tmp/m"#;
            in_private_namespace("mount", script, &[dst], dst)
        }
        ("xfs", None) => {
            static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let log = std::env::temp_dir().join(format!("drivelet-xfs_copy-{}-{n}.log", std::process::id()));
            let r = tool("xfs_copy", Command::new("xfs_copy").arg("-L").arg(&log).arg(src).arg(dst), src, &[]);
            let _ = std::fs::remove_file(&log);
            r
        }
        (other, _) => Err(DiskError::invalid(format!("cannot copy a {other:?} filesystem from {}: supported are ext4 and xfs", src.display()))),
    }
}

/// `FS_IOC_GETFSMAP` (linux/fsmap.h): the space map of a mounted filesystem.
mod fsmap {
    /// `struct fsmap`: one extent of the map, in bytes.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub(crate) struct Rec {
        pub device: u32,
        pub flags: u32,
        pub physical: u64,
        pub owner: u64,
        pub offset: u64,
        pub length: u64,
        pub reserved: [u64; 3],
    }
    /// Records asked for by one call.
    pub(super) const BATCH: usize = 128;
    /// `struct fsmap_head` followed by room for [`BATCH`] records.
    #[repr(C)]
    pub(super) struct Head {
        pub iflags: u32,
        pub oflags: u32,
        pub count: u32,
        pub entries: u32,
        pub reserved: [u64; 6],
        pub keys: [Rec; 2],
        pub recs: [Rec; BATCH],
    }
    /// `FMR_OF_SPECIAL_OWNER`: `owner` is one of the special values.
    pub(crate) const OF_SPECIAL_OWNER: u32 = 0x10;
    /// `FMR_OF_LAST`: the last record of the map.
    pub(super) const OF_LAST: u32 = 0x20;
    /// `FMR_OWN_FREE`: free space.
    pub(crate) const OWN_FREE: u64 = 1;
    /// `FS_IOC_GETFSMAP = _IOWR('X', 59, struct fsmap_head)`, the head being 192 bytes.
    pub(super) const GETFSMAP: libc::c_ulong = nix::request_code_readwrite!(b'X', 59, 192) as libc::c_ulong;
    /// Calls of [`GETFSMAP`] one map may take (a map of `BATCH` times as many extents
    /// is far past any volume's).
    pub(super) const MAX_CALLS: usize = 1 << 16;
}

/// The device number `(major, minor)` as the kernel encodes it in a space map's
/// records (`new_encode_dev`).
fn encode_dev((major, minor): (u32, u32)) -> u32 {
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}

/// The extents `(start, len)` in bytes of `recs` that are not free space.
fn used_of(recs: &[fsmap::Rec]) -> Vec<(u64, u64)> {
    recs.iter()
        .filter(|r| r.length > 0 && !(r.flags & fsmap::OF_SPECIAL_OWNER != 0 && r.owner == fsmap::OWN_FREE))
        .map(|r| (r.physical, r.length))
        .collect()
}

/// The extents `(start, len)` in bytes of the data device `dev` that the filesystem
/// shown at `at` does not call free: its space map (`FS_IOC_GETFSMAP`, what `xfs_io -c
/// "fsmap -d"` prints), read with ioctls on a descriptor of that very directory, which
/// must still be the root of a mount of `dev` (checked on the descriptor). Never empty.
fn space_map(at: &super::beneath::Node, dev: &Path) -> Result<Vec<(u64, u64)>, DiskError> {
    let shown = at.shown().display();
    fs::require_mount_of(at, dev, "read for its space map")?;
    let devnum = fs::devnum_of(dev)?;
    let dir = at.reopen_dir()?;
    let device = encode_dev(devnum);
    let key = |physical, owner, offset, flags| fsmap::Rec { device, flags, physical, owner, offset, length: 0, reserved: [0; 3] };
    // SAFETY: all fields are integers; zero is a valid value of each.
    let mut head: Box<fsmap::Head> = Box::new(unsafe { std::mem::zeroed() });
    head.count = fsmap::BATCH as u32;
    head.keys = [key(0, 0, 0, 0), key(u64::MAX, u64::MAX, u64::MAX, u32::MAX)];
    let mut used = Vec::new();
    let mut listed = 0usize;
    for _ in 0..fsmap::MAX_CALLS {
        // SAFETY: the descriptor is open for the call; `head` is a `struct fsmap_head`
        // with room for `count` records after it, which is all the kernel writes.
        let rc = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&dir), fsmap::GETFSMAP, &mut *head as *mut fsmap::Head) };
        if rc < 0 {
            return Err(DiskError::Io { what: format!("read the space map of {shown} (GETFSMAP)"), source: std::io::Error::last_os_error() });
        }
        let n = head.entries as usize;
        if n > fsmap::BATCH {
            return Err(DiskError::Tool { tool: "GETFSMAP".into(), message: format!("the space map of {shown} answered {n} records for room of {}", fsmap::BATCH) });
        }
        if n == 0 {
            break;
        }
        listed += n;
        used.extend(used_of(&head.recs[..n]));
        let last = head.recs[n - 1];
        if last.flags & fsmap::OF_LAST != 0 {
            break;
        }
        // The next call starts past the last record answered.
        head.keys[0] = last;
    }
    if listed == 0 {
        return Err(DiskError::Tool { tool: "GETFSMAP".into(), message: format!("the space map of {shown} lists nothing on {}", dev.display()) });
    }
    Ok(used)
}

/// Copies the byte ranges `(start, len)` of `src` onto the same places of `dst`.
fn copy_ranges(src: &Path, dst: &Path, ranges: &[(u64, u64)]) -> Result<u64, DiskError> {
    use std::os::unix::fs::FileExt;
    let from = File::open(src).map_err(DiskError::io(format!("open {}", src.display())))?;
    let to = OpenOptions::new().write(true).open(dst).map_err(DiskError::io(format!("open {}", dst.display())))?;
    let mut buf = vec![0u8; CHUNK];
    let mut done = 0u64;
    for &(start, len) in ranges {
        let end = start.checked_add(len).ok_or_else(|| DiskError::invalid(format!("a range of {len} bytes at byte {start} of {} ends past 2^64", src.display())))?;
        let mut at = start;
        while at < end {
            let want = ((end - at) as usize).min(CHUNK);
            from.read_exact_at(&mut buf[..want], at).map_err(DiskError::io(format!("read {} at byte {at}", src.display())))?;
            to.write_all_at(&buf[..want], at).map_err(DiskError::io(format!("write {} at byte {at}", dst.display())))?;
            at += want as u64;
            done += want as u64;
        }
    }
    Ok(done)
}

/// Copies the first `len` bytes of `src` (every byte when `None`) onto the start of
/// `dst` (at least as large); answers the bytes copied.
pub(crate) fn copy_bytes(src: &Path, dst: &Path, len: Option<u64>) -> Result<u64, DiskError> {
    let whole = fs::device_size(src)?;
    let len = len.map_or(whole, |l| l.min(whole));
    let room = fs::device_size(dst)?;
    if room < len {
        return Err(DiskError::invalid(format!("{} holds {room} bytes, less than the {len} of {}", dst.display(), src.display())));
    }
    let mut from = File::open(src).map_err(DiskError::io(format!("open {}", src.display())))?;
    let mut to = OpenOptions::new().write(true).open(dst).map_err(DiskError::io(format!("open {}", dst.display())))?;
    let mut buf = vec![0u8; CHUNK];
    let mut done = 0u64;
    while done < len {
        let want = ((len - done) as usize).min(CHUNK);
        from.read_exact(&mut buf[..want]).map_err(DiskError::io(format!("read {} at byte {done}", src.display())))?;
        to.write_all(&buf[..want]).map_err(DiskError::io(format!("write {} at byte {done}", dst.display())))?;
        done += want as u64;
    }
    Ok(done)
}

/// Flushes a device's written data to stable storage.
pub(crate) fn sync(dev: &Path) -> Result<(), DiskError> {
    let f = OpenOptions::new().write(true).open(dev).map_err(DiskError::io(format!("open {}", dev.display())))?;
    f.sync_all().map_err(DiskError::io(format!("fsync {}", dev.display())))
}

/// Makes the filesystem copied onto `dst` its own: a UUID other than `src_uuid`, grown
/// to fill `dst` when `grow`, fsynced, then checked read-only (it must be clean).
pub(crate) fn finish_filesystem(dst: &Path, fs_type: &str, src_uuid: Option<&str>, grow: bool) -> Result<(), DiskError> {
    match fs_type {
        "ext4" => {
            // e2fsck 1 = errors corrected (a preen of a clean copy corrects nothing).
            tool("e2fsck", Command::new("e2fsck").arg("-f").arg("-p").arg(dst), dst, &[1])?;
            tool("tune2fs", Command::new("tune2fs").args(["-U", "random"]).arg(dst), dst, &[])?;
            if grow {
                tool("resize2fs", Command::new("resize2fs").arg(dst), dst, &[])?;
            }
        }
        "xfs" => {
            if src_uuid.is_some() && fs_uuid(dst)?.as_deref() == src_uuid {
                tool("xfs_admin", Command::new("xfs_admin").args(["-U", "generate"]).arg(dst), dst, &[])?;
            }
            if grow {
                let script = r#"mkdir /var/tmp/m && mount -t xfs "$1" /var/tmp/m && { xfs_growfs /var/tmp/m >/dev/null; rc=$?; umount /var/tmp/m || rc=1; exit $rc; }"#;
                in_private_namespace("xfs_growfs", script, &[dst], dst)?;
            }
        }
        other => return Err(DiskError::invalid(format!("cannot finish a {other:?} filesystem on {}", dst.display()))),
    }
    sync(dst)?;
    let uuid = fs_uuid(dst)?;
    if uuid.is_none() || uuid.as_deref() == src_uuid {
        return Err(DiskError::Tool {
            tool: "blkid".into(),
            message: format!("the copy on {} did not get a UUID of its own ({uuid:?})", dst.display()),
        });
    }
    match fs::check_readonly(dst, fs_type) {
        Fsck::Clean => Ok(()),
        Fsck::Corrupt(words) | Fsck::Undecided(words) => {
            Err(DiskError::Tool { tool: "fsck".into(), message: format!("the copy on {} does not check clean: {words}", dst.display()) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ext4_and_xfs_are_copied_as_filesystems() {
        let err = copy_filesystem(Path::new("/dev/null"), Path::new("/dev/zero"), "btrfs", None).unwrap_err();
        assert!(err.to_string().contains("btrfs") && err.to_string().contains("/dev/null"), "{err}");
        let err = finish_filesystem(Path::new("/dev/null"), "vfat", None, false).unwrap_err();
        assert!(err.to_string().contains("vfat"), "{err}");
    }

    #[test]
    fn the_used_extents_are_what_the_space_map_does_not_call_free() {
        let rec = |physical: u64, length: u64, owner: u64, special: bool| fsmap::Rec {
            physical,
            length,
            owner,
            flags: if special { fsmap::OF_SPECIAL_OWNER } else { 0 },
            ..Default::default()
        };
        let map = [
            rec(0, 80 * 512, 2, true),
            rec(80 * 512, 48 * 512, fsmap::OWN_FREE, true),
            rec(128 * 512, 41024 * 512, 131, false),
            // An inode numbered 1 is a file's extent, not free space.
            rec(41152 * 512, 8 * 512, fsmap::OWN_FREE, false),
            rec(41160 * 512, 0, 132, false),
            rec(41160 * 512, 483128 * 512, fsmap::OWN_FREE, true),
        ];
        assert_eq!(used_of(&map), vec![(0, 80 * 512), (128 * 512, 41024 * 512), (41152 * 512, 8 * 512)]);
        assert_eq!(used_of(&[]), vec![]);
        assert_eq!(std::mem::size_of::<fsmap::Rec>(), 64, "struct fsmap");
        assert_eq!(std::mem::size_of::<fsmap::Head>(), 192 + 64 * fsmap::BATCH, "struct fsmap_head and its records");
        // new_encode_dev: minor's low byte, major, then the minor's high bits.
        assert_eq!(encode_dev((7, 3)), 0x703);
        assert_eq!(encode_dev((259, 0x1234)), 0x34 | (259 << 8) | (0x1200 << 12));
    }
}

/// Copies the files of the ext4 filesystem on `src` into the encrypted data directory of
/// the ext4 filesystem on `dst` (just made by the caller with the encrypt feature and
/// holding no file): the files of `src`'s own data directory, opened with `src_key`,
/// when `src` is an encrypted volume; else every file of its root but `lost+found`.
/// So a clone or a restore of an encrypted volume gets a key of its own: every byte is
/// read in plaintext and written again under `dst_key`.
///
/// Both filesystems are mounted detached (`fsopen`/`fsmount`: a mount in no namespace's
/// tree, reached only through its descriptor): nothing shows on the host or in any
/// namespace, and the mounts end when the descriptors close, also when drivelet dies
/// (the copy tool, `cp -a`, dies with the thread that runs it). `src` is mounted
/// read-only without replaying its journal (`norecovery`): it is not written. The copy
/// keeps owners, modes, times, links, extended attributes and holes.
pub(crate) fn copy_files_encrypted(src: &Path, src_key: Option<&VolumeKey>, dst: &Path, dst_key: &VolumeKey) -> Result<(), DiskError> {
    let from = mount_detached(src, true)?;
    let to = mount_detached(dst, false)?;
    let at = |fd: &std::os::fd::OwnedFd| std::path::PathBuf::from(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(fd)));
    let (from_at, to_at) = (at(&from), at(&to));
    let root = |p: &Path| File::open(p).map_err(DiskError::io(format!("open {}", p.display())));
    let (sroot, droot) = (root(&from_at)?, root(&to_at)?);
    let sources: Vec<std::path::PathBuf> = match src_key {
        Some(k) => {
            let ident = super::fscrypt::add_key(&sroot, k)?;
            if super::fscrypt::data_dir_key(&sroot)? != Some(ident) {
                return Err(DiskError::invalid("the source's data directory is not encrypted under the source's key"));
            }
            list(&from_at.join(super::fscrypt::DATA_DIR))?
        }
        None => list(&from_at)?.into_iter().filter(|p| p.file_name().is_none_or(|n| n != "lost+found")).collect(),
    };
    let ident = super::fscrypt::add_key(&droot, dst_key)?;
    drop(super::fscrypt::ensure_data_dir(&droot, &ident)?);
    if !sources.is_empty() {
        let mut cmd = Command::new("cp");
        cmd.args(["-a", "--sparse=always", "-t"]).arg(to_at.join(super::fscrypt::DATA_DIR)).arg("--").args(&sources);
        // The child reaches both mounts through the same descriptor numbers.
        let fds = [std::os::fd::AsRawFd::as_raw_fd(&from), std::os::fd::AsRawFd::as_raw_fd(&to)];
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure runs in the forked child before exec and only calls
        // fcntl, which is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(move || {
                for fd in fds {
                    if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        tool("cp", &mut cmd, src, &[])?;
    }
    nix::unistd::syncfs(&droot).map_err(|e| DiskError::Io { what: format!("flush {}", dst.display()), source: e.into() })?;
    Ok(())
}

/// Mounts the ext4 filesystem on `dev` detached (in no namespace's tree): the mount's
/// descriptor, whose close ends it.
fn mount_detached(dev: &Path, readonly: bool) -> Result<std::os::fd::OwnedFd, DiskError> {
    use std::ffi::CString;
    use std::os::fd::{FromRawFd, OwnedFd};
    const FSOPEN_CLOEXEC: libc::c_uint = 0x1;
    const FSCONFIG_SET_FLAG: libc::c_uint = 0;
    const FSCONFIG_SET_STRING: libc::c_uint = 1;
    const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
    const FSMOUNT_CLOEXEC: libc::c_uint = 0x1;
    let err = |what: &str| DiskError::Io { what: format!("{what} {} (a detached mount)", dev.display()), source: std::io::Error::last_os_error() };
    let source = CString::new(dev.as_os_str().as_encoded_bytes()).map_err(|_| DiskError::invalid(format!("{} holds a NUL byte", dev.display())))?;
    // SAFETY: a NUL-terminated name and flags; the descriptor returned is owned below.
    let fs = unsafe { libc::syscall(libc::SYS_fsopen, c"ext4".as_ptr(), FSOPEN_CLOEXEC) };
    if fs < 0 {
        return Err(err("open an ext4 context for"));
    }
    // SAFETY: just returned by the kernel, owned by nobody else.
    let fs = unsafe { OwnedFd::from_raw_fd(fs as i32) };
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fs);
    let set = |cmd: libc::c_uint, key: Option<&std::ffi::CStr>, value: Option<&std::ffi::CStr>| {
        // SAFETY: the context is open; the key and value are NUL-terminated or null.
        let rc = unsafe {
            libc::syscall(libc::SYS_fsconfig, raw, cmd, key.map_or(std::ptr::null(), |k| k.as_ptr()), value.map_or(std::ptr::null(), |v| v.as_ptr()), 0)
        };
        (rc == 0).then_some(()).ok_or_else(|| err("configure the mount of"))
    };
    set(FSCONFIG_SET_STRING, Some(c"source"), Some(&source))?;
    if readonly {
        set(FSCONFIG_SET_FLAG, Some(c"ro"), None)?;
        set(FSCONFIG_SET_FLAG, Some(c"norecovery"), None)?;
    }
    set(FSCONFIG_CMD_CREATE, None, None)?;
    let attrs = if readonly { libc::MOUNT_ATTR_RDONLY as libc::c_uint } else { 0 };
    // SAFETY: the context is open and created; the descriptor returned is owned below.
    let m = unsafe { libc::syscall(libc::SYS_fsmount, raw, FSMOUNT_CLOEXEC, attrs) };
    if m < 0 {
        return Err(err("mount"));
    }
    // SAFETY: just returned by the kernel, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(m as i32) })
}

/// The entries of the directory `dir`, as paths.
fn list(dir: &Path) -> Result<Vec<std::path::PathBuf>, DiskError> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(DiskError::io(format!("list {}", dir.display())))? {
        out.push(e.map_err(DiskError::io(format!("list {}", dir.display())))?.path());
    }
    Ok(out)
}
