//! The root supervisor: starts the actors in dependency order, each under an actix
//! `Supervisor`, so an actor that stops on failure is restarted with the same address
//! and rebuilds its state from the host in `restarting()`/`started()`.

use actix::prelude::*;

use super::inventory::DriveInventory;
use crate::config::Config;

/// Addresses of the running actors.
#[derive(Clone)]
pub struct Actors {
    /// Drive inventory.
    pub inventory: Addr<DriveInventory>,
}

/// Starts every actor on the current arbiter, in order.
pub fn start(cfg: &Config) -> Actors {
    let drives = cfg.drives.clone();
    let inventory = Supervisor::start(move |_| DriveInventory::new(drives));
    Actors { inventory }
}
