//! Snapshots end to end on real loop drives: CreateSnapshot, ListSnapshots, GetSnapshot,
//! DeleteSnapshot and CreateVolume from a snapshot.
//!
//! - a snapshot of an ext4, xfs or block volume holds the data written before it, not
//!   what is written after; a volume restored from it holds exactly that data (checksum);
//!   the snapshot survives its source's deletion, a restart of drivelet and the loss of
//!   the store (taken back from its note on the drive);
//! - a snapshot takes room on the drive (GetCapacity) until it is deleted;
//! - a volume in use: mounted read-write it is refused (FAILED_PRECONDITION saying how
//!   to get one) unless the class asks for a freeze, which copies it consistently while
//!   a writer keeps writing; a block volume in use is refused either way;
//! - refusals with the spec's codes, each changing nothing: an unknown source
//!   NOT_FOUND, a name reused with another source ALREADY_EXISTS, an unknown parameter
//!   INVALID_ARGUMENT, a restore of a block snapshot into a filesystem (or the reverse)
//!   INVALID_ARGUMENT, a restore smaller than the snapshot OUT_OF_RANGE, a restore of an
//!   unknown snapshot NOT_FOUND, a snapshot on a detached drive FAILED_PRECONDITION.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::common::*;
use drivelet::grpc::proto::csi;
use tonic::Code;

struct Bed {
    agent: Agent,
    _unmount: Unmounter,
    drives: Vec<LoopDrive>,
    tmp: tempfile::TempDir,
}

impl Bed {
    fn new(sizes: &[u64]) -> Bed {
        require_host();
        let tmp = short_tempdir();
        let drives = sizes.iter().enumerate().map(|(i, s)| LoopDrive::new(tmp.path(), &format!("s{i}.img"), *s)).collect();
        sh("udevadm", &["settle"]);
        let agent = Agent::start(tmp.path(), AgentOpts::default());
        let unmount = Unmounter(tmp.path().join("kubelet"));
        Bed { agent, _unmount: unmount, drives, tmp }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join("kubelet").join(rel)
    }

    fn csi<T>(&self, f: impl AsyncFnOnce(&mut Csi) -> T) -> T {
        rt().block_on(async {
            let mut c = Csi::connect(&self.agent).await;
            f(&mut c).await
        })
    }

    fn create(&self, q: csi::CreateVolumeRequest) -> Result<csi::Volume, tonic::Status> {
        self.csi(async |c| c.ctrl.create_volume(q).await.map(|r| r.into_inner().volume.expect("volume")))
    }

    fn snapshot(&self, q: csi::CreateSnapshotRequest) -> Result<csi::Snapshot, tonic::Status> {
        self.csi(async |c| c.ctrl.create_snapshot(q).await.map(|r| r.into_inner().snapshot.expect("snapshot")))
    }

    fn list(&self, q: csi::ListSnapshotsRequest) -> Vec<csi::Snapshot> {
        self.csi(async |c| c.ctrl.list_snapshots(q).await.expect("list snapshots").into_inner().entries.into_iter().filter_map(|e| e.snapshot).collect())
    }

    fn delete_snapshot(&self, id: &str) {
        self.csi(async |c| c.ctrl.delete_snapshot(csi::DeleteSnapshotRequest { snapshot_id: id.into(), ..Default::default() }).await.expect("delete snapshot"));
    }

    fn stage(&self, id: &str, at: &str, cap: csi::VolumeCapability) -> PathBuf {
        let staging = self.path(at);
        self.csi(async |c| c.node.node_stage_volume(stage_req(id, &staging, cap)).await.unwrap_or_else(|e| panic!("stage {id}: {e:?}")));
        staging
    }

    fn unstage(&self, id: &str, staging: &Path) {
        self.csi(async |c| c.node.node_unstage_volume(unstage_req(id, staging)).await.unwrap_or_else(|e| panic!("unstage {id}: {e:?}")));
    }

    fn delete(&self, id: &str) {
        self.csi(async |c| c.ctrl.delete_volume(del_req(id)).await.unwrap_or_else(|e| panic!("delete {id}: {e:?}")));
    }

    fn available(&self) -> i64 {
        self.csi(async |c| c.ctrl.get_capacity(capacity_req(block_cap())).await.expect("capacity").into_inner().available_capacity)
    }

