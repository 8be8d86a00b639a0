//! The HTTP endpoints of the real binary: `/readyz` waits for the first drive scan,
//! `/healthz` answers meanwhile, and `/metrics` after a volume lifecycle on loop drives
//! holds the expected series with the expected values: the process counters, each
//! drive's size and free space (less after a create, as much again after the delete)
//! and each volume's info, size and condition, read back by a strict OpenMetrics
//! parser from what the agent served with the OpenMetrics content type.
//!
//! `/metrics` answers the format the scraper asks for: with Prometheus' `Accept` header
//! OpenMetrics, which a strict OpenMetrics parser reads; with promtool's (the
//! Prometheus text format 0.0.4) or none, the text format, which `promtool check
//! metrics` passes. The CSI `method` label is one of the methods drivelet serves or
//! `unknown`, however many made-up paths a client calls.
//!
//! Needs the `failpoints` feature (scripts/test.sh passes it): the first drive scan is
//! held with `FAILPOINTS=inventory.first_scan=sleep(3000)` so the not-ready window is
//! long enough to see.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::*;
use drivelet::grpc::proto::csi;

/// GET `path` over plain HTTP/1.0 as Prometheus asks for it: (status, body); `None`
/// while nothing listens.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    get_with_headers(port, path).map(|(status, _, body)| (status, body))
}

/// GET `path` as Prometheus asks for it (OpenMetrics first): (status, response head, body).
fn get_with_headers(port: u16, path: &str) -> Option<(u16, String, String)> {
    get_accepting(port, path, Some(PROMETHEUS_ACCEPT))
}

/// The `Accept` header of Prometheus 3's scrapes.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";

/// GET `path` with the header `Accept: accept` (none for `None`): (status, response
/// head, body).
fn get_accepting(port: u16, path: &str, accept: Option<&str>) -> Option<(u16, String, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let accept = accept.map(|a| format!("Accept: {a}\r\n")).unwrap_or_default();
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n{accept}\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let (head, body) = text.split_once("\r\n\r\n").map(|(h, b)| (h.to_string(), b.to_string())).unwrap_or_default();
    Some((status, head, body))
}

/// The exposition as a scraper reads it: family name -> (labels, value) of each series.
/// Panics when it is not OpenMetrics. (The parser refuses a UNIT line on a histogram,
/// which OpenMetrics allows; that one line is left out.)
fn parse(text: &str) -> std::collections::HashMap<String, Vec<(std::collections::BTreeMap<String, String>, f64)>> {
    use openmetrics_parser::OpenMetricsValue as V;
    let text = text.replace("# UNIT drivelet_csi_request_duration_seconds seconds\n", "");
    let parsed = openmetrics_parser::openmetrics::parse_openmetrics(&text).unwrap_or_else(|e| panic!("not OpenMetrics: {e:?}\n{text}"));
    parsed
        .families
        .iter()
        .map(|(name, family)| {
            let series = family
                .iter_samples()
                .filter_map(|s| {
                    let labels = s.get_labelset().ok()?.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                    let value = match &s.value {
                        V::Gauge(n) | V::Unknown(n) | V::StateSet(n) => n.as_f64(),
                        V::Counter(c) => c.value.as_f64(),
                        _ => return None,
                    };
                    Some((labels, value))
                })
                .collect();
            (name.clone(), series)
        })
        .collect()
}

