//! The failure-detection budget (R5): from the agent's and the arbiter's
//! settings, how long each kind of failure or leave takes until no proxy
//! selects the endpoint, compared with the SLOs. Every number comes from a
//! config value or a named mathematical constant. This is arithmetic on
//! settings, not a measurement: it must not read clocks or run anything —
//! the chaos suite measures what the budget predicts.

use std::f64::consts::LN_10;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{rules, AgentConfig, ArbiterConfig, ConfigError, RENEWALS_PER_TTL};

/// Leave SLO (R5), in ms: from the commit of READY → DRAINING or READY →
/// UNHEALTHY until no proxy selects the endpoint for new traffic, p99.
pub const LEAVE_SLO_MS: f64 = 3_000.0;

/// Hard-failure SLO (R5), in ms: from a process or node vanishing silently
/// (or an app freezing) until it is out of every candidate set, p99.
pub const HARD_FAILURE_SLO_MS: f64 = 15_000.0;

/// Median SWIM protocol periods until some member first probes a dead
/// member. Every member probes one other per period, each at its own
/// point of the period (foca walks a shuffled member list), so the N − 1
/// survivors' probes of the dead one arrive together at about one per
/// period, at random times: the wait from the crash is close to
/// exponential with a mean of one period (Das, Gupta and Motivala, "SWIM",
/// 2002, count whole periods, e/(e − 1) ≈ 1.58, because their probes start
/// only at period boundaries). Its median, ln 2 ≈ 0.69 periods, is the
/// budget's expected value: the figure compared with a measured p50 (the
/// chaos suite's `node-crash`).
pub const SWIM_EXPECTED_FIRST_PROBE_PERIODS: f64 = std::f64::consts::LN_2;

/// p99 of the same wait: P(not probed within k periods) = e^−k, which
/// falls to 1 % at k = ln(100) ≈ 4.6 periods. Random probing has no finite
/// maximum, so the gossip path's "worst" is this p99 bound.
pub const SWIM_P99_FIRST_PROBE_PERIODS: f64 = 2.0 * LN_10;

/// The arbiter's silence window should hold at least this many agent
/// keep-alives, so one late keep-alive never looks like a dead agent.
pub const MIN_KEEPALIVES_PER_SILENCE: u64 = 2;

/// How long a witness agent's TCP connect to a silent node's endpoint may
/// take (the agent's constant), ms.
pub const WITNESS_CONNECT_MS: u64 = 500;

/// `[budget]` in the agent file: what the calculator cannot know from
/// settings. Measure them (the arbiter exports commit latency, agents their
/// watch lag) and write them here; they have no effect at run time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetEstimates {
    /// Typical arbiter commit of one change, Raft round and fsync included,
    /// in ms. Default 5.
    pub commit_ms: u64,
    /// Slowest commit worth planning for (p99), in ms. Default 50: a slow
    /// fsync. At least `commit_ms`.
    pub commit_worst_ms: u64,
    /// Typical one-way latency between agent and arbiter, in ms. Default 1
    /// (same data centre).
    pub network_ms: u64,
    /// p99 one-way latency between agent and arbiter, in ms. Default 50. At
    /// least `network_ms`.
    pub network_worst_ms: u64,
    /// Time for an agent to apply a delta to its endpoint view, in ms.
    /// Default 1.
    pub apply_ms: u64,
    /// Agents that follow a typical service. The arbiter sends each change
    /// to its followers one after another, so the last one gets it
    /// (followers − 1) sends after the first. Default 1.
    pub followers: u32,
    /// The cost of one of those sends, in µs: on the arbiter, encoding,
    /// sealing and writing one delta. Default 20. Where the agents share the
    /// arbiter's cores (the chaos harness runs 20–32 on two), their own
    /// wake-up and apply queue behind each other too: measure the spread
    /// between the first and the last agent's view change and write it
    /// here.
    pub fanout_us: u64,
}

impl Default for BudgetEstimates {
    fn default() -> Self {
        Self {
            commit_ms: 5,
            commit_worst_ms: 50,
            network_ms: 1,
            network_worst_ms: 50,
            apply_ms: 1,
            followers: 1,
            fanout_us: 20,
        }
    }
}

impl BudgetEstimates {
    /// Worst cases must not be below typical ones.
    pub fn validate(&self, prefix: &str) -> Result<(), ConfigError> {
        rules::at_least(
            &format!("{prefix}.commit_worst_ms"),
            self.commit_worst_ms,
            self.commit_ms,
        )?;
        rules::at_least(
            &format!("{prefix}.network_worst_ms"),
            self.network_worst_ms,
            self.network_ms,
        )?;
        rules::at_least(&format!("{prefix}.followers"), self.followers, 1)
    }
}

/// The cases the budget covers, one row each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// (a) The app stops answering: readiness probes fail by timeout.
    ReadinessFailure,
    /// (b) The instance process dies and nothing holds a registration
    /// session: probes see connection refused at once.
    ProcessCrashProbe,
    /// (b′) The process dies while holding its registration session: the
    /// agent sees the connection close at once (R4).
    ProcessCrashSession,
    /// (c) The whole node vanishes silently: gossip or the node lease.
    SilentNodeCrash,
    /// (d) Deliberate leave: the clock starts at the drain's commit (R5).
    Leave,
}

impl Case {
    /// The row's name in the table and in violation messages.
    pub const fn name(self) -> &'static str {
        match self {
            Self::ReadinessFailure => "readiness failure / app freeze",
            Self::ProcessCrashProbe => "process crash (probe only)",
            Self::ProcessCrashSession => "process crash (session held)",
            Self::SilentNodeCrash => "silent node crash",
            Self::Leave => "deliberate leave (drain)",
        }
    }
}

/// Where a term sits relative to the catalog commit; the leave SLO covers
/// only what follows the commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Until the arbiter has decided (probes, gossip, lease expiry).
    Detection,
    /// The arbiter's commit of the change.
    Commit,
    /// From the commit until no proxy or DNS caller selects the endpoint.
    Propagation,
}

