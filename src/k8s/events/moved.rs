//! Events about a volume moved off an evacuated drive, or moved to grow (no room after
//! it on its drive): the volume manager's [`VolumeMoved`] becomes an Event on the
//! volume's claim and on its PV, so `kubectl describe pvc` says where its data went.
//!
//! Rules:
//! - Who hears: the PV whose `spec.csi.driver` is our driver and whose
//!   `spec.csi.volumeHandle` is the volume id, and its claim when it is bound to one
//!   ([`super::targets::claim_of`], as the condition Events find it). No PV of ours: no
//!   one to tell (a volume made outside Kubernetes).
//! - What is said ([`moved_events`]): a Normal `VolumeMoved`, action `Evacuate`, "volume
//!   pvc-… moved from drive X to drive Y (1.0 GiB copied and verified); its data, id and
//!   claim are unchanged" (action `Resize` for a growth: "volume pvc-… moved from drive
//!   X to drive Y to grow to 3.0 GiB, as no room was left after it (...)", or "to a
//!   bigger free extent of drive X"); and when blocks of it could not be read (a forced
//!   evacuation only), a Warning `VolumeDataUnreadable` naming the byte ranges that read
//!   as zeros now. Notes are cut to the Events API's 1 KiB.
//! - Best effort, like the condition Events: the lookup is retried once after
//!   [`super::reporter::RETRY_AFTER`], so is each Event that failed; then the failure is
//!   logged and dropped. The PVs are listed with `resourceVersion=0` (served from the API
//!   server's cache); moves are rare (one per volume of an evacuated drive).
//! - An actor fed by the volume manager's [`VolumeMoved`] notifications, not a
//!   controller of the shell (`crate::k8s::shell`): as the condition Events, nothing is
//!   watched and a report is best effort, not reconciled until done.

use std::time::Duration;

use actix::prelude::*;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume};
use kube::api::{Api, ListParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource};
use tracing::{debug, info, warn};

use super::condition_event::truncate_note;
use super::reporter::RETRY_AFTER;
use super::targets::{claim_of, is_volume, ClaimLookup};
use crate::actors::volumes::VolumeMoved;
use crate::config::human_bytes;
use crate::k8s::identity::Identity;

/// Reason of the Event saying where a volume's data went.
pub(crate) const REASON_MOVED: &str = "VolumeMoved";
/// Reason of the Warning naming the ranges of a moved volume that could not be read.
pub(crate) const REASON_UNREADABLE: &str = "VolumeDataUnreadable";
/// Action of both, for an evacuation's move.
pub(crate) const ACTION: &str = "Evacuate";
/// The action of the Event of a growth by moving.
pub(crate) const ACTION_GROW: &str = "Resize";

/// What is said of `m` (see the module rules).
pub(crate) fn moved_events(m: &VolumeMoved) -> Vec<Event> {
    let (action, note) = match m.grown_to {
        None => (ACTION, format!(
            "volume {} moved from drive {} to drive {} ({} copied and verified); its data, id and claim are unchanged",
            m.name,
            m.from_drive,
            m.to_drive,
            human_bytes(m.bytes)
        )),
        Some(size) => (ACTION_GROW, format!(
            "volume {} moved {} to grow to {}, as no room was left after it ({} copied and verified); its data, id and claim are unchanged",
            m.name,
            if m.from_drive == m.to_drive { format!("to a bigger free extent of drive {}", m.to_drive) } else { format!("from drive {} to drive {}", m.from_drive, m.to_drive) },
            human_bytes(size),
            human_bytes(m.bytes)
        )),
    };
    let mut out = vec![Event { type_: EventType::Normal, reason: REASON_MOVED.into(), note: Some(truncate_note(&note).to_string()), action: action.into(), secondary: None }];
    if !m.unreadable.is_empty() {
        let total: u64 = m.unreadable.iter().map(|(_, l)| l).sum();
        let note = format!(
            "volume {} was moved by a forced evacuation although {} of it could not be read on drive {}: these ranges read as zeros now: {}; restore them from a backup",
            m.name,
            human_bytes(total),
            m.from_drive,
            crate::disk::mover::ranges_words(&m.unreadable)
        );
        out.push(Event { type_: EventType::Warning, reason: REASON_UNREADABLE.into(), note: Some(truncate_note(&note).to_string()), action: action.into(), secondary: None });
    }
    out
}

/// The objects to tell about a move of `volume_id` among `pvs`: its claim (when bound)
/// and its PV.
pub(crate) fn move_targets(pvs: &[PersistentVolume], driver: &str, volume_id: &str) -> Vec<ObjectReference> {
    let Some(pv) = pvs.iter().find(|pv| is_volume(pv, driver, volume_id)) else { return Vec::new() };
    let mut out = Vec::new();
    if let ClaimLookup::Claimed { claim, .. } = claim_of(pv) {
        out.push(claim);
    }
    out.push(pv.object_ref(&()));
    out
}

