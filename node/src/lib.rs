//! The node agent: local registration and heartbeats, probes, the node lease,
//! the watch client with its on-disk cache, and the data plane (TCP proxy,
//! DNS, resolve API) that callers on this host use (R4, R6, R7, R8).
//!
//! Role: keep serving callers from the local cache whatever the control plane
//! does. It must never forward a caller to the arbiter, and never invent
//! catalog truth: local ejection and pending writes stay local.

pub mod agent;
pub mod api;
pub mod api_types;
pub mod cache;
pub mod dev;
pub mod dev_regions;
pub mod dns;
pub mod durable;
pub mod endpoints;
pub mod failover;
pub mod health;
pub mod ingress;
pub mod link;
pub mod metrics;
pub mod prober;
pub mod proxy;
pub mod registrations;
pub mod selector;
pub mod sync;
