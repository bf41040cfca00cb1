//! The TMA bandwidth kernel (`xfer_tma_bandwidth`, sm_90a): how fast 2D TMA tile loads reach an
//! SM's shared memory, from L2 (a buffer that stays in the 60 MB L2) or from DRAM (a buffer many
//! times larger), with the sm_90a GEMM's box shapes and a stage ring like its producer's. The
//! consumers only wait for each stage and release it (reading one word per box), so the rate is
//! the copy engine's and the memory system's, not a kernel's. `nvfp4-bench` reports it among the
//! measured ceilings.
//!
//! The work: a `rows × row_bytes` tensor cut into `tiles` boxes, numbered along the rows first
//! (box `i` is box column `i % tiles_x` of box row `i / tiles_x`). The grid issues `loads` stage
//! loads of `boxes_per_stage` consecutive boxes each, wrapping around the tensor; load `l` is
//! CTA `l % grid`'s (grid-stride), so at any time the CTAs read neighbouring boxes.

use nvfp4_gemm_abi::launch::{LaunchGeometry, MAX_DYNAMIC_SMEM};
use nvfp4_gemm_abi::sm90::{token_map_with_box, weight_map, BLOCK_N, CHUNK_K, WEIGHT_ROW_BYTES};
use nvfp4_gemm_abi::tensor_map::TiledMap;

/// The kernel's exported name.
pub const TMA_BANDWIDTH_KERNEL: &str = "xfer_tma_bandwidth";

/// Stages of the ring.
pub const TMA_BW_STAGES: u32 = 6;
/// Largest stage (bytes): `boxes_per_stage · box_bytes` may not exceed it.
pub const TMA_BW_MAX_STAGE_BYTES: u32 = 32 * 1024;
/// Bytes before the stages in dynamic shared memory: the full and empty barriers (the stages stay
/// 1024-byte aligned, as the 128-byte swizzle needs).
pub const TMA_BW_BARRIER_BYTES: u32 = 1024;
/// Consumer warps (warps 1..; warp 0's lane 0 is the producer).
pub const TMA_BW_CONSUMER_WARPS: u32 = 4;
/// Consumer threads: each waits for every stage.
pub const TMA_BW_CONSUMER_THREADS: u32 = 32 * TMA_BW_CONSUMER_WARPS;
/// Arrivals that release a stage: lane 0 of each consumer warp (the only thread that reads a
/// stage is lane 0 of the first, so no other thread's reads need ordering before the refill).
pub const TMA_BW_EMPTY_ARRIVALS: u32 = TMA_BW_CONSUMER_WARPS;
/// Threads per CTA: a producer warp and the consumer warps.
pub const TMA_BW_THREADS: u32 = 32 + TMA_BW_CONSUMER_THREADS;
/// Words each CTA writes to `out`: boxes received, wrapping sum of the first word of each box.
pub const TMA_BW_OUT_WORDS: u32 = 2;
/// `out` word: boxes the CTA received.
pub const TMA_BW_OUT_BOXES: u32 = 0;
/// `out` word: wrapping sum of each received box's first 32-bit word in shared memory (the box's
/// first 16 bytes are not moved by any swizzle).
pub const TMA_BW_OUT_WORD_SUM: u32 = 1;

const _: () = assert!(2 * 8 * TMA_BW_STAGES <= TMA_BW_BARRIER_BYTES);
const _: () = assert!(tma_bandwidth_launch(1).smem_bytes <= MAX_DYNAMIC_SMEM);

/// The kernel's one parameter, by value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct TmaBandwidthParams {
    /// The tensor map of the buffer ([`TmaBox::map`]) in global memory (64-byte aligned).
    pub map: u64,
    /// Output: [`TMA_BW_OUT_WORDS`] `u32` per CTA.
    pub out: u64,
    /// Box extent along the rows (the map's innermost coordinate, elements).
    pub box_cols: u32,
    /// Box extent across the rows.
    pub box_rows: u32,
    /// Boxes along a row of the tensor.
    pub tiles_x: u32,
    /// Boxes in the tensor.
    pub tiles: u32,
    /// Bytes of one box in shared memory (a multiple of 1024).
    pub box_bytes: u32,
    /// Boxes per stage (consecutive in the walk, one TMA each, all on the stage's full barrier).
    pub boxes_per_stage: u32,
    /// `boxes_per_stage · box_bytes`: a stage's bytes and the distance between stages.
    pub stage_bytes: u32,
    /// Stage loads by the whole grid.
    pub loads: u32,
}

