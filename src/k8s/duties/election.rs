//! The election of the agent that does the cluster duties: one `coordination.k8s.io/v1`
//! Lease ([`LEASE_NAME`]) in drivelet's namespace, its `holderIdentity` the holder's node
//! name.
//!
//! Rules, decided by the pure [`decide`] and [`release`]:
//! - No Lease: create it naming me.
//! - A Lease naming nobody (its holder gave it up on a clean shutdown): take it at once.
//! - A Lease naming me: renew it (every [`RENEW_EVERY`]).
//! - A Lease naming another: wait while it is live; take it once it has expired. It has
//!   expired when this agent has seen the very same record (same resourceVersion) for
//!   its whole `leaseDurationSeconds` ([`LEASE_DURATION`] when unset or nonsense): the
//!   clock is this agent's own, never the holder's `renewTime`, so clocks that disagree
//!   between nodes cannot make two leaders. A newly started agent therefore waits one
//!   lease duration before taking over from a holder that died.
//! - Every write is guarded by the resourceVersion read (an update) or fails if the Lease
//!   exists (a create): of two candidates at most one wins; the other sees a conflict and
//!   follows.
//! - An agent leads only while its last successful write is younger than
//!   [`RENEW_DEADLINE`] (shorter than the lease), so it stops before anybody else may
//!   start.
//! - On a clean shutdown the holder clears `holderIdentity` ([`release`]) so a peer takes
//!   over at its next look instead of after the lease expires.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;

/// The Lease's name.
pub(crate) const LEASE_NAME: &str = "drivelet-cluster-duties";

/// How long a Lease lives without being renewed.
pub(crate) const LEASE_DURATION: Duration = Duration::from_secs(15);

/// How often the candidate looks at the Lease (and the holder renews it).
pub(crate) const RENEW_EVERY: Duration = Duration::from_secs(5);

/// How long after its last successful write the holder still counts itself the leader.
pub(crate) const RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// What a candidate does after reading the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Election {
    /// There is no Lease: create one naming me.
    Create,
    /// The Lease is free or expired: take it (an update naming me, guarded by the
    /// resourceVersion read).
    Acquire,
    /// I hold the Lease: renew it.
    Renew,
    /// Another agent holds a live Lease: follow it.
    Wait {
        /// The holder.
        holder: String,
    },
}

/// The holder a Lease names, `None` when it names nobody.
pub(crate) fn holder(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()).filter(|h| !h.is_empty())
}

/// The Lease's duration, [`LEASE_DURATION`] when unset or not positive.
pub(crate) fn duration(lease: &Lease) -> Duration {
    match lease.spec.as_ref().and_then(|s| s.lease_duration_seconds) {
        Some(s) if s > 0 => Duration::from_secs(s as u64),
        _ => LEASE_DURATION,
    }
}

/// What to do about `lease` as read (`None`: it does not exist), for candidate `me`,
/// when this agent has seen the same record for `unchanged_for`.
pub(crate) fn decide(lease: Option<&Lease>, me: &str, unchanged_for: Duration) -> Election {
    let Some(lease) = lease else { return Election::Create };
    match holder(lease) {
        None => Election::Acquire,
        Some(h) if h == me => Election::Renew,
        Some(_) if unchanged_for >= duration(lease) => Election::Acquire,
        Some(h) => Election::Wait { holder: h.to_string() },
    }
}

/// The Lease to write for `decision` (none for `Wait`): `me` as holder, renewed `now`,
/// acquired `now` when taken (with one more transition when it changes hands), and the
/// read resourceVersion kept so the write is guarded.
pub(crate) fn desired(current: Option<&Lease>, decision: &Election, me: &str, now: Timestamp) -> Option<Lease> {
    let mut lease = current.cloned().unwrap_or_default();
    lease.metadata.name = Some(LEASE_NAME.to_string());
    let mut spec = lease.spec.take().unwrap_or_default();
    let taken = match decision {
        Election::Wait { .. } => return None,
        Election::Renew => false,
        Election::Create | Election::Acquire => true,
    };
    if taken {
        let changes_hands = current.and_then(holder).is_some_and(|h| h != me);
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_transitions = Some(match (current, changes_hands) {
            (None, _) => 0,
            (Some(_), true) => spec.lease_transitions.unwrap_or(0).saturating_add(1),
            (Some(_), false) => spec.lease_transitions.unwrap_or(0),
        });
    }
    spec.holder_identity = Some(me.to_string());
    spec.lease_duration_seconds = Some(LEASE_DURATION.as_secs() as i32);
    spec.renew_time = Some(MicroTime(now));
    lease.spec = Some(spec);
    lease.metadata.annotations.get_or_insert_with(Default::default).insert(RELAYS.to_string(), "true".to_string());
    Some(lease)
}

/// The annotation a holder that relays (labels objects with their nodes) writes on the
/// Lease. A Lease held without it is held by an agent of an earlier version, which does
/// not relay: while one holds it, during a rolling upgrade, every newer agent relays
/// itself (the same idempotent label writes), so no node's filtered watches miss a new
/// object until the old holder's pod is replaced.
pub(crate) const RELAYS: &str = "drivelet.io/relays";

/// Whether `lease` is held by an agent that does not relay (see [`RELAYS`]).
pub(crate) fn held_without_relay(lease: &Lease) -> bool {
    holder(lease).is_some() && lease.metadata.annotations.as_ref().and_then(|a| a.get(RELAYS)).is_none_or(|v| v != "true")
}

