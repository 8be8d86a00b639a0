//! `drivelet csi ...`: a small CSI client for any CSI endpoint (drivelet's or another
//! driver's), to run a volume lifecycle by hand: info, create, delete, validate,
//! capacity, stage, unstage, publish, unpublish, expand, node-expand, and to read the
//! CSI v1.13 health API: health (one volume, or every unhealthy one), storage-health.
//!
//! Rules: every call prints its answer in plain words (or JSON with `-o json`); a gRPC
//! error prints its code and message and the command exits 1. Nothing here logs
//! secrets: the client never sends any.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tonic::transport::{Channel, Endpoint, Uri};

use super::args::{CsiCmd, Output};
use super::{size_arg, CliError};
use crate::grpc::proto::csi;

/// Errors of the CSI client.
#[derive(Debug, thiserror::Error)]
pub enum CsiCliError {
    /// The endpoint could not be reached.
    #[error("cannot connect to the CSI endpoint {path}: {reason}")]
    Connect {
        /// Socket path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The driver answered with an error.
    #[error("{method} failed: {code:?}: {message}")]
    Call {
        /// RPC name.
        method: &'static str,
        /// gRPC code.
        code: tonic::Code,
        /// Message.
        message: String,
    },
    /// An argument is malformed.
    #[error("{0}")]
    Usage(String),
}

fn call(method: &'static str) -> impl FnOnce(tonic::Status) -> CsiCliError {
    move |s| CsiCliError::Call { method, code: s.code(), message: s.message().to_string() }
}

/// Opens a channel over a unix socket.
pub async fn connect(path: &Path) -> Result<Channel, CsiCliError> {
    let p = path.to_path_buf();
    let err = |reason: String| CsiCliError::Connect { path: path.to_path_buf(), reason };
    Endpoint::try_from("http://[::]:50051")
        .map_err(|e| err(e.to_string()))?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let p = p.clone();
            async move {
                let s = tokio::net::UnixStream::connect(p).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
        .map_err(|e| {
            // The whole chain: "transport error" alone hides the OS error (refused,
            // permission denied, no such file).
            let mut reason = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                reason.push_str(&format!(": {c}"));
                cause = c.source();
            }
            err(format!("{reason} (is the driver running, and are you root?)"))
        })
}

/// How the volume is accessed.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// Block access instead of a filesystem.
    pub block: bool,
    /// Filesystem (mount access); empty for the driver's default.
    pub fs_type: String,
    /// Mount flags (mount access).
    pub mount_flags: Vec<String>,
    /// Access mode: `single-node-writer` (default), `single-node-reader-only`,
    /// `single-node-single-writer`, `single-node-multi-writer`.
    pub mode: String,
}

impl Access {
    /// The CSI capability.
    pub fn capability(&self) -> Result<csi::VolumeCapability, CsiCliError> {
        use csi::volume_capability::access_mode::Mode;
        use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
        let mode = match self.mode.as_str() {
            "" | "single-node-writer" => Mode::SingleNodeWriter,
            "single-node-reader-only" => Mode::SingleNodeReaderOnly,
            "single-node-single-writer" => Mode::SingleNodeSingleWriter,
            "single-node-multi-writer" => Mode::SingleNodeMultiWriter,
            other => return Err(CsiCliError::Usage(format!("unknown access mode {other}"))),
        };
        let access_type = if self.block {
            AccessType::Block(BlockVolume {})
        } else {
            AccessType::Mount(MountVolume {
                fs_type: self.fs_type.clone(),
                mount_flags: self.mount_flags.clone(),
                volume_mount_group: String::new(),
            })
        };
        Ok(csi::VolumeCapability { access_mode: Some(AccessMode { mode: mode as i32 }), access_type: Some(access_type) })
    }
}

/// Parses `key=value` parameters.
pub fn parse_params(kv: &[String]) -> Result<HashMap<String, String>, CsiCliError> {
    kv.iter()
        .map(|s| {
            s.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| CsiCliError::Usage(format!("parameter {s:?} is not key=value")))
        })
        .collect()
}

