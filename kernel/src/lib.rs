//! Device code of the NVFP4 grouped GEMM, compiled by rustc's NVPTX backend.
//!
//! `cargo xtask build-ptx` builds this crate twice: with `--cfg arch_sm90` for `sm_90a` (Hopper) and
//! with `--cfg arch_sm100` for `sm_100a` (Blackwell, PTX ISA 8.7). Each build exports only the
//! kernels of its architecture.
//!
//! Layering (dependencies point one way): [`ptx`] is the only module with `asm!` or other access to
//! the hardware (special registers, shared memory, barriers, async copies, tensor-core ops);
//! the kernels above it ([`smoke`], `sm90`, `sm100`) are written against that vocabulary only,
//! with the stage rings of [`pipeline`] and the work-list cursor of [`work`].
#![no_std]
#![feature(abi_ptx, asm_experimental_arch, core_intrinsics, gpu_intrinsics, gpu_launch_sized_workgroup_mem)]
#![allow(internal_features)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod pipeline;
pub mod ptx;
pub mod quantize;
pub mod quantize_grouped;
pub mod scan;
pub mod smoke;
pub mod work;

#[cfg(arch_sm90)]
pub mod sm90;

#[cfg(arch_sm100)]
pub mod sm100;

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    ptx::sreg::trap()
}
