//! The drive side of the volume book: drive events, drive releases and their
//! completion, drives the GPT writer refused, and the reconciliation of one drive.
//!
//! Rules: a cordoned drive takes no new volume and serves its volumes as before; a drive
//! whose health turns BAD is releasing (no new volume, its volumes asked
//! to move); a release completes once the drive holds no live volume (when asked, or
//! always with `auto_release`); a forced release fails the volumes still on it; a
//! released drive that is pulled is forgotten.

use std::sync::Arc;

use tracing::{info, warn};

use super::{Claim, VolumeBook};

use crate::actors::inventory::model::Drive;
use crate::actors::messages::DriveEvent;
use crate::actors::volumes::usage;
use crate::actors::volumes::messages::{CordonDrive, ReleaseDrive};
use crate::actors::volumes::model::VolumeRecord;
use crate::actors::volumes::error::VolumeError;
use crate::words::{DriveClass, DriveUse, DriveUseState};

/// What a drive event asks of the actor once the book took it in.
#[derive(Debug, Default)]
pub(crate) struct DriveEffects {
    /// Read this drive's partitions again, as at start-up.
    pub reread: Option<Drive>,
    /// Store this usage record.
    pub save: Option<DriveUse>,
    /// Forget this drive's usage record (a released drive pulled).
    pub forget: Option<String>,
    /// Tell the subscribers what this drive holds changed.
    pub announce: Option<String>,
}

/// What a drive release decided: the new usage record and the volumes it failed.
#[derive(Debug)]
pub(crate) struct ReleasePlan {
    /// The drive's usage record from now on.
    pub usage: DriveUse,
    /// The records failed by a forced release, already failed in the book.
    pub failed: Vec<VolumeRecord>,
}

impl VolumeBook {
    /// Completes the release of a releasing drive that holds no volume any more;
    /// answers the new usage record to store.
    pub(crate) fn settle_drive(&mut self, drive_id: &str) -> Option<DriveUse> {
        let u = self.drive_use.get(drive_id)?;
        let holds = self.records.values().any(|r| r.drive_id == drive_id && !r.failed);
        if u.state != DriveUseState::Releasing || holds || !(u.requested || self.auto_release) {
            return None;
        }
        let done = DriveUse { state: DriveUseState::Released, ..u.clone() };
        info!(drive.id = %drive_id, drive.usage = "released", "drive released: it holds no volume and may be pulled");
        self.drive_use.insert(drive_id.to_string(), done.clone());
        self.publish();
        Some(done)
    }

    /// Takes in a drive event.
    pub(crate) fn drive_event(&mut self, ev: DriveEvent) -> (String, DriveEffects) {
        let mut fx = DriveEffects::default();
        // A drive that appears, has new media under the same name (its disk sequence
        // number changed: swapped, or attached again faster than its removal was seen),
        // turns blank or changes class is read as at start-up: its partitions may be
        // back, or gone, or unknown to the store.
        let reread = match &ev {
            DriveEvent::DriveAppeared(d) => !self.drives.contains_key(&d.id),
            DriveEvent::DriveChanged { old, new } => old.diskseq != new.diskseq || (new.blank && !old.blank) || old.class != new.class,
            DriveEvent::DriveRemoved(_) => false,
        };
        let id = match ev {
            DriveEvent::DriveAppeared(d) | DriveEvent::DriveChanged { new: d, .. } => {
                let id = d.id.clone();
                if self.ready {
                    if let Some(u) = usage::usage_after_health(self.drive_use.get(&id), &id, d.health.health, &d.health.reason) {
                        warn!(drive.id = %id, drive.usage = "releasing", drive.health_reason = %d.health.reason,
                              "drive health is BAD: it takes no new volumes and its volumes are asked to move");
                        self.drive_use.insert(id.clone(), u.clone());
                        fx.save = Some(u);
                        fx.announce = Some(id.clone());
                    }
                }
                self.drives.insert(id.clone(), d.clone());
                if reread && self.ready {
                    *self.reconciling.entry(id.clone()).or_default() += 1;
                    fx.reread = Some(d);
                }
                id
            }
            DriveEvent::DriveRemoved(d) => {
                let n = self.records.values().filter(|r| r.drive_id == d.id).count();
                if n > 0 {
                    warn!(actor = "volumes", drive.id = %d.id, volumes = n, "drive holding volumes is gone");
                }
                if self.drive_use.get(&d.id).is_some_and(|u| u.state == DriveUseState::Released) {
                    info!(drive.id = %d.id, "released drive pulled: forgotten");
                    self.drive_use.remove(&d.id);
                    fx.forget = Some(d.id.clone());
                }
                self.drives.remove(&d.id);
                self.reconciling.remove(&d.id);
                self.dirty.remove(&d.id);
                d.id
            }
        };
        self.publish();
        (id, fx)
    }

    /// A reconciliation of `drive_id`'s volumes begins outside a drive event (the
    /// cleaner found the drive changed): their conditions hold still meanwhile.
    pub(crate) fn reconciling_started(&mut self, drive_id: &str) {
        *self.reconciling.entry(drive_id.to_string()).or_default() += 1;
    }

