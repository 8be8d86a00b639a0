//! The `Drive` sync against the scripted fake API server (`super::fake_api`): the
//! executor's exact requests for a list, an apply, a status apply and a delete, and the
//! `DriveSync` actor's timing (first scan, debounce, backoff, resync) with stand-in
//! inventory and volume manager actors answering its queries.
//!
//! Rules: as in `fake_api_tests`: every request is checked for method, whole path with
//! query, and body; no request may come that the script does not expect; time is paused,
//! so delays are asserted exactly.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use http::Method;
use kube::{Client, ResourceExt};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::actor::*;
use super::desired::desired;
use super::error::DrivesError;
use super::executor::Executor;
use super::fixtures::*;
use super::names::object_name;
use super::plan::{plan, SyncAction};
use super::sync::Sources;
use crate::k8s::crd;
use crate::k8s::shell::RetryPolicy;
use crate::k8s::fake_api::{fake_api, list_of, respond, respond_error, FakeApi, Reply};

use crate::actors::inventory::model::{Drive, DriveHealth};
use crate::actors::messages::{DriveEvent, GetInventoryStatus, InventoryStatus, ListDrives, SubscribeDrives};
use crate::actors::volumes::{SubscribeVolumes, VolumesChanged};
use crate::actors::volumes::model::{VolumeRecord, VolumeState};
use crate::actors::volumes::{DriveView, GetDriveView};
use crate::actors::volumes::{CordonDrive, EvacuateDrive, Evacuation, PendingMove, PendingState, ReleaseDrive, VolumeError};
use crate::words::{DriveClass, DriveUse, DriveUseState, Evacuate, Health};

const LIST_PATH: &str = "/apis/drivelet.io/v1alpha1/drives?&labelSelector=drivelet.io%2Fnode%3Dnode-a";

fn apply_path(name: &str) -> String {
    format!("/apis/drivelet.io/v1alpha1/drives/{name}?&force=true&fieldManager=drivelet")
}

fn status_path(name: &str) -> String {
    format!("/apis/drivelet.io/v1alpha1/drives/{name}/status?&force=true&fieldManager=drivelet")
}

fn delete_path(name: &str) -> String {
    format!("/apis/drivelet.io/v1alpha1/drives/{name}?")
}

/// Wait for the next request, check it is a server-side apply (method, path, content
/// type), return its JSON body.
async fn expect_apply(handle: &mut FakeApi, path: &str) -> (Value, Reply) {
    let call = handle.next("the sync made no request").await;
    assert_eq!(call.method, Method::PATCH, "method of {}", call.uri);
    assert_eq!(call.uri, path);
    let content_type = call.headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    assert_eq!(content_type, Some("application/apply-patch+yaml"), "server-side apply of {path}");
    (call.body, call.reply)
}

fn drive_list(items: &[crd::Drive]) -> Value {
    list_of("Drive", "drivelet.io/v1alpha1", "100", items.iter().map(|d| json!(d)).collect())
}

/// `obj` as the API server returns it.
fn served(obj: &crd::Drive) -> crd::Drive {
    let mut obj = obj.clone();
    obj.metadata.resource_version = Some("42".into());
    obj.metadata.uid = Some(format!("uid-{}", obj.name_any()));
    obj
}

fn managed() -> Drive {
    drive("wwn-a", DriveClass::Managed, "blank")
}

/// The apply body of `managed()`'s object.
fn managed_apply_body() -> Value {
    json!({
        "apiVersion": "drivelet.io/v1alpha1",
        "kind": "Drive",
        "metadata": { "name": "node-a-wwn-a-72896ad9", "labels": { "drivelet.io/node": "node-a" } },
        "spec": {
            "node": "node-a",
            "driveId": "wwn-a",
            "serial": "SN-wwn-a",
            "model": "Samsung SSD 870",
            "sizeBytes": 1u64 << 40,
            "size": "1.0 TiB",
            "media": "ssd",
        },
    })
}

/// The status apply body of `managed()`'s object with this health.
fn managed_status_body(health: &str, reason: &str) -> Value {
    json!({
        "apiVersion": "drivelet.io/v1alpha1",
        "kind": "Drive",
        "metadata": { "name": "node-a-wwn-a-72896ad9" },
        "status": {
            "class": "managed",
            "classReason": "blank",
            "health": health,
            "healthReason": reason,
            "usage": "active",
            "presence": "present",
            "freeBytes": 0,
            "freeSlots": 255,
        },
    })
}

const PASSED: &str = "SMART overall-health passed";

#[tokio::test(start_paused = true)]
async fn executor_lists_by_node_label_then_applies_a_new_object_and_its_status() {
    let (client, mut handle) = fake_api();
    let executor = Executor::new(client, NODE);
    let obj = object_of(&managed());
    assert_eq!(obj.name_any(), "node-a-wwn-a-72896ad9");

    let server = tokio::spawn(async move {
        let (body, send) = handle.expect(Method::GET, LIST_PATH).await;
        assert_eq!(body, Value::Null);
        respond(send, &drive_list(&[]));
        let (body, send) = expect_apply(&mut handle, &apply_path("node-a-wwn-a-72896ad9")).await;
        assert_eq!(body, managed_apply_body());
        respond(send, &served(&object_of(&managed())));
        let (body, send) = expect_apply(&mut handle, &status_path("node-a-wwn-a-72896ad9")).await;
        assert_eq!(body, managed_status_body("good", PASSED));
        respond(send, &served(&object_of(&managed())));
        handle
    });

    let existing = executor.list(NODE).await.expect("lists");
    let actions = plan(NODE, std::slice::from_ref(&obj), &existing);
    assert_eq!(actions, vec![SyncAction::Apply(Box::new(obj))]);
    executor.execute(&actions).await.expect("applies");
    let mut handle = server.await.expect("script ran to the end");
    handle.assert_no_more_requests("no request beyond the script");
}

