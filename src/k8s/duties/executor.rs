//! Carries out the cluster duties against the API server: reads what one round needs,
//! confirms a node is gone, performs its duties in order, remembers removed volumes.
//!
//! Rules:
//! - The Nodes, VolumeAttachments, PVs and Drive objects come from the relay's view
//!   (its watch caches); [`Executor::observe`] reads claims, pods and StorageClasses
//!   only when a gone node's PV is bound to a claim, and only in the namespaces and
//!   classes concerned.
//! - [`Executor::confirm_gone`] asks for the Node itself: only a 404 confirms it gone. Any
//!   answer else (the Node, an error, a timeout) keeps everything of that node.
//! - [`Executor::apply`] performs a node's duties in order and stops at the first failure
//!   (the next round redoes the rest). A 404 on a delete or on a finalizer patch means it
//!   is done already. Finalizer patches are guarded by the resourceVersion read, so a
//!   concurrent change is a conflict retried next round, never a lost finalizer.
//! - A volume handle is remembered in the ConfigMap before its PV is deleted, so a crash
//!   in between loses nothing: the next round remembers it again (a no-op) and deletes.
//! - Each duty writes one log line with `node.name` and the object; a claim's Events go on
//!   the claim (`ClaimReleased` before its deletion, `NodeDeleted` once per claim while
//!   this executor lives).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use super::{claims_to_read, releasing_namespaces, Duty, Observed, REMOVED_VOLUMES, WARNED};
use crate::k8s::crd::Drive;
use crate::k8s::identity::Identity;
use crate::words::on_node_deleted::ON_NODE_DELETED;

/// Why a round of duties (or a step of it) did not finish.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DutyError {
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// What was asked, in plain words (`deleting PersistentVolume pv-1`).
        what: String,
        /// The API error.
        source: kube::Error,
    },
}

fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> DutyError {
    let what = what.into();
    move |source| DutyError::Api { what, source }
}

/// Every object of `api` a list with `lp` answers, 500 a page: no list of a whole
/// collection in one answer.
pub(crate) async fn list_all<K>(api: &Api<K>, lp: &ListParams) -> Result<Vec<K>, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut lp = lp.clone().limit(500);
    let mut out = Vec::new();
    loop {
        let page = api.list(&lp).await?;
        out.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => lp = lp.continue_token(&token),
            None => return Ok(out),
        }
    }
}

/// Whether the API server answered 404 (the object is gone).
pub(crate) fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// The volume handles remembered for one node in [`REMOVED_VOLUMES`]: one per line.
pub(crate) fn handles(text: &str) -> Vec<String> {
    let mut seen = BTreeSet::new();
    text.lines().map(str::trim).filter(|l| !l.is_empty() && seen.insert(*l)).map(String::from).collect()
}

/// The value of a node's key for `handles`.
pub(crate) fn handles_text(handles: &[String]) -> String {
    handles.iter().map(|h| format!("{h}\n")).collect()
}

/// Talks to the API server for the cluster duties.
pub(crate) struct Executor {
    client: Client,
    identity: Identity,
    namespace: String,
    recorder: Recorder,
    /// Claims (by uid) this executor already warned about.
    warned: HashSet<String>,
}

impl Executor {
    /// An executor for `identity`'s driver, remembering removed volumes in `namespace`.
    pub(crate) fn new(client: Client, identity: Identity, namespace: String) -> Self {
        let recorder = Recorder::new(client.clone(), identity.reporter());
        Self { client, identity, namespace, recorder, warned: HashSet::new() }
    }

