//! The snapshot controller: what the [`Shell`] runs as the csi-snapshotter sidecar's
//! controller loop, in process (the `SnapshotQueue` actor). It watches
//! VolumeSnapshotContents and VolumeSnapshotClasses, keeps this driver's, and for each
//! content asks the volume side what this node holds (the source volume, the snapshot)
//! and runs [`plan`](super::plan); [`Executor`] writes the content and the Events, and
//! the volume side is the [`SnapshotBackend`]. Watches, relists, the work queue,
//! readiness and resync are the shell's (see its rules).
//!
//! Rules:
//! - Contents are this node's, filtered by the API server on the label the elected
//!   agent's relay sets (`crate::k8s::relay`: the node of the content's source volume or
//!   of its snapshot; the snapshot-controller, run without distributed snapshotting,
//!   puts no node on a content). Classes are a cluster-scoped setting, watched whole.
//!   Both are kept only when their driver is ours, contents stripped to what the
//!   decisions read.
//! - A content labelled for another node is never run; any other content of ours is run
//!   once its owner is known: this node holds its volume or snapshot (asked of the volume
//!   side on every run, as the sidecar asks the driver), or the label names this node.
//! - A content is queued when a change matters to the decisions: its spec, deletion
//!   timestamp, finalizers, or an annotation other than the snapshotter's own
//!   `volumesnapshot-being-created`; never for the snapshotter's own status and label
//!   writes, so a failure waits out its delay and never spins on its own write. A class
//!   change queues the contents that name it and are not ready.
//! - A relist replaces the kept sets and queues every content, so a VolumeSnapshot made
//!   or deleted while the watch was down (or the agent restarted) is not lost.
//! - Volume side errors and API errors retry with backoff.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Client, ResourceExt};
use tracing::{debug, warn};

use super::backend::SnapshotBackend;
use super::executor::{Executor, Ran};
use super::objects::{VolumeSnapshotClass, VolumeSnapshotContent};
use super::{is_ready, labelled_node, plan, snapshot_handle, snapshot_name, Held, Plan, BEING_CREATED};
pub(crate) use crate::k8s::shell::QueueConfig;
use crate::k8s::shell::{Change, Controller, Pending, Scope, Settings, Shell, Work};
use crate::k8s::workqueue::Outcome;

#[cfg(test)]
#[path = "fake_api_tests.rs"]
mod fake_api_tests;

/// How many contents are worked on at once.
pub(crate) const WORKERS: usize = 2;

/// What the snapshot controller adds to the shell's statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Contents {
    /// This driver's contents kept (any node's).
    pub contents: usize,
    /// This driver's classes kept.
    pub classes: usize,
}

/// Query: the queue's statistics (asked by the tests only).
#[cfg(test)]
pub(crate) type GetSnapshotStats = crate::k8s::shell::GetStats<Contents>;

/// The snapshot queue actor: the shell running [`Snapshots`].
pub(crate) type SnapshotQueue<B> = Shell<Snapshots<B>>;

/// What the snapshot controller keeps and decides; see the module rules.
pub(crate) struct Snapshots<B: SnapshotBackend> {
    cfg: QueueConfig,
    backend: B,
    executor: Executor,
    /// This driver's contents by name, stripped.
    contents: BTreeMap<String, VolumeSnapshotContent>,
    /// This driver's classes by name.
    classes: BTreeMap<String, VolumeSnapshotClass>,
}

/// What a run of a content hands back: the delay to retry after when the volume side
/// could not answer, or what the executor did.
type Run = Result<Ran, Duration>;

impl<B: SnapshotBackend> Shell<Snapshots<B>> {
    /// A queue talking to `client`, taking snapshots through `backend`.
    pub(crate) fn new(client: Client, cfg: QueueConfig, backend: B) -> Self {
        let executor = Executor::new(client.clone(), &cfg.identity, cfg.policy);
        let snapshots = Snapshots { cfg, backend, executor, contents: BTreeMap::new(), classes: BTreeMap::new() };
        let settings = Settings { name: "snapshot queue", workers: WORKERS, resync: snapshots.cfg.resync };
        Shell::with(client, settings, snapshots.backend.clone(), snapshots)
    }
}

/// A content stripped to what the decisions read.
fn slim(c: VolumeSnapshotContent) -> VolumeSnapshotContent {
    let m = c.metadata;
    let metadata = ObjectMeta {
        name: m.name,
        uid: m.uid,
        resource_version: m.resource_version,
        annotations: m.annotations,
        labels: m.labels.map(|l| l.into_iter().filter(|(k, _)| k == super::NODE_LABEL).collect()),
        finalizers: m.finalizers,
        deletion_timestamp: m.deletion_timestamp,
        ..Default::default()
    };
    VolumeSnapshotContent { metadata, spec: c.spec, status: c.status }
}

/// Whether `new` differs from `old` in what queues a content (see the module rules).
pub(crate) fn content_differs(old: &VolumeSnapshotContent, new: &VolumeSnapshotContent) -> bool {
    let others = |c: &VolumeSnapshotContent| {
        c.metadata.annotations.clone().unwrap_or_default().into_iter().filter(|(k, _)| k != BEING_CREATED).collect::<BTreeMap<_, _>>()
    };
    old.spec != new.spec
        || old.metadata.deletion_timestamp != new.metadata.deletion_timestamp
        || old.metadata.finalizers != new.metadata.finalizers
        || others(old) != others(new)
}

