//! The CTA-wide barrier (`bar.sync 0`).

#[cfg(target_arch = "nvptx64")]
use core::arch::asm;

/// All threads of the CTA: `bar.sync 0;`.
///
/// # Safety
/// Every thread of the CTA must reach it.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn sync_all() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        asm!("bar.sync 0;", options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::barrier::sync_all();
}
