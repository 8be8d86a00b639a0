//! Benchmark: how long a snapshot and a restore take, and how much each writes, for a
//! 4 GiB volume holding 64 MiB; and how long a frozen filesystem stalls its writers.
//! Real binary, real loop drive, real udev.
//!
//! For ext4 and xfs a 4 GiB source is made, staged, filled with 64 MiB of
//! incompressible bytes and unstaged; it is snapshotted (CreateSnapshot, timed from the
//! call to the answer) and restored at its size (CreateVolume from the snapshot); the
//! bytes written to the drive meanwhile come from the kernel's disk statistics. Then the
//! source is staged again, a writer appends to it, and it is snapshotted under a freeze
//! (`drivelet.io/freeze: "true"`): the stall is what drivelet measured from freeze to
//! thaw (`ctl snapshots -o json`, `freeze_millis`). A 4 GiB block volume is snapshotted
//! and restored whole for comparison.
//!
//! Run (as root): `cargo bench --bench snapshot -- [ROUNDS]` (default 3; the median is shown).

#[path = "../tests/integration/common/mod.rs"]
#[allow(dead_code)]
mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::*;
use drivelet::grpc::proto::csi;

fn main() {
    let rounds: usize = std::env::args().skip(1).find(|a| !a.starts_with('-')).and_then(|a| a.parse().ok()).unwrap_or(3);
    require_host();
    let tmp = short_tempdir();
    let drive = LoopDrive::new(tmp.path(), "a.img", 24 * GIB);
    let agent = Agent::start(tmp.path(), AgentOpts { extra_toml: "[health]\ninterval = \"1h\"\n".into(), ..Default::default() });
    let _unmount = Unmounter(tmp.path().join("kubelet"));
    let staging = tmp.path().join("kubelet/stage");
    let rt = rt();
    let mut c = rt.block_on(Csi::connect(&agent));
    let chunk: Vec<u8> = (0..(1 << 20)).map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let written_since = |before: u64| ((sectors_written(&drive.dev) - before) * 512) >> 20;
    println!("{:<6} {:>8} {:>6} {:>14} {:>12} {:>14} {:>12} {:>13}", "kind", "volume", "data", "snapshot time", "MiB written", "restore time", "MiB written", "freeze stall");
    for kind in ["ext4", "xfs", "block"] {
        let block = kind == "block";
        let cap = if block { block_cap() } else { mount_cap(kind) };
        let src = rt.block_on(c.ctrl.create_volume(create_req(&format!("bench-src-{kind}"), 4 * GIB, cap.clone()))).expect("create").into_inner().volume.unwrap().volume_id;
        if !block {
            rt.block_on(c.node.node_stage_volume(stage_req(&src, &staging, cap.clone()))).expect("stage");
            {
                let mut f = std::fs::File::create(staging.join("data")).unwrap();
                for _ in 0..64 {
                    f.write_all(&chunk).unwrap();
                }
                f.sync_all().unwrap();
            }
            rt.block_on(c.node.node_unstage_volume(unstage_req(&src, &staging))).expect("unstage");
        }
        let (mut st, mut sw, mut rtm, mut rw, mut stalls) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            sh("sync", &[]);
            let before = sectors_written(&drive.dev);
            let t = Instant::now();
            let snap = rt.block_on(c.ctrl.create_snapshot(snapshot_req(&format!("bench-snap-{kind}-{round}"), &src, &[]))).expect("snapshot").into_inner().snapshot.unwrap();
            st.push(t.elapsed());
            sw.push(written_since(before));
            sh("sync", &[]);
            let before = sectors_written(&drive.dev);
            let t = Instant::now();
            let v = rt.block_on(c.ctrl.create_volume(restore_req(&format!("bench-restore-{kind}-{round}"), 4 * GIB, 0, cap.clone(), &snap.snapshot_id))).expect("restore").into_inner().volume.unwrap();
            rtm.push(t.elapsed());
            rw.push(written_since(before));
            rt.block_on(c.ctrl.delete_volume(del_req(&v.volume_id))).expect("delete");
            rt.block_on(c.ctrl.delete_snapshot(csi::DeleteSnapshotRequest { snapshot_id: snap.snapshot_id, ..Default::default() })).expect("delete snapshot");
            if !block {
                // Under a freeze while a writer appends.
                rt.block_on(c.node.node_stage_volume(stage_req(&src, &staging, cap.clone()))).expect("stage");
                let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
                let w = {
                    let (stop, p) = (stop.clone(), staging.join("log"));
                    std::thread::spawn(move || {
                        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(p).unwrap();
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            f.write_all(b"a line of log\n").unwrap();
                        }
                    })
                };
                std::thread::sleep(Duration::from_millis(200));
                let name = format!("bench-frozen-{kind}-{round}");
                let snap = rt.block_on(c.ctrl.create_snapshot(snapshot_req(&name, &src, &[("drivelet.io/freeze", "true")]))).expect("frozen snapshot").into_inner().snapshot.unwrap();
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                w.join().unwrap();
                let out = std::process::Command::new(bin()).args(["ctl", "--socket", agent.admin_socket.to_str().unwrap(), "snapshots", "-o", "json"]).output().unwrap();
                let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ctl snapshots json");
                let ms = listed.as_array().unwrap().iter().find(|s| s["id"] == snap.snapshot_id.as_str()).and_then(|s| s["freeze_millis"].as_u64()).expect("a stall");
                stalls.push(ms);
                rt.block_on(c.ctrl.delete_snapshot(csi::DeleteSnapshotRequest { snapshot_id: snap.snapshot_id, ..Default::default() })).expect("delete snapshot");
                rt.block_on(c.node.node_unstage_volume(unstage_req(&src, &staging))).expect("unstage");
            }
        }
        rt.block_on(c.ctrl.delete_volume(del_req(&src))).expect("delete");
        let med = |v: &mut Vec<Duration>| {
            v.sort();
            format!("{:.2} s", v[v.len() / 2].as_secs_f64())
        };
        let medn = |v: &mut Vec<u64>| {
            v.sort();
            v.get(v.len() / 2).copied()
        };
        let data = if block { "-" } else { "64 MiB" };
        let stall = medn(&mut stalls).map(|m| format!("{m} ms")).unwrap_or_else(|| "-".into());
        println!(
            "{kind:<6} {:>8} {data:>6} {:>14} {:>12} {:>14} {:>12} {stall:>13}",
            "4 GiB",
            med(&mut st),
            medn(&mut sw).unwrap(),
            med(&mut rtm),
            medn(&mut rw).unwrap()
        );
    }
}
