//! The cleaner: one background thread that zeroes the dirty extents of managed drives
//! (space a deleted volume or a rolled-back create left), off the actor's mailbox, and
//! tells the volume manager each step it made clean.
//!
//! Rules:
//! - the drive's own journal ([`crate::disk::clean`]) says what is dirty after a
//!   restart; a job's step is zeroed wherever the drive's table leaves it free (never
//!   inside a partition), whether or not the journal lists it (a volume whose
//!   partition was lost from the table and then deleted), then recorded clean;
//! - a step is zeroed with no lock held (creates and deletes on the drive go on
//!   meanwhile), through a write descriptor that is closed only under the drive's
//!   [`DiskLock`] (exclusive in this process too), with the journal update that records the step clean: so a
//!   close never makes udev re-read the table behind drivelet's back, and a kill -9
//!   between the zeroing and the record zeroes the step again after restart;
//! - before each step the drive must still hold what the job was made for: the same
//!   drivelet table, or (a blank drive being taken) still nothing at all; anything else
//!   stops the job and nothing is written;
//! - a step that fails is tried again after [`RETRY`]; the space stays dirty (never
//!   handed out) meanwhile;
//! - a blank drive that appears while drivelet runs is zeroed only after
//!   [`BLANK_GRACE`]; space freed on a drive waits until the drive had [`QUIET`] without
//!   another delete, so bursts of calls do not interleave with the cleaner's writes.

use crate::words::DriveLoc;
use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use actix::prelude::*;
use tracing::{debug, info, warn};
use uuid::Uuid;

use crate::disk::clean::{self, Extent};
use crate::disk::gpt::{self, DirtyState};
use crate::disk::lock::DiskLock;
use crate::disk::DiskError;
use crate::failpoint::crash_point;

/// How long a failed step waits before it is tried again.
pub(crate) const RETRY: Duration = Duration::from_secs(30);

/// How long the cleaner lets a drive rest after space on it was freed before it takes
/// a step there: a burst of deletes and creates on one drive runs without the cleaner's
/// writes (and udev's probes of them) between its calls, and the burst's space is
/// cleaned after it.
pub(crate) const QUIET: Duration = Duration::from_millis(200);

/// The longest a drive's freed space waits for [`QUIET`]: deletes that never pause do
/// not hold the cleaner off for good.
pub(crate) const QUIET_MAX: Duration = Duration::from_secs(2);

/// How long a blank drive that appears while drivelet runs is left alone before it is
/// zeroed: an admin who plugs a disk in and formats it at once (for another use) finds
/// it untouched, and the cleaner, which checks the drive is still blank before each
/// step, leaves it alone from then on. (A drive present at start-up has sat there.)
pub(crate) const BLANK_GRACE: Duration = Duration::from_secs(5);

/// What the drive must hold for a job's next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    /// Nothing at all: a blank drive being taken (its first step writes drivelet's table).
    Blank,
    /// Whatever drivelet table is there now (a job handed in after a delete).
    AnyTable,
    /// This drivelet table.
    Table(Uuid),
}

/// Notification: a step of a drive's dirty space is clean now.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct ExtentCleaned {
    /// The drive.
    pub drive_id: String,
    /// What was zeroed (or found clean).
    pub extent: Extent,
}

/// Notification: cleaning a drive stopped (it is tried again later, or never when the
/// drive changed hands).
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct CleaningStalled {
    /// The drive.
    pub drive_id: String,
    /// Why, in plain words.
    pub reason: String,
    /// The drive holds something else than the job was made for (read it again).
    pub changed: bool,
}

struct Job {
    loc: DriveLoc,
    dirty: Vec<Extent>,
    expect: Expect,
    retry_at: Option<Instant>,
    /// When the first extent freed since the last step came (see [`QUIET_MAX`]).
    first_pending: Option<Instant>,
    /// Bumped whenever the job is replaced, so a step's result for an older job is
    /// applied only as far as it still holds.
    generation: u64,
}

#[derive(Default)]
struct Queue {
    jobs: BTreeMap<String, Job>,
    generation: u64,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

/// The cleaner's handle: hands jobs to its thread.
#[derive(Clone)]
pub(crate) struct Cleaner {
    shared: Arc<Shared>,
    step: u64,
}

impl Cleaner {
    /// A cleaner zeroing `step` bytes between two progress records; its thread starts
    /// with the first job.
    pub(crate) fn new(step: u64) -> Cleaner {
        let step = (step / gpt::ALIGN).max(1) * gpt::ALIGN;
        Cleaner { shared: Arc::new(Shared { queue: Mutex::new(Queue::default()), wake: Condvar::new() }), step }
    }

