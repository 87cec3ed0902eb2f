//! The fleet-scale deterministic simulation (issue 9, R12): a whole
//! region — 3 zones, 5,000 agents, 100,000 instances in 2,000 services —
//! in one process on a virtual clock, driving the real state machines
//! (see `world` for which, and what the driver adds).
//!
//! `rollcall chaos sim SCENARIO.toml [--seed N] [--report DIR] [--agents N]
//! [--short]` runs one scenario of `chaos/scenarios/sim/` and writes the
//! chaos report format: `report.json` (the real harness's fields, plus
//! `digest`, `sim` and `wall`), `report.md` and the plots `cdf.svg` and
//! `load.svg`. In the simulation `leave_ms` is commit → last subscribed
//! agent applied, and `crash_ms` is kill → last agent ejected (one sample
//! per killed node). Every figure except those under `wall` is the same for
//! the same seed and flags; `digest` hashes the simulated history.

mod agent;
mod arbiter;
mod event;
mod fleet;
mod markdown;
mod measure;
mod peers;
pub mod plot;
mod raft;
pub mod scenario;
mod world;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::report::{Outage, Phase, Report, Stats};
use crate::scenario::ScenarioError;
use scenario::SimScenario;
use world::World;

pub use markdown::markdown;

/// `rollcall chaos sim`'s arguments.
#[derive(Clone, Debug)]
pub struct SimArgs {
    /// The scenario file.
    pub scenario: PathBuf,
    /// Where the report goes; default `chaos-reports/sim-<name>`.
    pub report: Option<PathBuf>,
    /// Seed of everything random.
    pub seed: u64,
    /// Overrides the agent count (instances and services scale with it).
    pub agents: Option<u32>,
    /// The CI version.
    pub short: bool,
    /// Print progress to stderr.
    pub progress: bool,
    /// The commit the binary was built from, for the report.
    pub build: crate::report::Build,
}

/// `report.json` of a simulation: the chaos report's fields, the history's
/// digest, the simulation-only figures and the wall-clock ones.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimReport {
    /// The fields every chaos report has.
    #[serde(flatten)]
    pub report: Report,
    /// xxh3-128 of the simulated history (commits, applies, membership
    /// events, measurements, the final catalog): equal for equal seeds and
    /// flags.
    pub digest: String,
    /// Figures only the simulation has.
    pub sim: SimFigures,
    /// Wall-clock figures (the only ones that differ between two runs).
    pub wall: Wall,
}

/// The simulation-only figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimFigures {
    /// Zones, services, instances at the start, subscriptions and the
    /// records the agents' views held at the end.
    pub fleet: Fleet,
    /// The arbiter's load.
    pub arbiter: ArbiterFigures,
    /// Gossip load per node.
    pub gossip: GossipFigures,
    /// Leases.
    pub leases: LeaseFigures,
    /// Resuming after the outage; `null` without one.
    pub resume: Option<Resume>,
    /// Agents' readiness probes run.
    pub probes: u64,
    /// Heartbeats instances sent their agents (TTL checks).
    pub heartbeats: u64,
    /// Instances a health check made UNHEALTHY (none should be: probes
    /// pass and heartbeats arrive while the instance lives).
    pub unhealthy: u64,
    /// Whole-agent pauses injected.
    pub pauses: u64,
    /// Nodes killed.
    pub nodes_killed: u64,
    /// Instances replaced (deploy, churn).
    pub replaced: u64,
    /// Agent writes the arbiter refused.
    pub rejected_writes: u64,
    /// Live instances whose registration the catalog does not hold as the
    /// agent does at the end (missing, other generation, or not READY
    /// though ready).
    pub lost_registrations: u64,
    /// Every live agent connected and holding every followed service at
    /// the catalog's revision at the end.
    pub converged: bool,
    /// Leaves still not applied by every subscriber at the end.
    pub leaves_unresolved: u64,
    /// Killed nodes some agent still routed to at the end.
    pub crashes_unresolved: u64,
    /// Sampled connections opened, through the agents' endpoint views.
    pub conns: u64,
    /// Connect attempts that failed (a dead instance); the proxy retried
    /// each on another endpoint, so only `failed_conns` reached callers.
    pub failed_attempts: u64,
    /// Discrete events the loop dispatched (gossip's own not included).
    pub events: u64,
}

