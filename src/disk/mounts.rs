//! What the kernel has mounted and swapped: `/proc/self/mountinfo` and `/proc/swaps`.
//!
//! Parsing is pure (tested on samples); reading is a thin wrapper. Mount points and
//! sources are unescaped (`\040` is a space), so paths compare equal to what we stat.
//!
//! How a mount shows a filesystem ([`MountKind`], from mountinfo's `root`, the path
//! inside the filesystem that is mounted, taken relative to the btrfs subvolume the
//! mount names in `subvol=`):
//! - root `/`: the whole filesystem, named by its mount point (on a host, `/`);
//! - root equal to the mount point: a directory bound at its own path, as a DaemonSet
//!   mounts a hostPath such as `/var/lib/kubelet` at the same path; the filesystem is
//!   the one mounted at the host's `/`;
//! - any other root: a bind of a part of the filesystem, such as the files a container
//!   runtime binds into a pod (`/etc/hosts`, `/dev/termination-log`); it says where
//!   the filesystem is used, not where it is.

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
    /// Per-superblock options (`rw,subvolid=256,subvol=/@`).
    pub super_options: String,
}

/// What one mount shows of its filesystem (see the module rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountKind {
    /// The whole filesystem (root `/`).
    Whole,
    /// A directory bound at its own path: the filesystem is the host's `/`.
    SamePath,
    /// A bind of some other part of the filesystem.
    Part,
}

impl MountEntry {
    /// `root` relative to the btrfs subvolume the mount names (`subvol=/@` makes root
    /// `/@/var/lib/kubelet` read `/var/lib/kubelet`); other filesystems: `root`.
    fn root_in_volume(&self) -> PathBuf {
        let subvol = self.super_options.split(',').find_map(|o| o.strip_prefix("subvol="));
        match subvol.map(Path::new).and_then(|s| self.root.strip_prefix(s).ok()) {
            Some(rest) => Path::new("/").join(rest),
            None => self.root.clone(),
        }
    }

    /// What the mount shows of its filesystem.
    pub fn kind(&self) -> MountKind {
        let root = self.root_in_volume();
        if root == Path::new("/") {
            MountKind::Whole
        } else if root == self.mount_point {
            MountKind::SamePath
        } else {
            MountKind::Part
        }
    }
}

