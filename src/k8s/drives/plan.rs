//! The writes that make this node's existing objects the desired ones ([`plan`]), and
//! nothing else: only what differs, never another node's object, never the admin's
//! `spec.action`.

use std::collections::{BTreeMap, BTreeSet};

use kube::ResourceExt;

use super::names::node_label_value;
use super::NODE_LABEL;
use crate::k8s::crd;

/// One write to the API server.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SyncAction {
    /// Create or update the object (spec and labels), then apply its status.
    Apply(Box<crd::Drive>),
    /// Only the status differs: apply the status subresource.
    ApplyStatus(Box<crd::Drive>),
    /// Delete this node's object of that name: no drive wants it any more.
    Delete(String),
}

impl SyncAction {
    /// The name of the object the action writes.
    pub(crate) fn name(&self) -> String {
        match self {
            SyncAction::Apply(obj) | SyncAction::ApplyStatus(obj) => obj.name_any(),
            SyncAction::Delete(name) => name.clone(),
        }
    }
}

/// Whether `obj` is this node's: our label and our node in the spec.
pub(crate) fn is_ours(obj: &crd::Drive, node: &str) -> bool {
    obj.spec.node == node && obj.labels().get(NODE_LABEL).is_some_and(|v| *v == node_label_value(node))
}

/// What to write so that this node's objects among `existing` become `desired`: applies
/// in the order of `desired`, then deletes by name (see the module rules). Objects of
/// other nodes in `existing` are ignored.
pub(crate) fn plan(node: &str, desired: &[crd::Drive], existing: &[crd::Drive]) -> Vec<SyncAction> {
    let ours: BTreeMap<String, &crd::Drive> =
        existing.iter().filter(|e| is_ours(e, node)).map(|e| (e.name_any(), e)).collect();
    let mut actions = Vec::new();
    for want in desired {
        let Some(have) = ours.get(&want.name_any()) else {
            actions.push(SyncAction::Apply(Box::new(want.clone())));
            continue;
        };
        let mut want = want.clone();
        if want.status.as_ref().is_some_and(|s| s.presence == crd::DrivePresence::Missing) {
            want.spec = have.spec.hardware();
        }
        let labels_match = want.labels().iter().all(|(k, v)| have.labels().get(k) == Some(v));
        // The admin's action is theirs: only the hardware is compared (and applied).
        if have.spec.hardware() != want.spec.hardware() || !labels_match {
            actions.push(SyncAction::Apply(Box::new(want)));
        } else if have.status != want.status {
            actions.push(SyncAction::ApplyStatus(Box::new(want)));
        }
    }
    let wanted: BTreeSet<String> = desired.iter().map(|d| d.name_any()).collect();
    for (name, have) in &ours {
        if !wanted.contains(name) && have.metadata.deletion_timestamp.is_none() {
            actions.push(SyncAction::Delete(name.clone()));
        }
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;
    use super::super::fixtures::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use super::super::desired::desired;
    use crate::actors::volumes::model::VolumeState;
    use crate::words::DriveClass;

    /// `obj` as the API server returns it: with the metadata it fills in and a label of
    /// someone else's.
    fn served(obj: &crd::Drive) -> crd::Drive {
        let mut obj = obj.clone();
        obj.metadata.resource_version = Some("42".into());
        obj.metadata.uid = Some("0b7a1c3e-1111-4000-8000-000000000001".into());
        obj.metadata.generation = Some(3);
        obj.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1_700_000_000).expect("valid timestamp")));
        obj.metadata.labels.get_or_insert_default().insert("team".into(), "storage".into());
        obj
    }

    fn apply(obj: &crd::Drive) -> SyncAction {
        SyncAction::Apply(Box::new(obj.clone()))
    }

    fn apply_status(obj: &crd::Drive) -> SyncAction {
        SyncAction::ApplyStatus(Box::new(obj.clone()))
    }

    #[test]
    fn plan_writes_only_what_differs_and_deletes_only_this_nodes_stale_objects() {
        let a = object_of(&drive("wwn-a", DriveClass::Managed, "blank"));
        let b = object_of(&drive("wwn-b", DriveClass::Foreign, "has a filesystem"));
        let c = object_of(&drive("wwn-c", DriveClass::System, "backs /"));
        let mut a_bad = a.clone();
        a_bad.status.get_or_insert_default().health = Some(crd::DriveHealth::Bad);
        let mut a_grown = a.clone();
        a_grown.spec.size_bytes *= 2;
        let mut a_unlabelled = served(&a);
        a_unlabelled.metadata.labels = None;
        let other_node = desired("node-b", &[drive("wwn-x", DriveClass::Managed, "blank")], &[], &[]).remove(0);
        let mut our_label_other_spec = served(&b);
        our_label_other_spec.spec.node = "node-b".into();
        let mut b_deleting = served(&b);
        b_deleting.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1_700_000_100).expect("valid timestamp")));

        let pulled = desired(NODE, &[], &[], &[volume(1, "wwn-a", VolumeState::Published)]).remove(0);
        let mut pulled_keeps_spec = pulled.clone();
        pulled_keeps_spec.spec = a.spec.clone();

        // (case, desired, existing, expected)
        type Case = (&'static str, Vec<crd::Drive>, Vec<crd::Drive>, Vec<SyncAction>);
        let table: Vec<Case> = vec![
            ("a new drive is created", vec![a.clone()], vec![], vec![apply(&a)]),
            ("an unchanged object is left alone, whatever the server filled in", vec![a.clone()], vec![served(&a)], vec![]),
            ("a changed status is applied to the status alone", vec![a_bad.clone()], vec![served(&a)], vec![apply_status(&a_bad)]),
            ("a changed spec is applied whole", vec![a_grown.clone()], vec![served(&a)], vec![apply(&a_grown)]),
            ("an object without our label is applied again", vec![a.clone()], vec![a_unlabelled], vec![apply(&a)]),
            ("a stale object of this node is deleted", vec![a.clone()], vec![served(&a), served(&b)], vec![Delete(b.name_any())]),
            ("another node's object is never touched", vec![], vec![served(&other_node)], vec![]),
            ("an object naming another node in its spec is not ours", vec![], vec![our_label_other_spec], vec![]),
            ("a stale object already being deleted is not deleted again", vec![], vec![b_deleting], vec![]),
            (
                "a pulled drive keeps the spec its object has and changes only its status",
                vec![pulled.clone()],
                vec![served(&a)],
                vec![apply_status(&pulled_keeps_spec)],
            ),
            ("a pulled drive without an object gets one", vec![pulled.clone()], vec![], vec![apply(&pulled)]),
            (
                "applies come in desired order, then deletes",
                vec![a.clone(), c.clone()],
                vec![served(&b), served(&c)],
                vec![apply(&a), Delete(b.name_any())],
            ),
        ];
        use SyncAction::Delete;
        for (case, desired, existing, want) in table {
            assert_eq!(plan(NODE, &desired, &existing), want, "{case}");
        }
    }
}
