//! What a desired object's status shows beside the drive itself: whose a drive owned
//! elsewhere is ([`owner_status`]), how far the cleaning of its freed space is, and its
//! volumes as `ctl volumes` shows them, with the pods using each.

use std::collections::BTreeMap;

use crate::actors::inventory::model::Drive;
use crate::actors::volumes::Cleaning;
use crate::actors::volumes::{volume_detail, VolumeStatus};
use crate::k8s::crd;
use crate::words::{DriveClass, DriveOwner, Owner};

/// What a Drive object shows of whose a drive is: set for a drive owned elsewhere
/// (another node or cluster, a note that cannot be read, or none), `None` for any other;
/// `me` is this node of this cluster, when known.
pub(crate) fn owner_status(owner: &DriveOwner, me: Option<&Owner>) -> Option<crd::DriveOwnerStatus> {
    let unknown = |words: String| crd::DriveOwnerStatus { words, ..Default::default() };
    match owner {
        DriveOwner::Elsewhere { owner, volumes } => Some(crd::DriveOwnerStatus {
            words: me.map(|m| owner.words(m)).unwrap_or_else(|| format!("node {} of cluster {}", owner.node, owner.cluster)),
            cluster: Some(owner.cluster.clone()),
            node: Some(owner.node.clone()),
            this_cluster: me.is_some_and(|m| m.cluster == owner.cluster),
            volumes: volumes
                .iter()
                .map(|v| crd::HeldVolumeStatus { id: v.id.clone(), size_bytes: v.size_bytes, claim: v.claim.clone(), pv: v.pv.clone() })
                .collect(),
        }),
        DriveOwner::Unreadable { reason } => Some(unknown(format!("nobody drivelet can tell: its note cannot be read ({reason})"))),
        DriveOwner::NoNote => Some(unknown("nobody drivelet can tell: it carries drivelet volumes but no note of whose they are".into())),
        DriveOwner::Ours | DriveOwner::Unknown => None,
    }
}

/// Puts whose each drive owned elsewhere is into its object's status ([`owner_status`]).
pub(crate) fn show_owners(objects: &mut [crd::Drive], drives: &[Drive], me: Option<&Owner>) {
    for o in objects {
        let d = drives.iter().find(|d| d.id == o.spec.drive_id && d.class == DriveClass::OwnedElsewhere);
        if let Some(st) = o.status.as_mut() {
            st.owner = d.and_then(|d| owner_status(&d.owner, me));
        }
    }
}

/// Puts how far the cleaning of each drive's freed space is into its object's status.
pub(crate) fn show_cleaning(objects: &mut [crd::Drive], cleaning: &[Cleaning]) {
    for o in objects {
        let c = cleaning.iter().find(|c| c.drive_id == o.spec.drive_id);
        if let Some(st) = o.status.as_mut() {
            st.cleaning = c.map(Cleaning::words);
            // As `ctl drives` counts it: space being cleaned is not free until clean.
            st.free_bytes = st.free_bytes.map(|f| f.saturating_sub(c.map_or(0, |c| c.left_bytes)));
        }
    }
}

