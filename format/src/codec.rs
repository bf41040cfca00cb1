//! Scalar codecs: e2m1 (the NVFP4 value type), e4m3fn (the NVFP4 block-scale type), packing of two
//! e2m1 codes per byte, and correctly rounded `f64 → f16 / bf16` conversions.
//!
//! Encoding rounds to nearest, ties to even, and saturates: e2m1 to ±6, e4m3fn to ±448 (also for
//! ±∞). e4m3fn has no infinity; `0x7F` and `0xFF` are NaN, and NaN encodes to `0x7F` (`0xFF` for a
//! negative NaN). e2m1 has neither infinity nor NaN; NaN encodes to `+6` (`0x7`). Signed zeros
//! survive both ways, and values too small for the format round to a zero of the input's sign.
//!
//! Encoding is delegated to the `float8` (e4m3fn) and `float4` (e2m1) crates, which this module's
//! tests check exhaustively against a brute-force nearest-value search over the format's values;
//! decoding uses 16- and 256-entry tables (the e4m3fn table is built at compile time by `float8`).

use float4::F4E2M1;
use float8::F8E4M3;
use half::{bf16, f16};

/// Largest finite e2m1 magnitude.
pub const E2M1_MAX: f32 = 6.0;
/// Largest finite e4m3fn magnitude.
pub const E4M3_MAX: f32 = 448.0;
/// The canonical e4m3fn NaN code (`0xFF` is the other, negative, NaN).
pub const E4M3_NAN: u8 = 0x7F;
/// The e4m3fn code of `1.0`.
pub const E4M3_ONE: u8 = 0x38;
/// The e4m3fn code of `2.0`.
pub const E4M3_TWO: u8 = 0x40;
/// The largest finite positive e4m3fn code (`448.0`).
pub const E4M3_MAX_CODE: u8 = 0x7E;

/// The value of every e2m1 code, indexed by the code (bit 3 sign, bits 2..1 exponent with bias 1,
/// bit 0 mantissa).
pub const E2M1_VALUES: [f32; 16] =
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// The value of every e4m3fn code, indexed by the code (NaN at `0x7F` and `0xFF`).
pub const E4M3_VALUES: [f32; 256] = {
    let mut table = [0.0f32; 256];
    let mut code = 0;
    while code < 256 {
        table[code] = F8E4M3::from_bits(code as u8).to_f32();
        code += 1;
    }
    table
};

/// Decodes the e2m1 code in the low nibble of `code` (the high nibble is ignored).
#[inline]
pub fn e2m1_to_f32(code: u8) -> f32 {
    E2M1_VALUES[(code & 0xF) as usize]
}

/// Decodes an e2m1 code (low nibble) to `f16`; exact.
#[inline]
pub fn e2m1_to_f16(code: u8) -> f16 {
    f16::from_f32(e2m1_to_f32(code))
}

/// Decodes an e2m1 code (low nibble) to `bf16`; exact.
#[inline]
pub fn e2m1_to_bf16(code: u8) -> bf16 {
    bf16::from_f32(e2m1_to_f32(code))
}

/// Encodes `x` as e2m1 (round to nearest even, saturating to ±6, NaN to `+6`); the code is in the
/// low nibble.
#[inline]
pub fn e2m1_from_f32(x: f32) -> u8 {
    e2m1_from_f64(f64::from(x))
}

/// Encodes `x` as e2m1 (round to nearest even, saturating to ±6, NaN to `+6`); the code is in the
/// low nibble.
#[inline]
pub fn e2m1_from_f64(x: f64) -> u8 {
    F4E2M1::from_f64(x).to_bits()
}

/// Decodes an e4m3fn code to `f32`; exact (NaN for `0x7F` / `0xFF`).
#[inline]
pub fn e4m3_to_f32(code: u8) -> f32 {
    E4M3_VALUES[code as usize]
}

/// Decodes an e4m3fn code to `f16`; exact (every e4m3fn value, subnormals included, is an `f16`).
#[inline]
pub fn e4m3_to_f16(code: u8) -> f16 {
    f16::from_f32(e4m3_to_f32(code))
}

/// Decodes an e4m3fn code to `bf16`; exact.
#[inline]
pub fn e4m3_to_bf16(code: u8) -> bf16 {
    bf16::from_f32(e4m3_to_f32(code))
}

