//! drivelet's Prometheus metrics: the counters code paths bump as they run, the state
//! read from the actors when scraped, and their exposition in the format the scraper
//! asked for: OpenMetrics text or the Prometheus text format 0.0.4 ([`Format`]).
//!
//! Built on `prometheus-client`, the Rust client of the Prometheus project itself: it is
//! maintained by the Prometheus org, writes OpenMetrics (with `# UNIT`, `_total` and
//! the `# EOF` a scraper checks for) and the Prometheus text format 0.0.4 (`HELP` and
//! `TYPE` named as the samples are, no units) from the same registry and collectors,
//! escapes label values, keeps no global registry
//! (drivelet owns its one [`Registry`]), and takes custom collectors, which is how the
//! state read at scrape time is written without storing it anywhere.
//!
//! Rules:
//! - Counters that code paths bump as they run (CSI requests and their latency, SMART
//!   polls, drive scans, zeroed and moved bytes, whether the CSI socket serves) live in
//!   one process-wide [`Metrics`] ([`metrics()`]), as prometheus-client metric families
//!   in its registry.
//! - Everything that is state (drives, volumes, snapshots, the attach queue,
//!   evacuations) is read from the actors when scraped into a [`Gauges`] snapshot
//!   ([`gather`]) and written by a collector of that snapshot: a scrape shows the truth
//!   at that moment, nothing is stored or counted twice, and a drive or volume that is
//!   gone is gone from the next scrape.
//! - Rendering ([`render`]) is a pure function of the registry, a snapshot and the
//!   format, tested on its own, against a strict OpenMetrics parser, and (in the
//!   integration tier, on the real binary's answer) with `promtool check metrics`.
//! - Names follow the Prometheus conventions: `drivelet_` first, the unit last
//!   (`_bytes`, `_seconds`, `_celsius`, `_ratio`), `_total` on counters; state sets are
//!   gauges with one series per state, 1 for the current one and 0 for the others.
//! - Label values are drivelet's own lowercase names (`managed`, `published`,
//!   `drive-missing`), the gRPC code names (`OK`, `NOT_FOUND`), the CSI methods drivelet
//!   serves (or `unknown`), the Kubernetes resources its code asks for (or `other`), and
//!   the ids and names of drives, volumes and claims. No value is taken from a request:
//!   the labels of the counters are `&'static str`, each from a closed set (the CSI
//!   method from `grpc::rpc_metrics`' table, the Kubernetes resource from
//!   `k8s::known_resource`), so a client can send any path and mint no series.
//! - Cardinality is bounded by the node's hardware and workload, never by requests or
//!   time: per-drive series grow with the node's disks (11 to 13 per disk, 9 more for a
//!   managed one, up to 7 more SMART figures), per-volume series with its volumes (3
//!   each, plus one per current condition reason of an abnormal volume and one while it
//!   moves), evacuation series with the drives being evacuated (5 each), CSI series with
//!   the methods (30 and `unknown`) times the codes they answered. docs/operations.md
//!   lists every series and what grows with what.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

pub use self::format::Format;
pub use self::gauges::{DriveFigures, EvacuationFigures, Gauges, ManagedFigures, VolumeFigures};

/// The two exposition formats, and which one a scraper asked for.
mod format;
/// The state read at scrape time, and the collector that writes it.
mod gauges;
/// Turning the actors' answers into a [`Gauges`] snapshot.
pub(crate) mod gather;
#[cfg(test)]
mod tests;

/// Histogram bucket bounds of CSI request latency, in seconds.
pub(crate) const LATENCY_BUCKETS: [f64; 16] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0];

/// The labels of a CSI request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    method: &'static str,
    code: &'static str,
}

/// The label of a CSI latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: &'static str,
}

/// The labels of the Kubernetes API request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KubeRequestLabels {
    verb: &'static str,
    resource: &'static str,
}

/// The labels of the watch event counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchLabels {
    resource: &'static str,
}

/// The label of the volume move counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// Counters bumped as the process runs, and the registry that writes them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    rpcs: Family<RpcLabels, Counter>,
    latency: Family<MethodLabels, Histogram, fn() -> Histogram>,
    health_polls: Counter,
    zeroed_bytes: Counter,
    moves: Family<ResultLabels, Counter>,
    moved_bytes: Counter,
    health_poll_seconds: Gauge<f64, AtomicU64>,
    last_scan_unix: Gauge,
    kube_requests: Family<KubeRequestLabels, Counter>,
    watch_events: Family<WatchLabels, Counter>,
    foreign_events: Family<WatchLabels, Counter>,
    relayed: Family<WatchLabels, Counter>,
    csi_serving: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        let m = Metrics {
            registry: Registry::default(),
            rpcs: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            health_polls: Counter::default(),
            zeroed_bytes: Counter::default(),
            moves: Family::default(),
            moved_bytes: Counter::default(),
            health_poll_seconds: Gauge::default(),
            last_scan_unix: Gauge::default(),
            kube_requests: Family::default(),
            watch_events: Family::default(),
            foreign_events: Family::default(),
            relayed: Family::default(),
            csi_serving: AtomicBool::new(false),
        };
        // Both results show from the start, so a rate of failures is 0 rather than absent.
        for result in ["done", "failed"] {
            let _ = m.moves.get_or_create(&ResultLabels { result });
        }
        let mut m = m;
        let r = &mut m.registry;
        r.register("drivelet_csi_requests", "CSI requests served, by method and gRPC code", m.rpcs.clone());
        r.register_with_unit("drivelet_csi_request_duration", "CSI request latency, by method", Unit::Seconds, m.latency.clone());
        r.register("drivelet_health_polls", "SMART polls of all managed drives", m.health_polls.clone());
        r.register_with_unit("drivelet_zeroed", "Bytes of freed drive space zeroed before reuse", Unit::Bytes, m.zeroed_bytes.clone());
        r.register("drivelet_volume_moves", "Moves of a volume to another drive of the node (evacuations), by result", m.moves.clone());
        r.register_with_unit("drivelet_moved", "Bytes copied and verified by the volume moves done", Unit::Bytes, m.moved_bytes.clone());
        r.register_with_unit(
            "drivelet_health_poll_duration",
            "How long the last SMART poll of all managed drives took",
            Unit::Seconds,
            m.health_poll_seconds.clone(),
        );
        r.register_with_unit(
            "drivelet_inventory_last_scan_timestamp",
            "Unix time of the last drive scan applied",
            Unit::Seconds,
            m.last_scan_unix.clone(),
        );
        r.register(
            "drivelet_kube_requests",
            "Kubernetes API requests sent, by verb and resource (a watch counts once when it starts)",
            m.kube_requests.clone(),
        );
        r.register("drivelet_kube_watch_events", "Kubernetes watch events received, by resource", m.watch_events.clone());
        r.register(
            "drivelet_kube_foreign_watch_events",
            "Watch events received of per-node watches for objects another node holds, by resource (0 when the API server filters)",
            m.foreign_events.clone(),
        );
        r.register(
            "drivelet_kube_relayed_labels",
            "Objects the elected agent labelled with the node that holds them, by resource",
            m.relayed.clone(),
        );
        m
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::default);

