//! The kernel image loaded through the driver's module API (`cuModuleLoadData`,
//! `cuModuleGetFunction`, `cuModuleUnload`). cudarc's own module loader sits behind its `nvrtc`
//! feature, which would make every application link (or load) NVRTC just to load a cubin; these
//! few calls need only the driver.

use cudarc::driver::{sys, CudaContext, DriverError};
use std::sync::Arc;

/// A loaded module, unloaded when the last [`Kernel`] and the [`crate::Gpu`] holding it are gone.
#[derive(Debug)]
pub struct Module {
    raw: sys::CUmodule,
    ctx: Arc<CudaContext>,
}

// SAFETY: a module handle may be used from any thread of the process once its context is current
// (every call below makes it current first); it is unloaded once, in `drop`.
unsafe impl Send for Module {}
unsafe impl Sync for Module {}

impl Module {
    /// Loads `image` (a cubin) into `ctx`.
    pub fn load(ctx: &Arc<CudaContext>, image: &[u8]) -> Result<Arc<Module>, DriverError> {
        // The driver reads the ELF image in place: give it 8-byte alignment (`include_bytes!`
        // guarantees none).
        let mut aligned = vec![0u64; image.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut aligned)[..image.len()].copy_from_slice(image);
        ctx.bind_to_thread()?;
        let mut raw: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `aligned` holds the whole image for the call (the driver copies what it keeps);
        // out-pointer to a local.
        unsafe { sys::cuModuleLoadData(&mut raw, aligned.as_ptr().cast()) }.result()?;
        Ok(Arc::new(Module { raw, ctx: ctx.clone() }))
    }

    /// The kernel exported as `name`.
    pub fn function(self: &Arc<Self>, name: &str) -> Result<Kernel, DriverError> {
        let name = std::ffi::CString::new(name).map_err(|_| DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE))?;
        let mut raw: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: `name` is NUL-terminated and alive for the call; out-pointer to a local.
        unsafe { sys::cuModuleGetFunction(&mut raw, self.raw, name.as_ptr()) }.result()?;
        Ok(Kernel { raw, _module: self.clone() })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // Errors here (a context already torn down) leave nothing to clean up.
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: loaded by `load`, unloaded only here.
            let _ = unsafe { sys::cuModuleUnload(self.raw) };
        }
    }
}

/// A kernel of a loaded [`Module`]; keeps the module loaded.
#[derive(Debug, Clone)]
pub struct Kernel {
    raw: sys::CUfunction,
    _module: Arc<Module>,
}

// SAFETY: a function handle is valid in any thread while its module is loaded (held here).
unsafe impl Send for Kernel {}
unsafe impl Sync for Kernel {}

impl Kernel {
    /// The driver's handle, for launches and queries at the `sys` level.
    pub fn raw(&self) -> sys::CUfunction {
        self.raw
    }
}
