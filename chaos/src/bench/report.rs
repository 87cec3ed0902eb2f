//! The fleet bench's figures, computed from what the workers recorded and
//! what the coordinator sampled, and how they are written: `report.json`
//! (every figure, the settings and the build), `report.md` (tables).
//!
//! A figure is computed only from samples that were taken; one without
//! samples is `null`, and the checks (`failures`) say so: a bench that
//! measured nothing fails.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::arbiters::{Watched, USER_HZ};
use super::plan::Plan;
use super::records::{Apply, Commit, Kind, Load, Records, Return};
use crate::report::Build;

mod markdown;
pub use markdown::{markdown, write};

/// A latency distribution, from microsecond samples: nearest-rank
/// percentiles, so every figure is a measured value; `null` without
/// samples.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Samples.
    pub count: u64,
    /// Median, ms.
    pub p50_ms: Option<f64>,
    /// 99th percentile, ms.
    pub p99_ms: Option<f64>,
    /// Largest, ms.
    pub max_ms: Option<f64>,
}

impl Latency {
    /// Summarizes microsecond samples (in any order).
    pub fn from_us(mut samples: Vec<u64>) -> Latency {
        samples.sort_unstable();
        let n = samples.len();
        let rank = |percent: usize| {
            let rank = (percent * n).div_ceil(100).max(1);
            samples.get(rank - 1).map(|&v| v as f64 / 1_000.0)
        };
        Latency {
            count: n as u64,
            p50_ms: rank(50),
            p99_ms: rank(99),
            max_ms: samples.last().map(|&v| v as f64 / 1_000.0),
        }
    }
}

/// A rate over the seconds of a phase.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Rate {
    /// Mean per second over the phase.
    pub mean: f64,
    /// Largest one-second count.
    pub max: f64,
}

/// One phase as it ran.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Span {
    /// `connect`, `register`, `follow`, `steady`, `deploy`, `cut`,
    /// `churn`, `heal`.
    pub name: String,
    /// When it started, wall µs.
    pub start_us: u64,
    /// When it ended, wall µs.
    pub end_us: u64,
    /// What was done of what was due (summed over the workers).
    pub done: u64,
    /// Due.
    pub total: u64,
    /// When the last worker saw its part done, wall µs.
    pub done_at_us: u64,
    /// Why it ended short, per worker that did.
    pub short: Vec<String>,
}

impl Span {
    /// Its length, s.
    pub fn seconds(&self) -> f64 {
        self.end_us.saturating_sub(self.start_us) as f64 / 1e6
    }
}

/// A process's CPU and memory over one phase.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// The process (`arbiter-1`, `worker-0`).
    pub name: String,
    /// CPU time over the phase's wall time, % of one core.
    pub cpu_percent: Option<f64>,
    /// Resident memory at the phase's end, MiB.
    pub rss_end_mib: Option<f64>,
    /// Largest resident memory seen in the phase, MiB.
    pub rss_max_mib: Option<f64>,
}

/// The arbiter's own counters at a moment (from its `/metrics`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ArbiterCounters {
    /// Changes committed since start.
    pub commits: Option<f64>,
    /// Agents connected.
    pub connected_agents: Option<f64>,
    /// Full snapshots sent since start.
    pub snapshots_sent: Option<f64>,
    /// Snapshot requests told to retry since start.
    pub snapshots_refused: Option<f64>,
    /// Most snapshots in flight at once since start.
    pub snapshots_in_flight_max: Option<f64>,
    /// Leases whose expiry the mass-expiry guard holds.
    pub held_leases: Option<f64>,
    /// Mean commit latency (propose → applied on the leader), ms.
    pub commit_mean_ms: Option<f64>,
    /// Mean commands per Raft entry (group commit size).
    pub batch_mean: Option<f64>,
    /// The arbiter's own count of the heap its sessions' state holds
    /// (sessions and their delivery state, not their subscriptions), bytes.
    pub session_state_bytes: Option<f64>,
    /// Its count of the heap its subscriptions hold (per agent and per
    /// service), bytes.
    pub subscription_state_bytes: Option<f64>,
    /// Datagrams the kernel dropped at the replica's QUIC socket since it
    /// was bound (its receive buffer was full); `None` when the replica
    /// runs on another machine.
    pub udp_drops: Option<f64>,
}