/// Plugin info, capabilities, readiness and node info.
pub async fn info(ch: Channel) -> Result<serde_json::Value, CsiCliError> {
    let mut id = csi::identity_client::IdentityClient::new(ch.clone());
    let mut node = csi::node_client::NodeClient::new(ch.clone());
    let mut ctrl = csi::controller_client::ControllerClient::new(ch);
    let pi = id.get_plugin_info(csi::GetPluginInfoRequest {}).await.map_err(call("GetPluginInfo"))?.into_inner();
    let pc = id.get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {}).await.map_err(call("GetPluginCapabilities"))?.into_inner();
    let probe = id.probe(csi::ProbeRequest {}).await.map_err(call("Probe"))?.into_inner();
    let ni = node.node_get_info(csi::NodeGetInfoRequest {}).await.map_err(call("NodeGetInfo"))?.into_inner();
    let nc = node.node_get_capabilities(csi::NodeGetCapabilitiesRequest {}).await.map_err(call("NodeGetCapabilities"))?.into_inner();
    let cc = ctrl.controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {}).await.ok().map(|r| r.into_inner());
    Ok(serde_json::json!({
        "name": pi.name,
        "vendor_version": pi.vendor_version,
        "ready": probe.ready,
        "plugin_capabilities": pc.capabilities.iter().map(plugin_capability).collect::<Vec<_>>(),
        "controller_capabilities": cc.map(|c| c.capabilities.iter().map(controller_capability).collect::<Vec<_>>()),
        "node_capabilities": nc.capabilities.iter().map(node_capability).collect::<Vec<_>>(),
        "node_id": ni.node_id,
        "max_volumes_per_node": ni.max_volumes_per_node,
        "topology": ni.accessible_topology.map(|t| t.segments),
    }))
}

/// CreateVolume; with `source`, a clone of that volume.
pub async fn create(
    ch: Channel,
    name: &str,
    required: u64,
    limit: u64,
    access: &Access,
    params: HashMap<String, String>,
    source: Option<&str>,
    secrets: HashMap<String, String>,
) -> Result<serde_json::Value, CsiCliError> {
    let mut ctrl = csi::controller_client::ControllerClient::new(ch);
    let to_i64 = |v: u64| i64::try_from(v).map_err(|_| CsiCliError::Usage(format!("{v} bytes is too large")));
    let req = csi::CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: Some(csi::CapacityRange { required_bytes: to_i64(required)?, limit_bytes: to_i64(limit)? }),
        volume_capabilities: vec![access.capability()?],
        parameters: params,
        volume_content_source: source.map(|id| csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Volume(csi::volume_content_source::VolumeSource { volume_id: id.to_string() })),
        }),
        secrets,
        ..Default::default()
    };
    let v = ctrl.create_volume(req).await.map_err(call("CreateVolume"))?.into_inner().volume.unwrap_or_default();
    let cloned_from = match v.content_source.and_then(|s| s.r#type) {
        Some(csi::volume_content_source::Type::Volume(s)) => Some(s.volume_id),
        _ => None,
    };
    Ok(serde_json::json!({
        "volume_id": v.volume_id,
        "cloned_from": cloned_from,
        "capacity_bytes": v.capacity_bytes,
        "volume_context": v.volume_context,
        "accessible_topology": v.accessible_topology.into_iter().map(|t| t.segments).collect::<Vec<_>>(),
    }))
}

/// DeleteVolume.
pub async fn delete(ch: Channel, id: &str) -> Result<serde_json::Value, CsiCliError> {
    let mut ctrl = csi::controller_client::ControllerClient::new(ch);
    ctrl.delete_volume(csi::DeleteVolumeRequest { volume_id: id.to_string(), ..Default::default() })
        .await
        .map_err(call("DeleteVolume"))?;
    Ok(serde_json::json!({ "deleted": id }))
}

/// A volume as ControllerGetVolume and ListVolumes show it.
fn volume_json(v: Option<csi::Volume>, status: Option<(Vec<String>, Option<csi::VolumeCondition>)>) -> serde_json::Value {
    let v = v.unwrap_or_default();
    let (nodes, condition) = status.unwrap_or_default();
    serde_json::json!({
        "volume_id": v.volume_id,
        "capacity_bytes": v.capacity_bytes,
        "volume_context": v.volume_context,
        "published_node_ids": nodes,
        "abnormal": condition.as_ref().is_some_and(|c| c.abnormal),
        "condition": condition.map(|c| c.message),
    })
}

