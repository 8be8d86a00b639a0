//! The Node service: NodeGetInfo, and NodeStageVolume, NodeUnstageVolume,
//! NodePublishVolume and NodeUnpublishVolume held to their error tables, idempotent, and
//! refusing anything outside the allowed roots; access modes and `readonly` enforced on
//! the node, not just recorded. Each test runs over one 1 GiB drive.

use std::path::{Path, PathBuf};

use crate::common::*;
use super::harness::*;
use drivelet::grpc::proto::csi;
use drivelet::grpc::proto::csi::volume_capability::access_mode::Mode;
use drivelet::grpc::proto::csi::volume_capability::AccessType;
use tonic::Code;

fn s(id: &str, path: &Path, cap: csi::VolumeCapability) -> csi::NodeStageVolumeRequest {
    stage_req(id, path, cap)
}

fn p(id: &str, staging: &Path, target: &Path, cap: csi::VolumeCapability, ro: bool) -> csi::NodePublishVolumeRequest {
    publish_req(id, staging, target, cap, ro)
}

#[test]
fn node_info_names_this_node_with_a_well_formed_topology_and_never_changes() {
    conform(&[GIB], async |_fx, c, r| {
        // NodeGetInfo: an id, no negative limit, and a topology (VOLUME_ACCESSIBILITY_CONSTRAINTS)
        // with well-formed keys and values that names this node.
        let ni = must("NodeGetInfo", c.node.node_get_info(csi::NodeGetInfoRequest {}).await);
        let ni2 = must("NodeGetInfo again", c.node.node_get_info(csi::NodeGetInfoRequest {}).await);
        r.check(ni2 == ni, || format!("NodeGetInfo changed between calls: {ni:?} then {ni2:?}"));
        r.check(ni.node_id == NODE, || format!("NodeGetInfo node_id {:?}, want {NODE}", ni.node_id));
        r.check(ni.max_volumes_per_node >= 0, || format!("max_volumes_per_node {} is negative", ni.max_volumes_per_node));
        match &ni.accessible_topology {
            None => r.fail("NodeGetInfo has no accessible_topology though VOLUME_ACCESSIBILITY_CONSTRAINTS is advertised".into()),
            Some(t) => {
                r.check(t.segments.get(NODE_KEY).map(String::as_str) == Some(NODE), || format!("node topology {t:?} lacks {NODE_KEY}={NODE}"));
                for (k, v) in &t.segments {
                    r.check(valid_topology_key(k), || format!("topology key {k:?} is malformed"));
                    r.check(valid_topology_value(v), || format!("topology value {v:?} of {k} is malformed"));
                }
            }
        }
        // drivelet's own answer, exactly: no volume limit, this node and the configured zone.
        assert_eq!(ni.max_volumes_per_node, 0);
        assert_eq!(
            ni.accessible_topology.unwrap().segments,
            kv(&[("topology.drivelet.io/node", NODE), ("topology.kubernetes.io/zone", "zone-a")])
        );
    });
}

// ---------------------------------------------------------------------------------
// NodeStageVolume, NodeUnstageVolume, NodePublishVolume, NodeUnpublishVolume.
// ---------------------------------------------------------------------------------

#[test]
fn node_calls_missing_a_required_field_are_invalid_argument() {
    conform(&[GIB], async |fx, c, r| {
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-n-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let id = fs.volume_id.clone();
        let stage = fx.staging("fs");
        let t1 = fx.target("p1", "fs");
        let cap = mount_cap("ext4");
        let clean = fx.state();
        // --- Missing required fields: INVALID_ARGUMENT (csi-sanity passes the earlier fields).
        let ia = Code::InvalidArgument;
        r.code("NodeStageVolume without volume_id", c.node.node_stage_volume(s("", &stage, cap.clone())).await, ia);
        r.code(
            "NodeStageVolume without staging_target_path",
            c.node.node_stage_volume(csi::NodeStageVolumeRequest { staging_target_path: String::new(), ..s(&id, &stage, cap.clone()) }).await,
            ia,
        );
        r.code(
            "NodeStageVolume without volume_capability",
            c.node.node_stage_volume(csi::NodeStageVolumeRequest { volume_capability: None, ..s(&id, &stage, cap.clone()) }).await,
            ia,
        );
        r.code("NodeUnstageVolume without volume_id", c.node.node_unstage_volume(unstage_req("", &stage)).await, ia);
        r.code("NodeUnstageVolume without staging_target_path", c.node.node_unstage_volume(unstage_req(&id, Path::new(""))).await, ia);
        r.code("NodePublishVolume without volume_id", c.node.node_publish_volume(csi::NodePublishVolumeRequest::default()).await, ia);
        r.code(
            "NodePublishVolume without target_path",
            c.node.node_publish_volume(csi::NodePublishVolumeRequest { volume_id: id.clone(), ..Default::default() }).await,
            ia,
        );
        r.code(
            "NodePublishVolume without volume_capability",
            c.node
                .node_publish_volume(csi::NodePublishVolumeRequest { volume_id: id.clone(), target_path: t1.display().to_string(), ..Default::default() })
                .await,
            ia,
        );
        r.code("NodeUnpublishVolume without volume_id", c.node.node_unpublish_volume(unpublish_req("", &t1)).await, ia);
        r.code("NodeUnpublishVolume without target_path", c.node.node_unpublish_volume(unpublish_req(&id, Path::new(""))).await, ia);
        r.unchanged("node calls missing fields", &fx, &clean);
    });
}

