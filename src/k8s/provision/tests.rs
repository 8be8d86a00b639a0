//! The provisioner's decisions, table-tested: which claims wait here, the request and
//! the PV made for one, the secret templates, which PVs are deleted.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, TypedLocalObjectReference, TypedObjectReference};
use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::json;

use super::*;
use crate::grpc::proto::csi;

const DRIVER: &str = "csi.drivelet.io";

fn id() -> Identity {
    Identity { driver: DRIVER.into(), node: "node-1".into() }
}

fn claim(extra: serde_json::Value) -> PersistentVolumeClaim {
    let mut c = json!({
        "metadata": {"name": "data", "namespace": "ns", "uid": "u-1", "resourceVersion": "7",
            "annotations": {STORAGE_PROVISIONER: DRIVER, SELECTED_NODE: "node-1"}},
        "spec": {"storageClassName": "fast", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Pending"}
    });
    merge(&mut c, extra);
    serde_json::from_value(c).expect("claim")
}

fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
    match (a, b) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                if v.is_null() {
                    a.remove(&k);
                } else {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
        }
        (a, b) => *a = b,
    }
}

fn class(params: &[(&str, &str)]) -> StorageClass {
    let params: BTreeMap<String, String> = params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    serde_json::from_value(json!({"metadata": {"name": "fast"}, "provisioner": DRIVER, "parameters": params, "mountOptions": ["noatime"]}))
        .expect("class")
}

fn here() -> BTreeMap<String, String> {
    BTreeMap::from([("topology.drivelet.io/node".to_string(), "node-1".to_string())])
}

#[test]
fn a_claim_waits_here_only_when_pending_unbound_ours_and_selected_for_this_node() {
    assert!(waiting_here(&claim(json!({})), &id()));
    let cases = [
        (json!({"metadata": {"annotations": {SELECTED_NODE: "node-2"}}}), "selected for another node"),
        (json!({"metadata": {"annotations": {SELECTED_NODE: null}}}), "no node selected yet"),
        (json!({"metadata": {"annotations": {STORAGE_PROVISIONER: "other.csi"}}}), "another provisioner's"),
        (json!({"spec": {"volumeName": "pv-9"}}), "bound already"),
        (json!({"status": {"phase": "Bound"}}), "Bound"),
        (json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}), "being deleted"),
    ];
    for (extra, why) in cases {
        assert!(!waiting_here(&claim(extra), &id()), "{why}");
    }
    let beta = claim(json!({"metadata": {"annotations": {STORAGE_PROVISIONER: null, BETA_STORAGE_PROVISIONER: DRIVER}}}));
    assert!(waiting_here(&beta, &id()), "the beta annotation names the provisioner too");
}

