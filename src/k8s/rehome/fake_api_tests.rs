//! Re-homing against the scripted fake API server (`crate::k8s::fake_api`): the exact
//! requests of a PV pinned to another node replaced pinned to this one (Retain first),
//! of the next pass filling the volume's binding, of an adoption that restores a claim,
//! and of a pass killed after the delete finished by the next.
//!
//! Rules: as in the other fake API tests: every request is checked for method and path
//! (and body where it is the point); no request may come that the script does not expect.

use std::sync::{Arc, Mutex};

use http::Method;
use serde_json::{json, Value};

use super::executor::{Executor, RehomeBackend};
use super::tests::{claim, pv, record, DRIVER, HERE};
use super::{CLAIM_RESTORED, POLICY_BEFORE, PROVISIONED_BY, RESTORED_FOR, VOLUME_ADOPTED, VOLUME_RESTORED};
use crate::actors::volumes::model::VolumeRecord;
use crate::k8s::crd::{Drive, DriveAction, DriveSpec};
use crate::k8s::fake_api::{fake_api, list_of, respond, respond_not_found, FakeApi};
use crate::k8s::identity::Identity;
use crate::k8s::shell::Ready;
use crate::k8s::KubeError;
use crate::words::Binding;

const DRIVES: &str = "/apis/drivelet.io/v1alpha1/drives";
const PV: &str = "/api/v1/persistentvolumes/pv-a";
const PVS: &str = "/api/v1/persistentvolumes";
const CLAIM: &str = "/api/v1/namespaces/apps/persistentvolumeclaims/data-0";
const CLAIMS: &str = "/api/v1/namespaces/apps/persistentvolumeclaims";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/apps/events";

/// The volume side: the bindings it was asked to record.
#[derive(Clone, Default)]
struct Bindings(Arc<Mutex<Vec<(String, Binding)>>>);

impl Ready for Bindings {
    async fn wait_ready(&self) {}
}

impl RehomeBackend for Bindings {
    async fn volumes(&self) -> Result<Vec<VolumeRecord>, KubeError> {
        Ok(vec![record()])
    }
    async fn set_binding(&self, volume_id: &str, binding: Binding) -> Result<(), KubeError> {
        self.0.lock().expect("bindings").push((volume_id.to_string(), binding));
        Ok(())
    }
}

fn identity() -> Identity {
    Identity { driver: DRIVER.into(), node: HERE.into() }
}

/// This node's Drive object of drive `d2`, with `action` and `restoreClaims`.
fn drive(action: Option<DriveAction>, restore: Option<bool>) -> Value {
    let spec = DriveSpec {
        node: HERE.into(),
        drive_id: "d2".into(),
        serial: None,
        wwn: None,
        model: None,
        size_bytes: 1 << 30,
        size: None,
        media: "ssd".into(),
        action,
        restore_claims: restore,
    };
    serde_json::to_value(Drive::new("node-1-d2-abc", spec)).expect("drive")
}

async fn expect_drives(api: &mut FakeApi, items: Vec<Value>) {
    let call = api.next("the Drive objects are listed").await;
    assert_eq!((&call.method, call.path()), (&Method::GET, DRIVES));
    assert!(call.uri.contains("labelSelector=drivelet.io%2Fnode%3Dnode-1"), "only this node's: {}", call.uri);
    respond(call.reply, &list_of("Drive", "drivelet.io/v1alpha1", "1", items));
}

async fn expect_event(api: &mut FakeApi, reason: &str, words: &[&str]) {
    let (_, reply) = api.expect_path(Method::GET, CLAIM).await;
    respond(reply, &claim("uid-0", "pv-a"));
    let (event, reply) = api.expect_path(Method::POST, EVENTS).await;
    assert_eq!(event["type"], "Normal");
    assert_eq!(event["reason"], reason);
    assert_eq!(event["regarding"]["kind"], "PersistentVolumeClaim");
    assert_eq!(event["regarding"]["name"], "data-0");
    let note = event["note"].as_str().unwrap_or_default();
    for w in words {
        assert!(note.contains(w), "{note} says {w}");
    }
    respond(reply, &event);
}

