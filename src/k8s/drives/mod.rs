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
//! - A sync reads the volume side in one answer, the volume manager's [`DriveView`]
//!   (usage records, records, conditions, used bytes, cleaning, evacuations), and the
//!   inventory in two (its scan status, its drives); when it carried out an admin's
//!   action it reads both again, so the status shows what the action changed. It never
//!   imports the volume manager's book.
//! - [`DriveSync`] syncs at start, after the inventory's drive events and the volume
//!   manager's [`VolumesChanged`] (a volume created, deleted or failed, a drive's usage
//!   changed, cleaning progressed, a move of an evacuation started, ended or failed; a
//!   burst of either within [`DEBOUNCE`] is one sync), at once when the watch of this
//!   node's objects sees a new spec generation (an admin's action), every `resync`
//!   period as a safety net, and every [`USED_REFRESH`]: the bytes staged volumes use
//!   change with no event at all (written only when a figure changed). So a drive's
//!   volume list follows creates and deletes within the debounce, and the object of a
//!   missing drive goes once its last live volume is deleted. One sync runs at a time; a
//!   failed one is logged and retried after the front's one retry policy
//!   ([`RetryPolicy`], `[kubernetes] retry_base` doubling to `retry_cap`). Nothing is synced, so nothing is deleted, before
//!   the inventory's first scan and the volume manager's start-up reconciliation are
//!   done.
//! - `status.evacuation` and the evacuation's condition follow the notifications, not a
//!   poll: the start, end and failure of each move come with a `VolumesChanged`, and so
//!   does the stage or unstage of a volume on a drive being evacuated (waiting for its
//!   unstage, or queued again). What changes in them without one (a move refused for
//!   lack of room after the evacuation began, as other drives fill up; the pods a
//!   waiting volume waits for) shows at the next sync, at the latest after
//!   [`USED_REFRESH`], as the pods and states of `status.volumeDetails` do.
//! - Each volume's pods (`status.volumeDetails[].pods`) are looked up only when a volume
//!   of the node is staged or published: the pods of this node (a field selector on
//!   `spec.nodeName`, never a cluster-wide list), the claims they name (one get each),
//!   and the claim's PV (one get each, its volume handle kept: it never changes). A
//!   failed lookup keeps the last answer and is logged; it never fails the sync.
//! - The loop is an exception to the one controller shell (`crate::k8s::shell`), on
//!   purpose: the shell runs a per-key work queue over two cluster-wide watches, while
//!   this is a level-triggered sync of the node's whole set of objects, started by the
//!   core actors' notifications (drive events, [`VolumesChanged`]) more than by a watch
//!   (its one watch, of this node's own objects by label, only says "sync now"), and a
//!   sync decides every object at once from one view (the plan of writes compares the
//!   whole set, deletes included). A per-object queue would split that one view into
//!   many. Its retry delay is the shell's [`RetryPolicy`], as the controllers' are.
//!
//! What lives where:
//! - [`names.rs`](names): object names and the node label value;
//! - [`desired.rs`](desired): the domain-to-CRD mapping and the objects this node
//!   should have;
//! - [`status.rs`](status): what the status shows beside: owners, cleaning, volume
//!   details;
//! - [`actions.rs`](actions): the admins' `spec.action`, carried out and shown (with
//!   `crate::k8s::drive_actions`, its pure decisions);
//! - [`plan.rs`](mod@plan): the writes that make the existing objects the desired ones;
//! - [`executor.rs`](executor): those writes, the list and the Events against the API
//!   server; [`pods.rs`](pods): the lookup of which pods use each volume (and its cache);
//! - [`sync.rs`](sync): one sync (gather, act, decide, write, tell) and the recipients
//!   it asks;
//! - [`actor.rs`](actor): [`DriveSync`], the loop: triggers, debounce, backoff, the
//!   watch;
//! - [`error.rs`](error): [`DrivesError`];
//! - `fixtures.rs` (tests only): values the unit tests and `fake_api_tests.rs` share.
//!
//! [`AdoptDrive`]: crate::actors::messages::AdoptDrive
//! [`DEBOUNCE`]: actor::DEBOUNCE
//! [`DriveSync`]: actor::DriveSync
//! [`DrivesError`]: error::DrivesError
//! [`RetryPolicy`]: crate::k8s::shell::RetryPolicy
//! [`USED_REFRESH`]: actor::USED_REFRESH
//! [`class_of`]: desired::class_of
//! [`health_of`]: desired::health_of
//! [`object_name`]: names::object_name
//! [`owner_status`]: status::owner_status
//! [`plan`]: plan::plan
//! [`usage_of`]: desired::usage_of
//! [`DriveView`]: crate::actors::volumes::DriveView
//! [`VolumesChanged`]: crate::actors::volumes::VolumesChanged
//! [`drive_actions::adopts`]: crate::k8s::drive_actions::adopts

pub(crate) mod actions;
pub(crate) mod actor;
pub(crate) mod desired;
pub(crate) mod error;
pub(crate) mod executor;
pub(crate) mod names;
pub(crate) mod plan;
pub(crate) mod pods;
pub(crate) mod status;
pub(crate) mod sync;

#[cfg(test)]
mod fake_api_tests;
#[cfg(test)]
pub(crate) mod fixtures;

pub(crate) use actor::DriveSync;
#[cfg(test)]
pub(crate) use names::object_name;
pub(crate) use names::node_label_value;

/// The label naming the node a `Drive` object belongs to.
pub(crate) const NODE_LABEL: &str = "drivelet.io/node";

/// The field manager of every server-side apply.
pub(crate) const FIELD_MANAGER: &str = "drivelet";
