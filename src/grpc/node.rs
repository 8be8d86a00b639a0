//! CSI Node service: node identity and topology, and staging and publishing volumes.
//! Each handler validates ([`super::valid`]), asks the volume manager
//! ([`Front::ask`]) and answers in CSI's words.
//!
//! CSI MUSTs honoured: `NodeGetInfo` returns a node id unique in the cluster (the node
//! name), `max_volumes_per_node` (0: no limit) and the accessible topology that every
//! volume of this node carries: `topology.drivelet.io/node` plus configured segments.
//! `NodeGetCapabilities` lists only what is implemented (STAGE_UNSTAGE_VOLUME,
//! SINGLE_NODE_MULTI_WRITER, GET_VOLUME_STATS, VOLUME_CONDITION, EXPAND_VOLUME, and,
//! only with `driver.advertise_volume_health`, CSI v1.13's GET_VOLUME_HEALTH and
//! GET_STORAGE_HEALTH; [`super::volume_health`] serves those two RPCs either way).
//! `NodeExpandVolume` grows a staged filesystem online to its partition (the ext4 and
//! xfs resize ioctls on the checked staging directory's descriptor), for the volume's
//! staging or target path (NOT_FOUND otherwise); a block volume needs nothing; a partition not grown yet is FAILED_PRECONDITION. `NodeGetVolumeStats`
//! answers for the volume's staging or target path, or for a block volume any device
//! node of its partition under the allowed roots (kubelet asks at its own bind of the
//! published device, `.../volumeDevices/<pv>/dev/<pod uid>`), NOT_FOUND otherwise, with
//! bytes and inodes for filesystems, the size for block volumes, and the volume's
//! condition. Stage, unstage, publish and unpublish are idempotent:
//! repeating a call that succeeded succeeds; the same path with an incompatible
//! capability or read-only setting is ALREADY_EXISTS; an unknown volume is NOT_FOUND;
//! a missing field, a path longer than 4096 bytes (PATH_MAX; so no reply repeats more
//! of a path than that) or a path outside the allowed roots is INVALID_ARGUMENT; publishing
//! an unstaged volume is FAILED_PRECONDITION. Secrets are never read or logged.

use tonic::{Request, Response, Status};
use tracing::instrument;

use super::proto::csi::{self, node_server::Node, node_service_capability};
use super::status::FrontError;
use super::{valid, Front};

/// Node service over the shared front state.
pub(crate) struct NodeService(pub Front);

#[tonic::async_trait]
impl Node for NodeService {
    #[instrument(skip_all, fields(csi.method = "NodeStageVolume", volume.id), err)]
    async fn node_stage_volume(
        &self,
        req: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        self.0.ask(valid::stage(req.into_inner())?).await?;
        Ok(Response::new(csi::NodeStageVolumeResponse {}))
    }

    #[instrument(skip_all, fields(csi.method = "NodeUnstageVolume", volume.id), err)]
    async fn node_unstage_volume(
        &self,
        req: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        self.0.ask(valid::unstage(req.into_inner())?).await?;
        Ok(Response::new(csi::NodeUnstageVolumeResponse {}))
    }

    #[instrument(skip_all, fields(csi.method = "NodePublishVolume", volume.id), err)]
    async fn node_publish_volume(
        &self,
        req: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        self.0.ask(valid::publish(req.into_inner())?).await?;
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    #[instrument(skip_all, fields(csi.method = "NodeUnpublishVolume", volume.id), err)]
    async fn node_unpublish_volume(
        &self,
        req: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        self.0.ask(valid::unpublish(req.into_inner())?).await?;
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    #[instrument(skip_all, fields(csi.method = "NodeExpandVolume", volume.id), err)]
    async fn node_expand_volume(
        &self,
        req: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let (m, required) = valid::node_expand(req.into_inner())?;
        let volume_id = m.volume_id.clone();
        let size = self.0.ask(m).await?;
        if required as u64 > size {
            return Err(FrontError::NotGrownYet { volume_id, size, asked: required }.into());
        }
        Ok(Response::new(csi::NodeExpandVolumeResponse { capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX) }))
    }

    #[instrument(skip_all, fields(csi.method = "NodeGetVolumeStats", volume.id), err)]
    async fn node_get_volume_stats(
        &self,
        req: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        use csi::volume_usage::Unit;
        let (st, usage) = self.0.ask(valid::volume_stats(req.into_inner())?).await?;
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let usage = match usage {
            Some(u) => vec![
                csi::VolumeUsage {
                    available: n(u.available_bytes),
                    total: n(u.total_bytes),
                    used: n(u.used_bytes),
                    unit: Unit::Bytes as i32,
                },
                csi::VolumeUsage {
                    available: n(u.free_inodes),
                    total: n(u.total_inodes),
                    used: n(u.used_inodes),
                    unit: Unit::Inodes as i32,
                },
            ],
            None if st.record.block => {
                vec![csi::VolumeUsage { available: 0, total: n(st.record.size), used: 0, unit: Unit::Bytes as i32 }]
            }
            None => vec![],
        };
        Ok(Response::new(csi::NodeGetVolumeStatsResponse {
            usage,
            volume_condition: Some(csi::VolumeCondition { abnormal: st.condition.abnormal, message: st.condition.message }),
        }))
    }

    #[instrument(skip_all, fields(csi.method = "NodeGetVolumeHealth", volume.id), err)]
    async fn node_get_volume_health(
        &self,
        req: Request<csi::NodeGetVolumeHealthRequest>,
    ) -> Result<Response<csi::NodeGetVolumeHealthResponse>, Status> {
        self.0.node_get_volume_health(req.into_inner()).await
    }

    #[instrument(skip_all, fields(csi.method = "NodeGetStorageHealth"), err)]
    async fn node_get_storage_health(
        &self,
        _: Request<csi::NodeGetStorageHealthRequest>,
    ) -> Result<Response<csi::NodeGetStorageHealthResponse>, Status> {
        self.0.node_get_storage_health().await
    }

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
        use node_service_capability::rpc::Type;
        let rpc = |t: Type| csi::NodeServiceCapability {
            r#type: Some(node_service_capability::Type::Rpc(node_service_capability::Rpc { r#type: t as i32 })),
        };
        let mut types =
            vec![Type::StageUnstageVolume, Type::SingleNodeMultiWriter, Type::GetVolumeStats, Type::VolumeCondition, Type::ExpandVolume];
        if self.0.cfg.driver.advertise_volume_health {
            types.extend([Type::GetVolumeHealth, Type::GetStorageHealth]);
        }
        Ok(Response::new(csi::NodeGetCapabilitiesResponse { capabilities: types.into_iter().map(rpc).collect() }))
    }
}
