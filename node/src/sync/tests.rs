use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use rollcall_leases::{
    AgentEpoch, Catalog, CatalogParams, Command, Digest, Envelope, InstanceId, Label, NodeId,
    Principal, PrincipalName, Registration, Role, SinceAnswer, State, Version, Weight,
};

use super::*;

const CATALOG: CatalogId = CatalogId(1);

fn svc(s: &str) -> ServiceKey {
    ServiceKey::new("default", s, "default").unwrap()
}

fn apply(cat: &mut Catalog, command: Command) {
    let actor = Principal {
        role: Role::Operator,
        name: PrincipalName::new("t").unwrap(),
    };
    cat.apply(&Envelope {
        at_ms: 1,
        actor,
        command,
    })
    .unwrap();
}

fn register(cat: &mut Catalog, id: &str, service: &str) {
    apply(
        cat,
        Command::Register(Registration {
            instance_id: InstanceId::new(id).unwrap(),
            service: svc(service),
            node: NodeId::new("n1").unwrap(),
            epoch: AgentEpoch(1),
            address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 80,
            zone: None,
            version: Version::new("v1").unwrap(),
            weight: Weight::DEFAULT,
            labels: Vec::new(),
            initial: State::Ready,
        }),
    );
}

/// A catalog holding node n1's lease.
fn leased() -> Catalog {
    let mut cat = Catalog::new(CatalogParams::with_region(Label::new("r1").unwrap()));
    apply(
        &mut cat,
        Command::GrantLease {
            node: NodeId::new("n1").unwrap(),
            epoch: AgentEpoch(1),
            zone: Label::new("z1").unwrap(),
            ttl_ms: 10_000,
        },
    );
    cat
}

/// Two followed services, both synced from the catalog's deltas.
fn setup() -> (Catalog, CatalogSync) {
    let mut cat = leased();
    register(&mut cat, "a1", "a");
    register(&mut cat, "b1", "b");
    let mut sync = CatalogSync::new(ShardId(0));
    let mut out = Vec::new();
    sync.follow(svc("a"), &mut out);
    sync.follow(svc("b"), &mut out);
    sync.connected(Some(CATALOG), cat.revision(), &mut out);
    for s in ["a", "b"] {
        let SinceAnswer::Deltas(d) = cat.changes_since(&svc(s), Revision(0)) else {
            panic!()
        };
        sync.update(ServiceUpdate::Deltas(d), 10, &mut out);
    }
    (cat, sync)
}

fn deltas(cat: &Catalog, s: &str, after: Revision) -> Vec<Arc<rollcall_leases::ServiceDelta>> {
    let SinceAnswer::Deltas(d) = cat.changes_since(&svc(s), after) else {
        panic!()
    };
    d
}

#[test]
fn a_gap_asks_for_a_snapshot_of_that_service_only() {
    let (mut cat, mut sync) = setup();
    let held = sync.get(&svc("a")).unwrap().view.clone().unwrap();
    register(&mut cat, "a2", "a");
    register(&mut cat, "a3", "a");
    // Deliver only the last delta: the one before it is missing.
    let all = deltas(&cat, "a", held.revision());
    let mut out = Vec::new();
    sync.update(ServiceUpdate::Deltas(vec![all[1].clone()]), 20, &mut out);
    assert_eq!(
        out,
        vec![SyncOut::Subscribe {
            service: svc("a"),
            have: None
        }]
    );
    assert_eq!(
        sync.get(&svc("a")).unwrap().view.as_ref(),
        Some(&held),
        "the held view keeps serving unchanged"
    );
    assert!(!sync.get(&svc("a")).unwrap().synced);
    assert!(
        sync.get(&svc("b")).unwrap().synced,
        "the other service is untouched"
    );
    assert_eq!(sync.stats().gaps, 1);
}

