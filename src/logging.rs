//! Structured logs: tracing with an `EnvFilter` (`RUST_LOG` wins over `log.level`),
//! JSON for clusters, compact for terminals. Field names are dotted and stable:
//! `drive.id`, `drive.path`, `volume.id`, `csi.method`, `actor`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};

/// Installs the global subscriber; a second call is a no-op.
pub fn init(cfg: &LogConfig) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&cfg.level));
    let json = match cfg.format {
        LogFormat::Json => true,
        LogFormat::Compact => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = if json {
        builder.json().flatten_event(true).with_current_span(false).try_init()
    } else {
        builder.compact().try_init()
    };
}
