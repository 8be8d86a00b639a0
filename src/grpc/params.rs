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
//! - `drivelet.io/encryption` ([`ENCRYPTION`]): `fscrypt` encrypts each ext4 volume's
//!   data under a key of its own (wrapped by the key-encryption key of the Secret the
//!   class names as its node-stage secret); `none` or absent is plaintext. Block and
//!   xfs volumes of such a class are refused at CreateVolume.
//! - `drivelet.io/clone-in-use` ([`CLONE_IN_USE`]): `freeze` (default) or `refuse`, what
//!   a clone of a filesystem volume mounted read-write does (its filesystem frozen for
//!   a consistent copy, or the clone refused until no pod writes to it);
//!   `drivelet.io/clone-in-use-block` ([`CLONE_IN_USE_BLOCK`]): `refuse` (default) or
//!   `crash-inconsistent`, the same for a block volume a pod writes to (nothing to
//!   freeze: copied as it is written, the clone marked so); `drivelet.io/clone-freeze-limit`
//!   ([`CLONE_FREEZE_LIMIT`]): the longest a clone may freeze its source's writers, a
//!   duration from `1ms` to `10m` (default: the node's `volumes.freeze_limit`).
//!
//! Keys with the `csi.storage.k8s.io/` prefix belong to Kubernetes and are ignored;
//! any other key is an error, so a typo in a StorageClass is caught at once.

use std::collections::HashMap;

use super::proto::csi;
use super::status::{echo, FrontError};
use crate::words::clone_in_use::{BlockCloneInUse, CloneInUse, CLONE_FREEZE_LIMIT, CLONE_IN_USE, CLONE_IN_USE_BLOCK};
use crate::words::encryption::{Encryption, ENCRYPTION};
use crate::words::on_node_deleted::{OnNodeDeleted, ON_NODE_DELETED};
use crate::words::{LayoutKind, Media};

/// Parsed StorageClass parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeParams {
    /// Media class, `None` for any.
    pub media: Option<Media>,
    /// Partition or whole drive.
    pub layout: LayoutKind,
    /// What happens to the claim once its node is deleted.
    pub on_node_deleted: OnNodeDeleted,
    /// Encryption at rest.
    pub encryption: Encryption,
    /// The longest a clone of a volume in use may freeze its writers, when the class
    /// says.
    pub clone_freeze_limit: Option<std::time::Duration>,
}

/// The longest freeze a class may allow a clone.
pub const MAX_CLONE_FREEZE: std::time::Duration = std::time::Duration::from_secs(600);

impl VolumeParams {
    /// Parses a parameter map.
    pub fn parse(params: &HashMap<String, String>) -> Result<VolumeParams, FrontError> {
        let mut out = VolumeParams { media: None, layout: LayoutKind::Partition, on_node_deleted: OnNodeDeleted::KeepClaims, encryption: Encryption::None, clone_freeze_limit: None };
        let mut keys: Vec<&String> = params.keys().collect();
        keys.sort();
        for k in keys {
            let v = params[k].as_str();
            match k.as_str() {
                "media" => {
                    out.media = match v {
                        "any" | "" => None,
                        other => Some(Media::parse(other).ok_or_else(|| bad("media", other, "one of hdd, ssd, nvme, virtual, any"))?),
                    }
                }
                "layout" => {
                    out.layout = match v {
                        "partition" | "" => LayoutKind::Partition,
                        "drive" => LayoutKind::Drive,
                        other => return Err(bad("layout", other, "partition or drive")),
                    }
                }
                ON_NODE_DELETED => {
                    out.on_node_deleted = OnNodeDeleted::parse(v).ok_or_else(|| bad(ON_NODE_DELETED, v, "keep-claims or release-claims"))?;
                }
                ENCRYPTION => {
                    out.encryption = Encryption::parse(v).ok_or_else(|| bad(ENCRYPTION, v, "fscrypt or none"))?;
                }
                CLONE_IN_USE => {
                    CloneInUse::parse(v).ok_or_else(|| bad(CLONE_IN_USE, v, CloneInUse::VALUES))?;
                }
                CLONE_IN_USE_BLOCK => {
                    BlockCloneInUse::parse(v).ok_or_else(|| bad(CLONE_IN_USE_BLOCK, v, BlockCloneInUse::VALUES))?;
                }
                CLONE_FREEZE_LIMIT => {
                    let d = crate::config::parse_duration(v).ok().filter(|d| !d.is_zero() && *d <= MAX_CLONE_FREEZE);
                    out.clone_freeze_limit = Some(d.ok_or_else(|| bad(CLONE_FREEZE_LIMIT, v, "a duration from 1ms to 10m, such as 500ms, 10s or 2m"))?);
                }
                k if k.starts_with("csi.storage.k8s.io/") => {}
                other => return Err(FrontError::UnknownParameter { key: other.to_string() }),
            }
        }
        Ok(out)
    }
}

