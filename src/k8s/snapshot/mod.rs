//! The in-process snapshotter: decides what to do about one VolumeSnapshotContent of
//! this driver, and builds the patches it writes, following the protocol of the
//! csi-snapshotter sidecar (v8.2.0) with the common snapshot-controller as clusters run
//! it by default (no distributed snapshotting: contents carry no node, so the agent that
//! holds a content's volume or snapshot picks the content itself). The [`controller`],
//! run by the controller shell (`crate::k8s::shell`), runs these decisions.
//!
//! Rules, decided by the pure [`plan`] and the patch builders:
//! - A content is this agent's when its `spec.driver` is ours, its [`NODE_LABEL`] (set
//!   here when a snapshot is first taken) names no other node, and this node holds its
//!   source volume (`spec.source.volumeHandle`) or its snapshot (`status.snapshotHandle`
//!   or `spec.source.snapshotHandle`, or the snapshot named for it), or the label names
//!   this node. Every other content is left alone: another agent holds it.
//! - Deletion, as the sidecar's `shouldDelete`: a content with a deletion timestamp is
//!   deleted when it is a pre-provisioned one bound to no VolumeSnapshot, or when the
//!   snapshot-controller set [`BEING_DELETED`] and no CreateSnapshot is outstanding
//!   ([`BEING_CREATED`] absent). With `deletionPolicy: Delete` and a
//!   `status.snapshotHandle`, the snapshot is deleted, then the status cleared (handle,
//!   readyToUse, creationTime, restoreSize); without a handle, or with `Retain`, only
//!   [`CONTENT_FINALIZER`] is removed (the snapshot-controller put it there).
//! - Creation: a content with `spec.source.volumeHandle` and no status, or with a status
//!   that is not ready, takes the snapshot named [`snapshot_name`] (`snapshot-<uid of the
//!   VolumeSnapshot>`, idempotent by name) with its VolumeSnapshotClass's parameters
//!   ([`parameters`]: the `csi.storage.k8s.io/` secret keys removed, another key of that
//!   prefix refused). [`BEING_CREATED`] is set (with the node label) before the call and
//!   removed after its answer, kept when the answer may not be final (busy, no room, the
//!   volume manager restarting), so a content is never deleted while a snapshot may be
//!   in the making.
//! - A pre-provisioned content (`spec.source.snapshotHandle`) that is not ready gets its
//!   status from the snapshot this node holds.
//! - Status as the sidecar writes it ([`ready_patch`]): snapshotHandle, creationTime
//!   (ns) and restoreSize (bytes, when known) only when not set yet; readyToUse always;
//!   the error cleared once ready. An error ([`error_patch`]) sets `status.error` and
//!   `readyToUse: false`, once per distinct message.
//! - A ready content is left alone but for removing a leftover [`BEING_CREATED`] and
//!   setting a missing node label.
//!
//! Group snapshots are not handled: a content of a group is left alone.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{json, Map, Value};

use self::backend::SnapshotInfo;
use self::objects::{VolumeSnapshotClass, VolumeSnapshotContent};
use super::identity::Identity;
use crate::config::human_bytes;
pub(crate) use crate::k8s::drives::NODE_LABEL;

/// The volume side: what the snapshotter asks of the volume manager, and the
/// VolumeManager backend of a running agent.
pub(crate) mod backend;
/// The snapshot controller the shell runs (the SnapshotQueue actor): what is kept of the
/// watched contents and classes, which contents a change queues, and a run of a content.
pub(crate) mod controller;
/// Carries a planned step out against the API server and the volume side.
pub(crate) mod executor;
/// The `snapshot.storage.k8s.io/v1` objects, as far as the snapshotter reads them.
pub(crate) mod objects;

pub(crate) use backend::ManagerBackend;
pub(crate) use controller::SnapshotQueue;

#[cfg(test)]
mod tests;

