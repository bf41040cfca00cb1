//! sm_90a (Hopper) kernels: configuration, parameters, and the encodings they rely on.
//!
//! Hopper has no FP4 tensor-core input, so the exact route is: dequantize both operands to f16 with
//! the block scale applied (exact: ≤ 6 significant bits), multiply with `wgmma` f16·f16→f32, apply
//! alpha in the epilogue. The kernel is *swap-AB*: it computes `C_gᵀ = B_g · A_gᵀ`, so weights (N)
//! fill wgmma's M = 64 slot and tokens (M_g, often small) become wgmma's N.
//!
//! One launch per call, `sm90_grouped_gemm`: a persistent, warp-specialized kernel. Per stage of
//! 256 K values a producer thread loads (TMA, completing on an mbarrier) the packed FP4 token tile,
//! the packed weight tile and both operands' scale blocks. The consumer warpgroups then
//! - decode the token tile to f16 (scale applied, exact) into a 128-byte-swizzled shared buffer,
//!   with K permuted inside each 64-wide chunk (see [`token_k_position`]), the layout wgmma reads
//!   as its B operand;
//! - decode their weight rows straight into wgmma A fragments in registers;
//! - run `wgmma m64n64k16` chunk by chunk.
//!
//! Tokens travel as FP4 (0.5 byte per value) rather than as f16: a first version that decoded them
//! once into an f16 workspace moved 4x the token bytes through L2 and was bound by it (PERF.md).
//!
//! The K permutation makes each thread's A fragment 16 consecutive FP4 values of one row — one scale
//! block, one 8-byte shared-memory load, one scale — at the price of storing the tokens permuted
//! identically. A dot product does not depend on the order of its terms (up to fp32 rounding, which
//! the MMA's own summation order already leaves unspecified).

/// Weight rows (N) per CTA tile: two consumer warpgroups of 64 rows (wgmma M = 64) each.
pub const BLOCK_N: u32 = 128;
/// Weight rows per consumer warpgroup.
pub const WG_ROWS: u32 = 64;
/// Consumer warpgroups per CTA.
pub const CONSUMER_WARPGROUPS: u32 = BLOCK_N / WG_ROWS;
/// K values per pipeline stage: one 128-byte row of packed weights (the 128-byte swizzle limit).
pub const BLOCK_K: u32 = 256;
/// K values per chunk: one 128-byte row of f16 tokens, one 512-byte scale block, 4 wgmma k-steps.
pub const CHUNK_K: u32 = 64;
/// Chunks per stage.
pub const CHUNKS_PER_STAGE: u32 = BLOCK_K / CHUNK_K;
/// Threads per CTA: one producer warpgroup and the consumer warpgroups.
pub const THREADS: u32 = 128 * (1 + CONSUMER_WARPGROUPS);
/// Register cap per thread given to ptxas for the sm_90a module (65536 / 384, rounded down to 8).
pub const MAX_REGISTERS: u32 = 168;
/// Shared memory a CTA may use at most on sm_90 (227 KiB).
pub const SMEM_LIMIT: u32 = 232_448;

/// Shared f16 token buffers: a buffer written at stage `s` was last read by the MMAs of stage
/// `s - 3`, which both consumer warpgroups have finished before either can pass the barrier of
/// stage `s - 1` (each has at most its current chunk's MMAs in flight at that barrier).
pub const TOKEN_BUFFERS: u32 = 3;
/// Named barrier (besides 0) that joins the two consumer warpgroups once per stage.
pub const CONSUMER_BARRIER: u32 = 1;
/// Threads that meet at [`CONSUMER_BARRIER`].
pub const CONSUMER_THREADS: u32 = 128 * CONSUMER_WARPGROUPS;

/// Tile shape and pipeline depth of the GEMM kernel: `BLOCK_M` tokens (wgmma N) × [`BLOCK_N`]
/// weights, `STAGES` stages of [`BLOCK_K`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmConfig {
    /// Tokens per tile (the wgmma N): 64 or 128.
    pub block_m: u32,
    /// Pipeline stages.
    pub stages: u32,
}

impl GemmConfig {
    /// 64 tokens per tile, 4 stages.
    pub const M64: GemmConfig = GemmConfig { block_m: 64, stages: 4 };

