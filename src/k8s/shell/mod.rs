//! The one Kubernetes controller shell: an actix actor that runs any [`Controller`] (the
//! attach queue, the resize queue, the snapshot queue). The shell owns what every
//! controller of this front needs and none decides: two cluster-wide watches, their
//! relists, a keyed [`WorkQueue`], readiness, periodic resync, the workers, and the retry
//! policy ([`RetryPolicy`], in `retry.rs`, which the loops of this front that retry
//! outside a shell use too); the controller owns what it keeps of the watched objects,
//! which keys a change queues, and what a run of a key does. The loops of this front
//! that are not run by a shell, and why, are listed in `crate::k8s`'s module doc.
//!
//! Rules:
//! - Two watches (`Controller::First`, `Controller::Second`), each of the scope the
//!   controller names ([`Controller::scopes`]): this node's objects, filtered by the API
//!   server on the label the elected agent's relay sets (`crate::k8s::scope`), or a
//!   cluster-scoped setting; restarted with backoff when they fail. Every event is
//!   counted, a foreign one (another node's object on a node watch) apart. A watch (re)start lists everything again (`Init` ..
//!   `InitDone`): the listed objects the controller keeps ([`Controller::keep`]) are
//!   collected and handed over whole at `InitDone` ([`Change::Listed`]), where they
//!   replace the kept set, and then every key is queued ([`Controller::queue_all`]):
//!   nothing that changed while the watch was down is lost, and objects deleted meanwhile
//!   are forgotten.
//! - Watch updates and deletions go to the controller as they come ([`Change::Applied`],
//!   [`Change::Deleted`], to [`Controller::first`] or [`Controller::second`]); it
//!   queues what they change through [`Pending`].
//! - Keys, not objects, are queued (see [`WorkQueue`]): a key already waiting is not
//!   queued twice, one key runs at most once at a time, a key changed while it runs runs
//!   once more after, a failed run comes back after the delay its outcome names.
//! - Nothing runs before both watches have delivered their first full list, so no key is
//!   judged against an object that simply was not listed yet, nor before the volume side
//!   is [`Ready`] (its start-up done), so a normal start makes no failed attempt. Keys queued meanwhile wait and run as
//!   soon as both hold.
//! - At most [`Settings::workers`] keys run at once. A run is planned on the actor
//!   ([`Controller::work`]: done at once, or a future), runs off it, and its result comes
//!   back to the actor ([`Controller::ran`]), which says how the run ended.
//! - [`Settings::resync`] queues everything again that often (`Duration::ZERO`: never).
//! - A restart under supervision empties the queue and waits for both lists and
//!   readiness again; what the controller keeps is replaced by the next lists.
//! - Clocks are read here only; the queue and the controllers' decisions take the time.
//! - Every controller is given the same [`QueueConfig`] (identity, retry policy,
//!   resync), built once from `[kubernetes]`; a failed run's delay comes from its
//!   [`RetryPolicy`] ([`RetryPolicy::backoff`], or `terminal` for a failure that retrying
//!   does not fix), named by the controller in the [`Outcome`] it returns.

use std::fmt::Debug;
use std::future::Future;
use std::marker::PhantomData;
use std::ops::Deref;
use std::pin::Pin;
use std::time::Duration;

use actix::prelude::*;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tracing::{debug, info, warn};

use crate::k8s::identity::Identity;
pub(crate) use crate::k8s::scope::Scope;
use crate::k8s::workqueue::{Outcome, WorkQueue};

/// The retry policy of the loops that retry with backoff.
mod retry;
#[cfg(test)]
mod tests;

pub(crate) use retry::RetryPolicy;

/// An object a controller watches.
pub(crate) trait Watched: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Unpin + 'static {}

impl<K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Unpin + 'static> Watched for K {}

/// What the shell tells a controller about one of its watches.
#[derive(Debug)]
pub(crate) enum Change<K> {
    /// The watch (re)listed: these are all the objects kept of it now.
    Listed(Vec<K>),
    /// An object was created or changed (as it came, not filtered by `keep`).
    Applied(K),
    /// An object was deleted.
    Deleted(K),
}

/// A change of either watch.
#[derive(Debug)]
pub(crate) enum Either<A, B> {
    First(A),
    Second(B),
}

/// A run planned by [`Controller::work`].
pub(crate) enum Work<T> {
    /// Nothing to run: the key ended so.
    Now(Outcome),
    /// Run this off the actor; its result goes to [`Controller::ran`].
    Run(Pin<Box<dyn Future<Output = T>>>),
}

/// The queue as a controller sees it while it takes a change in.
pub(crate) struct Pending<'a, K: Ord + Clone> {
    queue: &'a mut WorkQueue<K>,
    now: Instant,
}

