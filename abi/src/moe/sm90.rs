//! Device-resident group sizes on sm_90a: which GEMM kernels a plan launches, how the scheduler
//! picks one per call, and how it numbers each group's tiles — the host-sized planner's choices
//! (`host/src/sm90`) for the same sizes, so that both paths run the same work (docs/moe.md §2).
//!
//! A plan launches the decode kernel (`GemmConfig::DECODE`), a general one (`GENERAL`, `T64` or
//! `N192`), or both ([`KERNELS_AUTO`]): then the scheduler gives the call to the decode kernel
//! when every group has at most 16 rows — the host planner's rule — and to the general one
//! otherwise, and writes a length of 0 for the other, which exits at once.

use super::schedule::{ScheduleCommon, SCHEDULE_THREADS};
use crate::launch::LaunchGeometry;
use crate::sm90::{m_tiles, n_tiles, GemmConfig, SpanSplit, BLOCK_N, WG_ROWS};

/// Both kernels launched; the scheduler picks one per call: the decode kernel when every group
/// has at most [`crate::sm90::SMALL_TILE_M`] rows, else the general one.
pub const KERNELS_AUTO: u32 = 0;
/// The decode kernel alone: every group in 16-row tiles, whatever its size (correct for any
/// sizes; the host planner's choice whenever every group has at most 16 rows).
pub const KERNELS_DECODE: u32 = 1;
/// The general kernel alone.
pub const KERNELS_GENERAL: u32 = 2;

/// Scheduler flag (above `schedule::FLAG_SHIFT`): a group has more than [`crate::sm90::SMALL_TILE_M`] rows.
pub const FLAG_WIDE_GROUP: u32 = 1;

/// The general kernels a device-sized plan may launch: [`GemmConfig::GENERAL`] (16-row tiles for
/// groups of at most 16 rows, else 128), [`GemmConfig::T64`] (128-row tiles, a group's last one
/// 64 wide when its rows fit) or [`GemmConfig::N192`] (the `T64` token tiles over weight spans of
/// up to 192 rows, fixed from N: [`WeightTiles`]).
pub const GENERAL_CONFIGS: [GemmConfig; 3] = [GemmConfig::GENERAL, GemmConfig::T64, GemmConfig::N192];

/// The general configuration of code `general` ([`GENERAL_CONFIGS`] index; `GENERAL` for any other).
pub const fn general_config(general: u32) -> GemmConfig {
    match general {
        1 => GENERAL_CONFIGS[1],
        2 => GENERAL_CONFIGS[2],
        _ => GENERAL_CONFIGS[0],
    }
}

/// The 128-row spans that start N's split into `N192` spans in a device-sized plan: the fewest
/// (0, 1 or 2) that leave a multiple of 3 blocks of 64 rows, so that every other span is 192 rows
/// (`RowSpan::split(n, span_twos(n))` has no short last span when N is a multiple of 64 and at
/// least 128; otherwise the split's own rule for what is left).
pub const fn span_twos(n: u32) -> u32 {
    let units = n.div_ceil(WG_ROWS);
    let mut twos = 0;
    while twos <= 2 {
        if 2 * twos <= units && (units - 2 * twos) % 3 == 0 {
            return twos;
        }
        twos += 1;
    }
    0
}

/// Each group's weight tiles under a configuration with N = `n` (every group of a device-sized
/// problem has the same N): 128-row tiles, or for `N192` the spans of
/// `RowSpan::split(n, span_twos(n))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightTiles {
    /// `N192`'s spans; `None`: 128-row tiles.
    spans: Option<SpanSplit>,
    /// The tiles.
    len: u32,
}

impl WeightTiles {
    /// The weight tiles of `cfg` with N = `n`.
    pub const fn new(cfg: GemmConfig, n: u32) -> WeightTiles {
        if cfg.block_n == BLOCK_N {
            WeightTiles { spans: None, len: n_tiles(n) }
        } else {
            let spans = SpanSplit::new(n, span_twos(n));
            WeightTiles { spans: Some(spans), len: spans.count() }
        }
    }

    /// The tiles per group.
    pub const fn count(&self) -> u32 {
        self.len
    }