/// A known parameter with a value it does not take.
fn bad(key: &'static str, value: &str, allowed: &'static str) -> FrontError {
    FrontError::BadParameter { key, value: value.to_string(), allowed }
}

/// Whether drivelet can serve a capability; malformed capabilities are errors.
/// Supported: single-node access modes, block access, or mount access with ext4/xfs.
pub fn capability_supported(cap: &csi::VolumeCapability) -> Result<bool, FrontError> {
    Ok(unsupported_reason(cap)?.is_none())
}

/// The access modes drivelet serves, as the request names them and as Kubernetes does.
const SERVED_MODES: &str = "SINGLE_NODE_WRITER or SINGLE_NODE_MULTI_WRITER (ReadWriteOnce), \
SINGLE_NODE_SINGLE_WRITER (ReadWriteOncePod) or SINGLE_NODE_READER_ONLY";

/// The Kubernetes access mode a CSI one comes from, where there is one.
fn kubernetes_mode(mode: csi::volume_capability::access_mode::Mode) -> Option<&'static str> {
    use csi::volume_capability::access_mode::Mode;
    match mode {
        Mode::MultiNodeReaderOnly => Some("ReadOnlyMany"),
        Mode::MultiNodeMultiWriter => Some("ReadWriteMany"),
        Mode::SingleNodeWriter | Mode::SingleNodeMultiWriter => Some("ReadWriteOnce"),
        Mode::SingleNodeSingleWriter => Some("ReadWriteOncePod"),
        _ => None,
    }
}

