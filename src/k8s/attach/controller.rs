//! The attach controller: what the [`Shell`] runs as the external-attacher's controller
//! loop, in process (the `AttachQueue` actor). It watches VolumeAttachments and
//! PersistentVolumes, keeps what concerns this driver, and runs
//! [`reconcile`](super::reconcile) for each VolumeAttachment of this node (and
//! [`reconcile_pv`](super::reconcile_pv) for each PV being deleted); the decisions are
//! carried out by [`Executor`](super::Executor) and the volume side by the
//! [`AttachBackend`]. Watches, relists, the work queue, readiness and resync are the
//! shell's (see its rules).
//!
//! Rules:
//! - Both watches are this node's, filtered by the API server on the label the elected
//!   agent's relay sets (`crate::k8s::relay`: a VolumeAttachment by its `spec.nodeName`,
//!   a PV by its node affinity), since the server has no field selector for a
//!   VolumeAttachment's node or a PV's driver. An object that arrives all the same and
//!   is not this node's attachment of this driver, or this driver's PV, is dropped.
//!   Attachments are kept without managed fields, PVs stripped to what the decisions
//!   read.
//! - The PV's node owns our PV finalizer: only the agent that holds a volume attaches it
//!   and adds the finalizer, and it releases it once no attachment of its node names the
//!   PV. An attachment of another node naming the PV is never attached there (that node
//!   does not see the PV, so it waits without writing), so it holds no finalizer and one
//!   PATCH releases a deleted PV, not one per node.
//! - A relist replaces the kept sets; the keys of attachments gone meanwhile are
//!   forgotten, every kept attachment and every PV being deleted is queued.
//! - An update is queued only when it changes what the decisions read (spec,
//!   finalizers, deletionTimestamp, attached, attachmentMetadata), not for our own
//!   `attachError` / `detachError` writes, so a failure is retried on its backoff and
//!   never spins on its own status patch. The newest object is always kept (patches
//!   carry its resourceVersion).
//! - A failed run (an API error, or the volume manager not ready after all, e.g.
//!   restarting) is retried with backoff and logged.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeSpec};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Client, ResourceExt};
use tracing::{debug, info, warn};

use super::{publish_spec, reconcile, reconcile_pv, Action, AttachBackend, AttachError, Executor, Observed, VolumeState};
pub(crate) use crate::k8s::shell::QueueConfig;
use crate::k8s::shell::{Change, Controller, GetStats, Pending, Scope, Settings, Shell, Work};
use crate::k8s::workqueue::Outcome;

#[cfg(test)]
#[path = "fake_api_tests.rs"]
mod fake_api_tests;

/// How many VolumeAttachments are worked on at once.
pub(crate) const WORKERS: usize = 4;

/// A queued object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Key {
    /// A VolumeAttachment of this node, by name.
    Va(String),
    /// A PersistentVolume whose finalizer may be released, by name.
    Pv(String),
}

/// What the attach controller adds to the shell's statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Attached {
    /// VolumeAttachments of this node kept.
    pub attachments: usize,
    /// VolumeAttachment watch (re)starts completed, since start.
    pub relists: u64,
}

/// Query: the queue's statistics.
pub(crate) type GetQueueStats = GetStats<Attached>;

/// The attach queue actor: the shell running [`Attach`].
pub(crate) type AttachQueue<B> = Shell<Attach<B>>;

/// What the attach controller keeps and decides; see the module rules.
pub(crate) struct Attach<B: AttachBackend> {
    cfg: QueueConfig,
    backend: B,
    executor: Executor,
    /// This node's VolumeAttachments of this driver.
    vas: BTreeMap<String, VolumeAttachment>,
    /// PersistentVolumes of this driver, stripped.
    pvs: BTreeMap<String, PersistentVolume>,
}

impl<B: AttachBackend> Shell<Attach<B>> {
    /// A queue talking to `client`, attaching through `backend`.
    pub(crate) fn new(client: Client, cfg: QueueConfig, backend: B) -> Self {
        let executor = Executor::new(client.clone(), cfg.identity.clone(), cfg.policy);
        let attach = Attach { cfg, backend, executor, vas: BTreeMap::new(), pvs: BTreeMap::new() };
        let settings = Settings { name: "attach queue", workers: WORKERS, resync: attach.cfg.resync };
        Shell::with(client, settings, attach.backend.clone(), attach)
    }
}

impl<B: AttachBackend> Attach<B> {
    /// Whether a VolumeAttachment is this node's of this driver.
    fn ours(&self, va: &VolumeAttachment) -> bool {
        va.spec.attacher == self.cfg.identity.driver && va.spec.node_name == self.cfg.identity.node
    }

    fn keeps_pv(&self, pv: &PersistentVolume) -> bool {
        pv.spec.as_ref().and_then(|s| s.csi.as_ref()).is_some_and(|c| c.driver == self.cfg.identity.driver)
    }

