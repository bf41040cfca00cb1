//! Hardware probes (sm_100a): small kernels that exercise exactly the Blackwell features the
//! device model implements and the sm_100a GEMM uses, through the same `ptx` wrappers and `abi`
//! encodings, and write what they observed to global memory. The host runs each on a B200 and in
//! the model and compares the outputs byte for byte (`nvfp4_gemm_diag::probe::sm100`,
//! `tests/tests/gpu_probe_sm100.rs`); `model-tests/tests/model_probe_sm100.rs` compares the
//! model's outputs with expectations written from the ISA and CuTe.
//!
//! - [`tmem_probe`]: `tcgen05.alloc` of 512 columns, a bulk copy of 33 scale blocks into shared
//!   memory, one `tcgen05.cp.32x128b.warpx4` per block onto a 4-column grid that may be shifted
//!   off the grid, `tcgen05.commit`, and every warp's `tcgen05.ld.16x256b.x16` of its quarter of
//!   the 128-column window (the raw registers).
//! - [`umma_probe`]: the GEMM's stage in miniature: A (128 rows) and B (N rows) FP4 boxes by TMA
//!   through 2D or 3D `16U4_ALIGN8B` maps, the steps' scale blocks by bulk copy, their scale
//!   copies to the GEMM's TMEM columns (plus a shift), 1–4 `tcgen05.mma ... mxf4nvf4
//!   .block_scale.scale_vec::4X` with the descriptors advanced by 32 bytes per step, one commit,
//!   then the operand tiles as they lay in shared memory and the accumulator.
//! - [`tma4_multicast_probe`]: a cluster of four; every CTA announces one FP4 box on its barrier,
//!   rank 0 multicasts it to all four; every CTA writes out its copy, then arrives on rank 0's
//!   barrier with `tcgen05.commit ... multicast::cluster` (the GEMM's release of a multicast
//!   stage), which rank 0 waits for.
//!
//! Every wait gives up after `PROBE_WAIT_LIMIT_NS` and records `PROBE_TIMED_OUT` (the model
//! reports a deadlock instead), so a disagreement cannot hang the GPU test.

use crate::ptx::mbarrier::Mbarrier;
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::tma::{self, CachePolicy};
use crate::ptx::{barrier, cluster, fence, sreg, tcgen05};
use nvfp4_gemm_abi::scale_layout::BLOCK_BYTES;
use nvfp4_gemm_abi::sm100::desc::{LboMode, SmemDescriptorFields, SmemSwizzle, OPERAND_SBO_BYTES, SCALE_SBO_BYTES};
use nvfp4_gemm_abi::sm100::tmem::warp_lane_base;
use nvfp4_gemm_abi::sm100::{InstrDescriptor, SmemDescriptor, TmemAddress, TmemPlan};
use nvfp4_gemm_diag_abi::probe::sm100::*;

/// When a probe's waits give up: [`PROBE_WAIT_LIMIT_NS`] of `%globaltimer` after its start.
#[derive(Clone, Copy)]
struct Deadline(u64);

impl Deadline {
    #[inline(always)]
    fn start() -> Self {
        Deadline(sreg::globaltimer())
    }

    /// Polls `done` until it answers true (then true) or the deadline passes (then false).
    #[inline(always)]
    fn poll(self, mut done: impl FnMut() -> bool) -> bool {
        while !done() {
            if sreg::globaltimer().wrapping_sub(self.0) > PROBE_WAIT_LIMIT_NS {
                return false;
            }
        }
        true
    }
}

/// The dynamic shared memory window; the probe traps unless it is 1024-byte aligned, as the
/// 128-byte swizzle and descriptors with base offset 0 need (as the GEMM does).
#[inline(always)]
fn aligned_base() -> SmemAddr {
    let base = smem::dynamic_base();
    if base.0 % 1024 != 0 {
        sreg::trap();
    }
    base
}

/// The status word of a probe whose waits all completed (`ok`) or not.
#[inline(always)]
fn status(ok: bool) -> u32 {
    if ok {
        PROBE_OK
    } else {
        PROBE_TIMED_OUT
    }
}