#[tokio::test(start_paused = true)]
async fn executor_applies_only_the_status_when_only_the_status_changed() {
    let (client, mut handle) = fake_api();
    let executor = Executor::new(client, NODE);
    let mut failing = managed();
    failing.health = DriveHealth { health: Health::Bad, reason: "SMART overall-health failed".into(), checked_unix: 2, smart: Default::default() };
    let actions = plan(NODE, &[object_of(&failing)], &[served(&object_of(&managed()))]);
    assert!(matches!(actions.as_slice(), [SyncAction::ApplyStatus(_)]), "{actions:?}");

    let server = tokio::spawn(async move {
        let (body, send) = expect_apply(&mut handle, &status_path("node-a-wwn-a-72896ad9")).await;
        assert_eq!(body, managed_status_body("bad", "SMART overall-health failed"));
        respond(send, &served(&object_of(&failing)));
        handle
    });
    executor.execute(&actions).await.expect("applies the status");
    let mut handle = server.await.expect("script ran to the end");
    handle.assert_no_more_requests("no apply of the unchanged spec");
}

#[tokio::test(start_paused = true)]
async fn executor_deletes_stale_objects_and_one_already_gone_is_no_error() {
    let (client, mut handle) = fake_api();
    let executor = Executor::new(client, NODE);
    let stale = served(&object_of(&drive("wwn-old", DriveClass::Foreign, "has a filesystem")));
    let gone = served(&object_of(&drive("wwn-gone", DriveClass::Foreign, "has a filesystem")));
    let other = served(&desired("node-b", &[drive("wwn-b", DriveClass::Managed, "blank")], &[], &[]).remove(0));
    let actions = plan(NODE, &[], &[stale.clone(), gone.clone(), other]);
    assert_eq!(actions, vec![SyncAction::Delete(gone.name_any()), SyncAction::Delete(stale.name_any())]);

    let server = tokio::spawn({
        let (stale, gone) = (stale.clone(), gone.clone());
        async move {
            let (_, send) = handle.expect(Method::DELETE, &delete_path(&gone.name_any())).await;
            respond_error(send, 404, "drives.drivelet.io \"node-a-wwn-gone\" not found");
            let (body, send) = handle.expect(Method::DELETE, &delete_path(&stale.name_any())).await;
            assert_eq!(body, json!({}));
            respond(send, &stale);
            handle
        }
    });
    executor.execute(&actions).await.expect("deletes");
    let mut handle = server.await.expect("script ran to the end");
    handle.assert_no_more_requests("the other node's object is not touched");
}

#[tokio::test(start_paused = true)]
async fn a_failed_apply_stops_before_its_status_and_the_rest() {
    let (client, mut handle) = fake_api();
    let executor = Executor::new(client, NODE);
    let stale = served(&object_of(&drive("wwn-old", DriveClass::Foreign, "has a filesystem")));
    let actions = plan(NODE, &[object_of(&managed())], std::slice::from_ref(&stale));
    assert_eq!(actions.len(), 2, "{actions:?}");

    let server = tokio::spawn(async move {
        let (_, send) = expect_apply(&mut handle, &apply_path("node-a-wwn-a-72896ad9")).await;
        respond_error(send, 500, "etcdserver: request timed out");
        handle
    });
    let err = executor.execute(&actions).await.expect_err("the apply fails");
    assert!(matches!(&err, DrivesError::Apply { name, .. } if name == "node-a-wwn-a-72896ad9"), "{err}");
    assert!(err.to_string().starts_with("applying Drive node-a-wwn-a-72896ad9: "), "{err}");
    let mut handle = server.await.expect("script ran to the end");
    handle.assert_no_more_requests("nothing after a failed write");
}

/// What the stand-in inventory and volume manager answer.
#[derive(Default)]
struct World {
    scanned: bool,
    ready: bool,
    drives: Vec<Drive>,
    volumes: Vec<VolumeRecord>,
    subscriber: Option<Recipient<DriveEvent>>,
    volume_subscriber: Option<Recipient<VolumesChanged>>,
    uses: Vec<DriveUse>,
    /// The drive commands the stand-in volume manager was sent, in order.
    asked: Vec<String>,
    /// Where the evacuations stand.
    evacuations: Vec<Evacuation>,
    /// The refusal of an evacuation, when there is one.
    evacuation_refusal: Option<String>,
}

type Shared = Arc<Mutex<World>>;

struct FakeInventory(Shared);

impl Actor for FakeInventory {
    type Context = Context<Self>;
}

