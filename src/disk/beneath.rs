//! Paths handed in by the CO (staging and target paths), opened once beneath an allowed
//! root and then used only through the descriptor: what was checked is what is mounted
//! on, bound, created, removed, unmounted, measured or frozen. No path string is looked
//! up twice.
//!
//! Rules:
//! - a path must be absolute, at most 4096 bytes, free of NUL, `.` and `..`
//!   components, and lie lexically under one of the allowed roots (as configured, or as
//!   the root resolves); the root itself is the admin's and is opened as given;
//! - beneath the root no symbolic link is followed, at any component, by `openat2`
//!   with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`: a symlink
//!   planted anywhere on the way, or swapped in at any moment, makes the call fail with
//!   the path named; it never redirects it;
//! - directories are made one component at a time (`mkdirat` on the parent's
//!   descriptor, then opened beneath it the same way); a block target file is created
//!   with `O_CREAT | O_EXCL | O_NOFOLLOW`, and an existing one is opened without ever
//!   being read or written (a FIFO planted there cannot block the agent);
//! - a filesystem is mounted on the descriptor (`mount(2)` on `/proc/self/fd/N`, which
//!   the kernel resolves to the very directory opened); a bind is a detached copy of the
//!   source's mount (`open_tree`), given its flags (read-only, nosuid, ...) before it is
//!   attached (`mount_setattr`) and attached on the descriptor (`move_mount`), so a
//!   read-only bind is never writable, not even for a moment;
//! - an unmount opens the path (which lands on the topmost mount there), checks that
//!   it is the root of a mount, and unmounts the mount at that name in the directory
//!   checked (through the parent's descriptor, the name not followed);
//! - removal is `unlinkat` on the parent's descriptor of a name that is not followed.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;

use super::DiskError;

/// Longest path accepted, in bytes.
pub const MAX_PATH: usize = 4096;

/// Most mounts stacked on one path that [`unmount_all`] removes.
pub const MAX_LAYERS: usize = 16;

/// Why a path cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// The path is refused: the request is wrong (`InvalidArgument`), in words.
    #[error("{0}")]
    Refused(String),
    /// The path is fine but the operation failed.
    #[error(transparent)]
    Disk(#[from] DiskError),
}

/// A file or directory opened beneath an allowed root: every later step uses its
/// descriptor. `shown` is the path asked for, for messages only.
#[derive(Debug)]
pub struct Node {
    fd: OwnedFd,
    shown: PathBuf,
}

/// What [`Node::stat`] tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeStat {
    /// A directory.
    pub dir: bool,
    /// A regular file.
    pub file: bool,
    /// The device number (major, minor) of the filesystem holding it.
    pub dev: (u32, u32),
    /// For a block device node, the device it stands for.
    pub rdev: Option<(u32, u32)>,
    /// The root of a mount (something is mounted at its path and this is what shows).
    pub mount_root: bool,
}

impl Node {
    /// The path asked for (for messages; never looked up again).
    pub fn shown(&self) -> &Path {
        &self.shown
    }

    /// The magic link the kernel resolves to exactly this node, for calls that take a
    /// path (`mount(2)`, `umount2(2)`, a reopen).
    fn proc_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    /// Its kind, devices and whether it is a mount's root (`statx` on the descriptor).
    pub fn stat(&self) -> Result<NodeStat, DiskError> {
        // SAFETY: statx writes one `statx` into `st`, which lives on this frame; the
        // empty path with AT_EMPTY_PATH names the open descriptor.
        let mut st: libc::statx = unsafe { std::mem::zeroed() };
        let empty = c"";
        let rc = unsafe {
            libc::statx(
                self.fd.as_raw_fd(),
                empty.as_ptr(),
                libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
                libc::STATX_TYPE | libc::STATX_MNT_ID,
                &mut st,
            )
        };
        if rc != 0 {
            return Err(DiskError::Io { what: format!("stat {}", self.shown.display()), source: std::io::Error::last_os_error() });
        }
        let kind = u32::from(st.stx_mode) & libc::S_IFMT;
        let mount_root = st.stx_attributes_mask & libc::STATX_ATTR_MOUNT_ROOT as u64 != 0
            && st.stx_attributes & libc::STATX_ATTR_MOUNT_ROOT as u64 != 0;
        Ok(NodeStat {
            dir: kind == libc::S_IFDIR,
            file: kind == libc::S_IFREG,
            dev: (st.stx_dev_major, st.stx_dev_minor),
            rdev: (kind == libc::S_IFBLK).then_some((st.stx_rdev_major, st.stx_rdev_minor)),
            mount_root,
        })
    }

