//! The arbiter's side of the simulated region: the Raft group as one
//! ordered log committing a batch `commit_latency_ms` after it starts,
//! applied to the real [`rollcall_leases::Catalog`], and the real
//! [`rollcall_leases::distribution::Distributor`] whose sends are carried
//! with their codec size, transfer time and latency.
//!
//! Around them, the leader's memory as `leases/src/server/core.rs` keeps
//! it: session silence (`heard_at`, never earlier than the leader's
//! start), the two-signal rule for gossip down reports (`decide_downs`),
//! lease expiry proposals with the zone's silent count, purges, re-sends,
//! and a restart that extends every lease by one TTL. This mirrors the
//! core's policy; it is not a second catalog.

use std::collections::BTreeMap;

use rollcall_leases::distribution::{Distributor, Output};
use rollcall_leases::protocol::ServiceUpdate;
use rollcall_leases::{
    AgentEpoch, Applied, Command, Effect, Envelope, Generation, Label, Reason, Registration,
    Revision, Role, State, Weight,
};

use super::world::*;

impl World {
    // ----- arbiter -----

    pub(super) fn hello(&mut self, a: u32, session: u64) {
        if !self.link_up(a) {
            let latency = self.arbiter_latency();
            self.after(latency, Ev::Closed { agent: a, session });
            return;
        }
        self.arb.sessions.insert(session, a);
        self.arb.dist.connect(session);
        let now_ms = self.now_ms();
        self.arb.last_heard[a as usize] = Some(now_ms);
        let agent = &self.agents[a as usize];
        let env = Envelope {
            at_ms: now_ms,
            actor: principal(Role::Agent, agent.node.as_str()),
            command: Command::GrantLease {
                node: agent.node.clone(),
                epoch: agent.epoch,
                zone: self.zone_labels[agent.zone as usize].clone(),
                ttl_ms: self.arbiter_config.lease.ttl_ms,
            },
        };
        self.propose(env, Then::Welcome { agent: a, session });
    }

    pub(super) fn subscribe(&mut self, session: u64, subs: Vec<(u32, Option<Revision>)>) {
        let Some(&a) = self.arb.sessions.get(&session) else {
            return;
        };
        if !self.link_up(a) {
            return;
        }
        let now_ms = self.now_ms();
        let mut out = Vec::new();
        for (s, have) in subs {
            let key = self.services[s as usize].clone();
            self.arb
                .dist
                .subscribe(session, key, have, now_ms, &self.arb.catalog, &mut out);
        }
        self.carry(out);
    }

    pub(super) fn write_arrive(&mut self, a: u32, session: u64, write: Write) {
        if !self.arb.sessions.contains_key(&session) || !self.link_up(a) {
            return;
        }
        let now_ms = self.now_ms();
        self.arb.last_heard[a as usize] = Some(now_ms);
        let inst = &self.insts[write.inst as usize];
        let agent = &self.agents[a as usize];
        let transition = |to: State, why: &str| Command::Transition {
            instance_id: inst.id.clone(),
            generation: inst.generation.unwrap_or(Generation(0)),
            to,
            reason: Reason::new(why).expect("valid"),
        };
        let command = match write.kind {
            WriteKind::Register => Command::Register(Registration {
                instance_id: inst.id.clone(),
                service: self.services[inst.service as usize].clone(),
                node: agent.node.clone(),
                epoch: agent.epoch,
                address: agent_ip(a),
                port: inst.port,
                zone: Some(self.zone_labels[agent.zone as usize].clone()),
                version: inst.version.clone(),
                weight: Weight::DEFAULT,
                labels: Vec::new(),
                initial: State::Starting,
            }),
            WriteKind::Ready => transition(State::Ready, "readiness passed"),
            WriteKind::Drain => transition(State::Draining, "deploy"),
            WriteKind::Deregister => Command::Deregister {
                instance_id: inst.id.clone(),
                generation: inst.generation.unwrap_or(Generation(0)),
            },
        };
        let env = Envelope {
            at_ms: now_ms,
            actor: principal(Role::Agent, agent.node.as_str()),
            command,
        };
        self.propose(env, Then::Reply { agent: a, write });
    }

