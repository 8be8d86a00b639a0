//! The capacity objects' decisions: which classes, the objects wanted, the writes.

use std::collections::BTreeMap;

use k8s_openapi::api::storage::v1::{CSIStorageCapacity, StorageClass};
use k8s_openapi::api::core::v1::{TopologySelectorLabelRequirement, TopologySelectorTerm};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

use super::backend::answer_of;
use super::*;
use crate::grpc::proto::csi;

pub(super) const DRIVER: &str = "csi.drivelet.io";
pub(super) const NODE: &str = "node-1";
pub(super) const GIB: u64 = 1 << 30;

pub(super) fn me() -> Me {
    Me {
        driver: DRIVER.into(),
        node: NODE.into(),
        namespace: "drivelet-system".into(),
        segments: [(crate::TOPOLOGY_NODE_KEY.to_string(), NODE.to_string()), ("example.com/rack".to_string(), "r7".to_string())].into(),
    }
}

/// A StorageClass `name` of `provisioner` with `media` as its one parameter.
pub(super) fn storage_class(name: &str, provisioner: &str, media: &str) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta { name: Some(name.into()), resource_version: Some("1".into()), ..Default::default() },
        provisioner: provisioner.into(),
        parameters: Some([("media".to_string(), media.to_string())].into()),
        volume_binding_mode: Some("WaitForFirstConsumer".into()),
        ..Default::default()
    }
}

pub(super) fn room(available_gib: u64, maximum_gib: u64) -> Room {
    Room { available: available_gib * GIB, maximum: maximum_gib * GIB }
}

fn classes(scs: &[StorageClass]) -> BTreeMap<String, Class> {
    scs.iter().filter_map(|sc| class_of(sc, DRIVER)).map(|c| (c.name.clone(), c)).collect()
}

/// The room of a class by its `media` parameter: ssd 10/4 GiB, hdd 100/50 GiB.
fn by_media(c: &Class) -> Answer {
    match c.parameters.get("media").map(String::as_str) {
        Some("ssd") => Answer::Room(room(10, 4)),
        Some("hdd") => Answer::Room(room(100, 50)),
        _ => Answer::Refused("parameter media: unknown".into()),
    }
}

fn name_of(class: &str) -> String {
    object_name(NODE, class, &me().segments)
}

fn wanted_of(class: &str, r: Room) -> Wanted {
    Wanted { name: name_of(class), class: class.into(), room: r }
}

fn listed(class: &str, r: Room) -> (String, Listed) {
    (name_of(class), Listed { class: class.into(), topology: me().segments, available: Some(r.available), maximum: Some(r.maximum) })
}

#[test]
fn one_object_is_wanted_per_class_of_this_driver_with_its_room() {
    let all = classes(&[storage_class("fast", DRIVER, "ssd"), storage_class("big", DRIVER, "hdd"), storage_class("other", "ebs.csi.aws.com", "ssd")]);
    let Decided { objects: wanted, refused } = wanted(&me(), &all, by_media).expect("ready");
    let want: BTreeMap<String, Wanted> =
        [wanted_of("fast", room(10, 4)), wanted_of("big", room(100, 50))].into_iter().map(|w| (w.name.clone(), w)).collect();
    assert_eq!(wanted, want);
    assert!(refused.is_empty());
}

#[test]
fn nothing_is_decided_while_the_volume_manager_is_not_ready() {
    let all = classes(&[storage_class("fast", DRIVER, "ssd")]);
    assert_eq!(wanted(&me(), &all, |_| Answer::NotReady), None);
}

#[test]
fn a_class_getcapacity_refuses_has_no_room_and_the_refusal_is_said() {
    let all = classes(&[storage_class("odd", DRIVER, "tape")]);
    let Decided { objects: wanted, refused } = wanted(&me(), &all, by_media).expect("ready");
    assert_eq!(wanted.values().cloned().collect::<Vec<_>>(), vec![wanted_of("odd", room(0, 0))]);
    assert_eq!(refused, vec![("odd".to_string(), "parameter media: unknown".to_string())]);
}

