//! Property tests over random command sequences (issue 2): the invariants
//! every replica and every consumer relies on.

use std::net::{IpAddr, Ipv4Addr};

use proptest::prelude::*;
use rollcall_config::ServicePolicy;
use rollcall_leases::codec::{
    decode_catalog_snapshot, decode_command, decode_delta, decode_service_snapshot,
    encode_catalog_snapshot, encode_command, encode_service_snapshot,
};
use rollcall_leases::{
    AgentEpoch, Catalog, CatalogParams, Command, Envelope, Generation, InstanceId, Label,
    LabelValue, Liveness, NodeId, Policy, Principal, PrincipalName, Reason, Registration,
    RemotePolicy, Revision, Role, ServiceKey, ServiceView, SinceAnswer, State, Version, Weight,
};

const NODES: usize = 4;
const INSTANCES: usize = 8;
const SERVICES: usize = 3;

fn params() -> CatalogParams {
    let mut p = CatalogParams::with_region(Label::new("r1").unwrap());
    // Short retentions and a small guard window so purges, forgetting and
    // holds all happen within a few dozen commands.
    p.expired_retention_ms = 3_000;
    p.service_retention_ms = 10_000;
    p.guard.window_ms = 5_000;
    p.guard.max_hold_ms = 8_000;
    p
}

fn node(i: usize) -> NodeId {
    NodeId::new(&format!("node-{i}")).unwrap()
}
fn instance(i: usize) -> InstanceId {
    InstanceId::new(&format!("svc-7d9f8b6c4-x{i}")).unwrap()
}
fn service(i: usize) -> ServiceKey {
    ServiceKey::new("default", &format!("s{i}"), "default").unwrap()
}
fn zone(i: usize) -> Label {
    Label::new(&format!("z{}", i % 2)).unwrap()
}

fn state() -> impl Strategy<Value = State> {
    prop_oneof![
        Just(State::Starting),
        Just(State::Ready),
        Just(State::Draining),
        Just(State::Unhealthy),
        Just(State::Expired)
    ]
}

fn command() -> impl Strategy<Value = Command> {
    let n = 0..NODES;
    let e = 1u64..4;
    let i = 0..INSTANCES;
    let g = 1u64..4;
    prop_oneof![
        3 => (n.clone(), e.clone(), 0usize..3).prop_map(|(n, e, z)| Command::GrantLease { node: node(n), epoch: AgentEpoch(e), zone: zone(n + z / 2), ttl_ms: 10_000 }),
        1 => (n.clone(), e.clone()).prop_map(|(n, e)| Command::RevokeLease { node: node(n), epoch: AgentEpoch(e) }),
        2 => (n.clone(), e.clone(), 0u32..5).prop_map(|(n, e, s)| Command::ExpireLease { node: node(n), epoch: AgentEpoch(e), silent_in_zone: s }),
        5 => (i.clone(), 0..SERVICES, n.clone(), e.clone(), any::<bool>(), 0u8..4, any::<bool>()).prop_map(|(i, s, n, e, starting, addr, canary)| {
            Command::Register(Registration {
                instance_id: instance(i),
                service: service(s),
                node: node(n),
                epoch: AgentEpoch(e),
                address: IpAddr::V4(Ipv4Addr::new(10, 0, 0, addr)),
                port: 8000 + u16::from(addr),
                zone: None,
                version: Version::new(if canary { "v2" } else { "v1" }).unwrap(),
                weight: Weight::new(1 + u32::from(addr) * 50).unwrap(),
                labels: if canary { vec![(Label::new("track").unwrap(), LabelValue::new("canary").unwrap())] } else { Vec::new() },
                initial: if starting { State::Starting } else { State::Ready },
            })
        }),
        6 => (i.clone(), g.clone(), state()).prop_map(|(i, g, to)| Command::Transition {
            instance_id: instance(i),
            generation: Generation(g),
            to,
            reason: Reason::new("property test").unwrap(),
        }),
        1 => (i.clone(), g.clone(), any::<bool>()).prop_map(|(i, g, pass)| Command::SetLiveness {
            instance_id: instance(i),
            generation: Generation(g),
            liveness: if pass { Liveness::Passing } else { Liveness::Failing },
        }),
        2 => (i, g).prop_map(|(i, g)| Command::Deregister { instance_id: instance(i), generation: Generation(g) }),
        1 => (n, e).prop_map(|(n, e)| Command::NodeDown { node: node(n), epoch: AgentEpoch(e), reporters: vec![node((n + 1) % NODES)] }),
        1 => Just(Command::Purge),
        1 => (0..SERVICES).prop_map(|s| Command::DeleteService { service: service(s) }),
        1 => (0..SERVICES, any::<bool>(), any::<bool>()).prop_map(|(s, home, cross)| Command::SetPolicy(Box::new(policy(s, home, cross)))),
        1 => (0..SERVICES).prop_map(|s| Command::DeletePolicy { service: format!("default/s{s}").parse().unwrap() }),
        1 => (0..SERVICES, any::<bool>(), 1u64..6).prop_map(|(s, home, rev)| Command::ReplicatePolicy(Box::new(RemotePolicy { policy: policy(s, home, true), home_revision: Revision(rev), home_set_at_ms: rev }))),
        1 => (0..SERVICES, 1u64..6).prop_map(|(s, rev)| Command::DropReplicatedPolicy { service: format!("default/s{s}").parse().unwrap(), home: Label::new("r2").unwrap(), home_revision: Revision(rev) }),
    ]
}

