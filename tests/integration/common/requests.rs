//! The one set of CSI request builders of the integration tier: capabilities, the
//! lifecycle requests and parameter maps. Tests that need a field these do not set
//! change the returned request (`..` or a field assignment), they do not write their own.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;

use drivelet::grpc::proto::csi;
use drivelet::grpc::proto::csi::volume_capability::access_mode::Mode;
use drivelet::grpc::proto::csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};

/// A parameter or context map.
pub fn kv(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// A topology of the given segments.
pub fn topo(pairs: &[(&str, &str)]) -> csi::Topology {
    csi::Topology { segments: kv(pairs) }
}

/// A mount capability in `mode` with filesystem `fs` (may be empty) and mount flags.
pub fn mount(mode: Mode, fs: &str, flags: &[&str]) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            mount_flags: flags.iter().map(|f| f.to_string()).collect(),
            ..Default::default()
        })),
    }
}

/// A block capability in `mode`.
pub fn block(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability { access_mode: Some(AccessMode { mode: mode as i32 }), access_type: Some(AccessType::Block(BlockVolume {})) }
}

/// A mount capability (`fs` may be empty) in SINGLE_NODE_WRITER mode.
pub fn mount_cap(fs: &str) -> csi::VolumeCapability {
    mount(Mode::SingleNodeWriter, fs, &[])
}

/// A block capability in SINGLE_NODE_WRITER mode.
pub fn block_cap() -> csi::VolumeCapability {
    block(Mode::SingleNodeWriter)
}

/// CreateVolume of `bytes` (no limit) with one capability.
pub fn create_req(name: &str, bytes: u64, cap: csi::VolumeCapability) -> csi::CreateVolumeRequest {
    vol_req(name, bytes as i64, 0, vec![cap], &[])
}

/// CreateVolume with a full capacity range, capabilities and StorageClass parameters.
pub fn vol_req(name: &str, required: i64, limit: i64, caps: Vec<csi::VolumeCapability>, params: &[(&str, &str)]) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange { required_bytes: required, limit_bytes: limit }),
        volume_capabilities: caps,
        parameters: kv(params),
        ..Default::default()
    }
}

/// CreateVolume of a clone of `source`.
pub fn clone_req(name: &str, bytes: u64, limit: u64, cap: csi::VolumeCapability, source: &str) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        volume_content_source: Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Volume(csi::volume_content_source::VolumeSource { volume_id: source.into() })),
        }),
        ..vol_req(name, bytes as i64, limit as i64, vec![cap], &[])
    }
}

/// DeleteVolume.
pub fn del_req(id: &str) -> csi::DeleteVolumeRequest {
    csi::DeleteVolumeRequest { volume_id: id.into(), ..Default::default() }
}

/// NodeStageVolume at `staging`.
pub fn stage_req(id: &str, staging: &Path, cap: csi::VolumeCapability) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

/// NodeUnstageVolume of `path`.
pub fn unstage_req(id: &str, path: &Path) -> csi::NodeUnstageVolumeRequest {
    csi::NodeUnstageVolumeRequest { volume_id: id.into(), staging_target_path: path.display().to_string() }
}

/// NodePublishVolume from `staging` to `target`.
pub fn publish_req(id: &str, staging: &Path, target: &Path, cap: csi::VolumeCapability, readonly: bool) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(cap),
        readonly,
        ..Default::default()
    }
}

/// NodeUnpublishVolume of `target`.
pub fn unpublish_req(id: &str, target: &Path) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest { volume_id: id.into(), target_path: target.display().to_string() }
}

/// ValidateVolumeCapabilities.
pub fn validate_req(id: &str, caps: Vec<csi::VolumeCapability>) -> csi::ValidateVolumeCapabilitiesRequest {
    csi::ValidateVolumeCapabilitiesRequest { volume_id: id.into(), volume_capabilities: caps, ..Default::default() }
}

/// ControllerExpandVolume to `required` (`limit` 0: none).
pub fn expand_req(id: &str, required: u64, limit: u64) -> csi::ControllerExpandVolumeRequest {
    csi::ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(csi::CapacityRange { required_bytes: required as i64, limit_bytes: limit as i64 }),
        ..Default::default()
    }
}

/// NodeExpandVolume at `path` to `required`.
pub fn node_expand_req(id: &str, path: &Path, required: u64) -> csi::NodeExpandVolumeRequest {
    csi::NodeExpandVolumeRequest {
        volume_id: id.into(),
        volume_path: path.display().to_string(),
        capacity_range: Some(csi::CapacityRange { required_bytes: required as i64, limit_bytes: 0 }),
        ..Default::default()
    }
}

/// GetCapacity for one capability.
pub fn capacity_req(cap: csi::VolumeCapability) -> csi::GetCapacityRequest {
    csi::GetCapacityRequest { volume_capabilities: vec![cap], ..Default::default() }
}

/// GetCapacity for a `layout` parameter.
pub fn layout_req(layout: &str) -> csi::GetCapacityRequest {
    csi::GetCapacityRequest { parameters: kv(&[("layout", layout)]), ..Default::default() }
}

/// CreateSnapshot of `source` with the class parameters `params`.
pub fn snapshot_req(name: &str, source: &str, params: &[(&str, &str)]) -> csi::CreateSnapshotRequest {
    csi::CreateSnapshotRequest { name: name.into(), source_volume_id: source.into(), parameters: kv(params), ..Default::default() }
}

/// CreateVolume restored from the snapshot `snapshot`.
pub fn restore_req(name: &str, bytes: u64, limit: u64, cap: csi::VolumeCapability, snapshot: &str) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        volume_content_source: Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Snapshot(csi::volume_content_source::SnapshotSource { snapshot_id: snapshot.into() })),
        }),
        ..vol_req(name, bytes as i64, limit as i64, vec![cap], &[])
    }
}
