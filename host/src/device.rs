//! Which GPU we are on, and the kernel image for it.

use crate::driver::module::{Kernel, Module};
use crate::error::{Error, Result};
use cudarc::driver::{sys, CudaContext};
use std::sync::Arc;

/// A GPU architecture this library has kernels for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Hopper (H100, H200): compute capability 9.0, kernels built for `sm_90a`.
    Sm90a,
    /// Blackwell datacenter (B200): compute capability 10.0, kernels built for `sm_100a`.
    Sm100a,
}

impl Arch {
    /// The architecture for a compute capability, if we support it.
    pub fn from_compute_capability(major: i32, minor: i32) -> Option<Arch> {
        match (major, minor) {
            (9, 0) => Some(Arch::Sm90a),
            (10, 0) => Some(Arch::Sm100a),
            _ => None,
        }
    }

    /// The ptxas target name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm90a => "sm_90a",
            Arch::Sm100a => "sm_100a",
        }
    }

    /// The embedded cubin (ptxas 12.9 output, committed and checked by `cargo xtask build-ptx --check`).
    pub fn cubin(self) -> &'static [u8] {
        match self {
            Arch::Sm90a => include_bytes!("../kernels/sm_90a.cubin"),
            Arch::Sm100a => include_bytes!("../kernels/sm_100a.cubin"),
        }
    }

    /// The embedded PTX the cubin was assembled from.
    pub fn ptx(self) -> &'static str {
        match self {
            Arch::Sm90a => include_str!("../kernels/sm_90a.ptx"),
            Arch::Sm100a => include_str!("../kernels/sm_100a.ptx"),
        }
    }
}

/// True when the CUDA driver library can be loaded. Never panics (cudarc itself panics on first
/// use when the library is absent, so check this first). With the `dynamic-linking` feature the
/// library is linked: the process would not have started without it.
pub fn driver_present() -> bool {
    #[cfg(feature = "dynamic-loading")]
    // SAFETY: only tries to dlopen the library.
    return unsafe { sys::is_culib_present() };
    #[cfg(not(feature = "dynamic-loading"))]
    return true;
}

#[cfg(not(any(feature = "dynamic-loading", feature = "dynamic-linking")))]
compile_error!(
    "nvfp4-gemm needs one of its features `dynamic-loading` (the default: libcuda loaded at run time) \
     or `dynamic-linking` (linked at build time), the same mode as the application's cudarc"
);

/// A CUDA device with this library's kernels loaded.
#[derive(Debug)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    arch: Arch,
    name: String,
    sm_count: u32,
    module: Arc<Module>,
}

impl Gpu {
    /// Opens device `ordinal`, checks its architecture and loads the matching kernel image.
    ///
    /// Errors: [`Error::NoDriver`] without a driver, [`Error::UnsupportedArch`] on any device other
    /// than compute capability 9.0 or 10.0.
    pub fn new(ordinal: usize) -> Result<Gpu> {
        if !driver_present() {
            return Err(Error::NoDriver);
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| Error::driver("opening the device", e))?;
        Self::from_context(ctx)
    }

    /// Same as [`Gpu::new`] for a context the application already has.
    pub fn from_context(ctx: Arc<CudaContext>) -> Result<Gpu> {
        let (major, minor) =
            ctx.compute_capability().map_err(|e| Error::driver("reading the compute capability", e))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown device".into());
        let arch = Arch::from_compute_capability(major, minor).ok_or(Error::UnsupportedArch {
            major,
            minor,
            name: name.clone(),
        })?;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| Error::driver("reading the SM count", e))? as u32;
        let module = Module::load(&ctx, arch.cubin()).map_err(|e| Error::driver("loading the kernel image", e))?;
        Ok(Gpu { ctx, arch, name, sm_count, module })
    }

    /// The CUDA context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The device's architecture.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Number of streaming multiprocessors.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// A kernel of the loaded image by its exported name.
    pub(crate) fn function(&self, name: &str) -> Result<Kernel> {
        self.module.function(name).map_err(|e| Error::driver("looking up a kernel", e))
    }
}

/// Whether `stream` is being captured into a CUDA graph (`cuStreamIsCapturing`).
pub fn is_capturing(stream: &cudarc::driver::CudaStream) -> Result<bool> {
    crate::driver::graph::is_capturing(stream)
}
