//! The admins' `spec.action` on this node's objects: carried out ([`act`]: asked of the
//! volume manager, or of the inventory for an adoption) and shown ([`show_actions`]: the
//! `ActionComplete` condition, the evacuation list, an Event when the reason changes).
//! The decisions are `crate::k8s::drive_actions`'.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::Event;
use kube::{Resource, ResourceExt};
use tracing::{info, warn};

use super::desired::class_of;
use super::error::DrivesError;
use super::plan::is_ours;
use super::sync::{ask, Sources};
use crate::actors::inventory::model::Drive;
use crate::actors::messages::AdoptDrive;
use crate::actors::volumes::{CordonDrive, EvacuateDrive, Evacuation, ReleaseDrive};
use crate::k8s::crd;
use crate::k8s::drive_actions::{self, Command};
use crate::words::DriveUse;

/// Whether the admin's spec of `obj` is of a generation its `ActionComplete` condition
/// has not answered yet.
fn fresh(obj: &crd::Drive) -> bool {
    let observed = obj
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == drive_actions::ACTION_COMPLETE))
        .map(|c| c.observed_generation);
    observed.is_none_or(|o| o < obj.metadata.generation.unwrap_or(0))
}

/// What [`act`] did: the refusals by drive id, and whether it asked anything at all
/// (then the sync reads the inventory and the volume manager again).
#[derive(Debug, Default)]
pub(crate) struct Acted {
    pub(crate) refused: BTreeMap<String, String>,
    pub(crate) asked: bool,
}

/// Asks the volume manager (the inventory, for an adoption) for what the `spec.action`
/// of this node's objects asks and the drive is not yet; `drives` and `uses` are the
/// inventory's drives and the volume manager's usage records now.
pub(crate) async fn act(node: &str, existing: &[crd::Drive], drives: &[Drive], uses: &[DriveUse], sources: &Sources) -> Result<Acted, DrivesError> {
    let mut acted = Acted::default();
    for obj in existing.iter().filter(|e| is_ours(e, node)) {
        let Some(action) = obj.spec.action else { continue };
        let id = obj.spec.drive_id.clone();
        let answer = if action == crd::DriveAction::Adopt {
            // Judged by the class the inventory holds now (the object's may be older).
            let class = drives.iter().find(|d| d.id == id).map(|d| class_of(d.class));
            if !drive_actions::adopts(action, class) {
                continue;
            }
            adopt(node, &id, sources).await?
        } else {
            let Some(cmd) = drive_actions::command(action, uses.iter().find(|u| u.drive_id == id), fresh(obj)) else { continue };
            carry_out(node, &id, action, cmd, sources).await?
        };
        acted.asked = true;
        if let Err(e) = answer {
            acted.refused.insert(id, e);
        }
    }
    Ok(acted)
}

/// Asks the inventory to adopt drive `id`; answers its refusal, if any.
async fn adopt(node: &str, id: &str, sources: &Sources) -> Result<Result<(), String>, DrivesError> {
    let answer = sources.adopt.send(AdoptDrive { drive_id: id.to_string() }).await.map_err(ask("inventory", "a drive adoption"))?;
    Ok(match answer {
        Ok(a) => {
            info!(actor = "drive-sync", node.name = %node, drive.id = %id, drive.owner_was = %a.from, volumes = a.volumes.len(),
                  "drive adopted as the Drive object's spec asked");
            Ok(())
        }
        Err(e) => {
            warn!(actor = "drive-sync", node.name = %node, drive.id = %id, error = %e, "adoption of the Drive object's spec refused");
            Err(e)
        }
    })
}

