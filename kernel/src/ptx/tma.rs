//! The Tensor Memory Accelerator: bulk and tensor async copies global → shared memory that
//! complete on an mbarrier (`complete_tx::bytes`).
//!
//! Tensor maps (`CUtensorMap`, 128 bytes, encoded on the host by `cuTensorMapEncodeTiled`) live in a
//! 128-byte aligned table in global memory, written before the launch; kernels take generic pointers
//! into it.

use super::mbarrier::Mbarrier;
use super::smem::SmemAddr;
use core::arch::asm;

/// The opaque 128-byte `CUtensorMap` as it lies in global memory.
#[repr(C, align(128))]
pub struct TensorMap(pub [u8; 128]);

/// `prefetch.tensormap [a];` (PTX ISA 8.0, sm_90): warms the descriptor cache for a map.
#[inline(always)]
pub fn prefetch_tensormap(map: *const TensorMap) {
    // SAFETY: a prefetch has no architectural effect.
    unsafe { asm!("prefetch.tensormap [{m}];", m = in(reg64) map as u64, options(nostack)) };
}

/// 2D tensor load:
/// `cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [map, {c0, c1}], [bar];`
/// (PTX ISA 8.0, sm_90). One thread issues it; the box lands at `dst` (laid out and swizzled as the
/// map says) and its byte count is credited to `bar`'s transaction count. `c0` is the innermost
/// coordinate, in elements. Out-of-bounds elements are filled with zeros.
///
/// # Safety
/// `map` must point to a valid tensor map in global memory; `dst` must be aligned as the map's
/// swizzle requires (1024 B for 128-byte swizzle) and own the box's bytes until `bar` completes.
#[inline(always)]
pub unsafe fn load_2d(dst: SmemAddr, map: *const TensorMap, c0: i32, c1: i32, bar: Mbarrier) {
    asm!(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{m}, {{{x}, {y}}}], [{b}];",
        d = in(reg32) dst.0, m = in(reg64) map as u64, x = in(reg32) c0, y = in(reg32) c1, b = in(reg32) bar.0 .0,
        options(nostack));
}

/// 1D bulk load:
/// `cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], bytes, [bar];`
/// (PTX ISA 8.0, sm_90). One thread issues it.
///
/// # Safety
/// `src` and `dst` must be 16-byte aligned, `bytes` a multiple of 16, and the range readable.
#[inline(always)]
pub unsafe fn load_1d(dst: SmemAddr, src: *const u8, bytes: u32, bar: Mbarrier) {
    asm!(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{s}], {n}, [{b}];",
        d = in(reg32) dst.0, s = in(reg64) src as u64, n = in(reg32) bytes, b = in(reg32) bar.0 .0,
        options(nostack));
}
