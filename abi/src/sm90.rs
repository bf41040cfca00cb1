//! sm_90a (Hopper) kernels: configuration, parameters, and the encodings they rely on.
//!
//! Hopper has no FP4 tensor-core input, so the exact route is: dequantize both operands to f16 with
//! the block scale applied (exact: ≤ 6 significant bits), multiply with `wgmma` f16·f16→f32, apply
//! alpha in the epilogue. The kernel is *swap-AB*: it computes `C_gᵀ = B_g · A_gᵀ`, so weights (N)
//! fill wgmma's M = 64 slot and tokens (M_g, often small) become wgmma's N.
//!
//! Two launches per call:
//! 1. `sm90_dequant_tokens` turns the token operand A (small: ΣM·K) into f16 in a workspace, once,
//!    with K permuted inside each 64-wide chunk (see [`token_k_position`]);
//! 2. `sm90_grouped_gemm` streams the packed weights B through a TMA/mbarrier ring, dequantizes them
//!    in registers straight into wgmma A fragments, and reads the f16 tokens from 128-byte-swizzled
//!    shared memory as wgmma's B operand (`wgmma m64n128k16`: 128 tokens per tile, so each decoded
//!    weight fragment feeds twice the MMA work of a 64-token tile).
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
/// K values per pipeline stage: a 64-byte row of packed weights (64-byte swizzle), two chunks.
pub const BLOCK_K: u32 = 128;
/// Bytes of one weight row in a stage.
pub const WEIGHT_ROW_BYTES: u32 = BLOCK_K / 2;
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

/// Threads per CTA of the token dequantization kernel.
pub const DEQUANT_THREADS: u32 = 256;

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
    /// 128 tokens per tile (wgmma N = 128), 5 stages.
    pub const M128: GemmConfig = GemmConfig { block_m: 128, stages: 5 };

    /// Bytes of f16 tokens per chunk: `block_m` rows of 128 bytes.
    pub const fn token_chunk_bytes(&self) -> u32 {
        self.block_m * 128
    }
    /// Byte offset of the token region in a stage.
    pub const fn token_offset(&self) -> u32 {
        0
    }
    /// Byte offset of the packed-weight region in a stage (128 rows × 64 bytes, 64B-swizzled).
    pub const fn weight_offset(&self) -> u32 {
        CHUNKS_PER_STAGE * self.token_chunk_bytes()
    }
    /// Byte offset of the weight-scale region in a stage (one 512-byte block per chunk).
    pub const fn scale_offset(&self) -> u32 {
        self.weight_offset() + BLOCK_N * WEIGHT_ROW_BYTES
    }
    /// Bytes per stage (a multiple of 1024 so every stage keeps the swizzle alignment).
    pub const fn stage_bytes(&self) -> u32 {
        (self.scale_offset() + CHUNKS_PER_STAGE * 512).div_ceil(1024) * 1024
    }
    /// Offset of the mbarriers (full\[stages\], then empty\[stages\]) after the stages.
    pub const fn barrier_offset(&self) -> u32 {
        self.stages * self.stage_bytes()
    }
    /// Dynamic shared memory of the GEMM kernel.
    pub const fn dynamic_shared_memory(&self) -> u32 {
        self.barrier_offset() + 16 * self.stages
    }
    /// Bytes a stage's TMA loads credit to its full barrier when `chunks` chunks are valid (a box
    /// counts in full even where it lies out of bounds and is zero-filled).
    pub const fn stage_tx_bytes(&self, chunks: u32) -> u32 {
        chunks * (self.token_chunk_bytes() + 512) + BLOCK_N * WEIGHT_ROW_BYTES
    }
    /// True when the configuration fits the hardware.
    pub const fn is_valid(&self) -> bool {
        (self.block_m == 64 || self.block_m == 128) && self.stages >= 2 && self.dynamic_shared_memory() <= SMEM_LIMIT
    }
}

const _: () = assert!(GemmConfig::M128.is_valid());
const _: () = assert!(GemmConfig::M128.stage_bytes() % 1024 == 0);

/// One group as the kernels see it (device memory, written by the host before the launch).
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
    /// Packed e2m1 values of A, `m × k/2` bytes.
    pub a_values: u64,
    /// e4m3 scales of A, 128x4 blocked layout.
    pub a_scales: u64,
    /// e4m3 scales of B, 128x4 blocked layout.
    pub b_scales: u64,
    /// Output C, `m × n` f16 (or bf16) elements, row-major.
    pub c: u64,
    /// This group's f16 tokens in the workspace (`m × k` elements, K permuted per chunk).
    pub workspace: u64,
    /// Index of the first token-dequantization CTA of this group.
    pub dequant_first_cta: u32,
    /// Token-dequantization CTAs for this group.
    pub dequant_ctas: u32,
}

const _: () = assert!(core::mem::size_of::<GroupParams>() == 64);

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

/// Kernel parameters of both sm_90a kernels (passed by value).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct KernelParams {
    /// `GroupParams[groups]` in device memory.
    pub groups: u64,
    /// Tensor maps, two per group (`[2g]` tokens, `[2g+1]` weights), 128 bytes each.
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

/// Position (0..64) in a 64-wide K chunk of the f16 token workspace where logical value `l`
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
        let c = GemmConfig::M128;
        assert_eq!(c.token_chunk_bytes(), 16384);
        assert_eq!(c.weight_offset(), 32768);
        assert_eq!(c.scale_offset(), 32768 + 8192);
        assert_eq!(c.stage_bytes(), 41984);
        assert_eq!(c.dynamic_shared_memory(), 5 * 41984 + 80);
        assert_eq!(c.stage_tx_bytes(2), 2 * (16384 + 512) + 8192);
    }

    #[test]
    fn chunk_counts() {
        assert_eq!(valid_chunks(256, 0), 2);
        assert_eq!(valid_chunks(320, 2), 1);
        assert_eq!(valid_chunks(7168, 55), 2);
        assert_eq!(valid_chunks(192, 1), 1);
    }
}
