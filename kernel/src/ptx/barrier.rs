//! The CTA-wide barrier (`bar.sync 0`).

use core::arch::asm;

/// All threads of the CTA: `bar.sync 0;`.
///
/// # Safety
/// Every thread of the CTA must reach it.
#[inline(always)]
pub unsafe fn sync_all() {
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        asm!("bar.sync 0;", options(nostack));
    }
}
