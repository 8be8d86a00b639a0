//! Re-homing claims: every volume this node serves whose PV is pinned to another node
//! (its drive was moved here and adopted), or whose PV is gone (a rebuilt cluster), is
//! given back to its claim, pinned to this node. Data is never touched: only PV and
//! claim objects are written.
//!
//! The decision for one volume is the pure [`decide`] (table-tested in `tests`), from
//! the volume's record (its `binding`: PV and claim, from the CreateVolume request or its
//! drive's note), its PV as the API has it, the claim it names, and whether the drive's
//! adoption asked to restore claims (`spec.restoreClaims` of its Drive object):
//! 1. The PV exists, is of our driver with this volume as its handle, and is pinned to
//!    another node (`topology.drivelet.io/node`): PV node affinity is immutable, so it is
//!    replaced, in an order where no moment exists in which a Delete reclaim policy could
//!    reach DeleteVolume: its reclaim policy is patched to `Retain` first (the one it had
//!    is kept in the annotation [`POLICY_BEFORE`]), then its finalizers are removed (so
//!    it can go while bound), then it is deleted, then a PV of the same name is created:
//!    the same spec and labels, pinned to this node, with its former reclaim policy, its
//!    claimRef (namespace, name, uid) and `pv.kubernetes.io/provisioned-by`. The PV
//!    controller binds the claim again (a Lost claim whose PV returns with a claimRef of
//!    its uid goes Bound). A Normal Event `VolumeAdopted` on the claim says which node
//!    serves it now and why.
//!    It is left as it is when its claim is gone (the claim's deletion was the user's
//!    word; an admin decides), or when the claim of that name is another one now (uid)
//!    or bound to another PV.
//! 2. The PV is gone and the claim exists naming it (`spec.volumeName`): the PV is
//!    created (from the record and the claim; reclaim policy `Retain`, as the one it had
//!    is not known), `VolumeRestored` on the claim.
//! 3. Neither exists: with `restoreClaims`, the claim is created (namespace, name, size,
//!    StorageClass, block or filesystem, ReadWriteOnce, `spec.volumeName` the PV's name,
//!    annotated [`RESTORED_FOR`] with the volume id) and then the PV bound to it
//!    (`ClaimRestored` on the claim). Without, the volume is kept and listed: its Drive
//!    object shows it.
//!
//!    A PV made again (2 and 3) for an encrypted volume names the node-stage Secret its
//!    StorageClass names ([`stage_secret_of`]), so kubelet hands NodeStageVolume the
//!    key-encryption key as it did for the provisioner's PV.
//! 4. The PV is pinned here already (its node affinity names this node): nothing, but the
//!    record's binding is filled from the claim bound to it (uid, StorageClass) when it
//!    differs, so the drive's note says it. A PV of another driver or volume, one that
//!    names no node under `topology.drivelet.io/node` (nothing says it is elsewhere), and
//!    a volume whose note names no PV, are left.
//!
//! Every pass decides from what it reads, so a pass killed between any two steps is
//! finished by the next: a PV found with `Retain` and [`POLICY_BEFORE`] still pinned
//! elsewhere goes on from there; a PV missing while its claim names it is created. A
//! create answered AlreadyExists (the old PV is still going) is tried again next pass.
//! The one thing a crash between the delete and the create loses is the old PV's exact
//! spec: the PV is then made from the record, with reclaim policy `Retain`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference, PersistentVolume,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeSpec, VolumeNodeAffinity, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use crate::actors::volumes::model::VolumeRecord;
use crate::k8s::duties::PROVISIONER_FINALIZER;
use crate::words::Binding;
use crate::TOPOLOGY_NODE_KEY;

/// Carries the steps out against the API server.
pub(crate) mod executor;

#[cfg(test)]
mod fake_api_tests;
#[cfg(test)]
mod tests;

/// The annotation on a PV being replaced that keeps the reclaim policy it had before it
/// was set to `Retain`.
pub(crate) const POLICY_BEFORE: &str = "drivelet.io/reclaim-policy-before-rehome";

/// The annotation on a claim drivelet restored, naming the volume it was restored for.
pub(crate) const RESTORED_FOR: &str = "drivelet.io/restored-for-volume";

/// The annotation naming the provisioner of a PV.
pub(crate) const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

