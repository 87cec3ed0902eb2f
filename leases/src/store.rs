//! Durable storage of the arbiter (R3, R6, audit of R10): the log of
//! committed commands, one catalog snapshot and the audit log, all in one
//! redb file, `<data dir>/arbiter.redb`.
//!
//! The catalog decides; the store only keeps what it decided. This module
//! never interprets a command beyond naming it for the audit log, never reads
//! a clock (every time arrives inside the entries), and never skips, reorders
//! or repairs a log entry: a log that does not replay exactly is reported as
//! corrupt, because an arbiter that silently recovered a different catalog
//! would hand agents a history that never happened.
//!
//! Tables:
//! - `log`: revision → `codec::encode_command` bytes. Only commands that
//!   committed a change, under the revision they committed, contiguous from
//!   the snapshot's revision + 1.
//! - `snapshot`: revision → `codec::encode_catalog_snapshot` bytes. At most
//!   one entry, replaced by every compaction.
//! - `audit`: revision → one `AuditEntry` as `[AUDIT_FORMAT][postcard]`
//!   (encoded here, not in `codec.rs`), the newest `audit_max_entries` kept.
//! - `meta`: `"format"` → the layout version of this file.
//!
//! Every write is one transaction with immediate durability (fsync), so a
//! crash leaves either all of an `append` or `compact` or none of it.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use redb::{
    Database, DatabaseError, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata,
    TableDefinition, WriteTransaction,
};
use serde::{Deserialize, Serialize};

use crate::catalog::{Applied, Catalog, Effect};
use crate::codec::{self, MAX_CATALOG_SNAPSHOT_BYTES, MAX_COMMAND_BYTES};
use crate::command::{Command, Envelope, MAX_REPORTERS};
use crate::endpoint::Principal;
use crate::ids::Revision;
use crate::name::{InstanceId, ServiceKey};
use crate::params::CatalogParams;
use crate::redb_file::{self, OpenFailure};
use crate::snapshot::{CatalogSnapshot, SnapshotError};

/// The file inside the data directory.
pub const DB_FILE: &str = "arbiter.redb";
/// The layout version written in `meta["format"]`; a file with another
/// version is refused rather than misread.
pub const STORE_FORMAT: u64 = 1;
/// The first byte of every encoded audit entry.
pub const AUDIT_FORMAT: u8 = 1;
/// Largest encoded audit entry. A purge can touch every service of a shard
/// (about 2,000 keys of at most a few hundred bytes), so this is generous.
pub const MAX_AUDIT_BYTES: usize = 4 * 1024 * 1024;

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const SNAPSHOT: TableDefinition<u64, &[u8]> = TableDefinition::new("snapshot");
const AUDIT: TableDefinition<u64, &[u8]> = TableDefinition::new("audit");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const META_FORMAT: &str = "format";

