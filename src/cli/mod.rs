//! The command-line side of the binary: clients of a running agent or of any CSI
//! driver, never part of the agent itself. `main.rs` parses the arguments ([`args`])
//! and calls the subcommand's `run` in here; nothing in the agent's modules (actors,
//! fronts, disk, store) imports this folder.
//!
//! Rules: every command talks to its target only through a socket (the admin socket, a
//! CSI endpoint, or the Kubernetes API for `kubectl drivelet`); none touches a disk or
//! the store directly, so a command can never do what the agent would refuse.

/// The command line as clap reads it: every subcommand and argument, with its help.
pub mod args;
/// `drivelet bench`: a CSI load generator for any CSI endpoint.
pub mod bench;
/// `drivelet csi`: a CSI client for running a lifecycle by hand.
pub mod csi;
/// `drivelet ctl`: the admin client (drives, volumes, drive release, adoption for
/// `ctl migrate --apply`).
pub mod ctl;
/// `kubectl drivelet` (the binary as `kubectl-drivelet`): drives and volumes across the
/// cluster from the Drive objects, and drive actions by patching their spec.
pub mod kubectl;
/// `drivelet ctl migrate`: in-tree local PVs translated to drivelet CSI PVs, and adopted.
pub mod migrate;


/// Why a subcommand failed: the error of the client it ran, whose words it keeps (the
/// binary prints the whole chain, `drivelet: ...`, and exits 1).
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The configuration could not be loaded.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// A runtime could not be started.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// `drivelet ctl`.
    #[error(transparent)]
    Ctl(#[from] ctl::CtlError),
    /// `drivelet ctl migrate`.
    #[error(transparent)]
    Migrate(#[from] migrate::MigrateError),
    /// `drivelet csi`.
    #[error(transparent)]
    Csi(#[from] csi::CsiCliError),
    /// `drivelet bench`.
    #[error(transparent)]
    Bench(#[from] bench::BenchError),
    /// An argument is malformed (a size, a duration), in the parser's words.
    #[error("{0}")]
    Usage(String),
    /// The answer could not be encoded as JSON.
    #[error("encode")]
    Json(#[source] serde_json::Error),
    /// The answer could not be encoded as YAML.
    #[error("encode")]
    Yaml(#[source] serde_norway::Error),
    /// A bench left volumes it could not clean up.
    #[error("{} volume(s) could not be cleaned up and are left behind: {}", .0.len(), .0.join(", "))]
    LeftBehind(Vec<String>),
}

/// An error and every error under it, in words: `outer: inner: ...`.
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut words = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        words.push_str(": ");
        words.push_str(&s.to_string());
        next = s.source();
    }
    words
}

/// `value` as pretty JSON.
pub(crate) fn json<T: serde::Serialize>(value: &T) -> Result<String, CliError> {
    serde_json::to_string_pretty(value).map_err(CliError::Json)
}

/// A size argument (`1Gi`).
pub(crate) fn size_arg(s: &str) -> Result<u64, CliError> {
    crate::config::parse_size(s).map_err(CliError::Usage)
}

/// A current-thread runtime for a client's calls.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}
