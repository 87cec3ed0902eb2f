//! The arbiter state machine (R2, R3): `apply(envelope)` takes one command
//! and either rejects it with a reason, changing nothing, or commits it under
//! the shard's next revision, updating records, leases, digests and the
//! delta log together. It also holds the service policies whose home is
//! this region (R9), and apart from them the policies of other regions
//! that the region bridge replicated, with their home revisions; a policy
//! change takes a revision like any other change but touches no record, so
//! it makes no delta.
//!
//! It is deterministic: no clock, no randomness, no IO. Time and the leader's
//! observations travel inside the command, and every iteration whose order
//! could show in the result is over a sorted collection, so replaying the
//! same log gives byte-identical snapshots on every replica. Lease deadlines
//! are deliberately not here: they are the leader's memory (see `lease.rs`).

use std::collections::{BTreeMap, BTreeSet};

use foldhash::HashMap;
use std::sync::Arc;

use crate::command::{Command, Envelope, Registration, MAX_REPORTERS};
use crate::delta_log::{DeltaHead, DeltaLog, LogAnswer, LogChange, ServiceDelta};
use crate::digest::Digest;
use crate::endpoint::{EndpointRecord, Labels, Liveness, State};
use crate::guard::{ExpiryGuard, GuardDecision};
use crate::ids::{AgentEpoch, CatalogId, Generation, LeaseId, Revision};
use crate::lease::{Lease, LeaseTable};
use crate::name::{InstanceId, Label, NodeId, Reason, ServiceKey};
use crate::params::{CatalogParams, LEASE_TTL_RANGE_MS};
use crate::policy::{Policy, PolicyKey, RemotePolicy, ReplicatedPolicy, StoredPolicy};
use crate::snapshot::{CatalogSnapshot, ServiceEntry, ServiceSnapshot, SnapshotError};

use crate::stored::{materialize, Fixed, Live};
use crate::writer::{StoredWriter, TransferRefusal};

mod instances;
mod leases;
mod policies;
mod rejection;
mod snapshot;
mod storage;
mod writers;

pub use rejection::Rejection;

/// What a committed command did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Nothing changed (for example a transition to the state it is in).
    Unchanged,
    /// A lease was granted, replaced or its TTL changed; `moved` records of
    /// the node now sit under it.
    LeaseGranted {
        /// The lease.
        lease: LeaseId,
        /// Records moved to it from an older grant.
        moved: usize,
    },
    /// A held lease was reinstated because its session came back.
    LeaseReinstated,
    /// A lease ended (revoked, expired or a down verdict); `marked` records
    /// changed state.
    LeaseEnded {
        /// Records that changed state.
        marked: usize,
    },
    /// The mass-expiry guard held the expiry (alert).
    ExpiryHeld,
    /// An instance was registered.
    Registered {
        /// Its generation.
        generation: Generation,
        /// Its state.
        state: State,
        /// The record of the same instance id it replaced, if one was held.
        replaced: Option<Replaced>,
    },
    /// A record changed or was removed.
    Changed,
    /// A service policy was set or deleted.
    PolicyChanged,
    /// A writer epoch was stored (`writer`).
    WriterChanged {
        /// Its number.
        epoch: u64,
        /// Whether it is settled (else the writes are moving).
        settled: bool,
    },
    /// The catalog got its identity.
    Identified,
    /// A purge removed these.
    Purged {
        /// Records removed.
        records: usize,
        /// Generations forgotten.
        generations: usize,
        /// Services that became unknown.
        services: usize,
    },
}

/// The result of a committed command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The revision that committed it; `None` when nothing changed.
    pub revision: Option<Revision>,
    /// What it did.
    pub effect: Effect,
    /// The services whose records changed, in key order.
    pub services: Vec<ServiceKey>,
}

/// What the catalog can tell a subscriber holding revision r of a service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinceAnswer {
    /// Nothing changed after r.
    UpToDate,
    /// The changes after r, oldest first.
    Deltas(Vec<Arc<ServiceDelta>>),
    /// The delta log no longer reaches back to r: send a snapshot.
    SnapshotNeeded,
    /// The subscriber claims a revision this catalog has not reached (a
    /// lagging replica): wait or ask another.
    Ahead {
        /// This catalog's revision.
        current: Revision,
    },
    /// The service does not exist.
    Unknown,
}

