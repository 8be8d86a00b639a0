//! The evacuation calls: evacuate a drive, list where evacuations stand, hear of each
//! move; and the moves themselves, one at a time ([`crate::actors::volumes::evacuate`]'s
//! rules).
//!
//! Rules: the book holds every bit of an evacuation's state (the intent in the drive's
//! usage record, the move running, the moves done and failed) and picks the next move;
//! this file stores the intent, runs the move's disk steps
//! ([`crate::actors::volumes::steps::moves`]) off the actor thread, hands the freed
//! extent to the cleaner, and tells the subscribers. A move is looked for every
//! [`EVACUATION_TICK`](crate::actors::volumes::evacuate::EVACUATION_TICK), when an
//! evacuation is asked, and after each move.

use actix::prelude::*;

use super::super::evacuate::Evacuation;
use super::super::messages::{EvacuateDrive, ListEvacuations, SubscribeMoves};
use super::super::steps::{moves, Outcome};
use super::super::{reply, Reply, VolumeManager};
use crate::actors::tell_all;

impl Handler<EvacuateDrive> for VolumeManager {
    type Result = Reply<Evacuation>;
    fn handle(&mut self, m: EvacuateDrive, _: &mut Context<Self>) -> Self::Result {
        let written = match self.book.evacuate(&m).and_then(|u| self.store_use(&m.drive_id, Some(u), "evacuation")) {
            Ok(w) => w,
            Err(e) => return reply(Err(e)),
        };
        let drive_id = m.drive_id;
        Box::pin(written.into_actor(self).map(move |res, act, ctx| {
            act.announce(&drive_id);
            act.refresh(|r| r.drive_id == drive_id);
            res?;
            act.evacuate_next(ctx);
            act.book.evacuation_of(&drive_id)
        }))
    }
}

impl Handler<ListEvacuations> for VolumeManager {
    type Result = MessageResult<ListEvacuations>;
    fn handle(&mut self, _: ListEvacuations, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.book.evacuations())
    }
}

impl Handler<SubscribeMoves> for VolumeManager {
    type Result = ();
    fn handle(&mut self, m: SubscribeMoves, _: &mut Context<Self>) {
        self.move_subscribers.push(m.0);
    }
}

impl VolumeManager {
    /// Starts the next move of an evacuation, if none runs and one can start.
    pub(in crate::actors::volumes) fn evacuate_next(&mut self, ctx: &mut Context<Self>) {
        let Ok(store) = self.store() else { return };
        let Some(started) = self.book.start_move() else { return };
        let (id, name, from_drive) = (started.plan.rec.id.clone(), started.plan.rec.name.clone(), started.plan.rec.drive_id.clone());
        self.announce(&from_drive); // the Drive object shows the volume moving
        let guards = self.book.guards();
        let (plan, force, done, to) = (started.plan, started.force, started.done, started.to);
        let job = move || moves::move_volume(&store, &guards, plan, force, &done);
        let fut = self.run(started.claim, id.clone(), job).map(move |res, act, ctx| {
            crate::metrics::metrics().record_move(res.as_ref().ok().map(|d| d.bytes));
            let ended = act.book.move_ended(&id, &name, &to, res.as_ref());
            if let Some((drive_id, extent)) = ended.freed {
                act.clean_freed(&drive_id, extent);
            }
            if let Some(moved) = &ended.moved {
                tell_all(&mut act.move_subscribers, moved);
            }
            match res {
                Ok(done) => {
                    act.announce(&done.to_drive);
                    act.announce(&done.from_drive);
                    drop(act.settle_drive(&done.from_drive));
                }
                Err(e) => {
                    tracing::warn!(volume.id = %id, drive.id = %from_drive, error = %e, "the volume's move failed; it stays where it is");
                    act.announce(&from_drive);
                }
            }
            act.evacuate_next(ctx);
        });
        ctx.spawn(fut.map(|_, _, _| ()));
    }

    /// Finishes the moves whose old partition is on `drive_id`, which just came back (it
    /// was absent when they switched): the old partitions go, their space is dirty.
    pub(super) fn finish_moves_from(&mut self, drive_id: &str, ctx: &mut Context<Self>) {
        let Some(src) = self.book.drive_loc(drive_id) else { return };
        let pending: Vec<_> = self.book.records().filter(|r| r.moving.as_ref().is_some_and(|m| m.switched && m.drive_id == drive_id)).cloned().collect();
        for rec in pending {
            let (Ok(store), Some(dst)) = (self.store(), self.book.loc_of(&rec)) else { continue };
            let Ok(claim) = self.book.claim(&rec.id) else { continue };
            let Some(old) = rec.moving.clone() else { continue };
            let src = src.clone();
            let id = rec.id.clone();
            let fut = self.run(claim, id.clone(), move || {
                let mut rec = rec;
                let result = moves::finish_move(&store, Some(&src), &dst, &mut rec);
                Outcome { record: Some(rec), result }
            });
            ctx.spawn(fut.map(move |res, act, _| match res {
                Ok(()) => {
                    tracing::info!(volume.id = %id, drive.id = %old.drive_id, "the old partition of a moved volume is removed from its drive, back now");
                    act.clean_freed(&old.drive_id, (old.start, old.size));
                    act.announce(&old.drive_id);
                }
                Err(e) => tracing::warn!(volume.id = %id, error = %e, "cannot remove the old partition of a moved volume; retried when the drive is read again"),
            }));
        }
    }
}
