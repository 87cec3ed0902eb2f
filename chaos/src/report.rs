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

mod converge;
mod judge;
mod markdown;
mod regions;
#[cfg(test)]
mod tests;
mod views;

pub use converge::{converge_ms, RECOVERY_ACTIONS, SAMPLED_AT_END_MS};
use judge::judge;
pub use markdown::{markdown, write_json, write_markdown};
use regions::regions;
pub use views::{samples, Sample, Samples};
use views::{samples_of, sorted, view_dips, ViewHistory};

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
    /// What a `rogue` step tried and what came of it.
    pub rogue: Option<crate::rogue::RogueFigures>,
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
    /// A `rogue` step's attacks and what came of each; `null` without one.
    #[serde(default)]
    pub rogue: Option<crate::rogue::RogueFigures>,
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
        rogue: input.rogue.clone(),
        pass: false,
        failures: Vec::new(),
    };
    report.failures = judge(&report, pass);
    report.pass = report.failures.is_empty();
    report
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

fn seconds(ms: u64) -> f64 {
    ms as f64 / 1000.0
}
