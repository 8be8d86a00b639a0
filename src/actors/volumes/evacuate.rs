//! Evacuation of a drive: every volume and snapshot on it moves to other managed drives
//! of the node, keeping its id (so its PV, claim and pods need no change), and the drive
//! ends released, holding no partition: it can be pulled.
//!
//! Rules:
//! - asked by an admin ([`EvacuateDrive`]: `drivelet ctl drive evacuate`, or the Drive
//!   object's `spec.action: evacuate`); the intent is stored with the drive's usage record
//!   (the drive is `releasing` from then on, closed to new volumes), so a restart goes on
//!   with it;
//! - nothing starts that cannot finish: when the other drives of the node cannot hold
//!   every volume on the drive, the request is refused (RESOURCE_EXHAUSTED, saying how
//!   much is missing) and nothing moves;
//! - one volume moves at a time, the source read once, sequentially; a volume no pod
//!   has staged moves at once; a staged one waits until it is unstaged (its filesystem
//!   is in use: its device cannot change under the mount); while a volume moves it is
//!   claimed, so stage, attach and delete answer ABORTED and kubelet retries;
//! - the copy is every byte of the partition, checksummed as read and verified by
//!   reading the copy back before the switch; a block that cannot be read is reported
//!   per volume with its byte ranges, and such a volume is not switched unless the
//!   evacuation was forced (then the copy holds zeros there, and its condition and
//!   Event say which ranges);
//! - the switch is one store write (the record then points at the copy); the copy's
//!   GPT entry carries the move mark ([`crate::disk::gpt::MOVE_ATTR`]) until then, so
//!   a copy cut short is never mistaken for the volume, with or without the store; the
//!   old partition is removed after the switch and its space cleaned like any freed
//!   space (`ops::move_volume` holds the steps and their crash points; start-up
//!   finishes or rolls back a move from the record's [`Move`](super::model::Move));
//! - subscribers hear [`VolumeMoved`] for every move (the Kubernetes Events on the
//!   volume's claim say where its data went).

use actix::prelude::*;
use serde::{Deserialize, Serialize};

use super::VolumeError;

/// Command: evacuate a drive (idempotent: asking again retries the volumes that failed
/// and answers where it stands).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<Evacuation, VolumeError>")]
pub struct EvacuateDrive {
    /// Stable drive id.
    pub drive_id: String,
    /// Switch a volume even when blocks of it could not be read (they read as zeros on
    /// its new drive).
    pub force: bool,
}

/// Query: where every evacuation asked for stands, by drive id.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Vec<Evacuation>")]
pub struct ListEvacuations;

/// Where the evacuation of one drive stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evacuation {
    /// The drive being evacuated.
    pub drive_id: String,
    /// Forced: volumes with unreadable blocks are switched anyway.
    pub force: bool,
    /// Volumes (and snapshots) moved off the drive since this process started.
    pub moved: Vec<MovedVolume>,
    /// What is still on the drive, each with where it stands.
    pub pending: Vec<PendingMove>,
    /// Nothing is left on the drive: it is released and may be pulled.
    pub done: bool,
}

impl Evacuation {
    /// One line in plain words: how many moved, how many wait and why.
    pub fn words(&self) -> String {
        if self.done {
            return format!("evacuated: {} moved; the drive holds no volume and may be pulled", self.moved.len());
        }
        let count = |s: PendingState| self.pending.iter().filter(|p| p.state == s).count();
        let mut parts = vec![format!("{} moved", self.moved.len())];
        for (s, what) in [
            (PendingState::Moving, "moving"),
            (PendingState::Queued, "queued"),
            (PendingState::Waiting, "waiting for their pods to let go"),
            (PendingState::Failed, "failed"),
        ] {
            let n = count(s);
            if n > 0 {
                parts.push(format!("{n} {what}"));
            }
        }
        format!("evacuating: {}", parts.join(", "))
    }
}

