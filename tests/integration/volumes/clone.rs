//! Clones end to end: CreateVolume with a source volume on real loop drives.
//!
//! - data written into an ext4, xfs or block source is read back from its clone; a
//!   filesystem clone has a UUID of its own (both mount side by side, which xfs refuses
//!   for two filesystems with one UUID), checks clean, grows to a larger clone's size,
//!   and is independent of its source;
//! - only what the filesystem uses is copied: cloning a 1 GiB ext4 or xfs volume that
//!   holds 8 MiB writes a small fraction of 1 GiB to the drive (block volumes are
//!   copied whole);
//! - refusals with the spec's codes, each changing nothing: an unknown source
//!   NOT_FOUND (so is an unknown snapshot), another access type or filesystem INVALID_ARGUMENT, a
//!   `limit_bytes` below the source's size OUT_OF_RANGE, a source mounted read-write
//!   whose class says `drivelet.io/clone-in-use: refuse` FAILED_PRECONDITION (served
//!   once it is unstaged, or staged read-only; clones of sources in use are
//!   `clone_in_use.rs`'s);
//! - idempotency: the same name and source answer the same volume, another source (or
//!   none) ALREADY_EXISTS; a clone asked smaller than its source gets the source's size.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::common::*;
use drivelet::grpc::proto::csi;
use tonic::Code;

fn reader_cap(fs: &str) -> csi::VolumeCapability {
    let mut c = mount_cap(fs);
    c.access_mode = Some(csi::volume_capability::AccessMode { mode: csi::volume_capability::access_mode::Mode::SingleNodeReaderOnly as i32 });
    c
}

/// Writes `len` bytes of a pattern seeded by `seed` to `path`, fsynced.
fn write_pattern(path: &Path, len: usize, seed: u8) {
    let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8).collect();
    // A device node is never created: a missing one must fail here, not become a
    // regular file in /dev that squats the node's name for every later test.
    let create = !path.starts_with("/dev");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(create)
        .truncate(create)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
}

/// The device node of the kernel partition of `drive` that starts where `id`'s does.
pub(super) fn devnode_of(agent: &Agent, drive: &LoopDrive, id: &str) -> PathBuf {
    let vols = agent.ctl_volumes();
    let v = vols.as_array().unwrap().iter().find(|v| v["id"] == id).unwrap_or_else(|| panic!("volume {id} listed: {vols}"));
    let start = v["start"].as_u64().unwrap_or_else(|| panic!("start of {v}"));
    drivelet::disk::blkpg::kernel_partitions(&drive.dev)
        .unwrap()
        .into_iter()
        .find(|p| p.start == start)
        .unwrap_or_else(|| panic!("no kernel partition at {start} for {id}"))
        .devnode
}

fn uuid_of(dev: &Path) -> String {
    sh("blkid", &["-p", "-s", "UUID", "-o", "value", dev.to_str().unwrap()])
}

pub(super) struct Bed {
    pub(super) agent: Agent,
    _unmount: Unmounter,
    pub(super) drive: LoopDrive,
    pub(super) tmp: tempfile::TempDir,
}

impl Bed {
    pub(super) fn new(size: u64) -> Bed {
        require_host();
        let tmp = short_tempdir();
        let drive = LoopDrive::new(tmp.path(), "c.img", size);
        let agent = Agent::start(tmp.path(), AgentOpts::default());
        let unmount = Unmounter(tmp.path().join("kubelet"));
        Bed { agent, _unmount: unmount, drive, tmp }
    }

