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
//! `Executor::apply` performs the actions in order and stops at the first failure; a
//! failed publish or unpublish is turned into the failure actions above. Clocks (error
//! times) are read by the executor, never by the decisions. The [`controller`], run by
//! the controller shell (`crate::k8s::shell`), decides when each object is looked at;
//! this module decides what to do about it.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use serde_json::{json, Map, Value};

use super::identity::Identity;
use crate::actors::volumes::VolumeError;
use crate::backoff::backoff;

/// The volume side: what the attacher asks of the volume manager, and the VolumeManager
/// backend of a running agent.
pub(crate) mod backend;
/// The attach controller the shell runs (the AttachQueue actor): what is kept of the
/// watched objects, which keys a change queues, and a run of a key.
pub(crate) mod controller;

pub(crate) use backend::{AttachBackend, ManagerBackend};
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
        | VolumeError::AlreadyExists { .. }
        | VolumeError::ResourceExhausted { .. }
        | VolumeError::OutOfRange { .. }
        | VolumeError::PathNotFound { .. }
        | VolumeError::StillAttached { .. }
        | VolumeError::NotStaged { .. }
        | VolumeError::AlreadyStaged { .. }
        | VolumeError::PublishBeforeStage { .. }
        | VolumeError::StillPublished { .. }
        | VolumeError::StillStaged { .. }
        | VolumeError::PartitionMounted { .. }
        | VolumeError::StagedElsewhere { .. }
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

/// Retry delays (base and cap come from config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryPolicy {
    /// Delay after the first failure; doubled per consecutive failure.
    pub base: Duration,
    /// The longest backoff delay.
    pub cap: Duration,
    /// Delay after a failure that will not pass by retrying (an unusable drive).
    pub terminal: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(300),
            terminal: Duration::from_secs(600),
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
        return vec![Action::Requeue { after: backoff(obs.failures, policy.base, policy.cap) }];
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
    let after = if terminal { policy.terminal } else { backoff(failures, policy.base, policy.cap) };
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
        Action::Requeue { after: backoff(failures, policy.base, policy.cap) },
    ]
}

fn has_finalizer<K: Resource>(obj: &K, finalizer: &str) -> bool {
    obj.meta().finalizers.as_ref().is_some_and(|f| f.iter().any(|x| x == finalizer))
}

/// The in-process CSI controller calls the executor makes; the actor wiring implements
/// them by asking the VolumeManager.
pub(crate) trait VolumeOps {
    /// ControllerPublishVolume of `spec` to `node`, answering the publish context.
    fn publish(&self, spec: &PublishSpec, node: &str) -> impl Future<Output = Result<BTreeMap<String, String>, VolumeCallError>> + Send;
    /// ControllerUnpublishVolume of `volume_id` from `node`.
    fn unpublish(&self, volume_id: &str, node: &str) -> impl Future<Output = Result<(), VolumeCallError>> + Send;
}

/// Errors talking to the API server while carrying out actions.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AttachError {
    /// A patch of the VolumeAttachment (metadata or status) failed.
    #[error("updating VolumeAttachment {name}: {source}")]
    VolumeAttachment {
        /// The VolumeAttachment.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// A patch of the PV failed.
    #[error("updating PersistentVolume {name}: {source}")]
    PersistentVolume {
        /// The PV.
        name: String,
        /// The API error.
        source: kube::Error,
    },
}

/// Carries out actions against the API server (and the volume manager via `VolumeOps`).
#[derive(Clone)]
pub(crate) struct Executor {
    client: Client,
    recorder: Recorder,
    identity: Identity,
    policy: RetryPolicy,
}

impl Executor {
    /// An executor writing as [`REPORTER`](super::identity::REPORTER), Events reported by
    /// this node's instance.
    pub(crate) fn new(client: Client, identity: Identity, policy: RetryPolicy) -> Self {
        let recorder = Recorder::new(client.clone(), identity.reporter());
        Self { client, recorder, identity, policy }
    }

