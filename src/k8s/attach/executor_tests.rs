//! The attach executor against the scripted fake API server (`crate::k8s::fake_api`): each
//! test states the exact requests, in order, that one reconcile makes, and answers them.
//!
//! Rules: every request is checked for method, path and body (error times are only
//! checked to be present, since they come from the wall clock); no request may come that
//! the script does not expect (the handle is checked empty at the end); time is paused, so
//! backoff delays are asserted exactly with `advance`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Method;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::k8s::attach::fixtures::*;
use crate::k8s::attach::backend::VolumeOps;
use crate::k8s::attach::*;
use crate::k8s::fake_api::{fake_api, respond, FakeApi};
use crate::k8s::identity::REPORTER;

const VA_PATH: &str = "/apis/storage.k8s.io/v1/volumeattachments/va-1?";
const VA_STATUS_PATH: &str = "/apis/storage.k8s.io/v1/volumeattachments/va-1/status?";
const PV_PATH: &str = "/api/v1/persistentvolumes/pv-1?";
const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

fn policy() -> RetryPolicy {
    RetryPolicy { base: Duration::from_secs(1), cap: Duration::from_secs(60), terminal: Duration::from_secs(600) }
}

/// The volume manager, scripted: publish answers are taken from a queue (empty = success).
#[derive(Clone, Default)]
struct FakeVolumes {
    calls: Arc<Mutex<Vec<String>>>,
    publish_errors: Arc<Mutex<VecDeque<String>>>,
    unpublish_error: Option<String>,
}

impl FakeVolumes {
    fn calls(&self) -> Vec<String> {
        self.calls.lock().expect("calls lock").clone()
    }
}

impl VolumeOps for FakeVolumes {
    async fn publish(&self, spec: &PublishSpec, node: &str) -> Result<BTreeMap<String, String>, VolumeCallError> {
        self.calls.lock().expect("calls lock").push(format!("publish {} {node}", spec.volume_id));
        match self.publish_errors.lock().expect("errors lock").pop_front() {
            Some(error) => Err(VolumeCallError::Unavailable(error)),
            None => Ok(context()),
        }
    }

    async fn unpublish(&self, volume_id: &str, node: &str) -> Result<(), VolumeCallError> {
        self.calls.lock().expect("calls lock").push(format!("unpublish {volume_id} {node}"));
        self.unpublish_error.clone().map_or(Ok(()), |e| Err(VolumeCallError::Unavailable(e)))
    }
}

/// Check an error field's time is set, then drop it so the rest compares exactly.
fn strip_error_time(body: &mut Value, field: &str) {
    let error = body["status"][field].as_object_mut().expect("error field is set");
    assert!(error.remove("time").and_then(|t| t.as_str().map(str::to_owned)).is_some(), "{field} has a time");
}

/// Expect the status patch of a failed attach and answer it.
async fn expect_attach_error(handle: &mut FakeApi, va: &VolumeAttachment, message: &str) {
    let (mut body, send) = handle.expect(Method::PATCH, VA_STATUS_PATH).await;
    strip_error_time(&mut body, "attachError");
    assert_eq!(body, json!({"status": {"attached": false, "attachError": {"message": message}}}));
    respond(send, va);
}

/// Expect the Warning Event of a failed attach (created the first time, a series patch
/// after) and answer it.
async fn expect_event(handle: &mut FakeApi, first: bool, reason: &str, message: &str) {
    let call = handle.next("the executor recorded no Event").await;
    let path = call.path().to_string();
    if first {
        assert_eq!(call.method, Method::POST);
        assert_eq!(path, EVENTS_PATH);
    } else {
        assert_eq!(call.method, Method::PATCH);
        assert!(path.starts_with(&format!("{EVENTS_PATH}/va-1.")), "series patch of the first Event: {path}");
    }
    let event = call.body;
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["reason"], reason);
    assert_eq!(event["note"], message);
    assert_eq!(event["regarding"]["kind"], "VolumeAttachment");
    assert_eq!(event["regarding"]["name"], "va-1");
    assert_eq!(event["reportingController"], REPORTER);
    assert_eq!(event["reportingInstance"], NODE);
    if !first {
        assert_eq!(event["series"]["count"], 2);
    }
    respond(call.reply, &event);
}

