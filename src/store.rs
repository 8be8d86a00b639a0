//! The embedded, crash-safe store of volume records and drive usage records (redb, one
//! file under the state directory).
//!
//! Rules:
//! - every write is one redb transaction committed with full durability before the call
//!   returns, so a record read after a crash is one that was completely written;
//! - records are JSON, keyed by volume id; an unreadable record is reported by id and
//!   skipped, never deleted, so a newer or damaged entry does not stop the agent;
//! - the store knows nothing of drives or CSI: it keeps what it is given.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::Serialize;

const VOLUMES: TableDefinition<&str, &[u8]> = TableDefinition::new("volumes");
const DRIVES: TableDefinition<&str, &[u8]> = TableDefinition::new("drives");

/// Which kind of record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Volume records, keyed by volume id.
    Volume,
    /// Drive usage records (releasing, released), keyed by drive id.
    Drive,
}

impl Kind {
    fn table(self) -> TableDefinition<'static, &'static str, &'static [u8]> {
        match self {
            Kind::Volume => VOLUMES,
            Kind::Drive => DRIVES,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Volume => "volume",
            Kind::Drive => "drive",
        }
    }
}

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database file could not be opened or created.
    #[error("cannot open the volume store {path}: {reason}")]
    Open {
        /// The file.
        path: PathBuf,
        /// What redb said.
        reason: String,
    },
    /// A transaction failed.
    #[error("volume store {what} failed: {reason}")]
    Txn {
        /// What was being done, naming the record.
        what: String,
        /// What redb said.
        reason: String,
    },
}

fn txn(what: impl Into<String>) -> impl FnOnce(redb::Error) -> StoreError {
    let what = what.into();
    move |e| StoreError::Txn { what, reason: e.to_string() }
}

/// The volume store.
pub struct Store {
    db: Database,
    path: PathBuf,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

/// A record that failed to decode, reported instead of dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// Its key.
    pub id: String,
    /// The decoder's message.
    pub reason: String,
}

impl Store {
    /// The store's file in the state directory `dir`.
    pub fn path_in(dir: &Path) -> std::path::PathBuf {
        dir.join("volumes.redb")
    }

    /// Opens (or creates) the store at `dir/volumes.redb`.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let path = Store::path_in(dir);
        let open_err = |reason: String| StoreError::Open { path: path.clone(), reason };
        std::fs::create_dir_all(dir).map_err(|e| open_err(e.to_string()))?;
        let db = Database::builder()
            .set_cache_size(1 << 20)
            .create(&path)
            .map_err(|e| open_err(e.to_string()))?;
        let w = db.begin_write().map_err(|e| open_err(e.to_string()))?;
        w.open_table(VOLUMES).map_err(|e| open_err(e.to_string()))?;
        w.open_table(DRIVES).map_err(|e| open_err(e.to_string()))?;
        w.commit().map_err(|e| open_err(e.to_string()))?;
        Ok(Store { db, path })
    }

    /// Writes (inserts or replaces) one volume record, durably.
    pub fn put<T: Serialize>(&self, id: &str, rec: &T) -> Result<(), StoreError> {
        self.put_in(Kind::Volume, id, rec)
    }

    /// Removes one volume record, durably; removing an absent record is not an error.
    pub fn remove(&self, id: &str) -> Result<(), StoreError> {
        self.remove_in(Kind::Volume, id)
    }

    /// Every volume record, in key order, plus those that could not be decoded.
    pub fn load<T: DeserializeOwned>(&self) -> Result<(Vec<T>, Vec<Unreadable>), StoreError> {
        self.load_in(Kind::Volume)
    }

    /// Writes (inserts or replaces) one record of `kind`, durably.
    pub fn put_in<T: Serialize>(&self, kind: Kind, id: &str, rec: &T) -> Result<(), StoreError> {
        let what = format!("write of {} {id}", kind.name());
        let bytes = serde_json::to_vec(rec).map_err(|e| StoreError::Txn { what: what.clone(), reason: e.to_string() })?;
        let w = self.db.begin_write().map_err(|e| txn(what.clone())(e.into()))?;
        {
            let mut t = w.open_table(kind.table()).map_err(|e| txn(what.clone())(e.into()))?;
            t.insert(id, bytes.as_slice()).map_err(|e| txn(what.clone())(e.into()))?;
        }
        let _t = crate::disk::timing::step("store.commit");
        w.commit().map_err(|e| txn(what)(e.into()))
    }

    /// Removes one record of `kind`, durably; an absent record is not an error.
    pub fn remove_in(&self, kind: Kind, id: &str) -> Result<(), StoreError> {
        let what = format!("removal of {} {id}", kind.name());
        let w = self.db.begin_write().map_err(|e| txn(what.clone())(e.into()))?;
        {
            let mut t = w.open_table(kind.table()).map_err(|e| txn(what.clone())(e.into()))?;
            t.remove(id).map_err(|e| txn(what.clone())(e.into()))?;
        }
        let _t = crate::disk::timing::step("store.commit");
        w.commit().map_err(|e| txn(what)(e.into()))
    }

    /// Every record of `kind`, in key order, plus those that could not be decoded.
    pub fn load_in<T: DeserializeOwned>(&self, kind: Kind) -> Result<(Vec<T>, Vec<Unreadable>), StoreError> {
        let what = format!("read of all {} records", kind.name());
        let what = what.as_str();
        let r = self.db.begin_read().map_err(|e| txn(what)(e.into()))?;
        let t = r.open_table(kind.table()).map_err(|e| txn(what)(e.into()))?;
        let mut good = Vec::new();
        let mut bad = Vec::new();
        for entry in t.iter().map_err(|e| txn(what)(e.into()))? {
            let (k, v) = entry.map_err(|e| txn(what)(e.into()))?;
            match serde_json::from_slice::<T>(v.value()) {
                Ok(rec) => good.push(rec),
                Err(e) => bad.push(Unreadable { id: k.value().to_string(), reason: e.to_string() }),
            }
        }
        Ok((good, bad))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
    struct Rec {
        id: String,
        n: u32,
    }

    #[test]
    fn records_survive_reopening_and_removal_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Store::open(dir.path()).unwrap();
            s.put("a", &Rec { id: "a".into(), n: 1 }).unwrap();
            s.put("b", &Rec { id: "b".into(), n: 2 }).unwrap();
            s.put("a", &Rec { id: "a".into(), n: 3 }).unwrap();
            s.remove("b").unwrap();
            s.remove("b").unwrap();
        }
        let s = Store::open(dir.path()).unwrap();
        let (good, bad) = s.load::<Rec>().unwrap();
        assert_eq!(good, vec![Rec { id: "a".into(), n: 3 }]);
        assert!(bad.is_empty());
    }

    #[test]
    fn undecodable_records_are_reported_not_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        s.put("x", &"not a record").unwrap();
        s.put("y", &Rec { id: "y".into(), n: 1 }).unwrap();
        let (good, bad) = s.load::<Rec>().unwrap();
        assert_eq!(good.len(), 1);
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].id, "x");
        // Still there: a later version may read it.
        assert_eq!(s.load::<Rec>().unwrap().1.len(), 1);
    }
}
