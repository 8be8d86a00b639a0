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

impl Handler<super::ListServedVolumes> for VolumeManager {
    type Result = MessageResult<super::ListServedVolumes>;
    fn handle(&mut self, _: super::ListServedVolumes, _: &mut Context<Self>) -> Self::Result {
        let here: std::collections::BTreeSet<&str> =
            self.book.drives().filter(|d| d.class == crate::words::DriveClass::Managed).map(|d| d.id.as_str()).collect();
        MessageResult(self.book.records().filter(|r| r.is_volume() && !r.lost && here.contains(r.drive_id.as_str())).cloned().collect())
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
