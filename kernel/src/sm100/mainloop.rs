//! The main loop: two TMA producers fill a ring of shared-memory stages, one MMA issuer drains it
//! into the TMEM accumulator.
//!
//! Per stage `s` and round (the ring parity):
//! - `full[s]` completes when both producers have arrived (each with `expect_tx` of the bytes its
//!   copies will deliver) and every byte has landed;
//! - `empty[s]` completes when the stage's MMAs have finished reading it (`tcgen05.commit`);
//! - in a cluster, `cluster_empty[s]` of rank 0 completes when every CTA's MMAs are done with it
//!   (each CTA's `tcgen05.commit ... multicast::cluster` to rank 0), because rank 0's A multicast
//!   overwrites the stage in all of them.
//!
//! A producer acquires its stage (waits for the release of the stage's previous round, see
//! [`crate::pipeline`]), announces its bytes, issues its copies. The MMA issuer waits for the
//! stage to be full and releases it with `tcgen05.commit`. K tails: a stage with fewer than 4 valid K = 64 steps
//! copies only those steps' scales and issues only those MMAs
//! ([`KernelConfig::mma_steps_in_stage`](nvfp4_gemm_abi::sm100::KernelConfig::mma_steps_in_stage));
//! the operand boxes are zero-filled past K and counted in full.

use super::{SharedMap, Variant, WorkCursor};
use crate::pipeline::{Consumer, Producer, Scope};
use crate::ptx::mbarrier::Mbarrier;
use crate::ptx::smem::SmemAddr;
use crate::ptx::tma::{self, CachePolicy};
use crate::ptx::{cluster, sreg, tcgen05};
use nvfp4_gemm_abi::scale_layout;
use nvfp4_gemm_abi::sm100::config::{BLOCK_M, MMA_STEPS_PER_STAGE, TMA_BLOCK_K};
use nvfp4_gemm_abi::sm100::desc::OPERAND_K_STEP_BYTES;
use nvfp4_gemm_abi::sm100::params::{a_map_index, b_map_index, GroupParams, KernelParams, CLUSTER_LEADER_MASK};
use nvfp4_gemm_abi::sm100::{sfa_stage_copy, sfb_stage_copies, ScaleBulkCopy, SmemDescriptor, TmemAddress};

/// Issues one operand box: the 3D (seed) or 2D (K tail) map, as the group's `map_rank` says.
///
/// # Safety
/// One thread; `map` is the group's operand map; `dst` a free, 1024-byte aligned tile that `bar`
/// completes.
#[inline(always)]
unsafe fn load_box(
    g: &GroupParams,
    dst: SmemAddr,
    map: *const tma::TensorMap,
    row0: u32,
    k0: u32,
    bar: Mbarrier,
    policy: CachePolicy,
) {
    let c = g.box_coords(row0, k0);
    // SAFETY: the caller's contract.
    unsafe {
        if c.rank == 3 {
            tma::load_3d_hint(dst, map, c.coords, bar, policy);
        } else {
            tma::load_2d_hint(dst, map, c.coords[0], c.coords[1], bar, policy);
        }
    }
}

