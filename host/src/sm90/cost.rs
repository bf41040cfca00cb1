//! The cost model of the sm_90a GEMM's variants: the relative time of a work item, which orders
//! and balances a host-sized plan's work list ([`super::Sm90Layout`]) and picks the variant whose
//! busiest CTA finishes first. Its unit is one token row of MMA work per [`BLOCK_K`] values of K.

use crate::problem::GroupShape;
use nvfp4_gemm_abi::sm90::{GemmConfig, RowSpan, BLOCK_K, BLOCK_N};

/// Relative time of one token tile of `rows` rows, per stage, in token rows of MMA work: the MMA
/// grows with `rows`, the rest ([`TILE_FIXED_COST`]) does not. Orders the work list (longest
/// first).
pub(super) const fn tile_cost(rows: u32) -> u32 {
    TILE_FIXED_COST + rows
}

/// The part of a tile's time per stage that does not shrink with its token rows, in token rows
/// of MMA work: on the H200 a 64-row tile takes ~0.72 of a 128-row one, i.e.
/// `(F + 64) / (F + 128) ≈ 0.72`.
pub(super) const TILE_FIXED_COST: u32 = 100;

/// [`TILE_FIXED_COST`] of an `N192` item of 3 warpgroups, in the same units (a 128-row stage of
/// `GENERAL` costs 228): a 192-row stage costs `(140 + 192) / 228 ≈ 1.46` times a 128-row one.
/// Fitted to the H200's times of the bench shapes b0 and b1 with each variant forced: b1 runs
/// `N192` in 0.968 of `T64`'s time (66.1 µs against 68.3), the model gives 0.966 at 140 (and
/// would prefer `T64` for b1 above 149); b0 0.935 measured, 0.916 modelled. With one tile per
/// CTA (b2, b3) a 192-row stage takes only ~1.3 times as long, and the model keeps `GENERAL` there
/// (`N192` forced is slower: b2 38.8 µs against 29.9).
pub(super) const N192_TILE_FIXED_COST: u32 = 140;

/// Relative time per stage under `config` of a tile `width` tokens wide over `warpgroups`
/// consumer warpgroups' rows, in [`tile_cost`] units: [`tile_cost`] for 128-row tiles and for
/// `N192` items of fewer than three warpgroups (the idle ones leave a `T64`-like tile);
/// [`N192_TILE_FIXED_COST`] plus the MMA work for three.
pub(super) const fn stage_cost(config: GemmConfig, width: u32, warpgroups: u32) -> u32 {
    if config.block_n == BLOCK_N || warpgroups < 3 {
        tile_cost(width)
    } else {
        N192_TILE_FIXED_COST + width * warpgroups / 2
    }
}

/// [`BLOCK_K`]-wide steps of a reduction of length `k`: the cost model's unit of K (a variant's
/// own stages are [`GemmConfig::k_stages`]; the decode variant's are twice as wide).
pub(super) const fn k_stages(k: u32) -> u32 {
    k.div_ceil(BLOCK_K)
}

/// The estimated time of work item (`tile_m`, `tile_n`) of group `s` under `config` (in
/// [`tile_cost`] units, [`stage_cost`] per step of K): every consumer warpgroup's rows for
/// 128-row tiles, the [`RowSpan`]'s for `N192`.
pub(super) fn item_cost(config: GemmConfig, s: &GroupShape, tile_m: u32, tile_n: u32) -> u64 {
    let warpgroups =
        if config.block_n == BLOCK_N { config.consumer_warpgroups() } else { RowSpan::decode(tile_n).warpgroups };
    let m = s.m as u32;
    let width = config.tile_width(m, config.tile_rows(m), tile_m);
    k_stages(s.k as u32) as u64 * stage_cost(config, width, warpgroups) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs() {
        assert_eq!((tile_cost(16), tile_cost(128)), (116, 228));
        assert_eq!(k_stages(320), 3);
        // An `N192` tile of three warpgroups costs more than a 128-row one, about one and a half
        // (slightly more per weight row: its gain is in the balance); with fewer warpgroups, and
        // in the 128-row variants, a tile costs its width.
        let w = GemmConfig::N192;
        assert!(stage_cost(w, 128, 3) > tile_cost(128) && 5 * stage_cost(w, 128, 3) < 8 * tile_cost(128));
        assert_eq!((stage_cost(w, 128, 2), stage_cost(GemmConfig::T64, 64, 1)), (tile_cost(128), tile_cost(64)));
    }
}
