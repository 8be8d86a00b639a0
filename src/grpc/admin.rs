//! The admin socket behind `drivelet ctl`: one JSON request per line, one JSON answer
//! per line. Root only (mode 0600): queries (drives, volumes, evacuations), the drive
//! release, evacuate and cordon commands and the adoption of a migrated in-tree `local` volume.
//!
//! Rules: a malformed or unknown request gets `{"error": ...}` and the connection
//! stays usable; a line longer than 64 KiB closes the connection.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tracing::{debug, warn};

use super::Front;
use crate::actors::inventory::model::Drive;
use crate::actors::messages::ListDrives;
use crate::actors::volumes::model::VolumeRecord;

use crate::actors::volumes::Cleaning;
use crate::actors::volumes::{
    volume_detail, AdoptVolume, CordonDrive, ListCleaning, ListDriveUses, ListVolumeStatuses, ListVolumes, ReleaseDrive, VolumeDetail,
    VolumesUsed,
};
use crate::words::DriveUse;

/// A request on the admin socket.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum AdminRequest {
    /// List every disk with its classification.
    Drives,
    /// List every volume with its drive, size, state and paths.
    Volumes,
    /// List every volume as an admin's listing shows it: used bytes and health too.
    VolumeDetails,
    /// List every snapshot.
    Snapshots,
    /// Release a drive: no new volumes; released once empty (or at once with force,
    /// failing the volumes left on it).
    ReleaseDrive {
        /// Stable drive id.
        drive_id: String,
        /// Fail the remaining volumes.
        force: bool,
    },
    /// Evacuate a drive: move its volumes to other drives of the node, then release it.
    EvacuateDrive {
        /// Stable drive id.
        drive_id: String,
        /// Move volumes with unreadable blocks anyway (zeros there).
        force: bool,
    },
    /// Where every evacuation stands.
    Evacuations,
    /// Adopt a drivelet disk owned elsewhere: this node owns it from now on and serves
    /// its volumes.
    AdoptDrive {
        /// Stable drive id.
        drive_id: String,
    },
    /// Cordon a drive (no new volumes; its volumes stay) or uncordon it.
    CordonDrive {
        /// Stable drive id.
        drive_id: String,
        /// Cordon (`true`) or uncordon (`false`).
        cordon: bool,
    },
    /// Adopt the data of a translated in-tree `local` PV as a volume of this node.
    Adopt {
        /// The volume id (the translated PV's volume handle).
        volume_id: String,
        /// The PersistentVolume it came from.
        pv_name: String,
        /// The node the PV lives on (must be this one).
        node: String,
        /// The directory holding the data.
        path: std::path::PathBuf,
        /// The PV's filesystem (may be empty).
        fs_type: String,
    },
    /// Arm a fail point now (`actions` in the `fail` crate's syntax, e.g. `1*return`), so
    /// a test decides when an actor fails. Only builds with the `failpoints` feature (the
    /// test builds) accept it; a release build answers an error.
    FailPoint {
        /// The fail point, e.g. `actor.inventory.stop`.
        name: String,
        /// What it does when reached.
        actions: String,
    },
}

/// A drive with its usage state, as `drivelet ctl drives` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DriveView {
    /// The inventory's view.
    #[serde(flatten)]
    pub drive: Drive,
    /// `active`, `releasing` or `released`.
    pub usage: String,
    /// Why it is releasing or released.
    #[serde(default)]
    pub usage_reason: String,
    /// Space freed on it that is still being zeroed before reuse (not counted as
    /// capacity meanwhile), and how far that is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleaning: Option<Cleaning>,
}

/// An answer on the admin socket.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub enum AdminResponse {
    /// The drive list.
    Drives(Vec<DriveView>),
    /// A drive's new usage state.
    Released(DriveUse),
    /// A drive's usage after a cordon or uncordon (`None`: active).
    Cordoned(Option<DriveUse>),
    /// Where an evacuation stands.
    Evacuation(crate::actors::volumes::Evacuation),
    /// Where every evacuation stands.
    Evacuations(Vec<crate::actors::volumes::Evacuation>),
    /// The volume list.
    Volumes(Vec<VolumeRecord>),
    /// The volumes as an admin's listing shows them.
    VolumeDetails(Vec<VolumeDetail>),
    /// The snapshot list.
    Snapshots(Vec<crate::actors::volumes::snapshot::SnapshotRecord>),
    /// The adopted volume.
    Adopted(Box<VolumeRecord>),
    /// A drive adopted (or this node's already).
    DriveAdopted(crate::actors::messages::Adopted),
    /// The fail point that was armed.
    Armed(String),
    /// The request failed.
    Error(String),
}

const MAX_LINE: usize = 64 << 10;

