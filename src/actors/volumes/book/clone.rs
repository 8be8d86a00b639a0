//! The book's decisions about clones (CreateVolume with a source volume).
//!
//! Rules:
//! - the source must be a volume this node shows (NOT_FOUND otherwise: a volume of
//!   another node is unknown here), on a present drive, not lost, not adopted (its data
//!   is a host directory drivelet does not manage), and of the access type asked for:
//!   block from block, a filesystem from the same filesystem (INVALID_ARGUMENT);
//! - consistency: the source must not be mounted read-write, staged or published
//!   (FAILED_PRECONDITION, naming the path): a copy of a filesystem being written is
//!   not consistent, and drivelet does not freeze its users' filesystems. Staged
//!   read-only, attached to the node, or not in use at all, it is copied; while the
//!   copy runs the source is claimed, so a stage or delete of it waits (ABORTED);
//! - a clone is at least the size of its source: asked for less (or nothing) it gets
//!   the source's size, as a volume asked below the smallest size gets that; a
//!   `limit_bytes` below the source's size is OUT_OF_RANGE;
//! - idempotency: a repeated CreateVolume of the name must name the same source (or
//!   none when the volume was made empty); another source is ALREADY_EXISTS. A record
//!   rebuilt from its GPT has forgotten its source and is taken as it is.

use super::{VolumeBook, VolumeError};
use crate::actors::volumes::messages::CreateVolume;
use crate::actors::volumes::model::{VolumeRecord, VolumeState};
use crate::words::DriveLoc;

impl VolumeBook {
    /// The source of a clone `m` asks for, with its drive, if it can be copied now.
    pub(crate) fn clone_source(&self, source_id: &str, m: &CreateVolume) -> Result<(VolumeRecord, DriveLoc), VolumeError> {
        if !self.ready {
            return Err(VolumeError::NotReady);
        }
        let incompatible = |reason: String| VolumeError::SourceIncompatible { source_id: source_id.to_string(), reason };
        let src = match self.records.get(source_id) {
            Some(r) if r.state != VolumeState::Creating => r,
            _ => return Err(VolumeError::SourceNotFound { source_id: source_id.to_string() }),
        };
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
        if let Some(path) = writer_of(src) {
            return Err(VolumeError::SourceInUse { source_id: source_id.to_string(), path });
        }
        let loc = self
            .loc_of(src)
            .ok_or_else(|| VolumeError::DriveAbsent { volume_id: source_id.to_string(), drive_id: src.drive_id.clone() })?;
        Ok((VolumeRecord::clone(src), loc))
    }

    /// [`clone_source`](Self::clone_source) for a copy that begins now: the source is
    /// claimed for the copy, unless `held` already holds it (a retry on another drive).
    pub(crate) fn clone_start(&self, source_id: &str, m: &CreateVolume, held: &mut Option<super::Claim>) -> Result<(VolumeRecord, DriveLoc), VolumeError> {
        let found = self.clone_source(source_id, m)?;
        if held.is_none() {
            *held = Some(self.claim(source_id)?);
        }
        Ok(found)
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
    if rec.rebuilt || rec.clone_of == m.source {
        return None;
    }
    let was = match &rec.clone_of {
        Some(s) => format!("a clone of volume {s}"),
        None => "without a source volume".to_string(),
    };
    let asked = match &m.source {
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
    fn a_repeated_create_must_name_the_same_source() {
        let mut rec = VolumeRecord::for_test(1, VolumeState::Available);
        let m = |source: Option<&str>| CreateVolume {
            name: "pvc-1".into(),
            range: crate::actors::volumes::model::CapacityRange { required: 0, limit: 0 },
            media: None,
            layout: crate::words::LayoutKind::Partition,
            block: false,
            fs_type: String::new(),
            parameters: Default::default(),
            source: source.map(str::to_string),
        };
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
