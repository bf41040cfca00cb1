//! The CPU reference grouped GEMM: `C_g = alpha_g · A_g · B_gᵀ` with exact products, `f64`
//! accumulation and one rounding to the output type.
//!
//! How it stays exact and fast: within one 16-value block of a row of A and a row of B, both
//! operands share their block scales, so the block's contribution is
//! `(Σ e2m1_a · e2m1_b) · (s_a · s_b)`. Every e2m1 product is a multiple of 1/4 of magnitude at most
//! 36, so partial sums of up to 16 of them are exact in `f32`; `s_a · s_b` (two 4-bit significands)
//! is exact in `f32`; and their product (at most 18 significant bits) is exact in `f32` too. Those
//! exact block terms are converted to `f64` and summed there; the sum is multiplied by the
//! effective alpha in `f64` and rounded once to fp16 / bf16. Work is split with rayon over chunks
//! of B's rows; each row of A and B is decoded once.

use half::{bf16, f16};
use rayon::prelude::*;

use crate::codec::HostFloat;
use crate::error::FormatError;
use crate::layout::SCALE_VEC;
use crate::matrix::Nvfp4Matrix;

/// K must be a positive multiple of this for the grouped GEMM (one 4-scale word per 64 values):
/// the abi's number, which the kernels and the host's rules (`nvfp4_gemm::rules`) share.
pub const GEMM_K_MULTIPLE: usize = nvfp4_gemm_abi::quantize::K_MULTIPLE as usize;

/// One problem of a grouped GEMM: `C[m, n] = alpha · A[m, k] · B[n, k]ᵀ` (both operands K-major).
///
/// The product also carries the operands' global scales: the effective multiplier is
/// `alpha · a.global_scale() · b.global_scale()` ([`Group::effective_alpha`]); with the recipe's
/// quantizer, alpha = 1 then gives the product of the original tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// A, `m x k`.
    pub a: Nvfp4Matrix,
    /// B, `n x k`.
    pub b: Nvfp4Matrix,
    /// Per-group fp32 multiplier (1.0 when absent).
    pub alpha: f32,
}

impl Group {
    /// A validated group (see [`Group::validate`]).
    pub fn new(a: Nvfp4Matrix, b: Nvfp4Matrix, alpha: f32) -> Result<Self, FormatError> {
        let g = Self { a, b, alpha };
        g.validate(0)?;
        Ok(g)
    }

    /// Checks that A and B share K and that K is a positive multiple of [`GEMM_K_MULTIPLE`];
    /// `index` is the group's position, used in the error.
    pub fn validate(&self, index: usize) -> Result<(), FormatError> {
        if self.a.k() != self.b.k() {
            return Err(FormatError::KMismatch { group: index, a_k: self.a.k(), b_k: self.b.k() });
        }
        if self.a.k() % GEMM_K_MULTIPLE != 0 {
            return Err(FormatError::BadK { k: self.a.k(), multiple: GEMM_K_MULTIPLE });
        }
        Ok(())
    }

    /// Rows of A and C.
    pub fn m(&self) -> usize {
        self.a.rows()
    }

    /// Rows of B, columns of C.
    pub fn n(&self) -> usize {
        self.b.rows()
    }

    /// The shared K.
    pub fn k(&self) -> usize {
        self.a.k()
    }

    /// `alpha · a.global_scale · b.global_scale` in `f64` (what the reference multiplies by).
    pub fn effective_alpha(&self) -> f64 {
        f64::from(self.alpha) * f64::from(self.a.global_scale()) * f64::from(self.b.global_scale())
    }

    /// [`Group::effective_alpha`] rounded to `f32`: the epilogue multiplier to hand a device
    /// kernel.
    pub fn effective_alpha_f32(&self) -> f32 {
        self.effective_alpha() as f32
    }
}

/// A dense row-major `rows x cols` output matrix of one group.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupOutput<T> {
    /// Rows (M).
    pub rows: usize,
    /// Columns (N).
    pub cols: usize,
    /// `rows * cols` elements, row-major.
    pub data: Vec<T>,
}

impl<T> AsRef<[T]> for GroupOutput<T> {
    fn as_ref(&self) -> &[T] {
        &self.data
    }
}

impl GroupOutput<f64> {
    /// The same output rounded once to `T` (what [`reference_grouped_gemm_as`] returns for `T`),
    /// for callers that need both the exact result and a rounded one without a second GEMM.
    pub fn rounded<T: HostFloat>(&self) -> GroupOutput<T> {
        GroupOutput { rows: self.rows, cols: self.cols, data: self.data.iter().map(|&x| T::from_f64(x)).collect() }
    }
}

