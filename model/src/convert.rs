//! Register-only instructions the kernels use, bit-exact from their ISA definitions. They need no
//! model state; the kernel crate may call them directly on the host.

/// `lop3.b32 d, a, b, c, lut;` (PTX ISA, "Logic and Shift Instructions: lop3"; §9.7.7.6 in 8.1):
/// bit `i` of `d` is bit `4·a[i] + 2·b[i] + c[i]` of the 8-bit truth table `lut` (so `a & b & c` is
/// `0x80`).
pub fn lop3(a: u32, b: u32, c: u32, lut: u8) -> u32 {
    (0..32).fold(0u32, |d, i| {
        let index = ((a >> i) & 1) << 2 | ((b >> i) & 1) << 1 | ((c >> i) & 1);
        d | (((lut as u32) >> index) & 1) << i
    })
}

/// `prmt.b32 d, a, b, c;` default mode (PTX ISA 9.0 §9.7.9.7): the eight bytes `{b, a}` (a = bytes
/// 0–3) are indexed by the four selector nibbles of `c`; bit 3 of a nibble replicates the selected
/// byte's sign bit instead.
pub fn prmt(a: u32, b: u32, c: u32) -> u32 {
    let src = (b as u64) << 32 | a as u64;
    (0..4).fold(0u32, |d, i| {
        let sel = (c >> (4 * i)) & 0xF;
        let byte = (src >> (8 * (sel & 7))) as u8;
        let byte = if sel & 8 != 0 {
            if byte & 0x80 != 0 {
                0xFF
            } else {
                0
            }
        } else {
            byte
        };
        d | (byte as u32) << (8 * i)
    })
}

/// e4m3 (e4m3fn: bias 7, no infinities, S.1111.111 is NaN) to f16 bits; exact for every finite
/// value.
fn e4m3_to_f16(b: u8) -> u16 {
    let sign = (b as u16 & 0x80) << 8;
    let (e, m) = ((b >> 3) & 0xF, b & 7);
    if e == 15 && m == 7 {
        return 0x7FFF;
    }
    let v = if e == 0 { m as f32 / 8.0 * 2f32.powi(-6) } else { (1.0 + m as f32 / 8.0) * 2f32.powi(e as i32 - 7) };
    sign | half::f16::from_f32(v).to_bits()
}

/// `cvt.rn.f16x2.e4m3x2 d, a;` (PTX ISA 9.0 §9.7.9.21): the upper byte of `a` goes to the upper
/// half of `d`.
pub fn cvt_f16x2_e4m3x2(a: u16) -> u32 {
    (e4m3_to_f16((a >> 8) as u8) as u32) << 16 | e4m3_to_f16(a as u8) as u32
}

/// `mul.rn.f16x2 d, a, b;` (PTX ISA 9.0 §9.7.4.3): each half multiplied and rounded to nearest
/// even (the product of two f16 is exact in f32, so one rounding).
pub fn mul_rn_f16x2(a: u32, b: u32) -> u32 {
    let h = |x: u32, s: u32| half::f16::from_bits((x >> s) as u16).to_f32();
    let lo = half::f16::from_f32(h(a, 0) * h(b, 0)).to_bits() as u32;
    let hi = half::f16::from_f32(h(a, 16) * h(b, 16)).to_bits() as u32;
    hi << 16 | lo
}

/// `mul.rn.bf16x2 d, a, b;` (PTX ISA 9.0 §9.7.4.3, half-precision `mul` with `.bf16x2`: PTX 7.8,
/// sm_90): each half multiplied and rounded to nearest even (the product of two bf16 is exact in
/// f32, so one rounding). bf16 `mul` has no `.ftz` form: subnormal inputs and results are kept.
pub fn mul_rn_bf16x2(a: u32, b: u32) -> u32 {
    let h = |x: u32, s: u32| half::bf16::from_bits((x >> s) as u16).to_f32();
    let lo = half::bf16::from_f32(h(a, 0) * h(b, 0)).to_bits() as u32;
    let hi = half::bf16::from_f32(h(a, 16) * h(b, 16)).to_bits() as u32;
    hi << 16 | lo
}

/// `cvt.rn.f16x2.f32 d, hi, lo;` (PTX ISA 9.0 §9.7.9.21): `hi` in the upper half.
pub fn cvt_rn_f16x2_f32(hi: f32, lo: f32) -> u32 {
    (half::f16::from_f32(hi).to_bits() as u32) << 16 | half::f16::from_f32(lo).to_bits() as u32
}

