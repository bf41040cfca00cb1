//! A small seeded generator (SplitMix64): the model's only source of choices, so that a run is a
//! pure function of its seed.

/// SplitMix64 (Steele, Lea, Flood 2014): 64-bit state, one multiply-xorshift chain per output.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed ^ 0x6A09_E667_F3BC_C909)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (((self.next_u64() >> 32) * n as u64) >> 32) as usize
    }

    /// True with probability `permille / 1000`.
    pub(crate) fn permille(&mut self, permille: u32) -> bool {
        permille >= 1000 || (permille > 0 && self.below(1000) < permille as usize)
    }
}
