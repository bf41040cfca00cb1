//! The host side of the diagnostic kernels (`diag/kernel/`): the hardware probes ([`probe`]), the
//! toolchain smoke test ([`smoke`]) and the TMA bandwidth kernel of the benchmark's measured
//! ceilings ([`ceiling`]). Their module is not the library's: [`DiagKernels`] loads the cubin of
//! `diag/kernels/` into the context of an open [`nvfp4_gemm::Gpu`], whose own module holds the
//! product kernels only.
//!
//! Used by this workspace's GPU tests (`tests/`), device-model tests (`model-tests/`, which run the
//! same kernels built for the host) and benchmark (`bench/`); it reaches the library's driver layer
//! through its doc-hidden `testing` feature. Not part of the library's API.
#![warn(missing_docs)]

pub mod ceiling;
pub mod kernels;
pub mod probe;
pub mod smoke;

pub use kernels::DiagKernels;

/// The library's error for a failed driver call `during` something.
pub(crate) fn driver_error(during: &'static str, error: cudarc::driver::DriverError) -> nvfp4_gemm::Error {
    nvfp4_gemm::Error::Driver { during, error, detail: String::new() }
}
