//! Table tests of the re-homing decisions.

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::*;
use crate::actors::volumes::model::VolumeState;

pub(crate) const DRIVER: &str = "drivelet.io";
pub(crate) const HERE: &str = "node-1";

/// Volume `vol-a` of 64 MiB, ext4, on drive `d2`, made for PV `pv-a` and claim
/// `apps/data-0` (uid `uid-0`, class `fast`) as its note says.
pub(crate) fn record() -> VolumeRecord {
    let mut r = VolumeRecord::for_test(1, VolumeState::Available);
    r.id = "vol-a".into();
    r.drive_id = "d2".into();
    r.size = 64 << 20;
    r.block = false;
    r.fs_type = "ext4".into();
    r.binding = Binding {
        pv: "pv-a".into(),
        claim_namespace: "apps".into(),
        claim_name: "data-0".into(),
        claim_uid: "uid-0".into(),
        storage_class: "fast".into(),
    };
    r
}

/// PV `pv-a` of `driver` for `handle`, pinned to `node`, with `policy`, finalizers and
/// a claimRef to `apps/data-0` of `uid`.
pub(crate) fn pv(driver: &str, handle: &str, node: &str, policy: &str, finalizers: &[&str], uid: Option<&str>) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some("pv-a".into()),
            labels: Some(BTreeMap::from([("team".to_string(), "db".to_string())])),
            annotations: Some(BTreeMap::from([(PROVISIONED_BY.to_string(), driver.to_string())])),
            finalizers: Some(finalizers.iter().map(|f| f.to_string()).collect()),
            resource_version: Some("7".into()),
            uid: Some("pv-uid".into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource { driver: driver.into(), volume_handle: handle.into(), fs_type: Some("ext4".into()), ..Default::default() }),
            persistent_volume_reclaim_policy: Some(policy.into()),
            storage_class_name: Some("fast".into()),
            mount_options: Some(vec!["noatime".into()]),
            claim_ref: uid.map(|u| ObjectReference {
                kind: Some("PersistentVolumeClaim".into()),
                namespace: Some("apps".into()),
                name: Some("data-0".into()),
                uid: Some(u.into()),
                resource_version: Some("99".into()),
                ..Default::default()
            }),
            node_affinity: Some(pinned_to(node)),
            ..Default::default()
        }),
        status: None,
    }
}

/// Claim `apps/data-0` of `uid`, naming PV `volume`.
pub(crate) fn claim(uid: &str, volume: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta { name: Some("data-0".into()), namespace: Some("apps".into()), uid: Some(uid.into()), ..Default::default() },
        spec: Some(PersistentVolumeClaimSpec {
            volume_name: (!volume.is_empty()).then(|| volume.into()),
            storage_class_name: Some("fast".into()),
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            ..Default::default()
        }),
        status: None,
    }
}

const PVF: &str = "kubernetes.io/pv-protection";
const PROV: &str = PROVISIONER_FINALIZER;

/// The kinds of a plan's steps, for the table.
fn kinds(plan: &Plan) -> Vec<&'static str> {
    plan.steps
        .iter()
        .map(|s| match s {
            Step::Retain { .. } => "retain",
            Step::DropFinalizers { .. } => "drop-finalizers",
            Step::DeletePv { .. } => "delete-pv",
            Step::CreateClaim(_) => "create-claim",
            Step::CreatePv(_) => "create-pv",
            Step::Tell { .. } => "tell",
            Step::SetBinding(_) => "set-binding",
        })
        .collect()
}