/// Setup: the fleet coming up, and what it costs the arbiter's memory.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Setup {
    /// Sessions held after `connect`.
    pub sessions: u64,
    /// Instances registered (committed) after `register`.
    pub endpoints: u64,
    /// Subscriptions holding a complete view after `follow`.
    pub subscriptions: u64,
    /// Seconds each setup phase took.
    pub connect_s: f64,
    /// See `connect_s`.
    pub register_s: f64,
    /// See `connect_s`.
    pub follow_s: f64,
    /// Registrations committed per second during `register`.
    pub register_commits_per_s: Option<f64>,
    /// The first replica's resident memory before any agent, MiB.
    pub rss_idle_mib: Option<f64>,
    /// Its growth per session (after `connect`), KiB.
    pub rss_per_session_kib: Option<f64>,
    /// Its growth per endpoint (after `register`), KiB.
    pub rss_per_endpoint_kib: Option<f64>,
    /// Its growth per subscription (after `follow`), KiB.
    pub rss_per_subscription_kib: Option<f64>,
    /// Of `rss_per_session_kib`: the session state the arbiter counts in
    /// its own tables (sessions and delivery state), KiB per session.
    pub session_state_per_session_kib: Option<f64>,
    /// Of `rss_per_session_kib`: the rest, which is the QUIC connection
    /// (its buffers and crypto state), the connection's actor and tasks,
    /// and allocator overhead, KiB per session.
    pub connection_per_session_kib: Option<f64>,
    /// Of `rss_per_subscription_kib`: the subscription state the arbiter
    /// counts in its own tables, KiB per subscription.
    pub subscription_state_per_subscription_kib: Option<f64>,
}

/// `steady`: keep-alives and renewals only.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Steady {
    /// Its length, s.
    pub seconds: f64,
    /// Every process's CPU and memory over it.
    pub usage: Vec<Usage>,
    /// Service updates that reached the agents meanwhile (expected:
    /// nothing but re-sends).
    pub deliveries_per_s: Rate,
}

/// `deploy`: endpoints replaced (register new → READY, drain old →
/// deregister) at the problem statement's pace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Deploy {
    /// Replacements due.
    pub replacements: u64,
    /// Replacements carried to the end (the old instance deregistered).
    pub replaced: u64,
    /// Over how long they were spread, s.
    pub window_s: f64,
    /// From the drain's answer to the deregistration, ms.
    pub drain_ms: u64,
    /// Write sent → Committed answer at the writing agent, every write.
    pub commit: Latency,
    /// The same, registrations only.
    pub commit_register: Latency,
    /// The same, drains only.
    pub commit_drain: Latency,
    /// The same, deregistrations only.
    pub commit_deregister: Latency,
    /// Committed answer → applied at each agent following the service,
    /// one sample per (change, follower); a follower that applied it
    /// before the writer heard the answer counts 0.
    pub applied: Latency,
    /// Leave: a drain's Committed answer → the last follower applied it,
    /// one sample per drain.
    pub leave: Latency,
    /// (change, follower) pairs that never applied the change.
    pub undelivered: u64,
    /// Changes committed per second during the window.
    pub commits_per_s: Rate,
    /// Service updates delivered per second, summed over the agents (a
    /// service's deltas in one message count one, as the fleet simulation
    /// counts deliveries).
    pub deliveries_per_s: Rate,
    /// Deltas (changed records) delivered per second.
    pub deltas_per_s: Rate,
    /// Update messages per second to the agents (a message carries the
    /// deltas of one or more services, coalesced).
    pub messages_per_s: Rate,
    /// Session bytes per second to the agents.
    pub bytes_per_s: Rate,
    /// Every process's CPU and memory over the deploy.
    pub usage: Vec<Usage>,
}