    /// The `tile_n` word of tile `j` (below [`Self::count`]): the 128-row tile index, or the span's
    /// [`RowSpan::encode`](crate::sm90::RowSpan::encode).
    pub const fn tile_n(&self, j: u32) -> u32 {
        match self.spans {
            None => j,
            Some(s) => s.span(j).encode(),
        }
    }
}

/// The token tiles of one group of `m` rows under a configuration: per weight tile, `m_tiles`
/// token tiles, the first `wide` of them full width (the configuration's `block_m`) and the rest
/// narrow. An item's class (0 wide, 1 narrow) orders the host's list: its cost is the class's
/// (the host cost model's for the width, `host/src/sm90/cost.rs`), and every group of a device-sized problem has the
/// same K.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupTiles {
    /// Token tiles per weight tile.
    pub m_tiles: u32,
    /// Of those, the full-width ones (the first).
    pub wide: u32,
}

impl GroupTiles {
    /// The token tiles of a group of `m` rows under `cfg`: `cfg.tile_rows(m)` rows each,
    /// the last one narrow when [`GemmConfig::tile_width`] says so (every tile of a narrow group).
    pub const fn new(cfg: GemmConfig, m: u32) -> GroupTiles {
        let block_m = cfg.tile_rows(m);
        let mt = m_tiles(m, block_m);
        let wide = if mt == 0 || block_m == cfg.narrow {
            0
        } else if cfg.tile_width(m, block_m, mt - 1) == cfg.narrow {
            mt - 1
        } else {
            mt
        };
        GroupTiles { m_tiles: mt, wide }
    }

    /// The narrow token tiles per weight tile (the last ones).
    pub const fn narrow(&self) -> u32 {
        self.m_tiles - self.wide
    }

    /// Items of class `class` of a group with `weight_tiles` weight tiles.
    pub const fn items(&self, class: u32, weight_tiles: u32) -> u32 {
        weight_tiles * if class == 0 { self.wide } else { self.narrow() }
    }

    /// The class of token tile `tile_m` and its place among the group's items of that class,
    /// for weight tile `tile_n`: the items of a class are in the host's order (weight tile
    /// outer, token tile inner).
    pub const fn class_index(&self, tile_n: u32, tile_m: u32) -> (u32, u32) {
        if tile_m < self.wide {
            (0, tile_n * self.wide + tile_m)
        } else {
            (1, tile_n * self.narrow() + tile_m - self.wide)
        }
    }
}

/// Whether a call with a group of more than 16 rows (`wide_group`) runs the decode kernel under
/// `kernels`.
pub const fn runs_decode(kernels: u32, wide_group: bool) -> bool {
    kernels == KERNELS_DECODE || (kernels == KERNELS_AUTO && !wide_group)
}

/// The configuration a call runs: the decode one or the plan's general one.
pub const fn chosen_config(decode: bool, general: u32) -> GemmConfig {
    if decode {
        GemmConfig::DECODE
    } else {
        general_config(general)
    }
}

/// Index of kernel `decode`'s entries in [`Sm90ScheduleParams`]' per-kernel arrays.
pub const fn kernel_slot(decode: bool) -> usize {
    if decode {
        0
    } else {
        1
    }
}

/// Parameters of `sm90_schedule`. Per-kernel arrays: `[decode, general]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Sm90ScheduleParams {
    /// The common part.
    pub common: ScheduleCommon,
    /// Packed values of the token tensor A (row `r` at `r · K/2`).
    pub a_values: u64,
    /// The f16 token workspace, `[token_rows, K]`.
    pub workspace: u64,
    /// Device addresses of the `u32` work lengths each GEMM launch reads (0: not launched).
    pub work_len: [u64; 2],
    /// `u32[max_items[1]]` scratch: the list index of each general item, by class rank (LPT).
    pub ranks: u64,
    /// [`KERNELS_AUTO`], [`KERNELS_DECODE`] or [`KERNELS_GENERAL`].
    pub kernels: u32,
    /// The general configuration's [`GENERAL_CONFIGS`] index.
    pub general: u32,
    /// Per kernel, the index (in that launch's map table) of the workspace map with 1-row boxes;
    /// the map with `h`-row boxes is at `token_maps + h − 1` (every height up to the launched
    /// kernels' `block_m`). The two differ when the kernels read the table from different bases
    /// (a plan pairing the decode kernel with `N192`, whose weight maps differ).
    pub token_maps: [u32; 2],
    /// CTAs the general list is balanced over (its launch's grid), or 0 for the plain order.
    pub lpt_grid: u32,
    /// Most items each kernel's list can hold (beyond it: truncated, `STATUS_WORK_OVERFLOW`).
    pub max_items: [u32; 2],
    /// Each kernel's list capacity (its launch's `work_len`; holes included).
    pub max_list: [u32; 2],
    /// The general configuration's class costs per stage, `[wide, narrow]`.
    pub costs: [u32; 2],
    /// Zero.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<Sm90ScheduleParams>() == 160);

