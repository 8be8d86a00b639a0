//! The deployment in `deploy/` (`kubectl apply -k deploy/`), checked offline: the
//! manifests are parsed into the Kubernetes API types and held against drivelet's own
//! code (its config loader, its StorageClass parameter parser, its table of API
//! permissions), and `scripts/validate-deploy.sh` validates them against the
//! Kubernetes OpenAPI schemas. No cluster, no root.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use drivelet::config::Config;
use drivelet::grpc::params::VolumeParams;
use drivelet::k8s::rbac::{Scope, PERMISSIONS};
use drivelet::words::{LayoutKind, Media};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec, Volume, VolumeMount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_norway::Value;

const NAMESPACE: &str = "drivelet-system";
const SERVICE_ACCOUNT: &str = "drivelet";
const HTTP_PORT: i32 = 9808;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

/// Every object of a manifest file, in order.
fn documents(file: &str) -> Vec<Value> {
    let path = deploy_dir().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("parse {}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

/// The objects of `kind` in `file`, as API types.
fn objects<K: DeserializeOwned>(file: &str, kind: &str) -> Vec<K> {
    documents(file)
        .into_iter()
        .filter(|v| v["kind"].as_str() == Some(kind))
        .map(|v| serde_norway::from_value(v).unwrap_or_else(|e| panic!("{file}: a {kind} does not parse: {e}")))
        .collect()
}

/// The one object of `kind` named `name` in `file`.
fn object<K: DeserializeOwned + k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>>(
    file: &str,
    kind: &str,
    name: &str,
) -> K {
    let mut found: Vec<K> = objects::<K>(file, kind)
        .into_iter()
        .filter(|o| o.metadata().name.as_deref() == Some(name))
        .collect();
    assert_eq!(found.len(), 1, "{file}: expected exactly one {kind} named {name}");
    found.remove(0)
}

fn daemonset() -> DaemonSet {
    object("daemonset.yaml", "DaemonSet", "drivelet")
}

fn pod_spec(ds: &DaemonSet) -> PodSpec {
    ds.spec.template.spec.clone().expect("the DaemonSet has a pod template spec")
}

fn container(pod: &PodSpec, name: &str) -> Container {
    pod.containers.iter().find(|c| c.name == name).cloned().unwrap_or_else(|| panic!("no container {name}"))
}

fn mount(c: &Container, name: &str) -> VolumeMount {
    c.volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == name)
        .cloned()
        .unwrap_or_else(|| panic!("container {} does not mount volume {name}", c.name))
}

fn volume(pod: &PodSpec, name: &str) -> Volume {
    pod.volumes.iter().flatten().find(|v| v.name == name).cloned().unwrap_or_else(|| panic!("no volume {name}"))
}

/// `(host path, hostPath type)` of a hostPath volume.
fn host_path(pod: &PodSpec, name: &str) -> (PathBuf, String) {
    let hp = volume(pod, name).host_path.unwrap_or_else(|| panic!("volume {name} is not a hostPath"));
    (PathBuf::from(hp.path), hp.type_.unwrap_or_default())
}

/// The volume mounted at the deepest mount point of `c` that contains `path`.
fn mount_holding(c: &Container, path: &Path) -> VolumeMount {
    c.volume_mounts
        .iter()
        .flatten()
        .filter(|m| path.starts_with(&m.mount_path))
        .max_by_key(|m| m.mount_path.len())
        .cloned()
        .unwrap_or_else(|| panic!("no mount of container {} holds {}", c.name, path.display()))
}

fn field_ref(env: &[EnvVar], name: &str) -> Option<String> {
    env.iter()
        .find(|e| e.name == name)
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.clone())
}

/// The value of `--flag=value` among a container's args.
fn arg(c: &Container, flag: &str) -> Option<String> {
    let prefix = format!("{flag}=");
    c.args.iter().flatten().find_map(|a| a.strip_prefix(&prefix).map(str::to_string))
}

