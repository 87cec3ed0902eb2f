//! The replica's Raft log, vote and commit mark in redb (openraft's
//! `RaftLogStorage`): what makes an acknowledged write survive a crash.
//!
//! Every write goes through the replica's writer thread (`writer.rs`), in
//! order. An append is fsynced (`Durability::Immediate`) before openraft is
//! told it is flushed, so a replica never counts towards a quorum for an
//! entry it could lose; appends queued together share one fsync, and the
//! entries are readable from memory meanwhile. The vote, truncations and
//! purges are fsynced too. The commit mark is written without its own
//! fsync: it only lets a restarted replica re-apply what was committed
//! before the leader says so again, it rides on the next fsynced write, and
//! losing it is safe.
//!
//! This module never interprets an entry: the state machine applies them.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader, StorageIOError, Vote};
use redb::{ReadableDatabase, ReadableTable};

use super::db::{
    self, RaftDb, RaftStoreError, LOG, RAFT_VALUE_FORMAT, STATE, STATE_COMMITTED, STATE_PURGED,
    STATE_VOTE,
};
use super::types::{CatalogRaft, Entry, LogId, ReplicaId, StorageError};
use super::writer::Writer;

/// The log half of a replica's Raft storage. Cheap to clone; a clone is also
/// the log reader openraft's replication tasks use.
#[derive(Clone, Debug)]
pub struct LogStore {
    db: Arc<RaftDb>,
    writer: Arc<Writer>,
}

impl LogStore {
    pub(super) fn new(db: Arc<RaftDb>, writer: Arc<Writer>) -> Self {
        LogStore { db, writer }
    }

    /// The entries in the range: those written, and over them those queued.
    fn entries(&self, start: Bound<u64>, end: Bound<u64>) -> Result<Vec<Entry>, RaftStoreError> {
        let mut out = std::collections::BTreeMap::new();
        // Queued entries first: one written meanwhile is read from the
        // file below, never missed.
        for (index, entry) in self
            .writer
            .pending()
            .lock()
            .expect("pending lock")
            .range((start, end))
        {
            out.insert(*index, entry.clone());
        }
        let db = &self.db;
        let txn = db.redb().begin_read().map_err(|e| db.fail(e))?;
        let log = txn.open_table(LOG).map_err(|e| db.fail(e))?;
        for item in log.range((start, end)).map_err(|e| db.fail(e))? {
            let (key, bytes) = item.map_err(|e| db.fail(e))?;
            if let std::collections::btree_map::Entry::Vacant(slot) = out.entry(key.value()) {
                slot.insert(decode_entry(key.value(), bytes.value())?);
            }
        }
        Ok(out.into_values().collect())
    }

    fn state<T: serde::de::DeserializeOwned>(
        &self,
        key: &'static str,
    ) -> Result<Option<T>, RaftStoreError> {
        let db = &self.db;
        let txn = db.redb().begin_read().map_err(|e| db.fail(e))?;
        let state = txn.open_table(STATE).map_err(|e| db.fail(e))?;
        match state.get(key).map_err(|e| db.fail(e))? {
            None => Ok(None),
            Some(bytes) => db::decode("raft_state", key, bytes.value()).map(Some),
        }
    }

    fn log_state(&self) -> Result<LogState<CatalogRaft>, RaftStoreError> {
        let purged: Option<LogId> = self.state(STATE_PURGED)?;
        let db = &self.db;
        let txn = db.redb().begin_read().map_err(|e| db.fail(e))?;
        let log = txn.open_table(LOG).map_err(|e| db.fail(e))?;
        let written = match log.last().map_err(|e| db.fail(e))? {
            Some((key, bytes)) => Some(decode_entry(key.value(), bytes.value())?.log_id),
            None => purged,
        };
        let queued = self
            .writer
            .pending()
            .lock()
            .expect("pending lock")
            .last_key_value()
            .map(|(_, e)| e.log_id);
        let last = written.max(queued);
        Ok(LogState {
            last_purged_log_id: purged,
            last_log_id: last,
        })
    }