/// The A producer (one thread of warp 4): per stage, the A box (`128 x 256` values) and the SFA
/// blocks of the valid K steps, completing on `full[s]`.
///
/// A is evicted last from L2 and B first, as in the seed: the 128-wide list walks tile_n-major, so
/// the CTAs of a wave share B tiles while their A tiles are re-read on the next tile_n.
///
/// In a cluster only rank 0 loads A, multicast into every CTA (which each announced the A bytes on
/// their own `full[s]`); so rank 0 first waits for the whole cluster to release the stage.
/// Every rank loads its own SFA copy.
///
/// After the last item it waits for the release of every stage it filled, so that no commit
/// arrival (local or from another CTA of the cluster) is still in flight when the CTA exits.
///
/// # Safety
/// One thread of the CTA; barriers initialized; `p` valid.
#[inline(always)]
pub unsafe fn produce_a<V: Variant, const STAGES: u32>(smem: SharedMap<V>, p: &KernelParams, rank: u32) {
    let cfg = V::CFG;
    let clustered = cfg.multicast_a();
    let leader = rank == 0;
    // Rank 0 of a cluster refills a stage only when every CTA's MMAs are done with it.
    let (release, scope) =
        if clustered && leader { (smem.cluster_empty(), Scope::Cluster) } else { (smem.empty(), Scope::Cta) };
    let mut ring = Producer::<STAGES>::new(smem.full(), release, scope);
    let mut work = WorkCursor::new(p);
    while let Some(i) = work.next_index() {
        // SAFETY: `i < work_len` (and `i - rank` too: the list is a multiple of the cluster size
        // and a cluster's CTAs are consecutive); the items name groups of the table.
        unsafe {
            let item = work.item(i);
            if clustered && !leader {
                // The host pads the list so that the CTAs of a cluster always share rank 0's A
                // tile. If that were broken, this CTA would multiply by another tile's A: stop.
                let lead = work.item(i - rank);
                if lead.group != item.group || lead.tile_m != item.tile_m {
                    sreg::trap();
                }
            }
            if let Some(next) = work.peek_index() {
                tma::prefetch_tensormap(work.tensor_map(a_map_index(work.item(next).group)));
            }
            let g = work.group(item.group);
            let map = work.tensor_map(a_map_index(item.group));
            // The tile's first row of A's map (the group's first token row when every group's
            // map is the whole token tensor), and of the group's scales.
            let m0 = item.tile_m * BLOCK_M;
            let row0 = g.token_row + m0;
            let rest_k = scale_layout::rest_k(g.k);
            for k_iter in 0..cfg.k_iterations(g.k) {
                let stage = ring.acquire();
                let (s, full) = (stage.index, stage.full);
                let k0 = k_iter * TMA_BLOCK_K;
                let steps = cfg.mma_steps_in_stage(g.k, k_iter);
                // Announce before issuing, so that no byte can complete the phase early.
                full.arrive_expect_tx(cfg.producer_a_tx_bytes(g.k, k_iter));
                if !clustered {
                    load_box(&g, smem.a_tile(s), map, row0, k0, full, CachePolicy::EVICT_LAST);
                } else if leader {
                    let dst = cluster::map_shared(smem.a_tile(s), rank);
                    let bar = cluster::map_shared(full.0, rank);
                    let c = g.box_coords(row0, k0);
                    if c.rank == 3 {
                        tma::load_3d_multicast(dst, map, c.coords, bar, cfg.multicast_mask());
                    } else {
                        tma::load_2d_multicast(dst, map, c.coords[0], c.coords[1], bar, cfg.multicast_mask());
                    }
                }
                copy_scales(
                    smem.sfa(s),
                    g.a_scales,
                    sfa_stage_copy(m0, k0, steps, rest_k),
                    full,
                    CachePolicy::EVICT_LAST,
                );
                ring.commit(stage);
            }
        }
    }
    ring.drain();
}

/// One stage's scale blocks: a bulk copy of `sf.bytes` from `scales + sf.src_offset` (global) to
/// `region + sf.dst_offset` (shared), completing on `full`.
///
/// # Safety
/// One thread; the source range lies inside the operand's blocked scale buffer.
#[inline(always)]
unsafe fn copy_scales(region: SmemAddr, scales: u64, sf: ScaleBulkCopy, full: Mbarrier, policy: CachePolicy) {
    // SAFETY: the caller's contract.
    unsafe {
        tma::load_1d_hint(region.add(sf.dst_offset), (scales as *const u8).add(sf.src_offset), sf.bytes, full, policy)
    };
}

/// The B producer (one thread of warp 6): per stage, the B box (`BLOCK_N x 256` values) and the
/// SFB blocks of the valid K steps (one bulk copy per 128 rows of B), completing on `full[s]`.
/// Waits for the release of every stage it filled before returning (see [`produce_a`]).
///
/// # Safety
/// One thread of the CTA; barriers initialized; `p` valid.
#[inline(always)]
pub unsafe fn produce_b<V: Variant, const STAGES: u32>(smem: SharedMap<V>, p: &KernelParams) {
    let cfg = V::CFG;
    let mut ring = Producer::<STAGES>::new(smem.full(), smem.empty(), Scope::Cta);
    let mut work = WorkCursor::new(p);
    while let Some(i) = work.next_index() {
        // SAFETY: `i < work_len`; the items name groups of the table.
        unsafe {
            let item = work.item(i);
            if let Some(next) = work.peek_index() {
                tma::prefetch_tensormap(work.tensor_map(b_map_index(work.item(next).group)));
            }
            let g = work.group(item.group);
            let map = work.tensor_map(b_map_index(item.group));
            let n0 = item.tile_n * cfg.block_n();
            let rest_k = scale_layout::rest_k(g.k);
            for k_iter in 0..cfg.k_iterations(g.k) {
                let stage = ring.acquire();
                let (s, full) = (stage.index, stage.full);
                let k0 = k_iter * TMA_BLOCK_K;
                let steps = cfg.mma_steps_in_stage(g.k, k_iter);
                full.arrive_expect_tx(cfg.producer_b_tx_bytes(g.k, k_iter));
                load_box(&g, smem.b_tile(s), map, n0, k0, full, CachePolicy::EVICT_FIRST);
                let (copies, count) = sfb_stage_copies(n0, cfg.block_n(), k0, steps, MMA_STEPS_PER_STAGE, rest_k);
                for &sf in &copies[..count] {
                    copy_scales(smem.sfb(s), g.b_scales, sf, full, CachePolicy::EVICT_FIRST);
                }
                ring.commit(stage);
            }
        }
    }
    ring.drain();
}

