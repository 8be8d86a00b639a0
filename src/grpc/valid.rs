//! The front's validators: each takes a request's parameters and answers what the call
//! asks of the volume manager (its message, or the checked values), or the reason it is
//! refused, so that a handler reads: validate, ask ([`super::Front::ask`]), answer.
//!
//! Rules:
//! - a CSI name or id is present, at most 128 bytes and free of the control characters
//!   the spec bans ([`check_id`]); a node path is present and at most PATH_MAX
//!   ([`path_field`]);
//! - the ids a call names are recorded on its span (`volume.id`, `volume.name`,
//!   `node.name`, `snapshot.id`, `snapshot.name`) here and only here, as they are
//!   checked ([`id`]); the handler's `instrument` declares the fields;
//! - the checks run in the order the request's fields are listed in the CSI spec, so the
//!   first problem found is the one reported;
//! - the words of a refusal live in [`FrontError`]; secrets are never read.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use tonic::Status;

use super::params::{capability_supported, unsupported_reason, VolumeParams};
use super::proto::csi;
use super::status::{echo, FrontError};
use super::Front;
use crate::actors::volumes::model::{minimum_size, CapacityRange};
use crate::actors::volumes::{
    AttachVolume, CreateSnapshot, CreateVolume, DeleteSnapshot, DeleteVolume, DetachVolume, ExpandVolume, GetCapacity, GetVolume,
    GetVolumeStatus, NodeExpandVolume, PublishArgs, PublishVolume, Secrets, StageArgs, StageVolume, UnpublishVolume, UnstageVolume,
    VolumeStats,
};

/// Longest path a node call takes: the kernel's PATH_MAX.
const MAX_PATH: usize = 4096;

/// Longest CSI name or id.
const MAX_ID: usize = 128;

fn invalid(msg: impl Into<String>) -> Status {
    FrontError::InvalidArgument(msg.into()).into()
}

/// The ids a call names: each is checked as a CSI id ([`check_id`]) under its field's
/// name in the request and recorded on the call's span under its dotted name.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Id {
    /// `volume_id`, as `volume.id`.
    Volume,
    /// CreateVolume's `name`, as `volume.name`.
    VolumeName,
    /// CreateSnapshot's `source_volume_id`, as `volume.id`.
    SourceVolume,
    /// `node_id`, as `node.name`.
    Node,
    /// CreateSnapshot's `name`, as `snapshot.name`.
    SnapshotName,
    /// `snapshot_id`, as `snapshot.id`.
    Snapshot,
}

impl Id {
    /// The field as the request names it, and as the span does.
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Id::Volume => ("volume_id", "volume.id"),
            Id::VolumeName => ("name", "volume.name"),
            Id::SourceVolume => ("source_volume_id", "volume.id"),
            Id::Node => ("node_id", "node.name"),
            Id::SnapshotName => ("name", "snapshot.name"),
            Id::Snapshot => ("snapshot_id", "snapshot.id"),
        }
    }
}

/// Checks the id `v` a call names and records it on the call's span.
pub(crate) fn id(which: Id, v: &str) -> Result<(), Status> {
    let (field, span) = which.names();
    check_id(field, v)?;
    tracing::Span::current().record(span, v);
    Ok(())
}

/// Checks a CSI name or id: present, at most 128 bytes, no control characters.
pub(crate) fn check_id(field: &'static str, v: &str) -> Result<(), Status> {
    if v.is_empty() {
        return Err(FrontError::Required { field }.into());
    }
    if v.len() > MAX_ID {
        return Err(FrontError::TooLong { field, len: v.len(), limit: MAX_ID }.into());
    }
    // The CSI spec bans U+0000-0008, U+000B, U+000C, U+000E-001F and U+007F-009F.
    if v.chars().any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r')) {
        return Err(invalid(format!("{field} contains control characters")));
    }
    Ok(())
}

/// A path a node call names: present and at most PATH_MAX.
pub(crate) fn path_field(field: &'static str, v: &str) -> Result<PathBuf, Status> {
    if v.is_empty() {
        return Err(FrontError::Required { field }.into());
    }
    if v.len() > MAX_PATH {
        return Err(FrontError::TooLong { field, len: v.len(), limit: MAX_PATH }.into());
    }
    Ok(PathBuf::from(v))
}

