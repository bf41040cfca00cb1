//! Exact conversions between the NVFP4 storage formats and f16/bf16/f32, on sm_90+.
//!
//! Every e2m1 × e4m3 product is exact in f16 (≤ 6 significant bits, magnitudes in [2^-10, 2688]),
//! so dequantizing to f16 and multiplying by the block scale with `mul.rn.f16x2` loses nothing.

#[cfg(not(target_arch = "nvptx64"))]
use super::model::convert as model;
#[cfg(target_arch = "nvptx64")]
use core::arch::asm;
use nvfp4_gemm_abi::sm90::DECODE_EXPONENT;

/// Decodes eight e2m1 values (the nibbles of `q`, element 0 in the low nibble) to four f16x2 words
/// scaled by 2⁻¹⁴ (`nvfp4_gemm_abi::sm90::DECODE_EXPONENT`): word `k` holds elements `k` (low
/// half) and `k + 4` (high half).
///
/// An e2m1 magnitude `eem` placed at f16 bits 11..9 is an f16 with exponent field `ee` and top
/// mantissa bit `m`: exactly the e2m1 value times 2⁻¹⁴ (also for `ee = 0`, where both formats are
/// subnormal); the sign goes to bit 15. Elements `k` and `k + 4` sit 16 bits apart in `q`, so one
/// shift places both. A magnitude needs a shift 3 bits shorter than its sign, so first each
/// nibble's sign is copied 3 bits up, next to its magnitude: `even` holds the magnitudes of the
/// low nibbles of each byte as they are and their signs 3 bits higher (bit 6 of the byte), `odd`
/// the same for the high nibbles (sign in bit 2 of the next byte); every other bit of the two is
/// garbage that the final mask drops. Then one shift and one mask make each word: 11 integer
/// operations per 8 values (one `lop3` each for `even` and `odd`, [`select_bits`]), where shifting
/// magnitude and sign separately takes 15. For `k = 3` the sign of element 7 (bit 31 of `q`) would
/// have to sit 3 bits above the word, so `odd` takes its bit 31 from `q` itself (no other word
/// reads it: `k = 1` shifts it out) and that word is `odd` shifted *arithmetically* right by 3,
/// which puts bit 31 back in place (an arithmetic shift copies it into bits 28..31).
#[inline(always)]
pub fn e2m1x8_to_f16x2_scaled(q: u32) -> [u32; 4] {
    const MAGNITUDE: u32 = 0x0E00_0E00;
    const SIGN: u32 = 0x8000_8000;
    const LOW_NIBBLE_MAGNITUDES: u32 = 0x0707_0707;
    // The high nibbles' magnitudes, and bit 31 (element 7's sign) for word 3.
    const HIGH_NIBBLE_MAGNITUDES: u32 = 0xF070_7070;
    let q3 = q << 3;
    let even = select_bits(LOW_NIBBLE_MAGNITUDES, q, q3);
    let odd = select_bits(HIGH_NIBBLE_MAGNITUDES, q, q3);
    [
        (even << 9) & (MAGNITUDE | SIGN),
        (odd << 5) & (MAGNITUDE | SIGN),
        (even << 1) & (MAGNITUDE | SIGN),
        ((odd as i32 >> 3) as u32) & (MAGNITUDE | SIGN),
    ]
}

