//! The book's decisions about clones (CreateVolume with a source volume).
//!
//! Rules:
//! - the source must be a volume this node shows (NOT_FOUND otherwise: a volume of
//!   another node is unknown here), on a present drive, not lost, not adopted (its data
//!   is a host directory drivelet does not manage), and of the access type asked for:
//!   block from block, a filesystem from the same filesystem (INVALID_ARGUMENT);
//! - consistency: a source not mounted read-write (not in use, attached only, staged or
//!   published read-only) is copied as it is. One mounted read-write is copied as its
//!   StorageClass says ([`ClonePolicy`], decided by [`in_use_plan`]): a filesystem is
//!   frozen for the copy (`drivelet.io/clone-in-use: freeze`, the default; the freeze
//!   bounded by `drivelet.io/clone-freeze-limit` or the node's `volumes.freeze_limit`)
//!   or refused (`refuse`); a block volume has nothing to freeze and is refused unless
//!   the class says `drivelet.io/clone-in-use-block: crash-inconsistent`, when it is
//!   copied as it is written and the clone marked so; an encrypted volume (copied file
//!   by file through a mount of its own, which a mounted source refuses) is refused.
//!   Every refusal is FAILED_PRECONDITION saying why and what to do, and changes
//!   nothing. While the copy runs the source is claimed, so a stage or delete of it
//!   waits (ABORTED);
//! - a clone is at least the size of its source: asked for less (or nothing) it gets
//!   the source's size, as a volume asked below the smallest size gets that; a
//!   `limit_bytes` below the source's size is OUT_OF_RANGE;
//! - idempotency: a repeated CreateVolume of the name must name the same source (or
//!   none when the volume was made empty); another source is ALREADY_EXISTS. A record
//!   rebuilt from its GPT has forgotten its source and is taken as it is;
//! - a restore (CreateVolume from a snapshot) follows the same rules with the snapshot as
//!   its source: it must be a snapshot this node holds (NOT_FOUND), complete, on a present
//!   drive that is not failing and not lost (FAILED_PRECONDITION, saying why), of the
//!   access type asked for (INVALID_ARGUMENT), and the new volume at least the
//!   snapshot's restore size (OUT_OF_RANGE).

use std::path::PathBuf;
use std::time::Duration;

use super::{VolumeBook, VolumeError};
use crate::actors::volumes::error::InUse;
use crate::actors::volumes::messages::CreateVolume;
use crate::actors::volumes::model::{VolumeRecord, VolumeState};
use crate::words::clone_in_use::{BlockCloneInUse, CloneInUse, ClonePolicy};
use crate::words::DriveLoc;

/// A clone's source, as the book found it.
pub(crate) struct Source {
    /// Its record, as it is now.
    pub rec: VolumeRecord,
    /// Its drive.
    pub loc: DriveLoc,
    /// What the copy does about the source's writers.
    pub in_use: InUsePlan,
}

/// What a copy does about its source's writers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum InUsePlan {
    /// Nothing writes to it: copied as it is.
    Idle,
    /// Mounted read-write at this path: frozen there for the copy, at most this long.
    Freeze(PathBuf, Duration),
    /// A block volume written to: copied as it is written (crash-inconsistent).
    Live,
}

/// What a copy of `src` does about its writers under `policy`, freezing for at most
/// `limit`; or why it is not made now.
pub(crate) fn in_use_plan(src: &VolumeRecord, policy: ClonePolicy, limit: Duration) -> Result<InUsePlan, VolumeError> {
    let Some(path) = writer_of(src) else { return Ok(InUsePlan::Idle) };
    let refuse = |why: InUse| Err(VolumeError::SourceInUse { source_id: src.id.clone(), path: path.clone(), why });
    if src.block {
        return match policy.block {
            BlockCloneInUse::CrashInconsistent => Ok(InUsePlan::Live),
            BlockCloneInUse::Refuse => refuse(InUse::Block),
        };
    }
    match policy.fs {
        CloneInUse::Refuse => refuse(InUse::Refused),
        // Never formatted: it holds no data, and the clone starts empty.
        CloneInUse::Freeze if !src.formatted || src.fs_type.is_empty() => Ok(InUsePlan::Idle),
        CloneInUse::Freeze if src.encrypted() => refuse(InUse::Encrypted),
        CloneInUse::Freeze => Ok(InUsePlan::Freeze(path, limit)),
    }
}

