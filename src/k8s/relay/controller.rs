//! The relay task: one per cluster, run by the agent that holds the cluster duties'
//! Lease for as long as it holds it (`crate::k8s::duties::controller` starts and stops
//! it). It holds the one cluster-wide watch of PVs, claims, VolumeAttachments,
//! VolumeSnapshotContents and Drive objects (and of Node names and the driver's
//! StorageClasses, for the duties), keeps the compact [`View`] of which node holds what,
//! and writes each object's node label (the decisions in [`super`]).
//!
//! Rules:
//! - The watches list by streaming (`sendInitialEvents`, from the server's watch cache)
//!   where the server has it, asked once at start, else paginated (500 a page); Nodes
//!   as metadata only; restarted with backoff; a relist replaces what the view holds of that kind and looks at every
//!   object again, so nothing changed while a watch was down (or before this agent led)
//!   is missed.
//! - The view keeps a few strings an object, never the objects (the claims that wait
//!   apart, stripped): measured per volume in BENCHMARKS.md. It is shared with the
//!   duties, which read it instead of listing; a new relay starts from an empty view.
//! - A change looks again at what it decides: a PV at itself, its claim and the contents
//!   of its volume; a Drive object at the contents of its volumes and snapshots.
//! - Writes are label-only merge patches of object metadata, at most [`IN_FLIGHT`] at
//!   once, one per object at a time; a write that fails (other than the object being
//!   gone) is tried again after [`RETRY_AFTER`]. A written label is remembered at once, so
//!   the watch event it causes writes nothing more.
//! - A kind the API server does not serve (the snapshot CRDs not installed) is said once
//!   at info level and watched for with backoff.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use kube::api::{Api, Patch, PatchParams, WatchEvent, WatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Client, Resource, ResourceExt};
use serde_json::Value;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_stream::{Stream, StreamExt};
use tracing::{debug, info, warn};

use super::label_patch;
pub(crate) use super::view::{Kind, Target, View};
use crate::k8s::crd::Drive;
use crate::k8s::scope::{self, Scope};
use crate::k8s::snapshot::objects::VolumeSnapshotContent;

/// How many label writes are under way at once.
pub(crate) const IN_FLIGHT: usize = 8;

/// How long a failed label write waits before it is tried again.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(2);

/// The view as the relay and the duties share it.
pub(crate) type SharedView = Arc<Mutex<View>>;

/// The view, whatever a panic elsewhere left of its lock.
pub(crate) fn lock(view: &SharedView) -> MutexGuard<'_, View> {
    view.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One item of one of the relay's watches.
enum Seen {
    Pv(Result<Event<PersistentVolume>, watcher::Error>),
    Claim(Result<Event<PersistentVolumeClaim>, watcher::Error>),
    Va(Result<Event<VolumeAttachment>, watcher::Error>),
    Content(Result<Event<VolumeSnapshotContent>, watcher::Error>),
    Drive(Result<Event<Drive>, watcher::Error>),
    Node(Result<Event<PartialObjectMeta<Node>>, watcher::Error>),
    Class(Result<Event<StorageClass>, watcher::Error>),
}

type Items = Pin<Box<dyn Stream<Item = Seen> + Send>>;

fn watch<K>(client: &Client, config: watcher::Config, wrap: fn(Result<Event<K>, watcher::Error>) -> Seen) -> Items
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let api: Api<K> = Api::all(client.clone());
    Box::pin(watcher(api, config).default_backoff().map(wrap))
}

/// The name an object is listed under, for a relist's bookkeeping.
fn listed_name<K: Resource>(o: &K) -> String {
    match &o.meta().namespace {
        Some(ns) => format!("{ns}/{}", o.meta().name.as_deref().unwrap_or("")),
        None => o.meta().name.clone().unwrap_or_default(),
    }
}

fn plural(kind: Kind) -> &'static str {
    match kind {
        Kind::Pv => "persistentvolumes",
        Kind::Claim => "persistentvolumeclaims",
        Kind::Va => "volumeattachments",
        Kind::Content => "volumesnapshotcontents",
        Kind::Drive => "drives",
        Kind::Node => "nodes",
        Kind::Class => "storageclasses",
    }
}

/// The relay's state while it runs.
struct Relay {
    client: Client,
    view: SharedView,
    /// Objects listed since each kind's last `Init`.
    listing: BTreeMap<Kind, HashSet<String>>,
    /// Labels to write, by object.
    pending: BTreeSet<Target>,
    /// Objects being written.
    writing: BTreeSet<Target>,
    /// Failed writes, tried again then.
    retry: BTreeMap<Target, Instant>,
    writes: JoinSet<(Target, String, Result<(), kube::Error>)>,
    /// Kinds the API server did not serve, said once.
    unserved: BTreeSet<Kind>,
}

