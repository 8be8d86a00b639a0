//! Start-up reconciliation of the store with the drives' GPTs and the host's mounts, as
//! a pure plan; the volume manager carries it out.
//!
//! Rules (nothing here ever deletes data):
//! - a `Creating` record was never handed out: its partition (if written) is rolled
//!   back and the record dropped, so a retried CreateVolume starts clean;
//! - a `Deleting` record was asked to go: the deletion is finished;
//! - a drivelet partition with no record (the store was lost) is adopted as a volume:
//!   what it is (its whole name, block or filesystem, the filesystem drivelet made, its
//!   parameters, its PV and claim) comes from its entry in the drive's note
//!   ([`crate::disk::note`]); without one, it is named from its GPT label. A name read
//!   from a disk is data, never a path; one marked as a snapshot is taken back as a snapshot,
//!   whose note (read by the caller) names it, or rolled back when it has no whole note
//!   (a snapshot cut short: a copy, never anyone's data);
//! - a record whose partition sits elsewhere on its drive follows the GPT (the GPT is
//!   the truth for location) and the disagreement is reported;
//! - a record whose drive is absent is kept and reported; the drive may come back;
//! - a record whose drive is present but was not read ([`Others::unread`]: it cannot be
//!   read now, or it is no longer managed) is kept as it is: nothing is known of its
//!   partition, so it is neither lost nor rolled back nor dropped;
//! - a record whose partition is gone from a present drive is kept, marked lost (its
//!   condition says the data is gone; only DeleteVolume is served), and reported; the
//!   mark goes if the partition is found again;
//! - an unfinished stage or publish intent is confirmed if something is mounted at its
//!   path, and dropped otherwise;
//! - a move cut short before its switch is rolled back (the record drops its `Move`);
//!   one cut short after it is finished ([`Plan::finish_moves`]); a partition carrying
//!   the move mark is never a volume unless a record on its drive names it (a switched
//!   move whose mark was not cleared yet): every other one is a copy cut short, removed
//!   ([`Plan::stray_copies`]), with or without the store (a copy on the volume's own
//!   drive carries a GUID of its own, [`super::model::Move::copy_guid`]: before the
//!   finish a switched record is served from it, not from the old partition, which
//!   keeps the volume's GUID until the finish's one commit); [`Others`] names the
//!   copies of moves running now (a drive read again while a volume is copied onto it)
//!   and the volumes whose records live on other drives (never adopted here).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use super::model::{VolumeRecord, VolumeState};
use crate::actors::inventory::model::Drive;
use crate::disk::gpt::GptPartition;
use crate::disk::note::VolumeNote;
use crate::words::LayoutKind;

/// What to do at start-up.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Plan {
    /// Records to keep in memory (and write to the store when in `changed`).
    pub keep: Vec<VolumeRecord>,
    /// Ids of kept records that changed and must be written back.
    pub changed: BTreeSet<String>,
    /// Records of unfinished creations to roll back.
    pub rollback: Vec<VolumeRecord>,
    /// Records whose deletion must be finished.
    pub finish_delete: Vec<VolumeRecord>,
    /// Records to drop from the store without touching any drive.
    pub drop: Vec<String>,
    /// Ids of kept records whose switched move must be finished.
    pub finish_moves: Vec<String>,
    /// Copies cut short to remove: drive id, partition GUID, start.
    pub stray_copies: Vec<(String, uuid::Uuid, u64)>,
    /// One line per finding, for the log.
    pub reports: Vec<String>,
}

/// What the book knows beyond the records being reconciled (one drive read again while
/// running): nothing at start-up.
#[derive(Debug, Default, Clone)]
pub(crate) struct Others {
    /// Partition GUIDs of records on other drives: a partition of one of them here (the
    /// old copy of a moved volume) is never adopted as a volume of its own.
    pub held: BTreeSet<uuid::Uuid>,
    /// Copies of moves running now: drive id, partition GUID.
    pub running: Vec<(String, uuid::Uuid)>,
    /// Present drives whose volumes cannot be judged now, with why in words (the drive
    /// cannot be read, or it is not managed now yet carries a drivelet table): a record
    /// on one is kept as it is, never marked lost, rolled back or dropped.
    pub unread: BTreeMap<String, String>,
}

