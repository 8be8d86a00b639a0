//! The ResizeQueue against a fake API server (`tower_test::mock::pair`): lists are
//! served from a script, watches held open, Events answered and recorded; every other
//! request goes to the test, which checks it and answers it in order. Time is paused.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use http::{Method, Request, Response};
use kube::client::Body;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tower_test::mock::{self, SendResponse};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::runtime::watcher::Event;
use kube::Client;

use actix::Actor;

use super::*;
use crate::k8s::attach::RetryPolicy;
use crate::k8s::resize::backend::ResizeBackend;
use crate::k8s::resize::Failure;
use crate::actors::volumes::VolumeError;
use crate::k8s::shell::{Ready, WatchItem};
use crate::k8s::KubeError;
use crate::k8s::resize::tests::{identity, pv, pv_on, pvc, with_state};
use crate::k8s::resize::{CONTROLLER_IN_PROGRESS, FS_RESIZE_PENDING, NODE_PENDING};

type Reply = SendResponse<Response<Body>>;

struct FakeApi {
    calls: mpsc::UnboundedReceiver<(Method, String, Value, Reply)>,
    /// Reasons of the Events recorded, in order.
    events: Arc<Mutex<Vec<String>>>,
}

fn ok(reply: Reply, body: &impl serde::Serialize) {
    let bytes = serde_json::to_vec(body).expect("serializes");
    reply.send_response(Response::builder().body(Body::from(bytes)).expect("response"));
}

fn fake_api(pvcs: Vec<&PersistentVolumeClaim>, pvs: Vec<&PersistentVolume>) -> (Client, FakeApi) {
    let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let (tx, calls) = mpsc::unbounded_channel();
    let events = Arc::new(Mutex::new(Vec::new()));
    let log = events.clone();
    let list = |kind: &str, items: Vec<Value>| {
        json!({"apiVersion": "v1", "kind": format!("{kind}List"), "metadata": {"resourceVersion": "1"}, "items": items})
    };
    let mut lists: VecDeque<(&str, Value)> = VecDeque::from([
        ("/api/v1/persistentvolumeclaims", list("PersistentVolumeClaim", pvcs.iter().map(|c| json!(c)).collect())),
        ("/api/v1/persistentvolumes", list("PersistentVolume", pvs.iter().map(|v| json!(v)).collect())),
    ]);
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some((request, reply)) = handle.next_request().await {
            let uri = request.uri().to_string();
            let path = request.uri().path().to_string();
            let method = request.method().clone();
            if method == Method::GET && uri.contains("watch=true") {
                held.push(reply);
                continue;
            }
            if method == Method::GET {
                let i = lists.iter().position(|(p, _)| *p == path).expect("one list per resource");
                let (_, body) = lists.remove(i).expect("listed");
                ok(reply, &body);
                continue;
            }
            let bytes = request.into_body().collect_bytes().await.expect("body");
            let body: Value = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).expect("JSON body") };
            if path.contains("/events") {
                log.lock().expect("log").push(body["reason"].as_str().unwrap_or("").to_string());
                ok(reply, &body);
                continue;
            }
            tx.send((method, path, body, reply)).expect("the test listens");
        }
    });
    (Client::new(service, "default"), FakeApi { calls, events })
}

impl FakeApi {
    async fn expect(&mut self, method: Method, path: &str) -> (Value, Reply) {
        let (m, p, body, reply) = tokio::time::timeout(Duration::from_secs(3600), self.calls.recv())
            .await
            .expect("a request within the hour")
            .expect("the server runs");
        assert_eq!((m, p.as_str()), (method, path));
        (body, reply)
    }

    async fn assert_quiet(&mut self) {
        tokio::time::sleep(Duration::from_secs(30)).await;
        if let Ok((m, p, ..)) = self.calls.try_recv() {
            panic!("unexpected {m} {p}");
        }
    }

    fn events(&self) -> Vec<String> {
        self.events.lock().expect("log").clone()
    }
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

