//! Keeps this node's cluster-scoped `Drive` objects in step with the drives its agent
//! sees: one object per disk of any class, written by this node's agent alone.
//!
//! Rules:
//! - An object's name is `<node>-<drive id>` turned into a DNS-1123 subdomain (lowercase;
//!   any other character becomes `-`), cut to fit 253 characters, with a hash of the
//!   exact node name and drive id appended ([`object_name`]). The hash is always there,
//!   so two nodes or drives whose names sanitize alike, or split differently at a `-`,
//!   never share an object.
//! - Every object carries the label `drivelet.io/node=<node>` ([`NODE_LABEL`]). This node
//!   lists only objects with its label, deletes only those that also name it in
//!   `spec.node`, and writes only names made from its own node name, so objects of other
//!   nodes are never touched.
//! - The domain states map to the CRD's in one place ([`class_of`], [`health_of`],
//!   [`usage_of`]). A drive owned elsewhere also shows whose it is and what its note
//!   lists in `status.owner` ([`owner_status`]); no other drive has one.
//! - An admin's `adopt` is asked of the inventory ([`AdoptDrive`]) while the inventory
//!   holds the drive as owned elsewhere ([`drive_actions::adopts`]); every other action
//!   of the volume manager.
//! - Every object says whether the node sees its disk: `status.presence` `present` or
//!   `missing` (a printed column). A disk the inventory no longer sees keeps its object
//!   while the volume manager holds a live volume on it (neither failed nor still being
//!   created): presence `missing` (and `status.missing`, for earlier readers), health
//!   `unknown` with a reason that says what to do, and the spec the object already had
//!   (the hardware did not change). Any other object of this node without a drive is
//!   deleted.
//! - [`plan`] writes only what differs, comparing spec, status and our labels (metadata
//!   the server fills in is ignored): a new object, or one whose spec or labels changed,
//!   is applied (server-side apply, field manager [`FIELD_MANAGER`], forced) and then its
//!   status; an object whose status alone changed gets only the status applied. The
//!   admin's `spec.action` is neither compared nor ever in an apply's body, so the agent
//!   never owns that field and never overwrites it.
//! - [`DriveSync`] syncs at start, after the inventory's drive events and the volume
//!   manager's [`VolumesChanged`] (a volume created, deleted or failed, a drive's usage
//!   changed; a burst of either within [`DEBOUNCE`] is one sync), and every `resync`
//!   period as a safety net, and every [`USED_REFRESH`] for the bytes its volumes use
//!   (written only when they changed). So a drive's volume list follows creates and deletes within
//!   the debounce, and the object of a missing drive goes once its last live volume is
//!   deleted. One sync runs at a time; a failed one is logged and retried after
//!   [`backoff`]. Nothing is synced, so nothing is deleted, before the inventory's first
//!   scan and the volume manager's start-up reconciliation are done.
//! - While a drive of this node is being evacuated, a sync also runs every
//!   [`EVACUATION_REFRESH`] (besides the `VolumesChanged` of each move), so its
//!   `status.evacuation` and condition follow the moves.
//! - Each volume's pods (`status.volumeDetails[].pods`) are looked up only when a volume
//!   of the node is staged or published: the pods of this node (a field selector on
//!   `spec.nodeName`, never a cluster-wide list), the claims they name (one get each),
//!   and the claim's PV (one get each, its volume handle kept: it never changes). A
//!   failed lookup keeps the last answer and is logged; it never fails the sync.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use actix::prelude::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::backoff::backoff;
use super::crd;

use crate::actors::inventory::model::Drive;
use crate::actors::inventory::DriveInventory;
use crate::actors::messages::{AdoptDrive, DriveEvent, GetInventoryStatus, ListDrives, SubscribeDrives};
use crate::actors::volumes::{SubscribeVolumes, VolumesChanged};

use crate::actors::volumes::model::{VolumeRecord, VolumeState};
use crate::actors::volumes::book::Cleaning;
use crate::actors::volumes::{
    volume_detail, CordonDrive, EvacuateDrive, Evacuation, ListCleaning, ListDriveUses, ListEvacuations, ListHeld,
    ListVolumeStatuses, ReleaseDrive, VolumeManager, VolumeStatus, VolumesReady, VolumesUsed,
};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use std::sync::{Arc, Mutex};
use super::drive_actions::{self, Command};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder};
use crate::words::{DriveClass, DriveOwner, DriveUse, DriveUseState, Health, Owner};

/// The label naming the node a `Drive` object belongs to.
pub(crate) const NODE_LABEL: &str = "drivelet.io/node";

/// The field manager of every server-side apply.
pub(crate) const FIELD_MANAGER: &str = "drivelet";

/// Drive events within this long of the first one are folded into one sync.
pub(crate) const DEBOUNCE: Duration = Duration::from_millis(500);

/// How often a sync waiting for the inventory's first scan (or the volume manager's
/// start-up) asks again.
pub(crate) const READY_POLL: Duration = Duration::from_secs(1);

/// How often the bytes staged volumes use are looked at again (a sync that writes only
/// when a figure changed), so the Drive objects' used bytes are at most this old.
pub(crate) const USED_REFRESH: Duration = Duration::from_secs(30);

/// How often a sync runs while a drive of this node is being evacuated.
pub(crate) const EVACUATION_REFRESH: Duration = Duration::from_secs(5);

/// Delay after the first failed sync; doubled per consecutive failure.
pub(crate) const RETRY_BASE: Duration = Duration::from_secs(1);

/// The longest delay between retries of a failing sync.
pub(crate) const RETRY_CAP: Duration = Duration::from_secs(300);

const MAX_NAME: usize = 253;
const MAX_LABEL_VALUE: usize = 63;

/// FNV-1a over the node name and drive id, NUL-separated so the split is part of it.
fn name_hash(parts: &[&str]) -> String {
    let mut hash = 0x811c_9dc5_u32;
    for (i, part) in parts.iter().enumerate() {
        let sep: &[u8] = if i == 0 { &[] } else { &[0] };
        for b in sep.iter().chain(part.as_bytes()) {
            hash = (hash ^ u32::from(*b)).wrapping_mul(0x0100_0193);
        }
    }
    format!("{hash:08x}")
}

/// `s` as a DNS-1123 subdomain: lowercase ASCII letters and digits kept, `.` kept between
/// labels, anything else `-`; labels trimmed of `-` at both ends, empty labels dropped.
fn dns_subdomain(s: &str) -> String {
    let mapped: String = s
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' { c } else { '-' })
        .collect();
    mapped.split('.').map(|label| label.trim_matches('-')).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(".")
}

/// The name of the `Drive` object for `drive_id` on `node` (see the module rules): a valid
/// DNS-1123 subdomain of at most 253 characters, the same on every call, different for
/// every node and drive.
pub(crate) fn object_name(node: &str, drive_id: &str) -> String {
    let hash = name_hash(&[node, drive_id]);
    let mut base = dns_subdomain(&format!("{node}-{drive_id}"));
    // Every character of `base` is ASCII, so cutting at a byte count is cutting at a char.
    base.truncate(MAX_NAME - 1 - hash.len());
    let base = base.trim_end_matches(['-', '.']);
    if base.is_empty() {
        hash
    } else {
        format!("{base}-{hash}")
    }
}

/// Whether `v` is a valid label value: at most 63 characters, ASCII letters, digits, `-`,
/// `_` and `.`, starting and ending with a letter or digit (or empty).
fn is_label_value(v: &str) -> bool {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
    v.len() <= MAX_LABEL_VALUE
        && v.chars().all(ok_char)
        && v.chars().next().is_none_or(|c| c.is_ascii_alphanumeric())
        && v.chars().last().is_none_or(|c| c.is_ascii_alphanumeric())
}

/// The value of [`NODE_LABEL`] for `node`: the node name itself when it is a valid label
/// value (Kubernetes node names up to 63 characters are), otherwise a sanitized prefix
/// of it with a hash of the whole name appended.
pub(crate) fn node_label_value(node: &str) -> String {
    if is_label_value(node) {
        return node.to_string();
    }
    let hash = name_hash(&[node]);
    let mut base: String =
        node.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '-' }).collect();
    base.truncate(MAX_LABEL_VALUE - 1 - hash.len());
    let base = base.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if base.is_empty() {
        hash
    } else {
        format!("{base}-{hash}")
    }
}

/// The CRD class of an inventory class.
pub(crate) fn class_of(class: DriveClass) -> crd::DriveClass {
    match class {
        DriveClass::Managed => crd::DriveClass::Managed,
        DriveClass::System => crd::DriveClass::System,
        DriveClass::Foreign => crd::DriveClass::Foreign,
        DriveClass::Excluded => crd::DriveClass::Excluded,
        DriveClass::OwnedElsewhere => crd::DriveClass::OwnedElsewhere,
    }
}

