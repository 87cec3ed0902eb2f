//! SWIM membership of the node agents inside one zone (foca), over
//! authenticated UDP, and the dead-node reports an agent sends to the arbiter.
//!
//! Role: detect silent node failure quickly (R4) and give each agent a local
//! view of which peers are down, used only while the arbiter is unreachable
//! (R7). It must not become a second source of truth for the catalog: a gossip
//! verdict reaches the catalog only through the arbiter's two-signal rule.
//!
//! Built by the zone-gossip issue; this crate holds no code yet.
