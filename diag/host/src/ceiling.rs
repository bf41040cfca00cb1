//! The TMA bandwidth kernel (`xfer_tma_bandwidth`, `diag/kernel/src/ceiling.rs`, sm_90a) on the GPU,
//! for `nvfp4-bench`'s measured ceilings: prepared once per case ([`TmaBandwidth::new`]: the
//! tensor map over the caller's buffer, the output), launched as often as the caller times it,
//! its counters read back to check that every box arrived. Not part of the GEMM's API.

use crate::{driver_error, DiagKernels};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use nvfp4_gemm::driver::launch::{launch, set_max_dynamic_smem, LaunchGeometry};
use nvfp4_gemm::driver::module::Kernel;
use nvfp4_gemm::driver::tensor_map;
use nvfp4_gemm::{Arch, Error, Gpu, Result};
pub use nvfp4_gemm_diag_abi::ceiling::*;
use std::sync::Arc;

/// One case of the TMA bandwidth kernel, ready to launch on one stream.
pub struct TmaBandwidth {
    f: Kernel,
    stream: Arc<CudaStream>,
    _map: CudaSlice<u8>,
    out: CudaSlice<u32>,
    params: TmaBandwidthParams,
    geometry: LaunchGeometry,
}

impl TmaBandwidth {
    /// `case` over the first `case.tensor_bytes()` bytes of `buffer`, on `grid` CTAs of `stream`
    /// (sm_90a only). The buffer's contents do not matter; it must outlive every launch.
    pub fn new(
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        buffer: &CudaSlice<u8>,
        case: TmaBandwidthCase,
        grid: u32,
    ) -> Result<TmaBandwidth> {
        if gpu.arch() != Arch::Sm90a {
            return Err(Error::Unsupported(format!("{TMA_BANDWIDTH_KERNEL} is an sm_90a kernel")));
        }
        case.check().map_err(|why| Error::InvalidProblem(format!("TMA bandwidth case {case:?}: {why}")))?;
        if (buffer.len() as u64) < case.tensor_bytes() || grid == 0 {
            return Err(Error::InvalidProblem(format!(
                "TMA bandwidth case {case:?}: a buffer of {} bytes, grid {grid}",
                buffer.len()
            )));
        }
        let d = |e| driver_error("preparing the TMA bandwidth kernel", e);
        let base = {
            let (ptr, _sync) = buffer.device_ptr(stream);
            ptr
        };
        let map = tensor_map::encode(&case.map(), base)?;
        let map = stream.clone_htod(&map.0).map_err(d)?;
        let out = stream.alloc_zeros::<u32>((grid * TMA_BW_OUT_WORDS) as usize).map_err(d)?;
        let params = {
            let (m, _s0) = map.device_ptr(stream);
            let (o, _s1) = out.device_ptr(stream);
            case.params(m, o)
        };
        let geometry = tma_bandwidth_launch(grid);
        let f = DiagKernels::load(gpu)?.function(TMA_BANDWIDTH_KERNEL)?;
        set_max_dynamic_smem(&f, geometry.smem_bytes)?;
        Ok(TmaBandwidth { f, stream: stream.clone(), _map: map, out, params, geometry })
    }

    /// The kernel's parameters.
    pub fn params(&self) -> &TmaBandwidthParams {
        &self.params
    }

    /// The launch geometry.
    pub fn geometry(&self) -> LaunchGeometry {
        self.geometry
    }

    /// Launches the kernel once on the stream (asynchronously).
    pub fn launch(&self) -> Result<()> {
        // SAFETY: `xfer_tma_bandwidth` takes one `TmaBandwidthParams`, made by `params` of a
        // checked case; the map describes the caller's buffer (long enough, and alive as long as
        // the caller's contract of `new` says), the output holds the words of `grid` CTAs.
        unsafe { launch(&self.f, &self.stream, self.geometry, &self.params) }
    }

    /// After a launch: the boxes each CTA received (synchronizes the stream).
    pub fn boxes_received(&self) -> Result<Vec<u32>> {
        let words = self.stream.clone_dtoh(&self.out).map_err(|e| driver_error("reading the TMA counters", e))?;
        Ok(words.chunks_exact(TMA_BW_OUT_WORDS as usize).map(|w| w[TMA_BW_OUT_BOXES as usize]).collect())
    }

    /// The boxes CTA `cta` receives per launch.
    pub fn boxes_expected(&self, cta: u32) -> u32 {
        self.params.loads_of_cta(cta, self.geometry.grid) * self.params.boxes_per_stage
    }
}
