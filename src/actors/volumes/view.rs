//! The volume manager's published view: an immutable snapshot of what the cheap CSI
//! calls read (Probe's readiness, GetCapacity, ListVolumes pages), so they answer from
//! memory on the caller's thread instead of a round trip through the actor's mailbox.
//!
//! Rules:
//! - the book builds a new view from its whole state after each change of what a view
//!   shows (readiness, records, drives, drive uses, check findings) and swaps it in
//!   whole ([`tokio::sync::watch`]): a reader holds one `Arc` and sees one moment of the
//!   book, never drives of one moment with volumes of another;
//! - a view answers exactly what the book would at that moment: the same `NotReady`
//!   before start-up reconciliation, the same pages (shown volumes in id order, a
//!   `Creating` record never shown) and the same capacity (one placement model,
//!   [`placement::capacity`], over the same candidates, `Creating` reservations
//!   included);
//! - when the manager is gone for good (its book dropped), readers see that
//!   ([`ViewReader::get`] answers `None`) and say so rather than answer from the past.

use std::borrow::Cow;
use std::sync::Arc;

use tokio::sync::watch;

use super::conditions::Condition;
use super::model::VolumeRecord;
use super::placement::{self, Candidate};
use super::error::VolumeError;
use crate::actors::inventory::model::Drive;
use super::messages::GetCapacity;

/// A managed drive as placement sees it, owned: the drive, the extents in use on it
/// and whether it is closed to new volumes.
#[derive(Debug, Clone)]
pub struct DriveRoom {
    /// The drive.
    pub drive: Drive,
    /// Extents in use, `(start, len)`.
    pub used: Vec<(u64, u64)>,
    /// Closed to new volumes (releasing, released or failing).
    pub closed: bool,
    /// Partition-table slots taken on it.
    pub slots_used: u32,
}

impl DriveRoom {
    /// The drive as placement sees it.
    pub(crate) fn candidate(&self) -> Candidate<'_> {
        Candidate { drive: &self.drive, used: Cow::Borrowed(&self.used), closed: self.closed, slots_used: self.slots_used }
    }
}

/// A shown volume: its record (shared with the book, never copied) and its condition
/// at that moment (every healthy volume shares one).
#[derive(Debug, Clone)]
pub struct Listed {
    /// The record.
    pub record: Arc<VolumeRecord>,
    /// Its condition.
    pub condition: Arc<Condition>,
}

/// One moment of the volume manager's book, as the cheap calls read it.
#[derive(Debug, Clone, Default)]
pub struct VolumesView {
    ready: bool,
    /// Shown volumes (not `Creating`) with their conditions, in id order.
    volumes: Vec<Listed>,
    /// Managed drives with their room.
    drives: Vec<DriveRoom>,
}

impl VolumesView {
    /// A view of a book that is not ready (start-up, restart).
    pub fn not_ready() -> VolumesView {
        VolumesView::default()
    }

    /// A view of a ready book: its shown volumes in id order and its managed drives.
    pub fn ready(volumes: Vec<Listed>, drives: Vec<DriveRoom>) -> VolumesView {
        debug_assert!(volumes.windows(2).all(|w| w[0].record.id < w[1].record.id), "volumes in id order");
        VolumesView { ready: true, volumes, drives }
    }

    /// Whether start-up reconciliation is done.
    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// Shown volumes, in id order.
    pub fn volumes(&self) -> &[Listed] {
        &self.volumes
    }

    /// Managed drives with their room.
    pub fn drives(&self) -> &[DriveRoom] {
        &self.drives
    }

    /// A page of shown volumes after `after` (by id), at most `max` (0: all), and the id
    /// to go on after when more follow.
    pub fn page(&self, after: Option<&str>, max: usize) -> Result<(&[Listed], Option<String>), VolumeError> {
        if !self.ready {
            return Err(VolumeError::NotReady);
        }
        let start = after.map_or(0, |a| self.volumes.partition_point(|s| s.record.id.as_str() <= a));
        let rest = &self.volumes[start..];
        let max = if max == 0 { rest.len() } else { max };
        if rest.len() <= max {
            return Ok((rest, None));
        }
        let page = &rest[..max];
        Ok((page, page.last().map(|s| s.record.id.clone())))
    }

