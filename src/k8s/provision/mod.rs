//! The in-process provisioner: this node's claims become volumes and PVs here, and the
//! volumes of this node's Released PVs are deleted here, with no external-provisioner
//! sidecar. Pure decisions in this file (table-tested in `tests`); the [`executor`] reads
//! and writes the API server, the [`backend`] is the CSI controller service asked in
//! process, and the [`controller`] is what the controller shell runs.
//!
//! Rules:
//! - **Which claims**: a claim is this node's to provision when it is Pending with no
//!   volume, not being deleted, its `volume.kubernetes.io/storage-provisioner` (or the
//!   beta annotation) names this driver, and its `volume.kubernetes.io/selected-node` is
//!   this node ([`waiting_here`]): the scheduler's choice for WaitForFirstConsumer, the
//!   elected agent's for Immediate classes (`crate::k8s::duties::claims`). The claim
//!   reaches this node through the relay's label, so no node sees another's claims.
//! - **The request** is what the external-provisioner sends ([`request_of`]), so the
//!   CSI controller service decides exactly as it does for any client: the name
//!   `pvc-<claim uid>` (a retry, a restart or a sidecar beside it asks for the same
//!   volume, which CreateVolume makes once), the claim's request and limit, one capability
//!   per access mode (block, or mount with the class's `csi.storage.k8s.io/fstype` and
//!   mount options), the class's parameters without the reserved `csi.storage.k8s.io/`
//!   keys (an unknown reserved key is refused) plus the claim's and PV's names, this node's
//!   topology as requisite and preferred, the provisioner secret the class names (its
//!   templates resolved as the sidecar resolves them), and the data source: a claim to
//!   clone (same namespace, Bound, of the same class) or a VolumeSnapshot to restore
//!   (ready, its content this driver's).
//! - **The PV** ([`pv_of`]) is bound to the claim (`claimRef` with its uid), pinned by node
//!   affinity to the volume's topology, carries the class's reclaim policy and mount
//!   options, `pv.kubernetes.io/provisioned-by`, the node label the node's watches
//!   select on, the secret references the class names, and the deletion-protection
//!   finalizer [`PROTECTION_FINALIZER`]. That finalizer is the external-provisioner's
//!   own name, deliberately: a PV made by the sidecar before an upgrade is deleted here
//!   exactly like one made here, and one made here is still deleted by a sidecar after a
//!   rollback.
//! - **A failure** is one Warning `ProvisioningFailed` per claim and message (in the
//!   refusal's own words and code), and a retry with backoff. A refusal that another node
//!   could avoid (RESOURCE_EXHAUSTED: no room, another topology; a class whose
//!   `allowedTopologies` exclude this node) hands the claim back to the scheduler: the
//!   selected-node annotation is removed, guarded by the claim's resourceVersion, as the
//!   external-provisioner's reschedule does.
//! - **Deletion** ([`deletable`]): a PV of this driver on this node, provisioned by this
//!   driver, Released, reclaim policy Delete. Before DeleteVolume the claim it names is
//!   read: one that exists with that uid means the PV is still bound, and nothing is
//!   deleted. Then DeleteVolume (an unknown volume is gone already), the finalizer off,
//!   the PV deleted. Retain: nothing. Only the node that holds the volume deletes it,
//!   so nothing is deleted while that node is down: it is done when it returns.
//! - **A volume whose claim went before its PV** ([`abandoned`]): the claim deleted after
//!   CreateVolume and before the PV was written (drivelet killed in between, or the PV
//!   write failing until the claim went) leaves a volume nobody can reach. Once its PV
//!   is written, the claim's uid is recorded in the volume's binding (so its drive's note
//!   says it); a volume named `pvc-<uid>` for a claim (its binding names the claim and the
//!   PV of that name) with no claim uid recorded, not in use, neither rebuilt from a
//!   disk's note nor adopted nor lost, is therefore one whose PV was never written. It is
//!   deleted when no PV of its name exists and the claim it names is gone or another
//!   one (uids are never reused: that claim can never come back). Anything else is left:
//!   a volume whose PV was written once is the reclaim policy's, and a Retain volume whose
//!   PV an admin deleted stays on its drive, listed, as Kubernetes promises.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference, PersistentVolume,
    PersistentVolumeClaim, PersistentVolumeSpec, SecretReference, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use crate::grpc::proto::csi;
