//! Drive actions through the Kubernetes API: what an admin's `spec.action` on a `Drive`
//! object asks of this node's volume manager, and what the object's status says of it.
//!
//! Rules:
//! - The spec is the admin's intent, acted on by the node's agent at every sync of its
//!   Drive objects (and at once when a spec changes: the sync watches its objects).
//!   Acting is idempotent: [`command`] asks for a change only while the drive is not in
//!   the asked state yet, so a repeated sync, a restarted agent or a second node's view
//!   never asks twice for what is done.
//! - `none` lifts a cordon and nothing else (a release is not undone: the volumes on a
//!   releasing drive are already told to move); `cordon` closes an active drive to new
//!   volumes (a releasing or released one is closed already); `release` is the release
//!   of `ctl drive release` without force (the API never fails volumes); `evacuate` is
//!   `ctl drive evacuate` without force (a volume with unreadable blocks is not switched
//!   through the API: forcing it is a decision taken on the node, with `ctl`).
//! - An evacuation is asked while the drive's usage record holds none (active,
//!   cordoned, releasing by a release or by health), and asked again only for a new
//!   generation of the spec (the admin asked again: the condition's
//!   `observedGeneration` is older), which retries the volumes whose move failed; a
//!   released drive is done. So moves that failed are not retried behind the admin's
//!   back, and a refusal (no room) is asked again at every sync, so adding a drive is
//!   enough for it to start.
//! - [`outcome`] is the one `ActionComplete` condition: `True` once the drive is in the
//!   asked state, `False` while a release waits for its volumes or when the volume
//!   manager refused (the reason `Refused`, its words in the message). An evacuation is
//!   `Evacuating` (message: [`Evacuation::words`], the pods each waiting volume waits
//!   for), `EvacuationFailed` once a move failed (which and why), `Evacuated` (True) once
//!   the drive is released; [`evacuation_list`] is the per-volume list of the status.
//!   Its transition
//!   time changes only with its status ([`condition`]).
//! - An Event is recorded on the Drive each time the condition's reason changes
//!   ([`event_of`]): Normal, or Warning for a refusal or a failed move.
//! - `adopt` asks the inventory to adopt the drive ([`adopts`]) while the drive is owned
//!   elsewhere, and at no other time: once it is managed it is this node's (done), and a
//!   drive of any other class is refused in words without asking. [`adopt_outcome`] is
//!   `Adopted` (True) once the drive is managed, `Adopting` (False) until then, `Refused`
//!   when the inventory refused or the class rules it out. The volumes' claims are
//!   re-homed by [`crate::k8s::rehome`], which reads `spec.restoreClaims` of the object.
//! - An object without `spec.action` gets no condition: nothing was asked.

use std::collections::BTreeMap;

use kube::runtime::events::{Event, EventType};

use crate::actors::volumes::{Evacuation, PendingState};
use crate::config::human_bytes;
use crate::k8s::crd::{DriveAction, DriveCondition, EvacuationVolume};
use crate::words::{DriveUse, DriveUseState};

/// Reason of the condition while a drive's volumes move.
pub(crate) const EVACUATING: &str = "Evacuating";
/// Reason of the condition once an evacuated drive is released.
pub(crate) const EVACUATED: &str = "Evacuated";
/// Reason of the condition once a move failed (asking again retries it).
pub(crate) const EVACUATION_FAILED: &str = "EvacuationFailed";
/// Reason of the condition when the volume manager refused the action.
pub(crate) const REFUSED: &str = "Refused";

/// Reason of the condition while a drive is being adopted.
pub(crate) const ADOPTING: &str = "Adopting";
/// Reason of the condition once an adopted drive is this node's.
pub(crate) const ADOPTED: &str = "Adopted";

/// The one condition type a Drive's action reports in.
pub(crate) const ACTION_COMPLETE: &str = "ActionComplete";

/// What to ask the volume manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Command {
    /// Cordon (`true`) or uncordon (`false`).
    Cordon(bool),
    /// Release (never forced).
    Release,
    /// Evacuate (never forced).
    Evacuate,
}

