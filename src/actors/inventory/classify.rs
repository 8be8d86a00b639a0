//! The eligibility policy: which block devices are drives, and which drives drivelet
//! may manage. Pure functions over a [`DiskProbe`] and the host's mounts.
//!
//! A whole disk is a **drive** unless it is a partition, a RAM/zram disk, a
//! device-mapper/md/bcache device, an optical or floppy drive, a network block device,
//! a zero-size device (no medium), or a loop device (unless `drives.allow_loop`, and
//! then only while attached to a regular file). A loop device whose backing file is a
//! block device node (kubelet attaches one to the device of every block volume a pod
//! uses) is only another name for that device, never a drive, whatever
//! `drives.allow_loop` says. Each drive gets exactly one class, checked in this order:
//!
//! 1. `system`: the disk, one of its non-drivelet partitions, or a device stacked on it
//!    backs a mounted filesystem or swap. The reason names the filesystem as the host
//!    knows it: by where it is mounted whole, or, seen from a pod only through hostPath
//!    binds at their own path, as the host's `/`; never by the pod's own file binds.
//! 2. `excluded`: a `[drives.filters]` entry rules it out; the entry is named.
//! 3. `foreign`: udev has not probed it, it is read-only, something is stacked on it,
//!    udev names a signature on it (a filesystem, swap, RAID or volume-manager member,
//!    encrypted volume, cache device...), or the GPT writer's own rule
//!    ([`gpt::examine`], run by the probe on every disk udev names no signature on)
//!    finds anything it would refuse: a partition table drivelet did not write (even
//!    only the backup copy of a GPT at the end of the disk), a GPT drivelet cannot
//!    parse, a signature a full `blkid -p` probe finds at either end. So a disk called
//!    managed is never refused by the writer. The reason names the kind of data in
//!    plain words ("holds an LVM physical volume"), and a partition table with the
//!    partitions the table itself lists, not the kernel's list (this kernel may not
//!    read partition tables at all). A disk that could not be read is foreign too.
//! 4. `owned-elsewhere`: a drivelet GPT whose note ([`crate::disk::note`]) names
//!    another node or another cluster as its owner, or cannot be read, or a drivelet
//!    GPT with no note holding volumes this node's store does not know (a disk of a
//!    drivelet from before notes, or one made to look like drivelet's): the reason says
//!    whose it is and what it holds. [`note::verdict`] is the rule, and the GPT writer
//!    applies it too, but without the store: it refuses a note naming another owner and
//!    a note that cannot be read, and lets a disk with no note through (it cannot tell
//!    this node's older disks, which must keep working and gain a note, from others').
//!    So a drivelet GPT with partitions and no note that this node does not know is kept
//!    from every write by this class alone: placement, the cleaner and the note keeper
//!    take managed drives only, no volume record of this node points at it, and only an
//!    admin's adoption (or an automatic one, never of a disk with no note) writes to it.
//! 5. `managed`: blank, or carrying a drivelet GPT of this node, by that same rule.
//!    Only these are ever written to.

use std::collections::BTreeSet;
use std::path::Path;

use crate::config::DriveFilters;
use crate::disk::note;
use crate::words::{DriveOwner, Owner};
use crate::disk::gpt::{self, Contents};
use crate::disk::mounts::{HostUsage, Mounted};
use crate::disk::signature;
use crate::disk::udev::DiskProbe;
use crate::words::{DriveClass, Media};

const NOT_DRIVES: &[&str] = &["ram", "zram", "dm-", "md", "sr", "fd", "nbd", "rbd", "drbd", "bcache", "mtdblock", "pmem"];

/// Whether a whole disk is a drive at all.
pub fn is_drive(p: &DiskProbe, allow_loop: bool) -> bool {
    if p.name.starts_with("loop") {
        return allow_loop && p.loop_backing_file.is_some() && !p.loop_over_block_device && p.size > 0;
    }
    if NOT_DRIVES.iter().any(|prefix| p.name.starts_with(prefix)) {
        return false;
    }
    if p.prop("ID_CDROM") == Some("1") {
        return false;
    }
    p.size > 0
}

/// The media class: NVMe by transport, virtual for loop/virtio/Xen, else by rotation.
pub fn media_of(p: &DiskProbe) -> Media {
    let n = p.name.as_str();
    if n.starts_with("nvme") {
        Media::Nvme
    } else if n.starts_with("loop") || n.starts_with("vd") || n.starts_with("xvd") {
        Media::Virtual
    } else if p.rotational {
        Media::Hdd
    } else {
        Media::Ssd
    }
}

/// The transport (bus) a drive hangs off, for display.
pub fn transport_of(p: &DiskProbe) -> String {
    let n = p.name.as_str();
    if n.starts_with("nvme") {
        return "nvme".into();
    }
    if n.starts_with("loop") {
        return "loop".into();
    }
    if n.starts_with("vd") {
        return "virtio".into();
    }
    if p.prop("ID_PATH").map(|s| s.contains("-sas-")).unwrap_or(false) {
        return "sas".into();
    }
    match p.prop("ID_BUS") {
        Some("ata") => "sata".into(),
        Some(b) => b.to_string(),
        None => "unknown".into(),
    }
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' })
        .collect()
}

