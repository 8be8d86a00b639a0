//! The set of drives as plain data: built from probes, diffed into events, queried
//! for capacity. No I/O here; the actor feeds it probes.
//!
//! Rules:
//! - drives are keyed by kernel name (what udev events carry) and identified to the
//!   outside by their stable id;
//! - a full scan replaces the set; a single-disk probe updates one entry; both return
//!   the events (appeared, changed, gone) that the change implies, and nothing else;
//! - free space counts only managed drives, in aligned extents between partitions.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::classify;
use crate::config::DriveFilters;
use crate::disk::gpt;

use crate::disk::mounts::HostUsage;
use crate::disk::udev::DiskProbe;
use crate::words::{DriveClass, Health, Media};

/// One whole disk as drivelet sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drive {
    /// Stable id (WWN, serial, or loop backing file based).
    pub id: String,
    /// Kernel device node, e.g. `/dev/sdb`.
    pub path: PathBuf,
    /// The preferred `/dev/disk/by-id` link, when udev made one.
    pub by_id: Option<PathBuf>,
    /// `major:minor`.
    pub devnum: (u32, u32),
    /// Serial number.
    pub serial: Option<String>,
    /// World-wide name.
    pub wwn: Option<String>,
    /// Model.
    pub model: Option<String>,
    /// Vendor.
    pub vendor: Option<String>,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Logical block size in bytes.
    pub logical_block_size: u64,
    /// Whether the disk rotates.
    pub rotational: bool,
    /// Bus: sata, sas, nvme, usb, virtio, loop, ...
    pub transport: String,
    /// Media class.
    pub media: Media,
    /// Classification.
    pub class: DriveClass,
    /// Why, in words an admin can act on.
    pub reason: String,
    /// The kernel's disk sequence number: it changes whenever the media does (a disk
    /// swapped under the same name, a loop device attached again); 0 where unknown.
    #[serde(default)]
    pub diskseq: u64,
    /// For a loop device, its backing file.
    pub backing_file: Option<PathBuf>,
    /// Number of drivelet volume partitions on it (snapshots not counted).
    pub volumes: u32,
    /// Free bytes available to new volumes (managed drives only).
    pub free_bytes: u64,
    /// Largest contiguous free extent (managed drives only).
    pub largest_free_bytes: u64,
    /// Whether the drive has no partition table yet (a `layout=drive` candidate).
    pub blank: bool,
    /// How many partitions its table holds (managed drives): the kernel's limit
    /// ([`gpt::KERNEL_MAX_PARTITIONS`]) for a blank drive and a table of
    /// [`gpt::TABLE_ENTRIES`] entries (or one that grows to that many at its next
    /// write), else the entries of its table; 0 for other drives.
    #[serde(default)]
    pub partition_slots: u32,
    /// Partition slots still free on it (managed drives): [`Drive::partition_slots`]
    /// less the partitions the kernel reports.
    #[serde(default)]
    pub slots_free: u32,
    /// Partitions the kernel reports on it that are not drivelet volumes (those are
    /// the volume manager's to count), `(start, len)` in bytes.
    #[serde(default)]
    pub extents: Vec<(u64, u64)>,
    /// Last health verdict (SMART), kept across rescans.
    #[serde(default)]
    pub health: DriveHealth,
    /// Whose it is, from its note (drivelet disks; `Unknown` for others).
    #[serde(default)]
    pub owner: crate::words::DriveOwner,
}

/// A drive's health as the health poller last found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriveHealth {
    /// Good, suspect, bad or unknown.
    pub health: Health,
    /// Why, in words an admin can act on.
    pub reason: String,
    /// Unix time of the check (0: never checked).
    pub checked_unix: u64,
    /// The figures the check read (temperature, wear, sector and error counts): none
    /// for a drive without SMART, and in state written before they were kept.
    #[serde(default, skip_serializing_if = "crate::disk::smart::SmartFigures::is_empty")]
    pub smart: crate::disk::smart::SmartFigures,
}

impl Default for DriveHealth {
    fn default() -> Self {
        DriveHealth { health: Health::Unknown, reason: NOT_CHECKED.into(), checked_unix: 0, smart: Default::default() }
    }
}

/// What a new health verdict changes, as far as an admin reading the log cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthChange {
    /// Nothing but the time of the check.
    Nothing,
    /// The first verdict of a drive never checked before, which leaves its health as it
    /// was (unknown): not a change, but worth one line.
    FirstCheck,
    /// The verdict itself (good, suspect, bad, unknown).
    Verdict,
    /// The same verdict, for another reason.
    Reason,
}

