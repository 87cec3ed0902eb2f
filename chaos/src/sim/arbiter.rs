//! The arbiter's side of the simulated region: the Raft group as one
//! ordered log committing a batch `commit_latency_ms` after it starts,
//! applied to the real [`rollcall_leases::Catalog`], and the real
//! [`rollcall_leases::distribution::Distributor`] whose sends are carried
//! with their codec size, transfer time and latency.
//!
//! The leader's memory is the arbiter core's own
//! [`rollcall_leases::leader::LeaderMemory`]: session silence (as the core,
//! only session-stream messages count), the two-signal rule for gossip
//! down reports, lease expiries with the zone's silent count, purges, and
//! taking office after a restart. The session rules are the core's own
//! ([`rollcall_leases::sessions`]): which node's lease a certificate may
//! hold, what it may watch, which of its requests become which command,
//! and what a settled down report answers; the answers are the core's too
//! ([`rollcall_leases::answers`]). This file only carries messages to and
//! from them and stamps the commands.
//!
//! It does not drive the arbiter's replica machine
//! ([`rollcall_leases::replica::ReplicaState`]) yet (issue 32, item 3):
//! what that machine decides beyond the parts above (followers and
//! forwarded writes, quorum loss, the catalog identity, batches of at
//! most 1,024 with two in flight, `AwaitPropagation` answered on the last
//! ack or at the deadline rather than at once) is not modelled here.

use rollcall_leases::distribution::{Distributor, Output};
use rollcall_leases::identity::Identity;
use rollcall_leases::leader::{LeaderMemory, LeaderParams, Verdict};
use rollcall_leases::protocol::{Request, Response, ServiceUpdate, SessionUp};
use rollcall_leases::sessions::{down_outcome, Accepted, DownOutcome, Step};
use rollcall_leases::witness;
use rollcall_leases::{
    answers, Applied, Command, Effect, Envelope, Label, NodeId, PrincipalName, Revision, Role,
    State,
};

use super::world::*;

impl World {
    // ----- arbiter -----

    /// Agent `a`'s certificate identity.
    fn identity(&self, a: u32) -> Identity {
        let node = &self.agents[a as usize].node;
        Identity::new(
            self.arb.sessions.rules().region.clone(),
            Role::Agent,
            PrincipalName::new(node.as_str()).expect("simulated names are valid"),
        )
    }

    /// Agent `a`'s handshake completed: its connection `session` sends
    /// Hello, which the session layer reads as the core does.
    pub(super) fn hello(&mut self, a: u32, session: u64) {
        if !self.link_up(a) {
            let latency = self.arbiter_latency();
            self.after(latency, Ev::Closed { agent: a, session });
            return;
        }
        self.arb
            .sessions
            .connect(session, self.identity(a), Vec::new());
        self.arb.conns.insert(session, a);
        self.arb.dist.connect(session);
        let agent = &self.agents[a as usize];
        let hello = SessionUp::Hello {
            node: agent.node.clone(),
            epoch: agent.epoch,
            zone: self.zone_labels[agent.zone as usize].clone(),
            addresses: vec![agent_ip(a)],
        };
        self.session_message(a, session, hello);
    }

