//! The sm_100a part of a plan for device-resident group sizes (`crate::moe`,
//! `crate::device_sizes`): [`Sm100DeviceLayout`], no driver calls.
//!
//! Two launches per call, both with parameters fixed by the plan and the call's buffers:
//! 1. `sm100_schedule` (one CTA) reads the sizes and writes the size-dependent fields of the group
//!    table (`m`, `a_scales`, `c`, `token_row`), the work list, the work length and the status bits;
//! 2. the GEMM variant for the problem's one tile width over a persistent grid sized for the work
//!    list's capacity, walking the length the scheduler wrote (`KernelParams::work_len_device`).
//!
//! Every group has the same N and K, so every group has the same tile width
//! ([`choose_block_n`]): one list and one kernel. 128-wide: the 6-stage kernel, or the 3-stage
//! one when the capacity is longer than two of its waves ([`select_n128`], as host-sized plans
//! choose by the list's length). 256-wide: the cluster kernel; the scheduler pads each M tile's run
//! to a multiple of 4 on the device, so the length it writes, like the capacity, is a multiple of
//! the cluster size ([`slots_per_m_tile`]).
//!
//! Tensor maps: `[2g]` is the same map for every group, over the whole token tensor A
//! (`[token_rows, K]`, 128-row boxes); a group's tiles start at its first row there
//! (`GroupParams::token_row`). Rows of a tile past the group's end belong to other groups or to
//! nothing (zero-filled by TMA past the tensor); each MMA row depends only on its own A row and
//! scales, and the epilogue masks rows ≥ `m`, so they never reach C. `[2g + 1]` is group `g`'s
//! weights with the variant's box height, as in host-sized plans.

use super::Fp4Map;
use crate::device::Arch;
use crate::device_sizes::{schedule_common, schedule_geometry};
use crate::driver::launch::{Params, Start};
use crate::driver::tensor_map::TiledMapEncoder;
use crate::engine::{AlphaField, Launch, Layout, Memory, Tables, WorkList, PLACEHOLDER_BASE};
use crate::error::{Error, Result};
use crate::moe_problem::{MoeBuffers, MoeProblem};
use crate::problem::TokenKind;
use nvfp4_gemm_abi::launch::LaunchGeometry;
use nvfp4_gemm_abi::moe::schedule::Sm100ScheduleParams;
use nvfp4_gemm_abi::moe::{self as abi, DeviceSizes};
use nvfp4_gemm_abi::sm100::config::BLOCK_M;
use nvfp4_gemm_abi::sm100::params::{kernel_for, GroupParams, KernelLayout, GROUP_ALPHA_OFFSET};
use nvfp4_gemm_abi::sm100::{
    choose_block_n, for_block_n, select_n128, slots_per_m_tile, BlockN, Fp4TensorMap, WorkItem, N128_SHALLOW,
};
use nvfp4_gemm_abi::tensor_map::TensorMap;

/// Everything about a device-sized problem that does not depend on buffer addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sm100DeviceLayout {
    /// The problem (its bounds).
    pub problem: MoeProblem,
    /// The GEMM variant every group runs in.
    pub kernel: KernelLayout,
    /// Its tile width.
    pub block_n: BlockN,
    /// The sizes' layout (address 0).
    pub sizes: DeviceSizes,
    /// Capacity of the work list: the most items any sizes within the bounds give
    /// (`max_m_tiles · slots_per_m_tile`; a multiple of 4 for the cluster kernel).
    pub max_work: u32,
    /// The GEMM's launch, for the capacity.
    pub gemm: LaunchGeometry,
}

