//! The volume side of snapshots: [`SnapshotBackend`], what the snapshot controller asks
//! of the volume manager, implemented for the VolumeManager handle of a running agent
//! ([`ManagerBackend`], asked by message: `GetVolume`, `ListSnapshots`,
//! `CreateSnapshot`, `DeleteSnapshot`).
//!
//! Rules:
//! - How a refusal counts (retry soon and say nothing, or record it; whether the call
//!   may still be under way) is decided from the volume manager's error variant
//!   ([`failure_of`]), never from its words.

use std::collections::BTreeMap;
use std::future::Future;

use crate::k8s::shell::Ready;
use crate::k8s::KubeError;
pub(crate) use crate::k8s::volume_manager::ManagerBackend;

/// A snapshot this node holds, as the snapshotter reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SnapshotInfo {
    /// The CSI snapshot id (`status.snapshotHandle`).
    pub id: String,
    /// The CSI name it was taken under.
    pub name: String,
    /// The source volume's CSI id.
    pub source_volume_id: String,
    /// Bytes: the source volume's size (`status.restoreSize`).
    pub restore_size: u64,
    /// When it was cut, in nanoseconds since the Unix epoch (`status.creationTime`).
    pub created_unix_nanos: i64,
    /// Whether a volume can be restored from it (`status.readyToUse`).
    pub ready: bool,
    /// How long the source filesystem was frozen for the copy, when it was.
    pub freeze_millis: Option<u64>,
}

/// How a CreateSnapshot or DeleteSnapshot failed, for the content and the retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Another call holds the volume or the snapshot: retry soon, record nothing.
    Busy,
    /// The answer is final (the call did nothing, or failed for good): record it, and a
    /// CreateSnapshot is no longer under way.
    Final,
    /// The call may still be under way or may pass by itself (no room now, the volume
    /// manager restarting): record it, retry with backoff.
    Transient,
}

/// The volume side of snapshots; nothing runs before it is [`Ready`].
pub(crate) trait SnapshotBackend: Ready + Clone + Unpin + 'static {
    /// Whether this node holds the volume; `Err` when it cannot tell now.
    fn holds_volume(&self, volume_id: &str) -> impl Future<Output = Result<bool, KubeError>> + Send;
    /// Every snapshot this node holds.
    fn snapshots(&self) -> impl Future<Output = Result<Vec<SnapshotInfo>, KubeError>> + Send;
    /// CreateSnapshot (idempotent by name): the snapshot, or how it failed and why.
    fn create(
        &self,
        name: &str,
        source_volume_id: &str,
        parameters: &BTreeMap<String, String>,
    ) -> impl Future<Output = Result<SnapshotInfo, (Failure, KubeError)>> + Send;
    /// DeleteSnapshot (an unknown id is gone already: `Ok`).
    fn delete(&self, snapshot_id: &str) -> impl Future<Output = Result<(), (Failure, KubeError)>> + Send;
}
