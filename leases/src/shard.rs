//! Which catalog shard a service lives in (issue 35): a stable function of
//! its `namespace/service`, the same in every process, platform and
//! release. All named ports of a service live in one shard, so a service's
//! records, digest and revisions stay in one Raft group.
//!
//! The function, written down so another implementation can match it:
//!
//! 1. `h = xxh3_64(namespace ++ "/" ++ service)`, seed 0, over the UTF-8
//!    bytes of the two labels (already validated and lower-case).
//! 2. `shard = jump(h, K)`, Lamping and Veach's jump consistent hash
//!    ("A Fast, Minimal Memory, Consistent Hash Algorithm", 2014): with
//!    `b = -1, j = 0`, while `j < K`: `b = j`,
//!    `h = h * 2862933555777941757 + 1` (mod 2^64),
//!    `j = floor((b + 1) * (2^31 / ((h >> 33) + 1)))` in IEEE-754 doubles;
//!    the answer is `b`.
//!
//! Jump hash was chosen over `h mod K` because it moves the fewest
//! services when K grows: from K to K + 1 shards, only the services that
//! land in the new shard move (about 1 / (K + 1) of them), which is what a
//! later resharding needs. The fixed vectors in the tests pin both steps.

use xxhash_rust::xxh3::xxh3_64;

use crate::ids::ShardId;
use crate::name::ServiceKey;

/// Most shards a region's catalog may have (`[catalog] shards`).
pub const MAX_SHARDS: u16 = rollcall_config::MAX_SHARDS;

/// The shard of `service` in a catalog of `shards` shards (at least 1).
pub fn shard_of(service: &ServiceKey, shards: u16) -> ShardId {
    shard_of_name(service.namespace.as_str(), service.service.as_str(), shards)
}

/// The shard of `namespace/service` in a catalog of `shards` shards (at
/// least 1; 0 is taken as 1).
pub fn shard_of_name(namespace: &str, service: &str, shards: u16) -> ShardId {
    let mut bytes = Vec::with_capacity(namespace.len() + 1 + service.len());
    bytes.extend_from_slice(namespace.as_bytes());
    bytes.push(b'/');
    bytes.extend_from_slice(service.as_bytes());
    ShardId(jump(xxh3_64(&bytes), shards.max(1)))
}

