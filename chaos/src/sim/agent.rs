//! The agents' side of the simulated region: each agent's session with
//! the arbiter (connect, handshake retries, keep-alives; reconnect backoff
//! and renewal timing from the agent's own [`rollcall_node::link`]), its
//! real [`Sync`] fed with the updates that arrive, its instances'
//! readiness probes through the real [`InstanceHealth`], its writes (kept
//! pending while cut off, sent in order, each instance's later writes
//! waiting for its generation) and its gossip verdicts (the agent's own
//! [`rollcall_node::link::DownVerdicts`]: reported to the arbiter, out of
//! routing while cut off or until the arbiter answers, R7).
//!
//! It decides nothing the binaries' state machines decide; it carries
//! their inputs and outputs, and keeps each agent's writes in order.

use std::net::SocketAddr;

use rand::RngExt;
use rollcall_gossip::MembershipEvent;
use rollcall_leases::leader::agent_principal;
use rollcall_leases::protocol::ServiceUpdate;
use rollcall_leases::{AgentEpoch, Generation, State, Version};
use rollcall_node::health::{HealthEvent, InstanceHealth};
use rollcall_node::link::{renew_after_ms, resend_health};
use rollcall_node::sync::SyncOut;

use super::world::*;

impl World {
    pub(super) fn replace(&mut self, old: u32, drain_ms: u64) {
        let (agent, service, alive, leaving) = {
            let i = &self.insts[old as usize];
            (i.agent, i.service, i.alive, i.leaving)
        };
        if !alive || leaving || self.agents[agent as usize].dead {
            return;
        }
        self.counters.replaced += 1;
        self.insts[old as usize].leaving = true;
        if drain_ms > 0 {
            self.write(
                agent,
                Write {
                    inst: old,
                    kind: WriteKind::Drain,
                },
            );
            self.after(drain_ms * 1_000, Ev::StopOld { inst: old });
        } else {
            self.insts[old as usize].alive = false;
            self.agents[agent as usize].instances.retain(|&i| i != old);
            self.write(
                agent,
                Write {
                    inst: old,
                    kind: WriteKind::Deregister,
                },
            );
        }
        // The new instance on the same node, behind its readiness check.
        let k = self.insts.len() as u32;
        self.deploy_seq += 1;
        let port = 40_000 + (self.deploy_seq % 20_000) as u16;
        let target = SocketAddr::new(agent_ip(agent), port);
        let now_ms = self.now_ms();
        let heartbeats = self.heartbeating[service as usize];
        let checks = if heartbeats {
            &self.ttl_checks
        } else {
            &self.checks
        };
        let health = InstanceHealth::new(Some(checks), target, now_ms, &mut self.rng);
        let next_heartbeat_ms =
            heartbeats.then(|| now_ms + self.rng.random_range(0..self.sc.heartbeat.interval_ms));
        let version = Version::new("v2").expect("valid");
        let inst = Inst::new(k, service, agent, port, version, health, next_heartbeat_ms);
        self.insts.push(inst);
        self.agents[agent as usize].instances.push(k);
        self.write(
            agent,
            Write {
                inst: k,
                kind: WriteKind::Register,
            },
        );
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

    // ----- agents -----

    pub(super) fn cut(&self, a: u32) -> bool {
        self.cut_zones.contains(&self.agents[a as usize].zone)
    }

    /// Whether a message between agent `a` and the arbiter gets through.
    pub(super) fn link_up(&self, a: u32) -> bool {
        self.arb.up && !self.cut(a) && !self.agents[a as usize].dead
    }

    pub(super) fn agent_tick(&mut self, a: u32) {
        let now_ms = self.now_ms();
        self.after(TICK_MS * 1_000, Ev::AgentTick(a));
        // Heartbeats the instances sent, then every check that is due.
        let instances = self.agents[a as usize].instances.clone();
        let interval = self.sc.heartbeat.interval_ms;
        for k in instances {
            let inst = &mut self.insts[k as usize];
            if !inst.alive {
                continue;
            }
            if inst.next_heartbeat_ms.is_some_and(|t| t <= now_ms) {
                inst.health.heartbeat(now_ms);
                inst.next_heartbeat_ms = Some(now_ms + interval);
                self.counters.heartbeats += 1;
            }
            if inst.health.next_due_ms().is_none_or(|d| d > now_ms) {
                continue;
            }
            let due = inst.health.due(now_ms, &mut self.rng);
            let mut events = due.events;
            for probe in due.probes {
                self.counters.probes += 1;
                events.extend(inst.health.result(
                    probe.which,
                    true,
                    "connected",
                    now_ms,
                    &mut self.rng,
                ));
            }
            for event in events {
                let inst = &mut self.insts[k as usize];
                let kind = match event {
                    HealthEvent::Ready => WriteKind::Ready,
                    HealthEvent::Unhealthy { .. } => {
                        self.counters.unhealthy += 1;
                        WriteKind::Unhealthy
                    }
                    _ => continue,
                };
                if inst.generation.is_some() {
                    self.write(a, Write { inst: k, kind });
                } else {
                    inst.ready_pending = kind == WriteKind::Ready;
                }
            }
        }
        // Session keep-alive and lease renewal.
        let agent = &mut self.agents[a as usize];
        let Some(_session) = agent.session else {
            return;
        };
        let keepalive = now_ms >= agent.next_keepalive_ms;
        let renew = now_ms >= agent.next_renew_ms;
        if keepalive {
            agent.next_keepalive_ms = now_ms + self.agent_config.keepalive_ms;
        }
        if renew {
            let after = renew_after_ms(self.arbiter_config.lease.ttl_ms, &mut self.rng);
            self.agents[a as usize].next_renew_ms = now_ms + after;
        }
        if (keepalive || renew) && self.link_up(a) {
            // Heard on arrival; recorded now, the latency is far below
            // any silence threshold.
            let arrive = now_ms + 1;
            let agent = &self.agents[a as usize];
            self.arb.leader.heard(&agent.node, arrive);
            self.counters.keepalives += u64::from(keepalive);
            if renew {
                self.counters.renewals += 1;
                // The core's renewal: the leader memory renews the lease,
                // and reinstates one the guard holds.
                let arb = &mut self.arb;
                let renewal = arb.leader.renew(
                    arb.catalog.leases_mut(),
                    &agent.node,
                    agent.epoch,
                    arrive,
                    &agent_principal(&agent.node),
                );
                match renewal {
                    Ok(Some(reinstate)) => self.propose(reinstate, Then::Nothing),
                    Ok(None) => {}
                    Err(_) => {
                        // The core refuses the session (the lease ended,
                        // say by a down verdict): the agent reconnects and
                        // is granted a new one.
                        self.counters.renewals_refused += 1;
                        if let Some(session) = self.agents[a as usize].session {
                            self.drop_session(session);
                            let latency = self.arbiter_latency();
                            self.after(latency, Ev::Closed { agent: a, session });
                        }
                    }
                }
            }
        }
    }

    pub(super) fn connect(&mut self, a: u32) {
        let agent = &self.agents[a as usize];
        if agent.session.is_some() || agent.connecting.is_some() {
            return;
        }
        let latency = self.arbiter_latency();
        if !self.arb.up {
            // Refused after a round trip.
            self.after(2 * latency, Ev::ConnectFailed(a));
            return;
        }
        if self.cut(a) {
            // The handshake's packets are lost; QUIC sends them again
            // until the idle timeout.
            let deadline = self.now + IDLE_TIMEOUT_MS * 1_000;
            self.after(
                HANDSHAKE_RETRY_MS * 1_000,
                Ev::Handshake { agent: a, deadline },
            );
            return;
        }
        self.start_session(a, latency);
    }

    /// A handshake's packets are sent again: through if the path is back,
    /// given up at the deadline.
    pub(super) fn handshake(&mut self, a: u32, deadline: Time) {
        if !self.arb.up {
            self.reconnect_later(a);
        } else if !self.cut(a) {
            let latency = self.arbiter_latency();
            self.start_session(a, latency);
        } else if self.now >= deadline {
            self.reconnect_later(a);
        } else {
            self.after(
                HANDSHAKE_RETRY_MS * 1_000,
                Ev::Handshake { agent: a, deadline },
            );
        }
    }

    pub(super) fn start_session(&mut self, a: u32, latency: Time) {
        self.next_session += 1;
        let session = self.next_session;
        self.agents[a as usize].connecting = Some(session);
        // Handshake (one round trip) then Hello.
        self.after(3 * latency, Ev::Hello { agent: a, session });
    }

    pub(super) fn reconnect_later(&mut self, a: u32) {
        let agent = &mut self.agents[a as usize];
        agent.connecting = None;
        if agent.session.is_some() {
            return;
        }
        // The agent's own backoff: an attempt that got no session.
        let wait = agent.backoff.next_wait(0, &mut self.rng);
        self.after(wait * 1_000, Ev::Connect(a));
    }

    pub(super) fn disconnected(&mut self, a: u32) {
        let now_ms = self.now_ms();
        let agent = &mut self.agents[a as usize];
        let lasted = if agent.session.is_some() {
            now_ms.saturating_sub(agent.session_since_ms)
        } else {
            0
        };
        agent.session = None;
        agent.connecting = None;
        agent.writes_sent = 0;
        agent.sync.disconnected(now_ms);
        agent.downs.disconnected();
        // Cut off: this agent's gossip verdicts now count for its routing.
        let down: Vec<u32> = agent
            .downs
            .excluded(false)
            .iter()
            .filter_map(|n| parse_node(n.as_str()))
            .collect();
        for node in down {
            self.eject(node, a, None);
        }
        let agent = &mut self.agents[a as usize];
        let wait = agent.backoff.next_wait(lasted, &mut self.rng);
        self.after(wait * 1_000, Ev::Connect(a));
    }

    pub(super) fn welcome(&mut self, a: u32, session: u64) {
        let now_ms = self.now_ms();
        let agent = &mut self.agents[a as usize];
        if agent.connecting != Some(session) {
            return;
        }
        agent.connecting = None;
        agent.session = Some(session);
        agent.session_since_ms = now_ms;
        agent.next_keepalive_ms = now_ms + self.agent_config.keepalive_ms;
        agent.next_renew_ms =
            now_ms + renew_after_ms(self.arbiter_config.lease.ttl_ms, &mut self.rng);
        if self.outage.is_some_and(|(_, end)| now_ms >= end) && !agent.reconnected_after_outage {
            agent.reconnected_after_outage = true;
            agent.snapshots_since_outage = 0;
        }
        self.counters.reconnects += 1;
        let mut out = Vec::new();
        agent.sync.connected(&mut out);
        self.sync_out(a, out);
        // Pending writes, health verdicts the catalog does not hold, then
        // every down verdict held (as the agent's reconciliation does after
        // a reconnect; the catalog's list is its NodeInstances answer).
        self.flush_writes(a);
        self.resend_health(a);
        for (node, epoch) in self.agents[a as usize].downs.to_report() {
            if let Some(node) = parse_node(node.as_str()) {
                self.send_report(a, node, epoch);
            }
        }
    }

    /// The agent's own rule for health verdicts after a reconnect, over the
    /// catalog's records of its node.
    pub(super) fn resend_health(&mut self, a: u32) {
        if !self.link_up(a) {
            return;
        }
        let node = self.agents[a as usize].node.clone();
        let listed = self.arb.catalog.instances_on(&node);
        for (_, record) in listed {
            let Some(k) = parse_inst(record.instance_id.as_str()) else {
                continue;
            };
            let inst = &self.insts[k as usize];
            if !inst.alive || inst.leaving || inst.generation != Some(record.generation) {
                continue;
            }
            let pending = self.agents[a as usize].writes.iter().any(|w| w.inst == k);
            let wanted = inst.health.state();
            if resend_health(wanted, Some(record.state), pending) {
                let kind = if wanted == State::Ready {
                    WriteKind::Ready
                } else {
                    WriteKind::Unhealthy
                };
                self.write(a, Write { inst: k, kind });
            }
        }
    }

    pub(super) fn sync_out(&mut self, a: u32, out: Vec<SyncOut>) {
        let mut subs = Vec::new();
        for o in out {
            match o {
                SyncOut::Subscribe { service, have } => {
                    subs.push((self.service_index[&service], have));
                }
                SyncOut::Ack { service, revision } => {
                    let s = self.service_index[&service];
                    self.applied(a, s, revision);
                    if let Some(session) = self.agents[a as usize].session {
                        if self.link_up(a) && self.arb.sessions.contains_key(&session) {
                            self.heard(a);
                            self.arb.dist.ack(session, &service, revision);
                        }
                    }
                }
                SyncOut::Persist(_) | SyncOut::Forget(_) => {}
                SyncOut::RetryLater { service, base_ms } => {
                    let s = self.service_index[&service];
                    let jitter = self.rng.random_range(0..=base_ms);
                    self.after(
                        (base_ms + jitter) * 1_000,
                        Ev::Retry {
                            agent: a,
                            service: s,
                        },
                    );
                }
            }
        }
        if subs.is_empty() {
            return;
        }
        let Some(session) = self.agents[a as usize].session else {
            return;
        };
        if self.link_up(a) {
            let latency = self.arbiter_latency();
            let at = self.up_arrival(a, latency);
            self.at(at, Ev::Subscribe { session, subs });
        }
    }

    pub(super) fn update(&mut self, a: u32, session: u64, updates: Vec<ServiceUpdate>) {
        if self.agents[a as usize].session != Some(session) {
            return;
        }
        let now_ms = self.now_ms();
        let mut out = Vec::new();
        for update in updates {
            if matches!(update, ServiceUpdate::Snapshot(_)) {
                self.counters.snapshots_applied += 1;
                self.agents[a as usize].snapshots_since_outage += 1;
            }
            self.agents[a as usize]
                .sync
                .update(update, now_ms, &mut out);
        }
        self.sync_out(a, out);
    }

    pub(super) fn write(&mut self, a: u32, write: Write) {
        self.agents[a as usize].writes.push_back(write);
        self.flush_writes(a);
    }

    /// Sends every write not sent in this session whose instance's
    /// generation is known (a registration's later writes wait for it).
    pub(super) fn flush_writes(&mut self, a: u32) {
        let Some(session) = self.agents[a as usize].session else {
            return;
        };
        while self.agents[a as usize].writes_sent < self.agents[a as usize].writes.len() {
            let write = self.agents[a as usize].writes[self.agents[a as usize].writes_sent];
            let known = self.insts[write.inst as usize].generation.is_some();
            if write.kind != WriteKind::Register && !known {
                break;
            }
            self.agents[a as usize].writes_sent += 1;
            if self.link_up(a) {
                let latency = self.arbiter_latency();
                self.after(
                    latency,
                    Ev::WriteArrive {
                        agent: a,
                        session,
                        write,
                    },
                );
            }
            if write.kind == WriteKind::Register {
                // Later writes of this instance wait for its generation.
                break;
            }
        }
    }

    pub(super) fn write_reply(
        &mut self,
        a: u32,
        write: Write,
        result: Result<Option<Generation>, ()>,
    ) {
        let agent = &mut self.agents[a as usize];
        let Some(pos) = agent
            .writes
            .iter()
            .position(|w| w.inst == write.inst && w.kind == write.kind)
        else {
            return;
        };
        if pos < agent.writes_sent {
            agent.writes_sent -= 1;
        }
        agent.writes.remove(pos);
        if result.is_err() {
            self.counters.rejected_writes += 1;
            if write.kind == WriteKind::Register {
                // Nothing later about this instance can be sent.
                let writes = &mut self.agents[a as usize].writes;
                let before = writes.len();
                writes.retain(|w| w.inst != write.inst);
                self.counters.rejected_writes += (before - writes.len()) as u64;
            }
        }
        if let (WriteKind::Register, Ok(Some(generation))) = (write.kind, result) {
            let inst = &mut self.insts[write.inst as usize];
            inst.generation = Some(generation);
            if inst.ready_pending {
                inst.ready_pending = false;
                self.agents[a as usize].writes.push_back(Write {
                    inst: write.inst,
                    kind: WriteKind::Ready,
                });
            }
        }
        self.flush_writes(a);
    }

    pub(super) fn idle_check(&mut self, a: u32, session: u64) {
        if self.agents[a as usize].session != Some(session) || !self.cut(a) {
            return;
        }
        // Neither end heard the other for the idle timeout.
        self.drop_session(session);
        self.disconnected(a);
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
                let agent = &mut self.agents[a as usize];
                if agent.dead {
                    return;
                }
                // The agent's own verdict: out of its routing until the
                // arbiter answers the report (at once while cut off), and
                // reported now or after the next reconnect.
                agent.downs.down(id.node.clone(), id.epoch);
                let connected = agent.session.is_some();
                if agent.downs.excluded(connected).contains(&id.node) {
                    self.eject(node, a, None);
                }
                if connected {
                    self.send_report(a, node, id.epoch);
                }
            }
            MembershipEvent::Up(id) | MembershipEvent::Rejoined(id) => {
                self.agents[a as usize].downs.up(&id.node);
            }
            _ => {}
        }
    }

    pub(super) fn send_report(&mut self, a: u32, node: u32, epoch: AgentEpoch) {
        let Some(session) = self.agents[a as usize].session else {
            return;
        };
        if self.link_up(a) {
            let latency = self.arbiter_latency();
            self.after(
                latency,
                Ev::ReportDown {
                    reporter: a,
                    session,
                    node,
                    epoch,
                },
            );
        }
    }

    /// The arbiter answered agent `a`'s report on `node` (committed, or
    /// refused as a partition): from now on the catalog decides there.
    pub(super) fn down_answer(&mut self, a: u32, session: u64, node: u32) {
        let agent = &mut self.agents[a as usize];
        if agent.session != Some(session) {
            return;
        }
        let node = self.agents[node as usize].node.clone();
        self.agents[a as usize].downs.settled(node);
    }
}
