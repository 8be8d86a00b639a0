//! The integration tier, one binary with a module per area of the house: the real
//! `drivelet` binary against real loop devices, udev, mkfs and mount (and, for the
//! Kubernetes side, a scripted API server). It needs root and a running udev, and says
//! so when they are missing; `scripts/test.sh integration` runs it, as
//! `cargo nextest run --features failpoints --test integration` (each test in a process
//! of its own). It is not part of a plain `cargo test`, which is the unit tier and runs
//! without root.
//!
//! Areas: `csi` (the sockets as clients see them), `disks` (the disk layer and the
//! inventory), `volumes` (a volume's whole life), `robustness` (crashes, failing actors,
//! hostile input), `cluster` (the Kubernetes side and deploy/), `tools` (the CLI's
//! bench and demo). `common` holds the agent fixture, loop drives and the one set of
//! request builders.

mod common;

mod cluster;
mod csi;
mod disks;
mod robustness;
mod tools;
mod volumes;
