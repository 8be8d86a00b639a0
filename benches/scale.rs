//! Benchmark: how start-up, memory and cheap RPCs grow with the number of volumes.
//! Real binary, real loop drives with real drivelet GPTs, real udev.
//!
//! For each volume count V: 64 sparse 2 GiB loop drives (more when V > 64 x 128: the
//! bench keeps 128 volumes a drive, what a drivelet GPT held before its tables had 256
//! entries; V = 10000 takes 79), each given a drivelet GPT
//! with its share of V partitions of 8 MiB (a drive with no share gets an empty
//! drivelet GPT, as a drive whose volumes were deleted has), written with drivelet's own
//! `disk::gpt::add_partition` into the image files before they are attached (with
//! partition scanning, so the kernel and udev see every partition, as on a real node);
//! a store seeded with one `available` ext4 record per partition, exactly what
//! CreateVolume leaves (never staged, so no fsck and no mount checks), so start-up
//! reconciliation finds every record's partition and has nothing to report or write.
//! Then the release agent is started and measured:
//! - time from spawning the process to Probe ready (the store reconciled with every
//!   drive's GPT);
//! - VmRSS (and VmHWM, the peak) from /proc/PID/status once ready, and after a full
//!   ListVolumes pagination (pages of 500), whose time is measured too; every volume
//!   must come back exactly once with a normal condition;
//! - NodeGetInfo and GetCapacity latency, p50/p99 over 1000 calls each, one after
//!   another over one connection;
//! - a Prometheus scrape of `/metrics`: p50 of [`SCRAPES`] GETs one after another, each
//!   on a new connection as Prometheus makes them (request to last byte), and the bytes
//!   of the exposition.
//!
//! Each V gets one warm-up start and then three measured starts of the agent on the
//! same drives and store; every figure is the median of the three. Then it prints the
//! per-volume cost between consecutive V, to show growth is at most linear.
//!
//! Run (as root): `cargo bench --bench scale -- [V ...]` (default 0 1000 5000 10000;
//! V = 0 is the baseline the per-volume costs are taken against). The agent binary is
//! the one cargo builds for the bench (`target/release/drivelet`, `CARGO_TARGET_DIR`
//! aware), or `$DRIVELET_BIN`.

#[path = "../tests/integration/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use drivelet::actors::inventory::classify::stable_id;

use drivelet::actors::volumes::model::{VolumeRecord, VolumeState};
use drivelet::cli::bench::Histogram;

use drivelet::disk::{gpt, udev::DiskProbe};
use drivelet::grpc::proto::csi;
use drivelet::store::Store;
use drivelet::words::{LayoutKind, Media};

const DRIVE_SIZE: u64 = 2 * GIB;
const VOLUME_SIZE: u64 = 8 * MIB;
const GPT_ENTRIES: usize = 128;
const MIN_DRIVES: usize = 64;
const PAGE: i32 = 500;
const CALLS: usize = 1000;
/// Measured agent starts per volume count (after one warm-up start); figures are medians.
const STARTS: usize = 3;
/// CreateVolume + DeleteVolume rounds (one 8 MiB block volume at a time) per start.
const ROUNDS: usize = 20;
/// Scrapes of `/metrics` per start (after two not counted).
const SCRAPES: usize = 20;

fn agent_bin() -> PathBuf {
    std::env::var_os("DRIVELET_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_drivelet")))
}

/// (VmRSS, VmHWM, RssAnon) of a process, KiB.
fn rss_kib(pid: u32) -> (u64, u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"), field("RssAnon:"))
}

/// One measured run.
#[derive(Debug, Clone, Default)]
struct Figures {
    volumes: usize,
    drives: usize,
    setup_s: f64,
    ready_ms: f64,
    rss_ready_kib: u64,
    hwm_ready_kib: u64,
    rss_listed_kib: u64,
    anon_ready_kib: u64,
    anon_listed_kib: u64,
    list_ms: f64,
    pages: usize,
    ngi_p50_us: f64,
    ngi_p99_us: f64,
    cap_p50_us: f64,
    cap_p99_us: f64,
    create_p50_ms: f64,
    delete_p50_ms: f64,
    scrape_p50_ms: f64,
    scrape_bytes: usize,
}

/// Loop devices of this run, detached on drop.
struct Drives(Vec<PathBuf>);

