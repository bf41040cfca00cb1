//! The sm_90a plan for device-resident group sizes (`crate::moe`): a layout for the problem's
//! bounds ([`Sm90DeviceLayout`], no driver calls) and its device half ([`Sm90DevicePlan`]).
//!
//! Three launches per call, all with parameters fixed by the plan and the call's buffers:
//! 1. `sm90_schedule` (one CTA) reads the sizes and writes the size-dependent fields of the group
//!    table, the work list, the work length and the status bits;
//! 2. `sm90_dequant_tokens` over the bound's grid (CTAs beyond the scheduled ones return);
//! 3. `sm90_grouped_gemm` over a persistent grid sized for the work list's capacity, walking the
//!    length the scheduler wrote (`KernelParams::work_len_device`).
//!
//! Tensor maps: `[2g + 1]` group `g`'s weights (as in host-sized plans; `[2g]` unused), and two
//! maps over the whole f16 workspace `[token_rows, K]`, with 16-row boxes at `[2G]` and 128-row
//! boxes at `[2G + 1]`. A group's token tiles start at its first row in those maps
//! (`GroupParams::token_row`); rows of a tile past the group's end belong to other groups or to
//! nothing, and only reach C columns the epilogue masks.

use crate::device::{Arch, Gpu};
use crate::driver::launch::{launch, launch_with, set_max_dynamic_smem};
use crate::driver::module::Kernel;
use crate::driver::tensor_map::{DriverEncoder, TiledMapEncoder};
use crate::error::{Error, Result};
use crate::moe_problem::{MoeBuffers, MoeProblem};
use crate::problem::OutputType;
use crate::summary::{KernelLaunch, PlanSummary};
use crate::tables::ScheduledTables;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};
use nvfp4_gemm_abi::launch::LaunchGeometry;
use nvfp4_gemm_abi::moe::{self as abi, schedule_smem, DeviceSizes, ScheduleParams, SCHEDULE_THREADS};
use nvfp4_gemm_abi::sm90::{self, GemmConfig, GroupParams, KernelParams, WorkItem};
use nvfp4_gemm_abi::tensor_map::TensorMap;
use std::sync::Arc;

const SCHEDULE: &str = "sm90_schedule";
const DEQUANT: &str = "sm90_dequant_tokens";

/// Everything about a device-sized problem that does not depend on buffer addresses.
#[derive(Debug, Clone, PartialEq)]
pub struct Sm90DeviceLayout {
    /// The GEMM variant (the decode one when no group can exceed 16 tokens).
    pub config: GemmConfig,
    /// The sizes' layout (address 0).
    pub sizes: DeviceSizes,
    /// Capacity of the work list: the most tiles any sizes within the bounds give.
    pub max_work: u32,
    /// Most dequantization CTAs any sizes within the bounds give.
    pub max_dequant_ctas: u32,
    /// Bytes of the f16 token workspace (`token_rows × K` f16).
    pub workspace_bytes: usize,
    /// `sm90_schedule`'s launch.
    pub schedule: LaunchGeometry,
    /// `sm90_dequant_tokens`' launch (sized for the bounds).
    pub dequant: LaunchGeometry,
    /// The GEMM's launch (a persistent grid for the work list's capacity).
    pub gemm: LaunchGeometry,
}

