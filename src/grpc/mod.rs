//! The gRPC front: CSI Identity, Controller and Node on the CSI socket, kubelet plugin
//! registration on the registration socket, and the admin socket for `drivelet ctl`.
//! It never touches a disk.
//!
//! Every CSI handler reads: validate, ask, answer.
//! - validate: a validator of [`valid`] takes the request's parameters and answers the
//!   volume manager's message (or the checked values), recording the ids the call
//!   names on its span; StorageClass parameters and capabilities are judged in
//!   [`params`];
//! - ask: [`Front::ask`] sends the message and maps both a mailbox error (UNAVAILABLE)
//!   and the manager's own error into the call's status in one call; the cheap calls
//!   (Probe, GetCapacity, ListVolumes) read the published [`Views`] instead;
//! - answer: the CSI form of what came back (`controller.rs`, `node.rs`,
//!   `volume_health.rs`).
//!
//! The words of every refusal and their gRPC codes live in [`status`]: typed
//! [`status::FrontError`] variants for the reasons given at more than one place, the
//! volume manager's `VolumeError` mapped by one table.
//!
//! Rules:
//! - sockets are created mode 0600 (owner only); a stale socket from a previous run is
//!   removed, but a socket another live process answers on is an error, and a path
//!   that is not a socket is never deleted. A socket that still accepts connections
//!   while the process that listens on it has exited (a child it was starting holds a
//!   copy until its exec closes it) is stale too;
//! - the [`CsiFront`] actor owns the serving task: it stops accepting and finishes
//!   in-flight calls on shutdown, and is restarted (rebinding) if the task fails.

/// The admin socket behind `drivelet ctl`: one JSON request and answer per line.
pub(crate) mod admin;
pub(crate) mod controller;
pub(crate) mod volume_health;
/// The CSI Identity service: plugin info, capabilities, Probe.
pub(crate) mod identity;
pub(crate) mod node;
pub mod params;
pub(crate) mod registration;
/// The CSI request counter and latency histogram, labelled from closed sets.
pub(crate) mod rpc_metrics;
pub(crate) mod status;
pub(crate) mod valid;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use actix::dev::ToEnvelope;
use actix::prelude::*;
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tracing::{error, info, warn};

use crate::actors::inventory::{DriveInventory, ScanReader};
use crate::actors::volumes::view::{ViewReader, VolumesView};
use crate::actors::volumes::{VolumeError, VolumeManager};
use crate::config::Config;

/// Generated protocol code.
pub mod proto {
    /// CSI v1.12.0 plus the v1.13.0 health API (`csi.v1`; `proto/csi.proto` says what).
    pub mod csi {
        #![allow(missing_docs, clippy::all)]
        tonic::include_proto!("csi.v1");
        // Debug of every message with a `secrets` field: the secrets show as a count.
        include!(concat!(env!("OUT_DIR"), "/csi_secrets_debug.rs"));
    }
    /// Kubelet plugin registration API v1.
    pub mod registration {
        #![allow(missing_docs, clippy::all)]
        tonic::include_proto!("pluginregistration");
    }
}

/// How a request's secrets show in `Debug` (and so in any log line or error made from
/// it): how many there are, never a key or a value.
pub struct Redacted(pub usize);

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} secrets, not shown>", self.0)
    }
}

/// Errors setting up a socket.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// The directory could not be created.
    #[error("cannot create socket directory {dir}: {source}; make it writable or choose another path")]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
    /// Something that is not a socket sits at the path.
    #[error("{path} exists and is not a socket; refusing to delete it")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// Another live process serves on the path.
    #[error("{path} is in use by another running process (is another drivelet running?)")]
    InUse {
        /// The path.
        path: PathBuf,
    },
    /// bind/chmod failed.
    #[error("cannot listen on {path}: {source}")]
    Bind {
        /// The path.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
}

