//! The device NVFP4 quantizer and dequantizer (`nvfp4_quantize`, `nvfp4_dequantize`, both
//! architectures): kernel parameters, launch geometry, and the scalar arithmetic the kernels run,
//! written here as plain functions so that `cargo test` checks them on the host against
//! `nvfp4_format`'s CPU quantizer.
//!
//! # The recipe (the same as `nvfp4_format::quantize_with_global_scale`, bit for bit)
//!
//! For an f16 or bf16 tensor `x` of `rows x K` (K a multiple of 64) and a global scale `g` (an
//! `f32`, finite and positive), each block of 16 consecutive values of a row gets
//! 1. `amax` = the largest `|x|` of the block (exact);
//! 2. the scale code `s = e4m3((amax / 6) / g)`, both divisions in `f64` (IEEE `div.rn.f64`), then
//!    one rounding to e4m3fn (nearest, ties to even, saturating to 448);
//! 3. with `unit = e4m3_value(s) * g` (exact in `f64`), each value's e2m1 code is the nearest
//!    point of the grid `unit * {0, ±0.5, ..., ±6}` (ties to the even code, saturating to ±6, the
//!    sign of `x`, so `-0.0` and tiny negatives give `-0`); a block whose scale is 0 is all `+0`.
//!
//! The CPU quantizer encodes `f64(x / unit)`; this module compares `|x|` with the midpoints
//! `m * unit` between the grid points instead (exact products: `m` has at most 3 significant
//! bits, the e4m3 scale 4, `g` 24). Both give the same code: `x` has at most 11 significant bits,
//! so unless `x / unit` equals a midpoint it differs from it by more than `2^-31` relative, far
//! more than the `2^-53` of the `f64` division, which can therefore neither create nor cross a
//! tie. The comparisons are done on the 16-bit patterns: per block, each midpoint becomes the
//! pattern of the largest 16-bit float below it (or at it, see [`thresholds`]); non-negative
//! patterns are ordered like their values, so per value that is 7 integer comparisons.
//!
//! # NaN and infinity (defined; the CPU quantizer with a given global scale does the same)
//!
//! - A block holding a NaN gets the e4m3 NaN scale `0x7F` and all value codes `+6` (`0x7`,
//!   the e2m1 encoding of `NaN / NaN`): it dequantizes to NaN everywhere, and a GEMM row that
//!   reads it gives NaN.
//! - `±inf` saturates: the block's amax is infinite, so its scale saturates to 448 (`0x7E`), the
//!   infinite values encode as `±6` and the block's finite values as `x / (448 g)`.
//!
//! # Work decomposition
//!
//! One work item is one block: 16 values of one row, i.e. 32 input bytes (two 16-byte loads),
//! 8 bytes of packed values and one scale byte at [`crate::scale_layout::blocked_offset`].
//! Consecutive threads take consecutive blocks of a row, so loads and value stores are contiguous
//! across a warp. The quantizer's items also cover the padding rows of the last 128-row scale
//! block, whose scale bytes it writes as zero (K is a multiple of 64, so there are no padding
//! scale columns); the dequantizer's cover the real rows only. Items are `row * (K/16) + block`,
//! grid-strided.

/// Threads per CTA of both kernels.
pub const THREADS: u32 = 256;
/// Values per work item: one scale block.
pub const BLOCK: u32 = crate::scale_layout::SCALE_VEC;
/// K must be a multiple of this: whole 4-scale words per row, no padding scale columns (the
/// GEMM's requirement too).
pub const K_MULTIPLE: u32 = 64;
/// Upper bound (exclusive) on the items of one launch, so that the kernels' 32-bit item index
/// and grid stride cannot overflow (`2^31` items are `2^35` values, more than a GPU holds).
pub const MAX_ITEMS: u64 = 1 << 31;