/// The drivelet partitions read from each present managed drive's GPT, by drive id.
pub(crate) type Tables = BTreeMap<String, Vec<GptPartition>>;

/// The volume entries of each present managed drive's note, by drive id.
pub(crate) type Notes = BTreeMap<String, Vec<VolumeNote>>;

/// Builds the plan. `drives` are the drives present now; `mounted` every mount point.
pub(crate) fn plan(records: Vec<VolumeRecord>, drives: &[Drive], tables: &Tables, mounted: &BTreeSet<PathBuf>, now: u64, notes: &Notes, others: &Others) -> Plan {
    let mut p = Plan::default();
    let present: BTreeMap<&str, &Drive> = drives.iter().map(|d| (d.id.as_str(), d)).collect();
    // Partitions of volumes whose records live elsewhere are never adopted.
    let mut claimed: BTreeSet<uuid::Uuid> = others.held.clone();
    for mut rec in records {
        claimed.insert(rec.part_guid);
        let table = tables.get(&rec.drive_id);
        let on_disk = table.and_then(|t| serving_partition(&rec, t));
        let drive_present = present.contains_key(rec.drive_id.as_str());
        if let Some(why) = others.unread.get(&rec.drive_id).filter(|_| drive_present && on_disk.is_none()) {
            p.reports.push(format!("volume {}: drive {} {why}; the volume is judged again when the drive is read", rec.id, rec.drive_id));
            p.keep.push(rec);
            continue;
        }
        match rec.state {
            VolumeState::Creating => {
                if !drive_present {
                    p.reports.push(format!("volume {} was being created on drive {} which is absent; kept until it returns", rec.id, rec.drive_id));
                    p.keep.push(rec);
                } else {
                    p.reports.push(format!("volume {} was being created when drivelet stopped; rolling it back", rec.id));
                    p.rollback.push(rec);
                }
                continue;
            }
            VolumeState::Deleting => {
                if drive_present {
                    p.reports.push(format!("volume {} was being deleted when drivelet stopped; finishing", rec.id));
                    p.finish_delete.push(rec);
                } else {
                    p.reports.push(format!("volume {} was being deleted and its drive {} is absent; record dropped", rec.id, rec.drive_id));
                    p.drop.push(rec.id);
                }
                continue;
            }
            _ => {}
        }
        let mut changed = false;
        match rec.moving.as_ref().map(|m| m.switched) {
            Some(false) => {
                p.reports.push(format!("volume {} was being copied to drive {} when drivelet stopped; the copy is rolled back and the volume stays on drive {}", rec.id, rec.moving.as_ref().map_or("", |m| m.drive_id.as_str()), rec.drive_id));
                rec.moving = None;
                changed = true;
            }
            Some(true) => {
                p.reports.push(format!("volume {} was moved to drive {} when drivelet stopped; finishing the move", rec.id, rec.drive_id));
                p.finish_moves.push(rec.id.clone());
            }
            None => {}
        }
        match (drive_present, on_disk) {
            // An adopted volume has no partition; its directory is checked by the health poller.
            _ if rec.adopted.is_some() => {}
            (false, _) => p.reports.push(format!("volume {}: drive {} is absent", rec.id, rec.drive_id)),
            (true, None) => {
                p.reports.push(format!(
                    "volume {}: its partition {} is missing from drive {}: the data is gone; kept as lost until DeleteVolume, nothing deleted",
                    rec.id, rec.part_guid, rec.drive_id
                ));
                changed |= !rec.lost;
                rec.lost = true;
            }
            (true, Some(q)) if (q.start, q.size) != (rec.start, rec.size) => {
                p.reports.push(format!(
                    "volume {}: store says {}+{} but the GPT says {}+{}; following the GPT",
                    rec.id, rec.start, rec.size, q.start, q.size
                ));
                rec.start = q.start;
                rec.size = q.size;
                changed = true;
            }
            _ => {}
        }
        if rec.lost && drive_present && on_disk.is_some() {
            p.reports.push(format!("volume {}: its partition {} is back on drive {}", rec.id, rec.part_guid, rec.drive_id));
            rec.lost = false;
            changed = true;
        }
        if let Some(st) = rec.staging.as_mut() {
            if !st.done {
                if st.block || mounted.contains(&st.path) {
                    st.done = true;
                    if rec.state == VolumeState::Available {
                        rec.state = VolumeState::Staged;
                    }
                } else {
                    rec.staging = None;
                }
                changed = true;
            }
        }
        let before = rec.targets.len();
        rec.targets.retain(|path, t| t.done || mounted.contains(path));
        for t in rec.targets.values_mut() {
            if !t.done {
                t.done = true;
                changed = true;
            }
        }
        changed |= rec.targets.len() != before;
        let want = match (rec.staging.is_some(), rec.targets.is_empty()) {
            (_, false) => VolumeState::Published,
            (true, true) => VolumeState::Staged,
            (false, true) => VolumeState::Available,
        };
        if want != rec.state {
            rec.state = want;
            changed = true;
        }
        if changed {
            p.changed.insert(rec.id.clone());
        }
        p.keep.push(rec);
    }
    for (drive_id, parts) in tables {
        for q in parts.iter().filter(|q| q.is_move_copy()) {
            let serves = p.keep.iter().any(|r| r.drive_id == *drive_id && serving_guid(r) == q.guid);
            let running = others.running.iter().any(|(d, g)| d == drive_id && *g == q.guid);
            if !serves && !running {
                p.reports.push(format!("partition {} on drive {} is the copy of a move cut short; removing it", q.guid, drive_id));
                p.stray_copies.push((drive_id.clone(), q.guid, q.start));
            }
        }
    }
    for (drive_id, parts) in tables {
        let Some(d) = present.get(drive_id.as_str()) else { continue };
        for q in parts.iter().filter(|q| !claimed.contains(&q.guid) && !q.is_move_copy()) {
            let entry = notes.get(drive_id).and_then(|n| n.iter().find(|v| v.id == q.guid && v.snapshot == q.is_snapshot()));
            let name = match entry {
                Some(v) => v.name.clone(),
                None => q.name.strip_prefix(crate::disk::gpt::LABEL_PREFIX).unwrap_or(&q.name).to_string(),
            };
            let whole = crate::disk::gpt::usable_region(d.size_bytes, d.logical_block_size)
                .is_some_and(|(s, e)| q.start == s && q.size == e - s);
            if q.is_snapshot() {
                p.reports.push(format!("snapshot partition {} on drive {} has no record; taken back from its note", q.guid, drive_id));
            } else if let Some(claim) = entry.and_then(|v| v.binding.claim()) {
                p.reports.push(format!("partition {} on drive {} has no record; served again as volume {} of claim {claim}, as the drive's note says", q.guid, drive_id, q.guid));
            } else if entry.is_some() {
                p.reports.push(format!("partition {} on drive {} has no record; served again as volume {}, as the drive's note says", q.guid, drive_id, q.guid));
            } else {
                p.reports.push(format!("partition {} on drive {} has no record; adopted as volume {}", q.guid, drive_id, q.guid));
            }
            let snapshot = q.is_snapshot().then(|| crate::actors::volumes::model::SnapshotOf {
                source_volume_id: String::new(),
                restore_size: q.size.saturating_sub(crate::disk::gpt::ALIGN),
                created_unix_nanos: 0,
                freeze_millis: None,
                freeze: false,
            });
            let mut rec = VolumeRecord {
                snapshot,
                drive_id: drive_id.clone(),
                part_guid: q.guid,
                start: q.start,
                size: q.size,
                layout: if whole && parts.len() == 1 && !q.is_snapshot() { LayoutKind::Drive } else { LayoutKind::Partition },
                media: d.media,
                rebuilt: true,
                ..VolumeRecord::new(q.guid.to_string(), name, VolumeState::Available, now)
            };
            if let Some(v) = entry.filter(|_| !q.is_snapshot()) {
                rec.block = v.block;
                rec.fs_type = v.fs_type.clone();
                rec.created_unix = v.created_unix;
                rec.parameters = v.parameters.clone().into();
                rec.binding = v.binding.clone();
                // Whether its filesystem was made is the disk's to say: a filesystem
                // volume is probed at start-up, as one rebuilt from its label is, and a
                // filesystem found there is data, never formatted again.
                rec.rebuilt = !v.block;
            }
            p.changed.insert(rec.id.clone());
            p.keep.push(rec);
        }
    }
    // Without the store, a volume whose move was cut short between the clearing of its
    // copy's mark and the removal of its old partition is on two drives, with the same
    // data: the first is kept, the other left alone (reported).
    let mut seen: BTreeSet<String> = BTreeSet::new();
    p.keep.retain(|r| {
        if seen.insert(r.id.clone()) {
            return true;
        }
        p.reports.push(format!("partition {} is also on drive {}: a copy from a move; left alone, the volume is served from its first copy", r.part_guid, r.drive_id));
        false
    });
    p
}

