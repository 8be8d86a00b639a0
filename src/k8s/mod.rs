//! The Kubernetes front of drivelet, beside the gRPC front: the in-process
//! external-attacher, external-resizer and csi-snapshotter (controllers run by one
//! controller shell), Events about volume conditions and moves, the `Drive` custom
//! resource and its sync, node labels, re-homing of claims, and the cluster duties (one
//! elected agent looks after the objects of deleted nodes). Everything that talks to an
//! API server lives here, and nothing else does.
//!
//! Rules:
//! - A front, like `grpc/`: it talks to the core actors (inventory, volume manager) only
//!   by message, and `src/actors` never imports it. The controllers reach the volume
//!   manager through one handle, [`volume_manager::ManagerBackend`], for which each
//!   implements its own backend trait in its `backend.rs` (attach: `AttachVolume` /
//!   `DetachVolume`; resize: `ExpandVolume`, the message ControllerExpandVolume sends;
//!   snapshot: `CreateSnapshot` / `DeleteSnapshot` / `ListSnapshots` / `GetVolume`;
//!   the returned-node clean-up: `DetachVolume` / `DeleteVolume`; re-homing:
//!   `ListServedVolumes` / `SetBinding`); condition and move Events arrive as
//!   `VolumeConditionChanged` / `VolumeMoved` notifications the volume manager sends to a
//!   subscriber; the Drive sync reads the inventory and one view of the volume manager
//!   (`GetDriveView`).
//! - One way to run a loop that reconciles watched objects: the controller shell
//!   ([`shell`]) owns the watches, their relists, the work queue, readiness, resync and
//!   the retry policy ([`shell::RetryPolicy`], configured once by
//!   `kubernetes.retry_base` / `retry_cap` / `retry_terminal`); a controller
//!   (`attach::controller`, `resize::controller`, `snapshot::controller`) only says what
//!   it keeps, what a change queues and what a run does. Each controller is laid out
//!   alike: `mod.rs` the decisions, `controller.rs`, `executor.rs`, `backend.rs`, and its
//!   tests. A loop that runs another way says why in its module doc; all of them:
//!
//!   | loop | style | why not the shell |
//!   |---|---|---|
//!   | `attach::AttachQueue` | shell controller (VolumeAttachments, PVs) | it is the shell's |
//!   | `resize::ResizeQueue` | shell controller (claims, PVs) | it is the shell's |
//!   | `snapshot::SnapshotQueue` | shell controller (VolumeSnapshotContents, classes) | it is the shell's |
//!   | `drives` (the `DriveSync` actor) | own actor: one watch of this node's Drive objects, debounced writes from the local actors' state, retried with the shell's `RetryPolicy` | what it writes is the inventory's and the volume manager's state, not a reconcile of watched objects by key (see its module doc) |
//!   | `events::ConditionEvents` | actor fed by the volume manager's notifications | nothing is watched: each notification is a report, rate-gated per volume and best effort (retried once), not a key reconciled until done |
//!   | `events::moved::MoveEvents` | actor fed by the volume manager's notifications | as the condition Events: a notification in, one or two Events out, best effort |
//!   | `events::clones::CloneEvents` | actor fed by the volume manager's notifications | as the moves' Events: a notification in, one Event out (a refusal once per claim), best effort |
//!   | `duties::controller` | one task on a timer, behind a Lease election | only the elected agent acts, on the Lease's clock; a round decides over whole lists (every Node against every PV, attachment, Drive, claim), not per key; a clean shutdown gives the Lease up |
//!   | `duties::returned::run` | spawned task: once at start, then on a timer | one key of one ConfigMap, read at start and rechecked; nothing to watch cluster-wide |
//!   | `rehome::executor::run` | spawned task: asks the volume manager on a tick, a pass on change | its input is the volume manager's list of served volumes; a pass GETs the few PVs and claims it names, nothing is listed cluster-wide |
//!   | `capacity::controller::run` | spawned task: a StorageClass watch and the volume manager's view in, debounced writes of this node's CSIStorageCapacity objects, retried with [`shell::RetryPolicy`]'s backoff | what it writes is the volume manager's room per class, not a reconcile of watched objects by key; its own objects are listed, not watched |
//!   | `node::label_node` | spawned task: one write, retried with [`shell::RetryPolicy`]'s backoff until done | one object written once; no watch, no queue |
//!   | `auto_adopt::run` | spawned task on a timer | its input is the inventory's drives; the API is asked only whether an owner's Node exists, rarely |
//!   | `cluster_id::resolve` | awaited at start, its own short backoff | a start-up precondition the agent waits on (no drive is judged before it), with its own cut-over to the cached id after 10 s |
//!
//! - Decisions are pure functions over Kubernetes objects and domain values
//!   (`attach::reconcile`, `attach::reconcile_pv`, `resize::plan`, `snapshot::plan`,
//!   `events::gate`, `events::targets`, `rehome::decide`, `node::label_patch`,
//!   `auto_adopt::decide`, `capacity::wanted`, `capacity::plan`, `duties::election::decide`, `duties::plan`, and the Drive
//!   sync's plan); the only code that talks to the API server is in the executors
//!   (`attach::executor`, `resize::executor`, `snapshot::executor`, `events::reporter`,
//!   `rehome::executor`, `node::label_once`, `capacity::controller`, `duties::executor::Executor`,
//!   `duties::returned::reconcile_once`, the Drive sync's executor) and the watches of
//!   the shell and of the Drive sync, so the decisions are table-tested without a
//!   cluster and the executors are tested against the one scripted fake API server
//!   ([`fake_api`]).
//! - Errors are typed: each module's enum names the object of a failed API call, and
//!   [`KubeError`] is what they share (the client, the volume manager); no `String`.
//! - Nothing here touches a disk.
//! - Who drivelet is to the API server (driver, node, finalizer, Event reporter) is
//!   decided once, in [`identity`]; the loops of this front are started with the rest
//!   in `crate::supervisor::start`, only when `[kubernetes]` turns them on.

