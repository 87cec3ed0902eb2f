//! The catalog model, the lease arbiter's decisions (R2, R3) and the
//! arbiter server that carries them out.
//!
//! Two halves. The sans-IO half is deterministic: `Catalog::apply` takes
//! a command that carries its own time and returns what changed; the
//! replica machine (`replica`) and the machines it owns (the session
//! machine `sessions`, the leader memory `leader`, the distributor
//! `distribution`) take time and randomness as arguments and return what
//! to do. None of them reads a clock, a socket, a file, a lock or an
//! unseeded random source, so the arbiter server, the Raft log and the
//! fleet simulator all drive this same code. The IO half owns sockets,
//! files, locks and the clock, and only carries the decisions out.
//!
//! Map of the crate, sans-IO:
//! - `name`, `ids`: validated names and numeric identities.
//! - `endpoint`: the endpoint record, states, liveness, principals.
//! - `command`: the replicated commands; `audit`: their audit entries.
//! - `catalog`: the state machine and its queries; `stored`: how it (and
//!   the delta log) holds a record.
//! - `lease`, `guard`: node leases (replicated) and their deadlines (the
//!   leader's memory), the mass-expiry guard.
//! - `delta_log`, `digest`, `snapshot`, `view`: distribution (R6).
//! - `protocol`: the agent ↔ arbiter messages; `peer_protocol`: replica ↔
//!   replica requests; `distribution`: who gets which change when.
//! - `replica`: one replica of one Raft group, as one machine: its
//!   standing, writes (batches, forwarding, answers held until applied),
//!   witnesses, sessions and distribution; the core task drives it.
//! - `sessions`: per connected agent, controller or bridge, what each
//!   message and request means (grants, watches, authorization, down
//!   reports); `answers`: the answers built from the catalog; `leader`:
//!   when sessions were heard, lease deadlines, the two-signal down rule
//!   (a gossip report and an unanswered probe), expiries, purges; `witness`: whom to ask about a silent lease.
//! - `params`: what every replica of a shard must agree on.
//! - `policy`, `regions`: service policies as the catalog holds them and
//!   the regions message agents get (R9).
//! - `remote`: the non-authoritative view of other regions the region
//!   bridge reports (R9), held in arbiter memory only.
//! - `identity`: principals from certificates.
//! - `limits`: token buckets and counts per identity, connection or
//!   source address (the arbiter's `[limits]`).
//! - `refusals`: what was refused, by whom, for the process's audit log
//!   (repeats folded per identity and kind).
//!
//! IO: `server` (the arbiter process: QUIC sessions, the core task that
//! drives the replica machine, peers, admin HTTP), `raft` (openraft over
//! redb; the applied catalog behind its lock), `client` (the QUIC client
//! agents and controllers use), `tls`, `clock` (the one wall-clock read),
//! `shutdown` (the one stop signal every task of a process observes),
//! `transport` (the one QUIC transport configuration: keep-alives, idle
//! timeouts and windows per kind of link),
//! `http` (what the agent's and the admin HTTP APIs share: JSON errors,
//! connection limits and timeouts), `secret` (token files), `codec` (the
//! only encoder and decoder: pure, plus the frame reads and writes on
//! streams), `fault` (the chaos suite's wire fault points behind a global
//! mutex, reading the clock for its seed, only in builds with the
//! `fault-injection` feature; `FAULT_INJECTION` says which build this is).

pub mod answers;
pub mod audit;
pub mod catalog;
pub mod client;
pub mod clock;
pub mod codec;
pub mod command;
pub mod delta_log;
pub mod digest;
pub mod distribution;
pub mod endpoint;
#[cfg(feature = "fault-injection")]
pub mod fault;
pub mod guard;
pub mod http;
pub mod identity;
pub mod ids;
pub mod leader;
pub mod lease;
pub mod limits;
pub mod name;
pub mod params;
pub mod peer_protocol;
pub mod policy;
pub mod protocol;
pub mod raft;
mod redb_file;
pub mod refusals;
pub mod regions;
pub mod remote;
pub mod replica;
pub mod secret;
pub mod server;
pub mod sessions;
pub mod shard;
pub mod shutdown;
pub mod snapshot;
mod stored;

pub mod tls;
pub mod transport;
pub mod view;
pub mod witness;
pub mod writer;

pub use catalog::{
    Applied, Catalog, Effect, GenerationMemory, ReadySummary, Rejection, ServiceInfo, SinceAnswer,
};
pub use command::{Command, Envelope, Registration};
pub use delta_log::{Change, ServiceDelta};
pub use digest::Digest;
pub use endpoint::{EndpointRecord, Liveness, Principal, Role, State, Weight};
pub use ids::{AgentEpoch, CatalogId, Generation, LeaseId, Revision, ShardId};
pub use name::{
    InstanceId, Label, LabelValue, NameError, NodeId, PrincipalName, Reason, ServiceKey, Version,
};
pub use params::CatalogParams;
pub use policy::{Policy, PolicyKey, RemotePolicy, ReplicatedPolicy, StoredPolicy};
pub use regions::{HeldPolicy, RegionEntry, RegionsUpdate};
pub use remote::{Ingress, RegionView, RemoteViews, ServiceSummary};
pub use shard::shard_of;
pub use snapshot::{CatalogSnapshot, ServiceSnapshot};
pub use view::{ServiceView, ViewError};
pub use writer::{StoredWriter, Transfer, TransferRefusal, WriterEpoch};

/// Whether this build has the wire fault points of `fault` (the
/// `fault-injection` cargo feature); always defined, so the binary can say
/// which build it is and refuse `ROLLCALL_FAULTS` when they are missing.
pub const FAULT_INJECTION: bool = cfg!(feature = "fault-injection");
