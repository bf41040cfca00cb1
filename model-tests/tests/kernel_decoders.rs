//! The kernels' conversion helpers that are plain Rust (the same code on nvptx64 and the host),
//! checked on the CPU against the format crate's codecs.

use nvfp4_format::codec::e2m1_to_f32;
use nvfp4_gemm_abi::sm90::DECODE_UNSCALE_F16X2;
use nvfp4_gemm_kernel::ptx::convert::{e2m1x2_pair_to_f16x2_scaled, e2m1x8_to_f16x2_scaled};

/// Every e2m1 code in every nibble of a word: word `k` of the result holds elements `k` (low half)
/// and `k + 4` (high half), each the e2m1 value times 2⁻¹⁴, with the sign of the code (also −0).
#[test]
fn model_sm90_e2m1_decoder_every_code_every_position() {
    for code in 0..16u32 {
        for pos in 0..8 {
            // The other nibbles get other codes, so a leak between positions shows.
            let q = (0..8).fold(0u32, |w, p| w | (if p == pos { code } else { (code + 5 * p + 3) % 16 }) << (4 * p));
            let words = e2m1x8_to_f16x2_scaled(q);
            // The one-pair decoder (the token dequantization's) gives the same words.
            for k in 0..4 {
                assert_eq!(e2m1x2_pair_to_f16x2_scaled(q, 4 * k), words[k as usize], "word {q:#010x} pair {k}");
            }
            for e in 0..8u32 {
                let c = (q >> (4 * e)) & 0xF;
                let bits = (words[(e % 4) as usize] >> (16 * (e / 4))) as u16;
                let got = half::f16::from_bits(bits);
                let want = e2m1_to_f32(c as u8) * (-14f32).exp2();
                assert_eq!(got.to_f32(), want, "word {q:#010x} element {e} (code {c:#x})");
                assert_eq!(got.is_sign_negative(), c & 8 != 0, "sign of code {c:#x}");
            }
        }
    }
    assert_eq!(half::f16::from_bits(DECODE_UNSCALE_F16X2 as u16).to_f32(), 16384.0);
    assert_eq!(DECODE_UNSCALE_F16X2 >> 16, DECODE_UNSCALE_F16X2 & 0xFFFF);
}

/// The eight-value decoder against the one-pair decoder (which places magnitude and sign with
/// separate shifts) on a million pseudo-random words and the extreme ones: the eight-value form
/// lets garbage into bits its masks drop, so any bit it failed to drop would show here.
#[test]
fn model_sm90_e2m1_decoder_matches_pair_decoder_on_random_words() {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let words = (0..1 << 20).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 16) as u32
    });
    for q in words.chain([0, u32::MAX, 0x8888_8888, 0x7777_7777, 0x0F0F_0F0F, 0xF0F0_F0F0]) {
        let got = e2m1x8_to_f16x2_scaled(q);
        for k in 0..4 {
            assert_eq!(got[k as usize], e2m1x2_pair_to_f16x2_scaled(q, 4 * k), "word {q:#010x} pair {k}");
        }
    }
}

/// Two rows' scales in one f16x2 are each row's scale in one half, and multiplying by a half
/// equals multiplying by that half broadcast: every pair of scale bytes, every byte position.
#[test]
fn model_sm90_paired_scales_match_broadcast_scales() {
    use nvfp4_gemm_kernel::ptx::convert::{e4m3_byte_to_f16x2, e4m3_bytes_to_f16x2, mul_f16x2, mul_f16x2_by_half};
    for b0 in 0..256u32 {
        for b1 in (0..256u32).step_by(7) {
            for q in 0..4 {
                let (w0, w1) = (b0 << (8 * q) | 0x5A5A_5A5A & !(0xFF << (8 * q)), b1 << (8 * q));
                let both = e4m3_bytes_to_f16x2(w0, w1, q);
                let (s0, s1) = (e4m3_byte_to_f16x2(w0, q), e4m3_byte_to_f16x2(w1, q));
                assert_eq!(both & 0xFFFF, s0 & 0xFFFF, "bytes {b0:#x} {b1:#x} at {q}");
                assert_eq!(both >> 16, s1 >> 16, "bytes {b0:#x} {b1:#x} at {q}");
                let a = 0x3C00_B800 ^ (b0 << 3 | b1 << 19);
                assert_eq!(mul_f16x2_by_half::<false>(a, both).to_ne_bytes(), mul_f16x2(a, s0).to_ne_bytes());
                assert_eq!(mul_f16x2_by_half::<true>(a, both).to_ne_bytes(), mul_f16x2(a, s1).to_ne_bytes());
            }
        }
    }
}

