//! `sm90_schedule`: device-resident group sizes → what the token dequantization and the GEMM
//! read (see `nvfp4_gemm_abi::moe`): each group's size-dependent parameters in the group table,
//! the work list and its length, and the status bits of any clamping. One CTA of
//! `SCHEDULE_THREADS` threads; thread `t` owns the consecutive groups `t · per .. (t + 1) · per`
//! (`per = groups_per_thread(G)`).
//!
//! 1. Each thread reads its groups' sizes (clamped) and sums their output tiles and
//!    dequantization CTAs.
//! 2. Exclusive prefix sums over the threads ([`scan::cta_exclusive_sums`]) give each thread's
//!    first work item and first dequantization CTA; a second pass over its groups writes their
//!    size-dependent table fields (plain stores of those fields only: the host wrote the others)
//!    and their tile prefixes and token-tile counts to shared memory.
//! 3. Warp `w` fills the work items of groups `w, w + warps, ...`, one item per lane at a time
//!    (weight tiles outer, token tiles inner: the order of the host-sized plans).
//! 4. Thread 0 writes the work length (at most the list's capacity) and ORs the status bits into
//!    the status word.

use crate::ptx::{barrier, smem, sreg};
use crate::scan;
use nvfp4_gemm_abi::moe::{schedule_smem, sm90_m_tiles, thread_groups, ScheduleParams, STATUS_WORK_OVERFLOW};
use nvfp4_gemm_abi::sm90::{dequant_ctas, n_tiles, token_tile_rows, GroupParams, WorkItem, SMALL_TILE_M};

const WARPS: u32 = schedule_smem::WARPS;

/// See the module docs. Launch: one CTA of `SCHEDULE_THREADS` threads, `schedule_smem::bytes(G)`
/// bytes of dynamic shared memory.
///
/// # Safety
/// `p` must be what the host's device-sized sm90 plan writes: the sizes array holds
/// `sizes_len()` readable `u32`s, the group table `G` entries, the work list `max_work` items;
/// the bases and bounds are those the plan validated the buffers against.
#[crate::ptx::kernel]
pub unsafe fn sm90_schedule(p: ScheduleParams) {
    let tid = sreg::tid_x();
    let (warp, lane) = (tid / 32, tid % 32);
    let groups = p.sizes.groups;
    // SAFETY: the sizes array is readable (the caller's contract).
    let load = unsafe { crate::moe::sizes_reader(&p.sizes) };
    // The shared tables as `.shared` addresses (byte offsets from the `schedule_smem` layout).
    let sm = smem::dynamic_base();
    let at = |byte: u32, i: u32| sm.add(byte + 4 * i);
    let weight_tiles = n_tiles(p.n);
    let (first, end) = thread_groups(groups, tid);

    // 1. This thread's groups: tiles, CTAs, status.
    let (mut my_tiles, mut my_ctas, mut status) = (0u32, 0u32, 0u32);
    let mut g = first;
    while g < end {
        let r = p.sizes.group(g, load);
        my_tiles += sm90_m_tiles(r.rows) * weight_tiles;
        my_ctas += dequant_ctas(r.rows, p.k);
        status |= r.status;
        g += 1;
    }

    // 2. Prefix sums over the threads.
    // SAFETY: every thread calls it, each warp converged; the per-warp tables at the start of
    // `schedule_smem` (`WARP_TILES`, `WARP_CTAS`, `WARP_STATUS`, in the order the scan uses).
    let ([mut tile_base, mut cta_base], [total_tiles, _], mut all_status) = unsafe {
        scan::cta_exclusive_sums([my_tiles, my_ctas], status, warp, lane, WARPS, at(schedule_smem::WARP_TILES, 0))
    };
    let prefix = |g: u32| at(schedule_smem::TILE_PREFIX, g);
    let m_tiles = |g: u32| at(schedule_smem::m_tiles(groups), g);
    let (k, n) = (p.k as u64, p.n as u64);
    let table = p.groups as *mut GroupParams;
    let mut g = first;
    while g < end {
        let r = p.sizes.group(g, load);
        let block_m = token_tile_rows(r.rows);
        let mt = sm90_m_tiles(r.rows);
        let ctas = dequant_ctas(r.rows, p.k);
        let f = r.first as u64;
        // SAFETY: `g < G` indexes the group table and the shared tables; the addresses lie in the
        // validated tensors (`nvfp4_gemm_abi::moe`: rows below the token rows, scale rows below
        // the scale rows).
        unsafe {
            let e = table.add(g as usize);
            (*e).m = r.rows;
            (*e).a_values = p.a_values + f * k / 2;
            (*e).a_scales = p.a_scales + r.scale_first as u64 * (k / 16);
            (*e).c = p.c + f * n * 2;
            (*e).workspace = p.workspace + f * k * 2;
            (*e).dequant_first_cta = cta_base;
            (*e).dequant_ctas = ctas;
            (*e).block_m = block_m;
            (*e).token_row = r.first;
            let map = if block_m == SMALL_TILE_M { p.token_map_small } else { p.token_map_large };
            // The shared workspace maps' boxes are whole tiles (other groups' rows follow), for
            // the last tile too.
            (*e).token_map = map;
            (*e).tail_token_map = map;
            (*e).tail_rows = block_m;
            smem::st_u32(prefix(g), tile_base);
            smem::st_u32(m_tiles(g), mt);
        }
        tile_base += mt * weight_tiles;
        cta_base += ctas;
        g += 1;
    }
    let total = if total_tiles > p.max_work {
        all_status |= STATUS_WORK_OVERFLOW;
        p.max_work
    } else {
        total_tiles
    };
    // SAFETY: entry G of the prefix table; every thread reaches the barrier.
    unsafe {
        if tid == 0 {
            smem::st_u32(prefix(groups), total_tiles);
        }
        barrier::sync_all();
    }

    // 3. The work list, a warp per group.
    let work = p.work as *mut WorkItem;
    let mut g = warp;
    while g < groups {
        // SAFETY: `g < G`: written before the barrier.
        let (start, stop, mt) =
            unsafe { (smem::ld_u32(prefix(g)), smem::ld_u32(prefix(g + 1)), smem::ld_u32(m_tiles(g))) };
        // `max`: keeps a division-by-zero panic out of the code (a group with items has mt ≥ 1).
        let mt = if mt == 0 { 1 } else { mt };
        let mut local = lane;
        while start + local < stop && start + local < total {
            // SAFETY: `start + local < max_work` indexes the list.
            unsafe {
                *work.add((start + local) as usize) = WorkItem { group: g, tile_m: local % mt, tile_n: local / mt };
            }
            local += 32;
        }
        g += WARPS;
    }

    // 4. Length and status.
    if tid == 0 {
        // SAFETY: the plan's two words.
        unsafe {
            *(p.work_len as *mut u32) = total;
            if all_status != 0 {
                *(p.status as *mut u32) |= all_status;
            }
        }
    }
}
