//! Policies, replicated policies, summaries and single writers' epochs
//! (split from the catalog's tests along their seam).

use super::*;

fn policy(service: &str, home: &str) -> Policy {
    let mut doc = rollcall_config::ServicePolicy::new(service, home);
    doc.cross_region = true;
    doc.failover_order = vec!["r3".into()];
    Policy::new(doc).unwrap()
}

fn policy_key(s: &str) -> PolicyKey {
    s.parse().unwrap()
}

#[test]
fn a_policy_takes_a_revision_and_setting_it_again_changes_nothing() {
    let mut w = World::new();
    let applied = w
        .run(Command::SetPolicy(Box::new(policy("shop/cart", "r1"))))
        .unwrap();
    assert_eq!(applied.effect, Effect::PolicyChanged);
    assert_eq!(applied.revision, Some(Revision(1)));
    assert!(applied.services.is_empty(), "a policy touches no record");
    let stored = w.cat.policy(&policy_key("shop/cart")).unwrap();
    assert_eq!(stored.revision, Revision(1));
    assert_eq!(stored.set_by.to_string(), "operator:ops");

    let again = w
        .run(Command::SetPolicy(Box::new(policy("shop/cart", "r1"))))
        .unwrap();
    assert_eq!((again.effect, again.revision), (Effect::Unchanged, None));

    let mut changed = policy("shop/cart", "r1").document().clone();
    changed.cross_region = false;
    let applied = w
        .run(Command::SetPolicy(Box::new(Policy::new(changed).unwrap())))
        .unwrap();
    assert_eq!(applied.revision, Some(Revision(2)));
    assert_eq!(
        w.cat.policy(&policy_key("shop/cart")).unwrap().revision,
        Revision(2)
    );
}

#[test]
fn only_the_home_region_changes_a_policy() {
    let mut w = World::new();
    let before = w.snapshot();
    let err = w
        .run(Command::SetPolicy(Box::new(policy("shop/cart", "r2"))))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the policy of shop/cart has home region r2; only region r2's arbiter accepts changes to it, and this arbiter serves region r1"
    );
    assert_eq!(w.snapshot(), before, "a refused policy changes nothing");
    assert_eq!(w.cat.revision(), Revision(0));
}

#[test]
fn a_policy_is_deleted_once() {
    let mut w = World::new();
    w.run(Command::SetPolicy(Box::new(policy("shop/cart", "r1"))))
        .unwrap();
    let applied = w
        .run(Command::DeletePolicy {
            service: policy_key("shop/cart"),
        })
        .unwrap();
    assert_eq!(applied.revision, Some(Revision(2)));
    assert!(w.cat.policy(&policy_key("shop/cart")).is_none());
    assert!(matches!(
        w.run(Command::DeletePolicy {
            service: policy_key("shop/cart"),
        }),
        Err(Rejection::UnknownPolicy { .. })
    ));
}

#[test]
fn policies_survive_a_snapshot_and_old_snapshots_still_decode() {
    let mut w = World::new();
    zone_of(&mut w, "z1", 2);
    let without = w.snapshot();
    w.run(Command::SetPolicy(Box::new(policy("shop/cart", "r1"))))
        .unwrap();
    w.run(Command::SetPolicy(Box::new(policy("shop/web", "r1"))))
        .unwrap();
    let snap = w.cat.export();
    assert_eq!(snap.policies.len(), 2);
    let decoded =
        crate::codec::decode_catalog_snapshot(&crate::codec::encode_catalog_snapshot(&snap))
            .unwrap();
    assert_eq!(decoded, snap);
    let back = Catalog::import(params(), decoded).unwrap();
    assert_eq!(back.export(), snap);
    assert_eq!(
        back.policy(&policy_key("shop/web")).unwrap().revision,
        w.cat.revision()
    );

    // A snapshot written before policies existed: frame kind 4, the same
    // body without the trailing policy lists, identity and writer epochs
    // (here two empty lists, no identity and no epoch, one byte each);
    // before replicated policies: kind 11, without the last three; before
    // identities: kind 12, without the last two; before writer epochs:
    // kind 13, without the last.
    for (kind, trailing) in [(4u8, 4), (11, 3), (12, 2), (13, 1)] {
        let mut old = without.clone();
        old[1] = kind;
        for _ in 0..trailing {
            assert_eq!(old.pop(), Some(0));
        }
        let decoded = crate::codec::decode_catalog_snapshot(&old).unwrap();
        assert!(decoded.replicated_policies.is_empty());
        assert_eq!(decoded.identity, None);
        assert_eq!(crate::codec::encode_catalog_snapshot(&decoded), without);
    }
}