#[test]
fn node_calls_on_an_unknown_volume_are_not_found() {
    conform(&[GIB], async |fx, c, r| {
        let stage = fx.staging("fs");
        let t1 = fx.target("p1", "fs");
        let cap = mount_cap("ext4");
        let clean = fx.state();
        // --- Unknown volume: NOT_FOUND on every node call.
        let nf = Code::NotFound;
        r.code("NodeStageVolume of an unknown volume", c.node.node_stage_volume(s(UNKNOWN_ID, &stage, cap.clone())).await, nf);
        r.code("NodeUnstageVolume of an unknown volume", c.node.node_unstage_volume(unstage_req(UNKNOWN_ID, &stage)).await, nf);
        r.code("NodePublishVolume of an unknown volume", c.node.node_publish_volume(p(UNKNOWN_ID, &stage, &t1, cap.clone(), false)).await, nf);
        r.code("NodeUnpublishVolume of an unknown volume", c.node.node_unpublish_volume(unpublish_req(UNKNOWN_ID, &t1)).await, nf);
        r.unchanged("node calls on an unknown volume", &fx, &clean);
    });
}

#[test]
fn publishing_an_unstaged_volume_is_failed_precondition() {
    conform(&[GIB], async |fx, c, r| {
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-n-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let id = fs.volume_id.clone();
        let stage = fx.staging("fs");
        let t1 = fx.target("p1", "fs");
        let cap = mount_cap("ext4");
        let clean = fx.state();
        // --- Publishing before staging: FAILED_PRECONDITION.
        r.code("NodePublishVolume of an unstaged volume", c.node.node_publish_volume(p(&id, &stage, &t1, cap.clone(), false)).await, Code::FailedPrecondition);
        r.unchanged("NodePublishVolume of an unstaged volume", &fx, &clean);
        r.check(!t1.exists(), || "NodePublishVolume of an unstaged volume created the target".into());
    });
}

#[test]
fn staging_at_a_bad_path_or_with_bad_flags_or_capabilities_is_refused_and_formats_nothing() {
    conform(&[GIB], async |fx, c, r| {
        let created_before = fx.state();
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-n-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let after_fs = fx.state();
        let (_, fs_dev, _) = fx.new_partition(&created_before, &after_fs).expect("one partition for the fs volume");
        let blk = must("CreateVolume block", c.ctrl.create_volume(vol_req("conf-n-blk", 16 * MIB_I, 0, vec![block_cap()], &[])).await).volume.unwrap();
        let id = fs.volume_id.clone();
        let bid = blk.volume_id.clone();
        let stage = fx.staging("fs");
        let cap = mount_cap("ext4");
        let clean = fx.state();
        let ia = Code::InvalidArgument;
        // --- Staging refused: bad paths and mount flags are INVALID_ARGUMENT; capabilities
        // the volume does not have are FAILED_PRECONDITION ("Exceeds capabilities").
        // Each leaves the volume unformatted, nothing mounted, nothing made outside.
        let dotdot = fx.kubelet.join("plugins/../../outside/stage");
        let relative = PathBuf::from("kubelet/plugins/staging/rel");
        let mut refused: Vec<(String, csi::NodeStageVolumeRequest, Code)> = Vec::new();
        for (what, path) in [
            ("outside the allowed roots", fx.outside.join("stage")),
            ("with '..' escaping the roots", dotdot.clone()),
            ("under a symlink escaping the roots", fx.kubelet.join("escape/stage")),
            ("that is itself a symlink out of the roots", fx.kubelet.join("escape")),
            ("that is relative", relative.clone()),
            ("that is the allowed root itself", fx.kubelet.clone()),
        ] {
            refused.push((format!("NodeStageVolume at a path {what}"), s(&id, &path, cap.clone()), ia));
        }
        for flags in [&["rw,exec"][..], &["bind"], &["rbind"], &["remount"], &["nosuid nodev"], &[""], &["noatime", "x-mount.mkdir=0700"]] {
            refused.push((format!("NodeStageVolume with mount flags {flags:?}"), s(&id, &stage, mount(Mode::SingleNodeWriter, "ext4", flags)), ia));
        }
        let fp = Code::FailedPrecondition;
        // A capability drivelet never serves is an unsupported field (INVALID_ARGUMENT) as
        // much as one this volume lacks ("Exceeds capabilities", FAILED_PRECONDITION);
        // either is accepted. One drivelet serves but this volume lacks is the latter.
        for (what, cap) in [
            ("MULTI_NODE_MULTI_WRITER", mount(Mode::MultiNodeMultiWriter, "ext4", &[])),
            ("MULTI_NODE_READER_ONLY", mount(Mode::MultiNodeReaderOnly, "ext4", &[])),
            ("btrfs", mount_cap("btrfs")),
        ] {
            refused.push((format!("NodeStageVolume with {what}"), s(&id, &stage, cap), ia));
        }
        for (what, vid, cap) in [
            ("xfs on an ext4 volume", &id, mount_cap("xfs")),
            ("block access to a mount volume", &id, block_cap()),
            ("mount access to a block volume", &bid, mount_cap("")),
        ] {
            refused.push((format!("NodeStageVolume with {what}"), s(vid, &stage, cap), fp));
        }
        for (what, q, want) in refused {
            let vid = q.volume_id.clone();
            let path = PathBuf::from(&q.staging_target_path);
            let unsupported = q.volume_capability.as_ref().is_some_and(|c| {
                let multi = c.access_mode.as_ref().is_some_and(|m| m.mode >= Mode::MultiNodeReaderOnly as i32 && m.mode <= Mode::MultiNodeMultiWriter as i32);
                let btrfs = matches!(&c.access_type, Some(AccessType::Mount(m)) if m.fs_type == "btrfs");
                multi || btrfs
            });
            let got = c.node.node_stage_volume(q).await;
            if unsupported {
                r.code_any(&what, got, &[ia, fp]);
            } else {
                r.code(&what, got, want);
            }
            r.unchanged(&what, &fx, &clean);
            let sig = fs_signature(&fs_dev);
            r.check(sig.is_none(), || format!("{what}: a filesystem ({sig:?}) was made on the volume"));
            // Undo a wrongly accepted stage so the cases stay independent.
            let _ = c.node.node_unstage_volume(unstage_req(&vid, &path)).await;
        }
        // The agent runs in this process's working directory.
        r.check(!relative.exists(), || format!("a relative staging path was created at {}", relative.display()));
    });
}

