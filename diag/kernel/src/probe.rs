//! Hardware probes (sm_90a): small kernels that exercise exactly the Hopper features the device
//! model implements and the sm_90a kernels use, through the same `ptx` wrappers and encodings,
//! and write what they observed to global memory. The host runs each on the H200 and in the
//! model and compares the outputs bit for bit (`nvfp4_gemm_diag::probe`,
//! `tests/tests/gpu_probe_sm90.rs`); `model-tests/tests/model_probe.rs` compares the model's
//! outputs with expectations written from the ISA text.
//!
//! - [`tma_probe`]: one 2D tensor load (the map says element type, swizzle, box; the box may lie
//!   partly out of bounds) plus one bulk copy, completing on one mbarrier; the raw shared-memory
//!   bytes are copied out, so the swizzled layout itself is compared.
//! - [`sync_probe`]: a two-stage ring of bulk copies (phases, parity, transaction bytes
//!   announced before or after the copy lands), an all-thread gather over two phases, a ping-pong
//!   between the two CTAs of a cluster through `mapa` + remote arrivals, and the cluster special
//!   registers.
//! - [`wgmma_probe_n16`], [`wgmma_probe_n128`]: `wgmma m64nNk16 f32.f16.f16` with A from
//!   registers (raw fragment words from global memory, by thread) and B a TMA-loaded K-major
//!   128-byte-swizzled token tile described by `WgmmaDesc` and advanced per k-step, as the GEMM
//!   kernel does; every thread writes its accumulator registers out by index.
//!
//! Every wait gives up after `PROBE_WAIT_LIMIT_NS` and records `PROBE_TIMED_OUT` (the model
//! reports a deadlock instead), so a disagreement cannot hang the GPU test.

use crate::ptx::mbarrier::Mbarrier;
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::wgmma::{self, MmaShape};
use crate::ptx::{barrier, cluster, fence, sreg, tma};
use nvfp4_gemm_abi::sm90::{WgmmaDesc, CHUNK_K, K_STEPS_PER_CHUNK, TOKEN_K_STEP_BYTES};
use nvfp4_gemm_diag_abi::probe::*;

/// Waits for the phase of `parity` (cluster-scope acquire if `cluster`); false when it has not
/// completed within `PROBE_WAIT_LIMIT_NS`.
#[inline(always)]
fn wait(bar: Mbarrier, parity: u32, cluster: bool) -> bool {
    let start = sreg::globaltimer();
    loop {
        let done = if cluster { bar.try_wait_cluster(parity) } else { bar.try_wait(parity) };
        if done {
            return true;
        }
        if sreg::globaltimer().wrapping_sub(start) > PROBE_WAIT_LIMIT_NS {
            return false;
        }
    }
}

/// The start of the probes that copy with TMA: thread 0 prefetches `map` and initializes `full`
/// (one arrival: the copier's), then a CTA barrier.
///
/// # Safety
/// Every thread of the CTA calls it before touching `full`; `map` is a valid tensor map.
#[inline(always)]
unsafe fn init_copy_barrier(tid: u32, map: *const tma::TensorMap, full: Mbarrier) {
    if tid == 0 {
        tma::acquire_tensormap(map);
        tma::prefetch_tensormap(map);
        // SAFETY: nobody else uses the barrier before the CTA barrier below.
        unsafe { full.init(1) };
        fence::mbarrier_init();
    }
    // SAFETY: every thread reaches it (the caller's contract).
    unsafe { barrier::sync_all() };
}

