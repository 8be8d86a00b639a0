//! The book's decisions about growing a volume (ControllerExpandVolume): in place when
//! the free space right after its partition holds the new size, else by moving it to a
//! free extent big enough on another managed drive of the node or elsewhere on its own
//! drive, then growing it there.
//!
//! Rules:
//! - the size asked is rounded like a create and never below the current size; the
//!   same size is success at once;
//! - in place first: the partition grows into the free space that follows it, never
//!   into space still being cleaned (it may hold a former tenant's bytes, and the
//!   cleaner zeroes it unlocked): when only such space is in the way, the call waits for
//!   the cleaner as a create does (`volumes.cleaning_wait`), then answers
//!   RESOURCE_EXHAUSTED naming the space being cleaned;
//! - else by a move, with evacuation's machinery (`steps::moves`: a verified copy, the
//!   same volume id and, once finished, the same partition GUID, crash-safe), to a
//!   place [`placement::place`] picks ([`VolumeBook::move_target`]): on the other open
//!   managed drives first (the copy then reads one device and writes another, and the
//!   volume's own drive keeps its free extents for its neighbours to grow into), else
//!   on its own drive, where the volume's extent is taken, so the copy never overlaps
//!   it (of the volume's media when its class asked for one; space still being cleaned
//!   is never taken, and a free slot is needed); the copy's partition has the new size
//!   from the start, so the switch is the growth;
//! - a copy on the volume's own drive carries a temporary partition GUID of its own
//!   ([`Move::copy_guid`]; two partitions of one drive cannot carry one GUID, which the
//!   volume's key, its note entry and every partition-table step name), and the move's
//!   finish gives it the volume's GUID in the one GPT commit that removes the old
//!   partition;
//! - a move needs the volume unused: not staged, published or attached anywhere (a
//!   filesystem cannot change device under its mount). A volume in use that only a move
//!   could grow is refused with [`VolumeError::GrowsWhenUnused`] (FAILED_PRECONDITION),
//!   saying in words that it grows once no pod uses it: the resizer retries, and the
//!   first try after its unstage and detach moves it;
//! - a whole-drive volume grows only by a move, to another empty managed drive whose
//!   usable region holds the size asked, and takes that whole region, as a create with
//!   `layout: drive` does (so it may grow past the size asked; the answer says its size);
//! - snapshots and volumes being moved do not move to grow;
//! - no room anywhere: OUT_OF_RANGE naming the largest size possible, in place or by a
//!   move (a move's reach is exactly GetCapacity's `maximum_volume_size` for the
//!   volume's media and layout: the node's largest usable free extent, its own drive
//!   included, or for a whole-drive volume the largest empty drive's region),
//!   or RESOURCE_EXHAUSTED when room may come by itself (another volume follows it on
//!   its drive, or the room a move needs is still being cleaned).

use super::{drive_loc, MovePlan, VolumeBook};
use crate::actors::volumes::error::VolumeError;
use crate::actors::volumes::messages::ExpandVolume;
use crate::actors::volumes::model::{self, Move, Refusal, VolumeRecord, VolumeState};
use crate::actors::volumes::placement::{self, Candidate};
use crate::config::human_bytes;
use crate::disk::gpt;
use crate::words::{DriveLoc, LayoutKind, Media};

/// How a volume grows to the size asked.
#[derive(Debug, Clone)]
pub(crate) enum ExpandPlan {
    /// Where it is (or not at all: `new_size` is its size).
    InPlace {
        /// The record as it is.
        rec: VolumeRecord,
        /// Its drive.
        loc: DriveLoc,
        /// The size it grows to.
        new_size: u64,
    },
    /// By a move to another drive or elsewhere on its own: the copy's extent
    /// (`rec.moving`) has the new size.
    Move(MovePlan),
    /// In place once the space after it is cleaned: wait for the cleaner and decide
    /// again; `reason` is the refusal when the wait runs out.
    WaitForCleaning {
        /// Why it cannot grow now, in words.
        reason: String,
    },
}

/// The media a volume must stay on: its class's, when the class asked for one.
pub(super) fn media_of(r: &VolumeRecord) -> Option<Media> {
    r.parameters.get("media").and_then(|m| serde_json::from_value(serde_json::Value::String(m.clone())).ok())
}

