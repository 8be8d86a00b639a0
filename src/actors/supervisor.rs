//! The root supervisor: starts the actors in dependency order, each under an actix
//! `Supervisor`, so an actor that stops on failure is restarted with the same address
//! and rebuilds its state from the host in `restarting()`/`started()`.

use actix::prelude::*;

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
}

/// Starts every actor on the current arbiter, in order: the inventory first, then the
/// volume manager, which waits for the inventory's first scan before it serves.
pub fn start(cfg: &Config) -> Actors {
    let drives = cfg.drives.clone();
    let inventory = Supervisor::start(move |_| DriveInventory::new(drives));
    let (vcfg, dir, inv) = (cfg.volumes.clone(), cfg.paths.state_dir.clone(), inventory.clone());
    let volumes = Supervisor::start(move |_| VolumeManager::new(vcfg, dir, inv));
    Actors { inventory, volumes }
}
