//! The shared endpoint view (R7, R8): from a service's catalog records, the
//! agent's local drains and its local ejections, which endpoints callers may
//! be sent to now, and in which mode. The proxy, DNS and the resolve API all
//! ask this one view, so ejection, protection and panic behave the same on
//! all three paths.
//!
//! Sans-IO: time comes in as a value. The rules:
//! - Candidates are READY records not drained locally and not ejected.
//!   DRAINING and STARTING records are never candidates, in any mode.
//! - Confirmed-dead records (EXPIRED, or UNHEALTHY by a two-signal node
//!   down verdict: [`EndpointRecord::confirmed_dead`]) and records on nodes
//!   this agent's gossip holds down during an outage are not known
//!   endpoints at all: never candidates, in any mode, and not counted by
//!   the two rules below. A caller never waits on connect timeouts to a
//!   dead zone.
//! - Empty-set protection: when doubtful verdicts (readiness probes, a
//!   process exit: UNHEALTHY by the endpoint's own agent) empty the READY
//!   set, the last non-empty set's doubted records are kept ("protected").
//!   Deliberate drains and deregistrations are never protected.
//! - Panic: when candidates are fewer than `panic_threshold` of the known
//!   records that are neither leaving on purpose, starting, nor confirmed
//!   dead, all of those are used ("panic"): a probe storm or a bad check
//!   that marks most of a fleet UNHEALTHY keeps the traffic flowing.
//! - Ejection: consecutive connect failures eject an endpoint from this
//!   agent's view for a time that doubles with each repeat, never more than
//!   `max_ejection_percent` of the READY set at once. Passive signals stay
//!   local: they never reach the catalog.
//! - Slow start: a newly READY endpoint's weight ramps up over
//!   `slow_start_ms`.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use rollcall_config::DataPlaneConfig;
use rollcall_leases::{EndpointRecord, Generation, InstanceId, NodeId, State};

/// How the view is serving a service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// READY endpoints.
    Normal,
    /// Empty-set protection holds the last non-empty READY set.
    Protected,
    /// Too few healthy endpoints: every known non-draining one is used.
    Panic,
}

impl Mode {
    /// The name in the resolve answer.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Normal => "normal",
            Mode::Protected => "protected",
            Mode::Panic => "panic",
        }
    }
}

/// One endpoint callers may be sent to.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// Its catalog record.
    pub record: Arc<EndpointRecord>,
    /// Its weight now, after slow start (record weight × ramp, at least 1 %).
    pub weight: f64,
}

/// The endpoints of a service right now.
#[derive(Clone, Debug, PartialEq)]
pub struct Selection {
    /// How they were chosen.
    pub mode: Mode,
    /// The endpoints, in instance id order.
    pub candidates: Vec<Candidate>,
}

impl Selection {
    /// Whether any candidate is READY. Without one, every candidate is
    /// held by protection or panic on a doubtful verdict, and a region the
    /// service's policy allows is preferred to them (as a lower priority
    /// level takes the traffic in Envoy): the proxy, DNS and the resolve
    /// API ask for a failover first and fall back to these only when it is
    /// refused.
    pub fn holds_ready(&self) -> bool {
        self.candidates
            .iter()
            .any(|c| c.record.state == State::Ready)
    }
}

#[derive(Clone, Debug, Default)]
struct Ejection {
    failures: u32,
    until_ms: Option<u64>,
    times: u32,
}

/// What the view remembers of one service between lookups.
#[derive(Debug, Default)]
pub struct ServiceMemory {
    /// When each (instance, generation) was first seen READY, for slow start.
    ready_since: HashMap<(InstanceId, Generation), u64>,
    /// The last non-empty READY set.
    last_ready: Vec<InstanceId>,
    ejections: HashMap<InstanceId, Ejection>,
}

