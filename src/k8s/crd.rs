//! The cluster-scoped `Drive` custom resource (`drives.drivelet.io`, v1alpha1): one object
//! per disk a node's agent sees, managed or not, so `kubectl get drives` is a cluster-wide
//! inventory.
//!
//! Rules:
//! - The Rust types are the source of truth; `deploy/crd-drive.yaml` is generated from
//!   them by `crd_yaml` and a test fails when the file and the types disagree
//!   (`DRIVELET_WRITE_CRD=1 cargo test --lib k8s::crd` rewrites it).
//! - The wire names of class, health and usage are the lowercase names drivelet prints
//!   elsewhere (`ctl drives`), so the two views read the same.
//! - Spec holds what identifies the hardware (it never changes for one disk), written by
//!   the node's agent, and `spec.action`, the admin's intent (`none`, `cordon`,
//!   `release`, `evacuate`, `adopt`, with `spec.restoreClaims` for an adoption), written
//!   only by the admin (`kubectl drivelet drive ...` or a patch): the agent's server-side
//!   apply never names them, so it never owns or overwrites them.
//!   Status holds what drivelet concluded about the disk and how far the action is
//!   (the `ActionComplete` condition), and may change on every rescan or health probe.
//! - What an admin needs at a glance is a printed column: whether the node still sees
//!   the disk (`status.presence`, always set) and its size in binary units
//!   (`spec.size`, as `ctl drives` prints it; `spec.sizeBytes` stays the exact figure).

#[cfg(test)]
use kube::core::CustomResourceExt;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What identifies one disk on one node.
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "drivelet.io",
    version = "v1alpha1",
    kind = "Drive",
    plural = "drives",
    shortname = "drv",
    status = "DriveStatus",
    derive = "PartialEq",
    doc = "A disk seen by drivelet on one node, with its classification, health and usage.",
    printcolumn(name = "NODE", type_ = "string", json_path = ".spec.node"),
    printcolumn(
        name = "PRESENCE",
        type_ = "string",
        json_path = ".status.presence",
        description = "present, or missing: the node no longer sees the disk but volumes live on it"
    ),
    printcolumn(name = "MEDIA", type_ = "string", json_path = ".spec.media"),
    printcolumn(name = "SIZE", type_ = "string", json_path = ".spec.size", description = "Size in binary units"),
    printcolumn(name = "CLASS", type_ = "string", json_path = ".status.class"),
    printcolumn(name = "HEALTH", type_ = "string", json_path = ".status.health"),
    printcolumn(name = "USAGE", type_ = "string", json_path = ".status.usage"),
    printcolumn(name = "ACTION", type_ = "string", json_path = ".spec.action", description = "What an admin asked of the drive"),
    printcolumn(name = "AGE", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
// Every printcolumn repeats `type_`, which clippy takes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
pub(crate) struct DriveSpec {
    /// The node the disk is attached to.
    pub node: String,
    /// drivelet's stable id of the disk (from its WWN, serial or udev path), as volumes
    /// and `ctl drives` name it.
    pub drive_id: String,
    /// The disk's serial number, when it reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// The disk's World Wide Name, when it reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wwn: Option<String>,
    /// The disk's model string, when it reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Size of the whole disk in bytes.
    pub size_bytes: u64,
    /// The size in binary units, e.g. `2.0 GiB` (absent when the size is not known: a
    /// disk missing since before its object was made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    /// Media: `hdd`, `ssd`, `nvme` or `virtual`.
    pub media: String,
    /// What an admin asks of the drive (the one field of the spec an admin writes; the
    /// agent acts on it and reports in `status.conditions`): `none` (active, or lift a
    /// cordon), `cordon` (no new volumes; its volumes stay), `release` (no new volumes;
    /// released, so it may be pulled, once its volumes are deleted), `evacuate` (no new
    /// volumes; its volumes move to other drives of the node, keeping their ids, and it
    /// is released once they have: `status.evacuation` says where each stands), `adopt`
    /// (a drive owned elsewhere becomes this node's: its note names this node, its
    /// volumes are served here and their PVs are pinned to this node, bound to the same
    /// claims).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<DriveAction>,
    /// With `action: adopt`: a volume whose PV and claim are both gone (a rebuilt
    /// cluster) gets its claim back (namespace, name, size and class from the disk's
    /// note) and a PV bound to it. Without it such a volume is kept and listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_claims: Option<bool>,
}

impl DriveSpec {
    /// The spec as the node's agent writes it: the hardware alone, without the admin's
    /// action (nor its `restoreClaims`).
    pub(crate) fn hardware(&self) -> DriveSpec {
        DriveSpec { action: None, restore_claims: None, ..self.clone() }
    }
}

/// What an admin asks of a drive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum DriveAction {
    /// Nothing: the drive is active (a cordon is lifted; a release is not undone).
    #[default]
    None,
    /// Take no new volumes; the volumes on it stay and are served.
    Cordon,
    /// Take no new volumes; released (may be pulled) once its volumes are deleted.
    Release,
    /// Take no new volumes; move its volumes to other drives of the node (same ids, so
    /// claims and pods need no change); released once it holds none.
    Evacuate,
    /// Make a drive owned elsewhere this node's: its volumes are served here and their
    /// claims re-homed to this node.
    Adopt,
}

