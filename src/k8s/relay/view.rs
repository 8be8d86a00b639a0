//! The relay's view of the cluster: which node holds what, kept compact (a few strings
//! an object, never the objects), fed by the relay's watches. The relay reads it to
//! label objects; the cluster duties read it instead of listing (the gone nodes' objects,
//! the claims that wait), materialized as stripped objects only for what a round needs.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec, PersistentVolumeStatus,
};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::{Resource, ResourceExt};
use serde_json::Value;

use super::{claim_node, content_node, label_patch, provisioned_by, selected_node, va_node, NODE_LABEL};
use crate::k8s::crd::{Drive, DriveSpec};
use crate::k8s::duties::{pv_node, Observed};
use crate::k8s::snapshot::objects::VolumeSnapshotContent;
use crate::k8s::rehome::pinned_to;

/// An object the relay may label.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Target {
    /// A PersistentVolume, by name.
    Pv(String),
    /// A claim, by namespace and name.
    Claim(String, String),
    /// A VolumeAttachment, by name.
    Va(String),
    /// A VolumeSnapshotContent, by name.
    Content(String),
}

impl Target {
    /// The resource, for logs and the relayed counter.
    pub(crate) fn resource(&self) -> &'static str {
        match self {
            Target::Pv(_) => "persistentvolumes",
            Target::Claim(..) => "persistentvolumeclaims",
            Target::Va(_) => "volumeattachments",
            Target::Content(_) => "volumesnapshotcontents",
        }
    }
}

/// The kinds the relay watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// PersistentVolumes.
    Pv,
    /// Claims.
    Claim,
    /// VolumeAttachments.
    Va,
    /// VolumeSnapshotContents.
    Content,
    /// Drive objects.
    Drive,
    /// Nodes (names only).
    Node,
    /// StorageClasses (the driver's).
    Class,
}

/// What the view keeps of a PV of the driver.
#[derive(Debug, Default)]
struct PvEntry {
    handle: String,
    node: Option<String>,
    claim: Option<(String, String)>,
    claim_uid: Option<String>,
    label: Option<String>,
    phase: Option<String>,
    reclaim: Option<String>,
    finalizers: Vec<String>,
    resource_version: Option<String>,
}

/// What the view keeps of a claim.
#[derive(Debug, Default)]
struct ClaimEntry {
    volume: Option<String>,
    selected: Option<String>,
    ours: bool,
    label: Option<String>,
}

/// What the view keeps of a VolumeAttachment of the driver.
#[derive(Debug, Default)]
struct VaEntry {
    node: String,
    label: Option<String>,
    pv: Option<String>,
    finalizers: Vec<String>,
    deleting: Option<Time>,
    resource_version: Option<String>,
}

/// What the view keeps of a VolumeSnapshotContent of the driver.
#[derive(Debug, Default)]
struct ContentEntry {
    volume: Option<String>,
    snapshot: Option<String>,
    label: Option<String>,
}

/// Which node holds what, as the relay's watches show it (see the module rules).
#[derive(Debug, Default)]
pub(crate) struct View {
    driver: String,
    pvs: HashMap<String, PvEntry>,
    /// Volume handle -> PV name.
    pv_of_handle: HashMap<String, String>,
    /// Claim -> the PV whose claimRef names it.
    pv_of_claim: HashMap<(String, String), String>,
    claims: HashMap<(String, String), ClaimEntry>,
    vas: HashMap<String, VaEntry>,
    contents: HashMap<String, ContentEntry>,
    /// Volume or snapshot handle -> the contents naming it.
    contents_of: HashMap<String, BTreeSet<String>>,
    /// Drive object -> its node and the volume and snapshot ids it lists.
    drives: HashMap<String, (String, Vec<String>)>,
    /// Volume or snapshot id -> the node whose Drive object lists it.
    id_node: HashMap<String, String>,
    /// The claims that wait for a volume (Pending, bound to no PV), stripped: the claim
    /// watch of the duties decides on them.
    waiting: BTreeMap<(String, String), PersistentVolumeClaim>,
    /// The names of the Node objects that exist.
    nodes: BTreeSet<String>,
    /// The driver's StorageClasses.
    classes: BTreeMap<String, StorageClass>,
    /// The kinds listed at least once since the relay started.
    listed: BTreeSet<Kind>,
}

fn label_of<K: Resource>(o: &K) -> Option<String> {
    o.meta().labels.as_ref()?.get(NODE_LABEL).cloned()
}

