//! `sm90_schedule`: device-resident group sizes → what the token dequantization and the GEMMs
//! read (see `nvfp4_gemm_abi::moe::sm90`): the scheduler of [`crate::schedule`] with the sm_90a
//! policy, which builds the list the host-sized planner builds for the same sizes.
//!
//! - The kernel: the plan launches the decode kernel, its general kernel, or both; with both,
//!   the decode kernel takes the call when no group has more than 16 rows (the host planner's
//!   rule), the other one gets a length of 0.
//! - Counted per group: its token tiles of each class (full-width tiles, then narrow ones;
//!   `GroupTiles`), times the weight tiles of the call's configuration once the totals say
//!   which (128-row tiles, or `N192`'s spans, `WeightTiles`) for its items, and its
//!   dequantization CTAs.
//! - Table fields: `m`, the A/C/workspace addresses, the dequantization CTAs, `block_m`,
//!   `tail_rows` and both token maps — the host's values, the maps being the plan's workspace
//!   maps of those box heights (`token_maps + h − 1`, the chosen kernel's `token_maps`), so every
//!   tile loads exactly the rows a host-sized plan loads.
//! - The list: the plain order (group, weight tile, token tile), or — the general kernel with more
//!   items than CTAs — the host's LPT order (`lpt_picks`): per class, longest first, every CTA
//!   computes where its picks go from the loads the classes before leave (`StepLoads`, no scan
//!   over the CTAs) and writes each pick's list index into the `ranks` scratch, the
//!   list's length is the largest index + 1, each CTA writes its holes, and the fill writes every
//!   item where its class rank says.

use crate::ptx::smem::SmemAddr;
use crate::ptx::sreg;
use crate::quantize_grouped::quantize_grouped;
use crate::scan;
use crate::schedule::{schedule, schedule_after_wait, TilePolicy, WARPS};
use nvfp4_gemm_abi::moe::schedule::{
    lpt_picks, smem as layout, ScheduleCommon, StepLoads, LPT_MAX_CTAS, LPT_THREADS, SCHEDULE_THREADS, SUMS,
};
use nvfp4_gemm_abi::moe::sm90::{
    chosen_config, kernel_slot, runs_decode, GroupTiles, QuantizeScheduleParams, Sm90ScheduleParams, WeightTiles,
    FLAG_WIDE_GROUP, KERNELS_DECODE, SCHEDULE_CTAS,
};
use nvfp4_gemm_abi::moe::{GroupRows, STATUS_WORK_OVERFLOW};
use nvfp4_gemm_abi::sm90::{dequant_ctas, tail_box_rows, GemmConfig, GroupParams, WorkItem, SMALL_TILE_M};

/// Most LPT CTAs one of the placing threads handles (`b = tid, tid + LPT_THREADS, ...`).
const CTAS_PER_THREAD: usize = (LPT_MAX_CTAS / LPT_THREADS) as usize;

/// The sm_90a tile policy.
struct Sm90 {
    p: Sm90ScheduleParams,
}

/// A call's plan.
#[derive(Clone, Copy)]
struct Plan {
    /// The decode kernel takes the call.
    decode: bool,
    /// Its configuration.
    cfg: GemmConfig,
    /// Its weight tiles per group.
    tiles: WeightTiles,
    /// Items of each class (full width, narrow).
    items: [u32; 2],
    /// The list's length.
    len: u32,
    /// The list is in LPT order (else the plain order).
    lpt: bool,
    /// Items were cut off.
    overflow: bool,
}

impl Sm90 {
    /// The configuration whose tiles a group's counts are in: the decode one for a plan that
    /// launches only the decode kernel, else the general one (when the decode kernel takes a
    /// call of the automatic choice, every group has at most 16 rows, and both give the same
    /// tiles: `nvfp4_gemm_abi::moe::sm90` tests it).
    fn counted_config(&self) -> GemmConfig {
        chosen_config(self.p.kernels == KERNELS_DECODE, self.p.general)
    }
}

impl TilePolicy for Sm90 {
    type Plan = Plan;

    fn common(&self) -> &ScheduleCommon {
        &self.p.common
    }

    /// Token tiles per weight tile of each class: the call's configuration, and with it the
    /// weight tiles per group (`N192`'s spans against 128-row tiles), is known only from the
    /// totals, and every group has the same weight tiles, so `plan` and `group` scale by them.
    fn count(&self, r: &GroupRows) -> ([u32; SUMS], u32) {
        let t = GroupTiles::new(self.counted_config(), r.rows);
        let ctas = dequant_ctas(r.rows, self.p.common.k);
        let flags = if r.rows > SMALL_TILE_M { FLAG_WIDE_GROUP } else { 0 };
        ([t.items(0, 1), t.items(1, 1), ctas], flags)
    }

