//! The simulated region's state and its discrete-event loop: one queue of
//! timed events over a virtual clock (µs) and one seeded RNG, the scenario's
//! steps, and the types the other modules share (`fleet` builds the region,
//! `agent` and `arbiter` handle their sides' events, `measure` times leaves
//! and crashes and checks the end state). What runs:
//!
//! - Gossip: one [`rollcall_gossip::sim::Sim`] per zone (the real foca
//!   `Membership` of every agent over a simulated network), stepped in
//!   lockstep with this loop so every membership event lands at its time.
//! - Arbiter: each replica's real machine
//!   ([`rollcall_leases::replica::ReplicaState`]: sessions, renewals and
//!   silence, down reports, witnesses, expiries, taking office, quorum
//!   loss, group commits, forwarded writes, the distributor) over a real
//!   [`rollcall_leases::Catalog`] of its own (commands, leases, mass-expiry
//!   guard, delta log), carried as the core task carries it (`arbiter`),
//!   with what openraft does between the replicas modelled (`raft`: the
//!   log and its commits, elections, quorum contact, peer calls).
//! - Agents: each agent is the binary's own state machine
//!   ([`rollcall_node::agent_state::AgentState`]: the link with its
//!   backoff, keep-alives and renewals, the catalog views, the local
//!   registrations and their reconcile plan, health checks, gossip down
//!   verdicts) and its own endpoint view ([`rollcall_node::view::Views`]:
//!   ejection, protection, panic, slow start, the down set), which the
//!   sampled connections read with the proxy's selector. Instances call
//!   the agent's local API (register, heartbeat, drain, deregister) as
//!   [`rollcall_node::agent_state::Call`]s; probes answer as the instance
//!   is (alive or not).
//!
//! The driver is the only code here that is not the binaries' own: it
//! moves messages with latencies and transfer times, fires the timers the
//! state machines ask for, plays the instances, and records what the
//! report needs. Everything random comes from the
//! scenario seed, and nothing iterates a randomly seeded map, so a seed
//! replays exactly; [`World::digest`] hashes the history to prove it.

use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::net::{IpAddr, Ipv4Addr};

use rand::rngs::StdRng;
use rand::RngExt;
use rollcall_config::{AgentConfig, ArbiterConfig};
use rollcall_gossip::sim::Sim as ZoneSim;
use rollcall_leases::{
    AgentEpoch, Command, InstanceId, Label, NodeId, Principal, PrincipalName, Revision, Role,
    ServiceKey, Version,
};
use rollcall_node::agent_state::{AgentState, CallId, Restored, SessionId, Settings};
use rollcall_node::api_types::ValidChecks;
use rollcall_node::view::Views;
use xxhash_rust::xxh3::Xxh3;

pub(super) use super::event::Ev;
use super::scenario::{Action, SimScenario, Step};

/// How often the instances of an agent look whether a heartbeat is due,
/// in ms.
pub(super) const TICK_MS: u64 = 100;
/// QUIC idle timeout of an agent's session, ms (the shipped value).
pub(super) const IDLE_TIMEOUT_MS: u64 = rollcall_config::QUIC_IDLE_TIMEOUT_MS;

/// A silence check that runs later than this decides nothing (the
/// shipped session actor's bound), ms.
pub(super) const SILENCE_CHECK_LATE_MS: u64 = rollcall_config::SILENCE_CHECK_LATE_MS;
/// How often convergence is checked after the last recovery, ms.
pub(super) const CONVERGE_CHECK_MS: u64 = 500;
/// How often a QUIC handshake's packets are sent again while lost, ms.
pub(super) const HANDSHAKE_RETRY_MS: u64 = 1_000;

pub(super) type Time = u64; // µs

pub(super) fn ms(us: Time) -> u64 {
    us / 1_000
}

#[derive(PartialEq, Eq)]
pub(super) struct Key {
    pub(super) due: Time,
    pub(super) seq: u64,
    pub(super) slot: usize,
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.due, other.seq).cmp(&(self.due, self.seq))
    }
}

