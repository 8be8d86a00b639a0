//! CSI Controller service (node-local: every volume lives on this node's drives).
//!
//! CSI MUSTs honoured:
//! - `ControllerGetCapabilities` lists only implemented RPCs: CREATE_DELETE_VOLUME,
//!   PUBLISH_UNPUBLISH_VOLUME, GET_CAPACITY, SINGLE_NODE_MULTI_WRITER, LIST_VOLUMES,
//!   LIST_VOLUMES_PUBLISHED_NODES, GET_VOLUME, VOLUME_CONDITION, EXPAND_VOLUME,
//!   CLONE_VOLUME, CREATE_DELETE_SNAPSHOT, LIST_SNAPSHOTS, and, only with `driver.advertise_volume_health`, CSI v1.13's
//!   LIST_VOLUME_HEALTH and GET_VOLUME_HEALTH ([`super::volume_health`] serves those two RPCs
//!   either way) (not PUBLISH_READONLY: read-only access is the SINGLE_NODE_READER_ONLY mode, enforced on
//!   the node);
//! - `ControllerExpandVolume` grows a partition in place into the free space that
//!   follows it (online: staged and published volumes too); a missing id or capacity
//!   range is INVALID_ARGUMENT, an unknown volume NOT_FOUND, a size the volume already
//!   has (or exceeds) OK with its size, a limit below its size or a size that would
//!   run past the end of the drive OUT_OF_RANGE (even when another volume is in the
//!   way too), another volume in the way RESOURCE_EXHAUSTED, a missing drive
//!   FAILED_PRECONDITION; `node_expansion_required` is true for filesystem volumes;
//! - `ListVolumes` pages in volume-id order; `next_token` names the last id returned
//!   and this run of the agent, so a malformed token or one from before a restart is
//!   ABORTED; entries (and `ControllerGetVolume`) carry the volume's condition and
//!   this node in `published_node_ids` when the volume is attached or node-published;
//! - `ControllerPublishVolume` attaches a volume to this node only: missing fields, an
//!   unsupported capability or `readonly` (PUBLISH_READONLY is not offered) are
//!   INVALID_ARGUMENT; an unknown volume, or any node id but this node's, NOT_FOUND; a
//!   capability the volume cannot serve (block vs filesystem, another filesystem), a
//!   volume being deleted, or a drive that is missing, failing or being released
//!   FAILED_PRECONDITION (a repeat of an attachment that exists succeeds unless the
//!   drive is missing); the attachment is persisted, a repeat succeeds with the same
//!   `publish_context` (`drivelet.io/device`, the partition's device node, and
//!   `drivelet.io/partition-guid`);
//! - `ControllerUnpublishVolume` detaches; a volume unknown or not attached to the
//!   node is detached already (OK, as the spec says SHOULD and csi-sanity expects);
//!   without a node id it detaches from every node;
//! - `ControllerGetVolume` of an unknown volume is NOT_FOUND;
//! - `CreateVolume` is idempotent by name: the same name with compatible arguments
//!   returns the same volume, with incompatible ones ALREADY_EXISTS; a requisite
//!   topology that does not include this node is RESOURCE_EXHAUSTED, a capacity range
//!   that no drive could ever meet OUT_OF_RANGE, no room now RESOURCE_EXHAUSTED;
//!   a volume content source of another volume makes a clone (CLONE_VOLUME: a source
//!   unknown on this node NOT_FOUND, one of another access type or filesystem
//!   INVALID_ARGUMENT, `limit_bytes` below its size OUT_OF_RANGE, one mounted
//!   read-write FAILED_PRECONDITION; the same name with another source
//!   ALREADY_EXISTS; the volume answered carries its `content_source`); a snapshot
//!   source restores it (unknown: NOT_FOUND; of another kind INVALID_ARGUMENT; smaller
//!   than the snapshot OUT_OF_RANGE; on an absent or failing drive
//!   FAILED_PRECONDITION); mutable parameters are refused with INVALID_ARGUMENT because
//!   MODIFY_VOLUME is not advertised;
//! - `CreateSnapshot` is idempotent by name (the same source: the same snapshot, ready;
//!   another: ALREADY_EXISTS); a source unknown here NOT_FOUND; one mounted read-write
//!   FAILED_PRECONDITION unless the class asks for a freeze; `DeleteSnapshot` of an
//!   unknown id succeeds; `ListSnapshots` pages in id order like `ListVolumes` and
//!   filters by snapshot id or source volume (an unknown one: an empty list);
//!   `GetSnapshot` (GET_SNAPSHOT, alpha) is not served;
//! - `DeleteVolume` of an unknown volume succeeds; of a staged, node-published or
//!   attached (controller-published) one is FAILED_PRECONDITION;
//! - `ValidateVolumeCapabilities` confirms only what the volume can serve;
//! - `GetCapacity` reports the bytes that volumes matching the parameters, capabilities
//!   and topology could use, with `maximum_volume_size` = the largest free extent; a
//!   topology that does not include this node, a capability drivelet cannot serve, or
//!   a class filesystem (`csi.storage.k8s.io/fstype`) it cannot make gets 0 (not an
//!   error);
//! - secrets are never read or logged; malformed input is INVALID_ARGUMENT;
//! - `ListVolumes` and `GetCapacity` answer from the volume manager's published view
//!   (`actors::volumes::view`), one consistent moment of its book, without a message.

