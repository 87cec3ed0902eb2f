//! The report of a chaos run: the R5 figures computed from the run's
//! [`Timeline`] (what the traffic saw), plus the few figures the harness
//! measures elsewhere, judged against the scenario's [`Pass`] bounds and
//! written as `report.json` (a public contract: field names and shape must
//! not change) and `report.md` (for people). Computing is pure: it must not
//! read clocks, the network or the control plane's opinion; only
//! [`write`] touches the filesystem.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::degraded::{self, DegradedFigures};
use crate::scenario::{Pass, Routing};
use crate::timeline::{Conn, Event, Outcome, Route, Timeline};

/// How long after its leave committed a backend may still be given new
/// connections, in ms: the leave SLO of R5 (3 s). A connection opened later
/// counts in [`Report::new_conns_to_drained`].
pub const DRAIN_GRACE_MS: u64 = rollcall_config::LEAVE_SLO_MS as u64;

/// How often the harness samples each agent's routable endpoints, in ms.
pub const ROUTE_SAMPLE_MS: u64 = 100;

/// What the harness measured outside the timeline, plus the run's identity.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReportInput {
    /// The scenario's name.
    pub scenario: String,
    /// The seed the run used.
    pub seed: u64,
    /// Agents in the run (after `--short` and `--agents`).
    pub agents: u32,
    /// A convergence time the harness measured by other means, in ms; when
    /// set it replaces the one [`compute`] takes from the timeline's route
    /// samples (see [`converge_ms`]).
    pub converge_ms: Option<u64>,
    /// Instances the control plane removed although they were alive.
    pub false_removals: u64,
    /// Most full snapshots the arbiter served at once.
    pub max_concurrent_snapshots: u64,
    /// Snapshot requests the arbiter told to retry (its bound reached).
    pub snapshots_refused: u64,
    /// The control-plane outage the scenario caused, as (start, end) in ms
    /// since the run started; `None` when there was none.
    pub outage: Option<(u64, u64)>,
    /// The generator's connect timeout, ms: how long before a hard failure
    /// a connection may have been in flight to the failed backend.
    pub connect_timeout_ms: u64,
    /// The commit the binary was built from.
    pub build: Build,
    /// The history check (`history::check`); `None` when the audit log
    /// could not be read.
    pub history: Option<HistoryFigures>,
    /// Per hard-failed node, fault → the arbiter's commit that took its
    /// records out (node-down or lease expiry), ms.
    pub crash_commit_ms: Vec<u64>,
    /// A leader election, `[leader killed, first commit answered)` in run
    /// ms; `None` when the run killed no leader or no commit followed.
    pub election: Option<(u64, u64)>,
    /// What a `corrupt_cache` step found, if the run had one.
    pub cache_corruption: Option<Corruption>,
    /// Whether stale copies were served degraded exactly while past their
    /// maximum age; `None` unless the scenario checks it.
    pub degraded: Option<DegradedFigures>,
}

/// The git commit a binary was built from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Build {
    /// The commit's hash, or "unknown" (built outside a git checkout).
    pub commit: String,
    /// Whether the tree had changes not in that commit.
    pub dirty: bool,
}

/// What the history check measured (see `history::check`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryFigures {
    /// Writes answered 200 or 202 that were checked against the audit log.
    pub writes_checked: u64,
    /// One sentence per lost or misplaced write or catalog disagreement.
    pub lost_writes: Vec<String>,
    /// One sentence per live, healthy instance taken out of READY.
    pub false_removals: Vec<String>,
}

/// A `corrupt_cache` step's evidence: the agent must detect every
/// corrupted file and never serve from one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Corruption {
    /// Cache files the step corrupted.
    pub files: u64,
    /// Corrupt cache files the restarted agent reported discarding (its
    /// `rollcall_agent_cache_discarded_total{reason="corrupt"}`).
    pub detected: u64,
    /// Answers the restarted agent gave from a cache (`stale: true`) before
    /// its first confirmed one: a corrupt file served.
    pub stale_answers: u64,
}

/// A multi-region run's routing, as the traffic and r1's resolve answers
/// saw it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RegionsFigures {
    /// Regions in the run.
    pub regions: u32,
    /// One entry per `[[pass.routing]]` rule, in the scenario's order.
    pub routing: Vec<RoutingFigures>,
    /// Every region's writer epoch at the run's last `read_writers` step
    /// (none when the scenario has no such step).
    #[serde(default)]
    pub writers: Vec<WriterReading>,
}

/// One region's writer epoch of the service, as its arbiter reported it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WriterReading {
    /// The region.
    pub region: String,
    /// The epoch number.
    pub epoch: u64,
    /// The region that owns the writes in it.
    pub owner: String,
    /// Whether it is settled.
    pub settled: bool,
}

/// Where one phase's connections went (see [`Routing`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoutingFigures {
    /// The phase.
    pub phase: String,
    /// Regions allowed to answer any of its connections.
    pub answered_by: Vec<String>,
    /// Regions allowed once settled.
    pub settled_by: Vec<String>,
    /// When it settles, s since the run started.
    pub settled_from_s: f64,
    /// Connections opened in the phase.
    pub conns: u64,
    /// Of those, answered, by the answering backend's region.
    pub answered: BTreeMap<String, u64>,
    /// Connections opened once settled.
    pub settled_conns: u64,
    /// Of those, answered, by region.
    pub settled_answered: BTreeMap<String, u64>,
    /// r1's resolve answers sampled once settled, by their failover
    /// refusal ("none" when they carry none).
    pub refusals: BTreeMap<String, u64>,
    /// Answered connections of the phase (in the order they were opened)
    /// whose region had already been followed by another one: writes
    /// going back to a region after another took them.
    #[serde(default)]
    pub interleaved: u64,
}

/// A leader election as the traffic saw it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Election {
    /// From the leader's death to the new leader's first answered commit.
    pub window_ms: u64,
    /// Connections opened in the window.
    pub conns: u64,
    /// Of those, failed ones not sent to a failed backend.
    pub failed_conns_to_live_backends: u64,
}

/// The report of one run: exactly the fields of `report.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The scenario's name.
    pub scenario: String,
    /// The commit the binary that ran was built from.
    pub git_commit: String,
    /// Whether that build's tree had uncommitted changes.
    pub git_dirty: bool,
    /// The seed the run used.
    pub seed: u64,
    /// Agents in the run.
    pub agents: u32,
    /// How long the run lasted, in seconds.
    pub duration_s: f64,
    /// Leave times, in ms: from each commit of DRAINING or UNHEALTHY to the
    /// last connection the instance answered (see [`compute`]).
    pub leave_ms: Stats,
    /// Hard-failure times, in ms: from each injected hard failure to the
    /// last failed connection attributed to it, or the last route sample of
    /// a live agent still offering it (see [`compute`]).
    pub crash_ms: Stats,
    /// Per crashed node, the time from the fault to the arbiter's commit of
    /// its node-down verdict or lease expiry, in ms.
    pub crash_commit_ms: Stats,
    /// Leave times read from every live agent's view, in ms: per leave, from
    /// its commit until the last agent's routable set no longer held the
    /// instance (see [`compute`]).
    pub leave_view_ms: Stats,
    /// Hard-failure times read from every live agent's view, in ms: per hard
    /// failure, until the last live agent's routable set no longer held it.
    pub crash_view_ms: Stats,
    /// How long the agents took to agree again after the last recovery
    /// step, in ms (see [`converge_ms`]); `null` when the run had no
    /// recovery or the agents never agreed.
    pub converge_ms: Option<u64>,
    /// Answered connections opened more than [`DRAIN_GRACE_MS`] after the
    /// answering instance's leave committed (and before it was READY again).
    pub new_conns_to_drained: u64,
    /// Answered connections opened before the answering instance's first
    /// `Ready` event (only instances with a `Ready` event count).
    pub new_conns_to_not_ready: u64,
    /// Every connection of the run.
    pub conns: u64,
    /// Every failed connection of the run.
    pub failed_conns: u64,
    /// Instances the control plane removed although they were alive.
    pub false_removals: u64,
    /// Times a live agent's view dropped an instance and later offered it
    /// again while the scenario caused nothing to it (see [`view_dips`]):
    /// a local exclusion (a gossip down verdict the arbiter refused), which
    /// the catalog's `false_removals` cannot see. `null` when no agent's
    /// view was read (the fleet simulation, or a run that read none).
    #[serde(default)]
    pub view_dips: Option<u64>,
    /// Most full snapshots the arbiter served at once.
    pub max_concurrent_snapshots: u64,
    /// Snapshot requests the arbiter told to retry (its bound reached).
    pub snapshots_refused: u64,
    /// The scenario's phases, in time order.
    pub phases: Vec<Phase>,
    /// The control-plane outage; `null` when the run had none.
    pub outage: Option<Outage>,
    /// The leader election; `null` when the run killed no leader.
    pub election: Option<Election>,
    /// The history check; `null` when the audit log could not be read.
    pub history: Option<HistoryFigures>,
    /// The cache-corruption evidence; `null` without a `corrupt_cache` step.
    pub cache_corruption: Option<Corruption>,
    /// Stale copies served degraded (README, "Stale copies"); `null`
    /// unless the scenario sets `degraded_max_age_ms`.
    #[serde(default)]
    pub degraded: Option<DegradedFigures>,
    /// Where the connections went by region, per `[[pass.routing]]` rule;
    /// `null` in a one-region run.
    pub regions: Option<RegionsFigures>,
    /// Whether every figure is within the scenario's pass bounds.
    pub pass: bool,
    /// One sentence per bound exceeded, naming the measured value and the
    /// bound; empty when `pass`.
    pub failures: Vec<String>,
}

/// Summary of a set of durations in ms. Percentiles use the nearest-rank
/// method (the smallest sample with at least p % of the samples at or below
/// it), so every figure is a value that was actually measured. All three
/// are `null` when there are no samples.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Number of samples.
    pub count: u64,
    /// Median (nearest rank).
    pub p50: Option<f64>,
    /// 99th percentile (nearest rank).
    pub p99: Option<f64>,
    /// Largest sample.
    pub max: Option<f64>,
}

impl Stats {
    /// Summarizes `samples` (in any order).
    pub fn from_samples(mut samples: Vec<u64>) -> Stats {
        samples.sort_unstable();
        let n = samples.len();
        let rank = |percent: usize| -> Option<f64> {
            // Nearest rank: ceil(p/100 × n), at least 1, 1-based.
            let rank = (percent * n).div_ceil(100).max(1);
            samples.get(rank - 1).map(|&v| v as f64)
        };
        Stats {
            count: n as u64,
            p50: rank(50),
            p99: rank(99),
            max: samples.last().map(|&v| v as f64),
        }
    }
}

/// One named phase of the run: from its `Phase` event to the next one, or
/// to the end of the run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    /// Its name.
    pub name: String,
    /// When it began, seconds since the run started.
    pub start_s: f64,
    /// When it ended, seconds since the run started.
    pub end_s: f64,
    /// Connections opened within it.
    pub conns: u64,
    /// Of those, the ones that failed.
    pub failed_conns: u64,
}

/// The control-plane outage of the run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outage {
    /// How long it lasted, in seconds.
    pub duration_s: f64,
    /// Failed connections opened during it. The outage scenarios keep every
    /// backend alive while the control plane is down, so every failure in
    /// the window counts as a failure to a live backend.
    pub failed_conns_to_live_backends: u64,
}

