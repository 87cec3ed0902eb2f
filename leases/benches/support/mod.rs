//! What every benchmark of the workspace shares (the node crate's
//! benchmarks include this file by path): which size to run, and figures
//! that refuse to summarize nothing.
//!
//! `cargo bench` passes `--bench` to a benchmark binary; `cargo test`
//! (and so CI) runs the same binary without it. Without it a benchmark
//! runs as a smoke test: small sizes, a few seconds, and it fails unless
//! it measured what it claims (every change delivered, every figure with
//! its samples). A smoke run asserts no timing: the machines are shared.

// Each benchmark uses a part of this module.
#![allow(dead_code)]

/// True under `cargo bench`, false under `cargo test`.
pub fn full_run() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// The full or the smoke value, overridden by the environment variable
/// `name` when it is set to a number.
pub fn sized(name: &str, full: usize, smoke: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full_run() { full } else { smoke })
}

/// Prints which run this is, once at start.
pub fn announce(bench: &str) {
    if full_run() {
        println!("{bench}: full run");
    } else {
        println!("{bench}: smoke run (cargo test: small sizes, judged on what was measured, not on time); `cargo bench` runs it in full");
    }
}

/// Nearest-rank percentile of sorted samples: the smallest sample with at
/// least `p` of them at or below it, so every figure was measured.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// p50, p99 and max of a figure.
#[derive(Clone, Copy, Debug)]
pub struct Summary {
    pub n: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

/// Summarizes `samples`; a figure without samples measured nothing, and
/// the benchmark fails naming it.
pub fn summarize(name: &str, mut samples: Vec<f64>) -> Summary {
    assert!(
        !samples.is_empty(),
        "{name}: no samples; this measured nothing"
    );
    samples.sort_by(f64::total_cmp);
    Summary {
        n: samples.len(),
        p50: percentile(&samples, 0.5),
        p99: percentile(&samples, 0.99),
        max: samples[samples.len() - 1],
    }
}

/// Prints `name: n=… p50=… p99=… max=…` with `unit` and `decimals`.
pub fn report(name: &str, samples: Vec<f64>, unit: &str, decimals: usize) -> Summary {
    let s = summarize(name, samples);
    println!(
        "{name}: n={} p50={:.d$} {unit} p99={:.d$} {unit} max={:.d$} {unit}",
        s.n,
        s.p50,
        s.p99,
        s.max,
        d = decimals
    );
    s
}

/// Fails unless a figure got at least `want` samples.
pub fn expect_samples(name: &str, got: usize, want: usize) {
    assert!(
        got >= want,
        "{name}: {got} samples of the {want} this run must measure"
    );
}

/// Whether a larger value of a figure is better (a rate) or worse (a
/// latency).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Better {
    Higher,
    Lower,
}

/// One figure of a table: every run's value, summarized by its median.
struct Row {
    name: String,
    unit: &'static str,
    better: Better,
    runs: Vec<f64>,
    note: String,
}

/// The figures one benchmark run prints as a table: each the median of
/// several runs, beside the same figure of the previous commit when one
/// was stored. A full run stores its medians, with the commit they came
/// from, in `target/bench-figures/<bench>.tsv` (one line per figure and
/// run; `ROLLCALL_BENCH_FIGURES` names another file), so the next commit's
/// run compares with them; a smoke run stores nothing. A figure with no
/// runs fails the benchmark.
pub struct Table {
    bench: &'static str,
    rows: Vec<Row>,
}

impl Table {
    pub fn new(bench: &'static str) -> Table {
        Table {
            bench,
            rows: Vec::new(),
        }
    }

    /// Adds one run's value of figure `name`.
    pub fn add(&mut self, name: &str, unit: &'static str, better: Better, value: f64) {
        match self.rows.iter_mut().find(|r| r.name == name) {
            Some(row) => row.runs.push(value),
            None => self.rows.push(Row {
                name: name.to_owned(),
                unit,
                better,
                runs: vec![value],
                note: String::new(),
            }),
        }
    }