    /// Ring stage: packed FP4 tokens, `block_m` rows × 128 bytes (256 values), 128B-swizzled.
    pub const fn token_offset(&self) -> u32 {
        0
    }
    /// Ring stage: token scales, one 512-byte 128x4 block per chunk (the block holding the tile's
    /// rows; a 64-row tile uses half of each block).
    pub const fn token_scale_offset(&self) -> u32 {
        self.block_m * 128
    }
    /// Ring stage: packed weights, 128 rows × 128 bytes, 128B-swizzled (1024-aligned).
    pub const fn weight_offset(&self) -> u32 {
        (self.token_scale_offset() + CHUNKS_PER_STAGE * 512).div_ceil(1024) * 1024
    }
    /// Ring stage: weight scales, one 512-byte block per chunk.
    pub const fn weight_scale_offset(&self) -> u32 {
        self.weight_offset() + BLOCK_N * 128
    }
    /// Bytes per ring stage (a multiple of 1024 so every stage keeps the swizzle alignment).
    pub const fn stage_bytes(&self) -> u32 {
        (self.weight_scale_offset() + CHUNKS_PER_STAGE * 512).div_ceil(1024) * 1024
    }
    /// Bytes of one f16 token chunk: `block_m` rows of 128 bytes (64 f16), 128B-swizzled.
    pub const fn token_chunk_bytes(&self) -> u32 {
        self.block_m * 128
    }
    /// Offset of the f16 token buffers (after the ring).
    pub const fn token_buffer_offset(&self) -> u32 {
        self.stages * self.stage_bytes()
    }
    /// Bytes of one f16 token buffer (a whole stage: 4 chunks).
    pub const fn token_buffer_bytes(&self) -> u32 {
        CHUNKS_PER_STAGE * self.token_chunk_bytes()
    }
    /// Offset of the mbarriers (full\[stages\], then empty\[stages\]).
    pub const fn barrier_offset(&self) -> u32 {
        self.token_buffer_offset() + TOKEN_BUFFERS * self.token_buffer_bytes()
    }
    /// Dynamic shared memory of the GEMM kernel.
    pub const fn dynamic_shared_memory(&self) -> u32 {
        self.barrier_offset() + 16 * self.stages
    }
    /// Bytes a stage's loads credit to its full barrier when `chunks` chunks are valid (a tensor
    /// box counts in full even where it lies out of bounds and is zero-filled; scale copies move
    /// only the valid chunks).
    pub const fn stage_tx_bytes(&self, chunks: u32) -> u32 {
        self.block_m * 128 + BLOCK_N * 128 + 2 * chunks * 512
    }
    /// True when the configuration fits the hardware.
    pub const fn is_valid(&self) -> bool {
        self.block_m == 64 && self.stages >= 2 && self.dynamic_shared_memory() <= SMEM_LIMIT
    }
}

const _: () = assert!(GemmConfig::M64.is_valid());
const _: () = assert!(GemmConfig::M64.stage_bytes() % 1024 == 0);

/// One group as the kernel sees it (device memory, written by the host before the launch).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GroupParams {
    /// Tokens (rows of A and of C).
    pub m: u32,
    /// Weights (rows of B, columns of C).
    pub n: u32,
    /// Reduction length (a multiple of 64).
    pub k: u32,
    /// Scale applied to the fp32 accumulator before rounding.
    pub alpha: f32,
    /// e4m3 scales of A, 128x4 blocked layout.
    pub a_scales: u64,
    /// e4m3 scales of B, 128x4 blocked layout.
    pub b_scales: u64,
    /// Output C, `m × n` f16 (or bf16) elements, row-major.
    pub c: u64,
}

const _: () = assert!(core::mem::size_of::<GroupParams>() == 40);

/// One output tile of the GEMM work list: rows `m_tile*block_m ..` of C, columns
/// `n_tile*BLOCK_N ..`, of group `group`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tile {
    /// Group index.
    pub group: u16,
    /// Token tile index.
    pub m_tile: u16,
    /// Weight tile index.
    pub n_tile: u16,
    /// Zero.
    pub reserved: u16,
}

const _: () = assert!(core::mem::size_of::<Tile>() == 8);

/// Kernel parameters of `sm90_grouped_gemm` (passed by value).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct KernelParams {
    /// `GroupParams[groups]` in device memory.
    pub groups: u64,
    /// Tensor maps, two per group (`[2g]` packed tokens, `[2g+1]` packed weights), 128 bytes each.
    pub tensor_maps: u64,
    /// `Tile[tiles]` in device memory.
    pub tiles: u64,
    /// Number of groups.
    pub group_count: u32,
    /// Number of tiles.
    pub tile_count: u32,
    /// 1 when C is bf16, 0 for f16.
    pub out_bf16: u32,
    /// Zero.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<KernelParams>() == 40);

/// Position (0..64) in a 64-wide K chunk of the shared f16 token buffer where logical value `l`
/// (0..64) of the chunk is stored.
///
/// wgmma k-step `j` (physical columns `16j..16j+16`) gives thread `q` (lane % 4) the A-fragment
/// columns `2q, 2q+1` and `2q+8, 2q+9`. We put logical values `16q+4j .. 16q+4j+4` there, so over the
/// four k-steps thread `q` consumes logical values `16q .. 16q+16`: exactly scale block `q`.
pub const fn token_k_position(l: u32) -> u32 {
    let q = l / 16;
    let j = (l % 16) / 4;
    let r = l % 4;
    16 * j + 2 * q + if r < 2 { r } else { 8 + r - 2 }
}

/// Encoding of a wgmma shared-memory matrix descriptor (PTX ISA §9.7.15.5.1.2.2), for the K-major
/// 128-byte-swizzled f16 token tiles.
///
/// | bits  | field                                   |
/// |-------|-----------------------------------------|
/// | 0–13  | start address >> 4 (18-bit address)     |
/// | 16–29 | leading byte offset >> 4 (unused for K-major swizzled; 1 by convention) |
/// | 32–45 | stride byte offset >> 4 (8-row group pitch: 1024 B) |
/// | 49–51 | base offset (0: patterns start 1024-aligned) |
/// | 62–63 | swizzle: 0 none, 1 128B, 2 64B, 3 32B    |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(transparent)]
pub struct WgmmaDesc(pub u64);

