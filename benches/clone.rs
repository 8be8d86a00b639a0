//! Benchmark: how long a clone takes, and how much it writes, for volumes of several
//! sizes holding several amounts of data. Real binary, real loop drive, real udev.
//!
//! For each filesystem (ext4, xfs) and each (volume size, data) pair, a source volume
//! is made, staged, filled with `data` MiB of incompressible bytes, unstaged, and
//! cloned at its own size (CreateVolume with a source, timed from the call to the
//! answer); the bytes written to the drive meanwhile come from the kernel's disk
//! statistics. A block volume is cloned whole for comparison. Prints one row per case:
//! time and MiB written, so it shows that a filesystem clone costs what the data costs,
//! not what the volume's size does.
//!
//! Then clones of volumes in use: for ext4 and xfs, a source is staged, filled, and
//! kept staged while a thread appends to a file on it without pause; it is cloned (the
//! default class freezes it for the copy). Prints the clone's time, the freeze drivelet
//! recorded (the clone's `copied_in_use`), and the writer's longest pause between two
//! writes, as the writer saw it.
//!
//! Run (as root): `cargo bench --bench clone -- [ROUNDS] [in-use]` (default 3 rounds; the
//! median is shown; `in-use` runs only the clones of volumes in use).

#[path = "../tests/integration/common/mod.rs"]
#[allow(dead_code)]
mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::*;
use drivelet::grpc::proto::csi;

fn clone_req(name: &str, bytes: u64, cap: csi::VolumeCapability, source: &str) -> csi::CreateVolumeRequest {
    let mut q = create_req(name, bytes, cap);
    q.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(csi::volume_content_source::VolumeSource { volume_id: source.into() })),
    });
    q
}

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
    let mut call = |q: csi::CreateVolumeRequest| rt.block_on(c.ctrl.create_volume(q)).expect("create").into_inner().volume.unwrap().volume_id;
    let chunk: Vec<u8> = (0..(1 << 20)).map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    println!("{:<6} {:>10} {:>10} {:>12} {:>14}", "kind", "volume", "data", "clone time", "MiB written");
    let only_in_use = std::env::args().any(|a| a == "in-use");
    let cases: &[(&str, u64, u64)] = if only_in_use {
        &[]
    } else {
        &[("ext4", 1, 0), ("ext4", 1, 64), ("ext4", 4, 64), ("ext4", 4, 512), ("xfs", 1, 64), ("xfs", 4, 64), ("xfs", 4, 512), ("block", 1, 0), ("block", 4, 0)]
    };
    for (n, &(kind, gib, data)) in cases.iter().enumerate() {
        let block = kind == "block";
        let cap = if block { block_cap() } else { mount_cap(kind) };
        let src = call(create_req(&format!("bench-src-{n}"), gib * GIB, cap.clone()));
        if !block {
            let mut nc = rt.block_on(Csi::connect(&agent));
            rt.block_on(nc.node.node_stage_volume(stage_req(&src, &staging, cap.clone()))).expect("stage");
            fill(&staging, &chunk, data);
            let q = csi::NodeUnstageVolumeRequest { volume_id: src.clone(), staging_target_path: staging.display().to_string() };
            rt.block_on(nc.node.node_unstage_volume(q)).expect("unstage");
        }
        let mut times = Vec::new();
        let mut written = Vec::new();
        for round in 0..rounds {
            sh("sync", &[]);
            let before = sectors_written(&drive.dev);
            let t = Instant::now();
            let id = call(clone_req(&format!("bench-clone-{n}-{round}"), gib * GIB, cap.clone(), &src));
            times.push(t.elapsed());
            written.push(((sectors_written(&drive.dev) - before) * 512) >> 20);
            rt.block_on(c_delete(&agent, &id));
        }
        rt.block_on(c_delete(&agent, &src));
        times.sort();
        written.sort();
        let data = if block { "-".to_string() } else { format!("{data} MiB") };
        println!("{kind:<6} {:>10} {data:>10} {:>12} {:>14}", format!("{gib} GiB"), fmt(times[times.len() / 2]), written[written.len() / 2]);
    }

    println!();
    println!("{:<6} {:>10} {:>10} {:>12} {:>14} {:>16}", "in use", "volume", "data", "clone time", "freeze", "writer's pause");
    for (n, &(kind, gib, data)) in [("ext4", 1, 64), ("ext4", 4, 512), ("xfs", 1, 64), ("xfs", 4, 512)].iter().enumerate() {
        let cap = mount_cap(kind);
        let src = call(create_req(&format!("bench-busy-{n}"), gib * GIB, cap.clone()));
        let mut nc = rt.block_on(Csi::connect(&agent));
        rt.block_on(nc.node.node_stage_volume(stage_req(&src, &staging, cap.clone()))).expect("stage");
        fill(&staging, &chunk, data);
        let (mut times, mut frozen, mut pauses) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (s, log) = (stop.clone(), staging.join(format!("log-{round}")));
            let writer = std::thread::spawn(move || {
                let mut f = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
                let (mut longest, mut last) = (Duration::ZERO, Instant::now());
                while !s.load(std::sync::atomic::Ordering::Relaxed) {
                    f.write_all(b"a line of a log\n").unwrap();
                    longest = longest.max(last.elapsed());
                    last = Instant::now();
                }
                longest
            });
            std::thread::sleep(Duration::from_millis(200));
            let t = Instant::now();
            let id = call(clone_req(&format!("bench-busy-clone-{n}-{round}"), gib * GIB, cap.clone(), &src));
            times.push(t.elapsed());
            std::thread::sleep(Duration::from_millis(100));
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            pauses.push(writer.join().unwrap());
            let vols = agent.ctl_volumes();
            let rec = vols.as_array().unwrap().iter().find(|v| v["id"] == id.as_str()).cloned().unwrap_or_default();
            frozen.push(rec["copied_in_use"]["frozen"]["millis"].as_u64().unwrap_or(u64::MAX));
            rt.block_on(c_delete(&agent, &id));
        }
        let q = csi::NodeUnstageVolumeRequest { volume_id: src.clone(), staging_target_path: staging.display().to_string() };
        rt.block_on(nc.node.node_unstage_volume(q)).expect("unstage");
        rt.block_on(c_delete(&agent, &src));
        times.sort();
        frozen.sort();
        pauses.sort();
        println!(
            "{kind:<6} {:>10} {:>10} {:>12} {:>14} {:>16}",
            format!("{gib} GiB"),
            format!("{data} MiB"),
            fmt(times[times.len() / 2]),
            format!("{} ms", frozen[frozen.len() / 2]),
            format!("{} ms", pauses[pauses.len() / 2].as_millis())
        );
    }
}

/// Writes `mib` times `chunk` into `data` under `staging`, fsynced.
fn fill(staging: &std::path::Path, chunk: &[u8], mib: u64) {
    let mut f = std::fs::File::create(staging.join("data")).unwrap();
    for _ in 0..mib {
        f.write_all(chunk).unwrap();
    }
    f.sync_all().unwrap();
}

async fn c_delete(agent: &Agent, id: &str) {
    let mut c = Csi::connect(agent).await;
    c.ctrl.delete_volume(csi::DeleteVolumeRequest { volume_id: id.into(), ..Default::default() }).await.expect("delete");
}

fn fmt(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}
