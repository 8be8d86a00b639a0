//! `drivelet bench lifecycle`: whole volume lifecycles as a container orchestrator
//! runs them (create, controller publish, stage, publish, write and read back, then the
//! inverse calls), each failed one cleaned up at once, best effort with retries (see the
//! rules of [`super`]).

use super::*;

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
pub(super) fn write_and_read(target: &Path, block: bool, seed: &str) -> Result<(), Failure> {
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