use crate::k8s::identity::Identity;
use crate::k8s::resize::{quantity_bytes, quantity_of};

/// The volume side: the CSI controller service, asked in process.
pub(crate) mod backend;
/// The provision controller the shell runs (the ProvisionQueue actor).
pub(crate) mod controller;
/// Carries a provisioning or a deletion out against the API server and the volume side.
pub(crate) mod executor;

pub(crate) use controller::ProvisionQueue;

#[cfg(test)]
mod tests;

/// The annotation naming the driver that provisioned a PV.
pub(crate) const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// The annotation the PV controller sets on a claim: which provisioner makes its volume.
pub(crate) const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// Its beta form, still set beside it.
pub(crate) const BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// The node a claim is provisioned on.
pub(crate) use crate::k8s::duties::claims::SELECTED_NODE;
/// A PV's deletion protection: the volume is deleted before the PV goes (see the rules
/// for why it is the external-provisioner's name).
pub(crate) const PROTECTION_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
/// The provisioner secret a PV was made with, kept for its deletion.
pub(crate) const DELETION_SECRET_NAME: &str = "volume.kubernetes.io/provisioner-deletion-secret-name";
/// Its namespace.
pub(crate) const DELETION_SECRET_NAMESPACE: &str = "volume.kubernetes.io/provisioner-deletion-secret-namespace";
/// The reserved prefix of StorageClass parameters meant for the provisioner itself.
pub(crate) const RESERVED: &str = "csi.storage.k8s.io/";
/// The class's filesystem.
pub(crate) const FSTYPE: &str = "csi.storage.k8s.io/fstype";
/// The Event reason of a made volume.
pub(crate) const REASON_SUCCEEDED: &str = "ProvisioningSucceeded";
/// The Event reason of a refusal or failure.
pub(crate) const REASON_FAILED: &str = "ProvisioningFailed";

/// The secrets a class may name, by the prefix of their parameters: the provisioner's
/// (CreateVolume), and those written on the PV for later calls.
const SECRET_KINDS: [&str; 6] = ["provisioner", "controller-publish", "node-stage", "node-publish", "controller-expand", "node-expand"];

/// The name of the volume (and PV) of a claim: `pvc-<uid>`.
pub(crate) fn volume_name(claim: &PersistentVolumeClaim) -> Option<String> {
    claim.metadata.uid.as_deref().filter(|u| !u.is_empty()).map(|u| format!("pvc-{u}"))
}

/// `namespace/name` of a claim, as every queue of this front keys claims.
pub(crate) use crate::k8s::resize::executor::key_of;

/// A volume made for a claim whose PV was never written, as far as its record says (see
/// the rules): deleted once the API confirms that no PV of its name exists and its claim
/// is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Abandoned {
    /// The volume's id.
    pub volume_id: String,
    /// Its name, `pvc-<claim uid>`, which is also its PV's.
    pub name: String,
    /// The uid of the claim it was made for.
    pub claim_uid: String,
    /// That claim's namespace.
    pub namespace: String,
    /// That claim's name.
    pub claim: String,
}

