//! Kernel launches with cluster dimensions and programmatic dependent launch (`cuLaunchKernelEx`),
//! and the driver's occupancy queries.

use crate::driver::module::Kernel;
use crate::error::{Error, Result};
use cudarc::driver::{sys, CudaStream};
pub use nvfp4_gemm_abi::launch::LaunchGeometry;
use std::ffi::c_void;
use std::sync::Mutex;

/// Raises the kernel's dynamic shared memory limit to at least `bytes` (needed above 48 KiB).
pub fn set_max_dynamic_smem(f: &Kernel, bytes: u32) -> Result<()> {
    // The attribute belongs to the function, which every plan of the module shares: a plan may
    // raise it but never lower it below what another plan launches with (a launch above the
    // attribute fails with CUDA_ERROR_INVALID_VALUE). The lock makes the read and the write one
    // step for the threads of this process.
    static LOCK: Mutex<()> = Mutex::new(());
    let _held = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let attribute = sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
    let mut current = 0i32;
    // SAFETY: a valid function handle (its module is held by `f`); out-pointer to a local.
    unsafe { sys::cuFuncGetAttribute(&mut current, attribute, f.raw()) }
        .result()
        .map_err(|e| Error::driver("reading the kernel's shared memory size", e))?;
    if i64::from(bytes) <= i64::from(current) {
        return Ok(());
    }
    // SAFETY: a valid function handle (its module is held by `f`).
    unsafe { sys::cuFuncSetAttribute(f.raw(), attribute, bytes as i32) }
        .result()
        .map_err(|e| Error::driver("setting the kernel's shared memory size", e))
}

/// A kernel's one parameter struct, by value (every kernel of the library takes exactly one).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Params {
    words: [u64; Params::WORDS],
    len: usize,
}

impl std::fmt::Debug for Params {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Params({} bytes)", self.len)
    }
}

impl Params {
    /// The largest parameter struct, in 8-byte words: the MoE block's quantization with both
    /// schedulers (`abi::moe::sm90::QuantizeScheduleParams`).
    const WORDS: usize = size_of::<nvfp4_gemm_abi::moe::sm90::QuantizeScheduleParams>() / 8;

    /// The bytes of `p`.
    pub fn of<P: bytemuck::Pod>(p: &P) -> Params {
        let bytes = bytemuck::bytes_of(p);
        assert!(bytes.len() <= 8 * Self::WORDS, "a parameter struct of {} bytes", bytes.len());
        let mut words = [0u64; Self::WORDS];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        Params { words, len: bytes.len() }
    }

    /// The struct back, if it is a `P`.
    #[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))]
    pub fn get<P: bytemuck::Pod>(&self) -> Option<P> {
        (self.len == size_of::<P>()).then(|| bytemuck::pod_read_unaligned(&self.bytes()[..self.len]))
    }

    /// The bytes.
    #[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))]
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.words)[..self.len]
    }

    /// A pointer to the bytes, 8-byte aligned, for the driver's parameter array.
    pub fn as_ptr(&self) -> *const u8 {
        self.words.as_ptr().cast()
    }
}

/// When a launch may start relative to the work before it in the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// After everything before it has completed (a plain launch).
    AfterPrevious,
    /// As soon as the kernel before it lets it (`griddepcontrol.launch_dependents` in every CTA,
    /// or their exit): programmatic dependent launch. The kernel must execute
    /// `griddepcontrol.wait` before it reads anything the previous kernel writes.
    Early,
}

fn launch_config(
    geom: LaunchGeometry,
    start: Start,
    stream: &CudaStream,
    attrs: &mut [sys::CUlaunchAttribute; 2],
) -> sys::CUlaunchConfig {
    let mut n = 0;
    if geom.cluster > 1 {
        attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attrs[n].value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x: geom.cluster, y: 1, z: 1 };
        n += 1;
    }
    if start == Start::Early {
        attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attrs[n].value.programmaticStreamSerializationAllowed = 1;
        n += 1;
    }
    sys::CUlaunchConfig {
        gridDimX: geom.grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: geom.block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: geom.smem_bytes,
        hStream: stream.cu_stream(),
        attrs: attrs.as_mut_ptr(),
        numAttrs: n as u32,
    }
}