fn load_config_text(text: &str) -> Result<Config, drivelet::config::ConfigError> {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("drivelet.toml");
    std::fs::write(&path, text).expect("write config");
    Config::load(Some(&path))
}

/// The ConfigMap's drivelet.toml through drivelet's own loader and validation, and the
/// `[http] address` it serves probes on.
fn deploy_config() -> (Config, String) {
    let path = deploy_dir().join("drivelet.toml");
    let text = std::fs::read_to_string(&path).expect("read deploy/drivelet.toml");
    let cfg = load_config_text(&text).unwrap_or_else(|e| panic!("deploy/drivelet.toml is not a valid drivelet config: {e}"));
    let address = cfg.http.address.clone();
    (cfg, address)
}

fn grants(rules: &[PolicyRule]) -> BTreeMap<(String, String), BTreeSet<String>> {
    let mut out: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for rule in rules {
        assert!(rule.resource_names.is_none(), "a rule limited to named objects: {rule:?}");
        assert!(rule.non_resource_urls.is_none(), "a non-resource rule: {rule:?}");
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                assert!(group != "*" && resource != "*", "a wildcard rule: {rule:?}");
                assert!(!rule.verbs.iter().any(|v| v == "*"), "a wildcard verb: {rule:?}");
                out.entry((group.clone(), resource.clone())).or_default().extend(rule.verbs.iter().cloned());
            }
        }
    }
    out
}

fn table(entries: &[(&str, &str, &[&str])]) -> BTreeMap<(String, String), BTreeSet<String>> {
    entries
        .iter()
        .map(|(g, r, verbs)| ((g.to_string(), r.to_string()), verbs.iter().map(|v| v.to_string()).collect()))
        .collect()
}

