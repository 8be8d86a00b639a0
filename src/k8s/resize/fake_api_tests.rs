//! The ResizeQueue against the fake API server (`crate::k8s::fake_api`, serving Events):
//! lists are served from a script, watches held open, Events answered and recorded; every
//! other request goes to the test, which checks it and answers it in order. Time is paused.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use http::Method;
use serde_json::{json, Value};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::runtime::watcher::Event;
use kube::Client;

use actix::Actor;

use super::*;
use crate::k8s::shell::RetryPolicy;
use crate::k8s::resize::backend::ResizeBackend;
use crate::k8s::resize::executor;
use crate::k8s::resize::Failure;
use crate::actors::volumes::VolumeError;
use crate::k8s::shell::{Ready, WatchItem};
use crate::k8s::fake_api::{fake_api_serving_events, list_of, respond, FakeApi, Script};
use crate::k8s::KubeError;
use crate::k8s::resize::tests::{identity, pv, pv_on, pvc, with_state};
use crate::k8s::resize::{CONTROLLER_IN_PROGRESS, FS_RESIZE_PENDING, NODE_PENDING};

/// A fake API server serving the claim and PV lists (watches held open) and recording
/// the Events; every other request goes to the test.
fn fake_api(pvcs: Vec<&PersistentVolumeClaim>, pvs: Vec<&PersistentVolume>) -> (Client, FakeApi) {
    let script = |kind: &str, items: Vec<Value>| Script { lists: [list_of(kind, "v1", "1", items)].into(), ..Default::default() };
    fake_api_serving_events(vec![
        ("/api/v1/persistentvolumeclaims", script("PersistentVolumeClaim", pvcs.iter().map(|c| json!(c)).collect())),
        ("/api/v1/persistentvolumes", script("PersistentVolume", pvs.iter().map(|v| json!(v)).collect())),
    ])
}

/// The volume manager, scripted: knows `vol-1`, answers expansions from a list.
#[derive(Clone, Default)]
struct FakeBackend {
    answers: Arc<Mutex<VecDeque<Result<(u64, bool), (Failure, KubeError)>>>>,
    asked: Arc<Mutex<Vec<u64>>>,
}

impl ResizeBackend for FakeBackend {
    async fn known(&self, volume_id: &str) -> Result<bool, KubeError> {
        Ok(volume_id == "vol-1")
    }
    async fn expand(&self, _: &str, bytes: u64) -> Result<(u64, bool), (Failure, KubeError)> {
        self.asked.lock().expect("asked").push(bytes);
        self.answers.lock().expect("answers").pop_front().expect("an answer for every expansion")
    }
}

impl Ready for FakeBackend {
    async fn wait_ready(&self) {}
}

fn config() -> QueueConfig {
    QueueConfig {
        identity: identity(),
        policy: RetryPolicy { base: Duration::from_secs(1), cap: Duration::from_secs(60), terminal: Duration::from_secs(600) },
        resync: Duration::ZERO,
    }
}

/// The condition of a kind in a status patch.
fn condition(patch: &Value, kind: &str) -> Value {
    let list = patch["status"]["conditions"].as_array().cloned().unwrap_or_default();
    list.into_iter().find(|c| c["type"] == kind).unwrap_or(Value::Null)
}

const STATUS: &str = "/api/v1/namespaces/ns/persistentvolumeclaims/data/status";
const PV: &str = "/api/v1/persistentvolumes/pv-1";
const GI: u64 = 1 << 30;

#[actix_rt::test]
async fn a_claim_asking_for_more_grows_its_volume_and_waits_for_kubelet() {
    tokio::time::pause();
    let claim = pvc("2Gi", "1Gi");
    let mut elsewhere = pvc("5Gi", "1Gi");
    elsewhere.metadata.name = Some("other".into());
    elsewhere.spec.as_mut().unwrap().volume_name = Some("pv-2".into());
    let other_node = pv_on("node-b", "pv-2", "vol-2", "1Gi", "other");
    let (client, mut api) = fake_api(vec![&claim, &elsewhere], vec![&pv("1Gi"), &other_node]);
    let backend = FakeBackend::default();
    backend.answers.lock().unwrap().push_back(Ok((2 * GI, true)));
    let queue = ResizeQueue::new(client, config(), backend.clone()).start();

    let (body, reply) = api.expect_path(Method::PATCH, STATUS).await;
    assert_eq!(body["metadata"]["resourceVersion"], "9", "guarded by the claim's version");
    assert_eq!(body["status"]["allocatedResources"], json!({"storage": "2Gi"}));
    assert_eq!(body["status"]["allocatedResourceStatuses"], json!({"storage": CONTROLLER_IN_PROGRESS}));
    respond(reply, &with_state(claim.clone(), Some("2Gi"), Some(CONTROLLER_IN_PROGRESS)));
    let (body, reply) = api.expect_path(Method::PATCH, PV).await;
    assert_eq!(body, json!({"spec": {"capacity": {"storage": "2Gi"}}}));
    respond(reply, &pv("2Gi"));
    let (body, reply) = api.expect_path(Method::PATCH, STATUS).await;
    assert_eq!(body["status"]["allocatedResourceStatuses"], json!({"storage": NODE_PENDING}));
    assert_eq!(condition(&body, FS_RESIZE_PENDING)["status"], "True", "FileSystemResizePending: {body}");
    respond(reply, &with_state(claim.clone(), Some("2Gi"), Some(NODE_PENDING)));

    api.assert_quiet().await;
    assert_eq!(*backend.asked.lock().unwrap(), [2 * GI], "another node's claim is not touched");
    assert_eq!(api.event_reasons(), ["Resizing", "FileSystemResizeRequired"]);
    let stats = queue.send(GetResizeStats::default()).await.expect("answers");
    assert_eq!((stats.claims, stats.waiting, stats.running, stats.retries), (1, 0, 0, 0));
}

