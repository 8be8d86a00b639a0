//! One sync of this node's `Drive` objects: gather (the inventory, the volume manager's
//! [`DriveView`], the objects), act on the admins' actions, decide, write, tell.

use std::collections::BTreeMap;

use actix::prelude::*;

use super::actions::{act, show_actions};
use super::desired::desired;
use super::error::DrivesError;
use super::executor::Executor;
use super::plan::{plan, SyncAction};
use super::status::{show_cleaning, show_owners, show_volumes};
use crate::actors::inventory::model::Drive;
use crate::actors::inventory::DriveInventory;
use crate::actors::messages::{AdoptDrive, GetInventoryStatus, ListDrives, SubscribeDrives};
use crate::actors::volumes::{DriveView, GetDriveView};
use crate::actors::volumes::model::VolumeState;
use crate::actors::volumes::{CordonDrive, EvacuateDrive, ReleaseDrive, SubscribeVolumes, VolumeManager};

/// What a sync asks and who it subscribes to, as recipients so tests can answer with
/// stand-ins: the inventory (scan status, drives, adoption), the volume manager (its
/// [`DriveView`], the drive commands of the admins' actions).
#[derive(Clone)]
pub(crate) struct Sources {
    pub(crate) inventory_status: Recipient<GetInventoryStatus>,
    pub(crate) drives: Recipient<ListDrives>,
    pub(crate) adopt: Recipient<AdoptDrive>,
    pub(crate) subscribe: Recipient<SubscribeDrives>,
    pub(crate) subscribe_volumes: Recipient<SubscribeVolumes>,
    pub(crate) view: Recipient<GetDriveView>,
    pub(crate) cordon: Recipient<CordonDrive>,
    pub(crate) release: Recipient<ReleaseDrive>,
    pub(crate) evacuate: Recipient<EvacuateDrive>,
}

impl Sources {
    /// The recipients of the real inventory and volume manager.
    pub(crate) fn of(inventory: Addr<DriveInventory>, volumes: Addr<VolumeManager>) -> Self {
        Self {
            inventory_status: inventory.clone().recipient(),
            drives: inventory.clone().recipient(),
            adopt: inventory.clone().recipient(),
            subscribe: inventory.recipient(),
            subscribe_volumes: volumes.clone().recipient(),
            view: volumes.clone().recipient(),
            cordon: volumes.clone().recipient(),
            release: volumes.clone().recipient(),
            evacuate: volumes.recipient(),
        }
    }

    async fn drives(&self) -> Result<Vec<Drive>, DrivesError> {
        self.drives.send(ListDrives).await.map_err(ask("inventory", "its drives"))
    }

    async fn view(&self) -> Result<DriveView, DrivesError> {
        self.view.send(GetDriveView).await.map_err(ask("volume manager", "its view of the drives"))
    }
}

/// How a sync ended, when it did not fail.
#[derive(Debug)]
pub(crate) enum Synced {
    /// Not started: waiting for this to be done.
    NotReady(&'static str),
    /// Done: these writes were made.
    Done(Vec<SyncAction>),
}

/// The error of a query to `actor` about `what` that got no answer.
pub(crate) fn ask(actor: &'static str, what: &'static str) -> impl FnOnce(MailboxError) -> DrivesError {
    move |source| DrivesError::Ask { actor, what, source }
}

/// One sync: gather, act on the admins' actions, decide, write, tell.
pub(crate) async fn sync_once(node: String, sources: Sources, executor: Executor) -> Result<Synced, DrivesError> {
    let status = sources.inventory_status.send(GetInventoryStatus).await.map_err(ask("inventory", "its scan status"))?;
    if !status.scanned {
        return Ok(Synced::NotReady("the inventory's first drive scan"));
    }
    let mut view = sources.view().await?;
    if !view.ready {
        return Ok(Synced::NotReady("the volume manager's start-up reconciliation"));
    }
    let existing = executor.list(&node).await?;
    let mut drives = sources.drives().await?;
    let acted = act(&node, &existing, &drives, &view.uses, &sources).await?;
    if acted.asked {
        // What was carried out shows in this sync's status.
        drives = sources.drives().await?;
        view = sources.view().await?;
    }
    let volumes = &view.volumes;
    let in_use = volumes.iter().any(|r| r.staging.is_some() || matches!(r.state, VolumeState::Staged | VolumeState::Published));
    let pods = if in_use { executor.pods(&node).await } else { BTreeMap::new() };
    let mut want = desired(&node, &drives, &view.uses, volumes);
    show_cleaning(&mut want, &view.cleaning);
    show_owners(&mut want, &drives, crate::disk::note::identity());
    show_volumes(&mut want, &view.statuses, &view.used, &pods);
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let events = show_actions(&node, &mut want, &existing, &view.uses, &acted.refused, &view.evacuations, &pods, &now);
    let actions = plan(&node, &want, &existing);
    executor.execute(&actions).await?;
    executor.tell(&events).await;
    Ok(Synced::Done(actions))
}
