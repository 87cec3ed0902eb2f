//! `rollcall chaos summary DIR`: the table of a set of chaos runs, read from
//! their `report.json` files (DIR/<run>/report.json), so the table in
//! `chaos/results/README.md` is regenerated, never typed. With a README
//! path it replaces the text between the [`BEGIN`] and [`END`] markers.
//!
//! Reads files and formats; it computes no figure of its own.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::report::{Report, Stats};

/// The line before the generated table in a README.
pub const BEGIN: &str = "<!-- rollcall chaos summary: begin -->";
/// The line after it.
pub const END: &str = "<!-- rollcall chaos summary: end -->";

/// Why no table could be made.
#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    /// A directory or file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// A report file is not a chaos report of this version.
    #[error("{path}: not a chaos report: {message}")]
    Report {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// No run directory under DIR holds a report.json.
    #[error("{0}: no <run>/report.json below it")]
    Empty(PathBuf),
    /// The README lacks the markers.
    #[error("{path}: lacks the lines {BEGIN:?} and {END:?} (in this order) around the table")]
    Markers {
        /// The README.
        path: PathBuf,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SummaryError + '_ {
    move |source| SummaryError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A run: its directory's name and its report.
pub type Run = (String, Report);

/// Every report in `dir`'s run directories, by directory name.
pub fn reports(dir: &Path) -> Result<Vec<Run>, SummaryError> {
    let mut reports = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let run = entry.map_err(io(dir))?.path();
        let name = run
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let file = run.join("report.json");
        if !file.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&file).map_err(io(&file))?;
        let report: Report = serde_json::from_str(&text).map_err(|e| SummaryError::Report {
            path: file.clone(),
            message: e.to_string(),
        })?;
        reports.push((name, report));
    }
    if reports.is_empty() {
        return Err(SummaryError::Empty(dir.to_path_buf()));
    }
    reports.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(reports)
}

/// The Markdown table of `runs`, one row each, named by run directory (and
/// by scenario too when they differ, e.g. a run with `--gossip-preset`).
pub fn table(runs: &[Run]) -> String {
    let stats = |s: &Stats| match (s.p50, s.p99, s.max) {
        (Some(p50), Some(p99), Some(max)) => {
            format!("{p50:.0} / {p99:.0} / {max:.0} (n={})", s.count)
        }
        _ => "—".to_owned(),
    };
    let mut md = String::from(
        "| scenario | agents | duration | connections | result | leave ms p50/p99/max | crash ms p50/p99/max | crash → commit ms p50/p99/max | failed conns | converge ms | false removals (view dips) | writes checked (lost) | max snapshots | built from |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (name, r) in runs {
        let label = if *name == r.scenario {
            name.clone()
        } else {
            format!("{name} ({})", r.scenario)
        };
        let result = match (&r.outage, r.pass) {
            (Some(o), true) => format!(
                "PASS (outage {:.0} s: {} failed to live backends)",
                o.duration_s, o.failed_conns_to_live_backends
            ),
            (_, true) => "PASS".to_owned(),
            (_, false) => format!("FAIL: {}", r.failures.join("; ").replace('|', "\\|")),
        };
        let writes = r.history.as_ref().map_or_else(
            || "not measured".to_owned(),
            |h| format!("{} ({})", h.writes_checked, h.lost_writes.len()),
        );
        let commit: String = r.git_commit.chars().take(7).collect();
        let removals = format!(
            "{} ({})",
            r.false_removals,
            r.view_dips
                .map_or_else(|| "—".to_owned(), |d| d.to_string())
        );
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} s | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}{} |",
            label,
            r.agents,
            r.duration_s,
            r.conns,
            result,
            stats(&r.leave_ms),
            stats(&r.crash_ms),
            stats(&r.crash_commit_ms),
            r.failed_conns,
            r.converge_ms
                .map_or_else(|| "—".to_owned(), |c| c.to_string()),
            removals,
            writes,
            r.max_concurrent_snapshots,
            commit,
            if r.git_dirty { " (dirty)" } else { "" },
        );
    }
    md
}

/// Replaces the table between the markers of `readme` with `table`.
pub fn update_readme(readme: &Path, table: &str) -> Result<(), SummaryError> {
    let text = std::fs::read_to_string(readme).map_err(io(readme))?;
    let markers = || SummaryError::Markers {
        path: readme.to_path_buf(),
    };
    let begin = text.find(BEGIN).ok_or_else(markers)?;
    let end = text[begin..].find(END).ok_or_else(markers)? + begin;
    let updated = format!("{}{BEGIN}\n{table}{}", &text[..begin], &text[end..]);
    std::fs::write(readme, updated).map_err(io(readme))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{compute, HistoryFigures, ReportInput};
    use crate::scenario::Pass;
    use crate::timeline::{Conn, Outcome, Timeline};

    fn report(name: &str) -> Report {
        let input = ReportInput {
            scenario: name.to_owned(),
            agents: 3,
            history: Some(HistoryFigures {
                writes_checked: 6,
                ..HistoryFigures::default()
            }),
            build: crate::report::Build {
                commit: "0123456789abcdef".to_owned(),
                dirty: true,
            },
            ..ReportInput::default()
        };
        let timeline = Timeline {
            conns: vec![Conn {
                t_ms: 10,
                agent: "a".to_owned(),
                backend: Some("x".to_owned()),
                outcome: Outcome::Answered,
            }],
            duration_ms: 30_000,
            ..Timeline::default()
        };
        let pass = Pass {
            min_leave_samples: 0,
            min_crash_samples: 0,
            ..Pass::default()
        };
        compute(&input, &timeline, &pass)
    }

    #[test]
    fn the_table_is_read_from_the_report_files_and_replaces_the_readmes() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["zeta", "alpha"] {
            let run = dir.path().join(name);
            crate::report::write_json(&run, &report(name)).unwrap();
        }
        crate::report::write_json(&dir.path().join("zeta-lan"), &report("zeta")).unwrap();
        std::fs::create_dir(dir.path().join("not-a-run")).unwrap();
        let found = reports(dir.path()).unwrap();
        let md = table(&found);
        let rows: Vec<&str> = md.lines().skip(2).collect();
        assert_eq!(rows.len(), 3);
        assert!(
            rows[0].starts_with("| alpha | 3 | 30 s | 1 | PASS |"),
            "{md}"
        );
        assert!(rows[2].starts_with("| zeta-lan (zeta) | 3 |"), "{md}");
        assert!(rows[0].ends_with("| 6 (0) | 0 | 0123456 (dirty) |"), "{md}");

        let readme = dir.path().join("README.md");
        std::fs::write(
            &readme,
            format!("intro\n{BEGIN}\nold table\n{END}\nafter\n"),
        )
        .unwrap();
        update_readme(&readme, &md).unwrap();
        let text = std::fs::read_to_string(&readme).unwrap();
        assert_eq!(text, format!("intro\n{BEGIN}\n{md}{END}\nafter\n"));

        std::fs::write(&readme, "no markers\n").unwrap();
        assert!(matches!(
            update_readme(&readme, &md),
            Err(SummaryError::Markers { .. })
        ));
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(reports(empty.path()), Err(SummaryError::Empty(_))));
    }
}
