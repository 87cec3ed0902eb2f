//! The agent's catalog sync (R6, R7), sans-IO: which services it follows,
//! the view it holds of each, and what to tell the arbiter after each
//! update. The driver feeds it connection events and updates, with the time
//! as a value, and carries out the `SyncOut`s (subscribe, ack, persist).
//!
//! Every delta is checked against the held revision and the announced
//! digest (`ServiceView::apply`); a gap or a mismatch asks for a snapshot of
//! that one service and keeps serving the previous view meanwhile.
//! Deltas the view already holds (the arbiter re-sends what it has not seen
//! acknowledged) are skipped, and re-acknowledged when nothing else is new.

use std::collections::BTreeMap;
use std::sync::Arc;

use rollcall_leases::codec::decode_service_snapshot;
use rollcall_leases::protocol::ServiceUpdate;
use rollcall_leases::{CatalogId, Revision, ServiceKey, ServiceView, ShardId, ViewError};

/// What the driver must do after a sync step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncOut {
    /// Subscribe (again) holding `have` (`None`: send a snapshot).
    Subscribe {
        /// The service.
        service: ServiceKey,
        /// The revision held.
        have: Option<Revision>,
    },
    /// Acknowledge what was applied.
    Ack {
        /// The service.
        service: ServiceKey,
        /// The revision applied.
        revision: Revision,
    },
    /// Write the service's view to the disk cache.
    Persist(ServiceKey),
    /// Delete the service's cache file (the arbiter says it does not exist).
    Forget(ServiceKey),
    /// Subscribe again after this many milliseconds plus jitter (the
    /// arbiter's snapshot bound, or a lagging replica).
    RetryLater {
        /// The service.
        service: ServiceKey,
        /// The wait the arbiter asked for.
        base_ms: u64,
    },
}

/// What the agent knows of one followed service.
#[derive(Clone, Debug)]
pub struct Tracked {
    /// The held view; `None` until the first snapshot or delta. Shared
    /// copy-on-write: a copy handed to the disk cache costs a pointer, and
    /// the next delta copies the view only if that write still holds it.
    pub view: Option<Arc<ServiceView>>,
    /// The arbiter said the service does not exist.
    pub unknown: bool,
    /// This session confirmed the view is current (cleared on disconnect).
    pub synced: bool,
    /// When the view was last known current (ms); `None` if never.
    pub confirmed_at_ms: Option<u64>,
    /// The arbiter refused the watch (its `watch_rules`), with the reason.
    pub denied: Option<String>,
    /// The catalog the view came from (`None`: unknown, from a cache file
    /// written before catalogs had identities, or from an arbiter whose
    /// catalog had none yet).
    pub catalog: Option<CatalogId>,
}

/// Why [`CatalogSync::connected`] dropped a held view instead of resuming
/// it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Discard {
    /// The view came from another catalog than the arbiter's (a rebuilt or
    /// restored arbiter group, or another region's).
    OtherCatalog,
    /// The view is at a revision the arbiter's catalog has not reached,
    /// and nothing says they are the same catalog.
    AheadOfArbiter,
}

impl Discard {
    /// The metric label and log word.
    pub fn as_str(self) -> &'static str {
        match self {
            Discard::OtherCatalog => "other_catalog",
            Discard::AheadOfArbiter => "ahead_of_arbiter",
        }
    }
}

/// Counters for metrics and the status endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncStats {
    /// Deltas applied.
    pub deltas_applied: u64,
    /// Snapshots applied.
    pub snapshots_applied: u64,
    /// Gaps found in a service's revision chain.
    pub gaps: u64,
    /// Digest mismatches after applying a delta.
    pub digest_mismatches: u64,
    /// Snapshots that did not decode or did not check.
    pub bad_snapshots: u64,
    /// Held views dropped at a session start: of another catalog.
    pub discarded_other_catalog: u64,
    /// Held views dropped at a session start: ahead of the arbiter.
    pub discarded_ahead: u64,
}

/// Every followed service.
#[derive(Debug)]
pub struct CatalogSync {
    shard: ShardId,
    services: BTreeMap<ServiceKey, Tracked>,
    connected: bool,
    /// The catalog of the current (or last) session's arbiter.
    catalog: Option<CatalogId>,
    stats: SyncStats,
}

impl CatalogSync {
    /// Nothing followed yet.
    pub fn new(shard: ShardId) -> Self {
        CatalogSync {
            shard,
            services: BTreeMap::new(),
            connected: false,
            catalog: None,
            stats: SyncStats::default(),
        }
    }

