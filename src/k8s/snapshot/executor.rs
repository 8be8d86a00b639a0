//! The snapshot executor: carries one planned step ([`Plan`]) out against the API server
//! (the content's metadata and status, Events) and the volume side ([`SnapshotBackend`]).
//!
//! Rules:
//! - In the sidecar's order: [`BEING_CREATED`](super::BEING_CREATED) and the node label
//!   before CreateSnapshot; after it the status, then the annotation removed (kept when
//!   the answer may not be final); a deletion deletes the snapshot, clears the status,
//!   then removes the finalizer.
//! - Events go where the user looks: on the VolumeSnapshot the content is bound to (on
//!   the content itself when it is bound to none). A snapshot made ready here gets a
//!   Normal `SnapshotTaken` naming the node, its size and the freeze stall; an error a
//!   Warning (`SnapshotCreationFailed`, `SnapshotDeleteError`) with the same words as
//!   `status.error`, once per distinct message.
//! - A busy volume or snapshot (another call holds it) is retried after the base delay
//!   and recorded nowhere; every other failure is retried with backoff.
//! - Every content written is handed back ([`Ran`]), so a rerun before the watch catches
//!   up acts on the newest one. API errors are [`ApiError`]s naming the content.
//! - Class parameters (which may name secrets) are never logged.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use serde_json::Value;
use tracing::{info, warn};

use super::backend::{Failure, SnapshotBackend, SnapshotInfo};
use super::objects::VolumeSnapshotContent;
use super::{cleared_patch, creating_patch, error_patch, finalizer_patch, is_ready, ready_patch, settled_patch, taken_note, Creation, Plan};
use crate::k8s::shell::RetryPolicy;
use crate::k8s::identity::Identity;
use crate::k8s::workqueue::Outcome;

/// Errors talking to the API server about a content.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    /// A metadata patch of the content failed.
    #[error("updating VolumeSnapshotContent {content}: {source}")]
    Content {
        /// The content.
        content: String,
        /// The API error.
        source: kube::Error,
    },
    /// A status patch of the content failed.
    #[error("updating the status of VolumeSnapshotContent {content}: {source}")]
    Status {
        /// The content.
        content: String,
        /// The API error.
        source: kube::Error,
    },
    /// Recording an Event failed.
    #[error("recording an Event about VolumeSnapshotContent {content}: {source}")]
    Event {
        /// The content.
        content: String,
        /// The API error.
        source: kube::Error,
    },
}

/// What a run of the executor ended with.
#[derive(Debug)]
pub(crate) struct Ran {
    /// Done, or look again after a delay.
    pub outcome: Outcome,
    /// The newest content written (or the one run on).
    pub content: VolumeSnapshotContent,
}

/// Carries out a planned step against the API server and the volume manager.
#[derive(Clone)]
pub(crate) struct Executor {
    client: Client,
    recorder: Recorder,
    identity: Identity,
    policy: RetryPolicy,
}

fn now() -> Time {
    Time(Timestamp::now())
}

/// Where an Event about `c` goes: its VolumeSnapshot when bound, else the content.
pub(crate) fn event_target(c: &VolumeSnapshotContent) -> ObjectReference {
    let r = &c.spec.volume_snapshot_ref;
    match (&r.namespace, &r.name, &r.uid) {
        (Some(ns), Some(name), Some(uid)) if !uid.is_empty() => ObjectReference {
            api_version: Some("snapshot.storage.k8s.io/v1".into()),
            kind: Some("VolumeSnapshot".into()),
            namespace: Some(ns.clone()),
            name: Some(name.clone()),
            uid: Some(uid.clone()),
            ..Default::default()
        },
        _ => c.object_ref(&()),
    }
}

impl Executor {
    /// An executor writing as drivelet, Events reported by this node's instance.
    pub(crate) fn new(client: Client, identity: &Identity, policy: RetryPolicy) -> Self {
        let recorder = Recorder::new(client.clone(), identity.reporter());
        Self { client, recorder, identity: identity.clone(), policy }
    }

    /// Carries `plan` out for `c` (see the module rules); `failures` are the content's
    /// failed runs so far.
    pub(crate) async fn run<B: SnapshotBackend>(&self, c: VolumeSnapshotContent, plan: Plan, backend: &B, failures: u32) -> Result<Ran, ApiError> {
        let retry = Outcome::Retry(self.policy.backoff(failures));
        match plan {
            Plan::Nothing(_) => Ok(Ran { outcome: Outcome::Done, content: c }),
            Plan::Tidy => {
                let c = self.patch_meta(c, settled_patch).await?;
                Ok(Ran { outcome: Outcome::Done, content: c })
            }
            Plan::RemoveFinalizer => {
                let c = self.remove_finalizer(c).await?;
                Ok(Ran { outcome: Outcome::Done, content: c })
            }
            Plan::Fail(e) => {
                let c = self.record_error(c, "SnapshotCreationFailed", &e.to_string()).await?;
                Ok(Ran { outcome: retry, content: c })
            }
            Plan::Refresh(s) => {
                let c = self.patch_meta(c, settled_patch).await?;
                let c = self.record_ready(c, &s).await?;
                let outcome = if s.ready { Outcome::Done } else { retry };
                Ok(Ran { outcome, content: c })
            }
            Plan::Create(creation) => self.create(c, &creation, backend, failures).await,
            Plan::Delete { snapshot_id } => {
                if let Err((failure, e)) = backend.delete(&snapshot_id).await {
                    let name = c.name_any();
                    warn!(snapshot.content = %name, snapshot.id = %snapshot_id, ?failure, error = %e, "cannot delete the snapshot");
                    if failure != Failure::Busy {
                        let message = format!("cannot delete snapshot {snapshot_id}: {e}");
                        self.event(&c, EventType::Warning, "SnapshotDeleteError", message).await?;
                    }
                    return Ok(Ran { outcome: self.retry_of(failure, failures), content: c });
                }
                info!(snapshot.content = %c.name_any(), snapshot.id = %snapshot_id, "snapshot deleted");
                let c = self.patch_status(c, cleared_patch()).await?;
                let c = self.remove_finalizer(c).await?;
                Ok(Ran { outcome: Outcome::Done, content: c })
            }
        }
    }