#[test]
fn a_class_whose_allowed_topologies_exclude_this_node_has_no_object_but_unknown_keys_are_not_judged() {
    let term = |key: &str, values: &[&str]| TopologySelectorTerm {
        match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
            key: key.into(),
            values: values.iter().map(|v| v.to_string()).collect(),
        }]),
    };
    let with = |name: &str, terms: Vec<TopologySelectorTerm>| StorageClass { allowed_topologies: Some(terms), ..storage_class(name, DRIVER, "ssd") };
    let all = classes(&[
        with("elsewhere", vec![term(crate::TOPOLOGY_NODE_KEY, &["node-2"])]),
        with("here", vec![term(crate::TOPOLOGY_NODE_KEY, &["node-2"]), term(crate::TOPOLOGY_NODE_KEY, &["node-1"])]),
        with("zoned", vec![term("topology.kubernetes.io/zone", &["z1"])]),
        with("other-rack", vec![term("example.com/rack", &["r8"])]),
    ]);
    let wanted = wanted(&me(), &all, by_media).expect("ready").objects;
    let classes: Vec<&str> = wanted.values().map(|w| w.class.as_str()).collect();
    assert_eq!(classes.len(), 2);
    assert!(classes.contains(&"here") && classes.contains(&"zoned"), "{classes:?}");
}

#[test]
fn missing_objects_are_created_and_nothing_is_written_when_nothing_changed() {
    let wanted: BTreeMap<String, Wanted> =
        [wanted_of("fast", room(10, 4)), wanted_of("big", room(100, 50))].into_iter().map(|w| (w.name.clone(), w)).collect();
    let writes = plan(&me(), &wanted, &BTreeMap::new());
    assert_eq!(writes.len(), 2);
    assert!(writes.iter().all(|w| matches!(w, Write::Create(_))));
    let same: BTreeMap<String, Listed> = [listed("fast", room(10, 4)), listed("big", room(100, 50))].into();
    assert_eq!(plan(&me(), &wanted, &same), vec![], "the same room writes nothing");
}

#[test]
fn only_the_objects_whose_room_changed_are_patched() {
    let wanted: BTreeMap<String, Wanted> =
        [wanted_of("fast", room(8, 2)), wanted_of("big", room(100, 50))].into_iter().map(|w| (w.name.clone(), w)).collect();
    let before: BTreeMap<String, Listed> = [listed("fast", room(10, 4)), listed("big", room(100, 50))].into();
    assert_eq!(plan(&me(), &wanted, &before), vec![Write::Patch(wanted_of("fast", room(8, 2)))]);
    let only_max: BTreeMap<String, Wanted> =
        [wanted_of("fast", Room { available: 10 * GIB, maximum: 3 * GIB })].into_iter().map(|w| (w.name.clone(), w)).collect();
    let before: BTreeMap<String, Listed> = [listed("fast", room(10, 4))].into();
    assert_eq!(plan(&me(), &only_max, &before).len(), 1, "a change of the maximum alone is written");
}

#[test]
fn a_class_removed_or_no_longer_this_drivers_deletes_its_object() {
    let wanted: BTreeMap<String, Wanted> = [wanted_of("fast", room(10, 4))].into_iter().map(|w| (w.name.clone(), w)).collect();
    let before: BTreeMap<String, Listed> = [listed("fast", room(10, 4)), listed("gone", room(1, 1))].into();
    assert_eq!(plan(&me(), &wanted, &before), vec![Write::Delete(name_of("gone"))]);
    // A class that changed provisioner is not this driver's: no object is wanted for it.
    let all = classes(&[storage_class("fast", "other.csi.io", "ssd")]);
    let none = super::wanted(&me(), &all, by_media).expect("ready").objects;
    assert_eq!(plan(&me(), &none, &[listed("fast", room(10, 4))].into()), vec![Write::Delete(name_of("fast"))]);
}

#[test]
fn an_object_that_does_not_match_its_class_or_topology_is_deleted_then_made_again() {
    let w = wanted_of("fast", room(10, 4));
    let wanted: BTreeMap<String, Wanted> = [(w.name.clone(), w.clone())].into();
    let (name, mut l) = listed("fast", room(10, 4));
    l.topology.insert("example.com/rack".into(), "r6".into());
    assert_eq!(plan(&me(), &wanted, &[(name.clone(), l)].into()), vec![Write::Delete(name), Write::Create(w)]);
}

#[test]
fn a_quantity_spelled_otherwise_is_compared_in_bytes() {
    let w = wanted_of("fast", room(10, 4));
    let mut c = object(&me(), &w, &node_owner(NODE, "uid-1"));
    c.capacity = Some(Quantity(format!("{}", 10 * GIB)));
    c.maximum_volume_size = Some(Quantity("4096Mi".into()));
    let listed: BTreeMap<String, Listed> = [(w.name.clone(), Listed::of(&c))].into();
    assert_eq!(plan(&me(), &[(w.name.clone(), w)].into(), &listed), vec![]);
}