/// The external-attacher: reconcile decisions (mod.rs), the controller the shell runs
/// (the AttachQueue), the executor of the actions and the volume side.
pub(crate) mod attach;
/// This node's CSIStorageCapacity objects, one per StorageClass of the driver, written
/// in process from GetCapacity's answer when the volume manager's view changes.
pub(crate) mod capacity;
/// Adoption without a command: a disk of this cluster whose owner node was deleted.
pub mod auto_adopt;
/// Which cluster this node belongs to (the uid of `kube-system`), as its drives say.
pub mod cluster_id;
/// The cluster-scoped `Drive` custom resource and its CRD manifest.
pub(crate) mod crd;
/// Drive actions through the API: what a Drive's `spec.action` asks, what its status says.
pub(crate) mod drive_actions;
/// This node's own PVs, claims and pods, watched once and read by the Events, the Drive
/// sync and re-homing instead of requests.
pub(crate) mod cache;
/// Cluster duties: the Lease election of one agent that looks after deleted nodes'
/// objects, its decisions, executor and controller, and a returning node's clean-up.
pub(crate) mod duties;
/// The sync of this node's `Drive` objects, a file per concern: names, desired objects,
/// status, admin actions, the plan of writes, its executor and pods lookup, one sync and
/// the `DriveSync` loop (its `mod.rs` says which file holds what).
pub(crate) mod drives;
/// The front's own error: the API client, the volume manager asked by a controller.
pub mod error;
/// Rate-limited Events on a volume's claim and pods when its condition turns abnormal or
/// back to normal: the ConditionEvents actor, and a file per concern (the gate, the
/// report queue, who to tell, what is said, the reporter).
pub(crate) mod events;
/// Who drivelet is to the API server: driver, node, finalizer, Event reporter.
pub(crate) mod identity;
/// Labelling the Node with drivelet's topology segments.
pub(crate) mod node;
/// The API permissions drivelet needs, the table the deployment's RBAC is checked against.
pub mod rbac;
/// The relay: the elected agent labels each PV, claim, VolumeAttachment and
/// VolumeSnapshotContent of the driver with the node that holds it, so every node's own
/// watches are filtered by the API server.
pub(crate) mod relay;
/// Re-homing claims: the PVs of the volumes this node serves (an adopted drive's) pinned
/// to this node, bound to the same claims; decisions (mod.rs), the executor and its loop.
pub(crate) mod rehome;
/// The external-provisioner's part, in process: which claims this node makes and the
/// request and PV for each (mod.rs), the controller the shell runs (the ProvisionQueue),
/// the executor and the volume side (the CSI controller service, in process).
pub(crate) mod provision;
/// The external-resizer: decisions about a claim asking for more and the status it
/// writes (mod.rs), the controller the shell runs (the ResizeQueue), the executor and
/// the volume side.
pub(crate) mod resize;
/// The csi-snapshotter's part, in process: decisions about a VolumeSnapshotContent and
/// the patches it writes (mod.rs), the controller the shell runs (the SnapshotQueue), the
/// executor, the volume side and the snapshot objects.
pub(crate) mod snapshot;
/// Which objects a watch asks the API server for (this node's, by label or field), and
/// the counting of watch events.
pub(crate) mod scope;
/// The one controller shell: two watches with relists, the work queue, readiness,
/// resync, the workers and the retry policy, around a controller's decisions (attach,
/// resize, snapshot).
pub(crate) mod shell;
/// The VolumeManager as this front's controllers ask it (by message), and its readiness.
pub(crate) mod volume_manager;
/// A keyed work queue with dedup, one run per key at a time and per-key retry delays.
pub(crate) mod workqueue;

