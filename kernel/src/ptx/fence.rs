//! Memory and proxy fences.

use core::arch::asm;

/// `fence.mbarrier_init.release.cluster;` (PTX ISA 8.0, sm_90): makes the thread's earlier
/// `mbarrier.init`s visible to the cluster and to the async proxy (TMA). One thread, after its inits.
#[inline(always)]
pub fn mbarrier_init() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.mbarrier_init.release.cluster;", options(nostack)) };
}