impl Sm90DeviceLayout {
    /// The layout of `problem`'s bounds on a device with `sm_count` SMs.
    pub fn new(problem: &MoeProblem, sm_count: u32) -> Sm90DeviceLayout {
        let sizes = problem.device_sizes(0);
        // The most rows any group can have within the bounds (`M_max`, or all `T` tokens): when
        // that fits a 16-token tile the decode variant serves every routing.
        let config = sm90::config_for(std::iter::once(sizes.rows));
        let (g, k) = (sizes.groups as u64, problem.k() as u32);
        let max_work = (abi::max_m_tiles(&sizes) * sm90::n_tiles(problem.n() as u32) as u64) as u32;
        let max_dequant_ctas = if sizes.layout == abi::LAYOUT_MASKED {
            g * sm90::dequant_ctas(sizes.rows, k) as u64
        } else {
            // Each non-empty group of m rows takes min(⌈m·c/I⌉, MAX) CTAs (c = k/64 chunks,
            // I = DEQUANT_ITEMS_PER_CTA): at most 1 + ⌊(m·c − 1)/I⌋, so over at most min(G, T)
            // non-empty groups the sum is at most n + ⌊(T·c − n)/I⌋ with n = min(G, T), and at
            // most MAX·n (MAX = MAX_DEQUANT_CTAS_PER_GROUP).
            let t = sizes.rows as u64;
            let n = g.min(t);
            let items = t * (k / sm90::CHUNK_K) as u64;
            (n + (items - n) / sm90::DEQUANT_ITEMS_PER_CTA as u64).min(sm90::MAX_DEQUANT_CTAS_PER_GROUP as u64 * n)
        } as u32;
        Sm90DeviceLayout {
            config,
            sizes,
            max_work,
            max_dequant_ctas,
            workspace_bytes: (problem.token_rows() * problem.k() * 2).max(16),
            schedule: LaunchGeometry {
                grid: 1,
                block: SCHEDULE_THREADS,
                cluster: 1,
                smem_bytes: schedule_smem::bytes(sizes.groups),
            },
            dequant: sm90::dequant_launch(max_dequant_ctas),
            gemm: sm90::gemm_launch(config, max_work, sm_count),
        }
    }

    /// Tensor-map index of the workspace map with 16-row boxes (the 128-row one follows).
    pub fn token_map_small(&self) -> u32 {
        2 * self.sizes.groups
    }

    /// Maps in the table.
    pub fn map_count(&self) -> usize {
        2 * self.sizes.groups as usize + 2
    }

    /// The group table as the host writes it: the size-independent fields (the scheduler writes
    /// the rest on every call).
    pub fn group_params(&self, problem: &MoeProblem, buffers: &MoeBuffers) -> Vec<GroupParams> {
        buffers
            .weights
            .iter()
            .zip(&buffers.alphas)
            .map(|((_, scales), &alpha)| GroupParams {
                n: problem.n() as u32,
                k: problem.k() as u32,
                alpha,
                b_scales: scales.ptr,
                token_map: self.token_map_small() + 1,
                ..GroupParams::default()
            })
            .collect()
    }

    /// The group table's size-independent fields and the tensor maps (the weights', and the two
    /// over the workspace at `workspace`), encoded by `encoder`.
    pub fn encode_with(
        &self,
        encoder: &impl TiledMapEncoder,
        problem: &MoeProblem,
        buffers: &MoeBuffers,
        workspace: u64,
    ) -> Result<(Vec<GroupParams>, Vec<TensorMap>)> {
        let params = self.group_params(problem, buffers);
        let (rows, n, k) = (problem.token_rows() as u32, problem.n() as u32, problem.k() as u32);
        let mut maps = vec![TensorMap::ZERO; self.map_count()];
        for (g, (values, _)) in buffers.weights.iter().enumerate() {
            maps[sm90::weight_map_index(g as u32)] = encoder.encode(&sm90::weight_map(n, k), values.ptr)?;
        }
        let small = self.token_map_small() as usize;
        for (i, block_m) in [(small, sm90::SMALL_TILE_M), (small + 1, self.config.block_m)] {
            maps[i] = encoder.encode(&sm90::token_map_with_box(rows, k, block_m), workspace)?;
        }
        Ok((params, maps))
    }

