//! Which objects a watch asks the API server for: this node's only, or all of a
//! cluster-scoped setting. A node's cost grows with its own volumes, never with the
//! cluster's, so every per-node watch is filtered by the API server: by the label
//! `drivelet.io/node` ([`NODE_LABEL`]) that the elected agent's relay
//! (`crate::k8s::relay`) sets on each PV, claim, VolumeAttachment and
//! VolumeSnapshotContent of the driver, or by a field the server can select on (a pod's
//! `spec.nodeName`).
//!
//! Rules:
//! - A per-node list is served from the API server's watch cache (`resourceVersion=0`),
//!   so a node's start or relist costs the server O(its own objects), never a read of the
//!   whole collection from etcd; a cluster-wide list (the relay's, the elected agent's)
//!   is paginated (500 a page).
//! - Every watch event is counted (`drivelet_kube_watch_events_total`); one of a per-node
//!   watch for an object that does not carry this node's label is counted as foreign
//!   (`drivelet_kube_foreign_watch_events_total`), which stays 0 while the server filters.

use kube::runtime::watcher;
use kube::Resource;

pub(crate) use crate::k8s::drives::NODE_LABEL;
use crate::k8s::drives::node_label_value;

/// Which objects a watch asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scope {
    /// This node's objects only: those labelled [`NODE_LABEL`] with this value.
    Node(String),
    /// Pods scheduled to this node (`spec.nodeName`).
    NodePods(String),
    /// Every object: a cluster-scoped setting (VolumeSnapshotClasses, StorageClasses), or
    /// the elected agent's cluster-wide view.
    Cluster,
}

impl Scope {
    /// The objects of `node`, by the label the relay sets.
    pub(crate) fn node(node: &str) -> Self {
        Scope::Node(node_label_value(node))
    }

    /// The label selector of `node`'s objects, for a one-off list.
    pub(crate) fn selector(node: &str) -> String {
        format!("{NODE_LABEL}={}", node_label_value(node))
    }

    /// The watcher configuration of this scope.
    pub(crate) fn config(&self) -> watcher::Config {
        // A page limit would make the client drop `resourceVersion=0` (a paginated list
        // is served from etcd), so a node's list asks for no limit: the server answers
        // it from its watch cache, holding only the node's own objects.
        let own = |c: watcher::Config| watcher::Config { page_size: None, ..c.any_semantic() };
        match self {
            Scope::Node(value) => own(watcher::Config::default().labels(&format!("{NODE_LABEL}={value}"))),
            Scope::NodePods(node) => own(watcher::Config::default().fields(&format!("spec.nodeName={node}"))),
            Scope::Cluster => watcher::Config::default().page_size(500),
        }
    }

    /// Whether `object`, delivered by a watch of this scope, is another node's.
    pub(crate) fn foreign<K: Resource>(&self, object: &K) -> bool {
        match self {
            Scope::Node(value) => object.meta().labels.as_ref().and_then(|l| l.get(NODE_LABEL)) != Some(value),
            Scope::NodePods(_) | Scope::Cluster => false,
        }
    }
}

/// Counts a watch event of `scope` (see the module rules).
pub(crate) fn count<K: Resource<DynamicType = ()>>(event: &watcher::Event<K>, scope: &Scope) {
    let object = match event {
        watcher::Event::InitApply(o) | watcher::Event::Apply(o) | watcher::Event::Delete(o) => o,
        watcher::Event::Init | watcher::Event::InitDone => return,
    };
    crate::metrics::metrics().record_watch_event(super::known_resource(&K::plural(&())), scope.foreign(object));
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PersistentVolume;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pv(label: Option<&str>) -> PersistentVolume {
        let labels = label.map(|l| [(NODE_LABEL.to_string(), l.to_string())].into());
        PersistentVolume { metadata: ObjectMeta { name: Some("pv".into()), labels, ..Default::default() }, ..Default::default() }
    }

    #[test]
    fn a_node_watch_asks_the_server_for_the_nodes_label_from_its_cache() {
        let c = Scope::node("node-1").config();
        assert_eq!(c.label_selector.as_deref(), Some("drivelet.io/node=node-1"));
        assert_eq!((c.list_semantic, c.page_size), (watcher::ListSemantic::Any, None), "served from the watch cache");
        let c = Scope::Cluster.config();
        assert_eq!((c.label_selector, c.page_size), (None, Some(500)), "a cluster-wide list is paginated");
        let c = Scope::NodePods("node-1".into()).config();
        assert_eq!(c.field_selector.as_deref(), Some("spec.nodeName=node-1"));
    }

    #[test]
    fn an_object_without_this_nodes_label_is_foreign_to_a_node_watch() {
        let s = Scope::node("node-1");
        assert!(!s.foreign(&pv(Some("node-1"))));
        assert!(s.foreign(&pv(Some("node-2"))));
        assert!(s.foreign(&pv(None)));
        assert!(!Scope::Cluster.foreign(&pv(None)), "a cluster-wide watch has no foreign objects");
    }

    #[test]
    fn every_watched_kind_counts_under_its_own_resource() {
        use k8s_openapi::api::coordination::v1::Lease;
        use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolumeClaim, Pod};
        use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};

        use crate::k8s::crd::Drive;
        use crate::k8s::snapshot::objects::{VolumeSnapshotClass, VolumeSnapshotContent};

        fn resource<K: Resource<DynamicType = ()>>() -> &'static str {
            crate::k8s::known_resource(&K::plural(&()))
        }
        let got = [
            resource::<PersistentVolume>(),
            resource::<PersistentVolumeClaim>(),
            resource::<VolumeAttachment>(),
            resource::<VolumeSnapshotContent>(),
            resource::<VolumeSnapshotClass>(),
            resource::<Drive>(),
            resource::<Pod>(),
            resource::<Node>(),
            resource::<StorageClass>(),
            resource::<ConfigMap>(),
            resource::<Lease>(),
        ];
        let want = [
            "persistentvolumes",
            "persistentvolumeclaims",
            "volumeattachments",
            "volumesnapshotcontents",
            "volumesnapshotclasses",
            "drives",
            "pods",
            "nodes",
            "storageclasses",
            "configmaps",
            "leases",
        ];
        assert_eq!(got, want, "a watched kind missing from known_resource counts as `other`");
        assert_eq!(crate::k8s::known_resource("made-up-by-a-path"), "other");
    }
}