/// What `action` asks of a drive whose usage is `usage` now (`None`: nothing left to ask);
/// `fresh`: the spec is of a generation the agent has not answered yet (no condition,
/// or one observed at an older generation).
pub(crate) fn command(action: DriveAction, usage: Option<&DriveUse>, fresh: bool) -> Option<Command> {
    let state = usage.map(|u| u.state);
    match (action, state) {
        (DriveAction::Evacuate, Some(DriveUseState::Released)) => None,
        // Under way: asked again only when the admin asked again (retries failed moves).
        (DriveAction::Evacuate, Some(_)) if usage.is_some_and(|u| u.evacuate.is_some()) => fresh.then_some(Command::Evacuate),
        (DriveAction::Evacuate, _) => Some(Command::Evacuate),
        (DriveAction::None, Some(DriveUseState::Cordoned)) => Some(Command::Cordon(false)),
        (DriveAction::None, _) => None,
        (DriveAction::Cordon, None) => Some(Command::Cordon(true)),
        (DriveAction::Cordon, Some(_)) => None,
        (DriveAction::Release, None | Some(DriveUseState::Cordoned)) => Some(Command::Release),
        // Releasing on its own (health BAD, without auto-release) completes only once an
        // admin asked; ask, so it does.
        (DriveAction::Release, Some(DriveUseState::Releasing)) if usage.is_some_and(|u| !u.requested) => Some(Command::Release),
        (DriveAction::Release, Some(_)) => None,
        // Adopting is asked of the inventory, by the drive's class: see [`adopts`].
        (DriveAction::Adopt, _) => None,
    }
}

/// Whether `adopt` is to be asked of the inventory for a drive of class `class` now:
/// only while it is owned elsewhere (a managed drive is this node's already; any other
/// class is refused by [`adopt_outcome`] without asking).
pub(crate) fn adopts(action: DriveAction, class: Option<crate::k8s::crd::DriveClass>) -> bool {
    action == DriveAction::Adopt && class == Some(crate::k8s::crd::DriveClass::OwnedElsewhere)
}

/// The condition's status, reason and message for `adopt` of drive `drive_id`, whose
/// class is now `class` (why: `class_reason`), holding `volumes`; `refused` is the
/// inventory's answer when it refused.
pub(crate) fn adopt_outcome(
    drive_id: &str,
    class: Option<crate::k8s::crd::DriveClass>,
    class_reason: &str,
    volumes: &[String],
    refused: Option<&str>,
) -> (bool, &'static str, String) {
    use crate::k8s::crd::DriveClass;
    if let Some(why) = refused {
        return (false, REFUSED, format!("drive {drive_id} could not be adopted: {why}"));
    }
    match class {
        Some(DriveClass::Managed) => {
            let held = match volumes.len() {
                0 => "it holds no volume".to_string(),
                1 => format!("its volume {} is served here; its claim's PV is pinned to this node (the claim's Events say so)", volumes[0]),
                n => format!(
                    "its {n} volumes ({}) are served here; their claims' PVs are pinned to this node (each claim's Events say so)",
                    volumes.join(", ")
                ),
            };
            (true, ADOPTED, format!("drive {drive_id} belongs to this node: {held}"))
        }
        Some(DriveClass::OwnedElsewhere) => (false, ADOPTING, format!("drive {drive_id} {class_reason}; the agent is adopting it")),
        Some(other) => {
            let word = serde_json::to_value(other).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
            (false, REFUSED, format!("drive {drive_id} is {word} ({class_reason}): only a drivelet disk owned elsewhere is adopted"))
        }
        None => (false, ADOPTING, format!("drive {drive_id}: adoption asked; the agent has not classified the drive yet")),
    }
}

