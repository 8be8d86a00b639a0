//! Where a drive is, for the blocking disk steps: its device node and logical block size.

use std::path::PathBuf;

/// Where a volume's drive is, for the blocking steps.
#[derive(Debug, Clone)]
pub struct DriveLoc {
    /// Kernel device node of the whole drive.
    pub path: PathBuf,
    /// Logical block size.
    pub sector: u64,
}
