//! Kubernetes Events about volume conditions: when a volume turns abnormal or back to
//! normal, an Event is recorded on its PersistentVolumeClaim and on the pods of this node
//! that use the claim, so `kubectl describe pvc` and `kubectl describe pod` show it.
//!
//! Rules:
//! - Who hears about a volume: the PV whose `spec.csi.driver` is our driver and whose
//!   `spec.csi.volumeHandle` is the volume id leads to its claim (`spec.claimRef`); a PV
//!   without a claimRef, or Released (its claim was deleted), has no one to tell. The pods
//!   are those in the claim's namespace, scheduled to this node (`spec.nodeName`), not
//!   finished (phase neither Succeeded nor Failed), with a volume naming the claim.
//!   Decided by the pure [`find_claim`] / [`claim_of`] and [`pods_using`].
//! - What is said: a Warning `VolumeConditionAbnormal` or a Normal `VolumeConditionNormal`,
//!   action `HealthCheck`, reported by controller `drivelet` from this node's instance, the
//!   note being the condition's message cut to the Events API's 1 KiB limit at a character
//!   boundary. Events on a pod name the claim as their related object, so a pod with two
//!   claims tells which one.
//! - How often, decided by the pure [`EventGate`]: per volume at most one report per
//!   `min_interval`. The first change of a quiet volume is reported at once; changes inside
//!   the window are coalesced, and when the window ends the latest state is reported unless
//!   it equals the one reported last (a flap and back says nothing). A state is the pair
//!   (abnormal, message), so a volume that stays abnormal for a new reason is reported
//!   again. A volume whose window ended with nothing pending is forgotten.
//! - Best effort: the lookups are retried once, and so is each Event that failed; then
//!   the failure is logged and dropped. Reports of one volume run one at a time (in
//!   order), at most [`MAX_CONCURRENT_REPORTS`] volumes at once; a queued report is
//!   replaced by a newer one of the same volume ([`ReportQueue`]).
//! - Clocks are read by the actor only; the gate and the queue take the time as an
//!   argument and are table-tested, the reporter is tested against a scripted fake API
//!   server.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use actix::prelude::*;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store;
use kube::{Client, Resource, ResourceExt};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::identity::Identity;

/// Reason of the Event recorded when a volume turns abnormal.
pub(crate) const REASON_ABNORMAL: &str = "VolumeConditionAbnormal";
/// Reason of the Event recorded when a volume is back to normal.
pub(crate) const REASON_NORMAL: &str = "VolumeConditionNormal";
/// Action of every condition Event.
pub(crate) const ACTION: &str = "HealthCheck";
/// The Events API's limit on `note`, in bytes.
pub(crate) const NOTE_LIMIT: usize = 1024;
/// How many volumes are reported on at once.
pub(crate) const MAX_CONCURRENT_REPORTS: usize = 3;
/// Wait before the one retry of a failed lookup or Event.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(5);
/// The longest rate-limit window the gate keeps (longer intervals are cut to this).
pub(crate) const MAX_INTERVAL: Duration = Duration::from_secs(365 * 24 * 3600);

pub(crate) use crate::actors::messages::VolumeConditionChanged;

impl VolumeConditionChanged {
    fn same_state(&self, other: &VolumeConditionChanged) -> bool {
        self.abnormal == other.abnormal && self.message == other.message
    }
}

/// One volume's rate-limit window.
#[derive(Debug, Clone)]
struct Window {
    /// When the window ends (one `min_interval` after the last report).
    until: Instant,
    /// The state reported last.
    reported: VolumeConditionChanged,
    /// The latest state seen inside the window, when it differs from `reported`.
    pending: Option<VolumeConditionChanged>,
}

/// Per-volume rate limiter of condition reports (see the module rules). Pure: the caller
/// passes the time in and wakes up at [`EventGate::next_wake`] to call [`EventGate::due`].
#[derive(Debug, Clone)]
pub(crate) struct EventGate {
    min_interval: Duration,
    windows: HashMap<String, Window>,
}

impl EventGate {
    /// A gate letting through one report per volume per `min_interval` (at most
    /// [`MAX_INTERVAL`]).
    pub(crate) fn new(min_interval: Duration) -> Self {
        Self { min_interval: min_interval.min(MAX_INTERVAL), windows: HashMap::new() }
    }

    fn window_from(&self, now: Instant) -> Instant {
        now.checked_add(self.min_interval).unwrap_or(now)
    }

