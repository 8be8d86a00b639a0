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

use crate::actors::volumes::snapshot::SnapshotRecord;
use crate::actors::volumes::{CreateSnapshot, DeleteSnapshot, GetVolume, ListSnapshots, VolumeError};
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

impl From<SnapshotRecord> for SnapshotInfo {
    fn from(r: SnapshotRecord) -> Self {
        let ready = r.is_ready();
        SnapshotInfo {
            id: r.id,
            name: r.name,
            source_volume_id: r.source_volume_id,
            restore_size: r.restore_size,
            created_unix_nanos: r.created_unix_nanos,
            ready,
            freeze_millis: r.freeze_millis,
        }
    }
}

/// How a CreateSnapshot or DeleteSnapshot refusal counts (see the module rules): busy
/// as the CSI ABORTED, transient as the codes the sidecar takes for "may still be under
/// way" (RESOURCE_EXHAUSTED, UNAVAILABLE), every other one final.
pub(crate) fn failure_of(e: &VolumeError) -> Failure {
    match e {
        VolumeError::Busy { .. } => Failure::Busy,
        VolumeError::ResourceExhausted { .. } | VolumeError::NotReady => Failure::Transient,
        _ => Failure::Final,
    }
}

impl SnapshotBackend for ManagerBackend {
    async fn holds_volume(&self, volume_id: &str) -> Result<bool, KubeError> {
        match self.volumes().send(GetVolume { volume_id: volume_id.to_string() }).await {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(VolumeError::NotFound { .. })) => Ok(false),
            Ok(Err(e)) => Err(KubeError::volume(volume_id)(e)),
            Err(e) => Err(KubeError::unanswered(volume_id)(e)),
        }
    }

    async fn snapshots(&self) -> Result<Vec<SnapshotInfo>, KubeError> {
        match self.volumes().send(ListSnapshots).await {
            Ok(Ok(list)) => Ok(list.into_iter().map(SnapshotInfo::from).collect()),
            Ok(Err(e)) => Err(KubeError::volume("")(e)),
            Err(e) => Err(KubeError::unanswered("")(e)),
        }
    }

    async fn create(&self, name: &str, source_volume_id: &str, parameters: &BTreeMap<String, String>) -> Result<SnapshotInfo, (Failure, KubeError)> {
        let m = CreateSnapshot { name: name.to_string(), source_volume_id: source_volume_id.to_string(), parameters: parameters.clone() };
        match self.volumes().send(m).await {
            Ok(Ok(record)) => Ok(record.into()),
            Ok(Err(e)) => Err((failure_of(&e), KubeError::volume(source_volume_id)(e))),
            Err(e) => Err((Failure::Transient, KubeError::unanswered(source_volume_id)(e))),
        }
    }

    async fn delete(&self, snapshot_id: &str) -> Result<(), (Failure, KubeError)> {
        match self.volumes().send(DeleteSnapshot { snapshot_id: snapshot_id.to_string() }).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err((failure_of(&e), KubeError::volume(snapshot_id)(e))),
            Err(e) => Err((Failure::Transient, KubeError::unanswered(snapshot_id)(e))),
        }
    }
}
