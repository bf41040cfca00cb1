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

use crate::launch::{LaunchGeometry, MAX_DYNAMIC_SMEM, SMEM_PER_SM, SMEM_RESERVED_PER_BLOCK};
use crate::scale_layout::BLOCK_BYTES as SCALE_BLOCK_BYTES;
use crate::tensor_map::{TensorMapDataType, TensorMapSwizzle, TiledMap, L2_PROMOTION};
pub use crate::work::{KernelParams, WorkItem};

/// Weight rows (N) per CTA tile: two consumer warpgroups of 64 rows (wgmma M = 64) each.
pub const BLOCK_N: u32 = 128;
/// Weight rows per consumer warpgroup.
pub const WG_ROWS: u32 = 64;
/// Consumer warpgroups per CTA.
pub const CONSUMER_WARPGROUPS: u32 = BLOCK_N / WG_ROWS;
/// K values per weight box: a 64-byte row of packed weights (64-byte swizzle), two chunks. A
/// stage holds one box (two chunks) or, in the decode variant, two ([`GemmConfig::chunks`]); the
/// host's cost model counts K in units of this ([`k_stages`]).
pub const BLOCK_K: u32 = 128;
/// Bytes of one weight row in a weight box.
pub const WEIGHT_ROW_BYTES: u32 = BLOCK_K / 2;
/// K values per chunk: one 128-byte row of f16 tokens, one 512-byte scale block, 4 wgmma k-steps.
pub const CHUNK_K: u32 = 64;
/// Chunks per weight box.
pub const CHUNKS_PER_BOX: u32 = BLOCK_K / CHUNK_K;
/// wgmma k-steps (K = 16 each) per chunk.
pub const K_STEPS_PER_CHUNK: u32 = CHUNK_K / 16;
/// Bytes one wgmma k-step (16 f16 of K) advances along a token row.
pub const TOKEN_K_STEP_BYTES: u32 = 16 * 2;
/// Threads per warpgroup.
pub const WARPGROUP_THREADS: u32 = 128;
/// Threads per CTA: one producer warpgroup and the consumer warpgroups.
pub const THREADS: u32 = WARPGROUP_THREADS * (1 + CONSUMER_WARPGROUPS);
/// Register cap per thread of the 384-thread variants (`M128`, `M128_64`): 65536 / 384, rounded
/// down to 8 ([`GemmConfig::max_registers`]).
pub const MAX_REGISTERS: u32 = GemmConfig::M128.max_registers();
/// Registers per thread the producer warpgroup keeps after `setmaxnreg.dec` (one thread issues
/// copies; 40 is plenty).
pub const PRODUCER_REGISTERS: u32 = 40;
/// Registers per thread each consumer warpgroup of the 384-thread variants takes with
/// `setmaxnreg.inc` ([`GemmConfig::consumer_registers`]): what the producer gave back, shared by
/// the consumers, a multiple of 8. The pool is what the CTA was launched with (`MAX_REGISTERS` per
/// thread), not the SM's 65536: `setmaxnreg.inc` waits until the registers it asks for are free in
/// the CTA, so asking for more than the CTA holds never returns (a hang on the H200 when the
/// producer kept 48 and the consumers asked for 232: 65536 > 64512).
pub const CONSUMER_REGISTERS: u32 = GemmConfig::M128.consumer_registers();
const _: () = assert!(
    WARPGROUP_THREADS * (PRODUCER_REGISTERS + CONSUMER_WARPGROUPS * CONSUMER_REGISTERS) <= MAX_REGISTERS * THREADS
        && CONSUMER_REGISTERS <= 256
);
/// Threads per CTA of the decode variant: two consumer warpgroups (warps 0–7) and two producer
/// warps (8 and 9, one per [`ProducerRole`]); with two threads issuing every copy, a whole
/// producer warpgroup would only hold registers that two resident CTAs need.
pub const DECODE_THREADS: u32 = WARPGROUP_THREADS * CONSUMER_WARPGROUPS + 2 * 32;

/// The copies of a stage are issued by two threads in different warps (so on different warp
/// schedulers), each with its own `arrive.expect_tx` on the stage's full barrier. One thread
/// issuing all of them was measured to be the decode variant's bottleneck: ~85 instructions per
/// stage (each TMA is an elect loop around six `R2UR`), busy ~80% of the kernel, and the
/// consumers waited at each tile's first stage while it loaded the next work item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProducerRole {
    /// The stage's packed weights and their scale blocks.
    Weights,
    /// The stage's token chunks (after `griddepcontrol.wait`: the workspace is the
    /// dequantization's output).
    Tokens,
}
/// Register cap of the decode variant: two CTAs of [`DECODE_THREADS`] per SM
/// ([`GemmConfig::max_registers`]).
pub const DECODE_MAX_REGISTERS: u32 = GemmConfig::M16.max_registers();
/// Register cap of the token-dequantization kernel (256-thread CTAs, several per SM).
pub const DEQUANT_MAX_REGISTERS: u32 = 64;
/// Per-kernel register caps of the sm_90a module (`.maxnreg`, inserted into the PTX by
/// `cargo xtask build-ptx`): each kernel is sized for a number of resident CTAs.
pub const REGISTER_CAPS: [(&str, u32); 5] = [
    ("sm90_grouped_gemm", GemmConfig::M128.max_registers()),
    ("sm90_grouped_gemm_t64", GemmConfig::M128_64.max_registers()),
    ("sm90_grouped_gemm_decode", GemmConfig::M16.max_registers()),
    ("sm90_grouped_gemm_n192", GemmConfig::N192.max_registers()),
    ("sm90_dequant_tokens", DEQUANT_MAX_REGISTERS),
];
/// Bytes of one mbarrier.
pub const MBARRIER_BYTES: u32 = 8;

/// The GEMM kernels may start before the token dequantization that precedes them has finished
/// (programmatic dependent launch): only the token producer thread ([`ProducerRole::Tokens`]) reads
/// what the dequantization wrote (the workspace, through TMA), and it executes
/// `griddepcontrol.wait` before its first token load, while the weight producer already fills the
/// ring with weights; the dequantization lets it be scheduled at its start
/// (`griddepcontrol.launch_dependents`). The host launches the GEMM with programmatic stream
/// serialization when a dequantization precedes it in the same call.
pub const GEMM_STARTS_EARLY: bool = true;

/// Threads per CTA of the token dequantization kernel.
pub const DEQUANT_THREADS: u32 = 256;
/// Threads per work item (one row × 64-wide chunk: 128 bytes of f16 out) of the token
/// dequantization kernel: each writes one 16-byte slot, so that a warp stores 512 contiguous bytes.
pub const DEQUANT_THREADS_PER_ITEM: u32 = 8;
/// Work items each token-dequantization thread takes per pass (their loads are issued together).
pub const DEQUANT_ITEMS_PER_THREAD: u32 = 4;
/// Work items one token-dequantization CTA covers per pass: item `i` of a pass goes to threads
/// `8 · (i % 32) ..` (so a warp covers 4 consecutive items), in round `i / 32`.
pub const DEQUANT_ITEMS_PER_CTA: u32 = DEQUANT_THREADS / DEQUANT_THREADS_PER_ITEM * DEQUANT_ITEMS_PER_THREAD;
/// Most token-dequantization CTAs per group (each grid-strides over the group's rows × chunks).
pub const MAX_DEQUANT_CTAS_PER_GROUP: u32 = 256;

/// Token-dequantization CTAs of a group of `m` rows and reduction length `k`:
/// `min(⌈m · k/64 / DEQUANT_ITEMS_PER_CTA⌉, MAX_DEQUANT_CTAS_PER_GROUP)`.
pub const fn dequant_ctas(m: u32, k: u32) -> u32 {
    let ctas = (m as u64 * (k / CHUNK_K) as u64).div_ceil(DEQUANT_ITEMS_PER_CTA as u64);
    if ctas < MAX_DEQUANT_CTAS_PER_GROUP as u64 {
        ctas as u32
    } else {
        MAX_DEQUANT_CTAS_PER_GROUP
    }
}

/// Where thread `j` (0..8) of a token-dequantization work item finds its inputs and puts its
/// output: it writes 16-byte slot `j` of the item's 128-byte f16 row, i.e. the four f16x2 pairs
/// `4j .. 4j + 4` of [`token_pair_slot`]; pair `4j + q` is pair `j % 4` (of the decoder's four)
/// of packed word `j / 4 + 2q`, scaled by block `q`. Returns those four word indices (0..8).
pub const fn dequant_slot_words(j: u32) -> [u32; 4] {
    let h = j / 4;
    [h, h + 2, h + 4, h + 6]
}

/// Most token rows of C a consumer warpgroup passes through its epilogue buffer at once (a
/// 128-token tile in two rounds; the decode variant's 16-token tiles in one, its buffer sized to
/// them: [`GemmConfig::epilogue_rows`]).
pub const EPILOGUE_ROWS: u32 = 64;
/// Bytes of one token row of a warpgroup's epilogue buffer: its 64 weights, 2 bytes each, as eight
/// 16-byte chunks of 8 weights.
pub const EPILOGUE_ROW_BYTES: u32 = WG_ROWS * 2;

