//! The device half of an sm_90a plan: kernel functions, device tables, workspace, and the
//! launches.

use super::Sm90Layout;
use crate::device::Gpu;
use crate::driver::graph::{is_capturing, KernelChain};
use crate::driver::launch::{launch_with, set_max_dynamic_smem, Start};
use crate::error::{Error, Result};
use crate::plan::{ArchPlan, KernelLaunch, PlanSummary};
use crate::problem::{GroupBuffers, Problem};
use crate::Arch;
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use nvfp4_gemm_abi::sm90::{self, GemmConfig, GroupParams};
use nvfp4_gemm_abi::tensor_map::TensorMap;
use std::sync::Arc;

const DEQUANT: &str = sm90::DEQUANT_KERNEL;

/// The layout of `problem` on `sm_count` SMs: the cost model's choice, or the GEMM kernel named
/// `kernel` ([`crate::PlanOptions::sm90_kernel`]); a name that is no sm_90a GEMM kernel, or a
/// variant that cannot run the problem, is an error.
fn layout_for(problem: &Problem, sm_count: u32, kernel: Option<&str>) -> Result<Sm90Layout> {
    let Some(name) = kernel else { return Ok(Sm90Layout::new(problem, sm_count)) };
    let config = GemmConfig::ALL
        .into_iter()
        .find(|c| c.kernel_name() == name)
        .ok_or_else(|| Error::InvalidProblem(format!("sm90_kernel {name}: not an sm_90a GEMM kernel")))?;
    Sm90Layout::with_config(problem, sm_count, config)
        .ok_or_else(|| Error::InvalidProblem(format!("sm90_kernel {name}: that variant cannot run this problem")))
}

/// An sm_90a plan on a device: the layout, both functions, the device tables (group parameters,
/// tensor maps, work list) and the f16 token workspace, allocated once by [`Sm90Plan::new`].
pub(crate) struct Sm90Plan {
    /// What runs, for summaries and tests.
    pub layout: Sm90Layout,
    dequant: CudaFunction,
    gemm: CudaFunction,
    workspace: CudaSlice<u8>,
    groups: CudaSlice<u8>,
    maps: CudaSlice<u8>,
    work: CudaSlice<u8>,
    /// Both launches as one graph (built at the first launch outside a stream capture): their
    /// parameters only hold this plan's own table addresses, so one graph serves every call.
    chain: Option<KernelChain>,
}

impl Sm90Plan {
    /// Plans `problem` for `gpu` (with the GEMM kernel `kernel`, if named) and allocates the
    /// tables and the workspace.
    pub fn new(gpu: &Gpu, problem: &Problem, kernel: Option<&str>) -> Result<Sm90Plan> {
        let layout = layout_for(problem, gpu.sm_count(), kernel)?;
        let stream = gpu.context().default_stream();
        let d = |e| Error::driver("allocating the plan's device tables", e);
        let g = problem.groups().len().max(1);
        let dequant = gpu.function(DEQUANT)?;
        let gemm = gpu.function(layout.config.kernel_name())?;
        set_max_dynamic_smem(&gemm, layout.gemm.smem_bytes)?;
        let work = if layout.work.is_empty() {
            stream.alloc_zeros::<u8>(16).map_err(d)?
        } else {
            stream.clone_htod(bytemuck::cast_slice::<_, u8>(&layout.work)).map_err(d)?
        };
        Ok(Sm90Plan {
            workspace: stream.alloc_zeros::<u8>(layout.workspace_bytes).map_err(d)?,
            groups: stream.alloc_zeros::<u8>(g * size_of::<GroupParams>()).map_err(d)?,
            maps: stream.alloc_zeros::<u8>(sm90::map_count(g as u32) * size_of::<TensorMap>()).map_err(d)?,
            work,
            layout,
            dequant,
            gemm,
            chain: None,
        })
    }
}

impl ArchPlan for Sm90Plan {
    fn has_work(&self) -> bool {
        !self.layout.work.is_empty()
    }

    fn upload(&mut self, stream: &Arc<CudaStream>, problem: &Problem, buffers: &[GroupBuffers]) -> Result<()> {
        let (workspace, _guard) = self.workspace.device_ptr(stream);
        let (params, maps) = self.layout.encode(problem, buffers, workspace)?;
        crate::plan::upload_tables(stream, &params, &mut self.groups, &maps, &mut self.maps)
    }