    fn retry_of(&self, failure: Failure, failures: u32) -> Outcome {
        match failure {
            Failure::Busy => Outcome::Retry(self.policy.base),
            _ => Outcome::Retry(self.policy.backoff(failures)),
        }
    }

    async fn create<B: SnapshotBackend>(&self, c: VolumeSnapshotContent, k: &Creation, backend: &B, failures: u32) -> Result<Ran, ApiError> {
        let node = self.identity.node.clone();
        let c = self.patch_meta(c, creating_patch).await?;
        let was_ready = is_ready(&c);
        match backend.create(&k.name, &k.source_volume_id, &k.parameters).await {
            Ok(s) => {
                let c = self.record_ready(c, &s).await?;
                let c = self.patch_meta(c, settled_patch).await?;
                if s.ready && !was_ready {
                    info!(snapshot.content = %c.name_any(), snapshot.id = %s.id, volume.id = %s.source_volume_id,
                        snapshot.size = s.restore_size, snapshot.freeze_ms = s.freeze_millis, "snapshot taken");
                    self.event(&c, EventType::Normal, "SnapshotTaken", taken_note(&s, &node)).await?;
                }
                let outcome = if s.ready { Outcome::Done } else { Outcome::Retry(self.policy.base) };
                Ok(Ran { outcome, content: c })
            }
            Err((failure, e)) => {
                warn!(snapshot.content = %c.name_any(), snapshot.name = %k.name, volume.id = %k.source_volume_id, ?failure, error = %e,
                    "cannot take the snapshot");
                if failure == Failure::Busy {
                    return Ok(Ran { outcome: self.retry_of(failure, failures), content: c });
                }
                let c = if failure == Failure::Final { self.patch_meta(c, settled_patch).await? } else { c };
                let message = format!("cannot take snapshot {} of volume {}: {e}", k.name, k.source_volume_id);
                let c = self.record_error(c, "SnapshotCreationFailed", &message).await?;
                Ok(Ran { outcome: self.retry_of(failure, failures), content: c })
            }
        }
    }

    /// `status.error` and a Warning, once per distinct message.
    async fn record_error(&self, c: VolumeSnapshotContent, reason: &str, message: &str) -> Result<VolumeSnapshotContent, ApiError> {
        let Some(patch) = error_patch(&c, message, &now()) else { return Ok(c) };
        warn!(snapshot.content = %c.name_any(), error = %message, "snapshot error recorded");
        let patched = self.patch_status(c.clone(), patch).await;
        // The Event is recorded even if the status could not be, so the user sees why.
        self.event(&c, EventType::Warning, reason, message.to_string()).await?;
        patched
    }

    async fn record_ready(&self, c: VolumeSnapshotContent, s: &SnapshotInfo) -> Result<VolumeSnapshotContent, ApiError> {
        match ready_patch(&c, s) {
            Some(patch) => self.patch_status(c, patch).await,
            None => Ok(c),
        }
    }

    async fn remove_finalizer(&self, c: VolumeSnapshotContent) -> Result<VolumeSnapshotContent, ApiError> {
        if !c.metadata.finalizers.iter().flatten().any(|f| f == super::CONTENT_FINALIZER) {
            return Ok(c);
        }
        let name = c.name_any();
        let c = self.patch(&name, finalizer_patch(&c), false).await?;
        info!(snapshot.content = %name, "snapshot finalizer removed");
        Ok(c)
    }

    async fn patch_meta(
        &self,
        c: VolumeSnapshotContent,
        build: impl FnOnce(&VolumeSnapshotContent, &str) -> Option<Value>,
    ) -> Result<VolumeSnapshotContent, ApiError> {
        match build(&c, &self.identity.node) {
            Some(patch) => self.patch(&c.name_any(), patch, false).await,
            None => Ok(c),
        }
    }

    async fn patch_status(&self, c: VolumeSnapshotContent, patch: Value) -> Result<VolumeSnapshotContent, ApiError> {
        self.patch(&c.name_any(), patch, true).await
    }

    async fn patch(&self, name: &str, patch: Value, status: bool) -> Result<VolumeSnapshotContent, ApiError> {
        let api: Api<VolumeSnapshotContent> = Api::all(self.client.clone());
        let (pp, patch) = (PatchParams::default(), Patch::Merge(patch));
        if status {
            api.patch_status(name, &pp, &patch).await.map_err(|source| ApiError::Status { content: name.to_string(), source })
        } else {
            api.patch(name, &pp, &patch).await.map_err(|source| ApiError::Content { content: name.to_string(), source })
        }
    }

    async fn event(&self, c: &VolumeSnapshotContent, type_: EventType, reason: &str, note: String) -> Result<(), ApiError> {
        let event = KubeEvent { type_, reason: reason.to_string(), note: Some(note), action: "Snapshot".to_string(), secondary: None };
        self.recorder.publish(&event, &event_target(c)).await.map_err(|source| ApiError::Event { content: c.name_any(), source })
    }
}
