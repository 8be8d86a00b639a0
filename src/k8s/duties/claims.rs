//! Claims that wait: the cluster duties' watch over Pending claims of drivelet's
//! StorageClasses, so that no claim waits without a reason, and claims of classes that
//! bind immediately get a node. Pure decisions here, table-tested in `claims_tests`; the
//! executor ([`super::claim_executor`]) reads and writes.
//!
//! Only the elected agent decides (the duties' Lease), so there is one writer in the
//! cluster. For every claim that is Pending, has no volume, is not being deleted and names
//! a StorageClass whose provisioner is drivelet's driver ([`decide`]):
//! 1. **Refused by the class or the claim**: what CreateVolume would refuse before it looks
//!    at a drive (a filesystem drivelet does not make, an access mode it does not serve,
//!    an unknown or bad parameter) is found by the very checks CreateVolume runs
//!    ([`crate::grpc::controller::refusal`]) on the capabilities and parameters the
//!    external-provisioner would send. The claim gets a Warning Event
//!    [`REASON_UNSUPPORTED`] saying why, in drivelet's words. Whatever the binding mode.
//! 2. **Immediate binding without a selected node**: drivelet picks the node.
//!    The candidates are the Nodes that exist, are not being deleted, are Ready, match
//!    the class's `allowedTopologies` (any term; every expression of a term `In` the
//!    node's labels) and have a CSIStorageCapacity of that class (their agent publishes it,
//!    `crate::k8s::capacity`; an earlier version's external-provisioner sidecar did)
//!    whose maximum volume size (else capacity) holds the claim's request. The one with
//!    the most capacity wins (ties: the first name). Its name is written as the claim's
//!    `volume.kubernetes.io/selected-node` annotation: the external-provisioner of that
//!    node, and only that one (node deployment, `--node-deployment-immediate-binding=false`),
//!    provisions it, so no two nodes make it. A Normal Event [`REASON_SELECTED`] says where
//!    and why. Without `allowedTopologies` every node counts (see docs/operations.md: the
//!    class then pins the claim's pod to the node with the most room). A claim whose
//!    provisioning fails there with RESOURCE_EXHAUSTED loses the annotation (the
//!    provisioner's rescheduling) and is decided again.
//!    A node that publishes other classes' room but not this class's yet is waited for,
//!    silently, while the class is younger than [`PUBLISH_WAIT`]; after that the Warning
//!    says what publishes a class's room (an agent with `kubernetes.capacity`; for a node
//!    still on the sidecar, its flag `--capacity-for-immediate-binding`).
//! 3. **Immediate binding, no node can take it**: a Warning Event [`REASON_NO_NODE`]
//!    naming what the class allows and what each allowed node lacks; decided again every
//!    round, so it is provisioned once a node has room.
//! 4. **Immediate binding from a data source**: a clone is made on its source claim's
//!    node (the only node whose agent holds the source), when that node is a candidate; a
//!    claim restored from a VolumeSnapshot is refused with [`REASON_NO_NODE`]: which node
//!    holds the snapshot is known only once a pod is scheduled (WaitForFirstConsumer).
//!
//! A refusal's Warning is recorded once per claim and cause: the cause's code is written
//! to the claim's [`WAITING`] annotation and a claim so annotated is not warned again for
//! the same cause, whichever agent leads later (Kubernetes aggregates any repeat anyway).
//! Selecting a node clears the annotation, so a later refusal speaks again.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSIStorageCapacity, StorageClass};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::pv_node;
use crate::config::human_bytes;
use crate::grpc::proto::csi;
use crate::k8s::resize::quantity_bytes;
use crate::TOPOLOGY_NODE_KEY;

/// The annotation the scheduler and the external-provisioner read: the node a claim is
/// provisioned on.
pub(crate) const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// The annotation naming the cause (a code) a waiting claim was last warned about.
pub(crate) const WAITING: &str = "drivelet.io/waiting-reason";