/// Binds a unix socket at `path` with mode 0600, removing a stale socket first.
pub fn bind_socket(path: &Path) -> Result<UnixListener, SocketError> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| SocketError::Dir { dir: dir.to_path_buf(), source })?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.file_type().is_socket() => {
            if let Ok(probe) = std::os::unix::net::UnixStream::connect(path) {
                match listener_pid(&probe) {
                    Some(pid) if !process_alive(pid) => {
                        warn!(socket.path = %path.display(), socket.owner_pid = pid,
                              "the process that listened on this socket has exited (a process it started still holds it); replacing it");
                    }
                    _ => return Err(SocketError::InUse { path: path.to_path_buf() }),
                }
            }
            info!(socket.path = %path.display(), "removing stale socket");
            std::fs::remove_file(path).map_err(|source| SocketError::Bind { path: path.to_path_buf(), source })?;
        }
        Ok(_) => return Err(SocketError::NotASocket { path: path.to_path_buf() }),
        Err(_) => {}
    }
    // Create the socket with no group/other permission bits from the start.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = std::os::unix::net::UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let l = bound.map_err(|source| SocketError::Bind { path: path.to_path_buf(), source })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|source| SocketError::Bind { path: path.to_path_buf(), source })?;
    l.set_nonblocking(true).map_err(|source| SocketError::Bind { path: path.to_path_buf(), source })?;
    UnixListener::from_std(l).map_err(|source| SocketError::Bind { path: path.to_path_buf(), source })
}

/// The process that listens on the socket `conn` is connected to (the kernel records
/// it at `listen()`); `None` when unknown (not visible from this PID namespace).
fn listener_pid(conn: &std::os::unix::net::UnixStream) -> Option<i32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the descriptor is open for the call; the kernel writes at most `len` bytes
    // into `cred`, which lives on this frame.
    let r = unsafe { libc::getsockopt(conn.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len) };
    (r == 0 && cred.pid > 0).then_some(cred.pid)
}

/// Whether process `pid` still runs (a zombie holds no descriptors: it does not).
fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses and may hold any byte.
        Ok(stat) => stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()).is_none_or(|state| state != 'Z'),
        Err(e) => e.kind() != std::io::ErrorKind::NotFound,
    }
}

/// What the actors publish for the cheap calls (Probe, GetCapacity, ListVolumes), read
/// without a message.
#[derive(Clone)]
pub struct Views {
    /// Whether the inventory's first full scan is done.
    pub scanned: ScanReader,
    /// The volume manager's book.
    pub volumes: ViewReader,
}

impl Views {
    /// Whether the inventory's first full scan is done; UNAVAILABLE when the inventory
    /// is gone.
    pub fn scan_done(&self) -> Result<bool, status::FrontError> {
        self.scanned.get().ok_or_else(|| status::FrontError::Unavailable { actor: "drive inventory", reason: "it stopped".into() })
    }

    /// The volume manager's latest view; UNAVAILABLE when the manager is gone.
    pub fn book(&self) -> Result<Arc<VolumesView>, status::FrontError> {
        self.volumes.get().ok_or_else(|| status::FrontError::Unavailable { actor: "volume manager", reason: "it stopped".into() })
    }
}

/// Shared, read-only state of the CSI services: config, actor addresses and views.
#[derive(Clone)]
pub struct Front {
    /// Configuration.
    pub cfg: Arc<Config>,
    /// Topology segments of this node (computed once).
    pub topology: HashMap<String, String>,
    /// The drive inventory.
    pub inventory: Addr<DriveInventory>,
    /// The volume manager.
    pub volumes: Addr<VolumeManager>,
    /// What the actors publish.
    pub views: Views,
    /// Random per-run value that ListVolumes tokens carry, so a token from an earlier
    /// run is recognised as stale.
    pub token_nonce: u64,
}

impl Front {
    /// Front state for a config and the actors.
    pub fn new(cfg: Arc<Config>, inventory: Addr<DriveInventory>, volumes: Addr<VolumeManager>, views: Views) -> Front {
        let topology = cfg.topology_segments().into_iter().collect();
        let token_nonce = uuid::Uuid::new_v4().as_u64_pair().0;
        Front { cfg, topology, inventory, volumes, views, token_nonce }
    }

    /// Asks the volume manager: sends `m` and maps a mailbox error (UNAVAILABLE) and the
    /// manager's own error (its CSI code, [`status`]) into the call's status.
    pub(crate) async fn ask<M, T>(&self, m: M) -> Result<T, tonic::Status>
    where
        M: Message<Result = Result<T, VolumeError>> + Send + 'static,
        T: Send + 'static,
        VolumeManager: Handler<M>,
        <VolumeManager as Actor>::Context: ToEnvelope<VolumeManager, M>,
    {
        Ok(self.volumes.send(m).await.map_err(status::FrontError::mailbox("volume manager"))??)
    }