impl DriveAction {
    /// The word an admin writes.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DriveAction::None => "none",
            DriveAction::Cordon => "cordon",
            DriveAction::Release => "release",
            DriveAction::Evacuate => "evacuate",
            DriveAction::Adopt => "adopt",
        }
    }
}

/// A condition of a Drive, as Kubernetes conditions read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DriveCondition {
    /// The condition: `ActionComplete` (the spec's action is carried out).
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// One word: `Cordoned`, `Active`, `Releasing`, `Released`, `Refused`, `Evacuating`,
    /// `Evacuated`, `EvacuationFailed`, `Adopting`, `Adopted`.
    pub reason: String,
    /// What it means, in plain words.
    pub message: String,
    /// The object generation (spec) the condition is about.
    #[serde(default)]
    pub observed_generation: i64,
    /// When the status last changed (RFC 3339).
    pub last_transition_time: String,
}

/// One volume on a drive, as the plugin and `ctl volumes` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DriveVolume {
    /// The volume id (the PV's volume handle).
    pub id: String,
    /// The name it was created with (the PV's name).
    pub name: String,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// Bytes its filesystem uses, when it is staged (absent otherwise: block volumes
    /// and volumes no pod uses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    /// `block`, or its filesystem.
    pub kind: String,
    /// Its state: `available`, `staged`, `published`, ..., or `lost`.
    pub state: String,
    /// `normal` or `abnormal`.
    pub health: String,
    /// Why it is abnormal, in plain words (absent when normal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_reason: Option<String>,
    /// The pods of this node that use it, `namespace/name` (pods not finished whose
    /// claim is bound to the volume's PV), sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<String>,
}

/// Where one volume of a drive being evacuated stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EvacuationVolume {
    /// The volume (or snapshot) id, unchanged by the move.
    pub volume: String,
    /// Its name (the PV's).
    pub name: String,
    /// `moved`, `moving`, `queued`, `waiting` (a pod uses it: it moves once unstaged) or
    /// `failed` (asking for the evacuation again retries it).
    pub state: String,
    /// Where it went, or why it waits or failed, in plain words.
    pub reason: String,
}

/// Whose a drive owned elsewhere is, and what it holds, as its note says.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DriveOwnerStatus {
    /// The owner in plain words: "node node-2 of this cluster", "node node-2 of another
    /// cluster (ID)", or why nobody can be told.
    pub words: String,
    /// The id of the cluster its note names (absent when the note cannot be read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The node its note names (absent when the note cannot be read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Whether that cluster is this one.
    pub this_cluster: bool,
    /// The volumes its note lists.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<HeldVolumeStatus>,
}

/// A volume of a drive owned elsewhere, as its note tells.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct HeldVolumeStatus {
    /// The volume id (the PV's volume handle).
    pub id: String,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// The claim it serves, `namespace/name`, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    /// The PV's name, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pv: Option<String>,
}