/// The Warning Event reason of a claim drivelet will not provision as asked.
pub(crate) const REASON_UNSUPPORTED: &str = "NotSupportedByDrivelet";
/// The Warning Event reason of an Immediate claim no node can take now.
pub(crate) const REASON_NO_NODE: &str = "NoNodeForClaim";
/// The Normal Event reason of an Immediate claim given a node.
pub(crate) const REASON_SELECTED: &str = "NodeSelected";

/// The StorageClass parameter the external-provisioner turns into the filesystem type.
const FSTYPE: &str = "csi.storage.k8s.io/fstype";

/// What one round of the claim watch reads.
#[derive(Default)]
pub(crate) struct ClaimsObserved {
    /// Every claim.
    pub claims: Vec<PersistentVolumeClaim>,
    /// Every StorageClass.
    pub classes: Vec<StorageClass>,
    /// Every Node.
    pub nodes: Vec<Node>,
    /// CSIStorageCapacity objects in drivelet's namespace (the agents', or the sidecars' of
    /// nodes not upgraded yet).
    pub capacities: Vec<CSIStorageCapacity>,
    /// Every PV (a clone's source claim's node).
    pub volumes: Vec<PersistentVolume>,
    /// The time of the reading (a new class's room is awaited for [`PUBLISH_WAIT`]).
    pub now: Option<Timestamp>,
}

/// How long a node that publishes other classes' room is given to publish a new class's
/// before the claim is warned (an agent writes it within seconds of the class; the
/// sidecar of an earlier version polled every 15 s).
pub(crate) const PUBLISH_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Why a claim waits, for its Warning Event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// A short stable code of the cause, remembered in [`WAITING`].
    pub code: String,
    /// The Event reason.
    pub reason: &'static str,
    /// The Event's note: the whole reason in plain words.
    pub message: String,
}

/// What to do about one claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClaimDecision {
    /// Write `node` as the claim's selected node, with a Normal Event saying why.
    Select {
        /// The node.
        node: String,
        /// Why this node, in words.
        why: String,
    },
    /// Warn once (per cause) why the claim waits.
    Refuse(Refusal),
}

/// One claim's decision, with what the executor needs to act on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClaimAction {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// The claim's resourceVersion, guarding a selected-node write.
    pub resource_version: Option<String>,
    /// The decision.
    pub decision: ClaimDecision,
}

/// The claims (namespace, name) that `claims` clone: the PVs a round needs to know
/// their node.
pub(crate) fn clone_sources(claims: &[PersistentVolumeClaim]) -> std::collections::BTreeSet<(String, String)> {
    claims
        .iter()
        .filter_map(|c| {
            let spec = c.spec.as_ref()?;
            let (kind, name) = spec
                .data_source_ref
                .as_ref()
                .map(|r| (r.kind.as_str(), r.name.as_str()))
                .or_else(|| spec.data_source.as_ref().map(|r| (r.kind.as_str(), r.name.as_str())))?;
            (kind == "PersistentVolumeClaim").then(|| (c.namespace().unwrap_or_default(), name.to_string()))
        })
        .collect()
}

/// The decisions of one round, claims in namespace/name order; refusals already warned
/// for the same cause are left out.
pub(crate) fn plan_claims(obs: &ClaimsObserved, driver: &str) -> Vec<ClaimAction> {
    let classes: HashMap<&str, &StorageClass> =
        obs.classes.iter().filter_map(|c| Some((c.metadata.name.as_deref()?, c))).collect();
    let mut out: Vec<ClaimAction> = obs
        .claims
        .iter()
        .filter_map(|claim| {
            let class = classes.get(claim.spec.as_ref()?.storage_class_name.as_deref()?)?;
            let decision = decide(claim, class, obs, driver)?;
            if let ClaimDecision::Refuse(r) = &decision {
                let warned = claim.annotations().get(WAITING);
                if warned == Some(&r.code) {
                    return None;
                }
            }
            Some(ClaimAction {
                namespace: claim.namespace().unwrap_or_default(),
                name: claim.name_any(),
                resource_version: claim.resource_version(),
                decision,
            })
        })
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

/// Whether `claim` waits for a volume: Pending (or no phase yet), no volume, not being
/// deleted.
fn waiting(claim: &PersistentVolumeClaim) -> bool {
    let phase = claim.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let volume = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()).unwrap_or("");
    phase == "Pending" && volume.is_empty() && claim.metadata.deletion_timestamp.is_none()
}

