//! The node side's disk steps of a volume: stage, unstage, publish, unpublish and the
//! online growth of a staged filesystem, and what backs a volume on this host (its
//! kernel partition, or an adopted directory); the rules are [`super`]'s.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::mount::MsFlags;
use tracing::{info, warn};

use super::{disk, keys, save, Outcome};
use crate::actors::volumes::book::Guards;
use crate::actors::volumes::error::VolumeError;
use crate::actors::volumes::messages::{PublishArgs, StageArgs};
use crate::actors::volumes::model::{next, Op, Staging, Target, VolumeRecord};
use crate::disk::beneath::{self, Node, PathError};
use crate::disk::{blkpg, fs, mount, DiskError};
use crate::failpoint::crash_point;
use crate::store::Store;
use crate::words::DriveLoc;

/// A path refused is the caller's mistake (`InvalidArgument`); anything else failed.
fn path_err(id: &str, op: &'static str) -> impl FnOnce(PathError) -> VolumeError {
    let id = id.to_string();
    move |e| match e {
        PathError::Refused(reason) => VolumeError::InvalidArgument { reason: format!("volume {id}: {reason}") },
        PathError::Disk(d) => disk(&id, op)(d),
    }
}

/// Whether a mount of the device `dev` shows at `node`: a filesystem on it (or a bind
/// of one), or a bind of its device node.
fn shows(node: Option<&Node>, dev: (u32, u32)) -> bool {
    node.and_then(|n| n.stat().ok()).is_some_and(|s| s.mount_root && (s.dev == dev || s.rdev == Some(dev)))
}

/// What shows at `path` beneath the roots (`None`: nothing there).
fn look(id: &str, path: &Path, roots: &[PathBuf]) -> Result<Option<Node>, VolumeError> {
    beneath::open(path, roots).map_err(path_err(id, "open the path"))
}

/// What a volume's data lives on: its partition, or (adopted) a directory of the host.
pub(super) enum Backing {
    /// A drivelet partition, as the kernel knows it.
    Partition(blkpg::KernelPartition),
    /// An adopted volume's directory, opened once (its last component not followed),
    /// and the device number of its filesystem, read on that descriptor.
    Dir {
        /// The directory as recorded.
        path: PathBuf,
        /// The directory, opened: what is checked is what is bound.
        node: Node,
        /// `st_dev` of the directory's filesystem.
        devnum: (u32, u32),
    },
}

impl Backing {
    fn devnum(&self) -> (u32, u32) {
        match self {
            Backing::Partition(kp) => kp.devnum,
            Backing::Dir { devnum, .. } => *devnum,
        }
    }
}