const _: () = assert!(core::mem::size_of::<TmaBandwidthParams>() == 48);

impl TmaBandwidthParams {
    /// The box coordinates (innermost element, row) of box `b` of stage load `load`.
    /// (Zero extents, which [`TmaBandwidthCase::check`] rules out, give 0 instead of a panic, so
    /// that the kernel has no panic path.)
    pub const fn box_coords(&self, load: u32, b: u32) -> [i32; 2] {
        if self.tiles == 0 || self.tiles_x == 0 {
            return [0, 0];
        }
        let i = (load * self.boxes_per_stage + b) % self.tiles;
        let (x, y) = (i % self.tiles_x, i / self.tiles_x);
        [(x * self.box_cols) as i32, (y * self.box_rows) as i32]
    }

    /// Stage loads of CTA `cta` in a grid of `grid`.
    pub const fn loads_of_cta(&self, cta: u32, grid: u32) -> u32 {
        if cta < self.loads {
            (self.loads - cta - 1) / grid + 1
        } else {
            0
        }
    }

    /// Bytes one launch moves into shared memory.
    pub const fn bytes(&self) -> u64 {
        self.loads as u64 * self.stage_bytes as u64
    }
}

/// The box shapes of the sm_90a GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TmaBox {
    /// A token chunk: f16, 64 × 128 rows, 128-byte swizzle (16 KiB), over rows of
    /// [`TOKEN_ROW_ELEMENTS`] f16 (the GEMM's token map, `sm90::token_map_with_box`).
    TokenF16,
    /// A weight tile: 64 bytes × 128 rows, 64-byte swizzle (8 KiB), over rows of
    /// [`WEIGHT_ROW_BYTES_TOTAL`] bytes (the GEMM's weight map, `sm90::weight_map`).
    WeightU8,
}

/// f16 elements per row of the [`TmaBox::TokenF16`] tensor (a K of 4096: rows of 8 KiB).
pub const TOKEN_ROW_ELEMENTS: u32 = 4096;
/// Bytes per row of the [`TmaBox::WeightU8`] tensor (packed e2m1 of a K of 8192).
pub const WEIGHT_ROW_BYTES_TOTAL: u32 = 4096;

impl TmaBox {
    /// Both shapes.
    pub const ALL: [TmaBox; 2] = [TmaBox::TokenF16, TmaBox::WeightU8];

    /// A short description for reports.
    pub const fn name(self) -> &'static str {
        match self {
            TmaBox::TokenF16 => "f16 64x128 sw128",
            TmaBox::WeightU8 => "u8 64x128 sw64",
        }
    }

    /// Bytes of one row of the tensor.
    pub const fn row_bytes(self) -> u32 {
        match self {
            TmaBox::TokenF16 => 2 * TOKEN_ROW_ELEMENTS,
            TmaBox::WeightU8 => WEIGHT_ROW_BYTES_TOTAL,
        }
    }

    /// Box extent along a row (elements) and across rows.
    pub const fn box_dims(self) -> [u32; 2] {
        match self {
            TmaBox::TokenF16 => [CHUNK_K, BLOCK_N],
            TmaBox::WeightU8 => [WEIGHT_ROW_BYTES, BLOCK_N],
        }
    }

    /// Bytes of one element.
    pub const fn element_bytes(self) -> u32 {
        match self {
            TmaBox::TokenF16 => 2,
            TmaBox::WeightU8 => 1,
        }
    }

    /// Bytes of one box.
    pub const fn box_bytes(self) -> u32 {
        let [c, r] = self.box_dims();
        c * r * self.element_bytes()
    }

    /// Rows of the tensor over `buffer_bytes` (whole boxes only: a multiple of the box height).
    pub const fn rows(self, buffer_bytes: u64) -> u32 {
        let box_rows = self.box_dims()[1] as u64;
        (buffer_bytes / self.row_bytes() as u64 / box_rows * box_rows) as u32
    }

    /// The tensor map over the first `rows` rows of a buffer (the GEMM's map of this box shape).
    pub const fn map(self, rows: u32) -> TiledMap<2> {
        match self {
            TmaBox::TokenF16 => token_map_with_box(rows, TOKEN_ROW_ELEMENTS, BLOCK_N),
            TmaBox::WeightU8 => weight_map(rows, 2 * WEIGHT_ROW_BYTES_TOTAL),
        }
    }
}

