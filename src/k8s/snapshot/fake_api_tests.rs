//! The SnapshotQueue against the fake API server (`crate::k8s::fake_api`, serving
//! Events): lists are served from a script, watches held open, Events answered and
//! recorded; every other request goes to the test, which checks it and answers it in
//! order. Time is paused.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use actix::Actor;
use http::Method;
use kube::runtime::watcher::Event;
use kube::Client;
use serde_json::{json, Value};

use super::*;
use crate::actors::volumes::VolumeError;
use crate::k8s::shell::RetryPolicy;
use crate::k8s::shell::{Ready, WatchItem};
use crate::k8s::snapshot::backend::{Failure, SnapshotInfo};
use crate::k8s::snapshot::tests::{class, content, deleting, identity, info, labelled, ready, NODE, UID};
use crate::k8s::snapshot::{BEING_CREATED, FREEZE_PARAMETER, NODE_LABEL};
use crate::k8s::fake_api::{fake_api_serving_events, list_of, respond, FakeApi, Script};
use crate::k8s::KubeError;

/// An Event as recorded: reason, note, kind and name of the object it is about.
type Recorded = (String, String, String, String);

const CONTENTS: &str = "/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents";
const CLASSES: &str = "/apis/snapshot.storage.k8s.io/v1/volumesnapshotclasses";
const CONTENT: &str = "/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents/snapcontent-1";
const STATUS: &str = "/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents/snapcontent-1/status";

/// A fake API server serving the content and class lists (watches held open) and
/// recording the Events; every other request goes to the test.
fn fake_api(contents: Vec<&VolumeSnapshotContent>, classes: Vec<&VolumeSnapshotClass>) -> (Client, FakeApi) {
    let script = |kind: &str, items: Vec<Value>| Script { lists: [list_of(kind, "snapshot.storage.k8s.io/v1", "1", items)].into(), ..Default::default() };
    fake_api_serving_events(vec![
        (CONTENTS, script("VolumeSnapshotContent", contents.iter().map(|c| json!(c)).collect())),
        (CLASSES, script("VolumeSnapshotClass", classes.iter().map(|k| json!(k)).collect())),
    ])
}

/// The Events recorded so far.
fn recorded(api: &FakeApi) -> Vec<Recorded> {
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    api.events().iter().map(|e| (s(&e["reason"]), s(&e["note"]), s(&e["regarding"]["kind"]), s(&e["regarding"]["name"]))).collect()
}

type Answer<T> = Result<T, (Failure, KubeError)>;

/// The volume manager, scripted: holds `vol-1` and the snapshots listed; answers
/// CreateSnapshot and DeleteSnapshot from lists, and records what was asked.
#[derive(Clone, Default)]
struct FakeBackend {
    held: Arc<Mutex<Vec<SnapshotInfo>>>,
    creates: Arc<Mutex<VecDeque<Answer<SnapshotInfo>>>>,
    deletes: Arc<Mutex<VecDeque<Answer<()>>>>,
    asked: Arc<Mutex<Vec<String>>>,
}

impl SnapshotBackend for FakeBackend {
    async fn holds_volume(&self, volume_id: &str) -> Result<bool, KubeError> {
        Ok(volume_id == "vol-1")
    }
    async fn snapshots(&self) -> Result<Vec<SnapshotInfo>, KubeError> {
        Ok(self.held.lock().expect("held").clone())
    }
    async fn create(&self, name: &str, source: &str, parameters: &BTreeMap<String, String>) -> Answer<SnapshotInfo> {
        self.asked.lock().expect("asked").push(format!("create {name} of {source} with {parameters:?}"));
        self.creates.lock().expect("creates").pop_front().expect("an answer for every CreateSnapshot")
    }
    async fn delete(&self, id: &str) -> Answer<()> {
        self.asked.lock().expect("asked").push(format!("delete {id}"));
        self.deletes.lock().expect("deletes").pop_front().expect("an answer for every DeleteSnapshot")
    }
}

impl Ready for FakeBackend {
    async fn wait_ready(&self) {}
}

impl FakeBackend {
    fn asked(&self) -> Vec<String> {
        self.asked.lock().expect("asked").clone()
    }
}

fn config() -> QueueConfig {
    QueueConfig {
        identity: identity(),
        policy: RetryPolicy { base: Duration::from_secs(1), cap: Duration::from_secs(60), terminal: Duration::from_secs(600) },
        resync: Duration::ZERO,
    }
}

fn freeze_class() -> VolumeSnapshotClass {
    class("fast", &[("csi.storage.k8s.io/snapshotter-secret-name", "s3cr3t"), (FREEZE_PARAMETER, "true")])
}

fn with(mut c: VolumeSnapshotContent, f: impl FnOnce(&mut VolumeSnapshotContent)) -> VolumeSnapshotContent {
    f(&mut c);
    c
}

