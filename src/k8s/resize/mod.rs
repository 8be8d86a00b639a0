//! The in-process external-resizer: decides what to do about one PersistentVolumeClaim
//! whose volume lives on this node, and builds the status it writes, the way the
//! community external-resizer does for Kubernetes v1.32 with RecoverVolumeExpansionFailure
//! (KEP-1790, beta and on by default there). The [`controller`], run by the controller shell (`crate::k8s::shell`), runs these decisions.
//!
//! Rules, decided by the pure [`plan`] and the patch builders:
//! - A claim is ours when its PV's CSI driver is ours and the PV's node affinity pins it
//!   to this node (`topology.drivelet.io/node`), the PV is bound to exactly this claim
//!   (`claimRef` namespace and uid), the claim is Bound, and it asks for more than its
//!   `status.capacity`. (The actor also asks the volume manager whether it knows the
//!   PV's volume handle; a volume it does not know is left alone.)
//! - The size to grow to follows external-resizer's `expandAndRecover`: the claim's
//!   request, except while an earlier expansion is unfinished, when the size recorded in
//!   `status.allocatedResources` is finished first (a controller expansion cut short
//!   resumes to it; a node expansion pending or in progress is left to kubelet). After a
//!   final (not retryable) controller error, the request is taken again, so a user who
//!   lowers an infeasible request (to anything above `status.capacity`, the least the
//!   API server accepts) recovers.
//! - Before growing: `allocatedResources` = the size, `allocatedResourceStatuses` =
//!   `ControllerResizeInProgress`, condition `Resizing`, Event `Resizing`. Growing calls
//!   the volume manager's ControllerExpandVolume in process.
//! - Success: the PV's `spec.capacity` becomes the size the volume has now; a filesystem
//!   volume gets `NodeResizePending` and condition `FileSystemResizePending` (kubelet
//!   then runs NodeExpandVolume and sets `status.capacity`), Event
//!   `FileSystemResizeRequired`; a block volume is finished here: `status.capacity`, the
//!   resize status and conditions removed, Event `VolumeResizeSuccessful`.
//! - A volume in use that grows only by a move (no room after it on its drive; the
//!   volume manager's `GrowsWhenUnused`): deferred, not failed. The claim gets one
//!   Normal Event `VolumeResizeDeferred` saying it grows once no pod uses it ([`Deferrals`]:
//!   once per size, not at every retry, and no `Resizing` Event at the retries either;
//!   the claim's annotation `drivelet.io/resize-deferred` keeps the size told across a
//!   restart, see [`executor`]),
//!   nothing in its status, and the growth is asked again with the backoff: the first
//!   try after its unstage and detach moves and grows it (within `retry_cap`).
//! - Failure: Warning Event `VolumeResizeFailed` with the reason. An infeasible size
//!   (OUT_OF_RANGE: past the end of the drive; the volume unknown; a bad request) sets
//!   `ControllerResizeInfeasible` and condition `ControllerResizeError`, and the same
//!   size is not tried again for `RetryPolicy::terminal` (the slow set); another final
//!   error sets the condition and backs off; a transient one (another volume in the way,
//!   the volume busy, the manager restarting) only backs off. Nothing changes on the
//!   drive or in the PV when the expansion fails.
//! - Status patches that record progress carry the claim's resourceVersion (a stale
//!   claim is a conflict, retried with the newest one); failure marks do not, so a
//!   failure is recorded even against a slightly older claim (as external-resizer).
//!
//! Quantities are parsed exactly (`Ki`..`Ei`, `k`..`E`, `m`, exponents) and rounded up to
//! whole bytes, as Kubernetes' `Quantity.Value()` does.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimCondition};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{json, Value};

use super::identity::Identity;
use crate::TOPOLOGY_NODE_KEY;

/// The volume side: what the resizer asks of the volume manager, and the VolumeManager
/// backend of a running agent.
pub(crate) mod backend;
/// The resize controller the shell runs (the ResizeQueue actor): what is kept of the
/// watched objects, which claims a change queues, and a run of a claim.
pub(crate) mod controller;
/// Carries a planned expansion out against the API server and the volume side.
pub(crate) mod executor;

pub(crate) use backend::ManagerBackend;
pub(crate) use controller::ResizeQueue;

#[cfg(test)]
mod tests;

/// The resource the claim's size is under.
pub(crate) const STORAGE: &str = "storage";