/// The CRD health of a SMART verdict.
pub(crate) fn health_of(health: Health) -> crd::DriveHealth {
    match health {
        Health::Good => crd::DriveHealth::Good,
        Health::Unknown => crd::DriveHealth::Unknown,
        Health::Suspect => crd::DriveHealth::Suspect,
        Health::Bad => crd::DriveHealth::Bad,
    }
}

/// The CRD usage of a drive's usage record (`None`: no record, so active).
pub(crate) fn usage_of(state: Option<DriveUseState>) -> crd::DriveUsage {
    match state {
        None => crd::DriveUsage::Active,
        Some(DriveUseState::Cordoned) => crd::DriveUsage::Cordoned,
        Some(DriveUseState::Releasing) => crd::DriveUsage::Releasing,
        Some(DriveUseState::Released) => crd::DriveUsage::Released,
    }
}

/// The claims the pods of `node` that have not finished use, each with those pods
/// (`namespace/name`, sorted), by (namespace, claim).
pub(crate) fn claims_used(pods: &[Pod], node: &str) -> BTreeMap<(String, String), Vec<String>> {
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for pod in pods {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let Some(spec) = pod.spec.as_ref() else { continue };
        if matches!(phase, Some("Succeeded" | "Failed")) || spec.node_name.as_deref() != Some(node) {
            continue;
        }
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        for v in spec.volumes.iter().flatten() {
            if let Some(c) = &v.persistent_volume_claim {
                let pods = out.entry((ns.clone(), c.claim_name.clone())).or_default();
                let name = format!("{ns}/{}", pod.name_any());
                if !pods.contains(&name) {
                    pods.push(name);
                }
            }
        }
    }
    out.values_mut().for_each(|v| v.sort());
    out
}

/// The pods using each volume, by volume id: `claims` (the pods of each claim) through
/// `handles` (the volume id of each claim's PV).
pub(crate) fn pods_by_volume(
    claims: &BTreeMap<(String, String), Vec<String>>,
    handles: &BTreeMap<(String, String), String>,
) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (claim, pods) in claims {
        if let Some(id) = handles.get(claim) {
            let v = out.entry(id.clone()).or_default();
            v.extend(pods.iter().cloned());
            v.sort();
            v.dedup();
        }
    }
    out
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

fn object(node: &str, drive_id: &str, spec: crd::DriveSpec, status: crd::DriveStatus) -> crd::Drive {
    let mut obj = crd::Drive::new(&object_name(node, drive_id), spec);
    obj.metadata.labels = Some(BTreeMap::from([(NODE_LABEL.to_string(), node_label_value(node))]));
    obj.status = Some(status);
    obj
}

/// What a Drive object shows of whose a drive is: set for a drive owned elsewhere
/// (another node or cluster, a note that cannot be read, or none), `None` for any other;
/// `me` is this node of this cluster, when known.
pub(crate) fn owner_status(owner: &DriveOwner, me: Option<&Owner>) -> Option<crd::DriveOwnerStatus> {
    let unknown = |words: String| crd::DriveOwnerStatus { words, ..Default::default() };
    match owner {
        DriveOwner::Elsewhere { owner, volumes } => Some(crd::DriveOwnerStatus {
            words: me.map(|m| owner.words(m)).unwrap_or_else(|| format!("node {} of cluster {}", owner.node, owner.cluster)),
            cluster: Some(owner.cluster.clone()),
            node: Some(owner.node.clone()),
            this_cluster: me.is_some_and(|m| m.cluster == owner.cluster),
            volumes: volumes
                .iter()
                .map(|v| crd::HeldVolumeStatus { id: v.id.clone(), size_bytes: v.size_bytes, claim: v.claim.clone(), pv: v.pv.clone() })
                .collect(),
        }),
        DriveOwner::Unreadable { reason } => Some(unknown(format!("nobody drivelet can tell: its note cannot be read ({reason})"))),
        DriveOwner::NoNote => Some(unknown("nobody drivelet can tell: it carries drivelet volumes but no note of whose they are".into())),
        DriveOwner::Ours | DriveOwner::Unknown => None,
    }
}

/// Puts whose each drive owned elsewhere is into its object's status ([`owner_status`]).
pub(crate) fn show_owners(objects: &mut [crd::Drive], drives: &[Drive], me: Option<&Owner>) {
    for o in objects {
        let d = drives.iter().find(|d| d.id == o.spec.drive_id && d.class == DriveClass::OwnedElsewhere);
        if let Some(st) = o.status.as_mut() {
            st.owner = d.and_then(|d| owner_status(&d.owner, me));
        }
    }
}

/// Puts how far the cleaning of each drive's freed space is into its object's status.
pub(crate) fn show_cleaning(objects: &mut [crd::Drive], cleaning: &[Cleaning]) {
    for o in objects {
        let c = cleaning.iter().find(|c| c.drive_id == o.spec.drive_id);
        if let Some(st) = o.status.as_mut() {
            st.cleaning = c.map(Cleaning::words);
            // As `ctl drives` counts it: space being cleaned is not free until clean.
            st.free_bytes = st.free_bytes.map(|f| f.saturating_sub(c.map_or(0, |c| c.left_bytes)));
        }
    }
}

/// The objects this node should have: one per drive the inventory sees, and one per
/// drive it does not see that still holds a live volume (marked missing), ordered by name.
pub(crate) fn desired(node: &str, drives: &[Drive], uses: &[DriveUse], volumes: &[VolumeRecord]) -> Vec<crd::Drive> {
    let uses: BTreeMap<&str, &DriveUse> = uses.iter().map(|u| (u.drive_id.as_str(), u)).collect();
    let mut on_drive: BTreeMap<&str, Vec<&VolumeRecord>> = BTreeMap::new();
    for rec in volumes.iter().filter(|r| r.state != VolumeState::Creating) {
        on_drive.entry(rec.drive_id.as_str()).or_default().push(rec);
    }
    let ids_on = |id: &str, snapshots: bool| -> Vec<String> {
        let mut ids: Vec<String> = on_drive.get(id).into_iter().flatten().filter(|r| r.snapshot.is_some() == snapshots).map(|r| r.id.clone()).collect();
        ids.sort();
        ids
    };
    let mut out: BTreeMap<String, crd::Drive> = BTreeMap::new();
    for d in drives {
        let usage = uses.get(d.id.as_str());
        let spec = crd::DriveSpec {
            node: node.to_string(),
            drive_id: d.id.clone(),
            serial: d.serial.clone(),
            wwn: d.wwn.clone(),
            model: d.model.clone(),
            size_bytes: d.size_bytes,
            size: Some(crate::config::human_bytes(d.size_bytes)),
            media: d.media.as_str().to_string(),
            action: None,
            restore_claims: None,
        };
        let status = crd::DriveStatus {
            class: Some(class_of(d.class)),
            class_reason: non_empty(&d.reason),
            owner: None,
            health: Some(health_of(d.health.health)),
            health_reason: non_empty(&d.health.reason),
            usage: Some(usage_of(usage.map(|u| u.state))),
            usage_reason: usage.and_then(|u| non_empty(&u.reason)),
            presence: crd::DrivePresence::Present,
            missing: false,
            volumes: ids_on(&d.id, false),
            snapshots: ids_on(&d.id, true),
            cleaning: None,
            free_bytes: (d.class == DriveClass::Managed).then_some(d.free_bytes),
            volume_details: Vec::new(),
            conditions: Vec::new(),
            evacuation: Vec::new(),
        };
        let obj = object(node, &d.id, spec, status);
        out.entry(obj.name_any()).or_insert(obj);
    }
    let present: BTreeSet<&str> = drives.iter().map(|d| d.id.as_str()).collect();
    for (id, recs) in &on_drive {
        if present.contains(id) || recs.iter().all(|r| r.failed) {
            continue;
        }
        let usage = uses.get(id);
        let mut live: Vec<&str> = recs.iter().filter(|r| !r.failed).map(|r| r.id.as_str()).collect();
        live.sort();
        let spec = crd::DriveSpec {
            node: node.to_string(),
            drive_id: id.to_string(),
            serial: None,
            wwn: None,
            model: None,
            size_bytes: 0,
            size: None,
            media: recs.first().map(|r| r.media.as_str()).unwrap_or_default().to_string(),
            action: None,
            restore_claims: None,
        };
        let status = crd::DriveStatus {
            class: Some(crd::DriveClass::Managed),
            class_reason: Some("carries drivelet volumes".to_string()),
            owner: None,
            health: Some(crd::DriveHealth::Unknown),
            health_reason: Some(format!(
                "drive {id} is missing from node {node} while volumes live on it ({}): the data is unreachable; \
                 put the drive back, or if it failed, delete those volumes and restore from backup",
                live.join(", ")
            )),
            usage: Some(usage_of(usage.map(|u| u.state))),
            usage_reason: usage.and_then(|u| non_empty(&u.reason)),
            presence: crd::DrivePresence::Missing,
            missing: true,
            volumes: ids_on(id, false),
            snapshots: ids_on(id, true),
            cleaning: None,
            free_bytes: None,
            volume_details: Vec::new(),
            conditions: Vec::new(),
            evacuation: Vec::new(),
        };
        let obj = object(node, id, spec, status);
        out.entry(obj.name_any()).or_insert(obj);
    }
    out.into_values().collect()
}

