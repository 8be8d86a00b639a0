//! Table tests of the drive action decisions.

use super::*;

fn of(state: DriveUseState, requested: bool) -> DriveUse {
    DriveUse { drive_id: "d1".into(), state, reason: "asked".into(), requested, evacuate: None }
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
        assert_eq!(command(action, usage), want, "{case}");
    }
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
        let (d, r, m) = outcome(action, "d1", usage.as_ref(), vols, refused);
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
