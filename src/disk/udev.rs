//! Block devices as udev and sysfs see them: a probe of every whole disk (with its
//! partitions), and a monitor thread that reports udev events.
//!
//! Rules:
//! - only reads: nothing here writes to a device;
//! - a probe is a plain snapshot ([`DiskProbe`]) that is `Send` and owns its data,
//!   because libudev handles are neither;
//! - sysfs attributes are read from files each time (libudev caches them);
//! - when udev names no filesystem or other signature on a disk, the disk is judged by
//!   the GPT writer's own rule ([`super::gpt::examine`]: the GPT, either copy, a full
//!   `blkid -p` probe, the MBR), read straight from the disk under a shared disk lock,
//!   so a disk udev never probed is not mistaken for a blank one, a disk the writer
//!   would refuse is never offered to it, and drivelet's own changes are seen before
//!   udev has re-probed them; disks udev already names a signature on are not read,
//!   except the few bytes that say whether a bcache device is a backing or a cache
//!   device.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::gpt::{Contents, GptTable};
use super::lock::DiskLock;
use super::{parse_devnum, signature, sysfs_attr, DiskError};

/// One partition of a disk, from udev's blkid properties.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PartitionProbe {
    /// Kernel name, e.g. `sdb1`.
    pub name: String,
    /// Device node.
    pub devnode: PathBuf,
    /// `major:minor`.
    pub devnum: (u32, u32),
    /// Partition number.
    pub number: u32,
    /// Start on the disk in bytes.
    pub start: u64,
    /// Size in bytes.
    pub size: u64,
    /// GPT partition name (`ID_PART_ENTRY_NAME`).
    pub part_name: String,
    /// Partition GUID (`ID_PART_ENTRY_UUID`), lower case.
    pub part_uuid: String,
    /// Partition type GUID (`ID_PART_ENTRY_TYPE`), lower case.
    pub part_type: String,
    /// Filesystem found on the partition, if any.
    pub fs_type: Option<String>,
    /// Devices stacked on this partition (`holders/`, recursively).
    pub holders: Vec<Holder>,
}

/// A device stacked on a disk or partition (device-mapper, md, bcache).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Holder {
    /// Kernel name, e.g. `dm-0`.
    pub name: String,
    /// `major:minor`.
    pub devnum: (u32, u32),
}

/// A whole disk with what udev and sysfs know about it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DiskProbe {
    /// Kernel name, e.g. `sdb`.
    pub name: String,
    /// Device node, e.g. `/dev/sdb`.
    pub devnode: PathBuf,
    /// `major:minor`.
    pub devnum: (u32, u32),
    /// udev properties (ID_SERIAL, ID_WWN, ID_FS_TYPE, ID_PART_TABLE_TYPE, ...).
    pub props: BTreeMap<String, String>,
    /// Whether udev has processed the device (its database record exists).
    pub udev_initialized: bool,
    /// Symlinks udev made for it (`/dev/disk/by-id/...`).
    pub devlinks: Vec<PathBuf>,
    /// Size in bytes.
    pub size: u64,
    /// Logical block size in bytes.
    pub logical_block_size: u64,
    /// `queue/rotational`.
    pub rotational: bool,
    /// `ro`.
    pub read_only: bool,
    /// `removable`.
    pub removable: bool,
    /// Devices stacked on the whole disk (`holders/`, recursively).
    pub holders: Vec<Holder>,
    /// For loop devices: the backing file, when attached.
    pub loop_backing_file: Option<PathBuf>,
    /// For loop devices: the backing file is a block device node, not a regular file
    /// (kubelet's loop over a block volume's device). False when it is a regular file,
    /// not attached, or cannot be stat-ed.
    pub loop_over_block_device: bool,
    /// The kernel's disk sequence number (`/sys/block/X/diskseq`): a new one whenever
    /// the media changes (a loop device attached again, a disk swapped under the same
    /// name); 0 where the kernel has none.
    pub diskseq: u64,
    /// Partitions, by number.
    pub partitions: Vec<PartitionProbe>,
    /// When udev names no filesystem or other signature on the disk: what the GPT
    /// writer's own rule finds on it ([`super::gpt::examine`]); `Err` with why when the
    /// disk could not be read. `None`: not examined (udev names what the disk holds).
    pub examined: Option<Result<Contents, String>>,
    /// What udev's properties do not say about the signature they name, read from the
    /// disk: whether a bcache device is a backing or a cache device.
    pub signature_detail: Option<String>,
}