    /// The scheduler's parameters for these buffers and the plan's tables.
    pub fn schedule_params(
        &self,
        problem: &MoeProblem,
        buffers: &MoeBuffers,
        tables: &Sm90DeviceTables,
    ) -> ScheduleParams {
        ScheduleParams {
            sizes: DeviceSizes { sizes: buffers.sizes.ptr, ..self.sizes },
            groups: tables.groups,
            work: tables.work,
            work_len: tables.work_len,
            status: tables.status,
            a_values: buffers.a_values.ptr,
            a_scales: buffers.a_scales.ptr,
            c: buffers.c.ptr,
            workspace: tables.workspace,
            max_work: self.max_work,
            k: problem.k() as u32,
            n: problem.n() as u32,
            token_map_small: self.token_map_small(),
            token_map_large: self.token_map_small() + 1,
            block_n: 0,
        }
    }

    /// The dequantization's and the GEMM's parameters.
    pub fn kernel_params(&self, tables: &Sm90DeviceTables, output: OutputType) -> KernelParams {
        KernelParams {
            groups: tables.groups,
            tensor_maps: tables.maps,
            work: tables.work,
            work_len: self.max_work,
            group_count: self.sizes.groups,
            out_bf16: (output == OutputType::Bf16) as u32,
            reserved: 0,
            work_len_device: tables.work_len,
        }
    }
}

/// Device addresses of a device-sized sm_90a plan's tables, for the parameter structs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sm90DeviceTables {
    /// `GroupParams[G]`.
    pub groups: u64,
    /// `TensorMap[2G + 2]`.
    pub maps: u64,
    /// `WorkItem[max_work]`.
    pub work: u64,
    /// The `u32` work length.
    pub work_len: u64,
    /// The `u32` status word.
    pub status: u64,
    /// The f16 token workspace.
    pub workspace: u64,
}

/// A device-sized sm_90a plan on a device: the layout, the three functions, the tables, the
/// work-length and status words and the f16 token workspace, allocated once.
pub(crate) struct Sm90DevicePlan {
    pub layout: Sm90DeviceLayout,
    schedule: Kernel,
    dequant: Kernel,
    gemm: Kernel,
    workspace: CudaSlice<u8>,
    tables: ScheduledTables,
}

impl Sm90DevicePlan {
    pub fn new(gpu: &Gpu, problem: &MoeProblem) -> Result<Sm90DevicePlan> {
        let layout = Sm90DeviceLayout::new(problem, gpu.sm_count());
        let stream = gpu.context().default_stream();
        let d = |e| Error::driver("allocating the plan's device tables", e);
        let schedule = gpu.function(SCHEDULE)?;
        let dequant = gpu.function(DEQUANT)?;
        let gemm = gpu.function(layout.config.kernel_name())?;
        set_max_dynamic_smem(&gemm, layout.gemm.smem_bytes)?;
        let g = layout.sizes.groups as usize;
        let tables = ScheduledTables::new(
            &stream,
            g * size_of::<GroupParams>(),
            layout.map_count() * size_of::<TensorMap>(),
            (layout.max_work as usize).max(1) * size_of::<WorkItem>(),
        )?;
        let plan = Sm90DevicePlan {
            workspace: stream.alloc_zeros::<u8>(layout.workspace_bytes).map_err(d)?,
            tables,
            layout,
            schedule,
            dequant,
            gemm,
        };
        // The allocations above are on the default stream; a caller's stream must see them done.
        stream.synchronize().map_err(d)?;
        Ok(plan)
    }

    fn tables(&mut self, stream: &CudaStream) -> Sm90DeviceTables {
        let a = self.tables.addresses(stream);
        Sm90DeviceTables {
            groups: a.groups,
            maps: a.maps,
            work: a.work,
            work_len: a.work_len,
            status: a.status,
            workspace: self.workspace.device_ptr_mut(stream).0,
        }
    }

    /// Encodes the weights' maps and the workspace maps, and uploads them and the group table's
    /// size-independent fields on `stream`.
    pub fn upload(&mut self, stream: &Arc<CudaStream>, problem: &MoeProblem, buffers: &MoeBuffers) -> Result<()> {
        let tables = self.tables(stream);
        let (params, maps) = self.layout.encode_with(&DriverEncoder, problem, buffers, tables.workspace)?;
        self.tables.upload(stream, &params, &maps)
    }

