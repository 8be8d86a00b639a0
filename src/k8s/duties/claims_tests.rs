//! The claim watch's decisions as tables (which claims wait for what, which node an
//! Immediate claim gets), and its executor against the scripted fake API server (the
//! selected-node write guarded by resourceVersion, the Events, the annotation).

use std::collections::BTreeMap;

use http::Method;
use k8s_openapi::api::core::v1::{
    Node, NodeCondition, NodeStatus, PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
    TypedLocalObjectReference, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::{CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::api::core::v1::{TopologySelectorLabelRequirement, TopologySelectorTerm};
use serde_json::json;

use super::claim_executor::ClaimExecutor;
use super::claims::*;
use super::tests::{pv, DRIVER};
use crate::k8s::fake_api::{fake_api, respond, respond_error};
use crate::k8s::identity::{Identity, REPORTER};
use crate::TOPOLOGY_NODE_KEY;

const GI: u64 = 1 << 30;

fn sc(name: &str, fstype: Option<&str>, mode: &str, allowed: &[&str]) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        provisioner: DRIVER.into(),
        parameters: fstype.map(|f| BTreeMap::from([("csi.storage.k8s.io/fstype".to_string(), f.to_string())])),
        volume_binding_mode: Some(mode.into()),
        allowed_topologies: (!allowed.is_empty()).then(|| {
            vec![TopologySelectorTerm {
                match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                    key: TOPOLOGY_NODE_KEY.into(),
                    values: allowed.iter().map(|s| s.to_string()).collect(),
                }]),
            }]
        }),
        ..Default::default()
    }
}

fn pvc(name: &str, class: &str, gib: u64) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("apps".into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some("7".into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            storage_class_name: Some(class.into()),
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_string(), Quantity(format!("{gib}Gi")))])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: Some(PersistentVolumeClaimStatus { phase: Some("Pending".into()), ..Default::default() }),
    }
}

fn node(name: &str, ready: bool) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(TOPOLOGY_NODE_KEY.to_string(), name.to_string())])),
            ..Default::default()
        },
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn capacity(class: &str, node: &str, free_gib: u64, largest_gib: u64) -> CSIStorageCapacity {
    CSIStorageCapacity {
        metadata: ObjectMeta { name: Some(format!("csisc-{class}-{node}")), ..Default::default() },
        storage_class_name: class.into(),
        node_topology: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(TOPOLOGY_NODE_KEY.to_string(), node.to_string())])),
            ..Default::default()
        }),
        capacity: Some(Quantity(format!("{}", free_gib * GI))),
        maximum_volume_size: Some(Quantity(format!("{}", largest_gib * GI))),
    }
}

/// Three nodes: n1 (4 GiB free, 4 largest), n2 (10 free, 3 largest), n3 (20 free, NotReady).
fn cluster(classes: Vec<StorageClass>, claims: Vec<PersistentVolumeClaim>) -> ClaimsObserved {
    let mut capacities = Vec::new();
    for c in &classes {
        let name = c.metadata.name.clone().unwrap();
        capacities.push(capacity(&name, "n1", 4, 4));
        capacities.push(capacity(&name, "n2", 10, 3));
        capacities.push(capacity(&name, "n3", 20, 20));
    }
    ClaimsObserved {
        claims,
        classes,
        nodes: vec![node("n1", true), node("n2", true), node("n3", false)],
        capacities,
        volumes: vec![],
        now: None,
    }
}

fn decision(obs: &ClaimsObserved, claim: &str) -> Option<ClaimDecision> {
    plan_claims(obs, DRIVER).into_iter().find(|a| a.name == claim).map(|a| a.decision)
}

#[track_caller]
fn refused(d: Option<ClaimDecision>, reason: &str, parts: &[&str]) -> Refusal {
    match d {
        Some(ClaimDecision::Refuse(r)) => {
            assert_eq!(r.reason, reason, "{r:?}");
            for p in parts {
                assert!(r.message.contains(p), "{p:?} not in {:?}", r.message);
            }
            r
        }
        other => panic!("expected a refusal {reason}, got {other:?}"),
    }
}

