//! The book's decision of a CreateVolume: the existing volume of the name, or a new
//! record placed, its extent reserved, its clone source claimed; or a wait for the
//! cleaner when the volume fits only in space still being zeroed.
//!
//! Rules:
//! - the volume id is the UUID v5 of the name, derived once per call ([`CreateCall`]);
//! - a repeated CreateVolume of an existing volume answers it when the request matches
//!   and `AlreadyExists` when it does not; a lost volume is never a success;
//! - a create that fits only once dirty space is clean waits for the cleaner's steps
//!   until the call's deadline (`volumes.cleaning_wait`), then answers
//!   RESOURCE_EXHAUSTED naming that space;
//! - a drive the GPT writer refuses turns foreign, and the next attempt goes on to the
//!   next drive; when none is left the answer names every drive refused;
//! - a clone claims its source once, for every attempt, until the copy is done.

use std::time::{Duration, Instant};

use tracing::{info, warn};
use uuid::Uuid;

use super::{clone, now_unix, Claim, CreatePlan, VolumeBook, VolumeError};
use crate::actors::volumes::conditions;
use crate::actors::volumes::messages::CreateVolume;
use crate::actors::volumes::model::{self, VolumeRecord, VolumeState};
use crate::actors::volumes::placement::{self, NoRoom};
use crate::actors::volumes::steps::CloneFrom;
use crate::disk::gpt;
use crate::words::{DriveLoc, LayoutKind, Media};

/// A CreateVolume under way, across its attempts.
pub(crate) struct CreateCall {
    /// The request.
    pub m: CreateVolume,
    /// The volume's partition GUID: the UUID v5 of its name.
    guid: Uuid,
    /// The volume id (the GUID's text).
    pub id: String,
    /// The clone source's claim, once taken: held until the copy is done.
    held: Option<Claim>,
    /// The drives the GPT writer refused so far, in words.
    refused: Vec<String>,
    /// Until when a create that fits only in space being cleaned waits for it.
    deadline: Instant,
}

/// What the book decided of one attempt of a CreateVolume.
pub(crate) enum CreateStart {
    /// Answer now: the volume as it exists, or why not.
    Answer(Result<VolumeRecord, VolumeError>),
    /// It fits only in space still being cleaned: wait for the cleaner's next step, at
    /// most this long, and decide again.
    WaitForCleaning(Duration),
    /// Run the disk steps ([`crate::actors::volumes::steps::create`]): the record is
    /// reserved in the book.
    Run {
        /// The new record, `Creating`.
        rec: VolumeRecord,
        /// Its drive.
        loc: DriveLoc,
        /// The clone's source, if it is one.
        from: Option<CloneFrom>,
    },
}

impl VolumeBook {
    /// A CreateVolume beginning now.
    pub(crate) fn create_call(&self, m: CreateVolume) -> CreateCall {
        let guid = gpt::volume_partition_guid(&m.name);
        let deadline = Instant::now() + self.cfg.cleaning_wait;
        CreateCall { m, guid, id: guid.to_string(), held: None, refused: Vec::new(), deadline }
    }

    /// Decides one attempt of a claimed CreateVolume: plan, place, reserve, or wait for
    /// the cleaner.
    pub(crate) fn begin_create(&mut self, call: &mut CreateCall) -> CreateStart {
        let rec = match self.plan_create_with(&call.m, call.guid, true) {
            Ok(CreatePlan::Existing(rec)) => return CreateStart::Answer(Ok(rec)),
            Ok(CreatePlan::New(rec)) => rec,
            Err(VolumeError::ResourceExhausted { .. }) if Instant::now() < call.deadline && self.fits_after_cleaning(&call.m, call.guid) => {
                return CreateStart::WaitForCleaning(call.deadline.saturating_duration_since(Instant::now()));
            }
            Err(VolumeError::ResourceExhausted { reason }) if !call.refused.is_empty() => {
                let reason = format!("{reason}; refused when written to: {}", call.refused.join("; "));
                return CreateStart::Answer(Err(VolumeError::ResourceExhausted { reason }));
            }
            Err(e) => return CreateStart::Answer(Err(e)),
        };
        let Some(loc) = self.loc_of(&rec) else {
            return CreateStart::Answer(Err(VolumeError::DriveGoneDuringCreate { volume_id: call.id.clone(), drive_id: rec.drive_id }));
        };
        let from = match rec.clone_of.as_ref().or(rec.restored_from.as_ref()) {
            Some(src) => match self.clone_start(src, &call.m, &mut call.held) {
                Ok(s) => Some(CloneFrom::of(s, self.cfg.allowed_roots.clone(), self.freeze_journal.clone(), call.m.secrets.clone())),
                Err(e) => return CreateStart::Answer(Err(e)),
            },
            None => None,
        };
        info!(volume.id = %rec.id, volume.name = %rec.name, drive.id = %rec.drive_id, volume.size = rec.size, volume.clone_of = ?rec.clone_of, "creating volume");
        self.reserve(rec.clone());
        CreateStart::Run { rec, loc, from }
    }

