//! The relay: what the API server cannot filter by node, the elected agent labels with
//! the node that holds it, so that every other watch in the cluster is a node's own.
//!
//! A node's agent watches only the objects labelled `drivelet.io/node=<its node>`
//! ([`NODE_LABEL`], see `crate::k8s::scope`). Kubernetes has no field selector for a
//! PV's node affinity, a claim's selected node (an annotation), a VolumeAttachment's
//! `spec.nodeName` (v1.32) or a VolumeSnapshotContent's source, so one agent (the holder
//! of the cluster duties' Lease, `crate::k8s::duties`) holds the single cluster-wide
//! watch of each and writes the label; each node then watches its own by that label.
//!
//! Which node an object belongs to, decided by the pure functions here (table-tested in
//! `tests`):
//! - a PV of the driver: the one node of its required node affinity on
//!   `topology.drivelet.io/node` ([`crate::k8s::duties::pv_node`]), else (a PV made by
//!   hand without it) the node whose Drive objects list its volume;
//! - a VolumeAttachment of the driver: its `spec.nodeName`;
//! - a claim: the node of the PV it is bound to (by `spec.volumeName`, or the PV whose
//!   `claimRef` names it), else, for a claim the driver provisions (the
//!   `volume.kubernetes.io/storage-provisioner` annotation names it), its
//!   `volume.kubernetes.io/selected-node`;
//! - a VolumeSnapshotContent of the driver: the node of its source volume (the PV with
//!   that volume handle, else the node whose Drive objects list the volume), else the
//!   node whose Drive objects list its snapshot (`status.snapshotHandle` or
//!   `spec.source.snapshotHandle`).
//!
//! Rules:
//! - An object whose node is known and whose label says otherwise (or nothing) gets one
//!   merge patch of that one label; an object whose node is not known is left as it is
//!   (never unlabelled), and looked at again when what decides it arrives (its PV, its
//!   Drive objects).
//! - Objects of other drivers are never written.
//! - The relay runs only while its agent holds the Lease; a new holder lists everything
//!   (paginated) and catches up, and a label already right costs nothing.
//! - Its view is the elected agent's picture of the cluster: the cluster duties decide
//!   from it (gone nodes' objects, waiting claims) instead of listing every collection.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use serde_json::{json, Value};

pub(crate) use crate::k8s::drives::NODE_LABEL;
use crate::k8s::drives::node_label_value;

/// The relay task: its watches and its writes.
pub(crate) mod controller;
/// Its view of which node holds what, compact, which the cluster duties read too.
pub(crate) mod view;
#[cfg(test)]
mod tests;

/// The annotation the PV controller sets on a claim naming the provisioner of its class.
pub(crate) const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// The same annotation as older clusters spell it.
pub(crate) const STORAGE_PROVISIONER_BETA: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// The annotation the scheduler (or the elected agent, for an Immediate class) sets on a
/// claim: the node it is provisioned on.
pub(crate) const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// The node a VolumeAttachment of `driver` is for.
pub(crate) fn va_node<'a>(va: &'a VolumeAttachment, driver: &str) -> Option<&'a str> {
    (va.spec.attacher == driver && !va.spec.node_name.is_empty()).then_some(va.spec.node_name.as_str())
}

/// Whether `driver` provisions `claim` (the PV controller's annotation names it).
pub(crate) fn provisioned_by(claim: &PersistentVolumeClaim, driver: &str) -> bool {
    let a = claim.metadata.annotations.as_ref();
    [STORAGE_PROVISIONER, STORAGE_PROVISIONER_BETA].iter().any(|k| a.and_then(|a| a.get(*k)).is_some_and(|v| v == driver))
}

/// The claim's selected node, when one is set.
pub(crate) fn selected_node(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim.metadata.annotations.as_ref()?.get(SELECTED_NODE).map(String::as_str).filter(|n| !n.is_empty())
}

/// The node a claim belongs to: its PV's (`pv_node`, when it is bound to a PV of the
/// driver), else its selected node when the driver provisions it (`ours`).
pub(crate) fn claim_node<'a>(pv_node: Option<&'a str>, selected: Option<&'a str>, ours: bool) -> Option<&'a str> {
    pv_node.or(selected.filter(|_| ours))
}

/// The node a VolumeSnapshotContent of the driver belongs to: its source volume's node,
/// else its snapshot's.
pub(crate) fn content_node<'a>(volume_node: Option<&'a str>, snapshot_node: Option<&'a str>) -> Option<&'a str> {
    volume_node.or(snapshot_node)
}

/// The merge patch that gives an object labelled `current` the label of `node`, or
/// `None` when it has it already.
pub(crate) fn label_patch(current: Option<&str>, node: &str) -> Option<Value> {
    let want = node_label_value(node);
    (current != Some(want.as_str())).then(|| json!({"metadata": {"labels": {NODE_LABEL: want}}}))
}
