//! The controller side's calls: create (with clones and restores), delete, attach,
//! detach, expand (in place, or by moving a volume no pod uses to a bigger extent of
//! another drive or of its own: [`crate::actors::volumes::steps::moves`]), adopt, and
//! the binding a volume serves in Kubernetes.
//!
//! Rules: the book decides each call
//! ([`begin_create`](super::super::book::VolumeBook::begin_create) a create's attempt);
//! a create the GPT writer refused goes on to the next drive as the same call, claimed
//! again; a create that fits only in space still being cleaned waits for
//! the cleaner's next step; a binding equal to the record's writes nothing, another is
//! stored off the actor thread (a failed store keeps the record as it was). A clone whose
//! claim is known tells subscribers how a copy of a source in use went, or why it was
//! refused ([`CloneNotice`]).

use std::sync::Arc;

use actix::prelude::*;
use tracing::info;

use super::super::book::{Claim, CreateCall, CreatePlan, CreateStart, ExpandPlan, MovePlan};
use super::super::error::VolumeError;
use super::super::messages::{
    AdoptVolume, AttachPreview, AttachVolume, CloneNotice, CloneOutcome, CreateVolume, DeleteVolume, DetachVolume, ExpandVolume, PublishContext,
    SetBinding, SubscribeClones,
};
use super::super::model::VolumeRecord;
use super::super::steps::{self, moves, Outcome};
use super::super::{reply, Reply, VolumeManager};
use crate::actors::messages::DriveRefused;
use crate::store::Store;

impl Handler<CreateVolume> for VolumeManager {
    type Result = Reply<VolumeRecord>;
    fn handle(&mut self, m: CreateVolume, _: &mut Context<Self>) -> Self::Result {
        // An encrypting class on a node whose kernel cannot encrypt ext4: said at once,
        // not at the first stage of a volume made for nothing.
        if m.encrypting() && !crate::disk::fscrypt::supported() {
            return reply(Err(VolumeError::EncryptionKey {
                volume_id: m.name.clone(),
                reason: format!("this node's kernel cannot encrypt ext4 ({} is absent): use a StorageClass without drivelet.io/encryption here", crate::disk::fscrypt::EXT4_FEATURE),
            }));
        }
        let watch = CloneWatch::of(&m);
        let call = self.book.create_call(m);
        let res = match self.claim(&call.id) {
            Ok((claim, store)) => self.create(call, claim, store),
            Err(e) => reply(Err(e)),
        };
        let Some(watch) = watch else { return res };
        Box::pin(res.map(move |res, act, _| {
            if let Some(notice) = watch.notice(&res) {
                crate::actors::tell_all(&mut act.clone_subscribers, &notice);
            }
            res
        }))
    }
}

impl Handler<SubscribeClones> for VolumeManager {
    type Result = ();
    fn handle(&mut self, m: SubscribeClones, _: &mut Context<Self>) {
        self.clone_subscribers.push(m.0);
    }
}

/// A clone whose claim is known, watched for what its claim should hear: a copy of a
/// source in use (frozen, or crash-inconsistent), or a refusal because of it.
struct CloneWatch {
    claim: crate::words::Binding,
    name: String,
    source_id: String,
}

impl CloneWatch {
    /// The watch of CreateVolume `m`, when it clones a volume and names its claim.
    fn of(m: &CreateVolume) -> Option<CloneWatch> {
        let source_id = m.source.clone().filter(|_| !m.from_snapshot)?;
        (!m.binding.claim_name.is_empty()).then(|| CloneWatch { claim: m.binding.clone(), name: m.name.clone(), source_id })
    }

    /// What the claim hears of the create's answer `res`, if anything.
    fn notice(self, res: &Result<VolumeRecord, VolumeError>) -> Option<CloneNotice> {
        use super::super::error::InUse;
        use super::super::model::InUseCopy;
        let what = match res {
            Ok(rec) => match rec.copied_in_use? {
                InUseCopy::Frozen { millis } => CloneOutcome::Frozen { millis },
                InUseCopy::CrashInconsistent => CloneOutcome::CrashInconsistent,
            },
            Err(e @ VolumeError::SourceInUse { why, .. }) => CloneOutcome::Refused {
                kind: match why {
                    InUse::Refused => "refused",
                    InUse::Block => "block",
                    InUse::Encrypted => "encrypted",
                    InUse::TooLong { .. } => "too-long",
                },
                reason: e.to_string(),
            },
            Err(e @ VolumeError::FreezeExpired { .. }) => CloneOutcome::Refused { kind: "freeze-expired", reason: e.to_string() },
            Err(_) => return None,
        };
        Some(CloneNotice { claim: self.claim, name: self.name, source_id: self.source_id, what })
    }
}

