//! What the kernel has mounted and swapped: `/proc/self/mountinfo` and `/proc/swaps`.
//!
//! Parsing is pure (tested on samples); reading is a thin wrapper. Mount points and
//! sources are unescaped (`\040` is a space), so paths compare equal to what we stat.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// `major:minor` of the mounted device (anonymous for btrfs subvolumes and tmpfs).
    pub devnum: (u32, u32),
    /// Path inside the filesystem that is mounted (`/` for a whole filesystem).
    pub root: PathBuf,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Per-mount options (`rw,relatime`).
    pub options: String,
    /// Filesystem type.
    pub fs_type: String,
    /// Mount source, e.g. `/dev/sda1`.
    pub source: String,
}

/// Undoes the octal escapes the kernel writes for space, tab, newline and backslash.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses mountinfo text; malformed lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MountEntry> {
    let (pre, post) = line.split_once(" - ")?;
    let f: Vec<&str> = pre.split(' ').collect();
    if f.len() < 6 {
        return None;
    }
    let (maj, min) = f[2].split_once(':')?;
    let mut p = post.split(' ');
    let fs_type = p.next()?.to_string();
    let source = unescape(p.next()?);
    Some(MountEntry {
        devnum: (maj.parse().ok()?, min.parse().ok()?),
        root: PathBuf::from(unescape(f[3])),
        mount_point: PathBuf::from(unescape(f[4])),
        options: f[5].to_string(),
        fs_type,
        source,
    })
}

/// Reads `/proc/self/mountinfo`.
pub fn read_mountinfo() -> std::io::Result<Vec<MountEntry>> {
    Ok(parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// Parses `/proc/swaps` into the swap device/file paths.
pub fn parse_swaps(text: &str) -> Vec<PathBuf> {
    text.lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .map(|s| PathBuf::from(unescape(s)))
        .collect()
}

/// Which block devices (by `major:minor`) back a mount or swap, and where.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostUsage {
    /// Device -> mount points of that device.
    pub mounted: BTreeMap<(u32, u32), BTreeSet<PathBuf>>,
    /// Devices in use as swap.
    pub swap: BTreeSet<(u32, u32)>,
}

impl HostUsage {
    /// Builds the view from parsed mounts and swaps; `resolve` maps a source path to
    /// its device number (mount sources of btrfs subvolumes carry anonymous device
    /// numbers, so the source path is what names the real device).
    pub fn build(
        mounts: &[MountEntry],
        swaps: &[PathBuf],
        resolve: impl Fn(&Path) -> Option<(u32, u32)>,
    ) -> HostUsage {
        let mut u = HostUsage::default();
        for m in mounts {
            u.mounted.entry(m.devnum).or_default().insert(m.mount_point.clone());
            if m.source.starts_with("/dev/") {
                if let Some(d) = resolve(Path::new(&m.source)) {
                    if d != m.devnum {
                        u.mounted.entry(d).or_default().insert(m.mount_point.clone());
                    }
                }
            }
        }
        for s in swaps {
            if let Some(d) = resolve(s) {
                u.swap.insert(d);
            }
        }
        u
    }

    /// Reads the live host view.
    pub fn read() -> std::io::Result<HostUsage> {
        let mounts = read_mountinfo()?;
        let swaps = std::fs::read_to_string("/proc/swaps").map(|t| parse_swaps(&t)).unwrap_or_default();
        Ok(HostUsage::build(&mounts, &swaps, super::block_devnum))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
22 27 0:21 / /proc rw,relatime - proc proc rw
90 27 7:3 / /var/lib/kubelet/pods/x/volumes/my\\040vol rw,relatime shared:5 - xfs /dev/loop3p1 rw
91 27 0:45 /@home /home rw - btrfs /dev/sdb2 rw,space_cache
";

    #[test]
    fn mountinfo_lines_parse_with_escapes_and_optional_fields() {
        let m = parse_mountinfo(SAMPLE);
        assert_eq!(m.len(), 4);
        assert_eq!(m[0].devnum, (254, 0));
        assert_eq!(m[0].mount_point, PathBuf::from("/"));
        assert_eq!(m[0].source, "/dev/vda");
        assert_eq!(m[2].mount_point, PathBuf::from("/var/lib/kubelet/pods/x/volumes/my vol"));
        assert_eq!(m[2].fs_type, "xfs");
        assert_eq!(m[3].root, PathBuf::from("/@home"));
    }

    #[test]
    fn malformed_lines_are_skipped() {
        assert!(parse_mountinfo("garbage\n1 2 x:y / / rw - ext4 /dev/a rw\n").is_empty());
    }

    #[test]
    fn btrfs_sources_resolve_to_their_real_device() {
        let m = parse_mountinfo(SAMPLE);
        let u = HostUsage::build(&m, &[PathBuf::from("/dev/sdc1")], |p| match p.to_str()? {
            "/dev/sdb2" => Some((8, 18)),
            "/dev/vda" => Some((254, 0)),
            "/dev/sdc1" => Some((8, 33)),
            _ => None,
        });
        assert!(u.mounted[&(8, 18)].contains(Path::new("/home")));
        assert!(u.mounted[&(0, 45)].contains(Path::new("/home")));
        assert!(u.swap.contains(&(8, 33)));
    }

    #[test]
    fn swaps_parse() {
        let t = "Filename\tType\tSize\tUsed\tPriority\n/dev/sda3 partition 1 0 -2\n/swap\\040file file 1 0 -3\n";
        assert_eq!(parse_swaps(t), vec![PathBuf::from("/dev/sda3"), PathBuf::from("/swap file")]);
    }
}
