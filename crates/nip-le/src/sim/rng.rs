//! The simulator's one source of randomness: SplitMix64, seeded per run.
//! Written out here (a dozen lines) rather than taken from a crate so that a
//! seed replays the same run on every platform and in every future version:
//! a library may change its streams between releases, a replay command in a
//! CI log must not.

/// A seeded pseudo-random stream.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// The stream of `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi` (`lo` when the range is empty).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `p` (0 to 1).
    pub fn chance(&mut self, p: f64) -> bool {
        let x = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        x < p
    }

    /// One of `items`' indices, uniformly (`None` when empty).
    pub fn pick(&mut self, len: usize) -> Option<usize> {
        (len > 0).then(|| (self.next_u64() % len as u64) as usize)
    }

    /// A new independent stream.
    pub fn fork(&mut self) -> Self {
        Self(self.next_u64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_and_ranges_hold() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..1000 {
            let x = a.range(3, 9);
            assert_eq!(x, b.range(3, 9));
            assert!((3..=9).contains(&x));
        }
        assert_eq!(Rng::new(1).range(5, 5), 5);
        assert_eq!(Rng::new(1).pick(0), None);
    }
}