/// Puts each drive's volumes with their size, used bytes, state and health into its
/// object's status, as `ctl volumes` shows them ([`volume_detail`]), with the pods of
/// this node using each (`pods`, by volume id).
pub(crate) fn show_volumes(
    objects: &mut [crd::Drive],
    statuses: &[VolumeStatus],
    used: &BTreeMap<String, u64>,
    pods: &BTreeMap<String, Vec<String>>,
) {
    for o in objects {
        let Some(st) = o.status.as_mut() else { continue };
        st.volume_details = st
            .volumes
            .iter()
            .filter_map(|id| statuses.iter().find(|v| v.record.id == *id))
            .map(|v| {
                let d = volume_detail(v, used);
                crd::DriveVolume {
                    pods: pods.get(&d.id).cloned().unwrap_or_default(),
                    id: d.id,
                    name: d.name,
                    size_bytes: d.size_bytes,
                    used_bytes: d.used_bytes,
                    kind: d.kind,
                    state: d.state,
                    health: if d.abnormal { "abnormal" } else { "normal" }.into(),
                    health_reason: d.reason,
                }
            })
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use super::super::fixtures::*;
    use super::super::desired::desired;


    #[test]
    fn a_drive_owned_elsewhere_shows_whose_it_is_and_what_it_holds_and_no_other_drive_does() {
        use crate::words::HeldVolume;
        let me = Owner { cluster: "c1".into(), node: NODE.into() };
        let held = vec![
            HeldVolume { id: "v1".into(), size_bytes: 64 << 20, claim: Some("apps/data-0".into()), pv: Some("pv-1".into()) },
            HeldVolume { id: "v2".into(), size_bytes: 32 << 20, claim: None, pv: None },
        ];
        let mut ours = drive("d1", DriveClass::Managed, "carries a drivelet GPT");
        ours.owner = DriveOwner::Ours;
        let mut peer = drive("d2", DriveClass::OwnedElsewhere, "belongs to node node-2 of this cluster");
        peer.owner = DriveOwner::Elsewhere { owner: Owner { cluster: "c1".into(), node: "node-2".into() }, volumes: held.clone() };
        let mut old = drive("d3", DriveClass::OwnedElsewhere, "belongs to node n9 of another cluster (c0)");
        old.owner = DriveOwner::Elsewhere { owner: Owner { cluster: "c0".into(), node: "n9".into() }, volumes: vec![] };
        let mut torn = drive("d4", DriveClass::OwnedElsewhere, "carries a note of its owner that cannot be read");
        torn.owner = DriveOwner::Unreadable { reason: "both copies fail their checksum".into() };
        let drives = vec![ours, peer, old, torn];
        let mut objects = desired(NODE, &drives, &[], &[]);
        show_owners(&mut objects, &drives, Some(&me));
        let owner = |id: &str| objects.iter().find(|o| o.spec.drive_id == id).and_then(|o| o.status.as_ref()?.owner.clone());
        assert_eq!(owner("d1"), None, "this node's drive");
        let peer = owner("d2").expect("owned elsewhere");
        assert_eq!(peer.words, "node node-2 of this cluster");
        assert_eq!((peer.cluster.as_deref(), peer.node.as_deref(), peer.this_cluster), (Some("c1"), Some("node-2"), true));
        assert_eq!(peer.volumes[0], crd::HeldVolumeStatus { id: "v1".into(), size_bytes: 64 << 20, claim: Some("apps/data-0".into()), pv: Some("pv-1".into()) });
        assert_eq!(peer.volumes.len(), 2);
        let old = owner("d3").expect("another cluster's");
        assert_eq!((old.words.as_str(), old.this_cluster), ("node n9 of another cluster (c0)", false));
        let torn = owner("d4").expect("unreadable");
        assert_eq!((torn.cluster, torn.node, torn.this_cluster), (None, None, false));
        assert!(torn.words.contains("cannot be read (both copies fail their checksum)"), "{}", torn.words);
        let value = serde_json::to_value(objects.iter().find(|o| o.spec.drive_id == "d2").unwrap()).unwrap();
        assert_eq!(value["status"]["class"], "owned-elsewhere");
        assert_eq!(value["status"]["owner"]["thisCluster"], true);
        assert_eq!(value["status"]["owner"]["volumes"][0]["claim"], "apps/data-0");
    }

    #[test]
    fn a_drive_being_cleaned_says_so_in_its_status_and_the_others_do_not() {
        let mut objs = desired(NODE, &[drive("wwn-a", DriveClass::Managed, "blank"), drive("wwn-b", DriveClass::Managed, "blank")], &[], &[]);
        let c = Cleaning { drive_id: "wwn-a".into(), left_bytes: 384 << 20, round_bytes: 512 << 20 };
        show_cleaning(&mut objs, &[c]);
        let of = |objs: &[crd::Drive], id: &str| objs.iter().find(|o| o.spec.drive_id == id).and_then(|o| o.status.clone()).and_then(|s| s.cleaning);
        assert_eq!(of(&objs, "wwn-a").as_deref(), Some("384.0 MiB being cleaned (25% done)"));
        assert_eq!(of(&objs, "wwn-b"), None);
        show_cleaning(&mut objs, &[]);
        assert_eq!(of(&objs, "wwn-a"), None, "gone once clean");
    }
}