/// `storm`: every session cut at once, the churn nodes' deltas committed
/// meanwhile, then every agent back on its own backoff.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Storm {
    /// Agents cut off.
    pub agents: u64,
    /// Of those, restarted with their cache wiped.
    pub wiped: u64,
    /// Changes the churn nodes committed while they were cut off.
    pub churn_commits: u64,
    /// Their rate, per second (no agent to fan them out to).
    pub churn_commits_per_s: Option<f64>,
    /// How long the agents were cut off, s.
    pub cut_s: f64,
    /// Heal → every agent's every followed view at the revision it must
    /// reach (records), s; `null` when some never did.
    pub converge_s: Option<f64>,
    /// Heal → each agent's last needed view, one sample per agent.
    pub agent_converge: Latency,
    /// Heal → each agent's first session again.
    pub reconnect: Latency,
    /// Most snapshots in flight sampled during the storm.
    pub snapshots_in_flight_sampled_max: Option<f64>,
    /// Most snapshots in flight at once over the whole run (the
    /// replicas' own counts; the most of any one, as each bounds its own).
    pub snapshots_in_flight_max: Option<f64>,
    /// The arbiter's bound (`distribution.max_concurrent_snapshots`),
    /// when known (a spawned group runs the defaults).
    pub max_concurrent_snapshots: Option<u64>,
    /// Snapshots the agents received after the heal.
    pub snapshots: u64,
    /// "Retry later" answers the agents received after the heal.
    pub retries: u64,
    /// Agents not wiped that reconnected.
    pub resumed_agents: u64,
    /// Of those, the ones that needed no snapshot (resumed every service
    /// by delta).
    pub resumed_by_delta: u64,
    /// `resumed_by_delta / resumed_agents`.
    pub resumed_by_delta_share: Option<f64>,
    /// Most leases the mass-expiry guard held, sampled.
    pub held_leases_max: Option<f64>,
    /// Every process's CPU and memory from the heal to convergence.
    pub usage: Vec<Usage>,
}

/// A target of the fleet-bench issue and what was measured against it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Target {
    /// What.
    pub name: String,
    /// The target (as text, with its unit).
    pub target: String,
    /// What was measured (`-` when not measured).
    pub measured: String,
    /// Whether it was met; `null` when not measured.
    pub met: Option<bool>,
}

/// The whole report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Always `fleet`.
    pub bench: String,
    /// The binary's commit.
    pub build: Build,
    /// The settings (flags) of the run.
    pub settings: serde_json::Value,
    /// Cores the machine offers (the load generator shares them).
    pub cores: usize,
    /// Every phase as it ran.
    pub phases: Vec<Span>,
    /// Setup figures.
    pub setup: Setup,
    /// `steady`, if run.
    pub steady: Option<Steady>,
    /// `deploy`, if run.
    pub deploy: Option<Deploy>,
    /// `storm`, if run.
    pub storm: Option<Storm>,
    /// Each replica's counters at each phase's end: (phase, replica,
    /// counters).
    pub counters: Vec<(String, String, ArbiterCounters)>,
    /// The targets.
    pub targets: Vec<Target>,
    /// Errors the agents' machines answered to the bench's calls.
    pub errors: Vec<(String, u64)>,
    /// What makes this run's figures unusable (empty: it measured what it
    /// claims).
    pub failures: Vec<String>,
    /// What to keep in mind reading them (a saturated process).
    pub notes: Vec<String>,
    /// Every process's readings, for the plots.
    pub processes: Vec<Watched>,
    /// Deliveries per wall second, over every worker, for the plots.
    pub load: Vec<(u64, Load)>,
}

