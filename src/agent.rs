//! `drivelet run`: brings the node agent up in order and down cleanly.
//!
//! Order: state directory, demo drives, sockets (bind errors are fatal here, before any
//! actor starts), then every actor at once through `supervisor::start` (core actors, CSI
//! and admin servers, then, with `kubelet.registration`, the kubelet registration
//! server, so kubelet finds a CSI socket that answers, then the Kubernetes front), then
//! the HTTP endpoints.
//! SIGTERM or SIGINT: hand the cluster duties Lease over (when held), stop accepting
//! (registration first, so kubelet deregisters),
//! finish in-flight calls, remove the sockets, detach demo drives, stop the system.

use std::sync::Arc;

use tokio::signal::unix::{signal, SignalKind};
use tracing::info;

use crate::config::Config;
use crate::demo::Demo;
use crate::disk::DiskError;
use crate::grpc::{self, Shutdown, SocketError};
use crate::supervisor;

/// Fatal errors of the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The state directory could not be created.
    #[error("cannot create state directory {dir}: {source}")]
    StateDir {
        /// The directory.
        dir: String,
        /// OS error.
        source: std::io::Error,
    },
    /// Demo drives could not be set up.
    #[error("demo drives: {0}")]
    Demo(#[from] DiskError),
    /// A socket could not be set up.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// `[kubernetes]` is on but no API client could be made.
    #[error("kubernetes: {0}")]
    Kubernetes(#[from] crate::k8s::KubeError),
    /// The HTTP endpoints' address could not be bound.
    #[error("cannot listen on http.address {address}: {source}")]
    Http {
        /// The address.
        address: String,
        /// OS error.
        source: std::io::Error,
    },
    /// Signal handlers could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
}

/// Runs the agent until SIGTERM/SIGINT. Must be called inside an actix System that
/// runs on a multi-thread tokio runtime.
pub async fn run(cfg: Config) -> Result<(), AgentError> {
    let cfg = Arc::new(cfg);
    info!(node.name = %cfg.driver.node_name, driver.name = %cfg.driver.name, version = env!("CARGO_PKG_VERSION"), "drivelet starting");
    if !crate::disk::has_capability(crate::disk::CAP_SYS_RESOURCE) {
        tracing::warn!("no CAP_SYS_RESOURCE: mounted ext4 volumes cannot grow (NodeExpandVolume fails); xfs and block volumes can");
    }
    std::fs::create_dir_all(&cfg.paths.state_dir)
        .map_err(|source| AgentError::StateDir { dir: cfg.paths.state_dir.display().to_string(), source })?;
    // A freeze an earlier run left (killed between FIFREEZE and its thaw, its watchdog
    // killed too): thawed before anything else.
    let journal = crate::disk::freeze::Journal::under(&cfg.paths.state_dir);
    for said in crate::disk::freeze::thaw_left(&journal, &cfg.volumes.allowed_roots) {
        tracing::warn!(freeze.journal = %journal.dir.display(), "{said}");
    }
    let mut sigterm = signal(SignalKind::terminate()).map_err(AgentError::Signals)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(AgentError::Signals)?;

    let kube = if cfg.kubernetes.enabled {
        Some(crate::k8s::client(&cfg.kubernetes).await.map_err(AgentError::Kubernetes)?)
    } else {
        None
    };

    // Whose this node's drives are: known before any drive is judged or written.
    let cluster = crate::k8s::cluster_id::resolve(&cfg.driver.cluster_id, kube.as_ref(), &cfg.paths.state_dir).await;
    let me = crate::words::Owner { cluster, node: cfg.driver.node_name.clone() };
    info!(cluster.id = %me.cluster, node.name = %me.node, "drives this node owns name cluster {} and node {}", me.cluster, me.node);
    if let Err(set) = crate::disk::note::set_identity(me) {
        tracing::warn!(cluster.id = %set.cluster, "this process already runs as node {} of cluster {}", set.node, set.cluster);
    }

    let mut demo = if cfg.demo.enabled {
        let dc = cfg.demo.clone();
        let state = cfg.paths.state_dir.clone();
        Some(tokio::task::spawn_blocking(move || Demo::setup(&dc, &state)).await.expect("demo setup task")?)
    } else {
        None
    };
    // Only a socket this run bound is removed on failure: an error may mean another
    // live agent owns the path, or that something that is not a socket sits there.
    let reg_path = cfg.registration_socket();
    let sockets = match grpc::bind_socket(&cfg.paths.csi_socket) {
        Ok(c) => grpc::bind_socket(&cfg.paths.admin_socket).map(|a| (c, a)).inspect_err(|_| {
            let _ = std::fs::remove_file(&cfg.paths.csi_socket);
        }),
        Err(e) => Err(e),
    };
    let sockets = sockets.and_then(|(c, a)| {
        let reg = if cfg.kubelet.registration { grpc::bind_socket(&reg_path).map(Some) } else { Ok(None) };
        reg.map(|r| (c, a, r)).inspect_err(|_| {
            let _ = std::fs::remove_file(&cfg.paths.csi_socket);
            let _ = std::fs::remove_file(&cfg.paths.admin_socket);
        })
    });
    let http_listener = match sockets {
        Ok(s) if !cfg.http.address.is_empty() => match tokio::net::TcpListener::bind(&cfg.http.address).await {
            Ok(l) => Ok((s, Some(l))),
            Err(e) => {
                let _ = std::fs::remove_file(&cfg.paths.csi_socket);
                let _ = std::fs::remove_file(&cfg.paths.admin_socket);
                if s.2.is_some() {
                    let _ = std::fs::remove_file(&reg_path);
                }
                Err(AgentError::Http { address: cfg.http.address.clone(), source: e })
            }
        },
        Ok(s) => Ok((s, None)),
        Err(e) => Err(e.into()),
    };
    let ((csi_listener, admin_listener, reg_listener), http_listener) = match http_listener {
        Ok(s) => s,
        Err(e) => {
            if let Some(d) = demo.as_mut() {
                d.teardown();
            }
            return Err(e);
        }
    };

    let sockets = supervisor::Sockets { csi: csi_listener, admin: admin_listener, registration: reg_listener };
    let running = supervisor::start(&cfg, sockets, kube);
    let actors = &running.actors;
    let attach = running.attach.clone();
    let http_stop = http_listener.map(|l| {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let endpoints = crate::http::Endpoints { inventory: actors.inventory.clone(), volumes: actors.volumes.clone(), attach, node: cfg.driver.node_name.clone() };
        tokio::spawn(crate::http::serve(l, endpoints, rx));
        tx
    });

    let which = tokio::select! {
        _ = sigterm.recv() => "SIGTERM",
        _ = sigint.recv() => "SIGINT",
    };
    info!(signal = which, "shutting down");
    if let Some(d) = running.duties {
        d.shutdown().await;
    }
    if let Some(r) = &running.registrar {
        let _ = r.send(Shutdown).await;
    }
    if let Some(tx) = http_stop {
        let _ = tx.send(());
    }
    let _ = running.csi.send(Shutdown).await;
    let _ = running.admin_stop.send(());
    let _ = running.admin_task.await;
    let _ = std::fs::remove_file(&cfg.paths.admin_socket);
    if let Some(mut d) = demo {
        tokio::task::spawn_blocking(move || d.teardown()).await.ok();
    }
    info!("drivelet stopped");
    Ok(())
}

/// Sets glibc's allocator up for a process that lives for months, holds little and
/// allocates in bursts (a volume operation, a clone's copy buffer, a Kubernetes relist):
/// - two malloc arenas, not one per thread: the agent's threads allocate little, and
///   every arena keeps its own free memory;
/// - allocations of 128 KiB and more get pages of their own, returned to the kernel the
///   moment they are freed, and free memory above 128 KiB at the top of an arena is
///   returned too. These are glibc's starting values, made fixed: left alone, glibc
///   raises both after the first large buffer is freed (to its size, up to 32 MiB, and
///   twice that), so every later buffer below that size came from the arena and stayed
///   resident once freed. Measured on the demo agent after a burst of lifecycles and
///   clones: 5.4 MiB of anonymous memory, 0.9 MiB of it in use, instead of 2.5 MiB.
///
/// Call it first thing, before any other thread exists. No-op on other C libraries.
pub fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes the allocator's parameters; called before any other
    // thread exists, nothing allocates concurrently.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, ALLOCATOR_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, ALLOCATOR_THRESHOLD);
    }
}

/// The size from which [`tune_allocator`] maps an allocation on its own, and the free
/// memory at an arena's top it returns.
pub const ALLOCATOR_THRESHOLD: i32 = 128 * 1024;
