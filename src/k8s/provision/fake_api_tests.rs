//! The ProvisionQueue against the fake API server (`crate::k8s::fake_api`, serving
//! Events): the node's claim and PV lists served, every other request checked in order.
//! Time is paused.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::Actor;
use http::Method;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Client;
use serde_json::{json, Value};
use tonic::Status;

use super::*;
use crate::grpc::proto::csi;
use crate::k8s::fake_api::{fake_api_serving_events, list_of, respond, respond_error, respond_not_found, FakeApi, Script};
use crate::k8s::identity::Identity;
use crate::k8s::provision::{Abandoned, PROTECTION_FINALIZER, SELECTED_NODE, STORAGE_PROVISIONER};
use crate::k8s::shell::{Ready, RetryPolicy, WatchItem};

const DRIVER: &str = "csi.drivelet.io";

fn cfg() -> QueueConfig {
    QueueConfig {
        identity: Identity { driver: DRIVER.into(), node: "node-1".into() },
        policy: RetryPolicy { base: Duration::from_secs(1), cap: Duration::from_secs(60), terminal: Duration::from_secs(600) },
        resync: Duration::ZERO,
    }
}

fn topology() -> std::collections::BTreeMap<String, String> {
    [("topology.drivelet.io/node".to_string(), "node-1".to_string())].into()
}

fn claim() -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": "data", "namespace": "ns", "uid": "u-1", "resourceVersion": "7",
            "labels": {"drivelet.io/node": "node-1"},
            "annotations": {STORAGE_PROVISIONER: DRIVER, SELECTED_NODE: "node-1"}},
        "spec": {"storageClassName": "fast", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Pending"}
    }))
    .unwrap()
}

fn class() -> Value {
    json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "fast"}, "provisioner": DRIVER,
        "parameters": {"media": "virtual"}, "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer"})
}

fn fake_api(claims: Vec<&PersistentVolumeClaim>, pvs: Vec<&PersistentVolume>) -> (Client, FakeApi) {
    let script = |kind: &str, items: Vec<Value>| Script { lists: [list_of(kind, "v1", "1", items)].into(), ..Default::default() };
    fake_api_serving_events(vec![
        ("/api/v1/persistentvolumeclaims", script("PersistentVolumeClaim", claims.iter().map(|c| json!(c)).collect())),
        ("/api/v1/persistentvolumes", script("PersistentVolume", pvs.iter().map(|v| json!(v)).collect())),
    ])
}

/// The CSI controller service, scripted.
#[derive(Clone, Default)]
struct FakeBackend {
    creates: Arc<Mutex<VecDeque<Result<csi::Volume, Status>>>>,
    asked: Arc<Mutex<Vec<csi::CreateVolumeRequest>>>,
    deleted: Arc<Mutex<Vec<String>>>,
    bound: Arc<Mutex<Vec<(String, crate::words::Binding)>>>,
    abandoned: Arc<Mutex<Vec<Abandoned>>>,
    /// Volumes still published to a node.
    attached: Arc<Mutex<Vec<String>>>,
}

impl Ready for FakeBackend {
    async fn wait_ready(&self) {}
}

impl ProvisionBackend for FakeBackend {
    async fn create(&self, req: csi::CreateVolumeRequest) -> Result<csi::Volume, Status> {
        self.asked.lock().unwrap().push(req);
        self.creates.lock().unwrap().pop_front().expect("an answer for every CreateVolume")
    }
    async fn delete(&self, volume_id: &str) -> Result<(), Status> {
        self.deleted.lock().unwrap().push(volume_id.to_string());
        Ok(())
    }
    async fn bind(&self, volume_id: &str, binding: crate::words::Binding) -> Result<(), Status> {
        self.bound.lock().unwrap().push((volume_id.to_string(), binding));
        Ok(())
    }
    fn attached(&self, volume_id: &str) -> bool {
        self.attached.lock().unwrap().iter().any(|v| v == volume_id)
    }
    fn abandoned(&self) -> Vec<Abandoned> {
        self.abandoned.lock().unwrap().clone()
    }
}

fn volume() -> csi::Volume {
    csi::Volume {
        capacity_bytes: 1 << 30,
        volume_id: "vol-1".into(),
        accessible_topology: vec![csi::Topology { segments: topology().into_iter().collect() }],
        ..Default::default()
    }
}

