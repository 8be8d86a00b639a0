//! Table tests of the drive action decisions.

use super::*;
use crate::actors::volumes::{MovedVolume, PendingMove};
use crate::words::Evacuate;

fn of(state: DriveUseState, requested: bool) -> DriveUse {
    DriveUse { drive_id: "d1".into(), state, reason: "asked".into(), requested, evacuate: None }
}

fn evacuating(state: DriveUseState) -> DriveUse {
    DriveUse { evacuate: Some(Evacuate { force: false }), ..of(state, true) }
}

fn pending(id: &str, state: PendingState, reason: &str) -> PendingMove {
    PendingMove { volume_id: id.into(), name: format!("pvc-{id}"), state, reason: reason.into() }
}

fn moved(id: &str, to: &str) -> MovedVolume {
    MovedVolume { volume_id: id.into(), name: format!("pvc-{id}"), to_drive: to.into(), bytes: 64 << 20, millis: 120, unreadable: vec![] }
}

fn evac(moved: Vec<MovedVolume>, pending: Vec<PendingMove>) -> Evacuation {
    let done = pending.is_empty();
    Evacuation { drive_id: "d1".into(), force: false, moved, pending, done }
}

#[test]
fn each_action_asks_only_for_what_is_not_done_yet() {
    use DriveUseState::*;
    let (cordoned, releasing, bad, released) = (of(Cordoned, true), of(Releasing, true), of(Releasing, false), of(Released, true));
    // (case, action, usage now, what is asked)
    type Case<'a> = (&'a str, DriveAction, Option<&'a DriveUse>, Option<Command>);
    let table: Vec<Case<'_>> = vec![
        ("none on an active drive", DriveAction::None, None, None),
        ("none lifts a cordon", DriveAction::None, Some(&cordoned), Some(Command::Cordon(false))),
        ("none does not undo a release", DriveAction::None, Some(&releasing), None),
        ("none leaves a released drive", DriveAction::None, Some(&released), None),
        ("cordon an active drive", DriveAction::Cordon, None, Some(Command::Cordon(true))),
        ("cordon is done", DriveAction::Cordon, Some(&cordoned), None),
        ("a releasing drive is closed already", DriveAction::Cordon, Some(&releasing), None),
        ("release an active drive", DriveAction::Release, None, Some(Command::Release)),
        ("release a cordoned drive", DriveAction::Release, Some(&cordoned), Some(Command::Release)),
        ("a requested release is under way", DriveAction::Release, Some(&releasing), None),
        ("a release of a BAD drive is asked, so it completes", DriveAction::Release, Some(&bad), Some(Command::Release)),
        ("a released drive is done", DriveAction::Release, Some(&released), None),
    ];
    for (case, action, usage, want) in table {
        assert_eq!(command(action, usage, false), want, "{case}");
        assert_eq!(command(action, usage, true), want, "{case}: a new generation asks the same");
    }
}

#[test]
fn an_evacuation_is_asked_until_one_stands_and_again_only_for_a_new_generation() {
    use DriveUseState::*;
    let (cordoned, releasing, bad) = (of(Cordoned, true), of(Releasing, true), of(Releasing, false));
    let (under_way, released, released_by_evacuation) = (evacuating(Releasing), of(Released, true), evacuating(Released));
    // (case, usage now, fresh generation, what is asked)
    type Case<'a> = (&'a str, Option<&'a DriveUse>, bool, Option<Command>);
    let table: Vec<Case<'_>> = vec![
        ("an active drive", None, true, Some(Command::Evacuate)),
        ("a cordoned drive", Some(&cordoned), true, Some(Command::Evacuate)),
        ("a release turns into an evacuation", Some(&releasing), false, Some(Command::Evacuate)),
        ("a BAD drive releasing on its own", Some(&bad), false, Some(Command::Evacuate)),
        ("refused before (no record): asked again at every sync", None, false, Some(Command::Evacuate)),
        ("under way: not asked again behind the admin's back", Some(&under_way), false, None),
        ("under way, asked again by the admin: retries the failed moves", Some(&under_way), true, Some(Command::Evacuate)),
        ("released by a release: nothing left to move", Some(&released), true, None),
        ("evacuated", Some(&released_by_evacuation), true, None),
    ];
    for (case, usage, fresh, want) in table {
        assert_eq!(command(DriveAction::Evacuate, usage, fresh), want, "{case}");
    }
    // The other actions of an evacuating drive: a release is under way, a cordon holds.
    assert_eq!(command(DriveAction::Release, Some(&under_way), true), None);
    assert_eq!(command(DriveAction::Cordon, Some(&under_way), true), None);
    assert_eq!(command(DriveAction::None, Some(&under_way), true), None, "an evacuation is not undone");
}

