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
    // SAFETY: `g < group_count` indexes the table.
    let group = |g: u32| unsafe { *groups.add(g as usize) };
    let cta = sreg::ctaid_x();
    // Binary search for the group that owns this CTA (groups are in order of first CTA).
    let (mut lo, mut hi) = (0u32, p.group_count);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if group(mid).dequant_first_cta <= cta {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let g = group(lo);
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
                // Word `words[q]` lies in scale block q. Block scales times 2⁷; the decoder gives
                // values times 2⁻¹⁴; a last 2⁷ makes the product the exact value · scale (every
                // step exact in f16).
                let mut out = [0u32; 4];
                for q in 0..4 {
                    let pair = convert::e2m1x2_pair_to_f16x2_scaled(v[u as usize][q], shift);
                    let scale = convert::e4m3_byte_to_f16x2_times_128(sw[u as usize], q as u32);
                    out[q] = convert::mul_f16x2(convert::mul_f16x2(pair, scale), convert::F16X2_128);
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
