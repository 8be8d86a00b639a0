//! The AttachQueue actor: the external-attacher's controller loop, in process. It
//! watches VolumeAttachments and PersistentVolumes, keeps what concerns this driver, and
//! runs [`reconcile`](super::reconcile) for each VolumeAttachment of this node through a
//! [`WorkQueue`]; the decisions are carried out by [`Executor`](super::Executor) and the
//! volume side by the VolumeManager, asked by message ([`ManagerBackend`]: the queue's
//! only link to the core actors).
//!
//! Rules:
//! - The API server has no field selector for a VolumeAttachment's `spec.attacher` or
//!   `spec.nodeName`, so the watch is cluster-wide and filtered on arrival: this node's
//!   attachments of this driver are kept (without managed fields); of other nodes'
//!   attachments of this driver only the PV name is kept (a PV finalizer is released
//!   only when no attachment anywhere names the PV); everything else is dropped.
//!   PersistentVolumes are kept only when their CSI driver is ours, stripped to what the
//!   decisions read.
//! - A watch (re)start lists everything again (`Init` .. `InitDone`); the listed set
//!   replaces the kept one at `InitDone` and every kept attachment is queued: nothing
//!   that changed while the watch was down is lost, and objects deleted meanwhile are
//!   forgotten. `resync_interval` queues them all again periodically.
//! - An update is queued only when it changes what the decisions read (spec,
//!   finalizers, deletionTimestamp, attached, attachmentMetadata), not for our own
//!   `attachError` / `detachError` writes, so a failure is retried on its backoff and
//!   never spins on its own status patch. The newest object is always kept (patches
//!   carry its resourceVersion).
//! - Nothing runs before both watches have delivered their first full list, so no
//!   attachment is judged against a PV that simply was not listed yet, nor before the
//!   volume side is ready ([`AttachBackend::wait_ready`]: the volume manager's start-up
//!   reconciliation is done), so a normal start makes no failed attempt and logs no
//!   retry. Keys queued meanwhile wait, and run as soon as both hold.
//! - At most `WORKERS` keys run at once, one run per key; a failed run (an API error,
//!   or the volume manager not ready after all, e.g. restarting) is retried with backoff
//!   and logged.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use actix::prelude::*;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeSpec};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use tokio_stream::StreamExt;
use kube::{Api, Client, ResourceExt};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{
    publish_spec, reconcile, reconcile_pv, Action, AttachError, Executor, Observed, PublishSpec, RetryPolicy, VolumeCallError,
    VolumeOps, VolumeState,
};
use crate::actors::volumes::{AttachPreview, AttachVolume, DetachVolume, VolumeManager, WaitReady};
use crate::backoff::backoff;
use crate::k8s::identity::Identity;
use crate::k8s::workqueue::{Outcome, WorkQueue};

#[cfg(test)]
mod tests;

/// How many VolumeAttachments are worked on at once.
pub const WORKERS: usize = 4;

/// How long to wait before asking the volume manager for its readiness again, when it
/// could not answer (it was restarting).
pub const READY_RETRY: Duration = Duration::from_secs(1);

/// The volume side of attaching: what the volume manager says about a volume, and the
/// in-process ControllerPublish / ControllerUnpublish.
pub trait AttachBackend: VolumeOps + Clone + Unpin + 'static {
    /// Whether publishing `spec` to `node` would be accepted now; `Err` when the volume
    /// side cannot tell yet (starting, busy), which is retried with backoff.
    fn volume_state(&self, spec: &PublishSpec, node: &str) -> impl Future<Output = Result<VolumeState, VolumeCallError>> + Send;

    /// Resolves once the volume side is ready to answer (start-up done); the queue runs
    /// nothing before.
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

fn attach_message(spec: &PublishSpec, node: &str) -> AttachVolume {
    AttachVolume {
        volume_id: spec.volume_id.clone(),
        node_id: node.to_string(),
        block: spec.block,
        fs_type: spec.fs_type.clone(),
    }
}