impl ServiceMemory {
    /// Computes the selection from the service's records (any order).
    /// `locally_leaving` are instances this agent drained or deregistered
    /// and the arbiter may not have committed yet; `down_nodes` are nodes
    /// this agent's gossip holds down, given only while the arbiter is
    /// unreachable (R7): their endpoints are ejected locally. Neither they
    /// nor confirmed-dead records count as known endpoints (module doc).
    pub fn select(
        &mut self,
        records: &[Arc<EndpointRecord>],
        locally_leaving: &BTreeSet<InstanceId>,
        down_nodes: &BTreeSet<NodeId>,
        now_ms: u64,
        p: &DataPlaneConfig,
    ) -> Selection {
        let usable = |r: &&Arc<EndpointRecord>| {
            !locally_leaving.contains(&r.instance_id)
                && !down_nodes.contains(&r.node_id)
                && !matches!(r.state, State::Draining | State::Starting)
                && !r.confirmed_dead()
        };
        let mut pool: Vec<&Arc<EndpointRecord>> = records.iter().filter(usable).collect();
        pool.sort_by(|a, b| a.instance_id.cmp(&b.instance_id));
        let ready: Vec<&Arc<EndpointRecord>> = pool
            .iter()
            .copied()
            .filter(|r| r.state == State::Ready)
            .collect();

        // Slow-start memory follows the READY set.
        self.ready_since.retain(|(id, g), _| {
            ready
                .iter()
                .any(|r| &r.instance_id == id && r.generation == *g)
        });
        for r in &ready {
            self.ready_since
                .entry((r.instance_id.clone(), r.generation))
                .or_insert(now_ms);
        }
        for e in self.ejections.values_mut() {
            if e.until_ms.is_some_and(|t| now_ms >= t) {
                e.until_ms = None;
            }
        }
        if !ready.is_empty() {
            self.last_ready = ready.iter().map(|r| r.instance_id.clone()).collect();
        }
        let ejected = |r: &&Arc<EndpointRecord>| {
            self.ejections
                .get(&r.instance_id)
                .is_some_and(|e| e.until_ms.is_some())
        };
        let healthy: Vec<&Arc<EndpointRecord>> =
            ready.iter().copied().filter(|r| !ejected(r)).collect();

        let (mode, chosen): (Mode, Vec<&Arc<EndpointRecord>>) = if ready.is_empty()
            && p.empty_set_protection
            && !self.last_ready.is_empty()
        {
            // Held only for records taken out by a doubtful verdict (the
            // pool holds no confirmed-dead record); drained or
            // deregistered ones left on purpose.
            let held: Vec<&Arc<EndpointRecord>> = pool
                .iter()
                .copied()
                .filter(|r| self.last_ready.contains(&r.instance_id) && r.state == State::Unhealthy)
                .collect();
            if held.is_empty() {
                (Mode::Normal, Vec::new())
            } else {
                (Mode::Protected, held)
            }
        } else if !pool.is_empty() && (healthy.len() as f64) < p.panic_threshold * pool.len() as f64
        {
            (Mode::Panic, pool.clone())
        } else {
            (Mode::Normal, healthy)
        };
        let candidates = chosen
            .into_iter()
            .map(|r| {
                let ramp = match (
                    p.slow_start_ms,
                    self.ready_since.get(&(r.instance_id.clone(), r.generation)),
                ) {
                    (0, _) | (_, None) => 1.0,
                    (window, Some(since)) => {
                        (now_ms.saturating_sub(*since) as f64 / window as f64).clamp(0.01, 1.0)
                    }
                };
                Candidate {
                    record: r.clone(),
                    weight: f64::from(r.weight.get()) * ramp,
                }
            })
            .collect();
        Selection { mode, candidates }
    }

    /// A connect to `id` failed. Returns true when this ejected it.
    pub fn connect_failed(
        &mut self,
        id: &InstanceId,
        ready_count: usize,
        now_ms: u64,
        p: &DataPlaneConfig,
    ) -> bool {
        let ejected_now = self
            .ejections
            .values()
            .filter(|e| e.until_ms.is_some_and(|t| now_ms < t))
            .count();
        let e = self.ejections.entry(id.clone()).or_default();
        if e.until_ms.is_some_and(|t| now_ms < t) {
            return false;
        }
        e.failures += 1;
        let cap = (ready_count * p.max_ejection_percent as usize) / 100;
        if e.failures < p.consecutive_failures || ejected_now + 1 > cap.max(1).min(ready_count) {
            return false;
        }
        let time = p
            .base_ejection_ms
            .saturating_mul(1 << e.times.min(20))
            .min(p.max_ejection_ms);
        e.until_ms = Some(now_ms + time);
        e.times += 1;
        e.failures = 0;
        true
    }