/// Computes the report of a run from its timeline and the harness's other
/// figures, and judges it against `pass`. The rules, all on connection
/// opening times:
///
/// - A *leave* of an instance starts at its first `LeaveCommitted` and lasts
///   until its next `Ready` (its return) or `Restarted` (a new process of
///   it, which answers as itself), or the end of the run. A second
///   commit during a leave (DRAINING, then UNHEALTHY) starts nothing: the
///   R5 clock starts at the commit that left READY.
/// - `leave_ms`: per leave, the time from its start to the last answered
///   connection from that instance opened during the leave; 0 if none.
/// - `new_conns_to_drained`: answered connections opened during a leave of
///   the answering instance, more than [`DRAIN_GRACE_MS`] after its start.
/// - `new_conns_to_not_ready`: answered connections opened before the
///   answering instance's first `Ready` event.
/// - `crash_ms`: per `HardFailure` of instance X at t, the time from t to
///   the last *failed* connection opened at or after t on an agent that
///   (a) had a connection answered by X before t, so X was in its candidate
///   set, and (b) had answered some connection between t and that failure,
///   so the failure is not the agent's own outage (its node crashed or is
///   cut off). 0 if there is none. A failed connection carries no backend,
///   so this cannot tell X's failures from another fault's on the same
///   agents: it over-estimates when faults overlap, never under-estimates
///   for a client-visible failure, and a proxy that silently retries on
///   another backend shows no failure at all; so, when the timeline holds
///   route samples, the sample is at least the time from t to the last
///   sample in which any agent still offered X (the harness samples only
///   agents on live nodes).
/// - `outage.failed_conns_to_live_backends`: failed connections opened in
///   `[start, end)` of `input.outage`, except those the agent may have sent
///   to a backend that had failed: opened after a `HardFailure` of X while
///   that agent still offered X (a route sample listing X at or after the
///   connection's opening time, less the 100 ms sampling period), or opened
///   at most `connect_timeout_ms` before the failure (in flight to X when
///   it failed).
/// - Phases: connections opened in `[start, next phase's start)`; the last
///   phase takes every connection from its start on.
/// - `converge_ms`: `input.converge_ms` if the harness measured one, else
///   [`converge_ms`] of the timeline (route samples after the last
///   recovery step).
pub fn compute(input: &ReportInput, timeline: &Timeline, pass: &Pass) -> Report {
    let (conns, events) = sorted(timeline);
    let leaves = leaves(&events);
    let first_ready = first_ready(&events);
    let samples = samples_of(
        &conns,
        &events,
        &timeline.routes,
        &timeline.views,
        timeline.duration_ms,
    );

    let mut leaves_of: HashMap<&str, Vec<&Leave>> = HashMap::new();
    for leave in &leaves {
        leaves_of.entry(leave.instance).or_default().push(leave);
    }
    let new_conns_to_drained = conns
        .iter()
        .filter(|c| match (&c.outcome, &c.backend) {
            (Outcome::Answered, Some(b)) => leaves_of.get(b.as_str()).is_some_and(|ls| {
                ls.iter()
                    .any(|l| l.contains(c.t_ms) && c.t_ms - l.start > DRAIN_GRACE_MS)
            }),
            _ => false,
        })
        .count() as u64;

    let new_conns_to_not_ready = conns
        .iter()
        .filter(|c| match (&c.outcome, &c.backend) {
            (Outcome::Answered, Some(b)) => first_ready
                .get(b.as_str())
                .is_some_and(|&ready| c.t_ms < ready),
            _ => false,
        })
        .count() as u64;

    let failed_conns = conns
        .iter()
        .filter(|c| c.outcome == Outcome::Failed)
        .count() as u64;

    let failures: Vec<(u64, &str)> = events
        .iter()
        .filter_map(|e| match e {
            Event::HardFailure { t_ms, instance, .. } => Some((*t_ms, instance.as_str())),
            _ => None,
        })
        .collect();
    let to_failed_backend = |c: &Conn| {
        failures.iter().any(|(t_f, instance)| {
            let in_flight = c.t_ms < *t_f && c.t_ms + input.connect_timeout_ms >= *t_f;
            in_flight
                || *t_f <= c.t_ms
                    && timeline.routes.iter().any(|r| {
                        r.agent == c.agent
                            && r.t_ms + ROUTE_SAMPLE_MS >= c.t_ms
                            && r.instances.iter().any(|i| i == instance)
                    })
        })
    };
    let outage = input.outage.map(|(start, end)| Outage {
        duration_s: seconds(end.saturating_sub(start)),
        failed_conns_to_live_backends: conns
            .iter()
            .filter(|c| c.outcome == Outcome::Failed && start <= c.t_ms && c.t_ms < end)
            .filter(|c| !to_failed_backend(c))
            .count() as u64,
    });

    let election = input.election.map(|(start, end)| {
        let within: Vec<&&Conn> = conns
            .iter()
            .filter(|c| start <= c.t_ms && c.t_ms < end)
            .collect();
        Election {
            window_ms: end.saturating_sub(start),
            conns: within.len() as u64,
            failed_conns_to_live_backends: within
                .iter()
                .filter(|c| c.outcome == Outcome::Failed && !to_failed_backend(c))
                .count() as u64,
        }
    });

    let mut report = Report {
        scenario: input.scenario.clone(),
        git_commit: input.build.commit.clone(),
        git_dirty: input.build.dirty,
        seed: input.seed,
        agents: input.agents,
        duration_s: seconds(timeline.duration_ms),
        leave_ms: Stats::from_samples(samples.leave.iter().map(|s| s.ms).collect()),
        crash_ms: Stats::from_samples(samples.crash.iter().map(|s| s.ms).collect()),
        crash_commit_ms: Stats::from_samples(input.crash_commit_ms.clone()),
        leave_view_ms: Stats::from_samples(samples.leave_view.iter().map(|s| s.ms).collect()),
        crash_view_ms: Stats::from_samples(samples.crash_view.iter().map(|s| s.ms).collect()),
        converge_ms: input.converge_ms.or_else(|| converge_ms(timeline)),
        new_conns_to_drained,
        new_conns_to_not_ready,
        conns: conns.len() as u64,
        failed_conns,
        false_removals: input.false_removals,
        view_dips: (!timeline.views.is_empty()).then(|| {
            view_dips(
                &ViewHistory::new(&timeline.views, &events, timeline.duration_ms),
                &events,
            )
        }),
        max_concurrent_snapshots: input.max_concurrent_snapshots,
        snapshots_refused: input.snapshots_refused,
        phases: phases(&events, &conns, timeline.duration_ms),
        outage,
        election,
        history: input.history.clone(),
        cache_corruption: input.cache_corruption.clone(),
        degraded: input.degraded.clone(),
        regions: regions(timeline, &conns, &events, &pass.routing),
        pass: false,
        failures: Vec::new(),
    };
    report.failures = judge(&report, pass);
    report.pass = report.failures.is_empty();
    report
}

/// One per-instance duration behind [`Report::leave_ms`] or
/// [`Report::crash_ms`]: what the report summarizes and the plots draw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// The instance it is about.
    pub instance: String,
    /// When its clock started (the leave's commit, or the hard failure), ms
    /// since the run started.
    pub start_ms: u64,
    /// The duration, ms.
    pub ms: u64,
}

/// Every sample of a run, in the order their clocks started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Samples {
    /// One per leave (see [`compute`] for when a leave starts and ends).
    pub leave: Vec<Sample>,
    /// One per `HardFailure` event.
    pub crash: Vec<Sample>,
    /// One per leave that some live agent's view held at its commit.
    pub leave_view: Vec<Sample>,
    /// One per `HardFailure` that some live agent's view held then.
    pub crash_view: Vec<Sample>,
}

/// The per-instance samples that [`compute`] summarizes as `leave_ms` and
/// `crash_ms`, by the rules documented there: exactly the report's numbers.
pub fn samples(timeline: &Timeline) -> Samples {
    let (conns, events) = sorted(timeline);
    samples_of(
        &conns,
        &events,
        &timeline.routes,
        &timeline.views,
        timeline.duration_ms,
    )
}

/// The timeline's connections and events, sorted by time (stable, so
/// records of the same millisecond keep their recorded order).
fn sorted(timeline: &Timeline) -> (Vec<&Conn>, Vec<&Event>) {
    let mut conns: Vec<&Conn> = timeline.conns.iter().collect();
    conns.sort_by_key(|c| c.t_ms);
    let mut events: Vec<&Event> = timeline.events.iter().collect();
    events.sort_by_key(|e| e.t_ms());
    (conns, events)
}

/// [`samples`] from connections and events already sorted by time.
fn samples_of(
    conns: &[&Conn],
    events: &[&Event],
    routes: &[Route],
    views: &[Route],
    run_end_ms: u64,
) -> Samples {
    let history = ViewHistory::new(views, events, run_end_ms);
    let leave_view = leaves(events)
        .iter()
        .filter_map(|leave| {
            let ms = history.last_drop(leave.instance, leave.start, leave.end)?;
            Some(Sample {
                instance: leave.instance.to_owned(),
                start_ms: leave.start,
                ms,
            })
        })
        .collect();
    let crash_view = events
        .iter()
        .filter_map(|e| match e {
            Event::HardFailure { t_ms, instance, .. } => {
                let back = next_ready(events, instance, *t_ms);
                let ms = history.last_drop(instance, *t_ms, back)?;
                Some(Sample {
                    instance: instance.clone(),
                    start_ms: *t_ms,
                    ms,
                })
            }
            _ => None,
        })
        .collect();
    let leave = leaves(events)
        .iter()
        .map(|leave| {
            let last = conns
                .iter()
                .filter(|c| answered_by(c, leave.instance) && leave.contains(c.t_ms))
                .map(|c| c.t_ms)
                .max();
            Sample {
                instance: leave.instance.to_owned(),
                start_ms: leave.start,
                ms: last.map_or(0, |t| t - leave.start),
            }
        })
        .collect();
    let crash = events
        .iter()
        .filter_map(|e| match e {
            Event::HardFailure { t_ms, instance, .. } => {
                // Until the instance is READY again (its node restarted).
                let back = next_ready(events, instance, *t_ms);
                Some(Sample {
                    instance: instance.clone(),
                    start_ms: *t_ms,
                    ms: crash_time(conns, routes, instance, *t_ms, back),
                })
            }
            _ => None,
        })
        .collect();
    Samples {
        leave,
        crash,
        leave_view,
        crash_view,
    }
}

/// When `instance` was next READY, or its process running again (its node
/// restarted), after `t`, if it was: the end of a hard failure's window.
fn next_ready(events: &[&Event], instance: &str, t: u64) -> Option<u64> {
    events.iter().find_map(|e| match e {
        Event::Ready { t_ms, instance: i } | Event::Restarted { t_ms, instance: i }
            if i == instance && *t_ms > t =>
        {
            Some(*t_ms)
        }
        _ => None,
    })
}

/// Every agent's view changes, and when its node was down (a
/// `crash-node` step until its `restart-node` step): a down agent's view
/// is not read, and says nothing.
struct ViewHistory<'a> {
    by_agent: HashMap<&'a str, Vec<(u64, &'a [String])>>,
    down: HashMap<&'a str, Vec<(u64, u64)>>,
    end: u64,
}

