//! The capacity loop: one task that watches the StorageClasses and the volume side and
//! keeps this node's CSIStorageCapacity objects saying what GetCapacity answers
//! ([`super`] decides, this file reads and writes).
//!
//! Rules:
//! - Inputs: one cluster-wide watch of StorageClasses (the server cannot filter them by
//!   provisioner; they are few; its lists come from the watch cache), of which only
//!   this driver's are kept, reduced to
//!   [`Class`]; and the volume side's changes ([`CapacityBackend::changed`]), which come
//!   whenever drives, volumes or reservations change. No poll: nothing is asked on a
//!   timer.
//! - A round recomputes every object in memory and writes at once only what differs
//!   ([`plan`]). While a round writes, further changes fold into one next round (the
//!   view is a watch: many changes are one; class events are drained before a round).
//! - This node's objects are listed (by its node label and [`super::MANAGER`], from the
//!   API server's watch cache, `resourceVersion=0`) at start and after a failed round;
//!   in between, what was written is remembered. The Node is read once, for its uid
//!   (the objects' owner).
//! - A failed round is retried with the policy's backoff ([`RetryPolicy::backoff`]),
//!   said in words once per failure; a create that finds its object already there (a
//!   list from a cache that lagged) patches it instead; a patch that finds it gone
//!   creates it; a delete of one gone is done.
//! - Once, after this node's own objects are first written, the external-provisioner
//!   sidecar's objects of this node are deleted.
//! - It is a spawned task, not a controller of the shell: what it writes is the volume
//!   manager's state for each class, not a reconcile of watched objects by key.

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::task::Poll;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;
use tokio::time::Instant;
use tokio_stream::{Stream, StreamExt};
use tracing::{debug, info, warn};

use super::backend::CapacityBackend;
use super::{api, class_of, node_owner, object, own_selector, plan, room_patch, sidecar_selector, wanted, CapacityError, Class, Listed, Me, Wanted, Write};
use crate::k8s::scope::{self, Scope};
use crate::k8s::shell::RetryPolicy;

/// Whether an API error is the server's `code`.
fn is(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(r) if r.code == code)
}

/// What the loop knows between rounds.
struct Writer {
    client: Client,
    me: Me,
    /// This driver's classes, by name.
    classes: BTreeMap<String, Class>,
    /// The Node as owner, once read.
    owner: Option<OwnerReference>,
    /// This node's objects as listed and written since; `None`: list them first.
    listed: Option<BTreeMap<String, Listed>>,
    /// Whether the sidecar's objects are deleted.
    sidecar_done: bool,
    /// The refusals already said, `(class, words)`.
    said: BTreeSet<(String, String)>,
}

impl Writer {
    fn api(&self) -> Api<CSIStorageCapacity> {
        Api::namespaced(self.client.clone(), &self.me.namespace)
    }

    /// One round: what differs is written; `Ok` with nothing written while the volume
    /// side is not ready.
    async fn round(&mut self, backend: &impl CapacityBackend) -> Result<(), CapacityError> {
        let Some(super::Decided { objects: wanted, refused }) = wanted(&self.me, &self.classes, |c| backend.answer(&c.parameters)) else {
            debug!("the volume manager is not ready; the capacity objects wait for it");
            return Ok(());
        };
        for (class, why) in refused {
            if self.said.insert((class.clone(), why.clone())) {
                warn!(storage_class = %class, reason = %why, "GetCapacity refuses StorageClass {class} ({why}); its CSIStorageCapacity says no room");
            }
        }
        let owner = match &self.owner {
            Some(o) => o.clone(),
            None => {
                let node = Api::<Node>::all(self.client.clone())
                    .get(&self.me.node)
                    .await
                    .map_err(api(format!("reading Node {} (the owner of its CSIStorageCapacity objects)", self.me.node)))?;
                let uid = node.metadata.uid.ok_or_else(|| CapacityError::NoUid { node: self.me.node.clone() })?;
                let o = node_owner(&self.me.node, &uid);
                self.owner = Some(o.clone());
                o
            }
        };
        let mut listed = match self.listed.take() {
            Some(l) => l,
            None => {
                let lp = ListParams::default().labels(&own_selector(&self.me)).match_any();
                let list = self.api().list(&lp).await.map_err(api(format!(
                    "listing this node's CSIStorageCapacity objects in namespace {}",
                    self.me.namespace
                )))?;
                list.items.iter().filter_map(|c| Some((c.metadata.name.clone()?, Listed::of(c)))).collect()
            }
        };
        for write in plan(&self.me, &wanted, &listed) {
            // A failed write leaves `listed` unknown: the next round lists again.
            self.write(&write, &owner).await?;
            match write {
                Write::Create(w) | Write::Patch(w) => {
                    listed.insert(w.name.clone(), Listed::written(&w, &self.me));
                }
                Write::Delete(name) => {
                    listed.remove(&name);
                }
            }
        }
        self.listed = Some(listed);
        if !self.sidecar_done {
            self.delete_sidecars().await?;
            self.sidecar_done = true;
        }
        Ok(())
    }