/// Whether `rec` may be a volume whose claim went before its PV was written (see the
/// rules); what the API must confirm before it is deleted.
pub(crate) fn abandoned(rec: &crate::actors::volumes::model::VolumeRecord) -> Option<Abandoned> {
    use crate::actors::volumes::model::VolumeState;
    let uid = rec.name.strip_prefix("pvc-").filter(|u| !u.is_empty())?;
    let b = &rec.binding;
    let idle = rec.staging.is_none() && rec.targets.is_empty() && rec.state == VolumeState::Available;
    let made_here = !rec.rebuilt && rec.adopted.is_none() && !rec.lost;
    (b.pv == rec.name && b.claim_uid.is_empty() && !b.claim_name.is_empty() && idle && made_here).then(|| Abandoned {
        volume_id: rec.id.clone(),
        name: rec.name.clone(),
        claim_uid: uid.to_string(),
        namespace: b.claim_namespace.clone(),
        claim: b.claim_name.clone(),
    })
}

/// The binding a volume made for `claim` records once its PV is written: the PV, the
/// claim and its uid, the class.
pub(crate) fn binding_of(claim: &PersistentVolumeClaim, pv: &str) -> crate::words::Binding {
    crate::words::Binding {
        pv: pv.to_string(),
        claim_namespace: claim.namespace().unwrap_or_default(),
        claim_name: claim.name_any(),
        claim_uid: claim.metadata.uid.clone().unwrap_or_default(),
        storage_class: claim.spec.as_ref().and_then(|s| s.storage_class_name.clone()).unwrap_or_default(),
    }
}

/// Whether the claim waits for a volume from this driver on this node (see the rules).
pub(crate) fn waiting_here(claim: &PersistentVolumeClaim, id: &Identity) -> bool {
    let phase = claim.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let volume = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()).unwrap_or("");
    let a = claim.annotations();
    let provisioner = a.get(STORAGE_PROVISIONER).or_else(|| a.get(BETA_STORAGE_PROVISIONER));
    phase == "Pending"
        && volume.is_empty()
        && claim.metadata.deletion_timestamp.is_none()
        && provisioner.is_some_and(|p| *p == id.driver)
        && a.get(SELECTED_NODE).is_some_and(|n| *n == id.node)
}

/// The data source a claim names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DataSource {
    /// None: an empty volume.
    None,
    /// A claim of the same namespace to clone.
    Claim(String),
    /// A VolumeSnapshot of the same namespace to restore.
    Snapshot(String),
    /// Something else (a populator's kind, another namespace): not this provisioner's.
    Other(String),
}

/// The data source of a claim: `dataSourceRef`, else `dataSource`.
pub(crate) fn data_source(claim: &PersistentVolumeClaim) -> DataSource {
    let spec = claim.spec.as_ref();
    let (kind, group, name, namespace) = if let Some(r) = spec.and_then(|s| s.data_source_ref.as_ref()) {
        (r.kind.as_str(), r.api_group.as_deref().unwrap_or(""), r.name.as_str(), r.namespace.as_deref().unwrap_or(""))
    } else if let Some(r) = spec.and_then(|s| s.data_source.as_ref()) {
        (r.kind.as_str(), r.api_group.as_deref().unwrap_or(""), r.name.as_str(), "")
    } else {
        return DataSource::None;
    };
    let own_namespace = namespace.is_empty() || Some(namespace) == claim.namespace().as_deref();
    match (kind, group) {
        ("PersistentVolumeClaim", "") if own_namespace => DataSource::Claim(name.to_string()),
        ("VolumeSnapshot", "snapshot.storage.k8s.io") if own_namespace => DataSource::Snapshot(name.to_string()),
        _ => DataSource::Other(format!("{kind} {name}{}", if own_namespace { String::new() } else { format!(" in namespace {namespace}") })),
    }
}

/// What a request is made from, besides the claim and its class. Not `Debug`: it holds
/// the provisioner secret, which never reaches a log.
#[derive(Clone, Default)]
pub(crate) struct Inputs {
    /// This node's topology segments.
    pub topology: BTreeMap<String, String>,
    /// The content source, resolved: a volume to clone or a snapshot to restore.
    pub source: Option<csi::VolumeContentSource>,
    /// The provisioner secret's data.
    pub secrets: BTreeMap<String, String>,
}