impl Drop for Drives {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = Command::new("losetup").arg("-d").arg(d).status();
        }
    }
}

/// The agent process, killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Writes the image files with their GPTs and returns the records to seed.
fn make_drives(dir: &Path, volumes: usize, drives: usize) -> (Vec<PathBuf>, Vec<VolumeRecord>) {
    let files: Vec<PathBuf> = (0..drives).map(|i| dir.join(format!("d{i:03}.img"))).collect();
    let (first, _) = gpt::usable_region(DRIVE_SIZE, 512).expect("usable region");
    // Volume j lives on drive j % drives, in slot j / drives.
    let per_drive: Vec<Vec<(usize, String, uuid::Uuid, u64)>> = (0..drives)
        .map(|d| {
            (d..volumes)
                .step_by(drives)
                .enumerate()
                .map(|(slot, j)| {
                    let name = format!("pvc-scale-{j:05}");
                    let guid = gpt::volume_partition_guid(&name);
                    (j, name, guid, first + slot as u64 * VOLUME_SIZE)
                })
                .collect()
        })
        .collect();
    let jobs: Vec<_> = files.iter().zip(&per_drive).collect();
    std::thread::scope(|s| {
        for chunk in jobs.chunks(drives.div_ceil(4).max(1)) {
            s.spawn(move || {
                for (file, parts) in chunk {
                    let f = std::fs::File::create(file).expect("create image");
                    f.set_len(DRIVE_SIZE).expect("size image");
                    drop(f);
                    for (_, name, guid, start) in parts.iter() {
                        gpt::add_partition(file, 512, *guid, &gpt::partition_label(name), *start, VOLUME_SIZE)
                            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
                    }
                    if parts.is_empty() {
                        // An empty drivelet GPT, as a drive whose volumes were all
                        // deleted carries: a blank drive would cost a `blkid -p` probe
                        // at start that a drive in use never does.
                        let guid = uuid::Uuid::new_v4();
                        gpt::add_partition(file, 512, guid, "drivelet:empty", first, VOLUME_SIZE)
                            .and_then(|_| gpt::remove_partition(file, 512, guid))
                            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
                    }
                }
            });
        }
    });
    let mut records = Vec::with_capacity(volumes);
    for (d, parts) in per_drive.into_iter().enumerate() {
        let probe = DiskProbe { loop_backing_file: Some(files[d].clone()), ..Default::default() };
        let drive_id = stable_id(&probe);
        for (_, name, guid, start) in parts {
            records.push(VolumeRecord {
                id: guid.to_string(),
                name,
                drive_id: drive_id.clone(),
                part_guid: guid,
                start,
                size: VOLUME_SIZE,
                layout: LayoutKind::Partition,
                media: Media::Virtual,
                block: false,
                fs_type: "ext4".into(),
                // What the provisioner passes from the suite's StorageClasses.
                parameters: [("layout", "partition"), ("media", "virtual")].into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                state: VolumeState::Available,
                formatted: false,
                staging: None,
                targets: BTreeMap::new(),
                created_unix: 1_700_000_000,
                rebuilt: false,
                failed: false,
                published_node: None,
                adopted: None,
                lost: false,
                clone_of: None,
                copied_in_use: None,
                restored_from: None,
                snapshot: None,
                moving: None,
                binding: Default::default(),
            });
        }
    }
    (files, records)
}