/// The condition's status, reason and message for `action` on drive `drive_id`, whose
/// usage is `usage` and which holds the live volumes `volumes`; `refused` is the volume
/// manager's answer when it refused the command; `evacuation` where the drive's
/// evacuation stands (when one was asked) and `pods` the pods using each volume (by id).
pub(crate) fn outcome(
    action: DriveAction,
    drive_id: &str,
    usage: Option<&DriveUse>,
    volumes: &[String],
    refused: Option<&str>,
    evacuation: Option<&Evacuation>,
    pods: &BTreeMap<String, Vec<String>>,
) -> (bool, &'static str, String) {
    if let Some(why) = refused {
        return (false, REFUSED, format!("drive {drive_id} could not be asked to {}: {why}", action.as_str()));
    }
    if action == DriveAction::Evacuate {
        return evacuation_outcome(drive_id, usage, evacuation, pods);
    }
    let state = usage.map(|u| u.state);
    let why = usage.map(|u| u.reason.as_str()).unwrap_or_default();
    let held = match volumes.len() {
        0 => "no volume".to_string(),
        1 => format!("1 volume ({})", volumes[0]),
        n => format!("{n} volumes ({})", volumes.join(", ")),
    };
    match (action, state) {
        (DriveAction::None, None) => (true, "Active", format!("drive {drive_id} takes new volumes")),
        (DriveAction::None, Some(DriveUseState::Cordoned)) => {
            (false, "Cordoned", format!("drive {drive_id} is still cordoned; the agent is lifting it"))
        }
        (DriveAction::None, Some(s)) => (
            false,
            if s == DriveUseState::Released { "Released" } else { "Releasing" },
            format!("drive {drive_id} is {} ({why}); a release is not undone", s.as_str()),
        ),
        (DriveAction::Cordon, None) => (false, "Active", format!("drive {drive_id} takes new volumes; the agent is cordoning it")),
        (DriveAction::Cordon, Some(DriveUseState::Cordoned)) => {
            (true, "Cordoned", format!("drive {drive_id} takes no new volumes; it holds {held}, served as before"))
        }
        (DriveAction::Cordon, Some(s)) => (
            true,
            if s == DriveUseState::Released { "Released" } else { "Releasing" },
            format!("drive {drive_id} takes no new volumes already: it is {} ({why})", s.as_str()),
        ),
        (DriveAction::Release, Some(DriveUseState::Released)) => {
            (true, "Released", format!("drive {drive_id} is released: it holds no volume and may be pulled"))
        }
        (DriveAction::Release, Some(DriveUseState::Releasing)) => (
            false,
            "Releasing",
            format!("drive {drive_id} takes no new volumes and is released once {held} on it are deleted or moved"),
        ),
        (DriveAction::Release, _) => (false, "Active", format!("drive {drive_id} takes new volumes; the agent is releasing it")),
        (DriveAction::Evacuate, _) => evacuation_outcome(drive_id, usage, evacuation, pods),
        // Judged by the drive's class: the sync asks [`adopt_outcome`].
        (DriveAction::Adopt, _) => adopt_outcome(drive_id, None, "", volumes, None),
    }
}

/// `pods` as words: `pod a/b`, `pods a/b, a/c`.
fn pods_words(pods: &[String]) -> String {
    match pods {
        [one] => format!("pod {one}"),
        many => format!("pods {}", many.join(", ")),
    }
}

/// Why a waiting volume waits: the pods using it when they are known, else the volume
/// manager's words.
fn waiting_words(p: &crate::actors::volumes::PendingMove, pods: &BTreeMap<String, Vec<String>>) -> String {
    match pods.get(&p.volume_id).filter(|v| !v.is_empty()) {
        Some(v) => format!("used by {}: moves once it is deleted or moved off the node", pods_words(v)),
        None => p.reason.clone(),
    }
}

