//! A drive's health verdict (good, unknown, suspect, bad), ordered by severity so the
//! worst of several is their maximum: what SMART judges and what conditions, usage and
//! output read.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A drive's health, ordered by severity so the worst of several is their maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// SMART data was read and nothing is wrong.
    Good,
    /// No SMART data: a virtual, loop or RAID virtual disk, or smartctl could not open it.
    Unknown,
    /// Early signs of trouble: watch the drive, plan a replacement.
    Suspect,
    /// Failing: back up and replace the drive.
    Bad,
}

impl Health {
    /// The lowercase name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Good => "good",
            Health::Unknown => "unknown",
            Health::Suspect => "suspect",
            Health::Bad => "bad",
        }
    }
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