/// Swizzle modes of a wgmma descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WgmmaSwizzle {
    /// Core matrices stored densely.
    None = 0,
    /// 128-byte swizzle (16-byte chunk `c` of row `r` at `c ^ (r % 8)`).
    B128 = 1,
    /// 64-byte swizzle.
    B64 = 2,
    /// 32-byte swizzle.
    B32 = 3,
}

impl WgmmaDesc {
    /// A descriptor from its fields (byte values; they must be multiples of 16).
    pub const fn new(start: u32, lbo: u32, sbo: u32, swizzle: WgmmaSwizzle) -> Self {
        WgmmaDesc(
            ((start as u64 & 0x3FFFF) >> 4)
                | (((lbo as u64 >> 4) & 0x3FFF) << 16)
                | (((sbo as u64 >> 4) & 0x3FFF) << 32)
                | ((swizzle as u64) << 62),
        )
    }

    /// K-major, 128-byte swizzle, 8-row groups 1024 bytes apart: a tile of 128-byte rows (64 f16
    /// of K) starting at the 1024-aligned shared address `start`.
    pub const fn k_major_sw128(start: u32) -> Self {
        Self::new(start, 16, 1024, WgmmaSwizzle::B128)
    }

    /// The same tile advanced by `bytes` along K inside the swizzle atom (k-step `j` of 16 f16 is
    /// `32·j` bytes): the start-address field moves, the swizzle follows the absolute address bits.
    pub const fn advance(self, bytes: u32) -> Self {
        WgmmaDesc(self.0 + (bytes as u64 >> 4))
    }
}

/// Number of token tiles of a group with `m` tokens.
pub const fn m_tiles(m: u32, block_m: u32) -> u32 {
    m.div_ceil(block_m)
}

/// Number of weight tiles of a group with `n` weights.
pub const fn n_tiles(n: u32) -> u32 {
    n.div_ceil(BLOCK_N)
}

/// Chunks of stage `ks` that hold data for a reduction of length `k`.
pub const fn valid_chunks(k: u32, ks: u32) -> u32 {
    let left = k / CHUNK_K - ks * CHUNKS_PER_STAGE;
    if left < CHUNKS_PER_STAGE {
        left
    } else {
        CHUNKS_PER_STAGE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_permutation_is_a_bijection_and_gives_each_thread_one_scale_block() {
        let mut seen = [false; 64];
        for l in 0..64 {
            let p = token_k_position(l) as usize;
            assert!(!seen[p]);
            seen[p] = true;
        }
        // Thread q's fragment columns over the 4 k-steps are exactly logical 16q..16q+16.
        for q in 0..4u32 {
            let mut logical: [u32; 16] = [0; 16];
            let mut n = 0;
            for j in 0..4 {
                for col in [2 * q, 2 * q + 1, 2 * q + 8, 2 * q + 9] {
                    let phys = 16 * j + col;
                    logical[n] = (0..64).find(|&l| token_k_position(l) == phys).unwrap();
                    n += 1;
                }
            }
            logical.sort();
            assert_eq!(logical, core::array::from_fn(|i| 16 * q + i as u32));
        }
    }

    #[test]
    fn descriptor_fields() {
        // Start 0x400 → 0x40; LBO 16 → 1 at bit 16; SBO 1024 → 64 at bit 32; 128B swizzle → 1 at bit 62.
        let d = WgmmaDesc::k_major_sw128(0x400);
        assert_eq!(d.0, 0x40 | (1 << 16) | (64u64 << 32) | (1u64 << 62));
        assert_eq!(d.advance(32).0, d.0 + 2);
    }

    #[test]
    fn stage_layout() {
        let c = GemmConfig::M64;
        assert_eq!(c.token_scale_offset(), 8192);
        assert_eq!(c.weight_offset(), 10240);
        assert_eq!(c.weight_scale_offset(), 26624);
        assert_eq!(c.stage_bytes(), 28672);
        assert_eq!(c.token_buffer_offset(), 4 * 28672);
        assert_eq!(c.token_chunk_bytes(), 8192);
        assert_eq!(c.barrier_offset(), 4 * 28672 + 3 * 32768);
        assert_eq!(c.dynamic_shared_memory(), 4 * 28672 + 3 * 32768 + 64);
        assert_eq!(c.stage_tx_bytes(4), 8192 + 16384 + 4096);
        assert_eq!(c.stage_tx_bytes(1), 8192 + 16384 + 1024);
    }

    #[test]
    fn chunk_counts() {
        assert_eq!(valid_chunks(256, 0), 4);
        assert_eq!(valid_chunks(320, 1), 1);
        assert_eq!(valid_chunks(7168, 27), 4);
        assert_eq!(valid_chunks(192, 0), 3);
    }
}