    pub(super) fn report_down(&mut self, reporter: u32, node: u32, epoch: AgentEpoch) {
        if !self.link_up(reporter) {
            return;
        }
        self.counters.down_reports += 1;
        let now_ms = self.now_ms();
        self.arb.last_heard[reporter as usize] = Some(now_ms);
        let reporter_id = self.agents[reporter as usize].node.clone();
        let held = self.arb.pending_downs.entry(node).or_insert(PendingDown {
            epoch,
            reporters: Vec::new(),
            reported_at: now_ms,
        });
        if !held.reporters.contains(&reporter_id)
            && held.reporters.len() < rollcall_leases::command::MAX_REPORTERS
        {
            held.reporters.push(reporter_id);
        }
        self.decide_downs();
    }

    /// When `node` was last heard, never earlier than the leader's start.
    pub(super) fn heard_at(&self, node: u32) -> u64 {
        self.arb.last_heard[node as usize]
            .map_or(self.arb.leader_since, |t| t.max(self.arb.leader_since))
    }

    /// The two signals of R4, as the arbiter's core settles them.
    pub(super) fn decide_downs(&mut self) {
        let now_ms = self.now_ms();
        let silence = self.arbiter_config.lease.silence_ms;
        let nodes: Vec<u32> = self.arb.pending_downs.keys().copied().collect();
        for node in nodes {
            let reported_at = self.arb.pending_downs[&node].reported_at;
            let heard_directly =
                self.arb.last_heard[node as usize].is_some_and(|t| t > reported_at);
            if heard_directly {
                self.arb.pending_downs.remove(&node);
                self.counters.down_reports_ignored += 1;
            } else if now_ms.saturating_sub(self.heard_at(node)) >= silence {
                let held = self.arb.pending_downs.remove(&node).expect("listed");
                let env = Envelope {
                    at_ms: now_ms,
                    actor: self.arb.me.clone(),
                    command: Command::NodeDown {
                        node: self.agents[node as usize].node.clone(),
                        epoch: held.epoch,
                        reporters: held.reporters,
                    },
                };
                self.propose(env, Then::Nothing);
            }
        }
    }

    pub(super) fn arbiter_tick(&mut self) {
        let sweep = self.arbiter_config.lease.sweep_interval_ms;
        self.after(sweep * 1_000, Ev::ArbiterTick);
        let held = self.arb.catalog.leases().held();
        self.counters.held_max = self.counters.held_max.max(held);
        if !self.arb.up {
            return;
        }
        let now_ms = self.now_ms();
        self.decide_downs();
        let due = self
            .arb
            .catalog
            .leases()
            .due(now_ms, self.arbiter_config.guard.max_hold_ms);
        if !due.is_empty() {
            let ttl = self.arbiter_config.lease.ttl_ms;
            // silent_in_zone, counted once per zone for this sweep.
            let silence = self.arbiter_config.lease.silence_ms;
            let mut silent: BTreeMap<Label, u32> = BTreeMap::new();
            for lease in self.arb.catalog.leases().sorted() {
                let a = parse_node(lease.node.as_str()).unwrap_or(0);
                if now_ms.saturating_sub(self.heard_at(a)) > silence {
                    *silent.entry(lease.zone.clone()).or_default() += 1;
                }
            }
            for (node, epoch) in due {
                let a = parse_node(node.as_str()).unwrap_or(0);
                if self
                    .arb
                    .expiring
                    .get(&a)
                    .is_some_and(|at| now_ms < at + ttl)
                {
                    continue;
                }
                let zone = self.arb.catalog.leases().get(&node).map(|l| l.zone.clone());
                let silent_in_zone = zone
                    .and_then(|z| silent.get(&z).copied())
                    .unwrap_or(1)
                    .max(1);
                self.arb.expiring.insert(a, now_ms);
                let env = Envelope {
                    at_ms: now_ms,
                    actor: self.arb.me.clone(),
                    command: Command::ExpireLease {
                        node,
                        epoch,
                        silent_in_zone,
                    },
                };
                self.propose(env, Then::Nothing);
            }
        }
        if now_ms >= self.arb.next_purge_ms {
            self.arb.next_purge_ms = now_ms + self.arbiter_config.store.purge_interval_ms;
            let env = Envelope {
                at_ms: now_ms,
                actor: self.arb.me.clone(),
                command: Command::Purge,
            };
            self.propose(env, Then::Nothing);
        }
        let mut out = Vec::new();
        self.arb.dist.sweep(now_ms, &self.arb.catalog, &mut out);
        self.carry(out);
    }

