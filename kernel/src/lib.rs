//! Device code of the NVFP4 grouped GEMM, compiled by rustc's NVPTX backend.
//!
//! `cargo xtask build-ptx` builds this crate twice: with `--cfg arch_sm90` for `sm_90a` (Hopper) and
//! with `--cfg arch_sm100` for `sm_100a` (Blackwell, PTX ISA 8.7). Each build exports only the
//! kernels of its architecture.
//!
//! On any other target (the host) the crate is an ordinary Rust library with both architectures'
//! kernels, whose [`ptx`] wrappers call the CPU model of the device (`nvfp4-gemm-model`): the
//! model tests (`model-tests/`) launch the entry points there. The nvptx64 build is unaffected.
//!
//! Layering (dependencies point one way): [`ptx`] is the only module with `asm!` or other access to
//! the hardware (special registers, shared memory, barriers, async copies, tensor-core ops);
//! the kernels above it (`sm90`, `sm100`, [`quantize`], [`quantize_grouped`], [`activate`]) are written against
//! that vocabulary only, with the stage rings of [`pipeline`] and the work-list cursor of [`work`].
//!
//! Every kernel here is a product kernel. The diagnostic kernels (hardware probes, toolchain smoke,
//! TMA bandwidth) are a crate of their own (`diag/kernel/`) built on this one's public modules; it
//! links this crate without its default `entries` feature, so that neither module exports the
//! other's kernels.
#![cfg_attr(target_arch = "nvptx64", no_std)]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(asm_experimental_arch, core_intrinsics, gpu_intrinsics, gpu_launch_sized_workgroup_mem)
)]
// `extern "ptx-kernel"`: the exported entry points, only with `entries`.
#![cfg_attr(all(target_arch = "nvptx64", feature = "entries"), feature(abi_ptx))]
#![cfg_attr(target_arch = "nvptx64", allow(internal_features))]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod activate;
pub mod moe;
pub mod moe_block;
pub mod pipeline;
pub mod ptx;
pub mod quantize;
pub mod quantize_grouped;
pub mod scan;
pub mod schedule;
pub mod work;
pub mod workspace;

// The nvptx64 builds select one architecture; the host build has both.
#[cfg(any(arch_sm90, not(target_arch = "nvptx64")))]
pub mod sm90;

#[cfg(any(arch_sm100, not(target_arch = "nvptx64")))]
pub mod sm100;

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    ptx::sreg::trap()
}
