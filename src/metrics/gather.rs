//! Turns what the actors answered at scrape time (the inventory's drives, the volume
//! manager's [`VolumesScrape`], the attach queue's counts) into a [`Gauges`] snapshot.
//! Pure: the HTTP endpoint asks, this only reads.
//!
//! Rules:
//! - a managed drive's room is the placement model's (the same candidates and the same
//!   functions as GetCapacity and CreateVolume): free bytes are its aligned free extents
//!   with volumes, kernel partitions, moves and space being cleaned counted as used;
//!   allocatable is the largest volume [`placement::capacity`] offers on that drive
//!   alone (0 when closed: cordoned, releasing, released or BAD); before the volume
//!   manager is ready, the inventory's own free figures and nothing allocatable;
//! - a managed drive's free partition-table slots are the placement model's too
//!   ([`placement::free_slots`]); with none left its free bytes and allocatable are 0;
//! - a drive's usage and volumes come from the volume manager; its class, health and
//!   SMART figures from the inventory.

use std::collections::HashMap;

use super::gauges::{DriveFigures, EvacuationFigures, Gauges, ManagedFigures, VolumeFigures};
use crate::actors::inventory::model::Drive;
use crate::actors::volumes::evacuate::PendingState;
use crate::actors::volumes::placement;
use crate::actors::volumes::VolumesScrape;
use crate::words::{DriveClass, LayoutKind};

/// The snapshot of one scrape. `attach`: the attach queue's (waiting, running, retries,
/// relists) when it runs.
pub(crate) fn gauges(node: &str, ready: bool, drives: &[Drive], s: &VolumesScrape, attach: Option<(usize, usize, u64, u64)>) -> Gauges {
    let uses: HashMap<&str, _> = s.uses.iter().map(|u| (u.drive_id.as_str(), u.state)).collect();
    let cleaning: HashMap<&str, u64> = s.cleaning.iter().map(|c| (c.drive_id.as_str(), c.left_bytes)).collect();
    let rooms: HashMap<&str, _> = s.view.drives().iter().map(|r| (r.drive.id.as_str(), r)).collect();
    let mut on_drive: HashMap<&str, u64> = HashMap::new();
    for v in s.view.volumes() {
        *on_drive.entry(v.record.drive_id.as_str()).or_default() += 1;
    }
    let ready_view = s.view.is_ready();

    let mut g = Gauges { node: node.to_string(), ready, attach, ..Gauges::default() };
    for d in drives {
        let usage = uses.get(d.id.as_str()).copied();
        let key = (d.class.as_str().to_string(), d.health.health.as_str().to_string(), usage.map_or("active", |u| u.as_str()).to_string());
        *g.drives_by_state.entry(key).or_default() += 1;
        let managed = (d.class == DriveClass::Managed).then(|| {
            let (free, largest_free, allocatable, slots_free) = match rooms.get(d.id.as_str()) {
                Some(r) => {
                    let c = r.candidate();
                    let extents = placement::room_on(&c, LayoutKind::Partition, 0);
                    let cap = placement::capacity(std::slice::from_ref(&c), None, LayoutKind::Partition, 1);
                    (extents.iter().map(|e| e.1).sum(), extents.iter().map(|e| e.1).max().unwrap_or(0), cap.maximum_volume_size, placement::free_slots(&c))
                }
                None => (d.free_bytes, d.largest_free_bytes, 0, d.slots_free),
            };
            let volumes = if ready_view { on_drive.get(d.id.as_str()).copied().unwrap_or(0) } else { u64::from(d.volumes) };
            ManagedFigures {
                usage,
                free,
                largest_free,
                allocatable,
                cleaning: cleaning.get(d.id.as_str()).copied().unwrap_or(0),
                volumes,
                slots_free: u64::from(slots_free),
                slots: u64::from(d.partition_slots),
            }
        });
        g.drives.push(DriveFigures {
            id: d.id.clone(),
            serial: d.serial.clone().unwrap_or_default(),
            model: d.model.clone().unwrap_or_default(),
            media: d.media,
            path: d.path.display().to_string(),
            transport: d.transport.clone(),
            size: d.size_bytes,
            class: d.class,
            health: d.health.health,
            checked_unix: d.health.checked_unix,
            smart: d.health.smart,
            managed,
        });
    }

    let moving = s.moving.as_ref();
    for v in s.view.volumes() {
        let (r, c) = (&v.record, &v.condition);
        let condition = if c.abnormal { "abnormal" } else { "normal" };
        *g.volumes_by_state.entry((r.state.as_str().to_string(), condition.to_string())).or_default() += 1;
        g.volumes.push(VolumeFigures {
            id: r.id.clone(),
            drive: r.drive_id.clone(),
            pv: r.binding.pv.clone(),
            claim_namespace: r.binding.claim_namespace.clone(),
            claim: r.binding.claim_name.clone(),
            block: r.block,
            fs: if r.block { String::new() } else { r.fs_type.clone() },
            size: r.size,
            abnormal: c.abnormal,
            reasons: if c.abnormal { c.entries.iter().map(|e| e.reason.kebab()).collect() } else { Vec::new() },
            moving: moving.filter(|m| m.volume_id == r.id).map(|m| (m.to_drive.clone(), m.ratio())),
        });
    }

    for snap in &s.snapshots {
        let e = g.snapshots.entry(snap.state.as_str().to_string()).or_default();
        e.0 += 1;
        e.1 += snap.size;
    }

    for e in &s.evacuations {
        let count = |st: PendingState| e.pending.iter().filter(|p| p.state == st).count() as u64;
        g.evacuations.push(EvacuationFigures {
            drive: e.drive_id.clone(),
            moved: e.moved.len() as u64,
            moving: count(PendingState::Moving),
            queued: count(PendingState::Queued),
            waiting: count(PendingState::Waiting),
            failed: count(PendingState::Failed),
        });
    }
    g
}