impl Sm100DeviceLayout {
    /// Plans `problem` with `resident(kernel)` CTAs of each kernel resident on the whole device
    /// (as [`super::Sm100Layout::new`]).
    pub fn new(problem: &MoeProblem, resident: impl Fn(KernelLayout) -> u32) -> Result<Sm100DeviceLayout> {
        if problem.tokens() != TokenKind::Nvfp4 {
            return Err(Error::Unsupported(
                "W4A16 runs on sm_90a; sm_100a multiplies NVFP4 operands natively (NVFP4 tokens)".into(),
            ));
        }
        let sizes = problem.device_sizes(0);
        let (n, k) = (problem.n() as u32, problem.k() as u32);
        let block_n = choose_block_n(n, k);
        let max_work = abi::max_m_tiles(&sizes) * slots_per_m_tile(n, block_n) as u64;
        let max_work = u32::try_from(max_work)
            .map_err(|_| Error::InvalidProblem(format!("{max_work} output tiles exceed the work list's indexing")))?;
        let cfg = match block_n {
            BlockN::N128 => {
                let wave = |c| kernel_for(c).map_or(0, &resident);
                select_n128(max_work, wave(for_block_n(BlockN::N128)), wave(N128_SHALLOW))
            }
            BlockN::N256 => for_block_n(BlockN::N256),
        };
        let kernel = kernel_for(cfg)
            .ok_or_else(|| Error::InvalidProblem(format!("no sm_100a kernel is compiled for {cfg:?}")))?;
        let resident_ctas = resident(kernel);
        let gemm = kernel.launch(max_work, resident_ctas);
        if gemm.grid == 0 {
            return Err(Error::InvalidProblem(format!(
                "{} cannot run here: {resident_ctas} resident CTAs",
                kernel.kernel_name()
            )));
        }
        Ok(Sm100DeviceLayout { problem: problem.clone(), kernel, block_n, sizes, max_work, gemm })
    }

    /// The token map (over the whole token tensor A) and the weight map of every group.
    pub fn maps(&self) -> Result<(Fp4Map, Fp4Map)> {
        let k = self.problem.k() as u32;
        let a = Fp4Map::new(Fp4TensorMap::for_operand(self.problem.token_rows() as u32, k, BLOCK_M), 0, "a")?;
        let b = Fp4Map::new(Fp4TensorMap::for_operand(self.problem.n() as u32, k, self.block_n.get()), 0, "b")?;
        debug_assert_eq!(a.rank(), b.rank());
        Ok((a, b))
    }

    /// The scheduler's parameters for `buffers` over the memory at `at`.
    pub fn schedule_params(&self, buffers: &MoeBuffers, at: &Tables) -> Sm100ScheduleParams {
        Sm100ScheduleParams {
            common: schedule_common(&self.problem, buffers, at),
            work_len: at.work_len[0],
            max_work: self.max_work,
            block_n: self.block_n.get(),
        }
    }
}

/// The scheduler's exported name.
pub const SCHEDULE: &str = "sm100_schedule";

/// A device-sized sm_100a plan: the group table's size-independent fields and the maps from the
/// host (`[2g]` the token map over all of A, the same for every group; `[2g + 1]` group `g`'s
/// weights); the scheduler writes the rest per call.
impl Layout for Sm100DeviceLayout {
    type Group = GroupParams;
    type Call = MoeBuffers;
    const ARCH: Arch = Arch::Sm100a;

    fn memory(&self) -> Memory {
        let groups = self.sizes.groups as usize;
        Memory {
            groups,
            maps: 2 * groups,
            work: [WorkList::Capacity(self.max_work as usize * size_of::<WorkItem>()), WorkList::None],
            workspace_bytes: 0,
            ranks: 0,
        }
    }

    fn encode_fixed<E: TiledMapEncoder>(&self, encoder: &E, _at: &Tables, maps: &mut [TensorMap]) -> Result<()> {
        let (a, b) = self.maps()?;
        let (a, b) = (a.encode_with(encoder, PLACEHOLDER_BASE)?, b.encode_with(encoder, PLACEHOLDER_BASE)?);
        for g in 0..self.sizes.groups as usize {
            (maps[2 * g], maps[2 * g + 1]) = (a, b);
        }
        Ok(())
    }