    /// One message on agent `a`'s session stream reaches the arbiter now:
    /// the core's session layer says what it means, this carries it out.
    pub(super) fn session_message(&mut self, a: u32, session: u64, message: SessionUp) {
        if !self.link_up(a) || !self.arb.conns.contains_key(&session) {
            return;
        }
        // An acknowledgement is charged with the update it answers
        // (`send_cpu_us`, measured that way).
        if !matches!(message, SessionUp::Ack { .. }) {
            self.arbiter_cpu(self.sc.arbiter.recv_cpu_us);
        }
        let now_ms = self.now_ms();
        let (heard, step) = self.arb.sessions.message(session, message, now_ms);
        if let Some((node, _, _)) = heard {
            self.arb.leader.heard(&node, now_ms);
        }
        match step {
            Step::Grant { envelope, replaced } => {
                // One session per node, as in the core: the node's earlier
                // session is closed.
                for (old, _) in replaced {
                    if let Some(&holder) = self.arb.conns.get(&old) {
                        self.drop_session(old);
                        let latency = self.arbiter_latency();
                        self.after(
                            latency,
                            Ev::Closed {
                                agent: holder,
                                session: old,
                            },
                        );
                    }
                }
                self.propose(envelope, Then::Welcome { agent: a, session })
            }
            Step::Refuse(_) | Step::Close(_) => {
                self.drop_session(session);
                let latency = self.arbiter_latency();
                self.after(latency, Ev::Closed { agent: a, session });
            }
            Step::Deny { service, reason } => self.carry(vec![Output::Send {
                agent: session,
                updates: vec![ServiceUpdate::Denied { service, reason }],
            }]),
            Step::Subscribe { service, have } => {
                let mut out = Vec::new();
                self.arb.dist.subscribe(
                    session,
                    service,
                    have,
                    now_ms,
                    &self.arb.catalog,
                    &mut out,
                );
                self.carry(out);
            }
            Step::Unsubscribe(service) => self.arb.dist.unsubscribe(session, &service),
            Step::Ack { service, revision } => {
                let mut out = Vec::new();
                self.arb.dist.ack(
                    session,
                    &service,
                    revision,
                    now_ms,
                    &self.arb.catalog,
                    &mut out,
                );
                self.carry(out);
            }
            Step::Renew { node, epoch, actor } => {
                self.counters.renewals += 1;
                // The core's renewal: the leader memory renews the lease,
                // and reinstates one the guard holds.
                let arb = &mut self.arb;
                let renewal = arb
                    .leader
                    .renew(arb.catalog.leases(), &node, epoch, now_ms, &actor);
                match renewal {
                    Ok(Some(reinstate)) => self.propose(reinstate, Then::Nothing),
                    Ok(None) => {}
                    Err(_) => {
                        // The core refuses the session (the lease ended,
                        // say by a down verdict): the agent reconnects and
                        // is granted a new one.
                        self.counters.renewals_refused += 1;
                        self.drop_session(session);
                        let latency = self.arbiter_latency();
                        self.after(latency, Ev::Closed { agent: a, session });
                    }
                }
            }
            Step::Witnessed {
                witness,
                node,
                epoch,
                seen,
            } => self.arb.leader.witnessed(witness, &node, epoch, seen),
            Step::Nothing => {}
        }
    }

    /// Subscriptions on session `session` arrive, in order.
    pub(super) fn subscribe(&mut self, session: u64, subs: Vec<(u32, Option<Revision>)>) {
        let Some(&a) = self.arb.conns.get(&session) else {
            return;
        };
        for (s, have) in subs {
            let service = self.services[s as usize].clone();
            let message = SessionUp::Subscribe {
                shard: rollcall_leases::ShardId(0),
                service,
                have,
            };
            self.session_message(a, session, message);
        }
    }

    /// An agent's request arrives (a request, not a session message: the
    /// core does not count it as hearing the session). The session layer
    /// accepts or refuses it, and it is carried out as the core does.
    pub(super) fn request(&mut self, a: u32, session: u64, request: u64, body: Request) {
        if !self.arb.conns.contains_key(&session) || !self.link_up(a) {
            return;
        }
        self.arbiter_cpu(self.sc.arbiter.recv_cpu_us);
        if matches!(
            body,
            Request::Transition {
                to: State::Unhealthy,
                ..
            }
        ) {
            self.counters.unhealthy += 1;
        }
        let now_ms = self.now_ms();
        let accepted = self
            .arb
            .sessions
            .request(session, body, &self.arb.catalog, now_ms);
        match accepted {
            Ok(Accepted::Propose(env)) => self.propose(env, Then::Reply { agent: a, request }),
            Ok(Accepted::Down {
                reporter,
                actor,
                node,
                epoch,
            }) => {
                // The leader memory holds it for the arbiter's own
                // signal, as the core does.
                self.counters.down_reports += 1;
                let verdicts = self.arb.leader.report_down(
                    reporter,
                    actor,
                    node,
                    epoch,
                    now_ms,
                    Some((a, request)),
                );
                self.verdicts(verdicts);
            }
            Ok(Accepted::List(node)) => {
                let response = answers::node_instances(&self.arb.catalog, &node);
                self.answer(a, request, response);
            }
            Ok(Accepted::Answer(response)) => self.answer(a, request, response),
            Ok(Accepted::Await {
                service, revision, ..
            }) => {
                let (acked, total) = self.arb.dist.propagation(&service, revision);
                self.answer(a, request, Response::Propagated { acked, total });
            }
            Err(response) => self.answer(a, request, response),
        }
    }