/// The setting a term depends on most, and what to do about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Setting {
    /// Full dotted path, e.g. `agent.gossip.suspect_to_down_ms`.
    pub path: String,
    /// The effective value as shown to the operator (gossip values that come
    /// from a preset say so, e.g. `350 (preset lan)`).
    pub value: String,
    /// What an operator can do when this term is too large.
    pub advice: String,
}

impl Setting {
    fn new(path: impl Into<String>, value: impl fmt::Display, advice: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            value: value.to_string(),
            advice: advice.into(),
        }
    }
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {}", self.path, self.value)
    }
}

/// One summand of a path: a step between the failure and the last proxy
/// knowing, with its formula in the name.
#[derive(Debug, Clone, PartialEq)]
pub struct Term {
    /// What this step is, with its formula (expected | worst).
    pub name: String,
    /// Before the commit, the commit, or after it.
    pub phase: Phase,
    /// Expected duration, in ms.
    pub expected_ms: f64,
    /// Worst case (or p99 where no maximum exists), in ms.
    pub worst_ms: f64,
    /// The setting this step grows with; `None` for steps no setting controls.
    pub setting: Option<Setting>,
}

impl Term {
    fn new(
        name: impl Into<String>,
        phase: Phase,
        expected_ms: f64,
        worst_ms: f64,
        setting: Option<Setting>,
    ) -> Self {
        Self {
            name: name.into(),
            phase,
            expected_ms,
            worst_ms,
            setting,
        }
    }
}

/// One way the failure can reach every proxy: a sum of terms.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetPath {
    /// Which mechanism this is (only shown when a case has several).
    pub name: String,
    /// The summands.
    pub terms: Vec<Term>,
}

impl BudgetPath {
    /// Sum of the terms' expected durations, in ms.
    pub fn expected_ms(&self) -> f64 {
        self.terms.iter().map(|t| t.expected_ms).sum()
    }

    /// Sum of the terms' worst durations, in ms.
    pub fn worst_ms(&self) -> f64 {
        self.terms.iter().map(|t| t.worst_ms).sum()
    }

    /// Worst-case time after the commit, in ms.
    pub fn post_commit_worst_ms(&self) -> f64 {
        self.post_commit_terms().map(|t| t.worst_ms).sum()
    }

    fn post_commit_terms(&self) -> impl Iterator<Item = &Term> {
        self.terms.iter().filter(|t| t.phase == Phase::Propagation)
    }
}

/// The largest term (by worst case) that a setting controls.
fn dominant<'a>(terms: impl Iterator<Item = &'a Term>) -> Option<&'a Setting> {
    terms
        .filter(|t| t.setting.is_some())
        .max_by(|a, b| a.worst_ms.total_cmp(&b.worst_ms))
        .and_then(|t| t.setting.as_ref())
}

/// One case of the budget.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetRow {
    /// Which case.
    pub case: Case,
    /// The SLO the worst case is held to, in ms.
    pub slo_ms: Option<f64>,
    /// An SLO for the part after the commit alone, in ms (the leave SLO for
    /// a readiness failure, whose R5 clock starts at READY → UNHEALTHY).
    pub post_commit_slo_ms: Option<f64>,
    /// The ways the failure can reach every proxy; the case takes whichever
    /// is faster, per statistic, since each is an upper bound on the same
    /// event.
    pub paths: Vec<BudgetPath>,
}

impl BudgetRow {
    /// The case's name.
    pub fn name(&self) -> &'static str {
        self.case.name()
    }

    /// Expected time, in ms: the smallest expected time of the paths.
    pub fn expected_ms(&self) -> f64 {
        self.paths
            .iter()
            .map(BudgetPath::expected_ms)
            .fold(f64::INFINITY, f64::min)
    }

    /// Worst case, in ms: the smallest worst case of the paths.
    pub fn worst_ms(&self) -> f64 {
        self.paths
            .iter()
            .map(BudgetPath::worst_ms)
            .fold(f64::INFINITY, f64::min)
    }

    /// The path with the smallest worst case.
    pub fn winning_path(&self) -> Option<&BudgetPath> {
        self.paths
            .iter()
            .min_by(|a, b| a.worst_ms().total_cmp(&b.worst_ms()))
    }

    /// The setting behind the largest term of the winning path.
    pub fn dominant(&self) -> Option<&Setting> {
        self.winning_path().and_then(|p| dominant(p.terms.iter()))
    }

    /// Worst-case time after the commit on the winning path, in ms.
    pub fn post_commit_worst_ms(&self) -> f64 {
        self.winning_path()
            .map_or(0.0, BudgetPath::post_commit_worst_ms)
    }

    fn post_commit_dominant(&self) -> Option<&Setting> {
        self.winning_path()
            .and_then(|p| dominant(p.post_commit_terms()))
    }
}

/// The computed budget: one row per [`Case`] plus warnings about settings
/// that are legal but risky.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetReport {
    /// The cases, in the order of [`Case`].
    pub rows: Vec<BudgetRow>,
    /// The longest process pause of an agent that never gets its live node
    /// declared down (a false removal).
    pub pause: PauseTolerance,
    /// Risky combinations that do not break an SLO.
    pub warnings: Vec<String>,
}