#[actix_rt::test]
async fn an_infeasible_size_is_recorded_once_and_a_lowered_request_recovers() {
    tokio::time::pause();
    let claim = pvc("100Gi", "1Gi");
    let (client, mut api) = fake_api(vec![&claim], vec![&pv("1Gi")]);
    let backend = FakeBackend::default();
    backend.answers.lock().unwrap().push_back(Err((Failure::Infeasible, KubeError::volume("vol-1")(VolumeError::OutOfRange { reason: "the drive ends there".into() }))));
    backend.answers.lock().unwrap().push_back(Ok(((3 * GI) / 2, false)));
    let queue = ResizeQueue::new(client, config(), backend.clone()).start();

    let (_, reply) = api.expect_path(Method::PATCH, STATUS).await;
    respond(reply, &with_state(claim.clone(), Some("100Gi"), Some(CONTROLLER_IN_PROGRESS)));
    let (body, reply) = api.expect_path(Method::PATCH, STATUS).await;
    assert!(body["metadata"].is_null(), "a failure is recorded without a version guard: {body}");
    assert_eq!(body["status"]["allocatedResourceStatuses"], json!({"storage": "ControllerResizeInfeasible"}));
    let message = condition(&body, "ControllerResizeError")["message"].as_str().unwrap_or("").to_string();
    assert!(message.contains("100.0 GiB") && message.contains("the drive ends there"), "{message}");
    let infeasible = with_state(claim.clone(), Some("100Gi"), Some("ControllerResizeInfeasible"));
    respond(reply, &infeasible);
    api.assert_quiet().await;
    assert_eq!(api.event_reasons(), ["Resizing", "VolumeResizeFailed"]);

    // The user lowers the request to 1.5Gi (more than status.capacity): grown at once.
    let mut lowered = infeasible.clone();
    lowered.spec.as_mut().unwrap().resources.as_mut().unwrap().requests =
        Some([(crate::k8s::resize::STORAGE.to_string(), k8s_openapi::apimachinery::pkg::api::resource::Quantity("1536Mi".into()))].into());
    queue.do_send(WatchItem::First(Ok(Event::Apply(lowered.clone()))));
    let (body, reply) = api.expect_path(Method::PATCH, STATUS).await;
    assert_eq!(body["status"]["allocatedResources"], json!({"storage": "1536Mi"}));
    assert_eq!(body["status"]["conditions"].as_array().map(Vec::len), Some(1), "the error condition goes");
    respond(reply, &with_state(lowered.clone(), Some("1536Mi"), Some(CONTROLLER_IN_PROGRESS)));
    let (body, reply) = api.expect_path(Method::PATCH, PV).await;
    assert_eq!(body, json!({"spec": {"capacity": {"storage": "1536Mi"}}}));
    respond(reply, &pv("1536Mi"));
    // A block volume (no node step) is finished here.
    let (body, reply) = api.expect_path(Method::PATCH, STATUS).await;
    assert_eq!(body["status"]["capacity"], json!({"storage": "1536Mi"}));
    assert_eq!(body["status"]["allocatedResourceStatuses"], json!({"storage": null}));
    respond(reply, &lowered);
    api.assert_quiet().await;
    assert_eq!(*backend.asked.lock().unwrap(), [100 * GI, (3 * GI) / 2], "the infeasible size was asked once");
    assert_eq!(api.event_reasons(), ["Resizing", "VolumeResizeFailed", "Resizing", "VolumeResizeSuccessful"]);
}

/// The claim `c` carrying the annotation of a growth to `bytes` deferred.
fn deferred_to(mut c: PersistentVolumeClaim, bytes: u64) -> PersistentVolumeClaim {
    c.metadata.annotations.get_or_insert_with(Default::default).insert(executor::DEFERRED.into(), bytes.to_string());
    c
}

const CLAIM: &str = "/api/v1/namespaces/ns/persistentvolumeclaims/data";