/// ControllerGetVolume.
pub async fn get(ch: Channel, id: &str) -> Result<serde_json::Value, CsiCliError> {
    let mut ctrl = csi::controller_client::ControllerClient::new(ch);
    let r = ctrl
        .controller_get_volume(csi::ControllerGetVolumeRequest { volume_id: id.to_string() })
        .await
        .map_err(call("ControllerGetVolume"))?
        .into_inner();
    Ok(volume_json(r.volume, r.status.map(|s| (s.published_node_ids, s.volume_condition))))
}

/// ListVolumes, following `next_token` to the last page.
pub async fn list(ch: Channel) -> Result<serde_json::Value, CsiCliError> {
    let mut ctrl = csi::controller_client::ControllerClient::new(ch);
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let r = ctrl
            .list_volumes(csi::ListVolumesRequest { max_entries: 0, starting_token: token })
            .await
            .map_err(call("ListVolumes"))?
            .into_inner();
        out.extend(r.entries.into_iter().map(|e| volume_json(e.volume, e.status.map(|s| (s.published_node_ids, s.volume_condition)))));
        if r.next_token.is_empty() {
            break;
        }
        token = r.next_token;
    }
    Ok(serde_json::json!({ "volumes": out }))
}

/// ValidateVolumeCapabilities.
pub async fn validate(ch: Channel, id: &str, access: &Access) -> Result<serde_json::Value, CsiCliError> {
    let mut ctrl = csi::controller_client::ControllerClient::new(ch);
    let r = ctrl
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: id.to_string(),
            volume_capabilities: vec![access.capability()?],
            ..Default::default()
        })
        .await
        .map_err(call("ValidateVolumeCapabilities"))?
        .into_inner();
    Ok(serde_json::json!({ "confirmed": r.confirmed.is_some(), "message": r.message }))
}

/// GetCapacity.
pub async fn capacity(ch: Channel, params: HashMap<String, String>) -> Result<serde_json::Value, CsiCliError> {
    let mut ctrl = csi::controller_client::ControllerClient::new(ch);
    let r = ctrl
        .get_capacity(csi::GetCapacityRequest { parameters: params, ..Default::default() })
        .await
        .map_err(call("GetCapacity"))?
        .into_inner();
    Ok(serde_json::json!({
        "available_capacity": r.available_capacity,
        "maximum_volume_size": r.maximum_volume_size,
        "minimum_volume_size": r.minimum_volume_size,
    }))
}

/// A call's secrets from a file of `key=value` lines (none without a file).
fn read_secrets(file: Option<&Path>) -> Result<HashMap<String, String>, CsiCliError> {
    let mut secrets = HashMap::new();
    if let Some(f) = file {
        let text = std::fs::read_to_string(f).map_err(|e| CsiCliError::Usage(format!("cannot read the secrets file {}: {e}", f.display())))?;
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let (k, v) = line.split_once('=').ok_or_else(|| CsiCliError::Usage(format!("{}: a line without `=` (lines are key=value)", f.display())))?;
            secrets.insert(k.trim().to_string(), v.trim().to_string());
        }
    }
    Ok(secrets)
}

/// NodeStageVolume.
pub async fn stage(ch: Channel, id: &str, staging: &Path, secrets_file: Option<&Path>, access: &Access) -> Result<serde_json::Value, CsiCliError> {
    let secrets = read_secrets(secrets_file)?;
    let mut node = csi::node_client::NodeClient::new(ch);
    node.node_stage_volume(csi::NodeStageVolumeRequest {
        volume_id: id.to_string(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(access.capability()?),
        secrets,
        ..Default::default()
    })
    .await
    .map_err(call("NodeStageVolume"))?;
    Ok(serde_json::json!({ "staged": id, "at": staging }))
}

/// NodeUnstageVolume.
pub async fn unstage(ch: Channel, id: &str, staging: &Path) -> Result<serde_json::Value, CsiCliError> {
    let mut node = csi::node_client::NodeClient::new(ch);
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: id.to_string(),
        staging_target_path: staging.display().to_string(),
    })
    .await
    .map_err(call("NodeUnstageVolume"))?;
    Ok(serde_json::json!({ "unstaged": id, "at": staging }))
}

