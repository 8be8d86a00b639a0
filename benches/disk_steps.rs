//! Benchmark: where CreateVolume and DeleteVolume of a block volume spend their time on
//! the disk, step by step. Runs the volume manager's own blocking steps
//! (`steps::create`, `steps::delete`: store commits, drive lock, GPT write, BLKPG, device
//! node, signature wipe) on a real loop drive with real udev, one at a time, without
//! the gRPC front and the actors (`drivelet bench lifecycle` measures those on top).
//! Every step is timed by `drivelet::disk::timing`; steps nest (`gpt.flush` is part of
//! `gpt.add`), so a step's figure includes those indented under it.
//!
//! Run (as root): `cargo bench --bench disk_steps -- [ROUNDS] [SIZE_MIB] [PARTITIONS]`
//! (default 50 rounds of a 64 MiB volume on a 1 GiB loop drive that holds one other
//! volume: 2 partitions while the measured one exists). PARTITIONS sets how many
//! partitions the drive holds while the measured volume exists (1 to 255: the others are
//! 1 MiB volumes made first and kept), to see what a full table costs. Prints p50/p90/max
//! per step and of the whole operation, and the load average before and after.

#[path = "../tests/integration/common/mod.rs"]
#[allow(dead_code)]
mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use drivelet::actors::volumes::model::{VolumeRecord, VolumeState};
use drivelet::actors::volumes::steps;
use drivelet::disk::{gpt, timing};
use drivelet::store::Store;
use drivelet::words::DriveLoc;

/// Steps in the order they run, with their nesting depth, per operation.
const CREATE: &[(&str, usize)] = &[
    ("store.commit", 0),
    ("lock.take", 0),
    ("gpt.add", 0),
    ("gpt.parse", 1),
    ("blkid.probe", 1),
    ("gpt.flush", 1),
    ("blkpg.ensure", 0),
    ("blkpg.node", 1),
    ("lock.grace", 0),
    ("wipe", 0),
    ("wipe.flush", 1),
];
const DELETE: &[(&str, usize)] = &[
    ("store.commit", 0),
    ("lock.take", 0),
    ("gpt.read_table", 0),
    ("blkpg.ensure", 0),
    ("blkpg.node", 1),
    ("wipe", 0),
    ("wipe.flush", 1),
    ("blkpg.remove", 0),
    ("gpt.remove", 0),
    ("gpt.parse", 1),
    ("blkid.probe", 1),
    ("gpt.flush", 1),
    ("lock.grace", 0),
];

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default().split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// Per step name: the summed duration of that step in each round (a step that runs
/// twice in one operation, like the two GPT flushes, is summed), and how often it ran.
#[derive(Default)]
struct Steps {
    per_round: BTreeMap<&'static str, Vec<Duration>>,
    count: BTreeMap<&'static str, usize>,
    total: Vec<Duration>,
}