    fn encode_call<E: TiledMapEncoder>(
        &self,
        encoder: &E,
        call: &MoeBuffers,
        _at: &Tables,
        groups: &mut [GroupParams],
        maps: &mut [TensorMap],
    ) -> Result<()> {
        let map_rank = self.maps()?.0.rank();
        let n = self.problem.n() as u32;
        for (g, ((values, scales), &alpha)) in call.weights.iter().zip(&call.alphas).enumerate() {
            groups[g] = GroupParams {
                n,
                k: self.problem.k() as u32,
                alpha,
                b_scales: scales.ptr,
                ldc: n,
                map_rank,
                ..GroupParams::default()
            };
            encoder.replace_address(&mut maps[2 * g], call.a.base())?;
            encoder.replace_address(&mut maps[2 * g + 1], values.ptr)?;
        }
        Ok(())
    }

    fn signature(&self, call: &MoeBuffers, out: &mut Vec<u64>) {
        for ((values, scales), alpha) in call.weights.iter().zip(&call.alphas) {
            out.extend([values.ptr, scales.ptr, u64::from(alpha.to_bits())]);
        }
        // The token maps hold A's address.
        out.push(call.a.base());
    }

    fn launches(&self, call: Option<&MoeBuffers>, at: &Tables, out: &mut Vec<Launch>) {
        let schedule = match call {
            Some(b) => self.schedule_params(b, at),
            None => Sm100ScheduleParams::default(),
        };
        let groups = self.sizes.groups;
        out.push(Launch {
            kernel: SCHEDULE,
            geometry: schedule_geometry(groups),
            start: Start::AfterPrevious,
            params: Params::of(&schedule),
        });
        out.push(Launch {
            kernel: self.kernel.kernel_name(),
            geometry: self.gemm,
            start: Start::AfterPrevious,
            params: Params::of(&at.kernel_params(
                0,
                self.max_work,
                at.work_len[0],
                groups as usize,
                self.problem.output(),
            )),
        });
    }

    fn call_independent_launches(&self) -> bool {
        false
    }

    fn describe(&self) -> (String, usize) {
        let c = self.kernel.config();
        let words = format!(
            "{SCHEDULE} (device sizes → work list) + {}: tcgen05 mxf4nvf4 tile {}x{}, {} stages of K {}, cluster {}",
            self.kernel.kernel_name(),
            c.block_m(),
            c.block_n(),
            c.stages(),
            c.block_k(),
            c.cluster_size()
        );
        (words, self.max_work as usize)
    }