async fn answer(front: &Front, line: &str) -> AdminResponse {
    match serde_json::from_str::<AdminRequest>(line) {
        Err(e) => AdminResponse::Error(format!("bad request: {e}")),
        Ok(AdminRequest::Drives) => match (front.inventory.send(ListDrives).await, front.volumes.send(ListDriveUses).await) {
            (Ok(d), uses) => {
                let uses = uses.unwrap_or_default();
                let cleaning = front.volumes.send(ListCleaning).await.unwrap_or_default();
                AdminResponse::Drives(
                    d.into_iter()
                        .map(|drive| {
                            let u = uses.iter().find(|u| u.drive_id == drive.id);
                            DriveView {
                                usage: u.map(|u| u.state.as_str()).unwrap_or("active").to_string(),
                                usage_reason: u.map(|u| u.reason.clone()).unwrap_or_default(),
                                cleaning: cleaning.iter().find(|c| c.drive_id == drive.id).cloned(),
                                drive,
                            }
                        })
                        .collect(),
                )
            }
            (Err(e), _) => AdminResponse::Error(format!("drive inventory is not answering: {e}")),
        },
        Ok(AdminRequest::ReleaseDrive { drive_id, force }) => match front.volumes.send(ReleaseDrive { drive_id, force }).await {
            Ok(Ok(u)) => AdminResponse::Released(u),
            Ok(Err(e)) => AdminResponse::Error(e.to_string()),
            Err(e) => AdminResponse::Error(format!("volume manager is not answering: {e}")),
        },
        Ok(AdminRequest::EvacuateDrive { drive_id, force }) => {
            match front.volumes.send(crate::actors::volumes::EvacuateDrive { drive_id, force }).await {
                Ok(Ok(e)) => AdminResponse::Evacuation(e),
                Ok(Err(e)) => AdminResponse::Error(e.to_string()),
                Err(e) => AdminResponse::Error(format!("volume manager is not answering: {e}")),
            }
        }
        Ok(AdminRequest::Evacuations) => match front.volumes.send(crate::actors::volumes::ListEvacuations).await {
            Ok(list) => AdminResponse::Evacuations(list),
            Err(e) => AdminResponse::Error(format!("volume manager is not answering: {e}")),
        },
        Ok(AdminRequest::VolumeDetails) => {
            let statuses = front.volumes.send(ListVolumeStatuses { after: None, max: 0, abnormal_only: false }).await;
            let used = front.volumes.send(VolumesUsed).await.unwrap_or_default();
            match statuses {
                Ok(Ok((page, _))) => AdminResponse::VolumeDetails(page.iter().map(|v| volume_detail(v, &used)).collect()),
                Ok(Err(e)) => AdminResponse::Error(e.to_string()),
                Err(e) => AdminResponse::Error(format!("volume manager is not answering: {e}")),
            }
        }
        Ok(AdminRequest::AdoptDrive { drive_id }) => match front.inventory.send(crate::actors::messages::AdoptDrive { drive_id }).await {
            Ok(Ok(a)) => AdminResponse::DriveAdopted(a),
            Ok(Err(e)) => AdminResponse::Error(e),
            Err(e) => AdminResponse::Error(format!("drive inventory is not answering: {e}")),
        },
        Ok(AdminRequest::CordonDrive { drive_id, cordon }) => match front.volumes.send(CordonDrive { drive_id, cordon }).await {
            Ok(Ok(u)) => AdminResponse::Cordoned(u),
            Ok(Err(e)) => AdminResponse::Error(e.to_string()),
            Err(e) => AdminResponse::Error(format!("volume manager is not answering: {e}")),
        },
        Ok(AdminRequest::Adopt { volume_id, pv_name, node, path, fs_type }) => {
            let here = &front.cfg.driver.node_name;
            if node != *here {
                return AdminResponse::Error(format!("the volume lives on node {node}; adopt it there (this is {here})"));
            }
            match front.volumes.send(AdoptVolume { volume_id, pv_name, path, fs_type }).await {
                Ok(Ok(r)) => AdminResponse::Adopted(Box::new(r)),
                Ok(Err(e)) => AdminResponse::Error(e.to_string()),
                Err(e) => AdminResponse::Error(format!("volume manager is not answering: {e}")),
            }
        }
        Ok(AdminRequest::FailPoint { name, actions }) => match crate::failpoint::arm_failure(&name, &actions) {
            Ok(()) => AdminResponse::Armed(name),
            Err(e) => AdminResponse::Error(e),
        },
        Ok(AdminRequest::Snapshots) => match front.volumes.send(crate::actors::volumes::ListSnapshots).await {
            Ok(Ok(s)) => AdminResponse::Snapshots(s),
            Ok(Err(e)) => AdminResponse::Error(e.to_string()),
            Err(e) => AdminResponse::Error(format!("volume manager is not answering: {e}")),
        },
        Ok(AdminRequest::Volumes) => match front.volumes.send(ListVolumes).await {
            Ok(v) => AdminResponse::Volumes(v),
            Err(e) => AdminResponse::Error(format!("volume manager is not answering: {e}")),
        },
    }
}

async fn serve_conn(front: Front, stream: UnixStream) -> std::io::Result<()> {
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    let mut line = String::new();
    loop {
        line.clear();
        let n = (&mut r).take(MAX_LINE as u64 + 1).read_line(&mut line).await?;
        if n == 0 {
            return Ok(());
        }
        if n > MAX_LINE {
            w.write_all(b"{\"error\":\"request too long\"}\n").await?;
            return Ok(());
        }
        let resp = answer(&front, line.trim()).await;
        let mut out = serde_json::to_vec(&resp).unwrap_or_else(|_| b"{\"error\":\"encoding failed\"}".to_vec());
        out.push(b'\n');
        w.write_all(&out).await?;
    }
}

/// Serves the admin socket until `shutdown` fires.
pub(crate) async fn serve_admin(front: Front, listener: UnixListener, shutdown: tokio::sync::oneshot::Receiver<()>) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            acc = listener.accept() => match acc {
                Ok((stream, _)) => {
                    let f = front.clone();
                    tokio::spawn(async move {
                        if let Err(e) = serve_conn(f, stream).await {
                            debug!(error = %e, "admin connection ended");
                        }
                    });
                }
                Err(e) => {
                    warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }
}

