//! Carries re-homing out against the API server: reads each volume's PV and claim,
//! decides ([`super::decide`]) and performs the steps in order, stopping at the first
//! failure (the next pass decides again from what it reads).
//!
//! Rules:
//! - A pass reads this node's Drive objects (by label: whose adoption asks to restore
//!   claims), and per volume with a PV name its PV and the claim [`super::claim_to_read`]
//!   names: two GETs a volume. Nothing is listed cluster-wide.
//! - The loop ([`run`]) starts once the volume manager serves, asks it for its volumes
//!   every [`TICK`], and makes a pass when they changed (a drive was adopted, a volume
//!   created or deleted) or every [`RECHECK`] as a safety net, every [`RETRY`] while a
//!   pass left work or failed.
//! - A delete or a finalizer patch answered 404 is done; a create answered 409 (the old
//!   PV still going, the claim there already) is left to the next pass.
//! - Each step is logged with `node.name`, `volume.id` and the object; why nothing is
//!   done for a volume is logged once, when it changes.
//! - A task spawned for the agent's life, not a controller of the shell
//!   (`crate::k8s::shell`): its input is the volume manager's served volumes, not a
//!   watch, and a pass reads the few PVs and claims they name; a cluster-wide watch of
//!   every PV and claim would be the shell's way, for a rare event (an adoption).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use super::{claim_to_read, decide, Seen, Step, POLICY_BEFORE};
use crate::actors::volumes::model::{VolumeRecord, VolumeState};
use crate::actors::volumes::{ListServedVolumes, SetBinding};
use crate::k8s::crd::{Drive, DriveAction};
use crate::k8s::drives::{node_label_value, NODE_LABEL};
use crate::k8s::identity::Identity;
use crate::k8s::shell::Ready;
use crate::k8s::KubeError;
pub(crate) use crate::k8s::volume_manager::ManagerBackend;
use crate::words::Binding;

/// How often the loop asks the volume manager whether its volumes changed.
pub(crate) const TICK: Duration = Duration::from_secs(5);

/// How often a pass runs when nothing changed.
pub(crate) const RECHECK: Duration = Duration::from_secs(300);

/// How soon a pass runs again after one that left work or failed.
pub(crate) const RETRY: Duration = Duration::from_secs(10);

/// Why a pass (or a step of it) did not finish.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RehomeError {
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// What was asked, in plain words (`deleting PersistentVolume pv-1`).
        what: String,
        /// The API error.
        source: kube::Error,
    },
    /// The volume manager refused or did not answer.
    #[error("{0}")]
    Volumes(#[from] KubeError),
}

fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> RehomeError {
    let what = what.into();
    move |source| RehomeError::Api { what, source }
}

fn is_code(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// The volume side: this node's volumes, and recording a volume's binding.
pub(crate) trait RehomeBackend: Ready + Send + Sync + 'static {
    /// The volumes this node serves now (never a record whose drive is gone: a disk
    /// moved to another node and adopted there is that node's to re-home).
    fn volumes(&self) -> impl Future<Output = Result<Vec<VolumeRecord>, KubeError>> + Send;
    /// Records `binding` as `volume_id`'s.
    fn set_binding(&self, volume_id: &str, binding: Binding) -> impl Future<Output = Result<(), KubeError>> + Send;
}

impl RehomeBackend for ManagerBackend {
    async fn volumes(&self) -> Result<Vec<VolumeRecord>, KubeError> {
        self.volumes().send(ListServedVolumes).await.map_err(KubeError::unanswered(""))
    }

    async fn set_binding(&self, volume_id: &str, binding: Binding) -> Result<(), KubeError> {
        let m = SetBinding { volume_id: volume_id.to_string(), binding };
        self.volumes().send(m).await.map_err(KubeError::unanswered(volume_id))?.map_err(KubeError::volume(volume_id))
    }
}

/// Talks to the API server for re-homing.
pub(crate) struct Executor {
    client: Client,
    identity: Identity,
    recorder: Recorder,
    /// Why nothing was done, by volume id, as last logged.
    told: HashMap<String, String>,
    /// This node's PVs and claims, when the agent keeps them.
    cache: Option<crate::k8s::cache::NodeCache>,
}

/// The volumes a pass looks at: live volumes with a PV name.
fn candidates(volumes: &[VolumeRecord]) -> impl Iterator<Item = &VolumeRecord> {
    volumes.iter().filter(|r| r.is_volume() && !r.failed && r.state != VolumeState::Creating && !r.binding.pv.is_empty())
}

impl Executor {
    /// An executor for `identity`'s driver and node.
    pub(crate) fn new(client: Client, identity: Identity) -> Self {
        let recorder = Recorder::new(client.clone(), identity.reporter());
        Self { client, identity, recorder, told: HashMap::new(), cache: None }
    }