/// The MMA issuer (one thread of warp 5). Per tile: wait until the epilogue has drained the
/// accumulator, then per stage: wait `full[s]`, copy the stage's scales into the stage's TMEM
/// columns, issue one MMA per valid K = 64 step (the first of the tile overwrites the
/// accumulator), and commit to `empty[s]` (and, in a cluster, to rank 0's `cluster_empty[s]`).
/// After the tile's last stage, commit to `accumulator_full`.
///
/// The scale copies of stage `s` go to columns only stage `s`'s MMAs read
/// ([`KernelConfig::sfa_copy`](nvfp4_gemm_abi::sm100::KernelConfig::sfa_copy)). The MMAs
/// that last read them belong to the previous round of `s`, which completed before `full[s]` of
/// this round could (a producer waited on their commit before refilling), and the
/// `tcgen05.fence::after_thread_sync` after the wait orders the copies after that.
///
/// # Safety
/// One thread of the CTA; barriers initialized; `tmem` the CTA's allocation; `p` valid.
#[inline(always)]
pub unsafe fn mma<V: Variant, const STAGES: u32>(smem: SharedMap<V>, p: &KernelParams, tmem: TmemAddress) {
    let cfg = V::CFG;
    let idesc = cfg.instr_descriptor();
    let accumulator = tmem.add_columns(cfg.tmem_plan().accumulator().start);
    let sfb_blocks = cfg.tmem_plan().sfb_blocks();
    let mut ring = Consumer::<STAGES>::new(smem.full(), smem.empty());
    // The MMA issuer fills the accumulator, the epilogue drains it: a one-stage ring.
    let mut accumulator_ring = Producer::<1>::new(smem.accumulator_full(), smem.accumulator_empty(), Scope::Cta);
    let mut work = WorkCursor::new(p);
    while let Some(i) = work.next_index() {
        // SAFETY: `i < work_len`; the item names a group of the table.
        let k = unsafe { work.group(work.item(i).group).k };
        let tile = accumulator_ring.acquire();
        tcgen05::fence_after_thread_sync();
        let k_iterations = cfg.k_iterations(k);
        for k_iter in 0..k_iterations {
            let stage = ring.wait();
            let s = stage.index;
            tcgen05::fence_after_thread_sync();
            let steps = cfg.mma_steps_in_stage(k, k_iter);
            // SAFETY: one thread; the stage is full and its scale columns are free (see above);
            // the accumulator is this tile's (acquired).
            unsafe {
                for step in 0..MMA_STEPS_PER_STAGE {
                    if step < steps {
                        let c = cfg.sfa_copy(s, step);
                        tcgen05::cp_32x128b_warpx4(
                            tmem.add_columns(c.tmem_column),
                            SmemDescriptor::scale_factors(smem.sfa(s).add(c.smem_offset).0),
                        );
                        for half in 0..sfb_blocks {
                            let c = cfg.sfb_copy(s, step, half);
                            tcgen05::cp_32x128b_warpx4(
                                tmem.add_columns(c.tmem_column),
                                SmemDescriptor::scale_factors(smem.sfb(s).add(c.smem_offset).0),
                            );
                        }
                    }
                }
                let a = SmemDescriptor::operand_k_major_sw128(smem.a_tile(s).0);
                let b = SmemDescriptor::operand_k_major_sw128(smem.b_tile(s).0);
                for step in 0..MMA_STEPS_PER_STAGE {
                    if step < steps {
                        tcgen05::mma_nvfp4(
                            accumulator,
                            a.advance_bytes(step * OPERAND_K_STEP_BYTES),
                            b.advance_bytes(step * OPERAND_K_STEP_BYTES),
                            idesc,
                            tmem.add_columns(cfg.sfa_column(s, step)),
                            tmem.add_columns(cfg.sfb_column(s, step)),
                            k_iter > 0 || step > 0,
                        );
                    }
                }
            }
            // Release the stage when its MMAs have completed.
            tcgen05::commit(stage.empty);
            if cfg.multicast_a() {
                // SAFETY: a cluster variant: rank 0's cluster_empty barriers exist in every CTA.
                unsafe { tcgen05::commit_multicast(smem.cluster_empty().get(s), CLUSTER_LEADER_MASK) };
            }
        }
        if k_iterations > 0 {
            tcgen05::commit(tile.full);
        } else {
            // K = 0: no MMA ran, nothing to wait for; the epilogue stores zeros.
            tile.full.arrive();
        }
        accumulator_ring.commit(tile);
    }
}
