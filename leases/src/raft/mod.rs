//! Replication of a catalog shard with openraft 0.9 (issue 6): the type
//! configuration (`types`), the log and vote store (`log_store`) and the
//! replicated catalog (`state_machine`), both kept in one redb file per
//! replica (`db`).
//!
//! This module is storage only: no networking, no timers, no proposal
//! routing. The arbiter's driver creates the `openraft::Raft` with these,
//! proposes `Proposal`s on the leader and reads the applied catalog through
//! `AppliedCatalog` on every replica.

mod db;
mod log_store;
mod state_machine;
mod types;
mod writer;

use std::path::Path;

pub use db::{RaftStoreError, RAFT_DB_FILE, RAFT_STORE_FORMAT, RAFT_VALUE_FORMAT};
pub use log_store::LogStore;
pub use state_machine::{
    AppliedCatalog, AppliedMark, CatalogGuard, CatalogSnapshotBuilder, CatalogStateMachine,
};
pub use types::{
    CatalogRaft, CatalogRaftNode, Entry, LogId, Outcome, Proposal, ReplicaId, SnapshotMeta,
    StorageError, StoredMembership,
};

use crate::params::CatalogParams;

/// Opens (creating if needed) the Raft storage of one replica in `dir`:
/// `dir/raft.redb`, locked while either half is alive. Every replica of a
/// shard must run with the same `params`.
pub fn open(
    dir: &Path,
    params: CatalogParams,
) -> Result<(LogStore, CatalogStateMachine), RaftStoreError> {
    let db = db::RaftDb::open(dir)?;
    let writer = writer::Writer::start(db.clone())?;
    let state_machine = CatalogStateMachine::open(db.clone(), writer.clone(), params)?;
    Ok((LogStore::new(db, writer), state_machine))
}

#[cfg(test)]
mod tests;