#[test]
fn the_first_identity_committed_is_the_catalogs_for_good_and_survives_a_snapshot() {
    let mut w = World::new();
    assert_eq!(w.cat.identity(), None);
    let first = crate::CatalogId(0x0123_4567_89ab_cdef);
    let applied = w.run(Command::Identify { catalog: first }).unwrap();
    assert_eq!(applied.effect, Effect::Identified);
    assert!(applied.revision.is_some());
    // A second leader's late proposal changes nothing.
    let again = w
        .run(Command::Identify {
            catalog: crate::CatalogId(7),
        })
        .unwrap();
    assert_eq!((again.effect, again.revision), (Effect::Unchanged, None));
    assert_eq!(w.cat.identity(), Some(first));
    let snap = w.cat.export();
    let decoded =
        crate::codec::decode_catalog_snapshot(&crate::codec::encode_catalog_snapshot(&snap))
            .unwrap();
    assert_eq!(decoded.identity, Some(first));
    let back = Catalog::import(params(), decoded).unwrap();
    assert_eq!(back.identity(), Some(first));
    assert_eq!(first.to_string(), "0123456789abcdef");
    assert_eq!(crate::CatalogId::parse("0123456789abcdef"), Some(first));
    assert_eq!(crate::CatalogId::parse("0123"), None);
}

fn remote(service: &str, home: &str, home_revision: u64) -> Box<RemotePolicy> {
    Box::new(RemotePolicy {
        policy: policy(service, home),
        home_revision: Revision(home_revision),
        home_set_at_ms: 5,
    })
}

#[test]
fn a_replicated_policy_keeps_its_home_revision_and_never_goes_back() {
    let mut w = World::new();
    let applied = w
        .run(Command::ReplicatePolicy(remote("shop/cart", "r2", 40)))
        .unwrap();
    assert_eq!(applied.effect, Effect::PolicyChanged);
    let held = w.cat.replicated_policy(&policy_key("shop/cart")).unwrap();
    assert_eq!(held.remote.home_revision, Revision(40));
    assert_eq!(held.revision, Revision(1));
    assert!(w.cat.policy(&policy_key("shop/cart")).is_none());

    // The same version again, or an older one, changes nothing.
    for older in [40, 39] {
        let again = w
            .run(Command::ReplicatePolicy(remote("shop/cart", "r2", older)))
            .unwrap();
        assert_eq!((again.effect, again.revision), (Effect::Unchanged, None));
    }
    w.run(Command::ReplicatePolicy(remote("shop/cart", "r2", 41)))
        .unwrap();
    assert_eq!(
        w.cat
            .replicated_policy(&policy_key("shop/cart"))
            .unwrap()
            .remote
            .home_revision,
        Revision(41)
    );

    // Dropped only by its home, at or after the version held.
    let drop = |home: &str, rev: u64| Command::DropReplicatedPolicy {
        service: policy_key("shop/cart"),
        home: label(home),
        home_revision: Revision(rev),
    };
    for (home, rev) in [("r3", 50), ("r2", 40)] {
        let kept = w.run(drop(home, rev)).unwrap();
        assert_eq!(kept.effect, Effect::Unchanged, "{home} {rev}");
    }
    assert_eq!(w.run(drop("r2", 45)).unwrap().effect, Effect::PolicyChanged);
    assert!(w.cat.replicated_policy(&policy_key("shop/cart")).is_none());
}

