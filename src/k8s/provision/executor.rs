//! The provision executor: one claim made (its class, data source and secret read, the
//! volume created, the PV written, the Event recorded), or one Released PV's volume
//! deleted, against the API server and the [`ProvisionBackend`].
//!
//! Rules:
//! - Reads are of this claim's own objects (its class, its source claim or snapshot and
//!   content, its secret): a node's requests grow with its own claims only.
//! - A PV that already exists under the volume's name is this claim's when its
//!   `claimRef` carries the claim's uid (a retry after the PV was written, or a sidecar
//!   beside this agent): success. Any other is refused in words, nothing overwritten.
//! - A Warning is recorded once per claim and message ([`Told`]); the retries behind it
//!   are silent.
//! - The selected-node annotation is removed with the claim's resourceVersion, so a claim
//!   that changed meanwhile is looked at again rather than handed back blindly.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Secret};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use super::backend::ProvisionBackend;
use super::{
    allowed_here, binding_of, data_source, deletable, failed_note, failure_of, key_of, pv_of, request_of, secret_of, status_words, volume_name,
    Abandoned, DataSource, Failure, Inputs, PROTECTION_FINALIZER, REASON_FAILED, REASON_SUCCEEDED, SELECTED_NODE,
};
use crate::config::human_bytes;
use crate::grpc::proto::csi;
use crate::k8s::identity::{Identity, REPORTER};
use crate::k8s::snapshot::objects::VolumeSnapshotContent;

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ran {
    /// Made (the PV written), deleted, or nothing to do.
    Done,
    /// Handed back to the scheduler.
    Rescheduled,
    /// Failed; retry with backoff.
    Failed,
    /// Waits for something that happens soon (a detach): retried at the base delay.
    Waiting,
}

/// The Warnings told, by claim and message.
#[derive(Debug, Default)]
pub(crate) struct Told(BTreeSet<(String, String)>);

impl Told {
    /// Whether `message` is new for `claim` (and remember it).
    pub(crate) fn tell(&mut self, claim: &str, message: &str) -> bool {
        self.0.insert((claim.to_string(), message.to_string()))
    }

    /// Forget a claim (made or deleted).
    pub(crate) fn forget(&mut self, claim: &str) {
        self.0.retain(|(c, _)| c != claim);
    }
}

/// Carries provisionings and deletions out.
#[derive(Clone)]
pub(crate) struct Executor {
    client: Client,
    recorder: Recorder,
    identity: Identity,
    topology: BTreeMap<String, String>,
    told: Arc<Mutex<Told>>,
}

/// A failure before CreateVolume was asked: its words, and whether another node might do.
struct Refused(String, Failure);

fn api_words(what: &str, e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{what}: {}", s.message),
        e => format!("{what}: {e}"),
    }
}

use crate::k8s::duties::executor::is_not_found as not_found;

impl Executor {
    /// Writes as drivelet, for `identity`'s node, whose topology is `topology`.
    pub(crate) fn new(client: Client, identity: Identity, topology: BTreeMap<String, String>) -> Self {
        let recorder = Recorder::new(client.clone(), identity.reporter());
        Self { client, recorder, identity, topology, told: Default::default() }
    }

    /// Forget what was told about `claim`.
    pub(crate) fn forget(&self, claim: &str) {
        self.told.lock().unwrap_or_else(|e| e.into_inner()).forget(claim);
    }

    /// Makes `claim`'s volume and PV.
    pub(crate) async fn provision(&self, claim: PersistentVolumeClaim, backend: &impl ProvisionBackend) -> Ran {
        let key = key_of(&claim);
        let class_name = claim.spec.as_ref().and_then(|s| s.storage_class_name.clone()).unwrap_or_default();
        let class = match Api::<StorageClass>::all(self.client.clone()).get(&class_name).await {
            Ok(c) => c,
            Err(e) => return self.failed(&claim, &class_name, api_words(&format!("reading StorageClass {class_name}"), &e), Failure::Retry).await,
        };
        if class.provisioner != self.identity.driver {
            debug!(pvc.name = %key, "the claim's class is another provisioner's; nothing to make");
            return Ran::Done;
        }
        let inputs = match self.inputs(&claim, &class).await {
            Ok(Some(i)) => i,
            Ok(None) => return Ran::Done,
            Err(Refused(why, failure)) => return self.failed(&claim, &class_name, why, failure).await,
        };
        let req = match request_of(&claim, &class, inputs) {
            Ok(r) => r,
            Err(why) => return self.failed(&claim, &class_name, why, Failure::Retry).await,
        };
        let name = req.name.clone();
        let volume = match backend.create(req).await {
            Ok(v) => v,
            Err(s) => return self.failed(&claim, &class_name, status_words(&s), failure_of(s.code())).await,
        };
        crate::failpoint::crash_point!("provision.created");
        let pv = match pv_of(&claim, &class, &volume, &self.identity) {
            Ok(pv) => pv,
            Err(why) => return self.failed(&claim, &class_name, why, Failure::Retry).await,
        };
        match self.write_pv(&claim, &pv).await {
            Ok(()) => {}
            Err(why) => return self.failed(&claim, &class_name, why, Failure::Retry).await,
        }
        // The claim's uid recorded with the volume: from now on it is never taken for a
        // volume whose PV was never written (see the rules of `abandoned`).
        if let Err(s) = backend.bind(&volume.volume_id, binding_of(&claim, &name)).await {
            return self.failed(&claim, &class_name, format!("recording volume {name}'s claim: {}", status_words(&s)), Failure::Retry).await;
        }
        let size = human_bytes(u64::try_from(volume.capacity_bytes).unwrap_or(0));
        info!(pvc.name = %key, pv.name = %name, volume.id = %volume.volume_id, "provisioned volume {name} ({size}) for claim {key}");
        self.forget(&key);
        let note = format!("drivelet made volume {name} ({size}) on node {}", self.identity.node);
        self.event(&claim, EventType::Normal, REASON_SUCCEEDED, note).await;
        Ran::Done
    }

