//! What a chaos run records, in real milliseconds since the run started:
//! every connection the traffic generator opened (through which agent, which
//! backend answered, how it ended) and every event the harness caused or
//! observed (faults, commits of leave transitions, phases). The report is
//! computed from these alone, never from the control plane's opinion.

use serde::{Deserialize, Serialize};

/// How one connection through an agent's proxy ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A backend answered with its instance id.
    Answered,
    /// The proxy refused or reset the connection, or no backend answered
    /// before the connect timeout.
    Failed,
}

/// One connection the traffic generator opened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conn {
    /// When it was opened, ms since the run started.
    pub t_ms: u64,
    /// The agent (node id) whose proxy carried it.
    pub agent: String,
    /// The instance id that answered, if one did.
    pub backend: Option<String>,
    /// How it ended.
    pub outcome: Outcome,
}

/// Something the harness did or saw, at a time in ms since the run started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    /// A named phase of the scenario begins (phases end where the next
    /// begins, or at the end of the run).
    Phase {
        /// When.
        t_ms: u64,
        /// Its name.
        name: String,
    },
    /// The catalog committed DRAINING or UNHEALTHY for an instance (the
    /// start of a leave, R5's 3 s clock).
    LeaveCommitted {
        /// When the commit was observed.
        t_ms: u64,
        /// The instance.
        instance: String,
    },
    /// A hard failure was injected on a backend (kill -9, freeze, node
    /// crash): the start of R5's 15 s clock for it.
    HardFailure {
        /// When.
        t_ms: u64,
        /// The instance.
        instance: String,
        /// What was done ("kill-backend", "crash-node", …).
        fault: String,
    },
    /// A fault or recovery step without a single backend (partition,
    /// arbiter stop, agent pause, …); shown on the plots.
    Step {
        /// When.
        t_ms: u64,
        /// What was done.
        action: String,
        /// To what.
        target: String,
    },
    /// An instance became READY in the catalog (a new backend of a deploy).
    Ready {
        /// When.
        t_ms: u64,
        /// The instance.
        instance: String,
    },
    /// A backend process exited on its own (the end of its drain in a
    /// rolling deploy), as the harness observed it; the end of the
    /// instance's stage on `stages.svg`. Timelines written before this
    /// variant existed have none and still parse.
    BackendExit {
        /// When the exit was observed.
        t_ms: u64,
        /// The instance.
        instance: String,
    },
    /// A hard-failed instance's process runs again: its node was
    /// restarted (`restart_node`, a round of `crash_rounds`). Ends the
    /// hard failure's window, as READY would.
    Restarted {
        /// When its node came back.
        t_ms: u64,
        /// The instance.
        instance: String,
    },
    /// A region's writer epoch of the service, as its arbiter reported it
    /// (`read_writers`).
    Writer {
        /// When it was read.
        t_ms: u64,
        /// The region.
        region: String,
        /// The epoch number.
        epoch: u64,
        /// The region that owns the writes in it.
        owner: String,
        /// Whether it is settled (else the writes are moving).
        settled: bool,
    },
}

impl Event {
    /// When it happened.
    pub fn t_ms(&self) -> u64 {
        match self {
            Event::Phase { t_ms, .. }
            | Event::LeaveCommitted { t_ms, .. }
            | Event::HardFailure { t_ms, .. }
            | Event::Step { t_ms, .. }
            | Event::Ready { t_ms, .. }
            | Event::BackendExit { t_ms, .. }
            | Event::Restarted { t_ms, .. }
            | Event::Writer { t_ms, .. } => *t_ms,
        }
    }
}

/// The endpoints one agent offered for the scenario's service at a moment
/// (its resolve answer: what its proxy picks from), sampled through the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// When it was sampled, ms since the run started.
    pub t_ms: u64,
    /// The agent.
    pub agent: String,
    /// The instance ids it offered.
    pub instances: Vec<String>,
}

/// What one r1 agent's resolve answer said about regions at a moment, in a
/// multi-region run: the region the answer routes to and, when it routes
/// nowhere, the failover refusal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionAnswer {
    /// When it was sampled, ms since the run started.
    pub t_ms: u64,
    /// The agent.
    pub agent: String,
    /// The answer's `region`.
    pub region: String,
    /// Its `failover.refused`, if any.
    pub refused: Option<String>,
}

/// A whole run's records.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeline {
    /// Every connection, in the order they were opened.
    pub conns: Vec<Conn>,
    /// Every agent's routable endpoints, sampled (not from crashed nodes).
    #[serde(default)]
    pub routes: Vec<Route>,
    /// Every change of each agent's routable endpoints, as its blocking
    /// resolve (`?index=`) returned it: each entry holds from its time until
    /// the agent's next one (not from crashed nodes).
    #[serde(default)]
    pub views: Vec<Route>,
    /// Every r1 agent's resolve answer as to regions, sampled with
    /// `routes` (multi-region runs only; empty otherwise).
    #[serde(default)]
    pub region_answers: Vec<RegionAnswer>,
    /// The region of every instance of a multi-region run (empty
    /// otherwise): r1's and every other region's backends.
    #[serde(default)]
    pub backend_regions: std::collections::BTreeMap<String, String>,
    /// Every event, in time order.
    pub events: Vec<Event>,
    /// How long the run lasted, ms.
    pub duration_ms: u64,
}
