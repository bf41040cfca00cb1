//! The MoE block's routing and combine kernels (both architectures; `nvfp4_gemm_abi::moe_block`,
//! docs/moe-block.md "The GPU block").
//!
//! `moe_route` is one CTA that sorts the slots by local expert with a stable counting sort, with
//! no atomics: slots go in tiles of one per thread; inside a warp each slot's rank among the
//! warp's earlier slots of its expert comes from 32 shuffles, and the warps of a tile take turns
//! (a CTA barrier per warp) to read and advance the per-expert counters in shared memory, so the
//! order and every output are deterministic. A CTA-wide scan turns the counts into offsets, and
//! a second pass over the slots writes each slot's row (its expert's first row plus its rank).
//!
//! For many slots the same outputs come from three launches over chunks of consecutive slots,
//! one CTA per chunk, still without atomics: `moe_route_count` counts each chunk's slots per
//! expert (the same warp ranking and barrier turns), `moe_route_scan` (one CTA) turns the
//! (chunk, expert) counts, expert-major and chunk-minor, into the offsets and each pair's first
//! row, and `moe_route_scatter` ranks each chunk's slots again from those first rows and writes
//! the rows. A slot's row is then its expert's first row, plus the slots of its expert in earlier
//! chunks, plus its rank in its own chunk: the one-CTA kernel's row.
//!
//! `moe_combine` is grid-strided over (token, 8 values of H): each item sums its token's local
//! rows of `o` in `f32` and stores 16 bytes of `y`.

use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{barrier, convert, sreg, warp};
use crate::scan::cta_exclusive_sums;
use nvfp4_gemm_abi::moe_block::{
    half_bits_to_f32, local_expert, CombineParams, RouteParams, COMBINE_THREADS, COMBINE_VECTOR, NOT_LOCAL,
    ROUTE_EXPERTS_PER_THREAD, ROUTE_MAX_EXPERTS, ROUTE_THREADS,
};

/// 16 bytes, so that loads and stores through it become `ld.v4` / `st.v4`.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct U32x4([u32; 4]);

const WARPS: u32 = ROUTE_THREADS / 32;

/// The local expert of slot `s`, or [`NOT_LOCAL`].
///
/// # Safety
/// `s` is below `T · top_k`; `p.ids` holds that many ids of its width.
#[inline(always)]
unsafe fn slot_expert(p: &RouteParams, s: u32) -> u32 {
    // SAFETY: the caller's contract.
    let id = unsafe {
        if p.ids_i64 != 0 {
            *(p.ids as *const i64).add(s as usize)
        } else {
            *(p.ids as *const i32).add(s as usize) as i64
        }
    };
    local_expert(id, p.first_expert, p.experts).unwrap_or(NOT_LOCAL)
}

/// Slot `s`'s router weight as f32.
///
/// # Safety
/// `s` is below `T · top_k`; `weights` holds that many weights of its type.
#[inline(always)]
unsafe fn slot_weight(weights: u64, bf16: u32, s: u32) -> f32 {
    // SAFETY: the caller's contract.
    unsafe {
        if bf16 != 0 {
            half_bits_to_f32(*(weights as *const u16).add(s as usize), true)
        } else {
            *(weights as *const f32).add(s as usize)
        }
    }
}

/// Each local expert's counter in shared memory (`base`, one `u32` per expert, the scan's table
/// after `ROUTE_MAX_EXPERTS` of them) turned into the expert's first row, and `p.offsets`
/// written (`experts + 1` of them): a CTA-wide exclusive prefix sum over the experts, each thread
/// owning `ROUTE_EXPERTS_PER_THREAD` consecutive counters. Ends with a CTA barrier.
///
/// # Safety
/// Every thread of the CTA, after a barrier that follows every write of the counters; the
/// counters and the table are this kernel's alone; `p.offsets` holds `experts + 1` writable
/// `u32`s.
#[inline(always)]
unsafe fn counts_to_first_rows(p: &RouteParams, base: SmemAddr, tid: u32) {
    let (warp_id, lane) = (tid / 32, tid % 32);
    let counter = |e: u32| base.add(4 * e);
    let table = base.add(4 * ROUTE_MAX_EXPERTS);
    let own = tid * ROUTE_EXPERTS_PER_THREAD;
    let mut counts = [0u32; ROUTE_EXPERTS_PER_THREAD as usize];
    let mut sum = 0;
    for (i, c) in counts.iter_mut().enumerate() {
        if own + (i as u32) < p.experts {
            // SAFETY: written before the caller's barrier.
            *c = unsafe { smem::ld_u32(counter(own + i as u32)) };
            sum += *c;
        }
    }
    // SAFETY: every thread calls it; the table is this kernel's alone.
    let (before, total, _) = unsafe { cta_exclusive_sums::<1>([sum], 0, warp_id, lane, WARPS, table) };
    let offsets = p.offsets as *mut u32;
    let mut start = before[0];
    for (i, c) in counts.iter().enumerate() {
        let e = own + i as u32;
        if e < p.experts {
            // SAFETY: this thread's own counters (every read of them was before the scan's
            // barrier); e < experts offsets.
            unsafe {
                smem::st_u32(counter(e), start);
                *offsets.add(e as usize) = start;
            }
            start += c;
        }
    }
    if tid == 0 {
        // SAFETY: `experts + 1` offsets.
        unsafe { *offsets.add(p.experts as usize) = total[0] };
    }
    // SAFETY: every thread reaches it.
    unsafe { barrier::sync_all() };
}