impl DriveHealth {
    /// What `self`, a new verdict, changes from `old`.
    pub fn change_from(&self, old: &DriveHealth) -> HealthChange {
        if self.health != old.health {
            HealthChange::Verdict
        } else if old.checked_unix == 0 && self.checked_unix != 0 {
            HealthChange::FirstCheck
        } else if self.reason != old.reason {
            HealthChange::Reason
        } else {
            HealthChange::Nothing
        }
    }
}

impl Drive {
    /// Builds the drive view of a probe; `None` when the device is not a drive.
    pub fn from_probe(p: &DiskProbe, usage: &HostUsage, filters: &DriveFilters, allow_loop: bool, own: &classify::Ownership) -> Option<Drive> {
        let (class, reason) = classify::classify(p, usage, filters, allow_loop, own)?;
        // Snapshots are drivelet partitions too, but no volumes: the table read from
        // the disk (when there is one) tells them apart by their attribute bit.
        let snapshots = match &p.examined {
            Some(Ok(crate::disk::gpt::Contents::Drivelet(t))) => t.partitions.iter().filter(|q| q.is_drivelet() && q.is_snapshot()).count(),
            _ => 0,
        };
        let volumes = p.partitions.iter().filter(|q| q.part_type == gpt::PARTITION_TYPE).count().saturating_sub(snapshots) as u32;
        let table = match &p.examined {
            Some(Ok(crate::disk::gpt::Contents::Drivelet(t))) => Some(t),
            _ => None,
        };
        let partition_slots = match (class == DriveClass::Managed, table) {
            (false, _) => 0,
            (true, Some(t)) => t.slots(),
            (true, None) => gpt::partition_slots(gpt::TABLE_ENTRIES),
        };
        let slots_free = partition_slots.saturating_sub(u32::try_from(p.partitions.len()).unwrap_or(u32::MAX));
        // A table that cannot hold as many partitions as the kernel allows says why.
        let reason = match table.and_then(|t| t.cannot_grow.as_deref()) {
            Some(why) if class == DriveClass::Managed => format!("{reason}; {why}"),
            _ => reason,
        };
        let (free_bytes, largest_free_bytes) = if class == DriveClass::Managed {
            let used: Vec<(u64, u64)> = p.partitions.iter().map(|q| (q.start, q.size)).collect();
            let free = gpt::free_extents(p.size, p.logical_block_size, &used);
            (free.iter().map(|e| e.1).sum(), free.iter().map(|e| e.1).max().unwrap_or(0))
        } else {
            (0, 0)
        };
        let by_id = p
            .devlinks
            .iter()
            .filter(|l| l.starts_with("/dev/disk/by-id/"))
            .min_by_key(|l| {
                // wwn- links first, then the longest (most descriptive) one.
                let s = l.to_string_lossy();
                (!s.contains("/wwn-"), usize::MAX - s.len())
            })
            .cloned();
        Some(Drive {
            id: classify::stable_id(p),
            path: p.devnode.clone(),
            by_id,
            devnum: p.devnum,
            serial: p.prop("ID_SERIAL_SHORT").map(str::to_string),
            wwn: p.prop("ID_WWN").map(str::to_string),
            model: p.prop("ID_MODEL").map(|m| m.replace('_', " ")),
            vendor: p.prop("ID_VENDOR").map(str::to_string),
            size_bytes: p.size,
            logical_block_size: p.logical_block_size,
            rotational: p.rotational,
            transport: classify::transport_of(p),
            media: classify::media_of(p),
            class,
            reason,
            diskseq: p.diskseq,
            backing_file: p.loop_backing_file.clone(),
            volumes,
            free_bytes,
            largest_free_bytes,
            blank: p.partitions.is_empty() && p.prop("ID_PART_TABLE_TYPE").is_none(),
            partition_slots,
            slots_free,
            extents: p
                .partitions
                .iter()
                .filter(|q| q.part_type != gpt::PARTITION_TYPE)
                .map(|q| (q.start, q.size))
                .collect(),
            health: DriveHealth::default(),
            owner: classify::owner_of(p, own),
        })
    }
}

impl Drive {
    /// What differs between `old` and `self`, in words for the log ("class", "reason",
    /// "free space", ...); empty when nothing does.
    pub fn changed_from(&self, old: &Drive) -> Vec<&'static str> {
        let identity = (&self.id, &self.by_id, self.devnum, &self.serial, &self.wwn, &self.model, &self.vendor, &self.backing_file)
            != (&old.id, &old.by_id, old.devnum, &old.serial, &old.wwn, &old.model, &old.vendor, &old.backing_file);
        let device = (self.logical_block_size, self.rotational, &self.transport, self.media)
            != (old.logical_block_size, old.rotational, &old.transport, old.media);
        [
            (self.class != old.class, "class"),
            (self.owner != old.owner, "owner"),
            (self.reason != old.reason, "reason"),
            (self.path != old.path, "path"),
            (self.size_bytes != old.size_bytes, "size"),
            (identity, "identity"),
            (device, "device"),
            (self.volumes != old.volumes, "volumes"),
            ((self.free_bytes, self.largest_free_bytes) != (old.free_bytes, old.largest_free_bytes), "free space"),
            ((self.blank, &self.extents) != (old.blank, &old.extents), "partitions"),
            ((self.partition_slots, self.slots_free) != (old.partition_slots, old.slots_free), "partition slots"),
            (self.health != old.health, "health"),
        ]
        .into_iter()
        .filter_map(|(changed, what)| changed.then_some(what))
        .collect()
    }
}