    /// The drives of this node whose adoption asks to restore claims.
    async fn restoring(&self) -> Result<Vec<String>, RehomeError> {
        let lp = ListParams::default().labels(&format!("{NODE_LABEL}={}", node_label_value(&self.identity.node)));
        let drives = Api::<Drive>::all(self.client.clone()).list(&lp).await.map_err(api("listing this node's Drive objects"))?;
        Ok(drives
            .items
            .into_iter()
            .filter(|d| d.spec.node == self.identity.node && d.spec.action == Some(DriveAction::Adopt) && d.spec.restore_claims == Some(true))
            .map(|d| d.spec.drive_id)
            .collect())
    }

    /// One pass over `volumes`: answers whether any volume had work (so the next pass
    /// comes soon, to see it done).
    pub(crate) async fn pass<B: RehomeBackend>(&mut self, volumes: &[VolumeRecord], backend: &B) -> Result<bool, RehomeError> {
        if candidates(volumes).next().is_none() {
            return Ok(false);
        }
        // Which drives restore claims matters only to a volume whose PV and claim are
        // both gone: read once a pass, and only then.
        let mut restoring: Option<Vec<String>> = None;
        let mut worked = false;
        let mut failed = None;
        for rec in candidates(volumes) {
            match self.volume(rec, &mut restoring, backend).await {
                Ok(w) => worked |= w,
                Err(e) => {
                    warn!(node.name = %self.identity.node, volume.id = %rec.id, error = %e,
                          "re-homing a volume's claim did not finish; tried again in {}s", RETRY.as_secs());
                    failed = Some(e);
                }
            }
        }
        failed.map_or(Ok(worked), Err)
    }

