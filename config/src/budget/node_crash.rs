//! The silent node crash (case (c)): its gossip path (SWIM's down verdict
//! and the arbiter's probe of the node's session going unanswered) and its
//! lease path (expiry, sweep, witnesses), and the longest process pause
//! that never gets a live node declared down.

use super::calculator::{ms, Inputs};
use super::terms::{BudgetPath, BudgetRow, Case, Phase, Setting, Term};
use super::{
    PauseTolerance, HARD_FAILURE_SLO_MS, SWIM_EXPECTED_FIRST_PROBE_PERIODS,
    SWIM_P99_FIRST_PROBE_PERIODS, WITNESS_CONNECT_MS,
};
use crate::RENEWALS_PER_TTL;

impl Inputs<'_> {
    pub(super) fn silent_node_crash(&self) -> BudgetRow {
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

    /// SWIM declares the node down; the arbiter accepts once its probe of
    /// the node's own session went unanswered for `probe_timeout_ms` too
    /// (R4), and, when one node alone reported it, once its witnesses had
    /// `witness_wait_ms` to object (R10; expected 0: a crash is reported by
    /// every gossip peer of the zone).
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
        let lease = &self.arbiter.lease;
        let probe_wait = Term::new(
            "arbiter probe of the node's session unanswered: probe_timeout",
            Phase::Detection,
            ms(lease.probe_timeout_ms),
            ms(lease.probe_timeout_ms),
            Some(Setting::new(
                "arbiter.lease.probe_timeout_ms",
                lease.probe_timeout_ms,
                "lower it, keeping it above the longest pause an agent process may take after gossip reports it",
            )),
        );
        let lone = Term::new(
            "a lone reporter's verdict waits for its witnesses: 0 (every peer reports) | witness_wait",
            Phase::Detection,
            0.0,
            ms(lease.witness_wait_ms),
            Some(Setting::new(
                "arbiter.lease.witness_wait_ms",
                lease.witness_wait_ms,
                "worst case only (one node left in the zone to report): lower it, keeping a connect's round trip to the witnesses",
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
            name: "gossip path: SWIM down verdict and an unanswered probe".to_owned(),
            terms: self.decided(vec![
                first_probe,
                probe_fails,
                suspicion,
                report,
                probe_wait,
                lone,
            ]),
        }
    }

    /// See [`PauseTolerance`].
    pub(super) fn pause_tolerance(&self) -> PauseTolerance {
        let gossip = &self.agent.gossip;
        let swim = gossip.effective();
        let gossip_ms =
            ms(swim.probe_period_ms) + ms(swim.suspect_to_down_ms) - ms(swim.periodic_gossip_ms);
        let probe_ms = ms(self.arbiter.lease.probe_timeout_ms);
        let preset = if swim == gossip.preset.settings() {
            gossip.preset.name().to_owned()
        } else {
            format!("{} with overrides", gossip.preset.name())
        };
        let ttl = ms(self.arbiter.lease.ttl_ms);
        PauseTolerance {
            tolerated_ms: if self.gossip_on() {
                gossip_ms + probe_ms
            } else {
                ttl - ttl / ms(RENEWALS_PER_TTL)
            },
            gossip_ms,
            probe_ms,
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
}
