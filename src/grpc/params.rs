//! StorageClass parameters and volume capabilities: parsed and checked once, here.
//!
//! Parameters drivelet understands (all optional):
//! - `media`: `hdd`, `ssd`, `nvme`, `virtual` or `any` (default `any`);
//! - `layout`: `partition` (default) or `drive` (a whole drive per volume);
//! - `drivelet.io/on-node-deleted` ([`ON_NODE_DELETED`]): `keep-claims` (default) or
//!   `release-claims`, what the cluster duties do with a bound claim once its node's Node
//!   object is deleted (kept with a Warning Event, or deleted once no running pod uses it
//!   so a StatefulSet makes it again on a live node). CreateVolume only checks the value;
//!   the cluster duties read it from the StorageClass.
//!
//! Keys with the `csi.storage.k8s.io/` prefix belong to Kubernetes and are ignored;
//! any other key is an error, so a typo in a StorageClass is caught at once.

use std::collections::HashMap;

use super::proto::csi;
use super::status::{echo, FrontError};
use crate::actors::inventory::model::LayoutKind;
use crate::config::Media;

/// The StorageClass parameter saying what happens to a bound claim once its node's Node
/// object is deleted.
pub const ON_NODE_DELETED: &str = "drivelet.io/on-node-deleted";

/// What the cluster duties do with a claim of a deleted node (parameter
/// [`ON_NODE_DELETED`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnNodeDeleted {
    /// The claim stays bound, with a Warning Event saying where its data is (default).
    #[default]
    KeepClaims,
    /// The claim is deleted once no running pod uses it, so it can be made again on a
    /// live node.
    ReleaseClaims,
}

impl OnNodeDeleted {
    /// The parameter's values, as the StorageClass spells them.
    pub const VALUES: [&'static str; 2] = ["keep-claims", "release-claims"];

    /// Parses a value of the parameter; `""` is the default.
    pub fn parse(v: &str) -> Option<OnNodeDeleted> {
        match v {
            "keep-claims" | "" => Some(OnNodeDeleted::KeepClaims),
            "release-claims" => Some(OnNodeDeleted::ReleaseClaims),
            _ => None,
        }
    }

    /// The value as the StorageClass spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            OnNodeDeleted::KeepClaims => "keep-claims",
            OnNodeDeleted::ReleaseClaims => "release-claims",
        }
    }
}

/// Parsed StorageClass parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeParams {
    /// Media class, `None` for any.
    pub media: Option<Media>,
    /// Partition or whole drive.
    pub layout: LayoutKind,
    /// What happens to the claim once its node is deleted.
    pub on_node_deleted: OnNodeDeleted,
}

impl VolumeParams {
    /// Parses a parameter map.
    pub fn parse(params: &HashMap<String, String>) -> Result<VolumeParams, FrontError> {
        let mut out = VolumeParams { media: None, layout: LayoutKind::Partition, on_node_deleted: OnNodeDeleted::KeepClaims };
        let mut keys: Vec<&String> = params.keys().collect();
        keys.sort();
        for k in keys {
            let v = params[k].as_str();
            match k.as_str() {
                "media" => {
                    out.media = match v {
                        "any" | "" => None,
                        other => Some(Media::parse(other).ok_or_else(|| {
                            FrontError::InvalidArgument(format!(
                                "parameter \"media\" is {}; it must be one of hdd, ssd, nvme, virtual, any",
                                echo(other)
                            ))
                        })?),
                    }
                }
                "layout" => {
                    out.layout = match v {
                        "partition" | "" => LayoutKind::Partition,
                        "drive" => LayoutKind::Drive,
                        other => {
                            return Err(FrontError::InvalidArgument(format!(
                                "parameter \"layout\" is {}; it must be partition or drive",
                                echo(other)
                            )))
                        }
                    }
                }
                ON_NODE_DELETED => {
                    out.on_node_deleted = OnNodeDeleted::parse(v).ok_or_else(|| {
                        FrontError::InvalidArgument(format!(
                            "parameter \"{ON_NODE_DELETED}\" is {}; it must be keep-claims or release-claims",
                            echo(v)
                        ))
                    })?;
                }
                k if k.starts_with("csi.storage.k8s.io/") => {}
                other => {
                    return Err(FrontError::InvalidArgument(format!(
                        "unknown parameter {}; drivelet understands media, layout and {ON_NODE_DELETED}",
                        echo(other)
                    )))
                }
            }
        }
        Ok(out)
    }
}

