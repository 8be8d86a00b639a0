//! The cluster duties controller: one task per agent (with `kubernetes.cluster_duties`)
//! that stands in the Lease election and, while it leads, runs the duties.
//!
//! Rules:
//! - It watches the Lease (one watch, by name: no poll) and every [`RENEW_EVERY`] acts
//!   on [`election::decide`] over the Lease as last seen: create, take, renew, or follow.
//!   Only the holder writes (a renewal); a follower makes no request while the holder
//!   lives. Nothing is decided before the watch has listed the Lease. A write that
//!   conflicts means another candidate won: this one reads the Lease once and follows.
//!   It leads while its last successful write is younger than [`RENEW_DEADLINE`].
//! - While it leads it runs the relay ([`crate::k8s::relay`]), which labels the
//!   cluster's objects with their nodes; losing or giving up the Lease stops it, and the
//!   next holder's relay lists everything and catches up. While an earlier version's
//!   agent holds the Lease (it writes no [`election::RELAYS`]: a rolling upgrade), every
//!   agent relays, so no node's filtered watches miss a new object meanwhile.
//! - While it leads, a round of duties runs every [`DUTIES_EVERY`] over the relay's view
//!   (its watch caches, no list): once the view has listed everything, the nodes its
//!   objects name that no Node object is are proposed as gone, the round decides
//!   ([`plan`]) over their objects ([`Executor::observe`] reads only their claims,
//!   classes and pods), and for each such node confirms it gone (GET answered 404) and
//!   then does its duties. Before each node it checks that it still leads. A failed step
//!   is logged and redone next round. A round with no node gone makes no request.
//! - In the same rounds, the claim watch ([`super::claims`]): the claims that wait, from
//!   the view ([`ClaimExecutor::observe`] reads Nodes and capacity objects only when one
//!   of them waits for a drivelet class), decide ([`plan_claims`]), act on each claim
//!   while it still leads.
//! - Asked to stop (a clean shutdown), it gives the Lease up ([`election::release`]) when it
//!   holds it, so a peer takes over at its next look; a round under way is dropped (the
//!   duties are idempotent).
//! - Becoming leader, losing the lead and a new holder are logged once each.
//! - One task on a timer, not a controller of the shell (`crate::k8s::shell`): only the
//!   elected agent acts, on the Lease's clock; a round decides over whole lists (every
//!   Node against every attachment, PV, Drive and claim), not per key; a failed step waits
//!   for the next round rather than a backoff; and a clean shutdown gives the Lease up,
//!   which the [`Handle`] does.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Client, ResourceExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_stream::StreamExt;
use tracing::{info, warn};

use super::election::{self, Election, LEASE_NAME, RENEW_DEADLINE, RENEW_EVERY};
use super::claim_executor::ClaimExecutor;
use super::claims::plan_claims;
use super::executor::{DutyError, Executor};
use super::plan;
use crate::k8s::identity::Identity;
use crate::k8s::relay::controller::{lock, SharedView};

/// How often the leader runs a round of duties.
pub(crate) const DUTIES_EVERY: Duration = Duration::from_secs(10);

/// How long a clean shutdown waits for the Lease to be given up.
pub(crate) const RELEASE_WAIT: Duration = Duration::from_secs(3);

/// The running controller: [`Handle::shutdown`] stops it and gives the Lease up.
pub(crate) struct Handle {
    stop: oneshot::Sender<oneshot::Sender<()>>,
}

impl Handle {
    /// Stops the controller; waits (at most [`RELEASE_WAIT`]) for the Lease to be given up.
    pub(crate) async fn shutdown(self) {
        let (tx, rx) = oneshot::channel();
        if self.stop.send(tx).is_ok() {
            let _ = tokio::time::timeout(RELEASE_WAIT, rx).await;
        }
    }
}

/// Starts the controller for `identity` with its Lease in `namespace`.
pub(crate) fn start(client: Client, identity: Identity, namespace: String) -> Handle {
    let (stop, rx) = oneshot::channel();
    let controller = Controller::new(client, identity, namespace);
    tokio::spawn(controller.run(rx));
    Handle { stop }
}

/// The election state and the executor of one agent.
pub(crate) struct Controller {
    client: Client,
    leases: Api<Lease>,
    /// The Lease as the watch last showed it; `None` inside until the watch has listed.
    current: Option<Option<Lease>>,
    /// The Lease listed since the watch's last `Init`.
    listing: Option<Option<Lease>>,
    /// The relay, while this agent leads.
    relay: Option<JoinHandle<()>>,
    /// The relay's view of the cluster, which the rounds decide on.
    view: SharedView,
    /// Whether it runs the relay while it leads (always, but in tests of the election).
    relays: bool,
    identity: Identity,
    executor: Executor,
    claims: ClaimExecutor,
    /// The Lease's resourceVersion as last seen, and since when (this agent's clock).
    seen: Option<(String, Instant)>,
    /// Leading until then.
    leading_until: Option<Instant>,
    /// The holder last followed, so a change is logged once.
    following: Option<String>,
    /// When the last round of duties started.
    last_round: Option<Instant>,
}

