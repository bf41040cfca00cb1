//! The host-side NVFP4 matrix.

use half::{bf16, f16};

use crate::codec::{e2m1_to_f32, e4m3_to_f32};
use crate::error::FormatError;
use crate::layout::{self, SCALE_VEC};

/// A `rows x k` NVFP4 matrix, K-major (each row holds `k` consecutive values along K).
///
/// * `values`: e2m1 codes, two per byte, element `2j` of a row in the LOW nibble of byte `j`; a row
///   is `k/2` bytes, rows are contiguous (`rows * k / 2` bytes).
/// * `scales`: e4m3fn block scales, one per 16 consecutive values of a row, in the 128x4 blocked
///   layout (see [`crate::layout`]), padded to 128 rows and 4 scale columns; padding is zero when
///   built by this crate.
/// * `global_scale`: the second-level fp32 scale (1.0 when absent).
///
/// Element `(i, c)` is `e2m1(values) * e4m3(scale(i, c/16)) * global_scale`. The product of the
/// first two factors is exact in `f32`, `f16` and `bf16`.
///
/// Invariant (checked by every constructor): `k` is a positive multiple of 16, `rows` and `k` fit
/// in `u32`, and both buffers have exactly the lengths above.
#[derive(Clone, Debug, PartialEq)]
pub struct Nvfp4Matrix {
    rows: usize,
    k: usize,
    values: Vec<u8>,
    scales: Vec<u8>,
    global_scale: f32,
}

fn check_len(what: &'static str, expected: usize, actual: usize) -> Result<(), FormatError> {
    if expected == actual {
        Ok(())
    } else {
        Err(FormatError::BadLength { what, expected, actual })
    }
}

impl Nvfp4Matrix {
    /// Builds a matrix from packed values and BLOCKED scales (length
    /// [`layout::blocked_len`]`(rows, k)`).
    pub fn new(
        rows: usize,
        k: usize,
        values: Vec<u8>,
        blocked_scales: Vec<u8>,
        global_scale: f32,
    ) -> Result<Self, FormatError> {
        let scales_len = layout::blocked_len(rows, k)?;
        check_len("packed values", rows * k / 2, values.len())?;
        check_len("blocked scales", scales_len, blocked_scales.len())?;
        Ok(Self { rows, k, values, scales: blocked_scales, global_scale })
    }

    /// Builds a matrix from packed values and PLAIN `[rows, k/16]` row-major scales.
    pub fn from_plain_scales(
        rows: usize,
        k: usize,
        values: Vec<u8>,
        plain_scales: &[u8],
        global_scale: f32,
    ) -> Result<Self, FormatError> {
        let blocked = layout::plain_to_blocked(plain_scales, rows, k)?;
        Self::new(rows, k, values, blocked, global_scale)
    }

