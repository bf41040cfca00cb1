//! W4A16 on sm_90a: f16 or bf16 activations times NVFP4 weights (docs/w4a16.md). W4A16 is a
//! token kind of the problem ([`crate::TokenKind::Dense`]): [`crate::GemmPlan`] and
//! [`crate::MoePlan`] run it with the W4A4 kernels' tiles and work lists and the W4A16 twins of
//! the GEMM kernels (`sm90_w4a16_gemm*` for f16, `sm90_w4a16_bf16_gemm*` for bf16), their token
//! maps over the caller's activations (no dequantization). This module holds the one-time step
//! that prepares a weight matrix for it: [`prepack`] moves the K permutation that W4A4 applies to
//! the tokens into the weights, stores each code's bits where the kernel's decoder finds them,
//! folds each block's scale sign into its codes (bf16), and pairs and re-encodes the scales so
//! that the kernel converts them with one or two instructions per k-step
//! (`nvfp4_gemm_abi::sm90::w4a16`). The result has the sizes and the blocked scale layout of the
//! matrix it came from, so it uploads like any NVFP4 operand. W4A16 on sm_100a, which multiplies
//! NVFP4 operands natively, is [`crate::Error::Unsupported`].

use crate::error::{Error, Result};
use crate::quantize::DenseFloat;
use nvfp4_format::layout::blocked_offset;
use nvfp4_format::Nvfp4Matrix;
pub use nvfp4_gemm_abi::sm90::w4a16::Activations;
use nvfp4_gemm_abi::sm90::w4a16::{prepack_chunk_row, prepacked_scale, scale_source, Decoder};
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

/// Prepacks `m` for W4A16 with `activations` (CPU). K must be a multiple of 64, as for every
/// sm_90a operand. Each chunk row's code bits move to the places of the activation type's
/// decoder (`nvfp4_gemm_abi::sm90::w4a16::prepack_chunk_row`); the scale bytes of rows `r` and
/// `r + 8` are paired by k-step (`scale_source`). bf16 also folds each block's scale sign into
/// its codes (a zero scale's codes zeroed) and re-encodes the scales
/// (`nvfp4_gemm_abi::sm90::w4a16::prepacked_scale`).
pub fn prepack(m: &Nvfp4Matrix, activations: Activations) -> Result<W4a16Weights> {
    let (rows, k) = (m.rows(), m.k());
    if k % CHUNK_K as usize != 0 {
        return Err(Error::InvalidProblem(format!("k = {k} is not a multiple of {CHUNK_K}")));
    }
    let chunk_bytes = CHUNK_K as usize / 2;
    let layout = Decoder::of(activations).layout();
    let mut values = vec![0u8; m.values().len()];
    for i in 0..rows {
        for c in 0..k / CHUNK_K as usize {
            let at = i * k / 2 + c * chunk_bytes;
            let row: &[u8; 32] = m.values()[at..at + chunk_bytes].try_into().expect("32 bytes");
            let scale = |b: usize| m.scale_code(i, 4 * c + b);
            let fold = activations == Activations::Bf16;
            let negate = core::array::from_fn(|b| fold && scale(b) & 0x80 != 0);
            let zero = core::array::from_fn(|b| fold && scale(b) & 0x7F == 0);
            values[at..at + chunk_bytes].copy_from_slice(&prepack_chunk_row(row, negate, zero, &layout));
        }
    }
    Ok(W4a16Weights {
        rows,
        k,
        values,
        scales: prepack_scales(m.scales(), k, activations),
        global_scale: m.global_scale(),
    })
}

/// The prepacked scale buffer of a blocked scale buffer for reduction length `k`: every byte,
/// padding rows included (what padding holds reaches only rows and columns that are never
/// stored; re-encoded, a finite padding byte stays finite), moved within its 16-row group as
/// `scale_source` says and, for bf16, re-encoded.
fn prepack_scales(scales: &[u8], k: usize, activations: Activations) -> Vec<u8> {
    let blocks = k / 16;
    let mut out = vec![0u8; scales.len()];
    for row in 0..scales.len() / blocks {
        let second = (row % 16) / 8;
        // The pair's rows: `r` (`r % 16 < 8`) and `r + 8`.
        let r = row - 8 * second;
        for chunk in 0..k / CHUNK_K as usize {
            for byte in 0..4 {
                let (step, block) = scale_source(activations, second as u32, byte as u32);
                let from = blocked_offset(r + 8 * step as usize, 4 * chunk + block as usize, k);
                let b = scales[from];
                out[blocked_offset(row, 4 * chunk + byte, k)] = match activations {
                    Activations::F16 => b,
                    Activations::Bf16 => prepacked_scale(b),
                };
            }
        }
    }
    out
}