/// `cvt.rn.bf16x2.f32 d, hi, lo;` (PTX ISA 9.0 §9.7.9.21): `hi` in the upper half.
pub fn cvt_rn_bf16x2_f32(hi: f32, lo: f32) -> u32 {
    (half::bf16::from_f32(hi).to_bits() as u32) << 16 | half::bf16::from_f32(lo).to_bits() as u32
}

/// `cvt.rz.f32.f64 d, x;` (PTX ISA 9.0 §9.7.9.21): toward zero, subnormals kept, a finite
/// magnitude beyond `f32::MAX` becomes `f32::MAX`; NaN stays NaN.
pub fn cvt_rz_f32_f64(x: f64) -> f32 {
    let r = x as f32; // nearest even, overflow to ±inf
    if x.is_nan() || x.is_infinite() {
        return r;
    }
    if r.is_infinite() {
        return f32::MAX.copysign(r);
    }
    if (r as f64).abs() > x.abs() {
        // One step toward zero (the magnitude's bits, below infinity here).
        f32::from_bits(r.to_bits() - 1)
    } else {
        r
    }
}

/// `cvt.rn.f16.f64 d, x;` (PTX ISA 9.0 §9.7.9.21): one rounding to nearest even, overflow to
/// ±inf, subnormals kept. Returns the bit pattern.
pub fn cvt_rn_f16_f64(x: f64) -> u16 {
    half::f16::from_f32(round_to_odd_f32(x)).to_bits()
}

/// `cvt.rn.bf16.f64 d, x;` (PTX ISA 9.0 §9.7.9.21): as [`cvt_rn_f16_f64`], to bf16.
pub fn cvt_rn_bf16_f64(x: f64) -> u16 {
    half::bf16::from_f32(round_to_odd_f32(x)).to_bits()
}

/// `cvt.rz.bf16.f64 d, x;` (PTX ISA 9.0 §9.7.9.21): toward zero, as [`cvt_rz_f32_f64`]; the
/// bf16 values are f32 values with 16 trailing zero bits, so rounding toward zero to `f32` and
/// then dropping those bits is one rounding toward zero. Returns the bit pattern.
pub fn cvt_rz_bf16_f64(x: f64) -> u16 {
    let r = cvt_rz_f32_f64(x);
    if r.is_nan() {
        return half::bf16::from_f32(r).to_bits();
    }
    (r.to_bits() >> 16) as u16
}

/// `cvt.rz.f16.f64 d, x;` (PTX ISA 9.0 §9.7.9.21): toward zero, subnormals kept, a finite
/// magnitude beyond the largest f16 (65504) becomes it; NaN stays NaN. Through `f32` toward zero
/// (every f16 value is an f32 value, so that rounding loses no f16 value at most `|x|`), then
/// the nearest f16 stepped toward zero when it lies beyond. Returns the bit pattern.
pub fn cvt_rz_f16_f64(x: f64) -> u16 {
    let r = cvt_rz_f32_f64(x);
    if r.is_nan() || r.is_infinite() {
        return half::f16::from_f32(r).to_bits();
    }
    let sign = if r.is_sign_negative() { 0x8000 } else { 0 };
    if r.abs() >= 65504.0 {
        return sign | 0x7BFF;
    }
    let h = half::f16::from_f32(r);
    if h.to_f32().abs() > r.abs() {
        h.to_bits() - 1
    } else {
        h.to_bits()
    }
}

/// `cvt.f32.f16 d, a;` (PTX ISA 9.0 §9.7.9.21): exact (every f16 value is an f32 value).
pub fn cvt_f32_f16(a: u16) -> f32 {
    half::f16::from_bits(a).to_f32()
}

/// `set.gt.f16x2.f16x2 d, a, b;` (PTX ISA, "Half Precision Comparison Instructions: set"): each half of
/// `d` is 1.0 (`0x3C00`) where `a`'s half is greater than `b`'s, else 0 (a NaN is greater than
/// nothing); subnormals compared as they are.
pub fn set_gt_f16x2(a: u32, b: u32) -> u32 {
    let h = |x: u32, s: u32| half::f16::from_bits((x >> s) as u16).to_f32();
    let one = |s: u32| if h(a, s) > h(b, s) { 0x3C00u32 << s } else { 0 };
    one(0) | one(16)
}

