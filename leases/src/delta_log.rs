//! The delta log (R6): the recent changes of every service, so an agent that
//! holds revision r of a service gets exactly the changes since r, or is told
//! to take a snapshot when the log no longer reaches back that far.
//!
//! Retention is bounded by entry count and by revision span (by default 15
//! minutes at 200 changes per second). The log is a ring of compact
//! entries: a change holds the record's fixed part shared with the catalog
//! and a copy of its live part (`stored`), so appending allocates
//! nothing for a single change, and the `ServiceDelta` an agent is sent is
//! built when it is first read. The log never decides what a change is;
//! the catalog appends, the distribution layer reads.

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};

use foldhash::HashMap;

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::endpoint::EndpointRecord;
use crate::ids::{Generation, Revision};
use crate::name::{InstanceId, ServiceKey};
use crate::params::DeltaLogParams;
use crate::stored::{materialize, Fixed, Live};

/// One change to one record of a service.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum Change {
    /// The record as it is after the change (new or replaced).
    Upsert(Arc<EndpointRecord>),
    /// The record was removed.
    Remove {
        /// The instance.
        instance_id: InstanceId,
        /// The generation that was removed.
        generation: Generation,
    },
}

/// The changes one committed command made to one service.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ServiceDelta {
    /// The service.
    pub service: ServiceKey,
    /// The revision that committed these changes.
    pub revision: Revision,
    /// The service's revision before them: a consumer holding another
    /// revision has a gap and needs a snapshot.
    pub prev_revision: Revision,
    /// The changes, in the order they were made.
    pub changes: Vec<Change>,
    /// The service's digest after them.
    pub digest: Digest,
    /// False when this delta deletes the service (it becomes unknown).
    pub exists: bool,
    /// Its encoding, made the first time a session message carries it and
    /// shared by every message after (a change to a popular service goes
    /// to thousands of sessions). Not part of the value: never sent,
    /// never compared.
    #[serde(skip)]
    pub(crate) encoded: EncodedOnce,
}

/// A value's encoding, made once ([`ServiceDelta::encoded`]).
#[derive(Clone, Default)]
pub(crate) struct EncodedOnce(pub(crate) OnceLock<Box<[u8]>>);

impl PartialEq for EncodedOnce {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for EncodedOnce {}

impl std::fmt::Debug for EncodedOnce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.get() {
            Some(bytes) => write!(f, "EncodedOnce({} bytes)", bytes.len()),
            None => f.write_str("EncodedOnce(not yet)"),
        }
    }
}

/// What the log can say about "changes to S after revision r".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogAnswer {
    /// Every change after r, oldest first (possibly none).
    Deltas(Vec<Arc<ServiceDelta>>),
    /// The log no longer reaches back to r: take a snapshot.
    TooOld {
        /// Every change after this revision is still in the log.
        floor: Revision,
    },
}

/// One change as the log keeps it: a record's fixed part shared with the
/// catalog and its live part as it was, or a removal.
#[derive(Clone, Debug)]
pub(crate) enum LogChange {
    /// The record as it is after the change.
    Upsert(Arc<Fixed>, Live),
    /// The record was removed.
    Remove(InstanceId, Generation),
}

impl LogChange {
    fn change(&self) -> Change {
        match self {
            LogChange::Upsert(fixed, live) => Change::Upsert(materialize(fixed, live)),
            LogChange::Remove(instance_id, generation) => Change::Remove {
                instance_id: instance_id.clone(),
                generation: *generation,
            },
        }
    }
}

/// What a delta says besides its changes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeltaHead {
    /// The revision that committed it.
    pub(crate) revision: Revision,
    /// The service's revision before it.
    pub(crate) prev_revision: Revision,
    /// The service's digest after it.
    pub(crate) digest: Digest,
    /// False when it deletes the service.
    pub(crate) exists: bool,
}

/// One delta in the ring: fixed size apart from the rare second change,
/// no allocation for the common single change. The `ServiceDelta` sent to
/// agents is built from it the first time someone reads it, and kept.
#[derive(Clone, Debug)]
struct Entry {
    service: Arc<ServiceKey>,
    /// The sequence number of the previous entry of the same service.
    prev: Option<u64>,
    head: DeltaHead,
    first: Option<LogChange>,
    rest: Vec<LogChange>,
    built: OnceLock<Arc<ServiceDelta>>,
}