/// NodePublishVolume.
pub async fn publish(
    ch: Channel,
    id: &str,
    staging: &Path,
    target: &Path,
    access: &Access,
    readonly: bool,
) -> Result<serde_json::Value, CsiCliError> {
    let mut node = csi::node_client::NodeClient::new(ch);
    node.node_publish_volume(csi::NodePublishVolumeRequest {
        volume_id: id.to_string(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(access.capability()?),
        readonly,
        ..Default::default()
    })
    .await
    .map_err(call("NodePublishVolume"))?;
    Ok(serde_json::json!({ "published": id, "at": target, "readonly": readonly }))
}

/// NodeUnpublishVolume.
pub async fn unpublish(ch: Channel, id: &str, target: &Path) -> Result<serde_json::Value, CsiCliError> {
    let mut node = csi::node_client::NodeClient::new(ch);
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest { volume_id: id.to_string(), target_path: target.display().to_string() })
        .await
        .map_err(call("NodeUnpublishVolume"))?;
    Ok(serde_json::json!({ "unpublished": id, "at": target }))
}

/// ControllerExpandVolume to `size` bytes.
pub async fn expand(ch: Channel, id: &str, size: u64) -> Result<serde_json::Value, CsiCliError> {
    let mut ctrl = csi::controller_client::ControllerClient::new(ch);
    let required = i64::try_from(size).map_err(|_| CsiCliError::Usage(format!("{size} bytes is too large")))?;
    let r = ctrl
        .controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: id.to_string(),
            capacity_range: Some(csi::CapacityRange { required_bytes: required, limit_bytes: 0 }),
            ..Default::default()
        })
        .await
        .map_err(call("ControllerExpandVolume"))?
        .into_inner();
    Ok(serde_json::json!({ "volume_id": id, "capacity_bytes": r.capacity_bytes, "node_expansion_required": r.node_expansion_required }))
}

/// NodeExpandVolume at the volume's staging or target `path`.
pub async fn node_expand(ch: Channel, id: &str, path: &Path) -> Result<serde_json::Value, CsiCliError> {
    let mut node = csi::node_client::NodeClient::new(ch);
    let r = node
        .node_expand_volume(csi::NodeExpandVolumeRequest {
            volume_id: id.to_string(),
            volume_path: path.display().to_string(),
            ..Default::default()
        })
        .await
        .map_err(call("NodeExpandVolume"))?
        .into_inner();
    Ok(serde_json::json!({ "volume_id": id, "capacity_bytes": r.capacity_bytes }))
}

/// NodeGetVolumeStats at `path`.
pub async fn stats(ch: Channel, id: &str, path: &Path) -> Result<serde_json::Value, CsiCliError> {
    let mut node = csi::node_client::NodeClient::new(ch);
    let r = node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: id.to_string(),
            volume_path: path.display().to_string(),
            ..Default::default()
        })
        .await
        .map_err(call("NodeGetVolumeStats"))?
        .into_inner();
    let usage = |unit: csi::volume_usage::Unit| {
        r.usage.iter().find(|u| u.unit == unit as i32).map(|u| serde_json::json!({ "total": u.total, "used": u.used, "available": u.available }))
    };
    Ok(serde_json::json!({
        "volume_id": id,
        "bytes": usage(csi::volume_usage::Unit::Bytes),
        "inodes": usage(csi::volume_usage::Unit::Inodes),
        "abnormal": r.volume_condition.as_ref().is_some_and(|c| c.abnormal),
        "condition": r.volume_condition.map(|c| c.message),
    }))
}

/// A CSI v1.13 volume health in plain words: `healthy`, and each condition's status,
/// reason and message.
fn health_json(h: csi::VolumeHealth) -> serde_json::Value {
    let conditions: Vec<serde_json::Value> = h
        .health_statuses
        .iter()
        .map(|e| {
            serde_json::json!({
                "status": e.status().as_str_name(),
                "reason": e.reason,
                "message": e.message,
            })
        })
        .collect();
    serde_json::json!({ "volume_id": h.volume_id, "healthy": conditions.is_empty(), "conditions": conditions })
}

