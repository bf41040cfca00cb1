//! Warp-wide prefix sums and reductions on `shfl.sync.bfly`, and CTA-wide ones on top of them
//! (the scheduling kernels, `crate::schedule`). Every lane of a converged warp must call them.

use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{barrier, warp};

/// The sum of `x` over the lanes below `lane` (exclusive prefix) and over the whole warp.
///
/// Butterfly: after step `b`, `total` is the sum over the aligned block of `2^(b+1)` lanes that
/// holds this lane; a lane in the upper half of that block adds the lower half's sum to its prefix.
#[inline(always)]
pub fn warp_exclusive_sum(x: u32, lane: u32) -> (u32, u32) {
    let (mut total, mut before) = (x, 0u32);
    for bit in 0..5 {
        let other = warp::shfl_xor(total, 1 << bit);
        if lane & (1 << bit) != 0 {
            before += other;
        }
        total += other;
    }
    (before, total)
}

/// The largest `x` over each aligned group of `2^bits` lanes (`bits` ≤ 5), in every lane of the
/// group.
#[inline(always)]
pub fn lanes_max(x: u32, bits: u32) -> u32 {
    let mut v = x;
    for bit in 0..bits {
        let other = warp::shfl_xor(v, 1 << bit);
        if other > v {
            v = other;
        }
    }
    v
}

/// The largest `x` over the warp.
#[inline(always)]
pub fn warp_max(x: u32) -> u32 {
    lanes_max(x, 5)
}

/// The bitwise OR of `x` over the warp.
#[inline(always)]
pub fn warp_or(x: u32) -> u32 {
    let mut v = x;
    for bit in 0..5 {
        v |= warp::shfl_xor(v, 1 << bit);
    }
    v
}

/// Exclusive prefix sums over every thread of a CTA of `warps` warps, of `N` values per thread,
/// and the bitwise OR of `status` over the CTA: returns (the sums over the threads below this
/// one, the CTA totals, the OR). Warp butterflies, then the warp totals through shared memory:
/// value `j` of warp `w` at `table + 4 · (warps · j + w)`, the status of warp `w` at
/// `table + 4 · (warps · N + w)` (the scheduling kernels' `schedule_smem` layout, whose per-warp
/// tables start at 0 in this order), scanned again by a butterfly in every warp.
///
/// # Safety
/// Every thread of the CTA calls it, each warp converged (it holds a CTA barrier), `warps ≤ 32`;
/// `table` is
/// `4 · warps · (N + 1)` bytes of shared memory that nobody else uses during the call.
#[inline(always)]
pub unsafe fn cta_exclusive_sums<const N: usize>(
    x: [u32; N],
    status: u32,
    warp: u32,
    lane: u32,
    warps: u32,
    table: SmemAddr,
) -> ([u32; N], [u32; N], u32) {
    let at = |j: u32, w: u32| table.add(4 * (warps * j + w));
    let mut before = [0u32; N];
    let mut warp_total = [0u32; N];
    for j in 0..N {
        (before[j], warp_total[j]) = warp_exclusive_sum(x[j], lane);
    }
    let warp_status = warp_or(status);
    // SAFETY: each word is written by one lane and read after the barrier, which every thread
    // reaches (the caller's contract).
    unsafe {
        if lane == 0 {
            for j in 0..N {
                smem::st_u32(at(j as u32, warp), warp_total[j]);
            }
            smem::st_u32(at(N as u32, warp), warp_status);
        }
        barrier::sync_all();
    }
    // Every warp scans the warp totals itself, lane `w` holding warp `w`'s: `N + 1` loads per
    // thread whatever the warps, and no second barrier.
    let mut total = [0u32; N];
    let theirs = lane < warps;
    for j in 0..N {
        // SAFETY: written before the barrier.
        let t = if theirs { unsafe { smem::ld_u32(at(j as u32, lane)) } } else { 0 };
        let (below, all) = warp_exclusive_sum(t, lane);
        before[j] += warp::shfl_idx(below, warp);
        total[j] = all;
    }
    // SAFETY: written before the barrier.
    let s = if theirs { unsafe { smem::ld_u32(at(N as u32, lane)) } } else { 0 };
    (before, total, warp_or(s))
}

/// The largest `x` over every thread of a CTA of `warps` warps, through `table` (one word per
/// warp).
///
/// # Safety
/// Every thread of the CTA calls it, each warp converged (it holds two CTA barriers), `warps ≤
/// 32`; `table` is `4 · warps` bytes of shared memory that nobody else uses during the call.
#[inline(always)]
pub unsafe fn cta_max(x: u32, warp: u32, lane: u32, warps: u32, table: SmemAddr) -> u32 {
    let m = warp_max(x);
    // SAFETY: one lane per warp writes its word; every thread reaches both barriers (the
    // caller's contract), the second one before anybody may reuse the table.
    unsafe {
        if lane == 0 {
            smem::st_u32(table.add(4 * warp), m);
        }
        barrier::sync_all();
        // Lane `w` reads warp `w`'s word: one load per thread whatever the warps.
        let v = if lane < warps { smem::ld_u32(table.add(4 * lane)) } else { 0 };
        barrier::sync_all();
        warp_max(v)
    }
}
