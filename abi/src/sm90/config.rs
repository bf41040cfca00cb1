//! What a GEMM variant's configuration ([`GemmConfig`]) determines: tile shape, pipeline depth,
//! thread roles, register shares, the shared-memory map (stages, mbarriers, epilogue buffers) and
//! the bytes each stage's copies credit to its barrier; the tile counts of a group. The compiled
//! variants themselves are [`super::variants`]'s.

use crate::launch::{MAX_DYNAMIC_SMEM, MBARRIER_BYTES, REGISTERS_PER_SM, SMEM_PER_SM, SMEM_RESERVED_PER_BLOCK};
use crate::scale_layout::BLOCK_BYTES as SCALE_BLOCK_BYTES;

/// Weight rows (N) per CTA tile: two consumer warpgroups of 64 rows (wgmma M = 64) each.
pub const BLOCK_N: u32 = 128;
/// Weight rows per consumer warpgroup.
pub const WG_ROWS: u32 = 64;
/// Consumer warpgroups per CTA.
pub const CONSUMER_WARPGROUPS: u32 = BLOCK_N / WG_ROWS;
/// K values per weight box: a 64-byte row of packed weights (64-byte swizzle), two chunks. A
/// stage holds one box (two chunks) or, in the decode variant, two ([`GemmConfig::chunks`]); the
/// host's cost model counts K in units of this.
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

/// The narrow token tile: `wgmma m64n16k16`.
pub const SMALL_TILE_M: u32 = 16;
/// The tail tile of `T64`: `wgmma m64n64k16`.
pub const TAIL_TILE_M: u32 = 64;

/// Registers per thread the producer warpgroup keeps after `setmaxnreg.dec` (one thread issues
/// copies; 40 is plenty).
pub const PRODUCER_REGISTERS: u32 = 40;

/// Most token rows of C a consumer warpgroup passes through its epilogue buffer at once (a
/// 128-token tile in two rounds; the decode variant's 16-token tiles in one, its buffer sized to
/// them: [`GemmConfig::epilogue_rows`]).
pub const EPILOGUE_ROWS: u32 = 64;
/// Bytes of one token row of a warpgroup's epilogue buffer: its 64 weights, 2 bytes each, as eight
/// 16-byte chunks of 8 weights ([`epilogue_slot`](super::epilogue_slot) places them).
pub const EPILOGUE_ROW_BYTES: u32 = WG_ROWS * 2;

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
    /// The variant's narrower wgmma N: 16 (whole groups of at most 16 tokens, `GENERAL`), 64 (the
    /// last tile of a group whose last rows fit 64, `T64`); equal to `block_m` when the variant
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
    /// leave of the SM's [`REGISTERS_PER_SM`], rounded down to 8.
    pub const fn max_registers(&self) -> u32 {
        REGISTERS_PER_SM / (self.ctas_per_sm() * self.threads()) / 8 * 8
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
    /// the pitch of its tiles and the height of a stage's token region): `GENERAL` 16 for
    /// `m ≤ 16`, else 128; `T64` and `N192` 128; the decode variant 16.
    pub const fn tile_rows(&self, m: u32) -> u32 {
        if m <= self.narrow && self.narrow == SMALL_TILE_M {
            self.narrow
        } else {
            self.block_m
        }
    }

    /// The wgmma N of token tile `tile_m` of a group of `m` tokens whose tiles have `block_m`
    /// rows: `narrow` for a whole narrow group (`block_m == narrow`) and, in `T64` and `N192`,
    /// for the group's last tile when its rows fit 64 (its box loads only those rows,
    /// [`tail_box_rows`](super::tail_box_rows)); else `block_m`.
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
    /// have `block_m` rows (the group's, or [`GroupParams::tail_rows`](super::GroupParams::tail_rows)):
    /// every chunk's box (a K tail's chunks past K lie wholly outside the tensor: zeros, counted in
    /// full).
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

    /// `self == other` where a constant needs it (`PartialEq` is not `const`): every field equal.
    pub const fn same_as(&self, other: &GemmConfig) -> bool {
        let GemmConfig { block_m, narrow, stages, block_n, chunks } = *other;
        self.block_m == block_m
            && self.narrow == narrow
            && self.stages == stages
            && self.block_n == block_n
            && self.chunks == chunks
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_tile_widths() {
        let rows = [0, 1, 8, 16, 17, 64, 128, 600].map(|m| GemmConfig::GENERAL.tile_rows(m));
        assert_eq!(rows, [16, 16, 16, 16, 128, 128, 128, 128]);
        assert_eq!(GemmConfig::DECODE.tile_rows(9), 16);
        // 64/128: every group has 128-row tiles; the last one runs 64 wide when its rows fit.
        let t = GemmConfig::T64;
        assert_eq!([1, 64, 65, 176, 200].map(|m| t.tile_rows(m)), [128; 5]);
        assert_eq!(
            [(1, 0), (64, 0), (65, 0), (176, 0), (176, 1), (192, 1), (193, 1)].map(|(m, i)| t.tile_width(m, 128, i)),
            [64, 64, 128, 128, 64, 64, 128]
        );
        let c = GemmConfig::GENERAL;
        assert_eq!([(5, 16, 0), (17, 128, 0), (176, 128, 1)].map(|(m, b, i)| c.tile_width(m, b, i)), [16, 128, 128]);
        assert_eq!(GemmConfig::DECODE.tile_width(3, 16, 0), 16);
    }

    #[test]
    fn stage_layout() {
        let c = GemmConfig::GENERAL;
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
        let d = GemmConfig::DECODE;
        assert_eq!(d.token_chunk_bytes(), 2048);
        assert_eq!((d.weight_box_offset(0), d.weight_box_offset(1), d.scale_offset()), (8192, 16384, 24576));
        assert_eq!(d.scale_block_offset(0, 3), 24576 + 3 * 512);
        assert_eq!(d.stage_bytes(), 26 * 1024);
        assert_eq!(d.dynamic_shared_memory(), 4 * 26 * 1024 + 128 + 2 * 16 * 128);
        assert_eq!(d.weight_tx_bytes(1) + d.token_tx_bytes(16), 4 * (2048 + 512) + 2 * 8192);
        assert!(2 * (d.dynamic_shared_memory() + SMEM_RESERVED_PER_BLOCK) <= SMEM_PER_SM);
        assert_eq!((d.ctas_per_sm(), d.threads()), (2, 320));
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
        // Widths as T64.
        assert_eq!([(176, 1), (65, 0)].map(|(m, i)| w.tile_width(m, 128, i)), [64, 128]);
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
        let c = GemmConfig::GENERAL;
        assert_eq!(c.full_barrier_offset(0), 5 * 41984);
        assert_eq!(c.full_barrier_offset(4), 5 * 41984 + 32);
        assert_eq!(c.empty_barrier_offset(0), 5 * 41984 + 40);
        assert_eq!(c.empty_barrier_offset(4) + MBARRIER_BYTES, 5 * 41984 + 80);
        assert_eq!(c.epilogue_buffer_offset(0), 5 * 41984 + 128);
        assert_eq!((c.full_barrier_arrivals(), c.empty_barrier_arrivals()), (2, 256));
    }

    #[test]
    fn chunk_counts() {
        let (two, four) = (GemmConfig::GENERAL, GemmConfig::DECODE);
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
}
