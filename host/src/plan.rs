//! The reusable plan: a problem bound to a device, with its configuration, work list, parameter
//! tables and workspace; and the launch.

use crate::device::{Arch, Gpu};
use crate::driver::launch::{launch, set_max_dynamic_smem, LaunchGeometry};
use crate::error::{Error, Result};
use crate::problem::{validate_buffers, BufferView, GroupBuffers, OutputType, Problem};
use crate::sm100::Sm100Plan;
use crate::sm90::Sm90Layout;
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use half::{bf16, f16};
use nvfp4_gemm_abi::sm90::KernelParams;
use std::ffi::c_void;
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

/// What the planner chose, for display (`info`) and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanSummary {
    /// Kernel architecture.
    pub arch: Arch,
    /// Kernel and tile description.
    pub kernel: String,
    /// Output tiles over all groups.
    pub tiles: usize,
    /// GEMM launch geometry.
    pub gemm: LaunchGeometry,
    /// Bytes of device workspace the plan owns (the f16 token operand on sm_90a).
    pub workspace_bytes: usize,
}

enum ArchPlan {
    Sm100(Sm100Plan),
    Sm90 {
        layout: Sm90Layout,
        dequant: CudaFunction,
        gemm: CudaFunction,
        workspace: CudaSlice<u8>,
        groups: CudaSlice<u8>,
        maps: CudaSlice<u8>,
        tiles: CudaSlice<u8>,
    },
}

/// A grouped GEMM problem planned for one GPU. Build it once per set of shapes and call
/// [`GemmPlan::run`] as often as needed: a call whose buffer addresses and alphas equal the previous
/// call's makes no copies at all, only the launches (so it can be captured in a CUDA graph); other
/// calls re-encode the tensor maps and upload the parameter tables on the stream first. No call
/// allocates device memory or synchronizes the host.
pub struct GemmPlan {
    problem: Problem,
    plan: ArchPlan,
    summary: PlanSummary,
    /// Addresses and alphas of the last call, to skip re-encoding.
    signature: Vec<u64>,
}

/// Address and length of a buffer read by the call; the guard records the read on drop.
fn view<'s>(p: &'s dyn DevicePtr<u8>, stream: &'s CudaStream, guards: &mut Vec<SyncOnDrop<'s>>) -> BufferView {
    let len = p.len();
    let (ptr, guard) = p.device_ptr(stream);
    guards.push(guard);
    BufferView { ptr, len }
}

/// Address and length of a buffer written by the call; the guard records the write on drop.
fn view_mut<'s, T>(
    p: &'s mut dyn DevicePtrMut<T>,
    stream: &'s CudaStream,
    guards: &mut Vec<SyncOnDrop<'s>>,
) -> BufferView {
    let len = p.len();
    let (ptr, guard) = p.device_ptr_mut(stream);
    guards.push(guard);
    BufferView { ptr, len }
}

