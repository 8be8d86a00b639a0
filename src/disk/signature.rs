//! What a signature on a disk is, in plain words: the names libblkid gives (`TYPE`,
//! `USAGE`, `VERSION`, `PTTYPE`, as udev's `ID_FS_*` properties and `blkid -p` report
//! them) turned into what an admin calls the thing ("an ext4 filesystem", "an LVM
//! physical volume", "a Linux RAID member (md superblock 1.2)"), and the partitions an
//! MBR partition table lists, counted from the table itself.
//!
//! Rules:
//! - every phrase starts with its article and names the kind of data, never the
//!   prober's name alone; a type this module does not know is still named, with what
//!   libblkid's usage says it is ("a foo filesystem", "a foo RAID or volume-manager
//!   member");
//! - a version is shown only where it tells the admin something (md superblock format,
//!   LUKS version, FAT size);
//! - partitions are counted from the table on the disk, never from the kernel's list:
//!   a kernel that does not read partition tables lists none.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::DiskError;

/// The words for a signature libblkid names `fs_type` (`TYPE`), with its `usage` and
/// `version` when known, and (bcache) whether it is a backing or a cache device.
pub(crate) fn describe(fs_type: &str, usage: Option<&str>, version: Option<&str>) -> String {
    let v = version.map(str::trim).filter(|v| !v.is_empty());
    let fixed = match fs_type {
        "ext2" | "ext3" | "ext4" => return format!("an {fs_type} filesystem"),
        "jbd" => "an ext3/ext4 external journal",
        "xfs" => "an xfs filesystem",
        "xfs_external_log" => "an xfs external log",
        "btrfs" => "a btrfs filesystem",
        "bcachefs" => "a bcachefs filesystem",
        "f2fs" => "an F2FS filesystem",
        "vfat" => {
            return match v {
                Some(v) if v.starts_with("FAT") => format!("a {v} filesystem"),
                _ => "a FAT filesystem".into(),
            }
        }
        "exfat" => "an exFAT filesystem",
        "ntfs" => "an NTFS filesystem",
        "refs" => "a ReFS filesystem",
        "hfs" | "hfsplus" => "an HFS+ filesystem",
        "apfs" => "an APFS container",
        "iso9660" => "an ISO 9660 (CD/DVD image) filesystem",
        "udf" => "a UDF filesystem",
        "squashfs" | "squashfs3" => "a SquashFS image",
        "erofs" => "an EROFS image",
        "cramfs" => "a cramfs image",
        "reiserfs" | "reiser4" => "a ReiserFS filesystem",
        "jfs" => "a JFS filesystem",
        "nilfs2" => "a NILFS2 filesystem",
        "ocfs2" => "an OCFS2 cluster filesystem",
        "gfs" | "gfs2" => "a GFS2 cluster filesystem",
        "zonefs" => "a zonefs filesystem",
        "vmfs" => "a VMware VMFS datastore",
        "vmfs_volume_member" => "a VMware VMFS volume member",
        "swap" => "swap space",
        "swsuspend" => "a hibernation image (suspended swap space)",
        "crypto_LUKS" => {
            return match v {
                Some(v) => format!("a LUKS encrypted volume (LUKS{v})"),
                None => "a LUKS encrypted volume".into(),
            }
        }
        "BitLocker" => "a BitLocker encrypted volume",
        "LVM2_member" => "an LVM physical volume",
        "LVM1_member" => "an LVM1 physical volume",
        "DM_snapshot_cow" => "an LVM snapshot store",
        "DM_integrity" => "a dm-integrity device",
        "DM_verity_hash" => "a dm-verity hash device",
        "linux_raid_member" => {
            return match v {
                Some(v) => format!("a Linux RAID member (md superblock {})", v.strip_suffix(".0").filter(|s| s.contains('.')).unwrap_or(v)),
                None => "a Linux RAID member (md superblock)".into(),
            }
        }
        "ddf_raid_member" => "a DDF firmware RAID member",
        "isw_raid_member" => "an Intel RST firmware RAID member",
        "bcache" => "a bcache device",
        "ceph_bluestore" => "a Ceph BlueStore device",
        "zfs_member" => "a ZFS pool member",
        "drbd" => "a DRBD replicated device",
        "drbdmanage_control_volume" | "drbdproxy_datalog" => "a DRBD metadata device",
        "vdo" => "a VDO deduplicated volume",
        "stratis" => "a Stratis pool member",
        "silicon_medley_raid_member" => "a firmware RAID member (Silicon Image Medley)",
        "nvidia_raid_member" => "a firmware RAID member (NVIDIA)",
        "promise_fasttrack_raid_member" => "a firmware RAID member (Promise FastTrack)",
        "hpt37x_raid_member" | "hpt45x_raid_member" => "a firmware RAID member (HighPoint)",
        "jmicron_raid_member" => "a firmware RAID member (JMicron)",
        "lsi_mega_raid_member" => "a firmware RAID member (LSI MegaRAID)",
        "via_raid_member" => "a firmware RAID member (VIA)",
        "adaptec_raid_member" => "a firmware RAID member (Adaptec)",
        other => {
            let a = article(other);
            return match usage {
                Some("filesystem") => format!("{a} {other} filesystem"),
                Some("raid") => format!("{a} {other} RAID or volume-manager member"),
                Some("crypto") => format!("{a} {other} encrypted volume"),
                _ => format!("{a} {other} signature"),
            };
        }
    };
    fixed.to_string()
}