fn claim_key(c: &PersistentVolumeClaim) -> (String, String) {
    (c.namespace().unwrap_or_default(), c.name_any())
}

impl View {
    /// An empty view for `driver`.
    pub(crate) fn new(driver: &str) -> Self {
        Self { driver: driver.to_string(), ..Default::default() }
    }

    /// How many objects of each kind the view holds: PVs, claims, attachments, contents,
    /// Drive objects.
    #[cfg(test)]
    pub(crate) fn counts(&self) -> [usize; 5] {
        [self.pvs.len(), self.claims.len(), self.vas.len(), self.contents.len(), self.drives.len()]
    }

    fn content_targets(&self, handle: &str, out: &mut Vec<Target>) {
        out.extend(self.contents_of.get(handle).into_iter().flatten().map(|c| Target::Content(c.clone())));
    }

    /// A PV arrived or changed: what to look at again.
    pub(crate) fn apply_pv(&mut self, pv: &PersistentVolume) -> Vec<Target> {
        let name = pv.name_any();
        let mut out = self.delete_pv(&name);
        let Some(handle) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()).filter(|c| c.driver == self.driver).map(|c| c.volume_handle.clone())
        else {
            return out;
        };
        let claim = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).and_then(|r| Some((r.namespace.clone()?, r.name.clone()?)));
        let node = pv_node(pv, &self.driver).map(String::from);
        if let Some(c) = &claim {
            self.pv_of_claim.insert(c.clone(), name.clone());
            out.push(Target::Claim(c.0.clone(), c.1.clone()));
        }
        self.pv_of_handle.insert(handle.clone(), name.clone());
        self.content_targets(&handle, &mut out);
        let spec = pv.spec.as_ref();
        let entry = PvEntry {
            handle,
            node,
            claim,
            claim_uid: spec.and_then(|s| s.claim_ref.as_ref()).and_then(|r| r.uid.clone()),
            label: label_of(pv),
            phase: pv.status.as_ref().and_then(|s| s.phase.clone()),
            reclaim: spec.and_then(|s| s.persistent_volume_reclaim_policy.clone()),
            finalizers: pv.finalizers().to_vec(),
            resource_version: pv.resource_version(),
        };
        self.pvs.insert(name.clone(), entry);
        out.push(Target::Pv(name));
        out
    }

    /// A PV is gone: what to look at again.
    pub(crate) fn delete_pv(&mut self, name: &str) -> Vec<Target> {
        let mut out = Vec::new();
        if let Some(old) = self.pvs.remove(name) {
            if self.pv_of_handle.get(&old.handle).is_some_and(|p| p == name) {
                self.pv_of_handle.remove(&old.handle);
            }
            if let Some(c) = old.claim {
                if self.pv_of_claim.get(&c).is_some_and(|p| p == name) {
                    self.pv_of_claim.remove(&c);
                }
                out.push(Target::Claim(c.0, c.1));
            }
            self.content_targets(&old.handle, &mut out);
        }
        out
    }

    /// A claim arrived or changed.
    pub(crate) fn apply_claim(&mut self, c: &PersistentVolumeClaim) -> Vec<Target> {
        let key = claim_key(c);
        let unbound = c.spec.as_ref().and_then(|s| s.volume_name.as_deref()).unwrap_or("").is_empty();
        let pending = c.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending") == "Pending";
        if unbound && pending {
            let mut kept = c.clone();
            kept.metadata.managed_fields = None;
            self.waiting.insert(key.clone(), kept);
        } else {
            self.waiting.remove(&key);
        }
        let entry = ClaimEntry {
            volume: c.spec.as_ref().and_then(|s| s.volume_name.clone()).filter(|v| !v.is_empty()),
            selected: selected_node(c).map(String::from),
            ours: provisioned_by(c, &self.driver),
            label: label_of(c),
        };
        self.claims.insert(key.clone(), entry);
        vec![Target::Claim(key.0, key.1)]
    }

    /// A claim is gone.
    pub(crate) fn delete_claim(&mut self, key: &(String, String)) {
        self.claims.remove(key);
        self.waiting.remove(key);
    }

    /// A VolumeAttachment arrived or changed.
    pub(crate) fn apply_va(&mut self, va: &VolumeAttachment) -> Vec<Target> {
        let name = va.name_any();
        match va_node(va, &self.driver) {
            Some(node) => {
                let entry = VaEntry {
                    node: node.to_string(),
                    label: label_of(va),
                    pv: va.spec.source.persistent_volume_name.clone(),
                    finalizers: va.finalizers().to_vec(),
                    deleting: va.metadata.deletion_timestamp.clone(),
                    resource_version: va.resource_version(),
                };
                self.vas.insert(name.clone(), entry);
                vec![Target::Va(name)]
            }
            None => {
                self.vas.remove(&name);
                Vec::new()
            }
        }
    }

    /// A VolumeAttachment is gone.
    pub(crate) fn delete_va(&mut self, name: &str) {
        self.vas.remove(name);
    }

    /// A VolumeSnapshotContent arrived or changed.
    pub(crate) fn apply_content(&mut self, c: &VolumeSnapshotContent) -> Vec<Target> {
        let name = c.name_any();
        self.delete_content(&name);
        if c.spec.driver != self.driver {
            return Vec::new();
        }
        let volume = c.spec.source.volume_handle.clone().filter(|h| !h.is_empty());
        let snapshot = c
            .status
            .as_ref()
            .and_then(|s| s.snapshot_handle.clone())
            .or_else(|| c.spec.source.snapshot_handle.clone())
            .filter(|h| !h.is_empty());
        for h in volume.iter().chain(snapshot.iter()) {
            self.contents_of.entry(h.clone()).or_default().insert(name.clone());
        }
        self.contents.insert(name.clone(), ContentEntry { volume, snapshot, label: label_of(c) });
        vec![Target::Content(name)]
    }

    /// A VolumeSnapshotContent is gone.
    pub(crate) fn delete_content(&mut self, name: &str) {
        if let Some(old) = self.contents.remove(name) {
            for h in old.volume.iter().chain(old.snapshot.iter()) {
                if let Some(set) = self.contents_of.get_mut(h) {
                    set.remove(name);
                    if set.is_empty() {
                        self.contents_of.remove(h);
                    }
                }
            }
        }
    }

    /// A Drive object arrived or changed.
    pub(crate) fn apply_drive(&mut self, d: &Drive) -> Vec<Target> {
        let name = d.name_any();
        let mut out = self.delete_drive(&name);
        let ids: Vec<String> =
            d.status.iter().flat_map(|s| s.volumes.iter().chain(s.snapshots.iter())).cloned().collect();
        for id in &ids {
            self.id_node.insert(id.clone(), d.spec.node.clone());
            self.content_targets(id, &mut out);
            out.extend(self.pv_of_handle.get(id).map(|p| Target::Pv(p.clone())));
        }
        self.drives.insert(name, (d.spec.node.clone(), ids));
        out
    }

    /// A Drive object is gone.
    pub(crate) fn delete_drive(&mut self, name: &str) -> Vec<Target> {
        let mut out = Vec::new();
        if let Some((node, ids)) = self.drives.remove(name) {
            for id in ids {
                if self.id_node.get(&id).is_some_and(|n| *n == node) {
                    self.id_node.remove(&id);
                }
                self.content_targets(&id, &mut out);
            }
        }
        out
    }

    fn node_of_handle(&self, handle: &str) -> Option<&str> {
        let by_pv = self.pv_of_handle.get(handle).and_then(|p| self.pvs.get(p)).and_then(|pv| pv.node.as_deref());
        by_pv.or_else(|| self.id_node.get(handle).map(String::as_str))
    }

    /// The node `target` belongs to, and the label it carries now.
    pub(crate) fn want(&self, target: &Target) -> Option<(&str, Option<&str>)> {
        match target {
            Target::Pv(name) => {
                let pv = self.pvs.get(name)?;
                // A PV without drivelet's node affinity (made by hand) belongs to the node
                // whose Drive objects list its volume.
                let node = pv.node.as_deref().or_else(|| self.id_node.get(&pv.handle).map(String::as_str))?;
                Some((node, pv.label.as_deref()))
            }
            Target::Claim(ns, name) => {
                let key = (ns.clone(), name.clone());
                let c = self.claims.get(&key)?;
                let pv = c.volume.as_ref().or_else(|| self.pv_of_claim.get(&key)).and_then(|p| self.pvs.get(p));
                let node = claim_node(pv.and_then(|p| p.node.as_deref()), c.selected.as_deref(), c.ours)?;
                Some((node, c.label.as_deref()))
            }
            Target::Va(name) => {
                let va = self.vas.get(name)?;
                Some((va.node.as_str(), va.label.as_deref()))
            }
            Target::Content(name) => {
                let c = self.contents.get(name)?;
                let node = content_node(
                    c.volume.as_deref().and_then(|h| self.node_of_handle(h)),
                    c.snapshot.as_deref().and_then(|h| self.id_node.get(h).map(String::as_str)),
                )?;
                Some((node, c.label.as_deref()))
            }
        }
    }

    /// The label patch `target` needs now, if any.
    pub(crate) fn patch_for(&self, target: &Target) -> Option<Value> {
        let (node, label) = self.want(target)?;
        label_patch(label, node)
    }

    /// `target` was written with `node`'s label.
    pub(crate) fn labelled(&mut self, target: &Target, value: String) {
        let slot = match target {
            Target::Pv(n) => self.pvs.get_mut(n).map(|e| &mut e.label),
            Target::Claim(ns, n) => self.claims.get_mut(&(ns.clone(), n.clone())).map(|e| &mut e.label),
            Target::Va(n) => self.vas.get_mut(n).map(|e| &mut e.label),
            Target::Content(n) => self.contents.get_mut(n).map(|e| &mut e.label),
        };
        if let Some(slot) = slot {
            *slot = Some(value);
        }
    }

    /// Every object the view holds, to look at after a relist.
    pub(crate) fn all_targets(&self, kind: Kind) -> Vec<Target> {
        match kind {
            Kind::Pv => self.pvs.keys().map(|n| Target::Pv(n.clone())).collect(),
            Kind::Claim => self.claims.keys().map(|(ns, n)| Target::Claim(ns.clone(), n.clone())).collect(),
            Kind::Va => self.vas.keys().map(|n| Target::Va(n.clone())).collect(),
            Kind::Content | Kind::Drive => self.contents.keys().map(|n| Target::Content(n.clone())).collect(),
            Kind::Node | Kind::Class => Vec::new(),
        }
    }

    /// Forgets the objects of `kind` not in `listed` (gone while the watch was down), and
    /// marks the kind listed.
    pub(crate) fn keep_only(&mut self, kind: Kind, listed: &HashSet<String>) -> Vec<Target> {
        self.listed.insert(kind);
        let mut out = Vec::new();
        match kind {
            Kind::Node => self.nodes.retain(|n| listed.contains(n)),
            Kind::Class => self.classes.retain(|n, _| listed.contains(n)),
            Kind::Pv => {
                let gone: Vec<String> = self.pvs.keys().filter(|k| !listed.contains(*k)).cloned().collect();
                for n in gone {
                    out.extend(self.delete_pv(&n));
                }
            }
            Kind::Claim => {
                self.claims.retain(|(ns, n), _| listed.contains(&format!("{ns}/{n}")));
                self.waiting.retain(|(ns, n), _| listed.contains(&format!("{ns}/{n}")));
            }
            Kind::Va => self.vas.retain(|n, _| listed.contains(n)),
            Kind::Content => {
                let gone: Vec<String> = self.contents.keys().filter(|k| !listed.contains(*k)).cloned().collect();
                for n in gone {
                    self.delete_content(&n);
                }
            }
            Kind::Drive => {
                let gone: Vec<String> = self.drives.keys().filter(|k| !listed.contains(*k)).cloned().collect();
                for n in gone {
                    out.extend(self.delete_drive(&n));
                }
            }
        }
        out
    }

    /// A Node exists (or is gone).
    pub(crate) fn node(&mut self, name: &str, exists: bool) {
        if exists {
            self.nodes.insert(name.to_string());
        } else {
            self.nodes.remove(name);
        }
    }

    /// A StorageClass arrived, changed or is gone (`None`); only the driver's are kept.
    pub(crate) fn class(&mut self, name: &str, class: Option<&StorageClass>) {
        match class.filter(|c| c.provisioner == self.driver) {
            Some(c) => {
                let mut kept = c.clone();
                kept.metadata.managed_fields = None;
                self.classes.insert(name.to_string(), kept);
            }
            None => {
                self.classes.remove(name);
            }
        }
    }

    /// Marks every kind listed (tests that fill the view as the watches would).
    #[cfg(test)]
    pub(crate) fn listed_all(&mut self) {
        self.listed.extend([Kind::Pv, Kind::Claim, Kind::Va, Kind::Content, Kind::Drive, Kind::Node, Kind::Class]);
    }

    /// Whether every kind the duties decide on has been listed: until then a round
    /// decides nothing (a node not listed yet is not a gone node).
    pub(crate) fn synced(&self) -> bool {
        [Kind::Pv, Kind::Claim, Kind::Va, Kind::Drive, Kind::Node, Kind::Class].iter().all(|k| self.listed.contains(k))
    }

    /// The nodes the driver's objects name that no Node object is: candidates to confirm
    /// as gone. Empty when no Node is listed at all.
    pub(crate) fn gone(&self) -> BTreeSet<String> {
        if self.nodes.is_empty() {
            return BTreeSet::new();
        }
        let named = self
            .vas
            .values()
            .map(|v| v.node.as_str())
            .chain(self.pvs.values().filter_map(|p| p.node.as_deref()))
            .chain(self.drives.values().map(|(n, _)| n.as_str()));
        named.filter(|n| !n.is_empty() && !self.nodes.contains(*n)).map(String::from).collect()
    }

    /// What a round of the duties decides on for the `gone` nodes: their attachments
    /// (and any naming their PVs), PVs and Drive objects, as stripped objects. Claims,
    /// classes and pods are read by the executor.
    pub(crate) fn duties(&self, gone: &BTreeSet<String>) -> Observed {
        let of_gone = |n: Option<&str>| n.is_some_and(|n| gone.contains(n));
        let pvs: BTreeSet<&str> = self.pvs.iter().filter(|(_, p)| of_gone(p.node.as_deref())).map(|(n, _)| n.as_str()).collect();
        Observed {
            attachments: self
                .vas
                .iter()
                .filter(|(_, v)| gone.contains(&v.node) || v.pv.as_deref().is_some_and(|p| pvs.contains(p)))
                .map(|(n, v)| self.va_object(n, v))
                .collect(),
            volumes: pvs.iter().filter_map(|n| self.pv_object(n)).collect(),
            drives: self.drives.iter().filter(|(_, (node, _))| gone.contains(node)).map(|(n, (node, _))| drive_object(n, node)).collect(),
            ..Default::default()
        }
    }

    /// The claims that wait for a volume, stripped.
    pub(crate) fn waiting_claims(&self) -> Vec<PersistentVolumeClaim> {
        self.waiting.values().cloned().collect()
    }

    /// The driver's StorageClasses.
    pub(crate) fn classes(&self) -> Vec<StorageClass> {
        self.classes.values().cloned().collect()
    }

    /// The PVs bound to the claims `wanted` (namespace, name), stripped.
    pub(crate) fn pvs_of_claims(&self, wanted: &BTreeSet<(String, String)>) -> Vec<PersistentVolume> {
        wanted.iter().filter_map(|k| self.pv_of_claim.get(k)).filter_map(|n| self.pv_object(n)).collect()
    }

    fn pv_object(&self, name: &str) -> Option<PersistentVolume> {
        let e = self.pvs.get(name)?;
        let claim_ref = e.claim.as_ref().map(|(ns, n)| ObjectReference {
            namespace: Some(ns.clone()),
            name: Some(n.clone()),
            uid: e.claim_uid.clone(),
            ..Default::default()
        });
        Some(PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                finalizers: (!e.finalizers.is_empty()).then(|| e.finalizers.clone()),
                resource_version: e.resource_version.clone(),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                csi: Some(CSIPersistentVolumeSource { driver: self.driver.clone(), volume_handle: e.handle.clone(), ..Default::default() }),
                node_affinity: e.node.as_deref().map(pinned_to),
                claim_ref,
                persistent_volume_reclaim_policy: e.reclaim.clone(),
                ..Default::default()
            }),
            status: Some(PersistentVolumeStatus { phase: e.phase.clone(), ..Default::default() }),
        })
    }

    fn va_object(&self, name: &str, v: &VaEntry) -> VolumeAttachment {
        VolumeAttachment {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                finalizers: (!v.finalizers.is_empty()).then(|| v.finalizers.clone()),
                deletion_timestamp: v.deleting.clone(),
                resource_version: v.resource_version.clone(),
                ..Default::default()
            },
            spec: VolumeAttachmentSpec {
                attacher: self.driver.clone(),
                node_name: v.node.clone(),
                source: VolumeAttachmentSource { persistent_volume_name: v.pv.clone(), ..Default::default() },
            },
            status: None,
        }
    }
}

/// A Drive object as the duties read it: its name and node.
fn drive_object(name: &str, node: &str) -> Drive {
    let spec = DriveSpec {
        node: node.to_string(),
        drive_id: String::new(),
        serial: None,
        wwn: None,
        model: None,
        size_bytes: 0,
        size: None,
        media: String::new(),
        action: None,
        restore_claims: None,
    };
    Drive::new(name, spec)
}