/// `set.gt.bf16x2.bf16x2 d, a, b;` (sm_90): as [`set_gt_f16x2`] for bf16 halves, 1.0 being
/// `0x3F80`.
pub fn set_gt_bf16x2(a: u32, b: u32) -> u32 {
    let h = |x: u32, s: u32| half::bf16::from_bits((x >> s) as u16).to_f32();
    let one = |s: u32| if h(a, s) > h(b, s) { 0x3F80u32 << s } else { 0 };
    one(0) | one(16)
}

/// `add.rn.f16x2 d, a, b;`: each half's sum rounded once to nearest even (exact in `f64`, whose
/// 53 bits hold any sum of two f16 values).
pub fn add_rn_f16x2(a: u32, b: u32) -> u32 {
    let h = |x: u32, s: u32| half::f16::from_bits((x >> s) as u16).to_f64();
    let sum = |s: u32| (cvt_rn_f16_f64(h(a, s) + h(b, s)) as u32) << s;
    sum(0) | sum(16)
}

/// `add.rn.bf16x2 d, a, b;` (sm_90): each half's sum rounded once to nearest even. The `f64` sum
/// is exact unless the exponents differ by more than 45, and then the smaller value is far below
/// half a bf16 step of the larger, which both roundings return.
pub fn add_rn_bf16x2(a: u32, b: u32) -> u32 {
    let h = |x: u32, s: u32| half::bf16::from_bits((x >> s) as u16).to_f64();
    let sum = |s: u32| (cvt_rn_bf16_f64(h(a, s) + h(b, s)) as u32) << s;
    sum(0) | sum(16)
}