#[test]
fn drivelet_container_is_privileged_with_the_host_mounts_it_needs() {
    let pod = pod_spec(&daemonset());
    let c = container(&pod, "drivelet");
    let sc = c.security_context.clone().expect("drivelet has a security context");
    assert_eq!(sc.privileged, Some(true), "mount(2), BLKPG and every block device need a privileged container");
    assert_eq!(pod.host_network, Some(true), "udev's events reach only the host's network namespace");
    assert_eq!(pod.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"), "cluster DNS with the host's network");
    assert_ne!(pod.host_pid, Some(true));

    for (volume_name, path, read_only) in [("dev", "/dev", false), ("sys", "/sys", true), ("udev", "/run/udev", true)] {
        let m = mount(&c, volume_name);
        assert_eq!(m.mount_path, path, "{volume_name} is mounted where drivelet looks");
        assert_eq!(m.read_only.unwrap_or(false), read_only, "{volume_name} read-only");
        assert_eq!(host_path(&pod, volume_name).0, PathBuf::from(path), "{volume_name} is the host's {path}");
    }

    let (cfg, _) = deploy_config();
    let kubelet = mount(&c, "kubelet-dir");
    assert_eq!(
        kubelet.mount_propagation.as_deref(),
        Some("Bidirectional"),
        "staging and publish mounts must reach the host"
    );
    assert_eq!(PathBuf::from(&kubelet.mount_path), cfg.kubelet.dir, "the kubelet dir is mounted at kubelet.dir");
    assert_eq!(host_path(&pod, "kubelet-dir").0, cfg.kubelet.dir, "kubelet hands out host paths: same path inside");
    for m in c.volume_mounts.iter().flatten().filter(|m| m.name != "kubelet-dir") {
        assert!(
            !Path::new(&m.mount_path).starts_with(&kubelet.mount_path),
            "{} is mounted inside the Bidirectional kubelet mount; its bind mount would propagate to the host",
            m.mount_path
        );
    }

    let state = mount(&c, "state");
    assert_eq!(PathBuf::from(&state.mount_path), cfg.paths.state_dir);
    assert_eq!(host_path(&pod, "state"), (cfg.paths.state_dir.clone(), "DirectoryOrCreate".to_string()));
}

#[test]
fn the_pod_is_confined_to_what_each_container_needs() {
    let pod = pod_spec(&daemonset());
    let (cfg, _) = deploy_config();

    // Seccomp: nothing runs Unconfined. The runtime's default profile for the pod (a
    // privileged container gets none from its runtime), and drivelet's own filter.
    let profile = |sc: Option<&k8s_openapi::api::core::v1::SeccompProfile>| sc.map(|p| p.type_.clone());
    assert_eq!(
        profile(pod.security_context.as_ref().and_then(|s| s.seccomp_profile.as_ref())).as_deref(),
        Some("RuntimeDefault")
    );
    for c in &pod.containers {
        let own = profile(c.security_context.as_ref().and_then(|s| s.seccomp_profile.as_ref()));
        assert_ne!(own.as_deref(), Some("Unconfined"), "{} runs Unconfined", c.name);
    }
    assert_eq!(cfg.security.seccomp, drivelet::seccomp::SeccompMode::Enforce, "drivelet's own filter is on");

    // A read-only root for both; every path drivelet writes is on a writable volume.
    let drivelet = container(&pod, "drivelet");
    let sc = drivelet.security_context.clone().expect("drivelet has a security context");
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.run_as_user, Some(0), "root owns the device nodes and kubelet's directories");
    for path in [
        cfg.paths.state_dir.clone(),
        cfg.paths.admin_socket.clone(),
        cfg.paths.csi_socket.clone(),
        cfg.registration_socket(),
        PathBuf::from("/tmp/drivelet-xfs_copy.log"),
    ] {
        let m = mount_holding(&drivelet, &path);
        assert!(!m.read_only.unwrap_or(false), "{} is on the read-only mount {}", path.display(), m.mount_path);
    }
    for (name, at) in [("run", "/run/drivelet"), ("tmp", "/tmp")] {
        assert_eq!(mount(&drivelet, name).mount_path, at);
        assert!(volume(&pod, name).empty_dir.is_some(), "{name} is the pod's own (emptyDir)");
    }

    // One container: provisioning, capacity, attaching, resizing and snapshots are
    // drivelet's own, in process.
    let names: Vec<&str> = pod.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["drivelet"], "the pod runs drivelet alone, no sidecar");
    assert!(pod.init_containers.is_none(), "no init containers");

    // drivelet calls the API server, so it gets the token; the pod shares no host
    // namespace but the network (udev's events).
    assert_eq!(pod.automount_service_account_token, Some(true));
    assert_ne!(pod.host_pid, Some(true));
    assert_ne!(pod.host_ipc, Some(true));
}

#[test]
fn node_name_comes_from_the_downward_api() {
    let pod = pod_spec(&daemonset());
    for name in ["drivelet"] {
        let c = container(&pod, name);
        assert_eq!(field_ref(c.env.as_deref().unwrap_or_default(), "NODE_NAME").as_deref(), Some("spec.nodeName"), "{name}");
    }
    let (cfg, _) = deploy_config();
    assert!(cfg.kubernetes.enabled && cfg.kubelet.registration);
}

#[test]
fn the_cluster_duties_run_in_the_pods_own_namespace() {
    let pod = pod_spec(&daemonset());
    let c = container(&pod, "drivelet");
    let env = c.env.clone().unwrap_or_default();
    assert_eq!(field_ref(&env, "DRIVELET__KUBERNETES__NAMESPACE").as_deref(), Some("metadata.namespace"));
    let (cfg, _) = deploy_config();
    assert!(cfg.kubernetes.cluster_duties, "the DaemonSet's agents stand for the cluster duties");
}

