//! The numbers of the diagnostic kernels (`diag/kernel/`), shared with their host side
//! (`diag/host/`): parameters, launch shapes and expected layouts of the hardware probes, the
//! toolchain smoke kernels and the TMA bandwidth kernel. None of them is a product kernel: the
//! library's cubins (`host/kernels/`) hold none of them, and the library (`nvfp4-gemm`) never
//! launches one.
//!
//! Like the product abi (`nvfp4-gemm-abi`, whose encodings these build on), everything here is
//! `no_std`, free of `unsafe` and target-agnostic; a value that crosses the host/device boundary is
//! defined once, here, with `#[repr(C)]` and a size assertion or as a `const fn` with a host test.
#![no_std]

pub mod ceiling;
pub mod probe;
pub mod smoke;