#[test]
fn the_request_is_the_one_the_external_provisioner_sends() {
    let c = claim(json!({"spec": {"resources": {"limits": {"storage": "2Gi"}}}}));
    let k = class(&[("media", "ssd"), (FSTYPE, "xfs"), ("csi.storage.k8s.io/node-stage-secret-name", "s"), ("csi.storage.k8s.io/node-stage-secret-namespace", "ns")]);
    let req = request_of(&c, &k, Inputs { topology: here(), ..Default::default() }).expect("a request");
    assert_eq!(req.name, "pvc-u-1");
    assert_eq!(req.capacity_range, Some(csi::CapacityRange { required_bytes: 1 << 30, limit_bytes: 2 << 30 }));
    let want: std::collections::HashMap<String, String> = [
        ("media", "ssd"),
        ("csi.storage.k8s.io/pvc/name", "data"),
        ("csi.storage.k8s.io/pvc/namespace", "ns"),
        ("csi.storage.k8s.io/pv/name", "pvc-u-1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(req.parameters, want, "reserved keys stripped, the claim's and PV's names added");
    assert_eq!(req.volume_capabilities.len(), 1);
    match &req.volume_capabilities[0].access_type {
        Some(csi::volume_capability::AccessType::Mount(m)) => {
            assert_eq!(m.fs_type, "xfs");
            assert_eq!(m.mount_flags, ["noatime"]);
        }
        other => panic!("a mount capability, not {other:?}"),
    }
    let topo = req.accessibility_requirements.expect("topology");
    assert_eq!(topo.requisite.len(), 1);
    assert_eq!(topo.requisite[0].segments.get("topology.drivelet.io/node").map(String::as_str), Some("node-1"));
    assert_eq!(topo.preferred, topo.requisite);

    let block = claim(json!({"spec": {"volumeMode": "Block"}}));
    let req = request_of(&block, &k, Inputs::default()).expect("a request");
    assert!(matches!(req.volume_capabilities[0].access_type, Some(csi::volume_capability::AccessType::Block(_))));
}

#[test]
fn a_request_is_refused_in_words_for_an_unknown_reserved_key_or_a_selector() {
    let why = request_of(&claim(json!({})), &class(&[("csi.storage.k8s.io/provisioner-secret-nme", "x")]), Inputs::default()).unwrap_err();
    assert!(why.contains("csi.storage.k8s.io/provisioner-secret-nme") && why.contains("unknown"), "{why}");
    let sel = claim(json!({"spec": {"selector": {"matchLabels": {"a": "b"}}}}));
    let why = request_of(&sel, &class(&[]), Inputs::default()).unwrap_err();
    assert!(why.contains("selector"), "{why}");
}

#[test]
fn secret_templates_resolve_as_the_sidecar_resolves_them() {
    let c = claim(json!({"metadata": {"annotations": {"team": "blue"}}}));
    assert_eq!(resolve("kek-${pvc.name}", &c, "pvc-u-1", true).unwrap(), "kek-data");
    assert_eq!(resolve("${pvc.namespace}", &c, "pvc-u-1", false).unwrap(), "ns");
    assert_eq!(resolve("${pv.name}-x", &c, "pvc-u-1", false).unwrap(), "pvc-u-1-x");
    assert_eq!(resolve("k-${pvc.annotations['team']}", &c, "p", true).unwrap(), "k-blue");
    assert!(resolve("${pvc.name}", &c, "p", false).unwrap_err().contains("not one this parameter may use"));
    assert!(resolve("${pvc.annotations['nope']}", &c, "p", true).unwrap_err().contains("does not have"));
    assert!(resolve("${pvc.name", &c, "p", true).is_err());
    let half = class(&[("csi.storage.k8s.io/provisioner-secret-name", "s")]);
    assert!(secret_of(&half, "provisioner", &c, "p").unwrap_err().contains("without the other"));
    let both = class(&[("csi.storage.k8s.io/provisioner-secret-name", "kek-${pvc.name}"), ("csi.storage.k8s.io/provisioner-secret-namespace", "${pvc.namespace}")]);
    assert_eq!(secret_of(&both, "provisioner", &c, "p").unwrap(), Some(("ns".into(), "kek-data".into())));
    assert_eq!(secret_of(&both, "node-stage", &c, "p").unwrap(), None);
}

fn volume() -> csi::Volume {
    csi::Volume {
        capacity_bytes: 1 << 30,
        volume_id: "vol-1".into(),
        volume_context: [("drivelet.io/drive".to_string(), "d1".to_string())].into_iter().collect(),
        accessible_topology: vec![csi::Topology { segments: here().into_iter().collect() }],
        ..Default::default()
    }
}

#[test]
fn the_pv_is_bound_to_the_claim_pinned_here_protected_and_labelled_for_the_nodes_watches() {
    let k = class(&[
        (FSTYPE, "ext4"),
        ("csi.storage.k8s.io/node-stage-secret-name", "kek-${pvc.name}"),
        ("csi.storage.k8s.io/node-stage-secret-namespace", "${pvc.namespace}"),
        ("csi.storage.k8s.io/provisioner-secret-name", "kek"),
        ("csi.storage.k8s.io/provisioner-secret-namespace", "sys"),
    ]);
    let pv = pv_of(&claim(json!({})), &k, &volume(), &id()).expect("a PV");
    let v = serde_json::to_value(&pv).unwrap();
    assert_eq!(v["metadata"]["name"], "pvc-u-1");
    assert_eq!(v["metadata"]["annotations"][PROVISIONED_BY], DRIVER);
    assert_eq!(v["metadata"]["annotations"][DELETION_SECRET_NAME], "kek");
    assert_eq!(v["metadata"]["annotations"][DELETION_SECRET_NAMESPACE], "sys");
    assert_eq!(v["metadata"]["labels"]["drivelet.io/node"], "node-1");
    assert_eq!(v["metadata"]["finalizers"], json!([PROTECTION_FINALIZER]));
    let spec = &v["spec"];
    assert_eq!(spec["claimRef"]["uid"], "u-1");
    assert_eq!(spec["claimRef"]["name"], "data");
    assert_eq!(spec["capacity"]["storage"], "1Gi");
    assert_eq!(spec["persistentVolumeReclaimPolicy"], "Delete", "the class's default");
    assert_eq!(spec["storageClassName"], "fast");
    assert_eq!(spec["mountOptions"], json!(["noatime"]));
    assert_eq!(spec["accessModes"], json!(["ReadWriteOnce"]));
    assert_eq!(spec["csi"]["volumeHandle"], "vol-1");
    assert_eq!(spec["csi"]["fsType"], "ext4");
    assert_eq!(spec["csi"]["volumeAttributes"]["drivelet.io/drive"], "d1");
    assert_eq!(spec["csi"]["nodeStageSecretRef"], json!({"name": "kek-data", "namespace": "ns"}));
    let term = &spec["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0];
    assert_eq!(term, &json!({"key": "topology.drivelet.io/node", "operator": "In", "values": ["node-1"]}));
    assert_eq!(crate::k8s::resize::our_volume(&pv, &id()).as_deref(), Some("vol-1"), "the node's other queues know it as theirs");

    let block = pv_of(&claim(json!({"spec": {"volumeMode": "Block"}})), &k, &volume(), &id()).unwrap();
    assert_eq!(block.spec.unwrap().csi.unwrap().fs_type, None, "a block PV names no filesystem");
}

fn released(extra: serde_json::Value) -> PersistentVolume {
    let mut pv = serde_json::to_value(pv_of(&claim(json!({})), &class(&[]), &volume(), &id()).unwrap()).unwrap();
    merge(&mut pv, json!({"status": {"phase": "Released"}}));
    merge(&mut pv, extra);
    serde_json::from_value(pv).unwrap()
}

#[test]
fn only_a_released_pv_of_a_delete_class_that_drivelet_provisioned_here_is_deleted() {
    assert_eq!(deletable(&released(json!({})), &id()).as_deref(), Some("vol-1"));
    let cases = [
        (json!({"status": {"phase": "Bound"}}), "still bound"),
        (json!({"status": {"phase": "Available"}}), "Available"),
        (json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}}), "Retain"),
        (json!({"metadata": {"annotations": {PROVISIONED_BY: "other.csi"}}}), "provisioned by another"),
        (json!({"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "topology.drivelet.io/node", "operator": "In", "values": ["node-2"]}]}]}}}}), "another node's"),
    ];
    for (extra, why) in cases {
        assert_eq!(deletable(&released(extra), &id()), None, "{why}");
    }
}

#[test]
fn data_sources_are_a_claim_a_snapshot_or_someone_elses() {
    let with = |ds: TypedLocalObjectReference| {
        let mut c = claim(json!({}));
        c.spec.as_mut().unwrap().data_source = Some(ds);
        c
    };
    let r = |group: Option<&str>, kind: &str| TypedLocalObjectReference { api_group: group.map(String::from), kind: kind.into(), name: "src".into() };
    assert_eq!(data_source(&claim(json!({}))), DataSource::None);
    assert_eq!(data_source(&with(r(None, "PersistentVolumeClaim"))), DataSource::Claim("src".into()));
    assert_eq!(data_source(&with(r(Some("snapshot.storage.k8s.io"), "VolumeSnapshot"))), DataSource::Snapshot("src".into()));
    assert!(matches!(data_source(&with(r(Some("example.com"), "Backup"))), DataSource::Other(_)));
    let mut cross = claim(json!({}));
    cross.spec.as_mut().unwrap().data_source_ref =
        Some(TypedObjectReference { api_group: None, kind: "PersistentVolumeClaim".into(), name: "src".into(), namespace: Some("other".into()) });
    assert!(matches!(data_source(&cross), DataSource::Other(w) if w.contains("namespace other")), "another namespace's claim is not cloned");
}

#[test]
fn allowed_topologies_exclude_or_admit_this_node() {
    let mut k = class(&[]);
    assert!(allowed_here(&k, &here()));
    k.allowed_topologies = Some(vec![serde_json::from_value(json!({"matchLabelExpressions": [{"key": "topology.drivelet.io/node", "values": ["node-2"]}]})).unwrap()]);
    assert!(!allowed_here(&k, &here()));
    k.allowed_topologies.as_mut().unwrap().push(serde_json::from_value(json!({"matchLabelExpressions": [{"key": "topology.drivelet.io/node", "values": ["node-1", "node-3"]}]})).unwrap());
    assert!(allowed_here(&k, &here()));
}

#[test]
fn no_room_hands_the_claim_back_anything_else_retries_here() {
    assert_eq!(failure_of(tonic::Code::ResourceExhausted), Failure::Reschedule);
    for c in [tonic::Code::InvalidArgument, tonic::Code::Unavailable, tonic::Code::NotFound, tonic::Code::Aborted] {
        assert_eq!(failure_of(c), Failure::Retry, "{c:?}");
    }
    let s = tonic::Status::invalid_argument("fstype \"vfat\" is not one drivelet makes");
    assert_eq!(status_words(&s), "InvalidArgument: fstype \"vfat\" is not one drivelet makes");
    let note = failed_note("fast", "node-1", &status_words(&s), Failure::Retry);
    assert!(note.contains("StorageClass fast") && note.contains("node node-1") && note.contains("tries again"), "{note}");
}

/// A volume made for claim `ns/data` (uid `u-1`) whose PV was never written, as the
/// CreateVolume of `request_of` records it.
fn made_unbound() -> crate::actors::volumes::model::VolumeRecord {
    use crate::actors::volumes::model::{VolumeRecord, VolumeState};
    let mut r = VolumeRecord::for_test(1, VolumeState::Available);
    r.id = "vol-1".into();
    r.name = "pvc-u-1".into();
    r.binding = crate::words::Binding { pv: "pvc-u-1".into(), claim_namespace: "ns".into(), claim_name: "data".into(), ..Default::default() };
    r
}

#[test]
fn a_volume_is_taken_for_abandoned_only_when_its_record_says_no_pv_was_ever_written() {
    use crate::actors::volumes::model::VolumeState;
    let want = Abandoned { volume_id: "vol-1".into(), name: "pvc-u-1".into(), claim_uid: "u-1".into(), namespace: "ns".into(), claim: "data".into() };
    assert_eq!(abandoned(&made_unbound()), Some(want));

    let cases: Vec<(&str, Box<dyn Fn(&mut crate::actors::volumes::model::VolumeRecord)>)> = vec![
        ("its claim's uid recorded: its PV was written", Box::new(|r| r.binding.claim_uid = "u-1".into())),
        ("not named for a claim", Box::new(|r| r.name = "backup-1".into())),
        ("named pvc- alone", Box::new(|r| r.name = "pvc-".into())),
        ("made for another PV name", Box::new(|r| r.binding.pv = "pv-other".into())),
        ("no claim named (made by another client)", Box::new(|r| r.binding = Default::default())),
        ("staged", Box::new(|r| r.state = VolumeState::Staged)),
        ("being deleted", Box::new(|r| r.state = VolumeState::Deleting)),
        ("rebuilt from its disk", Box::new(|r| r.rebuilt = true)),
        ("lost with its drive", Box::new(|r| r.lost = true)),
    ];
    for (what, change) in cases {
        let mut r = made_unbound();
        change(&mut r);
        assert_eq!(abandoned(&r), None, "{what}");
    }
}

#[test]
fn the_binding_recorded_after_the_pv_names_the_claim_with_its_uid_and_class() {
    let b = binding_of(&claim(json!({})), "pvc-u-1");
    assert_eq!(
        b,
        crate::words::Binding {
            pv: "pvc-u-1".into(),
            claim_namespace: "ns".into(),
            claim_name: "data".into(),
            claim_uid: "u-1".into(),
            storage_class: "fast".into()
        }
    );
    let mut r = made_unbound();
    r.binding = b;
    assert_eq!(abandoned(&r), None, "once recorded, never taken for abandoned");
}