    /// What GetCapacity answers, from the placement model.
    pub fn capacity(&self, m: &GetCapacity) -> Result<placement::Capacity, VolumeError> {
        if !self.ready {
            return Err(VolumeError::NotReady);
        }
        let cands: Vec<Candidate<'_>> =
            self.drives.iter().map(DriveRoom::candidate).collect();
        Ok(placement::capacity(&cands, m.media, m.layout, m.minimum))
    }
}

/// Where the book publishes its views.
#[derive(Debug)]
pub(crate) struct ViewPublisher(watch::Sender<Arc<VolumesView>>);

impl Default for ViewPublisher {
    fn default() -> Self {
        ViewPublisher(watch::Sender::new(Arc::new(VolumesView::not_ready())))
    }
}

impl ViewPublisher {
    /// Swaps in a new view.
    pub(crate) fn publish(&self, view: VolumesView) {
        self.0.send_replace(Arc::new(view));
    }

    /// A reader of the views from now on.
    pub(crate) fn reader(&self) -> ViewReader {
        ViewReader(self.0.subscribe())
    }
}

/// Reads the latest published view.
#[derive(Debug, Clone)]
pub struct ViewReader(watch::Receiver<Arc<VolumesView>>);

impl ViewReader {
    /// The latest view; `None` when the volume manager is gone for good.
    pub fn get(&self) -> Option<Arc<VolumesView>> {
        self.0.has_changed().ok()?;
        Some(self.0.borrow().clone())
    }

    /// The latest view, marked seen for [`Self::changed`]; `None` when the volume
    /// manager is gone for good.
    pub fn latest(&mut self) -> Option<Arc<VolumesView>> {
        self.0.has_changed().ok()?;
        Some(self.0.borrow_and_update().clone())
    }

    /// Waits for a view newer than the last one [`Self::latest`] returned; an error once
    /// the volume manager is gone for good.
    pub async fn changed(&mut self) -> Result<(), watch::error::RecvError> {
        self.0.changed().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::volumes::model::VolumeState;

    fn status(id: &str) -> Listed {
        let record = VolumeRecord { id: id.to_string(), ..VolumeRecord::for_test(1, VolumeState::Available) };
        Listed { record: Arc::new(record), condition: Arc::new(Condition { abnormal: false, message: String::new(), entries: Vec::new() }) }
    }

    fn ids(page: &[Listed]) -> Vec<&str> {
        page.iter().map(|s| s.record.id.as_str()).collect()
    }

    #[test]
    fn pages_follow_id_order_and_name_the_last_id_only_when_more_follow() {
        let v = VolumesView::ready(vec![status("a"), status("b"), status("c")], vec![]);
        let (p, next) = v.page(None, 2).unwrap();
        assert_eq!((ids(p), next.as_deref()), (vec!["a", "b"], Some("b")));
        let (p, next) = v.page(Some("b"), 2).unwrap();
        assert_eq!((ids(p), next), (vec!["c"], None));
        let (p, next) = v.page(None, 3).unwrap();
        assert_eq!((ids(p), next), (vec!["a", "b", "c"], None));
        let (p, next) = v.page(None, 0).unwrap();
        assert_eq!((ids(p), next), (vec!["a", "b", "c"], None));
        // A token naming a volume deleted since resumes after where it was.
        let (p, _) = v.page(Some("ab"), 0).unwrap();
        assert_eq!(ids(p), vec!["b", "c"]);
        let (p, next) = v.page(Some("z"), 1).unwrap();
        assert_eq!((ids(p), next), (vec![], None));
    }

    #[test]
    fn a_view_that_is_not_ready_answers_not_ready() {
        let v = VolumesView::not_ready();
        assert!(!v.is_ready());
        assert!(matches!(v.page(None, 0), Err(VolumeError::NotReady)));
        let m = GetCapacity { media: None, layout: crate::words::LayoutKind::Partition, minimum: 1 };
        assert!(matches!(v.capacity(&m), Err(VolumeError::NotReady)));
    }

    #[test]
    fn readers_see_the_latest_view_and_know_when_the_publisher_is_gone() {
        let p = ViewPublisher::default();
        let r = p.reader();
        assert!(!r.get().unwrap().is_ready());
        p.publish(VolumesView::ready(vec![status("a")], vec![]));
        assert!(r.get().unwrap().is_ready());
        drop(p);
        assert!(r.get().is_none());
    }
}