/// How long an agent may stall (GC, CPU steal, a VM's live migration, a
/// SIGSTOP) before its live node is declared down. Removal needs both
/// signals (R4): the zone's gossip declaring it down, and the arbiter's
/// session with it silent for `lease.silence_ms`. A member that stops at
/// worst just as a peer probes it is suspected after one probe period and
/// declared down `suspect_to_down` later, unless its refutation, sent when
/// it resumes, reaches the suspecter first, which takes up to a gossip
/// round. Calibrated in the zone simulator (32 members, 120–240 pauses per
/// length): the earlier `lan` of 500/200/1500 ms (bound 1.8 s) had no false
/// down at 1 s and 34 % at 2 s; today's `lan` of 350/150/1200 ms (bound
/// 1.35 s) none at 1.0, 1.2 and 1.5 s; 500/2000 ms settings (2.3 s) none at
/// 2.3 s and 26 % at 2.6 s; `tolerant` (2.4 s) none at 2.0, 2.3 and 2.5 s.
#[derive(Debug, Clone, PartialEq)]
pub struct PauseTolerance {
    /// The longest pause tolerated, ms: the smaller of the gossip and the
    /// arbiter-silence bounds.
    pub tolerated_ms: f64,
    /// probe_period + suspect_to_down − periodic_gossip, ms.
    pub gossip_ms: f64,
    /// lease.silence_ms − agent.keepalive_ms / 2: a pause shorter than this
    /// never looks silent to the arbiter, ms.
    pub silence_ms: f64,
    /// The preset's name (or "custom" when a setting overrides it).
    pub preset: String,
    /// Whether gossip runs (`agent.gossip.key_file` set). Without it only
    /// the node lease removes a paused agent's node, which a pause shorter
    /// than ttl − ttl/renewals (the lease left after the last renewal at
    /// worst) never lets expire: that is then `tolerated_ms`.
    pub gossip_on: bool,
}

impl fmt::Display for PauseTolerance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.gossip_on {
            return write!(
                f,
                "process pauses tolerated: up to {} (gossip is off, no agent.gossip.key_file: only the node lease can remove a paused agent's node, and a pause shorter than ttl − ttl/{RENEWALS_PER_TTL} never lets it expire)",
                seconds(self.tolerated_ms),
            );
        }
        write!(
            f,
            "process pauses tolerated: up to {} (gossip preset {}: probe period + suspect_to_down − 1 gossip round = {}; both signals must agree, and the arbiter's silence needs {}); a longer pause of an agent can get its live node declared down",
            seconds(self.tolerated_ms),
            self.preset,
            seconds(self.gossip_ms),
            seconds(self.silence_ms),
        )
    }
}

impl BudgetReport {
    /// The row of `case`.
    pub fn row(&self, case: Case) -> Option<&BudgetRow> {
        self.rows.iter().find(|r| r.case == case)
    }

    /// One message per SLO a worst case exceeds, naming the setting that
    /// dominates it and what to do. Empty when the settings fit the SLOs.
    pub fn violations(&self) -> Vec<String> {
        let mut messages = Vec::new();
        for row in &self.rows {
            if let Some(slo) = row.slo_ms {
                let worst = row.worst_ms();
                if worst > slo {
                    messages.push(format!(
                        "{}: worst case {} s exceeds the {} s SLO{}",
                        row.name(),
                        short_seconds(worst),
                        short_seconds(slo),
                        blame(row.dominant())
                    ));
                }
            }
            if let Some(slo) = row.post_commit_slo_ms {
                let worst = row.post_commit_worst_ms();
                if worst > slo {
                    messages.push(format!(
                        "{}: after the commit, worst case {} s exceeds the {} s leave SLO{}",
                        row.name(),
                        short_seconds(worst),
                        short_seconds(slo),
                        blame(row.post_commit_dominant())
                    ));
                }
            }
        }
        messages
    }
}

fn blame(setting: Option<&Setting>) -> String {
    setting.map_or_else(String::new, |s| {
        format!("; dominated by {s} — {}", s.advice)
    })
}

/// Seconds with up to two decimals and no trailing zeros: `15`, `17.6`.
fn short_seconds(ms: f64) -> String {
    let text = format!("{:.2}", ms / 1000.0);
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// Seconds with two decimals, for the table.
fn seconds(ms: f64) -> String {
    format!("{:.2} s", ms / 1000.0)
}

/// The calculator. Formulas, with I, T, F, J the readiness check's
/// interval, timeout, failure threshold and jitter:
///
/// - Commit: C = `commit_ms`, worst Cw = `commit_worst_ms`.
/// - Propagation after a commit: P = network + apply + fan-out, with
///   fan-out = (followers − 1) · `fanout_us` (the last follower's send); a
///   lone change is not held by the coalescing window. Worst Pw = coalesce
///   window (a change queued behind a send in flight) + worst network +
///   apply + fan-out + DNS TTL (a DNS caller may hold the old answer for
///   the whole TTL).
/// - (a) readiness failure: (F − ½)·I·(1 + J/2) + T, worst F·I·(1 + J) + T
///   (a frozen app fails by timeout; the first failed probe lands on average
///   half an interval after the freeze), then + C + P. Held to 15 s, and its
///   post-commit part to 3 s.
/// - (b) process crash, probe only: as (a) without T (connect refused is
///   immediate). 15 s.
/// - (b′) process crash with a session held: 0 + C + P. 15 s.
/// - (c) silent node crash, the faster of two paths (per statistic):
///   gossip = max(SWIM, arbiter silence) + network + C + P, with SWIM =
///   first probe (e/(e−1) periods expected, ln(100) at p99) + 1 period for
///   the probe to fail + `suspect_to_down_ms`, and silence = `silence_ms`
///   (expected minus half a keep-alive); lease = ttl − U[0, ttl/3] (expected
///   ttl − ttl/6, worst ttl) + sweep (half expected) + C + P. 15 s.
/// - (d) deliberate leave: P. 3 s.
///
/// Every expected/worst pair is summed term by term; the max in (c) is
/// written as the silence beyond the SWIM verdict, so it stays a sum.
#[derive(Debug, Clone, Copy)]
pub struct Budget;

impl Budget {
    /// Computes every row and the warnings for this pair of configs.
    pub fn compute(agent: &AgentConfig, arbiter: &ArbiterConfig) -> BudgetReport {
        let inputs = Inputs { agent, arbiter };
        let rows = vec![
            inputs.readiness_failure(),
            inputs.process_crash_probe(),
            inputs.process_crash_session(),
            inputs.silent_node_crash(),
            inputs.leave(),
        ];
        let mut warnings = Vec::new();
        let silence = arbiter.lease.silence_ms;
        if silence < MIN_KEEPALIVES_PER_SILENCE * agent.keepalive_ms {
            warnings.push(format!(
                "arbiter.lease.silence_ms = {silence} is below {MIN_KEEPALIVES_PER_SILENCE} × \
                 agent.keepalive_ms = {}: one late keep-alive can let the arbiter accept a gossip \
                 down verdict about a live node; raise silence_ms or lower keepalive_ms",
                agent.keepalive_ms
            ));
        }
        BudgetReport {
            rows,
            pause: inputs.pause_tolerance(),
            warnings,
        }
    }
}

/// Both configs, with one method per term group and per row.
struct Inputs<'a> {
    agent: &'a AgentConfig,
    arbiter: &'a ArbiterConfig,
}