impl Entry {
    fn delta(&self) -> Arc<ServiceDelta> {
        self.built
            .get_or_init(|| {
                Arc::new(ServiceDelta {
                    service: (*self.service).clone(),
                    revision: self.head.revision,
                    prev_revision: self.head.prev_revision,
                    changes: self
                        .first
                        .iter()
                        .chain(&self.rest)
                        .map(LogChange::change)
                        .collect(),
                    digest: self.head.digest,
                    exists: self.head.exists,
                    encoded: EncodedOnce::default(),
                })
            })
            .clone()
    }
}

/// Bounded log of service deltas: a ring of entries, each linked to the
/// previous entry of its service. Where a service's newest entry is, the
/// catalog keeps (a sequence number, `append`'s answer); a deleted
/// service's is parked here until the service comes back.
#[derive(Clone, Debug)]
pub struct DeltaLog {
    entries: VecDeque<Entry>,
    /// Sequence number of `entries[0]`.
    base_seq: u64,
    /// Deleted services' newest entries, so a service created again under
    /// the same key continues its chain.
    parked: HashMap<ServiceKey, u64>,
    /// Every change with a revision above the floor is in the log.
    floor: Revision,
    params: DeltaLogParams,
}

impl DeltaLog {
    /// An empty log whose history starts after `floor` (0 for a new
    /// catalog, the snapshot's revision after an import).
    pub fn new(floor: Revision, params: DeltaLogParams) -> Self {
        DeltaLog {
            entries: VecDeque::new(),
            base_seq: 0,
            parked: HashMap::default(),
            floor,
            params,
        }
    }

    /// Appends a delta of `service`, whose previous entry is `prev`, and
    /// evicts what the retention no longer allows. Answers the new entry's
    /// sequence number.
    pub(crate) fn append(
        &mut self,
        service: Arc<ServiceKey>,
        prev: Option<u64>,
        head: DeltaHead,
        changes: impl IntoIterator<Item = LogChange>,
    ) -> u64 {
        let seq = self.base_seq + self.entries.len() as u64;
        let mut changes = changes.into_iter();
        let first = changes.next();
        let rest = changes.collect();
        self.entries.push_back(Entry {
            service,
            prev,
            head,
            first,
            rest,
            built: OnceLock::new(),
        });
        let newest = head.revision;
        while let Some(oldest) = self.entries.front() {
            let too_many = self.entries.len() > self.params.max_entries;
            let too_old =
                newest.0.saturating_sub(oldest.head.revision.0) > self.params.max_revision_span;
            if !too_many && !too_old {
                break;
            }
            let revision = oldest.head.revision;
            self.entries.pop_front();
            self.base_seq += 1;
            self.floor = self.floor.max(revision);
        }
        seq
    }

    /// Keeps a deleted service's newest entry `seq` for its return.
    pub(crate) fn park(&mut self, service: ServiceKey, seq: u64) {
        let base = self.base_seq;
        self.parked.retain(|_, s| *s >= base);
        self.parked.insert(service, seq);
    }

    /// The newest entry of a service created again, if the log holds one.
    pub(crate) fn unpark(&mut self, service: &ServiceKey) -> Option<u64> {
        self.parked.remove(service).filter(|s| *s >= self.base_seq)
    }

    /// The changes of the service whose newest entry is `last` after
    /// revision `after`, or `TooOld`.
    pub(crate) fn since(&self, last: Option<u64>, after: Revision) -> LogAnswer {
        if after < self.floor {
            return LogAnswer::TooOld { floor: self.floor };
        }
        let mut deltas = Vec::new();
        let mut at = last;
        while let Some(seq) = at.filter(|s| *s >= self.base_seq) {
            let entry = &self.entries[(seq - self.base_seq) as usize];
            if entry.head.revision <= after {
                break;
            }
            deltas.push(entry.delta());
            at = entry.prev;
        }
        deltas.reverse();
        LogAnswer::Deltas(deltas)
    }

