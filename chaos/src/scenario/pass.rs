//! `[pass]`: the bounds a run is judged by.

use serde::{Deserialize, Serialize};

/// `[pass]`: the bounds a run must stay within. Defaults are the R5 SLOs
/// and zero tolerance everywhere else. A judged figure needs samples: a
/// run with fewer leave or crash samples than `min_leave_samples` /
/// `min_crash_samples` (default 1 each), fewer checked writes than
/// `min_writes_checked`, no answered connection, or an audit log it could
/// not read fails, saying it measured nothing; a scenario declares a
/// figure not applicable by setting its minimum to 0.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Pass {
    /// Highest acceptable p99 of the leave time (commit of DRAINING or
    /// UNHEALTHY → last new connection to the instance), in ms. Default
    /// 3000, the leave SLO.
    pub leave_p99_ms: u64,
    /// Highest acceptable p99 of the hard-failure time (fault → last failed
    /// connection it caused), in ms. Default 15000, the hard-failure SLO.
    pub crash_p99_ms: u64,
    /// Most connections acceptable to a backend more than 3 s after its
    /// drain committed. Default 0.
    pub max_new_conns_to_drained: u64,
    /// Most failed connections acceptable during a control-plane outage,
    /// while every backend stays alive. Default 0.
    pub max_failed_conns_to_live_backends_in_outage: u64,
    /// Most instances acceptable that the control plane removed although
    /// they were alive. Default 0.
    pub max_false_removals: u64,
    /// Most view dips acceptable: an instance the scenario left alone that
    /// a live agent's view dropped and later offered again (a local
    /// exclusion the catalog never recorded); unset means not checked.
    pub max_view_dips: Option<u64>,
    /// The agents' `staleness.max_age_ms` when the run checks `degrade`
    /// (README, "Stale copies"): every live agent's resolve answer is
    /// sampled every 100 ms, and each must say it is degraded exactly when
    /// its copy is older than this; at least one must be, and none may be
    /// at the end. Unset means not checked.
    pub degraded_max_age_ms: Option<u64>,
    /// Most full snapshots the arbiter may serve at once (a reconnect
    /// storm's bound); unset means not checked.
    pub max_concurrent_snapshots: Option<u64>,
    /// Fewest full snapshots the arbiter must have served at once, and
    /// then have told at least one more agent to retry: a stampede that
    /// really reached its bound. Unset means not checked.
    pub min_concurrent_snapshots: Option<u64>,
    /// Most connections acceptable to an instance before it was first
    /// READY in the catalog (a deploy's new instances). Default 0.
    pub max_new_conns_to_not_ready: u64,
    /// Longest acceptable time from the last recovery step until every
    /// agent routes to the same set and keeps it, in ms; unset means not
    /// checked. Set, it also fails a run that never converges.
    pub max_converge_ms: Option<u64>,
    /// Most failed connections acceptable over the whole run; unset means
    /// not checked (faults that kill backends fail connections on purpose).
    pub max_failed_conns: Option<u64>,
    /// Fewest leave samples the run must have; 0 declares the leave figure
    /// not applicable. Default 1.
    pub min_leave_samples: u64,
    /// Fewest hard-failure samples the run must have; 0 declares the crash
    /// figure not applicable. Default 1.
    pub min_crash_samples: u64,
    /// Most lost writes acceptable (see `history`). Default 0.
    pub max_lost_writes: u64,
    /// Fewest writes (registrations, drains, deregistrations answered 200
    /// or 202) the history check must have checked. Default 1 (every run
    /// registers its instances).
    pub min_writes_checked: u64,
    /// Most failed connections acceptable to live backends during a leader
    /// election (the leader's death until the new leader's first commit);
    /// set, a run without a measured election window fails too. Unset:
    /// not judged.
    pub max_failed_conns_in_election: Option<u64>,
    /// `[[pass.routing]]`: which regions may answer the connections of a
    /// phase (multi-region scenarios). Default none.
    pub routing: Vec<Routing>,
    /// The writer epoch every region's arbiter must hold at the last
    /// `read_writers` step (a forced transfer won everywhere); unset: not
    /// judged. Set, a run without such a reading fails.
    pub writer_epoch: Option<u64>,
    /// Most attempts of a `rogue` step that may get through (answered
    /// otherwise than by the rule aimed at); unset: not judged. Set, the
    /// run also fails without a rogue step, when an attack was never made,
    /// when the rogue's identity committed a change to a record it does
    /// not own, or when its refusals were not counted
    /// (`rollcall_arbiter_refusals_total`) and audited (`rollcall::audit`).
    pub max_rogue_breaches: Option<u64>,
}

/// One `[[pass.routing]]` rule: where the connections opened in `phase`
/// may go, by the region of the backend that answered them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Routing {
    /// The phase judged (a `phase` step's target).
    pub phase: String,
    /// Regions whose backends may answer any connection of the phase;
    /// empty: none may be answered at all.
    pub answered_by: Vec<String>,
    /// Seconds from the phase's start during which the system may still be
    /// moving (a probe noticing a death, a summary arriving): connections
    /// opened later must be answered by `settled_by` only. Default 0.
    #[serde(default)]
    pub settle_s: f64,
    /// Regions that may answer once settled; default `answered_by`.
    #[serde(default)]
    pub settled_by: Option<Vec<String>>,
    /// Least share of the connections opened once settled that must be
    /// answered, in [0, 1]. Default 0.
    #[serde(default)]
    pub min_answered_share: f64,
    /// The failover refusal every resolve answer of r1's agents must carry
    /// once settled (`stale`, `no_policy`, …), when set; the run must have
    /// sampled at least one.
    #[serde(default)]
    pub refusal: Option<String>,
    /// The single-writer property seen from the callers: once a
    /// connection of the phase was answered by one region, none opened
    /// later is answered by another (writes never reach two regions
    /// back and forth). Default false.
    #[serde(default)]
    pub exclusive: bool,
}

impl Routing {
    /// The regions that may answer once settled.
    pub fn settled(&self) -> &[String] {
        self.settled_by.as_deref().unwrap_or(&self.answered_by)
    }
}

impl Default for Pass {
    fn default() -> Self {
        Self {
            leave_p99_ms: rollcall_config::LEAVE_SLO_MS as u64,
            crash_p99_ms: rollcall_config::HARD_FAILURE_SLO_MS as u64,
            max_new_conns_to_drained: 0,
            max_failed_conns_to_live_backends_in_outage: 0,
            max_false_removals: 0,
            max_view_dips: None,
            degraded_max_age_ms: None,
            max_concurrent_snapshots: None,
            min_concurrent_snapshots: None,
            max_new_conns_to_not_ready: 0,
            max_converge_ms: None,
            max_failed_conns: None,
            min_leave_samples: 1,
            min_crash_samples: 1,
            max_lost_writes: 0,
            min_writes_checked: 1,
            max_failed_conns_in_election: None,
            routing: Vec::new(),
            writer_epoch: None,
            max_rogue_breaches: None,
        }
    }
}
