//! The exposition: exact lines of each kind of series, state sets, units and escaping,
//! every series of the agreed set read back by a strict OpenMetrics parser, and the
//! snapshot built from the actors' answers.

use std::collections::BTreeSet;
use std::time::Duration;

use super::*;
use crate::disk::smart::SmartFigures;
use crate::words::{DriveClass, DriveUseState, Health, Media};

const GIB: u64 = 1 << 30;

/// A node with an NVMe drive (SMART read, being evacuated), a SATA drive (ATA
/// attributes), a system disk, three volumes (one bound to a claim, one abnormal, one
/// moving), snapshots, an evacuation and the attach queue.
pub(super) fn sample() -> Gauges {
    let nvme = DriveFigures {
        id: "nvme-eui.0025".into(),
        serial: "S4EVNX0".into(),
        model: "SAMSUNG MZQL21T9".into(),
        media: Media::Nvme,
        path: "/dev/nvme0n1".into(),
        transport: "nvme".into(),
        size: 1920 * GIB,
        class: DriveClass::Managed,
        health: Health::Suspect,
        checked_unix: 1_760_000_000,
        smart: SmartFigures { temperature_c: Some(35), power_on_hours: Some(12798), percentage_used: Some(3), media_errors: Some(7), ..Default::default() },
        managed: Some(ManagedFigures { usage: Some(DriveUseState::Releasing), free: 100 * GIB, largest_free: 60 * GIB, allocatable: 0, cleaning: GIB, volumes: 2, slots_free: 250, slots: 255 }),
    };
    let sata = DriveFigures {
        id: "wwn-0x5000cca".into(),
        serial: "AR0123".into(),
        model: "HGST \"HUH\\721008\"\nALE604".into(),
        media: Media::Hdd,
        path: "/dev/sdb".into(),
        transport: "sata".into(),
        size: 8000 * GIB,
        class: DriveClass::Managed,
        health: Health::Good,
        checked_unix: 1_760_000_100,
        smart: SmartFigures {
            temperature_c: Some(25),
            power_on_hours: Some(32564),
            reallocated_sectors: Some(0),
            pending_sectors: Some(2),
            uncorrectable_sectors: Some(0),
            crc_errors: Some(12),
            ..Default::default()
        },
        managed: Some(ManagedFigures { usage: None, free: 7000 * GIB, largest_free: 7000 * GIB, allocatable: 7000 * GIB, cleaning: 0, volumes: 1, slots_free: 254, slots: 255 }),
    };
    let system = DriveFigures {
        id: "name-vda".into(),
        serial: String::new(),
        model: String::new(),
        media: Media::Virtual,
        path: "/dev/vda".into(),
        transport: "virtio".into(),
        size: 256 * GIB,
        class: DriveClass::System,
        health: Health::Unknown,
        checked_unix: 0,
        smart: SmartFigures::default(),
        managed: None,
    };
    let volume = |id: &str, drive: &str| VolumeFigures {
        id: id.into(),
        drive: drive.into(),
        pv: String::new(),
        claim_namespace: String::new(),
        claim: String::new(),
        block: false,
        fs: "ext4".into(),
        size: 10 * GIB,
        abnormal: false,
        reasons: Vec::new(),
        moving: None,
    };
    let bound = VolumeFigures { pv: "pvc-1234".into(), claim_namespace: "db".into(), claim: "data-0".into(), ..volume("vol-a", "nvme-eui.0025") };
    let abnormal = VolumeFigures { abnormal: true, reasons: vec!["drive-suspect", "drive-releasing"], block: true, fs: String::new(), ..volume("vol-b", "nvme-eui.0025") };
    let moving = VolumeFigures { moving: Some(("wwn-0x5000cca".into(), 0.25)), ..volume("vol-c", "wwn-0x5000cca") };
    let mut g = Gauges {
        node: "node-1".into(),
        ready: true,
        drives: vec![nvme, sata, system],
        volumes: vec![bound, abnormal, moving],
        evacuations: vec![EvacuationFigures { drive: "nvme-eui.0025".into(), moved: 1, moving: 1, queued: 0, waiting: 1, failed: 0 }],
        attach: Some((3, 1, 7, 2)),
        ..Gauges::default()
    };
    g.drives_by_state.insert(("managed".into(), "good".into(), "active".into()), 1);
    g.drives_by_state.insert(("managed".into(), "suspect".into(), "releasing".into()), 1);
    g.volumes_by_state.insert(("published".into(), "abnormal".into()), 1);
    g.volumes_by_state.insert(("available".into(), "normal".into()), 2);
    g.snapshots.insert("ready".into(), (2, 3 << 20));
    g
}

