//! The node side's calls: stage, unstage, publish, unpublish, node expand, and the
//! stats kubelet asks of a staged or published volume.
//!
//! Rules: a node call claims its volume like any other; stage, publish and node
//! expand need its drive present, unstage and unpublish do not (a mount of a volume
//! whose drive is gone can still be taken down); stats read a filesystem's usage off
//! the actor thread, and a block volume is known by kubelet's own bind of its device.

use std::sync::Arc;

use actix::prelude::*;

use super::super::book::{Claim, VolumeBook};
use super::super::error::VolumeError;
use super::super::messages::{NodeExpandVolume, PublishVolume, StageVolume, UnpublishVolume, UnstageVolume, VolumeStats, VolumeStatus};
use super::super::model::VolumeRecord;
use super::super::steps;
use super::super::{reply, Reply, VolumeManager};
use crate::store::Store;
use crate::words::DriveLoc;

impl VolumeManager {
    /// Claims a volume for a node call: ready, known, not busy; the drive when present.
    fn node_call(&mut self, id: &str, need_drive: bool) -> Result<(Claim, Arc<Store>, VolumeRecord, Option<DriveLoc>), VolumeError> {
        let (rec, loc) = self.book.node_call(id, need_drive)?;
        let (claim, store) = self.claim(id)?;
        Ok((claim, store, rec, loc))
    }
}

impl Handler<StageVolume> for VolumeManager {
    type Result = Reply<()>;
    fn handle(&mut self, m: StageVolume, _: &mut Context<Self>) -> Self::Result {
        let (claim, store, rec, loc) = match self.node_call(&m.volume_id, true) {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        let roots = self.book.allowed_roots().to_vec();
        let guards = self.book.guards();
        self.run(claim, m.volume_id, move || steps::stage(&store, &guards, loc.as_ref(), &roots, rec, m.args))
    }
}

impl Handler<UnstageVolume> for VolumeManager {
    type Result = Reply<()>;
    fn handle(&mut self, m: UnstageVolume, _: &mut Context<Self>) -> Self::Result {
        let (claim, store, rec, loc) = match self.node_call(&m.volume_id, false) {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        let guards = self.book.guards();
        let roots = self.book.allowed_roots().to_vec();
        self.run(claim, m.volume_id, move || steps::unstage(&store, &guards, loc.as_ref(), &roots, rec, &m.path))
    }
}

impl Handler<PublishVolume> for VolumeManager {
    type Result = Reply<()>;
    fn handle(&mut self, m: PublishVolume, _: &mut Context<Self>) -> Self::Result {
        let (claim, store, rec, loc) = match self.node_call(&m.volume_id, true) {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        let roots = self.book.allowed_roots().to_vec();
        self.run(claim, m.volume_id, move || steps::publish(&store, loc.as_ref(), &roots, rec, m.args))
    }
}

impl Handler<UnpublishVolume> for VolumeManager {
    type Result = Reply<()>;
    fn handle(&mut self, m: UnpublishVolume, _: &mut Context<Self>) -> Self::Result {
        let (claim, store, rec, loc) = match self.node_call(&m.volume_id, false) {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        let roots = self.book.allowed_roots().to_vec();
        self.run(claim, m.volume_id, move || steps::unpublish(&store, loc.as_ref(), &roots, rec, &m.target))
    }
}

impl Handler<NodeExpandVolume> for VolumeManager {
    type Result = Reply<u64>;
    fn handle(&mut self, m: NodeExpandVolume, _: &mut Context<Self>) -> Self::Result {
        let checked = self.node_call(&m.volume_id, true).and_then(|(claim, _, rec, loc)| {
            let loc = VolumeBook::node_expand_check(&m, &rec, loc)?;
            Ok((claim, rec, loc))
        });
        let (claim, rec, loc) = match checked {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        let roots = self.book.allowed_roots().to_vec();
        self.run(claim, m.volume_id, move || steps::node_expand(&loc, &roots, rec))
    }
}

impl Handler<VolumeStats> for VolumeManager {
    type Result = Reply<(VolumeStatus, Option<crate::disk::fs::Usage>)>;
    fn handle(&mut self, m: VolumeStats, _: &mut Context<Self>) -> Self::Result {
        let status = match self.book.status(&m.volume_id) {
            Ok(s) => s,
            Err(e) => return reply(Err(e)),
        };
        let rec = &status.record;
        let known = rec.staging.as_ref().is_some_and(|s| s.path == m.path) || rec.targets.contains_key(&m.path);
        let not_found = VolumeError::NotFound { volume_id: format!("{} at path {}", m.volume_id, m.path.display()) };
        if !known {
            // kubelet asks for a block volume at its own bind of the published device.
            let Some(loc) = self.book.loc_of(rec).filter(|_| rec.block) else { return reply(Err(not_found)) };
            let roots = self.book.allowed_roots().to_vec();
            let path = m.path;
            return Box::pin(
                async move {
                    let rec = status.record.clone();
                    let found = tokio::task::spawn_blocking(move || steps::is_device_of(&path, &roots, &loc, &rec)).await;
                    (status, found)
                }
                .into_actor(self)
                .map(move |(status, found), _, _| match found {
                    Ok(true) => Ok((status, None)),
                    _ => Err(not_found),
                }),
            );
        }
        if status.record.block {
            return reply(Ok((status, None)));
        }
        let path = m.path;
        let roots = self.book.allowed_roots().to_vec();
        Box::pin(async move { tokio::task::spawn_blocking(move || steps::node::usage_at(&path, &roots)).await }.into_actor(self).map(
            move |res, _, _| match res {
                Ok(Ok(u)) => Ok((status, Some(u))),
                Ok(Err(e)) => {
                    let mut st = status;
                    st.condition.abnormal = true;
                    st.condition.message = format!("{}; usage cannot be read: {e}", st.condition.message);
                    Ok((st, None))
                }
                Err(e) => Err(VolumeError::Panicked { volume_id: status.record.id.clone(), reason: e.to_string() }),
            },
        ))
    }
}