/// Why the store could not do what was asked. Every message names what to
/// do next.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A `StoreOptions` field is out of range.
    #[error("store option {field} = {value} is invalid: {rule}")]
    Options {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// What it must be.
        rule: &'static str,
    },
    /// The data directory could not be created or synced.
    #[error("cannot prepare arbiter data directory {path}: {source}; check the --data-dir path, its permissions and free space")]
    Directory {
        /// The directory.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// Another `Store` (in this or another process) holds the file.
    #[error("arbiter store {path} is locked by another process (or already open in this one); stop the other arbiter or use another --data-dir")]
    Locked {
        /// The database file.
        path: PathBuf,
    },
    /// The file could not be opened as a database.
    #[error("cannot open arbiter store {path}: {source}; if the file is damaged, move it away and let this replica rejoin from a healthy one")]
    Open {
        /// The database file.
        path: PathBuf,
        /// What redb reported.
        source: Box<DatabaseError>,
    },
    /// The file was written with another layout version.
    #[error("arbiter store {path} has layout version {found}; this build reads version {STORE_FORMAT}: run the matching rollcall version or move the file away")]
    Format {
        /// The database file.
        path: PathBuf,
        /// The version found.
        found: u64,
    },
    /// A read or write of the database failed (IO, space, a damaged page).
    #[error("arbiter store {path} failed: {source}; check the disk (free space, permissions, IO errors) — on Err nothing of the failed call was written")]
    Database {
        /// The database file.
        path: PathBuf,
        /// What redb reported.
        source: Box<redb::Error>,
    },
    /// A stored value does not decode or contradicts its key.
    #[error("arbiter store table {table} entry {key} is corrupt: {detail}; move the store away and let this replica rejoin from a healthy one")]
    Corrupt {
        /// The table.
        table: &'static str,
        /// The entry's key.
        key: String,
        /// What is wrong.
        detail: String,
    },
    /// The snapshot decodes but cannot become a catalog.
    #[error("the snapshot at revision {revision} cannot be loaded: {source}; check that --shard and --region match the ones this store was written with")]
    Snapshot {
        /// The snapshot's revision.
        revision: Revision,
        /// Why the catalog refused it.
        source: SnapshotError,
    },
    /// A logged command does not commit its logged revision on replay.
    #[error("log entry at revision {revision} does not replay: {detail}; the log is corrupt or was written under other catalog parameters — restore from a healthy replica")]
    Replay {
        /// The revision the entry is logged under.
        revision: Revision,
        /// What happened instead.
        detail: String,
    },
    /// `append` was given entries that would break the log's chain.
    #[error("cannot log revision {got}: the store's next revision is {expected}; log every committed change exactly once, in revision order")]
    OutOfOrder {
        /// The revision the store expects next.
        expected: Revision,
        /// The revision given.
        got: Revision,
    },
    /// An entry's audit record names another revision than the entry.
    #[error("log entry at revision {revision} carries the audit entry of revision {audit}; build both from the same Applied")]
    AuditMismatch {
        /// The entry's revision.
        revision: Revision,
        /// The audit entry's revision.
        audit: Revision,
    },
    /// An encoded value would exceed what its decoder accepts, so it could
    /// never be read back.
    #[error("{what} at revision {revision} encodes to {len} bytes, over the {limit}-byte limit; it was not written (bound the command's lists at the edge)")]
    TooLarge {
        /// What was being written.
        what: &'static str,
        /// Its revision.
        revision: Revision,
        /// Its size.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// `compact` was given a snapshot older than the stored one.
    #[error("snapshot at revision {given} is older than the stored one at {stored}; compact with the current catalog's export")]
    SnapshotBehind {
        /// The stored snapshot's revision.
        stored: Revision,
        /// The snapshot given.
        given: Revision,
    },
    /// `compact` was given a snapshot of changes not yet logged.
    #[error("snapshot at revision {given} is ahead of the log, which ends at {last}; append the pending entries before compacting")]
    SnapshotAhead {
        /// The last logged revision.
        last: Revision,
        /// The snapshot given.
        given: Revision,
    },
}

/// Retention settings of the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreOptions {
    /// Most audit entries kept; after each append the oldest beyond this are
    /// deleted. One entry per committed change, typically 150–400 bytes, so
    /// the default keeps roughly 1–2 days at 10 changes/s (about 300 MB at
    /// most). At least 1.
    pub audit_max_entries: u64,
    /// Log entries after which the arbiter should write a snapshot
    /// (`needs_compaction`). Bounds recovery time: every entry after the
    /// snapshot is replayed at start. At least 1.
    pub compact_every: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            audit_max_entries: 1_000_000,
            compact_every: 50_000,
        }
    }
}

impl StoreOptions {
    /// Checks every field, naming the first one out of range.
    pub fn validate(&self) -> Result<(), StoreError> {
        let at_least_one = |field, value| {
            if value == 0 {
                Err(StoreError::Options {
                    field,
                    value,
                    rule: "it must be at least 1",
                })
            } else {
                Ok(())
            }
        };
        at_least_one("audit_max_entries", self.audit_max_entries)?;
        at_least_one("compact_every", self.compact_every)
    }
}

/// Who changed what, when (R10: every catalog change lands in an audit log).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct AuditEntry {
    /// The revision that committed the change.
    pub revision: Revision,
    /// When it was proposed (the command's time, ms since the Unix epoch).
    pub at_ms: u64,
    /// Who asked for it.
    pub actor: Principal,
    /// The command's kind (`Command::kind`).
    pub command: String,
    /// The services whose records changed, in key order.
    pub services: Vec<ServiceKey>,
    /// The instance the command named, if it named one.
    pub instance: Option<InstanceId>,
    /// A short line for humans ("-> DRAINING (generation 3): drain requested").
    pub detail: String,
}