/// "an" before a vowel, else "a".
fn article(word: &str) -> &'static str {
    if word.starts_with(|c: char| "aeiouAEIOU".contains(c)) {
        "an"
    } else {
        "a"
    }
}

/// The words for a bcache superblock whose version field is `version`: backing devices
/// carry 1 or 4, cache devices 0, 3 or 5 (bcache's `BCACHE_SB_VERSION_*`).
pub(crate) fn describe_bcache(version: Option<u64>) -> String {
    match version {
        Some(1 | 4) => "a bcache backing device".into(),
        Some(0 | 3 | 5) => "a bcache cache device".into(),
        _ => "a bcache device".into(),
    }
}

/// Where the bcache superblock's version field sits: the superblock starts 4 KiB into
/// the device, after its checksum (8 bytes) and its own offset (8 bytes).
const BCACHE_VERSION_AT: u64 = 4096 + 16;

/// The version field of a bcache superblock, read from the device.
pub(crate) fn bcache_version(dev: &Path) -> Result<u64, DiskError> {
    let f = File::open(dev).map_err(DiskError::io(format!("open {}", dev.display())))?;
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, BCACHE_VERSION_AT)
        .map_err(DiskError::io(format!("read the bcache superblock of {}", dev.display())))?;
    Ok(u64::from_le_bytes(b))
}

/// `n thing(s)` with the plural only where it belongs.
pub(crate) fn count(n: usize, one: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {one}s")
    }
}

/// The words for a partition table libblkid names `pt_type` (`PTTYPE`), with the
/// number of partitions read from the table, when known.
pub(crate) fn describe_table(pt_type: &str, partitions: Option<usize>) -> String {
    let table = match pt_type {
        "gpt" => "a GPT partition table".to_string(),
        "dos" => "an MBR (DOS) partition table".to_string(),
        "PMBR" => "a protective MBR whose GPT cannot be read".to_string(),
        "atari" => "an Atari partition table".to_string(),
        "bsd" => "a BSD disklabel".to_string(),
        "mac" => "an Apple partition map".to_string(),
        "sgi" => "an SGI disk label".to_string(),
        "sun" => "a Sun disk label".to_string(),
        "ultrix" => "an Ultrix partition table".to_string(),
        "solaris" => "a Solaris x86 partition table".to_string(),
        "minix" => "a Minix partition table".to_string(),
        "unixware" => "a UnixWare partition table".to_string(),
        other => format!("a {other} partition table"),
    };
    match partitions {
        Some(n) => format!("{table} with {}", count(n, "partition")),
        None => table,
    }
}

/// MBR partition types that point at a chain of extended boot records.
fn is_extended(kind: u8) -> bool {
    matches!(kind, 0x05 | 0x0f | 0x85)
}