/// A policy for service `s`, homed in this region (r1) or in r2 (which
/// this catalog refuses).
fn policy(s: usize, home_here: bool, cross_region: bool) -> Policy {
    let home = if home_here { "r1" } else { "r2" };
    let mut doc = ServicePolicy::new(format!("default/s{s}"), home);
    doc.cross_region = cross_region;
    doc.failover_order = vec!["r3".into()];
    doc.capacity_limits.insert("r3".into(), 0.25);
    Policy::new(doc).unwrap()
}

/// A log of envelopes with times that move forward by 0.1 to 2 s.
fn log() -> impl Strategy<Value = Vec<Envelope>> {
    prop::collection::vec((command(), 100u64..2_000), 1..120).prop_map(|steps| {
        let mut at_ms = 1_700_000_000_000;
        steps
            .into_iter()
            .map(|(command, dt)| {
                at_ms += dt;
                Envelope {
                    at_ms,
                    actor: Principal {
                        role: Role::Operator,
                        name: PrincipalName::new("prop").unwrap(),
                    },
                    command,
                }
            })
            .collect()
    })
}

fn replay(log: &[Envelope]) -> Catalog {
    let mut cat = Catalog::new(params());
    for env in log {
        let _ = cat.apply(env);
    }
    cat
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn revisions_strictly_increase_one_at_a_time(log in log()) {
        let mut cat = Catalog::new(params());
        for env in &log {
            let before = cat.revision();
            match cat.apply(env) {
                Ok(applied) => match applied.revision {
                    Some(rev) => {
                        prop_assert_eq!(rev, before.next());
                        prop_assert_eq!(cat.revision(), rev);
                    }
                    None => prop_assert_eq!(cat.revision(), before),
                },
                Err(_) => prop_assert_eq!(cat.revision(), before),
            }
        }
    }

    #[test]
    fn replaying_the_same_log_gives_byte_identical_snapshots(log in log()) {
        let a = encode_catalog_snapshot(&replay(&log).export());
        let b = encode_catalog_snapshot(&replay(&log).export());
        prop_assert_eq!(a, b);
    }

    #[test]
    fn rejected_commands_and_stale_generations_change_nothing(log in log()) {
        let mut cat = Catalog::new(params());
        for env in &log {
            let before = encode_catalog_snapshot(&cat.export());
            let stale = match &env.command {
                Command::Transition { instance_id, generation, .. }
                | Command::SetLiveness { instance_id, generation, .. }
                | Command::Deregister { instance_id, generation } => {
                    cat.instance(instance_id).is_none_or(|r| r.generation != *generation)
                }
                _ => false,
            };
            let result = cat.apply(env);
            if stale {
                prop_assert!(result.is_err(), "stale call accepted: {:?}", env.command);
            }
            if result.is_err() {
                prop_assert_eq!(encode_catalog_snapshot(&cat.export()), before);
            }
        }
    }

    #[test]
    fn snapshot_export_import_round_trips_every_field(log in log()) {
        let cat = replay(&log);
        let snap = cat.export();
        let decoded = decode_catalog_snapshot(&encode_catalog_snapshot(&snap)).unwrap();
        prop_assert_eq!(&decoded, &snap);
        let imported = Catalog::import(params(), decoded).unwrap();
        prop_assert_eq!(imported.export(), snap);
        for key in cat.services() {
            let one = cat.service_snapshot(&key).unwrap();
            prop_assert_eq!(decode_service_snapshot(&encode_service_snapshot(&one)).unwrap(), one);
        }
    }

    #[test]
    fn snapshot_at_r_plus_deltas_since_r_equals_the_final_state(log in log(), cut in 0.0f64..1.0) {
        let split = (log.len() as f64 * cut) as usize;
        let mut cat = Catalog::new(params());
        for env in &log[..split] {
            let _ = cat.apply(env);
        }
        let mut views: Vec<ServiceView> = (0..SERVICES)
            .map(|s| match cat.service_snapshot(&service(s)) {
                Some(snap) => ServiceView::from_snapshot(&snap).unwrap(),
                None => ServiceView::empty(service(s), params().shard),
            })
            .collect();
        for env in &log[split..] {
            let _ = cat.apply(env);
        }
        for view in &mut views {
            let key = view.service().clone();
            match cat.changes_since(&key, view.revision()) {
                SinceAnswer::Deltas(deltas) => {
                    for d in &deltas {
                        view.apply(d).unwrap();
                    }
                }
                SinceAnswer::UpToDate => {}
                // The service is gone: a consumer drops what it held.
                SinceAnswer::Unknown => *view = ServiceView::empty(key.clone(), params().shard),
                other => prop_assert!(false, "unexpected answer {:?}", other),
            }
            match cat.service_snapshot(&key) {
                Some(final_snap) => {
                    prop_assert_eq!(view.digest(), final_snap.digest);
                    prop_assert_eq!(view.to_snapshot().records, final_snap.records);
                }
                None => prop_assert!(view.records().next().is_none()),
            }
        }
    }

    #[test]
    fn decoding_random_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512), kind in 1u8..12) {
        let _ = decode_command(&bytes);
        let _ = decode_delta(&bytes);
        let _ = decode_service_snapshot(&bytes);
        let _ = decode_catalog_snapshot(&bytes);
        // The same bytes behind a valid header reach the body decoders.
        let mut framed = vec![rollcall_leases::codec::FORMAT_VERSION, kind];
        framed.extend_from_slice(&bytes);
        let _ = decode_command(&framed);
        let _ = decode_delta(&framed);
        let _ = decode_service_snapshot(&framed);
        let _ = decode_catalog_snapshot(&framed);
    }

    #[test]
    fn corrupting_an_encoded_snapshot_never_panics(log in log(), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let mut bytes = encode_catalog_snapshot(&replay(&log).export());
        let i = at.index(bytes.len());
        bytes[i] = byte;
        if let Ok(snap) = decode_catalog_snapshot(&bytes) {
            let _ = Catalog::import(params(), snap);
        }
    }

    #[test]
    fn commands_round_trip(log in log()) {
        for env in &log {
            prop_assert_eq!(&decode_command(&encode_command(env)).unwrap(), env);
        }
    }
}
