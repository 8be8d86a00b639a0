//! The Kubernetes API permissions drivelet itself needs, as one table that the
//! deployment's RBAC is checked against (`tests/integration/cluster/deploy.rs` compares the `drivelet`
//! ClusterRole in `deploy/rbac.yaml` with the [`Scope::Cluster`] entries of
//! [`PERMISSIONS`], and the `drivelet` Role in drivelet's namespace with the
//! [`Scope::Namespace`] ones, both ways).
//!
//! Rules:
//! - One entry per (API group, resource); a subresource is its own resource
//!   (`volumeattachments/status`). Verbs are the ones the code's requests are authorized
//!   as, no more: a watch starts with a list, so a watched resource needs both; a
//!   server-side apply that may create the object needs `create` besides `patch`.
//! - Every entry names the code that makes the calls (`used_by`). A change to those calls
//!   changes this table, and the test then says which rule of the deployment to change.
//! - The pod runs no sidecar (provisioning is `k8s::provision`, in process), so this
//!   table is every rule the deployment grants.

/// Where a permission applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Everywhere: a ClusterRole.
    Cluster,
    /// Only in drivelet's own namespace: a Role there.
    Namespace,
}

/// One permission: the verbs drivelet uses on one resource of one API group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permission {
    /// Cluster-wide, or in drivelet's namespace only.
    pub scope: Scope,
    /// API group; `""` is the core group.
    pub group: &'static str,
    /// Resource name as in an RBAC rule, with `/subresource` for a subresource.
    pub resource: &'static str,
    /// Verbs, as in an RBAC rule.
    pub verbs: &'static [&'static str],
    /// The code that makes these calls.
    pub used_by: &'static str,
}