/// Why an encrypted volume is not copied into a plain one.
pub(crate) const ENCRYPTED_COPY: &str = "it is encrypted (drivelet.io/encryption: fscrypt), and a copy of it is encrypted too: \
ask for the clone with a StorageClass that has drivelet.io/encryption: fscrypt (drivelet never makes a plaintext copy of an encrypted volume)";

impl VolumeBook {
    /// The source of a clone `m` asks for, with its drive, if it can be copied now.
    pub(crate) fn clone_source(&self, source_id: &str, m: &CreateVolume) -> Result<Source, VolumeError> {
        if !self.ready {
            return Err(VolumeError::NotReady);
        }
        let incompatible = |reason: String| VolumeError::SourceIncompatible { source_id: source_id.to_string(), reason };
        let src = match self.records.get(source_id) {
            Some(r) if r.state != VolumeState::Creating && r.snapshot.is_some() == m.from_snapshot => r,
            _ if m.from_snapshot => return Err(VolumeError::SnapshotNotFound { snapshot_id: source_id.to_string() }),
            _ => return Err(VolumeError::SourceNotFound { source_id: source_id.to_string() }),
        };
        if let Some(snap) = &src.snapshot {
            return self.restore_source(src, snap.restore_size, m);
        }
        if src.state == VolumeState::Deleting {
            return Err(VolumeError::Busy { volume_id: source_id.to_string() });
        }
        if let Some(a) = &src.adopted {
            return Err(incompatible(format!(
                "it is adopted from {}, a host directory drivelet does not manage; copy its files instead",
                a.path.display()
            )));
        }
        if src.lost {
            return Err(crate::actors::volumes::conditions::lost(src));
        }
        if src.encrypted() && !m.encrypting() {
            return Err(incompatible(ENCRYPTED_COPY.into()));
        }
        if src.block != m.block && !src.rebuilt {
            let (is, asked) = if src.block { ("a block volume", "a filesystem") } else { ("a filesystem volume", "a block volume") };
            return Err(incompatible(format!("it is {is}; a clone of it cannot be {asked}")));
        }
        if !m.block && src.formatted && !m.fs_type.is_empty() && src.fs_type != m.fs_type {
            return Err(incompatible(format!("it holds {}, not {}; ask for {} or no filesystem type", src.fs_type, m.fs_type, src.fs_type)));
        }
        if m.range.limit != 0 && m.range.limit < src.size {
            return Err(VolumeError::CloneTooSmall { source_id: source_id.to_string(), source_size: src.size, limit: m.range.limit });
        }
        let in_use = in_use_plan(src, ClonePolicy::of(m.parameters.iter()), self.clone_freeze_limit(m))?;
        let loc = self
            .loc_of(src)
            .ok_or_else(|| VolumeError::DriveAbsent { volume_id: source_id.to_string(), drive_id: src.drive_id.clone() })?;
        Ok(Source { rec: VolumeRecord::clone(src), loc, in_use })
    }

    /// The longest a clone `m` may freeze its source: its class's
    /// `drivelet.io/clone-freeze-limit` (checked by the front), else the node's.
    fn clone_freeze_limit(&self, m: &CreateVolume) -> Duration {
        ClonePolicy::freeze_limit_of(m.parameters.iter())
            .and_then(|v| crate::config::parse_duration(v).ok())
            .filter(|d| !d.is_zero())
            .unwrap_or(self.cfg.freeze_limit)
    }

    /// [`clone_source`](Self::clone_source) for a copy that begins now: the source is
    /// claimed for the copy, unless `held` already holds it (a retry on another drive).
    pub(crate) fn clone_start(&self, source_id: &str, m: &CreateVolume, held: &mut Option<super::Claim>) -> Result<Source, VolumeError> {
        let found = self.clone_source(source_id, m)?;
        if held.is_none() {
            *held = Some(self.claim(source_id)?);
        }
        Ok(found)
    }
}

