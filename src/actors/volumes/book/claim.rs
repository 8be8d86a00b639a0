//! The busy set of the volume book: one call per volume at a time, released by the
//! [`Claim`] itself when it is dropped, on every path a call takes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The volumes being changed now, each with the token of its claim.
#[derive(Debug, Default)]
pub(super) struct BusyIds {
    pub(super) ids: HashMap<String, u64>,
    pub(super) next: u64,
}

/// A volume claimed by one call; the volume is free again when this is dropped.
#[derive(Debug)]
#[must_use = "the volume is released when the claim is dropped"]
pub(crate) struct Claim {
    pub(super) busy: Arc<Mutex<BusyIds>>,
    pub(super) id: String,
    pub(super) token: u64,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut b = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        // After a restart cleared the set, a newer claim of the id is not this one's.
        if b.ids.get(&self.id) == Some(&self.token) {
            b.ids.remove(&self.id);
        }
    }
}

