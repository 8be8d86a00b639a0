//! Property tests of input validation: every check that stands between a caller (a CSI
//! request, a StorageClass, a config file) and the disks, fed arbitrary and hostile
//! input.
//!
//! Rules checked, for any input:
//! - no check panics;
//! - a CSI name or id is accepted only when it is 1 to 128 bytes without the control
//!   characters the CSI spec bans;
//! - StorageClass parameters are accepted only with known keys (or Kubernetes' own
//!   `csi.storage.k8s.io/` ones) and known values, and a refusal names the key;
//! - a capability is servable only with a single-node access mode and block access or
//!   an ext4/xfs mount; an unknown access mode is an error, never servable;
//! - a capacity range is accepted only with non-negative bounds and limit 0 or at least
//!   required, and the size chosen for it is aligned, at least the minimum and inside
//!   the range;
//! - a ListVolumes token is honoured only when it is this run's, and round-trips ids;
//! - a path is accepted only when it is absolute, free of NUL, `.` and `..`, not a
//!   symlink itself, and resolves under an allowed root (not the root itself);
//! - a mount flag list is accepted only when every flag is on the documented allow-list,
//!   and what goes to mount(2) as data is exactly the accepted filesystem options;
//! - a config file of arbitrary text or bytes loads or is refused with a message; in a
//!   well-formed TOML file a refused value names its key, and an unknown key is named
//!   in the error.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use proptest::prelude::*;

use crate::actors::volumes::model::{size_for, CapacityRange};
use crate::config::{Config, ConfigError};
use crate::disk::mount::parse_mount_flags;
use crate::disk::beneath;
use crate::grpc::valid::{check_id, range_of};
use crate::grpc::params::{capability_supported, VolumeParams};
use crate::words::on_node_deleted::ON_NODE_DELETED;
use crate::grpc::proto::csi;
use crate::grpc::{list_token, parse_list_token};

/// Cases per property: `PROPTEST_CASES` when set (the on-demand long run), else
/// `default` (the bounded run).
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Strings that mix plain text with the characters validation cares about.
fn hostile_string(max: usize) -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-z0-9-]{1,12}",
        Just("\0".to_string()),
        Just("\u{1}".to_string()),
        Just("\u{7f}".to_string()),
        Just("\u{85}".to_string()),
        Just("\t\n\r".to_string()),
        Just("名前".to_string()),
        Just(",".to_string()),
        Just(" ".to_string()),
        Just("=".to_string()),
        Just("/".to_string()),
        Just("..".to_string()),
        any::<char>().prop_map(String::from),
    ];
    proptest::collection::vec(piece, 0..max).prop_map(|v| v.concat())
}