/// Offset in an epilogue buffer of the 16 bytes holding weights `8 chunk .. 8 chunk + 8` of token
/// row `row` (0..[`EPILOGUE_ROWS`]): chunk `chunk ^ (row % 8)` of the row. The XOR puts the 8 rows
/// one `stmatrix` matrix writes (rows `8i..8i+8`, one chunk) on 8 different bank quads, and a
/// quarter warp reading one row's 8 chunks back reads 32 banks. (ncu's bank-conflict counter on
/// the H200 still shows 18% extra store wavefronts on b1; an XOR with the quad parity as well,
/// against another grouping of an `.x4`'s rows, left it unchanged: PERF.md #71.)
pub const fn epilogue_slot(row: u32, chunk: u32) -> u32 {
    row * EPILOGUE_ROW_BYTES + ((chunk ^ (row % 8)) * 16)
}

/// Tile shape and pipeline depth of the GEMM kernel: `BLOCK_M` tokens (wgmma N) × [`BLOCK_N`]
/// weights, `stages` stages of `chunks` × [`CHUNK_K`].
///
/// Shared memory: `stages` stages of `[token chunks][weight tile][weight scale blocks]`, each a
/// multiple of 1024 bytes, then the mbarriers `full[stages]`, `empty[stages]`, then one epilogue
/// buffer per consumer warpgroup ([`GemmConfig::epilogue_buffer_offset`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmConfig {
    /// Most tokens per tile (the widest wgmma N the variant runs): 16 or 128.
    pub block_m: u32,
    /// The variant's narrower wgmma N: 16 (whole groups of at most 16 tokens, `M128`), 64 (the
    /// last tile of a group whose last rows fit 64, `M128_64`); equal to `block_m` when the variant
    /// runs one width only.
    pub narrow: u32,
    /// Pipeline stages.
    pub stages: u32,
    /// Weight rows per tile (wgmma M of the CTA): [`BLOCK_N`] (two consumer warpgroups) or 192
    /// (`N192`: three).
    pub block_n: u32,
    /// 64-wide K chunks per stage: 2 (one weight box) or 4 (two boxes, the decode variant: the
    /// per-stage costs — the ring's waits and release, the wgmma fences — over twice the decode
    /// work).
    pub chunks: u32,
}

impl GemmConfig {
    /// 16- or 128-token tiles (wgmma N = 16 or 128), 5 stages (`sm90_grouped_gemm`).
    pub const M128: GemmConfig =
        GemmConfig { block_m: 128, narrow: SMALL_TILE_M, stages: 5, block_n: BLOCK_N, chunks: CHUNKS_PER_BOX };
    /// The decode variant (`sm90_grouped_gemm_decode`): only 16-token tiles, 4 stages of 256 K
    /// (26 KiB: two weight boxes), two CTAs per SM (registers capped at [`DECODE_MAX_REGISTERS`])
    /// so that each scheduler has twice the warps to hide the decode's latencies.
    pub const M16: GemmConfig = GemmConfig {
        block_m: SMALL_TILE_M,
        narrow: SMALL_TILE_M,
        stages: 4,
        block_n: BLOCK_N,
        chunks: 2 * CHUNKS_PER_BOX,
    };
    /// 128-token tiles whose group's last tile runs `wgmma m64n64k16` when the group's last rows
    /// fit 64 (`sm90_grouped_gemm_t64`), 5 stages: less padding for prefill groups (b0 computes
    /// 1216 token rows instead of 1408). Every group's `block_m` (tile pitch and token box) is 128.
    pub const M128_64: GemmConfig =
        GemmConfig { block_m: 128, narrow: TAIL_TILE_M, stages: 5, block_n: BLOCK_N, chunks: CHUNKS_PER_BOX };
    /// 192 weight rows × 128 tokens per tile (`sm90_grouped_gemm_n192`): three consumer warpgroups
    /// read each token tile (a third fewer token bytes per MMA than `M128`, three consumer warps
    /// per scheduler instead of two to hide the decode's latencies), the 64-wide last tiles of
    /// `M128_64`, 4 stages of 46 KiB. A tile's 192 rows span two 128-row blocks of B's scales (the
    /// second half of one and all of the next, or the reverse); where N ends inside a tile, the
    /// warpgroups whose rows lie past it only release the stages.
    pub const N192: GemmConfig =
        GemmConfig { block_m: 128, narrow: TAIL_TILE_M, stages: 4, block_n: 192, chunks: CHUNKS_PER_BOX };
    /// Every compiled variant.
    pub const ALL: [GemmConfig; 4] = [GemmConfig::M128, GemmConfig::M128_64, GemmConfig::M16, GemmConfig::N192];

    /// K values per stage.
    pub const fn block_k(&self) -> u32 {
        self.chunks * CHUNK_K
    }

    /// Weight boxes ([`BLOCK_K`] wide) per stage.
    pub const fn weight_boxes(&self) -> u32 {
        self.chunks / CHUNKS_PER_BOX
    }

    /// Pipeline stages of a reduction of length `k`.
    pub const fn k_stages(&self, k: u32) -> u32 {
        k.div_ceil(self.block_k())
    }

    /// Chunks of stage `ks` that hold data for a reduction of length `k` (`k` a multiple of
    /// [`CHUNK_K`]); the stage's others lie past K.
    pub const fn valid_chunks(&self, k: u32, ks: u32) -> u32 {
        let left = k / CHUNK_K - ks * self.chunks;
        if left < self.chunks {
            left
        } else {
            self.chunks
        }
    }

    /// Consumer warpgroups per CTA: one per 64 weight rows.
    pub const fn consumer_warpgroups(&self) -> u32 {
        self.block_n / WG_ROWS
    }

    /// Scale-block slots per chunk in a stage: the 128-row blocks of B's scales a tile's rows can
    /// touch (one for 128-row tiles, two for `N192`'s spans of up to 192 rows, which start at a
    /// multiple of 64).
    pub const fn scale_slots(&self) -> u32 {
        if self.block_n == BLOCK_N {
            1
        } else {
            2
        }
    }

    /// The register cap per thread (`.maxnreg`): what `ctas_per_sm` CTAs of `threads` threads
    /// leave of the SM's 65536, rounded down to 8.
    pub const fn max_registers(&self) -> u32 {
        65536 / (self.ctas_per_sm() * self.threads()) / 8 * 8
    }

    /// Registers per thread the producer warpgroup keeps after `setmaxnreg.dec`:
    /// [`PRODUCER_REGISTERS`], or 32 for `N192`, whose consumers need every register left.
    pub const fn producer_registers(&self) -> u32 {
        if self.block_n == BLOCK_N {
            PRODUCER_REGISTERS
        } else {
            32
        }
    }

    /// Registers per thread each consumer warpgroup takes with `setmaxnreg.inc` in the variants
    /// with a producer warpgroup: what the producer's [`Self::producer_registers`] leave of the
    /// CTA's pool (`max_registers · threads`; `setmaxnreg.inc` waits for registers of the CTA's
    /// own pool), shared by the consumers, a multiple of 8.
    pub const fn consumer_registers(&self) -> u32 {
        (self.max_registers() * self.threads() / WARPGROUP_THREADS - self.producer_registers())
            / self.consumer_warpgroups()
            / 8
            * 8
    }

    /// Token rows per tile of a group of `m` tokens under this variant (the group's `block_m`:
    /// the pitch of its tiles and the height of a stage's token region): `M128` 16 for `m ≤ 16`, else 128;
    /// `M128_64` 128; the decode variant 16.
    pub const fn tile_rows(&self, m: u32) -> u32 {
        if m <= self.narrow && self.narrow == SMALL_TILE_M {
            self.narrow
        } else {
            self.block_m
        }
    }

    /// The wgmma N of token tile `tile_m` of a group of `m` tokens whose tiles have `block_m`
    /// rows: `narrow` for a whole narrow group (`block_m == narrow`) and, in `M128_64` and `N192`,
    /// for the group's last tile when its rows fit 64 (its box loads only those rows,
    /// [`tail_box_rows`]); else `block_m`.
    pub const fn tile_width(&self, m: u32, block_m: u32, tile_m: u32) -> u32 {
        if block_m == self.narrow || (self.narrow == TAIL_TILE_M && m - tile_m * block_m <= TAIL_TILE_M) {
            self.narrow
        } else {
            block_m
        }
    }

    /// Threads per CTA: a producer warpgroup and the consumer warpgroups ([`THREADS`] for 128-row
    /// tiles, 512 for `N192`), or [`DECODE_THREADS`] for the decode variant.
    pub const fn threads(&self) -> u32 {
        if self.block_m == SMALL_TILE_M {
            DECODE_THREADS
        } else {
            WARPGROUP_THREADS * (1 + self.consumer_warpgroups())
        }
    }

    /// The consumer warpgroup and the thread in it (0..128) of CTA thread `tid`, or `None` for the
    /// producer's threads (warpgroup 0 of the general variant, the last warp of the decode one).
    pub const fn consumer_thread(&self, tid: u32) -> Option<(u32, u32)> {
        let first = if self.block_m == SMALL_TILE_M { 0 } else { WARPGROUP_THREADS };
        if tid < first || tid >= first + self.consumer_warpgroups() * WARPGROUP_THREADS {
            None
        } else {
            Some(((tid - first) / WARPGROUP_THREADS, (tid - first) % WARPGROUP_THREADS))
        }
    }