pub(super) struct Inst {
    pub(super) id: InstanceId,
    pub(super) service: u32,
    pub(super) agent: u32,
    pub(super) alive: bool,
    pub(super) leaving: bool,
    pub(super) ever_ready: bool,
    pub(super) version: Version,
    pub(super) port: u16,
    pub(super) left_at_ms: Option<u64>,
    /// When the instance next sends a heartbeat to its agent; `None` for
    /// an instance that is probed instead.
    pub(super) next_heartbeat_ms: Option<u64>,
}

impl Inst {
    /// Instance `i<k>` of `service` on `agent`, not yet registered.
    pub(super) fn new(
        k: u32,
        service: u32,
        agent: u32,
        port: u16,
        version: Version,
        next_heartbeat_ms: Option<u64>,
    ) -> Inst {
        Inst {
            id: InstanceId::new(&format!("i{k:07}")).expect("simulated ids are valid"),
            service,
            agent,
            alive: true,
            leaving: false,
            ever_ready: false,
            version,
            port,
            left_at_ms: None,
            next_heartbeat_ms,
        }
    }
}

pub(super) struct Agent {
    pub(super) node: NodeId,
    pub(super) zone: u32,
    pub(super) zone_index: usize,
    pub(super) epoch: AgentEpoch,
    /// The agent's own state machine; `None` until the agent starts.
    pub(super) machine: Option<AgentState>,
    /// What it starts from (taken at the start).
    pub(super) restored: Option<Restored>,
    /// Its endpoint view, as its data plane reads it.
    pub(super) views: Views,
    /// Services whose view changed since it was last published: built
    /// and published before the data plane reads it (the machine defers
    /// publications; see `AgentState::defer_publications`).
    pub(super) unpublished: BTreeSet<ServiceKey>,
    pub(super) follows: Vec<u32>,
    pub(super) instances: Vec<u32>,
    /// The session the machine asked for: its number there, and here.
    pub(super) connecting: Option<(SessionId, u64)>,
    /// The session welcomed.
    pub(super) session: Option<(SessionId, u64)>,
    /// The replica of its connection (or its last one).
    pub(super) replica: usize,
    /// Sessions welcomed so far.
    pub(super) welcomed: u32,
    /// The wake-up the machine asked for last, ms.
    pub(super) wake: Option<u64>,
    pub(super) next_call: CallId,
    pub(super) dead: bool,
    pub(super) paused_until: Time,
    /// Full snapshots received since the last outage ended.
    pub(super) snapshots_since_outage: u32,
    pub(super) reconnected_after_outage: bool,
    /// When the last message on the session stream arrives, each way
    /// (µs): the stream is ordered.
    pub(super) down_last: Time,
    pub(super) up_last: Time,
    /// The session whose silence check is pending (one at a time, as the
    /// shipped session actor watches its earliest unanswered message).
    pub(super) silence_watch: Option<u64>,
}

/// A change whose arrival at every subscribed agent is being timed.
pub(super) struct Tracked {
    pub(super) revision: Option<Revision>,
    pub(super) start: Time,
    pub(super) outstanding: Vec<u64>,
    pub(super) count: u32,
}

/// The figures the run produces; see `super::SimFigures` for meanings.
#[derive(Default, Debug, Clone)]
pub struct Counters {
    pub commits: u64,
    pub commits_per_s: Vec<u32>,
    pub update_messages: u64,
    pub updates: u64,
    pub deliveries_per_s: Vec<u32>,
    pub bytes: u64,
    pub rejected_writes: u64,
    pub renewals: u64,
    pub keepalives: u64,
    pub expiry_held: u64,
    pub held_max: usize,
    pub witness_held_max: usize,
    pub leases_expired: u64,
    pub node_downs: u64,
    pub down_reports: u64,
    pub down_reports_ignored: u64,
    pub false_removals: u64,
    pub gossip_down_events: u64,
    pub gossip_false_downs: u64,
    pub conns: u64,
    pub failed_conns: u64,
    pub failed_attempts: u64,
    pub failed_conns_in_outage: u64,
    pub new_conns_to_drained: u64,
    pub new_conns_to_not_ready: u64,
    pub probes: u64,
    pub heartbeats: u64,
    pub renewals_refused: u64,
    /// Witness questions the arbiter sent about silent leases.
    pub witness_asks: u64,
    pub unhealthy: u64,
    pub pauses: u64,
    pub nodes_killed: u64,
    pub replaced: u64,
    pub reconnects: u64,
    pub sessions_moved: u64,
    pub batches_timed_out: u64,
    pub silent_arbiters: u64,
    pub snapshots_applied: u64,
    pub events: u64,
}

