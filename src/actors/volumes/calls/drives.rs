//! The drives' calls: the inventory's drive events, the cleaner's reports, and an
//! admin's release and cordon of a drive.
//!
//! Rules: the book decides on the actor thread (so placement sees a cordoned or
//! releasing drive closed from the next call on); the usage record is stored off it,
//! in the order the decisions were made ([`crate::actors::volumes::steps::uses`]);
//! subscribers (the Drive objects) hear of the change once stored; a cordon that
//! changes nothing writes nothing and answers the usage as it is; a drive that appears
//! or changes is read again ([`super::startup`]) and what it holds dirty goes to the
//! cleaner; creates waiting for the cleaner are woken at each of its steps.

use actix::prelude::*;

use super::super::cleaner::{self, CleaningStalled, ExtentCleaned};
use super::super::error::VolumeError;
use super::super::messages::{CordonDrive, ReleaseDrive};
use super::super::steps::startup::DriveDirty;
use super::super::{off_thread, reply, Reply, VolumeManager};
use crate::actors::messages::DriveEvent;
use crate::words::DriveUse;

impl Handler<DriveEvent> for VolumeManager {
    type Result = ();
    fn handle(&mut self, ev: DriveEvent, ctx: &mut Context<Self>) {
        let (id, fx) = self.book.drive_event(ev);
        if let Some(u) = fx.save {
            self.write_use(&id, Some(u));
        }
        if let Some(d) = fx.forget {
            self.write_use(&d, None);
        }
        if let Some(d) = fx.announce {
            self.announce(&d);
        }
        if let Some(d) = fx.reread {
            self.reconcile_drive(d, ctx);
        }
        if !self.book.drives().any(|d| d.id == id) {
            self.cleaner.forget(&id);
        }
        self.refresh(|r| r.drive_id == id);
    }
}

impl VolumeManager {
    /// Hands what start-up or a drive's reconciliation found dirty to the book and the
    /// cleaner.
    /// `hotplug`: the drives were read because they appeared (or changed) while running:
    /// a blank one is zeroed only after [`cleaner::BLANK_GRACE`].
    pub(super) fn take_dirty(&mut self, found: Vec<DriveDirty>, hotplug: bool) {
        for dd in found {
            let Some(loc) = self.book.drive_loc(&dd.drive_id) else { continue };
            // What the book holds dirty stays so: an extent freed while the drive was
            // read (a create rolled back meanwhile) is not lost; one the drive says is
            // clean already is found so by the cleaner and reported.
            let extents = crate::disk::clean::union(&dd.extents, &self.book.dirty_extents(&dd.drive_id));
            self.book.set_dirty(&dd.drive_id, extents.clone());
            match dd.expect {
                Some(expect) => {
                    let delay = (hotplug && expect == cleaner::Expect::Blank).then_some(cleaner::BLANK_GRACE);
                    self.cleaner.set(&dd.drive_id, loc, extents, expect, delay)
                }
                None => self.cleaner.set(&dd.drive_id, loc, Vec::new(), cleaner::Expect::AnyTable, None),
            }
        }
        self.wake_clean_waiters();
    }
}

impl Handler<ExtentCleaned> for VolumeManager {
    type Result = ();
    fn handle(&mut self, m: ExtentCleaned, _: &mut Context<Self>) {
        self.book.cleaned(&m.drive_id, m.extent);
        self.wake_clean_waiters();
        // The Drive object shows how far cleaning is.
        self.announce(&m.drive_id);
    }
}

impl Handler<CleaningStalled> for VolumeManager {
    type Result = ();
    fn handle(&mut self, m: CleaningStalled, ctx: &mut Context<Self>) {
        self.wake_clean_waiters();
        if !m.changed {
            return;
        }
        // The drive holds something else than the job was made for: read it again,
        // as when it appears, and clean what that finds by the same rules.
        let found = self.book.drives().find(|d| d.id == m.drive_id).cloned();
        if let Some(d) = found {
            self.book.reconciling_started(&d.id);
            self.reconcile_drive(d, ctx);
        }
    }
}

impl Handler<ReleaseDrive> for VolumeManager {
    type Result = Reply<DriveUse>;
    fn handle(&mut self, m: ReleaseDrive, _: &mut Context<Self>) -> Self::Result {
        let (plan, store) = match self.book.release(&m).and_then(|p| Ok((p, self.store()?))) {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        // Decided (and closed to placement) here; stored off the actor thread.
        let write_use = self.uses.job(store.clone(), &m.drive_id, Some(plan.usage.clone()));
        let job = move || -> Result<DriveUse, VolumeError> {
            for r in &plan.failed {
                store.put(&r.id, r).map_err(VolumeError::Store)?;
            }
            write_use().map_err(VolumeError::Store)?;
            Ok(plan.usage)
        };
        Box::pin(off_thread(&m.drive_id, "release", job).into_actor(self).map(move |res, act, _| {
            act.announce(&m.drive_id);
            act.refresh(|r| r.drive_id == m.drive_id);
            res
        }))
    }
}

impl Handler<CordonDrive> for VolumeManager {
    type Result = Reply<Option<DriveUse>>;
    fn handle(&mut self, m: CordonDrive, _: &mut Context<Self>) -> Self::Result {
        let written = self.book.cordon(&m).and_then(|(usage, changed)| {
            let written = if changed { Some(self.store_use(&m.drive_id, usage.clone(), "cordon")?) } else { None };
            Ok((usage, written))
        });
        let (usage, written) = match written {
            Ok((usage, Some(w))) => (usage, w),
            Ok((usage, None)) => return reply(Ok(usage)),
            Err(e) => return reply(Err(e)),
        };
        Box::pin(written.into_actor(self).map(move |res, act, _| {
            act.announce(&m.drive_id);
            res.map(|()| usage)
        }))
    }
}
