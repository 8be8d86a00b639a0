//! Per-step timings of the disk work behind a volume operation, for the
//! `disk_steps` benchmark and for debugging: every timed step logs its name and
//! duration at debug level (`drivelet::disk::timing`), and a thread that turned
//! recording on ([`record`]) also collects them, to be read back with [`take`].
//!
//! Rules: a step is timed by holding the guard [`step`] returns; timing never changes
//! what a step does; recording is per thread (the blocking steps of one operation run
//! on one thread), off unless asked for.

use std::cell::RefCell;
use std::time::{Duration, Instant};

thread_local! {
    static RECORDED: RefCell<Option<Vec<(&'static str, Duration)>>> = const { RefCell::new(None) };
}

/// Starts (or restarts) collecting this thread's step timings.
pub fn record() {
    RECORDED.with(|r| *r.borrow_mut() = Some(Vec::new()));
}

/// The step timings this thread collected since [`record`], in order; collecting goes on.
pub fn take() -> Vec<(&'static str, Duration)> {
    RECORDED.with(|r| r.borrow_mut().as_mut().map(std::mem::take).unwrap_or_default())
}

/// Times one step until dropped.
pub struct Step {
    name: &'static str,
    t0: Instant,
}

/// Starts timing the step `name`.
pub fn step(name: &'static str) -> Step {
    Step { name, t0: Instant::now() }
}

impl Drop for Step {
    fn drop(&mut self) {
        let d = self.t0.elapsed();
        tracing::debug!(step = self.name, micros = d.as_micros() as u64, "disk step");
        RECORDED.with(|r| {
            if let Some(v) = r.borrow_mut().as_mut() {
                v.push((self.name, d));
            }
        });
    }
}