impl Controller {
    pub(crate) fn new(client: Client, identity: Identity, namespace: String) -> Self {
        let leases = Api::namespaced(client.clone(), &namespace);
        let executor = Executor::new(client.clone(), identity.clone(), namespace.clone());
        let claims = ClaimExecutor::new(client.clone(), identity.clone(), namespace);
        Self {
            client,
            leases,
            current: None,
            listing: None,
            relay: None,
            view: SharedView::default(),
            relays: true,
            identity,
            executor,
            claims,
            seen: None,
            leading_until: None,
            following: None,
            last_round: None,
        }
    }

    /// The same controller, running no relay while it leads (tests of the election and
    /// the rounds alone).
    #[cfg(test)]
    pub(crate) fn without_relay(mut self) -> Self {
        self.relays = false;
        self
    }

    /// The relay's view the rounds decide on (tests fill it as the relay's watches would).
    #[cfg(test)]
    pub(crate) fn view(&self) -> SharedView {
        self.view.clone()
    }

    /// Whether this agent leads now.
    pub(crate) fn leading(&self) -> bool {
        self.leading_until.is_some_and(|t| Instant::now() < t)
    }

    /// Runs until `stop` says so (or its sender is dropped), then gives the Lease up.
    pub(crate) async fn run(mut self, mut stop: oneshot::Receiver<oneshot::Sender<()>>) {
        let mut tick = tokio::time::interval(RENEW_EVERY);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        info!(node.name = %self.identity.node, lease = LEASE_NAME, "standing for the cluster duties");
        let by_name = watcher::Config::default().fields(&format!("metadata.name={LEASE_NAME}")).any_semantic();
        let mut lease = Box::pin(watcher(self.leases.clone(), by_name).default_backoff());
        let done = loop {
            tokio::select! {
                done = &mut stop => break done.ok(),
                event = lease.next() => {
                    let now = match event {
                        Some(Ok(event)) => self.lease_event(event),
                        Some(Err(e)) => {
                            warn!(error = %e, lease = LEASE_NAME, "the cluster duties Lease watch failed; it restarts with backoff");
                            false
                        }
                        None => false,
                    };
                    if !now {
                        continue;
                    }
                }
                _ = tick.tick() => {}
            }
            let work = async {
                self.elect_logged().await;
                self.keep_relay();
                if self.leading() && self.last_round.is_none_or(|t| t.elapsed() >= DUTIES_EVERY) {
                    self.last_round = Some(Instant::now());
                    if let Err(e) = self.round().await {
                        warn!(error = %e, "a round of cluster duties failed; it is run again in {}s", DUTIES_EVERY.as_secs());
                    }
                    if let Err(e) = self.claims_round().await {
                        warn!(error = %e, "a round of the claim watch failed; it is run again in {}s", DUTIES_EVERY.as_secs());
                    }
                }
            };
            tokio::select! {
                done = &mut stop => break done.ok(),
                _ = work => {}
            }
        };
        self.stop_relay();
        self.give_up().await;
        if let Some(tx) = done {
            let _ = tx.send(());
        }
    }

    async fn elect_logged(&mut self) {
        let was = self.leading();
        if let Err(e) = self.elect().await {
            warn!(error = %e, lease = LEASE_NAME, "cannot read or write the cluster duties Lease; retried in {}s", RENEW_EVERY.as_secs());
        }
        match (was, self.leading()) {
            (false, true) => info!(node.name = %self.identity.node, lease = LEASE_NAME, "now doing the cluster duties (Lease held)"),
            (true, false) => warn!(node.name = %self.identity.node, lease = LEASE_NAME, "no longer doing the cluster duties (Lease lost)"),
            _ => {}
        }
    }

    /// A Lease watch event: what the election decides on. Answers whether to decide at
    /// once rather than at the next tick: the Lease first known, or free (no Lease, or
    /// one its holder gave up), so a start or a handover does not wait [`RENEW_EVERY`].
    pub(crate) fn lease_event(&mut self, event: Event<Lease>) -> bool {
        crate::k8s::scope::count(&event, &crate::k8s::scope::Scope::Cluster);
        let first = self.current.is_none();
        match event {
            Event::Init => self.listing = Some(None),
            Event::InitApply(l) => self.listing = Some(Some(l)),
            Event::InitDone => self.current = Some(self.listing.take().flatten()),
            Event::Apply(l) => self.current = Some(Some(l)),
            Event::Delete(_) => self.current = Some(None),
        }
        let free = matches!(&self.current, Some(None)) || matches!(&self.current, Some(Some(l)) if election::holder(l).is_none());
        self.current.is_some() && (first || free)
    }

    /// Starts the relay when this agent leads (or an earlier version's agent, which does
    /// not relay, holds the Lease: a rolling upgrade) and it is not running; stops it
    /// otherwise.
    fn keep_relay(&mut self) {
        let old_holder = matches!(&self.current, Some(Some(l)) if election::held_without_relay(l));
        if !(self.leading() || old_holder) || !self.relays {
            return self.stop_relay();
        }
        if self.relay.as_ref().is_none_or(JoinHandle::is_finished) {
            let (client, driver, view) = (self.client.clone(), self.identity.driver.clone(), self.view.clone());
            self.relay = Some(tokio::spawn(crate::k8s::relay::controller::run(client, driver, view)));
        }
    }