/// Set on a content while a CreateSnapshot may be outstanding (the sidecar's
/// `AnnVolumeSnapshotBeingCreated`, value `yes`).
pub(crate) const BEING_CREATED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-created";
/// Set by the snapshot-controller when a content is to be deleted.
pub(crate) const BEING_DELETED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-deleted";
/// The snapshot-controller's finalizer on a content, removed here once the snapshot is
/// gone (or kept, with `Retain`).
pub(crate) const CONTENT_FINALIZER: &str = "snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection";
/// Marks a content that is a member of a group snapshot (left alone).
pub(crate) const GROUP_MEMBER: &str = "groupsnapshot.storage.kubernetes.io/volume-group-snapshot-handle";
/// The prefix of a snapshot's CSI name (the sidecar's `--snapshot-name-prefix` default).
pub(crate) const NAME_PREFIX: &str = "snapshot";
/// The class parameter that asks for a filesystem freeze during the copy (the volume
/// side reads it; here it is only passed on).
#[cfg(test)]
pub(crate) use crate::actors::volumes::snapshot::FREEZE_PARAM as FREEZE_PARAMETER;
/// Class parameters with this prefix are for the snapshotter, not the driver.
const CSI_PREFIX: &str = "csi.storage.k8s.io/";
/// The `csi.storage.k8s.io/` keys the sidecar knows (secrets): removed, never logged.
const SECRET_KEYS: [&str; 8] = [
    "csi.storage.k8s.io/snapshotter-secret-name",
    "csi.storage.k8s.io/snapshotter-secret-namespace",
    "csi.storage.k8s.io/snapshotter-list-secret-name",
    "csi.storage.k8s.io/snapshotter-list-secret-namespace",
    "csi.storage.k8s.io/group-snapshotter-get-secret-name",
    "csi.storage.k8s.io/group-snapshotter-get-secret-namespace",
    "csi.storage.k8s.io/group-snapshotter-secret-name",
    "csi.storage.k8s.io/group-snapshotter-secret-namespace",
];

/// Why a content cannot be acted on as it is; the words go to `status.error` and an Event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SnapshotError {
    /// A dynamic content names no class.
    #[error("VolumeSnapshotContent {content} names no VolumeSnapshotClass; a snapshot is taken with a class of driver {driver}")]
    NoClass {
        /// The content.
        content: String,
        /// Our driver.
        driver: String,
    },
    /// The class named does not exist (or is another driver's).
    #[error("VolumeSnapshotClass {class} of driver {driver} does not exist")]
    ClassNotFound {
        /// The class.
        class: String,
        /// Our driver.
        driver: String,
    },
    /// The class has a `csi.storage.k8s.io/` parameter the snapshotter does not know.
    #[error("VolumeSnapshotClass {class} has parameter {key}, which is reserved for the snapshotter and not one it knows")]
    ReservedParameter {
        /// The class.
        class: String,
        /// The key.
        key: String,
    },
    /// The content is not bound to a VolumeSnapshot, whose uid names the snapshot.
    #[error("VolumeSnapshotContent {content} is not bound to a VolumeSnapshot (no uid in spec.volumeSnapshotRef), so its snapshot cannot be named")]
    Unbound {
        /// The content.
        content: String,
    },
    /// A pre-provisioned content names a snapshot this node is labelled for but does not hold.
    #[error("snapshot {snapshot_id} is not on node {node}")]
    NotHere {
        /// The snapshot id.
        snapshot_id: String,
        /// This node.
        node: String,
    },
}

/// What the volume side holds for one content, found out before [`plan`] runs.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Held<'a> {
    /// This node holds the content's source volume.
    pub volume: bool,
    /// The snapshot this node holds for the content (by its handle, or by the name
    /// [`snapshot_name`] gives it).
    pub snapshot: Option<&'a SnapshotInfo>,
}

/// A snapshot to take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Creation {
    /// The CSI name: [`snapshot_name`].
    pub name: String,
    /// The source volume's CSI id.
    pub source_volume_id: String,
    /// The class's parameters without the `csi.storage.k8s.io/` keys.
    pub parameters: BTreeMap<String, String>,
}

/// What to do about a content.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Plan {
    /// Nothing (why, for the debug log).
    Nothing(&'static str),
    /// Take (or finish taking) a snapshot and record it.
    Create(Creation),
    /// Write the status of a pre-provisioned content from the snapshot held here.
    Refresh(SnapshotInfo),
    /// Ready: only remove a leftover [`BEING_CREATED`] and set the node label.
    Tidy,
    /// Delete the snapshot, clear the status, then remove the finalizer.
    Delete {
        /// The snapshot's CSI id.
        snapshot_id: String,
    },
    /// Remove [`CONTENT_FINALIZER`] only.
    RemoveFinalizer,
    /// Record why the content cannot be acted on.
    Fail(SnapshotError),
}

/// The CSI name of the snapshot of the VolumeSnapshot with `uid`, as the sidecar makes
/// it (`snapshot-<uid>`, the uid whole); `None` without a uid.
pub(crate) fn snapshot_name(uid: &str) -> Option<String> {
    (!uid.is_empty()).then(|| format!("{NAME_PREFIX}-{uid}"))
}

/// A class's parameters as CreateSnapshot takes them: the known `csi.storage.k8s.io/`
/// keys (secrets) removed, an unknown key of that prefix refused (its name in the error).
pub(crate) fn parameters(params: Option<&BTreeMap<String, String>>) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (k, v) in params.into_iter().flatten() {
        if k.starts_with(CSI_PREFIX) {
            if !SECRET_KEYS.contains(&k.as_str()) {
                return Err(k.clone());
            }
        } else {
            out.insert(k.clone(), v.clone());
        }
    }
    Ok(out)
}