/// Each (agent, service)'s acknowledgements, for "when did this follower
/// first hold revision R" and "when did it acknowledge R or later after a
/// moment" (a restarted agent acknowledges again what it held before).
pub struct Applies {
    /// Every acknowledgement, in time order: (revision, at).
    acks: HashMap<(u32, u32), Vec<(u64, u64)>>,
    /// Only those that raised the revision held: (revision, at).
    rises: HashMap<(u32, u32), Vec<(u64, u64)>>,
}

impl Applies {
    /// Indexes every worker's acknowledgements.
    pub fn new(records: &[Records]) -> Applies {
        let mut all: Vec<Apply> = records
            .iter()
            .flat_map(|r| r.applies.iter().copied())
            .collect();
        all.sort_unstable_by_key(|a| a.at_us());
        let mut acks: HashMap<(u32, u32), Vec<(u64, u64)>> = HashMap::new();
        let mut rises: HashMap<(u32, u32), Vec<(u64, u64)>> = HashMap::new();
        for a in all {
            let key = (a.agent(), a.service());
            acks.entry(key).or_default().push((a.revision(), a.at_us()));
            let steps = rises.entry(key).or_default();
            if steps.last().is_none_or(|(rev, _)| *rev < a.revision()) {
                steps.push((a.revision(), a.at_us()));
            }
        }
        Applies { acks, rises }
    }

    /// When `agent`'s view of `service` first held `revision` or later.
    pub fn held(&self, agent: u32, service: u32, revision: u64) -> Option<u64> {
        let steps = self.rises.get(&(agent, service))?;
        let at = steps.partition_point(|(rev, _)| *rev < revision);
        steps.get(at).map(|(_, t)| *t)
    }

    /// The first acknowledgement by `agent` of `service` at `revision` or
    /// later made at or after `from_us`.
    pub fn acked_after(
        &self,
        agent: u32,
        service: u32,
        revision: u64,
        from_us: u64,
    ) -> Option<u64> {
        let acks = self.acks.get(&(agent, service))?;
        let from = acks.partition_point(|(_, t)| *t < from_us);
        acks[from..]
            .iter()
            .find(|(rev, _)| *rev >= revision)
            .map(|(_, t)| *t)
    }
}

/// CPU and memory of every watched process over [from, to]: CPU between
/// the readings that bracket the interval most closely (the coordinator
/// reads every process at each phase boundary), memory over the readings
/// inside it and at its end.
pub fn usage(processes: &[Watched], from_us: u64, to_us: u64) -> Vec<Usage> {
    processes
        .iter()
        .map(|p| {
            let r = &p.readings;
            let first = r
                .iter()
                .rfind(|x| x.at_us <= from_us)
                .or_else(|| r.iter().find(|x| x.at_us >= from_us));
            let last = r
                .iter()
                .find(|x| x.at_us >= to_us)
                .or_else(|| r.iter().rfind(|x| x.at_us <= to_us));
            let cpu = match (first, last) {
                (Some(a), Some(b)) if b.at_us > a.at_us => Some(
                    b.cpu_ticks.saturating_sub(a.cpu_ticks) as f64
                        / USER_HZ
                        / ((b.at_us - a.at_us) as f64 / 1e6)
                        * 100.0,
                ),
                _ => None,
            };
            let inside = r
                .iter()
                .filter(|x| x.at_us >= from_us && x.at_us <= to_us)
                .chain(last);
            Usage {
                name: p.name.clone(),
                cpu_percent: cpu.map(round1),
                rss_end_mib: last.map(|x| mib(x.rss_kib)),
                rss_max_mib: inside.map(|x| x.rss_kib).max().map(mib),
            }
        })
        .collect()
}