#[test]
fn each_case_of_a_volume_and_its_pv_and_claim_is_decided_as_the_rules_say() {
    let rec = record();
    let mut no_pv_name = record();
    no_pv_name.binding.pv.clear();
    let mut no_claim_known = record();
    no_claim_known.binding.claim_name.clear();
    let here = pv(DRIVER, "vol-a", HERE, "Delete", &[PVF, PROV], Some("uid-0"));
    let there = pv(DRIVER, "vol-a", "node-2", "Delete", &[PVF, PROV, "drivelet.io/attacher"], Some("uid-0"));
    let there_retained = {
        let mut p = pv(DRIVER, "vol-a", "node-2", "Retain", &[PVF], Some("uid-0"));
        p.metadata.annotations.get_or_insert_default().insert(POLICY_BEFORE.into(), "Delete".into());
        p
    };
    let there_going = {
        let mut p = pv(DRIVER, "vol-a", "node-2", "Retain", &[PVF], Some("uid-0"));
        p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        p
    };
    let there_going_bare = {
        let mut p = there_going.clone();
        p.metadata.finalizers = None;
        p
    };
    let there_unbound = pv(DRIVER, "vol-a", "node-2", "Delete", &[], None);
    let nowhere = {
        let mut p = pv(DRIVER, "vol-a", "node-2", "Delete", &[PVF], Some("uid-0"));
        p.spec.as_mut().unwrap().node_affinity = None;
        p
    };
    let other_driver = pv("other.csi.io", "vol-a", "node-2", "Delete", &[PVF], Some("uid-0"));
    let other_volume = pv(DRIVER, "vol-b", "node-2", "Delete", &[PVF], Some("uid-0"));
    let bound = claim("uid-0", "pv-a");
    let recreated = claim("uid-9", "pv-a");
    let elsewhere = claim("uid-0", "pv-z");
    let pending = claim("uid-0", "");
    let new_uid = claim("uid-new", "pv-a");
    // (case, record, PV, claim, restore claims, steps, words in why)
    type Case<'a> = (&'a str, &'a VolumeRecord, Option<&'a PersistentVolume>, Option<&'a PersistentVolumeClaim>, bool, Vec<&'a str>, &'a str);
    let table: Vec<Case<'_>> = vec![
        ("PV already pinned here: nothing", &rec, Some(&here), Some(&bound), false, vec![], "pinned to this node"),
        ("pinned here, the claim's uid is new (restored claim): the binding follows", &rec, Some(&here), Some(&new_uid), false, vec!["set-binding"], "pinned to this node"),
        ("PV without drivelet's node affinity: nothing", &rec, Some(&nowhere), Some(&bound), false, vec![], "names no node under topology.drivelet.io/node"),
        ("PV of another driver: nothing", &rec, Some(&other_driver), Some(&bound), false, vec![], "of driver other.csi.io"),
        ("PV of another volume: nothing", &rec, Some(&other_volume), Some(&bound), false, vec![], "serves volume vol-b"),
        ("no PV known: nothing", &no_pv_name, None, None, true, vec![], "no PV is known"),
        (
            "PV pinned elsewhere, bound: Retain, finalizers, delete, create, tell",
            &rec,
            Some(&there),
            Some(&bound),
            false,
            vec!["retain", "drop-finalizers", "delete-pv", "create-pv", "tell"],
            "pinned to node node-2",
        ),
        ("killed after Retain: goes on from there", &rec, Some(&there_retained), Some(&bound), false, vec!["drop-finalizers", "delete-pv", "create-pv", "tell"], "node-2"),
        ("killed after the delete, a finalizer came back: drop it, create", &rec, Some(&there_going), Some(&bound), false, vec!["drop-finalizers", "create-pv", "tell"], "node-2"),
        ("killed after the delete, still going: create (409 until gone)", &rec, Some(&there_going_bare), Some(&bound), false, vec!["create-pv", "tell"], "node-2"),
        ("an unbound PV pinned elsewhere: replaced, nobody to tell", &rec, Some(&there_unbound), None, false, vec!["retain", "delete-pv", "create-pv"], "node-2"),
        ("claim uid differs: nothing, say why", &rec, Some(&there), Some(&recreated), false, vec![], "another one (uid uid-9)"),
        ("claim bound to another PV: nothing", &rec, Some(&there), Some(&elsewhere), false, vec![], "bound to PV pv-z"),
        ("PV pinned elsewhere, its claim gone: nothing", &rec, Some(&there), None, true, vec![], "claim apps/data-0 is gone"),
        ("PV gone, claim names it: recreate the PV", &rec, None, Some(&bound), false, vec!["create-pv", "tell"], "created again"),
        ("PV gone (killed after the delete), claim names it: recreate", &rec, None, Some(&recreated), false, vec!["create-pv", "tell"], "created again"),
        ("PV gone, claim names another PV: nothing", &rec, None, Some(&elsewhere), true, vec![], "names PV pv-z"),
        ("PV gone, claim pending on no PV: nothing", &rec, None, Some(&pending), true, vec![], "names no PV"),
        ("neither, restore claims: claim then PV", &rec, None, None, true, vec!["create-claim", "create-pv", "tell"], "both are restored"),
        ("neither, no restore: kept and listed", &rec, None, None, false, vec![], "kept and listed"),
        ("neither, no claim known: kept and listed", &no_claim_known, None, None, true, vec![], "no claim is known"),
    ];
    for (case, rec, pv, claim, restore_claims, steps, why) in table {
        let plan = decide(HERE, DRIVER, &Seen { record: rec, pv, claim, restore_claims, stage_secret: None });
        assert_eq!(kinds(&plan), steps, "{case}: {}", plan.why);
        assert!(plan.why.contains(why), "{case}: {:?} says {why:?}", plan.why);
        assert!(!plan.why.contains("Some(") && !plan.why.contains("{ "), "{case}: plain words: {}", plan.why);
    }
}