impl<'a> ViewHistory<'a> {
    fn new(views: &'a [Route], events: &[&'a Event], end: u64) -> Self {
        let mut by_agent: HashMap<&str, Vec<(u64, &[String])>> = HashMap::new();
        for v in views {
            by_agent
                .entry(v.agent.as_str())
                .or_default()
                .push((v.t_ms, v.instances.as_slice()));
        }
        for list in by_agent.values_mut() {
            list.sort_by_key(|(t, _)| *t);
        }
        let mut down: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
        let mut since: HashMap<&str, u64> = HashMap::new();
        for e in events {
            if let Event::Step {
                t_ms,
                action,
                target,
            } = e
            {
                match action.as_str() {
                    "crash-node" => {
                        since.insert(target.as_str(), *t_ms);
                    }
                    "restart-node" => {
                        if let Some(from) = since.remove(target.as_str()) {
                            down.entry(target).or_default().push((from, *t_ms));
                        }
                    }
                    _ => {}
                }
            }
        }
        for (agent, from) in since {
            down.entry(agent).or_default().push((from, end.max(from)));
        }
        ViewHistory {
            by_agent,
            down,
            end,
        }
    }

    fn down_within(&self, agent: &str, from: u64, to: u64) -> bool {
        self.down
            .get(agent)
            .is_some_and(|spans| spans.iter().any(|(a, b)| *a <= to && from <= *b))
    }

    /// From `from`, how long until the last agent whose view held
    /// `instance` then no longer did (each agent's first later view
    /// without it; one that still held it at `until`, or at the end of the
    /// run, counts until then). Only agents whose view was read before
    /// `from` and that were up throughout count; `None` when none held it.
    fn last_drop(&self, instance: &str, from: u64, until: Option<u64>) -> Option<u64> {
        let until = until.unwrap_or(self.end).min(self.end);
        let mut last = None;
        for (agent, list) in &self.by_agent {
            let Some(at_from) = list.iter().rposition(|(t, _)| *t <= from) else {
                continue;
            };
            if !list[at_from].1.iter().any(|i| i == instance) {
                continue;
            }
            let dropped = list[at_from + 1..]
                .iter()
                .find(|(t, set)| *t < until && !set.iter().any(|i| i == instance))
                .map_or(until, |(t, _)| *t);
            if self.down_within(agent, from, dropped) {
                continue;
            }
            let ms = dropped.saturating_sub(from);
            last = Some(last.map_or(ms, |m: u64| m.max(ms)));
        }
        last
    }
}

/// How far before an instance left a view a fault of the scenario may lie
/// and still explain it: the hard-failure SLO (a crash is out of the views
/// within it), ms.
const DIP_CAUSE_MS: u64 = rollcall_config::HARD_FAILURE_SLO_MS as u64;

/// Counts the dips of every live agent's view: an instance the view held,
/// then did not, then held again, with no leave commit (DRAINING or
/// UNHEALTHY), hard failure, restart or first READY of that instance from
/// [`DIP_CAUSE_MS`] before it left until it came back, and the agent up
/// throughout. Such a dip is a local exclusion the catalog never recorded:
/// a gossip down verdict about a live node that the arbiter then refused.
/// Views are read by blocking resolves, so a dip shorter than one resolve's
/// round trip can be missed; a dip that never comes back is not counted
/// here (the catalog's false removals cover a removal that sticks).
fn view_dips(history: &ViewHistory, events: &[&Event]) -> u64 {
    let caused = |instance: &str, from: u64, to: u64| {
        events.iter().any(|e| {
            let about = match e {
                Event::LeaveCommitted { instance, .. }
                | Event::HardFailure { instance, .. }
                | Event::Ready { instance, .. }
                | Event::BackendExit { instance, .. }
                | Event::Restarted { instance, .. } => instance.as_str(),
                _ => return false,
            };
            about == instance && (from..=to).contains(&e.t_ms())
        })
    };
    let mut dips = 0;
    for (agent, list) in &history.by_agent {
        let mut gone: HashMap<&str, u64> = HashMap::new();
        for pair in list.windows(2) {
            let ((_, before), (t, after)) = (&pair[0], &pair[1]);
            for instance in before.iter().filter(|i| !after.contains(i)) {
                gone.entry(instance.as_str()).or_insert(*t);
            }
            for instance in after.iter() {
                if let Some(left) = gone.remove(instance.as_str()) {
                    let from = left.saturating_sub(DIP_CAUSE_MS);
                    if !caused(instance, from, *t) && !history.down_within(agent, left, *t) {
                        dips += 1;
                    }
                }
            }
        }
    }
    dips
}

/// The `Step` actions the runner records for a recovery from a fault: the
/// start of the convergence clock (see [`converge_ms`]).
pub const RECOVERY_ACTIONS: [&str; 7] = [
    "heal",
    "start-arbiters",
    "restore-quorum",
    "resume-agent",
    "restart-agents",
    "restart-node",
    "corrupt-cache",
];

/// How close to the run's last route sample an agent's last sample must
/// be for the agent to count in [`converge_ms`], in ms. Every live agent is
/// sampled once per round; a round takes [`ROUTE_SAMPLE_MS`], or longer
/// while a paused agent makes the sampler wait for its 500 ms timeout, so
/// an agent sampled less recently than this is no longer answering (its
/// node crashed, or it is paused) and routes nothing.
pub const SAMPLED_AT_END_MS: u64 = 2_000;

/// How long the agents took to agree again after the last recovery, in ms,
/// from the timeline's route samples. The rule:
///
/// - The clock starts at the last `Step` event whose action is one of
///   [`RECOVERY_ACTIONS`]; without one there is nothing to converge from
///   and the result is `None`.
/// - Only route samples taken at or after that moment count, and only
///   those of agents still sampled at the end of the run (their last sample
///   at most [`SAMPLED_AT_END_MS`] before the run's last sample). A sample
///   is compared as a set of instance ids: order and repeats do not matter.
/// - The agents must end on one common set; if their last samples differ,
///   they never converged and the result is `None` (as it is when no
///   sample was taken after the recovery).
/// - An agent settles at its first sample after its last sample that
///   differed from the common set (at the recovery itself if none
///   differed). The run converged when the last agent settled: from then
///   on every counted sample is the common set until the end of the run.
///
/// The result is that moment minus the recovery. It is accurate to the
/// sampling period ([`ROUTE_SAMPLE_MS`]): an agent that changed between two
/// samples is seen at the later one. It is judged only when the scenario's
/// [`Pass`] sets `max_converge_ms` (then never converging fails too).
pub fn converge_ms(timeline: &Timeline) -> Option<u64> {
    let recovery = timeline
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Step { t_ms, action, .. } if RECOVERY_ACTIONS.contains(&action.as_str()) => {
                Some(*t_ms)
            }
            _ => None,
        })
        .max()?;
    let mut after: Vec<&Route> = timeline
        .routes
        .iter()
        .filter(|r| r.t_ms >= recovery)
        .collect();
    after.sort_by_key(|r| r.t_ms);
    let end = after.last()?.t_ms;

    // Each agent's samples after the recovery, in time order, as sets.
    let mut by_agent: HashMap<&str, Vec<(u64, Vec<&str>)>> = HashMap::new();
    for route in &after {
        let mut set: Vec<&str> = route.instances.iter().map(String::as_str).collect();
        set.sort_unstable();
        set.dedup();
        by_agent
            .entry(route.agent.as_str())
            .or_default()
            .push((route.t_ms, set));
    }
    by_agent.retain(|_, samples| {
        samples
            .last()
            .is_some_and(|(t, _)| t + SAMPLED_AT_END_MS >= end)
    });

    let common = &by_agent.values().next()?.last()?.1;
    if by_agent
        .values()
        .any(|samples| samples.last().is_some_and(|(_, set)| set != common))
    {
        return None;
    }
    let settled = by_agent.values().filter_map(|samples| {
        let last_differing = samples.iter().rposition(|(_, set)| set != common)?;
        // The agent's last sample is the common set, so one follows.
        samples.get(last_differing + 1).map(|(t, _)| *t)
    });
    Some(settled.max().unwrap_or(recovery) - recovery)
}

/// One leave of an instance: from the commit that took it out of READY
/// until it was READY again (`end`, exclusive) or the run ended.
struct Leave<'a> {
    instance: &'a str,
    start: u64,
    end: Option<u64>,
}

impl Leave<'_> {
    fn contains(&self, t_ms: u64) -> bool {
        self.start <= t_ms && self.end.is_none_or(|end| t_ms < end)
    }
}

/// The leaves in `events` (sorted by time), in the order they began.
fn leaves<'a>(events: &[&'a Event]) -> Vec<Leave<'a>> {
    let mut leaves: Vec<Leave<'a>> = Vec::new();
    // Index in `leaves` of each instance's open leave.
    let mut open: HashMap<&str, usize> = HashMap::new();
    for event in events {
        match event {
            Event::LeaveCommitted { t_ms, instance } => {
                open.entry(instance.as_str()).or_insert_with(|| {
                    leaves.push(Leave {
                        instance,
                        start: *t_ms,
                        end: None,
                    });
                    leaves.len() - 1
                });
            }
            // READY again, or a new process of it started (the harness
            // restarted a killed backend): what answers from then on is
            // not the instance that left, as a crash's window ends there.
            Event::Ready { t_ms, instance } | Event::Restarted { t_ms, instance } => {
                if let Some(i) = open.remove(instance.as_str()) {
                    leaves[i].end = Some(*t_ms);
                }
            }
            _ => {}
        }
    }
    leaves
}

/// Each instance's first `Ready` event time.
fn first_ready<'a>(events: &[&'a Event]) -> HashMap<&'a str, u64> {
    let mut first = HashMap::new();
    for event in events {
        if let Event::Ready { t_ms, instance } = event {
            first.entry(instance.as_str()).or_insert(*t_ms);
        }
    }
    first
}

fn answered_by(conn: &Conn, instance: &str) -> bool {
    conn.outcome == Outcome::Answered && conn.backend.as_deref() == Some(instance)
}

/// The `crash_ms` sample of a hard failure of `instance` at `t`; `conns`
/// sorted by opening time. The rule is documented on [`compute`].
fn crash_time(conns: &[&Conn], routes: &[Route], instance: &str, t: u64, back: Option<u64>) -> u64 {
    let before_back = |at: u64| back.is_none_or(|b| at < b);
    let routed_to_it: HashSet<&str> = conns
        .iter()
        .take_while(|c| c.t_ms < t)
        .filter(|c| answered_by(c, instance))
        .map(|c| c.agent.as_str())
        .collect();
    let mut answered_since: HashSet<&str> = HashSet::new();
    let mut last_failure = None;
    for conn in conns
        .iter()
        .skip_while(|c| c.t_ms < t)
        .take_while(|c| before_back(c.t_ms))
    {
        let agent = conn.agent.as_str();
        if !routed_to_it.contains(agent) {
            continue;
        }
        match conn.outcome {
            Outcome::Answered => {
                answered_since.insert(agent);
            }
            Outcome::Failed if answered_since.contains(agent) => last_failure = Some(conn.t_ms),
            Outcome::Failed => {}
        }
    }
    let failed = last_failure.map_or(0, |f| f - t);
    let offered = routes
        .iter()
        .filter(|r| r.t_ms >= t && before_back(r.t_ms) && r.instances.iter().any(|i| i == instance))
        .map(|r| r.t_ms - t)
        .max()
        .unwrap_or(0);
    failed.max(offered)
}

/// The phases of the run from its `Phase` events (sorted by time).
fn phases(events: &[&Event], conns: &[&Conn], run_end_ms: u64) -> Vec<Phase> {
    let starts: Vec<(u64, &str)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Phase { t_ms, name } => Some((*t_ms, name.as_str())),
            _ => None,
        })
        .collect();
    starts
        .iter()
        .enumerate()
        .map(|(i, &(start, name))| {
            let next = starts.get(i + 1).map(|&(t, _)| t);
            let within = |c: &&&Conn| start <= c.t_ms && next.is_none_or(|n| c.t_ms < n);
            Phase {
                name: name.to_owned(),
                start_s: seconds(start),
                end_s: seconds(next.unwrap_or(run_end_ms.max(start))),
                conns: conns.iter().filter(within).count() as u64,
                failed_conns: conns
                    .iter()
                    .filter(within)
                    .filter(|c| c.outcome == Outcome::Failed)
                    .count() as u64,
            }
        })
        .collect()
}

