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
//!   stdout.

pub mod histogram;
pub mod report;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use tonic::Code;

use crate::cli::csi::{self as csicli, Access};
use crate::grpc::proto::csi;
use csi::controller_service_capability::rpc::Type as CtrlCap;
use csi::node_service_capability::rpc::Type as NodeCap;

pub use histogram::Histogram;
pub use report::{render_table, CallStats, EndpointReport, Latency, LifecycleStats, Report, Skipped};

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

/// A cheap RPC for `rpc` mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Rpc {
    /// Identity GetPluginInfo: the baseline, a call answered from configuration alone
    /// (in drivelet, with no actor and no disk behind it), on the same server stack.
    GetPluginInfo,
    /// Identity Probe.
    Probe,
    /// NodeGetInfo.
    NodeGetInfo,
    /// NodeGetCapabilities.
    NodeGetCapabilities,
    /// GetCapacity with no parameters.
    GetCapacity,
    /// The first page of ListVolumes.
    ListVolumes,
}

impl Rpc {
    /// Every RPC of `rpc` mode, in the order they run.
    pub const ALL: [Rpc; 6] =
        [Rpc::GetPluginInfo, Rpc::Probe, Rpc::NodeGetInfo, Rpc::NodeGetCapabilities, Rpc::GetCapacity, Rpc::ListVolumes];