/// The probes' shared-memory bookkeeping in the first 1024 bytes: two barriers and the word
/// `tcgen05.alloc` writes.
#[derive(Clone, Copy)]
struct Bookkeeping {
    full: Mbarrier,
    done: Mbarrier,
    slot: SmemAddr,
}

impl Bookkeeping {
    #[inline(always)]
    fn at(base: SmemAddr) -> Self {
        Bookkeeping { full: Mbarrier(base), done: Mbarrier(base.add(8)), slot: base.add(16) }
    }

    /// Warp 0 allocates `columns` of TMEM, thread 0 initializes both barriers (one arrival each),
    /// then every thread learns the TMEM address. Every thread of the CTA calls it first.
    ///
    /// # Safety
    /// Every thread of the CTA, converged per warp, before anything else touches the bookkeeping.
    #[inline(always)]
    unsafe fn setup(self, columns: u32) -> TmemAddress {
        let tid = sreg::tid_x();
        // SAFETY: the caller's contract; warp 0 is whole.
        unsafe {
            if sreg::warp_id() == 0 {
                tcgen05::alloc(self.slot, columns);
                tcgen05::relinquish_alloc_permit();
            }
            if tid == 0 {
                self.full.init(1);
                self.done.init(1);
                fence::mbarrier_init();
            }
            tcgen05::fence_before_thread_sync();
            barrier::sync_all();
            tcgen05::fence_after_thread_sync();
            TmemAddress::from_bits(smem::ld_u32(self.slot))
        }
    }

    /// Every thread: the CTA's TMEM work is done; warp 0 frees the allocation.
    ///
    /// # Safety
    /// Every thread of the CTA, after its last TMEM access.
    #[inline(always)]
    unsafe fn teardown(self, tmem: TmemAddress, columns: u32) {
        tcgen05::fence_before_thread_sync();
        // SAFETY: the caller's contract.
        unsafe {
            barrier::sync_all();
            if sreg::warp_id() == 0 {
                tcgen05::fence_after_thread_sync();
                tcgen05::dealloc(tmem.to_bits(), columns);
            }
        }
    }
}

/// The descriptor of a 512-byte scale block at `addr` read by `tcgen05.cp`, with LBO `lbo` (the
/// seed's descriptor when `lbo` is 0).
#[inline(always)]
fn scale_descriptor(addr: SmemAddr, lbo: u32) -> SmemDescriptor {
    SmemDescriptorFields {
        start_address: addr.0,
        leading_byte_offset: lbo,
        stride_byte_offset: SCALE_SBO_BYTES,
        base_offset: 0,
        lbo_mode: LboMode::Relative,
        swizzle: SmemSwizzle::None,
    }
    .encode()
}

/// Copies `words` 32-bit words of shared memory from `src` to global `out`, spread over the CTA.
///
/// # Safety
/// Every byte read must be written and ordered before (a completed barrier phase); `out` holds
/// `words` words.
#[inline(always)]
unsafe fn dump(src: SmemAddr, out: *mut u32, words: u32) {
    let mut i = sreg::tid_x();
    while i < words {
        // SAFETY: the caller's contract.
        unsafe { *out.add(i as usize) = smem::ld_u32(src.add(4 * i)) };
        i += SM100_PROBE_THREADS;
    }
}

/// Every warp reads its quarter of the 128 TMEM columns from `column` (two `.x16` loads, one per
/// 16-lane half) and writes its registers to `out` at word `((slot·4 + warp)·2 + half)·2048 +
/// lane·64`; `slot` numbers the 128-column chunks a probe reads.
///
/// # Safety
/// Every thread of the CTA; the columns allocated and written, their writes ordered before this
/// (commit → wait → `tcgen05.fence::after_thread_sync`); `out` large enough.
#[inline(always)]
unsafe fn read_chunk(tmem: TmemAddress, column: u32, out: *mut u32, slot: u32) {
    let warp = sreg::warp_id();
    let lane = sreg::lane_id();
    for half in 0..2 {
        let lane0 = warp_lane_base(warp) + 16 * half;
        // SAFETY: the caller's contract; the warp reads its own quarter.
        let r = unsafe { tcgen05::ld_16x256b_x16(tmem.add_lanes(lane0).add_columns(column)) };
        let at = ((slot * 4 + warp) * 2 + half) * (LD_WORDS_PER_WARP_CHUNK / 2) + lane * 64;
        for (i, v) in r.iter().enumerate() {
            // SAFETY: `out` holds the chunk (the caller's contract).
            unsafe { *out.add((at + i as u32) as usize) = *v };
        }
    }
}

