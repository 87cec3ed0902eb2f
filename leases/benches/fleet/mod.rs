//! The catalog benchmarks' fleet (included by `catalog.rs` and
//! `throughput.rs`): nodes in 3 zones, services of READY endpoints with
//! pod-like names, two ReplicaSet hashes and versions per service, a
//! canary label on one in twenty; and the transitions that flip each
//! endpoint down and up again.

use std::net::{IpAddr, Ipv4Addr};

use rollcall_leases::{
    AgentEpoch, Catalog, CatalogParams, Command, Envelope, Generation, InstanceId, Label,
    LabelValue, NodeId, Principal, PrincipalName, Reason, Registration, Role, ServiceKey, State,
    Version, Weight,
};

/// How big a fleet is.
#[derive(Clone, Copy)]
pub struct Size {
    pub nodes: usize,
    pub services: usize,
    pub endpoints: usize,
}

/// 5,000 nodes, 2,000 services and 100,000 endpoints in the full run, a
/// fiftieth of each (and 1,000 endpoints) in the smoke run.
pub fn size(full: bool) -> Size {
    if full {
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

pub fn actor() -> Principal {
    Principal {
        role: Role::Agent,
        name: PrincipalName::new("bench").unwrap(),
    }
}

/// 5,000 nodes in 3 zones, 2,000 services of 50 endpoints each (two
/// ReplicaSet hashes and versions per service), all READY.
pub fn fleet(size: Size) -> (Catalog, Vec<InstanceId>) {
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

/// Each endpoint to UNHEALTHY, then each back to READY: every one of
/// these, applied in turn (and over again), changes the record it names.
pub fn transitions(ids: &[InstanceId]) -> Vec<Envelope> {
    let down = Reason::new("readiness GET /healthz returned 503 3 times").unwrap();
    let up = Reason::new("readiness passed 1 time").unwrap();
    [(State::Unhealthy, down), (State::Ready, up)]
        .into_iter()
        .flat_map(|(to, reason)| {
            ids.iter().map(move |id| Envelope {
                at_ms: 1_764_100_000_000,
                actor: actor(),
                command: Command::Transition {
                    instance_id: id.clone(),
                    generation: Generation(1),
                    to,
                    reason: reason.clone(),
                },
            })
        })
        .collect()
}
