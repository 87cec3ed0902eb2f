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

mod support;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput};
use rollcall_leases::codec::{encode_catalog_snapshot, encode_service_snapshot};
use rollcall_leases::{
    AgentEpoch, Catalog, CatalogParams, Command, Envelope, Generation, InstanceId, Label,
    LabelValue, NodeId, Principal, PrincipalName, Reason, Registration, Role, ServiceKey, State,
    Version, Weight,
};

/// The fleet's size: 5,000 nodes, 2,000 services and 100,000 endpoints
/// in the full run, a fiftieth of each (and 1,000 endpoints) in the smoke.
#[derive(Clone, Copy)]
struct Size {
    nodes: usize,
    services: usize,
    endpoints: usize,
}

fn size() -> Size {
    if support::full_run() {
        Size {
            nodes: 5_000,
            services: 2_000,
            endpoints: 100_000,
        }
    } else {
        Size {
            nodes: 100,
            services: 40,
            endpoints: 1_000,
        }
    }
}
const ZONES: [&str; 3] = ["us-east-1a", "us-east-1b", "us-east-1c"];
const WORDS: [&str; 10] = [
    "checkout",
    "payments",
    "search",
    "catalog",
    "cart",
    "ledger",
    "profile",
    "pricing",
    "inventory",
    "shipping",
];

/// A deterministic, pod-like suffix (`x2k9p`) from a number.
fn suffix(mut n: u64, len: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..len)
        .map(|_| {
            let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
            n = n / ALPHABET.len() as u64 + 7919;
            c
        })
        .collect()
}

fn actor() -> Principal {
    Principal {
        role: Role::Agent,
        name: PrincipalName::new("bench").unwrap(),
    }
}

/// 5,000 nodes in 3 zones, 2,000 services of 50 endpoints each (two
/// ReplicaSet hashes and versions per service), all READY.
fn fleet(size: Size) -> (Catalog, Vec<InstanceId>) {
    let mut cat = Catalog::new(CatalogParams::with_region(Label::new("us-east-1").unwrap()));
    let mut at_ms = 1_764_000_000_000u64;
    let mut env = |cat: &mut Catalog, command: Command| {
        at_ms += 1;
        cat.apply(&Envelope {
            at_ms,
            actor: actor(),
            command,
        })
        .expect("fleet setup applies");
    };
    for n in 0..size.nodes {
        let zone = Label::new(ZONES[n % 3]).unwrap();
        env(
            &mut cat,
            Command::GrantLease {
                node: NodeId::new(&format!("node-{n:04}")).unwrap(),
                epoch: AgentEpoch(1),
                zone,
                ttl_ms: 10_000,
            },
        );
    }
    let canary = (
        Label::new("track").unwrap(),
        LabelValue::new("canary").unwrap(),
    );
    let mut ids = Vec::with_capacity(size.endpoints);
    for i in 0..size.endpoints {
        let s = i % size.services;
        let name = format!("{}-{s}", WORDS[s % WORDS.len()]);
        let release = (i / size.services) % 2;
        let rs = suffix((s * 2 + release) as u64, 9);
        let id = InstanceId::new(&format!("{name}-{rs}-{}", suffix(i as u64, 5))).unwrap();
        let node = (i * 7919) % size.nodes;
        ids.push(id.clone());
        env(
            &mut cat,
            Command::Register(Registration {
                instance_id: id,
                service: ServiceKey::new("default", &name, "http").unwrap(),
                node: NodeId::new(&format!("node-{node:04}")).unwrap(),
                epoch: AgentEpoch(1),
                address: IpAddr::V4(Ipv4Addr::new(
                    10,
                    (node / 250) as u8,
                    (node % 250) as u8,
                    (i % 250) as u8 + 1,
                )),
                port: 8080,
                zone: None,
                version: Version::new(if release == 0 { "v1.41.0" } else { "v1.42.0" }).unwrap(),
                weight: Weight::DEFAULT,
                labels: if i % 20 == 0 {
                    vec![canary.clone()]
                } else {
                    Vec::new()
                },
                initial: State::Ready,
            }),
        );
    }
    (cat, ids)
}

fn transitions(c: &mut Criterion, size: Size) {
    let (mut cat, ids) = fleet(size);
    let before = cat.revision();
    let reason_down = Reason::new("readiness GET /healthz returned 503 3 times").unwrap();
    let reason_up = Reason::new("readiness passed 1 time").unwrap();
    let envelopes: Vec<[Envelope; 2]> = ids
        .iter()
        .map(|id| {
            let make = |to, reason: &Reason| Envelope {
                at_ms: 1_764_100_000_000,
                actor: actor(),
                command: Command::Transition {
                    instance_id: id.clone(),
                    generation: Generation(1),
                    to,
                    reason: reason.clone(),
                },
            };
            [
                make(State::Unhealthy, &reason_down),
                make(State::Ready, &reason_up),
            ]
        })
        .collect();
    let mut group = c.benchmark_group("catalog");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(10));
    let mut k = 0usize;
    let endpoints = size.endpoints;
    group.bench_function("apply_transition_100k_endpoints", |b| {
        b.iter(|| {
            let env = &envelopes[k % endpoints][(k / endpoints) % 2];
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
    let size = size();
    let mut c = Criterion::default().configure_from_args();
    snapshot_size(&mut c, size);
    transitions(&mut c, size);
    c.final_summary();
}
