//! Failover decisions: the rules, the writer epochs, the capacity
//! spread, and a property test over random policies and regions.

use super::*;
use rollcall_config::{ServicePolicy, SingleWriter};
use rollcall_leases::{Policy, Revision, ServiceSummary};

fn key() -> ServiceKey {
    "shop/web/http".parse().unwrap()
}

fn policy(edit: impl FnOnce(&mut ServicePolicy)) -> HeldPolicy {
    let mut doc = ServicePolicy::new("shop/web", "r1");
    doc.cross_region = true;
    doc.failover_traffic = TrafficClass::All;
    doc.failover_order = vec!["r2".into(), "r3".into()];
    edit(&mut doc);
    HeldPolicy {
        policy: Policy::new(doc).unwrap(),
        home_revision: Revision(4),
    }
}

fn region(name: &str, ready: u32, age_ms: u64) -> RegionEntry {
    RegionEntry {
        region: Label::new(name).unwrap(),
        age_ms,
        max_age_ms: 10_000,
        version: Revision(9),
        ingress: vec![Ingress::new(&format!("edge.{name}:443")).unwrap()],
        summaries: vec![ServiceSummary {
            service: key(),
            revision: Revision(3),
            ready,
            weight: u64::from(ready) * 100,
            taken_at_ms: 0,
        }],
    }
}

fn regions(p: HeldPolicy, rs: Vec<RegionEntry>) -> Regions {
    let mut r = Regions::new();
    r.update(
        RegionsUpdate {
            policies: vec![p],
            regions: rs,
            writers: Vec::new(),
        },
        1_000,
    );
    r
}

fn target(d: &Decision) -> Option<&str> {
    match d {
        Decision::Remote { region, .. } => Some(region.as_str()),
        Decision::Refused(_) => None,
    }
}

#[test]
fn the_first_fresh_region_with_capacity_in_order_is_chosen() {
    let spread = Spread::default();
    let mut r = regions(policy(|_| {}), vec![region("r2", 3, 0), region("r3", 5, 0)]);
    let d = r.decide(&key(), ConnTraffic::ReadWrite, 1_000, &spread);
    assert_eq!(target(&d), Some("r2"));
    // r2 with nothing READY: r3.
    r.update(
        RegionsUpdate {
            policies: vec![policy(|_| {})],
            regions: vec![region("r2", 0, 0), region("r3", 5, 0)],
            writers: Vec::new(),
        },
        2_000,
    );
    assert_eq!(
        target(&r.decide(&key(), ConnTraffic::ReadOnly, 2_000, &spread)),
        Some("r3")
    );
}

#[test]
fn a_view_older_than_its_limit_is_never_a_target() {
    let spread = Spread::default();
    let r = regions(policy(|_| {}), vec![region("r2", 3, 4_000)]);
    assert_eq!(
        target(&r.decide(&key(), ConnTraffic::ReadOnly, 7_000, &spread)),
        Some("r2")
    );
    // 4 s old when received at 1 s; past 10 s at 7.001 s of agent time.
    assert_eq!(
        r.decide(&key(), ConnTraffic::ReadOnly, 7_001, &spread),
        Decision::Refused(Refusal::Stale)
    );
    assert!(!r.status(7_001)[0].fresh);
}

#[test]
fn policy_refusals_name_their_reason() {
    let spread = Spread::default();
    let r = Regions::new();
    assert_eq!(
        r.decide(&key(), ConnTraffic::ReadOnly, 0, &spread),
        Decision::Refused(Refusal::NoPolicy)
    );
    let r = regions(policy(|d| d.cross_region = false), vec![region("r2", 3, 0)]);
    assert_eq!(
        r.decide(&key(), ConnTraffic::ReadOnly, 1_000, &spread),
        Decision::Refused(Refusal::CrossRegionOff)
    );
    let r = regions(
        policy(|d| d.failover_traffic = TrafficClass::ReadOnly),
        vec![region("r2", 3, 0)],
    );
    assert_eq!(
        r.decide(&key(), ConnTraffic::ReadWrite, 1_000, &spread),
        Decision::Refused(Refusal::ReadOnlyPolicy)
    );
    assert_eq!(
        target(&r.decide(&key(), ConnTraffic::ReadOnly, 1_000, &spread)),
        Some("r2")
    );
}

