//! The volume manager's start: wait for the inventory's first scan, reconcile the
//! store with every present drive off the actor thread, then load the book and serve;
//! later the same for one drive that appears or changes media.
//!
//! Rules: nothing is served before the book is loaded (calls get `NotReady`, waiters of
//! [`WaitReady`](crate::actors::volumes::WaitReady) are answered once it is); a
//! reconciliation that fails is retried in 5 s, one that panics restarts the actor; a
//! drive's records are claimed while it is reconciled (a drive whose volume a call
//! holds is looked at again a second later); what the disk side
//! ([`crate::actors::volumes::steps::startup`]) found dirty goes to the cleaner.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tracing::{error, info};

use super::super::reconcile;
use super::super::steps::startup::{settle, startup, Started};
use super::super::VolumeManager;
use crate::actors::inventory::model::Drive;
use crate::actors::messages::{GetInventoryStatus, ListDrives};

impl VolumeManager {
    /// Waits for the inventory's first scan, then reconciles with the drives it found.
    pub(in crate::actors::volumes) fn wait_for_inventory(&mut self, ctx: &mut Context<Self>) {
        let inv = self.inventory.clone();
        ctx.spawn(
            async move {
                loop {
                    match inv.send(GetInventoryStatus).await {
                        Ok(s) if s.scanned => break,
                        _ => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
                inv.send(ListDrives).await.unwrap_or_default()
            }
            .into_actor(self)
            .map(|drives, act, ctx| {
                act.book.add_drives(drives);
                act.reconcile(ctx);
            }),
        );
    }

    /// Start-up reconciliation of the store with every present drive, off the actor
    /// thread; loads the book when done, retries on error, restarts on a panic.
    fn reconcile(&mut self, ctx: &mut Context<Self>) {
        if self.reconciling {
            return;
        }
        self.reconciling = true;
        let dir = self.state_dir.clone();
        // Every present drive: presence decides what happens to a record, and the
        // on-disk table (not the inventory's class, which may lag) decides whether
        // drivelet's own partitions are there.
        let drives: Vec<Drive> = self.book.drives().cloned().collect();
        let clean_blank = self.clean_blank_drives;
        let guards = self.book.guards();
        let job = move || startup(&dir, &drives, &guards, clean_blank);
        ctx.spawn(async move { tokio::task::spawn_blocking(job).await }.into_actor(self).map(|res, act, ctx| {
            act.reconciling = false;
            match res {
                Ok(Ok(Started { store, records, uses, dirty })) => {
                    act.store = Some(Arc::new(store));
                    // Health verdicts that arrived before the usage records were loaded.
                    for u in act.book.load(records, uses) {
                        let id = u.drive_id.clone();
                        act.write_use(&id, Some(u));
                    }
                    act.take_dirty(dirty, false);
                    act.refresh(|_| true);
                    info!(actor = "volumes", volumes = act.book.volume_count(), "volume manager ready");
                    for waiter in act.ready_waiters.drain(..) {
                        let _ = waiter.send(());
                    }
                }
                Ok(Err(e)) => {
                    error!(actor = "volumes", error = %e, "start-up reconciliation failed; retrying in 5s");
                    ctx.run_later(Duration::from_secs(5), |act, ctx| act.reconcile(ctx));
                }
                Err(e) => {
                    error!(actor = "volumes", error = %e, "start-up reconciliation panicked; restarting the actor");
                    ctx.stop();
                }
            }
        }));
    }

    /// Reconciles the records of `drive`, which just appeared, with its GPT and the
    /// mounts, as start-up does for all ([`settle`]); its records are claimed meanwhile.
    pub(super) fn reconcile_drive(&mut self, drive: Drive, ctx: &mut Context<Self>) {
        let Some(store) = self.store.clone() else { return };
        let Some((claims, records)) = self.book.claim_drive(&drive.id) else {
            // A call is changing one of them: look again once it is done.
            ctx.run_later(Duration::from_secs(1), move |act, ctx| {
                if act.book.drive_present_at(&drive) {
                    act.reconcile_drive(drive, ctx);
                } else {
                    act.book.reconciled(&drive.id);
                    act.refresh(|r| r.drive_id == drive.id);
                }
            });
            return;
        };
        let ids: Vec<String> = records.iter().map(|r| r.id.clone()).collect();
        let drive_id = drive.id.clone();
        let clean_blank = self.clean_blank_drives;
        let guards = self.book.guards();
        // Copies of moves running now onto this drive are not cut short; volumes whose
        // records live on other drives are not adopted from this one.
        let others = reconcile::Others {
            running: self.book.records().filter_map(|r| r.moving.as_ref().filter(|m| !m.switched).map(|m| (m.drive_id.clone(), m.copy_part_guid(r.part_guid)))).collect(),
            held: self.book.records().filter(|r| r.drive_id != drive.id).map(|r| r.part_guid).collect(),
            unread: Default::default(),
        };
        let job = move || settle(&store, &guards, records, std::slice::from_ref(&drive), clean_blank, &others);
        ctx.spawn(async move { tokio::task::spawn_blocking(job).await }.into_actor(self).map(move |res, act, ctx| {
            // Claims go before the conditions are judged again: a volume shown normal
            // is free to stage.
            drop(claims);
            act.book.reconciled(&drive_id);
            match res {
                Ok(Ok((keep, dirty))) => {
                    act.book.settled(&drive_id, &ids, keep);
                    act.take_dirty(dirty, true);
                    act.announce(&drive_id);
                    act.finish_moves_from(&drive_id, ctx);
                }
                Ok(Err(e)) => error!(actor = "volumes", drive.id = %drive_id, error = %e, "cannot reconcile the drive's volumes"),
                Err(e) => error!(actor = "volumes", drive.id = %drive_id, error = %e, "reconciling the drive's volumes panicked"),
            }
            act.refresh(|r| r.drive_id == drive_id);
        }));
    }
}