/// `allocatedResourceStatuses[storage]`: the controller is growing the volume.
pub(crate) const CONTROLLER_IN_PROGRESS: &str = "ControllerResizeInProgress";
/// `allocatedResourceStatuses[storage]`: the controller cannot grow to that size.
pub(crate) const CONTROLLER_INFEASIBLE: &str = "ControllerResizeInfeasible";
/// `allocatedResourceStatuses[storage]`: kubelet is to grow the filesystem.
pub(crate) const NODE_PENDING: &str = "NodeResizePending";
/// `allocatedResourceStatuses[storage]`: kubelet is growing the filesystem.
pub(crate) const NODE_IN_PROGRESS: &str = "NodeResizeInProgress";
/// `allocatedResourceStatuses[storage]`: kubelet cannot grow the filesystem.
pub(crate) const NODE_INFEASIBLE: &str = "NodeResizeInfeasible";

/// Condition: the controller is growing the volume.
pub(crate) const RESIZING: &str = "Resizing";
/// Condition: the volume grew, its filesystem waits for kubelet.
pub(crate) const FS_RESIZE_PENDING: &str = "FileSystemResizePending";
/// Condition: the controller's expansion failed.
pub(crate) const CONTROLLER_RESIZE_ERROR: &str = "ControllerResizeError";
/// Condition: kubelet's expansion failed.
pub(crate) const NODE_RESIZE_ERROR: &str = "NodeResizeError";
/// The conditions a resize owns; every other condition of a claim is left alone.
pub(crate) const RESIZE_CONDITIONS: [&str; 4] = [RESIZING, FS_RESIZE_PENDING, CONTROLLER_RESIZE_ERROR, NODE_RESIZE_ERROR];

/// The message of `FileSystemResizePending`, external-resizer's words (kubelet's tools
/// and people know them).
pub(crate) const FS_PENDING_MESSAGE: &str = "Waiting for user to (re-)start a pod to finish file system resize of volume on node.";

/// The bytes of a Kubernetes quantity, rounded up to a whole byte; `None` when it is not
/// a quantity, negative, or larger than `u64`.
pub(crate) fn quantity_bytes(q: &str) -> Option<u64> {
    let q = q.trim();
    let split = q.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let num = num.strip_prefix('+').unwrap_or(num);
    if num.is_empty() || num.starts_with('-') || num.matches('.').count() > 1 || num == "." {
        return None;
    }
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit()) {
        return None;
    }
    // value = digits * 10^(exp10 - frac.len()) * 2^exp2
    let all = format!("{int}{frac}");
    let all = all.trim_start_matches('0');
    let digits: u128 = if all.is_empty() { 0 } else { all.parse().ok()? };
    let (exp2, exp10): (u32, i32) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        s if s.starts_with(['e', 'E']) => (0, s[1..].parse::<i32>().ok().filter(|e| e.abs() <= 40)?),
        _ => return None,
    };
    let exp10 = exp10 - frac.len() as i32;
    let mut value = digits.checked_mul(1u128.checked_shl(exp2)?)?;
    if exp10 >= 0 {
        value = value.checked_mul(10u128.checked_pow(exp10 as u32)?)?;
    } else {
        let div = 10u128.checked_pow(exp10.unsigned_abs())?;
        value = value.div_ceil(div);
    }
    u64::try_from(value).ok()
}

