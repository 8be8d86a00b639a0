//! The cluster duties against the scripted fake API server (`crate::k8s::fake_api`): the
//! election's exact Lease requests (create, renew, follow, take over once expired, lose a
//! race, give up), a leader's round for a deleted node, a node the list lacks but a GET
//! finds (nothing done), and a returning node's clean-up of its removed volumes.
//!
//! Rules: as in the other fake API tests: every request is checked for method and path
//! (and body where it is the point); no request may come that the script does not expect;
//! time is paused, so lease expiry is exact.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::Method;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{json, Value};

use super::controller::Controller;
use crate::k8s::relay::controller::lock;
use crate::k8s::relay::view::View;
use super::election::LEASE_NAME;
use super::returned::{reconcile_once, RemovedBackend};
use crate::actors::volumes::VolumeError;
use crate::k8s::shell::Ready;
use crate::k8s::KubeError;
use super::tests::*;
use super::{PROVISIONER_FINALIZER, REMOVED_VOLUMES, WARNED};
use crate::k8s::fake_api::{fake_api, fake_api_serving, list_of, respond, respond_error, respond_not_found, FakeApi, Script};
use kube::runtime::watcher::Event;
use crate::k8s::identity::{Identity, REPORTER};

const NS: &str = "drivelet-system";
const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/drivelet-system/leases/drivelet-cluster-duties";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/drivelet-system/leases";
const CM: &str = "/api/v1/namespaces/drivelet-system/configmaps/drivelet-removed-volumes";
const CMS: &str = "/api/v1/namespaces/drivelet-system/configmaps";

fn identity(node: &str) -> Identity {
    Identity { driver: DRIVER.into(), node: node.into() }
}

fn lease(holder: Option<&str>, rv: &str) -> Lease {
    Lease {
        metadata: ObjectMeta { name: Some(LEASE_NAME.into()), namespace: Some(NS.into()), resource_version: Some(rv.into()), ..Default::default() },
        spec: Some(LeaseSpec { holder_identity: holder.map(String::from), lease_duration_seconds: Some(15), ..Default::default() }),
    }
}

/// The Lease a write asks for, answered as stored with resourceVersion `rv`.
fn stored(body: &Value, rv: &str) -> Value {
    let mut body = body.clone();
    body["metadata"]["resourceVersion"] = json!(rv);
    body
}

async fn expect_lease_get(api: &mut FakeApi, answer: Option<&Lease>) {
    let (_, reply) = api.expect_path(Method::GET, LEASE).await;
    match answer {
        Some(l) => respond(reply, l),
        None => respond_not_found(reply, "leases.coordination.k8s.io \"drivelet-cluster-duties\" not found"),
    }
}

/// The Lease watch shows `lease` (listed: `None` when there is none).
fn see(c: &mut Controller, lease: Option<&Lease>) {
    c.lease_event(Event::Init);
    if let Some(l) = lease {
        c.lease_event(Event::InitApply(l.clone()));
    }
    c.lease_event(Event::InitDone);
}

#[tokio::test(start_paused = true)]
async fn nothing_is_decided_before_the_lease_watch_has_listed() {
    let (client, mut api) = fake_api();
    let mut c = Controller::new(client, identity("n1"), NS.into());
    c.elect().await.unwrap();
    assert!(!c.leading());
    api.assert_no_more_requests("the Lease is not known yet: no write");
}

