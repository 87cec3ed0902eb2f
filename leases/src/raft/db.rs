//! The redb file a replica keeps its Raft state in, `<data dir>/raft.redb`,
//! shared by the log store and the state machine of one replica.
//!
//! Tables:
//! - `raft_log`: log index → `[RAFT_VALUE_FORMAT][postcard Entry]`.
//! - `raft_state`: `"vote"`, `"committed"`, `"purged"` → the postcard value.
//! - `raft_snapshot`: `"meta"` → postcard `SnapshotMeta`, `"data"` → the
//!   `codec::encode_catalog_snapshot` frame. At most one snapshot, replaced
//!   whole, never by an older one.
//! - `meta`: `"format"` → the layout version of this file.
//!
//! This module only opens the file and encodes values; what is written when
//! is decided by `log_store.rs` and `state_machine.rs`. Writes run on
//! tokio's blocking pool (`blocking`) so an fsync never stalls a runtime
//! worker; reads are short and run inline.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, DatabaseError, Durability, ReadableTable, TableDefinition, WriteTransaction};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::redb_file::{self, OpenFailure};

/// The file inside the data directory (shard 0's; shard k > 0 keeps its
/// group in `raft-shard-<k>.redb`, `shard_file`).
pub const RAFT_DB_FILE: &str = "raft.redb";
/// The layout version written in `meta["format"]`; a file with another
/// version is refused rather than misread.
pub const RAFT_STORE_FORMAT: u64 = 1;
/// The first byte of every stored log entry.
pub const RAFT_VALUE_FORMAT: u8 = 1;

pub(super) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
pub(super) const STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_state");
pub(super) const SNAPSHOT: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_snapshot");
/// revision → `audit::encode_audit` bytes, written as entries apply.
pub(super) const AUDIT: TableDefinition<u64, &[u8]> = TableDefinition::new("audit");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const META_FORMAT: &str = "format";
/// In shard 0's file: how many shards the region's catalog was made with
/// (absent in a store made before shards: 1).
const META_SHARDS: &str = "shards";

/// The file of shard `shard`'s group inside the data directory.
pub fn shard_file(shard: u16) -> String {
    if shard == 0 {
        RAFT_DB_FILE.to_owned()
    } else {
        format!("raft-shard-{shard}.redb")
    }
}

pub(super) const STATE_VOTE: &str = "vote";
pub(super) const STATE_COMMITTED: &str = "committed";
pub(super) const STATE_PURGED: &str = "purged";
pub(super) const SNAPSHOT_META: &str = "meta";
pub(super) const SNAPSHOT_DATA: &str = "data";

/// Why the Raft store could not do what was asked. Every message names what
/// to do next. Inside openraft's traits these become `StorageError`s, which
/// stop the Raft node.
#[derive(Debug, thiserror::Error)]
pub enum RaftStoreError {
    /// The data directory could not be created or synced.
    #[error("cannot prepare Raft data directory {path}: {source}; check the --data-dir path, its permissions and free space")]
    Directory {
        /// The directory.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// Another process (or another open in this one) holds the file.
    #[error("Raft store {path} is locked by another process (or already open in this one); stop the other replica or use another --data-dir")]
    Locked {
        /// The database file.
        path: PathBuf,
    },
    /// The file could not be opened as a database.
    #[error("cannot open Raft store {path}: {source}; if the file is damaged, move it away and let this replica rejoin from a snapshot")]
    Open {
        /// The database file.
        path: PathBuf,
        /// What redb reported.
        source: Box<DatabaseError>,
    },
    /// The file was written with another layout version.
    #[error("Raft store {path} has layout version {found}; this build reads version {RAFT_STORE_FORMAT}: run the matching rollcall version or move the file away")]
    Format {
        /// The database file.
        path: PathBuf,
        /// The version found.
        found: u64,
    },
    /// A read or write of the database failed (IO, space, a damaged page).
    #[error("Raft store {path} failed: {source}; check the disk (free space, permissions, IO errors) — on Err nothing of the failed write was kept")]
    Database {
        /// The database file.
        path: PathBuf,
        /// What redb reported.
        source: Box<redb::Error>,
    },
    /// The store was made for another number of catalog shards.
    #[error("Raft store {path} was made for a catalog of {found} shard(s) but arbiter.catalog.shards is {configured}: the shard count is fixed when a region is created; set it back to {found}, or start a new region and move its services")]
    Shards {
        /// Shard 0's database file.
        path: PathBuf,
        /// The count the store was made with.
        found: u64,
        /// The count configured.
        configured: u16,
    },
    /// A stored value does not decode or contradicts its key.
    #[error("Raft store table {table} entry {key} is corrupt: {detail}; move the store away and let this replica rejoin from a snapshot")]
    Corrupt {
        /// The table.
        table: &'static str,
        /// The entry's key.
        key: String,
        /// What is wrong.
        detail: String,
    },
    /// A catalog snapshot (built here or sent by the leader) cannot be used.
    #[error("catalog snapshot at {at} cannot be used: {detail}; check that every replica of the shard runs with the same --region, --shard and catalog parameters")]
    Snapshot {
        /// The snapshot's last log id.
        at: String,
        /// Why.
        detail: String,
    },
    /// A storage task on the blocking pool panicked.
    #[error("a Raft storage task panicked: {detail}; the replica must restart")]
    Task {
        /// The panic.
        detail: String,
    },
}

/// One replica's open Raft file.
pub(super) struct RaftDb {
    db: Database,
    path: PathBuf,
}

impl std::fmt::Debug for RaftDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftDb")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl RaftDb {
    /// Opens `dir/<file>`, creating the directory and file if needed,
    /// checking every page checksum and the layout version.
    pub(super) fn open(dir: &Path, file: &str) -> Result<Arc<RaftDb>, RaftStoreError> {
        let (db, path) = redb_file::open(dir, file).map_err(|failure| match failure {
            OpenFailure::Directory(source) => RaftStoreError::Directory {
                path: dir.to_path_buf(),
                source,
            },
            OpenFailure::Locked(path) => RaftStoreError::Locked { path },
            OpenFailure::Open(path, source) => RaftStoreError::Open { path, source },
        })?;
        let db = RaftDb { db, path };
        db.prepare()?;
        Ok(Arc::new(db))
    }

