//! The in-process external-attacher: decides what to do about one VolumeAttachment (or
//! one PersistentVolume) and carries the decision out against the API server.
//!
//! Rules, the external-attacher's, decided by the pure `reconcile` / `reconcile_pv`:
//! - A VolumeAttachment whose `spec.attacher` is not our driver or whose `spec.nodeName`
//!   is not this node is none of our business: no action.
//! - Without a deletionTimestamp:
//!   - a VolumeAttachment whose PV is being deleted is skipped (no action);
//!   - a PV that is named but not yet seen is waited for (requeue with backoff, no write);
//!   - one that is already attached (`status.attached`, our finalizer, no attachError) is
//!     left alone, apart from adding a missing PV finalizer;
//!   - otherwise our finalizer (`external-attacher/<driver with '/' as '-'>`) is added to
//!     the VolumeAttachment and to the PV before anything else, then the volume is
//!     published with the access type the PV asks for (`volumeMode`, `csi.fsType`);
//!     success writes `attached=true`, the publish context the publish returned as
//!     `attachmentMetadata` and clears `attachError`;
//!   - failure leaves `attached=false`, writes `attachError` and a Warning Event and
//!     requeues: with exponential backoff (`backoff`) when the failure may pass (volume not
//!     found yet, busy, the volume manager restarting, a disk error), with the long
//!     `RetryPolicy::terminal` delay when the volume is unusable (drive failing,
//!     releasing or gone, attached elsewhere, another access type) so a bad drive is a
//!     clear error, not a retry storm. Which is which is decided by [`kind_of`] from the
//!     volume manager's error variant, never from its words.
//! - With a deletionTimestamp (and our finalizer): the volume is unpublished (not when the
//!   volume manager no longer knows it, nor when the PV is gone and the volume id with
//!   it), then our finalizer is removed; failure writes `detachError` and a Warning Event,
//!   leaves `attached` as it was and requeues with backoff.
//! - Our PV finalizer is removed only when the PV has a deletionTimestamp and no
//!   VolumeAttachment (this one once detached, or any other) still names it.
//!
//! [`executor`] carries the actions out (in order, stopping at the first failure; a
//! failed publish or unpublish turned into the failure actions above). Clocks (error
//! times) are read by the executor, never by the decisions. The [`controller`], run by
//! the controller shell (`crate::k8s::shell`), decides when each object is looked at;
//! this module decides what to do about it.

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Resource;

use super::identity::Identity;
use crate::actors::volumes::VolumeError;
use crate::k8s::shell::RetryPolicy;

/// The volume side: what the attacher asks of the volume manager, and the VolumeManager
/// backend of a running agent.
pub(crate) mod backend;
/// The attach controller the shell runs (the AttachQueue actor): what is kept of the
/// watched objects, which keys a change queues, and a run of a key.
pub(crate) mod controller;

/// Carries the decisions out against the API server and the volume side.
pub(crate) mod executor;

pub(crate) use backend::{AttachBackend, ManagerBackend};
pub(crate) use executor::{AttachError, Executor};
pub(crate) use controller::{AttachQueue, GetQueueStats, QueueConfig};

/// What the volume manager says about the volume a VolumeAttachment names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum VolumeState {
    /// The volume lives on this node, serves the access type asked for, and its drive is
    /// usable.
    Usable,
    /// The volume manager knows no such volume (not created yet, deleted, or another
    /// node's).
    Missing,
    /// The volume exists but cannot be attached: its drive is failing, releasing or gone.
    Unusable {
        /// Why, in plain words, for `attachError` and the Event.
        reason: String,
    },
}

/// What the attacher makes of a refusal of the volume manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RefusalKind {
    /// The volume manager knows no such volume.
    Missing,
    /// The volume's or its drive's state refuses the attachment; retrying soon will not
    /// change that (retried after `RetryPolicy::terminal`).
    Unusable,
    /// It may pass by retrying (busy, starting, restarting, a disk or store error):
    /// retried with backoff.
    Transient,
}

