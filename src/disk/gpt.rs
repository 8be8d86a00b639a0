//! drivelet's GPT conventions and layout arithmetic.
//!
//! Rules:
//! - a drivelet GPT is recognised by its disk GUID, whose first group is
//!   [`DISK_GUID_PREFIX`]; a drivelet partition by its type GUID [`PARTITION_TYPE`];
//! - usable space starts at 1 MiB and ends before the backup GPT, and every partition
//!   starts and ends on a 1 MiB boundary ([`ALIGN`]);
//! - free extents are computed from the partitions the kernel reports, so capacity can
//!   be answered without reading the disk.

/// Alignment of every partition start and size.
pub const ALIGN: u64 = 1 << 20;

/// First group of the disk GUID of every GPT drivelet writes ("drvl" in ASCII).
pub const DISK_GUID_PREFIX: &str = "6472766c";

/// Partition type GUID of drivelet volumes.
pub const PARTITION_TYPE: &str = "df8e4bd2-b4f6-46af-b301-8bcbff739f75";

/// Whether a partition-table UUID (udev `ID_PART_TABLE_UUID`) marks a drivelet GPT.
pub fn is_drivelet_table(table_type: Option<&str>, table_uuid: Option<&str>) -> bool {
    table_type == Some("gpt")
        && table_uuid.map(|u| u.to_ascii_lowercase().starts_with(DISK_GUID_PREFIX)).unwrap_or(false)
}

/// The aligned region `[start, end)` of a disk of `size` bytes where partitions may go:
/// after the primary GPT (first MiB), before the backup GPT (last 33 sectors of 512 B,
/// or 5 of 4 KiB), rounded to [`ALIGN`].
pub fn usable_region(size: u64, sector: u64) -> Option<(u64, u64)> {
    let backup = 33 * sector.max(512);
    let end = size.checked_sub(backup)? / ALIGN * ALIGN;
    (end > ALIGN).then_some((ALIGN, end))
}

/// Free aligned extents `(start, len)` of a disk, given its used `(start, len)` ranges.
pub fn free_extents(size: u64, sector: u64, used: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let Some((lo, hi)) = usable_region(size, sector) else { return Vec::new() };
    let mut used: Vec<(u64, u64)> = used.to_vec();
    used.sort();
    let mut free = Vec::new();
    let mut cursor = lo;
    for (s, l) in used {
        let s_al = s / ALIGN * ALIGN;
        let e_al = (s + l).div_ceil(ALIGN) * ALIGN;
        if s_al > cursor {
            free.push((cursor, s_al.min(hi) - cursor));
        }
        cursor = cursor.max(e_al);
        if cursor >= hi {
            break;
        }
    }
    if cursor < hi {
        free.push((cursor, hi - cursor));
    }
    free.retain(|&(_, l)| l >= ALIGN);
    free
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB: u64 = 1 << 20;

    #[test]
    fn blank_disk_is_one_extent_between_the_two_tables() {
        assert_eq!(free_extents(1024 * MIB, 512, &[]), vec![(MIB, 1022 * MIB)]);
    }

    #[test]
    fn tiny_disks_have_no_room() {
        assert!(free_extents(MIB, 512, &[]).is_empty());
        assert!(free_extents(0, 512, &[]).is_empty());
    }

    #[test]
    fn partitions_split_the_free_space() {
        let used = [(MIB, 100 * MIB), (301 * MIB, 100 * MIB)];
        assert_eq!(
            free_extents(1024 * MIB, 512, &used),
            vec![(101 * MIB, 200 * MIB), (401 * MIB, 622 * MIB)]
        );
    }

    #[test]
    fn unaligned_partitions_round_outwards() {
        let used = [(MIB + 512, MIB)];
        assert_eq!(free_extents(16 * MIB, 512, &used), vec![(3 * MIB, 12 * MIB)]);
    }

    #[test]
    fn drivelet_tables_are_recognised_by_disk_guid() {
        assert!(is_drivelet_table(Some("gpt"), Some("6472766C-1111-4222-8333-444455556666")));
        assert!(!is_drivelet_table(Some("gpt"), Some("12345678-1111-4222-8333-444455556666")));
        assert!(!is_drivelet_table(Some("dos"), Some("6472766c")));
        assert!(!is_drivelet_table(None, None));
    }
}