/// Counters with a little of everything recorded.
fn counters() -> Metrics {
    let m = Metrics::default();
    for s in [0.00005, 0.0003, 0.0003, 2.0, 100.0] {
        m.record_rpc("Probe", 0, Duration::from_secs_f64(s));
    }
    m.record_rpc("Probe", 5, Duration::from_millis(1));
    m.record_zeroed(3 << 20);
    m.record_move(Some(5 << 20));
    m.record_move(Some(0));
    m.record_move(None);
    m.record_health_poll(Duration::from_millis(250));
    m.record_scan();
    m
}

fn has(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

#[track_caller]
fn expect_lines(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(has(text, line), "missing {line} in\n{text}");
    }
}

#[test]
fn counters_render_with_total_suffixes_units_and_cumulative_buckets() {
    let m = counters();
    let text = m.render(Gauges::default(), Format::OpenMetrics);
    expect_lines(
        &text,
        &[
            "# TYPE drivelet_csi_requests counter",
            "drivelet_csi_requests_total{method=\"Probe\",code=\"OK\"} 5",
            "drivelet_csi_requests_total{method=\"Probe\",code=\"NOT_FOUND\"} 1",
            "# TYPE drivelet_csi_request_duration_seconds histogram",
            "# UNIT drivelet_csi_request_duration_seconds seconds",
            "drivelet_csi_request_duration_seconds_bucket{le=\"0.0001\",method=\"Probe\"} 1",
            "drivelet_csi_request_duration_seconds_bucket{le=\"0.0005\",method=\"Probe\"} 3",
            "drivelet_csi_request_duration_seconds_bucket{le=\"2.5\",method=\"Probe\"} 5",
            "drivelet_csi_request_duration_seconds_bucket{le=\"60.0\",method=\"Probe\"} 5",
            "drivelet_csi_request_duration_seconds_bucket{le=\"+Inf\",method=\"Probe\"} 6",
            "drivelet_csi_request_duration_seconds_count{method=\"Probe\"} 6",
            "# HELP drivelet_zeroed_bytes Bytes of freed drive space zeroed before reuse.",
            "# TYPE drivelet_zeroed_bytes counter",
            "# UNIT drivelet_zeroed_bytes bytes",
            "drivelet_zeroed_bytes_total 3145728",
            "drivelet_volume_moves_total{result=\"done\"} 2",
            "drivelet_volume_moves_total{result=\"failed\"} 1",
            "drivelet_moved_bytes_total 5242880",
            "drivelet_health_polls_total 1",
            "drivelet_health_poll_duration_seconds 0.25",
        ],
    );
    assert!(text.lines().any(|l| l.starts_with("drivelet_inventory_last_scan_timestamp_seconds 17")), "{text}");
    assert_eq!(text.lines().last(), Some("# EOF"), "an exposition ends in # EOF");
    assert_eq!(text.matches("# EOF").count(), 1);
}

#[test]
fn moves_show_both_results_before_any_move() {
    let text = Metrics::default().render(Gauges::default(), Format::OpenMetrics);
    expect_lines(&text, &["drivelet_volume_moves_total{result=\"done\"} 0", "drivelet_volume_moves_total{result=\"failed\"} 0"]);
}

#[test]
fn aggregates_render_with_labels_and_the_attach_queue_only_when_it_runs() {
    let g = sample();
    let text = Metrics::default().render(g.clone(), Format::OpenMetrics);
    expect_lines(
        &text,
        &[
            "drivelet_ready 1",
            "drivelet_drives{class=\"managed\",health=\"good\",usage=\"active\"} 1",
            "drivelet_volumes{state=\"published\",condition=\"abnormal\"} 1",
            "drivelet_snapshots{state=\"ready\"} 2",
            "# UNIT drivelet_snapshot_bytes bytes",
            "drivelet_snapshot_bytes{state=\"ready\"} 3145728",
            "drivelet_attach_queue_depth 3",
            "drivelet_attach_retries_total 7",
            "drivelet_attach_relists_total 2",
            &format!("drivelet_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION")),
        ],
    );
    let text = Metrics::default().render(Gauges { attach: None, ..g }, Format::OpenMetrics);
    assert!(!text.contains("drivelet_attach_queue_depth"), "{text}");
}

