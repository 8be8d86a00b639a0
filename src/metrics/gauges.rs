//! The state read from the actors at scrape time ([`Gauges`]) and the collector that
//! writes it: aggregate counts, a set of series per drive, per volume and per evacuation.
//!
//! Rules:
//! - a family with no series is left out (no drive is evacuated: no evacuation family);
//! - per-drive series carry `node`, `drive` (the stable id), `serial`, `model` and
//!   `media` (empty strings when unknown); per-volume series `node`, `volume` (the CSI
//!   volume id) and `drive`; so a dashboard joins a volume to its drive, and both to a
//!   node, without a lookup table;
//! - state sets (class, health, usage) write every state of the set, 1 for the current
//!   one and 0 for the others, so a change of state is a change of value, never a
//!   series that vanishes;
//! - every managed drive has its room (free, largest free extent, allocatable, bytes
//!   being cleaned, volumes) and usage; SMART figures and the last check only when read;
//!   a volume's condition reasons only while it is abnormal, its move progress only
//!   while it moves.

use std::collections::BTreeMap;
use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use crate::disk::smart::SmartFigures;
use crate::words::{DriveClass, DriveUseState, Health, Media};

/// State read from the actors at scrape time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Gauges {
    /// The node's name, on every per-drive and per-volume series.
    pub node: String,
    /// `/readyz` would answer ready.
    pub ready: bool,
    /// Drives by (class, health, usage).
    pub drives_by_state: BTreeMap<(String, String, String), u64>,
    /// Volumes by (state, condition).
    pub volumes_by_state: BTreeMap<(String, String), u64>,
    /// Snapshots by state: (how many, bytes they take on the drives).
    pub snapshots: BTreeMap<String, (u64, u64)>,
    /// Attach queue, when it runs: (waiting, running, retries, relists).
    pub attach: Option<(usize, usize, u64, u64)>,
    /// Every drive the inventory lists.
    pub drives: Vec<DriveFigures>,
    /// Every volume the volume manager shows.
    pub volumes: Vec<VolumeFigures>,
    /// Every evacuation asked for.
    pub evacuations: Vec<EvacuationFigures>,
}

/// One drive, as its series show it.
#[derive(Debug, Clone, PartialEq)]
pub struct DriveFigures {
    /// Stable id.
    pub id: String,
    /// Serial number ("" when unknown).
    pub serial: String,
    /// Model ("" when unknown).
    pub model: String,
    /// Media class.
    pub media: Media,
    /// Kernel device node.
    pub path: String,
    /// Bus (sata, nvme, loop, ...).
    pub transport: String,
    /// Size in bytes.
    pub size: u64,
    /// Classification.
    pub class: DriveClass,
    /// Health verdict.
    pub health: Health,
    /// Unix time of the last SMART poll that read it (0: never).
    pub checked_unix: u64,
    /// What that poll read.
    pub smart: SmartFigures,
    /// Room and usage, for a managed drive.
    pub managed: Option<ManagedFigures>,
}

/// The room and usage of a managed drive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ManagedFigures {
    /// Its usage record (`None`: active).
    pub usage: Option<DriveUseState>,
    /// Bytes free for new volumes: the aligned free extents, space being cleaned not
    /// counted.
    pub free: u64,
    /// The largest of those extents.
    pub largest_free: u64,
    /// The largest volume placement would put on it now (0 when it is closed).
    pub allocatable: u64,
    /// Freed bytes still to be zeroed by the cleaner.
    pub cleaning: u64,
    /// Volumes on it.
    pub volumes: u64,
    /// Partition-table slots still free on it (one per new volume, whatever its size).
    pub slots_free: u64,
    /// Partition-table slots it has in all (its table's entries, at most the kernel's
    /// per-disk limit).
    pub slots: u64,
}