#[tokio::test(start_paused = true)]
async fn the_first_candidate_creates_the_lease_leads_and_renews_it() {
    let (client, mut api) = fake_api();
    let mut c = Controller::new(client, identity("n1"), NS.into());
    let server = tokio::spawn(async move {
        let (body, reply) = api.expect_path(Method::POST, LEASES).await;
        assert_eq!(body["metadata"]["name"], LEASE_NAME);
        assert_eq!(body["spec"]["holderIdentity"], "n1");
        assert_eq!(body["spec"]["leaseDurationSeconds"], 15);
        assert_eq!(body["spec"]["leaseTransitions"], 0);
        assert!(body["spec"]["renewTime"].is_string() && body["spec"]["acquireTime"].is_string());
        respond(reply, &stored(&body, "2"));

        let (body, reply) = api.expect_path(Method::PUT, LEASE).await;
        assert_eq!(body["spec"]["holderIdentity"], "n1");
        assert_eq!(body["metadata"]["resourceVersion"], "2", "the renewal is guarded by what was written");
        respond(reply, &stored(&body, "3"));
        api
    });
    see(&mut c, None);
    c.elect().await.unwrap();
    assert!(c.leading());
    tokio::time::advance(Duration::from_secs(5)).await;
    c.elect().await.unwrap();
    assert!(c.leading());
    tokio::time::advance(Duration::from_secs(10)).await;
    assert!(!c.leading(), "without a renewal for 10s it stops leading, before the 15s lease could pass to a peer");
    server.await.unwrap().assert_no_more_requests("after the renewal");
}

#[tokio::test(start_paused = true)]
async fn a_follower_makes_no_request_while_the_holder_renews_and_takes_over_once_it_stops() {
    let (client, mut api) = fake_api();
    let mut c = Controller::new(client, identity("n2"), NS.into());
    // The holder renews: each look sees a new resourceVersion, shown by the watch.
    see(&mut c, Some(&lease(Some("n1"), "10")));
    for rv in ["10", "11", "12", "13"] {
        c.lease_event(Event::Apply(lease(Some("n1"), rv)));
        c.elect().await.unwrap();
        assert!(!c.leading(), "a renewed lease is followed");
        tokio::time::advance(Duration::from_secs(5)).await;
    }
    assert!(api.is_quiet(), "a follower reads nothing: the watch shows the Lease");
    let server = tokio::spawn(async move {
        let (body, reply) = api.expect_path(Method::PUT, LEASE).await;
        assert_eq!(body["spec"]["holderIdentity"], "n2");
        assert_eq!(body["metadata"]["resourceVersion"], "13");
        respond(reply, &stored(&body, "14"));
        api
    });
    // Record 13 was first seen 5s ago; the holder died: the watch shows nothing more.
    c.elect().await.unwrap();
    tokio::time::advance(Duration::from_secs(5)).await;
    c.elect().await.unwrap();
    tokio::time::advance(Duration::from_millis(4_999)).await;
    c.elect().await.unwrap();
    assert!(!c.leading(), "14.999s unchanged is not yet expired");
    tokio::time::advance(Duration::from_millis(1)).await;
    c.elect().await.unwrap();
    assert!(c.leading(), "the same record for its whole duration: taken over");
    server.await.unwrap().assert_no_more_requests("after the takeover");
}

#[tokio::test(start_paused = true)]
async fn a_lease_given_up_is_taken_at_once_and_a_lost_race_is_followed() {
    let (client, mut api) = fake_api();
    let mut c = Controller::new(client, identity("n2"), NS.into());
    let server = tokio::spawn(async move {
        let (_, reply) = api.expect_path(Method::PUT, LEASE).await;
        respond_error(reply, 409, "the object has been modified");
        // The conflict: the Lease is read once, and is gone meanwhile.
        expect_lease_get(&mut api, None).await;
        let (_, reply) = api.expect_path(Method::POST, LEASES).await;
        respond_error(reply, 409, "leases.coordination.k8s.io \"drivelet-cluster-duties\" already exists");
        expect_lease_get(&mut api, Some(&lease(Some("n3"), "21"))).await;
        api
    });
    see(&mut c, Some(&lease(None, "20")));
    c.elect().await.unwrap();
    assert!(!c.leading(), "another candidate wrote first");
    c.elect().await.unwrap();
    assert!(!c.leading(), "another candidate created it first");
    c.elect().await.unwrap();
    assert!(!c.leading(), "n3 holds it now: followed without a request");
    server.await.unwrap().assert_no_more_requests("after the races");
}