#[test]
fn each_drive_has_its_figures_labelled_with_node_drive_serial_model_and_media() {
    let text = Metrics::default().render(sample(), Format::OpenMetrics);
    let nvme = "node=\"node-1\",drive=\"nvme-eui.0025\",serial=\"S4EVNX0\",model=\"SAMSUNG MZQL21T9\",media=\"nvme\"";
    let vda = "node=\"node-1\",drive=\"name-vda\",serial=\"\",model=\"\",media=\"virtual\"";
    expect_lines(
        &text,
        &[
            &format!("drivelet_drive_info{{{nvme},path=\"/dev/nvme0n1\",transport=\"nvme\"}} 1"),
            &format!("drivelet_drive_size_bytes{{{nvme}}} {}", 1920 * GIB),
            &format!("drivelet_drive_size_bytes{{{vda}}} {}", 256 * GIB),
            &format!("drivelet_drive_free_bytes{{{nvme}}} {}", 100 * GIB),
            &format!("drivelet_drive_largest_free_extent_bytes{{{nvme}}} {}", 60 * GIB),
            &format!("drivelet_drive_partition_slots_free{{{nvme}}} 250"),
            &format!("drivelet_drive_allocatable_bytes{{{nvme}}} 0"),
            &format!("drivelet_drive_cleaning_bytes{{{nvme}}} {GIB}"),
            &format!("drivelet_drive_volumes{{{nvme}}} 2"),
            &format!("drivelet_drive_health_checked_timestamp_seconds{{{nvme}}} 1760000000"),
            &format!("drivelet_drive_temperature_celsius{{{nvme}}} 35"),
            &format!("drivelet_drive_endurance_used_ratio{{{nvme}}} 0.03"),
            &format!("drivelet_drive_media_errors_total{{{nvme}}} 7"),
            &format!("drivelet_drive_power_on_seconds_total{{{nvme}}} {}", 12798 * 3600),
            "# TYPE drivelet_drive_power_on_seconds counter",
            "# UNIT drivelet_drive_power_on_seconds seconds",
            "# UNIT drivelet_drive_temperature_celsius celsius",
            "# UNIT drivelet_drive_endurance_used_ratio ratio",
            "# HELP drivelet_drive_size_bytes Size of the drive.",
        ],
    );
    // A system disk has no room, usage, check time or SMART figures.
    for family in ["drivelet_drive_free_bytes", "drivelet_drive_usage", "drivelet_drive_health_checked_timestamp_seconds", "drivelet_drive_temperature_celsius"] {
        assert!(!text.lines().any(|l| l.starts_with(&format!("{family}{{{vda}"))), "{family} of a system disk in\n{text}");
    }
    // ATA figures only where the drive reported them.
    let ata = |family: &str| text.lines().filter(|l| l.starts_with(family)).count();
    assert_eq!((ata("drivelet_drive_crc_errors_total"), ata("drivelet_drive_pending_sectors"), ata("drivelet_drive_reallocated_sectors")), (1, 1, 1));
    assert!(text.lines().any(|l| l.starts_with("drivelet_drive_crc_errors_total{") && l.ends_with(" 12")), "{text}");
}