/// One volume, as its series show it.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeFigures {
    /// CSI volume id.
    pub id: String,
    /// Stable id of its drive.
    pub drive: String,
    /// Its PV's name ("" when not known).
    pub pv: String,
    /// Its claim's namespace ("" when not known).
    pub claim_namespace: String,
    /// Its claim's name ("" when not known).
    pub claim: String,
    /// Made for block access.
    pub block: bool,
    /// Its filesystem ("" for block).
    pub fs: String,
    /// Size in bytes.
    pub size: u64,
    /// Its condition is abnormal.
    pub abnormal: bool,
    /// The reasons of its condition, kebab-case, one each.
    pub reasons: Vec<&'static str>,
    /// While it moves: the drive its copy goes to and the fraction done.
    pub moving: Option<(String, f64)>,
}

/// Where the evacuation of one drive stands: volumes by state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EvacuationFigures {
    /// The drive being evacuated.
    pub drive: String,
    /// Moved off it (by this process).
    pub moved: u64,
    /// Being copied now.
    pub moving: u64,
    /// Moving when their turn comes.
    pub queued: u64,
    /// Staged by a pod: moving once unstaged.
    pub waiting: u64,
    /// Their move failed.
    pub failed: u64,
}

/// A state set: its label, every state, and each state's name.
struct StateSet<S: 'static> {
    label: &'static str,
    all: &'static [S],
    name: fn(S) -> &'static str,
}

/// Every drive class.
const CLASSES: StateSet<DriveClass> = StateSet {
    label: "class",
    all: &[DriveClass::Managed, DriveClass::System, DriveClass::Foreign, DriveClass::Excluded, DriveClass::OwnedElsewhere],
    name: DriveClass::as_str,
};
/// Every health verdict.
const HEALTHS: StateSet<Health> = StateSet { label: "health", all: &[Health::Good, Health::Suspect, Health::Bad, Health::Unknown], name: Health::as_str };
/// Every usage of a managed drive (`None`: active).
const USAGES: StateSet<Option<DriveUseState>> = StateSet {
    label: "usage",
    all: &[None, Some(DriveUseState::Cordoned), Some(DriveUseState::Releasing), Some(DriveUseState::Released)],
    name: usage_name,
};

fn usage_name(u: Option<DriveUseState>) -> &'static str {
    u.map_or("active", DriveUseState::as_str)
}

/// A sample value.
#[derive(Clone, Copy)]
enum Num {
    /// A whole number.
    U(u64),
    /// A signed whole number.
    I(i64),
    /// A real number.
    F(f64),
}

/// One family: `name` (without unit or `_total`), help ending in a period, unit, type,
/// and its series. Nothing is written for a family without series.
fn family<L: EncodeLabelSet>(enc: &mut DescriptorEncoder, name: &str, help: &str, unit: Option<Unit>, kind: MetricType, rows: Vec<(L, Num)>) -> fmt::Result {
    if rows.is_empty() {
        return Ok(());
    }
    let mut m = enc.encode_descriptor(name, help, unit.as_ref(), kind)?;
    for (labels, v) in &rows {
        let mut s = m.encode_family(labels)?;
        match (kind, *v) {
            (MetricType::Counter, Num::U(n)) => s.encode_counter::<NoLabelSet, u64, u64>(&n, None)?,
            (MetricType::Counter, Num::I(n)) => s.encode_counter::<NoLabelSet, u64, u64>(&u64::try_from(n).unwrap_or(0), None)?,
            (MetricType::Counter, Num::F(n)) => s.encode_counter::<NoLabelSet, f64, f64>(&n, None)?,
            (_, Num::U(n)) => s.encode_gauge(&n)?,
            (_, Num::I(n)) => s.encode_gauge(&n)?,
            (_, Num::F(n)) => s.encode_gauge(&n)?,
        }
    }
    Ok(())
}

/// A family of one series without labels.
fn single(enc: &mut DescriptorEncoder, name: &str, help: &str, unit: Option<Unit>, kind: MetricType, v: Num) -> fmt::Result {
    family(enc, name, help, unit, kind, vec![([] as [(&str, &str); 0], v)])
}

/// The labels of every per-drive series.
type DriveLabels<'a> = [(&'static str, &'a str); 5];

