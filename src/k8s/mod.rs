//! Kubernetes side of drivelet: the in-process external-attacher and the `Drive` custom
//! resource.
//!
//! Rules:
//! - Decisions are pure functions over Kubernetes objects (`attach::reconcile`,
//!   `attach::reconcile_pv`); the only code that talks to the API server is the executor
//!   in `attach` (`Executor::apply`), so the decisions are table-tested without a cluster
//!   and the executor is tested against a scripted fake API server.
//! - Nothing here touches a disk or knows about actors: publishing and unpublishing a
//!   volume go through the `attach::VolumeOps` trait, which the actor wiring implements by
//!   asking the VolumeManager.

/// The external-attacher: reconcile decisions, backoff and the executor of their actions.
pub mod attach;
/// The cluster-scoped `Drive` custom resource and its CRD manifest.
pub mod crd;

#[cfg(test)]
mod fake_api_tests;