/// The activations' type of a 16-bit float type (`f16` or `bf16`).
pub fn activations_of<T: DenseFloat>() -> Activations {
    T::ACTIVATIONS
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvfp4_format::codec::{e2m1_to_f32, e4m3_to_f32};
    use nvfp4_format::{random_matrix, InputDistribution, SplitMix64};
    use nvfp4_gemm_abi::sm90::w4a16::{packed_column, scale_bf16_bits, Decoder, BF16_PRODUCT_EXPONENT};

    /// A W4A16 call's buffers for `p`, stacked from `base` (activations, then weights, then C,
    /// each part 16-byte aligned), as `run_stacked` splits them.
    fn bf16(bits: u16) -> f64 {
        half::bf16::from_bits(bits).to_f64()
    }

    /// What a consumer thread of the W4A16 kernels computes from the prepacked bytes — thread `q`'s
    /// 8 bytes of each chunk row, decoder pair `p` (elements `p % 4` and `+ 4` of word `p / 4`, their
    /// bits where the decoder reads them), the scale of k-step `p / 2` from the two scale words it
    /// loads (rows `r` and `r + 8`: k-steps 0, 1 in the first, 2, 3 in the second; f16 half-word
    /// `j % 2`, bf16 byte `j % 2` for row `r` and `2 + j % 2` for row `r + 8`) — equals, for the
    /// natural column the pair stands for, the matrix's `code · scale` (times 2⁻¹⁴ through the f16
    /// decode, 2⁻⁷ through the bf16 one), exactly in the 16-bit type; over random matrices whose
    /// scales include negative, zero and subnormal codes.
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
            let (w, f) = (prepack(&m, Activations::Bf16).unwrap(), prepack(&m, Activations::F16).unwrap());
            assert_eq!((w.values.len(), w.scales.len()), (m.values().len(), m.scales().len()));
            // What thread `q` decodes from a prepacked buffer for row `i`: the code of element
            // `e` of pair `p`, the natural column it stands for, and the scale byte of k-step
            // `p / 2`.
            let view = |w: &W4a16Weights, act: Activations, i: usize, c: usize, q: u32, p: u32, e: u32| {
                let bytes = &w.values[i * k / 2 + c * 32 + 8 * q as usize..][..8];
                let word = u32::from_le_bytes(bytes[4 * (p / 4) as usize..][..4].try_into().unwrap());
                let code = Decoder::of(act).layout().code(word, e) as u8;
                let col = 64 * c + packed_column(q, p / 4, e) as usize;
                let (j, second_row) = ((p / 2) as usize, i % 16 / 8);
                let word_row = i - 8 * second_row + 8 * (j / 2);
                let byte = match act {
                    Activations::F16 => 2 * (j % 2) + second_row,
                    Activations::Bf16 => j % 2 + 2 * second_row,
                };
                (e2m1_to_f32(code) as f64, col, w.scales[blocked_offset(word_row, 4 * c + byte, k)])
            };
            for i in 0..rows {
                for c in 0..k / 64 {
                    for q in 0..4u32 {
                        for p in 0..8u32 {
                            for (u, e) in [(0, p % 4), (1, p % 4 + 4)] {
                                let exact = |col: usize| m.block_scaled_value(i, col) as f64;
                                // f16: the decoder's value ×2⁻¹⁴ times the e4m3 scale, as W4A4.
                                let (value, col, sbyte) = view(&f, Activations::F16, i, c, q, p, e);
                                assert_eq!(col % 2, u, "the pair's low value is its even column");
                                let via_f16 = value * 2f64.powi(-14) * e4m3_to_f32(sbyte) as f64;
                                let want = exact(col) * 2f64.powi(-14);
                                assert_eq!(via_f16, want, "f16: case {case} row {i} col {col}");
                                assert_eq!(half::f16::from_f64(want).to_f64(), want, "exact in f16");
                                // bf16: the decoder's value ×2⁻¹²⁶ times the re-encoded scale.
                                let (value, col, sbyte) = view(&w, Activations::Bf16, i, c, q, p, e);
                                let via_bf16 = value * 2f64.powi(-126) * bf16(scale_bf16_bits(sbyte));
                                let want = exact(col) * 2f64.powi(-(BF16_PRODUCT_EXPONENT as i32));
                                assert_eq!(via_bf16, want, "bf16: case {case} row {i} col {col}");
                                assert_eq!(half::bf16::from_f64(want).to_f64(), want, "exact in bf16");
                                assert!(want == 0.0 || want.abs() >= f64::from(half::bf16::MIN_POSITIVE), "normal");
                            }
                        }
                    }
                }
            }
        }
        assert!(prepack(&nvfp4_format::Nvfp4Matrix::zeros(2, 32).unwrap(), Activations::F16).is_err());
    }
}
