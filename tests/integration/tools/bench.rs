//! `drivelet bench` through the real binary against a real agent on loop drives: the
//! JSON report adds up, latencies are positive and ordered, nothing fails, a failing
//! lifecycle is cleaned up, and no volume, mount or directory is left afterwards.

use std::path::Path;
use std::process::Command;

use crate::common::*;
use drivelet::grpc::proto::csi;
use serde_json::Value;

/// Runs `drivelet bench ARGS --output json`; returns the report.
fn bench_json(args: &[&str]) -> Value {
    let out = Command::new(bin()).arg("bench").args(args).args(["--output", "json"]).output().expect("run drivelet bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "drivelet bench {args:?} failed: {stderr}");
    assert!(stderr.is_empty(), "no progress on stderr when it is not a terminal: {stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("bench JSON: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// Latencies are positive and min <= p50 <= p95 <= p99 <= max.
fn assert_ordered(what: &str, l: &Value) {
    let vals: Vec<f64> = ["min_us", "p50_us", "p95_us", "p99_us", "max_us"].iter().map(|k| f(&l[*k])).collect();
    assert!(vals[0] > 0.0, "{what}: latencies are positive: {l}");
    assert!(vals.windows(2).all(|w| w[0] <= w[1]), "{what}: min <= p50 <= p95 <= p99 <= max: {l}");
    assert!(f(&l["mean_us"]) >= vals[0] && f(&l["mean_us"]) <= vals[4], "{what}: mean within min and max: {l}");
}

/// Every call entry succeeded `n` times (any number when `None`) and is ordered.
fn assert_clean_calls(ep: &Value, n: Option<u64>) {
    for c in ep["calls"].as_array().expect("calls") {
        let name = c["name"].as_str().unwrap_or_default();
        assert_eq!(u(&c["errors"]), 0, "{name}: no errors: {c}");
        assert_eq!(c["errors_by_code"], serde_json::json!({}), "{name}");
        assert_eq!(u(&c["calls"]), u(&c["ok"]) + u(&c["errors"]), "{name}: calls add up");
        match n {
            Some(n) => assert_eq!(u(&c["ok"]), n, "{name}: once per lifecycle: {c}"),
            None => assert!(u(&c["ok"]) > 0, "{name}: called: {c}"),
        }
        assert!(f(&c["per_s"]) > 0.0, "{name}: throughput: {c}");
        assert_ordered(name, &c["latency"]);
    }
}

fn names(ep: &Value) -> Vec<&str> {
    ep["calls"].as_array().expect("calls").iter().map(|c| c["name"].as_str().unwrap_or_default()).collect()
}

fn volumes_via_csi(agent: &Agent) -> usize {
    rt().block_on(async {
        let mut c = Csi::connect(agent).await;
        c.ctrl.list_volumes(csi::ListVolumesRequest::default()).await.expect("ListVolumes").into_inner().entries.len()
    })
}

fn assert_nothing_left(agent: &Agent, dir: &Path) {
    if let Some(ids) = agent.ctl_volume_ids() {
        assert!(ids.is_empty(), "no volume is left: {ids:?}");
    }
    assert_eq!(volumes_via_csi(agent), 0, "ListVolumes is empty");
    assert!(mounts_under(dir).is_empty(), "nothing is mounted: {:?}", mounts_under(dir));
    for sub in ["kubelet/stage", "kubelet/pods"] {
        let left: Vec<_> = std::fs::read_dir(dir.join(sub)).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
        assert!(left.is_empty(), "the bench removed its directories under {sub}: {left:?}");
    }
}

#[test]
fn bench_rpc_and_lifecycle_against_a_real_agent_report_no_errors_and_leave_no_volumes() {
    require_host();
    let tmp = short_tempdir();
    let _a = LoopDrive::new(tmp.path(), "a.img", GIB);
    let _b = LoopDrive::new(tmp.path(), "b.img", GIB);
    let agent = Agent::start(tmp.path(), AgentOpts::default());
    let _unmount = Unmounter(tmp.path().to_path_buf());
    let ep = format!("drivelet={}", agent.csi_socket.display());
    let stage = tmp.path().join("kubelet/stage");
    let pods = tmp.path().join("kubelet/pods");
    let (stage, pods) = (stage.to_str().unwrap(), pods.to_str().unwrap());

    // rpc: every cheap RPC (GetPluginInfo, the baseline, first) for a second, two callers with a connection each.
    let r = bench_json(&["rpc", "--endpoint", &ep, "--duration", "1s", "--concurrency", "2"]);
    assert_eq!(r["mode"], "rpc");
    assert_eq!(r["connections"], "per-caller");
    let e = &r["endpoints"][0];
    assert_eq!(e["label"], "drivelet");
    assert_eq!(e["driver"], "csi.drivelet.io");
    assert_eq!(names(e), ["GetPluginInfo", "Probe", "NodeGetInfo", "NodeGetCapabilities", "GetCapacity", "ListVolumes"]);
    assert_eq!(e["skipped"], serde_json::json!([]));
    assert_eq!(u(&e["errors"]), 0);
    assert_clean_calls(e, None);
    assert!(f(&e["elapsed_s"]) >= 6.0, "six phases of a second: {}", e["elapsed_s"]);

    // Two labelled endpoints in one run (here the same socket twice), one shared channel.
    let r = bench_json(&[
        "rpc", "--endpoint", &format!("first={}", agent.csi_socket.display()), "--endpoint",
        &format!("second={}", agent.csi_socket.display()), "--duration", "1s", "--rpc", "probe", "--connections", "shared",
    ]);
    assert_eq!(r["connections"], "shared");
    let labels: Vec<&str> = r["endpoints"].as_array().unwrap().iter().map(|e| e["label"].as_str().unwrap()).collect();
    assert_eq!(labels, ["first", "second"]);
    for e in r["endpoints"].as_array().unwrap() {
        assert_eq!(names(e), ["Probe"]);
        assert_clean_calls(e, None);
    }

    // lifecycle: four whole lifecycles, two at a time.
    let r = bench_json(&[
        "lifecycle", "--endpoint", &ep, "--count", "4", "--concurrency", "2", "--size", "32Mi", "--staging-dir", stage,
        "--target-dir", pods,
    ]);
    assert_eq!(r["mode"], "lifecycle");
    assert_eq!(u(&r["count"]), 4);
    let e = &r["endpoints"][0];
    assert_eq!(
        names(e),
        [
            "CreateVolume", "ControllerPublishVolume", "NodeStageVolume", "NodePublishVolume", "write+read",
            "NodeUnpublishVolume", "NodeUnstageVolume", "ControllerUnpublishVolume", "DeleteVolume",
        ]
    );
    assert_clean_calls(e, Some(4));
    let l = &e["lifecycles"];
    assert_eq!((u(&l["started"]), u(&l["completed"]), u(&l["failed"])), (4, 4, 0), "{l}");
    assert_eq!(l["left_behind"], serde_json::json!([]));
    assert!(f(&l["per_s"]) > 0.0);
    assert_ordered("lifecycle", &l["latency"]);
    let create_min = f(&e["calls"][0]["latency"]["min_us"]);
    assert!(f(&l["latency"]["min_us"]) > create_min, "a whole lifecycle takes longer than its CreateVolume");
    assert_nothing_left(&agent, tmp.path());

    // Block volumes: the check writes through the device file at the target path.
    let r = bench_json(&[
        "lifecycle", "--endpoint", &ep, "--count", "2", "--concurrency", "2", "--size", "8Mi", "--block", "--staging-dir",
        stage, "--target-dir", pods,
    ]);
    let e = &r["endpoints"][0];
    assert_clean_calls(e, Some(2));
    assert_eq!(u(&e["lifecycles"]["completed"]), 2);
    assert_nothing_left(&agent, tmp.path());
}

#[test]
fn a_lifecycle_that_fails_is_cleaned_up_and_leaves_no_volume() {
    require_host();
    let tmp = short_tempdir();
    let _a = LoopDrive::new(tmp.path(), "a.img", GIB);
    let agent = Agent::start(tmp.path(), AgentOpts::default());
    let _unmount = Unmounter(tmp.path().to_path_buf());
    // Staging outside volumes.allowed_roots: NodeStageVolume is refused, after the
    // volume was created and controller-published.
    let outside = tmp.path().join("outside");
    let pods = tmp.path().join("kubelet/pods");
    let r = bench_json(&[
        "lifecycle", "--endpoint", &agent.csi_socket.display().to_string(), "--count", "3", "--concurrency", "2", "--size",
        "16Mi", "--staging-dir", outside.to_str().unwrap(), "--target-dir", pods.to_str().unwrap(),
    ]);
    let e = &r["endpoints"][0];
    let l = &e["lifecycles"];
    assert_eq!((u(&l["started"]), u(&l["completed"]), u(&l["failed"])), (3, 0, 3), "{l}");
    assert_eq!(u(&l["cleaned_up"]), 3, "every failed lifecycle's volume was deleted: {l}");
    assert_eq!(l["left_behind"], serde_json::json!([]));
    let stage = e["calls"].as_array().unwrap().iter().find(|c| c["name"] == "NodeStageVolume").expect("a NodeStageVolume entry");
    assert_eq!(stage["errors_by_code"], serde_json::json!({ "INVALID_ARGUMENT": 3 }), "{stage}");
    assert_eq!(u(&e["errors"]), 3);
    let create = &e["calls"][0];
    assert_eq!((u(&create["ok"]), u(&create["errors"])), (3, 0));
    let publish = e["calls"].as_array().unwrap().iter().find(|c| c["name"] == "NodePublishVolume").unwrap();
    assert_eq!(u(&publish["calls"]), 0, "no step after the failed one is counted");
    assert_nothing_left(&agent, tmp.path());
    let staged_dirs: Vec<_> = std::fs::read_dir(&outside).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    assert!(staged_dirs.is_empty(), "the bench removed the staging directories it made: {staged_dirs:?}");
}
