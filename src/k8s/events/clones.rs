//! Events about clones of volumes in use: the volume manager's [`CloneNotice`] becomes an
//! Event on the clone's claim, so `kubectl describe pvc` says how its copy was made, or
//! why it waits.
//!
//! Rules:
//! - Who hears: the clone's claim, named by CreateVolume's metadata (the
//!   `csi.storage.k8s.io/pvc/*` parameters the provisioner passes); it is looked up for its uid. A claim that is gone hears
//!   nothing.
//! - What is said ([`clone_event`]): a Normal `ClonedInUse` when the source's filesystem
//!   was frozen for the copy (how long its writers paused); a Warning
//!   `CloneCrashInconsistent` when a block volume was copied while written (its class
//!   allows it); a Warning `CloneSourceInUse` when the clone is not made now, saying why
//!   and what to do (the refusal's own words). Notes are cut to the Events API's 1 KiB.
//! - Once, not every retry ([`Told`]): the provisioner retries a refused clone with its
//!   backoff, and each retry is refused alike; the claim hears a refusal once per kind
//!   (refused by the class, a block volume, an encrypted one, a freeze too long), again
//!   only when the kind changes or an hour has passed. A clone made forgets its claim.
//! - Best effort, like the other Events: the lookup and each Event are retried once
//!   after [`super::reporter::RETRY_AFTER`], then the failure is logged and dropped.
//! - An actor fed by the volume manager's notifications, not a controller of the shell
//!   (`crate::k8s::shell`): nothing is watched, a report is best effort.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix::prelude::*;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::Api;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource};
use tracing::{debug, info, warn};

use super::condition_event::truncate_note;
use super::reporter::RETRY_AFTER;
use crate::actors::volumes::{CloneNotice, CloneOutcome};
use crate::k8s::identity::Identity;

/// Reason of the Event on a clone copied under a freeze of its source.
pub(crate) const REASON_FROZEN: &str = "ClonedInUse";
/// Reason of the Warning on a block clone copied while written.
pub(crate) const REASON_INCONSISTENT: &str = "CloneCrashInconsistent";
/// Reason of the Warning on a clone not made now because its source is in use.
pub(crate) const REASON_REFUSED: &str = "CloneSourceInUse";
/// Action of all three.
pub(crate) const ACTION: &str = "Clone";

/// How long a refusal told stays told.
const TOLD_FOR: Duration = Duration::from_secs(3600);
/// The most claims remembered as told.
const TOLD_MAX: usize = 4096;

/// What is said of `n` (see the module rules).
pub(crate) fn clone_event(n: &CloneNotice) -> Event {
    let (type_, reason, note) = match &n.what {
        CloneOutcome::Frozen { millis } => (
            EventType::Normal,
            REASON_FROZEN,
            format!(
                "volume {} was cloned from volume {} while a pod wrote to it: the source's filesystem was frozen for {:.1} s \
                 (its writers paused meanwhile), so the copy is consistent, as after a clean unmount",
                n.name,
                n.source_id,
                *millis as f64 / 1000.0
            ),
        ),
        CloneOutcome::CrashInconsistent => (
            EventType::Warning,
            REASON_INCONSISTENT,
            format!(
                "volume {} was cloned from block volume {} while a pod wrote to it, as its StorageClass allows \
                 (drivelet.io/clone-in-use-block: crash-inconsistent): the copy may hold blocks of different moments, so \
                 check it with the application's own tools before trusting it; its PV says drivelet.io/clone-consistency: crash-inconsistent",
                n.name, n.source_id
            ),
        ),
        CloneOutcome::Refused { reason, .. } => (EventType::Warning, REASON_REFUSED, format!("volume {} is not made yet: {reason}", n.name)),
    };
    Event { type_, reason: reason.into(), note: Some(truncate_note(&note).to_string()), action: ACTION.into(), secondary: None }
}

