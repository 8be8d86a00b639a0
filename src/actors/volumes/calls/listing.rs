//! The queries and subscriptions: what the volume manager holds (volumes, statuses,
//! storage health, drive uses, cleaning, bytes used, the volumes this node serves), its
//! readiness, a metrics scrape in one round trip, and who hears of its changes.
//!
//! Rules: a query answers from the book as it is, on the actor thread, without a disk
//! step; only [`VolumesUsed`] reads the host (statvfs of staged filesystems, off the
//! actor thread, bounded by [`USED_TIMEOUT`]: a staged filesystem that does not answer
//! by then, a sick drive, is left out of the answer).

use std::collections::BTreeMap;

use actix::prelude::*;

use super::super::conditions::StorageEntry;
use super::super::error::VolumeError;
use super::super::messages::{
    GetStorageHealth, GetVolume, GetVolumeStatus, ListCleaning, ListDriveUses, ListHeld, ListServedVolumes, ListVolumeStatuses, ListVolumes,
    ScrapeVolumes, SubscribeConditions, SubscribeVolumes, VolumeChecked, VolumeStatus, VolumesReady, VolumesScrape, VolumesUsed, WaitReady,
};
use super::super::model::VolumeRecord;
use super::super::VolumeManager;
use tracing::warn;

/// How long the statvfs calls of one [`VolumesUsed`] query may take in all.
pub(crate) const USED_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

impl Handler<GetVolume> for VolumeManager {
    type Result = Result<VolumeRecord, VolumeError>;
    fn handle(&mut self, m: GetVolume, _: &mut Context<Self>) -> Self::Result {
        self.book.visible(&m.volume_id).cloned()
    }
}

impl Handler<ListHeld> for VolumeManager {
    type Result = MessageResult<ListHeld>;
    fn handle(&mut self, _: ListHeld, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.book.records().cloned().collect())
    }
}

impl Handler<ListVolumes> for VolumeManager {
    type Result = MessageResult<ListVolumes>;
    fn handle(&mut self, _: ListVolumes, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.book.records().filter(|r| r.is_volume()).cloned().collect())
    }
}

/// The volumes of `records` this node serves now: volumes (not snapshots) on a drive of
/// `drives` that is here and this node's (managed), their partition there (not lost).
pub(crate) fn served<'a>(records: impl Iterator<Item = &'a VolumeRecord>, drives: impl Iterator<Item = &'a crate::actors::inventory::model::Drive>) -> Vec<VolumeRecord> {
    let here: std::collections::BTreeSet<&str> = drives.filter(|d| d.class == crate::words::DriveClass::Managed).map(|d| d.id.as_str()).collect();
    records.filter(|r| r.is_volume() && !r.lost && here.contains(r.drive_id.as_str())).cloned().collect()
}

impl Handler<ListServedVolumes> for VolumeManager {
    type Result = MessageResult<ListServedVolumes>;
    fn handle(&mut self, _: ListServedVolumes, _: &mut Context<Self>) -> Self::Result {
        MessageResult(served(self.book.records(), self.book.drives()))
    }
}

impl Handler<VolumesReady> for VolumeManager {
    type Result = bool;
    fn handle(&mut self, _: VolumesReady, _: &mut Context<Self>) -> bool {
        self.book.is_ready()
    }
}

impl Handler<WaitReady> for VolumeManager {
    type Result = ResponseFuture<bool>;
    fn handle(&mut self, _: WaitReady, _: &mut Context<Self>) -> Self::Result {
        if self.book.is_ready() {
            return Box::pin(async { true });
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.ready_waiters.push(tx);
        Box::pin(async move { rx.await.is_ok() })
    }
}

impl Handler<GetVolumeStatus> for VolumeManager {
    type Result = Result<VolumeStatus, VolumeError>;
    fn handle(&mut self, m: GetVolumeStatus, ctx: &mut Context<Self>) -> Self::Result {
        let status = self.book.status(&m.volume_id);
        if crate::failpoint::injected_failure("actor.volumes.stop") {
            warn!(actor = "volumes", "failure injected: stopping after this answer");
            ctx.stop();
        }
        status
    }
}

impl Handler<ListVolumeStatuses> for VolumeManager {
    type Result = Result<(Vec<VolumeStatus>, Option<String>), VolumeError>;
    fn handle(&mut self, m: ListVolumeStatuses, _: &mut Context<Self>) -> Self::Result {
        self.book.page_where(m.after.as_deref(), m.max, m.abnormal_only)
    }
}

impl Handler<GetStorageHealth> for VolumeManager {
    type Result = Result<Vec<StorageEntry>, VolumeError>;
    fn handle(&mut self, _: GetStorageHealth, _: &mut Context<Self>) -> Self::Result {
        self.book.storage_health()
    }
}

impl Handler<ListDriveUses> for VolumeManager {
    type Result = MessageResult<ListDriveUses>;
    fn handle(&mut self, _: ListDriveUses, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.book.drive_uses())
    }
}