/// The bits of `if_set` where `mask` is 1 and those of `if_clear` where it is 0, as one
/// `lop3.b32 d, a, b, c, 0xE4;` (PTX ISA, "Logic and Shift Instructions: lop3"; table
/// `(a & c) | (b & ~c)`). Written as `asm!` because LLVM narrows the two masks of the plain
/// expression by the bits its users need, and ptxas then emits two or three instructions instead of
/// one.
#[inline(always)]
pub fn select_bits(mask: u32, if_set: u32, if_clear: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    let d = {
        let d: u32;
        // SAFETY: register arithmetic only.
        unsafe {
            asm!("lop3.b32 {d}, {a}, {b}, {c}, 0xE4;", d = out(reg32) d, a = in(reg32) if_set, b = in(reg32) if_clear,
                 c = in(reg32) mask, options(pure, nomem, nostack));
        }
        d
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let d = model::lop3(if_set, if_clear, mask, 0xE4);
    d
}

/// One pair of [`e2m1x8_to_f16x2_scaled`] alone: pair `shift / 4` of word `q` (`shift` = 0, 4, 8
/// or 12, which may vary between threads): nibbles `shift / 4` and `shift / 4 + 4`, moved down to
/// nibbles 0 and 4 and placed as there.
#[inline(always)]
pub const fn e2m1x2_pair_to_f16x2_scaled(q: u32, shift: u32) -> u32 {
    const MAGNITUDE: u32 = 0x0E00_0E00;
    const SIGN: u32 = 0x8000_8000;
    let x = q >> shift;
    ((x << 9) & MAGNITUDE) | ((x << 12) & SIGN)
}

// The decoders' 1.0 (code 0b0010) is f16's 1.0 (0x3C00) less `DECODE_EXPONENT` in the exponent
// field: their values are the e2m1 values times 2^-DECODE_EXPONENT, which the kernels multiply
// back in with `DECODE_UNSCALE` and `DECODE_UNSCALE_F16X2` (exact: at most 6 · 448 = 2688).
const _: () = assert!(e2m1x2_pair_to_f16x2_scaled(0x2, 0) + (DECODE_EXPONENT << 10) == 0x3C00);

/// The e4m3 scale bytes `q` (0..4) of `w0` and of `w1` in one f16x2 (`w0`'s in the low half):
/// two rows' block scales for [`mul_f16x2_by_half`], with one `prmt` and one
/// `cvt.rn.f16x2.e4m3x2`. Times [`e2m1x8_to_f16x2_scaled`]'s values (×2⁻¹⁴) the products
/// `value · scale · 2⁻¹⁴` are exact in f16: they are `(2·value) · (2⁹·scale) · 2⁻²⁴`, an integer of
/// at most 6 significant bits (2·value: 2 bits; 2⁹·scale, every e4m3 value: at most 4) times
/// 2⁻²⁴, f16's smallest subnormal, and at most `12 · 448 · 2⁹ · 2⁻²⁴ ≈ 0.164`.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn e4m3_bytes_to_f16x2(w0: u32, w1: u32, q: u32) -> u32 {
    e4m3x2_selected_to_f16x2(w0, w1, q | ((q + 4) << 4))
}

/// Both halves of `a` times one half of `s` (`HIGH`: the upper one): `mul.rn.f16x2` with the half
/// broadcast by `mov.b32 {h, h}` (PTX ISA, "Data Movement and Conversion Instructions: mov"),
/// which ptxas folds into the multiplication's operand selector (`.H0_H0` / `.H1_H1`).
#[inline(always)]
pub fn mul_f16x2_by_half<const HIGH: bool>(a: u32, s: u32) -> u32 {
    mul_by_half::<HIGH, false>(a, s)
}

