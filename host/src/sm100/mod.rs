//! Host side of the sm_100a (Blackwell) kernels: which variant runs each group, the work lists,
//! launch geometry, group parameters and tensor maps. Every number comes from
//! `nvfp4_gemm_abi::sm100` (the kernel reads the same definitions); nothing here recomputes a
//! tile size, an offset or a byte count.
//!
//! A problem becomes at most two launches ([`Sm100Layout::launches`]):
//! - the groups whose tile width is 128 ([`choose_block_n`]) form one work list, run by the 6-stage
//!   kernel, or by the 3-stage one (two CTAs per SM) when the list is longer than two waves of the
//!   6-stage kernel ([`select_n128`]);
//! - the groups with 256-wide tiles form the other, run in clusters of 4 CTAs that share the A
//!   tile by multicast; the list is padded so that each aligned run of 4 items shares one A tile.
//!
//! Both launches read the same group table and tensor-map table (`[2g]` = A, `[2g+1]` = B with the
//! group's box height), so a group's maps are encoded once.
//!
//! [`Sm100Layout`] is the plan engine's layout for `GemmPlan` (`crate::engine`). The layout types
//! are public (through [`crate::layout`]) so that the CPU model of the device runs the kernels on
//! exactly these tables.

mod device_sizes;

// Reached through `crate::layout` (the `testing` feature).
#[cfg_attr(not(any(test, feature = "testing")), allow(unused_imports))]
pub use device_sizes::Sm100DeviceLayout;

use crate::device::{Arch, Gpu};
use crate::driver::launch::{ctas_per_sm, max_active_clusters, set_max_dynamic_smem, LaunchGeometry, Params, Start};
use crate::driver::tensor_map::TiledMapEncoder;
use crate::engine::{AlphaField, Launch, Layout, Memory, Tables, WorkList, PLACEHOLDER_BASE};
use crate::error::{Error, Result};
use crate::problem::{GroupBuffers, Problem};
use nvfp4_gemm_abi::sm100::params::{kernel_for, GroupParams, KernelLayout, KernelParams, GROUP_ALPHA_OFFSET, KERNELS};
use nvfp4_gemm_abi::sm100::tma::{Fp4MapLayout, TensorMapDataType, TensorMapInterleave, TensorMapOobFill};
use nvfp4_gemm_abi::sm100::{
    build_work_list, choose_block_n, for_block_n, select_n128, work_list_len, BlockN, Fp4TensorMap, GroupShape,
    WorkItem,
};
use nvfp4_gemm_abi::tensor_map::{TensorMap, TiledMap};

/// One GEMM launch of a host-sized plan: its kernel, work list and geometry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sm100Launch {
    /// The variant.
    pub kernel: KernelLayout,
    /// Its work list (cluster variant: padded so that each aligned run of 4 shares an A tile).
    pub work: Vec<WorkItem>,
    /// Grid, block, cluster and shared memory.
    pub geometry: LaunchGeometry,
}

/// A host-sized problem planned for sm_100a: each group's tile width and the launches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sm100Layout {
    /// The problem.
    pub problem: Problem,
    /// Each group's tile width.
    pub block_n: Vec<BlockN>,
    /// At most two launches: the 128-wide list, then the 256-wide one.
    pub launches: Vec<Sm100Launch>,
}

fn abi_shape(s: &crate::problem::GroupShape) -> GroupShape {
    GroupShape { m: s.m as u32, n: s.n as u32, k: s.k as u32 }
}

