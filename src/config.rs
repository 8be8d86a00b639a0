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

use serde::{Deserialize, Deserializer};

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
    /// `NodeGetInfo.max_volumes_per_node`; 0 means no limit.
    pub max_volumes_per_node: i64,
    /// Extra topology segments reported with `topology.drivelet.io/node`.
    pub topology: BTreeMap<String, String>,
}

impl Default for DriverConfig {
    fn default() -> Self {
        Self {
            name: "csi.drivelet.io".into(),
            node_name: String::new(),
            max_volumes_per_node: 0,
            topology: BTreeMap::new(),
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

/// Media classes of a drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Media {
    /// Rotating disk.
    Hdd,
    /// SATA/SAS solid-state disk.
    Ssd,
    /// NVMe namespace.
    Nvme,
    /// Loop, virtio and other virtual disks.
    Virtual,
}

impl Media {
    /// The lower-case name used in config, parameters and output.
    pub fn as_str(self) -> &'static str {
        match self {
            Media::Hdd => "hdd",
            Media::Ssd => "ssd",
            Media::Nvme => "nvme",
            Media::Virtual => "virtual",
        }
    }

    /// Parses a media name as written in config or StorageClass parameters.
    pub fn parse(s: &str) -> Option<Media> {
        match s {
            "hdd" => Some(Media::Hdd),
            "ssd" => Some(Media::Ssd),
            "nvme" => Some(Media::Nvme),
            "virtual" => Some(Media::Virtual),
            _ => None,
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
}

impl Default for DrivesConfig {
    fn default() -> Self {
        Self {
            allow_loop: false,
            rescan_interval: Duration::from_secs(300),
            filters: DriveFilters::default(),
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
}

impl Default for VolumesConfig {
    fn default() -> Self {
        Self { allowed_roots: vec!["/var/lib/kubelet".into()], default_size: 1 << 30, default_fs: "ext4".into() }
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
    /// for more are grown here (no external-resizer sidecar). Its retries use the attach
    /// backoff settings; an infeasible size waits `attach_terminal_retry`.
    pub resize: bool,
    /// Backoff after the first failed attach or detach (or resize); doubled per failure.
    #[serde(deserialize_with = "de_duration")]
    pub attach_backoff_base: Duration,
    /// The longest backoff.
    #[serde(deserialize_with = "de_duration")]
    pub attach_backoff_cap: Duration,
    /// Retry delay after an attach that cannot succeed by retrying (failing, releasing
    /// or missing drive).
    #[serde(deserialize_with = "de_duration")]
    pub attach_terminal_retry: Duration,
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
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            kubeconfig: PathBuf::new(),
            attach: true,
            resize: true,
            attach_backoff_base: Duration::from_secs(1),
            attach_backoff_cap: Duration::from_secs(300),
            attach_terminal_retry: Duration::from_secs(600),
            resync_interval: Duration::from_secs(600),
            events: true,
            event_interval: Duration::from_secs(60),
            drive_objects: true,
            drive_resync_interval: Duration::from_secs(300),
            label_node: false,
        }
    }
}

/// Bytes in binary units, e.g. `1.9 GiB`: how sizes are shown to people (`ctl`, `csi`,
/// Drive objects).
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// Parses a size: a whole number with an optional unit. `K`, `M`, `G`, `T` (and `KB`...)
/// are powers of 1000; `Ki`, `Mi`, `Gi`, `Ti` (and `KiB`...) are powers of 1024.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("\"{s}\" is not a size; write e.g. \"10GiB\", \"500M\" or \"1073741824\""));
    }
    let n: u64 = num.parse().map_err(|_| format!("\"{s}\": number too large"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KB" | "k" | "kB" => 1000,
        "M" | "MB" => 1000u64.pow(2),
        "G" | "GB" => 1000u64.pow(3),
        "T" | "TB" => 1000u64.pow(4),
        "Ki" | "KiB" => 1 << 10,
        "Mi" | "MiB" => 1 << 20,
        "Gi" | "GiB" => 1 << 30,
        "Ti" | "TiB" => 1 << 40,
        other => {
            return Err(format!(
                "\"{s}\": unknown unit \"{other}\"; use one of K, M, G, T (powers of 1000) or Ki, Mi, Gi, Ti (powers of 1024)"
            ))
        }
    };
    n.checked_mul(mult).ok_or_else(|| format!("\"{s}\": size too large"))
}

/// Parses a duration: a whole number followed by `ms`, `s`, `m` or `h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("\"{s}\" is not a duration; write e.g. \"30s\", \"5m\" or \"500ms\""))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(format!("\"{s}\": unit must be ms, s, m or h")),
    };
    Ok(d)
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeRepr {
    Int(u64),
    Str(String),
}

fn de_size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match SizeRepr::deserialize(d)? {
        SizeRepr::Int(n) => Ok(n),
        SizeRepr::Str(s) => parse_size(&s).map_err(serde::de::Error::custom),
    }
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    parse_duration(&s).map_err(serde::de::Error::custom)
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

    /// Checks every value; the error names the key and what to change.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_driver_name(&self.driver.name)?;
        let node = &self.driver.node_name;
        if node.is_empty() {
            return Err(invalid(
                "driver.node_name",
                "is empty and neither NODE_NAME nor the host name is set; set driver.node_name or NODE_NAME",
            ));
        }
        if node.len() > 128 || node.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(invalid("driver.node_name", "must be at most 128 characters without spaces or control characters"));
        }
        if self.driver.max_volumes_per_node < 0 {
            return Err(invalid("driver.max_volumes_per_node", "must be 0 (no limit) or a positive number"));
        }
        for (k, v) in &self.driver.topology {
            let key = format!("driver.topology.\"{k}\"");
            if k == crate::TOPOLOGY_NODE_KEY {
                return Err(invalid(&key, "is set by drivelet itself from the node name; remove it"));
            }
            if !valid_label_key(k) {
                return Err(invalid(&key, "is not a valid Kubernetes label key (optional DNS prefix, '/', then up to 63 of [A-Za-z0-9-_.])"));
            }
            if !valid_label_value(v) {
                return Err(invalid(&key, format!("value \"{v}\" is not a valid Kubernetes label value (up to 63 of [A-Za-z0-9-_.], alphanumeric at both ends)")));
            }
        }
        for (key, p) in [
            ("paths.csi_socket", &self.paths.csi_socket),
            ("paths.admin_socket", &self.paths.admin_socket),
        ] {
            check_socket_path(key, p)?;
        }
        if self.paths.csi_socket == self.paths.admin_socket {
            return Err(invalid("paths.admin_socket", "must differ from paths.csi_socket"));
        }
        if !self.paths.state_dir.is_absolute() {
            return Err(invalid("paths.state_dir", "must be an absolute path"));
        }
        if self.drives.rescan_interval < Duration::from_secs(1) {
            return Err(invalid("drives.rescan_interval", "must be at least 1s (udev events do the live work; this is only a safety net)"));
        }
        for (i, g) in self.drives.filters.include_paths.iter().enumerate() {
            check_glob(&format!("drives.filters.include_paths[{i}]"), g)?;
        }
        for (i, g) in self.drives.filters.exclude_paths.iter().enumerate() {
            check_glob(&format!("drives.filters.exclude_paths[{i}]"), g)?;
        }
        for (i, g) in self.drives.filters.exclude_models.iter().enumerate() {
            check_glob(&format!("drives.filters.exclude_models[{i}]"), g)?;
        }
        if tracing_subscriber::EnvFilter::try_new(&self.log.level).is_err() {
            return Err(invalid("log.level", format!("\"{}\" is not a log filter; use e.g. \"info\", \"debug\" or \"drivelet=debug,info\"", self.log.level)));
        }
        if self.volumes.allowed_roots.is_empty() {
            return Err(invalid("volumes.allowed_roots", "is empty; list the kubelet directory, e.g. [\"/var/lib/kubelet\"]"));
        }
        for (i, r) in self.volumes.allowed_roots.iter().enumerate() {
            if !r.is_absolute() || r == Path::new("/") {
                return Err(invalid(&format!("volumes.allowed_roots[{i}]"), "must be an absolute directory other than /"));
            }
        }
        if self.volumes.default_size < (1 << 20) {
            return Err(invalid("volumes.default_size", "must be at least 1MiB"));
        }
        if !matches!(self.volumes.default_fs.as_str(), "ext4" | "xfs") {
            return Err(invalid("volumes.default_fs", format!("is \"{}\"; it must be ext4 or xfs", self.volumes.default_fs)));
        }
        if self.health.interval < Duration::from_secs(1) {
            return Err(invalid("health.interval", "must be at least 1s"));
        }
        if self.health.volume_check_interval < Duration::from_millis(100) {
            return Err(invalid("health.volume_check_interval", "must be at least 100ms"));
        }
        if self.health.jitter_percent > 50 {
            return Err(invalid("health.jitter_percent", "must be between 0 and 50"));
        }
        if self.health.concurrency == 0 || self.health.concurrency > 64 {
            return Err(invalid("health.concurrency", "must be between 1 and 64"));
        }
        if self.health.usage_threshold_percent == 0 || self.health.usage_threshold_percent > 100 {
            return Err(invalid("health.usage_threshold_percent", "must be between 1 and 100"));
        }
        if self.health.fsck_runs == 0 || self.health.fsck_runs > 10 {
            return Err(invalid("health.fsck_runs", "must be between 1 and 10"));
        }
        if !self.kubelet.dir.is_absolute() {
            return Err(invalid("kubelet.dir", "must be an absolute path, e.g. \"/var/lib/kubelet\""));
        }
        if self.kubelet.registration {
            let reg = self.registration_socket();
            if reg.as_os_str().len() > 107 {
                return Err(invalid(
                    "kubelet.dir",
                    format!("makes the registration socket path {} longer than 107 bytes, the limit of a unix socket path; choose a shorter directory", reg.display()),
                ));
            }
            if reg == self.paths.csi_socket || reg == self.paths.admin_socket {
                return Err(invalid("kubelet.dir", format!("makes the registration socket {} collide with paths.csi_socket or paths.admin_socket", reg.display())));
            }
        }
        if !self.http.address.is_empty() && self.http.address.parse::<std::net::SocketAddr>().is_err() {
            return Err(invalid("http.address", format!("\"{}\" is not host:port with a numeric host, e.g. \"0.0.0.0:9808\" or \"127.0.0.1:9808\"", self.http.address)));
        }
        let k = &self.kubernetes;
        if k.enabled {
            if !k.kubeconfig.as_os_str().is_empty() && !k.kubeconfig.is_absolute() {
                return Err(invalid("kubernetes.kubeconfig", "must be an absolute path, or empty for the in-cluster service account"));
            }
            if k.attach_backoff_base < Duration::from_millis(10) {
                return Err(invalid("kubernetes.attach_backoff_base", "must be at least 10ms"));
            }
            if k.attach_backoff_cap < k.attach_backoff_base {
                return Err(invalid("kubernetes.attach_backoff_cap", "must be at least kubernetes.attach_backoff_base"));
            }
            if k.attach_terminal_retry < Duration::from_secs(1) {
                return Err(invalid("kubernetes.attach_terminal_retry", "must be at least 1s"));
            }
            if k.resync_interval != Duration::ZERO && k.resync_interval < Duration::from_secs(10) {
                return Err(invalid("kubernetes.resync_interval", "must be 0s (off) or at least 10s"));
            }
            if k.drive_resync_interval < Duration::from_secs(10) {
                return Err(invalid("kubernetes.drive_resync_interval", "must be at least 10s"));
            }
        }
        if self.demo.enabled {
            if !self.drives.allow_loop {
                return Err(invalid("demo.enabled", "needs drives.allow_loop = true, or drivelet would ignore its own demo drives"));
            }
            if !self.demo.dir.is_absolute() {
                return Err(invalid("demo.dir", "must be an absolute path"));
            }
            if self.demo.drives == 0 || self.demo.drives > 64 {
                return Err(invalid("demo.drives", "must be between 1 and 64"));
            }
            if self.demo.size < (64 << 20) {
                return Err(invalid("demo.size", "must be at least 64MiB"));
            }
        }
        Ok(())
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

fn check_socket_path(key: &str, p: &Path) -> Result<(), ConfigError> {
    if !p.is_absolute() {
        return Err(invalid(key, "must be an absolute path"));
    }
    // sun_path holds 108 bytes including the terminating NUL.
    if p.as_os_str().len() > 107 {
        return Err(invalid(key, "is longer than 107 bytes, the limit of a unix socket path; choose a shorter path"));
    }
    Ok(())
}

fn check_glob(key: &str, g: &str) -> Result<(), ConfigError> {
    glob::Pattern::new(g)
        .map(|_| ())
        .map_err(|e| invalid(key, format!("\"{g}\" is not a valid glob: {e}")))
}

/// CSI: at most 63 characters, domain notation, alphanumeric at both ends.
fn validate_driver_name(name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(invalid("driver.name", format!("\"{name}\" must be a domain-style name of at most 63 characters ([a-z0-9.-], alphanumeric at both ends), e.g. csi.drivelet.io")))
    }
}

