//! Device code of the diagnostic kernels, compiled by rustc's NVPTX backend into a module of its
//! own (`diag/kernels/`), apart from the library's kernels (`host/kernels/`):
//! - [`smoke`]: the toolchain smoke kernels (cluster launch, mbarriers, DSMEM arrival, 128B-swizzled
//!   TMA; TMEM allocation on sm_100a);
//! - `probe` (sm_90a) and `probe_sm100` (sm_100a): the hardware probes, small kernels that write
//!   what the hardware did so that a GPU and the device model can be compared byte for byte;
//! - `ceiling` (sm_90a): the TMA bandwidth kernel of the benchmark's measured ceilings.
//!
//! They are written against the product kernel crate (`nvfp4-gemm-kernel`): its [`ptx`]
//! vocabulary (the only place with `asm!`), its stage rings and the abi's encodings, so that what
//! a probe checks is what the GEMM kernels use. That crate is linked without its `entries`
//! feature, so this module exports no product kernel; [`ptx`] here is the product's with the
//! expansion of `#[ptx::kernel]` that exports.
//!
//! `cargo xtask build-ptx` builds this crate twice, as it builds `kernel/` (`--cfg arch_sm90`,
//! `--cfg arch_sm100`); on the host it is an ordinary library whose kernels the device model
//! launches (`model-tests/`).
#![cfg_attr(target_arch = "nvptx64", no_std)]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]
#![deny(unsafe_op_in_unsafe_fn)]

/// The product kernel crate's hardware vocabulary; `#[ptx::kernel]` expands to this module's
/// `entry_point!`, the product crate's expansion that always exports.
pub mod ptx {
    pub use nvfp4_gemm_kernel::ptx::exported_entry_point as entry_point;
    pub use nvfp4_gemm_kernel::ptx::*;
}

pub mod smoke;

// The hardware probes run on the H200 (and in the model): sm_90a only.
#[cfg(any(arch_sm90, not(target_arch = "nvptx64")))]
pub mod probe;

// The Blackwell probes, for the first B200 (and the model).
#[cfg(any(arch_sm100, not(target_arch = "nvptx64")))]
pub mod probe_sm100;

// The TMA bandwidth kernel of the bench's ceilings (sm_90a, and in the model).
#[cfg(any(arch_sm90, not(target_arch = "nvptx64")))]
pub mod ceiling;