/// How a volume manager error is treated by the attacher (see the module rules). Every
/// variant is named, so a new one needs a decision here.
pub(crate) fn kind_of(e: &VolumeError) -> RefusalKind {
    use RefusalKind::*;
    match e {
        VolumeError::NotFound { .. } => Missing,
        VolumeError::DriveAbsent { .. }
        | VolumeError::DriveMissing { .. }
        | VolumeError::DriveFailing { .. }
        | VolumeError::DriveReleasing { .. }
        | VolumeError::FailedByRelease { .. }
        | VolumeError::Lost { .. }
        | VolumeError::AttachedElsewhere { .. }
        | VolumeError::WrongAccessType { .. }
        | VolumeError::WrongFilesystem { .. }
        | VolumeError::FilesystemFound { .. }
        | VolumeError::AdoptedUnreadable { .. }
        | VolumeError::AdoptedNotDirectory { .. } => Unusable,
        VolumeError::Busy { .. }
        | VolumeError::Evacuating { .. }
        | VolumeError::FreezeExpired { .. }
        | VolumeError::NotReady
        | VolumeError::DeleteUnfinished { .. }
        | VolumeError::DriveGoneDuringCreate { .. }
        | VolumeError::Disk { .. }
        | VolumeError::ForeignData { .. }
        | VolumeError::Store(_)
        | VolumeError::Panicked { .. } => Transient,
        // Refusals of node calls and of other controller calls: an attach never gets
        // them; should one come, retrying with backoff is the safe reading.
        VolumeError::InvalidArgument { .. }
        | VolumeError::Unreadable { .. }
        | VolumeError::CannotEvacuate { .. }
        | VolumeError::SnapshotSourceInUse { .. }
        | VolumeError::SnapshotNameTaken { .. }
        | VolumeError::SnapshotNotFound { .. }
        | VolumeError::SnapshotUnusable { .. }
        | VolumeError::AlreadyExists { .. }
        | VolumeError::ResourceExhausted { .. }
        | VolumeError::OutOfRange { .. }
        | VolumeError::GrowsWhenUnused { .. }
        | VolumeError::PathNotFound { .. }
        | VolumeError::StillAttached { .. }
        | VolumeError::NotStaged { .. }
        | VolumeError::AlreadyStaged { .. }
        | VolumeError::PublishBeforeStage { .. }
        | VolumeError::StillPublished { .. }
        | VolumeError::StillStaged { .. }
        | VolumeError::PartitionMounted { .. }
        | VolumeError::StagedElsewhere { .. }
        | VolumeError::EncryptionKey { .. }
        | VolumeError::StagedForOtherAccess { .. }
        | VolumeError::BlockReadOnlyMixed { .. }
        | VolumeError::SingleWriterInUse { .. }
        | VolumeError::AdoptedFixedSize { .. }
        | VolumeError::AdoptedFilesystem { .. }
        | VolumeError::ExpandUnfinished { .. }
        | VolumeError::CannotGrowExt4 { .. }
        | VolumeError::SourceNotFound { .. }
        | VolumeError::SourceIncompatible { .. }
        | VolumeError::SourceChanged { .. }
        | VolumeError::SourceInUse { .. }
        | VolumeError::CloneTooSmall { .. } => Transient,
    }
}

/// What the volume manager's answer to "may this volume be attached?" means here.
pub(crate) fn volume_state(answer: Result<(), VolumeError>) -> Result<VolumeState, VolumeCallError> {
    match answer {
        Ok(()) => Ok(VolumeState::Usable),
        Err(e) => match kind_of(&e) {
            RefusalKind::Missing => Ok(VolumeState::Missing),
            RefusalKind::Unusable => Ok(VolumeState::Unusable { reason: e.why().unwrap_or_else(|| e.to_string()) }),
            RefusalKind::Transient => Err(e.into()),
        },
    }
}

/// Why an in-process publish or unpublish (or the question before it) did not succeed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum VolumeCallError {
    /// The volume manager refused or failed the call.
    #[error(transparent)]
    Volume(#[from] VolumeError),
    /// The volume manager could not answer (restarting); the words say so.
    #[error("{0}")]
    Unavailable(String),
}

impl VolumeCallError {
    /// How the attacher treats it.
    pub(crate) fn kind(&self) -> RefusalKind {
        match self {
            VolumeCallError::Volume(e) => kind_of(e),
            VolumeCallError::Unavailable(_) => RefusalKind::Transient,
        }
    }
}

