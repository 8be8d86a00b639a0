//! The capacity loop against the fake API server (`crate::k8s::fake_api`): the
//! StorageClass list and watch are served from a script; every other request goes to
//! the test, which checks it and answers it in order. Time is paused.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Method;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{json, Value};
use tokio::sync::Notify;

use super::backend::CapacityBackend;
use super::tests::{me, room, storage_class, DRIVER, NODE};
use super::*;
use crate::k8s::fake_api::{fake_api_serving, list_of, respond, respond_error, FakeApi, Script};
use crate::k8s::shell::RetryPolicy;

const CLASSES: &str = "/apis/storage.k8s.io/v1/storageclasses";
const OBJECTS: &str = "/apis/storage.k8s.io/v1/namespaces/drivelet-system/csistoragecapacities";

/// The volume side, scripted: each class's room by its `media` parameter; `set` changes
/// one and says so, as a new view does.
#[derive(Clone, Default)]
struct FakeRooms {
    rooms: Arc<Mutex<BTreeMap<String, Answer>>>,
    changes: Arc<Notify>,
}

impl FakeRooms {
    fn set(&self, media: &str, answer: Answer) {
        self.rooms.lock().expect("rooms").insert(media.into(), answer);
        self.changes.notify_one();
    }
}

impl CapacityBackend for FakeRooms {
    fn answer(&self, parameters: &BTreeMap<String, String>) -> Answer {
        let media = parameters.get("media").cloned().unwrap_or_default();
        self.rooms.lock().expect("rooms").get(&media).cloned().unwrap_or(Answer::NotReady)
    }

    async fn changed(&mut self) -> bool {
        self.changes.notified().await;
        true
    }
}

fn policy() -> RetryPolicy {
    RetryPolicy { base: Duration::from_secs(1), cap: Duration::from_secs(8), ..Default::default() }
}

/// A fake API server listing `classes`, then answering one watch with `events`.
fn api_with(classes: Vec<Value>, events: Vec<Value>) -> (kube::Client, FakeApi) {
    let script = Script {
        lists: [list_of("StorageClass", "storage.k8s.io/v1", "5", classes)].into(),
        watches: if events.is_empty() { Default::default() } else { [events].into() },
    };
    fake_api_serving(vec![(CLASSES, script)])
}

fn sc(name: &str, provisioner: &str, media: &str) -> Value {
    json!(storage_class(name, provisioner, media))
}

/// The query of a request, decoded.
fn query(uri: &str) -> String {
    uri.split_once('?').map_or("", |(_, q)| q).trim_start_matches('&').replace("%2F", "/").replace("%3D", "=").replace("%2C", ",")
}

/// Answers the Node read.
async fn node_read(api: &mut FakeApi) {
    let (_, reply) = api.expect_path(Method::GET, "/api/v1/nodes/node-1").await;
    let node = Node { metadata: ObjectMeta { name: Some(NODE.into()), uid: Some("uid-1".into()), ..Default::default() }, ..Default::default() };
    respond(reply, &node);
}

/// Answers the list of this node's own objects with `items`.
async fn own_list(api: &mut FakeApi, items: Vec<Value>) {
    let call = api.next("this node's objects listed").await;
    assert_eq!((&call.method, call.path()), (&Method::GET, OBJECTS));
    assert_eq!(
        query(&call.uri),
        "labelSelector=drivelet.io/node=node-1,csi.storage.k8s.io/managed-by=drivelet&resourceVersion=0&resourceVersionMatch=NotOlderThan",
        "by the node's label, from the watch cache"
    );
    respond(call.reply, &list_of("CSIStorageCapacity", "storage.k8s.io/v1", "7", items));
}

