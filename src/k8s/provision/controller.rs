//! The provision controller: what the [`Shell`] runs as the external-provisioner's
//! controller loop, in process (the `ProvisionQueue` actor). It watches this node's
//! claims and PVs (filtered by the API server on the relay's label), keeps the claims
//! waiting for a volume here ([`waiting_here`]) and this driver's PVs, and runs a
//! provisioning for each such claim and a deletion for each Released PV of a Delete
//! class; the [`Executor`] reads and writes, the volume side is the [`ProvisionBackend`].
//!
//! Rules:
//! - A claim whose PV (named `pvc-<uid>`) is already kept is not provisioned again: the
//!   PV controller binds them.
//! - A claim is queued when it starts to wait here or changes while it waits; a PV when
//!   it changes. A relist replaces the kept sets and queues everything.
//! - A failed run retries with backoff; a claim handed back to the scheduler is done (it
//!   comes back if the scheduler picks this node again).
//! - The volumes whose claim may have gone before their PV was written are looked at
//!   after every list (a start, a relist) and every deletion of a claim: those whose
//!   claim still waits here or whose PV is kept are left at once, the others are judged
//!   against the API ([`Executor::sweep`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Client, ResourceExt};

use super::backend::ProvisionBackend;
use super::executor::{Executor, Ran};
use super::{deletable, key_of, volume_name, waiting_here};
use crate::k8s::shell::{Change, Controller, Pending, QueueConfig, Scope, Settings, Shell, Work};
use crate::k8s::workqueue::Outcome;

#[cfg(test)]
#[path = "fake_api_tests.rs"]
mod fake_api_tests;

/// How many claims or PVs are worked on at once (a 50-claim burst runs its CreateVolumes
/// and PV writes four at a time; the volume manager serialises what must be).
pub(crate) const WORKERS: usize = 4;

/// What is queued.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Key {
    /// A claim, `namespace/name`.
    Claim(String),
    /// A PV, by name.
    Volume(String),
    /// The volumes whose claim may have gone before their PV was written
    /// ([`super::abandoned`]): looked at after every list and every claim deletion.
    Abandoned,
}

/// What the provision controller adds to the shell's statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Claims waiting for a volume here.
    pub waiting: usize,
    /// This driver's PVs on this node.
    pub volumes: usize,
}

/// The provision queue actor: the shell running [`Provision`].
pub(crate) type ProvisionQueue<B> = Shell<Provision<B>>;

/// What the provision controller keeps and decides; see the module rules.
pub(crate) struct Provision<B: ProvisionBackend> {
    cfg: QueueConfig,
    backend: B,
    executor: Executor,
    /// Claims waiting here, by `namespace/name`.
    claims: BTreeMap<String, PersistentVolumeClaim>,
    /// This driver's PVs on this node, by name.
    pvs: BTreeMap<String, PersistentVolume>,
}

impl<B: ProvisionBackend> Shell<Provision<B>> {
    /// A queue talking to `client`, making volumes through `backend`, for a node of
    /// `topology`.
    pub(crate) fn new(client: Client, cfg: QueueConfig, backend: B, topology: BTreeMap<String, String>) -> Self {
        let executor = Executor::new(client.clone(), cfg.identity.clone(), topology);
        let p = Provision { cfg, backend, executor, claims: BTreeMap::new(), pvs: BTreeMap::new() };
        let settings = Settings { name: "provision queue", workers: WORKERS, resync: p.cfg.resync };
        Shell::with(client, settings, p.backend.clone(), p)
    }
}

/// An object without its managed fields (what is kept is read, never written back whole).
fn slim(mut m: ObjectMeta) -> ObjectMeta {
    m.managed_fields = None;
    m
}

impl<B: ProvisionBackend> Provision<B> {
    fn ours(&self, pv: &PersistentVolume) -> bool {
        crate::k8s::resize::our_volume(pv, &self.cfg.identity).is_some()
    }

    /// Whether `claim`'s PV is kept already.
    fn made(&self, claim: &PersistentVolumeClaim) -> bool {
        volume_name(claim).is_some_and(|n| self.pvs.contains_key(&n))
    }
}

impl<B: ProvisionBackend> Controller for Provision<B> {
    type First = PersistentVolumeClaim;
    type Second = PersistentVolume;
    type Key = Key;
    type Own = Counts;
    type Ran = (Ran, u32);

    fn scopes(&self) -> (Scope, Scope) {
        (Scope::node(&self.cfg.identity.node), Scope::node(&self.cfg.identity.node))
    }

    fn keep_first(&self, c: PersistentVolumeClaim) -> Option<PersistentVolumeClaim> {
        waiting_here(&c, &self.cfg.identity).then(|| PersistentVolumeClaim { metadata: slim(c.metadata), ..c })
    }

