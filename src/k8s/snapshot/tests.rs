//! Table tests of the snapshotter's decisions and patches, and the fixtures the fake API
//! tests share.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

use super::backend::SnapshotInfo;
use super::controller::content_differs;
use super::objects::{VolumeSnapshotClass, VolumeSnapshotContent, VolumeSnapshotContentSpec, VolumeSnapshotContentStatus, VolumeSnapshotError};
use super::*;

pub(crate) const DRIVER: &str = "csi.drivelet.io";
pub(crate) const NODE: &str = "node-a";
pub(crate) const UID: &str = "4f1c-77aa";

pub(crate) fn identity() -> Identity {
    Identity { driver: DRIVER.into(), node: NODE.into() }
}

/// A dynamic content of `vol-1`, bound to VolumeSnapshot `ns/snap` (uid [`UID`]), class
/// `fast`, policy Delete, with the snapshot-controller's finalizer.
pub(crate) fn content() -> VolumeSnapshotContent {
    let mut spec = VolumeSnapshotContentSpec {
        deletion_policy: "Delete".into(),
        driver: DRIVER.into(),
        volume_snapshot_class_name: Some("fast".into()),
        ..Default::default()
    };
    spec.source.volume_handle = Some("vol-1".into());
    spec.volume_snapshot_ref.name = Some("snap".into());
    spec.volume_snapshot_ref.namespace = Some("ns".into());
    spec.volume_snapshot_ref.uid = Some(UID.into());
    let mut c = VolumeSnapshotContent::new("snapcontent-1", spec);
    c.metadata.resource_version = Some("7".into());
    c.metadata.finalizers = Some(vec![CONTENT_FINALIZER.into()]);
    c
}

/// `c` with annotation `key`.
pub(crate) fn annotated(mut c: VolumeSnapshotContent, key: &str) -> VolumeSnapshotContent {
    c.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(key.into(), "yes".into());
    c
}

/// `c` labelled for `node`.
pub(crate) fn labelled(mut c: VolumeSnapshotContent, node: &str) -> VolumeSnapshotContent {
    c.metadata.labels.get_or_insert_with(BTreeMap::new).insert(NODE_LABEL.into(), node.into());
    c
}

/// `c` ready with snapshot `snap-id`.
pub(crate) fn ready(mut c: VolumeSnapshotContent) -> VolumeSnapshotContent {
    c.status = Some(VolumeSnapshotContentStatus {
        snapshot_handle: Some("snap-id".into()),
        creation_time: Some(1_700_000_000_000_000_000),
        restore_size: Some(1 << 30),
        ready_to_use: Some(true),
        ..Default::default()
    });
    c
}

/// `c` being deleted by the snapshot-controller.
pub(crate) fn deleting(c: VolumeSnapshotContent) -> VolumeSnapshotContent {
    let mut c = annotated(c, BEING_DELETED);
    c.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1_700_000_100).expect("time")));
    c
}

/// A class of ours named `name` with `params`.
pub(crate) fn class(name: &str, params: &[(&str, &str)]) -> VolumeSnapshotClass {
    let mut k = VolumeSnapshotClass { driver: DRIVER.into(), deletion_policy: "Delete".into(), ..Default::default() };
    k.metadata.name = Some(name.into());
    if !params.is_empty() {
        k.parameters = Some(params.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect());
    }
    k
}

fn classes() -> BTreeMap<String, VolumeSnapshotClass> {
    let fast = class("fast", &[("csi.storage.k8s.io/snapshotter-secret-name", "s3cr3t"), (FREEZE_PARAMETER, "true")]);
    let bad = class("bad", &[("csi.storage.k8s.io/unknown", "x")]);
    let mut theirs = class("theirs", &[]);
    theirs.driver = "other.csi".into();
    [("fast".to_string(), fast), ("bad".to_string(), bad), ("theirs".to_string(), theirs)].into()
}

