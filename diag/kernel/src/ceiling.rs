//! The TMA bandwidth kernel (sm_90a): [`xfer_tma_bandwidth`] measures how fast 2D TMA tile loads
//! reach shared memory, with the sm_90a GEMM's box shapes and a ring like its producer's
//! (`nvfp4_gemm_diag_abi::ceiling`: the parameters, the walk over the boxes, the launch).
//!
//! One producer thread (warp 0, lane 0) issues per stage `boxes_per_stage` TMA tile loads, all
//! completing on the stage's full barrier; the consumer warps wait for each stage and release it
//! at once (lane 0 of each warp arrives on the empty barrier). Only the first consumer thread
//! touches the data: it reads the first word of each box and counts the boxes, and writes both to
//! `out` at the end (so that the host, and the model, can check that every box arrived).

use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{barrier, fence, sreg, tma};
use nvfp4_gemm_diag_abi::ceiling::*;
use nvfp4_gemm_kernel::pipeline::{Barriers, Consumer, Producer, Scope};

/// See the module docs.
///
/// # Safety
/// Launched as `tma_bandwidth_launch(grid)`; `p` as `TmaBandwidthCase::params` makes it for a
/// checked case, with `p.map` a tensor map of that case's map over a live buffer and `p.out`
/// holding `TMA_BW_OUT_WORDS` words per CTA.
#[crate::ptx::kernel]
pub unsafe fn xfer_tma_bandwidth(p: TmaBandwidthParams) {
    let map = p.map as *const tma::TensorMap;
    let base = smem::dynamic_base();
    let full = Barriers::at(base);
    let empty = Barriers::at(base.add(8 * TMA_BW_STAGES));
    let stage = |s: u32| -> SmemAddr { base.add(TMA_BW_BARRIER_BYTES + s * p.stage_bytes) };
    let tid = sreg::tid_x();
    if tid == 0 {
        tma::acquire_tensormap(map);
        tma::prefetch_tensormap(map);
        for s in 0..TMA_BW_STAGES {
            // SAFETY: nobody else uses the barriers before the CTA barrier below.
            unsafe {
                full.get(s).init(1);
                empty.get(s).init(TMA_BW_EMPTY_ARRIVALS);
            }
        }
        fence::mbarrier_init();
    }
    // SAFETY: every thread of the CTA reaches it.
    unsafe { barrier::sync_all() };
    let (cta, grid) = (sreg::ctaid_x(), sreg::nctaid_x());
    if tid == 0 {
        let mut ring = Producer::<TMA_BW_STAGES>::new(full, empty, Scope::Cta);
        let mut load = cta;
        while load < p.loads {
            let s = ring.acquire();
            s.full.arrive_expect_tx(p.stage_bytes);
            for b in 0..p.boxes_per_stage {
                let [c0, c1] = p.box_coords(load, b);
                // SAFETY: the stage is free (acquired) and holds `boxes_per_stage` boxes of
                // `box_bytes` (1024-byte multiples, so each box stays aligned); the box lies inside
                // the map (the caller's contract).
                unsafe { tma::load_2d(stage(s.index).add(b * p.box_bytes), map, c0, c1, s.full) };
            }
            ring.commit(s);
            load += grid;
        }
    } else if tid >= 32 {
        let first = tid == 32;
        let mut ring = Consumer::<TMA_BW_STAGES>::new(full, empty);
        let (mut boxes, mut sum) = (0u32, 0u32);
        let mut load = cta;
        while load < p.loads {
            let s = ring.wait();
            if first {
                for b in 0..p.boxes_per_stage {
                    // SAFETY: inside the stage, which the phase has filled.
                    sum = sum.wrapping_add(unsafe { smem::ld_u32(stage(s.index).add(b * p.box_bytes)) });
                }
                boxes += p.boxes_per_stage;
            }
            // One release per consumer warp: the only reader of the stage is lane 0 of the first.
            if tid % 32 == 0 {
                s.release();
            }
            load += grid;
        }
        if first {
            let out = (p.out as *mut u32).wrapping_add((cta * TMA_BW_OUT_WORDS) as usize);
            // SAFETY: `out` holds `TMA_BW_OUT_WORDS` words per CTA.
            unsafe {
                *out.add(TMA_BW_OUT_BOXES as usize) = boxes;
                *out.add(TMA_BW_OUT_WORD_SUM as usize) = sum;
            }
        }
    }
}