#[test]
fn class_health_and_usage_are_state_sets_with_one_state_set_per_drive() {
    let text = Metrics::default().render(sample(), Format::OpenMetrics);
    for (family, label, states, drives) in [
        ("drivelet_drive_class", "class", 5, 3),
        ("drivelet_drive_health", "health", 4, 3),
        ("drivelet_drive_usage", "usage", 4, 2),
    ] {
        let samples: Vec<&str> = text.lines().filter(|l| l.starts_with(&format!("{family}{{"))).collect();
        assert_eq!(samples.len(), states * drives, "{family}: every state of every drive in\n{text}");
        let ones: Vec<&&str> = samples.iter().filter(|l| l.ends_with(" 1")).collect();
        assert_eq!(ones.len(), drives, "{family}: one state set per drive");
        assert!(samples.iter().all(|l| l.contains(&format!(",{label}=\""))), "{family}");
    }
    expect_lines(
        &text,
        &[
            "drivelet_drive_usage{node=\"node-1\",drive=\"nvme-eui.0025\",serial=\"S4EVNX0\",model=\"SAMSUNG MZQL21T9\",media=\"nvme\",usage=\"releasing\"} 1",
            "drivelet_drive_usage{node=\"node-1\",drive=\"nvme-eui.0025\",serial=\"S4EVNX0\",model=\"SAMSUNG MZQL21T9\",media=\"nvme\",usage=\"active\"} 0",
            "drivelet_drive_class{node=\"node-1\",drive=\"name-vda\",serial=\"\",model=\"\",media=\"virtual\",class=\"system\"} 1",
            "drivelet_drive_class{node=\"node-1\",drive=\"name-vda\",serial=\"\",model=\"\",media=\"virtual\",class=\"owned-elsewhere\"} 0",
            "drivelet_drive_health{node=\"node-1\",drive=\"nvme-eui.0025\",serial=\"S4EVNX0\",model=\"SAMSUNG MZQL21T9\",media=\"nvme\",health=\"suspect\"} 1",
        ],
    );
}

#[test]
fn each_volume_has_its_info_size_condition_reasons_and_move_progress() {
    let text = Metrics::default().render(sample(), Format::OpenMetrics);
    let a = "node=\"node-1\",volume=\"vol-a\",drive=\"nvme-eui.0025\"";
    let b = "node=\"node-1\",volume=\"vol-b\",drive=\"nvme-eui.0025\"";
    let c = "node=\"node-1\",volume=\"vol-c\",drive=\"wwn-0x5000cca\"";
    expect_lines(
        &text,
        &[
            &format!("drivelet_volume_info{{{a},pv=\"pvc-1234\",claim_namespace=\"db\",claim=\"data-0\",access=\"mount\",fs=\"ext4\"}} 1"),
            &format!("drivelet_volume_info{{{b},pv=\"\",claim_namespace=\"\",claim=\"\",access=\"block\",fs=\"\"}} 1"),
            &format!("drivelet_volume_size_bytes{{{a}}} {}", 10 * GIB),
            &format!("drivelet_volume_abnormal{{{a}}} 0"),
            &format!("drivelet_volume_abnormal{{{b}}} 1"),
            &format!("drivelet_volume_condition_reason{{{b},reason=\"drive-suspect\"}} 1"),
            &format!("drivelet_volume_condition_reason{{{b},reason=\"drive-releasing\"}} 1"),
            &format!("drivelet_volume_move_progress_ratio{{{c},to_drive=\"wwn-0x5000cca\"}} 0.25"),
            "drivelet_drive_evacuation_volumes{node=\"node-1\",drive=\"nvme-eui.0025\",state=\"moved\"} 1",
            "drivelet_drive_evacuation_volumes{node=\"node-1\",drive=\"nvme-eui.0025\",state=\"waiting\"} 1",
            "drivelet_drive_evacuation_volumes{node=\"node-1\",drive=\"nvme-eui.0025\",state=\"failed\"} 0",
        ],
    );
    assert_eq!(text.lines().filter(|l| l.starts_with("drivelet_volume_condition_reason{")).count(), 2, "reasons of abnormal volumes only");
    assert_eq!(text.lines().filter(|l| l.starts_with("drivelet_volume_move_progress_ratio{")).count(), 1, "progress of the moving volume only");
}

#[test]
fn families_without_series_are_left_out() {
    let text = Metrics::default().render(Gauges { node: "n".into(), ..Gauges::default() }, Format::OpenMetrics);
    for family in ["drivelet_drive_info", "drivelet_volume_info", "drivelet_drive_evacuation_volumes", "drivelet_volume_condition_reason", "drivelet_drives"] {
        assert!(!text.contains(family), "{family} without drives or volumes in\n{text}");
    }
    expect_lines(&text, &["drivelet_ready 0"]);
}