    /// Opens this very node again for reading (a directory for `FIFREEZE` or an ioctl),
    /// through its magic link: the same inode, never a new lookup of the path.
    pub fn reopen_dir(&self) -> Result<File, DiskError> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(self.proc_path())
            .map_err(DiskError::io(format!("open {}", self.shown.display())))
    }

    /// The directory `name` right beneath this one, on the same filesystem, opened by
    /// descriptor (no symlink, no crossing into another mount): what an encrypted
    /// volume's pod sees is its filesystem's data directory, bound from here.
    pub fn child_dir(&self, name: &str) -> Result<Node, DiskError> {
        let shown = self.shown.join(name);
        let fd = openat2(self.fd.as_raw_fd(), Path::new(name), libc::O_PATH | libc::O_DIRECTORY, 0)
            .map_err(|e| DiskError::Io { what: format!("open {}", shown.display()), source: e.into() })?;
        let child = Node { fd, shown };
        if child.stat()?.dev != self.stat()?.dev {
            return Err(DiskError::invalid(format!("{} is on another filesystem than its parent", child.shown.display())));
        }
        Ok(child)
    }

    /// Reads this directory's entries through its descriptor (the magic link, never
    /// the path's name): the first entry's name, `None` when it is empty. `between`
    /// runs once the directory is open and before its first entry is read.
    pub fn read_first(&self, between: impl FnOnce()) -> std::io::Result<Option<std::ffi::OsString>> {
        let mut entries = std::fs::read_dir(self.proc_path())?;
        between();
        entries.next().transpose().map(|e| e.map(|e| e.file_name()))
    }

    /// Another descriptor of this very node (for a thread that reads it while this one
    /// waits).
    pub fn try_clone(&self) -> Result<Node, DiskError> {
        let fd = self.fd.try_clone().map_err(DiskError::io(format!("duplicate the descriptor of {}", self.shown.display())))?;
        Ok(Node { fd, shown: self.shown.clone() })
    }

    /// Usage of the filesystem holding this node (`fstatvfs`).
    pub fn usage(&self) -> Result<super::fs::Usage, DiskError> {
        let st = nix::sys::statvfs::fstatvfs(self.fd.as_fd())
            .map_err(|e| DiskError::Io { what: format!("statvfs {}", self.shown.display()), source: e.into() })?;
        Ok(super::fs::Usage::of(&st))
    }
}

/// A root and the path beneath it, as given.
struct Split<'a> {
    root: PathBuf,
    rel: &'a Path,
}

/// Checks `path` lexically and finds the allowed root it lies under.
fn split<'a>(path: &'a Path, roots: &[PathBuf]) -> Result<Split<'a>, PathError> {
    let shown = path.display();
    let raw = path.as_os_str().as_bytes();
    let refuse = |m: String| Err(PathError::Refused(m));
    if raw.is_empty() {
        return refuse("path is empty".into());
    }
    if raw.len() > MAX_PATH {
        return refuse(format!("path is {} bytes long; the limit is {MAX_PATH}", raw.len()));
    }
    if raw.contains(&0) {
        return refuse("path contains a NUL byte".into());
    }
    if !path.is_absolute() {
        return refuse(format!("path {shown} is not absolute"));
    }
    // `Path::components` silently drops inner `.`; look at the raw segments.
    if raw.split(|b| *b == b'/').any(|seg| seg == b"." || seg == b"..") || path.components().any(|c| matches!(c, Component::ParentDir)) {
        return refuse(format!("path {shown} contains '.' or '..' components"));
    }
    for root in roots {
        let resolved = std::fs::canonicalize(root).ok();
        for r in std::iter::once(root.clone()).chain(resolved) {
            if let Ok(rel) = path.strip_prefix(&r) {
                if rel.as_os_str().is_empty() {
                    return refuse(format!("path {shown} is an allowed root itself, not a path beneath it"));
                }
                return Ok(Split { root: r, rel });
            }
        }
    }
    let allowed: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    refuse(format!("path {shown} is outside the allowed roots ({}); see volumes.allowed_roots", allowed.join(", ")))
}

fn cstr(p: &Path) -> Result<CString, PathError> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| PathError::Refused(format!("path {} contains a NUL byte", p.display())))
}