/// A duration setting in ms as a float for the arithmetic.
fn ms(value: u64) -> f64 {
    value as f64
}

impl Inputs<'_> {
    fn single(&self, case: Case, slo_ms: f64, terms: Vec<Term>) -> BudgetRow {
        BudgetRow {
            case,
            slo_ms: Some(slo_ms),
            post_commit_slo_ms: None,
            paths: vec![BudgetPath {
                name: case.name().to_owned(),
                terms,
            }],
        }
    }

    fn commit(&self) -> Term {
        let b = &self.agent.budget;
        Term::new(
            "arbiter commit incl. fsync",
            Phase::Commit,
            ms(b.commit_ms),
            ms(b.commit_worst_ms),
            Some(Setting::new(
                "agent.budget.commit_worst_ms",
                b.commit_worst_ms,
                "an estimate: measure the arbiter's commit latency and correct it, or give the Raft log a faster disk",
            )),
        )
    }

    /// From the commit until the last agent (and DNS caller) stops selecting it.
    fn propagation(&self) -> Vec<Term> {
        let b = &self.agent.budget;
        let window = self.arbiter.distribution.coalesce_window_ms;
        let ttl_ms = 1000.0 * f64::from(self.agent.dns_ttl_s);
        let fanout = f64::from(b.followers.saturating_sub(1)) * b.fanout_us as f64 / 1000.0;
        vec![
            // A change on an idle stream goes at once; one that arrives
            // while a send is in flight waits for the window to pass since
            // the first change queued behind it.
            Term::new(
                "coalescing window: 0 on an idle stream | 1 window behind a send",
                Phase::Propagation,
                0.0,
                ms(window),
                Some(Setting::new(
                    "arbiter.distribution.coalesce_window_ms",
                    window,
                    "lower it",
                )),
            ),
            Term::new(
                "delta to the agent: network",
                Phase::Propagation,
                ms(b.network_ms),
                ms(b.network_worst_ms),
                Some(Setting::new(
                    "agent.budget.network_worst_ms",
                    b.network_worst_ms,
                    "an estimate: measure the agent–arbiter latency and correct it",
                )),
            ),
            Term::new(
                "agent applies the delta",
                Phase::Propagation,
                ms(b.apply_ms),
                ms(b.apply_ms),
                Some(Setting::new(
                    "agent.budget.apply_ms",
                    b.apply_ms,
                    "an estimate: measure how long the agent takes to apply a delta",
                )),
            ),
            Term::new(
                "fan-out: the last follower's send, (followers − 1) × fanout_us",
                Phase::Propagation,
                fanout,
                fanout,
                Some(Setting::new(
                    "agent.budget.fanout_us",
                    b.fanout_us,
                    format!(
                        "an estimate for {} followers: measure the spread between the first and the last agent's view",
                        b.followers
                    ),
                )),
            ),
            Term::new(
                "DNS callers hold the answer up to the TTL: 0 | TTL",
                Phase::Propagation,
                0.0,
                ttl_ms,
                Some(Setting::new(
                    "agent.dns_ttl_s",
                    self.agent.dns_ttl_s,
                    "lower it: DNS callers keep a removed endpoint for up to the TTL",
                )),
            ),
        ]
    }

    /// F failed readiness probes in a row, and (for a frozen app) the last
    /// one's timeout.
    fn readiness_probes(&self, frozen: bool) -> Vec<Term> {
        let c = &self.agent.checks.readiness;
        let (i, t, f, j) = (
            ms(c.interval_ms),
            ms(c.timeout_ms),
            f64::from(c.failure_threshold),
            c.jitter,
        );
        let mut terms = vec![Term::new(
            "F failed probes: (F − ½)·I·(1 + J/2) | F·I·(1 + J)",
            Phase::Detection,
            (f - 0.5) * i * (1.0 + j / 2.0),
            f * i * (1.0 + j),
            Some(Setting::new(
                "agent.checks.readiness.interval_ms",
                c.interval_ms,
                format!(
                    "lower it or agent.checks.readiness.failure_threshold = {}",
                    c.failure_threshold
                ),
            )),
        )];
        if frozen {
            terms.push(Term::new(
                "the last probe times out: T",
                Phase::Detection,
                t,
                t,
                Some(Setting::new(
                    "agent.checks.readiness.timeout_ms",
                    c.timeout_ms,
                    "lower it: a frozen app is detected only when its probes time out",
                )),
            ));
        }
        terms
    }

    /// Detection terms, then commit and propagation.
    fn decided(&self, mut detection: Vec<Term>) -> Vec<Term> {
        detection.push(self.commit());
        detection.extend(self.propagation());
        detection
    }

    fn readiness_failure(&self) -> BudgetRow {
        BudgetRow {
            post_commit_slo_ms: Some(LEAVE_SLO_MS),
            ..self.single(
                Case::ReadinessFailure,
                HARD_FAILURE_SLO_MS,
                self.decided(self.readiness_probes(true)),
            )
        }
    }

    fn process_crash_probe(&self) -> BudgetRow {
        self.single(
            Case::ProcessCrashProbe,
            HARD_FAILURE_SLO_MS,
            self.decided(self.readiness_probes(false)),
        )
    }

    fn process_crash_session(&self) -> BudgetRow {
        let close = Term::new(
            "the agent sees the session close at once",
            Phase::Detection,
            0.0,
            0.0,
            None,
        );
        self.single(
            Case::ProcessCrashSession,
            HARD_FAILURE_SLO_MS,
            self.decided(vec![close]),
        )
    }

    fn silent_node_crash(&self) -> BudgetRow {
        BudgetRow {
            case: Case::SilentNodeCrash,
            slo_ms: Some(HARD_FAILURE_SLO_MS),
            post_commit_slo_ms: None,
            // Gossip runs only with a zone key: without one the lease is
            // the only path.
            paths: if self.gossip_on() {
                vec![self.gossip_path(), self.lease_path()]
            } else {
                vec![self.lease_path()]
            },
        }
    }

    /// Whether the agent runs zone gossip: only with `gossip.key_file`.
    fn gossip_on(&self) -> bool {
        self.agent.gossip.key_file.is_some()
    }

    /// SWIM declares the node down; the arbiter accepts once its own session
    /// has been silent for `silence_ms` too.
    fn gossip_path(&self) -> BudgetPath {
        let gossip = &self.agent.gossip;
        let swim = gossip.effective();
        let period = ms(swim.probe_period_ms);
        let suspect = ms(swim.suspect_to_down_ms);
        let period_setting = Setting::new(
            "agent.gossip.probe_period_ms",
            gossip.shown(gossip.probe_period_ms, swim.probe_period_ms),
            "lower it or choose a faster preset",
        );
        let first_probe = Term::new(
            "SWIM first probe: ln 2 | ln 100 periods (p50 | p99)",
            Phase::Detection,
            SWIM_EXPECTED_FIRST_PROBE_PERIODS * period,
            SWIM_P99_FIRST_PROBE_PERIODS * period,
            Some(period_setting.clone()),
        );
        let probe_fails = Term::new(
            "the probe fails at the end of its period: 1 period",
            Phase::Detection,
            period,
            period,
            Some(period_setting),
        );
        let suspicion = Term::new(
            "suspicion until down: suspect_to_down",
            Phase::Detection,
            suspect,
            suspect,
            Some(Setting::new(
                "agent.gossip.suspect_to_down_ms",
                gossip.shown(gossip.suspect_to_down_ms, swim.suspect_to_down_ms),
                "lower it or choose a faster preset",
            )),
        );
        let swim_expected = first_probe.expected_ms + probe_fails.expected_ms + suspect;
        let swim_worst = first_probe.worst_ms + probe_fails.worst_ms + suspect;
        let silence = self.arbiter.lease.silence_ms;
        let silence_expected = (ms(silence) - ms(self.agent.keepalive_ms) / 2.0).max(0.0);
        let silence_wait = Term::new(
            "arbiter session silence beyond SWIM: max(0, silence − SWIM)",
            Phase::Detection,
            (silence_expected - swim_expected).max(0.0),
            (ms(silence) - swim_worst).max(0.0),
            Some(Setting::new(
                "arbiter.lease.silence_ms",
                silence,
                format!(
                    "lower it, keeping it at least {MIN_KEEPALIVES_PER_SILENCE} × agent.keepalive_ms"
                ),
            )),
        );
        let b = &self.agent.budget;
        let report = Term::new(
            "down report to the arbiter: network",
            Phase::Detection,
            ms(b.network_ms),
            ms(b.network_worst_ms),
            Some(Setting::new(
                "agent.budget.network_worst_ms",
                b.network_worst_ms,
                "an estimate: measure the agent–arbiter latency and correct it",
            )),
        );
        BudgetPath {
            name: "gossip path: SWIM down verdict and arbiter silence".to_owned(),
            terms: self.decided(vec![
                first_probe,
                probe_fails,
                suspicion,
                silence_wait,
                report,
            ]),
        }
    }

    /// See [`PauseTolerance`].
    fn pause_tolerance(&self) -> PauseTolerance {
        let gossip = &self.agent.gossip;
        let swim = gossip.effective();
        let gossip_ms =
            ms(swim.probe_period_ms) + ms(swim.suspect_to_down_ms) - ms(swim.periodic_gossip_ms);
        let silence_ms =
            (ms(self.arbiter.lease.silence_ms) - ms(self.agent.keepalive_ms) / 2.0).max(0.0);
        let preset = if swim == gossip.preset.settings() {
            gossip.preset.name().to_owned()
        } else {
            format!("{} with overrides", gossip.preset.name())
        };
        let ttl = ms(self.arbiter.lease.ttl_ms);
        PauseTolerance {
            tolerated_ms: if self.gossip_on() {
                gossip_ms.max(silence_ms)
            } else {
                ttl - ttl / ms(RENEWALS_PER_TTL)
            },
            gossip_ms,
            silence_ms,
            preset,
            gossip_on: self.gossip_on(),
        }
    }

    /// The node lease expires. The mass-expiry guard may hold this path
    /// when many nodes of one zone expire together.
    fn lease_path(&self) -> BudgetPath {
        let lease = &self.arbiter.lease;
        let ttl = ms(lease.ttl_ms);
        let renewals = ms(RENEWALS_PER_TTL);
        let expiry = Term::new(
            format!("expiry after the last renewal: ttl − U[0, ttl/{RENEWALS_PER_TTL}]"),
            Phase::Detection,
            ttl - ttl / (2.0 * renewals),
            ttl,
            Some(Setting::new(
                "arbiter.lease.ttl_ms",
                lease.ttl_ms,
                format!("lower it (the agent renews every ttl/{RENEWALS_PER_TTL})"),
            )),
        );
        let sweep = Term::new(
            "leader's deadline sweep: ½ | 1 interval",
            Phase::Detection,
            ms(lease.sweep_interval_ms) / 2.0,
            ms(lease.sweep_interval_ms),
            Some(Setting::new(
                "arbiter.lease.sweep_interval_ms",
                lease.sweep_interval_ms,
                "lower it",
            )),
        );
        let wait = lease.witness_wait_ms;
        // Witnesses answer within about one connect attempt to a dead
        // endpoint (the agents' 500 ms timeout) plus a round trip; the
        // leader decides at its next sweep.
        let answered = ms(WITNESS_CONNECT_MS + 2 * self.agent.budget.network_ms).min(ms(wait))
            + ms(lease.sweep_interval_ms) / 2.0;
        let witnesses = Term::new(
            "witnesses answer (node gone): ~½ s | witness_wait + 1 sweep",
            Phase::Detection,
            if wait == 0 { 0.0 } else { answered },
            if wait == 0 {
                0.0
            } else {
                ms(wait) + ms(lease.sweep_interval_ms)
            },
            Some(Setting::new(
                "arbiter.lease.witness_wait_ms",
                wait,
                "lower it (0 turns witnesses off: an arbiter cut off from a live node then expires it)",
            )),
        );
        BudgetPath {
            name: "lease path (witnesses; the mass-expiry guard may hold it)".to_owned(),
            terms: self.decided(vec![expiry, sweep, witnesses]),
        }
    }

    fn leave(&self) -> BudgetRow {
        self.single(Case::Leave, LEAVE_SLO_MS, self.propagation())
    }
}

