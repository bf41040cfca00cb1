//! The Tensor Memory Accelerator: bulk and tensor async copies global → shared memory that
//! complete on an mbarrier (`complete_tx::bytes`).
//!
//! Tensor maps (`CUtensorMap`, 128 bytes, encoded on the host by `cuTensorMapEncodeTiled`) live in a
//! 128-byte aligned table in global memory, written before the launch; kernels take generic pointers
//! into it.

use super::mbarrier::Mbarrier;
use super::smem::SmemAddr;
#[cfg(target_arch = "nvptx64")]
use core::arch::asm;

pub use nvfp4_gemm_abi::tensor_map::TensorMap;

/// `prefetch.tensormap [a];` (PTX ISA 8.0, sm_90): warms the descriptor cache for a map.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn prefetch_tensormap(map: *const TensorMap) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: a prefetch has no architectural effect.
    unsafe {
        asm!("prefetch.tensormap [{m}];", m = in(reg64) map as u64, options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::tma::prefetch_tensormap(map as u64);
}

/// `fence.proxy.tensormap::generic.acquire.sys [a], 128;` (PTX ISA 8.3, sm_90): this thread's
/// later uses of the map at `a` (prefetches and tensor copies, through the tensormap proxy) see
/// what generic writes put there before the launch. The host rewrites a plan's maps in place
/// between launches (a call on other buffers), and without this acquire a TMA unit may keep
/// using the map's earlier contents from its descriptor cache. System scope: the writes come
/// from a host-to-device copy (CUDA C++ Programming Guide, "Using TMA to transfer
/// multi-dimensional arrays", tensor maps in global memory).
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn acquire_tensormap(map: *const TensorMap) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: a fence on an address; it reads and writes nothing.
    unsafe {
        asm!("fence.proxy.tensormap::generic.acquire.sys [{m}], 128;", m = in(reg64) map as u64, options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::tma::acquire_tensormap(map as u64);
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
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn load_2d(dst: SmemAddr, map: *const TensorMap, c0: i32, c1: i32, bar: Mbarrier) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        asm!(
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{m}, {{{x}, {y}}}], [{b}];",
            d = in(reg32) dst.0, m = in(reg64) map as u64, x = in(reg32) c0, y = in(reg32) c1, b = in(reg32) bar.0 .0,
            options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the model checks the operands; the caller's contract as above.
    unsafe {
        super::model::tma::load_2d(dst.0, map as u64, c0, c1, bar.0 .0)
    };
}

/// 1D bulk load:
/// `cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], bytes, [bar];`
/// (PTX ISA 8.0, sm_90). One thread issues it.
///
/// # Safety
/// `src` and `dst` must be 16-byte aligned, `bytes` a multiple of 16, and the range readable.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn load_1d(dst: SmemAddr, src: *const u8, bytes: u32, bar: Mbarrier) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        asm!(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{s}], {n}, [{b}];",
            d = in(reg32) dst.0, s = in(reg64) src as u64, n = in(reg32) bytes, b = in(reg32) bar.0 .0,
            options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the model checks the operands; the caller's contract as above.
    unsafe {
        super::model::tma::load_1d(dst.0, src as u64, bytes, bar.0 .0)
    };
}

/// An L2 cache eviction policy for the `.L2::cache_hint` form of the bulk copies: the 64-bit
/// operand `createpolicy.fractional` would produce (PTX ISA §9.7.9.26), precomputed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(transparent)]
pub struct CachePolicy(pub u64);

impl CachePolicy {
    /// Evict first: data read once (the streamed operand). Source: CUTLASS
    /// `CacheHintSm90::EVICT_FIRST` / `CacheHintSm100` (docs/sm100.md §1).
    pub const EVICT_FIRST: Self = CachePolicy(0x12F0_0000_0000_0000);
    /// Evict last: data other CTAs will read again soon (the reused operand). Source: CUTLASS
    /// `CacheHintSm90::EVICT_LAST` (docs/sm100.md §1).
    pub const EVICT_LAST: Self = CachePolicy(0x14F0_0000_0000_0000);
}

/// 2D tensor load with an L2 hint:
/// `cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint
/// [dst], [map, {c0, c1}], [bar], policy;` (PTX ISA 8.0, sm_90). As [`load_2d`], with the
/// eviction policy applied to the lines it reads. One thread.
///
/// # Safety
/// As [`load_2d`].
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn load_2d_hint(dst: SmemAddr, map: *const TensorMap, c0: i32, c1: i32, bar: Mbarrier, policy: CachePolicy) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        asm!(
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [{d}], [{m}, {{{x}, {y}}}], [{b}], {p};",
            d = in(reg32) dst.0, m = in(reg64) map as u64, x = in(reg32) c0, y = in(reg32) c1, b = in(reg32) bar.0 .0,
            p = in(reg64) policy.0, options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the model checks the operands; the caller's contract as above.
    unsafe {
        super::model::tma::load_2d_hint(dst.0, map as u64, c0, c1, bar.0 .0, policy.0)
    };
}

/// 3D tensor load with an L2 hint:
/// `cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint
/// [dst], [map, {c0, c1, c2}], [bar], policy;` (PTX ISA 8.0, sm_90). `c0` is the innermost
/// coordinate. One thread; out-of-bounds elements are zero-filled and still count toward the
/// transaction bytes.
///
/// # Safety
/// As [`load_2d`].
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn load_3d_hint(dst: SmemAddr, map: *const TensorMap, c: [i32; 3], bar: Mbarrier, policy: CachePolicy) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        asm!(
            "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [{d}], [{m}, {{{x}, {y}, {z}}}], [{b}], {p};",
            d = in(reg32) dst.0, m = in(reg64) map as u64, x = in(reg32) c[0], y = in(reg32) c[1], z = in(reg32) c[2],
            b = in(reg32) bar.0 .0, p = in(reg64) policy.0, options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the model checks the operands; the caller's contract as above.
    unsafe {
        super::model::tma::load_3d_hint(dst.0, map as u64, c, bar.0 .0, policy.0)
    };
}

/// 2D tensor load multicast to several CTAs of the cluster:
/// `cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster
/// [dst], [map, {c0, c1}], [bar], ctaMask;` (PTX ISA 8.0, sm_90; PTX §9.7.9.27.1.2). The box is
/// written at `dst`'s CTA-relative offset in every CTA whose rank bit is set in `cta_mask`, and
/// each of those CTAs' barrier at `bar`'s offset is credited the box bytes. `dst` and `bar` are
/// `.shared::cluster` addresses of the issuing CTA ([`super::cluster::map_shared`] to its own
/// rank, as the seed does). One thread.
///
/// # Safety
/// As [`load_2d`], in every destination CTA; each destination must have announced the bytes on its
/// barrier (or will before the phase can complete) and must not exit before the data lands.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn load_2d_multicast(dst: SmemAddr, map: *const TensorMap, c0: i32, c1: i32, bar: SmemAddr, cta_mask: u16) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        asm!(
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [{d}], [{m}, {{{x}, {y}}}], [{b}], {k};",
            d = in(reg32) dst.0, m = in(reg64) map as u64, x = in(reg32) c0, y = in(reg32) c1, b = in(reg32) bar.0,
            k = in(reg16) cta_mask, options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the model checks the operands; the caller's contract as above.
    unsafe {
        super::model::tma::load_2d_multicast(dst.0, map as u64, c0, c1, bar.0, cta_mask)
    };
}

