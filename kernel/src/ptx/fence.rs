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