/// Launches `f` on `stream` with `geom` and one kernel parameter, `params`, passed by value
/// (every kernel of this library takes a single `#[repr(C)]` parameter struct from the abi).
///
/// # Safety
/// `f` must take exactly one parameter of type `P`, and every device pointer in `params` (and in
/// the tables it points to) must be valid for what the kernel does with it until it completes.
pub unsafe fn launch<P: bytemuck::Pod>(
    f: &Kernel,
    stream: &CudaStream,
    geom: LaunchGeometry,
    params: &P,
) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { launch_with(f, stream, geom, Start::AfterPrevious, params) }
}

/// [`launch`] with the start rule `start`.
///
/// # Safety
/// As [`launch`]; with [`Start::Early`], `f` must wait (`griddepcontrol.wait`) before it reads
/// anything the kernel before it in the stream writes.
pub unsafe fn launch_with<P: bytemuck::Pod>(
    f: &Kernel,
    stream: &CudaStream,
    geom: LaunchGeometry,
    start: Start,
    params: &P,
) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { launch_raw(f, stream, geom, start, &Params::of(params)) }
}

/// [`launch_with`] with the parameter struct as bytes.
///
/// # Safety
/// As [`launch_with`], `params` holding the bytes of the one parameter struct `f` takes.
pub unsafe fn launch_raw(
    f: &Kernel,
    stream: &CudaStream,
    geom: LaunchGeometry,
    start: Start,
    params: &Params,
) -> Result<()> {
    // The driver reads the parameter's size (the kernel's signature) from this pointer.
    let mut args = [params.as_ptr().cast_mut().cast::<c_void>()];
    // SAFETY: zero is a valid bit pattern of the attribute union; fields are set by launch_config.
    let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
    let config = launch_config(geom, start, stream, &mut attrs);
    // SAFETY: `args` holds one pointer to the parameter's bytes, matching the kernel (the
    // caller's contract); `config` points at `attrs`, alive for the call.
    unsafe { sys::cuLaunchKernelEx(&config, f.raw(), args.as_mut_ptr(), std::ptr::null_mut()) }
        .result()
        .map_err(|e| Error::driver("launching a kernel", e))
}

/// Resident CTAs of `f` per SM with `block` threads and `smem_bytes` of dynamic shared memory
/// (`cuOccupancyMaxActiveBlocksPerMultiprocessor`). Raise the function's shared-memory limit
/// first: the query counts `smem_bytes` against it.
pub fn ctas_per_sm(f: &Kernel, block: u32, smem_bytes: u32) -> Result<u32> {
    let mut ctas = 0i32;
    // SAFETY: a valid function handle; the driver writes one int.
    unsafe { sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut ctas, f.raw(), block as i32, smem_bytes as usize) }
        .result()
        .map_err(|e| Error::driver("querying a kernel's occupancy", e))?;
    Ok(ctas.max(0) as u32)
}

/// Clusters of `geom.cluster` CTAs of `f` that the device holds at once
/// (`cuOccupancyMaxActiveClusters`): it accounts for how clusters fit into GPCs, which per-SM
/// occupancy does not. `geom.grid` must be a multiple of the cluster size.
pub fn max_active_clusters(f: &Kernel, stream: &CudaStream, geom: LaunchGeometry) -> Result<u32> {
    // SAFETY: zero is a valid bit pattern of the attribute union; fields are set by launch_config.
    let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
    let config = launch_config(geom, Start::AfterPrevious, stream, &mut attrs);
    let mut clusters = 0i32;
    // SAFETY: `config` points at `attrs`, alive for the call; the driver writes one int.
    unsafe { sys::cuOccupancyMaxActiveClusters(&mut clusters, f.raw(), &config) }
        .result()
        .map_err(|e| Error::driver("querying a kernel's cluster occupancy", e))?;
    Ok(clusters.max(0) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_round_trip() {
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
        struct P {
            a: u64,
            b: u32,
            c: u32,
        }
        let p = P { a: 7, b: 9, c: 11 };
        let bytes = Params::of(&p);
        assert_eq!(bytes.bytes(), bytemuck::bytes_of(&p));
        assert_eq!(bytes.get::<P>(), Some(p));
        assert_eq!(bytes.get::<u64>(), None);
        assert_eq!(bytes.as_ptr() as usize % 8, 0);
    }
}