/// A volume moved off an evacuated drive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MovedVolume {
    /// Its id (unchanged).
    pub volume_id: String,
    /// Its name (the PV's).
    pub name: String,
    /// The drive it is on now.
    pub to_drive: String,
    /// Bytes copied.
    pub bytes: u64,
    /// How long the move took, milliseconds.
    pub millis: u64,
    /// Byte ranges `(start, length)` of the volume that could not be read (a forced
    /// evacuation only): they read as zeros on its new drive.
    pub unreadable: Vec<(u64, u64)>,
}

/// Where a volume still on an evacuated drive stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PendingState {
    /// Being copied now.
    Moving,
    /// Moves when its turn comes.
    Queued,
    /// Staged by a pod: moves once it is unstaged.
    Waiting,
    /// Its move failed (see the reason); asking for the evacuation again retries it.
    Failed,
}

impl PendingState {
    /// Lower-case name for output.
    pub fn as_str(self) -> &'static str {
        match self {
            PendingState::Moving => "moving",
            PendingState::Queued => "queued",
            PendingState::Waiting => "waiting",
            PendingState::Failed => "failed",
        }
    }
}

/// A volume (or snapshot) still on an evacuated drive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingMove {
    /// Its id.
    pub volume_id: String,
    /// Its name.
    pub name: String,
    /// Where it stands.
    pub state: PendingState,
    /// Why, in plain words (the staging path it waits for, or why it failed).
    pub reason: String,
}

/// Notification: a volume moved to another drive of the node.
#[derive(Message, Debug, Clone, PartialEq, Eq)]
#[rtype(result = "()")]
pub struct VolumeMoved {
    /// The volume.
    pub volume_id: String,
    /// Its name (the PV's).
    pub name: String,
    /// The drive it left.
    pub from_drive: String,
    /// The drive it is on now.
    pub to_drive: String,
    /// Bytes copied.
    pub bytes: u64,
    /// Byte ranges that could not be read and read as zeros now (forced only).
    pub unreadable: Vec<(u64, u64)>,
}

/// Command: send every future [`VolumeMoved`] to this recipient.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SubscribeMoves(pub Recipient<VolumeMoved>);

/// How often the volume manager looks for the next move of an evacuation (a staged
/// volume moves within this of its unstage).
pub(crate) const EVACUATION_TICK: std::time::Duration = std::time::Duration::from_secs(1);

/// How far the move running now is: the copy counts the bytes it wrote and then those
/// it verified, so it is done at twice the volume's size.
#[derive(Debug, Clone)]
pub(crate) struct MoveProgress {
    /// The volume being moved.
    pub volume_id: String,
    /// The drive its copy goes to.
    pub to_drive: String,
    /// Bytes written plus bytes verified so far.
    pub done: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Twice the volume's size: written, then verified.
    pub total: u64,
}

impl MoveProgress {
    /// The fraction done, 0 to 1.
    pub(crate) fn ratio(&self) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        (self.done.load(std::sync::atomic::Ordering::Relaxed) as f64 / self.total as f64).min(1.0)
    }
}

/// What the volume manager keeps of evacuations besides the book.
#[derive(Default)]
pub(crate) struct Evacuations {
    /// The record being moved now (one at a time).
    pub moving: Option<String>,
    /// Moves done by this process, by the drive they left.
    pub moved: std::collections::HashMap<String, Vec<MovedVolume>>,
    /// Why a record's move failed; retried when the evacuation is asked again.
    pub failed: std::collections::HashMap<String, String>,
    /// How far the move running now is, for the metrics.
    pub progress: Option<MoveProgress>,
    /// Who hears of each move.
    pub subscribers: Vec<Recipient<VolumeMoved>>,
}

use super::{reply, Reply, VolumeManager};