#[test]
fn no_plan_deletes_a_pv_whose_reclaim_policy_could_still_be_delete() {
    let rec = record();
    for policy in ["Delete", "Recycle", "Retain"] {
        let there = pv(DRIVER, "vol-a", "node-2", policy, &[PVF], Some("uid-0"));
        let plan = decide(HERE, DRIVER, &Seen { record: &rec, pv: Some(&there), claim: Some(&claim("uid-0", "pv-a")), restore_claims: false, stage_secret: None });
        let retain = plan.steps.iter().position(|s| matches!(s, Step::Retain { .. }));
        let delete = plan.steps.iter().position(|s| matches!(s, Step::DeletePv { .. })).expect("the PV is replaced");
        match policy {
            "Retain" => assert_eq!(retain, None, "Retain already: nothing to patch"),
            _ => assert!(retain.is_some_and(|r| r < delete), "{policy}: Retain comes before the delete"),
        }
    }
}

#[test]
fn the_replacement_keeps_the_pv_but_its_node_its_policy_and_the_claim_it_is_bound_to() {
    let rec = record();
    let there = pv(DRIVER, "vol-a", "node-2", "Delete", &[PVF, PROV, "drivelet.io/attacher"], Some("uid-0"));
    let plan = decide(HERE, DRIVER, &Seen { record: &rec, pv: Some(&there), claim: Some(&claim("uid-0", "pv-a")), restore_claims: false, stage_secret: None });
    let Some(Step::CreatePv(new)) = plan.steps.iter().find(|s| matches!(s, Step::CreatePv(_))) else { panic!("no create") };
    let (old, new_spec) = (there.spec.clone().unwrap(), new.spec.clone().unwrap());
    assert_eq!(new.metadata.name.as_deref(), Some("pv-a"));
    assert_eq!(new.metadata.labels, there.metadata.labels);
    assert_eq!(new.metadata.annotations.as_ref().unwrap()[PROVISIONED_BY], DRIVER);
    assert_eq!(new.metadata.finalizers, Some(vec![PROV.to_string()]), "only the provisioner's finalizer is carried");
    assert!(new.metadata.resource_version.is_none() && new.metadata.uid.is_none());
    assert_eq!(pinned_nodes(new), vec![HERE.to_string()]);
    assert_eq!(new_spec.persistent_volume_reclaim_policy.as_deref(), Some("Delete"), "the policy it had");
    let r = new_spec.claim_ref.clone().unwrap();
    assert_eq!((r.namespace.as_deref(), r.name.as_deref(), r.uid.as_deref()), (Some("apps"), Some("data-0"), Some("uid-0")));
    assert!(r.resource_version.is_none());
    assert_eq!(new_spec.csi, old.csi);
    assert_eq!(new_spec.mount_options, old.mount_options);
    assert_eq!(new_spec.storage_class_name, old.storage_class_name);

    // Killed after Retain: the policy it had comes from the annotation.
    let mut retained = there.clone();
    retained.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Retain".into());
    retained.metadata.annotations.get_or_insert_default().insert(POLICY_BEFORE.into(), "Delete".into());
    let plan = decide(HERE, DRIVER, &Seen { record: &rec, pv: Some(&retained), claim: Some(&claim("uid-0", "pv-a")), restore_claims: false, stage_secret: None });
    let Some(Step::CreatePv(new)) = plan.steps.iter().find(|s| matches!(s, Step::CreatePv(_))) else { panic!("no create") };
    assert_eq!(new.spec.as_ref().unwrap().persistent_volume_reclaim_policy.as_deref(), Some("Delete"));
    assert!(!new.metadata.annotations.as_ref().unwrap().contains_key(POLICY_BEFORE));
}