/// Per routing rule, where its phase's connections went: `None` in a
/// one-region run (no backend has a region). A phase that begins more
/// than once is judged over all of its spans.
fn regions(
    timeline: &Timeline,
    conns: &[&Conn],
    events: &[&Event],
    rules: &[Routing],
) -> Option<RegionsFigures> {
    if timeline.backend_regions.is_empty() {
        return None;
    }
    let starts: Vec<(u64, &str)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Phase { t_ms, name } => Some((*t_ms, name.as_str())),
            _ => None,
        })
        .collect();
    let regions: HashSet<&str> = timeline
        .backend_regions
        .values()
        .map(String::as_str)
        .collect();
    let routing = rules
        .iter()
        .map(|rule| {
            let settle = (rule.settle_s * 1000.0) as u64;
            // The phase's spans: [start, next phase's start).
            let spans: Vec<(u64, u64)> = starts
                .iter()
                .enumerate()
                .filter(|(_, (_, name))| *name == rule.phase)
                .map(|(i, &(start, _))| {
                    let end = starts
                        .get(i + 1)
                        .map_or(timeline.duration_ms.max(start), |&(t, _)| t);
                    (start, end)
                })
                .collect();
            let within = |t: u64, settled: bool| {
                spans.iter().any(|&(start, end)| {
                    let from = if settled { start + settle } else { start };
                    from <= t && t < end
                })
            };
            let mut figures = RoutingFigures {
                phase: rule.phase.clone(),
                answered_by: rule.answered_by.clone(),
                settled_by: rule.settled().to_vec(),
                settled_from_s: spans
                    .first()
                    .map_or(0.0, |&(start, _)| seconds(start + settle)),
                conns: 0,
                answered: BTreeMap::new(),
                settled_conns: 0,
                settled_answered: BTreeMap::new(),
                refusals: BTreeMap::new(),
                interleaved: 0,
            };
            // The regions' runs of answers, in opening order: one region's
            // answers after another's took over are interleaved.
            let mut closed: Vec<String> = Vec::new();
            let mut current: Option<String> = None;
            for c in conns {
                let region = c
                    .backend
                    .as_ref()
                    .filter(|_| c.outcome == Outcome::Answered)
                    .map(|b| {
                        timeline
                            .backend_regions
                            .get(b)
                            .cloned()
                            .unwrap_or_else(|| format!("unknown backend {b}"))
                    });
                if within(c.t_ms, false) {
                    figures.conns += 1;
                    if let Some(r) = &region {
                        *figures.answered.entry(r.clone()).or_default() += 1;
                        if closed.contains(r) {
                            figures.interleaved += 1;
                        } else if current.as_ref() != Some(r) {
                            closed.extend(current.replace(r.clone()));
                        }
                    }
                }
                if within(c.t_ms, true) {
                    figures.settled_conns += 1;
                    if let Some(r) = region {
                        *figures.settled_answered.entry(r).or_default() += 1;
                    }
                }
            }
            for a in timeline
                .region_answers
                .iter()
                .filter(|a| within(a.t_ms, true))
            {
                let refusal = a.refused.clone().unwrap_or_else(|| "none".to_owned());
                *figures.refusals.entry(refusal).or_default() += 1;
            }
            figures
        })
        .collect();
    let last_reading = events.iter().rev().find_map(|e| match e {
        Event::Step { t_ms, action, .. } if action == "read-writers" => Some(*t_ms),
        _ => None,
    });
    let writers = events
        .iter()
        .filter_map(|e| match e {
            Event::Writer {
                t_ms,
                region,
                epoch,
                owner,
                settled,
            } if Some(*t_ms) == last_reading => Some(WriterReading {
                region: region.clone(),
                epoch: *epoch,
                owner: owner.clone(),
                settled: *settled,
            }),
            _ => None,
        })
        .collect();
    Some(RegionsFigures {
        regions: regions.len() as u32,
        routing,
        writers,
    })
}

/// The failure, if any, of `[pass] writer_epoch`: every region of the run
/// read at the last `read_writers` step, each at `epoch`.
fn judge_writers(figures: &RegionsFigures, epoch: u64, failures: &mut Vec<String>) {
    if figures.writers.is_empty() {
        failures.push(format!(
            "writer epoch: no region's epoch was read (a read_writers step): epoch {epoch} was not measured"
        ));
        return;
    }
    if (figures.writers.len() as u32) < figures.regions {
        failures.push(format!(
            "writer epoch: only {} of {} regions answered the last read_writers step",
            figures.writers.len(),
            figures.regions
        ));
    }
    let other: Vec<String> = figures
        .writers
        .iter()
        .filter(|w| w.epoch != epoch || !w.settled)
        .map(|w| {
            format!(
                "{} holds epoch {} ({}{})",
                w.region,
                w.epoch,
                w.owner,
                if w.settled { "" } else { ", moving" }
            )
        })
        .collect();
    if !other.is_empty() {
        failures.push(format!(
            "writer epoch: every region must hold epoch {epoch}, settled; {}",
            other.join(", ")
        ));
    }
}

/// The failures of a multi-region run's routing rules.
fn judge_routing(figures: &RegionsFigures, rules: &[Routing], failures: &mut Vec<String>) {
    for (rule, f) in rules.iter().zip(&figures.routing) {
        let phase = &f.phase;
        let outside = |answered: &BTreeMap<String, u64>, allowed: &[String]| -> Vec<String> {
            answered
                .iter()
                .filter(|(r, _)| !allowed.contains(r))
                .map(|(r, n)| format!("{n} by {r}"))
                .collect()
        };
        if f.conns == 0 {
            failures.push(format!(
                "routing in phase {phase}: no connection was opened in it: the run measured nothing"
            ));
            continue;
        }
        let wrong = outside(&f.answered, &f.answered_by);
        if !wrong.is_empty() {
            failures.push(format!(
                "routing in phase {phase}: connections answered outside {:?}: {}",
                f.answered_by,
                wrong.join(", ")
            ));
        }
        if f.settled_conns == 0 {
            failures.push(format!(
                "routing in phase {phase}: no connection was opened once it settled (from {} s): the run measured nothing",
                f.settled_from_s
            ));
            continue;
        }
        let wrong = outside(&f.settled_answered, &f.settled_by);
        if !wrong.is_empty() {
            failures.push(format!(
                "routing in phase {phase}: once settled (from {} s), connections answered outside {:?}: {}",
                f.settled_from_s,
                f.settled_by,
                wrong.join(", ")
            ));
        }
        let answered: u64 = f.settled_answered.values().sum();
        let share = answered as f64 / f.settled_conns as f64;
        if share < rule.min_answered_share {
            failures.push(format!(
                "routing in phase {phase}: {answered} of {} connections answered once settled ({:.3}), fewer than the {} required",
                f.settled_conns, share, rule.min_answered_share
            ));
        }
        if rule.exclusive && f.interleaved > 0 {
            failures.push(format!(
                "routing in phase {phase}: {} connections were answered by a region after another region had taken over: the writes reached two regions back and forth",
                f.interleaved
            ));
        }
        if let Some(refusal) = &rule.refusal {
            let sampled: u64 = f.refusals.values().sum();
            let other: Vec<String> = f
                .refusals
                .iter()
                .filter(|(r, _)| *r != refusal)
                .map(|(r, n)| format!("{n} {r}"))
                .collect();
            if sampled == 0 {
                failures.push(format!(
                    "routing in phase {phase}: no resolve answer was sampled once settled: the refusal was not measured"
                ));
            } else if !other.is_empty() {
                failures.push(format!(
                    "routing in phase {phase}: resolve answers once settled must refuse failover as {refusal:?}; also seen: {}",
                    other.join(", ")
                ));
            }
        }
    }
}

/// One sentence per pass bound the report exceeds.
fn judge(report: &Report, pass: &Pass) -> Vec<String> {
    let mut failures = Vec::new();
    if let Some(figures) = &report.regions {
        judge_routing(figures, &pass.routing, &mut failures);
        if let Some(epoch) = pass.writer_epoch {
            judge_writers(figures, epoch, &mut failures);
        }
    } else if !pass.routing.is_empty() || pass.writer_epoch.is_some() {
        failures.push(
            "the scenario has [[pass.routing]] rules but the run had one region: routing was not measured"
                .to_owned(),
        );
    }
    for (what, stats, bound, least, key) in [
        (
            "leave",
            &report.leave_ms,
            pass.leave_p99_ms,
            pass.min_leave_samples,
            "min_leave_samples",
        ),
        (
            "crash",
            &report.crash_ms,
            pass.crash_p99_ms,
            pass.min_crash_samples,
            "min_crash_samples",
        ),
    ] {
        if stats.count < least {
            failures.push(format!(
                "{what}: {} samples, fewer than the {least} the scenario requires ({key}): the run did not measure what it judges",
                stats.count
            ));
        }
        if let Some(p99) = stats.p99.filter(|&p99| p99 > bound as f64) {
            failures.push(format!("{what} p99 {p99} ms exceeds {bound} ms"));
        }
    }
    for (what, stats, bound) in [
        (
            "leave (read from every agent's view)",
            &report.leave_view_ms,
            pass.leave_p99_ms,
        ),
        (
            "crash (read from every agent's view)",
            &report.crash_view_ms,
            pass.crash_p99_ms,
        ),
    ] {
        if let Some(p99) = stats.p99.filter(|&p99| p99 > bound as f64) {
            failures.push(format!("{what} p99 {p99} ms exceeds {bound} ms"));
        }
    }
    if report.conns <= report.failed_conns {
        failures.push(format!(
            "no connection of {} was answered: the traffic measured nothing",
            report.conns
        ));
    }
    match &report.history {
        None => failures.push(
            "the audit log could not be read: false removals and lost writes were not measured"
                .to_owned(),
        ),
        Some(history) => {
            if history.writes_checked < pass.min_writes_checked {
                failures.push(format!(
                    "{} writes checked against the audit log, fewer than the {} required (min_writes_checked)",
                    history.writes_checked, pass.min_writes_checked
                ));
            }
            if history.lost_writes.len() as u64 > pass.max_lost_writes {
                failures.push(format!(
                    "{} lost writes exceed the limit of {}: {}",
                    history.lost_writes.len(),
                    pass.max_lost_writes,
                    history
                        .lost_writes
                        .iter()
                        .take(3)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join("; ")
                ));
            }
        }
    }
    if let Some(bound) = pass.max_failed_conns_in_election {
        match &report.election {
            None => failures.push(
                "no election window was measured (no leader killed, or no commit answered after it)"
                    .to_owned(),
            ),
            Some(e) if e.conns == 0 => failures.push(format!(
                "no connection was opened in the {} ms election window",
                e.window_ms
            )),
            Some(e) if e.failed_conns_to_live_backends > bound => failures.push(format!(
                "{} failed connections to live backends during the {} ms election exceed the limit of {bound}",
                e.failed_conns_to_live_backends, e.window_ms
            )),
            Some(_) => {}
        }
    }
    if pass.degraded_max_age_ms.is_some() {
        degraded::judge(report.degraded.as_ref(), &mut failures);
    }
    if let Some(c) = &report.cache_corruption {
        if c.detected < c.files {
            failures.push(format!(
                "{} of {} corrupted cache files were detected (the rest may have been read as valid)",
                c.detected, c.files
            ));
        }
        if c.stale_answers > 0 {
            failures.push(format!(
                "the restarted agent answered {} times from its cache after the corruption",
                c.stale_answers
            ));
        }
    }
    if let Some(least) = pass.min_concurrent_snapshots {
        if report.max_concurrent_snapshots < least || report.snapshots_refused == 0 {
            failures.push(format!(
                "the snapshot bound was not reached: at most {} in flight (at least {least} required), {} requests told to retry",
                report.max_concurrent_snapshots, report.snapshots_refused
            ));
        }
    }
    if let Some(bound) = pass.max_view_dips {
        match report.view_dips {
            None => failures.push("no agent's view was read, so view dips were not measured".to_owned()),
            Some(dips) if dips > bound => failures.push(format!(
                "{dips} view dips (an instance the scenario left alone dropped from a live agent's view and back) exceed the limit of {bound}"
            )),
            Some(_) => {}
        }
    }
    let mut count = |measured: u64, bound: u64, what: &str| {
        if measured > bound {
            failures.push(format!("{measured} {what} exceed the limit of {bound}"));
        }
    };
    count(
        report.new_conns_to_drained,
        pass.max_new_conns_to_drained,
        &format!("new connections to drained backends (more than {DRAIN_GRACE_MS} ms after the drain committed)"),
    );
    if let Some(outage) = &report.outage {
        count(
            outage.failed_conns_to_live_backends,
            pass.max_failed_conns_to_live_backends_in_outage,
            "failed connections to live backends during the outage",
        );
    }
    if let Some(bound) = pass.max_failed_conns {
        count(report.failed_conns, bound, "failed connections");
    }
    count(
        report.new_conns_to_not_ready,
        pass.max_new_conns_to_not_ready,
        "new connections to instances that were not yet READY",
    );
    count(
        report.false_removals,
        pass.max_false_removals,
        "false removals",
    );
    if let Some(bound) = pass.max_concurrent_snapshots {
        count(
            report.max_concurrent_snapshots,
            bound,
            "concurrent snapshots",
        );
    }
    if let Some(bound) = pass.max_converge_ms {
        match report.converge_ms {
            Some(ms) if ms > bound => failures.push(format!(
                "converged {ms} ms after the recovery, more than the {bound} ms allowed"
            )),
            Some(_) => {}
            None => failures.push(
                "the agents' routes never converged after the recovery (or there was no recovery step)"
                    .to_owned(),
            ),
        }
    }
    failures
}

