//! The Kubernetes front of drivelet, beside the gRPC front: the in-process
//! external-attacher (the AttachQueue actor and its decisions), Events about volume
//! conditions, the `Drive` custom resource and its sync, node labels. Everything that
//! talks to an API server lives here, and nothing else does. With it, the cluster duties:
//! one elected agent looks after the objects of deleted nodes (`duties`).
//!
//! Rules:
//! - A front, like `grpc/`: it talks to the core actors (inventory, volume manager) only
//!   by message, and `src/actors` never imports it. The attach queue publishes and
//!   unpublishes through `attach::queue::ManagerBackend`, which sends the VolumeManager
//!   `AttachVolume` / `DetachVolume`; condition Events arrive as `VolumeConditionChanged`
//!   notifications the volume manager sends to a subscriber; the Drive sync asks
//!   read-only queries and takes notifications; the resize queue grows volumes through
//!   `resize::queue::ManagerBackend` (`ExpandVolume`, the message ControllerExpandVolume
//!   sends).
//! - Decisions are pure functions over Kubernetes objects and domain values
//!   (`attach::reconcile`, `attach::reconcile_pv`, `events::EventGate`,
//!   `events::find_claim`, `events::pods_using`, `drives::desired`, `drives::plan`,
//!   `node::label_patch`, `duties::election::decide`, `duties::plan`); the only code that
//!   talks to the API server is in the executors (`attach::Executor`,
//!   `events::ConditionReporter`, `drives::Executor`, `node::label_once`,
//!   `duties::executor::Executor`, `duties::returned::reconcile_once`) and the watches of the actors (`attach::queue::AttachQueue`,
//!   `events::ConditionEvents`, `drives::DriveSync`), so the decisions are table-tested
//!   without a cluster and the executors are tested against one scripted fake API server
//!   (`fake_api`).
//! - Nothing here touches a disk.
//! - Who drivelet is to the API server (driver, node, finalizer, Event reporter) is
//!   decided once, in [`identity`]; the actors of this front are started with the rest
//!   in `crate::supervisor::start`, only when `[kubernetes]` turns them on.

/// The external-attacher: reconcile decisions, the executor of their actions, and the
/// AttachQueue actor that runs them.
pub(crate) mod attach;
/// The cluster-scoped `Drive` custom resource and its CRD manifest.
pub(crate) mod crd;
/// Cluster duties: the Lease election of one agent that looks after deleted nodes'
/// objects, its decisions, executor and controller, and a returning node's clean-up.
pub(crate) mod duties;
/// The sync of this node's `Drive` objects: names, desired objects, the plan of writes,
/// its executor and the `DriveSync` actor.
pub(crate) mod drives;
/// Rate-limited Events on a volume's claim and pods when its condition turns abnormal or
/// back to normal.
pub(crate) mod events;
/// Who drivelet is to the API server: driver, node, finalizer, Event reporter.
pub(crate) mod identity;
/// Labelling the Node with drivelet's topology segments.
pub(crate) mod node;
/// The API permissions drivelet needs, the table the deployment's RBAC is checked against.
pub mod rbac;
/// The external-resizer: decisions about a claim asking for more, the status it writes,
/// and the ResizeQueue actor that runs them.
pub(crate) mod resize;
/// A keyed work queue with dedup, one run per key at a time and per-key retry delays.
pub(crate) mod workqueue;

#[cfg(test)]
mod drives_fake_api_tests;
#[cfg(test)]
mod events_fake_api_tests;
/// The one fake API server of this front's tests, and its expectation helpers.
#[cfg(test)]
pub(crate) mod fake_api;
#[cfg(test)]
mod fake_api_tests;

/// The API client `[kubernetes]` asks for: the kubeconfig file when one is named, else
/// the in-cluster service account (or `KUBECONFIG` / `~/.kube/config` outside a pod).
pub async fn client(cfg: &crate::config::KubernetesConfig) -> Result<kube::Client, String> {
    let config = if cfg.kubeconfig.as_os_str().is_empty() {
        kube::Config::infer().await.map_err(|e| format!("no in-cluster service account and no kubeconfig: {e}"))?
    } else {
        let file = kube::config::Kubeconfig::read_from(&cfg.kubeconfig)
            .map_err(|e| format!("cannot read kubernetes.kubeconfig {}: {e}", cfg.kubeconfig.display()))?;
        kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| format!("kubernetes.kubeconfig {}: {e}", cfg.kubeconfig.display()))?
    };
    kube::Client::try_from(config).map_err(|e| format!("cannot build the Kubernetes client: {e}"))
}
