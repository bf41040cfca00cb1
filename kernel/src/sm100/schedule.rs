//! `sm100_schedule`: device-resident group sizes → what the sm_100a GEMM reads (see
//! `nvfp4_gemm_abi::moe`): the scheduler of [`crate::schedule`] with the sm_100a list.
//!
//! - Counted per group: its M tiles (`⌈m / 128⌉`), numbered in group order by the prefix sum.
//! - Table fields: `m`, `a_scales`, `c`, `token_row` (the host wrote the others).
//! - The list holds the first `rows = min(M tiles, max_work / slots)` M tiles, `slots` items
//!   each (`slots_per_m_tile`: the N tiles, padded to a multiple of 4 for the 256-wide clusters),
//!   each at `device_item_index`: the order of the host-built list for the same sizes
//!   (`tile_n`-major for 128-wide tiles; M-tile-major with each M tile's run padded with
//!   `tile_n = 0` copies for 256-wide ones), so the length `rows · slots` of a 256-wide list is a
//!   multiple of 4 and every aligned run of 4 items shares one A tile, as the cluster kernel
//!   requires. `STATUS_WORK_OVERFLOW` if M tiles were cut off, which sizes within the bounds
//!   never cause.

use crate::schedule::{schedule, TilePolicy};
use nvfp4_gemm_abi::moe::schedule::{ScheduleCommon, Sm100ScheduleParams, SUMS};
use nvfp4_gemm_abi::moe::{GroupRows, STATUS_WORK_OVERFLOW};
use nvfp4_gemm_abi::sm100::config::BLOCK_M;
use nvfp4_gemm_abi::sm100::params::GroupParams;
use nvfp4_gemm_abi::sm100::{device_item_index, slot_tile_n, slots_per_m_tile, BlockN, WorkItem};

/// The sm_100a tile policy.
struct Sm100 {
    p: Sm100ScheduleParams,
    block_n: BlockN,
    /// Items per M tile (at least 1: keeps division-by-zero panics out of the code).
    slots: u32,
}

/// The M tiles in the list, and whether some were cut off.
#[derive(Clone, Copy)]
struct Plan {
    rows: u32,
    overflow: bool,
}

impl TilePolicy for Sm100 {
    type Plan = Plan;

    fn common(&self) -> &ScheduleCommon {
        &self.p.common
    }

    fn count(&self, r: &GroupRows) -> ([u32; SUMS], u32) {
        ([r.rows.div_ceil(BLOCK_M), 0, 0], 0)
    }

    fn plan(&self, totals: [u32; SUMS], _flags: u32) -> Plan {
        let capacity = self.p.max_work / self.slots;
        Plan { rows: if totals[0] > capacity { capacity } else { totals[0] }, overflow: totals[0] > capacity }
    }

    unsafe fn group(&self, _plan: &Plan, g: u32, r: &GroupRows, first: [u32; SUMS]) -> [u32; 2] {
        let c = &self.p.common;
        let (k, n) = (c.k as u64, c.n as u64);
        // SAFETY: `g < G` indexes the group table; the addresses lie in the validated tensors
        // (`nvfp4_gemm_abi::moe`: rows below the token rows, scale rows below the scale rows).
        unsafe {
            let e = (c.groups as *mut GroupParams).add(g as usize);
            (*e).m = r.rows;
            (*e).a_scales = c.a_scales + r.scale_first as u64 * (k / 16);
            (*e).c = c.c + r.first as u64 * n * 2;
            (*e).token_row = r.first;
        }
        [first[0], r.rows.div_ceil(BLOCK_M)]
    }

    unsafe fn fill(&self, plan: &Plan, g: u32, words: [u32; 2], lane: u32) {
        let [start, mt] = words;
        // The group's M tiles that are in the list.
        let mt = if start >= plan.rows {
            0
        } else if start + mt > plan.rows {
            plan.rows - start
        } else {
            mt
        };
        // A group with items has mt ≥ 1; `1` keeps a division-by-zero panic out of the code.
        let mt_div = if mt == 0 { 1 } else { mt };
        let (slots, work) = (self.slots, self.p.common.work as *mut WorkItem);
        let mut j = lane;
        while j < mt * slots {
            // Consecutive lanes write consecutive items (M tiles inner for 128-wide tiles).
            let (tile_m, slot) = match self.block_n {
                BlockN::N128 => (j % mt_div, j / mt_div),
                BlockN::N256 => (j / slots, j % slots),
            };
            let index = device_item_index(self.block_n, plan.rows, slots, start + tile_m, slot);
            // SAFETY: `start + tile_m < rows` and `slot < slots`, so `index < rows · slots ≤
            // max_work` indexes the list.
            unsafe {
                *work.add(index as usize) =
                    WorkItem { group: g, tile_m, tile_n: slot_tile_n(slot, self.p.common.n, self.block_n) };
            }
            j += 32;
        }
    }

    unsafe fn finish(&self, plan: &Plan) -> u32 {
        // SAFETY: the plan's length word.
        unsafe { *(self.p.work_len as *mut u32) = plan.rows * self.slots };
        if plan.overflow {
            STATUS_WORK_OVERFLOW
        } else {
            0
        }
    }
}

/// See the module docs. Launch: one CTA of `SCHEDULE_THREADS` threads, `smem::bytes(G)` bytes of
/// dynamic shared memory.
///
/// # Safety
/// `p` must be what the host's device-sized sm100 plan writes: the sizes array holds
/// `sizes_len()` readable `u32`s, the group table `G` entries, the work list `max_work` items;
/// the bases and bounds are those the plan validated the buffers against.
#[crate::ptx::kernel]
pub unsafe fn sm100_schedule(p: Sm100ScheduleParams) {
    let block_n = if p.block_n == BlockN::N256.get() { BlockN::N256 } else { BlockN::N128 };
    let slots = match slots_per_m_tile(p.common.n, block_n) {
        0 => 1,
        s => s,
    };
    // SAFETY: the caller's contract.
    unsafe { schedule(&Sm100 { p, block_n, slots }) }
}