/// One write to the API server.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SyncAction {
    /// Create or update the object (spec and labels), then apply its status.
    Apply(Box<crd::Drive>),
    /// Only the status differs: apply the status subresource.
    ApplyStatus(Box<crd::Drive>),
    /// Delete this node's object of that name: no drive wants it any more.
    Delete(String),
}

impl SyncAction {
    /// The name of the object the action writes.
    pub(crate) fn name(&self) -> String {
        match self {
            SyncAction::Apply(obj) | SyncAction::ApplyStatus(obj) => obj.name_any(),
            SyncAction::Delete(name) => name.clone(),
        }
    }
}

/// Whether `obj` is this node's: our label and our node in the spec.
fn is_ours(obj: &crd::Drive, node: &str) -> bool {
    obj.spec.node == node && obj.labels().get(NODE_LABEL).is_some_and(|v| *v == node_label_value(node))
}

/// What to write so that this node's objects among `existing` become `desired`: applies
/// in the order of `desired`, then deletes by name (see the module rules). Objects of
/// other nodes in `existing` are ignored.
pub(crate) fn plan(node: &str, desired: &[crd::Drive], existing: &[crd::Drive]) -> Vec<SyncAction> {
    let ours: BTreeMap<String, &crd::Drive> =
        existing.iter().filter(|e| is_ours(e, node)).map(|e| (e.name_any(), e)).collect();
    let mut actions = Vec::new();
    for want in desired {
        let Some(have) = ours.get(&want.name_any()) else {
            actions.push(SyncAction::Apply(Box::new(want.clone())));
            continue;
        };
        let mut want = want.clone();
        if want.status.as_ref().is_some_and(|s| s.presence == crd::DrivePresence::Missing) {
            want.spec = have.spec.hardware();
        }
        let labels_match = want.labels().iter().all(|(k, v)| have.labels().get(k) == Some(v));
        // The admin's action is theirs: only the hardware is compared (and applied).
        if have.spec.hardware() != want.spec.hardware() || !labels_match {
            actions.push(SyncAction::Apply(Box::new(want)));
        } else if have.status != want.status {
            actions.push(SyncAction::ApplyStatus(Box::new(want)));
        }
    }
    let wanted: BTreeSet<String> = desired.iter().map(|d| d.name_any()).collect();
    for (name, have) in &ours {
        if !wanted.contains(name) && have.metadata.deletion_timestamp.is_none() {
            actions.push(SyncAction::Delete(name.clone()));
        }
    }
    actions
}