/// The actor recording the Events of each [`VolumeMoved`] (subscribe it with
/// `SubscribeMoves`).
pub(crate) struct MoveEvents {
    client: Client,
    identity: Identity,
    cache: Option<crate::k8s::cache::NodeCache>,
    retry_after: Duration,
}

impl MoveEvents {
    /// Records Events for our driver on this node (`identity`).
    pub(crate) fn new(client: Client, identity: Identity) -> Self {
        Self { client, identity, cache: None, retry_after: RETRY_AFTER }
    }

    /// Find the moved volume's PV in this node's cache once it has listed.
    pub(crate) fn with_cache(mut self, cache: crate::k8s::cache::NodeCache) -> Self {
        self.cache = Some(cache);
        self
    }
}

impl Actor for MoveEvents {
    type Context = Context<Self>;
}

impl Supervised for MoveEvents {}

/// Who to tell about a move of `volume_id`: found in this node's cache, else among this
/// node's PVs as the API server's watch cache lists them.
async fn targets(client: &Client, identity: &Identity, cache: Option<&crate::k8s::cache::NodeCache>, volume_id: &str) -> Result<Vec<ObjectReference>, kube::Error> {
    if let Some(cache) = cache.filter(|c| c.ready()) {
        let found: Vec<PersistentVolume> = cache.pv_of_volume(&identity.driver, volume_id).map(|pv| PersistentVolume::clone(&pv)).into_iter().collect();
        return Ok(move_targets(&found, &identity.driver, volume_id));
    }
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let list = pvs.list(&ListParams::default().labels(&crate::k8s::scope::Scope::selector(&identity.node)).match_any()).await?;
    Ok(move_targets(&list.items, &identity.driver, volume_id))
}

/// Records the Events of `m`; answers what failed, after one retry.
async fn report(client: Client, identity: Identity, cache: Option<crate::k8s::cache::NodeCache>, retry_after: Duration, m: VolumeMoved) -> Vec<String> {
    let found = match targets(&client, &identity, cache.as_ref(), &m.volume_id).await {
        Ok(t) => Ok(t),
        Err(first) => {
            debug!(volume.id = %m.volume_id, error = %first, "looking up the claim of a moved volume failed; retrying once");
            tokio::time::sleep(retry_after).await;
            targets(&client, &identity, cache.as_ref(), &m.volume_id).await
        }
    };
    let objs = match found {
        Ok(t) => t,
        Err(e) => return vec![format!("listing PersistentVolumes to find the claim of volume {}: {e}", m.volume_id)],
    };
    let recorder = Recorder::new(client, identity.reporter());
    let mut errors = Vec::new();
    for obj in &objs {
        for ev in moved_events(&m) {
            let mut res = recorder.publish(&ev, obj).await;
            if res.is_err() {
                tokio::time::sleep(retry_after).await;
                res = recorder.publish(&ev, obj).await;
            }
            if let Err(e) = res {
                errors.push(format!(
                    "recording the {} Event of volume {} on {} {}: {e}",
                    ev.reason,
                    m.volume_id,
                    obj.kind.as_deref().unwrap_or_default(),
                    obj.name.as_deref().unwrap_or_default()
                ));
            }
        }
    }
    if objs.is_empty() {
        debug!(volume.id = %m.volume_id, "no PV of ours names the moved volume: no Event");
    } else {
        info!(volume.id = %m.volume_id, drive.from = %m.from_drive, drive.to = %m.to_drive, objects = objs.len(), "volume move told on its claim and PV");
    }
    errors
}