#[test]
fn a_restored_claim_and_its_pv_say_what_the_note_says() {
    let mut rec = record();
    rec.block = true;
    let plan = decide(HERE, DRIVER, &Seen { record: &rec, pv: None, claim: None, restore_claims: true, stage_secret: None });
    let Step::CreateClaim(c) = &plan.steps[0] else { panic!("claim first") };
    let Step::CreatePv(p) = &plan.steps[1] else { panic!("then the PV") };
    let cs = c.spec.clone().unwrap();
    assert_eq!((c.namespace().as_deref(), c.name_any().as_str()), (Some("apps"), "data-0"));
    assert_eq!(cs.volume_name.as_deref(), Some("pv-a"));
    assert_eq!(cs.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(cs.volume_mode.as_deref(), Some("Block"));
    assert_eq!(cs.access_modes, Some(vec!["ReadWriteOnce".to_string()]));
    assert_eq!(cs.resources.unwrap().requests.unwrap()["storage"].0, (64u64 << 20).to_string());
    assert_eq!(c.annotations()[RESTORED_FOR], "vol-a");
    let ps = p.spec.clone().unwrap();
    assert_eq!(p.name_any(), "pv-a");
    assert_eq!(ps.csi.as_ref().unwrap().volume_handle, "vol-a");
    assert_eq!(ps.csi.as_ref().unwrap().driver, DRIVER);
    assert_eq!(ps.csi.as_ref().unwrap().fs_type, None, "a block volume has no filesystem");
    assert_eq!(ps.volume_mode.as_deref(), Some("Block"));
    assert_eq!(ps.persistent_volume_reclaim_policy.as_deref(), Some("Retain"));
    assert_eq!(ps.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(pinned_nodes(p), vec![HERE.to_string()]);
    let r = ps.claim_ref.unwrap();
    assert_eq!((r.namespace.as_deref(), r.name.as_deref(), r.uid), (Some("apps"), Some("data-0"), None), "the uid is the created claim's");
}

#[test]
fn the_binding_is_filled_from_the_claim_bound_to_the_volumes_pv() {
    let mut rec = record();
    rec.binding.claim_uid.clear();
    rec.binding.storage_class.clear();
    let want = Binding { claim_uid: "uid-0".into(), storage_class: "fast".into(), ..record().binding };
    assert_eq!(binding_update(&rec, Some(&claim("uid-0", "pv-a"))), Some(want));
    assert_eq!(binding_update(&record(), Some(&claim("uid-0", "pv-a"))), None, "already so");
    assert_eq!(binding_update(&rec, Some(&claim("uid-0", "pv-z"))), None, "a claim of another PV says nothing of this one");
    assert_eq!(binding_update(&rec, None), None);
}

#[test]
fn an_encrypted_volumes_pv_made_again_names_its_class_node_stage_secret() {
    let params: BTreeMap<String, String> = [
        ("csi.storage.k8s.io/node-stage-secret-name".to_string(), "kek-${pvc.name}".to_string()),
        ("csi.storage.k8s.io/node-stage-secret-namespace".to_string(), "${pvc.namespace}".to_string()),
    ]
    .into();
    let secret = super::stage_secret_of(&params, ("apps", "data-0"), "pv-a");
    assert_eq!(secret, Some(("apps".to_string(), "kek-data-0".to_string())));
    assert_eq!(super::stage_secret_of(&BTreeMap::new(), ("apps", "data-0"), "pv-a"), None, "a class naming no Secret");
    let rec = record();
    let plan = decide(HERE, DRIVER, &Seen { record: &rec, pv: None, claim: None, restore_claims: true, stage_secret: secret });
    let Step::CreatePv(p) = &plan.steps[1] else { panic!("the PV") };
    let r = p.spec.as_ref().unwrap().csi.as_ref().unwrap().node_stage_secret_ref.clone().expect("the Secret named");
    assert_eq!((r.namespace.as_deref(), r.name.as_deref()), (Some("apps"), Some("kek-data-0")));
}