    /// CSI name.
    pub fn name(self) -> &'static str {
        match self {
            Rpc::GetPluginInfo => "GetPluginInfo",
            Rpc::Probe => "Probe",
            Rpc::NodeGetInfo => "NodeGetInfo",
            Rpc::NodeGetCapabilities => "NodeGetCapabilities",
            Rpc::GetCapacity => "GetCapacity",
            Rpc::ListVolumes => "ListVolumes",
        }
    }

    /// Why the endpoint cannot be asked, given its controller capabilities.
    fn unsupported(self, caps: &HashSet<CtrlCap>) -> Option<String> {
        match self {
            Rpc::GetCapacity if !caps.contains(&CtrlCap::GetCapacity) => Some("GET_CAPACITY is not advertised".into()),
            Rpc::ListVolumes if !caps.contains(&CtrlCap::ListVolumes) => Some("LIST_VOLUMES is not advertised".into()),
            _ => None,
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

/// `drivelet bench rpc`.
#[derive(Debug, Clone)]
pub struct RpcOptions {
    /// Shared settings.
    pub common: Common,
    /// How long each RPC is called.
    pub duration: Duration,
    /// Which RPCs (empty: all).
    pub rpcs: Vec<Rpc>,
    /// `max_entries` of ListVolumes.
    pub page_size: i32,
}

/// `drivelet bench lifecycle`.
#[derive(Debug, Clone)]
pub struct LifecycleOptions {
    /// Shared settings.
    pub common: Common,
    /// Lifecycles to run in all (per endpoint); `None`: as many as fit in `duration`.
    pub count: Option<u64>,
    /// Time limit when there is no count.
    pub duration: Duration,
    /// Volume size, bytes (0: the driver's default).
    pub size: u64,
    /// Block or filesystem access.
    pub access: Access,
    /// StorageClass parameters.
    pub params: HashMap<String, String>,
    /// Staging paths go under this directory.
    pub staging_dir: PathBuf,
    /// Target paths go under this directory.
    pub target_dir: PathBuf,
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

/// `drivelet bench rpc`: every endpoint, every RPC, one phase each.
pub async fn run_rpc(o: &RpcOptions) -> Result<Report, BenchError> {
    check_common(&o.common)?;
    if o.page_size < 0 {
        return Err(BenchError::Usage("--page-size must not be negative".into()));
    }
    let mut endpoints = Vec::new();
    for t in &o.common.endpoints {
        endpoints.push(rpc_endpoint(o, t).await?);
    }
    Ok(Report {
        mode: "rpc".into(),
        concurrency: o.common.concurrency,
        connections: o.common.connections.as_str().into(),
        duration_s: Some(o.duration.as_secs_f64()),
        count: None,
        endpoints,
    })
}

async fn rpc_endpoint(o: &RpcOptions, t: &Target) -> Result<EndpointReport, BenchError> {
    let chans = channels(t, o.common.concurrency, o.common.connections).await?;
    let mut first = Clients::new(chans[0].clone());
    let driver = driver_name(&mut first, t, o.common.timeout).await?;
    let caps = controller_caps(&mut first, o.common.timeout).await;
    let t0 = Instant::now();
    let mut rep = EndpointReport { label: t.label.clone(), endpoint: t.path.display().to_string(), driver, ..Default::default() };
    let rpcs = if o.rpcs.is_empty() { Rpc::ALL.to_vec() } else { o.rpcs.clone() };
    for rpc in rpcs {
        if let Some(reason) = rpc.unsupported(&caps) {
            rep.skipped.push(Skipped { name: rpc.name().into(), reason });
            continue;
        }
        rep.calls.push(rpc_phase(t, &chans, rpc, o).await);
    }
    rep.elapsed_s = t0.elapsed().as_secs_f64();
    rep.errors = rep.calls.iter().map(|c| c.errors).sum();
    Ok(rep)
}

async fn rpc_phase(t: &Target, chans: &[Channel], rpc: Rpc, o: &RpcOptions) -> CallStats {
    let progress = Arc::new(Progress::default());
    let _ticker = Ticker::start(format!("{} {}", t.label, rpc.name()), "calls", progress.clone());
    let start = Arc::new(tokio::sync::Barrier::new(chans.len()));
    let mut callers = Vec::with_capacity(chans.len());
    for ch in chans {
        let (ch, start, progress) = (ch.clone(), start.clone(), progress.clone());
        let (duration, limit, page) = (o.duration, o.common.timeout, o.page_size);
        callers.push(tokio::spawn(async move {
            let mut c = Clients::new(ch);
            // Untimed: the connection is up and warm before the phase starts.
            let _ = c.call(rpc, limit, page).await;
            start.wait().await;
            let t0 = Instant::now();
            let mut tally = Tally::default();
            while t0.elapsed() < duration {
                let (d, r) = c.call(rpc, limit, page).await;
                progress.add(r.is_ok());
                match r {
                    Ok(()) => tally.ok(d),
                    Err(f) => tally.err(f.code),
                }
            }
            (tally, t0.elapsed())
        }));
    }
    let mut all = Tally::default();
    let mut secs = 0f64;
    for c in callers {
        match c.await {
            Ok((tally, took)) => {
                all.merge(&tally);
                secs = secs.max(took.as_secs_f64());
            }
            Err(e) => all.err(if e.is_panic() { "PANIC" } else { "CANCELLED" }),
        }
    }
    all.stats(rpc.name(), secs)
}

/// A step of a lifecycle, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Create,
    ControllerPublish,
    Stage,
    Publish,
    WriteRead,
    Unpublish,
    Unstage,
    ControllerUnpublish,
    Delete,
}

impl Step {
    const ALL: [Step; 9] = [
        Step::Create,
        Step::ControllerPublish,
        Step::Stage,
        Step::Publish,
        Step::WriteRead,
        Step::Unpublish,
        Step::Unstage,
        Step::ControllerUnpublish,
        Step::Delete,
    ];

    fn name(self) -> &'static str {
        match self {
            Step::Create => "CreateVolume",
            Step::ControllerPublish => "ControllerPublishVolume",
            Step::Stage => "NodeStageVolume",
            Step::Publish => "NodePublishVolume",
            Step::WriteRead => "write+read",
            Step::Unpublish => "NodeUnpublishVolume",
            Step::Unstage => "NodeUnstageVolume",
            Step::ControllerUnpublish => "ControllerUnpublishVolume",
            Step::Delete => "DeleteVolume",
        }
    }
}

/// Which optional steps the endpoint takes, and where.
#[derive(Debug, Clone, Default)]
struct Flow {
    controller_publish: bool,
    stage: bool,
    node_id: String,
    topology: Option<csi::Topology>,
}

/// Everything a lifecycle worker needs, shared by all workers of an endpoint.
struct Plan {
    flow: Flow,
    cap: csi::VolumeCapability,
    block: bool,
    size: i64,
    params: HashMap<String, String>,
    staging_dir: PathBuf,
    target_dir: PathBuf,
    limit: Duration,
    run_id: String,
    count: Option<u64>,
    deadline: Option<Instant>,
    next: AtomicU64,
    stop: Arc<AtomicBool>,
    progress: Arc<Progress>,
}

/// What one worker measured.
#[derive(Debug, Clone)]
struct WorkerResult {
    steps: Vec<Tally>,
    e2e: Histogram,
    started: u64,
    completed: u64,
    failed: u64,
    cleaned_up: u64,
    left_behind: Vec<String>,
}

impl Default for WorkerResult {
    fn default() -> Self {
        WorkerResult {
            steps: vec![Tally::default(); Step::ALL.len()],
            e2e: Histogram::new(),
            started: 0,
            completed: 0,
            failed: 0,
            cleaned_up: 0,
            left_behind: Vec::new(),
        }
    }
}

impl WorkerResult {
    fn merge(&mut self, o: &WorkerResult) {
        for (a, b) in self.steps.iter_mut().zip(&o.steps) {
            a.merge(b);
        }
        self.e2e.merge(&o.e2e);
        self.started += o.started;
        self.completed += o.completed;
        self.failed += o.failed;
        self.cleaned_up += o.cleaned_up;
        self.left_behind.extend(o.left_behind.iter().cloned());
    }

    /// Records a step's outcome; `Err(())` ends the lifecycle.
    fn record<T>(&mut self, step: Step, (d, r): (Duration, Result<T, Failure>)) -> Result<T, ()> {
        let tally = &mut self.steps[step as usize];
        match r {
            Ok(v) => {
                tally.ok(d);
                Ok(v)
            }
            Err(f) => {
                tally.err(f.code);
                Err(())
            }
        }
    }
}

/// `drivelet bench lifecycle`: every endpoint in turn.
pub async fn run_lifecycle(o: &LifecycleOptions) -> Result<Report, BenchError> {
    check_common(&o.common)?;
    let size = i64::try_from(o.size).map_err(|_| BenchError::Usage(format!("--size {} is too large", o.size)))?;
    let cap = o.access.capability().map_err(|e| BenchError::Usage(e.to_string()))?;
    for d in [&o.staging_dir, &o.target_dir] {
        std::fs::create_dir_all(d).map_err(|e| BenchError::Dir { path: d.clone(), reason: e.to_string() })?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let on_signal = stop.clone();
    let signals = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_signal.store(true, Ordering::Relaxed);
            eprintln!("\nstopping: no new lifecycles; those in flight finish and clean up");
        }
    });
    let mut endpoints = Vec::new();
    for t in &o.common.endpoints {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        match lifecycle_endpoint(o, t, cap.clone(), size, stop.clone()).await {
            Ok(r) => endpoints.push(r),
            Err(e) => {
                signals.abort();
                return Err(e);
            }
        }
    }
    signals.abort();
    Ok(Report {
        mode: "lifecycle".into(),
        concurrency: o.common.concurrency,
        connections: o.common.connections.as_str().into(),
        duration_s: o.count.is_none().then_some(o.duration.as_secs_f64()),
        count: o.count,
        endpoints,
    })
}

