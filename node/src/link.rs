//! The agent's side of its arbiter link, sans-IO: when to try again after
//! a session ends (exponential backoff with full jitter), when to renew
//! the node lease, which health verdicts to send again after a
//! (re)connect, and what the agent makes of its zone's gossip down
//! verdicts (which to report to the arbiter, which nodes to keep out of
//! routing, R4 and R7).
//!
//! The agent drives it with the wall clock and its thread rng; the fleet
//! simulation (`rollcall chaos sim`) drives the same code on a virtual
//! clock with its seeded rng.

use std::collections::{BTreeMap, BTreeSet};

use rand::{Rng, RngExt};
use rollcall_leases::{AgentEpoch, NodeId, State};

/// A session that lasted longer than this (ms) resets the backoff.
pub const BACKOFF_RESET_MS: u64 = 10_000;

/// Reconnect delays: full jitter over an exponentially growing cap, from
/// `reconnect_min_ms` up to `reconnect_max_ms`, so 5,000 agents that lost
/// the arbiter together do not come back together.
#[derive(Clone, Debug)]
pub struct Backoff {
    min_ms: u64,
    max_ms: u64,
    failures: u32,
}

impl Backoff {
    /// Backoff between `min_ms` and `max_ms`.
    pub fn new(min_ms: u64, max_ms: u64) -> Self {
        Backoff {
            min_ms,
            max_ms,
            failures: 0,
        }
    }

    /// An attempt ended after `lasted_ms` (0 for one that never got a
    /// session): how long to wait before the next, ms.
    pub fn next_wait<R: Rng + ?Sized>(&mut self, lasted_ms: u64, rng: &mut R) -> u64 {
        if lasted_ms > BACKOFF_RESET_MS {
            self.failures = 0;
        }
        let cap = self
            .max_ms
            .min(self.min_ms.saturating_mul(1 << self.failures.min(20)));
        self.failures = self.failures.saturating_add(1);
        rng.random_range(0..=cap)
    }

    /// Attempts that failed since the last session that lasted.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

/// How long after a renewal (or the Welcome) the next renewal goes, ms:
/// a third of the lease's time to live, less up to a tenth of that at
/// random, so two renewals can be lost before the lease ends.
pub fn renew_after_ms<R: Rng + ?Sized>(ttl_ms: u64, rng: &mut R) -> u64 {
    (ttl_ms / 3).saturating_sub(rng.random_range(0..=ttl_ms / 30))
}

/// Whether, after a (re)connect, the agent sends its instance's health
/// verdict `wanted` again, the catalog holding `in_catalog` for it: a
/// verdict reached while the arbiter was away, or a down verdict that
/// marked the instance while its node was away. Not while the instance
/// starts, not for one the catalog does not list, and not while a write of
/// its state is already pending.
pub fn resend_health(wanted: State, in_catalog: Option<State>, pending: bool) -> bool {
    wanted != State::Starting && in_catalog.is_some_and(|c| c != wanted) && !pending
}

/// The agent's gossip down verdicts on its zone's peers.
///
/// Every verdict is reported to the arbiter, which removes the node only
/// when its own session with it is silent too (R4). Locally a node gossip
/// holds down stays out of routing while the arbiter is unreachable (R7),
/// and, with a session up, until the arbiter has answered its report in
/// this session: right after an outage the catalog has not caught up
/// with a crash gossip saw during it. A report the arbiter commits keeps
/// the node out until gossip sees it again.
#[derive(Clone, Debug, Default)]
pub struct DownVerdicts {
    down: BTreeMap<NodeId, AgentEpoch>,
    settled: BTreeSet<NodeId>,
}

impl DownVerdicts {
    /// Gossip declared `node` (run `epoch`) down: report it.
    pub fn down(&mut self, node: NodeId, epoch: AgentEpoch) {
        self.settled.remove(&node);
        self.down.insert(node, epoch);
    }

    /// Gossip sees `node` again; whether it was held down.
    pub fn up(&mut self, node: &NodeId) -> bool {
        self.settled.remove(node);
        self.down.remove(node).is_some()
    }