/// How many CTAs of each sm_100a GEMM variant are resident at once on `gpu` (the driver's
/// occupancy, with the cluster variant's count of resident clusters).
pub(crate) fn resident_ctas(gpu: &Gpu) -> Result<Vec<(KernelLayout, u32)>> {
    let stream = gpu.context().default_stream();
    let mut resident = vec![];
    for kernel in KERNELS {
        let cfg = kernel.config();
        let f = gpu.function(kernel.kernel_name())?;
        set_max_dynamic_smem(&f, cfg.dynamic_shared_memory())?;
        let one_cluster = LaunchGeometry { grid: cfg.cluster_size(), ..kernel.launch(0, 0) };
        let per_sm = ctas_per_sm(&f, one_cluster.block, one_cluster.smem_bytes)?.min(cfg.max_ctas_per_sm());
        let clusters = if cfg.cluster_size() > 1 { max_active_clusters(&f, &stream, one_cluster)? } else { 0 };
        resident.push((kernel, cfg.resident_ctas(gpu.sm_count(), per_sm, clusters)));
    }
    Ok(resident)
}

impl Sm100Layout {
    /// Plans `problem` with `resident(kernel)` CTAs of each variant resident at once.
    pub fn new(problem: &Problem, resident: impl Fn(KernelLayout) -> u32) -> Result<Sm100Layout> {
        if problem.tokens() != crate::problem::TokenKind::Nvfp4 {
            return Err(Error::Unsupported(
                "W4A16 runs on sm_90a; sm_100a multiplies NVFP4 operands natively (NVFP4 tokens)".into(),
            ));
        }
        let shapes: Vec<GroupShape> = problem.groups().iter().map(abi_shape).collect();
        let block_n = shapes.iter().map(|s| choose_block_n(s.n, s.k)).collect();
        let mut launches = vec![];
        for width in [BlockN::N128, BlockN::N256] {
            let len = work_list_len(&shapes, width);
            if len == 0 {
                continue;
            }
            let mut work = vec![WorkItem::default(); len];
            let written = build_work_list(&shapes, width, &mut work)
                .map_err(|e| Error::InvalidProblem(format!("work list needs {} items", e.needed)))?;
            work.truncate(written);
            let cfg = match width {
                BlockN::N128 => {
                    let deep = for_block_n(BlockN::N128);
                    let shallow = nvfp4_gemm_abi::sm100::N128_SHALLOW;
                    let wave = |c| kernel_for(c).map_or(0, &resident);
                    select_n128(work.len() as u32, wave(deep), wave(shallow))
                }
                BlockN::N256 => for_block_n(BlockN::N256),
            };
            let kernel = kernel_for(cfg)
                .ok_or_else(|| Error::InvalidProblem(format!("no sm_100a kernel is compiled for {cfg:?}")))?;
            let resident_ctas = resident(kernel);
            let geometry = kernel.launch(work.len() as u32, resident_ctas);
            if geometry.grid == 0 {
                return Err(Error::InvalidProblem(format!(
                    "{} cannot run here: {resident_ctas} resident CTAs",
                    kernel.kernel_name()
                )));
            }
            launches.push(Sm100Launch { kernel, geometry, work });
        }
        Ok(Sm100Layout { problem: problem.clone(), block_n, launches })
    }

    /// Output tiles over all launches (cluster padding included).
    pub fn tiles(&self) -> usize {
        self.launches.iter().map(|l| l.work.len()).sum()
    }

    /// Group `g`'s A and B maps (`None` for a group without tokens).
    pub fn operand_maps(&self, g: usize) -> Result<Option<(Fp4Map, Fp4Map)>> {
        let s = &self.problem.groups()[g];
        if s.m == 0 {
            return Ok(None);
        }
        let k = s.k as u32;
        let a = Fp4Map::new(Fp4TensorMap::for_operand(s.m as u32, k, nvfp4_gemm_abi::sm100::config::BLOCK_M), g, "a")?;
        let b = Fp4Map::new(Fp4TensorMap::for_operand(s.n as u32, k, self.block_n[g].get()), g, "b")?;
        Ok(Some((a, b)))
    }

    /// The parameters of launch `i` over the memory at `at`.
    pub fn kernel_params(&self, i: usize, at: &Tables) -> KernelParams {
        let work = self.launches[i].work.len() as u32;
        at.kernel_params(i, work, 0, self.problem.groups().len(), self.problem.output())
    }
}