/// The snapshot this node holds for [`content`].
pub(crate) fn info(ready: bool, freeze_millis: Option<u64>) -> SnapshotInfo {
    SnapshotInfo {
        id: "snap-id".into(),
        name: format!("snapshot-{UID}"),
        source_volume_id: "vol-1".into(),
        restore_size: 1 << 30,
        created_unix_nanos: 1_700_000_000_123_456_789,
        ready,
        freeze_millis,
    }
}

fn creation() -> Plan {
    Plan::Create(Creation {
        name: format!("snapshot-{UID}"),
        source_volume_id: "vol-1".into(),
        parameters: [(FREEZE_PARAMETER.to_string(), "true".to_string())].into(),
    })
}

#[test]
fn plan_follows_the_sidecar_protocol_for_the_holder_of_the_volume_or_snapshot() {
    let snap = info(true, None);
    let vol = Held { volume: true, snapshot: None };
    let both = Held { volume: true, snapshot: Some(&snap) };
    let only_snap = Held { volume: false, snapshot: Some(&snap) };
    let none = Held::default();
    let mut theirs = content();
    theirs.spec.driver = "other.csi".into();
    let mut no_class = content();
    no_class.spec.volume_snapshot_class_name = None;
    let mut missing_class = content();
    missing_class.spec.volume_snapshot_class_name = Some("gone".into());
    let mut other_drivers_class = content();
    other_drivers_class.spec.volume_snapshot_class_name = Some("theirs".into());
    let mut bad_class = content();
    bad_class.spec.volume_snapshot_class_name = Some("bad".into());
    let mut unbound = content();
    unbound.spec.volume_snapshot_ref.uid = None;
    let mut errored = content();
    errored.status = Some(VolumeSnapshotContentStatus {
        ready_to_use: Some(false),
        error: Some(VolumeSnapshotError { time: None, message: Some("busy".into()) }),
        ..Default::default()
    });
    let mut retain = deleting(ready(content()));
    retain.spec.deletion_policy = "Retain".into();
    let mut pre = content();
    pre.spec.source = objects::ContentSource { volume_handle: None, snapshot_handle: Some("snap-id".into()) };
    let mut pre_unbound_deleted = pre.clone();
    pre_unbound_deleted.spec.volume_snapshot_ref.uid = None;
    pre_unbound_deleted.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1).expect("time")));
    pre_unbound_deleted.status = ready(content()).status;
    let mut deleted_no_annotation = ready(content());
    deleted_no_annotation.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1).expect("time")));
    let grouped = annotated(content(), GROUP_MEMBER);
    let mut no_finalizer = deleting(content());
    no_finalizer.metadata.finalizers = None;

    let table: Vec<(&str, VolumeSnapshotContent, Held<'_>, Plan)> = vec![
        ("another driver's content", theirs, both, Plan::Nothing("another driver's content")),
        ("labelled for another node", labelled(content(), "node-b"), both, Plan::Nothing("another node's content")),
        ("neither volume nor snapshot here", content(), none, Plan::Nothing("neither its volume nor its snapshot is on this node")),
        ("new content of a volume held here", content(), vol, creation()),
        ("an earlier error is retried", errored, vol, creation()),
        ("labelled here though the volume is not known (yet)", labelled(content(), NODE), none, creation()),
        ("no class", no_class, vol, Plan::Fail(SnapshotError::NoClass { content: "snapcontent-1".into(), driver: DRIVER.into() })),
        ("class gone", missing_class, vol, Plan::Fail(SnapshotError::ClassNotFound { class: "gone".into(), driver: DRIVER.into() })),
        ("another driver's class", other_drivers_class, vol, Plan::Fail(SnapshotError::ClassNotFound { class: "theirs".into(), driver: DRIVER.into() })),
        ("unknown reserved parameter", bad_class, vol, Plan::Fail(SnapshotError::ReservedParameter { class: "bad".into(), key: "csi.storage.k8s.io/unknown".into() })),
        ("not bound to a VolumeSnapshot", unbound, vol, Plan::Fail(SnapshotError::Unbound { content: "snapcontent-1".into() })),
        ("ready and labelled", labelled(ready(content()), NODE), both, Plan::Nothing("ready")),
        ("ready, label missing", ready(content()), both, Plan::Tidy),
        ("ready, annotation left over", labelled(annotated(ready(content()), BEING_CREATED), NODE), both, Plan::Tidy),
        ("deleted with policy Delete", deleting(ready(content())), both, Plan::Delete { snapshot_id: "snap-id".into() }),
        ("deleted after the source volume went", deleting(ready(content())), only_snap, Plan::Delete { snapshot_id: "snap-id".into() }),
        ("deleted while a CreateSnapshot is outstanding", annotated(deleting(content()), BEING_CREATED), vol, creation()),
        ("deleted with policy Retain", retain, both, Plan::RemoveFinalizer),
        ("deleted before any snapshot was taken", deleting(content()), vol, Plan::RemoveFinalizer),
        ("deleted, finalizer gone", no_finalizer, vol, Plan::Nothing("deleted, and no finalizer of the snapshotter's is left")),
        ("deletion timestamp without the controller's annotation", labelled(deleted_no_annotation, NODE), both, Plan::Nothing("ready")),
        ("pre-provisioned, snapshot here", pre.clone(), only_snap, Plan::Refresh(snap.clone())),
        ("pre-provisioned, snapshot elsewhere", pre.clone(), none, Plan::Nothing("neither its volume nor its snapshot is on this node")),
        ("pre-provisioned, labelled here, snapshot gone", labelled(pre, NODE), none, Plan::Fail(SnapshotError::NotHere { snapshot_id: "snap-id".into(), node: NODE.into() })),
        ("pre-provisioned and unbound, deleted", pre_unbound_deleted, only_snap, Plan::Delete { snapshot_id: "snap-id".into() }),
        ("member of a group snapshot", grouped, vol, Plan::Nothing("a member of a group snapshot")),
    ];
    for (case, c, held, want) in table {
        assert_eq!(plan(&c, &classes(), held, &identity()), want, "{case}");
    }
}

