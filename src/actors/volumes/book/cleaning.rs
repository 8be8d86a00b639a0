//! The clean side of the volume book: the space per drive that may still hold a former
//! tenant's bytes, as start-up read it from the drives, deletes freed it and the
//! cleaner zeroed it.
//!
//! Rules: dirty space counts as used for placement and capacity (one model for both);
//! a CreateVolume that fits only once cleaning is done is told so, naming the space
//! being cleaned and its progress; the progress of a drive's round of cleaning is what
//! was zeroed of what the round has held so far (a round ends when nothing is dirty).

use super::{VolumeBook, VolumeError};
use crate::actors::volumes::messages::{Cleaning, CreateVolume};
use crate::actors::volumes::model::VolumeRecord;
use crate::words::DriveLoc;
use crate::disk::clean::{self, Extent};

/// A drive's dirty space.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Dirty {
    /// Dirty extents, merged.
    pub extents: Vec<Extent>,
    /// Bytes this round of cleaning has held so far (what was dirty at its start, and
    /// what was freed since).
    pub round: u64,
}


impl VolumeBook {
    /// Replaces a drive's dirty space, as read from the drive.
    pub(crate) fn set_dirty(&mut self, drive_id: &str, extents: Vec<Extent>) {
        let extents = clean::normalize(&extents);
        let left = clean::total(&extents);
        if left == 0 {
            self.dirty.remove(drive_id);
        } else {
            let d = self.dirty.entry(drive_id.to_string()).or_default();
            d.round = d.round.max(left);
            d.extents = extents;
        }
        self.publish();
    }

    /// Adds an extent freed on a drive.
    pub(crate) fn add_dirty(&mut self, drive_id: &str, extent: Extent) {
        let d = self.dirty.entry(drive_id.to_string()).or_default();
        let before = clean::total(&d.extents);
        d.extents = clean::union(&d.extents, &[extent]);
        d.round += clean::total(&d.extents) - before;
        self.publish();
    }

    /// Takes in a step the cleaner made clean.
    pub(crate) fn cleaned(&mut self, drive_id: &str, extent: Extent) {
        if let Some(d) = self.dirty.get_mut(drive_id) {
            d.extents = clean::subtract(&d.extents, &[extent]);
            if d.extents.is_empty() {
                self.dirty.remove(drive_id);
            }
        }
        self.publish();
    }

    /// The dirty extents of a drive.
    pub(crate) fn dirty_extents(&self, drive_id: &str) -> Vec<Extent> {
        self.dirty.get(drive_id).map(|d| d.extents.clone()).unwrap_or_default()
    }

    /// How far cleaning is on every drive that has dirty space.
    pub(crate) fn cleaning(&self) -> Vec<Cleaning> {
        self.dirty
            .iter()
            .map(|(id, d)| {
                let left = clean::total(&d.extents);
                Cleaning { drive_id: id.clone(), left_bytes: left, round_bytes: d.round.max(left) }
            })
            .collect()
    }

    /// Marks an extent freed on `drive_id` dirty, when the drive is present; answers
    /// where the drive is, for the cleaner.
    pub(crate) fn free_extent(&mut self, drive_id: &str, extent: Extent) -> Option<DriveLoc> {
        let loc = self.drive_loc(drive_id)?;
        self.add_dirty(drive_id, extent);
        Some(loc)
    }

    /// The extent a step freed, when the record `id` leaves the book with it (a delete,
    /// a create rolled back) or a growth's move ended (the old partition removed, or the
    /// copy rolled back): `after` is the record the step handed back, `err` its
    /// error. Nothing for an adopted volume (its space is not drivelet's), or a create
    /// the GPT writer refused (it wrote nothing). An evacuation's move frees its extent
    /// through its own end ([`VolumeBook::move_ended`]).
    pub(crate) fn freed_by(&self, id: &str, after: Option<&VolumeRecord>, err: Option<&VolumeError>) -> Option<(String, Extent)> {
        if let Some(after) = after {
            let before = self.records.get(id)?;
            let to = before.moving.as_ref().filter(|m| !m.switched && self.evac.moving.as_deref() != Some(id))?;
            // Where it was (the same drive and start) or where its copy went.
            let stayed = (&after.drive_id, after.start) == (&before.drive_id, before.start);
            return match (&after.moving, stayed) {
                // Rolled back: the copy held the volume's bytes.
                (None, true) => Some((to.drive_id.clone(), (to.start, to.size))),
                // Switched and finished: the old partition is gone.
                (None, false) => Some((before.drive_id.clone(), (before.start, before.size))),
                // Still to finish (a restart does): nothing is free yet.
                _ => None,
            };
        }
        if err.is_some_and(|e| e.refused_drive().is_some()) {
            return None;
        }
        let rec = self.records.get(id).filter(|r| r.adopted.is_none())?;
        Some((rec.drive_id.clone(), (rec.start, rec.size)))
    }

    /// The space being cleaned, in words, for a refusal.
    pub(crate) fn cleaning_note(&self) -> String {
        let parts: Vec<String> = self.cleaning().iter().map(|c| format!("{} on drive {}", c.words(), c.drive_id)).collect();
        format!("space freed by earlier volumes is still being zeroed before reuse ({}); retry shortly", parts.join(", "))
    }

    /// Whether a CreateVolume the book refuses now would be placed once every drive's
    /// dirty space is clean.
    pub(crate) fn fits_after_cleaning(&self, m: &CreateVolume, guid: uuid::Uuid) -> bool {
        !self.dirty.is_empty() && self.plan_create_with(m, guid, false).is_ok()
    }
}