impl AuditEntry {
    /// The audit entry of a command, from the command and what applying it
    /// did; `None` when it committed nothing (such commands are neither
    /// logged nor audited).
    pub fn describe(env: &Envelope, applied: &Applied) -> Option<AuditEntry> {
        let revision = applied.revision?;
        let effect = &applied.effect;
        let (instance, detail) = match &env.command {
            Command::GrantLease {
                node,
                epoch,
                zone,
                ttl_ms,
            } => {
                let what = match effect {
                    Effect::LeaseGranted { lease, moved: 0 } => format!("lease {lease} granted"),
                    Effect::LeaseGranted { lease, moved } => {
                        format!("lease {lease} granted ({moved} records moved to it)")
                    }
                    Effect::LeaseReinstated => "lease reinstated (its session came back)".into(),
                    other => format!("lease grant ({})", effect_name(other)),
                };
                (
                    None,
                    format!("{what} {node} epoch {epoch} zone {zone} ttl {ttl_ms} ms"),
                )
            }
            Command::RevokeLease { node, epoch } => (
                None,
                format!(
                    "lease revoked {node} epoch {epoch}{}",
                    marked(effect, "EXPIRED")
                ),
            ),
            Command::ExpireLease {
                node,
                epoch,
                silent_in_zone,
            } => {
                let detail = match effect {
                    Effect::ExpiryHeld => format!(
                        "lease expiry held by the mass-expiry guard {node} epoch {epoch} ({silent_in_zone} silent in zone)"
                    ),
                    _ => format!(
                        "lease expired {node} epoch {epoch}{}",
                        marked(effect, "EXPIRED")
                    ),
                };
                (None, detail)
            }
            Command::Register(reg) => {
                let (generation, state) = match effect {
                    Effect::Registered { generation, state } => {
                        (generation.to_string(), state.as_str())
                    }
                    _ => ("?".into(), reg.initial.as_str()),
                };
                (
                    Some(reg.instance_id.clone()),
                    format!(
                        "registered generation {generation} {state} on {} at {} version {}",
                        reg.node,
                        SocketAddr::new(reg.address, reg.port),
                        reg.version
                    ),
                )
            }
            Command::Transition {
                instance_id,
                generation,
                to,
                reason,
            } => (
                Some(instance_id.clone()),
                format!("-> {to} (generation {generation}): {reason}"),
            ),
            Command::SetLiveness {
                instance_id,
                generation,
                liveness,
            } => (
                Some(instance_id.clone()),
                format!("liveness {} (generation {generation})", liveness.as_str()),
            ),
            Command::Deregister {
                instance_id,
                generation,
            } => (
                Some(instance_id.clone()),
                format!("deregistered generation {generation}"),
            ),
            Command::NodeDown {
                node,
                epoch,
                reporters,
            } => {
                let names: Vec<&str> = reporters
                    .iter()
                    .take(MAX_REPORTERS)
                    .map(|r| r.as_str())
                    .collect();
                (
                    None,
                    format!(
                        "node down {node} epoch {epoch} reported by {}{}",
                        names.join(", "),
                        marked(effect, "UNHEALTHY")
                    ),
                )
            }
            Command::Purge => {
                let detail = match effect {
                    Effect::Purged {
                        records,
                        generations,
                        services,
                    } => format!(
                        "purged {records} records, forgot {generations} generations, dropped {services} services"
                    ),
                    other => format!("purge ({})", effect_name(other)),
                };
                (None, detail)
            }
            Command::DeleteService { service } => (None, format!("deleted service {service}")),
        };
        Some(AuditEntry {
            revision,
            at_ms: env.at_ms,
            actor: env.actor.clone(),
            command: env.command.kind().to_string(),
            services: applied.services.clone(),
            instance,
            detail,
        })
    }
}

/// ": 3 records EXPIRED" for an ended lease, nothing otherwise.
fn marked(effect: &Effect, state: &str) -> String {
    match effect {
        Effect::LeaseEnded { marked } => format!(": {marked} records {state}"),
        other => format!(" ({})", effect_name(other)),
    }
}

/// A name for an effect the detail line of a command does not expect.
fn effect_name(effect: &Effect) -> &'static str {
    match effect {
        Effect::Unchanged => "unchanged",
        Effect::LeaseGranted { .. } => "lease granted",
        Effect::LeaseReinstated => "lease reinstated",
        Effect::LeaseEnded { .. } => "lease ended",
        Effect::ExpiryHeld => "expiry held",
        Effect::Registered { .. } => "registered",
        Effect::Changed => "changed",
        Effect::Purged { .. } => "purged",
    }
}