/// The MoE block's first launch after its routing on sm_90a: the grouped quantization (or
/// gather) of the tokens and both GEMMs' schedulers, which read only the routing's sizes, in one
/// grid. CTA `i < SCHEDULE_CTAS` runs `sm90_schedule` on `schedules[i]`; the others run
/// `nvfp4_quantize_grouped`'s loop on `quantize`, grid-strided over themselves. The schedulers'
/// time hides behind the quantization's, and the chain has two launches fewer.
pub const QUANTIZE_SCHEDULE_KERNEL: &str = "sm90_quantize_schedule";

/// Schedulers of [`QuantizeScheduleParams`]: the block's two GEMMs.
pub const SCHEDULE_CTAS: u32 = 2;

/// Quantizing CTAs per SM a [`QUANTIZE_SCHEDULE_KERNEL`] grid is sized for: one, what an SM
/// holds (the CTAs have the schedulers' [`SCHEDULE_THREADS`] threads at their register cap, the
/// whole register file); the threads grid-stride beyond. Half the threads per SM of
/// `nvfp4_quantize_grouped`'s grids, which matters only where the quantization is long (large
/// `T`), where the schedulers it hides are a small part of the call.
pub const QUANTIZE_CTAS_PER_SM: u32 = 1;
const _: () = assert!(
    QUANTIZE_CTAS_PER_SM * SCHEDULE_THREADS * super::schedule::SCHEDULE_REGISTERS <= crate::launch::REGISTERS_PER_SM
);

/// Parameters of [`QUANTIZE_SCHEDULE_KERNEL`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct QuantizeScheduleParams {
    /// The quantization's (or gather's).
    pub quantize: super::GroupedConvertParams,
    /// The schedulers', the first GEMM's first.
    pub schedules: [Sm90ScheduleParams; SCHEDULE_CTAS as usize],
}

const _: () = assert!(core::mem::size_of::<QuantizeScheduleParams>() == 104 + 2 * 160);

