//! SWIM membership of the node agents inside one zone (foca), over
//! authenticated UDP, and the dead-node reports an agent sends to the arbiter.
//!
//! Role: detect silent node failure quickly (R4) and give each agent a local
//! view of which peers are down, used only while the arbiter is unreachable
//! (R7). It must not become a second source of truth for the catalog: a gossip
//! verdict reaches the catalog only through the arbiter's two-signal rule.
//!
//! Map of the crate (sans-IO but for `driver`):
//! - `driver`: the thin UDP driver: socket, timers, events to a listener.
//! - `identity`: [`MemberId`], who a member is (node, address, agent epoch).
//! - `seal`: packet authentication with the zone key (R10).
//! - `replay`: the per-sender replay windows `seal` drops resent
//!   datagrams by.
//! - `membership`: [`Membership`], foca behind one door, with the foca
//!   2.0.0 stale-TurnUndead workaround.
//! - `sim`: a deterministic simulated network of real `Membership`s, for
//!   tests and the fleet simulator.

pub mod driver;
pub mod identity;
pub mod membership;
pub mod replay;
pub mod seal;
pub mod sim;

pub use driver::{GossipHandle, GossipListener, GossipOptions, GossipSocket, SharedDrops};
pub use identity::MemberId;
pub use membership::{foca_config, DropReason, Drops, Membership, MembershipEvent, Output};
pub use seal::{KeyFileError, OpenDrops, OpenError, Sealer, ZoneKey, MAX_PACKET};