fn fnv1a(s: &[u8]) -> u32 {
    s.iter().fold(0x811c9dc5u32, |h, b| (h ^ *b as u32).wrapping_mul(0x01000193))
}

/// A stable drive id that survives reboots and renaming of kernel names: from the
/// WWN, else the serial, else (loop devices) the backing file, else the udev path.
pub fn stable_id(p: &DiskProbe) -> String {
    if let Some(w) = p.prop("ID_WWN_WITH_EXTENSION").or_else(|| p.prop("ID_WWN")) {
        return sanitize(&format!("wwn-{w}"));
    }
    if let Some(s) = p.prop("ID_SERIAL") {
        let bus = if p.name.starts_with("nvme") { "nvme" } else { p.prop("ID_BUS").unwrap_or("disk") };
        return sanitize(&format!("{bus}-{s}"));
    }
    if let Some(f) = &p.loop_backing_file {
        let base = f.file_name().map(|b| b.to_string_lossy().into_owned()).unwrap_or_default();
        return sanitize(&format!("loop-{base}-{:08x}", fnv1a(f.as_os_str().as_encoded_bytes())));
    }
    if let Some(path) = p.prop("ID_PATH") {
        return sanitize(&format!("path-{path}"));
    }
    sanitize(&format!("name-{}", p.name))
}

/// The names a path filter is matched against: the node, its udev links, and for a
/// loop device its backing file.
fn filter_names(p: &DiskProbe) -> Vec<&Path> {
    let mut v: Vec<&Path> = vec![p.devnode.as_path()];
    v.extend(p.devlinks.iter().map(|l| l.as_path()));
    if let Some(f) = &p.loop_backing_file {
        v.push(f.as_path());
    }
    v
}

fn glob_matches(g: &str, name: &str) -> bool {
    glob::Pattern::new(g).map(|p| p.matches(name)).unwrap_or(false)
}

fn fmt_mounts(mps: &std::collections::BTreeSet<std::path::PathBuf>) -> String {
    mps.iter().map(|m| m.display().to_string()).collect::<Vec<_>>().join(", ")
}

/// The filesystem a device backs, as an admin of the host knows it: where it is mounted
/// whole; else, when only directories bound at their own path show it (drivelet in a
/// pod with hostPath mounts), the host's `/`; else that only parts of it are bound here.
/// Binds of parts (a pod's `/etc/hosts`) are never listed: they say where the
/// filesystem is used, not where it is.
fn filesystem_of(m: &Mounted) -> String {
    if !m.whole.is_empty() {
        format!("the mounted filesystem at {}", fmt_mounts(&m.whole))
    } else if !m.same_path.is_empty() {
        format!("the host's / (seen here through {})", fmt_mounts(&m.same_path))
    } else {
        let n = m.parts.len();
        format!("a filesystem of which only parts are bind-mounted here ({n} bind mount{})", if n == 1 { "" } else { "s" })
    }
}

fn system_reason(p: &DiskProbe, usage: &HostUsage) -> Option<String> {
    if let Some(m) = usage.mounted.get(&p.devnum) {
        return Some(format!("backs {}", filesystem_of(m)));
    }
    if usage.swap.contains(&p.devnum) {
        return Some("is in use as swap".into());
    }
    for part in &p.partitions {
        if part.part_type == gpt::PARTITION_TYPE {
            continue;
        }
        if let Some(m) = usage.mounted.get(&part.devnum) {
            return Some(format!("partition {} backs {}", part.name, filesystem_of(m)));
        }
        if usage.swap.contains(&part.devnum) {
            return Some(format!("partition {} is in use as swap", part.name));
        }
    }
    let holders = p.holders.iter().chain(p.partitions.iter().flat_map(|q| q.holders.iter()));
    for h in holders {
        if let Some(m) = usage.mounted.get(&h.devnum) {
            return Some(format!("{} (stacked on this disk) backs {}", h.name, filesystem_of(m)));
        }
        if usage.swap.contains(&h.devnum) {
            return Some(format!("{} (stacked on this disk) is in use as swap", h.name));
        }
    }
    None
}