/// The partitions an MBR partition table lists, counted from the disk (`lba0` is its
/// first sector, `read_sector` reads any other): the used primary entries other than
/// extended ones, plus each logical partition of the extended chain (each boot record
/// once, at most 256, so a looping chain ends).
pub(crate) fn count_mbr_partitions(lba0: &[u8], mut read_sector: impl FnMut(u64) -> Option<Vec<u8>>) -> usize {
    let entry = |s: &[u8], i: usize| {
        let e = &s[446 + 16 * i..446 + 16 * (i + 1)];
        (e[4], u64::from(u32::from_le_bytes([e[8], e[9], e[10], e[11]])))
    };
    if lba0.len() < 512 {
        return 0;
    }
    let mut n = 0;
    for i in 0..4 {
        let (kind, start) = entry(lba0, i);
        if kind == 0 {
            continue;
        }
        if !is_extended(kind) {
            n += 1;
            continue;
        }
        // Each EBR: its first entry is a logical partition, its second the next EBR,
        // relative to the extended partition's start.
        let mut ebr = start;
        let mut seen = std::collections::BTreeSet::new();
        while seen.len() < 256 && seen.insert(ebr) {
            let Some(s) = read_sector(ebr).filter(|s| s.len() >= 512 && s[510..512] == [0x55, 0xaa]) else { break };
            if entry(&s, 0).0 != 0 {
                n += 1;
            }
            let (next_kind, next) = entry(&s, 1);
            if next_kind == 0 || next == 0 {
                break;
            }
            ebr = start + next;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_read_as_the_kind_of_data_they_mark() {
        let table: &[(&str, Option<&str>, Option<&str>, &str)] = &[
            ("ext4", Some("filesystem"), Some("1.0"), "an ext4 filesystem"),
            ("xfs", Some("filesystem"), None, "an xfs filesystem"),
            ("btrfs", Some("filesystem"), None, "a btrfs filesystem"),
            ("vfat", Some("filesystem"), Some("FAT32"), "a FAT32 filesystem"),
            ("swap", Some("other"), Some("1"), "swap space"),
            ("crypto_LUKS", Some("crypto"), Some("2"), "a LUKS encrypted volume (LUKS2)"),
            ("LVM2_member", Some("raid"), Some("LVM2 001"), "an LVM physical volume"),
            ("linux_raid_member", Some("raid"), Some("1.2"), "a Linux RAID member (md superblock 1.2)"),
            ("linux_raid_member", Some("raid"), Some("1.0"), "a Linux RAID member (md superblock 1.0)"),
            ("linux_raid_member", Some("raid"), Some("0.90.0"), "a Linux RAID member (md superblock 0.90)"),
            ("bcache", Some("other"), None, "a bcache device"),
            ("ceph_bluestore", Some("other"), None, "a Ceph BlueStore device"),
            ("zfs_member", Some("filesystem"), Some("5000"), "a ZFS pool member"),
            ("isw_raid_member", Some("raid"), None, "an Intel RST firmware RAID member"),
            ("nvidia_raid_member", Some("raid"), None, "a firmware RAID member (NVIDIA)"),
            ("newfs", Some("filesystem"), None, "a newfs filesystem"),
            ("newraid", Some("raid"), None, "a newraid RAID or volume-manager member"),
            ("odd", None, None, "an odd signature"),
        ];
        for (t, u, v, want) in table {
            assert_eq!(describe(t, *u, *v), *want, "{t} {u:?} {v:?}");
        }
    }

    #[test]
    fn bcache_roles_come_from_the_superblock_version() {
        assert_eq!(describe_bcache(Some(1)), "a bcache backing device");
        assert_eq!(describe_bcache(Some(4)), "a bcache backing device");
        assert_eq!(describe_bcache(Some(3)), "a bcache cache device");
        assert_eq!(describe_bcache(None), "a bcache device");
    }

    #[test]
    fn tables_name_their_kind_and_how_many_partitions_they_list() {
        assert_eq!(describe_table("gpt", Some(2)), "a GPT partition table with 2 partitions");
        assert_eq!(describe_table("dos", Some(1)), "an MBR (DOS) partition table with 1 partition");
        assert_eq!(describe_table("dos", Some(0)), "an MBR (DOS) partition table with 0 partitions");
        assert_eq!(describe_table("sun", None), "a Sun disk label");
    }

    fn mbr_entry(s: &mut [u8], i: usize, kind: u8, start: u32) {
        let e = 446 + 16 * i;
        s[e + 4] = kind;
        s[e + 8..e + 12].copy_from_slice(&start.to_le_bytes());
        s[510] = 0x55;
        s[511] = 0xaa;
    }

    #[test]
    fn mbr_partitions_are_counted_from_the_table_with_the_logical_ones() {
        let mut lba0 = vec![0u8; 512];
        mbr_entry(&mut lba0, 0, 0x83, 2048);
        mbr_entry(&mut lba0, 1, 0x05, 10_000);
        // Two logical partitions: EBR at 10000 -> next EBR at 10000 + 500.
        let mut ebr1 = vec![0u8; 512];
        mbr_entry(&mut ebr1, 0, 0x83, 63);
        mbr_entry(&mut ebr1, 1, 0x05, 500);
        let mut ebr2 = vec![0u8; 512];
        mbr_entry(&mut ebr2, 0, 0x82, 63);
        let read = |lba: u64| match lba {
            10_000 => Some(ebr1.clone()),
            10_500 => Some(ebr2.clone()),
            _ => None,
        };
        assert_eq!(count_mbr_partitions(&lba0, read), 3);
        // A chain that points at itself ends.
        let mut looping = vec![0u8; 512];
        mbr_entry(&mut looping, 0, 0x83, 63);
        mbr_entry(&mut looping, 1, 0x05, 0x10);
        let mut root = vec![0u8; 512];
        mbr_entry(&mut root, 0, 0x0f, 100);
        assert_eq!(count_mbr_partitions(&root, |_| Some(looping.clone())), 2, "each boot record counted once");
        assert_eq!(count_mbr_partitions(&[0u8; 512], |_| None), 0);
    }
}