fn unanswered(e: actix::MailboxError) -> VolumeCallError {
    VolumeCallError::Unavailable(format!("the volume manager did not answer: {e}"))
}

impl VolumeOps for ManagerBackend {
    async fn publish(&self, spec: &PublishSpec, node: &str) -> Result<BTreeMap<String, String>, VolumeCallError> {
        let context = self.volumes.send(attach_message(spec, node)).await.map_err(unanswered)??;
        Ok(context.to_map())
    }

    async fn unpublish(&self, volume_id: &str, node: &str) -> Result<(), VolumeCallError> {
        let m = DetachVolume { volume_id: volume_id.to_string(), node_id: Some(node.to_string()) };
        Ok(self.volumes.send(m).await.map_err(unanswered)??)
    }
}

impl AttachBackend for ManagerBackend {
    async fn volume_state(&self, spec: &PublishSpec, node: &str) -> Result<VolumeState, VolumeCallError> {
        super::volume_state(self.volumes.send(AttachPreview(attach_message(spec, node))).await.map_err(unanswered)?)
    }

    async fn wait_ready(&self) {
        while !matches!(self.volumes.send(WaitReady).await, Ok(true)) {
            tokio::time::sleep(READY_RETRY).await;
        }
    }
}

/// A queued object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Key {
    /// A VolumeAttachment of this node, by name.
    Va(String),
    /// A PersistentVolume whose finalizer may be released, by name.
    Pv(String),
}

/// Settings of the queue.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// Driver and node.
    pub identity: Identity,
    /// Backoff and terminal retry delays.
    pub policy: RetryPolicy,
    /// Queue everything again this often (`Duration::ZERO`: never).
    pub resync: Duration,
}

/// Counters for observation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, MessageResponse)]
pub struct QueueStats {
    /// VolumeAttachments of this node kept.
    pub attachments: usize,
    /// Keys waiting to run.
    pub waiting: usize,
    /// Keys running.
    pub running: usize,
    /// Runs that ended in a retry, since start.
    pub retries: u64,
    /// Watch (re)starts completed, since start.
    pub relists: u64,
}

/// Query: the queue's counters.
#[derive(Message)]
#[rtype(result = "QueueStats")]
pub struct GetQueueStats;

/// The attach queue actor; see the module rules.
pub struct AttachQueue<B: AttachBackend> {
    client: Client,
    cfg: QueueConfig,
    backend: B,
    executor: Executor,
    /// This node's VolumeAttachments of this driver.
    vas: BTreeMap<String, VolumeAttachment>,
    /// Other nodes' VolumeAttachments of this driver: name -> PV name.
    others: BTreeMap<String, String>,
    /// PersistentVolumes of this driver, stripped.
    pvs: BTreeMap<String, PersistentVolume>,
    /// Objects listed since the VolumeAttachment watch's last `Init`.
    va_relist: Option<(BTreeMap<String, VolumeAttachment>, BTreeMap<String, String>)>,
    /// Objects listed since the PV watch's last `Init`.
    pv_relist: Option<BTreeMap<String, PersistentVolume>>,
    queue: WorkQueue<Key>,
    wake: Option<SpawnHandle>,
    /// Both watches have delivered their first full list: work starts only then, so no
    /// attachment is judged against a PV not listed yet.
    synced: (bool, bool),
    /// The volume side is ready: work starts only then too.
    backend_ready: bool,
    stats: QueueStats,
}

impl<B: AttachBackend> AttachQueue<B> {
    /// A queue talking to `client`, attaching through `backend`.
    pub fn new(client: Client, cfg: QueueConfig, backend: B) -> Self {
        let executor = Executor::new(client.clone(), cfg.identity.clone(), cfg.policy);
        Self {
            client,
            cfg,
            backend,
            executor,
            vas: BTreeMap::new(),
            others: BTreeMap::new(),
            pvs: BTreeMap::new(),
            va_relist: None,
            pv_relist: None,
            queue: WorkQueue::new(),
            wake: None,
            synced: (false, false),
            backend_ready: false,
            stats: QueueStats::default(),
        }
    }