/// A process near a full core in a phase: its work queued, and what it
/// measured (a worker) or served (an arbiter) waited.
pub fn saturated(phase: &str, usage: &[Usage]) -> Vec<String> {
    usage
        .iter()
        .filter(|u| u.cpu_percent.is_some_and(|c| c >= SATURATED_PERCENT))
        .map(|u| {
            let what = if u.name.starts_with("worker") {
                "the load generator was saturated: latencies include its queueing"
            } else {
                "the arbiter was saturated"
            };
            format!(
                "{phase}: {} used {:.0} % of a core; {what}",
                u.name,
                u.cpu_percent.unwrap_or_default()
            )
        })
        .collect()
}

/// CPU share of one core above which a process counts as saturated, %.
pub const SATURATED_PERCENT: f64 = 90.0;

fn mib(kib: u64) -> f64 {
    round1(kib as f64 / 1024.0)
}

fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

/// The per-second rate of `count` over the whole seconds of [from, to].
pub fn rate(load: &[(u64, Load)], from_us: u64, to_us: u64, count: impl Fn(&Load) -> u64) -> Rate {
    let (first, last) = (from_us / 1_000_000, to_us / 1_000_000);
    let seconds = (last - first + 1) as f64;
    let inside: Vec<u64> = load
        .iter()
        .filter(|(s, _)| *s >= first && *s <= last)
        .map(|(_, l)| count(l))
        .collect();
    Rate {
        mean: round1(inside.iter().sum::<u64>() as f64 / seconds),
        max: inside.iter().copied().max().unwrap_or(0) as f64,
    }
}

/// The deploy's figures from the commits answered inside `span`, with
/// the commit → applied and leave samples (µs) they summarize.
pub fn deploy(
    plan: &Plan,
    commits: &[&Commit],
    applies: &Applies,
    span: &Span,
    load: &[(u64, Load)],
) -> (Deploy, Vec<u64>, Vec<u64>) {
    let within: Vec<&&Commit> = commits
        .iter()
        .filter(|c| c.answered_us >= span.start_us && c.answered_us <= span.end_us)
        .filter(|c| !plan.is_churn(c.agent))
        .collect();
    let latency = |kind: Option<Kind>| {
        Latency::from_us(
            within
                .iter()
                .filter(|c| kind.is_none_or(|k| c.kind == k))
                .map(|c| c.answered_us.saturating_sub(c.sent_us))
                .collect(),
        )
    };
    let mut applied = Vec::new();
    let mut leave = Vec::new();
    let mut undelivered = 0;
    for c in &within {
        let mut last = Some(0);
        for &f in &plan.followers[c.service as usize] {
            match applies.held(f, c.service, c.revision) {
                Some(t) => {
                    let d = t.saturating_sub(c.answered_us);
                    applied.push(d);
                    last = last.map(|l: u64| l.max(d));
                }
                None => {
                    undelivered += 1;
                    last = None;
                }
            }
        }
        if c.kind == Kind::Drain && !plan.followers[c.service as usize].is_empty() {
            if let Some(l) = last {
                leave.push(l);
            }
        }
    }
    let commit_seconds: Vec<(u64, Load)> = {
        let mut by_second: HashMap<u64, u64> = HashMap::new();
        for c in &within {
            *by_second.entry(c.answered_us / 1_000_000).or_default() += 1;
        }
        by_second
            .into_iter()
            .map(|(s, n)| {
                (
                    s,
                    Load {
                        deltas: n,
                        ..Load::default()
                    },
                )
            })
            .collect()
    };
    let deploy = Deploy {
        commit: latency(None),
        commit_register: latency(Some(Kind::Register)),
        commit_drain: latency(Some(Kind::Drain)),
        commit_deregister: latency(Some(Kind::Deregister)),
        applied: Latency::from_us(applied.clone()),
        leave: Latency::from_us(leave.clone()),
        undelivered,
        commits_per_s: rate(&commit_seconds, span.start_us, span.end_us, |l| l.deltas),
        deliveries_per_s: rate(load, span.start_us, span.end_us, |l| l.updates),
        deltas_per_s: rate(load, span.start_us, span.end_us, |l| l.deltas),
        messages_per_s: rate(load, span.start_us, span.end_us, |l| l.messages),
        bytes_per_s: rate(load, span.start_us, span.end_us, |l| l.bytes),
        ..Deploy::default()
    };
    (deploy, applied, leave)
}