/// See the module docs. `p.input`: [`TMEM_PROBE_BLOCKS`] scale blocks of 512 bytes; `p.out`:
/// [`TMEM_PROBE_OUT_BYTES`]. Arguments: `TMEM_ARG_*`.
///
/// # Safety
/// Launched as `tmem_probe_launch()` with buffers of those sizes.
#[crate::ptx::kernel]
pub unsafe fn tmem_probe(p: ProbeParams) {
    let base = smem::dynamic_base();
    let book = Bookkeeping::at(base);
    let blocks = base.add(PROBE_BARRIER_BYTES);
    // SAFETY: every thread, first thing.
    let tmem = unsafe { book.setup(TMEM_PROBE_ALLOC) };
    let out = p.out as *mut u32;
    let mut ok = true;
    if sreg::tid_x() == 0 {
        let bytes = TMEM_PROBE_BLOCKS * BLOCK_BYTES;
        book.full.arrive_expect_tx(bytes);
        // SAFETY: `input` holds the blocks; the region is this probe's.
        unsafe { tma::load_1d(blocks, p.input as *const u8, bytes, book.full) };
        ok &= Deadline::start().poll(|| book.full.try_wait(0));
        let (shift, lbo) = (p.args[TMEM_ARG_SHIFT], p.args[TMEM_ARG_LBO]);
        for j in 0..TMEM_PROBE_BLOCKS {
            // SAFETY: the block landed (the phase completed); the columns are allocated.
            unsafe {
                tcgen05::cp_32x128b_warpx4(
                    tmem.add_columns(tmem_probe_copy_column(j, shift)),
                    scale_descriptor(blocks.add(j * BLOCK_BYTES), lbo),
                )
            };
        }
        tcgen05::commit(book.done);
    }
    ok &= Deadline::start().poll(|| book.done.try_wait(0));
    tcgen05::fence_after_thread_sync();
    // SAFETY: every thread; the copies completed (the commit's phase) and are ordered by the fence.
    unsafe { read_chunk(tmem, TMEM_PROBE_WINDOW, out, 0) };
    if sreg::tid_x() == 0 {
        // SAFETY: the status word follows the registers.
        unsafe { *out.add((4 * LD_WORDS_PER_WARP_CHUNK) as usize) = status(ok) };
    }
    // SAFETY: every thread, after its last TMEM access.
    unsafe { book.teardown(tmem, TMEM_PROBE_ALLOC) };
}