    /// The role of CTA thread `tid` if it is one of the two that issue the copies: lane 0 of the
    /// producer's first warp loads the weights, lane 0 of its second warp the tokens.
    pub const fn producer_role(&self, tid: u32) -> Option<ProducerRole> {
        let first = if self.block_m == SMALL_TILE_M { CONSUMER_WARPGROUPS * WARPGROUP_THREADS } else { 0 };
        if tid == first {
            Some(ProducerRole::Weights)
        } else if tid == first + 32 {
            Some(ProducerRole::Tokens)
        } else {
            None
        }
    }

    /// CTAs per SM the variant is sized for (registers and shared memory).
    pub const fn ctas_per_sm(&self) -> u32 {
        if self.block_m == SMALL_TILE_M {
            2
        } else {
            1
        }
    }

    /// Bytes of f16 tokens per chunk: `block_m` rows of 128 bytes.
    pub const fn token_chunk_bytes(&self) -> u32 {
        self.block_m * CHUNK_K * 2
    }
    /// Byte offset of chunk `c`'s tokens in a stage (1024-byte aligned: 128-byte swizzle).
    pub const fn token_offset(&self, c: u32) -> u32 {
        c * self.token_chunk_bytes()
    }
    /// Byte offset of the packed-weight region in a stage (its first weight box).
    pub const fn weight_offset(&self) -> u32 {
        self.token_offset(self.chunks)
    }
    /// Byte offset of weight box `b` in a stage (`block_n` rows × 64 bytes, 64B-swizzled: chunks
    /// `2b` and `2b + 1`; a multiple of 1024).
    pub const fn weight_box_offset(&self, b: u32) -> u32 {
        self.weight_offset() + b * self.block_n * WEIGHT_ROW_BYTES
    }
    /// Byte offset of the weight-scale region in a stage (per scale slot, one 512-byte block per
    /// chunk).
    pub const fn scale_offset(&self) -> u32 {
        self.weight_box_offset(self.weight_boxes())
    }
    /// Byte offset of chunk `c`'s 512-byte weight-scale block in scale slot `slot` of a stage (a
    /// slot's chunks are adjacent: one bulk copy per slot).
    pub const fn scale_block_offset(&self, slot: u32, c: u32) -> u32 {
        self.scale_offset() + (slot * self.chunks + c) * SCALE_BLOCK_BYTES
    }
    /// Bytes per stage (a multiple of 1024 so every stage keeps the swizzle alignment).
    pub const fn stage_bytes(&self) -> u32 {
        self.scale_block_offset(self.scale_slots(), 0).div_ceil(1024) * 1024
    }
    /// Byte offset of stage `s`.
    pub const fn stage_offset(&self, s: u32) -> u32 {
        s * self.stage_bytes()
    }
    /// Offset of the mbarriers (full\[stages\], then empty\[stages\]) after the stages.
    pub const fn barrier_offset(&self) -> u32 {
        self.stage_offset(self.stages)
    }
    /// The full barrier of stage `s` (TMA → consumers: 1 arrival, the producer's, plus bytes).
    pub const fn full_barrier_offset(&self, s: u32) -> u32 {
        self.barrier_offset() + s * MBARRIER_BYTES
    }
    /// The empty barrier of stage `s` (consumers → producer: [`Self::empty_barrier_arrivals`]).
    pub const fn empty_barrier_offset(&self, s: u32) -> u32 {
        self.full_barrier_offset(self.stages + s)
    }
    /// Arrivals that complete a full barrier phase: each producer thread's `arrive.expect_tx`
    /// (one per [`ProducerRole`]).
    pub const fn full_barrier_arrivals(&self) -> u32 {
        2
    }
    /// Arrivals that complete an empty barrier phase: every consumer thread, so that each
    /// thread's own shared-memory reads of the stage are ordered before the refill by its own
    /// release (one arrival per warp left the other lanes' reads unordered; racecheck reported it).
    pub const fn empty_barrier_arrivals(&self) -> u32 {
        WARPGROUP_THREADS * self.consumer_warpgroups()
    }
    /// Token rows of a consumer warpgroup's epilogue buffer: [`EPILOGUE_ROWS`], or the tile height
    /// where that is less (the decode variant's 16).
    pub const fn epilogue_rows(&self) -> u32 {
        if self.block_m < EPILOGUE_ROWS {
            self.block_m
        } else {
            EPILOGUE_ROWS
        }
    }
    /// Bytes of a consumer warpgroup's epilogue buffer.
    pub const fn epilogue_buffer_bytes(&self) -> u32 {
        self.epilogue_rows() * EPILOGUE_ROW_BYTES
    }
    /// Offset of the epilogue buffers, one per consumer warpgroup, after the mbarriers (128-byte
    /// aligned): the consumers write their tile of C there (`stmatrix`) and copy it to C in
    /// 16-byte chunks of whole token rows.
    pub const fn epilogue_offset(&self) -> u32 {
        self.empty_barrier_offset(self.stages).div_ceil(128) * 128
    }
    /// Offset of consumer warpgroup `cw`'s epilogue buffer.
    pub const fn epilogue_buffer_offset(&self, cw: u32) -> u32 {
        self.epilogue_offset() + cw * self.epilogue_buffer_bytes()
    }
    /// Dynamic shared memory of the GEMM kernel.
    pub const fn dynamic_shared_memory(&self) -> u32 {
        self.epilogue_buffer_offset(self.consumer_warpgroups())
    }
    /// Bytes the [`ProducerRole::Weights`] copies of a stage credit to its full barrier when
    /// `slots` scale blocks are loaded per chunk: the weight boxes (in full even where they lie
    /// past K or N and are zero-filled) and every chunk's scale blocks (a K tail's chunks past K
    /// get copies of the stage's first: finite scales for the zero weights).
    pub const fn weight_tx_bytes(&self, slots: u32) -> u32 {
        self.chunks * slots * SCALE_BLOCK_BYTES + self.weight_boxes() * self.block_n * WEIGHT_ROW_BYTES
    }
    /// Bytes the [`ProducerRole::Tokens`] copies of a stage credit when the tile's token boxes
    /// have `block_m` rows (the group's, or [`GroupParams::tail_rows`]): every chunk's box (a K
    /// tail's chunks past K lie wholly outside the tensor: zeros, counted in full).
    pub const fn token_tx_bytes(&self, block_m: u32) -> u32 {
        self.chunks * block_m * CHUNK_K * 2
    }
    /// True when the configuration fits the hardware.
    pub const fn is_valid(&self) -> bool {
        (self.block_m == SMALL_TILE_M || self.block_m == 128)
            && (self.narrow == SMALL_TILE_M || (self.narrow == TAIL_TILE_M && self.block_m == 128))
            && (self.block_n == BLOCK_N || (self.block_n == 3 * WG_ROWS && self.block_m == 128))
            && self.threads() <= 1024
            && self.narrow <= self.block_m
            && self.stages >= 2
            && (self.chunks == CHUNKS_PER_BOX || self.chunks == 2 * CHUNKS_PER_BOX)
            && self.ctas_per_sm() * (self.dynamic_shared_memory() + SMEM_RESERVED_PER_BLOCK) <= SMEM_PER_SM
            && self.dynamic_shared_memory() <= MAX_DYNAMIC_SMEM
    }
}

const _: () = assert!(GemmConfig::M128.is_valid());
const _: () = assert!(GemmConfig::M128_64.is_valid());
const _: () = assert!(GemmConfig::M16.is_valid());
const _: () = assert!(GemmConfig::N192.is_valid());
const _: () = assert!(MAX_REGISTERS * THREADS <= 65536);
const _: () = assert!(GemmConfig::M128.stage_bytes() % 1024 == 0);

/// The weight rows one `N192` work item covers: `warpgroups` (1..=3) consecutive blocks of
/// [`WG_ROWS`] rows from row `64 · first`. The host picks the spans of each group's N (192 or 128
/// rows, and what N leaves at its end) to balance the CTAs' work; the item's `tile_n` holds
/// [`RowSpan::encode`]. (The 128-row variants' `tile_n` is a plain 128-row tile index.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowSpan {
    /// First row, in units of [`WG_ROWS`].
    pub first: u32,
    /// Consumer warpgroups with rows (1..=3).
    pub warpgroups: u32,
}

impl RowSpan {
    /// Bit position of `warpgroups` in the encoded `tile_n`.
    const SHIFT: u32 = 24;

    /// The `tile_n` word of a work item.
    pub const fn encode(self) -> u32 {
        self.first | (self.warpgroups << Self::SHIFT)
    }

    /// The span a work item's `tile_n` names.
    pub const fn decode(tile_n: u32) -> RowSpan {
        RowSpan { first: tile_n & ((1 << Self::SHIFT) - 1), warpgroups: tile_n >> Self::SHIFT }
    }

    /// The first weight row.
    pub const fn row0(self) -> u32 {
        self.first * WG_ROWS
    }

    /// The first 128-row block of B's scales the span touches.
    pub const fn first_scale_block(self) -> u32 {
        self.row0() / BLOCK_N
    }

    /// The 128-row scale blocks the span's rows below `n` lie in (1 or 2).
    pub const fn scale_blocks(self, n: u32) -> u32 {
        let end = if self.row0() + self.warpgroups * WG_ROWS < n { self.row0() + self.warpgroups * WG_ROWS } else { n };
        (end - 1) / BLOCK_N - self.first_scale_block() + 1
    }

