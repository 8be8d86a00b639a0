//! Process-wide counters and their Prometheus text rendering.
//!
//! Rules:
//! - Counters that code paths bump as they run (CSI requests and their latency, SMART
//!   polls, drive scans, whether the CSI socket serves) live in one process-wide
//!   [`Metrics`] ([`metrics()`]); everything that is state (drives, volumes, the attach
//!   queue) is read from the actors when scraped ([`Gauges`]), so a scrape always shows
//!   the truth and nothing is counted twice.
//! - Rendering is a pure function of a snapshot (`render`), tested on its own.
//! - Label values are drivelet's own lowercase names (`managed`, `published`) and the
//!   gRPC code names (`OK`, `NOT_FOUND`); CSI method labels are the bare method name.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

/// Histogram bucket bounds of CSI request latency, in seconds.
pub(crate) const LATENCY_BUCKETS: [f64; 16] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0];

/// A latency histogram: counts per bucket (cumulative when rendered), sum and count.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Histogram {
    /// Observations at or below each bound of `LATENCY_BUCKETS` (not cumulative).
    pub buckets: [u64; LATENCY_BUCKETS.len()],
    /// Sum of all observations in seconds.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Histogram {
    /// Adds one observation.
    pub(crate) fn observe(&mut self, seconds: f64) {
        if let Some(i) = LATENCY_BUCKETS.iter().position(|b| seconds <= *b) {
            self.buckets[i] += 1;
        }
        self.sum += seconds;
        self.count += 1;
    }
}

/// Counters bumped as the process runs.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    /// Per CSI method: requests by code, and latency (one lock per request).
    rpcs: Mutex<BTreeMap<String, MethodStats>>,
    health_polls: AtomicU64,
    zeroed_bytes: AtomicU64,
    moves_done: AtomicU64,
    moves_failed: AtomicU64,
    moved_bytes: AtomicU64,
    health_poll_micros: AtomicU64,
    last_scan_unix: AtomicU64,
    csi_serving: AtomicBool,
}

#[derive(Debug, Default)]
struct MethodStats {
    codes: BTreeMap<&'static str, u64>,
    latency: Histogram,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::default);