use std::collections::{BTreeMap, HashMap};

use tonic::{Request, Response, Status};
use tracing::instrument;

use super::params::{capability_supported, unsupported_reason, VolumeParams};
use super::proto::csi::{self, controller_server::Controller, controller_service_capability};
use super::status::{echo, FrontError};
use super::Front;

use crate::actors::volumes::GetCapacity;
use crate::actors::volumes::model::{minimum_size, CapacityRange, VolumeRecord};
use crate::actors::volumes::conditions::Condition;
use crate::actors::volumes::snapshot::SnapshotRecord;
use crate::actors::volumes::{
    AttachVolume, CreateSnapshot, CreateVolume, DeleteSnapshot, DeleteVolume, DetachVolume, ExpandVolume, GetVolume, GetVolumeStatus,
    ListSnapshots,
};
use crate::words::LayoutKind;

/// Controller service over the shared front state.
pub(crate) struct ControllerService(pub Front);

fn invalid(msg: impl Into<String>) -> Status {
    FrontError::InvalidArgument(msg.into()).into()
}

/// Checks a CSI name or id: present, at most 128 bytes, no control characters.
pub(crate) fn check_id(field: &str, v: &str) -> Result<(), Status> {
    if v.is_empty() {
        return Err(invalid(format!("{field} is required")));
    }
    if v.len() > 128 {
        return Err(invalid(format!("{field} is {} bytes long; the limit is 128", v.len())));
    }
    // The CSI spec bans U+0000-0008, U+000B, U+000C, U+000E-001F and U+007F-009F.
    if v.chars().any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r')) {
        return Err(invalid(format!("{field} contains control characters")));
    }
    Ok(())
}

/// Why CreateVolume would refuse these capabilities and parameters before it looks at a
/// drive, in its own words (`None`: it would not). The cluster duties warn a waiting
/// claim with it; it is the same checks `create_volume` runs, in the same order.
pub(crate) fn refusal(caps: &[csi::VolumeCapability], parameters: &HashMap<String, String>) -> Option<String> {
    if let Err(s) = access_of(caps) {
        return Some(s.message().to_string());
    }
    VolumeParams::parse(parameters).err().map(|e| e.to_string())
}

/// What a set of capabilities asks for: block access, and the filesystem for mount
/// access. Every capability must be servable and all must agree.
pub(crate) fn access_of(caps: &[csi::VolumeCapability]) -> Result<(bool, String), Status> {
    use csi::volume_capability::AccessType;
    if caps.is_empty() {
        return Err(invalid("volume_capabilities is required"));
    }
    let mut block = None;
    let mut fs = String::new();
    for c in caps {
        if let Some(why) = unsupported_reason(c)? {
            return Err(invalid(format!("unsupported volume capability: {why}")));
        }
        let is_block = matches!(c.access_type, Some(AccessType::Block(_)));
        if block.is_some_and(|b| b != is_block) {
            return Err(invalid("volume_capabilities mix block and mount access; a volume is one or the other"));
        }
        block = Some(is_block);
        if let Some(AccessType::Mount(m)) = &c.access_type {
            if !m.fs_type.is_empty() {
                if !fs.is_empty() && fs != m.fs_type {
                    return Err(invalid(format!(
                        "volume_capabilities ask for two filesystems, {} and {}; a volume holds one",
                        echo(&fs),
                        echo(&m.fs_type)
                    )));
                }
                fs = m.fs_type.clone();
            }
        }
    }
    Ok((block.unwrap_or(false), fs))
}