fn annotation<'a>(c: &'a VolumeSnapshotContent, key: &str) -> Option<&'a str> {
    c.metadata.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str)
}

/// The node a content's [`NODE_LABEL`] names.
pub(crate) fn labelled_node(c: &VolumeSnapshotContent) -> Option<&str> {
    c.metadata.labels.as_ref().and_then(|l| l.get(NODE_LABEL)).map(String::as_str)
}

/// Whether the content is ready to use.
pub(crate) fn is_ready(c: &VolumeSnapshotContent) -> bool {
    c.status.as_ref().and_then(|s| s.ready_to_use) == Some(true)
}

/// The snapshot id a content records: `status.snapshotHandle`, else
/// `spec.source.snapshotHandle`.
pub(crate) fn snapshot_handle(c: &VolumeSnapshotContent) -> Option<&str> {
    c.status.as_ref().and_then(|s| s.snapshot_handle.as_deref()).or(c.spec.source.snapshot_handle.as_deref())
}

/// The sidecar's `shouldDelete` (see the module rules).
pub(crate) fn should_delete(c: &VolumeSnapshotContent) -> bool {
    if c.metadata.deletion_timestamp.is_none() {
        return false;
    }
    let unbound = c.spec.volume_snapshot_ref.uid.as_deref().unwrap_or("").is_empty();
    if c.spec.source.snapshot_handle.is_some() && unbound {
        return true;
    }
    annotation(c, BEING_CREATED).is_none() && annotation(c, BEING_DELETED).is_some()
}

fn has_finalizer(c: &VolumeSnapshotContent) -> bool {
    c.metadata.finalizers.iter().flatten().any(|f| f == CONTENT_FINALIZER)
}

/// Decide about one content (see the module rules); `classes` are this driver's
/// VolumeSnapshotClasses by name.
pub(crate) fn plan(c: &VolumeSnapshotContent, classes: &BTreeMap<String, VolumeSnapshotClass>, held: Held<'_>, id: &Identity) -> Plan {
    if c.spec.driver != id.driver {
        return Plan::Nothing("another driver's content");
    }
    let label = labelled_node(c);
    if label.is_some_and(|n| n != id.node) {
        return Plan::Nothing("another node's content");
    }
    let volume = c.spec.source.volume_handle.as_deref();
    let mine = label.is_some() || held.snapshot.is_some() || (volume.is_some() && held.volume);
    if !mine {
        return Plan::Nothing("neither its volume nor its snapshot is on this node");
    }
    let status = c.status.as_ref();
    if should_delete(c) {
        let handle = status.and_then(|s| s.snapshot_handle.as_deref());
        let grouped = status.and_then(|s| s.volume_group_snapshot_handle.as_ref()).is_some();
        if c.spec.deletion_policy == "Delete" && !grouped {
            if let Some(h) = handle {
                return Plan::Delete { snapshot_id: h.to_string() };
            }
        }
        return if has_finalizer(c) { Plan::RemoveFinalizer } else { Plan::Nothing("deleted, and no finalizer of the snapshotter's is left") };
    }
    let grouped = annotation(c, GROUP_MEMBER).is_some();
    if is_ready(c) {
        return if annotation(c, BEING_CREATED).is_some() || label.is_none() { Plan::Tidy } else { Plan::Nothing("ready") };
    }
    if let Some(h) = c.spec.source.snapshot_handle.as_deref() {
        return match held.snapshot {
            Some(s) => Plan::Refresh(s.clone()),
            None => Plan::Fail(SnapshotError::NotHere { snapshot_id: h.to_string(), node: id.node.clone() }),
        };
    }
    let Some(volume) = volume else { return Plan::Nothing("no source to snapshot") };
    if grouped {
        return Plan::Nothing("a member of a group snapshot");
    }
    match creation(c, volume, classes, id) {
        Ok(creation) => Plan::Create(creation),
        Err(e) => Plan::Fail(e),
    }
}

