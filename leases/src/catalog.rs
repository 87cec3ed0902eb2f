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

mod writers;

/// Why a command was rejected. A rejected command changed nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The node holds no lease.
    #[error("node {node} holds no lease; the agent must (re)connect and be granted one first")]
    NoLease {
        /// The node.
        node: NodeId,
    },
    /// The lease belongs to another agent run.
    #[error("node {node}'s lease belongs to agent epoch {current}, not {given}: that agent run was replaced or the report is stale")]
    OtherEpoch {
        /// The node.
        node: NodeId,
        /// The epoch holding the lease.
        current: AgentEpoch,
        /// The epoch in the command.
        given: AgentEpoch,
    },
    /// A grant from an agent run older than the one holding the lease.
    #[error(
        "node {node} already runs agent epoch {current}; a grant for older epoch {given} is stale"
    )]
    StaleEpoch {
        /// The node.
        node: NodeId,
        /// The epoch holding the lease.
        current: AgentEpoch,
        /// The epoch in the command.
        given: AgentEpoch,
    },
    /// The node's lease expiry is held by the mass-expiry guard.
    #[error("node {node}'s lease is held by the mass-expiry guard; re-grant it (the session is back) before registering")]
    LeaseHeld {
        /// The node.
        node: NodeId,
    },
    /// A node may not change zone within one agent run.
    #[error("node {node} is in zone {current} for agent epoch {epoch}; moving it to {given} needs an agent restart")]
    ZoneChanged {
        /// The node.
        node: NodeId,
        /// The agent run.
        epoch: AgentEpoch,
        /// Its zone.
        current: Label,
        /// The zone asked for.
        given: Label,
    },
    /// A registration names another zone than its node's.
    #[error("instance {instance_id} says zone {given} but its node {node} is in zone {node_zone}")]
    ZoneMismatch {
        /// The instance.
        instance_id: InstanceId,
        /// Its node.
        node: NodeId,
        /// The node's zone.
        node_zone: Label,
        /// The zone given.
        given: Label,
    },
    /// A lease TTL outside the accepted range.
    #[error("lease ttl_ms = {ttl_ms} is out of range: use {min} to {max}", min = LEASE_TTL_RANGE_MS.start(), max = LEASE_TTL_RANGE_MS.end())]
    BadTtl {
        /// The TTL asked for.
        ttl_ms: u64,
    },
    /// No live record has this instance id.
    #[error("instance {instance_id} is not registered")]
    UnknownInstance {
        /// The instance.
        instance_id: InstanceId,
    },
    /// The call names another generation than the live one.
    #[error("instance {instance_id} is at generation {current}, not {given}: the call is from a replaced registration and changes nothing")]
    StaleGeneration {
        /// The instance.
        instance_id: InstanceId,
        /// The generation in the call.
        given: Generation,
        /// The live generation.
        current: Generation,
    },
    /// The state machine does not allow this move.
    #[error("instance {instance_id} cannot go from {from} to {to}{hint}", hint = transition_hint(*.from, *.to))]
    IllegalTransition {
        /// The instance.
        instance_id: InstanceId,
        /// Its state.
        from: State,
        /// The state asked for.
        to: State,
    },
    /// A registration asked for an initial state other than STARTING/READY.
    #[error("a registration starts in STARTING or READY, not {state}")]
    BadInitialState {
        /// The state asked for.
        state: State,
    },
    /// A record may become READY only under a live lease.
    #[error("instance {instance_id} cannot become READY: node {node} no longer holds the lease it was registered under; register it again")]
    NotCovered {
        /// The instance.
        instance_id: InstanceId,
        /// Its node.
        node: NodeId,
    },
    /// A label key outside the predefined dimensions.
    #[error("label key {key} is not one of the predefined dimensions ({allowed})")]
    LabelNotAllowed {
        /// The key.
        key: Label,
        /// The allowed keys, comma-separated.
        allowed: String,
    },
    /// Too many labels.
    #[error("{count} labels given; at most {max} are allowed")]
    TooManyLabels {
        /// How many were given.
        count: usize,
        /// The bound.
        max: usize,
    },
    /// The same label key twice.
    #[error("label key {key} appears twice")]
    DuplicateLabel {
        /// The key.
        key: Label,
    },
    /// The service does not exist.
    #[error("service {service} does not exist")]
    UnknownService {
        /// The service.
        service: ServiceKey,
    },
    /// Only an empty service can be deleted.
    #[error("service {service} still has {records} records; deregister them before deleting it")]
    ServiceNotEmpty {
        /// The service.
        service: ServiceKey,
        /// How many records it has.
        records: usize,
    },
    /// A policy change outside the policy's home region: only the home
    /// region's arbiter holds it, so two regions never hold conflicting
    /// versions.
    #[error("the policy of {service} has home region {home}; only region {home}'s arbiter accepts changes to it, and this arbiter serves region {here}")]
    NotHomeRegion {
        /// The service.
        service: PolicyKey,
        /// The policy's home region.
        home: Label,
        /// This catalog's region.
        here: Label,
    },
    /// A bridge tried to replicate a policy homed in this very region: only
    /// this region's operators change it, through `SetPolicy`.
    #[error("the policy of {service} has its home in this region ({here}); a bridge replicates only other regions' policies")]
    HomeHere {
        /// The service.
        service: PolicyKey,
        /// This catalog's region.
        here: Label,
    },
    /// A replicated policy for a service that already holds a policy of
    /// another home: two regions claim to be its home. The first one held
    /// stays until its home deletes it.
    #[error("service {service} holds the policy of home region {held}; the one from {given} is refused until region {held} deletes its own (a service has one home)")]
    HomeConflict {
        /// The service.
        service: PolicyKey,
        /// The home region of the policy held.
        held: Label,
        /// The home region of the policy refused.
        given: Label,
    },
    /// A writer transfer refused (`writer::transfer`).
    #[error(transparent)]
    Transfer(#[from] TransferRefusal),
    /// No policy is set for the service.
    #[error("service {service} has no policy in region {region}")]
    UnknownPolicy {
        /// The service.
        service: PolicyKey,
        /// This catalog's region.
        region: Label,
    },
}

