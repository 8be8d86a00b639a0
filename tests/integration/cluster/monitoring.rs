//! `deploy/monitoring/` checked offline: the alerts with Prometheus' own `promtool`
//! (`check rules`, and `test rules` with `deploy/monitoring/tests/rules-test.yaml`, each
//! alert firing when it should and not otherwise), the dashboard's shape, and every
//! series the dashboard and the alerts query being one docs/operations.md documents
//! (so a renamed metric cannot leave a panel empty unnoticed). The live proof, on a
//! real Prometheus scraping the agents of the cluster kit, is tests/e2e/monitoring.rs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value as Json;
use serde_norway::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/monitoring")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The PrometheusRule's `spec`: a plain Prometheus rule file.
fn rule_file() -> Value {
    let rule: Value = serde_norway::from_str(&read(&dir().join("prometheusrule.yaml"))).expect("prometheusrule.yaml parses");
    assert_eq!(rule["kind"].as_str(), Some("PrometheusRule"));
    assert_eq!(rule["apiVersion"].as_str(), Some("monitoring.coreos.com/v1"));
    rule["spec"].clone()
}

fn alerts(rules: &Value) -> Vec<Value> {
    let groups = rules["groups"].as_sequence().expect("spec.groups");
    groups.iter().flat_map(|g| g["rules"].as_sequence().cloned().unwrap_or_default()).collect()
}

fn dashboard() -> Json {
    serde_json::from_str(&read(&dir().join("drivelet-dashboard.json"))).expect("the dashboard is JSON")
}

/// Every PromQL expression of the dashboard's panels, with the panel's title.
fn panel_queries(d: &Json) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push((p["title"].as_str().unwrap_or_default().to_string(), t["expr"].as_str().unwrap_or_default().to_string()));
        }
    }
    out
}

fn promtool() -> &'static str {
    let found = Command::new("promtool").arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
    assert!(found, "promtool is not installed: scripts/setup-host.sh installs Debian's prometheus package, which has it");
    "promtool"
}

#[test]
fn the_alerts_pass_promtool_check_and_their_unit_tests() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let rules = tmp.path().join("rules.yaml");
    std::fs::write(&rules, serde_norway::to_string(&rule_file()).expect("encode")).expect("write rules");
    std::fs::copy(dir().join("tests/rules-test.yaml"), tmp.path().join("rules-test.yaml")).expect("copy the tests");
    let tool = promtool();
    for args in [vec!["check", "rules", "rules.yaml"], vec!["test", "rules", "rules-test.yaml"]] {
        let out = Command::new(tool).args(&args).current_dir(tmp.path()).output().expect("run promtool");
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn every_alert_has_words_a_runbook_a_severity_and_a_test_that_fires_it() {
    let tests = read(&dir().join("tests/rules-test.yaml"));
    let tests: Value = serde_norway::from_str(&tests).expect("rules-test.yaml parses");
    let mut fired = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for t in tests["tests"].as_sequence().expect("tests") {
        for a in t["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = a["alertname"].as_str().unwrap_or_default().to_string();
            if a["exp_alerts"].as_sequence().is_some_and(|e| !e.is_empty()) {
                fired.insert(name);
            } else {
                quiet.insert(name);
            }
        }
    }
    let listed = read(&dir().join("README.md"));
    for a in alerts(&rule_file()) {
        let name = a["alert"].as_str().expect("every rule is an alert").to_string();
        assert!(name.starts_with("Drivelet"), "{name}: alerts are named Drivelet*");
        for key in ["summary", "description", "runbook"] {
            let text = a["annotations"][key].as_str().unwrap_or_default();
            assert!(text.len() > 20, "{name} has no {key} worth reading: {text:?}");
        }
        let severity = a["labels"]["severity"].as_str().unwrap_or_default();
        assert!(["critical", "warning"].contains(&severity), "{name}: severity {severity:?}");
        assert!(fired.contains(&name), "{name}: no promtool test expects it to fire");
        assert!(quiet.contains(&name), "{name}: no promtool test expects it to stay quiet");
        assert!(listed.contains(&format!("`{name}`")), "{name} is not in deploy/monitoring/README.md's table");
    }
}

#[test]
fn the_dashboard_has_unique_panels_each_with_queries_on_the_chosen_data_source() {
    let d = dashboard();
    assert_eq!(d["uid"].as_str(), Some("drivelet"));
    let mut ids = BTreeSet::new();
    let mut titles = BTreeSet::new();
    for p in d["panels"].as_array().expect("panels") {
        assert!(ids.insert(p["id"].as_u64().expect("panel id")), "panel id {} twice", p["id"]);
        if p["type"] == "row" {
            continue;
        }
        let title = p["title"].as_str().expect("title").to_string();
        assert!(titles.insert(title.clone()), "panel {title:?} twice");
        assert_eq!(p["datasource"]["uid"].as_str(), Some("${datasource}"), "{title}: data source");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title} has no query");
        for t in targets {
            assert_eq!(t["datasource"]["uid"].as_str(), Some("${datasource}"), "{title}: a query's data source");
        }
    }
    assert!(titles.len() >= 20, "{} panels", titles.len());
    let vars: Vec<&str> = d["templating"]["list"].as_array().expect("variables").iter().filter_map(|v| v["name"].as_str()).collect();
    assert_eq!(vars, ["datasource", "node"]);
}

