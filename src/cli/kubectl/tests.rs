//! The plugin's rows and tables from Drive objects, and its exit codes.

use super::*;
use crate::k8s::crd::{DriveCondition, DrivePresence, DriveSpec, DriveStatus, DriveUsage, DriveVolume};

fn drive(node: &str, id: &str, status: DriveStatus) -> Drive {
    let mut d = Drive::new(
        &crate::k8s::drives::object_name(node, id),
        DriveSpec {
            node: node.into(),
            drive_id: id.into(),
            serial: None,
            wwn: None,
            model: None,
            size_bytes: 1 << 30,
            size: Some("1.0 GiB".into()),
            media: "ssd".into(),
            action: None,
            restore_claims: None,
        },
    );
    d.status = Some(status);
    d
}

fn managed(volumes: Vec<DriveVolume>) -> DriveStatus {
    DriveStatus {
        class: Some(DriveClass::Managed),
        class_reason: Some("carries a drivelet GPT".into()),
        owner: None,
        health: Some(DriveHealth::Unknown),
        health_reason: Some(NOT_CHECKED.into()),
        usage: Some(DriveUsage::Active),
        presence: DrivePresence::Present,
        volumes: volumes.iter().map(|v| v.id.clone()).collect(),
        volume_details: volumes,
        free_bytes: Some(512 << 20),
        free_slots: Some(250),
        ..Default::default()
    }
}

fn volume(id: &str, used: Option<u64>, why: Option<&str>) -> DriveVolume {
    DriveVolume {
        id: id.into(),
        name: format!("pvc-{id}"),
        size_bytes: 64 << 20,
        used_bytes: used,
        kind: "ext4".into(),
        state: "published".into(),
        health: if why.is_some() { "abnormal" } else { "normal" }.into(),
        health_reason: why.map(str::to_string),
        pods: vec![],
    }
}

#[test]
fn drives_read_as_ctl_drives_with_the_node_first_sorted_and_unchecked_health_unsaid() {
    let mut releasing = managed(vec![volume("v3", None, None)]);
    releasing.health = Some(DriveHealth::Bad);
    releasing.health_reason = Some("12 reallocated sectors".into());
    releasing.usage = Some(DriveUsage::Releasing);
    releasing.usage_reason = Some("health is BAD: 12 reallocated sectors".into());
    let mut foreign = DriveStatus { class: Some(DriveClass::Foreign), class_reason: Some("has an ext4 filesystem".into()), ..Default::default() };
    foreign.health = Some(DriveHealth::Good);
    let mut cordoned = drive("node-a", "d2", managed(vec![]));
    cordoned.spec.action = Some(DriveAction::Cordon);
    let st = cordoned.status.as_mut().expect("status");
    st.usage = Some(DriveUsage::Cordoned);
    st.usage_reason = Some("cordoned by an admin".into());
    st.conditions = vec![DriveCondition {
        type_: ACTION_COMPLETE.into(),
        status: "True".into(),
        reason: "Cordoned".into(),
        message: "drive d2 takes no new volumes".into(),
        observed_generation: 2,
        last_transition_time: "2026-11-26T19:00:00Z".into(),
    }];
    let drives = [drive("node-b", "d9", releasing), cordoned, drive("node-a", "d1", foreign)];
    let mut rows: Vec<DriveRow> = drives.iter().map(drive_row).collect();
    rows.sort_by(|a, b| (&a.node, &a.id).cmp(&(&b.node, &b.id)));
    let out = drives_table(&rows);
    let want = "\
NODE    ID  SIZE     MEDIA  CLASS    HEALTH   USAGE      FREE       SLOTS  VOLS  REASON
node-a  d1  1.0 GiB  ssd    foreign  good     active     -          -      -     has an ext4 filesystem
node-a  d2  1.0 GiB  ssd    managed  unknown  cordoned   512.0 MiB  250    0     carries a drivelet GPT; cordoned: cordoned by an admin
node-b  d9  1.0 GiB  ssd    managed  bad      releasing  512.0 MiB  250    1     carries a drivelet GPT; health: 12 reallocated sectors; releasing: health is BAD: 12 reallocated sectors
";
    assert_eq!(out, want, "\n{out}");
    assert_eq!(rows[1].action.as_deref(), Some("cordon"));
    assert_eq!(rows[1].action_status.as_deref(), Some("drive d2 takes no new volumes"));
    let json = serde_json::to_value(&rows[2]).expect("serializes");
    assert_eq!((json["sizeBytes"].as_u64(), json["freeBytes"].as_u64(), json["freeSlots"].as_u64()), (Some(1 << 30), Some(512 << 20), Some(250)));
}