/// Answers the list of the sidecar's objects with `names`, and their deletes.
async fn sidecar_cleared(api: &mut FakeApi, names: &[&str]) {
    let call = api.next("the sidecar's objects listed").await;
    assert_eq!((&call.method, call.path()), (&Method::GET, OBJECTS));
    assert_eq!(
        query(&call.uri),
        "labelSelector=csi.storage.k8s.io/drivername=csi.drivelet.io,csi.storage.k8s.io/managed-by=external-provisioner-node-1&resourceVersion=0&resourceVersionMatch=NotOlderThan"
    );
    let items = names.iter().map(|n| json!({"metadata": {"name": n, "namespace": "drivelet-system"}, "storageClassName": "fast"})).collect();
    respond(call.reply, &list_of("CSIStorageCapacity", "storage.k8s.io/v1", "7", items));
    for n in names {
        let (_, reply) = api.expect_path(Method::DELETE, &format!("{OBJECTS}/{n}")).await;
        respond(reply, &json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}));
    }
}

fn name_of(class: &str) -> String {
    object_name(NODE, class, &me().segments)
}

/// Answers a create of `class`'s object, checking its room, and returns its body.
async fn created(api: &mut FakeApi, class: &str, capacity: &str, maximum: &str) -> Value {
    let (body, reply) = api.expect_path(Method::POST, OBJECTS).await;
    assert_eq!(body["metadata"]["name"], json!(name_of(class)));
    assert_eq!((&body["storageClassName"], &body["capacity"], &body["maximumVolumeSize"]), (&json!(class), &json!(capacity), &json!(maximum)));
    respond(reply, &body);
    body
}

async fn start(classes: Vec<Value>, events: Vec<Value>, rooms: &FakeRooms) -> (FakeApi, tokio::task::JoinHandle<()>) {
    let (client, api) = api_with(classes, events);
    let task = tokio::spawn(controller::run(client, me(), rooms.clone(), policy()));
    (api, task)
}

