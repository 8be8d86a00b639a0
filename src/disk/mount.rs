//! CSI mount flags, and what `/proc/self/mountinfo` lists at a path (for reports and
//! tests: every mount, bind and unmount goes through [`super::beneath`], on
//! descriptors).
//!
//! Rules:
//! - CSI mount flags pass an allow-list ([`parse_mount_flags`]): generic flags become
//!   `MsFlags`, a few filesystem options become mount data, everything else is refused
//!   with the offending flag named; no flag can smuggle a second option (`,`), spaces,
//!   NUL, or a value outside its list;
//! - mount points are compared as given (absolute, not canonicalised) with mountinfo's
//!   unescaped mount points; the topmost entry at a path is the one that is visible.

use std::path::Path;

use nix::mount::MsFlags;

use super::mounts::{read_mountinfo, MountEntry};
use super::DiskError;


/// Longest accepted single mount flag.
const MAX_FLAG_LEN: usize = 64;

/// Validated mount options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    /// Generic flags for `mount(2)`.
    pub flags: MsFlags,
    /// Filesystem-specific options, comma-joined (empty for none).
    pub data: String,
    /// Whether the mount is read-only (`ro`).
    pub readonly: bool,
}

impl Default for MountOptions {
    /// A plain writable mount.
    fn default() -> Self {
        MountOptions { flags: MsFlags::empty(), data: String::new(), readonly: false }
    }
}

/// Generic flags accepted by [`parse_mount_flags`].
const GENERIC_FLAGS: &[(&str, MsFlags)] = &[
    ("ro", MsFlags::MS_RDONLY),
    ("nosuid", MsFlags::MS_NOSUID),
    ("nodev", MsFlags::MS_NODEV),
    ("noexec", MsFlags::MS_NOEXEC),
    ("noatime", MsFlags::MS_NOATIME),
    ("nodiratime", MsFlags::MS_NODIRATIME),
    ("relatime", MsFlags::MS_RELATIME),
    ("strictatime", MsFlags::MS_STRICTATIME),
    ("sync", MsFlags::MS_SYNCHRONOUS),
    ("dirsync", MsFlags::MS_DIRSYNC),
    ("lazytime", MsFlags::MS_LAZYTIME),
];

/// Filesystem options without a value accepted by [`parse_mount_flags`].
const DATA_FLAGS: &[&str] = &[
    "discard", "nodiscard", "nobarrier", "barrier", "nouuid", "noquota", "quota", "usrquota", "grpquota", "prjquota",
    "user_xattr", "acl", "noacl", "inode64", "largeio",
];

/// Whether `key=value` is an accepted filesystem option.
fn valid_keyed(key: &str, value: &str) -> bool {
    match key {
        "data" => matches!(value, "ordered" | "writeback" | "journal"),
        "commit" => {
            value.bytes().all(|b| b.is_ascii_digit())
                && !value.starts_with('0')
                && value.parse::<u32>().is_ok_and(|n| (1..=300).contains(&n))
        }
        "errors" => matches!(value, "remount-ro" | "continue"),
        "logbsize" => matches!(value, "32k" | "64k" | "128k" | "256k"),
        _ => false,
    }
}

/// Parses CSI mount flags against the allow-list. Duplicates are accepted (and kept
/// once); anything not on the list is an error naming the flag.
pub fn parse_mount_flags(flags: &[String]) -> Result<MountOptions, String> {
    let mut opts = MountOptions::default();
    let mut data: Vec<&str> = Vec::new();
    for flag in flags {
        let shown: String = flag.chars().take(MAX_FLAG_LEN).collect();
        if flag.len() > MAX_FLAG_LEN {
            return Err(format!("mount flag {shown:?}... is longer than {MAX_FLAG_LEN} bytes"));
        }
        if flag.is_empty() || flag.chars().any(|c| c == ',' || c == '\0' || c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "mount flag {shown:?} is empty or contains a comma, whitespace or a control character; give one option per flag"
            ));
        }
        if let Some((_, f)) = GENERIC_FLAGS.iter().find(|(name, _)| name == flag) {
            opts.flags |= *f;
            opts.readonly |= *f == MsFlags::MS_RDONLY;
            continue;
        }
        let allowed = match flag.split_once('=') {
            Some((key, value)) => valid_keyed(key, value),
            None => DATA_FLAGS.contains(&flag.as_str()),
        };
        if !allowed {
            return Err(format!("mount flag {shown:?} is not supported"));
        }
        if !data.contains(&flag.as_str()) {
            data.push(flag);
        }
    }
    opts.data = data.join(",");
    Ok(opts)
}