/// An optional path of NodeGetVolumeHealth: empty, or absolute and at most PATH_MAX.
fn optional_path(field: &'static str, v: &str) -> Result<(), Status> {
    if v.len() > MAX_PATH {
        return Err(FrontError::TooLong { field, len: v.len(), limit: MAX_PATH }.into());
    }
    if !v.is_empty() && !v.starts_with('/') {
        return Err(invalid(format!("{field} must be an absolute path")));
    }
    if v.contains('\0') {
        return Err(invalid(format!("{field} contains a NUL byte")));
    }
    Ok(())
}

/// The one capability a call names (`volume_capability`), which it must name.
fn capability(cap: Option<csi::VolumeCapability>) -> Result<csi::VolumeCapability, Status> {
    cap.ok_or_else(|| FrontError::Required { field: "volume_capability" }.into())
}

/// What a set of capabilities asks for: block access, and the filesystem for mount
/// access. Every capability must be servable and all must agree.
pub(crate) fn access_of(caps: &[csi::VolumeCapability]) -> Result<(bool, String), Status> {
    use csi::volume_capability::AccessType;
    if caps.is_empty() {
        return Err(FrontError::Required { field: "volume_capabilities" }.into());
    }
    let mut block = None;
    let mut fs = String::new();
    for c in caps {
        if let Some(reason) = unsupported_reason(c)? {
            return Err(FrontError::UnsupportedCapability { reason }.into());
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

/// A capacity range's bounds are not negative.
fn range_signs(r: &csi::CapacityRange) -> Result<(), Status> {
    if r.required_bytes < 0 || r.limit_bytes < 0 {
        return Err(FrontError::NegativeRange { required: r.required_bytes, limit: r.limit_bytes }.into());
    }
    Ok(())
}

/// A capacity range as the volume manager takes it (none: no bounds).
pub(crate) fn range_of(r: Option<&csi::CapacityRange>) -> Result<CapacityRange, Status> {
    let Some(r) = r else { return Ok(CapacityRange { required: 0, limit: 0 }) };
    range_signs(r)?;
    if r.limit_bytes != 0 && r.limit_bytes < r.required_bytes {
        return Err(FrontError::LimitBelowRequired { required: r.required_bytes, limit: r.limit_bytes }.into());
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

/// A class's parameters as the volume manager keeps them: the `csi.storage.k8s.io/`
/// ones (Kubernetes') left out.
fn class_parameters(parameters: &HashMap<String, String>) -> BTreeMap<String, String> {
    parameters.iter().filter(|(k, _)| !k.starts_with("csi.storage.k8s.io/")).map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// The PV and claim a CreateVolume is made for, from the provisioner's
/// `--extra-create-metadata` parameters (empty where it does not say).
fn binding_of(parameters: &HashMap<String, String>) -> crate::words::Binding {
    let get = |k: &str| parameters.get(k).cloned().unwrap_or_default();
    crate::words::Binding {
        pv: get("csi.storage.k8s.io/pv/name"),
        claim_namespace: get("csi.storage.k8s.io/pvc/namespace"),
        claim_name: get("csi.storage.k8s.io/pvc/name"),
        ..Default::default()
    }
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

/// CreateVolume: the create, for this node only.
pub(crate) fn create_volume(front: &Front, req: csi::CreateVolumeRequest) -> Result<CreateVolume, Status> {
    id(Id::VolumeName, &req.name)?;
    let (block, fs_type) = access_of(&req.volume_capabilities)?;
    let range = range_of(req.capacity_range.as_ref())?;
    let params = VolumeParams::parse(&req.parameters)?;
    let source = source_of(req.volume_content_source.as_ref())?;
    let from_snapshot = source.as_ref().is_some_and(|(_, snap)| *snap);
    if !req.mutable_parameters.is_empty() {
        let mut keys: Vec<String> = req.mutable_parameters.keys().map(|k| echo(k)).collect();
        keys.sort();
        return Err(invalid(format!(
            "mutable_parameters {} are not supported: drivelet offers no MODIFY_VOLUME; put parameters in the StorageClass",
            keys.join(", ")
        )));
    }
    if params.encryption == crate::words::encryption::Encryption::Fscrypt {
        let fs = if fs_type.is_empty() { front.cfg.volumes.default_fs.as_str() } else { fs_type.as_str() };
        let what = if block { Some("a block volume") } else if fs != "ext4" { Some("an xfs filesystem") } else { None };
        if let Some(what) = what {
            return Err(FrontError::UnsupportedCapability {
                reason: format!(
                    "{what} cannot be encrypted: drivelet.io/encryption: fscrypt is the kernel's ext4 encryption; ask for ext4 \
                     (csi.storage.k8s.io/fstype: ext4), or use a StorageClass without drivelet.io/encryption"
                ),
            }
            .into());
        }
    }
    if let Some(t) = &req.accessibility_requirements {
        if !t.requisite.is_empty() && !t.requisite.iter().any(|t| front.topology_matches(t)) {
            return Err(FrontError::OtherTopology { node: front.cfg.driver.node_name.clone() }.into());
        }
    }
    Ok(CreateVolume {
        range,
        media: params.media,
        layout: params.layout,
        block,
        fs_type,
        parameters: class_parameters(&req.parameters),
        source: source.map(|(id, _)| id),
        from_snapshot,
        binding: binding_of(&req.parameters),
        secrets: Secrets(req.secrets),
        name: req.name,
    })
}

/// DeleteVolume.
pub(crate) fn delete_volume(req: csi::DeleteVolumeRequest) -> Result<DeleteVolume, Status> {
    id(Id::Volume, &req.volume_id)?;
    Ok(DeleteVolume { volume_id: req.volume_id })
}

/// ControllerPublishVolume: an attachment to this node (`here`) only.
pub(crate) fn attach(here: &str, req: csi::ControllerPublishVolumeRequest) -> Result<AttachVolume, Status> {
    id(Id::Volume, &req.volume_id)?;
    id(Id::Node, &req.node_id)?;
    let cap = capability(req.volume_capability)?;
    let (block, fs_type) = access_of(std::slice::from_ref(&cap))?;
    if req.readonly {
        return Err(invalid(
            "readonly is not supported (PUBLISH_READONLY is not advertised); ask for the SINGLE_NODE_READER_ONLY access mode instead",
        ));
    }
    if req.node_id != here {
        return Err(FrontError::UnknownNode { node_id: req.node_id, here: here.to_string() }.into());
    }
    Ok(AttachVolume { volume_id: req.volume_id, node_id: req.node_id, block, fs_type })
}

/// ControllerUnpublishVolume: without a node id, from every node.
pub(crate) fn detach(req: csi::ControllerUnpublishVolumeRequest) -> Result<DetachVolume, Status> {
    id(Id::Volume, &req.volume_id)?;
    let node_id = if req.node_id.is_empty() {
        None
    } else {
        id(Id::Node, &req.node_id)?;
        Some(req.node_id)
    };
    Ok(DetachVolume { volume_id: req.volume_id, node_id })
}

/// ValidateVolumeCapabilities: the volume asked about, with capabilities to confirm.
pub(crate) fn validate_capabilities(req: &csi::ValidateVolumeCapabilitiesRequest) -> Result<GetVolume, Status> {
    id(Id::Volume, &req.volume_id)?;
    if req.volume_capabilities.is_empty() {
        return Err(FrontError::Required { field: "volume_capabilities" }.into());
    }
    Ok(GetVolume { volume_id: req.volume_id.clone() })
}

/// ControllerExpandVolume: a grow to a size the request must give.
pub(crate) fn expand(req: csi::ControllerExpandVolumeRequest) -> Result<ExpandVolume, Status> {
    id(Id::Volume, &req.volume_id)?;
    let Some(range) = req.capacity_range.as_ref() else {
        return Err(invalid("capacity_range is required: say how large the volume should become"));
    };
    let range = range_of(Some(range))?;
    if let Some(cap) = &req.volume_capability {
        access_of(std::slice::from_ref(cap))?;
    }
    Ok(ExpandVolume { volume_id: req.volume_id, range })
}

/// ControllerGetVolume, ControllerGetVolumeHealth: the volume asked about.
pub(crate) fn volume(volume_id: String) -> Result<GetVolumeStatus, Status> {
    id(Id::Volume, &volume_id)?;
    Ok(GetVolumeStatus { volume_id })
}

/// GetCapacity: the question for the published view, and whether this node could
/// serve the request at all (a capability drivelet cannot serve, another topology or a
/// class filesystem it cannot make: no capacity, not an error).
pub(crate) fn capacity(front: &Front, req: &csi::GetCapacityRequest) -> Result<(bool, GetCapacity), Status> {
    let params = VolumeParams::parse(&req.parameters)?;
    let mut servable = true;
    for cap in &req.volume_capabilities {
        servable &= capability_supported(cap)?;
    }
    if let Some(t) = &req.accessible_topology {
        servable &= front.topology_matches(t);
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
                let fs = if m.fs_type.is_empty() { front.cfg.volumes.default_fs.as_str() } else { m.fs_type.as_str() };
                minimum_size(false, fs)
            }
            _ => minimum_size(true, ""),
        })
        .chain(class_fs.map(|fs| minimum_size(false, fs)))
        .max()
        .unwrap_or_else(|| minimum_size(true, ""));
    Ok((servable, GetCapacity { media: params.media, layout: params.layout, minimum }))
}

/// CreateSnapshot.
pub(crate) fn create_snapshot(req: csi::CreateSnapshotRequest) -> Result<CreateSnapshot, Status> {
    id(Id::SnapshotName, &req.name)?;
    id(Id::SourceVolume, &req.source_volume_id)?;
    Ok(CreateSnapshot { parameters: class_parameters(&req.parameters), name: req.name, source_volume_id: req.source_volume_id })
}

/// DeleteSnapshot.
pub(crate) fn delete_snapshot(req: csi::DeleteSnapshotRequest) -> Result<DeleteSnapshot, Status> {
    id(Id::Snapshot, &req.snapshot_id)?;
    Ok(DeleteSnapshot { snapshot_id: req.snapshot_id })
}

/// NodeGetVolumeHealth: the volume asked about; its paths need only be well-formed.
pub(crate) fn node_volume_health(req: csi::NodeGetVolumeHealthRequest) -> Result<GetVolumeStatus, Status> {
    let m = volume(req.volume_id)?;
    optional_path("volume_publish_path", &req.volume_publish_path)?;
    optional_path("staging_target_path", &req.staging_target_path)?;
    Ok(m)
}

/// NodeStageVolume.
pub(crate) fn stage(req: csi::NodeStageVolumeRequest) -> Result<StageVolume, Status> {
    id(Id::Volume, &req.volume_id)?;
    let path = path_field("staging_target_path", &req.staging_target_path)?;
    let cap = capability(req.volume_capability)?;
    let (block, fs_type) = access_of(std::slice::from_ref(&cap))?;
    let (readonly, _) = mode_of(&cap);
    let args = StageArgs { path, block, fs_type, flags: mount_flags(&cap), readonly, secrets: Secrets(req.secrets) };
    Ok(StageVolume { volume_id: req.volume_id, args })
}

/// NodeUnstageVolume.
pub(crate) fn unstage(req: csi::NodeUnstageVolumeRequest) -> Result<UnstageVolume, Status> {
    id(Id::Volume, &req.volume_id)?;
    let path = path_field("staging_target_path", &req.staging_target_path)?;
    Ok(UnstageVolume { volume_id: req.volume_id, path })
}

/// NodePublishVolume: from the staging path, which it must name (STAGE_UNSTAGE_VOLUME
/// is advertised).
pub(crate) fn publish(req: csi::NodePublishVolumeRequest) -> Result<PublishVolume, Status> {
    id(Id::Volume, &req.volume_id)?;
    let target = path_field("target_path", &req.target_path)?;
    let cap = capability(req.volume_capability)?;
    let (block, _) = access_of(std::slice::from_ref(&cap))?;
    if req.staging_target_path.is_empty() {
        return Err(FrontError::StagingPathMissing.into());
    }
    let staging = PathBuf::from(&req.staging_target_path);
    let (ro_mode, single_writer) = mode_of(&cap);
    let args = PublishArgs { target, staging, block, readonly: req.readonly || ro_mode, single_writer, flags: mount_flags(&cap) };
    Ok(PublishVolume { volume_id: req.volume_id, args })
}

/// NodeUnpublishVolume.
pub(crate) fn unpublish(req: csi::NodeUnpublishVolumeRequest) -> Result<UnpublishVolume, Status> {
    id(Id::Volume, &req.volume_id)?;
    let target = path_field("target_path", &req.target_path)?;
    Ok(UnpublishVolume { volume_id: req.volume_id, target })
}

/// NodeExpandVolume: the grow, and the size the request requires (0: none), which the
/// answer checks.
pub(crate) fn node_expand(req: csi::NodeExpandVolumeRequest) -> Result<(NodeExpandVolume, i64), Status> {
    id(Id::Volume, &req.volume_id)?;
    let path = path_field("volume_path", &req.volume_path)?;
    if let Some(r) = &req.capacity_range {
        range_signs(r)?;
    }
    let required = req.capacity_range.map_or(0, |r| r.required_bytes);
    Ok((NodeExpandVolume { volume_id: req.volume_id, path }, required))
}

/// NodeGetVolumeStats.
pub(crate) fn volume_stats(req: csi::NodeGetVolumeStatsRequest) -> Result<VolumeStats, Status> {
    id(Id::Volume, &req.volume_id)?;
    let path = path_field("volume_path", &req.volume_path)?;
    Ok(VolumeStats { volume_id: req.volume_id, path })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(r: Result<impl std::fmt::Debug, Status>) -> String {
        let s = r.unwrap_err();
        assert_eq!(s.code(), tonic::Code::InvalidArgument, "{}", s.message());
        s.message().to_string()
    }

    fn cap() -> csi::VolumeCapability {
        use csi::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
        csi::VolumeCapability {
            access_mode: Some(AccessMode { mode: Mode::SingleNodeWriter as i32 }),
            access_type: Some(AccessType::Mount(MountVolume::default())),
        }
    }

    /// Each validator refuses in the words the handlers used before they shared them.
    #[test]
    fn validators_refuse_in_the_same_words() {
        let stage = |volume_id: &str, path: &str, cap: Option<csi::VolumeCapability>| {
            stage(csi::NodeStageVolumeRequest {
                volume_id: volume_id.into(),
                staging_target_path: path.into(),
                volume_capability: cap,
                ..Default::default()
            })
        };
        assert_eq!(words(stage("", "/s", Some(cap()))), "volume_id is required");
        assert_eq!(words(stage(&"v".repeat(129), "/s", Some(cap()))), "volume_id is 129 bytes long; the limit is 128");
        assert_eq!(words(stage("v\u{1}", "/s", Some(cap()))), "volume_id contains control characters");
        assert_eq!(words(stage("v", "", Some(cap()))), "staging_target_path is required");
        assert_eq!(words(stage("v", &"p".repeat(4097), Some(cap()))), "staging_target_path is 4097 bytes long; the limit is 4096");
        assert_eq!(words(stage("v", "/s", None)), "volume_capability is required");
        assert!(stage("v", "/s", Some(cap())).is_ok());
        assert_eq!(words(access_of(&[])), "volume_capabilities is required");
        let negative = csi::CapacityRange { required_bytes: -1, limit_bytes: 5 };
        assert_eq!(
            words(range_of(Some(&negative))),
            "capacity_range has required_bytes -1 and limit_bytes 5; neither may be negative (0: no bound)"
        );
        let below = csi::CapacityRange { required_bytes: 9, limit_bytes: 5 };
        assert_eq!(words(range_of(Some(&below))), "capacity_range limit_bytes 5 is below required_bytes 9");
        let node_expand = node_expand(csi::NodeExpandVolumeRequest {
            volume_id: "v".into(),
            volume_path: "/p".into(),
            capacity_range: Some(negative),
            ..Default::default()
        });
        assert_eq!(words(node_expand), "capacity_range has required_bytes -1 and limit_bytes 5; neither may be negative (0: no bound)");
        let publish = publish(csi::NodePublishVolumeRequest {
            volume_id: "v".into(),
            target_path: "/t".into(),
            volume_capability: Some(cap()),
            ..Default::default()
        });
        assert_eq!(publish.unwrap_err().message(), "staging_target_path is required: stage the volume first (NodeStageVolume)");
        let attach = attach("n1", csi::ControllerPublishVolumeRequest {
            volume_id: "v".into(),
            node_id: "n1".into(),
            volume_capability: Some(cap()),
            readonly: true,
            ..Default::default()
        });
        assert!(words(attach).starts_with("readonly is not supported (PUBLISH_READONLY is not advertised)"));
        let m = detach(csi::ControllerUnpublishVolumeRequest { volume_id: "v".into(), ..Default::default() }).unwrap();
        assert_eq!((m.volume_id.as_str(), m.node_id), ("v", None));
        let expand = expand(csi::ControllerExpandVolumeRequest { volume_id: "v".into(), ..Default::default() });
        assert_eq!(words(expand), "capacity_range is required: say how large the volume should become");
        assert_eq!(words(create_snapshot(csi::CreateSnapshotRequest { name: "s".into(), ..Default::default() })), "source_volume_id is required");
        assert_eq!(words(delete_snapshot(csi::DeleteSnapshotRequest::default())), "snapshot_id is required");
    }

    #[test]
    fn optional_paths_are_empty_or_absolute_and_bounded() {
        assert!(optional_path("p", "").is_ok());
        assert!(optional_path("p", "/var/lib/kubelet/x").is_ok());
        for bad in ["relative/x", "/a\0b"] {
            assert_eq!(optional_path("p", bad).unwrap_err().code(), tonic::Code::InvalidArgument, "{bad:?}");
        }
        assert_eq!(optional_path("p", &format!("/{}", "a".repeat(MAX_PATH))).unwrap_err().code(), tonic::Code::InvalidArgument);
    }
}