/// The value of the one series of `family` whose labels include `with`.
fn series(parsed: &std::collections::HashMap<String, Vec<(std::collections::BTreeMap<String, String>, f64)>>, family: &str, with: &[(&str, &str)]) -> Option<f64> {
    let all = parsed.get(family)?;
    let mut found = all.iter().filter(|(labels, _)| with.iter().all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v)));
    let (_, value) = found.next()?;
    assert!(found.next().is_none(), "more than one series of {family} with {with:?}");
    Some(*value)
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

    // Each loop drive, before any volume: its size, and its free space is all of its
    // usable region, every byte of it allocatable.
    let (status, head, before) = get_with_headers(port, "/metrics").expect("metrics");
    assert_eq!(status, 200);
    assert!(head.to_ascii_lowercase().contains("content-type: application/openmetrics-text; version=1.0.0"), "{head}");
    let before = parse(&before);
    // (Other loop devices of the host are listed too, as excluded: only ours are managed.)
    let drives: Vec<String> = before["drivelet_drive_class"]
        .iter()
        .filter(|(l, v)| l.get("class").map(String::as_str) == Some("managed") && *v == 1.0)
        .map(|(l, _)| l["drive"].clone())
        .collect();
    assert_eq!(drives.len(), 2, "two managed loop drives: {:?}", before["drivelet_drive_class"]);
    let mut free_before = std::collections::HashMap::new();
    for drive in &drives {
        let at = [("drive", drive.as_str()), ("node", NODE), ("media", "virtual")];
        assert_eq!(series(&before, "drivelet_drive_size_bytes", &at), Some((1u64 << 30) as f64), "{drive}");
        assert_eq!(series(&before, "drivelet_drive_usage", &[("drive", drive), ("usage", "active")]), Some(1.0));
        assert_eq!(series(&before, "drivelet_drive_volumes", &at), Some(0.0));
        let free = series(&before, "drivelet_drive_free_bytes", &at).expect("free bytes");
        assert!(free > 1000.0 * (1 << 20) as f64, "{drive}: {free}");
        assert_eq!(series(&before, "drivelet_drive_allocatable_bytes", &at), Some(free), "{drive}: one extent, all of it allocatable");
        free_before.insert(drive.clone(), free);
    }

    // A lifecycle, and one call that fails.
    let staging = dir.join("kubelet/staging/m");
    let target = dir.join("kubelet/pods/m/mount");
    let _guard = Unmounter(dir.join("kubelet"));
    let rt = rt();
    let id = rt.block_on(async {
        let mut csi = Csi::connect(&agent).await;
        let mut req = create_req("pvc-metrics", 64 << 20, mount_cap("ext4"));
        for (k, v) in [("csi.storage.k8s.io/pv/name", "pv-metrics"), ("csi.storage.k8s.io/pvc/namespace", "shop"), ("csi.storage.k8s.io/pvc/name", "orders")] {
            req.parameters.insert(k.into(), v.into());
        }
        let v = csi.ctrl.create_volume(req).await.expect("create").into_inner();
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
        ("drivelet_csi_request_duration_seconds_bucket{le=\"+Inf\",method=\"CreateVolume\"}", 1.0),
    ];
    for (series, value) in want {
        assert_eq!(sample(&published, series), Some(value), "{series} in\n{published}");
    }
    assert!(sample(&published, "drivelet_inventory_last_scan_timestamp_seconds").is_some_and(|t| t > 1.7e9), "{published}");
    assert!(published.contains("# TYPE drivelet_csi_request_duration_seconds histogram"));
    assert!(!published.contains("drivelet_attach_queue_depth"), "no attach queue without [kubernetes]");

    // The volume's series, and its drive's free space 64 MiB less.
    let parsed = parse(&published);
    let vol = [("volume", id.as_str()), ("node", NODE)];
    let info = |k: &str, v: &str| series(&parsed, "drivelet_volume_info", &[vol[0], (k, v)]);
    for (k, v) in [("pv", "pv-metrics"), ("claim_namespace", "shop"), ("claim", "orders"), ("access", "mount"), ("fs", "ext4")] {
        assert_eq!(info(k, v), Some(1.0), "volume_info {k}={v}: {:?}", parsed.get("drivelet_volume_info"));
    }
    assert_eq!(series(&parsed, "drivelet_volume_size_bytes", &vol), Some((64u64 << 20) as f64));
    assert_eq!(series(&parsed, "drivelet_volume_abnormal", &vol), Some(0.0));
    assert!(!parsed.contains_key("drivelet_volume_condition_reason"), "a normal volume gives no reason");
    let on = parsed["drivelet_volume_info"][0].0["drive"].clone();
    let at = [("drive", on.as_str())];
    assert_eq!(series(&parsed, "drivelet_drive_volumes", &at), Some(1.0));
    assert_eq!(series(&parsed, "drivelet_drive_free_bytes", &at), Some(free_before[&on] - (64u64 << 20) as f64), "{on}: 64 MiB less free");
    for drive in drives.iter().filter(|d| **d != on) {
        assert_eq!(series(&parsed, "drivelet_drive_free_bytes", &[("drive", drive)]), Some(free_before[drive]), "{drive}: untouched");
    }

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
    // The volume's series are gone, and its space is free again once zeroed.
    let parsed = parse(&after);
    assert!(!parsed.contains_key("drivelet_volume_info"), "{after}");
    assert_eq!(series(&parsed, "drivelet_drive_free_bytes", &at), Some(free_before[&on]), "{on}: all free again");
    assert_eq!(series(&parsed, "drivelet_drive_cleaning_bytes", &at), Some(0.0));
    assert!(series(&parsed, "drivelet_drive_health_checked_timestamp_seconds", &at).is_some_and(|t| t > 1.7e9), "polled: {after}");

    assert_eq!(get(port, "/nope").map(|r| r.0), Some(404));
    assert_eq!(agent.stop(), 0);
    assert!(get(port, "/healthz").is_none(), "the port is closed after stop");
}