pub use error::KubeError;

/// The one fake API server of this front's tests (and of `kubectl drivelet`'s), and its
/// expectation helpers.
#[cfg(test)]
pub(crate) mod fake_api;

/// The API client `[kubernetes]` asks for: the kubeconfig file when one is named, else
/// the in-cluster service account (or `KUBECONFIG` / `~/.kube/config` outside a pod).
pub async fn client(cfg: &crate::config::KubernetesConfig) -> Result<kube::Client, KubeError> {
    let path = || cfg.kubeconfig.clone();
    let config = if cfg.kubeconfig.as_os_str().is_empty() {
        kube::Config::infer().await.map_err(|source| KubeError::NoConfig { source })?
    } else {
        let file = kube::config::Kubeconfig::read_from(&cfg.kubeconfig)
            .map_err(|source| KubeError::ReadKubeconfig { path: path(), source })?;
        kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|source| KubeError::Kubeconfig { path: path(), source })?
    };
    let builder = kube::client::ClientBuilder::try_from(config).map_err(|source| KubeError::Client { source })?;
    let counted = tower::util::MapRequestLayer::new(|req: http::Request<kube::client::Body>| {
        let (verb, resource) = request_kind(req.method(), req.uri());
        crate::metrics::metrics().record_kube_request(verb, resource);
        req
    });
    Ok(builder.with_layer(&counted).build())
}

/// The verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`) and resource
/// (`persistentvolumes`, `leases`) of an API request, for the request counter: read from
/// the path the client built (`/api/v1/namespaces/NS/pods/NAME`, `/apis/G/V/RESOURCE`),
/// so its values are the resources drivelet's code asks for, never a caller's.
pub(crate) fn request_kind(method: &http::Method, uri: &http::Uri) -> (&'static str, &'static str) {
    let mut parts = uri.path().trim_start_matches('/').split('/');
    let rest: Vec<&str> = match parts.next() {
        Some("api") => parts.skip(1).collect(),
        Some("apis") => parts.skip(2).collect(),
        _ => Vec::new(),
    };
    let rest = match rest.as_slice() {
        ["namespaces", _, more @ ..] if !more.is_empty() => more,
        all => all,
    };
    let resource = rest.first().map_or("other", |r| known_resource(r));
    let named = rest.len() > 1;
    let watch = uri.query().is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let verb = match *method {
        http::Method::GET if watch => "watch",
        http::Method::GET if named => "get",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "other",
    };
    (verb, resource)
}

/// The resource names the Kubernetes counters keep as they are; anything else is
/// `other`, so their series stay bounded whatever a path or a type's plural holds.
pub(crate) fn known_resource(r: &str) -> &'static str {
    const KNOWN: [&str; 20] = [
        "persistentvolumes",
        "persistentvolumeclaims",
        "volumeattachments",
        "volumesnapshotcontents",
        "volumesnapshotclasses",
        "volumesnapshots",
        "drives",
        "pods",
        "nodes",
        "leases",
        "events",
        "configmaps",
        "secrets",
        "namespaces",
        "storageclasses",
        "csistoragecapacities",
        "csinodes",
        "csidrivers",
        "customresourcedefinitions",
        "selfsubjectaccessreviews",
    ];
    KNOWN.iter().copied().find(|k| *k == r).unwrap_or("other")
}
