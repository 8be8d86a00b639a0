//! The ResizeQueue actor: the external-resizer's controller loop, in process, beside the
//! attach queue and built like it. It watches PersistentVolumeClaims and
//! PersistentVolumes, keeps the PVs this driver has on this node and the claims bound to
//! a PV, and runs [`plan`](super::plan) for each such claim through a [`WorkQueue`];
//! [`Executor`] writes the claim, the PV and the Events, and the volume side is the
//! VolumeManager, asked by message ([`ManagerBackend`]).
//!
//! Rules:
//! - The API server has no field selector for a PV's driver or node, nor for a claim's
//!   size, so both watches are cluster-wide and filtered on arrival: PVs are kept only
//!   when [`our_volume`](super::our_volume) names a volume, claims only when bound to a
//!   PV, both stripped to what the decisions read.
//! - A watch (re)start lists everything again; the listed set replaces the kept one at
//!   `InitDone` and every claim of a kept PV is queued, so a request made while the
//!   watch was down is not lost. `resync_interval` queues them all again.
//! - A claim is queued when a change matters to the decisions
//!   ([`claim_differs`](super::claim_differs)): never for the resizer's own status
//!   writes, so a failure waits out its delay and never spins on its own write. A kept
//!   PV's change queues its claim.
//! - Nothing runs before both watches have listed and the volume manager is ready; a
//!   volume the volume manager does not know is left alone (another node's, or not
//!   created here).
//! - The slow set and the final-error set of external-resizer live here, in memory: a
//!   claim seen `ControllerResizeInfeasible` does not retry the same size for
//!   `RetryPolicy::terminal`; after a restart both are empty (as after external-resizer's).
//! - At most `WORKERS` claims run at once, one run per claim; API errors retry with
//!   backoff.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use actix::prelude::*;
use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus, PersistentVolumeSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Client, Resource, ResourceExt};
use serde_json::Value;
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tracing::{debug, info, warn};

use super::{
    claim_differs, failed_patch, finished_patch, in_progress_patch, node_pending_patch, our_volume, plan, pv_capacity_patch,
    quantity_of, resize_status, retry_after, Expansion, Failure, Observed, Plan, CONTROLLER_INFEASIBLE,
};
use crate::actors::volumes::model::CapacityRange;
use crate::actors::volumes::{ExpandVolume, GetVolume, VolumeError, VolumeManager, WaitReady};
use crate::backoff::backoff;
use crate::config::human_bytes;
use crate::k8s::attach::RetryPolicy;
use crate::k8s::identity::Identity;
use crate::k8s::workqueue::{Outcome, WorkQueue};

#[cfg(test)]
#[path = "fake_api_tests.rs"]
mod fake_api_tests;

/// How many claims are worked on at once.
pub const WORKERS: usize = 2;

/// How long to wait before asking the volume manager for its readiness again.
pub const READY_RETRY: Duration = Duration::from_secs(1);

/// The volume side of resizing.
pub trait ResizeBackend: Clone + Unpin + 'static {
    /// Whether the volume manager knows the volume; `Err` when it cannot tell now.
    fn known(&self, volume_id: &str) -> impl Future<Output = Result<bool, String>> + Send;
    /// ControllerExpandVolume to at least `bytes`: the size now and whether the node must
    /// grow a filesystem, or how it failed and why in plain words.
    fn expand(&self, volume_id: &str, bytes: u64) -> impl Future<Output = Result<(u64, bool), (Failure, String)>> + Send;
    /// Resolves once the volume side is ready (start-up done).
    fn wait_ready(&self) -> impl Future<Output = ()> + Send;
}

/// The backend of a running agent: the VolumeManager actor.
#[derive(Clone)]
pub struct ManagerBackend {
    volumes: Addr<VolumeManager>,
}

impl ManagerBackend {
    /// Asks `volumes`.
    pub fn new(volumes: Addr<VolumeManager>) -> Self {
        Self { volumes }
    }
}

/// How an expansion refusal counts for the claim's status (see the module rules of
/// [`super`]): the codes external-resizer takes as infeasible, final or transient.
pub fn failure_of(e: &VolumeError) -> Failure {
    match e {
        VolumeError::OutOfRange { .. } | VolumeError::NotFound { .. } | VolumeError::InvalidArgument { .. } => Failure::Infeasible,
        VolumeError::ResourceExhausted { .. } | VolumeError::Busy { .. } | VolumeError::NotReady => Failure::Transient,
        _ => Failure::Final,
    }
}

