//! The HTTP endpoints (`[http] address`): `/healthz`, `/readyz` and `/metrics`.
//!
//! Rules:
//! - `/healthz` is the liveness probe: 200 when the inventory and the volume manager
//!   answer a query within `ACTOR_TIMEOUT` (an actor wedged on its thread makes it
//!   fail, so kubelet restarts the pod); 503 says which actor did not answer.
//! - `/readyz` is the readiness probe: 200 only once the first drive scan is done, the
//!   volume manager has reconciled its store, and the CSI socket serves; 503 lists what
//!   is missing.
//! - `/metrics` answers the format the scraper's `Accept` header asks for
//!   ([`Format::negotiate`]): OpenMetrics text where it asks for
//!   `application/openmetrics-text` (Prometheus does), else the Prometheus text format
//!   0.0.4 (promtool, older agents, curl); its `Content-Type` says which, and `Vary:
//!   Accept` that it depends on the header. State is read from the actors at scrape time
//!   in a few round trips (not one per drive or volume).
//! - GET (and HEAD) only; anything else is 405, an unknown path 404. Plain HTTP: the
//!   endpoints say nothing secret.

use std::convert::Infallible;
use std::time::Duration;

use actix::prelude::*;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::actors::inventory::DriveInventory;
use crate::actors::messages::{GetInventoryStatus, InventoryStatus, ListDrives};
use crate::actors::volumes::{ScrapeVolumes, VolumeManager, VolumesReady};
use crate::k8s::attach::{AttachQueue, GetQueueStats, ManagerBackend};
use crate::metrics::{gather, metrics, Format, Gauges};

/// How long a probe waits for an actor to answer.
pub(crate) const ACTOR_TIMEOUT: Duration = Duration::from_secs(2);

/// The actors the endpoints ask.
#[derive(Clone)]
pub(crate) struct Endpoints {
    /// Drive inventory.
    pub inventory: Addr<DriveInventory>,
    /// Volume manager.
    pub volumes: Addr<VolumeManager>,
    /// The attach queue, when it runs.
    pub attach: Option<Addr<AttachQueue<ManagerBackend>>>,
    /// The node's name, on every per-drive and per-volume series.
    pub node: String,
}

async fn ask<A, M>(addr: &Addr<A>, m: M) -> Option<M::Result>
where
    A: Actor + Handler<M>,
    A::Context: actix::dev::ToEnvelope<A, M>,
    M: Message + Send + 'static,
    M::Result: Send,
{
    tokio::time::timeout(ACTOR_TIMEOUT, addr.send(m)).await.ok()?.ok()
}

impl Endpoints {
    async fn healthz(&self) -> (StatusCode, String) {
        let mut silent = Vec::new();
        if ask(&self.inventory, GetInventoryStatus).await.is_none() {
            silent.push("inventory");
        }
        if ask(&self.volumes, VolumesReady).await.is_none() {
            silent.push("volume manager");
        }
        if silent.is_empty() {
            (StatusCode::OK, "ok\n".into())
        } else {
            (StatusCode::SERVICE_UNAVAILABLE, format!("not answering: {}\n", silent.join(", ")))
        }
    }

    /// What keeps the agent from being ready (empty: ready).
    async fn not_ready(&self) -> Vec<&'static str> {
        let mut missing = Vec::new();
        match ask(&self.inventory, GetInventoryStatus).await {
            Some(InventoryStatus { scanned: true, .. }) => {}
            Some(_) => missing.push("first drive scan not done"),
            None => missing.push("inventory not answering"),
        }
        match ask(&self.volumes, VolumesReady).await {
            Some(true) => {}
            Some(false) => missing.push("volume store not reconciled"),
            None => missing.push("volume manager not answering"),
        }
        if !metrics().csi_serving() {
            missing.push("CSI socket not serving");
        }
        missing
    }

    async fn readyz(&self) -> (StatusCode, String) {
        let missing = self.not_ready().await;
        if missing.is_empty() {
            (StatusCode::OK, "ready\n".into())
        } else {
            (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {}\n", missing.join(", ")))
        }
    }

    /// What a scrape shows, read from the actors now: three round trips (the
    /// inventory's drives, the volume manager's view and records, the attach queue)
    /// plus the readiness checks, however many drives and volumes there are.
    async fn gauges(&self) -> Gauges {
        let drives = ask(&self.inventory, ListDrives).await.unwrap_or_default();
        let scrape = ask(&self.volumes, ScrapeVolumes).await.unwrap_or_default();
        let attach = match &self.attach {
            Some(q) => ask(q, GetQueueStats::default()).await.map(|s| (s.waiting, s.running, s.retries, s.relists)),
            None => None,
        };
        let ready = self.not_ready().await.is_empty();
        gather::gauges(&self.node, ready, &drives, &scrape, attach)
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let negotiated = req.uri().path() == "/metrics";
        let (status, ctype, body) = if req.method() != Method::GET && req.method() != Method::HEAD {
            (StatusCode::METHOD_NOT_ALLOWED, "text/plain", "only GET\n".to_string())
        } else {
            match req.uri().path() {
                "/healthz" => {
                    let (s, b) = self.healthz().await;
                    (s, "text/plain", b)
                }
                "/readyz" => {
                    let (s, b) = self.readyz().await;
                    (s, "text/plain", b)
                }
                "/metrics" => {
                    let format = Format::negotiate(&accept(&req));
                    let g = self.gauges().await;
                    (StatusCode::OK, format.content_type(), metrics().render(g, format))
                }
                _ => (StatusCode::NOT_FOUND, "text/plain", "not found; try /healthz, /readyz or /metrics\n".to_string()),
            }
        };
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = status;
        if let Ok(v) = hyper::header::HeaderValue::from_str(ctype) {
            resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
        }
        if negotiated && status == StatusCode::OK {
            resp.headers_mut().insert(hyper::header::VARY, hyper::header::HeaderValue::from_static("accept"));
        }
        resp
    }
}

/// Every `Accept` header of `req`, in order, joined with commas (empty when none).
fn accept<B>(req: &Request<B>) -> String {
    let values: Vec<&str> = req.headers().get_all(hyper::header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).collect();
    values.join(",")
}

/// Serves the endpoints on `listener` until `stop` fires.
pub(crate) async fn serve(listener: TcpListener, endpoints: Endpoints, mut stop: tokio::sync::oneshot::Receiver<()>) {
    if let Ok(addr) = listener.local_addr() {
        info!(http.address = %addr, "serving /healthz, /readyz and /metrics");
    }
    loop {
        let accepted = tokio::select! {
            _ = &mut stop => break,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                warn!(error = %e, "HTTP accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let ep = endpoints.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let ep = ep.clone();
                async move { Ok::<_, Infallible>(ep.answer(req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            // A probe that never finishes its request does not hold a task forever.
            let _ = tokio::time::timeout(Duration::from_secs(60), conn).await;
        });
    }
}