/// See the module docs. Launch: `nvfp4_gemm_abi::moe_block::route_launch()` (one CTA of
/// [`ROUTE_THREADS`], `ROUTE_SMEM` bytes of dynamic shared memory).
///
/// # Safety
/// `p.ids` holds `T · top_k` ids; `p.offsets` `experts + 1` writable u32; `p.slot_row` and
/// `p.row_token` `T · top_k` writable u32 each; `p.row_weight` 0 or `T · top_k` writable f32,
/// and then `p.weights` `T · top_k` weights; `1 ≤ experts ≤ ROUTE_MAX_EXPERTS`, `top_k ≥ 1`,
/// `T · top_k ≤ ROUTE_MAX_SLOTS`; no output overlaps another buffer. The host's
/// `BlockKernels::route` checks all of it.
#[crate::ptx::kernel]
pub unsafe fn moe_route(p: RouteParams) {
    crate::moe::start_in_chain();
    // Outside the contract (the host refuses these): nothing to do, and no division by zero.
    if p.top_k == 0 || p.experts == 0 || p.experts > ROUTE_MAX_EXPERTS {
        return;
    }
    let tid = sreg::tid_x();
    let (warp_id, lane) = (tid / 32, tid % 32);
    let base = smem::dynamic_base();
    let counter = |e: u32| base.add(4 * e);
    let slots = p.tokens * p.top_k;
    let slot_row = p.slot_row as *mut u32;

    let mut e = tid;
    while e < p.experts {
        // SAFETY: below ROUTE_MAX_EXPERTS counters; each written by one thread.
        unsafe { smem::st_u32(counter(e), 0) };
        e += ROUTE_THREADS;
    }
    // SAFETY: every thread reaches it.
    unsafe { barrier::sync_all() };

    // Pass 1: each local slot's rank among its expert's earlier slots, into `slot_row`.
    let mut first = 0;
    while first < slots {
        let s = first + tid;
        // SAFETY: s < slots.
        let key = if s < slots { unsafe { slot_expert(&p, s) } } else { NOT_LOCAL };
        let (mut rank, mut same) = (0u32, 0u32);
        for j in 0..32 {
            if warp::shfl_idx(key, j) == key {
                if j < lane {
                    rank += 1;
                }
                same += 1;
            }
        }
        for w in 0..WARPS {
            if warp_id == w {
                // SAFETY: `key` < experts; the warp reads its counters before its first lane of
                // each expert advances them (`bar.warp.sync` between); other warps touch them
                // only after the CTA barrier below.
                unsafe {
                    let earlier = if key != NOT_LOCAL { smem::ld_u32(counter(key)) } else { 0 };
                    warp::sync();
                    if key != NOT_LOCAL {
                        *slot_row.add(s as usize) = earlier + rank;
                        if rank == 0 {
                            smem::st_u32(counter(key), earlier + same);
                        }
                    }
                }
            }
            // SAFETY: every thread reaches it (the loop bounds are uniform).
            unsafe { barrier::sync_all() };
        }
        first += ROUTE_THREADS;
    }

    // The counts to each expert's first row, and the offsets.
    // SAFETY: every thread, after the barrier that follows the counters' writes.
    unsafe { counts_to_first_rows(&p, base, tid) };

    // Pass 2: each slot's row.
    let mut first = 0;
    while first < slots {
        let s = first + tid;
        if s < slots {
            // SAFETY: s < slots; the rank was written by this thread in pass 1; `row` is below
            // offsets[experts] ≤ slots.
            unsafe {
                let key = slot_expert(&p, s);
                if key == NOT_LOCAL {
                    *slot_row.add(s as usize) = NOT_LOCAL;
                } else {
                    let row = smem::ld_u32(counter(key)) + *slot_row.add(s as usize);
                    *slot_row.add(s as usize) = row;
                    *(p.row_token as *mut u32).add(row as usize) = s / p.top_k;
                    if p.row_weight != 0 {
                        *(p.row_weight as *mut f32).add(row as usize) = slot_weight(p.weights, p.weights_bf16, s);
                    }
                }
            }
        }
        first += ROUTE_THREADS;
    }
}

