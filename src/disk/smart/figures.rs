//! The figures a SMART report carries besides its verdict (temperature, wear, sector and
//! error counts, power-on time), read from the same `smartctl --json` output, for the
//! per-drive metrics and the drive's record.
//!
//! Rules: a figure is present only when the drive reported it (never a made-up 0) and
//! only when SMART health data was read at all (a device without SMART reports a
//! temperature of 0, which is no reading); each comes from one documented field, the
//! first that holds a number:
//! - temperature: `temperature.current`, else the NVMe health log's `temperature`;
//! - power-on hours: `power_on_time.hours`, else the NVMe health log's `power_on_hours`;
//! - percentage used: the NVMe health log's `percentage_used`, else SCSI's
//!   `scsi_percentage_used_endurance_indicator` (it can pass 100);
//! - ATA raw values of attributes 5 (reallocated sectors), 197 (pending sectors),
//!   198 (offline uncorrectable sectors) and 199 (UDMA CRC errors);
//! - NVMe `media_errors` (media and data integrity errors).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{count, temperature};

/// What smartctl said in numbers, each absent when the drive did not report it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SmartFigures {
    /// Current temperature, degrees Celsius.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature_c: Option<i64>,
    /// Power-on hours.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power_on_hours: Option<u64>,
    /// Percentage of rated endurance used (NVMe, SCSI); can pass 100.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percentage_used: Option<u64>,
    /// ATA attribute 5 Reallocated_Sector_Ct, raw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reallocated_sectors: Option<u64>,
    /// ATA attribute 197 Current_Pending_Sector, raw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending_sectors: Option<u64>,
    /// ATA attribute 198 Offline_Uncorrectable, raw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uncorrectable_sectors: Option<u64>,
    /// ATA attribute 199 UDMA_CRC_Error_Count, raw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crc_errors: Option<u64>,
    /// NVMe media and data integrity errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub media_errors: Option<u64>,
}

impl SmartFigures {
    /// Whether the drive reported no figure at all.
    pub fn is_empty(&self) -> bool {
        *self == SmartFigures::default()
    }

    /// The figures of parsed smartctl output from which SMART health data was read.
    pub(crate) fn of(root: &Value) -> SmartFigures {
        let nvme = root.get("nvme_smart_health_information_log");
        let ata = |id: u64| {
            root.pointer("/ata_smart_attributes/table")?
                .as_array()?
                .iter()
                .find(|a| count(a.get("id")) == Some(id))
                .and_then(|a| count(a.pointer("/raw/value")))
        };
        SmartFigures {
            temperature_c: temperature(root),
            power_on_hours: count(root.pointer("/power_on_time/hours")).or_else(|| count(nvme.and_then(|l| l.get("power_on_hours")))),
            percentage_used: count(nvme.and_then(|l| l.get("percentage_used")))
                .or_else(|| count(root.get("scsi_percentage_used_endurance_indicator"))),
            reallocated_sectors: ata(5),
            pending_sectors: ata(197),
            uncorrectable_sectors: ata(198),
            crc_errors: ata(199),
            media_errors: count(nvme.and_then(|l| l.get("media_errors"))),
        }
    }
}