#[test]
fn probes_ask_healthz_and_readyz_on_the_http_port_the_config_serves() {
    let pod = pod_spec(&daemonset());
    let c = container(&pod, "drivelet");
    let port = c.ports.iter().flatten().find(|p| p.name.as_deref() == Some("http")).expect("a port named http");
    assert_eq!(port.container_port, HTTP_PORT);
    assert_eq!(port.protocol.as_deref().unwrap_or("TCP"), "TCP");
    for (probe, path) in [(&c.liveness_probe, "/healthz"), (&c.readiness_probe, "/readyz")] {
        let get = probe.as_ref().and_then(|p| p.http_get.as_ref()).unwrap_or_else(|| panic!("an httpGet probe on {path}"));
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(get.port, IntOrString::String("http".into()));
    }
    let (_, address) = deploy_config();
    let served: std::net::SocketAddr = address.parse().expect("[http] address is host:port");
    assert_eq!(served.port() as i32, HTTP_PORT, "drivelet serves the probes on the container port");
    assert!(served.ip().is_unspecified(), "kubelet probes the pod IP, so drivelet listens on every address");
}

#[test]
fn drivelet_requests_little_and_limits_only_memory() {
    let pod = pod_spec(&daemonset());
    let res = container(&pod, "drivelet").resources.expect("resources");
    let q = |m: &Option<BTreeMap<String, Quantity>>, k: &str| m.as_ref().and_then(|m| m.get(k)).map(|q| q.0.clone());
    assert_eq!(q(&res.requests, "memory").as_deref(), Some("32Mi"));
    assert_eq!(q(&res.requests, "cpu").as_deref(), Some("10m"));
    assert_eq!(q(&res.limits, "memory").as_deref(), Some("128Mi"));
    assert_eq!(q(&res.limits, "cpu"), None, "no CPU limit: mkfs and fsck bursts are not throttled");
}

#[test]
fn deploy_config_is_valid_and_its_sockets_match_the_mounts() {
    let (cfg, _) = deploy_config();
    let pod = pod_spec(&daemonset());
    let drivelet = container(&pod, "drivelet");

    // The CSI socket lies in the plugin directory kubelet dials (drivelet makes the
    // directory), reached through the kubelet mount.
    let socket = &cfg.paths.csi_socket;
    assert_eq!(mount_holding(&drivelet, socket).name, "kubelet-dir");
    assert_eq!(socket.parent(), Some(cfg.kubelet.dir.join("plugins").join(&cfg.driver.name).as_path()));

    // Kubelet finds the registration socket in its plugins_registry, inside the mount.
    let reg = cfg.registration_socket();
    assert!(reg.starts_with(cfg.kubelet.dir.join("plugins_registry")));
    assert_eq!(mount_holding(&drivelet, &reg).name, "kubelet-dir");

    // Staging and target paths are under the kubelet dir, which drivelet may use.
    assert!(cfg.volumes.allowed_roots.contains(&cfg.kubelet.dir));
    // The admin socket stays in the container.
    assert!(!cfg.paths.admin_socket.starts_with(&cfg.kubelet.dir));
    assert!(!cfg.paths.admin_socket.starts_with(&cfg.paths.state_dir));

    // The ConfigMap is mounted where the container's args point.
    let config_mount = mount(&drivelet, "config");
    assert_eq!(config_mount.read_only, Some(true));
    let config_file = Path::new(&config_mount.mount_path).join("drivelet.toml");
    let args: Vec<&str> = drivelet.args.iter().flatten().map(String::as_str).collect();
    assert_eq!(args, ["run", "--config", config_file.to_str().expect("utf-8 path")]);
}

#[test]
fn csidriver_matches_the_driver_and_its_in_process_attacher() {
    let (cfg, _) = deploy_config();
    let driver: CSIDriver = object("csidriver.yaml", "CSIDriver", &cfg.driver.name);
    let spec = driver.spec;
    assert_eq!(spec.attach_required, Some(true), "VolumeAttachments go to drivelet's in-process attacher");
    assert_eq!(spec.pod_info_on_mount, Some(true));
    assert_eq!(spec.storage_capacity, Some(true));
    assert_eq!(spec.fs_group_policy.as_deref(), Some("File"));
    assert_eq!(spec.volume_lifecycle_modes, Some(vec!["Persistent".to_string()]));
    assert_eq!(spec.requires_republish, Some(false));
}

