//! Snapshots: one service's full record set (what an agent takes when the
//! delta log no longer reaches back, R6) and the whole shard (what a new or
//! wiped replica takes, and what the property tests compare).
//!
//! These are plain data; `catalog.rs` exports and imports them, `codec.rs`
//! encodes them compactly.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::endpoint::EndpointRecord;
use crate::ids::{CatalogId, Generation, Revision, ShardId};
use crate::lease::Lease;
use crate::name::{InstanceId, Label, ServiceKey};
use crate::policy::{ReplicatedPolicy, StoredPolicy};

/// The last generation given to an instance id, remembered after the
/// record is gone so a re-registration continues the sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationMemory {
    /// The last generation assigned.
    pub generation: Generation,
    /// When its record was removed; `None` while it is live.
    pub released_at_ms: Option<u64>,
}

/// A snapshot could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// It decodes but contradicts itself.
    #[error("inconsistent snapshot: {0}")]
    Inconsistent(String),
}

/// One service's records at its last change.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ServiceSnapshot {
    /// The shard the service lives in.
    pub shard: ShardId,
    /// The service.
    pub service: ServiceKey,
    /// The revision of the service's last change: deltas after it chain on.
    pub revision: Revision,
    /// The digest of `records`.
    pub digest: Digest,
    /// Every record, sorted by instance id.
    pub records: Vec<Arc<EndpointRecord>>,
}

/// One service inside a shard snapshot.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ServiceEntry {
    /// The service.
    pub service: ServiceKey,
    /// The revision of its last change.
    pub revision: Revision,
    /// When its last record was removed, if it is empty.
    pub emptied_at_ms: Option<u64>,
    /// The digest of `records`.
    pub digest: Digest,
    /// Every record, sorted by instance id.
    pub records: Vec<Arc<EndpointRecord>>,
}

/// A whole shard: everything replicated, nothing from a leader's memory.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct CatalogSnapshot {
    /// The shard.
    pub shard: ShardId,
    /// The region that owns it.
    pub region: Label,
    /// The revision of the shard's last change.
    pub revision: Revision,
    /// Every service, in key order.
    pub services: Vec<ServiceEntry>,
    /// Every lease, in node order.
    pub leases: Vec<Lease>,
    /// Generation memory, in instance id order.
    pub generations: Vec<(InstanceId, GenerationMemory)>,
    /// The mass-expiry guard's recent expiries per zone.
    pub guard: Vec<(Label, Vec<u64>)>,
    /// The service policies homed in this region, in key order.
    pub policies: Vec<StoredPolicy>,
    /// Other regions' policies the region bridge replicated, in key order.
    pub replicated_policies: Vec<ReplicatedPolicy>,
    /// Writer epochs past the first, in key order (empty in snapshots
    /// written before writer epochs existed).
    pub writers: Vec<crate::writer::StoredWriter>,
    /// The catalog's identity (`None` before its first leader named it,
    /// and in snapshots written before identities existed).
    pub identity: Option<CatalogId>,
}