/// The launch of [`QUANTIZE_SCHEDULE_KERNEL`] for `items` quantization items (16 values each) on
/// `sms` SMs, with `groups` groups: [`SCHEDULE_CTAS`] CTAs, then one per [`SCHEDULE_THREADS`]
/// items up to [`QUANTIZE_CTAS_PER_SM`] per SM (at least one); the schedulers' shared memory.
pub const fn quantize_schedule_launch(items: u64, sms: u32, groups: u32) -> LaunchGeometry {
    let quantize = crate::quantize::grid_of(items, SCHEDULE_THREADS, sms * QUANTIZE_CTAS_PER_SM);
    let quantize = if quantize == 0 { 1 } else { quantize };
    LaunchGeometry {
        grid: SCHEDULE_CTAS + quantize,
        block: SCHEDULE_THREADS,
        cluster: 1,
        smem_bytes: super::schedule::smem::bytes(groups),
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::sm90::SMALL_TILE_M;
    use std::vec::Vec;

    #[test]
    fn quantize_schedule_grid() {
        // Two schedulers, then one quantizing CTA per 1024 items up to one per SM (at least one).
        let g = |items: u64, sms: u32| quantize_schedule_launch(items, sms, 128);
        assert_eq!((g(0, 132).grid, g(1, 132).grid, g(1024, 132).grid, g(1025, 132).grid), (3, 3, 3, 4));
        assert_eq!((g(1 << 30, 132).grid, g(1 << 30, 0).grid), (134, 3));
        let l = g(5000, 132);
        assert_eq!((l.block, l.cluster, l.smem_bytes), (SCHEDULE_THREADS, 1, super::super::schedule::smem::bytes(128)));
    }

    #[test]
    fn tiles_of_a_group() {
        let t = |cfg, m| {
            let g = GroupTiles::new(cfg, m);
            (g.m_tiles, g.wide)
        };
        let (m128, t64, m16) = (GemmConfig::GENERAL, GemmConfig::T64, GemmConfig::DECODE);
        assert_eq!(
            [0, 1, 16, 17, 128, 129, 300].map(|m| t(m128, m)),
            [(0, 0), (1, 0), (1, 0), (1, 1), (1, 1), (2, 2), (3, 3)]
        );
        assert_eq!(
            [0, 1, 64, 65, 129, 192, 193].map(|m| t(t64, m)),
            [(0, 0), (1, 0), (1, 0), (1, 1), (2, 1), (2, 1), (2, 2)]
        );
        assert_eq!([0, 1, 16, 17, 40].map(|m| t(m16, m)), [(0, 0), (1, 0), (1, 0), (2, 0), (3, 0)]);
        let g = GroupTiles::new(t64, 150);
        assert_eq!((g.items(0, 3), g.items(1, 3)), (3, 3));
        assert_eq!(
            [(0, 0), (0, 1), (2, 0), (2, 1)].map(|(n, m)| g.class_index(n, m)),
            [(0, 0), (1, 0), (0, 2), (1, 2)]
        );
        let g = GroupTiles::new(m16, 40);
        assert_eq!([(0, 2), (1, 0)].map(|(n, m)| g.class_index(n, m)), [(1, 2), (1, 3)]);
    }

    #[test]
    fn n192_spans_are_the_splits() {
        use crate::sm90::RowSpan;
        for n in (8..=40_000).step_by(8) {
            let twos = span_twos(n);
            let split: Vec<u32> = RowSpan::split(n, twos).map(|s| s.encode()).collect();
            let tiles = WeightTiles::new(GemmConfig::N192, n);
            let ours: Vec<u32> = (0..tiles.count()).map(|j| tiles.tile_n(j)).collect();
            assert_eq!(ours, split, "n = {n}");
            // Every row of N in exactly one span, in order, and no short last span once N allows it.
            let spans: Vec<RowSpan> = split.iter().map(|&t| RowSpan::decode(t)).collect();
            assert!(spans.windows(2).all(|w| w[0].first + w[0].warpgroups == w[1].first), "n = {n}");
            let rows: u32 = spans.iter().map(|s| s.warpgroups * WG_ROWS).sum();
            assert_eq!((spans[0].first, rows), (0, n.div_ceil(WG_ROWS) * WG_ROWS), "n = {n}");
            if n % WG_ROWS == 0 && n >= 2 * WG_ROWS {
                assert!(spans.iter().all(|s| s.warpgroups >= 2), "n = {n}: {spans:?}");
                assert!(twos <= 2);
            }
            let t64 = WeightTiles::new(GemmConfig::T64, n);
            assert_eq!((t64.count(), t64.tile_n(5)), (n.div_ceil(BLOCK_N), 5));
        }
        // DeepSeek's and Mixtral's N: 2 spans of 128 rows, then 192.
        let n192 = |n| (span_twos(n), WeightTiles::new(GemmConfig::N192, n).count());
        assert_eq!(n192(7168), (2, 38));
        assert_eq!(n192(4096), (2, 22));
        assert_eq!(n192(28672), (2, 150));
    }

    #[test]
    fn kernel_choice() {
        assert!(runs_decode(KERNELS_AUTO, false) && !runs_decode(KERNELS_AUTO, true));
        assert!(runs_decode(KERNELS_DECODE, true) && !runs_decode(KERNELS_GENERAL, false));
        assert_eq!(chosen_config(true, 1), GemmConfig::DECODE);
        assert_eq!(chosen_config(false, 1), GemmConfig::T64);
        assert_eq!(chosen_config(false, 0), GemmConfig::GENERAL);
        // A call the decode kernel takes in AUTO has the same tiles under the general config.
        assert_eq!(chosen_config(false, 2), GemmConfig::N192);
        for general in 0..GENERAL_CONFIGS.len() as u32 {
            for m in 0..=SMALL_TILE_M {
                assert_eq!(
                    GroupTiles::new(general_config(general), m).m_tiles,
                    GroupTiles::new(GemmConfig::DECODE, m).m_tiles
                );
                assert_eq!(GroupTiles::new(general_config(general), m).wide, 0);
            }
        }
    }
}