    /// An all-zero matrix (values `+0`, scales `0.0`) with global scale 1.
    pub fn zeros(rows: usize, k: usize) -> Result<Self, FormatError> {
        let scales = vec![0u8; layout::blocked_len(rows, k)?];
        Self::new(rows, k, vec![0u8; rows * k / 2], scales, 1.0)
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row (K).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Packed e2m1 values, `rows * k / 2` bytes.
    pub fn values(&self) -> &[u8] {
        &self.values
    }

    /// Mutable packed values (the length cannot change).
    pub fn values_mut(&mut self) -> &mut [u8] {
        &mut self.values
    }

    /// Blocked e4m3fn scales, padding included.
    pub fn scales(&self) -> &[u8] {
        &self.scales
    }

    /// Mutable blocked scales (the length cannot change).
    pub fn scales_mut(&mut self) -> &mut [u8] {
        &mut self.scales
    }

    /// The second-level fp32 scale.
    pub fn global_scale(&self) -> f32 {
        self.global_scale
    }

    /// Sets the second-level fp32 scale.
    pub fn set_global_scale(&mut self, global_scale: f32) {
        self.global_scale = global_scale;
    }

    /// Takes the matrix apart: `(rows, k, values, blocked scales, global scale)`.
    pub fn into_parts(self) -> (usize, usize, Vec<u8>, Vec<u8>, f32) {
        (self.rows, self.k, self.values, self.scales, self.global_scale)
    }

    /// Number of scale columns, `k / 16`.
    pub fn scale_cols(&self) -> usize {
        self.k / SCALE_VEC
    }

    /// The scales in the plain `[rows, k/16]` row-major layout.
    pub fn plain_scales(&self) -> Vec<u8> {
        layout::blocked_to_plain(&self.scales, self.rows, self.k)
            .expect("the matrix invariant guarantees the blocked length")
    }

    /// The e4m3fn scale code of row `i`, scale column `j` (values `16j..16j+16`). Panics when out
    /// of range.
    pub fn scale_code(&self, i: usize, j: usize) -> u8 {
        assert!(i < self.rows && j < self.scale_cols(), "scale ({i}, {j}) out of range");
        self.scales[layout::blocked_offset(i, j, self.k)]
    }

    /// The e2m1 code of element `(i, c)`. Panics when out of range.
    pub fn code(&self, i: usize, c: usize) -> u8 {
        assert!(i < self.rows && c < self.k, "element ({i}, {c}) out of range");
        let byte = self.values[i * self.k / 2 + c / 2];
        if c % 2 == 0 {
            byte & 0xF
        } else {
            byte >> 4
        }
    }

    /// Fills the scale buffer's padding (rows beyond `rows`, scale columns beyond `k/16`) with
    /// `byte`. Useful to check that a kernel never lets padding reach a stored output (the
    /// competition's generator leaves random 1.0 / 2.0 scales there).
    pub fn set_scale_padding(&mut self, byte: u8) {
        let mut used = vec![false; self.scales.len()];
        for i in 0..self.rows {
            for j in 0..self.scale_cols() {
                used[layout::blocked_offset(i, j, self.k)] = true;
            }
        }
        for (s, used) in self.scales.iter_mut().zip(used) {
            if !used {
                *s = byte;
            }
        }
    }

    /// Element `(i, c)`: `e2m1 * scale * global_scale`, rounded once to `f32` (exact when the
    /// global scale is a power of two). Panics when out of range.
    pub fn value(&self, i: usize, c: usize) -> f32 {
        self.block_scaled_value(i, c) * self.global_scale
    }

    /// Element `(i, c)` without the global scale: `e2m1 * scale`, exact. Panics when out of range.
    pub fn block_scaled_value(&self, i: usize, c: usize) -> f32 {
        e2m1_to_f32(self.code(i, c)) * e4m3_to_f32(self.scale_code(i, c / SCALE_VEC))
    }

    /// Writes row `i` without the global scale (`e2m1 * scale`, exact) into `out[..k]`.
    fn block_scaled_row_into(&self, i: usize, out: &mut [f32]) {
        let row = &self.values[i * self.k / 2..(i + 1) * self.k / 2];
        for (j, (bytes, out)) in row.chunks_exact(SCALE_VEC / 2).zip(out.chunks_exact_mut(SCALE_VEC)).enumerate() {
            let s = e4m3_to_f32(self.scales[layout::blocked_offset(i, j, self.k)]);
            for (byte, pair) in bytes.iter().zip(out.chunks_exact_mut(2)) {
                pair[0] = e2m1_to_f32(byte & 0xF) * s;
                pair[1] = e2m1_to_f32(byte >> 4) * s;
            }
        }
    }

    /// Splits row `i` into its e2m1 values (unscaled, as `f32`) and its block scales (as `f32`).
    /// Used by the reference GEMM.
    pub(crate) fn row_codes_and_scales(&self, i: usize, codes: &mut [f32], scales: &mut [f32]) {
        let row = &self.values[i * self.k / 2..(i + 1) * self.k / 2];
        for (byte, pair) in row.iter().zip(codes.chunks_exact_mut(2)) {
            pair[0] = e2m1_to_f32(byte & 0xF);
            pair[1] = e2m1_to_f32(byte >> 4);
        }
        for (j, s) in scales.iter_mut().enumerate().take(self.scale_cols()) {
            *s = e4m3_to_f32(self.scales[layout::blocked_offset(i, j, self.k)]);
        }
    }

    /// All elements, row-major `rows x k`, with the global scale: `e2m1 * scale * global_scale`
    /// rounded once to `f32` (exact when the global scale is a power of two).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = self.dequantize_block_scaled();
        if self.global_scale != 1.0 {
            for x in &mut out {
                *x *= self.global_scale;
            }
        }
        out
    }

    /// All elements, row-major, with the global scale, in `f64` (exact: the product of an
    /// e2m1 * e4m3 value and an `f32` fits an `f64`).
    pub fn dequantize_f64(&self) -> Vec<f64> {
        let g = f64::from(self.global_scale);
        self.dequantize_block_scaled().into_iter().map(|x| f64::from(x) * g).collect()
    }

