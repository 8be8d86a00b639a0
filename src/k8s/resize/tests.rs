//! The resizer's decisions and status patches, table-tested without a cluster.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume,
    PersistentVolumeClaim, PersistentVolumeClaimCondition, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
    PersistentVolumeSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

use super::*;

pub(crate) const DRIVER: &str = "csi.drivelet.io";
pub(crate) const NODE: &str = "node-a";
const GI: u64 = 1 << 30;
const MI: u64 = 1 << 20;

pub(crate) fn identity() -> Identity {
    Identity { driver: DRIVER.into(), node: NODE.into() }
}

fn q(s: &str) -> Quantity {
    Quantity(s.into())
}

fn storage(s: &str) -> Option<BTreeMap<String, Quantity>> {
    Some(BTreeMap::from([(STORAGE.to_string(), q(s))]))
}

/// A PV of this driver on `node`, bound to claim `ns/name` (uid `uid-<name>`).
pub(crate) fn pv_on(node: &str, name: &str, volume: &str, capacity: &str, claim: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta { name: Some(name.into()), resource_version: Some("5".into()), ..Default::default() },
        spec: Some(PersistentVolumeSpec {
            capacity: storage(capacity),
            csi: Some(CSIPersistentVolumeSource { driver: DRIVER.into(), volume_handle: volume.into(), ..Default::default() }),
            claim_ref: Some(ObjectReference {
                namespace: Some("ns".into()),
                name: Some(claim.into()),
                uid: Some(format!("uid-{claim}")),
                ..Default::default()
            }),
            node_affinity: Some(crate::k8s::fake_api::pinned_to(node)),
            ..Default::default()
        }),
        status: None,
    }
}

pub(crate) fn pv(capacity: &str) -> PersistentVolume {
    pv_on(NODE, "pv-1", "vol-1", capacity, "data")
}

/// A Bound claim `ns/data` on `pv-1` asking for `request`, with `capacity`.
pub(crate) fn pvc(request: &str, capacity: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".into()),
            namespace: Some("ns".into()),
            uid: Some("uid-data".into()),
            resource_version: Some("9".into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            volume_name: Some("pv-1".into()),
            resources: Some(VolumeResourceRequirements { requests: storage(request), ..Default::default() }),
            ..Default::default()
        }),
        status: Some(PersistentVolumeClaimStatus { phase: Some("Bound".into()), capacity: storage(capacity), ..Default::default() }),
    }
}

pub(crate) fn with_state(mut c: PersistentVolumeClaim, allocated: Option<&str>, state: Option<&str>) -> PersistentVolumeClaim {
    let s = c.status.as_mut().expect("status");
    s.allocated_resources = allocated.and_then(storage);
    s.allocated_resource_statuses = state.map(|st| BTreeMap::from([(STORAGE.to_string(), st.to_string())]));
    c
}

fn cond(kind: &str) -> PersistentVolumeClaimCondition {
    PersistentVolumeClaimCondition { type_: kind.into(), status: "True".into(), ..Default::default() }
}

fn expand(bytes: u64, allocated: &str, update_status: bool) -> Plan {
    Plan::Expand(Expansion { volume_id: "vol-1".into(), bytes, allocated: q(allocated), update_status })
}

#[test]
fn quantities_parse_exactly_and_round_up_to_bytes() {
    let table = [
        ("1Gi", Some(GI)),
        ("1536Mi", Some(1536 * MI)),
        ("1.5Gi", Some(GI + GI / 2)),
        ("2G", Some(2_000_000_000)),
        ("500M", Some(500_000_000)),
        ("1k", Some(1000)),
        ("1Ki", Some(1024)),
        ("1073741824", Some(GI)),
        ("+10", Some(10)),
        ("1e3", Some(1000)),
        ("1E3", Some(1000)),
        ("1E", Some(1_000_000_000_000_000_000)),
        ("1500m", Some(2)),
        ("0.5", Some(1)),
        ("0", Some(0)),
        ("16Ei", None),
        ("-1Gi", None),
        ("1.2.3", None),
        ("Gi", None),
        ("1Gb", None),
        ("", None),
        ("99999999999999999999999999999999999999999999", None),
    ];
    for (text, want) in table {
        assert_eq!(quantity_bytes(text), want, "{text:?}");
    }
}