#[test]
fn label_values_are_escaped() {
    let text = Metrics::default().render(sample(), Format::OpenMetrics);
    assert!(text.contains("model=\"HGST \\\"HUH\\\\721008\\\"\\nALE604\""), "{text}");
    assert!(text.lines().all(|l| l.starts_with('#') || l.starts_with("drivelet_")), "no line broken by a newline in a value:\n{text}");
}

/// Every family of the agreed set (docs/operations.md, the dashboard and the alerts):
/// OpenMetrics family name, type, label names (without `le`).
const SPEC: &[(&str, &str, &[&str])] = &[
    ("drivelet_build_info", "gauge", &["version"]),
    ("drivelet_ready", "gauge", &[]),
    ("drivelet_drives", "gauge", &["class", "health", "usage"]),
    ("drivelet_volumes", "gauge", &["state", "condition"]),
    ("drivelet_snapshots", "gauge", &["state"]),
    ("drivelet_snapshot_bytes", "gauge", &["state"]),
    ("drivelet_csi_requests", "counter", &["method", "code"]),
    ("drivelet_csi_request_duration_seconds", "histogram", &["method"]),
    ("drivelet_attach_queue_depth", "gauge", &[]),
    ("drivelet_attach_queue_running", "gauge", &[]),
    ("drivelet_attach_retries", "counter", &[]),
    ("drivelet_attach_relists", "counter", &[]),
    ("drivelet_health_polls", "counter", &[]),
    ("drivelet_zeroed_bytes", "counter", &[]),
    ("drivelet_volume_moves", "counter", &["result"]),
    ("drivelet_moved_bytes", "counter", &[]),
    ("drivelet_health_poll_duration_seconds", "gauge", &[]),
    ("drivelet_inventory_last_scan_timestamp_seconds", "gauge", &[]),
    ("drivelet_drive_info", "gauge", &["node", "drive", "serial", "model", "media", "path", "transport"]),
    ("drivelet_drive_size_bytes", "gauge", DRIVE),
    ("drivelet_drive_class", "gauge", &["node", "drive", "serial", "model", "media", "class"]),
    ("drivelet_drive_health", "gauge", &["node", "drive", "serial", "model", "media", "health"]),
    ("drivelet_drive_usage", "gauge", &["node", "drive", "serial", "model", "media", "usage"]),
    ("drivelet_drive_free_bytes", "gauge", DRIVE),
    ("drivelet_drive_largest_free_extent_bytes", "gauge", DRIVE),
    ("drivelet_drive_allocatable_bytes", "gauge", DRIVE),
    ("drivelet_drive_cleaning_bytes", "gauge", DRIVE),
    ("drivelet_drive_volumes", "gauge", DRIVE),
    ("drivelet_drive_partition_slots_free", "gauge", DRIVE),
    ("drivelet_drive_partition_slots", "gauge", DRIVE),
    ("drivelet_drive_health_checked_timestamp_seconds", "gauge", DRIVE),
    ("drivelet_drive_temperature_celsius", "gauge", DRIVE),
    ("drivelet_drive_endurance_used_ratio", "gauge", DRIVE),
    ("drivelet_drive_reallocated_sectors", "gauge", DRIVE),
    ("drivelet_drive_pending_sectors", "gauge", DRIVE),
    ("drivelet_drive_uncorrectable_sectors", "gauge", DRIVE),
    ("drivelet_drive_media_errors", "counter", DRIVE),
    ("drivelet_drive_crc_errors", "counter", DRIVE),
    ("drivelet_drive_power_on_seconds", "counter", DRIVE),
    ("drivelet_volume_info", "gauge", &["node", "volume", "drive", "pv", "claim_namespace", "claim", "access", "fs"]),
    ("drivelet_volume_size_bytes", "gauge", VOLUME),
    ("drivelet_volume_abnormal", "gauge", VOLUME),
    ("drivelet_volume_condition_reason", "gauge", &["node", "volume", "drive", "reason"]),
    ("drivelet_volume_move_progress_ratio", "gauge", &["node", "volume", "drive", "to_drive"]),
    ("drivelet_drive_evacuation_volumes", "gauge", &["node", "drive", "state"]),
];
const DRIVE: &[&str] = &["node", "drive", "serial", "model", "media"];
const VOLUME: &[&str] = &["node", "volume", "drive"];