/// What drivelet concluded about the disk.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DriveStatus {
    /// What drivelet may do with the disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<DriveClass>,
    /// Why it has that class, in plain words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_reason: Option<String>,
    /// Whose the disk is and what it holds, for a disk owned elsewhere (absent for any
    /// other class).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<DriveOwnerStatus>,
    /// The disk's health.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<DriveHealth>,
    /// Why it has that health, in plain words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_reason: Option<String>,
    /// Whether the disk takes new volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<DriveUsage>,
    /// Why it is releasing or released, in plain words (absent while active).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_reason: Option<String>,
    /// Whether the node sees the disk: `present`, or `missing` (pulled or dead while
    /// volumes still live on it; the health reason says what to do). Always set.
    #[serde(default)]
    pub presence: DrivePresence,
    /// The same as presence `missing`, kept for readers of earlier versions. Absent while
    /// the disk is present.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub missing: bool,
    /// Ids of the volumes on the disk.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<String>,
    /// The volumes on the disk with their size, used bytes, state and health.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_details: Vec<DriveVolume>,
    /// Bytes of the disk no volume holds, as `ctl drives` counts them (managed disks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_bytes: Option<u64>,
    /// Partition-table slots of the disk free for new volumes, as `ctl drives` counts
    /// them (managed disks): a volume takes one whatever its size, so a disk with none
    /// takes no new volume however many bytes are free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_slots: Option<u32>,
    /// Where each volume stands while the drive is evacuated (`spec.action: evacuate`):
    /// those still on it, and those moved off it since the node's agent last started.
    /// Absent when no evacuation was asked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evacuation: Vec<EvacuationVolume>,
    /// How far the action of `spec.action` is (`ActionComplete`), once an admin asked one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<DriveCondition>,
    /// Ids of the snapshots on the disk (CSI snapshot ids: a VolumeSnapshotContent's
    /// snapshotHandle).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<String>,
    /// Space freed on the disk that is still being zeroed before another volume may
    /// take it (not counted as capacity until then), and how far that is, in plain
    /// words: "512.0 MiB being cleaned (40% done)". Absent when nothing is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleaning: Option<String>,
}

/// Whether the node sees a disk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum DrivePresence {
    /// The node sees the disk.
    #[default]
    Present,
    /// The node no longer sees the disk, but volumes still live on it.
    Missing,
}

/// What drivelet may do with a disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum DriveClass {
    /// Blank or carrying a drivelet GPT: drivelet may write to it.
    Managed,
    /// Backs the running system; never touched.
    System,
    /// Holds data or structures drivelet did not create; never touched.
    Foreign,
    /// Ruled out by configuration.
    Excluded,
    /// A drivelet disk of another node or cluster, or whose owner cannot be read:
    /// never written, placed on, cleaned or served until an admin adopts it.
    #[serde(rename = "owned-elsewhere")]
    OwnedElsewhere,
}

/// A disk's health, from SMART.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum DriveHealth {
    /// SMART data was read and nothing is wrong.
    Good,
    /// No SMART data (virtual disk, or smartctl could not open it).
    Unknown,
    /// Early signs of trouble: plan a replacement.
    Suspect,
    /// Failing: replace the disk.
    Bad,
}

/// Whether a disk takes new volumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum DriveUsage {
    /// Takes new volumes.
    Active,
    /// Takes no new volumes because an admin cordoned it; its volumes stay.
    Cordoned,
    /// Takes no new volumes; its volumes are asked to move.
    Releasing,
    /// Holds no live volume; may be pulled.
    Released,
}