    /// A ListVolumes token resuming after volume `id`.
    pub fn token(&self, id: &str) -> String {
        list_token(self.token_nonce, id)
    }

    /// The volume id a token resumes after; `None` when malformed or stale.
    pub fn parse_token(&self, t: &str) -> Option<String> {
        parse_list_token(self.token_nonce, t)
    }

    /// Where a paged list starts and how long a page is (0: no limit), from its
    /// `max_entries` and `starting_token`: a negative size is INVALID_ARGUMENT, a
    /// malformed or stale token ABORTED. One rule for every list RPC.
    pub(crate) fn page_start(&self, max_entries: i32, starting_token: &str) -> Result<(usize, Option<String>), tonic::Status> {
        let max = usize::try_from(max_entries).map_err(|_| status::FrontError::NegativeMaxEntries { max_entries })?;
        if starting_token.is_empty() {
            return Ok((max, None));
        }
        let after = self.parse_token(starting_token).ok_or_else(|| status::FrontError::BadToken { token: starting_token.to_string() })?;
        Ok((max, Some(after)))
    }

    /// Whether a requested topology includes this node: every segment it names must be
    /// one of ours with the same value.
    pub fn topology_matches(&self, t: &proto::csi::Topology) -> bool {
        t.segments.iter().all(|(k, v)| self.topology.get(k) == Some(v))
    }
}

/// A ListVolumes token of the run with `nonce`, resuming after volume `id`.
pub(crate) fn list_token(nonce: u64, id: &str) -> String {
    format!("{nonce:016x}:{id}")
}

/// The volume id a ListVolumes token of the run with `nonce` resumes after; `None` when
/// the token is malformed or from another run.
pub(crate) fn parse_list_token(nonce: u64, t: &str) -> Option<String> {
    let (n, id) = t.split_once(':')?;
    (u64::from_str_radix(n, 16).ok()? == nonce && !id.is_empty()).then(|| id.to_string())
}