    /// Settled down reports, carried as the core carries them.
    pub(super) fn verdicts(&mut self, verdicts: Vec<Verdict<Reporter>>) {
        for verdict in verdicts {
            if matches!(verdict, Verdict::Partition { .. }) {
                self.counters.down_reports_ignored += 1;
            }
            match down_outcome(verdict) {
                DownOutcome::Answer { waiting, answer } => {
                    for (agent, request) in waiting {
                        self.answer(agent, request, answer.clone());
                    }
                }
                DownOutcome::Propose {
                    envelope,
                    first,
                    others,
                    answer,
                } => {
                    let then = match first {
                        Some((agent, request)) => Then::Reply { agent, request },
                        None => Then::Nothing,
                    };
                    self.propose(envelope, then);
                    for (agent, request) in others {
                        self.answer(agent, request, answer.clone());
                    }
                }
            }
        }
    }

    /// Sends an answer back to agent `a`'s request.
    pub(super) fn answer(&mut self, a: u32, request: u64, response: Response) {
        if matches!(response, Response::Rejected { .. }) {
            self.counters.rejected_writes += 1;
        }
        if self.link_up(a) {
            let latency = self.arbiter_latency();
            self.after(
                latency,
                Ev::Answer {
                    agent: a,
                    request,
                    response,
                },
            );
        }
    }

