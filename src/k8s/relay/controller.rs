//! The relay task: one per cluster, run by the agent that holds the cluster duties'
//! Lease for as long as it holds it (`crate::k8s::duties::controller` starts and stops
//! it). It holds the one cluster-wide watch of PVs, claims, VolumeAttachments,
//! VolumeSnapshotContents and Drive objects, keeps a compact [`View`] of which node holds
//! what, and writes each object's node label (the decisions in [`super`]).
//!
//! Rules:
//! - The watches are paginated (500 a page) and restarted with backoff; a relist replaces
//!   what the view holds of that kind and looks at every object again, so nothing
//!   changed while a watch was down (or before this agent led) is missed.
//! - The view keeps a few strings an object, never the objects: about 0.5 KiB per volume
//!   in the cluster (its PV, claim and attachment), measured in BENCHMARKS.md.
//! - A change looks again at what it decides: a PV at itself, its claim and the contents
//!   of its volume; a Drive object at the contents of its volumes and snapshots.
//! - Writes are label-only merge patches of object metadata, at most [`IN_FLIGHT`] at
//!   once, one per object at a time; a write that fails (other than the object being
//!   gone) is tried again after [`RETRY_AFTER`]. A written label is remembered at once, so
//!   the watch event it causes writes nothing more.
//! - A kind the API server does not serve (the snapshot CRDs not installed) is said once
//!   at info level and watched for with backoff.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::pin::Pin;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Client, Resource, ResourceExt};
use serde_json::Value;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_stream::{Stream, StreamExt};
use tracing::{debug, info, warn};

use super::{claim_node, content_node, label_patch, provisioned_by, selected_node, va_node, NODE_LABEL};
use crate::k8s::crd::Drive;
use crate::k8s::duties::pv_node;
use crate::k8s::scope::{self, Scope};
use crate::k8s::snapshot::objects::VolumeSnapshotContent;

/// How many label writes are under way at once.
pub(crate) const IN_FLIGHT: usize = 8;

/// How long a failed label write waits before it is tried again.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(2);

/// An object the relay may label.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Target {
    /// A PersistentVolume, by name.
    Pv(String),
    /// A claim, by namespace and name.
    Claim(String, String),
    /// A VolumeAttachment, by name.
    Va(String),
    /// A VolumeSnapshotContent, by name.
    Content(String),
}

impl Target {
    /// The resource, for logs and the relayed counter.
    fn resource(&self) -> &'static str {
        match self {
            Target::Pv(_) => "persistentvolumes",
            Target::Claim(..) => "persistentvolumeclaims",
            Target::Va(_) => "volumeattachments",
            Target::Content(_) => "volumesnapshotcontents",
        }
    }
}

/// What the view keeps of a PV of the driver.
#[derive(Debug, Default)]
struct PvEntry {
    handle: String,
    node: Option<String>,
    claim: Option<(String, String)>,
    label: Option<String>,
}

/// What the view keeps of a claim.
#[derive(Debug, Default)]
struct ClaimEntry {
    volume: Option<String>,
    selected: Option<String>,
    ours: bool,
    label: Option<String>,
}

/// What the view keeps of a VolumeAttachment of the driver.
#[derive(Debug, Default)]
struct VaEntry {
    node: String,
    label: Option<String>,
}

/// What the view keeps of a VolumeSnapshotContent of the driver.
#[derive(Debug, Default)]
struct ContentEntry {
    volume: Option<String>,
    snapshot: Option<String>,
    label: Option<String>,
}

/// Which node holds what, as the relay's watches show it (see the module rules).
#[derive(Debug, Default)]
pub(crate) struct View {
    driver: String,
    pvs: HashMap<String, PvEntry>,
    /// Volume handle -> PV name.
    pv_of_handle: HashMap<String, String>,
    /// Claim -> the PV whose claimRef names it.
    pv_of_claim: HashMap<(String, String), String>,
    claims: HashMap<(String, String), ClaimEntry>,
    vas: HashMap<String, VaEntry>,
    contents: HashMap<String, ContentEntry>,
    /// Volume or snapshot handle -> the contents naming it.
    contents_of: HashMap<String, BTreeSet<String>>,
    /// Drive object -> its node and the volume and snapshot ids it lists.
    drives: HashMap<String, (String, Vec<String>)>,
    /// Volume or snapshot id -> the node whose Drive object lists it.
    id_node: HashMap<String, String>,
}