impl<K: Ord + Clone> Pending<'_, K> {
    /// The key changed: run it (once more).
    pub(crate) fn add(&mut self, key: K) {
        self.queue.add(key, self.now);
    }

    /// The key's object is gone.
    pub(crate) fn forget(&mut self, key: &K) {
        self.queue.forget(key);
    }
}

/// What each controller of this front is given.
#[derive(Debug, Clone)]
pub(crate) struct QueueConfig {
    /// Driver and node.
    pub identity: Identity,
    /// Backoff and terminal retry delays (`kubernetes.retry_*`).
    pub policy: RetryPolicy,
    /// Queue everything again this often (`Duration::ZERO`: never).
    pub resync: Duration,
}

/// What the shell waits for before it runs anything: the volume side's start-up.
pub(crate) trait Ready {
    /// Resolves once the volume side is ready to answer.
    fn wait_ready(&self) -> impl Future<Output = ()> + Send;
}

/// How the shell runs a controller.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    /// For logs: what the controller is ("attach queue").
    pub name: &'static str,
    /// How many keys run at once.
    pub workers: usize,
    /// Queue everything again this often (`Duration::ZERO`: never).
    pub resync: Duration,
}

/// What a controller decides; the shell does the rest (see the module rules).
pub(crate) trait Controller: Unpin + Sized + 'static {
    /// The first watched resource.
    type First: Watched;
    /// The second watched resource.
    type Second: Watched;
    /// What is queued.
    type Key: Ord + Clone + Debug + Unpin + 'static;
    /// What a run hands back to the actor.
    type Ran: 'static;
    /// The controller's part of the statistics.
    type Own: Copy + Default + 'static;

    /// Which objects each watch (first, second) asks the API server for.
    fn scopes(&self) -> (Scope, Scope);

    /// What is kept of a listed object of the first watch (stripped), or `None` when it
    /// is none of ours.
    fn keep_first(&self, object: Self::First) -> Option<Self::First>;

    /// The same for the second watch.
    fn keep_second(&self, object: Self::Second) -> Option<Self::Second>;

    /// A change of the first watch; queue what it changes.
    fn first(&mut self, change: Change<Self::First>, queue: &mut Pending<'_, Self::Key>);

    /// A change of the second watch; queue what it changes.
    fn second(&mut self, change: Change<Self::Second>, queue: &mut Pending<'_, Self::Key>);

    /// Queue every key (after a relist, and on resync).
    fn queue_all(&self, queue: &mut Pending<'_, Self::Key>);

    /// Plans a run of `key`, which has failed `failures` times in a row so far.
    fn work(&mut self, key: &Self::Key, failures: u32) -> Work<Self::Ran>;

    /// A run of `key` ended with `ran`: how it counts.
    fn ran(&mut self, key: &Self::Key, ran: Self::Ran) -> Outcome;

    /// What the controller adds to the statistics, given the lists counted so far.
    fn own(&self, lists: (u64, u64)) -> Self::Own;
}

/// Counters for observation: the shell's, and what the controller adds (`own`), whose
/// fields read as the stats' own through `Deref` (`stats.attachments`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Stats<K> {
    /// Keys waiting to run.
    pub waiting: usize,
    /// Keys running.
    pub running: usize,
    /// Runs that ended in a retry, since start.
    pub retries: u64,
    /// Lists completed by each watch (first, second), since start.
    pub lists: (u64, u64),
    /// The controller's part ([`Controller::own`]).
    pub own: K,
}

impl<K> Deref for Stats<K> {
    type Target = K;
    fn deref(&self) -> &K {
        &self.own
    }
}

/// Query: the shell's statistics, with the controller's part `K`.
#[derive(Debug, Default)]
pub(crate) struct GetStats<K>(PhantomData<K>);

impl<K: 'static> Message for GetStats<K> {
    type Result = Stats<K>;
}

/// An item of one of the two watches.
pub(crate) type WatchItem<A, B> = Either<Result<Event<A>, watcher::Error>, Result<Event<B>, watcher::Error>>;

impl<A: 'static, B: 'static> Message for Either<Result<Event<A>, watcher::Error>, Result<Event<B>, watcher::Error>> {
    type Result = ();
}

/// Objects listed since each watch's last `Init`, when a list is under way.
type Listing<C> = (Option<Vec<<C as Controller>::First>>, Option<Vec<<C as Controller>::Second>>);

