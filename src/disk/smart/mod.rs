//! Drive health from `smartctl --json` output and smartctl's exit status. Pure: the
//! caller runs smartctl; this module only reads what it printed.
//!
//! The exit status is smartctl's bit mask (`smartctl.exit_status` in the JSON wins over
//! the process code the caller passes). The policy, applied in this order:
//!
//! 1. **Unknown without looking further** when bit 0 (command line) or bit 1 (device open
//!    failed, also the `--nocheck=standby` skip) is set or the status is not an exit code
//!    (0..=255); the reason is drivelet's sentence for what smartctl's messages
//!    (`smartctl.messages[].string`) say (a loop or virtual disk, a USB bridge, a RAID
//!    controller, permission denied, a device gone, standby), else a cause named from the
//!    bits. Output that is not a JSON object is Unknown too, unless
//!    the process code says worse: bits 3/4 still make it Bad, bits 5/7 Suspect.
//! 2. **Findings**, each a health level and a sentence an admin can act on:
//!    - Bad: `smart_status.passed == false` or bit 3 (the overall self-assessment failed).
//!    - ATA attributes, by raw value: 5 Reallocated_Sector_Ct and 197
//!      Current_Pending_Sector against their suspect/bad thresholds, 198
//!      Offline_Uncorrectable against its suspect threshold. Any attribute with
//!      `when_failed` "now" is Bad, "past" is Suspect; bit 4 (pre-fail attribute at
//!      threshold) is Bad and bit 5 (attribute at threshold in the past) Suspect when no
//!      attribute in the table already says so.
//!    - ATA error log: a non-zero `ata_smart_error_log` count (extended, else summary) is
//!      Suspect, naming the latest error; bit 6 with no such count is Suspect for ATA
//!      drives too. The count never resets, so such a drive stays Suspect: the poller
//!      should watch for it growing. Bit 6 is no finding on NVMe, whose error log also
//!      counts rejected host commands (`num_err_log_entries` is informational), nor on
//!      SCSI, which is judged by its error counters.
//!    - Self-test log: bit 7, or ATA failed self-tests not outdated by a newer passing
//!      extended test, is Suspect.
//!    - NVMe health log: `critical_warning != 0` is Bad, each set bit named (spare below
//!      threshold, temperature, reliability degraded, read-only, volatile memory backup
//!      failed, persistent memory region unreliable); `media_errors` and
//!      `percentage_used` against their thresholds.
//!    - SCSI: `scsi_grown_defect_list` against its thresholds, any
//!      `total_uncorrected_errors` in `scsi_error_counter_log` Suspect, and
//!      `scsi_percentage_used_endurance_indicator` against the percentage-used thresholds.
//!    - `temperature.current` (else the NVMe log's) above `temperature_suspect_c` is
//!      Suspect, judged only when health data was read (devices without SMART report 0).
//!    - Bit 2 (a SMART command failed) is not a finding: smartctl sets it for partial
//!      failures such as an unsupported log page. Without health data it explains the
//!      Unknown.
//! 3. **Health** is the worst finding. With no finding it is Good only if SMART health
//!    data was read (`smart_status`, ATA attributes, the NVMe health log or SCSI
//!    defect/error counters); otherwise Unknown, the cause named (no SMART support, as on
//!    RAID virtual disks and virtual or loop devices; SMART disabled; no data).
//!
//! A count threshold of 0 turns that check off. Reasons come worst first. Missing or
//! ill-typed fields are skipped, never fatal: any input gives a report.
//!
//! Every reason is a sentence drivelet wrote: smartctl's own messages never become a
//! reason. They are kept in [`SmartReport::tool_messages`] for the poller's debug log.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use self::families::{ata_attributes, ata_error_log, ata_self_test_log, nvme, scsi};
pub use self::figures::SmartFigures;
use crate::words::Health;

/// What each drive family's logs say: ATA attributes, error and self-test logs, the
/// NVMe health log, SCSI counters, as findings.
mod families;
/// The figures of a report: temperature, wear, sector and error counts, power-on time.
mod figures;

/// Exit status bit 0: smartctl did not parse its command line.
const BIT_COMMAND_LINE: i32 = 1 << 0;
/// Exit status bit 1: the device could not be opened (or is in standby and was skipped).
const BIT_OPEN_FAILED: i32 = 1 << 1;
/// Exit status bit 2: a SMART or other command failed, or a checksum was wrong.
const BIT_COMMAND_FAILED: i32 = 1 << 2;
/// Exit status bit 3: the SMART self-assessment says "DISK FAILING".
const BIT_DISK_FAILING: i32 = 1 << 3;
/// Exit status bit 4: pre-fail attributes at or below their threshold.
const BIT_PREFAIL_NOW: i32 = 1 << 4;
/// Exit status bit 5: attributes at or below their threshold in the past.
const BIT_ATTRIBUTE_PAST: i32 = 1 << 5;
/// Exit status bit 6: the device error log has records.
const BIT_ERROR_LOG: i32 = 1 << 6;
/// Exit status bit 7: the self-test log has failed tests.
const BIT_SELF_TEST_LOG: i32 = 1 << 7;

/// Where counts turn a drive Suspect or Bad. A count threshold of 0 turns that check off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SmartThresholds {
    /// ATA 5 Reallocated_Sector_Ct at or above this is Suspect.
    pub reallocated_sectors_suspect: u64,
    /// ATA 5 Reallocated_Sector_Ct at or above this is Bad.
    pub reallocated_sectors_bad: u64,
    /// ATA 197 Current_Pending_Sector at or above this is Suspect.
    pub pending_sectors_suspect: u64,
    /// ATA 197 Current_Pending_Sector at or above this is Bad.
    pub pending_sectors_bad: u64,
    /// ATA 198 Offline_Uncorrectable at or above this is Suspect.
    pub uncorrectable_suspect: u64,
    /// NVMe media and data integrity errors at or above this are Suspect.
    pub media_errors_suspect: u64,
    /// NVMe media and data integrity errors at or above this are Bad.
    pub media_errors_bad: u64,
    /// NVMe (or SCSI) percentage of rated endurance used at or above this is Suspect.
    pub percentage_used_suspect: u8,
    /// NVMe (or SCSI) percentage of rated endurance used at or above this is Bad.
    pub percentage_used_bad: u8,
    /// A temperature above this many degrees Celsius is Suspect.
    pub temperature_suspect_c: i64,
    /// SCSI grown defect list entries at or above this are Suspect.
    pub grown_defects_suspect: u64,
    /// SCSI grown defect list entries at or above this are Bad.
    pub grown_defects_bad: u64,
}

impl Default for SmartThresholds {
    fn default() -> Self {
        SmartThresholds {
            reallocated_sectors_suspect: 1,
            reallocated_sectors_bad: 100,
            pending_sectors_suspect: 1,
            pending_sectors_bad: 100,
            uncorrectable_suspect: 1,
            media_errors_suspect: 1,
            media_errors_bad: 100,
            percentage_used_suspect: 90,
            percentage_used_bad: 100,
            temperature_suspect_c: 70,
            grown_defects_suspect: 1,
            grown_defects_bad: 100,
        }
    }
}