/// What the endpoint does and where this node is.
async fn discover(c: &mut Clients, t: &Target, limit: Duration) -> Result<Flow, BenchError> {
    let ctrl = controller_caps(c, limit).await;
    if !ctrl.contains(&CtrlCap::CreateDeleteVolume) {
        return Err(BenchError::Unsupported {
            label: t.label.clone(),
            reason: "CREATE_DELETE_VOLUME is not advertised: the endpoint cannot create volumes".into(),
        });
    }
    let (_, r) = timed(limit, c.node.node_get_capabilities(csi::NodeGetCapabilitiesRequest {})).await;
    let node_caps: HashSet<NodeCap> = r
        .map_err(setup_err(t, "NodeGetCapabilities"))?
        .capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(csi::node_service_capability::Type::Rpc(r)) => NodeCap::try_from(r.r#type).ok(),
            _ => None,
        })
        .collect();
    let (_, r) = timed(limit, c.node.node_get_info(csi::NodeGetInfoRequest {})).await;
    let info = r.map_err(setup_err(t, "NodeGetInfo"))?;
    Ok(Flow {
        controller_publish: ctrl.contains(&CtrlCap::PublishUnpublishVolume),
        stage: node_caps.contains(&NodeCap::StageUnstageVolume),
        node_id: info.node_id,
        topology: info.accessible_topology.filter(|t| !t.segments.is_empty()),
    })
}

