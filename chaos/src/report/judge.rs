//! The judges: a report's figures against the scenario's `[pass]`
//! bounds, each failure in words.

use super::*;

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
pub(super) fn judge(report: &Report, pass: &Pass) -> Vec<String> {
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
    if let Some(bound) = pass.max_rogue_breaches {
        crate::rogue::judge(report.rogue.as_ref(), bound, &mut failures);
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