/// The actor running a controller `C`; see the module rules.
pub(crate) struct Shell<C: Controller> {
    client: Client,
    settings: Settings,
    /// Starts a wait for the volume side's readiness (again after a restart).
    readiness: Box<dyn Fn() -> Pin<Box<dyn Future<Output = ()>>>>,
    controller: C,
    /// Objects listed since each watch's last `Init`.
    listing: Listing<C>,
    queue: WorkQueue<C::Key>,
    wake: Option<SpawnHandle>,
    /// Each watch has delivered its first full list.
    synced: (bool, bool),
    /// The volume side is ready.
    ready: bool,
    /// Retries and lists so far (`own` unused).
    counters: Stats<()>,
    /// The scopes the watches were started with, for counting their events.
    scopes: Option<(Scope, Scope)>,
}

impl<C: Controller> Shell<C> {
    /// A shell around `controller`, watching through `client`, running nothing before
    /// `ready` is.
    pub(crate) fn with(client: Client, settings: Settings, ready: impl Ready + Clone + 'static, controller: C) -> Self {
        let readiness = Box::new(move || {
            let ready = ready.clone();
            Box::pin(async move { ready.wait_ready().await }) as Pin<Box<dyn Future<Output = ()>>>
        });
        Self {
            client,
            settings,
            readiness,
            controller,
            listing: (None, None),
            queue: WorkQueue::new(),
            wake: None,
            synced: (false, false),
            ready: false,
            counters: Stats::default(),
            scopes: None,
        }
    }

    /// The statistics now.
    pub(crate) fn stats(&self) -> Stats<C::Own> {
        let Stats { retries, lists, .. } = self.counters;
        Stats { waiting: self.queue.waiting(), running: self.queue.running(), retries, lists, own: self.controller.own(lists) }
    }

    /// Whether work may run: both watches listed and the volume side ready.
    fn runnable(&self) -> bool {
        self.synced == (true, true) && self.ready
    }

    fn pending(queue: &mut WorkQueue<C::Key>) -> Pending<'_, C::Key> {
        Pending { queue, now: Instant::now() }
    }

    /// A change of a watch: the first list marks it synced; a list queues everything.
    fn take_in(&mut self, change: Either<Change<C::First>, Change<C::Second>>) {
        let queue = &mut Self::pending(&mut self.queue);
        let listed = match change {
            Either::First(change) => {
                let listed = mark(&change, &mut self.synced.0, &mut self.counters.lists.0);
                self.controller.first(change, queue);
                listed
            }
            Either::Second(change) => {
                let listed = mark(&change, &mut self.synced.1, &mut self.counters.lists.1);
                self.controller.second(change, queue);
                listed
            }
        };
        if listed {
            self.controller.queue_all(&mut Self::pending(&mut self.queue));
        }
    }

    /// Start every due key there is a worker for, and wake up when the next one is due.
    fn kick(&mut self, ctx: &mut Context<Self>) {
        let now = Instant::now();
        while self.runnable() && self.queue.running() < self.settings.workers {
            let Some((key, failures)) = self.queue.pop(now) else { break };
            self.start(key, failures, ctx);
        }
        if let Some(h) = self.wake.take() {
            ctx.cancel_future(h);
        }
        if self.runnable() && self.queue.running() < self.settings.workers {
            if let Some(at) = self.queue.next_due() {
                self.wake = Some(ctx.run_later(at.saturating_duration_since(now), |act, ctx| {
                    act.wake = None;
                    act.kick(ctx);
                }));
            }
        }
    }

    fn start(&mut self, key: C::Key, failures: u32, ctx: &mut Context<Self>) {
        let work = match self.controller.work(&key, failures) {
            Work::Now(outcome) => return self.queue.finish(&key, outcome, Instant::now()),
            Work::Run(work) => work,
        };
        ctx.spawn(work.into_actor(self).map(move |ran, act, ctx| {
            let outcome = act.controller.ran(&key, ran);
            if matches!(outcome, Outcome::Retry(_)) {
                act.counters.retries += 1;
            }
            act.queue.finish(&key, outcome, Instant::now());
            act.kick(ctx);
        }));
    }
}

impl<C: Controller> Actor for Shell<C> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let (one, two) = self.controller.scopes();
        let first: Api<C::First> = Api::all(self.client.clone());
        let second: Api<C::Second> = Api::all(self.client.clone());
        let (c1, c2) = (one.config(), two.config());
        self.scopes = Some((one, two));
        ctx.add_stream(watcher(first, c1).default_backoff().map(WatchItem::<C::First, C::Second>::First));
        ctx.add_stream(watcher(second, c2).default_backoff().map(WatchItem::<C::First, C::Second>::Second));
        let resync = self.settings.resync;
        if resync > Duration::ZERO {
            ctx.run_interval(resync, |act, ctx| {
                act.controller.queue_all(&mut Self::pending(&mut act.queue));
                act.kick(ctx);
            });
        }
        ctx.spawn((self.readiness)().into_actor(self).map(|(), act, ctx| {
            act.ready = true;
            debug!(controller = act.settings.name, waiting = act.queue.waiting(), "volume manager ready; work may run");
            act.kick(ctx);
        }));
        info!(controller = self.settings.name, "{} started", self.settings.name);
    }
}