/// The partition GUID a record's volume is served from: its own, but the copy's
/// temporary one of a move within its drive switched and not yet finished.
fn serving_guid(rec: &VolumeRecord) -> uuid::Uuid {
    match rec.moving.as_deref() {
        Some(m) if m.switched && m.drive_id == rec.drive_id => m.copy_part_guid(rec.part_guid),
        _ => rec.part_guid,
    }
}

/// The partition of `table` (the record's drive's) that serves `rec`: the one with its
/// GUID; of a move within its drive switched and not yet finished, the copy (before
/// the finish's commit, with the copy's GUID) or the volume's GUID at the copy's place
/// (after it), never the old partition, which the finish removes.
fn serving_partition<'t>(rec: &VolumeRecord, table: &'t [GptPartition]) -> Option<&'t GptPartition> {
    let guid = serving_guid(rec);
    if guid == rec.part_guid {
        return table.iter().find(|q| q.guid == guid);
    }
    table.iter().find(|q| q.guid == guid).or_else(|| table.iter().find(|q| q.guid == rec.part_guid && q.start == rec.start))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::volumes::model::{Staging, Target};
    use crate::words::Media;

    const MIB: u64 = 1 << 20;

    fn drive(id: &str) -> Drive {
        let mut d = Drive::for_test(id, Media::Virtual, 1 << 30);
        d.blank = false;
        d
    }

    fn rec(n: u8, state: VolumeState) -> VolumeRecord {
        VolumeRecord::for_test(n, state)
    }

    fn part(r: &VolumeRecord) -> GptPartition {
        GptPartition { guid: r.part_guid, type_guid: uuid::Uuid::nil(), name: format!("drivelet:{}", r.name), start: r.start, size: r.size, attrs: 0 }
    }

    #[test]
    fn unfinished_creations_roll_back_and_deletions_finish() {
        let c = rec(1, VolumeState::Creating);
        let d = rec(2, VolumeState::Deleting);
        let tables = Tables::from([("d1".to_string(), vec![part(&c), part(&d)])]);
        let p = plan(vec![c.clone(), d.clone()], &[drive("d1")], &tables, &BTreeSet::new(), 0, &Notes::new(), &Others::default());
        assert_eq!(p.rollback, vec![c]);
        assert_eq!(p.finish_delete, vec![d]);
        assert!(p.keep.is_empty());
    }

    #[test]
    fn records_of_absent_drives_are_kept_and_reported() {
        let a = rec(1, VolumeState::Available);
        let c = rec(2, VolumeState::Creating);
        let p = plan(vec![a.clone(), c.clone()], &[], &Tables::new(), &BTreeSet::new(), 0, &Notes::new(), &Others::default());
        assert_eq!(p.keep, vec![a, c]);
        assert!(p.rollback.is_empty());
        assert_eq!(p.reports.len(), 2);
    }

    #[test]
    fn partitions_without_records_are_adopted_and_nothing_is_deleted() {
        let a = rec(1, VolumeState::Available);
        let orphan = rec(3, VolumeState::Available);
        let tables = Tables::from([("d1".to_string(), vec![part(&a), part(&orphan)])]);
        let p = plan(vec![a.clone()], &[drive("d1")], &tables, &BTreeSet::new(), 7, &Notes::new(), &Others::default());
        assert_eq!(p.keep.len(), 2);
        let adopted = &p.keep[1];
        assert_eq!(adopted.part_guid, orphan.part_guid);
        assert_eq!(adopted.name, "pvc-3");
        assert!(adopted.rebuilt);
        assert!(p.changed.contains(&adopted.id));
        assert!(p.rollback.is_empty() && p.finish_delete.is_empty() && p.drop.is_empty());
    }

    #[test]
    fn intents_are_confirmed_by_mounts_or_dropped() {
        let mut a = rec(1, VolumeState::Staged);
        a.staging = Some(Staging { path: "/k/s1".into(), block: false, flags: vec![], readonly: false, done: true });
        a.targets.insert("/k/t1".into(), Target { readonly: false, block: false, done: false });
        a.targets.insert("/k/t2".into(), Target { readonly: false, block: false, done: false });
        let mut b = rec(2, VolumeState::Available);
        b.staging = Some(Staging { path: "/k/s2".into(), block: false, flags: vec![], readonly: false, done: false });
        let tables = Tables::from([("d1".to_string(), vec![part(&a), part(&b)])]);
        let mounted: BTreeSet<PathBuf> = ["/k/s1", "/k/t1"].iter().map(PathBuf::from).collect();
        let p = plan(vec![a, b], &[drive("d1")], &tables, &mounted, 0, &Notes::new(), &Others::default());
        let a = &p.keep[0];
        assert_eq!(a.state, VolumeState::Published);
        assert_eq!(a.targets.keys().collect::<Vec<_>>(), vec![&PathBuf::from("/k/t1")]);
        let b = &p.keep[1];
        assert_eq!(b.state, VolumeState::Available);
        assert!(b.staging.is_none());
        assert_eq!(p.changed.len(), 2);
    }

    #[test]
    fn a_present_drive_that_could_not_be_read_loses_rolls_back_and_drops_nothing() {
        // Its media went away while it was read, or it is not managed now: nothing is
        // known of its partitions, so every record on it is kept as it was.
        let a = rec(1, VolumeState::Available);
        let creating = rec(2, VolumeState::Creating);
        let deleting = rec(3, VolumeState::Deleting);
        let others = Others { unread: BTreeMap::from([("d1".to_string(), "cannot be read now (EIO)".to_string())]), ..Others::default() };
        let records = vec![a.clone(), creating.clone(), deleting.clone()];
        let p = plan(records.clone(), &[drive("d1")], &Tables::new(), &BTreeSet::new(), 0, &Notes::new(), &others);
        assert_eq!(p.keep, records, "kept exactly as they were");
        assert!(p.changed.is_empty() && p.rollback.is_empty() && p.finish_delete.is_empty() && p.drop.is_empty(), "{p:?}");
        assert!(p.reports.iter().all(|r| r.contains("cannot be read now") && r.contains("judged again")), "{:?}", p.reports);
        // Read and blank (wiped) is another matter: the partition is gone.
        let p = plan(vec![a], &[drive("d1")], &Tables::new(), &BTreeSet::new(), 0, &Notes::new(), &Others::default());
        assert!(p.keep[0].lost);
    }

    #[test]
    fn the_gpt_wins_on_location() {
        let a = rec(1, VolumeState::Available);
        let mut q = part(&a);
        q.start += MIB;
        let tables = Tables::from([("d1".to_string(), vec![q])]);
        let p = plan(vec![a], &[drive("d1")], &tables, &BTreeSet::new(), 0, &Notes::new(), &Others::default());
        assert_eq!(p.keep[0].start, 2 * MIB);
        assert_eq!(p.changed.len(), 1);
    }

    #[test]
    fn a_record_whose_partition_is_gone_from_a_present_drive_is_lost_until_it_is_back() {
        let a = rec(1, VolumeState::Available);
        let b = rec(2, VolumeState::Available);
        // d1 is present but its table lacks a's partition (wiped and re-used by b, say).
        let tables = Tables::from([("d1".to_string(), vec![part(&b)])]);
        let p = plan(vec![a.clone(), b.clone()], &[drive("d1")], &tables, &BTreeSet::new(), 0, &Notes::new(), &Others::default());
        assert!(p.keep[0].lost, "a is lost");
        assert!(!p.keep[1].lost, "b is fine");
        assert_eq!(p.changed, BTreeSet::from([a.id.clone()]), "the mark is written to the store");
        assert!(p.reports[0].contains("the data is gone"), "{:?}", p.reports);
        assert!(p.rollback.is_empty() && p.finish_delete.is_empty() && p.drop.is_empty(), "nothing deleted");
        // Seen again: still lost, nothing more to write. A blank drive (no table) too.
        let again = plan(p.keep.clone(), &[drive("d1")], &tables, &BTreeSet::new(), 0, &Notes::new(), &Others::default());
        assert!(again.keep[0].lost && again.changed.is_empty());
        let blank = plan(vec![b.clone()], &[drive("d1")], &Tables::new(), &BTreeSet::new(), 0, &Notes::new(), &Others::default());
        assert!(blank.keep[0].lost);
        // The partition is back (the original drive returned): the mark goes.
        let back = Tables::from([("d1".to_string(), vec![part(&a), part(&b)])]);
        let p = plan(p.keep, &[drive("d1")], &back, &BTreeSet::new(), 0, &Notes::new(), &Others::default());
        assert!(!p.keep[0].lost);
        assert_eq!(p.changed, BTreeSet::from([a.id]));
        // An absent drive is not a lost partition: the drive may come back.
        let absent = plan(vec![b], &[], &Tables::new(), &BTreeSet::new(), 0, &Notes::new(), &Others::default());
        assert!(!absent.keep[0].lost);
    }

    #[test]
    fn a_move_cut_short_before_its_switch_rolls_back_and_one_after_it_is_finished_and_a_marked_copy_is_never_a_volume() {
        use crate::actors::volumes::model::Move;
        use crate::disk::gpt::MOVE_ATTR;
        let copy_of = |r: &VolumeRecord, start: u64| GptPartition { attrs: MOVE_ATTR, start, ..part(r) };
        // Before the switch: the record is on d1, its copy (marked) on d2.
        let mut a = rec(1, VolumeState::Available);
        a.moving = Some(Box::new(Move { drive_id: "d2".into(), start: 64 * MIB, size: a.size, switched: false, unreadable: vec![], copy_guid: None }));
        let tables = Tables::from([("d1".to_string(), vec![part(&a)]), ("d2".to_string(), vec![copy_of(&a, 64 * MIB)])]);
        let p = plan(vec![a.clone()], &[drive("d1"), drive("d2")], &tables, &BTreeSet::new(), 0, &Notes::new(), &Others::default());
        assert_eq!(p.keep[0].moving, None, "the record stays on d1 without its move");
        assert_eq!(p.keep[0].drive_id, "d1");
        assert_eq!(p.stray_copies, vec![("d2".to_string(), a.part_guid, 64 * MIB)], "the copy goes");
        assert!(p.changed.contains(&a.id) && p.finish_moves.is_empty());
        // The same copy while its move runs (a drive read again meanwhile) stays.
        let p = plan(vec![], &[drive("d2")], &Tables::from([("d2".to_string(), vec![copy_of(&a, 64 * MIB)])]), &BTreeSet::new(), 0, &Notes::new(), &Others { running: vec![("d2".to_string(), a.part_guid)], ..Default::default() });
        assert!(p.stray_copies.is_empty() && p.keep.is_empty(), "a running move's copy is neither removed nor adopted");
        // After the switch: the record is on d2 (its copy still marked), the old one on d1.
        let mut b = rec(2, VolumeState::Available);
        b.drive_id = "d2".into();
        b.moving = Some(Box::new(Move { drive_id: "d1".into(), start: b.start, size: b.size, switched: true, unreadable: vec![], copy_guid: None }));
        let tables = Tables::from([("d1".to_string(), vec![part(&b)]), ("d2".to_string(), vec![copy_of(&b, b.start)])]);
        let p = plan(vec![b.clone()], &[drive("d1"), drive("d2")], &tables, &BTreeSet::new(), 0, &Notes::new(), &Others::default());
        assert_eq!(p.finish_moves, vec![b.id.clone()]);
        assert!(p.stray_copies.is_empty(), "the marked copy is the volume now");
        assert_eq!(p.keep.len(), 1, "the old partition is not adopted as another volume");
        // Without the store: a marked copy is never adopted; the same volume on two
        // drives (unmarked: cut short between the mark's clearing and the old one's
        // removal) is served from one of them.
        let tables = Tables::from([("d1".to_string(), vec![part(&b)]), ("d2".to_string(), vec![copy_of(&b, b.start)])]);
        let p = plan(vec![], &[drive("d1"), drive("d2")], &tables, &BTreeSet::new(), 0, &Notes::new(), &Others::default());
        assert_eq!(p.keep.len(), 1, "{:?}", p.keep);
        assert_eq!(p.keep[0].drive_id, "d1", "the unmarked partition is the volume");
        assert_eq!(p.stray_copies, vec![("d2".to_string(), b.part_guid, b.start)]);
        let tables = Tables::from([("d1".to_string(), vec![part(&b)]), ("d2".to_string(), vec![part(&b)])]);
        let p = plan(vec![], &[drive("d1"), drive("d2")], &tables, &BTreeSet::new(), 0, &Notes::new(), &Others::default());
        assert_eq!(p.keep.len(), 1, "one volume of one id: {:?}", p.keep);
        assert!(p.reports.iter().any(|r| r.contains("also on drive")), "{:?}", p.reports);
        // A drive read again while running, holding the old partition of a volume that
        // moved off it: not adopted (its record lives on the other drive).
        let tables = Tables::from([("d1".to_string(), vec![part(&b)])]);
        let held = Others { held: BTreeSet::from([b.part_guid]), ..Default::default() };
        let p = plan(vec![], &[drive("d1")], &tables, &BTreeSet::new(), 0, &Notes::new(), &held);
        assert!(p.keep.is_empty(), "{:?}", p.keep);
    }

    #[test]
    fn a_move_within_one_drive_is_served_from_its_copy_once_switched_and_its_marked_copy_is_never_a_volume() {
        use crate::actors::volumes::model::Move;
        use crate::disk::gpt::MOVE_ATTR;
        // Volume 1 at 1 MiB grows to 8 MiB by a copy at 64 MiB of the same drive.
        let copy = uuid::Uuid::from_u128(0xc0b1);
        let a = rec(1, VolumeState::Available);
        let old = part(&a);
        let marked = GptPartition { guid: copy, start: 64 * MIB, size: 8 * MIB, attrs: MOVE_ATTR, ..part(&a) };
        let renamed = GptPartition { start: 64 * MIB, size: 8 * MIB, ..part(&a) };
        let notes = Notes::from([("d1".to_string(), vec![crate::actors::volumes::notes::note_of(&a)])]);
        // Before the switch: rolled back, only the marked copy with its own GUID goes.
        let before = VolumeRecord { moving: Some(Box::new(Move { drive_id: "d1".into(), start: 64 * MIB, size: 8 * MIB, copy_guid: Some(copy), ..Move::default() })), ..a.clone() };
        let tables = Tables::from([("d1".to_string(), vec![old.clone(), marked.clone()])]);
        let p = plan(vec![before], &[drive("d1")], &tables, &BTreeSet::new(), 0, &notes, &Others::default());
        assert_eq!((p.keep.len(), p.keep[0].start, p.keep[0].moving.is_none()), (1, MIB, true), "the volume stays where it was");
        assert_eq!(p.stray_copies, vec![("d1".to_string(), copy, 64 * MIB)]);
        // The same copy while its move runs (the drive read again meanwhile) stays.
        let running = Others { running: vec![("d1".to_string(), copy)], ..Default::default() };
        let p = plan(vec![], &[drive("d1")], &Tables::from([("d1".to_string(), vec![marked.clone()])]), &BTreeSet::new(), 0, &notes, &running);
        assert!(p.stray_copies.is_empty() && p.keep.is_empty(), "a running move's copy is neither removed nor adopted");
        // After the switch, before and after the finish's commit: served from the copy,
        // at its place and size, finished; the old partition is neither followed nor
        // adopted, and nothing is removed as a stray.
        let switched = VolumeRecord {
            start: 64 * MIB,
            size: 8 * MIB,
            moving: Some(Box::new(Move { drive_id: "d1".into(), start: MIB, size: MIB, switched: true, copy_guid: Some(copy), ..Move::default() })),
            ..a.clone()
        };
        for (when, table) in [("before the commit", vec![old.clone(), marked.clone()]), ("after it", vec![renamed.clone()])] {
            let tables = Tables::from([("d1".to_string(), table)]);
            let p = plan(vec![switched.clone()], &[drive("d1")], &tables, &BTreeSet::new(), 0, &notes, &Others::default());
            assert_eq!(p.keep.len(), 1, "{when}: {:?}", p.keep);
            assert_eq!((p.keep[0].start, p.keep[0].size, p.keep[0].lost), (64 * MIB, 8 * MIB, false), "{when}: {:?}", p.reports);
            assert_eq!(p.finish_moves, vec![a.id.clone()], "{when}");
            assert!(p.stray_copies.is_empty() && p.changed.is_empty(), "{when}: {p:?}");
        }
        // Without the store, before the commit: the old partition is the volume (its
        // note names it), the marked copy with a GUID no note names is a copy cut short.
        let p = plan(vec![], &[drive("d1")], &Tables::from([("d1".to_string(), vec![old, marked])]), &BTreeSet::new(), 0, &notes, &Others::default());
        assert_eq!(p.keep.iter().map(|r| (r.part_guid, r.start)).collect::<Vec<_>>(), vec![(a.part_guid, MIB)]);
        assert_eq!(p.stray_copies, vec![("d1".to_string(), copy, 64 * MIB)]);
        // After it: the volume at its new place and size.
        let p = plan(vec![], &[drive("d1")], &Tables::from([("d1".to_string(), vec![renamed])]), &BTreeSet::new(), 0, &notes, &Others::default());
        assert_eq!(p.keep.iter().map(|r| (r.part_guid, r.start, r.size)).collect::<Vec<_>>(), vec![(a.part_guid, 64 * MIB, 8 * MIB)]);
        assert!(p.stray_copies.is_empty());
    }
}
