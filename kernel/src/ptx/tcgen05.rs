//! Blackwell tensor memory (TMEM) and the 5th-generation tensor-core instructions (`tcgen05`,
//! PTX ISA §9.7.16; sm_100a).
//!
//! Who issues what (PTX §9.7.16.5, docs/sm100.md §1):
//! - one full, converged warp (`.sync.aligned`): [`alloc`], [`dealloc`],
//!   [`relinquish_alloc_permit`], [`ld_16x256b_x16`] (which includes `tcgen05.wait::ld`);
//! - one thread (asynchronous, tracked by [`commit`]): [`cp_32x128b_warpx4`], [`mma_nvfp4`],
//!   [`commit`], [`commit_multicast`];
//! - any thread: the ordering fences [`fence_before_thread_sync`] / [`fence_after_thread_sync`].
//!
//! TMEM lifetime: one warp allocates (the address lands in shared memory, read it back; do not
//! assume column 0), every access happens between that and [`dealloc`] by the same warp, and the
//! CTA must free everything before it exits. Handing TMEM contents between threads follows PTX
//! §9.7.16.6.4: the producer side finishes with `tcgen05.commit` (async ops) or `wait::ld` +
//! [`fence_before_thread_sync`] (loads), then a barrier (mbarrier or `bar.sync`), then the
//! consumer side starts with [`fence_after_thread_sync`].
//!
//! All operands are typed (`nvfp4_gemm_abi::sm100`): [`TmemAddress`] (`lane << 16 | column`),
//! [`SmemDescriptor`] and [`InstrDescriptor`]; raw bits appear only inside the templates.

use super::mbarrier::Mbarrier;
use super::smem::SmemAddr;
#[cfg(target_arch = "nvptx64")]
use core::arch::asm;
use nvfp4_gemm_abi::sm100::{InstrDescriptor, SmemDescriptor, TmemAddress};

/// `tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [dst], ncols;` (PTX ISA 8.6, sm_100a):
/// allocates `ncols` TMEM columns (a power of two in 32..=512) and writes the TMEM address to the
/// shared-memory word at `dst`. One full warp, converged; blocks until the columns are free.
///
/// # Safety
/// `dst` must be a 4-byte shared-memory slot; the warp must later [`dealloc`] the same columns.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn alloc(dst: SmemAddr, ncols: u32) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        asm!("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [{d}], {n};", d = in(reg32) dst.0,
             n = in(reg32) ncols, options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::tcgen05::alloc(dst.0, ncols);
}

/// `tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;` (PTX ISA 8.6, sm_100a): this CTA
/// will allocate no more, so other CTAs on the SM need not wait for it. One full warp.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn relinquish_alloc_permit() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: no operands.
    unsafe {
        asm!("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;", options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::tcgen05::relinquish_alloc_permit();
}

/// `tcgen05.dealloc.cta_group::1.sync.aligned.b32 taddr, ncols;` (PTX ISA 8.6, sm_100a). One full
/// warp, converged, before the CTA exits.
///
/// # Safety
/// `taddr`/`ncols` must be what [`alloc`] returned; no TMEM access to them may be pending.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn dealloc(taddr: u32, ncols: u32) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        asm!("tcgen05.dealloc.cta_group::1.sync.aligned.b32 {t}, {n};", t = in(reg32) taddr, n = in(reg32) ncols,
             options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::tcgen05::dealloc(taddr, ncols);
}