impl DiskProbe {
    /// A udev property, if set.
    pub fn prop(&self, key: &str) -> Option<&str> {
        self.props.get(key).map(String::as_str).filter(|v| !v.is_empty())
    }
}

fn os(s: Option<&OsStr>) -> String {
    s.map(|v| v.to_string_lossy().into_owned()).unwrap_or_default()
}

fn read_u64(syspath: &Path, attr: &str) -> u64 {
    sysfs_attr(syspath, attr).and_then(|s| s.parse().ok()).unwrap_or(0)
}

fn list_dir(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(p)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// Holders of a block device, and their holders, from sysfs.
fn holders_of(syspath: &Path) -> Vec<Holder> {
    let mut out = Vec::new();
    let mut todo: Vec<PathBuf> = vec![syspath.join("holders")];
    while let Some(dir) = todo.pop() {
        for name in list_dir(&dir) {
            if out.iter().any(|h: &Holder| h.name == name) || out.len() > 64 {
                continue;
            }
            let sys = Path::new("/sys/class/block").join(&name);
            let devnum = sysfs_attr(&sys, "dev").as_deref().and_then(parse_devnum).unwrap_or((0, 0));
            todo.push(sys.join("holders"));
            out.push(Holder { name, devnum });
        }
    }
    out
}

fn devnum_of(dev: &udev::Device) -> (u32, u32) {
    dev.devnum()
        .map(|d| (nix::sys::stat::major(d) as u32, nix::sys::stat::minor(d) as u32))
        .unwrap_or((0, 0))
}

fn props_of(dev: &udev::Device) -> BTreeMap<String, String> {
    dev.properties()
        .map(|p| (p.name().to_string_lossy().into_owned(), p.value().to_string_lossy().into_owned()))
        .collect()
}

fn partition_of(dev: &udev::Device) -> PartitionProbe {
    let sys = dev.syspath();
    let props = props_of(dev);
    let get = |k: &str| props.get(k).cloned().unwrap_or_default();
    // sysfs `start` and `size` are always in 512-byte sectors.
    PartitionProbe {
        name: os(Some(dev.sysname())),
        devnode: dev.devnode().map(Path::to_path_buf).unwrap_or_default(),
        devnum: devnum_of(dev),
        number: sysfs_attr(sys, "partition").and_then(|s| s.parse().ok()).unwrap_or(0),
        start: read_u64(sys, "start") * 512,
        size: read_u64(sys, "size") * 512,
        part_name: get("ID_PART_ENTRY_NAME"),
        part_uuid: get("ID_PART_ENTRY_UUID").to_ascii_lowercase(),
        part_type: get("ID_PART_ENTRY_TYPE").to_ascii_lowercase(),
        fs_type: props.get("ID_FS_TYPE").filter(|v| !v.is_empty()).cloned(),
        holders: holders_of(sys),
    }
}

fn disk_of(dev: &udev::Device, partitions: Vec<PartitionProbe>) -> DiskProbe {
    let sys = dev.syspath().to_path_buf();
    let props = props_of(dev);
    let devlinks = props
        .get("DEVLINKS")
        .map(|l| l.split_whitespace().map(PathBuf::from).collect())
        .unwrap_or_default();
    let loop_backing_file = sysfs_attr(&sys, "loop/backing_file").filter(|s| !s.is_empty()).map(PathBuf::from);
    let loop_over_block_device = loop_backing_file.as_deref().is_some_and(is_block_device);
    let mut d = DiskProbe {
        name: os(Some(dev.sysname())),
        devnode: dev.devnode().map(Path::to_path_buf).unwrap_or_default(),
        devnum: devnum_of(dev),
        props,
        udev_initialized: dev.is_initialized(),
        devlinks,
        size: read_u64(&sys, "size") * 512,
        logical_block_size: read_u64(&sys, "queue/logical_block_size").max(512),
        rotational: sysfs_attr(&sys, "queue/rotational").as_deref() == Some("1"),
        read_only: sysfs_attr(&sys, "ro").as_deref() == Some("1"),
        removable: sysfs_attr(&sys, "removable").as_deref() == Some("1"),
        holders: holders_of(&sys),
        loop_backing_file,
        loop_over_block_device,
        diskseq: read_u64(&sys, "diskseq"),
        partitions,
        examined: None,
        signature_detail: None,
    };
    d.partitions.sort_by_key(|p| p.number);
    d
}

/// The part of a probe that reads the disk itself (udev's record and sysfs are read by
/// [`disk_of`]): the writer's rule on a disk udev names no signature on, the role of a
/// bcache device.
fn read_disk(d: &mut DiskProbe) {
    if d.size == 0 {
        return;
    }
    match d.prop("ID_FS_TYPE") {
        None => {
            let examined = examine_locked(d);
            if let Ok(Contents::Drivelet(t)) = &examined {
                fill_from_drivelet_gpt(d, t);
            }
            d.examined = Some(examined.map_err(|e| e.to_string()));
        }
        Some("bcache") => {
            d.signature_detail = Some(signature::describe_bcache(signature::bcache_version(&d.devnode).ok()));
        }
        Some(_) => {}
    }
}

/// Disks read at once by a full scan: reading a disk mostly waits (for `blkid`, for the
/// device), so a node with many drives is scanned in a fraction of the time one
/// after the other would take.
const READERS: usize = 8;

/// [`read_disk`] on every probe, on up to [`READERS`] threads.
fn read_disks(probes: &mut [DiskProbe]) {
    let per = probes.len().div_ceil(READERS).max(1);
    std::thread::scope(|s| {
        for chunk in probes.chunks_mut(per) {
            s.spawn(move || chunk.iter_mut().for_each(read_disk));
        }
    });
}

/// [`super::gpt::examine`] under a shared disk lock, so a table drivelet (or another
/// tool that follows the locking protocol) is writing is read whole, before or after.
/// The kernel's partitions are listed again under the same lock: drivelet changes the
/// table and the kernel's partitions under one exclusive hold, so both are read from
/// the same side of it. (A list read before the lock against a table read after it
/// showed a volume partition DeleteVolume had just removed as someone else's, and
/// placement counted its space as taken until the next probe.)
fn examine_locked(d: &mut DiskProbe) -> Result<Contents, DiskError> {
    let _shared = DiskLock::shared(&d.devnode)?;
    match partitions_named(&d.name) {
        Ok(Some(parts)) => {
            d.partitions = parts;
            d.partitions.sort_by_key(|p| p.number);
        }
        // Gone meanwhile, or unreadable: the examination below says so.
        Ok(None) | Err(_) => {}
    }
    super::gpt::examine(&d.devnode, d.logical_block_size)
}

/// The kernel partitions of the whole disk `name`, as udev and sysfs list them now;
/// `Ok(None)` when the disk no longer exists.
fn partitions_named(name: &str) -> Result<Option<Vec<PartitionProbe>>, DiskError> {
    match udev::Device::from_subsystem_sysname("block".into(), name.into()) {
        Ok(dev) if is_disk(&dev) => partitions_of(&dev).map(Some),
        _ => Ok(None),
    }
}

/// The kernel partitions of the whole disk `dev`.
fn partitions_of(dev: &udev::Device) -> Result<Vec<PartitionProbe>, DiskError> {
    let mut e = udev::Enumerator::new().map_err(DiskError::udev("create enumerator"))?;
    e.match_parent(dev).map_err(DiskError::udev("match parent"))?;
    e.match_subsystem("block").map_err(DiskError::udev("match block subsystem"))?;
    Ok(e.scan_devices().map_err(DiskError::udev("scan partitions"))?.filter(is_partition).map(|p| partition_of(&p)).collect())
}

/// udev's view of a disk lags behind drivelet's own partition-table changes by the time
/// udev takes to re-probe. The drivelet GPT read straight from the disk fills in what
/// udev has not caught up with yet: the table type and id, and the type, GUID and name
/// of each kernel partition. A kernel partition matches the GPT entry that starts where
/// it starts and is at least as long: while a volume grows, the GPT entry is written
/// before the kernel is told.
fn fill_from_drivelet_gpt(d: &mut DiskProbe, t: &GptTable) {
    d.props.insert("ID_PART_TABLE_TYPE".into(), "gpt".into());
    d.props.insert("ID_PART_TABLE_UUID".into(), t.disk_guid.to_string());
    for part in d.partitions.iter_mut() {
        if let Some(q) = t.partitions.iter().find(|q| q.start == part.start && q.size >= part.size) {
            part.part_type = q.type_guid.to_string();
            part.part_uuid = q.guid.to_string();
            part.part_name = q.name.clone();
        }
    }
}

/// Whether `path` is a block device node (following symlinks); false when it cannot be
/// stat-ed.
fn is_block_device(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
}

fn is_partition(dev: &udev::Device) -> bool {
    dev.devtype().map(|t| t == "partition").unwrap_or(false)
}

fn is_disk(dev: &udev::Device) -> bool {
    dev.devtype().map(|t| t == "disk").unwrap_or(false)
}

/// Probes every whole disk on the host, with partitions.
pub fn probe_all() -> Result<Vec<DiskProbe>, DiskError> {
    let mut e = udev::Enumerator::new().map_err(DiskError::udev("create enumerator"))?;
    e.match_subsystem("block").map_err(DiskError::udev("match block subsystem"))?;
    let devices: Vec<udev::Device> = e.scan_devices().map_err(DiskError::udev("scan block devices"))?.collect();
    let mut parts: BTreeMap<String, Vec<PartitionProbe>> = BTreeMap::new();
    for d in devices.iter().filter(|d| is_partition(d)) {
        if let Some(parent) = d.parent() {
            parts.entry(os(Some(parent.sysname()))).or_default().push(partition_of(d));
        }
    }
    let mut probes: Vec<DiskProbe> = devices
        .iter()
        .filter(|d| is_disk(d))
        .map(|d| {
            let name = os(Some(d.sysname()));
            disk_of(d, parts.remove(&name).unwrap_or_default())
        })
        .collect();
    read_disks(&mut probes);
    Ok(probes)
}

/// Probes one whole disk by kernel name; `Ok(None)` when it no longer exists.
pub fn probe_disk(name: &str) -> Result<Option<DiskProbe>, DiskError> {
    let dev = match udev::Device::from_subsystem_sysname("block".into(), name.into()) {
        Ok(d) => d,
        Err(_) => return Ok(None),
    };
    if !is_disk(&dev) {
        return Ok(None);
    }
    let mut d = disk_of(&dev, partitions_of(&dev)?);
    read_disk(&mut d);
    Ok(Some(d))
}

/// A udev event on a block device, reduced to the whole disk it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockEvent {
    /// `add`, `change`, `remove`, ...
    pub action: String,
    /// Kernel name of the whole disk (the parent, for a partition event).
    pub disk: String,
    /// Whether the event was about a partition.
    pub partition: bool,
}