impl Relay {
    fn look(&mut self, targets: Vec<Target>) {
        let view = lock(&self.view);
        for t in targets {
            if view.patch_for(&t).is_some() {
                self.pending.insert(t);
            }
        }
    }

    /// One watch event of `kind`, taken in by the view's `apply` / `delete`.
    fn event<K: Resource<DynamicType = ()>>(
        &mut self,
        kind: Kind,
        event: Result<Event<K>, watcher::Error>,
        apply: impl Fn(&mut View, &K) -> Vec<Target>,
        delete: impl Fn(&mut View, &K) -> Vec<Target>,
    ) {
        let plural = plural(kind);
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                let text = e.to_string();
                if text.contains("404") && text.contains("NotFound") {
                    if self.unserved.insert(kind) {
                        info!(resource = plural, "the API server does not serve {plural} (its CRD is not installed); the relay watches for it with backoff");
                    }
                } else {
                    warn!(resource = plural, error = %e, "the relay's watch failed; it restarts with backoff");
                }
                return;
            }
        };
        scope::count(&event, &Scope::Cluster);
        let targets = match event {
            Event::Init => {
                self.listing.insert(kind, HashSet::new());
                Vec::new()
            }
            Event::InitApply(o) => {
                if let Some(l) = self.listing.get_mut(&kind) {
                    l.insert(listed_name(&o));
                }
                apply(&mut lock(&self.view), &o)
            }
            Event::InitDone => {
                let listed = self.listing.remove(&kind).unwrap_or_default();
                let mut view = lock(&self.view);
                let mut t = view.keep_only(kind, &listed);
                t.extend(view.all_targets(kind));
                debug!(resource = plural, listed = listed.len(), "the relay listed {plural}");
                t
            }
            Event::Apply(o) => apply(&mut lock(&self.view), &o),
            Event::Delete(o) => delete(&mut lock(&self.view), &o),
        };
        self.look(targets);
    }

    fn seen(&mut self, item: Seen) {
        match item {
            Seen::Pv(e) => self.event(Kind::Pv, e, View::apply_pv, |v, o| v.delete_pv(&o.name_any())),
            Seen::Claim(e) => self.event(Kind::Claim, e, View::apply_claim, |v, o| {
                v.delete_claim(&(o.namespace().unwrap_or_default(), o.name_any()));
                Vec::new()
            }),
            Seen::Va(e) => self.event(Kind::Va, e, View::apply_va, |v, o| {
                v.delete_va(&o.name_any());
                Vec::new()
            }),
            Seen::Content(e) => self.event(Kind::Content, e, View::apply_content, |v, o| {
                v.delete_content(&o.name_any());
                Vec::new()
            }),
            Seen::Drive(e) => self.event(Kind::Drive, e, View::apply_drive, |v, o| v.delete_drive(&o.name_any())),
            Seen::Node(e) => self.event(
                Kind::Node,
                e,
                |v, o| {
                    v.node(&o.name_any(), true);
                    Vec::new()
                },
                |v, o| {
                    v.node(&o.name_any(), false);
                    Vec::new()
                },
            ),
            Seen::Class(e) => self.event(
                Kind::Class,
                e,
                |v, o| {
                    v.class(&o.name_any(), Some(o));
                    Vec::new()
                },
                |v, o| {
                    v.class(&o.name_any(), None);
                    Vec::new()
                },
            ),
        }
    }

    /// Starts the writes there is room for.
    fn start_writes(&mut self) {
        while self.writing.len() < IN_FLIGHT {
            let Some(t) = self.pending.iter().find(|t| !self.writing.contains(*t)).cloned() else { break };
            self.pending.remove(&t);
            let wanted = {
                let view = lock(&self.view);
                view.want(&t).and_then(|(node, label)| Some((label_patch(label, node)?, crate::k8s::drives::node_label_value(node))))
            };
            let Some((patch, value)) = wanted else { continue };
            self.writing.insert(t.clone());
            let client = self.client.clone();
            self.writes.spawn(async move {
                let result = write(&client, &t, &patch).await;
                (t, value, result)
            });
        }
    }

    fn written(&mut self, t: Target, value: String, result: Result<(), kube::Error>) {
        self.writing.remove(&t);
        match result {
            Ok(()) => {
                crate::metrics::metrics().record_relayed(t.resource());
                debug!(object = ?t, node.label = %value, "labelled with its node");
                lock(&self.view).labelled(&t, value);
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                warn!(resource = t.resource(), error = %e, "cannot label an object with its node; tried again in {}s", RETRY_AFTER.as_secs());
                self.retry.insert(t, Instant::now() + RETRY_AFTER);
            }
        }
    }

    fn retry_due(&mut self) {
        let now = Instant::now();
        let due: Vec<Target> = self.retry.iter().filter(|(_, at)| **at <= now).map(|(t, _)| t.clone()).collect();
        for t in &due {
            self.retry.remove(t);
        }
        self.look(due);
    }
}