/// Writer epoch `n` of the test service, owned by `owner`.
fn epoch(owner: &str, n: u64, settled: bool) -> WriterEpoch {
    WriterEpoch {
        service: "shop/web".parse().unwrap(),
        epoch: n,
        owner: Label::new(owner).unwrap(),
        from: (n > 1).then(|| Label::new("r1").unwrap()),
        settled,
        at_ms: 1,
        by: Principal {
            role: Role::Operator,
            name: PrincipalName::new("admin-token").unwrap(),
        },
        committed_in: Label::new("r1").unwrap(),
        forced: None,
    }
}

#[test]
fn single_writer_writes_go_only_to_the_settled_writer_of_the_epoch_held() {
    let spread = Spread::default();
    let owned = policy(|d| {
        d.single_writer = Some(SingleWriter {
            owner: "r1".into(),
            transfer_to: None,
        })
    });
    let entries = vec![region("r2", 3, 0), region("r3", 3, 0)];
    let with = |writer: Option<WriterEpoch>| {
        let mut r = Regions::new();
        r.update(
            RegionsUpdate {
                policies: vec![owned.clone()],
                regions: entries.clone(),
                writers: writer.into_iter().collect(),
            },
            1_000,
        );
        r
    };
    // Epoch 1 (the policy's owner, r1): writes never leave r1; reads do.
    let r = with(None);
    assert_eq!(r.writer(&key()).map(|w| w.epoch), Some(1));
    assert_eq!(
        r.decide(&key(), ConnTraffic::ReadWrite, 1_000, &spread),
        Decision::Refused(Refusal::SingleWriter)
    );
    assert_eq!(
        r.writes_elsewhere(&key(), ConnTraffic::ReadWrite, "r1", 1_000),
        None
    );
    assert_eq!(
        target(&r.decide(&key(), ConnTraffic::ReadOnly, 1_000, &spread)),
        Some("r2")
    );
    // In r2, r1's writes go to r1 (whose summary r2 does not hold
    // here: stale), never to r2's own endpoints; reads stay local.
    assert_eq!(
        r.writes_elsewhere(&key(), ConnTraffic::ReadWrite, "r2", 1_000),
        Some(Decision::Refused(Refusal::Stale))
    );
    assert_eq!(
        r.writes_elsewhere(&key(), ConnTraffic::ReadOnly, "r2", 1_000),
        None
    );
    assert_eq!(
        r.admits(&key(), ConnTraffic::ReadWrite, "r2", None),
        Err(Refusal::SingleWriter)
    );

    // Epoch 2 moving to r3: writes go nowhere, in every region.
    let r = with(Some(epoch("r3", 2, false)));
    for here in ["r1", "r2", "r3"] {
        assert_eq!(
            r.writes_elsewhere(&key(), ConnTraffic::ReadWrite, here, 1_000),
            Some(Decision::Refused(Refusal::WriterMoving)),
            "{here}"
        );
    }
    assert_eq!(
        r.decide(&key(), ConnTraffic::ReadWrite, 1_000, &spread),
        Decision::Refused(Refusal::WriterMoving)
    );
    assert_eq!(
        r.admits(&key(), ConnTraffic::ReadWrite, "r3", None),
        Err(Refusal::WriterMoving)
    );

    // Epoch 2 settled in r3: r1's and r2's writes go to r3's ingress;
    // r3 serves them locally and its gateway takes them, unless stamped
    // with another epoch.
    let r = with(Some(epoch("r3", 2, true)));
    for here in ["r1", "r2"] {
        let d = r.writes_elsewhere(&key(), ConnTraffic::ReadWrite, here, 1_000);
        assert_eq!(d.as_ref().and_then(target), Some("r3"), "{here}");
    }
    assert_eq!(
        r.writes_elsewhere(&key(), ConnTraffic::ReadWrite, "r3", 1_000),
        None
    );
    assert_eq!(
        target(&r.decide(&key(), ConnTraffic::ReadWrite, 1_000, &spread)),
        Some("r3")
    );
    assert!(r
        .admits(&key(), ConnTraffic::ReadWrite, "r3", Some(2))
        .is_ok());
    assert!(r.admits(&key(), ConnTraffic::ReadWrite, "r3", None).is_ok());
    assert_eq!(
        r.admits(&key(), ConnTraffic::ReadWrite, "r3", Some(1)),
        Err(Refusal::WriterEpoch)
    );
    assert_eq!(
        r.admits(&key(), ConnTraffic::ReadWrite, "r2", Some(2)),
        Err(Refusal::SingleWriter)
    );
    assert!(r.admits(&key(), ConnTraffic::ReadOnly, "r2", None).is_ok());
}

