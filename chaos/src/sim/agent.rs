//! The agents' side of the simulated region. Each agent is the binary's
//! own state machine ([`AgentState`]) and its own endpoint view: this file
//! feeds the machine its inputs (messages and answers from the arbiter,
//! the session's start and end, probe results, gossip verdicts, the
//! instances' calls of the local API, wake-ups) and carries its outputs
//! (session messages and requests with their latency, probes, views
//! published to the data plane, timers). It decides nothing the binary's
//! machine decides; it plays the network and the instances.

use std::collections::VecDeque;

use rand::RngExt;
use rollcall_gossip::MembershipEvent;
use rollcall_leases::protocol::{ServiceUpdate, SessionDown, SessionUp};
use rollcall_leases::{
    AgentEpoch, CatalogId, LeaseId, NodeId, Revision, ServiceKey, State, Version,
};
use rollcall_node::agent_state::{AgentState, Call, Caller, Input, Output, SessionId};
use rollcall_node::api_types::ValidRegistration;
use rollcall_node::carry::carry;

use super::world::*;

mod carry;
use carry::SimCarry;

impl World {
    /// Agent `a`'s process starts: its machine is built from its cache and
    /// registrations, and connects.
    pub(super) fn start_agent(&mut self, a: u32) {
        let Some(restored) = self.agents[a as usize].restored.take() else {
            return;
        };
        let mut settings = self.agent_settings.clone();
        let agent = &self.agents[a as usize];
        settings.node = agent.node.clone();
        settings.zone = self.zone_labels[agent.zone as usize].clone();
        settings.epoch = agent.epoch;
        let now_ms = self.now_ms();
        settings.started_ms = now_ms;
        let mut out = Vec::new();
        let mut machine = AgentState::new(settings, restored, now_ms, &mut self.rng, &mut out);
        // Thousands of agents run here and their traffic is sampled: a view
        // is built when it is read (or when a publication would forget
        // something), not at every change.
        machine.defer_publications();
        self.agents[a as usize].machine = Some(machine);
        self.carry_agent(a, out);
    }

    /// One input for agent `a`'s machine, at the current time; what it
    /// asks for that this driver answers at once (saves, probes) goes back
    /// in before this returns.
    pub(super) fn feed(&mut self, a: u32, input: Input) {
        let mut inputs = VecDeque::from([input]);
        while let Some(input) = inputs.pop_front() {
            let now_ms = self.now_ms();
            let agent = &mut self.agents[a as usize];
            if agent.dead {
                return;
            }
            let Some(machine) = agent.machine.as_mut() else {
                return;
            };
            let mut out = Vec::new();
            machine.handle(input, now_ms, &mut self.rng, &mut out);
            inputs.extend(self.carry_agent(a, out));
        }
    }

    /// Carries agent `a`'s outputs; returns the inputs they answer at once.
    pub(super) fn carry_agent(&mut self, a: u32, out: Vec<Output>) -> Vec<Input> {
        let now_ms = self.now_ms();
        let mut to = SimCarry {
            world: self,
            a,
            now_ms,
            back: Vec::new(),
        };
        carry(out, &mut to);
        to.back
    }

    /// The global number of the machine's session `session`, if current.
    fn global_session(&self, a: u32, session: SessionId) -> Option<u64> {
        let agent = &self.agents[a as usize];
        agent.session.filter(|(m, _)| *m == session).map(|(_, g)| g)
    }

    /// A message on agent `a`'s session stream: keep-alives and renewals
    /// are heard on arrival (the latency is far below any silence
    /// threshold), acknowledgements reach the distributor, subscriptions
    /// arrive in order.
    fn send_up(&mut self, a: u32, session: SessionId, message: SessionUp) {
        let Some(g) = self.global_session(a, session) else {
            return;
        };
        if !self.link_up(a) {
            self.watch_silence(a, g);
        }
        if let SessionUp::Ack { service, revision } = &message {
            // The agent applied this revision: what leave and crash times
            // are measured by.
            let s = self.service_index[service];
            self.applied(a, s, *revision);
        }
        match message {
            SessionUp::Subscribe { service, have, .. } => {
                if !self.link_up(a) {
                    return;
                }
                let s = self.service_index[&service];
                let latency = self.arbiter_latency();
                let at = self.up_arrival(a, latency);
                self.at(
                    at,
                    Ev::Subscribe {
                        session: g,
                        subs: vec![(s, have)],
                    },
                );
            }
            message => {
                self.counters.keepalives += u64::from(matches!(message, SessionUp::Keepalive));
                self.session_message(a, g, message);
            }
        }
    }