fn io(what: String, e: Errno) -> PathError {
    PathError::Disk(DiskError::Io { what, source: e.into() })
}

/// Opens the admin's root directory (as configured; a symlink there is the admin's);
/// `None` when it does not exist.
fn find_root(root: &Path) -> Result<Option<OwnedFd>, PathError> {
    let c = cstr(root)?;
    // SAFETY: `c` is a valid NUL-terminated string for the call; the descriptor
    // returned is owned from here on.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return match Errno::last() {
            Errno::ENOENT => Ok(None),
            e => Err(io(format!("open the allowed root {}", root.display()), e)),
        };
    }
    // SAFETY: `fd` was just returned by open and is owned by nobody else.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Opens the admin's root directory, making it (and its parents) first when it does
/// not exist yet.
fn open_root(root: &Path) -> Result<OwnedFd, PathError> {
    if let Some(fd) = find_root(root)? {
        return Ok(fd);
    }
    std::fs::create_dir_all(root).map_err(|e| PathError::Disk(DiskError::Io { what: format!("make the allowed root {}", root.display()), source: e }))?;
    find_root(root)?.ok_or_else(|| io(format!("open the allowed root {}", root.display()), Errno::ENOENT))
}

/// `openat2` of `rel` beneath `dir`, following no symlink at all.
fn openat2(dir: RawFd, rel: &Path, flags: i32, mode: u32) -> Result<OwnedFd, Errno> {
    let c = CString::new(rel.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    // SAFETY: zeroed is a valid `open_how` (all fields are integers).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    // No O_NOFOLLOW: with it, O_PATH would answer a trailing symlink itself; without
    // it, RESOLVE_NO_SYMLINKS refuses every symlink, the last one too (ELOOP).
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.mode = if flags & libc::O_CREAT != 0 { u64::from(mode) } else { 0 };
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // The kernel answers EAGAIN when a rename raced the walk: look again a few times.
    for _ in 0..16 {
        // SAFETY: `c` and `how` live on this frame for the call; the size is the
        // struct's own.
        let rc = unsafe { libc::syscall(libc::SYS_openat2, dir, c.as_ptr(), &how as *const libc::open_how, std::mem::size_of::<libc::open_how>()) };
        if rc >= 0 {
            // SAFETY: a descriptor the kernel just returned, owned by nobody else.
            return Ok(unsafe { OwnedFd::from_raw_fd(rc as RawFd) });
        }
        match Errno::last() {
            Errno::EAGAIN | Errno::EINTR => continue,
            e => return Err(e),
        }
    }
    Err(Errno::EAGAIN)
}

/// The words for an `openat2` refusal of `shown` beneath `root`.
fn refusal(e: Errno, shown: &Path, root: &Path) -> Option<PathError> {
    let shown = shown.display();
    let root = root.display();
    Some(PathError::Refused(match e {
        Errno::ELOOP => format!("path {shown} is or passes through a symbolic link; beneath {root} drivelet follows none"),
        Errno::EXDEV => format!("path {shown} leads outside {root}"),
        Errno::ENOTDIR => format!("a part of path {shown} is not a directory"),
        _ => return None,
    }))
}

/// Opens `path` beneath its allowed root without following any symlink; `None` when it
/// does not exist. The node is what shows at the path: the root of the topmost mount
/// there, if any.
pub fn open(path: &Path, roots: &[PathBuf]) -> Result<Option<Node>, PathError> {
    let s = split(path, roots)?;
    let Some(root) = find_root(&s.root)? else { return Ok(None) };
    match openat2(root.as_raw_fd(), s.rel, libc::O_PATH, 0) {
        Ok(fd) => Ok(Some(Node { fd, shown: path.to_path_buf() })),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(refusal(e, path, &s.root).unwrap_or_else(|| io(format!("open {}", path.display()), e))),
    }
}

/// Makes `path` a directory beneath its allowed root, with every missing parent (mode
/// 0755), one component at a time; answers the directory. An existing directory is
/// fine; anything else there (a file, a symlink) is refused.
pub fn make_dir(path: &Path, roots: &[PathBuf]) -> Result<Node, PathError> {
    let s = split(path, roots)?;
    Ok(Node { fd: make_dirs(&s, s.rel, path)?, shown: path.to_path_buf() })
}

/// Makes the directories of `rel` beneath `s`'s root, one component at a time.
fn make_dirs(s: &Split, rel: &Path, path: &Path) -> Result<OwnedFd, PathError> {
    let mut dir = open_root(&s.root)?;
    for comp in rel.components() {
        let Component::Normal(name) = comp else { continue };
        let name = Path::new(name);
        let c = cstr(name)?;
        // SAFETY: `dir` is an open descriptor and `c` a valid string for the call.
        let rc = unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o755) };
        if rc != 0 && Errno::last() != Errno::EEXIST {
            let e = Errno::last();
            return Err(refusal(e, path, &s.root).unwrap_or_else(|| io(format!("make directory {}", path.display()), e)));
        }
        dir = openat2(dir.as_raw_fd(), name, libc::O_PATH | libc::O_DIRECTORY, 0)
            .map_err(|e| refusal(e, path, &s.root).unwrap_or_else(|| io(format!("open {}", path.display()), e)))?;
    }
    Ok(dir)
}