    fn plan(&self, totals: [u32; SUMS], flags: u32) -> Plan {
        let decode = runs_decode(self.p.kernels, flags & FLAG_WIDE_GROUP != 0);
        let slot = kernel_slot(decode);
        let cfg = chosen_config(decode, self.p.general);
        let tiles = WeightTiles::new(cfg, self.p.common.n);
        let totals = [totals[0] * tiles.count(), totals[1] * tiles.count()];
        let items = totals[0] + totals[1];
        let max = self.p.max_items[slot];
        let overflow = items > max;
        let lpt = !decode && !overflow && self.p.lpt_grid > 0 && items > self.p.lpt_grid;
        Plan { decode, cfg, tiles, items: totals, len: if overflow { max } else { items }, lpt, overflow }
    }

    unsafe fn group(&self, plan: &Plan, g: u32, r: &GroupRows, first: [u32; SUMS]) -> [u32; 2] {
        let p = &self.p;
        let (k, n, f) = (p.common.k as u64, p.common.n as u64, r.first as u64);
        let block_m = plan.cfg.tile_rows(r.rows);
        let tail_rows = tail_box_rows(r.rows, block_m);
        // Selected, not indexed (a runtime index would copy the parameters to local memory).
        let token_maps = if plan.decode { p.token_maps[0] } else { p.token_maps[1] };
        // SAFETY: `g < G` indexes the group table; the addresses lie in the validated tensors
        // (`nvfp4_gemm_abi::moe`: rows below the token rows, scale rows below the scale rows).
        unsafe {
            let e = (p.common.groups as *mut GroupParams).add(g as usize);
            (*e).m = r.rows;
            (*e).a_values = p.a_values + f * k / 2;
            (*e).a_scales = p.common.a_scales + r.scale_first as u64 * (k / 16);
            (*e).c = p.common.c + f * n * 2;
            (*e).workspace = p.workspace + f * k * 2;
            (*e).dequant_first_cta = first[2];
            (*e).dequant_ctas = dequant_ctas(r.rows, p.common.k);
            (*e).block_m = block_m;
            (*e).tail_rows = tail_rows;
            (*e).token_row = r.first;
            (*e).token_map = token_maps + block_m - 1;
            (*e).tail_token_map = token_maps + tail_rows - 1;
        }
        [first[0] * plan.tiles.count(), first[1] * plan.tiles.count()]
    }

    unsafe fn arrange(&self, plan: &mut Plan, sm: SmemAddr, tid: u32) {
        if !plan.lpt {
            return;
        }
        let p = &self.p;
        // Threads past the placing ones own no CTA (a grid of 0 for them).
        let grid = if tid < LPT_THREADS { p.lpt_grid } else { 0 };
        let ranks = p.ranks as *mut u32;
        let mine = |i: usize| tid + i as u32 * LPT_THREADS;
        let mut pos = [0u32; CTAS_PER_THREAD];
        // The full-width class starts on empty CTAs; the narrow one on what it leaves.
        let after_first = StepLoads::after_first(plan.items[0], p.costs[0], grid);
        for class in 0..2 {
            // Selected, not indexed: a runtime index into the parameters would copy them to
            // local memory when the loop is not unrolled.
            let (count, cost, loads, rank_base) = if class == 0 {
                (plan.items[0], p.costs[0], StepLoads::ZERO, 0)
            } else {
                (plan.items[1], p.costs[1], after_first, plan.items[0])
            };
            for (i, at) in pos.iter_mut().enumerate() {
                let b = mine(i);
                if b < grid && count > 0 {
                    let start = *at;
                    *at += lpt_picks(b, grid, cost, count, loads, |rank, j| {
                        // SAFETY: `rank_base + rank` < the items ≤ `max_items[1]`, the scratch's
                        // length.
                        unsafe { *ranks.add((rank_base + rank) as usize) = (start + j) * grid + b };
                    });
                }
            }
        }
        // The list ends after the last item (trailing holes dropped, as the host does).
        let mut last = 0;
        for (i, &n) in pos.iter().enumerate() {
            if mine(i) < grid && n > 0 {
                let end = (n - 1) * grid + mine(i) + 1;
                if end > last {
                    last = end;
                }
            }
        }
        let (warp, lane) = (tid / 32, tid % 32);
        // SAFETY: every thread calls it, each warp converged; its scratch row is the layout's. Its
        // barriers also order the ranks written above before the fill reads them.
        let len = unsafe { scan::cta_max(last, warp, lane, WARPS, sm.add(layout::REDUCE)) };
        if len > p.max_list[1] {
            // Not reachable: `lpt_list_capacity` bounds every list of at most `max_items[1]`
            // items. The plain order, cut off, keeps the kernel inside its list regardless.
            *plan = Plan { lpt: false, overflow: true, len: p.max_list[1].min(plan.len), ..*plan };
            return;
        }
        plan.len = len;
        let work = p.common.work as *mut WorkItem;
        for (i, &n) in pos.iter().enumerate() {
            let b = mine(i);
            if b < grid {
                let mut at = n * grid + b;
                while at < len {
                    // SAFETY: `at < len ≤ max_list[1]` indexes the list.
                    unsafe { *work.add(at as usize) = WorkItem::HOLE };
                    at += grid;
                }
            }
        }
    }