    /// A local API call by one of agent `a`'s instances.
    fn call(&mut self, a: u32, op: Call) {
        let agent = &mut self.agents[a as usize];
        agent.next_call += 1;
        let call = agent.next_call;
        self.feed(a, Input::Call { call, op });
    }

    /// What a simulated instance registers.
    fn registration(&self, k: u32) -> ValidRegistration {
        let inst = &self.insts[k as usize];
        let agent = &self.agents[inst.agent as usize];
        ValidRegistration {
            service: self.services[inst.service as usize].clone(),
            instance_id: inst.id.clone(),
            address: agent_ip(inst.agent),
            port: inst.port,
            zone: Some(self.zone_labels[agent.zone as usize].clone()),
            version: inst.version.clone(),
            weight: rollcall_leases::Weight::DEFAULT,
            labels: Vec::new(),
            checks: Some(if inst.next_heartbeat_ms.is_some() {
                self.ttl_checks.clone()
            } else {
                self.checks.clone()
            }),
        }
    }

    pub(super) fn replace(&mut self, old: u32, drain_ms: u64) {
        let (agent, service, alive, leaving) = {
            let i = &self.insts[old as usize];
            (i.agent, i.service, i.alive, i.leaving)
        };
        // An instance whose agent has not started yet is not replaced: it
        // could not reach its agent's API.
        let agent_up = {
            let a = &self.agents[agent as usize];
            !a.dead && a.machine.is_some()
        };
        if !alive || leaving || !agent_up {
            return;
        }
        self.counters.replaced += 1;
        self.insts[old as usize].leaving = true;
        let id = self.insts[old as usize].id.clone();
        if drain_ms > 0 {
            self.call(
                agent,
                Call::Drain {
                    instance: id,
                    generation: None,
                    propagated: false,
                    caller: Caller::Operator,
                },
            );
            self.after(drain_ms * 1_000, Ev::StopOld { inst: old });
        } else {
            self.insts[old as usize].alive = false;
            self.agents[agent as usize].instances.retain(|&i| i != old);
            self.call(
                agent,
                Call::Deregister {
                    instance: id,
                    generation: None,
                    caller: Caller::Operator,
                },
            );
        }
        // The new instance on the same node, behind its readiness check.
        let k = self.insts.len() as u32;
        self.deploy_seq += 1;
        let port = 40_000 + (self.deploy_seq % 20_000) as u16;
        let now_ms = self.now_ms();
        let heartbeats = self.heartbeating[service as usize];
        let next_heartbeat_ms =
            heartbeats.then(|| now_ms + self.rng.random_range(0..self.sc.heartbeat.interval_ms));
        let version = Version::new("v2").expect("valid");
        let inst = Inst::new(k, service, agent, port, version, next_heartbeat_ms);
        self.insts.push(inst);
        self.agents[agent as usize].instances.push(k);
        let registration = self.registration(k);
        self.call(
            agent,
            Call::Register {
                registration,
                caller: Caller::Operator,
            },
        );
    }

    /// A drained instance's process stops; its deregistration follows.
    pub(super) fn stop_old(&mut self, inst: u32) {
        let agent = self.insts[inst as usize].agent;
        if self.agents[agent as usize].dead {
            return;
        }
        self.insts[inst as usize].alive = false;
        self.agents[agent as usize].instances.retain(|&i| i != inst);
        let instance = self.insts[inst as usize].id.clone();
        self.call(
            agent,
            Call::Deregister {
                instance,
                generation: None,
                caller: Caller::Operator,
            },
        );
    }

