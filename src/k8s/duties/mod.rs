//! Cluster duties: what one elected agent does for nodes that no longer exist (their Node
//! object deleted), since only a node's own agent looks after its objects while it lives.
//!
//! A node is *gone* when its Node object does not exist. A NotReady, unreachable,
//! cordoned, tainted or rebooting node exists, so it is never gone: nothing here looks at
//! a node's conditions. The relay's view of the Nodes (a watch) only proposes a node as
//! gone (`crate::k8s::relay::view::View::gone`); the executor confirms it with a GET
//! answered 404 right before it does anything about that node, and a view naming no Node
//! at all proposes nothing (it is not trusted).
//!
//! The duties for a gone node N, decided by the pure [`plan`] (table-tested in `tests`):
//! 1. VolumeAttachments of our driver for N that are being deleted (the attach-detach
//!    controller deleted them) lose our attacher finalizer ([`Duty::ReleaseAttachment`]):
//!    a volume on a deleted node cannot be in use anywhere.
//! 2. PVs of our driver whose node affinity names N (`topology.drivelet.io/node`) lose our
//!    attacher finalizer once no VolumeAttachment names them ([`Duty::ReleaseVolume`]).
//! 3. PVs of N that are `Released` with reclaim policy `Delete` (their claim was deleted:
//!    the user's intent) are deleted ([`Duty::DeleteVolume`]): first their volume handle is
//!    remembered in the ConfigMap [`REMOVED_VOLUMES`] under key N (one handle a line),
//!    then the provisioner's finalizer (and ours, by rule 2) is removed in one patch, then
//!    the PV is deleted. If N ever comes
//!    back under its name, its agent deletes those volumes and clears its key
//!    ([`returned`]).
//! 4. Drive objects of N are deleted ([`Duty::DeleteDrive`]).
//! 5. Claims bound to N's PVs: where the claim's StorageClass has
//!    `drivelet.io/on-node-deleted: release-claims` and no running pod uses the claim
//!    (scheduled to a node and neither succeeded nor failed), the claim is deleted, with a
//!    Normal Event `ClaimReleased` on it first ([`Duty::ReleaseClaim`]); a claim that a
//!    running pod still uses waits. Otherwise (`keep-claims`, no parameter, an unknown
//!    value, or a StorageClass that is gone) the claim stays and gets one Warning Event
//!    `NodeDeleted` saying where its data is and what the admin can do
//!    ([`Duty::WarnClaim`]); the claim is then annotated [`WARNED`] with the node's name,
//!    and a claim annotated so is not warned again, whichever agent leads later.
//!
//! Every duty is idempotent (a removed finalizer, a deleted object, a remembered handle
//! stay so), so a new leader redoes what an old one half did. Each is logged with
//! `node.name` and the object by the executor.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use kube::{Resource, ResourceExt};

use super::crd::Drive;
use super::identity::finalizer_name;
use crate::words::on_node_deleted::{OnNodeDeleted, ON_NODE_DELETED};
use crate::TOPOLOGY_NODE_KEY;

/// Carries the claim watch's decisions out against the API server.
pub(crate) mod claim_executor;
/// The claim watch: waiting claims of drivelet's classes get a node or a reason.
pub(crate) mod claims;
/// The controller that runs the election and the duties while leading.
pub(crate) mod controller;
/// The Lease election: pure decisions.
pub(crate) mod election;
/// Carries the duties out against the API server.
pub(crate) mod executor;
/// A node that comes back: its agent deletes the volumes removed while it was gone.
pub(crate) mod returned;

#[cfg(test)]
mod claims_tests;
#[cfg(test)]
mod fake_api_tests;
#[cfg(test)]
pub(crate) mod tests;

/// The ConfigMap, in drivelet's namespace, remembering per node the volume handles of the
/// PVs deleted while the node was gone.
pub(crate) const REMOVED_VOLUMES: &str = "drivelet-removed-volumes";

/// The annotation on a kept claim saying which deleted node it was warned about, so the
/// `NodeDeleted` Warning is recorded once per claim, not once per leader.
pub(crate) const WARNED: &str = "drivelet.io/node-deleted-warned";

/// The external-provisioner's finalizer on the PVs it made.
pub(crate) const PROVISIONER_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