    pub(super) fn propose(&mut self, env: Envelope, then: Then) {
        if !self.arb.up {
            return;
        }
        self.arb.queue.push((env, then));
        if !self.arb.committing {
            self.arb.committing = true;
            self.after(self.sc.arbiter.commit_latency_ms * 1_000, Ev::Commit);
        }
    }

    pub(super) fn commit(&mut self) {
        self.arb.committing = false;
        if !self.arb.up {
            return;
        }
        let batch = std::mem::take(&mut self.arb.queue);
        let now_ms = self.now_ms();
        let mut out = Vec::new();
        for (env, then) in batch {
            let result = self.arb.catalog.apply(&env);
            if let Ok(applied) = &result {
                self.after_commit(&env, applied);
                if applied.revision.is_some() {
                    self.arb
                        .dist
                        .committed(&applied.services, now_ms, &self.arb.catalog, &mut out);
                }
            }
            match then {
                Then::Nothing => {}
                Then::Welcome { agent, session } => {
                    let latency = self.arbiter_latency();
                    if result.is_ok() && self.link_up(agent) {
                        let at = self.down_arrival(agent, latency);
                        self.at(at, Ev::Welcome { agent, session });
                    } else {
                        self.drop_session(session);
                        self.after(latency, Ev::Closed { agent, session });
                    }
                }
                Then::Reply { agent, write } => {
                    let reply = match &result {
                        Ok(Applied {
                            effect: Effect::Registered { generation, .. },
                            ..
                        }) => Ok(Some(*generation)),
                        Ok(_) => Ok(None),
                        Err(_) => Err(()),
                    };
                    if self.link_up(agent) {
                        let latency = self.arbiter_latency();
                        self.after(
                            latency,
                            Ev::WriteReply {
                                agent,
                                write,
                                result: reply,
                            },
                        );
                    }
                }
            }
        }
        self.carry(out);
        if !self.arb.queue.is_empty() {
            self.arb.committing = true;
            self.after(self.sc.arbiter.commit_latency_ms * 1_000, Ev::Commit);
        }
    }

    pub(super) fn after_commit(&mut self, env: &Envelope, applied: &Applied) {
        let now = self.now;
        if let Some(rev) = applied.revision {
            self.counters.commits += 1;
            let second = (ms(now) / 1_000) as usize;
            bump(&mut self.counters.commits_per_s, second, 1);
            self.hash(&[0xc0, rev.0, env.at_ms, kind_code(&env.command)]);
        }
        match (&env.command, &applied.effect) {
            (Command::ExpireLease { .. }, Effect::ExpiryHeld) => self.counters.expiry_held += 1,
            (Command::ExpireLease { node, .. }, Effect::LeaseEnded { marked })
            | (Command::NodeDown { node, .. }, Effect::LeaseEnded { marked }) => {
                let a = parse_node(node.as_str()).unwrap_or(0);
                if matches!(env.command, Command::NodeDown { .. }) {
                    self.counters.node_downs += 1;
                } else {
                    self.counters.leases_expired += 1;
                }
                if !self.agents[a as usize].dead {
                    self.counters.false_removals += *marked as u64;
                }
                if let (Some(rev), Some(list)) = (applied.revision, self.crashes.get_mut(&a)) {
                    for (_, t) in list.iter_mut() {
                        t.revision.get_or_insert(rev);
                    }
                }
            }
            (
                Command::Transition {
                    instance_id, to, ..
                },
                Effect::Changed,
            ) => {
                let k = parse_inst(instance_id.as_str()).unwrap_or(0) as usize;
                if *to == State::Ready {
                    self.insts[k].ever_ready = true;
                }
                if *to == State::Draining || *to == State::Unhealthy {
                    self.insts[k].left_at_ms.get_or_insert(ms(now));
                    let s = self.insts[k].service;
                    let (outstanding, count) = self.live_followers(s, None);
                    if count > 0 {
                        self.leaves.entry(s).or_default().push(Tracked {
                            revision: applied.revision,
                            start: now,
                            outstanding,
                            count,
                        });
                    } else {
                        self.leave_samples.push(0);
                    }
                }
            }
            _ => {}
        }
    }