/// Serves the three CSI services on `listener` until `shutdown` fires, then finishes
/// in-flight calls.
pub async fn serve_csi(
    front: Front,
    listener: UnixListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    use proto::csi::{
        controller_server::ControllerServer, group_controller_server::GroupControllerServer,
        identity_server::IdentityServer, node_server::NodeServer, snapshot_metadata_server::SnapshotMetadataServer,
    };
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    tonic::transport::Server::builder()
        .layer(rpc_metrics::RpcMetricsLayer)
        .add_service(IdentityServer::new(identity::IdentityService(front.clone())))
        .add_service(ControllerServer::new(controller::ControllerService(front.clone())))
        .add_service(NodeServer::new(node::NodeService(front)))
        // Not served: registered so that their calls answer UNIMPLEMENTED with a message.
        .add_service(GroupControllerServer::new(NotServed))
        .add_service(SnapshotMetadataServer::new(NotServed))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// The CSI services drivelet does not serve (volume group snapshots, snapshot
/// metadata): every call answers UNIMPLEMENTED.
pub struct NotServed;

#[tonic::async_trait]
impl proto::csi::group_controller_server::GroupController for NotServed {}

#[tonic::async_trait]
impl proto::csi::snapshot_metadata_server::SnapshotMetadata for NotServed {}

/// The actor that owns the CSI socket and its serving task.
pub struct CsiFront {
    front: Front,
    listener: Option<UnixListener>,
    stop_tx: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl CsiFront {
    /// A front that serves on an already bound listener (so bind errors are fatal at
    /// startup, before any actor runs).
    pub fn new(front: Front, listener: UnixListener) -> CsiFront {
        CsiFront { front, listener: Some(listener), stop_tx: None, task: None }
    }
}

/// How long shutdown waits for in-flight CSI calls.
pub(crate) const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Notification: the serving task ended by itself.
#[derive(Message)]
#[rtype(result = "()")]
struct ServerEnded(String);

/// Command: stop accepting, finish in-flight calls, remove the socket.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Shutdown;

impl Actor for CsiFront {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let path = self.front.cfg.paths.csi_socket.clone();
        let listener = match self.listener.take() {
            Some(l) => l,
            None => match bind_socket(&path) {
                Ok(l) => l,
                Err(e) => {
                    error!(actor = "csi-front", error = %e, "cannot rebind CSI socket; retrying in 1s");
                    ctx.run_later(std::time::Duration::from_secs(1), |_, ctx| ctx.stop());
                    return;
                }
            },
        };
        let (tx, rx) = oneshot::channel::<()>();
        self.stop_tx = Some(tx);
        let addr = ctx.address();
        let front = self.front.clone();
        info!(actor = "csi-front", socket.path = %path.display(), "serving CSI");
        crate::metrics::metrics().set_csi_serving(true);
        // Spawned onto the runtime's worker threads; actors stay on this thread.
        self.task = Some(tokio::spawn(async move {
            let res = serve_csi(front, listener, async {
                let _ = rx.await;
            })
            .await;
            match res {
                Ok(()) => addr.do_send(ServerEnded(String::new())),
                Err(e) => addr.do_send(ServerEnded(e.to_string())),
            }
        }));
    }
}

impl Supervised for CsiFront {
    fn restarting(&mut self, _: &mut Context<Self>) {
        warn!(actor = "csi-front", "restarting the CSI server");
        self.stop_tx = None;
        self.task = None;
    }
}

impl Handler<ServerEnded> for CsiFront {
    type Result = ();
    fn handle(&mut self, m: ServerEnded, ctx: &mut Context<Self>) {
        if self.stop_tx.is_some() {
            crate::metrics::metrics().set_csi_serving(false);
            error!(actor = "csi-front", error = %m.0, "CSI server stopped unexpectedly; restarting it");
            ctx.stop();
        }
    }
}

impl Handler<Shutdown> for CsiFront {
    type Result = ResponseActFuture<Self, ()>;
    fn handle(&mut self, _: Shutdown, _: &mut Context<Self>) -> Self::Result {
        if let Some(tx) = self.stop_tx.take() {
            let _ = tx.send(());
        }
        crate::metrics::metrics().set_csi_serving(false);
        let task = self.task.take();
        let path = self.front.cfg.paths.csi_socket.clone();
        Box::pin(
            async move {
                if let Some(mut t) = task {
                    // In-flight calls get a grace period; connections that stay open
                    // idle (kubelet keeps one forever) do not hold the shutdown up.
                    if tokio::time::timeout(SHUTDOWN_GRACE, &mut t).await.is_err() {
                        warn!(actor = "csi-front", "calls still open after the grace period; closing them");
                        t.abort();
                    }
                }
                let _ = std::fs::remove_file(&path);
                info!(actor = "csi-front", socket.path = %path.display(), "CSI server stopped, socket removed");
            }
            .into_actor(self),
        )
    }
}

#[cfg(test)]
mod secrets_tests {
    use super::proto::csi;

    /// Every CSI message with a `secrets` field: its Debug names the field and the
    /// count, never a key or a value.
    #[test]
    fn no_request_prints_its_secrets() {
        let secrets: std::collections::HashMap<String, String> =
            [("password".to_string(), "hunter2-value".to_string()), ("key-name-x".to_string(), "s3cr3t".to_string())].into();
        macro_rules! check {
            ($($t:ident),* $(,)?) => {$({
                let m = csi::$t { secrets: secrets.clone(), ..Default::default() };
                let shown = format!("{m:?} {m:#?}");
                for word in ["hunter2-value", "s3cr3t", "password", "key-name-x"] {
                    assert!(!shown.contains(word), "{} shows {word}: {shown}", stringify!($t));
                }
                assert!(shown.contains("secrets: <2 secrets, not shown>"), "{}: {shown}", stringify!($t));
            })*};
        }
        check!(
            ControllerExpandVolumeRequest, ControllerGetVolumeHealthRequest, ControllerListVolumeHealthRequest, ControllerModifyVolumeRequest,
            ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest, CreateSnapshotRequest, CreateVolumeGroupSnapshotRequest,
            CreateVolumeRequest, DeleteSnapshotRequest, DeleteVolumeGroupSnapshotRequest, DeleteVolumeRequest, GetMetadataAllocatedRequest,
            GetMetadataDeltaRequest, GetSnapshotRequest, GetVolumeGroupSnapshotRequest, ListSnapshotsRequest, NodeExpandVolumeRequest,
            NodeGetStorageHealthRequest, NodePublishVolumeRequest, NodeStageVolumeRequest, ValidateVolumeCapabilitiesRequest,
        );
        // Every other field is still shown.
        let m = csi::CreateVolumeRequest { name: "pvc-1".into(), secrets, ..Default::default() };
        assert!(format!("{m:?}").contains("name: \"pvc-1\""));
    }
}
