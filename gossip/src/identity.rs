//! Who a gossip member is: the node, the address its gossip socket listens
//! on, and which run of its agent this is. foca keeps at most one member per
//! address and uses [`Identity::win_addr_conflict`] to pick between two
//! identities claiming the same address.
//!
//! This module must not let an older identity win over a newer one: a
//! stale identity (an earlier agent run, or an earlier rejoin of this run)
//! can never come back once its successor is known.

use std::cmp::Ordering;
use std::fmt;
use std::net::SocketAddr;

use foca::Identity;
use rollcall_leases::{AgentEpoch, NodeId};
use serde::{Deserialize, Serialize};

/// One life of one node agent in the zone's membership.
///
/// Ordering of lives at one address: a higher `epoch` (a restarted agent)
/// always wins; within one epoch a higher `rejoin` wins. `rejoin` is bumped
/// by foca itself through [`Identity::renew`] when this agent learns that
/// the zone declared it down (after a partition, say): it cannot refute a
/// Down, so it comes back as a fresh identity of the same agent run. The
/// epoch never changes that way, so the arbiter, which knows agents by
/// (node, epoch), sees the same agent.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MemberId {
    /// The node agent's stable identity.
    pub node: NodeId,
    /// Where the agent's gossip socket listens; foca's member address.
    pub addr: SocketAddr,
    /// This run of the agent (R4): fresh and higher at every agent start.
    pub epoch: AgentEpoch,
    /// How many times this run rejoined after being declared down; 0 at
    /// agent start.
    pub rejoin: u32,
}

impl MemberId {
    /// The first identity of an agent run.
    pub fn new(node: NodeId, addr: SocketAddr, epoch: AgentEpoch) -> Self {
        MemberId {
            node,
            addr,
            epoch,
            rejoin: 0,
        }
    }

    /// Total order of lives sharing one address: epoch, then rejoin, then
    /// node id (only two different nodes misconfigured onto one address tie
    /// on both; the node id makes both sides pick the same winner).
    fn life_order(&self, other: &Self) -> Ordering {
        (self.epoch, self.rejoin, &self.node).cmp(&(other.epoch, other.rejoin, &other.node))
    }
}

impl Identity for MemberId {
    type Addr = SocketAddr;

    /// The same agent run under the next rejoin number. Never changes the
    /// node, address or epoch, so it cannot produce an older life.
    fn renew(&self) -> Option<Self> {
        let rejoin = self.rejoin.checked_add(1)?;
        Some(MemberId {
            rejoin,
            ..self.clone()
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.life_order(adversary) == Ordering::Greater
    }
}

impl fmt::Debug for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}/{:?}", self.node, self.addr, self.epoch)?;
        if self.rejoin > 0 {
            write!(f, "+{}", self.rejoin)?;
        }
        Ok(())
    }
}

impl fmt::Display for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(node: &str, epoch: u64) -> MemberId {
        MemberId::new(
            NodeId::new(node).expect("valid node id"),
            SocketAddr::from(([10, 0, 0, 1], 7946)),
            AgentEpoch(epoch),
        )
    }

    #[test]
    fn restarted_agent_wins_over_its_old_life() {
        let old = id("a", 5);
        let new = id("a", 6);
        assert!(new.win_addr_conflict(&old));
        assert!(!old.win_addr_conflict(&new));
    }

    #[test]
    fn renew_keeps_the_epoch_and_wins() {
        let first = id("a", 5);
        let renewed = first.renew().expect("renewable");
        assert_eq!(renewed.epoch, first.epoch);
        assert_eq!(renewed.rejoin, 1);
        assert!(renewed.win_addr_conflict(&first));
        // A renewed identity of an old run still loses to a newer run.
        assert!(id("a", 6).win_addr_conflict(&renewed));
    }

    #[test]
    fn exactly_one_side_wins_a_conflict() {
        let a = id("a", 5);
        let b = id("b", 5);
        assert_ne!(a.win_addr_conflict(&b), b.win_addr_conflict(&a));
    }

    #[test]
    fn postcard_round_trip() {
        let first = id("node-1.zone-a", 1_700_000_000_000);
        let bytes = postcard::to_allocvec(&first).expect("encodes");
        let back: MemberId = postcard::from_bytes(&bytes).expect("decodes");
        assert_eq!(back, first);
    }
}