/// sm_100a host-sized plans: one group table and one tensor-map table (`[2g]` = A, `[2g+1]` = B
/// with the group's box height) that both launches read, so a group's maps are encoded once.
impl Layout for Sm100Layout {
    type Group = GroupParams;
    type Call = [GroupBuffers];
    const ARCH: Arch = Arch::Sm100a;

    fn memory(&self) -> Memory {
        let groups = self.problem.groups().len();
        let list = |i: usize| {
            self.launches.get(i).map_or(WorkList::None, |l| WorkList::Items(bytemuck::cast_slice(&l.work).to_vec()))
        };
        Memory { groups, maps: 2 * groups, work: [list(0), list(1)], workspace_bytes: 0, ranks: 0 }
    }

    fn encode_fixed<E: TiledMapEncoder>(&self, encoder: &E, _at: &Tables, maps: &mut [TensorMap]) -> Result<()> {
        for g in 0..self.problem.groups().len() {
            if let Some((a, b)) = self.operand_maps(g)? {
                maps[2 * g] = a.encode_with(encoder, PLACEHOLDER_BASE)?;
                maps[2 * g + 1] = b.encode_with(encoder, PLACEHOLDER_BASE)?;
            }
        }
        Ok(())
    }

    fn encode_call<E: TiledMapEncoder>(
        &self,
        encoder: &E,
        call: &[GroupBuffers],
        _at: &Tables,
        groups: &mut [GroupParams],
        maps: &mut [TensorMap],
    ) -> Result<()> {
        for (g, (s, b)) in self.problem.groups().iter().zip(call).enumerate() {
            let map_rank = self.operand_maps(g)?.map_or(0, |(a, _)| a.rank());
            groups[g] = GroupParams {
                m: s.m as u32,
                n: s.n as u32,
                k: s.k as u32,
                alpha: b.alpha,
                a_scales: b.a_scales.ptr,
                b_scales: b.b_scales.ptr,
                c: b.c.ptr,
                ldc: s.n as u32,
                map_rank,
                token_row: 0,
                reserved: 0,
            };
            if s.m != 0 {
                encoder.replace_address(&mut maps[2 * g], b.a_values.ptr)?;
                encoder.replace_address(&mut maps[2 * g + 1], b.b_values.ptr)?;
            }
        }
        Ok(())
    }

    fn signature(&self, call: &[GroupBuffers], out: &mut Vec<u64>) {
        for b in call {
            out.extend([
                b.a_values.ptr,
                b.a_scales.ptr,
                b.b_values.ptr,
                b.b_scales.ptr,
                b.c.ptr,
                u64::from(b.alpha.to_bits()),
            ]);
        }
    }

    fn launches(&self, _call: Option<&[GroupBuffers]>, at: &Tables, out: &mut Vec<Launch>) {
        for (i, l) in self.launches.iter().enumerate() {
            out.push(Launch {
                kernel: l.kernel.kernel_name(),
                geometry: l.geometry,
                start: Start::AfterPrevious,
                params: Params::of(&self.kernel_params(i, at)),
            });
        }
    }

    fn call_independent_launches(&self) -> bool {
        // The cluster variant needs a cluster launch, which the graph's kernel nodes do not take.
        false
    }

    fn describe(&self) -> (String, usize) {
        let parts: Vec<String> = self
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
        let words = if parts.is_empty() { "sm100: no work".into() } else { parts.join("; ") };
        (words, self.tiles())
    }

    fn alpha_field(&self) -> AlphaField {
        AlphaField::of::<GroupParams>(GROUP_ALPHA_OFFSET)
    }
}

/// The parameters of one FP4 operand's tensor map, in the host encoder's form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp4Map {
    /// The flat map (K tail).
    Rank2(TiledMap<2>),
    /// The seed's chunked map (`K % 256 == 0`).
    Rank3(TiledMap<3>),
}