/// The simulated region.
pub struct World {
    pub(super) sc: SimScenario,
    pub(super) now: Time,
    pub(super) seq: u64,
    pub(super) queue: BinaryHeap<Key>,
    pub(super) slots: Vec<Option<(Time, Ev)>>,
    pub(super) free: Vec<usize>,
    pub(super) rng: StdRng,
    pub(super) zones: Vec<ZoneSim>,
    pub(super) zone_members: Vec<Vec<u32>>,
    pub(super) zone_labels: Vec<Label>,
    pub(super) cut_zones: BTreeSet<u32>,
    pub(super) services: Vec<ServiceKey>,
    pub(super) service_index: HashMap<ServiceKey, u32>,
    pub(super) followers: Vec<Vec<u32>>,
    pub(super) insts: Vec<Inst>,
    pub(super) agents: Vec<Agent>,
    /// The arbiter group's replicas (`[arbiter] replicas`).
    pub(super) arbs: Vec<super::raft::Arbiter>,
    /// What openraft does between them.
    pub(super) group: super::raft::Group,
    pub(super) agent_config: AgentConfig,
    pub(super) arbiter_config: ArbiterConfig,
    /// The settings every agent's machine shares but its name.
    pub(super) agent_settings: Settings,
    /// The readiness check of probed services (TCP, every second).
    pub(super) checks: ValidChecks,
    /// The readiness check of heartbeating services (TTL).
    pub(super) ttl_checks: ValidChecks,
    /// Per service: its instances heartbeat (`[heartbeat] share`).
    pub(super) heartbeating: Vec<bool>,
    pub(super) next_session: u64,
    pub(super) leaves: BTreeMap<u32, Vec<Tracked>>,
    pub(super) crashes: BTreeMap<u32, Vec<(u32, Tracked)>>,
    pub(super) crash_last: BTreeMap<u32, (Time, Time, u32)>,
    pub(super) delta_sizes: HashMap<(u64, Revision), u32>,
    pub(super) hasher: Xxh3,
    /// Samples, ms.
    pub leave_samples: Vec<u64>,
    pub crash_samples: Vec<u64>,
    pub counters: Counters,
    /// (start, end) of the arbiter outage, ms.
    pub outage: Option<(u64, u64)>,
    pub last_recovery_ms: Option<u64>,
    pub converged_at_ms: Option<u64>,
    /// Phases: (name, start ms, conns, failed).
    pub phases: Vec<(String, u64, u64, u64)>,
    pub gossip_packets: u64,
    pub gossip_bytes: u64,
    pub gossip_lost: u64,
    pub(super) deploy_seq: u32,
}

pub(super) fn principal(role: Role, name: &str) -> Principal {
    Principal {
        role,
        name: PrincipalName::new(name).expect("simulated names are valid"),
    }
}