/// The verdict on one drive, with what smartctl said about its identity.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct SmartReport {
    /// The worst finding.
    pub health: Health,
    /// One plain sentence per finding, worst first; for Unknown, the cause. Empty when Good.
    pub reasons: Vec<String>,
    /// Model name (`model_name`, or the SCSI vendor and product).
    pub model: Option<String>,
    /// Serial number.
    pub serial: Option<String>,
    /// Temperature, wear, sector and error counts, when SMART data was read.
    pub figures: SmartFigures,
    /// What smartctl itself printed as messages (and why its output could not be read),
    /// raw: for the debug log only, never a reason.
    #[serde(skip)]
    pub tool_messages: Vec<String>,
}

impl SmartReport {
    /// An Unknown report with nothing in it yet.
    fn empty() -> Self {
        SmartReport {
            health: Health::Unknown,
            reasons: Vec::new(),
            model: None,
            serial: None,
            figures: SmartFigures::default(),
            tool_messages: Vec::new(),
        }
    }

    /// The reasons joined with "; ", or "healthy" for a Good drive with nothing to say.
    pub(crate) fn reason(&self) -> String {
        if !self.reasons.is_empty() {
            return self.reasons.join("; ");
        }
        match self.health {
            Health::Good => "healthy".to_string(),
            Health::Unknown => "no SMART data".to_string(),
            other => other.as_str().to_string(),
        }
    }
}

/// Assesses one `smartctl --json` run of a device whose transport is unknown: see
/// [`assess_for`].
pub(crate) fn assess(json: &str, exit_status: i32, t: &SmartThresholds) -> SmartReport {
    assess_for(json, exit_status, "", t)
}

/// Assesses one `smartctl --json` run. `exit_status` is smartctl's process exit code;
/// `smartctl.exit_status` in the JSON takes precedence when present. `transport` is the
/// device's bus as the inventory names it (`loop`, `virtio`, `usb`, `sata`, ...; empty
/// when unknown): it picks the words when smartctl cannot tell what the device is. Never
/// fails: output that cannot be understood gives Unknown with the cause.
pub(crate) fn assess_for(json: &str, exit_status: i32, transport: &str, t: &SmartThresholds) -> SmartReport {
    if json.trim().is_empty() {
        return without_json(
            exit_status,
            "no health data: smartctl printed nothing (smartctl 7.0 or newer is needed for --json)",
            None,
        );
    }
    match serde_json::from_str::<Value>(json) {
        Ok(root) if root.is_object() => assess_value(&root, exit_status, transport, t),
        Ok(_) => without_json(exit_status, "no health data: smartctl printed JSON drivelet cannot read", None),
        Err(e) => without_json(
            exit_status,
            "no health data: smartctl printed something that is not JSON",
            Some(format!("smartctl output is not JSON: {e}")),
        ),
    }
}

/// The verdict when the output says nothing: only the exit status speaks. `detail` is
/// the parser's complaint, for the debug log.
fn without_json(status: i32, cause: &str, detail: Option<String>) -> SmartReport {
    let mut report = SmartReport::empty();
    report.tool_messages.extend(detail);
    if let Some(unknown) = unusable_status(status) {
        report.health = Health::Unknown;
        report.reasons = vec![unknown, cause.to_string()];
        return report;
    }
    let mut findings = Findings::default();
    // Bit 6 counts only for ATA drives, and without output the protocol is unknown.
    status_findings(status & !BIT_ERROR_LOG, &mut findings);
    findings.finish(&mut report, Some(cause.to_string()));
    report
}

/// The verdict on parsed output (a JSON object).
fn assess_value(root: &Value, given: i32, transport: &str, t: &SmartThresholds) -> SmartReport {
    let status = root
        .pointer("/smartctl/exit_status")
        .and_then(Value::as_i64)
        .and_then(|s| i32::try_from(s).ok())
        .unwrap_or(given);
    let messages = messages(root);
    let mut words: Vec<String> = Vec::new();
    for m in &messages {
        if let Some(w) = message_words(m, transport).filter(|w| !words.contains(w)) {
            words.push(w);
        }
    }
    let mut report = SmartReport::empty();
    report.model = model(root);
    report.serial = text(root, "/serial_number");
    report.tool_messages = messages;

    if let Some(cause) = unusable_status(status) {
        report.health = Health::Unknown;
        report.reasons = if words.is_empty() { vec![cause] } else { words };
        return report;
    }

    let read = health_data_read(root);
    let mut findings = Findings::default();
    // Exit status bits the JSON explains more precisely are masked out of `unexplained`.
    let mut unexplained = status;
    if root.pointer("/smart_status/passed").and_then(Value::as_bool) == Some(false) {
        findings.add(Health::Bad, SELF_ASSESSMENT_FAILED.to_string());
        unexplained &= !BIT_DISK_FAILING;
    }
    let (failing_now, failed_past) = ata_attributes(root, t, &mut findings);
    if failing_now {
        unexplained &= !(BIT_PREFAIL_NOW | BIT_ATTRIBUTE_PAST);
    } else if failed_past {
        unexplained &= !BIT_ATTRIBUTE_PAST;
    }
    if !is_ata(root) || ata_error_log(root, &mut findings) {
        unexplained &= !BIT_ERROR_LOG;
    }
    if ata_self_test_log(root, &mut findings) {
        unexplained &= !BIT_SELF_TEST_LOG;
    }
    status_findings(unexplained, &mut findings);
    nvme(root, t, &mut findings);
    scsi(root, t, &mut findings);

    if read {
        report.figures = SmartFigures::of(root);
        if let Some(c) = report.figures.temperature_c.filter(|c| *c > t.temperature_suspect_c) {
            findings.add(
                Health::Suspect,
                format!(
                    "temperature {c} °C is above {} °C: check the drive's cooling and airflow",
                    t.temperature_suspect_c
                ),
            );
        }
    }
    let cause = if read {
        None
    } else {
        Some(no_data_cause(root, status, &words, report.model.as_deref()))
    };
    findings.finish(&mut report, cause);
    report
}

/// The findings so far: a health level and a sentence each.
#[derive(Default)]
struct Findings(Vec<(Health, String)>);

impl Findings {
    fn add(&mut self, health: Health, reason: String) {
        self.0.push((health, reason));
    }

    /// Writes the worst health and the reasons (worst first) into the report. `no_data`
    /// is the Unknown cause when no SMART health data was read.
    fn finish(mut self, report: &mut SmartReport, no_data: Option<String>) {
        self.0.sort_by_key(|(health, _)| std::cmp::Reverse(*health));
        let worst = self.0.first().map(|(h, _)| *h);
        report.health = match (worst, &no_data) {
            (Some(h), _) => h,
            (None, Some(_)) => Health::Unknown,
            (None, None) => Health::Good,
        };
        report.reasons = self.0.into_iter().map(|(_, r)| r).collect();
        report.reasons.extend(no_data);
    }
}

