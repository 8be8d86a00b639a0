//! The attach executor: carries the actions of [`reconcile`](super::reconcile) and
//! [`reconcile_pv`](super::reconcile_pv) out against the API server and, for publish and
//! unpublish, the volume side ([`VolumeOps`]).
//!
//! Rules:
//! - `Executor::apply` performs the actions in order and stops at the first failure; a
//!   failed publish or unpublish is turned into the failure actions of
//!   [`attach_failed`](super::attach_failed) / [`detach_failed`](super::detach_failed).
//! - Finalizer patches carry the object's resourceVersion, so a concurrent change to
//!   the list is a conflict, not a lost finalizer.
//! - Clocks (error times) are read here, never by the decisions.
//! - API errors are [`AttachError`]s naming the object.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use serde_json::{json, Map, Value};

use super::backend::VolumeOps;
use super::{attach_failed, detach_failed, Action, ErrorPatch, EventKind, RefusalKind};
use crate::k8s::shell::RetryPolicy;
use crate::k8s::identity::Identity;

#[cfg(test)]
#[path = "executor_tests.rs"]
mod executor_tests;

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

impl AttachError {
    /// Whether the API server refused the write as a conflict (409): the object changed
    /// since it was read.
    pub(crate) fn is_conflict(&self) -> bool {
        let (AttachError::VolumeAttachment { source, .. } | AttachError::PersistentVolume { source, .. }) = self;
        matches!(source, kube::Error::Api(s) if s.code == 409)
    }
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
        match pvs.patch(&name, &PatchParams::default(), &Patch::Merge(patch)).await {
            // Gone already (the finalizer it waited for was the last): nothing to release.
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(source) => Err(AttachError::PersistentVolume { name, source }),
            Ok(_) => Ok(()),
        }
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
pub(crate) fn finalizer_patch<K: Resource>(obj: &K, finalizer: &str, add: bool) -> Value {
    let mut list: Vec<String> = obj.meta().finalizers.clone().unwrap_or_default();
    list.retain(|f| f != finalizer);
    if add {
        list.push(finalizer.to_string());
    }
    json!({ "metadata": { "finalizers": list, "resourceVersion": obj.meta().resource_version } })
}