/// The consumers' weight fragments are exact: for every e2m1 code and every finite e4m3 scale,
/// the decoded value (×2⁻¹⁴) times the scale taken from its half of the paired f16x2 is the f16
/// of `value · scale · 2⁻¹⁴` with nothing rounded away (f16 subnormals down to 2⁻²⁴ included).
#[test]
fn model_sm90_scaled_weight_fragments_are_exact() {
    use nvfp4_format::codec::e4m3_to_f32;
    use nvfp4_gemm_kernel::ptx::convert::{e4m3_bytes_to_f16x2, mul_f16x2_by_half};
    for scale in (0..=255u8).filter(|&b| b & 0x7F != 0x7F) {
        // Both halves: the row's scale in the low half (the other row's in the high), then the
        // reverse.
        let pair_lo = e4m3_bytes_to_f16x2(scale as u32, 0x38, 0);
        let pair_hi = e4m3_bytes_to_f16x2(0x38, scale as u32, 0);
        for code in 0..16u32 {
            let words = e2m1x8_to_f16x2_scaled(code * 0x1111_1111);
            let want = f64::from(e2m1_to_f32(code as u8)) * f64::from(e4m3_to_f32(scale)) * (-14f64).exp2();
            for (got, half) in
                [(mul_f16x2_by_half::<false>(words[0], pair_lo), 0), (mul_f16x2_by_half::<true>(words[0], pair_hi), 1)]
            {
                for h in 0..2 {
                    let v = half::f16::from_bits((got >> (16 * h)) as u16);
                    assert_eq!(f64::from(v.to_f32()), want, "code {code:#x} scale {scale:#04x} half {half}");
                    assert_eq!(v.is_sign_negative(), (code & 8 != 0) ^ (scale & 0x80 != 0));
                }
            }
        }
    }
}

/// The token dequantization's product (`sm90_dequant_tokens`): the decoded value (×2⁻¹⁴) times
/// the block scale, times 2¹⁴, is exactly value · scale — every e2m1 code, every finite e4m3
/// scale, every byte position of the scale word, both halves.
#[test]
fn model_sm90_dequantized_tokens_are_exact() {
    use nvfp4_format::codec::e4m3_to_f32;
    use nvfp4_gemm_kernel::ptx::convert::{e4m3_byte_to_f16x2, mul_f16x2};
    for scale in (0..=255u8).filter(|&b| b & 0x7F != 0x7F) {
        for q in 0..4u32 {
            // The other bytes of the word hold other scales, so a wrong byte shows.
            let word = (0..4).fold(0u32, |w, p| w | (if p == q { u32::from(scale) } else { 0x38 + 9 * p }) << (8 * p));
            let s = e4m3_byte_to_f16x2(word, q);
            for code in 0..16u32 {
                let pair = e2m1x2_pair_to_f16x2_scaled(code * 0x1111_1111, 0);
                let got = mul_f16x2(mul_f16x2(pair, s), DECODE_UNSCALE_F16X2);
                let want = f64::from(e2m1_to_f32(code as u8)) * f64::from(e4m3_to_f32(scale));
                for h in 0..2 {
                    let v = half::f16::from_bits((got >> (16 * h)) as u16);
                    assert_eq!(f64::from(v.to_f32()), want, "code {code:#x} scale {scale:#04x} byte {q} half {h}");
                    assert_eq!(v.is_sign_negative(), (code & 8 != 0) ^ (scale & 0x80 != 0));
                }
            }
        }
    }
}

