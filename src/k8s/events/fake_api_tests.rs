//! The condition Event reporter (and its actor) against a scripted fake API server
//! (`crate::k8s::fake_api`): each test states the exact requests, in order, that one
//! report makes, and answers them.
//!
//! Rules: as in `fake_api_tests`: method, path with query and body are checked (Event
//! names and times are only checked to be present, since they come from the wall clock);
//! nothing beyond the script may be asked; time is paused, so retry delays and rate-limit
//! windows are asserted exactly.

use std::time::Duration;

use http::Method;
use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use kube::runtime::reflector;
use kube::runtime::watcher;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::condition_event::truncate_note;
use super::reporter::{EventsError, RETRY_AFTER};
use super::fixtures::*;
use super::*;
use crate::k8s::attach::fixtures::{identity, NODE};
use crate::k8s::fake_api::{fake_api, list_of, respond, respond_error, FakeApi, Reply};
use crate::k8s::identity::REPORTER;

const PV_LIST: &str = "/api/v1/persistentvolumes?&labelSelector=drivelet.io%2Fnode%3Dnode-a&resourceVersion=0&resourceVersionMatch=NotOlderThan";
const POD_LIST: &str =
    "/api/v1/namespaces/apps/pods?&fieldSelector=spec.nodeName%3Dnode-a&resourceVersion=0&resourceVersionMatch=NotOlderThan";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/apps/events";

fn pv_list(items: Vec<PersistentVolume>) -> Value {
    list_of("PersistentVolume", "v1", "100", items.iter().map(|pv| json!(pv)).collect())
}

fn pod_list(items: Vec<Pod>) -> Value {
    list_of("Pod", "v1", "100", items.iter().map(|pod| json!(pod)).collect())
}

/// What an Event must say: type, reason, note, the object it is about and its related one.
struct Expected<'a> {
    type_: &'a str,
    reason: &'a str,
    note: &'a str,
    regarding: Value,
    related: Value,
}

fn on_claim<'a>(type_: &'a str, reason: &'a str, note: &'a str) -> Expected<'a> {
    let regarding =
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "apps", "name": "data", "uid": "uid-data"});
    Expected { type_, reason, note, regarding, related: Value::Null }
}

fn on_pod<'a>(pod: &str, type_: &'a str, reason: &'a str, note: &'a str) -> Expected<'a> {
    let regarding = json!({"apiVersion": "v1", "kind": "Pod", "namespace": "apps", "name": pod, "uid": format!("uid-{pod}")});
    let related =
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "apps", "name": "data", "uid": "uid-data"});
    Expected { type_, reason, note, regarding, related }
}

/// Wait for the next request: an Event created in the claim's namespace; check it and
/// return it with the responder.
async fn expect_event(handle: &mut FakeApi, want: &Expected<'_>) -> (Value, Reply) {
    let call = handle.next("the reporter recorded no Event").await;
    assert_eq!(call.method, Method::POST, "{}", call.uri);
    assert_eq!(call.path(), EVENTS);
    let (event, send) = (call.body, call.reply);
    assert_eq!(event["type"], want.type_);
    assert_eq!(event["reason"], want.reason);
    assert_eq!(event["note"], want.note);
    assert_eq!(event["action"], "HealthCheck");
    assert_eq!(event["regarding"], want.regarding);
    assert_eq!(event["related"], want.related);
    assert_eq!(event["reportingController"], REPORTER);
    assert_eq!(event["reportingInstance"], NODE);
    assert_eq!(event["metadata"]["namespace"], "apps");
    assert!(event["eventTime"].is_string(), "eventTime is set");
    assert!(event["series"].is_null(), "a fresh Event, not a series patch");
    (event, send)
}

/// Expect an Event and answer it with success.
async fn expect_recorded(handle: &mut FakeApi, want: &Expected<'_>) {
    let (event, send) = expect_event(handle, want).await;
    respond(send, &event);
}

/// Expect the PV list and answer with a PV bound to apps/data and another one.
async fn expect_pv_list(handle: &mut FakeApi) {
    let (body, send) = handle.expect(Method::GET, PV_LIST).await;
    assert_eq!(body, Value::Null);
    let pvs = vec![bound_pv("pv-0", "vol-0", Some(("apps", "other"))), bound_pv("pv-1", "vol-1", Some(("apps", "data")))];
    respond(send, &pv_list(pvs));
}

/// Expect the pod list of this node in apps and answer with `pods`.
async fn expect_pod_list(handle: &mut FakeApi, pods: Vec<Pod>) {
    let (body, send) = handle.expect(Method::GET, POD_LIST).await;
    assert_eq!(body, Value::Null);
    respond(send, &pod_list(pods));
}

const FAILING: &str = "drive d1 is failing (12 reallocated sectors): have it evacuated (the volume moves to another drive with its data), or move the data to another volume and delete this one";