impl VolumeBook {
    /// [`clone_source`](Self::clone_source) of a restore: `src` is a snapshot of
    /// `restore_size` bytes of data.
    fn restore_source(&self, src: &VolumeRecord, restore_size: u64, m: &CreateVolume) -> Result<Source, VolumeError> {
        let unusable = |reason: String| VolumeError::SnapshotUnusable { snapshot_id: src.id.clone(), reason };
        if src.state == VolumeState::Deleting {
            return Err(VolumeError::Busy { volume_id: src.id.clone() });
        }
        if src.lost {
            return Err(unusable(format!("its partition is gone from drive {} (the drive was wiped or replaced): its data is lost", src.drive_id)));
        }
        if src.failed {
            return Err(unusable(format!("its drive {} was released by force", src.drive_id)));
        }
        let Some(d) = self.drives.get(&src.drive_id) else {
            return Err(unusable(format!("its drive {} is absent from this node; it can be restored from once the drive is back", src.drive_id)));
        };
        if d.health.health == crate::words::Health::Bad {
            return Err(unusable(format!(
                "its drive {} is failing ({}); a copy read from it may not hold what was taken",
                src.drive_id, d.health.reason
            )));
        }
        if src.encrypted() && !m.encrypting() {
            return Err(unusable(format!("it is a snapshot of an encrypted volume, so {}", ENCRYPTED_COPY.trim_start_matches("it is encrypted (drivelet.io/encryption: fscrypt), and "))));
        }
        if src.block != m.block {
            let (is, asked) = if src.block { ("of a block volume", "a filesystem volume") } else { ("of a filesystem volume", "a block volume") };
            return Err(VolumeError::InvalidArgument {
                reason: format!("snapshot {} is {is}; it cannot be restored into {asked}", src.id),
            });
        }
        if !m.block && src.formatted && !m.fs_type.is_empty() && src.fs_type != m.fs_type {
            return Err(VolumeError::InvalidArgument {
                reason: format!("snapshot {} holds {}, not {}; ask for {} or no filesystem type", src.id, src.fs_type, m.fs_type, src.fs_type),
            });
        }
        if m.range.limit != 0 && m.range.limit < restore_size {
            return Err(VolumeError::OutOfRange {
                reason: format!(
                    "snapshot {} holds {} ({restore_size} bytes); a volume restored from it cannot be limited to {} ({} bytes)",
                    src.id,
                    crate::config::human_bytes(restore_size),
                    crate::config::human_bytes(m.range.limit),
                    m.range.limit
                ),
            });
        }
        let loc = self.loc_of(src).ok_or_else(|| unusable(format!("its drive {} is absent from this node", src.drive_id)))?;
        Ok(Source { rec: VolumeRecord::clone(src), loc, in_use: InUsePlan::Idle })
    }
}

/// Where a volume is mounted read-write (staged, or published to a target), if it is:
/// the copy of such a volume would not be consistent.
pub(super) fn writer_of(rec: &VolumeRecord) -> Option<std::path::PathBuf> {
    if let Some(st) = rec.staging.as_ref().filter(|s| !s.readonly) {
        return Some(st.path.clone());
    }
    rec.targets.iter().find(|(_, t)| !t.readonly).map(|(p, _)| p.clone())
}

/// The filesystem of a new clone: the one asked for, else its source's (the default
/// `fallback` for a block clone or a source that holds none yet).
pub(super) fn fs_of_clone(source: Option<&VolumeRecord>, m: &CreateVolume, fallback: String) -> String {
    match source {
        Some(src) if !m.block && m.fs_type.is_empty() && src.formatted && !src.fs_type.is_empty() => src.fs_type.clone(),
        _ => fallback,
    }
}