/// [`mul_f16x2_by_half`] or (`BF16`) [`mul_bf16x2_by_half`].
#[inline(always)]
fn mul_by_half<const HIGH: bool, const BF16: bool>(a: u32, s: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    let d = {
        let d: u32;
        // One template, the broadcast half named by `$h` (`h` or `l`), the multiplication `$mul`.
        macro_rules! mul_by_half {
            ($h:literal, $mul:literal) => {
                // SAFETY: register arithmetic only.
                unsafe {
                    asm!(
                        "{{",
                        ".reg .b16 l, h;",
                        ".reg .b32 b;",
                        "mov.b32 {{l, h}}, {s};",
                        concat!("mov.b32 b, {{", $h, ", ", $h, "}};"),
                        concat!($mul, " {d}, {a}, b;"),
                        "}}",
                        a = in(reg32) a, s = in(reg32) s, d = out(reg32) d, options(pure, nomem, nostack))
                }
            };
        }
        match (HIGH, BF16) {
            (true, false) => mul_by_half!("h", "mul.rn.f16x2"),
            (false, false) => mul_by_half!("l", "mul.rn.f16x2"),
            (true, true) => mul_by_half!("h", "mul.rn.bf16x2"),
            (false, true) => mul_by_half!("l", "mul.rn.bf16x2"),
        }
        d
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let d = {
        let h = if HIGH { s >> 16 } else { s & 0xFFFF };
        if BF16 {
            model::mul_rn_bf16x2(a, h << 16 | h)
        } else {
            model::mul_rn_f16x2(a, h << 16 | h)
        }
    };
    d
}

/// The e4m3 byte `q` (0..4) of `w`, converted to f16 and broadcast to both halves of an f16x2.
#[inline(always)]
pub fn e4m3_byte_to_f16x2(w: u32, q: u32) -> u32 {
    e4m3x2_selected_to_f16x2(w, 0, q | (q << 4))
}

/// Two e4m3 bytes picked from `{b, a}` by the two low selector nibbles of `sel` (`prmt.b32`), each
/// converted to f16: `cvt.rn.f16x2.e4m3x2` (PTX ISA 7.8, sm_89) on the low half-word of the
/// permutation, the first selected byte to the low half. Every finite e4m3 value is exact in f16;
/// 0x7F/0xFF give NaN.
#[inline(always)]
fn e4m3x2_selected_to_f16x2(a: u32, b: u32, sel: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    let d = {
        let d: u32;
        // SAFETY: register arithmetic only.
        unsafe {
            asm!(
                "{{",
                ".reg .b32 t;",
                ".reg .b16 h;",
                "prmt.b32 t, {a}, {b}, {sel};",
                "cvt.u16.u32 h, t;",
                "cvt.rn.f16x2.e4m3x2 {d}, h;",
                "}}",
                a = in(reg32) a, b = in(reg32) b, sel = in(reg32) sel, d = out(reg32) d, options(pure, nomem, nostack));
        }
        d
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let d = model::cvt_f16x2_e4m3x2(model::prmt(a, b, sel) as u16);
    d
}

/// Decodes one prepacked W4A16 word — eight e2m1 codes with their bits where
/// `nvfp4_gemm_abi::sm90::w4a16::Decoder::source_bit` puts them — to four 16x2 words, word `k`
/// holding elements `k` (low half) and `k + 4` (high half): f16 values times 2⁻¹⁴ (bits 9–11 and
/// 15: exponent field `ee`, top mantissa bit `m`, sign), or (`BF16`) bf16 values times 2⁻¹²⁶
/// (bits 6–8 and 15; 0.5 is the subnormal 2⁻¹²⁷). Each word is one step of the decoder
/// (`WordStep`: the word itself, a rotation, or a masked copy times a sum of powers of two, whose
/// copies share no bit) and one mask: 9 operations per 8 values for f16, 8 for bf16.
#[inline(always)]
pub fn prepacked_e2m1x8_to_16x2<const BF16: bool>(w: u32) -> [u32; 4] {
    use nvfp4_gemm_abi::sm90::w4a16::{WordStep, BF16_DECODER, F16_DECODER};
    let d = if BF16 { BF16_DECODER } else { F16_DECODER };
    let step = |k: usize| match d.steps[k] {
        WordStep::Identity => w,
        WordStep::RotateRight(r) => w.rotate_right(r),
        WordStep::MaskMultiply { mask, multiplier } => mul_lo(w & mask, multiplier),
    };
    [step(0) & d.keep(), step(1) & d.keep(), step(2) & d.keep(), step(3) & d.keep()]
}

/// `mul.lo.u32 d, a, b;` (PTX ISA, "Integer Arithmetic Instructions: mul"): one `IMAD` on the FMA
/// pipe, beside the logic pipe's shifts and masks. Written as `asm!` so that LLVM keeps the
/// multiplication by a constant instead of splitting it into shifts and adds.
#[inline(always)]
fn mul_lo(a: u32, b: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    let d = {
        let d: u32;
        // SAFETY: register arithmetic only.
        unsafe {
            asm!("mul.lo.u32 {d}, {a}, {b};", d = out(reg32) d, a = in(reg32) a, b = in(reg32) b,
                 options(pure, nomem, nostack));
        }
        d
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let d = a.wrapping_mul(b);
    d
}

/// The two e4m3 bytes of half `HIGH` of `w` (a prepacked W4A16 scale word for f16 activations:
/// rows `r` and `r + 8` of one k-step, `nvfp4_gemm_abi::sm90::w4a16::scale_source`) as f16x2,
/// the low byte in the low half: one `cvt.rn.f16x2.e4m3x2` (PTX ISA 7.8, sm_89) on the half-word.
#[inline(always)]
pub fn e4m3x2_half_to_f16x2<const HIGH: bool>(w: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    let d = {
        let d: u32;
        // SAFETY: register arithmetic only.
        unsafe {
            if HIGH {
                asm!("{{", ".reg .b16 l, h;", "mov.b32 {{l, h}}, {w};", "cvt.rn.f16x2.e4m3x2 {d}, h;", "}}",
                     w = in(reg32) w, d = out(reg32) d, options(pure, nomem, nostack));
            } else {
                asm!("{{", ".reg .b16 l, h;", "mov.b32 {{l, h}}, {w};", "cvt.rn.f16x2.e4m3x2 {d}, l;", "}}",
                     w = in(reg32) w, d = out(reg32) d, options(pure, nomem, nostack));
            }
        }
        d
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let d = model::cvt_f16x2_e4m3x2(if HIGH { (w >> 16) as u16 } else { w as u16 });
    d
}

/// The prepacked scale bytes of one k-step in `w` (a W4A16 scale word for bf16 activations:
/// bytes 0 and 2, or with `HIGH` bytes 1 and 3, `nvfp4_gemm_abi::sm90::w4a16::scale_source`) as
/// bf16x2, the lower byte's in the low half: the word shifted by 4 (left, or right for `HIGH`),
/// then one `lop3` keeps the two bytes' bits and ORs in the exponent's top bits
/// (`nvfp4_gemm_abi::sm90::w4a16::scale_bf16_bits`: `(byte << 4) + 0x7000`, no carry) — the value
/// `|scale| · 2¹¹⁹`. Times [`prepacked_e2m1x8_to_16x2`]'s bf16 values (×2⁻¹²⁶) the products are
/// `value · |scale| · 2⁻⁷`, exact in bf16 (normal, at most 6 significant bits).
#[inline(always)]
pub fn e5m3_pair_to_bf16x2<const HIGH: bool>(w: u32) -> u32 {
    let t = if HIGH { w >> 4 } else { w << 4 };
    and_or(t, 0x0FF0_0FF0, 0x7000_7000)
}

/// `(a & mask) | bits` as one `lop3.b32 d, a, mask, bits, 0xEA;` (table `(a & b) | c`), kept
/// from LLVM, which would narrow the constants and leave ptxas two instructions.
#[inline(always)]
fn and_or(a: u32, mask: u32, bits: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    let d = {
        let d: u32;
        // SAFETY: register arithmetic only.
        unsafe {
            asm!("lop3.b32 {d}, {a}, {b}, {c}, 0xEA;", d = out(reg32) d, a = in(reg32) a, b = in(reg32) mask,
                 c = in(reg32) bits, options(pure, nomem, nostack));
        }
        d
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let d = model::lop3(a, mask, bits, 0xEA);
    d
}

/// `prmt.b32 d, a, b, sel;` (PTX ISA, "Data Movement and Conversion Instructions: prmt", default
/// mode): byte `i` of `d` is byte `sel[4i..4i+3] & 7` of `{b, a}` (`a` bytes 0..3).
#[inline(always)]
pub fn prmt(a: u32, b: u32, sel: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    let d = {
        let d: u32;
        // SAFETY: register arithmetic only.
        unsafe {
            asm!("prmt.b32 {d}, {a}, {b}, {sel};", d = out(reg32) d, a = in(reg32) a, b = in(reg32) b,
                 sel = in(reg32) sel, options(pure, nomem, nostack));
        }
        d
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let d = model::prmt(a, b, sel);
    d
}

/// Both halves of `a` times one half of `s` (`HIGH`: the upper one), bf16: `mul.rn.bf16x2` (PTX
/// ISA 7.8, sm_90; no `.ftz` form, so subnormal inputs are kept) with the half broadcast as in
/// [`mul_f16x2_by_half`].
#[inline(always)]
pub fn mul_bf16x2_by_half<const HIGH: bool>(a: u32, s: u32) -> u32 {
    mul_by_half::<HIGH, true>(a, s)
}

/// One packed half-precision operation `$op d, a, b;` on two 32-bit registers, or its model.
macro_rules! half2_op {
    ($(#[$doc:meta])* $name:ident, $op:literal, $model:ident) => {
        $(#[$doc])*
        #[inline(always)]
        pub fn $name(a: u32, b: u32) -> u32 {
            #[cfg(target_arch = "nvptx64")]
            let d = {
                let d: u32;
                // SAFETY: register arithmetic only.
                unsafe {
                    asm!(concat!($op, " {d}, {a}, {b};"), d = out(reg32) d, a = in(reg32) a, b = in(reg32) b,
                         options(pure, nomem, nostack));
                }
                d
            };
            #[cfg(not(target_arch = "nvptx64"))]
            let d = model::$model(a, b);
            d
        }
    };
}

half2_op!(
    /// `mul.rn.f16x2 d, a, b;` (PTX ISA 4.2, sm_53). `.rn` keeps it from being fused into an fma.
    mul_f16x2, "mul.rn.f16x2", mul_rn_f16x2
);
half2_op!(
    /// `set.gt.f16x2.f16x2 d, a, b;` (PTX ISA 6.5, sm_53): each half 1.0 where `a`'s is greater.
    set_gt_f16x2, "set.gt.f16x2.f16x2", set_gt_f16x2
);
half2_op!(
    /// `set.gt.bf16x2.bf16x2 d, a, b;` (PTX ISA 7.8, sm_90): each half 1.0 where `a`'s is greater.
    set_gt_bf16x2, "set.gt.bf16x2.bf16x2", set_gt_bf16x2
);
half2_op!(
    /// `add.rn.f16x2 d, a, b;` (PTX ISA 4.2, sm_53); `.rn` keeps it out of an fma.
    add_f16x2, "add.rn.f16x2", add_rn_f16x2
);
half2_op!(
    /// `add.rn.bf16x2 d, a, b;` (PTX ISA 7.8, sm_90).
    add_bf16x2, "add.rn.bf16x2", add_rn_bf16x2
);

/// Packs two f32 to f16x2, `lo` in the low half: `cvt.rn.f16x2.f32 d, hi, lo;` (PTX ISA 7.0, sm_80).
#[inline(always)]
pub fn f32x2_to_f16x2(lo: f32, hi: f32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    let d = {
        let d: u32;
        // SAFETY: register arithmetic only.
        unsafe {
            asm!("cvt.rn.f16x2.f32 {d}, {h}, {l};", d = out(reg32) d, h = in(reg32) hi, l = in(reg32) lo,
                 options(pure, nomem, nostack));
        }
        d
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let d = model::cvt_rn_f16x2_f32(hi, lo);
    d
}

/// Packs two f32 to bf16x2, `lo` in the low half: `cvt.rn.bf16x2.f32 d, hi, lo;` (PTX ISA 7.0, sm_80).
#[inline(always)]
pub fn f32x2_to_bf16x2(lo: f32, hi: f32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    let d = {
        let d: u32;
        // SAFETY: register arithmetic only.
        unsafe {
            asm!("cvt.rn.bf16x2.f32 {d}, {h}, {l};", d = out(reg32) d, h = in(reg32) hi, l = in(reg32) lo,
                 options(pure, nomem, nostack));
        }
        d
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let d = model::cvt_rn_bf16x2_f32(hi, lo);
    d
}
