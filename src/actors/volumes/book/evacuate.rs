//! The book's decisions about evacuations ([`crate::actors::volumes::evacuate`]'s rules):
//! whether a drive may be evacuated and whether the rest of the node holds what is on
//! it, which volume moves next and where, and where each evacuation stands.
//!
//! Rules:
//! - the drive must be a managed drive present on this node (INVALID_ARGUMENT for an
//!   unknown id, FAILED_PRECONDITION for one that is absent: nothing on it can be read);
//! - room: every record still to move is placed, largest first, on the other open
//!   managed drives (of the volume's media when its class asked for one; a whole-drive
//!   volume on an empty drive), each placement counting for the next; one that does
//!   not fit refuses the whole evacuation (RESOURCE_EXHAUSTED saying what is missing),
//!   and nothing is decided;
//! - what moves: volumes and snapshots of the drive that are not lost, not failed by a
//!   forced release and not staged (a staged one waits for its unstage); one at a time,
//!   smallest first (the most volumes freed soonest);
//! - asking again changes `force` as asked and retries the volumes whose move failed.
//!
//! The state of evacuations is here alone: the intent (and `force`) in the drive's
//! usage record, which is stored; the move running now, the moves done and failed by
//! this process in [`Evacuations`]. The actor starts the move the book picks
//! ([`VolumeBook::start_move`]), runs its disk steps and hands the outcome back
//! ([`VolumeBook::move_ended`]).

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use tracing::info;

use super::{drive_loc, Claim, VolumeBook, VolumeError};
use crate::actors::volumes::evacuate::{Evacuation, MoveProgress, MovedVolume, PendingMove, PendingState};
use crate::actors::volumes::messages::{EvacuateDrive, VolumeMoved};
use crate::actors::volumes::model::{Move, VolumeRecord, VolumeState};
use crate::actors::volumes::placement::{self, Candidate, NoRoom};
use crate::actors::volumes::steps::moves::MoveDone;
use crate::config::human_bytes;
use crate::disk::clean::Extent;
use crate::words::{DriveClass, DriveLoc, DriveUse, DriveUseState, Evacuate, LayoutKind, Media};

/// A move to start: the record (its `moving` set to where the copy goes), both drives.
#[derive(Debug, Clone)]
pub(crate) struct MovePlan {
    /// The record as it goes into the move.
    pub rec: VolumeRecord,
    /// Its drive now.
    pub src: DriveLoc,
    /// The drive of the copy.
    pub dst: DriveLoc,
    /// That drive's media.
    pub dst_media: Media,
}

/// What the book keeps of evacuations beside the drives' usage records.
#[derive(Default)]
pub(crate) struct Evacuations {
    /// The record being moved now (one at a time).
    pub(super) moving: Option<String>,
    /// Moves done by this process, by the drive they left.
    pub(super) moved: HashMap<String, Vec<MovedVolume>>,
    /// Why a record's move failed; retried when the evacuation is asked again.
    pub(super) failed: HashMap<String, String>,
    /// How far the move running now is, for the metrics.
    progress: Option<MoveProgress>,
}

impl Evacuations {
    /// Forgets the move running (a restart: its continuation is gone); what moved and
    /// failed is kept for the life of the process.
    pub(super) fn restarted(&mut self) {
        self.moving = None;
    }
}

/// A move the book started: the actor runs its disk steps.
pub(crate) struct StartedMove {
    /// What moves where.
    pub plan: MovePlan,
    /// Switch it even with unreadable blocks.
    pub force: bool,
    /// The claim of the record for the move.
    pub claim: Claim,
    /// Bytes written plus bytes verified, counted by the copy.
    pub done: Arc<AtomicU64>,
    /// Where the copy goes.
    pub to: Move,
}

/// What the end of a move changes besides the record.
pub(crate) struct MoveEnded {
    /// An extent that held the volume's bytes and is free now (the old partition, or a
    /// copy rolled back), on this drive: dirty until cleaned.
    pub freed: Option<(String, Extent)>,
    /// The move done, for the subscribers.
    pub moved: Option<VolumeMoved>,
}