/// What the storm's agents needed after the heal, and when they had it:
/// (per-agent convergence samples, all converged, the last time).
pub fn convergence(
    plan: &Plan,
    commits: &[&Commit],
    applies: &Applies,
    cut_us: u64,
    heal_us: u64,
) -> (Vec<u64>, bool, u64) {
    let mut required: HashMap<u32, u64> = HashMap::new();
    for c in commits {
        if plan.is_churn(c.agent) && c.answered_us >= cut_us {
            let r = required.entry(c.service).or_default();
            *r = (*r).max(c.revision);
        }
    }
    let mut samples = Vec::new();
    let mut all = true;
    let mut last = heal_us;
    for a in 0..plan.shape.agents {
        let wiped = plan.wiped[a as usize];
        let mut agent_last = Some(heal_us);
        for &s in &plan.follows[a as usize] {
            let need = match (required.get(&s), wiped) {
                (Some(&r), _) => r,
                (None, true) => 0,
                (None, false) => continue,
            };
            // A wiped agent holds nothing until it applies after the heal.
            match applies.acked_after(a, s, need, heal_us) {
                Some(t) => agent_last = agent_last.map(|l| l.max(t)),
                None => agent_last = None,
            }
        }
        match agent_last {
            Some(t) => {
                samples.push(t - heal_us);
                last = last.max(t);
            }
            None => all = false,
        }
    }
    (samples, all, last)
}

/// Reconnect samples and the resume-by-delta count of the storm.
pub fn returns(records: &[Records], heal_us: u64) -> (Vec<u64>, u64, u64, u64, u64) {
    let all: Vec<&Return> = records.iter().flat_map(|r| &r.returns).collect();
    let reconnect = all
        .iter()
        .filter(|r| r.connected_us > 0)
        .map(|r| r.connected_us.saturating_sub(heal_us))
        .collect();
    let kept: Vec<&&Return> = all
        .iter()
        .filter(|r| !r.wiped && r.connected_us > 0)
        .collect();
    let by_delta = kept.iter().filter(|r| r.snapshots == 0).count() as u64;
    let snapshots = all.iter().map(|r| r.snapshots).sum();
    let retries = all.iter().map(|r| r.retries).sum();
    (reconnect, kept.len() as u64, by_delta, snapshots, retries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_in_ms_and_null_without_samples() {
        let l = Latency::from_us((1..=100).map(|v| v * 1_000).collect());
        assert_eq!(l.p50_ms, Some(50.0));
        assert_eq!(l.p99_ms, Some(99.0));
        assert_eq!(l.max_ms, Some(100.0));
        assert_eq!(Latency::from_us(Vec::new()).p99_ms, None);
    }

    #[test]
    fn a_follower_holds_a_revision_from_its_first_rise_to_it() {
        let records = Records {
            applies: vec![
                Apply(1, 2, 10, 100),
                Apply(1, 2, 9, 150),
                Apply(1, 2, 14, 300),
            ],
            ..Records::default()
        };
        let applies = Applies::new(&[records]);
        assert_eq!(applies.held(1, 2, 10), Some(100));
        assert_eq!(applies.held(1, 2, 12), Some(300));
        assert_eq!(applies.held(1, 2, 15), None);
        assert_eq!(applies.held(2, 2, 1), None);
        // After a moment: what was acknowledged from then on.
        assert_eq!(applies.acked_after(1, 2, 9, 120), Some(150));
        assert_eq!(applies.acked_after(1, 2, 10, 120), Some(300));
        assert_eq!(applies.acked_after(1, 2, 15, 0), None);
    }
}