/// One volume's CSI v1.13 health: ControllerGetVolumeHealth, or with `node`
/// NodeGetVolumeHealth (with the optional staging and target paths).
pub async fn health(ch: Channel, id: &str, node: bool, staging: Option<&Path>, target: Option<&Path>) -> Result<serde_json::Value, CsiCliError> {
    let path = |p: Option<&Path>| p.map(|p| p.display().to_string()).unwrap_or_default();
    let h = if node {
        let mut n = csi::node_client::NodeClient::new(ch);
        let req = csi::NodeGetVolumeHealthRequest { volume_id: id.to_string(), volume_publish_path: path(target), staging_target_path: path(staging) };
        n.node_get_volume_health(req).await.map_err(call("NodeGetVolumeHealth"))?.into_inner().volume_health
    } else {
        let mut ctrl = csi::controller_client::ControllerClient::new(ch);
        let req = csi::ControllerGetVolumeHealthRequest { volume_id: id.to_string(), ..Default::default() };
        ctrl.controller_get_volume_health(req).await.map_err(call("ControllerGetVolumeHealth"))?.into_inner().volume_health
    };
    Ok(health_json(h.unwrap_or_else(|| csi::VolumeHealth { volume_id: id.to_string(), health_statuses: vec![] })))
}

/// Every volume with an adverse condition: ControllerListVolumeHealth to the last page.
pub async fn unhealthy(ch: Channel) -> Result<serde_json::Value, CsiCliError> {
    let mut ctrl = csi::controller_client::ControllerClient::new(ch);
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let r = ctrl
            .controller_list_volume_health(csi::ControllerListVolumeHealthRequest { starting_token: token, ..Default::default() })
            .await
            .map_err(call("ControllerListVolumeHealth"))?
            .into_inner();
        out.extend(r.entries.into_iter().map(health_json));
        if r.next_token.is_empty() {
            break;
        }
        token = r.next_token;
    }
    let summary = match out.len() {
        0 => "every volume is healthy".to_string(),
        1 => "1 volume has an adverse condition".to_string(),
        n => format!("{n} volumes have an adverse condition"),
    };
    Ok(serde_json::json!({ "summary": summary, "unhealthy_volumes": out }))
}

/// NodeGetStorageHealth: the node's storage, in plain words.
pub async fn storage_health(ch: Channel) -> Result<serde_json::Value, CsiCliError> {
    let mut node = csi::node_client::NodeClient::new(ch);
    let r = node.node_get_storage_health(csi::NodeGetStorageHealthRequest::default()).await.map_err(call("NodeGetStorageHealth"))?.into_inner();
    let conditions: Vec<serde_json::Value> = r
        .backend_health
        .iter()
        .map(|e| serde_json::json!({ "status": e.status().as_str_name(), "reason": e.reason, "message": e.message }))
        .collect();
    Ok(serde_json::json!({ "healthy": conditions.is_empty(), "conditions": conditions }))
}

/// Renders a JSON answer for people: one `key: value` line per field, sizes in binary
/// units (`2.0 GiB`; `-o json` keeps the exact bytes), lists joined by commas, nested
/// objects and lists of objects indented below their key.
pub fn plain(v: &serde_json::Value) -> String {
    let mut out = String::new();
    match v {
        serde_json::Value::Object(m) => plain_fields(m, 0, &mut out),
        other => out.push_str(&format!("{}\n", scalar("", other))),
    }
    out
}

/// Whether a field holds a size in bytes.
fn is_size(key: &str) -> bool {
    key.ends_with("_bytes") || key.ends_with("_capacity") || key.ends_with("_size") || key.ends_with("_bytes_total")
}

