//! Growth wherever the node has room: a volume with no free space after it on its drive
//! grows by moving to a bigger free extent of another drive, or, on a node of one
//! drive, elsewhere on its own drive (evacuation's verified copy, the same id, and in
//! the end the same partition GUID, unmarked), keeping its data byte for byte and its
//! filesystem sound; one in use is refused in words saying it grows at its next stage,
//! and does once unstaged; a size no drive holds is OUT_OF_RANGE naming the largest
//! possible, which is GetCapacity's `maximum_volume_size`; a whole-drive volume grows by
//! moving to a bigger empty drive and takes all of it.
//! (A growth's move killed at every crash point: tests/integration/robustness/crash.rs.)

use std::path::Path;

use crate::common::*;
use drivelet::grpc::proto::csi;
use tonic::Code;

/// The size each test volume starts at, and grows to.
const SIZE: u64 = 64 * MIB;
const GROWN: u64 = 300 * MIB;

/// Total bytes of the filesystem mounted at `path`.
fn fs_size(path: &Path) -> u64 {
    let st = nix::sys::statvfs::statvfs(path).expect("statvfs");
    st.blocks() as u64 * st.fragment_size() as u64
}

/// The SHA-256 of the first `len` bytes of `dev`, read O_DIRECT.
fn head_digest(dev: &Path, len: u64) -> String {
    let cmd = format!("dd if={} iflag=direct bs=1M count={} status=none | sha256sum", dev.display(), len / MIB);
    sh("sh", &["-c", &cmd]).split_whitespace().next().unwrap_or_default().to_string()
}

/// The GPT entry of `id` on `dev`, if any.
fn entry_of(dev: &Path, id: &str) -> Option<GptEntry> {
    gpt_entries(dev).into_iter().find(|e| e.uuid.eq_ignore_ascii_case(id))
}

/// Whether the partition of `id` on `dev` carries the move mark, read by drivelet's
/// GPT reader; `None` when there is none.
fn marked(dev: &Path, id: &str) -> Option<bool> {
    let t = drivelet::disk::gpt::read_table(dev, 512).expect("read the GPT")?;
    t.partitions.iter().find(|q| q.guid.to_string().eq_ignore_ascii_case(id)).map(|q| q.is_move_copy())
}

/// One or two 1 GiB drives and an agent; an ext4 volume `v` holding data (a file of 8
/// MiB and a line of text), and a block volume right after it on the same drive (best
/// fit puts both on one drive): `v` cannot grow in place.
struct Boxed {
    tmp: tempfile::TempDir,
    drives: Vec<LoopDrive>,
    agent: Agent,
    v: String,
    /// Index of the drive `v` starts on.
    on: usize,
    /// `v`'s partition before the growth.
    old: GptEntry,
    staging: std::path::PathBuf,
    /// Digest of the file written.
    file: String,
}

impl Boxed {
    fn new(name: &str) -> Boxed {
        Boxed::with_drives(name, 2)
    }

    fn with_drives(name: &str, count: usize) -> Boxed {
        require_host();
        let tmp = short_tempdir();
        let drives: Vec<LoopDrive> = ["a.img", "b.img"][..count].iter().map(|f| LoopDrive::new(tmp.path(), f, GIB)).collect();
        sh("udevadm", &["settle"]);
        let agent = Agent::start(tmp.path(), AgentOpts::default());
        let staging = tmp.path().join("kubelet/plugins/stage");
        let (v, w) = rt().block_on(async {
            let mut c = Csi::connect(&agent).await;
            let v = c.ctrl.create_volume(create_req(&format!("pvc-{name}"), SIZE, mount_cap("ext4"))).await.expect("create v").into_inner();
            let w = c.ctrl.create_volume(create_req(&format!("pvc-{name}-next"), SIZE, block_cap())).await.expect("create w").into_inner();
            (v.volume.expect("v").volume_id, w.volume.expect("w").volume_id)
        });
        let on = if entry_of(&drives[0].dev, &v).is_some() { 0 } else { 1 };
        let old = entry_of(&drives[on].dev, &v).expect("v's entry");
        let (ev, ew) = (entry_of(&drives[on].dev, &v).expect("v's entry"), entry_of(&drives[on].dev, &w).expect("w is on v's drive"));
        assert_eq!(ev.start + ev.size, ew.start, "the next volume follows v right after it: {ev:?} {ew:?}");
        // Data: a file of pseudo-random bytes and a line of text.
        rt().block_on(async {
            let mut c = Csi::connect(&agent).await;
            c.node.node_stage_volume(stage_req(&v, &staging, mount_cap("ext4"))).await.expect("stage");
        });
        let data: Vec<u8> = (0..8 * MIB as usize).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        std::fs::write(staging.join("blob"), &data).expect("write the blob");
        std::fs::write(staging.join("kept.txt"), "written before the growth").expect("write");
        let file = digest(&staging.join("blob"));
        rt().block_on(async {
            let mut c = Csi::connect(&agent).await;
            c.node.node_unstage_volume(unstage_req(&v, &staging)).await.expect("unstage");
        });
        Boxed { tmp, drives, agent, v, on, old, staging, file }
    }