fn in_use() -> KubeError {
    KubeError::volume("vol-1")(VolumeError::SnapshotSourceInUse { volume_id: "vol-1".into(), path: "/mnt/data".into(), block: false })
}

#[actix_rt::test]
async fn a_new_content_of_a_volume_here_is_snapshotted_and_made_ready_with_one_event() {
    tokio::time::pause();
    let mut elsewhere = content();
    elsewhere.metadata.name = Some("snapcontent-2".into());
    elsewhere.spec.source.volume_handle = Some("vol-9".into());
    let their_node = with(labelled(content(), "node-b"), |c| c.metadata.name = Some("snapcontent-3".into()));
    let (client, mut api) = fake_api(vec![&content(), &elsewhere, &their_node], vec![&freeze_class()]);
    let backend = FakeBackend::default();
    backend.creates.lock().unwrap().push_back(Ok(info(true, Some(17))));
    let queue = SnapshotQueue::new(client, config(), backend.clone()).start();

    let (body, reply) = api.expect_path(Method::PATCH, CONTENT).await;
    assert_eq!(body, json!({"metadata": {"annotations": {BEING_CREATED: "yes"}, "labels": {NODE_LABEL: NODE}}}));
    let marked = labelled(crate::k8s::snapshot::tests::annotated(content(), BEING_CREATED), NODE);
    respond(reply, &marked);
    let (body, reply) = api.expect_path(Method::PATCH, STATUS).await;
    assert_eq!(
        body,
        json!({"status": {"snapshotHandle": "snap-id", "readyToUse": true, "creationTime": 1_700_000_000_123_456_789_i64, "restoreSize": 1_073_741_824}})
    );
    let done = ready(marked.clone());
    respond(reply, &done);
    let (body, reply) = api.expect_path(Method::PATCH, CONTENT).await;
    assert_eq!(body, json!({"metadata": {"annotations": {BEING_CREATED: null}}}));
    respond(reply, &ready(labelled(content(), NODE)));

    // The watch brings the writes back: nothing more to do.
    queue.do_send(WatchItem::First(Ok(Event::Apply(ready(labelled(content(), NODE))))));
    api.assert_quiet().await;
    assert_eq!(backend.asked(), [format!("create snapshot-{UID} of vol-1 with {{\"drivelet.io/freeze\": \"true\"}}")], "secrets are not passed on");
    let events = recorded(&api);
    assert_eq!(events.len(), 1, "{events:?}");
    let (reason, note, kind, name) = &events[0];
    assert_eq!((reason.as_str(), kind.as_str(), name.as_str()), ("SnapshotTaken", "VolumeSnapshot", "snap"));
    assert!(note.contains("on node node-a") && note.contains("1.0 GiB") && note.contains("frozen for 17 ms"), "{note}");
    let stats = queue.send(GetSnapshotStats::default()).await.expect("answers");
    assert_eq!((stats.contents, stats.classes, stats.waiting, stats.running, stats.retries), (3, 1, 0, 0, 0));
}

#[actix_rt::test]
async fn a_refused_snapshot_is_recorded_once_and_retried_with_backoff() {
    tokio::time::pause();
    let (client, mut api) = fake_api(vec![&content()], vec![&freeze_class()]);
    let backend = FakeBackend::default();
    backend.creates.lock().unwrap().push_back(Err((Failure::Final, in_use())));
    backend.creates.lock().unwrap().push_back(Err((Failure::Final, in_use())));
    backend.creates.lock().unwrap().push_back(Ok(info(true, None)));
    let _queue = SnapshotQueue::new(client, config(), backend.clone()).start();

    let marked = labelled(crate::k8s::snapshot::tests::annotated(content(), BEING_CREATED), NODE);
    let (_, reply) = api.expect_path(Method::PATCH, CONTENT).await;
    respond(reply, &marked);
    // A final answer: the annotation goes, then the error is recorded.
    let (body, reply) = api.expect_path(Method::PATCH, CONTENT).await;
    assert_eq!(body, json!({"metadata": {"annotations": {BEING_CREATED: null}}}));
    respond(reply, &labelled(content(), NODE));
    let (body, reply) = api.expect_path(Method::PATCH, STATUS).await;
    let message = body["status"]["error"]["message"].as_str().unwrap_or("").to_string();
    assert!(message.starts_with(&format!("cannot take snapshot snapshot-{UID} of volume vol-1: cannot snapshot volume vol-1 now")), "{message}");
    assert!(message.contains("drivelet.io/freeze: \"true\""), "says how to get one: {message}");
    assert_eq!(body["status"]["readyToUse"], false);
    let errored = with(labelled(content(), NODE), |c| c.status = serde_json::from_value(body["status"].clone()).ok());
    respond(reply, &errored);

    // After the backoff (1 s): the same refusal is not recorded again.
    let (_, reply) = api.expect_path(Method::PATCH, CONTENT).await;
    respond(reply, &crate::k8s::snapshot::tests::annotated(errored.clone(), BEING_CREATED));
    let (_, reply) = api.expect_path(Method::PATCH, CONTENT).await;
    respond(reply, &errored);
    // Then (2 s later) it passes: ready, the error cleared.
    let (_, reply) = api.expect_path(Method::PATCH, CONTENT).await;
    respond(reply, &crate::k8s::snapshot::tests::annotated(errored.clone(), BEING_CREATED));
    let (body, reply) = api.expect_path(Method::PATCH, STATUS).await;
    assert_eq!(body["status"]["readyToUse"], true);
    assert_eq!(body["status"]["error"], Value::Null);
    assert!(body["status"].as_object().is_some_and(|s| s.contains_key("error")), "the error is removed: {body}");
    respond(reply, &ready(crate::k8s::snapshot::tests::annotated(errored.clone(), BEING_CREATED)));
    let (_, reply) = api.expect_path(Method::PATCH, CONTENT).await;
    respond(reply, &ready(labelled(content(), NODE)));
    api.assert_quiet().await;

    let reasons: Vec<String> = recorded(&api).into_iter().map(|(r, _, k, _)| format!("{r} on {k}")).collect();
    assert_eq!(reasons, ["SnapshotCreationFailed on VolumeSnapshot", "SnapshotTaken on VolumeSnapshot"]);
    assert_eq!(backend.asked().len(), 3);
}

