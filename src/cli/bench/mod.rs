//! `drivelet bench`: a CSI load generator for any CSI endpoint (drivelet's or another
//! driver's), measuring cheap RPCs (`rpc` mode) or whole volume lifecycles
//! (`lifecycle` mode) and reporting throughput, latency percentiles and errors by code.
//!
//! Rules:
//! - endpoints are measured one after another, never at the same time, so they do not
//!   compete for the machine; each gets the same settings and its rows sit side by side
//!   in one report;
//! - every caller has its own connection by default (`--connections per-caller`);
//!   `shared` gives all callers clones of one channel, which multiplexes their calls
//!   over one HTTP/2 connection;
//! - `rpc` mode runs each RPC in its own phase of `--duration`, every caller calling it
//!   back to back; one untimed call per caller comes first, so connection set-up is not
//!   measured, and the phase starts for all callers at once;
//! - an RPC the endpoint does not advertise (GetCapacity without GET_CAPACITY,
//!   ListVolumes without LIST_VOLUMES) is skipped and listed as skipped, not counted as
//!   an error;
//! - `lifecycle` mode does what a container orchestrator would: CreateVolume,
//!   ControllerPublishVolume (only when PUBLISH_UNPUBLISH_VOLUME is advertised),
//!   NodeStageVolume (only when STAGE_UNSTAGE_VOLUME is), NodePublishVolume, a write
//!   and read-back of a small file (a block volume: its first 4 KiB) through the target
//!   path, then the inverse calls in reverse order;
//! - a lifecycle that fails at any step is cleaned up at once, best effort with
//!   retries: every step that was or may have been applied is undone and the volume
//!   deleted; a volume that still cannot be deleted is reported by id, and the command
//!   then fails, so a run never leaves a volume behind silently;
//! - Ctrl-C in lifecycle mode starts no new lifecycle and lets those in flight finish
//!   (and clean up);
//! - every call has a time limit (`--timeout`); running out counts as
//!   DEADLINE_EXCEEDED;
//! - volume names are `bench-<run>-<n>` with a random run id, so runs never collide;
//!   only directories the bench made under `--staging-dir` and `--target-dir` are
//!   removed, and only when empty;
//! - progress goes to stderr, and only when stderr is a terminal; the report goes to
//!   stdout ([`run`] is the subcommand's body).

/// The latency histogram: log-linear buckets, cheap to record and merge.
pub mod histogram;
/// `lifecycle` mode: whole volume lifecycles, cleaned up when they fail.
pub mod lifecycle;
/// What the bench reports, as a table or JSON.
pub mod report;
/// `rpc` mode: cheap RPCs, one phase each.
pub mod rpc;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use tonic::Code;

use super::args::{BenchArgs, BenchMode, Output};
use super::CliError;
use crate::cli::csi::{self as csicli, Access};
use crate::grpc::proto::csi;
use csi::controller_service_capability::rpc::Type as CtrlCap;
use csi::node_service_capability::rpc::Type as NodeCap;

pub use histogram::Histogram;
pub use lifecycle::{run_lifecycle, LifecycleOptions};
pub use report::{render_table, CallStats, EndpointReport, Latency, LifecycleStats, Report, Skipped};
pub use rpc::{run_rpc, Rpc, RpcOptions};

/// Errors of `drivelet bench` that stop a run before it measures anything.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// An argument is malformed.
    #[error("{0}")]
    Usage(String),
    /// An endpoint could not be reached.
    #[error("endpoint {label}: {source}")]
    Connect {
        /// The endpoint's label.
        label: String,
        /// Why.
        source: csicli::CsiCliError,
    },
    /// A call made to learn about the endpoint failed.
    #[error("endpoint {label}: {method} failed: {code}: {message}")]
    Setup {
        /// The endpoint's label.
        label: String,
        /// The RPC.
        method: &'static str,
        /// gRPC code name.
        code: String,
        /// The driver's message.
        message: String,
    },
    /// The endpoint cannot do what the mode needs.
    #[error("endpoint {label}: {reason}")]
    Unsupported {
        /// The endpoint's label.
        label: String,
        /// What is missing.
        reason: String,
    },
    /// A directory could not be made.
    #[error("cannot create {}: {reason}", path.display())]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        reason: String,
    },
}

/// One endpoint to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Name in the report.
    pub label: String,
    /// Unix socket path.
    pub path: PathBuf,
}