/// Errors of a sync.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DrivesError {
    /// Listing this node's objects failed.
    #[error("listing the Drive objects of node {node}: {source}")]
    List {
        /// This node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
    /// Applying an object (spec and labels) failed.
    #[error("applying Drive {name}: {source}")]
    Apply {
        /// The object.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// Applying an object's status failed.
    #[error("applying the status of Drive {name}: {source}")]
    ApplyStatus {
        /// The object.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// Deleting a stale object failed.
    #[error("deleting Drive {name}: {source}")]
    Delete {
        /// The object.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// A query to another actor got no answer.
    #[error("asking the {actor} for {what}: {source}")]
    Ask {
        /// The actor asked.
        actor: &'static str,
        /// What was asked.
        what: &'static str,
        /// Why there was no answer.
        source: MailboxError,
    },
}

/// Carries out [`SyncAction`]s against the API server.
#[derive(Clone)]
pub(crate) struct Executor {
    api: Api<crd::Drive>,
    recorder: Recorder,
    client: Client,
    /// Our CSI driver (a PV of another driver is no volume of ours; empty: any).
    driver: String,
    /// What the pods lookup keeps between syncs: each PV's volume handle (never changes)
    /// and the last answer (kept when a lookup fails).
    pods: Arc<Mutex<PodsCache>>,
}

/// See [`Executor::pods`].
#[derive(Default)]
struct PodsCache {
    handles: BTreeMap<String, Option<String>>,
    last: BTreeMap<String, Vec<String>>,
}

impl Executor {
    /// An executor writing `Drive` objects as [`FIELD_MANAGER`] and recording Events on
    /// them as this node's drivelet.
    pub(crate) fn new(client: Client, node: &str) -> Self {
        let reporter = kube::runtime::events::Reporter { controller: super::identity::REPORTER.into(), instance: Some(node.into()) };
        Self {
            api: Api::all(client.clone()),
            recorder: Recorder::new(client.clone(), reporter),
            client,
            driver: String::new(),
            pods: Arc::default(),
        }
    }

    /// Volumes of PVs of `driver` only, in the pods lookup.
    pub(crate) fn with_driver(mut self, driver: &str) -> Self {
        self.driver = driver.to_string();
        self
    }

    /// The pods of `node` (not finished) using each volume, by volume id, as
    /// `namespace/name`, sorted (see the module rules). A failed lookup answers the last
    /// one, and is logged.
    pub(crate) async fn pods(&self, node: &str) -> BTreeMap<String, Vec<String>> {
        match self.lookup_pods(node).await {
            Ok(map) => {
                self.pods.lock().map(|mut c| c.last = map.clone()).ok();
                map
            }
            Err(e) => {
                warn!(actor = "drive-sync", node.name = %node, error = %e, "cannot look up which pods use the volumes; the last answer stays");
                self.pods.lock().map(|c| c.last.clone()).unwrap_or_default()
            }
        }
    }

    async fn lookup_pods(&self, node: &str) -> Result<BTreeMap<String, Vec<String>>, kube::Error> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let list = pods.list(&ListParams::default().fields(&format!("spec.nodeName={node}"))).await?;
        let claims = claims_used(&list.items, node);
        let mut handles: BTreeMap<(String, String), String> = BTreeMap::new();
        let mut seen: BTreeSet<String> = BTreeSet::new();
        for (ns, claim) in claims.keys() {
            let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
            let Some(pvc) = pvcs.get_opt(claim).await? else { continue };
            let Some(pv_name) = pvc.spec.and_then(|s| s.volume_name).filter(|n| !n.is_empty()) else { continue };
            seen.insert(pv_name.clone());
            let known = self.pods.lock().ok().and_then(|c| c.handles.get(&pv_name).cloned());
            let handle = match known {
                Some(h) => h,
                None => {
                    let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
                    let Some(pv) = pvs.get_opt(&pv_name).await? else { continue };
                    let csi = pv.spec.and_then(|s| s.csi).filter(|c| self.driver.is_empty() || c.driver == self.driver);
                    let h = csi.map(|c| c.volume_handle);
                    if let Ok(mut c) = self.pods.lock() {
                        c.handles.insert(pv_name.clone(), h.clone());
                    }
                    h
                }
            };
            if let Some(h) = handle {
                handles.insert((ns.clone(), claim.clone()), h);
            }
        }
        // Forget the PVs no pod of the node uses any more: the cache stays this node's size.
        if let Ok(mut c) = self.pods.lock() {
            c.handles.retain(|pv, _| seen.contains(pv));
        }
        Ok(pods_by_volume(&claims, &handles))
    }

    /// Records `events` on their Drive objects; one that fails is logged, not retried
    /// (the condition in the status says the same).
    pub(crate) async fn tell(&self, events: &[(ObjectReference, Event)]) {
        for (obj, ev) in events {
            if let Err(e) = self.recorder.publish(ev, obj).await {
                warn!(actor = "drive-sync", drive.object = obj.name.as_deref().unwrap_or_default(), error = %e,
                      "cannot record an Event on the Drive object");
            }
        }
    }

    /// The objects labelled as `node`'s.
    pub(crate) async fn list(&self, node: &str) -> Result<Vec<crd::Drive>, DrivesError> {
        let params = ListParams::default().labels(&format!("{NODE_LABEL}={}", node_label_value(node)));
        let list = self.api.list(&params).await.map_err(|source| DrivesError::List { node: node.to_string(), source })?;
        Ok(list.items)
    }

    /// Performs `actions` in order and stops at the first failure. A delete of an object
    /// that is already gone succeeds.
    pub(crate) async fn execute(&self, actions: &[SyncAction]) -> Result<(), DrivesError> {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        for action in actions {
            match action {
                SyncAction::Apply(obj) => {
                    self.apply(obj, &params).await?;
                    self.apply_status(obj, &params).await?;
                }
                SyncAction::ApplyStatus(obj) => self.apply_status(obj, &params).await?,
                SyncAction::Delete(name) => self.delete(name).await?,
            }
        }
        Ok(())
    }

    async fn apply(&self, obj: &crd::Drive, params: &PatchParams) -> Result<(), DrivesError> {
        let name = obj.name_any();
        // Never the admin's action: an apply that named it would take it over.
        let mut body = crd::Drive::new(&name, obj.spec.hardware());
        body.metadata = ObjectMeta { name: Some(name.clone()), labels: obj.metadata.labels.clone(), ..Default::default() };
        self.api
            .patch(&name, params, &Patch::Apply(&body))
            .await
            .map_err(|source| DrivesError::Apply { name, source })?;
        Ok(())
    }

    async fn apply_status(&self, obj: &crd::Drive, params: &PatchParams) -> Result<(), DrivesError> {
        let name = obj.name_any();
        let body = json!({
            "apiVersion": crd::Drive::api_version(&()),
            "kind": crd::Drive::kind(&()),
            "metadata": { "name": name },
            "status": obj.status.clone().unwrap_or_default(),
        });
        self.api
            .patch_status(&name, params, &Patch::Apply(&body))
            .await
            .map_err(|source| DrivesError::ApplyStatus { name, source })?;
        Ok(())
    }

    async fn delete(&self, name: &str) -> Result<(), DrivesError> {
        match self.api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(source) => Err(DrivesError::Delete { name: name.to_string(), source }),
        }
    }
}

/// The queries a sync asks, as recipients so tests can answer them with stand-ins.
#[derive(Clone)]
pub(crate) struct Sources {
    pub(crate) inventory_status: Recipient<GetInventoryStatus>,
    pub(crate) drives: Recipient<ListDrives>,
    pub(crate) subscribe: Recipient<SubscribeDrives>,
    pub(crate) subscribe_volumes: Recipient<SubscribeVolumes>,
    pub(crate) volumes_ready: Recipient<VolumesReady>,
    pub(crate) uses: Recipient<ListDriveUses>,
    pub(crate) volumes: Recipient<ListHeld>,
    pub(crate) cleaning: Recipient<ListCleaning>,
    pub(crate) statuses: Recipient<ListVolumeStatuses>,
    pub(crate) used: Recipient<VolumesUsed>,
    pub(crate) cordon: Recipient<CordonDrive>,
    pub(crate) release: Recipient<ReleaseDrive>,
    pub(crate) evacuate: Recipient<EvacuateDrive>,
    pub(crate) evacuations: Recipient<ListEvacuations>,
    pub(crate) adopt: Recipient<AdoptDrive>,
}

impl Sources {
    fn of(inventory: Addr<DriveInventory>, volumes: Addr<VolumeManager>) -> Self {
        Self {
            inventory_status: inventory.clone().recipient(),
            drives: inventory.clone().recipient(),
            adopt: inventory.clone().recipient(),
            subscribe: inventory.recipient(),
            subscribe_volumes: volumes.clone().recipient(),
            volumes_ready: volumes.clone().recipient(),
            uses: volumes.clone().recipient(),
            cleaning: volumes.clone().recipient(),
            statuses: volumes.clone().recipient(),
            used: volumes.clone().recipient(),
            cordon: volumes.clone().recipient(),
            release: volumes.clone().recipient(),
            evacuate: volumes.clone().recipient(),
            evacuations: volumes.clone().recipient(),
            volumes: volumes.recipient(),
        }
    }
}

/// How a sync ended, when it did not fail.
#[derive(Debug)]
enum Synced {
    /// Not started: waiting for this to be done.
    NotReady(&'static str),
    /// Done: these writes were made; `evacuating`: a drive of the node is being
    /// evacuated (sync again within [`EVACUATION_REFRESH`]).
    Done { actions: Vec<SyncAction>, evacuating: bool },
}

fn ask(actor: &'static str, what: &'static str) -> impl FnOnce(MailboxError) -> DrivesError {
    move |source| DrivesError::Ask { actor, what, source }
}

/// One sync: gather, act on the admins' actions, decide, write, tell.
async fn sync_once(node: String, sources: Sources, executor: Executor) -> Result<Synced, DrivesError> {
    let status = sources.inventory_status.send(GetInventoryStatus).await.map_err(ask("inventory", "its scan status"))?;
    if !status.scanned {
        return Ok(Synced::NotReady("the inventory's first drive scan"));
    }
    let ready = sources.volumes_ready.send(VolumesReady).await.map_err(ask("volume manager", "its readiness"))?;
    if !ready {
        return Ok(Synced::NotReady("the volume manager's start-up reconciliation"));
    }
    let existing = executor.list(&node).await?;
    let uses = sources.uses.send(ListDriveUses).await.map_err(ask("volume manager", "the drive usage records"))?;
    let refused = act(&node, &existing, &uses, &sources).await?;
    let drives = sources.drives.send(ListDrives).await.map_err(ask("inventory", "its drives"))?;
    let uses = sources.uses.send(ListDriveUses).await.map_err(ask("volume manager", "the drive usage records"))?;
    let volumes = sources.volumes.send(ListHeld).await.map_err(ask("volume manager", "its volumes"))?;
    let cleaning = sources.cleaning.send(ListCleaning).await.map_err(ask("volume manager", "how far cleaning is"))?;
    let statuses = sources
        .statuses
        .send(ListVolumeStatuses { after: None, max: 0, abnormal_only: false })
        .await
        .map_err(ask("volume manager", "its volumes' conditions"))?
        .map(|(page, _)| page)
        .unwrap_or_default();
    let used = sources.used.send(VolumesUsed).await.map_err(ask("volume manager", "the bytes its volumes use"))?;
    let evacuations = sources.evacuations.send(ListEvacuations).await.map_err(ask("volume manager", "where the evacuations stand"))?;
    let in_use = volumes.iter().any(|r| r.staging.is_some() || matches!(r.state, VolumeState::Staged | VolumeState::Published));
    let pods = if in_use { executor.pods(&node).await } else { BTreeMap::new() };
    let mut want = desired(&node, &drives, &uses, &volumes);
    show_cleaning(&mut want, &cleaning);
    show_owners(&mut want, &drives, crate::disk::note::identity());
    show_volumes(&mut want, &statuses, &used, &pods);
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let events = show_actions(&node, &mut want, &existing, &uses, &refused, &evacuations, &pods, &now);
    let actions = plan(&node, &want, &existing);
    executor.execute(&actions).await?;
    executor.tell(&events).await;
    Ok(Synced::Done { actions, evacuating: evacuations.iter().any(|e| !e.done) })
}

/// Whether the admin's spec of `obj` is of a generation its `ActionComplete` condition
/// has not answered yet.
fn fresh(obj: &crd::Drive) -> bool {
    let observed = obj
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == drive_actions::ACTION_COMPLETE))
        .map(|c| c.observed_generation);
    observed.is_none_or(|o| o < obj.metadata.generation.unwrap_or(0))
}