#[test]
fn sizes_are_written_in_the_largest_binary_unit_that_divides_them() {
    let table = [(2 * GI, "2Gi"), (1536 * MI, "1536Mi"), (GI + 512, "1073742336"), (1024, "1Ki"), (0, "0"), (7, "7")];
    for (bytes, want) in table {
        assert_eq!(quantity_of(bytes), want);
        assert_eq!(quantity_bytes(want), Some(bytes));
    }
}

#[test]
fn only_this_drivers_pvs_pinned_to_this_node_are_ours() {
    let mut other_driver = pv("1Gi");
    other_driver.spec.as_mut().unwrap().csi.as_mut().unwrap().driver = "ebs.csi.aws.com".into();
    let mut no_affinity = pv("1Gi");
    no_affinity.spec.as_mut().unwrap().node_affinity = None;
    let table = [
        ("ours", pv("1Gi"), Some("vol-1".to_string())),
        ("another node's", pv_on("node-b", "pv-1", "vol-1", "1Gi", "data"), None),
        ("another driver's", other_driver, None),
        ("without node affinity", no_affinity, None),
    ];
    for (case, pv, want) in table {
        assert_eq!(our_volume(&pv, &identity()), want, "{case}");
    }
}

#[test]
fn plan_follows_external_resizers_expand_and_recover() {
    let mut unbound = pvc("2Gi", "1Gi");
    unbound.status.as_mut().unwrap().phase = Some("Pending".into());
    let mut other_claim = pvc("2Gi", "1Gi");
    other_claim.metadata.uid = Some("uid-other".into());
    let mut fs_pending = pvc("2Gi", "1Gi");
    fs_pending.status.as_mut().unwrap().conditions = Some(vec![cond(FS_RESIZE_PENDING)]);
    let s = Some(Duration::from_secs(300));
    // (case, claim, PV size, final error, slow, plan)
    let table: Vec<(&str, PersistentVolumeClaim, &str, bool, Option<Duration>, Plan)> = vec![
        ("a claim asking for what it has", pvc("1Gi", "1Gi"), "1Gi", false, None, Plan::Nothing("the claim asks for no more than it has")),
        ("a claim asking for less", pvc("1Gi", "2Gi"), "2Gi", false, None, Plan::Nothing("the claim asks for no more than it has")),
        ("an unbound claim", unbound, "1Gi", false, None, Plan::Nothing("the claim is not bound to the PV")),
        ("a PV bound to another claim", other_claim, "1Gi", false, None, Plan::Nothing("the PV is bound to another claim")),
        ("a new request grows to it", pvc("2Gi", "1Gi"), "1Gi", false, None, expand(2 * GI, "2Gi", true)),
        ("a decimal request grows to its bytes", pvc("1.5G", "1Gi"), "1Gi", false, None, expand(1_500_000_000, "1.5G", true)),
        (
            "a controller expansion cut short resumes to the allocated size",
            with_state(pvc("3Gi", "1Gi"), Some("2Gi"), Some(CONTROLLER_IN_PROGRESS)),
            "1Gi",
            false,
            None,
            expand(2 * GI, "2Gi", false),
        ),
        (
            "after a final error the request is taken again",
            with_state(pvc("3Gi", "1Gi"), Some("2Gi"), Some(CONTROLLER_IN_PROGRESS)),
            "1Gi",
            true,
            None,
            expand(3 * GI, "3Gi", true),
        ),
        (
            "a pending node expansion is left to kubelet",
            with_state(pvc("2Gi", "1Gi"), Some("2Gi"), Some(NODE_PENDING)),
            "2Gi",
            false,
            None,
            Plan::Nothing("kubelet is to finish the expansion already made"),
        ),
        (
            "a node expansion in progress is left to kubelet even when more is asked",
            with_state(pvc("3Gi", "1Gi"), Some("2Gi"), Some(NODE_IN_PROGRESS)),
            "2Gi",
            false,
            None,
            Plan::Nothing("kubelet is to finish the expansion already made"),
        ),
        (
            "a pending node expansion whose PV never grew is made again",
            with_state(pvc("2Gi", "1Gi"), Some("2Gi"), Some(NODE_PENDING)),
            "1Gi",
            false,
            None,
            expand(2 * GI, "2Gi", false),
        ),
        (
            "an infeasible size in the slow set waits",
            with_state(pvc("100Gi", "1Gi"), Some("100Gi"), Some(CONTROLLER_INFEASIBLE)),
            "1Gi",
            true,
            s,
            Plan::Wait(Duration::from_secs(300)),
        ),
        (
            "an infeasible size out of the slow set is tried again, status kept",
            with_state(pvc("100Gi", "1Gi"), Some("100Gi"), Some(CONTROLLER_INFEASIBLE)),
            "1Gi",
            true,
            None,
            expand(100 * GI, "100Gi", false),
        ),
        (
            "a lowered request recovers from an infeasible size at once",
            with_state(pvc("1536Mi", "1Gi"), Some("100Gi"), Some(CONTROLLER_INFEASIBLE)),
            "1Gi",
            true,
            s,
            expand(1536 * MI, "1536Mi", true),
        ),
        (
            "a grown PV with the controller status left over finishes the allocated size",
            with_state(pvc("2Gi", "1Gi"), Some("2Gi"), Some(CONTROLLER_IN_PROGRESS)),
            "2Gi",
            false,
            None,
            expand(2 * GI, "2Gi", false),
        ),
        (
            "a grown PV with an infeasible node expansion resumes the allocated size",
            with_state(pvc("2Gi", "1Gi"), Some("2Gi"), Some(NODE_INFEASIBLE)),
            "2Gi",
            false,
            None,
            expand(2 * GI, "2Gi", false),
        ),
        (
            "a grown PV waiting for kubelet the old way is left alone",
            fs_pending,
            "2Gi",
            false,
            None,
            Plan::Nothing("kubelet is to finish the expansion already made"),
        ),
        (
            "a grown PV with an allocation but no status finishes it",
            with_state(pvc("2Gi", "1Gi"), Some("2Gi"), None),
            "2Gi",
            false,
            None,
            expand(2 * GI, "2Gi", false),
        ),
    ];
    for (case, claim, pv_size, final_error, slow_left, want) in table {
        let pv = pv(pv_size);
        let obs = Observed { pvc: &claim, pv: &pv, final_error, slow_left };
        assert_eq!(plan(&obs, &identity()), want, "{case}");
    }
    let other = pv_on("node-b", "pv-1", "vol-1", "1Gi", "data");
    let claim = pvc("2Gi", "1Gi");
    let obs = Observed { pvc: &claim, pv: &other, final_error: false, slow_left: None };
    assert_eq!(plan(&obs, &identity()), Plan::Nothing("the PV is not this driver's on this node"));
}