/// The name at the end of `s` and the path of its parent beneath the root.
fn last<'a>(s: &Split<'a>, path: &Path) -> Result<(&'a Path, &'a Path), PathError> {
    match (s.rel.parent(), s.rel.file_name()) {
        (Some(parent), Some(name)) => Ok((parent, Path::new(name))),
        _ => Err(PathError::Refused(format!("path {} names no file", path.display()))),
    }
}

/// Makes `path` an empty regular file beneath its allowed root (mode 0640; missing
/// parents are made as by [`make_dir`]), or opens what is there: a regular file, or a
/// device node bound there before. Nothing there is ever read or written.
pub fn make_file(path: &Path, roots: &[PathBuf]) -> Result<Node, PathError> {
    let s = split(path, roots)?;
    let (parent, name) = last(&s, path)?;
    let dir = make_dirs(&s, parent, path)?;
    let node = |fd| Node { fd, shown: path.to_path_buf() };
    let fail = |e: Errno, what: &str| refusal(e, path, &s.root).unwrap_or_else(|| io(format!("{what} {}", path.display()), e));
    for _ in 0..4 {
        match openat2(dir.as_raw_fd(), name, libc::O_PATH, 0) {
            Ok(fd) => return Ok(node(fd)),
            Err(Errno::ENOENT) => {}
            Err(e) => return Err(fail(e, "open")),
        }
        match openat2(dir.as_raw_fd(), name, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o640) {
            Ok(fd) => return Ok(node(fd)),
            // Made meanwhile: open what is there.
            Err(Errno::EEXIST) => {}
            Err(e) => return Err(fail(e, "create file")),
        }
    }
    Err(PathError::Refused(format!("path {} keeps changing while it is created", path.display())))
}

/// The directory holding `path`'s last component, opened beneath its root, with that
/// name and the root; `None` when the root or that directory does not exist.
fn existing_parent<'a>(path: &'a Path, roots: &[PathBuf]) -> Result<Option<(OwnedFd, &'a Path, PathBuf)>, PathError> {
    let s = split(path, roots)?;
    let (parent, name) = last(&s, path)?;
    let Some(root) = find_root(&s.root)? else { return Ok(None) };
    if parent.as_os_str().is_empty() {
        return Ok(Some((root, name, s.root)));
    }
    match openat2(root.as_raw_fd(), parent, libc::O_PATH | libc::O_DIRECTORY, 0) {
        Ok(fd) => Ok(Some((fd, name, s.root))),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(refusal(e, path, &s.root).unwrap_or_else(|| io(format!("open {}", path.display()), e))),
    }
}

/// Removes the file or empty directory at `path` (never following a symlink there);
/// nothing there is fine. A mount point is not removed (the kernel refuses: busy).
pub fn remove(path: &Path, roots: &[PathBuf]) -> Result<(), PathError> {
    let Some((dir, name, _)) = existing_parent(path, roots)? else { return Ok(()) };
    let c = cstr(name)?;
    for flags in [0, libc::AT_REMOVEDIR] {
        // SAFETY: `dir` is an open descriptor and `c` a valid string for the call.
        let rc = unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), flags) };
        match (rc, Errno::last()) {
            (0, _) | (_, Errno::ENOENT) => return Ok(()),
            // A directory: removed by the second round.
            (_, Errno::EISDIR) if flags == 0 => continue,
            (_, e) => return Err(io(format!("remove {}", path.display()), e)),
        }
    }
    Ok(())
}