impl VolumeManager {
    /// One attempt of a claimed CreateVolume, as the book decides it. When the GPT
    /// writer refuses the drive placement picked, nothing is left of the attempt, the
    /// drive turns foreign (here, and in the inventory by [`DriveRefused`]), and the same
    /// call goes on to the next drive.
    fn create(&mut self, mut call: CreateCall, claim: Claim, store: Arc<Store>) -> Reply<VolumeRecord> {
        let (rec, loc, from) = match self.book.begin_create(&mut call) {
            CreateStart::Answer(res) => return reply(res),
            CreateStart::WaitForCleaning(left) => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                self.clean_waiters.push(tx);
                let waited = async move {
                    let _ = tokio::time::timeout(left, rx).await;
                };
                return Box::pin(waited.into_actor(self).then(move |_, act, _| act.create(call, claim, store)));
            }
            CreateStart::Run { rec, loc, from } => (rec, loc, from),
        };
        let drive_id = rec.drive_id.clone();
        let job_store = store.clone();
        Box::pin(self.run(claim, call.id.clone(), move || steps::create(&job_store, &loc, rec, from.as_ref())).then(move |res, act, _| {
            let Some(found) = res.as_ref().err().and_then(VolumeError::refused_drive) else {
                return reply(res);
            };
            act.book.create_refused(&mut call, &drive_id, found);
            act.inventory.do_send(DriveRefused { drive_id, found: found.to_string() });
            // The attempt's record is gone and the call is still this one: claim the
            // volume again for the next attempt.
            match act.book.claim(&call.id) {
                Ok(claim) => act.create(call, claim, store),
                Err(_) => reply(Err(VolumeError::Busy { volume_id: call.id })),
            }
        }))
    }
}