/// The decision on one claim of `class`, `None` when there is nothing to do.
pub(crate) fn decide(claim: &PersistentVolumeClaim, class: &StorageClass, obs: &ClaimsObserved, driver: &str) -> Option<ClaimDecision> {
    if class.provisioner != driver || !waiting(claim) {
        return None;
    }
    let class_name = class.name_any();
    if let Some(why) = refusal_of(claim, class) {
        return Some(ClaimDecision::Refuse(Refusal {
            code: "unsupported".into(),
            reason: REASON_UNSUPPORTED,
            message: format!(
                "drivelet does not provision this claim of StorageClass {class_name}: {why}. Nothing is made for it; \
                 it stays Pending until it is deleted."
            ),
        }));
    }
    let immediate = class.volume_binding_mode.as_deref().unwrap_or("Immediate") == "Immediate";
    let selected = claim.annotations().get(SELECTED_NODE).is_some_and(|n| !n.is_empty());
    if !immediate || selected {
        return None;
    }
    match place(claim, class, obs, driver) {
        Ok(Some((node, why))) => Some(ClaimDecision::Select { node, why }),
        Ok(None) => None,
        Err(refusal) => Some(ClaimDecision::Refuse(refusal)),
    }
}

/// What CreateVolume would refuse of this claim before looking at a drive: the
/// capabilities and parameters the external-provisioner sends, checked by CreateVolume's
/// own checks.
pub(crate) fn refusal_of(claim: &PersistentVolumeClaim, class: &StorageClass) -> Option<String> {
    let params: HashMap<String, String> = class.parameters.clone().unwrap_or_default().into_iter().collect();
    let caps = capabilities(claim, params.get(FSTYPE).map(String::as_str).unwrap_or(""));
    crate::grpc::controller::refusal(&caps, &params)
}

/// The volume capabilities the external-provisioner asks for a claim: one per access
/// mode, block or mount (with the class's filesystem).
pub(crate) fn capabilities(claim: &PersistentVolumeClaim, fs_type: &str) -> Vec<csi::VolumeCapability> {
    use csi::volume_capability::access_mode::Mode;
    use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
    let spec = claim.spec.as_ref();
    let block = spec.and_then(|s| s.volume_mode.as_deref()) == Some("Block");
    let modes = spec.and_then(|s| s.access_modes.clone()).unwrap_or_default();
    let modes = if modes.is_empty() { vec!["ReadWriteOnce".to_string()] } else { modes };
    modes
        .iter()
        .map(|m| {
            let mode = match m.as_str() {
                "ReadWriteOnce" => Mode::SingleNodeWriter,
                "ReadWriteOncePod" => Mode::SingleNodeSingleWriter,
                "ReadOnlyMany" => Mode::MultiNodeReaderOnly,
                "ReadWriteMany" => Mode::MultiNodeMultiWriter,
                _ => Mode::Unknown,
            };
            let access_type = if block {
                AccessType::Block(BlockVolume {})
            } else {
                AccessType::Mount(MountVolume { fs_type: fs_type.to_string(), ..Default::default() })
            };
            csi::VolumeCapability { access_mode: Some(AccessMode { mode: mode as i32 }), access_type: Some(access_type) }
        })
        .collect()
}

/// The bytes a claim asks for (0 when it says nothing readable).
fn requested(claim: &PersistentVolumeClaim) -> u64 {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref()?.requests.as_ref()?.get("storage"))
        .and_then(|q| quantity_bytes(&q.0))
        .unwrap_or(0)
}