async fn lifecycle_endpoint(
    o: &LifecycleOptions,
    t: &Target,
    cap: csi::VolumeCapability,
    size: i64,
    stop: Arc<AtomicBool>,
) -> Result<EndpointReport, BenchError> {
    let chans = channels(t, o.common.concurrency, o.common.connections).await?;
    let mut first = Clients::new(chans[0].clone());
    let driver = driver_name(&mut first, t, o.common.timeout).await?;
    let flow = discover(&mut first, t, o.common.timeout).await?;
    let progress = Arc::new(Progress::default());
    let t0 = Instant::now();
    let plan = Arc::new(Plan {
        flow,
        cap,
        block: o.access.block,
        size,
        params: o.params.clone(),
        staging_dir: o.staging_dir.clone(),
        target_dir: o.target_dir.clone(),
        limit: o.common.timeout,
        run_id: uuid::Uuid::new_v4().simple().to_string().chars().take(8).collect(),
        count: o.count,
        deadline: o.count.is_none().then(|| t0 + o.duration),
        next: AtomicU64::new(0),
        stop,
        progress: progress.clone(),
    });
    let ticker = Ticker::start(format!("{} lifecycles", t.label), "done", progress);
    let workers: Vec<_> = chans.into_iter().map(|ch| tokio::spawn(worker(ch, plan.clone()))).collect();
    let mut all = WorkerResult::default();
    for w in workers {
        match w.await {
            Ok(r) => all.merge(&r),
            Err(e) => all.left_behind.push(format!("(a worker {}; its volume may remain)", if e.is_panic() { "panicked" } else { "was cancelled" })),
        }
    }
    drop(ticker);
    let secs = t0.elapsed().as_secs_f64();
    let mut rep = EndpointReport {
        label: t.label.clone(),
        endpoint: t.path.display().to_string(),
        driver,
        elapsed_s: secs,
        ..Default::default()
    };
    for step in Step::ALL {
        let skipped = match step {
            Step::ControllerPublish | Step::ControllerUnpublish if !plan.flow.controller_publish => {
                Some("PUBLISH_UNPUBLISH_VOLUME is not advertised")
            }
            Step::Stage | Step::Unstage if !plan.flow.stage => Some("STAGE_UNSTAGE_VOLUME is not advertised"),
            _ => None,
        };
        match skipped {
            Some(reason) => rep.skipped.push(Skipped { name: step.name().into(), reason: reason.into() }),
            None => rep.calls.push(all.steps[step as usize].stats(step.name(), secs)),
        }
    }
    rep.errors = rep.calls.iter().map(|c| c.errors).sum();
    rep.lifecycles = Some(LifecycleStats {
        started: all.started,
        completed: all.completed,
        failed: all.failed,
        per_s: if secs > 0.0 { ((all.completed as f64 / secs) * 100.0).round() / 100.0 } else { 0.0 },
        latency: Latency::of(&all.e2e),
        cleaned_up: all.cleaned_up,
        left_behind: all.left_behind,
    });
    Ok(rep)
}

