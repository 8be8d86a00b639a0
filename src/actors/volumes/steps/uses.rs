//! The write of a drive's usage record (cordoned, releasing, released, evacuating), off
//! the actor thread.
//!
//! Rules: the book decides a drive's usage on the actor thread; the records are then
//! stored in the order they were decided: a write that finds a newer one of the same
//! drive done already is skipped, so a slow write never undoes a later decision.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tracing::error;

use crate::store::{Kind, Store, StoreError};
use crate::words::DriveUse;

/// Writes drive usage records off the actor thread in the order they were decided.
#[derive(Default)]
pub(crate) struct UseWriter {
    seq: u64,
    written: HashMap<String, Arc<Mutex<u64>>>,
}

impl UseWriter {
    /// The blocking job that stores (`None`: forgets) `drive_id`'s usage record.
    pub(crate) fn job(&mut self, store: Arc<Store>, drive_id: &str, u: Option<DriveUse>) -> impl FnOnce() -> Result<(), StoreError> + Send + 'static {
        self.seq += 1;
        let seq = self.seq;
        let written = self.written.entry(drive_id.to_string()).or_default().clone();
        let drive_id = drive_id.to_string();
        move || {
            let mut last = written.lock().unwrap_or_else(|p| p.into_inner());
            if *last > seq {
                return Ok(());
            }
            *last = seq;
            let res = match &u {
                Some(u) => store.put_in(Kind::Drive, &drive_id, u),
                None => store.remove_in(Kind::Drive, &drive_id),
            };
            if let Err(e) = &res {
                error!(drive.id = %drive_id, error = %e, "cannot store the drive's usage record");
            }
            res
        }
    }
}