    /// Carries out one write.
    async fn write(&self, write: &Write, owner: &OwnerReference) -> Result<(), CapacityError> {
        match write {
            Write::Create(w) => self.create(w, owner).await,
            Write::Patch(w) => self.patch(w, owner).await,
            Write::Delete(name) => {
                let what = format!("deleting CSIStorageCapacity {name} in namespace {}", self.me.namespace);
                match self.api().delete(name, &DeleteParams::default()).await {
                    Ok(_) => info!(capacity.name = %name, "deleted the CSIStorageCapacity of a StorageClass this node no longer publishes"),
                    Err(e) if is(&e, 404) => {}
                    Err(e) => return Err(api(what)(e)),
                }
                Ok(())
            }
        }
    }

    async fn create(&self, w: &Wanted, owner: &OwnerReference) -> Result<(), CapacityError> {
        match self.api().create(&PostParams::default(), &object(&self.me, w, owner)).await {
            Ok(_) => {
                info!(capacity.name = %w.name, storage_class = %w.class, available = w.room.available, maximum = w.room.maximum,
                    "published this node's storage capacity for StorageClass {}", w.class);
                Ok(())
            }
            Err(e) if is(&e, 409) => self.patch_only(w).await,
            Err(e) => Err(api(format!("creating CSIStorageCapacity {} of StorageClass {}", w.name, w.class))(e)),
        }
    }

    async fn patch(&self, w: &Wanted, owner: &OwnerReference) -> Result<(), CapacityError> {
        match self.patch_only(w).await {
            Err(CapacityError::Api { source, .. }) if is(&source, 404) => Box::pin(self.create(w, owner)).await,
            done => done,
        }
    }

    async fn patch_only(&self, w: &Wanted) -> Result<(), CapacityError> {
        self.api()
            .patch(&w.name, &PatchParams::default(), &Patch::Merge(room_patch(w)))
            .await
            .map_err(api(format!("updating CSIStorageCapacity {} of StorageClass {}", w.name, w.class)))?;
        debug!(capacity.name = %w.name, storage_class = %w.class, available = w.room.available, maximum = w.room.maximum, "updated this node's storage capacity");
        Ok(())
    }

    /// Deletes the external-provisioner sidecar's objects of this node.
    async fn delete_sidecars(&self) -> Result<(), CapacityError> {
        let lp = ListParams::default().labels(&sidecar_selector(&self.me)).match_any();
        let what = || format!("the external-provisioner's CSIStorageCapacity objects of this node in namespace {}", self.me.namespace);
        let list = self.api().list(&lp).await.map_err(api(format!("listing {}", what())))?;
        for c in &list.items {
            let Some(name) = c.metadata.name.as_deref() else { continue };
            match self.api().delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if is(&e, 404) => {}
                Err(e) => return Err(api(format!("deleting CSIStorageCapacity {name}, one of {}", what()))(e)),
            }
        }
        if !list.items.is_empty() {
            info!(deleted = list.items.len(), "deleted the external-provisioner's CSIStorageCapacity objects of this node: drivelet publishes them now");
        }
        Ok(())
    }
}

