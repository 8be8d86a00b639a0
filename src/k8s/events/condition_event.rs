//! What a condition Event says: a Warning `VolumeConditionAbnormal` or a Normal
//! `VolumeConditionNormal`, action `HealthCheck`, the note being the condition's message
//! cut to the Events API's 1 KiB limit at a character boundary. Events on a pod name the
//! claim as their related object, so a pod with two claims tells which one.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};

use super::VolumeConditionChanged;

/// Reason of the Event recorded when a volume turns abnormal.
pub(crate) const REASON_ABNORMAL: &str = "VolumeConditionAbnormal";
/// Reason of the Event recorded when a volume is back to normal.
pub(crate) const REASON_NORMAL: &str = "VolumeConditionNormal";
/// Action of every condition Event.
pub(crate) const ACTION: &str = "HealthCheck";
/// The Events API's limit on `note`, in bytes.
pub(crate) const NOTE_LIMIT: usize = 1024;

/// `note` cut to at most [`NOTE_LIMIT`] bytes, at a character boundary.
pub(crate) fn truncate_note(note: &str) -> &str {
    if note.len() <= NOTE_LIMIT {
        return note;
    }
    let mut end = NOTE_LIMIT;
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    &note[..end]
}

/// The Event about `change`, on a claim (`related: None`) or on a pod (`related`: its
/// claim).
pub(crate) fn condition_event(change: &VolumeConditionChanged, related: Option<ObjectReference>) -> Event {
    let (type_, reason) = if change.abnormal {
        (EventType::Warning, REASON_ABNORMAL)
    } else {
        (EventType::Normal, REASON_NORMAL)
    };
    Event {
        type_,
        reason: reason.to_string(),
        note: Some(truncate_note(&change.message).to_string()),
        action: ACTION.to_string(),
        secondary: related,
    }
}
