use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, Pod};
use kube::runtime::events::EventType;
use tokio::time::Instant;

use super::condition_event::{condition_event, truncate_note, ACTION, NOTE_LIMIT, REASON_ABNORMAL, REASON_NORMAL};
use super::fixtures::*;
use super::gate::MAX_INTERVAL;
use super::targets::{find_claim, pods_using, ClaimLookup};
use super::*;
use crate::actors::volumes::conditions::Reason;
use crate::k8s::attach::fixtures::{DRIVER, NODE};

const S: fn(u64) -> Duration = Duration::from_secs;

fn bad(volume_id: &str) -> VolumeConditionChanged {
    change(volume_id, true, "drive d1 is failing")
}

fn good(volume_id: &str) -> VolumeConditionChanged {
    change(volume_id, false, "volume is healthy")
}

/// One step of a gate script: at `t` seconds, either offer a change (and expect it
/// reported at once or not) or call `due` (and expect these reports).
enum Step {
    Offer(u64, VolumeConditionChanged, bool),
    Due(u64, Vec<VolumeConditionChanged>),
}

#[test]
fn gate_table_reports_at_most_once_per_window_with_the_latest_state() {
    use Step::{Due, Offer};
    // (case, script, volumes tracked at the end, next wake at the end in seconds)
    let table: Vec<(&str, Vec<Step>, usize, Option<u64>)> = vec![
        ("the first change of a quiet volume is reported at once", vec![Offer(0, bad("v1"), true)], 1, Some(30)),
        (
            "a second change inside the window is held until the window ends",
            vec![Offer(0, bad("v1"), true), Offer(10, good("v1"), false), Due(29, vec![]), Due(30, vec![good("v1")])],
            1,
            Some(60),
        ),
        (
            "changes inside the window are coalesced to the latest",
            vec![
                Offer(0, good("v1"), true),
                Offer(5, bad("v1"), false),
                Offer(6, change("v1", true, "drive d1 is missing"), false),
                Due(30, vec![change("v1", true, "drive d1 is missing")]),
            ],
            1,
            Some(60),
        ),
        (
            "a flap back to the reported state inside the window reports nothing",
            vec![Offer(0, bad("v1"), true), Offer(10, good("v1"), false), Offer(20, bad("v1"), false), Due(30, vec![])],
            0,
            None,
        ),
        (
            "a new message while still abnormal is a new state",
            vec![Offer(0, bad("v1"), true), Offer(40, change("v1", true, "95% full"), true)],
            1,
            Some(70),
        ),
        (
            "a change after the window is reported at once even before due ran",
            vec![Offer(0, bad("v1"), true), Offer(31, good("v1"), true)],
            1,
            Some(61),
        ),
        (
            "repeating the reported state after the window says nothing",
            vec![Offer(0, bad("v1"), true), Offer(31, bad("v1"), false), Due(31, vec![])],
            0,
            None,
        ),
        (
            "the report at the window's end opens a new window",
            vec![
                Offer(0, bad("v1"), true),
                Offer(1, good("v1"), false),
                Due(30, vec![good("v1")]),
                Offer(31, bad("v1"), false),
                Due(59, vec![]),
                Due(60, vec![bad("v1")]),
            ],
            1,
            Some(90),
        ),
        (
            "volumes are independent",
            vec![
                Offer(0, bad("v1"), true),
                Offer(10, bad("v2"), true),
                Offer(11, good("v1"), false),
                Offer(12, good("v2"), false),
                Due(30, vec![good("v1")]),
                Due(40, vec![good("v2")]),
            ],
            2,
            Some(60),
        ),
        (
            "due reports several volumes at once, sorted",
            vec![
                Offer(0, bad("v2"), true),
                Offer(0, bad("v1"), true),
                Offer(1, good("v2"), false),
                Offer(1, good("v1"), false),
                Due(45, vec![good("v1"), good("v2")]),
            ],
            2,
            Some(75),
        ),
        (
            "a volume whose window ended with nothing pending is forgotten",
            vec![Offer(0, bad("v1"), true), Offer(5, bad("v2"), true), Due(30, vec![]), Due(35, vec![])],
            0,
            None,
        ),
        (
            "a forgotten volume's next change is reported at once",
            vec![Offer(0, bad("v1"), true), Due(30, vec![]), Offer(31, good("v1"), true)],
            1,
            Some(61),
        ),
    ];
    let start = Instant::now();
    let at = |t: u64| start + S(t);
    for (case, script, tracked, wake) in table {
        let mut gate = EventGate::new(S(30));
        for (i, step) in script.into_iter().enumerate() {
            match step {
                Offer(t, change, reported) => {
                    let want = reported.then(|| change.clone());
                    assert_eq!(gate.offer(change, at(t)), want, "{case}: step {i}");
                }
                Due(t, want) => assert_eq!(gate.due(at(t)), want, "{case}: step {i}"),
            }
        }
        assert_eq!(gate.tracked(), tracked, "{case}: volumes tracked");
        assert_eq!(gate.next_wake(), wake.map(at), "{case}: next wake");
    }
}