    /// All elements, row-major, WITHOUT the global scale (`e2m1 * scale`), exact.
    pub fn dequantize_block_scaled(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.rows * self.k];
        if self.k > 0 {
            for (i, row) in out.chunks_exact_mut(self.k).enumerate() {
                self.block_scaled_row_into(i, row);
            }
        }
        out
    }

    /// All elements, row-major, WITHOUT the global scale, as `f16` (exact: e2m1 * e4m3 has at most
    /// 6 significant bits and magnitude in `[2^-10, 2688]`). What a Hopper kernel feeds to its
    /// 16-bit MMA; apply the global scale as part of alpha.
    pub fn dequantize_block_scaled_f16(&self) -> Vec<f16> {
        self.dequantize_block_scaled().into_iter().map(f16::from_f32).collect()
    }

    /// All elements, row-major, WITHOUT the global scale, as `bf16` (exact, as for `f16`).
    pub fn dequantize_block_scaled_bf16(&self) -> Vec<bf16> {
        self.dequantize_block_scaled().into_iter().map(bf16::from_f32).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{pack_e2m1, E2M1_VALUES, E4M3_ONE, E4M3_TWO};

    fn small() -> Nvfp4Matrix {
        // 2 x 32: row 0 holds codes 0..16 then 0..16 again; row 1 holds their negatives.
        let mut codes = Vec::new();
        for r in 0..2u8 {
            for c in 0..32u8 {
                codes.push((c % 16) ^ (r * 8));
            }
        }
        let plain = [E4M3_ONE, E4M3_TWO, 0x30 /* 0.5 */, 0x48 /* 4.0 */];
        Nvfp4Matrix::from_plain_scales(2, 32, pack_e2m1(&codes), &plain, 0.5).unwrap()
    }

    #[test]
    fn hand_checked_values() {
        let m = small();
        assert_eq!(m.values().len(), 32);
        assert_eq!(m.scales().len(), 512);
        assert_eq!(m.plain_scales(), vec![0x38, 0x40, 0x30, 0x48]);
        assert_eq!(m.code(0, 7), 7);
        assert_eq!(m.code(1, 7), 15);
        // Row 0, column 7: 6.0 * 1.0 * 0.5; column 16 + 7: 6.0 * 2.0 * 0.5.
        assert_eq!(m.value(0, 7), 3.0);
        assert_eq!(m.value(0, 23), 6.0);
        // Row 1, column 5: -3.0 * 0.5 * 0.5; column 16 + 1: -0.5 * 4 * 0.5.
        assert_eq!(m.value(1, 5), -0.75);
        assert_eq!(m.value(1, 17), -1.0);
        assert_eq!(m.block_scaled_value(1, 17), -2.0);
        let d = m.dequantize();
        for i in 0..2 {
            for c in 0..32 {
                assert_eq!(d[i * 32 + c], m.value(i, c));
                let scale = [1.0, 2.0, 0.5, 4.0][i * 2 + c / 16];
                assert_eq!(d[i * 32 + c], E2M1_VALUES[(c % 16) ^ (i * 8)] * scale * 0.5);
            }
        }
        let d16 = m.dequantize_block_scaled_f16();
        let db16 = m.dequantize_block_scaled_bf16();
        let d64 = m.dequantize_f64();
        for (x, ((h, b), w)) in d.iter().zip(d16.iter().zip(&db16).zip(&d64)) {
            assert_eq!(h.to_f32() * 0.5, *x);
            assert_eq!(b.to_f32() * 0.5, *x);
            assert_eq!(*w, f64::from(*x));
        }
    }

    #[test]
    fn constructors_check_k_and_lengths() {
        assert_eq!(Nvfp4Matrix::zeros(4, 24), Err(FormatError::BadK { k: 24, multiple: 16 }));
        assert!(matches!(
            Nvfp4Matrix::new(4, 32, vec![0; 63], vec![0; 512], 1.0),
            Err(FormatError::BadLength { what: "packed values", expected: 64, actual: 63 })
        ));
        assert!(matches!(
            Nvfp4Matrix::new(4, 32, vec![0; 64], vec![0; 8], 1.0),
            Err(FormatError::BadLength { what: "blocked scales", .. })
        ));
        assert!(matches!(
            Nvfp4Matrix::from_plain_scales(4, 32, vec![0; 64], &[0; 7], 1.0),
            Err(FormatError::BadLength { what: "plain scales", .. })
        ));
        let empty = Nvfp4Matrix::zeros(0, 64).unwrap();
        assert!(empty.dequantize().is_empty() && empty.scales().is_empty());
    }

    #[test]
    fn scale_padding_can_be_poisoned_without_touching_real_scales() {
        let mut m = small();
        let before = m.dequantize();
        m.set_scale_padding(0x7F);
        assert_eq!(m.dequantize(), before);
        assert_eq!(m.scales().iter().filter(|&&s| s == 0x7F).count(), 512 - 4);
    }
}