/// The process-wide counters.
pub(crate) fn metrics() -> &'static Metrics {
    &METRICS
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Metrics {
    /// One CSI request ended with gRPC `code` after `took`.
    pub(crate) fn record_rpc(&self, method: &str, code: i32, took: Duration) {
        let mut rpcs = lock(&self.rpcs);
        if !rpcs.contains_key(method) {
            rpcs.insert(method.to_string(), MethodStats::default());
        }
        if let Some(m) = rpcs.get_mut(method) {
            *m.codes.entry(code_name(code)).or_default() += 1;
            m.latency.observe(took.as_secs_f64());
        }
    }

    /// One SMART poll of every managed drive took `took`.
    pub(crate) fn record_health_poll(&self, took: Duration) {
        self.health_polls.fetch_add(1, Ordering::Relaxed);
        self.health_poll_micros.store(took.as_micros().try_into().unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// The cleaner zeroed `bytes` of freed space.
    pub(crate) fn record_zeroed(&self, bytes: u64) {
        self.zeroed_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A volume's move to another drive (an evacuation) ended: done with `bytes`
    /// copied, or failed.
    pub(crate) fn record_move(&self, done: Option<u64>) {
        match done {
            Some(bytes) => {
                self.moves_done.fetch_add(1, Ordering::Relaxed);
                self.moved_bytes.fetch_add(bytes, Ordering::Relaxed);
            }
            None => {
                self.moves_failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A drive scan (full or of changed disks) was applied now.
    pub(crate) fn record_scan(&self) {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        self.last_scan_unix.store(now, Ordering::Relaxed);
    }

    /// Whether the CSI socket is serving.
    pub(crate) fn set_csi_serving(&self, serving: bool) {
        self.csi_serving.store(serving, Ordering::Relaxed);
    }

    /// Whether the CSI socket is serving.
    pub(crate) fn csi_serving(&self) -> bool {
        self.csi_serving.load(Ordering::Relaxed)
    }

    /// A copy of the counters.
    pub(crate) fn snapshot(&self) -> Counters {
        let stats = lock(&self.rpcs);
        Counters {
            rpcs: stats.iter().flat_map(|(m, s)| s.codes.iter().map(move |(c, n)| ((m.clone(), *c), *n))).collect(),
            latency: stats.iter().map(|(m, s)| (m.clone(), s.latency.clone())).collect(),
            health_polls: self.health_polls.load(Ordering::Relaxed),
            zeroed_bytes: self.zeroed_bytes.load(Ordering::Relaxed),
            moves: (self.moves_done.load(Ordering::Relaxed), self.moves_failed.load(Ordering::Relaxed)),
            moved_bytes: self.moved_bytes.load(Ordering::Relaxed),
            health_poll_seconds: self.health_poll_micros.load(Ordering::Relaxed) as f64 / 1e6,
            last_scan_unix: self.last_scan_unix.load(Ordering::Relaxed),
        }
    }
}

/// A copy of [`Metrics`].
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Counters {
    /// Requests by (method, code name).
    pub rpcs: BTreeMap<(String, &'static str), u64>,
    /// Latency by method.
    pub latency: BTreeMap<String, Histogram>,
    /// SMART polls done.
    pub health_polls: u64,
    /// Bytes of freed space the cleaner zeroed.
    pub zeroed_bytes: u64,
    /// Volume moves (evacuations): (done, failed).
    pub moves: (u64, u64),
    /// Bytes copied by the moves done.
    pub moved_bytes: u64,
    /// Duration of the last SMART poll.
    pub health_poll_seconds: f64,
    /// When the last drive scan was applied (0: never).
    pub last_scan_unix: u64,
}

/// State read from the actors at scrape time.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Gauges {
    /// Drives by (class, health, usage).
    pub drives: BTreeMap<(String, String, String), u64>,
    /// Volumes by (state, condition).
    pub volumes: BTreeMap<(String, String), u64>,
    /// Snapshots by state: (how many, bytes they take on the drives).
    pub snapshots: BTreeMap<String, (u64, u64)>,
    /// Attach queue, when it runs: (waiting, running, retries, relists).
    pub attach: Option<(usize, usize, u64, u64)>,
    /// `/readyz` would answer ready.
    pub ready: bool,
}

/// The upper-snake gRPC name of a status code.
pub(crate) fn code_name(code: i32) -> &'static str {
    match code {
        0 => "OK",
        1 => "CANCELLED",
        2 => "UNKNOWN",
        3 => "INVALID_ARGUMENT",
        4 => "DEADLINE_EXCEEDED",
        5 => "NOT_FOUND",
        6 => "ALREADY_EXISTS",
        7 => "PERMISSION_DENIED",
        8 => "RESOURCE_EXHAUSTED",
        9 => "FAILED_PRECONDITION",
        10 => "ABORTED",
        11 => "OUT_OF_RANGE",
        12 => "UNIMPLEMENTED",
        13 => "INTERNAL",
        14 => "UNAVAILABLE",
        15 => "DATA_LOSS",
        16 => "UNAUTHENTICATED",
        _ => "UNKNOWN",
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Label values are drivelet's own names or the client's method names; quotes,
/// backslashes and newlines are escaped as the text format asks.
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The Prometheus text exposition (format 0.0.4) of a scrape.
pub(crate) fn render(c: &Counters, g: &Gauges) -> String {
    let mut out = String::new();
    header(&mut out, "drivelet_build_info", "gauge", "drivelet's version.");
    let _ = writeln!(out, "drivelet_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"));
    header(&mut out, "drivelet_ready", "gauge", "1 once the first drive scan is done and the CSI socket serves.");
    let _ = writeln!(out, "drivelet_ready {}", u8::from(g.ready));
    header(&mut out, "drivelet_drives", "gauge", "Disks seen, by class, health and usage.");
    for ((class, health, usage), n) in &g.drives {
        let _ = writeln!(out, "drivelet_drives{{class=\"{}\",health=\"{}\",usage=\"{}\"}} {n}", esc(class), esc(health), esc(usage));
    }
    header(&mut out, "drivelet_volumes", "gauge", "Volumes, by state and condition.");
    for ((state, condition), n) in &g.volumes {
        let _ = writeln!(out, "drivelet_volumes{{state=\"{}\",condition=\"{}\"}} {n}", esc(state), esc(condition));
    }
    header(&mut out, "drivelet_snapshots", "gauge", "Snapshots, by state.");
    for (state, (n, _)) in &g.snapshots {
        let _ = writeln!(out, "drivelet_snapshots{{state=\"{}\"}} {n}", esc(state));
    }
    header(&mut out, "drivelet_snapshot_bytes", "gauge", "Bytes snapshots take on the drives, by state.");
    for (state, (_, bytes)) in &g.snapshots {
        let _ = writeln!(out, "drivelet_snapshot_bytes{{state=\"{}\"}} {bytes}", esc(state));
    }
    header(&mut out, "drivelet_csi_requests_total", "counter", "CSI requests served, by method and gRPC code.");
    for ((method, code), n) in &c.rpcs {
        let _ = writeln!(out, "drivelet_csi_requests_total{{method=\"{}\",code=\"{code}\"}} {n}", esc(method));
    }
    header(&mut out, "drivelet_csi_request_duration_seconds", "histogram", "CSI request latency, by method.");
    for (method, h) in &c.latency {
        let m = esc(method);
        let mut cumulative = 0;
        for (bound, n) in LATENCY_BUCKETS.iter().zip(h.buckets) {
            cumulative += n;
            let _ = writeln!(out, "drivelet_csi_request_duration_seconds_bucket{{method=\"{m}\",le=\"{bound}\"}} {cumulative}");
        }
        let _ = writeln!(out, "drivelet_csi_request_duration_seconds_bucket{{method=\"{m}\",le=\"+Inf\"}} {}", h.count);
        let _ = writeln!(out, "drivelet_csi_request_duration_seconds_sum{{method=\"{m}\"}} {}", h.sum);
        let _ = writeln!(out, "drivelet_csi_request_duration_seconds_count{{method=\"{m}\"}} {}", h.count);
    }
    if let Some((waiting, running, retries, relists)) = g.attach {
        header(&mut out, "drivelet_attach_queue_depth", "gauge", "VolumeAttachments waiting to be worked on.");
        let _ = writeln!(out, "drivelet_attach_queue_depth {waiting}");
        header(&mut out, "drivelet_attach_queue_running", "gauge", "VolumeAttachments being worked on.");
        let _ = writeln!(out, "drivelet_attach_queue_running {running}");
        header(&mut out, "drivelet_attach_retries_total", "counter", "Attach and detach runs that ended in a retry.");
        let _ = writeln!(out, "drivelet_attach_retries_total {retries}");
        header(&mut out, "drivelet_attach_relists_total", "counter", "Full lists of VolumeAttachments (watch starts and restarts).");
        let _ = writeln!(out, "drivelet_attach_relists_total {relists}");
    }
    header(&mut out, "drivelet_health_polls_total", "counter", "SMART polls of all managed drives.");
    let _ = writeln!(out, "drivelet_health_polls_total {}", c.health_polls);
    header(&mut out, "drivelet_zeroed_bytes_total", "counter", "Bytes of freed drive space zeroed before reuse.");
    let _ = writeln!(out, "drivelet_zeroed_bytes_total {}", c.zeroed_bytes);
    header(&mut out, "drivelet_volume_moves_total", "counter", "Moves of a volume to another drive of the node (evacuations), by result.");
    let _ = writeln!(out, "drivelet_volume_moves_total{{result=\"done\"}} {}", c.moves.0);
    let _ = writeln!(out, "drivelet_volume_moves_total{{result=\"failed\"}} {}", c.moves.1);
    header(&mut out, "drivelet_moved_bytes_total", "counter", "Bytes copied and verified by the volume moves done.");
    let _ = writeln!(out, "drivelet_moved_bytes_total {}", c.moved_bytes);
    header(&mut out, "drivelet_health_poll_duration_seconds", "gauge", "How long the last SMART poll of all managed drives took.");
    let _ = writeln!(out, "drivelet_health_poll_duration_seconds {}", c.health_poll_seconds);
    header(&mut out, "drivelet_inventory_last_scan_timestamp_seconds", "gauge", "Unix time of the last drive scan applied.");
    let _ = writeln!(out, "drivelet_inventory_last_scan_timestamp_seconds {}", c.last_scan_unix);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_when_rendered() {
        let mut c = Counters::default();
        let mut h = Histogram::default();
        for s in [0.00005, 0.0003, 0.0003, 2.0, 100.0] {
            h.observe(s);
        }
        c.latency.insert("Probe".into(), h);
        c.rpcs.insert(("Probe".into(), "OK"), 4);
        c.rpcs.insert(("Probe".into(), code_name(5)), 1);
        c.zeroed_bytes = 3 << 20;
        c.moves = (2, 1);
        c.moved_bytes = 5 << 20;
        let text = render(&c, &Gauges::default());
        for line in [
            "drivelet_csi_request_duration_seconds_bucket{method=\"Probe\",le=\"0.0001\"} 1",
            "drivelet_csi_request_duration_seconds_bucket{method=\"Probe\",le=\"0.0005\"} 3",
            "drivelet_csi_request_duration_seconds_bucket{method=\"Probe\",le=\"2.5\"} 4",
            "drivelet_csi_request_duration_seconds_bucket{method=\"Probe\",le=\"60\"} 4",
            "drivelet_csi_request_duration_seconds_bucket{method=\"Probe\",le=\"+Inf\"} 5",
            "drivelet_csi_request_duration_seconds_count{method=\"Probe\"} 5",
            "drivelet_csi_requests_total{method=\"Probe\",code=\"OK\"} 4",
            "drivelet_csi_requests_total{method=\"Probe\",code=\"NOT_FOUND\"} 1",
            "drivelet_zeroed_bytes_total 3145728",
            "drivelet_volume_moves_total{result=\"done\"} 2",
            "drivelet_volume_moves_total{result=\"failed\"} 1",
            "drivelet_moved_bytes_total 5242880",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn gauges_render_with_labels_and_the_attach_queue_only_when_it_runs() {
        let mut g = Gauges { ready: true, ..Default::default() };
        g.drives.insert(("managed".into(), "good".into(), "active".into()), 2);
        g.volumes.insert(("published".into(), "abnormal".into()), 1);
        g.snapshots.insert("ready".into(), (2, 3 << 20));
        let text = render(&Counters::default(), &g);
        assert!(text.contains("drivelet_ready 1\n"));
        assert!(text.contains("drivelet_drives{class=\"managed\",health=\"good\",usage=\"active\"} 2\n"));
        assert!(text.contains("drivelet_volumes{state=\"published\",condition=\"abnormal\"} 1\n"));
        assert!(text.contains("drivelet_snapshots{state=\"ready\"} 2\n"));
        assert!(text.contains("drivelet_snapshot_bytes{state=\"ready\"} 3145728\n"));
        assert!(!text.contains("drivelet_attach_queue_depth"));
        g.attach = Some((3, 1, 7, 2));
        let text = render(&Counters::default(), &g);
        assert!(text.contains("drivelet_attach_queue_depth 3\n") && text.contains("drivelet_attach_retries_total 7\n"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap_or("");
            assert!(value.parse::<f64>().is_ok(), "every sample ends in a number: {line}");
        }
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(esc("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