    /// Perform `actions` in order for `va` (and its `pv`). A failed publish or unpublish is
    /// replaced by `attach_failed` / `detach_failed` (with `failures` for the backoff) and
    /// the rest of the plan dropped. Returns the requeue delay asked for, if any. An API
    /// error stops at once; the caller requeues with backoff.
    pub(crate) async fn apply<O: VolumeOps>(
        &self,
        va: &VolumeAttachment,
        pv: Option<&PersistentVolume>,
        actions: Vec<Action>,
        ops: &O,
        failures: u32,
    ) -> Result<Option<Duration>, AttachError> {
        let mut va = va.clone();
        let mut pv = pv.cloned();
        let mut requeue = None;
        let mut context = BTreeMap::new();
        let mut queue: std::collections::VecDeque<Action> = actions.into();
        while let Some(action) = queue.pop_front() {
            let failed = match &action {
                Action::Publish(spec) => match ops.publish(spec, &self.identity.node).await {
                    Ok(c) => {
                        context = c;
                        None
                    }
                    Err(e) => Some(attach_failed(
                        format!("publishing volume {}: {e}", spec.volume_id),
                        e.kind() == RefusalKind::Unusable,
                        failures,
                        &self.policy,
                    )),
                },
                Action::MarkAttached => {
                    let patch = json!({ "status": {
                        "attached": true,
                        "attachmentMetadata": context,
                        "attachError": Value::Null,
                    }});
                    self.patch_status(&mut va, patch).await?;
                    None
                }
                Action::Unpublish { volume_id } => ops
                    .unpublish(volume_id, &self.identity.node)
                    .await
                    .err()
                    .map(|e| detach_failed(format!("unpublishing volume {volume_id}: {e}"), failures, &self.policy)),
                Action::Requeue { after } => {
                    requeue = Some(*after);
                    None
                }
                other => {
                    self.apply_api(&mut va, &mut pv, other).await?;
                    None
                }
            };
            if let Some(failure) = failed {
                queue = failure.into();
            }
        }
        Ok(requeue)
    }

    async fn apply_api(
        &self,
        va: &mut VolumeAttachment,
        pv: &mut Option<PersistentVolume>,
        action: &Action,
    ) -> Result<(), AttachError> {
        let finalizer = self.identity.finalizer();
        let vas: Api<VolumeAttachment> = Api::all(self.client.clone());
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let params = PatchParams::default();
        let va_err = |source| AttachError::VolumeAttachment { name: va.name_any(), source };
        match action {
            Action::AddFinalizer | Action::RemoveFinalizer => {
                let patch = finalizer_patch(&*va, &finalizer, *action == Action::AddFinalizer);
                *va = vas.patch(&va.name_any(), &params, &Patch::Merge(patch)).await.map_err(va_err)?;
            }
            Action::AddPvFinalizer | Action::RemovePvFinalizer => {
                let Some(current) = pv.as_ref() else { return Ok(()) };
                let name = current.name_any();
                let patch = finalizer_patch(current, &finalizer, *action == Action::AddPvFinalizer);
                let updated = pvs
                    .patch(&name, &params, &Patch::Merge(patch))
                    .await
                    .map_err(|source| AttachError::PersistentVolume { name, source })?;
                *pv = Some(updated);
            }
            Action::PatchStatus { attached, attach_error, detach_error } => {
                let mut status = Map::new();
                if let Some(attached) = attached {
                    status.insert("attached".into(), json!(attached));
                }
                let now = Time(Timestamp::now());
                for (field, patch) in [("attachError", attach_error), ("detachError", detach_error)] {
                    match patch {
                        ErrorPatch::Keep => {}
                        ErrorPatch::Set(message) => {
                            status.insert(field.into(), json!({ "time": now, "message": message }));
                        }
                    }
                }
                self.patch_status(va, json!({ "status": status })).await?;
            }
            Action::RecordEvent { kind, reason, action, message } => {
                let event = Event {
                    type_: match kind {
                        EventKind::Warning => EventType::Warning,
                    },
                    reason: reason.clone(),
                    note: Some(message.clone()),
                    action: action.clone(),
                    secondary: None,
                };
                self.recorder.publish(&event, &va.object_ref(&())).await.map_err(va_err)?;
            }
            Action::Publish(_) | Action::MarkAttached | Action::Unpublish { .. } | Action::Requeue { .. } => {}
        }
        Ok(())
    }

    /// Remove our finalizer from a PV (the `RemovePvFinalizer` of `reconcile_pv`).
    pub(crate) async fn release_pv(&self, pv: &PersistentVolume) -> Result<(), AttachError> {
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let name = pv.name_any();
        let patch = finalizer_patch(pv, &self.identity.finalizer(), false);
        pvs.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|source| AttachError::PersistentVolume { name, source })?;
        Ok(())
    }

    async fn patch_status(&self, va: &mut VolumeAttachment, patch: Value) -> Result<(), AttachError> {
        let vas: Api<VolumeAttachment> = Api::all(self.client.clone());
        let name = va.name_any();
        *va = vas
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|source| AttachError::VolumeAttachment { name, source })?;
        Ok(())
    }
}