impl Handler<ListCleaning> for VolumeManager {
    type Result = MessageResult<ListCleaning>;
    fn handle(&mut self, _: ListCleaning, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.book.cleaning())
    }
}

impl Handler<VolumesUsed> for VolumeManager {
    type Result = ResponseFuture<BTreeMap<String, u64>>;
    fn handle(&mut self, _: VolumesUsed, _: &mut Context<Self>) -> Self::Result {
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

impl Handler<ScrapeVolumes> for VolumeManager {
    type Result = MessageResult<ScrapeVolumes>;
    fn handle(&mut self, _: ScrapeVolumes, _: &mut Context<Self>) -> Self::Result {
        MessageResult(VolumesScrape {
            view: self.book.view_reader().get().unwrap_or_default(),
            uses: self.book.drive_uses(),
            snapshots: self.book.snapshots().unwrap_or_default(),
            cleaning: self.book.cleaning(),
            evacuations: self.book.evacuations(),
            moving: self.book.move_progress(),
        })
    }
}

impl Handler<VolumeChecked> for VolumeManager {
    type Result = ();
    fn handle(&mut self, m: VolumeChecked, _: &mut Context<Self>) {
        let id = m.volume_id.clone();
        if self.book.checked(m.volume_id, m.findings) {
            self.refresh(|r| r.id == id);
        }
    }
}

impl Handler<SubscribeConditions> for VolumeManager {
    type Result = ();
    fn handle(&mut self, m: SubscribeConditions, _: &mut Context<Self>) {
        self.condition_subscribers.push(m.0);
    }
}

impl Handler<SubscribeVolumes> for VolumeManager {
    type Result = ();
    fn handle(&mut self, m: SubscribeVolumes, _: &mut Context<Self>) {
        self.volume_subscribers.push(m.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::inventory::model::Drive;
    use crate::actors::volumes::model::VolumeState;
    use crate::words::{DriveClass, Media};

    /// Only a volume on a drive here and this node's is served: one whose drive was moved
    /// away (and adopted elsewhere), one on a drive owned elsewhere, a lost one and a
    /// snapshot are not, so re-homing never pulls their claims back here.
    #[test]
    fn only_volumes_on_this_nodes_drives_here_are_served() {
        let rec = |n: u8, drive: &str| VolumeRecord { drive_id: drive.into(), ..VolumeRecord::for_test(n, VolumeState::Available) };
        let mine = Drive::for_test("mine", Media::Virtual, 1 << 30);
        let elsewhere = Drive { class: DriveClass::OwnedElsewhere, ..Drive::for_test("theirs", Media::Virtual, 1 << 30) };
        let lost = VolumeRecord { lost: true, ..rec(3, "mine") };
        let of = crate::actors::volumes::model::SnapshotOf { source_volume_id: "x".into(), restore_size: 1, created_unix_nanos: 0, freeze_millis: None, freeze: false };
        let snap = VolumeRecord { snapshot: Some(of), ..rec(4, "mine") };
        let records = [rec(1, "mine"), rec(2, "gone"), lost, snap, rec(5, "theirs")];
        let got: Vec<String> = served(records.iter(), [&mine, &elsewhere].into_iter()).into_iter().map(|r| r.id).collect();
        assert_eq!(got, vec![records[0].id.clone()]);
    }
}