    /// The spans of `n` weight rows: `twos` spans of 128 rows first, then as many of 192 as fit,
    /// then what is left (64 or 128 rows). `twos` is capped at what `n` holds.
    pub fn split(n: u32, twos: u32) -> impl Iterator<Item = RowSpan> {
        let units = n.div_ceil(WG_ROWS);
        let twos = if 2 * twos < units { twos } else { units / 2 };
        let threes = (units - 2 * twos) / 3;
        let rest = units - 2 * twos - 3 * threes;
        let spans = (0..twos).map(|i| (2 * i, 2)).chain((0..threes).map(move |i| (2 * twos + 3 * i, 3)));
        let last = if rest > 0 { Some((units - rest, rest)) } else { None };
        spans.chain(last).map(|(first, warpgroups)| RowSpan { first, warpgroups })
    }
}

/// The weight row, within its group of 8, whose A-fragment rows lane group `g` (lane / 4) of a
/// consumer warp holds: `g` with bits 1 and 2 swapped (0, 1, 4, 5, 2, 3, 6, 7). wgmma fixes that
/// lane group `g` holds fragment rows `g` and `g + 8` of the warp's 16 (PTX ISA, wgmma register
/// fragments); which weight rows of the tile they are is the kernel's choice, as long as the loads
/// and the epilogue agree. With the identity, a half-warp (lane groups 0–3 or 4–7, the 16 lanes
/// an 8-byte shared load serves per pass) reads rows `r` and `r + 2`, which the 64-byte swizzle
/// puts on the same banks: each such load took 4 shared wavefronts instead of 2 (ncu on b1: 11%
/// of the kernel's shared wavefronts "excessive", exactly these loads). Rows `{0, 1, 4, 5}` and
/// `{2, 3, 6, 7}` cover all 32 banks (test `half_warps_read_weights_without_bank_conflicts`).
/// Bit 0 is kept, so lane groups `g` and `g ^ 1` still hold neighbouring weights (the epilogue's
/// pairs).
pub const fn lane_group_row(g: u32) -> u32 {
    (g & 1) | ((g & 2) << 1) | ((g & 4) >> 1)
}

/// Byte offset, inside a 64-byte-swizzled weight box, of the 8 bytes (16 e2m1 values: one
/// scale block) that thread `q` (lane % 4) of a consumer reads for weight row `row` (0..block_n) and
/// chunk `chunk` of the box (0..[`CHUNKS_PER_BOX`]). Logically they are bytes `32·chunk + 8·q ..`
/// of the row, i.e. 16-byte unit `2·chunk + q/2`, half `q % 2`; the 64-byte swizzle moves unit
/// `u` of row `r` to `u ^ ((r / 2) % 4)`.
pub const fn weight_fragment_offset(row: u32, chunk: u32, q: u32) -> u32 {
    row * WEIGHT_ROW_BYTES + (((2 * chunk + q / 2) ^ ((row / 2) % 4)) * 16) + (q % 2) * 8
}

/// Byte offset of the 4-byte scale word of weight row `row` (0..128) inside a chunk's 512-byte
/// scale block: the 128x4 blocked layout's `(row % 32) * 16 + (row / 32) * 4`
/// ([`crate::scale_layout::blocked_word_offset`] within one block). Byte `q` of the word scales
/// the row's values `16q .. 16q + 16` of the chunk.
pub const fn scale_word_offset(row: u32) -> u32 {
    (row % 32) * 16 + (row / 32) * 4
}

/// Index of group `g`'s token map (the f16 workspace) in the tensor-map table.
pub const fn token_map_index(g: u32) -> usize {
    crate::work::first_map_index(g)
}

/// Index of group `g`'s weight map (packed B) in the tensor-map table.
pub const fn weight_map_index(g: u32) -> usize {
    crate::work::second_map_index(g)
}

/// Index of the token map of group `g`'s last tile in a table of `groups` groups' maps: after
/// every group's token and weight maps (the first of them is where group `groups`' token map
/// would be).
pub const fn tail_token_map_index(g: u32, groups: u32) -> usize {
    crate::work::first_map_index(groups) + g as usize
}

/// Tensor maps of a host-sized plan of `groups` groups: a token, a weight and a last-tile token
/// map per group.
pub const fn map_count(groups: u32) -> usize {
    3 * groups as usize
}

/// The token map of a group under variant `cfg`: its `m × k` f16 workspace, one
/// `CHUNK_K × cfg.tile_rows(m)` box per chunk, 128-byte swizzle (the wgmma B operand's layout, see
/// [`WgmmaDesc::k_major_sw128`]).
pub const fn token_map(cfg: GemmConfig, m: u32, k: u32) -> TiledMap<2> {
    token_map_with_box(m, k, cfg.tile_rows(m))
}

/// The token map of a group's last tile under variant `cfg`: as [`token_map`] with boxes of
/// [`tail_box_rows`] rows.
pub const fn tail_token_map(cfg: GemmConfig, m: u32, k: u32) -> TiledMap<2> {
    token_map_with_box(m, k, tail_box_rows(m, cfg.tile_rows(m)))
}

/// Rows of the box that loads the last tile of a group of `m` tokens in tiles of `block_m` rows:
/// exactly the tile's own rows (8 for an empty group, which has no tiles). The TMA zero-fills a
/// box's rows past the tensor, but those zeros still cross the L2→SM path (measured with ncu on
/// d0, 4 tokens per group: the bytes read are exactly those of 16-row boxes), so a full-height box
/// over a short tile moves up to `block_m − 1` rows of zeros per stage. A box need not fill a
/// 128-byte swizzle atom (8 rows): the TMA swizzles each row by its shared-memory address, and
/// the stage's rows past the box keep older bytes, which reach only columns of C past `m`.
pub const fn tail_box_rows(m: u32, block_m: u32) -> u32 {
    let rows = if m == 0 { 0 } else { m - (m - 1) / block_m * block_m };
    if rows == 0 {
        8
    } else {
        rows
    }
}

/// A token map over `rows × k` f16 with boxes of `block_m` rows (device-sized plans share one map
/// per box height over the whole workspace, see `crate::moe`).
pub const fn token_map_with_box(rows: u32, k: u32, block_m: u32) -> TiledMap<2> {
    TiledMap {
        element: TensorMapDataType::F16,
        dims: [k as u64, rows as u64],
        strides_bytes: [2 * k as u64, 0],
        box_dims: [CHUNK_K, block_m],
        swizzle: TensorMapSwizzle::B128,
        l2_promotion: L2_PROMOTION,
    }
}

/// The weight map of a group: packed B (`n × k/2` bytes), one `WEIGHT_ROW_BYTES × BLOCK_N` box
/// per stage, 64-byte swizzle (undone by [`weight_fragment_offset`]).
pub const fn weight_map(n: u32, k: u32) -> TiledMap<2> {
    weight_map_with_box(n, k, BLOCK_N)
}

/// The weight map of a group under variant `cfg`: boxes of `cfg.block_n` rows.
pub const fn weight_map_for(cfg: GemmConfig, n: u32, k: u32) -> TiledMap<2> {
    weight_map_with_box(n, k, cfg.block_n)
}

/// Packed B (`n × k/2` bytes) in boxes of `WEIGHT_ROW_BYTES × rows`, 64-byte swizzle.
pub const fn weight_map_with_box(n: u32, k: u32, rows: u32) -> TiledMap<2> {
    TiledMap {
        element: TensorMapDataType::U8,
        dims: [k as u64 / 2, n as u64],
        strides_bytes: [k as u64 / 2, 0],
        box_dims: [WEIGHT_ROW_BYTES, rows],
        swizzle: TensorMapSwizzle::B64,
        l2_promotion: L2_PROMOTION,
    }
}

/// The GEMM launch for `work_len` tiles on `sm_count` SMs: a persistent grid of at most one CTA
/// per SM (at least one CTA), [`THREADS`] threads, the configuration's shared memory.
pub const fn gemm_launch(cfg: GemmConfig, work_len: u32, sm_count: u32) -> LaunchGeometry {
    let resident = sm_count * cfg.ctas_per_sm();
    let grid = if work_len < resident { work_len } else { resident };
    LaunchGeometry {
        grid: if grid == 0 { 1 } else { grid },
        block: cfg.threads(),
        cluster: 1,
        smem_bytes: cfg.dynamic_shared_memory(),
    }
}

/// The token-dequantization launch over `ctas` CTAs (at least one).
pub const fn dequant_launch(ctas: u32) -> LaunchGeometry {
    LaunchGeometry { grid: if ctas == 0 { 1 } else { ctas }, block: DEQUANT_THREADS, cluster: 1, smem_bytes: 0 }
}

/// One group as the kernels see it (device memory, written by the host before the launch).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default, bytemuck::Pod, bytemuck::Zeroable)]
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
    /// Token rows per tile of this group ([`GemmConfig::tile_rows`]`(m)`): the wgmma N and the
    /// height of a stage's token region.
    pub block_m: u32,
    /// Token rows one load of the group's last tile brings: the box height of its token map
    /// (`tail_token_map`), [`tail_box_rows`]`(m, block_m)` — the tile's own rows, where the
    /// other tiles load `block_m`. The stage's rows past it keep older bytes, which only reach
    /// the tile's columns past `m`, never stored.
    pub tail_rows: u32,
    /// Row of the group's first token in its token map (0 when each group has its own map; the
    /// group's first row of the shared workspace map in device-sized plans, `crate::moe`).
    pub token_row: u32,
    /// Index of the group's token map in the tensor-map table ([`token_map_index`] when each group
    /// has its own map).
    pub token_map: u32,
    /// Index of the token map of the group's last tile, boxes of `tail_rows` rows
    /// ([`tail_token_map_index`] when each group has its own maps; `token_map` in device-sized
    /// plans, whose boxes are whole tiles).
    pub tail_token_map: u32,
    /// Zero.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<GroupParams>() == 88);

