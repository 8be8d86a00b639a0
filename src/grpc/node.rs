//! CSI Node service: node identity and topology.
//!
//! CSI MUSTs honoured: `NodeGetInfo` returns a node id unique in the cluster (the node
//! name), `max_volumes_per_node` (0: no limit) and the accessible topology that every
//! volume of this node carries: `topology.drivelet.io/node` plus configured segments.
//! `NodeGetCapabilities` lists only what is implemented; volume RPCs not yet
//! implemented answer UNIMPLEMENTED.

use tonic::{Request, Response, Status};
use tracing::instrument;

use super::proto::csi::{self, node_server::Node};
use super::Front;

/// Node service over the shared front state.
pub struct NodeService(pub Front);

#[tonic::async_trait]
impl Node for NodeService {
    #[instrument(skip_all, fields(csi.method = "NodeGetInfo"), err)]
    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: self.0.cfg.driver.node_name.clone(),
            max_volumes_per_node: self.0.cfg.driver.max_volumes_per_node,
            accessible_topology: Some(csi::Topology { segments: self.0.topology.clone() }),
        }))
    }

    #[instrument(skip_all, fields(csi.method = "NodeGetCapabilities"), err)]
    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::NodeGetCapabilitiesResponse { capabilities: vec![] }))
    }
}
