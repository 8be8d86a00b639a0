//! CSI Identity service.
//!
//! CSI MUSTs honoured: `GetPluginInfo` returns the configured driver name and a
//! non-empty vendor version; `GetPluginCapabilities` lists only what drivelet serves
//! (controller service, topology, ONLINE volume expansion);
//! `Probe` answers `ready=false` until the drive inventory finished its first scan
//! and the volume manager reconciled its store with the drives,
//! and UNAVAILABLE when either has stopped for good; it reads what they publish
//! (`Views`), never waiting on their mailboxes.

use tonic::{Request, Response, Status};
use tracing::instrument;

use super::proto::csi::{self, identity_server::Identity, plugin_capability};
use super::Front;

/// Identity service over the shared front state.
pub(crate) struct IdentityService(pub Front);

#[tonic::async_trait]
impl Identity for IdentityService {
    #[instrument(skip_all, fields(csi.method = "GetPluginInfo"), err)]
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.0.cfg.driver.name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: [("node".to_string(), self.0.cfg.driver.node_name.clone())].into(),
        }))
    }

    #[instrument(skip_all, fields(csi.method = "GetPluginCapabilities"), err)]
    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        use plugin_capability::service::Type;
        let service = |t: Type| csi::PluginCapability {
            r#type: Some(plugin_capability::Type::Service(plugin_capability::Service { r#type: t as i32 })),
        };
        // Partition volumes grow in place, with their filesystem mounted and in use.
        let online = csi::PluginCapability {
            r#type: Some(plugin_capability::Type::VolumeExpansion(plugin_capability::VolumeExpansion {
                r#type: plugin_capability::volume_expansion::Type::Online as i32,
            })),
        };
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities: vec![service(Type::ControllerService), service(Type::VolumeAccessibilityConstraints), online],
        }))
    }

    #[instrument(skip_all, fields(csi.method = "Probe"), err)]
    async fn probe(&self, _: Request<csi::ProbeRequest>) -> Result<Response<csi::ProbeResponse>, Status> {
        let scanned = self.0.views.scan_done()?;
        let volumes = self.0.views.book()?.is_ready();
        Ok(Response::new(csi::ProbeResponse { ready: Some(scanned && volumes) }))
    }
}
