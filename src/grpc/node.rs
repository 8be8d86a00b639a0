//! CSI Node service: node identity and topology, and staging and publishing volumes.
//!
//! CSI MUSTs honoured: `NodeGetInfo` returns a node id unique in the cluster (the node
//! name), `max_volumes_per_node` (0: no limit) and the accessible topology that every
//! volume of this node carries: `topology.drivelet.io/node` plus configured segments.
//! `NodeGetCapabilities` lists only what is implemented (STAGE_UNSTAGE_VOLUME,
//! SINGLE_NODE_MULTI_WRITER, GET_VOLUME_STATS, VOLUME_CONDITION, EXPAND_VOLUME, and,
//! only with `driver.advertise_volume_health`, CSI v1.13's GET_VOLUME_HEALTH and
//! GET_STORAGE_HEALTH; [`super::volume_health`] serves those two RPCs either way).
//! `NodeExpandVolume` grows a staged filesystem online to its partition (resize2fs,
//! xfs_growfs), for the volume's staging or target path (NOT_FOUND otherwise); a block
//! volume needs nothing; a partition not grown yet is FAILED_PRECONDITION. `NodeGetVolumeStats`
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

use std::path::PathBuf;

use tonic::{Request, Response, Status};
use tracing::instrument;

use super::controller::{access_of, check_id};
use super::proto::csi::{self, node_server::Node, node_service_capability};
use super::status::FrontError;
use super::Front;
use crate::actors::volumes::{
    NodeExpandVolume, PublishArgs, PublishVolume, StageArgs, StageVolume, UnpublishVolume, UnstageVolume, VolumeStats,
};

/// Node service over the shared front state.
pub(crate) struct NodeService(pub Front);

fn invalid(msg: impl Into<String>) -> Status {
    FrontError::InvalidArgument(msg.into()).into()
}

/// Longest path a node call takes: the kernel's PATH_MAX.
const MAX_PATH: usize = 4096;

fn path_field(field: &str, v: &str) -> Result<PathBuf, Status> {
    if v.is_empty() {
        return Err(invalid(format!("{field} is required")));
    }
    if v.len() > MAX_PATH {
        return Err(invalid(format!("{field} is {} bytes long; the limit is {MAX_PATH}", v.len())));
    }
    Ok(PathBuf::from(v))
}

/// Access mode facts of one capability: read-only, single writer.
fn mode_of(cap: &csi::VolumeCapability) -> (bool, bool) {
    use csi::volume_capability::access_mode::Mode;
    let m = cap.access_mode.as_ref().and_then(|m| Mode::try_from(m.mode).ok());
    (m == Some(Mode::SingleNodeReaderOnly), m == Some(Mode::SingleNodeSingleWriter))
}