impl<T: Copy> GroupOutput<T> {
    /// Element `(i, j)`. Panics when out of range.
    pub fn get(&self, i: usize, j: usize) -> T {
        assert!(i < self.rows && j < self.cols, "({i}, {j}) out of range");
        self.data[i * self.cols + j]
    }
}

/// The reference grouped GEMM with fp16 output (one rounding from the `f64` result).
pub fn reference_grouped_gemm(groups: &[Group]) -> Result<Vec<GroupOutput<f16>>, FormatError> {
    reference_grouped_gemm_as(groups)
}

/// The reference grouped GEMM with bf16 output (one rounding from the `f64` result).
pub fn reference_grouped_gemm_bf16(groups: &[Group]) -> Result<Vec<GroupOutput<bf16>>, FormatError> {
    reference_grouped_gemm_as(groups)
}

/// The reference grouped GEMM before the final rounding (`f64`).
pub fn reference_grouped_gemm_f64(groups: &[Group]) -> Result<Vec<GroupOutput<f64>>, FormatError> {
    reference_grouped_gemm_as(groups)
}

/// The reference grouped GEMM with any [`HostFloat`] output, rounded once from `f64`. Validates
/// every group first (nothing is computed when one is bad).
pub fn reference_grouped_gemm_as<T: HostFloat>(groups: &[Group]) -> Result<Vec<GroupOutput<T>>, FormatError> {
    for (index, g) in groups.iter().enumerate() {
        g.validate(index)?;
    }
    Ok(groups.iter().map(group_gemm).collect())
}

/// B rows per parallel task: decoded, they take `ROWS_PER_TASK * K * 4` bytes (1.8 MB at K = 7168),
/// so they stay in a core's L2 while every row of A passes over them.
const ROWS_PER_TASK: usize = 64;

/// Rows of A (and their scales), decoded: e2m1 values as `f32` (unscaled) and block scales as `f32`.
struct Decoded {
    k: usize,
    codes: Vec<f32>,
    scales: Vec<f32>,
}

impl Decoded {
    fn new(m: &Nvfp4Matrix, rows: core::ops::Range<usize>) -> Self {
        let (k, cols) = (m.k(), m.scale_cols());
        let n = rows.len();
        let mut codes = vec![0.0f32; n * k];
        let mut scales = vec![0.0f32; n * cols];
        for ((i, c), s) in rows.zip(codes.chunks_exact_mut(k)).zip(scales.chunks_exact_mut(cols)) {
            m.row_codes_and_scales(i, c, s);
        }
        Self { k, codes, scales }
    }

    fn row(&self, r: usize) -> (&[f32], &[f32]) {
        let cols = self.k / SCALE_VEC;
        (&self.codes[r * self.k..(r + 1) * self.k], &self.scales[r * cols..(r + 1) * cols])
    }
}

/// `R` dot products of one row of A with `R` rows of B, each exact block term summed in `f64`.
#[inline(always)]
fn dots<const R: usize>(a: (&[f32], &[f32]), b: [(&[f32], &[f32]); R]) -> [f64; R] {
    let (a_codes, a_scales) = a;
    let mut acc = [[0.0f64; 4]; R];
    for (blk, (ab, &sa)) in a_codes.chunks_exact(SCALE_VEC).zip(a_scales).enumerate() {
        let ab: &[f32; SCALE_VEC] = ab.try_into().unwrap();
        for (r, acc) in acc.iter_mut().enumerate() {
            let bb: &[f32; SCALE_VEC] = b[r].0[blk * SCALE_VEC..(blk + 1) * SCALE_VEC].try_into().unwrap();
            let s = sa * b[r].1[blk];
            for (l, acc) in acc.iter_mut().enumerate() {
                // Four e2m1 products (multiples of 1/4, |.| <= 36): the sum is exact in f32, and so
                // is its product with the scale pair (module docs).
                let p = ab[l] * bb[l] + ab[l + 4] * bb[l + 4] + ab[l + 8] * bb[l + 8] + ab[l + 12] * bb[l + 12];
                *acc += f64::from(p * s);
            }
        }
    }
    acc.map(|v| (v[0] + v[1]) + (v[2] + v[3]))
}

