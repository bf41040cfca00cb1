//! Warp-level primitives: electing one lane, and reconverging a warp.

#[cfg(target_arch = "nvptx64")]
use core::arch::asm;

/// `elect.sync _|p, 0xffffffff;` (PTX ISA 8.0, sm_90): true in exactly one lane of the warp (the
/// hardware picks it), false in the others. The whole warp must execute it, converged; a role that
/// needs one issuing thread (TMA, `tcgen05.mma`, `tcgen05.cp`, `tcgen05.commit`) runs under
/// `if elect_one() { .. }` and then reconverges with [`sync`].
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn elect_one() -> bool {
    #[cfg(target_arch = "nvptx64")]
    let elected = {
        let elected: u32;
        // SAFETY: a full-warp collective with no memory effects; call sites are warp-uniform.
        unsafe {
            asm!(
                "{{",
                ".reg .pred p;",
                "elect.sync _|p, 0xffffffff;",
                "selp.u32 {e}, 1, 0, p;",
                "}}",
                e = out(reg32) elected,
                options(nostack));
        }
        elected
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let elected = super::model::warp::elect_one() as u32;
    elected != 0
}

/// `bar.warp.sync 0xffffffff;` (PTX ISA 6.0, sm_70; `__syncwarp()`): waits until every lane of the
/// warp has reached it, so that the warp runs converged again after a branch only some lanes
/// took (for example the elected lane's role loop) and before a `.aligned` instruction.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn sync() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: every lane of the warp reaches this call.
    unsafe {
        asm!("bar.warp.sync 0xffffffff;", options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::warp::sync(u32::MAX);
}

/// `shfl.sync.bfly.b32 d, v, lane_mask, 0x1f, 0xffffffff;` (PTX ISA 6.0, sm_70): the value `v` of
/// lane `laneid ^ lane_mask`. The whole warp must execute it, converged.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn shfl_xor(v: u32, lane_mask: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    let d = {
        let d: u32;
        // SAFETY: a full-warp collective on registers; call sites are warp-uniform.
        unsafe {
            asm!("shfl.sync.bfly.b32 {d}, {v}, {m}, 0x1f, 0xffffffff;", d = out(reg32) d, v = in(reg32) v,
                 m = in(reg32) lane_mask, options(nostack));
        }
        d
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let d = super::model::warp::shfl_xor(v, lane_mask);
    d
}

/// `shfl.sync.idx.b32 d, v, src_lane, 0x1f, 0xffffffff;` (PTX ISA 6.0, sm_70): the value `v` of
/// lane `src_lane` (0..32). The whole warp must execute it, converged.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn shfl_idx(v: u32, src_lane: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    let d = {
        let d: u32;
        // SAFETY: a full-warp collective on registers; call sites are warp-uniform.
        unsafe {
            asm!("shfl.sync.idx.b32 {d}, {v}, {l}, 0x1f, 0xffffffff;", d = out(reg32) d, v = in(reg32) v,
                 l = in(reg32) src_lane, options(nostack));
        }
        d
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let d = super::model::warp::shfl_idx(v, src_lane);
    d
}

/// `setmaxnreg.inc.sync.aligned.u32 N;` (PTX ISA 8.0, sm_90a): raises this warp's register
/// budget to `N` (a multiple of 8 in 24..=256), waiting until enough registers are free in the
/// CTA's pool — the registers the CTA was launched with, which other warps' [`setmaxnreg_dec`]
/// returned (SASS `USETMAXREG.TRY_ALLOC.CTAPOOL`): asking for more than the CTA holds never
/// returns. Every warp of the warpgroup executes the same `setmaxnreg` (`.aligned`) (PTX ISA
/// §9.7.19.9).
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn setmaxnreg_inc<const N: u32>() {
    const { assert!(N % 8 == 0 && N >= 24 && N <= 256) };
    // SAFETY: a warpgroup collective with no operands beyond the constant; call sites are
    // warpgroup-uniform.
    #[cfg(target_arch = "nvptx64")]
    unsafe {
        asm!("setmaxnreg.inc.sync.aligned.u32 {n};", n = const N, options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::warp::setmaxnreg_inc(N);
}

/// `setmaxnreg.dec.sync.aligned.u32 N;` (PTX ISA 8.0, sm_90a): lowers this warp's register budget
/// to `N`, returning the rest to the CTA's pool (for [`setmaxnreg_inc`] in other warpgroups). Every
/// warp of the warpgroup executes it.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn setmaxnreg_dec<const N: u32>() {
    const { assert!(N % 8 == 0 && N >= 24 && N <= 256) };
    // SAFETY: as `setmaxnreg_inc`.
    #[cfg(target_arch = "nvptx64")]
    unsafe {
        asm!("setmaxnreg.dec.sync.aligned.u32 {n};", n = const N, options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::warp::setmaxnreg_dec(N);
}