#[test]
fn stage_is_idempotent_and_mounts_one_new_ext4_at_the_staging_path() {
    conform(&[GIB], async |fx, c, r| {
        let created_before = fx.state();
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-n-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let after_fs = fx.state();
        let (_, fs_dev, _) = fx.new_partition(&created_before, &after_fs).expect("one partition for the fs volume");
        let id = fs.volume_id.clone();
        let stage = fx.staging("fs");
        let cap = mount_cap("ext4");
        // --- Stage, and again: OK, one mount.
        r.ok("NodeStageVolume", c.node.node_stage_volume(s(&id, &stage, cap.clone())).await);
        r.ok("NodeStageVolume, repeated", c.node.node_stage_volume(s(&id, &stage, cap.clone())).await);
        let staged = fx.state();
        r.check(staged.mounts == vec![stage.clone()], || format!("staged once at {}: mounts {:?}", stage.display(), staged.mounts));
        r.check(fs_signature(&fs_dev).as_deref() == Some("ext4"), || "the staged volume holds no ext4".into());
    });
}

#[test]
fn a_staged_volume_refuses_another_capability_another_staging_path_and_delete() {
    conform(&[GIB], async |fx, c, r| {
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-n-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let id = fs.volume_id.clone();
        let stage = fx.staging("fs");
        let stage2 = fx.staging("fs-elsewhere");
        let cap = mount_cap("ext4");
        let fp = Code::FailedPrecondition;
        must("NodeStageVolume", c.node.node_stage_volume(s(&id, &stage, cap.clone())).await);
        let staged = fx.state();
        // The same staging path, incompatible: ALREADY_EXISTS.
        for (what, cap) in [
            ("block access", block_cap()),
            ("other mount flags", mount(Mode::SingleNodeWriter, "ext4", &["noatime"])),
            ("SINGLE_NODE_READER_ONLY", mount(Mode::SingleNodeReaderOnly, "ext4", &[])),
        ] {
            let what = format!("NodeStageVolume again with {what}");
            r.code(&what, c.node.node_stage_volume(s(&id, &stage, cap)).await, Code::AlreadyExists);
            r.unchanged(&what, &fx, &staged);
        }
        // Another staging path while staged (one staging path per volume).
        r.code("NodeStageVolume at a second staging path", c.node.node_stage_volume(s(&id, &stage2, cap.clone())).await, fp);
        r.unchanged("NodeStageVolume at a second staging path", &fx, &staged);
        // Deleting a staged volume: FAILED_PRECONDITION ("Volume in use").
        r.code("DeleteVolume of a staged volume", c.ctrl.delete_volume(del_req(&id)).await, fp);
        r.unchanged("DeleteVolume of a staged volume", &fx, &staged);
    });
}