impl ResizeBackend for ManagerBackend {
    async fn known(&self, volume_id: &str) -> Result<bool, String> {
        match self.volumes.send(GetVolume { volume_id: volume_id.to_string() }).await {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(VolumeError::NotFound { .. })) => Ok(false),
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(format!("the volume manager did not answer: {e}")),
        }
    }

    async fn expand(&self, volume_id: &str, bytes: u64) -> Result<(u64, bool), (Failure, String)> {
        let m = ExpandVolume { volume_id: volume_id.to_string(), range: CapacityRange { required: bytes, limit: 0 } };
        match self.volumes.send(m).await {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(e)) => Err((failure_of(&e), e.to_string())),
            Err(e) => Err((Failure::Transient, format!("the volume manager did not answer: {e}"))),
        }
    }

    async fn wait_ready(&self) {
        while !matches!(self.volumes.send(WaitReady).await, Ok(true)) {
            tokio::time::sleep(READY_RETRY).await;
        }
    }
}

/// Errors talking to the API server during a resize.
#[derive(Debug, thiserror::Error)]
pub enum ResizeError {
    /// A status patch of the claim failed.
    #[error("updating the status of PersistentVolumeClaim {claim}: {source}")]
    Claim {
        /// `namespace/name`.
        claim: String,
        /// The API error.
        source: kube::Error,
    },
    /// The capacity patch of the PV failed.
    #[error("updating the capacity of PersistentVolume {name}: {source}")]
    Volume {
        /// The PV.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// Recording an Event failed.
    #[error("recording an Event on PersistentVolumeClaim {claim}: {source}")]
    Event {
        /// `namespace/name`.
        claim: String,
        /// The API error.
        source: kube::Error,
    },
}

/// What a run of the executor ended with.
#[derive(Debug)]
pub struct Ran {
    /// Done, or look again after a delay.
    pub outcome: Outcome,
    /// The expansion failed with a final error.
    pub final_error: bool,
    /// The size was infeasible (the claim joins the slow set).
    pub infeasible: bool,
    /// The newest claim and PV written, to keep.
    pub pvc: PersistentVolumeClaim,
    /// The newest PV.
    pub pv: PersistentVolume,
}

/// Carries out an expansion against the API server and the volume manager.
#[derive(Clone)]
pub struct Executor {
    client: Client,
    recorder: Recorder,
    policy: RetryPolicy,
}

fn key_of(pvc: &PersistentVolumeClaim) -> String {
    format!("{}/{}", pvc.namespace().unwrap_or_default(), pvc.name_any())
}

fn now() -> String {
    serde_json::to_value(Time(Timestamp::now())).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

impl Executor {
    /// An executor writing as drivelet, Events reported by this node's instance.
    pub fn new(client: Client, identity: &Identity, policy: RetryPolicy) -> Self {
        let recorder = Recorder::new(client.clone(), identity.reporter());
        Self { client, recorder, policy }
    }

    /// Grows `pvc`'s volume as `e` says (see the rules of [`super`]); `failures` are the
    /// claim's failed runs so far.
    pub async fn run<B: ResizeBackend>(
        &self,
        pvc: PersistentVolumeClaim,
        pv: PersistentVolume,
        e: &Expansion,
        backend: &B,
        failures: u32,
    ) -> Result<Ran, ResizeError> {
        let pv_name = pv.name_any();
        let mut pvc = self.patch_claim(&pvc, in_progress_patch(&pvc, e, &now())).await?;
        let size = human_bytes(e.bytes);
        let note = format!("drivelet is growing volume {} of PersistentVolume {pv_name} to {size}", e.volume_id);
        self.event(&pvc, EventType::Normal, "Resizing", note).await?;
        match backend.expand(&e.volume_id, e.bytes).await {
            Ok((bytes, node_step)) => {
                let mut pv = pv;
                let current = pv.spec.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get(super::STORAGE)).cloned();
                let capacity = k8s_openapi::apimachinery::pkg::api::resource::Quantity(quantity_of(bytes));
                if current.as_ref() != Some(&capacity) {
                    let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
                    pv = pvs
                        .patch(&pv_name, &PatchParams::default(), &Patch::Merge(pv_capacity_patch(bytes)))
                        .await
                        .map_err(|source| ResizeError::Volume { name: pv_name.clone(), source })?;
                }
                info!(pvc.name = %key_of(&pvc), pv.name = %pv_name, volume.id = %e.volume_id, volume.size = bytes, "volume grown for its claim");
                if node_step {
                    pvc = self.patch_claim(&pvc, node_pending_patch(&pvc, &now())).await?;
                    let note = "Require file system resize of volume on node".to_string();
                    self.event(&pvc, EventType::Normal, "FileSystemResizeRequired", note).await?;
                } else {
                    pvc = self.patch_claim(&pvc, finished_patch(&pvc, &capacity)).await?;
                    self.event(&pvc, EventType::Normal, "VolumeResizeSuccessful", "Resize volume succeeded".into()).await?;
                }
                Ok(Ran { outcome: Outcome::Done, final_error: false, infeasible: false, pvc, pv })
            }
            Err((failure, reason)) => {
                let message = format!("cannot grow volume {} of PersistentVolume {pv_name} to {size}: {reason}", e.volume_id);
                warn!(pvc.name = %key_of(&pvc), pv.name = %pv_name, volume.id = %e.volume_id, ?failure, error = %reason, "volume expansion failed");
                self.event(&pvc, EventType::Warning, "VolumeResizeFailed", message.clone()).await?;
                if let Some(patch) = failed_patch(&pvc, failure, &message, &now()) {
                    pvc = self.patch_claim(&pvc, patch).await?;
                }
                let outcome = Outcome::Retry(retry_after(failure, failures, &self.policy));
                Ok(Ran {
                    outcome,
                    final_error: failure != Failure::Transient,
                    infeasible: failure == Failure::Infeasible,
                    pvc,
                    pv,
                })
            }
        }
    }

    async fn patch_claim(&self, pvc: &PersistentVolumeClaim, patch: Value) -> Result<PersistentVolumeClaim, ResizeError> {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &pvc.namespace().unwrap_or_default());
        api.patch_status(&pvc.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|source| ResizeError::Claim { claim: key_of(pvc), source })
    }