/// Asks the volume manager for `cmd` on drive `id`, as `action` of its object asks;
/// answers its refusal in words, if any.
async fn carry_out(node: &str, id: &str, action: crd::DriveAction, cmd: Command, sources: &Sources) -> Result<Result<(), String>, DrivesError> {
    let drive_id = id.to_string();
    let answer = match cmd {
        Command::Cordon(cordon) => {
            sources.cordon.send(CordonDrive { drive_id, cordon }).await.map_err(ask("volume manager", "a drive cordon"))?.map(|_| ())
        }
        Command::Release => {
            sources.release.send(ReleaseDrive { drive_id, force: false }).await.map_err(ask("volume manager", "a drive release"))?.map(|_| ())
        }
        Command::Evacuate => {
            sources.evacuate.send(EvacuateDrive { drive_id, force: false }).await.map_err(ask("volume manager", "a drive evacuation"))?.map(|_| ())
        }
    };
    Ok(match answer {
        Ok(()) => {
            info!(actor = "drive-sync", node.name = %node, drive.id = %id, drive.action = action.as_str(),
                  "drive action of the Drive object's spec carried out");
            Ok(())
        }
        Err(e) => {
            warn!(actor = "drive-sync", node.name = %node, drive.id = %id, drive.action = action.as_str(), error = %e,
                  "drive action of the Drive object's spec refused");
            Err(e.to_string())
        }
    })
}

/// Puts the `ActionComplete` condition of each object an admin asked an action of into
/// its wanted status, and where each volume of an evacuated drive stands; answers the
/// Events to record on the objects whose condition's reason changed.
#[allow(clippy::too_many_arguments)]
pub(crate) fn show_actions(
    node: &str,
    want: &mut [crd::Drive],
    existing: &[crd::Drive],
    uses: &[DriveUse],
    refused: &BTreeMap<String, String>,
    evacuations: &[Evacuation],
    pods: &BTreeMap<String, Vec<String>>,
    now: &str,
) -> Vec<(ObjectReference, Event)> {
    let mut events = Vec::new();
    for w in want.iter_mut() {
        let evacuation = evacuations.iter().find(|e| e.drive_id == w.spec.drive_id);
        if let (Some(e), Some(st)) = (evacuation, w.status.as_mut()) {
            st.evacuation = drive_actions::evacuation_list(e, pods);
        }
        let Some(have) = existing.iter().find(|e| is_ours(e, node) && e.name_any() == w.name_any()) else { continue };
        let Some(action) = have.spec.action else { continue };
        let id = w.spec.drive_id.clone();
        let Some(st) = w.status.as_mut() else { continue };
        let before = have.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == drive_actions::ACTION_COMPLETE));
        let usage = uses.iter().find(|u| u.drive_id == id);
        let live: Vec<String> = st.volumes.clone();
        let outcome = if action == crd::DriveAction::Adopt {
            let reason = st.class_reason.clone().unwrap_or_default();
            drive_actions::adopt_outcome(&id, st.class, &reason, &live, refused.get(&id).map(String::as_str))
        } else {
            drive_actions::outcome(action, &id, usage, &live, refused.get(&id).map(String::as_str), evacuation, pods)
        };
        let c = drive_actions::condition(outcome, have.metadata.generation.unwrap_or(0), before, now);
        if let Some(ev) = drive_actions::event_of(action, before, &c) {
            events.push((have.object_ref(&()), ev));
        }
        st.conditions = vec![c];
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use super::super::fixtures::*;
    use crate::words::DriveClass;

    #[test]
    fn a_spec_is_fresh_until_its_condition_answers_its_generation() {
        let mut obj = object_of(&drive("wwn-a", DriveClass::Managed, "blank"));
        obj.metadata.generation = Some(3);
        assert!(fresh(&obj), "no condition yet");
        let c = |generation: i64| crd::DriveCondition {
            type_: drive_actions::ACTION_COMPLETE.into(),
            status: "False".into(),
            reason: "Evacuating".into(),
            message: "m".into(),
            observed_generation: generation,
            last_transition_time: "2026-11-26T23:00:00Z".into(),
        };
        obj.status.get_or_insert_default().conditions = vec![c(2)];
        assert!(fresh(&obj), "answered an older generation: the admin asked again");
        obj.status.get_or_insert_default().conditions = vec![c(3)];
        assert!(!fresh(&obj), "answered");
    }
}
