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
use rollcall_leases::{Revision, ServiceKey, ServiceView, ShardId, ViewError};

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
}

/// Every followed service.
#[derive(Debug)]
pub struct CatalogSync {
    shard: ShardId,
    services: BTreeMap<ServiceKey, Tracked>,
    connected: bool,
    stats: SyncStats,
}

impl CatalogSync {
    /// Nothing followed yet.
    pub fn new(shard: ShardId) -> Self {
        CatalogSync {
            shard,
            services: BTreeMap::new(),
            connected: false,
            stats: SyncStats::default(),
        }
    }

    /// Serves a view loaded from the disk cache, marked stale until the
    /// arbiter confirms it (R7).
    pub fn load_cached(&mut self, view: ServiceView) {
        let service = view.service().clone();
        self.services.insert(
            service,
            Tracked {
                view: Some(Arc::new(view)),
                unknown: false,
                synced: false,
                confirmed_at_ms: None,
                denied: None,
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

    /// A session started: subscribe to everything, each holding what it has.
    pub fn connected(&mut self, out: &mut Vec<SyncOut>) {
        self.connected = true;
        for (service, t) in &self.services {
            out.push(SyncOut::Subscribe {
                service: service.clone(),
                have: t.view.as_ref().filter(|v| v.exists()).map(|v| v.revision()),
            });
        }
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
                Self::confirmed(t, now_ms);
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
                        Self::confirmed(t, now_ms);
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
                    Self::confirmed(t, now_ms);
                }
            }
            ServiceUpdate::Unknown { service } => {
                if let Some(t) = self.services.get_mut(&service) {
                    t.view = None;
                    t.unknown = true;
                    Self::confirmed(t, now_ms);
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

    fn confirmed(t: &mut Tracked, now_ms: u64) {
        t.synced = true;
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

    /// Two followed services, both synced from the catalog's deltas.
    fn setup() -> (Catalog, CatalogSync) {
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
        register(&mut cat, "a1", "a");
        register(&mut cat, "b1", "b");
        let mut sync = CatalogSync::new(ShardId(0));
        let mut out = Vec::new();
        sync.follow(svc("a"), &mut out);
        sync.follow(svc("b"), &mut out);
        sync.connected(&mut out);
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
        sync.connected(&mut out);
        assert!(
            out.iter()
                .all(|o| matches!(o, SyncOut::Subscribe { have: Some(_), .. })),
            "reconnects resume by delta: {out:?}"
        );
    }
}