async fn worker(ch: Channel, p: Arc<Plan>) -> WorkerResult {
    let mut c = Clients::new(ch);
    let mut w = WorkerResult::default();
    loop {
        if p.stop.load(Ordering::Relaxed) || p.deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let i = p.next.fetch_add(1, Ordering::Relaxed);
        if p.count.is_some_and(|n| i >= n) {
            break;
        }
        w.started += 1;
        let ok = one_lifecycle(&mut c, &p, i, &mut w).await;
        p.progress.add(ok);
    }
    w
}

/// What a lifecycle has (or may have) applied so far: what the clean-up must undo.
#[derive(Debug, Default)]
struct Applied {
    /// CreateVolume was sent.
    create_sent: bool,
    /// The volume id, once known.
    id: Option<String>,
    controller_published: bool,
    staged: bool,
    published: bool,
}

/// The paths of lifecycle `name`.
struct Paths {
    staging: PathBuf,
    target_parent: PathBuf,
    target: PathBuf,
}

impl Paths {
    fn of(p: &Plan, name: &str) -> Paths {
        let target_parent = p.target_dir.join(name);
        let target = target_parent.join(if p.block { "dev" } else { "mnt" });
        Paths { staging: p.staging_dir.join(name), target_parent, target }
    }

    /// Removes what the bench made, when empty; never anything with data in it.
    fn remove(&self) {
        let _ = std::fs::remove_dir(&self.target);
        if std::fs::symlink_metadata(&self.target).is_ok_and(|m| m.is_file() && m.len() == 0) {
            let _ = std::fs::remove_file(&self.target);
        }
        let _ = std::fs::remove_dir(&self.target_parent);
        let _ = std::fs::remove_dir(&self.staging);
    }
}

/// Runs lifecycle `i`; a failed one is cleaned up. True when every step succeeded.
async fn one_lifecycle(c: &mut Clients, p: &Plan, i: u64, w: &mut WorkerResult) -> bool {
    let name = format!("bench-{}-{i}", p.run_id);
    let paths = Paths::of(p, &name);
    let mut applied = Applied::default();
    let t0 = Instant::now();
    let ok = steps(c, p, &name, &paths, &mut applied, w).await.is_ok();
    if ok {
        w.e2e.record(t0.elapsed());
        w.completed += 1;
    } else {
        w.failed += 1;
        clean_up(c, p, &name, &paths, applied, w).await;
    }
    paths.remove();
    ok
}

fn mkdir(step: Step, dir: &Path, w: &mut WorkerResult) -> Result<(), ()> {
    std::fs::create_dir_all(dir).map_err(|_| w.steps[step as usize].err("IO"))
}

