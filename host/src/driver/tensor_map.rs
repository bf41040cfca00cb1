//! Tensor maps (`CUtensorMap`) for the TMA, encoded with `cuTensorMapEncodeTiled`.

use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::mem::MaybeUninit;

/// The 128-byte opaque tensor map, as the kernels read it from global memory.
#[derive(Clone, Copy)]
#[repr(C, align(128))]
pub struct TensorMap(pub [u8; 128]);

impl std::fmt::Debug for TensorMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TensorMap(..)")
    }
}

/// Element type of a tensor map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Element {
    /// Bytes (packed FP4 on sm_90, e4m3 scales).
    U8,
    /// 16-bit floats.
    F16,
    /// Packed FP4, 16 values per 8 bytes (sm_100 tcgen05 operands).
    U4x16Align8,
}

/// Shared-memory swizzle applied by the copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swizzle {
    /// Rows land densely.
    None,
    /// 16-byte chunk `c` of each 64-byte row `r` lands at chunk `c ^ ((r / 2) % 4)`.
    B64,
    /// 16-byte chunk `c` of each 128-byte row `r` lands at chunk `c ^ (r % 8)`.
    B128,
}

/// A 2D or 3D tiled map: `dims[0]` is the innermost dimension (elements), `strides_bytes[i]` the
/// byte stride of dimension `i + 1`, `box_dims` the tile copied per instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TiledMap<const R: usize> {
    /// Element type.
    pub element: Element,
    /// Extent of each dimension, innermost first.
    pub dims: [u64; R],
    /// Byte stride of dimensions 1..R.
    pub strides_bytes: [u64; R],
    /// Box extent per dimension.
    pub box_dims: [u32; R],
    /// Swizzle mode.
    pub swizzle: Swizzle,
}

impl<const R: usize> TiledMap<R> {
    /// Encodes the map for the tensor at device address `base`. Out-of-bounds elements read as zero.
    pub fn encode(&self, base: u64) -> Result<TensorMap> {
        let dtype = match self.element {
            Element::U8 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            Element::F16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            Element::U4x16Align8 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B,
        };
        let swizzle = match self.swizzle {
            Swizzle::None => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
            Swizzle::B64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
            Swizzle::B128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        };
        let elem_strides = [1u32; R];
        let mut map = MaybeUninit::<sys::CUtensorMap>::zeroed();
        // SAFETY: every array has R entries (strides: R-1 are read); the driver validates values.
        let r = unsafe {
            sys::cuTensorMapEncodeTiled(
                map.as_mut_ptr(),
                dtype,
                R as u32,
                base as *mut std::ffi::c_void,
                self.dims.as_ptr(),
                self.strides_bytes.as_ptr(),
                self.box_dims.as_ptr(),
                elem_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        r.result().map_err(|e| Error::driver("encoding a tensor map", format!("{e} for {self:?} at {base:#x}")))?;
        // SAFETY: CUtensorMap is 128 plain bytes, initialised by the driver.
        Ok(TensorMap(unsafe { std::mem::transmute::<sys::CUtensorMap, [u8; 128]>(map.assume_init()) }))
    }
}