/// The Lease that gives it up on a clean shutdown: `holderIdentity` cleared, when `me`
/// holds `current`; `None` when it is not mine to give.
pub(crate) fn release(current: Option<&Lease>, me: &str) -> Option<Lease> {
    let current = current?;
    if holder(current) != Some(me) {
        return None;
    }
    let mut lease = current.clone();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = None;
    Some(lease)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_says_it_relays_and_a_lease_without_it_is_an_earlier_versions() {
        let lease = desired(None, &Election::Create, "n1", Timestamp::UNIX_EPOCH).unwrap();
        assert!(!held_without_relay(&lease), "this version's holder relays");
        let mut old = lease.clone();
        old.metadata.annotations = None;
        assert!(held_without_relay(&old), "an earlier version's holder does not");
        let mut free = old.clone();
        free.spec.as_mut().unwrap().holder_identity = None;
        assert!(!held_without_relay(&free), "nobody holds it: the next holder relays");
    }
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn lease(holder: Option<&str>, seconds: Option<i32>) -> Lease {
        Lease {
            metadata: ObjectMeta { name: Some(LEASE_NAME.into()), resource_version: Some("7".into()), ..Default::default() },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(String::from),
                lease_duration_seconds: seconds,
                lease_transitions: Some(3),
                renew_time: Some(MicroTime(Timestamp::from_second(1_000).unwrap())),
                acquire_time: Some(MicroTime(Timestamp::from_second(900).unwrap())),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn the_decision_follows_the_lease_as_read() {
        let s = Duration::from_secs;
        let wait = |h: &str| Election::Wait { holder: h.into() };
        let cases: Vec<(&str, Option<Lease>, Duration, Election)> = vec![
            ("no lease: create it", None, s(0), Election::Create),
            ("a lease naming nobody: take it at once", Some(lease(None, Some(15))), s(0), Election::Acquire),
            ("an empty holder is nobody", Some(lease(Some(""), Some(15))), s(0), Election::Acquire),
            ("my own lease: renew", Some(lease(Some("me"), Some(15))), s(0), Election::Renew),
            ("my own lease, long unchanged: still renew", Some(lease(Some("me"), Some(15))), s(600), Election::Renew),
            ("another's live lease: wait", Some(lease(Some("peer"), Some(15))), s(14), wait("peer")),
            ("another's lease unchanged for its duration: take it", Some(lease(Some("peer"), Some(15))), s(15), Election::Acquire),
            ("a longer lease is honoured", Some(lease(Some("peer"), Some(60))), s(30), wait("peer")),
            ("an unset duration counts as 15s", Some(lease(Some("peer"), None)), s(14), wait("peer")),
            ("a nonsense duration counts as 15s", Some(lease(Some("peer"), Some(-5))), s(15), Election::Acquire),
        ];
        for (why, l, unchanged, want) in cases {
            assert_eq!(decide(l.as_ref(), "me", unchanged), want, "{why}");
        }
    }

    #[test]
    fn a_taken_lease_names_me_renewed_now_and_counts_a_change_of_hands() {
        let now = Timestamp::from_second(2_000).unwrap();
        let created = desired(None, &Election::Create, "me", now).unwrap();
        let spec = created.spec.as_ref().unwrap();
        assert_eq!(created.metadata.name.as_deref(), Some(LEASE_NAME));
        assert_eq!(spec.holder_identity.as_deref(), Some("me"));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.lease_transitions, Some(0));
        assert_eq!(spec.acquire_time, Some(MicroTime(now)));
        assert_eq!(spec.renew_time, Some(MicroTime(now)));

        let peer = lease(Some("peer"), Some(15));
        let taken = desired(Some(&peer), &Election::Acquire, "me", now).unwrap();
        let spec = taken.spec.as_ref().unwrap();
        assert_eq!(taken.metadata.resource_version.as_deref(), Some("7"), "the update is guarded by what was read");
        assert_eq!((spec.holder_identity.as_deref(), spec.lease_transitions), (Some("me"), Some(4)));
        assert_eq!(spec.acquire_time, Some(MicroTime(now)));

        let freed = lease(None, Some(15));
        let spec = desired(Some(&freed), &Election::Acquire, "me", now).unwrap().spec.unwrap();
        assert_eq!(spec.lease_transitions, Some(3), "taking a free lease is no change of hands");

        let mine = lease(Some("me"), Some(15));
        let spec = desired(Some(&mine), &Election::Renew, "me", now).unwrap().spec.unwrap();
        assert_eq!(spec.acquire_time, Some(MicroTime(Timestamp::from_second(900).unwrap())), "a renewal keeps the acquire time");
        assert_eq!((spec.renew_time, spec.lease_transitions), (Some(MicroTime(now)), Some(3)));

        assert_eq!(desired(Some(&peer), &Election::Wait { holder: "peer".into() }, "me", now), None);
    }

    #[test]
    fn only_the_holder_gives_the_lease_up_and_it_then_names_nobody() {
        let mine = lease(Some("me"), Some(15));
        let released = release(Some(&mine), "me").unwrap();
        assert_eq!(holder(&released), None);
        assert_eq!(released.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(decide(Some(&released), "peer", Duration::ZERO), Election::Acquire, "a peer takes it at once");
        assert_eq!(release(Some(&lease(Some("peer"), Some(15))), "me"), None);
        assert_eq!(release(Some(&lease(None, Some(15))), "me"), None);
        assert_eq!(release(None, "me"), None);
    }
}
