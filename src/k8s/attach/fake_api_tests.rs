//! The AttachQueue actor against the fake API server (`crate::k8s::fake_api`) serving
//! lists and watch streams from a script and handing every other request to the test,
//! which checks it and answers it in order. Time is paused.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Method;
use serde_json::{json, Value};

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::runtime::watcher::Event;
use kube::Client;
use tokio::time::Instant;

use actix::Actor;

use super::*;
use crate::actors::volumes::VolumeError;
use crate::k8s::attach::backend::VolumeOps;
use crate::k8s::attach::{AttachBackend, PublishSpec, VolumeCallError, VolumeState};
use crate::k8s::shell::RetryPolicy;
use crate::k8s::shell::{Ready, WatchItem};
use crate::k8s::attach::fixtures::*;
use crate::k8s::fake_api::{fake_api_serving, list_of, respond, FakeApi, Script};

/// The fake API server with this queue's watched resources scripted: VolumeAttachments
/// and PersistentVolumes are listed and watched from `vas` and `pvs`; every other request
/// comes to the test.
fn fake_api(vas: Script, pvs: Script) -> (Client, FakeApi) {
    fake_api_serving(vec![("/apis/storage.k8s.io/v1/volumeattachments", vas), ("/api/v1/persistentvolumes", pvs)])
}

/// The watch event of an expired resourceVersion (410 Gone).
fn gone() -> Value {
    json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "too old resource version", "reason": "Expired", "code": 410}})
}

/// The volume manager, scripted: every volume is in the state given; ready unless
/// made otherwise.
#[derive(Clone)]
struct FakeBackend {
    states: Arc<Mutex<BTreeMap<String, VolumeState>>>,
    calls: Arc<Mutex<Vec<String>>>,
    /// Whether start-up is done.
    ready: Arc<tokio::sync::watch::Sender<bool>>,
    /// How many times the queue asked for a volume's state.
    asked: Arc<Mutex<usize>>,
}

impl Default for FakeBackend {
    fn default() -> Self {
        FakeBackend {
            states: Arc::default(),
            calls: Arc::default(),
            ready: Arc::new(tokio::sync::watch::channel(true).0),
            asked: Arc::default(),
        }
    }
}

impl FakeBackend {
    fn with(volume: &str, state: VolumeState) -> Self {
        let b = FakeBackend::default();
        b.states.lock().expect("states").insert(volume.to_string(), state);
        b
    }
    fn calls(&self) -> Vec<String> {
        self.calls.lock().expect("calls").clone()
    }
}

impl VolumeOps for FakeBackend {
    async fn publish(&self, spec: &PublishSpec, node: &str) -> Result<BTreeMap<String, String>, VolumeCallError> {
        self.calls.lock().expect("calls").push(format!("publish {} {node}", spec.volume_id));
        Ok(context())
    }
    async fn unpublish(&self, volume_id: &str, node: &str) -> Result<(), VolumeCallError> {
        self.calls.lock().expect("calls").push(format!("unpublish {volume_id} {node}"));
        Ok(())
    }
}

impl AttachBackend for FakeBackend {
    async fn volume_state(&self, spec: &PublishSpec, _node: &str) -> Result<VolumeState, VolumeCallError> {
        *self.asked.lock().expect("asked") += 1;
        if !*self.ready.borrow() {
            return Err(VolumeError::NotReady.into());
        }
        Ok(self.states.lock().expect("states").get(&spec.volume_id).cloned().unwrap_or(VolumeState::Missing))
    }
}

impl Ready for FakeBackend {
    async fn wait_ready(&self) {
        let mut ready = self.ready.subscribe();
        let _ = ready.wait_for(|r| *r).await;
    }
}

fn queue_config() -> QueueConfig {
    QueueConfig {
        identity: identity(),
        policy: RetryPolicy { base: Duration::from_secs(1), cap: Duration::from_secs(60), terminal: Duration::from_secs(600) },
        resync: Duration::ZERO,
    }
}

fn va_list(rv: &str, items: &[&VolumeAttachment]) -> Value {
    let items = items.iter().map(|v| serde_json::to_value(v).expect("va")).collect();
    list_of("VolumeAttachment", "storage.k8s.io/v1", rv, items)
}

fn pv_list(rv: &str, items: &[&PersistentVolume]) -> Value {
    let items = items.iter().map(|v| serde_json::to_value(v).expect("pv")).collect();
    list_of("PersistentVolume", "v1", rv, items)
}

fn deleting_va(mut va: VolumeAttachment) -> VolumeAttachment {
    va.metadata.deletion_timestamp = deleted();
    va
}

