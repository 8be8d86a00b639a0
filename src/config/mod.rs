//! Typed configuration: defaults, then the TOML file, then `DRIVELET__SECTION__KEY`
//! environment overrides, then [`Config::validate`].
//!
//! Rules this module enforces:
//! - unknown keys are errors (every struct is `deny_unknown_fields`), so a typo never
//!   silently falls back to a default;
//! - every validation message names the key (`section.key`) and says what to change;
//! - the node name comes from `driver.node_name`, else the `NODE_NAME` environment
//!   variable (Kubernetes downward API), else the host name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use self::units::{de_duration, de_size};
pub use self::units::{human_bytes, human_duration, parse_duration, parse_size};
use crate::words::Media;

/// Sizes and durations: parsing and showing.
mod units;
/// `Config::validate` and its checks.
mod validate;

/// Errors from loading or validating a configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read or parsed, or a value has the wrong type.
    #[error("cannot load config {path}: {reason}")]
    Load {
        /// The config file.
        path: String,
        /// What the parser said.
        reason: String,
    },
    /// A value parsed but is not acceptable.
    #[error("invalid config: `{key}` {reason}")]
    Invalid {
        /// Dotted key, e.g. `paths.csi_socket`.
        key: String,
        /// What is wrong and what to change.
        reason: String,
    },
}

fn invalid(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { key: key.to_string(), reason: reason.into() }
}

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize, Default, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Identity of the driver and of this node.
    pub driver: DriverConfig,
    /// Sockets and directories.
    pub paths: PathsConfig,
    /// Which disks drivelet may manage.
    pub drives: DrivesConfig,
    /// Logging.
    pub log: LogConfig,
    /// Volume provisioning and serving.
    pub volumes: VolumesConfig,
    /// Drive and volume health checks.
    pub health: HealthConfig,
    /// Loop-backed demo drives created at start.
    pub demo: DemoConfig,
    /// Kubelet plugin registration.
    pub kubelet: KubeletConfig,
    /// The Kubernetes API: attach queue, Events, Drive objects, node labels.
    pub kubernetes: KubernetesConfig,
    /// The HTTP endpoints for probes and metrics.
    pub http: HttpConfig,
    /// CSI migration of in-tree volume plugins' PVs, one switch per plugin.
    pub migration: MigrationConfig,
    /// What the agent keeps itself from doing: its seccomp filter.
    pub security: SecurityConfig,
}

/// `[security]`: the agent's own confinement, on top of what its container gives it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SecurityConfig {
    /// `enforce`: `drivelet run` installs a seccomp filter that allows only the system
    /// calls it and its tools make (`crate::seccomp::ALLOWED`); any other fails with
    /// EPERM and is logged by the kernel. `log`: others are allowed and logged. `off`:
    /// no filter (a privileged container gets none from its runtime).
    pub seccomp: crate::seccomp::SeccompMode,
}

impl Default for SecurityConfig {
    fn default() -> Self {
        Self { seccomp: crate::seccomp::SeccompMode::Off }
    }
}

/// `[migration]`: which Kubernetes in-tree volume plugins have their PVs translated to
/// drivelet CSI PVs (see `migration`). Every switch is off by default.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MigrationConfig {
    /// Translate kubernetes.io/local-volume PVs.
    pub local: bool,
}

/// `[http]`: `/healthz`, `/readyz` and `/metrics` (Prometheus) over plain HTTP.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// `host:port` to listen on; empty: no HTTP endpoints.
    pub address: String,
}

/// `[driver]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DriverConfig {
    /// CSI driver name (`GetPluginInfo.name`).
    pub name: String,
    /// Node name; empty means `NODE_NAME`, then the host name.
    pub node_name: String,
    /// The cluster this node belongs to, as written on every drive it owns. Empty: with
    /// `[kubernetes]`, the uid of the cluster's `kube-system` namespace; without,
    /// `standalone`.
    pub cluster_id: String,
    /// `NodeGetInfo.max_volumes_per_node`; 0 means no limit.
    pub max_volumes_per_node: i64,
    /// Extra topology segments reported with `topology.drivelet.io/node`.
    pub topology: BTreeMap<String, String>,
    /// Advertise CSI v1.13's volume health capabilities (controller LIST_VOLUME_HEALTH
    /// and GET_VOLUME_HEALTH, node GET_VOLUME_HEALTH and GET_STORAGE_HEALTH). The RPCs
    /// are served either way; off by default, because no Kubernetes release calls them
    /// yet and clients built on CSI v1.12 (csi-sanity v5.4.0 among them) reject
    /// capabilities they do not know.
    pub advertise_volume_health: bool,
}