pub use crate::snapshot::GenerationMemory;

/// The record a registration replaced (`Effect::Registered`): the audit
/// names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replaced {
    /// The node that held it.
    pub node: NodeId,
    /// Its generation.
    pub generation: Generation,
    /// Its state.
    pub state: State,
}

/// One service's READY capacity, as the region bridge reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadySummary {
    /// The service.
    pub service: ServiceKey,
    /// Revision of its last change.
    pub revision: Revision,
    /// READY records in it.
    pub ready: usize,
    /// The summed weight of its READY records.
    pub ready_weight: u64,
}

/// A summary of one service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceInfo {
    /// Revision of its last change.
    pub revision: Revision,
    /// Digest of its record set.
    pub digest: Digest,
    /// Records in it.
    pub records: usize,
    /// READY records in it.
    pub ready: usize,
}

/// One record in the arena: its fixed part (shared with the delta log),
/// its live part (changed in place), its digest hash and where it sits.
#[derive(Clone, Debug)]
struct Slot {
    fixed: Arc<Fixed>,
    live: Live,
    hash: u128,
    /// Its service's index in `services`.
    service: u32,
    /// Its index in that service's `members`.
    member: u32,
}

#[derive(Clone, Debug)]
struct ServiceState {
    key: Arc<ServiceKey>,
    /// Its records' slots, in no order.
    members: Vec<u32>,
    revision: Revision,
    digest: Digest,
    ready: usize,
    emptied_at_ms: Option<u64>,
    /// Its newest delta-log entry, while the log holds one.
    log_last: Option<u64>,
}

/// The changes of one command, gathered before they are committed: by
/// service index, in the order they were made. Kept between commands so
/// a command allocates nothing here.
#[derive(Clone, Debug, Default)]
struct Batch {
    changes: Vec<(u32, LogChange)>,
    /// Deleted services: key, last revision, newest log entry.
    deleted: Vec<(Arc<ServiceKey>, Revision, Option<u64>)>,
}

/// One catalog shard: records, leases, the guard and the delta log.
///
/// Records live in an arena (`slots`) under dense indices: one hash lookup
/// from an instance id to its slot, and from the slot its service by
/// index; a service lists its slots. Freed slots and service indices are
/// reused.
#[derive(Clone, Debug)]
pub struct Catalog {
    params: CatalogParams,
    revision: Revision,
    services: Vec<Option<ServiceState>>,
    free_services: Vec<u32>,
    service_index: HashMap<ServiceKey, u32>,
    slots: Vec<Option<Slot>>,
    free_slots: Vec<u32>,
    instances: HashMap<InstanceId, u32>,
    generations: HashMap<InstanceId, GenerationMemory>,
    nodes: HashMap<NodeId, BTreeSet<InstanceId>>,
    leases: LeaseTable,
    guard: ExpiryGuard,
    log: DeltaLog,
    policies: BTreeMap<PolicyKey, StoredPolicy>,
    replicated: BTreeMap<PolicyKey, ReplicatedPolicy>,
    /// Writer epochs past the first (R9, `writer`), committed here or
    /// replicated.
    writers: BTreeMap<PolicyKey, StoredWriter>,
    /// The revision of the last change to a policy or a writer epoch
    /// (what tells a replica its agents' regions messages changed).
    policy_revision: Revision,
    /// The catalog's identity, once its group's first leader named it.
    identity: Option<CatalogId>,
    /// Reused buffer for encoding records to hash them.
    scratch: Vec<u8>,
    /// Reused between commands.
    batch: Batch,
}