/// `x` rounded to `f32` to odd (toward zero, the last bit set when inexact): rounding that to
/// nearest even in a format at least two significand bits narrower (f16: 11 of 24, bf16: 8) is
/// one rounding of `x` (Boldo and Melquiond, IEEE Trans. Computers 57(4), 2008). `half`'s own
/// `from_f64` rounds through `f32` to nearest (two roundings) and is not used.
fn round_to_odd_f32(x: f64) -> f32 {
    let r = cvt_rz_f32_f64(x);
    if x.is_nan() || r as f64 == x {
        r
    } else {
        f32::from_bits(r.to_bits() | 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rz_rounds_toward_zero() {
        let third = 1.0f64 / 3.0;
        for x in [third, -third, 1e-40, -1e-40, 1e300, -1e300, 0.0, 1.5] {
            let r = cvt_rz_f32_f64(x);
            assert!((r as f64).abs() <= x.abs(), "{x}: {r}");
            let up = f32::from_bits(r.to_bits() + 1) as f64;
            assert!(up.abs() > x.abs() || r == f32::MAX.copysign(r), "{x}: {r} is not the nearest toward zero");
        }
        assert_eq!(cvt_rz_f32_f64(1e300), f32::MAX);
        assert!(cvt_rz_f32_f64(f64::NAN).is_nan());
        assert_eq!(cvt_rz_f32_f64(f64::NEG_INFINITY), f32::NEG_INFINITY);
    }

    #[test]
    fn rz_to_16_bit_formats() {
        // Exact values stay; others step toward zero; beyond the largest finite value, it.
        assert_eq!(cvt_rz_bf16_f64(1.0), 0x3F80);
        assert_eq!(cvt_rz_bf16_f64(1.0 + 1.0 / 128.0 - 1e-12), 0x3F80);
        assert_eq!(cvt_rz_bf16_f64(-(1.0 + 1.0 / 128.0 - 1e-12)), 0xBF80);
        assert_eq!(cvt_rz_bf16_f64(1e300), 0x7F7F);
        assert_eq!(cvt_rz_f16_f64(1.0 + 1.0 / 1024.0 - 1e-12), 0x3C00);
        assert_eq!(cvt_rz_f16_f64(65519.0), 0x7BFF);
        assert_eq!(cvt_rz_f16_f64(-1e300), 0xFBFF);
        assert_eq!(cvt_rz_f16_f64(1e-9), 0);
        assert_eq!(cvt_rz_f16_f64(2f64.powi(-24) * 1.5), 1);
        assert!(half::f16::from_bits(cvt_rz_f16_f64(f64::NAN)).is_nan());
        assert!(half::bf16::from_bits(cvt_rz_bf16_f64(f64::NAN)).is_nan());
        for bits in 1..0x7C00u16 {
            let v = half::f16::from_bits(bits).to_f64();
            assert_eq!(cvt_rz_f16_f64(v), bits);
            assert_eq!(cvt_rz_f16_f64(f64::from_bits(v.to_bits() + 1)), bits);
            assert_eq!(cvt_rz_f16_f64(f64::from_bits(v.to_bits() - 1)), bits - 1);
            assert_eq!(cvt_f32_f16(bits) as f64, v);
        }
    }

    #[test]
    fn lop3_truth_tables() {
        let (a, b, c) = (0xF0F0_1234u32, 0xCCCC_8765, 0xAAAA_F00F);
        assert_eq!(lop3(a, b, c, 0x80), a & b & c);
        assert_eq!(lop3(a, b, c, 0xFE), a | b | c);
        assert_eq!(lop3(a, b, c, 0x96), a ^ b ^ c);
        assert_eq!(lop3(a, b, c, 0xE4), (a & c) | (b & !c));
        // The operands' own tables reproduce them.
        assert_eq!(lop3(a, b, c, 0xF0), a);
        assert_eq!(lop3(a, b, c, 0xCC), b);
        assert_eq!(lop3(a, b, c, 0xAA), c);
    }

    #[test]
    fn prmt_selects_and_replicates_signs() {
        assert_eq!(prmt(0x4433_2211, 0x8877_6655, 0x3210), 0x4433_2211);
        assert_eq!(prmt(0x4433_2211, 0x8877_6655, 0x7654), 0x8877_6655);
        assert_eq!(prmt(0x4433_2211, 0x8877_6655, 0x32F0), 0x4433_FF11);
        assert_eq!(prmt(0x4433_2211, 0x8877_6655, 0x3278), 0x4433_8800);
    }

    /// A `prmt`-table e2m1 → f16 decode (two table lookups per four values; the sm90 kernels'
    /// decoder until 2026-11-30) gives the e2m1 values for every code: a check of `prmt`'s
    /// selector semantics, including the sign-replicating mode.
    #[test]
    fn prmt_e2m1_decode_sequence() {
        const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        let (llo, lhi, u) = (0x3E3C_3800u32, 0x4644_4240u32, 0xC080_4000u32);
        for q in [0x7654_3210u32, 0xFEDC_BA98, 0x0F1E_2D3C] {
            let mut out = [0u32; 4];
            for h in 0..2 {
                let qh = q >> (16 * h);
                let x = prmt(llo, lhi, qh & 0x7777) | prmt(u, u, (qh >> 2) & 0x3333);
                out[2 * h] = prmt(x, u, 0x1404);
                out[2 * h + 1] = prmt(x, u, 0x3424);
            }
            for e in 0..8 {
                let c = (q >> (4 * e)) & 0xF;
                let v = if c & 8 != 0 { -E2M1[(c & 7) as usize] } else { E2M1[c as usize] };
                let got = (out[e / 2] >> (16 * (e % 2))) as u16;
                assert_eq!(half::f16::from_bits(got).to_f32(), v, "code {c:#x}");
            }
        }
    }

    #[test]
    fn e4m3_conversion_is_exact() {
        assert_eq!(cvt_f16x2_e4m3x2(0x3800), 0x3C00 << 16); // 1.0 in the upper byte
        assert_eq!(cvt_f16x2_e4m3x2(0x007E) & 0xFFFF, half::f16::from_f32(448.0).to_bits() as u32);
        assert_eq!(cvt_f16x2_e4m3x2(0x0001) & 0xFFFF, half::f16::from_f32(2f32.powi(-9)).to_bits() as u32);
        assert_eq!(cvt_f16x2_e4m3x2(0x00FF) & 0x7C00, 0x7C00);
    }

    #[test]
    fn f16_rounding() {
        let one = 0x3C00u32;
        assert_eq!(mul_rn_f16x2(one << 16 | one, 0x4000 << 16 | 0x4200), 0x4000 << 16 | 0x4200);
        assert_eq!(cvt_rn_f16x2_f32(1.0, -2.0), 0x3C00 << 16 | 0xC000);
        assert_eq!(cvt_rn_bf16x2_f32(1.0, 0.0), 0x3F80 << 16);
        // bf16: 1.5 · 2 = 3; the subnormal 2⁻¹²⁷ (0x0040) times 2¹²⁰ (0x7B80) is 2⁻⁷ (0x3C00).
        assert_eq!(mul_rn_bf16x2(0x3FC0 << 16 | 0x0040, 0x4000 << 16 | 0x7B80), 0x4040 << 16 | 0x3C00);
        // 1 + 2⁻⁷ squared rounds to even: 1 + 2⁻⁶.
        assert_eq!(mul_rn_bf16x2(0x3F81, 0x3F81) & 0xFFFF, 0x3F82);
    }
}