/// Reason of the Event on a claim whose PV was replaced pinned to this node.
pub(crate) const VOLUME_ADOPTED: &str = "VolumeAdopted";
/// Reason of the Event on a claim whose missing PV was created again.
pub(crate) const VOLUME_RESTORED: &str = "VolumeRestored";
/// Reason of the Event on a claim drivelet created again.
pub(crate) const CLAIM_RESTORED: &str = "ClaimRestored";

/// What is known of one volume this node serves, for [`decide`].
#[derive(Debug, Clone)]
pub(crate) struct Seen<'a> {
    /// The volume's record.
    pub record: &'a VolumeRecord,
    /// Its PV (by the binding's name), when it exists.
    pub pv: Option<&'a PersistentVolume>,
    /// The claim [`claim_to_read`] names, when it exists.
    pub claim: Option<&'a PersistentVolumeClaim>,
    /// The adoption of its drive asked to restore claims that are gone.
    pub restore_claims: bool,
    /// For an encrypted volume whose PV is made again: the Secret (namespace, name) its
    /// StorageClass names as the node-stage secret, so kubelet hands the key-encryption
    /// key to NodeStageVolume as it did before.
    pub stage_secret: Option<(String, String)>,
}

/// The node-stage Secret a StorageClass's `parameters` name for the claim `ns/name`
/// and the PV `pv` (the provisioner's `${pvc.namespace}`, `${pvc.name}` and `${pv.name}`
/// filled in): `(namespace, name)`.
pub(crate) fn stage_secret_of(parameters: &BTreeMap<String, String>, (ns, name): (&str, &str), pv: &str) -> Option<(String, String)> {
    let fill = |v: &String| v.replace("${pvc.namespace}", ns).replace("${pvc.name}", name).replace("${pv.name}", pv);
    let secret = parameters.get("csi.storage.k8s.io/node-stage-secret-name").map(fill)?;
    let namespace = parameters.get("csi.storage.k8s.io/node-stage-secret-namespace").map(fill)?;
    Some((namespace, secret))
}

/// One write to the API server (or to the volume manager).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    /// Patch the PV's reclaim policy to `Retain`, keeping `before` in [`POLICY_BEFORE`].
    Retain {
        /// The PV.
        pv: String,
        /// The reclaim policy it had.
        before: String,
    },
    /// Remove every finalizer of the PV.
    DropFinalizers {
        /// The PV.
        pv: String,
    },
    /// Delete the PV (gone already is done).
    DeletePv {
        /// The PV.
        pv: String,
    },
    /// Create the claim (then the next [`Step::CreatePv`] binds to its uid).
    CreateClaim(Box<PersistentVolumeClaim>),
    /// Create the PV.
    CreatePv(Box<PersistentVolume>),
    /// Record a Normal Event on a claim.
    Tell {
        /// The claim's namespace.
        namespace: String,
        /// The claim's name.
        name: String,
        /// The Event's reason.
        reason: &'static str,
        /// What happened, in plain words.
        note: String,
    },
    /// Record the volume's binding (the volume manager stores it; its note follows).
    SetBinding(Binding),
}

/// What to do for one volume, and why, in plain words.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Plan {
    /// The steps, in order (empty: nothing to do).
    pub steps: Vec<Step>,
    /// Why, in plain words (logged when it changes).
    pub why: String,
}

impl Plan {
    fn nothing(why: impl Into<String>) -> Plan {
        Plan { steps: Vec::new(), why: why.into() }
    }
}

/// The claim to read for `record`, whose PV is `pv`: the PV's claimRef, else the claim
/// the binding names (`None`: no claim is known).
pub(crate) fn claim_to_read(record: &VolumeRecord, pv: Option<&PersistentVolume>) -> Option<(String, String)> {
    if let Some(r) = pv.and_then(|p| p.spec.as_ref()?.claim_ref.as_ref()) {
        return Some((r.namespace.clone().unwrap_or_default(), r.name.clone().unwrap_or_default()));
    }
    let b = &record.binding;
    (!b.claim_name.is_empty()).then(|| (b.claim_namespace.clone(), b.claim_name.clone()))
}

/// The nodes a PV's required node affinity names under [`TOPOLOGY_NODE_KEY`] (`In`).
pub(crate) fn pinned_nodes(pv: &PersistentVolume) -> Vec<String> {
    let terms = pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref()).and_then(|a| a.required.as_ref());
    let mut out: Vec<String> = terms
        .into_iter()
        .flat_map(|r| r.node_selector_terms.iter())
        .flat_map(|t| t.match_expressions.iter().flatten())
        .filter(|e| e.key == TOPOLOGY_NODE_KEY && e.operator == "In")
        .flat_map(|e| e.values.iter().flatten().cloned())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Required node affinity to `node` alone, as drivelet's PVs carry it.