impl World {
    pub(super) fn at(&mut self, due: Time, ev: Ev) {
        self.seq += 1;
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot] = Some((due, ev));
                slot
            }
            None => {
                self.slots.push(Some((due, ev)));
                self.slots.len() - 1
            }
        };
        self.queue.push(Key {
            due,
            seq: self.seq,
            slot,
        });
    }

    pub(super) fn after(&mut self, us: Time, ev: Ev) {
        self.at(self.now + us, ev);
    }

    /// When a message the arbiter sends now on agent `a`'s session stream
    /// after `delay` arrives: never before the one sent ahead of it (the
    /// stream is ordered).
    pub(super) fn down_arrival(&mut self, a: u32, delay: Time) -> Time {
        let agent = &mut self.agents[a as usize];
        let at = (self.now + delay).max(agent.down_last + 1);
        agent.down_last = at;
        at
    }

    /// Likewise for what agent `a` sends on its session stream.
    pub(super) fn up_arrival(&mut self, a: u32, delay: Time) -> Time {
        let agent = &mut self.agents[a as usize];
        let at = (self.now + delay).max(agent.up_last + 1);
        agent.up_last = at;
        at
    }

    pub(super) fn arbiter_latency(&mut self) -> Time {
        let (lo, hi) = self.sc.network.arbiter_latency_us;
        self.rng.random_range(lo..=hi.max(lo))
    }

    pub(super) fn hash(&mut self, words: &[u64]) {
        for w in words {
            self.hasher.update(&w.to_le_bytes());
        }
    }

    /// The hash of the simulated history so far (commits, applies,
    /// membership events, measurements).
    pub fn digest(&self) -> String {
        format!("{:032x}", self.hasher.clone().digest128())
    }

    /// Virtual time now, ms.
    pub fn now_ms(&self) -> u64 {
        ms(self.now)
    }

    /// Runs until `end_ms` of virtual time.
    pub fn run(&mut self, end_ms: u64, mut progress: impl FnMut(u64)) {
        let end = end_ms * 1_000;
        let mut next_progress = 0;
        loop {
            let world_next = self.queue.peek().map(|k| k.due);
            let mut zone_next: Option<(Time, usize)> = None;
            for (z, sim) in self.zones.iter().enumerate() {
                if let Some(t) = sim.next_due_us() {
                    if zone_next.is_none_or(|(best, _)| t < best) {
                        zone_next = Some((t, z));
                    }
                }
            }
            let next = match (world_next, zone_next) {
                (Some(w), Some((g, _))) => w.min(g),
                (Some(w), None) => w,
                (None, Some((g, _))) => g,
                (None, None) => break,
            };
            if next > end {
                break;
            }
            if ms(next) >= next_progress {
                progress(ms(next));
                next_progress = ms(next) + 1_000;
            }
            match zone_next {
                Some((g, z)) if world_next.is_none_or(|w| g < w) => {
                    self.zones[z].run_until_us(g);
                    self.now = self.now.max(g);
                    let events = self.zones[z].take_events();
                    for e in events {
                        self.gossip_event(z, e.observer, e.event);
                    }
                }
                _ => {
                    let key = self.queue.pop().expect("peeked");
                    let (due, ev) = self.slots[key.slot].take().expect("queued");
                    self.free.push(key.slot);
                    self.now = due;
                    self.counters.events += 1;
                    self.dispatch(ev);
                }
            }
        }
        self.now = self.now.max(end);
        for sim in &mut self.zones {
            sim.run_until_us(end);
        }
        let (mut packets, mut bytes, mut lost) = (0, 0, 0);
        for sim in &self.zones {
            let s = sim.stats();
            packets += s.sent;
            bytes += s.bytes;
            lost += s.lost;
        }
        self.gossip_packets = packets;
        self.gossip_bytes = bytes;
        self.gossip_lost = lost;
    }

    fn dispatch(&mut self, ev: Ev) {
        if let Some(a) = ev.on_agent() {
            let agent = &self.agents[a as usize];
            if agent.dead {
                return;
            }
            if agent.paused_until > self.now {
                let until = agent.paused_until;
                self.at(until, ev);
                return;
            }
        }
        match ev {
            Ev::Step(i) => self.step(i),
            Ev::Start(a) => self.start_agent(a),
            Ev::AgentWake { agent, at_ms } => {
                if self.agents[agent as usize].wake == Some(at_ms) {
                    self.agents[agent as usize].wake = None;
                    self.feed(agent, rollcall_node::agent_state::Input::Tick);
                }
            }
            Ev::Heartbeats(a) => self.heartbeats(a),
            Ev::ConnectFailed(a) => self.connect_failed(a),
            Ev::Handshake { agent, deadline } => self.handshake(agent, deadline),
            Ev::Hello { agent, session } => self.hello(agent, session),
            Ev::Welcome {
                agent,
                session,
                lease,
                revision,
                catalog,
            } => self.welcome(agent, session, lease, revision, catalog),
            Ev::Subscribe { session, subs } => self.subscribe(session, subs),
            Ev::Update {
                agent,
                session,
                updates,
            } => self.update(agent, session, updates),
            Ev::Witness {
                agent,
                session,
                node,
                epoch,
                addresses,
            } => self.witness_asked(agent, session, node, epoch, addresses),
            Ev::SendDone { session } => {
                if let Some(r) = self.replica_of_session(session) {
                    let sent = rollcall_leases::replica::Input::Sent { agent: session };
                    self.arbiter_wake(r, vec![sent]);
                }
            }
            Ev::Message {
                agent,
                session,
                message,
            } => self.message_down(agent, session, message),
            Ev::Request {
                agent,
                session,
                request,
                body,
            } => self.request(agent, session, request, body),
            Ev::Answer {
                agent,
                request,
                response,
            } => self.feed(
                agent,
                rollcall_node::agent_state::Input::Answer {
                    request,
                    result: Ok(response),
                },
            ),
            Ev::Closed { agent, session } => self.closed(agent, session),
            Ev::IdleCheck { agent, session } => self.idle_check(agent, session),
            Ev::Commit { generation } => self.commit(generation),
            Ev::WriteTimeout {
                replica,
                run,
                index,
                batch,
            } => self.write_timeout(replica, run, index, batch),
            Ev::CatchUp { replica } => self.catch_up(replica),
            Ev::Elect => {
                self.group.election_due = false;
                self.election();
            }
            Ev::PeerArrive { call, request } => self.peer_arrive(call, request),
            Ev::PeerAnswer { call, response } => self.peer_end(call, Ok(response)),
            Ev::PeerUnreachable { call } => {
                let address = self
                    .group
                    .calls
                    .get(&call)
                    .map(|c| c.address.clone())
                    .unwrap_or_default();
                self.peer_end(
                    call,
                    Err(format!(
                        "replica {address} unreachable: no handshake within {} ms",
                        super::peers::PEER_HANDSHAKE_MS
                    )),
                );
            }
            Ev::PeerTimeout { call } => self.peer_timeout(call),
            Ev::SessionLost { agent, session } => self.session_lost(agent, session),
            Ev::ArbiterSilent {
                agent,
                session,
                due,
            } => self.arbiter_silent(agent, session, due),
            Ev::ReplicaStart { replica } => self.start_replica(replica),
            Ev::ArbiterWake { replica, at_ms } => self.arbiter_woken(replica, at_ms),
            Ev::ArbiterSample => self.arbiter_sample(),
            Ev::Replace { inst, drain_ms } => self.replace(inst, drain_ms),
            Ev::StopOld { inst } => self.stop_old(inst),
            Ev::Pause { agent, ms } => self.pause(agent, ms),
            Ev::Traffic => self.traffic(),
            Ev::ArbiterStart => self.arbiter_start(),
            Ev::Heal(zone) => {
                self.cut_zones.remove(&zone);
                self.last_recovery_ms = Some(self.now_ms());
                self.converged_at_ms = None;
                self.after(CONVERGE_CHECK_MS * 1_000, Ev::ConvergeCheck);
            }
            Ev::ConvergeCheck => {
                if self.converged_at_ms.is_none() {
                    if self.converged() {
                        self.converged_at_ms = Some(self.now_ms());
                    } else {
                        self.after(CONVERGE_CHECK_MS * 1_000, Ev::ConvergeCheck);
                    }
                }
            }
        }
    }

    // ----- scenario steps -----

    fn step(&mut self, i: usize) {
        let step: Step = self.sc.steps[i].clone();
        let now_ms = self.now_ms();
        self.hash(&[0x57, i as u64, now_ms]);
        let over_us = (step.over_s.unwrap_or(0.0) * 1e6) as Time;
        match step.action {
            Action::Phase => {
                let name = step.name.clone().unwrap_or_else(|| format!("step-{i}"));
                self.phases.push((name, now_ms, 0, 0));
            }
            Action::Deploy | Action::Churn => {
                let drain_ms = match step.action {
                    Action::Deploy => (step.drain_s.unwrap_or(5.0) * 1e3) as u64,
                    _ => (step.drain_s.unwrap_or(0.0) * 1e3) as u64,
                };
                let mut live: Vec<u32> = (0..self.insts.len() as u32)
                    .filter(|&k| {
                        let inst = &self.insts[k as usize];
                        inst.alive && !inst.leaving && !self.agents[inst.agent as usize].dead
                    })
                    .collect();
                let count = ((live.len() as f64) * step.share.unwrap_or(0.0)).round() as usize;
                // A partial Fisher–Yates shuffle picks `count` at random.
                for j in 0..count.min(live.len()) {
                    let k = self.rng.random_range(j..live.len());
                    live.swap(j, k);
                }
                for (j, &inst) in live.iter().take(count).enumerate() {
                    let at = self.now + over_us * j as u64 / count.max(1) as u64;
                    self.at(at, Ev::Replace { inst, drain_ms });
                }
            }
            Action::Pauses => {
                let rate = step.rate_per_s.unwrap_or(0.0);
                let count = (rate * step.over_s.unwrap_or(0.0)).round() as u64;
                let pause_ms = step.pause_ms.unwrap_or(1_000);
                for _ in 0..count {
                    let at = self.now + self.rng.random_range(0..over_us.max(1));
                    let agent = self.rng.random_range(0..self.agents.len()) as u32;
                    self.at(
                        at,
                        Ev::Pause {
                            agent,
                            ms: pause_ms,
                        },
                    );
                }
            }
            Action::CrashNodes => {
                let mut live: Vec<u32> = (0..self.agents.len() as u32)
                    .filter(|&a| !self.agents[a as usize].dead)
                    .collect();
                let count = ((self.agents.len() as f64) * step.share.unwrap_or(0.0))
                    .round()
                    .max(1.0) as usize;
                for j in 0..count.min(live.len()) {
                    let k = self.rng.random_range(j..live.len());
                    live.swap(j, k);
                }
                let mut chosen: Vec<u32> = live.into_iter().take(count).collect();
                chosen.sort_unstable();
                for a in chosen {
                    self.crash(a);
                }
            }
            Action::PartitionZone => {
                let zone = step.zone.unwrap_or(1) - 1;
                self.cut_zones.insert(zone);
                // The replica's end closes at the idle timeout; an agent
                // that sends meanwhile closes its own at its silence check.
                let members = self.zone_members[zone as usize].clone();
                for a in members {
                    if let Some((_, session)) = self.agents[a as usize].session {
                        self.after(IDLE_TIMEOUT_MS * 1_000, Ev::IdleCheck { agent: a, session });
                    }
                }
                self.after(over_us, Ev::Heal(zone));
            }
            Action::StopArbiter => {
                self.arbiter_stop();
                self.outage = Some((now_ms, now_ms + over_us / 1_000));
                self.after(over_us, Ev::ArbiterStart);
            }
            Action::KillLeader => {
                if let Some(leader) = self.group.leader {
                    self.kill_replica(leader);
                    self.after(over_us, Ev::ReplicaStart { replica: leader });
                }
            }
            Action::LoseQuorum => {
                let keep = self.group.leader.unwrap_or(0);
                for r in (0..self.arbs.len()).filter(|&r| r != keep) {
                    self.kill_replica(r);
                    self.after(over_us, Ev::ReplicaStart { replica: r });
                }
            }
        }
    }

    /// The scenario being run.
    pub fn scenario(&self) -> &SimScenario {
        &self.sc
    }
}

pub(super) fn bump(series: &mut Vec<u32>, i: usize, by: u32) {
    if series.len() <= i {
        series.resize(i + 1, 0);
    }
    series[i] += by;
}

pub(super) fn kind_code(c: &Command) -> u64 {
    xxhash_rust::xxh3::xxh3_64(c.kind().as_bytes())
}

pub(super) fn agent_ip(a: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0a40_0000 + a))
}

pub(super) fn parse_node(name: &str) -> Option<u32> {
    name.strip_prefix('n')?.parse().ok()
}

pub(super) fn parse_inst(name: &str) -> Option<u32> {
    name.strip_prefix('i')?.parse().ok()
}