/// The bytes a claim asks for, and its limit (0: none).
pub(crate) fn range_of(claim: &PersistentVolumeClaim) -> (u64, u64) {
    let res = claim.spec.as_ref().and_then(|s| s.resources.as_ref());
    let get = |m: Option<&BTreeMap<String, Quantity>>| m.and_then(|m| m.get("storage")).and_then(|q| quantity_bytes(&q.0)).unwrap_or(0);
    (get(res.and_then(|r| r.requests.as_ref())), get(res.and_then(|r| r.limits.as_ref())))
}

/// The class's parameters as they are.
fn parameters(class: &StorageClass) -> BTreeMap<String, String> {
    class.parameters.clone().unwrap_or_default()
}

/// Whether a reserved key is one the provisioner knows (a filesystem, a secret).
fn known_reserved(key: &str) -> bool {
    let Some(rest) = key.strip_prefix(RESERVED) else { return true };
    rest == "fstype"
        || SECRET_KINDS.iter().any(|k| rest == format!("{k}-secret-name") || rest == format!("{k}-secret-namespace"))
}

/// The CreateVolume request the external-provisioner sends for `claim` of `class`, or
/// why there is none (in words).
pub(crate) fn request_of(claim: &PersistentVolumeClaim, class: &StorageClass, inputs: Inputs) -> Result<csi::CreateVolumeRequest, String> {
    use csi::volume_capability::AccessType;
    let name = volume_name(claim).ok_or("the claim has no uid yet")?;
    if claim.spec.as_ref().is_some_and(|s| s.selector.is_some()) {
        return Err("a claim with a selector names an existing PV to bind; drivelet makes new volumes only".into());
    }
    let class_params = parameters(class);
    if let Some(k) = class_params.keys().find(|k| !known_reserved(k)) {
        return Err(format!("the StorageClass parameter {k} is reserved ({RESERVED}) and unknown"));
    }
    let fs_type = class_params.get(FSTYPE).cloned().unwrap_or_default();
    let flags = class.mount_options.clone().unwrap_or_default();
    let mut caps = crate::k8s::duties::claims::capabilities(claim, &fs_type);
    for cap in &mut caps {
        if let Some(AccessType::Mount(m)) = cap.access_type.as_mut() {
            m.mount_flags = flags.clone();
        }
    }
    let mut parameters: std::collections::HashMap<String, String> =
        class_params.into_iter().filter(|(k, _)| !k.starts_with(RESERVED)).collect();
    parameters.insert("csi.storage.k8s.io/pvc/name".into(), claim.name_any());
    parameters.insert("csi.storage.k8s.io/pvc/namespace".into(), claim.namespace().unwrap_or_default());
    parameters.insert("csi.storage.k8s.io/pv/name".into(), name.clone());
    let (required, limit) = range_of(claim);
    let here = csi::Topology { segments: inputs.topology.into_iter().collect() };
    Ok(csi::CreateVolumeRequest {
        name,
        capacity_range: Some(csi::CapacityRange { required_bytes: required as i64, limit_bytes: limit as i64 }),
        volume_capabilities: caps,
        parameters,
        secrets: inputs.secrets.into_iter().collect(),
        volume_content_source: inputs.source,
        accessibility_requirements: Some(csi::TopologyRequirement { requisite: vec![here.clone()], preferred: vec![here] }),
        mutable_parameters: Default::default(),
    })
}

