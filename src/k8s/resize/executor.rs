//! The resize executor: carries one planned [`Expansion`] out against the API server
//! (claim status patches, the PV's capacity, Events) and the volume side
//! ([`ResizeBackend::expand`]).
//!
//! Rules:
//! - In external-resizer's order: the claim is marked in progress and a `Resizing` Event
//!   recorded before the volume grows; success writes the PV's capacity (when it
//!   changed), then either the node-pending status (a filesystem to grow on the node) or
//!   the finished one, each with its Event; failure records a `VolumeResizeFailed`
//!   Warning, writes the failed status and asks to be run again after
//!   [`retry_after`](super::retry_after).
//! - A deferred growth (the volume in use, growing only by a move) records one Normal
//!   `VolumeResizeDeferred` Event per claim and size, and no `Resizing` Event at its
//!   retries; nothing is written to the claim's status, and it is run again after the
//!   backoff. The claim carries the size it was told of in the annotation [`DEFERRED`],
//!   so a restarted drivelet does not tell it again; the annotation goes once the growth
//!   goes on (done, or failed otherwise).
//! - Every object written is handed back ([`Ran`]), so a rerun before the watch catches
//!   up acts on the newest objects. API errors are [`ResizeError`]s naming the object.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use serde_json::Value;
use tracing::{info, warn};

use super::backend::ResizeBackend;
use super::{Deferrals, failed_patch, finished_patch, in_progress_patch, node_pending_patch, pv_capacity_patch, quantity_of, retry_after, Expansion, Failure};
use crate::config::human_bytes;
use crate::k8s::shell::RetryPolicy;
use crate::k8s::identity::Identity;
use crate::k8s::workqueue::Outcome;

/// The annotation a claim carries while its growth waits until no pod uses its volume:
/// the size in bytes it was told of ([`Deferrals`] is the same, for this process only).
pub(crate) const DEFERRED: &str = "drivelet.io/resize-deferred";

/// The size a claim's [`DEFERRED`] annotation says it was told of.
fn deferred_size(pvc: &PersistentVolumeClaim) -> Option<u64> {
    pvc.annotations().get(DEFERRED)?.parse().ok()
}

/// Errors talking to the API server during a resize.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ResizeError {
    /// A status patch of the claim failed.
    #[error("updating the status of PersistentVolumeClaim {claim}: {source}")]
    Claim {
        /// `namespace/name`.
        claim: String,
        /// The API error.
        source: kube::Error,
    },
    /// Writing the claim's [`DEFERRED`] annotation failed.
    #[error("annotating PersistentVolumeClaim {claim}: {source}")]
    Annotation {
        /// `namespace/name`.
        claim: String,
        /// The API error.
        source: kube::Error,
    },
    /// The capacity patch of the PV failed.
    #[error("updating the capacity of PersistentVolume {name}: {source}")]
    Volume {
        /// The PV.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// Recording an Event failed.
    #[error("recording an Event on PersistentVolumeClaim {claim}: {source}")]
    Event {
        /// `namespace/name`.
        claim: String,
        /// The API error.
        source: kube::Error,
    },
}

/// What a run of the executor ended with.
#[derive(Debug)]
pub(crate) struct Ran {
    /// Done, or look again after a delay.
    pub outcome: Outcome,
    /// The expansion failed with a final error.
    pub final_error: bool,
    /// The size was infeasible (the claim joins the slow set).
    pub infeasible: bool,
    /// The newest claim and PV written, to keep.
    pub pvc: PersistentVolumeClaim,
    /// The newest PV.
    pub pv: PersistentVolume,
}

/// Carries out an expansion against the API server and the volume manager.
#[derive(Clone)]
pub(crate) struct Executor {
    client: Client,
    recorder: Recorder,
    policy: RetryPolicy,
    /// The claims told their growth waits for their volume to be unused.
    deferrals: std::sync::Arc<std::sync::Mutex<Deferrals>>,
}

pub(crate) fn key_of(pvc: &PersistentVolumeClaim) -> String {
    format!("{}/{}", pvc.namespace().unwrap_or_default(), pvc.name_any())
}

