//! [`DriveSync`], the loop that keeps this node's `Drive` objects in sync: what starts a
//! sync (notifications, the watch of its objects, the periods), the debounce, one sync
//! at a time, and the backoff of a failed one (see the module doc of `k8s::drives`,
//! which also says why this loop is not run by the controller shell).

use std::collections::BTreeMap;
use std::time::Duration;

use actix::prelude::*;
use kube::api::Api;
use kube::{Client, ResourceExt};
use tracing::{debug, info, warn};

use super::error::DrivesError;
use super::executor::Executor;
use super::names::node_label_value;
use super::plan::SyncAction;
use super::sync::{sync_once, Sources, Synced};
use super::NODE_LABEL;
use crate::actors::inventory::DriveInventory;
use crate::actors::messages::{DriveEvent, SubscribeDrives};
use crate::actors::volumes::{SubscribeVolumes, VolumeManager, VolumesChanged};
use crate::k8s::shell::RetryPolicy;
use crate::k8s::crd;

/// Drive events within this long of the first one are folded into one sync.
pub(crate) const DEBOUNCE: Duration = Duration::from_millis(500);

/// How often a sync waiting for the inventory's first scan (or the volume manager's
/// start-up) asks again.
pub(crate) const READY_POLL: Duration = Duration::from_secs(1);

/// How often the bytes staged volumes use are looked at again (a sync that writes only
/// when a figure changed), so the Drive objects' used bytes are at most this old: they
/// change with no event at all. What else changes without a notification (see the
/// module doc) is at most this old too.
pub(crate) const USED_REFRESH: Duration = Duration::from_secs(30);

/// The actor that keeps this node's `Drive` objects in sync (see the module rules). Start
/// it under `actix::Supervisor`.
pub(crate) struct DriveSync {
    node: String,
    executor: Executor,
    sources: Sources,
    resync: Duration,
    /// How long a failed sync waits before the next (`[kubernetes] retry_base`, `retry_cap`).
    retry: RetryPolicy,
    /// The subscriptions to drive and volume events survive restarts (the address does).
    subscribed: bool,
    /// A sync is in flight.
    syncing: bool,
    /// Something may have changed since the last sync started.
    dirty: bool,
    /// Consecutive failed syncs.
    failures: u32,
    /// The next sync, when one is scheduled.
    timer: Option<SpawnHandle>,
    /// Watch this node's objects through this client, so a changed spec (an admin's
    /// action) is acted on at once (`None`: only the other triggers).
    watch: Option<Client>,
    /// The generation of each object last seen by the watch.
    generations: BTreeMap<String, i64>,
}

/// The watch saw this node's object `name` at spec generation `generation`.
#[derive(Message, Debug)]
#[rtype(result = "()")]
struct SpecSeen {
    name: String,
    generation: i64,
}

impl DriveSync {
    /// A sync of `node`'s objects through `client`, fed by the inventory and the volume
    /// manager, with a full resync every `resync` (zero: no periodic resync), a failed
    /// sync retried after `retry`'s backoff.
    pub(crate) fn new(
        client: Client,
        node: String,
        driver: &str,
        inventory: Addr<DriveInventory>,
        volumes: Addr<VolumeManager>,
        resync: Duration,
        retry: RetryPolicy,
    ) -> Self {
        let mut sync = Self::with_sources(client.clone(), node, Sources::of(inventory, volumes), resync);
        sync.retry = retry;
        sync.executor = sync.executor.with_driver(driver);
        sync.watch = Some(client);
        sync
    }

    /// Looks the pods of each volume up in this node's cache once it has listed.
    pub(crate) fn with_cache(mut self, cache: crate::k8s::cache::NodeCache) -> Self {
        self.executor.cache = Some(cache);
        self
    }

    pub(crate) fn with_sources(client: Client, node: String, sources: Sources, resync: Duration) -> Self {
        Self {
            executor: Executor::new(client, &node),
            node,
            watch: None,
            generations: BTreeMap::new(),
            sources,
            resync,
            retry: RetryPolicy::default(),
            subscribed: false,
            syncing: false,
            dirty: false,
            failures: 0,
            timer: None,
        }
    }

    /// Asks for a sync within `after`; one already scheduled or running covers it.
    fn request(&mut self, ctx: &mut Context<Self>, after: Duration) {
        self.dirty = true;
        if !self.syncing && self.timer.is_none() {
            self.schedule(ctx, after);
        }
    }

    fn schedule(&mut self, ctx: &mut Context<Self>, after: Duration) {
        if let Some(timer) = self.timer.take() {
            ctx.cancel_future(timer);
        }
        self.timer = Some(ctx.run_later(after, |act, ctx| {
            act.timer = None;
            act.run(ctx);
        }));
    }