    /// Grows `v` to `bytes`.
    fn expand(&self, bytes: u64) -> Result<csi::ControllerExpandVolumeResponse, tonic::Status> {
        rt().block_on(async {
            let mut c = Csi::connect(&self.agent).await;
            c.ctrl.controller_expand_volume(expand_req(&self.v, bytes, 0)).await.map(|r| r.into_inner())
        })
    }

    /// The drive `v` grows onto: the other one, or its own on a node of one drive.
    fn target(&self) -> &LoopDrive {
        &self.drives[if self.drives.len() == 1 { 0 } else { 1 - self.on }]
    }

    /// Asserts `v` now lives on the other drive (or elsewhere on its own), grown, its
    /// partition carrying its GUID, unmarked, and nothing of it is left where it was;
    /// with `before`, that its old bytes (their digest) come first.
    fn assert_moved(&self, before: Option<&str>) {
        let (from, to) = (&self.drives[self.on], self.target());
        let log = || self.agent.log_tail(30);
        if self.drives.len() == 2 {
            assert!(entry_of(&from.dev, &self.v).is_none(), "nothing of v is left on its first drive: {:?}", gpt_entries(&from.dev));
        }
        let mine: Vec<GptEntry> = gpt_entries(&to.dev).into_iter().filter(|e| e.uuid.eq_ignore_ascii_case(&self.v)).collect();
        assert_eq!(mine.len(), 1, "one partition carries v's GUID: {:?}; log:\n{}", gpt_entries(&to.dev), log());
        let e = &mine[0];
        assert_eq!(e.size, GROWN, "its partition there has the new size");
        assert_eq!(marked(&to.dev, &self.v), Some(false), "its partition carries no move mark");
        if self.drives.len() == 1 {
            assert_ne!(e.start, self.old.start, "at a new place");
            assert_eq!(gpt_entries(&to.dev).len(), 2, "v and the next volume, no copy left: {:?}", gpt_entries(&to.dev));
        }
        let Some(before) = before else { return };
        let after = head_digest(&volume_dev(to, &self.v), SIZE);
        assert_eq!(after, before, "the volume's bytes, byte for byte, at the start of its new partition");
    }

