//! Our conformance suite: the CSI v1.12 MUSTs drivelet serves, checked over the real
//! socket against real loop drives, in the spirit of the community's csi-sanity.
//!
//! Rules this suite holds drivelet to (spec sections in brackets):
//! - a request missing a REQUIRED field, or with an invalid or unsupported value, is
//!   INVALID_ARGUMENT [Error Scheme]; every error carries a message and no details;
//! - every RPC is idempotent: repeating a call that succeeded succeeds with the same
//!   result [CreateVolume, DeleteVolume, NodeStage/Unstage/Publish/UnpublishVolume];
//! - each RPC's own error table: NOT_FOUND for unknown volumes, ALREADY_EXISTS for an
//!   incompatible repeat, FAILED_PRECONDITION for a volume in the wrong state or asked
//!   for a capability it does not have, OUT_OF_RANGE for a capacity range that can never
//!   be met, RESOURCE_EXHAUSTED for topology or space that cannot be had;
//! - what is advertised is served and everything else is UNIMPLEMENTED
//!   [ControllerGetCapabilities, NodeGetCapabilities, GetPluginCapabilities];
//! - response fields: ids present, capacity within the requested range, topology naming
//!   this node, plugin name in domain notation;
//! - access modes and `readonly` are enforced on the node, not just recorded;
//! - a refused request changes nothing: no new kernel partition, no new mount, no
//!   filesystem made, nothing created outside the allowed roots.
//!
//! One binary, a module per service: `identity` (GetPluginInfo, Probe, every
//! capability list and what is UNIMPLEMENTED), `controller` (CreateVolume, DeleteVolume,
//! ValidateVolumeCapabilities, GetCapacity, topology, whole drives),
//! `controller_publish` (ControllerPublishVolume, ControllerUnpublishVolume), `node`
//! (NodeGetInfo, staging and publishing, access modes), `listing` (ListVolumes and its
//! paging, ControllerGetVolume, NodeGetVolumeStats); `harness` holds the fixture, the
//! report and the request builders.
//!
//! Each test names one behaviour, starts its own agent over fresh loop drives, and
//! reports every violated rule of its table of cases at its end, so one bug does not
//! hide the next; steps the rest depends on fail at once. Where the spec is ambiguous
//! the suite expects what csi-sanity expects, or accepts either reading where csi-sanity
//! has no case, and says so at the case. Capacity is checked as eventually right: the
//! drive inventory hears of partition changes from udev.

mod controller;
mod controller_publish;
mod harness;
mod identity;
mod listing;
mod node;