    fn alpha_field(&self) -> AlphaField {
        AlphaField::of::<GroupParams>(GROUP_ALPHA_OFFSET)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::encode_tables;
    use crate::engine::testing::{base, launches, FakeEncoder};
    use crate::moe_problem::{MoeTokens, TokenLayout};
    use crate::problem::BufferView;
    use crate::problem::OutputType;
    use nvfp4_gemm_abi::sm100::params::{N128_DEEP_KERNEL, N128_SHALLOW_KERNEL, N256_CLUSTER4_KERNEL};

    fn static_occupancy(kernel: KernelLayout) -> u32 {
        kernel.config().resident_ctas(148, kernel.config().max_ctas_per_sm(), 37)
    }

    fn layout(groups: usize, n: usize, k: usize, layout: TokenLayout) -> (MoeProblem, Sm100DeviceLayout) {
        let p = MoeProblem::new(groups, n, k, layout, OutputType::F16).unwrap();
        let l = Sm100DeviceLayout::new(&p, static_occupancy).unwrap();
        (p, l)
    }

    #[test]
    fn variant_capacity_and_geometry() {
        // 128-wide: min(4, 300) + (300 − 4)/128 = 6 M tiles × 2 N tiles.
        let (_, l) = layout(4, 256, 512, TokenLayout::Contiguous { max_tokens: 300 });
        assert_eq!((l.kernel, l.block_n, l.max_work), (N128_DEEP_KERNEL, BlockN::N128, 12));
        assert_eq!(l.gemm, N128_DEEP_KERNEL.launch(12, 148));
        assert_eq!(
            schedule_geometry(4),
            LaunchGeometry {
                grid: 1,
                block: nvfp4_gemm_abi::moe::schedule::SCHEDULE_THREADS,
                cluster: 1,
                smem_bytes: nvfp4_gemm_abi::moe::schedule::smem::bytes(4)
            }
        );
        // A capacity past two deep waves: the 3-stage kernel, as host-sized plans choose.
        let (_, l) = layout(64, 4096, 1024, TokenLayout::Masked { max_rows: 16 });
        assert_eq!((l.kernel, l.max_work), (N128_SHALLOW_KERNEL, 64 * 32));
        // The MoE shapes are 256-wide: N tiles padded to a multiple of 4 per M tile.
        let (_, l) = layout(256, 7168, 2048, TokenLayout::Masked { max_rows: 16 });
        assert_eq!((l.kernel, l.block_n, l.max_work), (N256_CLUSTER4_KERNEL, BlockN::N256, 256 * 28));
        let (_, l) = layout(3, 4352, 2048, TokenLayout::Contiguous { max_tokens: 200 });
        assert_eq!(l.max_work, 4 * 20, "17 N tiles padded to 20; min(3, 200) + 197/128 M tiles");
        assert_eq!((l.max_work % 4, l.gemm.grid % 4, l.gemm.cluster), (0, 0, 4));
        assert!(Sm100DeviceLayout::new(
            &MoeProblem::new(1, 8, 64, TokenLayout::Masked { max_rows: 1 }, OutputType::F16).unwrap(),
            |_| 0
        )
        .is_err());
    }

    #[test]
    fn tables_and_parameters() {
        let (p, l) = layout(3, 136, 320, TokenLayout::Contiguous { max_tokens: 300 });
        let a = p.a_sizes();
        let v = |ptr: u64, len| BufferView { ptr, len };
        let buffers = MoeBuffers {
            sizes: v(0x100, 4),
            a: MoeTokens::Nvfp4 { values: v(0x1000, a.values), scales: v(0x2000, a.scales) },
            weights: (0..3).map(|g| (v(0x10_0000 * (g + 1), 0), v(0x10_0000 * (g + 1) + 0x8000, 0))).collect(),
            alphas: vec![0.5, 1.0, 2.0],
            c: v(0x3000, p.c_elements()),
            c_type: OutputType::F16,
            activated: None,
        };
        let tables = Tables { groups: 1, maps: 2, work: [3, 0], work_len: [4, 0], status: 5, ..Default::default() };
        let (groups, maps) = encode_tables(&l, &FakeEncoder, &buffers, &tables).unwrap();
        assert_eq!((base(&maps[4]), base(&maps[5])), (0x1000, 0x30_0000), "group 2: A, then its weights");
        assert_eq!(
            groups[2],
            GroupParams {
                n: 136,
                k: 320,
                alpha: 2.0,
                b_scales: 0x30_8000,
                ldc: 136,
                map_rank: 2,
                ..GroupParams::default()
            }
        );
        let (a_map, b_map) = l.maps().unwrap();
        match (a_map, b_map) {
            (Fp4Map::Rank2(a), Fp4Map::Rank2(b)) => {
                assert_eq!((a.dims, a.box_dims), ([320, 300], [256, 128]));
                assert_eq!((b.dims, b.box_dims), ([320, 136], [256, 128]));
            }
            other => panic!("{other:?}"),
        }
        let s = l.schedule_params(&buffers, &tables);
        assert_eq!(
            s.common.sizes,
            DeviceSizes { sizes: 0x100, layout: abi::LAYOUT_CONTIGUOUS, groups: 3, rows: 300, reserved: 0 }
        );
        let c = &s.common;
        assert_eq!((c.groups, c.work, s.work_len, c.status, c.a_scales, c.c), (1, 3, 4, 5, 0x2000, 0x3000));
        assert_eq!((s.max_work, c.k, c.n, s.block_n), (l.max_work, 320, 136, 128));
        let all = launches(&l, Some(&buffers), &tables);
        assert_eq!(all[0].params.get::<Sm100ScheduleParams>(), Some(s));
        let kp = all[1].params.get::<nvfp4_gemm_abi::work::KernelParams>().unwrap();
        assert_eq!((all.len(), all[1].kernel), (2, l.kernel.kernel_name()));
        assert_eq!((kp.work_len, kp.work_len_device, kp.group_count, kp.out_bf16), (l.max_work, 4, 3, 0));
    }
}
