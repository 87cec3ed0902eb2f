//! The simulated region: one discrete-event loop over a virtual clock and
//! one seeded RNG, driving the real state machines.
//!
//! - Gossip: one [`rollcall_gossip::sim::Sim`] per zone (the real foca
//!   `Membership` of every agent over a simulated network), stepped in
//!   lockstep with this loop so every membership event lands at its time.
//! - Arbiter: the real [`Catalog`] (commands, leases, mass-expiry guard,
//!   delta log) fed by an ordered log that commits a batch of proposals
//!   `commit_latency_ms` after it starts (the Raft group), and the real
//!   [`Distributor`]. Around them, the leader's memory as the arbiter's core
//!   keeps it (`leases/src/server/core.rs`): renewals and session silence,
//!   the two-signal rule for gossip down reports, `silent_in_zone` for
//!   expiries, the lease extension after a restart.
//! - Agents: the real [`Sync`] (subscriptions, delta and snapshot checks,
//!   acks), [`InstanceHealth`] per instance (readiness probes at their
//!   configured interval), [`ServiceMemory`] and [`selector::choose`] for
//!   the sampled connections, local gossip ejection while cut off (R7), and
//!   the reconnect loop with exponential backoff and full jitter.
//!
//! The driver is the only code here that is not the binaries' own: it
//! moves messages with latencies and transfer times, fires timers, and
//! records what the report needs. Everything random comes from the
//! scenario seed, and nothing iterates a randomly seeded map, so a seed
//! replays exactly; [`World::digest`] hashes the history to prove it.

use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rollcall_config::{AgentConfig, ArbiterConfig, CheckTiming, SwimSettings};
use rollcall_gossip::sim::{Sim as ZoneSim, SimConfig};
use rollcall_gossip::MembershipEvent;
use rollcall_leases::distribution::{DistParams, Distributor, Output};
use rollcall_leases::protocol::ServiceUpdate;
use rollcall_leases::{
    AgentEpoch, Applied, Catalog, CatalogParams, Command, Effect, EndpointRecord, Envelope,
    Generation, InstanceId, Label, NodeId, Principal, PrincipalName, Reason, Registration,
    Revision, Role, ServiceKey, ShardId, State, Version, Weight,
};
use rollcall_node::api_types::{Check, CheckKind, ValidChecks};
use rollcall_node::endpoints::ServiceMemory;
use rollcall_node::health::{HealthEvent, InstanceHealth, Which};
use rollcall_node::selector;
use rollcall_node::sync::{Sync, SyncOut};
use xxhash_rust::xxh3::Xxh3;

use super::scenario::{Action, SimScenario, Step};

/// How often each agent's probe scheduler runs, in ms (a probe is at most
/// this late: the scheduler's own jitter).
const TICK_MS: u64 = 100;
/// QUIC idle timeout of an agent's session (leases/src/client.rs), ms.
const IDLE_TIMEOUT_MS: u64 = 10_000;
/// How often convergence is checked after the last recovery, ms.
const CONVERGE_CHECK_MS: u64 = 500;
/// How often a QUIC handshake's packets are sent again while lost, ms.
const HANDSHAKE_RETRY_MS: u64 = 1_000;
/// A session that lasted this long resets the agent's reconnect backoff.
const BACKOFF_RESET_MS: u64 = 10_000;

type Time = u64; // µs

fn ms(us: Time) -> u64 {
    us / 1_000
}

/// One agent's write to the arbiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WriteKind {
    Register,
    Ready,
    Drain,
    Deregister,
}

#[derive(Clone, Copy, Debug)]
struct Write {
    inst: u32,
    kind: WriteKind,
}

enum Ev {
    Step(usize),
    AgentTick(u32),
    Connect(u32),
    ConnectFailed(u32),
    Handshake {
        agent: u32,
        deadline: Time,
    },
    Hello {
        agent: u32,
        session: u64,
    },
    Welcome {
        agent: u32,
        session: u64,
    },
    Subscribe {
        session: u64,
        subs: Vec<(u32, Option<Revision>)>,
    },
    Update {
        agent: u32,
        session: u64,
        updates: Vec<ServiceUpdate>,
    },
    SendDone {
        session: u64,
    },
    Wake {
        session: u64,
    },
    WriteArrive {
        agent: u32,
        session: u64,
        write: Write,
    },
    WriteReply {
        agent: u32,
        write: Write,
        result: Result<Option<Generation>, ()>,
    },
    ReportDown {
        reporter: u32,
        node: u32,
        epoch: AgentEpoch,
    },
    Closed {
        agent: u32,
        session: u64,
    },
    IdleCheck {
        agent: u32,
        session: u64,
    },
    Commit,
    ArbiterTick,
    Retry {
        agent: u32,
        service: u32,
    },
    Replace {
        inst: u32,
        drain_ms: u64,
    },
    StopOld {
        inst: u32,
    },
    Pause {
        agent: u32,
        ms: u64,
    },
    Traffic,
    ArbiterStart,
    Heal(u32),
    ConvergeCheck,
}

impl Ev {
    /// The agent this event happens on, if it runs in an agent (a paused
    /// agent runs nothing: its events wait for the resume).
    fn on_agent(&self) -> Option<u32> {
        match self {
            Ev::AgentTick(a)
            | Ev::Connect(a)
            | Ev::ConnectFailed(a)
            | Ev::Handshake { agent: a, .. }
            | Ev::Welcome { agent: a, .. }
            | Ev::Update { agent: a, .. }
            | Ev::WriteReply { agent: a, .. }
            | Ev::Closed { agent: a, .. }
            | Ev::Retry { agent: a, .. } => Some(*a),
            _ => None,
        }
    }
}

