//! sm_100a kernels: the NVFP4 block-scaled grouped GEMM on 5th-generation tensor cores, a port
//! of the seed's warp-specialized `tcgen05` kernel (docs/sm100.md §8).
//!
//! One CTA = 8 warps with fixed roles ([`nvfp4_gemm_abi::sm100::WarpRole`]):
//! - warp 4, one elected lane: TMA of the A tile (rank 0 multicasts it to the cluster in the
//!   256-wide variant) and bulk copy of its scales, per pipeline stage ([`mainloop::produce_a`]);
//! - warp 6, one elected lane: the same for B ([`mainloop::produce_b`]);
//! - warp 5, one elected lane: `tcgen05.cp` of the stage's scales into TMEM, four K = 64
//!   `tcgen05.mma ... kind::mxf4nvf4.block_scale.scale_vec::4X`, `tcgen05.commit` to release the
//!   stage, and after a tile's last stage a commit that hands the accumulator to the epilogue
//!   ([`mainloop::mma`]);
//! - warps 0–3: `tcgen05.ld` of the accumulator (warp `w` owns rows `32w ..`), alpha, conversion
//!   to fp16/bf16, masked stores of C; then they hand the accumulator back ([`epilogue::store`]).
//!
//! Every role walks the same host-built work list with grid stride, so their pipeline positions
//! (stage index and parity of the shared-memory ring, parity of the accumulator barriers) advance
//! in lockstep without any exchange. The shapes of everything (stage sizes, offsets, TMEM columns,
//! descriptors, coordinates, transaction bytes) come from `nvfp4_gemm_abi::sm100`; this module
//! only sequences them.

pub mod epilogue;
pub mod gemm;
pub mod mainloop;
pub mod schedule;

use crate::pipeline::Barriers;
use crate::ptx::smem::SmemAddr;
use crate::ptx::sreg;
use crate::work;
use core::marker::PhantomData;
use nvfp4_gemm_abi::sm100::params::{GroupParams, KernelLayout};
use nvfp4_gemm_abi::sm100::KernelConfig;

/// The work cursor over this architecture's group table.
pub type WorkCursor<'a> = work::WorkCursor<'a, GroupParams>;

/// A compiled kernel variant: which [`KernelLayout`] it runs.
pub trait Variant {
    /// The exported kernel of this variant.
    const LAYOUT: KernelLayout;
    /// Its configuration (tiles, stages, barriers, TMEM columns, shared memory).
    const CFG: KernelConfig = Self::LAYOUT.config();
}

/// The CTA's dynamic shared memory as the variant lays it out: per stage `[A][B][SFA][SFB]`, then
/// the mbarriers, the TMEM slot and the accumulator barriers, all at `V::CFG`'s offsets.
pub struct SharedMap<V> {
    base: SmemAddr,
    variant: PhantomData<V>,
}

impl<V> Clone for SharedMap<V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<V> Copy for SharedMap<V> {}

impl<V: Variant> SharedMap<V> {
    /// The map over the dynamic shared memory starting at `base` (1024-byte aligned: checked at
    /// kernel start).
    #[inline(always)]
    pub fn new(base: SmemAddr) -> Self {
        Self { base, variant: PhantomData }
    }

    /// A tile of stage `s` (1024-byte aligned, as the 128-byte swizzle needs).
    #[inline(always)]
    pub fn a_tile(self, s: u32) -> SmemAddr {
        self.base.add(V::CFG.stage_offset(s) + V::CFG.a_offset())
    }

    /// B tile of stage `s` (1024-byte aligned).
    #[inline(always)]
    pub fn b_tile(self, s: u32) -> SmemAddr {
        self.base.add(V::CFG.stage_offset(s) + V::CFG.b_offset())
    }

    /// SFA region of stage `s`: `steps` 512-byte scale blocks.
    #[inline(always)]
    pub fn sfa(self, s: u32) -> SmemAddr {
        self.base.add(V::CFG.stage_offset(s) + V::CFG.sfa_offset())
    }

    /// SFB region of stage `s`: one run of blocks per 128 rows of B.
    #[inline(always)]
    pub fn sfb(self, s: u32) -> SmemAddr {
        self.base.add(V::CFG.stage_offset(s) + V::CFG.sfb_offset())
    }

    /// `full[s]`: stage `s` is loaded (2 producer arrivals + transaction bytes).
    #[inline(always)]
    pub fn full(self) -> Barriers {
        Barriers::at(self.base.add(V::CFG.full_barrier_offset(0)))
    }

    /// `empty[s]`: this CTA's MMAs are done with stage `s` (1 arrival: `tcgen05.commit`).
    #[inline(always)]
    pub fn empty(self) -> Barriers {
        Barriers::at(self.base.add(V::CFG.empty_barrier_offset(0)))
    }

    /// `cluster_empty[s]`: every CTA of the cluster is done with stage `s` (cluster-size
    /// arrivals; used in rank 0). Only called by cluster variants.
    #[inline(always)]
    pub fn cluster_empty(self) -> Barriers {
        match V::CFG.cluster_empty_barrier_offset(0) {
            Some(offset) => Barriers::at(self.base.add(offset)),
            None => sreg::trap(),
        }
    }

    /// The accumulator as a one-stage ring: "full" when it holds a finished tile (1 arrival:
    /// `tcgen05.commit`), "empty" when the epilogue has read it (one arrival per epilogue thread).
    #[inline(always)]
    pub fn accumulator_full(self) -> Barriers {
        Barriers::at(self.base.add(V::CFG.accumulator_full_barrier_offset()))
    }

    /// See [`Self::accumulator_full`].
    #[inline(always)]
    pub fn accumulator_empty(self) -> Barriers {
        Barriers::at(self.base.add(V::CFG.accumulator_empty_barrier_offset()))
    }

    /// The word `tcgen05.alloc` writes the TMEM base address to.
    #[inline(always)]
    pub fn tmem_slot(self) -> SmemAddr {
        self.base.add(V::CFG.tmem_slot_offset())
    }

    /// Initializes every barrier with its arrival count. One thread, before anyone uses them;
    /// follow with `fence.mbarrier_init` and a CTA (and cluster) barrier.
    ///
    /// # Safety
    /// Nobody may be using the barriers.
    #[inline(always)]
    pub unsafe fn init_barriers(self) {
        // SAFETY: the caller's contract.
        unsafe {
            for s in 0..V::CFG.stages() {
                self.full().get(s).init(V::CFG.full_barrier_arrivals());
                self.empty().get(s).init(V::CFG.empty_barrier_arrivals());
                if V::CFG.multicast_a() {
                    // Initialized in every rank (only rank 0's receives arrivals) so that no CTA
                    // holds an uninitialized barrier word.
                    self.cluster_empty().get(s).init(V::CFG.cluster_empty_barrier_arrivals());
                }
            }
            self.accumulator_full().get(0).init(V::CFG.accumulator_full_arrivals());
            self.accumulator_empty().get(0).init(V::CFG.accumulator_empty_arrivals());
        }
    }
}
