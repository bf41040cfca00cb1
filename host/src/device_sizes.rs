//! The plan core for device-resident group sizes (`crate::moe`), shared by both architectures:
//! the tables a plan owns (group table, tensor maps, work list, work-length words, status word,
//! and the sm_90a scratch and token workspace), their upload, the launches (the scheduler, then
//! what the architecture runs after it), the status word and the summary. Each architecture
//! contributes a [`DeviceSizedLayout`] (no driver calls): its bounds, table sizes, table contents,
//! parameters and launches (`sm90::Sm90DeviceLayout`, `sm100::Sm100DeviceLayout`).

use crate::device::{Arch, Gpu};
use crate::driver::launch::{launch_with, set_max_dynamic_smem, LaunchGeometry, Start};
use crate::driver::module::Kernel;
use crate::driver::tensor_map::{DriverEncoder, TiledMapEncoder};
use crate::error::{Error, Result};
use crate::moe_problem::{MoeBuffers, MoeProblem};
use crate::problem::OutputType;
use crate::summary::{KernelLaunch, PlanSummary};
use crate::tables::upload_tables;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};
use nvfp4_gemm_abi::moe::schedule::{smem, ScheduleCommon, SCHEDULE_THREADS};
use nvfp4_gemm_abi::tensor_map::TensorMap;
use nvfp4_gemm_abi::work::{KernelParams, WorkItem};
use std::sync::Arc;

/// Which sm_90a GEMM kernels a device-sized plan launches (sm_100a runs one list whatever this
/// says). The kernels are fixed when the plan is made (a captured graph replays them); which one
/// does the work is decided on the device, per call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MoeKernels {
    /// The decode kernel and the general one; a call runs the decode kernel when no group has
    /// more than 16 tokens (the rule of host-sized plans), else the general one, and the other
    /// launch finds no work and exits. The default.
    #[default]
    Auto,
    /// Only the decode kernel (16-token tiles, two CTAs per SM): a hint that calls will have at
    /// most 16 tokens per group, like a serving engine's decode steps. Larger groups are still
    /// computed, as several 16-token tiles (slower than the general kernel for them).
    Decode,
    /// Only the general kernel (tiles of up to 128 tokens).
    General,
}

/// Options of a device-sized plan ([`crate::moe::MoePlan::with_options`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MoeOptions {
    /// sm_90a: which GEMM kernels the plan launches.
    pub kernels: MoeKernels,
    /// sm_90a: the general kernel runs a group's last token tile 64 wide when its rows fit 64
    /// (`sm90_grouped_gemm_t64`: every other tile 128 wide), instead of 16-token tiles for
    /// groups of at most 16 tokens and 128-token tiles for the others (`sm90_grouped_gemm`).
    pub tail64: bool,
}

/// Device addresses of a device-sized plan's tables, for the parameter structs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceSizedTables {
    /// The architecture's `GroupParams[G]`.
    pub groups: u64,
    /// The tensor maps.
    pub maps: u64,
    /// The `WorkItem` list.
    pub work: u64,
    /// The `u32` work length of each GEMM launch (sm_90a: `[decode, general]`; sm_100a: the
    /// first).
    pub work_len: [u64; 2],
    /// The `u32` status word.
    pub status: u64,
    /// sm_90a: the scheduler's `u32` scratch (the LPT order's list indices).
    pub ranks: u64,
    /// sm_90a: the f16 token workspace.
    pub workspace: u64,
}

/// How large a layout's tables are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableSizes {
    /// Entries of the group table.
    pub groups: usize,
    /// Tensor maps.
    pub maps: usize,
    /// Items of the work list (its capacity).
    pub work_items: usize,
    /// `u32` words of the scheduler's scratch.
    pub ranks: usize,
    /// Bytes of the f16 token workspace.
    pub workspace_bytes: usize,
}

/// One launch after the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceSizedLaunch {
    /// The kernel's exported name.
    pub kernel: &'static str,
    /// Its geometry.
    pub geometry: LaunchGeometry,
    /// How it starts relative to the launch before it.
    pub start: Start,
    /// Its parameters.
    pub params: KernelParams,
}

/// An architecture's part of a device-sized plan: everything that does not need the driver.
/// Public (through `crate::layout`) so that the device model runs the kernels on exactly these
/// tables.
pub trait DeviceSizedLayout {
    /// The architecture's group-table entry.
    type Group: bytemuck::Pod;
    /// The scheduler's parameters.
    type Schedule: bytemuck::Pod;
    /// The scheduler's exported name.
    const SCHEDULE: &'static str;
    /// How the scheduler's launch starts (it executes `griddepcontrol.wait` before it reads
    /// anything, so either is allowed).
    const SCHEDULE_START: Start;
    /// The architecture.
    const ARCH: Arch;