impl<C: Controller> Supervised for Shell<C> {
    fn restarting(&mut self, _: &mut Context<Self>) {
        warn!(controller = self.settings.name, "restarting the {}; the watches list everything again", self.settings.name);
        self.listing = (None, None);
        self.queue = WorkQueue::new();
        self.wake = None;
        self.synced = (false, false);
        self.ready = false;
    }
}

/// A watch item delivered by message (the tests inject changes this way).
impl<C: Controller> Handler<WatchItem<C::First, C::Second>> for Shell<C> {
    type Result = ();
    fn handle(&mut self, item: WatchItem<C::First, C::Second>, ctx: &mut Context<Self>) {
        <Self as StreamHandler<WatchItem<C::First, C::Second>>>::handle(self, item, ctx);
    }
}

impl<C: Controller> Handler<GetStats<C::Own>> for Shell<C> {
    type Result = MessageResult<GetStats<C::Own>>;
    fn handle(&mut self, _: GetStats<C::Own>, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stats())
    }
}

/// Whether `change` is a list, which marks its watch synced and counts.
fn mark<K>(change: &Change<K>, synced: &mut bool, relists: &mut u64) -> bool {
    let listed = matches!(change, Change::Listed(_));
    if listed {
        *synced = true;
        *relists += 1;
    }
    listed
}

/// One watch event: a relist is collected (what `keep` keeps of each object) and handed
/// over whole at its end; an update or a deletion is handed over as it comes.
fn collect<K>(event: Event<K>, listing: &mut Option<Vec<K>>, keep: impl FnOnce(K) -> Option<K>) -> Option<Change<K>> {
    match event {
        Event::Init => {
            *listing = Some(Vec::new());
            None
        }
        Event::InitApply(object) => {
            if let Some(list) = listing.as_mut() {
                list.extend(keep(object));
            }
            None
        }
        Event::InitDone => listing.take().map(Change::Listed),
        Event::Apply(object) => Some(Change::Applied(object)),
        Event::Delete(object) => Some(Change::Deleted(object)),
    }
}

/// Logs a failed watch: a resource the API server does not serve (its CRDs are not
/// installed, such as the VolumeSnapshot ones on a cluster without snapshots) is said at
/// info level, in plain words, since nothing is wrong with drivelet; anything else is a
/// warning. The watch restarts with backoff either way, so installing the CRDs later
/// needs no restart.
fn watch_failed(e: &kube::runtime::watcher::Error, kind: &str) {
    let text = e.to_string();
    if text.contains("404") && text.contains("NotFound") {
        info!(resource.kind = %kind, "the API server does not serve {kind} (its CRD is not installed); watching for it with backoff");
    } else {
        warn!(error = %e, "{kind} watch failed; it restarts with backoff");
    }
}

/// The kind of a watched resource, for logs.
fn kind<K: Resource<DynamicType = ()>>() -> String {
    K::kind(&()).into_owned()
}

impl<C: Controller> StreamHandler<WatchItem<C::First, C::Second>> for Shell<C> {
    fn handle(&mut self, item: WatchItem<C::First, C::Second>, ctx: &mut Context<Self>) {
        if let Some((one, two)) = &self.scopes {
            match &item {
                Either::First(Ok(event)) => crate::k8s::scope::count(event, one),
                Either::Second(Ok(event)) => crate::k8s::scope::count(event, two),
                _ => {}
            }
        }
        let change = match item {
            Either::First(Ok(event)) => collect(event, &mut self.listing.0, |o| self.controller.keep_first(o)).map(Either::First),
            Either::Second(Ok(event)) => collect(event, &mut self.listing.1, |o| self.controller.keep_second(o)).map(Either::Second),
            Either::First(Err(e)) => return watch_failed(&e, &kind::<C::First>()),
            Either::Second(Err(e)) => return watch_failed(&e, &kind::<C::Second>()),
        };
        if let Some(change) = change {
            self.take_in(change);
        }
        self.kick(ctx);
    }

    fn finished(&mut self, ctx: &mut Context<Self>) {
        warn!(
            "a {} or {} watch ended; restarting the {}",
            kind::<C::First>(),
            kind::<C::Second>(),
            self.settings.name
        );
        ctx.stop();
    }
}
