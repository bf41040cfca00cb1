//! Memory and proxy fences.

use core::arch::asm;

/// `fence.mbarrier_init.release.cluster;` (PTX ISA 8.0, sm_90): makes the thread's earlier
/// `mbarrier.init`s visible to the cluster and to the async proxy (TMA). One thread, after its inits.
#[inline(always)]
pub fn mbarrier_init() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.mbarrier_init.release.cluster;", options(nostack)) };
}

/// `fence.proxy.async.shared::cta;` (PTX ISA 8.0, sm_90): orders this thread's generic-proxy
/// shared-memory writes before later async-proxy accesses (TMA store, wgmma/tcgen05 operand reads).
/// Each writing thread issues it, then a barrier joins the writers and the async issuer.
#[inline(always)]
pub fn proxy_async_shared() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.proxy.async.shared::cta;", options(nostack)) };
}

/// `fence.acq_rel.gpu;` (`__threadfence()`).
#[inline(always)]
pub fn acq_rel_gpu() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.acq_rel.gpu;", options(nostack)) };
}
