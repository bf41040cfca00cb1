//! Kernel launches with cluster dimensions (`cuLaunchKernelEx`), and the driver's occupancy
//! queries.

use crate::error::{Error, Result};
use cudarc::driver::{sys, CudaFunction, CudaStream};
pub use nvfp4_gemm_abi::launch::LaunchGeometry;
use std::ffi::c_void;

/// Raises the kernel's dynamic shared memory limit to `bytes` (needed above 48 KiB).
pub fn set_max_dynamic_smem(f: &CudaFunction, bytes: u32) -> Result<()> {
    f.set_attribute(sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes as i32)
        .map_err(|e| Error::driver("setting the kernel's shared memory size", e))
}

fn launch_config(geom: LaunchGeometry, stream: &CudaStream, attr: &mut sys::CUlaunchAttribute) -> sys::CUlaunchConfig {
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x: geom.cluster, y: 1, z: 1 };
    sys::CUlaunchConfig {
        gridDimX: geom.grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: geom.block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: geom.smem_bytes,
        hStream: stream.cu_stream(),
        attrs: attr,
        numAttrs: if geom.cluster > 1 { 1 } else { 0 },
    }
}

/// Launches `f` on `stream` with `geom` and one kernel parameter, `params`, passed by value
/// (every kernel of this library takes a single `#[repr(C)]` parameter struct from the abi).
///
/// # Safety
/// `f` must take exactly one parameter of type `P`, and every device pointer in `params` (and in
/// the tables it points to) must be valid for what the kernel does with it until it completes.
pub unsafe fn launch<P: bytemuck::Pod>(
    f: &CudaFunction,
    stream: &CudaStream,
    geom: LaunchGeometry,
    params: &P,
) -> Result<()> {
    let mut value: P = *params;
    let mut args = [&mut value as *mut P as *mut c_void];
    // SAFETY: zero is a valid bit pattern of the attribute union; fields are set below.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    let config = launch_config(geom, stream, &mut attr);
    // SAFETY: `args` holds one pointer to a live `P`, matching the kernel (the caller's
    // contract); `config` points at `attr`, alive for the call.
    unsafe { sys::cuLaunchKernelEx(&config, f.cu_function(), args.as_mut_ptr(), std::ptr::null_mut()) }
        .result()
        .map_err(|e| Error::driver("launching a kernel", e))
}

/// Resident CTAs of `f` per SM with `block` threads and `smem_bytes` of dynamic shared memory
/// (`cuOccupancyMaxActiveBlocksPerMultiprocessor`). Raise the function's shared-memory limit
/// first: the query counts `smem_bytes` against it.
pub fn ctas_per_sm(f: &CudaFunction, block: u32, smem_bytes: u32) -> Result<u32> {
    f.occupancy_max_active_blocks_per_multiprocessor(block, smem_bytes as usize, None)
        .map_err(|e| Error::driver("querying a kernel's occupancy", e))
}

/// Clusters of `geom.cluster` CTAs of `f` that the device holds at once
/// (`cuOccupancyMaxActiveClusters`): it accounts for how clusters fit into GPCs, which per-SM
/// occupancy does not. `geom.grid` must be a multiple of the cluster size.
pub fn max_active_clusters(f: &CudaFunction, stream: &CudaStream, geom: LaunchGeometry) -> Result<u32> {
    // SAFETY: zero is a valid bit pattern of the attribute union; fields are set by launch_config.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    let config = launch_config(geom, stream, &mut attr);
    let mut clusters = 0i32;
    // SAFETY: `config` points at `attr`, alive for the call; the driver writes one int.
    unsafe { sys::cuOccupancyMaxActiveClusters(&mut clusters, f.cu_function(), &config) }
        .result()
        .map_err(|e| Error::driver("querying a kernel's cluster occupancy", e))?;
    Ok(clusters.max(0) as u32)
}