fn creation(c: &VolumeSnapshotContent, volume: &str, classes: &BTreeMap<String, VolumeSnapshotClass>, id: &Identity) -> Result<Creation, SnapshotError> {
    let content = c.metadata.name.clone().unwrap_or_default();
    let driver = id.driver.clone();
    let class_name = c.spec.volume_snapshot_class_name.as_deref().ok_or(SnapshotError::NoClass { content: content.clone(), driver: driver.clone() })?;
    let class = classes.get(class_name).filter(|k| k.driver == id.driver);
    let class = class.ok_or_else(|| SnapshotError::ClassNotFound { class: class_name.to_string(), driver })?;
    let parameters = parameters(class.parameters.as_ref())
        .map_err(|key| SnapshotError::ReservedParameter { class: class_name.to_string(), key })?;
    let name = snapshot_name(c.spec.volume_snapshot_ref.uid.as_deref().unwrap_or("")).ok_or(SnapshotError::Unbound { content })?;
    Ok(Creation { name, source_volume_id: volume.to_string(), parameters })
}

/// The metadata patch before a CreateSnapshot: [`BEING_CREATED`] and the node label, or
/// `None` when both are there.
pub(crate) fn creating_patch(c: &VolumeSnapshotContent, node: &str) -> Option<Value> {
    (annotation(c, BEING_CREATED).is_none() || labelled_node(c) != Some(node))
        .then(|| json!({"metadata": {"annotations": {BEING_CREATED: "yes"}, "labels": {NODE_LABEL: node}}}))
}

/// The metadata patch after a final answer (and of [`Plan::Tidy`]): [`BEING_CREATED`]
/// removed and the node label set, or `None` when there is nothing to change.
pub(crate) fn settled_patch(c: &VolumeSnapshotContent, node: &str) -> Option<Value> {
    let mut meta = Map::new();
    if annotation(c, BEING_CREATED).is_some() {
        meta.insert("annotations".into(), json!({BEING_CREATED: null}));
    }
    if labelled_node(c) != Some(node) {
        meta.insert("labels".into(), json!({NODE_LABEL: node}));
    }
    (!meta.is_empty()).then(|| json!({"metadata": meta}))
}

/// The status patch recording `s` as the content's snapshot, as the sidecar's
/// `updateSnapshotContentStatus` (see the module rules); `None` when nothing changes.
pub(crate) fn ready_patch(c: &VolumeSnapshotContent, s: &SnapshotInfo) -> Option<Value> {
    let old = c.status.clone().unwrap_or_default();
    let mut status = Map::new();
    if old.snapshot_handle.is_none() {
        status.insert("snapshotHandle".into(), json!(s.id));
    }
    if old.ready_to_use != Some(s.ready) {
        status.insert("readyToUse".into(), json!(s.ready));
        if s.ready && old.error.is_some() {
            status.insert("error".into(), Value::Null);
        }
    }
    if old.creation_time.is_none() {
        status.insert("creationTime".into(), json!(s.created_unix_nanos));
    }
    let size = i64::try_from(s.restore_size).unwrap_or(i64::MAX);
    if old.restore_size.is_none() && size > 0 {
        status.insert("restoreSize".into(), json!(size));
    }
    (!status.is_empty()).then(|| json!({"status": status}))
}

/// The status patch recording an error, `None` when the same message is recorded already
/// (the sidecar's `updateContentErrorStatusWithEvent`).
pub(crate) fn error_patch(c: &VolumeSnapshotContent, message: &str, now: &Time) -> Option<Value> {
    let same = c.status.as_ref().and_then(|s| s.error.as_ref()).and_then(|e| e.message.as_deref()) == Some(message);
    (!same).then(|| json!({"status": {"error": {"time": now, "message": message}, "readyToUse": false}}))
}

/// The status patch after the snapshot is deleted (the sidecar's
/// `clearVolumeContentStatus`).
pub(crate) fn cleared_patch() -> Value {
    json!({"status": {"snapshotHandle": null, "readyToUse": null, "creationTime": null, "restoreSize": null}})
}

/// The metadata patch removing [`CONTENT_FINALIZER`] (the other finalizers kept, and the
/// resourceVersion, so a concurrent change is a conflict, not lost).
pub(crate) fn finalizer_patch(c: &VolumeSnapshotContent) -> Value {
    let rest: Vec<&String> = c.metadata.finalizers.iter().flatten().filter(|f| *f != CONTENT_FINALIZER).collect();
    json!({"metadata": {"finalizers": rest, "resourceVersion": c.metadata.resource_version}})
}

/// The Normal Event's words when a snapshot is ready: where it is (a restore runs on that
/// node), its size, and the freeze stall when the source was frozen.
pub(crate) fn taken_note(s: &SnapshotInfo, node: &str) -> String {
    let mut note = format!(
        "drivelet took snapshot {} of volume {} on node {node} ({}); a volume restored from it is made on node {node}",
        s.id,
        s.source_volume_id,
        human_bytes(s.restore_size)
    );
    if let Some(ms) = s.freeze_millis {
        note.push_str(&format!("; the filesystem was frozen for {ms} ms while its data was copied"));
    }
    note
}
