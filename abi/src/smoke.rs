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