    /// The GPT writer refused `drive_id` during an attempt of `call` (it holds `found`,
    /// data drivelet did not write that the last probe had not seen): the drive is
    /// foreign from now on, and the next attempt goes on to the next drive.
    pub(crate) fn create_refused(&mut self, call: &mut CreateCall, drive_id: &str, found: &str) {
        warn!(volume.id = %call.id, drive.id = %drive_id, drive.reason = %found,
              "the GPT writer refused the drive: it is foreign from now on; trying the next drive");
        self.drive_refused(drive_id, found);
        call.refused.push(format!("drive {drive_id} holds {found}"));
    }

    /// Decides a CreateVolume: the existing volume of the name, or a new record placed
    /// on a drive with room.
    #[cfg(test)]
    pub(crate) fn plan_create(&self, m: &CreateVolume) -> Result<CreatePlan, VolumeError> {
        self.plan_create_with(m, gpt::volume_partition_guid(&m.name), true)
    }

    /// Decides a CreateVolume of the volume `guid` (the name's), counting space being
    /// cleaned as used or not.
    pub(super) fn plan_create_with(&self, m: &CreateVolume, guid: Uuid, with_dirty: bool) -> Result<CreatePlan, VolumeError> {
        let id = guid.to_string();
        let fs_type = if m.block { String::new() } else if m.fs_type.is_empty() { self.cfg.default_fs.clone() } else { m.fs_type.clone() };
        if let Some(rec) = self.records.get(&id) {
            if let Some(e) = clone::source_mismatch(rec, m) {
                return Err(e);
            }
            // A clone asking for no filesystem takes its source's.
            let fs_type = if m.source.is_some() && m.fs_type.is_empty() && !m.block { rec.fs_type.clone() } else { fs_type };
            return match rec.state {
                VolumeState::Deleting => Err(VolumeError::DeleteUnfinished { volume_id: id }),
                VolumeState::Creating => Ok(CreatePlan::New(VolumeRecord::clone(rec))),
                // Never a success for a volume that does not exist: the CO sees why, and
                // DeleteVolume clears the way for a new one of the same name.
                _ if rec.lost => Err(conditions::lost(rec)),
                _ => {
                    let same_kind = rec.rebuilt || (rec.block == m.block && (m.block || rec.fs_type == fs_type));
                    let same_params = rec.rebuilt || *rec.parameters == m.parameters;
                    if !m.range.admits(rec.size) {
                        Err(VolumeError::AlreadyExists {
                            volume: m.name.clone(),
                            reason: format!("exists with {} bytes, outside the requested capacity range", rec.size),
                        })
                    } else if !same_kind || !same_params || rec.layout != m.layout {
                        Err(VolumeError::AlreadyExists {
                            volume: m.name.clone(),
                            reason: "exists with different parameters or access type".into(),
                        })
                    } else {
                        Ok(CreatePlan::Existing(VolumeRecord::clone(rec)))
                    }
                }
            };
        }
        let source = match &m.source {
            Some(s) => Some(self.clone_source(s, m)?.rec),
            None => None,
        };
        let fs_type = clone::fs_of_clone(source.as_ref(), m, fs_type);
        let minimum = model::minimum_size(m.block, &fs_type);
        // A clone holds at least its source (a restore its snapshot's data); asked for
        // no size, it gets that.
        let (default, minimum) = match &source {
            Some(src) => {
                let data = src.snapshot.as_ref().map_or(src.size, |s| s.restore_size);
                (data.max(minimum), data.max(minimum))
            }
            None => (self.cfg.default_size, minimum),
        };
        let size = model::size_for(m.range, default, minimum).map_err(|reason| VolumeError::OutOfRange { reason })?;
        let want = if m.layout == LayoutKind::Drive { m.range.required.max(minimum) } else { size };
        let p = placement::place(&self.candidates_with(with_dirty), m.media, m.layout, want).map_err(|e| match e {
            NoRoom::TooBig(reason) => VolumeError::OutOfRange { reason },
            NoRoom::Full(reason) if with_dirty && self.plan_create_with(m, guid, false).is_ok() => {
                VolumeError::ResourceExhausted { reason: format!("{reason}: {}", self.cleaning_note()) }
            }
            NoRoom::Full(reason) => VolumeError::ResourceExhausted { reason },
        })?;
        if m.layout == LayoutKind::Drive && m.range.limit != 0 && p.size > m.range.limit {
            return Err(VolumeError::OutOfRange {
                reason: format!("a whole drive here is {} bytes, above limit_bytes {}", p.size, m.range.limit),
            });
        }
        let media = self.drives.get(&p.drive_id).map(|d| d.media).unwrap_or(Media::Virtual);
        Ok(CreatePlan::New(VolumeRecord {
            drive_id: p.drive_id,
            part_guid: guid,
            start: p.start,
            size: p.size,
            layout: m.layout,
            media,
            block: m.block,
            fs_type,
            parameters: m.parameters.clone().into(),
            binding: m.binding.clone(),
            clone_of: m.source.clone().filter(|_| !m.from_snapshot),
            restored_from: m.source.clone().filter(|_| m.from_snapshot),
            ..VolumeRecord::new(id, m.name.clone(), VolumeState::Creating, now_unix())
        }))
    }
}