#[derive(PartialEq, Eq)]
struct Key {
    due: Time,
    seq: u64,
    slot: usize,
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

struct Inst {
    id: InstanceId,
    service: u32,
    agent: u32,
    generation: Option<Generation>,
    health: InstanceHealth,
    alive: bool,
    leaving: bool,
    ready_pending: bool,
    ever_ready: bool,
    version: Version,
    port: u16,
    left_at_ms: Option<u64>,
}

struct Agent {
    node: NodeId,
    zone: u32,
    zone_index: usize,
    epoch: AgentEpoch,
    sync: Sync,
    follows: Vec<u32>,
    instances: Vec<u32>,
    /// Hello sent under this session number.
    connecting: Option<u64>,
    /// Welcomed under this session number.
    session: Option<u64>,
    session_since_ms: u64,
    failures: u32,
    dead: bool,
    paused_until: Time,
    /// Writes not answered yet (sent or waiting for a session), in order.
    writes: VecDeque<Write>,
    /// Writes sent in the current session.
    writes_sent: usize,
    reports: Vec<(u32, AgentEpoch)>,
    gossip_down: BTreeMap<u32, AgentEpoch>,
    memory: BTreeMap<u32, ServiceMemory>,
    next_keepalive_ms: u64,
    next_renew_ms: u64,
    /// Full snapshots received since the last outage ended.
    snapshots_since_outage: u32,
    reconnected_after_outage: bool,
    /// When the last message on the session stream arrives, each way
    /// (µs): the stream is ordered.
    down_last: Time,
    up_last: Time,
}

struct PendingDown {
    epoch: AgentEpoch,
    reporters: Vec<NodeId>,
    reported_at: u64,
}

enum Then {
    Welcome { agent: u32, session: u64 },
    Reply { agent: u32, write: Write },
    Nothing,
}

struct Arbiter {
    up: bool,
    catalog: Catalog,
    dist: Distributor,
    dist_params: DistParams,
    sessions: BTreeMap<u64, u32>,
    last_heard: Vec<Option<u64>>,
    leader_since: u64,
    pending_downs: BTreeMap<u32, PendingDown>,
    expiring: BTreeMap<u32, u64>,
    queue: Vec<(Envelope, Then)>,
    committing: bool,
    next_purge_ms: u64,
    me: Principal,
    max_snapshots_seen: usize,
}

/// A change whose arrival at every subscribed agent is being timed.
struct Tracked {
    revision: Option<Revision>,
    start: Time,
    outstanding: Vec<u64>,
    count: u32,
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
    pub pauses: u64,
    pub nodes_killed: u64,
    pub replaced: u64,
    pub reconnects: u64,
    pub snapshots_applied: u64,
    pub events: u64,
}

/// The simulated region.
pub struct World {
    sc: SimScenario,
    now: Time,
    seq: u64,
    queue: BinaryHeap<Key>,
    slots: Vec<Option<(Time, Ev)>>,
    free: Vec<usize>,
    rng: StdRng,
    zones: Vec<ZoneSim>,
    zone_members: Vec<Vec<u32>>,
    zone_labels: Vec<Label>,
    cut_zones: BTreeSet<u32>,
    services: Vec<ServiceKey>,
    service_index: HashMap<ServiceKey, u32>,
    followers: Vec<Vec<u32>>,
    insts: Vec<Inst>,
    agents: Vec<Agent>,
    arb: Arbiter,
    agent_config: AgentConfig,
    arbiter_config: ArbiterConfig,
    checks: ValidChecks,
    next_session: u64,
    leaves: BTreeMap<u32, Vec<Tracked>>,
    crashes: BTreeMap<u32, Vec<(u32, Tracked)>>,
    crash_last: BTreeMap<u32, (Time, Time, u32)>,
    delta_sizes: HashMap<(u64, Revision), u32>,
    hasher: Xxh3,
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
    deploy_seq: u32,
}

fn key(ns: &str, s: String, p: &str) -> ServiceKey {
    ServiceKey::new(ns, &s, p).expect("simulated names are valid")
}

fn service_sizes(services: u32, instances: u32, skew: f64) -> Vec<u32> {
    let weights: Vec<f64> = (1..=services).map(|k| (f64::from(k)).powf(-skew)).collect();
    let total: f64 = weights.iter().sum();
    let spare = f64::from(instances - services);
    let mut sizes: Vec<u32> = weights
        .iter()
        .map(|w| 1 + (spare * w / total).floor() as u32)
        .collect();
    let mut left = instances - sizes.iter().sum::<u32>();
    let mut k = 0;
    let len = sizes.len();
    while left > 0 {
        sizes[k % len] += 1;
        left -= 1;
        k += 1;
    }
    sizes
}

fn principal(role: Role, name: &str) -> Principal {
    Principal {
        role,
        name: PrincipalName::new(name).expect("simulated names are valid"),
    }
}

impl World {
    /// Builds the region at time 0: the catalog with every lease and
    /// instance (through real commands), each agent's views as a warm cache
    /// and its zone's membership as a zone that has run for a while.
    pub fn new(sc: SimScenario, seed: u64) -> World {
        let mut rng = StdRng::seed_from_u64(seed);
        let agent_config = AgentConfig::default();
        let mut arbiter_config = ArbiterConfig::default();
        arbiter_config.name = "sim-arbiter".into();
        let params = CatalogParams::from_config(&arbiter_config, ShardId(0))
            .expect("the default arbiter config is valid");
        let mut catalog = Catalog::new(params);
        let n = sc.agents as usize;
        let zones = sc.zones as usize;
        let zone_labels: Vec<Label> = (0..zones)
            .map(|z| Label::new(&format!("z{}", z + 1)).expect("valid"))
            .collect();
        let operator = principal(Role::Operator, "sim-bootstrap");
        let apply = |catalog: &mut Catalog, command: Command| {
            catalog
                .apply(&Envelope {
                    at_ms: 0,
                    actor: operator.clone(),
                    command,
                })
                .expect("bootstrap commands apply")
        };
        let mut zone_members: Vec<Vec<u32>> = vec![Vec::new(); zones];
        let mut agents = Vec::with_capacity(n);
        for a in 0..n {
            let zone = (a * zones / n) as u32;
            let node = NodeId::new(&format!("n{a:05}")).expect("valid");
            let zone_index = zone_members[zone as usize].len();
            zone_members[zone as usize].push(a as u32);
            apply(
                &mut catalog,
                Command::GrantLease {
                    node: node.clone(),
                    epoch: AgentEpoch(1),
                    zone: zone_labels[zone as usize].clone(),
                    ttl_ms: arbiter_config.lease.ttl_ms,
                },
            );
            agents.push(Agent {
                node,
                zone,
                zone_index,
                epoch: AgentEpoch(1),
                sync: Sync::new(ShardId(0)),
                follows: Vec::new(),
                instances: Vec::new(),
                connecting: None,
                session: None,
                session_since_ms: 0,
                failures: 0,
                dead: false,
                paused_until: 0,
                writes: VecDeque::new(),
                writes_sent: 0,
                reports: Vec::new(),
                gossip_down: BTreeMap::new(),
                memory: BTreeMap::new(),
                next_keepalive_ms: 0,
                next_renew_ms: 0,
                snapshots_since_outage: 0,
                reconnected_after_outage: false,
                down_last: 0,
                up_last: 0,
            });
        }
        // Services, sized by a Zipf-like law; instances spread at random.
        let services: Vec<ServiceKey> = (0..sc.services)
            .map(|k| key("sim", format!("s{k:04}"), "http"))
            .collect();
        let service_index = services
            .iter()
            .enumerate()
            .map(|(i, s)| (s.clone(), i as u32))
            .collect();
        let sizes = service_sizes(sc.services, sc.instances, sc.size_skew);
        let checks = ValidChecks {
            startup: None,
            readiness: Some(Check {
                kind: CheckKind::Tcp,
                timing: CheckTiming::READINESS,
                port: None,
            }),
            liveness: None,
        };
        let mut insts = Vec::with_capacity(sc.instances as usize);
        let v1 = Version::new("v1").expect("valid");
        for (s, &size) in sizes.iter().enumerate() {
            for _ in 0..size {
                let agent = rng.random_range(0..n) as u32;
                let k = insts.len() as u32;
                let port = 20_000 + agents[agent as usize].instances.len() as u16;
                let target = SocketAddr::new(agent_ip(agent), port);
                let mut health = InstanceHealth::new(Some(&checks), target, 0, &mut rng);
                let due = health.next_due_ms().unwrap_or(0);
                health.due(due, &mut rng);
                health.result(Which::Readiness, true, "", due, &mut rng);
                agents[agent as usize].instances.push(k);
                insts.push(Inst {
                    id: InstanceId::new(&format!("i{k:07}")).expect("valid"),
                    service: s as u32,
                    agent,
                    generation: None,
                    health,
                    alive: true,
                    leaving: false,
                    ready_pending: false,
                    ever_ready: true,
                    version: v1.clone(),
                    port,
                    left_at_ms: None,
                });
            }
        }
        for (k, inst) in insts.iter_mut().enumerate() {
            let a = &agents[inst.agent as usize];
            let applied = apply(
                &mut catalog,
                Command::Register(Registration {
                    instance_id: inst.id.clone(),
                    service: services[inst.service as usize].clone(),
                    node: a.node.clone(),
                    epoch: a.epoch,
                    address: agent_ip(inst.agent),
                    port: inst.port,
                    zone: Some(zone_labels[a.zone as usize].clone()),
                    version: inst.version.clone(),
                    weight: Weight::DEFAULT,
                    labels: Vec::new(),
                    initial: State::Ready,
                }),
            );
            let Effect::Registered { generation, .. } = applied.effect else {
                panic!("bootstrap registration {k} did not register");
            };
            inst.generation = Some(generation);
        }
        // Who follows what: 20–50 services per agent, skewed to popular ones.
        let weights: Vec<f64> = (1..=sc.services)
            .map(|k| f64::from(k).powf(-sc.follow_skew))
            .collect();
        let mut cumulative = Vec::with_capacity(weights.len());
        let mut total = 0.0;
        for w in &weights {
            total += w;
            cumulative.push(total);
        }
        let mut followers: Vec<Vec<u32>> = vec![Vec::new(); sc.services as usize];
        let views: Vec<rollcall_leases::ServiceView> = services
            .iter()
            .map(|s| {
                let snap = catalog.service_snapshot(s).expect("registered above");
                rollcall_leases::ServiceView::from_snapshot(&snap).expect("a fresh snapshot checks")
            })
            .collect();
        for (a, agent) in agents.iter_mut().enumerate() {
            let count = rng.random_range(sc.follows.0..=sc.follows.1) as usize;
            let mut chosen = BTreeSet::new();
            let mut tries = 0;
            while chosen.len() < count && tries < count * 50 {
                tries += 1;
                let x = rng.random_range(0.0..total);
                let k = cumulative.partition_point(|c| *c <= x);
                chosen.insert(k.min(weights.len() - 1) as u32);
            }
            for &s in &chosen {
                agent.sync.load_cached(views[s as usize].clone());
                followers[s as usize].push(a as u32);
            }
            agent.follows = chosen.into_iter().collect();
        }
        drop(views);
        // Gossip: one membership per zone.
        let preset = super::scenario::preset(&sc.gossip_preset).expect("validated");
        let settings: SwimSettings = preset.settings();
        let zone_sims: Vec<ZoneSim> = zone_members
            .iter()
            .enumerate()
            .map(|(z, members)| {
                let names = members
                    .iter()
                    .map(|&a| agents[a as usize].node.clone())
                    .collect();
                let config = SimConfig {
                    settings: settings.clone(),
                    seed: seed ^ (0x5151_0000 + z as u64),
                    latency_us: sc.network.gossip_latency_us,
                    loss: sc.network.loss,
                    warm_start: true,
                    ..SimConfig::lan(0)
                };
                ZoneSim::with_names(names, config)
            })
            .collect();
        let d = &arbiter_config.distribution;
        let dist_params = DistParams {
            coalesce_window_ms: d.coalesce_window_ms,
            max_concurrent_snapshots: d.max_concurrent_snapshots as usize,
            stall_timeout_ms: d.stall_timeout_ms,
            snapshot_retry_ms: d.snapshot_retry_ms,
            resend_after_ms: d.resend_after_ms,
        };
        let arb = Arbiter {
            up: true,
            catalog,
            dist: Distributor::new(dist_params.clone()),
            dist_params,
            sessions: BTreeMap::new(),
            last_heard: vec![None; n],
            leader_since: 0,
            pending_downs: BTreeMap::new(),
            expiring: BTreeMap::new(),
            queue: Vec::new(),
            committing: false,
            next_purge_ms: arbiter_config.store.purge_interval_ms,
            me: principal(Role::Arbiter, "sim-arbiter"),
            max_snapshots_seen: 0,
        };
        let mut world = World {
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            rng,
            zones: zone_sims,
            zone_members,
            zone_labels,
            cut_zones: BTreeSet::new(),
            services,
            service_index,
            followers,
            insts,
            agents,
            arb,
            agent_config,
            arbiter_config,
            checks,
            next_session: 0,
            leaves: BTreeMap::new(),
            crashes: BTreeMap::new(),
            crash_last: BTreeMap::new(),
            delta_sizes: HashMap::new(),
            hasher: Xxh3::new(),
            leave_samples: Vec::new(),
            crash_samples: Vec::new(),
            counters: Counters::default(),
            outage: None,
            last_recovery_ms: None,
            converged_at_ms: None,
            phases: vec![("start".into(), 0, 0, 0)],
            gossip_packets: 0,
            gossip_bytes: 0,
            gossip_lost: 0,
            deploy_seq: 0,
            sc,
        };
        // Agents connect over the first two seconds; timers start spread.
        for a in 0..n as u32 {
            let at = world.rng.random_range(0..2_000_000);
            world.at(at, Ev::Connect(a));
            let tick = world.rng.random_range(0..TICK_MS * 1_000);
            world.at(tick, Ev::AgentTick(a));
        }
        world.at(250_000, Ev::ArbiterTick);
        for i in 0..world.sc.steps.len() {
            let at = (world.sc.steps[i].at_s * 1e6) as Time;
            world.at(at, Ev::Step(i));
        }
        if world.sc.conns_per_s > 0.0 {
            world.at(1_000_000, Ev::Traffic);
        }
        world
    }

