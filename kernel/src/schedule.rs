//! One scheduler for device-resident group sizes, generic over a tile policy: `sm90_schedule`
//! and `sm100_schedule` are this function with their architecture's [`TilePolicy`]
//! (`nvfp4_gemm_abi::moe::schedule` for the shared contract). One CTA of `SCHEDULE_THREADS`
//! threads; thread `t` owns the consecutive groups `thread_groups(G, t)`.
//!
//! 1. Each thread reads its groups' sizes (clamped) and sums the values the policy counts per
//!    group (tiles, dequantization CTAs, ...); the policy's flags are ORed with the status bits.
//! 2. Exclusive prefix sums over the threads ([`scan::cta_exclusive_sums`]) give each thread's
//!    first values; the policy plans the call from the totals and the flags (which kernel, the
//!    list's length); a second pass over the thread's groups writes their size-dependent table
//!    fields (plain stores of those fields only: the host wrote the others) and two words per
//!    group to shared memory.
//! 3. After a barrier, the policy may arrange the list with every thread (the sm_90a LPT order);
//!    then warp `w` fills the items of groups `w, w + warps, ...`, one item per lane at a time.
//! 4. Thread 0 writes the length and ORs the status bits into the status word.
//!
//! It may be launched early (programmatic dependent launch): it waits for the launch before it
//! before reading anything.

use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{barrier, sreg};
use crate::scan;
use nvfp4_gemm_abi::moe::schedule::{smem as layout, thread_groups, ScheduleCommon, FLAG_SHIFT, SUMS};
use nvfp4_gemm_abi::moe::GroupRows;

/// Warps of the scheduling CTA.
pub(crate) const WARPS: u32 = layout::WARPS;

/// An architecture's part of the scheduler: what it counts per group, what it writes into its
/// group table, and where each item of its list goes.
pub(crate) trait TilePolicy {
    /// What the policy decides for a call once the totals are known (the same in every thread).
    type Plan: Copy;

    /// The common parameters.
    fn common(&self) -> &ScheduleCommon;

    /// The values group `r` adds to the CTA's sums, and its flags (ORed over the CTA, below
    /// `1 << (32 − FLAG_SHIFT)`).
    fn count(&self, r: &GroupRows) -> ([u32; SUMS], u32);

    /// The call's plan from the CTA's totals and the OR of the flags.
    fn plan(&self, totals: [u32; SUMS], flags: u32) -> Self::Plan;

    /// Writes group `g`'s size-dependent table fields (`first`: the exclusive prefix of the
    /// counted values at `g`) and returns its two words for [`Self::fill`].
    ///
    /// # Safety
    /// `g` indexes the group table; the common parameters are the plan's.
    unsafe fn group(&self, plan: &Self::Plan, g: u32, r: &GroupRows, first: [u32; SUMS]) -> [u32; 2];

    /// Every thread, after the barrier that follows the group pass: arranges what the fill needs
    /// from all groups (a policy without an arrangement does nothing). May hold CTA barriers.
    ///
    /// # Safety
    /// Every thread of the CTA calls it, each warp converged; `sm` is the scheduler's shared
    /// memory (`nvfp4_gemm_abi::moe::schedule::smem`).
    unsafe fn arrange(&self, _plan: &mut Self::Plan, _sm: SmemAddr, _tid: u32) {}

    /// Whether a group has no items, from its [`Self::group`] words and `next()`, the next
    /// group's (`None` for the last group), both in shared memory: the fill then skips it without
    /// calling [`Self::fill`] (which may read the group's size from global memory). A policy
    /// that cannot tell says `false` (and reads nothing).
    fn no_items(&self, _plan: &Self::Plan, _words: [u32; 2], _next: impl FnOnce() -> Option<[u32; 2]>) -> bool {
        false
    }

    /// One lane's share (items `lane, lane + 32, ...`) of group `g`'s items, `words` its
    /// [`Self::group`] words.
    ///
    /// # Safety
    /// `g` indexes the group table and the list is the plan's.
    unsafe fn fill(&self, plan: &Self::Plan, g: u32, words: [u32; 2], lane: u32);

    /// Thread 0, last: writes the list's length word(s) and returns status bits to raise.
    ///
    /// # Safety
    /// The length words are the plan's.
    unsafe fn finish(&self, plan: &Self::Plan) -> u32;
}