#[tokio::test(start_paused = true)]
async fn a_clean_shutdown_gives_the_lease_up_only_when_held() {
    let lease_script = Script {
        lists: [list_of("Lease", "coordination.k8s.io/v1", "30", vec![serde_json::to_value(lease(None, "30")).unwrap()])].into(),
        watches: Default::default(),
    };
    let (client, mut api) = fake_api_serving(vec![(LEASES, lease_script)]);
    let c = Controller::new(client, identity("n1"), NS.into()).without_relay();
    let (stop, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(c.run(rx));
    // The watch lists the free lease; at a tick it takes it, then runs a round that finds
    // nothing gone.
    let (body, reply) = api.expect_path(Method::PUT, LEASE).await;
    respond(reply, &stored(&body, "31"));
    // Its rounds read the relay's view (not run here: nothing listed yet), never a list.
    assert!(api.is_quiet());
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    stop.send(done_tx).unwrap();
    let held: Lease = serde_json::from_value(stored(&body, "31")).unwrap();
    expect_lease_get(&mut api, Some(&held)).await;
    let (given_up, reply) = api.expect_path(Method::PUT, LEASE).await;
    assert!(given_up["spec"]["holderIdentity"].is_null(), "holderIdentity cleared: {given_up}");
    assert_eq!(given_up["metadata"]["resourceVersion"], "31");
    respond(reply, &stored(&given_up, "32"));
    done_rx.await.unwrap();
    task.await.unwrap();
    api.assert_no_more_requests("after the handover");

    // A follower gives nothing up.
    let (client, mut api) = fake_api();
    let mut c = Controller::new(client, identity("n2"), NS.into());
    let server = tokio::spawn(async move {
        expect_lease_get(&mut api, Some(&lease(Some("n1"), "40"))).await;
        api
    });
    c.give_up().await;
    server.await.unwrap().assert_no_more_requests("a follower writes nothing");
}

/// Makes `c` the leader through a create of the Lease.
async fn lead(c: &mut Controller, api: FakeApi) -> FakeApi {
    see(c, None);
    let server = tokio::spawn(async move {
        let mut api = api;
        let (body, reply) = api.expect_path(Method::POST, LEASES).await;
        respond(reply, &stored(&body, "2"));
        api
    });
    c.elect().await.unwrap();
    assert!(c.leading());
    server.await.unwrap()
}

/// Fills `c`'s view as the relay's watches would: Nodes `live`, these attachments, PVs,
/// Drive objects, claims and StorageClasses, every kind listed.
fn fill(c: &Controller, live: &[&str], vas: Vec<Value>, pvs: Vec<Value>, drives: Vec<Value>) {
    fill_all(c, live, vas, pvs, drives, vec![], vec![]);
}

fn fill_all(c: &Controller, live: &[&str], vas: Vec<Value>, pvs: Vec<Value>, drives: Vec<Value>, claims: Vec<Value>, classes: Vec<Value>) {
    let view = c.view();
    let mut v = lock(&view);
    *v = View::new(DRIVER);
    for n in live {
        v.node(n, true);
    }
    for o in vas {
        v.apply_va(&serde_json::from_value(o).unwrap());
    }
    for o in pvs {
        v.apply_pv(&serde_json::from_value(o).unwrap());
    }
    for o in drives {
        v.apply_drive(&serde_json::from_value(o).unwrap());
    }
    for o in claims {
        v.apply_claim(&serde_json::from_value(o).unwrap());
    }
    for o in classes {
        let k: k8s_openapi::api::storage::v1::StorageClass = serde_json::from_value(o).unwrap();
        v.class(k.metadata.name.as_deref().unwrap(), Some(&k));
    }
    v.listed_all();
}

#[tokio::test(start_paused = true)]
async fn a_leader_confirms_a_node_deleted_then_releases_deletes_remembers_and_releases_an_opted_in_claim() {
    let (client, api) = fake_api();
    let mut c = Controller::new(client, identity("n1"), NS.into());
    let mut api = lead(&mut c, api).await;
    fill(
        &c,
        &["n1"],
        vec![json!(va("va-1", "n2", "pv-9", true, &[ATTACHER]))],
        vec![
            json!(pv("pv-1", "n2", "Released", "Delete", &[PROVISIONER_FINALIZER], None)),
            json!(pv("pv-2", "n2", "Bound", "Delete", &[], Some(("apps", "data-0")))),
        ],
        vec![json!(drive("drv-2", "n2"))],
    );
    let server = tokio::spawn(async move {
        let (_, reply) = api.expect_path(Method::GET, "/api/v1/namespaces/apps/persistentvolumeclaims").await;
        respond(reply, &list_of("PersistentVolumeClaim", "v1", "1", vec![json!(claim("apps", "data-0", "pv-2", "fast"))]));
        let (_, reply) = api.expect_path(Method::GET, "/apis/storage.k8s.io/v1/storageclasses/fast").await;
        respond(reply, &class("fast", Some("release-claims")));
        let (_, reply) = api.expect_path(Method::GET, "/api/v1/namespaces/apps/pods").await;
        respond(reply, &list_of("Pod", "v1", "1", vec![json!(pod("apps", "web-0", "data-0", None, "Pending"))]));

        // Confirmed gone, right before anything is done.
        let (_, reply) = api.expect_path(Method::GET, "/api/v1/nodes/n2").await;
        respond_not_found(reply, "nodes \"n2\" not found");

        let (body, reply) = api.expect_path(Method::PATCH, "/apis/storage.k8s.io/v1/volumeattachments/va-1").await;
        assert_eq!(body, json!({"metadata": {"finalizers": [], "resourceVersion": "5"}}));
        respond(reply, &va("va-1", "n2", "pv-9", true, &[]));

        // The handle is remembered before the PV goes.
        let (_, reply) = api.expect_path(Method::GET, CM).await;
        respond_not_found(reply, "configmaps \"drivelet-removed-volumes\" not found");
        let (body, reply) = api.expect_path(Method::POST, CMS).await;
        assert_eq!(body["metadata"]["name"], REMOVED_VOLUMES);
        assert_eq!(body["data"], json!({"n2": "vol-pv-1\n"}));
        respond(reply, &body);
        let (body, reply) = api.expect_path(Method::PATCH, "/api/v1/persistentvolumes/pv-1").await;
        assert_eq!(body, json!({"metadata": {"finalizers": [], "resourceVersion": "5"}}));
        respond(reply, &pv("pv-1", "n2", "Released", "Delete", &[], None));
        let (_, reply) = api.expect_path(Method::DELETE, "/api/v1/persistentvolumes/pv-1").await;
        respond(reply, &pv("pv-1", "n2", "Released", "Delete", &[], None));

        let (_, reply) = api.expect_path(Method::DELETE, "/apis/drivelet.io/v1alpha1/drives/drv-2").await;
        respond(reply, &drive("drv-2", "n2"));

        let (event, reply) = api.expect_path(Method::POST, "/apis/events.k8s.io/v1/namespaces/apps/events").await;
        assert_eq!(event["type"], "Normal");
        assert_eq!(event["reason"], "ClaimReleased");
        assert_eq!(event["regarding"]["kind"], "PersistentVolumeClaim");
        assert_eq!(event["regarding"]["name"], "data-0");
        assert_eq!(event["reportingController"], REPORTER);
        let note = event["note"].as_str().unwrap();
        for part in ["n2", "release-claims", "fast"] {
            assert!(note.contains(part), "{note} names {part}");
        }
        respond(reply, &event);
        let (_, reply) = api.expect_path(Method::DELETE, "/api/v1/namespaces/apps/persistentvolumeclaims/data-0").await;
        respond(reply, &claim("apps", "data-0", "pv-2", "fast"));
        api
    });
    c.round().await.unwrap();
    server.await.unwrap().assert_no_more_requests("after the round");
}

#[tokio::test(start_paused = true)]
async fn a_remembered_handle_is_added_to_the_nodes_key_once_and_a_kept_claim_is_warned_once() {
    let (client, api) = fake_api();
    let mut c = Controller::new(client, identity("n1"), NS.into());
    let mut api = lead(&mut c, api).await;
    let pvs = vec![
        json!(pv("pv-1", "n2", "Released", "Delete", &[], None)),
        json!(pv("pv-2", "n2", "Bound", "Delete", &[], Some(("apps", "data-0")))),
    ];
    fill(&c, &["n1"], vec![], pvs, vec![]);
    let server = tokio::spawn(async move {
        for round in 0..2 {
            // After the first round the claim carries the annotation the warning left, as
            // any later leader reads it: it is not warned again.
            let mut kept = claim("apps", "data-0", "pv-2", "fast");
            if round == 1 {
                kept.metadata.annotations = Some([(WARNED.to_string(), "n2".to_string())].into());
            }
            let (_, reply) = api.expect_path(Method::GET, "/api/v1/namespaces/apps/persistentvolumeclaims").await;
            respond(reply, &list_of("PersistentVolumeClaim", "v1", "1", vec![json!(kept)]));
            let (_, reply) = api.expect_path(Method::GET, "/apis/storage.k8s.io/v1/storageclasses/fast").await;
            respond(reply, &class("fast", None));
            // No pods read: nothing of a keep-claims class is released.
            let (_, reply) = api.expect_path(Method::GET, "/api/v1/nodes/n2").await;
            respond_not_found(reply, "nodes \"n2\" not found");
            let (_, reply) = api.expect_path(Method::GET, CM).await;
            let mut cm = ConfigMap {
                metadata: ObjectMeta { name: Some(REMOVED_VOLUMES.into()), resource_version: Some("8".into()), ..Default::default() },
                data: Some([("n2".to_string(), "vol-old\n".to_string()), ("n3".to_string(), "vol-x\n".to_string())].into()),
                ..Default::default()
            };
            if round == 1 {
                cm.data.as_mut().unwrap().insert("n2".into(), "vol-old\nvol-pv-1\n".into());
            }
            respond(reply, &cm);
            if round == 0 {
                let (body, reply) = api.expect_path(Method::PATCH, CM).await;
                assert_eq!(body, json!({"metadata": {"resourceVersion": "8"}, "data": {"n2": "vol-old\nvol-pv-1\n"}}));
                respond(reply, &cm);
            }
            let (_, reply) = api.expect_path(Method::DELETE, "/api/v1/persistentvolumes/pv-1").await;
            respond_not_found(reply, "persistentvolumes \"pv-1\" not found");
            if round == 0 {
                let (event, reply) = api.expect_path(Method::POST, "/apis/events.k8s.io/v1/namespaces/apps/events").await;
                assert_eq!((event["type"].as_str(), event["reason"].as_str()), (Some("Warning"), Some("NodeDeleted")));
                let note = event["note"].as_str().unwrap();
                for part in ["n2", "delete this claim", "release-claims", "same name"] {
                    assert!(note.contains(part), "{note} says {part}");
                }
                respond(reply, &event);
                let (body, reply) = api.expect_path(Method::PATCH, "/api/v1/namespaces/apps/persistentvolumeclaims/data-0").await;
                assert_eq!(body, json!({"metadata": {"annotations": {WARNED: "n2"}}}), "the warning is remembered on the claim");
                respond(reply, &claim("apps", "data-0", "pv-2", "fast"));
            }
        }
        api
    });
    c.round().await.unwrap();
    c.round().await.unwrap();
    server.await.unwrap().assert_no_more_requests("the claim is warned about once");
}

#[tokio::test(start_paused = true)]
async fn a_node_the_list_lacks_but_a_get_finds_or_cannot_confirm_keeps_everything() {
    // 404 without reason NotFound: a proxy's page, not the API server saying no such Node.
    for answer in [Some(200), Some(500), Some(404), None] {
        let (client, api) = fake_api();
        let mut c = Controller::new(client, identity("n1"), NS.into());
        let mut api = lead(&mut c, api).await;
        fill(
            &c,
            &["n1"],
            vec![json!(va("va-1", "n2", "pv-1", true, &[ATTACHER]))],
            vec![json!(pv("pv-1", "n2", "Released", "Delete", &[ATTACHER], None))],
            vec![json!(drive("drv-2", "n2"))],
        );
        let server = tokio::spawn(async move {
            let (_, reply) = api.expect_path(Method::GET, "/api/v1/nodes/n2").await;
            match answer {
                Some(200) => respond(reply, &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}})),
                Some(code) => respond_error(reply, code, "etcd is slow"),
                None => respond_error(reply, 403, "forbidden"),
            }
            api
        });
        c.round().await.unwrap();
        server.await.unwrap().assert_no_more_requests("nothing is done about a node not confirmed deleted");
    }
}