/// Whether `p` is outside what every routing kernel handles (the host refuses these): nothing
/// to do, and no division by zero.
#[inline(always)]
fn route_refused(p: &RouteParams) -> bool {
    p.top_k == 0 || p.experts == 0 || p.experts > ROUTE_MAX_EXPERTS
}

/// Chunk `c`'s slots `lo .. hi` of the multi-CTA path.
#[inline(always)]
fn chunk_range(p: &RouteParams, c: u32) -> (u32, u32) {
    let slots = p.tokens as u64 * p.top_k as u64;
    let lo = (c as u64 * p.chunk_slots as u64).min(slots);
    let hi = (lo + p.chunk_slots as u64).min(slots);
    (lo as u32, hi as u32)
}

/// Ranks slots `lo .. hi` in tiles of one per thread, in slot order, with the counters at
/// `counter(e) = base + 4 · e`: each local slot gets its expert's counter plus its rank among
/// the earlier slots of its expert in the walk, and the counters advance by the slots they
/// count. Calls `f(s, expert, row)` for every slot (`expert` [`NOT_LOCAL`] and `row` 0 for the
/// others) after its tile's turns. Holds `WARPS` CTA barriers per tile, the last after the
/// counters' final update.
///
/// # Safety
/// Every thread of the CTA calls it with the same `lo`, `hi`; `hi ≤ T · top_k`; the counters of
/// the experts below `p.experts` are shared memory of this CTA, written before a CTA barrier and
/// touched by nobody else during the call.
#[inline(always)]
unsafe fn rank_slots(p: &RouteParams, lo: u32, hi: u32, base: SmemAddr, mut f: impl FnMut(u32, u32, u32)) {
    let tid = sreg::tid_x();
    let (warp_id, lane) = (tid / 32, tid % 32);
    let counter = |e: u32| base.add(4 * e);
    let mut first = lo;
    while first < hi {
        let s = first + tid;
        // SAFETY: s < hi ≤ slots.
        let key = if s < hi { unsafe { slot_expert(p, s) } } else { NOT_LOCAL };
        let (mut rank, mut same) = (0u32, 0u32);
        for j in 0..32 {
            if warp::shfl_idx(key, j) == key {
                if j < lane {
                    rank += 1;
                }
                same += 1;
            }
        }
        let mut earlier = 0;
        for w in 0..WARPS {
            if warp_id == w {
                // SAFETY: `key` < experts; the warp reads its counters before its first lane of
                // each expert advances them (`bar.warp.sync` between); other warps touch them
                // only after the CTA barrier below.
                unsafe {
                    if key != NOT_LOCAL {
                        earlier = smem::ld_u32(counter(key));
                    }
                    warp::sync();
                    if key != NOT_LOCAL && rank == 0 {
                        smem::st_u32(counter(key), earlier + same);
                    }
                }
            }
            // SAFETY: every thread reaches it (the loop bounds are uniform).
            unsafe { barrier::sync_all() };
        }
        if s < hi {
            f(s, key, earlier + rank);
        }
        first += ROUTE_THREADS;
    }
}