    /// Serves a view loaded from the disk cache (filled from `catalog`),
    /// marked stale until the arbiter confirms it (R7).
    pub fn load_cached(&mut self, view: ServiceView, catalog: Option<CatalogId>) {
        let service = view.service().clone();
        self.services.insert(
            service,
            Tracked {
                view: Some(Arc::new(view)),
                unknown: false,
                synced: false,
                confirmed_at_ms: None,
                denied: None,
                catalog,
            },
        );
    }

    /// Starts following `service`; subscribes at once when connected.
    /// Returns `false` if it was already followed.
    pub fn follow(&mut self, service: ServiceKey, out: &mut Vec<SyncOut>) -> bool {
        if self.services.contains_key(&service) {
            return false;
        }
        self.services.insert(
            service.clone(),
            Tracked {
                view: None,
                unknown: false,
                synced: false,
                confirmed_at_ms: None,
                denied: None,
                catalog: None,
            },
        );
        if self.connected {
            out.push(SyncOut::Subscribe {
                service,
                have: None,
            });
        }
        true
    }

    /// Stops following `service`, forgetting what is held of it; `false`
    /// if it was not followed.
    pub fn unfollow(&mut self, service: &ServiceKey) -> bool {
        self.services.remove(service).is_some()
    }

    /// A session started with an arbiter of `catalog` at `revision`:
    /// subscribe to everything, each holding what it has. A view of
    /// another catalog, or one ahead of the arbiter's revision without a
    /// matching catalog, is dropped (no longer served, its cache file
    /// forgotten) and fetched anew by snapshot; those are returned.
    pub fn connected(
        &mut self,
        catalog: Option<CatalogId>,
        revision: Revision,
        out: &mut Vec<SyncOut>,
    ) -> Vec<(ServiceKey, Discard)> {
        self.connected = true;
        self.catalog = catalog;
        let mut discarded = Vec::new();
        for (service, t) in &mut self.services {
            let held = t.view.as_ref().filter(|v| v.exists()).map(|v| v.revision());
            let discard = match (held, t.catalog, catalog) {
                (None, ..) => None,
                (Some(_), Some(mine), Some(theirs)) => {
                    (mine != theirs).then_some(Discard::OtherCatalog)
                }
                (Some(held), ..) => (held > revision).then_some(Discard::AheadOfArbiter),
            };
            let have = match discard {
                Some(why) => {
                    t.view = None;
                    t.unknown = false;
                    t.synced = false;
                    t.confirmed_at_ms = None;
                    t.catalog = None;
                    out.push(SyncOut::Forget(service.clone()));
                    match why {
                        Discard::OtherCatalog => self.stats.discarded_other_catalog += 1,
                        Discard::AheadOfArbiter => self.stats.discarded_ahead += 1,
                    }
                    discarded.push((service.clone(), why));
                    None
                }
                None => held,
            };
            out.push(SyncOut::Subscribe {
                service: service.clone(),
                have,
            });
        }
        discarded
    }

    /// The session ended: every view is stale from now on.
    pub fn disconnected(&mut self, now_ms: u64) {
        self.connected = false;
        for t in self.services.values_mut() {
            if t.synced {
                t.confirmed_at_ms = Some(now_ms);
            }
            t.synced = false;
        }
    }

    /// Subscribes again after a `RetryLater` wait.
    pub fn retry(&mut self, service: &ServiceKey, out: &mut Vec<SyncOut>) {
        if let (true, Some(t)) = (self.connected, self.services.get(service)) {
            out.push(SyncOut::Subscribe {
                service: service.clone(),
                have: t.view.as_ref().filter(|v| v.exists()).map(|v| v.revision()),
            });
        }
    }

