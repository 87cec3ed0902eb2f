//! Issue 2 benchmarks (not tests):
//! (a) applied transitions per second on a catalog of 100,000 endpoints in
//!     2,000 services: one iteration is one whole `apply` (validation, state
//!     update, revision, digest update, delta-log append; no encoding);
//! (b) encoded full-snapshot bytes per endpoint for realistic records.
//!
//! Run: `cargo bench -p rollcall-leases --bench catalog`

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput};
use rollcall_leases::codec::{encode_catalog_snapshot, encode_service_snapshot};
use rollcall_leases::{
    AgentEpoch, Catalog, CatalogParams, Command, Envelope, Generation, InstanceId, Label,
    LabelValue, NodeId, Principal, PrincipalName, Reason, Registration, Role, ServiceKey, State,
    Version, Weight,
};

const NODES: usize = 5_000;
const SERVICES: usize = 2_000;
const ENDPOINTS: usize = 100_000;
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
fn fleet() -> (Catalog, Vec<InstanceId>) {
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
    for n in 0..NODES {
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
    let mut ids = Vec::with_capacity(ENDPOINTS);
    for i in 0..ENDPOINTS {
        let s = i % SERVICES;
        let name = format!("{}-{s}", WORDS[s % WORDS.len()]);
        let release = (i / SERVICES) % 2;
        let rs = suffix((s * 2 + release) as u64, 9);
        let id = InstanceId::new(&format!("{name}-{rs}-{}", suffix(i as u64, 5))).unwrap();
        let node = (i * 7919) % NODES;
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

fn transitions(c: &mut Criterion) {
    let (mut cat, ids) = fleet();
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
    group.bench_function("apply_transition_100k_endpoints", |b| {
        b.iter(|| {
            let env = &envelopes[k % ENDPOINTS][(k / ENDPOINTS) % 2];
            k += 1;
            cat.apply(env).expect("transition applies")
        })
    });
    group.finish();
}

fn snapshot_size(c: &mut Criterion) {
    let (cat, _) = fleet();
    let full = encode_catalog_snapshot(&cat.export());
    let per_service: usize = cat
        .services()
        .iter()
        .map(|k| encode_service_snapshot(&cat.service_snapshot(k).unwrap()).len())
        .sum();
    println!(
        "snapshot size: full catalog {} bytes = {:.1} bytes/endpoint (includes leases and generation memory); \
         2,000 per-service snapshots {} bytes = {:.1} bytes/endpoint; target <= 64",
        full.len(),
        full.len() as f64 / ENDPOINTS as f64,
        per_service,
        per_service as f64 / ENDPOINTS as f64,
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
    let mut c = Criterion::default().configure_from_args();
    snapshot_size(&mut c);
    transitions(&mut c);
    c.final_summary();
}