/// A free TCP port on the loopback for `/metrics`.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// One scrape of `/metrics` as Prometheus makes it (a new connection, the whole body):
/// (time, bytes of the body).
fn scrape(port: u16) -> (Duration, usize) {
    use std::io::{Read, Write};
    let t = Instant::now();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to /metrics");
    write!(s, "GET /metrics HTTP/1.0\r\nHost: localhost\r\nAccept: application/openmetrics-text\r\n\r\n").expect("request");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("response");
    let took = t.elapsed();
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    assert!(text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(body.ends_with("# EOF\n"), "a whole exposition");
    (took, body.len())
}

fn config(dir: &Path, port: u16) -> PathBuf {
    let toml = format!(
        r#"
[driver]
node_name = "scale-node"
[http]
address = "127.0.0.1:{port}"
[paths]
csi_socket = "{dir}/csi.sock"
admin_socket = "{dir}/admin.sock"
state_dir = "{dir}/state"
[drives]
allow_loop = true
rescan_interval = "5m"
[drives.filters]
include_paths = ["{dir}/*.img"]
[volumes]
allowed_roots = ["{dir}/kubelet"]
[log]
format = "json"
level = "info"
"#,
        dir = dir.display()
    );
    let path = dir.join("drivelet.toml");
    std::fs::write(&path, toml).expect("write config");
    path
}

async fn ready(socket: &Path) -> bool {
    let Ok(ch) = drivelet::cli::csi::connect(socket).await else { return false };
    let r = csi::identity_client::IdentityClient::new(ch).probe(csi::ProbeRequest {}).await;
    r.is_ok_and(|r| r.into_inner().ready == Some(true))
}

fn us(h: &Histogram, q: f64) -> f64 {
    h.percentile(q).unwrap_or(0) as f64 / 1000.0
}

fn run(volumes: usize, rt: &tokio::runtime::Runtime) -> Figures {
    let tmp = short_tempdir();
    let dir = tmp.path();
    let drives = MIN_DRIVES.max(volumes.div_ceil(GPT_ENTRIES));
    let t_setup = Instant::now();
    let (files, records) = make_drives(dir, volumes, drives);
    {
        let store = Store::open(&dir.join("state")).expect("open store");
        for r in &records {
            store.put(&r.id, r).expect("seed record");
        }
    }
    let mut attached = Drives(Vec::new());
    for f in &files {
        attached.0.push(PathBuf::from(sh("losetup", &["--find", "--show", "--partscan", f.to_str().unwrap()])));
    }
    sh("udevadm", &["settle", "--timeout=120"]);
    let setup_s = t_setup.elapsed().as_secs_f64();
    eprintln!("V={volumes}: {drives} drives, GPTs, store and udev ready in {setup_s:.1}s");

    let port = free_port();
    let cfg = config(dir, port);
    // One start to warm the page cache, then the median of STARTS measured starts.
    measure(dir, &cfg, port, volumes, rt);
    let runs: Vec<Figures> = (0..STARTS).map(|_| measure(dir, &cfg, port, volumes, rt)).collect();
    drop(attached);
    Figures { volumes, drives, setup_s, ..median(&runs) }
}

/// The median of each figure over the runs.
fn median(runs: &[Figures]) -> Figures {
    fn mid<T: Copy + PartialOrd>(runs: &[Figures], f: impl Fn(&Figures) -> T) -> T {
        let mut v: Vec<T> = runs.iter().map(f).collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        v[v.len() / 2]
    }
    Figures {
        ready_ms: mid(runs, |f| f.ready_ms),
        rss_ready_kib: mid(runs, |f| f.rss_ready_kib),
        hwm_ready_kib: mid(runs, |f| f.hwm_ready_kib),
        rss_listed_kib: mid(runs, |f| f.rss_listed_kib),
        anon_ready_kib: mid(runs, |f| f.anon_ready_kib),
        anon_listed_kib: mid(runs, |f| f.anon_listed_kib),
        list_ms: mid(runs, |f| f.list_ms),
        pages: mid(runs, |f| f.pages),
        ngi_p50_us: mid(runs, |f| f.ngi_p50_us),
        ngi_p99_us: mid(runs, |f| f.ngi_p99_us),
        cap_p50_us: mid(runs, |f| f.cap_p50_us),
        cap_p99_us: mid(runs, |f| f.cap_p99_us),
        create_p50_ms: mid(runs, |f| f.create_p50_ms),
        delete_p50_ms: mid(runs, |f| f.delete_p50_ms),
        scrape_p50_ms: mid(runs, |f| f.scrape_p50_ms),
        scrape_bytes: mid(runs, |f| f.scrape_bytes),
        ..Default::default()
    }
}

/// Starts the agent, measures it, stops it.
fn measure(dir: &Path, cfg: &Path, port: u16, volumes: usize, rt: &tokio::runtime::Runtime) -> Figures {
    let socket = dir.join("csi.sock");
    let log = std::fs::File::create(dir.join("agent.log")).expect("log file");
    let t0 = Instant::now();
    let child = Command::new(agent_bin())
        .args(["run", "--config", cfg.to_str().unwrap()])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn drivelet");
    let mut agent = Proc(child);
    let pid = agent.0.id();
    loop {
        if let Some(status) = agent.0.try_wait().expect("wait") {
            panic!("drivelet exited with {status}: {}", std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default());
        }
        if is_socket(&socket) && rt.block_on(ready(&socket)) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(300), "not ready after 300 s");
        std::thread::sleep(Duration::from_millis(2));
    }
    let ready_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let (rss_ready_kib, hwm_ready_kib, anon_ready_kib) = rss_kib(pid);
    // Scrapes before anything else, so the record clones of the calls below do not
    // count, and each one after the agent is ready (every drive and volume in it).
    let mut scrapes = Histogram::new();
    let mut scrape_bytes = 0;
    for i in 0..SCRAPES + 2 {
        let (took, bytes) = scrape(port);
        if i >= 2 {
            scrapes.record(took);
        }
        scrape_bytes = bytes;
    }

    let f = rt.block_on(async {
        let ch = drivelet::cli::csi::connect(&socket).await.expect("connect");
        let mut ctrl = csi::controller_client::ControllerClient::new(ch.clone());
        let mut node = csi::node_client::NodeClient::new(ch);
        let t = Instant::now();
        let (mut seen, mut abnormal, mut pages, mut token) = (0usize, 0usize, 0usize, String::new());
        loop {
            let r = ctrl
                .list_volumes(csi::ListVolumesRequest { max_entries: PAGE, starting_token: token })
                .await
                .expect("ListVolumes")
                .into_inner();
            pages += 1;
            seen += r.entries.len();
            abnormal += r
                .entries
                .iter()
                .filter(|e| e.status.as_ref().and_then(|s| s.volume_condition.as_ref()).is_some_and(|c| c.abnormal))
                .count();
            if r.next_token.is_empty() {
                break;
            }
            token = r.next_token;
        }
        let list_ms = t.elapsed().as_secs_f64() * 1000.0;
        let (rss_listed_kib, _, anon_listed_kib) = rss_kib(pid);
        assert_eq!(seen, volumes, "every volume once");
        assert_eq!(abnormal, 0, "every record found its drive and partition (the seeded drive ids match)");
        let (mut ngi, mut cap) = (Histogram::new(), Histogram::new());
        for i in 0..CALLS + 10 {
            let t = Instant::now();
            node.node_get_info(csi::NodeGetInfoRequest {}).await.expect("NodeGetInfo");
            if i >= 10 {
                ngi.record(t.elapsed());
            }
        }
        for i in 0..CALLS + 10 {
            let t = Instant::now();
            ctrl.get_capacity(csi::GetCapacityRequest::default()).await.expect("GetCapacity");
            if i >= 10 {
                cap.record(t.elapsed());
            }
        }
        // Creating and deleting with V volumes in the book: each change republishes
        // the whole view (src/actors/volumes/view.rs), so this shows what that costs.
        let (mut created, mut deleted) = (Histogram::new(), Histogram::new());
        for i in 0..ROUNDS {
            let t = Instant::now();
            let v = ctrl
                .create_volume(csi::CreateVolumeRequest {
                    name: format!("scale-round-{i}"),
                    capacity_range: Some(csi::CapacityRange { required_bytes: VOLUME_SIZE as i64, limit_bytes: 0 }),
                    volume_capabilities: vec![block_cap()],
                    ..Default::default()
                })
                .await
                .expect("CreateVolume")
                .into_inner()
                .volume
                .expect("a volume");
            created.record(t.elapsed());
            let t = Instant::now();
            ctrl.delete_volume(csi::DeleteVolumeRequest { volume_id: v.volume_id, ..Default::default() }).await.expect("DeleteVolume");
            deleted.record(t.elapsed());
        }
        Figures {
            create_p50_ms: us(&created, 0.5) / 1000.0,
            delete_p50_ms: us(&deleted, 0.5) / 1000.0,
            list_ms,
            pages,
            rss_listed_kib,
            anon_listed_kib,
            ngi_p50_us: us(&ngi, 0.5),
            ngi_p99_us: us(&ngi, 0.99),
            cap_p50_us: us(&cap, 0.5),
            cap_p99_us: us(&cap, 0.99),
            ..Default::default()
        }
    });
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let _ = agent.0.wait();
    Figures { ready_ms, rss_ready_kib, hwm_ready_kib, anon_ready_kib, scrape_p50_ms: us(&scrapes, 0.5) / 1000.0, scrape_bytes, ..f }
}