    async fn event(&self, pvc: &PersistentVolumeClaim, type_: EventType, reason: &str, note: String) -> Result<(), ResizeError> {
        let event = KubeEvent { type_, reason: reason.to_string(), note: Some(note), action: "Resize".to_string(), secondary: None };
        self.recorder.publish(&event, &pvc.object_ref(&())).await.map_err(|source| ResizeError::Event { claim: key_of(pvc), source })
    }
}

/// Settings of the queue.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// Driver and node.
    pub identity: Identity,
    /// Backoff, and the slow-set delay of an infeasible size (`terminal`).
    pub policy: RetryPolicy,
    /// Queue every claim again this often (`Duration::ZERO`: never).
    pub resync: Duration,
}

/// Counters for observation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, MessageResponse)]
pub struct ResizeStats {
    /// Claims bound to a kept PV.
    pub claims: usize,
    /// Keys waiting to run.
    pub waiting: usize,
    /// Keys running.
    pub running: usize,
    /// Runs that ended in a retry, since start.
    pub retries: u64,
}

/// Query: the queue's counters.
#[derive(Message)]
#[rtype(result = "ResizeStats")]
pub struct GetResizeStats;

/// The resize queue actor; see the module rules.
pub struct ResizeQueue<B: ResizeBackend> {
    client: Client,
    cfg: QueueConfig,
    backend: B,
    executor: Executor,
    /// Claims bound to some PV, by `namespace/name`, stripped.
    pvcs: BTreeMap<String, PersistentVolumeClaim>,
    /// This driver's PVs on this node, by name, stripped.
    pvs: BTreeMap<String, PersistentVolume>,
    pvc_relist: Option<BTreeMap<String, PersistentVolumeClaim>>,
    pv_relist: Option<BTreeMap<String, PersistentVolume>>,
    queue: WorkQueue<String>,
    wake: Option<SpawnHandle>,
    synced: (bool, bool),
    backend_ready: bool,
    /// Claims whose last expansion ended with a final error.
    final_errors: BTreeSet<String>,
    /// Claims whose size was infeasible, until when it is not tried again.
    slow: BTreeMap<String, Instant>,
    stats: ResizeStats,
}