async fn steps(c: &mut Clients, p: &Plan, name: &str, paths: &Paths, a: &mut Applied, w: &mut WorkerResult) -> Result<(), ()> {
    let limit = p.limit;
    let topology = p.flow.topology.clone().map(|t| csi::TopologyRequirement { requisite: vec![t.clone()], preferred: vec![t] });
    let create = csi::CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: Some(csi::CapacityRange { required_bytes: p.size, limit_bytes: 0 }),
        volume_capabilities: vec![p.cap.clone()],
        parameters: p.params.clone(),
        accessibility_requirements: topology,
        ..Default::default()
    };
    a.create_sent = true;
    let vol = w.record(Step::Create, timed(limit, c.ctrl.create_volume(create)).await)?.volume.unwrap_or_default();
    if vol.volume_id.is_empty() {
        w.steps[Step::Create as usize].err("EMPTY_VOLUME_ID");
        return Err(());
    }
    let id = vol.volume_id;
    a.id = Some(id.clone());
    let vctx = vol.volume_context;
    let mut pctx = HashMap::new();
    if p.flow.controller_publish {
        a.controller_published = true;
        let req = csi::ControllerPublishVolumeRequest {
            volume_id: id.clone(),
            node_id: p.flow.node_id.clone(),
            volume_capability: Some(p.cap.clone()),
            readonly: false,
            volume_context: vctx.clone(),
            ..Default::default()
        };
        pctx = w.record(Step::ControllerPublish, timed(limit, c.ctrl.controller_publish_volume(req)).await)?.publish_context;
    }
    let staging = if p.flow.stage { paths.staging.display().to_string() } else { String::new() };
    if p.flow.stage {
        mkdir(Step::Stage, &paths.staging, w)?;
        a.staged = true;
        let req = csi::NodeStageVolumeRequest {
            volume_id: id.clone(),
            publish_context: pctx.clone(),
            staging_target_path: staging.clone(),
            volume_capability: Some(p.cap.clone()),
            volume_context: vctx.clone(),
            ..Default::default()
        };
        w.record(Step::Stage, timed(limit, c.node.node_stage_volume(req)).await)?;
    }
    mkdir(Step::Publish, &paths.target_parent, w)?;
    a.published = true;
    let req = csi::NodePublishVolumeRequest {
        volume_id: id.clone(),
        publish_context: pctx,
        staging_target_path: staging.clone(),
        target_path: paths.target.display().to_string(),
        volume_capability: Some(p.cap.clone()),
        readonly: false,
        volume_context: vctx,
        ..Default::default()
    };
    w.record(Step::Publish, timed(limit, c.node.node_publish_volume(req)).await)?;

    let (target, block, seed) = (paths.target.clone(), p.block, name.to_string());
    let t0 = Instant::now();
    let io = tokio::task::spawn_blocking(move || write_and_read(&target, block, &seed))
        .await
        .unwrap_or_else(|e| Err(Failure { code: "IO", message: e.to_string() }));
    w.record(Step::WriteRead, (t0.elapsed(), io))?;

    let req = csi::NodeUnpublishVolumeRequest { volume_id: id.clone(), target_path: paths.target.display().to_string() };
    w.record(Step::Unpublish, timed(limit, c.node.node_unpublish_volume(req)).await)?;
    a.published = false;
    if p.flow.stage {
        let req = csi::NodeUnstageVolumeRequest { volume_id: id.clone(), staging_target_path: staging };
        w.record(Step::Unstage, timed(limit, c.node.node_unstage_volume(req)).await)?;
        a.staged = false;
    }
    if p.flow.controller_publish {
        let req = csi::ControllerUnpublishVolumeRequest { volume_id: id.clone(), node_id: p.flow.node_id.clone(), ..Default::default() };
        w.record(Step::ControllerUnpublish, timed(limit, c.ctrl.controller_unpublish_volume(req)).await)?;
        a.controller_published = false;
    }
    let req = csi::DeleteVolumeRequest { volume_id: id, ..Default::default() };
    w.record(Step::Delete, timed(limit, c.ctrl.delete_volume(req)).await)?;
    a.id = None;
    a.create_sent = false;
    Ok(())
}

/// Writes 4 KiB through the target path and reads them back: a file in the mounted
/// filesystem, or the first 4 KiB of a block volume.
fn write_and_read(target: &Path, block: bool, seed: &str) -> Result<(), Failure> {
    use std::io::{Read as _, Write as _};
    use std::os::unix::fs::FileExt as _;
    let io = |what: &str, e: std::io::Error| Failure { code: "IO", message: format!("{what} {}: {e}", target.display()) };
    let data: Vec<u8> = seed.bytes().chain(std::iter::once(b'\n')).cycle().take(4096).collect();
    let mut back = vec![0u8; data.len()];
    if block {
        let f = std::fs::OpenOptions::new().read(true).write(true).open(target).map_err(|e| io("open", e))?;
        f.write_all_at(&data, 0).map_err(|e| io("write", e))?;
        f.sync_data().map_err(|e| io("sync", e))?;
        f.read_exact_at(&mut back, 0).map_err(|e| io("read", e))?;
    } else {
        let file = target.join("drivelet-bench.dat");
        let mut f = std::fs::File::create(&file).map_err(|e| io("create a file in", e))?;
        f.write_all(&data).map_err(|e| io("write", e))?;
        f.sync_all().map_err(|e| io("sync", e))?;
        drop(f);
        std::fs::File::open(&file).and_then(|mut f| f.read_exact(&mut back)).map_err(|e| io("read", e))?;
        std::fs::remove_file(&file).map_err(|e| io("remove the file in", e))?;
    }
    if back != data {
        return Err(Failure { code: "DATA_MISMATCH", message: format!("{}: read back other bytes than written", target.display()) });
    }
    Ok(())
}

