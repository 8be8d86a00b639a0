//! The only code of the Drive sync that talks to the API server: the list of this
//! node's objects, the writes of a plan (server-side apply as [`FIELD_MANAGER`]), the
//! Events on the objects, and the pods lookup (in `pods.rs`).

use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, Recorder};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::warn;

use super::error::DrivesError;
use super::names::node_label_value;
use super::plan::SyncAction;
use super::pods::PodsCache;
use super::{FIELD_MANAGER, NODE_LABEL};
use crate::k8s::crd;

/// Carries out [`SyncAction`]s against the API server.
#[derive(Clone)]
pub(crate) struct Executor {
    pub(super) api: Api<crd::Drive>,
    pub(super) recorder: Recorder,
    pub(super) client: Client,
    /// Our CSI driver (a PV of another driver is no volume of ours; empty: any).
    pub(super) driver: String,
    /// What the pods lookup keeps between syncs: each PV's volume handle (never changes)
    /// and the last answer (kept when a lookup fails).
    pub(super) pods: Arc<Mutex<PodsCache>>,
    /// This node's PVs, claims and pods, when the agent keeps them.
    pub(super) cache: Option<crate::k8s::cache::NodeCache>,
}

impl Executor {
    /// An executor writing `Drive` objects as [`FIELD_MANAGER`] and recording Events on
    /// them as this node's drivelet.
    pub(crate) fn new(client: Client, node: &str) -> Self {
        let reporter = kube::runtime::events::Reporter { controller: crate::k8s::identity::REPORTER.into(), instance: Some(node.into()) };
        Self {
            api: Api::all(client.clone()),
            recorder: Recorder::new(client.clone(), reporter),
            client,
            driver: String::new(),
            pods: Arc::default(),
            cache: None,
        }
    }

    /// Volumes of PVs of `driver` only, in the pods lookup.
    pub(crate) fn with_driver(mut self, driver: &str) -> Self {
        self.driver = driver.to_string();
        self
    }

    /// Records `events` on their Drive objects; one that fails is logged, not retried
    /// (the condition in the status says the same).
    pub(crate) async fn tell(&self, events: &[(ObjectReference, Event)]) {
        for (obj, ev) in events {
            if let Err(e) = self.recorder.publish(ev, obj).await {
                warn!(actor = "drive-sync", drive.object = obj.name.as_deref().unwrap_or_default(), error = %e,
                      "cannot record an Event on the Drive object");
            }
        }
    }

    /// The objects labelled as `node`'s.
    pub(crate) async fn list(&self, node: &str) -> Result<Vec<crd::Drive>, DrivesError> {
        let params = ListParams::default().labels(&format!("{NODE_LABEL}={}", node_label_value(node)));
        let list = self.api.list(&params).await.map_err(|source| DrivesError::List { node: node.to_string(), source })?;
        Ok(list.items)
    }

    /// Performs `actions` in order and stops at the first failure. A delete of an object
    /// that is already gone succeeds.
    pub(crate) async fn execute(&self, actions: &[SyncAction]) -> Result<(), DrivesError> {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        for action in actions {
            match action {
                SyncAction::Apply(obj) => {
                    self.apply(obj, &params).await?;
                    self.apply_status(obj, &params).await?;
                }
                SyncAction::ApplyStatus(obj) => self.apply_status(obj, &params).await?,
                SyncAction::Delete(name) => self.delete(name).await?,
            }
        }
        Ok(())
    }

    async fn apply(&self, obj: &crd::Drive, params: &PatchParams) -> Result<(), DrivesError> {
        let name = obj.name_any();
        // Never the admin's action: an apply that named it would take it over.
        let mut body = crd::Drive::new(&name, obj.spec.hardware());
        body.metadata = ObjectMeta { name: Some(name.clone()), labels: obj.metadata.labels.clone(), ..Default::default() };
        self.api
            .patch(&name, params, &Patch::Apply(&body))
            .await
            .map_err(|source| DrivesError::Apply { name, source })?;
        Ok(())
    }

    async fn apply_status(&self, obj: &crd::Drive, params: &PatchParams) -> Result<(), DrivesError> {
        let name = obj.name_any();
        let body = json!({
            "apiVersion": crd::Drive::api_version(&()),
            "kind": crd::Drive::kind(&()),
            "metadata": { "name": name },
            "status": obj.status.clone().unwrap_or_default(),
        });
        self.api
            .patch_status(&name, params, &Patch::Apply(&body))
            .await
            .map_err(|source| DrivesError::ApplyStatus { name, source })?;
        Ok(())
    }

    async fn delete(&self, name: &str) -> Result<(), DrivesError> {
        match self.api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(source) => Err(DrivesError::Delete { name: name.to_string(), source }),
        }
    }
}