#[test]
fn unstaging_at_a_path_the_volume_is_not_staged_at_succeeds_and_changes_nothing() {
    conform(&[GIB], async |fx, c, r| {
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-n-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let id = fs.volume_id.clone();
        let stage = fx.staging("fs");
        let stage2 = fx.staging("fs-elsewhere");
        let cap = mount_cap("ext4");
        must("NodeStageVolume", c.node.node_stage_volume(s(&id, &stage, cap.clone())).await);
        let staged = fx.state();
        // Unstaging where it is not staged: OK, and the real staging stays.
        r.ok("NodeUnstageVolume at a path it is not staged at", c.node.node_unstage_volume(unstage_req(&id, &stage2)).await);
        r.unchanged("NodeUnstageVolume at a path it is not staged at", &fx, &staged);
    });
}

#[test]
fn publishing_from_a_bad_staging_path_to_a_bad_target_or_with_bad_flags_is_refused() {
    conform(&[GIB], async |fx, c, r| {
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-n-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let id = fs.volume_id.clone();
        let stage = fx.staging("fs");
        let stage2 = fx.staging("fs-elsewhere");
        let t1 = fx.target("p1", "fs");
        let cap = mount_cap("ext4");
        let ia = Code::InvalidArgument;
        let fp = Code::FailedPrecondition;
        must("NodeStageVolume", c.node.node_stage_volume(s(&id, &stage, cap.clone())).await);
        let staged = fx.state();
        // --- Publishing refused.
        let mut refused: Vec<(String, csi::NodePublishVolumeRequest, Code)> = vec![
            // "Staging target path not set": FAILED_PRECONDITION when STAGE_UNSTAGE_VOLUME is set.
            (
                "NodePublishVolume without staging_target_path".into(),
                csi::NodePublishVolumeRequest { staging_target_path: String::new(), ..p(&id, &stage, &t1, cap.clone(), false) },
                fp,
            ),
            ("NodePublishVolume from a path it is not staged at".into(), p(&id, &stage2, &t1, cap.clone(), false), fp),
            ("NodePublishVolume with MULTI_NODE_MULTI_WRITER (either code)".into(), p(&id, &stage, &t1, mount(Mode::MultiNodeMultiWriter, "ext4", &[]), false), fp),
            ("NodePublishVolume with block access to a mount volume".into(), p(&id, &stage, &t1, block_cap(), false), fp),
        ];
        for (what, target) in [
            ("outside the allowed roots", fx.outside.join("target")),
            ("with '..' escaping the roots", fx.kubelet.join("pods/../../outside/target")),
            ("under a symlink escaping the roots", fx.kubelet.join("escape/target")),
            ("that is itself a symlink out of the roots", fx.kubelet.join("escape")),
            ("that is relative", PathBuf::from("kubelet/pods/p1/volumes/rel")),
        ] {
            refused.push((format!("NodePublishVolume to a target {what}"), p(&id, &stage, &target, cap.clone(), false), ia));
        }
        for flags in [&["rw,exec"][..], &["bind"], &["remount"]] {
            refused.push((format!("NodePublishVolume with mount flags {flags:?}"), p(&id, &stage, &t1, mount(Mode::SingleNodeWriter, "ext4", flags), false), ia));
        }
        for (what, q, want) in refused {
            let target = PathBuf::from(&q.target_path);
            let got = c.node.node_publish_volume(q).await;
            let refused_right = if what.ends_with("(either code)") { r.code_any(&what, got, &[ia, fp]) } else { r.code(&what, got, want) };
            r.unchanged(&what, &fx, &staged);
            if refused_right {
                r.check(!t1.exists(), || format!("{what}: the target was created"));
            }
            let _ = c.node.node_unpublish_volume(unpublish_req(&id, &target)).await;
        }
    });
}

#[test]
fn publish_is_idempotent_and_the_target_shows_the_staged_filesystem() {
    conform(&[GIB], async |fx, c, r| {
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-n-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let id = fs.volume_id.clone();
        let stage = fx.staging("fs");
        let t1 = fx.target("p1", "fs");
        let cap = mount_cap("ext4");
        must("NodeStageVolume", c.node.node_stage_volume(s(&id, &stage, cap.clone())).await);
        // --- Publish, and again: OK, one bind mount; data reaches the staged filesystem.
        r.ok("NodePublishVolume", c.node.node_publish_volume(p(&id, &stage, &t1, cap.clone(), false)).await);
        r.ok("NodePublishVolume, repeated", c.node.node_publish_volume(p(&id, &stage, &t1, cap.clone(), false)).await);
        let published = fx.state();
        let mut want = vec![stage.clone(), t1.clone()];
        want.sort();
        r.check(published.mounts == want, || format!("published once at {}: mounts {:?}", t1.display(), published.mounts));
        if std::fs::write(t1.join("hello"), b"hello").is_ok() {
            r.check(std::fs::read(stage.join("hello")).ok().as_deref() == Some(&b"hello"[..]), || "data written at the target is not in the staged filesystem".into());
        } else {
            r.fail("cannot write through a read-write publish".into());
        }
    });
}