#[test]
fn storage_classes_use_only_parameters_create_volume_accepts() {
    let (cfg, _) = deploy_config();
    let classes: Vec<StorageClass> = objects("storageclasses.yaml", "StorageClass");
    let mut kinds = BTreeSet::new();
    for sc in &classes {
        let name = sc.metadata.name.clone().unwrap_or_default();
        assert_eq!(sc.provisioner, cfg.driver.name, "{name}");
        assert_eq!(sc.volume_binding_mode.as_deref(), Some("WaitForFirstConsumer"), "{name}");
        assert_eq!(sc.reclaim_policy.as_deref(), Some("Delete"), "{name}");
        assert_eq!(sc.allow_volume_expansion, Some(true), "{name}: claims grow through the in-process resizer");
        let params: HashMap<String, String> = sc.parameters.clone().unwrap_or_default().into_iter().collect();
        let parsed = VolumeParams::parse(&params).unwrap_or_else(|e| panic!("{name}: CreateVolume refuses {params:?}: {e}"));
        kinds.insert((parsed.media.map(Media::as_str), parsed.layout == LayoutKind::Drive));
    }
    let want: BTreeSet<(Option<&str>, bool)> =
        [(Some("hdd"), false), (Some("ssd"), false), (Some("nvme"), false), (None, true)].into_iter().collect();
    assert_eq!(kinds, want, "one class per media, one for whole drives");
    assert_eq!(classes.len(), want.len());
}

#[test]
fn snapshot_classes_are_drivelets_with_one_default_and_one_that_freezes() {
    let (cfg, _) = deploy_config();
    let k = &documents("snapshots/kustomization.yaml")[0];
    let resources: Vec<&str> = k["resources"].as_sequence().expect("resources").iter().filter_map(|r| r.as_str()).collect();
    assert_eq!(resources, ["snapshotclasses.yaml"]);
    let classes = documents("snapshots/snapshotclasses.yaml");
    let mut seen = BTreeMap::new();
    for c in &classes {
        let name = c["metadata"]["name"].as_str().unwrap_or_default().to_string();
        assert_eq!((c["apiVersion"].as_str(), c["kind"].as_str()), (Some("snapshot.storage.k8s.io/v1"), Some("VolumeSnapshotClass")), "{name}");
        assert_eq!(c["driver"].as_str(), Some(cfg.driver.name.as_str()), "{name}");
        assert_eq!(c["deletionPolicy"].as_str(), Some("Delete"), "{name}: deleting a VolumeSnapshot frees its space");
        let params: BTreeMap<String, String> = serde_norway::from_value(c["parameters"].clone()).unwrap_or_default();
        let freeze = drivelet::actors::volumes::snapshot::wants_freeze(&params).unwrap_or_else(|e| panic!("{name}: CreateSnapshot refuses {params:?}: {e}"));
        let default = c["metadata"]["annotations"]["snapshot.storage.kubernetes.io/is-default-class"].as_str() == Some("true");
        seen.insert(name, (default, freeze));
    }
    let want: BTreeMap<String, (bool, bool)> =
        [("drivelet-snapshot".to_string(), (true, false)), ("drivelet-snapshot-freeze".to_string(), (false, true))].into();
    assert_eq!(seen, want, "a default class without a freeze, and one with it");
}

/// The entries of the permissions table of `scope`, as RBAC grants.
fn permissions(scope: Scope) -> BTreeMap<(String, String), BTreeSet<String>> {
    PERMISSIONS
        .iter()
        .filter(|p| p.scope == scope)
        .map(|p| ((p.group.to_string(), p.resource.to_string()), p.verbs.iter().map(|v| v.to_string()).collect()))
        .collect()
}

