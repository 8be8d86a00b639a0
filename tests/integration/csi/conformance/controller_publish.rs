//! The Controller service's attach calls: ControllerPublishVolume and
//! ControllerUnpublishVolume held to their error tables, idempotent, persisted across a
//! restart, and closed to new attachments on a drive being released. Each test runs over
//! one 1 GiB drive.

use std::path::PathBuf;
use std::process::Command;

use crate::common::*;
use super::harness::*;
use drivelet::grpc::proto::csi;
use drivelet::grpc::proto::csi::volume_capability::access_mode::Mode;
use tonic::Code;

fn cpub(id: &str, node: &str, cap: Option<csi::VolumeCapability>) -> csi::ControllerPublishVolumeRequest {
    csi::ControllerPublishVolumeRequest { volume_id: id.into(), node_id: node.into(), volume_capability: cap, ..Default::default() }
}

fn cunpub(id: &str, node: &str) -> csi::ControllerUnpublishVolumeRequest {
    csi::ControllerUnpublishVolumeRequest { volume_id: id.into(), node_id: node.into(), ..Default::default() }
}

/// The nodes ControllerGetVolume reports the volume published to.
async fn published_to(c: &mut Csi, id: &str) -> Vec<String> {
    let v = must("ControllerGetVolume", c.ctrl.controller_get_volume(csi::ControllerGetVolumeRequest { volume_id: id.into() }).await);
    v.status.map(|s| s.published_node_ids).unwrap_or_default()
}