#[tokio::test]
async fn a_pv_pinned_to_another_node_is_replaced_pinned_here_retain_first_and_the_next_pass_fills_the_binding() {
    let (client, mut api) = fake_api();
    let backend = Bindings::default();
    let server = tokio::spawn(async move {
        let (_, reply) = api.expect_path(Method::GET, PV).await;
        respond(reply, &pv(DRIVER, "vol-a", "node-2", "Delete", &["kubernetes.io/pv-protection", "drivelet.io/attacher"], Some("uid-0")));
        let (_, reply) = api.expect_path(Method::GET, CLAIM).await;
        respond(reply, &claim("uid-0", "pv-a"));

        let (body, reply) = api.expect_path(Method::PATCH, PV).await;
        assert_eq!(
            body,
            json!({"metadata": {"annotations": {POLICY_BEFORE: "Delete"}}, "spec": {"persistentVolumeReclaimPolicy": "Retain"}}),
            "Retain before anything else"
        );
        respond(reply, &pv(DRIVER, "vol-a", "node-2", "Retain", &["kubernetes.io/pv-protection"], Some("uid-0")));
        let (body, reply) = api.expect_path(Method::PATCH, PV).await;
        assert_eq!(body, json!({"metadata": {"finalizers": null}}));
        respond(reply, &pv(DRIVER, "vol-a", "node-2", "Retain", &[], Some("uid-0")));
        let (_, reply) = api.expect_path(Method::DELETE, PV).await;
        respond(reply, &pv(DRIVER, "vol-a", "node-2", "Retain", &[], Some("uid-0")));
        let (body, reply) = api.expect_path(Method::POST, PVS).await;
        assert_eq!(body["metadata"]["name"], "pv-a");
        assert_eq!(body["metadata"]["annotations"][PROVISIONED_BY], DRIVER);
        assert!(body["metadata"]["annotations"].get(POLICY_BEFORE).is_none());
        assert_eq!(body["spec"]["persistentVolumeReclaimPolicy"], "Delete", "the policy it had");
        assert_eq!(body["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"], json!([HERE]));
        assert_eq!(body["spec"]["claimRef"]["uid"], "uid-0");
        assert_eq!(body["spec"]["csi"]["volumeHandle"], "vol-a");
        respond(reply, &body);
        expect_event(&mut api, VOLUME_ADOPTED, &["node-1", "node-2", "pv-a", "no data was touched"]).await;

        // The next pass: pinned here; the claim fills the binding.
        let (_, reply) = api.expect_path(Method::GET, PV).await;
        respond(reply, &pv(DRIVER, "vol-a", HERE, "Delete", &[], Some("uid-0")));
        let (_, reply) = api.expect_path(Method::GET, CLAIM).await;
        let mut c = claim("uid-0", "pv-a");
        c.spec.as_mut().unwrap().storage_class_name = Some("slow".into());
        respond(reply, &c);
        api
    });
    let mut ex = Executor::new(client, identity());
    assert!(ex.pass(&[record()], &backend).await.expect("the first pass"), "there was work");
    assert!(!ex.pass(&[record()], &backend).await.expect("the second pass"), "nothing left");
    server.await.unwrap().assert_no_more_requests("after two passes");
    let set = backend.0.lock().unwrap().clone();
    assert_eq!(set, vec![("vol-a".to_string(), Binding { storage_class: "slow".into(), ..record().binding })]);
}

#[tokio::test]
async fn an_adoption_that_restores_claims_creates_the_claim_then_the_pv_bound_to_its_uid() {
    let (client, mut api) = fake_api();
    let backend = Bindings::default();
    let server = tokio::spawn(async move {
        let (_, reply) = api.expect_path(Method::GET, PV).await;
        respond_not_found(reply, "persistentvolumes \"pv-a\" not found");
        let (_, reply) = api.expect_path(Method::GET, CLAIM).await;
        respond_not_found(reply, "persistentvolumeclaims \"data-0\" not found");
        // Both gone: only now are the drives that restore claims read.
        expect_drives(&mut api, vec![drive(Some(DriveAction::Adopt), Some(true))]).await;
        let (body, reply) = api.expect_path(Method::POST, CLAIMS).await;
        assert_eq!(body["metadata"]["name"], "data-0");
        assert_eq!(body["metadata"]["annotations"][RESTORED_FOR], "vol-a");
        assert_eq!(body["spec"]["volumeName"], "pv-a");
        assert_eq!(body["spec"]["storageClassName"], "fast");
        let mut made = body.clone();
        made["metadata"]["uid"] = json!("uid-new");
        respond(reply, &made);
        let (body, reply) = api.expect_path(Method::POST, PVS).await;
        assert_eq!(body["spec"]["claimRef"]["uid"], "uid-new", "bound to the claim just made");
        assert_eq!(body["spec"]["persistentVolumeReclaimPolicy"], "Retain");
        respond(reply, &body);
        expect_event(&mut api, CLAIM_RESTORED, &["vol-a", "node-1"]).await;
        api
    });
    let mut ex = Executor::new(client, identity());
    assert!(ex.pass(&[record()], &backend).await.expect("the pass"));
    server.await.unwrap().assert_no_more_requests("after the pass");
}

#[tokio::test]
async fn without_restore_claims_a_volume_with_neither_pv_nor_claim_is_left_and_a_pass_killed_after_the_delete_is_finished() {
    let (client, mut api) = fake_api();
    let backend = Bindings::default();
    let server = tokio::spawn(async move {
        // An adoption without restoreClaims: nothing is created.
        let (_, reply) = api.expect_path(Method::GET, PV).await;
        respond_not_found(reply, "persistentvolumes \"pv-a\" not found");
        let (_, reply) = api.expect_path(Method::GET, CLAIM).await;
        respond_not_found(reply, "persistentvolumeclaims \"data-0\" not found");
        expect_drives(&mut api, vec![drive(Some(DriveAction::Adopt), None)]).await;

        // Killed after the delete: the PV is gone, the (Lost) claim still names it.
        let (_, reply) = api.expect_path(Method::GET, PV).await;
        respond_not_found(reply, "persistentvolumes \"pv-a\" not found");
        let (_, reply) = api.expect_path(Method::GET, CLAIM).await;
        respond(reply, &claim("uid-0", "pv-a"));
        let (body, reply) = api.expect_path(Method::POST, PVS).await;
        assert_eq!(body["spec"]["claimRef"]["uid"], "uid-0");
        assert_eq!(body["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"], json!([HERE]));
        respond(reply, &body);
        expect_event(&mut api, VOLUME_RESTORED, &["pv-a", "node-1"]).await;
        api
    });
    let mut ex = Executor::new(client, identity());
    assert!(!ex.pass(&[record()], &backend).await.expect("the first pass"), "nothing to do");
    assert!(ex.pass(&[record()], &backend).await.expect("the second pass"));
    server.await.unwrap().assert_no_more_requests("after two passes");
    assert!(backend.0.lock().unwrap().is_empty());
}