impl VolumeManager {
    /// Starts the next move of an evacuation, if none runs and one can start.
    pub(crate) fn evacuate_next(&mut self, ctx: &mut Context<Self>) {
        if self.evacuations.moving.is_some() || self.store.is_none() {
            return;
        }
        let Some((plan, force)) = self.book.next_move(&mut self.evacuations.failed) else { return };
        let Ok(store) = self.store() else { return };
        let id = plan.rec.id.clone();
        let Ok(claim) = self.book.claim(&id) else { return };
        let to = plan.rec.moving.clone().expect("a move plan names where the copy goes");
        tracing::info!(volume.id = %id, volume.name = %plan.rec.name, drive.from = %plan.rec.drive_id, drive.to = %to.drive_id, volume.size = plan.rec.size, "moving volume off an evacuated drive");
        self.evacuations.moving = Some(id.clone());
        let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        self.evacuations.progress =
            Some(MoveProgress { volume_id: id.clone(), to_drive: to.drive_id.clone(), done: done.clone(), total: plan.rec.size.saturating_mul(2) });
        let name = plan.rec.name.clone();
        let from_drive = plan.rec.drive_id.clone();
        self.book.reserve_move(plan.rec.clone());
        self.announce(&from_drive); // the Drive object shows the volume moving
        let guards = self.book.guards();
        let job = move || super::moves::move_volume(&store, &guards, plan, force, &done);
        let fut = self.run_with(claim, id.clone(), true, job).map(move |res, act, ctx| {
            act.evacuations.moving = None;
            act.evacuations.progress = None;
            crate::metrics::metrics().record_move(res.as_ref().ok().map(|d| d.bytes));
            match res {
                Ok(done) => {
                    // The old extent is dirty (the same GPT commit said so on the disk).
                    let loc = act.book.drives().find(|d| d.id == done.from_drive).map(|d| crate::words::DriveLoc { path: d.path.clone(), sector: d.logical_block_size });
                    if let Some(loc) = loc {
                        act.book.add_dirty(&done.from_drive, done.from_extent);
                        act.cleaner.add(&done.from_drive, loc, done.from_extent);
                    }
                    act.evacuations.moved.entry(done.from_drive.clone()).or_default().push(MovedVolume {
                        volume_id: id.clone(),
                        name: name.clone(),
                        to_drive: done.to_drive.clone(),
                        bytes: done.bytes,
                        millis: done.millis,
                        unreadable: done.unreadable.clone(),
                    });
                    let event = VolumeMoved { volume_id: id.clone(), name, from_drive: done.from_drive.clone(), to_drive: done.to_drive.clone(), bytes: done.bytes, unreadable: done.unreadable };
                    act.evacuations.subscribers.retain(|s| s.try_send(event.clone()).is_ok() || s.connected());
                    act.announce(&done.to_drive);
                    act.announce(&done.from_drive);
                    if let Some(w) = act.settle_drive(&done.from_drive) {
                        drop(w);
                    }
                }
                Err(e) => {
                    tracing::warn!(volume.id = %id, drive.id = %from_drive, error = %e, "the volume's move failed; it stays where it is");
                    // The copy's extent held the tenant's bytes: dirty until cleaned.
                    let rolled_back = act.book.records().find(|r| r.id == id).is_some_and(|r| r.moving.is_none());
                    if rolled_back {
                        let d = act.book.drives().find(|d| d.id == to.drive_id).cloned();
                        if let Some(d) = d {
                            let extent = (to.start, to.size);
                            act.book.add_dirty(&d.id, extent);
                            act.cleaner.add(&d.id, crate::words::DriveLoc { path: d.path.clone(), sector: d.logical_block_size }, extent);
                        }
                    }
                    act.evacuations.failed.insert(id.clone(), e.to_string());
                    act.announce(&from_drive);
                }
            }
            act.evacuate_next(ctx);
        });
        ctx.spawn(fut.map(|_, _, _| ()));
    }
}

