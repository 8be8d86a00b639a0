//! `drivelet ctl migrate`: reads an in-tree `kubernetes.io/local-volume` PV (a file,
//! stdin or the cluster), prints it translated to a drivelet CSI PV, and with `--apply`
//! asks the agent on this node to adopt its data.
//!
//! Rules:
//! - nothing happens unless `[migration] local = true` in the config;
//! - without `--apply` nothing changes anywhere: the translation is printed (stdout) and
//!   the command says what `--apply` would adopt (stderr);
//! - `--apply` only on the node that holds the PV's path (its node affinity), and only
//!   through the admin socket: the agent decides whether the directory may be adopted.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::PersistentVolume;

use super::ctl::{self, CtlError};
use crate::config::{Config, ConfigError};
use crate::grpc::admin::AdminRequest;
use crate::migration::{TranslateError, Translator, IN_TREE_PLUGIN};

/// Where the PV to migrate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A YAML or JSON file (`-`: stdin).
    File(PathBuf),
    /// The API server, by name.
    Cluster(String),
}

/// Errors of `drivelet ctl migrate`. The cause of each (an OS, YAML or API error) is
/// its `source`, which the binary prints after the words.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The config could not be loaded.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// `[migration] local` is off.
    #[error("migration of {IN_TREE_PLUGIN} is off: set `local = true` under [migration] in the config")]
    Off,
    /// Neither or both of `-f` and `--from-cluster`.
    #[error("name the PV: -f FILE (or - for stdin) or --from-cluster NAME")]
    NoSource,
    /// `--from-cluster` without `[kubernetes] enabled`.
    #[error("--from-cluster needs [kubernetes] enabled = true in the config")]
    NoKubernetes,
    /// The PV file (or stdin) could not be read.
    #[error("read {what}")]
    Read {
        /// The file, or "the PV from stdin".
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The input is not a PersistentVolume.
    #[error("{} is not a PersistentVolume", path.display())]
    NotAPv {
        /// The file given.
        path: PathBuf,
        /// The parse error.
        source: serde_norway::Error,
    },
    /// No client for the API server.
    #[error("{0}")]
    Client(Box<crate::k8s::KubeError>),
    /// The PV could not be read from the cluster.
    #[error("read PersistentVolume {name}")]
    Fetch {
        /// The PV.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// The PV cannot be translated.
    #[error(transparent)]
    Translate(#[from] TranslateError),
    /// The translated PV could not be written out.
    #[error("encode the translated PV")]
    Encode(#[source] serde_norway::Error),
    /// `--apply` on another node than the one holding the volume.
    #[error("the volume lives on node {node}; run --apply there (this is node {here})")]
    OtherNode {
        /// The PV's node.
        node: String,
        /// This node.
        here: String,
    },
    /// The agent could not be asked, or refused the adoption.
    #[error(transparent)]
    Agent(#[from] CtlError),
    /// No async runtime could be made.
    #[error("start the runtime")]
    Runtime(#[source] std::io::Error),
}

/// Runs `drivelet ctl migrate` (see the module rules): prints the translated PV, and
/// with `apply` adopts the volume through the admin socket (`socket`, else the
/// config's).
pub fn run(config: Option<&Path>, socket: Option<PathBuf>, source: Option<Source>, apply: bool) -> Result<(), MigrateError> {
    let cfg = Config::load(config)?;
    let tr = Translator::from_config(&cfg);
    if !tr.is_migrated(IN_TREE_PLUGIN) {
        return Err(MigrateError::Off);
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(MigrateError::Runtime)?;
    let pv = match source.ok_or(MigrateError::NoSource)? {
        Source::File(f) => read_file(&f)?,
        Source::Cluster(name) => {
            if !cfg.kubernetes.enabled {
                return Err(MigrateError::NoKubernetes);
            }
            rt.block_on(async {
                let client = crate::k8s::client(&cfg.kubernetes).await.map_err(|e| MigrateError::Client(Box::new(e)))?;
                let pvs: kube::Api<PersistentVolume> = kube::Api::all(client);
                pvs.get(&name).await.map_err(|source| MigrateError::Fetch { name: name.clone(), source })
            })?
        }
    };
    let translated = tr.translate_to_csi(&pv)?;
    let origin = tr.local_origin(&translated)?;
    print!("{}", serde_norway::to_string(&translated).map_err(MigrateError::Encode)?);
    if !apply {
        eprintln!("dry run: nothing adopted; run with --apply on node {} to adopt {}", origin.node, origin.path);
        return Ok(());
    }
    if origin.node != cfg.driver.node_name {
        return Err(MigrateError::OtherNode { node: origin.node, here: cfg.driver.node_name });
    }
    let socket = socket.unwrap_or_else(|| cfg.paths.admin_socket.clone());
    let req = AdminRequest::Adopt {
        volume_id: origin.volume_handle.clone(),
        pv_name: pv.metadata.name.clone().unwrap_or_default(),
        node: origin.node.clone(),
        path: PathBuf::from(&origin.path),
        fs_type: origin.fs_type.clone().unwrap_or_default(),
    };
    let rec = rt.block_on(ctl::adopt(&socket, &req))?;
    eprintln!(
        "adopted {} as volume {}: drivelet serves it from now on and never deletes its data; replace the PV with the translated one above",
        origin.path, rec.id
    );
    Ok(())
}

/// The PV in file `f` (`-`: stdin), YAML or JSON.
fn read_file(f: &Path) -> Result<PersistentVolume, MigrateError> {
    let text = if f == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).map_err(|source| MigrateError::Read { what: "the PV from stdin".into(), source })?
    } else {
        std::fs::read_to_string(f).map_err(|source| MigrateError::Read { what: f.display().to_string(), source })?
    };
    serde_norway::from_str(&text).map_err(|source| MigrateError::NotAPv { path: f.to_path_buf(), source })
}
