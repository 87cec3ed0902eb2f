//! The calculator: [`Budget::compute`], the terms every case shares
//! (commit, propagation), the readiness probes, and the rows of every case
//! but the silent node crash (in `node_crash`).

use super::terms::{BudgetPath, BudgetRow, Case, Phase, Setting, Term};
use super::{BudgetReport, HARD_FAILURE_SLO_MS, LEAVE_SLO_MS, QUIET_KEEPALIVE_MS};
use crate::{AgentConfig, ArbiterConfig};

/// The calculator. Formulas, with I, T, F, J the readiness check's
/// interval, timeout, failure threshold and jitter:
///
/// - Commit: C = `commit_ms`, worst Cw = `commit_worst_ms`.
/// - Propagation after a commit: P = network + apply + fan-out, with
///   fan-out = (followers − 1) · `fanout_us` (the last follower's send); a
///   lone change is not held by the coalescing window. Worst Pw = coalesce
///   window (a change within a window of the last message) + worst network +
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
///   gossip = SWIM + network + the arbiter's probe + C + P, with SWIM =
///   first probe (e/(e−1) periods expected, ln(100) at p99) + 1 period for
///   the probe to fail + `suspect_to_down_ms`, and the arbiter's probe of
///   the node's session unanswered for `probe_timeout_ms` (decided at that
///   deadline), and at worst `witness_wait_ms` for a lone reporter's
///   witnesses; lease = ttl − U[0,
///   ttl/3] (expected ttl − ttl/6, worst ttl) + sweep (half expected) +
///   C + P. 15 s.
/// - (d) deliberate leave: P. 3 s.
/// - (e) deliberate leave at an agent whose replica died silently: its
///   next message, a renewal U[0, ttl/3] away (expected ttl/6, worst
///   ttl/3), then `arbiter_silence_ms` with nothing back, the reconnect
///   backoff U[0, `reconnect_min_ms`], the handshake and Welcome at the
///   next replica (two round trips and the lease grant's commit), then
///   the resumed delta, P. No SLO: shown so the cost of a replica's silent
///   death is visible.
///
/// Every expected/worst pair is summed term by term.
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
            inputs.leave_replica_lost(),
        ];
        let mut warnings = Vec::new();
        if agent.keepalive_ms < QUIET_KEEPALIVE_MS {
            warnings.push(format!(
                "agent.keepalive_ms = {} is below {QUIET_KEEPALIVE_MS}: every QUIC keep-alive \
                 is a packet and an acknowledgement at the arbiter per session (5,000 agents \
                 at this interval send {:.0} a second), and liveness is no longer timed by \
                 them (the arbiter probes a node's session when it needs to know); raise it",
                agent.keepalive_ms,
                5_000.0 * 1_000.0 / agent.keepalive_ms.max(1) as f64
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
pub(super) struct Inputs<'a> {
    pub(super) agent: &'a AgentConfig,
    pub(super) arbiter: &'a ArbiterConfig,
}

/// A duration setting in ms as a float for the arithmetic.
pub(super) fn ms(value: u64) -> f64 {
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
            // A change on a stream quiet for a window goes at once; one
            // within a window of the last message waits for its end.
            Term::new(
                "coalescing window: 0 on a quiet stream | 1 window after the last message",
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
    pub(super) fn decided(&self, mut detection: Vec<Term>) -> Vec<Term> {
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

    fn leave(&self) -> BudgetRow {
        self.single(Case::Leave, LEAVE_SLO_MS, self.propagation())
    }

    fn leave_replica_lost(&self) -> BudgetRow {
        let (a, b) = (self.agent, &self.agent.budget);
        let ttl = self.arbiter.lease.ttl_ms;
        let renew = ms(ttl) / ms(crate::RENEWALS_PER_TTL);
        let mut terms = vec![
            Term::new(
                "the agent's next message, a renewal: U[0, ttl/3]",
                Phase::Detection,
                renew / 2.0,
                renew,
                Some(Setting::new(
                    "arbiter.lease.ttl_ms",
                    ttl,
                    "lower it: renewals are what an agent sends on a quiet session",
                )),
            ),
            Term::new(
                "nothing back from the replica within the silence bound",
                Phase::Detection,
                ms(a.arbiter_silence_ms),
                ms(a.arbiter_silence_ms),
                Some(Setting::new(
                    "agent.arbiter_silence_ms",
                    a.arbiter_silence_ms,
                    "lower it, staying well above a loaded arbiter's acknowledgement delay",
                )),
            ),
            Term::new(
                "reconnect backoff: U[0, reconnect_min_ms]",
                Phase::Detection,
                ms(a.reconnect_min_ms) / 2.0,
                ms(a.reconnect_min_ms),
                Some(Setting::new(
                    "agent.reconnect_min_ms",
                    a.reconnect_min_ms,
                    "lower it",
                )),
            ),
            Term::new(
                "handshake and Welcome at the next replica: 2 round trips + the grant's commit",
                Phase::Detection,
                4.0 * ms(b.network_ms) + ms(b.commit_ms),
                4.0 * ms(b.network_worst_ms) + ms(b.commit_worst_ms),
                Some(Setting::new(
                    "agent.budget.network_worst_ms",
                    b.network_worst_ms,
                    "an estimate: measure the agent–arbiter latency and correct it",
                )),
            ),
        ];
        terms.extend(self.propagation());
        BudgetRow {
            slo_ms: None,
            ..self.single(Case::LeaveReplicaLost, LEAVE_SLO_MS, terms)
        }
    }
}
