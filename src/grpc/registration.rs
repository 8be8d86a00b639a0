//! Kubelet plugin registration (API v1): the job node-driver-registrar used to do.
//! Kubelet's plugin watcher finds `<kubelet.dir>/plugins_registry/<driver>-reg.sock`,
//! asks it which plugin lives where (`GetInfo`), registers the CSI endpoint and reports
//! the outcome (`NotifyRegistrationStatus`).
//!
//! Rules:
//! - `GetInfo` answers type `CSIPlugin`, the driver name, the CSI socket path and the
//!   one CSI version served, `1.0.0`;
//! - every reported status is logged (info when registered, error with kubelet's error
//!   when not) and the last one is kept in [`RegistrationState`] for whoever asks;
//! - the socket is created mode 0600 like every other socket (stale ones removed,
//!   live ones and non-sockets never touched);
//! - the [`Registrar`] actor checks the path every second: when the socket file is
//!   gone or replaced (kubelet's registry directory was wiped), it binds a fresh socket
//!   so kubelet registers the plugin again; a serving task that fails is restarted the
//!   same way, and the actor itself is supervised;
//! - on shutdown the socket is removed, so kubelet deregisters the plugin.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};
use tracing::{error, info, warn};

use super::proto::registration::{
    registration_server::{Registration, RegistrationServer},
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use super::{bind_socket, Shutdown, SHUTDOWN_GRACE};

/// The plugin type kubelet expects from a CSI driver.
pub(crate) const PLUGIN_TYPE: &str = "CSIPlugin";
/// The CSI versions offered to kubelet.
pub(crate) const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];
/// How often the registrar checks that its socket is still there.
pub(crate) const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// The last registration status kubelet reported.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct LastStatus {
    /// Kubelet registered the plugin.
    pub registered: bool,
    /// Kubelet's error when it did not (empty otherwise).
    pub error: String,
    /// When it was reported (unix seconds).
    pub at_unix: u64,
}

/// Shared record of kubelet's last registration report, readable from anywhere (the
/// admin socket, health reporting).
#[derive(Debug, Clone, Default)]
pub(crate) struct RegistrationState(Arc<Mutex<Option<LastStatus>>>);

impl RegistrationState {
    /// Records a report.
    pub(crate) fn record(&self, registered: bool, error: String) {
        let at_unix =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(LastStatus { registered, error, at_unix });
    }