/// Parameters of `nvfp4_quantize` and `nvfp4_dequantize` (passed by value).
///
/// `nvfp4_quantize` reads `dense` (f16 or bf16, `rows x k` row-major) and writes `values`
/// (`rows * k / 2` bytes) and `scales` (128x4 blocked, `blocked_bytes(rows, k)` bytes, padding
/// rows zero). `nvfp4_dequantize` reads `values` and `scales` and writes `dense`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ConvertParams {
    /// The f16/bf16 tensor: input of the quantizer, output of the dequantizer. 16-byte aligned.
    pub dense: u64,
    /// Packed e2m1 values, two per byte, element `2j` in the low nibble. 16-byte aligned.
    pub values: u64,
    /// e4m3 block scales in the 128x4 blocked layout. 16-byte aligned.
    pub scales: u64,
    /// Rows of the tensor.
    pub rows: u32,
    /// Values per row, a positive multiple of [`K_MULTIPLE`].
    pub k: u32,
    /// The per-tensor global scale `g` (finite, positive).
    pub global_scale: f32,
    /// 1 when `dense` is bf16, 0 for f16.
    pub bf16: u32,
}

const _: () = assert!(core::mem::size_of::<ConvertParams>() == 40);
const _: () = assert!(core::mem::align_of::<ConvertParams>() == 8);

/// Rows padded to the 128-row scale blocks.
pub const fn padded_rows(rows: u32) -> u64 {
    crate::scale_layout::rest_m(rows) as u64 * crate::scale_layout::BLOCK_ROWS as u64
}

/// Work items of `nvfp4_quantize`: every padded row's blocks.
pub const fn quantize_items(rows: u32, k: u32) -> u64 {
    padded_rows(rows) * (k / BLOCK) as u64
}

/// Work items of `nvfp4_dequantize`: every row's blocks.
pub const fn dequantize_items(rows: u32, k: u32) -> u64 {
    rows as u64 * (k / BLOCK) as u64
}

/// CTAs for `items` work items, at most `max_ctas` (the threads grid-stride beyond); 0 when
/// there is nothing to do (no launch).
pub const fn grid(items: u64, max_ctas: u32) -> u32 {
    grid_of(items, THREADS, max_ctas)
}

/// [`grid`] for CTAs of `threads` threads (one item each per pass).
pub const fn grid_of(items: u64, threads: u32, max_ctas: u32) -> u32 {
    let ctas = items.div_ceil(threads as u64);
    if ctas < max_ctas as u64 {
        ctas as u32
    } else {
        max_ctas
    }
}

/// Launch geometry of both kernels for `items` work items and at most `max_ctas` CTAs.
pub const fn launch(items: u64, max_ctas: u32) -> crate::launch::LaunchGeometry {
    crate::launch::LaunchGeometry { grid: grid(items, max_ctas), block: THREADS, cluster: 1, smem_bytes: 0 }
}

/// Register caps of both kernels (`.maxnreg`, see `cargo xtask build-ptx`): [`THREADS`]-thread
/// CTAs, four per SM.
pub const REGISTER_CAPS: [(&str, u32); 2] = [("nvfp4_quantize", 64), ("nvfp4_dequantize", 64)];
const _: () = assert!(4 * THREADS * 64 <= crate::launch::REGISTERS_PER_SM);