#[test]
fn conditions_merge_like_external_resizer() {
    let old = vec![cond("SomethingElse"), cond(RESIZING), cond(CONTROLLER_RESIZE_ERROR)];
    let fresh = || vec![json!({"type": RESIZING, "status": "True", "lastTransitionTime": "t"})];
    let types = |v: &[serde_json::Value]| v.iter().map(|c| c["type"].as_str().unwrap_or("").to_string()).collect::<Vec<_>>();
    assert_eq!(types(&merge_conditions(&old, fresh(), false)), ["SomethingElse", RESIZING]);
    assert_eq!(types(&merge_conditions(&old, fresh(), true)), ["SomethingElse", RESIZING, CONTROLLER_RESIZE_ERROR]);
    assert_eq!(types(&merge_conditions(&old, vec![], false)), ["SomethingElse"]);
    assert_eq!(merge_conditions(&old, fresh(), false)[1]["lastTransitionTime"], "t", "the new condition replaces the old");
}

#[test]
fn status_patches_say_what_external_resizer_says() {
    let claim = pvc("2Gi", "1Gi");
    let e = Expansion { volume_id: "vol-1".into(), bytes: 2 * GI, allocated: q("2Gi"), update_status: true };
    assert_eq!(
        in_progress_patch(&claim, &e, "t"),
        json!({"metadata": {"resourceVersion": "9"}, "status": {
            "conditions": [{"type": RESIZING, "status": "True", "lastTransitionTime": "t"}],
            "allocatedResources": {"storage": "2Gi"},
            "allocatedResourceStatuses": {"storage": CONTROLLER_IN_PROGRESS},
        }})
    );
    let resume = Expansion { update_status: false, ..e };
    assert!(in_progress_patch(&claim, &resume, "t")["status"].get("allocatedResourceStatuses").is_none(), "status kept");
    assert_eq!(
        node_pending_patch(&claim, "t"),
        json!({"metadata": {"resourceVersion": "9"}, "status": {
            "conditions": [{"type": FS_RESIZE_PENDING, "status": "True", "lastTransitionTime": "t", "message": FS_PENDING_MESSAGE}],
            "allocatedResourceStatuses": {"storage": NODE_PENDING},
        }})
    );
    let mut resizing = claim.clone();
    resizing.status.as_mut().unwrap().conditions = Some(vec![cond(RESIZING)]);
    assert_eq!(
        finished_patch(&resizing, &q("2Gi")),
        json!({"metadata": {"resourceVersion": "9"}, "status": {
            "capacity": {"storage": "2Gi"}, "conditions": [], "allocatedResourceStatuses": {"storage": null},
        }})
    );
    assert_eq!(
        failed_patch(&claim, Failure::Infeasible, "too big", "t"),
        Some(json!({"status": {
            "conditions": [{"type": CONTROLLER_RESIZE_ERROR, "status": "True", "lastTransitionTime": "t", "message": "failed to expand pvc with too big"}],
            "allocatedResourceStatuses": {"storage": CONTROLLER_INFEASIBLE},
        }}))
    );
    let fin = failed_patch(&claim, Failure::Final, "drive gone", "t").expect("a final error is recorded");
    assert!(fin["status"].get("allocatedResourceStatuses").is_none(), "a final error keeps the status: {fin}");
    assert_eq!(failed_patch(&claim, Failure::Transient, "busy", "t"), None, "a transient error is not recorded");
    assert_eq!(pv_capacity_patch(1536 * MI), json!({"spec": {"capacity": {"storage": "1536Mi"}}}));
}