/// Position (0..64) in a 64-wide K chunk of the f16 token workspace where logical value `l`
/// (0..64) of the chunk is stored.
///
/// wgmma k-step `j` (physical columns `16j..16j+16`) gives thread `q` (lane % 4) the A-fragment
/// registers `2q, 2q+1` (register 0) and `2q+8, 2q+9` (register 2). Thread `q` decodes the 16
/// logical values `16q..16q+16` (one scale block: two 32-bit words of packed e2m1) into 8 f16x2
/// pairs: pair `p = 4h + k` of word `h` holds values `8h + k` (low half) and `8h + k + 4` (high
/// half), the order the shift-and-mask decoder produces them in (see the kernel's
/// `ptx::convert::e2m1x8_to_f16x2_scaled`). Pair `p` feeds k-step `p / 2`, register `2·(p % 2)`.
/// Over the four k-steps thread `q` consumes exactly scale block `q`. The tokens are stored in the
/// same order, so the dot products are unchanged.
pub const fn token_k_position(l: u32) -> u32 {
    let q = l / 16;
    let t = l % 16;
    let (h, upper, k) = (t / 8, (t % 8) / 4, t % 4);
    let p = 4 * h + k;
    16 * (p / 2) + 2 * q + 8 * (p % 2) + upper
}

/// Where the decoder's pair `k` (0..4) of packed word `w` (0..8) of a row's chunk — logical values
/// `8w + k` and `8w + k + 4` — goes in the chunk's workspace row, in units of f16 pairs (0..32):
/// [`token_k_position`]`(8w + k) / 2`. The permutation puts the two values of a pair adjacent and
/// in order (checked by the tests), so the dequantization kernel stores whole f16x2 words.
pub const fn token_pair_slot(w: u32, k: u32) -> u32 {
    token_k_position(8 * w + k) / 2
}

/// Token rows per tile of a group of `m` tokens in the [`GemmConfig::M128`] variant (what the
/// device-sized plans' scheduler uses): 16 for decode-sized groups, else 128. Each width is a
/// compiled copy of the consumer loop; ptxas keeps the MMAs of at most two widths in one function
/// pipelined (with three it serializes them, C7512), so each variant has two.
pub const fn token_tile_rows(m: u32) -> u32 {
    GemmConfig::M128.tile_rows(m)
}

/// Relative time of one token tile of `rows` rows, per stage, in token rows of MMA work: the MMA
/// grows with `rows`, the rest ([`TILE_FIXED_COST`]) does not. Orders the host's work list
/// (longest first).
pub const fn tile_cost(rows: u32) -> u32 {
    TILE_FIXED_COST + rows
}

/// The part of a tile's time per stage that does not shrink with its token rows, in token rows
/// of MMA work: on the H200 a 64-row tile took ~0.72 of a 128-row one (PERF.md #14), i.e.
/// `(F + 64) / (F + 128) ≈ 0.72`.
pub const TILE_FIXED_COST: u32 = 100;

/// [`TILE_FIXED_COST`] of an `N192` item of 3 warpgroups, in the same units (a 128-row stage of
/// `M128` costs 228): a 192-row stage costs `(140 + 192) / 228 ≈ 1.46` times a 128-row one.
/// Calibrated on the H200 by b0's and b1's times: over 90 / 111 / 140 / 170 (PERF.md #20b), over
/// 110 / 140 / 155 / 170 after the last tiles' boxes shrank (#23; 155: b1 took `M128_64`, 80.9 µs
/// against 84.0 with `N192`), and at 140 since the epilogue and decoder of #41/#42 made `N192`
/// the faster for b1 (#45: forced, 66.1 µs against `M128_64`'s 68.3, a ratio of 0.968; the model
/// gives 0.966 at 140, and b1 flips back above 149; b0 0.935 measured, 0.916 modelled). With one
/// tile per CTA (b2, b3) a 192-row stage takes only ~1.3 times as long, and the model keeps
/// `M128` there (forced `N192`: b2 38.8 µs against 29.9).
pub const N192_TILE_FIXED_COST: u32 = 140;

impl GemmConfig {
    /// Relative time per stage of a tile `width` tokens wide over `warpgroups` consumer
    /// warpgroups' rows, in [`tile_cost`] units: [`tile_cost`] for 128-row tiles and for `N192`
    /// items of fewer than three warpgroups (the idle ones leave an `M128_64`-like tile);
    /// [`N192_TILE_FIXED_COST`] plus the MMA work for three.
    pub const fn stage_cost(&self, width: u32, warpgroups: u32) -> u32 {
        if self.block_n == BLOCK_N || warpgroups < 3 {
            tile_cost(width)
        } else {
            N192_TILE_FIXED_COST + width * warpgroups / 2
        }
    }
}

/// The configuration for a problem whose groups have these token counts: the decode variant
/// ([`GemmConfig::M16`], two CTAs per SM) when every group fits one 16-token tile, else the
/// general one ([`GemmConfig::M128`], which runs 16-token tiles for the small groups among larger
/// ones). Device-sized plans (`crate::moe`) use it on their bound as is (their scheduler picks the
/// widths with [`token_tile_rows`]); host-sized plans may take [`GemmConfig::M128_64`] instead
/// where its balanced work list ends sooner.
pub fn config_for(mut m: impl Iterator<Item = u32>) -> GemmConfig {
    if m.all(|m| m <= SMALL_TILE_M) {
        GemmConfig::M16
    } else {
        GemmConfig::M128
    }
}

impl GemmConfig {
    /// The exported name of the GEMM kernel compiled for this configuration.
    pub const fn kernel_name(&self) -> &'static str {
        if self.block_m == SMALL_TILE_M {
            "sm90_grouped_gemm_decode"
        } else if self.block_n > BLOCK_N {
            "sm90_grouped_gemm_n192"
        } else if self.narrow == TAIL_TILE_M {
            "sm90_grouped_gemm_t64"
        } else {
            "sm90_grouped_gemm"
        }
    }
}

/// The narrow token tile: `wgmma m64n16k16`.
pub const SMALL_TILE_M: u32 = 16;
/// The tail tile of `M128_64`: `wgmma m64n64k16`.
pub const TAIL_TILE_M: u32 = 64;

/// Swizzle mode of a wgmma descriptor, bits 62–63 (PTX ISA §9.7.15.5.1.2.2). Not the tcgen05
/// codes (`crate::sm100::SmemSwizzle`) nor the tensor-map enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WgmmaSwizzle {
    /// Core matrices stored densely.
    None = 0,
    /// 128-byte swizzle (16-byte chunk `c` of row `r` at `c ^ (r % 8)`; TMA `SWIZZLE_128B`).
    B128 = 1,
    /// 64-byte swizzle.
    B64 = 2,
    /// 32-byte swizzle.
    B32 = 3,
}

/// Mask of the shared-memory byte address a wgmma descriptor encodes (18 bits, 16-byte units).
pub const WGMMA_ADDRESS_MASK: u32 = 0x3_FFFF;

/// Byte distance between 8-row groups of a K-major, 128-byte-swizzled tile: eight 128-byte rows.
pub const WGMMA_SBO_BYTES: u32 = 8 * 128;

/// The LBO written for K-major swizzled tiles: the PTX ISA says the field is unused there
/// ("assumed 1"); 16 bytes (field value 1) by convention.
pub const WGMMA_LBO_BYTES: u32 = 16;

/// The named fields of a [`WgmmaDesc`], in bytes where the hardware stores `bytes >> 4`.
///
/// | bits  | field                                                  |
/// |-------|--------------------------------------------------------|
/// | 0–13  | start address, `(addr & 0x3FFFF) >> 4`                 |
/// | 16–29 | leading byte offset (LBO) `>> 4`                       |
/// | 32–45 | stride byte offset (SBO) `>> 4`                        |
/// | 49–51 | base offset (0: swizzle patterns start 1024-aligned)   |
/// | 62–63 | swizzle ([`WgmmaSwizzle`])                             |
///
/// All other bits are zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WgmmaDescFields {
    /// Start of the tile in the `shared::cta` window, bytes.
    pub start_address: u32,
    /// Leading-dimension byte offset (LBO).
    pub leading_byte_offset: u32,
    /// Stride-dimension byte offset (SBO).
    pub stride_byte_offset: u32,
    /// Base offset, 3 bits.
    pub base_offset: u8,
    /// Swizzle mode.
    pub swizzle: WgmmaSwizzle,
}

const fn field14(bytes: u32) -> u64 {
    ((bytes & WGMMA_ADDRESS_MASK) >> 4) as u64 & 0x3FFF
}

impl WgmmaDescFields {
    /// Packs the fields into the 64-bit layout of the table above.
    pub const fn encode(self) -> WgmmaDesc {
        WgmmaDesc(
            field14(self.start_address)
                | (field14(self.leading_byte_offset) << 16)
                | (field14(self.stride_byte_offset) << 32)
                | (((self.base_offset & 0x7) as u64) << 49)
                | ((self.swizzle as u64) << 62),
        )
    }
}