/// The CSI spec's banned characters in names and ids.
fn banned(c: char) -> bool {
    matches!(c as u32, 0x00..=0x08 | 0x0B | 0x0C | 0x0E..=0x1F | 0x7F..=0x9F)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(256)))]

    #[test]
    fn names_and_ids_are_accepted_only_within_the_csi_rules(v in prop_oneof![hostile_string(40), "[a-z]{120,140}", any::<String>()]) {
        let ok = check_id("volume_id", &v).is_ok();
        let valid = !v.is_empty() && v.len() <= 128 && !v.chars().any(banned);
        prop_assert_eq!(ok, valid, "{:?}", v);
        if let Err(s) = check_id("volume_id", &v) {
            prop_assert_eq!(s.code(), tonic::Code::InvalidArgument);
            prop_assert!(s.message().contains("volume_id"), "{}", s.message());
        }
    }

    #[test]
    fn storage_class_parameters_are_accepted_only_when_known(
        pairs in proptest::collection::vec((
            prop_oneof![Just("media".to_string()), Just("layout".to_string()), Just(ON_NODE_DELETED.to_string()), Just("csi.storage.k8s.io/pvc/name".to_string()), hostile_string(6)],
            prop_oneof![Just("ssd".to_string()), Just("any".to_string()), Just("drive".to_string()), Just("partition".to_string()), Just("release-claims".to_string()), Just("keep-claims".to_string()), Just(String::new()), hostile_string(6)],
        ), 0..5)
    ) {
        let params: HashMap<String, String> = pairs.into_iter().collect();
        match VolumeParams::parse(&params) {
            Ok(_) => {
                for (k, v) in &params {
                    match k.as_str() {
                        "media" => prop_assert!(["", "any", "hdd", "ssd", "nvme", "virtual"].contains(&v.as_str()), "media={:?}", v),
                        "layout" => prop_assert!(["", "partition", "drive"].contains(&v.as_str()), "layout={:?}", v),
                        ON_NODE_DELETED => prop_assert!(["", "keep-claims", "release-claims"].contains(&v.as_str()), "on-node-deleted={:?}", v),
                        k => prop_assert!(k.starts_with("csi.storage.k8s.io/"), "unknown key {:?} accepted", k),
                    }
                }
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(params.keys().any(|k| msg.contains(&crate::grpc::status::echo(k))), "{} names no key of {:?}", msg, params);
            }
        }
    }

    #[test]
    fn capabilities_are_servable_only_when_single_node_and_ext4_xfs_or_block(
        mode in prop_oneof![0i32..=8, any::<i32>()],
        block in any::<bool>(),
        fs in prop_oneof![Just(String::new()), Just("ext4".to_string()), Just("xfs".to_string()), Just("btrfs".to_string()), hostile_string(4)],
        has_mode in any::<bool>(),
    ) {
        use csi::volume_capability::{access_mode::Mode, AccessMode, AccessType, BlockVolume, MountVolume};
        let cap = csi::VolumeCapability {
            access_mode: has_mode.then_some(AccessMode { mode }),
            access_type: Some(if block { AccessType::Block(BlockVolume {}) } else { AccessType::Mount(MountVolume { fs_type: fs.clone(), ..Default::default() }) }),
        };
        let known = Mode::try_from(mode).ok().filter(|m| *m != Mode::Unknown);
        match capability_supported(&cap) {
            Ok(servable) => {
                prop_assert!(has_mode && known.is_some(), "mode {} accepted", mode);
                let single = matches!(known, Some(Mode::SingleNodeWriter | Mode::SingleNodeReaderOnly | Mode::SingleNodeSingleWriter | Mode::SingleNodeMultiWriter));
                prop_assert_eq!(servable, single && (block || ["", "ext4", "xfs"].contains(&fs.as_str())));
            }
            Err(_) => prop_assert!(!has_mode || known.is_none(), "a known mode {} was an error", mode),
        }
    }

    #[test]
    fn capacity_ranges_are_accepted_only_when_well_formed_and_sizes_fall_inside(
        required in prop_oneof![any::<i64>(), 0i64..(1 << 34), Just(i64::MAX), Just(-1)],
        limit in prop_oneof![any::<i64>(), 0i64..(1 << 34), Just(0), Just(i64::MAX)],
        minimum in prop_oneof![Just(1u64 << 20), Just(16u64 << 20), Just(300u64 << 20)],
    ) {
        let r = csi::CapacityRange { required_bytes: required, limit_bytes: limit };
        match range_of(Some(&r)) {
            Ok(range) => {
                prop_assert!(required >= 0 && limit >= 0 && (limit == 0 || limit >= required));
                if let Ok(size) = size_for(range, 1 << 30, minimum) {
                    prop_assert_eq!(size % crate::disk::gpt::ALIGN, 0);
                    prop_assert!(size >= minimum && range.admits(size), "size {} for {:?}", size, range);
                }
            }
            Err(s) => {
                prop_assert_eq!(s.code(), tonic::Code::InvalidArgument);
                prop_assert!(required < 0 || limit < 0 || (limit != 0 && limit < required));
            }
        }
        // No range at all is accepted, as the default.
        let none = range_of(None).is_ok_and(|r| r == CapacityRange { required: 0, limit: 0 });
        prop_assert!(none, "no capacity range is the default range");
    }

    #[test]
    fn list_tokens_are_honoured_only_from_this_run(nonce in any::<u64>(), other in any::<u64>(), id in hostile_string(8), junk in any::<String>()) {
        let t = list_token(nonce, &id);
        prop_assert_eq!(parse_list_token(nonce, &t), (!id.is_empty()).then(|| id.clone()));
        if other != nonce {
            prop_assert_eq!(parse_list_token(other, &t), None);
        }
        if let Some(back) = parse_list_token(nonce, &junk) {
            prop_assert!(!back.is_empty() && junk.ends_with(&format!(":{back}")), "{:?} -> {:?}", junk, back);
        }
    }

    #[test]
    fn mount_flags_are_accepted_only_from_the_allow_list(
        flags in proptest::collection::vec(prop_oneof![
            Just("ro".to_string()), Just("noatime".to_string()), Just("discard".to_string()), Just("data=ordered".to_string()),
            Just("commit=30".to_string()), Just("commit=0".to_string()), Just("commit=301".to_string()), Just("commit=007".to_string()),
            Just("ro,exec".to_string()), Just("exec".to_string()), Just("bind".to_string()), Just("remount".to_string()),
            Just("errors=panic".to_string()), Just("logbsize=64k".to_string()), Just("nosuid nodev".to_string()),
            hostile_string(4), "[a-z]{60,70}",
        ], 0..6)
    ) {
        let generic = ["ro", "nosuid", "nodev", "noexec", "noatime", "nodiratime", "relatime", "strictatime", "sync", "dirsync", "lazytime"];
        let data = ["discard", "nodiscard", "nobarrier", "barrier", "nouuid", "noquota", "quota", "usrquota", "grpquota", "prjquota", "user_xattr", "acl", "noacl", "inode64", "largeio"];
        let keyed = |f: &str| match f.split_once('=') {
            Some(("data", v)) => ["ordered", "writeback", "journal"].contains(&v),
            Some(("commit", v)) => !v.starts_with('0') && v.bytes().all(|b| b.is_ascii_digit()) && v.parse::<u32>().is_ok_and(|n| (1..=300).contains(&n)),
            Some(("errors", v)) => ["remount-ro", "continue"].contains(&v),
            Some(("logbsize", v)) => ["32k", "64k", "128k", "256k"].contains(&v),
            _ => false,
        };
        match parse_mount_flags(&flags) {
            Ok(opts) => {
                for f in &flags {
                    prop_assert!(generic.contains(&f.as_str()) || data.contains(&f.as_str()) || keyed(f), "{:?} accepted", f);
                }
                prop_assert_eq!(opts.readonly, flags.iter().any(|f| f == "ro"));
                let fs_opts: BTreeSet<&str> = flags.iter().map(String::as_str).filter(|f| !generic.contains(f)).collect();
                let passed: BTreeSet<&str> = opts.data.split(',').filter(|s| !s.is_empty()).collect();
                prop_assert_eq!(passed, fs_opts);
            }
            Err(e) => prop_assert!(e.contains("mount flag"), "{}", e),
        }
    }
}