    pub(super) fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join("kubelet").join(rel)
    }

    pub(super) fn create(&self, q: csi::CreateVolumeRequest) -> Result<csi::Volume, tonic::Status> {
        rt().block_on(async {
            let mut c = Csi::connect(&self.agent).await;
            c.ctrl.create_volume(q).await.map(|r| r.into_inner().volume.expect("volume"))
        })
    }

    pub(super) fn stage(&self, id: &str, at: &str, cap: csi::VolumeCapability) -> PathBuf {
        let staging = self.path(at);
        rt().block_on(async {
            let mut c = Csi::connect(&self.agent).await;
            c.node.node_stage_volume(stage_req(id, &staging, cap)).await.unwrap_or_else(|e| panic!("stage {id}: {e:?}"));
        });
        staging
    }

    pub(super) fn unstage(&self, id: &str, staging: &Path) {
        rt().block_on(async {
            let mut c = Csi::connect(&self.agent).await;
            let q = csi::NodeUnstageVolumeRequest { volume_id: id.into(), staging_target_path: staging.display().to_string() };
            c.node.node_unstage_volume(q).await.unwrap_or_else(|e| panic!("unstage {id}: {e:?}"));
        });
    }

    pub(super) fn delete(&self, id: &str) {
        rt().block_on(async {
            let mut c = Csi::connect(&self.agent).await;
            c.ctrl.delete_volume(csi::DeleteVolumeRequest { volume_id: id.into(), ..Default::default() }).await.unwrap_or_else(|e| panic!("delete {id}: {e:?}"));
        });
    }

    /// Makes a filesystem source holding `data` bytes of a pattern in `data.bin` and a
    /// small `note.txt`, unstaged again; answers its id.
    fn filesystem_source(&self, name: &str, fs: &str, size: u64, data: usize) -> String {
        let id = self.create(create_req(name, size, mount_cap(fs))).expect("create the source").volume_id;
        let st = self.stage(&id, &format!("stage-{name}"), mount_cap(fs));
        write_pattern(&st.join("data.bin"), data, 7);
        std::fs::write(st.join("note.txt"), format!("written into {name}")).unwrap();
        self.unstage(&id, &st);
        id
    }
}