    #[cfg(test)]
    /// The last report; `None` until kubelet reported once.
    pub(crate) fn last(&self) -> Option<LastStatus> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The registration service: what kubelet asks and tells.
#[derive(Clone)]
pub(crate) struct RegistrationService {
    /// Driver name (`GetInfo.name`).
    pub driver: String,
    /// CSI socket kubelet should call (`GetInfo.endpoint`).
    pub endpoint: PathBuf,
    /// Where reports are kept.
    pub state: RegistrationState,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.to_string(),
            name: self.driver.clone(),
            endpoint: self.endpoint.display().to_string(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let s = req.into_inner();
        if s.plugin_registered {
            info!(driver.name = %self.driver, "kubelet registered the plugin");
        } else {
            error!(driver.name = %self.driver, error = %s.error, "kubelet failed to register the plugin");
        }
        self.state.record(s.plugin_registered, s.error);
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// Serves the registration service on `listener` until `shutdown` fires.
pub(crate) async fn serve_registration(
    service: RegistrationService,
    listener: UnixListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    tonic::transport::Server::builder()
        .add_service(RegistrationServer::new(service))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// Identity of a file, to notice a socket replaced behind our back.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::FileTypeExt;
    let md = std::fs::symlink_metadata(path).ok()?;
    md.file_type().is_socket().then(|| (md.dev(), md.ino()))
}

/// The serving task of one bound socket.
struct Serving {
    generation: u64,
    stop_tx: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    /// The socket file this task listens on.
    file: Option<(u64, u64)>,
}

/// The actor that owns the registration socket, its serving task and the watcher that
/// re-creates the socket when it disappears.
pub(crate) struct Registrar {
    service: RegistrationService,
    path: PathBuf,
    listener: Option<UnixListener>,
    serving: Option<Serving>,
    generation: u64,
    /// Last bind error logged, so a persisting one is logged once.
    last_error: Option<String>,
    stopping: bool,
}

impl Registrar {
    /// A registrar serving on an already bound listener at `path` (bind errors are
    /// fatal at startup, before any actor runs).
    pub(crate) fn new(service: RegistrationService, path: PathBuf, listener: UnixListener) -> Registrar {
        Registrar { service, path, listener: Some(listener), serving: None, generation: 0, last_error: None, stopping: false }
    }

    /// Binds (unless a listener is at hand) and starts a serving task.
    fn serve(&mut self, ctx: &mut Context<Self>) {
        let listener = match self.listener.take() {
            Some(l) => l,
            None => match bind_socket(&self.path) {
                Ok(l) => l,
                Err(e) => {
                    let msg = e.to_string();
                    if self.last_error.as_deref() != Some(msg.as_str()) {
                        error!(actor = "registrar", error = %msg, "cannot bind the registration socket; retrying every second");
                        self.last_error = Some(msg);
                    }
                    return;
                }
            },
        };
        self.last_error = None;
        self.generation += 1;
        let generation = self.generation;
        let (stop_tx, rx) = oneshot::channel::<()>();
        let addr = ctx.address();
        let service = self.service.clone();
        info!(actor = "registrar", socket.path = %self.path.display(), "serving kubelet plugin registration");
        let task = tokio::spawn(async move {
            let res = serve_registration(service, listener, async {
                let _ = rx.await;
            })
            .await;
            addr.do_send(RegistrationEnded { generation, error: res.err().map(|e| e.to_string()).unwrap_or_default() });
        });
        self.serving = Some(Serving { generation, stop_tx, task, file: file_id(&self.path) });
    }

    /// Stops the current serving task; in-flight calls get the grace period.
    fn stop_serving(&mut self) -> Option<tokio::task::JoinHandle<()>> {
        let s = self.serving.take()?;
        let _ = s.stop_tx.send(());
        Some(s.task)
    }

    /// The watcher: re-creates a socket that vanished or was replaced, and retries a
    /// bind that failed.
    fn check(&mut self, ctx: &mut Context<Self>) {
        if self.stopping {
            return;
        }
        match &self.serving {
            None => self.serve(ctx),
            Some(s) if file_id(&self.path) != s.file || s.file.is_none() => {
                warn!(actor = "registrar", socket.path = %self.path.display(),
                      "registration socket is gone (kubelet's plugin registry was cleaned?); re-creating it");
                if let Some(t) = self.stop_serving() {
                    tokio::spawn(finish(t));
                }
                self.serve(ctx);
            }
            Some(_) => {}
        }
    }
}

/// Lets a stopped task finish its calls, then drops what is left.
async fn finish(mut t: tokio::task::JoinHandle<()>) {
    if tokio::time::timeout(SHUTDOWN_GRACE, &mut t).await.is_err() {
        t.abort();
    }
}

/// Notification: a serving task ended by itself.
#[derive(Message)]
#[rtype(result = "()")]
struct RegistrationEnded {
    generation: u64,
    error: String,
}

impl Actor for Registrar {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.serve(ctx);
        ctx.run_interval(WATCH_INTERVAL, |act, ctx| act.check(ctx));
    }
}

impl Supervised for Registrar {
    fn restarting(&mut self, _: &mut Context<Self>) {
        warn!(actor = "registrar", "restarting the registration server");
        if let Some(t) = self.stop_serving() {
            t.abort();
        }
        self.last_error = None;
    }
}

impl Handler<RegistrationEnded> for Registrar {
    type Result = ();
    fn handle(&mut self, m: RegistrationEnded, ctx: &mut Context<Self>) {
        // Only the current task matters; one that was replaced or stopped is expected to end.
        if self.stopping || self.serving.as_ref().map(|s| s.generation) != Some(m.generation) {
            return;
        }
        error!(actor = "registrar", error = %m.error, "registration server stopped unexpectedly; restarting it");
        self.serving = None;
        self.serve(ctx);
    }
}

impl Handler<Shutdown> for Registrar {
    type Result = ResponseActFuture<Self, ()>;
    fn handle(&mut self, _: Shutdown, _: &mut Context<Self>) -> Self::Result {
        self.stopping = true;
        let task = self.stop_serving();
        let path = self.path.clone();
        Box::pin(
            async move {
                if let Some(t) = task {
                    finish(t).await;
                }
                let _ = std::fs::remove_file(&path);
                info!(actor = "registrar", socket.path = %path.display(), "registration server stopped, socket removed");
            }
            .into_actor(self),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service() -> RegistrationService {
        RegistrationService {
            driver: "csi.drivelet.io".into(),
            endpoint: "/var/lib/kubelet/plugins/csi.drivelet.io/csi.sock".into(),
            state: RegistrationState::default(),
        }
    }

    /// Runs a future on a fresh single-thread runtime.
    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().build().expect("runtime").block_on(f)
    }

    #[test]
    fn get_info_names_a_csi_plugin_its_endpoint_and_version() {
        let info = block_on(service().get_info(Request::new(InfoRequest {}))).unwrap().into_inner();
        assert_eq!(info.r#type, "CSIPlugin");
        assert_eq!(info.name, "csi.drivelet.io");
        assert_eq!(info.endpoint, "/var/lib/kubelet/plugins/csi.drivelet.io/csi.sock");
        assert_eq!(info.supported_versions, vec!["1.0.0".to_string()]);
    }

    #[test]
    fn the_last_reported_status_is_remembered() {
        let s = service();
        assert_eq!(s.state.last(), None);
        let report = |registered: bool, error: &str| {
            block_on(s.notify_registration_status(Request::new(RegistrationStatus {
                plugin_registered: registered,
                error: error.into(),
            })))
            .unwrap();
        };
        report(false, "no");
        let last = s.state.last().unwrap();
        assert!(!last.registered);
        assert_eq!(last.error, "no");
        report(true, "");
        assert!(s.state.last().unwrap().registered);
        assert_eq!(s.state.last().unwrap().error, "");
    }
}
