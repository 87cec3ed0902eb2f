//! The arbiter's side of the simulated region: one or more arbiter
//! replicas (`[arbiter] replicas`) whose every decision is the shipped
//! replica machine's
//! ([`rollcall_leases::replica::ReplicaState`]), driven as the arbiter's
//! core task (`rollcall_leases::server::core`) drives it, over the real
//! [`rollcall_leases::Catalog`] as applied.
//!
//! The machine decides: sessions (Hello, the grant and its Welcome,
//! refusals, one session per node), renewals and session silence, requests
//! and which become commands, down reports held for the second signal,
//! lease deadlines, expiries and purges, witness asks, taking office (every
//! lease one TTL, every session heard, the catalog's identity proposed),
//! group commits (at most two batches of at most 1,024 commands in
//! flight), the distributor's updates, re-sends and wake-ups, regions
//! messages and `AwaitPropagation` (answered at the last ack or at the
//! deadline).
//!
//! This file only carries, as the core task does: each event that reaches
//! a replica is one wake-up (its inputs, the Raft view if it changed,
//! then `Tick`), and the machine is woken again at its `poll_timeout`.
//! What it models itself:
//! - the network between agents and the replicas (latency, transfer time,
//!   the ordered session stream, cut zones) and each replica's one CPU
//!   core (`[arbiter]` `recv_cpu_us`, `send_cpu_us`, `session_cpu_us`);
//! - the Raft group between the replicas (`raft`): the log, commits,
//!   elections, quorum contact and peer calls.

use std::collections::VecDeque;

use rollcall_leases::identity::Identity;
use rollcall_leases::protocol::{Request, Response, ServiceUpdate, SessionDown, SessionUp};
use rollcall_leases::replica::{Input, Output};
use rollcall_leases::{Applied, Command, Effect, Envelope, PrincipalName, Revision, Role, State};

use super::peers::CallKind;
use super::world::*;

/// The address the agents dial when the group is one replica.
pub(super) const ADDRESS: &str = "sim-arbiter:7000";

impl World {
    // ----- arbiter -----

    /// Agent `a`'s certificate identity.
    fn identity(&self, a: u32) -> Identity {
        let node = &self.agents[a as usize].node;
        Identity::new(
            self.arbs[0].machine.sessions().rules().region.clone(),
            Role::Agent,
            PrincipalName::new(node.as_str()).expect("simulated names are valid"),
        )
    }

    /// The replica holding connection `session`.
    pub(super) fn replica_of_session(&self, session: u64) -> Option<usize> {
        (0..self.arbs.len()).find(|&r| self.arbs[r].conns.contains_key(&session))
    }

    /// Agent `a`'s handshake completed: its connection `session` is
    /// connected and sends Hello.
    pub(super) fn hello(&mut self, a: u32, session: u64) {
        let r = self.agents[a as usize].replica;
        if !self.link_up(a) {
            if self.arbs[r].silent {
                // Nothing answers: the agent gives up at its connect timeout.
                let timeout = self.agent_config.connect_timeout_ms;
                self.after(timeout * 1_000, Ev::ConnectFailed(a));
            } else {
                let latency = self.arbiter_latency();
                self.after(latency, Ev::Closed { agent: a, session });
            }
            return;
        }
        self.arbiter_cpu(r, self.sc.arbiter.recv_cpu_us);
        self.arbs[r].conns.insert(session, a);
        let agent = &self.agents[a as usize];
        let hello = SessionUp::Hello {
            node: agent.node.clone(),
            epoch: agent.epoch,
            zone: self.zone_labels[agent.zone as usize].clone(),
            addresses: vec![agent_ip(a)],
        };
        let connected = Input::Connected {
            agent: session,
            identity: self.identity(a),
            certified: Vec::new(),
        };
        let hello = Input::Session {
            agent: session,
            msg: hello,
        };
        self.arbiter_wake(r, vec![connected, hello]);
    }

    /// One message on agent `a`'s session stream reaches its replica now.
    pub(super) fn session_message(&mut self, a: u32, session: u64, message: SessionUp) {
        let r = self.agents[a as usize].replica;
        if !self.link_up(a) || !self.arbs[r].conns.contains_key(&session) {
            return;
        }
        // An acknowledgement is charged with the update it answers
        // (`send_cpu_us`, measured that way).
        if !matches!(message, SessionUp::Ack { .. }) {
            self.arbiter_cpu(r, self.sc.arbiter.recv_cpu_us);
        }
        self.arbiter_wake(
            r,
            vec![Input::Session {
                agent: session,
                msg: message,
            }],
        );
    }