    /// The services changed after revision `after`, each once, or `None`
    /// when the log no longer reaches back that far.
    pub fn services_after(&self, after: Revision) -> Option<Vec<ServiceKey>> {
        if after < self.floor {
            return None;
        }
        let start = self.entries.partition_point(|e| e.head.revision <= after);
        let mut services: Vec<ServiceKey> = self
            .entries
            .range(start..)
            .map(|e| (*e.service).clone())
            .collect();
        services.sort();
        services.dedup();
        Some(services)
    }

    /// Every change above this revision is retained.
    pub fn floor(&self) -> Revision {
        self.floor
    }

    /// Number of deltas held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the log holds no delta.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log and where each service's newest entry is, as the catalog
    /// keeps them.
    struct Log {
        log: DeltaLog,
        last: HashMap<ServiceKey, u64>,
    }

    fn key(service: &str) -> ServiceKey {
        ServiceKey::new("default", service, "default").unwrap()
    }

    impl Log {
        fn new(max_entries: usize, max_revision_span: u64) -> Log {
            Log {
                log: DeltaLog::new(
                    Revision(0),
                    DeltaLogParams {
                        max_entries,
                        max_revision_span,
                    },
                ),
                last: HashMap::default(),
            }
        }

        fn append(&mut self, service: &str, rev: u64, prev: u64) {
            let head = DeltaHead {
                revision: Revision(rev),
                prev_revision: Revision(prev),
                digest: Digest::EMPTY,
                exists: true,
            };
            let last = self.last.get(&key(service)).copied();
            let seq = self
                .log
                .append(Arc::new(key(service)), last, head, Vec::new());
            self.last.insert(key(service), seq);
        }

        fn since(&self, service: &str, after: u64) -> LogAnswer {
            let last = self.last.get(&key(service)).copied();
            self.log.since(last, Revision(after))
        }
    }

    fn revs(a: LogAnswer) -> Vec<u64> {
        match a {
            LogAnswer::Deltas(d) => d.iter().map(|d| d.revision.0).collect(),
            LogAnswer::TooOld { floor } => panic!("too old, floor {floor}"),
        }
    }

    #[test]
    fn answers_only_the_services_changes_after_r() {
        let mut log = Log::new(100, 100);
        log.append("a", 1, 0);
        log.append("b", 2, 0);
        log.append("a", 3, 1);
        log.append("a", 4, 3);
        assert_eq!(revs(log.since("a", 0)), vec![1, 3, 4]);
        assert_eq!(revs(log.since("a", 3)), vec![4]);
        assert_eq!(revs(log.since("a", 4)), Vec::<u64>::new());
        assert_eq!(revs(log.since("c", 0)), Vec::<u64>::new());
        assert_eq!(
            log.log.services_after(Revision(1)),
            Some(vec![key("a"), key("b")])
        );
    }

    #[test]
    fn eviction_by_count_raises_the_floor() {
        let mut log = Log::new(2, 100);
        for r in 1..=4 {
            log.append("a", r, r - 1);
        }
        assert_eq!(log.log.floor(), Revision(2));
        assert_eq!(log.since("a", 1), LogAnswer::TooOld { floor: Revision(2) });
        assert_eq!(revs(log.since("a", 2)), vec![3, 4]);
    }

    #[test]
    fn eviction_by_revision_span() {
        let mut log = Log::new(100, 10);
        log.append("a", 1, 0);
        log.append("b", 20, 0);
        assert_eq!(log.log.len(), 1);
        assert_eq!(log.log.floor(), Revision(1));
        assert_eq!(revs(log.since("a", 1)), Vec::<u64>::new());
    }

    #[test]
    fn a_parked_chain_continues_and_an_evicted_one_is_forgotten() {
        let mut log = Log::new(3, 100);
        log.append("a", 1, 0);
        log.log.park(key("a"), log.last[&key("a")]);
        let back = log.log.unpark(&key("a"));
        assert_eq!(back, Some(0));
        log.log.park(key("a"), 0);
        for r in 2..=4 {
            log.append("b", r, r - 1);
        }
        assert_eq!(log.log.unpark(&key("a")), None, "its entry was evicted");
    }
}