/// Starts a thread that follows udev block events and hands each to `on_event` until
/// `stop` is set. `on_failure` is called once if the monitor breaks.
pub fn spawn_monitor(
    on_event: impl Fn(BlockEvent) + Send + 'static,
    on_failure: impl FnOnce(String) + Send + 'static,
    stop: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<()>, DiskError> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), DiskError>>();
    let handle = std::thread::Builder::new()
        .name("udev-monitor".into())
        .spawn(move || {
            let socket = match udev::MonitorBuilder::new()
                .and_then(|b| b.match_subsystem("block"))
                .and_then(|b| b.listen())
            {
                Ok(s) => {
                    let _ = ready_tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(DiskError::Udev { what: "listen for udev events".into(), source: e }));
                    return;
                }
            };
            let fd = socket.as_raw_fd();
            while !stop.load(Ordering::Relaxed) {
                let mut pfd = [libc::pollfd { fd, events: libc::POLLIN, revents: 0 }];
                // SAFETY: pfd is a valid array of one pollfd for the duration of the call.
                let n = unsafe { libc::poll(pfd.as_mut_ptr(), 1, 500) };
                if n < 0 {
                    let err = std::io::Error::last_os_error();
                    if err.kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    on_failure(format!("poll on udev monitor failed: {err}"));
                    return;
                }
                if n == 0 {
                    continue;
                }
                if pfd[0].revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
                    on_failure("udev monitor socket closed".into());
                    return;
                }
                for ev in socket.iter() {
                    let dev = ev.device();
                    let partition = is_partition(&dev);
                    let disk = if partition {
                        match dev.parent() {
                            Some(p) => os(Some(p.sysname())),
                            None => {
                                // A removed partition has no parent left in sysfs; its
                                // name minus the trailing partition number is the disk.
                                strip_partition_suffix(&os(Some(dev.sysname())))
                            }
                        }
                    } else if is_disk(&dev) {
                        os(Some(dev.sysname()))
                    } else {
                        continue;
                    };
                    on_event(BlockEvent { action: os(ev.action()), disk, partition });
                }
            }
        })
        .map_err(|e| DiskError::Io { what: "start udev monitor thread".into(), source: e })?;
    match ready_rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Ok(())) => Ok(handle),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(DiskError::Io {
            what: "start udev monitor".into(),
            source: std::io::Error::new(std::io::ErrorKind::TimedOut, "monitor thread did not start"),
        }),
    }
}