    /// Stages `v`, checks its data and its grown filesystem, unstages it, and checks the
    /// filesystem with `e2fsck -f -n`.
    fn assert_data_and_grown_filesystem(&self) {
        let to = self.target();
        rt().block_on(async {
            let mut c = Csi::connect(&self.agent).await;
            c.node.node_stage_volume(stage_req(&self.v, &self.staging, mount_cap("ext4"))).await.expect("stage the grown volume");
            let r = c.node.node_expand_volume(node_expand_req(&self.v, &self.staging, GROWN)).await.expect("node expand");
            assert_eq!(r.into_inner().capacity_bytes, GROWN as i64);
        });
        assert_eq!(digest(&self.staging.join("blob")), self.file, "the blob reads back the same");
        assert_eq!(std::fs::read_to_string(self.staging.join("kept.txt")).unwrap(), "written before the growth");
        let size = fs_size(&self.staging);
        assert!(size >= GROWN * 85 / 100, "the filesystem has grown: {size} of {GROWN}");
        rt().block_on(async {
            let mut c = Csi::connect(&self.agent).await;
            c.node.node_unstage_volume(unstage_req(&self.v, &self.staging)).await.expect("unstage");
        });
        let dev = volume_dev(to, &self.v);
        let out = std::process::Command::new("e2fsck").args(["-f", "-n"]).arg(&dev).output().expect("e2fsck");
        assert!(out.status.success(), "e2fsck finds the filesystem sound: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }

    /// Asserts that the reach of a move the refusal `e` names is GetCapacity's
    /// `maximum_volume_size`, and not nothing.
    fn assert_reach_is_capacity(&self, e: &tonic::Status) {
        let cap = rt().block_on(async {
            let mut c = Csi::connect(&self.agent).await;
            c.ctrl.get_capacity(capacity_req(mount_cap("ext4"))).await.expect("capacity").into_inner()
        });
        let max = cap.maximum_volume_size.map_or(0, |m| m as u64);
        let reach = format!("the largest free extent it could move to on the drives of this node holds {}", drivelet::config::human_bytes(max));
        assert!(max > 0 && e.message().contains(&reach), "GetCapacity's maximum ({max}) is the reach named: {}", e.message());
    }

    /// Kills and restarts the agent, asserts `v` is still where it grew, and stops it.
    fn assert_growth_survives_a_restart(mut self) {
        self.agent.kill();
        self.agent.spawn();
        self.assert_moved(None);
        assert_eq!(self.agent.stop(), 0, "clean exit; log:\n{}", self.agent.log_tail(30));
        drop(self.tmp);
    }

    fn before(&self) -> String {
        head_digest(&volume_dev(&self.drives[self.on], &self.v), SIZE)
    }
}

#[test]
fn a_volume_with_no_room_after_it_grows_by_moving_to_another_drive_keeping_its_data() {
    let b = Boxed::new("move");
    let before = b.before();
    let old = entry_of(&b.drives[b.on].dev, &b.v).expect("v");
    let r = b.expand(GROWN).unwrap_or_else(|e| panic!("grown by a move: {e:?}; log:\n{}", b.agent.log_tail(40)));
    assert_eq!(r.capacity_bytes, GROWN as i64);
    assert!(r.node_expansion_required, "its filesystem grows at the node");
    b.assert_moved(Some(&before));
    // The same size again: nothing more to do.
    assert_eq!(b.expand(GROWN).expect("again").capacity_bytes, GROWN as i64);
    // The old extent went to the cleaner: zeros once cleaned.
    wait_clean(&b.agent, &b.drives[b.on]);
    assert_eq!(first_nonzero(&b.drives[b.on].dev, old.start, old.start + old.size), None, "the old extent is zeroed");
    b.assert_data_and_grown_filesystem();
    // More than any drive holds: OUT_OF_RANGE naming the largest possible.
    let e = b.expand(2 * GIB).expect_err("more than a drive holds");
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
    assert!(e.message().contains("the largest it can grow to now is"), "{}", e.message());
    // The other drive holds the node's largest free extent: what GetCapacity promises
    // is what the growth's error names as the reach of a move.
    b.assert_reach_is_capacity(&e);
    // The growth survives a restart.
    b.assert_growth_survives_a_restart();
}

#[test]
fn an_in_use_volume_that_can_grow_only_by_moving_grows_after_its_unstage() {
    let mut b = Boxed::new("inuse");
    rt().block_on(async {
        let mut c = Csi::connect(&b.agent).await;
        c.node.node_stage_volume(stage_req(&b.v, &b.staging, mount_cap("ext4"))).await.expect("stage");
    });
    for attempt in ["first", "retried"] {
        let e = b.expand(GROWN).expect_err("in use");
        assert_eq!(e.code(), Code::FailedPrecondition, "{attempt}: {e:?}");
        assert!(
            e.message().contains("while it is in use") && e.message().contains("grows at its next stage, once no pod uses it") && !e.message().contains("{"),
            "{attempt}: {}",
            e.message()
        );
        assert_eq!(entry_of(&b.drives[b.on].dev, &b.v).map(|e| e.size), Some(SIZE), "{attempt}: nothing moved or grew");
    }
    rt().block_on(async {
        let mut c = Csi::connect(&b.agent).await;
        c.node.node_unstage_volume(unstage_req(&b.v, &b.staging)).await.expect("unstage");
    });
    let before = b.before();
    // What the resizer's retry does once the pod is gone: the same call, now offline.
    let r = b.expand(GROWN).unwrap_or_else(|e| panic!("grown once unstaged: {e:?}; log:\n{}", b.agent.log_tail(40)));
    assert_eq!(r.capacity_bytes, GROWN as i64);
    b.assert_moved(Some(&before));
    b.assert_data_and_grown_filesystem();
    assert_eq!(b.agent.stop(), 0);
}

#[test]
fn on_a_node_of_one_drive_a_volume_with_a_neighbour_after_it_grows_by_moving_elsewhere_on_its_drive() {
    let b = Boxed::with_drives("one", 1);
    let before = b.before();
    let r = b.expand(GROWN).unwrap_or_else(|e| panic!("grown by a move on its drive: {e:?}; log:\n{}", b.agent.log_tail(40)));
    assert_eq!(r.capacity_bytes, GROWN as i64);
    assert!(r.node_expansion_required, "its filesystem grows at the node");
    b.assert_moved(Some(&before));
    let dev = &b.drives[0].dev;
    let new = entry_of(dev, &b.v).expect("v");
    assert!(new.start >= b.old.start + 2 * SIZE || new.start + new.size <= b.old.start, "apart from v's old place and its neighbour: {new:?}");
    // Listed at its new size, by ListVolumes and ctl, with the same id.
    let listed = rt().block_on(async {
        let mut c = Csi::connect(&b.agent).await;
        c.ctrl.list_volumes(csi::ListVolumesRequest::default()).await.expect("list").into_inner().entries
    });
    let size_of = listed.iter().filter_map(|e| e.volume.as_ref()).find(|v| v.volume_id == b.v).map(|v| v.capacity_bytes);
    assert_eq!(size_of, Some(GROWN as i64), "ListVolumes shows the new size");
    let vols = b.agent.ctl_volumes();
    let rec = vols.as_array().unwrap().iter().find(|r| r["id"] == b.v.as_str()).unwrap_or_else(|| panic!("ctl lists v: {vols}"));
    assert_eq!((rec["start"].as_u64(), rec["size"].as_u64()), (Some(new.start), Some(GROWN)), "ctl: {rec}");
    assert!(rec.get("moving").is_none(), "the move is over: {rec}");
    // The old extent went to the cleaner: zeros once cleaned.
    wait_clean(&b.agent, &b.drives[0]);
    assert_eq!(first_nonzero(dev, b.old.start, b.old.start + b.old.size), None, "the old extent is zeroed");
    b.assert_data_and_grown_filesystem();
    // More than the drive holds: OUT_OF_RANGE naming the largest free extent of the
    // drive, which is what GetCapacity promises.
    let e = b.expand(2 * GIB).expect_err("more than the drive holds");
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
    b.assert_reach_is_capacity(&e);
    b.assert_growth_survives_a_restart();
}

#[test]
fn a_whole_drive_volume_grows_by_moving_to_a_bigger_empty_drive_and_takes_all_of_it() {
    require_host();
    let tmp = short_tempdir();
    let small = LoopDrive::new(tmp.path(), "small.img", 512 * MIB);
    let big = LoopDrive::new(tmp.path(), "big.img", GIB);
    sh("udevadm", &["settle"]);
    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    let whole = [("layout", "drive")];
    // The tightest drive that fits: the small one, all of it.
    let (id, size) = rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        let v = c.ctrl.create_volume(vol_req("pvc-whole", SIZE as i64, 0, vec![block_cap()], &whole)).await.expect("create").into_inner().volume.expect("volume");
        (v.volume_id, v.capacity_bytes as u64)
    });
    let old = entry_of(&small.dev, &id).expect("on the small drive");
    assert_eq!(old.size, size, "a whole-drive volume is its drive's usable region");
    // Data at its start.
    let dev = volume_dev(&small, &id);
    sh("sh", &["-c", &format!("head -c {} /dev/urandom | dd of={} oflag=direct bs=1M status=none", 16 * MIB, dev.display())]);
    let before = head_digest(&dev, 16 * MIB);
    // Asked for more than the small drive: it moves to the big one and takes its region.
    let r = rt()
        .block_on(async {
            let mut c = Csi::connect(&agent).await;
            c.ctrl.controller_expand_volume(expand_req(&id, 700 * MIB, 0)).await.map(|r| r.into_inner())
        })
        .unwrap_or_else(|e| panic!("grown by a move: {e:?}; log:\n{}", agent.log_tail(40)));
    let new = entry_of(&big.dev, &id).expect("on the big drive now");
    assert_eq!(r.capacity_bytes as u64, new.size, "the answer is the size it has");
    assert!(new.size > 1000 * MIB, "the whole usable region of the big drive: {new:?}");
    assert_eq!(marked(&big.dev, &id), Some(false), "no move mark left");
    assert!(entry_of(&small.dev, &id).is_none(), "nothing of it left on the small drive: {:?}", gpt_entries(&small.dev));
    assert_eq!(head_digest(&volume_dev(&big, &id), 16 * MIB), before, "its bytes, byte for byte");
    let listed = rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        c.ctrl.list_volumes(csi::ListVolumesRequest::default()).await.expect("list").into_inner()
    });
    let entry = listed.entries.iter().filter_map(|e| e.volume.as_ref()).find(|v| v.volume_id == id).expect("listed");
    assert_eq!(entry.capacity_bytes as u64, new.size);
    // The small drive's old region goes to the cleaner; a bigger growth finds no empty
    // drive that holds it and says so (the only empty one, the small drive, is smaller).
    wait_clean(&agent, &small);
    assert_eq!(first_nonzero(&small.dev, old.start, old.start + old.size), None, "the old region is zeroed");
    let e = rt()
        .block_on(async {
            let mut c = Csi::connect(&agent).await;
            c.ctrl.controller_expand_volume(expand_req(&id, 2 * GIB, 0)).await.map(|r| r.into_inner())
        })
        .expect_err("no empty drive that big");
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
    let most = format!("the largest it can grow to now is {} ({} bytes)", drivelet::config::human_bytes(new.size), new.size);
    assert!(e.message().contains("no other managed drive of this node is empty and larger than it") && e.message().contains(&most), "{}", e.message());
    // It survives a restart where it is.
    agent.kill();
    agent.spawn();
    assert_eq!(entry_of(&big.dev, &id).map(|e| e.size), Some(new.size));
    assert_eq!(agent.stop(), 0, "clean exit; log:\n{}", agent.log_tail(30));
    drop(tmp);
}