/// Why an existing volume of the name is not the clone `m` asks for, if it is not.
pub(super) fn source_mismatch(rec: &VolumeRecord, m: &CreateVolume) -> Option<VolumeError> {
    let had = if rec.restored_from.is_some() { (rec.restored_from.as_ref(), true) } else { (rec.clone_of.as_ref(), false) };
    if rec.rebuilt || had == (m.source.as_ref(), m.from_snapshot && m.source.is_some()) {
        return None;
    }
    let was = match had {
        (Some(s), true) => format!("restored from snapshot {s}"),
        (Some(s), false) => format!("a clone of volume {s}"),
        (None, _) => "without a source volume".to_string(),
    };
    let asked = match &m.source {
        Some(s) if m.from_snapshot => format!("a restore of snapshot {s}"),
        Some(s) => format!("a clone of volume {s}"),
        None => "an empty volume".to_string(),
    };
    Some(VolumeError::AlreadyExists { volume: m.name.clone(), reason: format!("exists, created {was}, not {asked}") })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::actors::volumes::model::{Staging, Target};

    fn staged(readonly: bool) -> Staging {
        Staging { path: "/k/stage".into(), block: false, flags: vec![], readonly, done: true }
    }

    #[test]
    fn a_volume_mounted_read_write_anywhere_has_a_writer() {
        let mut r = VolumeRecord::for_test(1, VolumeState::Available);
        assert_eq!(writer_of(&r), None, "not in use");
        r.published_node = Some("n1".into());
        assert_eq!(writer_of(&r), None, "attached only: nothing is mounted");
        r.staging = Some(staged(true));
        assert_eq!(writer_of(&r), None, "staged read-only");
        r.targets.insert("/k/ro".into(), Target { readonly: true, block: false, done: true });
        assert_eq!(writer_of(&r), None, "published read-only");
        r.targets.insert("/k/rw".into(), Target { readonly: false, block: false, done: false });
        assert_eq!(writer_of(&r), Some(PathBuf::from("/k/rw")), "a read-write target, even one being published");
        r.targets.clear();
        r.staging = Some(staged(false));
        assert_eq!(writer_of(&r), Some(PathBuf::from("/k/stage")), "staged read-write");
    }

    #[test]
    fn a_source_in_use_is_frozen_refused_or_copied_live_as_its_class_says() {
        use crate::words::clone_in_use::{BlockCloneInUse as B, CloneInUse as F};
        let limit = Duration::from_secs(7);
        let fs_rw = || {
            let mut r = VolumeRecord::for_test(1, VolumeState::Available);
            r.staging = Some(staged(false));
            r
        };
        let idle = VolumeRecord::for_test(2, VolumeState::Available);
        let ro = VolumeRecord { staging: Some(staged(true)), ..VolumeRecord::for_test(3, VolumeState::Available) };
        let unformatted = VolumeRecord { formatted: false, ..fs_rw() };
        let mut block_rw = VolumeRecord { block: true, fs_type: String::new(), ..VolumeRecord::for_test(4, VolumeState::Available) };
        block_rw.targets.insert("/k/dev".into(), Target { readonly: false, block: true, done: true });
        let mut encrypted = fs_rw();
        encrypted.parameters = [(crate::words::encryption::ENCRYPTION.to_string(), "fscrypt".to_string())].into_iter().collect();
        let rw = fs_rw();
        let policy = |fs, block| ClonePolicy { fs, block };
        let default = ClonePolicy::default();
        // (source, policy, plan or the refusal's kind)
        let cases: Vec<(&str, &VolumeRecord, ClonePolicy, Result<InUsePlan, InUse>)> = vec![
            ("not in use", &idle, default, Ok(InUsePlan::Idle)),
            ("not in use, refuse", &idle, policy(F::Refuse, B::Refuse), Ok(InUsePlan::Idle)),
            ("staged read-only", &ro, policy(F::Refuse, B::Refuse), Ok(InUsePlan::Idle)),
            ("written, default", &rw, default, Ok(InUsePlan::Freeze("/k/stage".into(), limit))),
            ("written, refuse", &rw, policy(F::Refuse, B::CrashInconsistent), Err(InUse::Refused)),
            ("written, never formatted", &unformatted, default, Ok(InUsePlan::Idle)),
            ("written, never formatted, refuse", &unformatted, policy(F::Refuse, B::Refuse), Err(InUse::Refused)),
            ("encrypted, written", &encrypted, default, Err(InUse::Encrypted)),
            ("block written, default", &block_rw, default, Err(InUse::Block)),
            ("block written, freeze asked", &block_rw, policy(F::Freeze, B::Refuse), Err(InUse::Block)),
            ("block written, crash-inconsistent", &block_rw, policy(F::Refuse, B::CrashInconsistent), Ok(InUsePlan::Live)),
        ];
        for (what, src, policy, want) in cases {
            match (in_use_plan(src, policy, limit), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{what}"),
                (Err(VolumeError::SourceInUse { why, source_id, .. }), Err(want)) => {
                    assert_eq!((why, source_id.as_str()), (want, src.id.as_str()), "{what}")
                }
                (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_repeated_create_must_name_the_same_source() {
        let mut rec = VolumeRecord::for_test(1, VolumeState::Available);
        let m = |source: Option<&str>| CreateVolume { source: source.map(str::to_string), ..CreateVolume::for_test("pvc-1") };
        assert!(source_mismatch(&rec, &m(None)).is_none());
        let e = source_mismatch(&rec, &m(Some("s1"))).expect("a clone asked of an empty volume");
        assert_eq!(e.to_string(), "volume pvc-1 exists, created without a source volume, not a clone of volume s1");
        rec.clone_of = Some("s1".into());
        assert!(source_mismatch(&rec, &m(Some("s1"))).is_none());
        let e = source_mismatch(&rec, &m(Some("s2"))).expect("another source");
        assert_eq!(e.to_string(), "volume pvc-1 exists, created a clone of volume s1, not a clone of volume s2");
        assert!(source_mismatch(&rec, &m(None)).is_some(), "an empty volume asked of a clone");
        rec.rebuilt = true;
        assert!(source_mismatch(&rec, &m(Some("s2"))).is_none(), "a rebuilt record has forgotten its source");
    }
}
