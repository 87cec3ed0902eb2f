//! Witnesses of a silent lease (R3, R4): what the arbiter asks agents
//! about a node whose session it no longer hears, and which agents it
//! asks. The leader's memory (`leader.rs`) decides what their answers
//! mean; this module only builds the question and picks who answers it.
//!
//! Witnesses come from both sides of the zone line, because each side can
//! tell something the arbiter cannot: an agent of the node's own zone
//! gossips with it (is it alive to its peers?), an agent of another zone
//! is a caller on another path (do its endpoints accept connections?). A
//! zone cut off from the arbiter looks alive to both; a dead zone looks
//! gone to the other zones and has no peer left to say otherwise.
//!
//! Pure: the driver (the arbiter's core, the fleet simulator) passes the
//! catalog and its connected sessions, and carries the asks.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::catalog::Catalog;
use crate::endpoint::State;
use crate::ids::AgentEpoch;
use crate::name::{Label, NodeId};
use crate::protocol::MAX_WITNESS_ADDRESSES;

/// Witnesses asked per side of the zone line (the node's own zone, the
/// other zones), by each replica among the agents connected to it.
pub const WITNESSES_PER_SIDE: usize = 3;

/// A silent lease the leader wants witnesses for; a follower asks its own
/// agents too (`SessionDown::Witness`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WitnessAsk {
    /// The silent node.
    pub node: NodeId,
    /// Its agent run.
    pub epoch: AgentEpoch,
    /// Its zone (witnesses are chosen in it and outside it).
    pub zone: Label,
    /// Where its endpoints listen (at most [`MAX_WITNESS_ADDRESSES`]).
    pub addresses: Vec<SocketAddr>,
}

/// A witness's answer, as a follower hands it to the leader.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WitnessAnswer {
    /// The witness (the answering session's node).
    pub witness: NodeId,
    /// The silent node.
    pub node: NodeId,
    /// Its agent run.
    pub epoch: AgentEpoch,
    /// What its gossip holds (see `SessionUp::Witnessed`).
    pub gossip: Option<bool>,
    /// Whether its endpoints accepted a connection.
    pub reachable: Option<bool>,
}

/// The question about `node`'s lease of `epoch`, from the catalog: its
/// zone and the addresses of its endpoints that were routable or starting
/// (READY first, then the others, in instance order; at most
/// [`MAX_WITNESS_ADDRESSES`], each once). `None` when the node holds no
/// lease of that epoch.
pub fn ask(catalog: &Catalog, node: &NodeId, epoch: AgentEpoch) -> Option<WitnessAsk> {
    let lease = catalog.leases().get(node)?;
    if lease.epoch != epoch {
        return None;
    }
    let mut records: Vec<_> = catalog
        .instances_on(node)
        .into_iter()
        .map(|(_, r)| r)
        .filter(|r| r.state != State::Expired && r.state != State::Draining)
        .collect();
    records.sort_by(|a, b| {
        (a.state != State::Ready, &a.instance_id).cmp(&(b.state != State::Ready, &b.instance_id))
    });
    let mut addresses: Vec<SocketAddr> = Vec::new();
    for r in records {
        let addr = SocketAddr::new(r.address, r.port);
        if !addresses.contains(&addr) {
            addresses.push(addr);
        }
        if addresses.len() == MAX_WITNESS_ADDRESSES {
            break;
        }
    }
    Some(WitnessAsk {
        node: node.clone(),
        epoch,
        zone: lease.zone.clone(),
        addresses,
    })
}

/// Who witnesses `ask` among `candidates` (a session, its node and its
/// zone; only sessions the caller hears now): up to
/// [`WITNESSES_PER_SIDE`] of the node's zone and as many of other zones,
/// the silent node itself never, in node order (so a replay picks the
/// same ones).
pub fn choose<'a, A: Copy>(
    ask: &WitnessAsk,
    candidates: impl IntoIterator<Item = (A, &'a NodeId, &'a Label)>,
) -> Vec<A> {
    Candidates::new(candidates).choose(ask)
}

/// The candidates of [`choose`] put in node order once, for many asks:
/// a region's agents cut off together open thousands of asks at once, and
/// sorting every session again for each was the arbiter's largest cost
/// when they came back (a `perf` profile of the fleet bench's storm).
pub struct Candidates<'a, A> {
    /// One per node, in node order.
    sorted: Vec<(A, &'a NodeId, &'a Label)>,
}

impl<'a, A: Copy> Candidates<'a, A> {
    /// Sorts and deduplicates `candidates` by node.
    pub fn new(candidates: impl IntoIterator<Item = (A, &'a NodeId, &'a Label)>) -> Self {
        let mut sorted: Vec<(A, &NodeId, &Label)> = candidates.into_iter().collect();
        sorted.sort_by(|a, b| a.1.cmp(b.1));
        sorted.dedup_by(|a, b| a.1 == b.1);
        Candidates { sorted }
    }

    /// [`choose`]'s answer for `ask`: a scan in node order that stops once
    /// both sides are full.
    pub fn choose(&self, ask: &WitnessAsk) -> Vec<A> {
        let mut same = Vec::with_capacity(WITNESSES_PER_SIDE);
        let mut other = Vec::with_capacity(WITNESSES_PER_SIDE);
        for (agent, node, zone) in &self.sorted {
            if **node == ask.node {
                continue;
            }
            let side = if **zone == ask.zone {
                &mut same
            } else {
                &mut other
            };
            if side.len() < WITNESSES_PER_SIDE {
                side.push(*agent);
            }
            if same.len() == WITNESSES_PER_SIDE && other.len() == WITNESSES_PER_SIDE {
                break;
            }
        }
        same.extend(other);
        same
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(s: &str) -> NodeId {
        NodeId::new(s).unwrap()
    }

    fn label(s: &str) -> Label {
        Label::new(s).unwrap()
    }

    #[test]
    fn witnesses_come_from_both_sides_of_the_zone_line() {
        let ask = WitnessAsk {
            node: node("n1"),
            epoch: AgentEpoch(1),
            zone: label("z1"),
            addresses: Vec::new(),
        };
        let nodes: Vec<(u32, NodeId, Label)> = vec![
            (1, node("n1"), label("z1")),
            (2, node("n2"), label("z1")),
            (3, node("n3"), label("z1")),
            (4, node("n4"), label("z1")),
            (5, node("n5"), label("z1")),
            (6, node("m1"), label("z2")),
            (7, node("m2"), label("z3")),
        ];
        let chosen = choose(&ask, nodes.iter().rev().map(|(a, n, z)| (*a, n, z)));
        assert_eq!(chosen, [2, 3, 4, 6, 7], "never n1 itself, three of z1");
        // No candidate: nobody to ask.
        assert!(choose::<u32>(&ask, []).is_empty());
    }
}
