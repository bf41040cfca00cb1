//! Tensor maps (`CUtensorMap`) for the TMA, encoded with `cuTensorMapEncodeTiled` from the abi's
//! description ([`TiledMap`]): every field, L2 promotion included, comes from there.

use crate::error::{Error, Result};
use cudarc::driver::sys;
use nvfp4_gemm_abi::tensor_map::{TensorMap, TensorMapDataType, TensorMapL2Promotion, TensorMapSwizzle, TiledMap};
use std::mem::MaybeUninit;

fn data_type(t: TensorMapDataType) -> sys::CUtensorMapDataType {
    match t {
        TensorMapDataType::U8 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        TensorMapDataType::F16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        TensorMapDataType::U4x16Align8B => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B,
    }
}

fn swizzle(s: TensorMapSwizzle) -> sys::CUtensorMapSwizzle {
    match s {
        TensorMapSwizzle::None => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
        TensorMapSwizzle::B32 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
        TensorMapSwizzle::B64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
        TensorMapSwizzle::B128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
    }
}

fn l2_promotion(p: TensorMapL2Promotion) -> sys::CUtensorMapL2promotion {
    match p {
        TensorMapL2Promotion::None => sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_NONE,
        TensorMapL2Promotion::B128 => sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        TensorMapL2Promotion::B256 => sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
    }
}

/// What turns a map description into the 128-byte tensor map the kernels read: the driver
/// ([`DriverEncoder`], what the library uses), or a stand-in such as the CPU model of the device's
/// encoder (the model tests plan problems with the library's layout code and encode its maps there).
pub trait TiledMapEncoder {
    /// Encodes `map` for the tensor at address `base`; out-of-bounds elements read as zero.
    fn encode<const R: usize>(&self, map: &TiledMap<R>, base: u64) -> Result<TensorMap>;

    /// Replaces the global address of `map` (encoded by this encoder) with `base`, leaving the
    /// rest as encoded: `cuTensorMapReplaceAddress`, a fraction of a full encode's cost.
    fn replace_address(&self, map: &mut TensorMap, base: u64) -> Result<()>;
}

/// `cuTensorMapEncodeTiled` ([`encode`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct DriverEncoder;

impl TiledMapEncoder for DriverEncoder {
    fn encode<const R: usize>(&self, map: &TiledMap<R>, base: u64) -> Result<TensorMap> {
        encode(map, base)
    }

    fn replace_address(&self, map: &mut TensorMap, base: u64) -> Result<()> {
        // `CUtensorMap` is the same 128 bytes (64-byte aligned; ours are 128-byte aligned).
        let raw = (map as *mut TensorMap).cast::<sys::CUtensorMap>();
        // SAFETY: `raw` points at 128 bytes the driver encoded, aligned for `CUtensorMap`.
        unsafe { sys::cuTensorMapReplaceAddress(raw, base as *mut std::ffi::c_void) }
            .result()
            .map_err(|e| Error::driver_detail("replacing a tensor map's address", e, format!("{base:#x}")))
    }
}

/// Encodes `map` for the tensor at device address `base`. Out-of-bounds elements read as zero.
pub fn encode<const R: usize>(map: &TiledMap<R>, base: u64) -> Result<TensorMap> {
    let elem_strides = [1u32; R];
    let mut out = MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: every array has R entries (strides: R-1 are read); the driver validates values.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            out.as_mut_ptr(),
            data_type(map.element),
            R as u32,
            base as *mut std::ffi::c_void,
            map.dims.as_ptr(),
            map.strides_bytes.as_ptr(),
            map.box_dims.as_ptr(),
            elem_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle(map.swizzle),
            l2_promotion(map.l2_promotion),
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    r.result().map_err(|e| Error::driver_detail("encoding a tensor map", e, format!("{map:?} at {base:#x}")))?;
    // SAFETY: CUtensorMap is 128 plain bytes, initialised by the driver.
    Ok(TensorMap(unsafe { std::mem::transmute::<sys::CUtensorMap, [u8; 128]>(out.assume_init()) }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvfp4_gemm_abi::tensor_map::L2_PROMOTION;

    /// The abi's values reach the driver's enums unchanged (cuda.h numbering on both sides).
    #[test]
    fn enums_pass_through() {
        assert_eq!(l2_promotion(L2_PROMOTION), sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
        for p in [TensorMapL2Promotion::None, TensorMapL2Promotion::B128, TensorMapL2Promotion::B256] {
            assert_eq!(l2_promotion(p) as u32, p as u32);
        }
        for s in [TensorMapSwizzle::None, TensorMapSwizzle::B32, TensorMapSwizzle::B64, TensorMapSwizzle::B128] {
            assert_eq!(swizzle(s) as u32, s as u32);
        }
        for t in [TensorMapDataType::U8, TensorMapDataType::F16, TensorMapDataType::U4x16Align8B] {
            assert_eq!(data_type(t) as u32, t as u32);
        }
    }
}
