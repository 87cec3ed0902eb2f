//! `report.json` and `report.md`: the report written out, every figure
//! beside `rollcall budget`'s prediction.

use super::*;

/// Writes `dir/report.json` (pretty-printed, the public contract),
/// creating `dir` if needed. Written before anything else of the run, so
/// that a later failure (a plot, the Markdown) cannot lose it.
pub fn write_json(dir: &Path, report: &Report) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut json = serde_json::to_string_pretty(report).map_err(std::io::Error::other)?;
    json.push('\n');
    std::fs::write(dir.join("report.json"), json)
}

/// Writes `dir/report.md` (see [`markdown`]), creating `dir` if needed.
pub fn write_markdown(
    dir: &Path,
    report: &Report,
    budget: &[(String, String)],
    plots: &[String],
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("report.md"), markdown(report, budget, plots))
}

/// The report as Markdown: the verdict, a table of every figure with a
/// "budget predicts" column filled from `budget` (figure name as in
/// `report.json` → predicted text), the failures, the phases and links to
/// `plots` (file names relative to the report's directory).
pub fn markdown(report: &Report, budget: &[(String, String)], plots: &[String]) -> String {
    let predicted = |figure: &str| -> String {
        budget
            .iter()
            .find(|(name, _)| name == figure)
            .map_or_else(String::new, |(_, text)| cell(text))
    };
    let stats = |s: &Stats| match (s.p50, s.p99, s.max) {
        (Some(p50), Some(p99), Some(max)) => {
            format!("count {}, p50 {p50}, p99 {p99}, max {max}", s.count)
        }
        _ => format!("count {}", s.count),
    };
    let optional = |v: Option<u64>| v.map_or_else(|| "not measured".to_owned(), |v| v.to_string());

    let mut rows: Vec<(&str, String)> = vec![
        ("leave_ms", stats(&report.leave_ms)),
        ("crash_ms", stats(&report.crash_ms)),
        ("crash_commit_ms", stats(&report.crash_commit_ms)),
        ("leave_view_ms", stats(&report.leave_view_ms)),
        ("crash_view_ms", stats(&report.crash_view_ms)),
        ("converge_ms", optional(report.converge_ms)),
        (
            "new_conns_to_drained",
            report.new_conns_to_drained.to_string(),
        ),
        (
            "new_conns_to_not_ready",
            report.new_conns_to_not_ready.to_string(),
        ),
        ("conns", report.conns.to_string()),
        ("failed_conns", report.failed_conns.to_string()),
        ("false_removals", report.false_removals.to_string()),
        ("view_dips", optional(report.view_dips)),
        (
            "max_concurrent_snapshots",
            report.max_concurrent_snapshots.to_string(),
        ),
        ("snapshots_refused", report.snapshots_refused.to_string()),
    ];
    match &report.history {
        Some(h) => {
            rows.push(("history.writes_checked", h.writes_checked.to_string()));
            rows.push(("history.lost_writes", h.lost_writes.len().to_string()));
        }
        None => rows.push(("history", "not measured (no audit log)".to_owned())),
    }
    if let Some(e) = &report.election {
        rows.push(("election.window_ms", e.window_ms.to_string()));
        rows.push((
            "election.failed_conns_to_live_backends",
            format!("{} of {}", e.failed_conns_to_live_backends, e.conns),
        ));
    }
    if let Some(d) = &report.degraded {
        rows.push((
            "degraded",
            format!(
                "{} answers sampled, {} past their maximum age, {} served degraded ({} of them whole: no fresh local evidence), {} disagreeing",
                d.answers, d.past_max_age, d.degraded, d.fallback, d.mismatched
            ),
        ));
    }
    if let Some(c) = &report.cache_corruption {
        rows.push((
            "cache_corruption",
            format!(
                "{} files corrupted, {} detected, {} answers from a cache",
                c.files, c.detected, c.stale_answers
            ),
        ));
    }
    match &report.outage {
        Some(outage) => {
            rows.push(("outage.duration_s", outage.duration_s.to_string()));
            rows.push((
                "outage.failed_conns_to_live_backends",
                outage.failed_conns_to_live_backends.to_string(),
            ));
        }
        None => rows.push(("outage", "none".to_owned())),
    }

    let mut md = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(md, "# Chaos report: {}\n", report.scenario);
    let _ = writeln!(
        md,
        "**{}**: seed {}, {} agents, {} s; built from {}{}.\n",
        if report.pass { "PASS" } else { "FAIL" },
        report.seed,
        report.agents,
        report.duration_s,
        report.git_commit,
        if report.git_dirty {
            " with uncommitted changes"
        } else {
            ""
        }
    );
    md.push_str("| figure | measured | budget predicts |\n|---|---|---|\n");
    for (figure, measured) in rows {
        let _ = writeln!(md, "| {figure} | {measured} | {} |", predicted(figure));
    }
    md.push_str("\n## Failures\n\n");
    if report.failures.is_empty() {
        md.push_str("None.\n");
    }
    for failure in &report.failures {
        let _ = writeln!(md, "- {failure}");
    }
    if let Some(h) = report
        .history
        .as_ref()
        .filter(|h| !h.false_removals.is_empty())
    {
        md.push_str("\n## False removals\n\n");
        for r in &h.false_removals {
            let _ = writeln!(md, "- {}", cell(r));
        }
    }
    if let Some(h) = report
        .history
        .as_ref()
        .filter(|h| !h.lost_writes.is_empty())
    {
        md.push_str("\n## Lost writes\n\n");
        for w in &h.lost_writes {
            let _ = writeln!(md, "- {}", cell(w));
        }
    }
    if let Some(regions) = &report.regions {
        let counts = |m: &BTreeMap<String, u64>| {
            if m.is_empty() {
                "none".to_owned()
            } else {
                m.iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        let _ = writeln!(
            md,
            "\n## Routing by region ({} regions)\n\n| phase | may answer | settled from s | settled may answer | conns | answered by | settled conns | settled answered by | resolve refusals once settled |\n|---|---|---|---|---|---|---|---|---|",
            regions.regions
        );
        for r in &regions.routing {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                cell(&r.phase),
                cell(&format!("{:?}", r.answered_by)),
                r.settled_from_s,
                cell(&format!("{:?}", r.settled_by)),
                r.conns,
                counts(&r.answered),
                r.settled_conns,
                counts(&r.settled_answered),
                counts(&r.refusals),
            );
        }
        let interleaved: Vec<String> = regions
            .routing
            .iter()
            .filter(|r| r.interleaved > 0)
            .map(|r| format!("{} {}", r.phase, r.interleaved))
            .collect();
        if !interleaved.is_empty() {
            let _ = writeln!(
                md,
                "\nConnections answered by a region after another had taken over: {}.",
                interleaved.join(", ")
            );
        }
        if !regions.writers.is_empty() {
            md.push_str("\nWriter epochs at the last reading: ");
            let readings: Vec<String> = regions
                .writers
                .iter()
                .map(|w| {
                    format!(
                        "{} epoch {} ({}, {})",
                        w.region,
                        w.epoch,
                        w.owner,
                        if w.settled { "settled" } else { "moving" }
                    )
                })
                .collect();
            let _ = writeln!(md, "{}.", readings.join("; "));
        }
    }
    if let Some(rogue) = &report.rogue {
        crate::rogue::markdown(rogue, &mut md);
    }
    md.push_str("\n## Phases\n\n");
    if report.phases.is_empty() {
        md.push_str("None.\n");
    } else {
        md.push_str("| phase | start s | end s | conns | failed conns |\n|---|---|---|---|---|\n");
        for p in &report.phases {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} |",
                cell(&p.name),
                p.start_s,
                p.end_s,
                p.conns,
                p.failed_conns
            );
        }
    }
    md.push_str("\n## Plots\n\n");
    if plots.is_empty() {
        md.push_str("None.\n");
    }
    for plot in plots {
        let _ = writeln!(md, "- [{plot}]({plot})");
    }
    md
}

/// `text` made safe for one Markdown table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}