fn seconds(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

/// Writes `dir/report.json` (pretty-printed, the public contract),
/// creating `dir` if needed. Written before anything else of the run, so
/// that a later failure (a plot, the Markdown) cannot lose it.
pub fn write_json(dir: &Path, report: &Report) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut json = serde_json::to_string_pretty(report).map_err(std::io::Error::other)?;
    json.push('\n');
    std::fs::write(dir.join("report.json"), json)
}

/// Writes `dir/report.md` (see [`markdown`]), creating `dir` if needed.
pub fn write_markdown(
    dir: &Path,
    report: &Report,
    budget: &[(String, String)],
    plots: &[String],
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("report.md"), markdown(report, budget, plots))
}

/// The report as Markdown: the verdict, a table of every figure with a
/// "budget predicts" column filled from `budget` (figure name as in
/// `report.json` → predicted text), the failures, the phases and links to
/// `plots` (file names relative to the report's directory).
pub fn markdown(report: &Report, budget: &[(String, String)], plots: &[String]) -> String {
    let predicted = |figure: &str| -> String {
        budget
            .iter()
            .find(|(name, _)| name == figure)
            .map_or_else(String::new, |(_, text)| cell(text))
    };
    let stats = |s: &Stats| match (s.p50, s.p99, s.max) {
        (Some(p50), Some(p99), Some(max)) => {
            format!("count {}, p50 {p50}, p99 {p99}, max {max}", s.count)
        }
        _ => format!("count {}", s.count),
    };
    let optional = |v: Option<u64>| v.map_or_else(|| "not measured".to_owned(), |v| v.to_string());

    let mut rows: Vec<(&str, String)> = vec![
        ("leave_ms", stats(&report.leave_ms)),
        ("crash_ms", stats(&report.crash_ms)),
        ("crash_commit_ms", stats(&report.crash_commit_ms)),
        ("leave_view_ms", stats(&report.leave_view_ms)),
        ("crash_view_ms", stats(&report.crash_view_ms)),
        ("converge_ms", optional(report.converge_ms)),
        (
            "new_conns_to_drained",
            report.new_conns_to_drained.to_string(),
        ),
        (
            "new_conns_to_not_ready",
            report.new_conns_to_not_ready.to_string(),
        ),
        ("conns", report.conns.to_string()),
        ("failed_conns", report.failed_conns.to_string()),
        ("false_removals", report.false_removals.to_string()),
        ("view_dips", optional(report.view_dips)),
        (
            "max_concurrent_snapshots",
            report.max_concurrent_snapshots.to_string(),
        ),
        ("snapshots_refused", report.snapshots_refused.to_string()),
    ];
    match &report.history {
        Some(h) => {
            rows.push(("history.writes_checked", h.writes_checked.to_string()));
            rows.push(("history.lost_writes", h.lost_writes.len().to_string()));
        }
        None => rows.push(("history", "not measured (no audit log)".to_owned())),
    }
    if let Some(e) = &report.election {
        rows.push(("election.window_ms", e.window_ms.to_string()));
        rows.push((
            "election.failed_conns_to_live_backends",
            format!("{} of {}", e.failed_conns_to_live_backends, e.conns),
        ));
    }
    if let Some(d) = &report.degraded {
        rows.push((
            "degraded",
            format!(
                "{} answers sampled, {} past their maximum age, {} served degraded ({} of them whole: no fresh local evidence), {} disagreeing",
                d.answers, d.past_max_age, d.degraded, d.fallback, d.mismatched
            ),
        ));
    }
    if let Some(c) = &report.cache_corruption {
        rows.push((
            "cache_corruption",
            format!(
                "{} files corrupted, {} detected, {} answers from a cache",
                c.files, c.detected, c.stale_answers
            ),
        ));
    }
    match &report.outage {
        Some(outage) => {
            rows.push(("outage.duration_s", outage.duration_s.to_string()));
            rows.push((
                "outage.failed_conns_to_live_backends",
                outage.failed_conns_to_live_backends.to_string(),
            ));
        }
        None => rows.push(("outage", "none".to_owned())),
    }

    let mut md = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(md, "# Chaos report: {}\n", report.scenario);
    let _ = writeln!(
        md,
        "**{}**: seed {}, {} agents, {} s; built from {}{}.\n",
        if report.pass { "PASS" } else { "FAIL" },
        report.seed,
        report.agents,
        report.duration_s,
        report.git_commit,
        if report.git_dirty {
            " with uncommitted changes"
        } else {
            ""
        }
    );
    md.push_str("| figure | measured | budget predicts |\n|---|---|---|\n");
    for (figure, measured) in rows {
        let _ = writeln!(md, "| {figure} | {measured} | {} |", predicted(figure));
    }
    md.push_str("\n## Failures\n\n");
    if report.failures.is_empty() {
        md.push_str("None.\n");
    }
    for failure in &report.failures {
        let _ = writeln!(md, "- {failure}");
    }
    if let Some(h) = report
        .history
        .as_ref()
        .filter(|h| !h.false_removals.is_empty())
    {
        md.push_str("\n## False removals\n\n");
        for r in &h.false_removals {
            let _ = writeln!(md, "- {}", cell(r));
        }
    }
    if let Some(h) = report
        .history
        .as_ref()
        .filter(|h| !h.lost_writes.is_empty())
    {
        md.push_str("\n## Lost writes\n\n");
        for w in &h.lost_writes {
            let _ = writeln!(md, "- {}", cell(w));
        }
    }
    if let Some(regions) = &report.regions {
        let counts = |m: &BTreeMap<String, u64>| {
            if m.is_empty() {
                "none".to_owned()
            } else {
                m.iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        let _ = writeln!(
            md,
            "\n## Routing by region ({} regions)\n\n| phase | may answer | settled from s | settled may answer | conns | answered by | settled conns | settled answered by | resolve refusals once settled |\n|---|---|---|---|---|---|---|---|---|",
            regions.regions
        );
        for r in &regions.routing {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                cell(&r.phase),
                cell(&format!("{:?}", r.answered_by)),
                r.settled_from_s,
                cell(&format!("{:?}", r.settled_by)),
                r.conns,
                counts(&r.answered),
                r.settled_conns,
                counts(&r.settled_answered),
                counts(&r.refusals),
            );
        }
        let interleaved: Vec<String> = regions
            .routing
            .iter()
            .filter(|r| r.interleaved > 0)
            .map(|r| format!("{} {}", r.phase, r.interleaved))
            .collect();
        if !interleaved.is_empty() {
            let _ = writeln!(
                md,
                "\nConnections answered by a region after another had taken over: {}.",
                interleaved.join(", ")
            );
        }
        if !regions.writers.is_empty() {
            md.push_str("\nWriter epochs at the last reading: ");
            let readings: Vec<String> = regions
                .writers
                .iter()
                .map(|w| {
                    format!(
                        "{} epoch {} ({}, {})",
                        w.region,
                        w.epoch,
                        w.owner,
                        if w.settled { "settled" } else { "moving" }
                    )
                })
                .collect();
            let _ = writeln!(md, "{}.", readings.join("; "));
        }
    }
    md.push_str("\n## Phases\n\n");
    if report.phases.is_empty() {
        md.push_str("None.\n");
    } else {
        md.push_str("| phase | start s | end s | conns | failed conns |\n|---|---|---|---|---|\n");
        for p in &report.phases {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} |",
                cell(&p.name),
                p.start_s,
                p.end_s,
                p.conns,
                p.failed_conns
            );
        }
    }
    md.push_str("\n## Plots\n\n");
    if plots.is_empty() {
        md.push_str("None.\n");
    }
    for plot in plots {
        let _ = writeln!(md, "- [{plot}]({plot})");
    }
    md
}

