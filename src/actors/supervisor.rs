//! The root supervisor: starts the actors in dependency order, each under an actix
//! `Supervisor`, so an actor that stops on failure is restarted with the same address
//! and rebuilds its state from the host in `restarting()`/`started()`.

use actix::prelude::*;

use super::health::HealthPoller;
use super::inventory::DriveInventory;
use super::volumes::VolumeManager;
use crate::config::Config;

/// Addresses of the running actors.
#[derive(Clone)]
pub struct Actors {
    /// Drive inventory.
    pub inventory: Addr<DriveInventory>,
    /// Volume manager.
    pub volumes: Addr<VolumeManager>,
    /// Health poller.
    pub health: Addr<HealthPoller>,
}

/// Starts every actor on the current arbiter, in order: the inventory first, then the
/// volume manager, which waits for the inventory's first scan before it serves, then
/// the health poller, which reports to both.
pub fn start(cfg: &Config) -> Actors {
    let drives = cfg.drives.clone();
    let inventory = Supervisor::start(move |_| DriveInventory::new(drives));
    let (vcfg, dir, inv, auto) = (cfg.volumes.clone(), cfg.paths.state_dir.clone(), inventory.clone(), cfg.health.auto_release);
    let volumes = Supervisor::start(move |_| VolumeManager::new(vcfg, dir, inv, auto));
    let (hcfg, inv, vols) = (cfg.health.clone(), inventory.clone(), volumes.clone());
    let health = Supervisor::start(move |_| HealthPoller::new(hcfg, inv, vols));
    Actors { inventory, volumes, health }
}
