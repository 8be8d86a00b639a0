//! The CSI and kubelet sockets as clients see them: conformance to the spec, the community suite, the v1.13 health API, gRPC clients of other families, plugin registration, cheap-call latency, the HTTP endpoints.

/// The CSI v1.12 MUSTs drivelet serves, a module per service.
mod conformance;
/// The gRPC front: sockets, start-up errors, readiness.
mod csi_front;
/// The community conformance suite, csi-sanity v5.4.0, as shipped.
mod csi_sanity;
/// The CSI v1.13 health RPCs beside v1.12 conditions.
mod health_api;
/// gRPC clients of other families (C-core, hand-written HTTP/2) on both sockets.
mod interop;
/// kubelet plugin registration.
mod registration;
/// Cheap calls answered from the published view during churn.
mod cheap_rpcs;
/// The metrics and health HTTP endpoints.
mod http;
/// Secrets in requests never reach the log.
mod secrets;