#[test]
fn the_evacuation_condition_says_what_moved_what_waits_for_which_pod_and_what_failed() {
    use DriveUseState::*;
    let pods = BTreeMap::from([("v2".to_string(), vec!["apps/web-0".to_string()]), ("v4".to_string(), vec!["a/x".to_string(), "b/y".to_string()])]);
    let staged = "staged at /var/lib/kubelet/x: moves once the pods using it stop";
    let running = evac(
        vec![moved("v1", "d2")],
        vec![pending("v3", PendingState::Moving, "being copied"), pending("v2", PendingState::Waiting, staged), pending("v5", PendingState::Waiting, staged)],
    );
    let failed = evac(vec![], vec![pending("v4", PendingState::Waiting, staged), pending("v6", PendingState::Failed, "drive d1: 2 ranges could not be read")]);
    let done = evac(vec![moved("v1", "d2"), moved("v2", "d3")], vec![]);
    let u = evacuating(Releasing);
    let r = evacuating(Released);
    let v5 = format!("pvc-v5 {staged}");
    // (case, usage, evacuation, refusal, done, reason, words in the message)
    type Case<'a> = (&'a str, Option<&'a DriveUse>, Option<&'a Evacuation>, Option<&'a str>, bool, &'a str, Vec<&'a str>);
    let table: Vec<Case<'_>> = vec![
        ("asked, not started yet", None, None, None, false, EVACUATING, vec!["drive d1: evacuation asked"]),
        (
            "moving, one waiting for its pod, one for pods unknown",
            Some(&u),
            Some(&running),
            None,
            false,
            EVACUATING,
            vec![
                "drive d1 evacuating: 1 moved, 1 moving, 2 waiting for their pods to let go",
                "pvc-v2 used by pod apps/web-0: moves once it is deleted or moved off the node",
                &v5,
            ],
        ),
        (
            "a failed move",
            Some(&u),
            Some(&failed),
            None,
            false,
            EVACUATION_FAILED,
            vec!["1 failed", "pvc-v4 used by pods a/x, b/y", "failed: pvc-v6: drive d1: 2 ranges could not be read", "ask for the evacuation again to retry"],
        ),
        ("done", Some(&r), Some(&done), None, true, EVACUATED, vec!["drive d1 evacuated: 2 moved; the drive holds no volume and may be pulled"]),
        ("released, no list (restarted)", Some(&r), None, None, true, EVACUATED, vec!["may be pulled"]),
        (
            "no room",
            None,
            None,
            Some("cannot place the volume: the other open managed drives of this node have no room for 1 of them"),
            false,
            REFUSED,
            vec!["drive d1 could not be asked to evacuate: cannot place the volume: the other open managed drives"],
        ),
    ];
    for (case, usage, e, refused, want_done, want_reason, words) in table {
        let (d, r, m) = outcome(DriveAction::Evacuate, "d1", usage, &[], refused, e, &pods);
        assert_eq!((d, r), (want_done, want_reason), "{case}: {m}");
        for w in words {
            assert!(m.contains(w), "{case}: {m:?} should say {w:?}");
        }
    }
}

#[test]
fn the_status_lists_each_volume_of_an_evacuation_moved_first_with_where_it_went() {
    let pods = BTreeMap::from([("v2".to_string(), vec!["apps/web-0".to_string()])]);
    let mut m = moved("v1", "d2");
    m.unreadable = vec![(0, 4096)];
    let e = evac(vec![m], vec![pending("v2", PendingState::Waiting, "staged"), pending("v3", PendingState::Queued, "moves when its turn comes")]);
    let list = evacuation_list(&e, &pods);
    let rows: Vec<(&str, &str, &str, &str)> = list.iter().map(|v| (v.volume.as_str(), v.name.as_str(), v.state.as_str(), v.reason.as_str())).collect();
    assert_eq!(
        rows,
        vec![
            ("v1", "pvc-v1", "moved", "on drive d2 (64.0 MiB copied and verified); unreadable on the old drive, zeros now: 4.0 KiB at byte 0"),
            ("v2", "pvc-v2", "waiting", "used by pod apps/web-0: moves once it is deleted or moved off the node"),
            ("v3", "pvc-v3", "queued", "moves when its turn comes"),
        ]
    );
}