fn scalar(key: &str, v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".into(),
        serde_json::Value::Number(n) if is_size(key) => match n.as_u64() {
            Some(b) => crate::config::human_bytes(b),
            None => n.to_string(),
        },
        serde_json::Value::Array(a) if a.is_empty() => "-".into(),
        serde_json::Value::Array(a) => a.iter().map(|x| scalar(key, x)).collect::<Vec<_>>().join(", "),
        serde_json::Value::Object(m) if m.is_empty() => "-".into(),
        serde_json::Value::Object(m) => m.iter().map(|(k, x)| format!("{k}={}", scalar(k, x))).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

fn plain_fields(m: &serde_json::Map<String, serde_json::Value>, depth: usize, out: &mut String) {
    let pad = "  ".repeat(depth);
    for (k, v) in m {
        match v {
            serde_json::Value::Array(items) if items.iter().any(|x| x.is_object()) => {
                out.push_str(&format!("{pad}{k}:\n"));
                for item in items {
                    match item.as_object() {
                        Some(o) => {
                            let mut block = String::new();
                            plain_fields(o, depth + 2, &mut block);
                            // The first line of each item carries the list marker.
                            let marker = format!("{pad}  - ");
                            out.push_str(&block.replacen(&"  ".repeat(depth + 2), &marker, 1));
                        }
                        None => out.push_str(&format!("{pad}  - {}\n", scalar(k, item))),
                    }
                }
            }
            // Usage figures of one unit (`bytes`: total, used, available) are sizes.
            serde_json::Value::Object(o) if k == "bytes" => {
                let line = o.iter().map(|(k2, x)| format!("{k2} {}", scalar("_bytes", x))).collect::<Vec<_>>().join(", ");
                out.push_str(&format!("{pad}{k}: {line}\n"));
            }
            other => out.push_str(&format!("{pad}{k}: {}\n", scalar(k, other))),
        }
    }
}

/// The CSI name of a plugin capability, e.g. `CONTROLLER_SERVICE`, `ONLINE` expansion.
fn plugin_capability(c: &csi::PluginCapability) -> String {
    use csi::plugin_capability::Type;
    match &c.r#type {
        Some(Type::Service(s)) => s.r#type().as_str_name().to_string(),
        Some(Type::VolumeExpansion(e)) => format!("VOLUME_EXPANSION_{}", e.r#type().as_str_name()),
        None => "UNKNOWN".into(),
    }
}

/// The CSI name of a controller capability, e.g. `CREATE_DELETE_VOLUME`.
fn controller_capability(c: &csi::ControllerServiceCapability) -> String {
    match &c.r#type {
        Some(csi::controller_service_capability::Type::Rpc(r)) => r.r#type().as_str_name().to_string(),
        None => "UNKNOWN".into(),
    }
}

/// The CSI name of a node capability, e.g. `STAGE_UNSTAGE_VOLUME`.
fn node_capability(c: &csi::NodeServiceCapability) -> String {
    match &c.r#type {
        Some(csi::node_service_capability::Type::Rpc(r)) => r.r#type().as_str_name().to_string(),
        None => "UNKNOWN".into(),
    }
}