/// Asks the volume manager for what the `spec.action` of this node's objects asks and
/// the drive is not yet; answers the refusals by drive id.
async fn act(node: &str, existing: &[crd::Drive], uses: &[DriveUse], sources: &Sources) -> Result<BTreeMap<String, String>, DrivesError> {
    let mut refused = BTreeMap::new();
    for obj in existing.iter().filter(|e| is_ours(e, node)) {
        let Some(action) = obj.spec.action else { continue };
        let id = obj.spec.drive_id.clone();
        if action == crd::DriveAction::Adopt {
            // Judged by the class the inventory holds now (the object's may be older).
            let drives = sources.drives.send(ListDrives).await.map_err(ask("inventory", "its drives"))?;
            let class = drives.iter().find(|d| d.id == id).map(|d| class_of(d.class));
            if !drive_actions::adopts(action, class) {
                continue;
            }
            match sources.adopt.send(AdoptDrive { drive_id: id.clone() }).await.map_err(ask("inventory", "a drive adoption"))? {
                Ok(a) => info!(actor = "drive-sync", node.name = %node, drive.id = %id, drive.owner_was = %a.from, volumes = a.volumes.len(),
                               "drive adopted as the Drive object's spec asked"),
                Err(e) => {
                    warn!(actor = "drive-sync", node.name = %node, drive.id = %id, error = %e, "adoption of the Drive object's spec refused");
                    refused.insert(id, e);
                }
            }
            continue;
        }
        let Some(cmd) = drive_actions::command(action, uses.iter().find(|u| u.drive_id == id), fresh(obj)) else { continue };
        let res = match cmd {
            Command::Cordon(cordon) => sources
                .cordon
                .send(CordonDrive { drive_id: id.clone(), cordon })
                .await
                .map_err(ask("volume manager", "a drive cordon"))?
                .map(|_| ()),
            Command::Release => sources
                .release
                .send(ReleaseDrive { drive_id: id.clone(), force: false })
                .await
                .map_err(ask("volume manager", "a drive release"))?
                .map(|_| ()),
            Command::Evacuate => sources
                .evacuate
                .send(EvacuateDrive { drive_id: id.clone(), force: false })
                .await
                .map_err(ask("volume manager", "a drive evacuation"))?
                .map(|_| ()),
        };
        match res {
            Ok(()) => info!(actor = "drive-sync", node.name = %node, drive.id = %id, drive.action = action.as_str(),
                            "drive action of the Drive object's spec carried out"),
            Err(e) => {
                warn!(actor = "drive-sync", node.name = %node, drive.id = %id, drive.action = action.as_str(), error = %e,
                      "drive action of the Drive object's spec refused");
                refused.insert(id, e.to_string());
            }
        }
    }
    Ok(refused)
}

/// Puts each drive's volumes with their size, used bytes, state and health into its
/// object's status, as `ctl volumes` shows them ([`volume_detail`]), with the pods of
/// this node using each (`pods`, by volume id).
pub(crate) fn show_volumes(
    objects: &mut [crd::Drive],
    statuses: &[VolumeStatus],
    used: &BTreeMap<String, u64>,
    pods: &BTreeMap<String, Vec<String>>,
) {
    for o in objects {
        let Some(st) = o.status.as_mut() else { continue };
        st.volume_details = st
            .volumes
            .iter()
            .filter_map(|id| statuses.iter().find(|v| v.record.id == *id))
            .map(|v| {
                let d = volume_detail(v, used);
                crd::DriveVolume {
                    pods: pods.get(&d.id).cloned().unwrap_or_default(),
                    id: d.id,
                    name: d.name,
                    size_bytes: d.size_bytes,
                    used_bytes: d.used_bytes,
                    kind: d.kind,
                    state: d.state,
                    health: if d.abnormal { "abnormal" } else { "normal" }.into(),
                    health_reason: d.reason,
                }
            })
            .collect();
    }
}

/// Puts the `ActionComplete` condition of each object an admin asked an action of into
/// its wanted status, and where each volume of an evacuated drive stands; answers the
/// Events to record on the objects whose condition's reason changed.
#[allow(clippy::too_many_arguments)]
pub(crate) fn show_actions(
    node: &str,
    want: &mut [crd::Drive],
    existing: &[crd::Drive],
    uses: &[DriveUse],
    refused: &BTreeMap<String, String>,
    evacuations: &[Evacuation],
    pods: &BTreeMap<String, Vec<String>>,
    now: &str,
) -> Vec<(ObjectReference, Event)> {
    let mut events = Vec::new();
    for w in want.iter_mut() {
        let evacuation = evacuations.iter().find(|e| e.drive_id == w.spec.drive_id);
        if let (Some(e), Some(st)) = (evacuation, w.status.as_mut()) {
            st.evacuation = drive_actions::evacuation_list(e, pods);
        }
        let Some(have) = existing.iter().find(|e| is_ours(e, node) && e.name_any() == w.name_any()) else { continue };
        let Some(action) = have.spec.action else { continue };
        let id = w.spec.drive_id.clone();
        let Some(st) = w.status.as_mut() else { continue };
        let before = have.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == drive_actions::ACTION_COMPLETE));
        let usage = uses.iter().find(|u| u.drive_id == id);
        let live: Vec<String> = st.volumes.clone();
        let outcome = if action == crd::DriveAction::Adopt {
            let reason = st.class_reason.clone().unwrap_or_default();
            drive_actions::adopt_outcome(&id, st.class, &reason, &live, refused.get(&id).map(String::as_str))
        } else {
            drive_actions::outcome(action, &id, usage, &live, refused.get(&id).map(String::as_str), evacuation, pods)
        };
        let c = drive_actions::condition(outcome, have.metadata.generation.unwrap_or(0), before, now);
        if let Some(ev) = drive_actions::event_of(action, before, &c) {
            events.push((have.object_ref(&()), ev));
        }
        st.conditions = vec![c];
    }
    events
}

/// The actor that keeps this node's `Drive` objects in sync (see the module rules). Start
/// it under `actix::Supervisor`.
pub(crate) struct DriveSync {
    node: String,
    executor: Executor,
    sources: Sources,
    resync: Duration,
    /// The subscriptions to drive and volume events survive restarts (the address does).
    subscribed: bool,
    /// A sync is in flight.
    syncing: bool,
    /// Something may have changed since the last sync started.
    dirty: bool,
    /// Consecutive failed syncs.
    failures: u32,
    /// The next sync, when one is scheduled.
    timer: Option<SpawnHandle>,
    /// Watch this node's objects through this client, so a changed spec (an admin's
    /// action) is acted on at once (`None`: only the other triggers).
    watch: Option<Client>,
    /// The generation of each object last seen by the watch.
    generations: BTreeMap<String, i64>,
}

/// The watch saw this node's object `name` at spec generation `generation`.
#[derive(Message, Debug)]
#[rtype(result = "()")]
struct SpecSeen {
    name: String,
    generation: i64,
}

impl DriveSync {
    /// A sync of `node`'s objects through `client`, fed by the inventory and the volume
    /// manager, with a full resync every `resync` (zero: no periodic resync).
    pub(crate) fn new(
        client: Client,
        node: String,
        driver: &str,
        inventory: Addr<DriveInventory>,
        volumes: Addr<VolumeManager>,
        resync: Duration,
    ) -> Self {
        let mut sync = Self::with_sources(client.clone(), node, Sources::of(inventory, volumes), resync);
        sync.executor = sync.executor.with_driver(driver);
        sync.watch = Some(client);
        sync
    }

    pub(crate) fn with_sources(client: Client, node: String, sources: Sources, resync: Duration) -> Self {
        Self {
            executor: Executor::new(client, &node),
            node,
            watch: None,
            generations: BTreeMap::new(),
            sources,
            resync,
            subscribed: false,
            syncing: false,
            dirty: false,
            failures: 0,
            timer: None,
        }
    }

    /// Asks for a sync within `after`; one already scheduled or running covers it.
    fn request(&mut self, ctx: &mut Context<Self>, after: Duration) {
        self.dirty = true;
        if !self.syncing && self.timer.is_none() {
            self.schedule(ctx, after);
        }
    }

    fn schedule(&mut self, ctx: &mut Context<Self>, after: Duration) {
        if let Some(timer) = self.timer.take() {
            ctx.cancel_future(timer);
        }
        self.timer = Some(ctx.run_later(after, |act, ctx| {
            act.timer = None;
            act.run(ctx);
        }));
    }

    fn run(&mut self, ctx: &mut Context<Self>) {
        if self.syncing {
            return;
        }
        self.syncing = true;
        self.dirty = false;
        let fut = sync_once(self.node.clone(), self.sources.clone(), self.executor.clone());
        ctx.spawn(fut.into_actor(self).map(|result, act, ctx| act.finished(result, ctx)));
    }

    fn finished(&mut self, result: Result<Synced, DrivesError>, ctx: &mut Context<Self>) {
        self.syncing = false;
        match result {
            Ok(Synced::NotReady(waiting_for)) => {
                debug!(actor = "drive-sync", node.name = %self.node, waiting_for, "drive objects not synced yet");
                self.dirty = true;
                self.schedule(ctx, READY_POLL);
            }
            Ok(Synced::Done { actions, evacuating }) => {
                self.failures = 0;
                for action in &actions {
                    let (node, object) = (&self.node, action.name());
                    match action {
                        SyncAction::Apply(_) => {
                            info!(actor = "drive-sync", node.name = %node, drive.object = %object, "drive object applied")
                        }
                        SyncAction::ApplyStatus(_) => {
                            debug!(actor = "drive-sync", node.name = %node, drive.object = %object, "drive object status applied")
                        }
                        SyncAction::Delete(_) => {
                            info!(actor = "drive-sync", node.name = %node, drive.object = %object, "stale drive object deleted")
                        }
                    }
                }
                if self.dirty {
                    self.schedule(ctx, DEBOUNCE);
                } else if evacuating {
                    self.request(ctx, EVACUATION_REFRESH);
                }
            }
            Err(e) => {
                let delay = backoff(self.failures, RETRY_BASE, RETRY_CAP);
                self.failures = self.failures.saturating_add(1);
                warn!(actor = "drive-sync", node.name = %self.node, error = %e, failures = self.failures,
                      retry_in = ?delay, "drive object sync failed");
                self.dirty = true;
                self.schedule(ctx, delay);
            }
        }
    }
}