/// See the module docs. `p.map`: two tensor maps (A with 128-row boxes, B with N-row boxes), both
/// of rank `UMMA_ARG_MAP_RANK`; `p.input`: the SFA blocks of the steps; `p.input2`: the SFB blocks
/// (per 128 rows of B, one run of `steps`); `p.out`: `umma_probe_out_bytes(N)`. Arguments:
/// `UMMA_ARG_*`.
///
/// # Safety
/// Launched as `umma_probe_launch()` with buffers of those sizes; N is 128 or 256, steps 1..=4.
#[crate::ptx::kernel]
pub unsafe fn umma_probe(p: ProbeParams) {
    let base = aligned_base();
    let n = p.args[UMMA_ARG_N];
    let steps = p.args[UMMA_ARG_STEPS];
    let shift = p.args[UMMA_ARG_SCALE_SHIFT];
    let plan = match TmemPlan::new(n, UMMA_PROBE_MAX_STEPS) {
        Ok(plan) => plan,
        Err(_) => sreg::trap(),
    };
    let idesc = match InstrDescriptor::nvfp4(128, n) {
        Ok(d) => d,
        Err(_) => sreg::trap(),
    };
    if steps == 0 || steps > UMMA_PROBE_MAX_STEPS {
        sreg::trap();
    }
    let book = Bookkeeping::at(base);
    let (a_tile, b_tile) = (base.add(UMMA_PROBE_A_OFFSET), base.add(UMMA_PROBE_B_OFFSET));
    let (sfa, sfb) = (base.add(UMMA_PROBE_SFA_OFFSET), base.add(UMMA_PROBE_SFB_OFFSET));
    // SAFETY: every thread, first thing.
    let tmem = unsafe { book.setup(UMMA_PROBE_ALLOC) };
    let out = p.out as *mut u32;
    let mut ok = true;
    if sreg::tid_x() == 0 {
        let maps = p.map as *const tma::TensorMap;
        let k0 = p.args[UMMA_ARG_K0];
        let sf_bytes = steps * BLOCK_BYTES;
        let operand_bytes = (128 + n) * UMMA_PROBE_ROW_BYTES;
        book.full.arrive_expect_tx(operand_bytes + sf_bytes * (1 + plan.sfb_blocks()));
        // SAFETY: the maps describe the operands, the scale buffers hold the blocks, the regions
        // are this probe's and aligned.
        unsafe {
            for (tile, map) in [(a_tile, maps), (b_tile, maps.add(1))] {
                tma::acquire_tensormap(map);
                if p.args[UMMA_ARG_MAP_RANK] == 3 {
                    tma::load_3d_hint(tile, map, [0, 0, (k0 / 256) as i32], book.full, CachePolicy::EVICT_FIRST);
                } else {
                    tma::load_2d_hint(tile, map, k0 as i32, 0, book.full, CachePolicy::EVICT_FIRST);
                }
            }
            tma::load_1d(sfa, p.input as *const u8, sf_bytes, book.full);
            for half in 0..plan.sfb_blocks() {
                let src = (p.input2 as *const u8).add((half * sf_bytes) as usize);
                tma::load_1d(sfb.add(half * UMMA_PROBE_MAX_STEPS * BLOCK_BYTES), src, sf_bytes, book.full);
            }
        }
        ok &= Deadline::start().poll(|| book.full.try_wait(0));
        tcgen05::fence_after_thread_sync();
        let scale_lbo = p.args[UMMA_ARG_SCALE_LBO];
        let operand = |tile: SmemAddr| {
            SmemDescriptorFields {
                start_address: tile.0,
                leading_byte_offset: p.args[UMMA_ARG_OPERAND_LBO],
                stride_byte_offset: OPERAND_SBO_BYTES,
                base_offset: 0,
                lbo_mode: LboMode::Relative,
                swizzle: SmemSwizzle::B128,
            }
            .encode()
        };
        let (a, b) = (operand(a_tile), operand(b_tile));
        // SAFETY: the stage landed; the columns are allocated; the commit below covers it all.
        unsafe {
            for step in 0..steps {
                let c = plan.sfa_copy(step);
                tcgen05::cp_32x128b_warpx4(
                    tmem.add_columns(c.tmem_column + shift),
                    scale_descriptor(sfa.add(c.smem_offset), scale_lbo),
                );
                for half in 0..plan.sfb_blocks() {
                    let c = plan.sfb_copy(step, half);
                    tcgen05::cp_32x128b_warpx4(
                        tmem.add_columns(c.tmem_column + shift),
                        scale_descriptor(sfb.add(c.smem_offset), scale_lbo),
                    );
                }
            }
            for step in 0..steps {
                let k = step * nvfp4_gemm_abi::sm100::desc::OPERAND_K_STEP_BYTES;
                tcgen05::mma_nvfp4(
                    tmem.add_columns(plan.accumulator().start),
                    a.advance_bytes(k),
                    b.advance_bytes(k),
                    idesc,
                    tmem.add_columns(plan.sfa_column(step) + shift),
                    tmem.add_columns(plan.sfb_column(step) + shift),
                    step > 0,
                );
            }
        }
        tcgen05::commit(book.done);
    }
    ok &= Deadline::start().poll(|| book.full.try_wait(0));
    let a_words = 128 * UMMA_PROBE_ROW_BYTES / 4;
    // SAFETY: the tiles landed (the phase completed); `out` holds them first.
    unsafe {
        dump(a_tile, out, a_words);
        dump(b_tile, out.add(a_words as usize), n * UMMA_PROBE_ROW_BYTES / 4);
    }
    let acc = out.wrapping_add(((128 + n) * UMMA_PROBE_ROW_BYTES / 4) as usize);
    ok &= Deadline::start().poll(|| book.done.try_wait(0));
    tcgen05::fence_after_thread_sync();
    for chunk in 0..n / 128 {
        // SAFETY: every thread; the MMAs completed (the commit's phase), ordered by the fence.
        unsafe { read_chunk(tmem, plan.accumulator().start + 128 * chunk, acc, chunk) };
    }
    if sreg::tid_x() == 0 {
        // SAFETY: the status word follows the accumulator.
        unsafe { *acc.add((n / 128 * 4 * LD_WORDS_PER_WARP_CHUNK) as usize) = status(ok) };
    }
    // SAFETY: every thread, after its last TMEM access.
    unsafe { book.teardown(tmem, UMMA_PROBE_ALLOC) };
}

