//! What `drivelet bench` reports, and its rendering as a table or JSON.
//!
//! Rules:
//! - latencies are of successful calls only, in microseconds; a failed call counts in
//!   `errors` and `errors_by_code` (gRPC code names, or `IO` and `DATA_MISMATCH` for
//!   the bench's own file check) and nowhere else;
//! - throughput is successful calls (or completed lifecycles) per second of the time
//!   the measurement ran;
//! - the table shows every endpoint's rows one under another with the endpoint's label
//!   in the first column, so drivers measured in one run read side by side.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::histogram::Histogram;

/// Latency summary of one kind of call, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Latency {
    /// Smallest.
    pub min_us: f64,
    /// Mean.
    pub mean_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 95th percentile.
    pub p95_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Largest.
    pub max_us: f64,
}

impl Latency {
    /// The summary of a histogram of nanoseconds (all zero when it is empty).
    pub fn of(h: &Histogram) -> Latency {
        let us = |ns: Option<u64>| ns.map_or(0.0, |v| round1(v as f64 / 1000.0));
        Latency {
            min_us: us(h.min()),
            mean_us: h.mean().map_or(0.0, |v| round1(v / 1000.0)),
            p50_us: us(h.percentile(0.50)),
            p95_us: us(h.percentile(0.95)),
            p99_us: us(h.percentile(0.99)),
            max_us: us(h.max()),
        }
    }
}

fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

/// Figures for one kind of call (an RPC, or the bench's own file check).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CallStats {
    /// RPC name, e.g. `Probe`, or `write+read`.
    pub name: String,
    /// Calls made (successful + failed).
    pub calls: u64,
    /// Successful calls.
    pub ok: u64,
    /// Failed calls.
    pub errors: u64,
    /// Successful calls per second.
    pub per_s: f64,
    /// Latency of the successful calls.
    pub latency: Latency,
    /// Failed calls by code.
    pub errors_by_code: BTreeMap<String, u64>,
}

/// An RPC the bench did not call, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Skipped {
    /// RPC name.
    pub name: String,
    /// Why (e.g. the capability is not advertised).
    pub reason: String,
}

/// Whole lifecycles.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LifecycleStats {
    /// Lifecycles started.
    pub started: u64,
    /// Lifecycles that went through every step.
    pub completed: u64,
    /// Lifecycles that failed at some step (then cleaned up).
    pub failed: u64,
    /// Completed lifecycles per second.
    pub per_s: f64,
    /// End-to-end latency of the completed lifecycles.
    pub latency: Latency,
    /// Volumes of failed lifecycles that the clean-up deleted.
    pub cleaned_up: u64,
    /// Volume ids (or names, when the id never came back) still there after clean-up.
    pub left_behind: Vec<String>,
}

/// Everything measured against one endpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EndpointReport {
    /// The label given with `--endpoint LABEL=PATH` (else the path).
    pub label: String,
    /// The socket path.
    pub endpoint: String,
    /// Driver name from GetPluginInfo.
    pub driver: String,
    /// Seconds the measurement ran against this endpoint.
    pub elapsed_s: f64,
    /// One entry per kind of call, in the order they were made.
    pub calls: Vec<CallStats>,
    /// RPCs not called.
    pub skipped: Vec<Skipped>,
    /// Lifecycle mode only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifecycles: Option<LifecycleStats>,
    /// Failed calls, all kinds together.
    pub errors: u64,
}

/// A whole run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Report {
    /// `rpc` or `lifecycle`.
    pub mode: String,
    /// Concurrent callers.
    pub concurrency: usize,
    /// `per-caller` or `shared`.
    pub connections: String,
    /// Rpc mode: seconds per RPC; lifecycle mode: the time limit (when no count).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    /// Lifecycle mode: the number of lifecycles asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// One entry per endpoint, in the order given.
    pub endpoints: Vec<EndpointReport>,
}

impl Report {
    /// Failed calls over all endpoints.
    pub fn errors(&self) -> u64 {
        self.endpoints.iter().map(|e| e.errors).sum()
    }

    /// Volumes left behind over all endpoints, as `label: id`.
    pub fn left_behind(&self) -> Vec<String> {
        self.endpoints
            .iter()
            .flat_map(|e| e.lifecycles.iter().flat_map(|l| l.left_behind.iter().map(|v| format!("{}: {v}", e.label))))
            .collect()
    }
}

/// A latency in microseconds, in the unit that reads best: `85.3µs`, `12.40ms`, `1.203s`.
pub fn fmt_us(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.1}µs")
    } else if us < 1_000_000.0 {
        format!("{:.2}ms", us / 1000.0)
    } else {
        format!("{:.3}s", us / 1_000_000.0)
    }
}