/// The canonical e4m3fn NaN.
pub const E4M3_NAN: u8 = 0x7F;
/// The largest finite e4m3fn code (448).
pub const E4M3_MAX_CODE: u8 = 0x7E;
/// Largest e2m1 magnitude.
pub const E2M1_MAX: f64 = 6.0;
/// Midpoints between neighbouring non-negative e2m1 values (0, 0.5, 1, 1.5, 2, 3, 4, 6).
pub const E2M1_MIDPOINTS: [f64; 7] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0];
/// Magnitudes of the e2m1 codes 0..8.
pub const E2M1_MAGNITUDES: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// `2^e` for `-1022 <= e <= 1023`.
#[inline(always)]
const fn pow2(e: i32) -> f64 {
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// The value of a 16-bit float's bit pattern (bf16 when `bf16`, else IEEE f16), exactly, as `f64`
/// (subnormals, infinities and NaN included).
#[inline(always)]
pub fn half_to_f64(bits: u16, bf16: bool) -> f64 {
    let (mant_bits, bias, exp_max) = if bf16 { (7u32, 127i32, 0xFFu32) } else { (10, 15, 0x1F) };
    let mag = (bits & 0x7FFF) as u32;
    let ef = mag >> mant_bits;
    let mant = mag & ((1 << mant_bits) - 1);
    let a = if ef == exp_max {
        if mant == 0 {
            f64::INFINITY
        } else {
            f64::NAN
        }
    } else if ef == 0 {
        mant as f64 * pow2(1 - bias - mant_bits as i32)
    } else {
        (mant | 1 << mant_bits) as f64 * pow2(ef as i32 - bias - mant_bits as i32)
    };
    if bits & 0x8000 != 0 {
        -a
    } else {
        a
    }
}

/// The bit pattern of `+inf` in the 16-bit format (every larger magnitude pattern is a NaN).
#[inline(always)]
pub const fn half_inf_bits(bf16: bool) -> u16 {
    if bf16 {
        0x7F80
    } else {
        0x7C00
    }
}

/// The value of an e4m3fn code (NaN for `0x7F` / `0xFF`).
#[inline(always)]
pub fn e4m3_to_f64(code: u8) -> f64 {
    let ef = ((code >> 3) & 0xF) as i32;
    let mant = (code & 7) as u32;
    let a = if code & 0x7F == 0x7F {
        f64::NAN
    } else if ef == 0 {
        mant as f64 * pow2(-9)
    } else {
        (mant | 8) as f64 * pow2(ef - 10)
    };
    if code & 0x80 != 0 {
        -a
    } else {
        a
    }
}

/// Encodes `v` as e4m3fn: round to nearest, ties to even, saturating to ±448 (also for ±inf), NaN
/// to `0x7F` (`0xFF` for a NaN with the sign bit set), signed zeros kept.
#[inline(always)]
pub fn e4m3_from_f64(v: f64) -> u8 {
    let sign: u8 = if v.is_sign_negative() { 0x80 } else { 0 };
    if v.is_nan() {
        return E4M3_NAN | sign;
    }
    let a = f64::from_bits(v.to_bits() & !(1 << 63));
    if a >= 448.0 {
        return E4M3_MAX_CODE | sign;
    }
    // Binary exponent, at least -6 (below that the e4m3 quantum is 2^-9 throughout).
    let exp = ((a.to_bits() >> 52) as i32 - 1023).max(-6);
    // `a` in units of the quantum 2^(exp-3): in [8, 16) for normals, [0, 8) below 2^-6. The
    // scaling by a power of two and the fraction are exact.
    let scaled = a * pow2(3 - exp);
    let n = scaled as u32;
    let frac = scaled - n as f64;
    let n = n + (frac > 0.5 || (frac == 0.5 && n & 1 == 1)) as u32;
    // Exponent field exp + 7 and mantissa n - 8 (normals), or n (subnormals, where n = 8 is the
    // smallest normal): one formula; 448 is the largest code reachable below 448 + 16.
    let code = ((exp + 6) as u32 * 8 + n).min(E4M3_MAX_CODE as u32);
    code as u8 | sign
}

/// The largest non-negative 16-bit float (bf16 when `bf16`, else f16) at most `t`, as a bit
/// pattern, and whether it equals `t`; the largest finite value for `t` beyond it. For a positive,
/// finite `t`.
#[inline(always)]
pub fn half_floor(t: f64, bf16: bool) -> (u16, bool) {
    let (mant_bits, bias, max_bits) = if bf16 { (7i32, 127i32, 0x7F7Fu16) } else { (10, 15, 0x7BFF) };
    if t >= half_to_f64(max_bits, bf16) {
        return (max_bits, t == half_to_f64(max_bits, bf16));
    }
    // Binary exponent, at least the format's smallest normal exponent (its quantum is the
    // subnormals' quantum too).
    let exp = ((t.to_bits() >> 52) as i32 - 1023).max(1 - bias);
    // `t` in quanta 2^(exp - mant_bits) (exact scaling), truncated.
    let scaled = t * pow2(mant_bits - exp);
    let n = scaled as u32;
    // Exponent field exp + bias and mantissa n - 2^mant_bits (normals), or n (subnormals and the
    // first normal binade): one formula.
    let bits = ((exp - (1 - bias)) as u32) << mant_bits as u32;
    ((bits + n) as u16, n as f64 == scaled)
}

/// The steps of a block's quantization that a device may do with instructions of its own, with
/// the same results as [`Software`]'s: the thresholds' floor ([`half_floor`]) and the e2m1 codes
/// of a word's two halves ([`e2m1_code_pair`]).
pub trait BlockOps {
    /// The block's thresholds in the form [`Self::codes`] reads.
    type Thresholds: Copy;
    /// [`half_floor`] for a positive finite `t`.
    fn half_floor(t: f64, bf16: bool) -> (u16, bool);
    /// [`thresholds`]' result in this form.
    fn prepare(c: &[u16; 7]) -> Self::Thresholds;
    /// The packed e2m1 codes of `W` words (not NaN; element `2i + h` in bits `4(2i + h)..`): each
    /// word's two halves' [`e2m1_code`].
    fn codes<const W: usize>(words: [u32; W], c: &Self::Thresholds, bf16: bool) -> u64;
}

/// The CPU's steps (integer and `f64` arithmetic).
pub struct Software;

impl BlockOps for Software {
    type Thresholds = [u32; 7];
    #[inline(always)]
    fn half_floor(t: f64, bf16: bool) -> (u16, bool) {
        half_floor(t, bf16)
    }
    #[inline(always)]
    fn prepare(c: &[u16; 7]) -> [u32; 7] {
        pair_thresholds(c)
    }
    #[inline(always)]
    fn codes<const W: usize>(words: [u32; W], c: &[u32; 7], _bf16: bool) -> u64 {
        pack_codes(words, |w| e2m1_code_pair(w, c))
    }
}

/// The bytes `pair(word)` of `W` words packed little-endian (word `i` in bits `8i..8i + 8`).
#[inline(always)]
pub fn pack_codes<const W: usize>(words: [u32; W], pair: impl Fn(u32) -> u8) -> u64 {
    let mut packed = 0;
    let mut i = 0;
    while i < W {
        packed |= (pair(words[i]) as u64) << (8 * i);
        i += 1;
    }
    packed
}

/// The block's 7 comparison thresholds for a positive finite scale unit `unit`: the e2m1
/// magnitude code of a 16-bit float whose magnitude pattern is `mag` (not NaN) is the number of
/// thresholds `c` with `mag > c`. Threshold `i` stands for the midpoint `m_i * unit` between
/// codes `i` and `i + 1`: the largest pattern at most the midpoint when a tie goes down (to
/// the even code `i`, `i` even), the largest pattern below it when a tie goes up (`i` odd).
#[inline(always)]
pub fn thresholds(unit: f64, bf16: bool) -> [u16; 7] {
    thresholds_with::<Software>(unit, bf16)
}

/// [`thresholds`] with `O`'s floor.
#[inline(always)]
pub fn thresholds_with<O: BlockOps>(unit: f64, bf16: bool) -> [u16; 7] {
    let mut c = [0u16; 7];
    let mut i = 0;
    while i < 7 {
        let (floor, exact) = O::half_floor(E2M1_MIDPOINTS[i] * unit, bf16);
        // `exact` implies floor > 0 (the midpoint is positive).
        c[i] = floor - (i % 2 == 1 && exact) as u16;
        i += 1;
    }
    c
}

/// The e2m1 code of the 16-bit float `bits` (not NaN) given its block's [`thresholds`]: nearest
/// grid point, ties to the even code, saturating to ±6, with the input's sign bit.
#[inline(always)]
pub fn e2m1_code(bits: u16, c: &[u16; 7]) -> u8 {
    let mag = bits & 0x7FFF;
    let code = (mag > c[0]) as u8
        + (mag > c[1]) as u8
        + (mag > c[2]) as u8
        + (mag > c[3]) as u8
        + (mag > c[4]) as u8
        + (mag > c[5]) as u8
        + (mag > c[6]) as u8;
    code | ((bits >> 12) as u8 & 0x8)
}

/// [`thresholds`] for [`e2m1_code_pair`]: each in both 16-bit halves of a word, bit 15 of each
/// half set (thresholds are at most the largest finite pattern, below `0x8000`).
#[inline(always)]
pub fn pair_thresholds(c: &[u16; 7]) -> [u32; 7] {
    let mut p = [0u32; 7];
    let mut i = 0;
    while i < 7 {
        p[i] = 0x8000_8000 | c[i] as u32 | (c[i] as u32) << 16;
        i += 1;
    }
    p
}

/// [`e2m1_code`] of both 16-bit floats of `word` (not NaN) at once, the low half's code in bits
/// 0..4 and the high half's in 4..8, from [`pair_thresholds`]. In each half, `(0x8000 | c) −
/// mag` keeps bit 15 set exactly when `c ≥ mag` (both at most `0x7FFF`, so the low half never
/// borrows from the high one); the sum of those bits over the seven thresholds counts the
/// thresholds at or above the magnitude, and the code is 7 minus that count.
#[inline(always)]
pub fn e2m1_code_pair(word: u32, c2: &[u32; 7]) -> u8 {
    let mag = word & 0x7FFF_7FFF;
    let mut at_or_above = 0;
    let mut i = 0;
    while i < 7 {
        at_or_above += ((c2[i] - mag) >> 15) & 0x0001_0001;
        i += 1;
    }
    // Each sign bit (15, 31) to bit 3 of its half's code.
    let codes = (0x0007_0007 - at_or_above) | ((word >> 12) & 0x0008_0008);
    (codes & 0xF) as u8 | ((codes >> 12) & 0xF0) as u8
}

/// The scale code of a block whose largest magnitude has the bit pattern `amax_bits` (a NaN
/// pattern for a block holding a NaN): `e4m3((amax / 6) / g)`, `0x7F` for NaN.
#[inline(always)]
pub fn block_scale(amax_bits: u16, bf16: bool, global: f64) -> u8 {
    if amax_bits > half_inf_bits(bf16) {
        return E4M3_NAN;
    }
    e4m3_from_f64(half_to_f64(amax_bits, bf16) / E2M1_MAX / global)
}

/// Quantizes one block of 16 values, given as 8 words of two 16-bit floats each (element `2w` in
/// the low half of word `w`), with the global scale `global` (= `f64::from(g)`). Returns the scale
/// code and the 16 packed e2m1 codes (element `i` in bits `4i..4i+4`, i.e. the 8 little-endian
/// bytes of the packed row): [`quantize_block_part`] of the whole block.
#[inline(always)]
pub fn quantize_block(words: [u32; 8], bf16: bool, global: f64) -> (u8, u64) {
    quantize_block_part(words, block_part_amax(words), bf16, global)
}

/// The largest magnitude of the values of `W` words (two each), as a bit pattern (NaN patterns
/// above infinity): a block's is the largest of its parts' ([`quantize_block_part`]).
#[inline(always)]
pub fn block_part_amax<const W: usize>(words: [u32; W]) -> u16 {
    let mag = |w: u32| (w as u16 & 0x7FFF).max((w >> 16) as u16 & 0x7FFF);
    let mut m = 0;
    let mut i = 0;
    while i < W {
        m = m.max(mag(words[i]));
        i += 1;
    }
    m
}

/// `W ≤ 8` consecutive words of a block (from word `j`) quantized with the block's largest
/// magnitude pattern `amax_bits` (the largest of all parts' [`block_part_amax`]): the block's
/// scale code and the part's `2W` packed e2m1 codes (element `2j + i` in bits `4i..4i+4`).
/// Threads sharing a block each quantize a part; together the parts give exactly
/// [`quantize_block`]'s scale and codes.
#[inline(always)]
pub fn quantize_block_part<const W: usize>(words: [u32; W], amax_bits: u16, bf16: bool, global: f64) -> (u8, u64) {
    quantize_block_part_with::<Software, W>(words, amax_bits, bf16, global)
}

/// [`quantize_block`] with `O`'s steps.
#[inline(always)]
pub fn quantize_block_with<O: BlockOps>(words: [u32; 8], bf16: bool, global: f64) -> (u8, u64) {
    quantize_block_part_with::<O, 8>(words, block_part_amax(words), bf16, global)
}

/// [`quantize_block_part`] with `O`'s steps.
#[inline(always)]
pub fn quantize_block_part_with<O: BlockOps, const W: usize>(
    words: [u32; W],
    amax_bits: u16,
    bf16: bool,
    global: f64,
) -> (u8, u64) {
    const { assert!(W >= 1 && W <= 8) };
    let scale = block_scale(amax_bits, bf16, global);
    if scale == E4M3_NAN {
        return (scale, 0x7777_7777_7777_7777 >> (64 - 8 * W));
    }
    let unit = e4m3_to_f64(scale) * global;
    if unit == 0.0 {
        return (scale, 0);
    }
    let c = O::prepare(&thresholds_with::<O>(unit, bf16));
    (scale, O::codes(words, &c, bf16))
}

/// The exact value `e2m1(code) * e4m3(scale) * g` of one element (`code` in the low nibble), as
/// `f64` (at most 2 + 4 + 24 significant bits: exact); NaN when the scale is NaN. The dequantizer
/// rounds it once to f16 or bf16.
#[inline(always)]
pub fn dequantize_value(code: u32, scale_times_global: f64) -> f64 {
    // Twice the magnitudes 0, 0.5, ..., 6 are the integers 0, 1, 2, 3, 4, 6, 8, 12: one nibble
    // each of a constant (no table in memory).
    let twice = (0xC864_3210u32 >> (4 * (code & 7))) & 0xF;
    let m = twice as f64 * (0.5 * scale_times_global);
    if code & 8 != 0 {
        -m
    } else {
        m
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;

    #[test]
    fn parts_are_one_block() {
        let mut state = 0x1234_5678_9ABC_DEF0u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let specials = [0u16, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7F80, 0xFF80, 0x7FC0, 0x0001, 0x3C00];
        for case in 0..20_000 {
            let bf16 = case % 2 == 1;
            let words: [u32; 8] = core::array::from_fn(|_| {
                let r = next();
                let half = |x: u64| {
                    if x % 11 == 0 {
                        specials[(x / 11 % specials.len() as u64) as usize] as u32
                    } else {
                        // Magnitudes spread over the exponent range, random signs.
                        (x as u32 & 0x83FF) | ((((x >> 16) % 31) as u32) << 10)
                    }
                };
                half(r) | half(r >> 32) << 16
            });
            let global = [1.0, 0.37, 2.0f64.powi(-9), 1e-30, 6.0 * 448.0][case % 5];
            let (scale, packed) = quantize_block(words, bf16, global);
            // Two halves.
            let lo: [u32; 4] = [words[0], words[1], words[2], words[3]];
            let hi: [u32; 4] = [words[4], words[5], words[6], words[7]];
            let amax = block_part_amax(lo).max(block_part_amax(hi));
            let (s0, p0) = quantize_block_part(lo, amax, bf16, global);
            let (s1, p1) = quantize_block_part(hi, amax, bf16, global);
            assert_eq!((s0, s1), (scale, scale), "case {case}");
            assert_eq!(p0 | p1 << 32, packed, "case {case}: {words:x?}");
            // Four quarters.
            let q: [[u32; 2]; 4] = core::array::from_fn(|i| [words[2 * i], words[2 * i + 1]]);
            let amax4 = q.iter().map(|&w| block_part_amax(w)).max().unwrap();
            assert_eq!(amax4, amax);
            let mut joined = 0u64;
            for (i, &w) in q.iter().enumerate() {
                let (s, p) = quantize_block_part(w, amax4, bf16, global);
                assert_eq!(s, scale, "case {case}");
                joined |= p << (16 * i);
            }
            assert_eq!(joined, packed, "case {case}: quarters {words:x?}");
        }
    }

    #[test]
    fn params_layout() {
        assert_eq!(core::mem::offset_of!(ConvertParams, rows), 24);
        assert_eq!(core::mem::offset_of!(ConvertParams, bf16), 36);
    }

    #[test]
    fn geometry() {
        assert_eq!(padded_rows(0), 0);
        assert_eq!(padded_rows(1), 128);
        assert_eq!(padded_rows(129), 256);
        assert_eq!(quantize_items(1, 64), 128 * 4);
        assert_eq!(quantize_items(300, 256), 384 * 16);
        assert_eq!(dequantize_items(300, 256), 300 * 16);
        assert_eq!(grid(0, 100), 0);
        assert_eq!(grid(1, 100), 1);
        assert_eq!(grid(256, 100), 1);
        assert_eq!(grid(257, 100), 2);
        assert_eq!(grid(1 << 30, 100), 100);
        assert_eq!(quantize_items(u32::MAX, 1 << 22), (1u64 << 32) * (1 << 18));
    }

    #[test]
    fn half_decoding_by_hand() {
        for bf16 in [false, true] {
            assert_eq!(half_to_f64(0, bf16), 0.0);
            assert!(half_to_f64(0x8000, bf16).is_sign_negative());
            assert_eq!(half_to_f64(half_inf_bits(bf16), bf16), f64::INFINITY);
            assert_eq!(half_to_f64(half_inf_bits(bf16) | 0x8000, bf16), f64::NEG_INFINITY);
            assert!(half_to_f64(half_inf_bits(bf16) + 1, bf16).is_nan());
        }
        assert_eq!(half_to_f64(0x3C00, false), 1.0);
        assert_eq!(half_to_f64(0x0001, false), 2f64.powi(-24));
        assert_eq!(half_to_f64(0x7BFF, false), 65504.0);
        assert_eq!(half_to_f64(0xC000, false), -2.0);
        assert_eq!(half_to_f64(0x3F80, true), 1.0);
        assert_eq!(half_to_f64(0x0001, true), 2f64.powi(-133));
        assert_eq!(half_to_f64(0x0080, true), 2f64.powi(-126));
    }

    #[test]
    fn e4m3_by_hand() {
        assert_eq!(e4m3_to_f64(0x38), 1.0);
        assert_eq!(e4m3_to_f64(0x7E), 448.0);
        assert_eq!(e4m3_to_f64(0x01), 2f64.powi(-9));
        assert_eq!(e4m3_to_f64(0x08), 2f64.powi(-6));
        assert!(e4m3_to_f64(0x7F).is_nan() && e4m3_to_f64(0xFF).is_nan());
        for code in 0..=255u8 {
            if code & 0x7F != 0x7F {
                assert_eq!(e4m3_from_f64(e4m3_to_f64(code)), code, "{code:#04x}");
            }
        }
        assert_eq!(e4m3_from_f64(464.0), 0x7E);
        assert_eq!(e4m3_from_f64(f64::INFINITY), 0x7E);
        assert_eq!(e4m3_from_f64(f64::NEG_INFINITY), 0xFE);
        assert_eq!(e4m3_from_f64(f64::NAN), 0x7F);
        assert_eq!(e4m3_from_f64(1.0625), 0x38);
        assert_eq!(e4m3_from_f64(1.0625 + 1e-12), 0x39);
        assert_eq!(e4m3_from_f64(2f64.powi(-10)), 0x00);
        assert_eq!(e4m3_from_f64(2f64.powi(-10) * (1.0 + 1e-15)), 0x01);
        assert_eq!(e4m3_from_f64(15.0 * 2f64.powi(-10)), 0x08);
        assert_eq!(e4m3_from_f64(5e-324), 0x00);
        assert_eq!(e4m3_from_f64(-0.0), 0x80);
    }

    #[test]
    fn block_by_hand() {
        // f16 block: 2688 (amax), 448, 224 (tie 0.5 -> code 1), 112 (tie 0.25 -> 0), -0.0, then 0.
        let vals: [u16; 16] = [0x6940, 0x5F00, 0x5B00, 0x5700, 0x8000, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let words: [u32; 8] = core::array::from_fn(|w| vals[2 * w] as u32 | (vals[2 * w + 1] as u32) << 16);
        let (s, packed) = quantize_block(words, false, 1.0);
        assert_eq!(s, 0x7E);
        assert_eq!(packed & 0xF_FFFF, 0x8_0127);
        // Zero block: scale 0, codes 0. NaN block: NaN scale, codes +6.
        assert_eq!(quantize_block([0x8000_8000; 8], false, 1.0), (0, 0));
        let mut w = [0u32; 8];
        w[3] = 0x7E00;
        assert_eq!(quantize_block(w, false, 1.0), (0x7F, 0x7777_7777_7777_7777));
        // Infinity saturates: scale 448 with g = 1, the inf encodes as -6, 448 as 1.0.
        w[3] = 0xFC00 | (0x5F00 << 16);
        let (s, packed) = quantize_block(w, false, 1.0);
        assert_eq!(s, 0x7E);
        assert_eq!((packed >> 24) & 0xFF, 0x2F);
    }

    /// The paired codes against [`e2m1_code`] of each half: every magnitude with both signs
    /// against threshold sets of every kind (the blocks' own, equal, out of order, the extremes).
    #[test]
    fn paired_codes_are_the_single_ones() {
        let mut st = 7u64;
        let mut next = || {
            st = st.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (st >> 33) as u32
        };
        let mut sets: std::vec::Vec<[u16; 7]> = vec![[0; 7], [0x7FFF; 7], [0, 0, 0, 0x7FFF, 0x7FFF, 0x7FFF, 0x7FFF]];
        for unit in [1e-9, 3.7e-5, 0.02, 1.0, 6.5, 448.0, 1e6] {
            sets.extend([false, true].map(|bf16| thresholds(unit, bf16)));
        }
        for _ in 0..40 {
            let mut c = [0u16; 7];
            c.iter_mut().for_each(|v| *v = (next() % 0x8000) as u16);
            sets.push(c);
        }
        for c in &sets {
            let c2 = pair_thresholds(c);
            for mag in 0..0x8000u32 {
                for sign in [0, 0x8000] {
                    let lo = mag | sign;
                    let hi = (next() % 0x8000) | (next() & 0x8000);
                    let want = e2m1_code(lo as u16, c) | e2m1_code(hi as u16, c) << 4;
                    assert_eq!(e2m1_code_pair(lo | hi << 16, &c2), want, "{lo:#x} {hi:#x} {c:?}");
                    let want = e2m1_code(hi as u16, c) | e2m1_code(lo as u16, c) << 4;
                    assert_eq!(e2m1_code_pair(hi | lo << 16, &c2), want, "{hi:#x} {lo:#x} {c:?}");
                }
            }
        }
    }

    /// `half_floor` against a binary search over the ordered non-negative patterns.
    #[test]
    fn half_floor_is_the_largest_pattern_below() {
        let mut ts = vec![];
        for b in 1..0x7F80u16 {
            for bf16 in [false, true] {
                let v = half_to_f64(b, bf16);
                if v.is_finite() {
                    ts.push((v, bf16));
                    ts.push((v * (1.0 + 1e-12), bf16));
                    ts.push((v * (1.0 - 1e-12), bf16));
                    ts.push((v * 1.7, bf16));
                }
            }
        }
        ts.extend([(1e-300, false), (1e-300, true), (1e300, false), (1e300, true), (65520.0, false)]);
        for (t, bf16) in ts {
            let max_bits = if bf16 { 0x7F7Fu16 } else { 0x7BFF };
            // Largest pattern in 0..=max_bits with value <= t.
            let (mut lo, mut hi) = (0u16, max_bits);
            while lo < hi {
                let mid = lo + (hi - lo).div_ceil(2);
                if half_to_f64(mid, bf16) <= t {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            assert_eq!(half_floor(t, bf16), (lo, half_to_f64(lo, bf16) == t), "t = {t:e}, bf16 {bf16}");
        }
    }

    #[test]
    fn dequantize_value_is_the_product() {
        for code in 0..16u32 {
            let m = E2M1_MAGNITUDES[(code & 7) as usize] * 3.0;
            assert_eq!(dequantize_value(code, 3.0), if code & 8 != 0 { -m } else { m });
        }
        assert_eq!(dequantize_value(7, 2.0), 12.0);
        assert_eq!(dequantize_value(0xF, 2.0), -12.0);
        assert!(dequantize_value(8, 2.0).is_sign_negative());
        assert!(dequantize_value(0, f64::NAN).is_nan());
    }
}
