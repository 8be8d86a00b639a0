//! The command-line side of the binary: clients of a running agent or of any CSI
//! driver, never part of the agent itself. `main.rs` parses the arguments and calls in
//! here; nothing in the agent's modules (actors, fronts, disk, store) imports this
//! folder.
//!
//! Rules: every command talks to its target only through a socket (the admin socket, a
//! CSI endpoint, or the Kubernetes API for `kubectl drivelet`); none touches a disk or
//! the store directly, so a command can never do what the agent would refuse.

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