/// One label write.
async fn write(client: &Client, t: &Target, patch: &Value) -> Result<(), kube::Error> {
    let pp = PatchParams::default();
    let patch = Patch::Merge(patch);
    match t {
        Target::Pv(n) => Api::<PersistentVolume>::all(client.clone()).patch_metadata(n, &pp, &patch).await.map(drop),
        Target::Claim(ns, n) => {
            Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns).patch_metadata(n, &pp, &patch).await.map(drop)
        }
        Target::Va(n) => Api::<VolumeAttachment>::all(client.clone()).patch_metadata(n, &pp, &patch).await.map(drop),
        Target::Content(n) => Api::<VolumeSnapshotContent>::all(client.clone()).patch_metadata(n, &pp, &patch).await.map(drop),
    }
}

/// Whether the API server answers streaming lists (`sendInitialEvents`, the WatchList
/// feature): asked once with a watch of no Node at all, which such a server ends with
/// its `k8s.io/initial-events-end` bookmark within the second it is given.
async fn streams_lists(client: &Client) -> bool {
    let api: Api<PartialObjectMeta<Node>> = Api::all(client.clone());
    let wp = WatchParams::streaming_lists().timeout(1).fields("metadata.name=drivelet-no-such-node");
    let Ok(events) = api.watch_metadata(&wp, "0").await else { return false };
    let mut events = Box::pin(events);
    let ended = async {
        while let Some(Ok(event)) = events.next().await {
            if let WatchEvent::Bookmark(b) = event {
                return b.metadata.annotations.get("k8s.io/initial-events-end").is_some_and(|v| v == "true");
            }
        }
        false
    };
    tokio::time::timeout(Duration::from_secs(3), ended).await.unwrap_or(false)
}

/// Runs the relay for `driver` into `view` (emptied first) until it is aborted (the
/// Lease lost or given up).
pub(crate) async fn run(client: Client, driver: String, view: SharedView) {
    *lock(&view) = View::new(&driver);
    // Where the server streams its initial lists, from its watch cache, the relay's
    // (re)lists read nothing from etcd; elsewhere they are paginated.
    let streaming = streams_lists(&client).await;
    let config = || if streaming { Scope::Cluster.config().streaming_lists() } else { Scope::Cluster.config() };
    // Nodes as metadata only: their names are all the duties read of them.
    let nodes: Api<PartialObjectMeta<Node>> = Api::all(client.clone());
    let items = watch::<PersistentVolume>(&client, config(), Seen::Pv)
        .merge(watch::<PersistentVolumeClaim>(&client, config(), Seen::Claim))
        .merge(watch::<VolumeAttachment>(&client, config(), Seen::Va))
        .merge(watch::<VolumeSnapshotContent>(&client, config(), Seen::Content))
        .merge(watch::<Drive>(&client, config(), Seen::Drive))
        .merge(Box::pin(watcher(nodes, config()).default_backoff().map(Seen::Node)) as Items)
        .merge(watch::<StorageClass>(&client, config(), Seen::Class));
    let mut items = Box::pin(items);
    let mut relay = Relay {
        client,
        view,
        listing: BTreeMap::new(),
        pending: BTreeSet::new(),
        writing: BTreeSet::new(),
        retry: BTreeMap::new(),
        writes: JoinSet::new(),
        unserved: BTreeSet::new(),
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    info!(streaming_lists = streaming, "relaying: labelling PVs, claims, VolumeAttachments and VolumeSnapshotContents with their node");
    loop {
        tokio::select! {
            item = items.next() => match item {
                Some(item) => relay.seen(item),
                None => break,
            },
            Some(done) = relay.writes.join_next(), if !relay.writes.is_empty() => match done {
                Ok((t, value, result)) => relay.written(t, value, result),
                Err(e) => warn!(error = %e, "a label write of the relay ended abnormally"),
            },
            _ = tick.tick() => relay.retry_due(),
        }
        relay.start_writes();
    }
    warn!("the relay's watches ended");
}