impl Steps {
    fn add(&mut self, total: Duration, steps: Vec<(&'static str, Duration)>) {
        let mut sums: BTreeMap<&'static str, Duration> = BTreeMap::new();
        for (name, d) in steps {
            *sums.entry(name).or_default() += d;
            *self.count.entry(name).or_default() += 1;
        }
        for (name, d) in sums {
            self.per_round.entry(name).or_default().push(d);
        }
        self.total.push(total);
    }

    fn print(&mut self, what: &str, order: &[(&'static str, usize)]) {
        let rounds = self.total.len();
        println!("\n{what} ({rounds} rounds)");
        println!("| step | runs per op | p50 ms | p90 ms | max ms |");
        println!("|---|---|---|---|---|");
        for (name, depth) in order {
            let Some(v) = self.per_round.get_mut(name) else { continue };
            v.sort();
            let runs = self.count[name] as f64 / rounds as f64;
            println!("| {}{name} | {runs:.1} | {} | {} | {} |", "&nbsp;&nbsp;".repeat(*depth), ms(percentile(v, 0.5)), ms(percentile(v, 0.9)), ms(*v.last().unwrap()));
        }
        for name in self.per_round.keys().filter(|n| !order.iter().any(|(o, _)| *o == **n)) {
            println!("| (unlisted) {name} | | | | |");
        }
        self.total.sort();
        let t = &self.total;
        println!("| **whole {what}** | 1 | **{}** | {} | {} |", ms(percentile(t, 0.5)), ms(percentile(t, 0.9)), ms(*t.last().unwrap()));
    }
}

fn record(n: u32, drive_id: &str, start: u64, size: u64) -> VolumeRecord {
    let name = format!("pvc-bench-{n}");
    let guid = gpt::volume_partition_guid(&name);
    VolumeRecord {
        drive_id: drive_id.into(),
        part_guid: guid,
        start,
        size,
        block: true,
        ..VolumeRecord::new(guid.to_string(), name, VolumeState::Creating, 0)
    }
}

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| !a.starts_with('-'));
    let rounds: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(50);
    let size_mib: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let partitions: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2).clamp(1, gpt::KERNEL_MAX_PARTITIONS);
    require_host();
    // As an agent runs: every table change carries the drive's note (who owns it, its
    // volumes). NO_NOTE=1 leaves the identity unset, so commits write no note: the two
    // runs side by side are what the note costs.
    if std::env::var_os("NO_NOTE").is_none() {
        let me = drivelet::words::Owner { cluster: "bench".into(), node: "bench-node".into() };
        drivelet::disk::note::set_identity(me).expect("identity");
    }
    println!("drive notes: {}", if std::env::var_os("NO_NOTE").is_none() { "written with each table change" } else { "off (NO_NOTE)" });
    let tmp = short_tempdir();
    let drive = LoopDrive::new(tmp.path(), "a.img", 1024 * MIB);
    let loc = DriveLoc { path: drive.dev.clone(), sector: 512 };
    let store = Store::open(&tmp.path().join("state")).expect("open store");
    // As an agent writes its disks: through private device nodes (disk::writer).
    // OWN_NODE=1 writes through the disk's own node, which udev watches: the two runs side
    // by side are what udev's answers to the writes cost.
    if std::env::var_os("OWN_NODE").is_none() {
        drivelet::disk::writer::init(&tmp.path().join("devices")).expect("the private directory for device nodes");
    }
    println!("disks written through: {}", if std::env::var_os("OWN_NODE").is_none() { "private device nodes" } else { "their own nodes (OWN_NODE)" });
    sh("udevadm", &["settle"]);
    println!("load average before: {}", loadavg());
    // Volumes that stay (PARTITIONS - 1 of 1 MiB, one by default), so the drive has a
    // table and neighbour partitions, as on a node in use; the measured volume comes and
    // goes after them.
    let guards = std::sync::Arc::new(drivelet::actors::volumes::Guards::default());
    let kept: Vec<VolumeRecord> = (1..partitions).map(|n| record(10_000 + n, "bench", u64::from(n) * MIB, MIB)).collect();
    for keep in &kept {
        steps::create(&store, &loc, keep.clone(), None).result.expect("create a neighbour volume");
    }
    // udev's work for the neighbours' partitions (one probe each) is done before the
    // measured rounds: a drive that holds N partitions, not one that was just filled.
    sh("udevadm", &["settle", "--timeout=600"]);
    println!("partitions on the drive while the measured volume exists: {partitions}");
    let (mut create, mut delete) = (Steps::default(), Steps::default());
    for i in 1..=rounds {
        let rec = record(i, "bench", 512 * MIB, size_mib * MIB);
        timing::record();
        let t0 = Instant::now();
        let done = steps::create(&store, &loc, rec, None).result.expect("create");
        create.add(t0.elapsed(), timing::take());
        let t0 = Instant::now();
        steps::delete(&store, &guards, Some(&loc), done).result.expect("delete");
        delete.add(t0.elapsed(), timing::take());
    }
    for keep in kept {
        steps::delete(&store, &guards, Some(&loc), VolumeRecord { state: VolumeState::Available, ..keep }).result.expect("delete a neighbour");
    }
    println!("load average after: {}", loadavg());
    println!("drive {} ({}), store {}", drive.dev.display(), PathBuf::from(&drive.file).display(), Store::path_in(&tmp.path().join("state")).display());
    create.print("CreateVolume (block)", CREATE);
    delete.print("DeleteVolume (block)", DELETE);
}