/// The labels of every per-volume series.
type VolumeLabels<'a> = [(&'static str, &'a str); 3];

fn ratio() -> Option<Unit> {
    Some(Unit::Other("ratio".into()))
}

impl Gauges {
    fn drive_labels<'a>(&'a self, d: &'a DriveFigures) -> DriveLabels<'a> {
        [("node", &self.node), ("drive", &d.id), ("serial", &d.serial), ("model", &d.model), ("media", d.media.as_str())]
    }

    fn volume_labels<'a>(&'a self, v: &'a VolumeFigures) -> VolumeLabels<'a> {
        [("node", &self.node), ("volume", &v.id), ("drive", &v.drive)]
    }

    /// A per-drive family of the drives `pick` gives a value for.
    fn per_drive(
        &self,
        enc: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        kind: MetricType,
        pick: impl Fn(&DriveFigures) -> Option<Num>,
    ) -> fmt::Result {
        let rows = self.drives.iter().filter_map(|d| Some((self.drive_labels(d), pick(d)?))).collect();
        family(enc, name, help, unit, kind, rows)
    }

    /// A per-drive state set: for each drive `pick` gives a state for, every state of
    /// `all`, 1 for the drive's.
    fn per_drive_set<S: Copy + PartialEq>(
        &self,
        enc: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        set: &StateSet<S>,
        pick: impl Fn(&DriveFigures) -> Option<S>,
    ) -> fmt::Result {
        let mut rows = Vec::new();
        for d in &self.drives {
            let Some(now) = pick(d) else { continue };
            for s in set.all {
                rows.push(((self.drive_labels(d), [(set.label, (set.name)(*s))]), Num::U(u64::from(*s == now))));
            }
        }
        family(enc, name, help, None, MetricType::Gauge, rows)
    }

    /// A per-volume family of the volumes `pick` gives a value for.
    fn per_volume(&self, enc: &mut DescriptorEncoder, name: &str, help: &str, unit: Option<Unit>, pick: impl Fn(&VolumeFigures) -> Option<Num>) -> fmt::Result {
        let rows = self.volumes.iter().filter_map(|v| Some((self.volume_labels(v), pick(v)?))).collect();
        family(enc, name, help, unit, MetricType::Gauge, rows)
    }

    fn encode_aggregates(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        use MetricType::{Counter, Gauge};
        let version = [("version", env!("CARGO_PKG_VERSION"))];
        family(enc, "drivelet_build_info", "drivelet's version.", None, Gauge, vec![(version, Num::U(1))])?;
        single(enc, "drivelet_ready", "1 once the first drive scan is done and the CSI socket serves.", None, Gauge, Num::U(u64::from(self.ready)))?;
        let rows = self
            .drives_by_state
            .iter()
            .map(|((class, health, usage), n)| ([("class", class.as_str()), ("health", health.as_str()), ("usage", usage.as_str())], Num::U(*n)))
            .collect();
        family(enc, "drivelet_drives", "Disks seen, by class, health and usage.", None, Gauge, rows)?;
        let rows = self
            .volumes_by_state
            .iter()
            .map(|((state, condition), n)| ([("state", state.as_str()), ("condition", condition.as_str())], Num::U(*n)))
            .collect();
        family(enc, "drivelet_volumes", "Volumes, by state and condition.", None, Gauge, rows)?;
        let rows = self.snapshots.iter().map(|(state, (n, _))| ([("state", state.as_str())], Num::U(*n))).collect();
        family(enc, "drivelet_snapshots", "Snapshots, by state.", None, Gauge, rows)?;
        let rows = self.snapshots.iter().map(|(state, (_, bytes))| ([("state", state.as_str())], Num::U(*bytes))).collect();
        family(enc, "drivelet_snapshot", "Bytes snapshots take on the drives, by state.", Some(Unit::Bytes), Gauge, rows)?;
        if let Some((waiting, running, retries, relists)) = self.attach {
            single(enc, "drivelet_attach_queue_depth", "VolumeAttachments waiting to be worked on.", None, Gauge, Num::U(waiting as u64))?;
            single(enc, "drivelet_attach_queue_running", "VolumeAttachments being worked on.", None, Gauge, Num::U(running as u64))?;
            single(enc, "drivelet_attach_retries", "Attach and detach runs that ended in a retry.", None, Counter, Num::U(retries))?;
            single(enc, "drivelet_attach_relists", "Full lists of VolumeAttachments (watch starts and restarts).", None, Counter, Num::U(relists))?;
        }
        Ok(())
    }