impl Default for DriverConfig {
    fn default() -> Self {
        Self {
            name: "csi.drivelet.io".into(),
            node_name: String::new(),
            cluster_id: String::new(),
            max_volumes_per_node: 0,
            topology: BTreeMap::new(),
            advertise_volume_health: false,
        }
    }
}

/// `[paths]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PathsConfig {
    /// CSI endpoint (unix socket, mode 0600).
    pub csi_socket: PathBuf,
    /// Admin socket for `drivelet ctl` (unix socket, mode 0600).
    pub admin_socket: PathBuf,
    /// Directory for drivelet's own state.
    pub state_dir: PathBuf,
}

impl Default for PathsConfig {
    fn default() -> Self {
        Self {
            csi_socket: "/var/lib/kubelet/plugins/csi.drivelet.io/csi.sock".into(),
            admin_socket: "/run/drivelet/admin.sock".into(),
            state_dir: "/var/lib/drivelet".into(),
        }
    }
}

/// `[drives]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DrivesConfig {
    /// Whether loop devices count as drives (off in production; the demo turns it on).
    pub allow_loop: bool,
    /// Safety-net full rescan interval, on top of live udev events.
    #[serde(deserialize_with = "de_duration")]
    pub rescan_interval: Duration,
    /// Filters; a disk that fails one is `excluded` with the filter named.
    pub filters: DriveFilters,
    /// Adopt without a command a drivelet disk of this cluster whose owner node's Node
    /// object is deleted (a node reinstalled under a new name, a disk moved out of a
    /// retired node). Needs `[kubernetes]`. Off: such a disk waits for an admin's adopt.
    pub adopt_from_deleted_nodes: bool,
}

impl Default for DrivesConfig {
    fn default() -> Self {
        Self {
            allow_loop: false,
            rescan_interval: Duration::from_secs(300),
            filters: DriveFilters::default(),
            adopt_from_deleted_nodes: false,
        }
    }
}

/// `[drives.filters]`
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct DriveFilters {
    /// If not empty, only disks whose path or a by-id link matches one glob are eligible.
    pub include_paths: Vec<String>,
    /// Disks whose path or a by-id link matches one of these globs are excluded.
    pub exclude_paths: Vec<String>,
    /// Disks with one of these serial numbers are excluded.
    pub exclude_serials: Vec<String>,
    /// Disks whose model matches one of these globs are excluded.
    pub exclude_models: Vec<String>,
    /// Disks smaller than this are excluded (size string, e.g. "10GiB"); 0 means no limit.
    #[serde(deserialize_with = "de_size")]
    pub min_size: u64,
    /// If not empty, only disks of these media classes are eligible.
    pub media: Vec<Media>,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Compact when stderr is a terminal, JSON otherwise.
    Auto,
    /// One JSON object a line (clusters).
    Json,
    /// Human-readable single lines (terminals).
    Compact,
}

/// `[log]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `auto`, `json` or `compact`.
    pub format: LogFormat,
    /// An `EnvFilter` directive, e.g. `info` or `drivelet=debug`; `RUST_LOG` wins if set.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { format: LogFormat::Auto, level: "info".into() }
    }
}