/// 3D tensor load multicast to several CTAs of the cluster:
/// `cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster
/// [dst], [map, {c0, c1, c2}], [bar], ctaMask;` (PTX ISA 8.0, sm_90). See [`load_2d_multicast`].
/// One thread.
///
/// # Safety
/// As [`load_2d_multicast`].
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn load_3d_multicast(dst: SmemAddr, map: *const TensorMap, c: [i32; 3], bar: SmemAddr, cta_mask: u16) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        asm!(
            "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [{d}], [{m}, {{{x}, {y}, {z}}}], [{b}], {k};",
            d = in(reg32) dst.0, m = in(reg64) map as u64, x = in(reg32) c[0], y = in(reg32) c[1], z = in(reg32) c[2],
            b = in(reg32) bar.0, k = in(reg16) cta_mask, options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the model checks the operands; the caller's contract as above.
    unsafe {
        super::model::tma::load_3d_multicast(dst.0, map as u64, c, bar.0, cta_mask)
    };
}

/// 1D bulk load with an L2 hint:
/// `cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [dst], [src],
/// bytes, [bar], policy;` (PTX ISA 8.0, sm_90). One thread.
///
/// # Safety
/// As [`load_1d`].
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn load_1d_hint(dst: SmemAddr, src: *const u8, bytes: u32, bar: Mbarrier, policy: CachePolicy) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        asm!(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [{d}], [{s}], {n}, [{b}], {p};",
            d = in(reg32) dst.0, s = in(reg64) src as u64, n = in(reg32) bytes, b = in(reg32) bar.0 .0,
            p = in(reg64) policy.0, options(nostack));
    }
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the model checks the operands; the caller's contract as above.
    unsafe {
        super::model::tma::load_1d_hint(dst.0, src as u64, bytes, bar.0 .0, policy.0)
    };
}
