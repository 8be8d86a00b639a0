//! A work queue with the semantics of client-go's rate-limited work queue, as the
//! external-attacher uses it: keys, not objects, are queued; one key is worked on by one
//! worker at a time; adding a key that is already waiting does nothing; adding a key that
//! is being worked on marks it dirty, so it runs once more right after (never twice at
//! once, and no change seen meanwhile is lost); a failed run comes back after the delay
//! the caller asks for, counted per key.
//!
//! Rules:
//! - Pure: the caller passes the clock (`now`), so every rule is tested without waiting.
//! - A key runs again at once after a failure only when something changed while it ran
//!   (dirty); otherwise it waits out its delay, so failures never spin.
//! - A key that succeeds and was not touched meanwhile is forgotten, with its failure
//!   count: memory is bounded by the keys that are waiting or running.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

/// How a run of a key ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Done; the failure count resets.
    Done,
    /// Run it again after this delay; the failure count grows by one.
    Retry(Duration),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Item {
    /// When it is due; `None` while running (and not yet rescheduled).
    due: Option<Instant>,
    running: bool,
    dirty: bool,
    failures: u32,
}

/// The queue; see the module rules.
#[derive(Debug, Clone, Default)]
pub(crate) struct WorkQueue<K: Ord + Clone> {
    items: BTreeMap<K, Item>,
}

impl<K: Ord + Clone> WorkQueue<K> {
    /// An empty queue.
    pub(crate) fn new() -> Self {
        Self { items: BTreeMap::new() }
    }

    /// The key changed: run it now, or once more after its current run.
    pub(crate) fn add(&mut self, key: K, now: Instant) {
        let item = self.items.entry(key).or_default();
        if item.running {
            item.dirty = true;
        } else {
            item.due = Some(item.due.map_or(now, |d| d.min(now)));
        }
    }

    /// The next due key (earliest first), marked running, with its failure count so far.
    pub(crate) fn pop(&mut self, now: Instant) -> Option<(K, u32)> {
        let (key, _) = self
            .items
            .iter()
            .filter(|(_, i)| !i.running)
            .filter_map(|(k, i)| i.due.filter(|d| *d <= now).map(|d| (k, d)))
            .min_by_key(|(_, d)| *d)?;
        let key = key.clone();
        let item = self.items.get_mut(&key)?;
        item.running = true;
        item.dirty = false;
        item.due = None;
        Some((key, item.failures))
    }

    /// A run of `key` ended.
    pub(crate) fn finish(&mut self, key: &K, outcome: Outcome, now: Instant) {
        let Some(item) = self.items.get_mut(key) else { return };
        item.running = false;
        match outcome {
            Outcome::Done => {
                item.failures = 0;
                if item.dirty {
                    item.due = Some(now);
                } else {
                    self.items.remove(key);
                    return;
                }
            }
            Outcome::Retry(after) => {
                item.failures = item.failures.saturating_add(1);
                item.due = Some(if item.dirty { now } else { now + after });
            }
        }
        item.dirty = false;
    }

    /// The key's object is gone: drop it unless it is running (its run finishes and
    /// finds nothing to do).
    pub(crate) fn forget(&mut self, key: &K) {
        if self.items.get(key).is_some_and(|i| !i.running) {
            self.items.remove(key);
        }
    }