/// A wgmma shared-memory matrix descriptor (64 bits; fields in [`WgmmaDescFields`]).
/// The raw bits leave this type only through [`WgmmaDesc::to_bits`], the PTX operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct WgmmaDesc(u64);

impl WgmmaDesc {
    /// K-major, 128-byte swizzle, 8-row groups [`WGMMA_SBO_BYTES`] apart: a tile of 128-byte rows
    /// (64 f16 of K) starting at the 1024-aligned shared address `start` (the f16 token chunks).
    pub const fn k_major_sw128(start: u32) -> Self {
        WgmmaDescFields {
            start_address: start,
            leading_byte_offset: WGMMA_LBO_BYTES,
            stride_byte_offset: WGMMA_SBO_BYTES,
            base_offset: 0,
            swizzle: WgmmaSwizzle::B128,
        }
        .encode()
    }

    /// The same tile advanced by `bytes` along K inside the swizzle atom (k-step `j` of 16 f16 is
    /// [`TOKEN_K_STEP_BYTES`]`·j` bytes): the start-address field moves, the swizzle follows the
    /// absolute address bits.
    ///
    /// Only the low word changes (the start address is bits 0–13 and stays below 2¹⁴ units of
    /// 16 bytes inside shared memory), so the sum is computed in 32 bits: the kernel then adds one
    /// 32-bit register per MMA and keeps the constant high word, instead of a 64-bit add.
    pub const fn advance(self, bytes: u32) -> Self {
        let low = (self.0 as u32).wrapping_add(bytes >> 4);
        WgmmaDesc((self.0 & !0xFFFF_FFFF) | low as u64)
    }

