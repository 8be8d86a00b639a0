//! Table tests of the cluster duties' decisions: which nodes are proposed as gone, and
//! what is done for each.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, PersistentVolumeSpec,
    PersistentVolumeStatus, Pod, PodSpec, PodStatus, Volume,
};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;

use super::*;
use crate::k8s::crd::{Drive, DriveSpec};

pub(crate) const DRIVER: &str = "csi.drivelet.io";
pub(crate) const ATTACHER: &str = "external-attacher/csi.drivelet.io";

fn meta(name: &str, finalizers: &[&str]) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        uid: Some(format!("uid-{name}")),
        resource_version: Some("5".into()),
        finalizers: (!finalizers.is_empty()).then(|| finalizers.iter().map(|f| f.to_string()).collect()),
        ..Default::default()
    }
}

fn deleted() -> Option<Time> {
    Some(Time(Timestamp::from_second(1_700_000_000).unwrap()))
}

pub(crate) fn va(name: &str, node: &str, pv: &str, deleting: bool, finalizers: &[&str]) -> VolumeAttachment {
    let mut metadata = meta(name, finalizers);
    metadata.deletion_timestamp = if deleting { deleted() } else { None };
    VolumeAttachment {
        metadata,
        spec: VolumeAttachmentSpec {
            attacher: DRIVER.into(),
            node_name: node.into(),
            source: VolumeAttachmentSource { persistent_volume_name: Some(pv.into()), ..Default::default() },
        },
        status: None,
    }
}

pub(crate) fn pv(name: &str, node: &str, phase: &str, reclaim: &str, finalizers: &[&str], claim: Option<(&str, &str)>) -> PersistentVolume {
    PersistentVolume {
        metadata: meta(name, finalizers),
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource { driver: DRIVER.into(), volume_handle: format!("vol-{name}"), ..Default::default() }),
            persistent_volume_reclaim_policy: Some(reclaim.into()),
            storage_class_name: Some("fast".into()),
            claim_ref: claim.map(|(ns, c)| ObjectReference {
                namespace: Some(ns.into()),
                name: Some(c.into()),
                uid: Some(format!("uid-{c}")),
                ..Default::default()
            }),
            node_affinity: Some(crate::k8s::fake_api::pinned_to(node)),
            ..Default::default()
        }),
        status: Some(PersistentVolumeStatus { phase: Some(phase.into()), ..Default::default() }),
    }
}

pub(crate) fn claim(ns: &str, name: &str, volume: &str, class: &str) -> PersistentVolumeClaim {
    let mut metadata = meta(name, &["kubernetes.io/pvc-protection"]);
    metadata.namespace = Some(ns.into());
    PersistentVolumeClaim {
        metadata,
        spec: Some(PersistentVolumeClaimSpec {
            volume_name: Some(volume.into()),
            storage_class_name: Some(class.into()),
            ..Default::default()
        }),
        status: None,
    }
}

