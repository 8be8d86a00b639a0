//! The Event gate: a per-volume rate limiter of condition reports. Pure: the caller
//! passes the time in and wakes up at [`EventGate::next_wake`] to call
//! [`EventGate::due`].
//!
//! Rules:
//! - Per volume at most one report per `min_interval` (at most [`MAX_INTERVAL`]). The
//!   first change of a quiet volume is reported at once; changes inside the window are
//!   coalesced, and when the window ends the latest state is reported unless it equals
//!   the one reported last (a flap and back says nothing).
//! - A state is the pair (abnormal, the typed reasons of the findings): a volume that
//!   stays abnormal for another reason is reported again; a new wording of the same
//!   reasons is not a new state. Message text is never compared.
//! - A volume whose window ended with nothing pending is forgotten, so memory is
//!   bounded by the volumes reported on within one window.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::VolumeConditionChanged;

/// The longest rate-limit window the gate keeps (longer intervals are cut to this).
pub(crate) const MAX_INTERVAL: Duration = Duration::from_secs(365 * 24 * 3600);

/// Whether two changes of a volume say the same: abnormal or not, for the same reasons.
fn same_state(a: &VolumeConditionChanged, b: &VolumeConditionChanged) -> bool {
    a.abnormal == b.abnormal && a.reasons == b.reasons
}

/// One volume's rate-limit window.
#[derive(Debug, Clone)]
struct Window {
    /// When the window ends (one `min_interval` after the last report).
    until: Instant,
    /// The state reported last.
    reported: VolumeConditionChanged,
    /// The latest state seen inside the window, when it differs from `reported`.
    pending: Option<VolumeConditionChanged>,
}

/// Per-volume rate limiter of condition reports (see the module rules). Pure: the caller
/// passes the time in and wakes up at [`EventGate::next_wake`] to call [`EventGate::due`].
#[derive(Debug, Clone)]
pub(crate) struct EventGate {
    min_interval: Duration,
    windows: HashMap<String, Window>,
}

impl EventGate {
    /// A gate letting through one report per volume per `min_interval` (at most
    /// [`MAX_INTERVAL`]).
    pub(crate) fn new(min_interval: Duration) -> Self {
        Self { min_interval: min_interval.min(MAX_INTERVAL), windows: HashMap::new() }
    }

    fn window_from(&self, now: Instant) -> Instant {
        now.checked_add(self.min_interval).unwrap_or(now)
    }

    /// A change seen at `now`: returns it when it is to be reported at once, `None` when
    /// it is held until the volume's window ends (or dropped because it equals what was
    /// reported last).
    pub(crate) fn offer(&mut self, change: VolumeConditionChanged, now: Instant) -> Option<VolumeConditionChanged> {
        let until = self.window_from(now);
        match self.windows.get_mut(&change.volume_id) {
            Some(w) if now < w.until => {
                w.pending = (!same_state(&w.reported, &change)).then_some(change);
                None
            }
            Some(w) => {
                w.pending = None;
                if same_state(&w.reported, &change) {
                    return None;
                }
                w.until = until;
                w.reported = change.clone();
                Some(change)
            }
            None => {
                let window = Window { until, reported: change.clone(), pending: None };
                self.windows.insert(change.volume_id.clone(), window);
                Some(change)
            }
        }
    }

    /// The reports whose window has ended by `now` (sorted by volume id); each opens a new
    /// window. Volumes whose window ended with nothing pending are forgotten.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<VolumeConditionChanged> {
        let next_until = self.window_from(now);
        let mut out = Vec::new();
        self.windows.retain(|_, w| {
            if now < w.until {
                return true;
            }
            match w.pending.take() {
                Some(change) => {
                    w.until = next_until;
                    w.reported = change.clone();
                    out.push(change);
                    true
                }
                None => false,
            }
        });
        out.sort_by(|a, b| a.volume_id.cmp(&b.volume_id));
        out
    }

    /// When [`EventGate::due`] next has something to do: the earliest window end, whether
    /// a report is pending there or the volume is only to be forgotten. `None`: nothing
    /// tracked.
    pub(crate) fn next_wake(&self) -> Option<Instant> {
        self.windows.values().map(|w| w.until).min()
    }

    #[cfg(test)]
    /// How many volumes the gate remembers.
    pub(crate) fn tracked(&self) -> usize {
        self.windows.len()
    }
}