#[test]
fn retries_back_off_and_an_infeasible_size_waits_the_long_delay() {
    let policy = crate::k8s::shell::RetryPolicy { base: Duration::from_secs(1), cap: Duration::from_secs(60), terminal: Duration::from_secs(600) };
    assert_eq!(retry_after(Failure::Infeasible, 0, &policy), Duration::from_secs(600));
    assert_eq!(retry_after(Failure::Final, 2, &policy), Duration::from_secs(4));
    assert_eq!(retry_after(Failure::Transient, 10, &policy), Duration::from_secs(60));
}

#[test]
fn only_changes_the_decisions_read_requeue_a_claim() {
    let base = pvc("1Gi", "1Gi");
    let mut own_write = with_state(base.clone(), Some("2Gi"), Some(CONTROLLER_IN_PROGRESS));
    own_write.status.as_mut().unwrap().conditions = Some(vec![cond(RESIZING)]);
    own_write.metadata.resource_version = Some("10".into());
    assert!(!claim_differs(&base, &own_write), "the resizer's own status write");
    assert!(claim_differs(&base, &pvc("2Gi", "1Gi")), "a new request");
    assert!(claim_differs(&base, &pvc("1Gi", "2Gi")), "kubelet finished");
    let mut rebound = base.clone();
    rebound.spec.as_mut().unwrap().volume_name = Some("pv-2".into());
    assert!(claim_differs(&base, &rebound), "bound elsewhere");
}

#[test]
fn a_deferral_is_told_once_per_claim_and_size_and_forgotten_when_the_growth_goes_on() {
    use super::Deferrals;
    let mut d = Deferrals::default();
    assert!(d.tell("ns/a", 5) && !d.told("ns/b", 5));
    assert!(!d.tell("ns/a", 5), "the same size again: nothing to say");
    assert!(d.told("ns/a", 5) && !d.told("ns/a", 6));
    assert!(d.tell("ns/a", 6), "another size is told");
    d.forget("ns/a");
    assert!(d.tell("ns/a", 6), "after the growth went on, told again");
    for i in 0..super::DEFERRALS_MAX {
        d.tell(&format!("ns/c{i}"), 1);
    }
    assert!(!d.told("ns/a", 6), "full: the oldest is forgotten");
    assert!(d.told(&format!("ns/c{}", super::DEFERRALS_MAX - 1), 1));
}
