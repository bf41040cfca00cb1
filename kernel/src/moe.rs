//! Device-resident group sizes (`nvfp4_gemm_abi::moe::DeviceSizes`) as the kernels that read
//! them — both scheduling kernels and the grouped quantization — see them, and the start of the
//! kernels launched early in a chain.

use crate::ptx::barrier;
use nvfp4_gemm_abi::moe::{DeviceSizes, STARTS_EARLY};

/// The start of a kernel the host launches early ([`STARTS_EARLY`]): waits until the kernel
/// before it has completed and its writes are visible, then lets the kernel after it be
/// scheduled. Every thread calls it before touching global memory; after a plain launch both
/// return at once.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn start_in_chain() {
    if STARTS_EARLY {
        barrier::grid_wait_then_release();
    }
}

/// A reader of the sizes array: entry `i`, or 0 past its `sizes_len()` entries (the abi's
/// `DeviceSizes::group` and `scale_row` take it as their `load`).
///
/// # Safety
/// `s.sizes` points to `s.sizes_len()` readable `u32`s for as long as the reader is used.
#[inline(always)]
pub unsafe fn sizes_reader(s: &DeviceSizes) -> impl Fn(u32) -> u32 + Copy {
    let sizes = s.sizes as *const u32;
    let len = s.sizes_len();
    // SAFETY: `i < len` indexes the sizes array (the caller's contract).
    move |i: u32| if i < len { unsafe { *sizes.add(i as usize) } } else { 0 }
}

/// One past the last token row any group holds ([`DeviceSizes::rows_end_part`] over the warp's
/// 32 shares, combined by `scan::warp_max`). Every lane of the warp must call it, converged.
///
/// # Safety
/// As [`sizes_reader`]: `s.sizes` points to `s.sizes_len()` readable `u32`s.
#[inline(always)]
pub unsafe fn rows_end(s: &DeviceSizes) -> u32 {
    // SAFETY: the caller's contract.
    let load = unsafe { sizes_reader(s) };
    crate::scan::warp_max(s.rows_end_part(load, crate::ptx::sreg::lane_id(), 32))
}
