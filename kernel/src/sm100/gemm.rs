//! The sm_100a GEMM entry points, one per compiled variant, and the CTA's setup and teardown.
//!
//! Launch (host side): `nvfp4_gemm_abi::sm100::params::KernelLayout::launch` — block
//! `[256, 1, 1]`, clusters of the variant's size, its `dynamic_shared_memory()`, a grid of at most
//! one wave of resident CTAs (a multiple of the cluster size) over the variant's work list; one
//! [`KernelParams`] by value.

use super::{epilogue, mainloop, SharedMap, Variant};
use crate::ptx::{barrier, cluster, fence, smem, sreg, tcgen05, warp};
use nvfp4_gemm_abi::launch::DYNAMIC_SMEM_ALIGN;
use nvfp4_gemm_abi::sm100::config::TMEM_ALLOC_WARP;
use nvfp4_gemm_abi::sm100::params::{
    KernelLayout, KernelParams, N128_DEEP_KERNEL, N128_SHALLOW_KERNEL, N256_CLUSTER4_KERNEL,
};
use nvfp4_gemm_abi::sm100::{TmemAddress, WarpRole};

/// BLOCK_N = 128, 6 stages, one CTA per SM.
pub struct N128Deep;
impl Variant for N128Deep {
    const LAYOUT: KernelLayout = N128_DEEP_KERNEL;
}

/// BLOCK_N = 128, 3 stages, two CTAs per SM.
pub struct N128Shallow;
impl Variant for N128Shallow {
    const LAYOUT: KernelLayout = N128_SHALLOW_KERNEL;
}

/// BLOCK_N = 256, 4 stages, clusters of 4 sharing A by multicast.
pub struct N256Cluster4;
impl Variant for N256Cluster4 {
    const LAYOUT: KernelLayout = N256_CLUSTER4_KERNEL;
}

/// 128 x 128 tiles, 6 stages (221312 B of shared memory). See the module docs for the launch.
///
/// # Safety
/// `p` and the tables it points to must be what the host's sm100 plan writes for validated
/// buffers, launched with this variant's geometry.
#[crate::ptx::kernel]
pub unsafe fn sm100_gemm_n128_deep(p: KernelParams) {
    // SAFETY: the caller's contract.
    unsafe { run::<N128Deep, 6>(&p) };
}

/// 128 x 128 tiles, 3 stages (110720 B), for work lists longer than two waves of the deep variant.
///
/// # Safety
/// `p` and the tables it points to must be what the host's sm100 plan writes for validated
/// buffers, launched with this variant's geometry.
#[crate::ptx::kernel]
pub unsafe fn sm100_gemm_n128_shallow(p: KernelParams) {
    // SAFETY: the caller's contract.
    unsafe { run::<N128Shallow, 3>(&p) };
}

/// 128 x 256 tiles, 4 stages (221312 B), clusters of 4 CTAs along x that share the A tile.
///
/// # Safety
/// `p` and the tables it points to must be what the host's sm100 plan writes for validated
/// buffers, launched with this variant's geometry.
#[crate::ptx::kernel]
pub unsafe fn sm100_gemm_n256_cluster4(p: KernelParams) {
    // SAFETY: the caller's contract.
    unsafe { run::<N256Cluster4, 4>(&p) };
}

/// One CTA: allocate TMEM and initialize barriers, run this warp's role over the work list, then
/// free TMEM once every role is done. `STAGES` is the variant's stage count, as a const generic
/// for the pipeline rings.
///
/// # Safety
/// Every thread of the CTA (of every CTA of the cluster); `p` as for the entry points.
#[inline(always)]
unsafe fn run<V: Variant, const STAGES: u32>(p: &KernelParams) {
    const { assert!(V::CFG.stages() == STAGES) };
    let cfg = V::CFG;
    let base = smem::dynamic_base();
    // The descriptors (base offset 0) and the 128-byte-swizzled TMA boxes assume 1024-byte
    // aligned stages: a misaligned window would compute on scrambled tiles, so stop instead.
    if base.0 % DYNAMIC_SMEM_ALIGN != 0 {
        sreg::trap();
    }
    let smem = SharedMap::<V>::new(base);
    let warp = sreg::warp_id();
    let clustered = cfg.multicast_a();
    let rank = if clustered { sreg::cluster_ctarank() } else { 0 };
    // A cluster walks the list in lockstep only if every CTA of it gets the same number of items:
    // the list's length (the host's, or the one a scheduling kernel wrote) and the grid must be
    // multiples of the cluster size.
    let len = super::WorkCursor::new(p).work_len();
    if clustered && (len % cfg.cluster_size() != 0 || sreg::nctaid_x() % cfg.cluster_size() != 0) {
        sreg::trap();
    }

    // SAFETY (whole block): warp-uniform collectives reached by every thread or warp that must
    // (the role dispatch is on the warp-uniform `warp_id`); barriers initialized before the CTA
    // (and cluster) barrier that publishes them; each role's own contract is met.
    unsafe {
        if warp == TMEM_ALLOC_WARP {
            tcgen05::alloc(smem.tmem_slot(), cfg.tmem_allocated_columns());
            tcgen05::relinquish_alloc_permit();
        }
        if sreg::tid_x() == 0 {
            smem.init_barriers();
            fence::mbarrier_init();
        }
        // The TMEM address and the barriers become visible to every thread (and, in a cluster,
        // the barriers to the other CTAs before any multicast or remote commit can reach them).
        tcgen05::fence_before_thread_sync();
        barrier::sync_all();
        if clustered {
            cluster::sync();
        }
        tcgen05::fence_after_thread_sync();
        let tmem = TmemAddress::from_bits(smem::ld_u32(smem.tmem_slot()));

        match WarpRole::of_warp(warp) {
            WarpRole::ProducerA => {
                if warp::elect_one() {
                    mainloop::produce_a::<V, STAGES>(smem, p, rank);
                }
                warp::sync();
            }
            WarpRole::ProducerB => {
                if warp::elect_one() {
                    mainloop::produce_b::<V, STAGES>(smem, p);
                }
                warp::sync();
            }
            WarpRole::Mma => {
                if warp::elect_one() {
                    mainloop::mma::<V, STAGES>(smem, p, tmem);
                }
                warp::sync();
            }
            WarpRole::Epilogue => epilogue::store::<V>(smem, p, tmem, warp),
            WarpRole::Idle => {}
        }

        // Every TMEM load has waited and every MMA has completed (the epilogue saw the last
        // commit); the producers saw the release of every stage. Join, then free TMEM.
        tcgen05::fence_before_thread_sync();
        barrier::sync_all();
        if clustered {
            cluster::sync();
        }
        if warp == TMEM_ALLOC_WARP {
            tcgen05::fence_after_thread_sync();
            tcgen05::dealloc(tmem.to_bits(), cfg.tmem_allocated_columns());
        }
    }
}