/// `tcgen05.fence::before_thread_sync;` (PTX ISA 8.6, sm_100a; PTX §9.7.16.11.1): orders this
/// thread's earlier `tcgen05` operations before its next thread synchronization (mbarrier arrive,
/// `bar.sync`, cluster barrier). Any thread.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn fence_before_thread_sync() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: a fence has no operands.
    unsafe {
        asm!("tcgen05.fence::before_thread_sync;", options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::fence::tcgen05_before_thread_sync();
}

/// `tcgen05.fence::after_thread_sync;` (PTX ISA 8.6, sm_100a; PTX §9.7.16.11.1): orders this
/// thread's later `tcgen05` operations after its previous thread synchronization (an mbarrier
/// wait, `bar.sync`, cluster barrier). Any thread.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn fence_after_thread_sync() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: a fence has no operands.
    unsafe {
        asm!("tcgen05.fence::after_thread_sync;", options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::fence::tcgen05_after_thread_sync();
}

/// `tcgen05.cp.cta_group::1.32x128b.warpx4 [taddr], s_desc;` (PTX ISA 8.6, sm_100a;
/// PTX §9.7.16.9.2): copies 32 rows x 16 bytes from shared memory (described by `src`, no
/// swizzle, 16-byte rows) to TMEM, row `r` into lane `r` of each of the four 32-lane quarters,
/// the row's four 32-bit words into columns `dst.column() .. +4`. This is how one 512-byte block
/// of the 128x4 scale layout becomes the per-row scales a block-scaled MMA reads
/// (docs/sm100.md §4). One thread; asynchronous, tracked by [`commit`]. A later [`mma_nvfp4`] from
/// the same thread sees the copied data without a wait (PTX §9.7.16.6.2, `cp → mma` pipeline).
///
/// # Safety
/// `dst .. dst+4` columns must be allocated; `src` must describe 512 readable bytes that stay
/// unchanged until the copy completes.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn cp_32x128b_warpx4(dst: TmemAddress, src: SmemDescriptor) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        asm!("tcgen05.cp.cta_group::1.32x128b.warpx4 [{t}], {s};", t = in(reg32) dst.to_bits(), s = in(reg64) src.to_bits(),
             options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the model checks the operands; the caller's contract as above.
    unsafe {
        super::model::tcgen05::cp_32x128b_warpx4(dst.to_bits(), src.to_bits())
    };
}

/// The NVFP4 block-scaled MMA, D(128 x N, f32, TMEM) (+)= (A ⊙ SFA)(128 x 64) · (B ⊙ SFB)(N x 64)ᵀ:
///
/// `tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X [d], a_desc, b_desc, idesc,
/// [sfa], [sfb], p;` (PTX ISA 8.7, sm_100a; PTX §9.7.16.10.9) with `p = accumulate`: false
/// overwrites D, true adds to it. A and B are K-major e2m1 tiles in shared memory described by
/// `a`/`b`; `idesc` fixes the types (E2M1, UE4M3 scales) and the shape (M = 128, N); `sfa`/`sfb`
/// are the TMEM columns holding the four scales per row of this K = 64 step. One thread;
/// asynchronous, tracked by [`commit`]; MMAs with the same accumulator from the same thread
/// execute in issue order (PTX §9.7.16.6.2).
///
/// # Safety
/// Every address must be allocated TMEM / valid shared memory that stays unchanged until a
/// [`commit`] covering this MMA has arrived.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn mma_nvfp4(
    d: TmemAddress,
    a: SmemDescriptor,
    b: SmemDescriptor,
    idesc: InstrDescriptor,
    sfa: TmemAddress,
    sfb: TmemAddress,
    accumulate: bool,
) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        asm!(
            "{{",
            ".reg .pred p;",
            "setp.ne.b32 p, {acc}, 0;",
            "tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X [{d}], {a}, {b}, {i}, [{sa}], [{sb}], p;",
            "}}",
            d = in(reg32) d.to_bits(), a = in(reg64) a.to_bits(), b = in(reg64) b.to_bits(), i = in(reg32) idesc.to_bits(),
            sa = in(reg32) sfa.to_bits(), sb = in(reg32) sfb.to_bits(), acc = in(reg32) accumulate as u32,
            options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the model checks the operands; the caller's contract as above.
    unsafe {
        super::model::tcgen05::mma_mxf4nvf4_4x(
            d.to_bits(),
            a.to_bits(),
            b.to_bits(),
            idesc.to_bits(),
            sfa.to_bits(),
            sfb.to_bits(),
            accumulate,
        )
    };
}