    fn keep_second(&self, pv: PersistentVolume) -> Option<PersistentVolume> {
        self.ours(&pv).then(|| PersistentVolume { metadata: slim(pv.metadata), ..pv })
    }

    fn first(&mut self, change: Change<PersistentVolumeClaim>, queue: &mut Pending<'_, Key>) {
        match change {
            Change::Listed(list) => self.claims = list.into_iter().map(|c| (key_of(&c), c)).collect(),
            Change::Applied(c) => {
                let key = key_of(&c);
                match self.keep_first(c) {
                    Some(c) => {
                        let changed = self.claims.get(&key).is_none_or(|old| old.spec != c.spec || old.annotations() != c.annotations());
                        self.claims.insert(key.clone(), c);
                        if changed {
                            queue.add(Key::Claim(key));
                        }
                    }
                    None => {
                        if self.claims.remove(&key).is_some() {
                            self.executor.forget(&key);
                        }
                    }
                }
            }
            Change::Deleted(c) => {
                let key = key_of(&c);
                self.claims.remove(&key);
                self.executor.forget(&key);
                queue.forget(&Key::Claim(key));
                queue.add(Key::Abandoned);
            }
        }
    }

    fn second(&mut self, change: Change<PersistentVolume>, queue: &mut Pending<'_, Key>) {
        match change {
            Change::Listed(list) => self.pvs = list.into_iter().map(|pv| (pv.name_any(), pv)).collect(),
            Change::Applied(pv) => {
                let name = pv.name_any();
                match self.keep_second(pv) {
                    Some(pv) => {
                        let changed = self.pvs.get(&name).is_none_or(|old| old.status != pv.status || old.spec != pv.spec);
                        self.pvs.insert(name.clone(), pv);
                        if changed {
                            queue.add(Key::Volume(name));
                        }
                    }
                    None => {
                        self.pvs.remove(&name);
                    }
                }
            }
            Change::Deleted(pv) => {
                let name = pv.name_any();
                self.pvs.remove(&name);
                queue.forget(&Key::Volume(name));
            }
        }
    }

    fn queue_all(&self, queue: &mut Pending<'_, Key>) {
        queue.add(Key::Abandoned);
        for k in self.claims.keys() {
            queue.add(Key::Claim(k.clone()));
        }
        for (n, pv) in &self.pvs {
            if deletable(pv, &self.cfg.identity).is_some() {
                queue.add(Key::Volume(n.clone()));
            }
        }
    }

    fn work(&mut self, key: &Key, failures: u32) -> Work<(Ran, u32)> {
        let (backend, executor) = (self.backend.clone(), self.executor.clone());
        match key {
            Key::Claim(k) => {
                let Some(claim) = self.claims.get(k).cloned() else { return Work::Now(Outcome::Done) };
                if self.made(&claim) {
                    return Work::Now(Outcome::Done);
                }
                Work::Run(Box::pin(async move { (executor.provision(claim, &backend).await, failures) }))
            }
            Key::Volume(n) => {
                let Some(pv) = self.pvs.get(n).cloned() else { return Work::Now(Outcome::Done) };
                if deletable(&pv, &self.cfg.identity).is_none() {
                    return Work::Now(Outcome::Done);
                }
                Work::Run(Box::pin(async move { (executor.delete(pv, &backend).await, failures) }))
            }
            Key::Abandoned => {
                let waiting: Vec<&str> = self.claims.values().filter_map(|c| c.metadata.uid.as_deref()).collect();
                let candidates: Vec<_> = backend
                    .abandoned()
                    .into_iter()
                    .filter(|a| !waiting.contains(&a.claim_uid.as_str()) && !self.pvs.contains_key(&a.name))
                    .collect();
                if candidates.is_empty() {
                    return Work::Now(Outcome::Done);
                }
                Work::Run(Box::pin(async move {
                    let mut ran = Ran::Done;
                    for a in &candidates {
                        if executor.sweep(a, &backend).await == Ran::Failed {
                            ran = Ran::Failed;
                        }
                    }
                    (ran, failures)
                }))
            }
        }
    }

    fn ran(&mut self, key: &Key, (ran, failures): (Ran, u32)) -> Outcome {
        match ran {
            Ran::Done => Outcome::Done,
            Ran::Rescheduled => {
                if let Key::Claim(k) = key {
                    self.claims.remove(k);
                }
                Outcome::Done
            }
            Ran::Failed => Outcome::Retry(self.cfg.policy.backoff(failures)),
            Ran::Waiting => Outcome::Retry(self.cfg.policy.base),
        }
    }

    fn own(&self, _lists: (u64, u64)) -> Counts {
        Counts { waiting: self.claims.len(), volumes: self.pvs.len() }
    }
}