/// W4A16's prepacked decoders, f16 and bf16: every e2m1 code as every element of a word (the
/// code's bits where `abi::sm90::w4a16::Decoder::source_bit` puts them) decodes to the e2m1 value
/// times 2⁻¹⁴ as f16, or times 2⁻¹²⁶ as bf16 (0.5 to the subnormal 2⁻¹²⁷), signs kept, −0
/// included, other elements never leaking in.
#[test]
fn model_sm90_w4a16_decoders_every_code_every_position() {
    use nvfp4_gemm_abi::sm90::w4a16::{BF16_DECODER, F16_DECODER};
    use nvfp4_gemm_kernel::ptx::convert::prepacked_e2m1x8_to_16x2;
    for code in 0..16u32 {
        for pos in 0..8u32 {
            let codes: [u32; 8] =
                core::array::from_fn(|p| if p as u32 == pos { code } else { (code + 5 * p as u32 + 3) % 16 });
            let (wf, wb) = (F16_DECODER.layout().place(codes), BF16_DECODER.layout().place(codes));
            let (f, b) = (prepacked_e2m1x8_to_16x2::<false>(wf), prepacked_e2m1x8_to_16x2::<true>(wb));
            for e in 0..8u32 {
                let c = codes[e as usize];
                let value = e2m1_to_f32(c as u8) as f64;
                let half_of = |words: [u32; 4]| (words[(e % 4) as usize] >> (16 * (e / 4))) as u16;
                let got = half::f16::from_bits(half_of(f));
                assert_eq!(got.to_f64(), value * 2f64.powi(-14), "f16 word {wf:#010x} element {e}");
                assert_eq!(got.is_sign_negative(), c & 8 != 0, "f16 sign of code {c:#x}");
                let got = half::bf16::from_bits(half_of(b));
                assert_eq!(got.to_f64(), value * 2f64.powi(-126), "bf16 word {wb:#010x} element {e}");
                assert_eq!(got.is_sign_negative(), c & 8 != 0, "bf16 sign of code {c:#x}");
            }
        }
    }
}

/// W4A16's scale words: for f16 every pair of e4m3 bytes in either half-word converts to both
/// values (low byte in the low half); for bf16 every pair of prepacked bytes at bytes (0, 2) or
/// (1, 3), the other bytes anything, converts to `|scale| · 2¹¹⁹` in its half
/// (`abi::sm90::w4a16::scale_bf16_bits`); and every code times every finite e4m3 scale, through
/// the kernel's multiplication by a half, is exactly `code · |scale| · 2⁻⁷` with the code's sign
/// (the prepack folds the scale's sign into the codes).
#[test]
fn model_sm90_w4a16_scales_are_exact() {
    use nvfp4_format::codec::e4m3_to_f32;
    use nvfp4_gemm_abi::sm90::w4a16::{prepacked_scale, scale_bf16_bits, BF16_PRODUCT_EXPONENT};
    use nvfp4_gemm_kernel::ptx::convert::{
        e4m3x2_half_to_f16x2, e5m3_pair_to_bf16x2, mul_bf16x2_by_half, prepacked_e2m1x8_to_16x2,
    };
    for b0 in 0..=255u8 {
        for b1 in (0..=255u8).step_by(3) {
            let (x0, x1) = (b0 as u32, b1 as u32);
            let f16_pair = |w: u32| (half::f16::from_bits(w as u16), half::f16::from_bits((w >> 16) as u16));
            for (w, got) in [
                (x0 | x1 << 8 | 0xC3A5 << 16, e4m3x2_half_to_f16x2::<false> as fn(u32) -> u32),
                (0x5AC3 | x0 << 16 | x1 << 24, e4m3x2_half_to_f16x2::<true>),
            ] {
                let (lo, hi) = f16_pair(got(w));
                for (v, b) in [(lo, b0), (hi, b1)] {
                    let want = e4m3_to_f32(b);
                    assert!(v.to_f32() == want || (v.is_nan() && want.is_nan()), "f16 bytes {b0:#x} {b1:#x}");
                }
            }
            let (p0, p1) = (prepacked_scale(b0) as u32, prepacked_scale(b1) as u32);
            for (w, got) in [
                (p0 | 0xA5 << 8 | p1 << 16 | 0x5A << 24, e5m3_pair_to_bf16x2::<false> as fn(u32) -> u32),
                (0xC3 | p0 << 8 | 0x3C << 16 | p1 << 24, e5m3_pair_to_bf16x2::<true>),
            ] {
                let both = got(w);
                assert_eq!(both & 0xFFFF, scale_bf16_bits(p0 as u8) as u32, "bf16 bytes {b0:#x} {b1:#x}");
                assert_eq!(both >> 16, scale_bf16_bits(p1 as u8) as u32, "bf16 bytes {b0:#x} {b1:#x}");
            }
        }
    }
    // A bf16 word whose every element holds `code`.
    let layout = nvfp4_gemm_abi::sm90::w4a16::BF16_DECODER.layout();
    let all = |code: u32| layout.place([code; 8]);
    for byte in (0..=255u8).filter(|b| b & 0x7F != 0x7F) {
        let scale = e4m3_to_f32(byte).abs() as f64;
        let s = e5m3_pair_to_bf16x2::<false>(prepacked_scale(byte) as u32);
        for code in 0..16u32 {
            let product = mul_bf16x2_by_half::<false>(prepacked_e2m1x8_to_16x2::<true>(all(code))[0], s);
            let got = half::bf16::from_bits(product as u16).to_f64();
            let want = e2m1_to_f32(code as u8) as f64 * scale * 2f64.powi(-(BF16_PRODUCT_EXPONENT as i32));
            // A zero scale's products: its codes are zeroed by the prepack, so only +0 · 2⁹⁷ occurs.
            if scale == 0.0 && code & 7 != 0 {
                continue;
            }
            assert_eq!(got, want, "code {code:#x} scale {byte:#x}");
        }
    }
}

