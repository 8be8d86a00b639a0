//! The volume book's guards: which volumes a call holds, which a step needs unused, and
//! which the health poller is checking; one instance, owned by the book and shared with
//! the poller, so what may run beside what is decided in one place.
//!
//! Rules:
//! - one call per volume at a time: [`Guards::try_claim`] hands out a [`Claim`], released
//!   when it is dropped, on every path a call takes; a claim of a claimed volume is
//!   refused (the book answers `Aborted`);
//! - a check of a volume runs only under [`Guards::try_check`], which refuses (the check
//!   is skipped this cycle, never waited for) while the volume is claimed or a step of it
//!   is under way: a check holds the volume for a moment (`xfs_repair -n` opens the
//!   partition exclusively, a read of the staging directory holds it open), and a wipe
//!   (`O_EXCL`) or an unmount landing in that moment failed with "busy";
//! - a step that needs the volume unused (stage, unstage, delete) runs under
//!   [`Guards::step`], which bars new checks, then waits for a running one to end, at most
//!   [`WAIT`] (a check that hangs on a dead drive is bounded by its own timeout; past
//!   `WAIT` the step goes ahead and may find the volume busy);
//! - after a restart of the volume manager the claims are cleared; a claim of before,
//!   dropped late, does not release a newer claim of the same volume.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How long a step waits for a running check of its volume.
pub(crate) const WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
struct State {
    /// Volumes claimed by a call, each with the token of its claim.
    ids: HashMap<String, u64>,
    /// The last token handed out.
    next: u64,
    /// Volumes being checked (how many checks of each).
    checking: HashMap<String, usize>,
    /// Volumes with a step under way that needs them unused (how many).
    steps: HashMap<String, usize>,
}

/// The guards of the volume book (see the module's rules).
#[derive(Debug, Default)]
pub struct Guards {
    state: Mutex<State>,
    changed: Condvar,
}

fn dec(map: &mut HashMap<String, usize>, id: &str) {
    if let Some(n) = map.get_mut(id) {
        *n -= 1;
        if *n == 0 {
            map.remove(id);
        }
    }
}

impl Guards {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Claims volume `id` for one call; `None` while another call holds it.
    pub(crate) fn try_claim(self: &std::sync::Arc<Self>, id: &str) -> Option<Claim> {
        let mut s = self.state();
        if s.ids.contains_key(id) {
            return None;
        }
        s.next += 1;
        let token = s.next;
        s.ids.insert(id.to_string(), token);
        Some(Claim { guards: self.clone(), id: id.to_string(), token })
    }

    /// Whether a call holds volume `id`.
    pub(crate) fn is_claimed(&self, id: &str) -> bool {
        self.state().ids.contains_key(id)
    }

    /// Forgets every claim (a restart: the calls that held them are answered already).
    pub(crate) fn clear_claims(&self) {
        self.state().ids.clear();
    }

    /// Starts a check of volume `id`; `None` while it is claimed or a step of it is under
    /// way.
    pub(crate) fn try_check(self: &std::sync::Arc<Self>, id: &str) -> Option<Check> {
        let mut s = self.state();
        if s.ids.contains_key(id) || s.steps.contains_key(id) {
            return None;
        }
        *s.checking.entry(id.to_string()).or_default() += 1;
        Some(Check { guards: self.clone(), id: id.to_string() })
    }

    /// Bars new checks of volume `id` and waits (at most [`WAIT`]) for a running one.
    pub(crate) fn step(self: &std::sync::Arc<Self>, id: &str) -> Step {
        let mut s = self.state();
        *s.steps.entry(id.to_string()).or_default() += 1;
        let t0 = Instant::now();
        while s.checking.contains_key(id) {
            let Some(left) = WAIT.checked_sub(t0.elapsed()) else {
                tracing::warn!(volume.id = %id, waited_s = WAIT.as_secs(), "a health check of the volume is still running; going ahead");
                break;
            };
            s = self.changed.wait_timeout(s, left).unwrap_or_else(PoisonError::into_inner).0;
        }
        Step { guards: self.clone(), id: id.to_string() }
    }
}

/// A volume claimed by one call; the volume is free again when this is dropped.
#[derive(Debug)]
#[must_use = "the volume is released when the claim is dropped"]
pub(crate) struct Claim {
    guards: std::sync::Arc<Guards>,
    id: String,
    token: u64,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut s = self.guards.state();
        // After a restart cleared the set, a newer claim of the id is not this one's.
        if s.ids.get(&self.id) == Some(&self.token) {
            s.ids.remove(&self.id);
        }
    }
}

/// A health check of one volume under way; ends when dropped.
#[derive(Debug)]
pub(crate) struct Check {
    guards: std::sync::Arc<Guards>,
    id: String,
}

impl Drop for Check {
    fn drop(&mut self) {
        dec(&mut self.guards.state().checking, &self.id);
        self.guards.changed.notify_all();
    }
}

/// A step of one volume that needs it unused; checks wait until dropped.
#[derive(Debug)]
pub(crate) struct Step {
    guards: std::sync::Arc<Guards>,
    id: String,
}

impl Drop for Step {
    fn drop(&mut self) {
        dec(&mut self.guards.state().steps, &self.id);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_step_bars_checks_and_waits_for_a_running_one() {
        let g = Arc::new(Guards::default());
        let c = g.try_check("v1").expect("no step under way");
        let t = std::thread::spawn({
            let g = g.clone();
            move || g.step("v1")
        });
        // The waiting step bars new checks as soon as it is registered.
        let t0 = Instant::now();
        while let Some(extra) = g.try_check("v1") {
            drop(extra);
            assert!(t0.elapsed() < Duration::from_secs(10), "the step never registered");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(g.try_check("v2").is_some(), "other volumes are checked");
        assert!(!t.is_finished(), "the step waits while the check runs");
        drop(c);
        let s = t.join().unwrap();
        assert!(g.try_check("v1").is_none(), "the step under way bars checks");
        drop(s);
        assert!(g.try_check("v1").is_some(), "checks resume after the step");
    }

    #[test]
    fn a_claim_bars_a_second_claim_and_checks_until_it_is_dropped() {
        let g = Arc::new(Guards::default());
        let claim = g.try_claim("v1").expect("free");
        assert!(g.try_claim("v1").is_none(), "one call per volume");
        assert!(g.is_claimed("v1"));
        assert!(g.try_check("v1").is_none(), "a claimed volume is not checked");
        assert!(g.try_claim("v2").is_some(), "other volumes are claimed");
        drop(claim);
        assert!(!g.is_claimed("v1"));
        assert!(g.try_check("v1").is_some(), "checked again once free");
    }

    #[test]
    fn a_claim_from_before_a_restart_does_not_release_a_newer_one() {
        let g = Arc::new(Guards::default());
        let old = g.try_claim("v1").expect("free");
        g.clear_claims();
        let new = g.try_claim("v1").expect("free after the restart");
        drop(old);
        assert!(g.is_claimed("v1"), "the old claim's drop leaves the new one");
        drop(new);
        assert!(!g.is_claimed("v1"));
    }
}
