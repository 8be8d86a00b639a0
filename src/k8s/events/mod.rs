//! Kubernetes Events about volume conditions: when a volume turns abnormal or back to
//! normal, an Event is recorded on its PersistentVolumeClaim and on the pods of this node
//! that use the claim, so `kubectl describe pvc` and `kubectl describe pod` show it.
//!
//! Rules:
//! - Who hears about a volume: the PV whose `spec.csi.driver` is our driver and whose
//!   `spec.csi.volumeHandle` is the volume id leads to its claim (`spec.claimRef`); a PV
//!   without a claimRef, or Released (its claim was deleted), has no one to tell. The pods
//!   are those in the claim's namespace, scheduled to this node (`spec.nodeName`), not
//!   finished (phase neither Succeeded nor Failed), with a volume naming the claim.
//!   Decided by the pure [`find_claim`] / [`claim_of`] and [`pods_using`] ([`targets`]).
//! - What is said: a Warning `VolumeConditionAbnormal` or a Normal `VolumeConditionNormal`,
//!   action `HealthCheck`, reported by controller `drivelet` from this node's instance, the
//!   note being the condition's message cut to the Events API's 1 KiB limit at a character
//!   boundary. Events on a pod name the claim as their related object, so a pod with two
//!   claims tells which one ([`condition_event`]).
//! - How often, decided by the pure [`EventGate`]: per volume at most one report per
//!   `min_interval`. The first change of a quiet volume is reported at once; changes inside
//!   the window are coalesced, and when the window ends the latest state is reported unless
//!   it equals the one reported last (a flap and back says nothing). A state is the pair
//!   (abnormal, typed reasons), so a volume that stays abnormal for a new reason is
//!   reported again ([`gate`]). A volume whose window ended with nothing pending is
//!   forgotten.
//! - Best effort: the lookups are retried once, and so is each Event that failed; then
//!   the failure is logged and dropped. Reports of one volume run one at a time (in
//!   order), at most [`MAX_CONCURRENT_REPORTS`] volumes at once; a queued report is
//!   replaced by a newer one of the same volume ([`ReportQueue`]); the lookups and Events
//!   are the [`reporter`]'s.
//! - Clocks are read by the actor only; the gate and the queue take the time as an
//!   argument and are table-tested, the reporter is tested against a scripted fake API
//!   server.
//! - Not a controller of the shell (`crate::k8s::shell`): nothing is watched, the input
//!   is the volume manager's notifications, and a report is best effort (gated, retried
//!   once, then dropped), not a key reconciled until it succeeds; so the actor keeps its
//!   own gate and queue instead of the shell's work queue and retry policy.
//!
//! This file holds the actor, [`ConditionEvents`]; each concern it runs has its file.
//! The Events of a volume moved off an evacuated drive are [`moved`]'s; those of a clone
//! of a volume in use (frozen, crash-inconsistent, or waiting) are [`clones`]'s.

use std::time::Duration;

use actix::prelude::*;
use tokio::time::Instant;
use tracing::{debug, warn};

/// Events on the claim of a clone of a volume in use.
pub(crate) mod clones;
/// What a condition Event says.
pub(crate) mod condition_event;
/// The per-volume rate limiter.
pub(crate) mod gate;
/// Events on a moved volume's claim and PV, saying where its data went.
pub(crate) mod moved;
/// Reports waiting to run.
pub(crate) mod report_queue;
/// Records the Events against the API server.
pub(crate) mod reporter;
/// Who hears about a volume: its claim and the pods using it.
pub(crate) mod targets;

#[cfg(test)]
mod fake_api_tests;
#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod tests;

pub(crate) use self::gate::EventGate;
pub(crate) use self::report_queue::{ReportQueue, MAX_CONCURRENT_REPORTS};
pub(crate) use self::reporter::ConditionReporter;
pub(crate) use crate::actors::volumes::VolumeConditionChanged;

/// The actor that turns volume condition changes into rate-limited Events: a thin shell
/// over [`EventGate`], [`ReportQueue`] and [`ConditionReporter`].
pub(crate) struct ConditionEvents {
    reporter: ConditionReporter,
    gate: EventGate,
    queue: ReportQueue,
    wake: Option<SpawnHandle>,
}

impl ConditionEvents {
    /// An actor reporting through `reporter`, at most once per volume per `min_interval`.
    pub(crate) fn new(reporter: ConditionReporter, min_interval: Duration) -> Self {
        Self { reporter, gate: EventGate::new(min_interval), queue: ReportQueue::new(MAX_CONCURRENT_REPORTS), wake: None }
    }

    /// Wake up when the gate next has something to do (one timer at a time).
    fn schedule(&mut self, ctx: &mut Context<Self>) {
        if let Some(handle) = self.wake.take() {
            ctx.cancel_future(handle);
        }
        if let Some(at) = self.gate.next_wake() {
            let after = at.saturating_duration_since(Instant::now());
            self.wake = Some(ctx.run_later(after, |act, ctx| {
                act.wake = None;
                for change in act.gate.due(Instant::now()) {
                    act.queue.push(change);
                }
                act.schedule(ctx);
                act.pump(ctx);
            }));
        }
    }

    /// Start the queued reports that may run now.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        while let Some(change) = self.queue.start() {
            let reporter = self.reporter.clone();
            let work = async move {
                let reported = reporter.report(&change).await;
                (change, reported)
            };
            ctx.spawn(work.into_actor(self).map(|(change, reported), act, ctx| {
                for e in &reported.errors {
                    warn!(actor = "condition-events", volume.id = %change.volume_id, volume.abnormal = change.abnormal, error = %e, "could not record a volume condition Event");
                }
                debug!(actor = "condition-events", volume.id = %change.volume_id, volume.abnormal = change.abnormal, events = reported.recorded, "volume condition reported");
                act.queue.finish(&change.volume_id);
                act.pump(ctx);
            }));
        }
    }
}

impl Actor for ConditionEvents {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // After a restart: pick up what the gate and the queue still hold.
        self.schedule(ctx);
        self.pump(ctx);
    }
}

impl Supervised for ConditionEvents {
    fn restarting(&mut self, _: &mut Context<Self>) {
        // The timer and the running reports were dropped with the old context; the
        // rate-limit windows and the queued reports are still right.
        self.wake = None;
        let dropped = self.queue.clear_running();
        warn!(actor = "condition-events", reports.dropped = dropped, "restarting the condition Event reporter");
    }
}

impl Handler<VolumeConditionChanged> for ConditionEvents {
    type Result = ();

    fn handle(&mut self, change: VolumeConditionChanged, ctx: &mut Context<Self>) {
        let volume_id = change.volume_id.clone();
        match self.gate.offer(change, Instant::now()) {
            Some(now) => {
                self.queue.push(now);
                self.pump(ctx);
            }
            None => debug!(actor = "condition-events", volume.id = %volume_id, "volume condition change held by the rate limit"),
        }
        self.schedule(ctx);
    }
}
