//! The local API's calls and their answers, in the agent's own terms: who
//! asks, what it asks, and how it ended (committed at a revision, pending,
//! refused for a reason). `api` maps these onto status codes and the JSON
//! error shape; nothing here knows about HTTP.

use rollcall_leases::protocol::{RejectKind, ServiceCount};
use rollcall_leases::{Generation, InstanceId, Revision, State};

use crate::api_types::ValidRegistration;
use crate::registrations::LocalInstance;

/// A local API call, numbered by the driver; its answer names it.
pub type CallId = u64;

/// Who is calling the local API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// Holds the node token: may do anything on this node.
    Operator,
    /// A local process on the unix socket, by its peer credentials.
    Workload {
        /// Its user id.
        uid: u32,
        /// Its group id.
        gid: u32,
    },
}

/// A call of the local API, validated at the edge.
// Moved once per input, never stored in bulk: boxing the large variant
// would cost an allocation per input for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Call {
    /// `PUT /v1/agent/instances`.
    Register {
        /// What to register.
        registration: ValidRegistration,
        /// Who asks.
        caller: Caller,
    },
    /// `PUT /v1/agent/instances/{id}/heartbeat`.
    Heartbeat {
        /// The instance.
        instance: InstanceId,
        /// The generation named, if any.
        generation: Option<u64>,
        /// Who asks.
        caller: Caller,
    },
    /// `PUT /v1/agent/instances/{id}/drain`.
    Drain {
        /// The instance.
        instance: InstanceId,
        /// The generation named, if any.
        generation: Option<u64>,
        /// Answer once every subscribed agent applied it (`wait=propagated`).
        propagated: bool,
        /// Who asks.
        caller: Caller,
    },
    /// `DELETE /v1/agent/instances/{id}`.
    Deregister {
        /// The instance.
        instance: InstanceId,
        /// The generation named, if any.
        generation: Option<u64>,
        /// Who asks.
        caller: Caller,
    },
    /// `POST /v1/agent/instances/{id}/session`: a registration session
    /// opens (its close is `Input::WorkloadSessionClosed`).
    OpenSession {
        /// The instance.
        instance: InstanceId,
        /// The generation named, if any.
        generation: Option<u64>,
        /// Who asks.
        caller: Caller,
    },
    /// `GET /v1/agent/instances`: this node's registrations, as the agent
    /// holds them (a read: anyone on the host may ask).
    Instances,
    /// `GET /v1/services`: the region's services, asked of the arbiter
    /// replica this agent's session is with.
    Services,
}

/// The region's services as the arbiter listed them (`Call::Services`).
#[derive(Clone, Debug, PartialEq)]
pub struct RegionServices {
    /// The services this node may watch, in key order.
    pub services: Vec<ServiceCount>,
    /// The revision of the catalog the replica listed them from.
    pub revision: Revision,
    /// The list stops at the arbiter's limit; there are more.
    pub truncated: bool,
}

/// One of this node's registrations, as `Call::Instances` lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalEntry {
    /// What the agent holds of it: the registration, its generation, the
    /// intent and whether the arbiter committed it.
    pub local: LocalInstance,
    /// The state its health checks give it; `None` without checks.
    pub checked: Option<State>,
}

/// How a write ended.
#[derive(Clone, Debug, PartialEq)]
pub enum WriteOutcome<T> {
    /// The arbiter committed it.
    Committed(T),
    /// Accepted locally (it already applies to this agent's own data
    /// plane); sent when the arbiter is back.
    Pending(T),
}

/// A registration's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Registered {
    /// The instance.
    pub instance: InstanceId,
    /// The generation the catalog assigned; `None` while pending.
    pub generation: Option<Generation>,
    /// The record's state in the catalog; `None` while pending.
    pub state: Option<State>,
}

/// A drain's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Drained {
    /// The revision that committed it; `None` while pending.
    pub revision: Option<Revision>,
    /// How far it reached the other agents, when the caller waited.
    pub propagated: Option<Propagation>,
}

