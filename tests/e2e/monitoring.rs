//! drivelet watched by a real Prometheus (Debian's `prometheus`, a host process beside
//! the kit) with the alerts of `deploy/monitoring/prometheusrule.yaml` loaded and every
//! agent (the DaemonSet's on the real node, the fake nodes' host processes) and the real
//! node's kubelet scraped every second.
//!
//! - [`journey_watch`], right after the deploy journey: Prometheus starts, every target
//!   is up, each node's drives show in the per-drive series with the sizes drivelet's
//!   `ctl drives` gives, and no alert is pending or firing while all is well.
//! - The journeys in between provoke what the alerts are for: a drive vanishing with a
//!   volume on it, a drive failing, an evacuation.
//! - [`journey_fill`], while the real node still has room (before the drive-failing
//!   journey takes its drives): an NVMe health report is given to a drive until its NVMe
//!   series show, and a volume is filled up (its pod writes until the filesystem is full):
//!   its reason `filesystem-full` and its `DriveletVolumeAbnormal` alert must show.
//! - [`journey_judge`], before the clean-up: over the whole run, every query of every dashboard panel is evaluated (a range query) and
//!   each panel must have returned series; the alerts raised must be those the journeys
//!   provoked (a missing drive, a failing drive, the full volume's) and no other, apart
//!   from those whose cause the suite makes on purpose without controlling its length
//!   (an agent restarted or its node stopped: down or not ready; a small node filled by
//!   the placement journeys: low on space).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::{
    apply, choose_smart, claim, ctl_drives, ensure, kubectl, pod, volume_id_of, wait_every, wait_for, wait_pod_running, Check, Ctx, E2E_DIR, NS,
};

/// Where Prometheus listens (loopback only, like the kit).
const LISTEN: &str = "127.0.0.1:19090";
/// The agents' /metrics: the DaemonSet's (host network, port 9808) and the fake nodes'
/// host processes (scripts/e2e-node.sh gives node-N port 9810+N).
const AGENTS: [&str; 3] = ["127.0.0.1:9808", "127.0.0.1:9812", "127.0.0.1:9813"];

/// The running Prometheus and when it started (the range the judge looks at).
struct Running {
    child: Child,
    started_unix: f64,
}

static PROMETHEUS: Mutex<Option<Running>> = Mutex::new(None);
/// The volume [`journey_fill`] filled: the only one `DriveletVolumeAbnormal` may name.
static FILLED: Mutex<Option<String>> = Mutex::new(None);

fn now_unix() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or_default()
}

fn dir() -> PathBuf {
    Path::new(E2E_DIR).join("prometheus")
}

/// The PrometheusRule's `spec`, as the plain rule file Prometheus loads.
fn rule_file(root: &Path) -> Result<String, String> {
    let path = root.join("deploy/monitoring/prometheusrule.yaml");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let rule: serde_norway::Value = serde_norway::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_norway::to_string(&rule["spec"]).map_err(|e| e.to_string())
}