fn assert_grants_exactly(what: &str, rules: &[PolicyRule], want: &BTreeMap<(String, String), BTreeSet<String>>) {
    let have = grants(rules);
    for (key, verbs) in want {
        assert_eq!(have.get(key), Some(verbs), "deploy/rbac.yaml {what}, {key:?}: src/k8s/rbac.rs wants {verbs:?}");
    }
    for (key, verbs) in &have {
        assert!(want.contains_key(key), "deploy/rbac.yaml {what} grants {key:?} {verbs:?}, which src/k8s/rbac.rs does not list");
    }
}

#[test]
fn drivelet_cluster_role_grants_exactly_the_permissions_table() {
    let role: ClusterRole = object("rbac.yaml", "ClusterRole", "drivelet");
    assert_grants_exactly("ClusterRole drivelet", role.rules.as_deref().unwrap_or_default(), &permissions(Scope::Cluster));
}

#[test]
fn drive_admin_cluster_role_grants_exactly_the_drive_admin_table_and_is_bound_to_no_one() {
    let role: ClusterRole = object("rbac-drive-admin.yaml", "ClusterRole", "drivelet-drive-admin");
    let want = drivelet::k8s::rbac::DRIVE_ADMIN
        .iter()
        .map(|p| ((p.group.to_string(), p.resource.to_string()), p.verbs.iter().map(|v| v.to_string()).collect()))
        .collect();
    assert_grants_exactly("ClusterRole drivelet-drive-admin", role.rules.as_deref().unwrap_or_default(), &want);
    assert!(!grants(role.rules.as_deref().unwrap_or_default()).contains_key(&("drivelet.io".into(), "drives/status".into())));
    assert!(
        documents("rbac-drive-admin.yaml").iter().all(|d| d["kind"].as_str() == Some("ClusterRole")),
        "binding it is the operators' choice: the file holds the role alone"
    );
}

#[test]
fn drivelet_role_grants_exactly_the_namespaced_permissions_in_its_namespace() {
    let role: Role = object("rbac.yaml", "Role", "drivelet");
    assert_eq!(role.metadata.namespace.as_deref(), Some(NAMESPACE));
    let want = permissions(Scope::Namespace);
    assert!(!want.is_empty());
    assert_grants_exactly("Role drivelet", role.rules.as_deref().unwrap_or_default(), &want);
    let (cfg, _) = deploy_config();
    assert_eq!(cfg.kubernetes.namespace, NAMESPACE, "the Lease and ConfigMap live where the Role grants them");
}

#[test]
fn no_role_is_left_for_a_sidecar() {
    let cluster: Vec<ClusterRole> = objects("rbac.yaml", "ClusterRole");
    let names: Vec<String> = cluster.iter().filter_map(|r| r.metadata.name.clone()).collect();
    assert_eq!(names, ["drivelet"], "only drivelet's own ClusterRole");
    let roles: Vec<Role> = objects("rbac.yaml", "Role");
    let names: Vec<String> = roles.iter().filter_map(|r| r.metadata.name.clone()).collect();
    assert_eq!(names, ["drivelet"], "only drivelet's own Role");
}

#[test]
fn bindings_give_the_daemonsets_service_account_every_role() {
    let pod = pod_spec(&daemonset());
    assert_eq!(pod.service_account_name.as_deref(), Some(SERVICE_ACCOUNT));
    let sa: k8s_openapi::api::core::v1::ServiceAccount = object("rbac.yaml", "ServiceAccount", SERVICE_ACCOUNT);
    assert_eq!(sa.metadata.namespace.as_deref(), Some(NAMESPACE));

    let bound_to_us = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        subjects.iter().flatten().any(|s| {
            s.kind == "ServiceAccount" && s.name == SERVICE_ACCOUNT && s.namespace.as_deref() == Some(NAMESPACE)
        })
    };
    let cluster_bindings: Vec<ClusterRoleBinding> = objects("rbac.yaml", "ClusterRoleBinding");
    for role in ["drivelet"] {
        assert!(
            cluster_bindings.iter().any(|b| b.role_ref.kind == "ClusterRole" && b.role_ref.name == role && bound_to_us(&b.subjects)),
            "ClusterRole {role} is bound to the ServiceAccount"
        );
    }
    let bindings: Vec<RoleBinding> = objects("rbac.yaml", "RoleBinding");
    for role in ["drivelet"] {
        assert!(
            bindings.iter().any(|b| b.metadata.namespace.as_deref() == Some(NAMESPACE)
                && b.role_ref.kind == "Role"
                && b.role_ref.name == role
                && bound_to_us(&b.subjects)),
            "Role {role} is bound to the ServiceAccount"
        );
    }
}

