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