fn label_of<K: Resource>(o: &K) -> Option<String> {
    o.meta().labels.as_ref()?.get(NODE_LABEL).cloned()
}

fn claim_key(c: &PersistentVolumeClaim) -> (String, String) {
    (c.namespace().unwrap_or_default(), c.name_any())
}

impl View {
    /// An empty view for `driver`.
    pub(crate) fn new(driver: &str) -> Self {
        Self { driver: driver.to_string(), ..Default::default() }
    }

    /// How many objects of each kind the view holds: PVs, claims, attachments, contents,
    /// Drive objects.
    #[cfg(test)]
    pub(crate) fn counts(&self) -> [usize; 5] {
        [self.pvs.len(), self.claims.len(), self.vas.len(), self.contents.len(), self.drives.len()]
    }

    fn content_targets(&self, handle: &str, out: &mut Vec<Target>) {
        out.extend(self.contents_of.get(handle).into_iter().flatten().map(|c| Target::Content(c.clone())));
    }

    /// A PV arrived or changed: what to look at again.
    pub(crate) fn apply_pv(&mut self, pv: &PersistentVolume) -> Vec<Target> {
        let name = pv.name_any();
        let mut out = self.delete_pv(&name);
        let Some(handle) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()).filter(|c| c.driver == self.driver).map(|c| c.volume_handle.clone())
        else {
            return out;
        };
        let claim = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).and_then(|r| Some((r.namespace.clone()?, r.name.clone()?)));
        let node = pv_node(pv, &self.driver).map(String::from);
        if let Some(c) = &claim {
            self.pv_of_claim.insert(c.clone(), name.clone());
            out.push(Target::Claim(c.0.clone(), c.1.clone()));
        }
        self.pv_of_handle.insert(handle.clone(), name.clone());
        self.content_targets(&handle, &mut out);
        self.pvs.insert(name.clone(), PvEntry { handle, node, claim, label: label_of(pv) });
        out.push(Target::Pv(name));
        out
    }

    /// A PV is gone: what to look at again.
    pub(crate) fn delete_pv(&mut self, name: &str) -> Vec<Target> {
        let mut out = Vec::new();
        if let Some(old) = self.pvs.remove(name) {
            if self.pv_of_handle.get(&old.handle).is_some_and(|p| p == name) {
                self.pv_of_handle.remove(&old.handle);
            }
            if let Some(c) = old.claim {
                if self.pv_of_claim.get(&c).is_some_and(|p| p == name) {
                    self.pv_of_claim.remove(&c);
                }
                out.push(Target::Claim(c.0, c.1));
            }
            self.content_targets(&old.handle, &mut out);
        }
        out
    }

    /// A claim arrived or changed.
    pub(crate) fn apply_claim(&mut self, c: &PersistentVolumeClaim) -> Vec<Target> {
        let key = claim_key(c);
        let entry = ClaimEntry {
            volume: c.spec.as_ref().and_then(|s| s.volume_name.clone()).filter(|v| !v.is_empty()),
            selected: selected_node(c).map(String::from),
            ours: provisioned_by(c, &self.driver),
            label: label_of(c),
        };
        self.claims.insert(key.clone(), entry);
        vec![Target::Claim(key.0, key.1)]
    }

    /// A claim is gone.
    pub(crate) fn delete_claim(&mut self, key: &(String, String)) {
        self.claims.remove(key);
    }

    /// A VolumeAttachment arrived or changed.
    pub(crate) fn apply_va(&mut self, va: &VolumeAttachment) -> Vec<Target> {
        let name = va.name_any();
        match va_node(va, &self.driver) {
            Some(node) => {
                self.vas.insert(name.clone(), VaEntry { node: node.to_string(), label: label_of(va) });
                vec![Target::Va(name)]
            }
            None => {
                self.vas.remove(&name);
                Vec::new()
            }
        }
    }

    /// A VolumeAttachment is gone.
    pub(crate) fn delete_va(&mut self, name: &str) {
        self.vas.remove(name);
    }

    /// A VolumeSnapshotContent arrived or changed.
    pub(crate) fn apply_content(&mut self, c: &VolumeSnapshotContent) -> Vec<Target> {
        let name = c.name_any();
        self.delete_content(&name);
        if c.spec.driver != self.driver {
            return Vec::new();
        }
        let volume = c.spec.source.volume_handle.clone().filter(|h| !h.is_empty());
        let snapshot = c
            .status
            .as_ref()
            .and_then(|s| s.snapshot_handle.clone())
            .or_else(|| c.spec.source.snapshot_handle.clone())
            .filter(|h| !h.is_empty());
        for h in volume.iter().chain(snapshot.iter()) {
            self.contents_of.entry(h.clone()).or_default().insert(name.clone());
        }
        self.contents.insert(name.clone(), ContentEntry { volume, snapshot, label: label_of(c) });
        vec![Target::Content(name)]
    }

    /// A VolumeSnapshotContent is gone.
    pub(crate) fn delete_content(&mut self, name: &str) {
        if let Some(old) = self.contents.remove(name) {
            for h in old.volume.iter().chain(old.snapshot.iter()) {
                if let Some(set) = self.contents_of.get_mut(h) {
                    set.remove(name);
                    if set.is_empty() {
                        self.contents_of.remove(h);
                    }
                }
            }
        }
    }

    /// A Drive object arrived or changed.
    pub(crate) fn apply_drive(&mut self, d: &Drive) -> Vec<Target> {
        let name = d.name_any();
        let mut out = self.delete_drive(&name);
        let ids: Vec<String> =
            d.status.iter().flat_map(|s| s.volumes.iter().chain(s.snapshots.iter())).cloned().collect();
        for id in &ids {
            self.id_node.insert(id.clone(), d.spec.node.clone());
            self.content_targets(id, &mut out);
        }
        self.drives.insert(name, (d.spec.node.clone(), ids));
        out
    }

    /// A Drive object is gone.
    pub(crate) fn delete_drive(&mut self, name: &str) -> Vec<Target> {
        let mut out = Vec::new();
        if let Some((node, ids)) = self.drives.remove(name) {
            for id in ids {
                if self.id_node.get(&id).is_some_and(|n| *n == node) {
                    self.id_node.remove(&id);
                }
                self.content_targets(&id, &mut out);
            }
        }
        out
    }

    fn node_of_handle(&self, handle: &str) -> Option<&str> {
        let by_pv = self.pv_of_handle.get(handle).and_then(|p| self.pvs.get(p)).and_then(|pv| pv.node.as_deref());
        by_pv.or_else(|| self.id_node.get(handle).map(String::as_str))
    }

    /// The node `target` belongs to, and the label it carries now.
    pub(crate) fn want(&self, target: &Target) -> Option<(&str, Option<&str>)> {
        match target {
            Target::Pv(name) => {
                let pv = self.pvs.get(name)?;
                Some((pv.node.as_deref()?, pv.label.as_deref()))
            }
            Target::Claim(ns, name) => {
                let key = (ns.clone(), name.clone());
                let c = self.claims.get(&key)?;
                let pv = c.volume.as_ref().or_else(|| self.pv_of_claim.get(&key)).and_then(|p| self.pvs.get(p));
                let node = claim_node(pv.and_then(|p| p.node.as_deref()), c.selected.as_deref(), c.ours)?;
                Some((node, c.label.as_deref()))
            }
            Target::Va(name) => {
                let va = self.vas.get(name)?;
                Some((va.node.as_str(), va.label.as_deref()))
            }
            Target::Content(name) => {
                let c = self.contents.get(name)?;
                let node = content_node(
                    c.volume.as_deref().and_then(|h| self.node_of_handle(h)),
                    c.snapshot.as_deref().and_then(|h| self.id_node.get(h).map(String::as_str)),
                )?;
                Some((node, c.label.as_deref()))
            }
        }
    }

    /// The label patch `target` needs now, if any.
    pub(crate) fn patch_for(&self, target: &Target) -> Option<Value> {
        let (node, label) = self.want(target)?;
        label_patch(label, node)
    }

    /// `target` was written with `node`'s label.
    pub(crate) fn labelled(&mut self, target: &Target, value: String) {
        let slot = match target {
            Target::Pv(n) => self.pvs.get_mut(n).map(|e| &mut e.label),
            Target::Claim(ns, n) => self.claims.get_mut(&(ns.clone(), n.clone())).map(|e| &mut e.label),
            Target::Va(n) => self.vas.get_mut(n).map(|e| &mut e.label),
            Target::Content(n) => self.contents.get_mut(n).map(|e| &mut e.label),
        };
        if let Some(slot) = slot {
            *slot = Some(value);
        }
    }

    /// Every object the view holds, to look at after a relist.
    fn all_targets(&self, kind: Kind) -> Vec<Target> {
        match kind {
            Kind::Pv => self.pvs.keys().map(|n| Target::Pv(n.clone())).collect(),
            Kind::Claim => self.claims.keys().map(|(ns, n)| Target::Claim(ns.clone(), n.clone())).collect(),
            Kind::Va => self.vas.keys().map(|n| Target::Va(n.clone())).collect(),
            Kind::Content | Kind::Drive => self.contents.keys().map(|n| Target::Content(n.clone())).collect(),
        }
    }

    /// Forgets the objects of `kind` not in `listed` (gone while the watch was down).
    fn keep_only(&mut self, kind: Kind, listed: &HashSet<String>) -> Vec<Target> {
        let mut out = Vec::new();
        match kind {
            Kind::Pv => {
                let gone: Vec<String> = self.pvs.keys().filter(|k| !listed.contains(*k)).cloned().collect();
                for n in gone {
                    out.extend(self.delete_pv(&n));
                }
            }
            Kind::Claim => self.claims.retain(|(ns, n), _| listed.contains(&format!("{ns}/{n}"))),
            Kind::Va => self.vas.retain(|n, _| listed.contains(n)),
            Kind::Content => {
                let gone: Vec<String> = self.contents.keys().filter(|k| !listed.contains(*k)).cloned().collect();
                for n in gone {
                    self.delete_content(&n);
                }
            }
            Kind::Drive => {
                let gone: Vec<String> = self.drives.keys().filter(|k| !listed.contains(*k)).cloned().collect();
                for n in gone {
                    out.extend(self.delete_drive(&n));
                }
            }
        }
        out
    }
}

