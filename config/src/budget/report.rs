//! The computed budget ([`BudgetReport`]) and how it reads: the SLO
//! violations with the setting to change, the pauses an agent may take
//! ([`PauseTolerance`]), and the aligned table `rollcall budget` prints.

use std::fmt;

use super::terms::{BudgetRow, Case, Setting};
use crate::RENEWALS_PER_TTL;

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
/// signals (R4): the zone's gossip declaring it down, and then the
/// arbiter's probe of its session unanswered for `lease.probe_timeout_ms`
/// (a paused agent answers it when it resumes). A member that stops at
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
    /// The longest pause tolerated, ms: the gossip bound and then the
    /// probe's (the probe goes out only once gossip reports the node).
    pub tolerated_ms: f64,
    /// probe_period + suspect_to_down − periodic_gossip, ms.
    pub gossip_ms: f64,
    /// lease.probe_timeout_ms: how long after the gossip report a paused
    /// agent may still answer the arbiter's probe, ms.
    pub probe_ms: f64,
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
            "process pauses tolerated: up to {} (gossip preset {}: probe period + suspect_to_down − 1 gossip round = {}; both signals must agree, and the arbiter's probe, sent at the gossip report, waits {} for the answer); a longer pause of an agent can get its live node declared down",
            seconds(self.tolerated_ms),
            self.preset,
            seconds(self.gossip_ms),
            seconds(self.probe_ms),
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