/// `[volumes]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct VolumesConfig {
    /// Staging and target paths must lie under one of these directories (after
    /// resolving symlinks); anything else is refused.
    pub allowed_roots: Vec<PathBuf>,
    /// Size of a volume whose request names no capacity (size string).
    #[serde(deserialize_with = "de_size")]
    pub default_size: u64,
    /// Filesystem made on a mount volume whose capability names none: ext4 or xfs.
    pub default_fs: String,
    /// Whether a drive taken as blank (no partition table, no signature) is zeroed
    /// whole before its first volume: blank to blkid is not zero. Off only for drives
    /// known to hold nothing (fresh from the factory, or already zeroed).
    pub clean_blank_drives: bool,
    /// How long a CreateVolume that fits only in space still being cleaned (or a
    /// ControllerExpandVolume growing in place into it) waits for it before it answers
    /// RESOURCE_EXHAUSTED.
    #[serde(deserialize_with = "de_duration")]
    pub cleaning_wait: Duration,
    /// How much the cleaner zeroes between two records of its progress on the drive
    /// (size string): what a restart zeroes again at most.
    #[serde(deserialize_with = "de_size")]
    pub cleaning_step: u64,
    /// The longest a snapshot (a snapshot class with `drivelet.io/freeze: "true"`) or a
    /// clone of a volume in use (unless its StorageClass sets
    /// `drivelet.io/clone-freeze-limit`) may hold a frozen filesystem's writers: a copy
    /// estimated longer is refused before the freeze, and past the limit the filesystem
    /// is thawed and the copy fails, never torn.
    #[serde(deserialize_with = "de_duration")]
    pub freeze_limit: Duration,
}

impl Default for VolumesConfig {
    fn default() -> Self {
        Self {
            allowed_roots: vec!["/var/lib/kubelet".into()],
            default_size: 1 << 30,
            default_fs: "ext4".into(),
            clean_blank_drives: true,
            cleaning_wait: Duration::from_secs(30),
            cleaning_step: 1 << 30,
            freeze_limit: Duration::from_secs(10),
        }
    }
}

/// `[health]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// How often each managed drive's SMART data is read.
    #[serde(deserialize_with = "de_duration")]
    pub interval: Duration,
    /// Random spread of each poll, in percent of `interval`, so nodes do not poll in step.
    pub jitter_percent: u8,
    /// How many smartctl or fsck runs may be in flight at once.
    pub concurrency: usize,
    /// The smartctl program.
    pub smartctl: PathBuf,
    /// A smartctl or fsck run taking longer is abandoned (the drive counts as unknown).
    #[serde(deserialize_with = "de_duration")]
    pub command_timeout: Duration,
    /// How often staged and published volumes are checked (mounts, readability, usage,
    /// and a read-only fsck of unmounted filesystems).
    #[serde(deserialize_with = "de_duration")]
    pub volume_check_interval: Duration,
    /// A volume whose filesystem is fuller than this (percent of blocks or inodes) is
    /// reported out of space.
    pub usage_threshold_percent: u8,
    /// A read-only fsck runs this many times; corruption is reported only if every run
    /// agrees.
    pub fsck_runs: u32,
    /// Release a releasing drive automatically once its last volume is deleted.
    pub auto_release: bool,
    /// SMART thresholds.
    pub smart: crate::disk::smart::SmartThresholds,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(60),
            jitter_percent: 10,
            concurrency: 2,
            smartctl: "smartctl".into(),
            command_timeout: Duration::from_secs(30),
            volume_check_interval: Duration::from_secs(30),
            usage_threshold_percent: 90,
            fsck_runs: 3,
            auto_release: false,
            smart: crate::disk::smart::SmartThresholds::default(),
        }
    }
}

/// `[demo]`: loop-backed drives for machines without spare disks.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DemoConfig {
    /// Create and attach the drives at start, detach them at stop.
    pub enabled: bool,
    /// Where the sparse backing files live.
    pub dir: PathBuf,
    /// How many drives.
    pub drives: u32,
    /// Size of each drive (size string).
    #[serde(deserialize_with = "de_size")]
    pub size: u64,
    /// Delete the backing files at stop (their data goes with them).
    pub remove_files_on_stop: bool,
}

impl Default for DemoConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            dir: "/var/lib/drivelet/demo".into(),
            drives: 3,
            size: 2 << 30,
            remove_files_on_stop: false,
        }
    }
}

/// `[kubelet]`: registering the plugin with kubelet (instead of node-driver-registrar).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KubeletConfig {
    /// Serve kubelet's plugin registration API, so kubelet finds the CSI socket by
    /// itself. Off by default: drivelet also runs where there is no kubelet.
    pub registration: bool,
    /// Kubelet's root directory; the registration socket is
    /// `<dir>/plugins_registry/<driver.name>-reg.sock`.
    pub dir: PathBuf,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        Self { registration: false, dir: "/var/lib/kubelet".into() }
    }
}