#[test]
fn a_digest_mismatch_asks_for_a_snapshot_of_that_service_only() {
    let (mut cat, mut sync) = setup();
    let held = sync.get(&svc("b")).unwrap().view.clone().unwrap();
    register(&mut cat, "b2", "b");
    let mut tampered = (*deltas(&cat, "b", held.revision())[0]).clone();
    tampered.digest = Digest::EMPTY;
    let mut out = Vec::new();
    sync.update(
        ServiceUpdate::Deltas(vec![Arc::new(tampered)]),
        20,
        &mut out,
    );
    assert_eq!(
        out,
        vec![SyncOut::Subscribe {
            service: svc("b"),
            have: None
        }]
    );
    assert_eq!(sync.get(&svc("b")).unwrap().view.as_ref(), Some(&held));
    assert!(sync.get(&svc("a")).unwrap().synced);
    assert_eq!(sync.stats().digest_mismatches, 1);
}

#[test]
fn good_deltas_are_acknowledged_and_persisted() {
    let (mut cat, mut sync) = setup();
    let held = sync
        .get(&svc("a"))
        .unwrap()
        .view
        .as_ref()
        .unwrap()
        .revision();
    register(&mut cat, "a2", "a");
    let mut out = Vec::new();
    sync.update(ServiceUpdate::Deltas(deltas(&cat, "a", held)), 20, &mut out);
    let now = cat.service(&svc("a")).unwrap().revision;
    assert_eq!(
        out,
        vec![
            SyncOut::Ack {
                service: svc("a"),
                revision: now
            },
            SyncOut::Persist(svc("a"))
        ]
    );
    assert_eq!(
        sync.get(&svc("a"))
            .unwrap()
            .view
            .as_ref()
            .unwrap()
            .ready()
            .count(),
        2
    );
}

#[test]
fn deltas_already_held_are_re_acknowledged_not_a_gap() {
    let (mut cat, mut sync) = setup();
    let start = sync.get(&svc("a")).unwrap().view.clone().unwrap();
    register(&mut cat, "a2", "a");
    let first = deltas(&cat, "a", start.revision());
    let mut out = Vec::new();
    sync.update(ServiceUpdate::Deltas(first.clone()), 20, &mut out);
    let applied = sync.get(&svc("a")).unwrap().view.clone().unwrap();
    // The ack was late; the arbiter sends the same delta again.
    out.clear();
    sync.update(ServiceUpdate::Deltas(first), 30, &mut out);
    assert_eq!(
        out,
        vec![SyncOut::Ack {
            service: svc("a"),
            revision: applied.revision()
        }]
    );
    assert_eq!(sync.get(&svc("a")).unwrap().view.as_ref(), Some(&applied));
    // A re-send that overlaps what is held and adds more: only the new part applies.
    register(&mut cat, "a3", "a");
    out.clear();
    sync.update(
        ServiceUpdate::Deltas(deltas(&cat, "a", start.revision())),
        40,
        &mut out,
    );
    let now = cat.service(&svc("a")).unwrap().revision;
    assert_eq!(
        out,
        vec![
            SyncOut::Ack {
                service: svc("a"),
                revision: now
            },
            SyncOut::Persist(svc("a"))
        ]
    );
    assert_eq!(
        sync.get(&svc("a"))
            .unwrap()
            .view
            .as_ref()
            .unwrap()
            .ready()
            .count(),
        3
    );
    assert_eq!((sync.stats().gaps, sync.stats().digest_mismatches), (0, 0));
}

#[test]
fn a_snapshot_at_the_held_revision_is_acknowledged_again() {
    let (cat, mut sync) = setup();
    let held = sync.get(&svc("a")).unwrap().view.clone().unwrap();
    let snap = cat.service_snapshot(&svc("a")).unwrap();
    let bytes = rollcall_leases::codec::encode_service_snapshot(&snap);
    let mut out = Vec::new();
    sync.update(ServiceUpdate::Snapshot(bytes.into()), 20, &mut out);
    assert_eq!(
        out,
        vec![
            SyncOut::Ack {
                service: svc("a"),
                revision: held.revision()
            },
            SyncOut::Persist(svc("a"))
        ]
    );
    assert_eq!(sync.get(&svc("a")).unwrap().view.as_ref(), Some(&held));
}

#[test]
fn a_bad_snapshot_is_ignored_and_the_view_kept() {
    let (_, mut sync) = setup();
    let held = sync.get(&svc("a")).unwrap().view.clone();
    let mut out = Vec::new();
    sync.update(
        ServiceUpdate::Snapshot(Arc::from(&b"\x01\x03garbage"[..])),
        20,
        &mut out,
    );
    assert!(out.is_empty());
    assert_eq!(sync.get(&svc("a")).unwrap().view, held);
    assert_eq!(sync.stats().bad_snapshots, 1);
}