    /// The device node of a volume (on any of the bed's drives).
    fn dev(&self, id: &str) -> PathBuf {
        let vols = self.agent.ctl_volumes();
        let v = vols.as_array().unwrap().iter().find(|v| v["id"] == id).unwrap_or_else(|| panic!("volume {id} listed: {vols}"));
        let start = v["start"].as_u64().unwrap();
        let drive = v["drive_id"].as_str().unwrap_or_default().to_string();
        for d in &self.drives {
            if drive_id_of(&self.agent, d) == drive {
                return volume_dev_at(d, start);
            }
        }
        panic!("no drive {drive} for volume {id}")
    }
}

fn volume_dev_at(d: &LoopDrive, start: u64) -> PathBuf {
    drivelet::disk::blkpg::kernel_partitions(&d.dev).unwrap().into_iter().find(|p| p.start == start).expect("kernel partition").devnode
}

/// Writes `len` bytes of a pattern seeded by `seed` to `path` (a file or a device), fsynced.
fn write_pattern(path: &Path, len: usize, seed: u8) {
    let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 11) as u8).collect();
    let create = !path.starts_with("/dev");
    let mut f = std::fs::OpenOptions::new().write(true).create(create).truncate(create).open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
}

fn head_digest(dev: &Path, len: usize) -> String {
    use std::io::Read;
    let mut buf = vec![0u8; len];
    std::fs::File::open(dev).unwrap().read_exact(&mut buf).unwrap();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(&buf, &mut h);
    format!("{:x}", std::hash::Hasher::finish(&h))
}

fn cap_of(fs: &str) -> csi::VolumeCapability {
    if fs == "block" { block_cap() } else { mount_cap(fs) }
}