#[test]
fn a_published_volume_refuses_readonly_at_its_target_unstage_and_delete() {
    conform(&[GIB], async |fx, c, r| {
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-n-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let id = fs.volume_id.clone();
        let stage = fx.staging("fs");
        let t1 = fx.target("p1", "fs");
        let cap = mount_cap("ext4");
        let fp = Code::FailedPrecondition;
        must("NodeStageVolume", c.node.node_stage_volume(s(&id, &stage, cap.clone())).await);
        must("NodePublishVolume", c.node.node_publish_volume(p(&id, &stage, &t1, cap.clone(), false)).await);
        let published = fx.state();
        // The same target, incompatible: ALREADY_EXISTS.
        r.code("NodePublishVolume again with readonly", c.node.node_publish_volume(p(&id, &stage, &t1, cap.clone(), true)).await, Code::AlreadyExists);
        r.unchanged("NodePublishVolume again with readonly", &fx, &published);
        // A published volume can be neither unstaged nor deleted.
        r.code("NodeUnstageVolume of a published volume", c.node.node_unstage_volume(unstage_req(&id, &stage)).await, fp);
        r.unchanged("NodeUnstageVolume of a published volume", &fx, &published);
        r.code("DeleteVolume of a published volume", c.ctrl.delete_volume(del_req(&id)).await, fp);
        r.unchanged("DeleteVolume of a published volume", &fx, &published);
    });
}

