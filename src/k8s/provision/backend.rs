//! The volume side of provisioning: [`ProvisionBackend`], what the provisioner asks, and
//! its implementation for a running agent, [`ServiceBackend`]: the CSI controller
//! service itself, called in process with the request any CSI client would send, so a
//! claim is refused or made by exactly the checks CreateVolume runs for csi-sanity or
//! `drivelet csi`.
//!
//! Rules:
//! - Nothing runs before the volume manager is ready ([`Ready`], as for every queue).
//! - Refusals are CSI statuses; how one counts is decided from its code
//!   ([`super::failure_of`]), never from its words.

use std::future::Future;

use tonic::{Request, Status};

use crate::grpc::controller::ControllerService;
use crate::grpc::proto::csi;
use crate::grpc::proto::csi::controller_server::Controller as _;
use crate::k8s::shell::Ready;
use crate::k8s::volume_manager::ManagerBackend;
use crate::words::Binding;

/// The volume side of provisioning.
pub(crate) trait ProvisionBackend: Ready + Clone + Unpin + 'static {
    /// CreateVolume (idempotent by name).
    fn create(&self, req: csi::CreateVolumeRequest) -> impl Future<Output = Result<csi::Volume, Status>> + Send;
    /// DeleteVolume (an unknown volume is gone already: `Ok`).
    fn delete(&self, volume_id: &str) -> impl Future<Output = Result<(), Status>> + Send;
    /// Records what a made volume serves (its PV and claim, with the claim's uid).
    fn bind(&self, volume_id: &str, binding: Binding) -> impl Future<Output = Result<(), Status>> + Send;
    /// The volumes whose claim may have gone before their PV was written
    /// ([`super::abandoned`]), from the published view.
    fn abandoned(&self) -> Vec<super::Abandoned>;
    /// Whether the volume is still published to a node (ControllerUnpublishVolume not
    /// yet done): its deletion waits, as the external-provisioner's waits for no
    /// VolumeAttachment.
    fn attached(&self, volume_id: &str) -> bool;
}

/// The CSI controller service of this agent, and its volume manager for readiness.
#[derive(Clone)]
pub(crate) struct ServiceBackend {
    service: std::sync::Arc<ControllerService>,
    ready: ManagerBackend,
}

impl ServiceBackend {
    /// Asks `front`'s controller service.
    pub(crate) fn new(front: crate::grpc::Front) -> Self {
        let ready = ManagerBackend::new(front.volumes.clone());
        Self { service: std::sync::Arc::new(ControllerService(front)), ready }
    }
}

impl Ready for ServiceBackend {
    async fn wait_ready(&self) {
        self.ready.wait_ready().await
    }
}

impl ProvisionBackend for ServiceBackend {
    async fn create(&self, req: csi::CreateVolumeRequest) -> Result<csi::Volume, Status> {
        let answer = self.service.create_volume(Request::new(req)).await?;
        answer.into_inner().volume.ok_or_else(|| Status::internal("CreateVolume answered no volume"))
    }

    async fn delete(&self, volume_id: &str) -> Result<(), Status> {
        let req = csi::DeleteVolumeRequest { volume_id: volume_id.to_string(), secrets: Default::default() };
        self.service.delete_volume(Request::new(req)).await.map(|_| ())
    }

    async fn bind(&self, volume_id: &str, binding: Binding) -> Result<(), Status> {
        let m = crate::actors::volumes::messages::SetBinding { volume_id: volume_id.to_string(), binding };
        self.service.0.ask(m).await
    }

    fn attached(&self, volume_id: &str) -> bool {
        let Ok(view) = self.service.0.views.book() else { return false };
        view.volumes().iter().any(|l| l.record.id == volume_id && l.record.published_node.is_some())
    }

    fn abandoned(&self) -> Vec<super::Abandoned> {
        let Ok(view) = self.service.0.views.book() else { return Vec::new() };
        if !view.is_ready() {
            return Vec::new();
        }
        view.volumes().iter().filter_map(|l| super::abandoned(&l.record)).collect()
    }
}