const VA: &str = "/apis/storage.k8s.io/v1/volumeattachments/va-1";
const VA_STATUS: &str = "/apis/storage.k8s.io/v1/volumeattachments/va-1/status";
const PV: &str = "/api/v1/persistentvolumes/pv-1";

#[actix_rt::test]
async fn a_listed_attachment_is_attached_and_others_are_left_alone() {
    tokio::time::pause();
    let mut other_node = va("va-2", "pv-2");
    other_node.spec.node_name = "node-b".into();
    let mut other_driver = va("va-3", "pv-3");
    other_driver.spec.attacher = "ebs.csi.aws.com".into();
    let vas = Script { lists: [va_list("10", &[&va("va-1", "pv-1"), &other_node, &other_driver])].into(), ..Default::default() };
    let pvs = Script { lists: [pv_list("20", &[&pv("pv-1", "vol-1")])].into(), ..Default::default() };
    let (client, mut api) = fake_api(vas, pvs);
    let backend = FakeBackend::with("vol-1", VolumeState::Usable);
    let queue = AttachQueue::new(client, queue_config(), backend.clone()).start();

    let (body, reply) = api.expect_path(Method::PATCH, VA).await;
    assert_eq!(body["metadata"]["finalizers"], json!([FINALIZER]));
    respond(reply, &with_finalizer(va("va-1", "pv-1")));
    let (body, reply) = api.expect_path(Method::PATCH, PV).await;
    assert_eq!(body["metadata"]["finalizers"], json!([FINALIZER]));
    respond(reply, &pv_with_finalizer(pv("pv-1", "vol-1")));
    let (body, reply) = api.expect_path(Method::PATCH, VA_STATUS).await;
    assert_eq!(body["status"]["attached"], true);
    assert_eq!(body["status"]["attachmentMetadata"], json!(context()));
    respond(reply, &attached(with_finalizer(va("va-1", "pv-1"))));

    api.assert_quiet().await;
    assert_eq!(backend.calls(), ["publish vol-1 node-a"]);
    let stats = queue.send(GetQueueStats::default()).await.expect("queue answers");
    assert_eq!((stats.attachments, stats.waiting, stats.running, stats.retries), (1, 0, 0, 0));
}

#[actix_rt::test]
async fn no_attach_work_runs_before_the_volume_manager_is_ready() {
    tokio::time::pause();
    let vas = Script { lists: [va_list("10", &[&va("va-1", "pv-1")])].into(), ..Default::default() };
    let pvs = Script { lists: [pv_list("20", &[&pv("pv-1", "vol-1")])].into(), ..Default::default() };
    let (client, mut api) = fake_api(vas, pvs);
    let backend = FakeBackend::with("vol-1", VolumeState::Usable);
    backend.ready.send_replace(false);
    let queue = AttachQueue::new(client, queue_config(), backend.clone()).start();

    // Both watches have listed; the volume manager is still reconciling its store.
    api.assert_quiet().await;
    assert_eq!(*backend.asked.lock().expect("asked"), 0, "no volume was asked about");
    assert!(backend.calls().is_empty(), "nothing published or unpublished");
    let stats = queue.send(GetQueueStats::default()).await.expect("queue answers");
    assert_eq!((stats.attachments, stats.waiting, stats.running, stats.retries), (1, 1, 0, 0), "queued, waiting, no retry");

    // Ready: the waiting attachment runs at once, first time right.
    let ready_at = Instant::now();
    backend.ready.send_replace(true);
    let (body, reply) = api.expect_path(Method::PATCH, VA).await;
    assert_eq!(ready_at.elapsed(), Duration::ZERO, "run as soon as the volume manager is ready");
    assert_eq!(body["metadata"]["finalizers"], json!([FINALIZER]));
    respond(reply, &with_finalizer(va("va-1", "pv-1")));
    let (_, reply) = api.expect_path(Method::PATCH, PV).await;
    respond(reply, &pv_with_finalizer(pv("pv-1", "vol-1")));
    let (body, reply) = api.expect_path(Method::PATCH, VA_STATUS).await;
    assert_eq!(body["status"]["attached"], true);
    respond(reply, &attached(with_finalizer(va("va-1", "pv-1"))));
    api.assert_quiet().await;
    assert_eq!(backend.calls(), ["publish vol-1 node-a"]);
    let stats = queue.send(GetQueueStats::default()).await.expect("queue answers");
    assert_eq!(stats.retries, 0, "no failed attempt before ready");
}