    /// Applies one update from the arbiter.
    pub fn update(&mut self, update: ServiceUpdate, now_ms: u64, out: &mut Vec<SyncOut>) {
        let catalog = self.catalog;
        match update {
            ServiceUpdate::Deltas(deltas) => {
                let Some(service) = deltas.first().map(|d| d.service.clone()) else {
                    return;
                };
                let Some(t) = self.services.get_mut(&service) else {
                    return;
                };
                let view = Arc::make_mut(t.view.get_or_insert_with(|| {
                    Arc::new(ServiceView::empty(service.clone(), self.shard))
                }));
                let held = view.revision();
                let fresh: Vec<_> = deltas.iter().filter(|d| d.revision > held).collect();
                if fresh.is_empty() {
                    out.push(SyncOut::Ack {
                        service,
                        revision: held,
                    });
                    return;
                }
                for delta in fresh {
                    if let Err(e) = view.apply(delta) {
                        match e {
                            ViewError::Gap { .. } | ViewError::WrongService { .. } => {
                                self.stats.gaps += 1
                            }
                            ViewError::DigestMismatch { .. } => self.stats.digest_mismatches += 1,
                        }
                        tracing::warn!(service = %service, error = %e, "delta refused; taking a snapshot of this service");
                        t.synced = false;
                        out.push(SyncOut::Subscribe {
                            service,
                            have: None,
                        });
                        return;
                    }
                    self.stats.deltas_applied += 1;
                }
                let revision = view.revision();
                t.unknown = !view.exists();
                Self::confirmed(t, catalog, now_ms);
                out.push(SyncOut::Ack {
                    service: service.clone(),
                    revision,
                });
                out.push(if t.unknown {
                    SyncOut::Forget(service)
                } else {
                    SyncOut::Persist(service)
                });
            }
            ServiceUpdate::Snapshot(bytes) => {
                let view = decode_service_snapshot(&bytes)
                    .map_err(|e| e.to_string())
                    .and_then(|snap| ServiceView::from_snapshot(&snap).map_err(|e| e.to_string()));
                match view {
                    Ok(view) => {
                        let service = view.service().clone();
                        let Some(t) = self.services.get_mut(&service) else {
                            return;
                        };
                        let revision = view.revision();
                        t.view = Some(Arc::new(view));
                        t.unknown = false;
                        Self::confirmed(t, catalog, now_ms);
                        self.stats.snapshots_applied += 1;
                        out.push(SyncOut::Ack {
                            service: service.clone(),
                            revision,
                        });
                        out.push(SyncOut::Persist(service));
                    }
                    Err(e) => {
                        // The service it was for cannot be trusted either:
                        // the bytes are bad. Keep serving what we hold.
                        self.stats.bad_snapshots += 1;
                        tracing::warn!(error = %e, "a snapshot from the arbiter did not check; ignored");
                    }
                }
            }
            ServiceUpdate::Current { service, .. } => {
                if let Some(t) = self.services.get_mut(&service) {
                    Self::confirmed(t, catalog, now_ms);
                }
            }
            ServiceUpdate::Unknown { service } => {
                if let Some(t) = self.services.get_mut(&service) {
                    t.view = None;
                    t.unknown = true;
                    Self::confirmed(t, catalog, now_ms);
                    out.push(SyncOut::Forget(service));
                }
            }
            ServiceUpdate::Denied { service, reason } => {
                if let Some(t) = self.services.get_mut(&service) {
                    tracing::warn!(service = %service, reason = %reason, "the arbiter refused this watch");
                    t.denied = Some(reason);
                }
            }
            ServiceUpdate::RetryAfter { service, ms } => out.push(SyncOut::RetryLater {
                service,
                base_ms: ms,
            }),
            ServiceUpdate::NotYet { service, .. } => out.push(SyncOut::RetryLater {
                service,
                base_ms: 200,
            }),
        }
    }

    fn confirmed(t: &mut Tracked, catalog: Option<CatalogId>, now_ms: u64) {
        t.synced = true;
        t.catalog = catalog;
        t.denied = None;
        t.confirmed_at_ms = Some(now_ms);
    }

    /// What is known of one service.
    pub fn get(&self, service: &ServiceKey) -> Option<&Tracked> {
        self.services.get(service)
    }

    /// Every followed service, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&ServiceKey, &Tracked)> {
        self.services.iter()
    }

    /// The catalog of the current (or last) session's arbiter.
    pub fn catalog(&self) -> Option<CatalogId> {
        self.catalog
    }

    /// Counters.
    pub fn stats(&self) -> &SyncStats {
        &self.stats
    }
}

impl Tracked {
    /// How old the held view is: 0 while this session keeps it current,
    /// else the time since it was last known current (or since it was
    /// loaded from the cache, when it never was).
    pub fn age_ms(&self, now_ms: u64, loaded_at_ms: u64) -> u64 {
        if self.synced {
            0
        } else {
            now_ms.saturating_sub(self.confirmed_at_ms.unwrap_or(loaded_at_ms))
        }
    }
}

#[cfg(test)]
mod tests {
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
        let snap = rollcall_leases::codec::shared_service_snapshot(
            &cat.service_snapshot(&svc("a")).unwrap(),
        );
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
}