    /// The heartbeating instances of agent `a` send what is due.
    pub(super) fn heartbeats(&mut self, a: u32) {
        self.after(TICK_MS * 1_000, Ev::Heartbeats(a));
        if self.agents[a as usize].machine.is_none() {
            return;
        }
        let now_ms = self.now_ms();
        let interval = self.sc.heartbeat.interval_ms;
        let instances = self.agents[a as usize].instances.clone();
        for k in instances {
            let inst = &mut self.insts[k as usize];
            if !inst.alive || inst.next_heartbeat_ms.is_none_or(|t| t > now_ms) {
                continue;
            }
            inst.next_heartbeat_ms = Some(now_ms + interval);
            self.counters.heartbeats += 1;
            let instance = inst.id.clone();
            self.call(
                a,
                Call::Heartbeat {
                    instance,
                    generation: None,
                    caller: Caller::Operator,
                },
            );
        }
    }

    /// Pauses agent `a` for `pause_ms`, or, if it is paused already, the
    /// next agent that is not: a scenario's pauses are each `pause_ms`
    /// long, never two run together into one longer stall.
    pub(super) fn pause(&mut self, a: u32, pause_ms: u64) {
        let n = self.agents.len() as u32;
        let Some(a) = (0..n).map(|i| (a + i) % n).find(|&b| {
            !self.agents[b as usize].dead && self.agents[b as usize].paused_until <= self.now
        }) else {
            return;
        };
        let agent = &mut self.agents[a as usize];
        self.counters.pauses += 1;
        let until = self.now + pause_ms * 1_000;
        agent.paused_until = agent.paused_until.max(until);
        let (zone, index) = (agent.zone as usize, agent.zone_index);
        self.zones[zone].pause(index, pause_ms);
    }

    // ----- the link -----

    pub(super) fn cut(&self, a: u32) -> bool {
        self.cut_zones.contains(&self.agents[a as usize].zone)
    }

    /// Whether a message between agent `a` and its replica gets through.
    pub(super) fn link_up(&self, a: u32) -> bool {
        let agent = &self.agents[a as usize];
        self.arbs[agent.replica].up && !self.cut(a) && !agent.dead
    }

    /// The machine asks for session `session` with the replica at
    /// `address`.
    fn connect(&mut self, a: u32, session: SessionId, address: &str) {
        self.next_session += 1;
        let g = self.next_session;
        let r = self.replica_at(address).unwrap_or(0);
        let agent = &mut self.agents[a as usize];
        agent.connecting = Some((session, g));
        agent.replica = r;
        let latency = self.arbiter_latency();
        let connect_timeout = self.agent_config.connect_timeout_ms * 1_000;
        if !self.arbs[r].up {
            if self.arbs[r].silent {
                // Nothing answers: given up at the connect timeout.
                self.after(connect_timeout, Ev::ConnectFailed(a));
            } else {
                // Refused after a round trip.
                self.after(2 * latency, Ev::ConnectFailed(a));
            }
            return;
        }
        if self.cut(a) {
            // The handshake's packets are lost; QUIC sends them again
            // until the agent's connect timeout.
            let deadline = self.now + connect_timeout;
            self.after(
                HANDSHAKE_RETRY_MS * 1_000,
                Ev::Handshake { agent: a, deadline },
            );
            return;
        }
        // Handshake (one round trip) then Hello.
        self.after(
            3 * latency,
            Ev::Hello {
                agent: a,
                session: g,
            },
        );
    }

    /// A handshake's packets are sent again: through if the path is back,
    /// given up at the deadline.
    pub(super) fn handshake(&mut self, a: u32, deadline: Time) {
        let Some((_, g)) = self.agents[a as usize].connecting else {
            return;
        };
        let r = self.agents[a as usize].replica;
        if !self.arbs[r].up || (self.cut(a) && self.now >= deadline) {
            self.connect_failed(a);
        } else if !self.cut(a) {
            let latency = self.arbiter_latency();
            self.after(
                3 * latency,
                Ev::Hello {
                    agent: a,
                    session: g,
                },
            );
        } else {
            self.after(
                HANDSHAKE_RETRY_MS * 1_000,
                Ev::Handshake { agent: a, deadline },
            );
        }
    }

