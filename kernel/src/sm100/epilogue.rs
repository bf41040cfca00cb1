//! The epilogue: warps 0–3 read the fp32 accumulator from TMEM, scale by alpha, round to fp16 or
//! bf16 and store C, masking rows ≥ M and columns ≥ N.
//!
//! Warp `w` may read TMEM lanes `32w .. 32w+31` only (PTX §9.7.16.8.1), which are output rows
//! `32w ..` of the tile. It reads them as two 16-lane halves with `tcgen05.ld.16x256b.x16`, 128
//! columns at a time. Thread `t` (`q = t/4`, `p = t%4`) then holds, for `j < 16`, columns
//! `8j+2p, 8j+2p+1` of rows `q` and `q+8` of the half (docs/sm100.md §6), and stores each pair as
//! one 32-bit word. A half or a 128-column chunk entirely outside C is not read at all (the test
//! is the same for every lane of the warp, so the `.aligned` load stays warp-uniform).
//!
//! Handoff with the MMA issuer (PTX §9.7.16.6.4): wait `accumulator_full` →
//! `tcgen05.fence::after_thread_sync` → loads (each with its `wait::ld`) →
//! `tcgen05.fence::before_thread_sync` → every thread arrives on `accumulator_empty`.

use super::{SharedMap, Variant, WorkCursor};
use crate::pipeline::Consumer;
use crate::ptx::{convert, sreg, tcgen05};
use nvfp4_gemm_abi::sm100::config::BLOCK_M;
use nvfp4_gemm_abi::sm100::params::{GroupParams, KernelParams};
use nvfp4_gemm_abi::sm100::tmem::{warp_lane_base, TMEM_LANES_PER_WARP};
use nvfp4_gemm_abi::sm100::TmemAddress;

/// Accumulator columns one `tcgen05.ld.16x256b.x16` covers.
const CHUNK_COLUMNS: u32 = 128;

/// Rows of the tile (TMEM lanes) one `tcgen05.ld.16x256b` covers: half of a warp's 32.
const HALF_ROWS: u32 = 16;
const _: () = assert!(TMEM_LANES_PER_WARP == 2 * HALF_ROWS);

/// The epilogue loop of one epilogue warp (all 32 lanes, converged).
///
/// # Safety
/// Warps 0–3 only, every lane; barriers initialized; `tmem` the CTA's allocation; `p` valid.
#[inline(always)]
pub unsafe fn store<V: Variant>(smem: SharedMap<V>, p: &KernelParams, tmem: TmemAddress, warp: u32) {
    let cfg = V::CFG;
    let lane = sreg::lane_id();
    let (quad, pair) = (lane / 4, lane % 4);
    let bf16 = p.out_bf16 != 0;
    let accumulator = tmem.add_columns(cfg.tmem_plan().accumulator().start);
    let mut accumulator_ring = Consumer::<1>::new(smem.accumulator_full(), smem.accumulator_empty());
    let mut work = WorkCursor::new(p);
    while let Some(i) = work.next_index() {
        // SAFETY: `i < work_len`; the item names a group of the table.
        let (item, g) = unsafe {
            let item = work.item(i);
            (item, work.group(item.group))
        };
        let tile = accumulator_ring.wait();
        tcgen05::fence_after_thread_sync();
        let row_tile = item.tile_m * BLOCK_M;
        let col_tile = item.tile_n * cfg.block_n();
        for half in 0..TMEM_LANES_PER_WARP / HALF_ROWS {
            let lane0 = warp_lane_base(warp) + HALF_ROWS * half;
            if row_tile + lane0 < g.m {
                for chunk in 0..cfg.block_n() / CHUNK_COLUMNS {
                    let col0 = col_tile + CHUNK_COLUMNS * chunk;
                    if col0 < g.n {
                        // SAFETY: the warp's own lane quarter of the finished accumulator, read by
                        // the whole warp (the conditions are warp-uniform); C was validated.
                        unsafe {
                            let acc = tcgen05::ld_16x256b_x16(
                                accumulator.add_lanes(lane0).add_columns(CHUNK_COLUMNS * chunk),
                            );
                            store_chunk(&acc, &g, row_tile + lane0 + quad, col0 + 2 * pair, bf16);
                        }
                    }
                }
            }
        }
        tcgen05::fence_before_thread_sync();
        tile.release();
    }
}

/// Stores this thread's part of a 16-row x 128-column chunk: for `j < 16`, the column pair
/// `col + 8j, +1` of rows `row` (registers `4j`, `4j+1`) and `row + 8` (`4j+2`, `4j+3`).
/// `N % 8 == 0` (checked by the host) makes a pair either wholly inside C or wholly outside.
///
/// # Safety
/// `g.c` is valid for `g.m` rows of `g.ldc` elements.
#[inline(always)]
unsafe fn store_chunk(acc: &[u32; 64], g: &GroupParams, row: u32, col: u32, bf16: bool) {
    for j in 0..16 {
        let col = col + 8 * j as u32;
        if col < g.n {
            // SAFETY: the caller's contract; `store_pair` masks the rows.
            unsafe {
                store_pair(acc[4 * j], acc[4 * j + 1], g, row, col, bf16);
                store_pair(acc[4 * j + 2], acc[4 * j + 3], g, row + 8, col, bf16);
            }
        }
    }
}

/// Stores `alpha * (lo, hi)` rounded to fp16/bf16 at C[row][col .. col+2] if `row < M`.
///
/// # Safety
/// `g.c` is valid for `g.m` rows of `g.ldc` elements and `col + 1 < g.n`.
#[inline(always)]
unsafe fn store_pair(lo: u32, hi: u32, g: &GroupParams, row: u32, col: u32, bf16: bool) {
    if row < g.m {
        // K = 0 leaves the accumulator unwritten (stale TMEM, possibly NaN): store the empty sum.
        let empty_sum = g.k == 0;
        let lo = if empty_sum { 0.0 } else { f32::from_bits(lo) * g.alpha };
        let hi = if empty_sum { 0.0 } else { f32::from_bits(hi) * g.alpha };
        let bits = if bf16 { convert::f32x2_to_bf16x2(lo, hi) } else { convert::f32x2_to_f16x2(lo, hi) };
        let c = g.c as *mut u16;
        // SAFETY: the caller's contract, and `row < M`.
        unsafe { *(c.add(row as usize * g.ldc as usize + col as usize) as *mut u32) = bits };
    }
}
