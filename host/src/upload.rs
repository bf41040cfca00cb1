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
