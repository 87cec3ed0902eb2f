//! What the agent makes of its zone's gossip (R4, R7): down verdicts are
//! reported to the arbiter and kept out of this agent's routing while it
//! is cut off or until the arbiter answers (`link::DownVerdicts`), and the
//! arbiter's witness questions about a silent node are answered with what
//! gossip holds of it and whether its endpoints accept a connection.

use std::collections::BTreeSet;

use rollcall_leases::protocol::{Request, SessionUp, MAX_WITNESS_ADDRESSES};
use rollcall_leases::{AgentEpoch, NodeId};

use super::{AgentState, Output, Purpose, Verdict};
use crate::link::DownVerdicts;

/// The zone's peers as gossip sees them.
pub(super) struct Peers {
    /// Down verdicts, reported or held.
    pub(super) downs: DownVerdicts,
    /// The peers gossip sees alive; `None` until gossip said anything.
    pub(super) alive: Option<BTreeSet<NodeId>>,
    /// The nodes kept out of routing must be published again.
    changed: bool,
    /// The nodes seen alive must be published again.
    alive_changed: bool,
}

impl Default for Peers {
    fn default() -> Self {
        Peers {
            downs: DownVerdicts::default(),
            alive: None,
            changed: false,
            // Published once at start: this node itself is alive.
            alive_changed: true,
        }
    }
}

impl Peers {
    /// The set kept out of routing may have changed.
    pub(super) fn changed(&mut self) {
        self.changed = true;
    }

    /// Whether it must be published again (once).
    pub(super) fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }

    /// The nodes seen alive, when they changed since last asked.
    pub(super) fn take_alive(&mut self) -> Option<BTreeSet<NodeId>> {
        std::mem::take(&mut self.alive_changed).then(|| self.alive.clone().unwrap_or_default())
    }

    /// The session ended: the arbiter's answers of that session no longer
    /// count.
    pub(super) fn disconnected(&mut self) {
        self.downs.disconnected();
        self.changed = true;
    }

    /// What gossip holds of `node`: alive, down, or nothing known.
    fn holds(&self, node: &NodeId) -> Option<bool> {
        match &self.alive {
            Some(alive) if alive.contains(node) => Some(true),
            _ if self.downs.nodes().any(|n| n == node) => Some(false),
            _ => None,
        }
    }
}

impl AgentState {
    /// The zone's gossip declared a peer down.
    pub(super) fn peer_down(&mut self, node: NodeId, epoch: AgentEpoch, out: &mut Vec<Output>) {
        if node == self.settings.node {
            return;
        }
        tracing::warn!(node = %node, epoch = %epoch, "gossip: peer down");
        self.peers.downs.down(node.clone(), epoch);
        self.peers.alive_changed |= self
            .peers
            .alive
            .get_or_insert_with(BTreeSet::new)
            .remove(&node);
        self.peers.changed();
        self.report_down(node, epoch, false, out);
    }

    /// The zone's gossip sees a peer (again).
    pub(super) fn peer_up(&mut self, node: NodeId, out: &mut Vec<Output>) {
        self.peers.alive_changed |= self
            .peers
            .alive
            .get_or_insert_with(BTreeSet::new)
            .insert(node.clone());
        if self.peers.downs.up(&node) {
            tracing::info!(node = %node, "gossip: peer up again");
            // The path to the node is back: the connect failures that
            // ejected its endpoints here were the partition's.
            out.push(Output::LiftEjections(node));
            self.peers.changed();
        }
    }

    /// Reports a down verdict to the arbiter; whether it was sent.
    pub(super) fn report_down(
        &mut self,
        node: NodeId,
        epoch: AgentEpoch,
        in_plan: bool,
        out: &mut Vec<Output>,
    ) -> bool {
        let body = Request::ReportDown {
            node: node.clone(),
            epoch,
        };
        self.link
            .request(body, Purpose::ReportDown { node, in_plan }, out)
    }

    /// The arbiter's answer to a down report; whether it was answered.
    pub(super) fn report_answered(&mut self, node: NodeId, verdict: Verdict) -> bool {
        match verdict {
            Verdict::Committed { .. } => {
                // The verdict reaches this agent's view in the catalog's
                // next delta, which may come after this answer (another
                // stream): the node stays out while gossip holds it down,
                // or it would be routed to again in between.
                tracing::info!(node = %node, "down verdict committed");
                return true;
            }
            Verdict::Refused(_, message) => {
                tracing::info!(node = %node, reason = %message, "down report not acted on");
            }
            Verdict::Unknown(e) => {
                tracing::warn!(node = %node, error = %e, "down report not sent");
                return false;
            }
        }
        self.peers.downs.settled(node);
        self.peers.changed();
        true
    }

    /// The arbiter's witness question about a silent node: answered from
    /// gossip at once when there is no address to try, else after the
    /// driver tried them (`Output::Witness`, then `Input::Reached`).
    pub(super) fn witness(
        &mut self,
        node: NodeId,
        epoch: AgentEpoch,
        addresses: Vec<std::net::SocketAddr>,
        out: &mut Vec<Output>,
    ) {
        if addresses.len() > MAX_WITNESS_ADDRESSES {
            tracing::warn!(
                node = %node,
                addresses = addresses.len(),
                "the arbiter asked about more addresses than a witness question holds; not answered"
            );
        } else if addresses.is_empty() {
            self.witnessed(node, epoch, None, out);
        } else {
            out.push(Output::Witness {
                node,
                epoch,
                addresses,
            });
        }
    }

    /// Answers the arbiter's witness question about `node` (R3, R4): what
    /// this agent's gossip holds of it, and whether its endpoints accepted
    /// a connection. Dropped when no session is up (the arbiter falls back
    /// to its own signal).
    pub(super) fn witnessed(
        &mut self,
        node: NodeId,
        epoch: AgentEpoch,
        reachable: Option<bool>,
        out: &mut Vec<Output>,
    ) {
        let Some(session) = self.link.up_session() else {
            return;
        };
        let gossip = self.peers.holds(&node);
        out.push(Output::Send {
            session,
            message: SessionUp::Witnessed {
                node,
                epoch,
                gossip,
                reachable,
            },
        });
    }
}
