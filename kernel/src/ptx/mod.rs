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
//!   branches, and `xtask build-ptx` counts them per kernel against `kernel/collectives.txt`
//!   (`diag/kernel/collectives.txt` for the diagnostic kernels).
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

/// `v`, as a value LLVM cannot see through: an empty `asm!` that is not `pure`, so what is
/// computed from it stays where it is used instead of being hoisted out of a persistent kernel's
/// tile loop (where it would hold a register through every main loop; [`smem::SmemAddr::opaque`]
/// does the same for shared addresses). Emits no instruction.
#[inline(always)]
pub fn opaque_u32(v: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    let v = {
        let mut v = v;
        // SAFETY: a comment only: no instruction, no memory access.
        unsafe { core::arch::asm!("/* opaque {v} */", v = inout(reg32) v, options(nomem, nostack, preserves_flags)) };
        v
    };
    v
}

/// [`opaque_u32`] for a 64-bit value (an address).
#[inline(always)]
pub fn opaque_u64(v: u64) -> u64 {
    #[cfg(target_arch = "nvptx64")]
    let v = {
        let mut v = v;
        // SAFETY: a comment only: no instruction, no memory access.
        unsafe { core::arch::asm!("/* opaque {v} */", v = inout(reg64) v, options(nomem, nostack, preserves_flags)) };
        v
    };
    v
}

/// Marks a kernel entry point: `#[ptx::kernel] pub unsafe fn name(p: Params) { .. }` is the
/// exported `#[no_mangle] extern "ptx-kernel"` function on nvptx64, and a plain Rust function on
/// the host, where the model launches it (a failing launch stops its threads by unwinding, which
/// an `extern "C"` frame would turn into an abort). The attribute (a proc-macro, stable Rust) hands
/// the function to `crate::ptx::entry_point!` of the crate that uses it: in this crate
/// [`entry_point!`], which exports the product kernels only with the crate's `entries` feature (a
/// default one); a crate of other kernels built on this one (`diag/kernel/`) names
/// [`exported_entry_point!`] as its `ptx::entry_point`.
pub use nvfp4_gemm_kernel_macros::kernel;

/// The expansion of [`kernel`] that always exports: on nvptx64 the `#[no_mangle]
/// extern "ptx-kernel"` entry point, on the host a plain Rust function.
#[cfg(target_arch = "nvptx64")]
#[macro_export]
macro_rules! exported_entry_point {
    ($(#[$meta:meta])* pub unsafe fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        #[no_mangle]
        pub unsafe extern "ptx-kernel" fn $name($($arg: $ty),*) $body
    };
}

/// The expansion of [`kernel`] that always exports: on nvptx64 the `#[no_mangle]
/// extern "ptx-kernel"` entry point, on the host a plain Rust function.
#[cfg(not(target_arch = "nvptx64"))]
#[macro_export]
macro_rules! exported_entry_point {
    ($(#[$meta:meta])* pub unsafe fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        pub unsafe fn $name($($arg: $ty),*) $body
    };
}

pub use exported_entry_point;

/// The expansion of [`kernel`] for this crate's (the product's) kernels, with the `entries`
/// feature: exported as [`exported_entry_point!`] exports.
#[cfg(feature = "entries")]
pub(crate) use exported_entry_point as entry_point;

/// The expansion of [`kernel`] for this crate's kernels without the `entries` feature: a plain
/// Rust function on every target, so that a module linking this crate for its own kernels exports
/// none of these.
#[cfg(not(feature = "entries"))]
macro_rules! entry_point {
    ($(#[$meta:meta])* pub unsafe fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        pub unsafe fn $name($($arg: $ty),*) $body
    };
}

#[cfg(not(feature = "entries"))]
pub(crate) use entry_point;
