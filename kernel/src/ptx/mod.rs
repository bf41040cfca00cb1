//! The hardware vocabulary: every `asm!` of the device code lives in this module, one file per
//! PTX instruction family. Kernels above it never touch special registers, shared-memory
//! addresses, barriers or `core::arch::nvptx` directly.
//!
//! Conventions:
//! - A wrapper's doc starts with the PTX it emits, the PTX ISA version and the lowest target, and
//!   says who must issue it (one thread, a full converged warp, a warpgroup, all threads of the CTA).
//! - Shared-memory operands are 32-bit `.shared::cta` addresses ([`smem::SmemAddr`]); generic
//!   pointers are only used for ordinary loads and stores.
//! - Collective (`.aligned`) instructions must be reached by warp-uniform control flow. The build
//!   marks every side-effecting `asm!` call `convergent` so LLVM cannot duplicate them into divergent
//!   branches, and `xtask build-ptx` counts them per kernel against `kernel/collectives.txt`.
//!
//! A CPU model of this layer is planned, so that the kernels above can run on the host.

pub mod barrier;
pub mod cluster;
pub mod convert;
pub mod cvt_f64;
pub mod fence;
pub mod mbarrier;
pub mod smem;
pub mod sreg;
pub mod tma;
pub mod warp;

#[cfg(arch_sm100)]
pub mod tcgen05;
#[cfg(arch_sm90)]
pub mod wgmma;
