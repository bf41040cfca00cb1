//! The device half of an sm_100a plan: kernel functions, device tables, and the launches.

use super::{Sm100Launch, Sm100Layout};
use crate::device::Gpu;
use crate::driver::launch::{launch, set_max_dynamic_smem};
use crate::driver::tensor_map::TensorMap;
use crate::error::{Error, Result};
use crate::problem::{GroupBuffers, Problem};
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr};
use nvfp4_gemm_abi::sm100::params::{GroupParams, KernelLayout, KernelParams, KERNELS};
use nvfp4_gemm_abi::sm100::WorkItem;
use std::ffi::c_void;
use std::sync::Arc;

/// An sm_100a plan on a device: the layout, one function per launch, and the device tables (group
/// parameters and tensor maps, shared by the launches; one work list per launch). Allocated once
/// by [`Sm100Plan::new`]; [`Sm100Plan::upload`] refreshes the tables for new buffers and
/// [`Sm100Plan::launch`] runs the kernels.
pub(crate) struct Sm100Plan {
    /// What runs, for summaries and tests.
    pub layout: Sm100Layout,
    functions: Vec<CudaFunction>,
    groups: CudaSlice<u8>,
    maps: CudaSlice<u8>,
    work: Vec<CudaSlice<u8>>,
}

fn bytes_of<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: only `#[repr(C)]` plain-data abi types (WorkItem, GroupParams) and TensorMap (128
    // plain bytes); the kernels never read padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

impl Sm100Plan {
    /// Raises every sm_100a kernel's shared-memory limit, asks the driver how many CTAs of each
    /// fit on an SM, plans `problem` with that, and uploads the work lists.
    pub fn new(gpu: &Gpu, problem: &Problem) -> Result<Sm100Plan> {
        let mut occupancy = vec![];
        for kernel in KERNELS {
            let f = gpu.function(kernel.kernel_name())?;
            // The occupancy query counts the dynamic shared memory against the function's limit,
            // so the limit must be raised first.
            set_max_dynamic_smem(&f, kernel.dynamic_shared_memory())?;
            let [threads, _, _] = kernel.config().block();
            let ctas = f
                .occupancy_max_active_blocks_per_multiprocessor(threads, kernel.dynamic_shared_memory() as usize, None)
                .map_err(|e| Error::driver("querying a kernel's occupancy", e))?;
            // The driver does not know the kernel's TMEM use; never plan beyond it.
            occupancy.push((kernel, ctas.min(kernel.max_ctas_per_sm())));
        }
        let per_sm = |k: KernelLayout| occupancy.iter().find(|(x, _)| *x == k).map_or(0, |(_, c)| *c);
        let layout = Sm100Layout::new(problem, gpu.sm_count(), per_sm)?;
        let stream = gpu.context().default_stream();
        let d = |e| Error::driver("allocating the plan's device tables", e);
        let g = problem.groups().len().max(1);
        let functions =
            layout.launches.iter().map(|l| gpu.function(l.kernel.kernel_name())).collect::<Result<Vec<_>>>()?;
        let work = layout
            .launches
            .iter()
            .map(|l: &Sm100Launch| stream.clone_htod(bytes_of::<WorkItem>(&l.work)).map_err(d))
            .collect::<Result<Vec<_>>>()?;
        Ok(Sm100Plan {
            groups: stream.alloc_zeros::<u8>(g * std::mem::size_of::<GroupParams>()).map_err(d)?,
            maps: stream.alloc_zeros::<u8>(2 * g * std::mem::size_of::<TensorMap>()).map_err(d)?,
            functions,
            work,
            layout,
        })
    }

    /// Encodes the group parameters and tensor maps for `buffers` (validated by the caller) and
    /// copies them to the plan's tables on `stream`.
    pub fn upload(&mut self, stream: &Arc<CudaStream>, problem: &Problem, buffers: &[GroupBuffers]) -> Result<()> {
        let (params, maps) = self.layout.encode(problem, buffers)?;
        let d = |e| Error::driver("uploading the call's parameters", e);
        stream.memcpy_htod(bytes_of(&params), &mut self.groups).map_err(d)?;
        stream.memcpy_htod(bytes_of(&maps), &mut self.maps).map_err(d)?;
        Ok(())
    }

    /// Launches every kernel of the plan on `stream` (nothing when no group has work).
    ///
    /// # Safety
    /// [`Sm100Plan::upload`] must have run for buffers that are still alive and valid for the
    /// problem (`validate_buffers`), on this stream or one ordered before it.
    pub unsafe fn launch(&self, stream: &CudaStream, problem: &Problem) -> Result<()> {
        let (groups, _g1) = self.groups.device_ptr(stream);
        let (maps, _g2) = self.maps.device_ptr(stream);
        for (i, (l, f)) in self.layout.launches.iter().zip(&self.functions).enumerate() {
            let (work, _g3) = self.work[i].device_ptr(stream);
            let mut kp: KernelParams = self.layout.kernel_params(i, groups, maps, work, problem);
            let mut params = [&mut kp as *mut KernelParams as *mut c_void];
            // SAFETY: every sm_100a GEMM kernel takes one `KernelParams` by value; the tables it
            // points to are this plan's, filled by `upload` for validated buffers.
            launch(f, stream, l.geometry, &mut params)?;
        }
        Ok(())
    }

    /// A one-line description per launch, for `PlanSummary::kernel`.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self
            .layout
            .launches
            .iter()
            .map(|l| {
                let c = l.kernel.config();
                format!(
                    "{}: tcgen05 mxf4nvf4 tile {}x{}, {} stages of K {}, cluster {}, {} items on {} CTAs",
                    l.kernel.kernel_name(),
                    c.block_m(),
                    c.block_n(),
                    c.stages(),
                    c.block_k(),
                    c.cluster_size(),
                    l.work.len(),
                    l.geometry.grid
                )
            })
            .collect();
        if parts.is_empty() {
            "sm100: no work".into()
        } else {
            parts.join("; ")
        }
    }
}
