//! Choosing one endpoint for one proxied connection (R8): same-zone
//! preference with bounded spillover, then power of two choices on
//! (active connections + 1) ÷ weight.
//!
//! Sans-IO: the candidates come from the shared endpoint view (which has
//! already applied READY, protection, panic, ejection and slow start), the
//! active counts and the randomness come in as arguments. This module must
//! not decide which endpoints are usable; it only picks among them.

use std::collections::BTreeSet;

use rand::RngExt;
use rollcall_leases::{InstanceId, Label};

use crate::endpoints::Candidate;

/// Picks the candidate for a new connection, as an index into
/// `candidates`, or `None` when every candidate is in `exclude`.
///
/// - Zone: only candidates in `local_zone` are considered while they are at
///   least `min_local_share` of `candidates` (by count); otherwise, or once
///   every local one is excluded, all zones are.
/// - Power of two choices: two distinct candidates are drawn with
///   probability proportional to their weight, and the one with the lower
///   (`active` + 1) ÷ weight wins, so held connections spread in proportion
///   to weight.
/// - `exclude` (the endpoints this connection already tried) is never
///   chosen.
pub fn choose(
    candidates: &[Candidate],
    local_zone: &Label,
    active: &impl Fn(&InstanceId) -> usize,
    exclude: &BTreeSet<InstanceId>,
    min_local_share: f64,
    rng: &mut impl rand::Rng,
) -> Option<usize> {
    let open: Vec<usize> = (0..candidates.len())
        .filter(|&i| !exclude.contains(&candidates[i].record.instance_id))
        .collect();
    let local: Vec<usize> = open
        .iter()
        .copied()
        .filter(|&i| &candidates[i].record.zone == local_zone)
        .collect();
    let local_total = candidates
        .iter()
        .filter(|c| &c.record.zone == local_zone)
        .count();
    let prefer_local = local_total > 0
        && local_total as f64 >= min_local_share * candidates.len() as f64
        && !local.is_empty();
    let pool = if prefer_local { local } else { open };
    match pool.len() {
        0 => None,
        1 => Some(pool[0]),
        _ => {
            let first = weighted_pick(candidates, &pool, None, rng);
            let second = weighted_pick(candidates, &pool, Some(first), rng);
            let load = |i: usize| {
                let c = &candidates[i];
                (active(&c.record.instance_id) as f64 + 1.0) / c.weight
            };
            Some(if load(second) < load(first) {
                second
            } else {
                first
            })
        }
    }
}