/// Takes one StorageClass watch event into `classes` (and `listing`, during a list);
/// whether this driver's classes changed.
fn fold(event: Event<StorageClass>, driver: &str, classes: &mut BTreeMap<String, Class>, listing: &mut Option<BTreeMap<String, Class>>) -> bool {
    scope::count(&event, &Scope::Cluster);
    match event {
        Event::Init => {
            *listing = Some(BTreeMap::new());
            false
        }
        Event::InitApply(sc) => {
            if let (Some(l), Some(c)) = (listing.as_mut(), class_of(&sc, driver)) {
                l.insert(c.name.clone(), c);
            }
            false
        }
        Event::InitDone => {
            let listed = listing.take().unwrap_or_default();
            let changed = *classes != listed;
            *classes = listed;
            changed
        }
        Event::Apply(sc) => {
            let name = sc.metadata.name.clone().unwrap_or_default();
            match class_of(&sc, driver) {
                Some(c) if classes.get(&name) == Some(&c) => false,
                Some(c) => {
                    debug!(storage_class = %name, binding = %c.binding, "a StorageClass of this driver, new or changed: its capacity is published");
                    classes.insert(name, c);
                    true
                }
                None => classes.remove(&name).is_some(),
            }
        }
        Event::Delete(sc) => classes.remove(sc.metadata.name.as_deref().unwrap_or("")).is_some(),
    }
}

/// The stream's next item if one is there now (`Some(None)`: the stream ended), without
/// waiting for one.
async fn ready_now<S: Stream + Unpin>(s: &mut S) -> Option<Option<S::Item>> {
    std::future::poll_fn(|cx| {
        Poll::Ready(match Pin::new(&mut *s).poll_next(cx) {
            Poll::Ready(item) => Some(item),
            Poll::Pending => None,
        })
    })
    .await
}

/// Takes one item of the StorageClass watch: whether this driver's classes are listed
/// with it (a list's end), and whether they changed.
fn take(
    item: Result<Event<StorageClass>, watcher::Error>,
    driver: &str,
    classes: &mut BTreeMap<String, Class>,
    listing: &mut Option<BTreeMap<String, Class>>,
) -> (bool, bool) {
    match item {
        Ok(event) => {
            let was_listing = listing.is_some();
            let changed = fold(event, driver, classes, listing);
            (was_listing && listing.is_none(), changed)
        }
        Err(e) => {
            warn!(error = %e, "the StorageClass watch of the capacity objects failed; it restarts with backoff");
            (false, false)
        }
    }
}

/// Keeps this node's CSIStorageCapacity objects (see the module rules) until the volume
/// manager is gone for good or the agent stops.
pub(crate) async fn run(client: Client, me: Me, mut backend: impl CapacityBackend, policy: RetryPolicy) {
    let classes_api: Api<StorageClass> = Api::all(client.clone());
    // Every agent watches the classes: its (re)lists are served from the API server's
    // watch cache (no page limit: a handful of objects), never read from etcd.
    let config = watcher::Config { page_size: None, ..watcher::Config::default().any_semantic() };
    let mut events = Box::pin(watcher(classes_api, config).default_backoff());
    let driver = me.driver.clone();
    let mut w = Writer { client, me, classes: BTreeMap::new(), owner: None, listed: None, sidecar_done: false, said: BTreeSet::new() };
    let mut listing = None;
    let (mut synced, mut dirty) = (false, false);
    let mut failures = 0u32;
    let mut retry_at: Option<Instant> = None;
    info!(node.name = %w.me.node, namespace = %w.me.namespace, "publishing this node's storage capacity (CSIStorageCapacity objects)");
    loop {
        if dirty && synced && retry_at.is_none() {
            dirty = false;
            match w.round(&backend).await {
                Ok(()) => failures = 0,
                Err(e) => {
                    w.listed = None;
                    let after = policy.backoff(failures);
                    warn!(error = %e, retry.after_ms = after.as_millis() as u64, "cannot write this node's CSIStorageCapacity objects; retrying");
                    failures = failures.saturating_add(1);
                    retry_at = Some(Instant::now() + after);
                }
            }
        }
        tokio::select! {
            item = events.next() => {
                // Events already here fold into the same round.
                let mut next = item;
                loop {
                    let Some(item) = next else { return };
                    let (listed, changed) = take(item, &driver, &mut w.classes, &mut listing);
                    synced |= listed;
                    dirty |= listed || changed;
                    match ready_now(&mut events).await {
                        Some(more) => next = more,
                        None => break,
                    }
                }
            }
            alive = backend.changed() => {
                if !alive {
                    info!("the volume manager is gone; this node's CSIStorageCapacity objects stay as last written");
                    return;
                }
                dirty = true;
            }
            () = async { tokio::time::sleep_until(retry_at.unwrap_or_else(Instant::now)).await }, if retry_at.is_some() => {
                retry_at = None;
                dirty = true;
            }
        }
    }
}