/// `sdb1` -> `sdb`, `nvme0n1p2` -> `nvme0n1`, `loop3p1` -> `loop3`.
pub fn strip_partition_suffix(name: &str) -> String {
    let base = name.trim_end_matches(|c: char| c.is_ascii_digit());
    match base.strip_suffix('p') {
        Some(b) if b.ends_with(|c: char| c.is_ascii_digit()) => b.to_string(),
        _ => base.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_names_map_to_their_disk() {
        assert_eq!(strip_partition_suffix("sdb1"), "sdb");
        assert_eq!(strip_partition_suffix("sdab12"), "sdab");
        assert_eq!(strip_partition_suffix("nvme0n1p2"), "nvme0n1");
        assert_eq!(strip_partition_suffix("loop3p1"), "loop3");
        assert_eq!(strip_partition_suffix("mmcblk0p1"), "mmcblk0");
    }

    #[test]
    fn files_missing_paths_and_character_devices_are_not_block_devices() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("drive.img");
        std::fs::write(&file, b"").expect("write");
        assert!(!is_block_device(&file), "a regular file");
        assert!(!is_block_device(&dir.path().join("gone")), "a path that cannot be stat-ed");
        assert!(!is_block_device(Path::new("/dev/null")), "a character device");
        // A real block device counts: tests/integration/disks/inventory.rs (a loop device over a block
        // device is not a drive) proves it on a loop device; this tier has none.
    }
}