/// One index of `pool` (not `skip`), with probability proportional to its
/// candidate's weight. Weights that are not positive count as zero; if all
/// are, the pick is uniform.
fn weighted_pick(
    candidates: &[Candidate],
    pool: &[usize],
    skip: Option<usize>,
    rng: &mut impl rand::Rng,
) -> usize {
    let eligible = pool.iter().copied().filter(|&i| Some(i) != skip);
    let weight = |i: usize| {
        let w = candidates[i].weight;
        if w.is_finite() && w > 0.0 {
            w
        } else {
            0.0
        }
    };
    let total: f64 = eligible.clone().map(weight).sum();
    let remaining: Vec<usize> = eligible.collect();
    if total <= 0.0 {
        return remaining[rng.random_range(0..remaining.len())];
    }
    let mut point = rng.random_range(0.0..total);
    for &i in &remaining {
        point -= weight(i);
        if point < 0.0 {
            return i;
        }
    }
    // Rounding can leave `point` at a hair above zero after the last one.
    remaining[remaining.len() - 1]
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Arc;

    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use rollcall_leases::{
        AgentEpoch, EndpointRecord, Generation, LeaseId, Liveness, NodeId, Principal,
        PrincipalName, Reason, Revision, Role, State, Version, Weight,
    };

    use super::*;

    fn candidate(id: &str, zone: &str, weight: f64) -> Candidate {
        let record = EndpointRecord {
            instance_id: InstanceId::new(id).unwrap(),
            generation: Generation(1),
            node_id: NodeId::new("n1").unwrap(),
            epoch: AgentEpoch(1),
            lease: LeaseId(1),
            address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 80,
            region: Label::new("r1").unwrap(),
            zone: Label::new(zone).unwrap(),
            version: Version::new("v1").unwrap(),
            weight: Weight::DEFAULT,
            labels: Vec::new(),
            state: State::Ready,
            reason: Reason::new("t").unwrap(),
            origin: Principal {
                role: Role::Agent,
                name: PrincipalName::new("n1").unwrap(),
            },
            liveness: Liveness::Unknown,
            revision: Revision(1),
            changed_at_ms: 0,
        };
        Candidate {
            record: Arc::new(record),
            weight,
        }
    }

    fn zone(z: &str) -> Label {
        Label::new(z).unwrap()
    }

    fn id(i: &str) -> InstanceId {
        InstanceId::new(i).unwrap()
    }

    fn idle(_: &InstanceId) -> usize {
        0
    }

    /// `picks` connections, each held open (its count stays incremented).
    fn held_picks(
        candidates: &[Candidate],
        local: &Label,
        min_local_share: f64,
        picks: usize,
        seed: u64,
    ) -> HashMap<String, usize> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut open: HashMap<InstanceId, usize> = HashMap::new();
        for _ in 0..picks {
            let active = |i: &InstanceId| open.get(i).copied().unwrap_or(0);
            let i = choose(
                candidates,
                local,
                &active,
                &BTreeSet::new(),
                min_local_share,
                &mut rng,
            )
            .expect("a candidate");
            *open
                .entry(candidates[i].record.instance_id.clone())
                .or_default() += 1;
        }
        open.into_iter()
            .map(|(k, v)| (k.as_str().to_owned(), v))
            .collect()
    }

    #[test]
    fn held_connections_spread_in_proportion_to_weight() {
        let candidates = vec![
            candidate("a", "z1", 100.0),
            candidate("b", "z1", 100.0),
            candidate("c", "z1", 200.0),
            candidate("d", "z1", 400.0),
        ];
        for seed in 0..5 {
            let counts = held_picks(&candidates, &zone("z1"), 0.2, 2_000, seed);
            for (name, share) in [("a", 0.125), ("b", 0.125), ("c", 0.25), ("d", 0.5)] {
                let want = 2_000.0 * share;
                let got = counts.get(name).copied().unwrap_or(0) as f64;
                assert!(
                    (got - want).abs() <= 0.1 * want,
                    "seed {seed}: {name} got {got}, want {want} ± 10 %: {counts:?}"
                );
            }
        }
    }

    #[test]
    fn the_local_zone_is_preferred_while_it_holds_its_share() {
        let candidates = vec![
            candidate("a", "z1", 100.0),
            candidate("b", "z2", 100.0),
            candidate("c", "z2", 100.0),
            candidate("d", "z2", 100.0),
        ];
        // 1 of 4 in z1 is 25 %, at least 20 %: z1 only.
        let counts = held_picks(&candidates, &zone("z1"), 0.2, 200, 1);
        assert_eq!(counts.get("a"), Some(&200), "{counts:?}");
        // Below 30 %: every zone takes a share.
        let counts = held_picks(&candidates, &zone("z1"), 0.3, 200, 1);
        assert_eq!(counts.len(), 4, "{counts:?}");
        // A zone with no candidate at all spills over even at share 0.
        let counts = held_picks(&candidates, &zone("z9"), 0.0, 200, 1);
        assert_eq!(counts.len(), 4, "{counts:?}");
    }

    #[test]
    fn an_excluded_local_zone_spills_over() {
        let candidates = vec![candidate("a", "z1", 100.0), candidate("b", "z2", 100.0)];
        let mut rng = StdRng::seed_from_u64(7);
        let exclude = BTreeSet::from([id("a")]);
        for _ in 0..50 {
            assert_eq!(
                choose(&candidates, &zone("z1"), &idle, &exclude, 0.2, &mut rng),
                Some(1)
            );
        }
    }

    #[test]
    fn excluded_candidates_are_never_chosen() {
        let candidates = vec![
            candidate("a", "z1", 100.0),
            candidate("b", "z1", 10_000.0),
            candidate("c", "z1", 100.0),
            candidate("d", "z1", 10_000.0),
        ];
        let exclude = BTreeSet::from([id("b"), id("d")]);
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..500 {
            let i = choose(&candidates, &zone("z1"), &idle, &exclude, 0.2, &mut rng).unwrap();
            assert!(!exclude.contains(&candidates[i].record.instance_id));
        }
        let all = candidates
            .iter()
            .map(|c| c.record.instance_id.clone())
            .collect();
        assert_eq!(
            choose(&candidates, &zone("z1"), &idle, &all, 0.2, &mut rng),
            None
        );
    }

    #[test]
    fn a_single_candidate_is_always_chosen() {
        let candidates = vec![candidate("a", "z2", 1.0)];
        let mut rng = StdRng::seed_from_u64(11);
        let busy = |_: &InstanceId| 1_000_000;
        for _ in 0..50 {
            assert_eq!(
                choose(
                    &candidates,
                    &zone("z1"),
                    &busy,
                    &BTreeSet::new(),
                    0.9,
                    &mut rng
                ),
                Some(0)
            );
        }
    }

    #[test]
    fn no_candidates_means_none() {
        let mut rng = StdRng::seed_from_u64(0);
        assert_eq!(
            choose(&[], &zone("z1"), &idle, &BTreeSet::new(), 0.2, &mut rng),
            None
        );
    }

    #[test]
    fn the_less_loaded_of_two_wins() {
        let candidates = vec![candidate("a", "z1", 100.0), candidate("b", "z1", 100.0)];
        let active = |i: &InstanceId| if i.as_str() == "a" { 5 } else { 0 };
        let mut rng = StdRng::seed_from_u64(5);
        for _ in 0..50 {
            assert_eq!(
                choose(
                    &candidates,
                    &zone("z1"),
                    &active,
                    &BTreeSet::new(),
                    0.2,
                    &mut rng
                ),
                Some(1)
            );
        }
    }
}