#[test]
fn the_agent_provisions_and_publishes_capacity_in_process() {
    let (cfg, _) = deploy_config();
    assert!(cfg.kubernetes.provision, "kubernetes.provision: the claims of each node are made by its agent");
    assert!(cfg.kubernetes.capacity, "kubernetes.capacity: each agent publishes its CSIStorageCapacity objects");
    assert!(cfg.kubernetes.attach && cfg.kubernetes.resize && cfg.kubernetes.snapshots);
}

#[test]
fn pod_tolerates_every_taint_runs_node_critical_and_rolls_one_node_at_a_time() {
    let ds = daemonset();
    assert_eq!(ds.metadata.namespace.as_deref(), Some(NAMESPACE));
    let pod = pod_spec(&ds);
    assert_eq!(pod.priority_class_name.as_deref(), Some("system-node-critical"));
    assert_eq!(pod.termination_grace_period_seconds, Some(30));
    let tolerations = pod.tolerations.clone().unwrap_or_default();
    assert!(
        tolerations.iter().any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none() && t.effect.is_none()),
        "a toleration of every taint: {tolerations:?}"
    );
    let strategy = ds.spec.update_strategy.expect("an update strategy");
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    assert_eq!(strategy.rolling_update.and_then(|r| r.max_unavailable), Some(IntOrString::Int(1)));
}

#[test]
fn kustomization_lists_every_manifest_generates_the_config_and_sets_the_image() {
    let k = &documents("kustomization.yaml")[0];
    assert_eq!(k["namespace"].as_str(), Some(NAMESPACE));
    let resources: BTreeSet<String> =
        k["resources"].as_sequence().expect("resources").iter().filter_map(|r| r.as_str().map(str::to_string)).collect();
    let manifests: BTreeSet<String> = std::fs::read_dir(deploy_dir())
        .expect("list deploy/")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    assert_eq!(resources, manifests, "kustomization.yaml resources are every manifest in deploy/");

    let generators = k["configMapGenerator"].as_sequence().expect("configMapGenerator");
    let pod = pod_spec(&daemonset());
    let config_map = volume(&pod, "config").config_map.expect("the config volume is a ConfigMap").name;
    let generator = generators
        .iter()
        .find(|g| g["name"].as_str() == Some(config_map.as_str()))
        .unwrap_or_else(|| panic!("no configMapGenerator makes {config_map}"));
    let files: Vec<&str> = generator["files"].as_sequence().expect("files").iter().filter_map(|f| f.as_str()).collect();
    assert_eq!(files, ["drivelet.toml"]);

    let images = k["images"].as_sequence().expect("images");
    assert!(images.iter().any(|i| i["name"].as_str() == Some("drivelet")), "operators set the image through images:");
    assert_eq!(container(&pod, "drivelet").image.as_deref(), Some("drivelet:latest"));
}

#[test]
fn manifests_validate_against_the_kubernetes_schemas() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/validate-deploy.sh");
    let out = std::process::Command::new("bash").arg(&script).output().expect("run scripts/validate-deploy.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => {}
        Some(2) => panic!(
            "scripts/validate-deploy.sh could not run its validator: install it with scripts/setup-host.sh \
             (python3 -m pip install kubernetes-validate)\n{stderr}{stdout}"
        ),
        _ => panic!("deploy/ does not validate ({}):\n{stdout}{stderr}", out.status),
    }
    assert!(stdout.contains("ok   deploy/daemonset.yaml: DaemonSet/drivelet"), "{stdout}");
}