/// The scheduler (module docs) with `policy`. Launch: one CTA of `SCHEDULE_THREADS` threads,
/// `smem::bytes(G)` bytes of dynamic shared memory.
///
/// # Safety
/// Every thread of the CTA calls it. The parameters are what the host's device-sized plan writes:
/// the sizes array holds `sizes_len()` readable `u32`s, the group table `G` entries, the list and
/// the words the policy writes are the plan's; the bases and bounds are those the plan validated
/// the buffers against.
#[inline(always)]
pub(crate) unsafe fn schedule<P: TilePolicy>(policy: &P) {
    // The launch before this one may still run (programmatic dependent launch): wait for it
    // before reading the sizes or writing tables it may read; then let the next launch be
    // scheduled (a dependent that reads these tables waits for this grid first).
    barrier::grid_wait_then_release();
    // SAFETY: the caller's contract.
    unsafe { schedule_after_wait(policy) }
}

/// [`schedule`] in a kernel that has waited for the launch before it already
/// (`sm90_quantize_schedule`).
///
/// # Safety
/// As [`schedule`], after `barrier::grid_wait_then_release`.
#[inline(always)]
pub(crate) unsafe fn schedule_after_wait<P: TilePolicy>(policy: &P) {
    let p = policy.common();
    let tid = sreg::tid_x();
    let (warp, lane) = (tid / 32, tid % 32);
    let groups = p.sizes.groups;
    // SAFETY: the sizes array is readable (the caller's contract).
    let load = unsafe { crate::moe::sizes_reader(&p.sizes) };
    let sm = smem::dynamic_base();
    let (first, end) = thread_groups(groups, tid);

    // 1. This thread's groups.
    let (mut mine, mut status) = ([0u32; SUMS], 0u32);
    let mut g = first;
    while g < end {
        let r = p.sizes.group(g, load);
        let (counts, flags) = policy.count(&r);
        for j in 0..SUMS {
            mine[j] += counts[j];
        }
        status |= r.status | (flags << FLAG_SHIFT);
        g += 1;
    }

    // 2. Prefix sums over the threads, the plan, the groups' fields.
    // SAFETY: every thread calls it, each warp converged; the per-warp table at the start of the
    // layout.
    let (mut base, totals, all) =
        unsafe { scan::cta_exclusive_sums(mine, status, warp, lane, WARPS, sm.add(layout::WARP_TABLE)) };
    let mut plan = policy.plan(totals, all >> FLAG_SHIFT);
    let word = |g: u32, i: u32| sm.add(layout::group_word(g, i));
    let mut g = first;
    while g < end {
        let r = p.sizes.group(g, load);
        let (counts, _) = policy.count(&r);
        // SAFETY: `g < G` indexes the group table and the shared words.
        unsafe {
            let w = policy.group(&plan, g, &r, base);
            smem::st_u32(word(g, 0), w[0]);
            smem::st_u32(word(g, 1), w[1]);
        }
        for j in 0..SUMS {
            base[j] += counts[j];
        }
        g += 1;
    }
    // SAFETY: every thread reaches the barrier and the arrangement (the caller's contract).
    unsafe {
        barrier::sync_all();
        policy.arrange(&mut plan, sm, tid);
    }

    // 3. The work list, a warp per group (groups without items skipped on their shared words).
    // SAFETY: `g < G`: written before the barrier.
    let words = |g: u32| unsafe { [smem::ld_u32(word(g, 0)), smem::ld_u32(word(g, 1))] };
    let mut g = warp;
    while g < groups {
        let mine = words(g);
        if !policy.no_items(&plan, mine, || if g + 1 < groups { Some(words(g + 1)) } else { None }) {
            // SAFETY: `g < G`.
            unsafe { policy.fill(&plan, g, mine, lane) };
        }
        g += WARPS;
    }

    // 4. Length and status.
    if tid == 0 {
        // SAFETY: the plan's words.
        unsafe {
            let s = (all & ((1 << FLAG_SHIFT) - 1)) | policy.finish(&plan);
            if s != 0 {
                *(p.status as *mut u32) |= s;
            }
        }
    }
}