/// A node's room for a class, from its CSIStorageCapacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Room {
    /// Free bytes for the class.
    capacity: u64,
    /// The largest volume it can make now.
    largest: u64,
}

/// Each node's room for `class`, from the CSIStorageCapacity objects whose node topology
/// names one node by `topology.drivelet.io/node`.
fn rooms(obs: &ClaimsObserved, class: &str) -> BTreeMap<String, Room> {
    let mut out = BTreeMap::new();
    for c in obs.capacities.iter().filter(|c| c.storage_class_name == class) {
        let Some(node) = c.node_topology.as_ref().and_then(|t| t.match_labels.as_ref()?.get(TOPOLOGY_NODE_KEY)) else {
            continue;
        };
        let capacity = c.capacity.as_ref().and_then(|q| quantity_bytes(&q.0)).unwrap_or(0);
        let largest = c.maximum_volume_size.as_ref().and_then(|q| quantity_bytes(&q.0)).unwrap_or(capacity);
        out.insert(node.clone(), Room { capacity, largest });
    }
    out
}

fn ready(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_none()
        && node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether `node`'s labels satisfy the class's allowed topologies (any term; all of a
/// term's expressions). No allowed topologies: every node.
fn allowed(class: &StorageClass, node: &Node) -> bool {
    let Some(terms) = class.allowed_topologies.as_ref().filter(|t| !t.is_empty()) else { return true };
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let name = node.name_any();
    terms.iter().any(|term| {
        term.match_label_expressions.iter().flatten().all(|e| {
            // The driver's own key is the node's name, also before kubelet labels it.
            let value = labels.get(&e.key).cloned().or_else(|| (e.key == TOPOLOGY_NODE_KEY).then(|| name.clone()));
            value.is_some_and(|v| e.values.contains(&v))
        })
    })
}

/// The class's allowed topologies in words: `topology.drivelet.io/node in (node-1, node-2)`.
fn topologies_words(class: &StorageClass) -> String {
    let Some(terms) = class.allowed_topologies.as_ref().filter(|t| !t.is_empty()) else {
        return "any node".into();
    };
    let terms: Vec<String> = terms
        .iter()
        .map(|t| {
            let exprs: Vec<String> =
                t.match_label_expressions.iter().flatten().map(|e| format!("{} in ({})", e.key, e.values.join(", "))).collect();
            exprs.join(" and ")
        })
        .collect();
    format!("only nodes with {}", terms.join(", or "))
}

/// The node to provision an Immediate claim on, with why; or why there is none; `None`
/// when a node that may take it has not published its room for a new class yet (it
/// publishes other classes'): decided again next round, without a Warning.
fn place(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    obs: &ClaimsObserved,
    driver: &str,
) -> Result<Option<(String, String)>, Refusal> {
    let class_name = class.name_any();
    let size = requested(claim);
    let no_node = |code: &str, why: String| Refusal {
        code: code.into(),
        reason: REASON_NO_NODE,
        message: format!("StorageClass {class_name} binds immediately (volumeBindingMode Immediate) {why}."),
    };
    let source = claim.spec.as_ref().and_then(|s| s.data_source_ref.as_ref().map(|r| (r.kind.clone(), r.name.clone())).or_else(|| s.data_source.as_ref().map(|r| (r.kind.clone(), r.name.clone()))));
    // A clone is made where its source is; a restore's node is known only to a pod's scheduling.
    let source_node = match &source {
        None => None,
        Some((kind, _)) if kind == "VolumeSnapshot" => {
            return Err(no_node(
                "snapshot",
                "but this claim is restored from a VolumeSnapshot, and a restore is made on the node that holds the snapshot, which drivelet \
                 learns only when the claim's pod is scheduled: use a StorageClass with volumeBindingMode \
                 WaitForFirstConsumer for restores"
                    .into(),
            ))
        }
        Some((kind, name)) if kind == "PersistentVolumeClaim" => {
            let ns = claim.namespace();
            let pv = obs.volumes.iter().find(|pv| {
                pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_some_and(|r| r.namespace == ns && r.name.as_deref() == Some(name))
            });
            match pv.and_then(|pv| pv_node(pv, driver)) {
                Some(n) => Some(n.to_string()),
                None => return Err(no_node("clone-source", format!("and this claim clones claim {name}, which has no drivelet volume yet; it is decided again once it has one"))),
            }
        }
        Some(_) => None,
    };
    let rooms = rooms(obs, &class_name);
    let publishing = |node: &str| {
        obs.capacities.iter().any(|c| {
            c.node_topology.as_ref().and_then(|t| t.match_labels.as_ref()?.get(TOPOLOGY_NODE_KEY)).map(String::as_str) == Some(node)
        })
    };
    let mut not_yet = false;
    // A class younger than PUBLISH_WAIT (or of unknown age) may not be published yet.
    let new_class = match (obs.now, class.metadata.creation_timestamp.as_ref()) {
        (Some(now), Some(made)) => now.duration_since(made.0).unsigned_abs() < PUBLISH_WAIT,
        _ => true,
    };
    let mut lacks: Vec<String> = Vec::new();
    let mut best: Option<(&str, Room)> = None;
    let mut any_allowed = false;
    for node in &obs.nodes {
        let name = node.metadata.name.as_deref().unwrap_or("");
        if !allowed(class, node) || source_node.as_deref().is_some_and(|s| s != name) {
            continue;
        }
        any_allowed = true;
        if !ready(node) {
            lacks.push(format!("{name} is not Ready"));
            continue;
        }
        let Some(room) = rooms.get(name).copied() else {
            if publishing(name) {
                not_yet |= new_class;
                lacks.push(format!(
                    "{name} publishes no storage capacity for this class (drivelet publishes every class of \
                     its driver with kubernetes.capacity on; a node still running the csi-provisioner sidecar \
                     needs --capacity-for-immediate-binding=true)"
                ));
            } else {
                lacks.push(format!("{name} publishes no storage capacity (its drivelet runs with kubernetes.capacity off, or not at all)"));
            }
            continue;
        };
        if room.largest < size {
            lacks.push(format!("{name} can make at most {} ({} free)", human_bytes(room.largest), human_bytes(room.capacity)));
            continue;
        }
        if best.is_none_or(|(_, b)| room.capacity > b.capacity) {
            best = Some((name, room));
        }
    }
    if let Some((node, room)) = best {
        let from = match &source_node {
            Some(_) => "the node of the claim it clones".to_string(),
            None if class.allowed_topologies.as_ref().is_some_and(|t| !t.is_empty()) => {
                format!("the allowed node ({}) with the most room", topologies_words(class))
            }
            None => "the node with the most room (the class names no allowed topologies)".to_string(),
        };
        let why = format!(
            "StorageClass {class_name} binds immediately: drivelet provisions this claim ({}) on {node}, {from}: {} free",
            human_bytes(size),
            human_bytes(room.capacity)
        );
        return Ok(Some((node.to_string(), why)));
    }
    if not_yet {
        return Ok(None);
    }
    let allows = topologies_words(class);
    if !any_allowed {
        let what = match &source_node {
            Some(n) => format!("and this claim clones a claim whose volume is on node {n}, which the class does not allow or which is gone"),
            None => format!("and allows {allows}, but no such node exists"),
        };
        return Err(no_node("no-node", format!("{what}: nothing is provisioned until one does (or the class is replaced)")));
    }
    lacks.sort();
    Err(no_node(
        "no-room",
        format!(
            "and allows {allows}, but none of them can take {} now: {}. The claim is provisioned as soon as one can",
            human_bytes(size),
            lacks.join("; ")
        ),
    ))
}
