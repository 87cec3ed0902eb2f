//! Failover to another region (R9), sans-IO: what the agent holds of
//! regions (the arbiter's `Regions` messages: policies of the followed
//! services, other regions' summaries, ingress addresses and ages), and the
//! decision for one connection whose service has no usable local endpoint.
//!
//! A connection moves only when the service's policy allows cross-region
//! traffic of its kind, and then to the first region of the policy's
//! `failover_order` that is fresh (its view younger than its limit), has
//! READY capacity for the service, declared an ingress, and has room under
//! its capacity limit; otherwise the answer is "no backend" with the
//! reason. The data boundary is checked again here although a valid policy
//! never lists a bounded region for failover. No region's instances are
//! ever marked anything here: a remote region is only ever a summary.
//!
//! Capacity limits: `capacity_limits[region]` is the most of the target's
//! READY capacity (summed weight) this service's region may send there.
//! Every agent estimates the region's demand the same way, as the highest
//! READY weight the service had in this region within `DEMAND_WINDOW_MS`,
//! so each sends the share `limit × target weight ÷ demand` (at most all)
//! of its failed-over connections to that region and spills the rest to
//! the next, in a deterministic even spread (golden-ratio sequence). A
//! service that never had local capacity here has no demand estimate and
//! is not limited.
//!
//! Ages use the agent's clock only: the arbiter says how old each view was
//! when it sent it, and the agent adds the time since, so a view it stops
//! hearing about (the arbiter or the bridge cut off) ages out by itself.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rollcall_config::{ConnTraffic, StaleBehaviour, TrafficClass};
use rollcall_leases::{
    HeldPolicy, Ingress, Label, PolicyKey, Principal, PrincipalName, RegionEntry, RegionsUpdate,
    Role, ServiceKey, ServiceSummary, WriterEpoch,
};

/// How far back the demand estimate looks for the service's highest local
/// READY weight, ms: longer than a deploy or an incident takes to empty it.
pub const DEMAND_WINDOW_MS: u64 = 600_000;

/// Why a connection did not move to another region. The labels are the
/// `reason` of `rollcall_agent_failover_refusals_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refusal {
    /// The service has no policy here (the default is no cross-region
    /// traffic).
    NoPolicy,
    /// Its policy does not allow cross-region traffic.
    CrossRegionOff,
    /// Its policy moves read-only traffic only, and this is read-write.
    ReadOnlyPolicy,
    /// A single-writer service's writes go only to its writer region (the
    /// writer epoch this agent holds), and this is not it.
    SingleWriter,
    /// A single-writer service's writes are moving to another region
    /// (a transfer committed, not yet confirmed by the new owner): they go
    /// nowhere until it is.
    WriterMoving,
    /// A write came through the ingress stamped with another writer epoch
    /// than this region holds: one of the two copies is behind.
    WriterEpoch,
    /// No region in the failover order is known fresh.
    Stale,
    /// The fresh regions have no READY capacity for the service.
    NoCapacity,
    /// The regions with capacity are over their capacity limit.
    CapacityLimit,
    /// The regions with capacity declared no ingress address.
    NoIngress,
    /// A region is in the data boundary.
    DataBoundary,
    /// This agent's copy of the service is past its maximum age and its
    /// staleness behaviour is `degrade`: the failover targets a stale copy
    /// names are not acted on.
    StaleCopy,
}

impl Refusal {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NoPolicy => "no_policy",
            Refusal::CrossRegionOff => "cross_region_off",
            Refusal::ReadOnlyPolicy => "read_only_policy",
            Refusal::SingleWriter => "single_writer",
            Refusal::WriterMoving => "writer_moving",
            Refusal::WriterEpoch => "writer_epoch",
            Refusal::Stale => "stale",
            Refusal::NoCapacity => "no_capacity",
            Refusal::CapacityLimit => "capacity_limit",
            Refusal::NoIngress => "no_ingress",
            Refusal::DataBoundary => "data_boundary",
            Refusal::StaleCopy => "stale_copy",
        }
    }

    /// In words, for logs and API answers.
    pub fn describe(self) -> &'static str {
        match self {
            Refusal::NoPolicy => "the service has no policy, so its traffic stays in this region",
            Refusal::CrossRegionOff => "the service's policy does not allow cross-region traffic",
            Refusal::ReadOnlyPolicy => "the service's policy moves read-only traffic only",
            Refusal::SingleWriter => "the service has a single writer and its writes go only to the writer region of its writer epoch",
            Refusal::WriterMoving => "the service's writes are moving to another region and the new owner has not confirmed yet",
            Refusal::WriterEpoch => "the write was stamped with another writer epoch than this region holds",
            Refusal::Stale => "no region in the failover order has a fresh summary",
            Refusal::NoCapacity => "no fresh region in the failover order has READY capacity for the service",
            Refusal::CapacityLimit => "the regions with capacity are at their capacity limit",
            Refusal::NoIngress => "the regions with capacity declared no ingress address",
            Refusal::DataBoundary => "the only candidate regions are inside the data boundary",
            Refusal::StaleCopy => "this agent's copy of the service is past its maximum age (degrade), so the failover targets it names are not acted on",
        }
    }
}