fn excluded_reason(p: &DiskProbe, f: &DriveFilters, media: Media) -> Option<String> {
    let names = filter_names(p);
    if !f.include_paths.is_empty() {
        let hit = f.include_paths.iter().any(|g| names.iter().any(|n| glob_matches(g, &n.to_string_lossy())));
        if !hit {
            return Some(format!(
                "matches no drives.filters.include_paths entry ({})",
                f.include_paths.join(", ")
            ));
        }
    }
    for g in &f.exclude_paths {
        if let Some(n) = names.iter().find(|n| glob_matches(g, &n.to_string_lossy())) {
            return Some(format!("drives.filters.exclude_paths entry \"{g}\" matches {}", n.display()));
        }
    }
    if let Some(serial) = p.prop("ID_SERIAL_SHORT").or_else(|| p.prop("ID_SERIAL")) {
        if f.exclude_serials.iter().any(|s| s == serial) {
            return Some(format!("drives.filters.exclude_serials lists serial \"{serial}\""));
        }
    }
    if let Some(model) = p.prop("ID_MODEL") {
        if let Some(g) = f.exclude_models.iter().find(|g| glob_matches(g, model)) {
            return Some(format!("drives.filters.exclude_models entry \"{g}\" matches model \"{model}\""));
        }
    }
    if f.min_size > 0 && p.size < f.min_size {
        return Some(format!("size {} is below drives.filters.min_size {}", p.size, f.min_size));
    }
    if !f.media.is_empty() && !f.media.contains(&media) {
        let allowed: Vec<&str> = f.media.iter().map(|m| m.as_str()).collect();
        return Some(format!("media {} is not in drives.filters.media [{}]", media.as_str(), allowed.join(", ")));
    }
    None
}

fn foreign_reason(p: &DiskProbe) -> Option<String> {
    if !p.udev_initialized {
        return Some("udev has not probed this disk yet (run `udevadm trigger`); drivelet does not judge a disk udev has not seen".into());
    }
    if p.read_only {
        return Some("the disk is read-only".into());
    }
    let holders: Vec<&str> = p
        .holders
        .iter()
        .chain(p.partitions.iter().flat_map(|q| q.holders.iter()))
        .map(|h| h.name.as_str())
        .collect();
    if !holders.is_empty() {
        return Some(format!("in use by {} (device-mapper, RAID or cache member)", holders.join(", ")));
    }
    if let Some(fs) = p.prop("ID_FS_TYPE") {
        let what = p
            .signature_detail
            .clone()
            .unwrap_or_else(|| signature::describe(fs, p.prop("ID_FS_USAGE"), p.prop("ID_FS_VERSION")));
        return Some(holds(&what));
    }
    match &p.examined {
        None => Some("drivelet has not read the disk to check what it holds".into()),
        Some(Err(e)) => Some(format!("drivelet cannot read the disk to check what it holds: {e}")),
        Some(Ok(Contents::Foreign(what))) => Some(holds(what)),
        Some(Ok(Contents::Drivelet(_))) => None,
        Some(Ok(Contents::Blank)) => {
            if !p.partitions.is_empty() {
                let n = signature::count(p.partitions.len(), "partition");
                return Some(format!("the kernel lists {n} on it, but the disk holds no partition table"));
            }
            p.prop("ID_PART_TABLE_TYPE").map(|t| {
                format!(
                    "udev last saw {} on it, which is no longer there; waiting for udev to probe it again (udevadm trigger)",
                    signature::describe_table(t, None)
                )
            })
        }
    }
}

/// The reason of a foreign disk holding `what` (in words): also the reason of a drive
/// the GPT writer refused, with the writer's words.
pub fn holds(what: &str) -> String {
    format!("holds {what}; wipe it (wipefs -a) only if its data is unwanted")
}

fn managed_reason(p: &DiskProbe) -> String {
    let Some(Ok(Contents::Drivelet(t))) = &p.examined else {
        return "blank disk (no partition table or filesystem signature)".into();
    };
    let ours = t.partitions.iter().filter(|q| q.is_drivelet()).count();
    let others = t.partitions.len() - ours;
    let snapshots = t.partitions.iter().filter(|q| q.is_drivelet() && q.is_snapshot()).count();
    let volumes = match snapshots {
        0 => signature::count(ours, "volume partition"),
        n => format!("{} and {}", signature::count(ours - n, "volume partition"), signature::count(n, "snapshot partition")),
    };
    match others {
        0 => format!("drivelet GPT with {volumes}"),
        1 => format!("drivelet GPT with {volumes}; 1 other partition is left alone"),
        n => format!("drivelet GPT with {volumes}; {n} other partitions are left alone"),
    }
}

/// Who this node is, and the drives its store knows (its own disks from before disks
/// carried a note).
#[derive(Debug, Clone, Default)]
pub struct Ownership {
    /// This node of this cluster; `None` only in tests of other rules (every drivelet
    /// disk is then this node's).
    pub me: Option<Owner>,
    /// Stable ids of the drives this node's store has records of.
    pub known: BTreeSet<String>,
}

