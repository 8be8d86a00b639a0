//! The HTTP endpoints of the real binary: `/readyz` waits for the first drive scan,
//! `/healthz` answers meanwhile, and `/metrics` after a volume lifecycle on loop drives
//! holds the expected series with the expected values.
//!
//! Needs the `failpoints` feature (scripts/test.sh passes it): the first drive scan is
//! held with `FAILPOINTS=inventory.first_scan=sleep(3000)` so the not-ready window is
//! long enough to see.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::*;
use drivelet::grpc::proto::csi;

/// GET `path` over plain HTTP/1.0: (status, body); `None` while nothing listens.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Some((status, body))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// The value of the sample `series` (name with labels, exactly as rendered).
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn require_first_scan_failpoint() {
    let armed = std::process::Command::new("grep").args(["-q", "-a", "-F", "inventory.first_scan", bin()]).status().expect("grep");
    assert!(armed.success(), "{} has no fail points compiled in; run the tests with --features failpoints (scripts/test.sh)", bin());
}

#[test]
fn readiness_waits_for_the_first_scan_and_metrics_follow_a_lifecycle() {
    require_host();
    require_first_scan_failpoint();
    let tmp = short_tempdir();
    let dir = tmp.path();
    let _d1 = LoopDrive::new(dir, "m1.img", 1 << 30);
    let _d2 = LoopDrive::new(dir, "m2.img", 1 << 30);
    let port = free_port();
    let opts = AgentOpts { extra_toml: format!("[http]\naddress = \"127.0.0.1:{port}\"\n[health]\ninterval = \"1s\"\n"), ..AgentOpts::default() };
    let mut agent = Agent::start(dir, opts);
    assert_eq!(agent.stop(), 0, "plain agent stops cleanly");

    // Restart with the first scan held for 3 s.
    agent.spawn_with(&[("FAILPOINTS", "inventory.first_scan=sleep(3000)")]);
    let deadline = Instant::now() + Duration::from_secs(15);
    let healthy = loop {
        if let Some((200, body)) = get(port, "/healthz") {
            break body;
        }
        assert!(Instant::now() < deadline, "no /healthz answer within 15 s; log:\n{}", agent.log_tail(30));
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(healthy, "ok\n");
    let (status, body) = get(port, "/readyz").expect("readyz answers");
    assert_eq!(status, 503, "not ready before the first scan: {body}");
    assert!(body.contains("first drive scan not done"), "{body}");
    let not_ready = get(port, "/metrics").expect("metrics answer while not ready").1;
    assert_eq!(sample(&not_ready, "drivelet_ready"), Some(0.0));

    let deadline = Instant::now() + Duration::from_secs(20);
    while get(port, "/readyz").map(|r| r.0) != Some(200) {
        assert!(Instant::now() < deadline, "not ready within 20 s; log:\n{}", agent.log_tail(30));
        std::thread::sleep(Duration::from_millis(50));
    }
    agent.wait_ready();

    // A lifecycle, and one call that fails.
    let staging = dir.join("kubelet/staging/m");
    let target = dir.join("kubelet/pods/m/mount");
    let _guard = Unmounter(dir.join("kubelet"));
    let rt = rt();
    let id = rt.block_on(async {
        let mut csi = Csi::connect(&agent).await;
        let v = csi.ctrl.create_volume(create_req("pvc-metrics", 64 << 20, mount_cap("ext4"))).await.expect("create").into_inner();
        let id = v.volume.expect("volume").volume_id;
        csi.node.node_stage_volume(stage_req(&id, &staging, mount_cap("ext4"))).await.expect("stage");
        csi.node.node_publish_volume(publish_req(&id, &staging, &target, mount_cap("ext4"), false)).await.expect("publish");
        let missing = csi.ctrl.controller_get_volume(csi::ControllerGetVolumeRequest { volume_id: "no-such-volume".into() }).await;
        assert_eq!(missing.expect_err("unknown volume").code(), tonic::Code::NotFound);
        id
    });
    let published = get(port, "/metrics").expect("metrics").1;
    let want = [
        ("drivelet_ready", 1.0),
        ("drivelet_drives{class=\"managed\",health=\"unknown\",usage=\"active\"}", 2.0),
        ("drivelet_volumes{state=\"published\",condition=\"normal\"}", 1.0),
        ("drivelet_csi_requests_total{method=\"CreateVolume\",code=\"OK\"}", 1.0),
        ("drivelet_csi_requests_total{method=\"NodeStageVolume\",code=\"OK\"}", 1.0),
        ("drivelet_csi_requests_total{method=\"NodePublishVolume\",code=\"OK\"}", 1.0),
        ("drivelet_csi_requests_total{method=\"ControllerGetVolume\",code=\"NOT_FOUND\"}", 1.0),
        ("drivelet_csi_request_duration_seconds_count{method=\"CreateVolume\"}", 1.0),
        ("drivelet_csi_request_duration_seconds_bucket{method=\"CreateVolume\",le=\"+Inf\"}", 1.0),
    ];
    for (series, value) in want {
        assert_eq!(sample(&published, series), Some(value), "{series} in\n{published}");
    }
    assert!(sample(&published, "drivelet_inventory_last_scan_timestamp_seconds").is_some_and(|t| t > 1.7e9), "{published}");
    assert!(published.contains("# TYPE drivelet_csi_request_duration_seconds histogram"));
    assert!(!published.contains("drivelet_attach_queue_depth"), "no attach queue without [kubernetes]");

    rt.block_on(async {
        let mut csi = Csi::connect(&agent).await;
        let unpublish = csi::NodeUnpublishVolumeRequest { volume_id: id.clone(), target_path: target.display().to_string() };
        csi.node.node_unpublish_volume(unpublish).await.expect("unpublish");
        let unstage = csi::NodeUnstageVolumeRequest { volume_id: id.clone(), staging_target_path: staging.display().to_string() };
        csi.node.node_unstage_volume(unstage).await.expect("unstage");
        csi.ctrl.delete_volume(csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() }).await.expect("delete");
    });
    // SMART polls run every second (loop drives answer UNKNOWN, but the poll counts).
    std::thread::sleep(Duration::from_millis(1500));
    let after = get(port, "/metrics").expect("metrics").1;
    assert!(!after.contains("drivelet_volumes{"), "no volume left after the delete:\n{after}");
    assert_eq!(sample(&after, "drivelet_csi_requests_total{method=\"DeleteVolume\",code=\"OK\"}"), Some(1.0));
    assert!(sample(&after, "drivelet_health_polls_total").is_some_and(|n| n >= 1.0), "{after}");
    // The deleted volume's space was zeroed in the background before reuse.
    assert!(sample(&after, "drivelet_zeroed_bytes_total").is_some_and(|n| n >= (64u64 << 20) as f64), "{after}");

    assert_eq!(get(port, "/nope").map(|r| r.0), Some(404));
    assert_eq!(agent.stop(), 0);
    assert!(get(port, "/healthz").is_none(), "the port is closed after stop");
}
