//! Device-resident group sizes (`nvfp4_gemm_abi::moe::DeviceSizes`) as the kernels that read
//! them — both scheduling kernels and the grouped quantization — see them.

use nvfp4_gemm_abi::moe::DeviceSizes;

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
