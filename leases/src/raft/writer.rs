//! The one writer of a replica's Raft file: a thread that takes every
//! write queued since its last transaction (log appends, the commit mark,
//! applied entries' audit records, votes, truncations, purges), in order,
//! and writes them in one redb transaction, fsynced once when any of them
//! must be durable. That is group commit at the storage: openraft's append
//! returns at once (as its storage contract asks) instead of holding the
//! Raft core for an fsync, appends that queue meanwhile share the next
//! fsync, and audit records ride on the next append instead of taking the
//! file's write lock for a transaction of their own.
//!
//! Appended entries stay readable from memory (`pending`) until their
//! transaction committed; openraft learns that they are on disk from its
//! callback, never earlier. This module decides nothing about what is
//! written; `log_store.rs` and `state_machine.rs` do.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use openraft::storage::LogFlushed;
use redb::{Durability, ReadableTableMetadata, WriteTransaction};

use super::db::{RaftDb, RaftStoreError, AUDIT, LOG, STATE, STATE_COMMITTED};
use super::types::{CatalogRaft, Entry, LogId};

/// A write that needs its own code: runs inside the group's transaction,
/// in order.
type Job = Box<dyn FnOnce(&RaftDb, &WriteTransaction) -> Result<(), RaftStoreError> + Send>;

enum Op {
    /// Log entries (index, encoded), answered through openraft's callback
    /// once fsynced.
    Append {
        entries: Vec<(LogId, Vec<u8>)>,
        done: LogFlushed<CatalogRaft>,
    },
    /// The commit mark (not fsynced on its own).
    Committed(Option<Vec<u8>>),
    /// Applied entries' audit records (not fsynced on their own), keeping
    /// the newest `keep`.
    Audit {
        records: Vec<(u64, Vec<u8>)>,
        keep: u64,
    },
    /// Any other write; `durable` asks for the fsync.
    Run {
        job: Job,
        durable: bool,
        done: tokio::sync::oneshot::Sender<Result<(), RaftStoreError>>,
    },
    /// Answers once everything queued before it is written.
    Flush(mpsc::SyncSender<Result<(), String>>),
}

/// Appended entries not yet committed to the file, by index.
pub(super) type Pending = Arc<Mutex<BTreeMap<u64, Entry>>>;

/// The handle the log store and the state machine share; the last one
/// dropped ends the thread (after what was queued is written).
pub(super) struct Writer {
    tx: Option<mpsc::Sender<Op>>,
    pending: Pending,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

/// The writer thread is gone: it only ends when the handles drop, so this
/// is a panic inside it.
fn gone() -> RaftStoreError {
    RaftStoreError::Task {
        detail: "the Raft file's writer thread is gone".into(),
    }
}

impl Writer {
    pub(super) fn start(db: Arc<RaftDb>) -> Result<Arc<Writer>, RaftStoreError> {
        let (tx, rx) = mpsc::channel();
        let pending: Pending = Arc::default();
        let thread = std::thread::Builder::new()
            .name("raft-writer".into())
            .spawn({
                let pending = pending.clone();
                move || run(&db, &rx, &pending)
            })
            .map_err(|e| RaftStoreError::Task {
                detail: format!("cannot start the Raft file's writer thread: {e}"),
            })?;
        Ok(Arc::new(Writer {
            tx: Some(tx),
            pending,
            thread: Some(thread),
        }))
    }

    fn send(&self, op: Op) -> Result<(), RaftStoreError> {
        self.tx
            .as_ref()
            .expect("the sender lives until drop")
            .send(op)
            .map_err(|_| gone())
    }

    /// The entries appended and not yet written.
    pub(super) fn pending(&self) -> &Pending {
        &self.pending
    }

    /// Queues entries; they are readable at once, and `done` is called
    /// once they are fsynced.
    pub(super) fn append(
        &self,
        entries: Vec<(Entry, Vec<u8>)>,
        done: LogFlushed<CatalogRaft>,
    ) -> Result<(), RaftStoreError> {
        let mut queued = Vec::with_capacity(entries.len());
        {
            let mut pending = self.pending.lock().expect("pending lock");
            for (entry, bytes) in entries {
                queued.push((entry.log_id, bytes));
                pending.insert(entry.log_id.index, entry);
            }
        }
        self.send(Op::Append {
            entries: queued,
            done,
        })
    }

    /// Queues the commit mark.
    pub(super) fn committed(&self, value: Option<Vec<u8>>) -> Result<(), RaftStoreError> {
        self.send(Op::Committed(value))
    }

    /// Queues audit records.
    pub(super) fn audit(
        &self,
        records: Vec<(u64, Vec<u8>)>,
        keep: u64,
    ) -> Result<(), RaftStoreError> {
        self.send(Op::Audit { records, keep })
    }

    /// Runs `job` in order with everything queued, and answers once it is
    /// written (fsynced when `durable`).
    pub(super) async fn run(
        &self,
        durable: bool,
        job: impl FnOnce(&RaftDb, &WriteTransaction) -> Result<(), RaftStoreError> + Send + 'static,
    ) -> Result<(), RaftStoreError> {
        let (done, answer) = tokio::sync::oneshot::channel();
        self.send(Op::Run {
            job: Box::new(job),
            durable,
            done,
        })?;
        answer.await.map_err(|_| gone())?
    }