pub(crate) fn pinned_to(node: &str) -> VolumeNodeAffinity {
    VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(vec![NodeSelectorRequirement {
                    key: TOPOLOGY_NODE_KEY.into(),
                    operator: "In".into(),
                    values: Some(vec![node.into()]),
                }]),
                ..Default::default()
            }],
        }),
    }
}

fn claim_words(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

fn claim_ref(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        uid: (!uid.is_empty()).then(|| uid.into()),
        ..Default::default()
    }
}

/// The PV replacing `pv`: the same name, labels, annotations and spec, pinned to `node`,
/// with reclaim policy `policy`, `provisioned-by` `driver`, its claimRef reduced to the
/// claim's identity, and of its finalizers only the provisioner's.
pub(crate) fn replacement(pv: &PersistentVolume, node: &str, policy: &str, driver: &str) -> PersistentVolume {
    let mut spec = pv.spec.clone().unwrap_or_default();
    spec.node_affinity = Some(pinned_to(node));
    spec.persistent_volume_reclaim_policy = Some(policy.into());
    spec.claim_ref = spec.claim_ref.map(|c| {
        claim_ref(&c.namespace.unwrap_or_default(), &c.name.unwrap_or_default(), &c.uid.unwrap_or_default())
    });
    let mut annotations = pv.metadata.annotations.clone().unwrap_or_default();
    annotations.remove(POLICY_BEFORE);
    annotations.insert(PROVISIONED_BY.into(), driver.into());
    let finalizers: Vec<String> = pv.finalizers().iter().filter(|f| *f == PROVISIONER_FINALIZER).cloned().collect();
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(pv.name_any()),
            labels: pv.metadata.labels.clone(),
            annotations: Some(annotations),
            finalizers: (!finalizers.is_empty()).then_some(finalizers),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// The PV of `record` made from the record alone, bound to the claim `ns/name` (`uid`,
/// empty when the claim is created in the same pass), of class `class`, with
/// `access_modes`, pinned to `node`, reclaim policy `Retain`.
pub(crate) fn pv_of(record: &VolumeRecord, (ns, name, uid): (&str, &str, &str), class: &str, access_modes: Vec<String>, node: &str, driver: &str) -> PersistentVolume {
    let attributes: BTreeMap<String, String> = crate::grpc::controller::context_of(record).into_iter().collect();
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(record.binding.pv.clone()),
            annotations: Some(BTreeMap::from([(PROVISIONED_BY.to_string(), driver.to_string())])),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([("storage".to_string(), Quantity(record.size.to_string()))])),
            access_modes: Some(if access_modes.is_empty() { vec!["ReadWriteOnce".into()] } else { access_modes }),
            volume_mode: Some(if record.block { "Block" } else { "Filesystem" }.into()),
            storage_class_name: Some(class.into()),
            persistent_volume_reclaim_policy: Some("Retain".into()),
            claim_ref: Some(claim_ref(ns, name, uid)),
            node_affinity: Some(pinned_to(node)),
            csi: Some(CSIPersistentVolumeSource {
                driver: driver.into(),
                volume_handle: record.id.clone(),
                fs_type: (!record.block && !record.fs_type.is_empty()).then(|| record.fs_type.clone()),
                volume_attributes: Some(attributes),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// Names the node-stage Secret in a PV made again (an encrypted volume's).
fn with_stage_secret(pv: &mut PersistentVolume, secret: Option<&(String, String)>) {
    let (Some((namespace, name)), Some(csi)) = (secret, pv.spec.as_mut().and_then(|s| s.csi.as_mut())) else { return };
    csi.node_stage_secret_ref = Some(k8s_openapi::api::core::v1::SecretReference { name: Some(name.clone()), namespace: Some(namespace.clone()) });
}

/// The claim restored for `record`: its binding's namespace, name and class, its size,
/// block or filesystem, ReadWriteOnce, naming its PV, annotated [`RESTORED_FOR`].
pub(crate) fn claim_of(record: &VolumeRecord) -> PersistentVolumeClaim {
    let b = &record.binding;
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(b.claim_name.clone()),
            namespace: Some(b.claim_namespace.clone()),
            annotations: Some(BTreeMap::from([(RESTORED_FOR.to_string(), record.id.clone())])),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_string(), Quantity(record.size.to_string()))])),
                ..Default::default()
            }),
            storage_class_name: Some(b.storage_class.clone()),
            volume_mode: Some(if record.block { "Block" } else { "Filesystem" }.into()),
            volume_name: Some(b.pv.clone()),
            ..Default::default()
        }),
        status: None,
    }
}