fn main() {
    let mut counts: Vec<usize> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).filter_map(|a| a.parse().ok()).collect();
    if counts.is_empty() {
        counts = vec![0, 1000, 5000, 10000];
    }
    require_host();
    println!("agent: {}", agent_bin().display());
    let rt = rt();
    let mut all = Vec::new();
    for v in counts {
        let f = run(v, &rt);
        println!(
            "V={:<6} drives={:<3} (set up in {:.0}s) ready {:>7.1} ms  RSS ready {:>6.1} MiB (peak {:.1}, anonymous {:.1})  RSS after list {:>6.1} MiB (anonymous {:.1})  \
             ListVolumes {} pages of {PAGE} {:>7.1} ms  NodeGetInfo p50 {:.0}µs p99 {:.0}µs  GetCapacity p50 {:.0}µs p99 {:.0}µs  \
             CreateVolume p50 {:.1} ms  DeleteVolume p50 {:.1} ms  /metrics p50 {:.2} ms, {} bytes",
            f.volumes,
            f.drives,
            f.setup_s,
            f.ready_ms,
            f.rss_ready_kib as f64 / 1024.0,
            f.hwm_ready_kib as f64 / 1024.0,
            f.anon_ready_kib as f64 / 1024.0,
            f.rss_listed_kib as f64 / 1024.0,
            f.anon_listed_kib as f64 / 1024.0,
            f.pages,
            f.list_ms,
            f.ngi_p50_us,
            f.ngi_p99_us,
            f.cap_p50_us,
            f.cap_p99_us,
            f.create_p50_ms,
            f.delete_p50_ms,
            f.scrape_p50_ms,
            f.scrape_bytes,
        );
        all.push(f);
    }
    println!();
    println!("| volumes | drives | ready (ms) | RSS ready (MiB) | peak RSS (MiB) | RSS after list (MiB) | anonymous ready / after list (MiB) | full ListVolumes (ms) | NodeGetInfo p50/p99 (µs) | GetCapacity p50/p99 (µs) | CreateVolume / DeleteVolume p50 (ms) | /metrics p50 (ms) / bytes |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for f in &all {
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} / {:.1} | {:.1} | {:.0} / {:.0} | {:.0} / {:.0} | {:.1} / {:.1} | {:.2} / {} |",
            f.volumes,
            f.drives,
            f.ready_ms,
            f.rss_ready_kib as f64 / 1024.0,
            f.hwm_ready_kib as f64 / 1024.0,
            f.rss_listed_kib as f64 / 1024.0,
            f.anon_ready_kib as f64 / 1024.0,
            f.anon_listed_kib as f64 / 1024.0,
            f.list_ms,
            f.ngi_p50_us,
            f.ngi_p99_us,
            f.cap_p50_us,
            f.cap_p99_us,
            f.create_p50_ms,
            f.delete_p50_ms,
            f.scrape_p50_ms,
            f.scrape_bytes
        );
    }
    // Per-volume cost between consecutive runs: flat or falling means at most linear.
    println!();
    println!("per added volume, between consecutive runs:");
    for w in all.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        let dv = b.volumes as f64 - a.volumes as f64;
        if dv <= 0.0 {
            continue;
        }
        println!(
            "  {} -> {}: ready {:+.1} µs/volume, RSS after ready {:+.2} KiB/volume (anonymous {:+.2}), RSS after list {:+.2} KiB/volume (anonymous {:+.2}), ListVolumes {:+.2} µs/volume",
            a.volumes,
            b.volumes,
            (b.ready_ms - a.ready_ms) * 1000.0 / dv,
            (b.rss_ready_kib as f64 - a.rss_ready_kib as f64) / dv,
            (b.anon_ready_kib as f64 - a.anon_ready_kib as f64) / dv,
            (b.rss_listed_kib as f64 - a.rss_listed_kib as f64) / dv,
            (b.anon_listed_kib as f64 - a.anon_listed_kib as f64) / dv,
            (b.list_ms - a.list_ms) * 1000.0 / dv,
        );
    }
}