    /// Launches the scheduler, the token dequantization and the GEMM on `stream`.
    ///
    /// # Safety
    /// `upload` must have run for weights that are still alive; `buffers` must be valid for the
    /// problem (`validate_moe_buffers`) until the kernels complete.
    pub unsafe fn launch(&mut self, stream: &CudaStream, problem: &MoeProblem, buffers: &MoeBuffers) -> Result<()> {
        let tables = self.tables(stream);
        let l = &self.layout;
        let schedule = l.schedule_params(problem, buffers, &tables);
        let params = l.kernel_params(&tables, problem.output());
        // SAFETY: each kernel takes its one parameter struct by value; every address in them (and
        // in the tables they point to) was validated by the caller or is owned by this plan.
        unsafe {
            launch(&self.schedule, stream, l.schedule, &schedule)?;
            launch(&self.dequant, stream, l.dequant, &params)?;
            // The GEMM may start while the dequantization runs (it waits before its first token
            // load); the scheduler's tables it reads at its start were complete before the
            // dequantization began.
            launch_with(&self.gemm, stream, l.gemm, super::GEMM_AFTER_DEQUANT, &params)
        }
    }

    pub fn status(&self) -> &CudaSlice<u32> {
        self.tables.status()
    }

    pub fn clear_status(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        self.tables.clear_status(stream)
    }