#[actix_rt::test]
async fn a_change_missed_while_the_watch_was_down_is_found_by_the_relist() {
    tokio::time::pause();
    let done = attached(with_finalizer(va("va-1", "pv-1")));
    let fin_pv = pv_with_finalizer(pv("pv-1", "vol-1"));
    // The first watch dies with 410 Gone (its resourceVersion expired); meanwhile the
    // attachment was deleted, which only the second list shows.
    let vas = Script {
        lists: [va_list("10", &[&done]), va_list("30", &[&deleting_va(done.clone())])].into(),
        watches: [vec![gone()]].into(),
    };
    let pvs = Script { lists: [pv_list("20", &[&fin_pv])].into(), ..Default::default() };
    let (client, mut api) = fake_api(vas, pvs);
    let backend = FakeBackend::with("vol-1", VolumeState::Usable);
    let queue = AttachQueue::new(client, queue_config(), backend.clone()).start();

    let (body, reply) = api.expect_path(Method::PATCH, VA).await;
    assert_eq!(body["metadata"]["finalizers"], json!([]), "detached: our finalizer goes");
    respond(reply, &deleting_va(attached(va("va-1", "pv-1"))));
    api.assert_quiet().await;

    assert_eq!(backend.calls(), ["unpublish vol-1 node-a"], "nothing to do for the first list, one unpublish after the second");
    // This node's attachments only, by the relay's label, from the API server's cache.
    let list = "GET /apis/storage.k8s.io/v1/volumeattachments?&labelSelector=drivelet.io%2Fnode%3Dnode-a&resourceVersion=0&resourceVersionMatch=NotOlderThan";
    assert_eq!(api.count(list), 2, "listed again after the watch broke: {:?}", api.requests());
    let stats = queue.send(GetQueueStats::default()).await.expect("queue answers");
    assert_eq!(stats.relists, 2);
}

#[actix_rt::test]
async fn the_pv_finalizer_goes_once_no_attachment_of_this_node_names_the_deleted_pv() {
    tokio::time::pause();
    let done = attached(with_finalizer(va("va-1", "pv-1")));
    let second = attached(with_finalizer(va("va-3", "pv-1")));
    let mut elsewhere = with_finalizer(va("va-2", "pv-1"));
    elsewhere.spec.node_name = "node-b".into();
    let fin_pv = pv_with_finalizer(pv("pv-1", "vol-1"));
    let mut deleting_pv = fin_pv.clone();
    deleting_pv.metadata.deletion_timestamp = deleted();
    let vas = Script { lists: [va_list("10", &[&deleting_va(done.clone()), &second])].into(), ..Default::default() };
    let pvs = Script { lists: [pv_list("20", &[&fin_pv])].into(), ..Default::default() };
    let (client, mut api) = fake_api(vas, pvs);
    let backend = FakeBackend::with("vol-1", VolumeState::Usable);
    let queue = AttachQueue::new(client, queue_config(), backend.clone()).start();

    // The attachment is detached; the PV is alive, so its finalizer stays.
    let (body, reply) = api.expect_path(Method::PATCH, VA).await;
    assert_eq!(body["metadata"]["finalizers"], json!([]));
    respond(reply, &deleting_va(attached(va("va-1", "pv-1"))));
    queue.do_send(WatchItem::First(Ok(Event::Delete(deleting_va(attached(va("va-1", "pv-1")))))));
    api.assert_quiet().await;

    // The PV is deleted, but this node's va-3 still names it.
    queue.do_send(WatchItem::Second(Ok(Event::Apply(deleting_pv.clone()))));
    api.assert_quiet().await;
    assert_eq!(api.count("PATCH /api/v1/persistentvolumes"), 0, "va-3 still names the PV");

    // Another node's attachment that arrives all the same is none of this node's: it is
    // neither run nor counted as a user of the PV.
    queue.do_send(WatchItem::First(Ok(Event::Apply(elsewhere))));
    api.assert_quiet().await;

    // va-3 is detached and goes: nothing of this node names the PV any more, and its node
    // owns the finalizer, so one PATCH releases it.
    queue.do_send(WatchItem::First(Ok(Event::Apply(deleting_va(second.clone())))));
    let (_, reply) = api.expect_path(Method::PATCH, "/apis/storage.k8s.io/v1/volumeattachments/va-3").await;
    respond(reply, &deleting_va(attached(va("va-3", "pv-1"))));
    let (body, reply) = api.expect_path(Method::PATCH, PV).await;
    assert_eq!(body, json!({"metadata": {"finalizers": [], "resourceVersion": "7"}}));
    respond(reply, &deleting_pv);
    api.assert_quiet().await;
    assert_eq!(backend.calls(), ["unpublish vol-1 node-a", "unpublish vol-1 node-a"]);
}

