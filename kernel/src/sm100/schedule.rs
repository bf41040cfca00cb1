//! `sm100_schedule`: device-resident group sizes → what the sm_100a GEMM reads (see
//! `nvfp4_gemm_abi::moe`): each group's size-dependent parameters in the group table, the work
//! list and its length, and the status bits of any clamping. The design of `sm90_schedule` (one
//! CTA of `SCHEDULE_THREADS` threads; thread `t` owns the consecutive groups
//! `t · per .. (t + 1) · per`, `per = groups_per_thread(G)`), with the sm_100a list:
//!
//! 1. Each thread reads its groups' sizes (clamped) and sums their M tiles (`⌈m / 128⌉`).
//! 2. An exclusive prefix sum over the CTA ([`scan::cta_exclusive_sums`]) numbers the groups' M
//!    tiles in group order; a second pass over its groups writes their size-dependent table
//!    fields (`m`, `a_scales`, `c`, `token_row`; plain stores of those fields only: the host wrote
//!    the others) and their first M tile and M-tile count to shared memory.
//! 3. The list holds the first `rows = min(M tiles, max_work / slots)` M tiles, `slots` items each
//!    (`slots_per_m_tile`: the N tiles, padded to a multiple of 4 for the 256-wide clusters).
//!    Warp `w` fills the items of groups `w, w + warps, ...` at `device_item_index`: the order of
//!    the host-built list for the same sizes (`tile_n`-major for 128-wide tiles; M-tile-major
//!    with each M tile's run padded with `tile_n = 0` copies for 256-wide ones), so the length
//!    `rows · slots` of a 256-wide list is a multiple of 4 and every aligned run of 4 items
//!    shares one A tile, as the cluster kernel requires.
//! 4. Thread 0 writes the length and ORs the status bits into the status word
//!    (`STATUS_WORK_OVERFLOW` if M tiles were cut off, which sizes within the bounds never cause).

use crate::ptx::{barrier, smem, sreg};
use crate::scan;
use nvfp4_gemm_abi::moe::{schedule_smem, thread_groups, ScheduleParams, STATUS_WORK_OVERFLOW};
use nvfp4_gemm_abi::sm100::config::BLOCK_M;
use nvfp4_gemm_abi::sm100::params::GroupParams;
use nvfp4_gemm_abi::sm100::{device_item_index, slot_tile_n, slots_per_m_tile, BlockN, WorkItem};

const WARPS: u32 = schedule_smem::WARPS;

/// See the module docs. Launch: one CTA of `SCHEDULE_THREADS` threads, `schedule_smem::bytes(G)`
/// bytes of dynamic shared memory.
///
/// # Safety
/// `p` must be what the host's device-sized sm100 plan writes: the sizes array holds
/// `sizes_len()` readable `u32`s, the group table `G` entries, the work list `max_work` items;
/// the bases and bounds are those the plan validated the buffers against.
#[crate::ptx::kernel]
pub unsafe fn sm100_schedule(p: ScheduleParams) {
    let tid = sreg::tid_x();
    let (warp, lane) = (tid / 32, tid % 32);
    let groups = p.sizes.groups;
    // SAFETY: the sizes array is readable (the caller's contract).
    let load = unsafe { crate::moe::sizes_reader(&p.sizes) };
    // The shared tables as `.shared` addresses (byte offsets from the `schedule_smem` layout).
    let sm = smem::dynamic_base();
    let at = |byte: u32, i: u32| sm.add(byte + 4 * i);
    let block_n = if p.block_n == BlockN::N256.get() { BlockN::N256 } else { BlockN::N128 };
    // At least 1 (N ≥ 8 gives that anyway): keeps division-by-zero panics out of the code.
    let slots = match slots_per_m_tile(p.n, block_n) {
        0 => 1,
        s => s,
    };
    let capacity_rows = p.max_work / slots;
    let (first, end) = thread_groups(groups, tid);

    // 1. This thread's groups: M tiles, status.
    let (mut my_rows, mut status) = (0u32, 0u32);
    let mut g = first;
    while g < end {
        let r = p.sizes.group(g, load);
        my_rows += r.rows.div_ceil(BLOCK_M);
        status |= r.status;
        g += 1;
    }

    // 2. Prefix sum over the threads, then this thread's groups' table fields.
    // SAFETY: every thread calls it, each warp converged; the per-warp tables at the start of
    // `schedule_smem` (`WARP_TILES`, then the unused `WARP_CTAS` words hold the status).
    let ([mut row_base], [total_rows], mut all_status) =
        unsafe { scan::cta_exclusive_sums([my_rows], status, warp, lane, WARPS, at(schedule_smem::WARP_TILES, 0)) };
    let prefix = |g: u32| at(schedule_smem::TILE_PREFIX, g);
    let m_tiles = |g: u32| at(schedule_smem::m_tiles(groups), g);
    let (k, n) = (p.k as u64, p.n as u64);
    let table = p.groups as *mut GroupParams;
    let mut g = first;
    while g < end {
        let r = p.sizes.group(g, load);
        let mt = r.rows.div_ceil(BLOCK_M);
        let f = r.first as u64;
        // SAFETY: `g < G` indexes the group table and the shared tables; the addresses lie in the
        // validated tensors (`nvfp4_gemm_abi::moe`: rows below the token rows, scale rows below
        // the scale rows).
        unsafe {
            let e = table.add(g as usize);
            (*e).m = r.rows;
            (*e).a_scales = p.a_scales + r.scale_first as u64 * (k / 16);
            (*e).c = p.c + f * n * 2;
            (*e).token_row = r.first;
            smem::st_u32(prefix(g), row_base);
            smem::st_u32(m_tiles(g), mt);
        }
        row_base += mt;
        g += 1;
    }
    let rows = if total_rows > capacity_rows {
        all_status |= STATUS_WORK_OVERFLOW;
        capacity_rows
    } else {
        total_rows
    };
    // SAFETY: every thread reaches the barrier: the prefixes and counts are visible after it.
    unsafe { barrier::sync_all() };

    // 3. The work list, a warp per group.
    let work = p.work as *mut WorkItem;
    let mut g = warp;
    while g < groups {
        // SAFETY: `g < G`: written before the barrier.
        let (start, mt) = unsafe { (smem::ld_u32(prefix(g)), smem::ld_u32(m_tiles(g))) };
        // The group's M tiles that are in the list.
        let mt = if start >= rows {
            0
        } else if start + mt > rows {
            rows - start
        } else {
            mt
        };
        // A group with items has mt ≥ 1; `1` keeps a division-by-zero panic out of the code.
        let mt_div = if mt == 0 { 1 } else { mt };
        let mut j = lane;
        while j < mt * slots {
            // Consecutive lanes write consecutive items (M tiles inner for 128-wide tiles).
            let (tile_m, slot) = match block_n {
                BlockN::N128 => (j % mt_div, j / mt_div),
                BlockN::N256 => (j / slots, j % slots),
            };
            let index = device_item_index(block_n, rows, slots, start + tile_m, slot);
            // SAFETY: `start + tile_m < rows` and `slot < slots`, so `index < rows · slots ≤
            // max_work` indexes the list.
            unsafe {
                *work.add(index as usize) = WorkItem { group: g, tile_m, tile_n: slot_tile_n(slot, p.n, block_n) };
            }
            j += 32;
        }
        g += WARPS;
    }

    // 4. Length and status.
    if tid == 0 {
        // SAFETY: the plan's two words.
        unsafe {
            *(p.work_len as *mut u32) = rows * slots;
            if all_status != 0 {
                *(p.status as *mut u32) |= all_status;
            }
        }
    }
}