/// Whether drivelet can serve a capability; malformed capabilities are errors.
/// Supported: single-node access modes, block access, or mount access with ext4/xfs.
pub fn capability_supported(cap: &csi::VolumeCapability) -> Result<bool, FrontError> {
    use csi::volume_capability::access_mode::Mode;
    use csi::volume_capability::AccessType;
    let mode = cap
        .access_mode
        .as_ref()
        .ok_or_else(|| FrontError::InvalidArgument("volume capability has no access_mode".into()))?;
    let mode = Mode::try_from(mode.mode)
        .map_err(|_| FrontError::InvalidArgument(format!("unknown access mode {}", mode.mode)))?;
    let mode_ok = match mode {
        Mode::Unknown => return Err(FrontError::InvalidArgument("access mode is UNKNOWN".into())),
        Mode::SingleNodeWriter | Mode::SingleNodeReaderOnly | Mode::SingleNodeSingleWriter | Mode::SingleNodeMultiWriter => true,
        _ => false,
    };
    let type_ok = match &cap.access_type {
        None => return Err(FrontError::InvalidArgument("volume capability has neither block nor mount access type".into())),
        Some(AccessType::Block(_)) => true,
        Some(AccessType::Mount(m)) => matches!(m.fs_type.as_str(), "" | "ext4" | "xfs"),
    };
    Ok(mode_ok && type_ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi::volume_capability::{access_mode::Mode, AccessMode, AccessType, BlockVolume, MountVolume};

    fn params(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn parameters_parse_and_typos_are_rejected() {
        let keep = OnNodeDeleted::KeepClaims;
        assert_eq!(VolumeParams::parse(&params(&[])).unwrap(), VolumeParams { media: None, layout: LayoutKind::Partition, on_node_deleted: keep });
        assert_eq!(
            VolumeParams::parse(&params(&[("media", "ssd"), ("layout", "drive"), ("csi.storage.k8s.io/pv/name", "x")])).unwrap(),
            VolumeParams { media: Some(Media::Ssd), layout: LayoutKind::Drive, on_node_deleted: keep }
        );
        for bad in [&[("media", "tape")][..], &[("layout", "stripe")], &[("meda", "ssd")]] {
            let e = VolumeParams::parse(&params(bad)).unwrap_err().to_string();
            assert!(e.contains(bad[0].0), "{e}");
        }
    }

    #[test]
    fn on_node_deleted_accepts_keep_and_release_claims_and_names_a_bad_value() {
        for (value, want) in [("keep-claims", OnNodeDeleted::KeepClaims), ("release-claims", OnNodeDeleted::ReleaseClaims), ("", OnNodeDeleted::KeepClaims)] {
            let parsed = VolumeParams::parse(&params(&[(ON_NODE_DELETED, value)])).unwrap();
            assert_eq!(parsed.on_node_deleted, want, "{value:?}");
        }
        for bad in ["release", "Release-Claims", "delete"] {
            let e = VolumeParams::parse(&params(&[(ON_NODE_DELETED, bad)])).unwrap_err();
            assert!(matches!(e, FrontError::InvalidArgument(_)), "{e}");
            let text = e.to_string();
            for part in [ON_NODE_DELETED, bad, "keep-claims", "release-claims"] {
                assert!(text.contains(part), "{text} names {part}");
            }
        }
    }

    fn cap(mode: i32, t: Option<AccessType>) -> csi::VolumeCapability {
        csi::VolumeCapability { access_mode: Some(AccessMode { mode }), access_type: t }
    }

    #[test]
    fn capabilities_are_classified() {
        let mount = |fs: &str| Some(AccessType::Mount(MountVolume { fs_type: fs.into(), ..Default::default() }));
        let block = Some(AccessType::Block(BlockVolume {}));
        assert!(capability_supported(&cap(Mode::SingleNodeWriter as i32, mount("ext4"))).unwrap());
        assert!(capability_supported(&cap(Mode::SingleNodeMultiWriter as i32, mount(""))).unwrap());
        assert!(capability_supported(&cap(Mode::SingleNodeReaderOnly as i32, block.clone())).unwrap());
        assert!(!capability_supported(&cap(Mode::MultiNodeMultiWriter as i32, block.clone())).unwrap());
        assert!(!capability_supported(&cap(Mode::SingleNodeWriter as i32, mount("btrfs"))).unwrap());
        assert!(capability_supported(&cap(Mode::Unknown as i32, block.clone())).is_err());
        assert!(capability_supported(&cap(99, block.clone())).is_err());
        assert!(capability_supported(&cap(Mode::SingleNodeWriter as i32, None)).is_err());
        assert!(capability_supported(&csi::VolumeCapability { access_mode: None, access_type: block }).is_err());
    }
}
