//! TMA tensor maps for the packed FP4 operands, and the coordinates the producers pass.
//!
//! An operand (A: `M x K`, B: `N x K`, both K-major, two e2m1 values per byte) is described to the
//! driver with `CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B`: dimensions count 4-bit values and 16 of
//! them pack into 8 bytes without gaps, so the global memory image is exactly the torch
//! `float4_e2m1fn_x2` tensor ((DRV) `cuTensorMapEncodeTiled`, docs/sm100.md §5).
//!
//! One box is `R` rows x 256 values = `R` x 128 bytes, written with `SWIZZLE_128B`: row `r` fills
//! bytes `[128r, 128r + 128)` and its 16-byte chunk `c` lands at `c ^ (r % 8)`. That is the K-major
//! 128-byte-swizzled image [`super::desc::SmemDescriptor::operand_k_major_sw128`] describes.
//!
//! Two map shapes produce that image ([`Fp4MapLayout`]):
//! - the seed's 3D map (hardware-proven), which needs `K % 256 == 0`;
//! - a 2D map for `K % 256 != 0` (but `K % 64 == 0`), proposed here: the box's K range past the
//!   end of the row is zero-filled, the MMA loop issues only the valid K=64 steps of the last
//!   stage, and `expect_tx` still counts the full box.
//!
//! Where each map parameter comes from: docs/provenance.md §2 (the 3D map's fields are the seed's,
//! except the L2 promotion) and §3, D5 (the 2D map).

use super::divides;

/// FP4 values per box row: 128 bytes, the span of the 128-byte swizzle, and the K of one pipeline
/// stage ([`super::config::TMA_BLOCK_K`]).
pub const BOX_K_VALUES: u32 = 256;

/// Bytes per box row (`BOX_K_VALUES` 4-bit values).
pub const BOX_ROW_BYTES: u32 = BOX_K_VALUES / 2;

/// Largest box extent in any dimension ((DRV): `boxDim[i]` ≤ 256).
pub const MAX_BOX_DIM: u32 = 256;

pub use crate::tensor_map::{
    TensorMapDataType, TensorMapInterleave, TensorMapL2Promotion, TensorMapOobFill, TensorMapSwizzle, L2_PROMOTION,
};

/// Which map shape describes an FP4 operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp4MapLayout {
    /// The seed's map: dims `{256, rows, K/256}`, byte strides `{K/2, 128}`, box `{256, R, 1}`,
    /// coordinates `{0, row0, k0/256}`. Needs `K % 256 == 0`: the third dimension counts whole
    /// 128-byte chunks of a row, so a partial chunk cannot be expressed (rounding up would read
    /// the next row's bytes, and past the buffer for the last row).
    Chunked3d,
    /// Proposed for `K % 256 != 0`: dims `{K, rows}`, byte stride `{K/2}`, box `{256, R}`,
    /// coordinates `{k0, row0}`. Values `K .. k0+256` of the last stage are out of bounds and
    /// zero-filled; the smem image is the same as the 3D map's (⚠ inference, docs/sm100.md §5;
    /// DeepGEMM's sm100 FP4 path uses 2D `16U4_ALIGN8B` maps with a 128-byte inner box).
    /// ⚠ For K < 256 (K = 64, 128) the box is wider than the tensor; the driver's rules do not
    /// forbid it as far as docs/sm100.md records, but it has not run on hardware.
    Flat2d,
}

/// Why an FP4 tensor map cannot be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorMapError {
    /// No rows, or K = 0.
    Empty,
    /// K must be a multiple of 64, one MMA step. That also makes the row stride `K/2` a multiple
    /// of 32 bytes, inside the driver's rule that strides be multiples of 16.
    KNotMultipleOf64,
    /// The 3D map needs `K % 256 == 0`.
    KNotMultipleOf256,
    /// Box rows must be in `1..=256`.
    BoxRows,
}

/// The coordinates of one TMA box load, innermost first, as the PTX
/// `cp.async.bulk.tensor.{2d,3d}` operand `{x, y[, z]}` wants them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TmaCoords {
    /// 2 or 3.
    pub rank: u32,
    /// Coordinates; entries past `rank` are 0.
    pub coords: [i32; 3],
}

