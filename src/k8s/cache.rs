//! This node's own PVs, claims and pods, each watched once (filtered by the API server,
//! `crate::k8s::scope`) and kept in a reflector store that the loops which used to ask
//! the API server for them read instead: the condition and move Events (a volume's PV
//! and claim, the pods using it), the Drive sync (the pods of each volume) and re-homing
//! (a served volume's PV and claim). A lookup costs no request, and what the node holds
//! grows with its own volumes and pods only.
//!
//! Rules:
//! - PVs and claims by the relay's node label, pods by `spec.nodeName`; each store keeps
//!   objects stripped of managed fields (pods also of everything but their phase, node
//!   and claim volumes).
//! - A store answers only once its watch has listed ([`NodeCache::ready`]); before that
//!   (or when the watch cannot start) the readers ask the API server as they did.
//! - Something a store does not hold is not proof it does not exist: an object of this
//!   node not labelled yet, or a PV pinned to another node (re-homing's), is read by
//!   request where a reader must know.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, PodSpec, PodStatus, Volume};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use kube::{Client, Resource, ResourceExt};
use tokio_stream::StreamExt;

use crate::k8s::scope::{self, Scope};

/// This node's PVs, claims and pods (see the module rules).
#[derive(Clone)]
pub(crate) struct NodeCache {
    /// This node's PVs (labelled by the relay).
    pub pvs: Store<PersistentVolume>,
    /// This node's claims (labelled by the relay).
    pub claims: Store<PersistentVolumeClaim>,
    /// The pods scheduled to this node.
    pub pods: Store<Pod>,
}

fn strip<K: Resource>(o: &mut K) {
    let m = o.meta_mut();
    m.managed_fields = None;
    if let Some(a) = m.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// A pod reduced to what the readers ask of it: its phase, node and claim volumes.
fn strip_pod(p: &mut Pod) {
    strip(p);
    let spec = p.spec.take().unwrap_or_default();
    let volumes: Vec<Volume> = spec
        .volumes
        .unwrap_or_default()
        .into_iter()
        .filter(|v| v.persistent_volume_claim.is_some())
        .map(|v| Volume { name: v.name, persistent_volume_claim: v.persistent_volume_claim, ..Default::default() })
        .collect();
    p.spec = Some(PodSpec { node_name: spec.node_name, volumes: Some(volumes), containers: Vec::new(), ..Default::default() });
    p.status = p.status.take().map(|s| PodStatus { phase: s.phase, ..Default::default() });
}

/// Runs one watch of `scope` into `writer` until the process ends.
async fn keep<K>(api: Api<K>, scope: Scope, writer: reflector::store::Writer<K>, trim: fn(&mut K))
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let counted = scope.clone();
    let stream = watcher(api, scope.config())
        .default_backoff()
        .map(move |e: Result<watcher::Event<K>, watcher::Error>| {
            if let Ok(event) = &e {
                scope::count(event, &counted);
            }
            e
        })
        .modify(trim)
        .reflect(writer);
    let mut stream = Box::pin(stream);
    while let Some(item) = stream.next().await {
        if let Err(e) = item {
            tracing::debug!(resource = %K::plural(&()), error = %e, "a node cache watch failed; it restarts with backoff");
        }
    }
}

impl NodeCache {
    /// Starts the three watches of `node` (they run until the process ends).
    pub(crate) fn start(client: &Client, node: &str) -> Self {
        let (pvs, w) = reflector::store();
        tokio::spawn(keep(Api::<PersistentVolume>::all(client.clone()), Scope::node(node), w, strip));
        let (claims, w) = reflector::store();
        tokio::spawn(keep(Api::<PersistentVolumeClaim>::all(client.clone()), Scope::node(node), w, strip));
        let (pods, w) = reflector::store();
        tokio::spawn(keep(Api::<Pod>::all(client.clone()), Scope::NodePods(node.to_string()), w, strip_pod));
        Self { pvs, claims, pods }
    }

    /// Whether every store has listed.
    pub(crate) fn ready(&self) -> bool {
        futures_ready(&self.pvs) && futures_ready(&self.claims) && futures_ready(&self.pods)
    }

    /// The PV of `driver` with volume handle `handle`, if this node holds it.
    pub(crate) fn pv_of_volume(&self, driver: &str, handle: &str) -> Option<Arc<PersistentVolume>> {
        self.pvs.find(|pv| pv.spec.as_ref().and_then(|s| s.csi.as_ref()).is_some_and(|c| c.driver == driver && c.volume_handle == handle))
    }

    /// The PV named `name`, if this node holds it.
    pub(crate) fn pv(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.pvs.get(&ObjectRef::new(name))
    }

    /// The claim `namespace/name`, if this node holds it.
    pub(crate) fn claim(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.claims.get(&ObjectRef::new(name).within(namespace))
    }

    /// The pods scheduled to this node, optionally of one namespace.
    pub(crate) fn pods(&self, namespace: Option<&str>) -> Vec<Pod> {
        self.pods.state().iter().filter(|p| namespace.is_none_or(|ns| p.namespace().as_deref() == Some(ns))).map(|p| Pod::clone(p)).collect()
    }
}

/// Whether a store has listed, without waiting.
fn futures_ready<K: Resource<DynamicType = ()> + Clone + 'static>(s: &Store<K>) -> bool {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let mut wait = std::pin::pin!(s.wait_until_ready());
    matches!(wait.as_mut().poll(&mut Context::from_waker(Waker::noop())), Poll::Ready(Ok(())))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, PodStatus};
    use kube::runtime::watcher::Event;

    use super::*;

    #[test]
    fn a_pod_keeps_only_its_phase_node_and_claims() {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-0", "namespace": "apps", "managedFields": [{"manager": "kubelet"}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}],
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                                 {"name": "tmp", "emptyDir": {}}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1"},
        }))
        .unwrap();
        strip_pod(&mut p);
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        let claims: Vec<&PersistentVolumeClaimVolumeSource> = spec.volumes.iter().flatten().filter_map(|v| v.persistent_volume_claim.as_ref()).collect();
        assert_eq!((claims.len(), claims[0].claim_name.as_str()), (1, "data"));
        assert!(spec.containers.is_empty() && spec.volumes.as_ref().unwrap().len() == 1);
        assert_eq!(p.status, Some(PodStatus { phase: Some("Running".into()), ..Default::default() }));
        assert!(p.metadata.managed_fields.is_none());
    }

    #[test]
    fn a_store_answers_only_once_listed() {
        let (store, mut writer) = reflector::store::<Pod>();
        assert!(!futures_ready(&store));
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitDone);
        assert!(futures_ready(&store));
    }
}