/// The binding the record should carry: its PV and the claim bound to it (`None`: the
/// record says so already, or no claim is bound to the PV).
pub(crate) fn binding_update(record: &VolumeRecord, claim: Option<&PersistentVolumeClaim>) -> Option<Binding> {
    let c = claim?;
    let spec = c.spec.as_ref()?;
    if spec.volume_name.as_deref() != Some(record.binding.pv.as_str()) {
        return None;
    }
    let want = Binding {
        pv: record.binding.pv.clone(),
        claim_namespace: c.namespace().unwrap_or_default(),
        claim_name: c.name_any(),
        claim_uid: c.uid().unwrap_or_default(),
        storage_class: spec.storage_class_name.clone().unwrap_or_default(),
    };
    (want != record.binding).then_some(want)
}

/// What to do for the volume `seen` describes, served by `node` for `driver` (see the
/// module rules).
pub(crate) fn decide(node: &str, driver: &str, seen: &Seen<'_>) -> Plan {
    let rec = seen.record;
    let (id, pv_name) = (rec.id.as_str(), rec.binding.pv.as_str());
    if pv_name.is_empty() {
        return Plan::nothing(format!("volume {id}: no PV is known for it (its note names none)"));
    }
    match seen.pv {
        Some(pv) => decide_existing(node, driver, seen, pv),
        None => decide_missing(node, driver, seen),
    }
}

fn decide_existing(node: &str, driver: &str, seen: &Seen<'_>, pv: &PersistentVolume) -> Plan {
    let rec = seen.record;
    let (id, pv_name) = (rec.id.as_str(), rec.binding.pv.as_str());
    let spec = pv.spec.as_ref();
    let Some(csi) = spec.and_then(|s| s.csi.as_ref()) else {
        return Plan::nothing(format!("volume {id}: PV {pv_name} is not a CSI volume of {driver}; it is left as it is"));
    };
    if csi.driver != driver {
        return Plan::nothing(format!("volume {id}: PV {pv_name} is of driver {}, not {driver}; it is left as it is", csi.driver));
    }
    if csi.volume_handle != id {
        return Plan::nothing(format!("volume {id}: PV {pv_name} serves volume {}, not this one; it is left as it is", csi.volume_handle));
    }
    let pinned = pinned_nodes(pv);
    if pinned.iter().any(|n| n == node) {
        let mut plan = Plan::nothing(format!("volume {id}: PV {pv_name} is pinned to this node"));
        plan.steps.extend(binding_update(rec, seen.claim).map(Step::SetBinding));
        return plan;
    }
    if pinned.is_empty() {
        return Plan::nothing(format!(
            "volume {id}: PV {pv_name} names no node under {TOPOLOGY_NODE_KEY}; it is left as it is (nothing says it is pinned elsewhere)"
        ));
    }
    let elsewhere = format!("node {}", pinned.join(", "));
    let cref = spec.and_then(|s| s.claim_ref.as_ref());
    let mut tell = None;
    if let Some(r) = cref {
        let (ns, name) = (r.namespace.clone().unwrap_or_default(), r.name.clone().unwrap_or_default());
        let shown = claim_words(&ns, &name);
        let Some(c) = seen.claim else {
            return Plan::nothing(format!(
                "volume {id}: PV {pv_name} is pinned to {elsewhere} and its claim {shown} is gone; it is left as it is \
                 (deleting a claim is its owner's word): delete the PV, or the volume, if the data is not wanted"
            ));
        };
        if r.uid.as_deref().is_some_and(|u| !u.is_empty()) && c.uid() != r.uid {
            return Plan::nothing(format!(
                "volume {id}: PV {pv_name} is bound to claim {shown} of uid {}, but the claim of that name now is another one \
                 (uid {}); it is left as it is",
                r.uid.clone().unwrap_or_default(),
                c.uid().unwrap_or_default()
            ));
        }
        let bound_to = c.spec.as_ref().and_then(|s| s.volume_name.clone()).unwrap_or_default();
        if !bound_to.is_empty() && bound_to != pv_name {
            return Plan::nothing(format!("volume {id}: claim {shown} is bound to PV {bound_to}, not to {pv_name}; it is left as it is"));
        }
        tell = Some(Step::Tell {
            namespace: ns,
            name,
            reason: VOLUME_ADOPTED,
            note: format!(
                "volume {id} is served by node {node} now: its drive was adopted there; PV {pv_name} (pinned to {elsewhere}) \
                 was replaced by one pinned to {node}, bound to this claim; no data was touched"
            ),
        });
    }
    let annotated = pv.annotations().get(POLICY_BEFORE).cloned();
    let policy = spec.and_then(|s| s.persistent_volume_reclaim_policy.clone()).unwrap_or_else(|| "Delete".into());
    let before = annotated.unwrap_or_else(|| policy.clone());
    let mut steps = Vec::new();
    if policy != "Retain" {
        steps.push(Step::Retain { pv: pv_name.into(), before: before.clone() });
    }
    if !pv.finalizers().is_empty() {
        steps.push(Step::DropFinalizers { pv: pv_name.into() });
    }
    if pv.metadata.deletion_timestamp.is_none() {
        steps.push(Step::DeletePv { pv: pv_name.into() });
    }
    steps.push(Step::CreatePv(Box::new(replacement(pv, node, &before, driver))));
    steps.extend(tell);
    Plan { steps, why: format!("volume {id}: PV {pv_name} is pinned to {elsewhere}; it is replaced by one pinned to this node") }
}

