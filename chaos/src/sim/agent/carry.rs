//! The simulator as an agent machine's driver (`Carry`): what the binary's
//! actors do with the machine's outputs, done on the virtual clock.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use rollcall_leases::protocol::{Request, SessionUp};
use rollcall_leases::{AgentEpoch, Generation, InstanceId, NodeId, ServiceKey};
use rollcall_node::agent_state::{CallId, Input, Refusal, Reply, RequestId, SaveId, SessionId};
use rollcall_node::carry::Carry;
use rollcall_node::failover::Regions;
use rollcall_node::health::ProbeTask;
use rollcall_node::view::Published;

use super::super::world::*;

/// The simulator as agent `a`'s driver: the network with its latency, the
/// instances, the data plane's view, the virtual clock.
pub(super) struct SimCarry<'w> {
    pub(super) world: &'w mut World,
    pub(super) a: u32,
    pub(super) now_ms: u64,
    /// Inputs answered at once (saves, probes, witness connects).
    pub(super) back: Vec<Input>,
}

impl Carry for SimCarry<'_> {
    fn connect(&mut self, session: SessionId, address: String) {
        self.world.connect(self.a, session, &address);
    }

    fn close(&mut self, session: SessionId, _reason: String) {
        let w = &mut *self.world;
        let agent = &mut w.agents[self.a as usize];
        let ours = |s: Option<(SessionId, u64)>| s.filter(|(m, _)| *m == session);
        if let Some((_, g)) = ours(agent.session).or(ours(agent.connecting)) {
            agent.session = None;
            agent.connecting = None;
            w.drop_session(g);
        }
    }

    fn send(&mut self, session: SessionId, message: SessionUp) {
        self.world.send_up(self.a, session, message);
    }

    fn request(&mut self, session: SessionId, request: RequestId, body: Request) {
        let (w, a) = (&mut *self.world, self.a);
        let Some(g) = w.global_session(a, session) else {
            return;
        };
        if w.link_up(a) {
            let latency = w.arbiter_latency();
            w.after(
                latency,
                Ev::Request {
                    agent: a,
                    session: g,
                    request,
                    body,
                },
            );
        }
    }

    fn reply(&mut self, _call: CallId, _reply: Result<Reply, Refusal>) {}

    fn save_registrations(&mut self, save: SaveId, _bytes: Vec<u8>) {
        self.back.push(Input::Saved {
            save,
            result: Ok(()),
        });
    }

    fn witness(&mut self, node: NodeId, epoch: AgentEpoch, _addresses: Vec<SocketAddr>) {
        // A silent node's endpoints answer a connect while the node lives
        // (the simulated network cuts nodes off the arbiter only, never off
        // each other).
        let reachable = parse_node(node.as_str())
            .and_then(|b| self.world.agents.get(b as usize))
            .is_some_and(|b| !b.dead);
        self.back.push(Input::Reached {
            node,
            epoch,
            reachable,
        });
    }

    fn probe(&mut self, instance: InstanceId, generation: Option<Generation>, task: ProbeTask) {
        let w = &mut *self.world;
        w.counters.probes += 1;
        let alive = parse_inst(instance.as_str())
            .and_then(|k| w.insts.get(k as usize))
            .is_some_and(|i| i.alive);
        self.back.push(Input::Probed {
            instance,
            generation,
            which: task.which,
            passed: alive,
            detail: if alive { "connected" } else { "refused" }.into(),
        });
    }

    fn wake_at(&mut self, at_ms: u64) {
        let (w, a) = (&mut *self.world, self.a);
        w.agents[a as usize].wake = Some(at_ms);
        let at = (at_ms * 1_000).max(w.now);
        w.at(at, Ev::AgentWake { agent: a, at_ms });
    }

    fn publish(&mut self, published: Published) {
        self.world.agents[self.a as usize]
            .views
            .publish(published, self.now_ms);
    }

    fn changed(&mut self, key: ServiceKey) {
        let agent = &mut self.world.agents[self.a as usize];
        if agent.views.remembers_failures(&key) {
            // Publishing forgets failures of endpoints gone: at once, as
            // the real agent does.
            agent.unpublished.remove(&key);
            agent.publish(&key, self.now_ms);
        } else {
            agent.unpublished.insert(key);
        }
    }

    fn publish_down(&mut self, nodes: BTreeSet<NodeId>) {
        let (w, a) = (&mut *self.world, self.a);
        let crashed: Vec<u32> = nodes
            .iter()
            .filter_map(|n| parse_node(n.as_str()))
            .filter(|n| w.crashes.contains_key(n))
            .collect();
        w.agents[a as usize].views.set_down(nodes);
        // The agent's own gossip verdict keeps the node out of its routing
        // now.
        for node in crashed {
            w.eject(node, a, None);
        }
    }

    fn publish_alive(&mut self, nodes: BTreeSet<NodeId>) {
        self.world.agents[self.a as usize].views.set_alive(nodes);
    }

    fn publish_connected(&mut self, up: bool) {
        self.world.agents[self.a as usize].views.set_connected(up);
    }

    fn publish_regions(&mut self, regions: Regions) {
        self.world.agents[self.a as usize]
            .views
            .set_regions(regions);
    }

    fn lift_ejections(&mut self, node: NodeId) {
        let agent = &mut self.world.agents[self.a as usize];
        agent.publish_all(self.now_ms);
        agent.views.lift_node(&node);
    }
}