    /// Whether work may run: both watches listed and the volume side ready.
    fn runnable(&self) -> bool {
        self.synced == (true, true) && self.backend_ready
    }

    /// Which VolumeAttachment map an object belongs in, if any.
    fn sort_va(&self, va: VolumeAttachment) -> Option<Kept> {
        if va.spec.attacher != self.cfg.identity.driver {
            return None;
        }
        if va.spec.node_name == self.cfg.identity.node {
            return Some(Kept::Ours(Box::new(slim_va(va))));
        }
        Some(Kept::Other(va.name_any(), va.spec.source.persistent_volume_name.clone().unwrap_or_default()))
    }

    fn keeps_pv(&self, pv: &PersistentVolume) -> bool {
        pv.spec.as_ref().and_then(|s| s.csi.as_ref()).is_some_and(|c| c.driver == self.cfg.identity.driver)
    }

    /// How many VolumeAttachments (any node) name `pv`, not counting `except`.
    fn users_of(&self, pv: &str, except: Option<&str>) -> usize {
        let ours = self
            .vas
            .iter()
            .filter(|(n, va)| Some(n.as_str()) != except && va.spec.source.persistent_volume_name.as_deref() == Some(pv))
            .count();
        ours + self.others.values().filter(|p| *p == pv).count()
    }

    fn on_va(&mut self, event: Event<VolumeAttachment>) {
        let now = Instant::now();
        match event {
            Event::Init => self.va_relist = Some(Default::default()),
            Event::InitApply(va) => {
                let kept = self.sort_va(va);
                if let (Some((ours, others)), Some(kept)) = (self.va_relist.as_mut(), kept) {
                    match kept {
                        Kept::Ours(va) => {
                            ours.insert(va.name_any(), *va);
                        }
                        Kept::Other(name, pv) => {
                            others.insert(name, pv);
                        }
                    }
                }
            }
            Event::InitDone => {
                let Some((ours, others)) = self.va_relist.take() else { return };
                for gone in self.vas.keys().filter(|n| !ours.contains_key(*n)) {
                    self.queue.forget(&Key::Va(gone.clone()));
                }
                self.vas = ours;
                self.others = others;
                self.synced.0 = true;
                self.stats.relists += 1;
                info!(attachments = self.vas.len(), "VolumeAttachments listed; queueing all of this node's");
                self.queue_all(now);
            }
            Event::Apply(va) => match self.sort_va(va) {
                Some(Kept::Ours(va)) => {
                    let name = va.name_any();
                    let changed = self.vas.get(&name).is_none_or(|old| decisions_differ(old, &va));
                    self.vas.insert(name.clone(), *va);
                    if changed {
                        self.queue.add(Key::Va(name), now);
                    }
                }
                Some(Kept::Other(name, pv)) => {
                    self.others.insert(name, pv);
                }
                None => {}
            },
            Event::Delete(va) => {
                let name = va.name_any();
                let pv = va.spec.source.persistent_volume_name.clone();
                self.others.remove(&name);
                if self.vas.remove(&name).is_some() {
                    self.queue.forget(&Key::Va(name));
                }
                // The PV may have been waiting for this attachment to go.
                if let Some(pv) = pv.filter(|p| self.pvs.get(p).is_some_and(|pv| pv.metadata.deletion_timestamp.is_some())) {
                    self.queue.add(Key::Pv(pv), now);
                }
            }
        }
    }

