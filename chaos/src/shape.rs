//! The shape of a region, shared by the fleet simulation (`sim`) and the
//! fleet bench (`bench`), so that both measure the same fleet: services
//! sized by a Zipf-like law, and agents that follow services skewed
//! towards the popular ones.
//!
//! Pure functions of their arguments and the rng passed in; the draws are
//! made in a fixed order, so a seed gives the same region every time (the
//! simulation's digests depend on it).

use rand::{Rng, RngExt};

/// How many instances each of `services` services gets, `instances` in
/// all: every service at least one, the rest by weight `k^-skew` for the
/// k-th service (k from 1), the remainder of the rounding handed out one
/// at a time from the first service on. Needs `instances >= services`.
pub fn service_sizes(services: u32, instances: u32, skew: f64) -> Vec<u32> {
    let weights: Vec<f64> = (1..=services).map(|k| (f64::from(k)).powf(-skew)).collect();
    let total: f64 = weights.iter().sum();
    let spare = f64::from(instances - services);
    let mut sizes: Vec<u32> = weights
        .iter()
        .map(|w| 1 + (spare * w / total).floor() as u32)
        .collect();
    let mut left = instances - sizes.iter().sum::<u32>();
    let mut k = 0;
    let len = sizes.len();
    while left > 0 {
        sizes[k % len] += 1;
        left -= 1;
        k += 1;
    }
    sizes
}

/// Picks one of `n` items with probability proportional to `k^-skew` for
/// the k-th item (k from 1): how often a service is followed.
pub struct Zipf {
    cumulative: Vec<f64>,
    total: f64,
}

impl Zipf {
    /// The law over `n` items (at least one).
    pub fn new(n: u32, skew: f64) -> Zipf {
        let mut cumulative = Vec::with_capacity(n as usize);
        let mut total = 0.0;
        for k in 1..=n {
            total += f64::from(k).powf(-skew);
            cumulative.push(total);
        }
        Zipf { cumulative, total }
    }

    /// One draw: an index below `n`.
    pub fn pick<R: Rng + ?Sized>(&self, rng: &mut R) -> u32 {
        let x = rng.random_range(0.0..self.total);
        let k = self.cumulative.partition_point(|c| *c <= x);
        k.min(self.cumulative.len() - 1) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn sizes_sum_to_the_instances_and_fall_with_rank() {
        let sizes = service_sizes(2_000, 100_000, 0.8);
        assert_eq!(sizes.iter().sum::<u32>(), 100_000);
        assert!(sizes.iter().all(|&s| s >= 1));
        assert!(sizes[0] > 10 * sizes[1_999]);
    }

    #[test]
    fn zipf_favours_the_first_items_and_stays_in_range() {
        let zipf = Zipf::new(100, 0.5);
        let mut rng = StdRng::seed_from_u64(7);
        let mut counts = [0u32; 100];
        for _ in 0..20_000 {
            counts[zipf.pick(&mut rng) as usize] += 1;
        }
        assert!(counts[0] > counts[99] * 3);
        assert!(counts.iter().all(|&c| c > 0));
    }
}