/// Why the exit status alone makes the output unusable, if it does.
fn unusable_status(status: i32) -> Option<String> {
    if !(0..=255).contains(&status) {
        return Some(format!("no health data: smartctl did not exit normally (status {status})"));
    }
    if status & BIT_COMMAND_LINE != 0 {
        return Some(format!(
            "no health data: smartctl did not know how to read this device (exit status {status})"
        ));
    }
    if status & BIT_OPEN_FAILED != 0 {
        return Some(format!(
            "no health data: smartctl could not open the device, or it was asleep (standby) and not woken (exit status {status})"
        ));
    }
    None
}

/// The reason for a failed overall self-assessment.
const SELF_ASSESSMENT_FAILED: &str = "SMART overall self-assessment FAILED: back up and replace the drive";

/// Findings from exit status bits 3 to 7 that the JSON did not already explain.
fn status_findings(status: i32, findings: &mut Findings) {
    if status & BIT_DISK_FAILING != 0 {
        findings.add(Health::Bad, SELF_ASSESSMENT_FAILED.to_string());
    }
    if status & BIT_PREFAIL_NOW != 0 {
        findings.add(
            Health::Bad,
            "smartctl reports a pre-failure attribute at or below its threshold: back up and replace the drive"
                .to_string(),
        );
    }
    if status & BIT_ATTRIBUTE_PAST != 0 {
        findings.add(
            Health::Suspect,
            "smartctl reports an attribute that fell to its failure threshold in the past: watch the drive".to_string(),
        );
    }
    if status & BIT_ERROR_LOG != 0 {
        findings.add(
            Health::Suspect,
            "smartctl reports errors in the drive's error log: read them with `smartctl -l error`".to_string(),
        );
    }
    if status & BIT_SELF_TEST_LOG != 0 {
        findings.add(
            Health::Suspect,
            "smartctl reports failed self-tests: read them with `smartctl -l selftest` and plan a replacement"
                .to_string(),
        );
    }
}

/// Whether smartctl read any SMART health data at all.
fn health_data_read(root: &Value) -> bool {
    root.pointer("/smart_status/passed").is_some_and(Value::is_boolean)
        || root
            .pointer("/ata_smart_attributes/table")
            .and_then(Value::as_array)
            .is_some_and(|t| !t.is_empty())
        || root
            .get("nvme_smart_health_information_log")
            .is_some_and(Value::is_object)
        || root.get("scsi_grown_defect_list").is_some_and(Value::is_number)
        || root.get("scsi_error_counter_log").is_some_and(Value::is_object)
}

/// Why there is no health data, for the Unknown reason. `words` are drivelet's
/// sentences for what smartctl's messages said.
fn no_data_cause(root: &Value, status: i32, words: &[String], model: Option<&str>) -> String {
    let what = model.map_or_else(|| "this device".to_string(), |m| format!("\"{m}\""));
    let cause = if root.pointer("/smart_support/available").and_then(Value::as_bool) == Some(false) {
        format!(
            "no health data: {what} does not support SMART: RAID virtual disks, virtual and loop devices have none; \
             check the physical drives behind it"
        )
    } else if root.pointer("/smart_support/enabled").and_then(Value::as_bool) == Some(false) {
        format!("no health data: SMART is disabled on {what}: enable it with `smartctl --smart=on`")
    } else if status & BIT_COMMAND_FAILED != 0 {
        format!("no health data: smartctl read no SMART health data from {what}: a SMART command failed (exit status bit 2)")
    } else {
        format!("no health data: smartctl read no SMART health data from {what}")
    };
    if words.is_empty() {
        cause
    } else {
        format!("{}; {cause}", words.join("; "))
    }
}

/// drivelet's sentence for one of smartctl's messages, where drivelet knows what it
/// means; `None` for a message it does not know (kept for the debug log only).
/// `transport` names the device's bus as the inventory does.
pub(crate) fn message_words(message: &str, transport: &str) -> Option<String> {
    let m = message.to_ascii_lowercase();
    let has = |s: &str| m.contains(s);
    let sentence = if has("unable to detect device type") || has("please specify device type") {
        match transport {
            "loop" => "no health data: a loop device reports no SMART",
            "virtio" | "xen" | "vmbus" | "virtual" => {
                "no health data: a virtual disk reports no SMART; the drives behind it are watched where they are attached"
            }
            "usb" => "no health data: smartctl cannot read SMART through this USB bridge",
            _ => "no health data: smartctl does not recognise this kind of device, so it reports no SMART",
        }
    } else if has("unknown usb bridge") || has("unsupported usb bridge") {
        "no health data: smartctl cannot read SMART through this USB bridge"
    } else if has("megaraid") {
        "no health data: this is a RAID controller's virtual disk (MegaRAID or PERC); its physical drives are read \
         only through the controller (smartctl -d megaraid,N)"
    } else if has("permission denied") || has("operation not permitted") {
        "no health data: the device refused SMART commands (permission denied): the agent needs to run as root with \
         CAP_SYS_RAWIO and CAP_SYS_ADMIN"
    } else if has("standby") || has("sleep mode") {
        "no health data: the drive is asleep (standby) and was not woken to be read; it is read again when it is awake"
    } else if has("no such device") || has("no such file") {
        "no health data: the device is gone (smartctl could not open it)"
    } else if has("open device") && has("failed") {
        "no health data: smartctl could not open the device"
    } else {
        return None;
    };
    Some(sentence.to_string())
}

/// A non-negative count; large or fractional numbers saturate, anything else is absent.
fn count(v: Option<&Value>) -> Option<u64> {
    let v = v?;
    v.as_u64()
        .or_else(|| v.as_f64().filter(|f| f.is_finite() && *f >= 0.0).map(|f| f as u64))
}

/// The current temperature: `temperature.current`, else the NVMe health log's.
fn temperature(root: &Value) -> Option<i64> {
    let read = |v: Option<&Value>| {
        let v = v?;
        v.as_i64()
            .or_else(|| v.as_f64().filter(|f| f.is_finite()).map(|f| f as i64))
    };
    read(root.pointer("/temperature/current"))
        .or_else(|| read(root.pointer("/nvme_smart_health_information_log/temperature")))
}

/// Whether the device speaks ATA (including SATA behind SAT or USB bridges).
fn is_ata(root: &Value) -> bool {
    match root.pointer("/device/protocol").and_then(Value::as_str) {
        Some(p) => p.eq_ignore_ascii_case("ATA"),
        None => root.get("ata_smart_attributes").is_some(),
    }
}