/// `promtool check metrics` on `text`: `Err` with what it said unless it passes with
/// nothing to say.
fn promtool_check(text: &str) -> Result<(), String> {
    use std::process::{Command, Stdio};
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run promtool ({e}): scripts/setup-host.sh installs Debian's prometheus package, which has it"));
    child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write to promtool");
    let out = child.wait_with_output().expect("promtool");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() && said.trim().is_empty() {
        Ok(())
    } else {
        Err(format!("promtool check metrics: {}: {said}", out.status))
    }
}

/// A unary call of `path` on the CSI socket, whatever it names: its gRPC code.
async fn call_path(ch: tonic::transport::Channel, path: &str) -> tonic::Code {
    let mut grpc = tonic::client::Grpc::new(ch);
    grpc.ready().await.expect("the CSI socket takes calls");
    let path = tonic::codegen::http::uri::PathAndQuery::try_from(path.to_string()).expect("a request path");
    let codec = tonic_prost::ProstCodec::<csi::ProbeRequest, csi::ProbeResponse>::default();
    match grpc.unary(tonic::Request::new(csi::ProbeRequest {}), path, codec).await {
        Ok(_) => tonic::Code::Ok,
        Err(s) => s.code(),
    }
}

#[test]
fn metrics_answer_openmetrics_to_whoever_asks_and_the_text_format_promtool_passes_otherwise() {
    require_host();
    let tmp = short_tempdir();
    let dir = tmp.path();
    let _d = LoopDrive::new(dir, "f1.img", 1 << 30);
    let port = free_port();
    let opts = AgentOpts { extra_toml: format!("[http]\naddress = \"127.0.0.1:{port}\"\n"), ..AgentOpts::default() };
    let mut agent = Agent::start(dir, opts);

    // A volume (its series), a call that fails, and calls of 60 paths no CSI service
    // serves: made-up methods, another package, the services drivelet only refuses.
    let made_up: Vec<String> = (0..50)
        .map(|n| format!("/csi.v1.Controller/Minted{n}"))
        .chain((0..5).map(|n| format!("/evil.Service{n}/CreateVolume")))
        .chain(["/csi.v1.GroupController/GroupControllerGetCapabilities", "/csi.v1.SnapshotMetadata/GetMetadataAllocated"].map(String::from))
        .chain((0..3).map(|n| format!("/csi.v1.Node/NodeStageVolume{}", "x".repeat(n + 1))))
        .collect();
    let rt = rt();
    rt.block_on(async {
        let mut csi = Csi::connect(&agent).await;
        csi.ctrl.create_volume(create_req("pvc-formats", 64 << 20, mount_cap("ext4"))).await.expect("create");
        let missing = csi.ctrl.controller_get_volume(csi::ControllerGetVolumeRequest { volume_id: "no-such-volume".into() }).await;
        assert_eq!(missing.expect_err("unknown volume").code(), tonic::Code::NotFound);
        for path in &made_up {
            assert_eq!(call_path(agent.csi().await, path).await, tonic::Code::Unimplemented, "{path}");
        }
    });

    // Prometheus (OpenMetrics first): OpenMetrics, read by a strict parser.
    let (status, head, om) = get_accepting(port, "/metrics", Some(PROMETHEUS_ACCEPT)).expect("metrics");
    assert_eq!(status, 200);
    let head = head.to_ascii_lowercase();
    assert!(head.contains("content-type: application/openmetrics-text; version=1.0.0; charset=utf-8"), "Prometheus' Accept, answered not OpenMetrics: {head}");
    assert!(head.contains("vary: accept"), "a negotiated answer says so (Vary: Accept): {head}");
    assert!(om.ends_with("# EOF\n"), "OpenMetrics ends in # EOF:\n{om}");
    let parsed = parse(&om);
    let served: std::collections::BTreeSet<&str> = [
        "GetPluginInfo", "GetPluginCapabilities", "Probe", "CreateVolume", "DeleteVolume", "ControllerPublishVolume",
        "ControllerUnpublishVolume", "ValidateVolumeCapabilities", "ListVolumes", "GetCapacity", "ControllerGetCapabilities",
        "CreateSnapshot", "DeleteSnapshot", "ListSnapshots", "GetSnapshot", "ControllerExpandVolume", "ControllerGetVolume",
        "ControllerModifyVolume", "ControllerListVolumeHealth", "ControllerGetVolumeHealth", "NodeStageVolume", "NodeUnstageVolume",
        "NodePublishVolume", "NodeUnpublishVolume", "NodeGetVolumeStats", "NodeExpandVolume", "NodeGetCapabilities", "NodeGetInfo",
        "NodeGetVolumeHealth", "NodeGetStorageHealth", "unknown",
    ]
    .into();
    let methods: std::collections::BTreeSet<String> =
        parsed["drivelet_csi_requests"].iter().map(|(labels, _)| labels["method"].clone()).collect();
    assert!(methods.iter().all(|m| served.contains(m.as_str())), "method labels outside the served set: {methods:?}");
    assert_eq!(
        series(&parsed, "drivelet_csi_requests", &[("method", "unknown"), ("code", "UNIMPLEMENTED")]),
        Some(made_up.len() as f64),
        "every made-up path counted as unknown"
    );
    assert_eq!(series(&parsed, "drivelet_csi_requests", &[("method", "CreateVolume"), ("code", "OK")]), Some(1.0));
    assert!(!om.contains("Minted") && !om.contains("evil") && !om.contains("GroupController"), "a path in a label:\n{om}");

    // promtool and older agents (the text format 0.0.4 asked for by name), and a client
    // that says nothing: the text format, which promtool passes.
    for accept in [Some("text/plain; version=0.0.4"), Some("text/plain;version=0.0.4;q=0.9,*/*;q=0.1"), None, Some("*/*")] {
        let (status, head, text) = get_accepting(port, "/metrics", accept).expect("metrics");
        assert_eq!(status, 200);
        let head = head.to_ascii_lowercase();
        assert!(head.contains("content-type: text/plain; version=0.0.4; charset=utf-8"), "Accept {accept:?}: {head}");
        assert!(!text.contains("# EOF") && !text.contains("# UNIT"), "Accept {accept:?}: OpenMetrics lines in the text format:\n{text}");
        assert!(text.contains("# HELP drivelet_csi_requests_total "), "Accept {accept:?}:\n{text}");
        assert_eq!(sample(&text, "drivelet_csi_requests_total{method=\"unknown\",code=\"UNIMPLEMENTED\"}"), Some(made_up.len() as f64));
        if let Err(e) = promtool_check(&text) {
            panic!("Accept {accept:?}: {e}\n{text}");
        }
    }
    // The OpenMetrics answer is not the text format promtool checks: what the issue saw.
    assert!(promtool_check(&om).is_err(), "promtool reads OpenMetrics as the text format and finds its HELP lines misnamed");
    assert_eq!(agent.stop(), 0);
}