/// Parses `--endpoint`: `LABEL=PATH`, or a bare `PATH` (labelled with itself).
pub fn parse_endpoint(s: &str) -> Result<Target, BenchError> {
    let (label, path) = match s.split_once('=') {
        Some((l, p)) if !l.contains('/') => (l.to_string(), p.to_string()),
        _ => (s.to_string(), s.to_string()),
    };
    if label.is_empty() || path.is_empty() {
        return Err(BenchError::Usage(format!("--endpoint {s:?}: write PATH or LABEL=PATH")));
    }
    Ok(Target { label, path: PathBuf::from(path) })
}

/// How callers reach an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Connections {
    /// One connection (channel) per caller.
    PerCaller,
    /// One channel shared by all callers (HTTP/2 multiplexing).
    Shared,
}

impl Connections {
    /// Name in the report.
    pub fn as_str(self) -> &'static str {
        match self {
            Connections::PerCaller => "per-caller",
            Connections::Shared => "shared",
        }
    }
}

/// Settings of both modes.
#[derive(Debug, Clone)]
pub struct Common {
    /// Endpoints, measured in this order.
    pub endpoints: Vec<Target>,
    /// Concurrent callers.
    pub concurrency: usize,
    /// One connection per caller, or one shared.
    pub connections: Connections,
    /// Time limit of every call.
    pub timeout: Duration,
}

/// Canonical gRPC code name (`ABORTED`, `DEADLINE_EXCEEDED`, ...).
pub fn code_name(c: Code) -> &'static str {
    match c {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// A failed call: code name and message.
#[derive(Debug, Clone)]
struct Failure {
    code: &'static str,
    message: String,
}

impl Failure {
    fn status(s: &tonic::Status) -> Failure {
        Failure { code: code_name(s.code()), message: s.message().to_string() }
    }
}

/// Runs one call under the time limit; returns its latency and outcome.
async fn timed<T>(
    limit: Duration,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> (Duration, Result<T, Failure>) {
    let t0 = Instant::now();
    let r = tokio::time::timeout(limit, call).await;
    let d = t0.elapsed();
    let r = match r {
        Ok(Ok(resp)) => Ok(resp.into_inner()),
        Ok(Err(s)) => Err(Failure::status(&s)),
        Err(_) => Err(Failure { code: "DEADLINE_EXCEEDED", message: format!("no answer within {limit:?}") }),
    };
    (d, r)
}

/// Latencies and errors of one kind of call.
#[derive(Debug, Clone, Default)]
struct Tally {
    h: Histogram,
    errors: BTreeMap<String, u64>,
}

impl Tally {
    fn ok(&mut self, d: Duration) {
        self.h.record(d);
    }

    fn err(&mut self, code: &str) {
        *self.errors.entry(code.to_string()).or_default() += 1;
    }

    fn merge(&mut self, o: &Tally) {
        self.h.merge(&o.h);
        for (k, v) in &o.errors {
            *self.errors.entry(k.clone()).or_default() += v;
        }
    }

    fn stats(&self, name: &str, secs: f64) -> CallStats {
        let errors: u64 = self.errors.values().sum();
        let ok = self.h.count();
        CallStats {
            name: name.to_string(),
            calls: ok + errors,
            ok,
            errors,
            per_s: if secs > 0.0 { ((ok as f64 / secs) * 10.0).round() / 10.0 } else { 0.0 },
            latency: Latency::of(&self.h),
            errors_by_code: self.errors.clone(),
        }
    }
}

/// Counters the progress line reads.
#[derive(Debug, Default)]
struct Progress {
    done: AtomicU64,
    errors: AtomicU64,
}

impl Progress {
    fn add(&self, ok: bool) {
        self.done.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A progress line on stderr, twice a second, only when stderr is a terminal; it is
/// erased when the returned guard is dropped.
struct Ticker(Option<tokio::task::JoinHandle<()>>);

impl Ticker {
    fn start(what: String, unit: &'static str, p: Arc<Progress>) -> Ticker {
        if !std::io::stderr().is_terminal() {
            return Ticker(None);
        }
        let t0 = Instant::now();
        Ticker(Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                eprint!(
                    "\r\x1b[2K{what}: {} {unit}, {} failed, {:.0}s",
                    p.done.load(Ordering::Relaxed),
                    p.errors.load(Ordering::Relaxed),
                    t0.elapsed().as_secs_f64()
                );
            }
        })))
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            h.abort();
            eprint!("\r\x1b[2K");
        }
    }
}

/// The three CSI services over one channel.
struct Clients {
    id: csi::identity_client::IdentityClient<Channel>,
    node: csi::node_client::NodeClient<Channel>,
    ctrl: csi::controller_client::ControllerClient<Channel>,
}