/// A volume of `fs` (or "block") holding data A, snapshotted, then data B written; a
/// restore holds A. The snapshot outlives its source, a restart and the store's loss.
fn snapshot_and_restore(fs: &str) {
    let size = if fs == "xfs" { 320 * MIB } else { 64 * MIB };
    // Two drives: the snapshot goes on the one its source is not on.
    let mut bed = Bed::new(&[GIB, GIB]);
    let cap = cap_of(fs);
    let src = bed.create(create_req(&format!("pvc-snap-src-{fs}"), size, cap.clone())).expect("create the source").volume_id;
    let first: String;
    if fs == "block" {
        let dev = bed.dev(&src);
        write_pattern(&dev, (8 * MIB) as usize, 1);
        first = head_digest(&dev, (8 * MIB) as usize);
    } else {
        let st = bed.stage(&src, "stage-src", cap.clone());
        write_pattern(&st.join("a.bin"), (4 * MIB) as usize, 1);
        first = digest(&st.join("a.bin"));
        bed.unstage(&src, &st);
    }
    let before = bed.available();
    let snap = bed.snapshot(snapshot_req(&format!("snapshot-{fs}"), &src, &[])).unwrap_or_else(|e| panic!("{fs}: snapshot: {e:?}; log:\n{}", bed.agent.log_tail(30)));
    assert!(snap.ready_to_use, "{fs}: ready to use once answered");
    assert_eq!(snap.source_volume_id, src);
    assert_eq!(snap.size_bytes, size as i64, "{fs}: its size is the source's (the smallest restore)");
    assert!(snap.creation_time.as_ref().is_some_and(|t| t.seconds > 1_700_000_000), "{fs}: a creation time");
    assert!(bed.available() <= before - size as i64, "{fs}: the snapshot takes room: {before} -> {}", bed.available());
    let again = bed.snapshot(snapshot_req(&format!("snapshot-{fs}"), &src, &[])).expect("again");
    assert_eq!(again, snap, "{fs}: the same name and source answer the same snapshot");
    let listed = bed.list(csi::ListSnapshotsRequest { snapshot_id: snap.snapshot_id.clone(), ..Default::default() });
    assert_eq!(listed, vec![snap.clone()], "{fs}: listed by id");
    let by_source = bed.list(csi::ListSnapshotsRequest { source_volume_id: src.clone(), ..Default::default() });
    assert_eq!(by_source, vec![snap.clone()], "{fs}: listed by source");
    assert!(bed.agent.ctl_volume_ids().unwrap().iter().all(|id| *id != snap.snapshot_id), "{fs}: a snapshot is no volume");

    // More data after the snapshot.
    if fs == "block" {
        write_pattern(&bed.dev(&src), (8 * MIB) as usize, 2);
    } else {
        let st = bed.stage(&src, "stage-src", cap.clone());
        write_pattern(&st.join("a.bin"), (4 * MIB) as usize, 2);
        std::fs::write(st.join("after.txt"), "after").unwrap();
        bed.unstage(&src, &st);
    }
    // The source goes; drivelet restarts; then the store is lost too.
    bed.delete(&src);
    assert_eq!(bed.agent.stop(), 0);
    bed.agent.spawn();
    assert_eq!(bed.list(Default::default()), vec![snap.clone()], "{fs}: kept across a restart");
    assert_eq!(bed.agent.stop(), 0);
    let store = bed.agent.dir.join("state");
    std::fs::remove_dir_all(&store).unwrap();
    bed.agent.spawn();
    let rebuilt = bed.list(Default::default());
    assert_eq!(rebuilt.len(), 1, "{fs}: taken back from the drive after the store was lost: {rebuilt:?}; log:\n{}", bed.agent.log_tail(30));
    assert_eq!((&rebuilt[0].snapshot_id, &rebuilt[0].source_volume_id, rebuilt[0].size_bytes), (&snap.snapshot_id, &src, snap.size_bytes));
    assert_eq!(rebuilt[0].creation_time, snap.creation_time, "{fs}: with its creation time");

    // A larger restore holds exactly the first data.
    let v = bed.create(restore_req(&format!("pvc-restored-{fs}"), 2 * size, 0, cap.clone(), &snap.snapshot_id)).unwrap_or_else(|e| panic!("{fs}: restore: {e:?}; log:\n{}", bed.agent.log_tail(30)));
    assert_eq!(v.capacity_bytes, 2 * size as i64);
    assert_eq!(
        v.content_source.and_then(|s| s.r#type),
        Some(csi::volume_content_source::Type::Snapshot(csi::volume_content_source::SnapshotSource { snapshot_id: snap.snapshot_id.clone() })),
        "{fs}: the answer names its snapshot"
    );
    if fs == "block" {
        assert_eq!(head_digest(&bed.dev(&v.volume_id), (8 * MIB) as usize), first, "{fs}: the restore holds the first data");
    } else {
        let st = bed.stage(&v.volume_id, "stage-restored", cap.clone());
        assert_eq!(digest(&st.join("a.bin")), first, "{fs}: the restore holds the first data");
        assert!(!st.join("after.txt").exists(), "{fs}: and nothing written after the snapshot");
        bed.unstage(&v.volume_id, &st);
    }
    bed.delete(&v.volume_id);
    let with = bed.available();
    bed.delete_snapshot(&snap.snapshot_id);
    bed.delete_snapshot(&snap.snapshot_id);
    assert!(bed.list(Default::default()).is_empty(), "{fs}: deleted");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while bed.available() <= with {
        assert!(std::time::Instant::now() < deadline, "{fs}: the snapshot's room came back once cleaned");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for d in &bed.drives {
        assert!(kernel_parts(&d.dev).is_empty(), "{fs}: nothing left on {}", d.dev.display());
    }
}

#[test]
fn an_ext4_snapshot_restores_the_data_it_was_taken_with_after_its_source_a_restart_and_the_store_are_gone() {
    snapshot_and_restore("ext4");
}

#[test]
fn an_xfs_snapshot_restores_the_data_it_was_taken_with_after_its_source_a_restart_and_the_store_are_gone() {
    snapshot_and_restore("xfs");
}

#[test]
fn a_block_snapshot_restores_the_bytes_it_was_taken_with_after_its_source_a_restart_and_the_store_are_gone() {
    snapshot_and_restore("block");
}

#[test]
fn a_volume_in_use_is_snapshotted_only_under_a_freeze_and_the_copy_is_consistent() {
    let bed = Bed::new(&[2 * GIB]);
    frozen_copy(&bed, "ext4", 64 * MIB);
    frozen_copy(&bed, "xfs", 320 * MIB);

    // A block volume in use cannot be frozen: refused whatever the class says.
    let b = bed.create(create_req("pvc-busy-block", 16 * MIB, block_cap())).expect("create block").volume_id;
    let bst = bed.stage(&b, "stage-block", block_cap());
    let e = bed.snapshot(snapshot_req("snap-block-busy", &b, &[("drivelet.io/freeze", "true")])).expect_err("a block volume in use");
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert!(e.message().contains("cannot freeze a block volume"), "{}", e.message());
    bed.unstage(&b, &bst);
    bed.snapshot(snapshot_req("snap-block-busy", &b, &[("drivelet.io/freeze", "true")])).expect("served once unstaged");
}

/// A `fs` volume staged read-write: refused without a freeze; under a freeze, while a
/// writer appends, the copy holds whole lines only, in order.
fn frozen_copy(bed: &Bed, fs: &str, size: u64) {
    let src = bed.create(create_req(&format!("pvc-busy-{fs}"), size, mount_cap(fs))).expect("create").volume_id;
    let st = bed.stage(&src, &format!("stage-busy-{fs}"), mount_cap(fs));
    write_pattern(&st.join("a.bin"), (2 * MIB) as usize, 5);
    let parts = kernel_parts(&bed.drives[0].dev);
    let e = bed.snapshot(snapshot_req(&format!("snap-busy-{fs}"), &src, &[])).expect_err("a snapshot of a volume mounted read-write");
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert!(e.message().contains("mounted read-write") && e.message().contains("drivelet.io/freeze: \"true\""), "{}", e.message());
    assert_eq!(kernel_parts(&bed.drives[0].dev), parts, "nothing changed");

    // A writer keeps appending numbered lines while the frozen copy is taken.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let log = st.join("log.txt");
    let writer = {
        let (stop, log) = (stop.clone(), log.clone());
        std::thread::spawn(move || {
            let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // One write per line: a freeze holds a write whole, before or after.
                f.write_all(format!("line {n:08}\n").as_bytes()).unwrap();
                if n % 64 == 0 {
                    f.sync_data().unwrap();
                }
                n += 1;
            }
            n
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let snap = bed.snapshot(snapshot_req(&format!("snap-frozen-{fs}"), &src, &[("drivelet.io/freeze", "true")])).unwrap_or_else(|e| panic!("{fs}: frozen snapshot: {e:?}; log:\n{}", bed.agent.log_tail(30)));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let lines = writer.join().unwrap();
    assert!(lines > 0);
    let v = bed.create(restore_req(&format!("pvc-frozen-copy-{fs}"), size, 0, mount_cap(fs), &snap.snapshot_id)).expect("restore");
    let rst = bed.stage(&v.volume_id, &format!("stage-copy-{fs}"), mount_cap(fs));
    assert_eq!(digest(&rst.join("a.bin")), digest(&st.join("a.bin")), "the data written before is there");
    let copied = std::fs::read_to_string(rst.join("log.txt")).unwrap_or_default();
    // Consistent: every line whole and in order, a prefix of what the writer wrote.
    for (i, l) in copied.lines().enumerate() {
        assert_eq!(l, format!("line {i:08}"), "{fs}: line {i} of the frozen copy is whole");
    }
    assert!(copied.ends_with('\n') || copied.is_empty(), "no torn last line");
    let logs = bed.agent.logs();
    assert!(logs.contains("\"freeze.millis\""), "the stall is measured and logged");
    bed.unstage(&v.volume_id, &rst);
    bed.unstage(&src, &st);
    bed.delete(&v.volume_id);
}

#[test]
fn snapshot_and_restore_refusals_have_the_spec_codes_and_change_nothing() {
    let bed = Bed::new(&[2 * GIB]);
    let fsv = bed.create(create_req("pvc-r-fs", 64 * MIB, mount_cap("ext4"))).expect("create").volume_id;
    let blk = bed.create(create_req("pvc-r-blk", 16 * MIB, block_cap())).expect("create").volume_id;
    let fs_snap = bed.snapshot(snapshot_req("snap-r-fs", &fsv, &[])).expect("snapshot").snapshot_id;
    let blk_snap = bed.snapshot(snapshot_req("snap-r-blk", &blk, &[])).expect("snapshot").snapshot_id;
    let parts = || kernel_parts(&bed.drives[0].dev);
    let before = parts();
    let snap_code = |what: &str, q: csi::CreateSnapshotRequest, want: Code, text: &str| {
        let e = bed.snapshot(q).expect_err(what);
        assert_eq!(e.code(), want, "{what}: {}", e.message());
        assert!(e.message().contains(text), "{what}: {:?} lacks {text:?}", e.message());
        assert_eq!(parts(), before, "{what}: nothing changed");
    };
    snap_code("an unknown source", snapshot_req("snap-x1", "no-such-volume", &[]), Code::NotFound, "does not exist on this node");
    snap_code("a name reused with another source", snapshot_req("snap-r-fs", &blk, &[]), Code::AlreadyExists, "already exists");
    snap_code("an unknown parameter", snapshot_req("snap-x2", &fsv, &[("color", "blue")]), Code::InvalidArgument, "\"color\"");
    snap_code("a bad freeze value", snapshot_req("snap-x3", &fsv, &[("drivelet.io/freeze", "yes")]), Code::InvalidArgument, "\"yes\"");
    snap_code("no name", snapshot_req("", &fsv, &[]), Code::InvalidArgument, "name");
    snap_code("a snapshot of a snapshot", snapshot_req("snap-x4", &fs_snap, &[]), Code::NotFound, "does not exist");
    let restore_code = |what: &str, q: csi::CreateVolumeRequest, want: Code, text: &str| {
        let e = bed.create(q).expect_err(what);
        assert_eq!(e.code(), want, "{what}: {}", e.message());
        assert!(e.message().contains(text), "{what}: {:?} lacks {text:?}", e.message());
        assert_eq!(parts(), before, "{what}: nothing changed");
    };
    restore_code("a block snapshot into a filesystem", restore_req("pvc-x1", 64 * MIB, 0, mount_cap("ext4"), &blk_snap), Code::InvalidArgument, "of a block volume");
    restore_code("a filesystem snapshot into a block volume", restore_req("pvc-x2", 64 * MIB, 0, block_cap(), &fs_snap), Code::InvalidArgument, "of a filesystem volume");
    restore_code("smaller than the snapshot", restore_req("pvc-x3", 32 * MIB, 32 * MIB, mount_cap("ext4"), &fs_snap), Code::OutOfRange, "64.0 MiB");
    restore_code("an unknown snapshot", restore_req("pvc-x4", 64 * MIB, 0, mount_cap("ext4"), "no-such-snapshot"), Code::NotFound, "snapshot no-such-snapshot does not exist");
    restore_code("a volume id named as a snapshot", restore_req("pvc-x5", 64 * MIB, 0, mount_cap("ext4"), &fsv), Code::NotFound, "does not exist");
    // A snapshot id is no volume: not staged, not listed, not deleted by DeleteVolume.
    let e = bed.csi(async |c| c.ctrl.controller_get_volume(csi::ControllerGetVolumeRequest { volume_id: fs_snap.clone() }).await).expect_err("a snapshot as a volume");
    assert_eq!(e.code(), Code::NotFound);
    bed.delete(&fs_snap);
    assert_eq!(bed.list(Default::default()).len(), 2, "DeleteVolume of a snapshot id deletes nothing");
    // Paging: one at a time, in id order, and a bad token ABORTED.
    let first = bed.csi(async |c| c.ctrl.list_snapshots(csi::ListSnapshotsRequest { max_entries: 1, ..Default::default() }).await.unwrap().into_inner());
    assert_eq!(first.entries.len(), 1);
    assert!(!first.next_token.is_empty());
    let second = bed.csi(async |c| c.ctrl.list_snapshots(csi::ListSnapshotsRequest { max_entries: 1, starting_token: first.next_token.clone(), ..Default::default() }).await.unwrap().into_inner());
    assert_eq!(second.entries.len(), 1);
    assert_ne!(first.entries[0], second.entries[0]);
    let e = bed.csi(async |c| c.ctrl.list_snapshots(csi::ListSnapshotsRequest { starting_token: "nope".into(), ..Default::default() }).await).expect_err("bad token");
    assert_eq!(e.code(), Code::Aborted);

    // A snapshot on a drive that is gone is not restored from, and says why.
    let mut bed = bed;
    bed.drives[0].detach();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match bed.create(restore_req("pvc-x6", 64 * MIB, 0, mount_cap("ext4"), &fs_snap)) {
            Err(e) if e.code() == Code::FailedPrecondition => {
                // Absent, or first seen failing as it goes: either way it says why.
                assert!(["absent", "failing", "gone"].iter().any(|w| e.message().contains(w)), "{}", e.message());
                assert!(e.message().contains("cannot be restored from"), "{}", e.message());
                break;
            }
            other => assert!(std::time::Instant::now() < deadline, "a restore from a snapshot on a detached drive: {other:?}"),
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