/// Checks that the kernel has what this module stands on, so that a kernel without it
/// stops the agent at start in words, never later as a mount that cannot be found or
/// undone: `openat2` (Linux 5.6), statx's mount-root attribute (5.8), `open_tree` and
/// `move_mount` (5.2) and `mount_setattr` (5.12).
pub fn check_kernel() -> Result<(), String> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|r| r.trim().to_string()).unwrap_or_default();
    let missing = |what: &str| Err(format!("this kernel ({release}) lacks {what}: drivelet needs Linux 5.12 or later"));
    let root = find_root(Path::new("/")).ok().flatten().ok_or_else(|| "cannot open /".to_string())?;
    if matches!(openat2(root.as_raw_fd(), Path::new("proc"), libc::O_PATH, 0), Err(Errno::ENOSYS)) {
        return missing("openat2");
    }
    let node = Node { fd: root, shown: PathBuf::from("/") };
    if !node.stat().map_err(|e| e.to_string())?.mount_root {
        return missing("statx's mount-root attribute");
    }
    let empty = c"";
    for (name, call) in [("open_tree", libc::SYS_open_tree), ("move_mount", libc::SYS_move_mount), ("mount_setattr", libc::SYS_mount_setattr)] {
        // SAFETY: an invalid descriptor and null pointers: the kernel answers EBADF or
        // EINVAL when it has the call, ENOSYS when it has not; nothing is touched.
        let rc = unsafe { libc::syscall(call, -1, empty.as_ptr(), 0, std::ptr::null::<u8>(), 0) };
        if rc < 0 && Errno::last() == Errno::ENOSYS {
            return missing(name);
        }
    }
    Ok(())
}

/// Mount flags a bind can carry (`mount_setattr`), from `MsFlags`.
pub fn attrs_of(flags: nix::mount::MsFlags, readonly: bool) -> (u64, u64) {
    use nix::mount::MsFlags as F;
    let mut set = 0u64;
    let mut clr = 0u64;
    if readonly || flags.contains(F::MS_RDONLY) {
        set |= libc::MOUNT_ATTR_RDONLY;
    }
    for (f, a) in [(F::MS_NOSUID, libc::MOUNT_ATTR_NOSUID), (F::MS_NODEV, libc::MOUNT_ATTR_NODEV), (F::MS_NOEXEC, libc::MOUNT_ATTR_NOEXEC), (F::MS_NODIRATIME, libc::MOUNT_ATTR_NODIRATIME)] {
        if flags.contains(f) {
            set |= a;
        }
    }
    let atime = [(F::MS_NOATIME, libc::MOUNT_ATTR_NOATIME), (F::MS_STRICTATIME, libc::MOUNT_ATTR_STRICTATIME), (F::MS_RELATIME, libc::MOUNT_ATTR_RELATIME)];
    if let Some((_, a)) = atime.iter().find(|(f, _)| flags.contains(*f)) {
        clr |= libc::MOUNT_ATTR__ATIME;
        set |= a;
    }
    (set, clr)
}

fn sys_fd(rc: libc::c_long, what: impl FnOnce() -> String) -> Result<OwnedFd, DiskError> {
    if rc < 0 {
        return Err(DiskError::Io { what: what(), source: std::io::Error::last_os_error() });
    }
    // SAFETY: a descriptor the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as RawFd) })
}

fn sys_ok(rc: libc::c_long, what: impl FnOnce() -> String, target: &Path) -> Result<(), DiskError> {
    if rc == 0 {
        return Ok(());
    }
    let e = Errno::last();
    Err(match e {
        Errno::EBUSY => DiskError::Busy { path: target.to_path_buf(), reason: format!("{}: {e}", what()) },
        _ => DiskError::Io { what: what(), source: e.into() },
    })
}