impl Clients {
    fn new(ch: Channel) -> Clients {
        Clients {
            id: csi::identity_client::IdentityClient::new(ch.clone()),
            node: csi::node_client::NodeClient::new(ch.clone()),
            ctrl: csi::controller_client::ControllerClient::new(ch),
        }
    }

    /// One call of a cheap RPC.
    async fn call(&mut self, rpc: Rpc, limit: Duration, page_size: i32) -> (Duration, Result<(), Failure>) {
        fn unit<T>((d, r): (Duration, Result<T, Failure>)) -> (Duration, Result<(), Failure>) {
            (d, r.map(|_| ()))
        }
        match rpc {
            Rpc::GetPluginInfo => unit(timed(limit, self.id.get_plugin_info(csi::GetPluginInfoRequest {})).await),
            Rpc::Probe => unit(timed(limit, self.id.probe(csi::ProbeRequest {})).await),
            Rpc::NodeGetInfo => unit(timed(limit, self.node.node_get_info(csi::NodeGetInfoRequest {})).await),
            Rpc::NodeGetCapabilities => {
                unit(timed(limit, self.node.node_get_capabilities(csi::NodeGetCapabilitiesRequest {})).await)
            }
            Rpc::GetCapacity => unit(timed(limit, self.ctrl.get_capacity(csi::GetCapacityRequest::default())).await),
            Rpc::ListVolumes => {
                let req = csi::ListVolumesRequest { max_entries: page_size, starting_token: String::new() };
                unit(timed(limit, self.ctrl.list_volumes(req)).await)
            }
        }
    }
}

/// `n` channels to an endpoint: `n` connections, or clones of one.
async fn channels(t: &Target, n: usize, how: Connections) -> Result<Vec<Channel>, BenchError> {
    let connect = || async {
        csicli::connect(&t.path).await.map_err(|source| BenchError::Connect { label: t.label.clone(), source })
    };
    match how {
        Connections::Shared => Ok(vec![connect().await?; n]),
        Connections::PerCaller => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(connect().await?);
            }
            Ok(v)
        }
    }
}

fn setup_err<'a>(t: &'a Target, method: &'static str) -> impl FnOnce(Failure) -> BenchError + 'a {
    move |f| BenchError::Setup { label: t.label.clone(), method, code: f.code.to_string(), message: f.message }
}

/// The driver's name (GetPluginInfo).
async fn driver_name(c: &mut Clients, t: &Target, limit: Duration) -> Result<String, BenchError> {
    let (_, r) = timed(limit, c.id.get_plugin_info(csi::GetPluginInfoRequest {})).await;
    Ok(r.map_err(setup_err(t, "GetPluginInfo"))?.name)
}

/// The controller capabilities; none when the endpoint has no controller service.
async fn controller_caps(c: &mut Clients, limit: Duration) -> HashSet<CtrlCap> {
    let (_, r) = timed(limit, c.ctrl.controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})).await;
    r.map(|caps| {
        caps.capabilities
            .iter()
            .filter_map(|c| match &c.r#type {
                Some(csi::controller_service_capability::Type::Rpc(r)) => CtrlCap::try_from(r.r#type).ok(),
                _ => None,
            })
            .collect()
    })
    .unwrap_or_default()
}

fn check_common(c: &Common) -> Result<(), BenchError> {
    if c.endpoints.is_empty() {
        return Err(BenchError::Usage("give at least one --endpoint".into()));
    }
    if c.concurrency == 0 {
        return Err(BenchError::Usage("--concurrency must be at least 1".into()));
    }
    Ok(())
}