/// A merge patch adding or removing `finalizer`, guarded by the object's resourceVersion
/// so a concurrent change to the list is a conflict, not a lost finalizer.
fn finalizer_patch<K: Resource>(obj: &K, finalizer: &str, add: bool) -> Value {
    let mut list: Vec<String> = obj.meta().finalizers.clone().unwrap_or_default();
    list.retain(|f| f != finalizer);
    if add {
        list.push(finalizer.to_string());
    }
    json!({ "metadata": { "finalizers": list, "resourceVersion": obj.meta().resource_version } })
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Object builders shared by the decision tests and the fake API server tests.

    use super::*;
    use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolumeSpec};
    use k8s_openapi::api::storage::v1::{VolumeAttachmentSource, VolumeAttachmentSpec, VolumeAttachmentStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    pub(crate) const DRIVER: &str = "drivelet.io/local";
    pub(crate) const NODE: &str = "node-a";
    pub(crate) const FINALIZER: &str = "external-attacher/drivelet.io-local";

    pub(crate) fn identity() -> Identity {
        Identity { driver: DRIVER.to_string(), node: NODE.to_string() }
    }

    pub(crate) fn deleted() -> Option<Time> {
        Some(Time(Timestamp::from_second(1_700_000_000).expect("valid timestamp")))
    }

    pub(crate) fn va(name: &str, pv: &str) -> VolumeAttachment {
        VolumeAttachment {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                resource_version: Some("1".to_string()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: VolumeAttachmentSpec {
                attacher: DRIVER.to_string(),
                node_name: NODE.to_string(),
                source: VolumeAttachmentSource {
                    persistent_volume_name: Some(pv.to_string()),
                    ..Default::default()
                },
            },
            status: None,
        }
    }

    pub(crate) fn with_finalizer(mut va: VolumeAttachment) -> VolumeAttachment {
        va.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
        va
    }

    pub(crate) fn attached(mut va: VolumeAttachment) -> VolumeAttachment {
        va.status = Some(VolumeAttachmentStatus { attached: true, ..Default::default() });
        va
    }

    pub(crate) fn pv(name: &str, volume_id: &str) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                resource_version: Some("7".to_string()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                csi: Some(CSIPersistentVolumeSource {
                    driver: DRIVER.to_string(),
                    volume_handle: volume_id.to_string(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    pub(crate) fn pv_with_finalizer(mut pv: PersistentVolume) -> PersistentVolume {
        pv.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
        pv
    }

    pub(crate) fn context() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("devicePath".to_string(), "/dev/sdb3".to_string()),
            ("partitionGuid".to_string(), "6f1c0a3e-0000-4000-8000-000000000001".to_string()),
        ])
    }

    pub(crate) fn usable() -> VolumeState {
        VolumeState::Usable
    }

    pub(crate) fn publish(volume_id: &str) -> Action {
        Action::Publish(PublishSpec { volume_id: volume_id.to_string(), block: false, fs_type: String::new() })
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;
    use k8s_openapi::api::storage::v1::VolumeError;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn policy() -> RetryPolicy {
        RetryPolicy { base: S(1), cap: S(60), terminal: S(600) }
    }

    fn publish_ok() -> Vec<Action> {
        vec![publish("vol-1"), Action::MarkAttached]
    }

    fn attach_error(message: &str, after: Duration) -> Vec<Action> {
        vec![
            Action::PatchStatus {
                attached: Some(false),
                attach_error: ErrorPatch::Set(message.into()),
                detach_error: ErrorPatch::Keep,
            },
            Action::RecordEvent {
                kind: EventKind::Warning,
                reason: "AttachFailed".into(),
                action: "Attach".into(),
                message: message.into(),
            },
            Action::Requeue { after },
        ]
    }

    fn cat(parts: Vec<Vec<Action>>) -> Vec<Action> {
        parts.into_iter().flatten().collect()
    }

    #[test]
    fn reconcile_table_follows_the_external_attacher_rules() {
        let mut other_attacher = va("va", "pv-1");
        other_attacher.spec.attacher = "ebs.csi.aws.com".into();
        let mut other_node = va("va", "pv-1");
        other_node.spec.node_name = "node-b".into();
        let mut deleting_pv = pv_with_finalizer(pv("pv-1", "vol-1"));
        deleting_pv.metadata.deletion_timestamp = deleted();
        let mut deleting_va = with_finalizer(attached(va("va", "pv-1")));
        deleting_va.metadata.deletion_timestamp = deleted();
        let mut deleting_va_without_finalizer = va("va", "pv-1");
        deleting_va_without_finalizer.metadata.deletion_timestamp = deleted();
        let mut failed_before = with_finalizer(va("va", "pv-1"));
        failed_before.status = Some(k8s_openapi::api::storage::v1::VolumeAttachmentStatus {
            attached: false,
            attach_error: Some(VolumeError { message: Some("earlier".into()), ..Default::default() }),
            ..Default::default()
        });
        let mut no_csi_pv = pv("pv-1", "vol-1");
        no_csi_pv.spec.as_mut().expect("spec").csi = None;
        let mut no_source = va("va", "pv-1");
        no_source.spec.source.persistent_volume_name = None;

        let fin_va = with_finalizer(va("va", "pv-1"));
        let no_source_va = with_finalizer(no_source);
        let no_csi_fin_pv = pv_with_finalizer(no_csi_pv);
        let plain_pv = pv("pv-1", "vol-1");
        let fin_pv = pv_with_finalizer(pv("pv-1", "vol-1"));
        let plain_va = va("va", "pv-1");
        let done_va = with_finalizer(attached(va("va", "pv-1")));
        let unusable = VolumeState::Unusable { reason: "drive SN123 is failing (SMART)".into() };

        // (case, va, pv, other attachments, volume, failures, expected)
        let table: Vec<(&str, &VolumeAttachment, Option<&PersistentVolume>, usize, VolumeState, u32, Vec<Action>)> = vec![
            ("another driver's attachment is ignored", &other_attacher, Some(&plain_pv), 0, usable(), 0, vec![]),
            ("another node's attachment is ignored", &other_node, Some(&plain_pv), 0, usable(), 0, vec![]),
            (
                "a new attachment gets both finalizers, is published and marked attached",
                &plain_va,
                Some(&plain_pv),
                0,
                usable(),
                0,
                cat(vec![vec![Action::AddFinalizer, Action::AddPvFinalizer], publish_ok()]),
            ),
            (
                "finalizers already present are not added again",
                &fin_va,
                Some(&fin_pv),
                0,
                usable(),
                0,
                publish_ok(),
            ),
            ("an attachment whose PV is being deleted is skipped", &plain_va, Some(&deleting_pv), 0, usable(), 0, vec![]),
            (
                "a named PV not seen yet is waited for with backoff",
                &plain_va,
                None,
                0,
                usable(),
                2,
                vec![Action::Requeue { after: S(4) }],
            ),
            ("an attached attachment is left alone", &done_va, Some(&fin_pv), 0, usable(), 0, vec![]),
            (
                "an attached attachment still gets a missing PV finalizer",
                &done_va,
                Some(&plain_pv),
                0,
                unusable.clone(),
                0,
                vec![Action::AddPvFinalizer],
            ),
            (
                "an attach error from before is retried and cleared on success",
                &failed_before,
                Some(&fin_pv),
                0,
                usable(),
                3,
                publish_ok(),
            ),
            (
                "a volume the manager does not know is an attach error retried with backoff",
                &plain_va,
                Some(&plain_pv),
                0,
                VolumeState::Missing,
                3,
                cat(vec![
                    vec![Action::AddFinalizer, Action::AddPvFinalizer],
                    attach_error("volume vol-1 does not exist on node node-a", S(8)),
                ]),
            ),
            (
                "a failing drive is a terminal attach error with the long requeue",
                &fin_va,
                Some(&fin_pv),
                0,
                unusable.clone(),
                0,
                attach_error("volume vol-1 cannot be attached: drive SN123 is failing (SMART)", S(600)),
            ),
            (
                "a PV without a CSI source is a terminal attach error",
                &fin_va,
                Some(&no_csi_fin_pv),
                0,
                usable(),
                0,
                attach_error("PersistentVolume pv-1 has no CSI source", S(600)),
            ),
            (
                "an attachment naming no volume at all is a terminal attach error",
                &no_source_va,
                None,
                0,
                usable(),
                0,
                attach_error("VolumeAttachment names neither a PersistentVolume nor a CSI inline volume", S(600)),
            ),
            (
                "a deleted attachment is unpublished and loses its finalizer",
                &deleting_va,
                Some(&fin_pv),
                0,
                usable(),
                0,
                vec![Action::Unpublish { volume_id: "vol-1".into() }, Action::RemoveFinalizer],
            ),
            (
                "a deleted attachment of a volume the manager does not know just loses its finalizer",
                &deleting_va,
                Some(&fin_pv),
                0,
                VolumeState::Missing,
                0,
                vec![Action::RemoveFinalizer],
            ),
            (
                "a deleted attachment on a failing drive is still unpublished",
                &deleting_va,
                Some(&fin_pv),
                0,
                unusable.clone(),
                0,
                vec![Action::Unpublish { volume_id: "vol-1".into() }, Action::RemoveFinalizer],
            ),
            (
                "a deleted attachment whose PV is gone loses its finalizer without unpublish",
                &deleting_va,
                None,
                0,
                usable(),
                0,
                vec![Action::RemoveFinalizer],
            ),
            (
                "a deleted attachment of a deleted PV releases the PV when nothing else uses it",
                &deleting_va,
                Some(&deleting_pv),
                0,
                usable(),
                0,
                vec![Action::Unpublish { volume_id: "vol-1".into() }, Action::RemoveFinalizer, Action::RemovePvFinalizer],
            ),
            (
                "a deleted attachment keeps the PV finalizer while another attachment uses the PV",
                &deleting_va,
                Some(&deleting_pv),
                1,
                usable(),
                0,
                vec![Action::Unpublish { volume_id: "vol-1".into() }, Action::RemoveFinalizer],
            ),
            (
                "a deleted attachment without our finalizer only releases a deleted PV",
                &deleting_va_without_finalizer,
                Some(&deleting_pv),
                0,
                usable(),
                0,
                vec![Action::RemovePvFinalizer],
            ),
            (
                "a deleted attachment without our finalizer leaves a live PV alone",
                &deleting_va_without_finalizer,
                Some(&fin_pv),
                0,
                usable(),
                0,
                vec![],
            ),
        ];
        for (case, va, pv, others, volume, failures, want) in table {
            let obs = Observed { va, pv, other_attachments: others, volume: &volume, failures };
            assert_eq!(reconcile(&obs, &identity(), &policy()), want, "{case}");
        }
    }

    #[test]
    fn the_volume_managers_answer_decides_missing_unusable_or_retry_by_variant() {
        use crate::actors::volumes::health::DriveUseState;
        type E = crate::actors::volumes::VolumeError;
        let v = || "v1".to_string();
        let d = || "d1".to_string();
        // (answer, what the attacher makes of it: the volume state, or None for a retry with backoff)
        let table: Vec<(Result<(), E>, Option<VolumeState>)> = vec![
            (Ok(()), Some(VolumeState::Usable)),
            (Err(E::NotFound { volume_id: v() }), Some(VolumeState::Missing)),
            (
                Err(E::DriveFailing { volume_id: v(), drive_id: d(), health: "12 reallocated sectors".into() }),
                Some(VolumeState::Unusable {
                    reason: "lives on drive d1 which is failing (12 reallocated sectors); it takes no new attachments: move the data to another volume".into(),
                }),
            ),
            (
                Err(E::DriveReleasing { volume_id: v(), drive_id: d(), state: DriveUseState::Released, reason: "asked".into() }),
                Some(VolumeState::Unusable {
                    reason: "lives on drive d1 which is released (asked); it takes no new attachments: move the data to another volume".into(),
                }),
            ),
            (
                Err(E::DriveMissing { volume_id: v(), drive_id: d() }),
                Some(VolumeState::Unusable { reason: "lives on drive d1 which is missing from this node; put the drive back".into() }),
            ),
            (
                Err(E::AttachedElsewhere { volume_id: v(), node: "n2".into() }),
                Some(VolumeState::Unusable { reason: "is already attached to node n2; a local volume serves one node".into() }),
            ),
            (
                Err(E::WrongAccessType { volume_id: v(), block: false, call: "published" }),
                Some(VolumeState::Unusable { reason: "was created for filesystem access; it cannot be published for block access".into() }),
            ),
            (Err(E::Busy { volume_id: v() }), None),
            (Err(E::NotReady), None),
        ];
        for (answer, want) in table {
            let shown = format!("{answer:?}");
            match (volume_state(answer), want) {
                (Ok(got), Some(want)) => assert_eq!(got, want, "{shown}"),
                (Err(e), None) => assert_eq!(e.kind(), RefusalKind::Transient, "{shown}"),
                (got, want) => panic!("{shown}: got {got:?}, want {want:?}"),
            }
        }
        let gone = VolumeCallError::Unavailable("the volume manager did not answer: Mailbox has closed".into());
        assert_eq!(gone.kind(), RefusalKind::Transient);
        assert_eq!(gone.to_string(), "the volume manager did not answer: Mailbox has closed");
    }

    #[test]
    fn publish_spec_takes_the_access_type_from_the_pv_or_the_inline_spec() {
        let va1 = va("va", "pv-1");
        assert_eq!(publish_spec(&va1, None), None, "a named PV not at hand gives nothing");
        let mut block = pv("pv-1", "vol-1");
        let spec = block.spec.as_mut().expect("spec");
        spec.volume_mode = Some("Block".into());
        assert_eq!(
            publish_spec(&va1, Some(&block)),
            Some(PublishSpec { volume_id: "vol-1".into(), block: true, fs_type: String::new() })
        );
        let mut xfs = pv("pv-1", "vol-1");
        let spec = xfs.spec.as_mut().expect("spec");
        spec.volume_mode = Some("Filesystem".into());
        spec.csi.as_mut().expect("csi").fs_type = Some("xfs".into());
        assert_eq!(
            publish_spec(&va1, Some(&xfs)),
            Some(PublishSpec { volume_id: "vol-1".into(), block: false, fs_type: "xfs".into() })
        );
        let mut inline = va("va", "pv-1");
        inline.spec.source.persistent_volume_name = None;
        inline.spec.source.inline_volume_spec = pv("x", "vol-9").spec;
        assert_eq!(
            publish_spec(&inline, None),
            Some(PublishSpec { volume_id: "vol-9".into(), block: false, fs_type: String::new() })
        );
    }

    #[test]
    fn pv_finalizer_is_removed_only_from_a_deleted_pv_no_attachment_names() {
        let mut deleting = pv_with_finalizer(pv("pv-1", "vol-1"));
        deleting.metadata.deletion_timestamp = deleted();
        let mut deleting_without_ours = pv("pv-1", "vol-1");
        deleting_without_ours.metadata.deletion_timestamp = deleted();
        let table = [
            ("deleted and unused", &deleting, 0, vec![Action::RemovePvFinalizer]),
            ("deleted but still attached somewhere", &deleting, 1, vec![]),
            ("live and unused", &pv_with_finalizer(pv("pv-1", "vol-1")), 0, vec![]),
            ("deleted without our finalizer", &deleting_without_ours, 0, vec![]),
        ];
        for (case, pv, attachments, want) in table {
            assert_eq!(reconcile_pv(pv, &identity(), attachments), want, "{case}");
        }
    }

    #[test]
    fn failed_detach_keeps_attached_and_backs_off() {
        assert_eq!(
            detach_failed("volume vol-1 busy".into(), 2, &policy()),
            vec![
                Action::PatchStatus {
                    attached: None,
                    attach_error: ErrorPatch::Keep,
                    detach_error: ErrorPatch::Set("volume vol-1 busy".into()),
                },
                Action::RecordEvent {
                    kind: EventKind::Warning,
                    reason: "DetachFailed".into(),
                    action: "Detach".into(),
                    message: "volume vol-1 busy".into(),
                },
                Action::Requeue { after: S(4) },
            ]
        );
    }

    #[test]
    fn finalizer_patch_keeps_other_finalizers_and_guards_the_resource_version() {
        let mut obj = va("va", "pv-1");
        obj.metadata.finalizers = Some(vec!["kubernetes.io/other".into()]);
        assert_eq!(
            finalizer_patch(&obj, FINALIZER, true),
            json!({"metadata": {"finalizers": ["kubernetes.io/other", FINALIZER], "resourceVersion": "1"}})
        );
        obj.metadata.finalizers = Some(vec![FINALIZER.into(), "kubernetes.io/other".into()]);
        assert_eq!(
            finalizer_patch(&obj, FINALIZER, false),
            json!({"metadata": {"finalizers": ["kubernetes.io/other"], "resourceVersion": "1"}})
        );
    }
}