impl<B: SnapshotBackend> Snapshots<B> {
    fn ours(&self, c: &VolumeSnapshotContent) -> bool {
        c.spec.driver == self.cfg.identity.driver
    }

    fn elsewhere(&self, c: &VolumeSnapshotContent) -> bool {
        labelled_node(c).is_some_and(|n| n != self.cfg.identity.node)
    }
}

impl<B: SnapshotBackend> Controller for Snapshots<B> {
    type First = VolumeSnapshotContent;
    type Second = VolumeSnapshotClass;
    type Key = String;
    type Own = Contents;
    type Ran = Run;

    fn scopes(&self) -> (Scope, Scope) {
        (Scope::node(&self.cfg.identity.node), Scope::Cluster)
    }

    fn keep_first(&self, c: VolumeSnapshotContent) -> Option<VolumeSnapshotContent> {
        self.ours(&c).then(|| slim(c))
    }

    fn keep_second(&self, k: VolumeSnapshotClass) -> Option<VolumeSnapshotClass> {
        (k.driver == self.cfg.identity.driver).then_some(k)
    }

    fn first(&mut self, change: Change<VolumeSnapshotContent>, queue: &mut Pending<'_, String>) {
        match change {
            Change::Listed(list) => self.contents = list.into_iter().map(|c| (c.name_any(), c)).collect(),
            Change::Applied(c) => {
                let name = c.name_any();
                if !self.ours(&c) {
                    self.contents.remove(&name);
                    return;
                }
                let c = slim(c);
                let changed = self.contents.get(&name).is_none_or(|old| content_differs(old, &c));
                self.contents.insert(name.clone(), c);
                if changed {
                    queue.add(name);
                }
            }
            Change::Deleted(c) => {
                let name = c.name_any();
                self.contents.remove(&name);
                queue.forget(&name);
            }
        }
    }

    fn second(&mut self, change: Change<VolumeSnapshotClass>, queue: &mut Pending<'_, String>) {
        match change {
            Change::Listed(list) => self.classes = list.into_iter().map(|k| (k.name_any(), k)).collect(),
            Change::Applied(k) => {
                let name = k.name_any();
                if k.driver != self.cfg.identity.driver {
                    self.classes.remove(&name);
                    return;
                }
                let changed = self.classes.get(&name).is_none_or(|old| old.parameters != k.parameters || old.driver != k.driver);
                self.classes.insert(name.clone(), k);
                if changed {
                    let named = |c: &&VolumeSnapshotContent| c.spec.volume_snapshot_class_name.as_deref() == Some(name.as_str());
                    for c in self.contents.values().filter(named).filter(|c| !is_ready(c)) {
                        queue.add(c.name_any());
                    }
                }
            }
            Change::Deleted(k) => {
                self.classes.remove(&k.name_any());
            }
        }
    }

    fn queue_all(&self, queue: &mut Pending<'_, String>) {
        for (name, _) in self.contents.iter().filter(|(_, c)| !self.elsewhere(c)) {
            queue.add(name.clone());
        }
    }

    fn work(&mut self, key: &String, failures: u32) -> Work<Run> {
        let Some(c) = self.contents.get(key).cloned() else { return Work::Now(Outcome::Done) };
        if self.elsewhere(&c) {
            return Work::Now(Outcome::Done);
        }
        let (backend, executor, classes, identity, policy) =
            (self.backend.clone(), self.executor.clone(), self.classes.clone(), self.cfg.identity.clone(), self.cfg.policy);
        Work::Run(Box::pin(async move {
            let asked = async {
                let volume = match c.spec.source.volume_handle.as_deref() {
                    Some(v) => backend.holds_volume(v).await?,
                    None => false,
                };
                let snapshots = backend.snapshots().await?;
                Ok::<_, crate::k8s::KubeError>((volume, snapshots))
            };
            let (volume, snapshots) = match asked.await {
                Ok(found) => found,
                Err(e) => {
                    warn!(snapshot.content = %c.name_any(), error = %e, "volume manager not ready for this content; retrying");
                    return Err(policy.backoff(failures));
                }
            };
            let handle = snapshot_handle(&c);
            let name = snapshot_name(c.spec.volume_snapshot_ref.uid.as_deref().unwrap_or(""));
            let snapshot = snapshots.iter().find(|s| Some(s.id.as_str()) == handle || (handle.is_none() && name.as_ref() == Some(&s.name)));
            let plan = plan(&c, &classes, Held { volume, snapshot }, &identity);
            if let Plan::Nothing(why) = plan {
                debug!(snapshot.content = %c.name_any(), why, "nothing to do");
                return Ok(Ran { outcome: Outcome::Done, content: c });
            }
            executor.run(c, plan, &backend, failures).await.map_err(|e| {
                warn!(error = %e, failures = failures + 1, "cannot update the API server; retrying");
                policy.backoff(failures)
            })
        }))
    }

    fn own(&self, _lists: (u64, u64)) -> Contents {
        Contents { contents: self.contents.len(), classes: self.classes.len() }
    }

    fn ran(&mut self, key: &String, run: Run) -> Outcome {
        let ran = match run {
            Err(after) => return Outcome::Retry(after),
            Ok(ran) => ran,
        };
        // Keep what was written, so a rerun before the watch catches up does not act on
        // the old content.
        if self.contents.contains_key(key) {
            self.contents.insert(key.clone(), slim(ran.content));
        }
        ran.outcome
    }
}
