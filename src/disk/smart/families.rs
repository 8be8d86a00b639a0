//! The findings of each drive family's SMART data (ATA attributes, error log and
//! self-test log; the NVMe health log; SCSI error counters and grown defects) against
//! the thresholds, in the order and by the rules of [`super`].

use super::*;

/// ATA attributes 5, 197 and 198 against the thresholds, and every attribute's
/// `when_failed`. Returns whether any attribute is failing now, and whether any failed
/// in the past.
pub(super) fn ata_attributes(root: &Value, t: &SmartThresholds, findings: &mut Findings) -> (bool, bool) {
    let Some(table) = root.pointer("/ata_smart_attributes/table").and_then(Value::as_array) else {
        return (false, false);
    };
    let (mut now, mut past) = (false, false);
    for attr in table {
        let Some(id) = count(attr.get("id")) else { continue };
        let name = attr.get("name").and_then(Value::as_str).unwrap_or("Unknown_Attribute");
        let raw = count(attr.pointer("/raw/value"));
        match (id, raw) {
            (5, Some(n)) => by_count(
                findings,
                n,
                ("reallocated sector", "reallocated sectors"),
                t.reallocated_sectors_suspect,
                t.reallocated_sectors_bad,
            ),
            (197, Some(n)) => by_count(
                findings,
                n,
                ("pending sector", "pending sectors"),
                t.pending_sectors_suspect,
                t.pending_sectors_bad,
            ),
            (198, Some(n)) => by_count(
                findings,
                n,
                ("offline uncorrectable sector", "offline uncorrectable sectors"),
                t.uncorrectable_suspect,
                0,
            ),
            _ => {}
        }
        let value = |key: &str| count(attr.get(key)).map_or_else(|| "?".to_string(), |v| v.to_string());
        match attr.get("when_failed").and_then(Value::as_str).map(str::trim) {
            Some("now") => {
                now = true;
                findings.add(
                    Health::Bad,
                    format!(
                        "attribute {id} {name} is failing now (value {} at or below threshold {}): \
                         back up and replace the drive",
                        value("value"),
                        value("thresh")
                    ),
                );
            }
            Some("past") => {
                past = true;
                findings.add(
                    Health::Suspect,
                    format!(
                        "attribute {id} {name} failed in the past (worst {} at or below threshold {}): watch the drive",
                        value("worst"),
                        value("thresh")
                    ),
                );
            }
            _ => {}
        }
    }
    (now, past)
}

/// A non-zero ATA error log count is Suspect. Returns whether it was, so that exit
/// status bit 6 is not reported twice.
pub(super) fn ata_error_log(root: &Value, findings: &mut Findings) -> bool {
    let Some(log) = ["/ata_smart_error_log/extended", "/ata_smart_error_log/summary"]
        .iter()
        .find_map(|p| root.pointer(p).filter(|l| l.get("count").is_some_and(Value::is_number)))
    else {
        return false;
    };
    let n = count(log.get("count")).unwrap_or(0);
    if n > 0 {
        let latest = log
            .pointer("/table/0/error_description")
            .and_then(Value::as_str)
            .map(str::trim);
        let mut reason = format!("{n} {} in the ATA error log", plural(n, "error", "errors"));
        if let Some(desc) = latest.filter(|d| !d.is_empty()) {
            reason.push_str(&format!(" (latest: {desc})"));
        }
        reason.push_str(match latest.is_some_and(|d| d.contains("ICRC")) {
            true => ": interface CRC errors point to the cable, backplane or port; check them and watch the count",
            false => ": read them with `smartctl -l error` and watch the count",
        });
        findings.add(Health::Suspect, reason);
    }
    n > 0
}

/// ATA self-tests that failed and are not outdated by a newer passing extended test are
/// Suspect. Returns whether any were, so that exit status bit 7 is not reported twice.
pub(super) fn ata_self_test_log(root: &Value, findings: &mut Findings) -> bool {
    let Some(log) = ["/ata_smart_self_test_log/extended", "/ata_smart_self_test_log/standard"]
        .iter()
        .find_map(|p| {
            root.pointer(p)
                .filter(|l| l.get("error_count_total").is_some_and(Value::is_number))
        })
    else {
        return false;
    };
    let failed = count(log.get("error_count_total"))
        .unwrap_or(0)
        .saturating_sub(count(log.get("error_count_outdated")).unwrap_or(0));
    if failed == 0 {
        return false;
    }
    let latest = log.get("table").and_then(Value::as_array).and_then(|tests| {
        tests
            .iter()
            .find(|test| test.pointer("/status/passed").and_then(Value::as_bool) == Some(false))
    });
    let mut reason = format!(
        "{failed} failed {} in the self-test log",
        plural(failed, "self-test", "self-tests")
    );
    if let Some(test) = latest {
        let kind = test
            .pointer("/type/string")
            .and_then(Value::as_str)
            .unwrap_or("self-test");
        let result = test
            .pointer("/status/string")
            .and_then(Value::as_str)
            .unwrap_or("failed");
        reason.push_str(&format!(" (latest: {kind}, {result}"));
        if let Some(lba) = count(test.get("lba")) {
            reason.push_str(&format!(" at LBA {lba}"));
        }
        reason.push(')');
    }
    reason.push_str(": plan a replacement");
    findings.add(Health::Suspect, reason);
    true
}