    /// A change seen at `now`: returns it when it is to be reported at once, `None` when
    /// it is held until the volume's window ends (or dropped because it equals what was
    /// reported last).
    pub(crate) fn offer(&mut self, change: VolumeConditionChanged, now: Instant) -> Option<VolumeConditionChanged> {
        let until = self.window_from(now);
        match self.windows.get_mut(&change.volume_id) {
            Some(w) if now < w.until => {
                w.pending = (!w.reported.same_state(&change)).then_some(change);
                None
            }
            Some(w) => {
                w.pending = None;
                if w.reported.same_state(&change) {
                    return None;
                }
                w.until = until;
                w.reported = change.clone();
                Some(change)
            }
            None => {
                let window = Window { until, reported: change.clone(), pending: None };
                self.windows.insert(change.volume_id.clone(), window);
                Some(change)
            }
        }
    }

    /// The reports whose window has ended by `now` (sorted by volume id); each opens a new
    /// window. Volumes whose window ended with nothing pending are forgotten.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<VolumeConditionChanged> {
        let next_until = self.window_from(now);
        let mut out = Vec::new();
        self.windows.retain(|_, w| {
            if now < w.until {
                return true;
            }
            match w.pending.take() {
                Some(change) => {
                    w.until = next_until;
                    w.reported = change.clone();
                    out.push(change);
                    true
                }
                None => false,
            }
        });
        out.sort_by(|a, b| a.volume_id.cmp(&b.volume_id));
        out
    }

    /// When [`EventGate::due`] next has something to do: the earliest window end, whether
    /// a report is pending there or the volume is only to be forgotten. `None`: nothing
    /// tracked.
    pub(crate) fn next_wake(&self) -> Option<Instant> {
        self.windows.values().map(|w| w.until).min()
    }

    #[cfg(test)]
    /// How many volumes the gate remembers.
    pub(crate) fn tracked(&self) -> usize {
        self.windows.len()
    }
}

/// Reports waiting to run: at most one queued per volume (a newer one replaces it), one
/// running per volume, at most `limit` running in all. Pure bookkeeping for the actor.
#[derive(Debug, Clone)]
pub(crate) struct ReportQueue {
    limit: usize,
    queued: VecDeque<VolumeConditionChanged>,
    running: HashSet<String>,
}

impl ReportQueue {
    /// An empty queue running at most `limit` (at least one) reports at once.
    pub(crate) fn new(limit: usize) -> Self {
        Self { limit: limit.max(1), queued: VecDeque::new(), running: HashSet::new() }
    }

    /// Queue a report, replacing a queued (not yet running) one of the same volume.
    pub(crate) fn push(&mut self, change: VolumeConditionChanged) {
        match self.queued.iter_mut().find(|q| q.volume_id == change.volume_id) {
            Some(queued) => *queued = change,
            None => self.queued.push_back(change),
        }
    }

    /// The oldest queued report that may start now (below the limit, its volume not
    /// running), marked running.
    pub(crate) fn start(&mut self) -> Option<VolumeConditionChanged> {
        if self.running.len() >= self.limit {
            return None;
        }
        let at = self.queued.iter().position(|q| !self.running.contains(&q.volume_id))?;
        let change = self.queued.remove(at)?;
        self.running.insert(change.volume_id.clone());
        Some(change)
    }

    /// The report of `volume_id` finished.
    pub(crate) fn finish(&mut self, volume_id: &str) {
        self.running.remove(volume_id);
    }

    /// Forget the running reports (their futures were dropped); queued ones stay.
    pub(crate) fn clear_running(&mut self) -> usize {
        let n = self.running.len();
        self.running.clear();
        n
    }

    #[cfg(test)]
    /// How many reports are queued and how many are running.
    pub(crate) fn counts(&self) -> (usize, usize) {
        (self.queued.len(), self.running.len())
    }
}

/// What a volume's PV says about who to tell.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ClaimLookup {
    /// No PV of our driver has this volume handle.
    NoVolume,
    /// The PV is not bound to a claim (no claimRef, or one without namespace or name).
    Unclaimed {
        /// The PV's name.
        pv: String,
    },
    /// The PV is Released: its claim was deleted.
    Released {
        /// The PV's name.
        pv: String,
    },
    /// The PV is bound to this claim.
    Claimed {
        /// The PV's name.
        pv: String,
        /// The claim, as an Event's `regarding` (apiVersion, kind, namespace, name, uid).
        claim: ObjectReference,
    },
}

/// Whether `pv` is the PV of `volume_id` under `driver`.
pub(crate) fn is_volume(pv: &PersistentVolume, driver: &str, volume_id: &str) -> bool {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .is_some_and(|csi| csi.driver == driver && csi.volume_handle == volume_id)
}

