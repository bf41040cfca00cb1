//! CTA-level named barriers.

use core::arch::asm;

/// `bar.sync id, threads;` (PTX ISA 2.0): waits until `threads` threads (a multiple of 32) have
/// arrived at barrier `id` (0..16). Barrier 0 with all threads is `__syncthreads()`.
///
/// # Safety
/// Every warp that takes part must execute it convergently, and exactly `threads` threads must.
#[inline(always)]
pub unsafe fn sync(id: u32, threads: u32) {
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        asm!("bar.sync {id}, {n};", id = in(reg32) id, n = in(reg32) threads, options(nostack));
    }
}

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