/// The NVMe SMART/health log: critical warning bits, media errors, endurance used.
/// `num_err_log_entries` is informational and not a finding.
pub(super) fn nvme(root: &Value, t: &SmartThresholds, findings: &mut Findings) {
    let log = root.get("nvme_smart_health_information_log");
    let warning = count(log.and_then(|l| l.get("critical_warning")))
        .or_else(|| count(root.pointer("/smart_status/nvme/value")))
        .unwrap_or(0);
    if warning != 0 {
        const BITS: [&str; 6] = [
            "available spare is below its threshold",
            "temperature is outside the drive's limits",
            "NVM subsystem reliability is degraded",
            "media is read-only",
            "volatile memory backup device has failed",
            "persistent memory region is unreliable",
        ];
        let mut what: Vec<String> = BITS
            .iter()
            .enumerate()
            .filter(|(bit, _)| warning & (1 << bit) != 0)
            .map(|(_, s)| s.to_string())
            .collect();
        if warning >> BITS.len() != 0 {
            what.push(format!("reserved bits {:#x}", warning & !0x3f));
        }
        findings.add(
            Health::Bad,
            format!("NVMe critical warning {warning:#04x}: {}", what.join(", ")),
        );
    }
    let Some(log) = log else { return };
    if let Some(n) = count(log.get("media_errors")) {
        by_count(
            findings,
            n,
            ("media error", "media errors"),
            t.media_errors_suspect,
            t.media_errors_bad,
        );
    }
    if let Some(used) = count(log.get("percentage_used")) {
        endurance(findings, used, t);
    }
}

/// SCSI grown defects, uncorrected errors and endurance used.
pub(super) fn scsi(root: &Value, t: &SmartThresholds, findings: &mut Findings) {
    if let Some(n) = count(root.get("scsi_grown_defect_list")) {
        by_count(
            findings,
            n,
            (
                "grown defect in the SCSI defect list",
                "grown defects in the SCSI defect list",
            ),
            t.grown_defects_suspect,
            t.grown_defects_bad,
        );
    }
    if let Some(log) = root.get("scsi_error_counter_log").and_then(Value::as_object) {
        let per_kind: Vec<(&str, u64)> = ["read", "write", "verify"]
            .into_iter()
            .filter_map(|kind| Some((kind, count(log.get(kind)?.get("total_uncorrected_errors"))?)))
            .filter(|(_, n)| *n > 0)
            .collect();
        let total = per_kind.iter().fold(0u64, |sum, (_, n)| sum.saturating_add(*n));
        if total > 0 {
            let detail: Vec<String> = per_kind.iter().map(|(kind, n)| format!("{kind} {n}")).collect();
            findings.add(
                Health::Suspect,
                format!(
                    "{total} uncorrected {} in the SCSI error counter log ({}): watch the drive",
                    plural(total, "error", "errors"),
                    detail.join(", ")
                ),
            );
        }
    }
    if let Some(used) = count(root.get("scsi_percentage_used_endurance_indicator")) {
        endurance(findings, used, t);
    }
}

/// Percentage of rated endurance used against its thresholds.
fn endurance(findings: &mut Findings, used: u64, t: &SmartThresholds) {
    let (suspect, bad) = (u64::from(t.percentage_used_suspect), u64::from(t.percentage_used_bad));
    let Some(health) = level(used, suspect, bad) else {
        return;
    };
    findings.add(
        health,
        format!(
            "{used}% of rated endurance used ({}): plan a replacement",
            limits(suspect, bad, "%")
        ),
    );
}

/// A count against its suspect and bad thresholds (0 = off), worded as
/// "12 reallocated sectors (suspect at 1, bad at 100): watch the drive and plan a replacement".
fn by_count(findings: &mut Findings, n: u64, noun: (&str, &str), suspect: u64, bad: u64) {
    if let Some(health) = level(n, suspect, bad) {
        let advice = match health {
            Health::Bad => "back up and replace the drive",
            _ => "watch the drive and plan a replacement",
        };
        findings.add(
            health,
            format!(
                "{n} {} ({}): {advice}",
                plural(n, noun.0, noun.1),
                limits(suspect, bad, "")
            ),
        );
    }
}

/// The health a count earns, if any: Bad at or above `bad`, Suspect at or above
/// `suspect`; a threshold of 0 is off.
fn level(n: u64, suspect: u64, bad: u64) -> Option<Health> {
    if bad > 0 && n >= bad {
        Some(Health::Bad)
    } else if suspect > 0 && n >= suspect {
        Some(Health::Suspect)
    } else {
        None
    }
}

/// "suspect at 1, bad at 100", leaving out thresholds that are off.
fn limits(suspect: u64, bad: u64, unit: &str) -> String {
    let mut parts = Vec::new();
    if suspect > 0 {
        parts.push(format!("suspect at {suspect}{unit}"));
    }
    if bad > 0 {
        parts.push(format!("bad at {bad}{unit}"));
    }
    parts.join(", ")
}

fn plural<'a>(n: u64, one: &'a str, many: &'a str) -> &'a str {
    if n == 1 {
        one
    } else {
        many
    }
}