/// Everything drivelet asks of the API server with `[kubernetes] enabled = true` and
/// every integration on (attach, events, drive objects, node labels, cluster duties).
/// Nearly all of it is cluster-wide: VolumeAttachments, PersistentVolumes, Nodes, Drives
/// and StorageClasses are cluster-scoped, and the claims and pods an Event is about live
/// in any namespace. The cluster duties' Lease and ConfigMap live in drivelet's own
/// namespace.
pub const PERMISSIONS: &[Permission] = &[
    Permission {
        scope: Scope::Cluster,
        group: "storage.k8s.io",
        resource: "volumeattachments",
        verbs: &["list", "watch", "patch"],
        used_by: "k8s::shell (the AttachQueue's watcher: list, then watch) and k8s::attach::executor::Executor (finalizer merge patches); \
                  k8s::duties::executor::Executor (lists them, removes the attacher finalizer of a deleted node's)",
    },
    Permission {
        scope: Scope::Cluster,
        group: "storage.k8s.io",
        resource: "volumeattachments/status",
        verbs: &["patch"],
        used_by: "k8s::attach::executor::Executor (attached, attachmentMetadata, attachError, detachError)",
    },
    Permission {
        scope: Scope::Cluster,
        group: "",
        resource: "persistentvolumes",
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
        used_by: "k8s::shell (the AttachQueue's, ProvisionQueue's and ResizeQueue's watchers), \
                  k8s::provision::executor::Executor (creates the PV of a volume it made; gets a clone source's PV; \
                  a Released PV of a Delete class: its finalizer patched off, deleted), \
                  k8s::attach::executor::Executor (PV finalizer patches), k8s::resize::executor::Executor (spec.capacity \
                  merge patch after growing), k8s::events::reporter::ConditionReporter and k8s::events::moved::MoveEvents \
                  (list PVs to find a volume's claim), k8s::drives::Executor (gets the PV of a claim a pod of this node \
                  uses, for the pods of each volume in the Drive status), \
                  k8s::duties::executor::Executor (lists them; finalizer patches and delete of a deleted node's \
                  Released PVs), k8s::rehome::executor::Executor (gets the PV of each volume this node serves; \
                  replaces one pinned to another node: Retain patch, finalizer patch, delete, create pinned here; \
                  creates one that is gone)",
    },
    Permission {
        scope: Scope::Cluster,
        group: "",
        resource: "persistentvolumeclaims",
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
        used_by: "k8s::shell (the ProvisionQueue's and ResizeQueue's watchers: this node's claims, by the relay's label), \
                  k8s::provision::executor::Executor (gets a clone's source claim and a Released PV's claim; patches the \
                  selected-node annotation off a claim it hands back to the scheduler), \
                  k8s::cache::NodeCache (this node's claims, watched by the relay's label), \
                  k8s::relay (the elected agent's one cluster-wide watch; label-only patches naming each claim's node), \
                  k8s::drives::Executor (gets each claim a pod of this node uses, for the pods of each volume), \
                  k8s::duties::executor::Executor (lists the claims of a deleted node's PVs; deletes one whose \
                  StorageClass has drivelet.io/on-node-deleted: release-claims; annotates a kept one once it is \
                  warned, so the NodeDeleted Warning is recorded once per claim); \
                  k8s::rehome::executor::Executor (gets the claim of each volume this node serves; creates one that is \
                  gone when its drive's adoption asks to restore claims); \
                  k8s::duties::claim_executor::ClaimExecutor (lists claims; patches a waiting one's selected-node and \
                  drivelet.io/waiting-reason annotations); k8s::events::clones::CloneEvents (gets a clone's claim, for \
                  its Event)",
    },
    Permission {
        scope: Scope::Cluster,
        group: "",
        resource: "persistentvolumeclaims/status",
        verbs: &["patch"],
        used_by: "k8s::resize::executor::Executor (allocatedResources, allocatedResourceStatuses, resize conditions, \
                  capacity of a grown block volume)",
    },
    Permission {
        scope: Scope::Cluster,
        group: "",
        resource: "pods",
        verbs: &["list", "watch"],
        used_by: "k8s::cache::NodeCache (this node's pods, watched by field selector spec.nodeName), \
                  k8s::events::reporter::ConditionReporter (this node's pods in the claim's namespace, by field selector), \
                  k8s::drives::Executor (this node's pods in every namespace, by field selector: who uses each volume), \
                  k8s::duties::executor::Executor (pods of a claim that may be released)",
    },
    Permission {
        scope: Scope::Cluster,
        group: "events.k8s.io",
        resource: "events",
        verbs: &["create", "patch"],
        used_by: "kube::runtime::events::Recorder in k8s::attach, k8s::events, k8s::provision, k8s::resize, k8s::snapshot (on \
                  VolumeSnapshots and VolumeSnapshotContents), k8s::duties and k8s::rehome (on claims) (create; patch \
                  when a repeated Event becomes a series)",
    },
    Permission {
        scope: Scope::Cluster,
        group: "",
        resource: "nodes",
        verbs: &["get", "list", "watch", "patch"],
        used_by: "k8s::node::label_once (get, patch; only with kubernetes.label_node = true), \
                  k8s::capacity::controller (get, once: the Node's uid, the owner of its CSIStorageCapacity objects), \
                  k8s::relay::controller (the elected agent watches Node names, metadata only), \
                  k8s::duties::executor::Executor (get to confirm a node is deleted), \
                  k8s::duties::claim_executor::ClaimExecutor (list, paginated, while a claim waits: labels and readiness, \
                  to place an Immediate claim), \
                  k8s::auto_adopt (get: whether the owner node of a disk of this cluster is deleted; only with \
                  drives.adopt_from_deleted_nodes = true)",
    },
    Permission {
        scope: Scope::Cluster,
        group: "",
        resource: "namespaces",
        verbs: &["get"],
        used_by: "k8s::cluster_id::resolve (the uid of kube-system: the cluster id every drive this node owns names)",
    },
    Permission {
        scope: Scope::Cluster,
        group: "drivelet.io",
        resource: "drives",
        verbs: &["list", "watch", "create", "patch", "delete"],
        used_by: "Drive object sync (kubernetes.drive_objects): list by node label, server-side \
                  apply (patch, and create when the object is new), delete of stale objects, a watch \
                  of this node's objects so an admin's spec.action is acted on at once; \
                  k8s::duties::executor::Executor (list; delete of a deleted node's objects); \
                  k8s::rehome::executor::Executor (lists this node's objects: which adoptions restore claims)",
    },
    Permission {
        scope: Scope::Cluster,
        group: "drivelet.io",
        resource: "drives/status",
        verbs: &["patch"],
        used_by: "Drive object sync (kubernetes.drive_objects): server-side apply of the status",
    },
    Permission {
        scope: Scope::Cluster,
        group: "storage.k8s.io",
        resource: "storageclasses",
        verbs: &["get", "list", "watch"],
        used_by: "k8s::duties::executor::Executor (get: drivelet.io/on-node-deleted of a deleted node's claims), \
                  k8s::provision::executor::Executor (get: the class of a claim it makes), \
                  k8s::capacity::controller (watches every class, keeps the driver's: one CSIStorageCapacity each), \
                  k8s::relay (the elected agent watches the driver's classes: those of waiting claims, checked as \
                  CreateVolume checks them; binding mode and allowed topologies)",
    },
    Permission {
        scope: Scope::Cluster,
        group: "snapshot.storage.k8s.io",
        resource: "volumesnapshotcontents",
        verbs: &["get", "list", "watch", "patch"],
        used_by: "k8s::shell (the SnapshotQueue's watcher: list, then watch) and k8s::snapshot::executor::Executor \
                  (merge patches of the volumesnapshot-being-created annotation, the drivelet.io/node label and the \
                  snapshot-controller's finalizer once the snapshot is deleted); k8s::provision::executor::Executor \
                  (get: the snapshot handle of a claim's VolumeSnapshot to restore)",
    },
    Permission {
        scope: Scope::Cluster,
        group: "snapshot.storage.k8s.io",
        resource: "volumesnapshots",
        verbs: &["get"],
        used_by: "k8s::provision::executor::Executor (get: a claim's VolumeSnapshot to restore, its readiness and content)",
    },
    Permission {
        scope: Scope::Cluster,
        group: "snapshot.storage.k8s.io",
        resource: "volumesnapshotcontents/status",
        verbs: &["patch"],
        used_by: "k8s::snapshot::executor::Executor (snapshotHandle, creationTime, restoreSize, readyToUse, error; cleared \
                  when the snapshot is deleted)",
    },
    Permission {
        scope: Scope::Cluster,
        group: "snapshot.storage.k8s.io",
        resource: "volumesnapshotclasses",
        verbs: &["list", "watch"],
        used_by: "k8s::shell (the SnapshotQueue's watcher: the parameters a snapshot is taken with)",
    },
    Permission {
        scope: Scope::Namespace,
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "list", "watch", "create", "update"],
        used_by: "k8s::duties::controller::Controller (Lease drivelet-cluster-duties: watched by name, read after a \
                  conflict, created, taken, renewed, given up)",
    },
    Permission {
        scope: Scope::Namespace,
        group: "storage.k8s.io",
        resource: "csistoragecapacities",
        verbs: &["list", "create", "patch", "delete"],
        used_by: "k8s::capacity::controller (kubernetes.capacity: lists this node's own objects by its node label, \
                  creates one per StorageClass of the driver, merge-patches its capacity and maximumVolumeSize, deletes \
                  one of a class gone; once at start, lists and deletes the external-provisioner sidecar's objects of \
                  this node), k8s::duties::claim_executor::ClaimExecutor (each node's room per class, as the agents \
                  publish it, to place a claim of an Immediate class)",
    },
    Permission {
        scope: Scope::Namespace,
        group: "",
        resource: "configmaps",
        verbs: &["get", "list", "watch", "create", "patch"],
        used_by: "k8s::duties::executor::Executor (remembers removed volumes in drivelet-removed-volumes) and \
                  k8s::duties::returned (a returning node watches it by name, reads and clears its key)",
    },
];