/// The process-wide counters.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

impl Metrics {
    /// One CSI request to `method` (one of the served methods, or `unknown`) ended with
    /// gRPC `code` after `took`.
    pub fn record_rpc(&self, method: &'static str, code: i32, took: Duration) {
        self.rpcs.get_or_create(&RpcLabels { method, code: code_name(code) }).inc();
        self.latency.get_or_create(&MethodLabels { method }).observe(took.as_secs_f64());
    }

    /// One SMART poll of every managed drive took `took`.
    pub(crate) fn record_health_poll(&self, took: Duration) {
        self.health_polls.inc();
        self.health_poll_seconds.set(took.as_secs_f64());
    }

    /// The cleaner zeroed `bytes` of freed space.
    pub(crate) fn record_zeroed(&self, bytes: u64) {
        self.zeroed_bytes.inc_by(bytes);
    }

    /// A volume's move to another drive (an evacuation) ended: done with `bytes`
    /// copied, or failed.
    pub(crate) fn record_move(&self, done: Option<u64>) {
        match done {
            Some(bytes) => {
                self.moves.get_or_create(&ResultLabels { result: "done" }).inc();
                self.moved_bytes.inc_by(bytes);
            }
            None => {
                self.moves.get_or_create(&ResultLabels { result: "failed" }).inc();
            }
        }
    }

    /// A drive scan (full or of changed disks) was applied now.
    pub(crate) fn record_scan(&self) {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        self.last_scan_unix.set(i64::try_from(now).unwrap_or(i64::MAX));
    }

    /// A Kubernetes API request was sent.
    pub(crate) fn record_kube_request(&self, verb: &'static str, resource: &'static str) {
        self.kube_requests.get_or_create(&KubeRequestLabels { verb, resource }).inc();
    }

    /// A watch event for an object of `resource` arrived; `foreign` when the watch is
    /// this node's and the object is another node's.
    pub(crate) fn record_watch_event(&self, resource: &'static str, foreign: bool) {
        let labels = WatchLabels { resource };
        self.watch_events.get_or_create(&labels).inc();
        if foreign {
            self.foreign_events.get_or_create(&labels).inc();
        }
    }

    /// The elected agent labelled an object of `resource` with its node.
    pub(crate) fn record_relayed(&self, resource: &'static str) {
        self.relayed.get_or_create(&WatchLabels { resource }).inc();
    }

    /// Whether the CSI socket is serving.
    pub(crate) fn set_csi_serving(&self, serving: bool) {
        self.csi_serving.store(serving, Ordering::Relaxed);
    }

    /// Whether the CSI socket is serving.
    pub(crate) fn csi_serving(&self) -> bool {
        self.csi_serving.load(Ordering::Relaxed)
    }

    /// The exposition of these counters and of `g`, state read at scrape time, in
    /// `format`.
    pub fn render(&self, g: Gauges, format: Format) -> String {
        render(&self.registry, g, format)
    }
}

/// The exposition of `registry` (the process counters) and `g` in `format`: the
/// OpenMetrics text ending in `# EOF`, or the Prometheus text format 0.0.4. Formatting
/// into a `String` cannot fail; if the library ever said otherwise, what was written so
/// far is answered (OpenMetrics: without the EOF, so the scraper rejects it rather than
/// read half of it as the truth).
pub fn render(registry: &Registry, g: Gauges, format: Format) -> String {
    use prometheus_client::encoding::{prometheus_text, text};
    let mut out = String::with_capacity(16 * 1024);
    let mut scrape = Registry::default();
    scrape.register_collector(Box::new(g));
    let written = match format {
        Format::OpenMetrics => text::encode_registry(&mut out, &scrape)
            .and_then(|()| text::encode_registry(&mut out, registry))
            .and_then(|()| text::encode_eof(&mut out)),
        Format::Text => prometheus_text::encode(&mut out, &scrape).and_then(|()| prometheus_text::encode(&mut out, registry)),
    };
    if written.is_err() {
        tracing::warn!("the metrics exposition could not be written whole");
    }
    out
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
