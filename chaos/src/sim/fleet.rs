//! Building the simulated region at time 0: services sized by a Zipf-like
//! law, instances spread over the nodes, each agent following 20–50
//! services skewed towards popular ones. The catalog is filled through
//! real commands (lease grants, registrations); each agent starts from a
//! warm cache of its followed services (the state an agent restarting on
//! its disk cache serves), its registrations file and warm health
//! checkers, and each zone's membership from a zone that has run for a
//! while, so the run measures the scenario, not a cold start. Agents
//! start (connect) over the first two seconds.

use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rollcall_config::{AgentConfig, ArbiterConfig, CheckTiming, SwimSettings};
use rollcall_gossip::sim::{Sim as ZoneSim, SimConfig};
use rollcall_leases::{
    AgentEpoch, Catalog, CatalogParams, Command, Effect, Envelope, Label, NodeId, Registration,
    Role, ServiceKey, ServiceView, ShardId, State, Version, Weight,
};
use rollcall_node::agent_state::{Restored, Settings};
use rollcall_node::api_types::{Check, CheckKind, ValidChecks, ValidRegistration};
use rollcall_node::health::{InstanceHealth, Which};
use rollcall_node::metrics::AgentMetrics;
use rollcall_node::registrations::{Intent, LocalInstance};
use rollcall_node::view::{ViewSettings, Views};
use xxhash_rust::xxh3::Xxh3;

use super::scenario::SimScenario;
use super::world::*;
use crate::shape::{service_sizes, Zipf};