    /// The PV written, or found written for this claim.
    async fn write_pv(&self, claim: &PersistentVolumeClaim, pv: &PersistentVolume) -> Result<(), String> {
        let api = Api::<PersistentVolume>::all(self.client.clone());
        let name = pv.name_any();
        match api.create(&PostParams { field_manager: Some(REPORTER.into()), ..Default::default() }, pv).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let there = api.get(&name).await.map_err(|e| api_words(&format!("reading PersistentVolume {name}"), &e))?;
                let uid = there.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).and_then(|r| r.uid.clone());
                if uid.is_some() && uid == claim.metadata.uid {
                    Ok(())
                } else {
                    Err(format!("PersistentVolume {name} exists already and is not this claim's; it is left alone"))
                }
            }
            Err(e) => Err(api_words(&format!("creating PersistentVolume {name}"), &e)),
        }
    }

    /// This node's topology, the data source and the provisioner secret of `claim`;
    /// `None` when the claim is not this provisioner's to make (another data source kind).
    async fn inputs(&self, claim: &PersistentVolumeClaim, class: &StorageClass) -> Result<Option<Inputs>, Refused> {
        if !allowed_here(class, &self.topology) {
            let why = format!("StorageClass {}'s allowedTopologies do not include node {}", class.name_any(), self.identity.node);
            return Err(Refused(why, Failure::Reschedule));
        }
        let ns = claim.namespace().unwrap_or_default();
        let source = match data_source(claim) {
            DataSource::None => None,
            DataSource::Other(what) => {
                debug!(pvc.name = %key_of(claim), source = %what, "the claim's data source is not a claim or a VolumeSnapshot; left to its populator");
                return Ok(None);
            }
            DataSource::Claim(name) => Some(self.clone_source(claim, class, &ns, &name).await?),
            DataSource::Snapshot(name) => Some(self.snapshot_source(&ns, &name).await?),
        };
        let pv = volume_name(claim).unwrap_or_default();
        let secrets = match secret_of(class, "provisioner", claim, &pv).map_err(|w| Refused(w, Failure::Retry))? {
            None => BTreeMap::new(),
            Some((sns, sname)) => {
                let secret = Api::<Secret>::namespaced(self.client.clone(), &sns)
                    .get(&sname)
                    .await
                    .map_err(|e| Refused(api_words(&format!("reading the provisioner secret {sns}/{sname}"), &e), Failure::Retry))?;
                secret
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                    .collect()
            }
        };
        Ok(Some(Inputs { topology: self.topology.clone(), source, secrets }))
    }

    async fn clone_source(&self, claim: &PersistentVolumeClaim, class: &StorageClass, ns: &str, name: &str) -> Result<csi::VolumeContentSource, Refused> {
        use csi::volume_content_source::{Type, VolumeSource};
        let retry = |w: String| Refused(w, Failure::Retry);
        let src = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), ns)
            .get(name)
            .await
            .map_err(|e| retry(api_words(&format!("reading the source claim {ns}/{name}"), &e)))?;
        let bound = src.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        let pv_name = src.spec.as_ref().and_then(|s| s.volume_name.clone()).filter(|_| bound && src.metadata.deletion_timestamp.is_none());
        let Some(pv_name) = pv_name else { return Err(retry(format!("the source claim {ns}/{name} is not Bound"))) };
        let src_class = src.spec.as_ref().and_then(|s| s.storage_class_name.clone()).unwrap_or_default();
        if src_class != class.name_any() {
            return Err(retry(format!("the source claim {ns}/{name} is of StorageClass {src_class}, not {}", class.name_any())));
        }
        let (want, _) = super::range_of(claim);
        let (had, _) = super::range_of(&src);
        if want < had {
            return Err(retry(format!("the clone asks for {}, less than its source claim's {}", human_bytes(want), human_bytes(had))));
        }
        let pv = Api::<PersistentVolume>::all(self.client.clone())
            .get(&pv_name)
            .await
            .map_err(|e| retry(api_words(&format!("reading the source claim's PersistentVolume {pv_name}"), &e)))?;
        let csi = pv.spec.as_ref().and_then(|s| s.csi.as_ref()).filter(|c| c.driver == self.identity.driver);
        let Some(csi) = csi else { return Err(retry(format!("the source claim {ns}/{name}'s volume is not drivelet's"))) };
        Ok(csi::VolumeContentSource { r#type: Some(Type::Volume(VolumeSource { volume_id: csi.volume_handle.clone() })) })
    }

    async fn snapshot_source(&self, ns: &str, name: &str) -> Result<csi::VolumeContentSource, Refused> {
        use csi::volume_content_source::{SnapshotSource, Type};
        let retry = |w: String| Refused(w, Failure::Retry);
        let resource = kube::api::ApiResource {
            group: "snapshot.storage.k8s.io".into(),
            version: "v1".into(),
            api_version: "snapshot.storage.k8s.io/v1".into(),
            kind: "VolumeSnapshot".into(),
            plural: "volumesnapshots".into(),
        };
        let snap = Api::<kube::api::DynamicObject>::namespaced_with(self.client.clone(), ns, &resource)
            .get(name)
            .await
            .map_err(|e| retry(api_words(&format!("reading VolumeSnapshot {ns}/{name}"), &e)))?;
        let status = &snap.data["status"];
        let ready = status["readyToUse"].as_bool().unwrap_or(false);
        let content = status["boundVolumeSnapshotContentName"]
            .as_str()
            .filter(|c| ready && !c.is_empty() && snap.metadata.deletion_timestamp.is_none())
            .map(str::to_string);
        let Some(content) = content else { return Err(retry(format!("VolumeSnapshot {ns}/{name} is not ready to use"))) };
        let vsc = Api::<VolumeSnapshotContent>::all(self.client.clone())
            .get(&content)
            .await
            .map_err(|e| retry(api_words(&format!("reading VolumeSnapshotContent {content}"), &e)))?;
        if vsc.spec.driver != self.identity.driver {
            return Err(retry(format!("VolumeSnapshot {ns}/{name} is of driver {}, not drivelet's", vsc.spec.driver)));
        }
        let handle = crate::k8s::snapshot::snapshot_handle(&vsc).filter(|h| !h.is_empty()).map(str::to_string);
        let Some(handle) = handle else { return Err(retry(format!("VolumeSnapshotContent {content} has no snapshot yet"))) };
        Ok(csi::VolumeContentSource { r#type: Some(Type::Snapshot(SnapshotSource { snapshot_id: handle })) })
    }

    /// Records the failure (once per message), hands the claim back when another node
    /// may make it.
    async fn failed(&self, claim: &PersistentVolumeClaim, class: &str, why: String, failure: Failure) -> Ran {
        let key = key_of(claim);
        let note = failed_note(class, &self.identity.node, &why, failure);
        warn!(pvc.name = %key, reason = %why, "{note}");
        let new = self.told.lock().unwrap_or_else(|e| e.into_inner()).tell(&key, &note);
        if new {
            self.event(claim, EventType::Warning, REASON_FAILED, note).await;
        }
        if failure == Failure::Retry {
            return Ran::Failed;
        }
        let patch = json!({"metadata": {"resourceVersion": claim.resource_version(), "annotations": {SELECTED_NODE: null}}});
        let api = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &claim.namespace().unwrap_or_default());
        match api.patch(&claim.name_any(), &PatchParams { field_manager: Some(REPORTER.into()), ..Default::default() }, &Patch::Merge(&patch)).await {
            Ok(_) => {
                self.forget(&key);
                Ran::Rescheduled
            }
            Err(e) => {
                warn!(pvc.name = %key, error = %api_words("handing the claim back to the scheduler", &e), "retrying");
                Ran::Failed
            }
        }
    }

    async fn event(&self, claim: &PersistentVolumeClaim, type_: EventType, reason: &str, note: String) {
        let event = KubeEvent { type_, reason: reason.to_string(), note: Some(note), action: "Provision".to_string(), secondary: None };
        if let Err(e) = self.recorder.publish(&event, &claim.object_ref(&())).await {
            warn!(pvc.name = %key_of(claim), error = %e, "cannot record a {reason} Event");
        }
    }

    /// Whether the claim `ns/name` exists with `uid` (read from the API, never a cache):
    /// a claim of that name with another uid is another claim, and uids never come back.
    async fn claim_is_there(&self, ns: &str, name: &str, uid: Option<&str>) -> Result<bool, kube::Error> {
        match Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), ns).get(name).await {
            Ok(c) => Ok(c.metadata.uid.as_deref() == uid),
            Err(e) if not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Deletes `volume` when the API confirms that its claim went before its PV was
    /// written: no PV of its name, and no claim of that name with its claim's uid.
    pub(crate) async fn sweep(&self, volume: &Abandoned, backend: &impl ProvisionBackend) -> Ran {
        let Abandoned { volume_id, name, claim_uid, namespace, claim } = volume;
        let shown = format!("{namespace}/{claim}");
        match Api::<PersistentVolume>::all(self.client.clone()).get(name).await {
            Ok(_) => {
                debug!(pv.name = %name, "volume {name} has its PersistentVolume; the reclaim policy decides");
                return Ran::Done;
            }
            Err(e) if not_found(&e) => {}
            Err(e) => {
                warn!(pv.name = %name, error = %api_words(&format!("reading PersistentVolume {name}"), &e), "cannot tell whether volume {name} was abandoned; retrying");
                return Ran::Failed;
            }
        }
        match self.claim_is_there(namespace, claim, Some(claim_uid.as_str())).await {
            Ok(true) => {
                debug!(pvc.name = %shown, "claim {shown} of volume {name} is there; its provisioning goes on");
                return Ran::Done;
            }
            Ok(false) => {}
            Err(e) => {
                warn!(pvc.name = %shown, error = %api_words(&format!("reading claim {shown}"), &e), "cannot tell whether volume {name} was abandoned; retrying");
                return Ran::Failed;
            }
        }
        match backend.delete(volume_id).await {
            Ok(()) => {
                info!(pvc.name = %shown, pv.name = %name, volume.id = %volume_id,
                      "deleted volume {name}: it was made for claim {shown} (uid {claim_uid}), which was deleted before its PersistentVolume was written");
                Ran::Done
            }
            Err(s) => {
                warn!(pv.name = %name, volume.id = %volume_id, "cannot delete volume {name}, whose claim {shown} was deleted before its PersistentVolume was written: {}; retrying", status_words(&s));
                Ran::Failed
            }
        }
    }

    /// Deletes the volume of a Released PV of a Delete class, then the PV (see the module
    /// rules).
    pub(crate) async fn delete(&self, pv: PersistentVolume, backend: &impl ProvisionBackend) -> Ran {
        let name = pv.name_any();
        let Some(volume_id) = deletable(&pv, &self.identity) else { return Ran::Done };
        let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.clone()).unwrap_or_default();
        let (ns, claim) = (claim_ref.namespace.unwrap_or_default(), claim_ref.name.unwrap_or_default());
        match self.claim_is_there(&ns, &claim, claim_ref.uid.as_deref()).await {
            Ok(true) => {
                debug!(pv.name = %name, "PersistentVolume {name} is Released but its claim {ns}/{claim} is there; not deleting");
                return Ran::Done;
            }
            Ok(false) => {}
            Err(e) => {
                warn!(pv.name = %name, error = %api_words(&format!("reading claim {ns}/{claim}"), &e), "cannot tell whether the PV is still bound; retrying");
                return Ran::Failed;
            }
        }
        if backend.attached(&volume_id) {
            debug!(pv.name = %name, volume.id = %volume_id, "PersistentVolume {name} is Released; its volume is deleted once it is detached");
            return Ran::Waiting;
        }
        if let Err(s) = backend.delete(&volume_id).await {
            warn!(pv.name = %name, volume.id = %volume_id, "cannot delete the volume of Released PersistentVolume {name}: {}; retrying", status_words(&s));
            return Ran::Failed;
        }
        let api = Api::<PersistentVolume>::all(self.client.clone());
        let finalizers = pv.finalizers().to_vec();
        if finalizers.iter().any(|f| f == PROTECTION_FINALIZER) {
            let rest: Vec<&String> = finalizers.iter().filter(|f| *f != PROTECTION_FINALIZER).collect();
            let patch = json!({"metadata": {"resourceVersion": pv.resource_version(), "finalizers": rest}});
            match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {}
                Err(e) if not_found(&e) => return Ran::Done,
                Err(e) => {
                    warn!(pv.name = %name, error = %api_words(&format!("removing the finalizer of PersistentVolume {name}"), &e), "retrying");
                    return Ran::Failed;
                }
            }
        }
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if not_found(&e) => {}
            Err(e) => {
                warn!(pv.name = %name, error = %api_words(&format!("deleting PersistentVolume {name}"), &e), "retrying");
                return Ran::Failed;
            }
        }
        info!(pv.name = %name, volume.id = %volume_id, "deleted volume {volume_id} and PersistentVolume {name} (reclaim policy Delete)");
        Ran::Done
    }
}
