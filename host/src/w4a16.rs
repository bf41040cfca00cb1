//! W4A16 on sm_90a: f16 or bf16 activations times NVFP4 weights (docs/w4a16.md). This module
//! holds the one-time step that prepares a weight matrix for it: [`prepack`] moves the K
//! permutation that W4A4 applies to the tokens into the weights, folds each block's scale sign
//! into its codes, and re-encodes the scales so that the kernel converts them to f16 or bf16 with
//! one instruction (`nvfp4_gemm_abi::sm90::w4a16`). The result has the sizes and the blocked scale
//! layout of the matrix it came from, so it uploads like any NVFP4 operand. The kernels that read
//! it are not built yet.

use crate::error::{Error, Result};
use nvfp4_format::layout::blocked_offset;
use nvfp4_format::Nvfp4Matrix;
use nvfp4_gemm_abi::sm90::w4a16::{prepack_chunk_row, prepacked_scale};
use nvfp4_gemm_abi::sm90::CHUNK_K;

/// A weight matrix prepacked for W4A16: values `rows × K/2` bytes (each 64-wide chunk row
/// permuted), scales in the 128x4 blocked layout (each byte re-encoded), and the matrix's global
/// scale.
#[derive(Debug, Clone, PartialEq)]
pub struct W4a16Weights {
    /// Rows (N).
    pub rows: usize,
    /// Reduction length (a multiple of 64).
    pub k: usize,
    /// The prepacked values.
    pub values: Vec<u8>,
    /// The prepacked scales, blocked layout.
    pub scales: Vec<u8>,
    /// The global scale of the matrix, unchanged.
    pub global_scale: f32,
}

/// Prepacks `m` for W4A16 (CPU). K must be a multiple of 64, as for every sm_90a operand.
pub fn prepack(m: &Nvfp4Matrix) -> Result<W4a16Weights> {
    let (rows, k) = (m.rows(), m.k());
    if k % CHUNK_K as usize != 0 {
        return Err(Error::InvalidProblem(format!("k = {k} is not a multiple of {CHUNK_K}")));
    }
    let chunk_bytes = CHUNK_K as usize / 2;
    let mut values = vec![0u8; m.values().len()];
    for i in 0..rows {
        for c in 0..k / CHUNK_K as usize {
            let at = i * k / 2 + c * chunk_bytes;
            let row: &[u8; 32] = m.values()[at..at + chunk_bytes].try_into().expect("32 bytes");
            let scale = |b: usize| m.scale_code(i, 4 * c + b);
            let negate = core::array::from_fn(|b| scale(b) & 0x80 != 0);
            let zero = core::array::from_fn(|b| scale(b) & 0x7F == 0);
            values[at..at + chunk_bytes].copy_from_slice(&prepack_chunk_row(row, negate, zero));
        }
    }
    // Every byte of the blocked buffer, padding included (what padding holds reaches only rows
    // and columns that are never stored; re-encoded, a finite padding byte stays finite).
    let scales = m.scales().iter().map(|&b| prepacked_scale(b)).collect();
    debug_assert_eq!(blocked_offset(0, 0, k), 0);
    Ok(W4a16Weights { rows, k, values, scales, global_scale: m.global_scale() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvfp4_format::codec::{e2m1_to_f32, e4m3_to_f32};
    use nvfp4_format::{random_matrix, InputDistribution, SplitMix64};
    use nvfp4_gemm_abi::sm90::w4a16::{packed_column, scale_bf16_bits, scale_f16_bits, PRODUCT_EXPONENT};

    fn f16(bits: u16) -> f64 {
        half::f16::from_bits(bits).to_f64()
    }

    fn bf16(bits: u16) -> f64 {
        half::bf16::from_bits(bits).to_f64()
    }

    /// What a consumer thread of the W4A16 kernel computes from the prepacked bytes — thread `q`'s
    /// 8 bytes of each chunk row, decoder pair `p` (nibbles `p % 4` and `+ 4` of word `p / 4`), the
    /// scale of block `p / 2` — equals, for the natural column the pair stands for, the matrix's
    /// `code · scale` times 2⁻⁷, through the f16 and the bf16 decode; over random
    /// matrices whose scales include negative, zero and subnormal codes.
    #[test]
    fn the_kernels_view_of_the_prepacked_weights_is_the_matrix() {
        let mut rng = SplitMix64::new(0x4A16);
        for case in 0..6 {
            let (rows, k) = (1 + rng.below(140) as usize, 64 * (1 + rng.below(5) as usize));
            let mut m = random_matrix(rows, k, InputDistribution::FullRange, &mut rng).unwrap();
            // Negative, zero and subnormal scales in some blocks (no NaN: products would be NaN).
            for i in 0..rows {
                for j in 0..k / 16 {
                    let at = blocked_offset(i, j, k);
                    let s = &mut m.scales_mut()[at];
                    match rng.below(8) {
                        0 => *s |= 0x80,
                        1 => *s = 0,
                        2 => *s = 1 + rng.below(7) as u8,
                        _ if *s & 0x7F == 0x7F => *s = 0x38,
                        _ => {}
                    }
                }
            }
            let w = prepack(&m).unwrap();
            assert_eq!((w.values.len(), w.scales.len()), (m.values().len(), m.scales().len()));
            for i in 0..rows {
                for c in 0..k / 64 {
                    for q in 0..4u32 {
                        let bytes = &w.values[i * k / 2 + c * 32 + 8 * q as usize..][..8];
                        for p in 0..8u32 {
                            let word = u32::from_le_bytes(bytes[4 * (p / 4) as usize..][..4].try_into().unwrap());
                            let block = 4 * c + (p / 2) as usize;
                            let sbyte = w.scales[blocked_offset(i, block, k)];
                            for (u, nibble) in [(0, p % 4), (1, p % 4 + 4)] {
                                let code = ((word >> (4 * nibble)) & 0xF) as u8;
                                let col = 64 * c + packed_column(q, p / 4, nibble) as usize;
                                assert_eq!(col % 2, u, "the pair's low value is its even column");
                                let want = m.block_scaled_value(i, col) as f64 * 2f64.powi(-(PRODUCT_EXPONENT as i32));
                                let value = e2m1_to_f32(code) as f64;
                                // The decoders' values: ×2⁻¹⁴ in f16, ×2⁻¹²⁶ in bf16.
                                let via_f16 = value * 2f64.powi(-14) * f16(scale_f16_bits(sbyte));
                                let via_bf16 = value * 2f64.powi(-126) * bf16(scale_bf16_bits(sbyte));
                                assert_eq!(via_f16, want, "case {case} row {i} col {col}");
                                // Exact in the decode's 16-bit type (the kernel multiplies there).
                                assert_eq!(half::f16::from_f64(want).to_f64(), want, "f16");
                                assert_eq!(half::bf16::from_f64(want).to_f64(), want, "bf16");
                                assert!(
                                    want == 0.0
                                        || want.abs() >= 2f64.powi(-17)
                                            && want.abs() >= f64::from(half::bf16::MIN_POSITIVE),
                                    "bf16 normal"
                                );
                                assert_eq!(via_bf16, want, "case {case} row {i} col {col}");
                            }
                        }
                    }
                }
            }
            // Spot check against the codec: a block's scale magnitude survives.
            assert_eq!(
                f16(scale_f16_bits(w.scales[blocked_offset(0, 0, k)])),
                e4m3_to_f32(m.scale_code(0, 0)).abs() as f64 * 128.0
            );
        }
        assert!(prepack(&nvfp4_format::Nvfp4Matrix::zeros(2, 32).unwrap()).is_err());
    }
}
