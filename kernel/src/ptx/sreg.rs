//! Special registers (`%tid`, `%ctaid`, `%cluster_ctarank`, ...) and `trap`.
//!
//! All are `mov.u32 r, %reg;` (PTX ISA 7.8+ for the cluster registers, sm_90+), readable by any
//! thread. They are `pure`: LLVM may hoist or merge the reads.

#[cfg(target_arch = "nvptx64")]
use core::arch::asm;

macro_rules! sreg_u32 {
    ($(#[$doc:meta])* $name:ident, $reg:literal) => {
        $(#[$doc])*
        #[inline(always)]
        pub fn $name() -> u32 {
            #[cfg(target_arch = "nvptx64")]
            let r = {
                let r: u32;
                // SAFETY: reading a special register has no side effects.
                unsafe {
                    asm!(concat!("mov.u32 {r}, ", $reg, ";"), r = out(reg32) r,
                         options(pure, nomem, nostack, preserves_flags));
                }
                r
            };
            #[cfg(not(target_arch = "nvptx64"))]
            let r = super::model::sreg::$name();
            r
        }
    };
}

sreg_u32!(/// `%tid.x`: thread index in the CTA.
    tid_x, "%tid.x");
sreg_u32!(/// `%ntid.x`: threads per CTA.
    ntid_x, "%ntid.x");
sreg_u32!(/// `%ctaid.x`: CTA index in the grid.
    ctaid_x, "%ctaid.x");
sreg_u32!(/// `%nctaid.x`: CTAs in the grid.
    nctaid_x, "%nctaid.x");
sreg_u32!(/// `%laneid`: lane in the warp.
    lane_id, "%laneid");
sreg_u32!(/// `%cluster_ctarank`: rank of this CTA in its cluster (PTX ISA 7.8, sm_90).
    cluster_ctarank, "%cluster_ctarank");
sreg_u32!(/// `%cluster_nctarank`: CTAs in this cluster (PTX ISA 7.8, sm_90).
    cluster_nctarank, "%cluster_nctarank");
sreg_u32!(/// `%clusterid.x`: cluster index in the grid (PTX ISA 7.8, sm_90).
    clusterid_x, "%clusterid.x");
sreg_u32!(/// `%nclusterid.x`: clusters in the grid (PTX ISA 7.8, sm_90).
    nclusterid_x, "%nclusterid.x");

/// `mov.u64 r, %globaltimer;` (PTX ISA 3.1): a global nanosecond timer. Not `pure`: every read
/// is a new value. (In the model: its own clock, advancing with the instructions executed.)
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn globaltimer() -> u64 {
    #[cfg(target_arch = "nvptx64")]
    let t = {
        let t: u64;
        // SAFETY: reading a special register has no side effects.
        unsafe {
            asm!("mov.u64 {t}, %globaltimer;", t = out(reg64) t, options(nomem, nostack, preserves_flags));
        }
        t
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let t = super::model::sreg::globaltimer();
    t
}

/// Warp index in the CTA, `%tid.x / 32`, made warp-uniform for the compiler with
/// `shfl.sync.idx` from lane 0 so that role dispatch on it stays uniform.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn warp_id() -> u32 {
    #[cfg(target_arch = "nvptx64")]
    let w = {
        let w: u32;
        // SAFETY: a full-warp shuffle; every lane of the warp executes this (warp-uniform call sites).
        unsafe {
            asm!("shfl.sync.idx.b32 {w}, {t}, 0, 0x1f, 0xffffffff;", w = out(reg32) w, t = in(reg32) tid_x() / 32,
                 options(pure, nomem, nostack));
        }
        w
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let w = super::model::sreg::warp_id();
    w
}

/// `trap;`: aborts the kernel; the launch then fails with an illegal-instruction error.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn trap() -> ! {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: trap never returns.
    unsafe {
        asm!("trap;", options(noreturn, nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::sreg::trap();
}
