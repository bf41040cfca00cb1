//! Exact conversions between the NVFP4 storage formats and f16/bf16/f32, on sm_90+.
//!
//! Every e2m1 × e4m3 product is exact in f16 (≤ 6 significant bits, magnitudes in [2^-10, 2688]),
//! so dequantizing to f16 and multiplying by the block scale with `mul.rn.f16x2` loses nothing.

#[cfg(not(target_arch = "nvptx64"))]
use super::model::convert as model;
#[cfg(target_arch = "nvptx64")]
use core::arch::asm;

/// Decodes eight e2m1 values (the nibbles of `q`, element 0 in the low nibble) to four f16x2 words
/// `[e0|e1, e2|e3, e4|e5, e6|e7]` (lower element in the low half).
///
/// Two `prmt` table lookups per four values: byte table `L` holds the high bytes of the f16 codes of
/// the magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 (`0x00 38 3C 3E 40 42 44 46`); the sign is or-ed in from a
/// second table indexed by (sign, top exponent bit). The f16 low bytes are always zero. `prmt`
/// (PTX ISA 2.0) uses a selector nibble's 3 low bits as the byte index.
#[inline(always)]
pub fn e2m1x8_to_f16x2(q: u32) -> [u32; 4] {
    #[cfg(target_arch = "nvptx64")]
    let (o0, o1, o2, o3) = {
        let (o0, o1, o2, o3): (u32, u32, u32, u32);
        // SAFETY: register arithmetic only.
        unsafe {
            asm!(
                "{{",
                ".reg .b32 m, x, s, t;",
                // elements 0..3
                "and.b32 m, {q}, 0x7777;",
                "prmt.b32 x, {llo}, {lhi}, m;",
                "shr.u32 t, {q}, 2;",
                "and.b32 t, t, 0x3333;",
                "prmt.b32 s, {u}, {u}, t;",
                "or.b32 x, x, s;",
                "prmt.b32 {o0}, x, {u}, 0x1404;",
                "prmt.b32 {o1}, x, {u}, 0x3424;",
                // elements 4..7
                "shr.u32 m, {q}, 16;",
                "and.b32 m, m, 0x7777;",
                "prmt.b32 x, {llo}, {lhi}, m;",
                "shr.u32 t, {q}, 18;",
                "and.b32 t, t, 0x3333;",
                "prmt.b32 s, {u}, {u}, t;",
                "or.b32 x, x, s;",
                "prmt.b32 {o2}, x, {u}, 0x1404;",
                "prmt.b32 {o3}, x, {u}, 0x3424;",
                "}}",
                q = in(reg32) q, llo = in(reg32) 0x3E3C_3800u32, lhi = in(reg32) 0x4644_4240u32,
                u = in(reg32) 0xC080_4000u32,
                o0 = out(reg32) o0, o1 = out(reg32) o1, o2 = out(reg32) o2, o3 = out(reg32) o3,
                options(pure, nomem, nostack));
        }
        (o0, o1, o2, o3)
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let [o0, o1, o2, o3] = host_e2m1x8_to_f16x2(q);
    [o0, o1, o2, o3]
}

/// The e4m3 byte `q` (0..4) of `w`, converted to f16 and broadcast to both halves of an f16x2.
///
/// `prmt` puts the byte twice in the low half-word, then `cvt.rn.f16x2.e4m3x2` (PTX ISA 7.8, sm_89)
/// converts both; every finite e4m3 value is exact in f16, 0x7F/0xFF give NaN.
#[inline(always)]
pub fn e4m3_byte_to_f16x2(w: u32, q: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    let d = {
        let d: u32;
        // SAFETY: register arithmetic only.
        unsafe {
            asm!(
                "{{",
                ".reg .b32 t;",
                ".reg .b16 h;",
                "prmt.b32 t, {w}, 0, {sel};",
                "cvt.u16.u32 h, t;",
                "cvt.rn.f16x2.e4m3x2 {d}, h;",
                "}}",
                w = in(reg32) w, sel = in(reg32) q | (q << 4), d = out(reg32) d, options(pure, nomem, nostack));
        }
        d
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let d = {
        let t = model::prmt(w, 0, q | (q << 4));
        model::cvt_f16x2_e4m3x2(t as u16)
    };
    d
}

/// `mul.rn.f16x2 d, a, b;` (PTX ISA 4.2, sm_53). `.rn` keeps it from being fused into an fma.
#[inline(always)]
pub fn mul_f16x2(a: u32, b: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    let d = {
        let d: u32;
        // SAFETY: register arithmetic only.
        unsafe {
            asm!("mul.rn.f16x2 {d}, {a}, {b};", d = out(reg32) d, a = in(reg32) a, b = in(reg32) b,
                 options(pure, nomem, nostack));
        }
        d
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let d = model::mul_rn_f16x2(a, b);
    d
}

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

/// The host side of [`e2m1x8_to_f16x2`]: the same instruction sequence, each `prmt` the model's.
#[cfg(not(target_arch = "nvptx64"))]
fn host_e2m1x8_to_f16x2(q: u32) -> [u32; 4] {
    let (llo, lhi, u) = (0x3E3C_3800u32, 0x4644_4240u32, 0xC080_4000u32);
    let half = |q: u32| {
        let x = model::prmt(llo, lhi, q & 0x7777);
        let s = model::prmt(u, u, (q >> 2) & 0x3333);
        let x = x | s;
        (model::prmt(x, u, 0x1404), model::prmt(x, u, 0x3424))
    };
    let (o0, o1) = half(q);
    let (o2, o3) = half(q >> 16);
    [o0, o1, o2, o3]
}
