//! The Kubernetes side without a cluster: the API behaviour against a scripted server, deploy/ against the schemas and the code.

/// The Kubernetes front against a scripted API server, through the real binary.
pub(crate) mod kubernetes;
/// deploy/ against the config loader, the parameter parser and the permission table.
mod deploy;
/// deploy/monitoring: the alerts through promtool, the dashboard and the rules against the documented series.
mod monitoring;