    /// One reconciliation of `drive_id`'s volumes is over (done, failed or given up):
    /// once none is pending, their conditions are judged again.
    pub(crate) fn reconciled(&mut self, drive_id: &str) {
        if let Some(n) = self.reconciling.get_mut(drive_id) {
            *n -= 1;
            if *n == 0 {
                self.reconciling.remove(drive_id);
            }
        }
        self.publish();
    }

    /// Whether `drive` is still present at the same path.
    pub(crate) fn drive_present_at(&self, drive: &Drive) -> bool {
        self.drives.get(&drive.id).is_some_and(|d| d.path == drive.path)
    }

    /// Claims every record on `drive_id` for its reconciliation, with copies of them;
    /// `None` when a call holds one of them (look again later).
    pub(crate) fn claim_drive(&self, drive_id: &str) -> Option<(Vec<Claim>, Vec<VolumeRecord>)> {
        let recs: Vec<VolumeRecord> = self.records.values().filter(|r| r.drive_id == drive_id).map(|r| VolumeRecord::clone(r)).collect();
        let mut claims = Vec::new();
        for r in &recs {
            claims.push(self.try_claim(&r.id)?);
        }
        Some((claims, recs))
    }

    /// Replaces the records of a reconciled drive (`ids`, as they were) with the ones
    /// reconciliation kept.
    pub(crate) fn settled(&mut self, drive_id: &str, ids: &[String], keep: Vec<VolumeRecord>) {
        for id in ids.iter().filter(|id| !keep.iter().any(|r| r.id == **id)) {
            self.records.remove(id);
        }
        for r in keep {
            if !ids.contains(&r.id) && self.records.contains_key(&r.id) {
                warn!(actor = "volumes", volume.id = %r.id, drive.id = %drive_id, "a partition of this volume is on another drive too; ignored here");
                continue;
            }
            self.records.insert(r.id.clone(), Arc::new(r));
        }
        self.publish();
    }

    /// Marks a drive the GPT writer refused foreign at once, so placement skips it from
    /// the next attempt on.
    pub(crate) fn drive_refused(&mut self, drive_id: &str, found: &str) {
        if let Some(d) = self.drives.get_mut(drive_id) {
            d.class = DriveClass::Foreign;
            d.reason = crate::actors::inventory::classify::holds(found);
            d.free_bytes = 0;
            d.largest_free_bytes = 0;
        }
        self.publish();
    }

    /// Decides and applies a drive release: the drive takes no new volume from now on;
    /// a forced release fails the volumes still on it.
    pub(crate) fn release(&mut self, m: &ReleaseDrive) -> Result<ReleasePlan, VolumeError> {
        if !self.ready {
            return Err(VolumeError::NotReady);
        }
        let known = self.drives.contains_key(&m.drive_id) || self.records.values().any(|r| r.drive_id == m.drive_id);
        if !known {
            return Err(VolumeError::InvalidArgument { reason: format!("no drive with id {} is known on this node", m.drive_id) });
        }
        let live: Vec<&VolumeRecord> = self.records.values().filter(|r| r.drive_id == m.drive_id && !r.failed).map(|r| &**r).collect();
        let (usage, fail) = usage::release(self.drive_use.get(&m.drive_id), &m.drive_id, &live, m.force);
        let mut failed = Vec::new();
        for id in fail {
            if let Some(r) = self.records.get_mut(&id) {
                let r = Arc::make_mut(r);
                r.failed = true;
                warn!(volume.id = %id, drive.id = %m.drive_id, "volume failed by a forced drive release");
                failed.push(r.clone());
            }
        }
        let live = self.records.values().filter(|r| r.drive_id == m.drive_id && !r.failed).count();
        info!(drive.id = %m.drive_id, drive.usage = usage.state.as_str(), volumes = live, "drive release requested");
        self.drive_use.insert(m.drive_id.clone(), usage.clone());
        self.publish();
        Ok(ReleasePlan { usage, failed })
    }

    /// Decides and applies a cordon or uncordon: answers the drive's usage record from
    /// now on (`None`: active) and whether it changed (so must be stored).
    pub(crate) fn cordon(&mut self, m: &CordonDrive) -> Result<(Option<DriveUse>, bool), VolumeError> {
        if !self.ready {
            return Err(VolumeError::NotReady);
        }
        let known = self.drives.contains_key(&m.drive_id) || self.records.values().any(|r| r.drive_id == m.drive_id);
        if !known {
            return Err(VolumeError::InvalidArgument { reason: format!("no drive with id {} is known on this node", m.drive_id) });
        }
        match usage::cordon(self.drive_use.get(&m.drive_id), &m.drive_id, m.cordon) {
            Err(unchanged) => Ok((unchanged, false)),
            Ok(u) => {
                let what = if m.cordon { "drive cordoned: it takes no new volumes" } else { "drive uncordoned: it takes new volumes again" };
                info!(drive.id = %m.drive_id, "{what}");
                match &u {
                    Some(u) => self.drive_use.insert(m.drive_id.clone(), u.clone()),
                    None => self.drive_use.remove(&m.drive_id),
                };
                self.publish();
                Ok((u, true))
            }
        }
    }
}