/// The claim of one PV (see [`ClaimLookup`]).
pub(crate) fn claim_of(pv: &PersistentVolume) -> ClaimLookup {
    let name = pv.name_any();
    if pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released") {
        return ClaimLookup::Released { pv: name };
    }
    let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    match claim_ref.and_then(|c| Some((c.namespace.clone()?, c.name.clone()?, c.uid.clone()))) {
        Some((namespace, claim, uid)) => ClaimLookup::Claimed {
            pv: name,
            claim: ObjectReference {
                api_version: Some("v1".to_string()),
                kind: Some("PersistentVolumeClaim".to_string()),
                namespace: Some(namespace),
                name: Some(claim),
                uid,
                ..Default::default()
            },
        },
        None => ClaimLookup::Unclaimed { pv: name },
    }
}

/// The claim of the PV of `volume_id` under `driver`, among `pvs`.
pub(crate) fn find_claim<'a>(
    pvs: impl IntoIterator<Item = &'a PersistentVolume>,
    driver: &str,
    volume_id: &str,
) -> ClaimLookup {
    pvs.into_iter().find(|pv| is_volume(pv, driver, volume_id)).map_or(ClaimLookup::NoVolume, claim_of)
}

/// The pods among `pods` that use `claim` on `node` and have not finished, as Events'
/// `regarding`, in list order.
pub(crate) fn pods_using<'a>(pods: impl IntoIterator<Item = &'a Pod>, claim: &ObjectReference, node: &str) -> Vec<ObjectReference> {
    let (Some(namespace), Some(claim_name)) = (claim.namespace.as_deref(), claim.name.as_deref()) else {
        return Vec::new();
    };
    pods.into_iter()
        .filter(|pod| pod.metadata.namespace.as_deref() == Some(namespace))
        .filter(|pod| {
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter(|pod| {
            let Some(spec) = pod.spec.as_ref() else { return false };
            spec.node_name.as_deref() == Some(node)
                && spec.volumes.iter().flatten().any(|v| {
                    v.persistent_volume_claim.as_ref().is_some_and(|c| c.claim_name == claim_name)
                })
        })
        .map(|pod| pod.object_ref(&()))
        .collect()
}

/// `note` cut to at most [`NOTE_LIMIT`] bytes, at a character boundary.
pub(crate) fn truncate_note(note: &str) -> &str {
    if note.len() <= NOTE_LIMIT {
        return note;
    }
    let mut end = NOTE_LIMIT;
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    &note[..end]
}

/// The Event about `change`, on a claim (`related: None`) or on a pod (`related`: its
/// claim).
pub(crate) fn condition_event(change: &VolumeConditionChanged, related: Option<ObjectReference>) -> Event {
    let (type_, reason) = if change.abnormal {
        (EventType::Warning, REASON_ABNORMAL)
    } else {
        (EventType::Normal, REASON_NORMAL)
    };
    Event {
        type_,
        reason: reason.to_string(),
        note: Some(truncate_note(&change.message).to_string()),
        action: ACTION.to_string(),
        secondary: related,
    }
}

/// Errors talking to the API server while reporting a condition.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EventsError {
    /// Listing PVs to find the volume's claim failed.
    #[error("listing PersistentVolumes to find the claim of volume {volume_id}: {source}")]
    ListPersistentVolumes {
        /// The volume.
        volume_id: String,
        /// The API error.
        source: kube::Error,
    },
    /// Listing the pods of this node in the claim's namespace failed.
    #[error("listing the pods of node {node} in namespace {namespace} for volume {volume_id}: {source}")]
    ListPods {
        /// The volume.
        volume_id: String,
        /// This node.
        node: String,
        /// The claim's namespace.
        namespace: String,
        /// The API error.
        source: kube::Error,
    },
    /// Recording an Event failed.
    #[error("recording an Event about volume {volume_id} on {kind} {namespace}/{name}: {source}")]
    Record {
        /// The volume.
        volume_id: String,
        /// Kind of the object the Event is about.
        kind: String,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The API error.
        source: kube::Error,
    },
}

/// How one report went.
#[derive(Debug, Default)]
pub(crate) struct Reported {
    /// Objects the Event was recorded on.
    pub recorded: usize,
    /// What failed, after the one retry.
    pub errors: Vec<EventsError>,
}

/// One object to record the Event on.
#[derive(Debug, Clone)]
struct Target {
    regarding: ObjectReference,
    related: Option<ObjectReference>,
}

/// Records condition Events against the API server.
///
/// The PV is found in a reflector `Store` when one is given and ready: no request at all,
/// which is what a node agent should do once anything in the process watches PVs (the
/// attacher needs them too). Without one, each report lists the PVs with
/// `resourceVersion=0`, served from the API server's watch cache rather than etcd; reports
/// are rare and rate-limited, so this stays cheap, but it does transfer every PV of the
/// cluster. A PV cannot be fetched by name: only the volume handle is known here.
///
/// Each report uses a fresh `Recorder`: a shared one folds a repeated reason on the same
/// object into a series for six minutes and keeps the first note, which would hide a new
/// message; the gate already bounds how often Events are made.
#[derive(Clone)]
pub(crate) struct ConditionReporter {
    client: Client,
    identity: Identity,
    pvs: Option<Store<PersistentVolume>>,
    retry_after: Duration,
}

impl ConditionReporter {
    /// A reporter for our driver on this node (`identity`), finding PVs by listing them.
    pub(crate) fn new(client: Client, identity: Identity) -> Self {
        Self { client, identity, pvs: None, retry_after: RETRY_AFTER }
    }

    #[cfg(test)]
    /// Find PVs in `store` (a reflector's reader) instead; while it is not ready yet, or
    /// its writer is gone before it was, PVs are listed.
    pub(crate) fn with_pv_store(mut self, store: Store<PersistentVolume>) -> Self {
        self.pvs = Some(store);
        self
    }

    /// Record the Event about `change` on the volume's claim and on the pods of this node
    /// that use it. Lookups and failed Events are retried once after [`RETRY_AFTER`].
    pub(crate) async fn report(&self, change: &VolumeConditionChanged) -> Reported {
        let targets = match self.targets(&change.volume_id).await {
            Ok(targets) => targets,
            Err(first) => {
                debug!(volume.id = %change.volume_id, error = %first, "condition Event lookup failed; retrying once");
                tokio::time::sleep(self.retry_after).await;
                match self.targets(&change.volume_id).await {
                    Ok(targets) => targets,
                    Err(e) => return Reported { recorded: 0, errors: vec![e] },
                }
            }
        };
        let recorder = Recorder::new(self.client.clone(), self.identity.reporter());
        let mut reported = Reported::default();
        let mut failed = Vec::new();
        for target in targets {
            match self.record(&recorder, change, &target).await {
                Ok(()) => reported.recorded += 1,
                Err(e) => {
                    debug!(volume.id = %change.volume_id, error = %e, "condition Event failed; retrying once");
                    failed.push(target);
                }
            }
        }
        if !failed.is_empty() {
            tokio::time::sleep(self.retry_after).await;
            for target in failed {
                match self.record(&recorder, change, &target).await {
                    Ok(()) => reported.recorded += 1,
                    Err(e) => reported.errors.push(e),
                }
            }
        }
        reported
    }

    async fn record(&self, recorder: &Recorder, change: &VolumeConditionChanged, target: &Target) -> Result<(), EventsError> {
        let event = condition_event(change, target.related.clone());
        recorder.publish(&event, &target.regarding).await.map_err(|source| EventsError::Record {
            volume_id: change.volume_id.clone(),
            kind: target.regarding.kind.clone().unwrap_or_default(),
            namespace: target.regarding.namespace.clone().unwrap_or_default(),
            name: target.regarding.name.clone().unwrap_or_default(),
            source,
        })
    }

    async fn claim(&self, volume_id: &str) -> Result<ClaimLookup, EventsError> {
        let driver = &self.identity.driver;
        if let Some(store) = &self.pvs {
            // Already ready, or not waited for.
            if let Ok(Ok(())) = tokio::time::timeout(Duration::ZERO, store.wait_until_ready()).await {
                let pv = store.find(|pv| is_volume(pv, driver, volume_id));
                return Ok(pv.map_or(ClaimLookup::NoVolume, |pv| claim_of(&pv)));
            }
        }
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let list = pvs
            .list(&ListParams::default().match_any())
            .await
            .map_err(|source| EventsError::ListPersistentVolumes { volume_id: volume_id.to_string(), source })?;
        Ok(find_claim(&list.items, driver, volume_id))
    }

    async fn targets(&self, volume_id: &str) -> Result<Vec<Target>, EventsError> {
        let (pv, claim) = match self.claim(volume_id).await? {
            ClaimLookup::Claimed { pv, claim } => (pv, claim),
            other => {
                debug!(volume.id = %volume_id, lookup = ?other, "no claim to record the volume condition on");
                return Ok(Vec::new());
            }
        };
        let namespace = claim.namespace.clone().unwrap_or_default();
        let node = &self.identity.node;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        let params = ListParams::default().fields(&format!("spec.nodeName={node}")).match_any();
        let list = pods.list(&params).await.map_err(|source| EventsError::ListPods {
            volume_id: volume_id.to_string(),
            node: node.clone(),
            namespace: namespace.clone(),
            source,
        })?;
        let using = pods_using(&list.items, &claim, node);
        debug!(volume.id = %volume_id, pv.name = %pv, pvc.namespace = %namespace, pvc.name = claim.name.as_deref().unwrap_or_default(), pods = using.len(), "condition Event targets");
        let mut targets = vec![Target { regarding: claim.clone(), related: None }];
        targets.extend(using.into_iter().map(|regarding| Target { regarding, related: Some(claim.clone()) }));
        Ok(targets)
    }
}

/// The actor that turns volume condition changes into rate-limited Events: a thin shell
/// over [`EventGate`], [`ReportQueue`] and [`ConditionReporter`].
pub(crate) struct ConditionEvents {
    reporter: ConditionReporter,
    gate: EventGate,
    queue: ReportQueue,
    wake: Option<SpawnHandle>,
}

impl ConditionEvents {
    /// An actor reporting through `reporter`, at most once per volume per `min_interval`.
    pub(crate) fn new(reporter: ConditionReporter, min_interval: Duration) -> Self {
        Self { reporter, gate: EventGate::new(min_interval), queue: ReportQueue::new(MAX_CONCURRENT_REPORTS), wake: None }
    }

    /// Wake up when the gate next has something to do (one timer at a time).
    fn schedule(&mut self, ctx: &mut Context<Self>) {
        if let Some(handle) = self.wake.take() {
            ctx.cancel_future(handle);
        }
        if let Some(at) = self.gate.next_wake() {
            let after = at.saturating_duration_since(Instant::now());
            self.wake = Some(ctx.run_later(after, |act, ctx| {
                act.wake = None;
                for change in act.gate.due(Instant::now()) {
                    act.queue.push(change);
                }
                act.schedule(ctx);
                act.pump(ctx);
            }));
        }
    }

    /// Start the queued reports that may run now.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        while let Some(change) = self.queue.start() {
            let reporter = self.reporter.clone();
            let work = async move {
                let reported = reporter.report(&change).await;
                (change, reported)
            };
            ctx.spawn(work.into_actor(self).map(|(change, reported), act, ctx| {
                for e in &reported.errors {
                    warn!(actor = "condition-events", volume.id = %change.volume_id, volume.abnormal = change.abnormal, error = %e, "could not record a volume condition Event");
                }
                debug!(actor = "condition-events", volume.id = %change.volume_id, volume.abnormal = change.abnormal, events = reported.recorded, "volume condition reported");
                act.queue.finish(&change.volume_id);
                act.pump(ctx);
            }));
        }
    }
}