    /// Carries the distributor's outputs: sends with their transfer time,
    /// wake-ups, disconnects.
    pub(super) fn carry(&mut self, out: Vec<Output>) {
        let snapshots = self.arb.dist.snapshots_in_flight();
        self.arb.max_snapshots_seen = self.arb.max_snapshots_seen.max(snapshots);
        for o in out {
            match o {
                Output::Send {
                    agent: session,
                    updates,
                } => {
                    let Some(&a) = self.arb.sessions.get(&session) else {
                        continue;
                    };
                    let bytes = self.message_bytes(&updates);
                    self.counters.update_messages += 1;
                    self.counters.updates += updates.len() as u64;
                    self.counters.bytes += bytes;
                    let second = (ms(self.now) / 1_000) as usize;
                    bump(
                        &mut self.counters.deliveries_per_s,
                        second,
                        updates.len() as u32,
                    );
                    let transfer = bytes * 1_000 / self.sc.network.bytes_per_ms;
                    if self.link_up(a) {
                        // Written to the connection: the send completes.
                        self.after(transfer.max(10), Ev::SendDone { session });
                        let latency = self.arbiter_latency();
                        let at = self.down_arrival(a, transfer + latency);
                        self.at(
                            at,
                            Ev::Update {
                                agent: a,
                                session,
                                updates,
                            },
                        );
                    }
                }
                Output::WakeAt {
                    agent: session,
                    at_ms,
                } => {
                    self.at(at_ms.max(self.now_ms()) * 1_000, Ev::Wake { session });
                }
                Output::Disconnect { agent: session, .. } => {
                    if let Some(a) = self.arb.sessions.remove(&session) {
                        if self.link_up(a) {
                            let latency = self.arbiter_latency();
                            self.after(latency, Ev::Closed { agent: a, session });
                        }
                    }
                }
            }
        }
    }

    pub(super) fn message_bytes(&mut self, updates: &[ServiceUpdate]) -> u64 {
        let mut bytes = 8;
        for u in updates {
            bytes += match u {
                ServiceUpdate::Snapshot(b) => b.len() as u64,
                ServiceUpdate::Deltas(deltas) => {
                    let mut sum = 0;
                    for d in deltas {
                        let s = u64::from(self.service_index[&d.service]);
                        let size = match self.delta_sizes.get(&(s, d.revision)) {
                            Some(size) => *size,
                            None => {
                                if self.delta_sizes.len() > 2_000_000 {
                                    self.delta_sizes.clear();
                                }
                                let size = rollcall_leases::codec::encode_delta(d).len() as u32;
                                self.delta_sizes.insert((s, d.revision), size);
                                size
                            }
                        };
                        sum += u64::from(size);
                    }
                    sum + 2
                }
                _ => 24,
            };
        }
        bytes
    }

    pub(super) fn drop_session(&mut self, session: u64) {
        if self.arb.sessions.remove(&session).is_some() {
            self.arb.dist.disconnect(session);
        }
    }

    pub(super) fn arbiter_stop(&mut self) {
        self.arb.up = false;
        self.arb.queue.clear();
        self.arb.pending_downs.clear();
        let sessions = std::mem::take(&mut self.arb.sessions);
        self.arb.dist = Distributor::new(self.arb.dist_params.clone());
        for (session, a) in sessions {
            if !self.agents[a as usize].dead && !self.cut(a) {
                let latency = self.arbiter_latency();
                self.after(latency, Ev::Closed { agent: a, session });
            }
        }
        // Agents half-way through a handshake are refused too.
        for a in 0..self.agents.len() as u32 {
            if let Some(session) = self.agents[a as usize].connecting {
                let latency = self.arbiter_latency();
                self.after(latency, Ev::Closed { agent: a, session });
            }
        }
    }

    pub(super) fn arbiter_start(&mut self) {
        let now_ms = self.now_ms();
        self.arb.up = true;
        self.arb.leader_since = now_ms;
        self.arb.last_heard.iter_mut().for_each(|t| *t = None);
        self.arb.expiring.clear();
        // A new leader gives every lease one TTL before expiring any (R3).
        self.arb.catalog.leases_mut().extend_all(now_ms);
        self.last_recovery_ms = Some(now_ms);
        self.converged_at_ms = None;
        self.after(CONVERGE_CHECK_MS * 1_000, Ev::ConvergeCheck);
    }
}
