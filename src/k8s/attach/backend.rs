//! The volume side of attaching: [`AttachBackend`], what the attach controller asks of
//! the volume manager, implemented for the VolumeManager handle of a running agent
//! ([`ManagerBackend`], asked by message: the attacher's only link to the core actors).
//!
//! Rules:
//! - A refusal is carried as the volume manager's error variant
//!   ([`VolumeCallError::Volume`]) so [`kind_of`](super::kind_of) decides on the variant;
//!   a volume manager that does not answer (restarting) is
//!   [`VolumeCallError::Unavailable`], retried with backoff.

use std::collections::BTreeMap;
use std::future::Future;

use super::{PublishSpec, VolumeCallError, VolumeState};
use crate::actors::volumes::{AttachPreview, AttachVolume, DetachVolume};
use crate::k8s::shell::Ready;
pub(crate) use crate::k8s::volume_manager::ManagerBackend;

/// The in-process CSI controller calls the executor makes; [`ManagerBackend`]
/// implements them by asking the VolumeManager.
pub(crate) trait VolumeOps {
    /// ControllerPublishVolume of `spec` to `node`, answering the publish context.
    fn publish(&self, spec: &PublishSpec, node: &str) -> impl Future<Output = Result<BTreeMap<String, String>, VolumeCallError>> + Send;
    /// ControllerUnpublishVolume of `volume_id` from `node`.
    fn unpublish(&self, volume_id: &str, node: &str) -> impl Future<Output = Result<(), VolumeCallError>> + Send;
}

/// The volume side of attaching: what the volume manager says about a volume, and the
/// in-process ControllerPublish / ControllerUnpublish; nothing runs before it is
/// [`Ready`].
pub(crate) trait AttachBackend: VolumeOps + Ready + Clone + Unpin + 'static {
    /// Whether publishing `spec` to `node` would be accepted now; `Err` when the volume
    /// side cannot tell yet (starting, busy), which is retried with backoff.
    fn volume_state(&self, spec: &PublishSpec, node: &str) -> impl Future<Output = Result<VolumeState, VolumeCallError>> + Send;
}

fn attach_message(spec: &PublishSpec, node: &str) -> AttachVolume {
    AttachVolume {
        volume_id: spec.volume_id.clone(),
        node_id: node.to_string(),
        block: spec.block,
        fs_type: spec.fs_type.clone(),
    }
}

fn unanswered(e: actix::MailboxError) -> VolumeCallError {
    VolumeCallError::Unavailable(format!("the volume manager did not answer: {e}"))
}

impl VolumeOps for ManagerBackend {
    async fn publish(&self, spec: &PublishSpec, node: &str) -> Result<BTreeMap<String, String>, VolumeCallError> {
        let context = self.volumes().send(attach_message(spec, node)).await.map_err(unanswered)??;
        Ok(context.to_map())
    }

    async fn unpublish(&self, volume_id: &str, node: &str) -> Result<(), VolumeCallError> {
        let m = DetachVolume { volume_id: volume_id.to_string(), node_id: Some(node.to_string()) };
        Ok(self.volumes().send(m).await.map_err(unanswered)??)
    }
}

impl AttachBackend for ManagerBackend {
    async fn volume_state(&self, spec: &PublishSpec, node: &str) -> Result<VolumeState, VolumeCallError> {
        super::volume_state(self.volumes().send(AttachPreview(attach_message(spec, node))).await.map_err(unanswered)?)
    }
}
