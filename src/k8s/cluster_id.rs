//! Which cluster this node belongs to, as every drive it owns says
//! ([`crate::disk::note`]).
//!
//! Rules:
//! - the id is the uid of the cluster's `kube-system` namespace: made by the cluster
//!   itself, the same for every node, kept across reinstalls of drivelet (deleting
//!   drivelet's namespace does not change it) and new when the cluster is rebuilt
//!   (etcd lost), which is exactly when its disks must read as another cluster's;
//! - `driver.cluster_id` in the config overrides it (an admin who rebuilt a cluster and
//!   wants it to be the old one says so), and is the id without Kubernetes
//!   (`standalone` when unset);
//! - the last id read is kept in the state dir (`cluster-id`), so a node that starts
//!   while the API server is unreachable still knows whose its disks are; a node that
//!   never read it waits for the API server: it cannot tell its disks from another
//!   cluster's without it.
//! - Not a loop of the shell (`crate::k8s::shell`): [`resolve`] is awaited once at start,
//!   a precondition of the agent, with its own short backoff (200 ms doubling to 5 s)
//!   and the cut-over to the cached id after 10 s; the configured retry policy (seconds
//!   to minutes) is for loops that run beside the agent, not before it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use tracing::{info, warn};

/// The id a node without Kubernetes and without `driver.cluster_id` writes.
pub const STANDALONE: &str = "standalone";

/// The file in the state dir that keeps the last id read.
fn cache_in(state_dir: &Path) -> PathBuf {
    state_dir.join("cluster-id")
}

/// The id kept in the state dir, if one is (a UUID, else ignored).
fn cached(state_dir: &Path) -> Option<String> {
    let s = std::fs::read_to_string(cache_in(state_dir)).ok()?;
    let s = s.trim();
    uuid::Uuid::parse_str(s).ok().map(|_| s.to_string())
}

/// Keeps `id` in the state dir (written whole, then renamed over the old one).
fn keep(state_dir: &Path, id: &str) {
    let tmp = state_dir.join("cluster-id.tmp");
    let res = std::fs::write(&tmp, format!("{id}\n")).and_then(|_| std::fs::rename(&tmp, cache_in(state_dir)));
    if let Err(e) = res {
        warn!(error = %e, "cannot keep the cluster id in the state dir");
    }
}

/// The cluster id: the config's, else the `kube-system` namespace's uid (see the rules);
/// `client` is `None` without Kubernetes.
pub async fn resolve(configured: &str, client: Option<&kube::Client>, state_dir: &Path) -> String {
    if !configured.is_empty() {
        return configured.to_string();
    }
    let Some(client) = client else { return STANDALONE.to_string() };
    let api: Api<Namespace> = Api::all(client.clone());
    let mut waited = Duration::ZERO;
    let mut delay = Duration::from_millis(200);
    loop {
        match api.get("kube-system").await {
            Ok(ns) => match ns.metadata.uid {
                Some(uid) if !uid.is_empty() => {
                    if cached(state_dir).as_deref() != Some(uid.as_str()) {
                        info!(cluster.id = %uid, "this node belongs to cluster {uid} (the uid of its kube-system namespace)");
                        keep(state_dir, &uid);
                    }
                    return uid;
                }
                _ => warn!("the kube-system namespace has no uid; asking again"),
            },
            Err(e) => {
                if let Some(id) = cached(state_dir).filter(|_| waited >= Duration::from_secs(10)) {
                    warn!(error = %e, cluster.id = %id, "cannot read the cluster id from the API server; using the one this node read last");
                    return id;
                }
                if waited.as_secs() % 10 == 0 {
                    warn!(error = %e, "cannot read the cluster id (the uid of the kube-system namespace) yet; drives are judged once it is known");
                }
            }
        }
        tokio::time::sleep(delay).await;
        waited += delay;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn configured_and_standalone() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(resolve("my-cluster", None, dir.path()).await, "my-cluster");
        assert_eq!(resolve("", None, dir.path()).await, STANDALONE);
    }

    #[test]
    fn the_cache_keeps_only_a_uuid() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(cached(dir.path()), None);
        keep(dir.path(), "3c1b2f0e-5a6d-4c7e-9f10-2b3c4d5e6f70");
        assert_eq!(cached(dir.path()).as_deref(), Some("3c1b2f0e-5a6d-4c7e-9f10-2b3c4d5e6f70"));
        std::fs::write(dir.path().join("cluster-id"), "../../etc\n").unwrap();
        assert_eq!(cached(dir.path()), None);
    }
}
