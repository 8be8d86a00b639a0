//! The volume manager's answer to a metrics scrape ([`ScrapeVolumes`]): everything the
//! per-volume and per-drive series read from it, at one moment, in one round trip.
//!
//! Rules: the answer is the published view (volumes with their conditions, managed
//! drives with the extents in use, as GetCapacity sees them) plus what the view does not
//! hold (drive usage records, snapshots, cleaning, evacuations and the move running
//! now); nothing is computed here that the metrics could compute from it, and nothing is
//! copied per volume (the view shares its records).

use std::sync::Arc;

use actix::prelude::*;

use super::book::Cleaning;
use super::evacuate::{Evacuation, MoveProgress};
use super::snapshot::SnapshotRecord;
use super::view::VolumesView;
use super::VolumeManager;
use crate::words::DriveUse;

/// Query: what a metrics scrape reads from the volume manager.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "VolumesScrape")]
pub struct ScrapeVolumes;

/// The volume manager at one moment, as the metrics read it.
#[derive(Debug, Clone, Default)]
pub struct VolumesScrape {
    /// The published view: shown volumes with their conditions, managed drives with
    /// their room (not ready: empty).
    pub view: Arc<VolumesView>,
    /// Usage records of cordoned, releasing and released drives.
    pub uses: Vec<DriveUse>,
    /// Snapshots (empty until start-up reconciliation is done).
    pub snapshots: Vec<SnapshotRecord>,
    /// Drives with space still to be zeroed.
    pub cleaning: Vec<Cleaning>,
    /// Every evacuation asked for.
    pub evacuations: Vec<Evacuation>,
    /// The move copying now, if one is.
    pub(crate) moving: Option<MoveProgress>,
}

impl Handler<ScrapeVolumes> for VolumeManager {
    type Result = MessageResult<ScrapeVolumes>;
    fn handle(&mut self, _: ScrapeVolumes, _: &mut Context<Self>) -> Self::Result {
        let e = &self.evacuations;
        MessageResult(VolumesScrape {
            view: self.book.view_reader().get().unwrap_or_default(),
            uses: self.book.drive_uses(),
            snapshots: self.book.snapshots().unwrap_or_default(),
            cleaning: self.book.cleaning(),
            evacuations: self.book.evacuations(&e.moved, &e.failed, e.moving.as_deref()),
            moving: e.progress.clone(),
        })
    }
}