/// `${pv.name}`, `${pvc.namespace}`, and where `full`, `${pvc.name}` and
/// `${pvc.annotations['KEY']}` in a secret parameter, resolved; anything else is refused.
pub(crate) fn resolve(template: &str, claim: &PersistentVolumeClaim, pv: &str, full: bool) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let tail = &rest[at + 2..];
        let end = tail.find('}').ok_or_else(|| format!("{template:?} opens a ${{ it does not close"))?;
        let var = &tail[..end];
        let value = match var {
            "pv.name" => pv.to_string(),
            "pvc.namespace" => claim.namespace().unwrap_or_default(),
            "pvc.name" if full => claim.name_any(),
            v if full && v.starts_with("pvc.annotations['") && v.ends_with("']") => {
                let key = &v["pvc.annotations['".len()..v.len() - 2];
                claim.annotations().get(key).cloned().ok_or_else(|| format!("{template:?} names annotation {key}, which the claim does not have"))?
            }
            v => return Err(format!("{template:?} names ${{{v}}}, which is not one this parameter may use")),
        };
        out.push_str(&value);
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The secret of `kind` ("provisioner", "node-stage", ...) the class names for `claim`,
/// resolved: `(namespace, name)`, `None` when it names none.
pub(crate) fn secret_of(class: &StorageClass, kind: &str, claim: &PersistentVolumeClaim, pv: &str) -> Result<Option<(String, String)>, String> {
    let params = parameters(class);
    let name = params.get(&format!("{RESERVED}{kind}-secret-name"));
    let namespace = params.get(&format!("{RESERVED}{kind}-secret-namespace"));
    match (namespace, name) {
        (None, None) => Ok(None),
        (Some(ns), Some(n)) => Ok(Some((resolve(ns, claim, pv, false)?, resolve(n, claim, pv, true)?))),
        _ => Err(format!("the StorageClass names the {kind} secret's name or namespace without the other")),
    }
}

/// Node affinity pinning a volume to its topology.
fn affinity_of(topology: &[csi::Topology]) -> Option<VolumeNodeAffinity> {
    let terms: Vec<NodeSelectorTerm> = topology
        .iter()
        .filter(|t| !t.segments.is_empty())
        .map(|t| {
            let mut segs: Vec<(&String, &String)> = t.segments.iter().collect();
            segs.sort();
            NodeSelectorTerm {
                match_expressions: Some(
                    segs.into_iter()
                        .map(|(k, v)| NodeSelectorRequirement { key: k.clone(), operator: "In".into(), values: Some(vec![v.clone()]) })
                        .collect(),
                ),
                match_fields: None,
            }
        })
        .collect();
    (!terms.is_empty()).then_some(VolumeNodeAffinity { required: Some(NodeSelector { node_selector_terms: terms }) })
}

/// The PV of a volume made for `claim` of `class` (see the rules).
pub(crate) fn pv_of(claim: &PersistentVolumeClaim, class: &StorageClass, volume: &csi::Volume, id: &Identity) -> Result<PersistentVolume, String> {
    let name = volume_name(claim).ok_or("the claim has no uid yet")?;
    let spec = claim.spec.clone().unwrap_or_default();
    let bytes = u64::try_from(volume.capacity_bytes).ok().filter(|b| *b > 0).unwrap_or_else(|| range_of(claim).0);
    let secret = |kind: &str| -> Result<Option<SecretReference>, String> {
        Ok(secret_of(class, kind, claim, &name)?.map(|(ns, n)| SecretReference { name: Some(n), namespace: Some(ns) }))
    };
    let block = spec.volume_mode.as_deref() == Some("Block");
    let fs_type = parameters(class).get(FSTYPE).cloned().filter(|f| !f.is_empty() && !block);
    let mut annotations = BTreeMap::from([(PROVISIONED_BY.to_string(), id.driver.clone())]);
    if let Some((ns, n)) = secret_of(class, "provisioner", claim, &name)? {
        annotations.insert(DELETION_SECRET_NAME.into(), n);
        annotations.insert(DELETION_SECRET_NAMESPACE.into(), ns);
    }
    let labels = BTreeMap::from([(crate::k8s::scope::NODE_LABEL.to_string(), crate::k8s::drives::node_label_value(&id.node))]);
    let csi = CSIPersistentVolumeSource {
        driver: id.driver.clone(),
        volume_handle: volume.volume_id.clone(),
        fs_type,
        volume_attributes: (!volume.volume_context.is_empty()).then(|| volume.volume_context.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
        controller_publish_secret_ref: secret("controller-publish")?,
        node_stage_secret_ref: secret("node-stage")?,
        node_publish_secret_ref: secret("node-publish")?,
        controller_expand_secret_ref: secret("controller-expand")?,
        node_expand_secret_ref: secret("node-expand")?,
        read_only: None,
    };
    Ok(PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name),
            annotations: Some(annotations),
            labels: Some(labels),
            finalizers: Some(vec![PROTECTION_FINALIZER.to_string()]),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: spec.access_modes.clone(),
            capacity: Some(BTreeMap::from([("storage".to_string(), Quantity(quantity_of(bytes)))])),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: claim.namespace(),
                name: Some(claim.name_any()),
                uid: claim.metadata.uid.clone(),
                resource_version: claim.metadata.resource_version.clone(),
                ..Default::default()
            }),
            csi: Some(csi),
            mount_options: class.mount_options.clone(),
            node_affinity: affinity_of(&volume.accessible_topology),
            persistent_volume_reclaim_policy: Some(class.reclaim_policy.clone().unwrap_or_else(|| "Delete".into())),
            storage_class_name: spec.storage_class_name.clone(),
            volume_mode: spec.volume_mode.clone(),
            ..Default::default()
        }),
        status: None,
    })
}