pub(crate) fn range_of(r: Option<&csi::CapacityRange>) -> Result<CapacityRange, Status> {
    let Some(r) = r else { return Ok(CapacityRange { required: 0, limit: 0 }) };
    if r.required_bytes < 0 || r.limit_bytes < 0 {
        return Err(invalid(format!(
            "capacity_range has required_bytes {} and limit_bytes {}; neither may be negative (0: no bound)",
            r.required_bytes, r.limit_bytes
        )));
    }
    if r.limit_bytes != 0 && r.limit_bytes < r.required_bytes {
        return Err(invalid(format!(
            "capacity_range limit_bytes {} is below required_bytes {}",
            r.limit_bytes, r.required_bytes
        )));
    }
    Ok(CapacityRange { required: r.required_bytes as u64, limit: r.limit_bytes as u64 })
}

/// The volume a CreateVolume clones or the snapshot it restores, if it names one, and
/// whether it is a snapshot.
pub(crate) fn source_of(src: Option<&csi::VolumeContentSource>) -> Result<Option<(String, bool)>, Status> {
    use csi::volume_content_source::Type;
    let Some(src) = src else { return Ok(None) };
    match &src.r#type {
        None => Err(invalid("volume_content_source names neither a snapshot nor a volume")),
        Some(Type::Snapshot(s)) => {
            check_id("volume_content_source.snapshot.snapshot_id", &s.snapshot_id)?;
            Ok(Some((s.snapshot_id.clone(), true)))
        }
        Some(Type::Volume(v)) => {
            check_id("volume_content_source.volume.volume_id", &v.volume_id)?;
            Ok(Some((v.volume_id.clone(), false)))
        }
    }
}

/// The CSI form of a snapshot.
pub(crate) fn snapshot_of(s: &SnapshotRecord) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: i64::try_from(s.restore_size).unwrap_or(i64::MAX),
        snapshot_id: s.id.clone(),
        source_volume_id: s.source_volume_id.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: s.created_unix_nanos.div_euclid(1_000_000_000),
            nanos: s.created_unix_nanos.rem_euclid(1_000_000_000) as i32,
        }),
        ready_to_use: s.is_ready(),
        group_snapshot_id: String::new(),
    }
}

/// The CSI form of a condition.
pub(crate) fn condition_of(c: &Condition) -> csi::VolumeCondition {
    csi::VolumeCondition { abnormal: c.abnormal, message: c.message.clone() }
}

impl ControllerService {
    /// The node the volume is attached to (ControllerPublishVolume) or published on
    /// (NodePublishVolume): this node, or none.
    fn published_nodes(&self, rec: &VolumeRecord) -> Vec<String> {
        let mut nodes: Vec<String> = rec.published_node.iter().cloned().collect();
        let here = &self.0.cfg.driver.node_name;
        if !rec.targets.is_empty() && !nodes.contains(here) {
            nodes.push(here.clone());
        }
        nodes
    }

    fn volume_of(&self, rec: &VolumeRecord) -> csi::Volume {
        csi::Volume {
            capacity_bytes: i64::try_from(rec.size).unwrap_or(i64::MAX),
            volume_id: rec.id.clone(),
            volume_context: context_of(rec),
            content_source: match (&rec.clone_of, &rec.restored_from) {
                (_, Some(id)) => Some(csi::VolumeContentSource {
                    r#type: Some(csi::volume_content_source::Type::Snapshot(csi::volume_content_source::SnapshotSource { snapshot_id: id.clone() })),
                }),
                (Some(id), None) => Some(csi::VolumeContentSource {
                    r#type: Some(csi::volume_content_source::Type::Volume(csi::volume_content_source::VolumeSource { volume_id: id.clone() })),
                }),
                (None, None) => None,
            },
            accessible_topology: vec![csi::Topology { segments: self.0.topology.clone() }],
        }
    }
}

