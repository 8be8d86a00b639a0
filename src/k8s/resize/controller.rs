//! The resize controller: what the [`Shell`] runs as the external-resizer's controller
//! loop, in process (the `ResizeQueue` actor). It watches PersistentVolumeClaims and
//! PersistentVolumes, keeps the PVs this driver has on this node and the claims bound to
//! a PV, and runs [`plan`](super::plan) for each such claim; [`Executor`] writes the
//! claim, the PV and the Events, and the volume side is the [`ResizeBackend`]. Watches,
//! relists, the work queue, readiness and resync are the shell's (see its rules).
//!
//! Rules:
//! - Both watches are this node's, filtered by the API server on the label the elected
//!   agent's relay sets (`crate::k8s::relay`: a PV by its node affinity, a claim by its
//!   PV's node or its selected node), since the server has no field selector for a PV's
//!   driver or node nor for a claim's. Of what arrives, PVs are kept only when
//!   [`our_volume`](super::our_volume) names a volume, claims only when bound to a PV,
//!   both stripped to what the decisions read.
//! - A relist replaces the kept set and every claim of a kept PV is queued, so a request
//!   made while the watch was down is not lost.
//! - A claim is queued when a change matters to the decisions
//!   ([`claim_differs`](super::claim_differs)): never for the resizer's own status
//!   writes, so a failure waits out its delay and never spins on its own write. A kept
//!   PV's change queues its claim.
//! - A volume the volume manager does not know is left alone (another node's, or not
//!   created here).
//! - The slow set and the final-error set of external-resizer live here, in memory: a
//!   claim seen `ControllerResizeInfeasible` does not retry the same size for
//!   `RetryPolicy::terminal`; after a restart both are empty (as after external-resizer's).
//! - API errors retry with backoff.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus, PersistentVolumeSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Client, ResourceExt};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::backend::ResizeBackend;
use super::executor::{key_of, Executor, Ran};
use super::{claim_differs, our_volume, plan, resize_status, Observed, Plan, CONTROLLER_INFEASIBLE};
pub(crate) use crate::k8s::shell::QueueConfig;
use crate::k8s::shell::{Change, Controller, Pending, Scope, Settings, Shell, Work};
use crate::k8s::workqueue::Outcome;

#[cfg(test)]
#[path = "fake_api_tests.rs"]
mod fake_api_tests;

/// How many claims are worked on at once.
pub(crate) const WORKERS: usize = 2;

/// What the resize controller adds to the shell's statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Claims {
    /// Claims bound to a kept PV.
    pub claims: usize,
}

/// Query: the queue's statistics (asked by the tests only).
#[cfg(test)]
pub(crate) type GetResizeStats = crate::k8s::shell::GetStats<Claims>;

/// The resize queue actor: the shell running [`Resize`].
pub(crate) type ResizeQueue<B> = Shell<Resize<B>>;

/// What the resize controller keeps and decides; see the module rules.
pub(crate) struct Resize<B: ResizeBackend> {
    cfg: QueueConfig,
    backend: B,
    executor: Executor,
    /// Claims bound to some PV, by `namespace/name`, stripped.
    pvcs: BTreeMap<String, PersistentVolumeClaim>,
    /// This driver's PVs on this node, by name, stripped.
    pvs: BTreeMap<String, PersistentVolume>,
    /// Claims whose last expansion ended with a final error.
    final_errors: BTreeSet<String>,
    /// Claims whose size was infeasible, until when it is not tried again.
    slow: BTreeMap<String, Instant>,
}

/// What a run of a claim hands back: `None` when the volume manager does not know the
/// volume, the delay to retry after when a call failed, or what the executor did.
type Run = Option<Result<Ran, Duration>>;

impl<B: ResizeBackend> Shell<Resize<B>> {
    /// A queue talking to `client`, growing volumes through `backend`.
    pub(crate) fn new(client: Client, cfg: QueueConfig, backend: B) -> Self {
        let executor = Executor::new(client.clone(), &cfg.identity, cfg.policy);
        let resize = Resize {
            cfg,
            backend,
            executor,
            pvcs: BTreeMap::new(),
            pvs: BTreeMap::new(),
            final_errors: BTreeSet::new(),
            slow: BTreeMap::new(),
        };
        let settings = Settings { name: "resize queue", workers: WORKERS, resync: resize.cfg.resync };
        Shell::with(client, settings, resize.backend.clone(), resize)
    }
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

impl<B: ResizeBackend> Resize<B> {
    fn ours(&self, pvc: &PersistentVolumeClaim) -> bool {
        bound_pv(pvc).is_some_and(|n| self.pvs.contains_key(n))
    }

    fn on_pvc(&mut self, change: Change<PersistentVolumeClaim>, queue: &mut Pending<'_, String>) {
        match change {
            Change::Listed(list) => self.pvcs = list.into_iter().map(|c| (key_of(&c), c)).collect(),
            Change::Applied(pvc) => {
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
                    queue.add(key);
                }
            }
            Change::Deleted(pvc) => {
                let key = key_of(&pvc);
                self.pvcs.remove(&key);
                queue.forget(&key);
                self.final_errors.remove(&key);
                self.slow.remove(&key);
            }
        }
    }