/// Whose a drive with a drivelet GPT is ([`note::verdict`]); `DriveOwner::Unknown` for
/// any other disk.
pub fn owner_of(p: &DiskProbe, own: &Ownership) -> DriveOwner {
    let Some(Ok(Contents::Drivelet(t))) = &p.examined else { return DriveOwner::Unknown };
    let Some(me) = &own.me else { return DriveOwner::Ours };
    let volumes = t.partitions.iter().filter(|q| q.is_drivelet()).count();
    match note::verdict(&t.note, me, volumes, own.known.contains(&stable_id(p))) {
        // A disk with no note this node may take is its own from its next write on.
        note::Verdict::Ours | note::Verdict::Claim => DriveOwner::Ours,
        note::Verdict::Elsewhere(o) => o,
    }
}

/// The reason of a drive owned elsewhere: whose it is, what it holds, what to do.
fn elsewhere_reason(o: &DriveOwner, me: &Owner, p: &DiskProbe) -> String {
    let held = match o {
        DriveOwner::Elsewhere { volumes, .. } if !volumes.is_empty() => {
            let shown: Vec<String> = volumes
                .iter()
                .take(5)
                .map(|v| match &v.claim {
                    Some(c) => format!("claim {c} ({})", crate::config::human_bytes(v.size_bytes)),
                    None => format!("volume {} ({})", v.id, crate::config::human_bytes(v.size_bytes)),
                })
                .collect();
            let more = volumes.len().saturating_sub(shown.len());
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            format!("; holds {}: {}{more}", signature::count(volumes.len(), "volume"), shown.join(", "))
        }
        DriveOwner::Elsewhere { .. } => "; holds no volume".into(),
        _ => {
            let n = match &p.examined {
                Some(Ok(Contents::Drivelet(t))) => t.partitions.iter().filter(|q| q.is_drivelet()).count(),
                _ => 0,
            };
            format!("; holds {}", signature::count(n, "drivelet partition"))
        }
    };
    format!("{}{held}; nothing is written to it until an admin adopts it (drivelet ctl drive adopt, or kubectl drivelet drive adopt)", note::whose(o, me))
}