/// The volume context every volume carries (shown by `kubectl describe pv`).
pub(crate) fn context_of(rec: &VolumeRecord) -> HashMap<String, String> {
    let mut c = HashMap::from([
        ("drivelet.io/drive".to_string(), rec.drive_id.clone()),
        ("drivelet.io/layout".to_string(), match rec.layout {
            LayoutKind::Partition => "partition".to_string(),
            LayoutKind::Drive => "drive".to_string(),
        }),
        ("drivelet.io/media".to_string(), rec.media.as_str().to_string()),
    ]);
    if !rec.block && !rec.fs_type.is_empty() {
        c.insert("drivelet.io/fs".to_string(), rec.fs_type.clone());
    }
    c
}

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
        let mut types = vec![
            Type::CreateDeleteVolume,
            Type::PublishUnpublishVolume,
            Type::GetCapacity,
            Type::SingleNodeMultiWriter,
            Type::ListVolumes,
            Type::ListVolumesPublishedNodes,
            Type::GetVolume,
            Type::VolumeCondition,
            Type::ExpandVolume,
        ];
        if self.0.cfg.driver.advertise_volume_health {
            types.extend([Type::ListVolumeHealth, Type::GetVolumeHealth]);
        }
        // Not GET_SNAPSHOT (alpha, and unknown to the community conformance suite
        // v5.4.0): GetSnapshot answers UNIMPLEMENTED.
        types.extend([Type::CloneVolume, Type::CreateDeleteSnapshot, Type::ListSnapshots]);
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse { capabilities: types.into_iter().map(rpc).collect() }))
    }

    #[instrument(skip_all, fields(csi.method = "CreateVolume", volume.name), err)]
    async fn create_volume(
        &self,
        req: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        let req = req.into_inner();
        check_id("name", &req.name)?;
        tracing::Span::current().record("volume.name", req.name.as_str());
        let (block, fs_type) = access_of(&req.volume_capabilities)?;
        let range = range_of(req.capacity_range.as_ref())?;
        let params = VolumeParams::parse(&req.parameters)?;
        let source = source_of(req.volume_content_source.as_ref())?;
        let from_snapshot = source.as_ref().is_some_and(|(_, snap)| *snap);
        let source = source.map(|(id, _)| id);
        if !req.mutable_parameters.is_empty() {
            let mut keys: Vec<String> = req.mutable_parameters.keys().map(|k| echo(k)).collect();
            keys.sort();
            return Err(invalid(format!(
                "mutable_parameters {} are not supported: drivelet offers no MODIFY_VOLUME; put parameters in the StorageClass",
                keys.join(", ")
            )));
        }
        if let Some(t) = &req.accessibility_requirements {
            if !t.requisite.is_empty() && !t.requisite.iter().any(|t| self.0.topology_matches(t)) {
                return Err(FrontError::OtherTopology { node: self.0.cfg.driver.node_name.clone() }.into());
            }
        }
        let parameters: BTreeMap<String, String> = req
            .parameters
            .iter()
            .filter(|(k, _)| !k.starts_with("csi.storage.k8s.io/"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let rec = self
            .0
            .volumes
            .send(CreateVolume {
                name: req.name,
                range,
                media: params.media,
                layout: params.layout,
                block,
                fs_type,
                parameters,
                source,
                from_snapshot,
                binding: binding_of(&req.parameters),
            })
            .await
            .map_err(FrontError::mailbox("volume manager"))??;
        Ok(Response::new(csi::CreateVolumeResponse { volume: Some(self.volume_of(&rec)) }))
    }

    #[instrument(skip_all, fields(csi.method = "DeleteVolume", volume.id), err)]
    async fn delete_volume(
        &self,
        req: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        let req = req.into_inner();
        check_id("volume_id", &req.volume_id)?;
        tracing::Span::current().record("volume.id", req.volume_id.as_str());
        self.0
            .volumes
            .send(DeleteVolume { volume_id: req.volume_id })
            .await
            .map_err(FrontError::mailbox("volume manager"))??;
        Ok(Response::new(csi::DeleteVolumeResponse {}))
    }

    #[instrument(skip_all, fields(csi.method = "ControllerPublishVolume", volume.id, node.name), err)]
    async fn controller_publish_volume(
        &self,
        req: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        let req = req.into_inner();
        check_id("volume_id", &req.volume_id)?;
        tracing::Span::current().record("volume.id", req.volume_id.as_str());
        check_id("node_id", &req.node_id)?;
        tracing::Span::current().record("node.name", req.node_id.as_str());
        let cap = req.volume_capability.ok_or_else(|| invalid("volume_capability is required"))?;
        let (block, fs_type) = access_of(std::slice::from_ref(&cap))?;
        if req.readonly {
            return Err(invalid(
                "readonly is not supported (PUBLISH_READONLY is not advertised); ask for the SINGLE_NODE_READER_ONLY access mode instead",
            ));
        }
        let here = &self.0.cfg.driver.node_name;
        if req.node_id != *here {
            return Err(FrontError::UnknownNode { node_id: req.node_id.clone(), here: here.clone() }.into());
        }
        let ctx = self
            .0
            .volumes
            .send(AttachVolume { volume_id: req.volume_id, node_id: req.node_id, block, fs_type })
            .await
            .map_err(FrontError::mailbox("volume manager"))??;
        Ok(Response::new(csi::ControllerPublishVolumeResponse {
            publish_context: ctx.to_map().into_iter().collect(),
        }))
    }

    #[instrument(skip_all, fields(csi.method = "ControllerUnpublishVolume", volume.id, node.name), err)]
    async fn controller_unpublish_volume(
        &self,
        req: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        let req = req.into_inner();
        check_id("volume_id", &req.volume_id)?;
        tracing::Span::current().record("volume.id", req.volume_id.as_str());
        let node_id = if req.node_id.is_empty() {
            None
        } else {
            check_id("node_id", &req.node_id)?;
            tracing::Span::current().record("node.name", req.node_id.as_str());
            Some(req.node_id)
        };
        self.0
            .volumes
            .send(DetachVolume { volume_id: req.volume_id, node_id })
            .await
            .map_err(FrontError::mailbox("volume manager"))??;
        Ok(Response::new(csi::ControllerUnpublishVolumeResponse {}))
    }

    #[instrument(skip_all, fields(csi.method = "ValidateVolumeCapabilities", volume.id), err)]
    async fn validate_volume_capabilities(
        &self,
        req: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        let req = req.into_inner();
        check_id("volume_id", &req.volume_id)?;
        tracing::Span::current().record("volume.id", req.volume_id.as_str());
        if req.volume_capabilities.is_empty() {
            return Err(invalid("volume_capabilities is required"));
        }
        let rec = self
            .0
            .volumes
            .send(GetVolume { volume_id: req.volume_id.clone() })
            .await
            .map_err(FrontError::mailbox("volume manager"))??;
        let unconfirmed = |why: &str| {
            Ok(Response::new(csi::ValidateVolumeCapabilitiesResponse { confirmed: None, message: why.to_string() }))
        };
        let (block, fs) = match access_of(&req.volume_capabilities) {
            Ok(x) => x,
            Err(s) => return unconfirmed(s.message()),
        };
        if block != rec.block && !rec.rebuilt {
            return unconfirmed(if rec.block { "the volume was created for block access" } else { "the volume was created for mount access" });
        }
        if !block && !fs.is_empty() && !rec.fs_type.is_empty() && fs != rec.fs_type {
            return unconfirmed(&format!("the volume holds {}, not {fs}", rec.fs_type));
        }
        if !req.parameters.is_empty() {
            let p = VolumeParams::parse(&req.parameters)?;
            if p.layout != rec.layout || p.media.is_some_and(|m| m != rec.media) {
                return unconfirmed("the parameters differ from those the volume was created with");
            }
        }
        Ok(Response::new(csi::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                volume_context: req.volume_context,
                volume_capabilities: req.volume_capabilities,
                parameters: req.parameters,
                mutable_parameters: HashMap::new(),
            }),
            message: String::new(),
        }))
    }

    #[instrument(skip_all, fields(csi.method = "ListVolumes"), err)]
    async fn list_volumes(
        &self,
        req: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        let req = req.into_inner();
        let (max, after) = self.0.page_start(req.max_entries, &req.starting_token)?;
        let view = self.0.views.book()?;
        let (page, next) = view.page(after.as_deref(), max)?;
        Ok(Response::new(csi::ListVolumesResponse {
            entries: page
                .iter()
                .map(|st| csi::list_volumes_response::Entry {
                    volume: Some(self.volume_of(&st.record)),
                    status: Some(csi::list_volumes_response::VolumeStatus {
                        published_node_ids: self.published_nodes(&st.record),
                        volume_condition: Some(condition_of(&st.condition)),
                    }),
                })
                .collect(),
            next_token: next.map(|id| self.0.token(&id)).unwrap_or_default(),
        }))
    }

    #[instrument(skip_all, fields(csi.method = "ControllerExpandVolume", volume.id), err)]
    async fn controller_expand_volume(
        &self,
        req: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        let req = req.into_inner();
        check_id("volume_id", &req.volume_id)?;
        tracing::Span::current().record("volume.id", req.volume_id.as_str());
        let Some(range) = req.capacity_range.as_ref() else {
            return Err(invalid("capacity_range is required: say how large the volume should become"));
        };
        let range = range_of(Some(range))?;
        if let Some(cap) = &req.volume_capability {
            access_of(std::slice::from_ref(cap))?;
        }
        let (size, node_expansion_required) = self
            .0
            .volumes
            .send(ExpandVolume { volume_id: req.volume_id, range })
            .await
            .map_err(FrontError::mailbox("volume manager"))??;
        Ok(Response::new(csi::ControllerExpandVolumeResponse {
            capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX),
            node_expansion_required,
        }))
    }

    #[instrument(skip_all, fields(csi.method = "ControllerGetVolume", volume.id), err)]
    async fn controller_get_volume(
        &self,
        req: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        let req = req.into_inner();
        check_id("volume_id", &req.volume_id)?;
        tracing::Span::current().record("volume.id", req.volume_id.as_str());
        let st = self
            .0
            .volumes
            .send(GetVolumeStatus { volume_id: req.volume_id })
            .await
            .map_err(FrontError::mailbox("volume manager"))??;
        Ok(Response::new(csi::ControllerGetVolumeResponse {
            volume: Some(self.volume_of(&st.record)),
            status: Some(csi::controller_get_volume_response::VolumeStatus {
                published_node_ids: self.published_nodes(&st.record),
                volume_condition: Some(condition_of(&st.condition)),
            }),
        }))
    }

    #[instrument(skip_all, fields(csi.method = "ControllerGetVolumeHealth", volume.id), err)]
    async fn controller_get_volume_health(
        &self,
        req: Request<csi::ControllerGetVolumeHealthRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeHealthResponse>, Status> {
        self.0.controller_get_volume_health(req.into_inner()).await
    }

    #[instrument(skip_all, fields(csi.method = "ControllerListVolumeHealth"), err)]
    async fn controller_list_volume_health(
        &self,
        req: Request<csi::ControllerListVolumeHealthRequest>,
    ) -> Result<Response<csi::ControllerListVolumeHealthResponse>, Status> {
        self.0.controller_list_volume_health(req.into_inner()).await
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
        // The StorageClass's filesystem (the external-provisioner's capacity tracking
        // passes the class's parameters and no capabilities): one drivelet cannot make
        // has no capacity, and xfs has its larger minimum.
        let class_fs = req.parameters.get("csi.storage.k8s.io/fstype").filter(|f| !f.is_empty());
        if let Some(fs) = class_fs {
            servable &= matches!(fs.as_str(), "ext4" | "xfs");
        }
        // The smallest volume the capabilities allow: xfs needs 300 MiB, ext4 16 MiB.
        let minimum = req
            .volume_capabilities
            .iter()
            .map(|c| match &c.access_type {
                Some(csi::volume_capability::AccessType::Mount(m)) => {
                    let fs = if m.fs_type.is_empty() { self.0.cfg.volumes.default_fs.as_str() } else { m.fs_type.as_str() };
                    minimum_size(false, fs)
                }
                _ => minimum_size(true, ""),
            })
            .chain(class_fs.map(|fs| minimum_size(false, fs)))
            .max()
            .unwrap_or_else(|| minimum_size(true, "")) as i64;
        let zero = || csi::GetCapacityResponse {
            available_capacity: 0,
            maximum_volume_size: Some(0),
            minimum_volume_size: Some(minimum),
        };
        if !servable {
            return Ok(Response::new(zero()));
        }
        let cap = self.0.views.book()?.capacity(&GetCapacity { media: params.media, layout: params.layout, minimum: minimum as u64 })?;
        Ok(Response::new(csi::GetCapacityResponse {
            available_capacity: i64::try_from(cap.available).unwrap_or(i64::MAX),
            maximum_volume_size: Some(i64::try_from(cap.maximum_volume_size).unwrap_or(i64::MAX)),
            minimum_volume_size: Some(minimum),
        }))
    }

    #[instrument(skip_all, fields(csi.method = "CreateSnapshot", snapshot.name, volume.id), err)]
    async fn create_snapshot(
        &self,
        req: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        let req = req.into_inner();
        check_id("name", &req.name)?;
        tracing::Span::current().record("snapshot.name", req.name.as_str());
        check_id("source_volume_id", &req.source_volume_id)?;
        tracing::Span::current().record("volume.id", req.source_volume_id.as_str());
        let parameters: BTreeMap<String, String> = req
            .parameters
            .iter()
            .filter(|(k, _)| !k.starts_with("csi.storage.k8s.io/"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let snap = self
            .0
            .volumes
            .send(CreateSnapshot { name: req.name, source_volume_id: req.source_volume_id, parameters })
            .await
            .map_err(FrontError::mailbox("volume manager"))??;
        Ok(Response::new(csi::CreateSnapshotResponse { snapshot: Some(snapshot_of(&snap)) }))
    }

    #[instrument(skip_all, fields(csi.method = "DeleteSnapshot", snapshot.id), err)]
    async fn delete_snapshot(
        &self,
        req: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        let req = req.into_inner();
        check_id("snapshot_id", &req.snapshot_id)?;
        tracing::Span::current().record("snapshot.id", req.snapshot_id.as_str());
        self.0
            .volumes
            .send(DeleteSnapshot { snapshot_id: req.snapshot_id })
            .await
            .map_err(FrontError::mailbox("volume manager"))??;
        Ok(Response::new(csi::DeleteSnapshotResponse {}))
    }

    #[instrument(skip_all, fields(csi.method = "ListSnapshots"), err)]
    async fn list_snapshots(
        &self,
        req: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        let req = req.into_inner();
        let (max, after) = self.0.page_start(req.max_entries, &req.starting_token)?;
        let all = self.0.volumes.send(ListSnapshots).await.map_err(FrontError::mailbox("volume manager"))??;
        let chosen = all.iter().filter(|s| {
            (req.snapshot_id.is_empty() || s.id == req.snapshot_id)
                && (req.source_volume_id.is_empty() || s.source_volume_id == req.source_volume_id)
                && after.as_deref().is_none_or(|a| s.id.as_str() > a)
        });
        let (page, next) = page_of(chosen, max);
        Ok(Response::new(csi::ListSnapshotsResponse {
            entries: page.into_iter().map(|s| csi::list_snapshots_response::Entry { snapshot: Some(snapshot_of(s)) }).collect(),
            next_token: next.map(|id| self.0.token(&id)).unwrap_or_default(),
        }))
    }
}

/// At most `max` (0: all) of `items` (in id order), and the id of the last one given
/// when more follow.
fn page_of<'a>(items: impl Iterator<Item = &'a SnapshotRecord>, max: usize) -> (Vec<&'a SnapshotRecord>, Option<String>) {
    let max = if max == 0 { usize::MAX } else { max };
    let mut out = Vec::new();
    for s in items {
        if out.len() == max {
            let next = out.last().map(|s: &&SnapshotRecord| s.id.clone());
            return (out, next);
        }
        out.push(s);
    }
    (out, None)
}

/// The PV and claim a CreateVolume is made for, from the provisioner's
/// `--extra-create-metadata` parameters (empty where it does not say).
fn binding_of(parameters: &std::collections::HashMap<String, String>) -> crate::words::Binding {
    let get = |k: &str| parameters.get(k).cloned().unwrap_or_default();
    crate::words::Binding {
        pv: get("csi.storage.k8s.io/pv/name"),
        claim_namespace: get("csi.storage.k8s.io/pvc/namespace"),
        claim_name: get("csi.storage.k8s.io/pvc/name"),
        ..Default::default()
    }
}