    /// Subscriptions on session `session` arrive, in order.
    pub(super) fn subscribe(&mut self, session: u64, subs: Vec<(u32, Option<Revision>)>) {
        let Some(r) = self.replica_of_session(session) else {
            return;
        };
        let a = self.arbs[r].conns[&session];
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

    /// An agent's request arrives on a stream of its own; the answer goes
    /// back by the reply id it is given here.
    pub(super) fn request(&mut self, a: u32, session: u64, request: u64, body: Request) {
        let r = self.agents[a as usize].replica;
        if !self.arbs[r].conns.contains_key(&session) || !self.link_up(a) {
            return;
        }
        self.arbiter_cpu(r, self.sc.arbiter.recv_cpu_us);
        match &body {
            Request::Transition {
                to: State::Unhealthy,
                ..
            } => self.counters.unhealthy += 1,
            // What the session rules accept as a down report: one from a
            // session that holds a lease.
            Request::ReportDown { .. }
                if self.arbs[r].machine.sessions().held(session).is_some() =>
            {
                self.counters.down_reports += 1
            }
            _ => {}
        }
        let arb = &mut self.arbs[r];
        arb.next_reply += 1;
        let reply = arb.next_reply;
        arb.replies.insert(reply, (a, request));
        self.arbiter_wake(
            r,
            vec![Input::Request {
                agent: session,
                request: body,
                reply,
            }],
        );
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

    /// Every sweep interval: each replica's core is charged its sessions'
    /// background work (`session_cpu_us` a session-second), and what the
    /// guard and the witnesses hold is sampled.
    pub(super) fn arbiter_sample(&mut self) {
        let sweep = self.arbiter_config.lease.sweep_interval_ms;
        self.after(sweep * 1_000, Ev::ArbiterSample);
        for r in 0..self.arbs.len() {
            if self.arbs[r].up {
                let sessions = self.arbs[r].conns.len() as u64;
                let cost = sessions * self.sc.arbiter.session_cpu_us * sweep / 1_000;
                self.arbiter_cpu(r, cost);
            }
        }
        let held = self.catalog().leases().held();
        self.counters.held_max = self.counters.held_max.max(held);
        if let Some(leader) = self.group.leader {
            self.counters.witness_held_max = self
                .counters
                .witness_held_max
                .max(self.arbs[leader].machine.held_alive());
        }
    }

    /// One wake-up of replica `r`'s machine, as the core task has them:
    /// `inputs` in order, the Raft view if it changed, then `Tick`; what
    /// carrying them hands back (a closed connection, a refused proposal)
    /// is the next wake-up's. Then the machine is woken again at its
    /// `poll_timeout`.
    pub(super) fn arbiter_wake(&mut self, r: usize, inputs: Vec<Input>) {
        if !self.arbs[r].up {
            return;
        }
        let mut inbox: VecDeque<Input> = inputs.into();
        loop {
            while let Some(input) = inbox.pop_front() {
                self.arbiter_step(r, input, &mut inbox);
            }
            let key = self.view_key(r);
            if self.arbs[r].view != Some(key) {
                self.arbs[r].view = Some(key);
                let view = self.raft_view(r);
                self.arbiter_step(r, Input::Raft(view), &mut inbox);
            }
            self.arbiter_step(r, Input::Tick, &mut inbox);
            if inbox.is_empty() {
                break;
            }
        }
        // The machine's counts, as the core publishes them.
        let now_ms = self.now_ms();
        let arb = &mut self.arbs[r];
        let counts = arb.machine.counters();
        let (renewals, ignored) = (counts.renewals, counts.down_reports_ignored);
        self.counters.renewals += renewals - arb.seen.renewals;
        self.counters.down_reports_ignored += ignored - arb.seen.down_reports_ignored;
        arb.seen.renewals = renewals;
        arb.seen.down_reports_ignored = ignored;
        let at_ms = arb.machine.poll_timeout().max(now_ms + 1);
        if arb.wake_at.is_none_or(|w| at_ms < w) {
            arb.wake_at = Some(at_ms);
            self.at(at_ms * 1_000, Ev::ArbiterWake { replica: r, at_ms });
        }
    }

    /// The wake-up replica `r`'s machine asked for.
    pub(super) fn arbiter_woken(&mut self, r: usize, at_ms: u64) {
        if self.arbs[r].wake_at == Some(at_ms) {
            self.arbs[r].wake_at = None;
            self.arbiter_wake(r, Vec::new());
        }
    }

    /// One input to replica `r`'s machine, its outputs carried.
    fn arbiter_step(&mut self, r: usize, input: Input, inbox: &mut VecDeque<Input>) {
        let renewal = match &input {
            Input::Session {
                agent,
                msg: SessionUp::Renew,
            } => Some(*agent),
            _ => None,
        };
        let now_ms = self.now_ms();
        let mut out = Vec::new();
        let arb = &mut self.arbs[r];
        arb.machine
            .handle(input, now_ms, &mut arb.rng, &arb.catalog, &mut out);
        // A renewal the leader memory refuses (the lease ended, say by a
        // down verdict) refuses the session: the agent reconnects.
        if let Some(session) = renewal {
            let refused = out.iter().any(|o| {
                matches!(o, Output::Send { agent, message: SessionDown::Refused { .. }, .. } if *agent == session)
            });
            self.counters.renewals_refused += u64::from(refused);
        }
        for o in out {
            self.carry(r, o, inbox);
        }
        let arb = &mut self.arbs[r];
        let snapshots = arb.machine.distributor().snapshots_in_flight();
        arb.max_snapshots_seen = arb.max_snapshots_seen.max(snapshots);
    }

    /// Carries one of replica `r`'s outputs.
    fn carry(&mut self, r: usize, output: Output, inbox: &mut VecDeque<Input>) {
        match output {
            Output::Send {
                agent: session,
                message,
                notify,
            } => self.send_down(r, session, message, notify, inbox),
            Output::Close { agent: session, .. } => {
                if let Some(a) = self.arbs[r].conns.remove(&session) {
                    inbox.push_back(Input::Closed { agent: session });
                    if self.link_up(a) {
                        let latency = self.arbiter_latency();
                        self.after(latency, Ev::Closed { agent: a, session });
                    }
                }
            }
            Output::Answer { reply, response } => {
                if let Some((a, request)) = self.arbs[r].replies.remove(&reply) {
                    self.answer(a, request, response);
                }
            }
            Output::AnswerPeer { reply, response } => self.peer_answered(r, reply, response),
            Output::Propose { batch, envelopes } => self.propose(r, batch, envelopes, inbox),
            Output::Forward {
                forward,
                to,
                request,
                wait_ms,
            } => self.peer_call(r, to, request, CallKind::Forward(forward), wait_ms),
            Output::ReportHeard { to, heard, wait_ms } => self.peer_call(
                r,
                to,
                rollcall_leases::peer_protocol::PeerRequest::Heard(heard),
                CallKind::Heard,
                wait_ms,
            ),
            Output::Tell {
                to,
                request,
                wait_ms,
            } => self.peer_call(r, to, request, CallKind::Tell, wait_ms),
            Output::AskPropagation {
                wait,
                to,
                request,
                wait_ms,
            } => self.ask_propagation(r, wait, to, request, wait_ms),
            // Nothing stops a simulated replica with `Input::Stop`.
            Output::Stopped => {}
        }
    }

    /// A message replica `r`'s machine sends on session `session`,
    /// carried with its CPU, size, transfer time and latency.
    fn send_down(
        &mut self,
        r: usize,
        session: u64,
        message: SessionDown,
        notify: bool,
        inbox: &mut VecDeque<Input>,
    ) {
        let Some(&a) = self.arbs[r].conns.get(&session) else {
            return;
        };
        match message {
            SessionDown::Update(updates) => {
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
                    // The send waits for the replica's core, then is
                    // written to the connection and completes.
                    let cpu = self.arbiter_cpu(r, self.sc.arbiter.send_cpu_us);
                    if notify {
                        self.after(cpu + transfer.max(10), Ev::SendDone { session });
                    }
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
            SessionDown::Welcome {
                lease,
                revision,
                catalog,
                ..
            } => {
                let latency = self.arbiter_latency();
                if self.link_up(a) {
                    let at = self.down_arrival(a, latency);
                    self.at(
                        at,
                        Ev::Welcome {
                            agent: a,
                            session,
                            lease,
                            revision,
                            catalog,
                        },
                    );
                } else {
                    // Lost with its connection, which ends at both ends.
                    self.arbs[r].conns.remove(&session);
                    inbox.push_back(Input::Closed { agent: session });
                    self.after(latency, Ev::Closed { agent: a, session });
                }
            }
            SessionDown::Witness {
                node,
                epoch,
                addresses,
            } => {
                self.counters.witness_asks += 1;
                let latency = self.arbiter_latency();
                self.after(
                    latency,
                    Ev::Witness {
                        agent: a,
                        session,
                        node,
                        epoch,
                        addresses,
                    },
                );
            }
            // A probe reaches the agent's machine, which answers it as its
            // session actor would: at once.
            message @ (SessionDown::Regions(_)
            | SessionDown::RegionsWithWriters(..)
            | SessionDown::Refused { .. }
            | SessionDown::Probe { .. }) => {
                if self.link_up(a) {
                    let latency = self.arbiter_latency();
                    let at = self.down_arrival(a, latency);
                    self.at(
                        at,
                        Ev::Message {
                            agent: a,
                            session,
                            message,
                        },
                    );
                }
            }
        }
    }

    /// What one committed command changes in the measurements.
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
                    self.left(k, applied);
                }
            }
            // A READY instance deregistered without a drain first (a churn
            // with no drain wait, or a drain still pending on its agent
            // when the deregistration superseded it) leaves routing now.
            (Command::Deregister { instance_id, .. }, Effect::Changed) => {
                let k = parse_inst(instance_id.as_str()).unwrap_or(0) as usize;
                if self.insts[k].ever_ready && self.insts[k].left_at_ms.is_none() {
                    self.left(k, applied);
                }
            }
            _ => {}
        }
    }

    /// Instance `k` left routing by this commit: its leave is timed until
    /// every live follower of its service applied it.
    fn left(&mut self, k: usize, applied: &Applied) {
        let now = self.now;
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

    /// Charges `cost_us` of replica `r`'s one core, behind what is
    /// charged already; returns how long from now until this work is done.
    pub(super) fn arbiter_cpu(&mut self, r: usize, cost_us: u64) -> Time {
        let now = self.now;
        let arb = &mut self.arbs[r];
        let start = arb.cpu_until.max(now);
        arb.cpu_max_wait_us = arb.cpu_max_wait_us.max(start - now);
        arb.cpu_until = start + cost_us;
        arb.cpu_busy_us += cost_us;
        arb.cpu_until - now
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

    /// The agent's end of session `session` closed it (or it timed out):
    /// the connection's end reaches its replica's machine.
    pub(super) fn drop_session(&mut self, session: u64) {
        if let Some(r) = self.replica_of_session(session) {
            self.arbs[r].conns.remove(&session);
            self.arbiter_wake(r, vec![Input::Closed { agent: session }]);
        }
    }

    /// The whole group stops (`stop_arbiter`): every session is closed and
    /// every connect refused until it starts again; the log survives.
    pub(super) fn arbiter_stop(&mut self) {
        self.group.leader = None;
        self.group.known_leader = None;
        self.group.generation += 1;
        self.group.pending.clear();
        for r in 0..self.arbs.len() {
            self.stop_replica(r, false);
            let sessions = std::mem::take(&mut self.arbs[r].conns);
            for (session, a) in sessions {
                if !self.agents[a as usize].dead && !self.cut(a) {
                    let latency = self.arbiter_latency();
                    self.after(latency, Ev::Closed { agent: a, session });
                }
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

    /// The group is back: every replica starts over the log as applied,
    /// and the first takes office at once (every lease one TTL before any
    /// expires, every session counted as heard now, R3).
    pub(super) fn arbiter_start(&mut self) {
        let now_ms = self.now_ms();
        for r in 0..self.arbs.len() {
            self.start_replica(r);
        }
        self.elect(0);
        self.last_recovery_ms = Some(now_ms);
        self.converged_at_ms = None;
        self.after(CONVERGE_CHECK_MS * 1_000, Ev::ConvergeCheck);
    }
}