impl Actor for DriveSync {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if !self.subscribed {
            self.sources.subscribe.do_send(SubscribeDrives(ctx.address().recipient()));
            self.sources.subscribe_volumes.do_send(SubscribeVolumes(ctx.address().recipient()));
            self.subscribed = true;
        }
        if !self.resync.is_zero() {
            ctx.run_interval(self.resync, |act, ctx| act.request(ctx, Duration::ZERO));
        }
        if let Some(client) = self.watch.clone() {
            ctx.run_interval(USED_REFRESH, |act, ctx| act.request(ctx, Duration::ZERO));
            use tokio_stream::StreamExt as _;
            use kube::runtime::{watcher, WatchStreamExt as _};
            let config = watcher::Config::default().labels(&format!("{NODE_LABEL}={}", node_label_value(&self.node)));
            let seen = watcher::watcher(Api::<crd::Drive>::all(client), config)
                .default_backoff()
                .applied_objects()
                .filter_map(Result::ok)
                .map(|obj| SpecSeen { name: obj.name_any(), generation: obj.metadata.generation.unwrap_or(0) });
            ctx.add_stream(seen);
        }
        self.request(ctx, Duration::ZERO);
    }
}

impl StreamHandler<SpecSeen> for DriveSync {
    fn handle(&mut self, m: SpecSeen, ctx: &mut Context<Self>) {
        // Only a new generation is a new spec: status writes (ours) do not change it.
        if self.generations.insert(m.name, m.generation) != Some(m.generation) {
            self.request(ctx, Duration::ZERO);
        }
    }

    fn finished(&mut self, _: &mut Context<Self>) {
        // The watch retries with backoff and never ends; should it, the periodic
        // resync still acts on the specs.
        warn!(actor = "drive-sync", node.name = %self.node, "the watch of the Drive objects ended");
    }
}

impl Supervised for DriveSync {
    fn restarting(&mut self, _: &mut Context<Self>) {
        warn!(actor = "drive-sync", node.name = %self.node, "restarting: syncing drive objects from scratch");
        self.syncing = false;
        self.dirty = false;
        self.failures = 0;
        self.timer = None;
    }
}

impl Handler<DriveEvent> for DriveSync {
    type Result = ();
    fn handle(&mut self, _: DriveEvent, ctx: &mut Context<Self>) {
        self.request(ctx, DEBOUNCE);
    }
}

impl Handler<VolumesChanged> for DriveSync {
    type Result = ();
    fn handle(&mut self, _: VolumesChanged, ctx: &mut Context<Self>) {
        self.request(ctx, DEBOUNCE);
    }
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Values shared by the decision tests and the fake API server tests.

    use super::*;
    use crate::actors::inventory::model::DriveHealth;
    use crate::words::Media;

    pub(crate) const NODE: &str = "node-a";

    /// An inventory drive of `class` with a serial, a model and a good health verdict.
    pub(crate) fn drive(id: &str, class: DriveClass, reason: &str) -> Drive {
        let mut d = Drive::for_test(id, Media::Ssd, 1 << 40);
        d.class = class;
        d.reason = reason.into();
        d.serial = Some(format!("SN-{id}"));
        d.model = Some("Samsung SSD 870".into());
        d.health = DriveHealth { health: Health::Good, reason: "SMART overall-health passed".into(), checked_unix: 1, smart: Default::default() };
        d
    }

    /// A volume `n` on drive `drive_id`.
    pub(crate) fn volume(n: u8, drive_id: &str, state: VolumeState) -> VolumeRecord {
        let mut r = VolumeRecord::for_test(n, state);
        r.drive_id = drive_id.into();
        r
    }