#[tokio::test(start_paused = true)]
async fn abnormal_volume_is_reported_on_its_claim_then_on_the_pods_using_it_here() {
    let (client, mut handle) = fake_api();
    let reporter = ConditionReporter::new(client, identity());
    let server = tokio::spawn(async move {
        expect_pv_list(&mut handle).await;
        let mut finished = local_pod("apps", "batch", &["data"]);
        finished.status.as_mut().expect("status").phase = Some("Succeeded".into());
        let pods = vec![
            local_pod("apps", "web-0", &["data"]),
            local_pod("apps", "cache-0", &["other"]),
            finished,
            local_pod("apps", "web-1", &["scratch", "data"]),
        ];
        expect_pod_list(&mut handle, pods).await;
        expect_recorded(&mut handle, &on_claim("Warning", "VolumeConditionAbnormal", FAILING)).await;
        expect_recorded(&mut handle, &on_pod("web-0", "Warning", "VolumeConditionAbnormal", FAILING)).await;
        expect_recorded(&mut handle, &on_pod("web-1", "Warning", "VolumeConditionAbnormal", FAILING)).await;
        handle
    });
    let reported = reporter.report(&change("vol-1", true, FAILING)).await;
    let mut handle = server.await.expect("script ran to the end");
    assert_eq!(reported.recorded, 3);
    assert!(reported.errors.is_empty(), "{:?}", reported.errors);
    handle.assert_no_more_requests("no request beyond the script");
}

#[tokio::test(start_paused = true)]
async fn back_to_normal_with_a_ready_pv_store_lists_only_pods_and_cuts_the_note() {
    let (client, mut handle) = fake_api();
    let (store, mut writer) = reflector::store::<PersistentVolume>();
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitApply(bound_pv("pv-1", "vol-1", Some(("apps", "data")))));
    writer.apply_watcher_event(&watcher::Event::InitDone);
    let reporter = ConditionReporter::new(client, identity()).with_pv_store(store);
    let long = format!("volume is healthy; {}", "é".repeat(600));
    let note = truncate_note(&long).to_string();
    assert!(note.len() < long.len() && note.len() <= 1024, "the note is cut");

    let server = tokio::spawn({
        let note = note.clone();
        async move {
            expect_pod_list(&mut handle, vec![local_pod("apps", "web-0", &["data"])]).await;
            expect_recorded(&mut handle, &on_claim("Normal", "VolumeConditionNormal", &note)).await;
            expect_recorded(&mut handle, &on_pod("web-0", "Normal", "VolumeConditionNormal", &note)).await;
            handle
        }
    });
    let reported = reporter.report(&change("vol-1", false, &long)).await;
    let mut handle = server.await.expect("script ran to the end");
    assert_eq!(reported.recorded, 2);
    assert!(reported.errors.is_empty(), "{:?}", reported.errors);
    handle.assert_no_more_requests("no PV list with a ready store");
    drop(writer);
}

#[tokio::test(start_paused = true)]
async fn a_pv_store_that_is_not_ready_yet_is_bypassed_with_a_list() {
    let (client, mut handle) = fake_api();
    let (store, writer) = reflector::store::<PersistentVolume>();
    let reporter = ConditionReporter::new(client, identity()).with_pv_store(store);
    let server = tokio::spawn(async move {
        expect_pv_list(&mut handle).await;
        expect_pod_list(&mut handle, vec![]).await;
        expect_recorded(&mut handle, &on_claim("Warning", "VolumeConditionAbnormal", FAILING)).await;
        handle
    });
    let reported = reporter.report(&change("vol-1", true, FAILING)).await;
    let mut handle = server.await.expect("script ran to the end");
    assert_eq!(reported.recorded, 1);
    handle.assert_no_more_requests("no request beyond the script");
    drop(writer);
}

#[tokio::test(start_paused = true)]
async fn a_volume_whose_pv_has_no_claim_is_reported_on_nothing() {
    let (client, mut handle) = fake_api();
    let reporter = ConditionReporter::new(client, identity());
    let server = tokio::spawn(async move {
        let (_, send) = handle.expect(Method::GET, PV_LIST).await;
        respond(send, &pv_list(vec![bound_pv("pv-1", "vol-1", None)]));
        handle
    });
    let reported = reporter.report(&change("vol-1", true, FAILING)).await;
    let mut handle = server.await.expect("script ran to the end");
    assert_eq!(reported.recorded, 0);
    assert!(reported.errors.is_empty(), "{:?}", reported.errors);
    handle.assert_no_more_requests("no pod list and no Event without a claim");
}

