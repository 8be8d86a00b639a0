//! The note keeper: every managed drive's note ([`crate::disk::note`]) says what the
//! volume manager's records say of it: this node of this cluster owns it, and each of its
//! volumes is what its record is (name, size, block or filesystem, parameters, PV and
//! claim). A drive's data can then be given back to its claims from the disk alone: after
//! the state dir is lost, on another node, in a rebuilt cluster.
//!
//! Rules:
//! - a change of the partition table changes the note in the same commit (the GPT
//!   writer's [`gpt::NoteEdit`]: a volume made is in the note from the flush that makes
//!   it exist; removed, grown, moved the same), so most changes need nothing more;
//! - the keeper writes what the table's commits do not carry (the claim's uid and class
//!   learnt from the cluster, a filesystem other than the one asked at create, a disk
//!   from before notes; whether a filesystem was made is not noted: a volume rebuilt
//!   from its note is probed for it): it follows the published view ([`super::view`]), a second after the last
//!   change works out each managed drive's note ([`desired`], a pure function), reads
//!   the note on the disk without a lock and writes, one drive at a time, off the actor
//!   threads, under the drive's lock, only where they differ; a loop device being
//!   detached is left alone (a descriptor open on it would hold its removal up);
//! - a write goes through [`gpt::write_note`], which refuses a disk whose note names
//!   another owner or cannot be read, and keeps who owned a disk before it was adopted;
//!   a disk with partitions and no note this node does not know is never one of the
//!   managed drives the keeper writes (its class is `owned-elsewhere`);
//! - a note written late is no loss: the store holds the same and the GPT says which
//!   partitions exist; reconciliation trusts the GPT for existence and the note only for
//!   what a partition is;
//! - a write that fails is logged once (per drive and error) and tried again at the next
//!   change.

use std::collections::BTreeMap;
use tracing::{debug, warn};

use super::model::VolumeRecord;
use super::view::{ViewReader, VolumesView};
use crate::disk::gpt;
use crate::disk::lock::DiskLock;
use crate::disk::note::{DiskNote, VolumeNote};
use crate::words::{DriveLoc, Owner};

/// A volume's entry in its drive's note, from its record.
pub(crate) fn note_of(r: &VolumeRecord) -> VolumeNote {
    VolumeNote {
        id: r.part_guid,
        name: r.name.clone(),
        size: r.size,
        block: r.block,
        fs_type: r.fs_type.clone(),
        created_unix: r.created_unix,
        parameters: (*r.parameters).clone(),
        snapshot: false,
        binding: r.binding.clone(),
    }
}

/// What each managed drive's note should list, by drive id, with where the drive is.
pub(crate) fn desired(view: &VolumesView) -> BTreeMap<String, (DriveLoc, Vec<VolumeNote>)> {
    let mut out: BTreeMap<String, (DriveLoc, Vec<VolumeNote>)> = view
        .drives()
        .iter()
        .filter(|d| !d.drive.blank)
        .map(|d| (d.drive.id.clone(), (super::book::drive_loc(&d.drive), Vec::new())))
        .collect();
    for l in view.volumes() {
        let r = &l.record;
        if r.adopted.is_some() || r.snapshot.is_some() {
            continue;
        }
        if let Some((_, notes)) = out.get_mut(&r.drive_id) {
            notes.push(note_of(r));
        }
    }
    for (_, notes) in out.values_mut() {
        notes.sort_by_key(|v| v.id);
    }
    out
}

/// The note to write over `current` for `volumes`: this node as owner, the adoption it
/// came from kept.
pub(crate) fn next_note(current: Option<&DiskNote>, me: &Owner, volumes: Vec<VolumeNote>) -> DiskNote {
    DiskNote { owner: me.clone(), adopted_from: current.and_then(|c| c.adopted_from.clone()), volumes }
}

/// A fingerprint of a drive's volume entries: what the keeper remembers of a note it
/// wrote (not the entries themselves, which would double the records' memory).
fn fingerprint(volumes: &[VolumeNote]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_vec(volumes).unwrap_or_default().hash(&mut h);
    h.finish()
}

