//! Blackwell tensor memory (TMEM) and the 5th-generation tensor-core instructions (`tcgen05`,
//! sm_100a). `alloc`, `dealloc`, `relinquish_alloc_permit`, `ld` and `wait` are warp-collective
//! (`.sync.aligned`: one full converged warp); `mma`, `cp` and `commit` are issued by one thread.

use super::smem::SmemAddr;
use core::arch::asm;

/// `tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [dst], ncols;` (PTX ISA 8.6, sm_100a):
/// allocates `ncols` TMEM columns (a power of two in 32..=512) and writes the TMEM address to the
/// shared-memory word at `dst`. One full warp, converged; blocks until the columns are free.
///
/// # Safety
/// `dst` must be a 4-byte shared-memory slot; the warp must later [`dealloc`] the same columns.
#[inline(always)]
pub unsafe fn alloc(dst: SmemAddr, ncols: u32) {
    asm!("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [{d}], {n};", d = in(reg32) dst.0,
         n = in(reg32) ncols, options(nostack));
}

/// `tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;` (PTX ISA 8.6, sm_100a): this CTA
/// will allocate no more, so other CTAs on the SM need not wait for it. One full warp.
#[inline(always)]
pub fn relinquish_alloc_permit() {
    // SAFETY: no operands.
    unsafe { asm!("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;", options(nostack)) };
}

/// `tcgen05.dealloc.cta_group::1.sync.aligned.b32 taddr, ncols;` (PTX ISA 8.6, sm_100a). One full
/// warp, converged, before the CTA exits.
///
/// # Safety
/// `taddr`/`ncols` must be what [`alloc`] returned; no TMEM access to them may be pending.
#[inline(always)]
pub unsafe fn dealloc(taddr: u32, ncols: u32) {
    asm!("tcgen05.dealloc.cta_group::1.sync.aligned.b32 {t}, {n};", t = in(reg32) taddr, n = in(reg32) ncols,
         options(nostack));
}