/// A directory with an allowed root, a way out of it by symlink, and a loop.
struct Tree {
    _dir: tempfile::TempDir,
    base: PathBuf,
    root: PathBuf,
}

fn tree() -> Tree {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let base = std::fs::canonicalize(dir.path()).unwrap_or_else(|e| panic!("canonicalize: {e}"));
    let root = base.join("root");
    for d in ["root/sub/deeper", "outside"] {
        std::fs::create_dir_all(base.join(d)).unwrap_or_else(|e| panic!("{d}: {e}"));
    }
    for (link, to) in [("root/escape", base.join("outside")), ("root/inside", root.join("sub")), ("root/sub/up", base.clone()), ("root/dangling", base.join("nowhere"))] {
        std::os::unix::fs::symlink(&to, base.join(link)).unwrap_or_else(|e| panic!("{link}: {e}"));
    }
    Tree { _dir: dir, base, root }
}

/// Where `p` lands: its deepest existing ancestor resolved, the rest appended.
fn landing(p: &Path) -> Option<PathBuf> {
    let mut existing = p.to_path_buf();
    let mut rest = Vec::new();
    loop {
        if let Ok(r) = std::fs::canonicalize(&existing) {
            return Some(rest.iter().rev().fold(r, |acc: PathBuf, n: &std::ffi::OsString| acc.join(n)));
        }
        rest.push(existing.file_name()?.to_os_string());
        if !existing.pop() {
            return None;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(512)))]

    #[test]
    fn accepted_paths_resolve_under_an_allowed_root(
        start in 0usize..4,
        segments in proptest::collection::vec(prop_oneof![
            Just("sub"), Just("deeper"), Just("escape"), Just("inside"), Just("up"), Just("dangling"), Just(".."), Just("."),
            Just(""), Just("new"), Just("root"), Just("outside"), Just("a\0b"),
        ], 0..6),
    ) {
        use std::os::unix::ffi::OsStrExt;
        let t = tree();
        let prefix = [t.root.display().to_string(), t.base.display().to_string(), "/".to_string(), "relative".to_string()][start].clone();
        let text = std::iter::once(prefix.as_str()).chain(segments.iter().copied()).collect::<Vec<_>>().join("/");
        let p = PathBuf::from(std::ffi::OsStr::from_bytes(text.as_bytes()));
        let roots = std::slice::from_ref(&t.root);
        let opened = beneath::open(&p, roots);
        if let Ok(found) = &opened {
            prop_assert!(p.is_absolute() && !text.contains('\0'), "{:?}", text);
            prop_assert!(!text.split('/').any(|s| s == "." || s == ".."), "{:?}", text);
            // Not one component beneath the root is a symlink.
            let rel = p.strip_prefix(&t.root).map_err(|_| TestCaseError::fail(format!("{text:?} is not under the root")))?;
            let mut at = t.root.clone();
            for c in rel.components() {
                at.push(c);
                prop_assert!(!std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()), "{:?} passes the symlink {:?}", text, at);
            }
            prop_assert_eq!(found.is_some(), std::fs::symlink_metadata(&p).is_ok(), "{:?}", text);
            let lands = landing(&p);
            prop_assert!(lands.as_ref().is_some_and(|l| l.starts_with(&t.root) && *l != t.root), "{:?} lands at {:?}", text, lands);
        }
        // Making it as a directory makes nothing outside the root, and only what `open`
        // accepted.
        let outside_before = std::fs::read_dir(t.base.join("outside")).map(|d| d.count()).unwrap_or(0);
        let made = beneath::make_dir(&p, roots);
        prop_assert!(made.is_err() || opened.is_ok(), "{:?} made but refused by open", text);
        prop_assert_eq!(std::fs::read_dir(t.base.join("outside")).map(|d| d.count()).unwrap_or(0), outside_before, "{:?} made something outside", text);
        prop_assert!(!t.base.join("nowhere").exists(), "{:?} followed the dangling link", text);
    }
}