/// See the module docs. `p.map`: the tensor map; `p.input`: the bulk source; `p.out`: box bytes,
/// bulk bytes, then the status word. Arguments: `TMA_ARG_*`.
///
/// # Safety
/// Launched as `tma_probe_launch()`; the box and bulk bytes fit `TMA_PROBE_MAX_BYTES`, the box
/// bytes are what the map's box holds, `p.out` holds them plus 4 bytes.
#[crate::ptx::kernel]
pub unsafe fn tma_probe(p: ProbeParams) {
    let map = p.map as *const tma::TensorMap;
    let out = p.out as *mut u32;
    let box_bytes = p.args[TMA_ARG_BOX_BYTES];
    let bulk_bytes = p.args[TMA_ARG_BULK_BYTES];
    let total = box_bytes + bulk_bytes;
    let base = smem::dynamic_base();
    let full = Mbarrier(base);
    let tile = base.add(PROBE_BARRIER_BYTES);
    let tid = sreg::tid_x();
    // SAFETY: every thread of the CTA calls it, first thing.
    unsafe { init_copy_barrier(tid, map, full) };
    if tid == 0 {
        let copies_first = p.args[TMA_ARG_COPIES_FIRST] != 0;
        if !copies_first {
            full.arrive_expect_tx(total);
        }
        // SAFETY: the caller's contract: a valid map, a box that fits the data region.
        unsafe {
            tma::load_2d(tile, map, p.args[TMA_ARG_C0] as i32, p.args[TMA_ARG_C1] as i32, full);
            if bulk_bytes > 0 {
                tma::load_1d(tile.add(box_bytes), p.input as *const u8, bulk_bytes, full);
            }
        }
        if copies_first {
            full.arrive_expect_tx(total);
        }
    }
    let ok = wait(full, 0, false);
    let mut i = 4 * tid;
    while i < total {
        // SAFETY: inside the data region, which the phase has filled; `out` holds `total` bytes.
        unsafe { *out.add((i / 4) as usize) = smem::ld_u32(tile.add(i)) };
        i += 4 * TMA_PROBE_THREADS;
    }
    if tid == 0 {
        // SAFETY: `out` holds a status word after the data.
        unsafe { *out.add((total / 4) as usize) = if ok { PROBE_OK } else { PROBE_TIMED_OUT } };
    }
}