    /// Adds what the figure `name` means, printed after its row.
    pub fn note(&mut self, name: &str, note: &str) {
        if let Some(row) = self.rows.iter_mut().find(|r| r.name == name) {
            row.note = note.to_owned();
        }
    }

    /// The median of figure `name`'s runs; the benchmark fails when it has
    /// none.
    pub fn median(&self, name: &str) -> f64 {
        let row = self
            .rows
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("{name}: no runs; this measured nothing"));
        summarize(name, row.runs.clone()).p50
    }

    /// Prints the table; in a full run, stores its medians for the next
    /// commit's run.
    pub fn finish(self) {
        let file = figures_file(self.bench);
        let commit = commit();
        // A smoke run's small sizes compare with nothing stored.
        let previous = if full_run() {
            previous_figures(&file, &commit)
        } else {
            Default::default()
        };
        println!();
        println!(
            "{}: medians at {commit} ({})",
            self.bench,
            if full_run() { "full run" } else { "smoke run" }
        );
        println!(
            "{:<58} {:>12} {:<10} {:>5} {:>12} {:>8}",
            "figure", "median", "unit", "runs", "previous", "ratio"
        );
        let mut lines = String::new();
        for row in &self.rows {
            let median = summarize(&row.name, row.runs.clone()).p50;
            let (before, ratio) = match previous.get(&row.name) {
                Some((prev, at)) if *prev != 0.0 => {
                    let ratio = match row.better {
                        Better::Higher => median / prev,
                        Better::Lower => prev / median,
                    };
                    (format!("{prev:.1} @{at}"), format!("{ratio:.2}x"))
                }
                _ => ("-".to_owned(), "-".to_owned()),
            };
            println!(
                "{:<58} {:>12.1} {:<10} {:>5} {:>12} {:>8}",
                row.name,
                median,
                row.unit,
                row.runs.len(),
                before,
                ratio
            );
            if !row.note.is_empty() {
                println!("    {}", row.note);
            }
            lines.push_str(&format!("{commit}\t{}\t{median}\n", row.name));
        }
        println!("(ratio > 1 is better than the previous commit's figure)");
        if full_run() {
            if let Some(dir) = file.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            use std::io::Write;
            let stored = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&file)
                .and_then(|mut f| f.write_all(lines.as_bytes()));
            match stored {
                Ok(()) => println!("figures stored in {}", file.display()),
                Err(e) => println!("figures not stored in {}: {e}", file.display()),
            }
        }
    }
}

/// Where a benchmark's figures are kept between runs.
fn figures_file(bench: &str) -> std::path::PathBuf {
    if let Ok(path) = std::env::var("ROLLCALL_BENCH_FIGURES") {
        return path.into();
    }
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| {
        // Benchmarks run in their package's directory; the workspace's
        // target directory is one level up.
        "../target".to_owned()
    });
    std::path::Path::new(&target)
        .join("bench-figures")
        .join(format!("{bench}.tsv"))
}

/// The commit the benchmark was built from (`+` when the tree had
/// changes), or `unknown`.
fn commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(head) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{head}+")
            } else {
                head
            }
        }
        None => "unknown".to_owned(),
    }
}

/// The newest stored median of each figure from a commit other than
/// `commit`.
fn previous_figures(
    file: &std::path::Path,
    commit: &str,
) -> std::collections::HashMap<String, (f64, String)> {
    let mut out = std::collections::HashMap::new();
    let Ok(text) = std::fs::read_to_string(file) else {
        return out;
    };
    for line in text.lines() {
        let mut parts = line.split('\t');
        if let (Some(at), Some(name), Some(value)) = (parts.next(), parts.next(), parts.next()) {
            if at != commit {
                if let Ok(v) = value.parse::<f64>() {
                    out.insert(name.to_owned(), (v, at.to_owned()));
                }
            }
        }
    }
    out
}
