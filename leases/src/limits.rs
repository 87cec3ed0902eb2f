//! Rate and count limits per identity, connection or source address
//! (issue 20, R10), sans-IO: token buckets and counts that take "now" as
//! a value (ms on any monotonic origin the driver chooses). The arbiter's
//! connection driver and admin endpoint apply them (`[limits]` in the
//! arbiter file); which limit was hit is named by `Limit` in metrics and
//! refusals.
//!
//! It reads no clock and holds no socket.

use std::collections::HashMap;
use std::hash::Hash;

/// The limits an arbiter applies, as named in
/// `rollcall_arbiter_limit_hits_total{limit}` and in refusal reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limit {
    /// `limits.handshakes_per_second` of one source address.
    HandshakesPerAddress,
    /// `limits.connections_per_identity`.
    ConnectionsPerIdentity,
    /// One session per node: a newer one replaced an older one.
    SessionsPerNode,
    /// `limits.requests_per_second` of one connection.
    Requests,
    /// `limits.session_messages_per_second` of one session.
    SessionMessages,
    /// `limits.admin_calls_per_second` of one token.
    AdminCalls,
    /// `limits.subscriptions_per_session`.
    SubscriptionsPerSession,
    /// `limits.snapshots_per_session`.
    SnapshotsPerSession,
    /// `limits.propagation_waits_per_identity`.
    PropagationWaits,
}

impl Limit {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::HandshakesPerAddress => "handshakes_per_address",
            Limit::ConnectionsPerIdentity => "connections_per_identity",
            Limit::SessionsPerNode => "sessions_per_node",
            Limit::Requests => "requests",
            Limit::SessionMessages => "session_messages",
            Limit::AdminCalls => "admin_calls",
            Limit::SubscriptionsPerSession => "subscriptions_per_session",
            Limit::SnapshotsPerSession => "snapshots_per_session",
            Limit::PropagationWaits => "propagation_waits_per_identity",
        }
    }
}

/// A sustained rate with a burst above it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    per_second: u64,
    burst: u64,
}

impl Rate {
    /// `per_second` sustained, `burst` at once (each at least 1).
    pub fn new(per_second: u32, burst: u32) -> Rate {
        Rate {
            per_second: u64::from(per_second.max(1)),
            burst: u64::from(burst.max(1)),
        }
    }
}

/// Thousandths of a token: a rate of r per second refills r of them per
/// ms, so the arithmetic is exact.
const MILLI: u64 = 1_000;

/// A token bucket: full at start, one token per event, refilled at the
/// rate up to the burst.
#[derive(Clone, Debug)]
pub struct Bucket {
    rate: Rate,
    milli_tokens: u64,
    at_ms: u64,
}

impl Bucket {
    /// A full bucket at `now_ms`.
    pub fn new(rate: Rate, now_ms: u64) -> Bucket {
        Bucket {
            rate,
            milli_tokens: rate.burst * MILLI,
            at_ms: now_ms,
        }
    }

    fn refill(&mut self, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.at_ms);
        self.milli_tokens = self
            .milli_tokens
            .saturating_add(elapsed.saturating_mul(self.rate.per_second))
            .min(self.rate.burst * MILLI);
        self.at_ms = self.at_ms.max(now_ms);
    }

    /// Takes a token at `now_ms`; when there is none, how many ms until
    /// there is (nothing is taken).
    pub fn take(&mut self, now_ms: u64) -> Result<(), u64> {
        self.refill(now_ms);
        if self.milli_tokens >= MILLI {
            self.milli_tokens -= MILLI;
            Ok(())
        } else {
            let missing = MILLI - self.milli_tokens;
            Err(missing.div_ceil(self.rate.per_second).max(1))
        }
    }

    /// Whether it is full at `now_ms` (it then says nothing a new bucket
    /// would not, and can be forgotten).
    fn is_full(&mut self, now_ms: u64) -> bool {
        self.refill(now_ms);
        self.milli_tokens >= self.rate.burst * MILLI
    }
}

