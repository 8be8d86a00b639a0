//! Growth wherever the node has room: a volume with no free space after it on its drive
//! grows by moving to a bigger free extent of another drive (evacuation's verified
//! copy, the same id), keeping its data byte for byte and its filesystem sound; one in
//! use is refused in words saying it grows at its next stage, and does once unstaged;
//! a size no drive holds is OUT_OF_RANGE naming the largest possible.
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

/// Two 1 GiB drives and an agent; an ext4 volume `v` holding data (a file of 8 MiB and
/// a line of text), and a block volume right after it on the same drive (best fit puts
/// both on one drive): `v` cannot grow in place.
struct Boxed {
    tmp: tempfile::TempDir,
    drives: [LoopDrive; 2],
    agent: Agent,
    v: String,
    /// Index of the drive `v` starts on.
    on: usize,
    staging: std::path::PathBuf,
    /// Digest of the file written.
    file: String,
}

impl Boxed {
    fn new(name: &str) -> Boxed {
        require_host();
        let tmp = short_tempdir();
        let drives = [LoopDrive::new(tmp.path(), "a.img", GIB), LoopDrive::new(tmp.path(), "b.img", GIB)];
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
        Boxed { tmp, drives, agent, v, on, staging, file }
    }

    /// Grows `v` to `bytes`.
    fn expand(&self, bytes: u64) -> Result<csi::ControllerExpandVolumeResponse, tonic::Status> {
        rt().block_on(async {
            let mut c = Csi::connect(&self.agent).await;
            c.ctrl.controller_expand_volume(expand_req(&self.v, bytes, 0)).await.map(|r| r.into_inner())
        })
    }

    /// Asserts `v` now lives on the other drive, grown, and nothing of it is left on
    /// its first drive; with `before`, that its old bytes (their digest) come first.
    fn assert_moved(&self, before: Option<&str>) {
        let (from, to) = (&self.drives[self.on], &self.drives[1 - self.on]);
        assert!(entry_of(&from.dev, &self.v).is_none(), "nothing of v is left on its first drive: {:?}", gpt_entries(&from.dev));
        let e = entry_of(&to.dev, &self.v).unwrap_or_else(|| panic!("v is on the other drive: {:?}; log:\n{}", gpt_entries(&to.dev), self.agent.log_tail(30)));
        assert_eq!(e.size, GROWN, "its partition there has the new size");
        let Some(before) = before else { return };
        let after = head_digest(&volume_dev(to, &self.v), SIZE);
        assert_eq!(after, before, "the volume's bytes, byte for byte, at the start of its new partition");
    }

    /// Stages `v`, checks its data and its grown filesystem, unstages it, and checks the
    /// filesystem with `e2fsck -f -n`.
    fn assert_data_and_grown_filesystem(&self) {
        let to = &self.drives[1 - self.on];
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

    fn before(&self) -> String {
        head_digest(&volume_dev(&self.drives[self.on], &self.v), SIZE)
    }
}

#[test]
fn a_volume_with_no_room_after_it_grows_by_moving_to_another_drive_keeping_its_data() {
    let mut b = Boxed::new("move");
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
    // GetCapacity promises no more than the largest growth named.
    let cap = rt().block_on(async {
        let mut c = Csi::connect(&b.agent).await;
        c.ctrl.get_capacity(capacity_req(mount_cap("ext4"))).await.expect("capacity").into_inner()
    });
    // The other drive holds the node's largest free extent: what GetCapacity promises
    // is what the growth's error names as the reach of a move.
    let max = cap.maximum_volume_size.map_or(0, |m| m as u64);
    let reach = format!("the largest free extent it could move to on another drive of this node holds {}", drivelet::config::human_bytes(max));
    assert!(e.message().contains(&reach), "GetCapacity's maximum ({max}) is the reach named: {}", e.message());
    // The growth survives a restart.
    b.agent.kill();
    b.agent.spawn();
    b.assert_moved(None);
    assert_eq!(b.agent.stop(), 0, "clean exit; log:\n{}", b.agent.log_tail(30));
    drop(b.tmp);
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