/// A byte count as a Kubernetes quantity in its canonical binary form: `2Gi`, `1536Mi`,
/// or plain bytes when no binary unit divides it.
pub(crate) fn quantity_of(bytes: u64) -> String {
    for (shift, unit) in [(60, "Ei"), (50, "Pi"), (40, "Ti"), (30, "Gi"), (20, "Mi"), (10, "Ki")] {
        if bytes != 0 && bytes % (1u64 << shift) == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

fn storage_of(map: Option<&BTreeMap<String, Quantity>>) -> Option<u64> {
    map.and_then(|m| m.get(STORAGE)).and_then(|q| quantity_bytes(&q.0))
}

/// The CSI volume id of a PV that is this driver's and whose node affinity pins it to
/// this node; `None` for any other PV.
pub(crate) fn our_volume(pv: &PersistentVolume, id: &Identity) -> Option<String> {
    let spec = pv.spec.as_ref()?;
    let csi = spec.csi.as_ref().filter(|c| c.driver == id.driver)?;
    let terms = &spec.node_affinity.as_ref()?.required.as_ref()?.node_selector_terms;
    let here = terms.iter().any(|t| {
        t.match_expressions.iter().flatten().any(|e| {
            e.key == TOPOLOGY_NODE_KEY && e.operator == "In" && e.values.iter().flatten().any(|v| *v == id.node)
        })
    });
    here.then(|| csi.volume_handle.clone())
}

/// What one look at a claim sees.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Observed<'a> {
    /// The claim.
    pub pvc: &'a PersistentVolumeClaim,
    /// The PV its `spec.volumeName` names.
    pub pv: &'a PersistentVolume,
    /// The last controller expansion of this claim ended with a final error (kept in
    /// memory, like external-resizer's `finalErrorPVCs`).
    pub final_error: bool,
    /// The size in `allocatedResources` was found infeasible and may not be tried again
    /// for this long (the slow set).
    pub slow_left: Option<Duration>,
}

/// What to do about a claim.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Plan {
    /// Nothing (why, for the debug log).
    Nothing(&'static str),
    /// The size asked for was infeasible: look again after this delay (or at the next
    /// change of the claim).
    Wait(Duration),
    /// Grow the volume.
    Expand(Expansion),
}

/// An expansion to carry out.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Expansion {
    /// The CSI volume id.
    pub volume_id: String,
    /// The size to grow to, in bytes.
    pub bytes: u64,
    /// The same size as the quantity to record in `allocatedResources`.
    pub allocated: Quantity,
    /// Whether the resize status and conditions are (re)written; `false` when resuming
    /// the size already recorded.
    pub update_status: bool,
}

/// The claim's `allocatedResourceStatuses[storage]`, or `""`.
pub(crate) fn resize_status(pvc: &PersistentVolumeClaim) -> &str {
    pvc.status.as_ref().and_then(|s| s.allocated_resource_statuses.as_ref()).and_then(|m| m.get(STORAGE)).map_or("", |s| s.as_str())
}

fn has_condition(pvc: &PersistentVolumeClaim, kind: &str) -> bool {
    pvc.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == kind && c.status == "True"))
}

/// Decide about one claim (see the module rules).
pub(crate) fn plan(obs: &Observed<'_>, id: &Identity) -> Plan {
    let (pvc, pv) = (obs.pvc, obs.pv);
    let Some(volume_id) = our_volume(pv, id) else { return Plan::Nothing("the PV is not this driver's on this node") };
    let status = pvc.status.as_ref();
    let spec = pvc.spec.as_ref();
    if status.and_then(|s| s.phase.as_deref()) != Some("Bound") || spec.and_then(|s| s.volume_name.as_deref()) != pv.metadata.name.as_deref() {
        return Plan::Nothing("the claim is not bound to the PV");
    }
    let bound = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_some_and(|r| {
        r.namespace == pvc.metadata.namespace && r.uid.is_some() && r.uid == pvc.metadata.uid
    });
    if !bound {
        return Plan::Nothing("the PV is bound to another claim");
    }
    let request_q = spec.and_then(|s| s.resources.as_ref()).and_then(|r| r.requests.as_ref()).and_then(|r| r.get(STORAGE));
    let Some((request_q, request)) = request_q.and_then(|q| Some((q.clone(), quantity_bytes(&q.0)?))) else {
        return Plan::Nothing("the claim requests no storage size");
    };
    let capacity = storage_of(status.and_then(|s| s.capacity.as_ref())).unwrap_or(0);
    if request <= capacity {
        return Plan::Nothing("the claim asks for no more than it has");
    }
    let pv_size = storage_of(pv.spec.as_ref().and_then(|s| s.capacity.as_ref())).unwrap_or(0);
    let allocated_q = status.and_then(|s| s.allocated_resources.as_ref()).and_then(|m| m.get(STORAGE)).cloned();
    let allocated = allocated_q.as_ref().and_then(|q| Some((q.clone(), quantity_bytes(&q.0)?)));
    let asked = (request_q, request);
    let allocated_or_asked = allocated.clone().unwrap_or_else(|| asked.clone());
    let state = resize_status(pvc);
    let (new_q, new) = if pv_size < request {
        match state {
            NODE_INFEASIBLE => allocated_or_asked,
            NODE_PENDING | NODE_IN_PROGRESS => {
                if pv_size >= allocated_or_asked.1 {
                    return Plan::Nothing("kubelet is to finish the expansion already made");
                }
                allocated_or_asked
            }
            CONTROLLER_IN_PROGRESS if obs.final_error => asked,
            CONTROLLER_IN_PROGRESS => allocated_or_asked,
            _ => asked,
        }
    } else {
        match state {
            NODE_PENDING | NODE_IN_PROGRESS => return Plan::Nothing("kubelet is to finish the expansion already made"),
            NODE_INFEASIBLE | CONTROLLER_IN_PROGRESS | CONTROLLER_INFEASIBLE => allocated_or_asked,
            "" if allocated.is_some() => allocated_or_asked,
            _ if has_condition(pvc, FS_RESIZE_PENDING) => return Plan::Nothing("kubelet is to finish the expansion already made"),
            _ => asked,
        }
    };
    let mut update_status = true;
    if allocated.as_ref().is_some_and(|(_, b)| *b == new) {
        if let Some(left) = obs.slow_left {
            return Plan::Wait(left);
        }
        update_status = false;
    }
    Plan::Expand(Expansion { volume_id, bytes: new, allocated: new_q, update_status })
}

