//! A drive's media class (hdd, ssd, nvme, virtual): how config, StorageClass parameters,
//! placement and output name it.

use serde::{Deserialize, Serialize};

/// Media classes of a drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Media {
    /// Rotating disk.
    Hdd,
    /// SATA/SAS solid-state disk.
    Ssd,
    /// NVMe namespace.
    Nvme,
    /// Loop, virtio and other virtual disks.
    Virtual,
}

impl Media {
    /// The lower-case name used in config, parameters and output.
    pub fn as_str(self) -> &'static str {
        match self {
            Media::Hdd => "hdd",
            Media::Ssd => "ssd",
            Media::Nvme => "nvme",
            Media::Virtual => "virtual",
        }
    }

    /// Parses a media name as written in config or StorageClass parameters.
    pub fn parse(s: &str) -> Option<Media> {
        match s {
            "hdd" => Some(Media::Hdd),
            "ssd" => Some(Media::Ssd),
            "nvme" => Some(Media::Nvme),
            "virtual" => Some(Media::Virtual),
            _ => None,
        }
    }
}