/// One committed change, written together with its audit entry.
#[derive(Clone, Debug, PartialEq)]
pub struct LogEntry {
    /// The revision it committed.
    pub revision: Revision,
    /// The command, replayed on recovery.
    pub command: Envelope,
    /// Its audit entry (same revision).
    pub audit: AuditEntry,
}

impl LogEntry {
    /// The entry to log for a command `Catalog::apply` accepted; `None` when
    /// it committed nothing and so must not be logged.
    pub fn committed(env: &Envelope, applied: &Applied) -> Option<LogEntry> {
        let audit = AuditEntry::describe(env, applied)?;
        Some(LogEntry {
            revision: audit.revision,
            command: env.clone(),
            audit,
        })
    }
}

/// A catalog rebuilt from the store.
#[derive(Debug)]
pub struct Recovered {
    /// The catalog at the last logged revision. Its lease deadlines are
    /// unset: the driver calls `leases_mut().extend_all(now)` before
    /// expiring anything (a new leader extends every lease by one TTL).
    pub catalog: Catalog,
    /// Log entries applied on top of the snapshot.
    pub replayed: u64,
    /// The snapshot's revision; 0 when there was none.
    pub snapshot_revision: Revision,
}

/// Which audit entries to read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditQuery {
    /// Only entries that changed this service.
    pub service: Option<ServiceKey>,
    /// Only entries after this revision (exclusive).
    pub since: Option<Revision>,
    /// At most this many entries.
    pub limit: usize,
}

/// The arbiter's durable storage: one redb database, one writer process.
pub struct Store {
    db: Database,
    path: PathBuf,
    options: StoreOptions,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens `dir/arbiter.redb`, creating the directory and the file if
    /// needed. The file is locked for as long as the `Store` lives, and its
    /// integrity is checked on every open (every page checksum), so a file
    /// damaged outside redb is refused with an error instead of trusted.
    pub fn open(dir: &Path, options: StoreOptions) -> Result<Store, StoreError> {
        options.validate()?;
        let (db, path) = redb_file::open(dir, DB_FILE).map_err(|failure| match failure {
            OpenFailure::Directory(source) => StoreError::Directory {
                path: dir.to_path_buf(),
                source,
            },
            OpenFailure::Locked(path) => StoreError::Locked { path },
            OpenFailure::Open(path, source) => StoreError::Open { path, source },
        })?;
        let store = Store { db, path, options };
        store.prepare()?;
        Ok(store)
    }

    /// Creates the tables of a new file and checks the layout version of an
    /// existing one.
    fn prepare(&self) -> Result<(), StoreError> {
        let txn = self.begin_write()?;
        let found = {
            let mut meta = txn.open_table(META).map_err(|e| self.fail(e))?;
            let found = meta
                .get(META_FORMAT)
                .map_err(|e| self.fail(e))?
                .map(|v| v.value());
            if found.is_none() {
                meta.insert(META_FORMAT, STORE_FORMAT)
                    .map_err(|e| self.fail(e))?;
            }
            for table in [LOG, SNAPSHOT, AUDIT] {
                txn.open_table(table).map_err(|e| self.fail(e))?;
            }
            found
        };
        if let Some(found) = found.filter(|f| *f != STORE_FORMAT) {
            return Err(StoreError::Format {
                path: self.path.clone(),
                found,
            });
        }
        txn.commit().map_err(|e| self.fail(e))
    }