/// Mount entries whose mount point is exactly `target`, bottom first.
pub fn mounts_at(target: &Path) -> Result<Vec<MountEntry>, DiskError> {
    let all = read_mountinfo().map_err(DiskError::io("read /proc/self/mountinfo"))?;
    Ok(all.into_iter().filter(|m| m.mount_point == target).collect())
}

/// Whether a mount entry is read-only (`ro` in its per-mount options).
pub fn is_readonly(entry: &MountEntry) -> bool {
    entry.options.split(',').any(|o| o == "ro")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(flags: &[&str]) -> Result<MountOptions, String> {
        parse_mount_flags(&flags.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn generic_flags_become_ms_flags_and_ro_marks_readonly() {
        let o = parse(&["ro", "noatime", "nosuid", "nodev", "noexec", "lazytime"]).unwrap();
        assert!(o.readonly);
        assert_eq!(
            o.flags,
            MsFlags::MS_RDONLY
                | MsFlags::MS_NOATIME
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV
                | MsFlags::MS_NOEXEC
                | MsFlags::MS_LAZYTIME
        );
        assert_eq!(o.data, "");
    }

    #[test]
    fn no_flags_mean_a_plain_writable_mount() {
        assert_eq!(parse(&[]).unwrap(), MountOptions::default());
    }

    #[test]
    fn filesystem_options_become_comma_joined_data_without_duplicates() {
        let o = parse(&["discard", "data=ordered", "commit=30", "discard", "logbsize=256k", "errors=remount-ro"]).unwrap();
        assert!(!o.readonly);
        assert_eq!(o.flags, MsFlags::empty());
        assert_eq!(o.data, "discard,data=ordered,commit=30,logbsize=256k,errors=remount-ro");
    }

    #[test]
    fn every_listed_option_is_accepted() {
        for f in [
            "nodiratime", "relatime", "strictatime", "sync", "dirsync", "nodiscard", "nobarrier", "barrier", "nouuid",
            "noquota", "quota", "usrquota", "grpquota", "prjquota", "user_xattr", "acl", "noacl", "inode64", "largeio",
            "data=writeback", "data=journal", "commit=1", "commit=300", "errors=continue", "logbsize=32k",
            "logbsize=64k", "logbsize=128k",
        ] {
            assert!(parse(&[f]).is_ok(), "{f} should be accepted");
        }
    }

    #[test]
    fn flags_off_the_list_or_malformed_are_refused_by_name() {
        let long = "a".repeat(65);
        for f in [
            "errors=panic", "commit=0", "commit=301", "commit=010", "commit=+5", "commit=", "data=", "data=ordered=x",
            "logbsize=512k", "rw", "remount", "bind", "suid", "dev", "exec", "context=x", "uid=0", "", "noatime,suid",
            "noatime suid", "no\0atime", "noatime\n", "=ordered", "data", "defaults", long.as_str(),
        ] {
            let err = parse(&["noatime", f]).expect_err(f);
            assert!(err.contains(&f.chars().take(10).collect::<String>().escape_debug().to_string()), "{err} names {f:?}");
        }
    }

    #[test]
    fn readonly_detection_reads_per_mount_options() {
        let e = |o: &str| MountEntry {
            devnum: (7, 1),
            root: "/".into(),
            mount_point: "/m".into(),
            options: o.into(),
            fs_type: "ext4".into(),
            source: "/dev/loop1".into(),
            super_options: "rw".into(),
        };
        assert!(is_readonly(&e("ro,relatime")));
        assert!(!is_readonly(&e("rw,errors=remount-ro")));
    }
}