/// The kernels' f64 → f16 / bf16 conversion (`cvt.rn.{f16,bf16}.f64`, in the model) rounds once:
/// equal to the format crate's correctly rounded value on products of a 16-bit value and an f32 weight (up to 35
/// significant bits, as the MoE block forms them), on values an f32 rounding would put exactly on
/// a 16-bit midpoint, on subnormals, overflow and the specials.
#[test]
fn f64_to_16_bit_rounds_once() {
    use nvfp4_gemm_kernel::ptx::cvt_f64::{f64_to_bf16_bits, f64_to_f16_bits};
    let mut rng = nvfp4_format::SplitMix64::new(0xF64);
    let mut xs: Vec<f64> =
        vec![0.0, -0.0, f64::INFINITY, f64::NEG_INFINITY, 1e300, -1e300, 65520.0, 65519.99, 1e-8, -3e-41];
    for _ in 0..200_000 {
        let h = half::f16::from_bits(rng.below(0x7C00) as u16).to_f64();
        let w = f32::from_bits(0x3000_0000 + rng.below(0x1800_0000) as u32) as f64;
        xs.push(if rng.below(2) == 0 { h * w } else { -h * w });
    }
    // A 16-bit midpoint plus a tail below f32's last bit: rounding to f32 first lands on the
    // midpoint, and a second rounding to nearest even may then go the wrong way.
    for m in 0..2000u32 {
        let base = 1.0 + m as f64 / 2048.0; // an f16 significand
        let mid_f16 = base + 1.0 / 2048.0 / 2.0;
        let mid_bf16 = (1.0 + (m % 128) as f64 / 128.0) + 1.0 / 256.0;
        for tail in [1e-9, -1e-9, 2f64.powi(-30), -(2f64.powi(-30))] {
            xs.extend([mid_f16 + tail, mid_bf16 + tail]);
        }
    }
    for &x in &xs {
        assert_eq!(f64_to_f16_bits(x), nvfp4_format::codec::f64_to_f16(x).to_bits(), "f16 of {x:e}");
        assert_eq!(f64_to_bf16_bits(x), nvfp4_format::codec::f64_to_bf16(x).to_bits(), "bf16 of {x:e}");
    }
    assert!(half::f16::from_bits(f64_to_f16_bits(f64::NAN)).is_nan());
    assert!(half::bf16::from_bits(f64_to_bf16_bits(f64::NAN)).is_nan());
}

/// The kernels' `half_floor` (a rounding conversion toward zero, `cvt.rz.{bf16,f16}.f64`, in the
/// model) against the software one every CPU quantizer uses (`abi::quantize::half_floor`, the
/// thresholds' floor): equal on every positive finite 16-bit value, its neighbours one f64 step
/// away, the midpoints of every e4m3 scale times a spread of global scales (the products the
/// thresholds floor), and magnitudes beyond the largest finite value and below the smallest.
#[test]
fn half_floor_by_conversion_matches_the_software_floor() {
    use nvfp4_gemm_abi::quantize::{e4m3_to_f64, half_floor, half_to_f64, E2M1_MIDPOINTS};
    use nvfp4_gemm_kernel::ptx::cvt_f64::half_floor as device_floor;
    for bf16 in [false, true] {
        let mut ts = vec![1e-300, 1e-45, 1e-9, 65504.0, 65519.0, 65520.0, 1e5, 3.4e38, 3.5e38, 1e300];
        let top = if bf16 { 0x7F80u16 } else { 0x7C00 };
        for bits in 1..top {
            let v = half_to_f64(bits, bf16);
            ts.extend([v, f64::from_bits(v.to_bits() - 1), f64::from_bits(v.to_bits() + 1)]);
        }
        for code in 1..0x7Fu8 {
            for global in [1.0, 0.37, 2f64.powi(-9), 1e-30, 6.0 * 448.0, 1.0 / 2688.0, 1e-4, 7e3] {
                let unit = e4m3_to_f64(code) * global;
                ts.extend(E2M1_MIDPOINTS.iter().map(|m| m * unit));
            }
        }
        for &t in ts.iter().filter(|t| t.is_finite() && **t > 0.0) {
            assert_eq!(device_floor(t, bf16), half_floor(t, bf16), "t = {t:e}, bf16 {bf16}");
        }
    }
}