/// Where a connection goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// To another region's ingress.
    Remote {
        /// The region.
        region: Label,
        /// Its ingress addresses (at least one).
        ingress: Vec<Ingress>,
        /// Its READY instances of the service.
        ready: u32,
    },
    /// Nowhere: "no backend".
    Refused(Refusal),
}

/// One region as the agent holds it.
#[derive(Clone, Debug)]
struct Held {
    entry: RegionEntry,
    /// When it arrived, by the agent's clock (ms).
    received_at_ms: u64,
}

impl Held {
    fn age_ms(&self, now_ms: u64) -> u64 {
        self.entry
            .age_ms
            .saturating_add(now_ms.saturating_sub(self.received_at_ms))
    }

    fn fresh(&self, now_ms: u64) -> bool {
        self.age_ms(now_ms) <= self.entry.max_age_ms
    }

    /// Its summary of `service` when the service has READY capacity there.
    fn ready_summary(&self, service: &ServiceKey) -> Option<&ServiceSummary> {
        self.entry
            .summaries
            .iter()
            .find(|s| &s.service == service)
            .filter(|s| s.ready > 0 && s.weight > 0)
    }
}

/// What the agent holds of regions: the policies of the services it
/// follows and the other regions' views. Each service's own failover
/// memory is its [`Spread`].
#[derive(Clone, Debug, Default)]
pub struct Regions {
    policies: BTreeMap<PolicyKey, HeldPolicy>,
    /// Writer epochs of the followed single-writer services.
    writers: BTreeMap<PolicyKey, WriterEpoch>,
    regions: BTreeMap<Label, Held>,
    updates: u64,
    /// The last message with its ages zeroed (what "changed" compares).
    last: Option<RegionsUpdate>,
}

/// One region as `GET /v1/regions` shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RegionStatus {
    /// The region.
    pub region: Label,
    /// How old its view is now, ms.
    pub age_ms: u64,
    /// Past this it counts as unknown, ms.
    pub max_age_ms: u64,
    /// Whether it is within that limit (a possible failover target).
    pub fresh: bool,
    /// Its catalog revision the view is complete up to.
    pub version: u64,
    /// Its edge gateways.
    pub ingress: Vec<Ingress>,
    /// Its summaries of the services this agent follows.
    pub summaries: Vec<rollcall_leases::ServiceSummary>,
}

impl Regions {
    /// Nothing known.
    pub fn new() -> Self {
        Regions::default()
    }

    /// The arbiter's message, replacing what was held. Answers whether
    /// anything but the ages changed (what the agent persists).
    pub fn update(&mut self, update: RegionsUpdate, now_ms: u64) -> bool {
        let unaged = |u: &RegionsUpdate| {
            let mut u = u.clone();
            u.regions.iter_mut().for_each(|r| r.age_ms = 0);
            u
        };
        let changed = self
            .last
            .as_ref()
            .is_none_or(|last| *last != unaged(&update));
        self.last = Some(unaged(&update));
        self.updates += 1;
        self.policies = update
            .policies
            .into_iter()
            .map(|p| (p.policy.key().clone(), p))
            .collect();
        self.writers = update
            .writers
            .into_iter()
            .map(|w| (w.service.clone(), w))
            .collect();
        self.regions = update
            .regions
            .into_iter()
            .map(|entry| {
                (
                    entry.region.clone(),
                    Held {
                        entry,
                        received_at_ms: now_ms,
                    },
                )
            })
            .collect();
        changed
    }

    /// Regions messages applied since start.
    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// The policy of `service`, if one is held.
    pub fn policy(&self, service: &ServiceKey) -> Option<&HeldPolicy> {
        self.policies.get(&PolicyKey {
            namespace: service.namespace.clone(),
            service: service.service.clone(),
        })
    }

    /// Every policy held.
    pub fn policies(&self) -> impl Iterator<Item = &HeldPolicy> {
        self.policies.values()
    }

    /// The staleness settings the service's policy overrides, if any.
    pub fn staleness(&self, service: &ServiceKey) -> (Option<u64>, Option<StaleBehaviour>) {
        self.policy(service).map_or((None, None), |p| {
            let d = p.policy.document();
            (d.max_snapshot_age_ms, d.stale_behaviour)
        })
    }

