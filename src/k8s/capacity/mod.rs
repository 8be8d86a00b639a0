//! This node's CSIStorageCapacity objects, written in process: one per StorageClass of
//! the driver, for this node's topology, saying what GetCapacity answers for the class
//! (the scheduler reads them for WaitForFirstConsumer claims, the cluster duties to place
//! Immediate ones, `crate::k8s::duties::claims`). Pure decisions here (which classes,
//! the objects wanted, the writes that make the listed objects so), table-tested in
//! `tests.rs`; the loop that watches and writes is [`controller`], the volume side
//! [`backend`].
//!
//! Rules:
//! - A class counts when its `provisioner` is this driver, whatever its binding mode (the
//!   external-provisioner's `--capacity-for-immediate-binding`), unless its
//!   `allowedTopologies` exclude this node for sure (every term names one of this node's
//!   segment keys without this node's value); a key drivelet does not set is not judged.
//! - The room of a class is GetCapacity's answer, asked as the external-provisioner
//!   asked it: the class's parameters as they are, this node's segments, no capabilities
//!   ([`crate::grpc::controller::capacity`], one function for both). A class GetCapacity
//!   refuses (a parameter it does not know) has no room: 0, said once in the log. While
//!   the volume manager's view is not ready nothing is decided, nothing written.
//! - One object per class, in drivelet's namespace, named by [`object_name`] (a hash of
//!   node, class and segments): the same on every start, so a kill between a create and
//!   anything else never makes a duplicate, and a change of the node's segments is a
//!   new object (nodeTopology cannot be changed in place). Labels: the driver
//!   (`csi.storage.k8s.io/drivername`), [`MANAGED_BY`] `drivelet`, and this node's
//!   `drivelet.io/node` (its own objects are listed by these); nodeTopology matches this
//!   node's segments; the Node owns it, so a deleted node's objects are collected.
//! - Writes ([`plan`]): a missing object is created; one whose capacity or maximum
//!   volume size differs (compared in bytes, whatever the quantity's spelling) is
//!   merge-patched with those two fields only; one for a class gone, or no longer this
//!   driver's, or not matching what it should be (class, topology), is deleted (and, for
//!   the last, made again). Nothing else is written: the same room writes nothing.
//! - The external-provisioner sidecar's objects of this node (labels drivername and
//!   [`MANAGED_BY`] [`sidecar_managed_by`]) are deleted once, after this node's own are
//!   written, so the scheduler is never left with stale numbers nor with none.

use std::collections::BTreeMap;

use k8s_openapi::api::storage::v1::{CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use serde_json::{json, Value};

use crate::k8s::resize::{quantity_bytes, quantity_of};
use crate::k8s::scope::NODE_LABEL;

pub(crate) mod backend;
pub(crate) mod controller;

#[cfg(test)]
mod fake_api_tests;
#[cfg(test)]
mod tests;

/// The label naming the driver of a CSIStorageCapacity (the external-provisioner's).
pub(crate) const DRIVER_LABEL: &str = "csi.storage.k8s.io/drivername";
/// The label naming who manages a CSIStorageCapacity (the external-provisioner's).
pub(crate) const MANAGED_BY: &str = "csi.storage.k8s.io/managed-by";
/// The value of [`MANAGED_BY`] on drivelet's own objects.
pub(crate) const MANAGER: &str = "drivelet";

/// A StorageClass of this driver, as far as capacity cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Class {
    /// Its name.
    pub name: String,
    /// Its parameters, as they are.
    pub parameters: BTreeMap<String, String>,
    /// Its allowed topologies: each term's `(key, values)` expressions.
    pub allowed: Vec<Vec<(String, Vec<String>)>>,
    /// Its volume binding mode (`Immediate` when unset), for the log.
    pub binding: String,
}

/// The class `sc` is to capacity: `None` when its provisioner is not `driver`.
pub(crate) fn class_of(sc: &StorageClass, driver: &str) -> Option<Class> {
    if sc.provisioner != driver {
        return None;
    }
    let allowed = sc
        .allowed_topologies
        .iter()
        .flatten()
        .map(|t| t.match_label_expressions.iter().flatten().map(|e| (e.key.clone(), e.values.clone())).collect())
        .collect();
    Some(Class {
        name: sc.metadata.name.clone().unwrap_or_default(),
        parameters: sc.parameters.clone().unwrap_or_default(),
        allowed,
        binding: sc.volume_binding_mode.clone().unwrap_or_else(|| "Immediate".into()),
    })
}

/// Whether the class may place a volume on a node with `segments` (see the module rules:
/// excluded only when every term names one of the segment keys without its value).
pub(crate) fn allows(class: &Class, segments: &BTreeMap<String, String>) -> bool {
    let term_may_match =
        |term: &Vec<(String, Vec<String>)>| term.iter().all(|(k, values)| segments.get(k).is_none_or(|v| values.contains(v)));
    class.allowed.is_empty() || class.allowed.iter().any(term_may_match)
}

