//! The delta log (R6): the recent changes of every service, so an agent that
//! holds revision r of a service gets exactly the changes since r, or is told
//! to take a snapshot when the log no longer reaches back that far.
//!
//! Retention is bounded by entry count and by revision span (by default 15
//! minutes at 200 changes per second). The log never decides what a change
//! is; the catalog appends, the distribution layer reads.

use std::collections::VecDeque;

use foldhash::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::endpoint::EndpointRecord;
use crate::ids::{Generation, Revision};
use crate::name::{InstanceId, ServiceKey};
use crate::params::DeltaLogParams;

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

/// Bounded log of service deltas.
#[derive(Clone, Debug)]
pub struct DeltaLog {
    entries: VecDeque<Arc<ServiceDelta>>,
    /// Sequence number of `entries[0]`.
    base_seq: u64,
    /// Per service, the sequence numbers of its entries, oldest first.
    by_service: HashMap<ServiceKey, VecDeque<u64>>,
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
            by_service: HashMap::default(),
            floor,
            params,
        }
    }

    /// Appends a delta and evicts what the retention no longer allows.
    pub fn append(&mut self, delta: ServiceDelta) {
        let seq = self.base_seq + self.entries.len() as u64;
        self.by_service
            .entry(delta.service.clone())
            .or_default()
            .push_back(seq);
        let newest = delta.revision;
        self.entries.push_back(Arc::new(delta));
        while let Some(oldest) = self.entries.front() {
            let too_many = self.entries.len() > self.params.max_entries;
            let too_old =
                newest.0.saturating_sub(oldest.revision.0) > self.params.max_revision_span;
            if !too_many && !too_old {
                break;
            }
            self.evict_front();
        }
    }

    fn evict_front(&mut self) {
        let Some(oldest) = self.entries.pop_front() else {
            return;
        };
        if let Some(seqs) = self.by_service.get_mut(&oldest.service) {
            seqs.pop_front();
            if seqs.is_empty() {
                self.by_service.remove(&oldest.service);
            }
        }
        self.base_seq += 1;
        self.floor = self.floor.max(oldest.revision);
    }

    /// The changes to `service` after revision `after`, or `TooOld`.
    pub fn since(&self, service: &ServiceKey, after: Revision) -> LogAnswer {
        if after < self.floor {
            return LogAnswer::TooOld { floor: self.floor };
        }
        let Some(seqs) = self.by_service.get(service) else {
            return LogAnswer::Deltas(Vec::new());
        };
        let entry = |seq: u64| &self.entries[(seq - self.base_seq) as usize];
        let start = seqs.partition_point(|s| entry(*s).revision <= after);
        LogAnswer::Deltas(
            seqs.iter()
                .skip(start)
                .map(|s| Arc::clone(entry(*s)))
                .collect(),
        )
    }

    /// The services changed after revision `after`, each once, or `None`
    /// when the log no longer reaches back that far.
    pub fn services_after(&self, after: Revision) -> Option<Vec<ServiceKey>> {
        if after < self.floor {
            return None;
        }
        let start = self.entries.partition_point(|d| d.revision <= after);
        let mut services: Vec<ServiceKey> = self
            .entries
            .range(start..)
            .map(|d| d.service.clone())
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

    fn delta(service: &str, rev: u64, prev: u64) -> ServiceDelta {
        ServiceDelta {
            service: ServiceKey::new("default", service, "default").unwrap(),
            revision: Revision(rev),
            prev_revision: Revision(prev),
            changes: Vec::new(),
            digest: Digest::EMPTY,
            exists: true,
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
        let mut log = DeltaLog::new(
            Revision(0),
            DeltaLogParams {
                max_entries: 100,
                max_revision_span: 100,
            },
        );
        log.append(delta("a", 1, 0));
        log.append(delta("b", 2, 0));
        log.append(delta("a", 3, 1));
        log.append(delta("a", 4, 3));
        let a = ServiceKey::new("default", "a", "default").unwrap();
        assert_eq!(revs(log.since(&a, Revision(0))), vec![1, 3, 4]);
        assert_eq!(revs(log.since(&a, Revision(3))), vec![4]);
        assert_eq!(revs(log.since(&a, Revision(4))), Vec::<u64>::new());
    }

    #[test]
    fn eviction_by_count_raises_the_floor() {
        let mut log = DeltaLog::new(
            Revision(0),
            DeltaLogParams {
                max_entries: 2,
                max_revision_span: 100,
            },
        );
        for r in 1..=4 {
            log.append(delta("a", r, r - 1));
        }
        let a = ServiceKey::new("default", "a", "default").unwrap();
        assert_eq!(log.floor(), Revision(2));
        assert_eq!(
            log.since(&a, Revision(1)),
            LogAnswer::TooOld { floor: Revision(2) }
        );
        assert_eq!(revs(log.since(&a, Revision(2))), vec![3, 4]);
    }

    #[test]
    fn eviction_by_revision_span() {
        let mut log = DeltaLog::new(
            Revision(0),
            DeltaLogParams {
                max_entries: 100,
                max_revision_span: 10,
            },
        );
        log.append(delta("a", 1, 0));
        log.append(delta("b", 20, 0));
        assert_eq!(log.len(), 1);
        assert_eq!(log.floor(), Revision(1));
    }
}