    /// Writes `key` of the state table (`None` removes it), fsynced.
    async fn put_state(
        &self,
        key: &'static str,
        value: Option<Vec<u8>>,
    ) -> Result<(), RaftStoreError> {
        self.writer
            .run(true, move |db, txn| {
                let mut state = txn.open_table(STATE).map_err(|e| db.fail(e))?;
                match &value {
                    Some(bytes) => state.insert(key, bytes.as_slice()).map(|_| ()),
                    None => state.remove(key).map(|_| ()),
                }
                .map_err(|e| db.fail(e))
            })
            .await
    }

    /// Deletes the entries with an index in `range`, and records `purged`
    /// if given, fsynced.
    async fn delete(
        &self,
        range: (Bound<u64>, Bound<u64>),
        purged: Option<LogId>,
    ) -> Result<(), RaftStoreError> {
        // Queued entries in the range are written first and deleted in
        // order; readers stop seeing them now.
        self.writer
            .pending()
            .lock()
            .expect("pending lock")
            .retain(|index, _| !range.contains(index));
        self.writer
            .run(true, move |db, txn| {
                let mut log = txn.open_table(LOG).map_err(|e| db.fail(e))?;
                log.retain_in(range, |_, _| false).map_err(|e| db.fail(e))?;
                if let Some(purged) = &purged {
                    let mut state = txn.open_table(STATE).map_err(|e| db.fail(e))?;
                    state
                        .insert(STATE_PURGED, db::encode(purged).as_slice())
                        .map_err(|e| db.fail(e))?;
                }
                Ok(())
            })
            .await
    }
}

impl RaftLogReader<CatalogRaft> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        self.entries(range.start_bound().cloned(), range.end_bound().cloned())
            .map_err(|e| StorageIOError::read_logs(&e).into())
    }
}

impl RaftLogStorage<CatalogRaft> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<CatalogRaft>, StorageError> {
        self.log_state()
            .map_err(|e| StorageIOError::read_logs(&e).into())
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<ReplicaId>) -> Result<(), StorageError> {
        self.put_state(STATE_VOTE, Some(db::encode(vote)))
            .await
            .map_err(|e| StorageIOError::write_vote(&e).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<ReplicaId>>, StorageError> {
        self.state(STATE_VOTE)
            .map_err(|e| StorageIOError::read_vote(&e).into())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        let value = committed.as_ref().map(db::encode);
        self.writer
            .committed(value)
            .map_err(|e| StorageIOError::write(&e).into())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        self.state(STATE_COMMITTED)
            .map_err(|e| StorageIOError::read(&e).into())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<CatalogRaft>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let encoded: Vec<(Entry, Vec<u8>)> = entries
            .into_iter()
            .map(|entry| {
                let bytes = encode_entry(&entry);
                (entry, bytes)
            })
            .collect();
        tracing::trace!(
            entries = encoded.len(),
            index = encoded.last().map(|(e, _)| e.log_id.index),
            "raft log append queued"
        );
        // Readable at once; openraft hears through `callback` once the
        // entries are fsynced.
        self.writer
            .append(encoded, callback)
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        tracing::debug!(index = log_id.index, "raft log truncated");
        self.delete((Bound::Included(log_id.index), Bound::Unbounded), None)
            .await
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        tracing::debug!(index = log_id.index, "raft log purged");
        self.delete(
            (Bound::Unbounded, Bound::Included(log_id.index)),
            Some(log_id),
        )
        .await
        .map_err(|e| StorageIOError::write_logs(&e).into())
    }
}

/// `[RAFT_VALUE_FORMAT][postcard Entry]`.
fn encode_entry(entry: &Entry) -> Vec<u8> {
    postcard::to_extend(entry, vec![RAFT_VALUE_FORMAT]).expect("in-memory values always encode")
}

/// Decodes the entry stored under `index`, checking that it names `index`.
fn decode_entry(index: u64, bytes: &[u8]) -> Result<Entry, RaftStoreError> {
    let corrupt = |detail: String| RaftStoreError::Corrupt {
        table: "raft_log",
        key: index.to_string(),
        detail,
    };
    let [format, body @ ..] = bytes else {
        return Err(corrupt("empty value".into()));
    };
    if *format != RAFT_VALUE_FORMAT {
        return Err(corrupt(format!(
            "format version {format}; this build reads version {RAFT_VALUE_FORMAT}"
        )));
    }
    let entry: Entry = db::decode("raft_log", index, body)?;
    if entry.log_id.index != index {
        return Err(corrupt(format!("it holds entry {}", entry.log_id)));
    }
    Ok(entry)
}