#[test]
fn gate_compares_typed_reasons_not_message_text() {
    let start = Instant::now();
    let mut gate = EventGate::new(S(30));
    let full = |percent: u8| VolumeConditionChanged {
        volume_id: "v1".into(),
        abnormal: true,
        message: format!("the filesystem is {percent}% full"),
        reasons: vec![Reason::FilesystemFull],
    };
    assert_eq!(gate.offer(full(91), start), Some(full(91)));
    assert_eq!(gate.offer(full(97), start + S(40)), None, "the same reason in new words is not a new state");
    let mut more = full(97);
    more.reasons.push(Reason::FilesystemCorrupt);
    assert_eq!(gate.offer(more.clone(), start + S(41)), Some(more), "a reason more is a new state, in the same words");
}

#[test]
fn gate_memory_stays_bounded_over_many_volumes() {
    let start = Instant::now();
    let mut gate = EventGate::new(S(30));
    for i in 0..1000 {
        assert!(gate.offer(bad(&format!("v{i}")), start).is_some());
    }
    assert_eq!(gate.tracked(), 1000);
    assert_eq!(gate.due(start + S(30)), vec![]);
    assert_eq!(gate.tracked(), 0, "every window ended with nothing pending");
    assert_eq!(gate.next_wake(), None);
}

#[test]
fn gate_with_a_huge_interval_does_not_overflow() {
    let mut gate = EventGate::new(Duration::MAX);
    let now = Instant::now();
    assert!(gate.offer(bad("v1"), now).is_some());
    assert_eq!(gate.next_wake(), Some(now + MAX_INTERVAL));
}

#[test]
fn queue_runs_one_report_per_volume_within_the_limit_and_keeps_the_latest() {
    let mut q = ReportQueue::new(2);
    q.push(bad("v1"));
    q.push(bad("v2"));
    q.push(bad("v3"));
    assert_eq!(q.start(), Some(bad("v1")));
    assert_eq!(q.start(), Some(bad("v2")));
    assert_eq!(q.start(), None, "the limit is reached");
    q.push(good("v1"));
    q.push(change("v1", true, "drive d1 is missing"));
    assert_eq!(q.counts(), (2, 2), "a queued report of a volume is replaced, not added");
    q.finish("v2");
    assert_eq!(q.start(), Some(bad("v3")), "v1 is still running, so v3 goes first");
    q.finish("v3");
    assert_eq!(q.start(), None, "v1's newer report waits for its running one");
    q.finish("v1");
    assert_eq!(q.start(), Some(change("v1", true, "drive d1 is missing")));
    assert_eq!(q.counts(), (0, 1));
    assert_eq!(q.clear_running(), 1);
    assert_eq!(ReportQueue::new(0).limit, 1, "a zero limit would never run anything");
}

#[test]
fn claim_lookup_table_follows_the_pv() {
    let mut released = bound_pv("pv-1", "vol-1", Some(("apps", "data")));
    released.status.as_mut().expect("status").phase = Some("Released".into());
    let mut other_driver = bound_pv("pv-1", "vol-1", Some(("apps", "data")));
    other_driver.spec.as_mut().and_then(|s| s.csi.as_mut()).expect("csi").driver = "ebs.csi.aws.com".into();
    let mut no_csi = bound_pv("pv-1", "vol-1", Some(("apps", "data")));
    no_csi.spec.as_mut().expect("spec").csi = None;
    let mut nameless_claim = bound_pv("pv-1", "vol-1", Some(("apps", "data")));
    nameless_claim.spec.as_mut().and_then(|s| s.claim_ref.as_mut()).expect("claimRef").name = None;
    let claimed = |pv: &str, ns: &str, claim: &str| ClaimLookup::Claimed { pv: pv.into(), claim: claim_ref(ns, claim) };

    let table: Vec<(&str, Vec<PersistentVolume>, ClaimLookup)> = vec![
        ("no PVs at all", vec![], ClaimLookup::NoVolume),
        (
            "the PV with our driver and the volume handle leads to its claim",
            vec![bound_pv("pv-0", "vol-0", Some(("apps", "other"))), bound_pv("pv-1", "vol-1", Some(("apps", "data")))],
            claimed("pv-1", "apps", "data"),
        ),
        ("another driver's PV with the same handle is not ours", vec![other_driver], ClaimLookup::NoVolume),
        ("a PV without a CSI source is not ours", vec![no_csi], ClaimLookup::NoVolume),
        (
            "a PV without claimRef has no one to tell",
            vec![bound_pv("pv-1", "vol-1", None)],
            ClaimLookup::Unclaimed { pv: "pv-1".into() },
        ),
        ("a claimRef without a name is no claim", vec![nameless_claim], ClaimLookup::Unclaimed { pv: "pv-1".into() }),
        ("a Released PV's claim is gone", vec![released], ClaimLookup::Released { pv: "pv-1".into() }),
    ];
    for (case, pvs, want) in table {
        assert_eq!(find_claim(&pvs, DRIVER, "vol-1"), want, "{case}");
    }
}