/// The queue started on the one waiting claim, its CreateVolumes answered by `answers`.
fn start_on_claim(answers: Vec<Result<csi::Volume, Status>>) -> (FakeApi, FakeBackend, actix::Addr<ProvisionQueue<FakeBackend>>) {
    let c = claim();
    let (client, api) = fake_api(vec![&c], vec![]);
    let backend = FakeBackend::default();
    backend.creates.lock().unwrap().extend(answers);
    let queue = ProvisionQueue::new(client, cfg(), backend.clone(), topology()).start();
    (api, backend, queue)
}

/// The claim's StorageClass read, answered.
async fn answer_class(api: &mut FakeApi) {
    let (_, reply) = api.expect_path(Method::GET, "/apis/storage.k8s.io/v1/storageclasses/fast").await;
    respond(reply, &class());
}

#[actix_rt::test]
async fn a_claim_scheduled_here_gets_its_volume_and_a_pv_bound_to_it() {
    tokio::time::pause();
    let (mut api, backend, _queue) = start_on_claim(vec![Ok(volume())]);

    answer_class(&mut api).await;
    let (body, reply) = api.expect_path(Method::POST, "/api/v1/persistentvolumes").await;
    assert_eq!(body["metadata"]["name"], "pvc-u-1");
    assert_eq!(body["spec"]["claimRef"]["uid"], "u-1");
    assert_eq!(body["spec"]["csi"]["volumeHandle"], "vol-1");
    assert_eq!(body["metadata"]["finalizers"], json!([PROTECTION_FINALIZER]));
    respond(reply, &body);
    api.assert_quiet().await;

    let asked = backend.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].name, "pvc-u-1");
    assert_eq!(asked[0].parameters.get("media").map(String::as_str), Some("virtual"));
    assert_eq!(api.event_reasons(), ["ProvisioningSucceeded"]);
    let bound = backend.bound.lock().unwrap().clone();
    assert_eq!(bound.len(), 1, "the claim's uid recorded with the volume once its PV is written");
    assert_eq!((bound[0].0.as_str(), bound[0].1.claim_uid.as_str(), bound[0].1.pv.as_str()), ("vol-1", "u-1", "pvc-u-1"));
}

#[actix_rt::test]
async fn a_pv_written_already_for_the_claim_counts_as_made() {
    tokio::time::pause();
    let (mut api, _backend, _queue) = start_on_claim(vec![Ok(volume())]);
    answer_class(&mut api).await;
    let (body, reply) = api.expect_path(Method::POST, "/api/v1/persistentvolumes").await;
    respond_error(reply, 409, "persistentvolumes \"pvc-u-1\" already exists");
    let (_, reply) = api.expect_path(Method::GET, "/api/v1/persistentvolumes/pvc-u-1").await;
    respond(reply, &body);
    api.assert_quiet().await;
    assert_eq!(api.event_reasons(), ["ProvisioningSucceeded"]);
}

#[actix_rt::test]
async fn no_room_here_is_one_warning_and_the_claim_goes_back_to_the_scheduler() {
    tokio::time::pause();
    let c = claim();
    let (mut api, _backend, _queue) = start_on_claim(vec![Err(Status::resource_exhausted("no drive has 1.0 GiB free"))]);
    answer_class(&mut api).await;
    let (body, reply) = api.expect_path(Method::PATCH, "/api/v1/namespaces/ns/persistentvolumeclaims/data").await;
    assert_eq!(body, json!({"metadata": {"resourceVersion": "7", "annotations": {SELECTED_NODE: null}}}));
    respond(reply, &c);
    api.assert_quiet().await;
    let events = api.events();
    assert_eq!(api.event_reasons(), ["ProvisioningFailed"]);
    let note = events[0]["note"].as_str().unwrap_or_default();
    assert!(note.contains("ResourceExhausted: no drive has 1.0 GiB free") && note.contains("back to the scheduler"), "{note}");
}