pub(crate) fn pod(ns: &str, name: &str, claim: &str, node: Option<&str>, phase: &str) -> Pod {
    let mut metadata = meta(name, &[]);
    metadata.namespace = Some(ns.into());
    Pod {
        metadata,
        spec: Some(PodSpec {
            node_name: node.map(String::from),
            volumes: Some(vec![Volume {
                name: "data".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource { claim_name: claim.into(), read_only: None }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: Some(PodStatus { phase: Some(phase.into()), ..Default::default() }),
    }
}

pub(crate) fn class(name: &str, on_node_deleted: Option<&str>) -> StorageClass {
    StorageClass {
        metadata: meta(name, &[]),
        provisioner: DRIVER.into(),
        parameters: on_node_deleted.map(|v| BTreeMap::from([(ON_NODE_DELETED.to_string(), v.to_string())])),
        ..Default::default()
    }
}

pub(crate) fn drive(name: &str, node: &str) -> Drive {
    let mut d = Drive::new(
        name,
        DriveSpec {
            node: node.into(),
            drive_id: format!("id-{name}"),
            serial: None,
            wwn: None,
            model: None,
            media: "ssd".into(),
            action: None,
            restore_claims: None,
            size_bytes: 1 << 30,
            size: Some("1 GiB".into()),
        },
    );
    d.metadata.resource_version = Some("5".into());
    d
}


fn claim_ref(ns: &str, name: &str) -> ObjectReference {
    claim(ns, name, "", "").object_ref(&())
}

/// The nodes the relay's view proposes as gone, given these Nodes and objects.
fn gone(nodes: &[&str], vas: Vec<VolumeAttachment>, pvs: Vec<PersistentVolume>, drives: Vec<Drive>) -> BTreeSet<String> {
    let mut view = crate::k8s::relay::view::View::new(DRIVER);
    for n in nodes {
        view.node(n, true);
    }
    vas.iter().for_each(|v| drop(view.apply_va(v)));
    pvs.iter().for_each(|p| drop(view.apply_pv(p)));
    drives.iter().for_each(|d| drop(view.apply_drive(d)));
    view.gone()
}

#[test]
fn a_node_is_proposed_gone_only_when_no_node_object_is_it_and_some_node_is_listed() {
    let found = gone(
        &["a", "b"],
        vec![va("va-1", "b", "pv-1", false, &[]), va("va-2", "c", "pv-2", false, &[])],
        vec![pv("pv-3", "d", "Bound", "Delete", &[], None)],
        vec![drive("drv-e", "e"), drive("drv-a", "a")],
    );
    assert_eq!(found, BTreeSet::from(["c".to_string(), "d".to_string(), "e".to_string()]));

    let mut other = va("va-x", "x", "pv-x", false, &[]);
    other.spec.attacher = "other.driver".into();
    let mut foreign = pv("pv-y", "y", "Bound", "Delete", &[], None);
    foreign.spec.as_mut().unwrap().csi.as_mut().unwrap().driver = "other.driver".into();
    assert!(gone(&["a"], vec![other], vec![foreign], vec![]).is_empty(), "another driver's objects are none of our business");

    assert!(gone(&[], vec![], vec![], vec![drive("drv-a", "a")]).is_empty(), "a view naming no Node at all is not trusted");
}

#[test]
fn a_pv_belongs_to_the_one_node_its_affinity_names() {
    let p = pv("pv-1", "n1", "Bound", "Delete", &[], None);
    assert_eq!(pv_node(&p, DRIVER), Some("n1"));
    assert_eq!(pv_node(&p, "other.driver"), None);
    let mut two = p.clone();
    let exprs = two.spec.as_mut().unwrap().node_affinity.as_mut().unwrap().required.as_mut().unwrap().node_selector_terms[0]
        .match_expressions
        .as_mut()
        .unwrap();
    exprs[0].values = Some(vec!["n1".into(), "n2".into()]);
    assert_eq!(pv_node(&two, DRIVER), None, "an affinity naming two nodes is not one node's");
    let mut not_in = p.clone();
    not_in.spec.as_mut().unwrap().node_affinity.as_mut().unwrap().required.as_mut().unwrap().node_selector_terms[0]
        .match_expressions
        .as_mut()
        .unwrap()[0]
        .operator = "NotIn".into();
    assert_eq!(pv_node(&not_in, DRIVER), None);
}

/// One case: what the API server holds, the duties for gone node `n2`.
struct Case {
    why: &'static str,
    /// The objects, and the nodes the relay's view proposes as gone for them.
    obs: (Observed, BTreeSet<String>),
    want: Vec<Duty>,
}

fn release_va(name: &str, finalizers: &[&str]) -> Duty {
    Duty::ReleaseAttachment { name: name.into(), finalizers: finalizers.iter().map(|f| f.to_string()).collect(), resource_version: Some("5".into()) }
}

fn release_pv(name: &str, finalizers: &[&str]) -> Duty {
    Duty::ReleaseVolume { name: name.into(), finalizers: finalizers.iter().map(|f| f.to_string()).collect(), resource_version: Some("5".into()) }
}

fn delete_pv(name: &str, finalizers: Option<&[&str]>) -> Duty {
    Duty::DeleteVolume {
        name: name.into(),
        handle: format!("vol-{name}"),
        finalizers: finalizers.map(|f| f.iter().map(|f| f.to_string()).collect()),
        resource_version: Some("5".into()),
    }
}

/// The objects `f` makes, and the nodes the relay's view proposes as gone for them while
/// the Nodes `nodes` exist.
fn with(nodes: &[&str], f: impl FnOnce(&mut Observed)) -> (Observed, BTreeSet<String>) {
    let mut obs = Observed::default();
    f(&mut obs);
    let proposed = gone(nodes, obs.attachments.clone(), obs.volumes.clone(), obs.drives.clone());
    (obs, proposed)
}

#[test]
fn the_duties_of_a_gone_node_follow_the_contract() {
    let live = &["n1"];
    let cases = vec![
        Case {
            why: "a VolumeAttachment being deleted loses our finalizer, others' stay",
            obs: with(live, |o| o.attachments = vec![va("va-1", "n2", "pv-1", true, &["x/other", ATTACHER])]),
            want: vec![release_va("va-1", &["x/other"])],
        },
        Case {
            why: "a VolumeAttachment not being deleted is left to the attach-detach controller",
            obs: with(live, |o| o.attachments = vec![va("va-1", "n2", "pv-1", false, &[ATTACHER])]),
            want: vec![],
        },
        Case {
            why: "a VolumeAttachment being deleted without our finalizer needs nothing",
            obs: with(live, |o| o.attachments = vec![va("va-1", "n2", "pv-1", true, &["x/other"])]),
            want: vec![],
        },
        Case {
            why: "a live node's VolumeAttachment is never touched",
            obs: with(&["n1", "n2"], |o| o.attachments = vec![va("va-1", "n2", "pv-1", true, &[ATTACHER])]),
            want: vec![],
        },
        Case {
            why: "a PV keeps our finalizer while a VolumeAttachment names it",
            obs: with(live, |o| {
                o.attachments = vec![va("va-1", "n2", "pv-1", true, &[ATTACHER])];
                o.volumes = vec![pv("pv-1", "n2", "Bound", "Delete", &[ATTACHER], None)];
            }),
            want: vec![release_va("va-1", &[])],
        },
        Case {
            why: "a PV no VolumeAttachment names loses our finalizer",
            obs: with(live, |o| o.volumes = vec![pv("pv-1", "n2", "Bound", "Retain", &[PROVISIONER_FINALIZER, ATTACHER], None)]),
            want: vec![release_pv("pv-1", &[PROVISIONER_FINALIZER])],
        },
        Case {
            why: "a Released PV with reclaim policy Delete is deleted, the provisioner's finalizer removed",
            obs: with(live, |o| o.volumes = vec![pv("pv-1", "n2", "Released", "Delete", &[PROVISIONER_FINALIZER], None)]),
            want: vec![delete_pv("pv-1", Some(&[]))],
        },
        Case {
            why: "a Released PV no VolumeAttachment names loses both finalizers in one patch",
            obs: with(live, |o| o.volumes = vec![pv("pv-1", "n2", "Released", "Delete", &[ATTACHER, "x/other", PROVISIONER_FINALIZER], None)]),
            want: vec![delete_pv("pv-1", Some(&["x/other"]))],
        },
        Case {
            why: "a Released PV with only foreign finalizers is deleted without a patch",
            obs: with(live, |o| o.volumes = vec![pv("pv-1", "n2", "Released", "Delete", &["x/other"], None)]),
            want: vec![delete_pv("pv-1", None)],
        },
        Case {
            why: "a Released PV without finalizers is just deleted",
            obs: with(live, |o| o.volumes = vec![pv("pv-1", "n2", "Released", "Delete", &[], None)]),
            want: vec![delete_pv("pv-1", None)],
        },
        Case {
            why: "a Released PV with reclaim policy Retain is kept: nobody asked to delete its data",
            obs: with(live, |o| o.volumes = vec![pv("pv-1", "n2", "Released", "Retain", &[PROVISIONER_FINALIZER], None)]),
            want: vec![],
        },
        Case {
            why: "a Bound or Available PV is not deleted",
            obs: with(live, |o| {
                o.volumes = vec![pv("pv-1", "n2", "Available", "Delete", &[], None), pv("pv-2", "n2", "Failed", "Delete", &[], None)];
            }),
            want: vec![],
        },
        Case {
            why: "a Released PV on a live node is the provisioner's business",
            obs: with(&["n1", "n2"], |o| o.volumes = vec![pv("pv-1", "n2", "Released", "Delete", &[PROVISIONER_FINALIZER, ATTACHER], None)]),
            want: vec![],
        },
        Case {
            why: "a Released PV named by a VolumeAttachment is deleted but keeps our finalizer until it is released",
            obs: with(live, |o| {
                o.attachments = vec![va("va-1", "n2", "pv-1", true, &[ATTACHER])];
                o.volumes = vec![pv("pv-1", "n2", "Released", "Delete", &[PROVISIONER_FINALIZER, ATTACHER], None)];
            }),
            want: vec![release_va("va-1", &[]), delete_pv("pv-1", Some(&[ATTACHER]))],
        },
        Case {
            why: "the gone node's Drive objects are deleted, a live node's stay",
            obs: with(live, |o| o.drives = vec![drive("drv-1", "n2"), drive("drv-2", "n1")]),
            want: vec![Duty::DeleteDrive { name: "drv-1".into() }],
        },
        Case {
            why: "a claim of a class without the parameter stays, with a warning",
            obs: with(live, |o| {
                o.volumes = vec![pv("pv-1", "n2", "Bound", "Delete", &[], Some(("apps", "data-0")))];
                o.claims = vec![claim("apps", "data-0", "pv-1", "fast")];
                o.classes = vec![class("fast", None)];
            }),
            want: vec![Duty::WarnClaim { claim: claim_ref("apps", "data-0"), volume: "pv-1".into(), class: "fast".into() }],
        },
        Case {
            why: "keep-claims keeps the claim, with a warning",
            obs: with(live, |o| {
                o.volumes = vec![pv("pv-1", "n2", "Bound", "Delete", &[], Some(("apps", "data-0")))];
                o.claims = vec![claim("apps", "data-0", "pv-1", "fast")];
                o.classes = vec![class("fast", Some("keep-claims"))];
            }),
            want: vec![Duty::WarnClaim { claim: claim_ref("apps", "data-0"), volume: "pv-1".into(), class: "fast".into() }],
        },
        Case {
            why: "a kept claim already warned about this node (by any leader) is not warned again",
            obs: with(live, |o| {
                o.volumes = vec![pv("pv-1", "n2", "Bound", "Delete", &[], Some(("apps", "data-0")))];
                let mut c = claim("apps", "data-0", "pv-1", "fast");
                c.metadata.annotations = Some(BTreeMap::from([(WARNED.to_string(), "n2".to_string())]));
                o.claims = vec![c];
                o.classes = vec![class("fast", Some("keep-claims"))];
            }),
            want: vec![],
        },
        Case {
            why: "a claim warned about another node (its PV moved since) is warned about this one",
            obs: with(live, |o| {
                o.volumes = vec![pv("pv-1", "n2", "Bound", "Delete", &[], Some(("apps", "data-0")))];
                let mut c = claim("apps", "data-0", "pv-1", "fast");
                c.metadata.annotations = Some(BTreeMap::from([(WARNED.to_string(), "n9".to_string())]));
                o.claims = vec![c];
                o.classes = vec![class("fast", Some("keep-claims"))];
            }),
            want: vec![Duty::WarnClaim { claim: claim_ref("apps", "data-0"), volume: "pv-1".into(), class: "fast".into() }],
        },
        Case {
            why: "an unknown value keeps the claim",
            obs: with(live, |o| {
                o.volumes = vec![pv("pv-1", "n2", "Bound", "Delete", &[], Some(("apps", "data-0")))];
                o.claims = vec![claim("apps", "data-0", "pv-1", "fast")];
                o.classes = vec![class("fast", Some("release"))];
            }),
            want: vec![Duty::WarnClaim { claim: claim_ref("apps", "data-0"), volume: "pv-1".into(), class: "fast".into() }],
        },
        Case {
            why: "a class that is gone keeps the claim",
            obs: with(live, |o| {
                o.volumes = vec![pv("pv-1", "n2", "Bound", "Delete", &[], Some(("apps", "data-0")))];
                o.claims = vec![claim("apps", "data-0", "pv-1", "fast")];
            }),
            want: vec![Duty::WarnClaim { claim: claim_ref("apps", "data-0"), volume: "pv-1".into(), class: "fast".into() }],
        },
        Case {
            why: "release-claims releases a claim no pod uses",
            obs: with(live, |o| {
                o.volumes = vec![pv("pv-1", "n2", "Bound", "Delete", &[], Some(("apps", "data-0")))];
                o.claims = vec![claim("apps", "data-0", "pv-1", "fast")];
                o.classes = vec![class("fast", Some("release-claims"))];
            }),
            want: vec![Duty::ReleaseClaim { claim: claim_ref("apps", "data-0"), volume: "pv-1".into(), class: "fast".into() }],
        },
        Case {
            why: "release-claims releases a claim only unscheduled, finished or other namespaces' pods name",
            obs: with(live, |o| {
                o.volumes = vec![pv("pv-1", "n2", "Bound", "Delete", &[], Some(("apps", "data-0")))];
                o.claims = vec![claim("apps", "data-0", "pv-1", "fast")];
                o.classes = vec![class("fast", Some("release-claims"))];
                o.pods = vec![
                    pod("apps", "web-0", "data-0", None, "Pending"),
                    pod("apps", "job-0", "data-0", Some("n1"), "Succeeded"),
                    pod("apps", "job-1", "data-0", Some("n1"), "Failed"),
                    pod("other", "web-0", "data-0", Some("n1"), "Running"),
                    pod("apps", "web-1", "data-1", Some("n1"), "Running"),
                ];
            }),
            want: vec![Duty::ReleaseClaim { claim: claim_ref("apps", "data-0"), volume: "pv-1".into(), class: "fast".into() }],
        },
        Case {
            why: "release-claims waits while a running pod uses the claim",
            obs: with(live, |o| {
                o.volumes = vec![pv("pv-1", "n2", "Bound", "Delete", &[], Some(("apps", "data-0")))];
                o.claims = vec![claim("apps", "data-0", "pv-1", "fast")];
                o.classes = vec![class("fast", Some("release-claims"))];
                o.pods = vec![pod("apps", "web-0", "data-0", Some("n2"), "Running")];
            }),
            want: vec![],
        },
        Case {
            why: "a scheduled pod not yet running counts as using the claim",
            obs: with(live, |o| {
                o.volumes = vec![pv("pv-1", "n2", "Bound", "Delete", &[], Some(("apps", "data-0")))];
                o.claims = vec![claim("apps", "data-0", "pv-1", "fast")];
                o.classes = vec![class("fast", Some("release-claims"))];
                o.pods = vec![pod("apps", "web-0", "data-0", Some("n2"), "Pending")];
            }),
            want: vec![],
        },
        Case {
            why: "a claim already being deleted, or bound to another PV, or another claim of the same name, is left alone",
            obs: with(live, |o| {
                o.volumes = vec![
                    pv("pv-1", "n2", "Bound", "Delete", &[], Some(("apps", "data-0"))),
                    pv("pv-2", "n2", "Bound", "Delete", &[], Some(("apps", "data-1"))),
                    pv("pv-3", "n2", "Bound", "Delete", &[], Some(("apps", "data-2"))),
                ];
                let mut going = claim("apps", "data-0", "pv-1", "fast");
                going.metadata.deletion_timestamp = deleted();
                let elsewhere = claim("apps", "data-1", "pv-9", "fast");
                let mut recreated = claim("apps", "data-2", "pv-3", "fast");
                recreated.metadata.uid = Some("uid-new".into());
                o.claims = vec![going, elsewhere, recreated];
                o.classes = vec![class("fast", Some("release-claims"))];
            }),
            want: vec![],
        },
        Case {
            why: "a claim of a live node's PV is never released",
            obs: with(&["n1", "n2"], |o| {
                o.volumes = vec![pv("pv-1", "n2", "Bound", "Delete", &[], Some(("apps", "data-0")))];
                o.claims = vec![claim("apps", "data-0", "pv-1", "fast")];
                o.classes = vec![class("fast", Some("release-claims"))];
            }),
            want: vec![],
        },
    ];
    for Case { why, obs: (obs, gone), want } in cases {
        let got = plan(&obs, DRIVER, &gone);
        let got = got.get("n2").cloned().unwrap_or_default();
        assert_eq!(got, want, "{why}");
        assert!(plan(&obs, DRIVER, &gone).keys().all(|n| n == "n2"), "{why}: only the gone node has duties");
    }
}

#[test]
fn a_round_reads_claims_only_of_gone_nodes_bound_pvs_and_pods_only_where_claims_may_be_released() {
    let (obs, gone) = with(&["n1"], |o| {
        o.volumes = vec![
            pv("pv-1", "n2", "Bound", "Delete", &[], Some(("apps", "data-0"))),
            pv("pv-2", "n2", "Released", "Delete", &[], Some(("apps", "data-1"))),
            pv("pv-3", "n1", "Bound", "Delete", &[], Some(("apps", "data-2"))),
            pv("pv-4", "n2", "Bound", "Delete", &[], Some(("db", "data-0"))),
        ];
    });
    let want: BTreeSet<(String, String)> =
        [("apps", "data-0"), ("db", "data-0")].iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    assert_eq!(claims_to_read(&obs, DRIVER, &gone), want);

    let (obs, _) = with(&["n1"], |o| {
        o.claims = vec![claim("apps", "data-0", "pv-1", "fast"), claim("db", "data-0", "pv-4", "slow")];
        o.classes = vec![class("fast", Some("release-claims")), class("slow", None)];
    });
    assert_eq!(releasing_namespaces(&obs), BTreeSet::from(["apps".to_string()]));
}

#[test]
fn duties_come_in_order_attachments_volumes_drives_claims_for_each_gone_node() {
    let (obs, gone) = with(&["n1"], |o| {
        o.drives = vec![drive("drv-2", "n2"), drive("drv-3", "n3")];
        o.volumes = vec![
            pv("pv-1", "n2", "Bound", "Delete", &[ATTACHER], Some(("apps", "data-0"))),
            pv("pv-2", "n2", "Released", "Delete", &[ATTACHER], None),
        ];
        o.attachments = vec![va("va-1", "n2", "pv-9", true, &[ATTACHER])];
        o.claims = vec![claim("apps", "data-0", "pv-1", "fast")];
    });
    let got = plan(&obs, DRIVER, &gone);
    assert_eq!(got.keys().collect::<Vec<_>>(), vec!["n2", "n3"]);
    let kinds: Vec<&str> = got["n2"]
        .iter()
        .map(|d| match d {
            Duty::ReleaseAttachment { .. } => "va",
            Duty::ReleaseVolume { .. } => "pv-finalizer",
            Duty::DeleteVolume { .. } => "pv-delete",
            Duty::DeleteDrive { .. } => "drive",
            Duty::ReleaseClaim { .. } => "release",
            Duty::WarnClaim { .. } => "warn",
        })
        .collect();
    assert_eq!(kinds, vec!["va", "pv-finalizer", "pv-delete", "drive", "warn"]);
    assert_eq!(got["n3"], vec![Duty::DeleteDrive { name: "drv-3".into() }]);
}
