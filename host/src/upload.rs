//! Host NVFP4 matrices ([`nvfp4_format::Nvfp4Matrix`]) on the device.

use crate::error::{Error, Result};
use crate::plan::Nvfp4Operand;
use cudarc::driver::{CudaSlice, CudaStream};
use nvfp4_format::Nvfp4Matrix;
use std::sync::Arc;

/// An NVFP4 matrix copied to the device: packed values and blocked scales.
#[derive(Debug)]
pub struct DeviceNvfp4 {
    /// Packed e2m1 values, `rows · k / 2` bytes.
    pub values: CudaSlice<u8>,
    /// e4m3 scales in the 128x4 blocked layout.
    pub scales: CudaSlice<u8>,
}

impl DeviceNvfp4 {
    /// Copies `m` to the device on `stream` (an empty matrix gets 16-byte placeholders).
    pub fn upload(stream: &Arc<CudaStream>, m: &Nvfp4Matrix) -> Result<DeviceNvfp4> {
        let copy = |bytes: &[u8]| {
            if bytes.is_empty() { stream.alloc_zeros::<u8>(16) } else { stream.clone_htod(bytes) }
                .map_err(|e| Error::driver("copying an NVFP4 matrix to the device", e))
        };
        Ok(DeviceNvfp4 { values: copy(m.values())?, scales: copy(m.scales())? })
    }

    /// The operand view the GEMM takes.
    pub fn operand(&self) -> Nvfp4Operand<'_> {
        Nvfp4Operand { values: &self.values, scales: &self.scales }
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
    /// ([`nvfp4_format::Group::effective_alpha_f32`]).
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
        crate::plan::GroupArgs { a: self.a.operand(), b: self.b.operand(), c, alpha: self.alpha }
    }
}
