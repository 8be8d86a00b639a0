//! Drive evacuation on real loop drives (`drivelet ctl drive evacuate`):
//!
//! - the volumes of a drive move to another drive keeping their ids and their data
//!   (an ext4 volume's file, a block volume's every byte); one that is staged waits,
//!   listed with its staging path, and moves once unstaged; while a volume is copied,
//!   a stage of it answers ABORTED; the drive ends released, holding no partition, and
//!   the volumes serve from their new drive, also after a restart; `/metrics` shows the
//!   move running, the volumes of the evacuation by where they stand, and the drive's
//!   usage all along (and a failed move as failed);
//! - an evacuation the other drives cannot hold is refused and moves nothing;
//! - blocks that cannot be read (a fail point stands in for a failing drive) keep the
//!   volume where it is, its move failed with the byte ranges; forced, it moves with
//!   zeros in those ranges and says which;
//! - kill -9 at every step of a move (`robustness::crash` has the cases): see there.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;
use tonic::Code;

fn ctl(agent: &Agent, args: &[&str]) -> (bool, String) {
    let out = Command::new(bin()).args(["ctl", "--socket", agent.admin_socket.to_str().unwrap()]).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

/// The drive id and start of volume `id` as `ctl volumes` lists it.
pub(crate) fn placed(agent: &Agent, id: &str) -> (String, u64) {
    let (d, start, _) = extent_of(agent, id);
    (d, start)
}

/// The drive id, start and size of volume `id` as `ctl volumes` lists it.
pub(crate) fn extent_of(agent: &Agent, id: &str) -> (String, u64, u64) {
    let vols = agent.ctl_volumes();
    let v = vols.as_array().unwrap().iter().find(|v| v["id"] == id).unwrap_or_else(|| panic!("volume {id} listed: {vols}"));
    (v["drive_id"].as_str().unwrap().to_string(), v["start"].as_u64().unwrap(), v["size"].as_u64().unwrap())
}

/// Waits (`secs` at most) for `f`, saying what it waited for.
pub(crate) fn wait_for(agent: &Agent, what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(secs), "{what} within {secs} s; log:\n{}", agent.log_tail(30));
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The kernel partition of the volume at `start` (`size` bytes) on `d`, added when the
/// kernel does not have it (after a restart it is added at the next stage).
fn dev_at(d: &LoopDrive, start: u64, size: u64) -> PathBuf {
    drivelet::disk::blkpg::ensure_kernel_partition(&d.dev, start, size).expect("kernel partition").devnode
}

/// A digest of the first `len` bytes of `dev`, read past the cache.
fn digest_of(dev: &Path, len: u64) -> String {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(dev).unwrap();
    let mut a = Aligned::new(len as usize, 0);
    f.read_exact(a.buf()).unwrap();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(&a.buf()[..], &mut h);
    format!("{:x}", std::hash::Hasher::finish(&h))
}

/// Writes a pattern seeded by `seed` over the first `len` bytes of `dev`.
fn write_pattern(dev: &Path, len: usize, seed: u8) {
    use std::io::Write;
    let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8).collect();
    let mut f = std::fs::OpenOptions::new().write(true).open(dev).unwrap();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
}

struct Bed {
    agent: Agent,
    /// Where the agent serves `/metrics`.
    http_port: u16,
    drives: Vec<LoopDrive>,
    tmp: tempfile::TempDir,
    _unmount: Unmounter,
}

impl Bed {
    fn new(sizes: &[u64]) -> Bed {
        require_host();
        let tmp = short_tempdir();
        let drives = sizes.iter().enumerate().map(|(i, s)| LoopDrive::new(tmp.path(), &format!("e{i}.img"), *s)).collect();
        sh("udevadm", &["settle"]);
        let http_port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
        let opts = AgentOpts { extra_toml: format!("[http]\naddress = \"127.0.0.1:{http_port}\"\n"), ..AgentOpts::default() };
        let agent = Agent::start(tmp.path(), opts);
        let unmount = Unmounter(tmp.path().join("kubelet"));
        Bed { agent, http_port, drives, _unmount: unmount, tmp }
    }

