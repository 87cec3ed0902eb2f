//! The replicated catalog (openraft's `RaftStateMachine`): applies committed
//! log entries to a `Catalog`, in log order, and builds and installs
//! snapshots of it.
//!
//! Each `Envelope` of a `Normal` entry goes to `Catalog::apply`, in order, which is
//! deterministic, so every replica reaches the same catalog and the same
//! revisions; a rejection is part of the outcome, not an error. A
//! `Membership` entry is recorded as the replica set. A blank entry only
//! moves the applied position.
//!
//! The applied state lives in memory behind an `Arc<RwLock<…>>` that the
//! arbiter reads through an `AppliedCatalog` handle, with a `watch` channel
//! announcing every applied batch. A lock, not a channel of catalogs,
//! because a follower serves watches from the catalog as applied (R6):
//! readers need the current value, cheaply and at any time. Only the state
//! machine writes through the lock (lease deadlines, which renewals move,
//! are the leader memory's, inside the replica machine).
//!
//! Durability: the catalog itself is not written on every apply. A snapshot
//! (the `codec::encode_catalog_snapshot` frame, with the last applied log id
//! and membership in its metadata) is fsynced in the replica's redb file
//! whenever openraft builds or installs one, and openraft purges only log
//! entries a stored snapshot covers. A restarted replica loads that
//! snapshot and openraft re-applies the log after it.
//!
//! This module never reads a clock: times travel inside the commands.

use std::io::Cursor;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageIOError};
use redb::{Durability, ReadableDatabase, ReadableTable};
use tokio::sync::watch;

use super::db::{
    self, blocking, RaftDb, RaftStoreError, AUDIT, SNAPSHOT, SNAPSHOT_DATA, SNAPSHOT_META,
};
use super::types::{
    CatalogRaft, Entry, LogId, Outcome, SnapshotMeta, StorageError, StoredMembership,
};
use super::writer::Writer;
use crate::audit::{self, AuditEntry, AuditQuery};
use crate::catalog::Catalog;
use crate::codec::{self, MAX_CATALOG_SNAPSHOT_BYTES};
use crate::ids::Revision;
use crate::params::CatalogParams;
use crate::snapshot::CatalogSnapshot;

/// What a replica has applied, as announced after every applied batch or
/// installed snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppliedMark {
    /// The last log entry applied.
    pub last_applied: Option<LogId>,
    /// The catalog's revision.
    pub revision: Revision,
    /// Snapshots installed since this process started. When it changes the
    /// catalog was replaced whole and its delta log restarts at `revision`:
    /// a reader must treat every service as changed. Otherwise the services
    /// changed since a previous mark are those whose
    /// `Catalog::service(key).revision` is past that mark's revision, and
    /// `Catalog::changes_since` answers their deltas.
    pub installs: u64,
}

/// The applied state behind the lock.
struct Shared {
    catalog: Catalog,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    installs: u64,
}

impl Shared {
    fn mark(&self) -> AppliedMark {
        AppliedMark {
            last_applied: self.last_applied,
            revision: self.catalog.revision(),
            installs: self.installs,
        }
    }
}

/// The arbiter's read handle on a replica's applied catalog. Cheap to clone.
#[derive(Clone)]
pub struct AppliedCatalog {
    db: Arc<RaftDb>,
    writer: Arc<Writer>,
    shared: Arc<RwLock<Shared>>,
    marks: watch::Receiver<AppliedMark>,
}

impl std::fmt::Debug for AppliedCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppliedCatalog")
            .field("mark", &*self.marks.borrow())
            .finish_non_exhaustive()
    }
}

impl AppliedCatalog {
    /// Runs `f` on the catalog as applied. Keep `f` short: applying waits
    /// for it.
    pub fn read<T>(&self, f: impl FnOnce(&Catalog) -> T) -> T {
        f(&read(&self.shared).catalog)
    }