/// One measurement: a box shape, how many boxes per stage, the buffer and the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TmaBandwidthCase {
    /// The box shape.
    pub shape: TmaBox,
    /// Boxes per stage.
    pub boxes_per_stage: u32,
    /// Bytes of the buffer the boxes walk (whole rows of whole boxes are used).
    pub buffer_bytes: u64,
    /// Stage loads by the whole grid.
    pub loads: u32,
}

impl TmaBandwidthCase {
    /// The case that moves about `total_bytes` over a `buffer_bytes` buffer, the loads rounded up
    /// to a multiple of `grid` (every CTA does the same work).
    pub const fn sized(shape: TmaBox, boxes_per_stage: u32, buffer_bytes: u64, total_bytes: u64, grid: u32) -> Self {
        let stage = (boxes_per_stage * shape.box_bytes()) as u64;
        let loads = total_bytes.div_ceil(stage).div_ceil(grid as u64) * grid as u64;
        TmaBandwidthCase { shape, boxes_per_stage, buffer_bytes, loads: loads as u32 }
    }

    /// Rows of the tensor.
    pub const fn rows(&self) -> u32 {
        self.shape.rows(self.buffer_bytes)
    }

    /// The tensor map (over the buffer's first [`Self::rows`] rows).
    pub const fn map(&self) -> TiledMap<2> {
        self.shape.map(self.rows())
    }

    /// Bytes of the tensor the boxes walk.
    pub const fn tensor_bytes(&self) -> u64 {
        self.rows() as u64 * self.shape.row_bytes() as u64
    }

    /// Bytes in flight per CTA when every stage is loading.
    pub const fn bytes_in_flight(&self) -> u32 {
        TMA_BW_STAGES * self.boxes_per_stage * self.shape.box_bytes()
    }

    /// Why the case cannot run, if it cannot.
    pub const fn check(&self) -> Result<(), &'static str> {
        let stage = self.boxes_per_stage as u64 * self.shape.box_bytes() as u64;
        if self.boxes_per_stage == 0 || stage > TMA_BW_MAX_STAGE_BYTES as u64 {
            return Err("boxes per stage: at least 1, at most TMA_BW_MAX_STAGE_BYTES per stage");
        }
        if self.rows() == 0 {
            return Err("the buffer holds no row of boxes");
        }
        if self.loads == 0 || self.loads as u64 * self.boxes_per_stage as u64 > u32::MAX as u64 {
            return Err("loads: at least 1, and loads · boxes per stage below 2^32");
        }
        Ok(())
    }

    /// The kernel's parameters with the map at `map` and the output at `out` (call
    /// [`Self::check`] first).
    pub const fn params(&self, map: u64, out: u64) -> TmaBandwidthParams {
        let [box_cols, box_rows] = self.shape.box_dims();
        let tiles_x = self.shape.row_bytes() / (box_cols * self.shape.element_bytes());
        let box_bytes = self.shape.box_bytes();
        TmaBandwidthParams {
            map,
            out,
            box_cols,
            box_rows,
            tiles_x,
            tiles: tiles_x * (self.rows() / box_rows),
            box_bytes,
            boxes_per_stage: self.boxes_per_stage,
            stage_bytes: self.boxes_per_stage * box_bytes,
            loads: self.loads,
        }
    }
}