/// Binds `source` (a directory, or a file such as a device node, opened by the caller)
/// onto `target`, with the mount attributes `(set, clear)` of [`attrs_of`] applied to
/// the copy before it is attached. `source_shown` names the source in messages.
pub fn bind(source: &impl AsFd, source_shown: &Path, target: &Node, attrs: (u64, u64)) -> Result<(), DiskError> {
    let empty = c"";
    let what = || format!("bind {} at {}", source_shown.display(), target.shown.display());
    // SAFETY: the source descriptor is open for the call; the empty path with
    // AT_EMPTY_PATH names it. The result is a detached copy of its mount.
    let tree = sys_fd(
        unsafe {
            libc::syscall(
                libc::SYS_open_tree,
                source.as_fd().as_raw_fd(),
                empty.as_ptr(),
                (libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC) as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint,
            )
        },
        what,
    )?;
    if attrs != (0, 0) {
        let attr = libc::mount_attr { attr_set: attrs.0, attr_clr: attrs.1, propagation: 0, userns_fd: 0 };
        // SAFETY: `tree` is open; `attr` lives on this frame, its size is the struct's.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                tree.as_raw_fd(),
                empty.as_ptr(),
                libc::AT_EMPTY_PATH as libc::c_uint,
                &attr as *const libc::mount_attr,
                std::mem::size_of::<libc::mount_attr>(),
            )
        };
        sys_ok(rc, || format!("{} (set its flags)", what()), &target.shown)?;
    }
    // SAFETY: both descriptors are open for the call; empty paths name them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            target.fd.as_raw_fd(),
            empty.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH | libc::MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    sys_ok(rc, what, &target.shown)
}

/// Binds `source` (an opened node) onto `target`, as [`bind`].
pub fn bind_node(source: &Node, target: &Node, attrs: (u64, u64)) -> Result<(), DiskError> {
    bind(&source.fd, &source.shown, target, attrs)
}

/// Opens a source for [`bind`] that is not beneath the roots and not the CO's to name:
/// a device node of the kernel's (under /dev) or a directory an admin adopted. A
/// symlink at its last component is not followed.
pub fn open_source(path: &Path) -> Result<OwnedFd, DiskError> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| DiskError::invalid(format!("{} contains a NUL byte", path.display())))?;
    // SAFETY: `c` is valid for the call; the descriptor returned is owned from here on.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    sys_fd(fd as libc::c_long, || format!("open {}", path.display()))
}

/// [`open_source`] as a [`Node`]: a path of the admin's or the kernel's (an adopted
/// directory), opened once, its last component not followed, then used only through
/// its descriptor.
pub fn open_outside(path: &Path) -> Result<Node, DiskError> {
    Ok(Node { fd: open_source(path)?, shown: path.to_path_buf() })
}

/// Opens the absolute path `path`, which must hold no symlink at any component (a path
/// `canonicalize` answered), from `/` with `openat2` and `RESOLVE_NO_SYMLINKS |
/// RESOLVE_NO_MAGICLINKS`: a symlink swapped in at any component since fails the open
/// (ELOOP); it never redirects it.
pub fn open_resolved(path: &Path) -> Result<Node, DiskError> {
    let rel = path.strip_prefix("/").map_err(|_| DiskError::invalid(format!("{} is not absolute", path.display())))?;
    let root = find_root(Path::new("/")).ok().flatten().ok_or_else(|| DiskError::invalid("cannot open /"))?;
    // Beneath `/` is everything: RESOLVE_BENEATH changes nothing there.
    match openat2(root.as_raw_fd(), rel, libc::O_PATH, 0) {
        Ok(fd) => Ok(Node { fd, shown: path.to_path_buf() }),
        Err(Errno::ELOOP) => Err(DiskError::invalid(format!("{} is or passes through a symbolic link now", path.display()))),
        Err(e) => Err(DiskError::Io { what: format!("open {}", path.display()), source: e.into() }),
    }
}

/// Mounts the filesystem `fs` on the device `dev` at the directory `target`.
pub fn mount_fs(dev: &Path, target: &Node, fs: &str, opts: &super::mount::MountOptions) -> Result<(), DiskError> {
    let st = target.stat()?;
    if !st.dir {
        return Err(DiskError::invalid(format!("mount target {} is not a directory", target.shown.display())));
    }
    let mut flags = opts.flags;
    if opts.readonly {
        flags |= nix::mount::MsFlags::MS_RDONLY;
    }
    let data = (!opts.data.is_empty()).then_some(opts.data.as_str());
    nix::mount::mount(Some(dev), &target.proc_path(), Some(fs), flags, data).map_err(|e| {
        let what = format!("mount {} ({fs}, options {:?}) at {}", dev.display(), opts.data, target.shown.display());
        match e {
            Errno::EBUSY => DiskError::Busy { path: target.shown.clone(), reason: format!("{what}: {e}") },
            _ => DiskError::Io { what, source: e.into() },
        }
    })
}