    /// The value of the one `/metrics` sample of `family` whose labels include each of
    /// `with` (`key="value"`); `None` when there is none.
    fn metric(&self, family: &str, with: &[(&str, &str)]) -> Option<f64> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.http_port)).expect("connect to /metrics");
        write!(s, "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").expect("request");
        let mut text = String::new();
        s.read_to_string(&mut text).expect("response");
        let found: Vec<f64> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{family}{{")))
            .filter(|l| with.iter().all(|(k, v)| [format!("{{{k}=\"{v}\""), format!(",{k}=\"{v}\"")].iter().any(|p| l.contains(p.as_str()))))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect();
        assert!(found.len() <= 1, "more than one {family} with {with:?} in\n{text}");
        found.first().copied()
    }

    fn call<T>(&self, f: impl AsyncFnOnce(&mut Csi) -> T) -> T {
        rt().block_on(async {
            let mut c = Csi::connect(&self.agent).await;
            f(&mut c).await
        })
    }

    fn create(&self, name: &str, size: u64, cap: drivelet::grpc::proto::csi::VolumeCapability) -> String {
        self.call(async |c| c.ctrl.create_volume(create_req(name, size, cap)).await.expect("create").into_inner().volume.unwrap().volume_id)
    }

    fn stage(&self, id: &str, at: &str) -> Result<PathBuf, tonic::Status> {
        let p = self.tmp.path().join("kubelet").join(at);
        self.call(async |c| c.node.node_stage_volume(stage_req(id, &p, mount_cap("ext4"))).await.map(|_| p.clone()))
    }

    fn unstage(&self, id: &str, p: &Path) {
        self.call(async |c| c.node.node_unstage_volume(unstage_req(id, p)).await.expect("unstage"));
    }

    fn drive(&self, id: &str) -> &LoopDrive {
        let listed = self.agent.ctl_drives();
        self.drives.iter().find(|d| drive_by_path(&listed, &d.dev).is_some_and(|v| v["id"] == id)).unwrap_or_else(|| panic!("no drive {id}"))
    }

    fn dev(&self, volume: &str) -> PathBuf {
        let (drive, start, size) = extent_of(&self.agent, volume);
        dev_at(self.drive(&drive), start, size)
    }

    fn evacuations(&self) -> serde_json::Value {
        let (ok, out) = ctl(&self.agent, &["evacuations", "-o", "json"]);
        assert!(ok, "{out}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
    }

    fn pending_state(&self, volume: &str) -> Option<(String, String)> {
        let ev = self.evacuations();
        ev.as_array()?.iter().flat_map(|e| e["pending"].as_array().cloned().unwrap_or_default()).find(|p| p["volume_id"] == volume).map(|p| {
            (p["state"].as_str().unwrap_or_default().to_string(), p["reason"].as_str().unwrap_or_default().to_string())
        })
    }
}

#[test]
fn an_evacuated_drive_hands_every_volume_to_another_drive_with_its_id_and_data_and_ends_released_and_empty() {
    let mut bed = Bed::new(&[GIB, GIB]);
    let file_v = bed.create("pvc-evac-file", 40 * MIB, mount_cap("ext4"));
    let block_v = bed.create("pvc-evac-block", 48 * MIB, block_cap());
    let used_v = bed.create("pvc-evac-used", 32 * MIB, mount_cap("ext4"));
    let (src, _) = placed(&bed.agent, &file_v);
    for v in [&block_v, &used_v] {
        assert_eq!(placed(&bed.agent, v).0, src, "best fit puts the three volumes on one drive");
    }
    // Data: a file in an ext4 volume (then unstaged), a block volume's bytes, a file in
    // a volume that stays staged (a pod uses it).
    let p = bed.stage(&file_v, "s-file").expect("stage");
    std::fs::write(p.join("data"), "the file volume's data").unwrap();
    bed.unstage(&file_v, &p);
    write_pattern(&bed.dev(&block_v), (48 * MIB) as usize, 7);
    let block_digest = digest_of(&bed.dev(&block_v), 48 * MIB);
    let used_at = bed.stage(&used_v, "s-used").expect("stage");
    std::fs::write(used_at.join("data"), "the used volume's data").unwrap();

    // Hold the first move 3 s (the smallest unstaged volume, the file one goes first),
    // to see the volume claimed meanwhile.
    bed.agent.arm("move.intent_saved", "1*sleep(3000)");
    let (ok, out) = ctl(&bed.agent, &["drive", "evacuate", &src]);
    assert!(ok && out.contains("evacuating"), "{out}");
    wait_for(&bed.agent, "the file volume's move to start", 10, || bed.pending_state(&file_v).is_some_and(|s| s.0 == "moving"));
    // Held before its copy: the move shows, nothing copied yet.
    assert_eq!(bed.metric("drivelet_volume_move_progress_ratio", &[("volume", &file_v), ("drive", &src)]), Some(0.0));
    assert_eq!(bed.metric("drivelet_drive_evacuation_volumes", &[("drive", &src), ("state", "moving")]), Some(1.0));
    assert_eq!(bed.metric("drivelet_drive_usage", &[("drive", &src), ("usage", "releasing")]), Some(1.0));
    let e = bed.stage(&file_v, "s-file").expect_err("a volume being moved is not staged");
    assert_eq!(e.code(), Code::Aborted, "{e:?}");
    let (ok, out) = ctl(&bed.agent, &["drive", "evacuate", &src]);
    assert!(ok, "asking again is no error: {out}");

    // The unused two move; the staged one waits, saying where it is staged.
    wait_for(&bed.agent, "the unused volumes to move", 30, || placed(&bed.agent, &file_v).0 != src && placed(&bed.agent, &block_v).0 != src);
    let (state, why) = bed.pending_state(&used_v).expect("the staged volume is listed");
    assert_eq!(state, "waiting", "{why}");
    assert!(why.contains("s-used"), "{why}");
    let (_, table) = ctl(&bed.agent, &["evacuations"]);
    assert!(table.contains("2 moved") && table.contains("waiting") && table.contains("copied and verified"), "{table}");
    for (state, n) in [("moved", 2.0), ("moving", 0.0), ("queued", 0.0), ("waiting", 1.0), ("failed", 0.0)] {
        assert_eq!(bed.metric("drivelet_drive_evacuation_volumes", &[("drive", &src), ("state", state)]), Some(n), "{state}");
    }
    assert_eq!(bed.metric("drivelet_volume_move_progress_ratio", &[]), None, "no move running");
    assert_eq!(bed.metric("drivelet_volume_info", &[("volume", &used_v), ("drive", &src)]), Some(1.0), "the waiting volume is still on its drive");
    let to = placed(&bed.agent, &file_v).0;
    assert_eq!(bed.metric("drivelet_volume_info", &[("volume", &file_v), ("drive", &to)]), Some(1.0), "a moved volume is on its new drive");
    assert_eq!(std::fs::read_to_string(used_at.join("data")).unwrap(), "the used volume's data", "served as before meanwhile");

    // Unstaged, it moves too; the drive is released and holds no partition.
    bed.unstage(&used_v, &used_at);
    wait_for(&bed.agent, "the used volume to move", 30, || placed(&bed.agent, &used_v).0 != src);
    wait_for(&bed.agent, "the drive to be released", 10, || ctl_drive(&bed.agent, &src)["usage"] == "released");
    let d = bed.drive(&src);
    assert!(gpt_entries(&d.dev).is_empty(), "the evacuated drive holds no partition: {:?}", gpt_entries(&d.dev).len());
    let ev = bed.evacuations();
    assert_eq!(ev[0]["done"], true, "{ev}");
    assert_eq!(bed.metric("drivelet_drive_evacuation_volumes", &[("drive", &src), ("state", "moved")]), Some(3.0));
    assert_eq!(bed.metric("drivelet_drive_usage", &[("drive", &src), ("usage", "released")]), Some(1.0));
    assert_eq!(bed.metric("drivelet_drive_volumes", &[("drive", &src)]), Some(0.0));

    // Same ids, same data, from the new drive; and again after a restart.
    let check = |bed: &Bed| {
        assert_eq!(digest_of(&bed.dev(&block_v), 48 * MIB), block_digest, "the block volume's bytes moved whole");
        for (v, at, text) in [(&file_v, "s-file", "the file volume's data"), (&used_v, "s-used", "the used volume's data")] {
            let p = bed.stage(v, at).expect("stage the moved volume");
            assert_eq!(std::fs::read_to_string(p.join("data")).unwrap(), text);
            bed.unstage(v, &p);
        }
        let ids: Vec<String> = bed.agent.ctl_volumes().as_array().unwrap().iter().map(|v| v["id"].as_str().unwrap().to_string()).collect();
        for v in [&file_v, &block_v, &used_v] {
            assert!(ids.contains(v), "volume {v} keeps its id: {ids:?}");
        }
        let entries: Vec<_> = bed.drives.iter().flat_map(|d| gpt_entries(&d.dev)).collect();
        assert_eq!(entries.len(), 3, "one partition per volume, no copy left: {}", entries.len());
    };
    check(&bed);
    bed.agent.stop();
    bed.agent.spawn();
    bed.agent.wait_ready();
    check(&bed);
}

#[test]
fn an_evacuation_the_other_drives_cannot_hold_is_refused_and_moves_nothing() {
    let bed = Bed::new(&[GIB, 160 * MIB]);
    let a = bed.create("pvc-evac-big-1", 200 * MIB, block_cap());
    let b = bed.create("pvc-evac-big-2", 200 * MIB, block_cap());
    let (src, _) = placed(&bed.agent, &a);
    assert_eq!(placed(&bed.agent, &b).0, src);
    let (ok, out) = ctl(&bed.agent, &["drive", "evacuate", &src]);
    assert!(!ok && out.contains("no room") && out.contains("nothing was moved"), "{out}");
    assert_eq!(ctl_drive(&bed.agent, &src)["usage"], "active", "a refused evacuation changes nothing");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(placed(&bed.agent, &a).0, src);
    let (ok, out) = ctl(&bed.agent, &["drive", "evacuate", "no-such-drive"]);
    assert!(!ok && out.contains("no drive with id"), "{out}");
}

#[test]
fn a_volume_whose_blocks_cannot_be_read_stays_unless_forced_and_then_says_which_ranges_read_as_zeros() {
    let bed = Bed::new(&[GIB, GIB]);
    let v = bed.create("pvc-evac-bad", 8 * MIB, block_cap());
    let (src, _) = placed(&bed.agent, &v);
    write_pattern(&bed.dev(&v), (8 * MIB) as usize, 3);
    let before = digest_of(&bed.dev(&v), 8 * MIB);
    // Bytes 1 MiB .. 1 MiB + 8 KiB of the volume fail to read.
    bed.agent.arm("move.unreadable", "return(1048576-1056768)");
    let (ok, out) = ctl(&bed.agent, &["drive", "evacuate", &src]);
    assert!(ok, "{out}");
    wait_for(&bed.agent, "the move to fail", 30, || bed.pending_state(&v).is_some_and(|s| s.0 == "failed"));
    let (_, why) = bed.pending_state(&v).unwrap();
    assert!(why.contains("8.0 KiB at byte 1048576") && why.contains("force"), "{why}");
    assert_eq!(placed(&bed.agent, &v).0, src, "not moved");
    assert_eq!(digest_of(&bed.dev(&v), 8 * MIB), before, "untouched");
    let copies: usize = bed.drives.iter().map(|d| gpt_entries(&d.dev).len()).sum();
    assert_eq!(copies, 1, "the copy was rolled back");
    assert_eq!(bed.metric("drivelet_drive_evacuation_volumes", &[("drive", &src), ("state", "failed")]), Some(1.0));
    assert_eq!(bed.metric("drivelet_volume_moves_total", &[("result", "failed")]), Some(1.0));

    let (ok, out) = ctl(&bed.agent, &["drive", "evacuate", &src, "--force"]);
    assert!(ok, "{out}");
    wait_for(&bed.agent, "the forced move", 30, || placed(&bed.agent, &v).0 != src);
    bed.agent.arm("move.unreadable", "off");
    let (_, table) = ctl(&bed.agent, &["evacuations"]);
    assert!(table.contains("unreadable, zeros now: 8.0 KiB at byte 1048576"), "{table}");
    let dev = bed.dev(&v);
    assert_eq!(first_nonzero(&dev, 1048576, 1056768), None, "zeros where the old drive failed");
    assert!(first_nonzero(&dev, 0, 1048576).is_some() && first_nonzero(&dev, 1056768, 8 * MIB).is_some(), "the rest was copied");
}

#[test]
fn a_snapshot_on_an_evacuated_drive_moves_too_and_still_restores_its_data() {
    let bed = Bed::new(&[GIB, GIB]);
    let v = bed.create("pvc-evac-snapsrc", 8 * MIB, block_cap());
    write_pattern(&bed.dev(&v), (8 * MIB) as usize, 11);
    let want = digest_of(&bed.dev(&v), 8 * MIB);
    let snap = bed.call(async |c| {
        c.ctrl.create_snapshot(snapshot_req("snap-evac", &v, &[])).await.expect("snapshot").into_inner().snapshot.unwrap().snapshot_id
    });
    let snaps = |bed: &Bed| -> serde_json::Value {
        let (ok, out) = ctl(&bed.agent, &["snapshots", "-o", "json"]);
        assert!(ok, "{out}");
        serde_json::from_str(&out).unwrap()
    };
    let on = snaps(&bed)[0]["drive_id"].as_str().unwrap().to_string();
    assert_ne!(on, placed(&bed.agent, &v).0, "a snapshot goes on another drive than its source's");
    let (ok, out) = ctl(&bed.agent, &["drive", "evacuate", &on]);
    assert!(ok, "{out}");
    wait_for(&bed.agent, "the snapshot to move", 30, || snaps(&bed)[0]["drive_id"] != on.as_str());
    wait_for(&bed.agent, "the drive to be released", 10, || ctl_drive(&bed.agent, &on)["usage"] == "released");
    assert_eq!(snaps(&bed)[0]["id"], snap.as_str(), "same id");
    assert_eq!(snaps(&bed)[0]["state"], "ready");
    let r = bed.call(async |c| c.ctrl.create_volume(restore_req("pvc-evac-restored", 8 * MIB, 0, block_cap(), &snap)).await.expect("restore").into_inner().volume.unwrap().volume_id);
    assert_eq!(digest_of(&bed.dev(&r), 8 * MIB), want, "the restore holds the snapshot's data");
}

#[test]
fn a_drive_pulled_right_after_a_switch_gets_its_old_partition_removed_when_it_is_back_and_never_shows_the_volume_twice() {
    let mut bed = Bed::new(&[GIB, GIB]);
    let v = bed.create("pvc-evac-pulled", 8 * MIB, block_cap());
    write_pattern(&bed.dev(&v), (8 * MIB) as usize, 5);
    let want = digest_of(&bed.dev(&v), 8 * MIB);
    let (src, _) = placed(&bed.agent, &v);
    // Killed right after the switch is stored.
    bed.agent.arm("move.switched", "return");
    let _ = ctl(&bed.agent, &["drive", "evacuate", &src]);
    assert!(bed.agent.wait_exit(Duration::from_secs(30)).is_some(), "killed at move.switched");
    // The old drive is pulled before drivelet comes back.
    let i = bed.drives.iter().position(|d| gpt_entries(&d.dev).iter().any(|e| e.uuid.eq_ignore_ascii_case(&v) && e.start > 0) && {
        let t = drivelet::disk::gpt::read_table(&d.dev, 512).unwrap().unwrap();
        t.partitions.iter().any(|q| q.guid.to_string() == v && !q.is_move_copy())
    }).expect("the old partition");
    let file = bed.drives[i].file.clone();
    bed.drives[i].detach();
    bed.agent.spawn();
    bed.agent.wait_ready();
    assert_ne!(placed(&bed.agent, &v).0, src, "the volume serves from its new drive");
    assert_eq!(digest_of(&bed.dev(&v), 8 * MIB), want);
    // Back: its old partition is removed, never adopted as a second volume of the id.
    bed.drives[i].dev = sh("losetup", &["--find", "--show", "--partscan", file.to_str().unwrap()]).into();
    wait_for(&bed.agent, "the old partition to be removed", 20, || gpt_entries(&bed.drives[i].dev).is_empty());
    let vols = bed.agent.ctl_volumes();
    assert_eq!(vols.as_array().unwrap().len(), 1, "one volume: {vols}");
    assert_ne!(placed(&bed.agent, &v).0, src);
    assert_eq!(digest_of(&bed.dev(&v), 8 * MIB), want);
}