    /// The writer epoch of `service` as this agent holds it: the epoch the
    /// arbiter sent, else (an arbiter of an earlier release) its policy's
    /// first owner; `None` when it has no single writer.
    pub fn writer(&self, service: &ServiceKey) -> Option<WriterEpoch> {
        let key = PolicyKey {
            namespace: service.namespace.clone(),
            service: service.service.clone(),
        };
        if let Some(held) = self.writers.get(&key) {
            return Some(held.clone());
        }
        let policy = &self.policies.get(&key)?.policy;
        let arbiter = Principal {
            role: Role::Arbiter,
            name: PrincipalName::new(policy.home_region().as_str()).ok()?,
        };
        WriterEpoch::first(policy, 0, &arbiter)
    }

    /// Where a `traffic` connection of `service` goes when its writes
    /// belong elsewhere (README, "Single writer"): `None` when the service
    /// has no single writer, the connection is read-only, or this region
    /// (`here`) is the writer of the epoch held, so local endpoints serve
    /// it. Otherwise the writer region's ingress, or nowhere (while the
    /// writes are moving, or when the writer region cannot be reached by
    /// the policy's rules).
    pub fn writes_elsewhere(
        &self,
        service: &ServiceKey,
        traffic: ConnTraffic,
        here: &str,
        now_ms: u64,
    ) -> Option<Decision> {
        if traffic != ConnTraffic::ReadWrite {
            return None;
        }
        let writer = self.writer(service)?;
        let Some(owner) = writer.writer() else {
            return Some(Decision::Refused(Refusal::WriterMoving));
        };
        if owner.as_str() == here {
            return None;
        }
        let doc = self.policy(service)?.policy.document();
        let refused = |r| Some(Decision::Refused(r));
        if !doc.cross_region {
            return refused(Refusal::CrossRegionOff);
        }
        if doc.failover_traffic == TrafficClass::ReadOnly {
            return refused(Refusal::ReadOnlyPolicy);
        }
        if doc.data_boundary.iter().any(|r| r == owner.as_str()) {
            return refused(Refusal::DataBoundary);
        }
        let Some(region) = self.regions.get(owner).filter(|r| r.fresh(now_ms)) else {
            return refused(Refusal::Stale);
        };
        let Some(summary) = region.ready_summary(service) else {
            return refused(Refusal::NoCapacity);
        };
        if region.entry.ingress.is_empty() {
            return refused(Refusal::NoIngress);
        }
        Some(Decision::Remote {
            region: owner.clone(),
            ingress: region.entry.ingress.clone(),
            ready: summary.ready,
        })
    }

    /// Every region held, with its age at `now_ms`.
    pub fn status(&self, now_ms: u64) -> Vec<RegionStatus> {
        self.regions
            .values()
            .map(|h| RegionStatus {
                region: h.entry.region.clone(),
                age_ms: h.age_ms(now_ms),
                max_age_ms: h.entry.max_age_ms,
                fresh: h.fresh(now_ms),
                version: h.entry.version.get(),
                ingress: h.entry.ingress.clone(),
                summaries: h.entry.summaries.clone(),
            })
            .collect()
    }