impl World {
    /// Builds the region at time 0: the catalog with every lease and
    /// instance (through real commands), each agent's views as a warm cache
    /// and its zone's membership as a zone that has run for a while.
    pub fn new(sc: SimScenario, seed: u64) -> World {
        let mut rng = StdRng::seed_from_u64(seed);
        // The agents' own config, with the replicas' addresses.
        let agent_config = AgentConfig {
            arbiters: match sc.arbiter.replicas {
                1 => vec![super::arbiter::ADDRESS.into()],
                n => (1..=n).map(|r| format!("sim-arbiter-{r}:7000")).collect(),
            },
            ..AgentConfig::default()
        };
        // One metrics registry for every simulated agent: counters only.
        let metrics = Arc::new(AgentMetrics::new());
        let arbiter_config = ArbiterConfig {
            name: "sim-arbiter".into(),
            ..ArbiterConfig::default()
        };
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
            let views = Views::new(
                ViewSettings {
                    data_plane: agent_config.data_plane.clone(),
                    region: arbiter_config.region.clone(),
                    zone: zone_labels[zone as usize].clone(),
                    first_resolve_wait_ms: agent_config.first_resolve_wait_ms,
                },
                metrics.clone(),
                // Simulated agents follow what they cached; a lookup of
                // anything else never happens.
                |_| {},
            );
            agents.push(Agent {
                node,
                zone,
                zone_index,
                epoch: AgentEpoch(1),
                machine: None,
                restored: Some(Restored::default()),
                views,
                unpublished: BTreeSet::new(),
                follows: Vec::new(),
                instances: Vec::new(),
                connecting: None,
                session: None,
                replica: 0,
                welcomed: 0,
                wake: None,
                next_call: 0,
                dead: false,
                paused_until: 0,
                snapshots_since_outage: 0,
                reconnected_after_outage: false,
                down_last: 0,
                up_last: 0,
                silence_watch: None,
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
        let ttl_checks = ValidChecks {
            startup: None,
            readiness: Some(Check {
                kind: CheckKind::Ttl {
                    ttl_ms: sc.heartbeat.ttl_ms,
                },
                timing: CheckTiming::READINESS,
                port: None,
            }),
            liveness: None,
        };
        let heartbeating: Vec<bool> = (0..sc.services)
            .map(|_| rng.random_range(0.0..1.0) < sc.heartbeat.share)
            .collect();
        let mut insts = Vec::with_capacity(sc.instances as usize);
        let mut warm: Vec<InstanceHealth> = Vec::with_capacity(sc.instances as usize);
        let v1 = Version::new("v1").expect("valid");
        for (s, &size) in sizes.iter().enumerate() {
            for _ in 0..size {
                let agent = rng.random_range(0..n) as u32;
                let k = insts.len() as u32;
                let port = 20_000 + agents[agent as usize].instances.len() as u16;
                let target = SocketAddr::new(agent_ip(agent), port);
                // Warm: the readiness check has passed once.
                let heartbeats = heartbeating[s];
                let mut health = if heartbeats {
                    InstanceHealth::new(Some(&ttl_checks), target, 0, &mut rng)
                } else {
                    InstanceHealth::new(Some(&checks), target, 0, &mut rng)
                };
                let due = health.next_due_ms().unwrap_or(0);
                health.due(due, &mut rng);
                if !heartbeats {
                    health.result(Which::Readiness, true, "", due, &mut rng);
                }
                let next_heartbeat_ms =
                    heartbeats.then(|| rng.random_range(0..sc.heartbeat.interval_ms));
                agents[agent as usize].instances.push(k);
                let mut inst = Inst::new(k, s as u32, agent, port, v1.clone(), next_heartbeat_ms);
                inst.ever_ready = true;
                insts.push(inst);
                warm.push(health);
            }
        }
        for (k, (inst, health)) in insts.iter_mut().zip(warm).enumerate() {
            let a = &mut agents[inst.agent as usize];
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
            // The agent's registrations file and its running checker.
            let checks = if inst.next_heartbeat_ms.is_some() {
                &ttl_checks
            } else {
                &checks
            };
            let restored = a.restored.as_mut().expect("not started");
            restored.registrations.put(LocalInstance {
                registration: ValidRegistration {
                    service: services[inst.service as usize].clone(),
                    instance_id: inst.id.clone(),
                    address: agent_ip(inst.agent),
                    port: inst.port,
                    zone: Some(zone_labels[a.zone as usize].clone()),
                    version: inst.version.clone(),
                    weight: Weight::DEFAULT,
                    labels: Vec::new(),
                    checks: Some(checks.clone()),
                },
                generation: Some(generation),
                intent: Intent::Serve,
                committed: true,
            });
            restored.health.insert(inst.id.clone(), health);
        }
        // Who follows what: 20–50 services per agent, skewed to popular ones.
        let popularity = Zipf::new(sc.services, sc.follow_skew);
        let mut followers: Vec<Vec<u32>> = vec![Vec::new(); sc.services as usize];
        let views: Vec<ServiceView> = services
            .iter()
            .map(|s| {
                let snap = catalog.service_snapshot(s).expect("registered above");
                ServiceView::from_snapshot(&snap).expect("a fresh snapshot checks")
            })
            .collect();
        for (a, agent) in agents.iter_mut().enumerate() {
            let count = rng.random_range(sc.follows.0..=sc.follows.1) as usize;
            let mut chosen = BTreeSet::new();
            let mut tries = 0;
            while chosen.len() < count && tries < count * 50 {
                tries += 1;
                chosen.insert(popularity.pick(&mut rng));
            }
            let restored = agent.restored.as_mut().expect("not started");
            for &s in &chosen {
                restored.views.push((views[s as usize].clone(), None));
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
                    settings,
                    seed: seed ^ (0x5151_0000 + z as u64),
                    latency_us: sc.network.gossip_latency_us,
                    loss: sc.network.loss,
                    warm_start: true,
                    ..SimConfig::lan(0)
                };
                ZoneSim::with_names(names, config)
            })
            .collect();
        let arbs = World::replicas(sc.arbiter.replicas as usize, catalog, &arbiter_config, seed);
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
            arbs,
            group: Default::default(),
            agent_settings: Settings {
                node: NodeId::new("n00000").expect("valid"),
                zone: Label::new("z1").expect("valid"),
                epoch: AgentEpoch(1),
                started_ms: 0,
                config: Arc::new(agent_config.clone()),
            },
            agent_config,
            arbiter_config,
            checks,
            ttl_checks,
            heartbeating,
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
        // Agents start over the first two seconds; heartbeat loops spread.
        for a in 0..n as u32 {
            let at = world.rng.random_range(0..2_000_000);
            world.at(at, Ev::Start(a));
            let heartbeats = world.agents[a as usize]
                .instances
                .iter()
                .any(|&k| world.insts[k as usize].next_heartbeat_ms.is_some());
            if heartbeats {
                let tick = world.rng.random_range(0..TICK_MS * 1_000);
                world.at(tick, Ev::Heartbeats(a));
            }
        }
        world.at(250_000, Ev::ArbiterSample);
        // The first replica leads from the start.
        world.elect(0);
        for i in 0..world.sc.steps.len() {
            let at = (world.sc.steps[i].at_s * 1e6) as Time;
            world.at(at, Ev::Step(i));
        }
        if world.sc.conns_per_s > 0.0 {
            world.at(1_000_000, Ev::Traffic);
        }
        world
    }
}

fn key(ns: &str, s: String, p: &str) -> ServiceKey {
    ServiceKey::new(ns, &s, p).expect("simulated names are valid")
}