fn transition_hint(from: State, to: State) -> &'static str {
    match (from, to) {
        (State::Draining, _) => " (a drained instance leaves by deregistration)",
        (State::Expired, _) => " (an expired instance must register again)",
        (_, State::Expired) => " (only a lease expiry makes records EXPIRED)",
        (_, State::Starting) => " (STARTING is only the first state)",
        _ => "",
    }
}

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

    // ----- service policies -----

    fn set_policy(
        &mut self,
        env: &Envelope,
        rev: Revision,
        policy: &Policy,
    ) -> Result<Effect, Rejection> {
        let key = policy.key();
        let here = &self.params.region;
        if policy.home_region() != here {
            return Err(Rejection::NotHomeRegion {
                service: key.clone(),
                home: policy.home_region().clone(),
                here: here.clone(),
            });
        }
        match self.home_policy(key) {
            Ok(stored) if stored.policy == *policy => return Ok(Effect::Unchanged),
            Ok(_) | Err(Rejection::UnknownPolicy { .. }) => {}
            Err(other) => return Err(other),
        }
        self.policies.insert(
            key.clone(),
            StoredPolicy {
                policy: policy.clone(),
                revision: rev,
                set_at_ms: env.at_ms,
                set_by: env.actor.clone(),
            },
        );
        Ok(Effect::PolicyChanged)
    }

    /// Stores another region's policy as its home committed it; never goes
    /// back to an older home revision.
    fn replicate_policy(
        &mut self,
        env: &Envelope,
        rev: Revision,
        remote: &RemotePolicy,
    ) -> Result<Effect, Rejection> {
        let key = remote.policy.key();
        let home = remote.policy.home_region();
        let here = &self.params.region;
        if home == here {
            return Err(Rejection::HomeHere {
                service: key.clone(),
                here: here.clone(),
            });
        }
        let conflict = |held: &Label| Rejection::HomeConflict {
            service: key.clone(),
            held: held.clone(),
            given: home.clone(),
        };
        if self.policies.contains_key(key) {
            return Err(conflict(here));
        }
        if let Some(held) = self.replicated.get(key) {
            if held.remote.policy.home_region() != home {
                return Err(conflict(held.remote.policy.home_region()));
            }
            if held.remote.home_revision >= remote.home_revision {
                return Ok(Effect::Unchanged);
            }
        }
        self.replicated.insert(
            key.clone(),
            ReplicatedPolicy {
                remote: remote.clone(),
                revision: rev,
                set_at_ms: env.at_ms,
                set_by: env.actor.clone(),
            },
        );
        Ok(Effect::PolicyChanged)
    }

    /// The policy of `key`, which this region must be the home of.
    fn home_policy(&self, key: &PolicyKey) -> Result<&StoredPolicy, Rejection> {
        let here = &self.params.region;
        if let Some(held) = self.replicated.get(key) {
            return Err(Rejection::NotHomeRegion {
                service: key.clone(),
                home: held.remote.policy.home_region().clone(),
                here: here.clone(),
            });
        }
        let stored = self
            .policies
            .get(key)
            .ok_or_else(|| Rejection::UnknownPolicy {
                service: key.clone(),
                region: here.clone(),
            })?;
        if stored.policy.home_region() != here {
            return Err(Rejection::NotHomeRegion {
                service: key.clone(),
                home: stored.policy.home_region().clone(),
                here: here.clone(),
            });
        }
        Ok(stored)
    }

    // ----- leases -----

    #[allow(clippy::too_many_arguments)]
    fn grant(
        &mut self,
        batch: &mut Batch,
        env: &Envelope,
        rev: Revision,
        node: &NodeId,
        epoch: AgentEpoch,
        zone: &Label,
        ttl_ms: u64,
    ) -> Result<Effect, Rejection> {
        if !LEASE_TTL_RANGE_MS.contains(&ttl_ms) {
            return Err(Rejection::BadTtl { ttl_ms });
        }
        if let Some(current) = self.leases.get(node) {
            if epoch < current.epoch {
                return Err(Rejection::StaleEpoch {
                    node: node.clone(),
                    current: current.epoch,
                    given: epoch,
                });
            }
            if epoch == current.epoch {
                if &current.zone != zone {
                    return Err(Rejection::ZoneChanged {
                        node: node.clone(),
                        epoch,
                        current: current.zone.clone(),
                        given: zone.clone(),
                    });
                }
                let (held, same_ttl, id) = (
                    current.held_since_ms.is_some(),
                    current.ttl_ms == ttl_ms,
                    current.id,
                );
                if !held && same_ttl {
                    // The leader renews its deadline when this commits.
                    return Ok(Effect::Unchanged);
                }
                let lease = self.leases.get_mut(node).expect("the lease was just found");
                lease.held_since_ms = None;
                lease.ttl_ms = ttl_ms;
                lease.granted_at_ms = env.at_ms;
                return Ok(if held {
                    Effect::LeaseReinstated
                } else {
                    Effect::LeaseGranted {
                        lease: id,
                        moved: 0,
                    }
                });
            }
            self.leases.remove(node);
        }
        let id = LeaseId(rev.0);
        self.leases.insert(Lease {
            id,
            node: node.clone(),
            epoch,
            zone: zone.clone(),
            ttl_ms,
            granted_at_ms: env.at_ms,
            held_since_ms: None,
        });
        // The node's records that are not expired move under the new grant:
        // a restarted agent reconciles them by instance id and generation,
        // keeping their generations (R7).
        let mut moved = 0;
        for s in self.node_records(node) {
            let slot = self.slot(s);
            if slot.live.state == State::Expired || slot.fixed.lease == id {
                continue;
            }
            let fixed = slot.fixed.moved(epoch, id, zone.clone());
            let live = restamp(&slot.live, env, rev);
            self.replace(batch, s, fixed, live);
            moved += 1;
        }
        Ok(Effect::LeaseGranted { lease: id, moved })
    }

    fn lease_of(&self, node: &NodeId, epoch: AgentEpoch) -> Result<Lease, Rejection> {
        let lease = self
            .leases
            .get(node)
            .ok_or_else(|| Rejection::NoLease { node: node.clone() })?;
        if lease.epoch != epoch {
            return Err(Rejection::OtherEpoch {
                node: node.clone(),
                current: lease.epoch,
                given: epoch,
            });
        }
        Ok(lease.clone())
    }

    fn expire(
        &mut self,
        batch: &mut Batch,
        env: &Envelope,
        rev: Revision,
        node: &NodeId,
        epoch: AgentEpoch,
        silent_in_zone: u32,
    ) -> Result<Effect, Rejection> {
        let lease = self.lease_of(node, epoch)?;
        let reason = match lease.held_since_ms {
            Some(since) if env.at_ms.saturating_sub(since) < self.params.guard.max_hold_ms => {
                return Ok(Effect::Unchanged)
            }
            Some(_) => "lease expired after the mass-expiry guard's maximum hold",
            None => {
                let live = self.leases.in_zone(&lease.zone);
                match self.guard.decide(
                    &lease.zone,
                    live,
                    silent_in_zone,
                    env.at_ms,
                    &self.params.guard,
                ) {
                    GuardDecision::Hold => {
                        self.leases
                            .get_mut(node)
                            .expect("the lease was just found")
                            .held_since_ms = Some(env.at_ms);
                        return Ok(Effect::ExpiryHeld);
                    }
                    GuardDecision::Expire => "lease expired",
                }
            }
        };
        self.guard.record(&lease.zone, env.at_ms);
        let marked = self.end_lease(
            batch,
            env,
            rev,
            lease,
            State::Expired,
            Reason::fixed(reason),
        );
        Ok(Effect::LeaseEnded { marked })
    }

    /// Removes a lease and moves the records it covered to `to`: EXPIRED for
    /// revocation and expiry (everything), UNHEALTHY for a down verdict
    /// (STARTING and READY records; DRAINING ones are already leaving).
    fn end_lease(
        &mut self,
        batch: &mut Batch,
        env: &Envelope,
        rev: Revision,
        lease: Lease,
        to: State,
        reason: Reason,
    ) -> usize {
        self.leases.remove(&lease.node);
        let mut marked = 0;
        for s in self.node_records(&lease.node) {
            let slot = self.slot(s);
            let state = slot.live.state;
            let affected = slot.fixed.lease == lease.id
                && match to {
                    State::Expired => state != State::Expired,
                    _ => matches!(state, State::Starting | State::Ready),
                };
            if !affected {
                continue;
            }
            let mut live = restamp(&slot.live, env, rev);
            live.state = to;
            live.reason = reason.clone();
            self.update(batch, s, live);
            marked += 1;
        }
        marked
    }

    // ----- instances -----

    fn register(
        &mut self,
        batch: &mut Batch,
        env: &Envelope,
        rev: Revision,
        reg: &Registration,
    ) -> Result<Effect, Rejection> {
        let lease = self.lease_of(&reg.node, reg.epoch)?;
        if lease.held_since_ms.is_some() {
            return Err(Rejection::LeaseHeld {
                node: reg.node.clone(),
            });
        }
        if let Some(given) = &reg.zone {
            if given != &lease.zone {
                return Err(Rejection::ZoneMismatch {
                    instance_id: reg.instance_id.clone(),
                    node: reg.node.clone(),
                    node_zone: lease.zone.clone(),
                    given: given.clone(),
                });
            }
        }
        if !matches!(reg.initial, State::Starting | State::Ready) {
            return Err(Rejection::BadInitialState { state: reg.initial });
        }
        let labels = self.check_labels(&reg.labels)?;
        let generation = self
            .generations
            .get(&reg.instance_id)
            .map_or(Generation(1), |g| g.generation.next());
        let replaced = match self.instances.get(&reg.instance_id) {
            Some(&old) => {
                let slot = self.slot(old);
                let replaced = Replaced {
                    node: slot.fixed.node_id.clone(),
                    generation: slot.fixed.generation,
                    state: slot.live.state,
                };
                self.remove_record(batch, old, env.at_ms);
                Some(replaced)
            }
            None => None,
        };
        let record = EndpointRecord {
            instance_id: reg.instance_id.clone(),
            generation,
            // The lease's own name: every record of a node shares it.
            node_id: lease.node.clone(),
            epoch: reg.epoch,
            lease: lease.id,
            address: reg.address,
            port: reg.port,
            region: self.params.region.clone(),
            zone: lease.zone.clone(),
            version: reg.version.clone(),
            weight: reg.weight,
            labels,
            state: reg.initial,
            reason: Reason::fixed("registered"),
            origin: env.actor.clone(),
            liveness: Liveness::Unknown,
            revision: rev,
            changed_at_ms: env.at_ms,
        };
        let (fixed, live) = Fixed::split(record);
        self.insert(batch, &reg.service, fixed, live);
        self.generations.insert(
            reg.instance_id.clone(),
            GenerationMemory {
                generation,
                released_at_ms: None,
            },
        );
        Ok(Effect::Registered {
            generation,
            state: reg.initial,
            replaced,
        })
    }

    fn check_labels(&self, labels: &Labels) -> Result<Labels, Rejection> {
        if labels.len() > self.params.max_labels {
            return Err(Rejection::TooManyLabels {
                count: labels.len(),
                max: self.params.max_labels,
            });
        }
        let mut sorted = labels.clone();
        sorted.sort();
        for pair in sorted.windows(2) {
            if pair[0].0 == pair[1].0 {
                return Err(Rejection::DuplicateLabel {
                    key: pair[0].0.clone(),
                });
            }
        }
        if let Some((key, _)) = sorted
            .iter()
            .find(|(k, _)| !self.params.allowed_label_keys.contains(k))
        {
            let allowed = self
                .params
                .allowed_label_keys
                .iter()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            return Err(Rejection::LabelNotAllowed {
                key: key.clone(),
                allowed,
            });
        }
        Ok(sorted)
    }

    #[allow(clippy::too_many_arguments)]
    fn transition(
        &mut self,
        batch: &mut Batch,
        env: &Envelope,
        rev: Revision,
        id: &InstanceId,
        generation: Generation,
        to: State,
        reason: &Reason,
    ) -> Result<Effect, Rejection> {
        let s = self.live(id, generation)?;
        let slot = self.slot(s);
        let from = slot.live.state;
        if from == to {
            return Ok(Effect::Unchanged);
        }
        if !from.may_become(to) {
            return Err(Rejection::IllegalTransition {
                instance_id: id.clone(),
                from,
                to,
            });
        }
        if to == State::Ready && !self.leases.is_live(&slot.fixed.node_id, slot.fixed.lease) {
            return Err(Rejection::NotCovered {
                instance_id: id.clone(),
                node: slot.fixed.node_id.clone(),
            });
        }
        let live = Live {
            state: to,
            reason: reason.clone(),
            origin: env.actor.clone(),
            liveness: slot.live.liveness,
            revision: rev,
            changed_at_ms: env.at_ms,
        };
        self.update(batch, s, live);
        Ok(Effect::Changed)
    }

    fn set_liveness(
        &mut self,
        batch: &mut Batch,
        env: &Envelope,
        rev: Revision,
        id: &InstanceId,
        generation: Generation,
        liveness: Liveness,
    ) -> Result<Effect, Rejection> {
        let s = self.live(id, generation)?;
        let slot = self.slot(s);
        if slot.live.liveness == liveness {
            return Ok(Effect::Unchanged);
        }
        let mut live = restamp(&slot.live, env, rev);
        live.liveness = liveness;
        self.update(batch, s, live);
        Ok(Effect::Changed)
    }

    /// The slot of the live record of `id`, if `generation` is its
    /// generation.
    fn live(&self, id: &InstanceId, generation: Generation) -> Result<u32, Rejection> {
        let s = *self
            .instances
            .get(id)
            .ok_or_else(|| Rejection::UnknownInstance {
                instance_id: id.clone(),
            })?;
        let current = self.slot(s).fixed.generation;
        if current != generation {
            return Err(Rejection::StaleGeneration {
                instance_id: id.clone(),
                given: generation,
                current,
            });
        }
        Ok(s)
    }

    fn purge(&mut self, batch: &mut Batch, at_ms: u64) -> Effect {
        let retention = self.params.expired_retention_ms;
        let mut victims: Vec<(&ServiceKey, &InstanceId, u32)> = Vec::new();
        for (s, slot) in self.slots.iter().enumerate() {
            let Some(slot) = slot else { continue };
            let f = &slot.fixed;
            let covered = self.leases.is_live(&f.node_id, f.lease);
            if !covered && at_ms >= slot.live.changed_at_ms.saturating_add(retention) {
                let key = key_at(&self.services, slot.service);
                victims.push((key, &f.instance_id, s as u32));
            }
        }
        victims.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        let victims: Vec<u32> = victims.into_iter().map(|(_, _, s)| s).collect();
        for &s in &victims {
            self.remove_record(batch, s, at_ms);
        }
        let keep = self.params.service_retention_ms;
        let before = self.generations.len();
        self.generations.retain(|_, g| {
            g.released_at_ms
                .is_none_or(|t| at_ms < t.saturating_add(keep))
        });
        let forgotten = before - self.generations.len();
        let mut dead: Vec<ServiceKey> = self
            .services
            .iter()
            .flatten()
            .filter(|s| {
                s.members.is_empty()
                    && s.emptied_at_ms
                        .is_some_and(|t| at_ms >= t.saturating_add(keep))
            })
            .map(|s| (*s.key).clone())
            .collect();
        dead.sort();
        for key in &dead {
            self.delete_service(batch, key);
        }
        if victims.is_empty() && forgotten == 0 && dead.is_empty() {
            Effect::Unchanged
        } else {
            Effect::Purged {
                records: victims.len(),
                generations: forgotten,
                services: dead.len(),
            }
        }
    }

    // ----- record storage: the only code that touches the indexes -----

    fn slot(&self, s: u32) -> &Slot {
        self.slots[s as usize]
            .as_ref()
            .expect("an indexed slot holds a record")
    }

    fn service_state(&self, key: &ServiceKey) -> Option<&ServiceState> {
        let ix = *self.service_index.get(key)?;
        self.services[ix as usize].as_ref()
    }

    /// The slots of every record on `node`, in instance id order.
    fn node_records(&self, node: &NodeId) -> Vec<u32> {
        let Some(ids) = self.nodes.get(node) else {
            return Vec::new();
        };
        ids.iter().map(|id| self.instances[id]).collect()
    }

    /// The index of service `key`, created (empty, revision 0) if unknown.
    fn service_ix(&mut self, key: &ServiceKey) -> u32 {
        if let Some(&ix) = self.service_index.get(key) {
            return ix;
        }
        let state = ServiceState {
            key: Arc::new(key.clone()),
            members: Vec::new(),
            revision: Revision(0),
            digest: Digest::EMPTY,
            ready: 0,
            emptied_at_ms: None,
            log_last: self.log.unpark(key),
        };
        let ix = place(&mut self.services, &mut self.free_services, state);
        self.service_index.insert(key.clone(), ix);
        ix
    }

    /// Removes an empty service; its deletion is committed as a delta.
    fn delete_service(&mut self, batch: &mut Batch, key: &ServiceKey) {
        let ix = self.service_index.remove(key).expect("the service exists");
        let svc = self.services[ix as usize]
            .take()
            .expect("an indexed service exists");
        self.free_services.push(ix);
        batch.deleted.push((svc.key, svc.revision, svc.log_last));
    }

    /// Adds a record new to the catalog (its instance id holds no record).
    fn insert(&mut self, batch: &mut Batch, key: &ServiceKey, fixed: Fixed, live: Live) {
        let ix = self.service_ix(key);
        let hash = fixed.hash(&live, &mut self.scratch);
        let fixed = Arc::new(fixed);
        let svc = self.services[ix as usize]
            .as_mut()
            .expect("an indexed service exists");
        svc.digest.add(hash);
        if live.state.is_routable() {
            svc.ready += 1;
        }
        svc.emptied_at_ms = None;
        let slot = Slot {
            fixed: fixed.clone(),
            live: live.clone(),
            hash,
            service: ix,
            member: svc.members.len() as u32,
        };
        let s = place(&mut self.slots, &mut self.free_slots, slot);
        svc.members.push(s);
        self.nodes
            .entry(fixed.node_id.clone())
            .or_default()
            .insert(fixed.instance_id.clone());
        self.instances.insert(fixed.instance_id.clone(), s);
        batch.changes.push((ix, LogChange::Upsert(fixed, live)));
    }

    /// Replaces the record in slot `s` whole (same instance, service and
    /// node: a grant moved it under a new lease).
    fn replace(&mut self, batch: &mut Batch, s: u32, fixed: Fixed, live: Live) {
        let slot = self.slots[s as usize]
            .as_mut()
            .expect("an indexed slot holds a record");
        slot.fixed = Arc::new(fixed);
        let hash = slot.fixed.hash(&live, &mut self.scratch);
        let svc = self.services[slot.service as usize]
            .as_mut()
            .expect("an indexed service exists");
        swap_hash(svc, (slot.hash, slot.live.state), (hash, live.state));
        slot.hash = hash;
        slot.live = live.clone();
        batch
            .changes
            .push((slot.service, LogChange::Upsert(slot.fixed.clone(), live)));
    }

    /// Changes the live part of the record in slot `s`, in place.
    fn update(&mut self, batch: &mut Batch, s: u32, live: Live) {
        let slot = self.slots[s as usize]
            .as_mut()
            .expect("an indexed slot holds a record");
        let hash = slot.fixed.hash(&live, &mut self.scratch);
        let svc = self.services[slot.service as usize]
            .as_mut()
            .expect("an indexed service exists");
        swap_hash(svc, (slot.hash, slot.live.state), (hash, live.state));
        slot.hash = hash;
        batch.changes.push((
            slot.service,
            LogChange::Upsert(slot.fixed.clone(), live.clone()),
        ));
        slot.live = live;
    }

    fn remove_record(&mut self, batch: &mut Batch, s: u32, at_ms: u64) {
        let slot = self.slots[s as usize]
            .take()
            .expect("an indexed slot holds a record");
        self.free_slots.push(s);
        let svc = self.services[slot.service as usize]
            .as_mut()
            .expect("an indexed service exists");
        svc.digest.remove(slot.hash);
        if slot.live.state.is_routable() {
            svc.ready -= 1;
        }
        let member = slot.member as usize;
        svc.members.swap_remove(member);
        if let Some(&moved) = svc.members.get(member) {
            self.slots[moved as usize]
                .as_mut()
                .expect("a member slot holds a record")
                .member = member as u32;
        }
        if svc.members.is_empty() {
            svc.emptied_at_ms = Some(at_ms);
        }
        let id = &slot.fixed.instance_id;
        self.unindex_node(&slot.fixed.node_id, id);
        self.instances.remove(id);
        if let Some(g) = self.generations.get_mut(id) {
            g.released_at_ms = Some(at_ms);
        }
        batch.changes.push((
            slot.service,
            LogChange::Remove(id.clone(), slot.fixed.generation),
        ));
    }

    fn unindex_node(&mut self, node: &NodeId, id: &InstanceId) {
        if let Some(ids) = self.nodes.get_mut(node) {
            ids.remove(id);
            if ids.is_empty() {
                self.nodes.remove(node);
            }
        }
    }

    /// The record in slot `s`, whole.
    fn record(&self, s: u32) -> Arc<EndpointRecord> {
        let slot = self.slot(s);
        materialize(&slot.fixed, &slot.live)
    }

    /// A service's records, whole, sorted by instance id.
    fn sorted_records(&self, svc: &ServiceState) -> Vec<Arc<EndpointRecord>> {
        let mut slots = svc.members.clone();
        slots.sort_by(|a, b| {
            self.slot(*a)
                .fixed
                .instance_id
                .cmp(&self.slot(*b).fixed.instance_id)
        });
        slots.into_iter().map(|s| self.record(s)).collect()
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

    /// The policy of one service, if one is set.
    pub fn policy(&self, key: &PolicyKey) -> Option<&StoredPolicy> {
        self.policies.get(key)
    }

    /// Every service policy homed in this region, in key order.
    pub fn policies(&self) -> impl Iterator<Item = &StoredPolicy> {
        self.policies.values()
    }

    /// The replicated policy (homed in another region) of one service, if
    /// one is held.
    pub fn replicated_policy(&self, key: &PolicyKey) -> Option<&ReplicatedPolicy> {
        self.replicated.get(key)
    }

    /// Every replicated policy (homed in other regions), in key order.
    pub fn replicated_policies(&self) -> impl Iterator<Item = &ReplicatedPolicy> {
        self.replicated.values()
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

    /// Exports the whole shard, every collection sorted, so two replicas with
    /// the same history export byte-identical snapshots.
    pub fn export(&self) -> CatalogSnapshot {
        let mut services: Vec<ServiceEntry> = self
            .services
            .iter()
            .flatten()
            .map(|s| ServiceEntry {
                service: (*s.key).clone(),
                revision: s.revision,
                emptied_at_ms: s.emptied_at_ms,
                digest: s.digest,
                records: self.sorted_records(s),
            })
            .collect();
        services.sort_by(|a, b| a.service.cmp(&b.service));
        let mut generations: Vec<(InstanceId, GenerationMemory)> = self
            .generations
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        generations.sort_by(|a, b| a.0.cmp(&b.0));
        CatalogSnapshot {
            shard: self.params.shard,
            region: self.params.region.clone(),
            revision: self.revision,
            services,
            leases: self.leases.sorted().into_iter().cloned().collect(),
            generations,
            guard: self.guard.export(),
            policies: self.policies.values().cloned().collect(),
            replicated_policies: self.replicated.values().cloned().collect(),
            writers: self.writers.values().cloned().collect(),
            identity: self.identity,
        }
    }

    /// Rebuilds a shard from a snapshot, checking it is consistent (digests,
    /// unique instance ids, revisions). The delta log starts empty at the
    /// snapshot's revision. Lease deadlines are the leader's memory, not
    /// the catalog's (`lease::Deadlines`).
    pub fn import(params: CatalogParams, snap: CatalogSnapshot) -> Result<Catalog, SnapshotError> {
        if snap.shard != params.shard {
            return Err(SnapshotError::Inconsistent(format!(
                "snapshot is of shard {} but this catalog is shard {}",
                snap.shard, params.shard
            )));
        }
        let mut cat = Catalog::new(params);
        cat.revision = snap.revision;
        cat.identity = snap.identity;
        cat.log = DeltaLog::new(snap.revision, cat.params.delta_log.clone());
        let mut batch = Batch::default();
        for entry in snap.services {
            if entry.revision > snap.revision {
                return Err(SnapshotError::Inconsistent(format!(
                    "service {} is at revision {} beyond the snapshot's {}",
                    entry.service, entry.revision, snap.revision
                )));
            }
            if cat.service_index.contains_key(&entry.service) {
                return Err(SnapshotError::Inconsistent(format!(
                    "service {} appears twice",
                    entry.service
                )));
            }
            let ix = cat.service_ix(&entry.service);
            for record in entry.records {
                let id = record.instance_id.clone();
                if cat.instances.contains_key(&id) {
                    return Err(SnapshotError::Inconsistent(format!(
                        "instance {id} appears twice"
                    )));
                }
                let (fixed, live) = Fixed::split(Arc::unwrap_or_clone(record));
                cat.insert(&mut batch, &entry.service, fixed, live);
            }
            batch.changes.clear();
            let svc = cat.services[ix as usize].as_mut().expect("just created");
            svc.revision = entry.revision;
            svc.emptied_at_ms = entry.emptied_at_ms;
            if svc.digest != entry.digest {
                return Err(SnapshotError::Inconsistent(format!(
                    "service {} digest {} does not match its records ({})",
                    entry.service, entry.digest, svc.digest
                )));
            }
        }
        for lease in snap.leases {
            if cat.leases.get(&lease.node).is_some() {
                return Err(SnapshotError::Inconsistent(format!(
                    "node {} holds two leases",
                    lease.node
                )));
            }
            cat.leases.insert(lease);
        }
        for (id, memory) in snap.generations {
            cat.generations.insert(id, memory);
        }
        for (id, s) in &cat.instances {
            let live = cat.slot(*s).fixed.generation;
            if cat.generations.get(id).is_none_or(|g| g.generation < live) {
                return Err(SnapshotError::Inconsistent(format!(
                    "instance {id} is at generation {live} but the generation memory is behind"
                )));
            }
        }
        cat.guard = ExpiryGuard::import(snap.guard);
        for stored in snap.policies {
            let key = stored.policy.key().clone();
            if stored.revision > snap.revision {
                return Err(SnapshotError::Inconsistent(format!(
                    "the policy of {key} is at revision {} beyond the snapshot's {}",
                    stored.revision, snap.revision
                )));
            }
            if stored.policy.home_region() != &cat.params.region {
                return Err(SnapshotError::Inconsistent(format!(
                    "the policy of {key} has home region {}, not this catalog's {}",
                    stored.policy.home_region(),
                    cat.params.region
                )));
            }
            if cat.policies.insert(key.clone(), stored).is_some() {
                return Err(SnapshotError::Inconsistent(format!(
                    "the policy of {key} appears twice"
                )));
            }
        }
        for held in snap.replicated_policies {
            let key = held.remote.policy.key().clone();
            if held.revision > snap.revision {
                return Err(SnapshotError::Inconsistent(format!(
                    "the replicated policy of {key} is at revision {} beyond the snapshot's {}",
                    held.revision, snap.revision
                )));
            }
            if held.remote.policy.home_region() == &cat.params.region {
                return Err(SnapshotError::Inconsistent(format!(
                    "the replicated policy of {key} has this catalog's own region {} as home",
                    cat.params.region
                )));
            }
            if cat.policies.contains_key(&key) || cat.replicated.insert(key.clone(), held).is_some()
            {
                return Err(SnapshotError::Inconsistent(format!(
                    "the policy of {key} appears twice"
                )));
            }
        }
        cat.import_writers(snap.writers)?;
        cat.policy_revision = snap.revision;
        Ok(cat)
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