fn config(kit_dir: &Path, node: &str) -> String {
    let pki = kit_dir.join("pki");
    let targets = AGENTS.iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>().join(", ");
    format!(
        "# Written by tests/e2e/monitoring.rs.
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [rules.yaml]
scrape_configs:
  - job_name: drivelet
    static_configs:
      - targets: [{targets}]
  # The real node's kubelet /metrics (kubelet_volume_stats_*, from drivelet's
  # NodeGetVolumeStats), with the kit's admin client certificate. (The API server's node
  # proxy refuses a node whose address is loopback, as the kit's is.)
  - job_name: kubelet
    scheme: https
    tls_config:
      ca_file: {ca}
      cert_file: {crt}
      key_file: {key}
    static_configs:
      - targets: [\"127.0.0.1:10250\"]
        labels:
          node: {node}
",
        ca = pki.join("ca.crt").display(),
        crt = pki.join("admin.crt").display(),
        key = pki.join("admin.key").display(),
    )
}

/// GET `path` of the Prometheus HTTP API with `params`; its `data`.
fn api(path: &str, params: &[(&str, &str)]) -> Result<Value, String> {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "10", "-G", &format!("http://{LISTEN}{path}")]);
    for (k, v) in params {
        cmd.args(["--data-urlencode", &format!("{k}={v}")]);
    }
    let out = cmd.output().map_err(|e| format!("curl cannot run: {e}"))?;
    if !out.status.success() {
        return Err(format!("Prometheus {path}: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("Prometheus {path}: not JSON ({e})"))?;
    if v["status"] != "success" {
        return Err(format!("Prometheus {path} {params:?}: {} {}", v["errorType"], v["error"]));
    }
    Ok(v["data"].clone())
}

/// An instant query's series.
fn query(expr: &str) -> Result<Vec<Value>, String> {
    Ok(api("/api/v1/query", &[("query", expr)])?["result"].as_array().cloned().unwrap_or_default())
}

/// A range query's series from `start` to now.
fn query_range(expr: &str, start: f64) -> Result<Vec<Value>, String> {
    let (s, e) = (format!("{start:.3}"), format!("{:.3}", now_unix()));
    Ok(api("/api/v1/query_range", &[("query", expr), ("start", &s), ("end", &e), ("step", "2")])?["result"].as_array().cloned().unwrap_or_default())
}

fn label(series: &Value, name: &str) -> String {
    series["metric"][name].as_str().unwrap_or_default().to_string()
}

fn value(series: &Value) -> f64 {
    series["value"][1].as_str().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}

/// Stops the Prometheus this suite started (scripts/e2e.sh also stops one left behind).
pub(crate) fn stop() {
    if let Some(mut r) = PROMETHEUS.lock().unwrap_or_else(|p| p.into_inner()).take() {
        let _ = r.child.kill();
        let _ = r.child.wait();
    }
}

fn started_unix() -> Result<f64, String> {
    PROMETHEUS.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|r| r.started_unix).ok_or_else(|| "Prometheus is not running: the monitoring journey after deploy starts it".into())
}

pub(crate) fn journey_watch(ctx: &mut Ctx) -> Check {
    let found = Command::new("prometheus").arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
    ensure(found, || "prometheus is not installed: scripts/setup-host.sh installs Debian's prometheus package".into())?;
    stop();
    let d = dir();
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
    std::fs::write(d.join("rules.yaml"), rule_file(&ctx.root)?).map_err(|e| e.to_string())?;
    std::fs::write(d.join("prometheus.yml"), config(&ctx.kit_dir, &ctx.node)).map_err(|e| e.to_string())?;
    let check = Command::new("promtool").args(["check", "config", "prometheus.yml"]).current_dir(&d).output().map_err(|e| format!("promtool: {e}"))?;
    ensure(check.status.success(), || format!("promtool check config:\n{}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr)))?;
    let log = std::fs::File::create(d.join("prometheus.log")).map_err(|e| e.to_string())?;
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", d.join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", d.join("data").display()))
        .arg(format!("--web.listen-address={LISTEN}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("prometheus cannot start: {e}"))?;
    let started_unix = now_unix();
    *PROMETHEUS.lock().unwrap_or_else(|p| p.into_inner()) = Some(Running { child, started_unix });
    let t = Instant::now();

    // Every target up: three agents and kubelet.
    wait_every("every scrape target up (three agents, kubelet)", Duration::from_secs(60), Duration::from_millis(500), || {
        let targets = api("/api/v1/targets", &[("state", "active")])?;
        let active = targets["activeTargets"].as_array().cloned().unwrap_or_default();
        let down: Vec<String> = active
            .iter()
            .filter(|t| t["health"] != "up")
            .map(|t| format!("{} ({}: {})", t["scrapeUrl"], t["health"], t["lastError"]))
            .collect();
        if active.len() == AGENTS.len() + 1 && down.is_empty() {
            Ok(Some(()))
        } else {
            Err(format!("{} active, not up: {}", active.len(), down.join("; ")))
        }
    })?;
    ctx.measured.insert("Prometheus started -> every target up".into(), format!("{:.1}s", t.elapsed().as_secs_f64()));

    // Each node's drives, with the sizes drivelet itself reports.
    let nodes: BTreeSet<String> = query("count by (node) (drivelet_drive_info)")?.iter().map(|s| label(s, "node")).collect();
    for n in [ctx.node.as_str(), "node-2", "node-3"] {
        ensure(nodes.contains(n), || format!("no per-drive series of {n}: nodes seen {nodes:?}"))?;
    }
    let sizes: BTreeMap<String, f64> = query(&format!("drivelet_drive_size_bytes{{node=\"{}\"}}", ctx.node))?.iter().map(|s| (label(s, "drive"), value(s))).collect();
    for d in ctl_drives()? {
        let id = d["id"].as_str().unwrap_or_default();
        let want = d["size_bytes"].as_f64().unwrap_or_default();
        ensure(sizes.get(id) == Some(&want), || format!("drive {id}: drivelet_drive_size_bytes {:?}, ctl drives says {want}", sizes.get(id)))?;
    }
    let managed = query(&format!("drivelet_drive_class{{node=\"{}\",class=\"managed\"}} == 1", ctx.node))?.len();
    ensure(managed == 3, || format!("{managed} managed drives on {} in the metrics; the suite made 3", ctx.node))?;

    // All is well: the rules are evaluated and nothing is pending or firing.
    wait_every("the rules evaluated", Duration::from_secs(30), Duration::from_millis(500), || {
        let groups = api("/api/v1/rules", &[])?;
        let evaluated = groups["groups"].as_array().is_some_and(|g| !g.is_empty() && g.iter().all(|g| g["lastEvaluation"].as_str().is_some_and(|t| !t.starts_with("0001"))));
        Ok(evaluated.then_some(()))
    })?;
    std::thread::sleep(Duration::from_secs(3));
    let alerts = query("ALERTS")?;
    ensure(alerts.is_empty(), || format!("alerts while all is well: {}", alerts.iter().map(|a| a["metric"].to_string()).collect::<Vec<_>>().join("; ")))
}

/// While Prometheus watches the run, waits until a range query over the run (as the
/// judgement's) sees `expr` at one of its steps: what a journey provokes for a few
/// seconds only (a drive missing until its claim is deleted) can otherwise fall between
/// the steps. Without a running Prometheus (a subset of the suite that does not watch)
/// nothing judges the run, and there is nothing to wait for.
pub(crate) fn wait_seen_over_run(what: &str, expr: &str) -> Check {
    let Ok(start) = started_unix() else { return Ok(()) };
    wait_every(what, Duration::from_secs(60), Duration::from_millis(500), || Ok((!query_range(expr, start)?.is_empty()).then_some(())))
}

/// Alerts the suite provokes without controlling how long: allowed, not required.
const TOLERATED: [&str; 3] = ["DriveletAgentDown", "DriveletAgentNotReady", "DriveletNodeLocalSpaceLow"];

pub(crate) fn journey_fill(ctx: &mut Ctx) -> Check {
    let start = started_unix()?;

    // An NVMe health report for a healthy drive of the real node, so the NVMe series show.
    let drives = ctl_drives()?;
    let nvme = drives
        .iter()
        .find(|d| d["class"] == "managed" && d["health"]["health"] != "bad")
        .ok_or("no managed drive that is not failing")?;
    let (nvme_id, nvme_dev) = (nvme["id"].as_str().unwrap_or_default().to_string(), nvme["path"].as_str().unwrap_or_default().to_string());
    choose_smart(&nvme_dev, "nvme-healthy.json")?;
    let nvme_name = Path::new(&nvme_dev).file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
    // Kept until a range query over the run sees the series at one of its steps (as the
    // judgement's queries will), not only an instant query: a series shown for less than
    // a step can fall between the steps.
    let seen = wait_every("NVMe endurance and media errors of the drive given an NVMe report", Duration::from_secs(30), Duration::from_millis(500), || {
        let q = format!("drivelet_drive_endurance_used_ratio{{drive=\"{nvme_id}\"}} and on (drive) drivelet_drive_media_errors_total");
        Ok((!query_range(&q, start)?.is_empty()).then_some(()))
    });
    // Back to what the suite gives every drive (no SMART), whatever happened.
    let _ = std::fs::remove_file(Path::new(E2E_DIR).join("smart").join(&nvme_name));
    seen?;

    // A CSI call refused, so the CSI errors panel has a series of its own making: the
    // kubelet's calls through the socket seldom fail now that provisioning is in process.
    let unknown = "00000000-0000-5000-8000-000000000000";
    let refused = super::drivelet(&["csi", "--endpoint", super::CSI_SOCKET, "get", unknown]);
    ensure(refused.is_err(), || format!("ControllerGetVolume of the unknown volume {unknown} answered: {refused:?}"))?;
    wait_seen_over_run("the refused ControllerGetVolume in drivelet_csi_requests_total", "drivelet_csi_requests_total{code!=\"OK\"}")?;

    // A volume filled up: its condition abnormal (filesystem-full), the alert raised.
    apply(&(claim("fill", "drivelet-e2e-ext4", 32, "Filesystem", "ReadWriteOnce")
        + &pod("fill", "fill", false, "", "dd if=/dev/zero of=/data/fill bs=1M 2>/dev/null; sync")))?;
    wait_pod_running("fill", Duration::from_secs(120))?;
    let id = volume_id_of("fill")?;
    let t = Instant::now();
    wait_every("the filled volume's reason filesystem-full in the metrics and its alert raised", Duration::from_secs(60), Duration::from_millis(500), || {
        let reason = query(&format!("drivelet_volume_condition_reason{{volume=\"{id}\",reason=\"filesystem-full\"}}"))?;
        let alert = query(&format!("ALERTS{{alertname=\"DriveletVolumeAbnormal\",volume=\"{id}\",reason=\"filesystem-full\",claim=\"fill\",claim_namespace=\"{NS}\"}}"))?;
        Ok((!reason.is_empty() && !alert.is_empty()).then_some(()))
    })?;
    ctx.measured.insert("volume filled -> DriveletVolumeAbnormal pending in Prometheus".into(), format!("{:.1}s", t.elapsed().as_secs_f64()));
    kubectl(&["delete", "pod", "-n", NS, "fill", "--wait=true", "--timeout=60s"])?;
    kubectl(&["delete", "pvc", "-n", NS, "fill", "--wait=true", "--timeout=60s"])?;
    wait_for("the filled volume gone from the metrics", Duration::from_secs(60), || {
        Ok(query(&format!("drivelet_volume_info{{volume=\"{id}\"}}"))?.is_empty().then_some(()))
    })?;
    *FILLED.lock().unwrap_or_else(|p| p.into_inner()) = Some(id);
    Ok(())
}

pub(crate) fn journey_judge(ctx: &mut Ctx) -> Check {
    let start = started_unix()?;
    let id = FILLED.lock().unwrap_or_else(|p| p.into_inner()).clone().ok_or("no volume was filled: the journey that fills one runs before this")?;

    // Every panel of the dashboard returned series over the run.
    let dashboard = ctx.root.join("deploy/monitoring/drivelet-dashboard.json");
    let d: Value = serde_json::from_str(&std::fs::read_to_string(&dashboard).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    let mut empty_panels = Vec::new();
    let mut empty_queries = Vec::new();
    let mut panels = 0;
    for p in d["panels"].as_array().into_iter().flatten().filter(|p| p["type"] != "row") {
        panels += 1;
        let title = p["title"].as_str().unwrap_or_default();
        let mut any = false;
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_default().replace("$node", ".*").replace("$__rate_interval", "1m");
            if query_range(&expr, start).map_err(|e| format!("panel {title:?}: {e}"))?.is_empty() {
                empty_queries.push(format!("{title}: {expr}"));
            } else {
                any = true;
            }
        }
        if !any {
            empty_panels.push(title.to_string());
        }
    }
    ctx.measured.insert("dashboard panels with series over the run".into(), format!("{}/{panels}", panels - empty_panels.len()));
    if !empty_queries.is_empty() {
        println!("e2e: dashboard queries without series over the run (their panel had others):\n  {}", empty_queries.join("\n  "));
    }
    ensure(empty_panels.is_empty(), || format!("dashboard panels without any series over the run: {}", empty_panels.join(", ")))?;

    // The alerts raised over the run: the provoked ones, and no other.
    let raised: BTreeMap<String, Vec<String>> = query_range("ALERTS", start)?.iter().fold(BTreeMap::new(), |mut m, s| {
        m.entry(label(s, "alertname")).or_insert_with(Vec::new).push(s["metric"].to_string());
        m
    });
    println!("e2e: alerts raised over the run: {:?}", raised.keys().collect::<Vec<_>>());
    for want in ["DriveletDriveMissing", "DriveletDriveFailing", "DriveletVolumeAbnormal"] {
        ensure(raised.contains_key(want), || format!("{want} was never raised, though the journeys provoked it; raised: {:?}", raised.keys().collect::<Vec<_>>()))?;
    }
    let unexpected: Vec<String> = raised
        .iter()
        .filter(|(name, _)| !["DriveletDriveMissing", "DriveletDriveFailing", "DriveletVolumeAbnormal"].contains(&name.as_str()) && !TOLERATED.contains(&name.as_str()))
        .flat_map(|(_, s)| s.clone())
        .collect();
    ensure(unexpected.is_empty(), || format!("alerts no journey provoked: {}", unexpected.join("; ")))?;
    // The volume alert was for the filled volume only.
    let others: Vec<&String> = raised.get("DriveletVolumeAbnormal").into_iter().flatten().filter(|s| !s.contains(&id)).collect();
    ensure(others.is_empty(), || format!("DriveletVolumeAbnormal raised for other volumes: {others:?}"))?;
    stop();
    Ok(())
}