/// `text` made safe for one Markdown table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(t_ms: u64, agent: &str, backend: Option<&str>) -> Conn {
        Conn {
            t_ms,
            agent: agent.to_owned(),
            outcome: if backend.is_some() {
                Outcome::Answered
            } else {
                Outcome::Failed
            },
            backend: backend.map(str::to_owned),
        }
    }

    fn ok(t_ms: u64, agent: &str, backend: &str) -> Conn {
        conn(t_ms, agent, Some(backend))
    }

    fn fail(t_ms: u64, agent: &str) -> Conn {
        conn(t_ms, agent, None)
    }

    fn leave(t_ms: u64, instance: &str) -> Event {
        Event::LeaveCommitted {
            t_ms,
            instance: instance.to_owned(),
        }
    }

    fn ready(t_ms: u64, instance: &str) -> Event {
        Event::Ready {
            t_ms,
            instance: instance.to_owned(),
        }
    }

    fn hard(t_ms: u64, instance: &str) -> Event {
        Event::HardFailure {
            t_ms,
            instance: instance.to_owned(),
            fault: "kill-backend".to_owned(),
        }
    }

    fn phase(t_ms: u64, name: &str) -> Event {
        Event::Phase {
            t_ms,
            name: name.to_owned(),
        }
    }

    /// A run's harness figures with the history check done (one write
    /// checked, nothing lost).
    fn input() -> ReportInput {
        ReportInput {
            scenario: "test".to_owned(),
            seed: 7,
            agents: 3,
            history: Some(HistoryFigures {
                writes_checked: 1,
                ..HistoryFigures::default()
            }),
            ..ReportInput::default()
        }
    }

    /// Pass bounds with the leave and crash figures not applicable.
    fn neither() -> Pass {
        Pass {
            min_leave_samples: 0,
            min_crash_samples: 0,
            ..Pass::default()
        }
    }

    #[test]
    fn routing_rules_judge_where_each_phase_went() {
        let rule = |phase: &str, answered_by: &[&str]| Routing {
            phase: phase.to_owned(),
            answered_by: answered_by.iter().map(|r| r.to_string()).collect(),
            settle_s: 1.0,
            settled_by: None,
            min_answered_share: 0.5,
            refusal: Some("stale".to_owned()),
            exclusive: false,
        };
        let answer = |t_ms: u64, refused: Option<&str>| crate::timeline::RegionAnswer {
            t_ms,
            agent: "a".to_owned(),
            region: "r1".to_owned(),
            refused: refused.map(str::to_owned),
        };
        let timeline = Timeline {
            conns: vec![
                ok(100, "a", "web-r1"),
                ok(1_500, "a", "web-r2"),
                ok(1_600, "a", "web-r2"),
                fail(1_700, "a"),
            ],
            events: vec![phase(0, "one")],
            region_answers: vec![answer(500, None), answer(1_500, Some("stale"))],
            backend_regions: [("web-r1", "r1"), ("web-r2", "r2")]
                .iter()
                .map(|(i, r)| (i.to_string(), r.to_string()))
                .collect(),
            duration_ms: 2_000,
            ..Timeline::default()
        };
        let pass = |rules| Pass {
            routing: rules,
            ..neither()
        };
        // r1 answered before it settled, r2 after; 2 of 3 answered.
        let r = compute(&input(), &timeline, &pass(vec![rule("one", &["r1", "r2"])]));
        assert!(r.pass, "{:?}", r.failures);
        let f = &r.regions.as_ref().unwrap().routing[0];
        assert_eq!((f.conns, f.settled_conns), (4, 3));
        assert_eq!(f.refusals, BTreeMap::from([("stale".to_owned(), 1)]));
        // r2 is not allowed: the run fails, naming it.
        let r = compute(&input(), &timeline, &pass(vec![rule("one", &["r1"])]));
        assert!(
            r.failures.iter().any(|f| f.contains("2 by r2")),
            "{:?}",
            r.failures
        );
        // A settled refusal other than the rule's fails too.
        let mut other = timeline.clone();
        other
            .region_answers
            .push(answer(1_800, Some("no_capacity")));
        let r = compute(&input(), &other, &pass(vec![rule("one", &["r1", "r2"])]));
        assert!(
            r.failures.iter().any(|f| f.contains("1 no_capacity")),
            "{:?}",
            r.failures
        );
        // No connection in the phase: measured nothing.
        let mut empty = timeline.clone();
        empty.conns.clear();
        let r = compute(&input(), &empty, &pass(vec![rule("one", &["r1"])]));
        assert!(
            r.failures.iter().any(|f| f.contains("measured nothing")),
            "{:?}",
            r.failures
        );
        // Rules in a one-region run: not measured.
        let one = Timeline {
            backend_regions: BTreeMap::new(),
            ..timeline
        };
        let r = compute(&input(), &one, &pass(vec![rule("one", &["r1"])]));
        assert!(r.regions.is_none());
        assert!(!r.pass);
    }

    #[test]
    fn a_single_writer_handover_is_judged_exclusive_and_every_region_on_the_epoch() {
        let rule = Routing {
            phase: "moved".to_owned(),
            answered_by: vec!["r1".to_owned(), "r2".to_owned()],
            settle_s: 1.0,
            settled_by: Some(vec!["r2".to_owned()]),
            min_answered_share: 0.5,
            refusal: None,
            exclusive: true,
        };
        let writer = |t_ms: u64, region: &str, epoch: u64| Event::Writer {
            t_ms,
            region: region.to_owned(),
            epoch,
            owner: "r1".to_owned(),
            settled: true,
        };
        let read = |t_ms: u64| Event::Step {
            t_ms,
            action: "read-writers".to_owned(),
            target: String::new(),
        };
        let timeline = Timeline {
            conns: vec![
                ok(100, "a", "web-r1"),
                fail(400, "a"),
                ok(1_500, "a", "web-r2"),
                ok(1_600, "a", "web-r2"),
            ],
            events: vec![
                phase(0, "moved"),
                writer(1_000, "r1", 2),
                read(1_000),
                writer(1_900, "r1", 3),
                writer(1_900, "r2", 3),
                read(1_900),
            ],
            backend_regions: [("web-r1", "r1"), ("web-r2", "r2")]
                .iter()
                .map(|(i, r)| (i.to_string(), r.to_string()))
                .collect(),
            duration_ms: 2_000,
            ..Timeline::default()
        };
        let pass = |epoch| Pass {
            routing: vec![rule.clone()],
            writer_epoch: Some(epoch),
            ..neither()
        };
        // r1, then r2, never back: exclusive; both regions read at epoch 3
        // at the last reading (the earlier one does not count).
        let r = compute(&input(), &timeline, &pass(3));
        assert!(r.pass, "{:?}", r.failures);
        assert_eq!(r.regions.as_ref().unwrap().writers.len(), 2);
        let r = compute(&input(), &timeline, &pass(2));
        assert!(
            r.failures.iter().any(|f| f.contains("r1 holds epoch 3")),
            "{:?}",
            r.failures
        );
        // A write back at r1 after r2 took over: interleaved.
        let mut back = timeline.clone();
        back.conns.push(ok(1_700, "a", "web-r1"));
        back.conns.push(ok(1_800, "a", "web-r2"));
        let r = compute(&input(), &back, &pass(3));
        let f = &r.regions.as_ref().unwrap().routing[0];
        assert_eq!(f.interleaved, 1, "r1 once r2 had taken over");
        assert!(
            r.failures.iter().any(|f| f.contains("back and forth")),
            "{:?}",
            r.failures
        );
        // No reading at all: the epoch was not measured.
        let mut unread = timeline.clone();
        unread.events.retain(|e| !matches!(e, Event::Writer { .. }));
        let r = compute(&input(), &unread, &pass(3));
        assert!(
            r.failures.iter().any(|f| f.contains("was not measured")),
            "{:?}",
            r.failures
        );
    }

    fn run(conns: Vec<Conn>, events: Vec<Event>, duration_ms: u64) -> Report {
        let timeline = Timeline {
            views: Vec::new(),
            region_answers: Vec::new(),
            backend_regions: Default::default(),
            routes: Vec::new(),
            conns,
            events,
            duration_ms,
        };
        compute(&input(), &timeline, &neither())
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let s = Stats::from_samples((1..=100).rev().collect());
        assert_eq!(
            (s.count, s.p50, s.p99, s.max),
            (100, Some(50.0), Some(99.0), Some(100.0))
        );
        let s = Stats::from_samples(vec![4, 1, 3, 2]);
        assert_eq!((s.p50, s.p99, s.max), (Some(2.0), Some(4.0), Some(4.0)));
        let s = Stats::from_samples(vec![5]);
        assert_eq!((s.p50, s.p99, s.max), (Some(5.0), Some(5.0), Some(5.0)));
        // 200 samples: p99 is the 198th smallest, not the largest.
        let s = Stats::from_samples((1..=200).collect());
        assert_eq!((s.p50, s.p99), (Some(100.0), Some(198.0)));
    }

    #[test]
    fn empty_stats_are_null() {
        let s = Stats::from_samples(Vec::new());
        assert_eq!(s, Stats::default());
        assert_eq!(
            serde_json::to_value(&s).expect("serializable"),
            serde_json::json!({"count": 0, "p50": null, "p99": null, "max": null})
        );
    }

    #[test]
    fn leave_is_the_last_answered_connection_after_the_commit() {
        let report = run(
            vec![
                ok(500, "n1", "a"),
                ok(1500, "n1", "a"),
                ok(2200, "n2", "a"),
                fail(2500, "n1"),
                ok(3000, "n1", "b"),
            ],
            vec![leave(1000, "a"), leave(1000, "b"), leave(9000, "c")],
            10_000,
        );
        // a: 2200 − 1000; b: answered at 3000; c: nothing after → 0.
        assert_eq!(report.leave_ms.count, 3);
        assert_eq!(report.leave_ms.max, Some(2000.0));
        assert_eq!(report.leave_ms.p50, Some(1200.0));
        let samples = run(
            vec![ok(2200, "n2", "a")],
            vec![leave(1000, "a"), leave(9000, "c")],
            10_000,
        )
        .leave_ms;
        assert_eq!((samples.p50, samples.max), (Some(0.0), Some(1200.0)));
    }

    #[test]
    fn a_leave_ends_when_the_instance_is_ready_again() {
        let report = run(
            vec![ok(1500, "n1", "c"), ok(9000, "n1", "c")],
            vec![leave(1000, "c"), ready(2000, "c")],
            10_000,
        );
        assert_eq!(report.leave_ms.max, Some(500.0));
        assert_eq!(report.new_conns_to_drained, 0);
    }

    #[test]
    fn a_leave_ends_when_a_new_process_of_the_instance_starts() {
        // Killed, UNHEALTHY at 1000, restarted at 5000: answers of the new
        // process before its READY commit (panic routing to it) are not
        // answers of the instance that left.
        let restarted = Event::Restarted {
            t_ms: 5_000,
            instance: "c".to_owned(),
        };
        let report = run(
            vec![ok(5_100, "n1", "c"), ok(5_200, "n2", "c")],
            vec![leave(1_000, "c"), restarted, ready(5_800, "c")],
            10_000,
        );
        assert_eq!(report.leave_ms.max, Some(0.0));
        assert_eq!(report.new_conns_to_drained, 0);
    }

    #[test]
    fn a_second_commit_during_a_leave_starts_nothing() {
        // DRAINING at 1000, then UNHEALTHY at 1800: one leave, from 1000.
        let report = run(
            vec![ok(2500, "n1", "a"), ok(4500, "n1", "a")],
            vec![leave(1000, "a"), leave(1800, "a")],
            10_000,
        );
        assert_eq!(report.leave_ms.count, 1);
        assert_eq!(report.leave_ms.max, Some(3500.0));
        assert_eq!(report.new_conns_to_drained, 1);
        assert_eq!(report.failures[0], "leave p99 3500 ms exceeds 3000 ms");
    }

    #[test]
    fn drained_counts_answers_more_than_three_seconds_after_the_commit() {
        let report = run(
            vec![
                ok(3999, "n1", "a"),
                ok(4000, "n1", "a"),
                ok(4001, "n1", "a"),
                ok(4002, "n2", "a"),
                ok(5000, "n2", "b"),
                fail(6000, "n2"),
            ],
            vec![leave(1000, "a")],
            10_000,
        );
        assert_eq!(report.new_conns_to_drained, 2);
        assert!(!report.pass);
        assert!(report
            .failures
            .iter()
            .any(|f| f.starts_with("2 new connections to drained backends")));
    }

    #[test]
    fn not_ready_counts_answers_before_the_first_ready() {
        let report = run(
            vec![
                ok(1000, "n1", "new"),
                ok(1999, "n1", "new"),
                ok(2000, "n1", "new"),
                ok(500, "n1", "old"),
                ok(6000, "n1", "new"),
            ],
            vec![ready(2000, "new"), leave(3000, "new"), ready(5000, "new")],
            10_000,
        );
        assert_eq!(report.new_conns_to_not_ready, 2);
    }

    #[test]
    fn crash_is_the_last_failure_on_agents_that_routed_to_it() {
        let conns = vec![
            ok(9000, "a", "x"),
            ok(9100, "b", "y"),
            ok(9200, "c", "x"),
            fail(10_050, "a"), // before a answered again: not counted alone
            ok(10_100, "a", "y"),
            ok(10_100, "b", "y"),
            fail(10_500, "a"),
            ok(10_600, "a", "y"),
            fail(12_000, "a"),
            ok(12_100, "a", "y"),
            fail(20_000, "b"), // b never routed to x
            fail(11_000, "c"), // c's own node is down: never answers again
            fail(30_000, "c"),
        ];
        let report = run(conns, vec![hard(10_000, "x"), hard(10_000, "z")], 40_000);
        assert_eq!(report.crash_ms.count, 2);
        assert_eq!(report.crash_ms.max, Some(2000.0));
        assert_eq!(report.crash_ms.p50, Some(0.0));
        assert_eq!(report.failed_conns, 6);
        assert!(report.pass, "{:?}", report.failures);
    }

    #[test]
    fn crash_counts_until_no_live_agent_offers_the_backend() {
        let mut timeline = Timeline {
            duration_ms: 30_000,
            ..Timeline::default()
        };
        timeline.events.push(Event::HardFailure {
            t_ms: 1_000,
            instance: "web-1".into(),
            fault: "crash-node".into(),
        });
        for (t, listed) in [(900, true), (1_100, true), (4_600, true), (4_700, false)] {
            timeline.routes.push(Route {
                t_ms: t,
                agent: "node-0".into(),
                instances: if listed {
                    vec!["web-1".into(), "web-2".into()]
                } else {
                    vec!["web-2".into()]
                },
            });
        }
        let report = compute(&ReportInput::default(), &timeline, &Pass::default());
        assert_eq!(report.crash_ms.max, Some(3_600.0));
    }

    #[test]
    fn outage_failures_while_an_agent_still_offered_a_failed_backend_are_not_counted_as_live() {
        let mut timeline = Timeline {
            duration_ms: 30_000,
            ..Timeline::default()
        };
        timeline.events.push(Event::HardFailure {
            t_ms: 5_000,
            instance: "web-1".into(),
            fault: "crash-node".into(),
        });
        timeline.routes.push(Route {
            t_ms: 5_100,
            agent: "node-0".into(),
            instances: vec!["web-1".into(), "web-2".into()],
        });
        timeline.routes.push(Route {
            t_ms: 5_200,
            agent: "node-0".into(),
            instances: vec!["web-2".into()],
        });
        for t in [5_050, 9_000] {
            timeline.conns.push(Conn {
                t_ms: t,
                agent: "node-0".into(),
                backend: None,
                outcome: Outcome::Failed,
            });
        }
        let input = ReportInput {
            outage: Some((1_000, 20_000)),
            ..ReportInput::default()
        };
        let report = compute(&input, &timeline, &Pass::default());
        let outage = report.outage.unwrap();
        assert_eq!(
            outage.failed_conns_to_live_backends, 1,
            "the failure at 5.05 s went to the crashed web-1; the one at 9 s did not"
        );
    }

    #[test]
    fn crash_over_the_bound_fails() {
        let conns = vec![ok(900, "a", "x"), ok(1500, "a", "y"), fail(17_000, "a")];
        let report = run(conns, vec![hard(1000, "x")], 20_000);
        assert_eq!(report.crash_ms.p99, Some(16_000.0));
        assert_eq!(report.failures, ["crash p99 16000 ms exceeds 15000 ms"]);
    }

    #[test]
    fn phases_split_the_run() {
        let report = run(
            vec![
                ok(500, "a", "x"), // before the first phase
                ok(1000, "a", "x"),
                fail(4999, "a"),
                ok(5000, "a", "x"),
                fail(9999, "a"),
                fail(10_500, "a"), // after the recorded end: still the last phase
            ],
            vec![phase(1000, "steady"), phase(5000, "fault")],
            10_000,
        );
        assert_eq!(
            report.phases,
            [
                Phase {
                    name: "steady".to_owned(),
                    start_s: 1.0,
                    end_s: 5.0,
                    conns: 2,
                    failed_conns: 1,
                },
                Phase {
                    name: "fault".to_owned(),
                    start_s: 5.0,
                    end_s: 10.0,
                    conns: 3,
                    failed_conns: 2,
                },
            ]
        );
        assert_eq!(report.duration_s, 10.0);
    }

    #[test]
    fn outage_counts_failures_in_its_window() {
        let timeline = Timeline {
            views: Vec::new(),
            region_answers: Vec::new(),
            backend_regions: Default::default(),
            routes: Vec::new(),
            conns: vec![
                fail(1999, "a"),
                fail(2000, "a"),
                ok(3000, "a", "x"),
                fail(3999, "b"),
                fail(4000, "b"),
            ],
            events: Vec::new(),
            duration_ms: 5000,
        };
        let input = ReportInput {
            outage: Some((2000, 4000)),
            ..input()
        };
        let report = compute(&input, &timeline, &neither());
        assert_eq!(
            report.outage,
            Some(Outage {
                duration_s: 2.0,
                failed_conns_to_live_backends: 2,
            })
        );
        assert_eq!(report.failed_conns, 4);
        assert_eq!(
            report.failures,
            ["2 failed connections to live backends during the outage exceed the limit of 0"]
        );
        let report = compute(&self::input(), &timeline, &neither());
        assert_eq!(report.outage, None);
        assert!(report.pass);
    }

    #[test]
    fn harness_figures_are_judged() {
        let input = ReportInput {
            converge_ms: Some(1234),
            false_removals: 2,
            max_concurrent_snapshots: 40,
            ..input()
        };
        let timeline = Timeline {
            conns: vec![ok(10, "a", "x")],
            ..Timeline::default()
        };
        let lenient = compute(&input, &timeline, &neither());
        assert_eq!(lenient.converge_ms, Some(1234));
        assert_eq!(lenient.failures, ["2 false removals exceed the limit of 0"]);

        let strict = Pass {
            max_false_removals: 2,
            min_leave_samples: 0,
            min_crash_samples: 0,
            max_concurrent_snapshots: Some(32),
            ..Pass::default()
        };
        let report = compute(&input, &timeline, &strict);
        assert!(!report.pass);
        assert_eq!(
            report.failures,
            ["40 concurrent snapshots exceed the limit of 32"]
        );
    }

    #[test]
    fn json_fields_are_exactly_the_contract() {
        let input = ReportInput {
            outage: Some((0, 1000)),
            ..input()
        };
        let timeline = Timeline {
            views: Vec::new(),
            region_answers: Vec::new(),
            backend_regions: Default::default(),
            routes: Vec::new(),
            conns: vec![ok(10, "a", "x")],
            events: vec![phase(0, "p")],
            duration_ms: 1000,
        };
        let report = compute(&input, &timeline, &Pass::default());
        let json = serde_json::to_value(&report).expect("serializable");
        let keys = |v: &serde_json::Value| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().expect("an object").keys().cloned().collect();
            k.sort();
            k
        };
        let sorted = |names: &[&str]| {
            let mut n: Vec<String> = names.iter().map(|s| s.to_string()).collect();
            n.sort();
            n
        };
        assert_eq!(
            keys(&json),
            sorted(&[
                "scenario",
                "git_commit",
                "git_dirty",
                "seed",
                "agents",
                "duration_s",
                "leave_ms",
                "crash_ms",
                "crash_commit_ms",
                "leave_view_ms",
                "crash_view_ms",
                "converge_ms",
                "new_conns_to_drained",
                "new_conns_to_not_ready",
                "conns",
                "failed_conns",
                "false_removals",
                "view_dips",
                "max_concurrent_snapshots",
                "snapshots_refused",
                "phases",
                "outage",
                "election",
                "history",
                "cache_corruption",
                "degraded",
                "regions",
                "pass",
                "failures",
            ])
        );
        assert_eq!(
            keys(&json["history"]),
            sorted(&["writes_checked", "lost_writes", "false_removals"])
        );
        let stats = sorted(&["count", "p50", "p99", "max"]);
        assert_eq!(keys(&json["leave_ms"]), stats);
        assert_eq!(keys(&json["crash_ms"]), stats);
        assert_eq!(
            keys(&json["phases"][0]),
            sorted(&["name", "start_s", "end_s", "conns", "failed_conns"])
        );
        assert_eq!(
            keys(&json["outage"]),
            sorted(&["duration_s", "failed_conns_to_live_backends"])
        );
        assert!(json["failures"].is_array());
        assert!(json["pass"].is_boolean());
    }

    #[test]
    fn write_produces_both_files() {
        let report = run(
            vec![ok(4500, "a", "x")],
            vec![phase(0, "all | one"), leave(1000, "x")],
            5000,
        );
        assert!(!report.pass);
        let budget = vec![("leave_ms".to_owned(), "p99 2100 ms".to_owned())];
        let dir = tempfile::tempdir().expect("temp dir");
        let out = dir.path().join("run-1");
        write_json(&out, &report).expect("report.json written");
        let plots = vec!["traffic.svg".to_owned()];
        write_markdown(&out, &report, &budget, &plots).expect("report.md written");

        let json = std::fs::read_to_string(out.join("report.json")).expect("report.json");
        let back: Report = serde_json::from_str(&json).expect("parses back");
        assert_eq!(back, report);

        let md = std::fs::read_to_string(out.join("report.md")).expect("report.md");
        assert!(md.contains("**FAIL**"), "{md}");
        assert!(
            md.contains("| figure | measured | budget predicts |"),
            "{md}"
        );
        assert!(
            md.contains("| leave_ms | count 1, p50 3500, p99 3500, max 3500 | p99 2100 ms |"),
            "{md}"
        );
        assert!(md.contains("| crash_ms | count 0 |  |"), "{md}");
        assert!(md.contains("- leave p99 3500 ms exceeds 3000 ms"), "{md}");
        assert!(md.contains("| all \\| one | 0 | 5 | 1 | 0 |"), "{md}");
        assert!(
            md.contains("## Plots\n\n- [traffic.svg](traffic.svg)\n"),
            "{md}"
        );
    }

    #[test]
    fn samples_are_the_reports_numbers() {
        let timeline = Timeline {
            views: Vec::new(),
            region_answers: Vec::new(),
            backend_regions: Default::default(),
            routes: Vec::new(),
            conns: vec![ok(900, "n1", "x"), ok(2200, "n1", "a"), fail(2500, "n1")],
            events: vec![leave(1000, "a"), hard(1000, "x")],
            duration_ms: 5000,
        };
        let samples = samples(&timeline);
        assert_eq!(
            samples.leave,
            [Sample {
                instance: "a".to_owned(),
                start_ms: 1000,
                ms: 1200,
            }]
        );
        assert_eq!(samples.crash.len(), 1);
        let report = compute(&input(), &timeline, &Pass::default());
        assert_eq!(report.leave_ms.max, Some(1200.0));
        assert_eq!(
            report.crash_ms.max,
            Some(samples.crash[0].ms as f64),
            "{samples:?}"
        );
    }

    fn step(t_ms: u64, action: &str) -> Event {
        Event::Step {
            t_ms,
            action: action.to_owned(),
            target: String::new(),
        }
    }

    fn route(t_ms: u64, agent: &str, instances: &[&str]) -> Route {
        Route {
            t_ms,
            agent: agent.to_owned(),
            instances: instances.iter().map(|i| i.to_string()).collect(),
        }
    }

    #[test]
    fn converges_when_the_last_agent_settles_on_the_common_set() {
        let mut timeline = Timeline {
            duration_ms: 10_000,
            events: vec![
                step(1_000, "partition-node"),
                step(5_000, "heal"),
                step(6_000, "drain"),
            ],
            ..Timeline::default()
        };
        for t in (4_000..10_000).step_by(100) {
            // n1 lags: it offers only x until 5.6 s; n2 has both throughout,
            // in another order. n3's node crashed at 7 s: it no longer counts.
            let n1: &[&str] = if t < 5_600 { &["x"] } else { &["x", "y"] };
            timeline.routes.push(route(t, "n1", n1));
            timeline.routes.push(route(t + 3, "n2", &["y", "x", "y"]));
            if t < 7_000 {
                timeline.routes.push(route(t + 5, "n3", &["z"]));
            }
        }
        assert_eq!(converge_ms(&timeline), Some(600));
        timeline.conns.push(ok(100, "n1", "x"));
        let report = compute(&input(), &timeline, &neither());
        assert_eq!(report.converge_ms, Some(600));
        assert!(report.pass, "{:?}", report.failures);

        // Already agreeing at the recovery: 0.
        timeline.routes.retain(|r| r.agent == "n2");
        assert_eq!(converge_ms(&timeline), Some(0));
        // No recovery step: nothing to converge from.
        timeline
            .events
            .retain(|e| !matches!(e, Event::Step { action, .. } if action == "heal"));
        assert_eq!(converge_ms(&timeline), None);
    }

    #[test]
    fn never_converges_when_the_agents_end_apart() {
        let mut timeline = Timeline {
            duration_ms: 10_000,
            events: vec![step(2_000, "pause-agent"), step(4_000, "resume-agent")],
            ..Timeline::default()
        };
        for t in (0..10_000).step_by(100) {
            timeline.routes.push(route(t, "n1", &["x", "y"]));
            timeline.routes.push(route(t + 1, "n2", &["x"]));
        }
        assert_eq!(converge_ms(&timeline), None);
        timeline.conns.push(ok(100, "n1", "x"));
        let report = compute(&input(), &timeline, &neither());
        assert_eq!(report.converge_ms, None);
        assert!(
            report.pass,
            "no pass bound on convergence: {:?}",
            report.failures
        );
        // No sample after the recovery: unknown, not 0.
        timeline.routes.retain(|r| r.t_ms < 4_000);
        assert_eq!(converge_ms(&timeline), None);
    }

    #[test]
    fn a_judged_figure_without_samples_fails_unless_declared_not_applicable() {
        let timeline = Timeline {
            conns: vec![ok(10, "a", "x")],
            duration_ms: 1000,
            ..Timeline::default()
        };
        let report = compute(&input(), &timeline, &Pass::default());
        assert!(!report.pass);
        assert_eq!(
            report.failures,
            [
                "leave: 0 samples, fewer than the 1 the scenario requires (min_leave_samples): the run did not measure what it judges",
                "crash: 0 samples, fewer than the 1 the scenario requires (min_crash_samples): the run did not measure what it judges",
            ]
        );
        let report = compute(&input(), &timeline, &neither());
        assert!(report.pass, "{:?}", report.failures);
        // A minimum above the samples fails too.
        let timeline = Timeline {
            conns: vec![ok(900, "a", "x"), ok(1100, "a", "y")],
            events: vec![leave(1000, "x")],
            duration_ms: 2000,
            ..Timeline::default()
        };
        let report = compute(
            &input(),
            &timeline,
            &Pass {
                min_leave_samples: 100,
                ..neither()
            },
        );
        assert_eq!(report.leave_ms.count, 1);
        assert!(!report.pass);
    }

    #[test]
    fn a_run_that_answered_nothing_or_read_no_audit_log_fails() {
        let silent = Timeline {
            conns: vec![fail(10, "a")],
            duration_ms: 1000,
            ..Timeline::default()
        };
        let report = compute(&input(), &silent, &neither());
        assert_eq!(
            report.failures,
            ["no connection of 1 was answered: the traffic measured nothing"]
        );
        let answered = Timeline {
            conns: vec![ok(10, "a", "x")],
            duration_ms: 1000,
            ..Timeline::default()
        };
        let blind = ReportInput {
            history: None,
            ..input()
        };
        let report = compute(&blind, &answered, &neither());
        assert_eq!(
            report.failures,
            ["the audit log could not be read: false removals and lost writes were not measured"]
        );
        let unchecked = ReportInput {
            history: Some(HistoryFigures::default()),
            ..input()
        };
        let report = compute(&unchecked, &answered, &neither());
        assert_eq!(
            report.failures,
            ["0 writes checked against the audit log, fewer than the 1 required (min_writes_checked)"]
        );
        let lost = ReportInput {
            history: Some(HistoryFigures {
                writes_checked: 3,
                lost_writes: vec!["x: a drain answered committed (200) at 5 ms is not in the audit log after revision 0".to_owned()],
                false_removals: Vec::new(),
            }),
            ..input()
        };
        let report = compute(&lost, &answered, &neither());
        assert_eq!(report.failures.len(), 1);
        assert!(report.failures[0].starts_with("1 lost writes exceed the limit of 0: x: a drain"));
    }

    #[test]
    fn failures_in_an_election_window_are_judged() {
        let timeline = Timeline {
            conns: vec![
                ok(900, "a", "x"),
                fail(1100, "a"),
                ok(1200, "a", "x"),
                fail(3000, "b"),
            ],
            duration_ms: 4000,
            ..Timeline::default()
        };
        let pass = Pass {
            max_failed_conns_in_election: Some(0),
            ..neither()
        };
        let unmeasured = compute(&input(), &timeline, &pass);
        assert_eq!(
            unmeasured.failures,
            ["no election window was measured (no leader killed, or no commit answered after it)"]
        );
        let elected = ReportInput {
            election: Some((1000, 2000)),
            ..input()
        };
        let report = compute(&elected, &timeline, &pass);
        assert_eq!(
            report.election,
            Some(Election {
                window_ms: 1000,
                conns: 2,
                failed_conns_to_live_backends: 1,
            })
        );
        assert_eq!(
            report.failures,
            ["1 failed connections to live backends during the 1000 ms election exceed the limit of 0"]
        );
    }

    #[test]
    fn an_undetected_or_served_corruption_fails() {
        let timeline = Timeline {
            conns: vec![ok(900, "a", "x")],
            duration_ms: 1000,
            ..Timeline::default()
        };
        let with = |detected, stale_answers| ReportInput {
            cache_corruption: Some(Corruption {
                files: 2,
                detected,
                stale_answers,
            }),
            ..input()
        };
        assert!(compute(&with(2, 0), &timeline, &neither()).pass);
        assert_eq!(
            compute(&with(1, 0), &timeline, &neither()).failures,
            ["1 of 2 corrupted cache files were detected (the rest may have been read as valid)"]
        );
        assert_eq!(
            compute(&with(2, 3), &timeline, &neither()).failures,
            ["the restarted agent answered 3 times from its cache after the corruption"]
        );
    }

    #[test]
    fn a_crash_sample_ends_when_the_instance_is_ready_again() {
        let timeline = Timeline {
            views: Vec::new(),
            region_answers: Vec::new(),
            backend_regions: Default::default(),
            conns: vec![
                ok(900, "a", "x"),
                ok(1500, "a", "y"),
                fail(2000, "a"),
                ok(9000, "a", "x"),
            ],
            routes: vec![route(1500, "a", &["x"]), route(8000, "a", &["x", "y"])],
            events: vec![hard(1000, "x"), ready(7000, "x")],
            duration_ms: 10_000,
        };
        let report = compute(&input(), &timeline, &neither());
        assert_eq!(
            report.crash_ms.max,
            Some(1000.0),
            "the route at 8 s is after x came back"
        );
    }

    #[test]
    fn view_samples_are_the_last_live_agents_drop() {
        let view = |t_ms: u64, agent: &str, ids: &[&str]| Route {
            t_ms,
            agent: agent.to_owned(),
            instances: ids.iter().map(|s| s.to_string()).collect(),
        };
        let timeline = Timeline {
            conns: vec![ok(10, "a", "x")],
            routes: Vec::new(),
            views: vec![
                view(0, "a", &["x", "y"]),
                view(1_040, "a", &["y"]),
                view(0, "b", &["x", "y"]),
                view(1_090, "b", &["y"]),
                // c's node crashed after the leave: it says nothing.
                view(0, "c", &["x", "y"]),
                // d never held x.
                view(0, "d", &["y"]),
                // e: its node crashed (hard failure of y at 5 s); after
                // that its view is not read.
                view(0, "e", &["x", "y"]),
                view(1_020, "e", &["y"]),
            ],
            events: vec![
                leave(1_000, "x"),
                step(1_500, "crash-node"),
                hard(5_000, "y"),
            ],
            duration_ms: 9_000,
            ..Timeline::default()
        };
        let mut timeline = timeline;
        if let Event::Step { target, .. } = &mut timeline.events[1] {
            *target = "c".to_owned();
        }
        let samples = samples(&timeline);
        assert_eq!(
            samples.leave_view,
            [Sample {
                instance: "x".to_owned(),
                start_ms: 1_000,
                ms: 90,
            }]
        );
        // Nobody dropped y: every live agent still held it at the end.
        assert_eq!(samples.crash_view[0].ms, 4_000);
        let report = compute(&input(), &timeline, &neither());
        assert_eq!(report.leave_view_ms.max, Some(90.0));
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        let strict = Pass {
            crash_p99_ms: 3_000,
            ..neither()
        };
        assert_eq!(
            compute(&input(), &timeline, &strict).failures,
            ["crash (read from every agent's view) p99 4000 ms exceeds 3000 ms"]
        );
    }

    #[test]
    fn a_view_that_drops_an_instance_nobody_touched_and_offers_it_again_is_a_dip() {
        let view = |t_ms: u64, agent: &str, ids: &[&str]| Route {
            t_ms,
            agent: agent.to_owned(),
            instances: ids.iter().map(|s| s.to_string()).collect(),
        };
        let timeline = Timeline {
            views: vec![
                // a: y dropped at 2 s and back at 2.3 s, nothing caused it.
                view(0, "a", &["x", "y"]),
                view(2_000, "a", &["x"]),
                view(2_300, "a", &["x", "y"]),
                // b: x left on its leave commit and came back READY.
                view(0, "b", &["x", "y"]),
                view(1_010, "b", &["y"]),
                view(4_000, "b", &["x", "y"]),
                // c: y dropped for good; not a dip (false removals cover it).
                view(0, "c", &["x", "y"]),
                view(3_000, "c", &["x"]),
            ],
            conns: vec![ok(10, "a", "y")],
            events: vec![leave(1_000, "x"), ready(3_900, "x")],
            duration_ms: 9_000,
            ..Timeline::default()
        };
        let report = compute(&input(), &timeline, &neither());
        assert_eq!(report.view_dips, Some(1));
        assert!(
            report.failures.is_empty(),
            "unjudged: {:?}",
            report.failures
        );
        let judged = Pass {
            max_view_dips: Some(0),
            ..neither()
        };
        assert_eq!(
            compute(&input(), &timeline, &judged).failures,
            ["1 view dips (an instance the scenario left alone dropped from a live agent's view and back) exceed the limit of 0"]
        );
    }
}