    /// The catalog as applied, read-locked until the guard drops. Never
    /// hold it across an `.await`: applying waits for it.
    pub fn lock(&self) -> CatalogGuard<'_> {
        CatalogGuard(read(&self.shared))
    }

    /// The current applied position.
    pub fn mark(&self) -> AppliedMark {
        read(&self.shared).mark()
    }

    /// A receiver that wakes on every applied batch or installed snapshot.
    pub fn watch(&self) -> watch::Receiver<AppliedMark> {
        self.marks.clone()
    }

    /// Audit entries in ascending revision: those after `since`, touching
    /// `service` if given, at most `limit`. Blocking: call it off the
    /// runtime's workers.
    pub fn audit(&self, q: &AuditQuery) -> Result<Vec<AuditEntry>, RaftStoreError> {
        let mut out = Vec::new();
        let start = match q.since {
            None => 0,
            Some(r) => match r.0.checked_add(1) {
                Some(start) => start,
                None => return Ok(out),
            },
        };
        if q.limit == 0 {
            return Ok(out);
        }
        // The records of every entry applied so far are written first.
        self.writer.flush()?;
        let db = &self.db;
        let txn = db.redb().begin_read().map_err(|e| db.fail(e))?;
        let table = txn.open_table(AUDIT).map_err(|e| db.fail(e))?;
        for item in table.range(start..).map_err(|e| db.fail(e))? {
            let (key, bytes) = item.map_err(|e| db.fail(e))?;
            let entry = audit::decode_audit(key.value(), bytes.value()).map_err(|detail| {
                RaftStoreError::Corrupt {
                    table: "audit",
                    key: key.value().to_string(),
                    detail,
                }
            })?;
            if q.service
                .as_ref()
                .is_none_or(|s| entry.services.contains(s))
            {
                out.push(entry);
                if out.len() == q.limit {
                    break;
                }
            }
        }
        Ok(out)
    }
}

/// A read lock on the applied catalog (`AppliedCatalog::lock`).
pub struct CatalogGuard<'a>(RwLockReadGuard<'a, Shared>);

impl std::ops::Deref for CatalogGuard<'_> {
    type Target = Catalog;
    fn deref(&self) -> &Catalog {
        &self.0.catalog
    }
}

/// The catalog lock is poisoned only if `Catalog::apply` panicked while
/// holding it, which has already stopped the Raft node: serving that
/// catalog would serve a half-applied command.
const POISONED: &str = "the catalog lock is poisoned: a catalog apply panicked";

fn read(shared: &RwLock<Shared>) -> RwLockReadGuard<'_, Shared> {
    shared.read().expect(POISONED)
}

/// The state-machine half of a replica's Raft storage.
pub struct CatalogStateMachine {
    db: Arc<RaftDb>,
    writer: Arc<Writer>,
    params: CatalogParams,
    audit_max_entries: u64,
    shared: Arc<RwLock<Shared>>,
    marks: watch::Sender<AppliedMark>,
}

impl std::fmt::Debug for CatalogStateMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogStateMachine")
            .field("db", &self.db)
            .field("mark", &*self.marks.borrow())
            .finish_non_exhaustive()
    }
}

impl CatalogStateMachine {
    /// The state machine of the replica whose file is `db`: the stored
    /// snapshot's catalog if there is one, else an empty catalog.
    pub(super) fn open(
        db: Arc<RaftDb>,
        writer: Arc<Writer>,
        params: CatalogParams,
    ) -> Result<Self, RaftStoreError> {
        let shared = match load_snapshot(&db)? {
            None => Shared {
                catalog: Catalog::new(params.clone()),
                last_applied: None,
                membership: StoredMembership::default(),
                installs: 0,
            },
            Some((meta, data)) => {
                let catalog = import(&params, &meta, &data)?;
                tracing::info!(
                    last_applied = %position(&meta.last_log_id),
                    revision = catalog.revision().0,
                    "catalog loaded from the stored Raft snapshot"
                );
                Shared {
                    catalog,
                    last_applied: meta.last_log_id,
                    membership: meta.last_membership,
                    installs: 0,
                }
            }
        };
        let (marks, _) = watch::channel(shared.mark());
        Ok(CatalogStateMachine {
            db,
            writer,
            params,
            audit_max_entries: 1_000_000,
            shared: Arc::new(RwLock::new(shared)),
            marks,
        })
    }

    /// A read handle on the applied catalog; take it before handing the
    /// state machine to `Raft::new`.
    pub fn catalog(&self) -> AppliedCatalog {
        AppliedCatalog {
            db: self.db.clone(),
            writer: self.writer.clone(),
            shared: self.shared.clone(),
            marks: self.marks.subscribe(),
        }
    }

