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