    /// Blocks until everything queued so far is written (a reader of the
    /// audit table sees every applied entry's record).
    pub(super) fn flush(&self) -> Result<(), RaftStoreError> {
        let (done, answer) = mpsc::sync_channel(1);
        self.send(Op::Flush(done))?;
        answer
            .recv()
            .map_err(|_| gone())?
            .map_err(|detail| RaftStoreError::Task { detail })
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The thread: one transaction per wake-up for everything queued.
fn run(db: &RaftDb, rx: &mpsc::Receiver<Op>, pending: &Pending) {
    while let Ok(first) = rx.recv() {
        let mut ops = vec![first];
        while let Ok(more) = rx.try_recv() {
            ops.push(more);
        }
        let durable = ops.iter().any(|op| match op {
            Op::Append { .. } => true,
            Op::Run { durable, .. } => *durable,
            _ => false,
        });
        let mut jobs = Vec::new();
        let written = write(db, &mut ops, durable, &mut jobs);
        for (done, result) in jobs {
            let _ = done.send(result);
        }
        if let Err(e) = &written {
            tracing::error!(error = %e, "the Raft file's writer failed; this replica stops");
        }
        for op in ops {
            match op {
                Op::Append { entries, done } => {
                    if written.is_ok() {
                        let mut held = pending.lock().expect("pending lock");
                        for (id, _) in &entries {
                            if held.get(&id.index).is_some_and(|e| e.log_id == *id) {
                                held.remove(&id.index);
                            }
                        }
                    }
                    done.log_io_completed(
                        written
                            .as_ref()
                            .map(|_| ())
                            .map_err(|e| std::io::Error::other(e.to_string())),
                    );
                }
                Op::Flush(done) => {
                    let _ = done.send(written.as_ref().map(|_| ()).map_err(|e| e.to_string()));
                }
                Op::Committed(_) | Op::Audit { .. } | Op::Run { .. } => {}
            }
        }
        if let Err(e) = written {
            // Nothing after a failed write may be written: openraft stops
            // on the failed appends' callbacks; later writes fail too.
            let detail = e.to_string();
            for op in rx.iter() {
                fail(op, &detail);
            }
            return;
        }
    }
}

type JobAnswer = (
    tokio::sync::oneshot::Sender<Result<(), RaftStoreError>>,
    Result<(), RaftStoreError>,
);

/// Writes `ops` in one transaction. Each `Run` job's own result is put in
/// `jobs` (a job that fails leaves the transaction uncommitted, and every
/// op of the group fails with it).
fn write(
    db: &RaftDb,
    ops: &mut [Op],
    durable: bool,
    jobs: &mut Vec<JobAnswer>,
) -> Result<(), RaftStoreError> {
    let txn = db.begin_write(if durable {
        Durability::Immediate
    } else {
        Durability::None
    })?;
    let mut failed: Option<RaftStoreError> = None;
    for op in ops.iter_mut() {
        if failed.is_some() {
            if let Op::Run { .. } = op {
                let Op::Run { done, .. } = std::mem::replace(op, Op::Committed(None)) else {
                    unreachable!()
                };
                jobs.push((done, Err(gone())));
            }
            continue;
        }
        let step = match op {
            Op::Append { entries, .. } => append(db, &txn, entries),
            Op::Committed(value) => committed(db, &txn, value.as_deref()),
            Op::Audit { records, keep } => audit(db, &txn, records, *keep),
            Op::Run { .. } => {
                let Op::Run { job, done, .. } = std::mem::replace(op, Op::Committed(None)) else {
                    unreachable!()
                };
                let result = job(db, &txn);
                let step = result
                    .as_ref()
                    .map(|_| ())
                    .map_err(|e| RaftStoreError::Task {
                        detail: e.to_string(),
                    });
                jobs.push((done, result));
                step
            }
            Op::Flush(_) => Ok(()),
        };
        if let Err(e) = step {
            failed = Some(e);
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    txn.commit().map_err(|e| db.fail(e))
}

fn append(
    db: &RaftDb,
    txn: &WriteTransaction,
    entries: &[(LogId, Vec<u8>)],
) -> Result<(), RaftStoreError> {
    let mut log = txn.open_table(LOG).map_err(|e| db.fail(e))?;
    for (id, bytes) in entries {
        log.insert(id.index, bytes.as_slice())
            .map_err(|e| db.fail(e))?;
    }
    Ok(())
}

fn committed(
    db: &RaftDb,
    txn: &WriteTransaction,
    value: Option<&[u8]>,
) -> Result<(), RaftStoreError> {
    let mut state = txn.open_table(STATE).map_err(|e| db.fail(e))?;
    match value {
        Some(bytes) => state.insert(STATE_COMMITTED, bytes).map(|_| ()),
        None => state.remove(STATE_COMMITTED).map(|_| ()),
    }
    .map_err(|e| db.fail(e))
}

fn audit(
    db: &RaftDb,
    txn: &WriteTransaction,
    records: &[(u64, Vec<u8>)],
    keep: u64,
) -> Result<(), RaftStoreError> {
    let mut table = txn.open_table(AUDIT).map_err(|e| db.fail(e))?;
    for (revision, bytes) in records {
        table
            .insert(revision, bytes.as_slice())
            .map_err(|e| db.fail(e))?;
    }
    let held = table.len().map_err(|e| db.fail(e))?;
    for _ in keep..held {
        table.pop_first().map_err(|e| db.fail(e))?;
    }
    Ok(())
}

/// Answers an op queued after a failed write.
fn fail(op: Op, detail: &str) {
    match op {
        Op::Append { done, .. } => {
            done.log_io_completed(Err(std::io::Error::other(detail.to_owned())))
        }
        Op::Run { done, .. } => {
            let _ = done.send(Err(RaftStoreError::Task {
                detail: detail.to_owned(),
            }));
        }
        Op::Flush(done) => {
            let _ = done.send(Err(detail.to_owned()));
        }
        Op::Committed(_) | Op::Audit { .. } => {}
    }
}