#[test]
fn capacity_limits_spread_the_demand_and_spill_in_order() {
    let spread = Spread::default();
    // Local demand 1000; r2 holds 300 with a limit of 0.5: it takes
    // 150/1000 = 15% of the moved connections, r3 (limit 1.0, 5000)
    // the rest.
    let r = regions(
        policy(|d| {
            d.capacity_limits.insert("r2".into(), 0.5);
            d.capacity_limits.insert("r3".into(), 1.0);
        }),
        vec![region("r2", 3, 0), region("r3", 50, 0)],
    );
    spread.observe_local(1_000, 500);
    spread.observe_local(0, 900);
    let mut counts = BTreeMap::new();
    for _ in 0..1_000 {
        let d = r.decide(&key(), ConnTraffic::ReadOnly, 1_000, &spread);
        *counts.entry(target(&d).map(str::to_owned)).or_insert(0) += 1;
    }
    let r2 = counts.get(&Some("r2".to_owned())).copied().unwrap_or(0);
    let r3 = counts.get(&Some("r3".to_owned())).copied().unwrap_or(0);
    assert!((145..=155).contains(&r2), "{counts:?}");
    assert_eq!(r2 + r3, 1_000, "{counts:?}");

    // Only r2, limited: 15% move, the rest are refused for the limit.
    let spread = Spread::default();
    let mut r = regions(
        policy(|d| d.failover_order = vec!["r2".into()]),
        vec![region("r2", 3, 0)],
    );
    spread.observe_local(1_000, 500);
    let refused = (0..100)
        .filter(|_| {
            r.decide(&key(), ConnTraffic::ReadOnly, 1_000, &spread)
                == Decision::Refused(Refusal::CapacityLimit)
        })
        .count();
    assert!((83..=87).contains(&refused), "{refused}");
    // The estimate forgets a peak older than its window.
    let later = 1_000 + DEMAND_WINDOW_MS + 600;
    r.update(
        RegionsUpdate {
            policies: vec![policy(|d| d.failover_order = vec!["r2".into()])],
            regions: vec![region("r2", 3, 0)],
            writers: Vec::new(),
        },
        later,
    );
    spread.observe_local(0, later);
    assert!((0..20)
        .all(|_| target(&r.decide(&key(), ConnTraffic::ReadOnly, later, &spread)) == Some("r2")));
}

mod invariants {
    use super::*;
    use proptest::prelude::*;

    const REGIONS: [&str; 4] = ["r2", "r3", "r4", "r5"];