    fn prepare(&self) -> Result<(), RaftStoreError> {
        let txn = self.begin_write(Durability::Immediate)?;
        let found = {
            let mut meta = txn.open_table(META).map_err(|e| self.fail(e))?;
            let found = meta
                .get(META_FORMAT)
                .map_err(|e| self.fail(e))?
                .map(|v| v.value());
            if found.is_none() {
                meta.insert(META_FORMAT, RAFT_STORE_FORMAT)
                    .map_err(|e| self.fail(e))?;
            }
            txn.open_table(LOG).map_err(|e| self.fail(e))?;
            txn.open_table(STATE).map_err(|e| self.fail(e))?;
            txn.open_table(SNAPSHOT).map_err(|e| self.fail(e))?;
            txn.open_table(AUDIT).map_err(|e| self.fail(e))?;
            found
        };
        if let Some(found) = found.filter(|f| *f != RAFT_STORE_FORMAT) {
            return Err(RaftStoreError::Format {
                path: self.path.clone(),
                found,
            });
        }
        txn.commit().map_err(|e| self.fail(e))
    }

    /// Records the region's shard count in a new store, and refuses one
    /// made with another count (shard 0's file holds it).
    pub(super) fn check_shards(&self, configured: u16) -> Result<(), RaftStoreError> {
        let txn = self.begin_write(Durability::Immediate)?;
        let found = {
            let mut meta = txn.open_table(META).map_err(|e| self.fail(e))?;
            let found = meta
                .get(META_SHARDS)
                .map_err(|e| self.fail(e))?
                .map(|v| v.value());
            let log_empty = {
                let log = txn.open_table(LOG).map_err(|e| self.fail(e))?;
                let first = log.first().map_err(|e| self.fail(e))?;
                first.is_none()
            };
            let snapshot_empty = {
                let snap = txn.open_table(SNAPSHOT).map_err(|e| self.fail(e))?;
                let meta = snap.get(SNAPSHOT_META).map_err(|e| self.fail(e))?;
                meta.is_none()
            };
            match found {
                Some(found) => found,
                // A store with history and no count was made before shards.
                None if !(log_empty && snapshot_empty) => 1,
                None => {
                    meta.insert(META_SHARDS, u64::from(configured))
                        .map_err(|e| self.fail(e))?;
                    u64::from(configured)
                }
            }
        };
        if found != u64::from(configured) {
            return Err(RaftStoreError::Shards {
                path: self.path.clone(),
                found,
                configured,
            });
        }
        txn.commit().map_err(|e| self.fail(e))
    }

    /// The database, for read transactions.
    pub(super) fn redb(&self) -> &Database {
        &self.db
    }

    /// A write transaction. `Immediate` fsyncs on commit; `None` is kept
    /// only once a later `Immediate` commit is.
    pub(super) fn begin_write(
        &self,
        durability: Durability,
    ) -> Result<WriteTransaction, RaftStoreError> {
        let mut txn = self.db.begin_write().map_err(|e| self.fail(e))?;
        txn.set_durability(durability).map_err(|e| self.fail(e))?;
        Ok(txn)
    }

    pub(super) fn fail(&self, e: impl Into<redb::Error>) -> RaftStoreError {
        RaftStoreError::Database {
            path: self.path.clone(),
            source: Box::new(e.into()),
        }
    }
}

/// Runs a storage call on tokio's blocking pool, so its fsync or a large
/// encode does not hold a runtime worker.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RaftStoreError> + Send + 'static,
) -> Result<T, RaftStoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RaftStoreError::Task {
            detail: e.to_string(),
        })?
}

/// A plain postcard value (votes, log ids, snapshot metadata).
pub(super) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_allocvec(value).expect("in-memory values always encode")
}

/// Decodes the value stored under `table[key]`, refusing trailing bytes.
pub(super) fn decode<T: DeserializeOwned>(
    table: &'static str,
    key: impl ToString,
    bytes: &[u8],
) -> Result<T, RaftStoreError> {
    let corrupt = |detail: String| RaftStoreError::Corrupt {
        table,
        key: key.to_string(),
        detail,
    };
    let (value, rest) = postcard::take_from_bytes(bytes).map_err(|e| corrupt(e.to_string()))?;
    if !rest.is_empty() {
        return Err(corrupt(format!("{} trailing bytes", rest.len())));
    }
    Ok(value)
}