/// The fleet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fleet {
    /// Zones.
    pub zones: u32,
    /// Services.
    pub services: u32,
    /// Instances at the start.
    pub instances: u32,
    /// Records in the catalog at the end.
    pub catalog_records: u64,
    /// Subscriptions over all agents.
    pub subscriptions: u64,
    /// Records held in the agents' views at the end, summed.
    pub view_records: u64,
    /// The gossip preset.
    pub gossip_preset: String,
}

/// The arbiter's load over the run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ArbiterFigures {
    /// Committed writes (revisions).
    pub commits: u64,
    /// Committed writes per simulated second, mean over the run.
    pub commits_per_s: f64,
    /// The busiest second's commits.
    pub commits_per_s_max: u32,
    /// Service updates delivered to agents (deltas, snapshots, answers).
    pub deliveries: u64,
    /// Deliveries per second, mean.
    pub deliveries_per_s: f64,
    /// The busiest second's deliveries.
    pub deliveries_per_s_max: u32,
    /// Update messages (a message carries several updates).
    pub messages: u64,
    /// Bytes of the update messages (the codec's sizes).
    pub bytes: u64,
    /// Bytes per second, mean.
    pub bytes_per_s: f64,
    /// Most full snapshots in flight at once.
    pub max_concurrent_snapshots: u64,
    /// The configured bound.
    pub snapshot_bound: u64,
    /// Full snapshots the agents applied.
    pub snapshots_applied: u64,
    /// Snapshot requests told to retry (the bound).
    pub snapshots_refused: u64,
    /// Gossip down reports received.
    pub down_reports: u64,
    /// Down reports dropped because the arbiter still heard the node.
    pub down_reports_ignored: u64,
    /// Down verdicts committed (both signals).
    pub node_downs: u64,
    /// The leader's modelled CPU over the run, % of one core
    /// (`[arbiter] send_cpu_us` and `recv_cpu_us`).
    pub cpu_percent: f64,
    /// The longest any work waited for that core, ms.
    pub cpu_max_wait_ms: f64,
    /// Replicas in the group (`[arbiter] replicas`).
    #[serde(default)]
    pub replicas: u32,
    /// Elections after the first leader took office.
    #[serde(default)]
    pub leader_changes: u64,
    /// Agent sessions that began after the agent's first one (moved to
    /// another replica, or back after an outage).
    #[serde(default)]
    pub sessions_moved: u64,
    /// Batches answered `TimedOut` (no quorum within
    /// `raft.write_timeout_ms`; their agents keep the writes pending).
    #[serde(default)]
    pub batches_timed_out: u64,
    /// Sessions an agent ended because nothing came back from its
    /// replica within `agent.arbiter_silence_ms` of a message (a replica
    /// killed with its host, or a cut).
    #[serde(default)]
    pub silent_replicas_noticed: u64,
}

/// Gossip load.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GossipFigures {
    /// Datagrams per node per second.
    pub packets_per_node_per_s: f64,
    /// Bytes per node per second (sealed datagrams).
    pub bytes_per_node_per_s: f64,
    /// Datagrams lost at random.
    pub lost: u64,
    /// Down verdicts seen by agents, over all observers.
    pub down_events: u64,
    /// Of those, about nodes that were alive (pauses, loss).
    pub false_down_events: u64,
}

/// Leases.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeaseFigures {
    /// Renewals received.
    pub renewals: u64,
    /// Renewals refused (no lease: the session is refused and the agent
    /// reconnects).
    pub renewals_refused: u64,
    /// Leases that expired.
    pub expired: u64,
    /// Expiries the mass-expiry guard held (commits).
    pub expiries_held: u64,
    /// Most leases held by the guard at once.
    pub held_max: u64,
    /// Most leases past their deadline whose witnesses saw the node alive,
    /// at once (held instead of expired: the arbiter was cut off).
    pub held_by_witnesses_max: u64,
    /// Witness questions sent about silent leases.
    pub witness_asks: u64,
}

/// Resuming after the outage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Resume {
    /// Agents that reconnected after it.
    pub agents: u64,
    /// Of those, the ones that took no full snapshot.
    pub by_delta: u64,
    /// `by_delta / agents`.
    pub share_by_delta: f64,
}