/// One thing to do for a gone node.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Duty {
    /// Remove our attacher finalizer from a VolumeAttachment being deleted.
    ReleaseAttachment {
        /// The VolumeAttachment.
        name: String,
        /// Its finalizers without ours.
        finalizers: Vec<String>,
        /// The resourceVersion read, guarding the patch.
        resource_version: Option<String>,
    },
    /// Remove our attacher finalizer from a PV no VolumeAttachment names.
    ReleaseVolume {
        /// The PV.
        name: String,
        /// Its finalizers without ours.
        finalizers: Vec<String>,
        /// The resourceVersion read, guarding the patch.
        resource_version: Option<String>,
    },
    /// Remember the volume handle, remove the provisioner's finalizer, delete the PV.
    DeleteVolume {
        /// The PV.
        name: String,
        /// Its CSI volume handle, the volume id on the node.
        handle: String,
        /// Its finalizers without the provisioner's, `None` when it has none to remove.
        finalizers: Option<Vec<String>>,
        /// The resourceVersion read, guarding the patch.
        resource_version: Option<String>,
    },
    /// Delete a Drive object.
    DeleteDrive {
        /// The Drive object.
        name: String,
    },
    /// Record `ClaimReleased` on a claim, then delete it.
    ReleaseClaim {
        /// The claim.
        claim: ObjectReference,
        /// Its PV.
        volume: String,
        /// Its StorageClass.
        class: String,
    },
    /// Record one `NodeDeleted` Warning on a claim that stays.
    WarnClaim {
        /// The claim.
        claim: ObjectReference,
        /// Its PV.
        volume: String,
        /// Its StorageClass, empty when it has none.
        class: String,
    },
}

/// What the API server said, as one round of the duties reads it.
#[derive(Default)]
pub(crate) struct Observed {
    /// The driver's VolumeAttachments of the gone nodes, and any naming their PVs.
    pub attachments: Vec<VolumeAttachment>,
    /// The gone nodes' PVs.
    pub volumes: Vec<PersistentVolume>,
    /// The gone nodes' Drive objects.
    pub drives: Vec<Drive>,
    /// The claims bound to gone nodes' PVs (others may be there too).
    pub claims: Vec<PersistentVolumeClaim>,
    /// Pods in those claims' namespaces.
    pub pods: Vec<Pod>,
    /// StorageClasses of those claims.
    pub classes: Vec<StorageClass>,
}

/// The node a PV of `driver` lives on: the one value of its required node affinity on
/// `topology.drivelet.io/node`; `None` for another driver's PV or any other affinity.
pub(crate) fn pv_node<'a>(pv: &'a PersistentVolume, driver: &str) -> Option<&'a str> {
    let spec = pv.spec.as_ref()?;
    if spec.csi.as_ref()?.driver != driver {
        return None;
    }
    let terms = &spec.node_affinity.as_ref()?.required.as_ref()?.node_selector_terms;
    let mut values = terms.iter().flat_map(|t| t.match_expressions.iter().flatten()).filter(|e| e.key == TOPOLOGY_NODE_KEY);
    let e = values.next()?;
    match (e.operator.as_str(), e.values.as_deref()) {
        ("In", Some([node])) if values.next().is_none() => Some(node.as_str()),
        _ => None,
    }
}

/// The namespaces and StorageClasses of the claims that gone nodes' PVs are bound to:
/// what a round reads only when there are such claims.
pub(crate) fn claims_to_read(obs: &Observed, driver: &str, gone: &BTreeSet<String>) -> BTreeSet<(String, String)> {
    obs.volumes
        .iter()
        .filter(|pv| pv_node(pv, driver).is_some_and(|n| gone.contains(n)))
        .filter(|pv| phase(pv) == "Bound")
        .filter_map(|pv| pv.spec.as_ref()?.claim_ref.as_ref())
        .filter_map(|r| Some((r.namespace.clone()?, r.name.clone()?)))
        .collect()
}

/// The namespaces of the read claims whose StorageClass releases claims: the only ones
/// whose pods a round reads.
pub(crate) fn releasing_namespaces(obs: &Observed) -> BTreeSet<String> {
    obs.claims
        .iter()
        .filter(|c| {
            let class = c.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()).unwrap_or("");
            policy_of(obs, class) == OnNodeDeleted::ReleaseClaims
        })
        .filter_map(|c| c.metadata.namespace.clone())
        .collect()
}

/// What StorageClass `class` says about claims of deleted nodes: `keep-claims` unless it
/// exists and says `release-claims`.
fn policy_of(obs: &Observed, class: &str) -> OnNodeDeleted {
    obs.classes
        .iter()
        .find(|sc| !class.is_empty() && sc.metadata.name.as_deref() == Some(class))
        .and_then(|sc| sc.parameters.as_ref()?.get(ON_NODE_DELETED))
        .and_then(|v| OnNodeDeleted::parse(v))
        .unwrap_or_default()
}