#[test]
fn a_strict_openmetrics_parser_reads_every_agreed_series_with_its_type_and_labels() {
    let text = counters().render(sample(), Format::OpenMetrics);
    // The parser refuses a UNIT line on a histogram, which OpenMetrics allows (its own
    // examples have one, Prometheus reads it): that one line is left out here, and
    // checked by `counters_render_with_total_suffixes_units_and_cumulative_buckets`.
    let unit = "# UNIT drivelet_csi_request_duration_seconds seconds\n";
    assert!(text.contains(unit));
    let text = text.replace(unit, "");
    let parsed = openmetrics_parser::openmetrics::parse_openmetrics(&text).unwrap_or_else(|e| panic!("not OpenMetrics: {e:?}\n{text}"));
    for (name, kind, labels) in SPEC {
        let family = parsed.families.get(*name).unwrap_or_else(|| panic!("no family {name} in\n{text}"));
        assert_eq!(family.family_type.to_string(), *kind, "{name}");
        let got: BTreeSet<&str> = family.get_label_names().iter().map(String::as_str).filter(|l| *l != "le").collect();
        let want: BTreeSet<&str> = labels.iter().copied().collect();
        assert_eq!(got, want, "{name}: label names");
        assert!(family.iter_samples().next().is_some(), "{name}: no series");
    }
    let ours: BTreeSet<&str> = SPEC.iter().map(|s| s.0).collect();
    let extra: Vec<&String> = parsed.families.keys().filter(|k| !ours.contains(k.as_str())).collect();
    assert!(extra.is_empty(), "families not in the agreed set (add them to the spec and docs/operations.md): {extra:?}");
    // A value read back as a scraper reads it.
    let temp = parsed.families.get("drivelet_drive_temperature_celsius").expect("temperature");
    let nvme = temp
        .iter_samples()
        .find(|s| s.get_labelset().ok().and_then(|l| l.get_label_value("drive").map(str::to_string)).as_deref() == Some("nvme-eui.0025"))
        .expect("the NVMe drive's temperature");
    match &nvme.value {
        openmetrics_parser::OpenMetricsValue::Gauge(n) => assert_eq!(n.as_f64(), 35.0),
        _ => panic!("the temperature is a gauge"),
    }
}

#[test]
fn a_managed_drives_room_is_what_placement_offers_and_a_closed_drive_offers_nothing() {
    use std::sync::Arc;

    use crate::actors::inventory::model::Drive;
    use crate::actors::volumes::Cleaning;
    use crate::actors::volumes::conditions::Condition;
    use crate::actors::volumes::model::{VolumeRecord, VolumeState};
    use crate::actors::volumes::view::{DriveRoom, Listed, VolumesView};
    use crate::actors::volumes::VolumesScrape;
    use crate::disk::gpt;
    use crate::words::DriveUse;

    let open = Drive::for_test("d1", Media::Virtual, GIB);
    let cordoned = Drive::for_test("d2", Media::Virtual, GIB);
    let rec = VolumeRecord { binding: crate::words::Binding { pv: "pv-1".into(), claim_namespace: "ns".into(), claim_name: "c".into(), ..Default::default() }, ..VolumeRecord::for_test(1, VolumeState::Available) };
    let used = vec![(rec.start, rec.size)];
    let view = VolumesView::ready(
        vec![Listed { record: Arc::new(rec.clone()), condition: Arc::new(Condition::healthy()) }],
        vec![DriveRoom { drive: open.clone(), used: used.clone(), closed: false, slots_used: 1 }, DriveRoom { drive: cordoned.clone(), used: Vec::new(), closed: true, slots_used: 0 }],
    );
    let scrape = VolumesScrape {
        view: Arc::new(view),
        uses: vec![DriveUse { drive_id: "d2".into(), state: DriveUseState::Cordoned, reason: "asked".into(), requested: false, evacuate: None }],
        cleaning: vec![Cleaning { drive_id: "d1".into(), left_bytes: 5 << 20, round_bytes: 10 << 20 }],
        ..VolumesScrape::default()
    };
    let g = gather::gauges("node-1", true, &[open, cordoned], &scrape, None);

    let extents = gpt::free_extents(GIB, 512, &used);
    let (free, largest) = (extents.iter().map(|e| e.1).sum::<u64>(), extents.iter().map(|e| e.1).max().unwrap_or(0));
    let d1 = g.drives[0].managed.expect("d1 is managed");
    assert_eq!((d1.usage, d1.free, d1.largest_free, d1.allocatable, d1.cleaning, d1.volumes), (None, free, largest, largest, 5 << 20, 1));
    assert_eq!((d1.slots_free, d1.slots), (254, 255), "one slot taken of the kernel's 255");
    let (s, e) = gpt::usable_region(GIB, 512).expect("a usable region");
    let d2 = g.drives[1].managed.expect("d2 is managed");
    assert_eq!((d2.usage, d2.free, d2.allocatable, d2.volumes), (Some(DriveUseState::Cordoned), e - s, 0, 0), "a cordoned drive offers nothing");
    assert_eq!(g.drives_by_state.get(&("managed".into(), "unknown".into(), "cordoned".into())), Some(&1));
    let v = &g.volumes[0];
    assert_eq!((v.drive.as_str(), v.pv.as_str(), v.claim_namespace.as_str(), v.claim.as_str(), v.fs.as_str(), v.abnormal), ("d1", "pv-1", "ns", "c", "ext4", false));
    assert_eq!(g.volumes_by_state.get(&("available".into(), "normal".into())), Some(&1));
}