/// The kernels' widening of a 16-bit value (`half_bits_to_f32`: a shift for bf16, `cvt.f32.f16`)
/// equals the software ones, `abi::quantize::half_to_f64` and `abi::moe_block::half_bits_to_f32`,
/// on every pattern (NaN for NaN).
#[test]
fn half_bits_to_f32_matches_the_software_widening() {
    use nvfp4_gemm_abi::quantize::half_to_f64;
    use nvfp4_gemm_kernel::ptx::cvt_f64::half_bits_to_f32;
    for bf16 in [false, true] {
        for bits in 0..=u16::MAX {
            let got = half_bits_to_f32(bits, bf16);
            let wants = [half_to_f64(bits, bf16), nvfp4_gemm_abi::moe_block::half_bits_to_f32(bits, bf16) as f64];
            for want in wants {
                if want.is_nan() {
                    assert!(got.is_nan(), "{bits:#06x}");
                } else {
                    assert_eq!((got as f64).to_bits(), want.to_bits(), "{bits:#06x}, bf16 {bf16}");
                }
            }
        }
    }
}

/// The device quantizer's steps (`DeviceOps`: `cvt.rz` floors, codes counted with packed
/// half-precision comparisons) against the CPU's (`Software`): every 16-bit pattern that is not
/// NaN, in both halves of a word, against the thresholds of every e4m3 scale times several global
/// scales (and of the extreme units); then whole blocks and their parts on random words with
/// specials, as `abi::quantize`'s own test draws them.
#[test]
fn device_block_steps_match_the_cpu() {
    use nvfp4_gemm_abi::quantize::{
        e4m3_to_f64, quantize_block, quantize_block_part, quantize_block_part_with, quantize_block_with, thresholds,
        BlockOps, Software,
    };
    use nvfp4_gemm_kernel::quantize::DeviceOps;
    let mut rng = nvfp4_format::SplitMix64::new(0xB10C);
    for bf16 in [false, true] {
        let nan_from = if bf16 { 0x7F81u16 } else { 0x7C01 };
        let mut units: Vec<f64> = vec![2f64.powi(-9) * 1e-30, 1e-12, 448.0 * 7e3, 3e30];
        for code in (1..0x7Fu8).step_by(3) {
            for global in [1.0, 0.37, 1.0 / 2688.0, 1e-4, 7e3] {
                units.push(e4m3_to_f64(code) * global);
            }
        }
        for unit in units {
            let t = thresholds(unit, bf16);
            let (dev, cpu) = (DeviceOps::prepare(&t), Software::prepare(&t));
            for lo in 0..=u16::MAX {
                if lo & 0x7FFF >= nan_from {
                    continue;
                }
                let mut hi = rng.below(0x10000) as u16;
                if hi & 0x7FFF >= nan_from {
                    hi &= 0x8000;
                }
                let w = lo as u32 | (hi as u32) << 16;
                assert_eq!(
                    DeviceOps::codes([w], &dev, bf16),
                    Software::codes([w], &cpu, bf16),
                    "word {w:#010x}, unit {unit:e}, bf16 {bf16}"
                );
            }
        }
    }
    let specials = [0u16, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7F80, 0xFF80, 0x7FC0, 0x0001, 0x3C00, 0x0400, 0x8001];
    for case in 0..40_000 {
        let bf16 = case % 2 == 1;
        let words: [u32; 8] = core::array::from_fn(|_| {
            let mut half = || {
                let x = rng.below(u64::MAX);
                if x % 11 == 0 {
                    specials[(x / 11 % specials.len() as u64) as usize] as u32
                } else {
                    (x as u32 & 0x83FF) | ((((x >> 16) % 31) as u32) << 10)
                }
            };
            half() | half() << 16
        });
        let global = [1.0, 0.37, 2f64.powi(-9), 1e-30, 6.0 * 448.0, 1.0 / 2688.0][case % 6];
        assert_eq!(
            quantize_block_with::<DeviceOps>(words, bf16, global),
            quantize_block(words, bf16, global),
            "case {case}: {words:x?}"
        );
        let amax = nvfp4_gemm_abi::quantize::block_part_amax(words);
        let part = [words[2], words[3]];
        assert_eq!(
            quantize_block_part_with::<DeviceOps, 2>(part, amax, bf16, global),
            quantize_block_part(part, amax, bf16, global),
            "case {case}"
        );
    }
}