#[test]
fn local_changes_never_override_a_replicated_policy() {
    let mut w = World::new();
    w.run(Command::ReplicatePolicy(remote("shop/cart", "r2", 40)))
        .unwrap();
    let before = w.snapshot();
    let set = w
        .run(Command::SetPolicy(Box::new(policy("shop/cart", "r1"))))
        .unwrap_err();
    assert!(
        matches!(&set, Rejection::NotHomeRegion { home, .. } if home.as_str() == "r2"),
        "{set}"
    );
    let delete = w
        .run(Command::DeletePolicy {
            service: policy_key("shop/cart"),
        })
        .unwrap_err();
    assert!(
        matches!(delete, Rejection::NotHomeRegion { .. }),
        "{delete}"
    );
    // A third region's version of the same service is a home conflict.
    let other = w
        .run(Command::ReplicatePolicy(remote("shop/cart", "r4", 99)))
        .unwrap_err();
    assert!(matches!(other, Rejection::HomeConflict { .. }), "{other}");
    // A bridge never replicates a policy homed here, nor over one.
    let here = w
        .run(Command::ReplicatePolicy(remote("shop/web", "r1", 1)))
        .unwrap_err();
    assert!(matches!(here, Rejection::HomeHere { .. }), "{here}");
    assert_eq!(w.snapshot(), before, "refusals change nothing");
    w.run(Command::SetPolicy(Box::new(policy("shop/web", "r1"))))
        .unwrap();
    let over = w
        .run(Command::ReplicatePolicy(remote("shop/web", "r2", 7)))
        .unwrap_err();
    assert!(matches!(over, Rejection::HomeConflict { .. }), "{over}");
}

#[test]
fn replicated_policies_survive_a_snapshot() {
    let mut w = World::new();
    w.run(Command::SetPolicy(Box::new(policy("shop/web", "r1"))))
        .unwrap();
    w.run(Command::ReplicatePolicy(remote("shop/cart", "r2", 40)))
        .unwrap();
    let snap = w.cat.export();
    assert_eq!(snap.replicated_policies.len(), 1);
    let decoded =
        crate::codec::decode_catalog_snapshot(&crate::codec::encode_catalog_snapshot(&snap))
            .unwrap();
    assert_eq!(decoded, snap);
    let back = Catalog::import(params(), decoded).unwrap();
    assert_eq!(back.export(), snap);

    // Imported into its home region, it would be a second home: refused.
    let mut p = params();
    p.region = label("r2");
    let mut only_remote = snap.clone();
    only_remote.policies.clear();
    let err = Catalog::import(p, only_remote).unwrap_err();
    assert!(err.to_string().contains("own region r2"), "{err}");
}

#[test]
fn ready_summaries_count_ready_records_and_their_weight() {
    let mut w = World::new();
    zone_of(&mut w, "z1", 2);
    let rows = w.cat.ready_summaries();
    assert!(!rows.is_empty());
    for row in rows {
        let records = w.cat.records(&row.service).unwrap();
        let ready: Vec<_> = records.iter().filter(|r| r.state.is_routable()).collect();
        assert_eq!(row.ready, ready.len());
        assert_eq!(
            row.ready_weight,
            ready.iter().map(|r| u64::from(r.weight.get())).sum::<u64>()
        );
        assert_eq!(row.revision, w.cat.service(&row.service).unwrap().revision);
    }
}

#[test]
fn import_refuses_a_policy_of_another_home() {
    let mut w = World::new();
    w.run(Command::SetPolicy(Box::new(policy("shop/cart", "r1"))))
        .unwrap();
    let snap = w.cat.export();
    let mut p = params();
    p.region = label("r2");
    let err = Catalog::import(p, snap).unwrap_err();
    assert!(err.to_string().contains("home region r1"), "{err}");
}

fn single_writer(service: &str) -> Policy {
    let mut doc = rollcall_config::ServicePolicy::new(service, "r1");
    doc.cross_region = true;
    doc.failover_traffic = rollcall_config::TrafficClass::All;
    doc.failover_order = vec!["r2".into(), "r3".into()];
    doc.single_writer = Some(rollcall_config::SingleWriter {
        owner: "r1".into(),
        transfer_to: None,
    });
    Policy::new(doc).unwrap()
}

fn transfer(service: &str, to: &str, forced: Option<&str>) -> Command {
    Command::TransferWriter(Box::new(crate::writer::Transfer {
        service: policy_key(service),
        to: label(to),
        forced: forced.map(|r| Reason::new(r).unwrap()),
    }))
}