    fn encode_drives(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        use MetricType::{Counter, Gauge};
        let rows = self
            .drives
            .iter()
            .map(|d| ((self.drive_labels(d), [("path", d.path.as_str()), ("transport", d.transport.as_str())]), Num::U(1)))
            .collect();
        family(enc, "drivelet_drive_info", "A drive the node has: its kernel path and bus (always 1).", None, Gauge, rows)?;
        self.per_drive(enc, "drivelet_drive_size", "Size of the drive.", Some(Unit::Bytes), Gauge, |d| Some(Num::U(d.size)))?;
        self.per_drive_set(enc, "drivelet_drive_class", "The drive's class: 1 for its class, 0 for the others.", &CLASSES, |d| Some(d.class))?;
        self.per_drive_set(enc, "drivelet_drive_health", "The drive's health: 1 for its verdict, 0 for the others.", &HEALTHS, |d| Some(d.health))?;
        self.per_drive_set(enc, "drivelet_drive_usage", "A managed drive's usage: 1 for its usage, 0 for the others.", &USAGES, |d| d.managed.map(|m| m.usage))?;
        let room = |f: fn(&ManagedFigures) -> u64| move |d: &DriveFigures| d.managed.as_ref().map(|m| Num::U(f(m)));
        self.per_drive(enc, "drivelet_drive_free", "Bytes of a managed drive free for new volumes (aligned free extents; space being cleaned not counted).", Some(Unit::Bytes), Gauge, room(|m| m.free))?;
        self.per_drive(enc, "drivelet_drive_largest_free_extent", "The largest contiguous free extent of a managed drive.", Some(Unit::Bytes), Gauge, room(|m| m.largest_free))?;
        self.per_drive(
            enc,
            "drivelet_drive_allocatable",
            "The largest new volume placement would put on a managed drive now (0 when closed to new volumes or full).",
            Some(Unit::Bytes),
            Gauge,
            room(|m| m.allocatable),
        )?;
        self.per_drive(enc, "drivelet_drive_cleaning", "Freed bytes of a managed drive waiting for or being zeroed by the cleaner.", Some(Unit::Bytes), Gauge, room(|m| m.cleaning))?;
        self.per_drive(enc, "drivelet_drive_volumes", "Volumes on a managed drive.", None, Gauge, room(|m| m.volumes))?;
        self.per_drive(
            enc,
            "drivelet_drive_partition_slots_free",
            "Partition-table slots of a managed drive free for new volumes (a volume takes one whatever its size; 0 means the drive takes no new volume).",
            None,
            Gauge,
            room(|m| m.slots_free),
        )?;
        self.per_drive(enc, "drivelet_drive_partition_slots", "Partition-table slots of a managed drive in all (its table's entries, at most the kernel's per-disk limit).", None, Gauge, room(|m| m.slots))?;
        self.per_drive(enc, "drivelet_drive_health_checked_timestamp", "Unix time of the last SMART poll that read the drive.", Some(Unit::Seconds), Gauge, |d| {
            (d.checked_unix > 0).then_some(Num::U(d.checked_unix))
        })?;
        self.per_drive(enc, "drivelet_drive_temperature", "The drive's temperature as SMART last read it.", Some(Unit::Celsius), Gauge, |d| {
            d.smart.temperature_c.map(Num::I)
        })?;
        self.per_drive(enc, "drivelet_drive_endurance_used", "Rated endurance used (NVMe and SCSI percentage used / 100; can pass 1).", ratio(), Gauge, |d| {
            d.smart.percentage_used.map(|p| Num::F(p as f64 / 100.0))
        })?;
        self.per_drive(enc, "drivelet_drive_reallocated_sectors", "ATA attribute 5 Reallocated_Sector_Ct, raw.", None, Gauge, |d| d.smart.reallocated_sectors.map(Num::U))?;
        self.per_drive(enc, "drivelet_drive_pending_sectors", "ATA attribute 197 Current_Pending_Sector, raw.", None, Gauge, |d| d.smart.pending_sectors.map(Num::U))?;
        self.per_drive(enc, "drivelet_drive_uncorrectable_sectors", "ATA attribute 198 Offline_Uncorrectable, raw.", None, Gauge, |d| {
            d.smart.uncorrectable_sectors.map(Num::U)
        })?;
        self.per_drive(enc, "drivelet_drive_media_errors", "NVMe media and data integrity errors.", None, Counter, |d| d.smart.media_errors.map(Num::U))?;
        self.per_drive(enc, "drivelet_drive_crc_errors", "ATA attribute 199 UDMA_CRC_Error_Count, raw: interface CRC errors.", None, Counter, |d| d.smart.crc_errors.map(Num::U))?;
        self.per_drive(enc, "drivelet_drive_power_on", "The drive's power-on time (SMART power-on hours).", Some(Unit::Seconds), Counter, |d| {
            d.smart.power_on_hours.map(|h| Num::U(h.saturating_mul(3600)))
        })?;
        Ok(())
    }

