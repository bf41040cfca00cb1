//! Parameters of the end-to-end smoke kernels (`smoke_*`), which prove the toolchain on hardware.

/// Shape of the smoke TMA tile: a `SMOKE_TMA_ROWS x SMOKE_TMA_COLS` box of bytes.
pub const SMOKE_TMA_ROWS: u32 = 64;
/// Inner (contiguous) box extent in bytes; 128 so that the 128-byte swizzle applies.
pub const SMOKE_TMA_COLS: u32 = 128;
/// Threads per smoke CTA.
pub const SMOKE_THREADS: u32 = 128;
/// CTAs per cluster in the smoke launch.
pub const SMOKE_CLUSTER: u32 = 2;
/// Dynamic shared memory of the smoke kernel: one mbarrier slot (1024 B, to keep the tile
/// 1024-aligned) plus the tile.
pub const SMOKE_SMEM_BYTES: u32 = 1024 + SMOKE_TMA_ROWS * SMOKE_TMA_COLS;
/// Words each thread writes to the smoke output: cluster rank, peer-arrival ok, tile checksum.
pub const SMOKE_WORDS_PER_THREAD: u32 = 4;

use nvfp4_gemm_abi::launch::LaunchGeometry;

/// The parameter of `smoke_tma_cluster`, by value: three device addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct SmokeParams {
    /// The tile's tensor map ([`tile_map`]), 128-byte aligned.
    pub map: u64,
    /// Output: the tile copied back, unswizzled (same shape as the input).
    pub tile_out: u64,
    /// Output: [`SMOKE_WORDS_PER_THREAD`] words per thread.
    pub words: u64,
}
use nvfp4_gemm_abi::tensor_map::{TensorMapDataType, TensorMapSwizzle, TiledMap, L2_PROMOTION};

/// CTAs of the smoke launch: two clusters.
pub const SMOKE_CTAS: u32 = 2 * SMOKE_CLUSTER;

/// The smoke launch: [`SMOKE_CTAS`] CTAs of [`SMOKE_THREADS`] in clusters of [`SMOKE_CLUSTER`].
pub const fn launch() -> LaunchGeometry {
    LaunchGeometry { grid: SMOKE_CTAS, block: SMOKE_THREADS, cluster: SMOKE_CLUSTER, smem_bytes: SMOKE_SMEM_BYTES }
}

/// The smoke tile's map: `SMOKE_CTAS * SMOKE_TMA_ROWS` rows of `SMOKE_TMA_COLS` bytes, one
/// `SMOKE_TMA_ROWS`-row box per CTA, 128-byte swizzle.
pub const fn tile_map() -> TiledMap<2> {
    let rows = SMOKE_CTAS * SMOKE_TMA_ROWS;
    TiledMap {
        element: TensorMapDataType::U8,
        dims: [SMOKE_TMA_COLS as u64, rows as u64],
        strides_bytes: [SMOKE_TMA_COLS as u64, 0],
        box_dims: [SMOKE_TMA_COLS, SMOKE_TMA_ROWS],
        swizzle: TensorMapSwizzle::B128,
        l2_promotion: L2_PROMOTION,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_and_map() {
        assert_eq!(launch(), LaunchGeometry { grid: 4, block: 128, cluster: 2, smem_bytes: 1024 + 8192 });
        assert_eq!(tile_map().dims, [128, 256]);
        assert_eq!(tile_map().box_dims, [128, 64]);
    }
}