/// The condition of an evacuation (see the module rules).
fn evacuation_outcome(
    drive_id: &str,
    usage: Option<&DriveUse>,
    evacuation: Option<&Evacuation>,
    pods: &BTreeMap<String, Vec<String>>,
) -> (bool, &'static str, String) {
    let released = usage.is_some_and(|u| u.state == DriveUseState::Released);
    let Some(e) = evacuation else {
        return if released {
            (true, EVACUATED, format!("drive {drive_id} is evacuated: it holds no volume and may be pulled"))
        } else {
            (false, EVACUATING, format!("drive {drive_id}: evacuation asked; the agent is starting it"))
        };
    };
    if e.done || released {
        return (true, EVACUATED, format!("drive {drive_id} {}", e.words()));
    }
    let mut msg = format!("drive {drive_id} {}", e.words());
    let waiting: Vec<String> = e
        .pending
        .iter()
        .filter(|p| p.state == PendingState::Waiting)
        .map(|p| format!("{} {}", p.name, waiting_words(p, pods)))
        .collect();
    let failed: Vec<String> = e.pending.iter().filter(|p| p.state == PendingState::Failed).map(|p| format!("{}: {}", p.name, p.reason)).collect();
    if !waiting.is_empty() {
        msg += &format!("; waiting: {}", waiting.join("; "));
    }
    if failed.is_empty() {
        return (false, EVACUATING, msg);
    }
    msg += &format!("; failed: {}; the failed volumes stay where they are, served as before: ask for the evacuation again to retry them", failed.join("; "));
    (false, EVACUATION_FAILED, msg)
}

/// The per-volume list of the status of an evacuated drive: the volumes moved off it
/// (state `moved`, where to), then those still on it, as the volume manager orders them.
pub(crate) fn evacuation_list(e: &Evacuation, pods: &BTreeMap<String, Vec<String>>) -> Vec<EvacuationVolume> {
    let moved = e.moved.iter().map(|m| {
        let mut reason = format!("on drive {} ({} copied and verified)", m.to_drive, human_bytes(m.bytes));
        if !m.unreadable.is_empty() {
            reason += &format!("; unreadable on the old drive, zeros now: {}", crate::disk::mover::ranges_words(&m.unreadable));
        }
        EvacuationVolume { volume: m.volume_id.clone(), name: m.name.clone(), state: "moved".into(), reason }
    });
    let pending = e.pending.iter().map(|p| EvacuationVolume {
        volume: p.volume_id.clone(),
        name: p.name.clone(),
        state: p.state.as_str().into(),
        reason: if p.state == PendingState::Waiting { waiting_words(p, pods) } else { p.reason.clone() },
    });
    moved.chain(pending).collect()
}

/// The `ActionComplete` condition: `outcome` observed at `generation`, keeping the
/// transition time of `before` while the status is the same, else `now` (RFC 3339).
pub(crate) fn condition(outcome: (bool, &str, String), generation: i64, before: Option<&DriveCondition>, now: &str) -> DriveCondition {
    let (done, reason, message) = outcome;
    let status = if done { "True" } else { "False" }.to_string();
    let last_transition_time = match before {
        Some(b) if b.status == status => b.last_transition_time.clone(),
        _ => now.to_string(),
    };
    DriveCondition { type_: ACTION_COMPLETE.into(), status, reason: reason.into(), message, observed_generation: generation, last_transition_time }
}

/// The Event to record when the condition went from `before` to `after` (`None`: the
/// reason did not change).
pub(crate) fn event_of(action: DriveAction, before: Option<&DriveCondition>, after: &DriveCondition) -> Option<Event> {
    if before.is_some_and(|b| b.reason == after.reason) {
        return None;
    }
    let action = match action {
        DriveAction::None => "Uncordon",
        DriveAction::Cordon => "Cordon",
        DriveAction::Release => "Release",
        DriveAction::Evacuate => "Evacuate",
        DriveAction::Adopt => "Adopt",
    };
    let warning = after.reason == REFUSED || after.reason == EVACUATION_FAILED;
    Some(Event {
        type_: if warning { EventType::Warning } else { EventType::Normal },
        reason: after.reason.clone(),
        note: Some(crate::k8s::events::condition_event::truncate_note(&after.message).to_string()),
        action: action.into(),
        secondary: None,
    })
}

#[cfg(test)]
mod tests;