#[tokio::test(start_paused = true)]
async fn attach_success_adds_both_finalizers_publishes_and_marks_attached() {
    let (client, mut handle) = fake_api();
    let executor = Executor::new(client, identity(), policy());
    let volumes = FakeVolumes::default();
    let new_va = va("va-1", "pv-1");
    let new_pv = pv("pv-1", "vol-1");
    let obs = Observed { va: &new_va, pv: Some(&new_pv), other_attachments: 0, volume: &usable(), failures: 0 };
    let actions = reconcile(&obs, &identity(), &policy());

    let server = tokio::spawn(async move {
        let (body, send) = handle.expect(Method::PATCH, VA_PATH).await;
        assert_eq!(body, json!({"metadata": {"finalizers": [FINALIZER], "resourceVersion": "1"}}));
        respond(send, &with_finalizer(va("va-1", "pv-1")));

        let (body, send) = handle.expect(Method::PATCH, PV_PATH).await;
        assert_eq!(body, json!({"metadata": {"finalizers": [FINALIZER], "resourceVersion": "7"}}));
        respond(send, &pv_with_finalizer(pv("pv-1", "vol-1")));

        let (body, send) = handle.expect(Method::PATCH, VA_STATUS_PATH).await;
        assert_eq!(
            body,
            json!({"status": {
                "attached": true,
                "attachmentMetadata": {
                    "devicePath": "/dev/sdb3",
                    "partitionGuid": "6f1c0a3e-0000-4000-8000-000000000001"
                },
                "attachError": null
            }})
        );
        respond(send, &attached(with_finalizer(va("va-1", "pv-1"))));
        handle
    });

    let requeue = executor.apply(&new_va, Some(&new_pv), actions, &volumes, 0).await.expect("attach applies");
    let mut handle = server.await.expect("script ran to the end");
    assert_eq!(requeue, None);
    assert_eq!(volumes.calls(), ["publish vol-1 node-a"]);
    handle.assert_no_more_requests("no request beyond the script");
}

#[tokio::test(start_paused = true)]
async fn attach_failure_backs_off_exponentially_then_succeeds() {
    let (client, mut handle) = fake_api();
    let executor = Executor::new(client, identity(), policy());
    let volumes = FakeVolumes::default();
    volumes.publish_errors.lock().expect("errors lock").push_back("drive SN123 is busy".into());
    let va = with_finalizer(va("va-1", "pv-1"));
    let pv = pv_with_finalizer(pv("pv-1", "vol-1"));

    // The work queue in miniature: the volume manager first knows no such volume, then a
    // publish fails, then it succeeds; each failure sleeps for the requeue asked for.
    let worker = {
        let (volumes, va, pv) = (volumes.clone(), va.clone(), pv.clone());
        tokio::spawn(async move {
            let states = [VolumeState::Missing, usable(), usable()];
            let mut failures = 0;
            for state in &states {
                let obs = Observed { va: &va, pv: Some(&pv), other_attachments: 0, volume: state, failures };
                let actions = reconcile(&obs, &identity(), &policy());
                match executor.apply(&va, Some(&pv), actions, &volumes, failures).await.expect("applies") {
                    Some(after) => {
                        failures += 1;
                        tokio::time::sleep(after).await;
                    }
                    None => return failures,
                }
            }
            panic!("still failing after {} attempts", states.len());
        })
    };

    let missing = "volume vol-1 does not exist on node node-a";
    expect_attach_error(&mut handle, &va, missing).await;
    expect_event(&mut handle, true, "AttachFailed", missing).await;
    let failed_at = Instant::now();

    // First retry after the base delay, not a moment sooner.
    tokio::time::sleep(Duration::from_millis(1)).await;
    tokio::time::advance(Duration::from_millis(998)).await;
    assert!(handle.is_quiet(), "retried before the backoff elapsed");
    tokio::time::advance(Duration::from_millis(1)).await;
    let busy = "publishing volume vol-1: drive SN123 is busy";
    expect_attach_error(&mut handle, &va, busy).await;
    assert_eq!(failed_at.elapsed(), Duration::from_secs(1));
    // kube's Recorder folds a repeated Event (same reason on the same object) into a
    // series: it patches the first Event's count and keeps its note; the new message is in
    // attachError.
    expect_event(&mut handle, false, "AttachFailed", missing).await;
    let failed_at = Instant::now();

    // Second retry after twice the base delay.
    tokio::time::sleep(Duration::from_millis(1)).await;
    tokio::time::advance(Duration::from_millis(1998)).await;
    assert!(handle.is_quiet(), "retried before the doubled backoff elapsed");
    tokio::time::advance(Duration::from_millis(1)).await;
    let (body, send) = handle.expect(Method::PATCH, VA_STATUS_PATH).await;
    assert_eq!(failed_at.elapsed(), Duration::from_secs(2));
    assert_eq!(body["status"]["attached"], true);
    assert_eq!(body["status"]["attachError"], Value::Null);
    respond(send, &attached(va.clone()));

    assert_eq!(worker.await.expect("worker finished"), 2);
    assert_eq!(volumes.calls(), ["publish vol-1 node-a", "publish vol-1 node-a"]);
    handle.assert_no_more_requests("no request beyond the script");
}

