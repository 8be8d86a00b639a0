//! The objects this node should have ([`desired`]): one per drive the inventory sees and
//! one per missing drive that still holds a live volume, with the domain states mapped
//! to the CRD's in one place ([`class_of`], [`health_of`], [`usage_of`]).

use std::collections::{BTreeMap, BTreeSet};

use kube::ResourceExt;

use super::names::{node_label_value, object_name};
use super::NODE_LABEL;
use crate::actors::inventory::model::Drive;
use crate::actors::volumes::model::{VolumeRecord, VolumeState};
use crate::k8s::crd;
use crate::words::{DriveClass, DriveUse, DriveUseState, Health};

/// The CRD class of an inventory class.
pub(crate) fn class_of(class: DriveClass) -> crd::DriveClass {
    match class {
        DriveClass::Managed => crd::DriveClass::Managed,
        DriveClass::System => crd::DriveClass::System,
        DriveClass::Foreign => crd::DriveClass::Foreign,
        DriveClass::Excluded => crd::DriveClass::Excluded,
        DriveClass::OwnedElsewhere => crd::DriveClass::OwnedElsewhere,
    }
}

/// The CRD health of a SMART verdict.
pub(crate) fn health_of(health: Health) -> crd::DriveHealth {
    match health {
        Health::Good => crd::DriveHealth::Good,
        Health::Unknown => crd::DriveHealth::Unknown,
        Health::Suspect => crd::DriveHealth::Suspect,
        Health::Bad => crd::DriveHealth::Bad,
    }
}