/// The non-empty, trimmed string at `pointer`.
fn text(root: &Value, pointer: &str) -> Option<String> {
    root.pointer(pointer)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// `model_name`, else `scsi_model_name`, else SCSI vendor and product.
fn model(root: &Value) -> Option<String> {
    text(root, "/model_name")
        .or_else(|| text(root, "/scsi_model_name"))
        .or_else(|| {
            let parts: Vec<String> = ["/scsi_vendor", "/scsi_product"]
                .iter()
                .filter_map(|p| text(root, p))
                .collect();
            (!parts.is_empty()).then(|| parts.join(" "))
        })
}

/// smartctl's own messages (`smartctl.messages[].string`), trimmed, empty ones left out.
fn messages(root: &Value) -> Vec<String> {
    root.pointer("/smartctl/messages")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(|m| m.get("string").and_then(Value::as_str))
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::path::{Path, PathBuf};

    fn fixture_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smartctl")
    }

    fn fixture(name: &str) -> String {
        let path = fixture_dir().join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Assesses a fixture the way the poller will: with the process exit code smartctl
    /// returned, which is the one recorded in its JSON.
    fn assess_fixture_with(name: &str, t: &SmartThresholds) -> SmartReport {
        let text = fixture(name);
        let code: Value = serde_json::from_str(&text).expect("fixture is JSON");
        let code = code
            .pointer("/smartctl/exit_status")
            .and_then(Value::as_i64)
            .expect("exit_status") as i32;
        assess(&text, code, t)
    }

    fn assess_fixture(name: &str) -> SmartReport {
        assess_fixture_with(name, &SmartThresholds::default())
    }

    #[track_caller]
    fn expect(report: &SmartReport, health: Health, reason_part: &str) {
        assert_eq!(report.health, health, "reasons: {:?}", report.reasons);
        assert!(
            report.reason().contains(reason_part),
            "{:?} not in {:?}",
            reason_part,
            report.reason()
        );
    }

    /// The verdict on every fixture: (file, health, part of the reason).
    const VERDICTS: &[(&str, Health, &str)] = &[
        (
            "error-open-failed-megaraid.json",
            Health::Unknown,
            "no health data: this is a RAID controller's virtual disk (MegaRAID or PERC)",
        ),
        (
            "loop-unable-to-detect-device-type.json",
            Health::Unknown,
            "no health data: smartctl does not recognise this kind of device",
        ),
        (
            "nvme-critical-warning.json",
            Health::Bad,
            "volatile memory backup device has failed",
        ),
        ("nvme-healthy.json", Health::Good, "healthy"),
        (
            "nvme-media-errors.json",
            Health::Suspect,
            "7 media errors (suspect at 1, bad at 100)",
        ),
        ("nvme-percentage-used-high.json", Health::Good, "healthy"),
        ("sas-healthy.json", Health::Good, "healthy"),
        (
            "sata-hdd-error-log-exit64.json",
            Health::Suspect,
            "12 errors in the ATA error log",
        ),
        ("sata-hdd-healthy.json", Health::Good, "healthy"),
        (
            "sata-hdd-reallocated-pending.json",
            Health::Bad,
            "1040 reallocated sectors (suspect at 1, bad at 100)",
        ),
        (
            "sata-hdd-smart-failed.json",
            Health::Bad,
            "SMART overall self-assessment FAILED",
        ),
        ("sata-ssd-healthy.json", Health::Good, "healthy"),
        (
            "scsi-grown-defects.json",
            Health::Bad,
            "260 grown defects in the SCSI defect list",
        ),
        (
            "scsi-raid-virtual-disk-no-smart.json",
            Health::Unknown,
            "does not support SMART",
        ),
    ];

    #[test]
    fn every_fixture_file_has_a_verdict_and_every_verdict_holds() {
        let mut files: Vec<String> = std::fs::read_dir(fixture_dir())
            .expect("fixture dir")
            .map(|e| e.expect("dir entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".json"))
            .collect();
        files.sort();
        let named: Vec<&str> = VERDICTS.iter().map(|(f, _, _)| *f).collect();
        assert_eq!(files, named);
        for (file, health, part) in VERDICTS {
            let report = assess_fixture(file);
            assert_eq!(report.health, *health, "{file}: {:?}", report.reasons);
            assert!(report.reason().contains(part), "{file}: {:?}", report.reason());
        }
    }

    #[test]
    fn megaraid_device_that_fails_to_open_is_unknown_in_drivelets_words_with_smartctls_message_kept_for_the_log() {
        let r = assess_fixture("error-open-failed-megaraid.json");
        expect(&r, Health::Unknown, "its physical drives are read only through the controller");
        assert!(!r.reason().contains("Smartctl open device"), "{}", r.reason());
        assert!(r.tool_messages.iter().any(|m| m.contains("DELL or MegaRaid controller")), "{:?}", r.tool_messages);
        assert_eq!(r.reasons.len(), 1);
        assert_eq!((r.model, r.serial, r.figures.temperature_c), (None, None, None));
    }

    #[test]
    fn nvme_with_critical_warning_is_bad_and_names_the_warning_bit() {
        let r = assess_fixture("nvme-critical-warning.json");
        expect(
            &r,
            Health::Bad,
            "NVMe critical warning 0x10: volatile memory backup device has failed",
        );
        expect(&r, Health::Bad, SELF_ASSESSMENT_FAILED);
        assert_eq!(r.reasons.len(), 2, "{:?}", r.reasons);
    }

    #[test]
    fn healthy_nvme_is_good_with_identity_temperature_and_hours() {
        let r = assess_fixture("nvme-healthy.json");
        expect(&r, Health::Good, "healthy");
        assert!(r.reasons.is_empty());
        assert_eq!(r.model.as_deref(), Some("SAMSUNG MZQL21T9HCJR-00A07"));
        assert_eq!(r.serial.as_deref(), Some("REDACTED"));
        assert_eq!((r.figures.temperature_c, r.figures.power_on_hours), (Some(22), Some(13113)));
    }

    #[test]
    fn nvme_with_media_errors_is_suspect_and_its_error_log_entries_are_not_a_finding() {
        let r = assess_fixture("nvme-media-errors.json");
        expect(&r, Health::Suspect, "7 media errors (suspect at 1, bad at 100)");
        assert_eq!(
            r.reasons.len(),
            1,
            "62 error log entries must not be reported: {:?}",
            r.reasons
        );
    }

    #[test]
    fn nvme_at_75_percent_endurance_is_good_by_default_and_suspect_at_a_75_threshold() {
        let r = assess_fixture("nvme-percentage-used-high.json");
        expect(&r, Health::Good, "healthy");
        assert_eq!(r.figures.power_on_hours, Some(49441));
        let strict = SmartThresholds {
            percentage_used_suspect: 75,
            ..SmartThresholds::default()
        };
        let r = assess_fixture_with("nvme-percentage-used-high.json", &strict);
        expect(
            &r,
            Health::Suspect,
            "75% of rated endurance used (suspect at 75%, bad at 100%)",
        );
        let worn = SmartThresholds {
            percentage_used_bad: 75,
            ..SmartThresholds::default()
        };
        expect(
            &assess_fixture_with("nvme-percentage-used-high.json", &worn),
            Health::Bad,
            "75%",
        );
    }

    #[test]
    fn healthy_sas_drive_is_good() {
        let r = assess_fixture("sas-healthy.json");
        expect(&r, Health::Good, "healthy");
        assert_eq!(r.model.as_deref(), Some("SEAGATE ST600MP0036"));
        assert_eq!((r.figures.temperature_c, r.figures.power_on_hours), (Some(29), Some(4665)));
    }

    #[test]
    fn sata_drive_with_interface_errors_in_its_error_log_is_suspect_and_points_at_the_cable() {
        let r = assess_fixture("sata-hdd-error-log-exit64.json");
        expect(
            &r,
            Health::Suspect,
            "12 errors in the ATA error log (latest: Error: ICRC, ABRT at LBA",
        );
        expect(&r, Health::Suspect, "cable");
        assert_eq!(r.reasons.len(), 1, "bit 6 must not be reported twice: {:?}", r.reasons);
    }

    #[test]
    fn healthy_sata_hdd_is_good() {
        let r = assess_fixture("sata-hdd-healthy.json");
        expect(&r, Health::Good, "healthy");
        assert_eq!(r.model.as_deref(), Some("HGST HUH721008ALE604"));
        assert_eq!((r.figures.temperature_c, r.figures.power_on_hours), (Some(25), Some(32564)));
    }

    #[test]
    fn sata_hdd_with_many_reallocated_and_pending_sectors_is_bad_though_smart_passed() {
        let r = assess_fixture("sata-hdd-reallocated-pending.json");
        expect(&r, Health::Bad, "1040 reallocated sectors (suspect at 1, bad at 100)");
        expect(&r, Health::Bad, "878 pending sectors (suspect at 1, bad at 100)");
        expect(&r, Health::Bad, "1272 offline uncorrectable sectors (suspect at 1)");
        assert_eq!(r.serial.as_deref(), Some("AR01234567890C"));
    }

    #[test]
    fn sata_hdd_with_failed_self_assessment_is_bad_and_every_finding_is_listed_worst_first() {
        let r = assess_fixture("sata-hdd-smart-failed.json");
        expect(&r, Health::Bad, SELF_ASSESSMENT_FAILED);
        assert!(
            r.reasons[0].starts_with("SMART overall self-assessment FAILED"),
            "{:?}",
            r.reasons
        );
        for part in [
            "1975 reallocated sectors (suspect at 1, bad at 100)",
            "attribute 5 Reallocated_Sector_Ct is failing now (value 1 at or below threshold 5)",
            "8 pending sectors (suspect at 1, bad at 100)",
            "56 errors in the ATA error log (latest: Error: IDNF at LBA",
            "3 failed self-tests in the self-test log \
             (latest: Extended offline, Completed: read failure at LBA 104870168)",
        ] {
            expect(&r, Health::Bad, part);
        }
        // Bits 3, 4, 6 and 7 of exit status 216 are all explained by the JSON.
        assert_eq!(r.reasons.len(), 6, "{:?}", r.reasons);
        assert_eq!(r.model.as_deref(), Some("Hitachi HDS721050DLE630"));
    }

    #[test]
    fn healthy_sata_ssd_from_smartctl_7_0_is_good() {
        let r = assess_fixture("sata-ssd-healthy.json");
        expect(&r, Health::Good, "healthy");
        assert_eq!((r.figures.temperature_c, r.figures.power_on_hours), (Some(36), Some(14551)));
    }

    #[test]
    fn scsi_drive_with_260_grown_defects_is_bad_and_its_uncorrected_errors_are_listed() {
        let r = assess_fixture("scsi-grown-defects.json");
        expect(
            &r,
            Health::Bad,
            "260 grown defects in the SCSI defect list (suspect at 1, bad at 100)",
        );
        expect(
            &r,
            Health::Bad,
            "536 uncorrected errors in the SCSI error counter log (read 1, write 535)",
        );
        assert_eq!(r.model.as_deref(), Some("SEAGATE ST373453LC"));
        assert_eq!(r.figures.power_on_hours, Some(102880));
    }

    /// The figures of every fixture, as the per-drive metrics carry them: (file,
    /// temperature, power-on hours, percentage used, ATA 5, 197, 198, 199, NVMe media errors).
    #[test]
    fn every_fixture_carries_the_figures_its_drive_reported_and_no_others() {
        type Row = (&'static str, Option<i64>, Option<u64>, Option<u64>, [Option<u64>; 4], Option<u64>);
        const ROWS: &[Row] = &[
            ("error-open-failed-megaraid.json", None, None, None, [None; 4], None),
            ("loop-unable-to-detect-device-type.json", None, None, None, [None; 4], None),
            ("nvme-critical-warning.json", Some(40), Some(18376), Some(0), [None; 4], Some(0)),
            ("nvme-healthy.json", Some(22), Some(13113), Some(3), [None; 4], Some(0)),
            ("nvme-media-errors.json", Some(35), Some(12798), Some(3), [None; 4], Some(7)),
            ("nvme-percentage-used-high.json", Some(19), Some(49441), Some(75), [None; 4], Some(0)),
            ("sas-healthy.json", Some(29), Some(4665), None, [None; 4], None),
            ("sata-hdd-error-log-exit64.json", Some(26), Some(83425), None, [Some(0), Some(0), Some(0), Some(12)], None),
            ("sata-hdd-healthy.json", Some(25), Some(32564), None, [Some(0), Some(0), Some(0), Some(0)], None),
            ("sata-hdd-reallocated-pending.json", Some(29), Some(43177), None, [Some(1040), Some(878), Some(1272), Some(0)], None),
            ("sata-hdd-smart-failed.json", Some(25), Some(65592), None, [Some(1975), Some(8), Some(0), Some(0)], None),
            ("sata-ssd-healthy.json", Some(36), Some(14551), None, [Some(0), None, None, Some(0)], None),
            ("scsi-grown-defects.json", Some(33), Some(102880), None, [None; 4], None),
            ("scsi-raid-virtual-disk-no-smart.json", None, None, None, [None; 4], None),
        ];
        assert_eq!(ROWS.len(), VERDICTS.len(), "a row per fixture");
        for (file, temp, hours, used, [realloc, pending, uncorrectable, crc], media) in ROWS {
            let f = assess_fixture(file).figures;
            let want = SmartFigures {
                temperature_c: *temp,
                power_on_hours: *hours,
                percentage_used: *used,
                reallocated_sectors: *realloc,
                pending_sectors: *pending,
                uncorrectable_sectors: *uncorrectable,
                crc_errors: *crc,
                media_errors: *media,
            };
            assert_eq!(f, want, "{file}");
        }
    }

    #[test]
    fn scsi_endurance_used_is_the_percentage_used_and_figures_read_back_from_older_state() {
        let doc = json!({
            "smartctl": {"exit_status": 0},
            "scsi_grown_defect_list": 0,
            "scsi_percentage_used_endurance_indicator": 104,
        })
        .to_string();
        assert_eq!(assess(&doc, 0, &SmartThresholds::default()).figures.percentage_used, Some(104));
        // A record written before the figures existed reads as "none reported".
        let old: SmartFigures = serde_json::from_str("{}").expect("empty figures");
        assert_eq!(old, SmartFigures::default());
    }

    #[test]
    fn raid_virtual_disk_without_smart_is_unknown_not_bad() {
        let r = assess_fixture("scsi-raid-virtual-disk-no-smart.json");
        expect(&r, Health::Unknown, "\"DELL PERC H740P Mini\" does not support SMART");
        assert_eq!(r.figures.temperature_c, None, "its temperature of 0 is not a reading");
    }

    /// A minimal ATA report carrying one attribute with the given raw value.
    fn ata_with(id: u64, raw: u64) -> String {
        json!({
            "smartctl": {"exit_status": 0},
            "device": {"protocol": "ATA"},
            "smart_status": {"passed": true},
            "ata_smart_attributes": {"table": [
                {"id": id, "name": "X", "value": 100, "worst": 100, "thresh": 0, "when_failed": "",
                 "raw": {"value": raw}}
            ]},
        })
        .to_string()
    }

    fn nvme_with(log: Value) -> String {
        json!({
            "smartctl": {"exit_status": 0},
            "device": {"protocol": "NVMe"},
            "smart_status": {"passed": true},
            "nvme_smart_health_information_log": log,
        })
        .to_string()
    }

    #[test]
    fn ata_sector_counts_turn_suspect_and_bad_exactly_at_their_thresholds() {
        let t = SmartThresholds::default();
        let cases: &[(u64, u64, Health, &str)] = &[
            (5, 0, Health::Good, "healthy"),
            (5, 1, Health::Suspect, "1 reallocated sector (suspect at 1, bad at 100)"),
            (5, 99, Health::Suspect, "99 reallocated sectors"),
            (5, 100, Health::Bad, "100 reallocated sectors"),
            (197, 0, Health::Good, "healthy"),
            (197, 1, Health::Suspect, "1 pending sector (suspect at 1, bad at 100)"),
            (197, 99, Health::Suspect, "99 pending sectors"),
            (197, 100, Health::Bad, "100 pending sectors"),
            (198, 0, Health::Good, "healthy"),
            (198, 1, Health::Suspect, "1 offline uncorrectable sector (suspect at 1)"),
            (198, 1_000_000, Health::Suspect, "1000000 offline uncorrectable sectors"),
            (9, 1_000_000, Health::Good, "healthy"),
        ];
        for (id, raw, health, part) in cases {
            let r = assess(&ata_with(*id, *raw), 0, &t);
            assert_eq!(r.health, *health, "attribute {id} raw {raw}: {:?}", r.reasons);
            assert!(r.reason().contains(part), "attribute {id} raw {raw}: {}", r.reason());
        }
    }

    #[test]
    fn ata_attribute_failing_now_is_bad_and_failed_in_the_past_is_suspect() {
        let doc = |when: &str| {
            json!({
                "device": {"protocol": "ATA"},
                "smart_status": {"passed": true},
                "ata_smart_attributes": {"table": [
                    {"id": 3, "name": "Spin_Up_Time", "value": 20, "worst": 20, "thresh": 24, "when_failed": when,
                     "raw": {"value": 0}}
                ]},
            })
            .to_string()
        };
        let t = SmartThresholds::default();
        expect(
            &assess(&doc("now"), 16, &t),
            Health::Bad,
            "attribute 3 Spin_Up_Time is failing now (value 20",
        );
        expect(
            &assess(&doc("past"), 32, &t),
            Health::Suspect,
            "attribute 3 Spin_Up_Time failed in the past (worst 20",
        );
        assert_eq!(
            assess(&doc("now"), 16, &t).reasons.len(),
            1,
            "bit 4 is explained by the table"
        );
        assert_eq!(
            assess(&doc("past"), 32, &t).reasons.len(),
            1,
            "bit 5 is explained by the table"
        );
        expect(&assess(&doc(""), 0, &t), Health::Good, "healthy");
        expect(
            &assess(&doc(""), 16, &t),
            Health::Bad,
            "pre-failure attribute at or below its threshold",
        );
        expect(
            &assess(&doc(""), 32, &t),
            Health::Suspect,
            "fell to its failure threshold in the past",
        );
    }

    #[test]
    fn nvme_counts_turn_suspect_and_bad_exactly_at_their_thresholds() {
        let t = SmartThresholds::default();
        let cases: &[(Value, Health, &str)] = &[
            (
                json!({"media_errors": 0, "percentage_used": 89}),
                Health::Good,
                "healthy",
            ),
            (
                json!({"media_errors": 1}),
                Health::Suspect,
                "1 media error (suspect at 1, bad at 100)",
            ),
            (json!({"media_errors": 99}), Health::Suspect, "99 media errors"),
            (json!({"media_errors": 100}), Health::Bad, "100 media errors"),
            (
                json!({"percentage_used": 90}),
                Health::Suspect,
                "90% of rated endurance used (suspect at 90%, bad at 100%)",
            ),
            (json!({"percentage_used": 99}), Health::Suspect, "99%"),
            (json!({"percentage_used": 100}), Health::Bad, "100%"),
            (json!({"percentage_used": 255}), Health::Bad, "255%"),
            (json!({"num_err_log_entries": 5000}), Health::Good, "healthy"),
            (json!({"critical_warning": 0}), Health::Good, "healthy"),
        ];
        for (log, health, part) in cases {
            let r = assess(&nvme_with(log.clone()), 0, &t);
            assert_eq!(r.health, *health, "{log}: {:?}", r.reasons);
            assert!(r.reason().contains(part), "{log}: {}", r.reason());
        }
    }

    #[test]
    fn every_nvme_critical_warning_bit_is_bad_and_named() {
        let t = SmartThresholds::default();
        let cases = [
            (0x01, "available spare is below its threshold"),
            (0x02, "temperature is outside the drive's limits"),
            (0x04, "NVM subsystem reliability is degraded"),
            (0x08, "media is read-only"),
            (0x10, "volatile memory backup device has failed"),
            (0x20, "persistent memory region is unreliable"),
            (0x40, "reserved bits 0x40"),
            (
                0x05,
                "0x05: available spare is below its threshold, NVM subsystem reliability is degraded",
            ),
        ];
        for (bits, part) in cases {
            let r = assess(&nvme_with(json!({ "critical_warning": bits })), 0, &t);
            expect(&r, Health::Bad, part);
        }
    }

    #[test]
    fn scsi_grown_defects_and_uncorrected_errors_turn_suspect_and_bad_at_their_thresholds() {
        let t = SmartThresholds::default();
        let doc = |defects: u64, uncorrected: u64| {
            json!({
                "device": {"protocol": "SCSI"},
                "smart_status": {"passed": true},
                "scsi_grown_defect_list": defects,
                "scsi_error_counter_log": {
                    "read": {"total_uncorrected_errors": 0},
                    "verify": {"total_uncorrected_errors": uncorrected},
                },
            })
            .to_string()
        };
        expect(&assess(&doc(0, 0), 0, &t), Health::Good, "healthy");
        expect(
            &assess(&doc(1, 0), 0, &t),
            Health::Suspect,
            "1 grown defect in the SCSI defect list (suspect at 1, bad at 100)",
        );
        expect(&assess(&doc(99, 0), 0, &t), Health::Suspect, "99 grown defects");
        expect(&assess(&doc(100, 0), 0, &t), Health::Bad, "100 grown defects");
        expect(
            &assess(&doc(0, 1), 0, &t),
            Health::Suspect,
            "1 uncorrected error in the SCSI error counter log (verify 1)",
        );
        let ssd = json!({"smart_status": {"passed": true}, "scsi_percentage_used_endurance_indicator": 95}).to_string();
        expect(&assess(&ssd, 0, &t), Health::Suspect, "95% of rated endurance used");
    }

    #[test]
    fn temperature_above_the_limit_is_suspect_and_at_the_limit_is_not() {
        let t = SmartThresholds::default();
        let doc = |c: i64| json!({"smart_status": {"passed": true}, "temperature": {"current": c}}).to_string();
        expect(&assess(&doc(70), 0, &t), Health::Good, "healthy");
        expect(
            &assess(&doc(71), 0, &t),
            Health::Suspect,
            "temperature 71 °C is above 70 °C",
        );
        expect(&assess(&doc(-5), 0, &t), Health::Good, "healthy");
        assert_eq!(assess(&doc(-5), 0, &t).figures.temperature_c, Some(-5));
    }

    #[test]
    fn a_zero_threshold_turns_its_check_off() {
        let off = SmartThresholds {
            reallocated_sectors_suspect: 0,
            reallocated_sectors_bad: 0,
            media_errors_suspect: 0,
            percentage_used_suspect: 0,
            percentage_used_bad: 0,
            ..SmartThresholds::default()
        };
        expect(&assess(&ata_with(5, 5000), 0, &off), Health::Good, "healthy");
        expect(
            &assess(&nvme_with(json!({"media_errors": 5, "percentage_used": 250})), 0, &off),
            Health::Good,
            "healthy",
        );
        expect(
            &assess(&nvme_with(json!({"media_errors": 500})), 0, &off),
            Health::Bad,
            "500 media errors (bad at 100)",
        );
    }

    #[test]
    fn exit_status_bits_decide_when_the_json_does_not_say() {
        let t = SmartThresholds::default();
        let drive = |protocol: &str, status: i32| {
            json!({
                "smartctl": {"exit_status": status},
                "device": {"protocol": protocol},
                "smart_status": {"passed": true},
            })
            .to_string()
        };
        let ata = |status| drive("ATA", status);
        let nvme = |status| drive("NVMe", status);
        expect(&assess(&ata(0), 0, &t), Health::Good, "healthy");
        expect(&assess(&ata(4), 0, &t), Health::Good, "healthy");
        expect(&assess(&ata(8), 0, &t), Health::Bad, SELF_ASSESSMENT_FAILED);
        expect(
            &assess(&ata(64), 0, &t),
            Health::Suspect,
            "errors in the drive's error log",
        );
        expect(&assess(&nvme(64), 0, &t), Health::Good, "healthy");
        expect(&assess(&ata(128), 0, &t), Health::Suspect, "failed self-tests");
        expect(&assess(&nvme(128), 0, &t), Health::Suspect, "failed self-tests");
        expect(&assess(&ata(1), 0, &t), Health::Unknown, "did not know how to read this device");
        expect(&assess(&ata(2), 0, &t), Health::Unknown, "could not open the device");
        expect(
            &assess(&ata(256), 0, &t),
            Health::Unknown,
            "did not exit normally (status 256)",
        );
        expect(
            &assess(&ata(-1), 0, &t),
            Health::Unknown,
            "did not exit normally (status -1)",
        );
    }

    #[test]
    fn the_json_exit_status_wins_over_the_process_code_and_the_code_is_used_without_it() {
        let t = SmartThresholds::default();
        expect(
            &assess(&fixture("sata-hdd-healthy.json"), 8, &t),
            Health::Good,
            "healthy",
        );
        let mut doc: Value = serde_json::from_str(&fixture("sata-hdd-healthy.json")).expect("json");
        doc["smartctl"].as_object_mut().expect("smartctl").remove("exit_status");
        expect(&assess(&doc.to_string(), 8, &t), Health::Bad, SELF_ASSESSMENT_FAILED);
        doc["smartctl"]["exit_status"] = json!("eight");
        expect(&assess(&doc.to_string(), 0, &t), Health::Good, "healthy");
    }

    #[test]
    fn a_loop_device_has_no_health_data_in_drivelets_words_and_smartctls_message_only_for_the_log() {
        let text = fixture("loop-unable-to-detect-device-type.json");
        let r = assess_for(&text, 1, "loop", &SmartThresholds::default());
        assert_eq!(r.health, Health::Unknown);
        assert_eq!(r.reason(), "no health data: a loop device reports no SMART");
        assert_eq!(r.tool_messages, vec!["/dev/loop0: Unable to detect device type".to_string()]);
        let virtio = assess_for(&text, 1, "virtio", &SmartThresholds::default());
        assert!(virtio.reason().starts_with("no health data: a virtual disk reports no SMART"), "{}", virtio.reason());
        let usb = assess_for(&text, 1, "usb", &SmartThresholds::default());
        assert_eq!(usb.reason(), "no health data: smartctl cannot read SMART through this USB bridge");
    }

    #[test]
    fn no_reason_of_any_fixture_repeats_what_smartctl_printed() {
        for (file, _, _) in VERDICTS {
            for transport in ["", "loop", "virtio", "usb", "sata", "nvme"] {
                let code: Value = serde_json::from_str(&fixture(file)).expect("json");
                let code = code.pointer("/smartctl/exit_status").and_then(Value::as_i64).unwrap_or(0) as i32;
                let r = assess_for(&fixture(file), code, transport, &SmartThresholds::default());
                for m in &r.tool_messages {
                    assert!(!r.reason().contains(m.as_str()), "{file} ({transport}): {:?} in {:?}", m, r.reason());
                }
            }
        }
    }

    #[test]
    fn smartctls_messages_become_drivelets_sentences() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            ("/dev/loop3: Unable to detect device type", "loop", Some("no health data: a loop device reports no SMART")),
            ("/dev/vdb: Unable to detect device type", "virtio", Some("no health data: a virtual disk reports no SMART")),
            ("/dev/sdc: Unknown USB bridge [0x152d:0x0578 (0x214)]", "usb", Some("through this USB bridge")),
            ("Please specify device type with the -d option.", "", Some("does not recognise this kind of device")),
            ("Smartctl open device: /dev/sda failed: Permission denied", "sata", Some("permission denied")),
            ("Smartctl open device: /dev/sdz failed: No such device", "sata", Some("the device is gone")),
            ("Smartctl open device: /dev/sdb failed: Input/output error", "sata", Some("smartctl could not open the device")),
            ("Device is in STANDBY mode, exit(2)", "sata", Some("asleep (standby)")),
            ("Device is in SLEEP mode, exit(2)", "sata", Some("asleep (standby)")),
            ("Warning: This result is based on an Attribute check.", "sata", None),
        ];
        for (message, transport, want) in cases {
            let got = message_words(message, transport);
            match want {
                Some(part) => {
                    let got = got.unwrap_or_else(|| panic!("no words for {message:?}"));
                    assert!(got.contains(part), "{message:?}: {got:?}");
                    assert!(got.starts_with("no health data: "), "{got:?}");
                }
                None => assert_eq!(got, None, "{message:?}"),
            }
        }
    }

    #[test]
    fn output_that_is_not_json_says_so_in_words_and_keeps_the_parsers_complaint_for_the_log() {
        let r = assess("not json at all", 0, &SmartThresholds::default());
        assert_eq!(r.reason(), "no health data: smartctl printed something that is not JSON");
        assert!(r.tool_messages.iter().any(|m| m.contains("line 1")), "{:?}", r.tool_messages);
    }

    #[test]
    fn a_standby_skip_is_unknown_saying_the_drive_is_asleep() {
        let doc = json!({
            "smartctl": {
                "exit_status": 2,
                "messages": [{"string": "Device is in STANDBY mode, exit(2)", "severity": "information"}],
            },
            "device": {"protocol": "ATA"},
        });
        expect(
            &assess(&doc.to_string(), 2, &SmartThresholds::default()),
            Health::Unknown,
            "no health data: the drive is asleep (standby) and was not woken to be read",
        );
    }

    #[test]
    fn smart_disabled_or_absent_is_unknown_with_the_cause() {
        let t = SmartThresholds::default();
        let disabled = json!({"model_name": "M", "smart_support": {"available": true, "enabled": false}}).to_string();
        expect(
            &assess(&disabled, 0, &t),
            Health::Unknown,
            "SMART is disabled on \"M\": enable it with `smartctl --smart=on`",
        );
        expect(
            &assess("{}", 0, &t),
            Health::Unknown,
            "smartctl read no SMART health data from this device",
        );
        expect(&assess("{}", 4, &t), Health::Unknown, "a SMART command failed");
        // A failing status is believed even without data.
        expect(&assess("{}", 8, &t), Health::Bad, SELF_ASSESSMENT_FAILED);
    }

    #[test]
    fn garbage_input_is_unknown_but_a_failing_process_code_still_counts() {
        let t = SmartThresholds::default();
        for garbage in [
            "",
            "  \n",
            "null",
            "[]",
            "42",
            "\"ok\"",
            "{",
            "{\"smart_status\":",
            "not json at all",
            "\u{0}\u{ffff}",
        ] {
            let r = assess(garbage, 0, &t);
            assert_eq!(r.health, Health::Unknown, "{garbage:?}: {:?}", r.reasons);
            assert!(!r.reasons.is_empty(), "{garbage:?}");
        }
        expect(&assess("", 0, &t), Health::Unknown, "smartctl printed nothing");
        expect(&assess("[1]", 0, &t), Health::Unknown, "JSON drivelet cannot read");
        expect(&assess("{oops", 0, &t), Health::Unknown, "is not JSON");
        expect(&assess("{oops", 8, &t), Health::Bad, SELF_ASSESSMENT_FAILED);
        expect(&assess("{oops", 8, &t), Health::Bad, "is not JSON");
        expect(&assess("{oops", 64, &t), Health::Unknown, "is not JSON");
        expect(&assess("{oops", 2, &t), Health::Unknown, "could not open the device");
        let deep = "[".repeat(100_000);
        expect(&assess(&deep, 0, &t), Health::Unknown, "is not JSON");
    }

    #[test]
    fn ill_typed_fields_are_skipped_and_huge_numbers_saturate() {
        let t = SmartThresholds::default();
        let doc = json!({
            "smartctl": {"exit_status": "0", "messages": "nope"},
            "model_name": 7,
            "serial_number": ["x"],
            "smart_status": {"passed": "false"},
            "temperature": {"current": "hot"},
            "power_on_time": {"hours": -3},
            "ata_smart_attributes": {"table": [
                null, 5, {"id": "5"}, {"id": 5, "raw": {"value": 1e300}}, {"id": 197, "raw": null, "when_failed": 3}
            ]},
            "ata_smart_error_log": {"summary": {"count": -1}},
            "nvme_smart_health_information_log": {"critical_warning": "16", "media_errors": -7},
            "scsi_error_counter_log": {
                "read": [],
                "write": {"total_uncorrected_errors": 18446744073709551615u64},
                "verify": {"total_uncorrected_errors": 1},
            },
        })
        .to_string();
        let r = assess(&doc, 0, &t);
        expect(&r, Health::Bad, "reallocated sectors (suspect at 1, bad at 100)");
        expect(&r, Health::Bad, "18446744073709551615 uncorrected errors");
        assert_eq!(
            (r.model, r.serial, r.figures.temperature_c, r.figures.power_on_hours),
            (None, None, None, None)
        );
    }

    #[test]
    fn truncated_fixtures_never_panic_and_are_unknown() {
        let t = SmartThresholds::default();
        for (file, _, _) in VERDICTS {
            let text = fixture(file);
            let whole = text.trim_end().len();
            // Every prefix in the first 1 KiB and the last 64 bytes, every 97th in between.
            let cuts = (0..=text.len())
                .filter(|&i| i < 1024 || i + 64 > text.len() || i % 97 == 0)
                .filter(|&i| text.is_char_boundary(i));
            for cut in cuts {
                let r = assess(&text[..cut], 0, &t);
                if cut < whole {
                    assert_eq!(r.health, Health::Unknown, "{file} cut at {cut}: {:?}", r.reasons);
                }
            }
        }
    }

    /// Every JSON pointer in `v`.
    fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                for (k, child) in map {
                    pointers(child, format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")), out);
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    pointers(child, format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
        out.push(at);
    }

    #[test]
    fn fixtures_with_any_one_field_replaced_by_a_wrong_type_never_panic() {
        let t = SmartThresholds::default();
        let replacements = [
            Value::Null,
            json!(-1),
            json!(1e300),
            json!(u64::MAX),
            json!("x"),
            json!([]),
            json!({}),
            json!(true),
        ];
        for (file, _, _) in VERDICTS {
            let mut doc: Value = serde_json::from_str(&fixture(file)).expect("fixture is JSON");
            let mut paths = Vec::new();
            pointers(&doc, String::new(), &mut paths);
            for path in paths.iter().filter(|p| !p.is_empty()) {
                for replacement in &replacements {
                    let slot = doc.pointer_mut(path).expect("path exists");
                    let original = std::mem::replace(slot, replacement.clone());
                    let r = assess_value(&doc, 0, "", &t);
                    assert!(
                        r.health == Health::Good || !r.reasons.is_empty(),
                        "{file} {path}: no reason for {r:?}"
                    );
                    *doc.pointer_mut(path).expect("path exists") = original;
                }
            }
        }
    }

    #[test]
    fn thresholds_default_from_an_empty_section_and_reject_unknown_keys() {
        let t: SmartThresholds = serde_json::from_str("{}").expect("empty section");
        assert_eq!(t, SmartThresholds::default());
        let t: SmartThresholds = serde_json::from_str(r#"{"temperature_suspect_c": 55}"#).expect("one key");
        assert_eq!(t.temperature_suspect_c, 55);
        assert_eq!(t.reallocated_sectors_bad, 100);
        assert!(serde_json::from_str::<SmartThresholds>(r#"{"temperature_bad_c": 80}"#).is_err());
    }

    #[test]
    fn health_orders_by_severity_and_serializes_lowercase() {
        assert!(Health::Good < Health::Unknown && Health::Unknown < Health::Suspect && Health::Suspect < Health::Bad);
        assert_eq!(
            serde_json::to_string(&Health::Suspect).expect("serialize"),
            "\"suspect\""
        );
        assert_eq!(
            serde_json::from_str::<Health>("\"bad\"").expect("deserialize"),
            Health::Bad
        );
        assert_eq!(Health::Unknown.to_string(), "unknown");
    }
}