    /// Logs committed changes with their audit entries: all of them in one
    /// write transaction that is fsynced before this returns (group commit).
    /// The caller acknowledges the changes only after `Ok`.
    ///
    /// The entries must continue the log: revisions `last_revision() + 1`,
    /// `+ 2`, … with matching audit entries. On `Err` nothing was written,
    /// so a caller that already applied them in memory is ahead of the store
    /// and must stop or rebuild its catalog with `recover`.
    pub fn append(&self, entries: &[LogEntry]) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut encoded = Vec::with_capacity(entries.len());
        for entry in entries {
            if entry.audit.revision != entry.revision {
                return Err(StoreError::AuditMismatch {
                    revision: entry.revision,
                    audit: entry.audit.revision,
                });
            }
            let command = codec::encode_command(&entry.command);
            check_size("command", entry.revision, &command, MAX_COMMAND_BYTES)?;
            let audit = encode_audit(&entry.audit);
            check_size("audit entry", entry.revision, &audit, MAX_AUDIT_BYTES)?;
            encoded.push((entry.revision, command, audit));
        }
        let txn = self.begin_write()?;
        {
            let mut log = txn.open_table(LOG).map_err(|e| self.fail(e))?;
            let mut audit = txn.open_table(AUDIT).map_err(|e| self.fail(e))?;
            let snapshot = txn.open_table(SNAPSHOT).map_err(|e| self.fail(e))?;
            let mut last = last_of(&log, &snapshot).map_err(|e| self.fail(e))?;
            for (revision, command, entry) in &encoded {
                if *revision != last.next() {
                    return Err(StoreError::OutOfOrder {
                        expected: last.next(),
                        got: *revision,
                    });
                }
                log.insert(revision.0, command.as_slice())
                    .map_err(|e| self.fail(e))?;
                audit
                    .insert(revision.0, entry.as_slice())
                    .map_err(|e| self.fail(e))?;
                last = *revision;
            }
            let held = audit.len().map_err(|e| self.fail(e))?;
            for _ in self.options.audit_max_entries..held {
                audit.pop_first().map_err(|e| self.fail(e))?;
            }
        }
        txn.commit().map_err(|e| self.fail(e))?;
        tracing::debug!(
            entries = entries.len(),
            revision = encoded.last().map(|e| e.0 .0),
            "store appended"
        );
        Ok(())
    }

    /// Rebuilds the catalog: the snapshot (if any) through `Catalog::import`,
    /// then every logged command after it, in order. Each must commit
    /// exactly the revision it is logged under; the first that does not
    /// fails the recovery with `StoreError::Replay` naming it, since a log
    /// that does not replay is corrupt and is never silently skipped.
    pub fn recover(&self, params: CatalogParams) -> Result<Recovered, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.fail(e))?;
        let snapshots = txn.open_table(SNAPSHOT).map_err(|e| self.fail(e))?;
        let (mut catalog, snapshot_revision) = match snapshots.last().map_err(|e| self.fail(e))? {
            None => (Catalog::new(params), Revision(0)),
            Some((key, bytes)) => {
                let key = key.value();
                let corrupt = |detail: String| StoreError::Corrupt {
                    table: "snapshot",
                    key: key.to_string(),
                    detail,
                };
                let snap = codec::decode_catalog_snapshot(bytes.value())
                    .map_err(|e| corrupt(e.to_string()))?;
                if snap.revision != Revision(key) {
                    return Err(corrupt(format!(
                        "it holds the catalog at revision {}",
                        snap.revision
                    )));
                }
                let catalog =
                    Catalog::import(params, snap).map_err(|source| StoreError::Snapshot {
                        revision: Revision(key),
                        source,
                    })?;
                (catalog, Revision(key))
            }
        };
        let log = txn.open_table(LOG).map_err(|e| self.fail(e))?;
        let mut replayed = 0;
        for item in log.iter().map_err(|e| self.fail(e))? {
            let (key, bytes) = item.map_err(|e| self.fail(e))?;
            let revision = Revision(key.value());
            replay(&mut catalog, revision, bytes.value())?;
            replayed += 1;
        }
        tracing::info!(
            snapshot_revision = snapshot_revision.0,
            replayed,
            revision = catalog.revision().0,
            "arbiter store recovered"
        );
        Ok(Recovered {
            catalog,
            replayed,
            snapshot_revision,
        })
    }

    /// Replaces the snapshot with `snapshot` and deletes the log entries at
    /// or below its revision, in one fsynced transaction. The snapshot must
    /// be of a logged revision (append first) and not older than the stored
    /// one.
    pub fn compact(&self, snapshot: &CatalogSnapshot) -> Result<(), StoreError> {
        let given = snapshot.revision;
        let bytes = codec::encode_catalog_snapshot(snapshot);
        check_size("snapshot", given, &bytes, MAX_CATALOG_SNAPSHOT_BYTES)?;
        let txn = self.begin_write()?;
        let dropped = {
            let mut log = txn.open_table(LOG).map_err(|e| self.fail(e))?;
            let mut snapshots = txn.open_table(SNAPSHOT).map_err(|e| self.fail(e))?;
            let stored = last_key(&snapshots).map_err(|e| self.fail(e))?;
            let last = last_of(&log, &snapshots).map_err(|e| self.fail(e))?;
            if given < stored {
                return Err(StoreError::SnapshotBehind { stored, given });
            }
            if given > last {
                return Err(StoreError::SnapshotAhead { last, given });
            }
            let before = log.len().map_err(|e| self.fail(e))?;
            log.retain_in(..=given.0, |_, _| false)
                .map_err(|e| self.fail(e))?;
            let dropped = before - log.len().map_err(|e| self.fail(e))?;
            snapshots.retain(|_, _| false).map_err(|e| self.fail(e))?;
            snapshots
                .insert(given.0, bytes.as_slice())
                .map_err(|e| self.fail(e))?;
            dropped
        };
        txn.commit().map_err(|e| self.fail(e))?;
        tracing::info!(
            revision = given.0,
            bytes = bytes.len(),
            dropped,
            "arbiter store compacted"
        );
        Ok(())
    }

    /// Log entries held after the snapshot: what recovery would replay.
    pub fn log_len(&self) -> Result<u64, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.fail(e))?;
        let log = txn.open_table(LOG).map_err(|e| self.fail(e))?;
        log.len().map_err(|e| self.fail(e))
    }

    /// Whether the log has reached `compact_every` entries, so the arbiter
    /// should write a snapshot.
    pub fn needs_compaction(&self) -> Result<bool, StoreError> {
        Ok(self.log_len()? >= self.options.compact_every)
    }

    /// Audit entries in ascending revision: those after `since`, touching
    /// `service` if given, at most `limit`. A service filter scans the
    /// entries after `since` until `limit` match.
    pub fn audit(&self, q: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
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
        let txn = self.db.begin_read().map_err(|e| self.fail(e))?;
        let audit = txn.open_table(AUDIT).map_err(|e| self.fail(e))?;
        for item in audit.range(start..).map_err(|e| self.fail(e))? {
            let (key, bytes) = item.map_err(|e| self.fail(e))?;
            let entry = decode_audit(key.value(), bytes.value())?;
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

    /// The revision of the last logged change (or of the snapshot when the
    /// log after it is empty); 0 for a new store.
    pub fn last_revision(&self) -> Result<Revision, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.fail(e))?;
        let log = txn.open_table(LOG).map_err(|e| self.fail(e))?;
        let snapshots = txn.open_table(SNAPSHOT).map_err(|e| self.fail(e))?;
        last_of(&log, &snapshots).map_err(|e| self.fail(e))
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &StoreOptions {
        &self.options
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn begin_write(&self) -> Result<WriteTransaction, StoreError> {
        let mut txn = self.db.begin_write().map_err(|e| self.fail(e))?;
        txn.set_durability(Durability::Immediate)
            .map_err(|e| self.fail(e))?;
        Ok(txn)
    }

    fn fail(&self, e: impl Into<redb::Error>) -> StoreError {
        StoreError::Database {
            path: self.path.clone(),
            source: Box::new(e.into()),
        }
    }
}

/// Applies one logged command, which must commit exactly `revision`.
fn replay(catalog: &mut Catalog, revision: Revision, bytes: &[u8]) -> Result<(), StoreError> {
    let fail = |detail: String| StoreError::Replay { revision, detail };
    let expected = catalog.revision().next();
    if revision != expected {
        return Err(fail(format!(
            "the catalog is at revision {}, so the next entry must be {expected} (a gap, or an entry the snapshot already holds)",
            catalog.revision()
        )));
    }
    let env = codec::decode_command(bytes).map_err(|e| StoreError::Corrupt {
        table: "log",
        key: revision.to_string(),
        detail: e.to_string(),
    })?;
    let kind = env.command.kind();
    match catalog.apply(&env) {
        Ok(Applied {
            revision: Some(committed),
            ..
        }) if committed == revision => Ok(()),
        Ok(Applied {
            revision: Some(committed),
            ..
        }) => Err(fail(format!(
            "the {kind} command committed revision {committed}"
        ))),
        Ok(Applied { revision: None, .. }) => {
            Err(fail(format!("the {kind} command changed nothing")))
        }
        Err(rejection) => Err(fail(format!(
            "the {kind} command was rejected: {rejection}"
        ))),
    }
}

/// The last revision the store holds: the last log entry, else the
/// snapshot's, else 0.
fn last_of(
    log: &impl ReadableTable<u64, &'static [u8]>,
    snapshots: &impl ReadableTable<u64, &'static [u8]>,
) -> Result<Revision, redb::StorageError> {
    let logged = last_key(log)?;
    if logged > Revision(0) {
        return Ok(logged);
    }
    last_key(snapshots)
}

fn last_key(
    table: &impl ReadableTable<u64, &'static [u8]>,
) -> Result<Revision, redb::StorageError> {
    Ok(Revision(table.last()?.map_or(0, |(k, _)| k.value())))
}

fn check_size(
    what: &'static str,
    revision: Revision,
    bytes: &[u8],
    limit: usize,
) -> Result<(), StoreError> {
    if bytes.len() > limit {
        return Err(StoreError::TooLarge {
            what,
            revision,
            len: bytes.len(),
            limit,
        });
    }
    Ok(())
}

/// `[AUDIT_FORMAT][postcard body]`.
fn encode_audit(entry: &AuditEntry) -> Vec<u8> {
    postcard::to_extend(entry, vec![AUDIT_FORMAT]).expect("in-memory values always encode")
}

/// Decodes the audit value stored under `key`, checking format, size, that
/// nothing trails the body and that it names its own key.
fn decode_audit(key: u64, bytes: &[u8]) -> Result<AuditEntry, StoreError> {
    let corrupt = |detail: String| StoreError::Corrupt {
        table: "audit",
        key: key.to_string(),
        detail,
    };
    if bytes.len() > MAX_AUDIT_BYTES {
        return Err(corrupt(format!(
            "{} bytes exceed the {MAX_AUDIT_BYTES}-byte limit",
            bytes.len()
        )));
    }
    let [format, body @ ..] = bytes else {
        return Err(corrupt("empty value".into()));
    };
    if *format != AUDIT_FORMAT {
        return Err(corrupt(format!(
            "format version {format}; this build reads version {AUDIT_FORMAT}"
        )));
    }
    let (entry, rest) =
        postcard::take_from_bytes::<AuditEntry>(body).map_err(|e| corrupt(e.to_string()))?;
    if !rest.is_empty() {
        return Err(corrupt(format!("{} trailing bytes", rest.len())));
    }
    if entry.revision != Revision(key) {
        return Err(corrupt(format!("it describes revision {}", entry.revision)));
    }
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use super::*;
    use crate::command::Registration;
    use crate::endpoint::{Liveness, Role, State, Weight};
    use crate::ids::{AgentEpoch, Generation};
    use crate::name::{Label, NodeId, PrincipalName, Reason, Version};

    fn params() -> CatalogParams {
        CatalogParams::with_region(Label::new("r1").unwrap())
    }

    fn env(at_ms: u64, command: Command) -> Envelope {
        Envelope {
            at_ms,
            actor: Principal {
                role: Role::Agent,
                name: PrincipalName::new("node-4").unwrap(),
            },
            command,
        }
    }

    /// Applies `commands` to `cat` and returns the entries of those that
    /// committed.
    fn run(cat: &mut Catalog, commands: Vec<Command>) -> Vec<LogEntry> {
        commands
            .into_iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let env = env(1_000 + i as u64, c);
                let applied = cat.apply(&env).unwrap();
                LogEntry::committed(&env, &applied)
            })
            .collect()
    }

    fn story() -> Vec<Command> {
        let node = NodeId::new("node-4").unwrap();
        let id = InstanceId::new("web-1").unwrap();
        vec![
            Command::GrantLease {
                node: node.clone(),
                epoch: AgentEpoch(7),
                zone: Label::new("z1").unwrap(),
                ttl_ms: 10_000,
            },
            Command::Register(Registration {
                instance_id: id.clone(),
                service: ServiceKey::new("shop", "web", "http").unwrap(),
                node: node.clone(),
                epoch: AgentEpoch(7),
                address: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
                port: 8080,
                zone: None,
                version: Version::new("v1").unwrap(),
                weight: Weight::DEFAULT,
                labels: Vec::new(),
                initial: State::Ready,
            }),
            Command::SetLiveness {
                instance_id: id.clone(),
                generation: Generation(1),
                liveness: Liveness::Failing,
            },
            Command::Transition {
                instance_id: id,
                generation: Generation(1),
                to: State::Draining,
                reason: Reason::new("drain requested").unwrap(),
            },
            Command::NodeDown {
                node: node.clone(),
                epoch: AgentEpoch(7),
                reporters: vec![
                    NodeId::new("node-1").unwrap(),
                    NodeId::new("node-2").unwrap(),
                ],
            },
        ]
    }

    #[test]
    fn store_audit_details_read_as_sentences() {
        let mut cat = Catalog::new(params());
        let details: Vec<(String, String)> = run(&mut cat, story())
            .into_iter()
            .map(|e| (e.audit.command, e.audit.detail))
            .collect();
        let expected = [
            (
                "grant-lease",
                "lease 1 granted node-4 epoch 7 zone z1 ttl 10000 ms",
            ),
            (
                "register",
                "registered generation 1 READY on node-4 at 10.0.0.1:8080 version v1",
            ),
            ("set-liveness", "liveness failing (generation 1)"),
            ("transition", "-> DRAINING (generation 1): drain requested"),
            (
                "node-down",
                "node down node-4 epoch 7 reported by node-1, node-2: 0 records UNHEALTHY",
            ),
        ];
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(c, d)| (c.to_string(), d.to_string()))
            .collect();
        assert_eq!(details, expected);
    }

    #[test]
    fn an_uncommitted_command_is_neither_logged_nor_audited() {
        let mut cat = Catalog::new(params());
        let grant = story().remove(0);
        run(&mut cat, vec![grant.clone()]);
        let again = env(2_000, grant);
        let applied = cat.apply(&again).unwrap();
        assert_eq!(applied.revision, None);
        assert_eq!(LogEntry::committed(&again, &applied), None);
    }

    /// A store holding the story, and a way to overwrite one raw value.
    fn stored() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
        let mut cat = Catalog::new(params());
        store.append(&run(&mut cat, story())).unwrap();
        (dir, store)
    }

    fn overwrite(store: &Store, table: TableDefinition<u64, &[u8]>, key: u64, value: &[u8]) {
        let txn = store.db.begin_write().unwrap();
        txn.open_table(table).unwrap().insert(key, value).unwrap();
        txn.commit().unwrap();
    }

    fn all_audit() -> AuditQuery {
        AuditQuery {
            service: None,
            since: None,
            limit: usize::MAX,
        }
    }

    #[test]
    fn a_corrupt_store_audit_value_is_an_error_not_a_panic() {
        let (_dir, store) = stored();
        for bad in [
            &[][..],
            &[AUDIT_FORMAT, 0xff, 0xff, 0xff][..],
            &[9, 1, 2][..],
        ] {
            overwrite(&store, AUDIT, 2, bad);
            let err = store.audit(&all_audit()).unwrap_err();
            assert!(
                matches!(&err, StoreError::Corrupt { table: "audit", key, .. } if key == "2"),
                "{err}"
            );
        }
        // A valid entry stored under another revision's key is corrupt too.
        let mut moved = store
            .audit(&AuditQuery {
                limit: 1,
                ..all_audit()
            })
            .unwrap()
            .remove(0);
        moved.revision = Revision(3);
        overwrite(&store, AUDIT, 2, &encode_audit(&moved));
        assert!(matches!(
            store.audit(&all_audit()),
            Err(StoreError::Corrupt { table: "audit", .. })
        ));
    }

    #[test]
    fn a_corrupt_store_log_or_snapshot_is_an_error_not_a_panic() {
        let (_dir, store) = stored();
        overwrite(&store, LOG, 3, &[codec::FORMAT_VERSION, 1, 0xff]);
        assert!(matches!(
            store.recover(params()),
            Err(StoreError::Corrupt { table: "log", ref key, .. }) if key == "3"
        ));

        let (_dir, store) = stored();
        let mut cat = Catalog::new(params());
        run(&mut cat, story());
        store.compact(&cat.export()).unwrap();
        let last = cat.revision().0;
        overwrite(&store, SNAPSHOT, last, b"not a snapshot");
        assert!(matches!(
            store.recover(params()),
            Err(StoreError::Corrupt {
                table: "snapshot",
                ..
            })
        ));
    }

    #[test]
    fn a_store_snapshot_of_another_shard_is_refused() {
        let (_dir, store) = stored();
        let mut cat = Catalog::new(params());
        run(&mut cat, story());
        store.compact(&cat.export()).unwrap();
        let mut other = params();
        other.shard = crate::ids::ShardId(3);
        assert!(matches!(
            store.recover(other),
            Err(StoreError::Snapshot { .. })
        ));
    }

    #[test]
    fn a_store_of_another_layout_version_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path(), StoreOptions::default()).unwrap();
            let txn = store.db.begin_write().unwrap();
            txn.open_table(META)
                .unwrap()
                .insert(META_FORMAT, STORE_FORMAT + 1)
                .unwrap();
            txn.commit().unwrap();
        }
        let err = Store::open(dir.path(), StoreOptions::default()).unwrap_err();
        assert!(matches!(err, StoreError::Format { found: 2, .. }), "{err}");
    }
}
