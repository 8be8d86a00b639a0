//! The CSI socket's request counter and latency histogram: a tower layer that counts
//! every request by method and gRPC code and times it (`metrics`).
//!
//! Rules:
//! - the `method` label is one of [`SERVED`], the methods of the three CSI services
//!   drivelet serves (Identity, Controller, Node), found by the request's whole path
//!   (`/csi.v1.Controller/CreateVolume`); any other path (a method of the services it
//!   does not serve, a typo, a path a client made up) counts as [`UNKNOWN`]. A client of
//!   the socket cannot mint a label value: the series are bounded by this table and the
//!   gRPC codes, whatever is sent;
//! - the code is the `grpc-status` of the response headers (tonic answers every error
//!   trailers-only, so it is there), else OK; a transport error counts as INTERNAL.

/// The label value of a request whose path is none of [`SERVED`].
pub(crate) const UNKNOWN: &str = "unknown";

/// The CSI services drivelet serves (their `csi.v1` names) and each one's methods:
/// every rpc of those services in `proto/csi.proto`, in its order (a unit test holds
/// the two together).
pub(crate) const SERVED: &[(&str, &[&str])] = &[
    ("Identity", &["GetPluginInfo", "GetPluginCapabilities", "Probe"]),
    (
        "Controller",
        &[
            "CreateVolume",
            "DeleteVolume",
            "ControllerPublishVolume",
            "ControllerUnpublishVolume",
            "ValidateVolumeCapabilities",
            "ListVolumes",
            "GetCapacity",
            "ControllerGetCapabilities",
            "CreateSnapshot",
            "DeleteSnapshot",
            "ListSnapshots",
            "GetSnapshot",
            "ControllerExpandVolume",
            "ControllerGetVolume",
            "ControllerModifyVolume",
            "ControllerListVolumeHealth",
            "ControllerGetVolumeHealth",
        ],
    ),
    (
        "Node",
        &[
            "NodeStageVolume",
            "NodeUnstageVolume",
            "NodePublishVolume",
            "NodeUnpublishVolume",
            "NodeGetVolumeStats",
            "NodeExpandVolume",
            "NodeGetCapabilities",
            "NodeGetInfo",
            "NodeGetVolumeHealth",
            "NodeGetStorageHealth",
        ],
    ),
];

/// The `method` label of a request to `path`: the served method it names, exactly, or
/// [`UNKNOWN`].
pub(crate) fn method_label(path: &str) -> &'static str {
    let named = path.strip_prefix("/csi.v1.").and_then(|rest| rest.split_once('/'));
    let Some((service, method)) = named else { return UNKNOWN };
    SERVED
        .iter()
        .find(|(s, _)| *s == service)
        .and_then(|(_, methods)| methods.iter().copied().find(|m| *m == method))
        .unwrap_or(UNKNOWN)
}

/// Counts every CSI request by method and gRPC code and times it (see the module rules).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RpcMetricsLayer;

impl<S> tower::Layer<S> for RpcMetricsLayer {
    type Service = RpcMetrics<S>;
    fn layer(&self, inner: S) -> RpcMetrics<S> {
        RpcMetrics(inner)
    }
}

/// The service of [`RpcMetricsLayer`].
#[derive(Debug, Clone)]
pub(crate) struct RpcMetrics<S>(S);

impl<S, B, RB> tower::Service<tonic::codegen::http::Request<B>> for RpcMetrics<S>
where
    S: tower::Service<tonic::codegen::http::Request<B>, Response = tonic::codegen::http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: tonic::codegen::http::Request<B>) -> Self::Future {
        let method = method_label(req.uri().path());
        let start = std::time::Instant::now();
        let fut = self.0.call(req);
        Box::pin(async move {
            let res = fut.await;
            let code = match &res {
                Ok(r) => r
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<i32>().ok())
                    .unwrap_or(0),
                Err(_) => tonic::Code::Internal as i32,
            };
            crate::metrics::metrics().record_rpc(method, code, start.elapsed());
            res
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rpcs of `service` in `proto/csi.proto`, in order.
    fn rpcs_of(proto: &str, service: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut inside = false;
        for line in proto.lines() {
            let code = line.split("//").next().unwrap_or("").trim();
            if let Some(name) = code.strip_prefix("service ") {
                inside = name.split_whitespace().next() == Some(service);
            } else if inside {
                if let Some(rpc) = code.strip_prefix("rpc ") {
                    out.push(rpc.split('(').next().unwrap_or("").trim().to_string());
                }
            }
        }
        out
    }

    #[test]
    fn the_served_table_is_every_rpc_of_identity_controller_and_node_in_the_proto() {
        let proto = include_str!("../../proto/csi.proto");
        let services: Vec<&str> = SERVED.iter().map(|(s, _)| *s).collect();
        assert_eq!(services, ["Identity", "Controller", "Node"], "the services registered with an implementation in grpc::serve");
        for (service, methods) in SERVED {
            let want = rpcs_of(proto, service);
            assert!(!want.is_empty(), "no service {service} in proto/csi.proto");
            assert_eq!(*methods, want.as_slice(), "{service}: the table and proto/csi.proto differ");
        }
        // The services registered only to answer UNIMPLEMENTED are not in it.
        for (service, one) in [("GroupController", "GroupControllerGetCapabilities"), ("SnapshotMetadata", "GetMetadataAllocated")] {
            assert!(rpcs_of(proto, service).iter().any(|m| m == one), "{service} in the proto");
            assert_eq!(method_label(&format!("/csi.v1.{service}/{one}")), UNKNOWN, "{service}");
        }
    }

    #[test]
    fn each_served_method_is_its_own_label_and_every_other_path_is_unknown() {
        for (service, methods) in SERVED {
            for m in *methods {
                assert_eq!(method_label(&format!("/csi.v1.{service}/{m}")), *m);
            }
        }
        let long = format!("/csi.v1.Controller/{}", "A".repeat(1 << 16));
        for path in [
            "",
            "/",
            "CreateVolume",
            "/CreateVolume",
            "/csi.v1.Controller/",
            "/csi.v1.Controller/NoSuchMethod",
            "/csi.v1.Controller/createvolume",
            "/csi.v1.Controller/CreateVolume/",
            "/csi.v1.Controller/CreateVolume/more",
            "/csi.v1.Node/CreateVolume",
            "/csi.v2.Controller/CreateVolume",
            "/evil.Service/CreateVolume",
            "//csi.v1.Controller/CreateVolume",
            "/csi.v1.Controller/Create%56olume",
            long.as_str(),
        ] {
            assert_eq!(method_label(path), UNKNOWN, "{path:.60}");
        }
    }
}