/// Attempts per clean-up call.
const CLEANUP_TRIES: u32 = 4;

/// A clean-up call is done when it succeeded or the thing is gone already.
fn settled<T>(r: &Result<Result<tonic::Response<T>, tonic::Status>, tokio::time::error::Elapsed>) -> bool {
    matches!(r, Ok(Ok(_))) || matches!(r, Ok(Err(s)) if s.code() == Code::NotFound)
}

/// Retries a clean-up call with backoff (0.25, 0.5, 1 s); true once it settled.
macro_rules! retry {
    ($limit:expr, $call:expr) => {{
        let mut done = false;
        for attempt in 0..CLEANUP_TRIES {
            let r = tokio::time::timeout($limit, $call).await;
            if settled(&r) {
                done = true;
                break;
            }
            if attempt + 1 < CLEANUP_TRIES {
                tokio::time::sleep(Duration::from_millis(250 << attempt)).await;
            }
        }
        done
    }};
}

/// Undoes what a failed lifecycle applied, best effort, and deletes its volume.
async fn clean_up(c: &mut Clients, p: &Plan, name: &str, paths: &Paths, mut a: Applied, w: &mut WorkerResult) {
    let limit = p.limit;
    if a.id.is_none() && a.create_sent {
        // The answer to CreateVolume was lost or an error that may hide a volume made
        // anyway: ask again (CreateVolume is idempotent by name) to learn its id.
        let create = csi::CreateVolumeRequest {
            name: name.to_string(),
            capacity_range: Some(csi::CapacityRange { required_bytes: p.size, limit_bytes: 0 }),
            volume_capabilities: vec![p.cap.clone()],
            parameters: p.params.clone(),
            accessibility_requirements: p
                .flow
                .topology
                .clone()
                .map(|t| csi::TopologyRequirement { requisite: vec![t.clone()], preferred: vec![t] }),
            ..Default::default()
        };
        for attempt in 0..CLEANUP_TRIES {
            match tokio::time::timeout(limit, c.ctrl.create_volume(create.clone())).await {
                Ok(Ok(r)) => {
                    a.id = r.into_inner().volume.map(|v| v.volume_id).filter(|id| !id.is_empty());
                    break;
                }
                // Refused outright: nothing was made.
                Ok(Err(s))
                    if matches!(
                        s.code(),
                        Code::InvalidArgument
                            | Code::AlreadyExists
                            | Code::ResourceExhausted
                            | Code::OutOfRange
                            | Code::Unimplemented
                            | Code::PermissionDenied
                            | Code::FailedPrecondition
                    ) =>
                {
                    break
                }
                _ => tokio::time::sleep(Duration::from_millis(250 << attempt)).await,
            }
        }
        if a.id.is_none() {
            return;
        }
    }
    let Some(id) = a.id.clone() else { return };
    if a.published {
        let req = csi::NodeUnpublishVolumeRequest { volume_id: id.clone(), target_path: paths.target.display().to_string() };
        retry!(limit, c.node.node_unpublish_volume(req.clone()));
    }
    if a.staged {
        let req = csi::NodeUnstageVolumeRequest { volume_id: id.clone(), staging_target_path: paths.staging.display().to_string() };
        retry!(limit, c.node.node_unstage_volume(req.clone()));
    }
    if a.controller_published {
        let req = csi::ControllerUnpublishVolumeRequest { volume_id: id.clone(), node_id: p.flow.node_id.clone(), ..Default::default() };
        retry!(limit, c.ctrl.controller_unpublish_volume(req.clone()));
    }
    let req = csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() };
    if retry!(limit, c.ctrl.delete_volume(req.clone())) {
        w.cleaned_up += 1;
    } else {
        w.left_behind.push(id);
    }
}

#[cfg(test)]
mod tests {
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
