//! CSI Controller service (node-local: every volume lives on this node's drives).
//! Each handler validates ([`super::valid`]), asks the volume manager
//! ([`Front::ask`]) and answers in CSI's words; the words of a refusal live in
//! [`super::status`].
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
//!   follows it (online: staged and published volumes too), else, for a volume no pod
//!   uses, by moving it to a bigger free extent of another drive or of its own (the volume manager's
//!   `book::grow` rules); a missing id or capacity range is INVALID_ARGUMENT, an unknown
//!   volume NOT_FOUND, a size the volume already has (or exceeds) OK with its size, a
//!   limit below its size or a size no drive of the node holds OUT_OF_RANGE (naming the
//!   largest possible), another volume in the way or room still being cleaned
//!   RESOURCE_EXHAUSTED, a volume in use that only a move could grow (it grows at its
//!   next stage, once unused) or a missing drive FAILED_PRECONDITION;
//!   `node_expansion_required` is true for filesystem volumes;
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

use std::collections::HashMap;

use tonic::{Request, Response, Status};
use tracing::instrument;

use super::params::VolumeParams;
use super::proto::csi::{self, controller_server::Controller, controller_service_capability};
use super::{valid, Front};

use crate::actors::volumes::conditions::Condition;
use crate::actors::volumes::model::VolumeRecord;
use crate::actors::volumes::snapshot::SnapshotRecord;
use crate::actors::volumes::ListSnapshots;
use crate::words::LayoutKind;

/// Controller service over the shared front state.
pub(crate) struct ControllerService(pub Front);

/// Why CreateVolume would refuse these capabilities and parameters before it looks at a
/// drive, in its own words (`None`: it would not). The cluster duties warn a waiting
/// claim with it; it is the same checks `create_volume` runs, in the same order.
pub(crate) fn refusal(caps: &[csi::VolumeCapability], parameters: &HashMap<String, String>) -> Option<String> {
    if let Err(s) = valid::access_of(caps) {
        return Some(s.message().to_string());
    }
    VolumeParams::parse(parameters).err().map(|e| e.to_string())
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
    // A clone of a volume in use says how its copy was made (frozen, or
    // crash-inconsistent), so the PV shows it.
    if let Some(how) = rec.copied_in_use {
        c.insert(CLONE_CONSISTENCY.to_string(), how.as_str().to_string());
    }
    c
}

