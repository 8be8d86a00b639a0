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
//!   of `ctl drive release` without force (the API never fails volumes).
//! - [`outcome`] is the one `ActionComplete` condition: `True` once the drive is in the
//!   asked state, `False` while a release waits for its volumes or when the volume
//!   manager refused (the reason `Refused`, its words in the message). Its transition
//!   time changes only with its status ([`condition`]).
//! - An Event is recorded on the Drive each time the condition's reason changes
//!   ([`event_of`]): Normal, or Warning for a refusal.
//! - An object without `spec.action` gets no condition: nothing was asked.

use kube::runtime::events::{Event, EventType};

use crate::k8s::crd::{DriveAction, DriveCondition};
use crate::words::{DriveUse, DriveUseState};

/// The one condition type a Drive's action reports in.
pub(crate) const ACTION_COMPLETE: &str = "ActionComplete";

/// What to ask the volume manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Command {
    /// Cordon (`true`) or uncordon (`false`).
    Cordon(bool),
    /// Release (never forced).
    Release,
}

/// What `action` asks of a drive whose usage is `usage` now (`None`: nothing left to ask).
pub(crate) fn command(action: DriveAction, usage: Option<&DriveUse>) -> Option<Command> {
    let state = usage.map(|u| u.state);
    match (action, state) {
        (DriveAction::None, Some(DriveUseState::Cordoned)) => Some(Command::Cordon(false)),
        (DriveAction::None, _) => None,
        (DriveAction::Cordon, None) => Some(Command::Cordon(true)),
        (DriveAction::Cordon, Some(_)) => None,
        (DriveAction::Release, None | Some(DriveUseState::Cordoned)) => Some(Command::Release),
        // Releasing on its own (health BAD, without auto-release) completes only once an
        // admin asked; ask, so it does.
        (DriveAction::Release, Some(DriveUseState::Releasing)) if usage.is_some_and(|u| !u.requested) => Some(Command::Release),
        (DriveAction::Release, Some(_)) => None,
    }
}

/// The condition's status, reason and message for `action` on drive `drive_id`, whose
/// usage is `usage` and which holds the live volumes `volumes`; `refused` is the volume
/// manager's answer when it refused the command.
pub(crate) fn outcome(
    action: DriveAction,
    drive_id: &str,
    usage: Option<&DriveUse>,
    volumes: &[String],
    refused: Option<&str>,
) -> (bool, &'static str, String) {
    if let Some(why) = refused {
        return (false, "Refused", format!("drive {drive_id} could not be asked to {}: {why}", action.as_str()));
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
    }
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
    };
    Some(Event {
        type_: if after.reason == "Refused" { EventType::Warning } else { EventType::Normal },
        reason: after.reason.clone(),
        note: Some(after.message.clone()),
        action: action.into(),
        secondary: None,
    })
}

#[cfg(test)]
mod tests;
