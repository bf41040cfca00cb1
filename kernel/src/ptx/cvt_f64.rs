//! One-rounding conversions from `f64` to the 16-bit float formats (the NVFP4 dequantizer's
//! output: an exact `f64` product rounded once, as the CPU reference does).

#[cfg(not(target_arch = "nvptx64"))]
use super::model::convert as model;
#[cfg(target_arch = "nvptx64")]
use core::arch::asm;

/// One conversion `$op d, x;` from a `$from` register (`$from_reg`) to a `$to` one, or its model
/// on the host.
macro_rules! conversion {
    ($(#[$doc:meta])* $name:ident($from:ty, $from_reg:ident) -> $to:ty, $to_reg:ident, $op:literal, $model:ident) => {
        $(#[$doc])*
        #[inline(always)]
        pub fn $name(x: $from) -> $to {
            #[cfg(not(target_arch = "nvptx64"))]
            let d = model::$model(x);
            #[cfg(target_arch = "nvptx64")]
            let d: $to;
            #[cfg(target_arch = "nvptx64")]
            // SAFETY: register arithmetic only.
            unsafe {
                asm!(concat!($op, " {d}, {x};"), d = out($to_reg) d, x = in($from_reg) x, options(pure, nomem, nostack));
            }
            d
        }
    };
}

conversion!(
    /// `cvt.rn.f16.f64 d, x;` (PTX ISA 1.0, sm_20): round to nearest even, overflow to ±inf,
    /// subnormals kept. Returns the f16 bit pattern.
    f64_to_f16_bits(f64, reg64) -> u16, reg16, "cvt.rn.f16.f64", cvt_rn_f16_f64
);
conversion!(
    /// `cvt.rn.bf16.f64 d, x;` (PTX ISA 7.8, sm_90): round to nearest even, overflow to ±inf,
    /// subnormals kept. Returns the bf16 bit pattern.
    f64_to_bf16_bits(f64, reg64) -> u16, reg16, "cvt.rn.bf16.f64", cvt_rn_bf16_f64
);
conversion!(
    /// `cvt.rz.bf16.f64 d, x;` (PTX ISA 7.8, sm_90): toward zero, subnormals kept. Returns the
    /// bf16 bit pattern.
    f64_to_bf16_bits_rz(f64, reg64) -> u16, reg16, "cvt.rz.bf16.f64", cvt_rz_bf16_f64
);
conversion!(
    /// `cvt.rz.f16.f64 d, x;` (PTX ISA 1.0, sm_20): toward zero, subnormals kept. Returns the f16
    /// bit pattern.
    f64_to_f16_bits_rz(f64, reg64) -> u16, reg16, "cvt.rz.f16.f64", cvt_rz_f16_f64
);
conversion!(
    /// `cvt.f32.f16 d, a;`: the f16 bit pattern `a` as `f32`, exactly.
    f16_bits_to_f32(u16, reg16) -> f32, reg32, "cvt.f32.f16", cvt_f32_f16
);

/// The 16-bit float `bits` (bf16 when `bf16`, else f16) as `f32`, exactly: a bf16 pattern is the
/// upper half of its f32 pattern, an f16 widens with [`f16_bits_to_f32`]. The same values as
/// `nvfp4_gemm_abi::moe_block::half_bits_to_f32` (integer arithmetic, which the routing and combine
/// kernels and the CPU use) in one instruction for f16; `model-tests/tests/kernel_decoders.rs`
/// compares them on every pattern.
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