/// The multi-CTA path's first launch (module docs): CTA `c` counts chunk `c`'s slots per local
/// expert into `counts[c · experts + e]`. Launch: `route_chunk_launch(p.chunks)`.
///
/// # Safety
/// As [`moe_route`], and `p.counts` holds `chunks · experts` writable u32 overlapping no other
/// buffer, `chunks · chunk_slots ≥ T · top_k`. The host's `BlockKernels::route` checks all of it.
#[crate::ptx::kernel]
pub unsafe fn moe_route_count(p: RouteParams) {
    crate::moe::start_in_chain();
    let c = sreg::ctaid_x();
    if route_refused(&p) || c >= p.chunks {
        return;
    }
    let tid = sreg::tid_x();
    let base = smem::dynamic_base();
    let mut e = tid;
    while e < p.experts {
        // SAFETY: below ROUTE_MAX_EXPERTS counters; each written by one thread.
        unsafe { smem::st_u32(base.add(4 * e), 0) };
        e += ROUTE_THREADS;
    }
    // SAFETY: every thread reaches it.
    unsafe { barrier::sync_all() };
    let (lo, hi) = chunk_range(&p, c);
    // SAFETY: every thread, the same chunk; the counters zeroed before the barrier. Its last
    // barrier follows the counters' final update (or, for an empty chunk, the one above does).
    unsafe { rank_slots(&p, lo, hi, base, |_, _, _| {}) };
    let counts = p.counts as *mut u32;
    let mut e = tid;
    while e < p.experts {
        // SAFETY: c < chunks, e < experts: inside the scratch.
        unsafe { *counts.add((c * p.experts + e) as usize) = smem::ld_u32(base.add(4 * e)) };
        e += ROUTE_THREADS;
    }
}

/// The multi-CTA path's second launch (module docs), one CTA: the offsets, and in place of each
/// (chunk, expert) count that pair's first row (the expert's first row plus its slots in the
/// earlier chunks). Launch: `route_launch()`.
///
/// # Safety
/// As [`moe_route_count`], after it.
#[crate::ptx::kernel]
pub unsafe fn moe_route_scan(p: RouteParams) {
    crate::moe::start_in_chain();
    if route_refused(&p) {
        return;
    }
    let tid = sreg::tid_x();
    let base = smem::dynamic_base();
    let counter = |e: u32| base.add(4 * e);
    let counts = p.counts as *mut u32;

    // Each expert's total over the chunks.
    let mut e = tid;
    while e < p.experts {
        let mut total = 0;
        for c in 0..p.chunks {
            // SAFETY: inside the scratch.
            total += unsafe { *counts.add((c * p.experts + e) as usize) };
        }
        // SAFETY: below ROUTE_MAX_EXPERTS counters; each written by one thread.
        unsafe { smem::st_u32(counter(e), total) };
        e += ROUTE_THREADS;
    }
    // SAFETY: every thread reaches it.
    unsafe { barrier::sync_all() };

    // The counts to each expert's first row, and the offsets.
    // SAFETY: every thread, after the barrier that follows the counters' writes.
    unsafe { counts_to_first_rows(&p, base, tid) };

    // Each (chunk, expert) pair's first row, chunks in order.
    let mut e = tid;
    while e < p.experts {
        // SAFETY: written before the barrier.
        let mut row = unsafe { smem::ld_u32(counter(e)) };
        for c in 0..p.chunks {
            // SAFETY: inside the scratch; this thread's expert alone.
            unsafe {
                let at = counts.add((c * p.experts + e) as usize);
                let n = *at;
                *at = row;
                row += n;
            }
        }
        e += ROUTE_THREADS;
    }
}

/// The multi-CTA path's last launch (module docs): CTA `c` ranks chunk `c`'s slots from its
/// pairs' first rows and writes `slot_row`, `row_token` and `row_weight`. Launch:
/// `route_chunk_launch(p.chunks)`.
///
/// # Safety
/// As [`moe_route_count`], after [`moe_route_scan`].
#[crate::ptx::kernel]
pub unsafe fn moe_route_scatter(p: RouteParams) {
    crate::moe::start_in_chain();
    let c = sreg::ctaid_x();
    if route_refused(&p) || c >= p.chunks {
        return;
    }
    let tid = sreg::tid_x();
    let base = smem::dynamic_base();
    let counts = p.counts as *const u32;
    let mut e = tid;
    while e < p.experts {
        // SAFETY: below ROUTE_MAX_EXPERTS counters, each written by one thread; c < chunks,
        // e < experts: inside the scratch.
        unsafe { smem::st_u32(base.add(4 * e), *counts.add((c * p.experts + e) as usize)) };
        e += ROUTE_THREADS;
    }
    // SAFETY: every thread reaches it.
    unsafe { barrier::sync_all() };
    let (lo, hi) = chunk_range(&p, c);
    let slot_row = p.slot_row as *mut u32;
    // SAFETY: every thread, the same chunk; the counters written before the barrier. In `f`:
    // s < slots; a row is below offsets[experts] ≤ slots, each written by its one slot.
    unsafe {
        rank_slots(&p, lo, hi, base, |s, key, row| {
            if key == NOT_LOCAL {
                *slot_row.add(s as usize) = NOT_LOCAL;
            } else {
                *slot_row.add(s as usize) = row;
                *(p.row_token as *mut u32).add(row as usize) = s / p.top_k;
                if p.row_weight != 0 {
                    *(p.row_weight as *mut f32).add(row as usize) = slot_weight(p.weights, p.weights_bf16, s);
                }
            }
        })
    };
}