/// The media a record must stay on: its class's, when the class asked for one.
fn media_of(r: &VolumeRecord) -> Option<Media> {
    r.parameters.get("media").and_then(|m| serde_json::from_value(serde_json::Value::String(m.clone())).ok())
}

/// Whether a record on an evacuated drive is one the evacuation moves (now or later).
fn to_move(r: &VolumeRecord) -> bool {
    r.adopted.is_none() && !r.lost && !r.failed
}

impl VolumeBook {
    /// The records on `drive_id` an evacuation moves, smallest first.
    fn movable_on(&self, drive_id: &str) -> Vec<&VolumeRecord> {
        let mut v: Vec<&VolumeRecord> = self.records.values().filter(|r| r.drive_id == drive_id && to_move(r)).map(|r| &**r).collect();
        v.sort_by_key(|r| (r.size, r.id.clone()));
        v
    }

    /// Where `r` (on an evacuated drive) could go now, given `cands` (the book's, with
    /// what earlier placements of the same plan took).
    fn place_move(cands: &[Candidate<'_>], r: &VolumeRecord) -> Result<placement::Placement, NoRoom> {
        let others: Vec<Candidate<'_>> = cands.iter().filter(|c| c.drive.id != r.drive_id).cloned().collect();
        let layout = if r.layout == LayoutKind::Drive { LayoutKind::Drive } else { LayoutKind::Partition };
        placement::place(&others, media_of(r), layout, r.size)
    }

    /// Decides an EvacuateDrive: the drive's usage record from now on (to store), or
    /// why it cannot be evacuated. Closes the drive to new volumes.
    pub(crate) fn evacuate(&mut self, m: &EvacuateDrive) -> Result<DriveUse, VolumeError> {
        if !self.ready {
            return Err(VolumeError::NotReady);
        }
        let cannot = |reason: String| VolumeError::CannotEvacuate { drive_id: m.drive_id.clone(), reason };
        let Some(d) = self.drives.get(&m.drive_id) else {
            if self.records.values().any(|r| r.drive_id == m.drive_id) {
                return Err(cannot("it is absent from this node, so nothing on it can be read; put it back first".into()));
            }
            return Err(VolumeError::InvalidArgument { reason: format!("no drive with id {} is known on this node", m.drive_id) });
        };
        if d.class != DriveClass::Managed {
            return Err(cannot(format!("drivelet does not manage it (it is {}), so it holds no drivelet volume", d.class.as_str())));
        }
        // Room for everything still to move, each placement counting for the next.
        let mut cands = self.candidates();
        let mut todo = self.movable_on(&m.drive_id);
        todo.sort_by_key(|r| std::cmp::Reverse(r.size));
        let mut missing = Vec::new();
        for r in &todo {
            match Self::place_move(&cands, r) {
                Ok(p) => {
                    if let Some(c) = cands.iter_mut().find(|c| c.drive.id == p.drive_id) {
                        c.used.to_mut().push((p.start, p.size));
                    }
                }
                Err(_) => missing.push(*r),
            }
        }
        if !missing.is_empty() {
            let need: u64 = missing.iter().map(|r| r.size).sum();
            let names: Vec<String> = missing.iter().take(5).map(|r| format!("{} ({})", r.name, human_bytes(r.size))).collect();
            return Err(VolumeError::ResourceExhausted {
                reason: format!(
                    "drive {} holds {} volumes and snapshots; the other open managed drives of this node have no room for {} of them ({} more: {}); nothing was moved: add or free a drive and ask again",
                    m.drive_id,
                    todo.len(),
                    missing.len(),
                    human_bytes(need),
                    names.join(", ")
                ),
            });
        }
        let retried: Vec<String> = todo.iter().map(|r| r.id.clone()).collect();
        drop((todo, cands));
        for id in &retried {
            self.evac.failed.remove(id);
        }
        let usage = DriveUse {
            drive_id: m.drive_id.clone(),
            state: if retried.is_empty() { DriveUseState::Released } else { DriveUseState::Releasing },
            reason: "evacuation requested: its volumes move to other drives of this node".into(),
            requested: true,
            evacuate: Some(Evacuate { force: m.force }),
        };
        info!(drive.id = %m.drive_id, volumes = retried.len(), evacuate.force = m.force, "drive evacuation requested");
        self.drive_use.insert(m.drive_id.clone(), usage.clone());
        self.publish();
        Ok(usage)
    }

    /// Starts the next move of an evacuation, if none runs and one can: the record is
    /// claimed, its copy's extent reserved, and the move is the one running.
    pub(crate) fn start_move(&mut self) -> Option<StartedMove> {
        if self.evac.moving.is_some() {
            return None;
        }
        let (plan, force) = self.next_move()?;
        let to = plan.rec.moving.as_deref().cloned()?;
        let claim = self.claim(&plan.rec.id).ok()?;
        let id = plan.rec.id.clone();
        info!(volume.id = %id, volume.name = %plan.rec.name, drive.from = %plan.rec.drive_id, drive.to = %to.drive_id, volume.size = plan.rec.size, "moving volume off an evacuated drive");
        let done = Arc::new(AtomicU64::new(0));
        self.evac.progress = Some(MoveProgress { volume_id: id.clone(), to_drive: to.drive_id.clone(), done: done.clone(), total: plan.rec.size.saturating_mul(2) });
        self.evac.moving = Some(id);
        self.reserve_move(plan.rec.clone());
        Some(StartedMove { plan, force, claim, done, to })
    }

    /// The end of the move of `id` (named `name`), whose copy went to `to`, once its
    /// record is back in the book: what moved, or why not (retried when the evacuation
    /// is asked again).
    pub(crate) fn move_ended(&mut self, id: &str, name: &str, to: &Move, res: Result<&MoveDone, &VolumeError>) -> MoveEnded {
        self.evac.moving = None;
        self.evac.progress = None;
        match res {
            Ok(done) => {
                self.evac.moved.entry(done.from_drive.clone()).or_default().push(MovedVolume {
                    volume_id: id.to_string(),
                    name: name.to_string(),
                    to_drive: done.to_drive.clone(),
                    bytes: done.bytes,
                    millis: done.millis,
                    unreadable: done.unreadable.clone(),
                });
                // The old extent is dirty (the same GPT commit said so on the disk).
                MoveEnded {
                    freed: Some((done.from_drive.clone(), done.from_extent)),
                    moved: Some(VolumeMoved {
                        volume_id: id.to_string(),
                        name: name.to_string(),
                        from_drive: done.from_drive.clone(),
                        to_drive: done.to_drive.clone(),
                        bytes: done.bytes,
                        unreadable: done.unreadable.clone(),
                        grown_to: None,
                    }),
                }
            }
            Err(e) => {
                // The copy's extent held the tenant's bytes: dirty until cleaned.
                let rolled_back = self.records.get(id).is_some_and(|r| r.moving.is_none());
                self.evac.failed.insert(id.to_string(), e.to_string());
                MoveEnded { freed: rolled_back.then(|| (to.drive_id.clone(), (to.start, to.size))), moved: None }
            }
        }
    }

    /// The next move of an evacuation to start, if any: a record no call holds, not
    /// staged, whose move did not fail, with a place to go. A record that has nowhere
    /// to go now fails with why.
    pub(super) fn next_move(&mut self) -> Option<(MovePlan, bool)> {
        let mut no_room = Vec::new();
        let next = self.find_move(&mut no_room);
        self.evac.failed.extend(no_room);
        next
    }

    /// [`VolumeBook::next_move`], the records with no room put in `no_room`.
    fn find_move(&self, no_room: &mut Vec<(String, String)>) -> Option<(MovePlan, bool)> {
        if !self.ready {
            return None;
        }
        let failed = &self.evac.failed;
        let cands = self.candidates();
        for (drive_id, u) in &self.drive_use {
            let Some(ev) = u.evacuate else { continue };
            let Some(src) = self.drive_loc(drive_id) else { continue };
            for r in self.movable_on(drive_id) {
                let stable = matches!(r.state, VolumeState::Available) || (r.snapshot.is_some() && r.state != VolumeState::Creating && r.state != VolumeState::Deleting);
                if !stable || r.staging.is_some() || r.moving.is_some() || failed.contains_key(&r.id) || self.guards.is_claimed(&r.id) {
                    continue;
                }
                let p = match Self::place_move(&cands, r) {
                    Ok(p) => p,
                    Err(NoRoom::TooBig(why) | NoRoom::Full(why)) => {
                        no_room.push((r.id.clone(), format!("no room on the other drives of this node: {why}")));
                        continue;
                    }
                };
                let Some(d) = self.drives.get(&p.drive_id) else { continue };
                let dst = drive_loc(d);
                let mut rec = VolumeRecord::clone(r);
                rec.moving = Some(Box::new(Move { drive_id: p.drive_id.clone(), start: p.start, size: p.size, switched: false, unreadable: Vec::new(), copy_guid: None }));
                return Some((MovePlan { rec, src, dst, dst_media: d.media }, ev.force));
            }
        }
        None
    }

    /// Reserves the copy's extent of a move about to start (the record with its `Move`).
    pub(super) fn reserve_move(&mut self, rec: VolumeRecord) {
        self.records.insert(rec.id.clone(), Arc::new(rec));
        self.publish();
    }

    /// How far the move running now is.
    pub(crate) fn move_progress(&self) -> Option<MoveProgress> {
        self.evac.progress.clone()
    }

    /// Where the evacuation of `drive_id` stands.
    pub(crate) fn evacuation_of(&self, drive_id: &str) -> Result<Evacuation, VolumeError> {
        self.evacuations()
            .into_iter()
            .find(|e| e.drive_id == drive_id)
            .ok_or_else(|| VolumeError::CannotEvacuate { drive_id: drive_id.to_string(), reason: "its evacuation record is gone".into() })
    }

    /// Where every evacuation asked for stands.
    pub(crate) fn evacuations(&self) -> Vec<Evacuation> {
        let (moved, failed, moving) = (&self.evac.moved, &self.evac.failed, self.evac.moving.as_deref());
        let mut out = Vec::new();
        for (drive_id, u) in &self.drive_use {
            let Some(ev) = u.evacuate else { continue };
            let mut pending = Vec::new();
            let mut on: Vec<&VolumeRecord> = self.records.values().filter(|r| r.drive_id == *drive_id && r.adopted.is_none()).map(|r| &**r).collect();
            on.sort_by_key(|r| (r.size, r.id.clone()));
            for r in on {
                let (state, reason) = if moving == Some(r.id.as_str()) {
                    (PendingState::Moving, "being copied to another drive".to_string())
                } else if r.lost {
                    (PendingState::Failed, "its partition is gone from the drive: nothing to move; delete it".to_string())
                } else if r.failed {
                    (PendingState::Failed, "failed by a forced release: nothing to move; delete it".to_string())
                } else if let Some(why) = failed.get(&r.id) {
                    (PendingState::Failed, why.clone())
                } else if let Some(st) = &r.staging {
                    (PendingState::Waiting, format!("staged at {}: moves once the pods using it stop", st.path.display()))
                } else {
                    (PendingState::Queued, "moves when its turn comes".to_string())
                };
                pending.push(PendingMove { volume_id: r.id.clone(), name: r.name.clone(), state, reason });
            }
            let done = pending.is_empty();
            out.push(Evacuation { drive_id: drive_id.clone(), force: ev.force, moved: moved.get(drive_id).cloned().unwrap_or_default(), pending, done });
        }
        out
    }
}
