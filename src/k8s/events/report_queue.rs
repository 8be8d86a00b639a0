//! The report queue: condition reports waiting to run. Pure bookkeeping for the actor.
//!
//! Rules:
//! - At most one report queued per volume: a newer one replaces it (only the latest
//!   state is worth saying).
//! - One report running per volume, so a volume's Events come in order; at most
//!   `limit` running in all ([`MAX_CONCURRENT_REPORTS`] in the actor).

use std::collections::{HashSet, VecDeque};

use super::VolumeConditionChanged;

/// How many volumes are reported on at once.
pub(crate) const MAX_CONCURRENT_REPORTS: usize = 3;

/// Reports waiting to run: at most one queued per volume (a newer one replaces it), one
/// running per volume, at most `limit` running in all. Pure bookkeeping for the actor.
#[derive(Debug, Clone)]
pub(crate) struct ReportQueue {
    pub(super) limit: usize,
    queued: VecDeque<VolumeConditionChanged>,
    running: HashSet<String>,
}

impl ReportQueue {
    /// An empty queue running at most `limit` (at least one) reports at once.
    pub(crate) fn new(limit: usize) -> Self {
        Self { limit: limit.max(1), queued: VecDeque::new(), running: HashSet::new() }
    }

    /// Queue a report, replacing a queued (not yet running) one of the same volume.
    pub(crate) fn push(&mut self, change: VolumeConditionChanged) {
        match self.queued.iter_mut().find(|q| q.volume_id == change.volume_id) {
            Some(queued) => *queued = change,
            None => self.queued.push_back(change),
        }
    }

    /// The oldest queued report that may start now (below the limit, its volume not
    /// running), marked running.
    pub(crate) fn start(&mut self) -> Option<VolumeConditionChanged> {
        if self.running.len() >= self.limit {
            return None;
        }
        let at = self.queued.iter().position(|q| !self.running.contains(&q.volume_id))?;
        let change = self.queued.remove(at)?;
        self.running.insert(change.volume_id.clone());
        Some(change)
    }

    /// The report of `volume_id` finished.
    pub(crate) fn finish(&mut self, volume_id: &str) {
        self.running.remove(volume_id);
    }

    /// Forget the running reports (their futures were dropped); queued ones stay.
    pub(crate) fn clear_running(&mut self) -> usize {
        let n = self.running.len();
        self.running.clear();
        n
    }

    #[cfg(test)]
    /// How many reports are queued and how many are running.
    pub(crate) fn counts(&self) -> (usize, usize) {
        (self.queued.len(), self.running.len())
    }
}