#[actix_rt::test]
async fn a_refusal_is_told_once_however_often_it_is_retried() {
    tokio::time::pause();
    let c = claim();
    let (mut api, backend, queue) = start_on_claim((0..3).map(|_| Err(Status::invalid_argument("fstype \"vfat\" is not ext4 or xfs"))).collect());
    for _ in 0..3 {
        answer_class(&mut api).await;
    }
    // The third refusal told (or not) before the claim is deleted: no more retries.
    while backend.asked.lock().unwrap().len() < 3 {
        tokio::task::yield_now().await;
    }
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    queue.do_send(WatchItem::First(Ok(kube::runtime::watcher::Event::Delete(c.clone()))));
    api.assert_quiet().await;
    assert_eq!(backend.asked.lock().unwrap().len(), 3, "retried with backoff");
    assert_eq!(api.event_reasons(), ["ProvisioningFailed"], "one Warning for the three refusals: {:?}", api.events());
}

fn released(phase: &str, policy: &str) -> PersistentVolume {
    let k: k8s_openapi::api::storage::v1::StorageClass = serde_json::from_value(class()).unwrap();
    let mut pv = crate::k8s::provision::pv_of(&claim(), &k, &volume(), &cfg().identity).unwrap();
    pv.metadata.resource_version = Some("11".into());
    pv.metadata.finalizers = Some(vec!["kubernetes.io/pv-protection".into(), PROTECTION_FINALIZER.into()]);
    pv.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some(policy.into());
    pv.status = Some(k8s_openapi::api::core::v1::PersistentVolumeStatus { phase: Some(phase.into()), ..Default::default() });
    pv
}

#[actix_rt::test]
async fn a_released_pv_of_a_delete_class_loses_its_volume_then_its_finalizer_then_itself() {
    tokio::time::pause();
    let pv = released("Released", "Delete");
    let kept = released("Released", "Retain");
    let mut kept = kept;
    kept.metadata.name = Some("pvc-u-2".into());
    let (client, mut api) = fake_api(vec![], vec![&pv, &kept]);
    let backend = FakeBackend::default();
    let _queue = ProvisionQueue::new(client, cfg(), backend.clone(), topology()).start();
    let (_, reply) = api.expect_path(Method::GET, "/api/v1/namespaces/ns/persistentvolumeclaims/data").await;
    respond_not_found(reply, "persistentvolumeclaims \"data\" not found");
    let (body, reply) = api.expect_path(Method::PATCH, "/api/v1/persistentvolumes/pvc-u-1").await;
    assert_eq!(body, json!({"metadata": {"resourceVersion": "11", "finalizers": ["kubernetes.io/pv-protection"]}}));
    respond(reply, &pv);
    let (_, reply) = api.expect_path(Method::DELETE, "/api/v1/persistentvolumes/pvc-u-1").await;
    respond(reply, &pv);
    api.assert_quiet().await;
    assert_eq!(*backend.deleted.lock().unwrap(), ["vol-1"], "the Retain PV's volume is kept");
}

#[actix_rt::test]
async fn a_released_pv_whose_claim_is_back_with_its_uid_is_not_deleted() {
    tokio::time::pause();
    let pv = released("Released", "Delete");
    let (client, mut api) = fake_api(vec![], vec![&pv]);
    let backend = FakeBackend::default();
    let _queue = ProvisionQueue::new(client, cfg(), backend.clone(), topology()).start();
    let (_, reply) = api.expect_path(Method::GET, "/api/v1/namespaces/ns/persistentvolumeclaims/data").await;
    respond(reply, &claim());
    api.assert_quiet().await;
    assert!(backend.deleted.lock().unwrap().is_empty(), "a PV still bound is never deleted");
}

fn abandoned_volume() -> Abandoned {
    Abandoned { volume_id: "vol-1".into(), name: "pvc-u-1".into(), claim_uid: "u-1".into(), namespace: "ns".into(), claim: "data".into() }
}

/// The queue started on no claim and no PV, its volume side holding one volume whose PV
/// was never written.
fn start_with_abandoned() -> (FakeApi, FakeBackend, actix::Addr<ProvisionQueue<FakeBackend>>) {
    let (client, api) = fake_api(vec![], vec![]);
    let backend = FakeBackend::default();
    backend.abandoned.lock().unwrap().push(abandoned_volume());
    let queue = ProvisionQueue::new(client, cfg(), backend.clone(), topology()).start();
    (api, backend, queue)
}