/// [`backing`], with the kernel partition held open until the returned file is dropped:
/// udev re-reads a disk's table (dropping every BLKPG partition) only while none of its
/// partitions is open, and a re-read can still be on its way after a crash left a
/// write unanswered. Held from here to the mount, the node mkfs and mount are given
/// stays. A partition gone between finding and opening it is found (added) again.
fn backing_held(drive: Option<&DriveLoc>, rec: &VolumeRecord) -> Result<(Backing, Option<std::fs::File>), VolumeError> {
    let mut tries = 0;
    loop {
        let b = backing(drive, rec)?;
        let Backing::Partition(kp) = &b else { return Ok((b, None)) };
        match std::fs::File::open(&kp.devnode) {
            Ok(f) => return Ok((b, Some(f))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < 3 => tries += 1,
            Err(e) => return Err(disk(&rec.id, "open the kernel partition")(DiskError::Io { what: kp.devnode.display().to_string(), source: e })),
        }
    }
}

/// The backing of `rec`: its adopted directory, or its kernel partition on `drive`.
pub(super) fn backing(drive: Option<&DriveLoc>, rec: &VolumeRecord) -> Result<Backing, VolumeError> {
    if rec.lost {
        return Err(crate::actors::volumes::conditions::lost(rec));
    }
    if let Some(a) = &rec.adopted {
        // Opened once; checked and later bound through the descriptor, never by name.
        let unreadable = |e: DiskError| VolumeError::AdoptedUnreadable { volume_id: rec.id.clone(), path: a.path.clone(), reason: e.to_string() };
        let node = beneath::open_outside(&a.path).map_err(unreadable)?;
        let st = node.stat().map_err(unreadable)?;
        if !st.dir {
            return Err(VolumeError::AdoptedNotDirectory { volume_id: rec.id.clone(), path: a.path.clone() });
        }
        return Ok(Backing::Dir { path: a.path.clone(), node, devnum: st.dev });
    }
    let drive = drive.ok_or_else(|| VolumeError::DriveAbsent { volume_id: rec.id.clone(), drive_id: rec.drive_id.clone() })?;
    blkpg::ensure_kernel_partition(&drive.path, rec.start, rec.size).map(Backing::Partition).map_err(disk(&rec.id, "find the kernel partition"))
}

/// Whether `path` is a device node of the block volume `rec`: it lies under the allowed
/// roots, is a block device node, and its device number is the kernel partition of `rec`
/// on `drive` (matched by start). This is how kubelet asks for a block volume's stats:
/// at its own bind of the published device, `.../volumeDevices/<pv>/dev/<pod uid>`.
/// Read-only: the kernel's partitions are looked up, never added.
pub(crate) fn is_device_of(path: &Path, roots: &[PathBuf], drive: &DriveLoc, rec: &VolumeRecord) -> bool {
    if !rec.block {
        return false;
    }
    let Some(devnum) = beneath::open(path, roots).ok().flatten().and_then(|n| n.stat().ok()).and_then(|s| s.rdev) else { return false };
    let Ok(parts) = blkpg::kernel_partitions(&drive.path) else { return false };
    is_partition_at(devnum, &parts, rec.start)
}

/// Whether `devnum` is the kernel partition among `parts` that starts at `start`.
fn is_partition_at(devnum: (u32, u32), parts: &[blkpg::KernelPartition], start: u64) -> bool {
    parts.iter().any(|p| p.start == start && p.devnum == devnum)
}

/// Grows a staged volume's filesystem to its partition (NodeExpandVolume), online;
/// block volumes have nothing to grow. The partition must already have its new size.
pub(crate) fn node_expand(drive: &DriveLoc, roots: &[PathBuf], rec: VolumeRecord) -> Outcome<u64> {
    let res = (|| {
        if rec.block {
            return Ok(rec.size);
        }
        let Some(staging) = rec.staging.as_ref().filter(|s| s.done).map(|s| s.path.clone()) else {
            return Err(VolumeError::NotStaged { volume_id: rec.id.clone() });
        };
        let parts = blkpg::kernel_partitions(&drive.path).map_err(disk(&rec.id, "list the kernel partitions"))?;
        if let Some(p) = parts.iter().find(|p| p.start == rec.start && p.size < rec.size) {
            return Err(VolumeError::ExpandUnfinished { volume_id: rec.id.clone(), kernel_size: p.size, size: rec.size });
        }
        let kp = blkpg::ensure_kernel_partition(&drive.path, rec.start, rec.size).map_err(disk(&rec.id, "find the kernel partition"))?;
        if rec.fs_type == "ext4" && !crate::disk::has_capability(crate::disk::CAP_SYS_RESOURCE) {
            // Grown offline when it was staged: nothing left to do.
            if fs::ext4_fills_device(&kp.devnode).map_err(disk(&rec.id, "read the filesystem's size"))? {
                return Ok(rec.size);
            }
            return Err(VolumeError::CannotGrowExt4 { volume_id: rec.id.clone() });
        }
        let at = look(&rec.id, &staging, roots)?.filter(|n| shows(Some(n), kp.devnum));
        let Some(at) = at else { return Err(VolumeError::NotStaged { volume_id: rec.id.clone() }) };
        // A test swaps the staging path here: the growth goes on through `at`.
        crate::failpoint::hold("node_expand.checked.hold", &staging);
        fs::grow(&kp.devnode, &at, &rec.fs_type).map_err(disk(&rec.id, "grow the filesystem"))?;
        crash_point!("node_expand.grown");
        Ok(rec.size)
    })();
    Outcome { record: Some(rec), result: res }
}

/// Refuses a path that cannot be used beneath the roots before anything is changed.
fn check_path(id: &str, p: &Path, roots: &[PathBuf]) -> Result<(), VolumeError> {
    look(id, p, roots).map(drop)
}

/// Stages a volume: intent, mkfs (only on a volume drivelet wiped and never
/// formatted), mount, then `Staged`.
pub(crate) fn stage(store: &Store, guards: &Arc<Guards>, drive: Option<&DriveLoc>, roots: &[PathBuf], rec: VolumeRecord, a: StageArgs) -> Outcome<()> {
    let prev = rec.clone();
    // A health check's read-only fsck holds the partition: mkfs and mount wait for it.
    let _unchecked = guards.step(&rec.id);
    match stage_steps(store, drive, roots, rec, &a) {
        Ok(done) => Outcome { record: Some(done), result: Ok(()) },
        Err((e, now)) => {
            let mut back = now.unwrap_or_else(|| prev.clone());
            // An intent this call recorded is withdrawn (nothing stays mounted).
            if back.staging.as_ref().is_some_and(|s| !s.done && s.path == a.path) {
                let _ = beneath::unmount_all(&a.path, roots, None);
                back.staging = prev.staging.clone();
                back.state = prev.state;
                back.formatted |= prev.formatted;
                if let Err(se) = save(store, &back) {
                    warn!(volume.id = %back.id, error = %se, "cannot withdraw a stage intent; a restart does");
                }
            }
            Outcome { record: Some(back), result: Err(e) }
        }
    }
}

type StepErr = (VolumeError, Option<VolumeRecord>);

fn stage_steps(store: &Store, drive: Option<&DriveLoc>, roots: &[PathBuf], mut rec: VolumeRecord, a: &StageArgs) -> Result<VolumeRecord, StepErr> {
    let id = rec.id.clone();
    check_path(&id, &a.path, roots).map_err(|e| (e, None))?;
    let mut opts = mount::parse_mount_flags(&a.flags)
        .map_err(|reason| (VolumeError::InvalidArgument { reason: format!("volume {id}: {reason}") }, None))?;
    if a.readonly {
        opts.readonly = true;
        opts.flags |= nix::mount::MsFlags::MS_RDONLY;
    }
    if let Some(st) = &rec.staging {
        if st.path != a.path {
            return Err((
                VolumeError::AlreadyStaged { volume_id: id.clone(), path: st.path.clone() },
                None,
            ));
        }
        if st.done && (st.block != a.block || st.readonly != a.readonly || st.flags != a.flags) {
            return Err((
                VolumeError::AlreadyExists {
                    volume: id.clone(),
                    reason: format!("is staged at {} with a different capability or mount flags", a.path.display()),
                },
                None,
            ));
        }
    }
    let next_state = next(rec.state, Op::Stage).map_err(|r| (VolumeError::refused(&rec, r), None))?;
    if a.block != rec.block && !rec.rebuilt {
        return Err((VolumeError::WrongAccessType { volume_id: id.clone(), block: rec.block, call: "staged" }, None));
    }
    let fs_type = if a.fs_type.is_empty() { rec.fs_type.clone() } else { a.fs_type.clone() };
    if !a.block && !rec.fs_type.is_empty() && fs_type != rec.fs_type {
        return Err((
            VolumeError::WrongFilesystem { volume_id: id.clone(), holds: rec.fs_type.clone(), asked: fs_type },
            None,
        ));
    }
    let (b, _held) = backing_held(drive, &rec).map_err(|e| (e, None))?;
    let found = match &b {
        Backing::Partition(kp) if !a.block => fs::probe_fs(&kp.devnode).map_err(|e| (disk(&id, "probe the filesystem")(e), None))?,
        // An adopted directory holds the data of its filesystem: never formatted.
        Backing::Dir { .. } => Some(rec.fs_type.clone()),
        Backing::Partition(_) => None,
    };
    if let Some(found) = &found {
        if rec.formatted && *found != fs_type {
            return Err((
                VolumeError::FilesystemFound { volume_id: id.clone(), found: found.clone(), asked: fs_type },
                None,
            ));
        }
    }
    if rec.staging.as_ref().is_some_and(|s| s.done) && (a.block || shows(look(&id, &a.path, roots).map_err(|e| (e, None))?.as_ref(), b.devnum())) {
        return Ok(rec);
    }
    // An encrypted volume's key-encryption keys, checked before anything changes.
    let encrypted = rec.encrypted() && !a.block && matches!(b, Backing::Partition(_));
    let keks = if encrypted { Some(keys::keks(&id, &a.secrets, "node-stage").map_err(|e| (e, None))?) } else { None };
    rec.staging = Some(Staging { path: a.path.clone(), block: a.block, flags: a.flags.clone(), readonly: a.readonly, done: false });
    save(store, &rec).map_err(|e| (e, None))?;
    crash_point!("stage.intent_saved");
    let mut r2 = rec.clone();
    let res = (|| {
        if let (false, Backing::Partition(kp)) = (a.block, &b) {
            let mut key = None;
            if found.is_none() || !r2.formatted {
                match &keks {
                    // The key is made with the filesystem, before the record says it is
                    // formatted: a kill between the two formats again with a new key.
                    Some(keks) => {
                        fs::mkfs_encrypting(&kp.devnode).map_err(disk(&id, "make the filesystem"))?;
                        crash_point!("stage.formatted");
                        key = Some(keys::make(&r2, kp, keks)?);
                    }
                    None => {
                        fs::mkfs(&kp.devnode, &fs_type).map_err(disk(&id, "make the filesystem"))?;
                        crash_point!("stage.formatted");
                    }
                }
                r2.formatted = true;
                r2.fs_type = fs_type.clone();
                save(store, &r2)?;
                info!(volume.id = %id, volume.fs = %fs_type, volume.encrypted = key.is_some(), "filesystem made");
            }
            let dir = beneath::make_dir(&a.path, roots).map_err(path_err(&id, "create the staging directory"))?;
            let mounted = shows(Some(&dir), kp.devnum);
            if let (Some(keks), None) = (&keks, &key) {
                key = Some(keys::open(&r2, kp, keks, mounted)?);
            }
            if !mounted {
                // A volume grown while unstaged: ext4 grows offline here (online growth
                // needs CAP_SYS_RESOURCE); xfs grows online through NodeExpandVolume.
                if fs_type == "ext4" && fs::grow_ext4_offline(&kp.devnode).map_err(disk(&id, "grow the filesystem offline"))? {
                    info!(volume.id = %id, volume.size = r2.size, "filesystem grown offline to its partition");
                }
                beneath::mount_fs(&kp.devnode, &dir, &fs_type, &opts).map_err(disk(&id, "mount the filesystem"))?;
            }
            if let Some(key) = key {
                // The filesystem just mounted, opened once and checked to be this
                // volume's: its key and data directory go there.
                let root = look(&id, &a.path, roots)?.filter(|n| shows(Some(n), kp.devnum)).ok_or_else(|| VolumeError::InvalidArgument {
                    reason: format!("volume {id}: its filesystem does not show at {} after mounting it", a.path.display()),
                })?;
                keys::unlock(&id, &root, &key)?;
            }
            crash_point!("stage.mounted");
        }
        if let Backing::Dir { node, devnum, .. } = &b {
            let dir = beneath::make_dir(&a.path, roots).map_err(path_err(&id, "create the staging directory"))?;
            if !shows(Some(&dir), *devnum) {
                beneath::bind_node(node, &dir, beneath::attrs_of(MsFlags::empty(), a.readonly))
                    .map_err(disk(&id, "bind the adopted directory to the staging path"))?;
            }
        }
        if let Some(st) = r2.staging.as_mut() {
            st.done = true;
        }
        r2.state = next_state;
        save(store, &r2)?;
        Ok::<(), VolumeError>(())
    })();
    match res {
        Ok(()) => Ok(r2),
        Err(e) => Err((e, Some(r2))),
    }
}

/// Unstages: unmount the staging path, then forget it.
pub(crate) fn unstage(store: &Store, guards: &Arc<Guards>, drive: Option<&DriveLoc>, roots: &[PathBuf], rec: VolumeRecord, path: &Path) -> Outcome<()> {
    let id = rec.id.clone();
    // A health check's read of the staging directory holds the mount: the unmount waits.
    let _unchecked = guards.step(&id);
    let mut r = rec.clone();
    let res = (|| {
        let ours = match &r.staging {
            Some(st) if st.path == path => true,
            _ => {
                // Not the recorded path: only a mount of this volume there is undone.
                match drive.and_then(|d| blkpg::ensure_kernel_partition(&d.path, r.start, r.size).ok()) {
                    // A path drivelet refuses holds nothing it mounted.
                    Some(kp) if shows(beneath::open(path, roots).ok().flatten().as_ref(), kp.devnum) => true,
                    _ => return Ok(()),
                }
            }
        };
        r.state = next(r.state, Op::Unstage).map_err(|x| VolumeError::refused(&r, x))?;
        if ours && r.encrypted() {
            // The key goes before the mount (whose end drops it too).
            let kp = drive.and_then(|d| blkpg::ensure_kernel_partition(&d.path, r.start, r.size).ok());
            if let Some(root) = kp.and_then(|kp| beneath::open(path, roots).ok().flatten().filter(|n| shows(Some(n), kp.devnum))) {
                if let Err(e) = keys::lock(&id, &root) {
                    warn!(volume.id = %id, error = %e, "cannot remove the volume's key before unmounting; the unmount drops it");
                }
            }
        }
        if ours {
            // Only the volume's own mounts: checked layer by layer on the descriptor that
            // precedes each unmount, never by the path's name again.
            let dev = drive.and_then(|d| blkpg::ensure_kernel_partition(&d.path, r.start, r.size).ok()).map(|kp| kp.devnum);
            beneath::unmount_all(path, roots, dev).map_err(path_err(&id, "unmount the staging path"))?;
        }
        crash_point!("unstage.unmounted");
        if r.staging.as_ref().is_some_and(|s| s.path == path) {
            r.staging = None;
        }
        save(store, &r)
    })();
    match res {
        Ok(()) => Outcome { record: Some(r), result: Ok(()) },
        Err(e) => Outcome { record: Some(rec), result: Err(e) },
    }
}

/// Publishes: intent, target directory (file for block), bind mount, then `Published`.
pub(crate) fn publish(store: &Store, drive: Option<&DriveLoc>, roots: &[PathBuf], rec: VolumeRecord, a: PublishArgs) -> Outcome<()> {
    let id = rec.id.clone();
    let prev = rec.clone();
    let mut r = rec;
    let res = (|| {
        check_path(&id, &a.target, roots)?;
        let st = match &r.staging {
            Some(st) if st.done => st.clone(),
            _ => return Err(VolumeError::PublishBeforeStage { volume_id: id.clone() }),
        };
        if st.path != a.staging {
            return Err(VolumeError::StagedElsewhere { volume_id: id.clone(), staged_at: st.path.clone(), asked: a.staging.clone() });
        }
        if st.block != a.block {
            return Err(VolumeError::StagedForOtherAccess { volume_id: id.clone() });
        }
        let opts = mount::parse_mount_flags(&a.flags)
            .map_err(|reason| VolumeError::InvalidArgument { reason: format!("volume {id}: {reason}") })?;
        // A read-only block target is the partition itself marked read-only in the
        // kernel (a read-only bind of a device node does not stop writes to the
        // device), so read-only and read-write block targets cannot coexist.
        if a.block {
            let other_rw = r.targets.iter().any(|(p, t)| *p != a.target && t.block && !t.readonly);
            let other_ro = r.targets.iter().any(|(p, t)| *p != a.target && t.block && t.readonly);
            if (a.readonly && other_rw) || (!a.readonly && other_ro) {
                return Err(VolumeError::BlockReadOnlyMixed { volume_id: id.clone() });
            }
        }
        let (b, _held) = backing_held(drive, &r)?;
        if let Some(t) = r.targets.get(&a.target) {
            if t.readonly != a.readonly || t.block != a.block {
                return Err(VolumeError::AlreadyExists {
                    volume: id.clone(),
                    reason: format!("is published at {} with a different read-only setting or access type", a.target.display()),
                });
            }
        }
        let others = r.targets.keys().filter(|p| **p != a.target).count();
        if a.single_writer && others > 0 {
            return Err(VolumeError::SingleWriterInUse { volume_id: id.clone() });
        }
        let state = next(r.state, Op::Publish).map_err(|x| VolumeError::refused(&r, x))?;
        let mounted = shows(look(&id, &a.target, roots)?.as_ref(), b.devnum());
        if mounted && r.targets.get(&a.target).is_some_and(|t| t.done) {
            return Ok(());
        }
        r.targets.insert(a.target.clone(), Target { readonly: a.readonly, block: a.block, done: false });
        save(store, &r)?;
        crash_point!("publish.intent_saved");
        if !mounted {
            let attrs = beneath::attrs_of(opts.flags, a.readonly || opts.readonly);
            if let (true, Backing::Partition(kp)) = (a.block, &b) {
                let file = beneath::make_file(&a.target, roots).map_err(path_err(&id, "create the target file"))?;
                let st = file.stat().map_err(disk(&id, "look at the target"))?;
                if !st.file && st.rdev.is_none() {
                    return Err(VolumeError::InvalidArgument {
                        reason: format!("volume {id}: target {} is neither a regular file nor a device node", a.target.display()),
                    });
                }
                if a.readonly {
                    blkpg::set_read_only(&kp.devnode, true).map_err(disk(&id, "mark the partition read-only"))?;
                }
                let dev = beneath::open_source(&kp.devnode).map_err(disk(&id, "open the device"))?;
                beneath::bind(&dev, &kp.devnode, &file, attrs).map_err(disk(&id, "bind the device to the target"))?;
            } else {
                let staged = look(&id, &st.path, roots)?.filter(|n| shows(Some(n), b.devnum()));
                let Some(staged) = staged else {
                    return Err(VolumeError::InvalidArgument {
                        reason: format!("volume {id}: nothing of the volume is mounted at its staging path {}; stage it again", st.path.display()),
                    });
                };
                // An encrypted volume shows its encrypted data directory, never the
                // filesystem's root.
                let source = if r.encrypted() && matches!(b, Backing::Partition(_)) { keys::data_dir(&id, &staged)? } else { staged };
                let dir = beneath::make_dir(&a.target, roots).map_err(path_err(&id, "create the target directory"))?;
                beneath::bind_node(&source, &dir, attrs).map_err(disk(&id, "bind the staging path to the target"))?;
            }
        }
        crash_point!("publish.mounted");
        if let Some(t) = r.targets.get_mut(&a.target) {
            t.done = true;
        }
        r.state = state;
        save(store, &r)
    })();
    match res {
        Ok(()) => Outcome { record: Some(r), result: Ok(()) },
        Err(e) => {
            // Withdraw an intent this call recorded.
            if !prev.targets.contains_key(&a.target) && r.targets.get(&a.target).is_some_and(|t| !t.done) {
                let _ = beneath::unmount_all(&a.target, roots, None);
                if let Err(se) = save(store, &prev) {
                    warn!(volume.id = %id, error = %se, "cannot withdraw a publish intent; a restart does");
                    return Outcome { record: Some(r), result: Err(e) };
                }
            }
            Outcome { record: Some(prev), result: Err(e) }
        }
    }
}

/// Unpublishes: unmount the target, remove it, forget it.
pub(crate) fn unpublish(store: &Store, drive: Option<&DriveLoc>, roots: &[PathBuf], rec: VolumeRecord, target: &Path) -> Outcome<()> {
    let id = rec.id.clone();
    let mut r = rec.clone();
    let res = (|| {
        let recorded = r.targets.get(target).cloned();
        let kp = drive.and_then(|d| blkpg::ensure_kernel_partition(&d.path, r.start, r.size).ok());
        // The volume's own staging path is no target: the mount there is the stage's.
        let staging_path = r.staging.as_ref().is_some_and(|s| s.path == target);
        // A path drivelet refuses holds nothing it mounted, unless it was recorded (then
        // it changed since: refused, never unmounted by name).
        let here = match recorded {
            Some(_) => look(&id, target, roots)?,
            None => beneath::open(target, roots).ok().flatten(),
        };
        let ours_mounted = match (&recorded, &kp) {
            (Some(_), _) => here.as_ref().and_then(|n| n.stat().ok()).is_some_and(|s| s.mount_root),
            (None, _) if staging_path => false,
            (None, Some(kp)) => shows(here.as_ref(), kp.devnum),
            (None, None) => false,
        };
        drop(here);
        if recorded.is_none() && !ours_mounted {
            return Ok(());
        }
        if ours_mounted {
            beneath::unmount_all(target, roots, kp.as_ref().map(|kp| kp.devnum)).map_err(path_err(&id, "unmount the target"))?;
        }
        crash_point!("unpublish.unmounted");
        if let Err(e) = beneath::remove(target, roots) {
            warn!(volume.id = %id, error = %e, "cannot remove the target; kubelet removes it");
        }
        r.targets.remove(target);
        if recorded.as_ref().is_some_and(|t| t.block && t.readonly) && !r.targets.values().any(|t| t.block && t.readonly) {
            if let Some(kp) = &kp {
                blkpg::set_read_only(&kp.devnode, false).map_err(disk(&id, "mark the partition read-write again"))?;
            }
        }
        r.state = next(r.state, Op::Unpublish { remaining: r.targets.len() }).map_err(|x| VolumeError::refused(&r, x))?;
        save(store, &r)
    })();
    match res {
        Ok(()) => Outcome { record: Some(r), result: Ok(()) },
        Err(e) => Outcome { record: Some(rec), result: Err(e) },
    }
}
/// The usage of the filesystem staged or published at `path`, beneath the roots.
pub(crate) fn usage_at(path: &Path, roots: &[PathBuf]) -> Result<fs::Usage, DiskError> {
    match beneath::open(path, roots) {
        Ok(Some(node)) => node.usage(),
        Ok(None) => Err(DiskError::NotFound { device: path.to_path_buf(), what: "the volume's path".into() }),
        Err(PathError::Refused(reason)) => Err(DiskError::invalid(reason)),
        Err(PathError::Disk(e)) => Err(e),
    }
}

/// A directory an AdoptVolume names, looked at: its canonical path, the whole disk its
/// filesystem is on, and its filesystem's size; or why it cannot be adopted. The
/// canonical path is opened once, following no symlink at any component (so it is the
/// directory `canonicalize` named, not what a symlink swapped in since leads to), and
/// everything else is read on that descriptor.
pub(crate) fn probe_adoptable(path: &Path) -> Result<(PathBuf, Option<(u32, u32)>, u64), String> {
    let canonical = std::fs::canonicalize(path).map_err(|e| e.to_string())?;
    if canonical == Path::new("/") {
        return Err("not a directory other than /; block local volumes cannot be adopted".into());
    }
    let node = beneath::open_resolved(&canonical).map_err(|e| e.to_string())?;
    if !node.stat().map_err(|e| e.to_string())?.dir {
        return Err("not a directory other than /; block local volumes cannot be adopted".into());
    }
    let devnum = node.stat().ok().and_then(|s| crate::disk::whole_disk_of_dev(s.dev));
    let size = node.usage().map(|u| u.total_bytes).unwrap_or(0);
    Ok((canonical, devnum, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(number: u32, start: u64, devnum: (u32, u32)) -> blkpg::KernelPartition {
        blkpg::KernelPartition {
            name: format!("loop3p{number}"),
            number,
            start,
            size: 16 << 20,
            devnode: PathBuf::from(format!("/dev/loop3p{number}")),
            devnum,
        }
    }

    #[test]
    fn a_device_number_is_the_volume_only_if_it_is_the_partition_at_the_volumes_start() {
        let parts = [part(1, 1 << 20, (259, 0)), part(2, 17 << 20, (259, 1))];
        // (device number asked about, the volume's start, is it the volume)
        let table = [
            ((259, 0), 1 << 20, true),
            ((259, 1), 17 << 20, true),
            ((259, 1), 1 << 20, false),
            ((7, 3), 1 << 20, false),
            ((259, 0), 33 << 20, false),
        ];
        for (devnum, start, want) in table {
            assert_eq!(is_partition_at(devnum, &parts, start), want, "{devnum:?} at {start}");
        }
        assert!(!is_partition_at((259, 0), &[], 1 << 20), "no kernel partition, no match");
    }

    #[test]
    fn only_block_volumes_are_asked_about_at_device_nodes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let drive = DriveLoc { path: PathBuf::from("/dev/null"), sector: 512 };
        let mut rec = VolumeRecord::for_test(1, crate::actors::volumes::model::VolumeState::Published);
        rec.block = false;
        let roots = vec![dir.path().to_path_buf()];
        assert!(!is_device_of(&dir.path().join("dev/uid"), &roots, &drive, &rec), "a filesystem volume");
        rec.block = true;
        assert!(!is_device_of(Path::new("/dev/null"), &roots, &drive, &rec), "outside the allowed roots");
        std::fs::write(dir.path().join("file"), b"").expect("write");
        assert!(!is_device_of(&dir.path().join("file"), &roots, &drive, &rec), "not a device node");
    }
}
