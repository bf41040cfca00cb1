//! Quantization to NVFP4 with NVIDIA's two-level recipe.
//!
//! For a `rows x k` row-major input `x`:
//! 1. per-tensor global scale `g = amax(|x|) / (6 * 448)` (an `f32`; 1.0 for an all-zero input), so
//!    that the block holding the tensor's amax gets the largest e4m3 scale, 448;
//! 2. per 16-value block scale `s = e4m3(block_amax / 6 / g)` (round to nearest even, saturating);
//! 3. values `q = e2m1(x / (s * g))` (round to nearest even, saturating to ±6); a block whose scale
//!    rounds to zero quantizes to zeros.
//!
//! The divisions are done in `f64`, so the only roundings are the two format encodings (and the
//! `f32` rounding of `g`). Dequantization is [`Nvfp4Matrix::dequantize`]: `q * s * g`.
//!
//! [`quantize`] rejects NaN and infinities (the global scale would be meaningless).
//! [`quantize_with_global_scale`] accepts them, with the same results as the library's GPU
//! quantizer (which cannot report an error without a host synchronisation):
//! - a block holding a NaN has a NaN amax, so its scale is the e4m3 NaN `0x7F` and every value
//!   code is `e2m1(NaN) = +6` (`0x7`): the whole block dequantizes to NaN;
//! - `±inf` makes the block's amax infinite, so its scale saturates to 448 (`0x7E`); the infinite
//!   values encode as `±6` and the others as `x / (448 g)`.

use rayon::prelude::*;

use crate::codec::{e2m1_from_f64, e4m3_from_f64, e4m3_to_f32, pack_e2m1, HostFloat, E2M1_MAX, E4M3_MAX, E4M3_NAN};
use crate::error::FormatError;
use crate::layout::{self, SCALE_VEC};
use crate::matrix::Nvfp4Matrix;

/// The recipe's global scale for a tensor whose largest magnitude is `amax`: `amax / (6 * 448)`,
/// or 1.0 when `amax` is zero.
pub fn global_scale_for_amax(amax: f32) -> f32 {
    if amax == 0.0 {
        1.0
    } else {
        (f64::from(amax) / (f64::from(E2M1_MAX) * f64::from(E4M3_MAX))) as f32
    }
}

/// Quantizes a row-major `rows x k` tensor (`f32`, `f64`, `f16` or `bf16`) to NVFP4 with the
/// two-level recipe (module docs). Errors: `k` not a positive multiple of 16, a length that is not
/// `rows * k`, or a NaN / infinity in the input.
pub fn quantize<T: HostFloat>(data: &[T], rows: usize, k: usize) -> Result<Nvfp4Matrix, FormatError> {
    check_input(data, rows, k)?;
    let amax = data.iter().fold(0.0f32, |m, &x| m.max(x.to_f32().abs()));
    quantize_unchecked(data, rows, k, global_scale_for_amax(amax))
}

/// Quantizes like [`quantize`] but with a caller-chosen global scale (1.0 gives plain one-level
/// block scaling). Block scales that would exceed 448 saturate, and so do the values then. NaN and
/// infinite inputs are accepted (see the module docs for what they produce). Errors: a global
/// scale that is not finite and positive, `k` not a positive multiple of 16, a length that is not
/// `rows * k`.
pub fn quantize_with_global_scale<T: HostFloat>(
    data: &[T],
    rows: usize,
    k: usize,
    global_scale: f32,
) -> Result<Nvfp4Matrix, FormatError> {
    if !(global_scale.is_finite() && global_scale > 0.0) {
        return Err(FormatError::BadGlobalScale { value: global_scale });
    }
    check_shape_and_length(data, rows, k)?;
    quantize_unchecked(data, rows, k, global_scale)
}

fn check_shape_and_length<T: HostFloat>(data: &[T], rows: usize, k: usize) -> Result<(), FormatError> {
    layout::check_shape(rows, k, SCALE_VEC)?;
    if data.len() != rows * k {
        return Err(FormatError::BadLength { what: "input", expected: rows * k, actual: data.len() });
    }
    Ok(())
}

fn check_input<T: HostFloat>(data: &[T], rows: usize, k: usize) -> Result<(), FormatError> {
    check_shape_and_length(data, rows, k)?;
    match data.iter().position(|x| !x.to_f64().is_finite()) {
        Some(index) => Err(FormatError::NonFinite { index }),
        None => Ok(()),
    }
}

