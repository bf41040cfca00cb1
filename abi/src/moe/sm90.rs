//! Device-resident group sizes on sm_90a: which GEMM kernels a plan launches, how the scheduler
//! picks one per call, and how it numbers each group's tiles — the host-sized planner's choices
//! (`host/src/sm90`) for the same sizes, so that both paths run the same work (docs/moe.md §2).
//!
//! A plan launches the decode kernel (`GemmConfig::DECODE`), a general one (`GENERAL` or `T64`),
//! or both ([`KERNELS_AUTO`]): then the scheduler gives the call to the decode kernel when every
//! group has at most 16 rows — the host planner's rule — and to the general one otherwise, and
//! writes a length of 0 for the other, which exits at once.

use super::schedule::ScheduleCommon;
use crate::sm90::{m_tiles, GemmConfig};

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
/// groups of at most 16 rows, else 128) or [`GemmConfig::T64`] (128-row tiles, a group's last
/// one 64 wide when its rows fit). `N192` is host-sized only: its weight spans are chosen per
/// problem by the host.
pub const GENERAL_CONFIGS: [GemmConfig; 2] = [GemmConfig::GENERAL, GemmConfig::T64];

/// The general configuration of code `general` ([`GENERAL_CONFIGS`] index; `GENERAL` for any other).
pub const fn general_config(general: u32) -> GemmConfig {
    if general == 1 {
        GENERAL_CONFIGS[1]
    } else {
        GENERAL_CONFIGS[0]
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
    /// The tiles of a group of `m` rows under `cfg` (not `N192`): `cfg.tile_rows(m)` rows each,
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
    /// Index of the workspace map with 1-row boxes; the map with `h`-row boxes is at
    /// `token_maps + h − 1` (every height up to the launched kernels' `block_m`).
    pub token_maps: u32,
    /// CTAs the general list is balanced over (its launch's grid), or 0 for the plain order.
    pub lpt_grid: u32,
    /// Most items each kernel's list can hold (beyond it: truncated, `STATUS_WORK_OVERFLOW`).
    pub max_items: [u32; 2],
    /// Each kernel's list capacity (its launch's `work_len`; holes included).
    pub max_list: [u32; 2],
    /// The general configuration's class costs per stage, `[wide, narrow]`.
    pub costs: [u32; 2],
}

const _: () = assert!(core::mem::size_of::<Sm90ScheduleParams>() == 152);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm90::SMALL_TILE_M;

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
    fn kernel_choice() {
        assert!(runs_decode(KERNELS_AUTO, false) && !runs_decode(KERNELS_AUTO, true));
        assert!(runs_decode(KERNELS_DECODE, true) && !runs_decode(KERNELS_GENERAL, false));
        assert_eq!(chosen_config(true, 1), GemmConfig::DECODE);
        assert_eq!(chosen_config(false, 1), GemmConfig::T64);
        assert_eq!(chosen_config(false, 0), GemmConfig::GENERAL);
        // A call the decode kernel takes in AUTO has the same tiles under the general config.
        for general in 0..2 {
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