fn valid_label_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

fn valid_label_key(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix {
        let dns_ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !dns_ok {
            return false;
        }
    }
    !name.is_empty() && valid_label_value(name)
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
            (Box::new(|c| { c.kubernetes.enabled = true; c.kubernetes.attach_backoff_base = Duration::ZERO; }), "kubernetes.attach_backoff_base"),
            (Box::new(|c| { c.kubernetes.enabled = true; c.kubernetes.attach_backoff_cap = Duration::from_millis(500); }), "kubernetes.attach_backoff_cap"),
            (Box::new(|c| { c.kubernetes.enabled = true; c.kubernetes.attach_terminal_retry = Duration::from_millis(5); }), "kubernetes.attach_terminal_retry"),
            (Box::new(|c| { c.kubernetes.enabled = true; c.kubernetes.resync_interval = Duration::from_secs(1); }), "kubernetes.resync_interval"),
            (Box::new(|c| { c.kubernetes.enabled = true; c.kubernetes.drive_resync_interval = Duration::from_secs(1); }), "kubernetes.drive_resync_interval"),
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

    /// Every key of config/drivelet.toml has a row in the README's key table.
    #[test]
    fn readme_documents_every_config_key() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
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
        assert!(missing.is_empty(), "README.md's key table lacks {missing:?}");
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
