//! The region bridge: syncs service policy, per-service per-region summaries
//! and declared ingress addresses between regions over QUIC with mutual TLS
//! (R9).
//!
//! Role: give each region a non-authoritative, aged view of the others. It
//! must never carry heartbeats or instance records across regions, and never
//! mark another region's instances healthy.
//!
//! Built by the regions issue; this crate holds no code yet.