#[cfg(test)]
/// The CustomResourceDefinition of `Drive` as YAML, as written to `deploy/crd-drive.yaml`.
pub(crate) fn crd_yaml() -> Result<String, serde_norway::Error> {
    let body = serde_norway::to_string(&Drive::crd())?;
    Ok(format!(
        "# Generated from src/k8s/crd.rs; do not edit. Regenerate with:\n\
         #   DRIVELET_WRITE_CRD=1 cargo test --lib k8s::crd\n{body}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const CRD_FILE: &str = "deploy/crd-drive.yaml";

    #[test]
    fn deployed_crd_matches_the_rust_types() {
        let want = crd_yaml().expect("CRD serializes");
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(CRD_FILE);
        if std::env::var_os("DRIVELET_WRITE_CRD").is_some() {
            std::fs::write(&path, &want).expect("write the CRD file");
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "{CRD_FILE} is out of date with src/k8s/crd.rs; regenerate it with \
             `DRIVELET_WRITE_CRD=1 cargo test --lib k8s::crd` and commit the result"
        );
    }

    #[test]
    fn crd_is_cluster_scoped_with_short_name_and_status_subresource() {
        let crd = Drive::crd();
        assert_eq!(crd.metadata.name.as_deref(), Some("drives.drivelet.io"));
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.names.short_names, Some(vec!["drv".to_string()]));
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        assert!(version.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some());
        let columns: Vec<&str> = version
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(columns, ["NODE", "PRESENCE", "MEDIA", "SIZE", "CLASS", "HEALTH", "USAGE", "ACTION", "AGE"]);
    }

    #[test]
    fn presence_and_the_humane_size_are_printed_columns() {
        let crd = Drive::crd();
        let columns = crd.spec.versions[0].additional_printer_columns.clone().unwrap_or_default();
        let path_of = |name: &str| columns.iter().find(|c| c.name == name).map(|c| (c.json_path.clone(), c.type_.clone()));
        assert_eq!(path_of("PRESENCE"), Some((".status.presence".to_string(), "string".to_string())));
        assert_eq!(path_of("SIZE"), Some((".spec.size".to_string(), "string".to_string())));
        let missing = DriveStatus { presence: DrivePresence::Missing, missing: true, ..Default::default() };
        let value = serde_json::to_value(&missing).expect("serializes");
        assert_eq!((&value["presence"], &value["missing"]), (&"missing".into(), &true.into()));
        let present = serde_json::to_value(DriveStatus::default()).expect("serializes");
        assert_eq!(present["presence"], "present", "always set");
        // An object written before presence existed reads as present.
        let old: DriveStatus = serde_json::from_value(serde_json::json!({"class": "managed"})).expect("reads");
        assert_eq!(old.presence, DrivePresence::Present);
    }

    #[test]
    fn drive_serializes_with_camel_case_fields_and_lowercase_states() {
        let mut drive = Drive::new(
            "node-a-sn123",
            DriveSpec {
                node: "node-a".into(),
                drive_id: "ata-SN123".into(),
                serial: Some("SN123".into()),
                wwn: None,
                model: Some("Samsung SSD 870".into()),
                size_bytes: 2_000_398_934_016,
                size: Some("1.8 TiB".into()),
                media: "ssd".into(),
                action: None,
                restore_claims: None,
            },
        );
        drive.status = Some(DriveStatus {
            class: Some(DriveClass::Managed),
            class_reason: Some("carries a drivelet GPT".into()),
            owner: None,
            health: Some(DriveHealth::Suspect),
            health_reason: Some("12 reallocated sectors".into()),
            usage: Some(DriveUsage::Releasing),
            usage_reason: Some("health is BAD: 12 reallocated sectors".into()),
            presence: DrivePresence::Present,
            missing: false,
            volumes: vec!["vol-1".into()],
            volume_details: vec![],
            free_bytes: None,
            free_slots: None,
            conditions: vec![],
            evacuation: vec![],
            snapshots: vec![],
            cleaning: Some("512.0 MiB being cleaned (40% done)".into()),
        });
        let value = serde_json::to_value(&drive).expect("serializes");
        assert_eq!(value["apiVersion"], "drivelet.io/v1alpha1");
        assert_eq!(value["kind"], "Drive");
        assert_eq!(value["spec"]["sizeBytes"], 2_000_398_934_016u64);
        assert_eq!(value["spec"]["driveId"], "ata-SN123");
        assert!(value["spec"].get("wwn").is_none());
        assert_eq!(value["status"]["class"], "managed");
        assert_eq!(value["status"]["classReason"], "carries a drivelet GPT");
        assert_eq!(value["status"]["health"], "suspect");
        assert_eq!(value["status"]["usage"], "releasing");
        assert_eq!(value["status"]["usageReason"], "health is BAD: 12 reallocated sectors");
        assert!(value["status"].get("missing").is_none(), "a present drive carries no missing flag");
        assert_eq!(value["status"]["presence"], "present");
        assert_eq!(value["spec"]["size"], "1.8 TiB");
        assert_eq!(value["status"]["cleaning"], "512.0 MiB being cleaned (40% done)");
        let back: Drive = serde_json::from_value(value).expect("round trips");
        assert_eq!(back.status, drive.status);
    }
}
