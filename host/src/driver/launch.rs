//! Kernel launches with cluster dimensions (`cuLaunchKernelEx`).

use crate::error::{Error, Result};
use cudarc::driver::{sys, CudaFunction, CudaStream};
use std::ffi::c_void;

/// Grid, block, cluster and dynamic shared memory of one launch. Built from a kernel
/// configuration (the one source of truth for these numbers), never by hand at a call site.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchGeometry {
    /// CTAs along x (a multiple of `cluster`).
    pub grid: u32,
    /// Threads per CTA.
    pub block: u32,
    /// CTAs per cluster along x (1 = no cluster).
    pub cluster: u32,
    /// Dynamic shared memory per CTA in bytes.
    pub smem_bytes: u32,
}

/// Raises the kernel's dynamic shared memory limit to `bytes` (needed above 48 KiB).
pub fn set_max_dynamic_smem(f: &CudaFunction, bytes: u32) -> Result<()> {
    f.set_attribute(sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes as i32)
        .map_err(|e| Error::driver("setting the kernel's shared memory size", e))
}

/// Launches `f` on `stream` with `geom`. `params` holds one pointer per kernel parameter, each
/// pointing at the parameter's value.
///
/// # Safety
/// `params` must match the kernel's parameter list in number, order and size, and every device
/// pointer among them must be valid for what the kernel does with it.
pub unsafe fn launch(
    f: &CudaFunction,
    stream: &CudaStream,
    geom: LaunchGeometry,
    params: &mut [*mut c_void],
) -> Result<()> {
    let mut attr: sys::CUlaunchAttribute = std::mem::zeroed();
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x: geom.cluster, y: 1, z: 1 };
    let config = sys::CUlaunchConfig {
        gridDimX: geom.grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: geom.block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: geom.smem_bytes,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: if geom.cluster > 1 { 1 } else { 0 },
    };
    sys::cuLaunchKernelEx(&config, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut())
        .result()
        .map_err(|e| Error::driver("launching a kernel", e))
}