/// A claim stripped to what the decisions read.
fn slim_pvc(pvc: PersistentVolumeClaim) -> PersistentVolumeClaim {
    let spec = pvc.spec.map(|s| PersistentVolumeClaimSpec { resources: s.resources, volume_name: s.volume_name, ..Default::default() });
    let status = pvc.status.map(|s| PersistentVolumeClaimStatus {
        phase: s.phase,
        capacity: s.capacity,
        conditions: s.conditions,
        allocated_resources: s.allocated_resources,
        allocated_resource_statuses: s.allocated_resource_statuses,
        ..Default::default()
    });
    let m = pvc.metadata;
    let metadata = ObjectMeta { name: m.name, namespace: m.namespace, uid: m.uid, resource_version: m.resource_version, ..Default::default() };
    PersistentVolumeClaim { metadata, spec, status }
}

/// A PV stripped to what the decisions read.
fn slim_pv(pv: PersistentVolume) -> PersistentVolume {
    let spec = pv.spec.map(|s| PersistentVolumeSpec {
        csi: s.csi,
        capacity: s.capacity,
        claim_ref: s.claim_ref,
        node_affinity: s.node_affinity,
        volume_mode: s.volume_mode,
        ..Default::default()
    });
    let m = pv.metadata;
    let metadata = ObjectMeta { name: m.name, uid: m.uid, resource_version: m.resource_version, ..Default::default() };
    PersistentVolume { metadata, spec, status: None }
}

fn bound_pv(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()).filter(|n| !n.is_empty())
}

impl<B: ResizeBackend> ResizeQueue<B> {
    /// A queue talking to `client`, growing volumes through `backend`.
    pub fn new(client: Client, cfg: QueueConfig, backend: B) -> Self {
        let executor = Executor::new(client.clone(), &cfg.identity, cfg.policy);
        Self {
            client,
            cfg,
            backend,
            executor,
            pvcs: BTreeMap::new(),
            pvs: BTreeMap::new(),
            pvc_relist: None,
            pv_relist: None,
            queue: WorkQueue::new(),
            wake: None,
            synced: (false, false),
            backend_ready: false,
            final_errors: BTreeSet::new(),
            slow: BTreeMap::new(),
            stats: ResizeStats::default(),
        }
    }

    fn runnable(&self) -> bool {
        self.synced == (true, true) && self.backend_ready
    }

    fn ours(&self, pvc: &PersistentVolumeClaim) -> bool {
        bound_pv(pvc).is_some_and(|n| self.pvs.contains_key(n))
    }

    fn on_pvc(&mut self, event: Event<PersistentVolumeClaim>) {
        let now = Instant::now();
        match event {
            Event::Init => self.pvc_relist = Some(BTreeMap::new()),
            Event::InitApply(pvc) => {
                if let (Some(list), true) = (self.pvc_relist.as_mut(), bound_pv(&pvc).is_some()) {
                    list.insert(key_of(&pvc), slim_pvc(pvc));
                }
            }
            Event::InitDone => {
                if let Some(list) = self.pvc_relist.take() {
                    self.pvcs = list;
                }
                self.synced.0 = true;
                self.queue_all(now);
            }
            Event::Apply(pvc) => {
                let key = key_of(&pvc);
                if bound_pv(&pvc).is_none() {
                    self.pvcs.remove(&key);
                    return;
                }
                let pvc = slim_pvc(pvc);
                let changed = self.pvcs.get(&key).is_none_or(|old| claim_differs(old, &pvc));
                let ours = self.ours(&pvc);
                self.pvcs.insert(key.clone(), pvc);
                if changed && ours {
                    self.queue.add(key, now);
                }
            }
            Event::Delete(pvc) => {
                let key = key_of(&pvc);
                self.pvcs.remove(&key);
                self.queue.forget(&key);
                self.final_errors.remove(&key);
                self.slow.remove(&key);
            }
        }
    }

    fn on_pv(&mut self, event: Event<PersistentVolume>) {
        let now = Instant::now();
        let id = self.cfg.identity.clone();
        match event {
            Event::Init => self.pv_relist = Some(BTreeMap::new()),
            Event::InitApply(pv) => {
                if let (Some(list), Some(_)) = (self.pv_relist.as_mut(), our_volume(&pv, &id)) {
                    list.insert(pv.name_any(), slim_pv(pv));
                }
            }
            Event::InitDone => {
                if let Some(list) = self.pv_relist.take() {
                    self.pvs = list;
                }
                self.synced.1 = true;
                self.queue_all(now);
            }
            Event::Apply(pv) => {
                let name = pv.name_any();
                if our_volume(&pv, &id).is_none() {
                    self.pvs.remove(&name);
                    return;
                }
                let pv = slim_pv(pv);
                let changed = self.pvs.get(&name).is_none_or(|old| old.spec != pv.spec);
                self.pvs.insert(name.clone(), pv);
                if changed {
                    let users: Vec<String> =
                        self.pvcs.iter().filter(|(_, c)| bound_pv(c) == Some(name.as_str())).map(|(k, _)| k.clone()).collect();
                    for k in users {
                        self.queue.add(k, now);
                    }
                }
            }
            Event::Delete(pv) => {
                self.pvs.remove(&pv.name_any());
            }
        }
    }