/// Everything the host passes to `cuTensorMapEncodeTiled` for one FP4 operand, besides the
/// global address. Entries past `rank` (and past `rank - 1` for strides) are unused and 0.
/// The global address must be 16-byte aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fp4TensorMap {
    /// Which shape this is; decides [`Fp4TensorMap::coords`].
    pub layout: Fp4MapLayout,
    /// `tensorRank`.
    pub rank: u32,
    /// `globalDim`, in 4-bit values for dimension 0 and elements elsewhere, innermost first.
    pub global_dim: [u64; 3],
    /// `globalStrides` in bytes for dimensions 1.. (the driver's `rank - 1` entries).
    pub global_strides: [u64; 2],
    /// `boxDim`, innermost first.
    pub box_dim: [u32; 3],
    /// `elementStrides`: all 1.
    pub element_strides: [u32; 3],
    /// `tensorDataType`: `16U4_ALIGN8B`.
    pub data_type: TensorMapDataType,
    /// `interleave`: `NONE`.
    pub interleave: TensorMapInterleave,
    /// `swizzle`: `128B`.
    pub swizzle: TensorMapSwizzle,
    /// `l2Promotion`: [`L2_PROMOTION`] (256 B; the seed used `NONE`).
    pub l2_promotion: TensorMapL2Promotion,
    /// `oobFill`: `NONE` (zeros).
    pub oob_fill: TensorMapOobFill,
}

const fn check(rows: u32, k: u32, box_rows: u32) -> Result<(), TensorMapError> {
    if rows == 0 || k == 0 {
        return Err(TensorMapError::Empty);
    }
    if !divides(64, k) {
        return Err(TensorMapError::KNotMultipleOf64);
    }
    if box_rows == 0 || box_rows > MAX_BOX_DIM {
        return Err(TensorMapError::BoxRows);
    }
    Ok(())
}

impl Fp4TensorMap {
    /// The seed's 3D map of a `rows x k` FP4 operand with `box_rows`-row boxes (128 for A and
    /// 128-wide B, 256 for 256-wide B). `rows` is the real row count: rows past it are zero-filled
    /// (the seed stopped padding A/B and passes `A_list[i].size(0)`). Every field is the seed's
    /// except the L2 promotion: [`L2_PROMOTION`] where the seed had `NONE`.
    pub const fn chunked_3d(rows: u32, k: u32, box_rows: u32) -> Result<Self, TensorMapError> {
        if let Err(e) = check(rows, k, box_rows) {
            return Err(e);
        }
        if !divides(BOX_K_VALUES, k) {
            return Err(TensorMapError::KNotMultipleOf256);
        }
        Ok(Self {
            layout: Fp4MapLayout::Chunked3d,
            rank: 3,
            global_dim: [BOX_K_VALUES as u64, rows as u64, (k / BOX_K_VALUES) as u64],
            global_strides: [(k / 2) as u64, BOX_ROW_BYTES as u64],
            box_dim: [BOX_K_VALUES, box_rows, 1],
            element_strides: [1, 1, 1],
            data_type: TensorMapDataType::U4x16Align8B,
            interleave: TensorMapInterleave::None,
            swizzle: TensorMapSwizzle::B128,
            l2_promotion: L2_PROMOTION,
            oob_fill: TensorMapOobFill::None,
        })
    }

    /// The proposed 2D map for any `K % 64 == 0` (see [`Fp4MapLayout::Flat2d`]).
    pub const fn flat_2d(rows: u32, k: u32, box_rows: u32) -> Result<Self, TensorMapError> {
        if let Err(e) = check(rows, k, box_rows) {
            return Err(e);
        }
        Ok(Self {
            layout: Fp4MapLayout::Flat2d,
            rank: 2,
            global_dim: [k as u64, rows as u64, 0],
            global_strides: [(k / 2) as u64, 0],
            box_dim: [BOX_K_VALUES, box_rows, 0],
            element_strides: [1, 1, 0],
            data_type: TensorMapDataType::U4x16Align8B,
            interleave: TensorMapInterleave::None,
            swizzle: TensorMapSwizzle::B128,
            l2_promotion: L2_PROMOTION,
            oob_fill: TensorMapOobFill::None,
        })
    }

    /// The seed's 3D map when `K % 256 == 0`, the 2D map otherwise.
    pub const fn for_operand(rows: u32, k: u32, box_rows: u32) -> Result<Self, TensorMapError> {
        if divides(BOX_K_VALUES, k) {
            Self::chunked_3d(rows, k, box_rows)
        } else {
            Self::flat_2d(rows, k, box_rows)
        }
    }

    /// Coordinates of the box whose first row is `row0` and first value is `k0` (a multiple of
    /// 256): `{0, row0, k0/256}` for the 3D map, `{k0, row0}` for the 2D map.
    pub const fn coords(self, row0: u32, k0: u32) -> TmaCoords {
        match self.layout {
            Fp4MapLayout::Chunked3d => TmaCoords { rank: 3, coords: [0, row0 as i32, (k0 / BOX_K_VALUES) as i32] },
            Fp4MapLayout::Flat2d => TmaCoords { rank: 2, coords: [k0 as i32, row0 as i32, 0] },
        }
    }