#[cfg(test)]
impl Drive {
    /// A blank managed drive for unit tests.
    pub(crate) fn for_test(id: &str, media: Media, size: u64) -> Drive {
        Drive {
            id: id.into(),
            path: format!("/dev/{id}").into(),
            by_id: None,
            devnum: (7, 0),
            serial: None,
            wwn: None,
            model: None,
            vendor: None,
            size_bytes: size,
            logical_block_size: 512,
            rotational: false,
            transport: "loop".into(),
            media,
            class: DriveClass::Managed,
            reason: String::new(),
            diskseq: 0,
            backing_file: None,
            volumes: 0,
            free_bytes: 0,
            largest_free_bytes: 0,
            blank: true,
            partition_slots: gpt::KERNEL_MAX_PARTITIONS,
            slots_free: gpt::KERNEL_MAX_PARTITIONS,
            extents: vec![],
            health: DriveHealth::default(),
            owner: Default::default(),
        }
    }
}

/// A change to the set of drives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriveChange {
    /// A drive was found.
    Appeared(Drive),
    /// A known drive changed (class, size, partitions...).
    Changed {
        /// Before.
        old: Drive,
        /// After.
        new: Drive,
    },
    /// A drive went away.
    Gone(Drive),
}

/// The drive set.
#[derive(Debug, Default)]
pub struct Inventory {
    drives: BTreeMap<String, Drive>,
    scanned: bool,
}

impl Inventory {
    /// Whether the first full scan has completed.
    pub fn scanned(&self) -> bool {
        self.scanned
    }

    /// Replaces the set with a full scan and returns what changed.
    pub fn apply_scan(&mut self, scan: BTreeMap<String, Drive>) -> Vec<DriveChange> {
        let mut changes = Vec::new();
        for (name, old) in &self.drives {
            if !scan.contains_key(name) {
                changes.push(DriveChange::Gone(old.clone()));
            }
        }
        for (name, new) in &scan {
            match self.drives.get(name) {
                None => changes.push(DriveChange::Appeared(new.clone())),
                Some(old) if old != new => changes.push(DriveChange::Changed { old: old.clone(), new: new.clone() }),
                Some(_) => {}
            }
        }
        self.drives = scan;
        self.scanned = true;
        changes
    }

    /// Updates one disk (by kernel name); `None` means it is gone or not a drive.
    pub fn apply_one(&mut self, name: &str, drive: Option<Drive>) -> Option<DriveChange> {
        match (self.drives.remove(name), drive) {
            (None, None) => None,
            (Some(old), None) => Some(DriveChange::Gone(old)),
            (None, Some(new)) => {
                self.drives.insert(name.to_string(), new.clone());
                Some(DriveChange::Appeared(new))
            }
            (Some(old), Some(new)) => {
                self.drives.insert(name.to_string(), new.clone());
                (old != new).then_some(DriveChange::Changed { old, new })
            }
        }
    }

    /// Records a health verdict for the drive with `id`; returns the change, if any.
    pub fn set_health(&mut self, id: &str, h: DriveHealth) -> Option<DriveChange> {
        let d = self.drives.values_mut().find(|d| d.id == id)?;
        if h.change_from(&d.health) == HealthChange::Nothing {
            d.health.checked_unix = h.checked_unix;
            return None;
        }
        let old = d.clone();
        d.health = h;
        Some(DriveChange::Changed { old, new: d.clone() })
    }

    /// Marks the drive with `id` foreign for `reason` (the GPT writer refused it);
    /// returns the change, if any. The next probe of the disk judges it again, by the
    /// writer's own rule.
    pub fn mark_foreign(&mut self, id: &str, reason: String) -> Option<DriveChange> {
        let d = self.drives.values_mut().find(|d| d.id == id)?;
        if d.class == DriveClass::Foreign && d.reason == reason {
            return None;
        }
        let old = d.clone();
        d.class = DriveClass::Foreign;
        d.reason = reason;
        d.free_bytes = 0;
        d.largest_free_bytes = 0;
        Some(DriveChange::Changed { old, new: d.clone() })
    }

