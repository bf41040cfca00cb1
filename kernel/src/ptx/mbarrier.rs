//! mbarrier: the 8-byte shared-memory barriers that pipeline stages and async copies complete on.
//!
//! A barrier counts expected arrivals and a transaction byte count; a phase completes when both
//! reach zero, then the barrier flips its phase parity. Waiters poll a parity: "has the phase with
//! this parity completed?". On a fresh barrier, waiting for parity 1 succeeds at once.

use super::smem::SmemAddr;
#[cfg(target_arch = "nvptx64")]
use core::arch::asm;

/// An mbarrier in this CTA's shared memory (8-byte aligned).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(transparent)]
pub struct Mbarrier(pub SmemAddr);

impl Mbarrier {
    /// `mbarrier.init.shared::cta.b64 [a], count;` (PTX ISA 7.0, sm_80). One thread; follow with
    /// [`super::fence::mbarrier_init`] and a CTA/cluster barrier before anyone else uses it.
    ///
    /// # Safety
    /// Nobody may be using the barrier.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub unsafe fn init(self, count: u32) {
        #[cfg(target_arch = "nvptx64")]
        // SAFETY: the caller upholds this function's contract (see `# Safety`).
        unsafe {
            asm!("mbarrier.init.shared::cta.b64 [{b}], {c};", b = in(reg32) self.0 .0, c = in(reg32) count,
                 options(nostack));
        }
        #[cfg(not(target_arch = "nvptx64"))]
        super::model::mbarrier::init(self.0 .0, count);
    }

    /// `mbarrier.arrive.shared::cta.b64 _, [a];` (PTX ISA 7.8, sm_90; release, CTA scope): one arrival.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn arrive(self) {
        #[cfg(target_arch = "nvptx64")]
        // SAFETY: arriving on an initialized barrier.
        unsafe {
            asm!("mbarrier.arrive.shared::cta.b64 _, [{b}];", b = in(reg32) self.0 .0, options(nostack));
        }
        #[cfg(not(target_arch = "nvptx64"))]
        super::model::mbarrier::arrive(self.0 .0);
    }

    /// `mbarrier.arrive.expect_tx.shared::cta.b64 _, [a], bytes;` (PTX ISA 8.0, sm_90): one arrival
    /// that also expects `bytes` more transaction bytes (async copies completing on this barrier).
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn arrive_expect_tx(self, bytes: u32) {
        #[cfg(target_arch = "nvptx64")]
        // SAFETY: arriving on an initialized barrier.
        unsafe {
            asm!("mbarrier.arrive.expect_tx.shared::cta.b64 _, [{b}], {n};", b = in(reg32) self.0 .0,
                 n = in(reg32) bytes, options(nostack));
        }
        #[cfg(not(target_arch = "nvptx64"))]
        super::model::mbarrier::arrive_expect_tx(self.0 .0, bytes);
    }

    /// Remote arrival on the barrier at the same offset in the CTA of cluster rank `rank`:
    /// `mapa.shared::cluster.u32 r, a, rank; mbarrier.arrive.release.cluster.shared::cluster.b64 _, [r];`
    /// (PTX ISA 8.0, sm_90).
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn arrive_cluster(self, rank: u32) {
        let remote = super::cluster::map_shared(self.0, rank);
        #[cfg(target_arch = "nvptx64")]
        // SAFETY: arriving on an initialized barrier of a CTA of this cluster.
        unsafe {
            asm!("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [{b}];", b = in(reg32) remote.0,
                 options(nostack));
        }
        #[cfg(not(target_arch = "nvptx64"))]
        super::model::mbarrier::arrive_cluster(remote.0);
    }

    /// `mbarrier.try_wait.parity.shared::cta.b64 p, [a], parity;` (PTX ISA 7.8, sm_90; acquire, CTA
    /// scope): true when the phase of that parity has completed. It may suspend the thread for a
    /// hardware-chosen time before returning false.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn try_wait(self, parity: u32) -> bool {
        #[cfg(target_arch = "nvptx64")]
        let done = {
            let done: u32;
            // SAFETY: polling an initialized barrier.
            unsafe {
                asm!(
                    "{{",
                    ".reg .pred p;",
                    "mbarrier.try_wait.parity.shared::cta.b64 p, [{b}], {ph};",
                    "selp.u32 {d}, 1, 0, p;",
                    "}}",
                    b = in(reg32) self.0 .0, ph = in(reg32) parity, d = out(reg32) done, options(nostack));
            }
            done
        };
        #[cfg(not(target_arch = "nvptx64"))]
        let done = super::model::mbarrier::try_wait(self.0 .0, parity) as u32;
        done != 0
    }

    /// Same as [`Self::try_wait`] with cluster-scope acquire, for phases completed by arrivals or
    /// copies from other CTAs of the cluster:
    /// `mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64` (PTX ISA 8.0, sm_90).
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn try_wait_cluster(self, parity: u32) -> bool {
        #[cfg(target_arch = "nvptx64")]
        let done = {
            let done: u32;
            // SAFETY: polling an initialized barrier.
            unsafe {
                asm!(
                    "{{",
                    ".reg .pred p;",
                    "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [{b}], {ph};",
                    "selp.u32 {d}, 1, 0, p;",
                    "}}",
                    b = in(reg32) self.0 .0, ph = in(reg32) parity, d = out(reg32) done, options(nostack));
            }
            done
        };
        #[cfg(not(target_arch = "nvptx64"))]
        let done = super::model::mbarrier::try_wait_cluster(self.0 .0, parity) as u32;
        done != 0
    }

    /// Spins until the phase of `parity` has completed.
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn wait(self, parity: u32) {
        while !self.try_wait(parity) {}
    }

    /// Spins until the phase of `parity` has completed, with cluster-scope acquire
    /// ([`Self::try_wait_cluster`]).
    #[inline(always)]
    #[cfg_attr(not(target_arch = "nvptx64"), track_caller)]
    pub fn wait_cluster(self, parity: u32) {
        while !self.try_wait_cluster(parity) {}
    }
}
