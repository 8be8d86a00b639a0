//! Kubernetes side of drivelet: the in-process external-attacher, the `Drive` custom
//! resource and the sync of this node's `Drive` objects.
//!
//! Rules:
//! - Decisions are pure functions over Kubernetes objects and domain values
//!   (`attach::reconcile`, `attach::reconcile_pv`, `drives::desired`, `drives::plan`); the
//!   only code that talks to the API server is the executors (`attach::Executor`,
//!   `drives::Executor`), so the decisions are table-tested without a cluster and the
//!   executors are tested against a scripted fake API server.
//! - Nothing here touches a disk. The attacher knows no actors: publishing and
//!   unpublishing a volume go through the `attach::VolumeOps` trait, which the actor
//!   wiring implements by asking the VolumeManager. `drives::DriveSync` is the one actor
//!   here, and it only asks the inventory and the volume manager read-only queries.

/// The external-attacher: reconcile decisions, backoff and the executor of their actions.
pub mod attach;
/// The cluster-scoped `Drive` custom resource and its CRD manifest.
pub mod crd;
/// The sync of this node's `Drive` objects: names, desired objects, the plan of writes,
/// its executor and the `DriveSync` actor.
pub mod drives;

#[cfg(test)]
mod drives_fake_api_tests;
#[cfg(test)]
mod fake_api_tests;