    pub fn summary(&self) -> PlanSummary {
        let l = &self.layout;
        PlanSummary {
            arch: Arch::Sm90a,
            kernel: format!(
                "{SCHEDULE} (device sizes → work list) + {}: swap-AB wgmma m64nNk16, tile Nx{} (N = {}), {} stages of K {}",
                l.config.kernel_name(),
                sm90::BLOCK_N,
                super::widths(l.config),
                l.config.stages,
                l.config.block_k()
            ),
            tiles: l.max_work as usize,
            launches: vec![
                KernelLaunch { kernel: SCHEDULE, geometry: l.schedule },
                KernelLaunch { kernel: DEQUANT, geometry: l.dequant },
                KernelLaunch { kernel: l.config.kernel_name(), geometry: l.gemm },
            ],
            workspace_bytes: l.workspace_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moe::{MoeProblem, TokenLayout};
    use crate::problem::BufferView;

    /// The dequantization bound holds for every split of the tokens (exhaustive on small cases).
    #[test]
    fn dequant_bound_is_an_upper_bound() {
        for (groups, t, k) in [(3usize, 700usize, 64usize), (5, 300, 4096), (2, 40, 8192)] {
            let p =
                MoeProblem::new(groups, 128, k, TokenLayout::Contiguous { max_tokens: t }, OutputType::F16).unwrap();
            let l = Sm90DeviceLayout::new(&p, 132);
            let mut best = 0;
            // Splits of t into `groups` parts on a coarse grid plus the extremes.
            let steps: Vec<usize> = (0..=t).step_by(7).chain([1, 16, 17, t - 1, t]).collect();
            let mut stack = vec![(0usize, 0usize, 0u32)];
            while let Some((g, used, sum)) = stack.pop() {
                if g == groups {
                    best = best.max(sum);
                    continue;
                }
                for &m in &steps {
                    if used + m <= t {
                        stack.push((g + 1, used + m, sum + sm90::dequant_ctas(m as u32, k as u32)));
                    }
                }
            }
            assert!(best <= l.max_dequant_ctas, "{groups} {t} {k}: {best} > {}", l.max_dequant_ctas);
            assert!(
                best * 10 >= l.max_dequant_ctas * 9,
                "{groups} {t} {k}: the bound {} is loose ({best})",
                l.max_dequant_ctas
            );
        }
        let m = MoeProblem::new(4, 128, 7168, TokenLayout::Masked { max_rows: 8 }, OutputType::F16).unwrap();
        assert_eq!(Sm90DeviceLayout::new(&m, 132).max_dequant_ctas, 4 * sm90::dequant_ctas(8, 7168));
    }

    /// Bounds under which no group can exceed 16 tokens run the decode variant.
    #[test]
    fn variant_follows_the_bounds() {
        let plan =
            |layout| Sm90DeviceLayout::new(&MoeProblem::new(64, 256, 512, layout, OutputType::F16).unwrap(), 132);
        let masked16 = plan(TokenLayout::Masked { max_rows: 16 });
        assert_eq!(masked16.config, GemmConfig::DECODE);
        assert_eq!(masked16.gemm, sm90::gemm_launch(GemmConfig::DECODE, masked16.max_work, 132));
        assert_eq!(plan(TokenLayout::Masked { max_rows: 17 }).config, GemmConfig::GENERAL);
        assert_eq!(plan(TokenLayout::Contiguous { max_tokens: 16 }).config, GemmConfig::DECODE);
        assert_eq!(plan(TokenLayout::Contiguous { max_tokens: 553 }).config, GemmConfig::GENERAL);
    }

    #[test]
    fn layout_and_parameters() {
        let p = MoeProblem::new(4, 256, 512, TokenLayout::Contiguous { max_tokens: 300 }, OutputType::Bf16).unwrap();
        let l = Sm90DeviceLayout::new(&p, 132);
        // min(4, 300) + (300 − 4)/128 = 6 token tiles × 2 weight tiles.
        assert_eq!(l.max_work, 12);
        assert_eq!(l.gemm, sm90::gemm_launch(GemmConfig::GENERAL, 12, 132));
        assert_eq!(l.schedule, LaunchGeometry { grid: 1, block: 256, cluster: 1, smem_bytes: schedule_smem::bytes(4) });
        assert_eq!(l.workspace_bytes, 300 * 512 * 2);
        assert_eq!((l.token_map_small(), l.map_count()), (8, 10));
        let a = p.a_sizes();
        let v = |ptr: u64, len| BufferView { ptr, len };
        let buffers = MoeBuffers {
            sizes: v(0x100, 5),
            a_values: v(0x1000, a.values),
            a_scales: v(0x2000, a.scales),
            weights: (0..4).map(|g| (v(0x10_0000 * (g + 1), 0), v(0x10_0000 * (g + 1) + 0x8000, 0))).collect(),
            alphas: vec![0.5, 1.0, 2.0, 4.0],
            c: v(0x3000, p.c_elements()),
            c_type: OutputType::Bf16,
        };
        let groups = l.group_params(&p, &buffers);
        assert_eq!(
            groups[2],
            GroupParams { n: 256, k: 512, alpha: 2.0, b_scales: 0x30_8000, token_map: 9, ..GroupParams::default() }
        );
        let tables = Sm90DeviceTables { groups: 1, maps: 2, work: 3, work_len: 4, status: 5, workspace: 6 };
        let s = l.schedule_params(&p, &buffers, &tables);
        assert_eq!(
            s.sizes,
            DeviceSizes { sizes: 0x100, layout: abi::LAYOUT_CONTIGUOUS, groups: 4, rows: 300, reserved: 0 }
        );
        assert_eq!((s.groups, s.work, s.work_len, s.status, s.workspace), (1, 3, 4, 5, 6));
        assert_eq!((s.a_values, s.a_scales, s.c), (0x1000, 0x2000, 0x3000));
        assert_eq!((s.max_work, s.k, s.n, s.token_map_small, s.token_map_large), (12, 512, 256, 8, 9));
        let kp = l.kernel_params(&tables, OutputType::Bf16);
        assert_eq!(
            kp,
            KernelParams {
                groups: 1,
                tensor_maps: 2,
                work: 3,
                work_len: 12,
                group_count: 4,
                out_bf16: 1,
                reserved: 0,
                work_len_device: 4
            }
        );
    }
}
