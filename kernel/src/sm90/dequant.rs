//! `sm90_dequant_tokens`: the token operand A of every group, NVFP4 → f16 (scale applied, exact),
//! into the workspace, with K permuted inside each 64-wide chunk as `token_k_position` says.
//!
//! Work item = (row, 64-wide chunk): 32 bytes of values and one 4-byte scale word in, 128 bytes
//! out, handled by `DEQUANT_THREADS_PER_ITEM` = 8 consecutive threads, thread `j` writing the
//! 16-byte slot `j` (`dequant_slot_words`). Items follow each other in the workspace (item
//! `row · k/64 + chunk` starts at byte `128 · item` of the group's rows), so a warp's 16-byte stores
//! cover 512 contiguous bytes and its loads 4 × 32 contiguous bytes. Each thread takes
//! `DEQUANT_ITEMS_PER_THREAD` items per pass and issues all their loads before decoding any.
//! CTAs `dequant_first_cta .. + dequant_ctas` of the grid belong to each group.

use super::U32x4;
use crate::ptx::{barrier, convert, sreg};
use crate::scan;
use nvfp4_gemm_abi::scale_layout::{blocked_word_offset, rest_k};
use nvfp4_gemm_abi::sm90::{
    dequant_slot_words, GroupParams, KernelParams, CHUNK_K, DEQUANT_ITEMS_PER_CTA, DEQUANT_ITEMS_PER_THREAD,
    DEQUANT_THREADS, DEQUANT_THREADS_PER_ITEM,
};

/// See the module docs. Launch: `nvfp4_gemm_abi::sm90::dequant_launch` (`DEQUANT_THREADS`
/// threads per CTA, `Σ dequant_ctas` CTAs).
///
/// # Safety
/// `p` and the group table must be what the host's sm90 plan writes for validated buffers.
#[crate::ptx::kernel]
pub unsafe fn sm90_dequant_tokens(p: KernelParams) {
    // The GEMM that follows may be scheduled now (it waits for this grid before reading the
    // workspace; `abi::sm90::GEMM_STARTS_EARLY`).
    barrier::grid_launch_dependents();
    let groups = p.groups as *const GroupParams;
    let cta = sreg::ctaid_x();
    // SAFETY: the table holds `group_count` groups (this kernel's contract); all threads of the
    // CTA are here, so every warp is converged.
    let Some(lo) = (unsafe { owning_group(groups, p.group_count, cta) }) else {
        return;
    };
    // SAFETY: `owning_group` returns indices of the table only.
    let g = unsafe { *groups.add(lo as usize) };
    // Always true for the tables the host and the scheduler write (disjoint ranges); if two
    // ranges overlapped, the warp's OR of their indices could name a third group.
    if cta < g.dequant_first_cta || cta >= g.dequant_first_cta + g.dequant_ctas {
        return;
    }
    let chunks = g.k / CHUNK_K;
    if chunks == 0 {
        return;
    }
    let items = g.m * chunks;
    let rk = rest_k(g.k);
    let tid = sreg::tid_x();
    let j = tid % DEQUANT_THREADS_PER_ITEM;
    let words = dequant_slot_words(j);
    // This thread's pair of each of its words (the decoder's pair `j % 4`), as a shift.
    let shift = 4 * (j % 4);
    // Pass `base`: items `base + 32u` for u < DEQUANT_ITEMS_PER_THREAD (all loads first).
    const ROUND: u32 = DEQUANT_THREADS / DEQUANT_THREADS_PER_ITEM;
    let mut base = (cta - g.dequant_first_cta) * DEQUANT_ITEMS_PER_CTA + tid / DEQUANT_THREADS_PER_ITEM;
    let stride = g.dequant_ctas * DEQUANT_ITEMS_PER_CTA;
    while base < items {
        let mut v = [[0u32; 4]; DEQUANT_ITEMS_PER_THREAD as usize];
        let mut sw = [0u32; DEQUANT_ITEMS_PER_THREAD as usize];
        for u in 0..DEQUANT_ITEMS_PER_THREAD {
            let item = base + ROUND * u;
            if item < items {
                let (row, c) = (item / chunks, item % chunks);
                // SAFETY: row < m and c < k/64: inside A's values and scales (validated by the host).
                unsafe {
                    let src = (g.a_values as *const u8).add(row as usize * (g.k / 2) as usize + 32 * c as usize)
                        as *const u32;
                    v[u as usize] = words.map(|w| *src.add(w as usize));
                    sw[u as usize] = *((g.a_scales as *const u8).add(blocked_word_offset(row, c, rk)) as *const u32);
                }
            }
        }
        for u in 0..DEQUANT_ITEMS_PER_THREAD {
            let item = base + ROUND * u;
            if item < items {
                // Word `words[q]` lies in scale block q. The decoder gives values times 2⁻¹⁴;
                // times the block scale they are exact in f16 (`convert::e4m3_bytes_to_f16x2`'s
                // argument), and times 2¹⁴ the exact value · scale (at most 6 · 448).
                let mut out = [0u32; 4];
                for q in 0..4 {
                    let pair = convert::e2m1x2_pair_to_f16x2_scaled(v[u as usize][q], shift);
                    let scale = convert::e4m3_byte_to_f16x2(sw[u as usize], q as u32);
                    out[q] = convert::mul_f16x2(convert::mul_f16x2(pair, scale), convert::F16X2_2_14);
                }
                // Items follow each other in the group's workspace, 128 bytes each.
                // SAFETY: item < m · k/64: inside the group's workspace (the plan's).
                unsafe {
                    let dst = (g.workspace as *mut u8).add(128 * item as usize) as *mut U32x4;
                    *dst.add(j as usize) = U32x4(out);
                }
            }
        }
        base += stride;
    }
}

/// Lanes of a warp, and the groups one round of [`owning_group`] tests (two per lane).
const LANES: u32 = 32;
const GROUPS_PER_ROUND: u32 = 2 * LANES;

/// The group whose dequantization CTAs include `cta`, if any, found by the whole warp at once:
/// per round lane `l` reads the CTA range of groups `base + l` and `base + 32 + l` (independent
/// loads, one memory latency for up to 64 groups where a binary search waits for one load per
/// halving) and the warp ORs the one match. Groups own disjoint ranges in order, so no match in a
/// round means none later. Whatever the ranges hold, the index returned is below `count`.
///
/// # Safety
/// `groups` points to `count` groups in device memory; every lane of the warp calls it
/// (converged).
#[inline(always)]
unsafe fn owning_group(groups: *const GroupParams, count: u32, cta: u32) -> Option<u32> {
    let lane = sreg::lane_id();
    let mut base = 0;
    while base < count {
        let mut hit = 0u32;
        for h in 0..2 {
            let i = base + h * LANES + lane;
            if i < count {
                // SAFETY: `i < count` indexes the table (the caller's contract).
                let (first, ctas) = unsafe {
                    let g = groups.add(i as usize);
                    (core::ptr::addr_of!((*g).dequant_first_cta).read(), core::ptr::addr_of!((*g).dequant_ctas).read())
                };
                if cta.wrapping_sub(first) < ctas {
                    hit = i + 1;
                }
            }
        }
        let found = scan::warp_or(hit);
        if found != 0 {
            return if found <= count { Some(found - 1) } else { None };
        }
        base += GROUPS_PER_ROUND;
    }
    None
}