#[test]
fn parameters_drop_the_secret_keys_and_refuse_other_reserved_ones() {
    let p = |kv: &[(&str, &str)]| -> BTreeMap<String, String> { kv.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect() };
    let table = [
        (p(&[]), Ok(p(&[]))),
        (p(&[(FREEZE_PARAMETER, "true"), ("other", "x")]), Ok(p(&[(FREEZE_PARAMETER, "true"), ("other", "x")]))),
        (
            p(&[("csi.storage.k8s.io/snapshotter-secret-name", "s"), ("csi.storage.k8s.io/snapshotter-list-secret-namespace", "n"), (FREEZE_PARAMETER, "false")]),
            Ok(p(&[(FREEZE_PARAMETER, "false")])),
        ),
        (p(&[("csi.storage.k8s.io/fstype", "ext4")]), Err("csi.storage.k8s.io/fstype".to_string())),
        // Deprecated keys of the older `csi.storage.k8s.io`-less spelling pass through.
        (p(&[("csiSnapshotterSecretName", "s")]), Ok(p(&[("csiSnapshotterSecretName", "s")]))),
    ];
    for (given, want) in table {
        assert_eq!(parameters(Some(&given)), want, "{given:?}");
    }
    assert_eq!(parameters(None), Ok(BTreeMap::new()));
}

#[test]
fn the_snapshot_is_named_after_the_whole_uid_of_the_volume_snapshot() {
    assert_eq!(snapshot_name("0e2f-11").as_deref(), Some("snapshot-0e2f-11"));
    assert_eq!(snapshot_name(""), None);
}

