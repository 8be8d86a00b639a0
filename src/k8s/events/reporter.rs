//! The condition reporter: records the Event about one condition change on the volume's
//! claim and on the pods of this node using it, against the API server.
//!
//! Rules:
//! - Best effort: the lookups are retried once after [`RETRY_AFTER`], and so is each
//!   Event that failed; then the failure is handed back ([`Reported::errors`]) for the
//!   actor to log, and dropped.
//! - API errors are [`EventsError`]s naming the volume and the object.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;
use kube::Client;
use tracing::debug;

use super::condition_event::condition_event;
use super::targets::{claim_of, find_claim, is_volume, pods_using, ClaimLookup};
use super::VolumeConditionChanged;
use crate::k8s::identity::Identity;

/// Wait before the one retry of a failed lookup or Event.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(5);

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
/// The PV and the pods are found in this node's cache (`crate::k8s::cache`) when it is
/// given and ready: no request at all. Without it (or before it has listed), a report
/// lists this node's PVs by the relay's label and its pods in the claim's namespace by
/// field selector, both served from the API server's watch cache; reports are rare and
/// rate-limited. A PV cannot be fetched by name: only the volume handle is known here.
///
/// Each report uses a fresh `Recorder`: a shared one folds a repeated reason on the same
/// object into a series for six minutes and keeps the first note, which would hide a new
/// message; the gate already bounds how often Events are made.
#[derive(Clone)]
pub(crate) struct ConditionReporter {
    client: Client,
    identity: Identity,
    pvs: Option<Store<PersistentVolume>>,
    cache: Option<crate::k8s::cache::NodeCache>,
    retry_after: Duration,
}

impl ConditionReporter {
    /// A reporter for our driver on this node (`identity`), finding PVs by listing them.
    pub(crate) fn new(client: Client, identity: Identity) -> Self {
        Self { client, identity, pvs: None, cache: None, retry_after: RETRY_AFTER }
    }

    /// Find PVs and pods in this node's cache once it has listed.
    pub(crate) fn with_cache(mut self, cache: crate::k8s::cache::NodeCache) -> Self {
        self.pvs = Some(cache.pvs.clone());
        self.cache = Some(cache);
        self
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
            .list(&ListParams::default().labels(&crate::k8s::scope::Scope::selector(&self.identity.node)).match_any())
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
        let cached = self.cache.as_ref().filter(|c| c.ready()).map(|c| c.pods(Some(&namespace)));
        let items = match cached {
            Some(pods) => pods,
            None => {
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
                let params = ListParams::default().fields(&format!("spec.nodeName={node}")).match_any();
                let list = pods.list(&params).await.map_err(|source| EventsError::ListPods {
                    volume_id: volume_id.to_string(),
                    node: node.clone(),
                    namespace: namespace.clone(),
                    source,
                })?;
                list.items
            }
        };
        let using = pods_using(&items, &claim, node);
        debug!(volume.id = %volume_id, pv.name = %pv, pvc.namespace = %namespace, pvc.name = claim.name.as_deref().unwrap_or_default(), pods = using.len(), "condition Event targets");
        let mut targets = vec![Target { regarding: claim.clone(), related: None }];
        targets.extend(using.into_iter().map(|regarding| Target { regarding, related: Some(claim.clone()) }));
        Ok(targets)
    }
}