/// See the module docs. `p.map`: the tensor map; `p.out`: `multicast_probe_cta_bytes(box)` per
/// CTA. Arguments: `MULTICAST_ARG_*`.
///
/// # Safety
/// Launched as `multicast_probe_launch()`; the box fits `MULTICAST_PROBE_MAX_BYTES`.
#[crate::ptx::kernel]
pub unsafe fn tma4_multicast_probe(p: ProbeParams) {
    let base = aligned_base();
    let book = Bookkeeping::at(base);
    let (full, gather) = (book.full, book.done);
    let tile = base.add(PROBE_BARRIER_BYTES);
    let tid = sreg::tid_x();
    let rank = sreg::cluster_ctarank();
    let box_bytes = p.args[MULTICAST_ARG_BOX_BYTES];
    if tid == 0 {
        // SAFETY: nobody uses the barriers before the cluster barrier below.
        unsafe {
            full.init(1);
            gather.init(MULTICAST_PROBE_CLUSTER);
        }
        fence::mbarrier_init();
    }
    // SAFETY: every thread of the cluster reaches it.
    unsafe { cluster::sync() };
    if tid == 0 {
        full.arrive_expect_tx(box_bytes);
        if rank == 0 {
            let map = p.map as *const tma::TensorMap;
            tma::acquire_tensormap(map);
            let c = [p.args[MULTICAST_ARG_C0] as i32, p.args[MULTICAST_ARG_C1] as i32, p.args[MULTICAST_ARG_C2] as i32];
            let (dst, bar) = (cluster::map_shared(tile, rank), cluster::map_shared(full.0, rank));
            let mask = ((1u32 << MULTICAST_PROBE_CLUSTER) - 1) as u16;
            // SAFETY: every CTA of the cluster announced the box on its barrier (or will before
            // its phase can complete) and waits for it before leaving.
            unsafe {
                if p.args[MULTICAST_ARG_MAP_RANK] == 3 {
                    tma::load_3d_multicast(dst, map, c, bar, mask);
                } else {
                    tma::load_2d_multicast(dst, map, c[0], c[1], bar, mask);
                }
            }
        }
    }
    let ok = Deadline::start().poll(|| full.try_wait(0));
    let out = (p.out as *mut u32).wrapping_add((sreg::ctaid_x() * multicast_probe_cta_bytes(box_bytes) / 4) as usize);
    // SAFETY: the box landed (the phase completed); `out` holds this CTA's bytes.
    unsafe { dump(tile, out, box_bytes / 4) };
    if tid == 0 {
        // SAFETY: rank 0's barrier is initialized and rank 0 waits for every arrival before the
        // final cluster barrier.
        unsafe { tcgen05::commit_multicast(gather, 1) };
        let gathered = if rank == 0 { status(Deadline::start().poll(|| gather.try_wait_cluster(0))) } else { 0 };
        let log = out.wrapping_add((box_bytes / 4) as usize);
        // SAFETY: the log words follow the box.
        unsafe {
            *log = status(ok);
            *log.add(1) = gathered;
            *log.add(2) = rank;
            *log.add(3) = sreg::cluster_nctarank();
        }
    }
    // Nobody leaves while rank 0 may still receive arrivals or the others their box.
    // SAFETY: every thread of the cluster reaches it.
    unsafe { cluster::sync() };
}
