//! Table tests of the volume book's decisions: no actor, no disk.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::*;

use crate::actors::volumes::messages::{CreateVolume, ReleaseDrive};
use crate::actors::volumes::messages::ExpandVolume;
use crate::actors::volumes::model::{CapacityRange, Move, Staging};
use crate::actors::volumes::placement;
use crate::config::human_bytes;
use crate::disk::gpt;
use crate::words::{DriveUseState, LayoutKind, Media};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// A ready book with drive `d1` (1 GiB, managed) holding `records`.
fn book_with(records: Vec<VolumeRecord>) -> VolumeBook {
    let mut b = VolumeBook::new(VolumesConfig::default(), false);
    b.add_drives(vec![Drive::for_test("d1", Media::Ssd, GIB)]);
    let save = b.load(records, Some(Vec::new()));
    assert!(save.is_empty());
    b
}

fn create(name: &str, required: u64) -> CreateVolume {
    CreateVolume {
        name: name.into(),
        range: CapacityRange { required, limit: 0 },
        media: None,
        layout: LayoutKind::Partition,
        block: false,
        fs_type: String::new(),
        parameters: BTreeMap::new(),
        source: None,
        from_snapshot: false,
        binding: Default::default(),
        secrets: Default::default(),
    }
}

fn attach(id: &str, node: &str) -> AttachVolume {
    AttachVolume { volume_id: id.into(), node_id: node.into(), block: false, fs_type: String::new() }
}

fn available(n: u8) -> VolumeRecord {
    VolumeRecord::for_test(n, VolumeState::Available)
}

#[test]
fn a_claim_holds_its_volume_until_dropped() {
    let b = book_with(vec![]);
    let c = b.claim("v1").expect("free");
    assert!(b.is_busy("v1"));
    assert!(matches!(b.claim("v1"), Err(VolumeError::Busy { volume_id }) if volume_id == "v1"));
    assert!(b.claim("v2").is_ok(), "other volumes proceed in parallel");
    drop(c);
    assert!(!b.is_busy("v1"));
    assert!(b.claim("v1").is_ok());
}

#[test]
fn nothing_is_claimed_before_the_book_is_loaded() {
    let b = VolumeBook::new(VolumesConfig::default(), false);
    assert!(matches!(b.claim("v1"), Err(VolumeError::NotReady)));
    assert!(matches!(b.visible("v1"), Err(VolumeError::NotReady)));
    assert!(matches!(b.page(None, 0), Err(VolumeError::NotReady)));
}

#[test]
fn a_claim_from_before_a_restart_does_not_free_a_newer_claim() {
    let mut b = book_with(vec![]);
    let old = b.claim("v1").expect("free");
    b.reset();
    b.load(vec![], None);
    let new = b.claim("v1").expect("the restart freed every volume");
    drop(old);
    assert!(b.is_busy("v1"), "the old claim's drop leaves the new one");
    drop(new);
    assert!(!b.is_busy("v1"));
}

#[test]
fn a_drive_is_claimed_whole_or_not_at_all() {
    let b = book_with(vec![available(1), available(2)]);
    let busy = b.claim(&available(2).id).expect("free");
    assert!(b.claim_drive("d1").is_none());
    assert!(!b.is_busy(&available(1).id), "the partial claim was released");
    drop(busy);
    let (claims, recs) = b.claim_drive("d1").expect("all free");
    assert_eq!((claims.len(), recs.len()), (2, 2));
}

/// Volume `n` under the id CreateVolume derives from its name.
fn named(n: u8) -> VolumeRecord {
    let mut r = available(n);
    r.part_guid = gpt::volume_partition_guid(&r.name);
    r.id = r.part_guid.to_string();
    r
}

#[test]
fn create_decisions() {
    let name_of = |n: u8| available(n).name;
    let mut deleting = named(3);
    deleting.state = VolumeState::Deleting;
    let mut lost = named(4);
    lost.lost = true;
    let b = book_with(vec![named(1), deleting, lost]);
    // (request, expected outcome as text)
    let table: Vec<(CreateVolume, &str)> = vec![
        (create(&name_of(1), 0), "existing"),
        (create(&name_of(1), 2 * MIB), "volume pvc-1 exists with 1048576 bytes, outside the requested capacity range"),
        (CreateVolume { block: true, ..create(&name_of(1), 0) }, "volume pvc-1 exists with different parameters or access type"),
        (create(&name_of(3), 0), "is being deleted; retry CreateVolume once DeleteVolume finished"),
        (create(&name_of(4), 0), "the data is gone"),
        (create("new", 32 * MIB), "new"),
        (create("huge", 4 * GIB), "capacity range cannot be met"),
    ];
    for (m, want) in table {
        let got = match b.plan_create(&m) {
            Ok(CreatePlan::Existing(_)) => "existing".to_string(),
            Ok(CreatePlan::New(r)) => {
                assert_eq!((r.state, r.drive_id.as_str(), r.size), (VolumeState::Creating, "d1", 32 * MIB));
                "new".to_string()
            }
            Err(e) => e.to_string(),
        };
        assert!(got.contains(want), "{}: {got}", m.name);
    }
}

#[test]
fn a_reserved_create_takes_its_space_from_the_next_one() {
    let mut b = book_with(vec![]);
    let Ok(CreatePlan::New(first)) = b.plan_create(&create("a", 8 * MIB)) else { panic!("placed") };
    b.reserve(first.clone());
    let Ok(CreatePlan::New(second)) = b.plan_create(&create("b", 8 * MIB)) else { panic!("placed") };
    assert!(second.start >= first.start + first.size || second.start + second.size <= first.start, "{first:?} {second:?}");
    // A Creating record is never shown.
    assert!(matches!(b.visible(&first.id), Err(VolumeError::NotFound { .. })));
    assert!(b.page(None, 0).expect("ready").0.is_empty());
}

