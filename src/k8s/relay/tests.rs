//! The relay's decisions and its view: which node each object belongs to, and what a
//! change makes it look at again.

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeSpec,
};
use k8s_openapi::api::storage::v1::{VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

use super::view::{Target, View};
use super::*;
use crate::k8s::crd::{Drive, DriveStatus};
use crate::k8s::snapshot::objects::{ContentSource, VolumeSnapshotContent, VolumeSnapshotContentSpec, VolumeSnapshotContentStatus};

const DRIVER: &str = "csi.drivelet.io";

fn meta(name: &str, label: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        labels: label.map(|l| [(NODE_LABEL.to_string(), l.to_string())].into()),
        ..Default::default()
    }
}

fn pv(name: &str, handle: &str, node: &str, claim: Option<(&str, &str)>, label: Option<&str>) -> PersistentVolume {
    PersistentVolume {
        metadata: meta(name, label),
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource { driver: DRIVER.into(), volume_handle: handle.into(), ..Default::default() }),
            node_affinity: Some(crate::k8s::rehome::pinned_to(node)),
            claim_ref: claim.map(|(ns, n)| ObjectReference { namespace: Some(ns.into()), name: Some(n.into()), ..Default::default() }),
            ..Default::default()
        }),
        status: None,
    }
}

fn claim(ns: &str, name: &str, volume: Option<&str>, selected: Option<&str>, provisioner: Option<&str>, label: Option<&str>) -> PersistentVolumeClaim {
    let mut m = meta(name, label);
    m.namespace = Some(ns.into());
    let mut a = std::collections::BTreeMap::new();
    if let Some(s) = selected {
        a.insert(SELECTED_NODE.to_string(), s.to_string());
    }
    if let Some(p) = provisioner {
        a.insert(STORAGE_PROVISIONER.to_string(), p.to_string());
    }
    m.annotations = Some(a);
    PersistentVolumeClaim {
        metadata: m,
        spec: Some(PersistentVolumeClaimSpec { volume_name: volume.map(String::from), ..Default::default() }),
        status: None,
    }
}

fn va(name: &str, attacher: &str, node: &str, label: Option<&str>) -> VolumeAttachment {
    VolumeAttachment {
        metadata: meta(name, label),
        spec: VolumeAttachmentSpec {
            attacher: attacher.into(),
            node_name: node.into(),
            source: VolumeAttachmentSource { persistent_volume_name: Some("pv-1".into()), ..Default::default() },
        },
        status: None,
    }
}

fn content(name: &str, volume: Option<&str>, snapshot: Option<&str>) -> VolumeSnapshotContent {
    let mut c = VolumeSnapshotContent::new(
        name,
        VolumeSnapshotContentSpec {
            driver: DRIVER.into(),
            source: ContentSource { volume_handle: volume.map(String::from), snapshot_handle: None },
            ..Default::default()
        },
    );
    c.status = snapshot.map(|s| VolumeSnapshotContentStatus { snapshot_handle: Some(s.into()), ..Default::default() });
    c
}

fn drive(name: &str, node: &str, volumes: &[&str], snapshots: &[&str]) -> Drive {
    let mut d = crate::k8s::duties::tests::drive(name, node);
    d.status = Some(DriveStatus {
        volumes: volumes.iter().map(|v| v.to_string()).collect(),
        snapshots: snapshots.iter().map(|v| v.to_string()).collect(),
        ..Default::default()
    });
    d
}

fn want(v: &View, t: &Target) -> Option<String> {
    v.want(t).map(|(n, _)| n.to_string())
}

#[test]
fn the_patch_names_the_one_label_and_nothing_when_it_is_right() {
    assert_eq!(label_patch(None, "node-1"), Some(json!({"metadata": {"labels": {NODE_LABEL: "node-1"}}})));
    assert_eq!(label_patch(Some("node-2"), "node-1"), Some(json!({"metadata": {"labels": {NODE_LABEL: "node-1"}}})));
    assert_eq!(label_patch(Some("node-1"), "node-1"), None);
}

#[test]
fn a_claim_belongs_to_its_pvs_node_else_to_its_selected_node_when_ours() {
    let cases = [
        ((Some("n1"), Some("n2"), true), Some("n1")),
        ((None, Some("n2"), true), Some("n2")),
        ((None, Some("n2"), false), None),
        ((None, None, true), None),
        ((Some("n1"), None, false), Some("n1")),
    ];
    for ((pv, selected, ours), want) in cases {
        assert_eq!(claim_node(pv, selected, ours), want, "{pv:?} {selected:?} {ours}");
    }
    assert_eq!(content_node(Some("a"), Some("b")), Some("a"));
    assert_eq!(content_node(None, Some("b")), Some("b"));
}

#[test]
fn an_attachment_of_another_driver_is_never_labelled() {
    let mut v = View::new(DRIVER);
    assert!(v.apply_va(&va("other", "ebs.csi.example.com", "n1", None)).is_empty());
    let t = v.apply_va(&va("ours", DRIVER, "n1", None));
    assert_eq!(t, vec![Target::Va("ours".into())]);
    assert_eq!(want(&v, &t[0]), Some("n1".into()));
    assert!(v.patch_for(&t[0]).is_some());
    v.apply_va(&va("ours", DRIVER, "n1", Some("n1")));
    assert!(v.patch_for(&t[0]).is_none(), "labelled already: nothing to write");
}