/// `[kubernetes]`: what drivelet does through the Kubernetes API. Off by default; with it
/// off drivelet serves CSI and never talks to an API server.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesConfig {
    /// Talk to the API server at all.
    pub enabled: bool,
    /// A kubeconfig file; empty: the in-cluster service account (or `KUBECONFIG` /
    /// `~/.kube/config` when not in a pod).
    pub kubeconfig: PathBuf,
    /// Run the in-process attacher: VolumeAttachments of this driver and node are
    /// attached and detached here (no external-attacher sidecar).
    pub attach: bool,
    /// Run the in-process resizer: claims of this driver's volumes on this node that ask
    /// for more are grown here (no external-resizer sidecar). Its retries use
    /// `retry_base` and `retry_cap`; an infeasible size waits `retry_terminal`.
    pub resize: bool,
    /// Run the in-process snapshotter: VolumeSnapshotContents of this driver whose
    /// volume or snapshot this node holds are snapshotted and deleted here (no
    /// csi-snapshotter sidecar). Needs the `snapshot.storage.k8s.io` CRDs; its retries use
    /// `retry_base` and `retry_cap`.
    pub snapshots: bool,
    /// Publish this node's CSIStorageCapacity objects in process: one per StorageClass of
    /// this driver, written as soon as drives, volumes or reservations change (no
    /// external-provisioner capacity poll); the scheduler and the placement of Immediate
    /// claims read them. Its retries use `retry_base` and `retry_cap`.
    pub capacity: bool,
    /// Run the in-process provisioner: claims scheduled to this node (their
    /// `volume.kubernetes.io/selected-node`) become volumes and PVs here, and the volumes
    /// of this node's Released PVs of Delete classes are deleted here (no
    /// external-provisioner sidecar). Turn it off only while an external-provisioner
    /// sidecar runs beside drivelet and should do this alone.
    pub provision: bool,
    /// The first retry delay of this front's loops that retry with backoff (a failed
    /// attach or detach, resize, snapshot, node labelling, a Drive object sync, a write of
    /// the capacity objects); doubled
    /// per failure in a row.
    /// `attach_backoff_base`, its old name, still loads; setting both is an error.
    #[serde(alias = "attach_backoff_base", deserialize_with = "de_duration")]
    pub retry_base: Duration,
    /// The longest retry delay of those loops. `attach_backoff_cap`, its old name, still
    /// loads; setting both is an error.
    #[serde(alias = "attach_backoff_cap", deserialize_with = "de_duration")]
    pub retry_cap: Duration,
    /// Retry delay after a failure that cannot pass by retrying (an attach to a failing,
    /// releasing or missing drive; a size the drive cannot meet).
    /// `attach_terminal_retry`, its old name, still loads; setting both is an error.
    #[serde(alias = "attach_terminal_retry", deserialize_with = "de_duration")]
    pub retry_terminal: Duration,
    /// Every VolumeAttachment of this node is looked at again this often even without
    /// a change (0s: never).
    #[serde(deserialize_with = "de_duration")]
    pub resync_interval: Duration,
    /// Record an Event on the PVC and its pods when a volume's condition turns abnormal
    /// or back to normal.
    pub events: bool,
    /// At most one such Event per volume in this interval; changes in between are
    /// folded into the next one.
    #[serde(deserialize_with = "de_duration")]
    pub event_interval: Duration,
    /// Keep a `Drive` object (drives.drivelet.io) per disk of this node.
    pub drive_objects: bool,
    /// Drive objects are rewritten from the inventory at least this often (health and
    /// volume counts change without udev events).
    #[serde(deserialize_with = "de_duration")]
    pub drive_resync_interval: Duration,
    /// Label the Node object with `driver.topology` and `topology.drivelet.io/node`.
    pub label_node: bool,
    /// Stand for election as the agent that looks after the objects of deleted nodes
    /// (their VolumeAttachments, PVs, Drive objects, and claims where the StorageClass
    /// opts in); one agent of the cluster does them at a time, elected with a Lease.
    pub cluster_duties: bool,
    /// The namespace drivelet runs in: its Lease and the `drivelet-removed-volumes`
    /// ConfigMap live there.
    pub namespace: String,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            kubeconfig: PathBuf::new(),
            attach: true,
            resize: true,
            snapshots: true,
            capacity: true,
            provision: true,
            retry_base: Duration::from_secs(1),
            retry_cap: Duration::from_secs(300),
            retry_terminal: Duration::from_secs(600),
            resync_interval: Duration::from_secs(600),
            events: true,
            event_interval: Duration::from_secs(60),
            drive_objects: true,
            drive_resync_interval: Duration::from_secs(300),
            label_node: false,
            cluster_duties: true,
            namespace: "drivelet-system".to_string(),
        }
    }
}