fn now() -> String {
    serde_json::to_value(Time(Timestamp::now())).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

impl Executor {
    /// An executor writing as drivelet, Events reported by this node's instance.
    pub(crate) fn new(client: Client, identity: &Identity, policy: RetryPolicy) -> Self {
        let recorder = Recorder::new(client.clone(), identity.reporter());
        Self { client, recorder, policy, deferrals: Default::default() }
    }

    /// Grows `pvc`'s volume as `e` says (see the rules of [`super`]); `failures` are the
    /// claim's failed runs so far.
    pub(crate) async fn run<B: ResizeBackend>(
        &self,
        pvc: PersistentVolumeClaim,
        pv: PersistentVolume,
        e: &Expansion,
        backend: &B,
        failures: u32,
    ) -> Result<Ran, ResizeError> {
        let pv_name = pv.name_any();
        let mut pvc = self.patch_claim(&pvc, in_progress_patch(&pvc, e, &now())).await?;
        let size = human_bytes(e.bytes);
        let key = key_of(&pvc);
        // A claim told its growth waits (by this process, or by one before a restart:
        // its annotation) hears nothing more at each retry.
        let waiting = self.deferrals().told(&key, e.bytes) || deferred_size(&pvc) == Some(e.bytes);
        if !waiting {
            let note = format!("drivelet is growing volume {} of PersistentVolume {pv_name} to {size}", e.volume_id);
            self.event(&pvc, EventType::Normal, "Resizing", note).await?;
        }
        let res = backend.expand(&e.volume_id, e.bytes).await;
        if !matches!(res, Err((super::Failure::Deferred, _))) {
            self.deferrals().forget(&key);
            if deferred_size(&pvc).is_some() {
                pvc = self.mark_deferred(&pvc, None).await?;
            }
        }
        match res {
            Err((super::Failure::Deferred, reason)) => {
                if self.deferrals().tell(&key, e.bytes) && deferred_size(&pvc) != Some(e.bytes) {
                    info!(pvc.name = %key, pv.name = %pv_name, volume.id = %e.volume_id, error = %reason, "volume growth deferred until no pod uses it");
                    let note = format!("volume {} of PersistentVolume {pv_name} grows to {size} once no pod uses it: {reason}", e.volume_id);
                    self.event(&pvc, EventType::Normal, "VolumeResizeDeferred", note).await?;
                    pvc = self.mark_deferred(&pvc, Some(e.bytes)).await?;
                }
                let outcome = Outcome::Retry(retry_after(super::Failure::Deferred, failures, &self.policy));
                Ok(Ran { outcome, final_error: false, infeasible: false, pvc, pv })
            }
            Ok((bytes, node_step)) => {
                let mut pv = pv;
                let current = pv.spec.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get(super::STORAGE)).cloned();
                let capacity = k8s_openapi::apimachinery::pkg::api::resource::Quantity(quantity_of(bytes));
                if current.as_ref() != Some(&capacity) {
                    let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
                    pv = pvs
                        .patch(&pv_name, &PatchParams::default(), &Patch::Merge(pv_capacity_patch(bytes)))
                        .await
                        .map_err(|source| ResizeError::Volume { name: pv_name.clone(), source })?;
                }
                info!(pvc.name = %key_of(&pvc), pv.name = %pv_name, volume.id = %e.volume_id, volume.size = bytes, "volume grown for its claim");
                if node_step {
                    pvc = self.patch_claim(&pvc, node_pending_patch(&pvc, &now())).await?;
                    let note = "Require file system resize of volume on node".to_string();
                    self.event(&pvc, EventType::Normal, "FileSystemResizeRequired", note).await?;
                } else {
                    pvc = self.patch_claim(&pvc, finished_patch(&pvc, &capacity)).await?;
                    self.event(&pvc, EventType::Normal, "VolumeResizeSuccessful", "Resize volume succeeded".into()).await?;
                }
                Ok(Ran { outcome: Outcome::Done, final_error: false, infeasible: false, pvc, pv })
            }
            Err((failure, reason)) => {
                let message = format!("cannot grow volume {} of PersistentVolume {pv_name} to {size}: {reason}", e.volume_id);
                warn!(pvc.name = %key_of(&pvc), pv.name = %pv_name, volume.id = %e.volume_id, ?failure, error = %reason, "volume expansion failed");
                self.event(&pvc, EventType::Warning, "VolumeResizeFailed", message.clone()).await?;
                if let Some(patch) = failed_patch(&pvc, failure, &message, &now()) {
                    pvc = self.patch_claim(&pvc, patch).await?;
                }
                let outcome = Outcome::Retry(retry_after(failure, failures, &self.policy));
                Ok(Ran {
                    outcome,
                    final_error: failure != Failure::Transient,
                    infeasible: failure == Failure::Infeasible,
                    pvc,
                    pv,
                })
            }
        }
    }

    fn deferrals(&self) -> std::sync::MutexGuard<'_, Deferrals> {
        self.deferrals.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn patch_claim(&self, pvc: &PersistentVolumeClaim, patch: Value) -> Result<PersistentVolumeClaim, ResizeError> {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &pvc.namespace().unwrap_or_default());
        api.patch_status(&pvc.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|source| ResizeError::Claim { claim: key_of(pvc), source })
    }

    /// Sets (`Some(bytes)`) or removes the claim's [`DEFERRED`] annotation.
    async fn mark_deferred(&self, pvc: &PersistentVolumeClaim, bytes: Option<u64>) -> Result<PersistentVolumeClaim, ResizeError> {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &pvc.namespace().unwrap_or_default());
        let value = bytes.map_or(Value::Null, |b| Value::String(b.to_string()));
        let patch = serde_json::json!({"metadata": {"annotations": {DEFERRED: value}}});
        api.patch(&pvc.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|source| ResizeError::Annotation { claim: key_of(pvc), source })
    }

    async fn event(&self, pvc: &PersistentVolumeClaim, type_: EventType, reason: &str, note: String) -> Result<(), ResizeError> {
        let event = KubeEvent { type_, reason: reason.to_string(), note: Some(note), action: "Resize".to_string(), secondary: None };
        self.recorder.publish(&event, &pvc.object_ref(&())).await.map_err(|source| ResizeError::Event { claim: key_of(pvc), source })
    }
}

