//! [`Config::validate`]: every value checked after loading; each error names the key
//! (`section.key`) and says what to change.

use std::path::Path;

use super::*;

impl Config {
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
            if k.retry_base < Duration::from_millis(10) {
                return Err(invalid("kubernetes.retry_base", "must be at least 10ms"));
            }
            if k.retry_cap < k.retry_base {
                return Err(invalid("kubernetes.retry_cap", "must be at least kubernetes.retry_base"));
            }
            if k.retry_terminal < Duration::from_secs(1) {
                return Err(invalid("kubernetes.retry_terminal", "must be at least 1s"));
            }
            if k.resync_interval != Duration::ZERO && k.resync_interval < Duration::from_secs(10) {
                return Err(invalid("kubernetes.resync_interval", "must be 0s (off) or at least 10s"));
            }
            if k.drive_resync_interval < Duration::from_secs(10) {
                return Err(invalid("kubernetes.drive_resync_interval", "must be at least 10s"));
            }
            if !is_dns_label(&k.namespace) {
                return Err(invalid(
                    "kubernetes.namespace",
                    format!("\"{}\" is not a namespace name (lowercase letters, digits and '-', at most 63, starting and ending with a letter or digit)", k.namespace),
                ));
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

/// Whether `s` is a DNS-1123 label, the form of a namespace name.
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}