/// Unmounts every mount stacked at `path`; success when nothing is mounted there or
/// the path does not exist. A mount in use is a [`DiskError::Busy`], once it has stayed
/// in use for half a second (a descriptor a health check holds for a moment is let go).
///
/// Each layer is looked at through a descriptor (it must be a mount's root) and
/// unmounted as `/proc/self/fd/P/NAME`, `P` the descriptor of its checked parent and
/// `NAME` not followed: a descriptor of the mount itself would hold it busy. So only a
/// mount at that name in that very directory is ever unmounted (a mount point cannot be
/// renamed, so what was checked there is what is unmounted).
///
/// `only`: the device `(major, minor)` whose mounts these are (a filesystem on it, or a
/// bind of its device node), checked on the descriptor of each layer before it is
/// unmounted. A layer of another device is left mounted, with nothing beneath it: on
/// top, the path is refused (another volume's mount renamed into its place); beneath
/// the volume's own layers, it is not the volume's and the unmount is done.
pub fn unmount_all(path: &Path, roots: &[PathBuf], only: Option<(u32, u32)>) -> Result<(), PathError> {
    const BUSY_TRIES: u32 = 10;
    const BUSY_WAIT: std::time::Duration = std::time::Duration::from_millis(50);
    let Some((dir, name, root)) = existing_parent(path, roots)? else { return Ok(()) };
    let at = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
    let mut busy = 0;
    let mut layers = 0;
    while layers <= MAX_LAYERS {
        let node = match openat2(dir.as_raw_fd(), name, libc::O_PATH, 0) {
            Ok(fd) => Node { fd, shown: path.to_path_buf() },
            Err(Errno::ENOENT) => return Ok(()),
            Err(e) => return Err(refusal(e, path, &root).unwrap_or_else(|| io(format!("open {}", path.display()), e))),
        };
        let st = node.stat()?;
        drop(node);
        if !st.mount_root {
            return Ok(());
        }
        if let Some(dev) = only.filter(|d| st.dev != *d && st.rdev != Some(*d)) {
            if layers > 0 {
                // The volume's own layers are off; what lies beneath them is not its.
                return Ok(());
            }
            return Err(PathError::Refused(format!(
                "path {} shows another filesystem ({}:{}) than the volume's ({}:{}): something was moved into its place; it is left mounted",
                path.display(),
                st.dev.0,
                st.dev.1,
                dev.0,
                dev.1
            )));
        }
        match nix::mount::umount2(&at, nix::mount::MntFlags::UMOUNT_NOFOLLOW) {
            // EINVAL: no longer a mount (raced with another unmount); look again.
            Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => layers += 1,
            // A moment's holder (a health check's descriptor, a probe) lets go soon:
            // looked at again for up to half a second before the mount is called busy.
            Err(Errno::EBUSY) if busy < BUSY_TRIES => {
                busy += 1;
                std::thread::sleep(BUSY_WAIT);
            }
            Err(Errno::EBUSY) => {
                return Err(PathError::Disk(DiskError::Busy {
                    path: path.to_path_buf(),
                    reason: "the mount is in use (open files or a process working there); not unmounted".into(),
                }))
            }
            Err(e) => return Err(io(format!("unmount {}", path.display()), e)),
        }
    }
    Err(PathError::Disk(DiskError::Busy { path: path.to_path_buf(), reason: format!("still mounted after removing {MAX_LAYERS} layers") }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(r: Result<Option<Node>, PathError>) -> String {
        match r {
            Err(PathError::Refused(m)) => m,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn paths_outside_the_roots_escaping_them_or_through_symlinks_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("kubelet");
        std::fs::create_dir_all(root.join("pods/p1")).unwrap();
        std::fs::create_dir_all(dir.path().join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), root.join("pods/evil")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), root.join("evil-parent")).unwrap();
        std::os::unix::fs::symlink("p1", root.join("pods/inside")).unwrap();
        let roots = vec![root.clone()];
        assert!(open(&root.join("pods/p1"), &roots).unwrap().is_some());
        assert!(open(&root.join("pods/new/deeper"), &roots).unwrap().is_none(), "missing is None");
        assert!(refused(open(&root.join("pods/evil"), &roots)).contains("symbolic link"));
        assert!(refused(open(&root.join("evil-parent/target"), &roots)).contains("symbolic link"));
        assert!(refused(open(&root.join("pods/inside"), &roots)).contains("symbolic link"), "even one that stays inside");
        for bad in [
            PathBuf::from("relative/path"),
            PathBuf::new(),
            root.join("pods/../../elsewhere"),
            root.join("pods/./p1"),
            dir.path().join("elsewhere/x"),
            root.clone(),
            PathBuf::from("/etc/passwd"),
            root.join("a".repeat(5000)),
        ] {
            refused(open(&bad, &roots));
        }
        assert!(matches!(make_dir(&root.join("pods/evil/x"), &roots), Err(PathError::Refused(_))));
        assert!(!dir.path().join("elsewhere/x").exists(), "nothing made through the link");
        assert!(matches!(make_file(&root.join("pods/evil"), &roots), Err(PathError::Refused(_))));
    }

    #[test]
    fn directories_and_files_are_made_beneath_the_root_and_removed_without_following() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("kubelet");
        std::fs::create_dir_all(&root).unwrap();
        let roots = vec![root.clone()];
        let d = make_dir(&root.join("a/b/c"), &roots).unwrap();
        assert!(d.stat().unwrap().dir && root.join("a/b/c").is_dir());
        let again = make_dir(&root.join("a/b/c"), &roots).unwrap();
        assert!(again.stat().unwrap().dir, "an existing directory is fine");
        let f = make_file(&root.join("a/b/dev"), &roots).unwrap();
        assert!(f.stat().unwrap().file);
        assert!(make_file(&root.join("a/b/dev"), &roots).unwrap().stat().unwrap().file, "an existing file is opened");
        assert!(matches!(make_file(&root.join("a/b/c"), &roots), Ok(n) if n.stat().unwrap().dir), "what is there is answered");
        remove(&root.join("a/b/dev"), &roots).unwrap();
        remove(&root.join("a/b/c"), &roots).unwrap();
        remove(&root.join("a/b/c"), &roots).unwrap();
        assert!(!root.join("a/b/c").exists() && !root.join("a/b/dev").exists());
        // A symlink at the name is removed itself, never what it points at.
        std::fs::create_dir_all(dir.path().join("outside/keep")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("outside/keep"), root.join("a/link")).unwrap();
        remove(&root.join("a/link"), &roots).unwrap();
        assert!(dir.path().join("outside/keep").is_dir());
        assert!(d.usage().unwrap().total_bytes > 0);
        assert!(!d.stat().unwrap().mount_root);
    }

    #[test]
    fn a_resolved_path_is_opened_only_while_no_symlink_lies_on_it() {
        let dir = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(real.join("data/vol")).unwrap();
        std::fs::create_dir_all(real.join("elsewhere/vol")).unwrap();
        let n = open_resolved(&real.join("data/vol")).unwrap();
        assert!(n.stat().unwrap().dir);
        // `data` swapped for a symlink since the path was resolved: refused, not followed.
        std::fs::rename(real.join("data"), real.join("data.old")).unwrap();
        std::os::unix::fs::symlink(real.join("elsewhere"), real.join("data")).unwrap();
        let e = open_resolved(&real.join("data/vol")).err().expect("a symlink on the way");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        // The descriptor opened before still names the directory resolved.
        std::fs::write(real.join("data.old/vol/here"), b"").unwrap();
        assert_eq!(n.read_first(|| ()).unwrap().as_deref(), Some(std::ffi::OsStr::new("here")));
        assert!(open_resolved(Path::new("relative")).is_err());
    }

    #[test]
    fn a_fifo_at_a_block_target_is_opened_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("kubelet");
        std::fs::create_dir_all(&root).unwrap();
        nix::unistd::mkfifo(&root.join("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let n = make_file(&root.join("fifo"), &[root.clone()]).unwrap();
        let st = n.stat().unwrap();
        assert!(!st.file && !st.dir, "answered as what it is; the caller refuses it");
    }

    #[test]
    fn this_kernel_has_what_paths_need() {
        check_kernel().unwrap();
    }

    #[test]
    fn bind_attributes_follow_the_flags() {
        use nix::mount::MsFlags as F;
        assert_eq!(attrs_of(F::empty(), false), (0, 0));
        assert_eq!(attrs_of(F::empty(), true), (libc::MOUNT_ATTR_RDONLY, 0));
        assert_eq!(
            attrs_of(F::MS_NOSUID | F::MS_NODEV | F::MS_NOATIME, false),
            (libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV | libc::MOUNT_ATTR_NOATIME, libc::MOUNT_ATTR__ATIME)
        );
    }
}