/// `drivelet bench`: measures the endpoints in `mode`, prints the report, and fails
/// when a volume was left behind.
pub fn run(mode: BenchMode) -> Result<(), CliError> {
    let duration = |s: &str| crate::config::parse_duration(s).map_err(CliError::Usage);
    let common = |a: &BenchArgs| -> Result<Common, CliError> {
        Ok(Common {
            endpoints: a.endpoints.iter().map(|e| parse_endpoint(e)).collect::<Result<_, _>>()?,
            concurrency: a.concurrency,
            connections: a.connections,
            timeout: duration(&a.timeout)?,
        })
    };
    let args = match &mode {
        BenchMode::Rpc { args, .. } | BenchMode::Lifecycle { args, .. } => args,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(args.threads.max(1)).enable_all().build()?;
    let report = match &mode {
        BenchMode::Rpc { args, duration: d, rpcs, page_size } => {
            let o = RpcOptions { common: common(args)?, duration: duration(d)?, rpcs: rpcs.clone(), page_size: *page_size };
            rt.block_on(run_rpc(&o))?
        }
        BenchMode::Lifecycle { args, count, duration: d, size, fs, block, params, staging_dir, target_dir } => {
            let o = LifecycleOptions {
                common: common(args)?,
                count: *count,
                duration: duration(d)?,
                size: super::size_arg(size)?,
                access: Access { block: *block, fs_type: fs.clone(), mount_flags: Vec::new(), mode: String::new() },
                params: csicli::parse_params(params)?,
                staging_dir: staging_dir.clone(),
                target_dir: target_dir.clone(),
            };
            rt.block_on(run_lifecycle(&o))?
        }
    };
    match args.output {
        Output::Json => println!("{}", super::json(&report)?),
        Output::Table => print!("{}", render_table(&report)),
    }
    let left = report.left_behind();
    if !left.is_empty() {
        return Err(CliError::LeftBehind(left));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::lifecycle::write_and_read;
    use super::*;

    #[test]
    fn endpoints_take_an_optional_label() {
        assert_eq!(
            parse_endpoint("drivelet=/run/d/csi.sock").unwrap(),
            Target { label: "drivelet".into(), path: "/run/d/csi.sock".into() }
        );
        assert_eq!(parse_endpoint("/run/d/csi.sock").unwrap(), Target { label: "/run/d/csi.sock".into(), path: "/run/d/csi.sock".into() });
        // An `=` inside a path is part of the path.
        assert_eq!(parse_endpoint("/run/a=b/csi.sock").unwrap().path, PathBuf::from("/run/a=b/csi.sock"));
        assert!(parse_endpoint("=/x.sock").is_err());
        assert!(parse_endpoint("name=").is_err());
    }

    #[test]
    fn rpcs_the_endpoint_does_not_advertise_are_skipped() {
        let none = HashSet::new();
        assert_eq!(Rpc::Probe.unsupported(&none), None);
        assert_eq!(Rpc::NodeGetCapabilities.unsupported(&none), None);
        assert!(Rpc::GetCapacity.unsupported(&none).unwrap().contains("GET_CAPACITY"));
        assert!(Rpc::ListVolumes.unsupported(&none).unwrap().contains("LIST_VOLUMES"));
        let all: HashSet<CtrlCap> = [CtrlCap::GetCapacity, CtrlCap::ListVolumes].into();
        assert!(Rpc::ALL.iter().all(|r| r.unsupported(&all).is_none()));
    }

    #[test]
    fn tallies_count_calls_errors_and_throughput() {
        let mut a = Tally::default();
        a.ok(Duration::from_micros(100));
        a.ok(Duration::from_micros(300));
        a.err("ABORTED");
        let mut b = Tally::default();
        b.err("ABORTED");
        b.err("UNAVAILABLE");
        a.merge(&b);
        let s = a.stats("Probe", 2.0);
        assert_eq!((s.calls, s.ok, s.errors), (5, 2, 3));
        assert_eq!(s.per_s, 1.0, "successful calls per second");
        assert_eq!(s.errors_by_code, BTreeMap::from([("ABORTED".to_string(), 2), ("UNAVAILABLE".to_string(), 1)]));
        assert!(s.latency.p50_us >= 100.0 && s.latency.p50_us <= 100.0 * (1.0 + 1.0 / 64.0), "{}", s.latency.p50_us);
        assert_eq!(s.latency.max_us, 300.0);
    }

    #[test]
    fn code_names_are_the_canonical_ones() {
        assert_eq!(code_name(Code::DeadlineExceeded), "DEADLINE_EXCEEDED");
        assert_eq!(code_name(Code::FailedPrecondition), "FAILED_PRECONDITION");
    }

    #[test]
    fn the_file_check_writes_and_reads_back_through_a_directory_and_a_block_file() {
        let dir = tempfile::tempdir().unwrap();
        write_and_read(dir.path(), false, "bench-x-1").unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the file is removed again");
        let dev = dir.path().join("dev");
        std::fs::write(&dev, vec![0u8; 8192]).unwrap();
        write_and_read(&dev, true, "bench-x-2").unwrap();
        assert!(std::fs::read(&dev).unwrap().starts_with(b"bench-x-2\nbench-x-2\n"));
        let e = write_and_read(&dir.path().join("missing"), false, "x").unwrap_err();
        assert_eq!(e.code, "IO");
    }
}
