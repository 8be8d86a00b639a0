//! The volume side of resizing: [`ResizeBackend`], what the resize controller asks of
//! the volume manager, implemented for the VolumeManager handle of a running agent
//! ([`ManagerBackend`], asked by message: `GetVolume`, `ExpandVolume`).
//!
//! Rules:
//! - How a refusal counts for the claim's status is decided from the volume manager's
//!   error variant ([`failure_of`]), never from its words.

use std::future::Future;

use super::Failure;
use crate::actors::volumes::model::CapacityRange;
use crate::actors::volumes::{ExpandVolume, GetVolume, VolumeError};
use crate::k8s::shell::Ready;
use crate::k8s::KubeError;
pub(crate) use crate::k8s::volume_manager::ManagerBackend;

/// The volume side of resizing; nothing runs before it is [`Ready`].
pub(crate) trait ResizeBackend: Ready + Clone + Unpin + 'static {
    /// Whether the volume manager knows the volume; `Err` when it cannot tell now.
    fn known(&self, volume_id: &str) -> impl Future<Output = Result<bool, KubeError>> + Send;
    /// ControllerExpandVolume to at least `bytes`: the size now and whether the node must
    /// grow a filesystem, or how it failed and why.
    fn expand(&self, volume_id: &str, bytes: u64) -> impl Future<Output = Result<(u64, bool), (Failure, KubeError)>> + Send;
}

/// How an expansion refusal counts for the claim's status (see the module rules of
/// [`super`]): the codes external-resizer takes as infeasible, final or transient.
pub(crate) fn failure_of(e: &VolumeError) -> Failure {
    match e {
        VolumeError::OutOfRange { .. } | VolumeError::NotFound { .. } | VolumeError::InvalidArgument { .. } => Failure::Infeasible,
        VolumeError::ResourceExhausted { .. } | VolumeError::Busy { .. } | VolumeError::NotReady => Failure::Transient,
        VolumeError::GrowsWhenUnused { .. } => Failure::Deferred,
        _ => Failure::Final,
    }
}

impl ResizeBackend for ManagerBackend {
    async fn known(&self, volume_id: &str) -> Result<bool, KubeError> {
        match self.volumes().send(GetVolume { volume_id: volume_id.to_string() }).await {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(VolumeError::NotFound { .. })) => Ok(false),
            Ok(Err(e)) => Err(KubeError::volume(volume_id)(e)),
            Err(e) => Err(KubeError::unanswered(volume_id)(e)),
        }
    }

    async fn expand(&self, volume_id: &str, bytes: u64) -> Result<(u64, bool), (Failure, KubeError)> {
        let m = ExpandVolume { volume_id: volume_id.to_string(), range: CapacityRange { required: bytes, limit: 0 } };
        match self.volumes().send(m).await {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(e)) => Err((failure_of(&e), KubeError::volume(volume_id)(e))),
            Err(e) => Err((Failure::Transient, KubeError::unanswered(volume_id)(e))),
        }
    }
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_counts_as_external_resizer_would_and_a_growth_waiting_for_an_unused_volume_is_deferred() {
        let cases = [
            (VolumeError::OutOfRange { reason: "the drive ends there".into() }, Failure::Infeasible),
            (VolumeError::NotFound { volume_id: "v".into() }, Failure::Infeasible),
            (VolumeError::ResourceExhausted { reason: "being cleaned".into() }, Failure::Transient),
            (VolumeError::Busy { volume_id: "v".into() }, Failure::Transient),
            (VolumeError::GrowsWhenUnused { volume_id: "v".into(), size: 1, drive_id: "d2".into(), why: "staged".into() }, Failure::Deferred),
            (VolumeError::DriveAbsent { volume_id: "v".into(), drive_id: "d".into() }, Failure::Final),
        ];
        for (e, want) in cases {
            assert_eq!(failure_of(&e), want, "{e}");
        }
    }
}
