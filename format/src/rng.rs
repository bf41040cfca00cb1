//! A small seeded pseudo-random generator (SplitMix64), so that generated inputs depend only on
//! the seed and this crate's code, never on another crate's version.

/// SplitMix64 (Steele, Lea and Flood's mixing of a Weyl sequence): 64-bit state, period 2^64,
/// good enough statistical quality for test inputs; not for cryptography.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator seeded with `seed`; equal seeds give equal sequences.
    pub const fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform integer in `0..n` (unbiased, by rejection). Panics when `n == 0`.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        // Lemire's multiply-and-reject.
        let threshold = n.wrapping_neg() % n;
        loop {
            let wide = u128::from(self.next_u64()) * u128::from(n);
            if (wide as u64) >= threshold {
                return (wide >> 64) as u64;
            }
        }
    }

    /// A uniform `f64` in `[0, 1)` with 53 random bits.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A standard normal sample (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (core::f64::consts::TAU * u2).cos()
    }

    /// Fills `out` with random bytes.
    pub fn fill_bytes(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let bytes = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }

    /// `len` random e4m3 scale bytes of every kind a stored checkpoint may hold: normal magnitudes
    /// of either sign (3 in 4), and often ±0, subnormals and NaN (1 in 8 each), so that code
    /// reading scales meets signs, zeros and NaN in many blocks.
    pub fn e4m3_bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len)
            .map(|_| {
                let sign = if self.below(2) == 0 { 0 } else { 0x80 };
                match self.below(8) {
                    0 => sign,
                    1 => sign | (1 + self.below(7) as u8),
                    2 => sign | 0x7F,
                    _ => sign | (8 + self.below(0x77) as u8),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answer_and_determinism() {
        // First outputs of SplitMix64 seeded with 0 (published reference values).
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        let a: Vec<u64> = (0..5).map(|_| SplitMix64::new(7).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut r = SplitMix64::new(42);
        let mut counts = [0u32; 7];
        for _ in 0..70_000 {
            counts[r.below(7) as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
        let mut bytes = [0u8; 13];
        r.fill_bytes(&mut bytes);
        assert!(bytes.iter().any(|&b| b != 0));
        let x = r.next_f64();
        assert!((0.0..1.0).contains(&x));
        let mean: f64 = (0..20_000).map(|_| r.normal()).sum::<f64>() / 20_000.0;
        assert!(mean.abs() < 0.05);
    }
}