#[test]
fn unpublish_and_unstage_at_another_volumes_paths_change_nothing() {
    conform(&[GIB], async |fx, c, r| {
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-n-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let other = must("CreateVolume other", c.ctrl.create_volume(vol_req("conf-n-other", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let id = fs.volume_id.clone();
        let oid = other.volume_id.clone();
        let stage = fx.staging("fs");
        let t1 = fx.target("p1", "fs");
        let cap = mount_cap("ext4");
        must("NodeStageVolume", c.node.node_stage_volume(s(&id, &stage, cap.clone())).await);
        must("NodePublishVolume", c.node.node_publish_volume(p(&id, &stage, &t1, cap.clone(), false)).await);
        // --- Another volume's paths are not ours to undo.
        let ostage = fx.staging("other");
        let ot = fx.target("p2", "other");
        r.ok("NodeStageVolume other", c.node.node_stage_volume(s(&oid, &ostage, cap.clone())).await);
        r.ok("NodePublishVolume other", c.node.node_publish_volume(p(&oid, &ostage, &ot, cap.clone(), false)).await);
        let two = fx.state();
        r.ok("NodeUnpublishVolume at another volume's target", c.node.node_unpublish_volume(unpublish_req(&id, &ot)).await);
        r.unchanged("NodeUnpublishVolume at another volume's target", &fx, &two);
        r.ok("NodeUnstageVolume at another volume's staging path", c.node.node_unstage_volume(unstage_req(&id, &ostage)).await);
        r.unchanged("NodeUnstageVolume at another volume's staging path", &fx, &two);
    });
}

#[test]
fn a_block_volume_is_staged_and_published_as_the_device_itself() {
    conform(&[GIB], async |fx, c, r| {
        let blk = must("CreateVolume block", c.ctrl.create_volume(vol_req("conf-n-blk", 16 * MIB_I, 0, vec![block_cap()], &[])).await).volume.unwrap();
        let bid = blk.volume_id.clone();
        // --- Block access: the target is the device itself.
        let bstage = fx.staging("blk");
        let bt = fx.target("p3", "blk");
        r.ok("NodeStageVolume block", c.node.node_stage_volume(s(&bid, &bstage, block_cap())).await);
        r.ok("NodeStageVolume block, repeated", c.node.node_stage_volume(s(&bid, &bstage, block_cap())).await);
        r.ok("NodePublishVolume block", c.node.node_publish_volume(p(&bid, &bstage, &bt, block_cap(), false)).await);
        r.ok("NodePublishVolume block, repeated", c.node.node_publish_volume(p(&bid, &bstage, &bt, block_cap(), false)).await);
        if bt.exists() {
            let size = sh("blockdev", &["--getsize64", bt.to_str().unwrap()]);
            r.check(size == blk.capacity_bytes.to_string(), || format!("block target is {size} bytes, volume {}", blk.capacity_bytes));
        } else {
            r.fail("block publish left no device at the target".into());
        }
    });
}

#[test]
fn unpublish_and_unstage_are_idempotent_remove_the_target_and_leave_no_mount() {
    conform(&[GIB], async |fx, c, r| {
        let created_before = fx.state();
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-n-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let blk = must("CreateVolume block", c.ctrl.create_volume(vol_req("conf-n-blk", 16 * MIB_I, 0, vec![block_cap()], &[])).await).volume.unwrap();
        let other = must("CreateVolume other", c.ctrl.create_volume(vol_req("conf-n-other", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let id = fs.volume_id.clone();
        let bid = blk.volume_id.clone();
        let oid = other.volume_id.clone();
        let stage = fx.staging("fs");
        let t1 = fx.target("p1", "fs");
        let cap = mount_cap("ext4");
        must("NodeStageVolume", c.node.node_stage_volume(s(&id, &stage, cap.clone())).await);
        must("NodePublishVolume", c.node.node_publish_volume(p(&id, &stage, &t1, cap.clone(), false)).await);
        let ostage = fx.staging("other");
        let ot = fx.target("p2", "other");
        let bstage = fx.staging("blk");
        let bt = fx.target("p3", "blk");
        must("NodeStageVolume other", c.node.node_stage_volume(s(&oid, &ostage, cap.clone())).await);
        must("NodePublishVolume other", c.node.node_publish_volume(p(&oid, &ostage, &ot, cap.clone(), false)).await);
        must("NodeStageVolume block", c.node.node_stage_volume(s(&bid, &bstage, block_cap())).await);
        must("NodePublishVolume block", c.node.node_publish_volume(p(&bid, &bstage, &bt, block_cap(), false)).await);
        // --- Teardown, each step twice; the spec wants the target removed.
        let never = fx.target("p9", "never");
        r.ok("NodeUnpublishVolume of a target never published", c.node.node_unpublish_volume(unpublish_req(&id, &never)).await);
        for (vid, target, staging) in [(&id, &t1, &stage), (&oid, &ot, &ostage), (&bid, &bt, &bstage)] {
            r.ok("NodeUnpublishVolume", c.node.node_unpublish_volume(unpublish_req(vid, target)).await);
            r.ok("NodeUnpublishVolume, repeated", c.node.node_unpublish_volume(unpublish_req(vid, target)).await);
            r.check(!target.exists(), || format!("NodeUnpublishVolume left {} behind", target.display()));
            r.ok("NodeUnstageVolume", c.node.node_unstage_volume(unstage_req(vid, staging)).await);
            r.ok("NodeUnstageVolume, repeated", c.node.node_unstage_volume(unstage_req(vid, staging)).await);
        }
        r.check(fx.state().mounts.is_empty(), || format!("mounts left after teardown: {:?}", fx.state().mounts));
        for vid in [&id, &bid, &oid] {
            r.ok("DeleteVolume", c.ctrl.delete_volume(del_req(vid)).await);
        }
        r.unchanged("after teardown", &fx, &created_before);
    });
}

#[test]
fn node_calls_on_a_deleted_volume_are_not_found() {
    conform(&[GIB], async |fx, c, r| {
        let created_before = fx.state();
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-n-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let id = fs.volume_id.clone();
        let stage = fx.staging("fs");
        let t1 = fx.target("p1", "fs");
        let cap = mount_cap("ext4");
        let nf = Code::NotFound;
        must("DeleteVolume", c.ctrl.delete_volume(del_req(&id)).await);
        // A deleted volume is unknown to every node call.
        r.code("NodeStageVolume of a deleted volume", c.node.node_stage_volume(s(&id, &stage, cap.clone())).await, nf);
        r.code("NodePublishVolume of a deleted volume", c.node.node_publish_volume(p(&id, &stage, &t1, cap.clone(), false)).await, nf);
        r.code("NodeUnstageVolume of a deleted volume", c.node.node_unstage_volume(unstage_req(&id, &stage)).await, nf);
        r.code("NodeUnpublishVolume of a deleted volume", c.node.node_unpublish_volume(unpublish_req(&id, &t1)).await, nf);
        r.unchanged("node calls on a deleted volume", &fx, &created_before);
    });
}

// ---------------------------------------------------------------------------------
// Access modes and read-only publishing.
// ---------------------------------------------------------------------------------

/// A 64 MiB volume made for `cap`; its id.
async fn volume_for(c: &mut Csi, name: &str, cap: &csi::VolumeCapability) -> String {
    must(name, c.ctrl.create_volume(vol_req(name, 64 * MIB_I, 0, vec![cap.clone()], &[])).await).volume.unwrap().volume_id
}

/// After a test's last unstage: nothing is left mounted, the volume deletes, and the host
/// is as it was.
async fn leaves_nothing(fx: &Fixture, c: &mut Csi, r: &mut Report, id: &str, clean: &HostState) {
    r.check(fx.state().mounts.is_empty(), || format!("mounts left: {:?}", fx.state().mounts));
    r.ok("DeleteVolume", c.ctrl.delete_volume(del_req(id)).await);
    r.unchanged("the end", fx, clean);
}

/// Whether writing a file under `dir` fails with EROFS.
fn write_is_erofs(dir: &Path) -> Result<(), String> {
    match std::fs::write(dir.join("probe"), b"x") {
        Ok(()) => Err(format!("writing under {} succeeded", dir.display())),
        Err(e) if e.raw_os_error() == Some(nix::libc::EROFS) => Ok(()),
        Err(e) => Err(format!("writing under {} failed with {e}, not EROFS", dir.display())),
    }
}

#[test]
fn single_node_single_writer_is_published_at_one_target_at_a_time() {
    conform(&[GIB], async |fx, c, r| {
        let clean = fx.state();
        let ssw_cap = mount(Mode::SingleNodeSingleWriter, "ext4", &[]);
        let ssw = volume_for(c, "conf-a-ssw", &ssw_cap).await;
        let fp = Code::FailedPrecondition;
        // --- SINGLE_NODE_SINGLE_WRITER: one target at a time.
        let st = fx.staging("ssw");
        let (t1, t2) = (fx.target("p1", "ssw"), fx.target("p2", "ssw"));
        r.ok("NodeStageVolume SSW", c.node.node_stage_volume(stage_req(&ssw, &st, ssw_cap.clone())).await);
        r.ok("NodePublishVolume SSW first target", c.node.node_publish_volume(publish_req(&ssw, &st, &t1, ssw_cap.clone(), false)).await);
        let one = fx.state();
        r.code("NodePublishVolume SSW second target", c.node.node_publish_volume(publish_req(&ssw, &st, &t2, ssw_cap.clone(), false)).await, fp);
        r.unchanged("NodePublishVolume SSW second target", &fx, &one);
        r.check(!t2.exists(), || "a refused SSW publish created its target".into());
        r.code(
            "NodePublishVolume SSW second target, read-only",
            c.node.node_publish_volume(publish_req(&ssw, &st, &t2, ssw_cap.clone(), true)).await,
            fp,
        );
        r.unchanged("NodePublishVolume SSW second target, read-only", &fx, &one);
        r.ok("NodePublishVolume SSW first target, repeated", c.node.node_publish_volume(publish_req(&ssw, &st, &t1, ssw_cap.clone(), false)).await);
        r.ok("NodeUnpublishVolume SSW first target", c.node.node_unpublish_volume(unpublish_req(&ssw, &t1)).await);
        r.ok("NodePublishVolume SSW second target once the first is gone", c.node.node_publish_volume(publish_req(&ssw, &st, &t2, ssw_cap.clone(), false)).await);
        r.ok("NodeUnpublishVolume SSW", c.node.node_unpublish_volume(unpublish_req(&ssw, &t2)).await);
        r.ok("NodeUnstageVolume SSW", c.node.node_unstage_volume(unstage_req(&ssw, &st)).await);
        leaves_nothing(fx, c, r, &ssw, &clean).await;
    });
}

#[test]
fn single_node_multi_writer_shares_data_between_targets_and_read_only_ones_are_read_only() {
    conform(&[GIB], async |fx, c, r| {
        let clean = fx.state();
        let smw_cap = mount(Mode::SingleNodeMultiWriter, "ext4", &[]);
        let smw = volume_for(c, "conf-a-smw", &smw_cap).await;
        // --- SINGLE_NODE_MULTI_WRITER: several targets, read-only ones really read-only.
        let sm = fx.staging("smw");
        let (m1, m2, m3) = (fx.target("p1", "smw"), fx.target("p2", "smw"), fx.target("p3", "smw"));
        r.ok("NodeStageVolume SMW", c.node.node_stage_volume(stage_req(&smw, &sm, smw_cap.clone())).await);
        r.ok("NodePublishVolume SMW #1", c.node.node_publish_volume(publish_req(&smw, &sm, &m1, smw_cap.clone(), false)).await);
        r.ok("NodePublishVolume SMW #2", c.node.node_publish_volume(publish_req(&smw, &sm, &m2, smw_cap.clone(), false)).await);
        r.ok("NodePublishVolume SMW #3 read-only", c.node.node_publish_volume(publish_req(&smw, &sm, &m3, smw_cap.clone(), true)).await);
        if std::fs::write(m1.join("shared"), b"one").is_ok() {
            r.check(std::fs::read(m2.join("shared")).ok().as_deref() == Some(&b"one"[..]), || "SMW targets do not share data".into());
            r.check(std::fs::read(m3.join("shared")).ok().as_deref() == Some(&b"one"[..]), || "the read-only SMW target cannot read".into());
        } else {
            r.fail("cannot write through a read-write SMW target".into());
        }
        if let Err(e) = write_is_erofs(&m3) {
            r.fail(format!("read-only publish: {e}"));
        }
        r.check(std::fs::write(m2.join("still"), b"rw").is_ok(), || "a read-only publish made the other targets read-only".into());
        for t in [&m1, &m2, &m3] {
            r.ok("NodeUnpublishVolume SMW", c.node.node_unpublish_volume(unpublish_req(&smw, t)).await);
        }
        r.ok("NodeUnstageVolume SMW", c.node.node_unstage_volume(unstage_req(&smw, &sm)).await);
        leaves_nothing(fx, c, r, &smw, &clean).await;
    });
}

#[test]
fn single_node_reader_only_is_read_only_at_the_target_and_at_staging() {
    conform(&[GIB], async |fx, c, r| {
        let clean = fx.state();
        let ro_cap = mount(Mode::SingleNodeReaderOnly, "ext4", &[]);
        let ro = volume_for(c, "conf-a-ro", &ro_cap).await;
        // --- SINGLE_NODE_READER_ONLY: read-only at the target (and at staging).
        let rs = fx.staging("ro");
        let rt1 = fx.target("p1", "ro");
        r.ok("NodeStageVolume reader-only", c.node.node_stage_volume(stage_req(&ro, &rs, ro_cap.clone())).await);
        r.ok("NodePublishVolume reader-only", c.node.node_publish_volume(publish_req(&ro, &rs, &rt1, ro_cap.clone(), true)).await);
        if let Err(e) = write_is_erofs(&rt1) {
            r.fail(format!("SINGLE_NODE_READER_ONLY publish: {e}"));
        }
        if let Err(e) = write_is_erofs(&rs) {
            r.fail(format!("SINGLE_NODE_READER_ONLY stage: {e}"));
        }
        r.ok("NodeUnpublishVolume reader-only", c.node.node_unpublish_volume(unpublish_req(&ro, &rt1)).await);
        r.ok("NodeUnstageVolume reader-only", c.node.node_unstage_volume(unstage_req(&ro, &rs)).await);
        leaves_nothing(fx, c, r, &ro, &clean).await;
    });
}

#[test]
fn a_read_only_block_target_refuses_writes_and_cannot_sit_beside_a_read_write_one() {
    conform(&[GIB], async |fx, c, r| {
        let clean = fx.state();
        let blk_cap = block(Mode::SingleNodeMultiWriter);
        let blk = volume_for(c, "conf-a-blk", &blk_cap).await;
        // --- Block: a read-only publish cannot be opened for writing; a read-write one
        // can. drivelet marks the partition itself read-only in the kernel (a read-only
        // bind of a device node does not stop writes), so read-only and read-write
        // block targets of one volume cannot coexist: mixing is FAILED_PRECONDITION.
        let bs = fx.staging("blk");
        let (bw, bro) = (fx.target("p1", "blk"), fx.target("p2", "blk"));
        r.ok("NodeStageVolume block", c.node.node_stage_volume(stage_req(&blk, &bs, blk_cap.clone())).await);
        r.ok("NodePublishVolume block read-write", c.node.node_publish_volume(publish_req(&blk, &bs, &bw, blk_cap.clone(), false)).await);
        r.code(
            "NodePublishVolume block read-only beside a read-write target",
            c.node.node_publish_volume(publish_req(&blk, &bs, &bro, blk_cap.clone(), true)).await,
            Code::FailedPrecondition,
        );
        let open_rw = |p: &Path| std::fs::OpenOptions::new().write(true).open(p);
        r.check(open_rw(&bw).is_ok(), || format!("cannot open the read-write block target: {:?}", open_rw(&bw).err()));
        r.ok("NodeUnpublishVolume block", c.node.node_unpublish_volume(unpublish_req(&blk, &bw)).await);
        r.ok("NodePublishVolume block read-only", c.node.node_publish_volume(publish_req(&blk, &bs, &bro, blk_cap.clone(), true)).await);
        // Refused either at open (EROFS/EACCES) or at the first write (EPERM), by kernel
        // version; no byte may reach the device.
        let refused = |e: &std::io::Error| matches!(e.raw_os_error(), Some(nix::libc::EROFS | nix::libc::EACCES | nix::libc::EPERM));
        match open_rw(&bro) {
            Ok(mut f) => {
                use std::io::Write;
                match f.write_all(&[0xabu8; 4096]).and_then(|_| f.sync_all()) {
                    Ok(()) => {
                        r.fail("a 4 KiB write through the read-only block target succeeded".into());
                    }
                    Err(e) => {
                        r.check(refused(&e), || format!("the read-only block target refuses the write with {e}, not a read-only error"));
                    }
                }
            }
            Err(e) => {
                r.check(refused(&e), || format!("the read-only block target refuses writing with {e}, not a read-only error"));
            }
        }
        let head = std::fs::read(&bro).map(|b| b.iter().take(4096).any(|x| *x == 0xab)).unwrap_or(false);
        r.check(!head, || "bytes of the refused write reached the device".into());
        r.code(
            "NodePublishVolume block read-write beside a read-only target",
            c.node.node_publish_volume(publish_req(&blk, &bs, &bw, blk_cap.clone(), false)).await,
            Code::FailedPrecondition,
        );
        r.ok("NodeUnpublishVolume block", c.node.node_unpublish_volume(unpublish_req(&blk, &bro)).await);
        r.ok("NodePublishVolume block read-write after the read-only one is gone", c.node.node_publish_volume(publish_req(&blk, &bs, &bw, blk_cap.clone(), false)).await);
        r.check(open_rw(&bw).is_ok(), || "the partition stayed read-only after its read-only target went".into());
        r.ok("NodeUnpublishVolume block", c.node.node_unpublish_volume(unpublish_req(&blk, &bw)).await);
        r.ok("NodeUnstageVolume block", c.node.node_unstage_volume(unstage_req(&blk, &bs)).await);
        leaves_nothing(fx, c, r, &blk, &clean).await;
    });
}
