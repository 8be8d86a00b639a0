//! Benchmark: how fast an evacuation moves volumes, and what a move costs beyond the copy.
//! Real binary, real loop drives, real udev.
//!
//! A drive holding four 1 GiB block volumes (each written whole with incompressible
//! bytes, so nothing is sparse) is evacuated to an empty drive (`ctl drive evacuate`);
//! timed from the request until the drive is released, and per move as drivelet
//! measured it (`ctl evacuations -o json`: bytes, milliseconds). The copy reads the
//! source once and reads the copy back once to verify: each move moves 2x its size
//! through the page-cache-free (O_DIRECT) path.
//!
//! Run (as root): `cargo bench --bench evacuate -- [ROUNDS]` (default 3; each round on
//! fresh drives; the median is shown).

#[path = "../tests/integration/common/mod.rs"]
#[allow(dead_code)]
mod common;

use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

fn ctl_json(agent: &Agent, args: &[&str]) -> serde_json::Value {
    let out = Command::new(bin()).args(["ctl", "--socket", agent.admin_socket.to_str().unwrap()]).args(args).output().unwrap();
    assert!(out.status.success(), "ctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("json")
}

fn main() {
    let rounds: usize = std::env::args().skip(1).find(|a| !a.starts_with('-')).and_then(|a| a.parse().ok()).unwrap_or(3);
    require_host();
    const VOLS: usize = 4;
    let chunk: Vec<u8> = (0..(4 << 20)).map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let (mut totals, mut per_move, mut rates) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let tmp = short_tempdir();
        let a = LoopDrive::new(tmp.path(), "a.img", 6 * GIB);
        let b = LoopDrive::new(tmp.path(), "b.img", 6 * GIB);
        sh("udevadm", &["settle"]);
        let agent = Agent::start(tmp.path(), AgentOpts { extra_toml: "[health]\ninterval = \"1h\"\n".into(), ..Default::default() });
        agent.wait_drives_clean();
        let rt = rt();
        let mut c = rt.block_on(Csi::connect(&agent));
        let mut ids = Vec::new();
        for i in 0..VOLS {
            let id = rt.block_on(c.ctrl.create_volume(create_req(&format!("bench-evac-{round}-{i}"), GIB, block_cap()))).expect("create").into_inner().volume.unwrap().volume_id;
            ids.push(id);
        }
        let vols = agent.ctl_volumes();
        let src = vols[0]["drive_id"].as_str().unwrap().to_string();
        let src_dev = if drive_id_of(&agent, &a) == src { &a } else { &b };
        for v in vols.as_array().unwrap() {
            assert_eq!(v["drive_id"], src.as_str(), "all on one drive");
            let dev = drivelet::disk::blkpg::ensure_kernel_partition(&src_dev.dev, v["start"].as_u64().unwrap(), v["size"].as_u64().unwrap()).unwrap().devnode;
            let mut f = std::fs::OpenOptions::new().write(true).open(&dev).unwrap();
            for _ in 0..(GIB / chunk.len() as u64) {
                f.write_all(&chunk).unwrap();
            }
            f.sync_all().unwrap();
        }
        sh("sync", &[]);
        let t = Instant::now();
        let out = Command::new(bin()).args(["ctl", "--socket", agent.admin_socket.to_str().unwrap(), "drive", "evacuate", &src]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        loop {
            let d = ctl_drive(&agent, &src);
            if d["usage"] == "released" {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(600), "evacuated within 10 min");
            std::thread::sleep(Duration::from_millis(20));
        }
        let total = t.elapsed();
        totals.push(total);
        let ev = ctl_json(&agent, &["evacuations", "-o", "json"]);
        for m in ev[0]["moved"].as_array().unwrap() {
            let (bytes, ms) = (m["bytes"].as_u64().unwrap(), m["millis"].as_u64().unwrap());
            per_move.push(Duration::from_millis(ms));
            rates.push(bytes as f64 / (1 << 30) as f64 / (ms.max(1) as f64 / 1000.0));
        }
        drop(agent);
    }
    totals.sort();
    per_move.sort();
    rates.sort_by(|x, y| x.partial_cmp(y).unwrap());
    println!("evacuation of {VOLS} x 1 GiB block volumes, {rounds} rounds (median):");
    println!("  request -> drive released:      {:.2} s", totals[totals.len() / 2].as_secs_f64());
    println!("  one move (copy, verify, switch): {:.2} s", per_move[per_move.len() / 2].as_secs_f64());
    println!("  moved per second:                {:.2} GiB/s (each GiB read, written and read back)", rates[rates.len() / 2]);
}
