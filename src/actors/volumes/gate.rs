//! Keeps the health poller's checks of a volume apart from the steps that need the
//! volume unused.
//!
//! Why: a check holds the volume for a moment: `xfs_repair -n` opens the partition
//! exclusively, a read of the staging directory holds it open. A DeleteVolume wipe
//! (`O_EXCL`) or a NodeUnstageVolume unmount that lands in that moment failed with
//! "busy", and the caller saw INTERNAL for a volume nobody used.
//!
//! Rules:
//! - a check runs only under [`try_check`], which refuses (the check is skipped this
//!   cycle, never waited for) while a step of the volume is under way;
//! - a step that needs the volume unused (stage, unstage, delete) runs under
//!   [`exclusive`], which first bars new checks, then waits for a running one to end,
//!   at most [`WAIT`] (a check that hangs on a dead drive is bounded by its own
//!   timeout; past `WAIT` the step goes ahead and may find the volume busy, as before);
//! - keyed by volume id, held in this process only: checks and steps run in this
//!   process alone.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long a step waits for a running check of its volume.
pub(crate) const WAIT: Duration = Duration::from_secs(30);

#[derive(Default)]
struct State {
    /// Volumes being checked.
    checking: HashMap<String, usize>,
    /// Volumes with a step under way (or waiting to start).
    steps: HashMap<String, usize>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);
static CHANGED: Condvar = Condvar::new();

fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let mut g = STATE.lock().unwrap_or_else(PoisonError::into_inner);
    f(g.get_or_insert_with(State::default))
}

fn dec(map: &mut HashMap<String, usize>, id: &str) {
    if let Some(n) = map.get_mut(id) {
        *n -= 1;
        if *n == 0 {
            map.remove(id);
        }
    }
}

/// A health check of one volume under way; ends when dropped.
#[derive(Debug)]
pub(crate) struct Check(String);

/// Starts a check of volume `id`; `None` while a step of it is under way.
pub(crate) fn try_check(id: &str) -> Option<Check> {
    with(|s| {
        if s.steps.contains_key(id) {
            return None;
        }
        *s.checking.entry(id.to_string()).or_default() += 1;
        Some(Check(id.to_string()))
    })
}

impl Drop for Check {
    fn drop(&mut self) {
        with(|s| dec(&mut s.checking, &self.0));
        CHANGED.notify_all();
    }
}

/// A step of one volume that needs it unused; checks wait until dropped.
#[derive(Debug)]
pub(crate) struct Step(String);

/// Bars new checks of volume `id` and waits (at most [`WAIT`]) for a running one.
pub(crate) fn exclusive(id: &str) -> Step {
    with(|s| *s.steps.entry(id.to_string()).or_default() += 1);
    let t0 = Instant::now();
    let mut g = STATE.lock().unwrap_or_else(PoisonError::into_inner);
    while g.get_or_insert_with(State::default).checking.contains_key(id) {
        let Some(left) = WAIT.checked_sub(t0.elapsed()) else {
            tracing::warn!(volume.id = %id, waited_s = WAIT.as_secs(), "a health check of the volume is still running; going ahead");
            break;
        };
        g = CHANGED.wait_timeout(g, left).unwrap_or_else(PoisonError::into_inner).0;
    }
    Step(id.to_string())
}

impl Drop for Step {
    fn drop(&mut self) {
        with(|s| dec(&mut s.steps, &self.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_bars_checks_and_waits_for_a_running_one() {
        let c = try_check("v1").expect("no step under way");
        let t = std::thread::spawn(move || exclusive("v1"));
        // The waiting step bars new checks as soon as it is registered.
        let t0 = Instant::now();
        while let Some(extra) = try_check("v1") {
            drop(extra);
            assert!(t0.elapsed() < Duration::from_secs(10), "the step never registered");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(try_check("v2").is_some(), "other volumes are checked");
        assert!(!t.is_finished(), "the step waits while the check runs");
        drop(c);
        let s = t.join().unwrap();
        assert!(try_check("v1").is_none(), "the step under way bars checks");
        drop(s);
        assert!(try_check("v1").is_some(), "checks resume after the step");
    }
}