    unsafe fn launch(&mut self, stream: &CudaStream, problem: &Problem) -> Result<()> {
        // The dequantization kernel writes the workspace the GEMM reads.
        let (_, _workspace) = self.workspace.device_ptr_mut(stream);
        let (groups, _g1) = self.groups.device_ptr(stream);
        let (maps, _g2) = self.maps.device_ptr(stream);
        let (work, _g3) = self.work.device_ptr(stream);
        let params = self.layout.kernel_params(groups, maps, work, problem);
        // SAFETY: both kernels take one `KernelParams` by value; every pointer in it and in the
        // tables it points to was validated by the caller or is owned by this plan.
        unsafe {
            let capturing = is_capturing(stream)?;
            if capturing || self.chain.is_none() {
                // The token dequantization (if any tokens) writes the workspace the GEMM reads; the
                // GEMM may start before it ends and waits for it before its first token load.
                let mut kernels = vec![];
                let mut gemm_start = Start::AfterPrevious;
                if self.layout.dequant_grid > 0 {
                    kernels.push((&self.dequant, self.layout.dequant, Start::AfterPrevious, params));
                    gemm_start = super::GEMM_AFTER_DEQUANT;
                }
                kernels.push((&self.gemm, self.layout.gemm, gemm_start, params));
                if capturing {
                    // Inside a caller's capture: the launches become nodes of the caller's graph.
                    for (f, geometry, start, p) in &kernels {
                        launch_with(f, stream, *geometry, *start, p)?;
                    }
                    return Ok(());
                }
                self.chain = Some(KernelChain::new(&kernels)?);
            }
            self.chain.as_mut().expect("built above").launch(stream)
        }
    }

    fn summary(&self) -> PlanSummary {
        let l = &self.layout;
        let mut launches = vec![];
        if l.dequant_grid > 0 {
            launches.push(KernelLaunch { kernel: DEQUANT, geometry: l.dequant });
        }
        let gemm = l.config.kernel_name();
        launches.push(KernelLaunch { kernel: gemm, geometry: l.gemm });
        PlanSummary {
            arch: Arch::Sm90a,
            kernel: format!(
                "{gemm}: swap-AB wgmma m64nNk16, tile Nx{}{} (tokens x weights; N = {}), {} stages of K {}, {} CTA(s) per SM",
                l.config.block_n,
                if l.config.block_n == sm90::BLOCK_N { "" } else { " (or 128, 64 where the host cuts N so)" },
                super::widths(l.config),
                l.config.stages,
                l.config.block_k(),
                l.config.ctas_per_sm()
            ),
            tiles: l.work.iter().filter(|w| !w.is_hole()).count(),
            launches: if l.work.is_empty() { vec![] } else { launches },
            workspace_bytes: l.workspace_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{GroupShape, OutputType};

    #[test]
    fn kernel_override_names_a_variant_that_can_run_the_problem() {
        let p =
            Problem::new(vec![GroupShape::new(200, 512, 256), GroupShape::new(3, 512, 256)], OutputType::F16).unwrap();
        assert_eq!(layout_for(&p, 132, None).unwrap().config, Sm90Layout::new(&p, 132).config);
        for c in [GemmConfig::GENERAL, GemmConfig::T64, GemmConfig::N192] {
            assert_eq!(layout_for(&p, 132, Some(c.kernel_name())).unwrap().config, c);
        }
        let err = |name| layout_for(&p, 132, Some(name)).unwrap_err().to_string();
        assert!(
            err("sm90_grouped_gemm_decode").contains("cannot run this problem"),
            "{}",
            err("sm90_grouped_gemm_decode")
        );
        assert!(err("sm100_gemm_n128_deep").contains("not an sm_90a GEMM kernel"));
        let decode = Problem::new(vec![GroupShape::new(16, 512, 256)], OutputType::F16).unwrap();
        assert_eq!(layout_for(&decode, 132, Some("sm90_grouped_gemm_decode")).unwrap().config, GemmConfig::DECODE);
    }
}