#[test]
fn ready_patch_sets_only_what_is_missing_and_clears_the_error_once_ready() {
    let fresh = ready_patch(&content(), &info(true, Some(3)));
    assert_eq!(
        fresh,
        Some(json!({"status": {"snapshotHandle": "snap-id", "readyToUse": true, "creationTime": 1_700_000_000_123_456_789_i64, "restoreSize": 1_073_741_824}}))
    );
    let mut errored = content();
    errored.status = Some(VolumeSnapshotContentStatus {
        snapshot_handle: Some("snap-id".into()),
        creation_time: Some(5),
        ready_to_use: Some(false),
        error: Some(VolumeSnapshotError { time: None, message: Some("x".into()) }),
        ..Default::default()
    });
    assert_eq!(
        ready_patch(&errored, &info(true, None)),
        Some(json!({"status": {"readyToUse": true, "error": null, "restoreSize": 1_073_741_824}})),
        "handle and time stay as recorded"
    );
    assert_eq!(ready_patch(&ready(content()), &info(true, None)), None, "nothing to change");
    let mut empty = info(false, None);
    empty.restore_size = 0;
    assert_eq!(
        ready_patch(&content(), &empty),
        Some(json!({"status": {"snapshotHandle": "snap-id", "readyToUse": false, "creationTime": 1_700_000_000_123_456_789_i64}})),
        "no size when unknown"
    );
}

#[test]
fn error_patch_is_written_once_per_message() {
    let now = Time(Timestamp::from_second(1_700_000_000).expect("time"));
    let patch = error_patch(&content(), "in use", &now).expect("a first error is recorded");
    assert_eq!(patch, json!({"status": {"error": {"time": "2023-11-14T22:13:20Z", "message": "in use"}, "readyToUse": false}}));
    let mut recorded = content();
    recorded.status = Some(VolumeSnapshotContentStatus {
        error: Some(VolumeSnapshotError { time: Some(now.clone()), message: Some("in use".into()) }),
        ..Default::default()
    });
    assert_eq!(error_patch(&recorded, "in use", &now), None);
    assert!(error_patch(&recorded, "no room", &now).is_some());
}

#[test]
fn metadata_patches_set_and_remove_the_annotation_and_label_only_when_needed() {
    let want = json!({"metadata": {"annotations": {BEING_CREATED: "yes"}, "labels": {NODE_LABEL: NODE}}});
    assert_eq!(creating_patch(&content(), NODE), Some(want));
    assert_eq!(creating_patch(&labelled(annotated(content(), BEING_CREATED), NODE), NODE), None);
    assert_eq!(
        settled_patch(&labelled(annotated(content(), BEING_CREATED), NODE), NODE),
        Some(json!({"metadata": {"annotations": {BEING_CREATED: null}}}))
    );
    assert_eq!(settled_patch(&content(), NODE), Some(json!({"metadata": {"labels": {NODE_LABEL: NODE}}})));
    assert_eq!(settled_patch(&labelled(content(), NODE), NODE), None);
}

#[test]
fn finalizer_patch_keeps_the_other_finalizers_and_is_guarded_by_the_version() {
    let mut c = content();
    c.metadata.finalizers = Some(vec!["a".into(), CONTENT_FINALIZER.into(), "b".into()]);
    assert_eq!(finalizer_patch(&c), json!({"metadata": {"finalizers": ["a", "b"], "resourceVersion": "7"}}));
    assert_eq!(cleared_patch(), json!({"status": {"snapshotHandle": null, "readyToUse": null, "creationTime": null, "restoreSize": null}}));
}

#[test]
fn the_taken_note_names_the_node_the_size_and_the_freeze_stall() {
    assert_eq!(
        taken_note(&info(true, Some(42)), NODE),
        "drivelet took snapshot snap-id of volume vol-1 on node node-a (1.0 GiB); a volume restored from it is made on node node-a; \
         the filesystem was frozen for 42 ms while its data was copied"
    );
    assert!(!taken_note(&info(true, None), NODE).contains("frozen"));
}