#[test]
fn pods_table_keeps_live_pods_of_this_node_using_the_claim() {
    let claim = claim_ref("apps", "data");
    let mut finished = local_pod("apps", "done", &["data"]);
    finished.status.as_mut().expect("status").phase = Some("Succeeded".into());
    let mut failed = local_pod("apps", "crashed", &["data"]);
    failed.status.as_mut().expect("status").phase = Some("Failed".into());
    let mut pending = local_pod("apps", "starting", &["data"]);
    pending.status.as_mut().expect("status").phase = Some("Pending".into());
    let mut no_status = local_pod("apps", "fresh", &["data"]);
    no_status.status = None;
    let mut no_spec = local_pod("apps", "odd", &["data"]);
    no_spec.spec = None;

    let table: Vec<(&str, Vec<Pod>, Vec<&str>)> = vec![
        ("a running pod on this node using the claim", vec![local_pod("apps", "web-0", &["data"])], vec!["web-0"]),
        ("a pod using the claim among others", vec![local_pod("apps", "web-0", &["cache", "data"])], vec!["web-0"]),
        ("a pod using another claim", vec![local_pod("apps", "web-0", &["cache"])], vec![]),
        ("a pod with no volumes", vec![local_pod("apps", "web-0", &[])], vec![]),
        ("a pod on another node", vec![pod("apps", "web-0", "node-b", &["data"])], vec![]),
        ("a pod in another namespace with a claim of that name", vec![local_pod("shop", "web-0", &["data"])], vec![]),
        ("finished pods are left alone", vec![finished, failed], vec![]),
        ("pending pods and pods without status are told", vec![pending, no_status], vec!["starting", "fresh"]),
        ("a pod without spec is not scheduled here", vec![no_spec], vec![]),
        (
            "several pods, in list order",
            vec![local_pod("apps", "web-1", &["data"]), local_pod("apps", "web-0", &["data"])],
            vec!["web-1", "web-0"],
        ),
    ];
    for (case, pods, want) in table {
        let got = pods_using(&pods, &claim, NODE);
        let names: Vec<&str> = got.iter().filter_map(|r| r.name.as_deref()).collect();
        assert_eq!(names, want, "{case}");
        for r in &got {
            assert_eq!((r.kind.as_deref(), r.api_version.as_deref()), (Some("Pod"), Some("v1")), "{case}");
            assert_eq!(r.namespace.as_deref(), Some("apps"), "{case}");
            assert!(r.uid.is_some(), "{case}: the uid lets kubectl describe find the Event");
        }
    }
    let nameless = ObjectReference { name: None, ..claim };
    assert!(pods_using(&[local_pod("apps", "web-0", &["data"])], &nameless, NODE).is_empty());
}

#[test]
fn notes_are_cut_to_the_events_api_limit_at_a_character_boundary() {
    let ascii = "x".repeat(2000);
    let euro = "€".repeat(400); // 3 bytes each: 1200 bytes, 1024 falls inside a character
    let table: Vec<(&str, &str, usize)> = vec![
        ("short notes stay whole", "drive d1 is failing", 19),
        ("exactly the limit stays whole", &ascii[..NOTE_LIMIT], NOTE_LIMIT),
        ("long ASCII is cut at the limit", &ascii, NOTE_LIMIT),
        ("a multi-byte character across the limit is dropped whole", &euro, 1023),
        ("empty stays empty", "", 0),
    ];
    for (case, note, want) in table {
        let cut = truncate_note(note);
        assert_eq!(cut.len(), want, "{case}");
        assert!(note.starts_with(cut), "{case}");
    }
}

#[test]
fn condition_events_are_warnings_when_abnormal_and_normal_otherwise() {
    let warning = condition_event(&bad("v1"), None);
    assert_eq!(
        (warning.type_, warning.reason.as_str(), warning.action.as_str(), warning.note.as_deref()),
        (EventType::Warning, REASON_ABNORMAL, ACTION, Some("drive d1 is failing"))
    );
    assert!(warning.secondary.is_none());
    let normal = condition_event(&good("v1"), Some(claim_ref("apps", "data")));
    assert_eq!((normal.type_, normal.reason.as_str()), (EventType::Normal, REASON_NORMAL));
    assert_eq!(normal.secondary, Some(claim_ref("apps", "data")));
}
