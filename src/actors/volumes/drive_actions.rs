//! The volume manager's handlers of an admin's drive actions other than a release:
//! cordon and uncordon ([`CordonDrive`]).
//!
//! Rules: the book decides on the actor thread (so placement sees a cordoned drive
//! closed from the next call on); the usage record is stored off it, in the order the
//! decisions were made; subscribers (the Drive objects) hear of the change once stored;
//! a request that changes nothing writes nothing and answers the usage as it is.

use actix::prelude::*;

use super::{reply, CordonDrive, Reply, VolumeError, VolumeManager};
use crate::words::DriveUse;

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
    type Result = ResponseFuture<std::collections::BTreeMap<String, u64>>;
    fn handle(&mut self, _: super::VolumesUsed, _: &mut Context<Self>) -> Self::Result {
        // Only staged filesystems have a usage to read; the paths are read off the
        // actor thread (statvfs may hang on a sick filesystem).
        let staged: Vec<(String, std::path::PathBuf)> = self
            .book
            .records()
            .filter(|r| !r.block && !r.lost && !r.failed)
            .filter_map(|r| r.staging.as_ref().filter(|s| !s.block).map(|s| (r.id.clone(), s.path.clone())))
            .collect();
        Box::pin(async move {
            let probe = tokio::task::spawn_blocking(move || {
                staged.into_iter().filter_map(|(id, path)| crate::disk::fs::usage(&path).ok().map(|u| (id, u.used_bytes))).collect()
            });
            match tokio::time::timeout(USED_TIMEOUT, probe).await {
                Ok(Ok(used)) => used,
                _ => std::collections::BTreeMap::new(),
            }
        })
    }
}