#[test]
fn only_changes_by_others_queue_a_content() {
    let base = content();
    let table: Vec<(&str, VolumeSnapshotContent, bool)> = vec![
        ("our annotation", annotated(base.clone(), BEING_CREATED), false),
        ("our label", labelled(base.clone(), NODE), false),
        ("our status", ready(base.clone()), false),
        ("the controller's annotation", annotated(base.clone(), BEING_DELETED), true),
        ("deletion", deleting(base.clone()), true),
        ("finalizers", { let mut c = base.clone(); c.metadata.finalizers = None; c }, true),
        ("spec", { let mut c = base.clone(); c.spec.deletion_policy = "Retain".into(); c }, true),
    ];
    for (case, new, want) in table {
        assert_eq!(content_differs(&base, &new), want, "{case}");
    }
}

#[test]
fn events_go_to_the_bound_volume_snapshot_else_the_content() {
    let r = executor::event_target(&content());
    assert_eq!((r.kind.as_deref(), r.namespace.as_deref(), r.name.as_deref()), (Some("VolumeSnapshot"), Some("ns"), Some("snap")));
    let mut unbound = content();
    unbound.spec.volume_snapshot_ref.uid = None;
    let r = executor::event_target(&unbound);
    assert_eq!((r.kind.as_deref(), r.name.as_deref()), (Some("VolumeSnapshotContent"), Some("snapcontent-1")));
}

#[test]
fn a_content_from_the_api_server_parses() {
    let raw: Value = json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
        "metadata": {"name": "snapcontent-x", "finalizers": [CONTENT_FINALIZER]},
        "spec": {"deletionPolicy": "Delete", "driver": DRIVER, "source": {"volumeHandle": "vol-1"},
                 "sourceVolumeMode": "Filesystem", "volumeSnapshotClassName": "fast",
                 "volumeSnapshotRef": {"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot", "name": "s", "namespace": "ns", "uid": "u"}},
        "status": {"snapshotHandle": "h", "creationTime": 1_700_000_000_000_000_001_i64, "restoreSize": 5, "readyToUse": true}
    });
    let c: VolumeSnapshotContent = serde_json::from_value(raw).expect("parses");
    assert_eq!(c.spec.source.volume_handle.as_deref(), Some("vol-1"));
    assert_eq!(c.status.as_ref().and_then(|s| s.creation_time), Some(1_700_000_000_000_000_001));
    let k: VolumeSnapshotClass = serde_json::from_value(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass", "metadata": {"name": "k"},
        "driver": DRIVER, "deletionPolicy": "Delete", "parameters": {FREEZE_PARAMETER: "true"}
    }))
    .expect("parses");
    assert_eq!(k.parameters.as_ref().and_then(|p| p.get(FREEZE_PARAMETER)).map(String::as_str), Some("true"));
}

#[test]
fn refusals_count_as_busy_transient_or_final_by_their_variant() {
    use crate::actors::volumes::VolumeError;
    use backend::{failure_of, Failure};
    let table = [
        (VolumeError::Busy { volume_id: "v".into() }, Failure::Busy),
        (VolumeError::ResourceExhausted { reason: "full".into() }, Failure::Transient),
        (VolumeError::NotReady, Failure::Transient),
        (VolumeError::SnapshotSourceInUse { volume_id: "v".into(), path: "/p".into(), block: false }, Failure::Final),
        (VolumeError::SnapshotNameTaken { name: "n".into(), existing_source: "a".into(), asked_source: "b".into() }, Failure::Final),
        (VolumeError::NotFound { volume_id: "v".into() }, Failure::Final),
        (VolumeError::InvalidArgument { reason: "x".into() }, Failure::Final),
    ];
    for (e, want) in table {
        assert_eq!(failure_of(&e), want, "{e}");
    }
}