/// How a controller expansion failed, for the status and the retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The size can never be met as asked (OUT_OF_RANGE, NOT_FOUND, INVALID_ARGUMENT).
    Infeasible,
    /// Not retryable as it is, but not the size's fault (the drive is missing, the
    /// volume is adopted or being deleted, a disk step failed).
    Final,
    /// May pass by itself (another volume in the way, the volume busy, the volume
    /// manager restarting).
    Transient,
    /// The volume grows only by a move, and it is in use: it grows once no pod uses it.
    /// Asked again with the backoff (so within `retry_cap` of its unstage); the claim
    /// hears it once ([`Deferrals`]), nothing is recorded in its status.
    Deferred,
}

/// The claims told that their growth waits until no pod uses their volume, with the size
/// they were told of: told once, not at every retry; again only for another size, or
/// after the growth ended either way (forgotten then). Kept for the life of the process,
/// at most [`DEFERRALS_MAX`] claims (the oldest forgotten first).
#[derive(Default, Debug)]
pub(crate) struct Deferrals(BTreeMap<String, (u64, u64)>, u64);

/// The most claims [`Deferrals`] remembers.
pub(crate) const DEFERRALS_MAX: usize = 4096;

impl Deferrals {
    /// Whether claim `key` is to be told that its growth to `bytes` is deferred;
    /// remembers it.
    pub(crate) fn tell(&mut self, key: &str, bytes: u64) -> bool {
        if self.0.get(key).is_some_and(|(b, _)| *b == bytes) {
            return false;
        }
        if self.0.len() >= DEFERRALS_MAX && !self.0.contains_key(key) {
            if let Some(oldest) = self.0.iter().min_by_key(|(_, (_, n))| *n).map(|(k, _)| k.clone()) {
                self.0.remove(&oldest);
            }
        }
        self.1 += 1;
        self.0.insert(key.to_string(), (bytes, self.1));
        true
    }

    /// Whether claim `key` was told its growth to `bytes` waits (its retries say nothing).
    pub(crate) fn told(&self, key: &str, bytes: u64) -> bool {
        self.0.get(key).is_some_and(|(b, _)| *b == bytes)
    }

    /// Forgets claim `key`: its growth went on (done, or failed otherwise).
    pub(crate) fn forget(&mut self, key: &str) {
        self.0.remove(key);
    }
}

/// One condition as the API server takes it.
fn condition(kind: &str, now: &str, message: Option<&str>) -> Value {
    let mut c = json!({"type": kind, "status": "True", "lastTransitionTime": now});
    if let Some(m) = message {
        c["message"] = json!(m);
    }
    c
}

/// The claim's conditions with `new` ones merged in, as external-resizer merges them:
/// conditions a resize does not own are kept; an owned one of the same type as a new
/// one is replaced; other owned ones are kept only with `keep_old`; new ones are
/// appended.
pub(crate) fn merge_conditions(old: &[PersistentVolumeClaimCondition], new: Vec<Value>, keep_old: bool) -> Vec<Value> {
    let mut new = new;
    let mut out = Vec::new();
    for c in old {
        let value = serde_json::to_value(c).unwrap_or(Value::Null);
        if !RESIZE_CONDITIONS.contains(&c.type_.as_str()) {
            out.push(value);
        } else if let Some(i) = new.iter().position(|n| n["type"] == c.type_.as_str()) {
            out.push(new.remove(i));
        } else if keep_old {
            out.push(value);
        }
    }
    out.extend(new);
    out
}

fn conditions_of(pvc: &PersistentVolumeClaim) -> &[PersistentVolumeClaimCondition] {
    pvc.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or(&[])
}