#[test]
fn evacuation_events_are_warnings_when_a_move_failed() {
    let t = "2026-11-26T23:00:00Z";
    let going = condition((false, EVACUATING, "1 moved".into()), 4, None, t);
    let ev = event_of(DriveAction::Evacuate, None, &going).expect("the first condition is told");
    assert_eq!((ev.reason.as_str(), ev.action.as_str()), (EVACUATING, "Evacuate"));
    assert!(matches!(ev.type_, EventType::Normal));
    let failed = condition((false, EVACUATION_FAILED, "failed".into()), 4, Some(&going), t);
    assert!(matches!(event_of(DriveAction::Evacuate, Some(&going), &failed).map(|e| e.type_), Some(EventType::Warning)));
    let long = condition((true, EVACUATED, "é".repeat(2000)), 4, Some(&failed), t);
    let note = event_of(DriveAction::Evacuate, Some(&failed), &long).and_then(|e| e.note).unwrap_or_default();
    assert!(note.len() <= 1024, "cut to the Events API's limit: {}", note.len());
}

#[test]
fn the_condition_is_true_once_the_drive_is_as_asked_and_says_what_holds_it_back() {
    use DriveUseState::*;
    let vols = vec!["v1".to_string(), "v2".to_string()];
    // (case, action, usage, volumes, refusal, done, reason, words in the message)
    type Case<'a> = (&'a str, DriveAction, Option<DriveUse>, &'a [String], Option<&'a str>, bool, &'a str, &'a str);
    let table: Vec<Case<'_>> = vec![
        ("active as asked", DriveAction::None, None, &[], None, true, "Active", "drive d1 takes new volumes"),
        ("cordoned", DriveAction::Cordon, Some(of(Cordoned, true)), &vols, None, true, "Cordoned", "holds 2 volumes (v1, v2), served"),
        ("cordon on a releasing drive", DriveAction::Cordon, Some(of(Releasing, true)), &vols, None, true, "Releasing", "already"),
        ("release waits for the volumes", DriveAction::Release, Some(of(Releasing, true)), &vols[..1], None, false, "Releasing", "once 1 volume (v1) on it"),
        ("released", DriveAction::Release, Some(of(Released, true)), &[], None, true, "Released", "may be pulled"),
        ("a release is not undone", DriveAction::None, Some(of(Released, true)), &[], None, false, "Released", "not undone"),
        ("refused", DriveAction::Cordon, None, &[], Some("no drive with id d1 is known on this node"), false, "Refused", "could not be asked to cordon: no drive"),
    ];
    for (case, action, usage, vols, refused, done, reason, words) in table {
        let (d, r, m) = outcome(action, "d1", usage.as_ref(), vols, refused, None, &BTreeMap::new());
        assert_eq!((d, r), (done, reason), "{case}: {m}");
        assert!(m.contains(words), "{case}: {m:?} should say {words:?}");
    }
}

#[test]
fn the_transition_time_moves_with_the_status_and_events_with_the_reason() {
    let t0 = "2026-11-26T19:00:00Z";
    let t1 = "2026-11-26T19:05:00Z";
    let releasing = condition((false, "Releasing", "waits".into()), 2, None, t0);
    assert_eq!((releasing.type_.as_str(), releasing.status.as_str(), releasing.observed_generation), (ACTION_COMPLETE, "False", 2));
    assert_eq!(releasing.last_transition_time, t0);
    let still = condition((false, "Releasing", "waits for fewer".into()), 2, Some(&releasing), t1);
    assert_eq!(still.last_transition_time, t0, "same status: same transition time");
    assert!(event_of(DriveAction::Release, Some(&releasing), &still).is_none(), "same reason: no new Event");
    let done = condition((true, "Released", "may be pulled".into()), 2, Some(&still), t1);
    assert_eq!((done.status.as_str(), done.last_transition_time.as_str()), ("True", t1));
    let ev = event_of(DriveAction::Release, Some(&still), &done).expect("an Event");
    assert_eq!((ev.reason.as_str(), ev.action.as_str(), ev.note.as_deref()), ("Released", "Release", Some("may be pulled")));
    assert!(matches!(ev.type_, EventType::Normal));
    let refused = condition((false, "Refused", "no".into()), 3, Some(&done), t1);
    assert!(matches!(event_of(DriveAction::Cordon, Some(&done), &refused).map(|e| e.type_), Some(EventType::Warning)));
    assert!(event_of(DriveAction::Cordon, None, &done).is_some(), "the first condition is told");
}

