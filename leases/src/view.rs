//! A consumer's copy of one service (what an agent's cache holds): built
//! from a snapshot, advanced by deltas, each checked before it is applied.
//!
//! A delta that does not chain on the held revision (a gap) or whose result
//! would not match its digest (divergence) is refused and changes nothing;
//! the consumer then takes a snapshot of that one service (R6).

use std::collections::BTreeMap;

use foldhash::HashMap;
use std::sync::Arc;

use crate::delta_log::{Change, ServiceDelta};
use crate::digest::Digest;
use crate::endpoint::EndpointRecord;
use crate::ids::{Revision, ShardId};
use crate::name::{InstanceId, ServiceKey};
use crate::snapshot::ServiceSnapshot;

/// Why a snapshot or delta was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    /// The delta is for another service.
    #[error("delta for service {got} offered to the view of {expected}")]
    WrongService {
        /// The view's service.
        expected: ServiceKey,
        /// The delta's service.
        got: ServiceKey,
    },
    /// The delta does not follow the held revision.
    #[error(
        "gap in service {service}: holding revision {held}, delta follows {prev}; take a snapshot"
    )]
    Gap {
        /// The service.
        service: ServiceKey,
        /// The revision held.
        held: Revision,
        /// The revision the delta follows.
        prev: Revision,
    },
    /// The result would not match the announced digest.
    #[error("service {service} at revision {revision} would have digest {computed}, the arbiter says {expected}; take a snapshot")]
    DigestMismatch {
        /// The service.
        service: ServiceKey,
        /// The delta's or snapshot's revision.
        revision: Revision,
        /// The announced digest.
        expected: Digest,
        /// What the records give.
        computed: Digest,
    },
}

/// One service as a consumer holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceView {
    service: ServiceKey,
    shard: ShardId,
    revision: Revision,
    exists: bool,
    digest: Digest,
    records: BTreeMap<InstanceId, (Arc<EndpointRecord>, u128)>,
}

impl ServiceView {
    /// A view of a service the consumer knows nothing about yet.
    pub fn empty(service: ServiceKey, shard: ShardId) -> Self {
        ServiceView {
            service,
            shard,
            revision: Revision(0),
            exists: false,
            digest: Digest::EMPTY,
            records: BTreeMap::new(),
        }
    }

    /// A view from a snapshot, whose digest must match its records.
    pub fn from_snapshot(snap: &ServiceSnapshot) -> Result<Self, ViewError> {
        let records: BTreeMap<InstanceId, (Arc<EndpointRecord>, u128)> = snap
            .records
            .iter()
            .map(|r| (r.instance_id.clone(), (r.clone(), Digest::of_record(r))))
            .collect();
        let mut digest = Digest::EMPTY;
        for (_, hash) in records.values() {
            digest.add(*hash);
        }
        if digest != snap.digest || records.len() != snap.records.len() {
            return Err(ViewError::DigestMismatch {
                service: snap.service.clone(),
                revision: snap.revision,
                expected: snap.digest,
                computed: digest,
            });
        }
        Ok(ServiceView {
            service: snap.service.clone(),
            shard: snap.shard,
            revision: snap.revision,
            exists: true,
            digest,
            records,
        })
    }

    /// Applies a delta after checking its chain and its digest.
    pub fn apply(&mut self, delta: &ServiceDelta) -> Result<(), ViewError> {
        if delta.service != self.service {
            return Err(ViewError::WrongService {
                expected: self.service.clone(),
                got: delta.service.clone(),
            });
        }
        // A service's first delta follows revision 0; it also re-creates a
        // service this view saw deleted.
        let creates = delta.prev_revision == Revision(0) && !self.exists;
        if delta.prev_revision != self.revision && !creates {
            return Err(ViewError::Gap {
                service: self.service.clone(),
                held: self.revision,
                prev: delta.prev_revision,
            });
        }
        // Work out the resulting digest first, so a bad delta changes nothing.
        let mut pending: HashMap<&InstanceId, Option<u128>> = HashMap::default();
        let mut digest = self.digest;
        let mut divergent = false;
        let mut upsert_hashes = Vec::with_capacity(delta.changes.len());
        for change in &delta.changes {
            let id = match change {
                Change::Upsert(r) => &r.instance_id,
                Change::Remove { instance_id, .. } => instance_id,
            };
            let current = match pending.get(id) {
                Some(h) => *h,
                None => self.records.get(id).map(|(_, h)| *h),
            };
            match (change, current) {
                (Change::Upsert(r), old) => {
                    if let Some(h) = old {
                        digest.remove(h);
                    }
                    let h = Digest::of_record(r);
                    digest.add(h);
                    pending.insert(id, Some(h));
                    upsert_hashes.push(h);
                }
                (Change::Remove { .. }, Some(h)) => {
                    digest.remove(h);
                    pending.insert(id, None);
                }
                (Change::Remove { .. }, None) => divergent = true,
            }
        }
        // The catalog deletes only empty services, so a deletion carries no
        // changes and finds the view already empty.
        if !delta.exists && (!delta.changes.is_empty() || !self.records.is_empty()) {
            divergent = true;
        }
        if divergent || digest != delta.digest {
            return Err(ViewError::DigestMismatch {
                service: self.service.clone(),
                revision: delta.revision,
                expected: delta.digest,
                computed: digest,
            });
        }
        let mut upsert_hashes = upsert_hashes.into_iter();
        for change in &delta.changes {
            match change {
                Change::Upsert(r) => {
                    let hash = upsert_hashes.next().expect("one hash per upsert");
                    self.records
                        .insert(r.instance_id.clone(), (r.clone(), hash));
                }
                Change::Remove { instance_id, .. } => {
                    self.records.remove(instance_id);
                }
            }
        }
        self.revision = delta.revision;
        self.exists = delta.exists;
        self.digest = digest;
        Ok(())
    }

    /// The service.
    pub fn service(&self) -> &ServiceKey {
        &self.service
    }

    /// The revision of the service's last change held.
    pub fn revision(&self) -> Revision {
        self.revision
    }

    /// Whether the service exists (false before the first snapshot and after
    /// a deletion).
    pub fn exists(&self) -> bool {
        self.exists
    }

    /// The digest of the held records.
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// Every record, sorted by instance id.
    pub fn records(&self) -> impl Iterator<Item = &Arc<EndpointRecord>> {
        self.records.values().map(|(r, _)| r)
    }

    /// The routable (READY) records, sorted by instance id.
    pub fn ready(&self) -> impl Iterator<Item = &Arc<EndpointRecord>> {
        self.records().filter(|r| r.state.is_routable())
    }

    /// The held state as a snapshot (for the on-disk cache).
    pub fn to_snapshot(&self) -> ServiceSnapshot {
        ServiceSnapshot {
            shard: self.shard,
            service: self.service.clone(),
            revision: self.revision,
            digest: self.digest,
            records: self.records().cloned().collect(),
        }
    }
}