/// See the module docs. `p.input`: `SYNC_RING_ROUNDS × 16` bytes, the ring's copy sources;
/// `p.input2`: the mailbox, `SYNC_MAILBOX_WORDS` zeroed words; `p.out`: `SYNC_LOG_WORDS` words
/// per CTA (layout: `SYNC_LOG_*`).
///
/// # Safety
/// Launched as `sync_probe_launch()` with buffers of those sizes.
#[crate::ptx::kernel]
pub unsafe fn sync_probe(p: ProbeParams) {
    let tid = sreg::tid_x();
    let cta = sreg::ctaid_x();
    let rank = sreg::cluster_ctarank();
    let log = (p.out as *mut u32).wrapping_add((cta * SYNC_LOG_WORDS) as usize);
    // SAFETY: `index` < SYNC_LOG_WORDS, inside this CTA's log.
    let rec = |index: u32, v: u32| unsafe { core::ptr::write_volatile(log.add(index as usize), v) };
    let base = smem::dynamic_base();
    let full = |s: u32| Mbarrier(base.add(8 * s));
    let empty = |s: u32| Mbarrier(base.add(8 * (SYNC_RING_STAGES + s)));
    let gather = Mbarrier(base.add(8 * (2 * SYNC_RING_STAGES)));
    let mailbox_bar = Mbarrier(base.add(8 * (2 * SYNC_RING_STAGES + 1)));
    let fresh = Mbarrier(base.add(8 * (2 * SYNC_RING_STAGES + 2)));
    let stages = base.add(PROBE_BARRIER_BYTES);
    let slots = stages.add(SYNC_RING_STAGES * 128);
    let stage = |s: u32| stages.add(128 * s);
    let mut ok = true;

    if tid == 0 {
        // SAFETY: nobody uses the barriers before the cluster barrier below.
        unsafe {
            for s in 0..SYNC_RING_STAGES {
                full(s).init(1);
                empty(s).init(1);
            }
            gather.init(SYNC_PROBE_THREADS);
            mailbox_bar.init(1);
            fresh.init(1);
        }
        fence::mbarrier_init();
    }
    // SAFETY: every thread of the cluster reaches it.
    unsafe { cluster::sync() };

    // 1. The ring: the consumer (thread 0) and the producer (thread 32, another warp), as
    //    `pipeline.rs` runs them; odd rounds announce their bytes after the copy is issued.
    if tid == 0 {
        rec(SYNC_LOG_FRESH, fresh.try_wait(1) as u32);
        for r in 0..SYNC_RING_ROUNDS {
            let (s, phase) = (r % SYNC_RING_STAGES, (r / SYNC_RING_STAGES) % 2);
            ok &= wait(full(s), phase, false);
            for w in 0..4 {
                // SAFETY: inside the stage, which the phase has filled.
                rec(SYNC_LOG_RING + 4 * r + w, unsafe { smem::ld_u32(stage(s).add(4 * w)) });
            }
            empty(s).arrive();
        }
    } else if tid == 32 {
        for r in 0..SYNC_RING_ROUNDS {
            let (s, phase) = (r % SYNC_RING_STAGES, (r / SYNC_RING_STAGES) % 2);
            ok &= wait(empty(s), phase ^ 1, false);
            let src = (p.input as *const u8).wrapping_add((SYNC_RING_BYTES * r) as usize);
            if r % 2 == 0 {
                full(s).arrive_expect_tx(SYNC_RING_BYTES);
            }
            // SAFETY: the stage is free (its empty phase completed); the source holds 16 bytes.
            unsafe { tma::load_1d(stage(s), src, SYNC_RING_BYTES, full(s)) };
            if r % 2 == 1 {
                full(s).arrive_expect_tx(SYNC_RING_BYTES);
            }
        }
    }

    // 2. The gather: every thread writes its slot and arrives; after the phase each reads all.
    for r in 0..SYNC_GATHER_ROUNDS {
        // SAFETY: the thread's own slot; nobody reads the slots until the phase completes.
        unsafe { smem::st_u32(slots.add(4 * tid), (r + 1) * 1000 + tid) };
        gather.arrive();
        ok &= wait(gather, r % 2, false);
        let mut sum = 0u32;
        for i in 0..SYNC_PROBE_THREADS {
            // SAFETY: a slot inside the region.
            sum = sum.wrapping_add(unsafe { smem::ld_u32(slots.add(4 * i)) });
        }
        rec(SYNC_LOG_GATHER + r * SYNC_PROBE_THREADS + tid, sum);
        // Everyone has read the slots before the next round rewrites them.
        // SAFETY: every thread reaches it.
        unsafe { barrier::sync_all() };
    }

    // 3. The ping-pong: rank 0 posts a word to global memory and arrives on rank 1's barrier
    //    (release at cluster scope); rank 1 waits (acquire at cluster scope), reads it, posts its
    //    answer and arrives on rank 0's barrier.
    if tid == 0 {
        let cl = sreg::clusterid_x();
        let mailbox = (p.input2 as *mut u32).wrapping_add((cl * 2 * SYNC_PINGPONG_ROUNDS) as usize);
        let peer = rank ^ 1;
        for r in 0..SYNC_PINGPONG_ROUNDS {
            // SAFETY: `r < SYNC_PINGPONG_ROUNDS`: inside this cluster's mailbox.
            let (mine, theirs) = unsafe {
                (
                    mailbox.add((rank * SYNC_PINGPONG_ROUNDS + r) as usize),
                    mailbox.add((peer * SYNC_PINGPONG_ROUNDS + r) as usize),
                )
            };
            if rank == 0 {
                // SAFETY: this rank's word of the round.
                unsafe { core::ptr::write_volatile(mine, 100 * (cl + 1) + r) };
                mailbox_bar.arrive_cluster(peer);
                ok &= wait(mailbox_bar, r % 2, true);
                // SAFETY: the peer's word, posted before its arrival.
                rec(SYNC_LOG_PINGPONG + r, unsafe { core::ptr::read_volatile(theirs) });
            } else {
                ok &= wait(mailbox_bar, r % 2, true);
                // SAFETY: as above.
                let v = unsafe { core::ptr::read_volatile(theirs) };
                rec(SYNC_LOG_PINGPONG + r, v);
                // SAFETY: this rank's word of the round.
                unsafe { core::ptr::write_volatile(mine, v + 1000) };
                mailbox_bar.arrive_cluster(peer);
            }
        }
        rec(SYNC_LOG_SREGS, cta);
        rec(SYNC_LOG_SREGS + 1, sreg::nctaid_x());
        rec(SYNC_LOG_SREGS + 2, rank);
        rec(SYNC_LOG_SREGS + 3, sreg::cluster_nctarank());
        rec(SYNC_LOG_SREGS + 4, cl);
        rec(SYNC_LOG_SREGS + 5, sreg::nclusterid_x());
        rec(SYNC_LOG_SREGS + 6, sreg::ntid_x());
        rec(SYNC_LOG_SREGS + 7, PROBE_OK);
    }
    rec(SYNC_LOG_STATUS + tid, if ok { PROBE_OK } else { PROBE_TIMED_OUT });
    // Nobody leaves while the peer could still arrive on its barrier.
    // SAFETY: every thread of the cluster reaches it.
    unsafe { cluster::sync() };
}

