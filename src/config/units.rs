//! Sizes and durations as people write them in the config (`10GiB`, `500M`, `30s`) and
//! as drivelet shows them (`1.9 GiB`).

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// Bytes in binary units, e.g. `1.9 GiB`: how sizes are shown to people (`ctl`, `csi`,
/// Drive objects).
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// A duration as the config writes it, e.g. `30s`, `1.5s`, `250ms`, `5m`: how
/// durations are shown to people (never Rust's `Debug` form).
pub fn human_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms % 60_000 == 0 {
        format!("{}m", ms / 60_000)
    } else if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// Parses a size: a whole number with an optional unit. `K`, `M`, `G`, `T` (and `KB`...)
/// are powers of 1000; `Ki`, `Mi`, `Gi`, `Ti` (and `KiB`...) are powers of 1024.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("\"{s}\" is not a size; write e.g. \"10GiB\", \"500M\" or \"1073741824\""));
    }
    let n: u64 = num.parse().map_err(|_| format!("\"{s}\": number too large"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KB" | "k" | "kB" => 1000,
        "M" | "MB" => 1000u64.pow(2),
        "G" | "GB" => 1000u64.pow(3),
        "T" | "TB" => 1000u64.pow(4),
        "Ki" | "KiB" => 1 << 10,
        "Mi" | "MiB" => 1 << 20,
        "Gi" | "GiB" => 1 << 30,
        "Ti" | "TiB" => 1 << 40,
        other => {
            return Err(format!(
                "\"{s}\": unknown unit \"{other}\"; use one of K, M, G, T (powers of 1000) or Ki, Mi, Gi, Ti (powers of 1024)"
            ))
        }
    };
    n.checked_mul(mult).ok_or_else(|| format!("\"{s}\": size too large"))
}

/// Parses a duration: a whole number followed by `ms`, `s`, `m` or `h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("\"{s}\" is not a duration; write e.g. \"30s\", \"5m\" or \"500ms\""))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(format!("\"{s}\": unit must be ms, s, m or h")),
    };
    Ok(d)
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeRepr {
    Int(u64),
    Str(String),
}

pub(super) fn de_size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match SizeRepr::deserialize(d)? {
        SizeRepr::Int(n) => Ok(n),
        SizeRepr::Str(s) => parse_size(&s).map_err(serde::de::Error::custom),
    }
}

pub(super) fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    parse_duration(&s).map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_shown_as_the_config_writes_them() {
        for (ms, words) in [(250, "250ms"), (30_000, "30s"), (1_500, "1.5s"), (300_000, "5m"), (90_000, "90s")] {
            assert_eq!(human_duration(Duration::from_millis(ms)), words);
        }
    }
}