fn mount_flags(cap: &csi::VolumeCapability) -> Vec<String> {
    match &cap.access_type {
        Some(csi::volume_capability::AccessType::Mount(m)) => m.mount_flags.clone(),
        _ => Vec::new(),
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    #[instrument(skip_all, fields(csi.method = "NodeStageVolume", volume.id), err)]
    async fn node_stage_volume(
        &self,
        req: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let req = req.into_inner();
        check_id("volume_id", &req.volume_id)?;
        tracing::Span::current().record("volume.id", req.volume_id.as_str());
        let path = path_field("staging_target_path", &req.staging_target_path)?;
        let cap = req.volume_capability.ok_or_else(|| invalid("volume_capability is required"))?;
        let (block, fs_type) = access_of(std::slice::from_ref(&cap))?;
        let (readonly, _) = mode_of(&cap);
        let args = StageArgs { path, block, fs_type, flags: mount_flags(&cap), readonly };
        self.0
            .volumes
            .send(StageVolume { volume_id: req.volume_id, args })
            .await
            .map_err(FrontError::mailbox("volume manager"))??;
        Ok(Response::new(csi::NodeStageVolumeResponse {}))
    }

    #[instrument(skip_all, fields(csi.method = "NodeUnstageVolume", volume.id), err)]
    async fn node_unstage_volume(
        &self,
        req: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let req = req.into_inner();
        check_id("volume_id", &req.volume_id)?;
        tracing::Span::current().record("volume.id", req.volume_id.as_str());
        let path = path_field("staging_target_path", &req.staging_target_path)?;
        self.0
            .volumes
            .send(UnstageVolume { volume_id: req.volume_id, path })
            .await
            .map_err(FrontError::mailbox("volume manager"))??;
        Ok(Response::new(csi::NodeUnstageVolumeResponse {}))
    }

    #[instrument(skip_all, fields(csi.method = "NodePublishVolume", volume.id), err)]
    async fn node_publish_volume(
        &self,
        req: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let req = req.into_inner();
        check_id("volume_id", &req.volume_id)?;
        tracing::Span::current().record("volume.id", req.volume_id.as_str());
        let target = path_field("target_path", &req.target_path)?;
        let cap = req.volume_capability.ok_or_else(|| invalid("volume_capability is required"))?;
        let (block, _) = access_of(std::slice::from_ref(&cap))?;
        // STAGE_UNSTAGE_VOLUME is advertised: a publish must name the staging path.
        if req.staging_target_path.is_empty() {
            return Err(FrontError::StagingPathMissing.into());
        }
        let staging = PathBuf::from(&req.staging_target_path);
        let (ro_mode, single_writer) = mode_of(&cap);
        let args = PublishArgs {
            target,
            staging,
            block,
            readonly: req.readonly || ro_mode,
            single_writer,
            flags: mount_flags(&cap),
        };
        self.0
            .volumes
            .send(PublishVolume { volume_id: req.volume_id, args })
            .await
            .map_err(FrontError::mailbox("volume manager"))??;
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    #[instrument(skip_all, fields(csi.method = "NodeUnpublishVolume", volume.id), err)]
    async fn node_unpublish_volume(
        &self,
        req: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let req = req.into_inner();
        check_id("volume_id", &req.volume_id)?;
        tracing::Span::current().record("volume.id", req.volume_id.as_str());
        let target = path_field("target_path", &req.target_path)?;
        self.0
            .volumes
            .send(UnpublishVolume { volume_id: req.volume_id, target })
            .await
            .map_err(FrontError::mailbox("volume manager"))??;
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    #[instrument(skip_all, fields(csi.method = "NodeExpandVolume", volume.id), err)]
    async fn node_expand_volume(
        &self,
        req: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let req = req.into_inner();
        check_id("volume_id", &req.volume_id)?;
        tracing::Span::current().record("volume.id", req.volume_id.as_str());
        let path = path_field("volume_path", &req.volume_path)?;
        if let Some(r) = &req.capacity_range {
            if r.required_bytes < 0 || r.limit_bytes < 0 {
                return Err(invalid(format!(
                    "capacity_range has required_bytes {} and limit_bytes {}; neither may be negative (0: no bound)",
                    r.required_bytes, r.limit_bytes
                )));
            }
        }
        let size = self
            .0
            .volumes
            .send(NodeExpandVolume { volume_id: req.volume_id.clone(), path })
            .await
            .map_err(FrontError::mailbox("volume manager"))??;
        if let Some(r) = &req.capacity_range {
            if r.required_bytes as u64 > size {
                return Err(FrontError::NotGrownYet { volume_id: req.volume_id.clone(), size, asked: r.required_bytes }.into());
            }
        }
        Ok(Response::new(csi::NodeExpandVolumeResponse { capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX) }))
    }

    #[instrument(skip_all, fields(csi.method = "NodeGetVolumeStats", volume.id), err)]
    async fn node_get_volume_stats(
        &self,
        req: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        use csi::volume_usage::Unit;
        let req = req.into_inner();
        check_id("volume_id", &req.volume_id)?;
        tracing::Span::current().record("volume.id", req.volume_id.as_str());
        let path = path_field("volume_path", &req.volume_path)?;
        let (st, usage) = self
            .0
            .volumes
            .send(VolumeStats { volume_id: req.volume_id, path })
            .await
            .map_err(FrontError::mailbox("volume manager"))??;
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