/// Classifies a drive; `None` when the device is not a drive at all.
pub fn classify(
    p: &DiskProbe,
    usage: &HostUsage,
    filters: &DriveFilters,
    allow_loop: bool,
    own: &Ownership,
) -> Option<(DriveClass, String)> {
    if !is_drive(p, allow_loop) {
        return None;
    }
    if let Some(r) = system_reason(p, usage) {
        return Some((DriveClass::System, r));
    }
    if let Some(r) = excluded_reason(p, filters, media_of(p)) {
        return Some((DriveClass::Excluded, r));
    }
    if let Some(r) = foreign_reason(p) {
        return Some((DriveClass::Foreign, r));
    }
    if let Some(me) = &own.me {
        let o = owner_of(p, own);
        if matches!(o, DriveOwner::Elsewhere { .. } | DriveOwner::Unreadable { .. } | DriveOwner::NoNote) {
            return Some((DriveClass::OwnedElsewhere, elsewhere_reason(&o, me, p)));
        }
    }
    Some((DriveClass::Managed, managed_reason(p)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::mounts::{parse_mountinfo, MountEntry, MountKind};
    use crate::disk::udev::{Holder, PartitionProbe};
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    /// Loads a udev property dump (`udevadm info --query=property` output) as a probe.
    fn fixture(name: &str) -> DiskProbe {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/udev").join(name);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let props: BTreeMap<String, String> = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let devname = props.get("DEVNAME").cloned().unwrap_or_default();
        DiskProbe {
            name: devname.trim_start_matches("/dev/").to_string(),
            devnode: PathBuf::from(&devname),
            devnum: (
                props.get("MAJOR").and_then(|m| m.parse().ok()).unwrap_or(8),
                props.get("MINOR").and_then(|m| m.parse().ok()).unwrap_or(16),
            ),
            devlinks: props
                .get("DEVLINKS")
                .map(|l| l.split_whitespace().map(PathBuf::from).collect())
                .unwrap_or_default(),
            props,
            udev_initialized: true,
            size: 1 << 40,
            logical_block_size: 512,
            rotational: true,
            examined: Some(Ok(Contents::Blank)),
            ..Default::default()
        }
    }

    /// What `gpt::examine` reads from a drivelet GPT with one volume partition.
    fn drivelet_gpt() -> Contents {
        Contents::Drivelet(gpt::GptTable {
            disk_guid: gpt::new_disk_guid(),
            partitions: vec![gpt::GptPartition {
                guid: gpt::volume_partition_guid("pvc-1"),
                type_guid: gpt::PARTITION_TYPE_GUID,
                name: gpt::partition_label("pvc-1"),
                start: 1 << 20,
                size: 1 << 30,
                attrs: 0,
            }],
            note: crate::disk::note::NoteState::Absent,
            entries: gpt::TABLE_ENTRIES,
            cannot_grow: None,
        })
    }

    /// A drivelet GPT with one volume partition and the note `note`.
    fn drivelet_gpt_noted(note: crate::disk::note::NoteState) -> Contents {
        match drivelet_gpt() {
            Contents::Drivelet(t) => Contents::Drivelet(gpt::GptTable { note, ..t }),
            other => other,
        }
    }

    fn owned_by(cluster: &str, node: &str) -> crate::disk::note::NoteState {
        crate::disk::note::NoteState::Note(crate::disk::note::DiskNote {
            owner: Owner { cluster: cluster.into(), node: node.into() },
            adopted_from: None,
            volumes: vec![crate::disk::note::VolumeNote {
                id: gpt::volume_partition_guid("pvc-1"),
                name: "pvc-1".into(),
                size: 1 << 30,
                block: false,
                fs_type: "ext4".into(),
                created_unix: 0,
                parameters: Default::default(),
                snapshot: false,
                binding: crate::words::Binding { pv: "pvc-1".into(), claim_namespace: "db".into(), claim_name: "data-0".into(), ..Default::default() },
            }],
        })
    }

    /// Whose a drivelet disk is decides its class: this node's is managed; another
    /// node's, another cluster's, one whose note cannot be read and one with volumes and
    /// no note that this node does not know are owned elsewhere, with whose and what.
    #[test]
    fn whose_a_drivelet_disk_is_decides_managed_or_owned_elsewhere() {
        use crate::disk::note::NoteState;
        let me = Owner { cluster: "c1".into(), node: "node-1".into() };
        let p = fixture("sata-hdd-blank.env");
        let id = stable_id(&p);
        let cases: Vec<(&str, NoteState, bool, DriveClass, &str)> = vec![
            ("this node's", owned_by("c1", "node-1"), false, DriveClass::Managed, "drivelet GPT with 1 volume partition"),
            ("another node's", owned_by("c1", "node-2"), false, DriveClass::OwnedElsewhere, "belongs to node node-2 of this cluster; holds 1 volume: claim db/data-0 (1.0 GiB)"),
            ("another cluster's", owned_by("c2", "node-1"), true, DriveClass::OwnedElsewhere, "belongs to node node-1 of another cluster (c2)"),
            ("a torn note", NoteState::Unreadable("a note whose checksum does not match (torn or corrupt)".into()), true, DriveClass::OwnedElsewhere, "cannot be read: a note whose checksum does not match"),
            ("no note, known to this node", NoteState::Absent, true, DriveClass::Managed, "drivelet GPT"),
            ("no note, unknown volumes", NoteState::Absent, false, DriveClass::OwnedElsewhere, "no note of whose they are"),
        ];
        for (what, note, known, want, words) in cases {
            let mut p = p.clone();
            p.examined = Some(Ok(drivelet_gpt_noted(note)));
            let own = Ownership { me: Some(me.clone()), known: if known { [id.clone()].into() } else { Default::default() } };
            let (c, r) = classify(&p, &HostUsage::default(), &DriveFilters::default(), true, &own).expect("a drive");
            assert_eq!(c, want, "{what}: {r}");
            assert!(r.contains(words), "{what}: {r}");
            if c == DriveClass::OwnedElsewhere {
                assert!(r.contains("nothing is written to it until an admin adopts it"), "{what}: {r}");
            }
        }
        // A name on the disk is data: shown as it is, never followed.
        let mut p = p.clone();
        p.examined = Some(Ok(drivelet_gpt_noted(owned_by("c1", "../../../../etc/passwd"))));
        let own = Ownership { me: Some(me), known: Default::default() };
        let (c, r) = classify(&p, &HostUsage::default(), &DriveFilters::default(), true, &own).expect("a drive");
        assert_eq!(c, DriveClass::OwnedElsewhere);
        assert!(r.contains("node ../../../../etc/passwd of this cluster"), "{r}");
    }

    fn blank_loop() -> DiskProbe {
        let mut p = fixture("loop-blank.env");
        p.loop_backing_file = Some(PathBuf::from("/var/lib/drivelet/demo/drive-0.img"));
        p
    }

    fn mounted(devnum: (u32, u32), at: &str) -> HostUsage {
        let mut u = HostUsage::default();
        u.mounted.insert(devnum, Mounted::whole_at(at));
        u
    }

    fn class(p: &DiskProbe, u: &HostUsage, f: &DriveFilters) -> (DriveClass, String) {
        classify(p, u, f, true, &Ownership::default()).expect("is a drive")
    }

    #[test]
    fn blank_sata_disk_is_managed() {
        let (c, r) = class(&fixture("sata-hdd-blank.env"), &HostUsage::default(), &DriveFilters::default());
        assert_eq!(c, DriveClass::Managed);
        assert!(r.contains("blank"), "{r}");
    }

    #[test]
    fn disk_with_ext4_is_foreign_and_says_so() {
        let (c, r) = class(&fixture("sata-ssd-ext4.env"), &HostUsage::default(), &DriveFilters::default());
        assert_eq!(c, DriveClass::Foreign);
        assert!(r.contains("holds an ext4 filesystem;"), "{r}");
    }

    #[test]
    fn disk_with_dos_table_is_foreign() {
        let mut p = fixture("sata-hdd-blank.env");
        p.props.insert("ID_PART_TABLE_TYPE".into(), "dos".into());
        p.examined = Some(Ok(Contents::Foreign("an MBR (DOS) partition table with 2 partitions".into())));
        let (c, r) = class(&p, &HostUsage::default(), &DriveFilters::default());
        assert_eq!(c, DriveClass::Foreign);
        assert!(r.contains("MBR (DOS) partition table with 2 partitions"), "{r}");
        // udev saw a table the disk no longer holds: foreign until udev looks again.
        p.examined = Some(Ok(Contents::Blank));
        let (c, r) = class(&p, &HostUsage::default(), &DriveFilters::default());
        assert_eq!(c, DriveClass::Foreign);
        assert!(r.contains("no longer there"), "{r}");
    }

    #[test]
    fn foreign_gpt_is_foreign_but_drivelet_gpt_is_managed() {
        let mut p = fixture("nvme-gpt.env");
        p.examined = Some(Ok(Contents::Foreign("a GPT partition table with 3 partitions not made by drivelet".into())));
        let (c, r) = class(&p, &HostUsage::default(), &DriveFilters::default());
        assert_eq!(c, DriveClass::Foreign);
        assert!(r.contains("3 partitions not made by drivelet"), "{r}");
        p.examined = Some(Ok(drivelet_gpt()));
        p.partitions.push(PartitionProbe {
            name: "nvme0n1p1".into(),
            part_type: gpt::PARTITION_TYPE.into(),
            ..Default::default()
        });
        let (c, r) = class(&p, &HostUsage::default(), &DriveFilters::default());
        assert_eq!(c, DriveClass::Managed);
        assert!(r.contains("1 volume partition"), "{r}");
    }

    /// Whatever the GPT writer would refuse is foreign, with the writer's words; a
    /// signature udev names is put in plain words.
    #[test]
    fn what_the_writer_refuses_is_foreign_with_its_words_and_signatures_read_plainly() {
        let mut p = fixture("sata-hdd-blank.env");
        let backup = "a backup GPT at the end of the disk (its primary copy at the start is gone) with 2 partitions not made by drivelet (disk GUID 0badc0de-1234-4234-8234-123456789abc)";
        p.examined = Some(Ok(Contents::Foreign(backup.into())));
        let (c, r) = class(&p, &HostUsage::default(), &DriveFilters::default());
        assert_eq!((c, r), (DriveClass::Foreign, format!("holds {backup}; wipe it (wipefs -a) only if its data is unwanted")));

        let cases = [
            ("LVM2_member", "raid", "LVM2 001", None, "holds an LVM physical volume;"),
            ("linux_raid_member", "raid", "1.2", None, "holds a Linux RAID member (md superblock 1.2);"),
            ("crypto_LUKS", "crypto", "2", None, "holds a LUKS encrypted volume (LUKS2);"),
            ("swap", "other", "1", None, "holds swap space;"),
            ("bcache", "other", "", Some("a bcache backing device"), "holds a bcache backing device;"),
        ];
        for (t, usage, version, detail, want) in cases {
            let mut p = fixture("sata-hdd-blank.env");
            p.examined = None;
            p.props.insert("ID_FS_TYPE".into(), t.into());
            p.props.insert("ID_FS_USAGE".into(), usage.into());
            p.props.insert("ID_FS_VERSION".into(), version.into());
            p.signature_detail = detail.map(str::to_string);
            let (c, r) = class(&p, &HostUsage::default(), &DriveFilters::default());
            assert_eq!(c, DriveClass::Foreign, "{t}");
            assert!(r.starts_with(want), "{t}: {r}");
        }

        // Kernel partitions on a disk that holds no table: someone else's.
        let mut p = fixture("sata-hdd-blank.env");
        p.partitions.push(PartitionProbe { name: "sdb1".into(), ..Default::default() });
        let (c, r) = class(&p, &HostUsage::default(), &DriveFilters::default());
        assert_eq!(c, DriveClass::Foreign);
        assert!(r.contains("the kernel lists 1 partition on it"), "{r}");
    }

    #[test]
    fn mounted_disk_is_system_even_when_excluded() {
        let p = fixture("virtio-root.env");
        let f = DriveFilters { exclude_paths: vec!["/dev/vda".into()], ..Default::default() };
        let (c, r) = class(&p, &mounted(p.devnum, "/"), &f);
        assert_eq!(c, DriveClass::System);
        assert!(r.contains("mounted filesystem at /"), "{r}");
    }

    #[test]
    fn mounted_partition_and_swap_and_holder_make_a_disk_system() {
        let mut p = fixture("sata-hdd-blank.env");
        p.partitions.push(PartitionProbe { name: "sdb1".into(), devnum: (8, 17), ..Default::default() });
        let (c, r) = class(&p, &mounted((8, 17), "/boot"), &DriveFilters::default());
        assert_eq!((c, r.contains("sdb1") && r.contains("/boot")), (DriveClass::System, true), "{r}");

        let mut u = HostUsage::default();
        u.swap.insert((8, 17));
        assert_eq!(class(&p, &u, &DriveFilters::default()).0, DriveClass::System);

        let mut q = fixture("sata-hdd-blank.env");
        q.holders.push(Holder { name: "dm-0".into(), devnum: (253, 0) });
        let (c, r) = class(&q, &mounted((253, 0), "/var"), &DriveFilters::default());
        assert_eq!(c, DriveClass::System);
        assert!(r.contains("dm-0"), "{r}");
        let (c, r) = class(&q, &HostUsage::default(), &DriveFilters::default());
        assert_eq!(c, DriveClass::Foreign);
        assert!(r.contains("dm-0"), "{r}");
    }

    /// The host's usage as `/proc/self/mountinfo` of `file` (tests/fixtures/mountinfo)
    /// shows it, with the root disk vda partitioned as vda1 (254:1).
    fn usage_in(file: &str, keep: impl Fn(&MountEntry) -> bool) -> HostUsage {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mountinfo").join(file);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mounts: Vec<MountEntry> = parse_mountinfo(&text).into_iter().filter(keep).collect();
        HostUsage::build(&mounts, &[], |d| (d == Path::new("/dev/vda1")).then_some((254, 1)))
    }

    #[test]
    fn the_root_disk_seen_from_a_pod_is_the_hosts_root_not_a_list_of_the_pods_binds() {
        let mut p = fixture("virtio-root.env");
        p.partitions.push(PartitionProbe { name: "vda1".into(), devnum: (254, 1), ..Default::default() });
        let all = |_: &MountEntry| true;
        let (c, r) = class(&p, &usage_in("daemonset-pod.txt", all), &DriveFilters::default());
        assert_eq!(c, DriveClass::System);
        assert_eq!(r, "partition vda1 backs the host's / (seen here through /var/lib/drivelet, /var/lib/kubelet)");

        let (c, r) = class(&p, &usage_in("host.txt", all), &DriveFilters::default());
        assert_eq!(c, DriveClass::System);
        assert_eq!(r, "partition vda1 backs the mounted filesystem at /", "on the host, its mount point");

        // Without the hostPath mounts, the pod's own files still make the disk system.
        let parts_only = usage_in("daemonset-pod.txt", |m| m.kind() != MountKind::SamePath);
        let (c, r) = class(&p, &parts_only, &DriveFilters::default());
        assert_eq!(c, DriveClass::System);
        assert_eq!(r, "partition vda1 backs a filesystem of which only parts are bind-mounted here (4 bind mounts)");

        // A whole disk mounted without a partition, as this host's vda is.
        let mut whole = HostUsage::default();
        whole.mounted.insert((254, 0), Mounted::whole_at("/"));
        whole.mounted.get_mut(&(254, 0)).expect("just inserted").insert(MountKind::SamePath, "/var/lib/kubelet".into());
        assert_eq!(class(&fixture("virtio-root.env"), &whole, &DriveFilters::default()).1, "backs the mounted filesystem at /");
    }

    #[test]
    fn mounts_of_drivelet_partitions_do_not_make_a_drive_system() {
        let mut p = fixture("sata-hdd-blank.env");
        p.props.insert("ID_PART_TABLE_TYPE".into(), "gpt".into());
        p.props.insert("ID_PART_TABLE_UUID".into(), format!("{}-0000-4000-8000-000000000001", gpt::DISK_GUID_PREFIX));
        p.examined = Some(Ok(drivelet_gpt()));
        p.partitions.push(PartitionProbe {
            name: "sdb1".into(),
            devnum: (8, 17),
            part_type: gpt::PARTITION_TYPE.into(),
            ..Default::default()
        });
        let (c, _) = class(&p, &mounted((8, 17), "/var/lib/kubelet/x"), &DriveFilters::default());
        assert_eq!(c, DriveClass::Managed);
    }

    #[test]
    fn each_filter_excludes_and_is_named() {
        let p = fixture("sata-hdd-blank.env");
        let cases: Vec<(DriveFilters, &str)> = vec![
            (DriveFilters { include_paths: vec!["/dev/nvme*".into()], ..Default::default() }, "include_paths"),
            (DriveFilters { exclude_paths: vec!["/dev/disk/by-id/ata-*".into()], ..Default::default() }, "exclude_paths entry \"/dev/disk/by-id/ata-*\""),
            (DriveFilters { exclude_serials: vec!["WD-WCC4E1234567".into()], ..Default::default() }, "exclude_serials"),
            (DriveFilters { exclude_models: vec!["WDC*".into()], ..Default::default() }, "exclude_models entry \"WDC*\""),
            (DriveFilters { min_size: 2 << 40, ..Default::default() }, "min_size"),
            (DriveFilters { media: vec![Media::Ssd], ..Default::default() }, "media hdd is not in drives.filters.media"),
        ];
        for (f, want) in cases {
            let (c, r) = class(&p, &HostUsage::default(), &f);
            assert_eq!(c, DriveClass::Excluded, "{want}");
            assert!(r.contains(want), "{r:?} should contain {want:?}");
        }
        let f = DriveFilters { include_paths: vec!["/dev/disk/by-id/ata-WDC*".into()], ..Default::default() };
        assert_eq!(class(&p, &HostUsage::default(), &f).0, DriveClass::Managed);
    }

    #[test]
    fn loop_filters_match_the_backing_file() {
        let p = blank_loop();
        let f = DriveFilters { include_paths: vec!["/var/lib/drivelet/demo/*".into()], ..Default::default() };
        assert_eq!(class(&p, &HostUsage::default(), &f).0, DriveClass::Managed);
        let f = DriveFilters { include_paths: vec!["/elsewhere/*".into()], ..Default::default() };
        assert_eq!(class(&p, &HostUsage::default(), &f).0, DriveClass::Excluded);
    }

    #[test]
    fn unprobed_unconfirmed_and_read_only_disks_are_foreign() {
        let mut p = fixture("sata-hdd-blank.env");
        p.udev_initialized = false;
        assert!(class(&p, &HostUsage::default(), &DriveFilters::default()).1.contains("udevadm trigger"));
        let mut p = fixture("sata-hdd-blank.env");
        p.examined = Some(Err("blkid failed: exit status: 4".into()));
        assert!(class(&p, &HostUsage::default(), &DriveFilters::default()).1.contains("cannot read the disk"));
        p.examined = None;
        assert!(class(&p, &HostUsage::default(), &DriveFilters::default()).1.contains("has not read the disk"));
        let mut p = fixture("sata-hdd-blank.env");
        p.read_only = true;
        assert!(class(&p, &HostUsage::default(), &DriveFilters::default()).1.contains("read-only"));
    }

    #[test]
    fn non_drives_are_skipped() {
        let mut p = blank_loop();
        assert!(classify(&p, &HostUsage::default(), &DriveFilters::default(), false, &Ownership::default()).is_none(), "loop not allowed");
        p.loop_backing_file = None;
        assert!(classify(&p, &HostUsage::default(), &DriveFilters::default(), true, &Ownership::default()).is_none(), "unattached loop");
        for name in ["zram0", "ram0", "dm-0", "md127", "sr0", "nbd0"] {
            let mut q = fixture("sata-hdd-blank.env");
            q.name = name.into();
            assert!(!is_drive(&q, true), "{name}");
        }
        let mut q = fixture("sata-hdd-blank.env");
        q.size = 0;
        assert!(!is_drive(&q, true), "no medium");
    }

    #[test]
    fn a_loop_over_a_block_device_is_no_drive_but_one_over_a_file_is() {
        // kubelet's loop over the device node of a block volume a pod uses.
        let mut p = fixture("loop-blank.env");
        p.loop_backing_file =
            Some(PathBuf::from("/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/pvc-1/dev/0b7a1c3e-1111"));
        p.loop_over_block_device = true;
        assert!(!is_drive(&p, true), "another name for a device the node has");
        assert!(classify(&p, &HostUsage::default(), &DriveFilters::default(), true, &Ownership::default()).is_none());
        // A backing file that could not be stat-ed (or a regular file) is judged as today.
        p.loop_over_block_device = false;
        assert!(is_drive(&p, true));
        assert!(is_drive(&blank_loop(), true), "a loop over an image file");
    }

    #[test]
    fn ids_media_and_transport_come_from_udev() {
        let p = fixture("sata-hdd-blank.env");
        assert_eq!(stable_id(&p), "wwn-0x50014ee2b5a6c1d2");
        assert_eq!((media_of(&p), transport_of(&p).as_str()), (Media::Hdd, "sata"));
        let p = fixture("nvme-gpt.env");
        assert_eq!(stable_id(&p), "wwn-eui.0025385b71b0a1b2");
        assert_eq!((media_of(&p), transport_of(&p).as_str()), (Media::Nvme, "nvme"));
        let p = fixture("sata-ssd-ext4.env");
        assert_eq!(stable_id(&p), "ata-Samsung_SSD_870_EVO_1TB_S6PTNM0T123456A");
        let mut p = fixture("sata-ssd-ext4.env");
        p.rotational = false;
        assert_eq!(media_of(&p), Media::Ssd);
        let l = blank_loop();
        assert!(stable_id(&l).starts_with("loop-drive-0.img-"), "{}", stable_id(&l));
        assert_eq!(stable_id(&l), stable_id(&blank_loop()), "stable across probes");
        assert_eq!(media_of(&l), Media::Virtual);
        assert_eq!(stable_id(&fixture("virtio-root.env")), "name-vda");
    }
}