    fn encode_volumes(&self, enc: &mut DescriptorEncoder) -> fmt::Result {
        let rows = self
            .volumes
            .iter()
            .map(|v| {
                let access = if v.block { "block" } else { "mount" };
                let more = [("pv", v.pv.as_str()), ("claim_namespace", v.claim_namespace.as_str()), ("claim", v.claim.as_str()), ("access", access), ("fs", v.fs.as_str())];
                ((self.volume_labels(v), more), Num::U(1))
            })
            .collect();
        family(enc, "drivelet_volume_info", "A volume on the node: the PV and claim it serves, when known, its access and filesystem (always 1).", None, MetricType::Gauge, rows)?;
        self.per_volume(enc, "drivelet_volume_size", "Size of the volume.", Some(Unit::Bytes), |v| Some(Num::U(v.size)))?;
        self.per_volume(enc, "drivelet_volume_abnormal", "1 when the volume's condition is abnormal (CSI VolumeCondition), else 0.", None, |v| Some(Num::U(u64::from(v.abnormal))))?;
        let rows = self
            .volumes
            .iter()
            .filter(|v| v.abnormal)
            .flat_map(|v| v.reasons.iter().map(move |r| ((self.volume_labels(v), [("reason", *r)]), Num::U(1))))
            .collect();
        family(enc, "drivelet_volume_condition_reason", "A reason an abnormal volume's condition gives (always 1; one series per reason).", None, MetricType::Gauge, rows)?;
        let rows = self
            .volumes
            .iter()
            .filter_map(|v| v.moving.as_ref().map(|(to, done)| ((self.volume_labels(v), [("to_drive", to.as_str())]), Num::F(*done))))
            .collect();
        family(enc, "drivelet_volume_move_progress", "How far the copy of a moving volume is: bytes written and verified over twice its size.", ratio(), MetricType::Gauge, rows)?;
        let mut rows = Vec::new();
        for e in &self.evacuations {
            for (state, n) in [("moved", e.moved), ("moving", e.moving), ("queued", e.queued), ("waiting", e.waiting), ("failed", e.failed)] {
                rows.push(([("node", self.node.as_str()), ("drive", e.drive.as_str()), ("state", state)], Num::U(n)));
            }
        }
        family(enc, "drivelet_drive_evacuation_volumes", "Volumes of a drive being evacuated, by where they stand.", None, MetricType::Gauge, rows)
    }
}

impl Collector for Gauges {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        self.encode_aggregates(&mut enc)?;
        self.encode_drives(&mut enc)?;
        self.encode_volumes(&mut enc)
    }
}