    fn run(&mut self, ctx: &mut Context<Self>) {
        if self.syncing {
            return;
        }
        self.syncing = true;
        self.dirty = false;
        let fut = sync_once(self.node.clone(), self.sources.clone(), self.executor.clone());
        ctx.spawn(fut.into_actor(self).map(|result, act, ctx| act.finished(result, ctx)));
    }

    fn finished(&mut self, result: Result<Synced, DrivesError>, ctx: &mut Context<Self>) {
        self.syncing = false;
        match result {
            Ok(Synced::NotReady(waiting_for)) => {
                debug!(actor = "drive-sync", node.name = %self.node, waiting_for, "drive objects not synced yet");
                self.dirty = true;
                self.schedule(ctx, READY_POLL);
            }
            Ok(Synced::Done(actions)) => {
                self.failures = 0;
                for action in &actions {
                    let (node, object) = (&self.node, action.name());
                    match action {
                        SyncAction::Apply(_) => {
                            info!(actor = "drive-sync", node.name = %node, drive.object = %object, "drive object applied")
                        }
                        SyncAction::ApplyStatus(_) => {
                            debug!(actor = "drive-sync", node.name = %node, drive.object = %object, "drive object status applied")
                        }
                        SyncAction::Delete(_) => {
                            info!(actor = "drive-sync", node.name = %node, drive.object = %object, "stale drive object deleted")
                        }
                    }
                }
                if self.dirty {
                    self.schedule(ctx, DEBOUNCE);
                }
            }
            Err(e) => {
                let delay = self.retry.backoff(self.failures);
                self.failures = self.failures.saturating_add(1);
                warn!(actor = "drive-sync", node.name = %self.node, error = %e, failures = self.failures,
                      retry_in = ?delay, "drive object sync failed");
                self.dirty = true;
                self.schedule(ctx, delay);
            }
        }
    }
}

impl Actor for DriveSync {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if !self.subscribed {
            self.sources.subscribe.do_send(SubscribeDrives(ctx.address().recipient()));
            self.sources.subscribe_volumes.do_send(SubscribeVolumes(ctx.address().recipient()));
            self.subscribed = true;
        }
        if !self.resync.is_zero() {
            ctx.run_interval(self.resync, |act, ctx| act.request(ctx, Duration::ZERO));
        }
        if let Some(client) = self.watch.clone() {
            ctx.run_interval(USED_REFRESH, |act, ctx| act.request(ctx, Duration::ZERO));
            use tokio_stream::StreamExt as _;
            use kube::runtime::{watcher, WatchStreamExt as _};
            let config = watcher::Config::default().labels(&format!("{NODE_LABEL}={}", node_label_value(&self.node)));
            let seen = watcher::watcher(Api::<crd::Drive>::all(client), config)
                .default_backoff()
                .applied_objects()
                .filter_map(Result::ok)
                .map(|obj| SpecSeen { name: obj.name_any(), generation: obj.metadata.generation.unwrap_or(0) });
            ctx.add_stream(seen);
        }
        self.request(ctx, Duration::ZERO);
    }
}

impl StreamHandler<SpecSeen> for DriveSync {
    fn handle(&mut self, m: SpecSeen, ctx: &mut Context<Self>) {
        // Only a new generation is a new spec: status writes (ours) do not change it.
        if self.generations.insert(m.name, m.generation) != Some(m.generation) {
            self.request(ctx, Duration::ZERO);
        }
    }

    fn finished(&mut self, _: &mut Context<Self>) {
        // The watch retries with backoff and never ends; should it, the periodic
        // resync still acts on the specs.
        warn!(actor = "drive-sync", node.name = %self.node, "the watch of the Drive objects ended");
    }
}

impl Supervised for DriveSync {
    fn restarting(&mut self, _: &mut Context<Self>) {
        warn!(actor = "drive-sync", node.name = %self.node, "restarting: syncing drive objects from scratch");
        self.syncing = false;
        self.dirty = false;
        self.failures = 0;
        self.timer = None;
    }
}

impl Handler<DriveEvent> for DriveSync {
    type Result = ();
    fn handle(&mut self, _: DriveEvent, ctx: &mut Context<Self>) {
        self.request(ctx, DEBOUNCE);
    }
}

impl Handler<VolumesChanged> for DriveSync {
    type Result = ();
    fn handle(&mut self, _: VolumesChanged, ctx: &mut Context<Self>) {
        self.request(ctx, DEBOUNCE);
    }
}
