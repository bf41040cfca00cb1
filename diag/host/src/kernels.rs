//! The diagnostic kernels' image (`diag/kernels/*.cubin`, written by `cargo xtask build-ptx` and
//! checked by its `--check`), loaded into a GPU's context beside the library's own module.

use crate::driver_error;
use nvfp4_gemm::driver::module::{Kernel, Module};
use nvfp4_gemm::{Arch, Gpu, Result};
use std::sync::Arc;

/// The embedded diagnostic cubin of `arch` (ptxas 12.9 output).
pub fn cubin(arch: Arch) -> &'static [u8] {
    match arch {
        Arch::Sm90a => include_bytes!("../../kernels/sm_90a.cubin"),
        Arch::Sm100a => include_bytes!("../../kernels/sm_100a.cubin"),
    }
}

/// The embedded PTX the diagnostic cubin of `arch` was assembled from.
pub fn ptx(arch: Arch) -> &'static str {
    match arch {
        Arch::Sm90a => include_str!("../../kernels/sm_90a.ptx"),
        Arch::Sm100a => include_str!("../../kernels/sm_100a.ptx"),
    }
}

/// The diagnostic module loaded into a GPU's context (unloaded when the last [`Kernel`] taken
/// from it and this value are gone).
#[derive(Debug, Clone)]
pub struct DiagKernels {
    module: Arc<Module>,
}

impl DiagKernels {
    /// Loads the diagnostic cubin of `gpu`'s architecture into its context.
    pub fn load(gpu: &Gpu) -> Result<DiagKernels> {
        let module = Module::load(gpu.context(), cubin(gpu.arch()))
            .map_err(|e| driver_error("loading the diagnostic kernel image", e))?;
        Ok(DiagKernels { module })
    }

    /// The diagnostic kernel exported as `name`.
    pub fn function(&self, name: &str) -> Result<Kernel> {
        self.module.function(name).map_err(|e| driver_error("looking up a diagnostic kernel", e))
    }
}
