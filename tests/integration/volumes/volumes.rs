//! The volume lifecycle end to end on loop drives: create, stage, publish to two
//! targets, data through both, restarts in the middle, and a full teardown that gives
//! the space back and leaves no mount behind.

use std::path::Path;

use crate::common::*;
use drivelet::grpc::proto::csi;
use tonic::Code;

fn free_of(agent: &Agent, dev: &Path) -> u64 {
    let d = agent.ctl_drives();
    drive_by_path(&d, dev).unwrap_or_else(|| panic!("{} not listed: {d}", dev.display()))["free_bytes"].as_u64().unwrap()
}

fn wait_free(agent: &Agent, dev: &Path, want: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while free_of(agent, dev) != want {
        assert!(std::time::Instant::now() < deadline, "free bytes of {} stayed {} (want {want})", dev.display(), free_of(agent, dev));
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn full_lifecycle_with_restarts_gives_everything_back() {
    require_host();
    let tmp = short_tempdir();
    let a = LoopDrive::new(tmp.path(), "a.img", 2 * GIB);
    let b = LoopDrive::new(tmp.path(), "b.img", GIB);
    let foreign = LoopDrive::new(tmp.path(), "f.img", GIB);
    sh("mkfs.ext4", &["-q", "-F", foreign.dev.to_str().unwrap()]);
    sh("udevadm", &["settle"]);
    let foreign_digest = digest(&foreign.file);
    let _u = Unmounter(tmp.path().to_path_buf());
    let kubelet = tmp.path().join("kubelet");
    std::fs::create_dir_all(&kubelet).unwrap();
    let mut agent = Agent::start(tmp.path(), AgentOpts::default());
    let free_a = free_of(&agent, &a.dev);
    let free_b = free_of(&agent, &b.dev);

    let rt = rt();
    let (ext4, xfs, blk) = rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let ext4 = c.ctrl.create_volume(create_req("pvc-ext4", 64 * MIB, mount_cap("ext4"))).await.unwrap().into_inner().volume.unwrap();
        assert_eq!(ext4.capacity_bytes, 64 * MIB as i64);
        assert_eq!(ext4.accessible_topology[0].segments.get("topology.drivelet.io/node").map(String::as_str), Some(NODE));
        // Idempotent by name; a different size for the same name is ALREADY_EXISTS.
        let again = c.ctrl.create_volume(create_req("pvc-ext4", 64 * MIB, mount_cap("ext4"))).await.unwrap().into_inner().volume.unwrap();
        assert_eq!(again.volume_id, ext4.volume_id);
        let e = c.ctrl.create_volume(create_req("pvc-ext4", 128 * MIB, mount_cap("ext4"))).await.unwrap_err();
        assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
        let xfs = c.ctrl.create_volume(create_req("pvc-xfs", 300 * MIB, mount_cap("xfs"))).await.unwrap().into_inner().volume.unwrap();
        let blk = c.ctrl.create_volume(create_req("pvc-blk", 16 * MIB, block_cap())).await.unwrap().into_inner().volume.unwrap();
        (ext4.volume_id, xfs.volume_id, blk.volume_id)
    });
    assert_eq!(digest(&foreign.file), foreign_digest, "the foreign drive was never touched");

    // Kill -9 between create and stage; the volumes come back from the store.
    agent.kill();
    agent.spawn();

    let stage = |n: &str| kubelet.join(format!("plugins/stage-{n}"));
    let target = |n: &str, i: u32| kubelet.join(format!("pods/p{i}/volumes/{n}"));
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        for (id, n, cap) in [(&ext4, "ext4", mount_cap("ext4")), (&xfs, "xfs", mount_cap("xfs"))] {
            std::fs::create_dir_all(stage(n)).unwrap();
            c.node.node_stage_volume(stage_req(id, &stage(n), cap.clone())).await.unwrap();
            c.node.node_stage_volume(stage_req(id, &stage(n), cap.clone())).await.unwrap();
            for i in 0..2 {
                std::fs::create_dir_all(target(n, i).parent().unwrap()).unwrap();
                c.node.node_publish_volume(publish_req(id, &stage(n), &target(n, i), cap.clone(), false)).await.unwrap();
            }
            c.node.node_publish_volume(publish_req(id, &stage(n), &target(n, 1), cap.clone(), false)).await.unwrap();
            let e = c.node.node_publish_volume(publish_req(id, &stage(n), &target(n, 1), cap.clone(), true)).await.unwrap_err();
            assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
        }
        std::fs::create_dir_all(stage("blk")).unwrap();
        c.node.node_stage_volume(stage_req(&blk, &stage("blk"), block_cap())).await.unwrap();
        std::fs::create_dir_all(target("blk", 0).parent().unwrap()).unwrap();
        c.node.node_publish_volume(publish_req(&blk, &stage("blk"), &target("blk", 0), block_cap(), false)).await.unwrap();
    });
    // Data written through one target is read through the other.
    for n in ["ext4", "xfs"] {
        std::fs::write(target(n, 0).join("hello.txt"), format!("hello {n}")).unwrap();
        assert_eq!(std::fs::read_to_string(target(n, 1).join("hello.txt")).unwrap(), format!("hello {n}"));
    }
    let fstype = sh("findmnt", &["-n", "-o", "FSTYPE", stage("xfs").to_str().unwrap()]);
    assert_eq!(fstype, "xfs");
    // The block target is the device itself.
    let blk_size = sh("blockdev", &["--getsize64", target("blk", 0).to_str().unwrap()]);
    assert_eq!(blk_size, (16 * MIB).to_string());
    // Deleting a published volume is refused.
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let e = c.ctrl.delete_volume(csi::DeleteVolumeRequest { volume_id: ext4.clone(), ..Default::default() }).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    });

    // A graceful restart in the middle keeps everything mounted and known.
    assert_eq!(agent.stop(), 0);
    agent.spawn();
    // And a kill -9.
    agent.kill();
    agent.spawn();
    assert_eq!(std::fs::read_to_string(target("ext4", 1).join("hello.txt")).unwrap(), "hello ext4");

    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        for (id, n) in [(&ext4, "ext4"), (&xfs, "xfs"), (&blk, "blk")] {
            let targets = if n == "blk" { 1 } else { 2 };
            for i in 0..targets {
                let req = csi::NodeUnpublishVolumeRequest { volume_id: id.to_string(), target_path: target(n, i).display().to_string() };
                c.node.node_unpublish_volume(req.clone()).await.unwrap();
                c.node.node_unpublish_volume(req).await.unwrap();
                assert!(!target(n, i).exists(), "target {} removed", target(n, i).display());
            }
            let req = csi::NodeUnstageVolumeRequest { volume_id: id.to_string(), staging_target_path: stage(n).display().to_string() };
            c.node.node_unstage_volume(req.clone()).await.unwrap();
            c.node.node_unstage_volume(req).await.unwrap();
            let del = csi::DeleteVolumeRequest { volume_id: id.to_string(), ..Default::default() };
            c.ctrl.delete_volume(del.clone()).await.unwrap();
            c.ctrl.delete_volume(del).await.unwrap();
        }
    });
    assert!(mounts_under(tmp.path()).is_empty(), "no mounts remain: {:?}", mounts_under(tmp.path()));
    assert!(kernel_parts(&a.dev).is_empty() && kernel_parts(&b.dev).is_empty(), "no partitions remain");
    wait_free(&agent, &a.dev, free_a);
    wait_free(&agent, &b.dev, free_b);
    assert_eq!(digest(&foreign.file), foreign_digest, "the foreign drive was never touched");
    assert_eq!(agent.stop(), 0);
}