    /// Bytes one box writes to shared memory, and what `expect_tx` counts for it even when rows
    /// or K values are out of bounds (zero-filled bytes still complete): `box_rows * 128`.
    pub const fn box_bytes(self) -> u32 {
        self.box_dim[1] * BOX_ROW_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_3d_map() {
        // A of benchmark b0: 248 rows, K = 7168, 128-row box.
        let m = Fp4TensorMap::chunked_3d(248, 7168, 128).unwrap();
        assert_eq!(m.rank, 3);
        assert_eq!(m.global_dim, [256, 248, 28]);
        assert_eq!(m.global_strides, [3584, 128]);
        assert_eq!(m.box_dim, [256, 128, 1]);
        assert_eq!(m.element_strides, [1, 1, 1]);
        assert_eq!(m.data_type as u32, 13);
        assert_eq!(m.swizzle as u32, 3);
        assert_eq!(m.interleave as u32, 0);
        assert_eq!(m.l2_promotion, TensorMapL2Promotion::B256);
        assert_eq!(m.oob_fill as u32, 0);
        assert_eq!(m.box_bytes(), 16384);
        // B of b0 with BLOCK_N = 256.
        let b = Fp4TensorMap::chunked_3d(4096, 7168, 256).unwrap();
        assert_eq!(b.box_dim, [256, 256, 1]);
        assert_eq!(b.box_bytes(), 32768);
        // Strides are multiples of 16 bytes, as the driver requires.
        assert_eq!(m.global_strides[0] % 16, 0);
    }

    #[test]
    fn seed_coordinates() {
        let m = Fp4TensorMap::chunked_3d(512, 1024, 128).unwrap();
        assert_eq!(m.coords(384, 768), TmaCoords { rank: 3, coords: [0, 384, 3] });
    }

    /// The element at (row, value) sits at the same byte in both maps: 3D `x + 256*z` ↔ 2D `x`.
    #[test]
    fn both_maps_address_the_same_bytes() {
        let k = 1024;
        let m3 = Fp4TensorMap::chunked_3d(64, k, 128).unwrap();
        let m2 = Fp4TensorMap::flat_2d(64, k, 128).unwrap();
        for row in [0u64, 1, 63] {
            for v in [0u64, 255, 256, 700, 1023] {
                let (x, z) = (v % 256, v / 256);
                let b3 = x / 2 + row * m3.global_strides[0] + z * m3.global_strides[1];
                let b2 = v / 2 + row * m2.global_strides[0];
                assert_eq!(b3, b2);
            }
        }
        for k0 in (0..k).step_by(256) {
            let c3 = m3.coords(128, k0);
            let c2 = m2.coords(128, k0);
            assert_eq!(c3.coords[0] + 256 * c3.coords[2], c2.coords[0]);
            assert_eq!(c3.coords[1], c2.coords[1]);
        }
    }

    #[test]
    fn k_tail_uses_2d_map() {
        let m = Fp4TensorMap::for_operand(72, 384, 128).unwrap();
        assert_eq!(m.layout, Fp4MapLayout::Flat2d);
        assert_eq!(m.rank, 2);
        assert_eq!(m.global_dim[..2], [384, 72]);
        assert_eq!(m.global_strides[0], 192);
        assert_eq!(m.box_dim[..2], [256, 128]);
        assert_eq!(m.coords(0, 256), TmaCoords { rank: 2, coords: [256, 0, 0] });
        // The box still writes (and expect_tx still counts) 128 rows of 128 bytes.
        assert_eq!(m.box_bytes(), 16384);
        assert_eq!(Fp4TensorMap::for_operand(72, 512, 128).unwrap().layout, Fp4MapLayout::Chunked3d);
    }

    #[test]
    fn rejections() {
        assert_eq!(Fp4TensorMap::chunked_3d(1, 384, 128), Err(TensorMapError::KNotMultipleOf256));
        assert_eq!(Fp4TensorMap::for_operand(1, 96, 128), Err(TensorMapError::KNotMultipleOf64));
        assert_eq!(Fp4TensorMap::for_operand(0, 256, 128), Err(TensorMapError::Empty));
        assert_eq!(Fp4TensorMap::for_operand(1, 0, 128), Err(TensorMapError::Empty));
        assert_eq!(Fp4TensorMap::for_operand(1, 256, 0), Err(TensorMapError::BoxRows));
        assert_eq!(Fp4TensorMap::for_operand(1, 256, 257), Err(TensorMapError::BoxRows));
    }
}