/// Quantizes one block of 16: returns the scale code and writes the 16 value codes.
fn quantize_block<T: HostFloat>(block: &[T], global: f64, codes: &mut [u8]) -> u8 {
    // A NaN anywhere makes the block's amax NaN (`f64::max` would skip it), so its scale is the
    // e4m3 NaN and its values encode `NaN / NaN`.
    if block.iter().any(|x| x.to_f64().is_nan()) {
        codes.fill(e2m1_from_f64(f64::NAN));
        return E4M3_NAN;
    }
    let amax = block.iter().fold(0.0f64, |m, &x| m.max(x.to_f64().abs()));
    let scale = e4m3_from_f64(amax / f64::from(E2M1_MAX) / global);
    let unit = f64::from(e4m3_to_f32(scale)) * global;
    for (c, &x) in codes.iter_mut().zip(block) {
        *c = if unit == 0.0 { 0 } else { e2m1_from_f64(x.to_f64() / unit) };
    }
    scale
}

fn quantize_unchecked<T: HostFloat>(
    data: &[T],
    rows: usize,
    k: usize,
    global_scale: f32,
) -> Result<Nvfp4Matrix, FormatError> {
    let cols = k / SCALE_VEC;
    let mut values = vec![0u8; rows * k / 2];
    let mut plain = vec![0u8; rows * cols];
    let global = f64::from(global_scale);
    values.par_chunks_mut(k / 2).zip(plain.par_chunks_mut(cols)).zip(data.par_chunks(k)).for_each(
        |((packed_row, scale_row), row)| {
            let mut codes = [0u8; SCALE_VEC];
            for ((block, scale), packed) in
                row.chunks_exact(SCALE_VEC).zip(scale_row.iter_mut()).zip(packed_row.chunks_exact_mut(SCALE_VEC / 2))
            {
                *scale = quantize_block(block, global, &mut codes);
                packed.copy_from_slice(&pack_e2m1(&codes));
            }
        },
    );
    Nvfp4Matrix::from_plain_scales(rows, k, values, &plain, global_scale)
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};

    use super::*;
    use crate::codec::{self, e2m1_to_f32, E2M1_VALUES, E4M3_VALUES};
    use crate::rng::SplitMix64;

    #[test]
    fn hand_checked_block() {
        // One row of 16 whose amax is 6 * 448 = 2688: g = 2688 / 2688 = 1, block scale
        // e4m3(2688 / 6 / 1) = 448, unit = 448, so the values are encoded as x / 448 (exactly, so
        // the ties below are real ties).
        let row: Vec<f32> = [6.0, -6.0, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, -0.5, 0.25, 0.75, 2.5, 5.0, -5.5, 1.25]
            .iter()
            .map(|x| x * 448.0)
            .collect();
        let m = quantize(&row, 1, 16).unwrap();
        assert_eq!(m.global_scale(), 1.0);
        assert_eq!(m.plain_scales(), vec![0x7E]);
        let codes: Vec<u8> = (0..16).map(|c| m.code(0, c)).collect();
        // 0.25 -> 0 (tie to even), 0.75 -> 1.0 (tie to even), 2.5 -> 2.0, 5.0 -> 4.0, -5.5 -> -6,
        // 1.25 -> 1.0.
        assert_eq!(codes, vec![7, 15, 0, 1, 2, 3, 4, 5, 6, 9, 0, 2, 4, 6, 15, 2]);
        let d = m.dequantize();
        assert_eq!((d[0], d[11], d[13]), (2688.0, 448.0, 1792.0));

        // Amax 6: g = f32(6 / 2688) is not exactly 1/448, so the unit 448 g is 1 up to f32
        // rounding and ties may go either way; the non-tie values still encode as themselves.
        let small: Vec<f32> = row.iter().map(|x| x / 448.0).collect();
        let m = quantize(&small, 1, 16).unwrap();
        assert_eq!(m.global_scale(), (6.0f64 / 2688.0) as f32);
        assert_eq!(m.plain_scales(), vec![0x7E]);
        for c in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 14] {
            assert_eq!(m.code(0, c), codes[c], "element {c}");
        }
    }

    #[test]
    fn second_block_gets_a_smaller_scale() {
        // Block 0 amax 2688 (g = 1, scale 448), block 1 amax 3 (scale e4m3(0.5) = 0.5).
        let mut row = vec![0.0f32; 32];
        row[0] = 2688.0;
        row[16] = 3.0;
        row[17] = -1.0;
        let m = quantize(&row, 1, 32).unwrap();
        assert_eq!(m.global_scale(), 1.0);
        assert_eq!(m.plain_scales(), vec![0x7E, 0x30]);
        assert_eq!(m.value(0, 0), 2688.0);
        assert_eq!(m.value(0, 16), 3.0);
        assert_eq!(m.value(0, 17), -1.0);
    }

    #[test]
    fn zeros_and_errors() {
        let m = quantize(&[0.0f32; 64], 2, 32).unwrap();
        assert_eq!(m.global_scale(), 1.0);
        assert!(m.dequantize().iter().all(|&x| x == 0.0));
        assert_eq!(quantize(&[0.0f32; 24], 1, 24), Err(FormatError::BadK { k: 24, multiple: 16 }));
        assert!(matches!(quantize(&[0.0f32; 15], 1, 16), Err(FormatError::BadLength { .. })));
        let mut bad = vec![1.0f32; 32];
        bad[5] = f32::NAN;
        assert_eq!(quantize(&bad, 1, 32), Err(FormatError::NonFinite { index: 5 }));
        bad[5] = f32::INFINITY;
        assert_eq!(quantize(&bad, 2, 16), Err(FormatError::NonFinite { index: 5 }));
        assert!(matches!(
            quantize_with_global_scale(&[0.0f32; 16], 1, 16, 0.0),
            Err(FormatError::BadGlobalScale { .. })
        ));
    }

    /// The quantized value must be the nearest point of the block's grid `unit * e2m1` (with
    /// saturation), i.e. the error is at most half the local grid step; this checks that bound
    /// element by element on random inputs spanning many magnitudes.
    fn check_round_trip(data: &[f64], rows: usize, k: usize, m: &Nvfp4Matrix) {
        let g = f64::from(m.global_scale());
        let deq = m.dequantize_f64();
        for i in 0..rows {
            for j in 0..k / 16 {
                let block = &data[i * k + j * 16..i * k + j * 16 + 16];
                let amax = block.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
                let unit = f64::from(e4m3_to_f32(m.scale_code(i, j))) * g;
                // The scale is the e4m3 rounding of amax / 6 / g: within a relative 2^-4 (normal
                // range), or within half the smallest subnormal 2^-10 (times g * 6) below that.
                let ideal = amax / 6.0;
                assert!(
                    (unit - ideal).abs() <= ideal / 16.0 + 2f64.powi(-10) * g * 1.0001,
                    "scale of block ({i}, {j}): unit {unit}, ideal {ideal}"
                );
                for c in j * 16..j * 16 + 16 {
                    let (x, q) = (data[i * k + c], deq[i * k + c]);
                    let err = (x - q).abs();
                    let t = if unit == 0.0 { f64::INFINITY } else { x.abs() / unit };
                    let bound = if unit == 0.0 {
                        x.abs()
                    } else if t > 6.0 {
                        (t - 6.0) * unit // saturated
                    } else if t >= 4.0 {
                        unit // grid step 2 above 4
                    } else if t >= 2.0 {
                        0.5 * unit
                    } else {
                        0.25 * unit
                    };
                    assert!(
                        err <= bound * (1.0 + 1e-6) + 1e-300,
                        "({i}, {c}): x {x} q {q} unit {unit} err {err} bound {bound}"
                    );
                    // And exact nearest-point: no other grid point is strictly closer.
                    if unit > 0.0 {
                        for v in E2M1_VALUES {
                            assert!(((f64::from(v) * unit) - x).abs() >= err * (1.0 - 1e-9));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn property_round_trip_error_is_bounded() {
        let mut rng = SplitMix64::new(0x5EED_0001);
        for trial in 0..40 {
            let rows = 1 + rng.below(9) as usize;
            let k = 16 * (1 + rng.below(12) as usize);
            // Per-row magnitudes spread over 2^-20 .. 2^20, so that some blocks get subnormal or
            // zero scales relative to the tensor's amax.
            let data: Vec<f64> = (0..rows * k)
                .map(|idx| {
                    let row_mag = 2f64.powi(((idx / k) as i32 * 37 + trial * 11) % 41 - 20);
                    let x = rng.normal() * row_mag;
                    f64::from(x as f32)
                })
                .collect();
            let as_f32: Vec<f32> = data.iter().map(|&x| x as f32).collect();
            let m = quantize(&as_f32, rows, k).unwrap();
            check_round_trip(&data, rows, k, &m);
            // The f64 path gives the same result for f32-representable input.
            assert_eq!(quantize(&data, rows, k).unwrap(), m);
        }
    }

    #[test]
    fn property_gaussian_normalized_error() {
        // For Gaussian data the relative RMS error of NVFP4 is about 0.1 (3 value bits per block).
        let mut rng = SplitMix64::new(7);
        let (rows, k) = (32, 256);
        let data: Vec<f32> = (0..rows * k).map(|_| rng.normal() as f32).collect();
        let m = quantize(&data, rows, k).unwrap();
        let deq = m.dequantize();
        let num: f64 = data.iter().zip(&deq).map(|(&x, &q)| f64::from(x - q).powi(2)).sum();
        let den: f64 = data.iter().map(|&x| f64::from(x).powi(2)).sum();
        let rel = (num / den).sqrt();
        assert!(rel < 0.12, "normalized error {rel}");
        assert!(rel > 0.02, "suspiciously small error {rel}");
        let d64: Vec<f64> = data.iter().map(|&x| f64::from(x)).collect();
        check_round_trip(&d64, rows, k, &m);
    }

    #[test]
    fn representable_inputs_survive_exactly() {
        // With g = 1, a block of e2m1 values times a power of two 2^e whose amax is 6 * 2^e gets
        // the block scale 2^e exactly, so every value comes back exactly.
        let mut rng = SplitMix64::new(99);
        let (rows, k) = (4, 64);
        let mut data = vec![0.0f32; rows * k];
        for (b, block) in data.chunks_exact_mut(16).enumerate() {
            let scale = 2f32.powi(b as i32 % 5 - 2);
            for x in block.iter_mut() {
                *x = e2m1_to_f32(rng.below(16) as u8) * scale;
            }
            block[0] = 6.0 * scale; // fixes the block amax
        }
        let m = quantize_with_global_scale(&data, rows, k, 1.0).unwrap();
        assert_eq!(m.dequantize(), data);
    }

    #[test]
    fn half_inputs_match_f32_inputs() {
        let mut rng = SplitMix64::new(3);
        let data: Vec<f32> = (0..64).map(|_| (rng.normal() * 10.0) as f32).collect();
        let h: Vec<f16> = data.iter().map(|&x| f16::from_f32(x)).collect();
        let b: Vec<bf16> = data.iter().map(|&x| bf16::from_f32(x)).collect();
        let hf: Vec<f32> = h.iter().map(|x| x.to_f32()).collect();
        let bf: Vec<f32> = b.iter().map(|x| x.to_f32()).collect();
        assert_eq!(quantize(&h, 2, 32).unwrap(), quantize(&hf, 2, 32).unwrap());
        assert_eq!(quantize(&b, 2, 32).unwrap(), quantize(&bf, 2, 32).unwrap());
        // And the e4m3 table covers every scale the quantizer can produce.
        let m = quantize(&h, 2, 32).unwrap();
        assert!(m.plain_scales().iter().all(|&s| E4M3_VALUES[s as usize].is_finite()));
    }

    #[test]
    fn nan_and_infinity_with_a_global_scale() {
        let mut row = vec![1.0f32; 64];
        row[3] = f32::NAN; // block 0
        row[16] = f32::INFINITY; // block 1
        row[17] = f32::NEG_INFINITY;
        row[18] = 448.0;
        row[32] = -f32::NAN; // block 2, with an infinity too
        row[33] = f32::INFINITY;
        let m = quantize_with_global_scale(&row, 1, 64, 1.0).unwrap();
        assert_eq!(m.plain_scales(), vec![E4M3_NAN, 0x7E, E4M3_NAN, e4m3_from_f64(1.0 / 6.0)]);
        assert!((0..16).chain(32..48).all(|c| m.code(0, c) == 0x7));
        assert_eq!([m.code(0, 16), m.code(0, 17), m.code(0, 18), m.code(0, 19)], [0x7, 0xF, 0x2, 0x0]);
        let d = m.dequantize();
        assert!(d[..16].iter().chain(&d[32..48]).all(|x| x.is_nan()));
        assert_eq!(&d[16..19], &[2688.0, -2688.0, 448.0]);
        // `quantize` still rejects them: the tensor's amax would be meaningless.
        assert_eq!(quantize(&row, 1, 64), Err(FormatError::NonFinite { index: 3 }));
    }

    /// The GPU quantizer's arithmetic (`nvfp4_gemm_abi::quantize`, midpoint comparisons instead of
    /// an `f64` division per value) gives this module's codes, block for block.
    #[test]
    fn device_block_model_matches() {
        use nvfp4_gemm_abi::quantize as dev;
        let mut rng = SplitMix64::new(0xD15C_0DE5);
        let specials_f16: [u16; 10] = [0x0000, 0x8000, 0x0001, 0x83FF, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x0400];
        let specials_bf16: [u16; 10] = [0x0000, 0x8000, 0x0001, 0x807F, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0, 0x0080];
        for trial in 0..4000 {
            let bf16 = trial % 2 == 1;
            let (rows, k) = (1 + rng.below(3) as usize, 16 * (1 + rng.below(4) as usize));
            let specials = if bf16 { &specials_bf16 } else { &specials_f16 };
            let exp_span = if bf16 { 250 } else { 40 };
            let centre = rng.below(exp_span) as i32 - exp_span as i32 / 2;
            let bits: Vec<u16> = (0..rows * k)
                .map(|_| match rng.below(20) {
                    0 => specials[rng.below(10) as usize],
                    1 => rng.next_u64() as u16,
                    // Exact e2m1 grid points times a power of two: ties and exact values.
                    2 | 3 => {
                        let v = codec::E2M1_VALUES[rng.below(16) as usize] as f64 * 2f64.powi(centre.clamp(-20, 10));
                        if bf16 {
                            bf16::from_f64(v).to_bits()
                        } else {
                            f16::from_f64(v).to_bits()
                        }
                    }
                    _ => {
                        let v = rng.normal() * 2f64.powi(centre + rng.below(9) as i32 - 4);
                        if bf16 {
                            bf16::from_f64(v).to_bits()
                        } else {
                            f16::from_f64(v).to_bits()
                        }
                    }
                })
                .collect();
            let vals: Vec<f64> = bits.iter().map(|&b| dev::half_to_f64(b, bf16)).collect();
            let finite_amax = vals.iter().filter(|x| x.is_finite()).fold(0.0f64, |m, x| m.max(x.abs()));
            let g = match trial % 5 {
                0 => 1.0,
                1 => global_scale_for_amax(finite_amax as f32),
                2 => f32::from_bits(1 + rng.below(0x7F7F_FFFF) as u32),
                3 => global_scale_for_amax(finite_amax as f32) * 2f32.powi(rng.below(40) as i32 - 20),
                _ => 2f32.powi(rng.below(60) as i32 - 30) * 3.0,
            };
            if !(g.is_finite() && g > 0.0) {
                continue;
            }
            let m = if bf16 {
                let x: Vec<bf16> = bits.iter().map(|&b| bf16::from_bits(b)).collect();
                quantize_with_global_scale(&x, rows, k, g).unwrap()
            } else {
                let x: Vec<f16> = bits.iter().map(|&b| f16::from_bits(b)).collect();
                quantize_with_global_scale(&x, rows, k, g).unwrap()
            };
            for i in 0..rows {
                for j in 0..k / 16 {
                    let at = i * k + 16 * j;
                    let words: [u32; 8] =
                        std::array::from_fn(|w| u32::from(bits[at + 2 * w]) | u32::from(bits[at + 2 * w + 1]) << 16);
                    let (scale, packed) = dev::quantize_block(words, bf16, f64::from(g));
                    assert_eq!(scale, m.scale_code(i, j), "trial {trial} block ({i}, {j}) g {g:e}");
                    let row = &m.values()[i * k / 2 + 8 * j..i * k / 2 + 8 * j + 8];
                    assert_eq!(
                        packed.to_le_bytes(),
                        row,
                        "trial {trial} block ({i}, {j}) g {g:e} {:?}",
                        &vals[at..at + 16]
                    );
                }
            }
        }
    }

    /// The device's e4m3 encoder agrees with the codec's on every 16-bit float value scaled by a
    /// spread of divisors, on random `f64` bit patterns, and around every midpoint.
    #[test]
    fn device_e4m3_encoder_matches() {
        use nvfp4_gemm_abi::quantize as dev;
        let mut xs = vec![];
        for bits in 0..=u16::MAX {
            for bf16 in [false, true] {
                let v = dev::half_to_f64(bits, bf16);
                let want = if bf16 { bf16::from_bits(bits).to_f64() } else { f16::from_bits(bits).to_f64() };
                assert!(v.to_bits() == want.to_bits() || (v.is_nan() && want.is_nan()), "{bits:#06x}");
                xs.push(v);
                xs.push(v / 6.0);
                xs.push(v / 6.0 / 0.3);
            }
        }
        for c in 0..0x7Eu8 {
            let mid = (f64::from(e4m3_to_f32(c)) + f64::from(e4m3_to_f32(c + 1))) / 2.0;
            for d in -2i64..=2 {
                xs.push(f64::from_bits(mid.to_bits().wrapping_add_signed(d)));
            }
        }
        let mut rng = SplitMix64::new(5);
        xs.extend((0..200_000).map(|_| f64::from_bits(rng.next_u64())));
        for x in xs {
            let (a, b) = (dev::e4m3_from_f64(x), e4m3_from_f64(x));
            assert_eq!(a, b, "x = {x:e}");
        }
    }
}