    fn stop_relay(&mut self) {
        if let Some(relay) = self.relay.take() {
            relay.abort();
            info!(node.name = %self.identity.node, "relay stopped (the cluster duties Lease is not held)");
        }
    }

    /// One look at the Lease as last seen: create, take, renew or follow it.
    pub(crate) async fn elect(&mut self) -> Result<(), kube::Error> {
        let me = self.identity.node.clone();
        let now = Instant::now();
        let Some(current) = self.current.clone() else {
            // The watch has not listed the Lease yet: nothing is known to decide on.
            return Ok(());
        };
        let rv = current.as_ref().and_then(|l| l.resource_version());
        match (&self.seen, &rv) {
            (Some((seen, _)), Some(rv)) if seen == rv => {}
            _ => self.seen = rv.map(|rv| (rv, now)),
        }
        let unchanged_for = self.seen.as_ref().map(|(_, t)| now.saturating_duration_since(*t)).unwrap_or_default();
        let decision = election::decide(current.as_ref(), &me, unchanged_for);
        let Some(lease) = election::desired(current.as_ref(), &decision, &me, Timestamp::now()) else {
            self.leading_until = None;
            if let Election::Wait { holder } = decision {
                if self.following.as_deref() != Some(holder.as_str()) {
                    info!(node.name = %me, lease.holder = %holder, "another agent does the cluster duties");
                    self.following = Some(holder);
                }
            }
            return Ok(());
        };
        let written = match decision {
            Election::Create => self.leases.create(&PostParams::default(), &lease).await,
            _ => self.leases.replace(LEASE_NAME, &PostParams::default(), &lease).await,
        };
        match written {
            Ok(l) => {
                self.leading_until = Some(now + RENEW_DEADLINE);
                self.following = None;
                self.seen = l.resource_version().map(|rv| (rv, now));
                self.current = Some(Some(l));
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // Another candidate wrote first: follow it, from the Lease as it is now
                // (the watch may not have shown it yet).
                self.leading_until = None;
                self.current = Some(self.leases.get_opt(LEASE_NAME).await?);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// One round of duties (while leading).
    pub(crate) async fn round(&mut self) -> Result<(), DutyError> {
        let (obs, gone) = {
            let view = lock(&self.view);
            if !view.synced() {
                return Ok(());
            }
            let gone = view.gone();
            if gone.is_empty() {
                return Ok(());
            }
            (view.duties(&gone), gone)
        };
        let obs = self.executor.observe(obs, &gone).await?;
        let plans = plan(&obs, &self.identity.driver, &gone);
        for (node, duties) in plans {
            if !self.leading() {
                return Ok(());
            }
            match self.executor.confirm_gone(&node).await {
                Ok(true) => {}
                Ok(false) => {
                    info!(node.name = %node, "node exists (it was missing from the list only): nothing done about it");
                    continue;
                }
                Err(e) => {
                    warn!(node.name = %node, error = %e, "cannot confirm the node is deleted: nothing done about it this round");
                    continue;
                }
            }
            if let Err(e) = self.executor.apply(&node, &duties).await {
                warn!(node.name = %node, error = %e, "a duty for a deleted node failed; it is redone next round");
            }
        }
        Ok(())
    }

    /// One round of the claim watch (while leading): waiting claims of drivelet's classes
    /// get a node (Immediate binding) or a Warning saying why they wait.
    pub(crate) async fn claims_round(&mut self) -> Result<(), DutyError> {
        let (claims, classes, sources) = {
            let view = lock(&self.view);
            if !view.synced() {
                return Ok(());
            }
            let claims = view.waiting_claims();
            let sources = super::claims::clone_sources(&claims);
            (claims, view.classes(), view.pvs_of_claims(&sources))
        };
        let obs = self.claims.observe(claims, classes, sources).await?;
        for action in plan_claims(&obs, &self.identity.driver) {
            if !self.leading() {
                return Ok(());
            }
            if let Err(e) = self.claims.apply(&action).await {
                warn!(claim.namespace = %action.namespace, claim.name = %action.name, error = %e, "a claim's decision could not be carried out; it is decided again next round");
            }
        }
        Ok(())
    }

    /// Gives the Lease up when this agent holds it.
    pub(crate) async fn give_up(&mut self) {
        let me = self.identity.node.clone();
        let current = match self.leases.get_opt(LEASE_NAME).await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, lease = LEASE_NAME, "cannot read the cluster duties Lease to give it up; a peer takes over once it expires");
                return;
            }
        };
        let Some(lease) = election::release(current.as_ref(), &me) else { return };
        match self.leases.replace(LEASE_NAME, &PostParams::default(), &lease).await {
            Ok(_) => info!(node.name = %me, lease = LEASE_NAME, "cluster duties handed over (Lease given up)"),
            Err(e) => warn!(error = %e, lease = LEASE_NAME, "cannot give the cluster duties Lease up; a peer takes over once it expires"),
        }
        self.leading_until = None;
    }
}