impl Config {
    /// Loads defaults, then `path` (if given), then `DRIVELET__SECTION__KEY` overrides,
    /// resolves the node name and validates.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let shown = path.map(|p| p.display().to_string()).unwrap_or_else(|| "(defaults)".into());
        let mut builder = config::Config::builder();
        if let Some(p) = path {
            if !p.exists() {
                return Err(ConfigError::Load { path: shown, reason: "no such file".into() });
            }
            builder = builder.add_source(config::File::from(p).format(config::FileFormat::Toml));
        }
        builder = builder.add_source(
            config::Environment::with_prefix("DRIVELET")
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true),
        );
        let raw = builder
            .build()
            .map_err(|e| ConfigError::Load { path: shown.clone(), reason: e.to_string() })?;
        let mut cfg: Config = raw
            .try_deserialize()
            .map_err(|e| ConfigError::Load { path: shown, reason: e.to_string() })?;
        cfg.resolve_node_name();
        cfg.validate()?;
        Ok(cfg)
    }

    /// Fills `driver.node_name` from `NODE_NAME` or the host name when empty.
    pub fn resolve_node_name(&mut self) {
        if !self.driver.node_name.is_empty() {
            return;
        }
        if let Ok(n) = std::env::var("NODE_NAME") {
            if !n.trim().is_empty() {
                self.driver.node_name = n.trim().to_string();
                return;
            }
        }
        if let Ok(h) = nix::unistd::gethostname() {
            self.driver.node_name = h.to_string_lossy().into_owned();
        }
    }

    /// Where kubelet's plugin watcher looks for this driver's registration socket:
    /// `<kubelet.dir>/plugins_registry/<driver.name>-reg.sock`.
    pub fn registration_socket(&self) -> PathBuf {
        self.kubelet.dir.join("plugins_registry").join(format!("{}-reg.sock", self.driver.name))
    }

    /// The `[driver.topology]` segments plus `topology.drivelet.io/node`.
    pub fn topology_segments(&self) -> BTreeMap<String, String> {
        let mut t = self.driver.topology.clone();
        t.insert(crate::TOPOLOGY_NODE_KEY.to_string(), self.driver.node_name.clone());
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_both_unit_families() {
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("1K").unwrap(), 1000);
        assert_eq!(parse_size("1Ki").unwrap(), 1024);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("10G").unwrap(), 10_000_000_000);
        assert_eq!(parse_size(" 3 MiB ").unwrap(), 3 << 20);
    }

    #[test]
    fn bad_sizes_are_rejected_with_a_hint() {
        assert!(parse_size("").unwrap_err().contains("not a size"));
        assert!(parse_size("ten").unwrap_err().contains("not a size"));
        assert!(parse_size("10XB").unwrap_err().contains("unknown unit"));
        assert!(parse_size("-1G").unwrap_err().contains("not a size"));
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("99999999999T").unwrap_err().contains("too large"));
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("m").is_err());
    }

    fn valid() -> Config {
        let mut c = Config::default();
        c.driver.node_name = "node-1".into();
        c
    }

    #[test]
    fn defaults_are_valid_once_a_node_name_is_known() {
        valid().validate().unwrap();
    }

    #[test]
    fn validation_names_the_key() {
        let cases: Vec<(Box<dyn Fn(&mut Config)>, &str)> = vec![
            (Box::new(|c| c.driver.name = "-bad-".into()), "driver.name"),
            (Box::new(|c| c.driver.name = "a".repeat(64)), "driver.name"),
            (Box::new(|c| c.driver.node_name = "has space".into()), "driver.node_name"),
            (Box::new(|c| c.driver.max_volumes_per_node = -1), "driver.max_volumes_per_node"),
            (Box::new(|c| { c.driver.topology.insert("bad key!".into(), "x".into()); }), "driver.topology"),
            (Box::new(|c| { c.driver.topology.insert("zone".into(), "-x".into()); }), "driver.topology"),
            (Box::new(|c| { c.driver.topology.insert(crate::TOPOLOGY_NODE_KEY.into(), "x".into()); }), "driver.topology"),
            (Box::new(|c| c.paths.csi_socket = "relative.sock".into()), "paths.csi_socket"),
            (Box::new(|c| c.paths.admin_socket = format!("/{}", "a".repeat(120)).into()), "paths.admin_socket"),
            (Box::new(|c| c.paths.admin_socket = c.paths.csi_socket.clone()), "paths.admin_socket"),
            (Box::new(|c| c.paths.state_dir = "state".into()), "paths.state_dir"),
            (Box::new(|c| c.drives.rescan_interval = Duration::from_millis(10)), "drives.rescan_interval"),
            (Box::new(|c| c.drives.filters.exclude_paths.push("/dev/[".into())), "drives.filters.exclude_paths[0]"),
            (Box::new(|c| c.log.level = "info,,=x=".into()), "log.level"),
            (Box::new(|c| c.kubelet.dir = "var/lib/kubelet".into()), "kubelet.dir"),
            (Box::new(|c| { c.kubelet.registration = true; c.kubelet.dir = format!("/{}", "k".repeat(90)).into(); }), "kubelet.dir"),
            (Box::new(|c| c.demo.enabled = true), "demo.enabled"),
            (Box::new(|c| { c.demo.enabled = true; c.drives.allow_loop = true; c.demo.drives = 0; }), "demo.drives"),
            (Box::new(|c| { c.demo.enabled = true; c.drives.allow_loop = true; c.demo.size = 1; }), "demo.size"),
            (Box::new(|c| c.http.address = "localhost:9808".into()), "http.address"),
            (Box::new(|c| c.http.address = "0.0.0.0".into()), "http.address"),
            (Box::new(|c| { c.kubernetes.enabled = true; c.kubernetes.kubeconfig = "kube/config".into(); }), "kubernetes.kubeconfig"),
            (Box::new(|c| { c.kubernetes.enabled = true; c.kubernetes.retry_base = Duration::ZERO; }), "kubernetes.retry_base"),
            (Box::new(|c| { c.kubernetes.enabled = true; c.kubernetes.retry_cap = Duration::from_millis(500); }), "kubernetes.retry_cap"),
            (Box::new(|c| { c.kubernetes.enabled = true; c.kubernetes.retry_terminal = Duration::from_millis(5); }), "kubernetes.retry_terminal"),
            (Box::new(|c| { c.kubernetes.enabled = true; c.kubernetes.resync_interval = Duration::from_secs(1); }), "kubernetes.resync_interval"),
            (Box::new(|c| { c.kubernetes.enabled = true; c.kubernetes.drive_resync_interval = Duration::from_secs(1); }), "kubernetes.drive_resync_interval"),
            (Box::new(|c| { c.kubernetes.enabled = true; c.kubernetes.namespace = "Drivelet_System".into(); }), "kubernetes.namespace"),
            (Box::new(|c| { c.kubernetes.enabled = true; c.kubernetes.namespace = String::new(); }), "kubernetes.namespace"),
        ];
        for (mutate, key) in cases {
            let mut c = valid();
            mutate(&mut c);
            let err = c.validate().expect_err(key).to_string();
            assert!(err.contains(key), "error {err:?} should name {key}");
        }
    }

    fn load_str(toml: &str) -> Result<Config, ConfigError> {
        let io = |e: std::io::Error| ConfigError::Load { path: "(test file)".into(), reason: e.to_string() };
        let dir = tempfile::tempdir().map_err(io)?;
        let p = dir.path().join("c.toml");
        std::fs::write(&p, toml).map_err(io)?;
        Config::load(Some(&p))
    }

    /// Every key of config/drivelet.toml has a row in docs/configuration.md's key table.
    #[test]
    fn the_configuration_page_documents_every_config_key() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let readme = std::fs::read_to_string(root.join("docs/configuration.md")).expect("docs/configuration.md");
        let text = std::fs::read_to_string(root.join("config/drivelet.toml")).expect("config/drivelet.toml");
        let mut section = String::new();
        let mut missing = Vec::new();
        for line in text.lines().map(str::trim) {
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name.to_string();
            } else if let Some((key, _)) = line.split_once('=').filter(|_| !line.starts_with('#')) {
                let full = format!("{section}.{}", key.trim());
                if !readme.contains(&format!("| `{full}` |")) {
                    missing.push(full);
                }
            }
        }
        assert!(missing.is_empty(), "docs/configuration.md's key table lacks {missing:?}");
    }

    #[test]
    fn registration_socket_lies_in_kubelets_plugin_registry_named_after_the_driver() {
        let mut c = valid();
        assert_eq!(c.registration_socket(), Path::new("/var/lib/kubelet/plugins_registry/csi.drivelet.io-reg.sock"));
        c.kubelet.dir = "/k".into();
        c.driver.name = "x.example.com".into();
        assert_eq!(c.registration_socket(), Path::new("/k/plugins_registry/x.example.com-reg.sock"));
    }

    #[test]
    fn migration_switches_are_off_by_default_and_local_can_be_turned_on() {
        assert!(!Config::default().migration.local);
        let c = load_str("[driver]\nnode_name = \"n\"\n[migration]\nlocal = true\n").unwrap();
        assert!(c.migration.local);
        let err = load_str("[migration]\nhostpath = true\n").unwrap_err().to_string();
        assert!(err.contains("hostpath"), "{err}");
    }

    #[test]
    fn the_retry_keys_load_under_their_old_names_too_but_not_under_both() {
        let new = "[kubernetes]\nretry_base = \"2s\"\nretry_cap = \"1m\"\nretry_terminal = \"20m\"\n";
        let old = "[kubernetes]\nattach_backoff_base = \"2s\"\nattach_backoff_cap = \"1m\"\nattach_terminal_retry = \"20m\"\n";
        for toml in [new, old] {
            let k = load_str(&format!("[driver]\nnode_name = \"n\"\n{toml}")).unwrap().kubernetes;
            assert_eq!((k.retry_base, k.retry_cap, k.retry_terminal), (Duration::from_secs(2), Duration::from_secs(60), Duration::from_secs(1200)), "{toml}");
        }
        let both = "[kubernetes]\nretry_base = \"2s\"\nattach_backoff_base = \"3s\"\n";
        let err = load_str(both).unwrap_err().to_string();
        assert!(err.contains("duplicate field `retry_base`"), "{err}");
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let err = load_str("[driver]\nnmae = \"x\"\n").unwrap_err().to_string();
        assert!(err.contains("nmae"), "{err}");
        let err = load_str("[nosuchsection]\nx = 1\n").unwrap_err().to_string();
        assert!(err.contains("nosuchsection"), "{err}");
    }

    #[test]
    fn bad_size_string_in_file_is_rejected() {
        let err = load_str("[drives.filters]\nmin_size = \"ten gigs\"\n").unwrap_err().to_string();
        assert!(err.contains("not a size"), "{err}");
    }

    #[test]
    fn documented_config_files_load() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        for f in ["config/drivelet.toml", "config/demo.toml"] {
            let mut c: Config = config::Config::builder()
                .add_source(config::File::from(root.join(f)).format(config::FileFormat::Toml))
                .build()
                .unwrap()
                .try_deserialize()
                .unwrap_or_else(|e| panic!("{f}: {e}"));
            c.driver.node_name = "n".into();
            c.validate().unwrap_or_else(|e| panic!("{f}: {e}"));
        }
    }

    #[test]
    fn documented_defaults_match_code_defaults() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let c: Config = config::Config::builder()
            .add_source(config::File::from(root.join("config/drivelet.toml")).format(config::FileFormat::Toml))
            .build()
            .unwrap()
            .try_deserialize()
            .unwrap();
        assert_eq!(c, Config::default(), "config/drivelet.toml must document the defaults");
    }
}
