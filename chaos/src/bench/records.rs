//! What a fleet bench worker saw, handed to the coordinator in one file
//! at the end, and the orders and answers they exchange on the worker's
//! standard input and output (one JSON document per line).
//!
//! Times are wall-clock microseconds since the Unix epoch: the workers and
//! the coordinator are processes on one machine, and the wall clock is the
//! one they share. Nothing here decides anything.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Now, in wall-clock microseconds.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// What a write was for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A registration.
    Register,
    /// READY → DRAINING.
    Drain,
    /// A deregistration.
    Deregister,
    /// Anything else the agent's machine asked (health verdicts, leaves).
    Other,
}

/// One write the arbiter committed with a revision.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Commit {
    /// The writing agent (a churn node's index for its writes).
    pub agent: u32,
    /// What it was.
    pub kind: Kind,
    /// Its service's index.
    pub service: u32,
    /// The revision that committed it.
    pub revision: u64,
    /// When the request left the agent.
    pub sent_us: u64,
    /// When the Committed answer arrived.
    pub answered_us: u64,
}

/// One acknowledgement an agent sent: its view of `service` holds
/// `revision` (the agent's machine acknowledges what it applied, by delta
/// or by snapshot, in the same step that applies it).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Apply(pub u32, pub u32, pub u64, pub u64);

impl Apply {
    /// The agent.
    pub fn agent(&self) -> u32 {
        self.0
    }
    /// The service's index.
    pub fn service(&self) -> u32 {
        self.1
    }
    /// The revision its view holds.
    pub fn revision(&self) -> u64 {
        self.2
    }
    /// When it acknowledged it.
    pub fn at_us(&self) -> u64 {
        self.3
    }
}

/// What reached the agents of one worker in one wall-clock second.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Load {
    /// Update messages (each carries one or more services' updates).
    pub messages: u64,
    /// Service updates (a service's deltas, snapshot or answer): what the
    /// fleet simulation counts as deliveries.
    pub updates: u64,
    /// Deltas (one per changed record).
    pub deltas: u64,
    /// Full service snapshots.
    pub snapshots: u64,
    /// "Retry later" answers to a subscription.
    pub retries: u64,
    /// Session payload bytes (frames as encoded, with their length prefix;
    /// QUIC and UDP headers not counted).
    pub bytes: u64,
}

impl Load {
    /// Adds `other`.
    pub fn add(&mut self, other: &Load) {
        self.messages += other.messages;
        self.updates += other.updates;
        self.deltas += other.deltas;
        self.snapshots += other.snapshots;
        self.retries += other.retries;
        self.bytes += other.bytes;
    }
}

/// One agent's return from the storm.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Return {
    /// The agent.
    pub agent: u32,
    /// Whether its cache was wiped.
    pub wiped: bool,
    /// When its first session after the heal got its Welcome (0: never).
    pub connected_us: u64,
    /// Snapshots it received after the heal.
    pub snapshots: u64,
    /// Retry answers it received after the heal.
    pub retries: u64,
    /// Sessions that ended after the heal before one held (failed
    /// handshakes, refusals).
    pub failed: u64,
}

/// Everything one worker recorded.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Records {
    /// Which worker.
    pub worker: u32,
    /// Committed writes with a revision.
    pub commits: Vec<Commit>,
    /// Acknowledgements.
    pub applies: Vec<Apply>,
    /// Deliveries by wall-clock second.
    pub load: BTreeMap<u64, Load>,
    /// Writes the agents' machines answered with an error, by message
    /// (at most `MAX_ERRORS` kinds kept).
    pub errors: BTreeMap<String, u64>,
    /// Every agent's return from the storm (empty without a storm).
    pub returns: Vec<Return>,
}

/// Most distinct error messages kept.
pub const MAX_ERRORS: usize = 32;

impl Records {
    /// Counts an error message.
    pub fn error(&mut self, message: String) {
        if self.errors.len() < MAX_ERRORS || self.errors.contains_key(&message) {
            *self.errors.entry(message).or_default() += 1;
        } else {
            *self.errors.entry("(other errors)".into()).or_default() += 1;
        }
    }
}

/// What the coordinator tells the workers, one phase at a time.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// Start every agent (they connect; nothing registered yet).
    Connect,
    /// Register every instance of every agent.
    Register,
    /// Follow every agent's services and fetch their views.
    Follow,
    /// Replace the planned instances, the j-th at `start_us + j ×
    /// window_us / count`: register the new one, drain the old one, and
    /// deregister it `drain_ms` after its drain is answered.
    Deploy {
        /// When the first replacement starts.
        start_us: u64,
        /// Over how long they are spread.
        window_us: u64,
        /// From a drain's answer to the deregistration.
        drain_ms: u64,
    },
    /// Cut every agent off the arbiters (its session ends; no new one can
    /// start); agents planned as wiped restart with an empty cache.
    Cut,
    /// Each churn node replaces each of its instances (`concurrency` at a
    /// time per node); workers without one answer at once.
    Churn {
        /// Replacements in flight at once.
        concurrency: u32,
    },
    /// Lift the cut: agents reconnect on their own backoff; done once
    /// every agent holds a session and every followed view holds at least
    /// the revision `required` names for its service.
    Heal {
        /// (service index, revision) of every service the churn changed.
        required: Vec<(u32, u64)>,
        /// Give up after this long, ms.
        deadline_ms: u64,
    },
    /// Close every session, write the records to `records`, exit.
    Finish {
        /// Where to write them.
        records: std::path::PathBuf,
    },
}

/// What a worker answers.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// How far the current phase is.
    Progress {
        /// Done so far.
        done: u64,
        /// Due.
        total: u64,
    },
    /// The phase ended.
    Done {
        /// Done.
        done: u64,
        /// Due.
        total: u64,
        /// When the last of it was done (wall µs), e.g. the storm's
        /// convergence.
        at_us: u64,
        /// Why it ended short, if it did.
        short: Option<String>,
        /// After `Churn`: the last revision the churn nodes committed in each
        /// service it changed (what `Heal` then waits for).
        #[serde(default)]
        required: Vec<(u32, u64)>,
    },
}