    /// How many VolumeAttachments of this node name `pv`, not counting `except`.
    fn users_of(&self, pv: &str, except: Option<&str>) -> usize {
        self.vas
            .iter()
            .filter(|(n, va)| Some(n.as_str()) != except && va.spec.source.persistent_volume_name.as_deref() == Some(pv))
            .count()
    }

    fn on_va(&mut self, change: Change<VolumeAttachment>, queue: &mut Pending<'_, Key>) {
        match change {
            Change::Listed(list) => {
                let ours: BTreeMap<String, VolumeAttachment> = list.into_iter().map(|va| (va.name_any(), va)).collect();
                for gone in self.vas.keys().filter(|n| !ours.contains_key(*n)) {
                    queue.forget(&Key::Va(gone.clone()));
                }
                self.vas = ours;
                info!(attachments = self.vas.len(), "VolumeAttachments listed; queueing all of this node's");
            }
            Change::Applied(va) => {
                if !self.ours(&va) {
                    return;
                }
                let va = slim_va(va);
                let name = va.name_any();
                let changed = self.vas.get(&name).is_none_or(|old| decisions_differ(old, &va));
                self.vas.insert(name.clone(), va);
                if changed {
                    queue.add(Key::Va(name));
                }
            }
            Change::Deleted(va) => {
                let name = va.name_any();
                let pv = va.spec.source.persistent_volume_name.clone();
                if self.vas.remove(&name).is_some() {
                    queue.forget(&Key::Va(name));
                }
                // The PV may have been waiting for this attachment to go.
                if let Some(pv) = pv.filter(|p| self.pvs.get(p).is_some_and(|pv| pv.metadata.deletion_timestamp.is_some())) {
                    queue.add(Key::Pv(pv));
                }
            }
        }
    }

    fn on_pv(&mut self, change: Change<PersistentVolume>, queue: &mut Pending<'_, Key>) {
        match change {
            Change::Listed(list) => self.pvs = list.into_iter().map(|pv| (pv.name_any(), pv)).collect(),
            Change::Applied(pv) => {
                if !self.keeps_pv(&pv) {
                    return;
                }
                let pv = slim_pv(pv);
                let name = pv.name_any();
                let changed = self.pvs.get(&name).is_none_or(|old| pv_decisions_differ(old, &pv));
                self.pvs.insert(name.clone(), pv);
                if changed {
                    self.queue_pv_users(&name, queue);
                }
            }
            Change::Deleted(pv) => {
                let name = pv.name_any();
                if self.pvs.remove(&name).is_some() {
                    queue.forget(&Key::Pv(name));
                }
            }
        }
    }

    /// Queue a PV's attachments of this node, and the PV itself when it is being deleted.
    fn queue_pv_users(&self, pv: &str, queue: &mut Pending<'_, Key>) {
        for (n, _) in self.vas.iter().filter(|(_, va)| va.spec.source.persistent_volume_name.as_deref() == Some(pv)) {
            queue.add(Key::Va(n.clone()));
        }
        if self.pvs.get(pv).is_some_and(|p| p.metadata.deletion_timestamp.is_some()) {
            queue.add(Key::Pv(pv.to_string()));
        }
    }

    /// The run of a VolumeAttachment of this node.
    fn work_va(&self, name: &str, failures: u32) -> Work<Outcome> {
        let Some(va) = self.vas.get(name).cloned() else { return Work::Now(Outcome::Done) };
        let policy = self.cfg.policy;
        let retry = move || Outcome::Retry(policy.backoff(failures));
        let pv_name = va.spec.source.persistent_volume_name.clone();
        let pv = pv_name.as_deref().and_then(|n| self.pvs.get(n)).cloned();
        let others = pv_name.as_deref().map_or(0, |p| self.users_of(p, Some(name)));
        let (backend, executor, identity) = (self.backend.clone(), self.executor.clone(), self.cfg.identity.clone());
        Work::Run(Box::pin(async move {
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
        }))
    }

    /// The run of a PV being deleted: its finalizer goes once nothing names it.
    fn work_pv(&self, name: &str, failures: u32) -> Work<Outcome> {
        let Some(pv) = self.pvs.get(name).cloned() else { return Work::Now(Outcome::Done) };
        let actions = reconcile_pv(&pv, &self.cfg.identity, self.users_of(name, None));
        if actions != [Action::RemovePvFinalizer] {
            return Work::Now(Outcome::Done);
        }
        let (executor, policy) = (self.executor.clone(), self.cfg.policy);
        Work::Run(Box::pin(async move {
            match executor.release_pv(&pv).await {
                Ok(()) => {
                    info!(pv.name = %pv.name_any(), "PersistentVolume released: no VolumeAttachment names it");
                    Outcome::Done
                }
                // A conflict is the provisioner (or an admin) writing first; the retry
                // reads the PV again and usually finds nothing left to do.
                Err(e) if e.is_conflict() => {
                    debug!(pv.name = %pv.name_any(), error = %e, "PersistentVolume changed meanwhile; retrying its release");
                    Outcome::Retry(policy.backoff(failures))
                }
                Err(e) => {
                    warn!(pv.name = %pv.name_any(), error = %e, "cannot release the PersistentVolume; retrying");
                    Outcome::Retry(policy.backoff(failures))
                }
            }
        }))
    }
}