    fn at(&mut self, due: Time, ev: Ev) {
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

    fn after(&mut self, us: Time, ev: Ev) {
        self.at(self.now + us, ev);
    }

    /// When a message the arbiter sends now on agent `a`'s session stream
    /// after `delay` arrives: never before the one sent ahead of it (the
    /// stream is ordered).
    fn down_arrival(&mut self, a: u32, delay: Time) -> Time {
        let agent = &mut self.agents[a as usize];
        let at = (self.now + delay).max(agent.down_last + 1);
        agent.down_last = at;
        at
    }

    /// Likewise for what agent `a` sends on its session stream.
    fn up_arrival(&mut self, a: u32, delay: Time) -> Time {
        let agent = &mut self.agents[a as usize];
        let at = (self.now + delay).max(agent.up_last + 1);
        agent.up_last = at;
        at
    }

    fn arbiter_latency(&mut self) -> Time {
        let (lo, hi) = self.sc.network.arbiter_latency_us;
        self.rng.random_range(lo..=hi.max(lo))
    }

    fn hash(&mut self, words: &[u64]) {
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
            Ev::AgentTick(a) => self.agent_tick(a),
            Ev::Connect(a) => self.connect(a),
            Ev::ConnectFailed(a) => self.reconnect_later(a),
            Ev::Handshake { agent, deadline } => self.handshake(agent, deadline),
            Ev::Hello { agent, session } => self.hello(agent, session),
            Ev::Welcome { agent, session } => self.welcome(agent, session),
            Ev::Subscribe { session, subs } => self.subscribe(session, subs),
            Ev::Update {
                agent,
                session,
                updates,
            } => self.update(agent, session, updates),
            Ev::SendDone { session } => {
                if self.arb.up && self.arb.sessions.contains_key(&session) {
                    let mut out = Vec::new();
                    self.arb
                        .dist
                        .sent(session, self.now_ms(), &self.arb.catalog, &mut out);
                    self.carry(out);
                }
            }
            Ev::Wake { session } => {
                if self.arb.up && self.arb.sessions.contains_key(&session) {
                    let mut out = Vec::new();
                    self.arb
                        .dist
                        .wake(session, self.now_ms(), &self.arb.catalog, &mut out);
                    self.carry(out);
                }
            }
            Ev::WriteArrive {
                agent,
                session,
                write,
            } => self.write_arrive(agent, session, write),
            Ev::WriteReply {
                agent,
                write,
                result,
            } => self.write_reply(agent, write, result),
            Ev::ReportDown {
                reporter,
                node,
                epoch,
            } => self.report_down(reporter, node, epoch),
            Ev::Closed { agent, session } => {
                let a = &self.agents[agent as usize];
                if a.session == Some(session) || a.connecting == Some(session) {
                    self.disconnected(agent);
                }
            }
            Ev::IdleCheck { agent, session } => self.idle_check(agent, session),
            Ev::Commit => self.commit(),
            Ev::ArbiterTick => self.arbiter_tick(),
            Ev::Retry { agent, service } => {
                let key = self.services[service as usize].clone();
                let mut out = Vec::new();
                self.agents[agent as usize].sync.retry(&key, &mut out);
                self.sync_out(agent, out);
            }
            Ev::Replace { inst, drain_ms } => self.replace(inst, drain_ms),
            Ev::StopOld { inst } => {
                let agent = self.insts[inst as usize].agent;
                if !self.agents[agent as usize].dead {
                    self.insts[inst as usize].alive = false;
                    self.agents[agent as usize].instances.retain(|&i| i != inst);
                    self.write(
                        agent,
                        Write {
                            inst,
                            kind: WriteKind::Deregister,
                        },
                    );
                }
            }
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
                // Both ends notice after the idle timeout.
                let members = self.zone_members[zone as usize].clone();
                for a in members {
                    if let Some(session) = self.agents[a as usize].session {
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
        }
    }

    fn crash(&mut self, a: u32) {
        let now = self.now;
        self.counters.nodes_killed += 1;
        self.hash(&[0xc7, u64::from(a), ms(now)]);
        let agent = &mut self.agents[a as usize];
        agent.dead = true;
        let (zone, index) = (agent.zone as usize, agent.zone_index);
        self.zones[zone].kill(index);
        let instances = agent.instances.clone();
        // Who routes to this node's instances now: every live follower.
        let mut by_service: BTreeSet<u32> = BTreeSet::new();
        for &k in &instances {
            let inst = &mut self.insts[k as usize];
            if inst.alive && !inst.leaving {
                by_service.insert(inst.service);
            }
            inst.alive = false;
        }
        // The node no longer counts in anything it was waiting for.
        self.forget_agent(a);
        let mut tracked = Vec::new();
        for s in by_service {
            let (outstanding, count) = self.live_followers(s, Some(a));
            if count > 0 {
                tracked.push((
                    s,
                    Tracked {
                        revision: None,
                        start: now,
                        outstanding,
                        count,
                    },
                ));
            }
        }
        if tracked.is_empty() {
            self.crash_samples.push(0);
        } else {
            self.crash_last.insert(a, (now, now, tracked.len() as u32));
            self.crashes.insert(a, tracked);
        }
    }

    fn live_followers(&self, service: u32, except: Option<u32>) -> (Vec<u64>, u32) {
        let mut bits = vec![0u64; self.agents.len().div_ceil(64)];
        let mut count = 0;
        for &f in &self.followers[service as usize] {
            if Some(f) == except || self.agents[f as usize].dead {
                continue;
            }
            bits[f as usize / 64] |= 1 << (f % 64);
            count += 1;
        }
        (bits, count)
    }

    fn forget_agent(&mut self, a: u32) {
        let now = self.now;
        let word = a as usize / 64;
        let bit = 1u64 << (a % 64);
        let mut done_leaves = Vec::new();
        for (s, list) in &mut self.leaves {
            for t in list.iter_mut() {
                if t.outstanding[word] & bit != 0 {
                    t.outstanding[word] &= !bit;
                    t.count -= 1;
                }
            }
            if list.iter().any(|t| t.count == 0) {
                done_leaves.push(*s);
            }
        }
        for s in done_leaves {
            let list = self.leaves.get_mut(&s).expect("listed");
            for t in list.iter().filter(|t| t.count == 0) {
                self.leave_samples.push(ms(now.saturating_sub(t.start)));
            }
            list.retain(|t| t.count > 0);
        }
        let nodes: Vec<u32> = self.crashes.keys().copied().collect();
        for node in nodes {
            self.eject(node, a, None);
        }
    }

    /// Agent `a` no longer routes to node `node`'s instances in the
    /// services listed (all when `None`).
    fn eject(&mut self, node: u32, a: u32, only: Option<(u32, Revision)>) {
        let now = self.now;
        let Some(list) = self.crashes.get_mut(&node) else {
            return;
        };
        let word = a as usize / 64;
        let bit = 1u64 << (a % 64);
        let mut finished = 0;
        for (s, t) in list.iter_mut() {
            if let Some((service, revision)) = only {
                if *s != service || !t.revision.is_some_and(|r| revision >= r) {
                    continue;
                }
            }
            if t.outstanding[word] & bit != 0 {
                t.outstanding[word] &= !bit;
                t.count -= 1;
                if t.count == 0 {
                    finished += 1;
                }
            }
        }
        if finished > 0 {
            list.retain(|(_, t)| t.count > 0);
            let empty = list.is_empty();
            let entry = self.crash_last.get_mut(&node).expect("tracked");
            entry.1 = now;
            if empty {
                let (start, last, _) = self.crash_last.remove(&node).expect("tracked");
                self.crashes.remove(&node);
                self.crash_samples.push(ms(last - start));
                self.hash(&[0xe1, u64::from(node), ms(last - start)]);
            }
        }
    }

    fn replace(&mut self, old: u32, drain_ms: u64) {
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
        let health = InstanceHealth::new(Some(&self.checks), target, now_ms, &mut self.rng);
        self.insts.push(Inst {
            id: InstanceId::new(&format!("i{k:07}")).expect("valid"),
            service,
            agent,
            generation: None,
            health,
            alive: true,
            leaving: false,
            ready_pending: false,
            ever_ready: false,
            version: Version::new("v2").expect("valid"),
            port,
            left_at_ms: None,
        });
        self.agents[agent as usize].instances.push(k);
        self.write(
            agent,
            Write {
                inst: k,
                kind: WriteKind::Register,
            },
        );
    }

    fn pause(&mut self, a: u32, pause_ms: u64) {
        let agent = &mut self.agents[a as usize];
        if agent.dead {
            return;
        }
        self.counters.pauses += 1;
        let until = self.now + pause_ms * 1_000;
        agent.paused_until = agent.paused_until.max(until);
        let (zone, index) = (agent.zone as usize, agent.zone_index);
        self.zones[zone].pause(index, pause_ms);
    }

    // ----- agents -----

    fn cut(&self, a: u32) -> bool {
        self.cut_zones.contains(&self.agents[a as usize].zone)
    }

    /// Whether a message between agent `a` and the arbiter gets through.
    fn link_up(&self, a: u32) -> bool {
        self.arb.up && !self.cut(a) && !self.agents[a as usize].dead
    }

    fn agent_tick(&mut self, a: u32) {
        let now_ms = self.now_ms();
        self.after(TICK_MS * 1_000, Ev::AgentTick(a));
        // Probes: every instance whose check is due.
        let instances = self.agents[a as usize].instances.clone();
        for k in instances {
            let inst = &mut self.insts[k as usize];
            if !inst.alive || inst.health.next_due_ms().is_none_or(|d| d > now_ms) {
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
                if let HealthEvent::Ready = event {
                    let inst = &mut self.insts[k as usize];
                    if inst.generation.is_some() {
                        self.write(
                            a,
                            Write {
                                inst: k,
                                kind: WriteKind::Ready,
                            },
                        );
                    } else {
                        inst.ready_pending = true;
                    }
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
            let third = self.arbiter_config.lease.ttl_ms / 3;
            let jitter = self.rng.random_range(0..=third / 10);
            self.agents[a as usize].next_renew_ms = now_ms + third - third / 20 + jitter;
        }
        if (keepalive || renew) && self.link_up(a) {
            // Heard on arrival; recorded now, the latency is far below
            // any silence threshold.
            let arrive = now_ms + 1;
            self.arb.last_heard[a as usize] = Some(arrive);
            self.counters.keepalives += u64::from(keepalive);
            if renew {
                self.counters.renewals += 1;
                let agent = &self.agents[a as usize];
                let renewal = self
                    .arb
                    .catalog
                    .leases_mut()
                    .renew(&agent.node, agent.epoch, arrive);
                if let Ok(r) = renewal {
                    if r.held {
                        let zone = self.zone_labels[agent.zone as usize].clone();
                        let env = Envelope {
                            at_ms: arrive,
                            actor: principal(Role::Agent, agent.node.as_str()),
                            command: Command::GrantLease {
                                node: agent.node.clone(),
                                epoch: agent.epoch,
                                zone,
                                ttl_ms: self.arbiter_config.lease.ttl_ms,
                            },
                        };
                        self.propose(env, Then::Nothing);
                    }
                }
            }
        }
    }

    fn connect(&mut self, a: u32) {
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
    fn handshake(&mut self, a: u32, deadline: Time) {
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

    fn start_session(&mut self, a: u32, latency: Time) {
        self.next_session += 1;
        let session = self.next_session;
        self.agents[a as usize].connecting = Some(session);
        // Handshake (one round trip) then Hello.
        self.after(3 * latency, Ev::Hello { agent: a, session });
    }

    fn reconnect_later(&mut self, a: u32) {
        let agent = &mut self.agents[a as usize];
        agent.connecting = None;
        if agent.session.is_some() {
            return;
        }
        let min = self.agent_config.reconnect_min_ms;
        let max = self.agent_config.reconnect_max_ms;
        let cap = max.min(min.saturating_mul(1 << agent.failures.min(20)));
        agent.failures = agent.failures.saturating_add(1);
        let wait = self.rng.random_range(0..=cap);
        self.after(wait * 1_000, Ev::Connect(a));
    }

    fn disconnected(&mut self, a: u32) {
        let now_ms = self.now_ms();
        let agent = &mut self.agents[a as usize];
        let lasted = agent.session.is_some()
            && now_ms.saturating_sub(agent.session_since_ms) > BACKOFF_RESET_MS;
        if lasted {
            agent.failures = 0;
        }
        agent.session = None;
        agent.connecting = None;
        agent.writes_sent = 0;
        agent.sync.disconnected(now_ms);
        // Cut off: this agent's gossip verdicts now count for its routing.
        let down: Vec<u32> = agent.gossip_down.keys().copied().collect();
        for node in down {
            self.eject(node, a, None);
        }
        let min = self.agent_config.reconnect_min_ms;
        let max = self.agent_config.reconnect_max_ms;
        let agent = &mut self.agents[a as usize];
        let cap = max.min(min.saturating_mul(1 << agent.failures.min(20)));
        agent.failures = agent.failures.saturating_add(1);
        let wait = self.rng.random_range(0..=cap);
        self.after(wait * 1_000, Ev::Connect(a));
    }

    fn welcome(&mut self, a: u32, session: u64) {
        let now_ms = self.now_ms();
        let agent = &mut self.agents[a as usize];
        if agent.connecting != Some(session) {
            return;
        }
        agent.connecting = None;
        agent.session = Some(session);
        agent.session_since_ms = now_ms;
        agent.next_keepalive_ms = now_ms + self.agent_config.keepalive_ms;
        agent.next_renew_ms = now_ms + self.arbiter_config.lease.ttl_ms / 3;
        if self.outage.is_some_and(|(_, end)| now_ms >= end) && !agent.reconnected_after_outage {
            agent.reconnected_after_outage = true;
            agent.snapshots_since_outage = 0;
        }
        self.counters.reconnects += 1;
        let mut out = Vec::new();
        agent.sync.connected(&mut out);
        self.sync_out(a, out);
        // Pending writes and down reports go out now.
        self.flush_writes(a);
        let reports = std::mem::take(&mut self.agents[a as usize].reports);
        for (node, epoch) in reports {
            self.send_report(a, node, epoch);
        }
    }

    fn sync_out(&mut self, a: u32, out: Vec<SyncOut>) {
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

    /// Agent `a` applied service `s` up to `revision`.
    fn applied(&mut self, a: u32, s: u32, revision: Revision) {
        let now = self.now;
        self.hash(&[0xa9, u64::from(a), u64::from(s), revision.0, ms(now)]);
        let word = a as usize / 64;
        let bit = 1u64 << (a % 64);
        if let Some(list) = self.leaves.get_mut(&s) {
            let mut done = false;
            for t in list.iter_mut() {
                if t.revision.is_some_and(|r| r <= revision) && t.outstanding[word] & bit != 0 {
                    t.outstanding[word] &= !bit;
                    t.count -= 1;
                    done |= t.count == 0;
                }
            }
            if done {
                for t in list.iter().filter(|t| t.count == 0) {
                    self.leave_samples.push(ms(now - t.start));
                }
                list.retain(|t| t.count > 0);
                if list.is_empty() {
                    self.leaves.remove(&s);
                }
            }
        }
        if !self.crashes.is_empty() {
            let nodes: Vec<u32> = self.crashes.keys().copied().collect();
            for node in nodes {
                self.eject(node, a, Some((s, revision)));
            }
        }
    }

    fn update(&mut self, a: u32, session: u64, updates: Vec<ServiceUpdate>) {
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

    fn write(&mut self, a: u32, write: Write) {
        self.agents[a as usize].writes.push_back(write);
        self.flush_writes(a);
    }

    /// Sends every write not sent in this session whose instance's
    /// generation is known (a registration's later writes wait for it).
    fn flush_writes(&mut self, a: u32) {
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

    fn write_reply(&mut self, a: u32, write: Write, result: Result<Option<Generation>, ()>) {
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

    fn idle_check(&mut self, a: u32, session: u64) {
        if self.agents[a as usize].session != Some(session) || !self.cut(a) {
            return;
        }
        // Neither end heard the other for the idle timeout.
        self.drop_session(session);
        self.disconnected(a);
    }

    fn gossip_event(&mut self, zone: usize, observer: usize, event: MembershipEvent) {
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
                agent.gossip_down.insert(node, id.epoch);
                if agent.session.is_none() {
                    self.eject(node, a, None);
                }
                if self.agents[a as usize].session.is_some() {
                    self.send_report(a, node, id.epoch);
                } else {
                    self.agents[a as usize].reports.push((node, id.epoch));
                }
            }
            MembershipEvent::Up(id) | MembershipEvent::Rejoined(id) => {
                if let Some(node) = parse_node(id.node.as_str()) {
                    self.agents[a as usize].gossip_down.remove(&node);
                }
            }
            _ => {}
        }
    }

    fn send_report(&mut self, a: u32, node: u32, epoch: AgentEpoch) {
        if self.link_up(a) {
            let latency = self.arbiter_latency();
            self.after(
                latency,
                Ev::ReportDown {
                    reporter: a,
                    node,
                    epoch,
                },
            );
        }
    }

    // ----- traffic -----

    fn traffic(&mut self) {
        let gap = (1e6 / self.sc.conns_per_s).max(1.0) as Time;
        self.after(gap, Ev::Traffic);
        let a = self.rng.random_range(0..self.agents.len()) as u32;
        let agent = &self.agents[a as usize];
        if agent.dead || agent.paused_until > self.now || agent.follows.is_empty() {
            return;
        }
        let s = agent.follows[self.rng.random_range(0..agent.follows.len())];
        let key = self.services[s as usize].clone();
        let now_ms = self.now_ms();
        let Some(view) = agent.sync.get(&key).and_then(|t| t.view.as_ref()) else {
            return;
        };
        let records: Vec<Arc<EndpointRecord>> = view.records().cloned().collect();
        let leaving = BTreeSet::new();
        // Cut off from the arbiter, the agent trusts its own gossip (R7).
        let down: BTreeSet<NodeId> = if agent.session.is_none() {
            agent
                .gossip_down
                .keys()
                .map(|&n| self.agents[n as usize].node.clone())
                .collect()
        } else {
            BTreeSet::new()
        };
        let zone = self.zone_labels[agent.zone as usize].clone();
        let p = self.agent_config.data_plane.clone();
        let memory = self.agents[a as usize].memory.entry(s).or_default();
        let selection = memory.select(&records, &leaving, &down, now_ms, &p);
        let ready = records.iter().filter(|r| r.state == State::Ready).count();
        let mut tried = BTreeSet::new();
        let mut answered = None;
        for _ in 0..=p.retries {
            let Some(i) = selector::choose(
                &selection.candidates,
                &zone,
                &|_| 0,
                &tried,
                p.local_zone_min_share,
                &mut self.rng,
            ) else {
                break;
            };
            let id = selection.candidates[i].record.instance_id.clone();
            let k = parse_inst(id.as_str()).unwrap_or(u32::MAX);
            let up = self.insts.get(k as usize).is_some_and(|inst| inst.alive);
            let memory = self.agents[a as usize].memory.entry(s).or_default();
            if up {
                memory.connect_succeeded(&id);
                answered = Some(k);
                break;
            }
            memory.connect_failed(&id, ready, now_ms, &p);
            self.counters.failed_attempts += 1;
            tried.insert(id);
        }
        self.counters.conns += 1;
        let phase = self.phases.last_mut().expect("a first phase");
        phase.2 += 1;
        match answered {
            Some(k) => {
                let inst = &self.insts[k as usize];
                if inst
                    .left_at_ms
                    .is_some_and(|t| now_ms > t + crate::report::DRAIN_GRACE_MS)
                {
                    self.counters.new_conns_to_drained += 1;
                }
                if !inst.ever_ready {
                    self.counters.new_conns_to_not_ready += 1;
                }
            }
            None if !selection.candidates.is_empty() => {
                self.counters.failed_conns += 1;
                phase.3 += 1;
                if self.outage.is_some_and(|(s, e)| now_ms >= s && now_ms < e) && tried.is_empty() {
                    self.counters.failed_conns_in_outage += 1;
                }
            }
            None => {}
        }
    }

    // ----- arbiter -----

    fn hello(&mut self, a: u32, session: u64) {
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

    fn subscribe(&mut self, session: u64, subs: Vec<(u32, Option<Revision>)>) {
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

    fn write_arrive(&mut self, a: u32, session: u64, write: Write) {
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

    fn report_down(&mut self, reporter: u32, node: u32, epoch: AgentEpoch) {
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
    fn heard_at(&self, node: u32) -> u64 {
        self.arb.last_heard[node as usize]
            .map_or(self.arb.leader_since, |t| t.max(self.arb.leader_since))
    }

    /// The two signals of R4, as the arbiter's core settles them.
    fn decide_downs(&mut self) {
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

    fn arbiter_tick(&mut self) {
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

    fn propose(&mut self, env: Envelope, then: Then) {
        if !self.arb.up {
            return;
        }
        self.arb.queue.push((env, then));
        if !self.arb.committing {
            self.arb.committing = true;
            self.after(self.sc.arbiter.commit_latency_ms * 1_000, Ev::Commit);
        }
    }

    fn commit(&mut self) {
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

    fn after_commit(&mut self, env: &Envelope, applied: &Applied) {
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
    fn carry(&mut self, out: Vec<Output>) {
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

    fn message_bytes(&mut self, updates: &[ServiceUpdate]) -> u64 {
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

    fn drop_session(&mut self, session: u64) {
        if self.arb.sessions.remove(&session).is_some() {
            self.arb.dist.disconnect(session);
        }
    }

    fn arbiter_stop(&mut self) {
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

    fn arbiter_start(&mut self) {
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

    // ----- checks at the end -----

    /// Every live, connected agent holds every followed service at the
    /// catalog's revision of it, and no write is waiting.
    pub fn converged(&self) -> bool {
        self.agents.iter().all(|agent| {
            agent.dead
                || (agent.session.is_some()
                    && agent.writes.is_empty()
                    && agent.follows.iter().all(|&s| {
                        let key = &self.services[s as usize];
                        let want = self.arb.catalog.service(key).map(|i| i.revision);
                        let have = agent
                            .sync
                            .get(key)
                            .and_then(|t| t.view.as_ref())
                            .map(|v| v.revision());
                        want == have
                    }))
        })
    }

    /// Instances alive and registered by their agent whose record is
    /// missing, of another generation, or not READY though they passed
    /// their readiness check and are not leaving.
    pub fn lost_registrations(&self) -> u64 {
        self.insts
            .iter()
            .filter(|inst| inst.alive && !inst.leaving && !self.agents[inst.agent as usize].dead)
            .filter(
                |inst| match (inst.generation, self.arb.catalog.instance(&inst.id)) {
                    (Some(g), Some(record)) => {
                        record.generation != g
                            || (inst.health.state() == State::Ready && record.state != State::Ready)
                    }
                    _ => true,
                },
            )
            .count() as u64
    }

    /// Leaves and crashes still being timed at the end.
    pub fn unresolved(&self) -> (u64, u64) {
        (
            self.leaves.values().map(|l| l.len() as u64).sum(),
            self.crashes.len() as u64,
        )
    }

    /// Agents that reconnected after the outage, and of those the ones
    /// that took no full snapshot (resumed every service by delta).
    pub fn resume_by_delta(&self) -> (u64, u64) {
        let back: Vec<&Agent> = self
            .agents
            .iter()
            .filter(|a| a.reconnected_after_outage && !a.dead)
            .collect();
        let by_delta = back
            .iter()
            .filter(|a| a.snapshots_since_outage == 0)
            .count();
        (back.len() as u64, by_delta as u64)
    }

    /// Most full snapshots in flight at once, and the bound.
    pub fn snapshots(&self) -> (u64, u64, u64, u64) {
        let stats = self.arb.dist.stats();
        (
            self.arb
                .max_snapshots_seen
                .max(stats.max_concurrent_snapshots_seen) as u64,
            self.arb.dist_params.max_concurrent_snapshots as u64,
            self.counters.snapshots_applied,
            stats.snapshots_refused,
        )
    }

    /// Final catalog facts hashed into the digest.
    pub fn seal(&mut self) {
        let rev = self.arb.catalog.revision().0;
        self.hash(&[0xff, rev, self.gossip_packets, self.gossip_bytes]);
        let services = self.services.clone();
        for s in services {
            if let Some(info) = self.arb.catalog.service(&s) {
                self.hasher.update(format!("{}", info.digest).as_bytes());
            }
        }
    }

    /// Subscriptions over all agents, and the records they hold.
    pub fn follow_stats(&self) -> (u64, u64) {
        let subs: u64 = self.agents.iter().map(|a| a.follows.len() as u64).sum();
        let records: u64 = self
            .agents
            .iter()
            .map(|a| {
                a.sync
                    .iter()
                    .filter_map(|(_, t)| t.view.as_ref())
                    .map(|v| v.records().count() as u64)
                    .sum::<u64>()
            })
            .sum();
        (subs, records)
    }

    /// The catalog's record count.
    pub fn catalog_records(&self) -> u64 {
        self.services
            .iter()
            .filter_map(|s| self.arb.catalog.service(s))
            .map(|i| i.records as u64)
            .sum()
    }

    /// The scenario being run.
    pub fn scenario(&self) -> &SimScenario {
        &self.sc
    }
}

fn bump(series: &mut Vec<u32>, i: usize, by: u32) {
    if series.len() <= i {
        series.resize(i + 1, 0);
    }
    series[i] += by;
}

fn kind_code(c: &Command) -> u64 {
    xxhash_rust::xxh3::xxh3_64(c.kind().as_bytes())
}

fn agent_ip(a: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0a40_0000 + a))
}

fn parse_node(name: &str) -> Option<u32> {
    name.strip_prefix('n')?.parse().ok()
}

fn parse_inst(name: &str) -> Option<u32> {
    name.strip_prefix('i')?.parse().ok()
}
