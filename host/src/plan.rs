//! The reusable plan: a problem bound to a device, with its configuration, work list, parameter
//! tables and workspace; and the launch.

use crate::device::{Arch, Gpu};
use crate::driver::launch::LaunchGeometry;
use crate::error::Result;
use crate::problem::{validate_buffers, view, view_mut, GroupBuffers, OutputType, Problem};
use crate::sm100::Sm100Plan;
use crate::sm90::Sm90Plan;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use half::{bf16, f16};
use std::sync::Arc;

/// One NVFP4 operand on the device: packed e2m1 values (two per byte, low nibble first; a row of K
/// values is K/2 bytes) and e4m3 block scales in the 128x4 blocked layout.
#[derive(Clone, Copy)]
pub struct Nvfp4Operand<'a> {
    /// Packed values, `rows · k / 2` bytes.
    pub values: &'a dyn DevicePtr<u8>,
    /// Blocked scales, `ceil(rows/128)·128 · k/16` bytes (see `nvfp4_format::layout`).
    pub scales: &'a dyn DevicePtr<u8>,
}

/// The output buffer of one group, `m · n` elements, row-major.
pub enum Output<'a> {
    /// fp16 output.
    F16(&'a mut dyn DevicePtrMut<f16>),
    /// bf16 output.
    Bf16(&'a mut dyn DevicePtrMut<bf16>),
}

/// The device buffers of one group. Borrowed for the call, never copied.
pub struct GroupArgs<'a> {
    /// A (`m × k`, tokens).
    pub a: Nvfp4Operand<'a>,
    /// B (`n × k`, weights).
    pub b: Nvfp4Operand<'a>,
    /// C (`m × n`).
    pub c: Output<'a>,
    /// Multiplier applied to the fp32 accumulator (NVFP4's global scale); 1.0 for none.
    pub alpha: f32,
}

/// One kernel launch of a call: the exported kernel and its geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelLaunch {
    /// The kernel's exported name.
    pub kernel: &'static str,
    /// Grid, block, cluster and dynamic shared memory.
    pub geometry: LaunchGeometry,
}

/// What the planner chose, for display (`info`) and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanSummary {
    /// Kernel architecture.
    pub arch: Arch,
    /// Kernel and tile description, for people.
    pub kernel: String,
    /// Output tiles over all groups (cluster padding included).
    pub tiles: usize,
    /// Every launch a call makes, in order (none when no group has work).
    pub launches: Vec<KernelLaunch>,
    /// Bytes of device workspace the plan owns (the f16 token operand on sm_90a).
    pub workspace_bytes: usize,
}

/// Copies a plan's parameter tables to the device on `stream`: the group table and the tensor
/// maps (both plain data from the abi). Every plan's upload ends with this.
pub(crate) fn upload_tables<G: bytemuck::Pod, M: bytemuck::Pod>(
    stream: &Arc<CudaStream>,
    groups: &[G],
    groups_dst: &mut cudarc::driver::CudaSlice<u8>,
    maps: &[M],
    maps_dst: &mut cudarc::driver::CudaSlice<u8>,
) -> Result<()> {
    let d = |e| crate::error::Error::driver("uploading the call's parameters", e);
    stream.memcpy_htod(bytemuck::cast_slice::<_, u8>(groups), groups_dst).map_err(d)?;
    stream.memcpy_htod(bytemuck::cast_slice::<_, u8>(maps), maps_dst).map_err(d)?;
    Ok(())
}

/// The device half of a plan for one architecture: its tables, uploads and launches. Both
/// architectures have the same shape (`sm90::Sm90Plan`, `sm100::Sm100Plan`): a pure layout
/// (work lists, geometry, parameter encoding) and this device part.
pub(crate) trait ArchPlan {
    /// Whether any launch runs (false when no group has an output tile).
    fn has_work(&self) -> bool;

    /// Encodes the group parameters and tensor maps for `buffers` (validated by the caller) and
    /// copies them to the plan's tables on `stream`.
    fn upload(&mut self, stream: &Arc<CudaStream>, problem: &Problem, buffers: &[GroupBuffers]) -> Result<()>;