    prop_compose! {
        /// A valid policy over r2–r5 and what each region looks like.
        fn world()(
            order in proptest::sample::subsequence(REGIONS.to_vec(), 0..=4).prop_shuffle(),
            bounded in proptest::sample::subsequence(REGIONS.to_vec(), 0..=2),
            cross in any::<bool>(),
            all in any::<bool>(),
            writer in proptest::option::of(proptest::option::of((0usize..4, any::<bool>()))),
            limits in proptest::collection::vec(0.0f64..=1.0, 4),
            ready in proptest::collection::vec(0u32..4, 4),
            ages in proptest::collection::vec(0u64..20_000, 4),
            demand in 0u64..2_000,
            now in 1_000u64..30_000,
        ) -> (HeldPolicy, Vec<RegionEntry>, Vec<WriterEpoch>, u64, u64) {
            let order: Vec<String> = order
                .into_iter()
                .filter(|r| !bounded.contains(r))
                .map(str::to_owned)
                .collect();
            let policy = policy(|d| {
                d.cross_region = cross;
                d.failover_traffic = if all { TrafficClass::All } else { TrafficClass::ReadOnly };
                d.data_boundary = bounded.iter().map(|r| (*r).to_owned()).collect();
                d.capacity_limits = order
                    .iter()
                    .zip(&limits)
                    .map(|(r, l)| (r.clone(), *l))
                    .collect();
                d.failover_order = order.clone();
                d.single_writer = writer.map(|_| SingleWriter {
                    owner: "r1".into(),
                    transfer_to: None,
                });
            });
            // A transfer held: epoch 2 to one of r2–r5, settled or not.
            let writers = writer
                .flatten()
                .map(|(i, settled)| epoch(REGIONS[i], 2, settled))
                .into_iter()
                .collect();
            let regions = REGIONS
                .iter()
                .enumerate()
                .map(|(i, r)| region(r, ready[i], ages[i]))
                .collect();
            (policy, regions, writers, demand, now)
        }
    }

    proptest! {
        /// Whatever the policy and the regions, a connection only ever
        /// moves where every rule allows it.
        #[test]
        fn a_connection_moves_only_where_every_rule_allows(
            (held, entries, writers, demand, now) in world(),
            writes in any::<bool>(),
            tries in 1usize..20,
        ) {
            let doc = held.policy.document().clone();
            let mut r = Regions::new();
            let spread = Spread::default();
            let writer = writers.first().and_then(|w| w.writer().cloned());
            r.update(RegionsUpdate { policies: vec![held], regions: entries.clone(), writers }, 1_000);
            spread.observe_local(demand, 1_000);
            let traffic = if writes { ConnTraffic::ReadWrite } else { ConnTraffic::ReadOnly };
            for _ in 0..tries {
                if let Decision::Remote { region, ingress, ready } = r.decide(&key(), traffic, now, &spread) {
                    let name = region.as_str();
                    prop_assert!(doc.cross_region);
                    prop_assert!(doc.failover_order.iter().any(|o| o == name));
                    prop_assert!(!doc.data_boundary.iter().any(|b| b == name));
                    let entry = entries.iter().find(|e| e.region == region).unwrap();
                    prop_assert!(entry.age_ms + (now - 1_000) <= entry.max_age_ms, "stale {name}");
                    prop_assert!(ready > 0 && !ingress.is_empty());
                    if writes {
                        prop_assert_eq!(doc.failover_traffic, TrafficClass::All);
                        if doc.single_writer.is_some() {
                            // Epoch 1's writer is r1, never a target;
                            // a transfer's only once settled.
                            prop_assert_eq!(writer.as_ref().map(Label::as_str), Some(name));
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn the_ingress_admits_only_what_the_policy_lets_into_its_region() {
    let r = regions(
        policy(|d| {
            d.failover_order = vec!["r2".into()];
            d.data_boundary = vec!["r3".into()];
        }),
        vec![],
    );
    assert!(r.admits(&key(), ConnTraffic::ReadWrite, "r2", None).is_ok());
    assert_eq!(
        r.admits(&key(), ConnTraffic::ReadOnly, "r3", None),
        Err(Refusal::DataBoundary)
    );
    assert_eq!(
        Regions::new().admits(&key(), ConnTraffic::ReadOnly, "r2", None),
        Err(Refusal::NoPolicy)
    );
}