/// Whether a volume is in use: staged, published or attached.
pub(crate) fn in_use(r: &VolumeRecord) -> bool {
    r.staging.is_some() || !r.targets.is_empty() || r.published_node.is_some()
}

/// Words for where a volume is in use.
fn use_words(r: &VolumeRecord) -> String {
    if let Some(s) = &r.staging {
        format!("it is staged at {}", s.path.display())
    } else if let Some(p) = r.targets.keys().next() {
        format!("it is published at {}", p.display())
    } else {
        format!("it is attached to node {}", r.published_node.as_deref().unwrap_or(""))
    }
}

impl VolumeBook {
    /// Where a move of `rec` growing to `size` bytes goes: another drive when one has
    /// room (the copy reads one device and writes another, and the volume's own drive
    /// keeps its free extents for its neighbours to grow into), else a free extent of its
    /// own drive (the book holds the volume's own extent as used, so the two never
    /// overlap).
    /// A whole-drive volume goes to another empty drive whose usable region holds `size`,
    /// and takes all of it (as a create of one does).
    pub(super) fn move_target(cands: &[Candidate<'_>], rec: &VolumeRecord, size: u64) -> Option<placement::Placement> {
        let (own, others): (Vec<Candidate<'_>>, Vec<Candidate<'_>>) = cands.iter().cloned().partition(|c| c.drive.id == rec.drive_id);
        let media = media_of(rec);
        if rec.layout == LayoutKind::Drive {
            return placement::place(&others, media, LayoutKind::Drive, size).ok();
        }
        placement::place(&others, media, LayoutKind::Partition, size).or_else(|_| placement::place(&own, media, LayoutKind::Partition, size)).ok()
    }

    /// The largest volume a move of `rec` could reach now: GetCapacity's
    /// `maximum_volume_size` for the volume's media and layout, its own drive included
    /// (where the volume's own extent is taken; a whole-drive volume's drive offers none).
    pub(crate) fn move_reach(&self, rec: &VolumeRecord) -> u64 {
        placement::capacity(&self.candidates(), media_of(rec), rec.layout, rec.size).maximum_volume_size
    }

    /// Decides a ControllerExpandVolume: how the volume grows to the size asked, or why
    /// it cannot (see the module's rules).
    pub(crate) fn expand_check(&self, m: &ExpandVolume) -> Result<ExpandPlan, VolumeError> {
        let id = m.volume_id.as_str();
        let rec = self.visible(id)?.clone();
        if rec.state == VolumeState::Deleting {
            return Err(VolumeError::refused(&rec, Refusal::BeingDeleted));
        }
        if let Some(a) = &rec.adopted {
            return Err(VolumeError::AdoptedFixedSize { volume_id: id.to_string(), path: a.path.clone() });
        }
        let new_size = model::size_for(m.range, rec.size, rec.size).map_err(|reason| VolumeError::OutOfRange {
            reason: format!("volume {id} is {} bytes and cannot shrink: {reason}", rec.size),
        })?;
        let d = self
            .drives
            .get(&rec.drive_id)
            .ok_or_else(|| VolumeError::DriveAbsent { volume_id: id.to_string(), drive_id: rec.drive_id.clone() })?;
        let loc = drive_loc(d);
        if new_size == rec.size {
            return Ok(ExpandPlan::InPlace { rec, loc, new_size });
        }
        let region_end = gpt::usable_region(d.size_bytes, d.logical_block_size).map_or(0, |(_, e)| e);
        let mut others: Vec<(u64, u64)> =
            self.records.values().filter(|r| r.drive_id == rec.drive_id && r.id != rec.id).map(|r| (r.start, r.size)).collect();
        others.extend(self.records.values().filter_map(|r| r.moving.as_ref()).filter(|m| m.drive_id == rec.drive_id).map(|m| (m.start, m.size)));
        others.extend(d.extents.iter().copied());
        // What it may grow into once cleaned, and what it may grow into now.
        let room = model::grow_room(rec.start, rec.size, &others, region_end);
        let dirty = self.dirty.get(&rec.drive_id).map(|x| x.extents.as_slice()).unwrap_or_default();
        let now = if dirty.is_empty() {
            room
        } else {
            let all: Vec<(u64, u64)> = others.iter().chain(dirty).copied().collect();
            model::grow_room(rec.start, rec.size, &all, region_end)
        };
        if new_size <= now.max_size {
            return Ok(ExpandPlan::InPlace { rec, loc, new_size });
        }
        if new_size <= room.max_size {
            return Ok(ExpandPlan::WaitForCleaning {
                reason: format!(
                    "volume {id} can grow in place to {} ({new_size} bytes) once the space after it on drive {} is cleaned: {}",
                    human_bytes(new_size),
                    rec.drive_id,
                    self.cleaning_note()
                ),
            });
        }
        // In place it cannot: a move, when a whole partition may move.
        let movable = rec.snapshot.is_none() && rec.moving.is_none();
        let placed = if movable { Self::move_target(&self.candidates(), &rec, new_size) } else { None };
        if let Some(p) = placed {
            if in_use(&rec) {
                return Err(VolumeError::GrowsWhenUnused {
                    volume_id: id.to_string(),
                    size: new_size,
                    drive_id: p.drive_id,
                    why: use_words(&rec),
                });
            }
            let Some(dst) = self.drives.get(&p.drive_id) else {
                return Err(VolumeError::ResourceExhausted { reason: format!("drive {} went away; ask again", p.drive_id) });
            };
            let mut moved = rec.clone();
            // On its own drive the copy carries a GUID of its own until the finish.
            let copy_guid = (p.drive_id == rec.drive_id).then(uuid::Uuid::new_v4);
            // A whole-drive volume takes the new drive's whole usable region.
            let size = if rec.layout == LayoutKind::Drive { p.size.max(new_size) } else { new_size };
            moved.moving = Some(Box::new(Move { drive_id: p.drive_id.clone(), start: p.start, size, copy_guid, ..Move::default() }));
            return Ok(ExpandPlan::Move(MovePlan { rec: moved, src: loc, dst: drive_loc(dst), dst_media: dst.media }));
        }
        // No room anywhere now: say the most it could grow to.
        let reach = if movable { self.move_reach(&rec) } else { 0 };
        let largest = room.max_size.max(reach);
        let in_place = format!(
            "volume {id} cannot grow to {} ({new_size} bytes): in place it can grow to at most {} on drive {} ({})",
            human_bytes(new_size),
            human_bytes(room.max_size),
            rec.drive_id,
            if room.blocked { "another volume or partition follows it" } else { "the drive ends there" },
        );
        let elsewhere = if !movable {
            ", and a snapshot or a volume being moved does not move".to_string()
        } else if rec.layout == LayoutKind::Drive && reach == 0 {
            ", and no other managed drive of this node is empty and larger than it to move it to".to_string()
        } else if rec.layout == LayoutKind::Drive {
            format!(", and the largest empty drive it could move to on this node holds {}", human_bytes(reach))
        } else if reach == 0 {
            ", and no managed drive of this node, its own included, has a free extent to move it to".to_string()
        } else {
            format!(", and the largest free extent it could move to on the drives of this node holds {}", human_bytes(reach))
        };
        let most = format!("; the largest it can grow to now is {} ({largest} bytes)", human_bytes(largest));
        // Room that may come by itself: the volume after it may go, or space is cleaned.
        let cleaning = movable && Self::move_target(&self.candidates_with(false), &rec, new_size).is_some();
        let blocked = room.blocked && new_size <= region_end.saturating_sub(rec.start);
        if cleaning {
            Err(VolumeError::ResourceExhausted {
                reason: format!("{in_place}{elsewhere}{most}; room to move it to is still being cleaned: ask again in a while"),
            })
        } else if blocked {
            Err(VolumeError::ResourceExhausted { reason: format!("{in_place}{elsewhere}{most}") })
        } else {
            Err(VolumeError::OutOfRange { reason: format!("{in_place}{elsewhere}{most}") })
        }
    }

    /// How long a call waits for space being cleaned.
    pub(crate) fn cleaning_wait(&self) -> std::time::Duration {
        self.cfg.cleaning_wait
    }

    /// Starts a growth by a move: the copy's extent is reserved (the record with its
    /// `Move`), so a create placed meanwhile sees it taken.
    pub(crate) fn start_grow_move(&mut self, plan: &MovePlan) {
        self.reserve_move(plan.rec.clone());
    }
}