impl VolumeManager {
    /// Finishes the moves whose old partition is on `drive_id`, which just came back (it
    /// was absent when they switched): the old partitions go, their space is dirty.
    pub(crate) fn finish_moves_from(&mut self, drive_id: &str, ctx: &mut Context<Self>) {
        let Some(src) = self.book.drives().find(|d| d.id == drive_id).map(|d| crate::words::DriveLoc { path: d.path.clone(), sector: d.logical_block_size }) else {
            return;
        };
        let pending: Vec<super::model::VolumeRecord> =
            self.book.records().filter(|r| r.moving.as_ref().is_some_and(|m| m.switched && m.drive_id == drive_id)).cloned().collect();
        for rec in pending {
            let (Ok(store), Some(dst)) = (self.store(), self.book.loc_of(&rec)) else { continue };
            let Ok(claim) = self.book.claim(&rec.id) else { continue };
            let Some(old) = rec.moving.clone() else { continue };
            let src = src.clone();
            let id = rec.id.clone();
            let fut = self.run(claim, id.clone(), move || {
                let mut rec = rec;
                let result = super::moves::finish_move(&store, Some(&src), &dst, &mut rec);
                super::ops::Outcome { record: Some(rec), result }
            });
            ctx.spawn(fut.map(move |res, act, _| match res {
                Ok(()) => {
                    tracing::info!(volume.id = %id, drive.id = %old.drive_id, "the old partition of a moved volume is removed from its drive, back now");
                    let loc = act.book.drives().find(|d| d.id == old.drive_id).map(|d| crate::words::DriveLoc { path: d.path.clone(), sector: d.logical_block_size });
                    if let Some(loc) = loc {
                        act.book.add_dirty(&old.drive_id, (old.start, old.size));
                        act.cleaner.add(&old.drive_id, loc, (old.start, old.size));
                    }
                    act.announce(&old.drive_id);
                }
                Err(e) => tracing::warn!(volume.id = %id, error = %e, "cannot remove the old partition of a moved volume; retried when the drive is read again"),
            }));
        }
    }
}

impl Handler<EvacuateDrive> for VolumeManager {
    type Result = Reply<Evacuation>;
    fn handle(&mut self, m: EvacuateDrive, _: &mut Context<Self>) -> Self::Result {
        let usage = match self.book.evacuate(&m, &mut self.evacuations.failed) {
            Ok(u) => u,
            Err(e) => return reply(Err(e)),
        };
        let store = match self.store() {
            Ok(s) => s,
            Err(e) => return reply(Err(e)),
        };
        let job = self.uses.job(store, &m.drive_id, Some(usage));
        let drive_id = m.drive_id.clone();
        Box::pin(async move { tokio::task::spawn_blocking(job).await }.into_actor(self).map(move |res, act, ctx| {
            act.announce(&drive_id);
            act.refresh(|r| r.drive_id == drive_id);
            match res {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(VolumeError::Store(e)),
                Err(e) => {
                    let what = format!("write of the evacuation of drive {drive_id}");
                    return Err(VolumeError::Store(crate::store::StoreError::Txn { what, reason: e.to_string() }));
                }
            }
            act.evacuate_next(ctx);
            let list = act.book.evacuations(&act.evacuations.moved, &act.evacuations.failed, act.evacuations.moving.as_deref());
            list.into_iter().find(|e| e.drive_id == drive_id).ok_or_else(|| VolumeError::CannotEvacuate { drive_id, reason: "its evacuation record is gone".into() })
        }))
    }
}

impl Handler<ListEvacuations> for VolumeManager {
    type Result = MessageResult<ListEvacuations>;
    fn handle(&mut self, _: ListEvacuations, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.book.evacuations(&self.evacuations.moved, &self.evacuations.failed, self.evacuations.moving.as_deref()))
    }
}

impl Handler<SubscribeMoves> for VolumeManager {
    type Result = ();
    fn handle(&mut self, m: SubscribeMoves, _: &mut Context<Self>) {
        self.evacuations.subscribers.push(m.0);
    }
}