/// How many of a service's subscribed agents acknowledged a revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Propagation {
    /// Agents that acknowledged it.
    pub acked: u32,
    /// Agents subscribed to the service.
    pub total: u32,
}

/// The answer to a call.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// To `Register`.
    Registered(WriteOutcome<Registered>),
    /// To `Heartbeat`: the generation the instance is at.
    Heartbeat {
        /// The instance.
        instance: InstanceId,
        /// Its generation, `None` while its registration is pending.
        generation: Option<Generation>,
    },
    /// To `Drain`.
    Drained(WriteOutcome<Drained>),
    /// To `Deregister`: the revision that committed it (`None` while
    /// pending, or when there was nothing to change).
    Deregistered(WriteOutcome<Option<Revision>>),
    /// To `OpenSession`: the generation the session holds.
    SessionOpened(Option<Generation>),
    /// To `Instances`: every local registration, in instance id order.
    Instances(Vec<LocalEntry>),
    /// To `Services`: the arbiter's list; `None` when it could not be
    /// asked (no session, the session ended, no answer within
    /// `agent.write_answer_ms`): the caller falls back on the copies this
    /// agent holds.
    Services(Option<RegionServices>),
}

/// Why a call was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The call is malformed for this caller (a workload that named no
    /// generation).
    BadRequest,
    /// The caller may not do this (`[[workloads]]` grants, or the arbiter's
    /// rules).
    Forbidden,
    /// The instance or service is not known.
    NotFound,
    /// The call conflicts with what this agent holds (an instance id
    /// registered under another service).
    Conflict,
    /// The call names a generation that is not the instance's current one.
    StaleGeneration,
    /// The catalog refused the change as invalid.
    Invalid,
    /// It cannot be done now (the registrations file could not be saved,
    /// the session ended while waiting for propagation).
    Unavailable,
}

/// A refused call: why, and a message that says what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The kind of refusal.
    pub kind: Refused,
    /// What was wrong, for the caller.
    pub message: String,
}

impl Refusal {
    /// A refusal of `kind`.
    pub fn new(kind: Refused, message: impl Into<String>) -> Refusal {
        Refusal {
            kind,
            message: message.into(),
        }
    }

    /// The arbiter's refusal, as the agent passes it on.
    pub fn by_arbiter(kind: RejectKind, message: String) -> Refusal {
        let kind = match kind {
            RejectKind::StaleGeneration => Refused::StaleGeneration,
            RejectKind::NotFound => Refused::NotFound,
            RejectKind::Forbidden => Refused::Forbidden,
            RejectKind::Invalid => Refused::Invalid,
            RejectKind::Unavailable => Refused::Unavailable,
        };
        Refusal { kind, message }
    }
}

/// The answer of a call that waits for the arbiter, given when the
/// arbiter has not answered it within `agent.write_answer_ms` (a write
/// stays pending; a listing is not had); `None` for calls answered
/// locally.
pub(super) fn pending_reply(op: &Call) -> Option<Reply> {
    match op {
        Call::Register { registration, .. } => {
            Some(register_pending(registration.instance_id.clone()))
        }
        Call::Drain { .. } => Some(drain_pending()),
        Call::Deregister { .. } => Some(deregister_pending()),
        Call::Services => Some(Reply::Services(None)),
        Call::Heartbeat { .. } | Call::OpenSession { .. } | Call::Instances => None,
    }
}

pub(super) fn register_pending(instance: InstanceId) -> Reply {
    Reply::Registered(WriteOutcome::Pending(Registered {
        instance,
        generation: None,
        state: None,
    }))
}

pub(super) fn drain_pending() -> Reply {
    Reply::Drained(WriteOutcome::Pending(Drained {
        revision: None,
        propagated: None,
    }))
}

pub(super) fn deregister_pending() -> Reply {
    Reply::Deregistered(WriteOutcome::Pending(None))
}