#[test]
fn adopt_is_asked_only_of_a_drive_owned_elsewhere_and_is_done_once_the_drive_is_managed() {
    use crate::k8s::crd::DriveClass::*;
    // (case, class, asked of the inventory)
    let table = [
        ("owned elsewhere: asked", Some(OwnedElsewhere), true),
        ("managed: this node's already", Some(Managed), false),
        ("foreign: refused without asking", Some(Foreign), false),
        ("system: refused without asking", Some(System), false),
        ("excluded: refused without asking", Some(Excluded), false),
        ("not classified yet", None, false),
    ];
    for (case, class, want) in table {
        assert_eq!(adopts(DriveAction::Adopt, class), want, "{case}");
    }
    for other in [DriveAction::None, DriveAction::Cordon, DriveAction::Release, DriveAction::Evacuate] {
        assert!(!adopts(other, Some(OwnedElsewhere)), "{other:?} adopts nothing");
    }
    assert_eq!(command(DriveAction::Adopt, None, true), None, "the volume manager is asked nothing");
}

#[test]
fn the_adoption_condition_says_whose_the_drive_was_what_it_serves_and_why_it_is_refused() {
    use crate::k8s::crd::DriveClass::*;
    let vols = vec!["v1".to_string(), "v2".to_string()];
    let whose = "belongs to node node-2 of this cluster; holds 2 volumes: claim apps/data-0 (64.0 MiB), claim apps/data-1 (64.0 MiB)";
    // (case, class, reason, volumes, refusal, done, reason, words in the message)
    type Case<'a> = (&'a str, Option<crate::k8s::crd::DriveClass>, &'a str, &'a [String], Option<&'a str>, bool, &'a str, &'a str);
    let table: Vec<Case<'_>> = vec![
        ("owned elsewhere, asked", Some(OwnedElsewhere), whose, &[], None, false, ADOPTING, "belongs to node node-2 of this cluster"),
        ("adopted", Some(Managed), "carries a drivelet GPT", &vols, None, true, ADOPTED, "its 2 volumes (v1, v2) are served here"),
        ("adopted, empty", Some(Managed), "carries a drivelet GPT", &[], None, true, ADOPTED, "it holds no volume"),
        ("foreign", Some(Foreign), "has an ext4 filesystem", &[], None, false, REFUSED, "drive d1 is foreign (has an ext4 filesystem): only a drivelet disk owned elsewhere"),
        ("system", Some(System), "holds /", &[], None, false, REFUSED, "drive d1 is system"),
        ("the inventory refused", Some(OwnedElsewhere), whose, &[], Some("the write failed: EIO"), false, REFUSED, "could not be adopted: the write failed: EIO"),
        ("not classified yet", None, "", &[], None, false, ADOPTING, "not classified"),
    ];
    for (case, class, why, vols, refused, done, reason, words) in table {
        let (d, r, m) = adopt_outcome("d1", class, why, vols, refused);
        assert_eq!((d, r), (done, reason), "{case}: {m}");
        assert!(m.contains(words), "{case}: {m:?} should say {words:?}");
        assert!(!m.contains("Some(") && !m.contains("OwnedElsewhere"), "{case}: plain words: {m}");
    }
    let c = condition(adopt_outcome("d1", Some(Managed), "", &vols, None), 2, None, "2026-11-28T05:00:00Z");
    let ev = event_of(DriveAction::Adopt, None, &c).expect("an Event");
    assert_eq!((ev.reason.as_str(), ev.action.as_str()), (ADOPTED, "Adopt"));
    assert!(matches!(ev.type_, EventType::Normal));
}