#[test]
fn condition_reasons_are_the_kebab_case_of_their_csi_names_and_all_distinct() {
    use crate::actors::volumes::conditions::Reason;
    let mut seen = BTreeSet::new();
    for r in Reason::ALL {
        let camel = r.as_str();
        let mut kebab = String::new();
        for (i, c) in camel.chars().enumerate() {
            if c.is_ascii_uppercase() && i > 0 {
                kebab.push('-');
            }
            kebab.push(c.to_ascii_lowercase());
        }
        assert_eq!(r.kebab(), kebab, "{camel}");
        assert!(seen.insert(r.kebab()), "{camel} twice");
    }
}

/// The samples of an exposition of either format: (name, labels in order, with `le` as
/// the number it names) -> value. Panics on a sample line it cannot read.
fn samples(text: &str) -> std::collections::BTreeMap<(String, Vec<(String, String)>), f64> {
    let mut out = std::collections::BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (name, rest) = line.split_at(line.find(['{', ' ']).unwrap_or_else(|| panic!("a sample without a value: {line}")));
        let mut labels = Vec::new();
        let mut chars = rest.chars().peekable();
        if chars.peek() == Some(&'{') {
            chars.next();
            loop {
                let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
                assert_eq!(chars.next(), Some('"'), "{line}");
                let mut value = String::new();
                loop {
                    match chars.next() {
                        Some('\\') => match chars.next() {
                            Some('n') => value.push('\n'),
                            Some(c @ ('\\' | '"')) => value.push(c),
                            other => panic!("escape {other:?} in {line}"),
                        },
                        Some('"') => break,
                        Some(c) => value.push(c),
                        None => panic!("an unclosed label value in {line}"),
                    }
                }
                if key == "le" {
                    value = value.parse::<f64>().map(|v| v.to_string()).unwrap_or_else(|_| panic!("le {value} in {line}"));
                }
                labels.push((key, value));
                match chars.next() {
                    Some(',') => {}
                    Some('}') => break,
                    other => panic!("{other:?} after a label in {line}"),
                }
            }
        }
        let value: String = chars.collect();
        let value: f64 = value.trim().parse().unwrap_or_else(|_| panic!("value {value} in {line}"));
        labels.sort();
        assert!(out.insert((name.to_string(), labels), value).is_none(), "a sample twice: {line}");
    }
    out
}

#[test]
fn the_text_format_carries_every_sample_of_the_openmetrics_one() {
    let m = counters();
    let om = m.render(sample(), Format::OpenMetrics);
    let text = m.render(sample(), Format::Text);
    let (om, text) = (samples(&om), samples(&text));
    assert!(om.len() > 100, "{} samples", om.len());
    let only_om: Vec<_> = om.keys().filter(|k| !text.contains_key(*k)).collect();
    let only_text: Vec<_> = text.keys().filter(|k| !om.contains_key(*k)).collect();
    assert!(only_om.is_empty() && only_text.is_empty(), "only in OpenMetrics: {only_om:?}\nonly in the text format: {only_text:?}");
    for (k, v) in &om {
        assert_eq!(text[k], *v, "{k:?}");
    }
}