impl Actor for ConditionEvents {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // After a restart: pick up what the gate and the queue still hold.
        self.schedule(ctx);
        self.pump(ctx);
    }
}

impl Supervised for ConditionEvents {
    fn restarting(&mut self, _: &mut Context<Self>) {
        // The timer and the running reports were dropped with the old context; the
        // rate-limit windows and the queued reports are still right.
        self.wake = None;
        let dropped = self.queue.clear_running();
        warn!(actor = "condition-events", reports.dropped = dropped, "restarting the condition Event reporter");
    }
}

impl Handler<VolumeConditionChanged> for ConditionEvents {
    type Result = ();

    fn handle(&mut self, change: VolumeConditionChanged, ctx: &mut Context<Self>) {
        let volume_id = change.volume_id.clone();
        match self.gate.offer(change, Instant::now()) {
            Some(now) => {
                self.queue.push(now);
                self.pump(ctx);
            }
            None => debug!(actor = "condition-events", volume.id = %volume_id, "volume condition change held by the rate limit"),
        }
        self.schedule(ctx);
    }
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Object builders shared by the target tests and the fake API server tests.

    use k8s_openapi::api::core::v1::{
        CSIPersistentVolumeSource, PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, PersistentVolumeStatus,
        PodSpec, PodStatus, Volume,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::k8s::attach::fixtures::{DRIVER, NODE};

    /// A PV of our driver for `volume_id`, bound to `ns/claim` when given.
    pub(crate) fn bound_pv(name: &str, volume_id: &str, claim: Option<(&str, &str)>) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta { name: Some(name.to_string()), ..Default::default() },
            spec: Some(PersistentVolumeSpec {
                csi: Some(CSIPersistentVolumeSource {
                    driver: DRIVER.to_string(),
                    volume_handle: volume_id.to_string(),
                    ..Default::default()
                }),
                claim_ref: claim.map(|(ns, claim)| ObjectReference {
                    api_version: Some("v1".to_string()),
                    kind: Some("PersistentVolumeClaim".to_string()),
                    namespace: Some(ns.to_string()),
                    name: Some(claim.to_string()),
                    uid: Some(format!("uid-{claim}")),
                    resource_version: Some("42".to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: Some(PersistentVolumeStatus { phase: Some("Bound".to_string()), ..Default::default() }),
        }
    }

    /// A running pod in `ns` on `node` using the claims named.
    pub(crate) fn pod(ns: &str, name: &str, node: &str, claims: &[&str]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(ns.to_string()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.to_string()),
                volumes: Some(
                    claims
                        .iter()
                        .map(|c| Volume {
                            name: format!("vol-{c}"),
                            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                                claim_name: c.to_string(),
                                read_only: None,
                            }),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: Some(PodStatus { phase: Some("Running".to_string()), ..Default::default() }),
        }
    }

    /// A pod on this node.
    pub(crate) fn local_pod(ns: &str, name: &str, claims: &[&str]) -> Pod {
        pod(ns, name, NODE, claims)
    }

    /// The claim reference the lookup yields for `ns/claim`.
    pub(crate) fn claim_ref(ns: &str, claim: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".to_string()),
            kind: Some("PersistentVolumeClaim".to_string()),
            namespace: Some(ns.to_string()),
            name: Some(claim.to_string()),
            uid: Some(format!("uid-{claim}")),
            ..Default::default()
        }
    }

    pub(crate) fn change(volume_id: &str, abnormal: bool, message: &str) -> VolumeConditionChanged {
        VolumeConditionChanged { volume_id: volume_id.to_string(), abnormal, message: message.to_string() }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;
    use crate::k8s::attach::fixtures::{DRIVER, NODE};

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn bad(volume_id: &str) -> VolumeConditionChanged {
        change(volume_id, true, "drive d1 is failing")
    }

    fn good(volume_id: &str) -> VolumeConditionChanged {
        change(volume_id, false, "volume is healthy")
    }

    /// One step of a gate script: at `t` seconds, either offer a change (and expect it
    /// reported at once or not) or call `due` (and expect these reports).
    enum Step {
        Offer(u64, VolumeConditionChanged, bool),
        Due(u64, Vec<VolumeConditionChanged>),
    }

    #[test]
    fn gate_table_reports_at_most_once_per_window_with_the_latest_state() {
        use Step::{Due, Offer};
        // (case, script, volumes tracked at the end, next wake at the end in seconds)
        let table: Vec<(&str, Vec<Step>, usize, Option<u64>)> = vec![
            ("the first change of a quiet volume is reported at once", vec![Offer(0, bad("v1"), true)], 1, Some(30)),
            (
                "a second change inside the window is held until the window ends",
                vec![Offer(0, bad("v1"), true), Offer(10, good("v1"), false), Due(29, vec![]), Due(30, vec![good("v1")])],
                1,
                Some(60),
            ),
            (
                "changes inside the window are coalesced to the latest",
                vec![
                    Offer(0, good("v1"), true),
                    Offer(5, bad("v1"), false),
                    Offer(6, change("v1", true, "drive d1 is missing"), false),
                    Due(30, vec![change("v1", true, "drive d1 is missing")]),
                ],
                1,
                Some(60),
            ),
            (
                "a flap back to the reported state inside the window reports nothing",
                vec![Offer(0, bad("v1"), true), Offer(10, good("v1"), false), Offer(20, bad("v1"), false), Due(30, vec![])],
                0,
                None,
            ),
            (
                "a new message while still abnormal is a new state",
                vec![Offer(0, bad("v1"), true), Offer(40, change("v1", true, "95% full"), true)],
                1,
                Some(70),
            ),
            (
                "a change after the window is reported at once even before due ran",
                vec![Offer(0, bad("v1"), true), Offer(31, good("v1"), true)],
                1,
                Some(61),
            ),
            (
                "repeating the reported state after the window says nothing",
                vec![Offer(0, bad("v1"), true), Offer(31, bad("v1"), false), Due(31, vec![])],
                0,
                None,
            ),
            (
                "the report at the window's end opens a new window",
                vec![
                    Offer(0, bad("v1"), true),
                    Offer(1, good("v1"), false),
                    Due(30, vec![good("v1")]),
                    Offer(31, bad("v1"), false),
                    Due(59, vec![]),
                    Due(60, vec![bad("v1")]),
                ],
                1,
                Some(90),
            ),
            (
                "volumes are independent",
                vec![
                    Offer(0, bad("v1"), true),
                    Offer(10, bad("v2"), true),
                    Offer(11, good("v1"), false),
                    Offer(12, good("v2"), false),
                    Due(30, vec![good("v1")]),
                    Due(40, vec![good("v2")]),
                ],
                2,
                Some(60),
            ),
            (
                "due reports several volumes at once, sorted",
                vec![
                    Offer(0, bad("v2"), true),
                    Offer(0, bad("v1"), true),
                    Offer(1, good("v2"), false),
                    Offer(1, good("v1"), false),
                    Due(45, vec![good("v1"), good("v2")]),
                ],
                2,
                Some(75),
            ),
            (
                "a volume whose window ended with nothing pending is forgotten",
                vec![Offer(0, bad("v1"), true), Offer(5, bad("v2"), true), Due(30, vec![]), Due(35, vec![])],
                0,
                None,
            ),
            (
                "a forgotten volume's next change is reported at once",
                vec![Offer(0, bad("v1"), true), Due(30, vec![]), Offer(31, good("v1"), true)],
                1,
                Some(61),
            ),
        ];
        let start = Instant::now();
        let at = |t: u64| start + S(t);
        for (case, script, tracked, wake) in table {
            let mut gate = EventGate::new(S(30));
            for (i, step) in script.into_iter().enumerate() {
                match step {
                    Offer(t, change, reported) => {
                        let want = reported.then(|| change.clone());
                        assert_eq!(gate.offer(change, at(t)), want, "{case}: step {i}");
                    }
                    Due(t, want) => assert_eq!(gate.due(at(t)), want, "{case}: step {i}"),
                }
            }
            assert_eq!(gate.tracked(), tracked, "{case}: volumes tracked");
            assert_eq!(gate.next_wake(), wake.map(at), "{case}: next wake");
        }
    }

    #[test]
    fn gate_memory_stays_bounded_over_many_volumes() {
        let start = Instant::now();
        let mut gate = EventGate::new(S(30));
        for i in 0..1000 {
            assert!(gate.offer(bad(&format!("v{i}")), start).is_some());
        }
        assert_eq!(gate.tracked(), 1000);
        assert_eq!(gate.due(start + S(30)), vec![]);
        assert_eq!(gate.tracked(), 0, "every window ended with nothing pending");
        assert_eq!(gate.next_wake(), None);
    }

    #[test]
    fn gate_with_a_huge_interval_does_not_overflow() {
        let mut gate = EventGate::new(Duration::MAX);
        let now = Instant::now();
        assert!(gate.offer(bad("v1"), now).is_some());
        assert_eq!(gate.next_wake(), Some(now + MAX_INTERVAL));
    }

    #[test]
    fn queue_runs_one_report_per_volume_within_the_limit_and_keeps_the_latest() {
        let mut q = ReportQueue::new(2);
        q.push(bad("v1"));
        q.push(bad("v2"));
        q.push(bad("v3"));
        assert_eq!(q.start(), Some(bad("v1")));
        assert_eq!(q.start(), Some(bad("v2")));
        assert_eq!(q.start(), None, "the limit is reached");
        q.push(good("v1"));
        q.push(change("v1", true, "drive d1 is missing"));
        assert_eq!(q.counts(), (2, 2), "a queued report of a volume is replaced, not added");
        q.finish("v2");
        assert_eq!(q.start(), Some(bad("v3")), "v1 is still running, so v3 goes first");
        q.finish("v3");
        assert_eq!(q.start(), None, "v1's newer report waits for its running one");
        q.finish("v1");
        assert_eq!(q.start(), Some(change("v1", true, "drive d1 is missing")));
        assert_eq!(q.counts(), (0, 1));
        assert_eq!(q.clear_running(), 1);
        assert_eq!(ReportQueue::new(0).limit, 1, "a zero limit would never run anything");
    }

    #[test]
    fn claim_lookup_table_follows_the_pv() {
        let mut released = bound_pv("pv-1", "vol-1", Some(("apps", "data")));
        released.status.as_mut().expect("status").phase = Some("Released".into());
        let mut other_driver = bound_pv("pv-1", "vol-1", Some(("apps", "data")));
        other_driver.spec.as_mut().and_then(|s| s.csi.as_mut()).expect("csi").driver = "ebs.csi.aws.com".into();
        let mut no_csi = bound_pv("pv-1", "vol-1", Some(("apps", "data")));
        no_csi.spec.as_mut().expect("spec").csi = None;
        let mut nameless_claim = bound_pv("pv-1", "vol-1", Some(("apps", "data")));
        nameless_claim.spec.as_mut().and_then(|s| s.claim_ref.as_mut()).expect("claimRef").name = None;
        let claimed = |pv: &str, ns: &str, claim: &str| ClaimLookup::Claimed { pv: pv.into(), claim: claim_ref(ns, claim) };

        let table: Vec<(&str, Vec<PersistentVolume>, ClaimLookup)> = vec![
            ("no PVs at all", vec![], ClaimLookup::NoVolume),
            (
                "the PV with our driver and the volume handle leads to its claim",
                vec![bound_pv("pv-0", "vol-0", Some(("apps", "other"))), bound_pv("pv-1", "vol-1", Some(("apps", "data")))],
                claimed("pv-1", "apps", "data"),
            ),
            ("another driver's PV with the same handle is not ours", vec![other_driver], ClaimLookup::NoVolume),
            ("a PV without a CSI source is not ours", vec![no_csi], ClaimLookup::NoVolume),
            (
                "a PV without claimRef has no one to tell",
                vec![bound_pv("pv-1", "vol-1", None)],
                ClaimLookup::Unclaimed { pv: "pv-1".into() },
            ),
            ("a claimRef without a name is no claim", vec![nameless_claim], ClaimLookup::Unclaimed { pv: "pv-1".into() }),
            ("a Released PV's claim is gone", vec![released], ClaimLookup::Released { pv: "pv-1".into() }),
        ];
        for (case, pvs, want) in table {
            assert_eq!(find_claim(&pvs, DRIVER, "vol-1"), want, "{case}");
        }
    }

    #[test]
    fn pods_table_keeps_live_pods_of_this_node_using_the_claim() {
        let claim = claim_ref("apps", "data");
        let mut finished = local_pod("apps", "done", &["data"]);
        finished.status.as_mut().expect("status").phase = Some("Succeeded".into());
        let mut failed = local_pod("apps", "crashed", &["data"]);
        failed.status.as_mut().expect("status").phase = Some("Failed".into());
        let mut pending = local_pod("apps", "starting", &["data"]);
        pending.status.as_mut().expect("status").phase = Some("Pending".into());
        let mut no_status = local_pod("apps", "fresh", &["data"]);
        no_status.status = None;
        let mut no_spec = local_pod("apps", "odd", &["data"]);
        no_spec.spec = None;

        let table: Vec<(&str, Vec<Pod>, Vec<&str>)> = vec![
            ("a running pod on this node using the claim", vec![local_pod("apps", "web-0", &["data"])], vec!["web-0"]),
            ("a pod using the claim among others", vec![local_pod("apps", "web-0", &["cache", "data"])], vec!["web-0"]),
            ("a pod using another claim", vec![local_pod("apps", "web-0", &["cache"])], vec![]),
            ("a pod with no volumes", vec![local_pod("apps", "web-0", &[])], vec![]),
            ("a pod on another node", vec![pod("apps", "web-0", "node-b", &["data"])], vec![]),
            ("a pod in another namespace with a claim of that name", vec![local_pod("shop", "web-0", &["data"])], vec![]),
            ("finished pods are left alone", vec![finished, failed], vec![]),
            ("pending pods and pods without status are told", vec![pending, no_status], vec!["starting", "fresh"]),
            ("a pod without spec is not scheduled here", vec![no_spec], vec![]),
            (
                "several pods, in list order",
                vec![local_pod("apps", "web-1", &["data"]), local_pod("apps", "web-0", &["data"])],
                vec!["web-1", "web-0"],
            ),
        ];
        for (case, pods, want) in table {
            let got = pods_using(&pods, &claim, NODE);
            let names: Vec<&str> = got.iter().filter_map(|r| r.name.as_deref()).collect();
            assert_eq!(names, want, "{case}");
            for r in &got {
                assert_eq!((r.kind.as_deref(), r.api_version.as_deref()), (Some("Pod"), Some("v1")), "{case}");
                assert_eq!(r.namespace.as_deref(), Some("apps"), "{case}");
                assert!(r.uid.is_some(), "{case}: the uid lets kubectl describe find the Event");
            }
        }
        let nameless = ObjectReference { name: None, ..claim };
        assert!(pods_using(&[local_pod("apps", "web-0", &["data"])], &nameless, NODE).is_empty());
    }

    #[test]
    fn notes_are_cut_to_the_events_api_limit_at_a_character_boundary() {
        let ascii = "x".repeat(2000);
        let euro = "€".repeat(400); // 3 bytes each: 1200 bytes, 1024 falls inside a character
        let table: Vec<(&str, &str, usize)> = vec![
            ("short notes stay whole", "drive d1 is failing", 19),
            ("exactly the limit stays whole", &ascii[..NOTE_LIMIT], NOTE_LIMIT),
            ("long ASCII is cut at the limit", &ascii, NOTE_LIMIT),
            ("a multi-byte character across the limit is dropped whole", &euro, 1023),
            ("empty stays empty", "", 0),
        ];
        for (case, note, want) in table {
            let cut = truncate_note(note);
            assert_eq!(cut.len(), want, "{case}");
            assert!(note.starts_with(cut), "{case}");
        }
    }

    #[test]
    fn condition_events_are_warnings_when_abnormal_and_normal_otherwise() {
        let warning = condition_event(&bad("v1"), None);
        assert_eq!(
            (warning.type_, warning.reason.as_str(), warning.action.as_str(), warning.note.as_deref()),
            (EventType::Warning, REASON_ABNORMAL, ACTION, Some("drive d1 is failing"))
        );
        assert!(warning.secondary.is_none());
        let normal = condition_event(&good("v1"), Some(claim_ref("apps", "data")));
        assert_eq!((normal.type_, normal.reason.as_str()), (EventType::Normal, REASON_NORMAL));
        assert_eq!(normal.secondary, Some(claim_ref("apps", "data")));
    }
}
