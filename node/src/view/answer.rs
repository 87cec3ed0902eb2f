//! What the agent's state machine publishes of a service ([`Published`])
//! and what a lookup answers ([`Lookup`], [`Answer`], [`Degraded`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use rollcall_config::StaleBehaviour;
use rollcall_leases::{EndpointRecord, InstanceId, Revision, ServiceKey};

use crate::endpoints::Selection;

/// What the agent holds of one service, as its state machine publishes it.
#[derive(Clone, Debug)]
pub struct Published {
    /// The service.
    pub service: ServiceKey,
    /// Whether anything is held.
    pub status: Status,
    /// Every record held (empty unless `status` is `Held`).
    pub records: Arc<[Arc<EndpointRecord>]>,
    /// Revision of the service's last change held.
    pub revision: Revision,
    /// This session confirmed the records are current.
    pub synced: bool,
    /// When they were last known current, ms; `None` if never (then the
    /// age counts from `loaded_at_ms`).
    pub confirmed_at_ms: Option<u64>,
    /// When the agent started (a cached copy's age counts from here).
    pub loaded_at_ms: u64,
    /// Instances of the service this agent drained or deregisters, which
    /// the arbiter may not have committed yet: out of this agent's data
    /// plane at once, shown as DRAINING.
    pub leaving: Arc<BTreeSet<InstanceId>>,
    /// Past this age (ms) the copy follows `stale_behaviour`.
    pub max_age_ms: u64,
    /// What a copy past its maximum age does.
    pub stale_behaviour: StaleBehaviour,
    /// The summed weight of its READY records (the failover demand
    /// estimate notes it at every lookup).
    pub ready_weight: u64,
}

/// Whether a followed service has a copy to serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// Followed, nothing arrived yet.
    Waiting,
    /// The arbiter refused this agent's watch, with its reason.
    Denied(String),
    /// The arbiter says the service does not exist.
    Unknown,
    /// A copy is held (possibly empty).
    Held,
}

impl Published {
    /// A followed service with nothing held yet.
    pub fn waiting(service: ServiceKey, loaded_at_ms: u64) -> Self {
        Published {
            service,
            status: Status::Waiting,
            records: Arc::from(Vec::new()),
            revision: Revision(0),
            synced: false,
            confirmed_at_ms: None,
            loaded_at_ms,
            leaving: Arc::default(),
            max_age_ms: u64::MAX,
            stale_behaviour: StaleBehaviour::Keep,
            ready_weight: 0,
        }
    }

    /// How old the copy is at `now_ms`: 0 while the session keeps it
    /// current.
    pub fn age_ms(&self, now_ms: u64) -> u64 {
        if self.synced {
            0
        } else {
            now_ms.saturating_sub(self.confirmed_at_ms.unwrap_or(self.loaded_at_ms))
        }
    }
}

/// What the view answers for a service.
#[derive(Clone, Debug)]
pub enum Lookup {
    /// Endpoints to use (possibly none).
    Serve(Answer),
    /// The arbiter says the service does not exist.
    Unknown,
    /// The agent cannot know: not cached and the arbiter unreachable, not
    /// arrived yet, or the watch refused.
    CannotKnow(String),
    /// The copy is past its maximum age and the service's policy refuses.
    Refused(String),
}

/// A served lookup. Every field is shared with the view: cloning an answer
/// copies pointers, not records.
#[derive(Clone, Debug)]
pub struct Answer {
    /// The service.
    pub service: ServiceKey,
    /// Revision of its last change held.
    pub revision: Revision,
    /// Not confirmed by the arbiter in this session.
    pub stale: bool,
    /// Age of the copy, ms.
    pub age_ms: u64,
    /// The endpoints to use, and how they were chosen.
    pub selection: Arc<Selection>,
    /// Every record held.
    pub records: Arc<[Arc<EndpointRecord>]>,
    /// Instances this agent drained or deregistered (shown as DRAINING).
    pub leaving: Arc<BTreeSet<InstanceId>>,
    /// Set when the copy is past its maximum age and the service's
    /// staleness behaviour is `degrade`: the selection then holds only the
    /// endpoints with fresh local evidence (see [`Degraded`]).
    pub degraded: Option<Degraded>,
}

/// How a copy past its maximum age is served under `degrade` (README,
/// "Stale copies"): only the endpoints this agent has fresh local
/// evidence of (their node this agent's own or alive in its zone's gossip, and no failed
/// connect from here within `data_plane.base_ejection_ms`), in the same
/// zone order as ever; at most one retry; DNS answers valid for 1 s; no
/// failover to the regions the stale copy names. When no endpoint has
/// such evidence, the whole copy is served as under `keep`, and this says
/// so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Degraded {
    /// No endpoint had fresh local evidence: the `keep` set is served.
    pub fallback: bool,
    /// Why, in words, for the resolve answer and logs.
    pub reason: String,
}

/// Retries a connection of a degraded answer gets at most.
pub const DEGRADED_RETRIES: u32 = 1;

/// The TTL of DNS answers from a degraded copy, s.
pub const DEGRADED_TTL_S: u32 = 1;
