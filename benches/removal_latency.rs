//! Benchmark: how long after a drive disappears its volume's condition turns abnormal
//! in `ControllerGetVolume` (CSI v1.12) and its health shows `DriveMissing` in
//! `ControllerGetVolumeHealth` (CSI v1.13). Real binary, real loop drive, real udev.
//!
//! Each round detaches the loop device under an unstaged volume (`losetup -d`, a real
//! removal), polls both RPCs in turn until each reports the removal, then re-attaches
//! the same backing file and waits for both to clear. Prints p50/p90/p99/max over the
//! rounds for each generation.
//!
//! Run (as root): `cargo bench --bench removal_latency -- [ROUNDS]` (default 100).

#[path = "../tests/integration/common/mod.rs"]
#[allow(dead_code)]
mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use drivelet::grpc::proto::csi;

fn condition(rt: &tokio::runtime::Runtime, c: &mut Csi, id: &str) -> Option<bool> {
    rt.block_on(async {
        let r = c.ctrl.controller_get_volume(csi::ControllerGetVolumeRequest { volume_id: id.into() }).await.ok()?;
        r.into_inner().status?.volume_condition.map(|v| v.abnormal)
    })
}

/// Whether the v1.13 health of the volume reports an adverse condition.
fn health(rt: &tokio::runtime::Runtime, c: &mut Csi, id: &str) -> Option<bool> {
    rt.block_on(async {
        let req = csi::ControllerGetVolumeHealthRequest { volume_id: id.into(), ..Default::default() };
        let r = c.ctrl.controller_get_volume_health(req).await.ok()?;
        r.into_inner().volume_health.map(|h| h.health_statuses.iter().any(|e| e.reason == "DriveMissing"))
    })
}

fn report(what: &str, rounds: usize, lat: &mut [Duration]) {
    lat.sort();
    println!(
        "drive removal -> {what}, {rounds} rounds: p50 {:?}  p90 {:?}  p99 {:?}  max {:?}",
        percentile(lat, 0.5),
        percentile(lat, 0.9),
        percentile(lat, 0.99),
        lat[lat.len() - 1]
    );
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let rounds: usize = std::env::args().skip(1).find(|a| !a.starts_with('-')).and_then(|a| a.parse().ok()).unwrap_or(100);
    require_host();
    let tmp = short_tempdir();
    let mut drive = LoopDrive::new(tmp.path(), "a.img", 256 * MIB);
    let agent = Agent::start(tmp.path(), AgentOpts { extra_toml: "[health]\ninterval = \"1h\"\n".into(), ..Default::default() });
    let rt = rt();
    let mut c = rt.block_on(Csi::connect(&agent));
    let id = rt.block_on(async {
        c.ctrl.create_volume(create_req("bench-vol", 16 * MIB, block_cap())).await.expect("create").into_inner().volume.unwrap().volume_id
    });
    let file: PathBuf = drive.file.clone();
    let (mut v12, mut v13) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    for round in 0..rounds {
        assert_eq!(condition(&rt, &mut c, &id), Some(false), "round {round}: normal before the removal");
        assert_eq!(health(&rt, &mut c, &id), Some(false), "round {round}: no health entry before the removal");
        let t0 = Instant::now();
        drive.detach();
        let (mut seen12, mut seen13) = (None, None);
        while seen12.is_none() || seen13.is_none() {
            if seen12.is_none() && condition(&rt, &mut c, &id) == Some(true) {
                seen12 = Some(t0.elapsed());
            }
            if seen13.is_none() && health(&rt, &mut c, &id) == Some(true) {
                seen13 = Some(t0.elapsed());
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "round {round}: removal not seen within 10 s (v1.12 {seen12:?}, v1.13 {seen13:?})");
        }
        v12.extend(seen12);
        v13.extend(seen13);
        drive.dev = PathBuf::from(sh("losetup", &["--find", "--show", "--partscan", file.to_str().unwrap()]));
        let t1 = Instant::now();
        while condition(&rt, &mut c, &id) != Some(false) || health(&rt, &mut c, &id) != Some(false) {
            assert!(t1.elapsed() < Duration::from_secs(10), "round {round}: the drive's return not seen within 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    report("abnormal condition in ControllerGetVolume (CSI v1.12)", rounds, &mut v12);
    report("DriveMissing in ControllerGetVolumeHealth (CSI v1.13)", rounds, &mut v13);
    println!("budget: 1 s");
}
