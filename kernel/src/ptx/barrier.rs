//! The CTA-wide barrier (`bar.sync 0`), and the grid-dependency controls of programmatic dependent
//! launch (`griddepcontrol`).

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

/// `griddepcontrol.wait;` (PTX ISA, "Parallel Synchronization and Communication Instructions:
/// griddepcontrol"; PTX 7.8, sm_90): waits until every grid this one depends on programmatically
/// (launched with programmatic stream serialization after it) has completed and its memory
/// operations are visible to this grid. Without such a dependency it returns at once. Only threads
/// that read what the earlier grid wrote need it.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn grid_dependency_wait() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: no operands; waiting has no other effect.
    unsafe {
        asm!("griddepcontrol.wait;", options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::barrier::grid_dependency_wait();
}

/// `griddepcontrol.launch_dependents;` (PTX ISA, "Parallel Synchronization and Communication
/// Instructions: griddepcontrol"; PTX 7.8, sm_90): lets the grid that depends on this one
/// programmatically be scheduled once every CTA of this grid has executed it or exited. Says
/// nothing about this grid's memory: the dependent grid still waits ([`grid_dependency_wait`])
/// before reading it. Without a dependent grid it has no effect.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn grid_launch_dependents() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: no operands; a scheduling hint.
    unsafe {
        asm!("griddepcontrol.launch_dependents;", options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::barrier::grid_launch_dependents();
}

/// [`grid_dependency_wait`], then [`grid_launch_dependents`]: the start of a kernel that may be
/// launched early and touches memory the launch before it writes or reads — it waits for that
/// launch first, then lets the next one be scheduled (which waits for this grid in turn before it
/// touches what this grid writes).
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn grid_wait_then_release() {
    grid_dependency_wait();
    grid_launch_dependents();
}

/// `bar.sync id, threads;` (PTX ISA 2.0, every target; §9.7.13.1): waits until `threads` threads
/// (a multiple of 32) have arrived at named barrier `id` (1..16; 0 is [`sync_all`]'s), and orders
/// their earlier shared-memory accesses before everything after it.
///
/// # Safety
/// Exactly `threads` threads, whole warps, must reach it with the same `id` and count per phase.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn sync_named(id: u32, threads: u32) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        asm!("bar.sync {id}, {n};", id = in(reg32) id, n = in(reg32) threads, options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::barrier::sync(id, threads);
}