/// Wall-clock figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Wall {
    /// Building the region (catalog, views, memberships), seconds.
    pub setup_s: f64,
    /// Running it, seconds.
    pub run_s: f64,
    /// Simulated seconds per wall second.
    pub speed: f64,
    /// The process's peak resident memory, MiB (Linux; 0 elsewhere).
    pub peak_rss_mib: u64,
}

/// What the plots draw: the samples behind `leave_ms` and `crash_ms`, and
/// the arbiter's load per simulated second.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    /// Leave samples, ms.
    pub leave_ms: Vec<u64>,
    /// Crash samples, ms.
    pub crash_ms: Vec<u64>,
    /// Commits in each simulated second.
    pub commits_per_s: Vec<u32>,
    /// Deliveries in each simulated second.
    pub deliveries_per_s: Vec<u32>,
}

/// A finished simulation.
#[derive(Clone, Debug)]
pub struct SimRun {
    /// Its report.
    pub report: SimReport,
    /// Its plots' data.
    pub series: Series,
}

/// Why a simulation could not be run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The scenario file is unusable.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    /// The report could not be written.
    #[error("writing the report to {dir}: {source}")]
    Write {
        /// The report directory.
        dir: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Loads the scenario and simulates it; returns the run (not written).
pub fn simulate(args: &SimArgs) -> Result<SimRun, SimError> {
    let loaded = SimScenario::load(&args.scenario)?;
    let sc = loaded.for_run(args.short, args.agents)?;
    let mut run = simulate_scenario(sc, args.seed, args.progress);
    run.report.report.git_commit = args.build.commit.clone();
    run.report.report.git_dirty = args.build.dirty;
    Ok(run)
}

/// Simulates a scenario already loaded.
pub fn simulate_scenario(sc: SimScenario, seed: u64, progress: bool) -> SimRun {
    let started = Instant::now();
    let end_ms = (sc.duration_s * 1e3) as u64;
    let mut world = World::new(sc.clone(), seed);
    let setup_s = started.elapsed().as_secs_f64();
    let run_started = Instant::now();
    world.run(end_ms, |t| {
        if progress && t % 10_000 < 1_000 {
            eprintln!(
                "sim {}: {:.0} s of {:.0} s simulated, {:.0} s wall",
                sc.name,
                t as f64 / 1e3,
                sc.duration_s,
                run_started.elapsed().as_secs_f64()
            );
        }
    });
    if world.last_recovery_ms.is_none() || world.converged_at_ms.is_none() {
        // Checked once at the end when no recovery asked for it earlier.
        if world.converged() && world.last_recovery_ms.is_none() {
            world.converged_at_ms = Some(end_ms);
        }
    }
    world.seal();
    let run_s = run_started.elapsed().as_secs_f64();
    let seconds = end_ms.div_ceil(1_000) as usize;
    SimRun {
        report: report_of(&world, seed, setup_s, run_s),
        series: Series {
            leave_ms: world.leave_samples.clone(),
            crash_ms: world.crash_samples.clone(),
            commits_per_s: per_second(&world.counters.commits_per_s, seconds),
            deliveries_per_s: per_second(&world.counters.deliveries_per_s, seconds),
        },
    }
}

fn report_of(world: &World, seed: u64, setup_s: f64, run_s: f64) -> SimReport {
    let sc = world.scenario();
    let c = &world.counters;
    let duration_s = sc.duration_s;
    let leave_ms = Stats::from_samples(world.leave_samples.clone());
    let crash_ms = Stats::from_samples(world.crash_samples.clone());
    let converged = world.converged();
    let converge_ms = match (world.last_recovery_ms, world.converged_at_ms) {
        (Some(from), Some(at)) => Some(at.saturating_sub(from)),
        _ => None,
    };
    let end_ms = (duration_s * 1e3) as u64;
    let phases: Vec<Phase> = world
        .phases
        .iter()
        .enumerate()
        .map(|(i, (name, start, conns, failed))| Phase {
            name: name.clone(),
            start_s: *start as f64 / 1e3,
            end_s: world.phases.get(i + 1).map_or(end_ms, |p| p.1) as f64 / 1e3,
            conns: *conns,
            failed_conns: *failed,
        })
        .collect();
    let outage = world.outage.map(|(start, end)| Outage {
        duration_s: (end - start) as f64 / 1e3,
        failed_conns_to_live_backends: c.failed_conns_in_outage,
    });
    let (max_snapshots, bound, snapshots_applied, snapshots_refused) = world.snapshots();
    let (unresolved_leaves, unresolved_crashes) = world.unresolved();
    let lost = world.lost_registrations();
    let resume = world.outage.map(|_| {
        let (agents, by_delta) = world.resume_by_delta();
        Resume {
            agents,
            by_delta,
            share_by_delta: if agents == 0 {
                0.0
            } else {
                by_delta as f64 / agents as f64
            },
        }
    });
    let (subscriptions, view_records) = world.follow_stats();
    let nodes = f64::from(sc.agents);
    let per_s = |v: u64| v as f64 / duration_s;
    let figures = SimFigures {
        fleet: Fleet {
            zones: sc.zones,
            services: sc.services,
            instances: sc.instances,
            catalog_records: world.catalog_records(),
            subscriptions,
            view_records,
            gossip_preset: sc.gossip_preset.clone(),
        },
        arbiter: ArbiterFigures {
            commits: c.commits,
            commits_per_s: round2(per_s(c.commits)),
            commits_per_s_max: c.commits_per_s.iter().copied().max().unwrap_or(0),
            deliveries: c.updates,
            deliveries_per_s: round2(per_s(c.updates)),
            deliveries_per_s_max: c.deliveries_per_s.iter().copied().max().unwrap_or(0),
            messages: c.update_messages,
            bytes: c.bytes,
            bytes_per_s: round2(per_s(c.bytes)),
            max_concurrent_snapshots: max_snapshots,
            snapshot_bound: bound,
            snapshots_applied,
            snapshots_refused,
            down_reports: c.down_reports,
            down_reports_ignored: c.down_reports_ignored,
            node_downs: c.node_downs,
            cpu_percent: round2(world.busiest_cpu_us() as f64 / 1e4 / duration_s),
            cpu_max_wait_ms: round2(world.longest_cpu_wait_us() as f64 / 1e3),
            replicas: sc.arbiter.replicas,
            leader_changes: world.group.term.saturating_sub(1),
            sessions_moved: c.sessions_moved,
            batches_timed_out: c.batches_timed_out,
            silent_replicas_noticed: c.silent_arbiters,
        },
        gossip: GossipFigures {
            packets_per_node_per_s: round2(world.gossip_packets as f64 / nodes / duration_s),
            bytes_per_node_per_s: round2(world.gossip_bytes as f64 / nodes / duration_s),
            lost: world.gossip_lost,
            down_events: c.gossip_down_events,
            false_down_events: c.gossip_false_downs,
        },
        leases: LeaseFigures {
            renewals: c.renewals,
            renewals_refused: c.renewals_refused,
            expired: c.leases_expired,
            expiries_held: c.expiry_held,
            held_max: c.held_max as u64,
            held_by_witnesses_max: c.witness_held_max as u64,
            witness_asks: c.witness_asks,
        },
        resume,
        probes: c.probes,
        heartbeats: c.heartbeats,
        unhealthy: c.unhealthy,
        pauses: c.pauses,
        nodes_killed: c.nodes_killed,
        replaced: c.replaced,
        rejected_writes: c.rejected_writes,
        lost_registrations: lost,
        converged,
        leaves_unresolved: unresolved_leaves,
        crashes_unresolved: unresolved_crashes,
        conns: c.conns,
        failed_attempts: c.failed_attempts,
        events: c.events,
    };
    let mut report = Report {
        scenario: sc.name.clone(),
        // Filled by `simulate` from the build that ran it.
        git_commit: "unknown".to_owned(),
        git_dirty: false,
        seed,
        agents: sc.agents,
        duration_s,
        leave_ms,
        crash_ms,
        // The simulation measures its leave and crash times at every
        // agent's view already (leave_ms, crash_ms).
        crash_commit_ms: Stats::default(),
        leave_view_ms: Stats::default(),
        crash_view_ms: Stats::default(),
        converge_ms,
        new_conns_to_drained: c.new_conns_to_drained,
        new_conns_to_not_ready: c.new_conns_to_not_ready,
        conns: c.conns,
        failed_conns: c.failed_conns,
        false_removals: c.false_removals,
        // The simulated agents' views are not recorded as the real ones are.
        view_dips: None,
        max_concurrent_snapshots: max_snapshots,
        snapshots_refused,
        phases,
        outage,
        election: None,
        // The simulation checks its registrations against the catalog
        // itself (`lost_registrations`).
        history: None,
        cache_corruption: None,
        degraded: None,
        regions: None,
        rogue: None,
        pass: true,
        failures: Vec::new(),
    };
    report.failures = judge(sc, &report, &figures);
    report.pass = report.failures.is_empty();
    SimReport {
        report,
        digest: world.digest(),
        sim: figures,
        wall: Wall {
            setup_s: round2(setup_s),
            run_s: round2(run_s),
            speed: round2(duration_s / run_s.max(1e-9)),
            peak_rss_mib: peak_rss_mib(),
        },
    }
}

/// One sentence per criterion missed. The functional ones (convergence,
/// no lost registration, unresolved leaves and crashes, the snapshot bound)
/// always apply; timing bounds only where the scenario sets them.
fn judge(sc: &SimScenario, r: &Report, f: &SimFigures) -> Vec<String> {
    let mut failures = Vec::new();
    let p = &sc.pass;
    if !f.converged {
        failures.push("the agents did not converge on the catalog by the end of the run".into());
    }
    if f.lost_registrations > 0 {
        failures.push(format!(
            "{} live registrations are missing or wrong in the catalog",
            f.lost_registrations
        ));
    }
    if f.leaves_unresolved > 0 {
        failures.push(format!(
            "{} leaves were never applied by every subscribed agent",
            f.leaves_unresolved
        ));
    }
    if f.crashes_unresolved > 0 {
        failures.push(format!(
            "{} killed nodes were still routed to by some agent at the end",
            f.crashes_unresolved
        ));
    }
    let bound = p
        .max_concurrent_snapshots
        .unwrap_or(f.arbiter.snapshot_bound);
    if r.max_concurrent_snapshots > bound {
        failures.push(format!(
            "max_concurrent_snapshots = {} is above the bound {bound}",
            r.max_concurrent_snapshots
        ));
    }
    let mut at_most = |name: &str, value: Option<f64>, limit: Option<f64>| {
        if let (Some(v), Some(l)) = (value, limit) {
            if v > l {
                failures.push(format!("{name} = {v} is above the bound {l}"));
            }
        }
    };
    at_most("leave_ms.p99", r.leave_ms.p99, p.leave_p99_ms);
    at_most("crash_ms.p99", r.crash_ms.p99, p.crash_p99_ms);
    at_most(
        "false_removals",
        Some(r.false_removals as f64),
        p.max_false_removals.map(|v| v as f64),
    );
    at_most(
        "new_conns_to_drained",
        Some(r.new_conns_to_drained as f64),
        p.max_new_conns_to_drained.map(|v| v as f64),
    );
    if let (Some(min), Some(resume)) = (p.min_delta_resume_share, &f.resume) {
        if resume.share_by_delta < min {
            failures.push(format!(
                "sim.resume.share_by_delta = {} is below the bound {min}",
                resume.share_by_delta
            ));
        }
    }
    failures
}

/// `counts` (one per second that had any) padded with zeros to `seconds`.
fn per_second(counts: &[u32], seconds: usize) -> Vec<u32> {
    let mut all = counts.to_vec();
    all.resize(seconds.max(all.len()), 0);
    all
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

fn peak_rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024)
}

/// The default report directory of a scenario.
pub fn default_dir(name: &str) -> PathBuf {
    PathBuf::from("chaos-reports").join(format!("sim-{name}"))
}

/// Writes `report.json`, the plots and `report.md` into `dir`; returns the
/// plot file names.
pub fn write(dir: &Path, run: &SimRun) -> Result<Vec<String>, SimError> {
    let report = &run.report;
    let err = |source| SimError::Write {
        dir: dir.to_owned(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    let mut json = serde_json::to_string_pretty(report).expect("a report always serializes");
    json.push('\n');
    std::fs::write(dir.join("report.json"), json).map_err(err)?;
    let plots = plot::write_all(dir, &run.series).map_err(err)?;
    std::fs::write(dir.join("report.md"), markdown(report, &plots)).map_err(err)?;
    Ok(plots)
}
