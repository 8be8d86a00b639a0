//! A node that comes back: the volumes whose PVs the cluster duties deleted while its Node
//! object was gone are deleted by its own agent.
//!
//! Rules:
//! - The agent reads its node's key of ConfigMap [`REMOVED_VOLUMES`] at start (once the
//!   volume manager serves), then watches the ConfigMap by name (the key may be written
//!   after the agent started, before its Node object is back) and reads it again only when
//!   the watch shows its key holding handles: no poll. Only the handles listed there are
//!   touched: a PV deleted while its claim said Delete, the user's intent.
//! - Each volume goes through the volume manager's normal path, as a ControllerUnpublish
//!   from this node and a DeleteVolume would (crash-safe, idempotent: a volume it no
//!   longer knows is done). A refusal (the volume still staged or mounted while kubelet
//!   cleans up its pods, a busy drive) keeps the handle for [`RETRY`] later.
//! - The deleted handles are then removed from the key (the key itself once empty), with
//!   a patch guarded by the resourceVersion read, so a handle the leader adds meanwhile is
//!   never lost. A crash between a delete and the patch only repeats a delete of a volume
//!   that is gone.
//! - Each deleted volume is logged with `node.name` and `volume.id`.
//! - A task spawned for the agent's life ([`run`]), not a controller of the shell
//!   (`crate::k8s::shell`): its input is one key of one ConfigMap, read at start and
//!   when its watch shows the key; there is nothing to watch cluster-wide and no key to
//!   queue.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Client, ResourceExt};
use tokio_stream::StreamExt;
use serde_json::{json, Value};
use tracing::{info, warn};

use super::executor::{handles, handles_text, DutyError};
use super::REMOVED_VOLUMES;
use crate::actors::volumes::{DeleteVolume, DetachVolume};
use crate::k8s::shell::Ready;
use crate::k8s::KubeError;
pub(crate) use crate::k8s::volume_manager::ManagerBackend;

/// How soon a volume that could not be deleted (or a failed read) is tried again.
pub(crate) const RETRY: Duration = Duration::from_secs(10);

/// The volume side: deleting one volume of this node.
pub(crate) trait RemovedBackend: Ready + Send + Sync + 'static {
    /// Detaches `volume_id` from `node` and deletes it; the error in plain words.
    fn delete(&self, volume_id: &str, node: &str) -> impl Future<Output = Result<(), KubeError>> + Send;
}

impl RemovedBackend for ManagerBackend {
    async fn delete(&self, volume_id: &str, node: &str) -> Result<(), KubeError> {
        let detach = DetachVolume { volume_id: volume_id.to_string(), node_id: Some(node.to_string()) };
        self.volumes().send(detach).await.map_err(KubeError::unanswered(volume_id))?.map_err(KubeError::volume(volume_id))?;
        let delete = DeleteVolume { volume_id: volume_id.to_string() };
        self.volumes().send(delete).await.map_err(KubeError::unanswered(volume_id))?.map_err(KubeError::volume(volume_id))
    }
}

/// Deletes `node`'s removed volumes now: answers how many are left to retry.
pub(crate) async fn reconcile_once<B: RemovedBackend>(
    client: &Client,
    namespace: &str,
    node: &str,
    backend: &B,
) -> Result<usize, DutyError> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let what = |doing: &str| format!("{doing} ConfigMap {namespace}/{REMOVED_VOLUMES}");
    let err = |doing: &'static str| move |source| DutyError::Api { what: what(doing), source };
    let Some(cm) = cms.get_opt(REMOVED_VOLUMES).await.map_err(err("reading"))? else { return Ok(0) };
    let listed = handles(cm.data.as_ref().and_then(|d| d.get(node)).map(String::as_str).unwrap_or(""));
    if listed.is_empty() {
        return Ok(0);
    }
    let (mut done, mut left) = (Vec::new(), Vec::new());
    for id in listed {
        match backend.delete(&id, node).await {
            Ok(()) => {
                info!(node.name = node, volume.id = %id,
                    "volume deleted: its PersistentVolume was deleted (reclaim policy Delete) while this node's Node object was gone");
                done.push(id);
            }
            Err(e) => {
                warn!(node.name = node, volume.id = %id, error = %e,
                    "cannot delete a volume whose PersistentVolume was deleted while this node was gone yet; retried in {}s", RETRY.as_secs());
                left.push(id);
            }
        }
    }
    if !done.is_empty() {
        let value = if left.is_empty() { Value::Null } else { json!(handles_text(&left)) };
        let patch = json!({"metadata": {"resourceVersion": cm.resource_version()}, "data": {node: value}});
        cms.patch(REMOVED_VOLUMES, &PatchParams::default(), &Patch::Merge(patch)).await.map_err(err("clearing this node's key of"))?;
    }
    Ok(left.len())
}

/// Runs for the agent's life: [`reconcile_once`] at start and every [`RECHECK`] (every
/// [`RETRY`] while something is left or failed).
pub(crate) async fn run<B: RemovedBackend>(client: Client, namespace: String, node: String, backend: B) {
    backend.wait_ready().await;
    let by_name = watcher::Config::default().fields(&format!("metadata.name={REMOVED_VOLUMES}")).any_semantic();
    let mut seen = Box::pin(watcher(Api::<ConfigMap>::namespaced(client.clone(), &namespace), by_name).default_backoff());
    // Read at start; then when the watch shows this node's key, or a retry is due.
    let mut due = Some(tokio::time::Instant::now());
    loop {
        let at = due.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            event = seen.next() => {
                if let Some(Ok(event)) = event {
                    crate::k8s::scope::count(&event, &crate::k8s::scope::Scope::Cluster);
                    if let Event::Apply(cm) | Event::InitApply(cm) = event {
                        if !handles(key_of(&cm, &node)).is_empty() {
                            due = Some(tokio::time::Instant::now());
                        }
                    }
                }
            }
            () = tokio::time::sleep_until(at), if due.is_some() => {
                due = match reconcile_once(&client, &namespace, &node, &backend).await {
                    Ok(0) => None,
                    Ok(_) => Some(tokio::time::Instant::now() + RETRY),
                    Err(e) => {
                        warn!(node.name = %node, error = %e, "cannot look for volumes removed while this node was gone; retried in {}s", RETRY.as_secs());
                        Some(tokio::time::Instant::now() + RETRY)
                    }
                };
            }
        }
    }
}

/// The value of `node`'s key in the ConfigMap, empty when it has none.
fn key_of<'a>(cm: &'a ConfigMap, node: &str) -> &'a str {
    cm.data.as_ref().and_then(|d| d.get(node)).map(String::as_str).unwrap_or("")
}