    /// The attempt got no session.
    pub(super) fn connect_failed(&mut self, a: u32) {
        if let Some((session, _)) = self.agents[a as usize].connecting.take() {
            self.feed(
                a,
                Input::SessionEnded {
                    session,
                    reason: "no session".into(),
                },
            );
        }
    }

    /// The arbiter closed session `g`, or it timed out.
    pub(super) fn closed(&mut self, a: u32, g: u64) {
        let agent = &mut self.agents[a as usize];
        let ours = |s: Option<(SessionId, u64)>| s.filter(|(_, x)| *x == g).map(|(m, _)| m);
        let Some(session) = ours(agent.session).or(ours(agent.connecting)) else {
            return;
        };
        agent.session = None;
        agent.connecting = None;
        self.feed(
            a,
            Input::SessionEnded {
                session,
                reason: "the arbiter closed the session".into(),
            },
        );
    }

    /// The arbiter's Welcome on session `g`: the lease, and the catalog
    /// and revision it names.
    pub(super) fn welcome(
        &mut self,
        a: u32,
        g: u64,
        lease: LeaseId,
        revision: Revision,
        catalog: Option<CatalogId>,
    ) {
        let now_ms = self.now_ms();
        let agent = &mut self.agents[a as usize];
        let Some((session, _)) = agent.connecting.filter(|(_, x)| *x == g) else {
            return;
        };
        agent.connecting = None;
        agent.session = Some((session, g));
        agent.welcomed += 1;
        self.counters.sessions_moved += u64::from(agent.welcomed > 1);
        if self.outage.is_some_and(|(_, end)| now_ms >= end) && !agent.reconnected_after_outage {
            agent.reconnected_after_outage = true;
            agent.snapshots_since_outage = 0;
        }
        self.counters.reconnects += 1;
        self.feed(
            a,
            Input::Connected {
                session,
                lease,
                ttl_ms: self.arbiter_config.lease.ttl_ms,
                revision,
                catalog,
            },
        );
    }

    pub(super) fn update(&mut self, a: u32, g: u64, updates: Vec<ServiceUpdate>) {
        let Some((session, _)) = self.agents[a as usize].session.filter(|(_, x)| *x == g) else {
            return;
        };
        for update in &updates {
            if matches!(update, ServiceUpdate::Snapshot(_)) {
                self.counters.snapshots_applied += 1;
                self.agents[a as usize].snapshots_since_outage += 1;
            }
        }
        self.feed(
            a,
            Input::Message {
                session,
                message: SessionDown::Update(updates),
            },
        );
    }

    /// Another arbiter message (regions, a refusal) reaches agent `a` on
    /// session `g`.
    pub(super) fn message_down(&mut self, a: u32, g: u64, message: SessionDown) {
        let Some((session, _)) = self.agents[a as usize].session.filter(|(_, x)| *x == g) else {
            return;
        };
        self.feed(a, Input::Message { session, message });
    }

    /// The arbiter's witness question about `node` reaches agent `a` on
    /// session `g`.
    pub(super) fn witness_asked(
        &mut self,
        a: u32,
        g: u64,
        node: NodeId,
        epoch: AgentEpoch,
        addresses: Vec<std::net::SocketAddr>,
    ) {
        let Some((session, _)) = self.agents[a as usize].session.filter(|(_, x)| *x == g) else {
            return;
        };
        self.feed(
            a,
            Input::Message {
                session,
                message: SessionDown::Witness {
                    node,
                    epoch,
                    addresses,
                },
            },
        );
    }

    /// Agent `a`'s replica died with its host: nothing was heard on
    /// session `g` for the idle timeout.
    pub(super) fn session_lost(&mut self, a: u32, g: u64) {
        if self.agents[a as usize].session.is_some_and(|(_, x)| x == g) {
            self.closed(a, g);
        }
    }