#[test]
fn the_text_format_names_help_and_type_as_its_samples_with_no_unit_or_eof() {
    let text = counters().render(sample(), Format::Text);
    expect_lines(
        &text,
        &[
            "# HELP drivelet_csi_requests_total CSI requests served, by method and gRPC code.",
            "# TYPE drivelet_csi_requests_total counter",
            "drivelet_csi_requests_total{method=\"Probe\",code=\"OK\"} 5",
            "# HELP drivelet_csi_request_duration_seconds CSI request latency, by method.",
            "# TYPE drivelet_csi_request_duration_seconds histogram",
            "drivelet_csi_request_duration_seconds_bucket{method=\"Probe\",le=\"60\"} 5",
            "drivelet_csi_request_duration_seconds_bucket{method=\"Probe\",le=\"+Inf\"} 6",
            "drivelet_csi_request_duration_seconds_count{method=\"Probe\"} 6",
            "# HELP drivelet_zeroed_bytes_total Bytes of freed drive space zeroed before reuse.",
            "# TYPE drivelet_zeroed_bytes_total counter",
            "# TYPE drivelet_drive_power_on_seconds_total counter",
            "# TYPE drivelet_drive_temperature_celsius gauge",
            "# TYPE drivelet_build_info gauge",
        ],
    );
    assert!(!text.contains("# UNIT") && !text.contains("# EOF"), "no OpenMetrics-only line:\n{text}");
    // As a text-format parser reads it: each family's HELP then TYPE, named as its
    // samples are (a histogram's with _bucket, _sum and _count), each family once.
    let mut families = BTreeSet::new();
    let mut current: Option<(String, String)> = None;
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if let Some(help) = line.strip_prefix("# HELP ") {
            let name = help.split(' ').next().expect("a name").to_string();
            let kind = lines.next().and_then(|t| t.strip_prefix(&format!("# TYPE {name} "))).unwrap_or_else(|| panic!("no TYPE after HELP of {name}"));
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{name}: {kind}");
            assert!(families.insert(name.clone()), "{name} twice");
            current = Some((name, kind.to_string()));
            continue;
        }
        let (name, kind) = current.as_ref().unwrap_or_else(|| panic!("a sample before any HELP: {line}"));
        let sample = line.split(['{', ' ']).next().unwrap_or("");
        let ok = match kind.as_str() {
            "histogram" => [format!("{name}_bucket"), format!("{name}_sum"), format!("{name}_count")].contains(&sample.to_string()),
            _ => sample == name,
        };
        assert!(ok, "{sample} under the {kind} {name}");
        assert!(kind != "counter" || name.ends_with("_total"), "{name}: a counter ends in _total");
    }
    let want: BTreeSet<String> = SPEC.iter().map(|(name, kind, _)| if *kind == "counter" { format!("{name}_total") } else { name.to_string() }).collect();
    assert_eq!(families, want, "every family of the agreed set, once, named as its samples");
}

#[test]
fn a_label_value_cannot_come_from_a_request() {
    // The counters take only `&'static str` labels; the CSI layer names a method from
    // its table or `unknown` (grpc::rpc_metrics), whatever path a client sends.
    let m = Metrics::default();
    for path in ["/csi.v1.Controller/CreateVolume", "/csi.v1.Controller/Minted-1", "/x/Minted-2", "/csi.v1.GroupController/GroupControllerGetCapabilities"] {
        m.record_rpc(crate::grpc::rpc_metrics::method_label(path), 12, Duration::from_millis(1));
    }
    let text = m.render(Gauges::default(), Format::OpenMetrics);
    expect_lines(
        &text,
        &[
            "drivelet_csi_requests_total{method=\"CreateVolume\",code=\"UNIMPLEMENTED\"} 1",
            "drivelet_csi_requests_total{method=\"unknown\",code=\"UNIMPLEMENTED\"} 3",
            "drivelet_csi_request_duration_seconds_count{method=\"unknown\"} 3",
        ],
    );
    assert!(!text.contains("Minted") && !text.contains("GroupController"), "{text}");
}