#[actix_rt::test]
async fn a_failing_attach_is_retried_on_its_backoff_and_not_on_its_own_status_write() {
    tokio::time::pause();
    let vas = Script { lists: [va_list("10", &[&with_finalizer(va("va-1", "pv-1"))])].into(), ..Default::default() };
    let pvs = Script { lists: [pv_list("20", &[&pv_with_finalizer(pv("pv-1", "vol-1"))])].into(), ..Default::default() };
    let (client, mut api) = fake_api(vas, pvs);
    let backend = FakeBackend::with("vol-1", VolumeState::Missing);
    let queue = AttachQueue::new(client, queue_config(), backend.clone()).start();

    let start = Instant::now();
    let (body, reply) = api.expect_path(Method::PATCH, VA_STATUS).await;
    assert_eq!(body["status"]["attachError"]["message"], "volume vol-1 does not exist on node node-a");
    let mut failed = with_finalizer(va("va-1", "pv-1"));
    failed.status = serde_json::from_value(json!({"attached": false, "attachError": {"message": "volume vol-1 does not exist on node node-a"}})).expect("status");
    failed.metadata.resource_version = Some("11".into());
    respond(reply, &failed);
    let (_, reply) = api.expect_path(Method::POST, "/apis/events.k8s.io/v1/namespaces/default/events").await;
    respond(reply, &json!({}));
    // Our own status write comes back through the watch: it must not trigger a retry.
    queue.do_send(WatchItem::First(Ok(Event::Apply(failed.clone()))));

    // The volume appears; the retry comes after the 1 s backoff, not before.
    backend.states.lock().expect("states").insert("vol-1".into(), VolumeState::Usable);
    let (body, reply) = api.expect_path(Method::PATCH, VA_STATUS).await;
    let waited = Instant::now() - start;
    assert!(waited >= Duration::from_secs(1) && waited < Duration::from_millis(1010), "retried on the 1 s backoff, after {waited:?}");
    assert_eq!(body["status"]["attached"], true);
    assert_eq!(body["status"]["attachError"], Value::Null);
    respond(reply, &attached(with_finalizer(va("va-1", "pv-1"))));
    api.assert_quiet().await;
    assert_eq!(backend.calls(), ["publish vol-1 node-a"]);
    let stats = queue.send(GetQueueStats::default()).await.expect("queue answers");
    assert_eq!(stats.retries, 1);
}

#[test]
fn only_changes_the_decisions_read_count_as_changes() {
    let base = with_finalizer(va("va-1", "pv-1"));
    let mut rv = base.clone();
    rv.metadata.resource_version = Some("99".into());
    let mut error = base.clone();
    error.status = serde_json::from_value(json!({"attached": false, "attachError": {"message": "x"}})).expect("status");
    let mut attached_now = base.clone();
    attached_now.status = serde_json::from_value(json!({"attached": true})).expect("status");
    let deleting = deleting_va(base.clone());
    let bare = va("va-1", "pv-1");
    assert!(!decisions_differ(&base, &rv), "resourceVersion alone");
    assert!(decisions_differ(&base, &attached_now), "attached");
    assert!(decisions_differ(&base, &deleting), "deletionTimestamp");
    assert!(decisions_differ(&base, &bare), "finalizers");
    let mut plain_error = base.clone();
    plain_error.status = serde_json::from_value(json!({"attached": false})).expect("status");
    assert!(!decisions_differ(&plain_error, &error), "attachError alone");
}

#[test]
fn slim_pv_keeps_what_the_decisions_read() {
    let mut full = pv_with_finalizer(pv("pv-1", "vol-1"));
    full.metadata.deletion_timestamp = deleted();
    full.metadata.annotations = Some(BTreeMap::from([("a".to_string(), "b".repeat(1000))]));
    let spec = full.spec.as_mut().expect("spec");
    spec.volume_mode = Some("Block".into());
    spec.storage_class_name = Some("local".into());
    let slim = slim_pv(full.clone());
    assert_eq!(slim.metadata.annotations, None);
    assert_eq!(slim.metadata.finalizers, full.metadata.finalizers);
    assert_eq!(slim.metadata.deletion_timestamp, full.metadata.deletion_timestamp);
    assert_eq!(slim.metadata.resource_version, full.metadata.resource_version);
    assert_eq!(publish_spec(&va("va-1", "pv-1"), Some(&slim)), publish_spec(&va("va-1", "pv-1"), Some(&full)));
    assert_eq!(slim.spec.as_ref().and_then(|s| s.storage_class_name.clone()), None);
}