/// Why drivelet cannot serve a well-formed capability, naming the value asked for and
/// what would be accepted (`None`: it can); a malformed capability is an error that
/// says what is missing or wrong.
pub fn unsupported_reason(cap: &csi::VolumeCapability) -> Result<Option<String>, FrontError> {
    use csi::volume_capability::access_mode::Mode;
    use csi::volume_capability::AccessType;
    let mode = cap.access_mode.as_ref().ok_or_else(|| {
        FrontError::InvalidArgument(format!("volume capability has no access_mode; drivelet serves {SERVED_MODES}"))
    })?;
    let mode = Mode::try_from(mode.mode).map_err(|_| {
        FrontError::InvalidArgument(format!("access mode {} is not a CSI access mode; drivelet serves {SERVED_MODES}", mode.mode))
    })?;
    let mode_reason = match mode {
        Mode::Unknown => {
            return Err(FrontError::InvalidArgument(format!("access mode is UNKNOWN; drivelet serves {SERVED_MODES}")))
        }
        Mode::SingleNodeWriter | Mode::SingleNodeReaderOnly | Mode::SingleNodeSingleWriter | Mode::SingleNodeMultiWriter => None,
        other => Some(match kubernetes_mode(other) {
            Some(k8s) => format!(
                "access mode {} ({k8s}): a drivelet volume lives on one node's drive, so drivelet serves {SERVED_MODES}",
                other.as_str_name()
            ),
            None => format!("access mode {}: drivelet serves {SERVED_MODES}", other.as_str_name()),
        }),
    };
    let type_reason = match &cap.access_type {
        None => {
            return Err(FrontError::InvalidArgument(
                "volume capability has neither block nor mount access type; ask for block access or a mount with ext4 or xfs".into(),
            ))
        }
        Some(AccessType::Block(_)) => None,
        Some(AccessType::Mount(m)) => match m.fs_type.as_str() {
            "" | "ext4" | "xfs" => None,
            other => Some(format!("filesystem {}: drivelet makes ext4 or xfs (or serves raw block access)", echo(other))),
        },
    };
    Ok(match (mode_reason, type_reason) {
        (None, None) => None,
        (Some(r), None) | (None, Some(r)) => Some(r),
        (Some(a), Some(b)) => Some(format!("{a}; and {b}")),
    })
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
        assert_eq!(VolumeParams::parse(&params(&[])).unwrap(), VolumeParams { media: None, layout: LayoutKind::Partition, on_node_deleted: keep, encryption: Encryption::None, clone_freeze_limit: None });
        assert_eq!(
            VolumeParams::parse(&params(&[("media", "ssd"), ("layout", "drive"), ("csi.storage.k8s.io/pv/name", "x")])).unwrap(),
            VolumeParams { media: Some(Media::Ssd), layout: LayoutKind::Drive, on_node_deleted: keep, encryption: Encryption::None, clone_freeze_limit: None }
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
            assert!(matches!(e, FrontError::BadParameter { .. }), "{e}");
            let text = e.to_string();
            for part in [ON_NODE_DELETED, bad, "keep-claims", "release-claims"] {
                assert!(text.contains(part), "{text} names {part}");
            }
        }
    }

    #[test]
    fn encryption_takes_fscrypt_or_none_and_names_a_bad_value() {
        assert_eq!(VolumeParams::parse(&params(&[(ENCRYPTION, "fscrypt")])).unwrap().encryption, Encryption::Fscrypt);
        assert_eq!(VolumeParams::parse(&params(&[(ENCRYPTION, "none")])).unwrap().encryption, Encryption::None);
        let e = VolumeParams::parse(&params(&[(ENCRYPTION, "luks")])).unwrap_err().to_string();
        assert!(e.contains(ENCRYPTION) && e.contains("luks") && e.contains("fscrypt"), "{e}");
    }

    #[test]
    fn the_clone_in_use_parameters_take_their_values_and_name_a_bad_one() {
        let ok = |kv: &[(&str, &str)]| VolumeParams::parse(&params(kv)).unwrap();
        assert_eq!(ok(&[(CLONE_IN_USE, "freeze"), (CLONE_IN_USE_BLOCK, "crash-inconsistent")]).clone_freeze_limit, None);
        ok(&[(CLONE_IN_USE, "refuse"), (CLONE_IN_USE_BLOCK, "refuse")]);
        assert_eq!(ok(&[(CLONE_FREEZE_LIMIT, "2500ms")]).clone_freeze_limit, Some(std::time::Duration::from_millis(2500)));
        assert_eq!(ok(&[(CLONE_FREEZE_LIMIT, "10m")]).clone_freeze_limit, Some(MAX_CLONE_FREEZE));
        for (key, bad, allowed) in [
            (CLONE_IN_USE, "snapshot", "freeze or refuse"),
            (CLONE_IN_USE_BLOCK, "freeze", "refuse or crash-inconsistent"),
            (CLONE_FREEZE_LIMIT, "0s", "from 1ms to 10m"),
            (CLONE_FREEZE_LIMIT, "11m", "from 1ms to 10m"),
            (CLONE_FREEZE_LIMIT, "ten", "from 1ms to 10m"),
        ] {
            let e = VolumeParams::parse(&params(&[(key, bad)])).unwrap_err();
            assert!(matches!(e, FrontError::BadParameter { .. }), "{e}");
            let text = e.to_string();
            assert!(text.contains(key) && text.contains(bad) && text.contains(allowed), "{text}");
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

    #[test]
    fn refusals_name_the_value_asked_for_and_what_is_accepted() {
        let mount = |fs: &str| Some(AccessType::Mount(MountVolume { fs_type: fs.into(), ..Default::default() }));
        let block = Some(AccessType::Block(BlockVolume {}));
        let reason = |c: csi::VolumeCapability| unsupported_reason(&c).unwrap().unwrap_or_default();
        let error = |c: csi::VolumeCapability| unsupported_reason(&c).unwrap_err().to_string();
        // (capability, words the answer must hold)
        let cases: Vec<(String, Vec<&str>)> = vec![
            (reason(cap(Mode::SingleNodeWriter as i32, mount("vfat"))), vec!["filesystem \"vfat\"", "ext4 or xfs"]),
            (reason(cap(Mode::MultiNodeMultiWriter as i32, block.clone())), vec!["MULTI_NODE_MULTI_WRITER", "ReadWriteMany", "ReadWriteOnce"]),
            (reason(cap(Mode::MultiNodeReaderOnly as i32, mount("ext4"))), vec!["MULTI_NODE_READER_ONLY", "ReadOnlyMany", "SINGLE_NODE_WRITER"]),
            (reason(cap(Mode::MultiNodeSingleWriter as i32, mount("btrfs"))), vec!["MULTI_NODE_SINGLE_WRITER", "filesystem \"btrfs\""]),
            (error(cap(Mode::Unknown as i32, block.clone())), vec!["UNKNOWN", "SINGLE_NODE_WRITER"]),
            (error(cap(99, block.clone())), vec!["access mode 99", "SINGLE_NODE_WRITER"]),
            (error(cap(Mode::SingleNodeWriter as i32, None)), vec!["neither block nor mount", "ext4 or xfs"]),
            (error(csi::VolumeCapability { access_mode: None, access_type: block.clone() }), vec!["no access_mode", "ReadWriteOnce"]),
        ];
        for (got, words) in cases {
            for w in words {
                assert!(got.contains(w), "{got:?} lacks {w:?}");
            }
            assert!(!got.contains("Some(") && !got.contains("{"), "Debug output in {got:?}");
        }
        assert_eq!(unsupported_reason(&cap(Mode::SingleNodeSingleWriter as i32, mount("xfs"))).unwrap(), None);
        assert_eq!(unsupported_reason(&cap(Mode::SingleNodeReaderOnly as i32, block)).unwrap(), None);
    }
}