fn filesystem_clone(fs: &str, size: u64) {
    let bed = Bed::new(2 * GIB);
    let src = bed.filesystem_source(&format!("pvc-src-{fs}"), fs, size, 20 << 20);
    // Larger than the source: the filesystem grows to the clone's size.
    let name = format!("pvc-clone-{fs}");
    let v = bed.create(clone_req(&name, 2 * size, 0, mount_cap(""), &src)).expect("clone");
    assert_eq!(v.capacity_bytes, 2 * size as i64, "{fs}: the clone has the size asked for");
    let named = v.content_source.as_ref().and_then(|s| s.r#type.clone());
    assert_eq!(
        named,
        Some(csi::volume_content_source::Type::Volume(csi::volume_content_source::VolumeSource { volume_id: src.clone() })),
        "{fs}: the answer names its source"
    );
    assert_eq!(v.volume_context.get("drivelet.io/fs").map(String::as_str), Some(fs), "{fs}: the clone holds its source's filesystem");
    let (src_dev, clone_dev) = (devnode_of(&bed.agent, &bed.drive, &src), devnode_of(&bed.agent, &bed.drive, &v.volume_id));
    assert_ne!(uuid_of(&src_dev), uuid_of(&clone_dev), "{fs}: the clone has a filesystem UUID of its own");
    let fsck = match fs {
        "xfs" => std::process::Command::new("xfs_repair").arg("-n").arg(&clone_dev).output().unwrap(),
        _ => std::process::Command::new("e2fsck").arg("-fn").arg(&clone_dev).output().unwrap(),
    };
    assert!(fsck.status.success(), "{fs}: the clone checks clean: {}", String::from_utf8_lossy(&fsck.stdout));

    // A repeated call answers the same volume.
    let again = bed.create(clone_req(&name, 2 * size, 0, mount_cap(""), &src)).expect("the clone again");
    assert_eq!((again.volume_id.as_str(), again.capacity_bytes), (v.volume_id.as_str(), v.capacity_bytes), "{fs}: idempotent");

    // Both staged side by side: the same data, the clone grown, and independent.
    let s1 = bed.stage(&src, "stage-src", mount_cap(fs));
    let s2 = bed.stage(&v.volume_id, "stage-clone", mount_cap(fs));
    assert_eq!(digest(&s2.join("data.bin")), digest(&s1.join("data.bin")), "{fs}: the clone holds the source's data");
    assert_eq!(std::fs::read_to_string(s2.join("note.txt")).unwrap(), format!("written into pvc-src-{fs}"));
    let total = |p: &Path| {
        let st = nix::sys::statvfs::statvfs(p).unwrap();
        st.blocks() as u64 * st.fragment_size() as u64
    };
    assert!(total(&s2) > size, "{fs}: the clone's filesystem grew past the source's {size} bytes: {}", total(&s2));
    std::fs::write(s2.join("note.txt"), "changed in the clone").unwrap();
    assert_eq!(std::fs::read_to_string(s1.join("note.txt")).unwrap(), format!("written into pvc-src-{fs}"), "{fs}: the source is untouched");
    bed.unstage(&v.volume_id, &s2);
    bed.unstage(&src, &s1);
    bed.delete(&v.volume_id);
    bed.delete(&src);
    assert!(kernel_parts(&bed.drive.dev).is_empty(), "{fs}: nothing left");
}

#[test]
fn an_ext4_clone_holds_the_source_data_with_its_own_uuid_grown_and_independent() {
    filesystem_clone("ext4", 64 * MIB);
}

#[test]
fn an_xfs_clone_holds_the_source_data_with_its_own_uuid_grown_and_independent() {
    filesystem_clone("xfs", 320 * MIB);
}

#[test]
fn a_block_clone_holds_every_byte_of_the_source() {
    let bed = Bed::new(GIB);
    let src = bed.create(create_req("pvc-src-block", 16 * MIB, block_cap())).expect("create").volume_id;
    let src_dev = devnode_of(&bed.agent, &bed.drive, &src);
    write_pattern(&src_dev, (16 * MIB) as usize, 3);
    let v = bed.create(clone_req("pvc-clone-block", 32 * MIB, 0, block_cap(), &src)).expect("clone");
    assert_eq!(v.capacity_bytes, 32 * MIB as i64);
    let clone_dev = devnode_of(&bed.agent, &bed.drive, &v.volume_id);
    let head = |dev: &Path| {
        let mut buf = vec![0u8; (16 * MIB) as usize];
        use std::io::Read;
        std::fs::File::open(dev).unwrap().read_exact(&mut buf).unwrap();
        buf
    };
    assert!(head(&clone_dev) == head(&src_dev), "the clone's first 16 MiB are the source's bytes");
    bed.delete(&v.volume_id);
    bed.delete(&src);
}

#[test]
fn a_clone_copies_only_the_blocks_its_filesystem_uses() {
    for fs in ["ext4", "xfs"] {
        let bed = Bed::new(3 * GIB);
        let src = bed.filesystem_source(&format!("pvc-used-{fs}"), fs, GIB, 8 << 20);
        sh("sync", &[]);
        let before = sectors_written(&bed.drive.dev) * 512;
        let v = bed.create(clone_req(&format!("pvc-used-clone-{fs}"), GIB, 0, mount_cap(fs), &src)).expect("clone");
        let written = sectors_written(&bed.drive.dev) * 512 - before;
        eprintln!("{fs}: cloning a 1 GiB volume holding 8 MiB wrote {} MiB to the drive", written >> 20);
        assert!(written < GIB / 4, "{fs}: a clone of 1 GiB holding 8 MiB wrote {written} bytes: more than the used blocks");
        bed.delete(&v.volume_id);
        bed.delete(&src);
    }
}

#[test]
fn clone_refusals_have_the_spec_codes_and_change_nothing() {
    let bed = Bed::new(2 * GIB);
    let src = bed.filesystem_source("pvc-r-src", "ext4", 64 * MIB, 1 << 20);
    let parts = || kernel_parts(&bed.drive.dev);
    let before = parts();
    let code = |what: &str, q: csi::CreateVolumeRequest, want: Code, text: &str| {
        let e = bed.create(q).expect_err(what);
        assert_eq!(e.code(), want, "{what}: {}", e.message());
        assert!(e.message().contains(text), "{what}: {:?} lacks {text:?}", e.message());
        assert_eq!(parts(), before, "{what}: nothing changed on the drive");
    };
    code("an unknown source", clone_req("pvc-r1", 64 * MIB, 0, mount_cap("ext4"), "no-such-volume"), Code::NotFound, "does not exist on this node");
    let mut snap = create_req("pvc-r2", 64 * MIB, mount_cap("ext4"));
    snap.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(csi::volume_content_source::SnapshotSource { snapshot_id: "s".into() })),
    });
    code("an unknown snapshot source", snap, Code::NotFound, "snapshot s does not exist");
    code("a block clone of a filesystem", clone_req("pvc-r3", 64 * MIB, 0, block_cap(), &src), Code::InvalidArgument, "a filesystem volume");
    code("an xfs clone of ext4", clone_req("pvc-r4", 320 * MIB, 0, mount_cap("xfs"), &src), Code::InvalidArgument, "holds ext4, not xfs");
    code("limit_bytes below the source", clone_req("pvc-r5", 32 * MIB, 32 * MIB, mount_cap("ext4"), &src), Code::OutOfRange, "needs at least 64.0 MiB");

    // In use by a writer: staged read-write, refused by a class that says so (the
    // default freezes it: `clone_in_use.rs`); staged read-only, served.
    let st = bed.stage(&src, "stage-rw", mount_cap("ext4"));
    let mut refuse = clone_req("pvc-r6", 64 * MIB, 0, mount_cap("ext4"), &src);
    refuse.parameters = kv(&[("drivelet.io/clone-in-use", "refuse")]);
    code("a source staged read-write, its class refusing", refuse, Code::FailedPrecondition, "mounted read-write at");
    bed.unstage(&src, &st);
    let st = bed.stage(&src, "stage-ro", reader_cap("ext4"));
    let v = bed.create(clone_req("pvc-r6", 64 * MIB, 0, mount_cap("ext4"), &src)).expect("a clone of a source staged read-only");
    bed.unstage(&src, &st);

    // Idempotency: the same source again is the same volume; another source or none is not.
    let again = bed.create(clone_req("pvc-r6", 64 * MIB, 0, mount_cap("ext4"), &src)).expect("again");
    assert_eq!(again.volume_id, v.volume_id);
    let before = parts();
    let other = bed.create(create_req("pvc-r-other", 64 * MIB, mount_cap("ext4"))).expect("another volume").volume_id;
    let with_other = parts();
    let e = bed.create(clone_req("pvc-r6", 64 * MIB, 0, mount_cap("ext4"), &other)).expect_err("another source");
    assert_eq!(e.code(), Code::AlreadyExists, "{}", e.message());
    let e = bed.create(create_req("pvc-r6", 64 * MIB, mount_cap("ext4"))).expect_err("no source");
    assert_eq!(e.code(), Code::AlreadyExists, "{}", e.message());
    assert_eq!(parts(), with_other, "the refused repeats changed nothing");
    bed.delete(&other);
    assert_eq!(parts(), before);

    // Asked smaller than the source: the source's size.
    let small = bed.create(clone_req("pvc-r7", 16 * MIB, 0, mount_cap("ext4"), &src)).expect("a clone asked smaller");
    assert_eq!(small.capacity_bytes, 64 * MIB as i64, "a clone is at least its source");
    let none = bed.create(clone_req("pvc-r8", 0, 0, mount_cap(""), &src)).expect("a clone asked no size");
    assert_eq!(none.capacity_bytes, 64 * MIB as i64, "a clone asked no size gets its source's");
    for id in [&small.volume_id, &none.volume_id, &v.volume_id, &src] {
        bed.delete(id);
    }
    assert!(parts().is_empty(), "nothing left: {:?}", parts());
}
