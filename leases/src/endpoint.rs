//! The endpoint record (R2): one registration of one instance, with its
//! state, why it is in that state, who put it there and the revision that
//! committed it. Only `READY` is routable.
//!
//! This module only describes records; the rules for changing them live in
//! `catalog.rs`.

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::ids::{AgentEpoch, Generation, LeaseId, Revision};
use crate::name::{InstanceId, Label, LabelValue, NodeId, PrincipalName, Reason, Version};

/// Lifecycle state of an endpoint record.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
pub enum State {
    /// Registered, startup not yet passed: no traffic.
    Starting,
    /// Gets new traffic. The only routable state.
    Ready,
    /// No new traffic; existing connections finish.
    Draining,
    /// Readiness failed, the process exited, or gossip and the arbiter agree
    /// its node is down.
    Unhealthy,
    /// Its node's lease was not renewed (or was revoked); purged after the
    /// retention period.
    Expired,
}

impl State {
    /// Whether proxies, DNS and the resolve API may choose this endpoint.
    pub fn is_routable(self) -> bool {
        self == State::Ready
    }

    /// The name used in APIs and logs (`READY`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            State::Starting => "STARTING",
            State::Ready => "READY",
            State::Draining => "DRAINING",
            State::Unhealthy => "UNHEALTHY",
            State::Expired => "EXPIRED",
        }
    }

    /// Whether an explicit transition may move a record from `self` to `to`.
    ///
    /// Expiry is not a transition (it comes with the lease), STARTING is only
    /// ever the first state, and DRAINING and EXPIRED are one-way: a drained
    /// instance leaves by deregistration, an expired one by re-registration.
    pub fn may_become(self, to: State) -> bool {
        use State::*;
        matches!(
            (self, to),
            (Starting, Ready | Unhealthy | Draining)
                | (Ready, Draining | Unhealthy)
                | (Unhealthy, Ready | Draining)
        )
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The liveness verdict, reported for supervisors and never used to route (R4).
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default, Serialize, Deserialize,
)]
pub enum Liveness {
    /// No liveness check configured, or none has completed yet.
    #[default]
    Unknown,
    /// The last liveness verdict passed.
    Passing,
    /// The liveness check failed its threshold: the supervisor should restart.
    Failing,
}

impl Liveness {
    /// The name used in APIs (`passing`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Liveness::Unknown => "unknown",
            Liveness::Passing => "passing",
            Liveness::Failing => "failing",
        }
    }
}

/// The role a certificate or token names (R10).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
pub enum Role {
    /// A node agent, acting for its own node.
    Agent,
    /// An orchestrator registering on behalf of workloads.
    Controller,
    /// A human operator.
    Operator,
    /// An arbiter replica itself (lease expiry, purges).
    Arbiter,
    /// A region bridge.
    Bridge,
}

impl Role {
    /// The name used in certificates and audit entries.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Controller => "controller",
            Role::Operator => "operator",
            Role::Arbiter => "arbiter",
            Role::Bridge => "bridge",
        }
    }
}

/// Who asked for a change: recorded as the origin of every transition and
/// in the audit log.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
pub struct Principal {
    /// What kind of identity it is.
    pub role: Role,
    /// Its name (node id for agents).
    pub name: PrincipalName,
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.role.as_str(), self.name)
    }
}

/// A record's labels: predefined keys only, sorted by key, bounded in count
/// (the bound is a catalog parameter, checked at registration).
pub type Labels = Vec<(Label, LabelValue)>;

/// Relative weight for load balancing, 1 to 10,000 (100 is "normal").
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct Weight(u32);

impl Weight {
    /// The weight an instance gets when none is given.
    pub const DEFAULT: Weight = Weight(100);
    /// The largest weight accepted.
    pub const MAX: u32 = 10_000;

    /// Validates a weight.
    pub fn new(value: u32) -> Result<Weight, String> {
        if (1..=Self::MAX).contains(&value) {
            Ok(Weight(value))
        } else {
            Err(format!(
                "weight {value} is out of range: use 1 to {}",
                Self::MAX
            ))
        }
    }

    /// The raw weight.
    pub fn get(self) -> u32 {
        self.0
    }
}

impl TryFrom<u32> for Weight {
    type Error = String;
    fn try_from(v: u32) -> Result<Self, String> {
        Weight::new(v)
    }
}

impl From<Weight> for u32 {
    fn from(w: Weight) -> u32 {
        w.0
    }
}

/// One registration of one instance, as the catalog holds and ships it.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct EndpointRecord {
    /// Stable id of the instance (process slot).
    pub instance_id: InstanceId,
    /// Which registration of that id this is.
    pub generation: Generation,
    /// The node whose agent registered it.
    pub node_id: NodeId,
    /// The run of that node's agent that holds it.
    pub epoch: AgentEpoch,
    /// The node lease that keeps it alive.
    pub lease: LeaseId,
    /// Where callers connect.
    pub address: IpAddr,
    /// The port callers connect to.
    pub port: u16,
    /// The region of the arbiter that owns the record.
    pub region: Label,
    /// The zone of its node.
    pub zone: Label,
    /// The software version it runs.
    pub version: Version,
    /// Relative share of new traffic.
    pub weight: Weight,
    /// Predefined label dimensions.
    pub labels: Labels,
    /// Lifecycle state; only READY is routable.
    pub state: State,
    /// Why it is in this state.
    pub reason: Reason,
    /// Who made the last change.
    pub origin: Principal,
    /// Liveness verdict, never used to route.
    pub liveness: Liveness,
    /// The revision that committed the last change of this record.
    pub revision: Revision,
    /// When the last change committed (milliseconds since the Unix epoch,
    /// from the command, never from a clock read here).
    pub changed_at_ms: u64,
}

impl EndpointRecord {
    /// Whether the catalog holds evidence that this endpoint is gone, not
    /// only a doubt about it (R7): its lease ended (EXPIRED: revoked by its
    /// agent, or expired past the mass-expiry guard), or its node was
    /// declared down by two signals (gossip and the arbiter's own silence).
    /// A down verdict is the only command through which an agent changes a
    /// record of another node (an agent writes only its own node's records
    /// otherwise), so an UNHEALTHY record whose last change an agent of
    /// another node made is a down verdict; one its own agent, an operator
    /// or a controller made (a readiness probe, a process exit) is not.
    ///
    /// The data plane's empty-set protection and panic threshold guard
    /// against doubtful verdicts only: a confirmed-dead endpoint is never a
    /// candidate, in any mode.
    pub fn confirmed_dead(&self) -> bool {
        match self.state {
            State::Expired => true,
            State::Unhealthy => {
                self.origin.role == Role::Agent
                    && self.origin.name.as_str() != self.node_id.as_str()
            }
            State::Starting | State::Ready | State::Draining => false,
        }
    }
}