#[actix_rt::test]
async fn a_busy_volume_is_retried_soon_without_a_record_and_keeps_the_annotation() {
    tokio::time::pause();
    let (client, mut api) = fake_api(vec![&content()], vec![&freeze_class()]);
    let backend = FakeBackend::default();
    let busy = KubeError::volume("vol-1")(VolumeError::Busy { volume_id: "vol-1".into() });
    backend.creates.lock().unwrap().push_back(Err((Failure::Busy, busy)));
    backend.creates.lock().unwrap().push_back(Ok(info(true, None)));
    let _queue = SnapshotQueue::new(client, config(), backend.clone()).start();

    let marked = labelled(crate::k8s::snapshot::tests::annotated(content(), BEING_CREATED), NODE);
    let (_, reply) = api.expect_path(Method::PATCH, CONTENT).await;
    respond(reply, &marked);
    // Busy: no status, no Event, the annotation stays; the retry finds it set.
    let (body, reply) = api.expect_path(Method::PATCH, STATUS).await;
    assert_eq!(body["status"]["readyToUse"], true);
    respond(reply, &ready(marked.clone()));
    let (body, reply) = api.expect_path(Method::PATCH, CONTENT).await;
    assert_eq!(body, json!({"metadata": {"annotations": {BEING_CREATED: null}}}));
    respond(reply, &ready(labelled(content(), NODE)));
    api.assert_quiet().await;
    assert_eq!(recorded(&api).len(), 1, "only SnapshotTaken");
}

#[actix_rt::test]
async fn a_deleted_content_deletes_its_snapshot_with_policy_delete_and_keeps_it_with_retain() {
    tokio::time::pause();
    let gone = deleting(ready(labelled(content(), NODE)));
    let retained = with(deleting(ready(labelled(content(), NODE))), |c| {
        c.metadata.name = Some("snapcontent-2".into());
        c.spec.deletion_policy = "Retain".into();
        c.status.as_mut().unwrap().snapshot_handle = Some("snap-2".into());
    });
    let (client, mut api) = fake_api(vec![&gone, &retained], vec![&freeze_class()]);
    let backend = FakeBackend::default();
    // The source volume is gone: the snapshot alone makes the content this node's.
    backend.held.lock().unwrap().push(info(true, None));
    backend.deletes.lock().unwrap().push_back(Ok(()));
    let _queue = SnapshotQueue::new(client, config(), backend.clone()).start();

    // Two workers: the two contents' requests may interleave.
    let mut seen = Vec::new();
    for _ in 0..3 {
        let call = api.next("a request").await;
        let (p, body, reply) = (call.path().to_string(), call.body, call.reply);
        seen.push(format!("{} {p}", call.method));
        if p.ends_with("/status") {
            assert_eq!(body, json!({"status": {"snapshotHandle": null, "readyToUse": null, "creationTime": null, "restoreSize": null}}));
            respond(reply, &with(gone.clone(), |c| c.status = None));
        } else {
            assert_eq!(body["metadata"]["finalizers"], json!([]), "{p}: {body}");
            assert_eq!(body["metadata"]["resourceVersion"], "7");
            respond(reply, &with(gone.clone(), |c| c.metadata.finalizers = None));
        }
    }
    seen.sort();
    let mut want = [format!("PATCH {CONTENT}"), format!("PATCH {CONTENTS}/snapcontent-2"), format!("PATCH {STATUS}")];
    want.sort();
    assert_eq!(seen, want);
    api.assert_quiet().await;
    assert_eq!(backend.asked(), ["delete snap-id"], "a retained snapshot stays");
}