/// Runs the keeper until the volume manager is gone for good.
pub(crate) async fn keep_notes(mut reader: ViewReader, me: Owner) {
    let mut written: BTreeMap<String, u64> = BTreeMap::new();
    let mut failed: BTreeMap<String, String> = BTreeMap::new();
    loop {
        let Some(view) = reader.latest() else { return };
        // Tests hold the keeper (`FAILPOINTS=notes.keeper=return`) to see what the
        // table's commits alone leave on a disk.
        let held = (|| {
            fail::fail_point!("notes.keeper", |_| true);
            false
        })();
        if view.is_ready() && !held {
            for (id, (loc, volumes)) in desired(&view) {
                let print = fingerprint(&volumes);
                if written.get(&id) == Some(&print) {
                    continue;
                }
                let count = volumes.len();
                let (me2, vols) = (me.clone(), volumes);
                let path = loc.path.clone();
                let res = tokio::task::spawn_blocking(move || {
                    if crate::disk::lock::detach_pending(&loc.path) {
                        return Ok(false);
                    }
                    // Most changes are in the note already (the table's commits carry
                    // them): no lock, no write.
                    let cur = gpt::read_note(&loc.path);
                    if cur.as_ref().is_some_and(|c| *c == next_note(Some(c), &me2, vols.clone())) {
                        return Ok(false);
                    }
                    let _lock = DiskLock::exclusive(&loc.path)?;
                    gpt::write_note(&loc.path, loc.sector, false, |cur| next_note(cur, &me2, vols))
                })
                .await;
                match res {
                    Ok(Ok(wrote)) => {
                        if wrote {
                            debug!(actor = "volumes", drive.id = %id, volumes = count, "drive note written");
                        }
                        failed.remove(&id);
                        written.insert(id, print);
                    }
                    Ok(Err(e)) => {
                        let msg = e.to_string();
                        if failed.get(&id) != Some(&msg) {
                            warn!(actor = "volumes", drive.id = %id, drive.path = %path.display(), error = %msg, "cannot write the drive's note of its owner and volumes; trying again at the next change");
                            failed.insert(id, msg);
                        }
                    }
                    Err(e) => warn!(actor = "volumes", error = %e, "note write task failed"),
                }
            }
            // Drives gone from the view are forgotten: one back is written again.
            let present: std::collections::BTreeSet<String> = view.drives().iter().map(|d| d.drive.id.clone()).collect();
            written.retain(|id, _| present.contains(id));
        }
        if reader.changed().await.is_err() {
            return;
        }
        // A burst of changes (a create, then its stage) is one look at the disks.
        tokio::time::sleep(SETTLE).await;
    }
}

/// How long the keeper lets changes settle before it looks at the disks.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::inventory::model::Drive;
    use crate::actors::volumes::conditions::Condition;
    use crate::actors::volumes::model::{VolumeRecord, VolumeState};
    use crate::actors::volumes::view::{DriveRoom, Listed};
    use crate::words::{Binding, Media};
    use std::sync::Arc;

    fn listed(n: u8, drive: &str) -> Listed {
        let mut r = VolumeRecord::for_test(n, VolumeState::Available);
        r.drive_id = drive.into();
        r.binding = Binding { pv: format!("pvc-{n}"), claim_namespace: "ns".into(), claim_name: format!("c{n}"), ..Default::default() };
        Listed { record: Arc::new(r), condition: Arc::new(Condition { abnormal: false, message: String::new(), entries: Vec::new() }) }
    }

    fn room(id: &str, blank: bool) -> DriveRoom {
        let mut d = Drive::for_test(id, Media::Virtual, 1 << 30);
        d.blank = blank;
        DriveRoom { drive: d, used: vec![], closed: false, slots_used: 0 }
    }

    #[test]
    fn each_drive_lists_its_own_volumes_with_their_claims() {
        let mut vols = vec![listed(1, "d1"), listed(2, "d2"), listed(3, "d1")];
        vols.sort_by(|a, b| a.record.id.cmp(&b.record.id));
        let v = VolumesView::ready(vols, vec![room("d1", false), room("d2", false), room("d3", false), room("blank", true)]);
        let d = desired(&v);
        assert_eq!(d.keys().collect::<Vec<_>>(), ["d1", "d2", "d3"], "a blank drive has no table to carry a note");
        let names: Vec<&str> = d["d1"].1.iter().map(|n| n.binding.claim_name.as_str()).collect();
        assert_eq!(names.len(), 2);
        assert!(names.contains(&"c1") && names.contains(&"c3"));
        assert!(d["d3"].1.is_empty(), "a drive with no volume still names its owner");
    }

    #[test]
    fn the_next_note_names_this_node_and_keeps_the_adoption() {
        let me = Owner { cluster: "c".into(), node: "n1".into() };
        let old = DiskNote { owner: me.clone(), adopted_from: Some(Owner { cluster: "c".into(), node: "n2".into() }), volumes: vec![] };
        let n = next_note(Some(&old), &me, vec![]);
        assert_eq!(n.adopted_from, old.adopted_from);
        assert_eq!(next_note(None, &me, vec![]).owner, me);
    }
}