    /// Every drive, ordered by kernel name.
    pub fn list(&self) -> Vec<Drive> {
        self.drives.values().cloned().collect()
    }

}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_drive_names_what_changed() {
        let a = drive("a", DriveClass::Managed, Media::Ssd, 100, 0);
        assert!(a.changed_from(&a).is_empty());
        let mut b = a.clone();
        b.class = DriveClass::Foreign;
        b.reason = "holds swap space".into();
        assert_eq!(b.changed_from(&a), vec!["class", "reason"]);
        let mut c = a.clone();
        c.volumes = 1;
        c.free_bytes = 50;
        assert_eq!(c.changed_from(&a), vec!["volumes", "free space"]);
        let mut d = a.clone();
        d.path = "/dev/sdz".into();
        d.serial = Some("X".into());
        assert_eq!(d.changed_from(&a), vec!["path", "identity"]);
    }

    #[test]
    fn a_refused_drive_turns_foreign_once() {
        let mut inv = Inventory::default();
        let a = drive("a", DriveClass::Managed, Media::Ssd, 100, 0);
        inv.apply_scan(BTreeMap::from([("sda".into(), a.clone())]));
        let Some(DriveChange::Changed { old, new }) = inv.mark_foreign("a", "holds swap space".into()) else { panic!("a change") };
        assert_eq!((old.class, new.class, new.reason.as_str(), new.free_bytes), (DriveClass::Managed, DriveClass::Foreign, "holds swap space", 0));
        assert_eq!(inv.mark_foreign("a", "holds swap space".into()), None, "nothing changes the second time");
        assert_eq!(inv.mark_foreign("nope", "x".into()), None);
    }

    #[test]
    fn a_health_verdict_changes_what_it_changes() {
        let h = |health, reason: &str, checked_unix| DriveHealth { health, reason: reason.into(), checked_unix, smart: Default::default() };
        let never = DriveHealth::default();
        let unknown = h(Health::Unknown, "no SMART data", 100);
        let table = [
            (&never, h(Health::Unknown, "no SMART data", 100), HealthChange::FirstCheck),
            (&never, h(Health::Good, "healthy", 100), HealthChange::Verdict),
            (&unknown, h(Health::Unknown, "no SMART data", 160), HealthChange::Nothing),
            (&unknown, h(Health::Unknown, "smartctl did not answer within 30s", 160), HealthChange::Reason),
            (&unknown, h(Health::Bad, "failed self-assessment", 160), HealthChange::Verdict),
        ];
        for (old, new, want) in table {
            assert_eq!(new.change_from(old), want, "{old:?} -> {new:?}");
        }
    }

    fn drive(id: &str, class: DriveClass, media: Media, free: u64, volumes: u32) -> Drive {
        let mut d = Drive::for_test(id, media, free + (2 << 20));
        d.class = class;
        d.transport = "sata".into();
        d.devnum = (8, 0);
        d.volumes = volumes;
        d.free_bytes = free;
        d.largest_free_bytes = free / 2;
        d.blank = volumes == 0;
        d
    }

    #[test]
    fn scans_and_single_updates_produce_the_right_changes() {
        let mut inv = Inventory::default();
        assert!(!inv.scanned());
        let a = drive("a", DriveClass::Managed, Media::Ssd, 100, 0);
        let b = drive("b", DriveClass::Foreign, Media::Hdd, 0, 0);
        let ch = inv.apply_scan(BTreeMap::from([("sda".into(), a.clone()), ("sdb".into(), b.clone())]));
        assert_eq!(ch.len(), 2);
        assert!(inv.scanned());
        assert_eq!(inv.apply_scan(BTreeMap::from([("sda".into(), a.clone()), ("sdb".into(), b.clone())])), vec![]);
        let ch = inv.apply_scan(BTreeMap::from([("sda".into(), a.clone())]));
        assert_eq!(ch, vec![DriveChange::Gone(b.clone())]);
        assert_eq!(inv.apply_one("sdb", Some(b.clone())), Some(DriveChange::Appeared(b.clone())));
        assert_eq!(inv.apply_one("sdb", Some(b.clone())), None);
        let mut b2 = b.clone();
        b2.class = DriveClass::Managed;
        assert_eq!(inv.apply_one("sdb", Some(b2.clone())), Some(DriveChange::Changed { old: b, new: b2.clone() }));
        assert_eq!(inv.apply_one("sdb", None), Some(DriveChange::Gone(b2)));
        assert_eq!(inv.apply_one("sdb", None), None);
    }
}

/// The health reason of a drive whose health was not checked yet.
pub const NOT_CHECKED: &str = "not checked yet";