/// Encodes `x` as e4m3fn (round to nearest even, saturating to ±448, NaN to `0x7F` / `0xFF`).
#[inline]
pub fn e4m3_from_f32(x: f32) -> u8 {
    F8E4M3::from_f32(x).to_bits()
}

/// Encodes `x` as e4m3fn (round to nearest even, saturating to ±448, NaN to `0x7F` / `0xFF`).
#[inline]
pub fn e4m3_from_f64(x: f64) -> u8 {
    F8E4M3::from_f64(x).to_bits()
}

/// Whether an e4m3fn code is NaN (`0x7F` or `0xFF`).
#[inline]
pub const fn e4m3_is_nan(code: u8) -> bool {
    code & 0x7F == 0x7F
}

/// Packs e2m1 codes two per byte: code `2j` goes to the LOW nibble of byte `j`, code `2j+1` to the
/// high nibble. An odd trailing code gets a zero high nibble. Only the low nibble of each input is
/// used.
pub fn pack_e2m1(codes: &[u8]) -> Vec<u8> {
    codes.chunks(2).map(|pair| (pair[0] & 0xF) | (pair.get(1).map_or(0, |&hi| hi & 0xF) << 4)).collect()
}

/// Unpacks bytes into e2m1 codes (two per byte, the low nibble first); the inverse of
/// [`pack_e2m1`] for an even number of codes.
pub fn unpack_e2m1(bytes: &[u8]) -> Vec<u8> {
    bytes.iter().flat_map(|&b| [b & 0xF, b >> 4]).collect()
}

/// Rounds a finite or infinite `x` to a binary floating-point format with `mant` explicit
/// mantissa bits, `exp_bits` exponent bits and IEEE-style infinities and NaN; returns the bit
/// pattern. One rounding, to nearest, ties to even; overflow gives ±∞.
fn round_f64_to_small_float(x: f64, mant: u32, exp_bits: u32) -> u32 {
    let bias = (1i32 << (exp_bits - 1)) - 1;
    let sign = u32::from(x.is_sign_negative()) << (mant + exp_bits);
    let inf = ((1u32 << exp_bits) - 1) << mant;
    if x.is_nan() {
        return inf | (1 << (mant - 1));
    }
    let a = x.abs();
    let emin = 1 - bias;
    let emax = bias;
    if a == 0.0 {
        return sign;
    }
    // Binary exponent of `a` (f64 subnormals are far below every target's subnormals).
    let e = ((a.to_bits() >> 52) as i32 - 1023).max(emin);
    if e > emax {
        return sign | inf;
    }
    // Scaling by a power of two is exact; `n` is `a` in units of the target's quantum at `e`.
    let quantum = 2f64.powi(e - mant as i32);
    let n = (a / quantum).round_ties_even() as u32;
    // `n` includes the implicit bit for normals; a carry out of the mantissa bumps the exponent,
    // and a subnormal rounding up to 2^mant becomes the smallest normal, by the same addition.
    let bits = (((e + bias - 1) as u32) << mant) + n;
    sign | bits.min(inf)
}

/// Converts `x` to `f16` with ONE rounding (to nearest, ties to even; overflow to ±∞).
///
/// `half::f16::from_f64` is not used because on CPUs with F16C it converts through `f32`
/// (rounding twice), which can differ from a single rounding when the `f32` result lands exactly
/// halfway between two `f16` values.
pub fn f64_to_f16(x: f64) -> f16 {
    f16::from_bits(round_f64_to_small_float(x, 10, 5) as u16)
}

/// Converts `x` to `bf16` with ONE rounding (to nearest, ties to even; overflow to ±∞).
///
/// `half::bf16::from_f64` is not used because it discards the low 32 bits of the `f64` mantissa
/// before rounding, which misrounds values just above a `bf16` halfway point.
pub fn f64_to_bf16(x: f64) -> bf16 {
    bf16::from_bits(round_f64_to_small_float(x, 7, 8) as u16)
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// The host floating-point element types this crate reads and writes: `f32`, `f64`, `f16`,
/// `bf16`. Sealed.
pub trait HostFloat: sealed::Sealed + Copy + Send + Sync + PartialEq + core::fmt::Debug + 'static {
    /// The value as `f64` (exact for every implementor).
    fn to_f64(self) -> f64;
    /// The value as `f32` (exact except for `f64`, which is rounded to nearest).
    fn to_f32(self) -> f32;
    /// Rounds `x` to this type once, to nearest, ties to even.
    fn from_f64(x: f64) -> Self;
}