/// `drivelet ctl` through the real CLI: success and everything it printed.
fn ctl(agent: &Agent, args: &[&str]) -> (bool, String) {
    let out = Command::new(bin()).args(["ctl", "--socket", agent.admin_socket.to_str().unwrap()]).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

#[test]
fn controller_publish_and_unpublish_missing_or_with_bad_fields_are_invalid_argument() {
    conform(&[GIB], async |_fx, c, r| {
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-cp-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let id = fs.volume_id.clone();
        let cap = || Some(mount_cap("ext4"));
        // --- Malformed requests: INVALID_ARGUMENT [ControllerPublishVolume: REQUIRED fields;
        // unsupported capability; readonly without PUBLISH_READONLY].
        let ia = Code::InvalidArgument;
        r.code("ControllerPublishVolume without volume_id", c.ctrl.controller_publish_volume(cpub("", NODE, cap())).await, ia);
        r.code("ControllerPublishVolume without node_id", c.ctrl.controller_publish_volume(cpub(&id, "", cap())).await, ia);
        r.code("ControllerPublishVolume without volume_capability", c.ctrl.controller_publish_volume(cpub(&id, NODE, None)).await, ia);
        r.code(
            "ControllerPublishVolume with a capability without access_mode",
            c.ctrl.controller_publish_volume(cpub(&id, NODE, Some(csi::VolumeCapability { access_mode: None, ..mount_cap("ext4") }))).await,
            ia,
        );
        r.code(
            "ControllerPublishVolume with a MULTI_NODE capability",
            c.ctrl.controller_publish_volume(cpub(&id, NODE, Some(mount(Mode::MultiNodeMultiWriter, "ext4", &[])))).await,
            ia,
        );
        r.code(
            "ControllerPublishVolume readonly (PUBLISH_READONLY is not advertised)",
            c.ctrl.controller_publish_volume(csi::ControllerPublishVolumeRequest { readonly: true, ..cpub(&id, NODE, cap()) }).await,
            ia,
        );
        r.code("ControllerUnpublishVolume without volume_id", c.ctrl.controller_unpublish_volume(cunpub("", NODE)).await, ia);
    });
}

#[test]
fn controller_publish_of_an_unknown_volume_or_to_an_unknown_node_is_not_found() {
    conform(&[GIB], async |_fx, c, r| {
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-cp-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let id = fs.volume_id.clone();
        let cap = || Some(mount_cap("ext4"));
        // --- Unknown volume or node: NOT_FOUND (csi-sanity: "should fail when the volume
        // does not exist" / "when the node does not exist").
        let nf = Code::NotFound;
        r.code("ControllerPublishVolume of an unknown volume", c.ctrl.controller_publish_volume(cpub(UNKNOWN_ID, NODE, cap())).await, nf);
        r.code("ControllerPublishVolume to an unknown node", c.ctrl.controller_publish_volume(cpub(&id, "some-fake-node-id", cap())).await, nf);
    });
}

#[test]
fn controller_publish_with_a_capability_the_volume_cannot_serve_is_failed_precondition() {
    conform(&[GIB], async |fx, c, r| {
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-cp-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let blk = must("CreateVolume block", c.ctrl.create_volume(vol_req("conf-cp-blk", 16 * MIB_I, 0, vec![block_cap()], &[])).await).volume.unwrap();
        let id = fs.volume_id.clone();
        let bid = blk.volume_id.clone();
        let cap = || Some(mount_cap("ext4"));
        let clean = fx.state();
        // --- A capability the volume cannot serve: FAILED_PRECONDITION, as on the node.
        let fp = Code::FailedPrecondition;
        r.code("ControllerPublishVolume of a filesystem volume for block access", c.ctrl.controller_publish_volume(cpub(&id, NODE, Some(block_cap()))).await, fp);
        r.code("ControllerPublishVolume of a block volume for filesystem access", c.ctrl.controller_publish_volume(cpub(&bid, NODE, cap())).await, fp);
        r.code("ControllerPublishVolume of an ext4 volume as xfs", c.ctrl.controller_publish_volume(cpub(&id, NODE, Some(mount_cap("xfs")))).await, fp);
        r.unchanged("refused ControllerPublishVolume calls", &fx, &clean);
        for v in [&id, &bid] {
            let nodes = published_to(c, v).await;
            r.check(nodes.is_empty(), || format!("a refused ControllerPublishVolume left {v} published to {nodes:?}"));
        }
    });
}

#[test]
fn controller_publish_names_the_partition_repeats_the_same_answer_and_reports_this_node() {
    conform(&[GIB], async |fx, c, r| {
        let before = fx.state();
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-cp-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let (_, fs_dev, _) = fx.new_partition(&before, &fx.state()).expect("one partition for the fs volume");
        let _blk = must("CreateVolume block", c.ctrl.create_volume(vol_req("conf-cp-blk", 16 * MIB_I, 0, vec![block_cap()], &[])).await).volume.unwrap();
        let _spare = must("CreateVolume spare", c.ctrl.create_volume(vol_req("conf-cp-spare", 16 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let id = fs.volume_id.clone();
        let cap = || Some(mount_cap("ext4"));
        let clean = fx.state();
        // --- Success: the publish context names the partition; repeats give the same
        // answer [idempotency]; the volume reports this node as published.
        let first = r.ok("ControllerPublishVolume", c.ctrl.controller_publish_volume(cpub(&id, NODE, cap())).await);
        if let Some(got) = &first {
            let dev = got.publish_context.get("drivelet.io/device").map(PathBuf::from);
            r.check(dev.as_deref() == Some(fs_dev.as_path()), || format!("publish_context device {dev:?}, want {}", fs_dev.display()));
            let guid = got.publish_context.get("drivelet.io/partition-guid");
            r.check(guid == Some(&id), || format!("publish_context partition-guid {guid:?}, want the volume id {id}"));
            r.check(got.publish_context.len() == 2, || format!("publish_context has extra keys: {:?}", got.publish_context));
        }
        let again = r.ok("ControllerPublishVolume repeated", c.ctrl.controller_publish_volume(cpub(&id, NODE, cap())).await);
        r.check(again == first, || format!("a repeated ControllerPublishVolume answered {again:?}, first {first:?}"));
        let default_fs = r.ok("ControllerPublishVolume repeated with the default filesystem", c.ctrl.controller_publish_volume(cpub(&id, NODE, Some(mount_cap("")))).await);
        r.check(default_fs == first, || "a compatible repeat changed the publish context".into());
        let nodes = published_to(c, &id).await;
        r.check(nodes == [NODE], || format!("ControllerGetVolume of an attached volume: published_node_ids {nodes:?}, want [{NODE}]"));
        if let Some(all) = r.ok("ListVolumes", c.ctrl.list_volumes(csi::ListVolumesRequest::default()).await) {
            for e in &all.entries {
                let vid = e.volume.as_ref().map(|v| v.volume_id.clone()).unwrap_or_default();
                let nodes = e.status.as_ref().map(|s| s.published_node_ids.clone()).unwrap_or_default();
                let want: &[&str] = if vid == id { &[NODE] } else { &[] };
                r.check(nodes == want, || format!("ListVolumes entry {vid}: published_node_ids {nodes:?}, want {want:?}"));
            }
        }
        r.check(fx.state() == clean, || "ControllerPublishVolume changed partitions or mounts".into());
    });
}

#[test]
fn an_attached_volume_cannot_be_deleted() {
    conform(&[GIB], async |fx, c, r| {
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-cp-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let id = fs.volume_id.clone();
        let cap = || Some(mount_cap("ext4"));
        let clean = fx.state();
        let fp = Code::FailedPrecondition;
        must("ControllerPublishVolume", c.ctrl.controller_publish_volume(cpub(&id, NODE, cap())).await);
        // --- An attached volume is in use: DeleteVolume is FAILED_PRECONDITION [DeleteVolume
        // Errors: Volume in use] and changes nothing.
        r.code("DeleteVolume of an attached volume", c.ctrl.delete_volume(del_req(&id)).await, fp);
        r.unchanged("DeleteVolume of an attached volume", &fx, &clean);
        r.check(published_to(c, &id).await == [NODE], || "a refused DeleteVolume detached the volume".into());
    });
}

#[test]
fn an_attachment_survives_a_restart() {
    let mut fx = Fixture::start(&[GIB]);
    let mut r = Report::new();
    let rt = rt();
    let (fs, fs_dev) = rt.block_on(async {
        let mut c = Csi::connect(&fx.agent).await;
        let before = fx.state();
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-cp-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let (_, fs_dev, _) = fx.new_partition(&before, &fx.state()).expect("one partition for the fs volume");
        let id = fs.volume_id.clone();
        let cap = || Some(mount_cap("ext4"));
        must("ControllerPublishVolume", c.ctrl.controller_publish_volume(cpub(&id, NODE, cap())).await);
        (fs, fs_dev)
    });

    // --- The attachment is persisted: after a restart it is still reported, and a
    // repeat still answers the same context.
    assert_eq!(fx.agent.stop(), 0, "the agent did not stop cleanly; log:\n{}", fx.agent.log_tail(20));
    fx.agent.spawn();
    rt.block_on(async {
        let mut c = Csi::connect(&fx.agent).await;
        let id = fs.volume_id.clone();
        let cap = || Some(mount_cap("ext4"));
        let nodes = published_to(&mut c, &id).await;
        r.check(nodes == [NODE], || format!("after a restart the attached volume reports published_node_ids {nodes:?}"));
        if let Some(got) = r.ok("ControllerPublishVolume repeated after a restart", c.ctrl.controller_publish_volume(cpub(&id, NODE, cap())).await) {
            let dev = got.publish_context.get("drivelet.io/device").map(PathBuf::from);
            r.check(dev.as_deref() == Some(fs_dev.as_path()), || format!("publish_context device after a restart {dev:?}"));
        }
    });
    r.finish(&fx);
}

#[test]
fn controller_unpublish_is_idempotent_and_detaches_only_from_the_node_named() {
    conform(&[GIB], async |_fx, c, r| {
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-cp-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let blk = must("CreateVolume block", c.ctrl.create_volume(vol_req("conf-cp-blk", 16 * MIB_I, 0, vec![block_cap()], &[])).await).volume.unwrap();
        let id = fs.volume_id.clone();
        let bid = blk.volume_id.clone();
        let cap = || Some(mount_cap("ext4"));
        must("ControllerPublishVolume", c.ctrl.controller_publish_volume(cpub(&id, NODE, cap())).await);
        // --- Unpublish: another node is not attached (OK, nothing changes); this node
        // detaches; repeats and unknown volumes are OK [ControllerUnpublishVolume:
        // idempotent; csi-sanity expects OK for a volume it cannot find].
        r.ok("ControllerUnpublishVolume from another node", c.ctrl.controller_unpublish_volume(cunpub(&id, "some-fake-node-id")).await);
        r.check(published_to(c, &id).await == [NODE], || "unpublishing from another node detached the volume from this one".into());
        r.ok("ControllerUnpublishVolume", c.ctrl.controller_unpublish_volume(cunpub(&id, NODE)).await);
        let nodes = published_to(c, &id).await;
        r.check(nodes.is_empty(), || format!("after ControllerUnpublishVolume published_node_ids is {nodes:?}"));
        r.ok("ControllerUnpublishVolume repeated", c.ctrl.controller_unpublish_volume(cunpub(&id, NODE)).await);
        r.ok("ControllerUnpublishVolume of an unknown volume", c.ctrl.controller_unpublish_volume(cunpub(UNKNOWN_ID, NODE)).await);
        r.ok("ControllerUnpublishVolume of a volume never published", c.ctrl.controller_unpublish_volume(cunpub(&bid, NODE)).await);

        // Without a node id: detached from every node.
        r.ok("ControllerPublishVolume of the block volume", c.ctrl.controller_publish_volume(cpub(&bid, NODE, Some(block_cap()))).await);
        r.check(published_to(c, &bid).await == [NODE], || "the block volume is not reported attached".into());
        r.ok("ControllerUnpublishVolume without node_id", c.ctrl.controller_unpublish_volume(cunpub(&bid, "")).await);
        r.check(published_to(c, &bid).await.is_empty(), || "ControllerUnpublishVolume without node_id left the volume attached".into());
    });
}

#[test]
fn a_drive_being_released_takes_no_new_attachment_and_after_a_forced_release_none_at_all() {
    conform(&[GIB], async |fx, c, r| {
        let fs = must("CreateVolume fs", c.ctrl.create_volume(vol_req("conf-cp-fs", 64 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let blk = must("CreateVolume block", c.ctrl.create_volume(vol_req("conf-cp-blk", 16 * MIB_I, 0, vec![block_cap()], &[])).await).volume.unwrap();
        let spare = must("CreateVolume spare", c.ctrl.create_volume(vol_req("conf-cp-spare", 16 * MIB_I, 0, vec![mount_cap("ext4")], &[])).await).volume.unwrap();
        let id = fs.volume_id.clone();
        let bid = blk.volume_id.clone();
        let cap = || Some(mount_cap("ext4"));
        // --- A drive closed to new work: a drive being released takes no new attachment
        // (FAILED_PRECONDITION naming the drive), while an attachment it already has
        // repeats fine; a forced release fails the volumes, and then nothing attaches.
        r.ok("ControllerPublishVolume before the release", c.ctrl.controller_publish_volume(cpub(&id, NODE, cap())).await);
        let drive = fs.volume_context.get("drivelet.io/drive").cloned().expect("volume context names the drive");
        let (ok, out) = ctl(&fx.agent, &["drive", "release", &drive]);
        assert!(ok && out.contains("releasing"), "ctl drive release: {out}");
        let sid = spare.volume_id.clone();
        match c.ctrl.controller_publish_volume(cpub(&sid, NODE, cap())).await {
            Err(s) if s.code() == Code::FailedPrecondition => {
                r.check(s.message().contains(&drive) && s.message().contains("releasing"), || {
                    format!("publish on a releasing drive: the message should name the drive and its state: {}", s.message())
                });
            }
            other => r.fail(format!("ControllerPublishVolume on a releasing drive: want FailedPrecondition, got {other:?}")),
        }
        r.check(published_to(c, &sid).await.is_empty(), || "a refused publish left the volume attached".into());
        r.ok("ControllerPublishVolume repeated on a releasing drive", c.ctrl.controller_publish_volume(cpub(&id, NODE, cap())).await);
        let (ok, out) = ctl(&fx.agent, &["drive", "release", &drive, "--force"]);
        assert!(ok && out.contains("released"), "ctl drive release --force: {out}");
        for v in [&id, &sid] {
            r.code(&format!("ControllerPublishVolume of {v} after a forced release"), c.ctrl.controller_publish_volume(cpub(v, NODE, cap())).await, Code::FailedPrecondition);
        }

        // Clean up: detach, then every volume deletes.
        r.ok("ControllerUnpublishVolume after the release", c.ctrl.controller_unpublish_volume(cunpub(&id, NODE)).await);
        for v in [&id, &bid, &sid] {
            r.ok(&format!("DeleteVolume {v}"), c.ctrl.delete_volume(del_req(v)).await);
        }
    });
}