impl Handler<GetInventoryStatus> for FakeInventory {
    type Result = InventoryStatus;
    fn handle(&mut self, _: GetInventoryStatus, _: &mut Context<Self>) -> InventoryStatus {
        let world = self.0.lock().expect("world lock");
        InventoryStatus { scanned: world.scanned, drives: world.drives.len() }
    }
}

impl Handler<ListDrives> for FakeInventory {
    type Result = Vec<Drive>;
    fn handle(&mut self, _: ListDrives, _: &mut Context<Self>) -> Vec<Drive> {
        self.0.lock().expect("world lock").drives.clone()
    }
}

impl Handler<crate::actors::messages::AdoptDrive> for FakeInventory {
    type Result = Result<crate::actors::messages::Adopted, String>;
    fn handle(&mut self, m: crate::actors::messages::AdoptDrive, _: &mut Context<Self>) -> Self::Result {
        let mut world = self.0.lock().expect("world lock");
        world.asked.push(format!("adopt {}", m.drive_id));
        let d = world.drives.iter_mut().find(|d| d.id == m.drive_id).ok_or_else(|| format!("there is no drive {} on this node", m.drive_id))?;
        d.class = crate::words::DriveClass::Managed;
        d.reason = "carries a drivelet GPT".into();
        d.owner = crate::words::DriveOwner::Ours;
        Ok(crate::actors::messages::Adopted { drive_id: m.drive_id, from: "node node-2 of this cluster".into(), volumes: vec![], already: false })
    }
}

impl Handler<SubscribeDrives> for FakeInventory {
    type Result = ();
    fn handle(&mut self, m: SubscribeDrives, _: &mut Context<Self>) {
        self.0.lock().expect("world lock").subscriber = Some(m.0);
    }
}

struct FakeVolumes(Shared);

impl Actor for FakeVolumes {
    type Context = Context<Self>;
}

impl Handler<GetDriveView> for FakeVolumes {
    type Result = MessageResult<GetDriveView>;
    fn handle(&mut self, _: GetDriveView, _: &mut Context<Self>) -> Self::Result {
        let world = self.0.lock().expect("world lock");
        if !world.ready {
            return MessageResult(DriveView::default());
        }
        MessageResult(DriveView {
            ready: true,
            uses: world.uses.clone(),
            volumes: world.volumes.clone(),
            evacuations: world.evacuations.clone(),
            ..Default::default()
        })
    }
}

impl Handler<CordonDrive> for FakeVolumes {
    type Result = Result<Option<DriveUse>, VolumeError>;
    fn handle(&mut self, m: CordonDrive, _: &mut Context<Self>) -> Self::Result {
        let mut world = self.0.lock().expect("world lock");
        world.asked.push(format!("cordon {} {}", m.drive_id, m.cordon));
        world.uses.retain(|u| u.drive_id != m.drive_id);
        if !m.cordon {
            return Ok(None);
        }
        let u = DriveUse { drive_id: m.drive_id, state: DriveUseState::Cordoned, reason: "cordoned by an admin".into(), requested: true, evacuate: None };
        world.uses.push(u.clone());
        Ok(Some(u))
    }
}

impl Handler<ReleaseDrive> for FakeVolumes {
    type Result = Result<DriveUse, VolumeError>;
    fn handle(&mut self, m: ReleaseDrive, _: &mut Context<Self>) -> Self::Result {
        let mut world = self.0.lock().expect("world lock");
        world.asked.push(format!("release {}", m.drive_id));
        Err(VolumeError::InvalidArgument { reason: format!("no drive with id {} is known on this node", m.drive_id) })
    }
}

impl Handler<EvacuateDrive> for FakeVolumes {
    type Result = Result<Evacuation, VolumeError>;
    fn handle(&mut self, m: EvacuateDrive, _: &mut Context<Self>) -> Self::Result {
        let mut world = self.0.lock().expect("world lock");
        world.asked.push(format!("evacuate {} {}", m.drive_id, m.force));
        if let Some(why) = world.evacuation_refusal.clone() {
            return Err(VolumeError::ResourceExhausted { reason: why });
        }
        world.uses.retain(|u| u.drive_id != m.drive_id);
        world.uses.push(DriveUse {
            drive_id: m.drive_id.clone(),
            state: DriveUseState::Releasing,
            reason: "evacuation requested: its volumes move to other drives of this node".into(),
            requested: true,
            evacuate: Some(Evacuate { force: m.force }),
        });
        let pending = world
            .volumes
            .iter()
            .filter(|r| r.drive_id == m.drive_id)
            .map(|r| PendingMove { volume_id: r.id.clone(), name: r.name.clone(), state: PendingState::Queued, reason: "moves when its turn comes".into() })
            .collect();
        let e = Evacuation { drive_id: m.drive_id, force: m.force, moved: vec![], pending, done: false };
        world.evacuations.retain(|x| x.drive_id != e.drive_id);
        world.evacuations.push(e.clone());
        Ok(e)
    }
}

impl Handler<SubscribeVolumes> for FakeVolumes {
    type Result = ();
    fn handle(&mut self, m: SubscribeVolumes, _: &mut Context<Self>) {
        self.0.lock().expect("world lock").volume_subscriber = Some(m.0);
    }
}

const RESYNC: Duration = Duration::from_secs(60);