#[tokio::test(start_paused = true)]
async fn a_failing_drive_is_one_attach_error_and_a_long_requeue() {
    let (client, mut handle) = fake_api();
    let executor = Executor::new(client, identity(), policy());
    let volumes = FakeVolumes::default();
    let va = with_finalizer(va("va-1", "pv-1"));
    let pv = pv_with_finalizer(pv("pv-1", "vol-1"));
    let failing = VolumeState::Unusable { reason: "drive SN123 is failing (SMART)".into() };
    let obs = Observed { va: &va, pv: Some(&pv), other_attachments: 0, volume: &failing, failures: 4 };
    let actions = reconcile(&obs, &identity(), &policy());

    let server = tokio::spawn({
        let va = va.clone();
        async move {
            let message = "volume vol-1 cannot be attached: drive SN123 is failing (SMART)";
            expect_attach_error(&mut handle, &va, message).await;
            expect_event(&mut handle, true, "AttachFailed", message).await;
            handle
        }
    });
    let requeue = executor.apply(&va, Some(&pv), actions, &volumes, 4).await.expect("applies");
    let mut handle = server.await.expect("script ran to the end");
    assert_eq!(requeue, Some(Duration::from_secs(600)));
    assert!(volumes.calls().is_empty(), "an unusable drive is not even tried");
    handle.assert_no_more_requests("no request beyond the script");
}

fn deleting(mut va: VolumeAttachment) -> VolumeAttachment {
    va.metadata.deletion_timestamp = deleted();
    va
}

fn deleting_pv(mut pv: PersistentVolume) -> PersistentVolume {
    pv.metadata.deletion_timestamp = deleted();
    pv
}