    /// Launches every kernel of the plan on `stream`.
    ///
    /// # Safety
    /// `upload` must have run for buffers that are still alive and valid for the problem
    /// (`validate_buffers`), on this stream or one ordered before it.
    unsafe fn launch(&mut self, stream: &CudaStream, problem: &Problem) -> Result<()>;

    /// What runs.
    fn summary(&self) -> PlanSummary;
}

/// A grouped GEMM problem planned for one GPU. Build it once per set of shapes and call
/// [`GemmPlan::run`] as often as needed: a call whose buffer addresses and alphas equal the previous
/// call's makes no copies at all, only the launches (so it can be captured in a CUDA graph); other
/// calls re-encode the tensor maps and upload the parameter tables on the stream first. No call
/// allocates device memory or synchronizes the host.
pub struct GemmPlan {
    problem: Problem,
    plan: Box<dyn ArchPlan>,
    summary: PlanSummary,
    /// Addresses and alphas of the last call, to skip re-encoding.
    signature: Vec<u64>,
}

impl GemmPlan {
    /// Plans `problem` for `gpu`: chooses the kernel configuration, builds the work list, and
    /// allocates the parameter tables and the workspace (once).
    pub fn new(gpu: &Gpu, problem: Problem) -> Result<GemmPlan> {
        let plan: Box<dyn ArchPlan> = match gpu.arch() {
            Arch::Sm90a => Box::new(Sm90Plan::new(gpu, &problem)?),
            // Built and statically checked (ptxas, PTX/SASS contents, host-tested encodings);
            // never run: there is no B200 here.
            Arch::Sm100a => Box::new(Sm100Plan::new(gpu, &problem)?),
        };
        let summary = plan.summary();
        Ok(GemmPlan { problem, plan, summary, signature: vec![] })
    }

    /// The problem this plan was built for.
    pub fn problem(&self) -> &Problem {
        &self.problem
    }

    /// What the planner chose.
    pub fn summary(&self) -> &PlanSummary {
        &self.summary
    }

    /// Runs the grouped GEMM on `stream` with the given buffers (one entry per group, in order).
    /// Every buffer is validated against the problem first; on any error nothing is launched.
    pub fn run<'s>(&mut self, stream_arc: &'s Arc<CudaStream>, groups: &'s mut [GroupArgs<'_>]) -> Result<()> {
        let stream: &CudaStream = stream_arc;
        let mut guards: Vec<SyncOnDrop<'s>> = Vec::with_capacity(5 * groups.len());
        let mut buffers = Vec::with_capacity(groups.len());
        for args in groups.iter_mut() {
            let a_values = view(args.a.values, stream, &mut guards);
            let a_scales = view(args.a.scales, stream, &mut guards);
            let b_values = view(args.b.values, stream, &mut guards);
            let b_scales = view(args.b.scales, stream, &mut guards);
            let (c, c_type) = match &mut args.c {
                Output::F16(c) => (view_mut(&mut **c, stream, &mut guards), OutputType::F16),
                Output::Bf16(c) => (view_mut(&mut **c, stream, &mut guards), OutputType::Bf16),
            };
            buffers.push(GroupBuffers { a_values, a_scales, b_values, b_scales, c, c_type, alpha: args.alpha });
        }
        validate_buffers(&self.problem, &buffers)?;
        let signature: Vec<u64> = buffers
            .iter()
            .flat_map(|b| {
                [b.a_values.ptr, b.a_scales.ptr, b.b_values.ptr, b.b_scales.ptr, b.c.ptr, b.alpha.to_bits() as u64]
            })
            .collect();
        if !self.plan.has_work() {
            return Ok(());
        }
        if signature != self.signature {
            self.plan.upload(stream_arc, &self.problem, &buffers)?;
            self.signature = signature;
        }
        // SAFETY: the tables hold these validated buffers (uploaded now, or by an earlier call with
        // the same addresses and alphas) on this stream.
        unsafe { self.plan.launch(stream, &self.problem) }
    }
}