    fn queue_all(&mut self, now: Instant) {
        let keys: Vec<String> = self.pvcs.iter().filter(|(_, c)| self.ours(c)).map(|(k, _)| k.clone()).collect();
        for k in keys {
            self.queue.add(k, now);
        }
    }

    /// Start every due key there is a worker for, and wake up when the next one is due.
    fn kick(&mut self, ctx: &mut Context<Self>) {
        let now = Instant::now();
        while self.runnable() && self.queue.running() < WORKERS {
            let Some((key, failures)) = self.queue.pop(now) else { break };
            self.start(key, failures, ctx);
        }
        if let Some(h) = self.wake.take() {
            ctx.cancel_future(h);
        }
        if self.runnable() && self.queue.running() < WORKERS {
            if let Some(at) = self.queue.next_due() {
                self.wake = Some(ctx.run_later(at.saturating_duration_since(now), |act, ctx| {
                    act.wake = None;
                    act.kick(ctx);
                }));
            }
        }
        self.stats.claims = self.pvcs.values().filter(|c| self.ours(c)).count();
        self.stats.waiting = self.queue.waiting();
        self.stats.running = self.queue.running();
    }

    /// The time an infeasible size of `key` must still wait, entering the slow set when
    /// the claim says its size was infeasible (external-resizer's `markForSlowRetry`).
    fn slow_left(&mut self, key: &str, pvc: &PersistentVolumeClaim, now: Instant) -> Option<Duration> {
        if resize_status(pvc) == CONTROLLER_INFEASIBLE && !self.slow.contains_key(key) {
            self.slow.insert(key.to_string(), now + self.cfg.policy.terminal);
        }
        let left = self.slow.get(key).map(|until| until.saturating_duration_since(now)).filter(|d| !d.is_zero());
        if left.is_none() {
            self.slow.remove(key);
        }
        left
    }

    fn start(&mut self, key: String, failures: u32, ctx: &mut Context<Self>) {
        let now = Instant::now();
        let found = self.pvcs.get(&key).cloned().and_then(|c| Some((self.pvs.get(bound_pv(&c)?)?.clone(), c)));
        let Some((pv, pvc)) = found else {
            self.queue.finish(&key, Outcome::Done, now);
            return;
        };
        let slow_left = self.slow_left(&key, &pvc, now);
        let obs = Observed { pvc: &pvc, pv: &pv, final_error: self.final_errors.contains(&key), slow_left };
        let expansion = match plan(&obs, &self.cfg.identity) {
            Plan::Nothing(why) => {
                debug!(pvc.name = %key, why, "no resize");
                self.queue.finish(&key, Outcome::Done, now);
                return;
            }
            Plan::Wait(after) => {
                debug!(pvc.name = %key, retry.after_ms = after.as_millis() as u64, "infeasible size; waiting before trying it again");
                self.queue.finish(&key, Outcome::Retry(after), now);
                return;
            }
            Plan::Expand(e) => e,
        };
        let (backend, executor, policy) = (self.backend.clone(), self.executor.clone(), self.cfg.policy);
        let work = async move {
            match backend.known(&expansion.volume_id).await {
                Ok(true) => {}
                Ok(false) => {
                    debug!(pvc.name = %key_of(&pvc), volume.id = %expansion.volume_id, "volume unknown to the volume manager; not resizing");
                    return None;
                }
                Err(e) => {
                    warn!(pvc.name = %key_of(&pvc), error = %e, "volume manager not ready for this claim; retrying");
                    return Some(Err(backoff(failures, policy.base, policy.cap)));
                }
            }
            match executor.run(pvc, pv, &expansion, &backend, failures).await {
                Ok(ran) => Some(Ok(ran)),
                Err(e) => {
                    warn!(error = %e, failures = failures + 1, "cannot update the API server; retrying");
                    Some(Err(backoff(failures, policy.base, policy.cap)))
                }
            }
        };
        ctx.spawn(work.into_actor(self).map(move |res, act, ctx| {
            let outcome = match res {
                None => Outcome::Done,
                Some(Err(after)) => Outcome::Retry(after),
                Some(Ok(ran)) => {
                    if ran.final_error {
                        act.final_errors.insert(key.clone());
                    } else {
                        act.final_errors.remove(&key);
                    }
                    if ran.infeasible {
                        act.slow.insert(key.clone(), Instant::now() + act.cfg.policy.terminal);
                    } else {
                        act.slow.remove(&key);
                    }
                    // Keep what was written, so a rerun before the watch catches up
                    // does not act on the old objects.
                    if act.pvcs.contains_key(&key) {
                        act.pvcs.insert(key.clone(), slim_pvc(ran.pvc));
                    }
                    let name = ran.pv.name_any();
                    if act.pvs.contains_key(&name) {
                        act.pvs.insert(name, slim_pv(ran.pv));
                    }
                    ran.outcome
                }
            };
            if matches!(outcome, Outcome::Retry(_)) {
                act.stats.retries += 1;
            }
            act.queue.finish(&key, outcome, Instant::now());
            act.kick(ctx);
        }));
    }
}