fn bytes_of<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: only used with `#[repr(C)]` plain-data types from the abi crate (no padding reads
    // matter: the kernels never read padding).
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

impl GemmPlan {
    /// Plans `problem` for `gpu`: chooses the kernel configuration, builds the work list, and
    /// allocates the parameter tables and the workspace (once).
    pub fn new(gpu: &Gpu, problem: Problem) -> Result<GemmPlan> {
        let stream = gpu.context().default_stream();
        let d = |e| Error::driver("allocating the plan's device tables", e);
        match gpu.arch() {
            Arch::Sm90a => {
                let layout = Sm90Layout::new(&problem, gpu.sm_count());
                let g = problem.groups().len().max(1);
                let dequant = gpu.function("sm90_dequant_tokens")?;
                let gemm = gpu.function("sm90_grouped_gemm")?;
                set_max_dynamic_smem(&gemm, layout.gemm.smem_bytes)?;
                let tiles = if layout.tiles.is_empty() {
                    stream.alloc_zeros::<u8>(16).map_err(d)?
                } else {
                    stream.clone_htod(bytes_of(&layout.tiles)).map_err(d)?
                };
                let summary = PlanSummary {
                    arch: Arch::Sm90a,
                    kernel: format!(
                        "sm90_grouped_gemm: swap-AB wgmma m64n{}k16, tile {}x{} (tokens x weights), {} stages of K {}",
                        layout.config.block_m,
                        layout.config.block_m,
                        nvfp4_gemm_abi::sm90::BLOCK_N,
                        layout.config.stages,
                        nvfp4_gemm_abi::sm90::BLOCK_K
                    ),
                    tiles: layout.tiles.len(),
                    gemm: layout.gemm,
                    workspace_bytes: layout.workspace_bytes,
                };
                let plan = ArchPlan::Sm90 {
                    workspace: stream.alloc_zeros::<u8>(layout.workspace_bytes).map_err(d)?,
                    groups: stream
                        .alloc_zeros::<u8>(g * std::mem::size_of::<nvfp4_gemm_abi::sm90::GroupParams>())
                        .map_err(d)?,
                    maps: stream.alloc_zeros::<u8>(2 * g * 128).map_err(d)?,
                    tiles,
                    layout,
                    dequant,
                    gemm,
                };
                Ok(GemmPlan { problem, plan, summary, signature: vec![] })
            }
            Arch::Sm100a => {
                // Built and statically checked (ptxas, PTX/SASS contents, host-tested encodings);
                // never run: there is no B200 here.
                let sm100 = Sm100Plan::new(gpu, &problem)?;
                let summary = PlanSummary {
                    arch: Arch::Sm100a,
                    kernel: sm100.describe(),
                    tiles: sm100.layout.tiles(),
                    // The first launch's geometry (the 128-wide list if any, else the cluster list).
                    gemm: sm100
                        .layout
                        .launches
                        .first()
                        .map_or(LaunchGeometry { grid: 0, block: 256, cluster: 1, smem_bytes: 0 }, |l| l.geometry),
                    workspace_bytes: 0,
                };
                Ok(GemmPlan { problem, plan: ArchPlan::Sm100(sm100), summary, signature: vec![] })
            }
        }
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
        let d = |e| Error::driver("uploading the call's parameters", e);
        match &mut self.plan {
            ArchPlan::Sm100(sm100) => {
                if sm100.layout.launches.is_empty() {
                    return Ok(());
                }
                if signature != self.signature {
                    sm100.upload(stream_arc, &self.problem, &buffers)?;
                    self.signature = signature;
                }
                // SAFETY: the tables hold these validated buffers (uploaded now, or by an earlier
                // call with the same addresses and alphas) on this stream.
                unsafe { sm100.launch(stream, &self.problem) }
            }
            ArchPlan::Sm90 { layout, dequant, gemm, workspace, groups: g_dev, maps, tiles } => {
                if layout.tiles.is_empty() {
                    return Ok(());
                }
                let (ws_ptr, _ws_guard) = workspace.device_ptr_mut(stream);
                if signature != self.signature {
                    let (params, encoded) = layout.encode(&self.problem, &buffers, ws_ptr)?;
                    stream_arc.memcpy_htod(bytes_of(&params), g_dev).map_err(d)?;
                    stream_arc.memcpy_htod(bytes_of(&encoded), maps).map_err(d)?;
                    self.signature = signature;
                }
                let (groups_ptr, _g1) = g_dev.device_ptr(stream);
                let (maps_ptr, _g2) = maps.device_ptr(stream);
                let (tiles_ptr, _g3) = tiles.device_ptr(stream);
                let mut kp = KernelParams {
                    groups: groups_ptr,
                    tensor_maps: maps_ptr,
                    tiles: tiles_ptr,
                    group_count: self.problem.groups().len() as u32,
                    tile_count: layout.tiles.len() as u32,
                    out_bf16: (self.problem.output() == OutputType::Bf16) as u32,
                    reserved: 0,
                };
                let mut params = [&mut kp as *mut KernelParams as *mut c_void];
                // SAFETY: both kernels take one `KernelParams` by value; every pointer in it and in
                // the tables it points to was validated above or is owned by this plan.
                unsafe {
                    if layout.dequant_grid > 0 {
                        launch(dequant, stream, layout.dequant, &mut params)?;
                    }
                    launch(gemm, stream, layout.gemm, &mut params)?;
                }
                Ok(())
            }
        }
    }
}
