//! A request's secrets never reach the log, at the most verbose level (`RUST_LOG=trace`,
//! every crate: drivelet, tonic, h2, hyper), on success and on refusal.

use crate::common::*;
use drivelet::grpc::proto::csi;

const MIB: u64 = 1 << 20;

#[test]
fn secrets_never_reach_the_log_even_at_trace_level() {
    require_host();
    let tmp = short_tempdir();
    let _u = Unmounter(tmp.path().to_path_buf());
    let _drive = LoopDrive::new(tmp.path(), "a.img", 256 * MIB);
    sh("udevadm", &["settle"]);
    let mut agent = Agent::start_env(tmp.path(), AgentOpts::default(), &[("RUST_LOG", "trace")]);
    let secrets: std::collections::HashMap<String, String> =
        [("csi-password-key".to_string(), "Hunter2-SECRET-VALUE".to_string())].into();
    let staging = tmp.path().join("kubelet/plugins/s/stage");
    let target = tmp.path().join("kubelet/pods/p/volumes/v/mount");
    rt().block_on(async {
        let mut c = Csi::connect(&agent).await;
        let mut req = create_req("pvc-secrets", 16 * MIB, mount_cap("ext4"));
        req.secrets = secrets.clone();
        let id = c.ctrl.create_volume(req).await.unwrap().into_inner().volume.unwrap().volume_id;
        let mut stage = stage_req(&id, &staging, mount_cap("ext4"));
        stage.secrets = secrets.clone();
        c.node.node_stage_volume(stage).await.unwrap();
        let mut publish = publish_req(&id, &staging, &target, mount_cap("ext4"), false);
        publish.secrets = secrets.clone();
        c.node.node_publish_volume(publish).await.unwrap();
        // Refused requests carry them too: their errors are logged.
        let mut bad = publish_req(&id, &staging, std::path::Path::new("/etc/passwd"), mount_cap("ext4"), false);
        bad.secrets = secrets.clone();
        assert!(c.node.node_publish_volume(bad).await.is_err());
        let mut bad = create_req("", 16 * MIB, mount_cap("ext4"));
        bad.secrets = secrets.clone();
        assert!(c.ctrl.create_volume(bad).await.is_err());
        let mut expand = csi::ControllerExpandVolumeRequest { volume_id: id.clone(), ..Default::default() };
        expand.capacity_range = Some(csi::CapacityRange { required_bytes: 32 * MIB as i64, limit_bytes: 0 });
        expand.secrets = secrets.clone();
        let _ = c.ctrl.controller_expand_volume(expand).await;
        c.node.node_unpublish_volume(unpublish_req(&id, &target)).await.unwrap();
        c.node.node_unstage_volume(unstage_req(&id, &staging)).await.unwrap();
        let mut del = del_req(&id);
        del.secrets = secrets.clone();
        c.ctrl.delete_volume(del).await.unwrap();
    });
    assert_eq!(agent.stop(), 0);
    let log = agent.logs();
    assert!(log.lines().count() > 100 && log.contains("\"level\":\"TRACE\""), "the log is at trace level:\n{}", agent.log_tail(10));
    for word in ["Hunter2-SECRET-VALUE", "csi-password-key"] {
        let hits: Vec<&str> = log.lines().filter(|l| l.contains(word)).take(3).collect();
        assert!(hits.is_empty(), "{word} is in the log:\n{}", hits.join("\n"));
    }
}