/// `drivelet csi`: one call to the endpoint (else the config's CSI socket), its answer
/// printed.
pub fn run(config: Option<PathBuf>, endpoint: Option<PathBuf>, output: Output, cmd: CsiCmd) -> Result<(), CliError> {
    let socket = match endpoint {
        Some(s) => s,
        None => crate::config::Config::load(config.as_deref())?.paths.csi_socket,
    };
    let rt = super::runtime()?;
    let usage = |e: CliError| CsiCliError::Usage(e.to_string());
    let answer = rt.block_on(async {
        let ch = connect(&socket).await?;
        match cmd {
            CsiCmd::Info => info(ch).await,
            CsiCmd::Create { name, size, limit, params, source, secrets_file, access } => {
                let (size, limit) = match (size_arg(&size), size_arg(&limit)) {
                    (Ok(s), Ok(l)) => (s, l),
                    (Err(e), _) | (_, Err(e)) => return Err(usage(e)),
                };
                let secrets = read_secrets(secrets_file.as_deref())?;
                create(ch, &name, size, limit, &access.access(), parse_params(&params)?, source.as_deref(), secrets).await
            }
            CsiCmd::Delete { id } => delete(ch, &id).await,
            CsiCmd::Get { id } => get(ch, &id).await,
            CsiCmd::List => list(ch).await,
            CsiCmd::Validate { id, access } => validate(ch, &id, &access.access()).await,
            CsiCmd::Capacity { params } => capacity(ch, parse_params(&params)?).await,
            CsiCmd::Stage { id, staging, secrets_file, access } => stage(ch, &id, &staging, secrets_file.as_deref(), &access.access()).await,
            CsiCmd::Unstage { id, staging } => unstage(ch, &id, &staging).await,
            CsiCmd::Publish { id, staging, target, readonly, access } => publish(ch, &id, &staging, &target, &access.access(), readonly).await,
            CsiCmd::Unpublish { id, target } => unpublish(ch, &id, &target).await,
            CsiCmd::Expand { id, size } => expand(ch, &id, size_arg(&size).map_err(usage)?).await,
            CsiCmd::NodeExpand { id, path } => node_expand(ch, &id, &path).await,
            CsiCmd::Stats { id, path } => stats(ch, &id, &path).await,
            CsiCmd::Health { id: Some(id), node, staging, target } => health(ch, &id, node, staging.as_deref(), target.as_deref()).await,
            CsiCmd::Health { id: None, node: true, .. } => {
                Err(CsiCliError::Usage("--node needs a volume id: NodeGetVolumeHealth asks about one volume".into()))
            }
            CsiCmd::Health { id: None, .. } => unhealthy(ch).await,
            CsiCmd::StorageHealth => storage_health(ch).await,
        }
    })?;
    match output {
        Output::Json => println!("{}", super::json(&answer)?),
        Output::Table => print!("{}", plain(&answer)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_output_names_sizes_in_binary_units_and_lists_in_words() {
        let v = serde_json::json!({
            "name": "csi.drivelet.io",
            "available_capacity": 6_436_159_488u64,
            "maximum_volume_size": 2_145_386_496u64,
            "ready": true,
            "controller_capabilities": ["CREATE_DELETE_VOLUME", "GET_CAPACITY"],
            "topology": {"topology.drivelet.io/node": "node-1"},
            "volumes": [{"volume_id": "a", "capacity_bytes": 67_108_864u64, "condition": null}],
            "bytes": {"total": 1_073_741_824u64, "used": 0, "available": 1_073_741_824u64},
        });
        let text = plain(&v);
        for want in [
            "available_capacity: 6.0 GiB\n",
            "maximum_volume_size: 2.0 GiB\n",
            "controller_capabilities: CREATE_DELETE_VOLUME, GET_CAPACITY\n",
            "topology: topology.drivelet.io/node=node-1\n",
            "volumes:\n  - capacity_bytes: 64.0 MiB\n    condition: -\n    volume_id: a\n",
            "bytes: available 1.0 GiB, total 1.0 GiB, used 0 B\n",
            "ready: true\n",
        ] {
            assert!(text.contains(want), "{want:?} not in:\n{text}");
        }
        assert!(!text.contains("Some(") && !text.contains("r#type"), "{text}");
    }

    #[test]
    fn capabilities_are_named_as_the_csi_spec_names_them() {
        use csi::controller_service_capability::rpc::Type as C;
        let c = csi::ControllerServiceCapability {
            r#type: Some(csi::controller_service_capability::Type::Rpc(csi::controller_service_capability::Rpc { r#type: C::CreateDeleteVolume as i32 })),
        };
        assert_eq!(controller_capability(&c), "CREATE_DELETE_VOLUME");
        use csi::plugin_capability::service::Type as S;
        let p = csi::PluginCapability {
            r#type: Some(csi::plugin_capability::Type::Service(csi::plugin_capability::Service { r#type: S::ControllerService as i32 })),
        };
        assert_eq!(plugin_capability(&p), "CONTROLLER_SERVICE");
        use csi::node_service_capability::rpc::Type as N;
        let n = csi::NodeServiceCapability {
            r#type: Some(csi::node_service_capability::Type::Rpc(csi::node_service_capability::Rpc { r#type: N::StageUnstageVolume as i32 })),
        };
        assert_eq!(node_capability(&n), "STAGE_UNSTAGE_VOLUME");
    }
}