impl Handler<DeleteVolume> for VolumeManager {
    type Result = Reply<()>;
    fn handle(&mut self, m: DeleteVolume, _: &mut Context<Self>) -> Self::Result {
        let id = m.volume_id;
        let (claim, store) = match self.claim(&id) {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        let Some(rec) = self.book.plan_delete(&id) else { return reply(Ok(())) };
        let loc = self.book.loc_of(&rec);
        info!(volume.id = %id, drive.id = %rec.drive_id, "deleting volume");
        let guards = self.book.guards();
        self.run(claim, id, move || steps::delete(&store, &guards, loc.as_ref(), rec))
    }
}

impl Handler<AttachVolume> for VolumeManager {
    type Result = Reply<PublishContext>;
    fn handle(&mut self, m: AttachVolume, _: &mut Context<Self>) -> Self::Result {
        let checked = self.book.attach_refusal(&m).and_then(|rec| Ok((self.claim(&m.volume_id)?, rec)));
        let ((claim, store), rec) = match checked {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        let loc = self.book.loc_of(&rec);
        let guid = rec.part_guid;
        let (id, node) = (m.volume_id, m.node_id);
        if rec.published_node.is_none() {
            info!(volume.id = %id, node.name = %node, "attaching volume to node");
        }
        Box::pin(
            self.run(claim, id, move || steps::controller_publish(&store, loc.as_ref(), rec, node))
                .map(move |res, _, _| res.map(|device| PublishContext { device, part_guid: guid })),
        )
    }
}

impl Handler<AttachPreview> for VolumeManager {
    type Result = Result<(), VolumeError>;
    fn handle(&mut self, m: AttachPreview, _: &mut Context<Self>) -> Self::Result {
        self.book.attach_refusal(&m.0).map(|_| ())
    }
}

impl Handler<DetachVolume> for VolumeManager {
    type Result = Reply<()>;
    fn handle(&mut self, m: DetachVolume, _: &mut Context<Self>) -> Self::Result {
        let planned = self.store().and_then(|store| Ok((store, self.book.plan_detach(&m)?)));
        let (store, (rec, attached)) = match planned {
            Ok((store, Some(plan))) => (store, plan),
            Ok((_, None)) => return reply(Ok(())),
            Err(e) => return reply(Err(e)),
        };
        let claim = match self.book.claim(&m.volume_id) {
            Ok(c) => c,
            Err(e) => return reply(Err(e)),
        };
        // The store commit runs off the actor thread; the checks' findings still hold.
        self.run_with(claim, m.volume_id, false, move || {
            let result = store.put(&rec.id, &rec).map_err(VolumeError::Store);
            let record = match &result {
                Ok(()) => {
                    info!(volume.id = %rec.id, node.name = %attached, "volume detached from node");
                    rec
                }
                Err(_) => VolumeRecord { published_node: Some(attached), ..rec },
            };
            Outcome { record: Some(record), result }
        })
    }
}

impl Handler<ExpandVolume> for VolumeManager {
    type Result = Reply<(u64, bool)>;
    fn handle(&mut self, m: ExpandVolume, _: &mut Context<Self>) -> Self::Result {
        let deadline = std::time::Instant::now() + self.book.cleaning_wait();
        self.expand(m, deadline)
    }
}

impl VolumeManager {
    /// One attempt of an ExpandVolume, as the book decides it; a growth in place that
    /// waits for the space after the volume to be cleaned is decided again after each
    /// step of the cleaner, until `deadline`.
    fn expand(&mut self, m: ExpandVolume, deadline: std::time::Instant) -> Reply<(u64, bool)> {
        let plan = match self.book.expand_check(&m) {
            Ok(ExpandPlan::WaitForCleaning { reason }) => {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return reply(Err(VolumeError::ResourceExhausted { reason }));
                }
                let (tx, rx) = tokio::sync::oneshot::channel();
                self.clean_waiters.push(tx);
                let waited = async move {
                    let _ = tokio::time::timeout(left, rx).await;
                };
                return Box::pin(waited.into_actor(self).then(move |_, act, _| act.expand(m, deadline)));
            }
            Ok(plan) => plan,
            Err(e) => return reply(Err(e)),
        };
        let (claim, store) = match self.claim(&m.volume_id) {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        match plan {
            ExpandPlan::InPlace { rec, loc, new_size } => {
                let node_step = !rec.block;
                // The space is the volume's from now on: a create placed meanwhile sees it taken.
                self.book.reserve(VolumeRecord { size: new_size, ..rec.clone() });
                Box::pin(
                    self.run(claim, m.volume_id, move || steps::expand(&store, &loc, rec, new_size))
                        .map(move |res, _, _| res.map(|size| (size, node_step))),
                )
            }
            ExpandPlan::Move(plan) => self.grow_by_moving(claim, store, plan),
            ExpandPlan::WaitForCleaning { reason } => reply(Err(VolumeError::ResourceExhausted { reason })),
        }
    }
}

impl VolumeManager {
    /// Grows a volume no pod uses by moving it to the bigger extent `plan` names on
    /// another drive or its own (evacuation's move steps: a verified copy, the same id,
    /// crash-safe); the switch to the copy is the growth. The old partition's space goes
    /// to the cleaner (or the copy's, when the move is rolled back).
    fn grow_by_moving(&mut self, claim: Claim, store: Arc<Store>, plan: MovePlan) -> Reply<(u64, bool)> {
        let Some(to) = plan.rec.moving.as_deref().cloned() else {
            return reply(Err(VolumeError::InvalidArgument { reason: format!("volume {} has no move planned", plan.rec.id) }));
        };
        let (id, name, from_drive, node_step) = (plan.rec.id.clone(), plan.rec.name.clone(), plan.rec.drive_id.clone(), !plan.rec.block);
        info!(volume.id = %id, drive.from = %from_drive, drive.to = %to.drive_id, volume.old_size = plan.rec.size, volume.size = to.size,
              "growing volume by moving it: no room after it on its drive");
        self.book.start_grow_move(&plan);
        self.announce(&from_drive);
        let guards = self.book.guards();
        let job = move || {
            let progress = std::sync::atomic::AtomicU64::new(0);
            moves::move_volume(&store, &guards, plan, false, &progress)
        };
        Box::pin(self.run(claim, id.clone(), job).map(move |res, act, _| {
            crate::metrics::metrics().record_move(res.as_ref().ok().map(|d| d.bytes));
            act.announce(&to.drive_id);
            act.announce(&from_drive);
            match res {
                Ok(done) => {
                    info!(volume.id = %id, drive.from = %done.from_drive, drive.to = %done.to_drive, volume.size = to.size, move.millis = done.millis, "volume grown by a move");
                    let moved = super::super::messages::VolumeMoved {
                        volume_id: id.clone(),
                        name,
                        from_drive: done.from_drive,
                        to_drive: done.to_drive,
                        bytes: done.bytes,
                        unreadable: done.unreadable,
                        grown_to: Some(to.size),
                    };
                    crate::actors::tell_all(&mut act.move_subscribers, &moved);
                    Ok((to.size, node_step))
                }
                Err(e) => Err(e),
            }
        }))
    }
}

impl Handler<AdoptVolume> for VolumeManager {
    type Result = Reply<VolumeRecord>;
    fn handle(&mut self, m: AdoptVolume, _: &mut Context<Self>) -> Self::Result {
        let shown = m.path.display().to_string();
        let refuse = move |reason: String| VolumeError::InvalidArgument { reason: format!("cannot adopt {shown}: {reason}") };
        // The directory is looked at off the actor thread (statvfs may hang on a sick
        // filesystem); the book decides once it is known.
        let path = m.path.clone();
        Box::pin(async move { tokio::task::spawn_blocking(move || steps::node::probe_adoptable(&path)).await }.into_actor(self).then(move |probed, act, _| {
            match probed.map_err(|e| e.to_string()).and_then(|p| p) {
                Ok((canonical, devnum, size)) => act.adopt(m, &canonical, devnum, size),
                Err(e) => reply(Err(refuse(e))),
            }
        }))
    }
}

impl VolumeManager {
    /// Adopts the probed directory `canonical` as the book decides.
    fn adopt(&mut self, m: AdoptVolume, canonical: &std::path::Path, devnum: Option<(u32, u32)>, size: u64) -> Reply<VolumeRecord> {
        let rec = match self.book.plan_adopt(&m, canonical, devnum, size) {
            Ok(CreatePlan::Existing(rec)) => return reply(Ok(rec)),
            Ok(CreatePlan::New(rec)) => rec,
            Err(e) => return reply(Err(e)),
        };
        let (claim, store) = match self.claim(&m.volume_id) {
            Ok(x) => x,
            Err(e) => return reply(Err(e)),
        };
        info!(volume.id = %rec.id, volume.path = ?rec.adopted.as_ref().map(|a| &a.path), drive.id = %rec.drive_id, "adopting volume");
        self.run(claim, m.volume_id, move || match store.put(&rec.id, &rec) {
            Ok(()) => Outcome { record: Some(rec.clone()), result: Ok(rec) },
            Err(e) => Outcome { record: None, result: Err(VolumeError::Store(e)) },
        })
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
        let (claim, store) = match self.claim(&m.volume_id) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::volumes::error::InUse;
    use crate::actors::volumes::model::{InUseCopy, VolumeState};

    fn create(source: Option<&str>, from_snapshot: bool, claim: &str) -> CreateVolume {
        CreateVolume {
            source: source.map(str::to_string),
            from_snapshot,
            binding: crate::words::Binding { claim_namespace: "db".into(), claim_name: claim.into(), ..Default::default() },
            ..CreateVolume::for_test("pvc-9")
        }
    }

    #[test]
    fn a_clone_with_a_claim_tells_it_how_a_copy_in_use_went_and_nothing_else() {
        assert!(CloneWatch::of(&create(None, false, "c")).is_none(), "not a clone");
        assert!(CloneWatch::of(&create(Some("s"), true, "c")).is_none(), "a restore: its source is never in use");
        assert!(CloneWatch::of(&create(Some("s"), false, "")).is_none(), "no claim to tell");
        let watch = || CloneWatch::of(&create(Some("s"), false, "copy")).expect("a clone with a claim");
        let rec = |how: Option<InUseCopy>| VolumeRecord { copied_in_use: how, ..VolumeRecord::for_test(1, VolumeState::Available) };
        assert_eq!(watch().notice(&Ok(rec(None))), None, "a source not in use: nothing to say");
        let n = watch().notice(&Ok(rec(Some(InUseCopy::Frozen { millis: 40 })))).expect("frozen");
        assert_eq!((n.claim.claim_name.as_str(), n.name.as_str(), n.source_id.as_str(), n.what), ("copy", "pvc-9", "s", CloneOutcome::Frozen { millis: 40 }));
        assert_eq!(watch().notice(&Ok(rec(Some(InUseCopy::CrashInconsistent)))).map(|n| n.what), Some(CloneOutcome::CrashInconsistent));
        let refused = VolumeError::SourceInUse { source_id: "s".into(), path: "/k/s".into(), why: InUse::Block };
        let words = refused.to_string();
        assert_eq!(watch().notice(&Err(refused)).map(|n| n.what), Some(CloneOutcome::Refused { kind: "block", reason: words }));
        let expired = VolumeError::FreezeExpired { volume_id: "s".into(), limit_millis: 10, clone: true };
        assert!(matches!(watch().notice(&Err(expired)).map(|n| n.what), Some(CloneOutcome::Refused { kind: "freeze-expired", .. })));
        assert_eq!(watch().notice(&Err(VolumeError::NotReady)), None, "other errors are the provisioner's to tell");
    }
}
