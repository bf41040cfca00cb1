//! W4A16 on sm_90a: f16 or bf16 activations times NVFP4 weights (docs/w4a16.md). This module
//! holds the one-time step that prepares a weight matrix for it: [`prepack`] moves the K
//! permutation that W4A4 applies to the tokens into the weights, folds each block's scale sign
//! into its codes, and re-encodes the scales so that the kernel converts them to f16 or bf16 with
//! one instruction (`nvfp4_gemm_abi::sm90::w4a16`). The result has the sizes and the blocked scale
//! layout of the matrix it came from, so it uploads like any NVFP4 operand.
//!
//! The f16 kernels (`sm90_w4a16_gemm`, `sm90_w4a16_gemm_decode`) run the W4A4 kernels' tiles and
//! work lists ([`layout`]) on tables whose token maps point at the caller's activations
//! ([`tables_with`]); they run in the device model (`model-tests`). No plan launches them on a GPU
//! yet, and the bf16 kernels are not built (docs/w4a16.md).

use crate::driver::tensor_map::TiledMapEncoder;
use crate::error::{Error, Result};
use crate::problem::{GroupBuffers, Problem};
use crate::sm90::Sm90Layout;
use nvfp4_format::Nvfp4Matrix;
pub use nvfp4_gemm_abi::sm90::w4a16::Activations;
use nvfp4_gemm_abi::sm90::w4a16::{prepack_chunk_row, prepacked_scale};
use nvfp4_gemm_abi::sm90::{GemmConfig, GroupParams, CHUNK_K};
use nvfp4_gemm_abi::tensor_map::TensorMap;

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
/// sm_90a operand. f16: each chunk row's codes permuted, the scales as given; bf16: the codes
/// permuted with each block's scale sign folded in (a zero scale's codes zeroed), the scales
/// re-encoded (`nvfp4_gemm_abi::sm90::w4a16::prepacked_scale`).
pub fn prepack(m: &Nvfp4Matrix, activations: Activations) -> Result<W4a16Weights> {
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
            let fold = activations == Activations::Bf16;
            let negate = core::array::from_fn(|b| fold && scale(b) & 0x80 != 0);
            let zero = core::array::from_fn(|b| fold && scale(b) & 0x7F == 0);
            values[at..at + chunk_bytes].copy_from_slice(&prepack_chunk_row(row, negate, zero));
        }
    }
    // Every byte of the blocked buffer, padding included (what padding holds reaches only rows
    // and columns that are never stored; re-encoded, a finite padding byte stays finite).
    let scales = match activations {
        Activations::F16 => m.scales().to_vec(),
        Activations::Bf16 => m.scales().iter().map(|&b| prepacked_scale(b)).collect(),
    };
    Ok(W4a16Weights { rows, k, values, scales, global_scale: m.global_scale() })
}

/// The layout of a W4A16 problem on `sm_count` SMs: the W4A4 layout (work list, tiles, grid) of
/// the configuration the W4A16 kernels compile — the decode one when every group has at most 16
/// tokens, else `GENERAL`.
pub fn layout(problem: &Problem, sm_count: u32) -> Sm90Layout {
    let config = nvfp4_gemm_abi::sm90::config_for(problem.groups().iter().map(|s| s.m as u32));
    Sm90Layout::with_config(problem, sm_count, config)
        .expect("both configurations run every problem they are chosen for")
}

/// The W4A16 kernel (f16 activations) of a [`layout`].
pub fn kernel_name(layout: &Sm90Layout) -> &'static str {
    debug_assert!(layout.config == GemmConfig::GENERAL || layout.config == GemmConfig::DECODE);
    nvfp4_gemm_abi::sm90::w4a16::kernel_name(layout.config)
}

/// The group table and tensor maps of a W4A16 call: `buffers` as for W4A4 with `b_values` /
/// `b_scales` the prepacked weights (A's buffers unused), and group `g`'s tokens the f16
/// activations `[m, K]` at device address `tokens[g]` (natural order, read through the token
/// maps, 16-byte aligned).
pub fn tables_with(
    layout: &Sm90Layout,
    encoder: &impl TiledMapEncoder,
    problem: &Problem,
    buffers: &[GroupBuffers],
    tokens: &[u64],
) -> Result<(Vec<GroupParams>, Vec<TensorMap>)> {
    let mut params = layout.group_params(problem, buffers, 0);
    for (p, &t) in params.iter_mut().zip(tokens) {
        p.workspace = t;
    }
    let maps = layout.maps_with(encoder, problem, buffers, &params)?;
    Ok((params, maps))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvfp4_format::codec::{e2m1_to_f32, e4m3_to_f32};
    use nvfp4_format::layout::blocked_offset;
    use nvfp4_format::{random_matrix, InputDistribution, SplitMix64};
    use nvfp4_gemm_abi::sm90::w4a16::{packed_column, scale_bf16_bits, BF16_PRODUCT_EXPONENT};

    fn bf16(bits: u16) -> f64 {
        half::bf16::from_bits(bits).to_f64()
    }

    /// What a consumer thread of the W4A16 kernels computes from the prepacked bytes — thread `q`'s
    /// 8 bytes of each chunk row, decoder pair `p` (nibbles `p % 4` and `+ 4` of word `p / 4`), the
    /// scale of block `p / 2` — equals, for the natural column the pair stands for, the matrix's
    /// `code · scale` (times 2⁻¹⁴ through the f16 decode, 2⁻⁷ through the bf16 one), exactly in
    /// the 16-bit type; over random matrices whose scales include negative, zero and subnormal
    /// codes.
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
            assert_eq!(f.scales, m.scales(), "f16: the scales as given");
            assert_eq!((w.values.len(), w.scales.len()), (m.values().len(), m.scales().len()));
            // What thread `q` decodes from a prepacked buffer: pair `p` of its 8 bytes (nibbles
            // `p % 4` and `+ 4` of word `p / 4`), the natural column each value stands for, and
            // the scale byte of block `p / 2`.
            let view = |w: &W4a16Weights, i: usize, c: usize, q: u32, p: u32, nibble: u32| {
                let bytes = &w.values[i * k / 2 + c * 32 + 8 * q as usize..][..8];
                let word = u32::from_le_bytes(bytes[4 * (p / 4) as usize..][..4].try_into().unwrap());
                let code = ((word >> (4 * nibble)) & 0xF) as u8;
                let col = 64 * c + packed_column(q, p / 4, nibble) as usize;
                (e2m1_to_f32(code) as f64, col, w.scales[blocked_offset(i, 4 * c + (p / 2) as usize, k)])
            };
            for i in 0..rows {
                for c in 0..k / 64 {
                    for q in 0..4u32 {
                        for p in 0..8u32 {
                            for (u, nibble) in [(0, p % 4), (1, p % 4 + 4)] {
                                let exact = |col: usize| m.block_scaled_value(i, col) as f64;
                                // f16: the decoder's value ×2⁻¹⁴ times the e4m3 scale, as W4A4.
                                let (value, col, sbyte) = view(&f, i, c, q, p, nibble);
                                assert_eq!(col % 2, u, "the pair's low value is its even column");
                                let via_f16 = value * 2f64.powi(-14) * e4m3_to_f32(sbyte) as f64;
                                let want = exact(col) * 2f64.powi(-14);
                                assert_eq!(via_f16, want, "f16: case {case} row {i} col {col}");
                                assert_eq!(half::f16::from_f64(want).to_f64(), want, "exact in f16");
                                // bf16: the decoder's value ×2⁻¹²⁶ times the re-encoded scale.
                                let (value, col, sbyte) = view(&w, i, c, q, p, nibble);
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
