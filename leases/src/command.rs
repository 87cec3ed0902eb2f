//! The replicated commands of the arbiter state machine (R2, R3, and the
//! service policies of R9).
//!
//! A command carries everything `apply` needs, including the time and any
//! observation only the leader can make (how many of a zone's sessions are
//! silent), so applying the same log gives the same state on every replica.
//! Lease renewals are deliberately absent: they stay in the leader's memory.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::endpoint::{Labels, Liveness, Principal, State, Weight};
use crate::ids::{AgentEpoch, CatalogId, Generation, Revision};
use crate::name::{InstanceId, Label, NodeId, Reason, ServiceKey, Version};
use crate::policy::{Policy, PolicyKey, RemotePolicy};
use crate::writer::{Transfer, WriterEpoch};

/// A command with the facts of its proposal: when and by whom.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub struct Envelope {
    /// The proposer's wall clock, in milliseconds since the Unix epoch. The
    /// only time `apply` ever sees.
    pub at_ms: u64,
    /// Who asked for the change (audit log, record origin).
    pub actor: Principal,
    /// What to change.
    pub command: Command,
}

/// Everything that can change the catalog.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub enum Command {
    /// Grant a node agent's lease, reinstate a held one (its session came
    /// back), or replace it after an agent restart (a newer epoch), which
    /// moves the node's live records to the new lease.
    GrantLease {
        /// The node.
        node: NodeId,
        /// The agent run asking.
        epoch: AgentEpoch,
        /// The node's zone (the mass-expiry guard counts per zone).
        zone: Label,
        /// Lease time to live in milliseconds.
        ttl_ms: u64,
    },
    /// The agent leaves on purpose: its remaining records expire now.
    RevokeLease {
        /// The node.
        node: NodeId,
        /// The agent run that holds the lease.
        epoch: AgentEpoch,
    },
    /// The leader saw the lease's deadline pass without renewal (or a held
    /// lease reach its maximum hold).
    ExpireLease {
        /// The node.
        node: NodeId,
        /// The agent run whose lease lapsed.
        epoch: AgentEpoch,
        /// The leader's count of this zone's nodes whose sessions are silent
        /// past the silence threshold, this one included: the guard counts
        /// the expiries that would follow before they happen.
        silent_in_zone: u32,
    },
    /// Register an instance; the state machine assigns its generation.
    Register(Registration),
    /// Move an instance to another state.
    Transition {
        /// The instance.
        instance_id: InstanceId,
        /// The generation the caller knows; any other is rejected as stale.
        generation: Generation,
        /// The new state.
        to: State,
        /// Why.
        reason: Reason,
    },
    /// Record a liveness verdict (never used to route).
    SetLiveness {
        /// The instance.
        instance_id: InstanceId,
        /// The generation the caller knows.
        generation: Generation,
        /// The verdict.
        liveness: Liveness,
    },
    /// Remove an instance's record.
    Deregister {
        /// The instance.
        instance_id: InstanceId,
        /// The generation the caller knows.
        generation: Generation,
    },
    /// Gossip declared a node down and the leader's own session with it has
    /// been silent long enough (the two signals of R4).
    NodeDown {
        /// The node declared down.
        node: NodeId,
        /// The agent run the reporters saw; a verdict about an older run
        /// changes nothing.
        epoch: AgentEpoch,
        /// The agents that reported it (at most 16 kept).
        reporters: Vec<NodeId>,
    },
    /// Remove records no lease covers any more once their retention passed,
    /// forget old generations, and drop services empty for their retention.
    Purge,
    /// An operator deletes an empty service so it becomes unknown.
    DeleteService {
        /// The service.
        service: ServiceKey,
    },
    /// An operator sets a service's policy (R9); only the arbiter of the
    /// policy's home region accepts it. Setting the policy it already has
    /// changes nothing. Boxed: a policy is far larger than any other
    /// command, and every queued command would pay for its size.
    SetPolicy(Box<Policy>),
    /// An operator deletes a service's policy (in its home region only).
    DeletePolicy {
        /// The service.
        service: PolicyKey,
    },
    /// The region bridge stores a policy whose home is another region, as
    /// that home committed it (R9). Refused for a policy homed here or a
    /// service holding a policy of another home; a version not newer than
    /// the one held changes nothing, so a late re-send never goes back.
    ReplicatePolicy(Box<RemotePolicy>),
    /// The region bridge removes another region's policy that its home
    /// deleted (`home_revision`: the home's revision when the deletion was
    /// seen). Changes nothing unless the policy held is from `home` and not
    /// newer.
    DropReplicatedPolicy {
        /// The service.
        service: PolicyKey,
        /// The home region that deleted it.
        home: Label,
        /// The home's revision at or after the deletion.
        home_revision: Revision,
    },
    /// The first leader of a new group names the catalog (`CatalogId`).
    /// Changes nothing once the catalog has an identity: the first one
    /// committed is the catalog's for good.
    Identify {
        /// The identity.
        catalog: CatalogId,
    },
    /// An operator moves a single-writer service's writes to another
    /// region (`rollcall policy transfer`): accepted by the owner region's
    /// arbiter, or by another region's when forced (`writer::transfer`).
    TransferWriter(Box<Transfer>),
    /// The region bridge stores a writer epoch another region committed;
    /// one not newer than the epoch held changes nothing, and the new
    /// owner stores a moving epoch settled (`writer::adopt`).
    ReplicateWriter(Box<WriterEpoch>),
}

/// The body of a registration.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub struct Registration {
    /// Stable id of the instance.
    pub instance_id: InstanceId,
    /// The service it serves.
    pub service: ServiceKey,
    /// The node it runs on.
    pub node: NodeId,
    /// The agent run registering it (must hold the node's lease).
    pub epoch: AgentEpoch,
    /// Address callers connect to.
    pub address: IpAddr,
    /// Port callers connect to.
    pub port: u16,
    /// Zone, if the caller states one; must match the node's zone.
    pub zone: Option<Label>,
    /// Software version.
    pub version: Version,
    /// Relative weight.
    pub weight: Weight,
    /// Labels (predefined keys only).
    pub labels: Labels,
    /// STARTING when it has checks to pass first, READY when it has none.
    pub initial: State,
}

/// The most reporters a down verdict keeps.
pub const MAX_REPORTERS: usize = 16;

impl Command {
    /// A short name for logs and the audit log.
    pub fn kind(&self) -> &'static str {
        match self {
            Command::GrantLease { .. } => "grant-lease",
            Command::RevokeLease { .. } => "revoke-lease",
            Command::ExpireLease { .. } => "expire-lease",
            Command::Register(_) => "register",
            Command::Transition { .. } => "transition",
            Command::SetLiveness { .. } => "set-liveness",
            Command::Deregister { .. } => "deregister",
            Command::NodeDown { .. } => "node-down",
            Command::Purge => "purge",
            Command::DeleteService { .. } => "delete-service",
            Command::SetPolicy(_) => "set-policy",
            Command::DeletePolicy { .. } => "delete-policy",
            Command::ReplicatePolicy(_) => "replicate-policy",
            Command::DropReplicatedPolicy { .. } => "drop-replicated-policy",
            Command::Identify { .. } => "identify",
            Command::TransferWriter(_) => "transfer-writer",
            Command::ReplicateWriter(_) => "replicate-writer",
        }
    }
}