#[test]
fn volumes_across_drives_and_nodes_show_used_bytes_and_why_a_volume_is_abnormal() {
    let drives = [
        drive("node-b", "d1", managed(vec![volume("v2", None, Some("drive d1 is failing"))])),
        drive("node-a", "d1", managed(vec![volume("v9", Some(3 << 20), None), volume("v1", None, None)])),
    ];
    let out = volumes_table(&volume_rows(&drives), false);
    let want = "\
NODE    ID  NAME    DRIVE  SIZE      USED     KIND  STATE      HEALTH    REASON
node-a  v1  pvc-v1  d1     64.0 MiB  -        ext4  published  normal
node-a  v9  pvc-v9  d1     64.0 MiB  3.0 MiB  ext4  published  normal
node-b  v2  pvc-v2  d1     64.0 MiB  -        ext4  published  abnormal  drive d1 is failing
";
    assert_eq!(out, want, "\n{out}");
}

#[test]
fn the_wide_volumes_table_names_the_pods_using_each_volume_and_json_always_does() {
    let mut used = volume("v1", Some(3 << 20), None);
    used.pods = vec!["apps/web-0".into(), "apps/web-1".into()];
    let drives = [drive("node-a", "d1", managed(vec![used, volume("v2", None, None)]))];
    let rows = volume_rows(&drives);
    let want = "\
NODE    ID  NAME    DRIVE  SIZE      USED     KIND  STATE      HEALTH  PODS                   REASON
node-a  v1  pvc-v1  d1     64.0 MiB  3.0 MiB  ext4  published  normal  apps/web-0,apps/web-1
node-a  v2  pvc-v2  d1     64.0 MiB  -        ext4  published  normal  -
";
    let out = volumes_table(&rows, true);
    assert_eq!(out, want, "\n{out}");
    assert!(!volumes_table(&rows, false).contains("PODS"), "the default table is ctl's");
    let json = serde_json::to_value(&rows).expect("serializes");
    assert_eq!(json[0]["pods"], serde_json::json!(["apps/web-0", "apps/web-1"]));
}

#[test]
fn an_evacuation_is_asked_again_only_when_it_stands_with_a_failed_move_or_a_refusal() {
    let with = |action: Option<DriveAction>, reason: &str| {
        let mut d = drive("node-a", "d1", managed(vec![]));
        d.spec.action = action;
        if !reason.is_empty() {
            d.status.get_or_insert_default().conditions = vec![DriveCondition {
                type_: ACTION_COMPLETE.into(),
                status: "False".into(),
                reason: reason.into(),
                message: "m".into(),
                observed_generation: 1,
                last_transition_time: "2026-11-26T23:00:00Z".into(),
            }];
        }
        d
    };
    // (case, drive, action asked, ask again)
    let table = [
        ("first ask", with(None, ""), Action::Evacuate, false),
        ("under way", with(Some(DriveAction::Evacuate), "Evacuating"), Action::Evacuate, false),
        ("a move failed", with(Some(DriveAction::Evacuate), "EvacuationFailed"), Action::Evacuate, true),
        ("refused: no room", with(Some(DriveAction::Evacuate), "Refused"), Action::Evacuate, true),
        ("a release is another action", with(Some(DriveAction::Release), "EvacuationFailed"), Action::Evacuate, false),
        ("only an evacuation", with(Some(DriveAction::Evacuate), "EvacuationFailed"), Action::Release, false),
    ];
    for (case, d, asked, want) in table {
        assert_eq!(ask_again(&d, asked), want, "{case}");
    }
}

#[test]
fn a_drive_is_named_node_slash_id_or_by_its_object_and_a_wrong_name_exits_3() {
    let drives = [drive("node-a", "d1", managed(vec![])), drive("node-b", "d1", managed(vec![]))];
    assert_eq!(find(&drives, "node-b/d1").map(|d| d.spec.node.as_str()).ok(), Some("node-b"));
    let name = drives[0].name_any();
    assert_eq!(find(&drives, &name).map(|d| d.spec.node.as_str()).ok(), Some("node-a"));
    let e = find(&drives, "node-c/d1").expect_err("no such node");
    assert_eq!(e.exit_code(), 3);
    assert!(e.to_string().contains("no drive node-c/d1: name it NODE/DRIVE"), "{e}");
    assert_eq!(KubectlError::TimedOut("x".into()).exit_code(), 4);
    assert_eq!(KubectlError::Refused("x".into()).exit_code(), 1);
}