#[test]
fn a_claim_of_a_vfat_class_is_warned_naming_the_filesystem_and_what_drivelet_makes_whatever_its_binding() {
    for mode in ["WaitForFirstConsumer", "Immediate"] {
        let obs = cluster(vec![sc("vfat", Some("vfat"), mode, &[])], vec![pvc("data", "vfat", 1)]);
        let r = refused(decision(&obs, "data"), REASON_UNSUPPORTED, &["StorageClass vfat", "\"vfat\"", "ext4 or xfs", "stays Pending"]);
        assert_eq!(r.code, "unsupported");
    }
}

#[test]
fn every_refusal_createvolume_makes_before_looking_at_drives_is_a_warning_in_its_words() {
    let mut bad_media = sc("bad-media", None, "WaitForFirstConsumer", &[]);
    bad_media.parameters = Some(BTreeMap::from([("media".to_string(), "tape".to_string())]));
    let mut bad_layout = sc("bad-layout", None, "WaitForFirstConsumer", &[]);
    bad_layout.parameters = Some(BTreeMap::from([("layout".to_string(), "lvm".to_string())]));
    let mut typo = sc("typo", None, "WaitForFirstConsumer", &[]);
    typo.parameters = Some(BTreeMap::from([("mediaa".to_string(), "ssd".to_string())]));
    let ok = sc("ok", Some("xfs"), "WaitForFirstConsumer", &[]);
    let mut rwx = pvc("shared", "ok", 1);
    rwx.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteMany".into()]);
    let obs = cluster(
        vec![bad_media, bad_layout, typo, ok],
        vec![pvc("a", "bad-media", 1), pvc("b", "bad-layout", 1), pvc("c", "typo", 1), rwx, pvc("fine", "ok", 1)],
    );
    refused(decision(&obs, "a"), REASON_UNSUPPORTED, &["\"media\" is \"tape\"", "hdd, ssd, nvme, virtual, any"]);
    refused(decision(&obs, "b"), REASON_UNSUPPORTED, &["\"layout\" is \"lvm\"", "partition or drive"]);
    refused(decision(&obs, "c"), REASON_UNSUPPORTED, &["unknown parameter \"mediaa\""]);
    refused(decision(&obs, "shared"), REASON_UNSUPPORTED, &["ReadWriteMany", "one node's drive"]);
    assert_eq!(decision(&obs, "fine"), None, "a WaitForFirstConsumer claim drivelet serves is the scheduler's");
}

#[test]
fn a_refusal_is_warned_once_per_cause_and_bound_deleted_or_foreign_claims_are_left_alone() {
    let class = sc("vfat", Some("vfat"), "Immediate", &[]);
    let mut warned = pvc("warned", "vfat", 1);
    warned.metadata.annotations = Some(BTreeMap::from([(WAITING.to_string(), "unsupported".to_string())]));
    let mut other_cause = pvc("other-cause", "vfat", 1);
    other_cause.metadata.annotations = Some(BTreeMap::from([(WAITING.to_string(), "no-room".to_string())]));
    let mut bound = pvc("bound", "vfat", 1);
    bound.spec.as_mut().unwrap().volume_name = Some("pv-1".into());
    bound.status.as_mut().unwrap().phase = Some("Bound".into());
    let mut deleting = pvc("deleting", "vfat", 1);
    deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap(),
    ));
    let mut foreign_class = sc("foreign", Some("vfat"), "Immediate", &[]);
    foreign_class.provisioner = "other.csi.io".into();
    let obs = cluster(
        vec![class, foreign_class],
        vec![warned, other_cause, bound, deleting, pvc("foreign", "foreign", 1), pvc("no-class", "absent", 1)],
    );
    let planned: Vec<String> = plan_claims(&obs, DRIVER).into_iter().map(|a| a.name).collect();
    assert_eq!(planned, vec!["other-cause"]);
}