    /// The sizes of the plan's tables.
    fn table_sizes(&self) -> TableSizes;

    /// The group table's size-independent fields and the tensor maps for these buffers and
    /// tables, the maps encoded by `encoder`.
    fn encode_with<E: TiledMapEncoder>(
        &self,
        encoder: &E,
        problem: &MoeProblem,
        buffers: &MoeBuffers,
        tables: &DeviceSizedTables,
    ) -> Result<(Vec<Self::Group>, Vec<TensorMap>)>;

    /// The scheduler's parameters.
    fn schedule_params(&self, problem: &MoeProblem, buffers: &MoeBuffers, tables: &DeviceSizedTables)
        -> Self::Schedule;

    /// Every launch after the scheduler, in order.
    fn launches(&self, tables: &DeviceSizedTables, output: OutputType) -> Vec<DeviceSizedLaunch>;

    /// The kernels in words, and the largest number of output tiles a call computes.
    fn describe(&self) -> (String, usize);

    /// The scheduler's launch for `groups` groups: one CTA, its shared memory for them.
    fn schedule_geometry(groups: u32) -> LaunchGeometry {
        LaunchGeometry { grid: 1, block: SCHEDULE_THREADS, cluster: 1, smem_bytes: smem::bytes(groups) }
    }
}

/// The scheduler parameters both architectures share, for these buffers and tables.
pub fn schedule_common(problem: &MoeProblem, buffers: &MoeBuffers, tables: &DeviceSizedTables) -> ScheduleCommon {
    ScheduleCommon {
        sizes: problem.device_sizes(buffers.sizes.ptr),
        groups: tables.groups,
        work: tables.work,
        status: tables.status,
        a_scales: buffers.a.scales(),
        c: buffers.c.ptr,
        k: problem.k() as u32,
        n: problem.n() as u32,
    }
}

/// The parameters of a launch after the scheduler over `tables` (every architecture's GEMM, and
/// the sm_90a dequantization, take [`KernelParams`]): the list holds at most `capacity` items, the
/// scheduler writes its length at `work_len`.
pub fn kernel_params(
    tables: &DeviceSizedTables,
    capacity: u32,
    work_len: u64,
    groups: u32,
    output: OutputType,
) -> KernelParams {
    KernelParams {
        groups: tables.groups,
        tensor_maps: tables.maps,
        work: tables.work,
        work_len: capacity,
        group_count: groups,
        out_bf16: (output == OutputType::Bf16) as u32,
        reserved: 0,
        work_len_device: work_len,
    }
}