/// A growth refused as `GrowsWhenUnused`.
fn deferred() -> Result<(u64, bool), (Failure, KubeError)> {
    let e = VolumeError::GrowsWhenUnused { volume_id: "vol-1".into(), size: 2 * GI, drive_id: "d2".into(), why: "it is staged at /s".into() };
    Err((Failure::Deferred, KubeError::volume("vol-1")(e)))
}

/// Answers a run's in-progress status patch with `claim` in progress, checking that a
/// deferral writes no failure.
async fn in_progress(api: &mut FakeApi, claim: &PersistentVolumeClaim) {
    let (body, reply) = api.expect_path(Method::PATCH, STATUS).await;
    assert_eq!(body["status"]["allocatedResources"], json!({"storage": "2Gi"}), "{body}");
    assert!(body["status"]["conditions"].as_array().is_some_and(|c| c.iter().all(|c| c["type"] != "ControllerResizeError")), "a deferral is no failure: {body}");
    respond(reply, &with_state(claim.clone(), Some("2Gi"), Some(CONTROLLER_IN_PROGRESS)));
}

/// The end of a growth that waited: the claim's annotation goes, the PV grows, the
/// node's step is asked for.
async fn grows_after_waiting(api: &mut FakeApi, claim: &PersistentVolumeClaim) {
    let (body, reply) = api.expect_path(Method::PATCH, CLAIM).await;
    assert_eq!(body, json!({"metadata": {"annotations": {executor::DEFERRED: null}}}), "the waiting claim's annotation goes once it grows");
    respond(reply, &with_state(claim.clone(), Some("2Gi"), Some(CONTROLLER_IN_PROGRESS)));
    let (_, reply) = api.expect_path(Method::PATCH, PV).await;
    respond(reply, &pv("2Gi"));
    let (body, reply) = api.expect_path(Method::PATCH, STATUS).await;
    assert_eq!(body["status"]["allocatedResourceStatuses"], json!({"storage": NODE_PENDING}));
    respond(reply, &with_state(claim.clone(), Some("2Gi"), Some(NODE_PENDING)));
}

#[actix_rt::test]
async fn a_growth_deferred_until_the_volume_is_unused_is_told_once_and_happens_at_a_retry() {
    tokio::time::pause();
    let claim = pvc("2Gi", "1Gi");
    let annotated = deferred_to(claim.clone(), 2 * GI);
    let (client, mut api) = fake_api(vec![&claim], vec![&pv("1Gi")]);
    let backend = FakeBackend::default();
    backend.answers.lock().unwrap().extend([deferred(), deferred(), Ok((2 * GI, true))]);
    let _queue = ResizeQueue::new(client, config(), backend.clone()).start();

    // Three runs: each marks the claim in progress. The first deferred one annotates the
    // claim with the size it was told of; the second writes nothing else.
    in_progress(&mut api, &claim).await;
    let (body, reply) = api.expect_path(Method::PATCH, CLAIM).await;
    assert_eq!(body, json!({"metadata": {"annotations": {executor::DEFERRED: (2 * GI).to_string()}}}));
    respond(reply, &with_state(annotated.clone(), Some("2Gi"), Some(CONTROLLER_IN_PROGRESS)));
    in_progress(&mut api, &annotated).await;
    in_progress(&mut api, &annotated).await;
    grows_after_waiting(&mut api, &claim).await;
    api.assert_quiet().await;
    assert_eq!(*backend.asked.lock().unwrap(), [2 * GI, 2 * GI, 2 * GI]);
    assert_eq!(api.event_reasons(), ["Resizing", "VolumeResizeDeferred", "FileSystemResizeRequired"], "one Event while it waits, not one per retry");
    let note = api.events().iter().find(|e| e["reason"] == "VolumeResizeDeferred").and_then(|e| e["note"].as_str().map(str::to_string)).unwrap_or_default();
    assert!(note.contains("grows to 2.0 GiB once no pod uses it") && note.contains("staged at /s"), "{note}");
}

#[actix_rt::test]
async fn a_claim_told_before_a_restart_that_its_growth_waits_is_not_told_again() {
    tokio::time::pause();
    // The claim as a drivelet before this one left it: told its growth to 2 GiB waits.
    let claim = deferred_to(with_state(pvc("2Gi", "1Gi"), Some("2Gi"), Some(CONTROLLER_IN_PROGRESS)), 2 * GI);
    let (client, mut api) = fake_api(vec![&claim], vec![&pv("1Gi")]);
    let backend = FakeBackend::default();
    backend.answers.lock().unwrap().extend([deferred(), Ok((2 * GI, true))]);
    let _queue = ResizeQueue::new(client, config(), backend.clone()).start();

    in_progress(&mut api, &claim).await;
    in_progress(&mut api, &claim).await;
    grows_after_waiting(&mut api, &pvc("2Gi", "1Gi")).await;
    api.assert_quiet().await;
    assert_eq!(*backend.asked.lock().unwrap(), [2 * GI, 2 * GI]);
    assert_eq!(api.event_reasons(), ["FileSystemResizeRequired"], "no second Resizing or VolumeResizeDeferred Event after a restart");
}