/// How a status patch treats `attachError` / `detachError`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ErrorPatch {
    /// Leave the field as it is.
    Keep,
    /// Set the field to this message (the executor adds the time).
    Set(String),
}

/// Kind of an Event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventKind {
    /// Something a person should look at.
    Warning,
}

/// One step of a reconcile, carried out in order by `Executor::apply`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Add our finalizer to the VolumeAttachment.
    AddFinalizer,
    /// Add our finalizer to the PV.
    AddPvFinalizer,
    /// Publish the volume to this node (ControllerPublishVolume in process).
    Publish(PublishSpec),
    /// Patch the status after a successful `Publish`: `attached=true`, the publish
    /// context as `attachmentMetadata`, no `attachError`.
    MarkAttached,
    /// Patch the VolumeAttachment's status subresource.
    PatchStatus {
        /// New `attached`, or `None` to keep it.
        attached: Option<bool>,
        /// What to do with `attachError`.
        attach_error: ErrorPatch,
        /// What to do with `detachError`.
        detach_error: ErrorPatch,
    },
    /// Unpublish the volume from this node (ControllerUnpublishVolume in process).
    Unpublish {
        /// The CSI volume id.
        volume_id: String,
    },
    /// Remove our finalizer from the VolumeAttachment.
    RemoveFinalizer,
    /// Remove our finalizer from the PV.
    RemovePvFinalizer,
    /// Record an Event on the VolumeAttachment.
    RecordEvent {
        /// Normal or Warning.
        kind: EventKind,
        /// CamelCase reason (`AttachFailed`).
        reason: String,
        /// What was being done (`Attach`, `Detach`).
        action: String,
        /// The human message.
        message: String,
    },
    /// Look at this VolumeAttachment again after this delay.
    Requeue {
        /// The delay.
        after: Duration,
    },
}

/// What a VolumeAttachment asks to publish: the volume and the access type its PV (or
/// inline spec) names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PublishSpec {
    /// The CSI volume id (`csi.volumeHandle`).
    pub volume_id: String,
    /// `volumeMode: Block`.
    pub block: bool,
    /// `csi.fsType` (empty: any).
    pub fs_type: String,
}

/// The volume a VolumeAttachment names, through its PV when it has one, else its inline
/// CSI spec; `None` when neither carries a CSI source.
pub(crate) fn publish_spec(va: &VolumeAttachment, pv: Option<&PersistentVolume>) -> Option<PublishSpec> {
    let spec = match pv {
        Some(pv) => pv.spec.as_ref()?,
        None => va.spec.source.inline_volume_spec.as_ref()?,
    };
    let csi = spec.csi.as_ref()?;
    Some(PublishSpec {
        volume_id: csi.volume_handle.clone(),
        block: spec.volume_mode.as_deref() == Some("Block"),
        fs_type: csi.fs_type.clone().unwrap_or_default(),
    })
}

/// Everything a reconcile of one VolumeAttachment looks at.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Observed<'a> {
    /// The VolumeAttachment.
    pub va: &'a VolumeAttachment,
    /// Its PV, if it names one and the PV exists.
    pub pv: Option<&'a PersistentVolume>,
    /// How many VolumeAttachments other than `va` name the same PV.
    pub other_attachments: usize,
    /// What the volume manager says about the volume.
    pub volume: &'a VolumeState,
    /// Consecutive failed attempts on this VolumeAttachment so far.
    pub failures: u32,
}