/// The volume attribute of a clone of a volume in use: `frozen` or `crash-inconsistent`.
pub(crate) const CLONE_CONSISTENCY: &str = "drivelet.io/clone-consistency";

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
        let rec = self.0.ask(valid::create_volume(&self.0, req.into_inner())?).await?;
        Ok(Response::new(csi::CreateVolumeResponse { volume: Some(self.volume_of(&rec)) }))
    }

    #[instrument(skip_all, fields(csi.method = "DeleteVolume", volume.id), err)]
    async fn delete_volume(
        &self,
        req: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        self.0.ask(valid::delete_volume(req.into_inner())?).await?;
        Ok(Response::new(csi::DeleteVolumeResponse {}))
    }

    #[instrument(skip_all, fields(csi.method = "ControllerPublishVolume", volume.id, node.name), err)]
    async fn controller_publish_volume(
        &self,
        req: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        let ctx = self.0.ask(valid::attach(&self.0.cfg.driver.node_name, req.into_inner())?).await?;
        Ok(Response::new(csi::ControllerPublishVolumeResponse { publish_context: ctx.to_map().into_iter().collect() }))
    }

    #[instrument(skip_all, fields(csi.method = "ControllerUnpublishVolume", volume.id, node.name), err)]
    async fn controller_unpublish_volume(
        &self,
        req: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        self.0.ask(valid::detach(req.into_inner())?).await?;
        Ok(Response::new(csi::ControllerUnpublishVolumeResponse {}))
    }

    #[instrument(skip_all, fields(csi.method = "ValidateVolumeCapabilities", volume.id), err)]
    async fn validate_volume_capabilities(
        &self,
        req: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        let req = req.into_inner();
        let rec = self.0.ask(valid::validate_capabilities(&req)?).await?;
        if let Some(why) = unconfirmed(&rec, &req)? {
            return Ok(Response::new(csi::ValidateVolumeCapabilitiesResponse { confirmed: None, message: why }));
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
        let (size, node_expansion_required) = self.0.ask(valid::expand(req.into_inner())?).await?;
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
        let st = self.0.ask(valid::volume(req.into_inner().volume_id)?).await?;
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
        Ok(Response::new(capacity(&self.0, &req.into_inner())?))
    }

    #[instrument(skip_all, fields(csi.method = "CreateSnapshot", snapshot.name, volume.id), err)]
    async fn create_snapshot(
        &self,
        req: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        let snap = self.0.ask(valid::create_snapshot(req.into_inner())?).await?;
        Ok(Response::new(csi::CreateSnapshotResponse { snapshot: Some(snapshot_of(&snap)) }))
    }

    #[instrument(skip_all, fields(csi.method = "DeleteSnapshot", snapshot.id), err)]
    async fn delete_snapshot(
        &self,
        req: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        self.0.ask(valid::delete_snapshot(req.into_inner())?).await?;
        Ok(Response::new(csi::DeleteSnapshotResponse {}))
    }

    #[instrument(skip_all, fields(csi.method = "ListSnapshots"), err)]
    async fn list_snapshots(
        &self,
        req: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        let req = req.into_inner();
        let (max, after) = self.0.page_start(req.max_entries, &req.starting_token)?;
        let all = self.0.ask(ListSnapshots).await?;
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

/// What GetCapacity answers to `req`, from the published view: the one answer of the
/// RPC and of the in-process CSIStorageCapacity objects (`crate::k8s::capacity`), which
/// ask it as the external-provisioner did (the class's parameters, this node's
/// segments, no capabilities). A request this node cannot serve has no room (not an
/// error); a view not ready yet is UNAVAILABLE.
pub(crate) fn capacity(front: &Front, req: &csi::GetCapacityRequest) -> Result<csi::GetCapacityResponse, Status> {
    let (servable, question) = valid::capacity(front, req)?;
    let minimum = question.minimum as i64;
    if !servable {
        return Ok(csi::GetCapacityResponse {
            available_capacity: 0,
            maximum_volume_size: Some(0),
            minimum_volume_size: Some(minimum),
        });
    }
    let cap = front.views.book()?.capacity(&question)?;
    Ok(csi::GetCapacityResponse {
        available_capacity: i64::try_from(cap.available).unwrap_or(i64::MAX),
        maximum_volume_size: Some(i64::try_from(cap.maximum_volume_size).unwrap_or(i64::MAX)),
        minimum_volume_size: Some(minimum),
    })
}

/// Why ValidateVolumeCapabilities does not confirm what `req` asks of the volume `rec`
/// (`None`: it does); malformed parameters are an error.
fn unconfirmed(rec: &VolumeRecord, req: &csi::ValidateVolumeCapabilitiesRequest) -> Result<Option<String>, Status> {
    let (block, fs) = match valid::access_of(&req.volume_capabilities) {
        Ok(x) => x,
        Err(s) => return Ok(Some(s.message().to_string())),
    };
    if block != rec.block && !rec.rebuilt {
        let access = if rec.block { "block" } else { "mount" };
        return Ok(Some(format!("the volume was created for {access} access")));
    }
    if !block && !fs.is_empty() && !rec.fs_type.is_empty() && fs != rec.fs_type {
        return Ok(Some(format!("the volume holds {}, not {fs}", rec.fs_type)));
    }
    if !req.parameters.is_empty() {
        let p = VolumeParams::parse(&req.parameters)?;
        if p.layout != rec.layout || p.media.is_some_and(|m| m != rec.media) {
            return Ok(Some("the parameters differ from those the volume was created with".to_string()));
        }
    }
    Ok(None)
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
