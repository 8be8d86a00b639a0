//! Migration of an in-tree `local` volume end to end: a real ext4 loop drive mounted
//! where the local-static-provisioner would mount it, with data on it; `drivelet ctl
//! migrate -f pv.yaml` prints the translated PV (dry run, nothing adopted), `--apply`
//! adopts it; the data is read and written through the published target, survives a
//! kill -9 of the agent, and is still in place after DeleteVolume (retain semantics).
//! drivelet never writes to that drive: no partition is ever added to it.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use drivelet::grpc::proto::csi;
use tonic::Code;

fn pv_yaml(name: &str, node: &str, path: &Path) -> String {
    format!(
        r#"apiVersion: v1
kind: PersistentVolume
metadata:
  name: {name}
  labels:
    storage.example.com/pool: fast
  annotations:
    pv.kubernetes.io/provisioned-by: local-volume-provisioner-{node}
spec:
  capacity:
    storage: 256Mi
  accessModes:
  - ReadWriteOnce
  persistentVolumeReclaimPolicy: Retain
  storageClassName: local-disks
  volumeMode: Filesystem
  local:
    path: {path}
    fsType: ext4
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - key: kubernetes.io/hostname
          operator: In
          values:
          - {node}
"#,
        path = path.display()
    )
}

/// Runs `drivelet ctl -c CONFIG migrate ARGS...`: (success, stdout, stderr).
fn migrate(agent: &Agent, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin())
        .args(["ctl", "--config", agent.config.to_str().unwrap(), "migrate"])
        .args(args)
        .output()
        .expect("run drivelet ctl migrate");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_local_pv_is_translated_adopted_served_and_kept_after_delete() {
    require_host();
    let tmp = short_tempdir();
    let dir = tmp.path();
    // The in-tree volume: an ext4 drive mounted under /mnt/disks, with data.
    let local = LoopDrive::new(dir, "local.img", 256 * MIB);
    sh("mkfs.ext4", &["-F", "-q", local.dev.to_str().unwrap()]);
    let mnt = dir.join("mnt/disks/vol1");
    std::fs::create_dir_all(&mnt).unwrap();
    sh("mount", &[local.dev.to_str().unwrap(), mnt.to_str().unwrap()]);
    let _unmount = Unmounter(dir.to_path_buf());
    std::fs::write(mnt.join("before.txt"), "written before adoption").unwrap();
    let pv_file = dir.join("pv.yaml");
    std::fs::write(&pv_file, pv_yaml("local-pv-1", NODE, &mnt)).unwrap();

    let mut agent = Agent::start(dir, AgentOpts { extra_toml: "[migration]\nlocal = true\n".into(), ..AgentOpts::default() });

    // Dry run: the translated PV, nothing adopted.
    let (ok, out, err) = migrate(&agent, &["-f", pv_file.to_str().unwrap()]);
    assert!(ok, "dry run failed: {err}");
    assert!(err.contains("dry run"), "{err}");
    let translated: serde_json::Value = serde_norway::from_str(&out).expect("the output is a PV");
    let csi_src = &translated["spec"]["csi"];
    assert_eq!(csi_src["driver"], "csi.drivelet.io");
    assert_eq!(csi_src["fsType"], "ext4");
    assert_eq!(csi_src["volumeAttributes"]["drivelet.io/local-path"], mnt.display().to_string());
    assert!(translated["spec"]["local"].is_null(), "the local source is replaced");
    let terms = &translated["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0];
    assert_eq!(terms["key"], "topology.drivelet.io/node");
    assert_eq!(terms["values"][0], NODE);
    assert_eq!(translated["spec"]["persistentVolumeReclaimPolicy"], "Retain", "everything else is kept");
    let id = csi_src["volumeHandle"].as_str().expect("volume handle").to_string();
    assert!(id.starts_with("local-"), "{id}");
    assert_eq!(agent.ctl_volume_ids(), Some(vec![]), "a dry run adopts nothing");

    // Apply: adopted on this node, idempotently.
    for round in ["first", "repeated"] {
        let (ok, _, err) = migrate(&agent, &["-f", pv_file.to_str().unwrap(), "--apply"]);
        assert!(ok, "{round} --apply failed: {err}");
        assert!(err.contains("adopted"), "{err}");
    }
    assert_eq!(agent.ctl_volume_ids(), Some(vec![id.clone()]));

    let staging = dir.join("kubelet/plugins/migrated");
    let target = dir.join("kubelet/pods/p/volumes/data");
    let rt = rt();
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        c.node.node_stage_volume(stage_req(&id, &staging, mount_cap("ext4"))).await.expect("stage the adopted volume");
        c.node.node_publish_volume(publish_req(&id, &staging, &target, mount_cap("ext4"), false)).await.expect("publish it");
        let got = c.ctrl.controller_get_volume(csi::ControllerGetVolumeRequest { volume_id: id.clone() }).await.expect("get").into_inner();
        let cond = got.status.expect("status").volume_condition.expect("condition");
        assert!(!cond.abnormal, "an adopted volume on a readable directory is healthy: {}", cond.message);
        assert!(got.volume.expect("volume").capacity_bytes > 0, "its capacity is its filesystem's");
        let grow = csi::ControllerExpandVolumeRequest {
            volume_id: id.clone(),
            capacity_range: Some(csi::CapacityRange { required_bytes: 1 << 30, limit_bytes: 0 }),
            ..Default::default()
        };
        let e = c.ctrl.controller_expand_volume(grow).await.expect_err("adopted volumes do not grow");
        assert_eq!(e.code(), Code::FailedPrecondition);
    });
    assert_eq!(std::fs::read_to_string(target.join("before.txt")).unwrap(), "written before adoption");
    std::fs::write(target.join("after.txt"), "written through drivelet").unwrap();
    assert_eq!(std::fs::read_to_string(mnt.join("after.txt")).unwrap(), "written through drivelet", "the target is the original directory");

    // kill -9 and restart: still adopted, still served.
    agent.kill();
    agent.spawn();
    assert_eq!(agent.ctl_volume_ids(), Some(vec![id.clone()]), "the adoption survives a restart");
    assert_eq!(std::fs::read_to_string(target.join("before.txt")).unwrap(), "written before adoption");
    rt.block_on(async {
        let mut c = Csi::connect(&agent).await;
        let stats = csi::NodeGetVolumeStatsRequest { volume_id: id.clone(), volume_path: target.display().to_string(), ..Default::default() };
        let s = c.node.node_get_volume_stats(stats).await.expect("stats").into_inner();
        assert!(s.usage.iter().any(|u| u.total > 0), "usage of the adopted filesystem: {:?}", s.usage);
        let attach = csi::ControllerPublishVolumeRequest {
            volume_id: id.clone(),
            node_id: NODE.into(),
            volume_capability: Some(mount_cap("ext4")),
            ..Default::default()
        };
        let ctx = c.ctrl.controller_publish_volume(attach).await.expect("attach").into_inner().publish_context;
        assert_eq!(ctx.get("drivelet.io/local-path"), Some(&mnt.display().to_string()));
        let detach = csi::ControllerUnpublishVolumeRequest { volume_id: id.clone(), node_id: NODE.into(), ..Default::default() };
        c.ctrl.controller_unpublish_volume(detach).await.expect("detach");
        let unpublish = csi::NodeUnpublishVolumeRequest { volume_id: id.clone(), target_path: target.display().to_string() };
        c.node.node_unpublish_volume(unpublish).await.expect("unpublish");
        let unstage = csi::NodeUnstageVolumeRequest { volume_id: id.clone(), staging_target_path: staging.display().to_string() };
        c.node.node_unstage_volume(unstage).await.expect("unstage");
        c.ctrl.delete_volume(csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() }).await.expect("delete");
    });
    assert_eq!(agent.ctl_volume_ids(), Some(vec![]), "the record is gone");
    assert_eq!(std::fs::read_to_string(mnt.join("before.txt")).unwrap(), "written before adoption", "DeleteVolume keeps the data");
    assert_eq!(std::fs::read_to_string(mnt.join("after.txt")).unwrap(), "written through drivelet");
    assert!(mounts_under(&dir.join("kubelet")).is_empty(), "no mount left: {:?}", mounts_under(&dir.join("kubelet")));
    assert!(kernel_parts(&local.dev).is_empty(), "no partition was ever added to the adopted drive");

    // Refusals: another node's PV is not adopted here; a PV with a relative path is not translated.
    let other = dir.join("other.yaml");
    std::fs::write(&other, pv_yaml("local-pv-2", "node-elsewhere", &mnt)).unwrap();
    let (ok, _, err) = migrate(&agent, &["-f", other.to_str().unwrap(), "--apply"]);
    assert!(!ok && err.contains("node-elsewhere"), "another node's PV: {err}");
    let relative = dir.join("relative.yaml");
    std::fs::write(&relative, pv_yaml("local-pv-3", NODE, &PathBuf::from("mnt/disks/vol1"))).unwrap();
    let (ok, _, err) = migrate(&agent, &["-f", relative.to_str().unwrap()]);
    assert!(!ok && err.contains("not absolute"), "a relative path: {err}");
    assert_eq!(agent.ctl_volume_ids(), Some(vec![]), "refusals adopt nothing");
    sh("umount", &[mnt.to_str().unwrap()]);
}
