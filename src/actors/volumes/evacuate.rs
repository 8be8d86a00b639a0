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
//!   space (`steps::moves::move_volume` holds the steps and their crash points; start-up
//!   finishes or rolls back a move from the record's [`Move`](super::model::Move));
//! - subscribers hear [`VolumeMoved`] for every move (the Kubernetes Events on the
//!   volume's claim say where its data went).
//!
//! This file holds what callers see of an evacuation ([`Evacuation`] and its parts);
//! its state and decisions are the book's (`book::evacuate`), its handlers and the
//! loop of its moves `calls::evacuation`, its disk steps `steps::moves`.

use serde::{Deserialize, Serialize};

#[cfg(doc)]
use super::messages::{EvacuateDrive, VolumeMoved};

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
