//! Thread-block clusters: cluster-wide barriers and distributed shared memory addresses.

use super::smem::SmemAddr;
#[cfg(target_arch = "nvptx64")]
use core::arch::asm;

/// `barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;`
/// (PTX ISA 7.8, sm_90): every thread of every CTA of the cluster waits for all the others;
/// shared-memory writes before it are visible cluster-wide after it.
///
/// # Safety
/// All threads of the cluster must execute it, each warp convergently (`.aligned`).
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub unsafe fn sync() {
    #[cfg(not(target_arch = "nvptx64"))]
    super::model::cluster::sync();
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller upholds this function's contract (see `# Safety`).
    unsafe {
        asm!("barrier.cluster.arrive.release.aligned;", "barrier.cluster.wait.acquire.aligned;", options(nostack));
    }
}

/// `mapa.shared::cluster.u32 d, a, rank;` (PTX ISA 7.8, sm_90): the `.shared::cluster` address of
/// the variable at `a` in the CTA of cluster rank `rank`.
#[inline(always)]
#[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
pub fn map_shared(a: SmemAddr, rank: u32) -> SmemAddr {
    #[cfg(target_arch = "nvptx64")]
    let d = {
        let d: u32;
        // SAFETY: address arithmetic only.
        unsafe {
            asm!("mapa.shared::cluster.u32 {d}, {a}, {r};", d = out(reg32) d, a = in(reg32) a.0, r = in(reg32) rank,
                 options(pure, nomem, nostack));
        }
        d
    };
    #[cfg(not(target_arch = "nvptx64"))]
    let d = super::model::cluster::map_shared(a.0, rank);
    SmemAddr(d)
}
