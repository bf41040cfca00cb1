//! TMA tensor maps as both sides see them: the 128-byte `CUtensorMap` the kernels read from the
//! tensor-map table, and the parameters the host passes to `cuTensorMapEncodeTiled` for it.
//!
//! The enums carry cuda.h's values (`CUtensorMapDataType`, `CUtensorMapSwizzle`, ...); the host
//! converts them to cudarc's enums by name.

/// Bytes of one tensor map (`sizeof(CUtensorMap)`, also its alignment).
pub const TENSOR_MAP_BYTES: usize = 128;

/// The opaque 128-byte `CUtensorMap` as it lies in the tensor-map table in global memory
/// (128-byte aligned). Written by the host's encoder, read by the TMA through a generic pointer.
#[derive(Clone, Copy, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(128))]
pub struct TensorMap(pub [u8; TENSOR_MAP_BYTES]);

const _: () = assert!(core::mem::size_of::<TensorMap>() == TENSOR_MAP_BYTES);

impl TensorMap {
    /// All zeros: the entry of a group no tile reads.
    pub const ZERO: TensorMap = TensorMap([0; TENSOR_MAP_BYTES]);
}

impl core::fmt::Debug for TensorMap {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("TensorMap(..)")
    }
}

/// `CUtensorMapDataType` values this crate uses (cuda.h `CUtensorMapDataType_enum`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum TensorMapDataType {
    /// `CU_TENSOR_MAP_DATA_TYPE_UINT8` = 0: bytes (packed FP4 on sm_90, the diagnostic kernels' tiles).
    U8 = 0,
    /// `CU_TENSOR_MAP_DATA_TYPE_FLOAT16` = 6: the f16 token workspace on sm_90.
    F16 = 6,
    /// `CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B` = 13: 16 packed 4-bit values per 8 bytes (the
    /// sm_100 tcgen05 operands). The host encodes cudarc's named constant, not this number.
    U4x16Align8B = 13,
}

/// `CUtensorMapSwizzle` values (cuda.h): how the copy scatters each box row's 16-byte chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum TensorMapSwizzle {
    /// `CU_TENSOR_MAP_SWIZZLE_NONE`: rows land densely.
    None = 0,
    /// `CU_TENSOR_MAP_SWIZZLE_32B`.
    B32 = 1,
    /// `CU_TENSOR_MAP_SWIZZLE_64B`: chunk `c` of 64-byte row `r` lands at `c ^ ((r / 2) % 4)`.
    B64 = 2,
    /// `CU_TENSOR_MAP_SWIZZLE_128B`: chunk `c` of 128-byte row `r` lands at `c ^ (r % 8)`.
    B128 = 3,
}

/// `CUtensorMapInterleave` values (cuda.h); every map here uses `NONE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum TensorMapInterleave {
    /// `CU_TENSOR_MAP_INTERLEAVE_NONE`.
    None = 0,
}

/// `CUtensorMapL2promotion` values (cuda.h): how far the TMA widens its L2 requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum TensorMapL2Promotion {
    /// `CU_TENSOR_MAP_L2_PROMOTION_NONE`.
    None = 0,
    /// `CU_TENSOR_MAP_L2_PROMOTION_L2_128B`.
    B128 = 2,
    /// `CU_TENSOR_MAP_L2_PROMOTION_L2_256B`.
    B256 = 3,
}

/// The L2 promotion of every map this library encodes (both architectures; the diagnostic kernels' too):
/// 256-byte requests, the value the host has always passed (every measurement in
/// `bench/results/` ran with it).
pub const L2_PROMOTION: TensorMapL2Promotion = TensorMapL2Promotion::B256;

/// `CUtensorMapFloatOOBfill` values (cuda.h). `NONE` fills out-of-bounds elements with zeros,
/// which is what makes partial row tiles and the K tail contribute nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum TensorMapOobFill {
    /// `CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE`: zeros.
    None = 0,
}

/// A tiled tensor map of rank `R`, everything `cuTensorMapEncodeTiled` takes besides the global
/// address: `dims[0]` is the innermost dimension (elements), `strides_bytes[i]` the byte stride of
/// dimension `i + 1` (the last entry is unused), `box_dims` the tile one copy moves. Element
/// strides are all 1, interleave `NONE`, out-of-bounds fill zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TiledMap<const R: usize> {
    /// Element type.
    pub element: TensorMapDataType,
    /// Extent of each dimension, innermost first.
    pub dims: [u64; R],
    /// Byte stride of dimensions 1..R (entry `R - 1` unused, 0).
    pub strides_bytes: [u64; R],
    /// Box extent per dimension.
    pub box_dims: [u32; R],
    /// Shared-memory swizzle of the box.
    pub swizzle: TensorMapSwizzle,
    /// L2 promotion ([`L2_PROMOTION`] for every map here).
    pub l2_promotion: TensorMapL2Promotion,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cuda.h's enum values, which the host maps to cudarc's constants.
    #[test]
    fn cuda_h_values() {
        assert_eq!(TensorMapDataType::F16 as u32, 6);
        assert_eq!(TensorMapDataType::U4x16Align8B as u32, 13);
        assert_eq!(TensorMapSwizzle::B64 as u32, 2);
        assert_eq!(TensorMapSwizzle::B128 as u32, 3);
        assert_eq!(TensorMapL2Promotion::B256 as u32, 3);
        assert_eq!(L2_PROMOTION, TensorMapL2Promotion::B256);
        assert_eq!(core::mem::align_of::<TensorMap>(), 128);
        assert_eq!(bytemuck::bytes_of(&TensorMap::ZERO).len(), 128);
    }
}