    /// The arbiter refused `node`'s down report (it still hears the node:
    /// a partition inside the zone): the catalog decides its routing
    /// again. A committed verdict settles nothing: its delta may reach
    /// the view after the answer.
    pub fn settled(&mut self, node: NodeId) {
        if self.down.contains_key(&node) {
            self.settled.insert(node);
        }
    }

    /// The session ended: answers of the old session no longer count.
    pub fn disconnected(&mut self) {
        self.settled.clear();
    }

    /// Every verdict to report after a (re)connect: the arbiter still
    /// checks its own silence.
    pub fn to_report(&self) -> Vec<(NodeId, AgentEpoch)> {
        self.down.iter().map(|(n, e)| (n.clone(), *e)).collect()
    }

    /// The nodes to keep out of routing here, with or without a session.
    pub fn excluded(&self, connected: bool) -> BTreeSet<NodeId> {
        self.down
            .keys()
            .filter(|n| !connected || !self.settled.contains(*n))
            .cloned()
            .collect()
    }

    /// The nodes held down.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeId> {
        self.down.keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn node(n: &str) -> NodeId {
        NodeId::new(n).expect("valid")
    }

    #[test]
    fn backoff_doubles_up_to_its_cap_and_resets_after_a_session_that_lasted() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut b = Backoff::new(100, 1_000);
        let mut caps = Vec::new();
        for _ in 0..6 {
            // The most a wait can be: sample many times from a clone.
            let most = (0..200)
                .map(|_| b.clone().next_wait(0, &mut rng))
                .max()
                .unwrap_or(0);
            caps.push(most);
            b.next_wait(0, &mut rng);
        }
        assert!(caps[0] <= 100 && caps[1] <= 200 && caps[2] <= 400 && caps[3] <= 800);
        assert!(caps[4] <= 1_000 && caps[5] <= 1_000);
        assert!(caps[3] > 400, "the cap grows: {caps:?}");
        assert_eq!(b.failures(), 6);
        let wait = b.next_wait(BACKOFF_RESET_MS + 1, &mut rng);
        assert!(wait <= 100, "a session that lasted starts over: {wait}");
        assert_eq!(b.failures(), 1);
    }

    #[test]
    fn renewals_come_a_third_of_the_ttl_less_some_jitter() {
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..100 {
            let after = renew_after_ms(30_000, &mut rng);
            assert!((9_000..=10_000).contains(&after), "{after}");
        }
    }

    #[test]
    fn health_is_sent_again_only_where_the_catalog_differs() {
        assert!(resend_health(State::Ready, Some(State::Unhealthy), false));
        assert!(resend_health(State::Unhealthy, Some(State::Ready), false));
        assert!(!resend_health(State::Ready, Some(State::Ready), false));
        assert!(!resend_health(State::Starting, Some(State::Ready), false));
        assert!(!resend_health(State::Ready, None, false));
        assert!(!resend_health(State::Ready, Some(State::Unhealthy), true));
    }

    #[test]
    fn a_down_node_stays_out_until_the_arbiter_answers_in_this_session() {
        let mut d = DownVerdicts::default();
        d.down(node("b"), AgentEpoch(3));
        assert_eq!(d.excluded(false), BTreeSet::from([node("b")]));
        assert_eq!(d.excluded(true), BTreeSet::from([node("b")]));
        assert_eq!(d.to_report(), vec![(node("b"), AgentEpoch(3))]);
        d.settled(node("b"));
        assert!(d.excluded(true).is_empty(), "answered: the catalog decides");
        assert_eq!(d.excluded(false).len(), 1, "cut off: gossip decides");
        d.disconnected();
        assert_eq!(d.excluded(true).len(), 1, "a new session asks again");
        assert!(d.up(&node("b")));
        assert!(d.excluded(false).is_empty());
        // An answer for a node no longer held down is not kept.
        d.settled(node("c"));
        d.down(node("c"), AgentEpoch(1));
        assert_eq!(d.excluded(true).len(), 1);
    }
}