/// Whether this node's topology satisfies the class's `allowedTopologies` (none: any).
pub(crate) fn allowed_here(class: &StorageClass, topology: &BTreeMap<String, String>) -> bool {
    let Some(terms) = class.allowed_topologies.as_ref().filter(|t| !t.is_empty()) else { return true };
    terms.iter().any(|t| {
        t.match_label_expressions.iter().flatten().all(|e| topology.get(&e.key).is_some_and(|v| e.values.contains(v)))
    })
}

/// The volume id of a PV whose volume this node deletes now (see the rules), `None` for
/// any other PV.
pub(crate) fn deletable(pv: &PersistentVolume, id: &Identity) -> Option<String> {
    let volume = crate::k8s::resize::our_volume(pv, id)?;
    let spec = pv.spec.as_ref()?;
    let ours = pv.annotations().get(PROVISIONED_BY).is_some_and(|d| *d == id.driver);
    let released = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
    let delete = spec.persistent_volume_reclaim_policy.as_deref().unwrap_or("Delete") == "Delete";
    (ours && released && delete && spec.claim_ref.is_some()).then_some(volume)
}

/// How a CreateVolume refusal counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Another node may make it: the claim goes back to the scheduler.
    Reschedule,
    /// Retry here with backoff.
    Retry,
}

/// How a CreateVolume refusal with `code` counts (RESOURCE_EXHAUSTED: no room here or
/// another topology, as the external-provisioner reschedules).
pub(crate) fn failure_of(code: tonic::Code) -> Failure {
    if code == tonic::Code::ResourceExhausted {
        Failure::Reschedule
    } else {
        Failure::Retry
    }
}

/// The words of a failed provisioning of a claim of `class` on `node`.
pub(crate) fn failed_note(class: &str, node: &str, why: &str, failure: Failure) -> String {
    let then = match failure {
        Failure::Reschedule => "the claim goes back to the scheduler to choose another node",
        Failure::Retry => "drivelet tries again with backoff",
    };
    format!("drivelet cannot make this claim's volume of StorageClass {class} on node {node}: {why}; {then}")
}

/// A CSI refusal in words: its code's name, then its message.
pub(crate) fn status_words(s: &tonic::Status) -> String {
    format!("{}: {}", code_name(s.code()), s.message())
}

/// A gRPC code's name, as clients print it (`InvalidArgument`).
pub(crate) fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "Cancelled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}
