//! The view of the volume manager a sync of this node's `Drive` objects reads: one
//! query ([`GetDriveView`]) answered with everything the objects show of the volume
//! side ([`DriveView`]), instead of a question per part.
//!
//! Rules:
//! - the answer is built in one handler from the same queries the fronts ask one by one
//!   (`VolumesReady`, `ListDriveUses`, `ListHeld`, `ListVolumeStatuses` with no limit,
//!   `VolumesUsed`, `ListCleaning`, `ListEvacuations`): their handlers are called, not
//!   copied, so each part is exactly what that query answers, and all parts but the
//!   used bytes are of one moment of the book (the used bytes are read off the actor
//!   thread, as `VolumesUsed` reads them);
//! - before the start-up reconciliation is done the view says only that
//!   ([`DriveView::ready`] false, every list empty), so nothing is shown, or deleted,
//!   from a book that is not complete yet;
//! - the view carries plain values (records, usage records, cleaning, evacuations),
//!   defined with the message in `messages.rs`: a front that reads it never imports the
//!   book.

use std::collections::BTreeMap;

use actix::prelude::*;

use super::super::messages::{
    DriveView, GetDriveView, ListCleaning, ListDriveUses, ListEvacuations, ListHeld, ListVolumeStatuses, VolumesReady, VolumesUsed,
};
use super::super::VolumeManager;

impl Handler<GetDriveView> for VolumeManager {
    type Result = ResponseFuture<DriveView>;
    fn handle(&mut self, _: GetDriveView, ctx: &mut Context<Self>) -> Self::Result {
        if !Handler::<VolumesReady>::handle(self, VolumesReady, ctx) {
            return Box::pin(async { DriveView::default() });
        }
        let all = ListVolumeStatuses { after: None, max: 0, abnormal_only: false };
        let view = DriveView {
            ready: true,
            uses: Handler::<ListDriveUses>::handle(self, ListDriveUses, ctx).0,
            volumes: Handler::<ListHeld>::handle(self, ListHeld, ctx).0,
            statuses: Handler::<ListVolumeStatuses>::handle(self, all, ctx).map(|(page, _)| page).unwrap_or_default(),
            used: BTreeMap::new(),
            cleaning: Handler::<ListCleaning>::handle(self, ListCleaning, ctx).0,
            evacuations: Handler::<ListEvacuations>::handle(self, ListEvacuations, ctx).0,
        };
        let used = Handler::<VolumesUsed>::handle(self, VolumesUsed, ctx);
        Box::pin(async move { DriveView { used: used.await, ..view } })
    }
}
