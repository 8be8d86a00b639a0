//! The `snapshot.storage.k8s.io/v1` objects the snapshotter reads and writes, as the
//! snapshot CRDs define them: [`VolumeSnapshotContent`] (cluster-scoped, with a status
//! subresource) and [`VolumeSnapshotClass`] (cluster-scoped, no spec: driver, parameters
//! and deletion policy sit at the top level).
//!
//! Rules:
//! - Only the fields the snapshotter reads or writes are typed; everything else is left
//!   to the API server (patches name only what they change).
//! - The CRDs are the cluster's, installed with the snapshot-controller: no schema is
//!   generated here.
//! - `status.creationTime` is nanoseconds since the Unix epoch and `status.restoreSize`
//!   bytes, both int64, as the CRD says.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::core::ClusterResourceScope;
use kube::{CustomResource, Resource};
use serde::{Deserialize, Serialize};

/// The API group of the snapshot objects.
pub(crate) const GROUP: &str = "snapshot.storage.k8s.io";
/// Their version.
pub(crate) const VERSION: &str = "v1";

/// The spec of a VolumeSnapshotContent: what it is a snapshot of and who handles it.
#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "snapshot.storage.k8s.io",
    version = "v1",
    kind = "VolumeSnapshotContent",
    plural = "volumesnapshotcontents",
    status = "VolumeSnapshotContentStatus",
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub(crate) struct VolumeSnapshotContentSpec {
    /// The VolumeSnapshot this content is bound to (its uid names the CSI snapshot).
    #[serde(default)]
    pub volume_snapshot_ref: ObjectReference,
    /// `Delete` or `Retain`: whether deleting the content deletes the snapshot.
    #[serde(default)]
    pub deletion_policy: String,
    /// The CSI driver that handles it.
    #[serde(default)]
    pub driver: String,
    /// The VolumeSnapshotClass whose parameters a new snapshot is taken with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
    /// The volume to snapshot, or the snapshot that already exists.
    #[serde(default)]
    pub source: ContentSource,
    /// `Filesystem` or `Block`: the source volume's mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_volume_mode: Option<String>,
}

/// Exactly one of the two: a volume to snapshot (dynamic), or an existing snapshot
/// (pre-provisioned).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ContentSource {
    /// The CSI volume id to snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_handle: Option<String>,
    /// The CSI snapshot id of a pre-provisioned snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_handle: Option<String>,
}

/// What the snapshotter reports about the snapshot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct VolumeSnapshotContentStatus {
    /// The CSI snapshot id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_handle: Option<String>,
    /// When the snapshot was cut, in nanoseconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<i64>,
    /// The least size of a volume restored from it, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<i64>,
    /// Whether a volume can be restored from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    /// The last error taking it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<VolumeSnapshotError>,
    /// Set for a member of a group snapshot (not handled here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_group_snapshot_handle: Option<String>,
}

/// `status.error`: when and what.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct VolumeSnapshotError {
    /// When it happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
    /// What happened, in plain words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A VolumeSnapshotClass: the driver it is for, the parameters a snapshot is taken with,
/// and the deletion policy the snapshot-controller copies into each content.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct VolumeSnapshotClass {
    /// Name and the rest.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The CSI driver.
    #[serde(default)]
    pub driver: String,
    /// Handed to CreateSnapshot, `csi.storage.k8s.io/` keys removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<BTreeMap<String, String>>,
    /// `Delete` or `Retain`.
    #[serde(default)]
    pub deletion_policy: String,
}

impl Resource for VolumeSnapshotClass {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "VolumeSnapshotClass".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "volumesnapshotclasses".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}