impl Fp4Map {
    /// Converts the abi's map description; errors name the group and operand. (Public for the
    /// sm_100a probes, `diag/host/`, which load the GEMM's own maps.)
    pub fn new(
        map: core::result::Result<Fp4TensorMap, nvfp4_gemm_abi::sm100::TensorMapError>,
        g: usize,
        op: &'static str,
    ) -> Result<Fp4Map> {
        let m = map.map_err(|e| Error::group(g, op, format!("no tensor map for this operand: {e:?}")))?;
        // The host encoder fixes these; the abi must agree with it.
        let fixed = m.data_type == TensorMapDataType::U4x16Align8B
            && m.interleave == TensorMapInterleave::None
            && m.oob_fill == TensorMapOobFill::None
            && m.element_strides.iter().take(m.rank as usize).all(|&s| s == 1);
        if !fixed {
            return Err(Error::InvalidProblem(format!("group {g} {op}: unsupported tensor map {m:?}")));
        }
        Ok(match m.layout {
            Fp4MapLayout::Chunked3d => Fp4Map::Rank3(TiledMap {
                element: m.data_type,
                dims: m.global_dim,
                strides_bytes: [m.global_strides[0], m.global_strides[1], 0],
                box_dims: m.box_dim,
                swizzle: m.swizzle,
                l2_promotion: m.l2_promotion,
            }),
            Fp4MapLayout::Flat2d => Fp4Map::Rank2(TiledMap {
                element: m.data_type,
                dims: [m.global_dim[0], m.global_dim[1]],
                strides_bytes: [m.global_strides[0], 0],
                box_dims: [m.box_dim[0], m.box_dim[1]],
                swizzle: m.swizzle,
                l2_promotion: m.l2_promotion,
            }),
        })
    }

    /// 2 or 3: the `map_rank` the kernel dispatches on.
    pub fn rank(&self) -> u32 {
        match self {
            Fp4Map::Rank2(_) => 2,
            Fp4Map::Rank3(_) => 3,
        }
    }

