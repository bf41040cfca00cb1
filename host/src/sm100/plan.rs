//! The device half of an sm_100a plan: kernel functions, device tables, and the launches.

use super::{Sm100Launch, Sm100Layout};
use crate::device::{Arch, Gpu};
use crate::driver::launch::{ctas_per_sm, launch, max_active_clusters, set_max_dynamic_smem, LaunchGeometry};
use crate::driver::module::Kernel;
use crate::error::{Error, Result};
use crate::problem::{GroupBuffers, Problem};
use crate::summary::{KernelLaunch, PlanSummary};
use crate::tables::{upload_tables, AlphaField};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use nvfp4_gemm_abi::sm100::params::{GroupParams, KernelLayout, GROUP_ALPHA_OFFSET, KERNELS};
use nvfp4_gemm_abi::tensor_map::TensorMap;
use std::sync::Arc;

/// Raises every sm_100a GEMM kernel's shared-memory limit and asks the driver how many CTAs (for
/// the cluster kernel: how many clusters) of each fit on the device: each kernel's
/// [`KernelConfig::resident_ctas`](nvfp4_gemm_abi::sm100::KernelConfig::resident_ctas).
pub(crate) fn resident_ctas(gpu: &Gpu) -> Result<Vec<(KernelLayout, u32)>> {
    let stream = gpu.context().default_stream();
    let mut resident = vec![];
    for kernel in KERNELS {
        let cfg = kernel.config();
        let f = gpu.function(kernel.kernel_name())?;
        // The occupancy queries count the dynamic shared memory against the function's
        // limit, so the limit must be raised first.
        set_max_dynamic_smem(&f, cfg.dynamic_shared_memory())?;
        // One cluster (one CTA without clusters) of the kernel's launch.
        let one_cluster = LaunchGeometry { grid: cfg.cluster_size(), ..kernel.launch(0, 0) };
        // The driver does not know the kernel's TMEM use; never plan beyond it.
        let per_sm = ctas_per_sm(&f, one_cluster.block, one_cluster.smem_bytes)?.min(cfg.max_ctas_per_sm());
        let clusters = if cfg.cluster_size() > 1 { max_active_clusters(&f, &stream, one_cluster)? } else { 0 };
        resident.push((kernel, cfg.resident_ctas(gpu.sm_count(), per_sm, clusters)));
    }
    Ok(resident)
}

/// An sm_100a plan on a device: the layout, one function per launch, and the device tables (group
/// parameters and tensor maps, shared by the launches; one work list per launch). Allocated once
/// by [`Sm100Plan::new`]; `upload` refreshes the tables for new buffers and `launch` runs the
/// kernels.
pub(crate) struct Sm100Plan {
    /// What runs, for summaries and tests.
    pub layout: Sm100Layout,
    functions: Vec<Kernel>,
    groups: CudaSlice<u8>,
    maps: CudaSlice<u8>,
    work: Vec<CudaSlice<u8>>,
}

impl Sm100Plan {
    /// Raises every sm_100a kernel's shared-memory limit, asks the driver how many CTAs (for the
    /// cluster kernel: how many clusters) of each fit on the device, plans `problem` with that,
    /// and uploads the work lists.
    pub fn new(gpu: &Gpu, problem: &Problem) -> Result<Sm100Plan> {
        let stream = gpu.context().default_stream();
        let resident = resident_ctas(gpu)?;
        let resident = |k: KernelLayout| resident.iter().find(|(x, _)| *x == k).map_or(0, |(_, c)| *c);
        let layout = Sm100Layout::new(problem, resident)?;
        let d = |e| Error::driver("allocating the plan's device tables", e);
        let g = problem.groups().len().max(1);
        let functions =
            layout.launches.iter().map(|l| gpu.function(l.kernel.kernel_name())).collect::<Result<Vec<_>>>()?;
        let work = layout
            .launches
            .iter()
            .map(|l: &Sm100Launch| stream.clone_htod(bytemuck::cast_slice::<_, u8>(&l.work)).map_err(d))
            .collect::<Result<Vec<_>>>()?;
        Ok(Sm100Plan {
            groups: stream.alloc_zeros::<u8>(g * size_of::<GroupParams>()).map_err(d)?,
            maps: stream.alloc_zeros::<u8>(2 * g * size_of::<TensorMap>()).map_err(d)?,
            functions,
            work,
            layout,
        })
    }
}

/// The device half (`crate::plan::GemmPlan` dispatches to it).
impl Sm100Plan {
    pub fn has_work(&self) -> bool {
        !self.layout.launches.is_empty()
    }

    pub fn upload(&mut self, stream: &Arc<CudaStream>, problem: &Problem, buffers: &[GroupBuffers]) -> Result<()> {
        let (params, maps) = self.layout.encode(problem, buffers)?;
        upload_tables(stream, &params, &mut self.groups, &maps, &mut self.maps)
    }

    pub unsafe fn launch(&mut self, stream: &CudaStream, problem: &Problem) -> Result<()> {
        let (groups, _g1) = self.groups.device_ptr(stream);
        let (maps, _g2) = self.maps.device_ptr(stream);
        for (i, (l, f)) in self.layout.launches.iter().zip(&self.functions).enumerate() {
            let (work, _g3) = self.work[i].device_ptr(stream);
            let params = self.layout.kernel_params(i, groups, maps, work, problem);
            // SAFETY: every sm_100a GEMM kernel takes one `KernelParams` by value; the tables it
            // points to are this plan's, filled by `upload` for validated buffers.
            unsafe { launch(f, stream, l.geometry, &params)? };
        }
        Ok(())
    }

    /// Copies `groups` device alphas at `alphas` into the group table on `stream`.
    ///
    /// # Safety
    /// As [`AlphaField::copy`].
    pub unsafe fn copy_alphas(&mut self, stream: &CudaStream, alphas: u64, groups: usize) -> Result<()> {
        const ALPHAS: AlphaField = AlphaField::of::<GroupParams>(GROUP_ALPHA_OFFSET);
        // SAFETY: the caller's contract.
        unsafe { ALPHAS.copy(stream, &mut self.groups, alphas, groups) }
    }

    pub fn summary(&self) -> PlanSummary {
        summary(&self.layout)
    }
}

/// What a plan of `layout` runs, for people and tests (also without a GPU: `crate::plan_summary`).
pub(crate) fn summary(layout: &Sm100Layout) -> PlanSummary {
    let parts: Vec<String> = layout
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
    PlanSummary {
        arch: Arch::Sm100a,
        kernel: if parts.is_empty() { "sm100: no work".into() } else { parts.join("; ") },
        tiles: layout.tiles(),
        launches: layout
            .launches
            .iter()
            .map(|l| KernelLaunch { kernel: l.kernel.kernel_name(), geometry: l.geometry })
            .collect(),
        workspace_bytes: 0,
    }
}