    let (body, reply) = api.expect(Method::PATCH, STATUS).await;
    assert_eq!(body["metadata"]["resourceVersion"], "9", "guarded by the claim's version");
    assert_eq!(body["status"]["allocatedResources"], json!({"storage": "2Gi"}));
    assert_eq!(body["status"]["allocatedResourceStatuses"], json!({"storage": CONTROLLER_IN_PROGRESS}));
    ok(reply, &with_state(claim.clone(), Some("2Gi"), Some(CONTROLLER_IN_PROGRESS)));
    let (body, reply) = api.expect(Method::PATCH, PV).await;
    assert_eq!(body, json!({"spec": {"capacity": {"storage": "2Gi"}}}));
    ok(reply, &pv("2Gi"));
    let (body, reply) = api.expect(Method::PATCH, STATUS).await;
    assert_eq!(body["status"]["allocatedResourceStatuses"], json!({"storage": NODE_PENDING}));
    assert_eq!(condition(&body, FS_RESIZE_PENDING)["status"], "True", "FileSystemResizePending: {body}");
    ok(reply, &with_state(claim.clone(), Some("2Gi"), Some(NODE_PENDING)));

    api.assert_quiet().await;
    assert_eq!(*backend.asked.lock().unwrap(), [2 * GI], "another node's claim is not touched");
    assert_eq!(api.events(), ["Resizing", "FileSystemResizeRequired"]);
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

    let (_, reply) = api.expect(Method::PATCH, STATUS).await;
    ok(reply, &with_state(claim.clone(), Some("100Gi"), Some(CONTROLLER_IN_PROGRESS)));
    let (body, reply) = api.expect(Method::PATCH, STATUS).await;
    assert!(body["metadata"].is_null(), "a failure is recorded without a version guard: {body}");
    assert_eq!(body["status"]["allocatedResourceStatuses"], json!({"storage": "ControllerResizeInfeasible"}));
    let message = condition(&body, "ControllerResizeError")["message"].as_str().unwrap_or("").to_string();
    assert!(message.contains("100.0 GiB") && message.contains("the drive ends there"), "{message}");
    let infeasible = with_state(claim.clone(), Some("100Gi"), Some("ControllerResizeInfeasible"));
    ok(reply, &infeasible);
    api.assert_quiet().await;
    assert_eq!(api.events(), ["Resizing", "VolumeResizeFailed"]);

    // The user lowers the request to 1.5Gi (more than status.capacity): grown at once.
    let mut lowered = infeasible.clone();
    lowered.spec.as_mut().unwrap().resources.as_mut().unwrap().requests =
        Some([(crate::k8s::resize::STORAGE.to_string(), k8s_openapi::apimachinery::pkg::api::resource::Quantity("1536Mi".into()))].into());
    queue.do_send(WatchItem::First(Ok(Event::Apply(lowered.clone()))));
    let (body, reply) = api.expect(Method::PATCH, STATUS).await;
    assert_eq!(body["status"]["allocatedResources"], json!({"storage": "1536Mi"}));
    assert_eq!(body["status"]["conditions"].as_array().map(Vec::len), Some(1), "the error condition goes");
    ok(reply, &with_state(lowered.clone(), Some("1536Mi"), Some(CONTROLLER_IN_PROGRESS)));
    let (body, reply) = api.expect(Method::PATCH, PV).await;
    assert_eq!(body, json!({"spec": {"capacity": {"storage": "1536Mi"}}}));
    ok(reply, &pv("1536Mi"));
    // A block volume (no node step) is finished here.
    let (body, reply) = api.expect(Method::PATCH, STATUS).await;
    assert_eq!(body["status"]["capacity"], json!({"storage": "1536Mi"}));
    assert_eq!(body["status"]["allocatedResourceStatuses"], json!({"storage": null}));
    ok(reply, &lowered);
    api.assert_quiet().await;
    assert_eq!(*backend.asked.lock().unwrap(), [100 * GI, (3 * GI) / 2], "the infeasible size was asked once");
    assert_eq!(api.events(), ["Resizing", "VolumeResizeFailed", "Resizing", "VolumeResizeSuccessful"]);
}