/// The CRD usage of a drive's usage record (`None`: no record, so active).
pub(crate) fn usage_of(state: Option<DriveUseState>) -> crd::DriveUsage {
    match state {
        None => crd::DriveUsage::Active,
        Some(DriveUseState::Cordoned) => crd::DriveUsage::Cordoned,
        Some(DriveUseState::Releasing) => crd::DriveUsage::Releasing,
        Some(DriveUseState::Released) => crd::DriveUsage::Released,
    }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

fn object(node: &str, drive_id: &str, spec: crd::DriveSpec, status: crd::DriveStatus) -> crd::Drive {
    let mut obj = crd::Drive::new(&object_name(node, drive_id), spec);
    obj.metadata.labels = Some(BTreeMap::from([(NODE_LABEL.to_string(), node_label_value(node))]));
    obj.status = Some(status);
    obj
}

/// The objects this node should have: one per drive the inventory sees, and one per
/// drive it does not see that still holds a live volume (marked missing), ordered by name.
pub(crate) fn desired(node: &str, drives: &[Drive], uses: &[DriveUse], volumes: &[VolumeRecord]) -> Vec<crd::Drive> {
    let uses: BTreeMap<&str, &DriveUse> = uses.iter().map(|u| (u.drive_id.as_str(), u)).collect();
    let mut on_drive: BTreeMap<&str, Vec<&VolumeRecord>> = BTreeMap::new();
    for rec in volumes.iter().filter(|r| r.state != VolumeState::Creating) {
        on_drive.entry(rec.drive_id.as_str()).or_default().push(rec);
    }
    let ids_on = |id: &str, snapshots: bool| -> Vec<String> {
        let mut ids: Vec<String> = on_drive.get(id).into_iter().flatten().filter(|r| r.snapshot.is_some() == snapshots).map(|r| r.id.clone()).collect();
        ids.sort();
        ids
    };
    let mut out: BTreeMap<String, crd::Drive> = BTreeMap::new();
    for d in drives {
        let usage = uses.get(d.id.as_str());
        let spec = crd::DriveSpec {
            node: node.to_string(),
            drive_id: d.id.clone(),
            serial: d.serial.clone(),
            wwn: d.wwn.clone(),
            model: d.model.clone(),
            size_bytes: d.size_bytes,
            size: Some(crate::config::human_bytes(d.size_bytes)),
            media: d.media.as_str().to_string(),
            action: None,
            restore_claims: None,
        };
        let status = crd::DriveStatus {
            class: Some(class_of(d.class)),
            class_reason: non_empty(&d.reason),
            owner: None,
            health: Some(health_of(d.health.health)),
            health_reason: non_empty(&d.health.reason),
            usage: Some(usage_of(usage.map(|u| u.state))),
            usage_reason: usage.and_then(|u| non_empty(&u.reason)),
            presence: crd::DrivePresence::Present,
            missing: false,
            volumes: ids_on(&d.id, false),
            snapshots: ids_on(&d.id, true),
            cleaning: None,
            free_bytes: (d.class == DriveClass::Managed).then_some(d.free_bytes),
            free_slots: (d.class == DriveClass::Managed).then_some(d.slots_free),
            volume_details: Vec::new(),
            conditions: Vec::new(),
            evacuation: Vec::new(),
        };
        let obj = object(node, &d.id, spec, status);
        out.entry(obj.name_any()).or_insert(obj);
    }
    let present: BTreeSet<&str> = drives.iter().map(|d| d.id.as_str()).collect();
    for (id, recs) in &on_drive {
        if present.contains(id) || recs.iter().all(|r| r.failed) {
            continue;
        }
        let usage = uses.get(id);
        let mut live: Vec<&str> = recs.iter().filter(|r| !r.failed).map(|r| r.id.as_str()).collect();
        live.sort();
        let spec = crd::DriveSpec {
            node: node.to_string(),
            drive_id: id.to_string(),
            serial: None,
            wwn: None,
            model: None,
            size_bytes: 0,
            size: None,
            media: recs.first().map(|r| r.media.as_str()).unwrap_or_default().to_string(),
            action: None,
            restore_claims: None,
        };
        let status = crd::DriveStatus {
            class: Some(crd::DriveClass::Managed),
            class_reason: Some("carries drivelet volumes".to_string()),
            owner: None,
            health: Some(crd::DriveHealth::Unknown),
            health_reason: Some(format!(
                "drive {id} is missing from node {node} while volumes live on it ({}): the data is unreachable; \
                 put the drive back, or if it failed, delete those volumes and restore from backup",
                live.join(", ")
            )),
            usage: Some(usage_of(usage.map(|u| u.state))),
            usage_reason: usage.and_then(|u| non_empty(&u.reason)),
            presence: crd::DrivePresence::Missing,
            missing: true,
            volumes: ids_on(id, false),
            snapshots: ids_on(id, true),
            cleaning: None,
            free_bytes: None,
            free_slots: None,
            volume_details: Vec::new(),
            conditions: Vec::new(),
            evacuation: Vec::new(),
        };
        let obj = object(node, id, spec, status);
        out.entry(obj.name_any()).or_insert(obj);
    }
    out.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use super::super::fixtures::*;
    use crate::actors::inventory::model::DriveHealth;

    #[test]
    fn desired_has_one_object_per_drive_of_any_class_with_mapped_states() {
        let managed = drive("wwn-m", DriveClass::Managed, "carries a drivelet GPT");
        let system = drive("ata-sys", DriveClass::System, "backs the mounted filesystem at /");
        let foreign = drive("ata-for", DriveClass::Foreign, "has a partition table drivelet did not create");
        let excluded = drive("ata-exc", DriveClass::Excluded, "matches drives.filters.exclude");
        let mut bad = drive("wwn-bad", DriveClass::Managed, "carries a drivelet GPT");
        bad.health = DriveHealth { health: Health::Bad, reason: "SMART overall-health failed".into(), checked_unix: 2, smart: Default::default() };
        let mut released = drive("wwn-rel", DriveClass::Managed, "blank");
        released.health = DriveHealth::default();
        let uses = [
            use_of("wwn-bad", DriveUseState::Releasing, "health is BAD: SMART overall-health failed"),
            use_of("wwn-rel", DriveUseState::Released, "release requested"),
        ];
        let volumes = [
            volume(2, "wwn-m", VolumeState::Published),
            volume(1, "wwn-m", VolumeState::Available),
            volume(3, "wwn-m", VolumeState::Creating),
            volume(4, "wwn-bad", VolumeState::Staged),
        ];
        let drives = [managed.clone(), system, foreign, excluded, bad, released];
        let got = desired(NODE, &drives, &uses, &volumes);

        let status = |class, class_reason: &str, health, health_reason: &str, usage, usage_reason: Option<&str>, vols: &[u8]| {
            crd::DriveStatus {
                class: Some(class),
                class_reason: Some(class_reason.into()),
                owner: None,
                health: Some(health),
                health_reason: Some(health_reason.into()),
                usage: Some(usage),
                usage_reason: usage_reason.map(str::to_string),
                presence: crd::DrivePresence::Present,
                missing: false,
                volumes: vols.iter().map(|n| volume(*n, "", VolumeState::Available).id).collect(),
                snapshots: vec![],
                cleaning: None,
                free_bytes: (class == crd::DriveClass::Managed).then_some(0),
                free_slots: (class == crd::DriveClass::Managed).then_some(255),
                volume_details: Vec::new(),
                conditions: Vec::new(),
                evacuation: Vec::new(),
            }
        };
        let passed = "SMART overall-health passed";
        use crd::{DriveClass as C, DriveHealth as H, DriveUsage as U};
        let want: Vec<(&str, crd::DriveStatus)> = vec![
            ("ata-sys", status(C::System, "backs the mounted filesystem at /", H::Good, passed, U::Active, None, &[])),
            ("ata-for", status(C::Foreign, "has a partition table drivelet did not create", H::Good, passed, U::Active, None, &[])),
            ("ata-exc", status(C::Excluded, "matches drives.filters.exclude", H::Good, passed, U::Active, None, &[])),
            ("wwn-m", status(C::Managed, "carries a drivelet GPT", H::Good, passed, U::Active, None, &[1, 2])),
            (
                "wwn-bad",
                status(
                    C::Managed,
                    "carries a drivelet GPT",
                    H::Bad,
                    "SMART overall-health failed",
                    U::Releasing,
                    Some("health is BAD: SMART overall-health failed"),
                    &[4],
                ),
            ),
            ("wwn-rel", status(C::Managed, "blank", H::Unknown, "not checked yet", U::Released, Some("release requested"), &[])),
        ];
        assert_eq!(got.len(), want.len(), "one object per drive");
        for (id, status) in want {
            let obj = got.iter().find(|o| o.spec.drive_id == id).unwrap_or_else(|| panic!("no object for {id}"));
            assert_eq!(obj.name_any(), object_name(NODE, id));
            assert_eq!(obj.status.as_ref(), Some(&status), "status of {id}");
        }
        let names: Vec<String> = got.iter().map(|o| o.name_any()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted, "ordered by name");

        let m = got.iter().find(|o| o.spec.drive_id == "wwn-m").expect("managed object");
        assert_eq!(
            m.spec,
            crd::DriveSpec {
                node: NODE.into(),
                drive_id: "wwn-m".into(),
                serial: Some("SN-wwn-m".into()),
                wwn: None,
                model: Some("Samsung SSD 870".into()),
                size_bytes: 1 << 40,
                size: Some("1.0 TiB".into()),
                media: "ssd".into(),
                action: None,
                restore_claims: None,
            }
        );
        for obj in &got {
            assert_eq!(obj.labels().get(NODE_LABEL).map(String::as_str), Some(NODE), "{}", obj.name_any());
            assert_eq!(obj.spec.node, NODE);
        }
    }

    #[test]
    fn a_pulled_drive_keeps_a_missing_object_only_while_live_volumes_are_on_it() {
        let present = drive("wwn-m", DriveClass::Managed, "carries a drivelet GPT");
        let mut failed = volume(4, "wwn-gone", VolumeState::Available);
        failed.failed = true;
        let mut dead = volume(5, "wwn-dead", VolumeState::Staged);
        dead.failed = true;
        let volumes = [
            volume(3, "wwn-gone", VolumeState::Published),
            failed.clone(),
            dead,
            volume(6, "wwn-new", VolumeState::Creating),
        ];
        let uses = [use_of("wwn-gone", DriveUseState::Releasing, "release requested")];
        let got = desired(NODE, &[present], &uses, &volumes);
        let ids: Vec<&str> = got.iter().map(|o| o.spec.drive_id.as_str()).collect();
        assert_eq!(ids.len(), 2, "{ids:?}: only failed volumes or a volume being created keep no object");
        let gone = got.iter().find(|o| o.spec.drive_id == "wwn-gone").expect("object of the pulled drive");
        let live = volume(3, "", VolumeState::Available).id;
        assert_eq!(gone.name_any(), object_name(NODE, "wwn-gone"));
        assert_eq!(gone.labels().get(NODE_LABEL).map(String::as_str), Some(NODE));
        assert_eq!(gone.spec.media, "virtual", "the media its volumes record");
        assert_eq!(
            gone.status,
            Some(crd::DriveStatus {
                class: Some(crd::DriveClass::Managed),
                class_reason: Some("carries drivelet volumes".into()),
                owner: None,
                health: Some(crd::DriveHealth::Unknown),
                health_reason: Some(format!(
                    "drive wwn-gone is missing from node node-a while volumes live on it ({live}): the data is \
                     unreachable; put the drive back, or if it failed, delete those volumes and restore from backup"
                )),
                usage: Some(crd::DriveUsage::Releasing),
                usage_reason: Some("release requested".into()),
                presence: crd::DrivePresence::Missing,
                missing: true,
                volumes: vec![live.clone(), failed.id.clone()],
                snapshots: vec![],
                cleaning: None,
                free_bytes: None,
                free_slots: None,
                volume_details: Vec::new(),
                conditions: Vec::new(),
                evacuation: Vec::new(),
            })
        );
    }

    #[test]
    fn domain_states_map_to_the_crd_states_of_the_same_name() {
        for class in [DriveClass::Managed, DriveClass::System, DriveClass::Foreign, DriveClass::Excluded] {
            assert_eq!(serde_json::to_value(class_of(class)).ok(), Some(class.as_str().into()));
        }
        for health in [Health::Good, Health::Unknown, Health::Suspect, Health::Bad] {
            assert_eq!(serde_json::to_value(health_of(health)).ok(), Some(health.as_str().into()));
        }
        assert_eq!(usage_of(None), crd::DriveUsage::Active);
        for state in [DriveUseState::Cordoned, DriveUseState::Releasing, DriveUseState::Released] {
            assert_eq!(serde_json::to_value(usage_of(Some(state))).ok(), Some(state.as_str().into()));
        }
    }
}
