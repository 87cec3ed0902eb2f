//! The region bridge: syncs service policy, per-service per-region summaries
//! and declared ingress addresses between regions over QUIC with mutual TLS
//! (R9).
//!
//! Role: give each region a non-authoritative, aged view of the others. It
//! must never carry heartbeats or instance records across regions, and never
//! mark another region's instances healthy.
//!
//! Map of the crate:
//! - `message`: the only things bridges say to each other; `codec`: their
//!   bytes, with a version byte and size limits.
//! - `publisher` / `subscriber`: the protocol, sans-IO: deltas with resume
//!   by this region's catalog revision, falling back to the full state.
//! - `tls`: who may speak (bridges of peer regions, each vouched for by its
//!   own region's CA).
//! - `arbiter`: this region's arbiter through its admin API (read policies
//!   and summaries; store other regions' policies and the remote view).
//! - `server`: the running bridge, thin; `stats`: its counters.

pub mod arbiter;
pub mod codec;
pub mod error;
pub mod message;
pub mod metrics;
pub mod publisher;
pub mod server;
pub mod stats;
pub mod subscriber;
pub mod tls;

pub use error::BridgeError;
pub use server::Bridge;
pub use stats::StatsSnapshot;
pub use tls::BridgeTls;