fn phase(pv: &PersistentVolume) -> &str {
    pv.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

fn without(list: &[String], finalizer: &str) -> Vec<String> {
    list.iter().filter(|f| *f != finalizer).cloned().collect()
}

/// A pod that counts as running a claim: scheduled to a node and neither succeeded nor
/// failed (an unscheduled pod cannot use a volume yet).
fn is_running(pod: &Pod) -> bool {
    let scheduled = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("");
    scheduled && !matches!(phase, "Succeeded" | "Failed")
}

fn uses_claim(pod: &Pod, namespace: &str, claim: &str) -> bool {
    pod.metadata.namespace.as_deref() == Some(namespace)
        && pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .any(|v| v.persistent_volume_claim.as_ref().is_some_and(|c| c.claim_name == claim))
}

/// The duties for the `gone` nodes (each confirmed by the executor before it acts), by
/// node, in a stable order: attachments, volumes, drives, claims.
pub(crate) fn plan(obs: &Observed, driver: &str, gone: &BTreeSet<String>) -> BTreeMap<String, Vec<Duty>> {
    let finalizer = finalizer_name(driver);
    let mut out: BTreeMap<String, Vec<Duty>> = BTreeMap::new();
    let of_gone = |n: Option<&str>| n.filter(|n| gone.contains(*n)).map(String::from);

    for va in obs.attachments.iter().filter(|va| va.spec.attacher == driver) {
        let Some(node) = of_gone(Some(va.spec.node_name.as_str())) else { continue };
        let finalizers = va.finalizers();
        if va.meta().deletion_timestamp.is_some() && finalizers.contains(&finalizer) {
            out.entry(node).or_default().push(Duty::ReleaseAttachment {
                name: va.name_any(),
                finalizers: without(finalizers, &finalizer),
                resource_version: va.resource_version(),
            });
        }
    }

    let named: BTreeSet<&str> = obs.attachments.iter().filter_map(|va| va.spec.source.persistent_volume_name.as_deref()).collect();
    for pv in &obs.volumes {
        let Some(node) = of_gone(pv_node(pv, driver)) else { continue };
        let name = pv.name_any();
        let spec = pv.spec.as_ref();
        let finalizers = pv.finalizers();
        let duties = out.entry(node.clone()).or_default();
        // Our finalizer goes once no VolumeAttachment names the PV; a PV being deleted
        // loses it in the same patch as the provisioner's (one write, one resourceVersion).
        let release = finalizers.contains(&finalizer) && !named.contains(name.as_str());
        let reclaim = spec.and_then(|s| s.persistent_volume_reclaim_policy.as_deref());
        let handle = spec.and_then(|s| s.csi.as_ref()).map(|c| c.volume_handle.clone()).filter(|h| !h.is_empty());
        if let (Some(handle), "Released", Some("Delete")) = (handle, phase(pv), reclaim) {
            let keep: Vec<String> = finalizers
                .iter()
                .filter(|f| *f != PROVISIONER_FINALIZER && !(release && **f == finalizer))
                .cloned()
                .collect();
            duties.push(Duty::DeleteVolume {
                name: name.clone(),
                handle,
                finalizers: (keep.len() != finalizers.len()).then_some(keep),
                resource_version: pv.resource_version(),
            });
        } else if release {
            duties.push(Duty::ReleaseVolume {
                name: name.clone(),
                finalizers: without(finalizers, &finalizer),
                resource_version: pv.resource_version(),
            });
        }
        if phase(pv) == "Bound" {
            if let Some(duty) = claim_duty(obs, pv, &name, &node) {
                duties.push(duty);
            }
        }
    }

    for d in &obs.drives {
        if let Some(node) = of_gone(Some(d.spec.node.as_str())) {
            out.entry(node).or_default().push(Duty::DeleteDrive { name: d.name_any() });
        }
    }
    for duties in out.values_mut() {
        duties.sort_by_key(order);
    }
    out.retain(|_, d| !d.is_empty());
    out
}

fn order(d: &Duty) -> u8 {
    match d {
        Duty::ReleaseAttachment { .. } => 0,
        Duty::ReleaseVolume { .. } => 1,
        Duty::DeleteVolume { .. } => 2,
        Duty::DeleteDrive { .. } => 3,
        Duty::ReleaseClaim { .. } | Duty::WarnClaim { .. } => 4,
    }
}

/// What to do about the claim a gone node's Bound PV is bound to.
fn claim_duty(obs: &Observed, pv: &PersistentVolume, volume: &str, node: &str) -> Option<Duty> {
    let r = pv.spec.as_ref()?.claim_ref.as_ref()?;
    let (namespace, name) = (r.namespace.as_deref()?, r.name.as_deref()?);
    let claim = obs.claims.iter().find(|c| {
        c.metadata.namespace.as_deref() == Some(namespace)
            && c.metadata.name.as_deref() == Some(name)
            && c.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == Some(volume)
            && (r.uid.is_none() || c.metadata.uid == r.uid)
    })?;
    if claim.metadata.deletion_timestamp.is_some() {
        return None;
    }
    // The claim's own class, as `releasing_namespaces` reads it (pods are read only for
    // claims it names).
    let class = claim.spec.as_ref().and_then(|s| s.storage_class_name.clone()).unwrap_or_default();
    let policy = policy_of(obs, &class);
    let claim_ref = claim.object_ref(&());
    let volume = volume.to_string();
    match policy {
        OnNodeDeleted::ReleaseClaims => {
            let busy = obs.pods.iter().any(|p| is_running(p) && uses_claim(p, namespace, name));
            (!busy).then_some(Duty::ReleaseClaim { claim: claim_ref, volume, class })
        }
        OnNodeDeleted::KeepClaims => {
            let warned = claim.metadata.annotations.as_ref().and_then(|a| a.get(WARNED));
            (warned.map(String::as_str) != Some(node)).then_some(Duty::WarnClaim { claim: claim_ref, volume, class })
        }
    }
}
