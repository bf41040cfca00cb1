//! `sm90_dequant_tokens`: the token operand A of every group, NVFP4 → f16 (scale applied, exact),
//! into the workspace, with K permuted inside each 64-wide chunk as `token_k_position` says.
//!
//! Work item = (row, 64-wide chunk): 32 bytes of values and one 4-byte scale word in, 128 bytes
//! out, handled by `DEQUANT_THREADS_PER_ITEM` = 8 consecutive threads, thread `j` writing the
//! 16-byte slot `j` (`dequant_slot_words`). Items follow each other in the workspace (item
//! `row · k/64 + chunk` starts at byte `128 · item` of the group's rows), so a warp's 16-byte stores
//! cover 512 contiguous bytes and its loads 4 × 32 contiguous bytes. Each thread takes
//! `DEQUANT_ITEMS_PER_THREAD` items per pass and issues all their loads before decoding any.
//! CTAs `dequant_first_cta .. + dequant_ctas` of the table belong to each group; the grid takes
//! them grid-strided (host-sized plans launch exactly their sum, device-sized ones at most what
//! the GPU holds at once).

use super::U32x4;
use crate::ptx::{barrier, convert, sreg, warp};
use crate::scan;
use crate::workspace::dequantized_pair;
use nvfp4_gemm_abi::scale_layout::{blocked_word_offset, rest_k};
use nvfp4_gemm_abi::sm90::{
    dequant_slot_words, GroupParams, KernelParams, CHUNK_K, DEQUANT_ITEMS_PER_CTA, DEQUANT_ITEMS_PER_THREAD,
    DEQUANT_THREADS, DEQUANT_THREADS_PER_ITEM,
};

/// See the module docs. Launch: `nvfp4_gemm_abi::sm90::dequant_launch` (`DEQUANT_THREADS`
/// threads per CTA, any number of CTAs: `Σ dequant_ctas`, or fewer).
///
/// # Safety
/// `p` and the group table must be what the host's sm90 plan writes for validated buffers.
#[crate::ptx::kernel]
pub unsafe fn sm90_dequant_tokens(p: KernelParams) {
    // In a device-sized plan this launch may start while the scheduler still writes the group
    // table: wait for it first (without a programmatic dependency the wait returns at once).
    // Then the GEMM that follows may be scheduled: it reads the table before its own wait, and
    // the workspace after it (`abi::sm90::GEMM_STARTS_EARLY`).
    barrier::grid_wait_then_release();
    let groups = p.groups as *const GroupParams;
    // The CTAs of the table (`dequant_first_cta .. + dequant_ctas` per group, tiling 0..Σ) are
    // taken grid-strided: a device-sized plan's grid is capped at what the GPU holds at once,
    // where its bound's count would launch thousands of CTAs that find no group.
    // The ranges tile 0..Σ in group order (host and scheduler alike), so the last group's end
    // is Σ: a CTA stops there without searching the table once more (a host-sized grid is Σ
    // exactly: one pass each).
    if p.group_count == 0 {
        return;
    }
    // SAFETY: the table holds `group_count` ≥ 1 groups (this kernel's contract).
    let total = unsafe {
        let last = groups.add(p.group_count as usize - 1);
        core::ptr::addr_of!((*last).dequant_first_cta).read() + core::ptr::addr_of!((*last).dequant_ctas).read()
    };
    let mut cta = sreg::ctaid_x();
    let step = sreg::nctaid_x();
    while cta < total {
        // SAFETY: the table holds `group_count` groups (this kernel's contract); all threads of
        // the CTA are here, so every warp is converged.
        let Some(g) = (unsafe { owning_group(groups, p.group_count, cta) }) else {
            return;
        };
        // Always true for the tables the host and the scheduler write (disjoint ranges); if two
        // ranges overlapped, the warp's OR of their indices could name a third group.
        if cta < g.dequant_first_cta || cta >= g.dequant_first_cta + g.dequant_ctas {
            return;
        }
        // SAFETY: as this kernel's (the group's buffers are the plan's validated ones).
        unsafe { dequant_cta(&g, cta) };
        cta += step;
    }
}