#[actix_rt::test]
async fn a_volume_whose_claim_went_before_its_pv_was_written_is_deleted_once_the_api_says_both_are_gone() {
    tokio::time::pause();
    let (mut api, backend, _queue) = start_with_abandoned();
    let (_, reply) = api.expect_path(Method::GET, "/api/v1/persistentvolumes/pvc-u-1").await;
    respond_not_found(reply, "persistentvolumes \"pvc-u-1\" not found");
    let (_, reply) = api.expect_path(Method::GET, "/api/v1/namespaces/ns/persistentvolumeclaims/data").await;
    let mut another = claim();
    another.metadata.uid = Some("u-2".into());
    respond(reply, &another);
    api.assert_quiet().await;
    assert_eq!(*backend.deleted.lock().unwrap(), ["vol-1"], "a claim of the same name with another uid is another claim");
}

#[actix_rt::test]
async fn a_volume_whose_pv_or_claim_is_there_is_never_taken_for_abandoned() {
    tokio::time::pause();
    // Its PV exists (written by a sidecar beside this agent, or a moment ago).
    let (mut api, backend, _queue) = start_with_abandoned();
    let (_, reply) = api.expect_path(Method::GET, "/api/v1/persistentvolumes/pvc-u-1").await;
    respond(reply, &released("Bound", "Delete"));
    api.assert_quiet().await;
    assert!(backend.deleted.lock().unwrap().is_empty(), "a volume with a PV is the reclaim policy's");

    // Its claim is there with its uid (its provisioning goes on).
    let (mut api, backend, _queue) = start_with_abandoned();
    let (_, reply) = api.expect_path(Method::GET, "/api/v1/persistentvolumes/pvc-u-1").await;
    respond_not_found(reply, "persistentvolumes \"pvc-u-1\" not found");
    let (_, reply) = api.expect_path(Method::GET, "/api/v1/namespaces/ns/persistentvolumeclaims/data").await;
    respond(reply, &claim());
    api.assert_quiet().await;
    assert!(backend.deleted.lock().unwrap().is_empty(), "the claim is there");
}

#[actix_rt::test]
async fn an_unanswered_read_keeps_the_volume_and_is_retried() {
    tokio::time::pause();
    let (mut api, backend, _queue) = start_with_abandoned();
    let (_, reply) = api.expect_path(Method::GET, "/api/v1/persistentvolumes/pvc-u-1").await;
    respond_error(reply, 500, "etcd is slow");
    assert!(backend.deleted.lock().unwrap().is_empty());
    // Retried after the backoff: this time both are gone.
    let (_, reply) = api.expect_path(Method::GET, "/api/v1/persistentvolumes/pvc-u-1").await;
    respond_not_found(reply, "persistentvolumes \"pvc-u-1\" not found");
    let (_, reply) = api.expect_path(Method::GET, "/api/v1/namespaces/ns/persistentvolumeclaims/data").await;
    respond_not_found(reply, "persistentvolumeclaims \"data\" not found");
    api.assert_quiet().await;
    assert_eq!(*backend.deleted.lock().unwrap(), ["vol-1"]);
}

#[actix_rt::test]
async fn a_released_pv_whose_volume_is_still_attached_waits_for_the_detach_then_is_deleted() {
    tokio::time::pause();
    let pv = released("Released", "Delete");
    let (client, mut api) = fake_api(vec![], vec![&pv]);
    let backend = FakeBackend::default();
    backend.attached.lock().unwrap().push("vol-1".into());
    let _queue = ProvisionQueue::new(client, cfg(), backend.clone(), topology()).start();
    let (_, reply) = api.expect_path(Method::GET, "/api/v1/namespaces/ns/persistentvolumeclaims/data").await;
    respond_not_found(reply, "persistentvolumeclaims \"data\" not found");
    // Still attached: no DeleteVolume; asked again at the base delay, not a growing backoff.
    let (_, reply) = api.expect_path(Method::GET, "/api/v1/namespaces/ns/persistentvolumeclaims/data").await;
    assert!(backend.deleted.lock().unwrap().is_empty(), "no DeleteVolume while attached");
    backend.attached.lock().unwrap().clear();
    respond_not_found(reply, "persistentvolumeclaims \"data\" not found");
    let (_, reply) = api.expect_path(Method::PATCH, "/api/v1/persistentvolumes/pvc-u-1").await;
    respond(reply, &pv);
    let (_, reply) = api.expect_path(Method::DELETE, "/api/v1/persistentvolumes/pvc-u-1").await;
    respond(reply, &pv);
    api.assert_quiet().await;
    assert_eq!(*backend.deleted.lock().unwrap(), ["vol-1"]);
}