/// The refusals told, by claim: a refusal is told once per kind (see the module rules).
#[derive(Default)]
pub(crate) struct Told(HashMap<(String, String), (&'static str, Instant)>);

impl Told {
    /// Whether `n` is to be told at `now`; remembers it.
    pub(crate) fn tell(&mut self, n: &CloneNotice, now: Instant) -> bool {
        let key = (n.claim.claim_namespace.clone(), n.claim.claim_name.clone());
        self.0.retain(|_, (_, at)| now.saturating_duration_since(*at) < TOLD_FOR);
        let CloneOutcome::Refused { kind, .. } = &n.what else {
            self.0.remove(&key);
            return true;
        };
        if self.0.get(&key).is_some_and(|(k, _)| k == kind) {
            return false;
        }
        if self.0.len() >= TOLD_MAX {
            // Full of claims refused within the hour: the oldest is forgotten.
            if let Some(oldest) = self.0.iter().min_by_key(|(_, (_, at))| *at).map(|(k, _)| k.clone()) {
                self.0.remove(&oldest);
            }
        }
        self.0.insert(key, (kind, now));
        true
    }
}

/// The actor recording the Event of each [`CloneNotice`] (subscribe it with
/// `SubscribeClones`).
pub(crate) struct CloneEvents {
    client: Client,
    identity: Identity,
    told: Told,
}

impl CloneEvents {
    /// Records Events for our driver on this node (`identity`).
    pub(crate) fn new(client: Client, identity: Identity) -> Self {
        Self { client, identity, told: Told::default() }
    }
}

impl Actor for CloneEvents {
    type Context = Context<Self>;
}

impl Supervised for CloneEvents {}

/// Records the Event of `n` on its claim; answers what failed, after one retry.
async fn report(client: Client, identity: Identity, n: CloneNotice) -> Option<String> {
    let (ns, name) = (n.claim.claim_namespace.clone(), n.claim.claim_name.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let claim = match claims.get_opt(&name).await {
        Ok(c) => c,
        Err(first) => {
            debug!(claim = %format!("{ns}/{name}"), error = %first, "looking up a clone's claim failed; retrying once");
            tokio::time::sleep(RETRY_AFTER).await;
            match claims.get_opt(&name).await {
                Ok(c) => c,
                Err(e) => return Some(format!("getting claim {ns}/{name}: {e}")),
            }
        }
    };
    let Some(claim) = claim else {
        debug!(claim = %format!("{ns}/{name}"), "the clone's claim is gone: no Event");
        return None;
    };
    let obj = claim.object_ref(&());
    let ev = clone_event(&n);
    let recorder = Recorder::new(client, identity.reporter());
    let mut res = recorder.publish(&ev, &obj).await;
    if res.is_err() {
        tokio::time::sleep(RETRY_AFTER).await;
        res = recorder.publish(&ev, &obj).await;
    }
    match res {
        Ok(()) => {
            info!(claim = %format!("{ns}/{name}"), volume.source = %n.source_id, event.reason = %ev.reason, "told a clone's claim how its copy went");
            None
        }
        Err(e) => Some(format!("recording the {} Event on claim {ns}/{name}: {e}", ev.reason)),
    }
}

impl Handler<CloneNotice> for CloneEvents {
    type Result = ();
    fn handle(&mut self, n: CloneNotice, ctx: &mut Context<Self>) {
        if !self.told.tell(&n, Instant::now()) {
            return;
        }
        let claim = format!("{}/{}", n.claim.claim_namespace, n.claim.claim_name);
        ctx.spawn(report(self.client.clone(), self.identity.clone(), n).into_actor(self).map(move |failed, _, _| {
            if let Some(e) = failed {
                warn!(actor = "clone-events", claim = %claim, error = %e, "could not record a clone Event");
            }
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(what: CloneOutcome) -> CloneNotice {
        CloneNotice {
            claim: crate::words::Binding { claim_namespace: "db".into(), claim_name: "copy".into(), ..Default::default() },
            name: "pvc-9".into(),
            source_id: "vol-1".into(),
            what,
        }
    }

    fn refused(kind: &'static str) -> CloneNotice {
        notice(CloneOutcome::Refused { kind, reason: format!("cannot clone volume vol-1 now ({kind})") })
    }

    #[test]
    fn each_outcome_says_what_happened_in_words() {
        let e = clone_event(&notice(CloneOutcome::Frozen { millis: 1234 }));
        assert!(matches!(e.type_, EventType::Normal));
        assert_eq!((e.reason.as_str(), e.action.as_str()), (REASON_FROZEN, ACTION));
        assert_eq!(
            e.note.as_deref(),
            Some(
                "volume pvc-9 was cloned from volume vol-1 while a pod wrote to it: the source's filesystem was frozen for 1.2 s \
                 (its writers paused meanwhile), so the copy is consistent, as after a clean unmount"
            )
        );
        let e = clone_event(&notice(CloneOutcome::CrashInconsistent));
        assert!(matches!(e.type_, EventType::Warning));
        assert_eq!(e.reason, REASON_INCONSISTENT);
        assert!(e.note.unwrap().contains("drivelet.io/clone-consistency: crash-inconsistent"));
        let e = clone_event(&refused("block"));
        assert!(matches!(e.type_, EventType::Warning));
        assert_eq!(e.reason, REASON_REFUSED);
        assert_eq!(e.note.as_deref(), Some("volume pvc-9 is not made yet: cannot clone volume vol-1 now (block)"));
    }

    #[test]
    fn a_refusal_is_told_once_per_kind_until_an_hour_passes_or_the_clone_is_made() {
        let mut t = Told::default();
        let t0 = Instant::now();
        assert!(t.tell(&refused("block"), t0), "the first refusal");
        assert!(!t.tell(&refused("block"), t0 + Duration::from_secs(10)), "the provisioner's retry: not again");
        assert!(!t.tell(&refused("block"), t0 + Duration::from_secs(3000)), "still within the hour");
        assert!(t.tell(&refused("too-long"), t0 + Duration::from_secs(3001)), "another reason is told");
        assert!(t.tell(&refused("too-long"), t0 + Duration::from_secs(3001) + TOLD_FOR), "an hour later, again");
        assert!(t.tell(&notice(CloneOutcome::Frozen { millis: 5 }), t0 + Duration::from_secs(9000)), "a clone made is always told");
        assert!(t.tell(&refused("too-long"), t0 + Duration::from_secs(9001)), "and forgets the claim");
        let mut other = refused("too-long");
        other.claim.claim_name = "other".into();
        assert!(t.tell(&other, t0 + Duration::from_secs(9002)), "each claim on its own");
    }

    #[test]
    fn the_claims_remembered_are_bounded() {
        let mut t = Told::default();
        let t0 = Instant::now();
        for i in 0..TOLD_MAX + 10 {
            let mut n = refused("block");
            n.claim.claim_name = format!("c{i}");
            assert!(t.tell(&n, t0 + Duration::from_millis(i as u64)));
        }
        assert_eq!(t.0.len(), TOLD_MAX);
    }
}
