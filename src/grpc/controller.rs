//! CSI Controller service (node-local: every volume lives on this node's drives).
//!
//! CSI MUSTs honoured: `ControllerGetCapabilities` lists only implemented RPCs;
//! `GetCapacity` reports the bytes that volumes matching the parameters, capabilities
//! and topology could use, with `maximum_volume_size` = the largest free extent; a
//! topology that does not include this node, or a capability drivelet cannot serve,
//! gets 0 (not an error); malformed input is INVALID_ARGUMENT.

use tonic::{Request, Response, Status};
use tracing::instrument;

use super::params::{capability_supported, VolumeParams};
use super::proto::csi::{self, controller_server::Controller, controller_service_capability};
use super::status::FrontError;
use super::Front;
use crate::actors::messages::GetCapacity;
use crate::disk::gpt;

/// Controller service over the shared front state.
pub struct ControllerService(pub Front);

#[tonic::async_trait]
impl Controller for ControllerService {
    #[instrument(skip_all, fields(csi.method = "ControllerGetCapabilities"), err)]
    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        use controller_service_capability::rpc::Type;
        let rpc = |t: Type| csi::ControllerServiceCapability {
            r#type: Some(controller_service_capability::Type::Rpc(controller_service_capability::Rpc { r#type: t as i32 })),
        };
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse { capabilities: vec![rpc(Type::GetCapacity)] }))
    }

    #[instrument(skip_all, fields(csi.method = "GetCapacity"), err)]
    async fn get_capacity(
        &self,
        req: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        let req = req.into_inner();
        let params = VolumeParams::parse(&req.parameters)?;
        let mut servable = true;
        for cap in &req.volume_capabilities {
            servable &= capability_supported(cap)?;
        }
        if let Some(t) = &req.accessible_topology {
            servable &= self.0.topology_matches(t);
        }
        let zero = || csi::GetCapacityResponse {
            available_capacity: 0,
            maximum_volume_size: Some(0),
            minimum_volume_size: Some(gpt::ALIGN as i64),
        };
        if !servable {
            return Ok(Response::new(zero()));
        }
        let cap = self
            .0
            .inventory
            .send(GetCapacity { media: params.media, layout: params.layout })
            .await
            .map_err(FrontError::mailbox("drive inventory"))?;
        Ok(Response::new(csi::GetCapacityResponse {
            available_capacity: i64::try_from(cap.available).unwrap_or(i64::MAX),
            maximum_volume_size: Some(i64::try_from(cap.maximum_volume_size).unwrap_or(i64::MAX)),
            minimum_volume_size: Some(gpt::ALIGN as i64),
        }))
    }
}
