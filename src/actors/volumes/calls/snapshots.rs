//! The snapshot calls: take one (a copy of its source's data onto a new partition,
//! under a freeze when the class asks for one), delete one, list them.
//!
//! Rules: the snapshot's id is claimed like a volume's, and its source is claimed too
//! for the copy (no stage, unstage or delete of it meanwhile); the book decides where
//! it goes and whether it may be taken ([`crate::actors::volumes::snapshot`]'s rules).

use actix::prelude::*;
use tracing::info;

use super::super::book::CreatePlan;
use super::super::error::VolumeError;
use super::super::messages::{CreateSnapshot, DeleteSnapshot, ListSnapshots};
use super::super::model::VolumeRecord;
use super::super::snapshot::SnapshotRecord;
use super::super::steps;
use super::super::{reply, Reply, VolumeManager};
use crate::disk::gpt;

impl Handler<CreateSnapshot> for VolumeManager {
    type Result = Reply<SnapshotRecord>;
    fn handle(&mut self, m: CreateSnapshot, _: &mut Context<Self>) -> Self::Result {
        let id = gpt::snapshot_partition_guid(&m.name).to_string();
        let (claim, store) = match self.claim(&id) {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        let shown = |rec: &VolumeRecord| SnapshotRecord::of(rec, None).ok_or_else(|| VolumeError::Busy { volume_id: rec.id.clone() });
        let (rec, from) = match self.book.plan_snapshot(&m, self.freeze_limit) {
            Ok((CreatePlan::Existing(rec), _)) => return reply(shown(&rec)),
            Ok((CreatePlan::New(rec), Some(from))) => (rec, from),
            Ok((CreatePlan::New(rec), None)) => return reply(Err(VolumeError::Busy { volume_id: rec.id })),
            Err(e) => return reply(Err(e)),
        };
        // The source is held for the copy: no stage, unstage or delete of it meanwhile.
        let held = match self.book.claim(&m.source_volume_id) {
            Ok(c) => c,
            Err(e) => return reply(Err(e)),
        };
        let Some(loc) = self.book.loc_of(&rec) else {
            return reply(Err(VolumeError::DriveGoneDuringCreate { volume_id: id, drive_id: rec.drive_id }));
        };
        info!(snapshot.id = %rec.id, snapshot.name = %rec.name, volume.id = %m.source_volume_id, drive.id = %rec.drive_id,
              snapshot.size = rec.size, snapshot.freeze = from.freeze.is_some(), "taking snapshot");
        self.book.reserve(rec.clone());
        Box::pin(self.run(claim, id, move || steps::create(&store, &loc, rec, Some(&from))).map(move |res, _, _| {
            drop(held);
            res.and_then(|r| shown(&r))
        }))
    }
}

impl Handler<DeleteSnapshot> for VolumeManager {
    type Result = Reply<()>;
    fn handle(&mut self, m: DeleteSnapshot, _: &mut Context<Self>) -> Self::Result {
        let id = m.snapshot_id;
        let (claim, store) = match self.claim(&id) {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        let rec = match self.book.plan_delete_snapshot(&id) {
            Ok(Some(rec)) => rec,
            Ok(None) => return reply(Ok(())),
            Err(e) => return reply(Err(e)),
        };
        let loc = self.book.loc_of(&rec);
        info!(snapshot.id = %id, drive.id = %rec.drive_id, "deleting snapshot");
        let guards = self.book.guards();
        self.run(claim, id, move || steps::delete(&store, &guards, loc.as_ref(), rec))
    }
}

impl Handler<ListSnapshots> for VolumeManager {
    type Result = Result<Vec<SnapshotRecord>, VolumeError>;
    fn handle(&mut self, _: ListSnapshots, _: &mut Context<Self>) -> Self::Result {
        self.book.snapshots()
    }
}