    fn on_pv(&mut self, event: Event<PersistentVolume>) {
        let now = Instant::now();
        match event {
            Event::Init => self.pv_relist = Some(BTreeMap::new()),
            Event::InitApply(pv) => {
                if self.keeps_pv(&pv) {
                    if let Some(list) = self.pv_relist.as_mut() {
                        list.insert(pv.name_any(), slim_pv(pv));
                    }
                }
            }
            Event::InitDone => {
                let Some(list) = self.pv_relist.take() else { return };
                self.pvs = list;
                self.synced.1 = true;
                self.queue_all(now);
            }
            Event::Apply(pv) => {
                if !self.keeps_pv(&pv) {
                    return;
                }
                let pv = slim_pv(pv);
                let name = pv.name_any();
                let changed = self.pvs.get(&name).is_none_or(|old| pv_decisions_differ(old, &pv));
                self.pvs.insert(name.clone(), pv);
                if changed {
                    self.queue_pv_users(&name, now);
                }
            }
            Event::Delete(pv) => {
                let name = pv.name_any();
                if self.pvs.remove(&name).is_some() {
                    self.queue.forget(&Key::Pv(name));
                }
            }
        }
    }

    /// Queue a PV's attachments of this node, and the PV itself when it is being deleted.
    fn queue_pv_users(&mut self, pv: &str, now: Instant) {
        let users: Vec<String> = self
            .vas
            .iter()
            .filter(|(_, va)| va.spec.source.persistent_volume_name.as_deref() == Some(pv))
            .map(|(n, _)| n.clone())
            .collect();
        for n in users {
            self.queue.add(Key::Va(n), now);
        }
        if self.pvs.get(pv).is_some_and(|p| p.metadata.deletion_timestamp.is_some()) {
            self.queue.add(Key::Pv(pv.to_string()), now);
        }
    }

    fn queue_all(&mut self, now: Instant) {
        let names: Vec<String> = self.vas.keys().cloned().collect();
        for n in names {
            self.queue.add(Key::Va(n), now);
        }
        let deleting: Vec<String> = self
            .pvs
            .iter()
            .filter(|(_, p)| p.metadata.deletion_timestamp.is_some())
            .map(|(n, _)| n.clone())
            .collect();
        for n in deleting {
            self.queue.add(Key::Pv(n), now);
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
                let delay = at.saturating_duration_since(now);
                self.wake = Some(ctx.run_later(delay, |act, ctx| {
                    act.wake = None;
                    act.kick(ctx);
                }));
            }
        }
        self.stats.attachments = self.vas.len();
        self.stats.waiting = self.queue.waiting();
        self.stats.running = self.queue.running();
    }

    fn start(&mut self, key: Key, failures: u32, ctx: &mut Context<Self>) {
        let policy = self.cfg.policy;
        let retry = move || Outcome::Retry(backoff(failures, policy.base, policy.cap));
        let work: std::pin::Pin<Box<dyn Future<Output = Outcome>>> = match &key {
            Key::Va(name) => {
                let Some(va) = self.vas.get(name).cloned() else {
                    self.queue.finish(&key, Outcome::Done, Instant::now());
                    return;
                };
                let pv_name = va.spec.source.persistent_volume_name.clone();
                let pv = pv_name.as_deref().and_then(|n| self.pvs.get(n)).cloned();
                let others = pv_name.as_deref().map_or(0, |p| self.users_of(p, Some(name)));
                let (backend, executor, identity) = (self.backend.clone(), self.executor.clone(), self.cfg.identity.clone());
                Box::pin(async move {
                    let spec = publish_spec(&va, pv.as_ref());
                    let volume = match &spec {
                        Some(spec) => match backend.volume_state(spec, &identity.node).await {
                            Ok(state) => state,
                            Err(e) => {
                                warn!(va.name = %va.name_any(), error = %e, "volume manager not ready for this attachment; retrying");
                                return retry();
                            }
                        },
                        None => VolumeState::Missing,
                    };
                    let obs = Observed { va: &va, pv: pv.as_ref(), other_attachments: others, volume: &volume, failures };
                    let actions = reconcile(&obs, &identity, &policy);
                    if actions.is_empty() {
                        return Outcome::Done;
                    }
                    debug!(va.name = %va.name_any(), ?actions, "reconciling VolumeAttachment");
                    let outcome = executor.apply(&va, pv.as_ref(), actions.clone(), &backend, failures).await;
                    log_outcome(&va, &actions, &outcome, failures);
                    match outcome {
                        Ok(None) => Outcome::Done,
                        Ok(Some(after)) => Outcome::Retry(after),
                        Err(_) => retry(),
                    }
                })
            }
            Key::Pv(name) => {
                let Some(pv) = self.pvs.get(name).cloned() else {
                    self.queue.finish(&key, Outcome::Done, Instant::now());
                    return;
                };
                let users = self.users_of(name, None);
                let actions = reconcile_pv(&pv, &self.cfg.identity, users);
                if actions != [Action::RemovePvFinalizer] {
                    self.queue.finish(&key, Outcome::Done, Instant::now());
                    return;
                }
                let executor = self.executor.clone();
                Box::pin(async move {
                    match executor.release_pv(&pv).await {
                        Ok(()) => {
                            info!(pv.name = %pv.name_any(), "PersistentVolume released: no VolumeAttachment names it");
                            Outcome::Done
                        }
                        Err(e) => {
                            warn!(pv.name = %pv.name_any(), error = %e, "cannot release the PersistentVolume; retrying");
                            retry()
                        }
                    }
                })
            }
        };
        ctx.spawn(work.into_actor(self).map(move |outcome, act, ctx| {
            if matches!(outcome, Outcome::Retry(_)) {
                act.stats.retries += 1;
            }
            act.queue.finish(&key, outcome, Instant::now());
            act.kick(ctx);
        }));
    }
}