#[tokio::test(start_paused = true)]
async fn detach_unpublishes_then_removes_both_finalizers_of_a_deleted_pv() {
    let (client, mut handle) = fake_api();
    let executor = Executor::new(client, identity(), policy());
    let volumes = FakeVolumes::default();
    let va = deleting(attached(with_finalizer(va("va-1", "pv-1"))));
    let pv = deleting_pv(pv_with_finalizer(pv("pv-1", "vol-1")));
    let obs = Observed { va: &va, pv: Some(&pv), other_attachments: 0, volume: &usable(), failures: 0 };
    let actions = reconcile(&obs, &identity(), &policy());

    let server = tokio::spawn({
        let (va, pv) = (va.clone(), pv.clone());
        async move {
            let (body, send) = handle.expect(Method::PATCH, VA_PATH).await;
            assert_eq!(body, json!({"metadata": {"finalizers": [], "resourceVersion": "1"}}));
            let mut gone = va;
            gone.metadata.finalizers = None;
            respond(send, &gone);
            let (body, send) = handle.expect(Method::PATCH, PV_PATH).await;
            assert_eq!(body, json!({"metadata": {"finalizers": [], "resourceVersion": "7"}}));
            respond(send, &pv);
            handle
        }
    });
    let requeue = executor.apply(&va, Some(&pv), actions, &volumes, 0).await.expect("detach applies");
    let mut handle = server.await.expect("script ran to the end");
    assert_eq!(requeue, None);
    assert_eq!(volumes.calls(), ["unpublish vol-1 node-a"]);
    handle.assert_no_more_requests("no request beyond the script");
}

#[tokio::test(start_paused = true)]
async fn failed_detach_writes_detach_error_keeps_the_finalizer_and_backs_off() {
    let (client, mut handle) = fake_api();
    let executor = Executor::new(client, identity(), policy());
    let volumes = FakeVolumes { unpublish_error: Some("volume is still staged".into()), ..Default::default() };
    let va = deleting(attached(with_finalizer(va("va-1", "pv-1"))));
    let pv = pv_with_finalizer(pv("pv-1", "vol-1"));
    let obs = Observed { va: &va, pv: Some(&pv), other_attachments: 0, volume: &usable(), failures: 1 };
    let actions = reconcile(&obs, &identity(), &policy());

    let server = tokio::spawn({
        let va = va.clone();
        async move {
            let message = "unpublishing volume vol-1: volume is still staged";
            let (mut body, send) = handle.expect(Method::PATCH, VA_STATUS_PATH).await;
            strip_error_time(&mut body, "detachError");
            assert_eq!(body, json!({"status": {"detachError": {"message": message}}}));
            respond(send, &va);
            expect_event(&mut handle, true, "DetachFailed", message).await;
            handle
        }
    });
    let requeue = executor.apply(&va, Some(&pv), actions, &volumes, 1).await.expect("applies");
    let mut handle = server.await.expect("script ran to the end");
    assert_eq!(requeue, Some(Duration::from_secs(2)));
    handle.assert_no_more_requests("no finalizer removal after a failed unpublish");
}

#[tokio::test(start_paused = true)]
async fn releasing_a_pv_that_is_gone_is_done_and_a_conflict_is_told_apart() {
    use crate::k8s::fake_api::respond_error;
    let pv = pv_with_finalizer(pv("pv-1", "vol-1"));
    // Gone already: another writer removed the last finalizer first. Nothing to release.
    let (client, mut handle) = fake_api();
    let executor = Executor::new(client, identity(), policy());
    let server = tokio::spawn(async move {
        let (_, send) = handle.expect(Method::PATCH, PV_PATH).await;
        respond_error(send, 404, "persistentvolumes \"pv-1\" not found");
        handle
    });
    executor.release_pv(&pv).await.expect("a PV that is gone needs no release");
    server.await.expect("script ran").assert_no_more_requests("one patch");
    // Changed meanwhile (another node's attacher wrote first): an error the caller retries
    // quietly, told apart from any other failure.
    let (client, mut handle) = fake_api();
    let executor = Executor::new(client, identity(), policy());
    let server = tokio::spawn(async move {
        let (_, send) = handle.expect(Method::PATCH, PV_PATH).await;
        respond_error(send, 409, "the object has been modified");
        let (_, send) = handle.expect(Method::PATCH, PV_PATH).await;
        respond_error(send, 500, "etcd is unhappy");
        handle
    });
    let e = executor.release_pv(&pv).await.expect_err("a conflict is an error");
    assert!(e.is_conflict(), "{e}");
    let e = executor.release_pv(&pv).await.expect_err("a server error is an error");
    assert!(!e.is_conflict(), "{e}");
    server.await.expect("script ran").assert_no_more_requests("two patches");
}