#[test]
fn the_object_is_labelled_for_this_node_and_driver_matches_its_segments_and_is_owned_by_the_node() {
    let w = wanted_of("fast", room(10, 4));
    let c: CSIStorageCapacity = object(&me(), &w, &node_owner(NODE, "uid-1"));
    assert_eq!(
        serde_json::to_value(&c).expect("serializes"),
        json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity",
            "metadata": {
                "name": w.name, "namespace": "drivelet-system",
                "labels": {"csi.storage.k8s.io/drivername": DRIVER, "csi.storage.k8s.io/managed-by": "drivelet", "drivelet.io/node": NODE},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "uid-1"}],
            },
            "storageClassName": "fast",
            "nodeTopology": {"matchLabels": {"topology.drivelet.io/node": NODE, "example.com/rack": "r7"}},
            "capacity": "10Gi",
            "maximumVolumeSize": "4Gi",
        })
    );
    assert_eq!(own_selector(&me()), "drivelet.io/node=node-1,csi.storage.k8s.io/managed-by=drivelet");
    assert_eq!(room_patch(&w), json!({"capacity": "10Gi", "maximumVolumeSize": "4Gi"}));
}

#[test]
fn a_long_node_name_gets_a_valid_node_label_and_every_name_is_a_stable_dns_name() {
    let long = format!("node-{}", "x".repeat(80));
    let m = Me { node: long.clone(), ..me() };
    let label = &labels(&m)[NODE_LABEL];
    assert!(label.len() <= 63 && *label != long, "{label}");
    assert_eq!(own_selector(&m), format!("{NODE_LABEL}={label},csi.storage.k8s.io/managed-by=drivelet"));
    let segs = me().segments;
    let a = object_name(&long, "Fast_Class.with.ODD name", &segs);
    assert_eq!(a, object_name(&long, "Fast_Class.with.ODD name", &segs), "the same on every call");
    assert!(a.len() == 25 && a.starts_with("drivelet-") && a[9..].chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{a}");
    assert_ne!(object_name(NODE, "a", &segs), object_name(NODE, "b", &segs));
    assert_ne!(object_name("node-1", "a", &segs), object_name("node-2", "a", &segs));
    let mut moved = segs.clone();
    moved.insert("example.com/rack".into(), "r8".into());
    assert_ne!(object_name(NODE, "a", &segs), object_name(NODE, "a", &moved), "other segments: another object");
}

#[test]
fn the_sidecars_managed_by_value_is_the_external_provisioners_for_every_node_name_length() {
    // The cases of external-provisioner's TestGetNameWithMaxLength.
    let a = |n: usize| format!("node{}", "a".repeat(n));
    assert_eq!(sidecar_managed_by("node01"), "external-provisioner-node01");
    assert_eq!(sidecar_managed_by(&a(38)), format!("external-provisioner-{}", a(38)));
    assert_eq!(sidecar_managed_by(&a(39)), format!("external-p-53f40b57-{}", a(39)));
    assert_eq!(sidecar_managed_by(&a(48)), format!("e-53f40b57-{}", a(48)));
    assert_eq!(sidecar_managed_by(&a(49)), "external-provisioner-a3607ff1");
    assert_eq!(sidecar_managed_by(&a(63)), "external-provisioner-df38e37f");
    assert_eq!(sidecar_selector(&me()), "csi.storage.k8s.io/drivername=csi.drivelet.io,csi.storage.k8s.io/managed-by=external-provisioner-node-1");
}

#[test]
fn getcapacity_unavailable_is_not_ready_and_any_other_refusal_is_the_classs() {
    let ok = csi::GetCapacityResponse { available_capacity: 10 * GIB as i64, maximum_volume_size: Some(4 * GIB as i64), minimum_volume_size: Some(1) };
    assert_eq!(answer_of(Ok(ok)), Answer::Room(room(10, 4)));
    assert_eq!(answer_of(Err(tonic::Status::unavailable("the volume manager is starting"))), Answer::NotReady);
    assert_eq!(answer_of(Err(tonic::Status::invalid_argument("media: unknown value tape"))), Answer::Refused("media: unknown value tape".into()));
}
