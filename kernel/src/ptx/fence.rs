//! Memory and proxy fences.

#[cfg(target_arch = "nvptx64")]
use core::arch::asm;

/// `fence.mbarrier_init.release.cluster;` (PTX ISA 8.0, sm_90): makes the thread's earlier
/// `mbarrier.init`s visible to the cluster and to the async proxy (TMA). One thread, after its inits.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn mbarrier_init() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: a fence has no operands.
    unsafe {
        asm!("fence.mbarrier_init.release.cluster;", options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::fence::mbarrier_init();
}

/// `fence.proxy.async.shared::cta;` (PTX ISA 8.0, sm_90; §9.7.13.4 "membar/fence"): the thread's
/// earlier `st.shared`s become visible to the async proxy — to a `wgmma` or bulk copy that a later
/// release of this thread reaches (an mbarrier arrival the reader's thread waits on). Without it,
/// a wgmma may read a shared-memory operand the generic proxy wrote as it was before.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn proxy_async_shared() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: a fence has no operands.
    unsafe {
        asm!("fence.proxy.async.shared::cta;", options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::fence::proxy_async();
}