fn group_gemm<T: HostFloat>(g: &Group) -> GroupOutput<T> {
    let (m, n) = (g.m(), g.n());
    let alpha = g.effective_alpha();
    if m == 0 || n == 0 {
        return GroupOutput { rows: m, cols: n, data: Vec::new() };
    }
    let a = Decoded::new(&g.a, 0..m);
    // Cᵀ, so that each task's output (ROWS_PER_TASK rows of B → columns of C) is contiguous.
    let mut ct = vec![0.0f64; n * m];
    ct.par_chunks_mut(ROWS_PER_TASK * m).enumerate().for_each(|(task, out)| {
        let first = task * ROWS_PER_TASK;
        let rows = out.len() / m;
        let b = Decoded::new(&g.b, first..first + rows);
        for i in 0..m {
            let ar = a.row(i);
            let mut c = 0;
            while c + 4 <= rows {
                let d = dots(ar, [b.row(c), b.row(c + 1), b.row(c + 2), b.row(c + 3)]);
                for (q, d) in d.into_iter().enumerate() {
                    out[(c + q) * m + i] = d;
                }
                c += 4;
            }
            while c < rows {
                out[c * m + i] = dots(ar, [b.row(c)])[0];
                c += 1;
            }
        }
    });
    let mut data = Vec::with_capacity(m * n);
    for i in 0..m {
        data.extend((0..n).map(|j| T::from_f64(ct[j * m + i] * alpha)));
    }
    GroupOutput { rows: m, cols: n, data }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{pack_e2m1, E4M3_ONE};
    use crate::generate::{random_groups, GroupShape, InputDistribution};
    use crate::rng::SplitMix64;

    /// The naive definition: dequantize everything to f64 and sum the products in order. Also
    /// returns `alpha · Σ|a·b|` per element, the scale of the f64 summation error.
    fn naive(g: &Group) -> (Vec<f64>, Vec<f64>) {
        let (a, b) = (g.a.dequantize_block_scaled(), g.b.dequantize_block_scaled());
        let k = g.k();
        let mut out = vec![0.0; g.m() * g.n()];
        let mut mag = vec![0.0; g.m() * g.n()];
        for i in 0..g.m() {
            for j in 0..g.n() {
                let (mut s, mut t) = (0.0f64, 0.0f64);
                for c in 0..k {
                    let p = f64::from(a[i * k + c]) * f64::from(b[j * k + c]);
                    s += p;
                    t += p.abs();
                }
                out[i * g.n() + j] = s * g.effective_alpha();
                mag[i * g.n() + j] = t * g.effective_alpha().abs();
            }
        }
        (out, mag)
    }

    #[test]
    fn hand_checked_1x64_by_1x64() {
        // A = [1.5, -0.5, 6, 0, ...] with scales [1, 2, 0.5, 4]; B = all 1.0 with scale 1 except
        // element 16 (= 3.0) and element 63 (= -2.0).
        let mut a = vec![0u8; 64];
        a[0] = 0x3; // 1.5 * 1
        a[1] = 0x9; // -0.5 * 1
        a[2] = 0x7; // 6 * 1
        a[16] = 0x5; // 3 * 2
        a[40] = 0x2; // 1 * 0.5
        a[63] = 0xC; // -2 * 4
        let b: Vec<u8> = (0..64)
            .map(|c| match c {
                16 => 0x5,
                63 => 0xC,
                _ => 0x2,
            })
            .collect();
        let am = Nvfp4Matrix::from_plain_scales(1, 64, pack_e2m1(&a), &[0x38, 0x40, 0x30, 0x48], 1.0).unwrap();
        let bm = Nvfp4Matrix::from_plain_scales(1, 64, pack_e2m1(&b), &[E4M3_ONE; 4], 1.0).unwrap();
        // 1.5 - 0.5 + 6 + (3*2)*3 + (1*0.5)*1 + (-2*4)*(-2) = 7 + 18 + 0.5 + 16 = 41.5
        let g = Group::new(am, bm, 1.0).unwrap();
        let c = reference_grouped_gemm(std::slice::from_ref(&g)).unwrap();
        assert_eq!((c[0].rows, c[0].cols), (1, 1));
        assert_eq!(c[0].get(0, 0).to_f32(), 41.5);
        // alpha and both global scales multiply in.
        let mut g2 = g.clone();
        g2.alpha = 0.5;
        g2.a.set_global_scale(2.0);
        g2.b.set_global_scale(0.25);
        assert_eq!(g2.effective_alpha(), 0.25);
        let c2 = reference_grouped_gemm_f64(&[g2]).unwrap();
        assert_eq!(c2[0].data, vec![41.5 * 0.25]);
    }

    #[test]
    fn matches_the_naive_definition() {
        let shapes = GroupShape::zip(&[3, 17, 1, 0, 9], &[5, 70, 1, 8, 0], &[64, 128, 192, 64, 64]).unwrap();
        for dist in [InputDistribution::Competition, InputDistribution::FullRange] {
            let mut groups = random_groups(&shapes, dist, 1234).unwrap();
            groups[1].alpha = 0.375;
            if dist == InputDistribution::FullRange {
                for g in &mut groups {
                    g.alpha = 2f32.powi(-24);
                }
            }
            let got = reference_grouped_gemm_f64(&groups).unwrap();
            let h = reference_grouped_gemm(&groups).unwrap();
            let bf = reference_grouped_gemm_bf16(&groups).unwrap();
            for (gi, g) in groups.iter().enumerate() {
                let (want, mag) = naive(g);
                assert_eq!((got[gi].rows, got[gi].cols), (g.m(), g.n()));
                for (idx, (&x, &w)) in got[gi].data.iter().zip(&want).enumerate() {
                    // Exact block terms summed in a different order: equal up to f64 rounding.
                    assert!((x - w).abs() <= 1e-13 * mag[idx], "group {gi} elem {idx}: {x} vs {w}");
                    assert_eq!(h[gi].data[idx], crate::codec::f64_to_f16(x));
                    assert_eq!(bf[gi].data[idx], crate::codec::f64_to_bf16(x));
                }
            }
        }
    }

    #[test]
    fn competition_inputs_are_summed_exactly() {
        // With competition inputs every partial sum is a multiple of 1/4 far below 2^53: the
        // result equals an integer computation.
        let groups = random_groups(&[GroupShape::new(7, 9, 512)], InputDistribution::Competition, 77).unwrap();
        let got = reference_grouped_gemm_f64(&groups).unwrap();
        let g = &groups[0];
        for i in 0..7 {
            for j in 0..9 {
                let mut s: i64 = 0;
                for c in 0..512 {
                    let (x, y) = (g.a.block_scaled_value(i, c), g.b.block_scaled_value(j, c));
                    s += (x * 4.0) as i64 * (y * 4.0) as i64;
                }
                assert_eq!(got[0].get(i, j), s as f64 / 16.0);
            }
        }
    }

    #[test]
    fn nan_scales_propagate_and_bad_groups_are_rejected() {
        let mut groups = random_groups(&[GroupShape::new(2, 3, 64)], InputDistribution::Competition, 1).unwrap();
        let off = crate::layout::blocked_offset(1, 2, 64);
        groups[0].a.scales_mut()[off] = 0x7F;
        let c = reference_grouped_gemm(&groups).unwrap();
        assert!((0..3).all(|j| c[0].get(1, j).is_nan()));
        assert!((0..3).all(|j| !c[0].get(0, j).is_nan()));

        let mut rng = SplitMix64::new(0);
        let a = crate::generate::random_matrix(2, 64, InputDistribution::Competition, &mut rng).unwrap();
        let b = crate::generate::random_matrix(2, 128, InputDistribution::Competition, &mut rng).unwrap();
        assert_eq!(Group::new(a.clone(), b.clone(), 1.0), Err(FormatError::KMismatch { group: 0, a_k: 64, b_k: 128 }));
        let bad = Group { a: a.clone(), b, alpha: 1.0 };
        let good = Group::new(a.clone(), a, 1.0).unwrap();
        assert_eq!(reference_grouped_gemm(&[good, bad]), Err(FormatError::KMismatch { group: 1, a_k: 64, b_k: 128 }));
        let a48 = Nvfp4Matrix::zeros(1, 48).unwrap();
        assert_eq!(Group::new(a48.clone(), a48, 1.0), Err(FormatError::BadK { k: 48, multiple: 64 }));
    }

    #[test]
    fn uneven_task_split() {
        // n not a multiple of 4 nor of ROWS_PER_TASK exercises both remainder paths.
        let groups =
            random_groups(&[GroupShape::new(5, ROWS_PER_TASK + 7, 64)], InputDistribution::FullRange, 3).unwrap();
        let got = reference_grouped_gemm_f64(&groups).unwrap();
        let (want, mag) = naive(&groups[0]);
        for ((x, w), t) in got[0].data.iter().zip(want).zip(mag) {
            assert!((x - w).abs() <= 1e-13 * t);
        }
    }
}