fn log_outcome(va: &VolumeAttachment, actions: &[Action], outcome: &Result<Option<Duration>, AttachError>, failures: u32) {
    let name = va.name_any();
    let pv = va.spec.source.persistent_volume_name.as_deref().unwrap_or("");
    let publish = actions.iter().any(|a| matches!(a, Action::Publish(_)));
    let unpublish = actions.iter().any(|a| matches!(a, Action::Unpublish { .. } | Action::RemoveFinalizer));
    match outcome {
        Ok(None) if publish => info!(va.name = %name, pv.name = %pv, "volume attached"),
        Ok(None) if unpublish => info!(va.name = %name, pv.name = %pv, "volume detached"),
        Ok(None) => debug!(va.name = %name, "VolumeAttachment reconciled"),
        Ok(Some(after)) => {
            warn!(va.name = %name, pv.name = %pv, failures = failures + 1, retry.after_ms = after.as_millis() as u64, "attach or detach failed; see the VolumeAttachment's status and Events")
        }
        Err(e) => warn!(va.name = %name, pv.name = %pv, error = %e, failures = failures + 1, "cannot update the API server; retrying"),
    }
}

enum Kept {
    Ours(Box<VolumeAttachment>),
    Other(String, String),
}

/// A VolumeAttachment without its managed fields (often larger than the rest).
fn slim_va(mut va: VolumeAttachment) -> VolumeAttachment {
    va.metadata.managed_fields = None;
    va
}

/// A PersistentVolume with only what the decisions read: name, resourceVersion,
/// finalizers, deletionTimestamp, the CSI source, the volume mode and the claim.
pub fn slim_pv(pv: PersistentVolume) -> PersistentVolume {
    let spec = pv.spec.map(|s| PersistentVolumeSpec {
        csi: s.csi,
        volume_mode: s.volume_mode,
        claim_ref: s.claim_ref,
        ..Default::default()
    });
    PersistentVolume {
        metadata: ObjectMeta {
            name: pv.metadata.name,
            uid: pv.metadata.uid,
            resource_version: pv.metadata.resource_version,
            finalizers: pv.metadata.finalizers,
            deletion_timestamp: pv.metadata.deletion_timestamp,
            ..Default::default()
        },
        spec,
        status: None,
    }
}