#[test]
fn no_managed_drive_with_room_is_resource_exhausted() {
    let mut b = book_with(vec![]);
    b.drive_refused("d1", "an ext4 filesystem");
    assert!(matches!(b.plan_create(&create("a", MIB)), Err(VolumeError::ResourceExhausted { .. })));
}

#[test]
fn attach_decisions() {
    let mut elsewhere = available(2);
    elsewhere.published_node = Some("node-b".into());
    let mut deleting = available(3);
    deleting.state = VolumeState::Deleting;
    let mut away = available(4);
    away.drive_id = "gone".into();
    let b = book_with(vec![available(1), elsewhere, deleting, away]);
    let id = |n: u8| available(n).id;
    let table: Vec<(AttachVolume, Result<(), &str>)> = vec![
        (attach(&id(1), "node-a"), Ok(())),
        (AttachVolume { block: true, ..attach(&id(1), "node-a") }, Err("was created for filesystem access; it cannot be published for block access")),
        (AttachVolume { fs_type: "xfs".into(), ..attach(&id(1), "node-a") }, Err("holds ext4, not xfs")),
        (attach(&id(2), "node-a"), Err("is already attached to node node-b")),
        (attach(&id(2), "node-b"), Ok(())),
        (attach(&id(3), "node-a"), Err("in progress")),
        (attach(&id(4), "node-a"), Err("which is missing from this node")),
        (attach("nope", "node-a"), Err("volume nope does not exist")),
    ];
    for (m, want) in table {
        match (b.attach_refusal(&m), want) {
            (Ok(_), Ok(())) => {}
            (Err(e), Err(text)) => assert!(e.to_string().contains(text), "{}: {e}", m.volume_id),
            (got, want) => panic!("{}: {got:?}, wanted {want:?}", m.volume_id),
        }
    }
}

#[test]
fn detach_decisions() {
    let mut attached = available(1);
    attached.published_node = Some("node-a".into());
    let b = book_with(vec![attached.clone(), available(2)]);
    let detach = |id: &str, node: Option<&str>| DetachVolume { volume_id: id.into(), node_id: node.map(String::from) };
    assert!(b.plan_detach(&detach("nope", None)).expect("ready").is_none(), "unknown: done already");
    assert!(b.plan_detach(&detach(&available(2).id, None)).expect("ready").is_none(), "not attached: done already");
    assert!(b.plan_detach(&detach(&attached.id, Some("node-b"))).expect("ready").is_none(), "another node's: not ours");
    let (rec, node) = b.plan_detach(&detach(&attached.id, Some("node-a"))).expect("ready").expect("detaches");
    assert_eq!((rec.published_node, node.as_str()), (None, "node-a"));
}

/// The size an expansion plans in place; panics on a move or a refusal.
fn in_place(p: Result<ExpandPlan, VolumeError>) -> u64 {
    match p {
        Ok(ExpandPlan::InPlace { new_size, .. }) => new_size,
        other => panic!("{other:?}"),
    }
}

#[test]
fn expand_decisions() {
    // Volume 1 at 1 MiB with volume 3 at 3 MiB after it; volume 8 at 8 MiB, free after.
    let b = book_with(vec![available(1), available(3), available(8)]);
    let expand = |n: u8, required: u64| ExpandVolume { volume_id: available(n).id, range: CapacityRange { required, limit: 0 } };
    assert_eq!(in_place(b.expand_check(&expand(1, 2 * MIB))), 2 * MIB, "room up to volume 3");
    assert!(matches!(b.expand_check(&expand(1, 4 * MIB)), Ok(ExpandPlan::Move(_))), "volume 3 is in the way: a move elsewhere on d1");
    let e = b.expand_check(&expand(8, 2 * GIB)).expect_err("past the end");
    assert!(matches!(e, VolumeError::OutOfRange { .. }) && e.to_string().contains("the drive ends there"), "{e}");
    assert_eq!(in_place(b.expand_check(&expand(8, 0))), MIB, "no size asked: stays");
}