/// One bucket per key (a source address), at most `max_keys` of them:
/// full buckets are forgotten when room is needed, and a new key while
/// every bucket is in use is refused (a flood from that many addresses is
/// not one client's).
#[derive(Debug)]
pub struct Buckets<K> {
    rate: Rate,
    max_keys: usize,
    buckets: HashMap<K, Bucket>,
}

impl<K: Eq + Hash + Clone> Buckets<K> {
    /// No key yet.
    pub fn new(rate: Rate, max_keys: usize) -> Buckets<K> {
        Buckets {
            rate,
            max_keys,
            buckets: HashMap::new(),
        }
    }

    /// Takes a token of `key`'s bucket at `now_ms`; `Err` with the ms until
    /// one is due when there is none.
    pub fn take(&mut self, key: &K, now_ms: u64) -> Result<(), u64> {
        if !self.buckets.contains_key(key) && self.buckets.len() >= self.max_keys {
            self.buckets.retain(|_, bucket| !bucket.is_full(now_ms));
            if self.buckets.len() >= self.max_keys {
                return Err(1_000);
            }
        }
        let rate = self.rate;
        self.buckets
            .entry(key.clone())
            .or_insert_with(|| Bucket::new(rate, now_ms))
            .take(now_ms)
    }
}

/// How many of something each key holds, up to a maximum per key.
#[derive(Debug)]
pub struct Counts<K> {
    max: usize,
    held: HashMap<K, usize>,
}

impl<K: Eq + Hash + Clone> Counts<K> {
    /// Nothing held; `max` per key.
    pub fn new(max: usize) -> Counts<K> {
        Counts {
            max,
            held: HashMap::new(),
        }
    }

    /// Counts one more for `key` unless it holds `max` already (then
    /// `Err` with how many it holds).
    pub fn add(&mut self, key: &K) -> Result<(), usize> {
        let held = self.held.entry(key.clone()).or_insert(0);
        if *held >= self.max {
            return Err(*held);
        }
        *held += 1;
        Ok(())
    }

    /// One of `key`'s is gone.
    pub fn remove(&mut self, key: &K) {
        if let Some(held) = self.held.get_mut(key) {
            *held -= 1;
            if *held == 0 {
                self.held.remove(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let mut bucket = Bucket::new(Rate::new(10, 3), 0);
        for _ in 0..3 {
            assert_eq!(bucket.take(0), Ok(()));
        }
        // Empty: the next token is 100 ms away at 10/s.
        assert_eq!(bucket.take(0), Err(100));
        assert_eq!(bucket.take(60), Err(40));
        assert_eq!(bucket.take(100), Ok(()));
        // A long pause refills to the burst, not beyond.
        for _ in 0..3 {
            assert_eq!(bucket.take(60_000), Ok(()));
        }
        assert!(bucket.take(60_000).is_err());
        // Time going back (another origin) takes nothing away.
        assert!(bucket.take(50_000).is_err());
    }

    #[test]
    fn buckets_are_per_key_and_bounded() {
        let mut buckets = Buckets::new(Rate::new(1, 1), 2);
        assert_eq!(buckets.take(&"a", 0), Ok(()));
        assert!(buckets.take(&"a", 0).is_err(), "a's own limit");
        assert_eq!(buckets.take(&"b", 0), Ok(()), "b is not a");
        // Full table, every bucket in use: a new key waits.
        assert!(buckets.take(&"c", 0).is_err());
        // Once a and b refilled they are forgotten, and c gets in.
        assert_eq!(buckets.take(&"c", 1_000), Ok(()));
    }

    #[test]
    fn counts_stop_at_the_maximum_and_free_on_remove() {
        let mut counts = Counts::new(2);
        assert_eq!(counts.add(&"x"), Ok(()));
        assert_eq!(counts.add(&"x"), Ok(()));
        assert_eq!(counts.add(&"x"), Err(2));
        assert_eq!(counts.add(&"y"), Ok(()));
        counts.remove(&"x");
        assert_eq!(counts.add(&"x"), Ok(()));
        counts.remove(&"nobody");
    }
}