/// Whether an update of a VolumeAttachment changes what `reconcile` reads; our own
/// `attachError` / `detachError` and resourceVersion changes do not.
pub fn decisions_differ(old: &VolumeAttachment, new: &VolumeAttachment) -> bool {
    let status = |va: &VolumeAttachment| {
        va.status.as_ref().map_or((false, None), |s| (s.attached, s.attachment_metadata.clone().filter(|m| !m.is_empty())))
    };
    old.spec != new.spec
        || old.metadata.finalizers != new.metadata.finalizers
        || old.metadata.deletion_timestamp != new.metadata.deletion_timestamp
        || status(old) != status(new)
}

/// Whether an update of a PV changes what the decisions read.
pub fn pv_decisions_differ(old: &PersistentVolume, new: &PersistentVolume) -> bool {
    old.metadata.finalizers != new.metadata.finalizers
        || old.metadata.deletion_timestamp != new.metadata.deletion_timestamp
        || old.spec != new.spec
}

impl<B: AttachBackend> Actor for AttachQueue<B> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let cfg = watcher::Config::default();
        let vas: Api<VolumeAttachment> = Api::all(self.client.clone());
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        ctx.add_stream(watcher(vas, cfg.clone()).default_backoff().map(WatchItem::Va));
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
            debug!(waiting = act.queue.waiting(), "volume manager ready; attach work may run");
            act.kick(ctx);
        }));
        info!(driver.name = %self.cfg.identity.driver, node.name = %self.cfg.identity.node, "attach queue started");
    }
}

impl<B: AttachBackend> Supervised for AttachQueue<B> {
    fn restarting(&mut self, _: &mut Context<Self>) {
        warn!(actor = "attach", "restarting the attach queue; the watches list everything again");
        self.va_relist = None;
        self.pv_relist = None;
        self.queue = WorkQueue::new();
        self.wake = None;
        self.synced = (false, false);
        self.backend_ready = false;
    }
}

/// An item of one of the two watches.
enum WatchItem {
    /// From the VolumeAttachment watch.
    Va(Result<Event<VolumeAttachment>, watcher::Error>),
    /// From the PersistentVolume watch.
    Pv(Result<Event<PersistentVolume>, watcher::Error>),
}

impl Message for WatchItem {
    type Result = ();
}

/// A watch item delivered by message (the tests inject deletions this way).
impl<B: AttachBackend> Handler<WatchItem> for AttachQueue<B> {
    type Result = ();
    fn handle(&mut self, item: WatchItem, ctx: &mut Context<Self>) {
        <Self as StreamHandler<WatchItem>>::handle(self, item, ctx);
    }
}

impl<B: AttachBackend> StreamHandler<WatchItem> for AttachQueue<B> {
    fn handle(&mut self, item: WatchItem, ctx: &mut Context<Self>) {
        match item {
            WatchItem::Va(Ok(event)) => self.on_va(event),
            WatchItem::Pv(Ok(event)) => self.on_pv(event),
            WatchItem::Va(Err(e)) => {
                warn!(error = %e, "VolumeAttachment watch failed; it restarts with backoff");
                return;
            }
            WatchItem::Pv(Err(e)) => {
                warn!(error = %e, "PersistentVolume watch failed; it restarts with backoff");
                return;
            }
        }
        self.kick(ctx);
    }

    fn finished(&mut self, ctx: &mut Context<Self>) {
        warn!("a VolumeAttachment or PersistentVolume watch ended; restarting the attach queue");
        ctx.stop();
    }
}

impl<B: AttachBackend> Handler<GetQueueStats> for AttachQueue<B> {
    type Result = QueueStats;
    fn handle(&mut self, _: GetQueueStats, _: &mut Context<Self>) -> QueueStats {
        self.stats
    }
}
