//! The volume manager's handlers of an admin's drive actions other than a release:
//! cordon and uncordon ([`CordonDrive`]); and what an admin's listings show of a volume
//! ([`VolumeDetail`]: `ctl volumes`, the Drive objects, `kubectl drivelet volumes`, so
//! all three say the same in the same words).
//!
//! Rules: the book decides on the actor thread (so placement sees a cordoned drive
//! closed from the next call on); the usage record is stored off it, in the order the
//! decisions were made; subscribers (the Drive objects) hear of the change once stored;
//! a request that changes nothing writes nothing and answers the usage as it is.

use actix::prelude::*;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::model::VolumeRecord;
use super::{reply, CordonDrive, Reply, VolumeError, VolumeManager, VolumeStatus};
use crate::words::DriveUse;

/// One volume as an admin's listing shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeDetail {
    /// The volume id.
    pub id: String,
    /// The name it was created with (the PV's name).
    pub name: String,
    /// The drive it lives on.
    pub drive_id: String,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// Bytes its filesystem uses, when staged (see [`super::VolumesUsed`]).
    pub used_bytes: Option<u64>,
    /// `block`, its filesystem, or `fs` ([`volume_kind`]).
    pub kind: String,
    /// Its state, or `lost` ([`volume_state`]).
    pub state: String,
    /// Something is wrong with it.
    pub abnormal: bool,
    /// What, in plain words (abnormal only).
    pub reason: Option<String>,
}

/// What an admin's listing shows of `v`, with the bytes staged filesystems use.
pub fn volume_detail(v: &VolumeStatus, used: &BTreeMap<String, u64>) -> VolumeDetail {
    let r = &v.record;
    VolumeDetail {
        id: r.id.clone(),
        name: r.name.clone(),
        drive_id: r.drive_id.clone(),
        size_bytes: r.size,
        used_bytes: used.get(&r.id).copied(),
        kind: volume_kind(r),
        state: volume_state(r),
        abnormal: v.condition.abnormal,
        reason: v.condition.abnormal.then(|| v.condition.message.clone()),
    }
}

/// A volume's kind: `block`, its filesystem, or `fs`.
pub fn volume_kind(r: &VolumeRecord) -> String {
    if r.block {
        "block".into()
    } else if r.fs_type.is_empty() {
        "fs".into()
    } else {
        r.fs_type.clone()
    }
}

/// A volume's state: `lost` over the state of its record.
pub fn volume_state(r: &VolumeRecord) -> String {
    if r.lost { "lost".into() } else { r.state.as_str().into() }
}

impl Handler<CordonDrive> for VolumeManager {
    type Result = Reply<Option<DriveUse>>;
    fn handle(&mut self, m: CordonDrive, _: &mut Context<Self>) -> Self::Result {
        let (usage, changed) = match self.book.cordon(&m) {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        if !changed {
            return reply(Ok(usage));
        }
        let store = match self.store() {
            Ok(s) => s,
            Err(e) => return reply(Err(e)),
        };
        let job = self.uses.job(store, &m.drive_id, usage.clone());
        Box::pin(async move { tokio::task::spawn_blocking(job).await }.into_actor(self).map(move |res, act, _| {
            act.announce(&m.drive_id);
            match res {
                Ok(Ok(())) => Ok(usage),
                Ok(Err(e)) => Err(VolumeError::Store(e)),
                Err(e) => {
                    let what = format!("write of the cordon of drive {}", m.drive_id);
                    Err(VolumeError::Store(crate::store::StoreError::Txn { what, reason: e.to_string() }))
                }
            }
        }))
    }
}

/// How long the statvfs calls of one [`VolumesUsed`] query may take in all; a staged
/// filesystem that does not answer by then (a sick drive) is left out of the answer.
pub(crate) const USED_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

impl Handler<super::VolumesUsed> for VolumeManager {
    type Result = ResponseFuture<BTreeMap<String, u64>>;
    fn handle(&mut self, _: super::VolumesUsed, _: &mut Context<Self>) -> Self::Result {
        // Only staged filesystems have a usage to read; the paths are read off the
        // actor thread (statvfs may hang on a sick filesystem).
        let staged: Vec<(String, std::path::PathBuf)> = self
            .book
            .records()
            .filter(|r| !r.block && !r.lost && !r.failed)
            .filter_map(|r| r.staging.as_ref().filter(|s| !s.block).map(|s| (r.id.clone(), s.path.clone())))
            .collect();
        let roots = self.book.allowed_roots().to_vec();
        Box::pin(async move {
            let probe = tokio::task::spawn_blocking(move || {
                let used = |path: &std::path::Path| crate::disk::beneath::open(path, &roots).ok().flatten().and_then(|n| n.usage().ok());
                staged.into_iter().filter_map(|(id, path)| used(&path).map(|u| (id, u.used_bytes))).collect()
            });
            match tokio::time::timeout(USED_TIMEOUT, probe).await {
                Ok(Ok(used)) => used,
                _ => BTreeMap::new(),
            }
        })
    }
}