/// The room GetCapacity gives a class: what is free for it and the largest volume it
/// could have now, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Room {
    /// Free bytes for the class.
    pub available: u64,
    /// The largest volume of the class that fits now.
    pub maximum: u64,
}

/// What the volume side answers for a class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Its room.
    Room(Room),
    /// The volume manager is not ready (starting) or gone: nothing to say yet.
    NotReady,
    /// GetCapacity refuses the class (its words): no room.
    Refused(String),
}

/// Who this node is to its capacity objects, decided once at start.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Me {
    /// The CSI driver name.
    pub driver: String,
    /// This node's name.
    pub node: String,
    /// drivelet's namespace, where the objects live.
    pub namespace: String,
    /// This node's topology segments (`driver.topology` and `topology.drivelet.io/node`).
    pub segments: BTreeMap<String, String>,
}

/// One object as it should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wanted {
    /// Its name ([`object_name`]).
    pub name: String,
    /// The class it speaks of.
    pub class: String,
    /// The class's room.
    pub room: Room,
}

/// What [`wanted`] decides: the objects by name, and the classes GetCapacity refused
/// with its words, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decided {
    /// The objects wanted, by name.
    pub objects: BTreeMap<String, Wanted>,
    /// `(class, words)` of each refused class.
    pub refused: Vec<(String, String)>,
}

/// The objects wanted for `classes` (this driver's), each class's room from `answer`;
/// `None` while any answer is [`Answer::NotReady`] (nothing is decided then).
pub(crate) fn wanted(me: &Me, classes: &BTreeMap<String, Class>, answer: impl Fn(&Class) -> Answer) -> Option<Decided> {
    let mut out = BTreeMap::new();
    let mut refused = Vec::new();
    for class in classes.values().filter(|c| allows(c, &me.segments)) {
        let room = match answer(class) {
            Answer::Room(r) => r,
            Answer::NotReady => return None,
            Answer::Refused(why) => {
                refused.push((class.name.clone(), why));
                Room { available: 0, maximum: 0 }
            }
        };
        let name = object_name(&me.node, &class.name, &me.segments);
        out.insert(name.clone(), Wanted { name, class: class.name.clone(), room });
    }
    Some(Decided { objects: out, refused })
}

/// One write of a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Write {
    /// Create the object.
    Create(Wanted),
    /// Merge-patch its capacity and maximum volume size.
    Patch(Wanted),
    /// Delete the object of this name.
    Delete(String),
}

/// What a listed object of this node says, as far as [`plan`] compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    /// Its class.
    pub class: String,
    /// Its node topology's labels.
    pub topology: BTreeMap<String, String>,
    /// Its capacity in bytes (`None`: unset or unreadable).
    pub available: Option<u64>,
    /// Its maximum volume size in bytes.
    pub maximum: Option<u64>,
}

impl Listed {
    /// What `c` says.
    pub(crate) fn of(c: &CSIStorageCapacity) -> Listed {
        let bytes = |q: &Option<Quantity>| q.as_ref().and_then(|q| quantity_bytes(&q.0));
        Listed {
            class: c.storage_class_name.clone(),
            topology: c.node_topology.as_ref().and_then(|t| t.match_labels.clone()).unwrap_or_default(),
            available: bytes(&c.capacity),
            maximum: bytes(&c.maximum_volume_size),
        }
    }

    /// What the object says once `w` is written.
    pub(crate) fn written(w: &Wanted, me: &Me) -> Listed {
        Listed { class: w.class.clone(), topology: me.segments.clone(), available: Some(w.room.available), maximum: Some(w.room.maximum) }
    }
}

/// The writes that make the `listed` objects (by name) the `wanted` ones, in order:
/// deletes first (a replaced object's delete before its create), then creates and
/// patches by name. Empty when every object already says what it should.
pub(crate) fn plan(me: &Me, wanted: &BTreeMap<String, Wanted>, listed: &BTreeMap<String, Listed>) -> Vec<Write> {
    let mut deletes = Vec::new();
    let mut writes = Vec::new();
    for (name, l) in listed {
        let keep = wanted.get(name).is_some_and(|w| w.class == l.class && l.topology == me.segments);
        if !keep {
            deletes.push(Write::Delete(name.clone()));
        }
    }
    for (name, w) in wanted {
        match listed.get(name) {
            Some(l) if l.class == w.class && l.topology == me.segments => {
                if l.available != Some(w.room.available) || l.maximum != Some(w.room.maximum) {
                    writes.push(Write::Patch(w.clone()));
                }
            }
            _ => writes.push(Write::Create(w.clone())),
        }
    }
    deletes.extend(writes);
    deletes
}