impl<B: AttachBackend> Controller for Attach<B> {
    type First = VolumeAttachment;
    type Second = PersistentVolume;
    type Key = Key;
    type Own = Attached;
    type Ran = Outcome;

    fn scopes(&self) -> (Scope, Scope) {
        (Scope::node(&self.cfg.identity.node), Scope::node(&self.cfg.identity.node))
    }

    fn keep_first(&self, va: VolumeAttachment) -> Option<VolumeAttachment> {
        self.ours(&va).then(|| slim_va(va))
    }

    fn keep_second(&self, pv: PersistentVolume) -> Option<PersistentVolume> {
        self.keeps_pv(&pv).then(|| slim_pv(pv))
    }

    fn first(&mut self, change: Change<VolumeAttachment>, queue: &mut Pending<'_, Key>) {
        self.on_va(change, queue);
    }

    fn second(&mut self, change: Change<PersistentVolume>, queue: &mut Pending<'_, Key>) {
        self.on_pv(change, queue);
    }

    fn queue_all(&self, queue: &mut Pending<'_, Key>) {
        for n in self.vas.keys() {
            queue.add(Key::Va(n.clone()));
        }
        for (n, _) in self.pvs.iter().filter(|(_, p)| p.metadata.deletion_timestamp.is_some()) {
            queue.add(Key::Pv(n.clone()));
        }
    }

    fn work(&mut self, key: &Key, failures: u32) -> Work<Outcome> {
        match key {
            Key::Va(name) => self.work_va(name, failures),
            Key::Pv(name) => self.work_pv(name, failures),
        }
    }

    fn own(&self, lists: (u64, u64)) -> Attached {
        Attached { attachments: self.vas.len(), relists: lists.0 }
    }

    fn ran(&mut self, _: &Key, outcome: Outcome) -> Outcome {
        outcome
    }
}

fn log_outcome(va: &VolumeAttachment, actions: &[Action], outcome: &Result<Option<Duration>, AttachError>, failures: u32) {
    let name = va.name_any();
    let pv = va.spec.source.persistent_volume_name.as_deref().unwrap_or("");
    let publish = actions.iter().any(|a| matches!(a, Action::Publish(_)));
    let unpublish = actions.iter().any(|a| matches!(a, Action::Unpublish { .. } | Action::RemoveFinalizer));
    let waits = matches!(actions, [Action::Requeue { .. }]);
    match outcome {
        // Its PV is not seen yet (the relay labels it for this node within a second).
        Ok(Some(after)) if waits => {
            debug!(va.name = %name, pv.name = %pv, retry.after_ms = after.as_millis() as u64, "waiting for the attachment's PersistentVolume to be seen")
        }
        Ok(None) if publish => info!(va.name = %name, pv.name = %pv, "volume attached"),
        Ok(None) if unpublish => info!(va.name = %name, pv.name = %pv, "volume detached"),
        Ok(None) => debug!(va.name = %name, "VolumeAttachment reconciled"),
        Ok(Some(after)) => {
            warn!(va.name = %name, pv.name = %pv, failures = failures + 1, retry.after_ms = after.as_millis() as u64, "attach or detach failed; see the VolumeAttachment's status and Events")
        }
        // A conflict is optimistic concurrency doing its job (the object changed since it
        // was read, by another writer or an event not seen yet): the retry reads it again.
        Err(e) if e.is_conflict() => debug!(va.name = %name, pv.name = %pv, error = %e, "object changed meanwhile; retrying"),
        Err(e) => warn!(va.name = %name, pv.name = %pv, error = %e, failures = failures + 1, "cannot update the API server; retrying"),
    }
}

/// A VolumeAttachment without its managed fields (often larger than the rest).
fn slim_va(mut va: VolumeAttachment) -> VolumeAttachment {
    va.metadata.managed_fields = None;
    va
}

/// A PersistentVolume with only what the decisions read: name, resourceVersion,
/// finalizers, deletionTimestamp, the CSI source, the volume mode and the claim.
pub(crate) fn slim_pv(pv: PersistentVolume) -> PersistentVolume {
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
pub(crate) fn decisions_differ(old: &VolumeAttachment, new: &VolumeAttachment) -> bool {
    let status = |va: &VolumeAttachment| {
        va.status.as_ref().map_or((false, None), |s| (s.attached, s.attachment_metadata.clone().filter(|m| !m.is_empty())))
    };
    old.spec != new.spec
        || old.metadata.finalizers != new.metadata.finalizers
        || old.metadata.deletion_timestamp != new.metadata.deletion_timestamp
        || status(old) != status(new)
}

/// Whether an update of a PV changes what the decisions read.
pub(crate) fn pv_decisions_differ(old: &PersistentVolume, new: &PersistentVolume) -> bool {
    old.metadata.finalizers != new.metadata.finalizers
        || old.metadata.deletion_timestamp != new.metadata.deletion_timestamp
        || old.spec != new.spec
}