#[tokio::test(start_paused = true)]
async fn a_failed_lookup_and_a_failed_event_are_retried_once_then_dropped() {
    let (client, mut handle) = fake_api();
    let reporter = ConditionReporter::new(client, identity());
    let server = tokio::spawn(async move {
        let (_, send) = handle.expect(Method::GET, PV_LIST).await;
        let failed_at = Instant::now();
        respond_error(send, 500, "etcd timeout");
        expect_pv_list(&mut handle).await;
        assert_eq!(failed_at.elapsed(), RETRY_AFTER, "the lookup is retried after the delay");
        expect_pod_list(&mut handle, vec![local_pod("apps", "web-0", &["data"])]).await;
        let (_, send) = expect_event(&mut handle, &on_claim("Warning", "VolumeConditionAbnormal", FAILING)).await;
        respond_error(send, 500, "events quota exceeded");
        expect_recorded(&mut handle, &on_pod("web-0", "Warning", "VolumeConditionAbnormal", FAILING)).await;
        let failed_at = Instant::now();
        let (_, send) = expect_event(&mut handle, &on_claim("Warning", "VolumeConditionAbnormal", FAILING)).await;
        assert_eq!(failed_at.elapsed(), RETRY_AFTER, "the failed Event is retried after the delay");
        respond_error(send, 500, "events quota exceeded");
        handle
    });
    let reported = reporter.report(&change("vol-1", true, FAILING)).await;
    let mut handle = server.await.expect("script ran to the end");
    assert_eq!(reported.recorded, 1, "the pod's Event went through");
    assert_eq!(reported.errors.len(), 1);
    let error = reported.errors[0].to_string();
    assert!(error.contains("PersistentVolumeClaim apps/data") && error.contains("vol-1"), "{error}");
    tokio::time::sleep(RETRY_AFTER * 10).await;
    handle.assert_no_more_requests("one retry only");
}

#[tokio::test(start_paused = true)]
async fn a_lookup_failing_twice_gives_up_with_the_error() {
    let (client, mut handle) = fake_api();
    let reporter = ConditionReporter::new(client, identity());
    let server = tokio::spawn(async move {
        for _ in 0..2 {
            let (_, send) = handle.expect(Method::GET, PV_LIST).await;
            respond_error(send, 500, "etcd timeout");
        }
        handle
    });
    let reported = reporter.report(&change("vol-1", true, FAILING)).await;
    let mut handle = server.await.expect("script ran to the end");
    assert_eq!(reported.recorded, 0);
    assert!(
        matches!(&reported.errors[..], [EventsError::ListPersistentVolumes { volume_id, .. }] if volume_id == "vol-1"),
        "{:?}",
        reported.errors
    );
    tokio::time::sleep(RETRY_AFTER * 10).await;
    handle.assert_no_more_requests("one retry only");
}

/// The actor in a paused-clock actix system: the first change is reported at once, a
/// flap inside the window ends with the final state reported when the window ends.
#[test]
fn the_actor_reports_at_once_then_the_final_state_when_the_window_ends() {
    use actix::Actor;

    let runtime = || {
        tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().expect("tokio runtime")
    };
    let system = actix_rt::System::with_tokio_rt(runtime);
    system.block_on(async {
        let (client, mut handle) = fake_api();
        let window = Duration::from_secs(60);
        let actor = ConditionEvents::new(ConditionReporter::new(client, identity()), window).start();
        let start = Instant::now();

        actor.do_send(change("vol-1", true, FAILING));
        expect_pv_list(&mut handle).await;
        expect_pod_list(&mut handle, vec![]).await;
        expect_recorded(&mut handle, &on_claim("Warning", "VolumeConditionAbnormal", FAILING)).await;
        assert_eq!(start.elapsed(), Duration::ZERO, "the first change goes out at once");

        // Inside the window: normal, abnormal again, normal. Only the last counts.
        tokio::time::sleep(Duration::from_secs(10)).await;
        actor.do_send(change("vol-1", false, "volume is healthy"));
        actor.do_send(change("vol-1", true, FAILING));
        actor.do_send(change("vol-1", false, "volume is healthy"));
        tokio::time::sleep(Duration::from_secs(49)).await;
        assert!(handle.is_quiet(), "nothing before the window ends");

        let report = tokio::time::timeout(window, expect_pv_list(&mut handle)).await;
        assert!(report.is_ok(), "no report when the window ended");
        assert_eq!(start.elapsed(), window, "the held state goes out when the window ends");
        expect_pod_list(&mut handle, vec![]).await;
        expect_recorded(&mut handle, &on_claim("Normal", "VolumeConditionNormal", "volume is healthy")).await;

        // A flap back to what was reported last inside the next window says nothing.
        actor.do_send(change("vol-1", true, FAILING));
        actor.do_send(change("vol-1", false, "volume is healthy"));
        tokio::time::sleep(window * 3).await;
        handle.assert_no_more_requests("a flap back to the reported state");
        actix_rt::System::current().stop();
    });
}