/// The `drivelet_*` names a PromQL text uses, with a histogram's `_bucket` taken back to
/// its family.
fn series_in(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("drivelet_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        let before_ok = start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        if before_ok {
            let name = &expr[start..end];
            out.insert(name.strip_suffix("_bucket").unwrap_or(name).to_string());
        }
        i = end.max(start + 1);
    }
    out
}

#[test]
fn the_dashboard_and_the_alerts_query_only_series_the_docs_list() {
    let docs = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations.md"));
    let mut used: Vec<(String, String)> = panel_queries(&dashboard());
    for a in alerts(&rule_file()) {
        used.push((a["alert"].as_str().unwrap_or_default().to_string(), a["expr"].as_str().unwrap_or_default().to_string()));
    }
    let mut missing = Vec::new();
    for (what, expr) in &used {
        for s in series_in(expr) {
            if !docs.contains(&format!("`{s}")) {
                missing.push(format!("{what}: {s}"));
            }
        }
    }
    assert!(missing.is_empty(), "queried but not in docs/operations.md's metrics table:\n{}", missing.join("\n"));
    assert_eq!(series_in("rate(drivelet_a_bucket[1m]) / xdrivelet_b + drivelet_c_total"), BTreeSet::from(["drivelet_a".into(), "drivelet_c_total".into()]));
}