/// A device-sized plan on a device: the layout, the functions, and the tables, allocated once.
pub(crate) struct DeviceSizedPlan<L: DeviceSizedLayout> {
    /// What runs.
    pub layout: L,
    groups: u32,
    schedule: Kernel,
    functions: Vec<(&'static str, Kernel)>,
    group_table: CudaSlice<u8>,
    maps: CudaSlice<u8>,
    work: CudaSlice<u8>,
    work_len: CudaSlice<u32>,
    status: CudaSlice<u32>,
    ranks: CudaSlice<u32>,
    workspace: CudaSlice<u8>,
}

impl<L: DeviceSizedLayout> DeviceSizedPlan<L> {
    /// Loads the functions of `layout`'s launches and allocates its tables (zeroed).
    pub fn new(gpu: &Gpu, problem: &MoeProblem, layout: L) -> Result<Self> {
        let stream = gpu.context().default_stream();
        let d = |e| Error::driver("allocating the plan's device tables", e);
        let sizes = layout.table_sizes();
        let schedule = gpu.function(L::SCHEDULE)?;
        let groups = problem.groups() as u32;
        set_max_dynamic_smem(&schedule, L::schedule_geometry(groups).smem_bytes)?;
        let mut functions: Vec<(&'static str, Kernel)> = vec![];
        for l in layout.launches(&DeviceSizedTables::default(), problem.output()) {
            if !functions.iter().any(|(name, _)| *name == l.kernel) {
                let f = gpu.function(l.kernel)?;
                set_max_dynamic_smem(&f, l.geometry.smem_bytes)?;
                functions.push((l.kernel, f));
            }
        }
        let plan = DeviceSizedPlan {
            groups,
            schedule,
            functions,
            group_table: stream.alloc_zeros::<u8>(sizes.groups * size_of::<L::Group>()).map_err(d)?,
            maps: stream.alloc_zeros::<u8>(sizes.maps.max(1) * size_of::<TensorMap>()).map_err(d)?,
            work: stream.alloc_zeros::<u8>(sizes.work_items.max(1) * size_of::<WorkItem>()).map_err(d)?,
            work_len: stream.alloc_zeros::<u32>(2).map_err(d)?,
            status: stream.alloc_zeros::<u32>(1).map_err(d)?,
            ranks: stream.alloc_zeros::<u32>(sizes.ranks.max(1)).map_err(d)?,
            workspace: stream.alloc_zeros::<u8>(sizes.workspace_bytes.max(16)).map_err(d)?,
            layout,
        };
        // The allocations above are on the default stream; a caller's stream must see them done.
        stream.synchronize().map_err(d)?;
        Ok(plan)
    }

    /// The tables' addresses for work on `stream`.
    fn tables(&mut self, stream: &CudaStream) -> DeviceSizedTables {
        let work_len = self.work_len.device_ptr_mut(stream).0;
        DeviceSizedTables {
            groups: self.group_table.device_ptr_mut(stream).0,
            maps: self.maps.device_ptr_mut(stream).0,
            work: self.work.device_ptr_mut(stream).0,
            work_len: [work_len, work_len + 4],
            status: self.status.device_ptr_mut(stream).0,
            ranks: self.ranks.device_ptr_mut(stream).0,
            workspace: self.workspace.device_ptr_mut(stream).0,
        }
    }

    /// Encodes the tensor maps and uploads them and the group table's size-independent fields on
    /// `stream`.
    pub fn upload(&mut self, stream: &Arc<CudaStream>, problem: &MoeProblem, buffers: &MoeBuffers) -> Result<()> {
        let tables = self.tables(stream);
        let (params, maps) = self.layout.encode_with(&DriverEncoder, problem, buffers, &tables)?;
        upload_tables(stream, &params, &mut self.group_table, &maps, &mut self.maps)
    }

    /// Launches the scheduler and what follows it on `stream`.
    ///
    /// # Safety
    /// `upload` must have run for weights (and on sm_100a an A) that are still alive; `buffers`
    /// must be valid for the problem (`validate_moe_buffers`) until the kernels complete.
    pub unsafe fn launch(&mut self, stream: &CudaStream, problem: &MoeProblem, buffers: &MoeBuffers) -> Result<()> {
        let tables = self.tables(stream);
        let schedule = self.layout.schedule_params(problem, buffers, &tables);
        let launches = self.layout.launches(&tables, problem.output());
        // SAFETY: each kernel takes its one parameter struct by value; every address in them (and
        // in the tables they point to) was validated by the caller or is owned by this plan; each
        // kernel launched early waits (`griddepcontrol.wait`) before it reads what the launch
        // before it writes.
        unsafe {
            launch_with(&self.schedule, stream, L::schedule_geometry(self.groups), L::SCHEDULE_START, &schedule)?;
            for l in &launches {
                let (_, f) = self.functions.iter().find(|(name, _)| *name == l.kernel).expect("loaded by new");
                launch_with(f, stream, l.geometry, l.start, &l.params)?;
            }
        }
        Ok(())
    }

    /// The status word.
    pub fn status(&self) -> &CudaSlice<u32> {
        &self.status
    }

    /// Zeroes the status word on `stream`.
    pub fn clear_status(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        stream.memset_zeros(&mut self.status).map_err(|e| Error::driver("clearing the plan's status word", e))
    }

    /// What the plan runs.
    pub fn summary(&self, output: OutputType) -> PlanSummary {
        let (kernel, tiles) = self.layout.describe();
        let mut launches = vec![KernelLaunch { kernel: L::SCHEDULE, geometry: L::schedule_geometry(self.groups) }];
        launches.extend(
            self.layout
                .launches(&DeviceSizedTables::default(), output)
                .iter()
                .map(|l| KernelLaunch { kernel: l.kernel, geometry: l.geometry }),
        );
        PlanSummary {
            arch: L::ARCH,
            kernel: format!("{} (device sizes → work list) + {kernel}", L::SCHEDULE),
            tiles,
            launches,
            workspace_bytes: self.layout.table_sizes().workspace_bytes,
        }
    }
}