/// Undoes the octal escapes the kernel writes for space, tab, newline and backslash;
/// an escape above `\377` (no byte) stays as written.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = |c: &u8| (b'0'..=b'3').contains(c);
        if b[i] == b'\\' && i + 3 < b.len() && octal(&b[i + 1]) && b[i + 2..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
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
    let super_options = p.next().unwrap_or_default().to_string();
    Some(MountEntry {
        devnum: (maj.parse().ok()?, min.parse().ok()?),
        root: PathBuf::from(unescape(f[3])),
        mount_point: PathBuf::from(unescape(f[4])),
        options: f[5].to_string(),
        fs_type,
        source,
        super_options,
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

/// Where one device's filesystem is mounted, by what each mount shows of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mounted {
    /// Mount points of the whole filesystem.
    pub whole: BTreeSet<PathBuf>,
    /// Mount points of directories bound at their own path (the host's `/`).
    pub same_path: BTreeSet<PathBuf>,
    /// Mount points of binds of other parts of it.
    pub parts: BTreeSet<PathBuf>,
}

impl Mounted {
    /// Records one mount point of the filesystem.
    pub fn insert(&mut self, kind: MountKind, mount_point: PathBuf) {
        match kind {
            MountKind::Whole => self.whole.insert(mount_point),
            MountKind::SamePath => self.same_path.insert(mount_point),
            MountKind::Part => self.parts.insert(mount_point),
        };
    }

    /// The whole filesystem mounted at `mount_point`, and nothing else.
    pub fn whole_at(mount_point: impl Into<PathBuf>) -> Mounted {
        let mut m = Mounted::default();
        m.insert(MountKind::Whole, mount_point.into());
        m
    }

    /// Whether any mount of the filesystem is at `mount_point`.
    pub fn contains(&self, mount_point: &Path) -> bool {
        self.whole.contains(mount_point) || self.same_path.contains(mount_point) || self.parts.contains(mount_point)
    }
}

/// Which block devices (by `major:minor`) back a mount or swap, and where.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostUsage {
    /// Device -> where its filesystem is mounted.
    pub mounted: BTreeMap<(u32, u32), Mounted>,
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
            let kind = m.kind();
            u.mounted.entry(m.devnum).or_default().insert(kind, m.mount_point.clone());
            if m.source.starts_with("/dev/") {
                if let Some(d) = resolve(Path::new(&m.source)) {
                    if d != m.devnum {
                        u.mounted.entry(d).or_default().insert(kind, m.mount_point.clone());
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
    fn an_escape_above_377_is_no_byte_and_stays_as_written() {
        let m = parse_mountinfo("1 2 0:1 / /a\\777b\\040c rw - tmpfs \\400x rw\n");
        assert_eq!(m[0].mount_point, PathBuf::from("/a\\777b c"));
        assert_eq!(m[0].source, "\\400x");
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

    fn fixture(name: &str) -> Vec<MountEntry> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mountinfo").join(name);
        parse_mountinfo(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
    }

    fn vda1(p: &Path) -> Option<(u32, u32)> {
        (p == Path::new("/dev/vda1")).then_some((254, 1))
    }

    #[test]
    fn a_pods_binds_tell_whole_filesystems_host_paths_and_parts_apart() {
        let u = HostUsage::build(&fixture("daemonset-pod.txt"), &[], vda1);
        let root = &u.mounted[&(254, 1)];
        assert!(root.whole.is_empty(), "the pod sees no whole mount of the host's root disk: {root:?}");
        let paths = |v: &[&str]| v.iter().map(PathBuf::from).collect::<BTreeSet<_>>();
        assert_eq!(root.same_path, paths(&["/var/lib/drivelet", "/var/lib/kubelet"]));
        assert_eq!(root.parts, paths(&["/dev/termination-log", "/etc/drivelet", "/etc/hostname", "/etc/hosts"]));
        let volume = &u.mounted[&(7, 3)];
        assert_eq!(volume.whole.len(), 2, "a volume mounted whole at staging and target: {volume:?}");

        let u = HostUsage::build(&fixture("host.txt"), &[], vda1);
        let root = &u.mounted[&(254, 1)];
        assert_eq!(root.whole, paths(&["/"]));
        assert_eq!(root.same_path, paths(&["/var/lib/kubelet"]));
        assert!(root.parts.is_empty());
    }

    #[test]
    fn btrfs_roots_are_taken_inside_the_mounted_subvolume() {
        let text = "\
27 1 0:31 /@ / rw,relatime - btrfs /dev/sda2 rw,ssd,space_cache=v2,subvolid=256,subvol=/@
28 27 0:31 /@home /home rw,relatime - btrfs /dev/sda2 rw,ssd,space_cache=v2,subvolid=257,subvol=/@home
3020 2997 0:31 /@/var/lib/kubelet /var/lib/kubelet rw,relatime - btrfs /dev/sda2 rw,subvolid=256,subvol=/@
3017 2997 0:31 /@/var/lib/kubelet/pods/x/etc-hosts /etc/hosts rw,relatime - btrfs /dev/sda2 rw,subvolid=256,subvol=/@
";
        let kinds: Vec<MountKind> = parse_mountinfo(text).iter().map(MountEntry::kind).collect();
        assert_eq!(kinds, [MountKind::Whole, MountKind::Whole, MountKind::SamePath, MountKind::Part]);
    }

    #[test]
    fn swaps_parse() {
        let t = "Filename\tType\tSize\tUsed\tPriority\n/dev/sda3 partition 1 0 -2\n/swap\\040file file 1 0 -3\n";
        assert_eq!(parse_swaps(t), vec![PathBuf::from("/dev/sda3"), PathBuf::from("/swap file")]);
    }
}