#[test]
fn a_drive_owned_elsewhere_reads_as_ctl_drives_says_it_with_whose_it_is() {
    use crate::k8s::crd::{DriveOwnerStatus, HeldVolumeStatus};
    let why = "belongs to node node-2 of this cluster; holds 1 volume: claim apps/data-0 (64.0 MiB); nothing is written to it until an admin adopts it";
    let st = DriveStatus {
        class: Some(DriveClass::OwnedElsewhere),
        class_reason: Some(why.into()),
        owner: Some(DriveOwnerStatus {
            words: "node node-2 of this cluster".into(),
            cluster: Some("c1".into()),
            node: Some("node-2".into()),
            this_cluster: true,
            volumes: vec![HeldVolumeStatus { id: "v1".into(), size_bytes: 64 << 20, claim: Some("apps/data-0".into()), pv: Some("pv-1".into()) }],
        }),
        health: Some(DriveHealth::Good),
        ..Default::default()
    };
    let row = drive_row(&drive("node-1", "d7", st));
    assert_eq!(row.class, "owned-elsewhere");
    assert_eq!(row.owner.as_deref(), Some("node node-2 of this cluster"));
    assert!(row.reason.starts_with("belongs to node node-2 of this cluster; holds 1 volume: claim apps/data-0"), "{}", row.reason);
    let table = drives_table(std::slice::from_ref(&row));
    assert!(table.contains("owned-elsewhere") && table.contains("node node-2 of this cluster"), "{table}");
    let json = serde_json::to_value(&row).expect("row");
    assert_eq!(json["owner"], "node node-2 of this cluster");
    let managed_row = drive_row(&drive("node-1", "d1", managed(vec![])));
    assert!(serde_json::to_value(&managed_row).expect("row").get("owner").is_none(), "no owner for a managed drive");
}

#[tokio::test]
async fn adopt_patches_the_action_and_restore_claims_and_a_refusal_exits_1() {
    use crate::k8s::fake_api::{fake_api, list_of, respond};
    use http::Method;
    let mut d = drive("node-1", "d7", DriveStatus { class: Some(DriveClass::OwnedElsewhere), ..Default::default() });
    d.metadata.generation = Some(1);
    let name = d.name_any();
    let (client, mut api) = fake_api();
    let server = {
        let (d, name) = (d.clone(), name.clone());
        tokio::spawn(async move {
            for (restore, refuse) in [(true, false), (false, true)] {
                let (_, reply) = api.expect_path(Method::GET, "/apis/drivelet.io/v1alpha1/drives").await;
                respond(reply, &list_of("Drive", "drivelet.io/v1alpha1", "1", vec![serde_json::to_value(&d).unwrap()]));
                let (body, reply) = api.expect_path(Method::PATCH, &format!("/apis/drivelet.io/v1alpha1/drives/{name}")).await;
                let want = if restore { serde_json::json!(true) } else { serde_json::Value::Null };
                assert_eq!(body, serde_json::json!({"spec": {"action": "adopt", "restoreClaims": want}}));
                let mut patched = d.clone();
                patched.spec.action = Some(DriveAction::Adopt);
                patched.metadata.generation = Some(2);
                respond(reply, &patched);
                let (_, reply) = api.expect_path(Method::GET, &format!("/apis/drivelet.io/v1alpha1/drives/{name}")).await;
                let mut now = patched.clone();
                let (status, reason) = if refuse { ("False", REFUSED) } else { ("True", "Adopted") };
                now.status.as_mut().unwrap().conditions = vec![DriveCondition {
                    type_: ACTION_COMPLETE.into(),
                    status: status.into(),
                    reason: reason.into(),
                    message: format!("drive d7: {reason}"),
                    observed_generation: 2,
                    last_transition_time: "2026-11-28T05:00:00Z".into(),
                }];
                respond(reply, &now);
            }
            api
        })
    };
    let o = act(&client, "node-1/d7", Action::Adopt { restore_claims: true }, None, &mut |_| {}).await.expect("adopted");
    assert!(o.complete && o.action == "adopt", "{o:?}");
    let e = act(&client, "node-1/d7", Action::Adopt { restore_claims: false }, None, &mut |_| {}).await.expect_err("refused");
    assert_eq!(e.exit_code(), 1);
    server.await.unwrap().assert_no_more_requests("after both asks");
}
