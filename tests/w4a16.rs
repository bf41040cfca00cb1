//! The W4A16 GPU tests' activation types: f16 and bf16, each with its `Activations` and the
//! exact 16-bit values of an NVFP4 matrix with its block scales applied (what the tests feed as
//! activations, so that the NVFP4 fp64 reference applies).

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use half::{bf16, f16};
use nvfp4_format::Nvfp4Matrix;
use nvfp4_gemm::quantize::DenseFloat;
use nvfp4_gemm::w4a16::Activations;

/// A W4A16 activation type.
pub trait Activation16: DenseFloat + DeviceRepr + ValidAsZeroBits + Unpin + std::fmt::Debug {
    /// The plan's activations for it.
    const KIND: Activations;
    /// NaN of this type.
    const NAN: Self;
    /// `m`'s elements with their block scales applied (no global scale), exact.
    fn block_scaled(m: &Nvfp4Matrix) -> Vec<Self>;
}

impl Activation16 for f16 {
    const KIND: Activations = Activations::F16;
    const NAN: f16 = f16::NAN;
    fn block_scaled(m: &Nvfp4Matrix) -> Vec<f16> {
        m.dequantize_block_scaled_f16()
    }
}

impl Activation16 for bf16 {
    const KIND: Activations = Activations::Bf16;
    const NAN: bf16 = bf16::NAN;
    fn block_scaled(m: &Nvfp4Matrix) -> Vec<bf16> {
        m.dequantize_block_scaled_bf16()
    }
}