#[tokio::test(start_paused = true)]
async fn at_start_each_class_of_the_driver_gets_its_object_then_the_sidecars_are_deleted_once_and_a_change_patches_only_its_room() {
    let rooms = FakeRooms::default();
    rooms.set("ssd", Answer::Room(room(10, 4)));
    rooms.set("hdd", Answer::Room(room(100, 50)));
    let classes = vec![sc("fast", DRIVER, "ssd"), sc("big", DRIVER, "hdd"), sc("theirs", "ebs.csi.aws.com", "ssd")];
    let (mut api, task) = start(classes, vec![], &rooms).await;

    node_read(&mut api).await;
    own_list(&mut api, vec![]).await;
    // In name order (the names are hashes): whichever comes first, both are created.
    let mut made = BTreeMap::new();
    for _ in 0..2 {
        let (body, reply) = api.expect_path(Method::POST, OBJECTS).await;
        respond(reply, &body);
        made.insert(body["storageClassName"].as_str().unwrap_or("").to_string(), body);
    }
    assert_eq!(made.keys().collect::<Vec<_>>(), ["big", "fast"], "one object per class of this driver, none for another's");
    let class_list = api.requests().into_iter().find(|r| r.starts_with(&format!("GET {CLASSES}?"))).expect("the classes listed");
    assert!(class_list.contains("resourceVersion=0") && !class_list.contains("limit="), "from the watch cache: {class_list}");
    let fast = &made["fast"];
    assert_eq!(fast["metadata"]["name"], json!(name_of("fast")));
    assert_eq!((&fast["capacity"], &fast["maximumVolumeSize"]), (&json!("10Gi"), &json!("4Gi")));
    assert_eq!(fast["metadata"]["labels"]["csi.storage.k8s.io/managed-by"], "drivelet");
    assert_eq!(fast["metadata"]["ownerReferences"][0], json!({"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "uid-1"}));
    assert_eq!(fast["nodeTopology"]["matchLabels"], json!(me().segments));
    sidecar_cleared(&mut api, &["csisc-abcde"]).await;
    api.assert_quiet().await;

    // A volume made on the ssd: one patch of that class's room, nothing else (no relist,
    // no Node read, no sidecar list again).
    rooms.set("ssd", Answer::Room(room(8, 2)));
    let (body, reply) = api.expect_path(Method::PATCH, &format!("{OBJECTS}/{}", name_of("fast"))).await;
    assert_eq!(body, json!({"capacity": "8Gi", "maximumVolumeSize": "2Gi"}));
    respond(reply, &json!({}));
    api.assert_quiet().await;

    // A view change that leaves every room as it was writes nothing.
    rooms.set("hdd", Answer::Room(room(100, 50)));
    api.assert_quiet().await;
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn objects_that_already_say_the_room_are_not_written_and_one_of_a_class_gone_is_deleted() {
    let rooms = FakeRooms::default();
    rooms.set("ssd", Answer::Room(room(10, 4)));
    let w = Wanted { name: name_of("fast"), class: "fast".into(), room: room(10, 4) };
    let current = json!(object(&me(), &w, &node_owner(NODE, "uid-1")));
    let stale = json!(object(&me(), &Wanted { name: name_of("old"), class: "old".into(), room: room(1, 1) }, &node_owner(NODE, "uid-1")));
    let (mut api, task) = start(vec![sc("fast", DRIVER, "ssd")], vec![], &rooms).await;

    node_read(&mut api).await;
    own_list(&mut api, vec![current, stale]).await;
    let (_, reply) = api.expect_path(Method::DELETE, &format!("{OBJECTS}/{}", name_of("old"))).await;
    respond(reply, &json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}));
    sidecar_cleared(&mut api, &[]).await;
    api.assert_quiet().await;
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_class_deleted_from_the_cluster_deletes_its_object() {
    let rooms = FakeRooms::default();
    rooms.set("ssd", Answer::Room(room(10, 4)));
    let mut gone = storage_class("fast", DRIVER, "ssd");
    gone.metadata.resource_version = Some("6".into());
    let events = vec![json!({"type": "DELETED", "object": gone})];
    let (mut api, task) = start(vec![sc("fast", DRIVER, "ssd")], events, &rooms).await;

    node_read(&mut api).await;
    own_list(&mut api, vec![]).await;
    created(&mut api, "fast", "10Gi", "4Gi").await;
    sidecar_cleared(&mut api, &[]).await;
    let (_, reply) = api.expect_path(Method::DELETE, &format!("{OBJECTS}/{}", name_of("fast"))).await;
    respond(reply, &json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}));
    api.assert_quiet().await;
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_failed_write_is_retried_after_the_backoff_from_a_new_list() {
    let rooms = FakeRooms::default();
    rooms.set("ssd", Answer::Room(room(10, 4)));
    let (mut api, task) = start(vec![sc("fast", DRIVER, "ssd")], vec![], &rooms).await;

    node_read(&mut api).await;
    own_list(&mut api, vec![]).await;
    let (_, reply) = api.expect_path(Method::POST, OBJECTS).await;
    respond_error(reply, 503, "the API server is unavailable");
    assert!(api.is_quiet(), "nothing before the backoff");
    // After the backoff: listed again (the Node is not read again), then created.
    own_list(&mut api, vec![]).await;
    created(&mut api, "fast", "10Gi", "4Gi").await;
    sidecar_cleared(&mut api, &[]).await;
    api.assert_quiet().await;
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn a_create_that_finds_its_object_there_patches_it_and_nothing_is_written_before_the_view_is_ready() {
    let rooms = FakeRooms::default();
    let (mut api, task) = start(vec![sc("fast", DRIVER, "ssd")], vec![], &rooms).await;
    api.assert_quiet().await;

    rooms.set("ssd", Answer::Room(room(10, 4)));
    node_read(&mut api).await;
    own_list(&mut api, vec![]).await;
    let (_, reply) = api.expect_path(Method::POST, OBJECTS).await;
    let exists = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": "already exists", "reason": "AlreadyExists", "code": 409});
    reply.send_response(http::Response::builder().status(409).body(kube::client::Body::from(serde_json::to_vec(&exists).expect("json"))).expect("response"));
    let (body, reply) = api.expect_path(Method::PATCH, &format!("{OBJECTS}/{}", name_of("fast"))).await;
    assert_eq!(body, json!({"capacity": "10Gi", "maximumVolumeSize": "4Gi"}));
    respond(reply, &json!({}));
    sidecar_cleared(&mut api, &[]).await;
    api.assert_quiet().await;
    task.abort();
}
