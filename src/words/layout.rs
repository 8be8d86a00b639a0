//! The layout of a volume on its drive: a partition carved from free space, or a whole
//! drive.

use serde::{Deserialize, Serialize};

/// Which kind of volume a capacity question is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayoutKind {
    /// A partition carved from free space.
    Partition,
    /// A whole blank drive.
    Drive,
}