#[test]
fn the_kustomization_holds_the_monitor_the_rules_and_the_dashboard() {
    let k: Value = serde_norway::from_str(&read(&dir().join("kustomization.yaml"))).expect("kustomization parses");
    let resources: Vec<&str> = k["resources"].as_sequence().expect("resources").iter().filter_map(Value::as_str).collect();
    assert_eq!(resources, ["podmonitor.yaml", "prometheusrule.yaml"]);
    let files: Vec<&str> = k["configMapGenerator"][0]["files"].as_sequence().expect("files").iter().filter_map(Value::as_str).collect();
    assert_eq!(files, ["drivelet-dashboard.json"]);
    assert_eq!(k["configMapGenerator"][0]["options"]["labels"]["grafana_dashboard"].as_str(), Some("1"));
    let pm: Value = serde_norway::from_str(&read(&dir().join("podmonitor.yaml"))).expect("podmonitor parses");
    assert_eq!(pm["spec"]["podMetricsEndpoints"][0]["port"].as_str(), Some("http"), "the DaemonSet's port is named http");
    assert_eq!(pm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"].as_str(), Some("drivelet"));
    // Without the operator: the pods say where their metrics are.
    let ds: Value = serde_norway::from_str(&read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/daemonset.yaml"))).expect("daemonset parses");
    let notes = &ds["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(notes["prometheus.io/scrape"].as_str(), Some("true"));
    assert_eq!(notes["prometheus.io/port"].as_str(), Some("9808"));
    assert_eq!(notes["prometheus.io/path"].as_str(), Some("/metrics"));
}

/// A dashboard query with Grafana's variables given values Prometheus accepts.
fn as_prometheus(expr: &str) -> String {
    expr.replace("$node", ".*").replace("$__rate_interval", "5m")
}

/// Runs `promtool test rules` on one `promql_expr_test` group; promtool's output.
fn promtool_expr_tests(input_series: &[(&str, &str)], tests: Vec<Json>) -> (bool, String) {
    let series: Vec<Json> = input_series.iter().map(|(s, v)| serde_json::json!({"series": s, "values": v})).collect();
    let file = serde_json::json!({
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}],
    });
    let tmp = tempfile::tempdir().expect("temp dir");
    std::fs::write(tmp.path().join("t.yaml"), serde_norway::to_string(&file).expect("encode")).expect("write the test");
    let out = Command::new(promtool()).args(["test", "rules", "t.yaml"]).current_dir(tmp.path()).output().expect("run promtool");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// Kubelet reports claim db/data-0 from node n1 (its series carry a `node` label) and
/// db/logs-0 without one. Two volumes remember db/data-0: n1's and an older one on n2 (the
/// claim was made again while n2 was away); a third on n1 itself (a volume a Retain PV
/// kept). db/logs-0 is remembered on two nodes too.
const CORNERS: &[(&str, &str)] = &[
    (r#"kubelet_volume_stats_used_bytes{namespace="db",persistentvolumeclaim="data-0",node="n1"}"#, "10x5"),
    (r#"kubelet_volume_stats_capacity_bytes{namespace="db",persistentvolumeclaim="data-0",node="n1"}"#, "100x5"),
    (r#"kubelet_volume_stats_used_bytes{namespace="db",persistentvolumeclaim="logs-0"}"#, "30x5"),
    (r#"kubelet_volume_stats_capacity_bytes{namespace="db",persistentvolumeclaim="logs-0"}"#, "100x5"),
    (r#"drivelet_volume_info{node="n1",volume="v1",drive="d1",pv="p1",claim_namespace="db",claim="data-0",access="mount",fs="ext4"}"#, "1x5"),
    (r#"drivelet_volume_info{node="n2",volume="v2",drive="d2",pv="p0",claim_namespace="db",claim="data-0",access="mount",fs="ext4"}"#, "1x5"),
    (r#"drivelet_volume_info{node="n1",volume="v3",drive="d3",pv="p8",claim_namespace="db",claim="data-0",access="mount",fs="xfs"}"#, "1x5"),
    (r#"drivelet_volume_info{node="n1",volume="v4",drive="d1",pv="p4",claim_namespace="db",claim="logs-0",access="block",fs=""}"#, "1x5"),
    (r#"drivelet_volume_info{node="n2",volume="v5",drive="d2",pv="p5",claim_namespace="db",claim="logs-0",access="block",fs=""}"#, "1x5"),
    (r#"drivelet_volume_condition_reason{node="n1",volume="v1",drive="d1",reason="filesystem-full"}"#, "1x5"),
    (r#"drivelet_volume_condition_reason{node="n2",volume="v2",drive="d2",reason="mount-lost"}"#, "1x5"),
    (r#"drivelet_volume_abnormal{node="n1",volume="v1",drive="d1"}"#, "1x5"),
    (r#"drivelet_drive_class{node="n1",drive="d1",serial="s1",model="m",media="ssd",class="managed"}"#, "1x5"),
    (r#"drivelet_drive_size_bytes{node="n1",drive="d1",serial="s1",model="m",media="ssd"}"#, "1000x5"),
    (r#"drivelet_drive_free_bytes{node="n1",drive="d1",serial="s1",model="m",media="ssd"}"#, "500x5"),
];

#[test]
fn every_dashboard_query_and_alert_evaluates_where_two_volumes_remember_one_claim() {
    // Regression: the claim-usage panel once matched a claim to every volume remembering
    // its name, and Prometheus refused the whole query ("many-to-many matching not
    // allowed") once a claim moved to another node. Every query and alert is evaluated
    // here on series with such corners; the samples are not compared (an empty
    // expectation), only that Prometheus evaluates them without an error.
    let mut exprs: Vec<(String, String)> = panel_queries(&dashboard());
    for a in alerts(&rule_file()) {
        exprs.push((a["alert"].as_str().unwrap_or_default().to_string(), a["expr"].as_str().unwrap_or_default().to_string()));
    }
    let tests = exprs.iter().map(|(_, e)| serde_json::json!({"expr": as_prometheus(e), "eval_time": "2m", "exp_samples": []})).collect();
    let (_, out) = promtool_expr_tests(CORNERS, tests);
    assert!(out.contains("Unit Testing"), "promtool did not run the tests:\n{out}");
    let errors: Vec<&str> = out.lines().filter(|l| l.contains(", err: ")).collect();
    assert!(errors.is_empty(), "queries Prometheus cannot evaluate:\n{}", errors.join("\n"));
}

#[test]
fn claim_usage_shows_the_volume_on_the_node_kubelet_reports_from() {
    let d = dashboard();
    let (_, expr) = panel_queries(&d).into_iter().find(|(t, _)| t == "Claim usage (from kubelet)").expect("the claim usage panel");
    // Without the Retain-kept third volume, the choice is exact: data-0 on n1 where kubelet
    // reports it (not n2's older volume); logs-0, with no node label on kubelet's series and
    // one volume, on that volume's node.
    let series: Vec<(&str, &str)> = CORNERS.iter().copied().filter(|(s, _)| !s.contains(r#"volume="v3""#) && !s.contains(r#"volume="v5""#)).collect();
    let test = serde_json::json!({
        "expr": as_prometheus(&expr),
        "eval_time": "2m",
        "exp_samples": [
            {"labels": r#"{namespace="db",persistentvolumeclaim="data-0",node="n1",drive="d1"}"#, "value": 0.1},
            {"labels": r#"{namespace="db",persistentvolumeclaim="logs-0",node="n1",drive="d1"}"#, "value": 0.3},
        ],
    });
    let (ok, out) = promtool_expr_tests(&series, vec![test]);
    assert!(ok, "the claim usage panel:\n{out}");
}