/// The documented config (every key with its default), split into sections of
/// `key = value` lines.
fn documented_keys() -> Vec<(String, String, String)> {
    let text = include_str!("../config/drivelet.toml");
    let mut section = String::new();
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
        } else if let Some((k, v)) = line.split_once('=').filter(|_| !line.starts_with('#')) {
            out.push((section.clone(), k.trim().to_string(), v.trim().to_string()));
        }
    }
    out
}

/// Writes `bytes` to a file and loads it.
fn load_bytes(bytes: &[u8]) -> Result<Config, ConfigError> {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let p = dir.path().join("c.toml");
    std::fs::write(&p, bytes).unwrap_or_else(|e| panic!("write: {e}"));
    Config::load(Some(&p))
}

/// Values that are valid TOML (a TOML syntax error is refused without a key: the
/// parser names none) but wrong for most keys.
fn hostile_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_string()), Just("-1".to_string()), Just("9223372036854775807".to_string()), Just("\"18446744073709551616\"".to_string()),
        Just("\"\"".to_string()), Just("\"0s\"".to_string()), Just("\"1ms\"".to_string()), Just("\"99999999999999999999h\"".to_string()),
        Just("\"10 GiB\"".to_string()), Just("\"1EiB\"".to_string()), Just("\"../../etc\"".to_string()), Just("\"relative/path\"".to_string()),
        Just("true".to_string()), Just("[]".to_string()), Just("[\"a\", 1]".to_string()), Just("{}".to_string()), Just("1.5".to_string()),
        Just("\"a\\u0000b\"".to_string()), "\"[ -~&&[^\"\\\\]]{0,12}\"", any::<i64>().prop_map(|n| n.to_string()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(128)))]

    #[test]
    fn config_values_that_are_refused_name_their_key(
        picks in proptest::collection::vec((any::<proptest::sample::Index>(), hostile_value()), 1..3),
    ) {
        let keys = documented_keys();
        let mut changed = Vec::new();
        let mut sections: Vec<(String, Vec<String>)> = Vec::new();
        for (i, v) in &picks {
            let (s, k, _) = &keys[i.index(keys.len())];
            if changed.iter().any(|(cs, ck): &(String, String)| cs == s && ck == k) {
                continue;
            }
            changed.push((s.clone(), k.clone()));
            match sections.iter_mut().find(|(n, _)| n == s) {
                Some((_, lines)) => lines.push(format!("{k} = {v}")),
                None => sections.push((s.clone(), vec![format!("{k} = {v}")])),
            }
        }
        let text: String = sections.iter().map(|(s, lines)| format!("[{s}]\n{}\n", lines.join("\n"))).collect();
        let text = format!("[driver]\nnode_name = \"n\"\n{}", text.replacen("[driver]\n", "", 1));
        match load_bytes(text.as_bytes()) {
            Ok(_) => {}
            Err(ConfigError::Invalid { key, .. }) => {
                prop_assert!(keys.iter().any(|(s, k, _)| format!("{s}.{k}") == key || key.starts_with(&format!("{s}."))), "unknown key {:?} in {}", key, text);
            }
            Err(ConfigError::Load { reason, .. }) => {
                // Duplicate keys are a TOML error of their own; any other refusal names
                // one of the keys that were changed.
                prop_assert!(
                    changed.iter().any(|(_, k)| reason.contains(k.as_str())) || reason.contains("duplicate"),
                    "{:?} names none of {:?}:\n{}", reason, changed, text
                );
            }
        }
    }

    #[test]
    fn unknown_config_keys_are_named(section in any::<proptest::sample::Index>(), key in "[a-z_]{3,12}") {
        let keys = documented_keys();
        let s = &keys[section.index(keys.len())].0;
        // `[driver.topology]` is a map: any key is a segment.
        prop_assume!(s != "driver.topology" && !keys.iter().any(|(ks, kk, _)| ks == s && *kk == key));
        let text = format!("[{s}]\n{key} = 1\n");
        match load_bytes(text.as_bytes()) {
            Err(ConfigError::Load { reason, .. }) => prop_assert!(reason.contains(&key), "{} does not name {}", reason, key),
            other => prop_assert!(false, "{:?} for an unknown key {}", other.map(|_| ()), key),
        }
    }

    #[test]
    fn config_files_of_arbitrary_text_or_bytes_load_or_are_refused(
        text in "[\\[\\]a-z_.=\" 0-9\n#{},-]{0,200}",
        bytes in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        for input in [text.as_bytes(), &bytes[..]] {
            match load_bytes(input) {
                Ok(c) => prop_assert!(c.validate().is_ok()),
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
        }
    }
}
