//! Host NVFP4 matrices ([`nvfp4_format::Nvfp4Matrix`]) on the device.

use crate::error::{Error, Result};
use crate::plan::{GroupArgs, Nvfp4Operand, Output};
use cudarc::driver::{CudaSlice, CudaStream};
use nvfp4_format::Nvfp4Matrix;
use std::sync::Arc;

/// An NVFP4 tensor on the device: packed values, blocked scales and its global scale.
#[derive(Debug)]
pub struct DeviceNvfp4 {
    /// Packed e2m1 values, `rows · k / 2` bytes.
    pub values: CudaSlice<u8>,
    /// e4m3 scales in the 128x4 blocked layout.
    pub scales: CudaSlice<u8>,
    /// The tensor's second-level (per-tensor) scale `g`: element `= e2m1 · e4m3 · g`. A GEMM on
    /// two such tensors multiplies by `g_a · g_b` ([`crate::GroupArgs::new`] sets that alpha). 1
    /// for a tensor allocated zeroed; set it to the scale a [`crate::quantize::Quantizer`]
    /// quantized with.
    pub global_scale: f32,
}

impl DeviceNvfp4 {
    /// Copies `m` to the device on `stream`, with its global scale (an empty matrix gets 16-byte
    /// placeholders).
    pub fn upload(stream: &Arc<CudaStream>, m: &Nvfp4Matrix) -> Result<DeviceNvfp4> {
        let copy = |bytes: &[u8]| {
            if bytes.is_empty() { stream.alloc_zeros::<u8>(16) } else { stream.clone_htod(bytes) }
                .map_err(|e| Error::driver("copying an NVFP4 matrix to the device", e))
        };
        Ok(DeviceNvfp4 { values: copy(m.values())?, scales: copy(m.scales())?, global_scale: m.global_scale() })
    }

    /// The operand view the GEMM takes.
    pub fn operand(&self) -> Nvfp4Operand<'_> {
        Nvfp4Operand { values: &self.values, scales: &self.scales }
    }
}

impl<'a> GroupArgs<'a> {
    /// The arguments for operands `a` and `b` and output `c`, with `alpha = g_a · g_b`, the
    /// operands' global scales ([`DeviceNvfp4::global_scale`]; computed in `f64` and rounded
    /// once, as [`nvfp4_format::Group::effective_alpha_f32`] does): what quantized inputs need.
    /// Multiply `alpha` by any scale of the layer's own.
    pub fn new(a: &'a DeviceNvfp4, b: &'a DeviceNvfp4, c: Output<'a>) -> GroupArgs<'a> {
        let alpha = (f64::from(a.global_scale) * f64::from(b.global_scale)) as f32;
        GroupArgs { a: a.operand().into(), b: b.operand(), c, alpha }
    }
}

/// Both operands of one host group ([`nvfp4_format::Group`]) on the device.
#[derive(Debug)]
pub struct DeviceGroup {
    /// A (`m × k`).
    pub a: DeviceNvfp4,
    /// B (`n × k`).
    pub b: DeviceNvfp4,
    /// The group's alpha including the operands' global scales
    /// ([`nvfp4_format::Group::effective_alpha_f32`]: the group's own alpha times `g_a · g_b`).
    pub alpha: f32,
}

impl DeviceGroup {
    /// Copies both operands of `g` to the device on `stream`.
    pub fn upload(stream: &Arc<CudaStream>, g: &nvfp4_format::Group) -> Result<DeviceGroup> {
        Ok(DeviceGroup {
            a: DeviceNvfp4::upload(stream, &g.a)?,
            b: DeviceNvfp4::upload(stream, &g.b)?,
            alpha: g.effective_alpha_f32(),
        })
    }

    /// The call arguments for this group with output `c`.
    pub fn args<'a>(&'a self, c: crate::plan::Output<'a>) -> crate::plan::GroupArgs<'a> {
        crate::plan::GroupArgs { a: self.a.operand().into(), b: self.b.operand(), c, alpha: self.alpha }
    }
}