/// The launch: `grid` CTAs of [`TMA_BW_THREADS`], shared memory for [`TMA_BW_STAGES`] stages of
/// the largest size (one CTA per SM, whatever the case).
pub const fn tma_bandwidth_launch(grid: u32) -> LaunchGeometry {
    LaunchGeometry {
        grid,
        block: TMA_BW_THREADS,
        cluster: 1,
        smem_bytes: TMA_BW_BARRIER_BYTES + TMA_BW_STAGES * TMA_BW_MAX_STAGE_BYTES,
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use nvfp4_gemm_abi::tensor_map::{TensorMapDataType, TensorMapSwizzle};

    #[test]
    fn boxes_are_the_gemms() {
        assert_eq!(TmaBox::TokenF16.box_bytes(), 16 * 1024);
        assert_eq!(TmaBox::WeightU8.box_bytes(), 8 * 1024);
        let t = TmaBox::TokenF16.map(256);
        assert_eq!((t.element, t.swizzle, t.box_dims), (TensorMapDataType::F16, TensorMapSwizzle::B128, [64, 128]));
        assert_eq!((t.dims, t.strides_bytes), ([4096, 256], [8192, 0]));
        let w = TmaBox::WeightU8.map(384);
        assert_eq!((w.element, w.swizzle, w.box_dims), (TensorMapDataType::U8, TensorMapSwizzle::B64, [64, 128]));
        assert_eq!((w.dims, w.strides_bytes), ([4096, 384], [4096, 0]));
        assert!(TmaBox::ALL.iter().all(|b| b.box_bytes() % 1024 == 0));
    }

    #[test]
    fn geometry() {
        // 16 MiB of f16 rows of 8 KiB: 2048 rows, 64 boxes per row, 16 box rows.
        let c = TmaBandwidthCase { shape: TmaBox::TokenF16, boxes_per_stage: 2, buffer_bytes: 16 << 20, loads: 10 };
        assert_eq!(c.rows(), 2048);
        assert_eq!(c.tensor_bytes(), 16 << 20);
        assert_eq!(c.bytes_in_flight(), 6 * 32 * 1024);
        let p = c.params(0x1000, 0x2000);
        assert_eq!((p.box_cols, p.box_rows, p.tiles_x, p.tiles), (64, 128, 64, 1024));
        assert_eq!((p.box_bytes, p.stage_bytes, p.loads), (16384, 32768, 10));
        assert_eq!(p.bytes(), 10 * 32768);
        // Box 2·l + b, along the rows first, wrapping around the tensor.
        assert_eq!(p.box_coords(0, 0), [0, 0]);
        assert_eq!(p.box_coords(0, 1), [64, 0]);
        assert_eq!(p.box_coords(31, 1), [63 * 64, 0]);
        assert_eq!(p.box_coords(32, 0), [0, 128]);
        assert_eq!(p.box_coords(511, 1), [63 * 64, 15 * 128]);
        assert_eq!(p.box_coords(512, 0), [0, 0]);
        // Every box of one pass exactly once.
        let mut seen = std::collections::HashSet::new();
        for l in 0..512 {
            for b in 0..2 {
                assert!(seen.insert(p.box_coords(l, b)));
            }
        }
        assert_eq!(seen.len(), 1024);
        // A partial last box row is left out; the u8 tensor's coordinates are bytes.
        let c = TmaBandwidthCase { shape: TmaBox::WeightU8, boxes_per_stage: 3, buffer_bytes: 3 << 20, loads: 7 };
        assert_eq!(c.rows(), 768);
        let p = c.params(0, 0);
        assert_eq!((p.tiles_x, p.tiles, p.stage_bytes), (64, 384, 3 * 8192));
        assert_eq!(p.box_coords(22, 0), [2 * 64, 128]);
        assert_eq!(c.check(), Ok(()));
    }

    #[test]
    fn loads_per_cta_and_sizing() {
        let p = TmaBandwidthParams { loads: 10, ..Default::default() };
        let per = [0, 1, 2, 3].map(|c| p.loads_of_cta(c, 4));
        assert_eq!(per, [3, 3, 2, 2]);
        assert_eq!(p.loads_of_cta(12, 16), 0);
        assert_eq!((0..16).map(|c| p.loads_of_cta(c, 16)).sum::<u32>(), 10);
        let c = TmaBandwidthCase::sized(TmaBox::TokenF16, 2, 16 << 20, 1 << 30, 132);
        assert_eq!(c.loads % 132, 0);
        assert!(c.loads as u64 * 32768 >= 1 << 30 && (c.loads as u64 - 132) * 32768 < 1 << 30);
    }

    #[test]
    fn checks_and_launch() {
        let ok = TmaBandwidthCase { shape: TmaBox::WeightU8, boxes_per_stage: 4, buffer_bytes: 1 << 20, loads: 1 };
        assert_eq!(ok.check(), Ok(()));
        assert!(TmaBandwidthCase { boxes_per_stage: 5, ..ok }.check().is_err());
        assert!(TmaBandwidthCase { shape: TmaBox::TokenF16, boxes_per_stage: 3, ..ok }.check().is_err());
        assert!(TmaBandwidthCase { boxes_per_stage: 0, ..ok }.check().is_err());
        assert!(TmaBandwidthCase { buffer_bytes: 4096 * 127, ..ok }.check().is_err());
        assert!(TmaBandwidthCase { loads: 0, ..ok }.check().is_err());
        assert!(TmaBandwidthCase { loads: u32::MAX, ..ok }.check().is_err());
        let g = tma_bandwidth_launch(132);
        assert_eq!((g.grid, g.block, g.cluster), (132, 160, 1));
        assert_eq!(g.smem_bytes, 1024 + 6 * 32 * 1024);
    }
}