/// Decide what to do about one VolumeAttachment (see the module rules).
pub(crate) fn reconcile(obs: &Observed<'_>, id: &Identity, policy: &RetryPolicy) -> Vec<Action> {
    let va = obs.va;
    if va.spec.attacher != id.driver || va.spec.node_name != id.node {
        return Vec::new();
    }
    let finalizer = id.finalizer();
    let pv_deleting = obs.pv.is_some_and(|pv| pv.metadata.deletion_timestamp.is_some());
    let pv_has_finalizer = obs.pv.is_some_and(|pv| has_finalizer(pv, &finalizer));
    let release_pv = pv_deleting && pv_has_finalizer && obs.other_attachments == 0;

    if va.metadata.deletion_timestamp.is_some() {
        if !has_finalizer(va, &finalizer) {
            return if release_pv { vec![Action::RemovePvFinalizer] } else { Vec::new() };
        }
        let mut actions = Vec::new();
        // A PV already gone takes the volume id with it.
        if let Some(spec) = publish_spec(va, obs.pv) {
            if *obs.volume != VolumeState::Missing {
                actions.push(Action::Unpublish { volume_id: spec.volume_id });
            }
        }
        actions.push(Action::RemoveFinalizer);
        if release_pv {
            actions.push(Action::RemovePvFinalizer);
        }
        return actions;
    }

    let pv_name = va.spec.source.persistent_volume_name.as_deref();
    if pv_name.is_some() && obs.pv.is_none() {
        return vec![Action::Requeue { after: policy.backoff(obs.failures) }];
    }
    if pv_deleting {
        return Vec::new();
    }

    let mut actions = Vec::new();
    let status = va.status.as_ref();
    let already_attached = status.is_some_and(|s| s.attached && s.attach_error.is_none())
        && has_finalizer(va, &finalizer);
    if !has_finalizer(va, &finalizer) {
        actions.push(Action::AddFinalizer);
    }
    if obs.pv.is_some() && !pv_has_finalizer {
        actions.push(Action::AddPvFinalizer);
    }
    if already_attached {
        return actions;
    }
    let Some(spec) = publish_spec(va, obs.pv) else {
        let message = match pv_name {
            Some(pv) => format!("PersistentVolume {pv} has no CSI source"),
            None => "VolumeAttachment names neither a PersistentVolume nor a CSI inline volume".to_string(),
        };
        actions.extend(attach_failed(message, true, obs.failures, policy));
        return actions;
    };
    match obs.volume {
        VolumeState::Usable => {
            actions.push(Action::Publish(spec));
            actions.push(Action::MarkAttached);
        }
        VolumeState::Missing => {
            let message = format!("volume {} does not exist on node {}", spec.volume_id, id.node);
            actions.extend(attach_failed(message, false, obs.failures, policy));
        }
        VolumeState::Unusable { reason } => {
            let message = format!("volume {} cannot be attached: {reason}", spec.volume_id);
            actions.extend(attach_failed(message, true, obs.failures, policy));
        }
    }
    actions
}

/// Decide about our finalizer on a PV: removed only when the PV is being deleted and no
/// VolumeAttachment (`attachments` counts them) names it any more.
pub(crate) fn reconcile_pv(pv: &PersistentVolume, id: &Identity, attachments: usize) -> Vec<Action> {
    if pv.metadata.deletion_timestamp.is_some() && attachments == 0 && has_finalizer(pv, &id.finalizer()) {
        vec![Action::RemovePvFinalizer]
    } else {
        Vec::new()
    }
}

/// The actions after a failed attach: `attached=false`, `attachError`, a Warning Event
/// and a requeue, long when `terminal`, with backoff otherwise.
pub(crate) fn attach_failed(message: String, terminal: bool, failures: u32, policy: &RetryPolicy) -> Vec<Action> {
    let after = if terminal { policy.terminal } else { policy.backoff(failures) };
    vec![
        Action::PatchStatus {
            attached: Some(false),
            attach_error: ErrorPatch::Set(message.clone()),
            detach_error: ErrorPatch::Keep,
        },
        Action::RecordEvent {
            kind: EventKind::Warning,
            reason: "AttachFailed".to_string(),
            action: "Attach".to_string(),
            message,
        },
        Action::Requeue { after },
    ]
}

/// The actions after a failed detach: `detachError` (`attached` stays as it was), a
/// Warning Event and a requeue with backoff.
pub(crate) fn detach_failed(message: String, failures: u32, policy: &RetryPolicy) -> Vec<Action> {
    vec![
        Action::PatchStatus {
            attached: None,
            attach_error: ErrorPatch::Keep,
            detach_error: ErrorPatch::Set(message.clone()),
        },
        Action::RecordEvent {
            kind: EventKind::Warning,
            reason: "DetachFailed".to_string(),
            action: "Detach".to_string(),
            message,
        },
        Action::Requeue { after: policy.backoff(failures) },
    ]
}

fn has_finalizer<K: Resource>(obj: &K, finalizer: &str) -> bool {
    obj.meta().finalizers.as_ref().is_some_and(|f| f.iter().any(|x| x == finalizer))
}

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod tests;