#[tokio::test(start_paused = true)]
async fn a_round_with_no_node_missing_or_before_the_view_is_listed_makes_no_request() {
    let (client, api) = fake_api();
    let mut c = Controller::new(client, identity("n1"), NS.into());
    let mut api = lead(&mut c, api).await;
    // Nothing listed yet: n2's objects name a node the view has not seen, yet nothing
    // is proposed.
    {
        let view = c.view();
        let mut v = lock(&view);
        v.apply_pv(&serde_json::from_value(json!(pv("pv-1", "n2", "Released", "Delete", &[ATTACHER], None))).unwrap());
    }
    c.round().await.unwrap();
    c.claims_round().await.unwrap();
    fill(
        &c,
        &["n1", "n2"],
        vec![json!(va("va-1", "n2", "pv-1", true, &[ATTACHER]))],
        vec![json!(pv("pv-1", "n2", "Released", "Delete", &[ATTACHER], Some(("apps", "data-0"))))],
        vec![json!(drive("drv-2", "n2"))],
    );
    c.round().await.unwrap();
    c.claims_round().await.unwrap();
    api.assert_no_more_requests("a NotReady or live node is never gone, and the view is read, never listed");
}

/// The volume manager, scripted: which deletes fail.
#[derive(Default)]
struct FakeVolumes {
    calls: Arc<Mutex<Vec<String>>>,
    failing: BTreeSet<String>,
}

