//! The node agent: local registration and heartbeats, probes, the node lease,
//! the watch client with its on-disk cache, and the data plane (TCP proxy,
//! DNS, resolve API) that callers on this host use (R4, R6, R7, R8).
//!
//! Role: keep serving callers from the local cache whatever the control plane
//! does. It must never forward a caller to the arbiter, and never invent
//! catalog truth: local ejection and pending writes stay local.
//!
//! Module map. Sans-IO state machines (time and randomness come in as
//! arguments): `agent_state` (every decision of the agent), `sync`
//! (catalog views), `link` (backoff, renewals, gossip down verdicts),
//! `health` (check schedules and verdicts), `endpoints` (selection rules:
//! protection, panic, ejection, slow start), `selector` (one endpoint per
//! connection), `failover` (other regions, R9), `registrations` (the local
//! instances). The published view the data plane reads: `view`. The
//! process: `process` (checks everything, then starts it; the handles on
//! the running agent). Drivers that own IO: `agent` (the agent actor),
//! `zone` (the gossip driver's verdicts as messages), `session` and
//! `store` (its session and file actors; the prober actor, which also
//! answers witness questions, is in `prober`),
//! `api` (HTTP), `dns`, `proxy`, `ingress`, `forward` (what the last two
//! share), `prober`, `cache` and
//! `durable` (files), `runtime` (the actix System), `shutdown` (the one
//! signal). Data types: `api_types`, `metrics`.
//!
//! Dependencies inside the crate point one way: the data plane (`proxy`,
//! `dns`, `ingress`, `api`) reads `view` and never reaches `agent`;
//! `agent` drives `agent_state`; `process` starts both.

pub mod agent;
pub mod agent_state;
pub mod api;
pub mod api_types;
pub mod cache;
pub mod carry;
pub mod dns;
pub mod durable;
pub mod endpoints;
pub mod failover;
pub mod forward;
pub mod health;
pub mod ingress;
pub mod link;
pub mod metrics;
pub mod prober;
pub mod process;
pub mod proxy;
pub mod registrations;
mod relay;
pub mod runtime;
pub mod selector;
pub mod session;
pub use rollcall_leases::shutdown;
pub mod store;
pub mod sync;
pub mod view;
pub mod zone;
