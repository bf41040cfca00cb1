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
//! Two targets, one source: on nvptx64 each wrapper is its `asm!`; on any other target the same
//! wrapper calls the instruction of the CPU model of the device (`nvfp4-gemm-model`, one call per
//! wrapper, `#[track_caller]` so that the model's reports name the kernel's line), and
//! [`kernel`] turns the entry points into Rust functions the model can launch. Nothing above this
//! module knows which target it is built for.

pub mod barrier;
pub mod cluster;
pub mod convert;
pub mod cvt_f64;
pub mod fence;
pub mod gmem;
pub mod mbarrier;
pub mod smem;
pub mod sreg;
pub mod tma;
pub mod warp;

// On the host both architectures' instructions exist (the model checks which one a launch uses).
#[cfg(any(arch_sm100, not(target_arch = "nvptx64")))]
pub mod tcgen05;
#[cfg(any(arch_sm90, not(target_arch = "nvptx64")))]
pub mod wgmma;

/// The model of the device, on the host.
#[cfg(not(target_arch = "nvptx64"))]
use nvfp4_gemm_model as model;

/// Marks a kernel entry point: `#[ptx::kernel] pub unsafe fn name(p: Params) { .. }` is the
/// exported `#[no_mangle] extern "ptx-kernel"` function on nvptx64, and a plain Rust function on
/// the host, where the model launches it (a failing launch stops its threads by unwinding, which
/// an `extern "C"` frame would turn into an abort). The attribute (a proc-macro, stable Rust) hands
/// the function to [`entry_point!`], whose definition is chosen by the target.
pub(crate) use nvfp4_gemm_kernel_macros::kernel;

/// The expansion of [`kernel`] on nvptx64.
#[cfg(target_arch = "nvptx64")]
macro_rules! entry_point {
    ($(#[$meta:meta])* pub unsafe fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $name($($arg: $ty),*) $body
    };
}

/// The expansion of [`kernel`] on the host: the entry point stays a Rust function.
#[cfg(not(target_arch = "nvptx64"))]
macro_rules! entry_point {
    ($(#[$meta:meta])* pub unsafe fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        pub unsafe fn $name($($arg: $ty),*) $body
    };
}

pub(crate) use entry_point;
