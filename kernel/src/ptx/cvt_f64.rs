//! One-rounding conversions from `f64` to the 16-bit float formats (the NVFP4 dequantizer's
//! output: an exact `f64` product rounded once, as the CPU reference does).

#[cfg(not(target_arch = "nvptx64"))]
use super::model::convert as model;
#[cfg(target_arch = "nvptx64")]
use core::arch::asm;

/// `cvt.rn.f16.f64 d, x;` (PTX ISA 1.0, sm_20): round to nearest even, overflow to ±inf,
/// subnormals kept. Returns the f16 bit pattern.
#[inline(always)]
pub fn f64_to_f16_bits(x: f64) -> u16 {
    #[cfg(not(target_arch = "nvptx64"))]
    let d = model::cvt_rn_f16_f64(x);
    #[cfg(target_arch = "nvptx64")]
    let d: u16;
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: register arithmetic only.
    unsafe {
        asm!("cvt.rn.f16.f64 {d}, {x};", d = out(reg16) d, x = in(reg64) x, options(pure, nomem, nostack));
    }
    d
}

/// `cvt.rn.bf16.f64 d, x;` (PTX ISA 7.8, sm_90): round to nearest even, overflow to ±inf,
/// subnormals kept. Returns the bf16 bit pattern.
#[inline(always)]
pub fn f64_to_bf16_bits(x: f64) -> u16 {
    #[cfg(not(target_arch = "nvptx64"))]
    let d = model::cvt_rn_bf16_f64(x);
    #[cfg(target_arch = "nvptx64")]
    let d: u16;
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: register arithmetic only.
    unsafe {
        asm!("cvt.rn.bf16.f64 {d}, {x};", d = out(reg16) d, x = in(reg64) x, options(pure, nomem, nostack));
    }
    d
}

/// `cvt.rz.bf16.f64 d, x;` (PTX ISA 7.8, sm_90): toward zero, subnormals kept. Returns the bf16
/// bit pattern.
#[inline(always)]
pub fn f64_to_bf16_bits_rz(x: f64) -> u16 {
    #[cfg(not(target_arch = "nvptx64"))]
    let d = model::cvt_rz_bf16_f64(x);
    #[cfg(target_arch = "nvptx64")]
    let d: u16;
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: register arithmetic only.
    unsafe {
        asm!("cvt.rz.bf16.f64 {d}, {x};", d = out(reg16) d, x = in(reg64) x, options(pure, nomem, nostack));
    }
    d
}

/// `cvt.rz.f16.f64 d, x;` (PTX ISA 1.0, sm_20): toward zero, subnormals kept. Returns the f16
/// bit pattern.
#[inline(always)]
pub fn f64_to_f16_bits_rz(x: f64) -> u16 {
    #[cfg(not(target_arch = "nvptx64"))]
    let d = model::cvt_rz_f16_f64(x);
    #[cfg(target_arch = "nvptx64")]
    let d: u16;
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: register arithmetic only.
    unsafe {
        asm!("cvt.rz.f16.f64 {d}, {x};", d = out(reg16) d, x = in(reg64) x, options(pure, nomem, nostack));
    }
    d
}

/// `cvt.f32.f16 d, a;`: the f16 bit pattern `a` as `f32`, exactly.
#[inline(always)]
pub fn f16_bits_to_f32(a: u16) -> f32 {
    #[cfg(not(target_arch = "nvptx64"))]
    let d = model::cvt_f32_f16(a);
    #[cfg(target_arch = "nvptx64")]
    let d: f32;
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: register arithmetic only.
    unsafe {
        asm!("cvt.f32.f16 {d}, {a};", d = out(reg32) d, a = in(reg16) a, options(pure, nomem, nostack));
    }
    d
}

/// The 16-bit float `bits` (bf16 when `bf16`, else f16) as `f32`, exactly: a bf16 pattern is the
/// upper half of its f32 pattern.
#[inline(always)]
pub fn half_bits_to_f32(bits: u16, bf16: bool) -> f32 {
    if bf16 {
        f32::from_bits((bits as u32) << 16)
    } else {
        f16_bits_to_f32(bits)
    }
}

/// `nvfp4_gemm_abi::quantize::half_floor` through the rounding conversion toward zero: the
/// largest non-negative 16-bit float at most `t` (positive, finite) and whether it equals `t`;
/// beyond the largest finite value, that value (toward zero rounds a finite magnitude beyond it
/// to it; the minimum keeps it so whatever the conversion gives there).
#[inline(always)]
pub fn half_floor(t: f64, bf16: bool) -> (u16, bool) {
    let (bits, max) = if bf16 { (f64_to_bf16_bits_rz(t), 0x7F7F) } else { (f64_to_f16_bits_rz(t), 0x7BFF) };
    let bits = if bits < max { bits } else { max };
    (bits, half_bits_to_f32(bits, bf16) as f64 == t)
}