/// The errors of a row: `0`, or `3 (ABORTED 2, UNAVAILABLE 1)`.
pub fn fmt_errors(c: &CallStats) -> String {
    if c.errors == 0 {
        return "0".into();
    }
    let by: Vec<String> = c.errors_by_code.iter().map(|(k, v)| format!("{k} {v}")).collect();
    format!("{} ({})", c.errors, by.join(", "))
}

/// Left-aligns the first two columns and right-aligns the rest.
fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let width: Vec<usize> =
        (0..cols).map(|i| rows.iter().filter_map(|r| r.get(i)).map(|c| c.chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            let pad = width[i].saturating_sub(c.chars().count());
            if i > 0 {
                line.push_str("  ");
            }
            // The last column (errors) reads best left-aligned too.
            if i < 2 || i + 1 == cols {
                line.push_str(c);
                line.push_str(&" ".repeat(pad));
            } else {
                line.push_str(&" ".repeat(pad));
                line.push_str(c);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn row(label: &str, name: &str, calls: u64, per_s: f64, l: &Latency, errors: String) -> Vec<String> {
    vec![
        label.to_string(),
        name.to_string(),
        calls.to_string(),
        format!("{per_s:.1}"),
        fmt_us(l.p50_us),
        fmt_us(l.p95_us),
        fmt_us(l.p99_us),
        fmt_us(l.max_us),
        errors,
    ]
}

/// The human-readable report.
pub fn render_table(r: &Report) -> String {
    let mut out = String::new();
    let conn = if r.connections == "shared" { "one shared connection" } else { "one connection each" };
    let _ = write!(out, "drivelet bench {}: {} caller{} ({conn})", r.mode, r.concurrency, if r.concurrency == 1 { "" } else { "s" });
    match (r.mode.as_str(), r.count, r.duration_s) {
        ("rpc", _, Some(d)) => {
            let _ = write!(out, ", {d}s per RPC");
        }
        (_, Some(n), _) => {
            let _ = write!(out, ", {n} lifecycles");
        }
        (_, None, Some(d)) => {
            let _ = write!(out, ", for {d}s");
        }
        _ => {}
    }
    out.push_str("\n\n");
    let mut rows = vec![["ENDPOINT", "CALL", "CALLS", "OK/S", "P50", "P95", "P99", "MAX", "ERRORS"].map(String::from).to_vec()];
    for e in &r.endpoints {
        for c in &e.calls {
            rows.push(row(&e.label, &c.name, c.calls, c.per_s, &c.latency, fmt_errors(c)));
        }
        if let Some(l) = &e.lifecycles {
            let errors = if l.failed == 0 { "0".to_string() } else { format!("{} failed", l.failed) };
            rows.push(row(&e.label, "lifecycle (end to end)", l.started, l.per_s, &l.latency, errors));
        }
    }
    out.push_str(&table(&rows));
    for e in &r.endpoints {
        let driver = if e.driver.is_empty() { String::new() } else { format!(" ({})", e.driver) };
        let _ = write!(out, "\n{}{driver}: {} over {:.1}s, {} failed call{}", e.label, e.endpoint, e.elapsed_s, e.errors, if e.errors == 1 { "" } else { "s" });
        if let Some(l) = &e.lifecycles {
            let _ = write!(out, "; lifecycles {} completed, {} failed, {:.2}/s", l.completed, l.failed, l.per_s);
            if l.failed > 0 {
                let _ = write!(out, ", {} volume{} cleaned up", l.cleaned_up, if l.cleaned_up == 1 { "" } else { "s" });
            }
            if !l.left_behind.is_empty() {
                let _ = write!(out, "; LEFT BEHIND: {}", l.left_behind.join(", "));
            }
        }
        out.push('\n');
        for s in &e.skipped {
            let _ = writeln!(out, "  skipped {}: {}", s.name, s.reason);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(name: &str, values_us: &[u64], errors: &[(&str, u64)]) -> CallStats {
        let mut h = Histogram::new();
        for v in values_us {
            h.record_ns(v * 1000);
        }
        let errors_by_code: BTreeMap<String, u64> = errors.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        let errors: u64 = errors_by_code.values().sum();
        CallStats {
            name: name.into(),
            calls: h.count() + errors,
            ok: h.count(),
            errors,
            per_s: h.count() as f64,
            latency: Latency::of(&h),
            errors_by_code,
        }
    }

    fn report() -> Report {
        Report {
            mode: "rpc".into(),
            concurrency: 4,
            connections: "per-caller".into(),
            duration_s: Some(1.0),
            count: None,
            endpoints: vec![
                EndpointReport {
                    label: "drivelet".into(),
                    endpoint: "/run/drivelet/csi.sock".into(),
                    driver: "drivelet.io".into(),
                    elapsed_s: 2.0,
                    calls: vec![stats("Probe", &[40, 50, 60], &[]), stats("GetCapacity", &[1500], &[("ABORTED", 2), ("UNAVAILABLE", 1)])],
                    skipped: vec![Skipped { name: "ListVolumes".into(), reason: "LIST_VOLUMES is not advertised".into() }],
                    lifecycles: None,
                    errors: 3,
                },
                EndpointReport { label: "other".into(), endpoint: "/o.sock".into(), calls: vec![stats("Probe", &[2_500_000], &[])], ..Default::default() },
            ],
        }
    }

    #[test]
    fn latencies_print_in_the_unit_that_reads_best() {
        assert_eq!(fmt_us(85.25), "85.2µs");
        assert_eq!(fmt_us(12_400.0), "12.40ms");
        assert_eq!(fmt_us(1_203_000.0), "1.203s");
    }

    #[test]
    fn the_latency_summary_is_in_microseconds_and_ordered() {
        let s = stats("Probe", &[10, 20, 30, 40, 1000], &[]);
        let l = &s.latency;
        assert_eq!((l.min_us, l.max_us), (10.0, 1000.0), "min and max are exact");
        assert!(l.p50_us >= 30.0 && l.p50_us <= 30.0 * (1.0 + 1.0 / 64.0), "within the bucket precision: {}", l.p50_us);
        assert!(l.p50_us <= l.p95_us && l.p95_us <= l.p99_us && l.p99_us <= l.max_us);
        assert_eq!(l.mean_us, 220.0);
        assert_eq!(Latency::of(&Histogram::new()), Latency::default(), "no calls: zeros");
    }

    #[test]
    fn the_table_has_one_aligned_row_per_call_and_endpoint_with_errors_by_code() {
        let t = render_table(&report());
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "drivelet bench rpc: 4 callers (one connection each), 1s per RPC");
        let header = lines[2];
        assert!(header.starts_with("ENDPOINT  CALL"), "{header}");
        let probe = lines.iter().find(|l| l.starts_with("drivelet  Probe")).expect("a Probe row");
        // p50: 50 µs lies in the bucket [49.664, 50.175] µs, reported by its upper bound.
        assert!(probe.contains("50.2µs") && probe.contains("60.0µs"), "{probe}");
        let cap = lines.iter().find(|l| l.contains("GetCapacity")).expect("a GetCapacity row");
        assert!(cap.ends_with("3 (ABORTED 2, UNAVAILABLE 1)"), "{cap}");
        let other = lines.iter().find(|l| l.starts_with("other")).expect("the second endpoint's row");
        assert!(other.contains("2.500s"), "{other}");
        // Columns line up: the P50 column ends at the same place in every row.
        let p50_end = header.find("P50").unwrap() + 3;
        for l in [probe, cap, other] {
            assert_ne!(l.chars().nth(p50_end - 1), Some(' '), "{l}");
            assert_eq!(l.chars().nth(p50_end), Some(' '), "{l}");
        }
        assert!(t.contains("skipped ListVolumes: LIST_VOLUMES is not advertised"));
        assert!(t.contains("drivelet (drivelet.io): /run/drivelet/csi.sock over 2.0s, 3 failed calls"));
    }

    #[test]
    fn lifecycle_reports_show_the_end_to_end_row_and_what_was_left_behind() {
        let mut r = report();
        r.mode = "lifecycle".into();
        r.duration_s = None;
        r.count = Some(4);
        r.endpoints[0].lifecycles = Some(LifecycleStats {
            started: 4,
            completed: 3,
            failed: 1,
            per_s: 1.5,
            latency: Latency { p50_us: 900_000.0, p95_us: 1_000_000.0, p99_us: 1_000_000.0, max_us: 1_000_000.0, ..Default::default() },
            cleaned_up: 0,
            left_behind: vec!["vol-9".into()],
        });
        let t = render_table(&r);
        assert!(t.starts_with("drivelet bench lifecycle: 4 callers (one connection each), 4 lifecycles\n"), "{t}");
        let e2e = t.lines().find(|l| l.contains("lifecycle (end to end)")).expect("end-to-end row");
        assert!(e2e.contains("900.00ms") && e2e.ends_with("1 failed"), "{e2e}");
        assert!(t.contains("lifecycles 3 completed, 1 failed, 1.50/s, 0 volumes cleaned up; LEFT BEHIND: vol-9"), "{t}");
        assert_eq!(r.left_behind(), vec!["drivelet: vol-9".to_string()]);
        assert_eq!(r.errors(), 3);
    }

    #[test]
    fn the_json_report_names_every_figure() {
        let v = serde_json::to_value(report()).unwrap();
        let probe = &v["endpoints"][0]["calls"][0];
        assert_eq!(probe["name"], "Probe");
        assert_eq!(probe["calls"], 3);
        assert_eq!(probe["latency"]["p50_us"], 50.2);
        assert_eq!(probe["latency"]["max_us"], 60.0);
        assert_eq!(v["endpoints"][0]["calls"][1]["errors_by_code"]["ABORTED"], 2);
        assert!(v.get("count").is_none(), "absent figures are left out");
        assert!(v["endpoints"][0].get("lifecycles").is_none());
    }
}