    /// Completes what a round decides on for the `gone` nodes (`obs`, from the relay's
    /// view): the claims their bound PVs name, those claims' classes and, where a class
    /// releases claims, the pods of their namespaces.
    pub(crate) async fn observe(&self, mut obs: Observed, gone: &BTreeSet<String>) -> Result<Observed, DutyError> {
        let lp = ListParams::default();
        let wanted = claims_to_read(&obs, &self.identity.driver, gone);
        let namespaces: BTreeSet<&str> = wanted.iter().map(|(ns, _)| ns.as_str()).collect();
        for ns in &namespaces {
            let claims = list_all(&Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), ns), &lp)
                .await
                .map_err(api(format!("listing claims in namespace {ns}")))?;
            obs.claims.extend(claims.into_iter().filter(|c| wanted.contains(&(ns.to_string(), c.name_any()))));
        }
        let classes: BTreeSet<String> =
            obs.claims.iter().filter_map(|c| c.spec.as_ref()?.storage_class_name.clone()).filter(|c| !c.is_empty()).collect();
        for class in classes {
            let sc = Api::<StorageClass>::all(self.client.clone())
                .get_opt(&class)
                .await
                .map_err(api(format!("reading StorageClass {class}")))?;
            obs.classes.extend(sc);
        }
        // Pods matter only to claims that may be released.
        for ns in releasing_namespaces(&obs) {
            let pods = list_all(&Api::<Pod>::namespaced(self.client.clone(), &ns), &lp)
                .await
                .map_err(api(format!("listing pods in namespace {ns}")))?;
            obs.pods.extend(pods);
        }
        Ok(obs)
    }

    /// Whether `node`'s Node object is gone: only a 404 to a GET of it says so.
    pub(crate) async fn confirm_gone(&self, node: &str) -> Result<bool, DutyError> {
        let found = Api::<Node>::all(self.client.clone()).get_opt(node).await.map_err(api(format!("reading Node {node}")))?;
        Ok(found.is_none())
    }

    /// Performs `duties` of gone `node` in order; stops at the first failure.
    pub(crate) async fn apply(&mut self, node: &str, duties: &[Duty]) -> Result<(), DutyError> {
        for duty in duties {
            self.apply_one(node, duty).await?;
        }
        Ok(())
    }

    async fn apply_one(&mut self, node: &str, duty: &Duty) -> Result<(), DutyError> {
        let pp = PatchParams::default();
        match duty {
            Duty::ReleaseAttachment { name, finalizers, resource_version } => {
                let vas: Api<VolumeAttachment> = Api::all(self.client.clone());
                let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": resource_version}});
                let done = vas.patch(name, &pp, &Patch::Merge(patch)).await;
                ok_unless_found(done, format!("releasing VolumeAttachment {name}"))?;
                info!(node.name = node, volumeattachment.name = %name, "node is deleted: VolumeAttachment released (attacher finalizer removed)");
            }
            Duty::ReleaseVolume { name, finalizers, resource_version } => {
                let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
                let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": resource_version}});
                let done = pvs.patch(name, &pp, &Patch::Merge(patch)).await;
                ok_unless_found(done, format!("releasing PersistentVolume {name}"))?;
                info!(node.name = node, pv.name = %name, "node is deleted: PersistentVolume released (attacher finalizer removed)");
            }
            Duty::DeleteVolume { name, handle, finalizers, resource_version } => {
                self.remember(node, handle).await?;
                let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
                if let Some(finalizers) = finalizers {
                    let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": resource_version}});
                    let done = pvs.patch(name, &pp, &Patch::Merge(patch)).await;
                    ok_unless_found(done, format!("removing the provisioner's finalizer of PersistentVolume {name}"))?;
                }
                let done = pvs.delete(name, &DeleteParams::default()).await;
                ok_unless_found(done, format!("deleting PersistentVolume {name}"))?;
                info!(node.name = node, pv.name = %name, volume.id = %handle,
                    "node is deleted: its Released PersistentVolume (reclaim policy Delete) deleted; the volume is remembered for the node's agent should the node come back");
            }
            Duty::DeleteDrive { name } => {
                let drives: Api<Drive> = Api::all(self.client.clone());
                let done = drives.delete(name, &DeleteParams::default()).await;
                ok_unless_found(done, format!("deleting Drive object {name}"))?;
                info!(node.name = node, drive.object = %name, "node is deleted: its Drive object deleted");
            }
            Duty::ReleaseClaim { claim, volume, class } => {
                let (ns, name) = (claim.namespace.clone().unwrap_or_default(), claim.name.clone().unwrap_or_default());
                let note = format!(
                    "Node {node} was deleted and StorageClass {class} has {ON_NODE_DELETED}: release-claims, so this claim is \
                     deleted for it to be made again on a live node. Its data stays on {node}'s drives only; it is deleted \
                     there if {node} comes back (volume {volume})."
                );
                let event = Event {
                    type_: EventType::Normal,
                    reason: "ClaimReleased".into(),
                    note: Some(note),
                    action: "ReleaseClaim".into(),
                    secondary: None,
                };
                self.recorder.publish(&event, claim).await.map_err(api(format!("recording an Event on claim {ns}/{name}")))?;
                let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
                let done = claims.delete(&name, &DeleteParams::default()).await;
                ok_unless_found(done, format!("deleting claim {ns}/{name}"))?;
                info!(node.name = node, claim.namespace = %ns, claim.name = %name, pv.name = %volume, storageclass.name = %class,
                    "node is deleted: claim released (its StorageClass has {ON_NODE_DELETED}: release-claims and no running pod uses it)");
            }
            Duty::WarnClaim { claim, volume, class } => {
                let uid = claim.uid.clone().unwrap_or_default();
                if self.warned.contains(&uid) {
                    return Ok(());
                }
                let (ns, name) = (claim.namespace.clone().unwrap_or_default(), claim.name.clone().unwrap_or_default());
                let class_words = if class.is_empty() { "no StorageClass".to_string() } else { format!("StorageClass {class}") };
                let note = format!(
                    "Node {node} was deleted; this claim's data (volume {volume}) is on that node's drives, so the claim \
                     stays bound and a pod using it cannot start elsewhere ({class_words} keeps claims of a deleted node). \
                     To use the data, bring {node} back under the same name. To give the data up, delete this claim: a new \
                     one is provisioned on a live node. To release such claims on their own, use a StorageClass with \
                     {ON_NODE_DELETED}: release-claims."
                );
                let event =
                    Event { type_: EventType::Warning, reason: "NodeDeleted".into(), note: Some(note), action: "KeepClaim".into(), secondary: None };
                self.recorder.publish(&event, claim).await.map_err(api(format!("recording an Event on claim {ns}/{name}")))?;
                // Remembered on the claim itself, so no later leader warns again.
                let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
                let patch = json!({ "metadata": { "annotations": { WARNED: node } } });
                let done = claims.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.map(|_| ());
                ok_unless_found(done, format!("annotating claim {ns}/{name}"))?;
                self.warned.insert(uid);
                warn!(node.name = node, claim.namespace = %ns, claim.name = %name, pv.name = %volume,
                    "node is deleted: claim kept (its StorageClass keeps claims of deleted nodes); its data is on the deleted node's drives");
            }
        }
        Ok(())
    }

    /// Adds `handle` to `node`'s key of [`REMOVED_VOLUMES`] (creating the ConfigMap when
    /// there is none); nothing when it is there already.
    async fn remember(&self, node: &str, handle: &str) -> Result<(), DutyError> {
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let what = || format!("remembering volume {handle} of node {node} in ConfigMap {}/{REMOVED_VOLUMES}", self.namespace);
        match cms.get_opt(REMOVED_VOLUMES).await.map_err(api(what()))? {
            None => {
                let cm = ConfigMap {
                    metadata: ObjectMeta { name: Some(REMOVED_VOLUMES.into()), ..Default::default() },
                    data: Some(BTreeMap::from([(node.to_string(), handles_text(&[handle.to_string()]))])),
                    ..Default::default()
                };
                cms.create(&PostParams::default(), &cm).await.map_err(api(what()))?;
            }
            Some(cm) => {
                let mut list = handles(cm.data.as_ref().and_then(|d| d.get(node)).map(String::as_str).unwrap_or(""));
                if list.iter().any(|h| h == handle) {
                    return Ok(());
                }
                list.push(handle.to_string());
                let patch = json!({"metadata": {"resourceVersion": cm.resource_version()}, "data": {node: handles_text(&list)}});
                cms.patch(REMOVED_VOLUMES, &PatchParams::default(), &Patch::Merge(patch)).await.map_err(api(what()))?;
            }
        }
        Ok(())
    }
}

/// A write that found no object has nothing left to do.
fn ok_unless_found<T>(r: Result<T, kube::Error>, what: String) -> Result<(), DutyError> {
    match r {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(source) => Err(DutyError::Api { what, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_one_per_line_trimmed_without_blanks_or_repeats() {
        assert_eq!(handles("a\n b \n\na\nc"), vec!["a", "b", "c"]);
        assert!(handles("").is_empty());
        assert_eq!(handles_text(&["a".into(), "b".into()]), "a\nb\n");
        assert_eq!(handles(&handles_text(&["x".into()])), vec!["x"]);
    }
}
