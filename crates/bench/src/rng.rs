//! The generator's pseudo-random numbers: SplitMix64 and the few distributions the events
//! table needs.
//!
//! A benchmark input must be the same file for the same `--seed` on every machine and with
//! every toolchain, or figures from two runs are not comparable. `rand`'s `StdRng` explicitly
//! does not promise a stable stream across versions, so the generator carries its own: SplitMix64
//! is ten lines, passes BigCrush, and is fast enough that formatting strings, not drawing
//! numbers, dominates generation.

/// SplitMix64 (Steele, Lea, Flood 2014), the seeding generator of the xoshiro family.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator whose whole stream is determined by `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.state)
    }

    /// Uniform in `0..n` (`n > 0`), by Lemire's multiply-shift: no division, and the bias
    /// (below 2^-40 for the n used here) is irrelevant for synthetic data.
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// A rank in `1..=n` drawn from a Zipf(s = 1) law, by inverting its continuous
    /// approximation `CDF(k) ~ ln k / ln n`: the top 1% of a million ranks take two thirds of
    /// the draws (of 2^24 ranks, 70%), the skew of real user activity.
    pub fn zipf(&mut self, n: u64) -> u64 {
        let rank = (n as f64).powf(self.unit()) as u64;
        rank.clamp(1, n)
    }

    /// An index into `weights` chosen with probability proportional to its weight.
    pub fn weighted(&mut self, weights: &Weights) -> usize {
        weights.pick(self.next_u64())
    }
}

/// The SplitMix64 output function: a bijection of u64 that scatters nearby inputs. Also used
/// to turn a user's rank into a stable, realistic-looking session id.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Integer weights prepared for [`Rng::weighted`].
#[derive(Clone, Debug)]
pub struct Weights {
    cumulative: Vec<u64>,
    total: u64,
}

impl Weights {
    /// Weights for indices `0..weights.len()`; at least one must be positive.
    pub fn new(weights: &[u64]) -> Weights {
        let mut total = 0;
        let cumulative = weights
            .iter()
            .map(|w| {
                total += w;
                total
            })
            .collect();
        assert!(total > 0, "all weights are zero");
        Weights { cumulative, total }
    }

    /// The index that the 64 uniform bits `bits` select. Taking the bits from a hash rather
    /// than from the stream gives a stable choice per key (a user's country, say).
    pub fn pick(&self, bits: u64) -> usize {
        let x = ((u128::from(bits) * u128::from(self.total)) >> 64) as u64;
        self.cumulative.partition_point(|&c| c <= x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_is_fixed_by_the_seed() {
        // The first outputs of SplitMix64 seeded with 0, as published with the reference code;
        // a change here would silently change every generated benchmark file.
        let mut rng = Rng::new(0);
        assert_eq!(rng.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(rng.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        assert!((0..100).all(|_| a.next_u64() == b.next_u64()));
    }

    #[test]
    fn distributions_stay_in_range_and_follow_their_weights() {
        let mut rng = Rng::new(42);
        let weights = Weights::new(&[1, 0, 3]);
        let mut counts = [0u32; 3];
        for _ in 0..40_000 {
            counts[rng.weighted(&weights)] += 1;
            assert!(rng.below(10) < 10);
            let u = rng.unit();
            assert!((0.0..1.0).contains(&u));
            assert!((1..=1000).contains(&rng.zipf(1000)));
        }
        assert_eq!(counts[1], 0, "a zero weight is never chosen");
        let ratio = f64::from(counts[2]) / f64::from(counts[0]);
        assert!((2.7..3.3).contains(&ratio), "3:1 weights gave {counts:?}");
    }

    #[test]
    fn zipf_is_skewed_towards_low_ranks() {
        let mut rng = Rng::new(1);
        let draws = 100_000;
        let top_percent = (0..draws).filter(|_| rng.zipf(1_000_000) <= 10_000).count();
        // ln(10^4) / ln(10^6) = 2/3 of the draws fall in the top 1% of a million ranks.
        let share = top_percent as f64 / f64::from(draws);
        assert!((0.64..0.69).contains(&share), "top-1% share {share}");
    }
}