impl HostFloat for f32 {
    #[inline]
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline]
    fn from_f64(x: f64) -> Self {
        x as f32
    }
}

impl HostFloat for f64 {
    #[inline]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline]
    fn from_f64(x: f64) -> Self {
        x
    }
}

impl HostFloat for f16 {
    #[inline]
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    #[inline]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline]
    fn from_f64(x: f64) -> Self {
        f64_to_f16(x)
    }
}

impl HostFloat for bf16 {
    #[inline]
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
    #[inline]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline]
    fn from_f64(x: f64) -> Self {
        f64_to_bf16(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // ---- An independent oracle, written from the format definitions only. ----

    /// e4m3fn from its definition: bias 7, 3 mantissa bits, exponent field 0 = subnormal,
    /// S.1111.111 = NaN, no infinity.
    fn e4m3_definition(code: u8) -> f64 {
        let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let exp = i32::from((code >> 3) & 0xF);
        let mant = f64::from(code & 7);
        if code & 0x7F == 0x7F {
            f64::NAN
        } else if exp == 0 {
            sign * mant / 8.0 * 2f64.powi(-6)
        } else {
            sign * (1.0 + mant / 8.0) * 2f64.powi(exp - 7)
        }
    }

    /// e2m1 from its definition: bias 1, 1 mantissa bit, exponent field 0 = subnormal.
    fn e2m1_definition(code: u8) -> f64 {
        let sign = if code & 8 != 0 { -1.0 } else { 1.0 };
        let exp = i32::from((code >> 1) & 3);
        let mant = f64::from(code & 1);
        if exp == 0 {
            sign * mant * 0.5
        } else {
            sign * (1.0 + mant / 2.0) * 2f64.powi(exp - 1)
        }
    }

    /// Nearest non-negative code in `0..=max_code` by brute force, ties to the even code,
    /// saturating; then the sign bit of `x`.
    fn nearest(x: f64, max_code: u8, sign_bit: u8, decode: fn(u8) -> f64) -> u8 {
        let a = x.abs();
        let mut best = 0u8;
        let mut best_dist = f64::INFINITY;
        for c in 0..=max_code {
            let d = (decode(c) - a).abs();
            if d < best_dist || (d == best_dist && c & 1 == 0) {
                best = c;
                best_dist = d;
            }
        }
        if a > decode(max_code) {
            best = max_code;
        }
        best | if x.is_sign_negative() { sign_bit } else { 0 }
    }

    fn e4m3_oracle(x: f64) -> u8 {
        if x.is_nan() {
            return if x.is_sign_negative() { 0xFF } else { 0x7F };
        }
        nearest(x, E4M3_MAX_CODE, 0x80, e4m3_definition)
    }

    fn e2m1_oracle(x: f64) -> u8 {
        if x.is_nan() {
            return 0x7;
        }
        nearest(x, 0x7, 0x8, e2m1_definition)
    }

    fn same(a: f64, b: f64) -> bool {
        (a.is_nan() && b.is_nan()) || (a == b && a.is_sign_negative() == b.is_sign_negative())
    }

    /// Inputs that exercise every rounding decision: every `f16` and `bf16` value, every midpoint
    /// between neighbouring codes of both formats and a few `f32` ulps either side of it, both
    /// signs, and the specials.
    fn hard_inputs() -> Vec<f64> {
        let mut xs = Vec::new();
        for bits in 0..=u16::MAX {
            xs.push(f16::from_bits(bits).to_f64());
            xs.push(bf16::from_bits(bits).to_f64());
        }
        let mut mids = Vec::new();
        for c in 0..E4M3_MAX_CODE {
            mids.push((e4m3_definition(c) + e4m3_definition(c + 1)) / 2.0);
        }
        for c in 0..7 {
            mids.push((e2m1_definition(c) + e2m1_definition(c + 1)) / 2.0);
        }
        // Saturation boundaries: 464 is halfway from 448 to the (missing) 480; 7 from 6 to 8.
        mids.extend([464.0, 448.0, 480.0, 6.0, 7.0, 8.0, 1e30, 2f64.powi(-10), 2f64.powi(-9)]);
        for m in mids {
            let f = m as f32;
            for d in -3i32..=3 {
                let g = f32::from_bits(f.to_bits().wrapping_add_signed(d));
                xs.push(f64::from(g));
                xs.push(-f64::from(g));
            }
            // Just off the exact midpoint, below f32 resolution.
            xs.push(m * (1.0 + 1e-12));
            xs.push(m * (1.0 - 1e-12));
        }
        xs.extend([
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -f64::NAN,
            0.0,
            -0.0,
            f64::MAX,
            f64::MIN_POSITIVE,
            5e-324,
            -5e-324,
        ]);
        xs
    }

    #[test]
    fn e4m3_decode_all_256_codes_match_the_definition() {
        for code in 0..=255u8 {
            let want = e4m3_definition(code);
            assert!(same(f64::from(e4m3_to_f32(code)), want), "code {code:#04x}");
            assert!(same(e4m3_to_f16(code).to_f64(), want), "f16 {code:#04x}");
            assert!(same(e4m3_to_bf16(code).to_f64(), want), "bf16 {code:#04x}");
            assert_eq!(e4m3_is_nan(code), want.is_nan());
        }
        // Spot checks by hand.
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x40), 2.0);
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0xFE), -448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x07), 7.0 * 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
        assert!(e4m3_to_f32(0x80) == 0.0 && e4m3_to_f32(0x80).is_sign_negative());
        assert!(e4m3_to_f32(0x7F).is_nan() && e4m3_to_f32(0xFF).is_nan());
    }

    #[test]
    fn e2m1_decode_all_16_codes_match_the_definition() {
        for code in 0..16u8 {
            let want = e2m1_definition(code);
            assert!(same(f64::from(e2m1_to_f32(code)), want), "code {code:#x}");
            assert!(same(f64::from(e2m1_to_f32(code | 0xF0)), want), "high nibble ignored");
            assert!(same(e2m1_to_f16(code).to_f64(), want));
            assert!(same(e2m1_to_bf16(code).to_f64(), want));
            // The float4 crate's own decoder agrees with the table.
            assert!(same(F4E2M1::from_bits(code).to_f64(), want));
        }
    }

    #[test]
    fn every_code_round_trips() {
        for code in 0..=255u8 {
            if !e4m3_is_nan(code) {
                assert_eq!(e4m3_from_f32(e4m3_to_f32(code)), code, "{code:#04x}");
            }
        }
        for code in 0..16u8 {
            assert_eq!(e2m1_from_f32(e2m1_to_f32(code)), code, "{code:#x}");
        }
    }

    #[test]
    fn e4m3_encode_matches_brute_force_nearest_even() {
        for x in hard_inputs() {
            let want = e4m3_oracle(x);
            assert_eq!(e4m3_from_f64(x), want, "x = {x:e}");
            let xf = x as f32;
            if f64::from(xf) == x || x.is_nan() {
                assert_eq!(e4m3_from_f32(xf), want, "x = {x:e} (f32)");
            }
        }
    }

    #[test]
    fn e2m1_encode_matches_brute_force_nearest_even() {
        for x in hard_inputs() {
            let want = e2m1_oracle(x);
            assert_eq!(e2m1_from_f64(x), want, "x = {x:e}");
            let xf = x as f32;
            if f64::from(xf) == x || x.is_nan() {
                assert_eq!(e2m1_from_f32(xf), want, "x = {x:e} (f32)");
            }
        }
    }

    /// A fast oracle for every `f32`: the code is the number of midpoints between neighbouring
    /// codes that `|x|` has passed, a tie passing the midpoint only when that makes the code even.
    fn midpoint_oracle(mids: &[f64], x: f32) -> u8 {
        let a = f64::from(x.abs());
        let below = mids.partition_point(|&m| m < a);
        let tie_up = below < mids.len() && mids[below] == a && below % 2 == 1;
        (below + usize::from(tie_up)) as u8
    }

    /// Checks `encode` on all 2^32 `f32` inputs; `nan` is the expected code of a positive and of
    /// a negative NaN.
    fn exhaustive_f32(encode: fn(f32) -> u8, decode: fn(u8) -> f64, max_code: u8, sign_bit: u8, nan: [u8; 2]) {
        use rayon::prelude::*;
        let mids: Vec<f64> = (0..max_code).map(|c| (decode(c) + decode(c + 1)) / 2.0).collect();
        let bad = (0..=u32::MAX >> 16)
            .into_par_iter()
            .map(|hi| {
                let mut bad = 0u64;
                for lo in 0..=0xFFFFu32 {
                    let x = f32::from_bits(hi << 16 | lo);
                    let negative = x.is_sign_negative();
                    let want = if x.is_nan() {
                        nan[usize::from(negative)]
                    } else {
                        midpoint_oracle(&mids, x) | if negative { sign_bit } else { 0 }
                    };
                    bad += u64::from(encode(x) != want);
                }
                bad
            })
            .sum::<u64>();
        assert_eq!(bad, 0);
    }

    /// Every one of the 2^32 `f32` inputs (tens of seconds on 2 cores; run with `--ignored`).
    #[test]
    #[ignore = "exhaustive over all f32; slow"]
    fn e4m3_encode_every_f32() {
        exhaustive_f32(e4m3_from_f32, e4m3_definition, E4M3_MAX_CODE, 0x80, [0x7F, 0xFF]);
    }

    /// Every one of the 2^32 `f32` inputs (tens of seconds on 2 cores; run with `--ignored`).
    #[test]
    #[ignore = "exhaustive over all f32; slow"]
    fn e2m1_encode_every_f32() {
        exhaustive_f32(e2m1_from_f32, e2m1_definition, 0x7, 0x8, [0x7, 0x7]);
    }

    #[test]
    fn encode_hand_checked_cases() {
        // Ties to even, saturation, signed zero, underflow, NaN.
        assert_eq!(e2m1_from_f32(0.25), 0x0);
        assert_eq!(e2m1_from_f32(0.75), 0x2); // 0.5 (code 1) vs 1.0 (code 2): even wins
        assert_eq!(e2m1_from_f32(1.25), 0x2);
        assert_eq!(e2m1_from_f32(1.75), 0x4);
        assert_eq!(e2m1_from_f32(2.5), 0x4);
        assert_eq!(e2m1_from_f32(3.5), 0x6);
        assert_eq!(e2m1_from_f32(5.0), 0x6);
        assert_eq!(e2m1_from_f32(5.0001), 0x7);
        assert_eq!(e2m1_from_f32(1e9), 0x7);
        assert_eq!(e2m1_from_f32(-1e9), 0xF);
        assert_eq!(e2m1_from_f32(f32::INFINITY), 0x7);
        assert_eq!(e2m1_from_f32(f32::NEG_INFINITY), 0xF);
        assert_eq!(e2m1_from_f32(f32::NAN), 0x7);
        assert_eq!(e2m1_from_f32(-0.0), 0x8);
        assert_eq!(e2m1_from_f32(-0.1), 0x8);

        assert_eq!(e4m3_from_f32(1.0), E4M3_ONE);
        assert_eq!(e4m3_from_f32(2.0), E4M3_TWO);
        assert_eq!(e4m3_from_f32(448.0), 0x7E);
        assert_eq!(e4m3_from_f32(463.9), 0x7E);
        assert_eq!(e4m3_from_f32(464.0), 0x7E);
        assert_eq!(e4m3_from_f32(500.0), 0x7E);
        assert_eq!(e4m3_from_f32(f32::INFINITY), 0x7E);
        assert_eq!(e4m3_from_f32(f32::NEG_INFINITY), 0xFE);
        assert_eq!(e4m3_from_f32(f32::NAN), 0x7F);
        assert_eq!(e4m3_from_f32(-f32::NAN), 0xFF);
        assert_eq!(e4m3_from_f32(-0.0), 0x80);
        // 1.0625 is halfway between 1.0 (0x38) and 1.125 (0x39): even wins.
        assert_eq!(e4m3_from_f32(1.0625), 0x38);
        assert_eq!(e4m3_from_f32(1.1875), 0x3A);
        // Subnormals: 2^-9 is the smallest; 2^-10 is a tie with zero; just above rounds up.
        assert_eq!(e4m3_from_f32(2f32.powi(-9)), 0x01);
        assert_eq!(e4m3_from_f32(2f32.powi(-10)), 0x00);
        assert_eq!(e4m3_from_f32(-2f32.powi(-10)), 0x80);
        assert_eq!(e4m3_from_f32(2f32.powi(-10) * 1.01), 0x01);
        assert_eq!(e4m3_from_f32(3.0 * 2f32.powi(-10)), 0x02); // 1.5 quanta: tie to even
        assert_eq!(e4m3_from_f32(15.0 * 2f32.powi(-10)), 0x08); // 7.5 quanta rounds up to 2^-6
    }

    #[test]
    fn pack_puts_even_elements_in_the_low_nibble() {
        let codes = [0x1, 0x2, 0x3, 0xF, 0x9];
        let packed = pack_e2m1(&codes);
        assert_eq!(packed, vec![0x21, 0xF3, 0x09]);
        assert_eq!(unpack_e2m1(&packed), vec![0x1, 0x2, 0x3, 0xF, 0x9, 0x0]);
        for byte in 0..=255u8 {
            assert_eq!(pack_e2m1(&unpack_e2m1(&[byte])), vec![byte]);
        }
    }

    /// Brute-force oracle for a one-rounding conversion to a format whose positive finite bit
    /// patterns are ordered like their values: binary search for the neighbours, ties to even.
    fn round_oracle(x: f64, max_bits: u16, decode: fn(u16) -> f64, sign_bit: u16) -> u16 {
        let a = x.abs();
        let sign = if x.is_sign_negative() { sign_bit } else { 0 };
        let inf_bits = max_bits + 1;
        let max = decode(max_bits);
        let ulp_top = max - decode(max_bits - 1);
        if a >= max + ulp_top / 2.0 {
            // At or beyond the tie with the next power of two (max's mantissa is odd): ±∞.
            return sign | inf_bits;
        }
        let (mut lo, mut hi) = (0u16, max_bits);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if decode(mid) <= a {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let below = lo;
        if decode(below) == a || below == max_bits {
            return sign | below;
        }
        let above = below + 1;
        let (db, da) = (a - decode(below), decode(above) - a);
        let pick = if db < da || (db == da && below & 1 == 0) { below } else { above };
        sign | pick
    }

    fn small_float_cases(decode: fn(u16) -> f64, max_bits: u16) -> Vec<f64> {
        let mut xs = vec![0.0, -0.0, f64::INFINITY, f64::NEG_INFINITY, 1e300, 1e-300];
        for bits in 0..max_bits {
            let (lo, hi) = (decode(bits), decode(bits + 1));
            let mid = (lo + hi) / 2.0;
            for x in [lo, mid, mid * (1.0 + 1e-15), mid * (1.0 - 1e-15), lo + (hi - lo) / 3.0] {
                xs.push(x);
                xs.push(-x);
            }
        }
        let max = decode(max_bits);
        let half_ulp = (max - decode(max_bits - 1)) / 2.0;
        xs.extend([max, max + half_ulp, max + half_ulp * 0.999, max + half_ulp * 1.001]);
        xs
    }

    #[test]
    fn f64_to_f16_rounds_once() {
        let decode = |b: u16| f16::from_bits(b).to_f64();
        for x in small_float_cases(decode, 0x7BFF) {
            let want = round_oracle(x, 0x7BFF, decode, 0x8000);
            assert_eq!(f64_to_f16(x).to_bits(), want, "x = {x:e}");
        }
        assert!(f64_to_f16(f64::NAN).is_nan());
        // The double-rounding trap: 1 + 2^-11 + 2^-40 rounds to 1 + 2^-10 when rounded once, but
        // to 1.0 through f32 (which rounds it to the f16 tie 1 + 2^-11 first).
        let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(f64_to_f16(x).to_f64(), 1.0 + 2f64.powi(-10));
    }

    #[test]
    fn f64_to_bf16_rounds_once() {
        let decode = |b: u16| bf16::from_bits(b).to_f64();
        for x in small_float_cases(decode, 0x7F7F) {
            let want = round_oracle(x, 0x7F7F, decode, 0x8000);
            assert_eq!(f64_to_bf16(x).to_bits(), want, "x = {x:e}");
        }
        assert!(f64_to_bf16(f64::NAN).is_nan());
        // Just above a tie: only visible in the low 32 bits of the f64 mantissa.
        let x = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
        assert_eq!(f64_to_bf16(x).to_f64(), 1.0 + 2f64.powi(-7));
    }

    #[test]
    fn host_float_round_trips() {
        assert_eq!(<f16 as HostFloat>::from_f64(1.5).to_f64(), 1.5);
        assert_eq!(<bf16 as HostFloat>::from_f64(-3.0).to_f32(), -3.0);
        assert_eq!(<f32 as HostFloat>::from_f64(0.1), 0.1f32);
        assert_eq!(HostFloat::to_f64(0.1f64), 0.1);
    }
}
