//! Carries out the claim watch's decisions ([`super::claims`]) against the API server.
//!
//! Rules:
//! - The claims that wait, the driver's StorageClasses and the PVs of clone sources come
//!   from the relay's view (its watch caches); only when a claim waits for a drivelet
//!   StorageClass does [`ClaimExecutor::observe`] read Nodes (paginated) and the
//!   CSIStorageCapacity objects (in drivelet's namespace, where each agent publishes its
//!   node's, `crate::k8s::capacity`).
//! - A selected node is written with a merge patch guarded by the claim's resourceVersion:
//!   a claim changed meanwhile (a node selected by someone else) is a conflict, decided
//!   again next round, never overwritten. The Normal Event follows the write.
//! - A refusal's Warning Event is recorded first, then the cause is remembered in the
//!   claim's annotation (a failure in between warns twice at worst, never not at all).
//! - A claim gone meanwhile (404) is nothing left to do.

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSIStorageCapacity, StorageClass};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::Client;
use serde_json::json;
use tracing::{info, warn};

use super::claims::{ClaimAction, ClaimDecision, ClaimsObserved, SELECTED_NODE, WAITING};
use super::executor::{list_all, DutyError};
use crate::k8s::identity::Identity;

/// Talks to the API server for the claim watch.
pub(crate) struct ClaimExecutor {
    client: Client,
    namespace: String,
    recorder: Recorder,
}

fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> DutyError {
    let what = what.into();
    move |source| DutyError::Api { what, source }
}

impl ClaimExecutor {
    /// An executor for `identity`'s driver, reading capacity objects in `namespace`.
    pub(crate) fn new(client: Client, identity: Identity, namespace: String) -> Self {
        let recorder = Recorder::new(client.clone(), identity.reporter());
        Self { client, namespace, recorder }
    }

    /// Completes what a round of the claim watch decides on: `claims` that wait, the
    /// driver's `classes` and the PVs of clone sources (`volumes`), from the relay's view.
    pub(crate) async fn observe(
        &self,
        claims: Vec<PersistentVolumeClaim>,
        classes: Vec<StorageClass>,
        volumes: Vec<PersistentVolume>,
    ) -> Result<ClaimsObserved, DutyError> {
        let mut obs = ClaimsObserved { claims, now: Some(k8s_openapi::jiff::Timestamp::now()), volumes, ..Default::default() };
        let ours = |c: &PersistentVolumeClaim| {
            let class = c.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()).unwrap_or("");
            classes.iter().any(|k| k.metadata.name.as_deref() == Some(class))
        };
        if !obs.claims.iter().any(ours) {
            return Ok(obs);
        }
        obs.classes = classes;
        let lp = ListParams::default();
        obs.nodes = list_all(&Api::<Node>::all(self.client.clone()), &lp).await.map_err(api("listing Nodes"))?;
        obs.capacities = list_all(&Api::<CSIStorageCapacity>::namespaced(self.client.clone(), &self.namespace), &lp)
            .await
            .map_err(api(format!("listing CSIStorageCapacity objects in namespace {}", self.namespace)))?;
        Ok(obs)
    }

    /// Carries out one decision.
    pub(crate) async fn apply(&self, action: &ClaimAction) -> Result<(), DutyError> {
        let (ns, name) = (action.namespace.as_str(), action.name.as_str());
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
        let reference = |uid: Option<String>| k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some(ns.to_string()),
            name: Some(name.to_string()),
            uid,
            ..Default::default()
        };
        match &action.decision {
            ClaimDecision::Select { node, why } => {
                let patch = json!({"metadata": {
                    "resourceVersion": action.resource_version,
                    "annotations": {SELECTED_NODE: node, WAITING: null},
                }});
                let written = match claims.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(c) => c,
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return Ok(()),
                    Err(e) => return Err(api(format!("selecting node {node} for claim {ns}/{name}"))(e)),
                };
                let event = Event {
                    type_: EventType::Normal,
                    reason: super::claims::REASON_SELECTED.into(),
                    note: Some(why.clone()),
                    action: "SelectNode".into(),
                    secondary: None,
                };
                let claim_ref = reference(written.metadata.uid.clone());
                self.recorder.publish(&event, &claim_ref).await.map_err(api(format!("recording an Event on claim {ns}/{name}")))?;
                info!(claim.namespace = ns, claim.name = name, node.name = %node, "claim of an Immediate StorageClass given a node");
            }
            ClaimDecision::Refuse(r) => {
                let current = match claims.get_opt(name).await.map_err(api(format!("reading claim {ns}/{name}")))? {
                    Some(c) => c,
                    None => return Ok(()),
                };
                let event = Event {
                    type_: EventType::Warning,
                    reason: r.reason.into(),
                    note: Some(r.message.clone()),
                    action: "Provision".into(),
                    secondary: None,
                };
                let claim_ref = reference(current.metadata.uid.clone());
                self.recorder.publish(&event, &claim_ref).await.map_err(api(format!("recording an Event on claim {ns}/{name}")))?;
                let patch = json!({"metadata": {"annotations": {WAITING: r.code}}});
                match claims.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(api(format!("annotating claim {ns}/{name}"))(e)),
                }
                warn!(claim.namespace = ns, claim.name = name, event.reason = r.reason, reason = %r.message, "claim waits");
            }
        }
        Ok(())
    }
}