    /// The words are the group's first item of each class; the next group's (or the totals)
    /// equal to them means none.
    fn no_items(&self, plan: &Plan, words: [u32; 2], next: impl FnOnce() -> Option<[u32; 2]>) -> bool {
        next().unwrap_or(plan.items) == words
    }

    unsafe fn fill(&self, plan: &Plan, g: u32, words: [u32; 2], lane: u32) {
        let p = &self.p;
        // SAFETY: the sizes array is readable (the scheduler's contract).
        let r = p.common.sizes.group(g, unsafe { crate::moe::sizes_reader(&p.common.sizes) });
        let t = GroupTiles::new(plan.cfg, r.rows);
        let mt = if t.m_tiles == 0 { 1 } else { t.m_tiles };
        let count = plan.tiles.count() * t.m_tiles;
        let (ranks, work) = (p.ranks as *const u32, p.common.work as *mut WorkItem);
        let mut l = lane;
        while l < count {
            let (tile_n, tile_m) = (l / mt, l % mt);
            let at = if plan.lpt {
                let (class, i) = t.class_index(tile_n, tile_m);
                let rank = if class == 0 { words[0] + i } else { plan.items[0] + words[1] + i };
                // SAFETY: `rank` < the items, written by `arrange` before its barriers.
                unsafe { *ranks.add(rank as usize) }
            } else {
                words[0] + words[1] + l
            };
            if at < plan.len {
                let tile_n = plan.tiles.tile_n(tile_n);
                // SAFETY: `at < len ≤ max_list[slot]` indexes the list.
                unsafe { *work.add(at as usize) = WorkItem { group: g, tile_m, tile_n } };
            }
            l += 32;
        }
    }

    unsafe fn finish(&self, plan: &Plan) -> u32 {
        let chosen = kernel_slot(plan.decode);
        for (slot, &word) in self.p.work_len.iter().enumerate() {
            if word != 0 {
                // SAFETY: a launched kernel's length word (the plan's).
                unsafe { *(word as *mut u32) = if slot == chosen { plan.len } else { 0 } };
            }
        }
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
/// `p` must be what the host's device-sized sm90 plan writes: the sizes array holds
/// `sizes_len()` readable `u32`s, the group table `G` entries, the work list `max(max_list)`
/// items, the ranks scratch `max_items[1]` words, `lpt_grid ≤ LPT_MAX_CTAS`; the bases and bounds
/// are those the plan validated the buffers against.
#[crate::ptx::kernel]
pub unsafe fn sm90_schedule(p: Sm90ScheduleParams) {
    // SAFETY: the caller's contract.
    unsafe { schedule(&Sm90 { p }) }
}

// `sm90_quantize_schedule` has one branch per scheduler.
const _: () = assert!(SCHEDULE_CTAS == 2);

/// The MoE block's quantization (or gather) and both GEMMs' schedulers in one grid
/// (`nvfp4_gemm_abi::moe::sm90::QUANTIZE_SCHEDULE_KERNEL`): CTA 0 schedules the first GEMM,
/// CTA 1 the second, the others quantize. Launch: `quantize_schedule_launch`.
///
/// # Safety
/// `p.schedules` as `sm90_schedule`'s parameters, `p.quantize` as `nvfp4_quantize_grouped`'s;
/// the quantization writes nothing the schedulers read or write.
#[crate::ptx::kernel]
pub unsafe fn sm90_quantize_schedule(p: QuantizeScheduleParams) {
    crate::moe::start_in_chain();
    let cta = sreg::ctaid_x();
    // Each scheduler inlined on its own parameters (a selected copy of either would go through
    // local memory).
    // SAFETY: the caller's contract; the wait above is the schedulers' and the quantization's.
    unsafe {
        if cta == 0 {
            schedule_after_wait(&Sm90 { p: p.schedules[0] });
        } else if cta == 1 {
            schedule_after_wait(&Sm90 { p: p.schedules[1] });
        } else {
            quantize_grouped(&p.quantize, cta - SCHEDULE_CTAS, sreg::nctaid_x() - SCHEDULE_CTAS, SCHEDULE_THREADS);
        }
    }
}
