//! Why a command was rejected: every rule the catalog enforces, in words
//! an operator or agent can act on.

use super::*;

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
