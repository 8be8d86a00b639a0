//! drivelet: a local-drive CSI storage agent for Kubernetes, one supervised process per
//! node. See docs/architecture.md for the map of actors, flows, layering and lock order.

#![warn(missing_docs)]
#![warn(unreachable_pub)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::unwrap_in_result)]

/// The core actors: drive inventory, volume manager, health poller, and their messages.
pub mod actors;
/// `drivelet run`: startup order and clean shutdown.
pub mod agent;
/// Exponential backoff, the crate's one retry-delay rule.
pub(crate) mod backoff;
/// The command-line clients: `ctl` (admin socket), `csi` (any CSI endpoint), `bench`.
pub mod cli;
/// Typed configuration and validation.
pub mod config;
/// Loop-backed demo drives.
pub mod demo;
/// Plain functions over the OS: udev, mounts, GPT layout, loop devices.
pub mod disk;
/// Fault injection for tests: actor fail points and crash points (`failpoints` feature).
pub mod failpoint;
/// Fuzz targets, one per parser of bytes drivelet did not write; run by `tests/fuzz`.
#[doc(hidden)]
pub mod fuzz;
/// The gRPC front: CSI services and the admin socket.
pub mod grpc;
/// PID 1 of a container: the agent runs as its child.
pub mod guardian;
/// The Kubernetes front: the in-process external-attacher (its AttachQueue actor and
/// decisions), volume condition Events, the `Drive` custom resource and its sync, node
/// labels.
pub mod k8s;
/// The HTTP endpoints: `/healthz`, `/readyz`, `/metrics`.
pub(crate) mod http;
/// Structured logging setup.
pub mod logging;
/// Prometheus metrics: process counters, per-drive and per-volume state, OpenMetrics text.
pub mod metrics;
/// CSI migration: in-tree `kubernetes.io/local-volume` PVs to drivelet CSI PVs and back.
pub(crate) mod migration;
/// The agent's own seccomp filter (`[security] seccomp`).
pub mod seccomp;
/// The embedded store of volume records.
pub mod store;
/// The shared words every layer speaks: media, drive health and class, layout, drive
/// usage, drive location; one file each.
pub mod words;
/// The root supervisor: starts every actor, core and fronts, in one place.
pub(crate) mod supervisor;
/// Property tests of request and config validation.
#[cfg(test)]
mod validation_props;
#[cfg(test)]
mod docs_check;

/// The topology key every drivelet volume and node carries.
pub const TOPOLOGY_NODE_KEY: &str = "topology.drivelet.io/node";