    /// Where a `traffic` connection of `service` goes, its local endpoints
    /// being unusable, at `now_ms`; `spread` is the service's own failover
    /// memory, advanced when a connection is decided.
    pub fn decide(
        &self,
        service: &ServiceKey,
        traffic: ConnTraffic,
        now_ms: u64,
        spread: &Spread,
    ) -> Decision {
        let Some(held) = self.policy(service) else {
            return Decision::Refused(Refusal::NoPolicy);
        };
        let doc = held.policy.document().clone();
        if !doc.cross_region {
            return Decision::Refused(Refusal::CrossRegionOff);
        }
        let writes = traffic == ConnTraffic::ReadWrite;
        if writes && doc.failover_traffic == TrafficClass::ReadOnly {
            return Decision::Refused(Refusal::ReadOnlyPolicy);
        }
        let demand = spread.demand(now_ms);
        let n = spread.next.fetch_add(1, Ordering::Relaxed);
        // An even spread in [0, 1): the n-th point of the golden-ratio
        // sequence.
        let mut u = (n as f64 * 0.618_033_988_749_894_9).fract();
        let mut best = Refusal::Stale;
        for name in &doc.failover_order {
            let refusal = 'region: {
                if doc.data_boundary.contains(name) {
                    break 'region Refusal::DataBoundary;
                }
                if writes {
                    match self.writer(service).as_ref().map(WriterEpoch::writer) {
                        None => {}
                        Some(None) => return Decision::Refused(Refusal::WriterMoving),
                        Some(Some(writer)) if writer.as_str() == name => {}
                        Some(Some(_)) => break 'region Refusal::SingleWriter,
                    }
                }
                let Some(region) = Label::new(name).ok().and_then(|l| self.regions.get(&l)) else {
                    break 'region Refusal::Stale;
                };
                if !region.fresh(now_ms) {
                    break 'region Refusal::Stale;
                }
                let Some(summary) = region.ready_summary(service) else {
                    break 'region Refusal::NoCapacity;
                };
                if region.entry.ingress.is_empty() {
                    break 'region Refusal::NoIngress;
                }
                let share = if demand == 0 {
                    1.0
                } else {
                    (doc.capacity_limit(name) * summary.weight as f64 / demand as f64).min(1.0)
                };
                if u < share {
                    return Decision::Remote {
                        region: region.entry.region.clone(),
                        ingress: region.entry.ingress.clone(),
                        ready: summary.ready,
                    };
                }
                // This connection spills to the next region, whose own
                // share applies to what is left.
                u = if share < 1.0 {
                    (u - share) / (1.0 - share)
                } else {
                    0.0
                };
                Refusal::CapacityLimit
            };
            best = best.max_by_rank(refusal);
        }
        Decision::Refused(best)
    }

    /// Whether this region (`here`) takes `traffic` connections of
    /// `service` from other regions at its ingress: the service's policy
    /// must allow them into `here`. `Err` says why not.
    pub fn admits(
        &self,
        service: &ServiceKey,
        traffic: ConnTraffic,
        here: &str,
        epoch: Option<u64>,
    ) -> Result<(), Refusal> {
        let held = self.policy(service).ok_or(Refusal::NoPolicy)?;
        let doc = held.policy.document();
        if !doc.cross_region {
            return Err(Refusal::CrossRegionOff);
        }
        if doc.data_boundary.iter().any(|r| r == here)
            || !doc.failover_order.iter().any(|r| r == here)
        {
            return Err(Refusal::DataBoundary);
        }
        if traffic == ConnTraffic::ReadWrite {
            if doc.failover_traffic == TrafficClass::ReadOnly {
                return Err(Refusal::ReadOnlyPolicy);
            }
            if let Some(writer) = self.writer(service) {
                match writer.writer() {
                    None => return Err(Refusal::WriterMoving),
                    Some(owner) if owner.as_str() != here => return Err(Refusal::SingleWriter),
                    Some(_) if epoch.is_some_and(|e| e != writer.epoch) => {
                        return Err(Refusal::WriterEpoch)
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(())
    }
}

/// One service's failover memory: its demand estimate (the highest local
/// READY weight within `DEMAND_WINDOW_MS`, noted at every lookup) and its
/// place in the even spread of failed-over connections. Atomics, so the
/// data plane notes and reads it without a lock; each field is exact on
/// its own, and two threads racing on one lookup can only differ on which
/// of two equal-time observations stays.
#[derive(Debug, Default)]
pub struct Spread {
    seen: AtomicBool,
    weight: AtomicU64,
    at_ms: AtomicU64,
    next: AtomicU64,
}

impl Spread {
    /// Notes the service's READY weight in this region at `now_ms`.
    pub fn observe_local(&self, ready_weight: u64, now_ms: u64) {
        let seen = self.seen.load(Ordering::Relaxed);
        if ready_weight == 0 && !seen {
            return;
        }
        let (weight, at) = (
            self.weight.load(Ordering::Relaxed),
            self.at_ms.load(Ordering::Relaxed),
        );
        let expired = now_ms.saturating_sub(at) > DEMAND_WINDOW_MS;
        if !seen || ready_weight > weight || expired || (ready_weight == weight && now_ms > at) {
            self.weight.store(ready_weight, Ordering::Relaxed);
            self.at_ms.store(now_ms, Ordering::Relaxed);
            self.seen.store(true, Ordering::Relaxed);
        }
    }

    /// The demand estimate at `now_ms` (0: none within the window).
    pub fn demand(&self, now_ms: u64) -> u64 {
        let fresh = self.seen.load(Ordering::Relaxed)
            && now_ms.saturating_sub(self.at_ms.load(Ordering::Relaxed)) <= DEMAND_WINDOW_MS;
        if fresh {
            self.weight.load(Ordering::Relaxed)
        } else {
            0
        }
    }
}

trait Rank {
    fn max_by_rank(self, other: Self) -> Self;
}

impl Rank for Refusal {
    /// The more telling of two region refusals: the one closest to
    /// succeeding (a limit beats no capacity beats stale).
    fn max_by_rank(self, other: Refusal) -> Refusal {
        let rank = |r: Refusal| match r {
            Refusal::CapacityLimit => 5,
            Refusal::NoIngress => 4,
            Refusal::NoCapacity => 3,
            Refusal::SingleWriter => 2,
            Refusal::WriterMoving => 2,
            Refusal::Stale => 1,
            _ => 0,
        };
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}

#[cfg(test)]
mod tests;