    /// Reads, decides and acts for one volume: answers whether there was work.
    async fn volume<B: RehomeBackend>(&mut self, rec: &VolumeRecord, restoring: &mut Option<Vec<String>>, backend: &B) -> Result<bool, RehomeError> {
        let pv_name = rec.binding.pv.clone();
        // This node's cache holds the PV of a volume already homed here (the relay
        // labelled it): no request. One pinned elsewhere, or gone, is read.
        let cache = self.cache.as_ref().filter(|c| c.ready());
        let pv = match cache.and_then(|c| c.pv(&pv_name)) {
            Some(pv) => Some(PersistentVolume::clone(&pv)),
            None => {
                let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
                pvs.get_opt(&pv_name).await.map_err(api(format!("reading PersistentVolume {pv_name}")))?
            }
        };
        let claim = match claim_to_read(rec, pv.as_ref()) {
            Some((ns, name)) => match cache.and_then(|c| c.claim(&ns, &name)) {
                Some(c) => Some(PersistentVolumeClaim::clone(&c)),
                None => Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &ns)
                    .get_opt(&name)
                    .await
                    .map_err(api(format!("reading claim {ns}/{name}")))?,
            },
            None => None,
        };
        let restore_claims = if pv.is_none() && claim.is_none() {
            if restoring.is_none() {
                *restoring = Some(self.restoring().await?);
            }
            restoring.as_ref().is_some_and(|r| r.contains(&rec.drive_id))
        } else {
            false
        };
        // An encrypted volume whose PV is made again names its class's node-stage Secret.
        let stage_secret = match (&pv, rec.encrypted()) {
            (None, true) => {
                let b = &rec.binding;
                let class = claim.as_ref().and_then(|c| c.spec.as_ref()).and_then(|s| s.storage_class_name.clone()).unwrap_or_else(|| b.storage_class.clone());
                let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(self.client.clone());
                let sc = classes.get_opt(&class).await.map_err(api(format!("reading StorageClass {class}")))?;
                let (ns, name) = claim.as_ref().map(|c| (c.namespace().unwrap_or_default(), c.name_any())).unwrap_or_else(|| (b.claim_namespace.clone(), b.claim_name.clone()));
                sc.and_then(|sc| sc.parameters).and_then(|p| super::stage_secret_of(&p, (&ns, &name), &b.pv))
            }
            _ => None,
        };
        let seen = Seen { record: rec, pv: pv.as_ref(), claim: claim.as_ref(), restore_claims, stage_secret };
        let plan = decide(&self.identity.node, &self.identity.driver, &seen);
        let only_binding = plan.steps.iter().all(|s| matches!(s, Step::SetBinding(_)));
        if only_binding {
            if self.told.get(&rec.id) != Some(&plan.why) {
                info!(node.name = %self.identity.node, volume.id = %rec.id, "{}", plan.why);
                self.told.insert(rec.id.clone(), plan.why.clone());
            }
        } else {
            info!(node.name = %self.identity.node, volume.id = %rec.id, "{}", plan.why);
            self.told.remove(&rec.id);
        }
        let mut created_uid: Option<String> = None;
        for step in plan.steps {
            match step {
                Step::SetBinding(b) => backend.set_binding(&rec.id, b).await?,
                step => self.step(rec, step, &mut created_uid).await?,
            }
        }
        Ok(!only_binding)
    }

    /// Performs one API step for `rec`; `created_uid`: the uid of a claim created earlier
    /// in this plan, for the PV's claimRef.
    async fn step(&self, rec: &VolumeRecord, step: Step, created_uid: &mut Option<String>) -> Result<(), RehomeError> {
        let node = self.identity.node.as_str();
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        match step {
            Step::Retain { pv, before } => {
                let patch = json!({
                    "metadata": {"annotations": {POLICY_BEFORE: before}},
                    "spec": {"persistentVolumeReclaimPolicy": "Retain"},
                });
                pvs.patch(&pv, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(api(format!("setting reclaim policy Retain on PersistentVolume {pv}")))?;
                info!(node.name = node, volume.id = %rec.id, pv = %pv, reclaim_policy_before = %before, "PV set to reclaim policy Retain before its replacement");
            }
            Step::DropFinalizers { pv } => {
                let patch = json!({"metadata": {"finalizers": null}});
                match pvs.patch(&pv, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Err(e) if is_code(&e, 404) => {}
                    r => {
                        r.map_err(api(format!("removing the finalizers of PersistentVolume {pv}")))?;
                    }
                }
                info!(node.name = node, volume.id = %rec.id, pv = %pv, "PV's finalizers removed so it can be replaced while bound");
            }
            Step::DeletePv { pv } => {
                match pvs.delete(&pv, &DeleteParams::default()).await {
                    Err(e) if is_code(&e, 404) => {}
                    r => {
                        r.map_err(api(format!("deleting PersistentVolume {pv}")))?;
                    }
                }
                info!(node.name = node, volume.id = %rec.id, pv = %pv, "PV pinned to another node deleted (reclaim policy Retain): it is created again pinned to this node");
            }
            Step::CreateClaim(claim) => {
                let (ns, name) = (claim.namespace().unwrap_or_default(), claim.name_any());
                let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
                let made = claims.create(&PostParams::default(), &claim).await.map_err(api(format!("creating claim {ns}/{name}")))?;
                *created_uid = made.uid();
                info!(node.name = node, volume.id = %rec.id, claim = %format!("{ns}/{name}"), "claim restored");
            }
            Step::CreatePv(pv) => {
                let mut pv = *pv;
                if let (Some(uid), Some(r)) = (created_uid.clone(), pv.spec.as_mut().and_then(|s| s.claim_ref.as_mut())) {
                    r.uid = Some(uid);
                }
                let name = pv.name_any();
                match pvs.create(&PostParams::default(), &pv).await {
                    Err(e) if is_code(&e, 409) => {
                        return Err(api(format!("creating PersistentVolume {name} (the old one is still going; tried again)"))(e));
                    }
                    r => {
                        r.map_err(api(format!("creating PersistentVolume {name}")))?;
                    }
                }
                info!(node.name = node, volume.id = %rec.id, pv = %name, "PV created, pinned to this node");
            }
            Step::Tell { namespace, name, reason, note } => {
                let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &namespace);
                let Some(claim) = claims.get_opt(&name).await.map_err(api(format!("reading claim {namespace}/{name}")))? else {
                    return Ok(());
                };
                let event = Event {
                    type_: EventType::Normal,
                    reason: reason.into(),
                    note: Some(crate::k8s::events::condition_event::truncate_note(&note).to_string()),
                    action: "Rehome".into(),
                    secondary: None,
                };
                self.recorder
                    .publish(&event, &claim.object_ref(&()))
                    .await
                    .map_err(api(format!("recording an Event on claim {namespace}/{name}")))?;
            }
            Step::SetBinding(_) => {}
        }
        Ok(())
    }
}

/// A snapshot of what the volumes are, to see them change: id and binding.
fn shape(volumes: &[VolumeRecord]) -> BTreeMap<String, Binding> {
    candidates(volumes).map(|r| (r.id.clone(), r.binding.clone())).collect()
}

/// Runs for the agent's life (see the module rules).
pub(crate) async fn run<B: RehomeBackend>(client: Client, identity: Identity, backend: B, cache: Option<crate::k8s::cache::NodeCache>) {
    backend.wait_ready().await;
    let mut executor = Executor::new(client, identity);
    executor.cache = cache;
    let mut last = None;
    let mut next = tokio::time::Instant::now();
    loop {
        match backend.volumes().await {
            Ok(volumes) => {
                let now = shape(&volumes);
                if last.as_ref() != Some(&now) || tokio::time::Instant::now() >= next {
                    let wait = match executor.pass(&volumes, &backend).await {
                        Ok(false) => RECHECK,
                        Ok(true) | Err(_) => RETRY,
                    };
                    next = tokio::time::Instant::now() + wait;
                    last = Some(now);
                }
            }
            Err(e) => warn!(node.name = %executor.identity.node, error = %e, "cannot ask the volume manager for its volumes; asked again"),
        }
        tokio::time::sleep(TICK).await;
    }
}