/// Jump consistent hash of `key` into `buckets` buckets (at least 1).
fn jump(mut key: u64, buckets: u16) -> u16 {
    let (mut b, mut j): (i64, i64) = (-1, 0);
    while j < i64::from(buckets) {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    u16::try_from(b).expect("jump hash answers below its bucket count")
}

/// Which replica initializes shard `shard`'s group when the region is
/// bootstrapped: the members in id order, taken in turn (shard 0 by the
/// lowest id, as a catalog of one shard always was). The initializer
/// campaigns at once and usually wins, so a new region starts with its
/// leaders spread.
pub fn initializer(shard: ShardId, mut members: Vec<u64>) -> Option<u64> {
    members.sort_unstable();
    members.dedup();
    (!members.is_empty()).then(|| members[usize::from(shard.0) % members.len()])
}

/// The one leadership move replica `me` should make now, if any: a shard
/// it leads and the voter to hand it to. The share is ceil(K / live),
/// where live counts the voters not in `unreachable` (`me` among them):
/// `me` moves only while it leads more than its share, and only to a live
/// voter leading fewer than that (the one leading fewest, the lowest id
/// on a tie); the shard given away is the highest-numbered one it leads.
/// Since K shards never exceed live × ceil(K / live), a live replica over
/// its share means another live one is under it: every move brings the
/// spread closer to at most the share each, and replicas that all move by
/// this rule settle there.
pub fn next_move(
    me: u64,
    voters: &[u64],
    leaders: &[(ShardId, Option<u64>)],
    unreachable: &[u64],
) -> Option<(ShardId, u64)> {
    if voters.len() < 2 || !voters.contains(&me) {
        return None;
    }
    let live = voters
        .iter()
        .filter(|v| **v == me || !unreachable.contains(v))
        .count();
    let cap = leaders.len().div_ceil(live);
    let led = |r: u64| leaders.iter().filter(|(_, l)| *l == Some(r)).count();
    if led(me) <= cap {
        return None;
    }
    let target = voters
        .iter()
        .copied()
        .filter(|v| *v != me && !unreachable.contains(v) && led(*v) < cap)
        .min_by_key(|v| (led(*v), *v))?;
    let shard = leaders
        .iter()
        .filter(|(_, l)| *l == Some(me))
        .map(|(s, _)| *s)
        .max()?;
    Some((shard, target))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Fixed vectors: these answers are a contract between releases (an
    /// agent, a replica and a tool must agree on every service's shard).
    /// A change here moves services between Raft groups.
    #[test]
    fn fixed_vectors() {
        let cases: &[(&str, &str, u16, u16)] = &[
            ("default", "web", 1, 0),
            ("default", "web", 2, 1),
            ("default", "web", 6, 1),
            ("default", "web", 8, 1),
            ("default", "api", 6, 2),
            ("default", "db", 6, 2),
            ("payments", "ledger", 6, 5),
            ("default", "svc-0001", 6, 4),
            ("default", "svc-0002", 6, 0),
            ("default", "svc-0003", 64, 35),
        ];
        let got: Vec<(&str, &str, u16, u16)> = cases
            .iter()
            .map(|&(ns, svc, k, _)| (ns, svc, k, shard_of_name(ns, svc, k).0))
            .collect();
        assert_eq!(got, cases, "the shard function changed");
    }

    #[test]
    fn jump_hash_matches_the_reference_implementation() {
        // Answers of the paper's C++ code, as ClickHouse's
        // jumpConsistentHash tests pin them.
        assert_eq!(jump(1, 1), 0);
        assert_eq!(jump(42, 57), 43);
        assert_eq!(jump(256, 1024), 520);
        assert_eq!(jump(3_735_883_980, 1), 0);
        assert_eq!(jump(3_735_883_980, 666), 361);
        assert_eq!(jump(16_045_690_984_833_335_023, 255), 237);
    }

    #[test]
    fn the_port_name_does_not_move_a_service() {
        let a = ServiceKey::new("default", "web", "http").unwrap();
        let b = ServiceKey::new("default", "web", "grpc").unwrap();
        for k in 1..=MAX_SHARDS {
            assert_eq!(shard_of(&a, k), shard_of(&b, k));
        }
    }

    #[test]
    fn initializers_take_the_members_in_turn() {
        let members = vec![3, 1, 2];
        let picked: Vec<u64> = (0..6)
            .map(|s| initializer(ShardId(s), members.clone()).unwrap())
            .collect();
        assert_eq!(picked, vec![1, 2, 3, 1, 2, 3]);
        assert_eq!(initializer(ShardId(0), vec![]), None);
    }

    fn led(leaders: &[Option<u64>]) -> Vec<(ShardId, Option<u64>)> {
        leaders
            .iter()
            .enumerate()
            .map(|(s, l)| (ShardId(s as u16), *l))
            .collect()
    }

    #[test]
    fn a_replica_over_its_share_hands_its_highest_shard_to_the_least_loaded() {
        let voters = [1, 2, 3];
        // Replica 3 came back leading nothing: 1 and 2 lead three each.
        let leaders = led(&[Some(1), Some(2), Some(1), Some(2), Some(1), Some(2)]);
        assert_eq!(next_move(1, &voters, &leaders, &[]), Some((ShardId(4), 3)));
        assert_eq!(next_move(2, &voters, &leaders, &[]), Some((ShardId(5), 3)));
        assert_eq!(next_move(3, &voters, &leaders, &[]), None);
        // Within its share: nothing to do.
        let spread = led(&[Some(1), Some(2), Some(3), Some(1), Some(2), Some(3)]);
        for me in voters {
            assert_eq!(next_move(me, &voters, &spread, &[]), None);
        }
        // The only replica under its share is unreachable: the share is
        // counted over the two left, and nobody moves.
        assert_eq!(next_move(1, &voters, &leaders, &[3]), None);
        // Replica 3 is gone and 1 leads four: it hands one to 2.
        let lopsided = led(&[Some(1), Some(2), Some(1), Some(2), Some(1), Some(1)]);
        assert_eq!(
            next_move(1, &voters, &lopsided, &[3]),
            Some((ShardId(5), 2))
        );
        assert_eq!(next_move(1, &voters, &lopsided, &[]), Some((ShardId(5), 3)));
        // One shard without a leader counts for nobody.
        let leaderless = led(&[Some(1), Some(1), Some(1), None, Some(2), Some(3)]);
        assert_eq!(
            next_move(1, &voters, &leaderless, &[]),
            Some((ShardId(2), 2))
        );
        // A group of one, or a replica that is not a voter, never moves.
        assert_eq!(next_move(1, &[1], &leaders, &[]), None);
        assert_eq!(next_move(4, &voters, &led(&[Some(4); 6]), &[]), None);
    }

    /// Replicas that each follow `next_move`, one move at a time in any
    /// order, end with at most ceil(K / voters) shards each.
    fn settle(mut leaders: Vec<Option<u64>>, voters: &[u64], order: &[usize]) -> Vec<Option<u64>> {
        // Rounds in which every replica gets a turn, each round starting
        // from a replica the case picks.
        for round in 0..100 {
            let mut moved = false;
            for i in 0..voters.len() {
                let me = voters[(i + order[round % order.len()]) % voters.len()];
                if let Some((shard, to)) = next_move(me, voters, &led(&leaders), &[]) {
                    leaders[usize::from(shard.0)] = Some(to);
                    moved = true;
                }
            }
            if !moved {
                break;
            }
        }
        leaders
    }

    proptest! {
        #[test]
        fn moves_settle_within_the_share(
            k in 1usize..16,
            n in 2usize..6,
            start in proptest::collection::vec(0usize..6, 16),
            order in proptest::collection::vec(0usize..6, 1..8),
        ) {
            let voters: Vec<u64> = (1..=n as u64).collect();
            let leaders: Vec<Option<u64>> =
                (0..k).map(|s| Some(voters[start[s] % n])).collect();
            let settled = settle(leaders, &voters, &order);
            let cap = k.div_ceil(n);
            for v in &voters {
                let count = settled.iter().filter(|l| **l == Some(*v)).count();
                prop_assert!(count <= cap, "replica {} leads {} of {} (cap {})", v, count, k, cap);
            }
        }


        #[test]
        fn in_range_and_minimal_movement(ns in "[a-z]{1,8}", svc in "[a-z0-9-]{1,16}", k in 1u16..MAX_SHARDS) {
            let before = shard_of_name(&ns, &svc, k);
            let after = shard_of_name(&ns, &svc, k + 1);
            prop_assert!(before.0 < k);
            prop_assert!(after.0 <= k);
            // Growing by one shard moves a service only into the new one.
            prop_assert!(after == before || after.0 == k);
        }
    }

    #[test]
    fn services_spread_over_the_shards() {
        let k = 6u16;
        let mut counts = [0u32; 6];
        for i in 0..6_000 {
            counts[usize::from(shard_of_name("default", &format!("svc-{i}"), k).0)] += 1;
        }
        // 1,000 expected each; 6 sigma is about 190.
        for (shard, n) in counts.iter().enumerate() {
            assert!((800..=1_200).contains(n), "shard {shard} got {n} of 6,000");
        }
    }
}