#[test]
fn a_pv_labels_itself_its_claim_and_its_volumes_contents() {
    let mut v = View::new(DRIVER);
    // The claim and the content come first: neither has a node yet.
    v.apply_claim(&claim("db", "data", Some("pv-1"), None, None, None));
    v.apply_content(&content("snapcontent-1", Some("vol-1"), None));
    assert_eq!(want(&v, &Target::Claim("db".into(), "data".into())), None);
    assert_eq!(want(&v, &Target::Content("snapcontent-1".into())), None);
    let mut t = v.apply_pv(&pv("pv-1", "vol-1", "n1", Some(("db", "data")), None));
    t.sort();
    assert_eq!(t, vec![Target::Pv("pv-1".into()), Target::Claim("db".into(), "data".into()), Target::Content("snapcontent-1".into())]);
    for t in &t {
        assert_eq!(want(&v, t), Some("n1".into()), "{t:?}");
    }
    // Another driver's PV is none of the relay's business.
    let mut other = pv("pv-2", "x", "n1", None, None);
    other.spec.as_mut().unwrap().csi.as_mut().unwrap().driver = "other".into();
    assert!(v.apply_pv(&other).is_empty());
    assert_eq!(want(&v, &Target::Pv("pv-2".into())), None);
}

#[test]
fn a_claim_of_ours_waiting_for_provisioning_follows_its_selected_node() {
    let mut v = View::new(DRIVER);
    let t = v.apply_claim(&claim("db", "data", None, Some("n2"), Some(DRIVER), None));
    assert_eq!(want(&v, &t[0]), Some("n2".into()));
    let t = v.apply_claim(&claim("db", "other", None, Some("n2"), Some("other.example.com"), None));
    assert_eq!(want(&v, &t[0]), None, "another provisioner's claim is left alone");
    // Bound to a PV pinned elsewhere: the PV wins.
    v.apply_pv(&pv("pv-9", "vol-9", "n3", Some(("db", "data")), None));
    assert_eq!(want(&v, &Target::Claim("db".into(), "data".into())), Some("n3".into()));
}

#[test]
fn a_re_homed_pv_moves_its_label_and_its_claims() {
    let mut v = View::new(DRIVER);
    v.apply_claim(&claim("db", "data", Some("pv-1"), None, None, Some("n1")));
    v.apply_pv(&pv("pv-1", "vol-1", "n1", Some(("db", "data")), Some("n1")));
    assert!(v.patch_for(&Target::Pv("pv-1".into())).is_none());
    v.apply_pv(&pv("pv-1", "vol-1", "n2", Some(("db", "data")), Some("n1")));
    assert_eq!(v.patch_for(&Target::Pv("pv-1".into())), label_patch(None, "n2"));
    assert_eq!(v.patch_for(&Target::Claim("db".into(), "data".into())), label_patch(None, "n2"));
}

#[test]
fn a_pre_provisioned_content_follows_the_drive_that_lists_its_snapshot() {
    let mut v = View::new(DRIVER);
    v.apply_content(&content("pre", None, Some("snap-7")));
    assert_eq!(want(&v, &Target::Content("pre".into())), None);
    let t = v.apply_drive(&drive("n4-disk", "n4", &["vol-3"], &["snap-7"]));
    assert_eq!(t, vec![Target::Content("pre".into())]);
    assert_eq!(want(&v, &t[0]), Some("n4".into()));
    // A content of a volume whose PV is gone still finds its node by the Drive object.
    v.apply_content(&content("c3", Some("vol-3"), None));
    assert_eq!(want(&v, &Target::Content("c3".into())), Some("n4".into()));
    // The Drive object gone: the node is unknown again, and the label is left as it is.
    v.delete_drive("n4-disk");
    assert_eq!(want(&v, &Target::Content("pre".into())), None);
}

#[test]
fn a_deleted_pv_leaves_no_trace_in_the_view() {
    let mut v = View::new(DRIVER);
    v.apply_pv(&pv("pv-1", "vol-1", "n1", Some(("db", "data")), None));
    v.apply_claim(&claim("db", "data", None, None, None, None));
    assert_eq!(want(&v, &Target::Claim("db".into(), "data".into())), Some("n1".into()));
    let t = v.delete_pv("pv-1");
    assert_eq!(t, vec![Target::Claim("db".into(), "data".into())]);
    assert_eq!(want(&v, &t[0]), None);
    assert_eq!(v.counts(), [0, 1, 0, 0, 0]);
}

#[test]
fn a_pv_without_drivelets_affinity_follows_the_drive_that_lists_its_volume() {
    let mut v = View::new(DRIVER);
    let mut bare = pv("pv-h", "vol-h", "n1", None, None);
    bare.spec.as_mut().unwrap().node_affinity = None;
    let t = v.apply_pv(&bare);
    assert_eq!(want(&v, &t[0]), None, "no affinity, no Drive object yet: left alone");
    let t = v.apply_drive(&drive("n5-disk", "n5", &["vol-h"], &[]));
    assert_eq!(t, vec![Target::Pv("pv-h".into())]);
    assert_eq!(want(&v, &t[0]), Some("n5".into()));
}