/// `tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [bar];` (PTX ISA 8.6,
/// sm_100a; PTX §9.7.16.12.1): one arrival on `bar` once every earlier asynchronous `tcgen05` op
/// of this thread ([`mma_nvfp4`], [`cp_32x128b_warpx4`]) has completed, i.e. their shared-memory
/// operands may be overwritten and their TMEM results read. `bar` is this CTA's barrier (a
/// `.shared::cta` address is a valid `.shared::cluster` address of the own CTA, PTX §5.1.7).
/// One thread.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn commit(bar: Mbarrier) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: arrives on an initialized barrier.
    unsafe {
        asm!("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [{b}];", b = in(reg32) bar.0 .0,
             options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::tcgen05::commit(bar.0 .0);
}

/// `tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64
/// [bar], ctaMask;` (PTX ISA 8.6, sm_100a; PTX §9.7.16.12.1): like [`commit`], but the arrival
/// lands on the barrier at `bar`'s offset in every CTA of the cluster whose rank bit is set in
/// `cta_mask`. This is how an MMA's *completion* (not its issue) releases a stage another CTA
/// multicasts into (docs/sm100.md §6). One thread.
///
/// # Safety
/// The barrier must be initialized in every CTA named by `cta_mask`, and those CTAs must not exit
/// before the arrival lands.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn commit_multicast(bar: Mbarrier, cta_mask: u16) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        asm!("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64 [{b}], {m};",
             b = in(reg32) bar.0 .0, m = in(reg16) cta_mask, options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::tcgen05::commit_multicast(bar.0 .0, cta_mask);
}

macro_rules! define_ld_16x256b {
    ($name:ident, $x:literal, $regs:literal, $($i:literal),*) => {
        /// `tcgen05.ld.sync.aligned.16x256b.xN.b32 {r..}, [taddr];` followed by
        /// `tcgen05.wait::ld.sync.aligned;` in the same asm statement (PTX ISA 8.6, sm_100a;
        /// PTX §9.7.16.8.3). Reads 16 TMEM lanes from `taddr.lane()` and `8·N` columns from
        /// `taddr.column()`. With `q = laneid / 4`, `p = laneid % 4` and `j < N`, the thread gets
        /// (docs/sm100.md §6, PTX Table 49): `r[4j]`, `r[4j+1]` = lane `L0+q`, columns
        /// `C0+8j+2p`, `+1`; `r[4j+2]`, `r[4j+3]` = the same columns of lane `L0+q+8`.
        ///
        /// The registers of a `tcgen05.ld` are undefined until `tcgen05.wait::ld`; issuing both in
        /// one statement means no use of them can be scheduled in between. One full, converged
        /// warp; every lane passes the same `taddr`, whose lanes must be in the warp's quarter
        /// (`32·(warp % 4) ..`, PTX §9.7.16.8.1).
        ///
        /// # Safety
        /// The columns must be allocated, and writes to them (MMAs) complete and ordered before
        /// this (commit → mbarrier wait → [`fence_after_thread_sync`]).
        #[inline(always)]
        #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
        pub unsafe fn $name(taddr: TmemAddress) -> [u32; $regs] {
            #[cfg(target_arch = "nvptx64")]
            // SAFETY: the caller upholds this function's contract (see `# Safety`).
            let r = unsafe {
                let mut r = [0u32; $regs];
                asm!(
                    concat!("tcgen05.ld.sync.aligned.16x256b.x", $x, ".b32 {{", define_ld_16x256b!(@list $($i),*),
                            "}}, [{t}];"),
                    "tcgen05.wait::ld.sync.aligned;",
                    $(out(reg32) r[$i],)*
                    t = in(reg32) taddr.to_bits(),
                    options(nostack));
                r
            };
            #[cfg(not(target_arch = "nvptx64"))]
            let r: [u32; $regs] = super::model::tcgen05::ld_16x256b(taddr.to_bits(), $x)
                .try_into()
                .unwrap_or_else(|_| unreachable!("4·x registers"));
            r
        }
    };
    (@list $first:literal $(, $i:literal)*) => {
        concat!("{", stringify!($first), "}" $(, ", {", stringify!($i), "}")*)
    };
}

#[rustfmt::skip]
define_ld_16x256b!(ld_16x256b_x16, 16, 64,
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
    16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
    32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
    48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63
);