#[test]
fn a_disconnect_makes_views_stale_and_ages_them() {
    let (_, mut sync) = setup();
    sync.disconnected(1_000);
    let t = sync.get(&svc("a")).unwrap();
    assert!(!t.synced);
    assert_eq!(t.age_ms(1_500, 0), 500);
    let mut out = Vec::new();
    let discarded = sync.connected(Some(CATALOG), Revision(1), &mut out);
    assert!(discarded.is_empty(), "same catalog, lagging replica: kept");
    assert!(
        out.iter()
            .all(|o| matches!(o, SyncOut::Subscribe { have: Some(_), .. })),
        "reconnects resume by delta: {out:?}"
    );
}

/// The views `setup` holds, as a restarted agent loads them from cache
/// files naming `catalog`.
fn restarted(catalog: Option<CatalogId>) -> CatalogSync {
    let (_, old) = setup();
    let mut sync = CatalogSync::new(ShardId(0));
    for (_, t) in old.iter() {
        sync.load_cached((**t.view.as_ref().unwrap()).clone(), catalog);
    }
    sync
}

fn subscriptions(out: &[SyncOut]) -> Vec<(String, Option<Revision>)> {
    out.iter()
        .filter_map(|o| match o {
            SyncOut::Subscribe { service, have } => Some((service.service.to_string(), *have)),
            _ => None,
        })
        .collect()
}

#[test]
fn views_of_another_catalog_are_dropped_and_fetched_by_snapshot() {
    let mut sync = restarted(Some(CATALOG));
    let mut out = Vec::new();
    // A rebuilt arbiter group: another identity, and a revision far
    // ahead of the cached ones, so only the identity can tell.
    let discarded = sync.connected(Some(CatalogId(2)), Revision(1_000), &mut out);
    assert_eq!(
        discarded,
        vec![
            (svc("a"), Discard::OtherCatalog),
            (svc("b"), Discard::OtherCatalog)
        ]
    );
    assert_eq!(
        subscriptions(&out),
        vec![("a".into(), None), ("b".into(), None)]
    );
    assert!(out.contains(&SyncOut::Forget(svc("a"))));
    assert!(
        sync.get(&svc("a")).unwrap().view.is_none(),
        "no longer served"
    );
    assert_eq!(sync.stats().discarded_other_catalog, 2);

    // The new catalog's snapshot is then held as the new catalog's.
    let mut cat = leased();
    register(&mut cat, "a9", "a");
    let snap =
        rollcall_leases::codec::shared_service_snapshot(&cat.service_snapshot(&svc("a")).unwrap());
    sync.update(ServiceUpdate::Snapshot(snap), 5, &mut out);
    let t = sync.get(&svc("a")).unwrap();
    assert_eq!(t.catalog, Some(CatalogId(2)));
    assert_eq!(t.view.as_ref().unwrap().records().count(), 1);
}

#[test]
fn views_ahead_of_an_arbiter_are_dropped_unless_the_catalog_is_the_same() {
    // A cache written before identities (or an arbiter not named yet):
    // ahead of the arbiter's revision means another catalog.
    for (mine, theirs) in [(None, Some(CATALOG)), (Some(CATALOG), None), (None, None)] {
        let mut sync = restarted(mine);
        let mut out = Vec::new();
        let discarded = sync.connected(theirs, Revision(1), &mut out);
        assert_eq!(discarded.len(), 2, "{mine:?} {theirs:?}");
        assert!(discarded
            .iter()
            .all(|(_, why)| *why == Discard::AheadOfArbiter));
        assert_eq!(sync.stats().discarded_ahead, 2);
    }
    // Not ahead, or the same catalog (a lagging replica): resumed.
    let mut sync = restarted(None);
    let mut out = Vec::new();
    assert!(sync
        .connected(Some(CATALOG), Revision(50), &mut out)
        .is_empty());
    assert!(subscriptions(&out).iter().all(|(_, have)| have.is_some()));
    let mut sync = restarted(Some(CATALOG));
    assert!(sync
        .connected(Some(CATALOG), Revision(0), &mut out)
        .is_empty());
}
