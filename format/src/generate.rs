//! Seeded random NVFP4 inputs.
//!
//! Everything here is a deterministic function of the seed (through [`SplitMix64`]); the streams
//! are not bit-compatible with the competition's torch generator, only distributed alike.

use crate::codec::{E4M3_MAX_CODE, E4M3_ONE, E4M3_TWO};
use crate::error::FormatError;
use crate::layout;
use crate::matrix::Nvfp4Matrix;
use crate::reference::Group;
use crate::rng::SplitMix64;

/// How random matrices are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InputDistribution {
    /// The competition's: each value byte is uniform in `0..=254` (torch's `randint(255)`) masked
    /// with `0b1011_1011`, so each nibble's code is in {0, 1, 2, 3, 8, 9, 10, 11}, i.e.
    /// ±{0, 0.5, 1, 1.5}; each block scale is 1.0 or 2.0 (`0x38` / `0x40`) with equal odds. Global
    /// scale 1.
    Competition,
    /// Every e2m1 code (uniform bytes), and block scales uniform over every finite non-negative
    /// e4m3fn code `0x00..=0x7E` (zero, subnormals and 448 included, no NaN). Global scale 1.
    /// Scales are non-negative because the hardware's NVFP4 scale type is unsigned e4m3 (ue4m3).
    /// With long K the products can exceed the fp16 range; use a small alpha for GEMM tests.
    FullRange,
}

/// The shape of one group of a grouped GEMM: `C[m, n] = A[m, k] · B[n, k]ᵀ`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupShape {
    /// Rows of A and C.
    pub m: usize,
    /// Rows of B, columns of C.
    pub n: usize,
    /// Shared K.
    pub k: usize,
}

impl GroupShape {
    /// A shape.
    pub const fn new(m: usize, n: usize, k: usize) -> Self {
        Self { m, n, k }
    }

    /// Zips per-group lists of m, n and k (as the competition writes its cases); errors when the
    /// lists differ in length.
    pub fn zip(m: &[usize], n: &[usize], k: &[usize]) -> Result<Vec<Self>, FormatError> {
        for (what, len) in [("n list", n.len()), ("k list", k.len())] {
            if len != m.len() {
                return Err(FormatError::ShapeMismatch { what, group: None, expected: m.len(), actual: len });
            }
        }
        Ok(m.iter().zip(n).zip(k).map(|((&m, &n), &k)| Self::new(m, n, k)).collect())
    }
}

/// The benchmark shapes of docs/measuring.md §1.
pub mod shapes {
    use super::GroupShape;

    const fn same_nk<const G: usize>(m: [usize; G], n: usize, k: usize) -> [GroupShape; G] {
        let mut out = [GroupShape::new(0, n, k); G];
        let mut g = 0;
        while g < G {
            out[g].m = m[g];
            g += 1;
        }
        out
    }

    /// b0: g = 8, K = 7168, N = 4096, M = [80, 176, 128, 72, 64, 248, 96, 160].
    pub const B0: [GroupShape; 8] = same_nk([80, 176, 128, 72, 64, 248, 96, 160], 4096, 7168);
    /// b1: g = 8, K = 2048, N = 7168, M = [40, 76, 168, 72, 164, 148, 196, 160].
    pub const B1: [GroupShape; 8] = same_nk([40, 76, 168, 72, 164, 148, 196, 160], 7168, 2048);
    /// b2: g = 2, K = 4096, N = 3072, M = [192, 320].
    pub const B2: [GroupShape; 2] = same_nk([192, 320], 3072, 4096);
    /// b3: g = 2, K = 1536, N = 4096, M = [128, 384].
    pub const B3: [GroupShape; 2] = same_nk([128, 384], 4096, 1536);

    /// The competition's 10 test problems (docs/measuring.md §1) and one with K = 128 and 384 (an
    /// older revision of the task), as per-group (M, N, K).
    pub const COMPETITION: [&[(usize, usize, usize)]; 11] = [
        &[(96, 128, 256), (128, 256, 512)],
        &[(256, 512, 256), (72, 384, 256)],
        &[(128, 128, 512), (128, 256, 256)],
        &[(80, 384, 256), (128, 256, 512), (256, 128, 256)],
        &[(64, 128, 512), (72, 384, 512), (96, 512, 256)],
        &[(64, 768, 512), (256, 128, 256), (128, 256, 512)],
        &[(128, 256, 768), (128, 512, 256), (64, 512, 768)],
        &[(128, 128, 512), (128, 128, 256), (128, 128, 512), (128, 128, 256)],
        &[(40, 512, 256), (56, 384, 256), (384, 256, 256), (512, 128, 256)],
        &[(512, 256, 512), (384, 256, 768), (256, 256, 512), (128, 256, 768)],
        &[(96, 128, 128), (40, 256, 384)],
    ];

    /// [`COMPETITION`] as lists of [`GroupShape`].
    pub fn competition() -> Vec<Vec<GroupShape>> {
        COMPETITION.iter().map(|p| p.iter().map(|&(m, n, k)| GroupShape::new(m, n, k)).collect()).collect()
    }
}