impl Catalog {
    /// An empty catalog at revision 0.
    pub fn new(params: CatalogParams) -> Self {
        let log = DeltaLog::new(Revision(0), params.delta_log.clone());
        Catalog {
            params,
            revision: Revision(0),
            services: Vec::new(),
            free_services: Vec::new(),
            service_index: HashMap::default(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            instances: HashMap::default(),
            generations: HashMap::default(),
            nodes: HashMap::default(),
            leases: LeaseTable::default(),
            guard: ExpiryGuard::default(),
            log,
            policies: BTreeMap::new(),
            replicated: BTreeMap::new(),
            writers: BTreeMap::new(),
            policy_revision: Revision(0),
            identity: None,
            scratch: Vec::new(),
            batch: Batch::default(),
        }
    }

    /// Applies one command. On `Err` nothing changed.
    pub fn apply(&mut self, env: &Envelope) -> Result<Applied, Rejection> {
        let rev = self.revision.next();
        let mut batch = std::mem::take(&mut self.batch);
        let effect = match &env.command {
            Command::GrantLease {
                node,
                epoch,
                zone,
                ttl_ms,
            } => self.grant(&mut batch, env, rev, node, *epoch, zone, *ttl_ms)?,
            Command::RevokeLease { node, epoch } => {
                let lease = self.lease_of(node, *epoch)?;
                let marked = self.end_lease(
                    &mut batch,
                    env,
                    rev,
                    lease,
                    State::Expired,
                    Reason::fixed("lease revoked by its agent"),
                );
                Effect::LeaseEnded { marked }
            }
            Command::ExpireLease {
                node,
                epoch,
                silent_in_zone,
            } => self.expire(&mut batch, env, rev, node, *epoch, *silent_in_zone)?,
            Command::Register(reg) => self.register(&mut batch, env, rev, reg)?,
            Command::Transition {
                instance_id,
                generation,
                to,
                reason,
            } => self.transition(&mut batch, env, rev, instance_id, *generation, *to, reason)?,
            Command::SetLiveness {
                instance_id,
                generation,
                liveness,
            } => self.set_liveness(&mut batch, env, rev, instance_id, *generation, *liveness)?,
            Command::Deregister {
                instance_id,
                generation,
            } => {
                let slot = self.live(instance_id, *generation)?;
                self.remove_record(&mut batch, slot, env.at_ms);
                Effect::Changed
            }
            Command::NodeDown {
                node,
                epoch,
                reporters,
            } => {
                let lease = self.lease_of(node, *epoch)?;
                let names: Vec<&str> = reporters
                    .iter()
                    .take(MAX_REPORTERS)
                    .map(|r| r.as_str())
                    .collect();
                let reason = bounded_reason(&format!(
                    "node down, silent to the arbiter (reported by {})",
                    names.join(", ")
                ));
                // Counted in the mass-expiry guard's window like any
                // expiry, never held by it: two signals agree (R4), and
                // a zone that died must leave at once (ARCHITECTURE R10).
                self.guard.record(&lease.zone, env.at_ms);
                let marked = self.end_lease(&mut batch, env, rev, lease, State::Unhealthy, reason);
                Effect::LeaseEnded { marked }
            }
            Command::Purge => self.purge(&mut batch, env.at_ms),
            Command::DeleteService { service } => {
                let svc = self
                    .service_state(service)
                    .ok_or_else(|| Rejection::UnknownService {
                        service: service.clone(),
                    })?;
                if !svc.members.is_empty() {
                    return Err(Rejection::ServiceNotEmpty {
                        service: service.clone(),
                        records: svc.members.len(),
                    });
                }
                self.delete_service(&mut batch, service);
                Effect::Changed
            }
            Command::SetPolicy(policy) => self.set_policy(env, rev, policy)?,
            Command::DeletePolicy { service } => {
                self.home_policy(service)?;
                self.policies.remove(service);
                Effect::PolicyChanged
            }
            Command::ReplicatePolicy(remote) => self.replicate_policy(env, rev, remote)?,
            Command::DropReplicatedPolicy {
                service,
                home,
                home_revision,
            } => match self.replicated.get(service) {
                Some(held)
                    if held.remote.policy.home_region() == home
                        && held.remote.home_revision <= *home_revision =>
                {
                    self.replicated.remove(service);
                    Effect::PolicyChanged
                }
                _ => Effect::Unchanged,
            },
            Command::TransferWriter(request) => self.transfer_writer(env, rev, request)?,
            Command::ReplicateWriter(remote) => self.replicate_writer(rev, remote),
            Command::Identify { catalog } => match self.identity {
                Some(_) => Effect::Unchanged,
                None => {
                    self.identity = Some(*catalog);
                    Effect::Identified
                }
            },
        };
        Ok(self.commit(rev, batch, effect))
    }

    fn commit(&mut self, rev: Revision, mut batch: Batch, effect: Effect) -> Applied {
        if matches!(effect, Effect::PolicyChanged | Effect::WriterChanged { .. }) {
            self.policy_revision = rev;
        }
        if effect == Effect::Unchanged {
            batch.changes.clear();
            batch.deleted.clear();
            self.batch = batch;
            return Applied {
                revision: None,
                effect,
                services: Vec::new(),
            };
        }
        self.revision = rev;
        let mut services = Vec::with_capacity(1 + batch.deleted.len());
        // One delta per service, in key order; its changes in the order
        // they were made (the sort is stable).
        let first = batch.changes.first().map(|(ix, _)| *ix);
        if batch.changes.iter().any(|(ix, _)| Some(*ix) != first) {
            let by_index = &self.services;
            batch
                .changes
                .sort_by(|(a, _), (b, _)| key_at(by_index, *a).cmp(key_at(by_index, *b)));
        }
        let mut changes = batch.changes.drain(..).peekable();
        while let Some((ix, change)) = changes.next() {
            let svc = self.services[ix as usize]
                .as_mut()
                .expect("a changed service exists");
            let mut rest = Vec::new();
            while let Some((_, more)) = changes.next_if(|(next, _)| *next == ix) {
                rest.push(more);
            }
            let head = DeltaHead {
                revision: rev,
                prev_revision: std::mem::replace(&mut svc.revision, rev),
                digest: svc.digest,
                exists: true,
            };
            let seq = self.log.append(
                svc.key.clone(),
                svc.log_last,
                head,
                std::iter::once(change).chain(rest),
            );
            svc.log_last = Some(seq);
            services.push((*svc.key).clone());
        }
        drop(changes);
        for (key, prev_revision, last) in batch.deleted.drain(..) {
            let head = DeltaHead {
                revision: rev,
                prev_revision,
                digest: Digest::EMPTY,
                exists: false,
            };
            let seq = self.log.append(key.clone(), last, head, None);
            services.push((*key).clone());
            self.log.park((*key).clone(), seq);
        }
        services.sort();
        self.batch = batch;
        Applied {
            revision: Some(rev),
            effect,
            services,
        }
    }

    // ----- queries -----

    /// The revision of the last committed change.
    pub fn revision(&self) -> Revision {
        self.revision
    }

    /// The catalog's identity; `None` until its group's first leader named
    /// it (`Command::Identify`).
    pub fn identity(&self) -> Option<CatalogId> {
        self.identity
    }

    /// The parameters this catalog runs with.
    pub fn params(&self) -> &CatalogParams {
        &self.params
    }

    /// The lease table (read).
    pub fn leases(&self) -> &LeaseTable {
        &self.leases
    }

    /// Every known service, in key order.
    pub fn services(&self) -> Vec<ServiceKey> {
        let mut keys: Vec<ServiceKey> = self.service_index.keys().cloned().collect();
        keys.sort();
        keys
    }

    /// A summary of one service, if it is known.
    pub fn service(&self, key: &ServiceKey) -> Option<ServiceInfo> {
        self.service_state(key).map(|s| ServiceInfo {
            revision: s.revision,
            digest: s.digest,
            records: s.members.len(),
            ready: s.ready,
        })
    }

    /// A service's records, sorted by instance id.
    pub fn records(&self, key: &ServiceKey) -> Option<Vec<Arc<EndpointRecord>>> {
        self.service_state(key).map(|s| self.sorted_records(s))
    }

    /// The live record of an instance.
    pub fn instance(&self, id: &InstanceId) -> Option<Arc<EndpointRecord>> {
        Some(self.record(*self.instances.get(id)?))
    }

    /// The state of an instance's live record: `instance(id)`'s state,
    /// without building the record.
    pub fn instance_state(&self, id: &InstanceId) -> Option<State> {
        Some(self.slot(*self.instances.get(id)?).live.state)
    }

    /// Every record on `node`, with its service, sorted by instance id.
    pub fn instances_on(&self, node: &NodeId) -> Vec<(ServiceKey, Arc<EndpointRecord>)> {
        self.node_records(node)
            .into_iter()
            .map(|s| {
                let key = key_at(&self.services, self.slot(s).service).clone();
                (key, self.record(s))
            })
            .collect()
    }

    /// The service an instance is registered in.
    pub fn service_of(&self, id: &InstanceId) -> Option<&ServiceKey> {
        let s = *self.instances.get(id)?;
        Some(key_at(&self.services, self.slot(s).service))
    }

    /// A full snapshot of one service.
    pub fn service_snapshot(&self, key: &ServiceKey) -> Option<ServiceSnapshot> {
        let svc = self.service_state(key)?;
        Some(ServiceSnapshot {
            shard: self.params.shard,
            service: key.clone(),
            revision: svc.revision,
            digest: svc.digest,
            records: self.sorted_records(svc),
        })
    }

    /// What a subscriber holding revision `after` of `key` needs (R6).
    pub fn changes_since(&self, key: &ServiceKey, after: Revision) -> SinceAnswer {
        if after > self.revision {
            return SinceAnswer::Ahead {
                current: self.revision,
            };
        }
        let Some(svc) = self.service_state(key) else {
            return SinceAnswer::Unknown;
        };
        if svc.revision <= after {
            return SinceAnswer::UpToDate;
        }
        match self.log.since(svc.log_last, after) {
            LogAnswer::Deltas(d) if !d.is_empty() => SinceAnswer::Deltas(d),
            _ => SinceAnswer::SnapshotNeeded,
        }
    }

    /// The revision of the last change to a policy or a writer epoch (the
    /// snapshot's revision after an import).
    pub fn policy_revision(&self) -> Revision {
        self.policy_revision
    }

    /// Per service, in key order: the revision of its last change, its
    /// READY count and the summed weight of its READY records. What the
    /// region bridge reports to other regions (R9); nothing per instance.
    pub fn ready_summaries(&self) -> Vec<ReadySummary> {
        let mut rows: Vec<ReadySummary> = self
            .services
            .iter()
            .flatten()
            .map(|svc| ReadySummary {
                service: (*svc.key).clone(),
                revision: svc.revision,
                ready: svc.ready,
                ready_weight: svc
                    .members
                    .iter()
                    .map(|s| self.slot(*s))
                    .filter(|s| s.live.state.is_routable())
                    .map(|s| u64::from(s.fixed.weight.get()))
                    .sum(),
            })
            .collect();
        rows.sort_by(|a, b| a.service.cmp(&b.service));
        rows
    }

    /// The delta log (read).
    pub fn delta_log(&self) -> &DeltaLog {
        &self.log
    }
}

/// A copy of `live` as changed by `env` under `rev`: who changed it, when,
/// and the revision that committed it. Callers then set what changed.
fn restamp(live: &Live, env: &Envelope, rev: Revision) -> Live {
    Live {
        origin: env.actor.clone(),
        revision: rev,
        changed_at_ms: env.at_ms,
        ..live.clone()
    }
}

/// Puts `value` in a free place of `arena` (one `free` lists) or a new one
/// at its end; answers its index.
fn place<T>(arena: &mut Vec<Option<T>>, free: &mut Vec<u32>, value: T) -> u32 {
    match free.pop() {
        Some(ix) => {
            arena[ix as usize] = Some(value);
            ix
        }
        None => {
            arena.push(Some(value));
            (arena.len() - 1) as u32
        }
    }
}

/// The key of the service at index `ix`.
fn key_at(services: &[Option<ServiceState>], ix: u32) -> &ServiceKey {
    &services[ix as usize]
        .as_ref()
        .expect("an indexed service exists")
        .key
}

/// Moves a record's hash and READY count in its service's digest.
fn swap_hash(svc: &mut ServiceState, (old, was): (u128, State), (new, is): (u128, State)) {
    svc.digest.remove(old);
    svc.digest.add(new);
    svc.ready = svc.ready + usize::from(is.is_routable()) - usize::from(was.is_routable());
}

/// Cuts a reason we composed to the 256 bytes a `Reason` holds.
fn bounded_reason(text: &str) -> Reason {
    let mut end = text.len().min(256);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Reason::new(&text[..end]).expect("composed from validated names")
}

#[cfg(test)]
mod tests;