#[test]
fn a_volume_with_no_room_after_it_grows_by_moving_to_another_drive_and_one_in_use_waits_for_its_next_stage() {
    // d1 (1 GiB): volume 1 at 1 MiB, volume 3 right after it. d2 (1 GiB) empty.
    let mut b = book_with(vec![available(1), available(3)]);
    b.add_drives(vec![Drive::for_test("d2", Media::Ssd, GIB)]);
    let id = available(1).id;
    let expand = |required: u64| ExpandVolume { volume_id: id.clone(), range: CapacityRange { required, limit: 0 } };
    let region = gpt::usable_region(GIB, 512).map(|(s, e)| e - s).unwrap();
    // Unused: a move to d2, its copy already of the new size, at the start of d2's space.
    match b.expand_check(&expand(100 * MIB)) {
        Ok(ExpandPlan::Move(p)) => {
            let to = p.rec.moving.clone().expect("where the copy goes");
            assert_eq!((to.drive_id.as_str(), to.size, to.switched), ("d2", 100 * MIB, false));
            assert_eq!((p.rec.drive_id.as_str(), p.rec.size), ("d1", MIB), "the record is the volume as it is until the switch");
            assert_eq!(p.dst.path, std::path::PathBuf::from("/dev/d2"));
            b.start_grow_move(&p);
            assert!(b.candidates().iter().find(|c| c.drive.id == "d2").unwrap().used.contains(&(to.start, to.size)), "the copy's extent is reserved");
            b.records.insert(id.clone(), Arc::new(available(1)));
        }
        other => panic!("{other:?}"),
    }
    // More than any drive holds: OUT_OF_RANGE naming the most it can grow to.
    let e = b.expand_check(&expand(2 * GIB)).expect_err("too big anywhere");
    let words = e.to_string();
    assert!(matches!(e, VolumeError::OutOfRange { .. }), "{e}");
    assert!(words.contains("another volume or partition follows it") && words.contains(&format!("the largest it can grow to now is {} ({region} bytes)", human_bytes(region))), "{words}");
    // The move's reach is what GetCapacity promises.
    let cap = placement::capacity(&b.candidates(), None, LayoutKind::Partition, MIB);
    assert_eq!(b.move_reach(&available(1)), cap.maximum_volume_size);
    // Staged: refused in words, FAILED_PRECONDITION, saying it grows at its next stage.
    let mut staged = available(1);
    staged.state = VolumeState::Staged;
    staged.staging = Some(Staging { path: "/k/s1".into(), block: false, flags: vec![], readonly: false, done: true });
    b.records.insert(id.clone(), Arc::new(staged));
    match b.expand_check(&expand(100 * MIB)) {
        Err(e @ VolumeError::GrowsWhenUnused { .. }) => {
            let w = e.to_string();
            assert!(w.contains("staged at /k/s1") && w.contains("grows at its next stage, once no pod uses it") && w.contains("drive d2"), "{w}");
        }
        other => panic!("{other:?}"),
    }
    // Attached only (a pod gone, the detach not yet done): it waits too.
    let mut attached = available(1);
    attached.published_node = Some("n1".into());
    b.records.insert(id.clone(), Arc::new(attached));
    assert!(matches!(b.expand_check(&expand(100 * MIB)), Err(VolumeError::GrowsWhenUnused { .. })));
    // In use but nowhere to move: the room error, not a promise.
    assert!(matches!(b.expand_check(&expand(2 * GIB)), Err(VolumeError::OutOfRange { .. })));
    // Room on d2 only once it is cleaned, and on d1 now: a move elsewhere on d1.
    b.records.insert(id.clone(), Arc::new(available(1)));
    let d2 = gpt::usable_region(GIB, 512).unwrap();
    b.add_dirty("d2", (d2.0, d2.1 - d2.0));
    match b.expand_check(&expand(100 * MIB)) {
        Ok(ExpandPlan::Move(p)) => assert_eq!(p.rec.moving.map(|m| m.drive_id), Some("d1".to_string())),
        other => panic!("{other:?}"),
    }
    // Room on either drive only once it is cleaned: RESOURCE_EXHAUSTED, saying so.
    b.add_dirty("d1", (4 * MIB, d2.1 - 4 * MIB));
    match b.expand_check(&expand(100 * MIB)) {
        Err(VolumeError::ResourceExhausted { reason }) => assert!(reason.contains("still being cleaned"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // A class that asked for a media moves only to a drive of it.
    let hdd = VolumeRecord { parameters: [("media".to_string(), "hdd".to_string())].into_iter().collect(), ..available(1) };
    b.cleaned("d2", (d2.0, d2.1 - d2.0));
    b.records.insert(id.clone(), Arc::new(hdd));
    assert!(matches!(b.expand_check(&expand(100 * MIB)), Err(VolumeError::ResourceExhausted { .. })), "no hdd drive to move to; volume 3 may go");
}

#[test]
fn a_whole_drive_volume_grows_by_moving_to_a_bigger_empty_drive_and_takes_all_of_it() {
    // d1 (1 GiB) is one whole-drive volume; d2 (4 GiB) is empty; d3 (8 GiB) holds a volume.
    let d1 = gpt::usable_region(GIB, 512).unwrap();
    let whole = VolumeRecord { layout: LayoutKind::Drive, start: d1.0, size: d1.1 - d1.0, ..available(1) };
    let mut b = book_with(vec![whole.clone()]);
    b.add_drives(vec![Drive::for_test("d2", Media::Ssd, 4 * GIB), Drive::for_test("d3", Media::Ssd, 8 * GIB)]);
    b.records.insert(available(2).id, Arc::new(VolumeRecord { drive_id: "d3".into(), ..available(2) }));
    let id = whole.id.clone();
    let expand = |required: u64| ExpandVolume { volume_id: id.clone(), range: CapacityRange { required, limit: 0 } };
    let d2 = gpt::usable_region(4 * GIB, 512).unwrap();
    match b.expand_check(&expand(2 * GIB)) {
        Ok(ExpandPlan::Move(p)) => {
            let to = p.rec.moving.clone().expect("where the copy goes");
            assert_eq!((to.drive_id.as_str(), to.start, to.size), ("d2", d2.0, d2.1 - d2.0), "the empty drive's whole region, not the size asked");
            assert_eq!(to.copy_guid, None, "another drive: the copy carries the volume's GUID");
        }
        other => panic!("{other:?}"),
    }
    // More than any empty drive holds (d3 is bigger, but not empty): OUT_OF_RANGE naming
    // the largest, which is what GetCapacity promises a whole-drive class.
    let e = b.expand_check(&expand(6 * GIB)).expect_err("no empty drive that big");
    let words = e.to_string();
    assert!(matches!(e, VolumeError::OutOfRange { .. }), "{e}");
    assert!(words.contains("the drive ends there") && words.contains("the largest empty drive it could move to on this node holds"), "{words}");
    let cap = placement::capacity(&b.candidates(), None, LayoutKind::Drive, MIB);
    assert_eq!(b.move_reach(&whole), cap.maximum_volume_size);
    assert_eq!(cap.maximum_volume_size, d2.1 - d2.0);
    // In use: it waits for its next stage.
    let staged = VolumeRecord {
        state: VolumeState::Staged,
        staging: Some(Staging { path: "/k/s1".into(), block: false, flags: vec![], readonly: false, done: true }),
        ..whole.clone()
    };
    b.records.insert(id.clone(), Arc::new(staged));
    assert!(matches!(b.expand_check(&expand(2 * GIB)), Err(VolumeError::GrowsWhenUnused { .. })));
    // No empty drive at all: said in words.
    b.records.insert(id.clone(), Arc::new(whole.clone()));
    b.records.insert(available(3).id, Arc::new(VolumeRecord { drive_id: "d2".into(), ..available(3) }));
    let words = b.expand_check(&expand(2 * GIB)).expect_err("nowhere to go").to_string();
    assert!(words.contains("no other managed drive of this node is empty and larger than it to move it to"), "{words}");
}

#[test]
fn a_volume_with_a_neighbour_after_it_on_a_single_drive_grows_by_moving_elsewhere_on_its_drive() {
    // d1 (1 GiB) only: volume 1 at 1 MiB, volume 2 right after it, free space beyond.
    let mut b = book_with(vec![available(1), available(2)]);
    let id = available(1).id;
    let expand = |required: u64| ExpandVolume { volume_id: id.clone(), range: CapacityRange { required, limit: 0 } };
    let (_, region_end) = gpt::usable_region(GIB, 512).unwrap();
    match b.expand_check(&expand(100 * MIB)) {
        Ok(ExpandPlan::Move(p)) => {
            let to = p.rec.moving.clone().expect("where the copy goes");
            assert_eq!((to.drive_id.as_str(), to.size, to.switched), ("d1", 100 * MIB, false), "elsewhere on its own drive, at the new size");
            let copy = to.copy_guid.expect("a copy on its own drive carries a GUID of its own");
            assert_ne!(copy, p.rec.part_guid);
            let (own, next) = ((MIB, MIB), (2 * MIB, MIB));
            let apart = |a: (u64, u64), b: (u64, u64)| a.0 + a.1 <= b.0 || b.0 + b.1 <= a.0;
            assert!(apart((to.start, to.size), own) && apart((to.start, to.size), next), "the copy overlaps neither the volume nor its neighbour: {to:?}");
            assert!(to.start + to.size <= region_end);
            assert_eq!((p.rec.start, p.rec.size), (MIB, MIB), "the record is the volume as it is until the switch");
            assert_eq!((p.src.path.clone(), p.dst.path.clone()), (PathBuf::from("/dev/d1"), PathBuf::from("/dev/d1")));
            b.start_grow_move(&p);
            let used = b.candidates()[0].used.to_vec();
            assert!(used.contains(&own) && used.contains(&(to.start, to.size)), "both extents are taken meanwhile: {used:?}");
            // Ended either way: a rollback frees the copy's extent, a finish the old one.
            let rolled_back = available(1);
            assert_eq!(b.freed_by(&id, Some(&rolled_back), None), Some(("d1".to_string(), (to.start, to.size))));
            let moved = VolumeRecord { start: to.start, size: to.size, ..available(1) };
            assert_eq!(b.freed_by(&id, Some(&moved), None), Some(("d1".to_string(), own)));
            b.records.insert(id.clone(), Arc::new(available(1)));
        }
        other => panic!("{other:?}"),
    }
    // More than the drive holds: OUT_OF_RANGE, the largest named is the largest free
    // extent of the drive (the volume's own extent taken), what GetCapacity promises.
    let largest = region_end - 3 * MIB;
    let e = b.expand_check(&expand(2 * GIB)).expect_err("too big");
    let words = e.to_string();
    assert!(matches!(e, VolumeError::OutOfRange { .. }), "{e}");
    assert!(words.contains(&format!("the largest it can grow to now is {} ({largest} bytes)", human_bytes(largest))), "{words}");
    assert!(words.contains(&format!("the largest free extent it could move to on the drives of this node holds {}", human_bytes(largest))), "{words}");
    let cap = placement::capacity(&b.candidates(), None, LayoutKind::Partition, MIB);
    assert_eq!((b.move_reach(&available(1)), cap.maximum_volume_size), (largest, largest));
    // The rest of the drive taken: no room anywhere, RESOURCE_EXHAUSTED (volume 2 may go).
    let rest = VolumeRecord { start: 3 * MIB, size: largest, ..VolumeRecord::for_test(3, VolumeState::Available) };
    b.records.insert(rest.id.clone(), Arc::new(rest));
    let e = b.expand_check(&expand(2 * MIB)).expect_err("the drive is full");
    assert!(matches!(e, VolumeError::ResourceExhausted { .. }), "{e}");
    assert!(e.to_string().contains("no managed drive of this node, its own included, has a free extent to move it to"), "{e}");
    assert_eq!(b.move_reach(&available(1)), 0);
}

#[test]
fn a_growth_by_a_move_prefers_another_drive_to_its_own() {
    // d1: volume 1 with volume 2 after it, room beyond; d2 empty: the copy goes to d2.
    let mut b = book_with(vec![available(1), available(2)]);
    b.add_drives(vec![Drive::for_test("d2", Media::Ssd, GIB)]);
    let m = ExpandVolume { volume_id: available(1).id, range: CapacityRange { required: 100 * MIB, limit: 0 } };
    match b.expand_check(&m) {
        Ok(ExpandPlan::Move(p)) => {
            let to = p.rec.moving.expect("a move");
            assert_eq!((to.drive_id.as_str(), to.copy_guid), ("d2", None), "another drive, the copy with the volume's GUID");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn node_expand_needs_a_path_of_the_volume() {
    let mut staged = available(1);
    staged.staging = Some(Staging { path: "/var/lib/kubelet/s".into(), block: false, flags: vec![], readonly: false, done: true });
    let loc = Some(DriveLoc { path: "/dev/d1".into(), sector: 512 });
    let m = |p: &str| NodeExpandVolume { volume_id: staged.id.clone(), path: PathBuf::from(p) };
    assert!(VolumeBook::node_expand_check(&m("/var/lib/kubelet/s"), &staged, loc.clone()).is_ok());
    let e = VolumeBook::node_expand_check(&m("/elsewhere"), &staged, loc).expect_err("not its path");
    assert!(matches!(e, VolumeError::PathNotFound { .. }), "{e}");
    let e = VolumeBook::node_expand_check(&m("/var/lib/kubelet/s"), &staged, None).expect_err("adopted");
    assert!(e.to_string().contains("is adopted: its filesystem is not drivelet's to grow"), "{e}");
}

#[test]
fn a_release_closes_the_drive_and_completes_when_it_empties() {
    let mut b = book_with(vec![available(1)]);
    let release = |force| ReleaseDrive { drive_id: "d1".into(), force };
    let e = b.release(&ReleaseDrive { drive_id: "nope".into(), force: false }).expect_err("unknown drive");
    assert!(e.to_string().contains("no drive with id nope is known on this node"), "{e}");
    let plan = b.release(&release(false)).expect("known");
    assert_eq!((plan.usage.state, plan.failed.len()), (DriveUseState::Releasing, 0));
    assert!(matches!(b.plan_create(&create("a", MIB)), Err(VolumeError::ResourceExhausted { .. })), "closed to placement");
    assert!(b.settle_drive("d1").is_none(), "still holds a volume");
    let id = available(1).id;
    let before = b.shown(&id);
    assert_eq!(b.finish(&id, before, None, true).into_iter().collect::<Vec<_>>(), vec!["d1".to_string()]);
    assert_eq!(b.settle_drive("d1").map(|u| u.state), Some(DriveUseState::Released));
}

#[test]
fn a_forced_release_fails_the_volumes_on_the_drive() {
    let mut b = book_with(vec![available(1), available(2)]);
    let plan = b.release(&ReleaseDrive { drive_id: "d1".into(), force: true }).expect("known");
    assert_eq!(plan.usage.state, DriveUseState::Released);
    assert_eq!(plan.failed.len(), 2);
    assert!(b.records().all(|r| r.failed));
}

#[test]
fn pages_skip_volumes_being_created_and_say_where_to_go_on() {
    let mut creating = available(2);
    creating.state = VolumeState::Creating;
    let b = book_with(vec![available(1), creating, available(3), available(4)]);
    let (page, next) = b.page(None, 2).expect("ready");
    assert_eq!(page.iter().map(|s| s.record.id.clone()).collect::<Vec<_>>(), vec![available(1).id, available(3).id]);
    assert_eq!(next, Some(available(3).id));
    let (page, next) = b.page(next.as_deref(), 2).expect("ready");
    assert_eq!((page.len(), next), (1, None));
}

#[test]
fn adopt_decisions() {
    let b = book_with(vec![available(1)]);
    let adopt = |id: &str| AdoptVolume { volume_id: id.into(), pv_name: "pv-1".into(), path: "/data/x".into(), fs_type: "ext4".into() };
    let dir = std::path::Path::new("/data/x");
    let Ok(CreatePlan::New(rec)) = b.plan_adopt(&adopt("local-1"), dir, None, 5) else { panic!("new") };
    assert_eq!((rec.size, rec.drive_id.as_str(), rec.state), (5, "", VolumeState::Available));
    let e = b.plan_adopt(&adopt(&available(1).id), dir, None, 5).expect_err("id taken");
    assert!(e.to_string().contains("exists with other data"), "{e}");
    let mut b = b;
    b.reserve(rec);
    assert!(matches!(b.plan_adopt(&adopt("local-1"), dir, None, 5), Ok(CreatePlan::Existing(_))), "idempotent");
    let e = b.plan_adopt(&adopt("local-2"), dir, None, 5).expect_err("directory taken");
    assert!(e.to_string().contains("already adopts /data/x"), "{e}");
}

#[test]
fn a_check_racing_an_operation_is_dropped() {
    let mut b = book_with(vec![available(1)]);
    let id = available(1).id;
    let claim = b.claim(&id).expect("free");
    assert!(!b.checked(id.clone(), vec![]));
    drop(claim);
    assert!(b.checked(id, vec![]));
    assert!(!b.checked("nope".into(), vec![]));
}

#[test]
fn clone_decisions() {
    // Sources on d1: 1 at 1 MiB (ext4, 32 MiB), and variants of it.
    let src = |n: u8, f: &dyn Fn(&mut VolumeRecord)| {
        let mut r = available(n);
        r.start = n as u64 * 64 * MIB;
        r.size = 32 * MIB;
        f(&mut r);
        r
    };
    let stage = |readonly: bool| Staging { path: "/k/s".into(), block: false, flags: vec![], readonly, done: true };
    let plain = src(1, &|_| {});
    let rw = src(2, &|r| r.staging = Some(stage(false)));
    let ro = src(3, &|r| r.staging = Some(stage(true)));
    let lost = src(4, &|r| r.lost = true);
    let adopted = src(5, &|r| r.adopted = Some(crate::actors::volumes::model::Adopted { path: "/mnt/disks/a".into(), pv_name: "pv-a".into() }));
    let deleting = src(6, &|r| r.state = VolumeState::Deleting);
    let blank = src(7, &|r| {
        r.formatted = false;
        r.fs_type = String::new();
    });
    let xfs = src(8, &|r| r.fs_type = "xfs".into());
    let b = book_with(vec![plain.clone(), rw.clone(), ro.clone(), lost.clone(), adopted.clone(), deleting.clone(), blank.clone(), xfs.clone()]);
    let of = |s: &VolumeRecord, required: u64, limit: u64, f: &dyn Fn(&mut CreateVolume)| {
        let mut m = CreateVolume { source: Some(s.id.clone()), range: CapacityRange { required, limit }, ..create("pvc-clone", 0) };
        f(&mut m);
        m
    };
    // (request, expected: size and filesystem of the new clone, or the error's words)
    type Want = Result<(u64, &'static str), &'static str>;
    let table: Vec<(CreateVolume, Want)> = vec![
        (of(&plain, 0, 0, &|_| {}), Ok((32 * MIB, "ext4"))),
        (of(&plain, 8 * MIB, 0, &|_| {}), Ok((32 * MIB, "ext4"))),
        (of(&plain, 48 * MIB, 0, &|_| {}), Ok((48 * MIB, "ext4"))),
        (of(&xfs, 0, 0, &|_| {}), Ok((300 * MIB, "xfs"))),
        (of(&ro, 0, 0, &|_| {}), Ok((32 * MIB, "ext4"))),
        (of(&blank, 0, 0, &|m| m.fs_type = "xfs".into()), Ok((300 * MIB, "xfs"))),
        (of(&plain, 0, 16 * MIB, &|_| {}), Err("needs at least 32.0 MiB (the size of the source), but limit_bytes allows 16.0 MiB")),
        (of(&plain, 0, 0, &|m| m.source = Some("nope".into())), Err("source volume nope does not exist on this node")),
        (of(&plain, 0, 0, &|m| m.block = true), Err("it is a filesystem volume; a clone of it cannot be a block volume")),
        (of(&plain, 0, 0, &|m| m.fs_type = "xfs".into()), Err("it holds ext4, not xfs")),
        // In use: frozen for the copy by default, refused when the class says so.
        (of(&rw, 0, 0, &|_| {}), Ok((32 * MIB, "ext4"))),
        (
            of(&rw, 0, 0, &|m| m.parameters = [("drivelet.io/clone-in-use".to_string(), "refuse".to_string())].into()),
            Err("it is mounted read-write at /k/s, and its StorageClass says drivelet.io/clone-in-use: refuse"),
        ),
        (of(&lost, 0, 0, &|_| {}), Err("the data is gone")),
        (of(&adopted, 0, 0, &|_| {}), Err("it is adopted from /mnt/disks/a")),
        (of(&deleting, 0, 0, &|_| {}), Err("another operation on volume")),
    ];
    for (m, want) in table {
        let what = format!("{:?} of {:?} ({:?})", m.source, m.range, m.fs_type);
        match (b.plan_create(&m), want) {
            (Ok(CreatePlan::New(r)), Ok((size, fs))) => {
                assert_eq!((r.size, r.fs_type.as_str(), r.clone_of.as_ref()), (size, fs, m.source.as_ref()), "{what}");
                assert!(!r.formatted, "{what}: formatted only once the copy is done");
            }
            (Err(e), Err(words)) => assert!(e.to_string().contains(words), "{what}: {e}"),
            (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn the_health_list_pages_only_abnormal_volumes_and_storage_health_counts_missing_drives() {
    let mut on_gone = available(2);
    on_gone.drive_id = "gone".into();
    let mut also_gone = available(4);
    also_gone.drive_id = "gone".into();
    let mut creating = available(5);
    creating.drive_id = "gone".into();
    creating.state = VolumeState::Creating;
    let b = book_with(vec![available(1), on_gone, available(3), also_gone, creating]);
    let (page, next) = b.page_where(None, 1, true).expect("ready");
    assert_eq!(page.iter().map(|s| s.record.id.clone()).collect::<Vec<_>>(), vec![available(2).id]);
    assert!(page[0].condition.abnormal && !page[0].condition.entries.is_empty());
    let (page, next) = b.page_where(next.as_deref(), 1, true).expect("ready");
    assert_eq!(page.iter().map(|s| s.record.id.clone()).collect::<Vec<_>>(), vec![available(4).id]);
    assert_eq!(next, None, "no token when nothing unhealthy follows (a healthy volume does)");
    assert_eq!(b.page_where(None, 0, false).expect("ready").0.len(), 4, "all shown volumes without the filter");
    let st = b.storage_health().expect("ready");
    assert_eq!(st.len(), 1, "{st:?}");
    assert_eq!((st[0].status, st[0].reason), (conditions::StorageStatus::StorageUnreachable, conditions::Reason::DriveMissing));
    assert!(st[0].message.contains("drive gone holding 2 volumes"), "a volume being created does not count: {}", st[0].message);
    assert!(matches!(VolumeBook::new(VolumesConfig::default(), false).storage_health(), Err(VolumeError::NotReady)));
}

#[test]
fn a_drive_that_comes_back_shows_its_volumes_normal_only_once_they_are_reconciled() {
    use crate::actors::messages::DriveEvent;
    let mut b = book_with(vec![available(1)]);
    let id = available(1).id;
    b.refresh(|_| true);
    assert!(!b.condition_of(b.visible(&id).unwrap()).abnormal, "normal while its drive is here");
    let d1 = Drive::for_test("d1", Media::Ssd, GIB);
    b.drive_event(DriveEvent::DriveRemoved(d1.clone()));
    b.refresh(|_| true);
    let missing = b.condition_of(b.visible(&id).unwrap());
    assert!(missing.abnormal && missing.message.contains("missing"), "{}", missing.message);

    // It comes back: its volumes are reconciled with its partitions (claimed meanwhile),
    // and their condition holds still until that is done.
    let (_, fx) = b.drive_event(DriveEvent::DriveAppeared(d1));
    assert!(fx.reread.is_some(), "a drive that comes back is read again");
    let (claims, _) = b.claim_drive("d1").expect("nothing else holds its volumes");
    assert!(b.refresh(|_| true).is_empty(), "no condition change while reconciling");
    assert_eq!(b.condition_of(b.visible(&id).unwrap()), missing);
    assert_eq!(b.status(&id).unwrap().condition, missing, "the status says the same");
    drop(claims);
    b.reconciled("d1");
    let back = b.refresh(|_| true);
    assert_eq!(back.len(), 1, "one change once reconciled: {back:?}");
    assert!(!back[0].abnormal);
    assert!(!b.condition_of(b.visible(&id).unwrap()).abnormal);
    assert!(b.claim(&id).is_ok(), "a volume shown normal again is free to stage");
    b.reconciled("d1");
    assert!(!b.condition_of(b.visible(&id).unwrap()).abnormal, "an extra end changes nothing");
}

#[test]
fn space_being_cleaned_is_neither_placed_on_nor_promised_and_a_create_needing_it_is_told_why() {
    let mut b = book_with(vec![]);
    let region = gpt::usable_region(GIB, 512).map(|(s, e)| (s, e - s)).unwrap();
    let cap = |b: &VolumeBook| {
        let m = crate::actors::volumes::messages::GetCapacity { media: None, layout: LayoutKind::Partition, minimum: MIB };
        b.view_reader().get().unwrap().capacity(&m).unwrap()
    };
    assert_eq!(cap(&b).available, region.1);
    // A deleted 512 MiB volume at the start: dirty until cleaned.
    b.add_dirty("d1", (region.0, 512 * MIB));
    assert_eq!(cap(&b).available, region.1 - 512 * MIB, "GetCapacity counts only clean space");
    assert_eq!(cap(&b).maximum_volume_size, region.1 - 512 * MIB);
    let p = match b.plan_create(&create("small", 16 * MIB)).unwrap() {
        CreatePlan::New(r) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(p.start, region.0 + 512 * MIB, "placed after the space being cleaned");
    let big = create("big", region.1 - 256 * MIB);
    match b.plan_create(&big) {
        Err(VolumeError::ResourceExhausted { reason }) => {
            assert!(reason.contains("512.0 MiB being cleaned (0% done) on drive d1"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(b.fits_after_cleaning(&big, gpt::volume_partition_guid(&big.name)), "it fits once clean: the create waits");
    assert!(!b.fits_after_cleaning(&create("huge", 2 * GIB), gpt::volume_partition_guid("huge")), "never fits: no wait");
    // Half cleaned: progress, and still refused.
    b.cleaned("d1", (region.0, 256 * MIB));
    assert_eq!(b.cleaning()[0].percent_done(), 50);
    assert_eq!(cap(&b).available, region.1 - 256 * MIB);
    b.add_dirty("d1", (region.0 + 512 * MIB, 64 * MIB));
    assert_eq!((b.cleaning()[0].left_bytes, b.cleaning()[0].round_bytes), (320 * MIB, 576 * MIB), "a freed extent next to one being cleaned joins the round");
    b.cleaned("d1", (region.0 + 256 * MIB, 320 * MIB));
    assert!(b.cleaning().is_empty());
    assert_eq!(cap(&b).available, region.1);
    assert!(matches!(b.plan_create(&big), Ok(CreatePlan::New(_))));
}

#[test]
fn an_evacuation_is_refused_whole_without_room_and_once_asked_moves_unstaged_volumes_smallest_first() {
    use crate::actors::volumes::evacuate::PendingState;
    use crate::actors::volumes::messages::EvacuateDrive;
    let sized = |n: u8, mib: u64| {
        let mut r = available(n);
        r.start = 64 * MIB * n as u64;
        r.size = mib * MIB;
        r
    };
    let mut staged = sized(3, 8);
    staged.state = VolumeState::Staged;
    staged.staging = Some(Staging { path: "/k/s3".into(), block: false, flags: vec![], readonly: false, done: true });
    let mut b = book_with(vec![sized(1, 32), sized(2, 16), staged]);
    let ask = |force| EvacuateDrive { drive_id: "d1".into(), force };
    // No other drive: refused, nothing decided.
    let e = b.evacuate(&ask(false)).unwrap_err();
    assert!(matches!(e, VolumeError::ResourceExhausted { .. }) && e.to_string().contains("nothing was moved"), "{e}");
    assert!(b.drive_uses().is_empty(), "the drive stays open");
    assert!(b.next_move().is_none(), "nothing moves");
    // Unknown drive: INVALID_ARGUMENT.
    let e = b.evacuate(&EvacuateDrive { drive_id: "nope".into(), force: false }).unwrap_err();
    assert!(matches!(e, VolumeError::InvalidArgument { .. }), "{e}");
    // A drive with room for all: asked, the drive is releasing with the intent kept.
    b.add_drives(vec![Drive::for_test("d2", Media::Ssd, GIB)]);
    let u = b.evacuate(&ask(false)).expect("room on d2");
    assert_eq!((u.state, u.evacuate.map(|e| e.force)), (DriveUseState::Releasing, Some(false)));
    // Smallest unstaged first; the staged one waits and says where it is staged.
    let (plan, force) = b.next_move().expect("a move");
    assert_eq!((plan.rec.id.as_str(), force), (sized(2, 16).id.as_str(), false));
    let to = plan.rec.moving.clone().expect("where the copy goes");
    assert_eq!((to.drive_id.as_str(), to.size, to.switched), ("d2", 16 * MIB, false));
    b.reserve_move(plan.rec.clone());
    let (next, _) = b.next_move().expect("another move");
    assert_eq!(next.rec.id, sized(1, 32).id, "the moving one is not picked again");
    let next_to = next.rec.moving.clone().unwrap();
    assert!(next_to.start >= to.start + to.size || next_to.start + next_to.size <= to.start, "the copy's extent is reserved");
    b.evac.moving = Some(plan.rec.id.clone());
    let list = b.evacuations();
    let states: Vec<(String, PendingState)> = list[0].pending.iter().map(|p| (p.volume_id.clone(), p.state)).collect();
    assert!(states.contains(&(plan.rec.id.clone(), PendingState::Moving)), "{states:?}");
    let waiting = list[0].pending.iter().find(|p| p.state == PendingState::Waiting).expect("the staged one waits");
    assert!(waiting.reason.contains("/k/s3"), "{}", waiting.reason);
    assert!(list[0].words().contains("1 moving") && list[0].words().contains("1 waiting"), "{}", list[0].words());
    // A failed move is not retried until asked again; asked with force, it is.
    b.evac.moving = None;
    b.evac.failed.insert(next.rec.id.clone(), "cannot be read".into());
    b.records.insert(plan.rec.id.clone(), Arc::new(sized(2, 16)));
    let (again, _) = b.next_move().expect("the first one again");
    assert_eq!(again.rec.id, plan.rec.id);
    b.evacuate(&ask(true)).expect("asked again");
    assert!(b.evac.failed.is_empty(), "asking again retries the failed ones");
    // An empty drive is evacuated at once: released, and listed as done.
    let mut empty = book_with(vec![]);
    let u = empty.evacuate(&ask(false)).expect("nothing to move");
    assert_eq!((u.state, u.evacuate.is_some()), (DriveUseState::Released, true));
    assert!(empty.evacuations()[0].done);
}

#[test]
fn a_stage_or_unstage_on_a_drive_being_evacuated_is_announced_and_elsewhere_it_is_not() {
    let mut b = book_with(vec![available(1)]);
    let id = available(1).id;
    let staged = |b: &VolumeBook| {
        let mut r = (**b.records.get(&id).expect("the volume")).clone();
        r.staging = Some(Staging { path: "/s".into(), block: true, flags: vec![], readonly: false, done: true });
        r
    };
    let before = b.shown(&id);
    let r = staged(&b);
    assert!(b.finish(&id, before, Some(r), false).is_empty(), "a stage on a drive not evacuated changes nothing its Drive object shows at once");
    let evacuating = DriveUse {
        drive_id: "d1".into(),
        state: DriveUseState::Releasing,
        reason: "evacuated".into(),
        requested: true,
        evacuate: Some(crate::words::Evacuate { force: false }),
    };
    b.drive_use.insert("d1".into(), evacuating);
    let before = b.shown(&id);
    let mut r = staged(&b);
    r.staging = None;
    assert_eq!(b.finish(&id, before, Some(r), false).into_iter().collect::<Vec<_>>(), vec!["d1".to_string()], "unstaged: the move waits no more");
}

#[test]
fn a_growth_by_moving_frees_the_old_extent_when_it_switched_and_the_copy_when_rolled_back() {
    let mut b = book_with(vec![available(1), available(3)]);
    b.add_drives(vec![Drive::for_test("d2", Media::Ssd, GIB)]);
    let id = available(1).id;
    let expand = ExpandVolume { volume_id: id.clone(), range: CapacityRange { required: 100 * MIB, limit: 0 } };
    let Ok(ExpandPlan::Move(p)) = b.expand_check(&expand) else { panic!("a move") };
    let to = p.rec.moving.clone().expect("the copy's extent");
    b.start_grow_move(&p);
    // Switched and finished: the record is on d2, grown; its old extent on d1 is freed.
    let moved = VolumeRecord { drive_id: "d2".into(), start: to.start, size: to.size, moving: None, ..available(1) };
    assert_eq!(b.freed_by(&id, Some(&moved), None), Some(("d1".to_string(), (MIB, MIB))));
    // Rolled back: the copy's extent on d2 held the volume's bytes.
    assert_eq!(b.freed_by(&id, Some(&available(1)), None), Some(("d2".to_string(), (to.start, to.size))));
    // Switched but not finished (a restart finishes it): nothing is free yet.
    let half = VolumeRecord { moving: Some(Box::new(Move { drive_id: "d1".into(), start: MIB, size: MIB, switched: true, unreadable: vec![], copy_guid: None })), ..moved };
    assert_eq!(b.freed_by(&id, Some(&half), None), None);
    // An evacuation's move frees through its own end, never twice.
    b.evac.moving = Some(id.clone());
    assert_eq!(b.freed_by(&id, Some(&available(1)), None), None);
    // An ordinary call on a volume that is not moving frees nothing.
    b.evac.moving = None;
    b.records.insert(id.clone(), Arc::new(available(1)));
    assert_eq!(b.freed_by(&id, Some(&available(1)), None), None);
}

#[test]
fn a_volume_grows_in_place_into_space_being_cleaned_only_once_it_is_clean() {
    // Volume 1 at 1 MiB; a deleted neighbour's [2, 4) MiB still being cleaned; volume 8 at 8 MiB.
    let mut b = book_with(vec![available(1), available(8)]);
    b.add_dirty("d1", (2 * MIB, 2 * MIB));
    let expand = |required: u64| ExpandVolume { volume_id: available(1).id, range: CapacityRange { required, limit: 0 } };
    match b.expand_check(&expand(3 * MIB)) {
        Ok(ExpandPlan::WaitForCleaning { reason }) => {
            assert!(reason.contains("once the space after it on drive d1 is cleaned") && reason.contains("being zeroed"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    // Past what cleaning frees (volume 8 follows): not a wait, a move elsewhere on d1.
    assert!(matches!(b.expand_check(&expand(8 * MIB)), Ok(ExpandPlan::Move(_))));
    // Cleaned: in place.
    b.cleaned("d1", (2 * MIB, 2 * MIB));
    assert_eq!(in_place(b.expand_check(&expand(3 * MIB))), 3 * MIB);
}