    /// Keeps at most `n` audit entries (the newest); default 1,000,000.
    pub fn with_audit_limit(mut self, n: u64) -> Self {
        self.audit_max_entries = n.max(1);
        self
    }

    /// The applied state for writing; `None` if the lock is poisoned.
    fn lock(&self) -> Option<RwLockWriteGuard<'_, Shared>> {
        self.shared.write().ok()
    }
}

/// A poisoned lock as a storage error, so openraft stops this replica.
fn poisoned() -> StorageError {
    StorageIOError::write_state_machine(openraft::AnyError::error(POISONED)).into()
}

impl RaftStateMachine<CatalogRaft> for CatalogStateMachine {
    type SnapshotBuilder = CatalogSnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let shared = self.lock().ok_or_else(poisoned)?;
        Ok((shared.last_applied, shared.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Outcome>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let (outcomes, audits, mark) = {
            let mut shared = self.lock().ok_or_else(poisoned)?;
            let mut outcomes = Vec::new();
            let mut audits = Vec::new();
            for entry in entries {
                let results = match entry.payload {
                    EntryPayload::Blank => Vec::new(),
                    EntryPayload::Normal(proposal) => proposal
                        .envelopes
                        .iter()
                        .map(|envelope| {
                            let result = shared.catalog.apply(envelope);
                            if let Some(a) = result
                                .as_ref()
                                .ok()
                                .and_then(|applied| AuditEntry::describe(envelope, applied))
                            {
                                audits.push((a.revision.0, audit::encode_audit(&a)));
                            }
                            result
                        })
                        .collect(),
                    EntryPayload::Membership(membership) => {
                        shared.membership = StoredMembership::new(Some(entry.log_id), membership);
                        Vec::new()
                    }
                };
                shared.last_applied = Some(entry.log_id);
                outcomes.push(Outcome {
                    revision: shared.catalog.revision(),
                    results,
                });
            }
            let mark = shared.mark();
            (outcomes, audits, mark)
        };
        if !audits.is_empty() {
            // Written with the next log append (durable then); a crash
            // before that re-applies, and re-audits, the same entries.
            self.writer
                .audit(audits, self.audit_max_entries)
                .map_err(|e| StorageIOError::write_state_machine(&e))?;
        }
        tracing::debug!(
            entries = outcomes.len(),
            last_applied = %position(&mark.last_applied),
            revision = mark.revision.0,
            "raft entries applied"
        );
        self.marks.send_replace(mark);
        Ok(outcomes)
    }

    async fn get_snapshot_builder(&mut self) -> CatalogSnapshotBuilder {
        // openraft builds on another task while applying goes on, so the
        // builder takes a consistent copy now (records are shared `Arc`s).
        let shared = read(&self.shared);
        CatalogSnapshotBuilder {
            db: self.db.clone(),
            export: shared.catalog.export(),
            last_applied: shared.last_applied,
            membership: shared.membership.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let params = self.params.clone();
        let db = self.db.clone();
        let stored_meta = meta.clone();
        let catalog = blocking(move || {
            let catalog = import(&params, &stored_meta, &data)?;
            store_snapshot(&db, &stored_meta, &data, Replace::Always)?;
            Ok(catalog)
        })
        .await
        .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        let mut shared = self.lock().ok_or_else(poisoned)?;
        shared.catalog = catalog;
        shared.last_applied = meta.last_log_id;
        shared.membership = meta.last_membership.clone();
        shared.installs += 1;
        let mark = shared.mark();
        drop(shared);
        tracing::info!(
            last_applied = %position(&mark.last_applied),
            revision = mark.revision.0,
            "catalog snapshot installed"
        );
        self.marks.send_replace(mark);
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<CatalogRaft>>, StorageError> {
        let stored =
            load_snapshot(&self.db).map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        Ok(stored.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

/// Builds one snapshot from the copy taken by `get_snapshot_builder`.
pub struct CatalogSnapshotBuilder {
    db: Arc<RaftDb>,
    export: CatalogSnapshot,
    last_applied: Option<LogId>,
    membership: StoredMembership,
}

impl RaftSnapshotBuilder<CatalogRaft> for CatalogSnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<CatalogRaft>, StorageError> {
        let snapshot_id = match &self.last_applied {
            Some(id) => format!("{id}-r{}", self.export.revision),
            None => format!("empty-r{}", self.export.revision),
        };
        let meta = SnapshotMeta {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
            snapshot_id,
        };
        let export = self.export.clone();
        let db = self.db.clone();
        let stored_meta = meta.clone();
        let data = blocking(move || {
            let data = codec::encode_catalog_snapshot(&export);
            if data.len() > MAX_CATALOG_SNAPSHOT_BYTES {
                return Err(RaftStoreError::Snapshot {
                    at: position(&stored_meta.last_log_id),
                    detail: format!(
                        "it encodes to {} bytes, over the {MAX_CATALOG_SNAPSHOT_BYTES}-byte limit a replica accepts; split the catalog into more shards",
                        data.len()
                    ),
                });
            }
            store_snapshot(&db, &stored_meta, &data, Replace::IfNotOlder)?;
            Ok(data)
        })
        .await
        .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        tracing::info!(
            last_applied = %position(&meta.last_log_id),
            revision = self.export.revision.0,
            bytes = data.len(),
            "catalog snapshot built"
        );
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

/// When `store_snapshot` replaces the stored snapshot.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Replace {
    /// An installed snapshot always replaces it (openraft installs only
    /// snapshots ahead of what is applied).
    Always,
    /// A built snapshot replaces it unless it is older: a build that started
    /// before an install must not overwrite the installed one.
    IfNotOlder,
}

/// Writes the snapshot's metadata and data in one fsynced transaction.
fn store_snapshot(
    db: &RaftDb,
    meta: &SnapshotMeta,
    data: &[u8],
    replace: Replace,
) -> Result<(), RaftStoreError> {
    let txn = db.begin_write(Durability::Immediate)?;
    {
        let mut table = txn.open_table(SNAPSHOT).map_err(|e| db.fail(e))?;
        if replace == Replace::IfNotOlder {
            let stored = match table.get(SNAPSHOT_META).map_err(|e| db.fail(e))? {
                Some(bytes) => Some(db::decode::<SnapshotMeta>(
                    "raft_snapshot",
                    SNAPSHOT_META,
                    bytes.value(),
                )?),
                None => None,
            };
            if stored.is_some_and(|s| s.last_log_id > meta.last_log_id) {
                return Ok(());
            }
        }
        table
            .insert(SNAPSHOT_META, db::encode(meta).as_slice())
            .map_err(|e| db.fail(e))?;
        table.insert(SNAPSHOT_DATA, data).map_err(|e| db.fail(e))?;
    }
    txn.commit().map_err(|e| db.fail(e))
}

/// The stored snapshot's metadata and data, if there is one.
fn load_snapshot(db: &RaftDb) -> Result<Option<(SnapshotMeta, Vec<u8>)>, RaftStoreError> {
    let txn = db.redb().begin_read().map_err(|e| db.fail(e))?;
    let table = txn.open_table(SNAPSHOT).map_err(|e| db.fail(e))?;
    let Some(meta) = table.get(SNAPSHOT_META).map_err(|e| db.fail(e))? else {
        return Ok(None);
    };
    let meta: SnapshotMeta = db::decode("raft_snapshot", SNAPSHOT_META, meta.value())?;
    let data = table
        .get(SNAPSHOT_DATA)
        .map_err(|e| db.fail(e))?
        .ok_or_else(|| RaftStoreError::Corrupt {
            table: "raft_snapshot",
            key: SNAPSHOT_DATA.into(),
            detail: "the snapshot metadata is stored without its data".into(),
        })?;
    Ok(Some((meta, data.value().to_vec())))
}

/// Decodes a catalog snapshot frame and rebuilds the catalog from it.
fn import(
    params: &CatalogParams,
    meta: &SnapshotMeta,
    data: &[u8],
) -> Result<Catalog, RaftStoreError> {
    let refuse = |detail: String| RaftStoreError::Snapshot {
        at: position(&meta.last_log_id),
        detail,
    };
    let snap = codec::decode_catalog_snapshot(data).map_err(|e| refuse(e.to_string()))?;
    if snap.region != params.region {
        return Err(refuse(format!(
            "it is of region {} but this replica serves region {}",
            snap.region, params.region
        )));
    }
    Catalog::import(params.clone(), snap).map_err(|e| refuse(e.to_string()))
}

/// A log position for logs and messages.
fn position(id: &Option<LogId>) -> String {
    id.map_or_else(|| "none".into(), |id| id.to_string())
}