/// A random `rows x k` matrix (`k` a positive multiple of 16) drawn from `dist`.
pub fn random_matrix(
    rows: usize,
    k: usize,
    dist: InputDistribution,
    rng: &mut SplitMix64,
) -> Result<Nvfp4Matrix, FormatError> {
    layout::plain_len(rows, k)?;
    let cols = layout::scale_cols(k);
    let mut values = vec![0u8; rows * k / 2];
    let mut plain = vec![0u8; rows * cols];
    match dist {
        InputDistribution::Competition => {
            for v in &mut values {
                *v = rng.below(255) as u8 & 0b1011_1011;
            }
            for s in &mut plain {
                *s = if rng.below(2) == 0 { E4M3_ONE } else { E4M3_TWO };
            }
        }
        InputDistribution::FullRange => {
            rng.fill_bytes(&mut values);
            for s in &mut plain {
                *s = rng.below(u64::from(E4M3_MAX_CODE) + 1) as u8;
            }
        }
    }
    Nvfp4Matrix::from_plain_scales(rows, k, values, &plain, 1.0)
}

/// Random groups (A then B for each group, in order, from one generator seeded with `seed`), each
/// with alpha 1. Errors as [`Group::new`] does (K must be a positive multiple of 64).
pub fn random_groups(shapes: &[GroupShape], dist: InputDistribution, seed: u64) -> Result<Vec<Group>, FormatError> {
    let mut rng = SplitMix64::new(seed);
    shapes
        .iter()
        .map(|s| {
            let a = random_matrix(s.m, s.k, dist, &mut rng)?;
            let b = random_matrix(s.n, s.k, dist, &mut rng)?;
            Group::new(a, b, 1.0)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{e4m3_is_nan, E2M1_VALUES};

    #[test]
    fn competition_distribution() {
        let mut rng = SplitMix64::new(1111);
        let m = random_matrix(100, 256, InputDistribution::Competition, &mut rng).unwrap();
        let mut code_seen = [0u32; 16];
        for i in 0..100 {
            for c in 0..256 {
                code_seen[m.code(i, c) as usize] += 1;
            }
        }
        for (code, &n) in code_seen.iter().enumerate() {
            let allowed = [0, 1, 2, 3, 8, 9, 10, 11].contains(&code);
            assert_eq!(n > 0, allowed, "code {code}: {n}");
        }
        let plain = m.plain_scales();
        let ones = plain.iter().filter(|&&s| s == 0x38).count();
        assert_eq!(ones + plain.iter().filter(|&&s| s == 0x40).count(), plain.len());
        assert!((ones as f64 / plain.len() as f64 - 0.5).abs() < 0.05);
        assert!(m.dequantize().iter().all(|x| x.abs() <= 3.0));
        assert_eq!(m.global_scale(), 1.0);
        // Padding (rows 100..128) is zero.
        assert!(m.scales()[..].iter().filter(|&&s| s == 0).count() >= 28 * 16);
    }

    #[test]
    fn full_range_distribution() {
        let mut rng = SplitMix64::new(5);
        let m = random_matrix(64, 1024, InputDistribution::FullRange, &mut rng).unwrap();
        let mut codes = [false; 16];
        for i in 0..64 {
            for c in 0..1024 {
                codes[m.code(i, c) as usize] = true;
            }
        }
        assert!(codes.iter().all(|&s| s));
        let mut scales = [false; 256];
        for s in m.plain_scales() {
            scales[s as usize] = true;
        }
        for code in 0..=255u8 {
            let expect = code <= 0x7E;
            assert_eq!(scales[code as usize], expect, "scale code {code:#04x}");
            assert!(!(scales[code as usize] && e4m3_is_nan(code)));
        }
        assert!(m.dequantize().iter().all(|x| x.is_finite()));
        assert_eq!(E2M1_VALUES.len(), 16);
    }

    #[test]
    fn groups_are_seeded_and_shaped() {
        let shapes = GroupShape::zip(&[40, 0, 8], &[16, 24, 8], &[64, 128, 64]).unwrap();
        let g1 = random_groups(&shapes, InputDistribution::Competition, 9).unwrap();
        let g2 = random_groups(&shapes, InputDistribution::Competition, 9).unwrap();
        let g3 = random_groups(&shapes, InputDistribution::Competition, 10).unwrap();
        assert_eq!(g1, g2);
        assert_ne!(g1, g3);
        assert_eq!((g1[0].m(), g1[0].n(), g1[0].k()), (40, 16, 64));
        assert_eq!((g1[1].m(), g1[1].n(), g1[1].k()), (0, 24, 128));
        assert!(GroupShape::zip(&[1, 2], &[1], &[64, 64]).is_err());
        assert_eq!(
            random_groups(&[GroupShape::new(4, 4, 48)], InputDistribution::FullRange, 0),
            Err(FormatError::BadK { k: 48, multiple: 64 })
        );
        assert_eq!(shapes::B0.iter().map(|s| s.m).sum::<usize>(), 1024);
        assert!(shapes::B1.iter().all(|s| s.n == 7168 && s.k == 2048));
    }
}