/// CTA `cta` of group `g`'s dequantization CTAs: its share of the group's items.
///
/// # Safety
/// `g` is a group of the table the host's sm90 plan writes for validated buffers, and `cta` one
/// of its CTAs.
#[inline(always)]
unsafe fn dequant_cta(g: &TokenGroup, cta: u32) {
    let chunks = g.k / CHUNK_K;
    if chunks == 0 {
        return;
    }
    let items = g.m * chunks;
    let rk = rest_k(g.k);
    let tid = sreg::tid_x();
    let j = tid % DEQUANT_THREADS_PER_ITEM;
    let words = dequant_slot_words(j);
    // This thread's pair of each of its words (the decoder's pair `j % 4`).
    let pair = j % 4;
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
                // Word `words[q]` lies in scale block q (`dequantized_pair`: exact in f16).
                let mut out = [0u32; 4];
                for q in 0..4 {
                    let scale = convert::e4m3_byte_to_f16x2(sw[u as usize], q as u32);
                    out[q] = dequantized_pair(v[u as usize][q], pair, scale);
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

/// The fields of a group the dequantization reads ([`GroupParams`]'s).
#[derive(Clone, Copy)]
struct TokenGroup {
    m: u32,
    k: u32,
    a_values: u64,
    a_scales: u64,
    workspace: u64,
    dequant_first_cta: u32,
    dequant_ctas: u32,
}

impl TokenGroup {
    /// No group (a lane past the table's end).
    const NONE: TokenGroup =
        TokenGroup { m: 0, k: 0, a_values: 0, a_scales: 0, workspace: 0, dequant_first_cta: 0, dequant_ctas: 0 };

    /// Reads group `g`'s fields (independent loads).
    ///
    /// # Safety
    /// `g` points to a group in device memory.
    #[inline(always)]
    unsafe fn read(g: *const GroupParams) -> Self {
        use core::ptr::addr_of;
        // SAFETY: the caller's contract.
        unsafe {
            TokenGroup {
                m: addr_of!((*g).m).read(),
                k: addr_of!((*g).k).read(),
                a_values: addr_of!((*g).a_values).read(),
                a_scales: addr_of!((*g).a_scales).read(),
                workspace: addr_of!((*g).workspace).read(),
                dequant_first_cta: addr_of!((*g).dequant_first_cta).read(),
                dequant_ctas: addr_of!((*g).dequant_ctas).read(),
            }
        }
    }

    /// Lane `src`'s fields, in every lane (the whole warp, converged).
    #[inline(always)]
    fn broadcast(self, src: u32) -> Self {
        let w = |v: u32| warp::shfl_idx(v, src);
        let d = |v: u64| u64::from(w(v as u32)) | (u64::from(w((v >> 32) as u32)) << 32);
        TokenGroup {
            m: w(self.m),
            k: w(self.k),
            a_values: d(self.a_values),
            a_scales: d(self.a_scales),
            workspace: d(self.workspace),
            dequant_first_cta: w(self.dequant_first_cta),
            dequant_ctas: w(self.dequant_ctas),
        }
    }
}

/// `f(0)` then `f(1)`, written out, so that arrays indexed by the argument stay in registers.
#[inline(always)]
fn unrolled_halves(mut f: impl FnMut(u32)) {
    f(0);
    f(1);
}

/// The group whose dequantization CTAs include `cta`, if any, found by the whole warp at once:
/// per round lane `l` reads groups `base + l` and `base + 32 + l` — their CTA ranges and the
/// fields the dequantization needs, all independent loads, so that one memory latency finds the
/// group and brings its fields for up to 64 groups (where a binary search waits for one load per
/// halving, and reading the fields after the search for one more) — the warp ORs the one match and
/// takes the fields from the lane that read it. Groups own disjoint ranges in order, so no match
/// in a round means none later. Whatever the ranges hold, the fields are a group's of the table.
///
/// # Safety
/// `groups` points to `count` groups in device memory; every lane of the warp calls it
/// (converged).
#[inline(always)]
unsafe fn owning_group(groups: *const GroupParams, count: u32, cta: u32) -> Option<TokenGroup> {
    let lane = sreg::lane_id();
    let mut base = 0;
    while base < count {
        // `hit`: 1 + the matching group's place in this round (`h · 32 + lane`).
        let mut hit = 0u32;
        let mut mine = [TokenGroup::NONE; 2];
        unrolled_halves(|h| {
            let i = base + h * LANES + lane;
            if i < count {
                // SAFETY: `i < count` indexes the table (the caller's contract).
                let g = unsafe { TokenGroup::read(groups.add(i as usize)) };
                if cta.wrapping_sub(g.dequant_first_cta) < g.dequant_ctas {
                    hit = h * LANES + lane + 1;
                }
                mine[h as usize] = g;
            }
        });
        let found = scan::warp_or(hit);
        if found != 0 {
            // The source lane read a group of the table when `base + found <= count`; lanes past
            // `count` hold `NONE` but are never the source then.
            let src = (found - 1) % LANES;
            let g = if found <= LANES { mine[0] } else { mine[1] };
            return if found <= GROUPS_PER_ROUND && base + found <= count { Some(g.broadcast(src)) } else { None };
        }
        base += GROUPS_PER_ROUND;
    }
    None
}