    /// The object `desired` makes of a lone drive without volumes.
    pub(crate) fn object_of(d: &Drive) -> crd::Drive {
        desired(NODE, std::slice::from_ref(d), &[], &[]).remove(0)
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;
    use crate::actors::inventory::model::DriveHealth;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    /// Kubernetes' own check (IsDNS1123Subdomain): at most 253 characters, dot-separated
    /// labels of lowercase letters, digits and `-` that start and end with a letter or digit.
    fn is_dns_subdomain(s: &str) -> bool {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        !s.is_empty() && s.len() <= 253 && s.split('.').all(label_ok)
    }

    #[test]
    fn object_names_are_stable_dns_subdomains_with_a_hash_of_node_and_drive() {
        let long_node = "n".repeat(200);
        let long_id = format!("wwn-{}", "A".repeat(100));
        let long_prefix = format!("{long_node}-wwn-aaaa");
        // (node, drive id, the name, or when `cut`, what the name starts with)
        let table: Vec<(&str, &str, &str, bool)> = vec![
            ("node-a", "wwn-0x5000c500a1b2c3d4", "node-a-wwn-0x5000c500a1b2c3d4-6e07307b", false),
            ("Node_A", "ata-Samsung_SSD_870_S5Y1NX0R", "node-a-ata-samsung-ssd-870-s5y1nx0r-41bb2af8", false),
            ("node-a", "loop-d1.img-1a2b3c4d", "node-a-loop-d1.img-1a2b3c4d-bfa81c97", false),
            ("-", ".", "c23b4572", false),
            (&long_node, &long_id, &long_prefix, true),
        ];
        for (node, id, want, cut) in table {
            let name = object_name(node, id);
            assert!(is_dns_subdomain(&name), "{name:?} is not a DNS-1123 subdomain");
            assert_eq!(name, object_name(node, id), "the same on every call");
            if cut {
                assert!(name.starts_with(want), "{name}");
                assert_eq!(name.len(), 253);
                assert_ne!(name, object_name(node, &format!("{id}B")), "cut alike, still apart");
            } else {
                assert_eq!(name, want, "{node} {id}");
            }
        }
        assert_ne!(object_name("a-b", "c"), object_name("a", "b-c"), "the split between node and drive counts");
        assert_ne!(object_name("node-a", "ata-X_1"), object_name("node-a", "ata-x-1"), "sanitized alike, still apart");
        assert_ne!(object_name("node-a", "d1"), object_name("node-b", "d1"));
        assert!(is_dns_subdomain(&object_name("node.example.com", "loop-.img.-")), "no empty or dashed labels");
    }

    #[test]
    fn node_label_is_the_node_name_unless_it_is_no_valid_label_value() {
        let long = "n".repeat(70);
        let table = [
            ("node-a", "node-a"),
            ("ip-10-0-0-1.ec2.internal", "ip-10-0-0-1.ec2.internal"),
            ("Worker_1", "Worker_1"),
            ("Worker 1/A", "Worker-1-A-c49e3a08"),
            (long.as_str(), "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn-3395645d"),
        ];
        for (node, want) in table {
            let value = node_label_value(node);
            assert_eq!(value, want, "{node}");
            assert!(is_label_value(&value), "{value}");
        }
    }

    fn use_of(drive_id: &str, state: DriveUseState, reason: &str) -> DriveUse {
        DriveUse { drive_id: drive_id.into(), state, reason: reason.into(), requested: false, evacuate: None }
    }

    #[test]
    fn a_drive_owned_elsewhere_shows_whose_it_is_and_what_it_holds_and_no_other_drive_does() {
        use crate::words::HeldVolume;
        let me = Owner { cluster: "c1".into(), node: NODE.into() };
        let held = vec![
            HeldVolume { id: "v1".into(), size_bytes: 64 << 20, claim: Some("apps/data-0".into()), pv: Some("pv-1".into()) },
            HeldVolume { id: "v2".into(), size_bytes: 32 << 20, claim: None, pv: None },
        ];
        let mut ours = drive("d1", DriveClass::Managed, "carries a drivelet GPT");
        ours.owner = DriveOwner::Ours;
        let mut peer = drive("d2", DriveClass::OwnedElsewhere, "belongs to node node-2 of this cluster");
        peer.owner = DriveOwner::Elsewhere { owner: Owner { cluster: "c1".into(), node: "node-2".into() }, volumes: held.clone() };
        let mut old = drive("d3", DriveClass::OwnedElsewhere, "belongs to node n9 of another cluster (c0)");
        old.owner = DriveOwner::Elsewhere { owner: Owner { cluster: "c0".into(), node: "n9".into() }, volumes: vec![] };
        let mut torn = drive("d4", DriveClass::OwnedElsewhere, "carries a note of its owner that cannot be read");
        torn.owner = DriveOwner::Unreadable { reason: "both copies fail their checksum".into() };
        let drives = vec![ours, peer, old, torn];
        let mut objects = desired(NODE, &drives, &[], &[]);
        show_owners(&mut objects, &drives, Some(&me));
        let owner = |id: &str| objects.iter().find(|o| o.spec.drive_id == id).and_then(|o| o.status.as_ref()?.owner.clone());
        assert_eq!(owner("d1"), None, "this node's drive");
        let peer = owner("d2").expect("owned elsewhere");
        assert_eq!(peer.words, "node node-2 of this cluster");
        assert_eq!((peer.cluster.as_deref(), peer.node.as_deref(), peer.this_cluster), (Some("c1"), Some("node-2"), true));
        assert_eq!(peer.volumes[0], crd::HeldVolumeStatus { id: "v1".into(), size_bytes: 64 << 20, claim: Some("apps/data-0".into()), pv: Some("pv-1".into()) });
        assert_eq!(peer.volumes.len(), 2);
        let old = owner("d3").expect("another cluster's");
        assert_eq!((old.words.as_str(), old.this_cluster), ("node n9 of another cluster (c0)", false));
        let torn = owner("d4").expect("unreadable");
        assert_eq!((torn.cluster, torn.node, torn.this_cluster), (None, None, false));
        assert!(torn.words.contains("cannot be read (both copies fail their checksum)"), "{}", torn.words);
        let value = serde_json::to_value(objects.iter().find(|o| o.spec.drive_id == "d2").unwrap()).unwrap();
        assert_eq!(value["status"]["class"], "owned-elsewhere");
        assert_eq!(value["status"]["owner"]["thisCluster"], true);
        assert_eq!(value["status"]["owner"]["volumes"][0]["claim"], "apps/data-0");
    }

    #[test]
    fn a_drive_being_cleaned_says_so_in_its_status_and_the_others_do_not() {
        let mut objs = desired(NODE, &[drive("wwn-a", DriveClass::Managed, "blank"), drive("wwn-b", DriveClass::Managed, "blank")], &[], &[]);
        let c = Cleaning { drive_id: "wwn-a".into(), left_bytes: 384 << 20, round_bytes: 512 << 20 };
        show_cleaning(&mut objs, &[c]);
        let of = |objs: &[crd::Drive], id: &str| objs.iter().find(|o| o.spec.drive_id == id).and_then(|o| o.status.clone()).and_then(|s| s.cleaning);
        assert_eq!(of(&objs, "wwn-a").as_deref(), Some("384.0 MiB being cleaned (25% done)"));
        assert_eq!(of(&objs, "wwn-b"), None);
        show_cleaning(&mut objs, &[]);
        assert_eq!(of(&objs, "wwn-a"), None, "gone once clean");
    }

    #[test]
    fn desired_has_one_object_per_drive_of_any_class_with_mapped_states() {
        let managed = drive("wwn-m", DriveClass::Managed, "carries a drivelet GPT");
        let system = drive("ata-sys", DriveClass::System, "backs the mounted filesystem at /");
        let foreign = drive("ata-for", DriveClass::Foreign, "has a partition table drivelet did not create");
        let excluded = drive("ata-exc", DriveClass::Excluded, "matches drives.filters.exclude");
        let mut bad = drive("wwn-bad", DriveClass::Managed, "carries a drivelet GPT");
        bad.health = DriveHealth { health: Health::Bad, reason: "SMART overall-health failed".into(), checked_unix: 2, smart: Default::default() };
        let mut released = drive("wwn-rel", DriveClass::Managed, "blank");
        released.health = DriveHealth::default();
        let uses = [
            use_of("wwn-bad", DriveUseState::Releasing, "health is BAD: SMART overall-health failed"),
            use_of("wwn-rel", DriveUseState::Released, "release requested"),
        ];
        let volumes = [
            volume(2, "wwn-m", VolumeState::Published),
            volume(1, "wwn-m", VolumeState::Available),
            volume(3, "wwn-m", VolumeState::Creating),
            volume(4, "wwn-bad", VolumeState::Staged),
        ];
        let drives = [managed.clone(), system, foreign, excluded, bad, released];
        let got = desired(NODE, &drives, &uses, &volumes);

        let status = |class, class_reason: &str, health, health_reason: &str, usage, usage_reason: Option<&str>, vols: &[u8]| {
            crd::DriveStatus {
                class: Some(class),
                class_reason: Some(class_reason.into()),
                owner: None,
                health: Some(health),
                health_reason: Some(health_reason.into()),
                usage: Some(usage),
                usage_reason: usage_reason.map(str::to_string),
                presence: crd::DrivePresence::Present,
                missing: false,
                volumes: vols.iter().map(|n| volume(*n, "", VolumeState::Available).id).collect(),
                snapshots: vec![],
                cleaning: None,
                free_bytes: (class == crd::DriveClass::Managed).then_some(0),
                volume_details: Vec::new(),
                conditions: Vec::new(),
                evacuation: Vec::new(),
            }
        };
        let passed = "SMART overall-health passed";
        use crd::{DriveClass as C, DriveHealth as H, DriveUsage as U};
        let want: Vec<(&str, crd::DriveStatus)> = vec![
            ("ata-sys", status(C::System, "backs the mounted filesystem at /", H::Good, passed, U::Active, None, &[])),
            ("ata-for", status(C::Foreign, "has a partition table drivelet did not create", H::Good, passed, U::Active, None, &[])),
            ("ata-exc", status(C::Excluded, "matches drives.filters.exclude", H::Good, passed, U::Active, None, &[])),
            ("wwn-m", status(C::Managed, "carries a drivelet GPT", H::Good, passed, U::Active, None, &[1, 2])),
            (
                "wwn-bad",
                status(
                    C::Managed,
                    "carries a drivelet GPT",
                    H::Bad,
                    "SMART overall-health failed",
                    U::Releasing,
                    Some("health is BAD: SMART overall-health failed"),
                    &[4],
                ),
            ),
            ("wwn-rel", status(C::Managed, "blank", H::Unknown, "not checked yet", U::Released, Some("release requested"), &[])),
        ];
        assert_eq!(got.len(), want.len(), "one object per drive");
        for (id, status) in want {
            let obj = got.iter().find(|o| o.spec.drive_id == id).unwrap_or_else(|| panic!("no object for {id}"));
            assert_eq!(obj.name_any(), object_name(NODE, id));
            assert_eq!(obj.status.as_ref(), Some(&status), "status of {id}");
        }
        let names: Vec<String> = got.iter().map(|o| o.name_any()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted, "ordered by name");

        let m = got.iter().find(|o| o.spec.drive_id == "wwn-m").expect("managed object");
        assert_eq!(
            m.spec,
            crd::DriveSpec {
                node: NODE.into(),
                drive_id: "wwn-m".into(),
                serial: Some("SN-wwn-m".into()),
                wwn: None,
                model: Some("Samsung SSD 870".into()),
                size_bytes: 1 << 40,
                size: Some("1.0 TiB".into()),
                media: "ssd".into(),
                action: None,
                restore_claims: None,
            }
        );
        for obj in &got {
            assert_eq!(obj.labels().get(NODE_LABEL).map(String::as_str), Some(NODE), "{}", obj.name_any());
            assert_eq!(obj.spec.node, NODE);
        }
    }

    #[test]
    fn a_pulled_drive_keeps_a_missing_object_only_while_live_volumes_are_on_it() {
        let present = drive("wwn-m", DriveClass::Managed, "carries a drivelet GPT");
        let mut failed = volume(4, "wwn-gone", VolumeState::Available);
        failed.failed = true;
        let mut dead = volume(5, "wwn-dead", VolumeState::Staged);
        dead.failed = true;
        let volumes = [
            volume(3, "wwn-gone", VolumeState::Published),
            failed.clone(),
            dead,
            volume(6, "wwn-new", VolumeState::Creating),
        ];
        let uses = [use_of("wwn-gone", DriveUseState::Releasing, "release requested")];
        let got = desired(NODE, &[present], &uses, &volumes);
        let ids: Vec<&str> = got.iter().map(|o| o.spec.drive_id.as_str()).collect();
        assert_eq!(ids.len(), 2, "{ids:?}: only failed volumes or a volume being created keep no object");
        let gone = got.iter().find(|o| o.spec.drive_id == "wwn-gone").expect("object of the pulled drive");
        let live = volume(3, "", VolumeState::Available).id;
        assert_eq!(gone.name_any(), object_name(NODE, "wwn-gone"));
        assert_eq!(gone.labels().get(NODE_LABEL).map(String::as_str), Some(NODE));
        assert_eq!(gone.spec.media, "virtual", "the media its volumes record");
        assert_eq!(
            gone.status,
            Some(crd::DriveStatus {
                class: Some(crd::DriveClass::Managed),
                class_reason: Some("carries drivelet volumes".into()),
                owner: None,
                health: Some(crd::DriveHealth::Unknown),
                health_reason: Some(format!(
                    "drive wwn-gone is missing from node node-a while volumes live on it ({live}): the data is \
                     unreachable; put the drive back, or if it failed, delete those volumes and restore from backup"
                )),
                usage: Some(crd::DriveUsage::Releasing),
                usage_reason: Some("release requested".into()),
                presence: crd::DrivePresence::Missing,
                missing: true,
                volumes: vec![live.clone(), failed.id.clone()],
                snapshots: vec![],
                cleaning: None,
                free_bytes: None,
                volume_details: Vec::new(),
                conditions: Vec::new(),
                evacuation: Vec::new(),
            })
        );
    }

    /// `obj` as the API server returns it: with the metadata it fills in and a label of
    /// someone else's.
    fn served(obj: &crd::Drive) -> crd::Drive {
        let mut obj = obj.clone();
        obj.metadata.resource_version = Some("42".into());
        obj.metadata.uid = Some("0b7a1c3e-1111-4000-8000-000000000001".into());
        obj.metadata.generation = Some(3);
        obj.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1_700_000_000).expect("valid timestamp")));
        obj.metadata.labels.get_or_insert_default().insert("team".into(), "storage".into());
        obj
    }

    fn apply(obj: &crd::Drive) -> SyncAction {
        SyncAction::Apply(Box::new(obj.clone()))
    }

    fn apply_status(obj: &crd::Drive) -> SyncAction {
        SyncAction::ApplyStatus(Box::new(obj.clone()))
    }

    #[test]
    fn plan_writes_only_what_differs_and_deletes_only_this_nodes_stale_objects() {
        let a = object_of(&drive("wwn-a", DriveClass::Managed, "blank"));
        let b = object_of(&drive("wwn-b", DriveClass::Foreign, "has a filesystem"));
        let c = object_of(&drive("wwn-c", DriveClass::System, "backs /"));
        let mut a_bad = a.clone();
        a_bad.status.get_or_insert_default().health = Some(crd::DriveHealth::Bad);
        let mut a_grown = a.clone();
        a_grown.spec.size_bytes *= 2;
        let mut a_unlabelled = served(&a);
        a_unlabelled.metadata.labels = None;
        let other_node = desired("node-b", &[drive("wwn-x", DriveClass::Managed, "blank")], &[], &[]).remove(0);
        let mut our_label_other_spec = served(&b);
        our_label_other_spec.spec.node = "node-b".into();
        let mut b_deleting = served(&b);
        b_deleting.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(1_700_000_100).expect("valid timestamp")));

        let pulled = desired(NODE, &[], &[], &[volume(1, "wwn-a", VolumeState::Published)]).remove(0);
        let mut pulled_keeps_spec = pulled.clone();
        pulled_keeps_spec.spec = a.spec.clone();

        // (case, desired, existing, expected)
        type Case = (&'static str, Vec<crd::Drive>, Vec<crd::Drive>, Vec<SyncAction>);
        let table: Vec<Case> = vec![
            ("a new drive is created", vec![a.clone()], vec![], vec![apply(&a)]),
            ("an unchanged object is left alone, whatever the server filled in", vec![a.clone()], vec![served(&a)], vec![]),
            ("a changed status is applied to the status alone", vec![a_bad.clone()], vec![served(&a)], vec![apply_status(&a_bad)]),
            ("a changed spec is applied whole", vec![a_grown.clone()], vec![served(&a)], vec![apply(&a_grown)]),
            ("an object without our label is applied again", vec![a.clone()], vec![a_unlabelled], vec![apply(&a)]),
            ("a stale object of this node is deleted", vec![a.clone()], vec![served(&a), served(&b)], vec![Delete(b.name_any())]),
            ("another node's object is never touched", vec![], vec![served(&other_node)], vec![]),
            ("an object naming another node in its spec is not ours", vec![], vec![our_label_other_spec], vec![]),
            ("a stale object already being deleted is not deleted again", vec![], vec![b_deleting], vec![]),
            (
                "a pulled drive keeps the spec its object has and changes only its status",
                vec![pulled.clone()],
                vec![served(&a)],
                vec![apply_status(&pulled_keeps_spec)],
            ),
            ("a pulled drive without an object gets one", vec![pulled.clone()], vec![], vec![apply(&pulled)]),
            (
                "applies come in desired order, then deletes",
                vec![a.clone(), c.clone()],
                vec![served(&b), served(&c)],
                vec![apply(&a), Delete(b.name_any())],
            ),
        ];
        use SyncAction::Delete;
        for (case, desired, existing, want) in table {
            assert_eq!(plan(NODE, &desired, &existing), want, "{case}");
        }
    }

    #[test]
    fn a_spec_is_fresh_until_its_condition_answers_its_generation() {
        let mut obj = object_of(&drive("wwn-a", DriveClass::Managed, "blank"));
        obj.metadata.generation = Some(3);
        assert!(fresh(&obj), "no condition yet");
        let c = |generation: i64| crd::DriveCondition {
            type_: drive_actions::ACTION_COMPLETE.into(),
            status: "False".into(),
            reason: "Evacuating".into(),
            message: "m".into(),
            observed_generation: generation,
            last_transition_time: "2026-11-26T23:00:00Z".into(),
        };
        obj.status.get_or_insert_default().conditions = vec![c(2)];
        assert!(fresh(&obj), "answered an older generation: the admin asked again");
        obj.status.get_or_insert_default().conditions = vec![c(3)];
        assert!(!fresh(&obj), "answered");
    }

    #[test]
    fn the_pods_of_a_node_are_grouped_by_the_claims_they_use() {
        let pod = |ns: &str, name: &str, node: &str, phase: &str, claims: &[&str]| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": name, "namespace": ns },
                "spec": {
                    "nodeName": node,
                    "containers": [],
                    "volumes": claims.iter().map(|c| serde_json::json!({ "name": c, "persistentVolumeClaim": { "claimName": c } })).collect::<Vec<_>>(),
                },
                "status": { "phase": phase },
            }))
            .expect("a pod")
        };
        let pods = [
            pod("apps", "web-1", NODE, "Running", &["data", "logs"]),
            pod("apps", "web-0", NODE, "Pending", &["data"]),
            pod("apps", "done", NODE, "Succeeded", &["data"]),
            pod("apps", "elsewhere", "node-b", "Running", &["data"]),
            pod("other", "x", NODE, "Running", &["data"]),
        ];
        let claims = claims_used(&pods, NODE);
        let key = |ns: &str, c: &str| (ns.to_string(), c.to_string());
        assert_eq!(claims.get(&key("apps", "data")), Some(&vec!["apps/web-0".to_string(), "apps/web-1".to_string()]));
        assert_eq!(claims.get(&key("apps", "logs")), Some(&vec!["apps/web-1".to_string()]));
        assert_eq!(claims.get(&key("other", "data")), Some(&vec!["other/x".to_string()]), "a claim is of its namespace");
        assert_eq!(claims.len(), 3);
        let handles = BTreeMap::from([(key("apps", "data"), "vol-1".to_string()), (key("other", "data"), "vol-1".to_string())]);
        let by_volume = pods_by_volume(&claims, &handles);
        assert_eq!(by_volume.get("vol-1"), Some(&vec!["apps/web-0".to_string(), "apps/web-1".to_string(), "other/x".to_string()]));
        assert_eq!(by_volume.len(), 1, "a claim without a known PV names no volume");
    }

    #[test]
    fn domain_states_map_to_the_crd_states_of_the_same_name() {
        for class in [DriveClass::Managed, DriveClass::System, DriveClass::Foreign, DriveClass::Excluded] {
            assert_eq!(serde_json::to_value(class_of(class)).ok(), Some(class.as_str().into()));
        }
        for health in [Health::Good, Health::Unknown, Health::Suspect, Health::Bad] {
            assert_eq!(serde_json::to_value(health_of(health)).ok(), Some(health.as_str().into()));
        }
        assert_eq!(usage_of(None), crd::DriveUsage::Active);
        for state in [DriveUseState::Cordoned, DriveUseState::Releasing, DriveUseState::Released] {
            assert_eq!(serde_json::to_value(usage_of(Some(state))).ok(), Some(state.as_str().into()));
        }
    }
}