    /// Starts the thread that reports to `to`.
    pub(crate) fn start(&self, to: Recipient<ExtentCleaned>, stalled: Recipient<CleaningStalled>) {
        let (shared, step) = (self.shared.clone(), self.step);
        let spawned = std::thread::Builder::new().name("cleaner".into()).spawn(move || run(&shared, step, &to, &stalled));
        if let Err(e) = spawned {
            warn!(actor = "volumes", error = %e, "cannot start the cleaner thread; freed space stays unavailable");
        }
    }

    /// Replaces what is to be cleaned on a drive (empty `dirty`: nothing); the first
    /// step waits `delay` when given.
    pub(crate) fn set(&self, drive_id: &str, loc: DriveLoc, dirty: Vec<Extent>, expect: Expect, delay: Option<Duration>) {
        let mut q = self.shared.queue.lock().unwrap_or_else(PoisonError::into_inner);
        q.generation += 1;
        let generation = q.generation;
        if dirty.is_empty() {
            q.jobs.remove(drive_id);
        } else {
            let retry_at = delay.map(|d| Instant::now() + d);
            q.jobs.insert(drive_id.to_string(), Job { loc, dirty: clean::normalize(&dirty), expect, retry_at, first_pending: None, generation });
        }
        self.shared.wake.notify_all();
    }

    /// Adds an extent freed on a drive (a delete, a rolled-back create).
    pub(crate) fn add(&self, drive_id: &str, loc: DriveLoc, extent: Extent) {
        let mut q = self.shared.queue.lock().unwrap_or_else(PoisonError::into_inner);
        match q.jobs.get_mut(drive_id) {
            Some(j) => {
                j.dirty = clean::union(&j.dirty, &[extent]);
                j.loc = loc;
                let now = Instant::now();
                let first = *j.first_pending.get_or_insert(now);
                j.retry_at = Some((now + QUIET).min(first + QUIET_MAX));
            }
            None => {
                q.generation += 1;
                let generation = q.generation;
                let now = Instant::now();
                let job = Job {
                    loc,
                    dirty: vec![extent],
                    expect: Expect::AnyTable,
                    retry_at: Some(now + QUIET),
                    first_pending: Some(now),
                    generation,
                };
                q.jobs.insert(drive_id.to_string(), job);
            }
        }
        self.shared.wake.notify_all();
    }

    /// Stops cleaning a drive (it is gone).
    pub(crate) fn forget(&self, drive_id: &str) {
        let mut q = self.shared.queue.lock().unwrap_or_else(PoisonError::into_inner);
        q.jobs.remove(drive_id);
    }
}

/// One step to take.
struct Step {
    drive_id: String,
    loc: DriveLoc,
    extent: Extent,
    expect: Expect,
    generation: u64,
}

fn next_step(q: &Queue, step: u64, now: Instant) -> Result<Step, Option<Instant>> {
    let mut wake: Option<Instant> = None;
    for (id, j) in &q.jobs {
        if let Some(at) = j.retry_at.filter(|at| *at > now) {
            wake = Some(wake.map_or(at, |w| w.min(at)));
            continue;
        }
        if let Some(&(s, l)) = j.dirty.first() {
            return Ok(Step {
                drive_id: id.clone(),
                loc: j.loc.clone(),
                extent: (s, l.min(step)),
                expect: j.expect,
                generation: j.generation,
            });
        }
    }
    Err(wake)
}

fn run(shared: &Shared, step: u64, to: &Recipient<ExtentCleaned>, stalled: &Recipient<CleaningStalled>) {
    loop {
        let s = {
            let mut q = shared.queue.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                match next_step(&q, step, Instant::now()) {
                    Ok(s) => break s,
                    Err(Some(at)) => {
                        let wait = at.saturating_duration_since(Instant::now());
                        q = shared.wake.wait_timeout(q, wait).unwrap_or_else(PoisonError::into_inner).0;
                    }
                    Err(None) => q = shared.wake.wait(q).unwrap_or_else(PoisonError::into_inner),
                }
            }
        };
        let res = clean_step(&s);
        let mut q = shared.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(j) = q.jobs.get_mut(&s.drive_id) else { continue };
        match res {
            Ok(guid) => {
                j.first_pending = None;
                j.dirty = clean::subtract(&j.dirty, &[s.extent]);
                if j.generation == s.generation || j.expect == Expect::AnyTable {
                    j.expect = Expect::Table(guid);
                }
                if j.dirty.is_empty() {
                    q.jobs.remove(&s.drive_id);
                }
                drop(q);
                to.do_send(ExtentCleaned { drive_id: s.drive_id, extent: s.extent });
            }
            Err(e) => {
                let reason = e.to_string();
                let changed = matches!(e, DiskError::Foreign { .. });
                if changed {
                    warn!(actor = "volumes", drive.id = %s.drive_id, error = %reason, "the drive no longer holds what was being cleaned: cleaning it stops, nothing is written");
                    q.jobs.remove(&s.drive_id);
                } else {
                    warn!(actor = "volumes", drive.id = %s.drive_id, error = %reason, "cannot clean freed space; trying again in 30s");
                    j.retry_at = Some(Instant::now() + RETRY);
                }
                drop(q);
                stalled.do_send(CleaningStalled { drive_id: s.drive_id, reason, changed });
            }
        }
    }
}