    /// A partition's idle timeout: the replica's end of session `g`
    /// closes, and the agent's too if it still held it (an agent that
    /// gave up on it at its silence check closed its end before).
    pub(super) fn idle_check(&mut self, a: u32, g: u64) {
        let held = self.agents[a as usize].session.is_some_and(|(_, x)| x == g);
        if held && !self.cut(a) {
            // Healed in time: the session lives on.
            return;
        }
        self.drop_session(g);
        if held {
            self.closed(a, g);
        }
    }

    /// Agent `a` sent on session `g` while nothing gets through: unless a
    /// check is pending, it ends the session if nothing comes back within
    /// `agent.arbiter_silence_ms` (the shipped session actor's watch; the
    /// actor's 50 ms second look before it decides, for a datagram not
    /// read yet, is not modelled: nothing here arrives unread).
    fn watch_silence(&mut self, a: u32, g: u64) {
        if self.agents[a as usize].silence_watch == Some(g) {
            return;
        }
        self.agents[a as usize].silence_watch = Some(g);
        let due = self.now + self.agent_config.arbiter_silence_ms * 1_000;
        self.at(
            due,
            Ev::ArbiterSilent {
                agent: a,
                session: g,
                due,
            },
        );
    }

    /// Agent `a`'s silence check of session `g` is due: the session ends
    /// unless something got through meanwhile (the path healed, so the
    /// replica's acknowledgement arrived) or the check ran late.
    pub(super) fn arbiter_silent(&mut self, a: u32, g: u64, due: Time) {
        let agent = &mut self.agents[a as usize];
        if agent.silence_watch == Some(g) {
            agent.silence_watch = None;
        }
        if self.now > due + SILENCE_CHECK_LATE_MS * 1_000 || self.link_up(a) {
            return;
        }
        self.counters.silent_arbiters += 1;
        self.closed(a, g);
    }

    pub(super) fn gossip_event(&mut self, zone: usize, observer: usize, event: MembershipEvent) {
        let a = self.zone_members[zone][observer];
        match event {
            MembershipEvent::Down(id) => {
                let Some(node) = parse_node(id.node.as_str()) else {
                    return;
                };
                self.counters.gossip_down_events += 1;
                if !self.agents[node as usize].dead {
                    self.counters.gossip_false_downs += 1;
                }
                self.hash(&[0xd0, u64::from(a), u64::from(node), ms(self.now)]);
                self.feed(
                    a,
                    Input::PeerDown {
                        node: id.node,
                        epoch: id.epoch,
                    },
                );
            }
            MembershipEvent::Up(id) | MembershipEvent::Rejoined(id) => {
                self.feed(a, Input::PeerUp { node: id.node });
            }
            _ => {}
        }
    }

    /// Whether agent `a` holds instance `k`'s registration as the catalog
    /// does: same generation, and READY when its checks say so.
    pub(super) fn held_as_registered(&self, k: u32) -> bool {
        let inst = &self.insts[k as usize];
        let Some(machine) = self.agents[inst.agent as usize].machine.as_ref() else {
            return false;
        };
        let local = machine
            .registrations()
            .get(&inst.id)
            .and_then(|l| l.generation);
        match (local, self.catalog().instance(&inst.id)) {
            (Some(g), Some(record)) => {
                record.generation == g
                    && (machine.health_state(&inst.id) != Some(State::Ready)
                        || record.state == State::Ready)
            }
            _ => false,
        }
    }
}

impl Agent {
    /// Publishes the machine's view of `key` now.
    pub(super) fn publish(&self, key: &ServiceKey, now_ms: u64) {
        if let Some(published) = self.machine.as_ref().and_then(|m| m.published(key)) {
            self.views.publish(published, now_ms);
        }
    }

    /// Publishes `key`'s view if it changed since it was last published.
    pub(super) fn publish_pending(&mut self, key: &ServiceKey, now_ms: u64) {
        if self.unpublished.remove(key) {
            self.publish(key, now_ms);
        }
    }

    /// Publishes every view that changed since it was last published.
    pub(super) fn publish_all(&mut self, now_ms: u64) {
        for key in std::mem::take(&mut self.unpublished) {
            self.publish(&key, now_ms);
        }
    }
}