/// One warpgroup's MMAs of the wgmma probe, of width `S::N`.
///
/// # Safety
/// As [`wgmma_probe_n128`].
#[inline(always)]
unsafe fn run_wgmma_probe<S: MmaShape>(p: &ProbeParams) {
    let map = p.map as *const tma::TensorMap;
    let chunks = p.args[WGMMA_ARG_CHUNKS];
    let chunk_bytes = S::N * CHUNK_K * 2;
    let base = smem::dynamic_base();
    let full = Mbarrier(base);
    let tile = |c: u32| -> SmemAddr { base.add(PROBE_BARRIER_BYTES + c * chunk_bytes) };
    let tid = sreg::tid_x();
    // SAFETY: every thread of the CTA calls it, first thing.
    unsafe { init_copy_barrier(tid, map, full) };
    if tid == 0 {
        full.arrive_expect_tx(chunks * chunk_bytes);
        for c in 0..chunks {
            // SAFETY: the caller's contract: a token map of `S::N`-row boxes.
            unsafe { tma::load_2d(tile(c), map, (c * CHUNK_K) as i32, 0, full) };
        }
    }
    let ok = wait(full, 0, false);

    let init = (p.input2 as *const f32).wrapping_add((tid * S::N / 2) as usize);
    let mut acc: wgmma::Accumulators = [0.0; 64];
    for (i, a) in acc.iter_mut().enumerate() {
        if (i as u32) < S::N / 2 {
            // SAFETY: `input2` holds `S::N / 2` values per thread.
            *a = unsafe { *init.add(i) };
        }
    }
    let frags = p.input as *const [u32; 4];
    for c in 0..chunks {
        let b = WgmmaDesc::k_major_sw128(tile(c).0);
        wgmma::fence();
        for j in 0..K_STEPS_PER_CHUNK {
            let step = c * K_STEPS_PER_CHUNK + j;
            // SAFETY: `input` holds 4 words per thread per k-step.
            let a = unsafe { *frags.add((step * WGMMA_PROBE_THREADS + tid) as usize) };
            let scale_d = if step == 0 { p.args[WGMMA_ARG_SCALE_D_FIRST] } else { 1 };
            // SAFETY: the whole warpgroup, converged; the tile stays in place until the waits.
            unsafe { S::mma(&mut acc, a, b.advance(TOKEN_K_STEP_BYTES * j).to_bits(), scale_d) };
        }
        wgmma::commit_group();
        S::wait::<1>(&mut acc);
    }
    S::wait::<0>(&mut acc);
    let out = (p.out as *mut f32).wrapping_add((tid * S::N / 2) as usize);
    for (i, a) in acc.iter().enumerate() {
        if (i as u32) < S::N / 2 {
            // SAFETY: `out` holds `S::N / 2` values per thread.
            unsafe { *out.add(i) = *a };
        }
    }
    if tid == 0 {
        // SAFETY: `out` holds a status word after the accumulators.
        unsafe {
            *(p.out as *mut u32).add((WGMMA_PROBE_THREADS * S::N / 2) as usize) =
                if ok { PROBE_OK } else { PROBE_TIMED_OUT }
        };
    }
}

/// See the module docs: `wgmma m64n16k16`. `p.map`: a token map with 16-row boxes
/// (`nvfp4_gemm_abi::sm90::token_map_with_box(rows, 64·chunks, 16)`); `p.input`: 4 fragment
/// words per thread per k-step (`[step][thread][4]`); `p.input2`: 8 initial accumulators per
/// thread; `p.out`: 8 accumulators per thread, then the status word. Arguments: `WGMMA_ARG_*`.
///
/// # Safety
/// Launched as `wgmma_probe_launch(16)` with buffers of those sizes.
#[crate::ptx::kernel]
pub unsafe fn wgmma_probe_n16(p: ProbeParams) {
    // SAFETY: the caller's contract.
    unsafe { run_wgmma_probe::<wgmma::N16>(&p) }
}

/// [`wgmma_probe_n16`] for `wgmma m64n128k16`: 128-row boxes, 64 accumulators per thread.
///
/// # Safety
/// Launched as `wgmma_probe_launch(128)` with buffers of those sizes.
#[crate::ptx::kernel]
pub unsafe fn wgmma_probe_n128(p: ProbeParams) {
    // SAFETY: the caller's contract.
    unsafe { run_wgmma_probe::<wgmma::N128>(&p) }
}
