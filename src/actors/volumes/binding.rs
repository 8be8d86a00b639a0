//! The volume manager's handler of [`SetBinding`]: what a volume serves in Kubernetes
//! (PV, claim namespace, name and uid, StorageClass), as the cluster's objects say it.
//!
//! Rules: the volume is claimed like any other call on it (a busy volume answers
//! ABORTED and is asked again later); a binding equal to the record's writes nothing;
//! otherwise the record is stored off the actor thread and then put into the book, which
//! publishes the view, so the note keeper writes the drive's note from it. A failed
//! store keeps the record as it was.

use actix::prelude::*;
use tracing::info;

use super::model::VolumeRecord;
use super::ops::Outcome;
use super::{reply, Reply, SetBinding, VolumeError, VolumeManager};

/// The volumes of `records` this node serves now: volumes (not snapshots) on a drive of
/// `drives` that is here and this node's (managed), their partition there (not lost).
pub(crate) fn served<'a>(records: impl Iterator<Item = &'a VolumeRecord>, drives: impl Iterator<Item = &'a crate::actors::inventory::model::Drive>) -> Vec<VolumeRecord> {
    let here: std::collections::BTreeSet<&str> = drives.filter(|d| d.class == crate::words::DriveClass::Managed).map(|d| d.id.as_str()).collect();
    records.filter(|r| r.is_volume() && !r.lost && here.contains(r.drive_id.as_str())).cloned().collect()
}

impl Handler<super::ListServedVolumes> for VolumeManager {
    type Result = MessageResult<super::ListServedVolumes>;
    fn handle(&mut self, _: super::ListServedVolumes, _: &mut Context<Self>) -> Self::Result {
        MessageResult(served(self.book.records(), self.book.drives()))
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

impl Handler<SetBinding> for VolumeManager {
    type Result = Reply<()>;
    fn handle(&mut self, m: SetBinding, _: &mut Context<Self>) -> Self::Result {
        let rec = match self.book.visible(&m.volume_id) {
            Ok(r) if r.binding == m.binding => return reply(Ok(())),
            Ok(r) => r.clone(),
            Err(e) => return reply(Err(e)),
        };
        let (claim, store) = match self.book.claim(&m.volume_id).and_then(|c| Ok((c, self.store()?))) {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        let updated = VolumeRecord { binding: m.binding, ..rec.clone() };
        self.run_with(claim, m.volume_id, false, move || {
            let result = store.put(&updated.id, &updated).map_err(VolumeError::Store);
            let record = match &result {
                Ok(()) => {
                    info!(volume.id = %updated.id, volume.pv = %updated.binding.pv, volume.claim = ?updated.binding.claim(),
                          "volume's binding recorded: its drive's note names its PV and claim");
                    updated
                }
                Err(_) => rec,
            };
            Outcome { record: Some(record), result }
        })
    }
}