/// Slots whose rows `moe_combine` loads together.
const COMBINE_CHUNK: usize = 4;

/// See the module docs: `y[t, h] = D(Σ_k w[t, k] · o[slot_row[t · top_k + k], h])` over the
/// local slots in `k` ascending, an `f32` sum from +0 of rounded products (no fma), rounded once
/// to D (`nvfp4_gemm_abi::moe_block::combine_sum`). Launch: `combine_launch`, any grid.
///
/// # Safety
/// `p.o` holds `rows · hidden` 16-bit values, `p.slot_row` `T · top_k` u32, `p.weights` 0 or
/// `T · top_k` weights, `p.y` `T · hidden` writable values overlapping no input; `o` and `y`
/// 16-byte aligned; `hidden` a positive multiple of 64; `top_k ≥ 1`. The host's
/// `BlockKernels::combine` checks all of it.
#[crate::ptx::kernel]
pub unsafe fn moe_combine(p: CombineParams) {
    crate::moe::start_in_chain();
    let vectors = p.hidden / COMBINE_VECTOR;
    let items = p.tokens as u64 * vectors as u64;
    if vectors == 0 || p.top_k == 0 {
        return;
    }
    let bf16 = p.bf16 != 0;
    let mut item = (sreg::ctaid_x() * COMBINE_THREADS + sreg::tid_x()) as u64;
    let stride = (sreg::nctaid_x() * COMBINE_THREADS) as u64;
    while item < items {
        let t = (item / vectors as u64) as u32;
        let c = (item % vectors as u64) as u32;
        let mut acc = [0.0f32; COMBINE_VECTOR as usize];
        // The slots in chunks of COMBINE_CHUNK: each chunk's rows and weights are loaded
        // together, then its rows' vectors, then summed in `k` order (two dependent loads per
        // chunk rather than per slot).
        let mut k0 = 0;
        while k0 < p.top_k {
            let mut rows = [NOT_LOCAL; COMBINE_CHUNK];
            let mut w = [1.0f32; COMBINE_CHUNK];
            for i in 0..COMBINE_CHUNK {
                let s = t * p.top_k + k0 + i as u32;
                if k0 + (i as u32) < p.top_k {
                    // SAFETY: s < T · top_k (the slot arrays' lengths).
                    unsafe {
                        rows[i] = *(p.slot_row as *const u32).add(s as usize);
                        if p.weights != 0 {
                            w[i] = slot_weight(p.weights, p.weights_bf16, s);
                        }
                    }
                }
            }
            let local = rows.map(|r| r != NOT_LOCAL && r < p.rows);
            let mut v = [[0u32; 4]; COMBINE_CHUNK];
            for i in 0..COMBINE_CHUNK {
                if local[i] {
                    let at = rows[i] as usize * p.hidden as usize + (c * COMBINE_VECTOR) as usize;
                    // SAFETY: a row below `rows` is in `o` (16-byte aligned: hidden is a multiple
                    // of 8 values).
                    v[i] = unsafe { (*((p.o as *const u16).add(at) as *const U32x4)).0 };
                }
            }
            for i in 0..COMBINE_CHUNK {
                if local[i] {
                    for (e, a) in acc.iter_mut().enumerate() {
                        let bits = (v[i][e / 2] >> (16 * (e as u32 % 2))) as u16;
                        *a += w[i] * half_bits_to_f32(bits, bf16);
                    }
                }
            }
            k0 += COMBINE_CHUNK as u32;
        }
        let pack = |lo: f32, hi: f32| {
            if bf16 {
                convert::f32x2_to_bf16x2(lo, hi)
            } else {
                convert::f32x2_to_f16x2(lo, hi)
            }
        };
        let out = U32x4([pack(acc[0], acc[1]), pack(acc[2], acc[3]), pack(acc[4], acc[5]), pack(acc[6], acc[7])]);
        let at = t as usize * p.hidden as usize + (c * COMBINE_VECTOR) as usize;
        // SAFETY: t < T, the item's 8 values are in `y` (16-byte aligned).
        unsafe { *((p.y as *mut u16).add(at) as *mut U32x4) = out };
        item += stride;
    }
}
