//! The root supervisor: starts the actors in dependency order, each under an actix
//! `Supervisor`, so an actor that stops on failure is restarted with the same address
//! and rebuilds its state from the host in `restarting()`/`started()`.
//!
//! Rules:
//! - an actor fails by stopping itself (`ctx.stop()`); its supervisor then runs
//!   `restarting()` and `started()` on the same address, and messages sent meanwhile
//!   wait in the mailbox. A panic is not a failure the supervisor can see: the actor's
//!   task dies with it and its address stays closed for good (see the test below), so
//!   actors never panic on purpose;
//! - tests make an actor fail through a fail point named `actor.<name>.stop`
//!   ([`crate::failpoint::injected_failure`]), compiled in only with the `failpoints`
//!   feature and kept apart from the crash points (which kill the process).

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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use actix::prelude::*;

    /// An actor that fails as told and counts its restarts.
    struct Flaky(Arc<AtomicUsize>);

    impl Actor for Flaky {
        type Context = Context<Self>;
    }

    impl Supervised for Flaky {
        fn restarting(&mut self, _: &mut Context<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[derive(Message)]
    #[rtype(result = "u32")]
    enum Ask {
        Answer,
        Stop,
        Panic,
    }

    impl Handler<Ask> for Flaky {
        type Result = u32;
        fn handle(&mut self, m: Ask, ctx: &mut Context<Self>) -> u32 {
            match m {
                Ask::Answer => 42,
                Ask::Stop => {
                    ctx.stop();
                    0
                }
                Ask::Panic => panic!("handler panics"),
            }
        }
    }

    #[test]
    fn a_stopping_actor_is_restarted_on_its_address_but_a_panicking_one_is_gone() {
        let restarts = Arc::new(AtomicUsize::new(0));
        let seen = restarts.clone();
        let sys = actix::System::new();
        let (after_stop, after_panic) = sys.block_on(async move {
            let addr = Supervisor::start(move |_| Flaky(seen));
            assert_eq!(addr.send(Ask::Answer).await.ok(), Some(42));
            let _ = addr.send(Ask::Stop).await;
            let after_stop = addr.send(Ask::Answer).await.ok();
            let _ = addr.send(Ask::Panic).await;
            let after_panic = addr.send(Ask::Answer).await.ok();
            (after_stop, after_panic)
        });
        assert_eq!(after_stop, Some(42), "a stopped actor answers again after its restart");
        assert_eq!(restarts.load(Ordering::SeqCst), 1, "restarting() ran once, for the stop");
        assert_eq!(after_panic, None, "a panicking actor is not restarted: its address is closed");
    }
}