    /// A connect to `id` succeeded: its failure count starts over.
    pub fn connect_succeeded(&mut self, id: &InstanceId) {
        if let Some(e) = self.ejections.get_mut(id) {
            e.failures = 0;
        }
    }

    /// Forgets the local ejections of `ids` (and their ejection counts):
    /// the agent learned that their connect failures were the path's, not
    /// theirs (their node's gossip came back after a partition).
    pub fn lift<'a>(&mut self, ids: impl IntoIterator<Item = &'a InstanceId>) {
        for id in ids {
            self.ejections.remove(id);
        }
    }

    /// When the next ejection ends after `now_ms`, if one is running: the
    /// selection changes then.
    pub fn next_expiry(&self, now_ms: u64) -> Option<u64> {
        self.ejections
            .values()
            .filter_map(|e| e.until_ms)
            .filter(|t| *t > now_ms)
            .min()
    }

    /// Instances with a failed connect counted since their last success.
    pub fn failing(&self) -> usize {
        self.ejections.values().filter(|e| e.failures > 0).count()
    }

    /// Instances ejected now.
    pub fn ejected(&self, now_ms: u64) -> usize {
        self.ejections
            .values()
            .filter(|e| e.until_ms.is_some_and(|t| now_ms < t))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use rollcall_leases::{
        AgentEpoch, Label, LeaseId, Liveness, NodeId, Principal, PrincipalName, Reason, Revision,
        Role, Version, Weight,
    };

    use super::*;

    fn record(id: &str, state: State) -> Arc<EndpointRecord> {
        Arc::new(EndpointRecord {
            instance_id: InstanceId::new(id).unwrap(),
            generation: Generation(1),
            node_id: NodeId::new("n1").unwrap(),
            epoch: AgentEpoch(1),
            lease: LeaseId(1),
            address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 80,
            region: Label::new("r1").unwrap(),
            zone: Label::new("z1").unwrap(),
            version: Version::new("v1").unwrap(),
            weight: Weight::DEFAULT,
            labels: Vec::new(),
            state,
            reason: Reason::new("t").unwrap(),
            origin: Principal {
                role: Role::Agent,
                name: PrincipalName::new("n1").unwrap(),
            },
            liveness: Liveness::Unknown,
            revision: Revision(1),
            changed_at_ms: 0,
        })
    }

    fn params() -> DataPlaneConfig {
        DataPlaneConfig {
            slow_start_ms: 0,
            ..DataPlaneConfig::default()
        }
    }

    fn ids(s: &Selection) -> Vec<&str> {
        s.candidates
            .iter()
            .map(|c| c.record.instance_id.as_str())
            .collect()
    }

    #[test]
    fn only_ready_records_not_drained_locally_are_candidates() {
        let mut m = ServiceMemory::default();
        let records = vec![
            record("a", State::Ready),
            record("b", State::Ready),
            record("c", State::Starting),
            record("d", State::Draining),
            record("e", State::Ready),
        ];
        let leaving = BTreeSet::from([InstanceId::new("e").unwrap()]);
        let s = m.select(&records, &leaving, &BTreeSet::new(), 0, &params());
        assert_eq!((s.mode, ids(&s)), (Mode::Normal, vec!["a", "b"]));
    }

    /// A record on node `node` that a down verdict reported by `reporter`
    /// (another node's agent) made UNHEALTHY.
    fn down_verdict(id: &str, node: &str, reporter: &str) -> Arc<EndpointRecord> {
        let mut r = (*record(id, State::Unhealthy)).clone();
        r.node_id = NodeId::new(node).unwrap();
        r.origin = Principal {
            role: Role::Agent,
            name: PrincipalName::new(reporter).unwrap(),
        };
        Arc::new(r)
    }

    #[test]
    fn doubtful_failures_emptying_the_set_are_held_but_drains_are_not() {
        let mut m = ServiceMemory::default();
        let p = params();
        m.select(
            &[record("a", State::Ready), record("b", State::Ready)],
            &BTreeSet::new(),
            &BTreeSet::new(),
            0,
            &p,
        );
        let s = m.select(
            &[record("a", State::Unhealthy), record("b", State::Unhealthy)],
            &BTreeSet::new(),
            &BTreeSet::new(),
            1,
            &p,
        );
        assert_eq!((s.mode, ids(&s)), (Mode::Protected, vec!["a", "b"]));
        // A deliberate drain of the last one is never held back.
        let mut m = ServiceMemory::default();
        m.select(
            &[record("a", State::Ready)],
            &BTreeSet::new(),
            &BTreeSet::new(),
            0,
            &p,
        );
        let s = m.select(
            &[record("a", State::Draining)],
            &BTreeSet::new(),
            &BTreeSet::new(),
            1,
            &p,
        );
        assert_eq!((s.mode, ids(&s)), (Mode::Normal, Vec::<&str>::new()));
    }

    #[test]
    fn panic_routes_across_known_non_draining_endpoints() {
        let mut m = ServiceMemory::default();
        let records = vec![
            record("a", State::Ready),
            record("b", State::Unhealthy),
            record("c", State::Unhealthy),
            record("d", State::Draining),
        ];
        let s = m.select(&records, &BTreeSet::new(), &BTreeSet::new(), 0, &params());
        assert_eq!(
            (s.mode, ids(&s)),
            (Mode::Panic, vec!["a", "b", "c"]),
            "1 of 3 healthy is below 50 %"
        );
        let records = vec![
            record("a", State::Ready),
            record("b", State::Ready),
            record("c", State::Unhealthy),
        ];
        let s = m.select(&records, &BTreeSet::new(), &BTreeSet::new(), 0, &params());
        assert_eq!(s.mode, Mode::Normal);
    }

    #[test]
    fn confirmed_deaths_are_never_protected_nor_counted_for_panic() {
        let p = params();
        // Six of nine endpoints on nodes declared down by two signals, one
        // expired: the two READY ones left are the whole known set, so no
        // panic, and the dead are never candidates.
        let mut records: Vec<_> = (0..6)
            .map(|k| down_verdict(&format!("d{k}"), &format!("n{}", k + 2), "n9"))
            .collect();
        records.push(record("e", State::Expired));
        records.push(record("r1", State::Ready));
        records.push(record("r2", State::Ready));
        let mut m = ServiceMemory::default();
        let s = m.select(&records, &BTreeSet::new(), &BTreeSet::new(), 0, &p);
        assert_eq!((s.mode, ids(&s)), (Mode::Normal, vec!["r1", "r2"]));
        // Every endpoint of the service dies with its node: nothing is held,
        // the answer is empty (callers get "no backend" at once).
        let mut m = ServiceMemory::default();
        m.select(
            &[record("a", State::Ready), record("b", State::Ready)],
            &BTreeSet::new(),
            &BTreeSet::new(),
            0,
            &p,
        );
        let s = m.select(
            &[down_verdict("a", "n2", "n3"), record("b", State::Expired)],
            &BTreeSet::new(),
            &BTreeSet::new(),
            1,
            &p,
        );
        assert_eq!((s.mode, ids(&s)), (Mode::Normal, Vec::<&str>::new()));
        // A readiness failure by the endpoint's own agent is a doubt: the
        // same shares of UNHEALTHY records still panic.
        let mut doubted: Vec<_> = (0..6)
            .map(|k| record(&format!("u{k}"), State::Unhealthy))
            .collect();
        doubted.push(record("r1", State::Ready));
        doubted.push(record("r2", State::Ready));
        let mut m = ServiceMemory::default();
        let s = m.select(&doubted, &BTreeSet::new(), &BTreeSet::new(), 0, &p);
        assert_eq!(s.mode, Mode::Panic);
        assert_eq!(s.candidates.len(), 8);
    }

    #[test]
    fn ejection_after_consecutive_failures_grows_and_is_capped() {
        let mut m = ServiceMemory::default();
        let p = params();
        let records: Vec<_> = ["a", "b", "c", "d"]
            .iter()
            .map(|i| record(i, State::Ready))
            .collect();
        let a = InstanceId::new("a").unwrap();
        assert!(!m.connect_failed(&a, 4, 0, &p));
        assert!(!m.connect_failed(&a, 4, 0, &p));
        assert!(
            m.connect_failed(&a, 4, 0, &p),
            "third consecutive failure ejects"
        );
        assert_eq!(
            ids(&m.select(&records, &BTreeSet::new(), &BTreeSet::new(), 1, &p)),
            vec!["b", "c", "d"]
        );
        assert_eq!(
            ids(&m.select(
                &records,
                &BTreeSet::new(),
                &BTreeSet::new(),
                p.base_ejection_ms,
                &p
            )),
            vec!["a", "b", "c", "d"],
            "back after the ejection time"
        );
        for _ in 0..3 {
            m.connect_failed(&a, 4, p.base_ejection_ms, &p);
        }
        assert_eq!(
            ids(&m.select(
                &records,
                &BTreeSet::new(),
                &BTreeSet::new(),
                3 * p.base_ejection_ms - 1,
                &p
            )),
            vec!["b", "c", "d"],
            "second ejection lasts twice as long"
        );
        // At most 50 % of 4: a second one, but never a third at once.
        let (b, c) = (InstanceId::new("b").unwrap(), InstanceId::new("c").unwrap());
        for _ in 0..3 {
            m.connect_failed(&b, 4, p.base_ejection_ms, &p);
        }
        for _ in 0..3 {
            assert!(!m.connect_failed(&c, 4, p.base_ejection_ms, &p));
        }
        assert_eq!(m.ejected(p.base_ejection_ms), 2);
    }

    #[test]
    fn lifting_an_ejection_readmits_at_once_and_forgets_its_growth() {
        let mut m = ServiceMemory::default();
        let p = params();
        let records: Vec<_> = ["a", "b", "c", "d"]
            .iter()
            .map(|i| record(i, State::Ready))
            .collect();
        let a = InstanceId::new("a").unwrap();
        for at in [0, p.base_ejection_ms] {
            for _ in 0..3 {
                m.connect_failed(&a, 4, at, &p);
            }
        }
        assert_eq!(m.ejected(p.base_ejection_ms + 1), 1, "ejected twice");
        m.lift([&a]);
        assert_eq!(m.ejected(p.base_ejection_ms + 1), 0);
        assert_eq!(
            ids(&m.select(
                &records,
                &BTreeSet::new(),
                &BTreeSet::new(),
                p.base_ejection_ms + 1,
                &p
            )),
            vec!["a", "b", "c", "d"]
        );
        // A new ejection starts from the base time again.
        for _ in 0..3 {
            m.connect_failed(&a, 4, 10 * p.base_ejection_ms, &p);
        }
        assert_eq!(m.ejected(11 * p.base_ejection_ms - 1), 1);
        assert_eq!(
            m.ejected(11 * p.base_ejection_ms),
            0,
            "base time, not doubled"
        );
    }

    #[test]
    fn endpoints_on_nodes_gossip_holds_down_are_ejected_locally() {
        let mut m = ServiceMemory::default();
        let mut b = (*record("b", State::Ready)).clone();
        b.node_id = NodeId::new("n2").unwrap();
        let records = vec![record("a", State::Ready), Arc::new(b)];
        let down = BTreeSet::from([NodeId::new("n2").unwrap()]);
        let s = m.select(&records, &BTreeSet::new(), &down, 0, &params());
        assert_eq!(ids(&s), vec!["a"]);
    }

    #[test]
    fn a_success_resets_the_failure_count() {
        let mut m = ServiceMemory::default();
        let p = params();
        let a = InstanceId::new("a").unwrap();
        m.connect_failed(&a, 4, 0, &p);
        m.connect_failed(&a, 4, 0, &p);
        m.connect_succeeded(&a);
        assert!(!m.connect_failed(&a, 4, 0, &p));
    }

    #[test]
    fn slow_start_ramps_the_weight() {
        let mut m = ServiceMemory::default();
        let p = DataPlaneConfig {
            slow_start_ms: 10_000,
            ..DataPlaneConfig::default()
        };
        let records = vec![record("a", State::Ready)];
        m.select(&records, &BTreeSet::new(), &BTreeSet::new(), 1_000, &p);
        let s = m.select(&records, &BTreeSet::new(), &BTreeSet::new(), 6_000, &p);
        assert!(
            (s.candidates[0].weight - 50.0).abs() < 1e-9,
            "{}",
            s.candidates[0].weight
        );
        let s = m.select(&records, &BTreeSet::new(), &BTreeSet::new(), 20_000, &p);
        assert!((s.candidates[0].weight - 100.0).abs() < 1e-9);
    }
}
