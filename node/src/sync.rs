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
mod tests;