    /// The 64-bit operand of `wgmma.mma_async`.
    pub const fn to_bits(self) -> u64 {
        self.0
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

/// [`BLOCK_K`]-wide steps of a reduction of length `k`: the host cost model's unit of K (a
/// variant's own stages are [`GemmConfig::k_stages`]).
pub const fn k_stages(k: u32) -> u32 {
    k.div_ceil(BLOCK_K)
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
    fn dequant_slots_cover_each_pair_once() {
        // Slot j, element q holds pair j % 4 of word dequant_slot_words(j)[q], scale block q.
        let mut seen = [false; 32];
        for j in 0..DEQUANT_THREADS_PER_ITEM {
            for (q, w) in dequant_slot_words(j).into_iter().enumerate() {
                assert_eq!(token_pair_slot(w, j % 4), 4 * j + q as u32, "slot {j} element {q}");
                assert_eq!(w / 2, q as u32, "word {w} is in scale block {q}");
                assert!(!seen[(4 * w + j % 4) as usize]);
                seen[(4 * w + j % 4) as usize] = true;
            }
        }
        assert!(seen[..].iter().filter(|&&x| x).count() == 32);
        assert_eq!(DEQUANT_ITEMS_PER_CTA, 128);
        assert_eq!(dequant_ctas(96, 512), 6);
        assert_eq!(dequant_ctas(248, 7168), 217);
        assert_eq!(dequant_ctas(1024, 7168), 256);
    }

    #[test]
    fn token_pair_slots_follow_the_k_permutation() {
        let mut seen = [false; 32];
        for w in 0..8u32 {
            for k in 0..4 {
                let slot = token_pair_slot(w, k);
                // The decoder's pair (8w+k, 8w+k+4) is one f16x2 word, low value first.
                assert_eq!(token_k_position(8 * w + k), 2 * slot);
                assert_eq!(token_k_position(8 * w + k + 4), 2 * slot + 1);
                assert!(!seen[slot as usize]);
                seen[slot as usize] = true;
            }
        }
        // The consumer's fragments: pair p of thread q's block feeds k-step p/2, register 2·(p%2).
        for q in 0..4u32 {
            for p in 0..8u32 {
                let (w, k) = (2 * q + p / 4, p % 4);
                assert_eq!(2 * token_pair_slot(w, k), 16 * (p / 2) + 2 * q + 8 * (p % 2));
            }
        }
    }

    #[test]
    fn config_choice() {
        assert_eq!(config_for([4, 0, 16].into_iter()), GemmConfig::M16);
        assert_eq!(config_for([4, 17].into_iter()), GemmConfig::M128);
        assert_eq!(config_for([16].into_iter()), GemmConfig::M16);
        assert_eq!(config_for([17].into_iter()), GemmConfig::M128);
        for c in GemmConfig::ALL {
            assert!(REGISTER_CAPS.iter().any(|(name, _)| *name == c.kernel_name()), "{c:?}");
        }
        assert_eq!(GemmConfig::M16.kernel_name(), REGISTER_CAPS[2].0);
        assert_eq!(GemmConfig::M128.kernel_name(), REGISTER_CAPS[0].0);
        assert_eq!(GemmConfig::M128_64.kernel_name(), REGISTER_CAPS[1].0);
        assert_eq!(GemmConfig::N192.kernel_name(), REGISTER_CAPS[3].0);
    }

    #[test]
    fn token_tile_widths() {
        let rows = [0, 1, 8, 16, 17, 64, 128, 600].map(token_tile_rows);
        assert_eq!(rows, [16, 16, 16, 16, 128, 128, 128, 128]);
        assert_eq!(GemmConfig::M16.tile_rows(9), 16);
        assert_eq!((tile_cost(16), tile_cost(128)), (116, 228));
        // 64/128: every group has 128-row tiles; the last one runs 64 wide when its rows fit.
        let t = GemmConfig::M128_64;
        assert_eq!([1, 64, 65, 176, 200].map(|m| t.tile_rows(m)), [128; 5]);
        assert_eq!(
            [(1, 0), (64, 0), (65, 0), (176, 0), (176, 1), (192, 1), (193, 1)].map(|(m, i)| t.tile_width(m, 128, i)),
            [64, 64, 128, 128, 64, 64, 128]
        );
        let c = GemmConfig::M128;
        assert_eq!([(5, 16, 0), (17, 128, 0), (176, 128, 1)].map(|(m, b, i)| c.tile_width(m, b, i)), [16, 128, 128]);
        assert_eq!(GemmConfig::M16.tile_width(3, 16, 0), 16);
        assert_eq!(token_map(GemmConfig::M128, 5, 256).box_dims, [CHUNK_K, 16]);
        assert_eq!(tail_token_map(GemmConfig::M128, 5, 256).box_dims, [CHUNK_K, 5]);
        assert_eq!(tail_token_map(GemmConfig::M128, 200, 256).box_dims, [CHUNK_K, 72]);
        assert_eq!(token_map(GemmConfig::M128, 200, 256).box_dims, [CHUNK_K, 128]);
    }

    #[test]
    fn descriptor_fields() {
        // Start 0x400 → 0x40; LBO 16 → 1 at bit 16; SBO 1024 → 64 at bit 32; 128B swizzle → 1 at bit 62.
        let d = WgmmaDesc::k_major_sw128(0x400);
        assert_eq!(d.to_bits(), 0x40 | (1 << 16) | (64u64 << 32) | (1u64 << 62));
        assert_eq!(d.advance(TOKEN_K_STEP_BYTES).to_bits(), d.to_bits() + 2);
        // The largest start address a kernel uses stays in the low word.
        let last = WgmmaDesc::k_major_sw128(MAX_DYNAMIC_SMEM - 1024);
        assert_eq!(last.advance(3 * TOKEN_K_STEP_BYTES).to_bits(), last.to_bits() + 6);
        // Each field lands in its bits and nowhere else.
        let zero = WgmmaDescFields {
            start_address: 0,
            leading_byte_offset: 0,
            stride_byte_offset: 0,
            base_offset: 0,
            swizzle: WgmmaSwizzle::None,
        };
        assert_eq!(zero.encode().to_bits(), 0);
        assert_eq!(WgmmaDescFields { start_address: 0x3FFF0, ..zero }.encode().to_bits(), 0x3FFF);
        assert_eq!(WgmmaDescFields { start_address: 0x40000, ..zero }.encode().to_bits(), 0, "18-bit address");
        assert_eq!(WgmmaDescFields { leading_byte_offset: 0x3FFF0, ..zero }.encode().to_bits(), 0x3FFF << 16);
        assert_eq!(WgmmaDescFields { stride_byte_offset: 0x3FFF0, ..zero }.encode().to_bits(), 0x3FFFu64 << 32);
        assert_eq!(WgmmaDescFields { base_offset: 0xFF, ..zero }.encode().to_bits(), 7u64 << 49);
        for (sw, code) in [(WgmmaSwizzle::B128, 1u64), (WgmmaSwizzle::B64, 2), (WgmmaSwizzle::B32, 3)] {
            assert_eq!(WgmmaDescFields { swizzle: sw, ..zero }.encode().to_bits(), code << 62);
        }
    }

    #[test]
    fn stage_layout() {
        let c = GemmConfig::M128;
        assert_eq!(c.token_chunk_bytes(), 16384);
        assert_eq!((c.token_offset(0), c.token_offset(1)), (0, 16384));
        assert_eq!(c.weight_offset(), 32768);
        assert_eq!(c.scale_offset(), 32768 + 8192);
        assert_eq!((c.scale_block_offset(0, 0), c.scale_block_offset(0, 1)), (40960, 40960 + 512));
        assert_eq!(c.stage_bytes(), 41984);
        assert_eq!(c.stage_offset(2), 2 * 41984);
        // Ten mbarriers (80 bytes), then two epilogue buffers from the next 128-byte boundary.
        assert_eq!(c.dynamic_shared_memory(), 5 * 41984 + 128 + 2 * 8192);
        assert_eq!(c.weight_tx_bytes(1) + c.token_tx_bytes(128), 2 * (16384 + 512) + 8192);
        // The decode variant: 16-row token chunks, four per stage, two weight boxes, 26 KiB
        // stages, two CTAs per SM.
        let d = GemmConfig::M16;
        assert_eq!(d.token_chunk_bytes(), 2048);
        assert_eq!((d.weight_box_offset(0), d.weight_box_offset(1), d.scale_offset()), (8192, 16384, 24576));
        assert_eq!(d.scale_block_offset(0, 3), 24576 + 3 * 512);
        assert_eq!(d.stage_bytes(), 26 * 1024);
        assert_eq!(d.dynamic_shared_memory(), 4 * 26 * 1024 + 128 + 2 * 16 * 128);
        assert_eq!(d.weight_tx_bytes(1) + d.token_tx_bytes(16), 4 * (2048 + 512) + 2 * 8192);
        assert!(2 * (d.dynamic_shared_memory() + SMEM_RESERVED_PER_BLOCK) <= SMEM_PER_SM);
        assert_eq!(gemm_launch(d, 10_000, 132).grid, 264);
        assert_eq!(gemm_launch(c, 10_000, 132).grid, 132);
        assert_eq!(DECODE_MAX_REGISTERS, 96);
        assert_eq!(gemm_launch(d, 10, 132).block, 320);
        // Thread roles: producer first in the general variant, last in the decode one.
        assert_eq!(c.consumer_thread(5), None);
        assert_eq!(c.consumer_thread(128), Some((0, 0)));
        assert_eq!(c.consumer_thread(383), Some((1, 127)));
        assert_eq!(d.consumer_thread(0), Some((0, 0)));
        assert_eq!(d.consumer_thread(255), Some((1, 127)));
        assert_eq!(d.consumer_thread(256), None);
        assert_eq!(
            (c.producer_role(0), c.producer_role(32)),
            (Some(ProducerRole::Weights), Some(ProducerRole::Tokens))
        );
        assert_eq!(
            (d.producer_role(256), d.producer_role(288)),
            (Some(ProducerRole::Weights), Some(ProducerRole::Tokens))
        );
        assert_eq!(
            (c.producer_role(1), c.producer_role(128), d.producer_role(0), d.producer_role(289)),
            (None, None, None, None)
        );
        assert_eq!((c.consumer_thread(32), d.consumer_thread(288)), (None, None));
        assert_eq!((PRODUCER_REGISTERS, CONSUMER_REGISTERS), (40, 232));
        assert_eq!((c.weight_tx_bytes(1), c.token_tx_bytes(16)), (2 * 512 + 8192, 2 * 16 * 128));
        assert!(c.dynamic_shared_memory() <= MAX_DYNAMIC_SMEM);
    }

    #[test]
    fn n192_layout() {
        let w = GemmConfig::N192;
        // A producer warpgroup and three consumer warpgroups: 512 threads of 128 registers; the
        // producer gives back all but 32, the consumers take 160 (4 warps per scheduler:
        // 32·32 + 3·160·32 = 16384).
        assert_eq!((w.consumer_warpgroups(), w.threads(), w.max_registers()), (3, 512, 128));
        assert_eq!((w.producer_registers(), w.consumer_registers()), (32, 160));
        assert!(32 * (w.producer_registers() + 3 * w.consumer_registers()) <= 16384);
        assert_eq!(
            (w.consumer_thread(127), w.consumer_thread(128), w.consumer_thread(511)),
            (None, Some((0, 0)), Some((2, 127)))
        );
        // Stage: tokens 2 × 16 KiB, weights 192 × 64, scales [slot][chunk] 4 × 512: 46 KiB.
        assert_eq!((w.weight_offset(), w.scale_offset()), (32768, 32768 + 12288));
        assert_eq!(
            [(0, 0), (0, 1), (1, 0), (1, 1)].map(|(s, c)| w.scale_block_offset(s, c)),
            [45056, 45568, 46080, 46592]
        );
        assert_eq!(w.stage_bytes(), 46 * 1024);
        assert_eq!(w.dynamic_shared_memory(), 4 * 46 * 1024 + 128 + 3 * 8192);
        assert_eq!(w.weight_tx_bytes(2) + w.token_tx_bytes(128), 2 * (16384 + 1024) + 12288);
        assert_eq!(w.empty_barrier_arrivals(), 384);
        // Spans: 128-row ones first, 192-row ones, then the rest; the scale blocks they touch.
        // (count, the first eight as (first, warpgroups), warpgroups in all).
        let spans = |n, twos| {
            let (mut count, mut first, mut total) = (0, [(0, 0); 8], 0);
            for s in RowSpan::split(n, twos) {
                if count < 8 {
                    first[count] = (s.first, s.warpgroups);
                }
                count += 1;
                total += s.warpgroups;
            }
            (count, first, total)
        };
        let (count, _, total) = spans(4096, 0);
        assert_eq!((count, total), (22, 64));
        let (count, first, total) = spans(4096, 2);
        assert_eq!((count, total), (22, 64));
        assert_eq!(first[..3], [(0, 2), (2, 2), (4, 3)]);
        assert_eq!((spans(136, 0).0, spans(136, 0).1[0]), (1, (0, 3)));
        assert_eq!(spans(136, 5).0, 2);
        assert_eq!(spans(136, 5).1[..2], [(0, 2), (2, 1)]);
        assert_eq!(spans(392, 1).1[..3], [(0, 2), (2, 3), (5, 2)]);
        assert_eq!(spans(72, 0).1[0], (0, 2));
        for s in [(0, 3), (1, 3), (2, 2), (3, 1)].map(|(first, warpgroups)| RowSpan { first, warpgroups }) {
            assert_eq!(RowSpan::decode(s.encode()), s);
        }
        let span = |first, warpgroups| RowSpan { first, warpgroups };
        assert_eq!([span(0, 3), span(1, 3), span(2, 2), span(1, 1)].map(|s| s.first_scale_block()), [0, 0, 1, 0]);
        assert_eq!(
            [(span(0, 3), 4096), (span(1, 3), 4096), (span(1, 1), 4096), (span(63, 1), 4096), (span(0, 3), 100)]
                .map(|(s, n)| s.scale_blocks(n)),
            [2, 2, 1, 1, 1]
        );
        assert_eq!(weight_map_for(w, 4096, 256).box_dims, [WEIGHT_ROW_BYTES, 192]);
        assert_eq!(weight_map_for(GemmConfig::M128, 4096, 256), weight_map(4096, 256));
        // Widths as M128_64; a tile costs more than a 128-row one, about one and a half (as
        // calibrated: slightly more per weight row since #23, its gain is in the balance).
        assert_eq!([(176, 1), (65, 0)].map(|(m, i)| w.tile_width(m, 128, i)), [64, 128]);
        assert!(w.stage_cost(128, 3) > tile_cost(128) && 5 * w.stage_cost(128, 3) < 8 * tile_cost(128));
        assert_eq!((w.stage_cost(128, 2), GemmConfig::M128_64.stage_cost(64, 1)), (tile_cost(128), tile_cost(64)));
    }

    /// The consumers take a chunk's scale words as chunk 0's plus `c · SCALE_BLOCK_BYTES` (one
    /// offset per thread, computed once per tile), and the weight producer fills a K tail's
    /// second chunk from the first block: a slot's chunks must be adjacent blocks.
    #[test]
    fn scale_blocks_of_a_slot_are_adjacent() {
        for cfg in GemmConfig::ALL {
            for slot in 0..cfg.scale_slots() {
                for c in 0..cfg.chunks {
                    assert_eq!(
                        cfg.scale_block_offset(slot, c),
                        cfg.scale_block_offset(slot, 0) + c * SCALE_BLOCK_BYTES
                    );
                }
            }
            // A full stage's credited bytes are exactly the regions its copies fill.
            let filled = cfg.scale_block_offset(cfg.scale_slots(), 0);
            assert_eq!(cfg.weight_tx_bytes(cfg.scale_slots()) + cfg.token_tx_bytes(cfg.block_m), filled);
        }
    }

    #[test]
    fn barrier_offsets() {
        let c = GemmConfig::M128;
        assert_eq!(c.full_barrier_offset(0), 5 * 41984);
        assert_eq!(c.full_barrier_offset(4), 5 * 41984 + 32);
        assert_eq!(c.empty_barrier_offset(0), 5 * 41984 + 40);
        assert_eq!(c.empty_barrier_offset(4) + MBARRIER_BYTES, 5 * 41984 + 80);
        assert_eq!(c.epilogue_buffer_offset(0), 5 * 41984 + 128);
        assert_eq!((c.full_barrier_arrivals(), c.empty_barrier_arrivals()), (2, 256));
    }

    #[test]
    fn registers_and_threads() {
        assert_eq!(THREADS, 384);
        assert_eq!(MAX_REGISTERS, 168);
    }

    /// The consumers' 8-byte reads undo the 64-byte swizzle: together they read every byte of the
    /// weight box once, and each read is the logical 8 bytes `32·chunk + 8·q` of its row.
    #[test]
    fn weight_fragments_undo_the_64b_swizzle() {
        let swizzle64 = |row: u32, logical: u32| row * 64 + (((logical / 16) ^ ((row / 2) % 4)) * 16) + logical % 16;
        let mut seen = [false; (BLOCK_N * WEIGHT_ROW_BYTES / 8) as usize];
        for row in 0..BLOCK_N {
            for chunk in 0..CHUNKS_PER_BOX {
                for q in 0..4 {
                    let o = weight_fragment_offset(row, chunk, q);
                    assert_eq!(o % 8, 0);
                    assert_eq!(o, swizzle64(row, 32 * chunk + 8 * q));
                    assert!(!seen[o as usize / 8]);
                    seen[o as usize / 8] = true;
                }
            }
        }
        assert!(seen.iter().all(|&s| s));
    }

    /// The epilogue buffer: every (row, chunk) has its own 16 bytes inside the buffer; the 8 rows
    /// of one `stmatrix` matrix (rows `8i..8i+8`, one chunk) and the 8 chunks of one row (a
    /// quarter warp's 16-byte loads) each cover the 32 banks once; the buffers fit the variants'
    /// shared memory after the barriers.
    #[test]
    fn epilogue_buffer_slots_are_distinct_and_conflict_free() {
        const BYTES: u32 = EPILOGUE_ROWS * EPILOGUE_ROW_BYTES;
        let mut seen = [false; (BYTES / 16) as usize];
        for row in 0..EPILOGUE_ROWS {
            for chunk in 0..8 {
                let o = epilogue_slot(row, chunk);
                assert!(o % 16 == 0 && o + 16 <= BYTES);
                // Rows below r stay below r · 128 bytes: a buffer of fewer rows holds its own.
                assert!(o / EPILOGUE_ROW_BYTES == row);
                assert!(!core::mem::replace(&mut seen[(o / 16) as usize], true), "row {row} chunk {chunk}");
            }
        }
        let quads = |slots: &mut dyn Iterator<Item = u32>| slots.fold(0u32, |m, o| m | 1 << (o / 16 % 8));
        for i in 0..EPILOGUE_ROWS / 8 {
            for chunk in 0..8 {
                let rows = &mut (8 * i..8 * i + 8).map(|r| epilogue_slot(r, chunk));
                assert_eq!(quads(rows), 0xFF, "rows {i}, chunk {chunk}");
            }
        }
        for row in 0..EPILOGUE_ROWS {
            assert_eq!(quads(&mut (0..8).map(|c| epilogue_slot(row, c))), 0xFF, "row {row}");
        }
        for c in GemmConfig::ALL {
            assert_eq!(c.epilogue_rows(), c.block_m.min(EPILOGUE_ROWS));
            assert!(c.epilogue_offset() >= c.empty_barrier_offset(c.stages) && c.epilogue_offset() % 128 == 0);
            assert_eq!(
                c.dynamic_shared_memory(),
                c.epilogue_offset() + c.consumer_warpgroups() * c.epilogue_buffer_bytes()
            );
            assert!(c.is_valid(), "{c:?}: {} bytes", c.dynamic_shared_memory());
        }
        assert_eq!(GemmConfig::N192.dynamic_shared_memory(), 4 * 46 * 1024 + 128 + 3 * 8192);
        assert_eq!(GemmConfig::M16.epilogue_buffer_bytes(), 16 * 128);
    }

    /// Every half-warp's 8-byte weight loads (lane groups 0–3 or 4–7, four lanes `q` each, rows
    /// `16w + lane_group_row(g)` and `+ 8`) touch 32 distinct banks, in every chunk: one shared
    /// wavefront per half-warp. The rows are a permutation of the warp's 16, pairs kept.
    #[test]
    fn half_warps_read_weights_without_bank_conflicts() {
        let mut rows = [0u32; 8];
        for (g, r) in rows.iter_mut().enumerate() {
            *r = lane_group_row(g as u32);
        }
        assert!((0..8).all(|g| lane_group_row(g) ^ 1 == lane_group_row(g ^ 1)));
        rows.sort_unstable();
        assert_eq!(rows, [0, 1, 2, 3, 4, 5, 6, 7]);
        for warp in 0..4 {
            for plus8 in [0, 8] {
                for chunk in 0..CHUNKS_PER_BOX {
                    for half in 0..2 {
                        let mut banks = [0u32; 32];
                        for g in 4 * half..4 * half + 4 {
                            for q in 0..4 {
                                let o = weight_fragment_offset(16 * warp + lane_group_row(g) + plus8, chunk, q);
                                banks[(o / 4 % 32) as usize] += 1;
                                banks[(o / 4 % 32 + 1) as usize] += 1;
                            }
                        }
                        assert!(
                            banks.iter().all(|&b| b == 1),
                            "warp {warp} +{plus8} chunk {chunk} half {half}: {banks:?}"
                        );
                    }
                }
            }
        }
        // The identity (the layout before) conflicts: rows r and r + 2 use the same 8 banks.
        let banks = |row| (0..4).fold(0u32, |m, q| m | 3 << (weight_fragment_offset(row, 0, q) / 4 % 32));
        assert_eq!((banks(0), banks(2)), (0xFF, 0xFF));
    }

    #[test]
    fn scale_words_are_the_blocked_layout() {
        for row in 0..BLOCK_N {
            assert_eq!(scale_word_offset(row) as usize, crate::scale_layout::blocked_word_offset(row, 0, 1));
        }
    }

    #[test]
    fn maps_and_launches() {
        assert_eq!((token_map_index(3), weight_map_index(3)), (6, 7));
        let t = token_map(GemmConfig::M128, 96, 512);
        assert_eq!((t.dims, t.strides_bytes, t.box_dims), ([512, 96], [1024, 0], [64, 128]));
        assert_eq!(
            (t.element, t.swizzle, t.l2_promotion),
            (TensorMapDataType::F16, TensorMapSwizzle::B128, L2_PROMOTION)
        );
        let w = weight_map(256, 512);
        assert_eq!((w.dims, w.strides_bytes, w.box_dims), ([256, 256], [256, 0], [64, 128]));
        assert_eq!((w.element, w.swizzle), (TensorMapDataType::U8, TensorMapSwizzle::B64));
        let c = GemmConfig::M128;
        assert_eq!(
            gemm_launch(c, 6, 132),
            LaunchGeometry { grid: 6, block: 384, cluster: 1, smem_bytes: c.dynamic_shared_memory() }
        );
        assert_eq!(gemm_launch(c, 1000, 132).grid, 132);
        assert_eq!(gemm_launch(c, 0, 132).grid, 1);
        assert_eq!(dequant_launch(0), LaunchGeometry { grid: 1, block: 256, cluster: 1, smem_bytes: 0 });
        assert_eq!(k_stages(320), 3);
    }

    #[test]
    fn chunk_counts() {
        let (two, four) = (GemmConfig::M128, GemmConfig::M16);
        assert_eq!((two.chunks, four.chunks), (2, 4));
        assert_eq!([(256, 0), (320, 2), (7168, 55), (192, 1)].map(|(k, ks)| two.valid_chunks(k, ks)), [2, 1, 2, 1]);
        assert_eq!(
            [(256, 0), (320, 1), (7168, 27), (192, 0), (384, 1)].map(|(k, ks)| four.valid_chunks(k, ks)),
            [4, 1, 4, 3, 2]
        );
        assert_eq!([64, 256, 320, 7168].map(|k| four.k_stages(k)), [1, 1, 2, 28]);
        assert_eq!([64, 256, 320, 7168].map(|k| two.k_stages(k)), [1, 2, 3, 56]);
        // Two weight boxes side by side, each 1024-byte aligned (the 64-byte swizzle's pattern
        // repeats every 512 bytes).
        assert_eq!(four.weight_box_offset(1) - four.weight_box_offset(0), BLOCK_N * WEIGHT_ROW_BYTES);
        assert_eq!((four.weight_box_offset(0) % 1024, four.weight_box_offset(1) % 1024), (0, 0));
        assert_eq!((four.stage_bytes(), four.stages), (26 * 1024, 4));
    }
    /// The last tile's box covers exactly its rows;
    /// the tail maps sit after all token and weight maps, each index once.
    #[test]
    fn tail_boxes_cover_the_last_tile() {
        for block_m in [16, 128] {
            for m in 1..=600 {
                let rows = m - (m_tiles(m, block_m) - 1) * block_m;
                let b = tail_box_rows(m, block_m);
                assert!(b == rows && b <= block_m, "m {m} block_m {block_m}");
            }
        }
        assert_eq!((tail_box_rows(4, 16), tail_box_rows(16, 16), tail_box_rows(176, 128)), (4, 16, 48));
        assert_eq!((tail_box_rows(128, 128), tail_box_rows(0, 128)), (128, 8));
        let groups = 5;
        let mut seen = [false; map_count(5)];
        for g in 0..groups {
            for i in [token_map_index(g), weight_map_index(g), tail_token_map_index(g, groups)] {
                assert!(i < map_count(groups) && !seen[i], "group {g} index {i}");
                seen[i] = true;
            }
        }
    }
}
