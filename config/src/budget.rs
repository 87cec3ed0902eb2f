//! The failure-detection budget (R5): from the agent's and the arbiter's
//! settings, how long each kind of failure or leave takes until no proxy
//! selects the endpoint, compared with the SLOs. Every number comes from a
//! config value or a named mathematical constant. This is arithmetic on
//! settings, not a measurement: it must not read clocks or run anything —
//! the chaos suite measures what the budget predicts.
//!
//! One file per part: `estimates` (the `[budget]` inputs no setting
//! gives), `terms` (cases, terms, paths and rows), `calculator` (the
//! formulas of every case but the silent node crash, and the warnings),
//! `node_crash` (the silent node crash's gossip and lease paths, and the
//! pauses tolerated) and `report` (violations and the table).

use std::f64::consts::LN_10;

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

/// Below this `agent.keepalive_ms` the budget warns: every PING is a
/// packet and an acknowledgement at the arbiter, per session (5,000
/// sessions at 500 ms are 10,000 packets a second), and nothing times
/// liveness by them any more (R4).
pub const QUIET_KEEPALIVE_MS: u64 = 2_000;

/// How long a witness agent's TCP connect to a silent node's endpoint may
/// take (the agent's constant), ms.
pub const WITNESS_CONNECT_MS: u64 = 500;

mod calculator;
mod estimates;
mod node_crash;
mod report;
mod terms;

pub use calculator::Budget;
pub use estimates::BudgetEstimates;
pub use report::{BudgetReport, PauseTolerance};
pub use terms::{BudgetPath, BudgetRow, Case, Phase, Setting, Term};

#[cfg(test)]
mod tests;