    /// Encodes the map for the operand at device address `base` with `encoder`.
    pub fn encode_with(&self, encoder: &impl TiledMapEncoder, base: u64) -> Result<TensorMap> {
        match self {
            Fp4Map::Rank2(m) => encoder.encode(m, base),
            Fp4Map::Rank3(m) => encoder.encode(m, base),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::testing::{base, FakeEncoder};
    use crate::problem::GroupShape as Shape;
    use crate::problem::OutputType;
    use nvfp4_gemm_abi::sm100::params::{N128_DEEP_KERNEL, N128_SHALLOW_KERNEL, N256_CLUSTER4_KERNEL};
    use nvfp4_gemm_abi::sm100::tma::TensorMapSwizzle;

    /// Resident CTAs on 148 SMs as shared memory and TMEM bound them, all 37 clusters of 4
    /// resident ([`Sm100Plan::new`] asks the driver, which also counts registers and GPCs).
    fn static_occupancy(kernel: KernelLayout) -> u32 {
        kernel.config().resident_ctas(148, kernel.config().max_ctas_per_sm(), 37)
    }

    fn problem(shapes: &[(usize, usize, usize)]) -> Problem {
        Problem::new(shapes.iter().map(|&(m, n, k)| Shape::new(m, n, k)).collect::<Vec<_>>(), OutputType::F16).unwrap()
    }

    fn layout(shapes: &[(usize, usize, usize)]) -> Sm100Layout {
        Sm100Layout::new(&problem(shapes), static_occupancy).unwrap()
    }

    #[test]
    fn competition_shape_runs_one_deep_launch() {
        let l = layout(&[(96, 128, 256), (128, 256, 512)]);
        assert_eq!(l.launches.len(), 1);
        let launch = &l.launches[0];
        assert_eq!(launch.kernel, N128_DEEP_KERNEL);
        assert_eq!(launch.work.len(), 3);
        assert_eq!(launch.geometry, LaunchGeometry { grid: 3, block: 256, cluster: 1, smem_bytes: 221_312 });
        assert_eq!(l.tiles(), 3);
    }

    /// b0: 8 groups N = 4096, K = 7168 → 256-wide, clusters of 4; 176 items on 148 SMs: a
    /// persistent grid of 148 CTAs (37 clusters).
    #[test]
    fn benchmark_b0_runs_the_cluster_kernel() {
        let p = Problem::new(nvfp4_format::generate::shapes::B0.to_vec(), OutputType::F16).unwrap();
        let l = Sm100Layout::new(&p, static_occupancy).unwrap();
        assert_eq!(l.launches.len(), 1);
        let launch = &l.launches[0];
        assert_eq!(launch.kernel, N256_CLUSTER4_KERNEL);
        assert_eq!(launch.work.len(), 176);
        assert_eq!(launch.geometry, LaunchGeometry { grid: 148, block: 256, cluster: 4, smem_bytes: 221_312 });
        assert!(l.block_n.iter().all(|&b| b == BlockN::N256));
    }

    /// GPC fragmentation: when the driver reports fewer resident 4-CTA clusters than SMs / 4, the
    /// persistent grid of the cluster kernel follows the driver, not the SM count.
    #[test]
    fn cluster_grid_follows_resident_clusters() {
        let p = Problem::new(nvfp4_format::generate::shapes::B0.to_vec(), OutputType::F16).unwrap();
        let l = Sm100Layout::new(&p, |k| k.config().resident_ctas(148, 1, 34)).unwrap();
        assert_eq!(l.launches[0].kernel, N256_CLUSTER4_KERNEL);
        assert_eq!(l.launches[0].geometry.grid, 136);
    }

    /// Over two waves of 128-wide items with two CTAs per SM possible: the 3-stage kernel.
    #[test]
    fn long_list_runs_the_shallow_kernel() {
        // 2048 rows x 32 N tiles = 512 items > 2 x 148.
        let l = layout(&[(2048, 4096, 1024)]);
        assert_eq!(l.launches[0].kernel, N128_SHALLOW_KERNEL);
        assert_eq!(l.launches[0].geometry.grid, 296);
        assert_eq!(l.launches[0].geometry.smem_bytes, 110_720);
        // If registers allowed only one CTA per SM, the deep kernel stays.
        let one = Sm100Layout::new(&problem(&[(2048, 4096, 1024)]), |_| 148).unwrap();
        assert_eq!(one.launches[0].kernel, N128_DEEP_KERNEL);
        assert_eq!(one.launches[0].geometry.grid, 148);
    }

    #[test]
    fn mixed_widths_give_two_launches_and_skip_empty_groups() {
        let l = layout(&[(200, 4096, 2048), (0, 4096, 2048), (64, 512, 512)]);
        assert_eq!(l.launches.len(), 2);
        assert_eq!(l.launches[0].kernel, N128_DEEP_KERNEL);
        assert_eq!(l.launches[0].work.len(), 4);
        assert_eq!(l.launches[1].kernel, N256_CLUSTER4_KERNEL);
        // 2 M tiles x 16 N tiles; the m = 0 group has none.
        assert_eq!(l.launches[1].work.len(), 32);
        assert_eq!(l.launches[1].geometry.grid % 4, 0);
        assert!(l.launches.iter().all(|x| x.work.iter().all(|w| w.group != 1)));
        let none = layout(&[(0, 128, 256)]);
        assert!(none.launches.is_empty());
    }

    #[test]
    fn cluster_grid_and_list_are_multiples_of_four() {
        // N = 4352 = 17 tiles of 256 → each M tile padded to 20 items.
        let l = layout(&[(300, 4352, 4096)]);
        let launch = &l.launches[0];
        assert_eq!(launch.kernel, N256_CLUSTER4_KERNEL);
        assert_eq!(launch.work.len(), 3 * 20);
        assert_eq!(launch.work.len() % 4, 0);
        assert_eq!(launch.geometry.grid % 4, 0);
    }

    #[test]
    fn no_resident_cta_is_an_error() {
        let e = Sm100Layout::new(&problem(&[(64, 128, 256)]), |_| 0).unwrap_err();
        assert!(matches!(e, Error::InvalidProblem(_)), "{e}");
    }

    /// The map parameters the host hands the driver: the seed's 3D map when K % 256 == 0, the flat
    /// map otherwise; B's box is the group's tile width; the kernel's rank is the maps' rank.
    #[test]
    fn tensor_map_parameters() {
        let p = problem(&[(248, 4096, 7168), (72, 384, 384), (0, 128, 256), (200, 4096, 2112)]);
        let l = Sm100Layout::new(&p, static_occupancy).unwrap();
        let (a, b) = l.operand_maps(0).unwrap().unwrap();
        assert_eq!(
            a,
            Fp4Map::Rank3(TiledMap {
                element: TensorMapDataType::U4x16Align8B,
                dims: [256, 248, 28],
                strides_bytes: [3584, 128, 0],
                box_dims: [256, 128, 1],
                swizzle: TensorMapSwizzle::B128,
                l2_promotion: nvfp4_gemm_abi::tensor_map::L2_PROMOTION,
            })
        );
        match b {
            Fp4Map::Rank3(m) => assert_eq!((m.dims, m.box_dims), ([256, 4096, 28], [256, 256, 1])),
            other => panic!("{other:?}"),
        }
        let (a, b) = l.operand_maps(1).unwrap().unwrap();
        assert_eq!(
            a,
            Fp4Map::Rank2(TiledMap {
                element: TensorMapDataType::U4x16Align8B,
                dims: [384, 72],
                strides_bytes: [192, 0],
                box_dims: [256, 128],
                swizzle: TensorMapSwizzle::B128,
                l2_promotion: nvfp4_gemm_abi::tensor_map::L2_PROMOTION,
            })
        );
        assert_eq!(b.rank(), 2);
        assert_eq!(l.operand_maps(2).unwrap(), None);
        // A 256-wide group with a K tail: flat maps, B box 256 rows (the multicast 2D path).
        let (a, b) = l.operand_maps(3).unwrap().unwrap();
        assert_eq!((a.rank(), b.rank()), (2, 2));
        match b {
            Fp4Map::Rank2(m) => assert_eq!(m.box_dims, [256, 256]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn group_and_kernel_params() {
        let p = problem(&[(72, 384, 384), (0, 128, 256), (128, 256, 512)]);
        let l = Sm100Layout::new(&p, static_occupancy).unwrap();
        let buffers: Vec<GroupBuffers> = p
            .groups()
            .iter()
            .enumerate()
            .map(|(g, s)| crate::problem::fake_buffers(s, 0x1000_0000 * g as u64, 0.5))
            .collect();
        let at = Tables { groups: 0x1000, maps: 0x2000, work: [0x3000, 0x4000], ..Tables::default() };
        let (params, maps) = crate::engine::encode_tables(&l, &FakeEncoder, &buffers[..], &at).unwrap();
        assert_eq!((base(&maps[0]), base(&maps[1])), (buffers[0].a_values.ptr, buffers[0].b_values.ptr));
        assert_eq!(maps[2], TensorMap::ZERO, "a group without tokens has no maps");
        assert_eq!(
            params[0],
            GroupParams {
                m: 72,
                n: 384,
                k: 384,
                alpha: 0.5,
                a_scales: 0x20_0000,
                b_scales: 0x40_0000,
                c: 0x50_0000,
                ldc: 384,
                map_rank: 2,
                token_row: 0,
                reserved: 0,
            }
        );
        assert_eq!(params[1].map_rank, 0);
        assert_eq!(params[2].map_rank, 3);
        let kp = l.kernel_params(0, &at);
        assert_eq!(
            kp,
            KernelParams {
                groups: 0x1000,
                tensor_maps: 0x2000,
                work: 0x3000,
                work_len: 3 + 2,
                group_count: 3,
                out_bf16: 0,
                reserved: 0,
                work_len_device: 0,
                epilogue: Default::default(),
            }
        );
    }
}