/// The kinds the relay watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pv,
    Claim,
    Va,
    Content,
    Drive,
}

/// One item of one of the relay's watches.
enum Seen {
    Pv(Result<Event<PersistentVolume>, watcher::Error>),
    Claim(Result<Event<PersistentVolumeClaim>, watcher::Error>),
    Va(Result<Event<VolumeAttachment>, watcher::Error>),
    Content(Result<Event<VolumeSnapshotContent>, watcher::Error>),
    Drive(Result<Event<Drive>, watcher::Error>),
}

type Items = Pin<Box<dyn Stream<Item = Seen> + Send>>;

fn watch<K>(client: &Client, wrap: fn(Result<Event<K>, watcher::Error>) -> Seen) -> Items
where
    K: Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    let api: Api<K> = Api::all(client.clone());
    Box::pin(watcher(api, Scope::Cluster.config()).default_backoff().map(wrap))
}

/// The name an object is listed under, for a relist's bookkeeping.
fn listed_name<K: Resource>(o: &K) -> String {
    match &o.meta().namespace {
        Some(ns) => format!("{ns}/{}", o.meta().name.as_deref().unwrap_or("")),
        None => o.meta().name.clone().unwrap_or_default(),
    }
}

/// The relay's state while it runs.
struct Relay {
    client: Client,
    view: View,
    /// Objects listed since each kind's last `Init`.
    listing: HashMap<&'static str, HashSet<String>>,
    /// Labels to write, by object.
    pending: BTreeSet<Target>,
    /// Objects being written.
    writing: BTreeSet<Target>,
    /// Failed writes, tried again then.
    retry: BTreeMap<Target, Instant>,
    writes: JoinSet<(Target, String, Result<(), kube::Error>)>,
    /// Kinds the API server did not serve, said once.
    unserved: BTreeSet<&'static str>,
}