fn decide_missing(node: &str, driver: &str, seen: &Seen<'_>) -> Plan {
    let rec = seen.record;
    let b = &rec.binding;
    let (id, pv_name) = (rec.id.as_str(), b.pv.as_str());
    if let Some(c) = seen.claim {
        let (ns, name) = (c.namespace().unwrap_or_default(), c.name_any());
        let shown = claim_words(&ns, &name);
        let spec = c.spec.clone().unwrap_or_default();
        let bound_to = spec.volume_name.clone().unwrap_or_default();
        if bound_to != pv_name {
            let to = if bound_to.is_empty() { "no PV".to_string() } else { format!("PV {bound_to}") };
            return Plan::nothing(format!(
                "volume {id}: PV {pv_name} is gone and claim {shown} names {to}; it is left as it is (the volume is kept and listed)"
            ));
        }
        let uid = c.uid().unwrap_or_default();
        let class = spec.storage_class_name.clone().unwrap_or_else(|| b.storage_class.clone());
        let mut pv = pv_of(rec, (&ns, &name, &uid), &class, spec.access_modes.clone().unwrap_or_default(), node, driver);
        with_stage_secret(&mut pv, seen.stage_secret.as_ref());
        let note = format!(
            "volume {id} is served by node {node}: its PV {pv_name} was gone and is created again, pinned to {node}, bound to \
             this claim (reclaim policy Retain); no data was touched"
        );
        return Plan {
            steps: vec![Step::CreatePv(Box::new(pv)), Step::Tell { namespace: ns, name, reason: VOLUME_RESTORED, note }],
            why: format!("volume {id}: PV {pv_name} is gone while claim {shown} names it; it is created again"),
        };
    }
    if b.claim_name.is_empty() {
        return Plan::nothing(format!("volume {id}: PV {pv_name} is gone and no claim is known for it; the volume is kept and listed"));
    }
    let shown = claim_words(&b.claim_namespace, &b.claim_name);
    if !seen.restore_claims {
        return Plan::nothing(format!(
            "volume {id}: neither PV {pv_name} nor claim {shown} exists; the volume is kept and listed: adopt its drive with \
             restore claims to give it back, or delete the volume"
        ));
    }
    let claim = claim_of(rec);
    let mut pv = pv_of(rec, (&b.claim_namespace, &b.claim_name, ""), &b.storage_class, vec!["ReadWriteOnce".into()], node, driver);
    with_stage_secret(&mut pv, seen.stage_secret.as_ref());
    let note = format!(
        "claim restored by drivelet for volume {id} on node {node} (its drive was adopted with restore claims): PV {pv_name}, \
         pinned to {node}, is bound to it (reclaim policy Retain); the data is the volume's, untouched"
    );
    Plan {
        steps: vec![
            Step::CreateClaim(Box::new(claim)),
            Step::CreatePv(Box::new(pv)),
            Step::Tell { namespace: b.claim_namespace.clone(), name: b.claim_name.clone(), reason: CLAIM_RESTORED, note },
        ],
        why: format!("volume {id}: neither PV {pv_name} nor claim {shown} exists; both are restored"),
    }
}