#[test]
fn an_immediate_claim_goes_to_the_allowed_ready_node_with_the_most_room_that_can_hold_it() {
    // (allowed nodes, size GiB) -> node, or the refusal's parts.
    let cases: &[(&[&str], u64, Result<&str, &[&str]>)] = &[
        (&["n1"], 1, Ok("n1")),
        (&["n1", "n2"], 1, Ok("n2")),                                   // n2 has the most free
        (&["n1", "n2"], 4, Ok("n1")),                                   // n2's largest extent is 3 GiB
        (&[], 2, Ok("n2")),                                             // no topologies: any node, most room
        (&["n3"], 1, Err(&["n3 is not Ready"])),
        (&["n1", "n2"], 5, Err(&["none of them can take 5.0 GiB now", "n1 can make at most 4.0 GiB", "n2 can make at most 3.0 GiB"])),
        (&["node-9"], 1, Err(&["no such node exists", "topology.drivelet.io/node in (node-9)"])),
    ];
    for (allowed, size, want) in cases {
        let obs = cluster(vec![sc("now", Some("ext4"), "Immediate", allowed)], vec![pvc("data", "now", *size)]);
        match (decision(&obs, "data"), want) {
            (Some(ClaimDecision::Select { node, why }), Ok(want)) => {
                assert_eq!(&node, want, "{allowed:?} {size} GiB");
                assert!(why.contains("binds immediately") && why.contains(&format!("on {want}")), "{why}");
            }
            (d, Err(parts)) => {
                refused(d, REASON_NO_NODE, parts);
            }
            (d, Ok(want)) => panic!("{allowed:?} {size} GiB: expected {want}, got {d:?}"),
        }
    }
}

#[test]
fn an_immediate_claim_with_a_node_selected_or_a_waiting_class_gets_no_node_from_drivelet() {
    let mut selected = pvc("selected", "now", 1);
    selected.metadata.annotations = Some(BTreeMap::from([(SELECTED_NODE.to_string(), "n1".to_string())]));
    let obs = cluster(
        vec![sc("now", None, "Immediate", &["n1"]), sc("later", None, "WaitForFirstConsumer", &["n1"])],
        vec![selected, pvc("later", "later", 1)],
    );
    assert!(plan_claims(&obs, DRIVER).is_empty());
}

