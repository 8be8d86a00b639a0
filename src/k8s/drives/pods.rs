//! Which pods of this node use each volume: the pods by the claims they name
//! ([`claims_used`]), the claims by their PV's volume handle ([`pods_by_volume`]), and
//! the lookup against the API server with what it keeps between syncs (each PV's
//! handle, the last answer).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use kube::ResourceExt;
use tracing::warn;

use super::executor::Executor;

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

/// See [`Executor::pods`].
#[derive(Default)]
pub(crate) struct PodsCache {
    handles: BTreeMap<String, Option<String>>,
    last: BTreeMap<String, Vec<String>>,
}

impl Executor {
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
        // This node's cache, once listed, answers everything (no request); a claim or PV
        // it does not hold yet (not labelled yet) is read by request.
        let cache = self.cache.as_ref().filter(|c| c.ready());
        let pods = match cache {
            Some(c) => c.pods(None),
            None => {
                let pods: Api<Pod> = Api::all(self.client.clone());
                pods.list(&ListParams::default().fields(&format!("spec.nodeName={node}")).match_any()).await?.items
            }
        };
        let claims = claims_used(&pods, node);
        let mut handles: BTreeMap<(String, String), String> = BTreeMap::new();
        let mut seen: BTreeSet<String> = BTreeSet::new();
        for (ns, claim) in claims.keys() {
            let pvc = match cache.and_then(|c| c.claim(ns, claim)) {
                Some(pvc) => PersistentVolumeClaim::clone(&pvc),
                None => {
                    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
                    let Some(pvc) = pvcs.get_opt(claim).await? else { continue };
                    pvc
                }
            };
            let Some(pv_name) = pvc.spec.and_then(|s| s.volume_name).filter(|n| !n.is_empty()) else { continue };
            seen.insert(pv_name.clone());
            if let Some(pv) = cache.and_then(|c| c.pv(&pv_name)) {
                let csi = pv.spec.as_ref().and_then(|s| s.csi.as_ref()).filter(|c| self.driver.is_empty() || c.driver == self.driver);
                if let Some(c) = csi {
                    handles.insert((ns.clone(), claim.clone()), c.volume_handle.clone());
                }
                continue;
            }
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

}

#[cfg(test)]
mod tests {
    use super::*;
    use super::super::fixtures::*;

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
}