impl<B: ResizeBackend> Actor for ResizeQueue<B> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let cfg = watcher::Config::default();
        let pvcs: Api<PersistentVolumeClaim> = Api::all(self.client.clone());
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        ctx.add_stream(watcher(pvcs, cfg.clone()).default_backoff().map(WatchItem::Pvc));
        ctx.add_stream(watcher(pvs, cfg).default_backoff().map(WatchItem::Pv));
        if self.cfg.resync > Duration::ZERO {
            ctx.run_interval(self.cfg.resync, |act, ctx| {
                act.queue_all(Instant::now());
                act.kick(ctx);
            });
        }
        let backend = self.backend.clone();
        ctx.spawn(async move { backend.wait_ready().await }.into_actor(self).map(|(), act, ctx| {
            act.backend_ready = true;
            act.kick(ctx);
        }));
        info!(driver.name = %self.cfg.identity.driver, node.name = %self.cfg.identity.node, "resize queue started");
    }
}

impl<B: ResizeBackend> Supervised for ResizeQueue<B> {
    fn restarting(&mut self, _: &mut Context<Self>) {
        warn!(actor = "resize", "restarting the resize queue; the watches list everything again");
        self.pvc_relist = None;
        self.pv_relist = None;
        self.queue = WorkQueue::new();
        self.wake = None;
        self.synced = (false, false);
        self.backend_ready = false;
    }
}

/// An item of one of the two watches.
enum WatchItem {
    Pvc(Result<Event<PersistentVolumeClaim>, watcher::Error>),
    Pv(Result<Event<PersistentVolume>, watcher::Error>),
}

impl Message for WatchItem {
    type Result = ();
}

/// A watch item delivered by message (the tests inject changes this way).
impl<B: ResizeBackend> Handler<WatchItem> for ResizeQueue<B> {
    type Result = ();
    fn handle(&mut self, item: WatchItem, ctx: &mut Context<Self>) {
        <Self as StreamHandler<WatchItem>>::handle(self, item, ctx);
    }
}

impl<B: ResizeBackend> StreamHandler<WatchItem> for ResizeQueue<B> {
    fn handle(&mut self, item: WatchItem, ctx: &mut Context<Self>) {
        match item {
            WatchItem::Pvc(Ok(event)) => self.on_pvc(event),
            WatchItem::Pv(Ok(event)) => self.on_pv(event),
            WatchItem::Pvc(Err(e)) => return warn!(error = %e, "PersistentVolumeClaim watch failed; it restarts with backoff"),
            WatchItem::Pv(Err(e)) => return warn!(error = %e, "PersistentVolume watch failed; it restarts with backoff"),
        }
        self.kick(ctx);
    }

    fn finished(&mut self, ctx: &mut Context<Self>) {
        warn!("a PersistentVolumeClaim or PersistentVolume watch ended; restarting the resize queue");
        ctx.stop();
    }
}

impl<B: ResizeBackend> Handler<GetResizeStats> for ResizeQueue<B> {
    type Result = ResizeStats;
    fn handle(&mut self, _: GetResizeStats, _: &mut Context<Self>) -> ResizeStats {
        self.stats
    }
}