impl Handler<VolumeMoved> for MoveEvents {
    type Result = ();
    fn handle(&mut self, m: VolumeMoved, ctx: &mut Context<Self>) {
        let volume_id = m.volume_id.clone();
        let work = report(self.client.clone(), self.identity.clone(), self.cache.clone(), self.retry_after, m);
        ctx.spawn(work.into_actor(self).map(move |errors, _, _| {
            for e in errors {
                warn!(actor = "move-events", volume.id = %volume_id, error = %e, "could not record a volume move Event");
            }
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolumeSpec, PersistentVolumeStatus};

    fn moved(unreadable: Vec<(u64, u64)>) -> VolumeMoved {
        VolumeMoved {
            volume_id: "vol-1".into(),
            name: "pvc-123".into(),
            from_drive: "wwn-old".into(),
            to_drive: "wwn-new".into(),
            bytes: 1 << 30,
            unreadable,
            grown_to: None,
        }
    }

    #[test]
    fn a_growth_by_moving_says_where_the_volume_went_and_its_new_size() {
        let to_another = VolumeMoved { grown_to: Some(3 << 30), ..moved(vec![]) };
        let evs = moved_events(&to_another);
        assert_eq!((evs.len(), evs[0].reason.as_str(), evs[0].action.as_str()), (1, REASON_MOVED, ACTION_GROW));
        assert_eq!(
            evs[0].note.as_deref(),
            Some("volume pvc-123 moved from drive wwn-old to drive wwn-new to grow to 3.0 GiB, as no room was left after it (1.0 GiB copied and verified); its data, id and claim are unchanged")
        );
        let on_its_own = VolumeMoved { grown_to: Some(3 << 30), to_drive: "wwn-old".into(), ..moved(vec![]) };
        let note = moved_events(&on_its_own)[0].note.clone().unwrap_or_default();
        assert!(note.starts_with("volume pvc-123 moved to a bigger free extent of drive wwn-old to grow to 3.0 GiB"), "{note}");
    }

    #[test]
    fn a_move_says_where_the_data_went_and_that_nothing_else_changed() {
        let evs = moved_events(&moved(vec![]));
        assert_eq!(evs.len(), 1);
        let e = &evs[0];
        assert!(matches!(e.type_, EventType::Normal));
        assert_eq!((e.reason.as_str(), e.action.as_str()), (REASON_MOVED, ACTION));
        assert_eq!(
            e.note.as_deref(),
            Some("volume pvc-123 moved from drive wwn-old to drive wwn-new (1.0 GiB copied and verified); its data, id and claim are unchanged")
        );
    }

    #[test]
    fn a_forced_move_with_unreadable_blocks_adds_a_warning_naming_the_ranges() {
        let evs = moved_events(&moved(vec![(4096, 8192), (1 << 20, 4096)]));
        assert_eq!(evs.len(), 2);
        assert!(matches!(evs[1].type_, EventType::Warning));
        assert_eq!(evs[1].reason, REASON_UNREADABLE);
        let note = evs[1].note.clone().unwrap_or_default();
        assert!(note.contains("12.0 KiB of it could not be read on drive wwn-old"), "{note}");
        assert!(note.contains("8.0 KiB at byte 4096, 4.0 KiB at byte 1048576"), "{note}");
        let many = moved_events(&moved((0..500).map(|i| (i * 8192, 4096)).collect()));
        assert!(many[1].note.as_ref().is_some_and(|n| n.len() <= 1024), "cut to the Events API's limit");
    }

    fn pv(name: &str, driver: &str, handle: &str, claim: Option<(&str, &str)>, phase: &str) -> PersistentVolume {
        let mut pv = PersistentVolume::default();
        pv.metadata.name = Some(name.into());
        pv.metadata.uid = Some(format!("uid-{name}"));
        pv.spec = Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource { driver: driver.into(), volume_handle: handle.into(), ..Default::default() }),
            claim_ref: claim.map(|(ns, n)| ObjectReference { namespace: Some(ns.into()), name: Some(n.into()), uid: Some("c-uid".into()), ..Default::default() }),
            ..Default::default()
        });
        pv.status = Some(PersistentVolumeStatus { phase: Some(phase.into()), ..Default::default() });
        pv
    }

    #[test]
    fn the_claim_and_the_pv_of_our_driver_hear_of_a_move() {
        let pvs = vec![
            pv("pv-other", "other.csi", "vol-1", Some(("x", "y")), "Bound"),
            pv("pv-1", "csi.drivelet.io", "vol-1", Some(("apps", "data")), "Bound"),
            pv("pv-2", "csi.drivelet.io", "vol-2", None, "Available"),
        ];
        let names = |v: Vec<ObjectReference>| v.into_iter().map(|o| (o.kind.unwrap_or_default(), o.namespace, o.name.unwrap_or_default())).collect::<Vec<_>>();
        assert_eq!(
            names(move_targets(&pvs, "csi.drivelet.io", "vol-1")),
            vec![
                ("PersistentVolumeClaim".to_string(), Some("apps".to_string()), "data".to_string()),
                ("PersistentVolume".to_string(), None, "pv-1".to_string())
            ]
        );
        assert_eq!(names(move_targets(&pvs, "csi.drivelet.io", "vol-2")), vec![("PersistentVolume".to_string(), None, "pv-2".to_string())], "unbound: the PV alone");
        assert!(move_targets(&pvs, "csi.drivelet.io", "vol-9").is_empty(), "no PV: no one to tell");
    }
}