#[test]
fn an_immediate_clone_goes_to_its_sources_node_and_a_restore_is_refused_in_words() {
    let mut clone = pvc("clone", "now", 1);
    clone.spec.as_mut().unwrap().data_source =
        Some(TypedLocalObjectReference { kind: "PersistentVolumeClaim".into(), name: "src".into(), api_group: None });
    let mut restore = pvc("restore", "now", 1);
    restore.spec.as_mut().unwrap().data_source = Some(TypedLocalObjectReference {
        kind: "VolumeSnapshot".into(),
        name: "snap".into(),
        api_group: Some("snapshot.storage.k8s.io".into()),
    });
    let mut orphan = pvc("orphan", "now", 1);
    orphan.spec.as_mut().unwrap().data_source =
        Some(TypedLocalObjectReference { kind: "PersistentVolumeClaim".into(), name: "nowhere".into(), api_group: None });
    let mut obs = cluster(vec![sc("now", None, "Immediate", &[])], vec![clone, restore, orphan]);
    obs.volumes = vec![pv("pv-src", "n1", "Bound", "Delete", &[], Some(("apps", "src")))];
    match decision(&obs, "clone") {
        Some(ClaimDecision::Select { node, why }) => {
            assert_eq!(node, "n1", "the source's node, though n2 has more room");
            assert!(why.contains("clones"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    refused(decision(&obs, "restore"), REASON_NO_NODE, &["VolumeSnapshot", "WaitForFirstConsumer"]);
    refused(decision(&obs, "orphan"), REASON_NO_NODE, &["clones claim nowhere"]);
}

#[test]
fn a_new_class_whose_room_a_running_agent_has_not_published_yet_waits_without_a_warning() {
    let mut obs = cluster(vec![sc("now", None, "Immediate", &["n1"])], vec![pvc("data", "now", 1)]);
    let made = k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap();
    obs.classes[0].metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(made));
    obs.now = Some(made + std::time::Duration::from_secs(30));
    // n1 publishes another class, not this new one yet.
    obs.capacities = vec![capacity("older", "n1", 4, 4)];
    assert_eq!(decision(&obs, "data"), None);
    // Still not after a minute: something there does not publish this class.
    obs.now = Some(made + std::time::Duration::from_secs(61));
    refused(decision(&obs, "data"), REASON_NO_NODE, &["n1 publishes no storage capacity", "--capacity-for-immediate-binding=true"]);
    // Nothing published by n1 at all: said at once.
    obs.now = Some(made + std::time::Duration::from_secs(1));
    obs.capacities.clear();
    refused(decision(&obs, "data"), REASON_NO_NODE, &["n1 publishes no storage capacity (its drivelet runs with kubernetes.capacity off"]);
}

#[tokio::test]
async fn a_selected_node_is_written_guarded_by_resource_version_then_a_normal_event_and_a_refusal_warns_then_annotates() {
    let (client, mut api) = fake_api();
    let executor = ClaimExecutor::new(client, Identity { driver: DRIVER.into(), node: "n1".into() }, "drivelet-system".into());
    let obs = cluster(
        vec![sc("now", None, "Immediate", &["n1"]), sc("vfat", Some("vfat"), "WaitForFirstConsumer", &[])],
        vec![pvc("data", "now", 1), pvc("fat", "vfat", 1)],
    );
    let actions = plan_claims(&obs, DRIVER);
    assert_eq!(actions.len(), 2);
    let server = tokio::spawn(async move {
        let (patch, reply) = api.expect_path(Method::PATCH, "/api/v1/namespaces/apps/persistentvolumeclaims/data").await;
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        assert_eq!(patch["metadata"]["annotations"][SELECTED_NODE], "n1");
        assert!(patch["metadata"]["annotations"][WAITING].is_null());
        respond(reply, &pvc("data", "now", 1));
        let (event, reply) = api.expect_path(Method::POST, "/apis/events.k8s.io/v1/namespaces/apps/events").await;
        assert_eq!((event["type"].as_str(), event["reason"].as_str()), (Some("Normal"), Some(REASON_SELECTED)));
        assert_eq!(event["reportingController"], REPORTER);
        assert!(event["note"].as_str().unwrap().contains("on n1"), "{event}");
        respond(reply, &event);
        // The refusal: the claim read, the Warning, then the annotation.
        let (_, reply) = api.expect_path(Method::GET, "/api/v1/namespaces/apps/persistentvolumeclaims/fat").await;
        respond(reply, &pvc("fat", "vfat", 1));
        let (event, reply) = api.expect_path(Method::POST, "/apis/events.k8s.io/v1/namespaces/apps/events").await;
        assert_eq!((event["type"].as_str(), event["reason"].as_str()), (Some("Warning"), Some(REASON_UNSUPPORTED)));
        assert_eq!(event["regarding"]["name"], "fat");
        assert_eq!(event["regarding"]["uid"], "uid-fat");
        assert!(event["note"].as_str().unwrap().contains("\"vfat\""), "{event}");
        respond(reply, &event);
        let (patch, reply) = api.expect_path(Method::PATCH, "/api/v1/namespaces/apps/persistentvolumeclaims/fat").await;
        assert_eq!(patch, json!({"metadata": {"annotations": {WAITING: "unsupported"}}}));
        respond(reply, &pvc("fat", "vfat", 1));
        // A claim changed meanwhile: the guarded write conflicts and nothing else happens.
        let (_, reply) = api.expect_path(Method::PATCH, "/api/v1/namespaces/apps/persistentvolumeclaims/data").await;
        respond_error(reply, 409, "the object has been modified");
        api
    });
    for a in actions.iter().chain(actions.iter().take(1)) {
        executor.apply(a).await.unwrap();
    }
    server.await.unwrap().assert_no_more_requests("after the claims");
}

#[test]
fn an_immediate_claim_is_placed_by_the_capacity_objects_the_agents_write() {
    use crate::k8s::capacity::{node_owner, object, object_name, Me, Room, Wanted};
    // The objects as k8s::capacity writes them (binary-suffixed quantities, the node's
    // segments with a key of its own), not the sidecar's.
    let written = |node: &str, free_gib: u64, largest_gib: u64| {
        let me = Me {
            driver: DRIVER.into(),
            node: node.into(),
            namespace: "drivelet-system".into(),
            segments: BTreeMap::from([(TOPOLOGY_NODE_KEY.to_string(), node.to_string()), ("example.com/rack".into(), "r1".into())]),
        };
        let w = Wanted {
            name: object_name(node, "now", &me.segments),
            class: "now".into(),
            room: Room { available: free_gib * GI, maximum: largest_gib * GI },
        };
        object(&me, &w, &node_owner(node, "uid"))
    };
    let mut obs = cluster(vec![sc("now", None, "Immediate", &[])], vec![pvc("data", "now", 5)]);
    obs.capacities = vec![written("n1", 8, 6), written("n2", 30, 4)];
    match decision(&obs, "data") {
        Some(ClaimDecision::Select { node, why }) => {
            assert_eq!(node, "n1", "n2 has more free, but cannot make 5 GiB in one piece");
            assert!(why.contains("8.0 GiB free"), "the room read from the quantity 8Gi: {why}");
        }
        other => panic!("{other:?}"),
    }
}