/// The labels of this node's own objects.
pub(crate) fn labels(me: &Me) -> BTreeMap<String, String> {
    [
        (DRIVER_LABEL.to_string(), me.driver.clone()),
        (MANAGED_BY.to_string(), MANAGER.to_string()),
        (NODE_LABEL.to_string(), crate::k8s::drives::node_label_value(&me.node)),
    ]
    .into()
}

/// The label selector of this node's own objects (its node label and [`MANAGER`]).
pub(crate) fn own_selector(me: &Me) -> String {
    format!("{},{MANAGED_BY}={MANAGER}", crate::k8s::scope::Scope::selector(&me.node))
}

/// The label selector of the external-provisioner sidecar's objects of this node.
pub(crate) fn sidecar_selector(me: &Me) -> String {
    format!("{DRIVER_LABEL}={},{MANAGED_BY}={}", me.driver, sidecar_managed_by(&me.node))
}

/// The object `w` is, owned by `owner` (the Node).
pub(crate) fn object(me: &Me, w: &Wanted, owner: &OwnerReference) -> CSIStorageCapacity {
    CSIStorageCapacity {
        metadata: ObjectMeta {
            name: Some(w.name.clone()),
            namespace: Some(me.namespace.clone()),
            labels: Some(labels(me)),
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        },
        storage_class_name: w.class.clone(),
        node_topology: Some(LabelSelector { match_labels: Some(me.segments.clone()), ..Default::default() }),
        capacity: Some(Quantity(quantity_of(w.room.available))),
        maximum_volume_size: Some(Quantity(quantity_of(w.room.maximum))),
    }
}

/// The merge patch of `w`'s room.
pub(crate) fn room_patch(w: &Wanted) -> Value {
    json!({ "capacity": quantity_of(w.room.available), "maximumVolumeSize": quantity_of(w.room.maximum) })
}

/// The owner reference of the Node `name` with `uid`.
pub(crate) fn node_owner(name: &str, uid: &str) -> OwnerReference {
    OwnerReference { api_version: "v1".into(), kind: "Node".into(), name: name.into(), uid: uid.into(), ..Default::default() }
}

/// 64-bit FNV-1a over `parts`, NUL-separated so the split is part of it.
fn hash64(parts: &[&str]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    for (i, part) in parts.iter().enumerate() {
        let sep: &[u8] = if i == 0 { &[] } else { &[0] };
        for b in sep.iter().chain(part.as_bytes()) {
            hash = (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

/// The name of the object of `class` on `node` with `segments`: `drivelet-` and 16 hex
/// digits of a hash of all three (a valid DNS name whatever the names hold).
pub(crate) fn object_name(node: &str, class: &str, segments: &BTreeMap<String, String>) -> String {
    let mut parts = vec![node, class];
    for (k, v) in segments {
        parts.push(k);
        parts.push(v);
    }
    format!("drivelet-{:016x}", hash64(&parts))
}

/// 32-bit FNV-1a of `s`, as 8 hex digits (the external-provisioner's name hash).
fn hash32(s: &str) -> String {
    let mut hash = 0x811c_9dc5_u32;
    for b in s.as_bytes() {
        hash = (hash ^ u32::from(*b)).wrapping_mul(0x0100_0193);
    }
    format!("{hash:08x}")
}

/// The [`MANAGED_BY`] value the external-provisioner sidecar gave its objects of `node`
/// in node-deployment mode: `external-provisioner-<node>`, shortened as that project's
/// `getNameWithMaxLength` does when longer than 63 characters (the base cut, with a hash
/// of the base, before the node; or, for a node name too long for that, the base with a
/// hash of the whole).
pub(crate) fn sidecar_managed_by(node: &str) -> String {
    const BASE: &str = "external-provisioner";
    const MAX: usize = 63;
    let name = format!("{BASE}-{node}");
    if name.len() <= MAX {
        return name;
    }
    match (MAX - 10).checked_sub(node.len()).filter(|n| *n > 0) {
        Some(keep) => format!("{}-{}-{node}", &BASE[..keep.min(BASE.len())], hash32(BASE)),
        None => {
            let short = format!("{}-{}", &BASE[..BASE.len().min(MAX - 9)], hash32(&name));
            short.chars().take(MAX).collect()
        }
    }
}

/// Why a round of the capacity loop failed (it is retried with backoff).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CapacityError {
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// What was asked, in plain words (`creating CSIStorageCapacity drivelet-... of StorageClass fast`).
        what: String,
        /// The API error.
        source: kube::Error,
    },
    /// The Node has no uid, so it cannot own the objects.
    #[error("Node {node} has no uid to own its CSIStorageCapacity objects")]
    NoUid {
        /// The node.
        node: String,
    },
}

/// The [`CapacityError::Api`] of a failed `what`.
pub(crate) fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> CapacityError {
    let what = what.into();
    move |source| CapacityError::Api { what, source }
}
