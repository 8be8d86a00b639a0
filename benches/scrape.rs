//! Benchmark: what writing the `/metrics` exposition costs, without the agent: the
//! OpenMetrics text of a [`Gauges`] snapshot of V volumes on D drives, each drive with a
//! full set of SMART figures (the most series a drive has), every tenth volume abnormal
//! with two reasons, one volume moving and one drive being evacuated, plus the process
//! counters of 20 CSI methods. Pure computation: no root, no drives.
//!
//! For each (V, D): the p50 and p99 of [`RUNS`] renders (the snapshot is built before
//! each and not timed), the bytes written and the series (sample lines).
//!
//! Run: `cargo bench --bench scrape` (V = 3 on 3 drives, 1000 on 64, 10000 on 79). The
//! real agent's scrape (actor round trips, HTTP) is in `benches/scale.rs`.

use std::time::{Duration, Instant};

use drivelet::cli::bench::Histogram;
use drivelet::disk::smart::SmartFigures;
use drivelet::metrics::{DriveFigures, EvacuationFigures, Format, Gauges, ManagedFigures, Metrics, VolumeFigures};
use drivelet::words::{DriveClass, DriveUseState, Health, Media};

const RUNS: usize = 200;
const GIB: u64 = 1 << 30;

fn snapshot(volumes: usize, drives: usize) -> Gauges {
    let mut g = Gauges { node: "node-a.example.internal".into(), ready: true, ..Gauges::default() };
    for d in 0..drives {
        g.drives.push(DriveFigures {
            id: format!("wwn-0x5000c500a1b2{d:04x}"),
            serial: format!("ZA1B{d:04}XYZ"),
            model: "ST8000NM0055-1RM112".into(),
            media: Media::Hdd,
            path: format!("/dev/sd{d}"),
            transport: "sata".into(),
            size: 8000 * GIB,
            class: DriveClass::Managed,
            health: Health::Good,
            checked_unix: 1_760_000_000,
            smart: SmartFigures {
                temperature_c: Some(31),
                power_on_hours: Some(40_000),
                percentage_used: Some(4),
                reallocated_sectors: Some(0),
                pending_sectors: Some(0),
                uncorrectable_sectors: Some(0),
                crc_errors: Some(0),
                media_errors: Some(0),
            },
            managed: Some(ManagedFigures {
                usage: (d == 0).then_some(DriveUseState::Releasing),
                free: 4000 * GIB,
                largest_free: 3000 * GIB,
                allocatable: if d == 0 { 0 } else { 3000 * GIB },
                cleaning: 0,
                volumes: (volumes / drives) as u64,
                slots_free: 255u64.saturating_sub((volumes / drives) as u64),
                slots: 255,
            }),
        });
        *g.drives_by_state.entry(("managed".into(), "good".into(), "active".into())).or_default() += 1;
    }
    for v in 0..volumes {
        let abnormal = v % 10 == 0;
        g.volumes.push(VolumeFigures {
            id: format!("3f2a9c1e-5b7d-4e8f-a1b2-{v:012}"),
            drive: g.drives[v % drives].id.clone(),
            pv: format!("pvc-8d1e2f3a-{v:08}"),
            claim_namespace: "shop".into(),
            claim: format!("data-orders-{v}"),
            block: false,
            fs: "ext4".into(),
            size: 10 * GIB,
            abnormal,
            reasons: if abnormal { vec!["drive-suspect", "filesystem-full"] } else { Vec::new() },
            moving: (v == 1).then(|| (g.drives[(v + 1) % drives].id.clone(), 0.4)),
        });
        *g.volumes_by_state.entry(("published".into(), if abnormal { "abnormal" } else { "normal" }.into())).or_default() += 1;
    }
    g.evacuations.push(EvacuationFigures { drive: g.drives[0].id.clone(), moved: 3, moving: 1, queued: 4, waiting: 2, failed: 0 });
    g
}

fn main() {
    let counters = Metrics::default();
    let methods = [
        "CreateVolume", "DeleteVolume", "ControllerPublishVolume", "ControllerUnpublishVolume", "ValidateVolumeCapabilities", "ListVolumes",
        "GetCapacity", "ControllerGetCapabilities", "CreateSnapshot", "DeleteSnapshot", "ListSnapshots", "ControllerExpandVolume",
        "ControllerGetVolume", "NodeStageVolume", "NodeUnstageVolume", "NodePublishVolume", "NodeUnpublishVolume", "NodeGetVolumeStats",
        "NodeGetCapabilities", "Probe",
    ];
    for (i, m) in methods.iter().enumerate() {
        for code in [0, 5, 10] {
            counters.record_rpc(m, code, Duration::from_micros(100 * (i as u64 + 1)));
        }
    }
    println!("| volumes | drives | render p50 (ms) | render p99 (ms) | bytes | series |");
    println!("|---|---|---|---|---|---|");
    for (volumes, drives) in [(3, 3), (1000, 64), (10000, 79)] {
        let mut h = Histogram::new();
        let mut text = String::new();
        for _ in 0..RUNS + 5 {
            let g = snapshot(volumes, drives);
            let t = Instant::now();
            text = counters.render(g, Format::OpenMetrics);
            h.record(t.elapsed());
        }
        let series = text.lines().filter(|l| !l.starts_with('#')).count();
        let ms = |q: f64| Duration::from_nanos(h.percentile(q).unwrap_or(0)).as_secs_f64() * 1000.0;
        println!("| {volumes} | {drives} | {:.3} | {:.3} | {} | {series} |", ms(0.5), ms(0.99), text.len());
    }
}