impl Relay {
    fn look(&mut self, targets: Vec<Target>) {
        for t in targets {
            if self.view.patch_for(&t).is_some() {
                self.pending.insert(t);
            }
        }
    }

    /// One watch event of `kind` for `object`, by the view's `apply` / `delete`.
    fn event<K: Resource<DynamicType = ()>>(
        &mut self,
        kind: Kind,
        event: Result<Event<K>, watcher::Error>,
        apply: impl Fn(&mut View, &K) -> Vec<Target>,
        delete: impl Fn(&mut View, &K) -> Vec<Target>,
    ) {
        let plural: &'static str = match kind {
            Kind::Pv => "persistentvolumes",
            Kind::Claim => "persistentvolumeclaims",
            Kind::Va => "volumeattachments",
            Kind::Content => "volumesnapshotcontents",
            Kind::Drive => "drives",
        };
        let event = match event {
            Ok(e) => e,
            Err(e) => {
                let text = e.to_string();
                if text.contains("404") && text.contains("NotFound") {
                    if self.unserved.insert(plural) {
                        info!(resource = plural, "the API server does not serve {plural} (its CRD is not installed); the relay watches for it with backoff");
                    }
                } else {
                    warn!(resource = plural, error = %e, "the relay's watch failed; it restarts with backoff");
                }
                return;
            }
        };
        scope::count(&event, &Scope::Cluster);
        match event {
            Event::Init => {
                self.listing.insert(plural, HashSet::new());
            }
            Event::InitApply(o) => {
                if let Some(l) = self.listing.get_mut(plural) {
                    l.insert(listed_name(&o));
                }
                let t = apply(&mut self.view, &o);
                self.look(t);
            }
            Event::InitDone => {
                let listed = self.listing.remove(plural).unwrap_or_default();
                let mut t = self.view.keep_only(kind, &listed);
                t.extend(self.view.all_targets(kind));
                debug!(resource = plural, listed = listed.len(), "the relay listed {plural}");
                self.look(t);
            }
            Event::Apply(o) => {
                let t = apply(&mut self.view, &o);
                self.look(t);
            }
            Event::Delete(o) => {
                let t = delete(&mut self.view, &o);
                self.look(t);
            }
        }
    }

    fn seen(&mut self, item: Seen) {
        match item {
            Seen::Pv(e) => self.event(Kind::Pv, e, View::apply_pv, |v, o| v.delete_pv(&o.name_any())),
            Seen::Claim(e) => self.event(Kind::Claim, e, View::apply_claim, |v, o| {
                v.delete_claim(&claim_key(o));
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
        }
    }

    /// Starts the writes there is room for.
    fn start_writes(&mut self) {
        while self.writing.len() < IN_FLIGHT {
            let Some(t) = self.pending.iter().find(|t| !self.writing.contains(*t)).cloned() else { break };
            self.pending.remove(&t);
            let Some((node, _)) = self.view.want(&t) else { continue };
            let Some(patch) = label_patch(self.view.want(&t).and_then(|w| w.1), node) else { continue };
            let value = crate::k8s::drives::node_label_value(node);
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
                self.view.labelled(&t, value);
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
        for t in due {
            self.retry.remove(&t);
            self.look(vec![t]);
        }
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

/// Runs the relay for `driver` until it is aborted (the Lease lost or given up).
pub(crate) async fn run(client: Client, driver: String) {
    let claims: Api<PersistentVolumeClaim> = Api::all(client.clone());
    let items = watch::<PersistentVolume>(&client, Seen::Pv)
        .merge(Box::pin(watcher(claims, Scope::Cluster.config()).default_backoff().map(Seen::Claim)) as Items)
        .merge(watch::<VolumeAttachment>(&client, Seen::Va))
        .merge(watch::<VolumeSnapshotContent>(&client, Seen::Content))
        .merge(watch::<Drive>(&client, Seen::Drive));
    let mut items = Box::pin(items);
    let mut relay = Relay {
        client,
        view: View::new(&driver),
        listing: HashMap::new(),
        pending: BTreeSet::new(),
        writing: BTreeSet::new(),
        retry: BTreeMap::new(),
        writes: JoinSet::new(),
        unserved: BTreeSet::new(),
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    info!("relaying: labelling PVs, claims, VolumeAttachments and VolumeSnapshotContents with their node");
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