    fn on_pv(&mut self, change: Change<PersistentVolume>, queue: &mut Pending<'_, String>) {
        match change {
            Change::Listed(list) => self.pvs = list.into_iter().map(|pv| (pv.name_any(), pv)).collect(),
            Change::Applied(pv) => {
                let name = pv.name_any();
                if our_volume(&pv, &self.cfg.identity).is_none() {
                    self.pvs.remove(&name);
                    return;
                }
                let pv = slim_pv(pv);
                let changed = self.pvs.get(&name).is_none_or(|old| old.spec != pv.spec);
                self.pvs.insert(name.clone(), pv);
                if changed {
                    for (k, _) in self.pvcs.iter().filter(|(_, c)| bound_pv(c) == Some(name.as_str())) {
                        queue.add(k.clone());
                    }
                }
            }
            Change::Deleted(pv) => {
                self.pvs.remove(&pv.name_any());
            }
        }
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
}

impl<B: ResizeBackend> Controller for Resize<B> {
    type First = PersistentVolumeClaim;
    type Second = PersistentVolume;
    type Key = String;
    type Own = Claims;
    type Ran = Run;

    fn scopes(&self) -> (Scope, Scope) {
        (Scope::node(&self.cfg.identity.node), Scope::node(&self.cfg.identity.node))
    }

    fn keep_first(&self, pvc: PersistentVolumeClaim) -> Option<PersistentVolumeClaim> {
        bound_pv(&pvc).is_some().then(|| slim_pvc(pvc))
    }

    fn keep_second(&self, pv: PersistentVolume) -> Option<PersistentVolume> {
        our_volume(&pv, &self.cfg.identity).is_some().then(|| slim_pv(pv))
    }

    fn first(&mut self, change: Change<PersistentVolumeClaim>, queue: &mut Pending<'_, String>) {
        self.on_pvc(change, queue);
    }

    fn second(&mut self, change: Change<PersistentVolume>, queue: &mut Pending<'_, String>) {
        self.on_pv(change, queue);
    }

    fn queue_all(&self, queue: &mut Pending<'_, String>) {
        for (k, _) in self.pvcs.iter().filter(|(_, c)| self.ours(c)) {
            queue.add(k.clone());
        }
    }

    fn work(&mut self, key: &String, failures: u32) -> Work<Run> {
        let now = Instant::now();
        let found = self.pvcs.get(key).cloned().and_then(|c| Some((self.pvs.get(bound_pv(&c)?)?.clone(), c)));
        let Some((pv, pvc)) = found else { return Work::Now(Outcome::Done) };
        let slow_left = self.slow_left(key, &pvc, now);
        let obs = Observed { pvc: &pvc, pv: &pv, final_error: self.final_errors.contains(key), slow_left };
        let expansion = match plan(&obs, &self.cfg.identity) {
            Plan::Nothing(why) => {
                debug!(pvc.name = %key, why, "no resize");
                return Work::Now(Outcome::Done);
            }
            Plan::Wait(after) => {
                debug!(pvc.name = %key, retry.after_ms = after.as_millis() as u64, "infeasible size; waiting before trying it again");
                return Work::Now(Outcome::Retry(after));
            }
            Plan::Expand(e) => e,
        };
        let (backend, executor, policy) = (self.backend.clone(), self.executor.clone(), self.cfg.policy);
        Work::Run(Box::pin(async move {
            match backend.known(&expansion.volume_id).await {
                Ok(true) => {}
                Ok(false) => {
                    debug!(pvc.name = %key_of(&pvc), volume.id = %expansion.volume_id, "volume unknown to the volume manager; not resizing");
                    return None;
                }
                Err(e) => {
                    warn!(pvc.name = %key_of(&pvc), error = %e, "volume manager not ready for this claim; retrying");
                    return Some(Err(policy.backoff(failures)));
                }
            }
            match executor.run(pvc, pv, &expansion, &backend, failures).await {
                Ok(ran) => Some(Ok(ran)),
                Err(e) => {
                    warn!(error = %e, failures = failures + 1, "cannot update the API server; retrying");
                    Some(Err(policy.backoff(failures)))
                }
            }
        }))
    }

    fn own(&self, _lists: (u64, u64)) -> Claims {
        Claims { claims: self.pvcs.values().filter(|p| self.ours(p)).count() }
    }

    fn ran(&mut self, key: &String, run: Run) -> Outcome {
        let ran = match run {
            None => return Outcome::Done,
            Some(Err(after)) => return Outcome::Retry(after),
            Some(Ok(ran)) => ran,
        };
        if ran.final_error {
            self.final_errors.insert(key.clone());
        } else {
            self.final_errors.remove(key);
        }
        if ran.infeasible {
            self.slow.insert(key.clone(), Instant::now() + self.cfg.policy.terminal);
        } else {
            self.slow.remove(key);
        }
        // Keep what was written, so a rerun before the watch catches up does not act on
        // the old objects.
        if self.pvcs.contains_key(key) {
            self.pvcs.insert(key.clone(), slim_pvc(ran.pvc));
        }
        let name = ran.pv.name_any();
        if self.pvs.contains_key(&name) {
            self.pvs.insert(name, slim_pv(ran.pv));
        }
        ran.outcome
    }
}