#[test]
fn a_transfer_commits_the_next_writer_epoch_which_survives_a_snapshot() {
    let mut w = World::new();
    w.run(Command::SetPolicy(Box::new(single_writer("shop/ledger"))))
        .unwrap();
    let first = w.cat.writer(&policy_key("shop/ledger")).unwrap();
    assert_eq!(
        (first.epoch, first.owner.as_str(), first.settled),
        (1, "r1", true)
    );

    // r1 owns the writes: its transfer moves them, unsettled until r2
    // confirms.
    let applied = w.run(transfer("shop/ledger", "r2", None)).unwrap();
    assert_eq!(
        applied.effect,
        Effect::WriterChanged {
            epoch: 2,
            settled: false
        }
    );
    let moving = w.cat.writer(&policy_key("shop/ledger")).unwrap();
    assert_eq!((moving.epoch, moving.owner.as_str()), (2, "r2"));
    assert_eq!(moving.writer(), None);
    // A second transfer waits for the first; a late copy of epoch 1 or
    // the same epoch changes nothing.
    let err = w.run(transfer("shop/ledger", "r3", None)).unwrap_err();
    assert!(err.to_string().contains("has not confirmed yet"), "{err}");
    let again = w
        .run(Command::ReplicateWriter(Box::new(moving.clone())))
        .unwrap();
    assert_eq!(again.effect, Effect::Unchanged);

    // r2's confirmation (its settled copy) comes back through the bridge.
    let mut settled = moving.clone();
    settled.settled = true;
    settled.committed_in = label("r2");
    let applied = w
        .run(Command::ReplicateWriter(Box::new(settled.clone())))
        .unwrap();
    assert!(matches!(
        applied.effect,
        Effect::WriterChanged {
            epoch: 2,
            settled: true
        }
    ));
    // r1 no longer owns the writes.
    let err = w.run(transfer("shop/ledger", "r1", None)).unwrap_err();
    assert!(err.to_string().contains("owned by region r2"), "{err}");

    let snap = w.cat.export();
    assert_eq!(snap.writers.len(), 1);
    let decoded =
        crate::codec::decode_catalog_snapshot(&crate::codec::encode_catalog_snapshot(&snap))
            .unwrap();
    assert_eq!(decoded, snap);
    let back = Catalog::import(params(), decoded).unwrap();
    assert_eq!(back.writer(&policy_key("shop/ledger")), Some(settled));
}

#[test]
fn a_forced_transfer_is_committed_by_another_region_and_wins_when_the_owner_returns() {
    // r2, the owner r1 cut off: forced.
    let mut p = params();
    p.region = label("r2");
    let mut r2 = World::new();
    r2.cat = Catalog::new(p);
    let replicated = Box::new(RemotePolicy {
        policy: single_writer("shop/ledger"),
        home_revision: Revision(3),
        home_set_at_ms: 5,
    });
    r2.run(Command::ReplicatePolicy(replicated)).unwrap();
    let err = r2.run(transfer("shop/ledger", "r2", None)).unwrap_err();
    assert!(err.to_string().contains("--force --reason"), "{err}");
    r2.run(transfer("shop/ledger", "r2", Some("r1 cut off")))
        .unwrap();
    let forced = r2.cat.writer(&policy_key("shop/ledger")).unwrap();
    assert_eq!((forced.epoch, forced.settled), (2, true));
    let audit = crate::audit::AuditEntry::describe(
        &Envelope {
            at_ms: 9,
            actor: forced.by.clone(),
            command: transfer("shop/ledger", "r2", Some("r1 cut off")),
        },
        &Applied {
            revision: Some(Revision(9)),
            effect: Effect::WriterChanged {
                epoch: 2,
                settled: true,
            },
            services: Vec::new(),
        },
    )
    .unwrap();
    assert!(audit.detail.contains("FORCED"), "{}", audit.detail);

    // r1 meanwhile moved the writes to r3 on its own (epoch 2, moving);
    // when the bridges meet, the forced epoch wins in r1 and never goes
    // back.
    let mut r1 = World::new();
    r1.run(Command::SetPolicy(Box::new(single_writer("shop/ledger"))))
        .unwrap();
    r1.run(transfer("shop/ledger", "r3", None)).unwrap();
    r1.run(Command::ReplicateWriter(Box::new(forced.clone())))
        .unwrap();
    assert_eq!(
        r1.cat.writer(&policy_key("shop/ledger")),
        Some(forced.clone())
    );
    let own = r1.cat.writer(&policy_key("shop/ledger")).unwrap();
    let mut stale = own.clone();
    stale.epoch = 1;
    let unchanged = r1.run(Command::ReplicateWriter(Box::new(stale))).unwrap();
    assert_eq!(unchanged.effect, Effect::Unchanged);
}
