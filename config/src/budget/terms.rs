//! What a budget is made of: the [`Case`]s, each a [`BudgetRow`] of one or
//! more [`BudgetPath`]s, each a sum of [`Term`]s that name the [`Setting`]
//! they grow with. Sums and the dominant setting only; no formulas.

use std::fmt;

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
    /// (e) A deliberate leave seen by an agent whose arbiter replica died
    /// silently: it notices at its next message plus
    /// `agent.arbiter_silence_ms`, reconnects and resumes. No SLO: the
    /// 3 s leave promise does not hold for these agents.
    LeaveReplicaLost,
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
            Self::LeaveReplicaLost => "leave, the agent's replica died silently",
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
    pub(super) fn new(
        path: impl Into<String>,
        value: impl fmt::Display,
        advice: impl Into<String>,
    ) -> Self {
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
    pub(super) fn new(
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

    pub(super) fn post_commit_dominant(&self) -> Option<&Setting> {
        self.winning_path()
            .and_then(|p| dominant(p.post_commit_terms()))
    }
}
