//! Issue 2 benchmarks (not tests):
//! (a) applied transitions per second on a catalog of 100,000 endpoints in
//!     2,000 services: one iteration is one whole `apply` (validation, state
//!     update, revision, digest update, delta-log append; no encoding);
//! (b) encoded full-snapshot bytes per endpoint for realistic records.
//!
//! Run: `cargo bench -p rollcall-leases --bench catalog`. `cargo test`
//! runs it as a smoke test on a catalog of 1,000 endpoints: every apply
//! must succeed and move the revision, and the snapshots must hold every
//! endpoint.

mod fleet;
mod support;

use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput};
use fleet::{fleet, Size};
use rollcall_leases::codec::{encode_catalog_snapshot, encode_service_snapshot};

fn transitions(c: &mut Criterion, size: Size) {
    let (mut cat, ids) = fleet(size);
    let before = cat.revision();
    let envelopes = fleet::transitions(&ids);
    let mut group = c.benchmark_group("catalog");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(10));
    let mut k = 0usize;
    group.bench_function("apply_transition_100k_endpoints", |b| {
        b.iter(|| {
            let env = &envelopes[k % envelopes.len()];
            k += 1;
            cat.apply(env).expect("transition applies")
        })
    });
    group.finish();
    assert!(k > 0, "no transition was applied: this measured nothing");
    assert_eq!(
        cat.revision().0 - before.0,
        k as u64,
        "every applied transition commits one revision"
    );
}

fn snapshot_size(c: &mut Criterion, size: Size) {
    let (cat, _) = fleet(size);
    let records: usize = cat
        .services()
        .iter()
        .map(|k| cat.service_snapshot(k).unwrap().records.len())
        .sum();
    assert_eq!(records, size.endpoints, "the snapshots hold every endpoint");

    let full = encode_catalog_snapshot(&cat.export());
    let per_service: usize = cat
        .services()
        .iter()
        .map(|k| encode_service_snapshot(&cat.service_snapshot(k).unwrap()).len())
        .sum();
    println!(
        "snapshot size: full catalog {} bytes = {:.1} bytes/endpoint (includes leases and generation memory); \
         {} per-service snapshots {} bytes = {:.1} bytes/endpoint; target <= 64",
        full.len(),
        full.len() as f64 / size.endpoints as f64,
        size.services,
        per_service,
        per_service as f64 / size.endpoints as f64,
    );
    let snap = cat.export();
    let mut group = c.benchmark_group("snapshot");
    group.sample_size(10);
    group.bench_function("encode_full_100k", |b| {
        b.iter_batched(
            || (),
            |_| encode_catalog_snapshot(&snap),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn main() {
    support::announce("catalog");
    let size = fleet::size(support::full_run());
    let mut c = Criterion::default().configure_from_args();
    snapshot_size(&mut c, size);
    transitions(&mut c, size);
    c.final_summary();
}