    /// When the earliest waiting key is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.items.values().filter(|i| !i.running).filter_map(|i| i.due).min()
    }

    /// Keys waiting (due now or later).
    pub(crate) fn waiting(&self) -> usize {
        self.items.values().filter(|i| !i.running && i.due.is_some()).count()
    }

    /// Keys being worked on.
    pub(crate) fn running(&self) -> usize {
        self.items.values().filter(|i| i.running).count()
    }

    #[cfg(test)]
    /// Failures of `key` so far (0 for an unknown key).
    pub(crate) fn failures(&self, key: &K) -> u32 {
        self.items.get(key).map_or(0, |i| i.failures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn adding_a_waiting_key_twice_runs_it_once() {
        let t = Instant::now();
        let mut q = WorkQueue::new();
        q.add("a", t);
        q.add("a", t + S(1));
        assert_eq!(q.waiting(), 1);
        assert_eq!(q.pop(t + S(1)), Some(("a", 0)));
        assert_eq!(q.pop(t + S(1)), None, "one key is never handed out twice");
        q.finish(&"a", Outcome::Done, t + S(2));
        assert_eq!(q.pop(t + S(100)), None);
        assert_eq!(q.waiting() + q.running(), 0, "a finished key is forgotten");
    }

    #[test]
    fn a_change_during_a_run_runs_the_key_once_more_right_after() {
        let t = Instant::now();
        let mut q = WorkQueue::new();
        q.add("a", t);
        assert_eq!(q.pop(t), Some(("a", 0)));
        q.add("a", t);
        q.add("a", t);
        assert_eq!(q.pop(t), None, "not while it runs");
        q.finish(&"a", Outcome::Done, t + S(1));
        assert_eq!(q.pop(t + S(1)), Some(("a", 0)), "once more, at once");
        q.finish(&"a", Outcome::Done, t + S(2));
        assert_eq!(q.pop(t + S(2)), None, "and only once");
    }

    #[test]
    fn a_failure_waits_its_delay_and_counts() {
        let t = Instant::now();
        let mut q = WorkQueue::new();
        q.add("a", t);
        q.pop(t);
        q.finish(&"a", Outcome::Retry(S(4)), t);
        assert_eq!(q.next_due(), Some(t + S(4)));
        assert_eq!(q.pop(t + S(3)), None);
        assert_eq!(q.pop(t + S(4)), Some(("a", 1)));
        q.finish(&"a", Outcome::Retry(S(8)), t + S(4));
        assert_eq!(q.pop(t + S(12)), Some(("a", 2)));
        q.finish(&"a", Outcome::Done, t + S(12));
        q.add("a", t + S(13));
        assert_eq!(q.pop(t + S(13)), Some(("a", 0)), "success resets the count");
    }

    #[test]
    fn a_failure_with_a_change_meanwhile_runs_again_at_once() {
        let t = Instant::now();
        let mut q = WorkQueue::new();
        q.add("a", t);
        q.pop(t);
        q.add("a", t);
        q.finish(&"a", Outcome::Retry(S(60)), t + S(1));
        assert_eq!(q.pop(t + S(1)), Some(("a", 1)));
    }

    #[test]
    fn an_add_while_waiting_out_a_delay_brings_the_key_forward() {
        let t = Instant::now();
        let mut q = WorkQueue::new();
        q.add("a", t);
        q.pop(t);
        q.finish(&"a", Outcome::Retry(S(60)), t);
        q.add("a", t + S(5));
        assert_eq!(q.pop(t + S(5)), Some(("a", 1)));
    }

    #[test]
    fn keys_are_independent_and_come_out_earliest_first() {
        let t = Instant::now();
        let mut q = WorkQueue::new();
        q.add("b", t + S(2));
        q.add("a", t + S(3));
        q.add("c", t + S(1));
        assert_eq!(q.pop(t + S(5)).map(|p| p.0), Some("c"));
        assert_eq!(q.pop(t + S(5)).map(|p| p.0), Some("b"));
        assert_eq!(q.running(), 2);
        assert_eq!(q.waiting(), 1);
        assert_eq!(q.pop(t + S(5)).map(|p| p.0), Some("a"));
        q.finish(&"b", Outcome::Retry(S(10)), t + S(5));
        assert_eq!(q.failures(&"b"), 1);
        assert_eq!(q.failures(&"c"), 0);
    }

    #[test]
    fn forget_drops_a_waiting_key_but_not_a_running_one() {
        let t = Instant::now();
        let mut q = WorkQueue::new();
        q.add("a", t);
        q.add("b", t);
        q.forget(&"a");
        assert_eq!(q.pop(t), Some(("b", 0)));
        q.forget(&"b");
        assert_eq!(q.running(), 1, "a running key stays until its run ends");
        q.finish(&"b", Outcome::Done, t);
        assert_eq!(q.running() + q.waiting(), 0);
        q.finish(&"zzz", Outcome::Done, t);
    }
}