/// Starts a `DriveSync` fed by stand-ins over `world` (inside a `LocalSet`).
fn start_sync(client: Client, world: &Shared) -> Addr<DriveSync> {
    let inventory = FakeInventory(world.clone()).start();
    let volumes = FakeVolumes(world.clone()).start();
    let sources = Sources {
        inventory_status: inventory.clone().recipient(),
        drives: inventory.clone().recipient(),
        adopt: inventory.clone().recipient(),
        subscribe: inventory.recipient(),
        subscribe_volumes: volumes.clone().recipient(),
        view: volumes.clone().recipient(),
        cordon: volumes.clone().recipient(),
        release: volumes.clone().recipient(),
        evacuate: volumes.recipient(),
    };
    DriveSync::with_sources(client, NODE.to_string(), sources, RESYNC).start()
}

fn world(scanned: bool, drives: Vec<Drive>) -> Shared {
    Arc::new(Mutex::new(World { scanned, ready: true, drives, ..Default::default() }))
}

#[tokio::test(start_paused = true)]
async fn drive_sync_waits_for_the_first_scan_then_creates_and_deletes() {
    tokio::task::LocalSet::new()
        .run_until(async {
            let (client, mut handle) = fake_api();
            let world = world(false, vec![managed()]);
            let _sync = start_sync(client, &world);

            tokio::time::sleep(Duration::from_millis(2500)).await;
            handle.assert_no_more_requests("no API call before the inventory's first scan");
            assert!(world.lock().expect("world lock").subscriber.is_some(), "subscribed to drive events");

            world.lock().expect("world lock").scanned = true;
            let scanned_at = Instant::now();
            let stale = served(&object_of(&drive("wwn-old", DriveClass::Foreign, "has a filesystem")));
            let other = served(&desired("node-b", &[drive("wwn-b", DriveClass::Managed, "blank")], &[], &[]).remove(0));
            let (_, send) = handle.expect(Method::GET, LIST_PATH).await;
            assert_eq!(scanned_at.elapsed(), Duration::from_millis(500), "asked again on the next one-second poll");
            respond(send, &drive_list(&[stale.clone(), other]));
            let (body, send) = expect_apply(&mut handle, &apply_path("node-a-wwn-a-72896ad9")).await;
            assert_eq!(body, managed_apply_body());
            respond(send, &served(&object_of(&managed())));
            let (body, send) = expect_apply(&mut handle, &status_path("node-a-wwn-a-72896ad9")).await;
            assert_eq!(body, managed_status_body("good", PASSED));
            respond(send, &served(&object_of(&managed())));
            let (_, send) = handle.expect(Method::DELETE, &delete_path(&stale.name_any())).await;
            respond(send, &stale);

            tokio::time::sleep(RESYNC / 2).await;
            handle.assert_no_more_requests("nothing more until the resync");
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_drive_events_is_one_sync_after_the_debounce() {
    tokio::task::LocalSet::new()
        .run_until(async {
            let (client, mut handle) = fake_api();
            let world = world(true, vec![managed()]);
            let _sync = start_sync(client, &world);
            let (_, send) = handle.expect(Method::GET, LIST_PATH).await;
            respond(send, &drive_list(&[served(&object_of(&managed()))]));

            tokio::time::sleep(Duration::from_secs(5)).await;
            handle.assert_no_more_requests("an object in step is not written");

            let mut failing = managed();
            failing.health = DriveHealth { health: Health::Bad, reason: "SMART overall-health failed".into(), checked_unix: 2, smart: Default::default() };
            let subscriber = {
                let mut w = world.lock().expect("world lock");
                w.drives = vec![failing.clone()];
                w.subscriber.clone().expect("subscribed")
            };
            let first_event = Instant::now();
            for _ in 0..3 {
                subscriber.do_send(DriveEvent::DriveChanged { old: managed(), new: failing.clone() });
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let (_, send) = handle.expect(Method::GET, LIST_PATH).await;
            assert_eq!(first_event.elapsed(), DEBOUNCE, "one sync, the debounce after the first event");
            respond(send, &drive_list(&[served(&object_of(&managed()))]));
            let (body, send) = expect_apply(&mut handle, &status_path("node-a-wwn-a-72896ad9")).await;
            assert_eq!(body, managed_status_body("bad", "SMART overall-health failed"));
            respond(send, &served(&object_of(&failing)));

            tokio::time::sleep(Duration::from_secs(5)).await;
            handle.assert_no_more_requests("three events, one sync");
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_sync_is_retried_with_exponential_backoff_then_resyncs_on_schedule() {
    tokio::task::LocalSet::new()
        .run_until(async {
            let (client, mut handle) = fake_api();
            let world = world(true, vec![managed()]);
            let started = Instant::now();
            let _sync = start_sync(client, &world);

            let (_, send) = handle.expect(Method::GET, LIST_PATH).await;
            respond_error(send, 500, "etcdserver: request timed out");
            let failed_at = Instant::now();
            let (_, send) = handle.expect(Method::GET, LIST_PATH).await;
            assert_eq!(failed_at.elapsed(), RetryPolicy::default().base, "first retry after the base delay");
            respond_error(send, 500, "etcdserver: request timed out");
            let failed_at = Instant::now();
            let (_, send) = handle.expect(Method::GET, LIST_PATH).await;
            assert_eq!(failed_at.elapsed(), RetryPolicy::default().base * 2, "second retry after twice the base delay");
            respond(send, &drive_list(&[served(&object_of(&managed()))]));

            let (_, send) = handle.expect(Method::GET, LIST_PATH).await;
            assert_eq!(started.elapsed(), RESYNC, "the periodic resync");
            respond(send, &drive_list(&[served(&object_of(&managed()))]));
            tokio::time::sleep(Duration::from_secs(1)).await;
            handle.assert_no_more_requests("nothing to write");
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn volume_changes_are_synced_after_the_debounce_and_a_missing_drive_goes_with_its_last_volume() {
    tokio::task::LocalSet::new()
        .run_until(async {
            let (client, mut handle) = fake_api();
            // wwn-gone was pulled while two volumes lived on it.
            let world = world(true, vec![managed()]);
            let (one, two) = (volume(1, "wwn-gone", VolumeState::Published), volume(2, "wwn-gone", VolumeState::Available));
            world.lock().expect("world lock").volumes = vec![one.clone(), two.clone()];
            let in_step = |volumes: &[VolumeRecord]| -> Vec<crd::Drive> {
                desired(NODE, &[managed()], &[], volumes).iter().map(served).collect()
            };
            let _sync = start_sync(client, &world);
            let (_, send) = handle.expect(Method::GET, LIST_PATH).await;
            respond(send, &drive_list(&in_step(&[one.clone(), two.clone()])));
            // A published volume: the pods of the node are looked up.
            let (_, send) = handle.expect(Method::GET, PODS_PATH).await;
            respond(send, &list_of("Pod", "v1", "7", vec![]));
            tokio::time::sleep(Duration::from_secs(5)).await;
            handle.assert_no_more_requests("objects in step are not written");

            // One volume is deleted: the missing drive's object lists only the other.
            let subscriber = {
                let mut w = world.lock().expect("world lock");
                w.volumes = vec![two.clone()];
                w.volume_subscriber.clone().expect("subscribed to volume changes")
            };
            let deleted_at = Instant::now();
            subscriber.do_send(VolumesChanged { drive_id: "wwn-gone".into() });
            let (_, send) = handle.expect(Method::GET, LIST_PATH).await;
            assert_eq!(deleted_at.elapsed(), DEBOUNCE, "synced the debounce after the change, not at the resync");
            respond(send, &drive_list(&in_step(&[one.clone(), two.clone()])));
            let gone = object_name(NODE, "wwn-gone");
            let (body, send) = expect_apply(&mut handle, &status_path(&gone)).await;
            assert_eq!(body["status"]["volumes"], json!([two.id]));
            assert_eq!(body["status"]["presence"], "missing");
            respond(send, &in_step(std::slice::from_ref(&two))[1]);

            // The last live volume goes, in a burst with another change: the object goes, once.
            world.lock().expect("world lock").volumes.clear();
            let deleted_at = Instant::now();
            subscriber.do_send(VolumesChanged { drive_id: "wwn-gone".into() });
            subscriber.do_send(VolumesChanged { drive_id: "wwn-m".into() });
            let (_, send) = handle.expect(Method::GET, LIST_PATH).await;
            assert_eq!(deleted_at.elapsed(), DEBOUNCE);
            respond(send, &drive_list(&in_step(std::slice::from_ref(&two))));
            let (_, send) = handle.expect(Method::DELETE, &delete_path(&gone)).await;
            respond(send, &in_step(std::slice::from_ref(&two))[1]);

            tokio::time::sleep(Duration::from_secs(5)).await;
            handle.assert_no_more_requests("one sync per burst");
        })
        .await;
}

/// The status apply of `managed()`'s object with an admin's action: `usage` and the
/// `ActionComplete` condition.
fn action_status_body(usage: &str, usage_reason: Option<&str>, done: &str, reason: &str, message: &str, at: &str) -> Value {
    let mut body = managed_status_body("good", PASSED);
    let status = body["status"].as_object_mut().expect("status");
    status.insert("usage".into(), json!(usage));
    if let Some(r) = usage_reason {
        status.insert("usageReason".into(), json!(r));
    }
    status.insert(
        "conditions".into(),
        json!([{
            "type": "ActionComplete",
            "status": done,
            "reason": reason,
            "message": message,
            "observedGeneration": 2,
            "lastTransitionTime": at,
        }]),
    );
    body
}

#[tokio::test(start_paused = true)]
async fn a_cordon_in_the_spec_is_carried_out_reported_in_the_status_and_told_in_an_event_once() {
    tokio::task::LocalSet::new()
        .run_until(async {
            let (client, mut handle) = fake_api();
            let world = world(true, vec![managed()]);
            let _sync = start_sync(client, &world);

            // The admin's object: the agent's hardware spec plus their action.
            let mut asked = served(&object_of(&managed()));
            asked.spec.action = Some(crd::DriveAction::Cordon);
            asked.metadata.generation = Some(2);
            let (_, send) = handle.expect(Method::GET, LIST_PATH).await;
            respond(send, &drive_list(&[asked.clone()]));
            // The spec is not applied again (the admin's action is no difference of
            // ours), only the status, with the cordon done and its condition.
            let call = handle.next("the status apply").await;
            assert_eq!(call.uri, status_path("node-a-wwn-a-72896ad9"));
            let at = call.body["status"]["conditions"][0]["lastTransitionTime"].as_str().expect("a transition time").to_string();
            let message = "drive wwn-a takes no new volumes; it holds no volume, served as before";
            assert_eq!(call.body, action_status_body("cordoned", Some("cordoned by an admin"), "True", "Cordoned", message, &at));
            let mut now = asked.clone();
            now.status = serde_json::from_value(call.body["status"].clone()).expect("a status");
            respond(call.reply, &now);
            let (event, send) = handle.expect_path(Method::POST, "/apis/events.k8s.io/v1/namespaces/default/events").await;
            assert_eq!((event["reason"].as_str(), event["type"].as_str()), (Some("Cordoned"), Some("Normal")));
            assert_eq!(event["note"].as_str(), Some(message));
            assert_eq!(event["regarding"]["name"].as_str(), Some("node-a-wwn-a-72896ad9"));
            assert_eq!(event["reportingInstance"].as_str(), Some("node-a"));
            respond(send, &event);
            assert_eq!(world.lock().expect("world lock").asked, ["cordon wwn-a true"]);

            // The next sync finds it done: nothing asked, nothing written, no Event.
            tokio::time::sleep(RESYNC).await;
            let (_, send) = handle.expect(Method::GET, LIST_PATH).await;
            respond(send, &drive_list(&[now.clone()]));
            tokio::time::sleep(Duration::from_secs(1)).await;
            handle.assert_no_more_requests("a done action writes nothing");
            assert_eq!(world.lock().expect("world lock").asked.len(), 1, "asked once");

            // The admin asks for a release the volume manager refuses: a Warning.
            let mut release = now.clone();
            release.spec.action = Some(crd::DriveAction::Release);
            release.metadata.generation = Some(3);
            tokio::time::sleep(RESYNC).await;
            let (_, send) = handle.expect(Method::GET, LIST_PATH).await;
            respond(send, &drive_list(&[release]));
            let call = handle.next("the status apply").await;
            let c = &call.body["status"]["conditions"][0];
            assert_eq!((c["status"].as_str(), c["reason"].as_str(), c["observedGeneration"].as_i64()), (Some("False"), Some("Refused"), Some(3)));
            assert_eq!(
                c["message"].as_str(),
                Some("drive wwn-a could not be asked to release: no drive with id wwn-a is known on this node")
            );
            respond(call.reply, &now);
            let (event, send) = handle.expect_path(Method::POST, "/apis/events.k8s.io/v1/namespaces/default/events").await;
            assert_eq!((event["reason"].as_str(), event["type"].as_str(), event["action"].as_str()), (Some("Refused"), Some("Warning"), Some("Release")));
            respond(send, &event);
        })
        .await;
}

const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

/// Three times the 5 s the sync polled at while a drive was evacuated, before it
/// followed the volume manager's notifications instead.
const NO_POLL: Duration = Duration::from_secs(15);

#[tokio::test(start_paused = true)]
async fn an_evacuation_in_the_spec_is_asked_once_followed_while_it_runs_and_reported_done() {
    tokio::task::LocalSet::new()
        .run_until(async {
            let (client, mut handle) = fake_api();
            let world = world(true, vec![managed()]);
            let vol = volume(1, "wwn-a", VolumeState::Available);
            world.lock().expect("world lock").volumes = vec![vol.clone()];
            let _sync = start_sync(client, &world);

            let mut asked = served(&desired(NODE, &[managed()], &[], std::slice::from_ref(&vol)).remove(0));
            asked.spec.action = Some(crd::DriveAction::Evacuate);
            asked.metadata.generation = Some(2);
            let (_, send) = handle.expect(Method::GET, LIST_PATH).await;
            respond(send, &drive_list(&[asked.clone()]));
            let call = handle.next("the status apply").await;
            assert_eq!(call.uri, status_path("node-a-wwn-a-72896ad9"));
            let st = &call.body["status"];
            assert_eq!(st["usage"], "releasing");
            let c = &st["conditions"][0];
            assert_eq!((c["status"].as_str(), c["reason"].as_str(), c["observedGeneration"].as_i64()), (Some("False"), Some("Evacuating"), Some(2)));
            assert_eq!(c["message"].as_str(), Some("drive wwn-a evacuating: 0 moved, 1 queued"));
            assert_eq!(
                st["evacuation"],
                json!([{ "volume": vol.id, "name": vol.name, "state": "queued", "reason": "moves when its turn comes" }])
            );
            let mut now = asked.clone();
            now.status = serde_json::from_value(st.clone()).expect("a status");
            respond(call.reply, &now);
            let (event, send) = handle.expect_path(Method::POST, EVENTS_PATH).await;
            assert_eq!((event["reason"].as_str(), event["type"].as_str(), event["action"].as_str()), (Some("Evacuating"), Some("Normal"), Some("Evacuate")));
            respond(send, &event);
            assert_eq!(world.lock().expect("world lock").asked, ["evacuate wwn-a false"]);

            // While it runs, synced on each notification of the volume manager (a move
            // started, say), not on a poll; not asked again (the condition answered
            // this generation), nothing written while in step.
            tokio::time::sleep(NO_POLL).await;
            handle.assert_no_more_requests("no poll while it runs");
            let subscriber = world.lock().expect("world lock").volume_subscriber.clone().expect("subscribed");
            let synced = Instant::now();
            subscriber.do_send(VolumesChanged { drive_id: "wwn-a".into() });
            let (_, send) = handle.expect(Method::GET, LIST_PATH).await;
            assert_eq!(synced.elapsed(), DEBOUNCE);
            respond(send, &drive_list(&[now.clone()]));
            tokio::time::sleep(Duration::from_secs(1)).await;
            handle.assert_no_more_requests("in step: nothing written");
            assert_eq!(world.lock().expect("world lock").asked.len(), 1, "asked once");

            // The volume moved: the drive is released, the condition True, one Event.
            let subscriber = {
                let mut w = world.lock().expect("world lock");
                w.volumes.clear();
                w.uses = vec![DriveUse {
                    drive_id: "wwn-a".into(),
                    state: DriveUseState::Released,
                    reason: "evacuated".into(),
                    requested: true,
                    evacuate: Some(Evacuate { force: false }),
                }];
                w.evacuations = vec![Evacuation {
                    drive_id: "wwn-a".into(),
                    force: false,
                    moved: vec![crate::actors::volumes::MovedVolume {
                        volume_id: vol.id.clone(),
                        name: vol.name.clone(),
                        to_drive: "wwn-b".into(),
                        bytes: 1 << 30,
                        millis: 900,
                        unreadable: vec![],
                    }],
                    pending: vec![],
                    done: true,
                }];
                w.volume_subscriber.clone().expect("subscribed")
            };
            subscriber.do_send(VolumesChanged { drive_id: "wwn-a".into() });
            let (_, send) = handle.expect(Method::GET, LIST_PATH).await;
            respond(send, &drive_list(&[now.clone()]));
            let call = handle.next("the status apply").await;
            let st = &call.body["status"];
            assert_eq!(st["usage"], "released");
            let c = &st["conditions"][0];
            assert_eq!((c["status"].as_str(), c["reason"].as_str()), (Some("True"), Some("Evacuated")));
            assert_eq!(c["message"].as_str(), Some("drive wwn-a evacuated: 1 moved; the drive holds no volume and may be pulled"));
            assert_eq!(st["evacuation"][0]["state"], "moved");
            assert_eq!(st["evacuation"][0]["reason"], "on drive wwn-b (1.0 GiB copied and verified)");
            respond(call.reply, &now);
            let (event, send) = handle.expect_path(Method::POST, EVENTS_PATH).await;
            assert_eq!((event["reason"].as_str(), event["type"].as_str()), (Some("Evacuated"), Some("Normal")));
            respond(send, &event);
            tokio::time::sleep(NO_POLL).await;
            handle.assert_no_more_requests("done: no more refreshes");
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn an_evacuation_without_room_is_refused_in_plain_words_with_a_warning_and_asked_again_later() {
    tokio::task::LocalSet::new()
        .run_until(async {
            let (client, mut handle) = fake_api();
            let world = world(true, vec![managed()]);
            let why = "drive wwn-a holds 1 volumes and snapshots; the other open managed drives of this node have no room for 1 of them";
            world.lock().expect("world lock").evacuation_refusal = Some(why.into());
            let _sync = start_sync(client, &world);
            let mut asked = served(&object_of(&managed()));
            asked.spec.action = Some(crd::DriveAction::Evacuate);
            asked.metadata.generation = Some(2);
            let (_, send) = handle.expect(Method::GET, LIST_PATH).await;
            respond(send, &drive_list(&[asked.clone()]));
            let call = handle.next("the status apply").await;
            let c = &call.body["status"]["conditions"][0];
            assert_eq!((c["status"].as_str(), c["reason"].as_str()), (Some("False"), Some("Refused")));
            assert_eq!(c["message"].as_str(), Some(format!("drive wwn-a could not be asked to evacuate: cannot place the volume: {why}").as_str()));
            assert_eq!(call.body["status"]["usage"], "active", "nothing changed");
            let mut now = asked.clone();
            now.status = serde_json::from_value(call.body["status"].clone()).expect("a status");
            respond(call.reply, &now);
            let (event, send) = handle.expect_path(Method::POST, EVENTS_PATH).await;
            assert_eq!((event["reason"].as_str(), event["type"].as_str()), (Some("Refused"), Some("Warning")));
            respond(send, &event);

            // A drive added: the next sync asks again, and it starts.
            world.lock().expect("world lock").evacuation_refusal = None;
            tokio::time::sleep(RESYNC).await;
            let (_, send) = handle.expect(Method::GET, LIST_PATH).await;
            respond(send, &drive_list(&[now.clone()]));
            let call = handle.next("the status apply").await;
            assert_eq!(call.body["status"]["conditions"][0]["reason"], "Evacuating");
            respond(call.reply, &now);
            let (event, send) = handle.expect_path(Method::POST, EVENTS_PATH).await;
            respond(send, &event);
            assert_eq!(world.lock().expect("world lock").asked, ["evacuate wwn-a false", "evacuate wwn-a false"]);
        })
        .await;
}

const PODS_PATH: &str = "/api/v1/pods?&fieldSelector=spec.nodeName%3Dnode-a&resourceVersion=0&resourceVersionMatch=NotOlderThan";

#[tokio::test(start_paused = true)]
async fn the_pods_of_each_volume_are_found_through_claim_and_pv_and_a_failed_lookup_keeps_the_last_answer() {
    let (client, mut handle) = fake_api();
    let executor = Executor::new(client, NODE).with_driver("csi.drivelet.io");
    let pod = |name: &str, claim: &str, phase: &str| {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": name, "namespace": "apps" },
            "spec": { "nodeName": NODE, "containers": [], "volumes": [{ "name": "d", "persistentVolumeClaim": { "claimName": claim } }] },
            "status": { "phase": phase },
        })
    };
    let pvc = json!({ "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": { "name": "data", "namespace": "apps" }, "spec": { "volumeName": "pv-1" } });
    let pv = json!({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": { "name": "pv-1" },
        "spec": { "csi": { "driver": "csi.drivelet.io", "volumeHandle": "vol-1" } },
    });
    let server = tokio::spawn(async move {
        let (_, send) = handle.expect(Method::GET, PODS_PATH).await;
        respond(send, &list_of("Pod", "v1", "7", vec![pod("web-1", "data", "Running"), pod("web-0", "data", "Running"), pod("old", "data", "Succeeded")]));
        let (_, send) = handle.expect(Method::GET, "/api/v1/namespaces/apps/persistentvolumeclaims/data").await;
        respond(send, &pvc);
        let (_, send) = handle.expect(Method::GET, "/api/v1/persistentvolumes/pv-1").await;
        respond(send, &pv);
        // Again: the PV's handle is known, only the claim is read.
        let (_, send) = handle.expect(Method::GET, PODS_PATH).await;
        respond(send, &list_of("Pod", "v1", "8", vec![pod("web-0", "data", "Running")]));
        let (_, send) = handle.expect(Method::GET, "/api/v1/namespaces/apps/persistentvolumeclaims/data").await;
        respond(send, &pvc);
        // A failed lookup.
        let (_, send) = handle.expect(Method::GET, PODS_PATH).await;
        respond_error(send, 403, "pods is forbidden");
        handle
    });
    let want = |pods: &[&str]| std::collections::BTreeMap::from([("vol-1".to_string(), pods.iter().map(|p| p.to_string()).collect::<Vec<_>>())]);
    assert_eq!(executor.pods(NODE).await, want(&["apps/web-0", "apps/web-1"]), "sorted, finished pods left out");
    assert_eq!(executor.pods(NODE).await, want(&["apps/web-0"]));
    assert_eq!(executor.pods(NODE).await, want(&["apps/web-0"]), "the last answer stays");
    server.await.expect("server").assert_no_more_requests("one list, one get per claim, one per new PV");
}

#[tokio::test(start_paused = true)]
async fn an_adoption_in_the_spec_is_asked_of_the_inventory_once_and_reported_adopted() {
    tokio::task::LocalSet::new()
        .run_until(async {
            let (client, mut handle) = fake_api();
            let mut elsewhere = drive("wwn-e", DriveClass::OwnedElsewhere, "belongs to node node-2 of this cluster; holds no volume");
            elsewhere.owner = crate::words::DriveOwner::Elsewhere {
                owner: crate::words::Owner { cluster: "c1".into(), node: "node-2".into() },
                volumes: vec![],
            };
            let world = world(true, vec![elsewhere.clone()]);
            let _sync = start_sync(client, &world);

            let mut asked = served(&object_of(&elsewhere));
            asked.spec.action = Some(crd::DriveAction::Adopt);
            asked.spec.restore_claims = Some(true);
            asked.metadata.generation = Some(2);
            let name = asked.name_any();
            let (_, send) = handle.expect(Method::GET, LIST_PATH).await;
            respond(send, &drive_list(&[asked.clone()]));
            // The drive is managed now: only the status is written, the action is done.
            let call = handle.next("the status apply").await;
            assert_eq!(call.uri, status_path(&name));
            assert_eq!(call.body["status"]["class"], "managed");
            assert!(call.body["status"].get("owner").is_none(), "this node's drive has no other owner");
            let c = &call.body["status"]["conditions"][0];
            assert_eq!((c["status"].as_str(), c["reason"].as_str(), c["observedGeneration"].as_i64()), (Some("True"), Some("Adopted"), Some(2)));
            assert_eq!(c["message"].as_str(), Some("drive wwn-e belongs to this node: it holds no volume"));
            let mut now = asked.clone();
            now.status = serde_json::from_value(call.body["status"].clone()).expect("a status");
            respond(call.reply, &now);
            let (event, send) = handle.expect_path(Method::POST, EVENTS_PATH).await;
            assert_eq!((event["reason"].as_str(), event["type"].as_str(), event["action"].as_str()), (Some("Adopted"), Some("Normal"), Some("Adopt")));
            respond(send, &event);
            assert_eq!(world.lock().expect("world lock").asked, ["adopt wwn-e"]);

            // The next sync finds it this node's: nothing asked, nothing written.
            tokio::time::sleep(RESYNC).await;
            let (_, send) = handle.expect(Method::GET, LIST_PATH).await;
            respond(send, &drive_list(&[now]));
            tokio::time::sleep(Duration::from_secs(1)).await;
            handle.assert_no_more_requests("an adopted drive writes nothing");
            assert_eq!(world.lock().expect("world lock").asked.len(), 1, "asked once");
        })
        .await;
}
