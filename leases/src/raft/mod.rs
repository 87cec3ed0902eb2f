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

pub use db::{shard_file, RaftStoreError, RAFT_DB_FILE, RAFT_STORE_FORMAT, RAFT_VALUE_FORMAT};
pub use log_store::LogStore;
pub use state_machine::{
    AppliedCatalog, AppliedMark, CatalogGuard, CatalogSnapshotBuilder, CatalogStateMachine,
};
pub use types::{
    CatalogRaft, CatalogRaftNode, Entry, LogId, Outcome, Proposal, ReplicaId, SnapshotMeta,
    StorageError, StoredMembership,
};

use crate::params::CatalogParams;

/// Opens (creating if needed) the Raft storage of one replica's group for
/// shard `params.shard` in `dir`: `dir/raft.redb` for shard 0,
/// `dir/raft-shard-<k>.redb` for the others, each locked while either
/// half is alive and written by its own writer thread, so one group's
/// fsync never waits on another's. Every replica of a shard must run with
/// the same `params`. Shard 0's file records `shards`, the region's shard
/// count, when it is new, and a store made with another count is refused.
pub fn open(
    dir: &Path,
    params: CatalogParams,
    shards: u16,
) -> Result<(LogStore, CatalogStateMachine), RaftStoreError> {
    let db = db::RaftDb::open(dir, &db::shard_file(params.shard.0))?;
    if params.shard.0 == 0 {
        db.check_shards(shards)?;
    }
    let writer = writer::Writer::start(db.clone())?;
    let state_machine = CatalogStateMachine::open(db.clone(), writer.clone(), params)?;
    Ok((LogStore::new(db, writer), state_machine))
}

#[cfg(test)]
mod tests;
