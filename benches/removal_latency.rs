//! Benchmark: how long after a drive disappears its volume's condition turns abnormal
//! in `ControllerGetVolume`. Real binary, real loop drive, real udev.
//!
//! Each round detaches the loop device under an unstaged volume (`losetup -d`, a real
//! removal), polls `ControllerGetVolume` until the condition is abnormal, then
//! re-attaches the same backing file and waits for the condition to clear. Prints
//! p50/p90/p99/max over the rounds.
//!
//! Run (as root): `cargo bench --bench removal_latency -- [ROUNDS]` (default 100).

#[path = "../tests/common/mod.rs"]
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
    let mut lat = Vec::with_capacity(rounds);
    for round in 0..rounds {
        assert_eq!(condition(&rt, &mut c, &id), Some(false), "round {round}: normal before the removal");
        let t0 = Instant::now();
        drive.detach();
        loop {
            if condition(&rt, &mut c, &id) == Some(true) {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "round {round}: removal not seen within 10 s");
        }
        lat.push(t0.elapsed());
        drive.dev = PathBuf::from(sh("losetup", &["--find", "--show", "--partscan", file.to_str().unwrap()]));
        let t1 = Instant::now();
        while condition(&rt, &mut c, &id) != Some(false) {
            assert!(t1.elapsed() < Duration::from_secs(10), "round {round}: the drive's return not seen within 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    lat.sort();
    println!(
        "drive removal -> abnormal condition in ControllerGetVolume, {rounds} rounds: p50 {:?}  p90 {:?}  p99 {:?}  max {:?}",
        percentile(&lat, 0.5),
        percentile(&lat, 0.9),
        percentile(&lat, 0.99),
        lat[lat.len() - 1]
    );
    println!("budget: 1 s");
}