    pub(super) fn arbiter_tick(&mut self) {
        let sweep = self.arbiter_config.lease.sweep_interval_ms;
        self.after(sweep * 1_000, Ev::ArbiterTick);
        let held = self.arb.catalog.leases().held();
        self.counters.held_max = self.counters.held_max.max(held);
        self.counters.witness_held_max = self
            .counters
            .witness_held_max
            .max(self.arb.leader.held_alive());
        if !self.arb.up {
            return;
        }
        let now_ms = self.now_ms();
        let sweep = self.arb.leader.sweep(now_ms, self.arb.catalog.leases());
        self.verdicts(sweep.verdicts);
        for envelope in sweep.proposals {
            self.propose(envelope, Then::Nothing);
        }
        // The core's witness questions, to the sessions it heard lately.
        let silence = self.arbiter_config.lease.silence_ms;
        for (node, epoch) in sweep.asks {
            let Some(ask) = witness::ask(&self.arb.catalog, &node, epoch) else {
                continue;
            };
            let candidates: Vec<(u64, NodeId, Label)> = self
                .arb
                .conns
                .keys()
                .filter_map(|session| {
                    let (node, _) = self.arb.sessions.live(*session)?;
                    let heard = self.arb.leader.last_heard(node)?;
                    if now_ms.saturating_sub(heard) > silence {
                        return None;
                    }
                    let zone = self.arb.catalog.leases().get(node)?.zone.clone();
                    Some((*session, node.clone(), zone))
                })
                .collect();
            let chosen = witness::choose(&ask, candidates.iter().map(|(s, n, z)| (*s, n, z)));
            self.counters.witness_asks += chosen.len() as u64;
            for session in chosen {
                let agent = self.arb.conns[&session];
                let latency = self.arbiter_latency();
                self.after(
                    latency,
                    Ev::Witness {
                        agent,
                        session,
                        node: ask.node.clone(),
                        epoch: ask.epoch,
                        addresses: ask.addresses.clone(),
                    },
                );
            }
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
                self.arb.leader.settled(&env.command);
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
                    // As the core: the node's lease as committed.
                    let node = &self.agents[agent as usize].node;
                    let lease = result
                        .as_ref()
                        .ok()
                        .and_then(|_| self.arb.catalog.leases().get(node))
                        .map(|l| l.id);
                    if let (Some(lease), true) = (lease, self.link_up(agent)) {
                        self.arb.sessions.welcomed(session);
                        let at = self.down_arrival(agent, latency);
                        self.at(
                            at,
                            Ev::Welcome {
                                agent,
                                session,
                                lease,
                            },
                        );
                    } else {
                        self.drop_session(session);
                        self.after(latency, Ev::Closed { agent, session });
                    }
                }
                Then::Reply { agent, request } => {
                    let response = answers::response(&self.arb.catalog, &env, result);
                    self.answer(agent, request, response);
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
            (Command::GrantLease { node, epoch, .. }, Effect::Unchanged) => {
                // As the core: asking again for the lease held renews it.
                let arb = &mut self.arb;
                let _ = arb
                    .leader
                    .renew(arb.catalog.leases(), node, *epoch, env.at_ms, &env.actor);
            }
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
                    let Some(&a) = self.arb.conns.get(&session) else {
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
                        // The send waits for the leader's core, then is
                        // written to the connection and completes.
                        let cpu = self.arbiter_cpu(self.sc.arbiter.send_cpu_us);
                        self.after(cpu + transfer.max(10), Ev::SendDone { session });
                        let latency = self.arbiter_latency();
                        let at = self.down_arrival(a, cpu + transfer + latency);
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
                    if let Some(a) = self.arb.conns.remove(&session) {
                        if self.link_up(a) {
                            let latency = self.arbiter_latency();
                            self.after(latency, Ev::Closed { agent: a, session });
                        }
                    }
                }
            }
        }
    }

    /// Charges `cost_us` of the leader's one core, behind what is charged
    /// already; returns how long from now until this work is done.
    pub(super) fn arbiter_cpu(&mut self, cost_us: u64) -> Time {
        let start = self.arb.cpu_until.max(self.now);
        self.arb.cpu_max_wait_us = self.arb.cpu_max_wait_us.max(start - self.now);
        self.arb.cpu_until = start + cost_us;
        self.arb.cpu_busy_us += cost_us;
        self.arb.cpu_until - self.now
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
        if self.arb.conns.remove(&session).is_some() {
            self.arb.sessions.disconnect(session);
            self.arb.dist.disconnect(session);
        }
    }

    pub(super) fn arbiter_stop(&mut self) {
        self.arb.up = false;
        self.arb.queue.clear();
        // Its memory is gone with it.
        self.arb.leader.step_down();
        let sessions = std::mem::take(&mut self.arb.conns);
        for &session in sessions.keys() {
            self.arb.sessions.disconnect(session);
        }
        self.arb.dist = Distributor::new(
            self.arb.dist_params.clone(),
            rollcall_leases::codec::shared_service_snapshot,
        );
        for (session, a) in sessions {
            if !self.agents[a as usize].dead && !self.cut(a) {
                let latency = self.arbiter_latency();
                self.after(latency, Ev::Closed { agent: a, session });
            }
        }
        // Agents half-way through a handshake are refused too.
        for a in 0..self.agents.len() as u32 {
            if let Some((_, session)) = self.agents[a as usize].connecting {
                let latency = self.arbiter_latency();
                self.after(latency, Ev::Closed { agent: a, session });
            }
        }
    }

    pub(super) fn arbiter_start(&mut self) {
        let now_ms = self.now_ms();
        self.arb.up = true;
        // A fresh memory; taking office gives every lease one TTL before
        // expiring any, and counts every session as heard now (R3).
        self.arb.leader = LeaderMemory::new(
            LeaderParams::from(&self.arbiter_config),
            principal(Role::Arbiter, "sim-arbiter"),
            now_ms,
        );
        self.arb
            .leader
            .take_office(now_ms, self.arb.catalog.leases());
        self.last_recovery_ms = Some(now_ms);
        self.converged_at_ms = None;
        self.after(CONVERGE_CHECK_MS * 1_000, Ev::ConvergeCheck);
    }
}