/// Opens the whole drive for zeroing: write, close-on-exec (a process spawned meanwhile
/// must not keep a copy: its close would be the one udev answers).
/// Through a node udev does not watch ([`crate::disk::writer`]).
fn open_for_zeroing(loc: &DriveLoc) -> Result<crate::disk::writer::Writer, DiskError> {
    crate::disk::writer::open(&loc.path)
}

/// Zeroes one step and records it clean; answers the drive's table GUID.
fn clean_step(s: &Step) -> Result<Uuid, DiskError> {
    let dev = &s.loc.path;
    let foreign = |found: String| DiskError::Foreign { device: dev.clone(), found };
    let (targets, expect) = match (gpt::read_dirty(dev, s.loc.sector)?, s.expect) {
        (DirtyState::Blank, Expect::Blank) => (vec![s.extent], None),
        (DirtyState::Blank, _) => return Err(foreign("no partition table any more".into())),
        (DirtyState::Drivelet { disk_guid, .. }, Expect::Table(g)) if g != disk_guid => {
            return Err(foreign(format!("another partition table (disk GUID {disk_guid}) than the one being cleaned")));
        }
        (DirtyState::Drivelet { disk_guid, .. }, Expect::Blank) => {
            return Err(foreign(format!("a partition table (disk GUID {disk_guid}) written since it was found blank")));
        }
        // What the job says was freed is zeroed wherever the table leaves it free, even
        // where the journal does not list it (a volume whose partition was lost from
        // the table and then deleted); zeroing free space of drivelet's own table is
        // always safe, and a step found clean already costs only the zeroing.
        (DirtyState::Drivelet { disk_guid, free, .. }, _) => (clean::intersect(&free, &[s.extent]), Some(disk_guid)),
    };
    let file = open_for_zeroing(&s.loc)?;
    let how = clean::choose(clean::queue_limits(dev));
    let started = Instant::now();
    let mut zeroed = 0;
    for &(start, len) in &targets {
        let used = clean::zero(dev, &file, start, len, how)?;
        crate::metrics::metrics().record_zeroed(len);
        zeroed += len;
        debug!(drive.path = %dev.display(), start, len, how = used.as_str(), "zeroed");
    }
    crash_point!("clean.zeroed");
    let res = {
        let _udev = DiskLock::exclusive(dev)?;
        let res = gpt::mark_clean(dev, s.loc.sector, s.extent.0, s.extent.1, expect);
        // Closed under the lock: udev's answer to it is the lock's to wait for.
        drop(file);
        res
    };
    let (guid, _) = res?;
    if zeroed > 0 {
        let secs = started.elapsed().as_secs_f64();
        info!(drive.path = %dev.display(), bytes = zeroed, how = how.as_str(), seconds = secs, "freed space zeroed");
    }
    Ok(guid)
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB: u64 = 1 << 20;

    fn job(dirty: Vec<Extent>, retry_at: Option<Instant>) -> Job {
        let loc = DriveLoc { path: "/dev/null".into(), sector: 512 };
        Job { loc, dirty, expect: Expect::AnyTable, retry_at, first_pending: None, generation: 1 }
    }

    #[test]
    fn steps_take_the_lowest_dirty_extent_of_a_drive_not_waiting_to_retry_at_most_a_step_long() {
        let now = Instant::now();
        let mut q = Queue::default();
        assert!(matches!(next_step(&q, 8 * MIB, now), Err(None)), "nothing to do: wait for work");
        q.jobs.insert("a".into(), job(vec![(MIB, 20 * MIB), (40 * MIB, MIB)], Some(now + RETRY)));
        match next_step(&q, 8 * MIB, now) {
            Err(Some(at)) => assert_eq!(at, now + RETRY, "wake when the retry is due"),
            _ => panic!("a drive waiting to retry gives no step"),
        }
        q.jobs.insert("b".into(), job(vec![(3 * MIB, 2 * MIB)], None));
        let s = next_step(&q, 8 * MIB, now).ok().unwrap();
        assert_eq!((s.drive_id.as_str(), s.extent), ("b", (3 * MIB, 2 * MIB)));
        let s = next_step(&q, 8 * MIB, now + RETRY).ok().unwrap();
        assert_eq!((s.drive_id.as_str(), s.extent), ("a", (MIB, 8 * MIB)), "one step of a long extent");
    }
}