impl Ready for FakeVolumes {
    async fn wait_ready(&self) {}
}

impl RemovedBackend for FakeVolumes {
    async fn delete(&self, volume_id: &str, node: &str) -> Result<(), KubeError> {
        self.calls.lock().unwrap().push(format!("{volume_id} {node}"));
        if self.failing.contains(volume_id) {
            Err(KubeError::volume(volume_id)(VolumeError::StillStaged { volume_id: volume_id.to_string() }))
        } else {
            Ok(())
        }
    }
}

fn removed(data: &[(&str, &str)], rv: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta { name: Some(REMOVED_VOLUMES.into()), resource_version: Some(rv.into()), ..Default::default() },
        data: Some(data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        ..Default::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_returning_node_deletes_its_removed_volumes_and_clears_its_key() {
    let (client, mut api) = fake_api();
    let backend = FakeVolumes { failing: BTreeSet::from(["vol-b".to_string()]), ..Default::default() };
    let server = tokio::spawn(async move {
        let (_, reply) = api.expect_path(Method::GET, CM).await;
        respond(reply, &removed(&[("n2", "vol-a\nvol-b\n"), ("n3", "vol-c\n")], "9"));
        let (body, reply) = api.expect_path(Method::PATCH, CM).await;
        assert_eq!(body, json!({"metadata": {"resourceVersion": "9"}, "data": {"n2": "vol-b\n"}}), "only what was deleted leaves the key");
        respond(reply, &removed(&[("n2", "vol-b\n"), ("n3", "vol-c\n")], "10"));
        api
    });
    let left = reconcile_once(&client, NS, "n2", &backend).await.unwrap();
    assert_eq!(left, 1);
    assert_eq!(*backend.calls.lock().unwrap(), vec!["vol-a n2", "vol-b n2"], "only this node's volumes");
    let mut api = server.await.unwrap();
    api.assert_no_more_requests("after the first pass");

    let backend = FakeVolumes::default();
    let server = tokio::spawn(async move {
        let (_, reply) = api.expect_path(Method::GET, CM).await;
        respond(reply, &removed(&[("n2", "vol-b\n"), ("n3", "vol-c\n")], "10"));
        let (body, reply) = api.expect_path(Method::PATCH, CM).await;
        assert_eq!(body, json!({"metadata": {"resourceVersion": "10"}, "data": {"n2": null}}), "an empty key is removed");
        respond(reply, &removed(&[("n3", "vol-c\n")], "11"));
        // Nothing left: one read, no write.
        let (_, reply) = api.expect_path(Method::GET, CM).await;
        respond(reply, &removed(&[("n3", "vol-c\n")], "11"));
        let (_, reply) = api.expect_path(Method::GET, CM).await;
        respond_not_found(reply, "configmaps \"drivelet-removed-volumes\" not found");
        api
    });
    assert_eq!(reconcile_once(&client, NS, "n2", &backend).await.unwrap(), 0);
    assert_eq!(reconcile_once(&client, NS, "n2", &backend).await.unwrap(), 0);
    assert_eq!(reconcile_once(&client, NS, "n2", &backend).await.unwrap(), 0);
    assert_eq!(*backend.calls.lock().unwrap(), vec!["vol-b n2"]);
    server.await.unwrap().assert_no_more_requests("after the key is clear");
}

#[tokio::test(start_paused = true)]
async fn a_leaders_claim_watch_reads_what_it_needs_and_gives_an_immediate_claim_the_allowed_node_once() {
    use super::claims::{REASON_SELECTED, SELECTED_NODE};
    let (client, api) = fake_api();
    let mut c = Controller::new(client, identity("n1"), NS.into());
    let mut api = lead(&mut c, api).await;
    let class = json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": "now", "creationTimestamp": "2023-11-14T22:13:20Z"},
        "provisioner": DRIVER, "volumeBindingMode": "Immediate",
        "allowedTopologies": [{"matchLabelExpressions": [{"key": crate::TOPOLOGY_NODE_KEY, "values": ["n2"]}]}],
    });
    let other_driver = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "nfs"}, "provisioner": "nfs.csi.io"});
    let waiting = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": "apps", "uid": "uid-data", "resourceVersion": "11"},
        "spec": {"storageClassName": "now", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Pending"},
    });
    let node = |name: &str| json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {crate::TOPOLOGY_NODE_KEY: name}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    });
    let capacity = |node: &str, gib: u64| json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity",
        "metadata": {"name": format!("csisc-{node}"), "namespace": NS},
        "storageClassName": "now",
        "nodeTopology": {"matchLabels": {crate::TOPOLOGY_NODE_KEY: node}},
        "capacity": format!("{gib}Gi"), "maximumVolumeSize": format!("{gib}Gi"),
    });
    fill_all(&c, &["n1", "n2"], vec![], vec![], vec![], vec![waiting.clone()], vec![class, other_driver]);
    let server = tokio::spawn(async move {
        // The waiting claim and the classes are the view's; Nodes are read (paginated)
        // only because a claim of a drivelet class waits.
        let call = api.next("the Nodes are listed").await;
        assert_eq!((&call.method, call.path()), (&Method::GET, "/api/v1/nodes"));
        assert!(call.uri.contains("limit=500"), "paginated: {}", call.uri);
        respond(call.reply, &list_of("Node", "v1", "1", vec![node("n1"), node("n2")]));
        let (_, reply) = api.expect_path(Method::GET, "/apis/storage.k8s.io/v1/namespaces/drivelet-system/csistoragecapacities").await;
        // n1 has more room, but the class allows only n2.
        respond(reply, &list_of("CSIStorageCapacity", "storage.k8s.io/v1", "1", vec![capacity("n1", 50), capacity("n2", 5)]));
        let (patch, reply) = api.expect_path(Method::PATCH, "/api/v1/namespaces/apps/persistentvolumeclaims/data").await;
        assert_eq!(patch["metadata"]["annotations"][SELECTED_NODE], "n2");
        assert_eq!(patch["metadata"]["resourceVersion"], "11");
        respond(reply, &waiting);
        let (event, reply) = api.expect_path(Method::POST, "/apis/events.k8s.io/v1/namespaces/apps/events").await;
        assert_eq!(event["reason"], REASON_SELECTED);
        respond(reply, &event);
        api
    });
    c.claims_round().await.unwrap();
    server.await.unwrap().assert_no_more_requests("after the claim watch");
}