/// What an admin who drives drive actions may do, and nothing else: the ClusterRole
/// `drivelet-drive-admin` in `deploy/rbac-drive-admin.yaml` (checked both ways by
/// `tests/integration/cluster/deploy.rs`). Read the Drive objects (`kubectl drivelet
/// drives|volumes`, `kubectl get drives`) and patch their spec (`spec.action`:
/// `kubectl drivelet drive cordon|uncordon|release`); never their status (the agents'),
/// never create or delete them.
pub const DRIVE_ADMIN: &[Permission] = &[Permission {
    scope: Scope::Cluster,
    group: "drivelet.io",
    resource: "drives",
    verbs: &["get", "list", "watch", "patch"],
    used_by: "cli::kubectl (kubectl drivelet: lists the Drive objects, merge-patches spec.action)",
}];

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn each_resource_appears_once_with_sorted_unique_known_verbs() {
        let known = ["get", "list", "watch", "create", "update", "patch", "delete"];
        let mut seen = BTreeSet::new();
        for p in PERMISSIONS {
            assert!(seen.insert((p.group, p.resource)), "{}/{} is listed twice", p.group, p.resource);
            let verbs: BTreeSet<&str> = p.verbs.iter().copied().collect();
            assert_eq!(verbs.len(), p.verbs.len(), "{}: a verb is repeated", p.resource);
            for v in p.verbs {
                assert!(known.contains(v), "{}: unknown verb {v}", p.resource);
            }
            assert!(!p.used_by.is_empty(), "{}: say which code makes the calls", p.resource);
        }
    }

    #[test]
    fn the_drive_admin_may_not_touch_a_drives_status() {
        assert!(DRIVE_ADMIN.iter().all(|p| p.resource == "drives" && !p.verbs.contains(&"create") && !p.verbs.contains(&"delete")));
    }

    /// The `.rs` files under `dir`, test files left out, with their module paths
    /// (`src/k8s/duties/executor.rs` is `k8s::duties::executor`).
    fn modules(dir: &std::path::Path, src: &std::path::Path, out: &mut Vec<(String, std::path::PathBuf)>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                modules(&path, src, out);
            } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
                let rel = path.strip_prefix(src).unwrap_or(&path).with_extension("");
                let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
                if parts.last().map(String::as_str) == Some("mod") {
                    parts.pop();
                }
                out.push((parts.join("::"), path));
            }
        }
    }

    /// For the kinds whose calls go through an `Api` typed by name (`Api<Node>`,
    /// `Api::<Node>`), every agent module that makes one is named in its row's `used_by`.
    /// The CLI (`src/cli`) runs with the admin's credentials, not this table's.
    #[test]
    fn every_module_that_calls_on_nodes_namespaces_leases_or_configmaps_is_named_in_its_row() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        modules(&src, &src, &mut files);
        assert!(files.iter().any(|(m, _)| m == "k8s::auto_adopt"), "the source tree is found");
        for (kind, resource) in [("Node", "nodes"), ("Namespace", "namespaces"), ("Lease", "leases"), ("ConfigMap", "configmaps")] {
            let row = PERMISSIONS.iter().find(|p| p.resource == resource).unwrap_or_else(|| panic!("{resource} has a row"));
            for (module, path) in files.iter().filter(|(m, _)| !m.starts_with("cli::") && !m.starts_with("k8s::rbac")) {
                let text = std::fs::read_to_string(path).unwrap_or_default();
                if text.contains(&format!("Api<{kind}>")) || text.contains(&format!("Api::<{kind}>")) {
                    assert!(row.used_by.contains(module.as_str()), "{module} calls the API on {resource}; the {resource} row's used_by does not name it");
                }
            }
        }
    }

    #[test]
    fn a_watched_resource_can_also_be_listed() {
        for p in PERMISSIONS.iter().chain(DRIVE_ADMIN).filter(|p| p.verbs.contains(&"watch")) {
            assert!(p.verbs.contains(&"list"), "{}: a watch starts with a list", p.resource);
        }
    }
}