fn guarded(pvc: &PersistentVolumeClaim, status: Value) -> Value {
    json!({"metadata": {"resourceVersion": pvc.metadata.resource_version}, "status": status})
}

/// The claim's status patch before growing: `allocatedResources`, and with
/// `update_status` the `ControllerResizeInProgress` status and a fresh `Resizing`
/// condition (without it the other resize conditions are kept).
pub(crate) fn in_progress_patch(pvc: &PersistentVolumeClaim, e: &Expansion, now: &str) -> Value {
    let conditions = merge_conditions(conditions_of(pvc), vec![condition(RESIZING, now, None)], !e.update_status);
    let mut status = json!({"conditions": conditions, "allocatedResources": {STORAGE: e.allocated}});
    if e.update_status {
        status["allocatedResourceStatuses"] = json!({STORAGE: CONTROLLER_IN_PROGRESS});
    }
    guarded(pvc, status)
}

/// The claim's status patch after a filesystem volume grew: `NodeResizePending` and
/// `FileSystemResizePending`, for kubelet.
pub(crate) fn node_pending_patch(pvc: &PersistentVolumeClaim, now: &str) -> Value {
    let conditions = merge_conditions(conditions_of(pvc), vec![condition(FS_RESIZE_PENDING, now, Some(FS_PENDING_MESSAGE))], true);
    guarded(pvc, json!({"conditions": conditions, "allocatedResourceStatuses": {STORAGE: NODE_PENDING}}))
}

/// The claim's status patch after a block volume grew: the new `status.capacity`, no
/// resize status, no resize condition.
pub(crate) fn finished_patch(pvc: &PersistentVolumeClaim, capacity: &Quantity) -> Value {
    let conditions = merge_conditions(conditions_of(pvc), Vec::new(), false);
    guarded(pvc, json!({"capacity": {STORAGE: capacity}, "conditions": conditions, "allocatedResourceStatuses": {STORAGE: null}}))
}

/// The claim's status patch after a failed expansion: condition `ControllerResizeError`
/// with the reason, and for an infeasible size `ControllerResizeInfeasible`; `None` for
/// a transient failure (nothing is recorded). Not guarded by the resourceVersion.
pub(crate) fn failed_patch(pvc: &PersistentVolumeClaim, failure: Failure, message: &str, now: &str) -> Option<Value> {
    if matches!(failure, Failure::Transient | Failure::Deferred) {
        return None;
    }
    let text = format!("failed to expand pvc with {message}");
    let conditions = merge_conditions(conditions_of(pvc), vec![condition(CONTROLLER_RESIZE_ERROR, now, Some(&text))], true);
    let mut status = json!({"conditions": conditions});
    if failure == Failure::Infeasible {
        status["allocatedResourceStatuses"] = json!({STORAGE: CONTROLLER_INFEASIBLE});
    }
    Some(json!({"status": status}))
}

/// The PV's patch after the volume grew: `spec.capacity` = the volume's size now.
pub(crate) fn pv_capacity_patch(bytes: u64) -> Value {
    json!({"spec": {"capacity": {STORAGE: quantity_of(bytes)}}})
}

/// The retry after a failed expansion: the slow-set delay for an infeasible size, else
/// the backoff for `failures` earlier failures.
pub(crate) fn retry_after(failure: Failure, failures: u32, policy: &crate::k8s::shell::RetryPolicy) -> Duration {
    match failure {
        Failure::Infeasible => policy.terminal,
        Failure::Final | Failure::Transient | Failure::Deferred => policy.backoff(failures),
    }
}

/// Whether an update of a claim changes what [`plan`] must look at again: its request,
/// the PV it names, its phase or its capacity (kubelet finishing). The resize status
/// and conditions the resizer writes itself do not, so its own writes never requeue it.
pub(crate) fn claim_differs(old: &PersistentVolumeClaim, new: &PersistentVolumeClaim) -> bool {
    let key = |c: &PersistentVolumeClaim| {
        let spec = c.spec.as_ref();
        let status = c.status.as_ref();
        (
            spec.and_then(|s| s.resources.as_ref()).and_then(|r| r.requests.as_ref()).and_then(|r| r.get(STORAGE)).cloned(),
            spec.and_then(|s| s.volume_name.clone()),
            status.and_then(|s| s.phase.clone()),
            status.and_then(|s| s.capacity.as_ref()).and_then(|c| c.get(STORAGE)).cloned(),
            c.metadata.uid.clone(),
        )
    };
    key(old) != key(new)
}