impl fmt::Display for BudgetReport {
    /// An aligned table: one line per case, its terms indented below it
    /// (grouped by path where a case has several).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut lines: Vec<[String; 5]> = vec![[
            "case".to_owned(),
            "expected".to_owned(),
            "worst (p99 for gossip)".to_owned(),
            "SLO".to_owned(),
            "dominated by".to_owned(),
        ]];
        for (n, row) in self.rows.iter().enumerate() {
            if n > 0 {
                lines.push(Default::default());
            }
            lines.push([
                row.name().to_owned(),
                seconds(row.expected_ms()),
                seconds(row.worst_ms()),
                row.slo_ms.map_or_else(|| "-".to_owned(), seconds),
                row.dominant().map_or_else(String::new, ToString::to_string),
            ]);
            let nested = row.paths.len() > 1;
            for path in &row.paths {
                if nested {
                    lines.push([
                        format!("  {}", path.name),
                        seconds(path.expected_ms()),
                        seconds(path.worst_ms()),
                        String::new(),
                        String::new(),
                    ]);
                }
                let indent = if nested { "      " } else { "    " };
                for term in &path.terms {
                    lines.push([
                        format!("{indent}{}", term.name),
                        seconds(term.expected_ms),
                        seconds(term.worst_ms),
                        String::new(),
                        term.setting
                            .as_ref()
                            .map_or_else(String::new, ToString::to_string),
                    ]);
                }
            }
        }
        let mut widths = [0; 5];
        for line in &lines {
            for (width, cell) in widths.iter_mut().zip(line) {
                *width = (*width).max(cell.chars().count());
            }
        }
        for (n, line) in lines.iter().enumerate() {
            let text = format!(
                "{:<w0$}  {:>w1$}  {:>w2$}  {:>w3$}  {}",
                line[0],
                line[1],
                line[2],
                line[3],
                line[4],
                w0 = widths[0],
                w1 = widths[1],
                w2 = widths[2],
                w3 = widths[3],
            );
            writeln!(f, "{}", text.trim_end())?;
            if n == 0 {
                writeln!(f, "{}", "-".repeat(text.trim_end().chars().count()))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CheckTiming;

    const EPSILON_MS: f64 = 1e-9;

    /// An agent with a zone key: gossip runs.
    fn gossiping() -> AgentConfig {
        let mut agent = AgentConfig::default();
        agent.gossip.key_file = Some("zone.key".into());
        agent
    }

    /// Issue 37, item 4: without `gossip.key_file` gossip does not run, so
    /// a silent node crash has the lease path alone, and a pause is
    /// tolerated until the lease can expire.
    #[test]
    fn without_a_zone_key_the_lease_is_the_only_path() {
        let arbiter = ArbiterConfig::default();
        let off = Budget::compute(&AgentConfig::default(), &arbiter);
        let on = Budget::compute(&gossiping(), &arbiter);
        let node = row(&off, Case::SilentNodeCrash);
        assert_eq!(node.paths.len(), 1);
        assert_eq!(node.paths[0], row(&on, Case::SilentNodeCrash).paths[1]);
        assert_ms(
            node.worst_ms(),
            on.row(Case::SilentNodeCrash).unwrap().paths[1].worst_ms(),
            "lease",
        );
        assert_eq!(
            node.dominant().map(|s| s.path.as_str()),
            Some("arbiter.lease.ttl_ms")
        );
        let ttl = arbiter.lease.ttl_ms as f64;
        assert_ms(
            off.pause.tolerated_ms,
            ttl - ttl / 3.0,
            "pause without gossip",
        );
        assert!(
            off.pause.to_string().contains("gossip is off"),
            "{}",
            off.pause
        );
        assert!(!off.to_string().contains("gossip path"), "{off}");
    }

    fn row(report: &BudgetReport, case: Case) -> &BudgetRow {
        report.row(case).expect("every case has a row")
    }

    fn assert_ms(actual: f64, expected: f64, what: &str) {
        assert!(
            (actual - expected).abs() < EPSILON_MS,
            "{what}: {actual} ms, expected {expected} ms"
        );
    }

    #[test]
    fn the_pause_a_preset_tolerates_is_named() {
        let report = Budget::compute(&gossiping(), &ArbiterConfig::default());
        // lan: 350 + 1200 − 200 ms of gossip; the arbiter's own silence
        // (2000 − 250) is the later signal.
        assert_ms(report.pause.gossip_ms, 1_350.0, "lan gossip");
        assert_ms(report.pause.tolerated_ms, 1_750.0, "lan");
        assert_eq!(report.pause.preset, "lan");
        let mut agent = gossiping();
        agent.gossip.preset = crate::GossipPreset::Tolerant;
        let report = Budget::compute(&agent, &ArbiterConfig::default());
        assert_ms(report.pause.tolerated_ms, 2_400.0, "tolerant");
        assert!(
            report
                .pause
                .to_string()
                .starts_with("process pauses tolerated: up to 2.40 s (gossip preset tolerant"),
            "{}",
            report.pause
        );
        agent.gossip.suspect_to_down_ms = Some(5_000);
        let report = Budget::compute(&agent, &ArbiterConfig::default());
        assert_eq!(report.pause.preset, "tolerant with overrides");
    }

    #[test]
    fn defaults_meet_every_slo_without_warnings() {
        let report = Budget::compute(&AgentConfig::default(), &ArbiterConfig::default());
        assert_eq!(report.violations(), Vec::<String>::new());
        assert_eq!(report.warnings, Vec::<String>::new());
    }

    /// Every row recomputed here from the settings with the documented
    /// formulas, independently of the calculator's term lists.
    #[test]
    fn default_rows_follow_the_formulas() {
        let mut agent = gossiping();
        // A fan-out that is not zero, so its term is checked too.
        agent.budget.followers = 32;
        agent.budget.fanout_us = 400;
        let arbiter = ArbiterConfig::default();
        let report = Budget::compute(&agent, &arbiter);

        let r = agent.checks.readiness;
        let (i, t, f, j) = (
            r.interval_ms as f64,
            r.timeout_ms as f64,
            f64::from(r.failure_threshold),
            r.jitter,
        );
        let b = &agent.budget;
        let (c, cw) = (b.commit_ms as f64, b.commit_worst_ms as f64);
        let window = arbiter.distribution.coalesce_window_ms as f64;
        let fanout = f64::from(b.followers - 1) * b.fanout_us as f64 / 1000.0;
        let p = b.network_ms as f64 + b.apply_ms as f64 + fanout;
        let pw = window
            + b.network_worst_ms as f64
            + b.apply_ms as f64
            + fanout
            + f64::from(agent.dns_ttl_s) * 1000.0;

        let probes = (f - 0.5) * i * (1.0 + j / 2.0);
        let probes_w = f * i * (1.0 + j);
        let a = row(&report, Case::ReadinessFailure);
        assert_ms(a.expected_ms(), probes + t + c + p, "(a) expected");
        assert_ms(a.worst_ms(), probes_w + t + cw + pw, "(a) worst");
        assert_ms(a.post_commit_worst_ms(), pw, "(a) after commit");

        let crash = row(&report, Case::ProcessCrashProbe);
        assert_ms(crash.expected_ms(), probes + c + p, "(b) expected");
        assert_ms(crash.worst_ms(), probes_w + cw + pw, "(b) worst");

        let session = row(&report, Case::ProcessCrashSession);
        assert_ms(session.expected_ms(), c + p, "(b′) expected");
        assert_ms(session.worst_ms(), cw + pw, "(b′) worst");

        let swim = agent.gossip.effective();
        let period = swim.probe_period_ms as f64;
        let suspect = swim.suspect_to_down_ms as f64;
        let silence = arbiter.lease.silence_ms as f64;
        let keepalive = agent.keepalive_ms as f64;
        let swim_e = period * std::f64::consts::LN_2 + period + suspect;
        let swim_w = period * 100f64.ln() + period + suspect;
        let gossip_e = swim_e.max(silence - keepalive / 2.0) + b.network_ms as f64 + c + p;
        let gossip_w = swim_w.max(silence) + b.network_worst_ms as f64 + cw + pw;
        let ttl = arbiter.lease.ttl_ms as f64;
        let sweep = arbiter.lease.sweep_interval_ms as f64;
        // Witnesses: one connect timeout and a round trip (capped at the
        // wait) and half a sweep | the wait and a sweep.
        let wait = arbiter.lease.witness_wait_ms as f64;
        let witnesses_e =
            (WITNESS_CONNECT_MS as f64 + 2.0 * b.network_ms as f64).min(wait) + sweep / 2.0;
        let witnesses_w = wait + sweep;
        let lease_e = ttl - ttl / 6.0 + sweep / 2.0 + witnesses_e + c + p;
        let lease_w = ttl + sweep + witnesses_w + cw + pw;
        let node = row(&report, Case::SilentNodeCrash);
        assert_ms(node.paths[0].expected_ms(), gossip_e, "(c) gossip expected");
        assert_ms(node.paths[0].worst_ms(), gossip_w, "(c) gossip worst");
        assert_ms(node.paths[1].expected_ms(), lease_e, "(c) lease expected");
        assert_ms(node.paths[1].worst_ms(), lease_w, "(c) lease worst");
        assert_ms(node.expected_ms(), gossip_e.min(lease_e), "(c) expected");
        assert_ms(node.worst_ms(), gossip_w.min(lease_w), "(c) worst");

        let leave = row(&report, Case::Leave);
        assert_ms(leave.expected_ms(), p, "(d) expected");
        assert_ms(leave.worst_ms(), pw, "(d) worst");
    }

    #[test]
    fn slow_gossip_and_long_lease_break_the_silent_crash_slo() {
        let mut agent = gossiping();
        agent.gossip.suspect_to_down_ms = Some(12_000);
        let mut arbiter = ArbiterConfig::default();
        arbiter.lease.ttl_ms = 30_000;
        let violations = Budget::compute(&agent, &arbiter).violations();
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(
            violations[0].starts_with("silent node crash: worst case "),
            "{}",
            violations[0]
        );
        assert!(
            violations[0]
                .contains("15 s SLO; dominated by agent.gossip.suspect_to_down_ms = 12000"),
            "{}",
            violations[0]
        );
    }

    #[test]
    fn long_silence_dominates_the_gossip_path() {
        let mut arbiter = ArbiterConfig::default();
        arbiter.lease.silence_ms = 9_000;
        let report = Budget::compute(&gossiping(), &arbiter);
        let node = row(&report, Case::SilentNodeCrash);
        let dominant = node.dominant().expect("a setting dominates");
        assert_eq!(dominant.path, "arbiter.lease.silence_ms");
    }

    #[test]
    fn slow_readiness_probes_break_the_hard_failure_slo() {
        let mut agent = AgentConfig::default();
        agent.checks.readiness = CheckTiming {
            interval_ms: 5_000,
            failure_threshold: 3,
            ..CheckTiming::READINESS
        };
        let violations = Budget::compute(&agent, &ArbiterConfig::default()).violations();
        for case in [Case::ReadinessFailure, Case::ProcessCrashProbe] {
            let message = violations
                .iter()
                .find(|v| v.starts_with(case.name()))
                .unwrap_or_else(|| panic!("no violation for {}: {violations:?}", case.name()));
            assert!(
                message.contains("dominated by agent.checks.readiness.interval_ms = 5000"),
                "{message}"
            );
        }
    }

    #[test]
    fn wide_coalescing_and_dns_ttl_break_the_leave_slo() {
        let agent = AgentConfig {
            dns_ttl_s: 3,
            ..AgentConfig::default()
        };
        let mut arbiter = ArbiterConfig::default();
        arbiter.distribution.coalesce_window_ms = 250;
        let violations = Budget::compute(&agent, &arbiter).violations();
        let leave = violations
            .iter()
            .find(|v| v.starts_with(Case::Leave.name()))
            .expect("leave violates");
        assert!(
            leave.contains("3 s SLO; dominated by agent.dns_ttl_s = 3"),
            "{leave}"
        );
        let after_commit = violations
            .iter()
            .find(|v| v.starts_with(Case::ReadinessFailure.name()))
            .expect("readiness failure's post-commit part violates");
        assert!(after_commit.contains("after the commit"), "{after_commit}");
        assert!(
            after_commit.contains("agent.dns_ttl_s = 3"),
            "{after_commit}"
        );
    }

    /// Raising any duration, threshold or jitter never lowers a row's
    /// expected or worst time.
    #[test]
    fn raising_a_setting_never_lowers_a_row() {
        type Knob = fn(&mut AgentConfig, &mut ArbiterConfig);
        let knobs: [(&str, Knob); 14] = [
            ("readiness interval", |a, _| {
                a.checks.readiness.interval_ms += 700
            }),
            ("readiness timeout", |a, _| {
                a.checks.readiness.timeout_ms += 300
            }),
            ("readiness failures", |a, _| {
                a.checks.readiness.failure_threshold += 1
            }),
            ("readiness jitter", |a, _| a.checks.readiness.jitter += 0.05),
            ("probe period", |a, _| {
                let s = a.gossip.effective();
                a.gossip.probe_period_ms = Some(s.probe_period_ms + 400);
            }),
            ("suspect to down", |a, _| {
                let s = a.gossip.effective();
                a.gossip.suspect_to_down_ms = Some(s.suspect_to_down_ms + 900);
            }),
            ("keepalive", |a, _| a.keepalive_ms += 100),
            ("dns ttl", |a, _| a.dns_ttl_s += 1),
            ("commit worst", |a, _| a.budget.commit_worst_ms += 40),
            ("network worst", |a, _| a.budget.network_worst_ms += 40),
            ("silence", |_, r| r.lease.silence_ms += 800),
            ("lease ttl", |_, r| r.lease.ttl_ms += 3_000),
            ("sweep", |_, r| r.lease.sweep_interval_ms += 200),
            ("coalesce window", |_, r| {
                r.distribution.coalesce_window_ms += 25
            }),
        ];
        for (name, raise) in knobs {
            let mut agent = gossiping();
            let mut arbiter = ArbiterConfig::default();
            let mut before = Budget::compute(&agent, &arbiter);
            for _ in 0..10 {
                raise(&mut agent, &mut arbiter);
                let after = Budget::compute(&agent, &arbiter);
                for (old, new) in before.rows.iter().zip(&after.rows) {
                    assert!(
                        new.worst_ms() >= old.worst_ms() && new.expected_ms() >= old.expected_ms(),
                        "raising {name} lowered {}",
                        old.name()
                    );
                }
                before = after;
            }
        }
    }

    #[test]
    fn short_silence_is_a_warning_not_a_violation() {
        let agent = AgentConfig {
            keepalive_ms: 1_500,
            ..AgentConfig::default()
        };
        let report = Budget::compute(&agent, &ArbiterConfig::default());
        assert_eq!(report.violations(), Vec::<String>::new());
        assert_eq!(report.warnings.len(), 1);
        assert!(
            report.warnings[0].contains("arbiter.lease.silence_ms = 2000")
                && report.warnings[0].contains("agent.keepalive_ms = 1500"),
            "{}",
            report.warnings[0]
        );
    }

    #[test]
    fn table_lists_every_case_and_both_node_crash_paths() {
        let report = Budget::compute(&gossiping(), &ArbiterConfig::default());
        let table = report.to_string();
        assert!(table.starts_with("case "), "{table}");
        assert!(table.contains("worst (p99 for gossip)"), "{table}");
        for row in &report.rows {
            assert!(table.contains(row.name()), "{table}");
        }
        assert!(table.contains("  gossip path"), "{table}");
        assert!(table.contains("  lease path"), "{table}");
    }

    #[test]
    fn estimates_worst_below_typical_is_rejected() {
        let estimates = BudgetEstimates {
            commit_worst_ms: 3,
            ..BudgetEstimates::default()
        };
        assert_eq!(
            estimates.validate("agent.budget").unwrap_err().to_string(),
            "agent.budget.commit_worst_ms = 3 must be at least 5"
        );
    }
}
