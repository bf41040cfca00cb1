//! Host side of the sm_90a (Hopper) kernels: work list, token workspace, tensor maps, parameters
//! and launch geometry, for host-sized problems ([`Sm90Layout`]) and device-sized ones
//! ([`Sm90DeviceLayout`]): the plan engine's layouts (`crate::engine`), no driver calls. The
//! kernels' configuration (`nvfp4_gemm_abi::sm90`) is the one source of the numbers used here.
//!
//! A host-sized problem becomes two launches over one group table and one tensor-map table
//! (`[2g]` the group's f16 token workspace, `[2g+1]` its packed weights): `sm90_dequant_tokens`
//! (A → f16 workspace), then `sm90_grouped_gemm` over the work list; with W4A16's activations,
//! the GEMM alone over token maps of the activations.
//!
//! The layouts are public (through [`crate::layout`]) so that the CPU model of the device runs
//! the kernels on exactly these tables.

mod cost;
mod device_sizes;

// Reached through `crate::layout` (the `testing` feature).
#[cfg_attr(not(any(test, feature = "testing")), allow(unused_imports))]
pub use device_sizes::Sm90DeviceLayout;
pub(crate) use device_sizes::SCHEDULE;

use cost::item_cost;

use crate::device::Arch;
use crate::driver::launch::{Params, Start};
use crate::driver::tensor_map::TiledMapEncoder;
use crate::engine::{AlphaField, Launch, Layout, Memory, Tables, WorkList, PLACEHOLDER_BASE};
use crate::error::{Error, Result};
use crate::problem::{GroupBuffers, Problem, TokenKind};
use nvfp4_gemm_abi::launch::LaunchGeometry;
use nvfp4_gemm_abi::sm90::{self, GemmConfig, GroupParams, KernelParams, RowSpan, WorkItem};
use nvfp4_gemm_abi::tensor_map::TensorMap;

/// Most 128-row spans per group `N192`'s work list tries (each three replace two of 192 rows).
const N192_MAX_TWOS: u32 = 12;

/// A host-sized problem planned for sm_90a: everything that does not depend on buffer addresses.
#[derive(Debug, Clone)]
pub struct Sm90Layout {
    /// The problem.
    pub problem: Problem,
    /// The GEMM's configuration (tile, stages, shared memory).
    pub config: GemmConfig,
    /// The GEMM's work list, balanced over the grid (`balance`; may hold holes).
    pub work: Vec<WorkItem>,
    /// Byte offset of each group's f16 tokens in the workspace (NVFP4 tokens).
    pub workspace_offsets: Vec<u64>,
    /// Bytes of the token workspace (0: none, for W4A16's activations).
    pub workspace_bytes: usize,
    /// (first CTA, CTA count) of each group in the dequantization grid.
    pub dequant_ctas: Vec<(u32, u32)>,
    /// CTAs of the dequantization grid (0: no group has tokens, or W4A16).
    pub dequant_grid: u32,
    /// Geometry of the GEMM.
    pub gemm: LaunchGeometry,
    /// Geometry of `sm90_dequant_tokens`.
    pub dequant: LaunchGeometry,
}

impl Sm90Layout {
    /// Plans `problem` for a device with `sm_count` SMs (the persistent GEMM grid).
    pub fn new(problem: &Problem, sm_count: u32) -> Sm90Layout {
        // The decode variant when every group fits a 16-token tile; else whichever of the general
        // variants finishes its balanced list first (ties: the earlier in this order).
        let general = sm90::config_for(problem.groups().iter().map(|s| s.m as u32));
        let candidates: &[GemmConfig] = if general == GemmConfig::DECODE {
            &[GemmConfig::DECODE]
        } else {
            &[GemmConfig::GENERAL, GemmConfig::T64, GemmConfig::N192]
        };
        let (config, work) = candidates
            .iter()
            .map(|&c| (c, Self::work_list(problem, c, sm_count)))
            .min_by_key(|(_, (_, makespan))| *makespan)
            .map(|(c, (work, _))| (c, work))
            .expect("at least one candidate");
        Self::from_work(problem, sm_count, config, work)
    }

    /// Plans `problem` with the GEMM variant `config` whatever the cost model prefers (for tests
    /// and measurements of one variant), or `None` where `config` cannot run it: the decode
    /// variant needs every group to fit a 16-token tile.
    pub fn with_config(problem: &Problem, sm_count: u32, config: GemmConfig) -> Option<Sm90Layout> {
        let decode_only = sm90::config_for(problem.groups().iter().map(|s| s.m as u32)) == GemmConfig::DECODE;
        if !GemmConfig::ALL.contains(&config) || (config == GemmConfig::DECODE && !decode_only) {
            return None;
        }
        let (work, _) = Self::work_list(problem, config, sm_count);
        Some(Self::from_work(problem, sm_count, config, work))
    }

    /// The layout of `problem` on `sm_count` SMs: the cost model's choice, or the GEMM kernel
    /// named `kernel` (`crate::PlanOptions::sm90_kernel`, by its W4A4 name); a name that is no
    /// sm_90a GEMM kernel, or a variant that cannot run the problem, is an error.
    pub fn named(problem: &Problem, sm_count: u32, kernel: Option<&str>) -> Result<Sm90Layout> {
        let Some(name) = kernel else { return Ok(Sm90Layout::new(problem, sm_count)) };
        let config = GemmConfig::ALL
            .into_iter()
            .find(|c| c.kernel_name() == name)
            .ok_or_else(|| Error::InvalidProblem(format!("sm90_kernel {name}: not an sm_90a GEMM kernel")))?;
        Sm90Layout::with_config(problem, sm_count, config)
            .ok_or_else(|| Error::InvalidProblem(format!("sm90_kernel {name}: that variant cannot run this problem")))
    }

    /// The layout around a chosen variant and its work list.
    fn from_work(problem: &Problem, sm_count: u32, config: GemmConfig, work: Vec<WorkItem>) -> Sm90Layout {
        let mut workspace_offsets = vec![];
        let mut dequant_ctas = vec![];
        let (mut ws, mut ctas) = (0u64, 0u32);
        // W4A16 reads its activations where they are: no workspace, no dequantization.
        let nvfp4 = problem.tokens() == TokenKind::Nvfp4;
        for s in problem.groups() {
            let (m, k) = (s.m as u32, s.k as u32);
            workspace_offsets.push(ws);
            let c = if nvfp4 { sm90::dequant_ctas(m, k) } else { 0 };
            if nvfp4 {
                ws += sm90::TokenWorkspace::bytes(s.m, s.k) as u64;
            }
            dequant_ctas.push((ctas, c));
            ctas += c;
        }
        Sm90Layout {
            problem: problem.clone(),
            config,
            gemm: sm90::gemm_launch(config, work.len() as u32, sm_count),
            dequant: sm90::dequant_launch(ctas),
            work,
            workspace_offsets,
            workspace_bytes: ws as usize,
            dequant_ctas,
            dequant_grid: ctas,
        }
    }

    /// The work list of `problem` under variant `config`, balanced over its persistent grid on
    /// `sm_count` SMs, and the estimated time of its busiest CTA ([`cost::item_cost`]). `N192`
    /// also chooses how each group's N is cut into row spans ([`RowSpan::split`]): the number of
    /// 128-row spans per group whose list ends first.
    fn work_list(problem: &Problem, config: GemmConfig, sm_count: u32) -> (Vec<WorkItem>, u64) {
        if config.block_n == sm90::BLOCK_N {
            return Self::work_list_with(problem, config, sm_count, |n| (0..sm90::n_tiles(n)).collect());
        }
        (0..=N192_MAX_TWOS)
            .map(|twos| {
                Self::work_list_with(problem, config, sm_count, |n| {
                    RowSpan::split(n, twos).map(|span| span.encode()).collect()
                })
            })
            .min_by_key(|(_, makespan)| *makespan)
            .expect("at least one split")
    }

    /// [`Self::work_list`] with each group's weight tiles (`tile_n`) given by `tiles(n)`.
    fn work_list_with(
        problem: &Problem,
        config: GemmConfig,
        sm_count: u32,
        tiles: impl Fn(u32) -> Vec<u32>,
    ) -> (Vec<WorkItem>, u64) {
        // (item, relative time) in the order group, weight tile, token tile.
        let mut work = vec![];
        for (g, s) in problem.groups().iter().enumerate() {
            let (m, n) = (s.m as u32, s.n as u32);
            for tile_n in tiles(n) {
                for tile_m in 0..sm90::m_tiles(m, config.tile_rows(m)) {
                    work.push((WorkItem { group: g as u32, tile_m, tile_n }, item_cost(config, s, tile_m, tile_n)));
                }
            }
        }
        // The persistent grid the launch will have (the list is balanced over exactly it).
        let grid = sm90::gemm_launch(config, work.len() as u32, sm_count).grid;
        balance(work, grid)
    }

    /// The GEMM kernel: a W4A4 variant, or its W4A16 twin for the problem's activations.
    pub fn gemm_kernel(&self) -> &'static str {
        match self.problem.tokens() {
            TokenKind::Nvfp4 => self.config.kernel_name(),
            TokenKind::Dense(a) => self.config.w4a16_kernel_name(a),
        }
    }

    /// Group `g`'s entry for buffers `b`: W4A4 tokens from the workspace at device address
    /// `workspace`, W4A16's from its activations (read through the token maps).
    fn group_entry(&self, g: usize, b: &GroupBuffers, workspace: u64) -> GroupParams {
        let groups = self.problem.groups().len() as u32;
        let s = &self.problem.groups()[g];
        let (a_values, a_scales, workspace) = match self.problem.tokens() {
            TokenKind::Nvfp4 => (b.a_values.ptr, b.a_scales.ptr, workspace + self.workspace_offsets[g]),
            TokenKind::Dense(_) => (0, 0, b.a_values.ptr),
        };
        GroupParams {
            m: s.m as u32,
            n: s.n as u32,
            k: s.k as u32,
            alpha: b.alpha,
            a_values,
            a_scales,
            b_scales: b.b_scales.ptr,
            c: b.c.ptr,
            workspace,
            dequant_first_cta: self.dequant_ctas[g].0,
            dequant_ctas: self.dequant_ctas[g].1,
            block_m: self.config.tile_rows(s.m as u32),
            tail_rows: sm90::tail_box_rows(s.m as u32, self.config.tile_rows(s.m as u32)),
            token_row: 0,
            token_map: sm90::token_map_index(g as u32) as u32,
            tail_token_map: sm90::tail_token_map_index(g as u32, groups) as u32,
            reserved: 0,
        }
    }

    /// The parameters of both kernels over the memory at `at`.
    pub fn kernel_params(&self, at: &Tables) -> KernelParams {
        at.kernel_params(0, self.work.len() as u32, 0, self.problem.groups().len(), self.problem.output())
    }
}

/// sm_90a host-sized plans: one group table and one tensor-map table (`[2g]` the group's token
/// map, `[2G + g]` its last tile's, `[2g+1]` its packed weights), then `sm90_dequant_tokens`
/// (A → f16 workspace) and the GEMM over the work list; W4A16 runs its GEMM alone, its token maps
/// over the caller's activations.
impl Layout for Sm90Layout {
    type Group = GroupParams;
    type Call = [GroupBuffers];
    const ARCH: Arch = Arch::Sm90a;

    fn memory(&self) -> Memory {
        let groups = self.problem.groups().len();
        Memory {
            groups,
            maps: sm90::map_count(groups as u32),
            work: [WorkList::Items(bytemuck::cast_slice(&self.work).to_vec()), WorkList::None],
            workspace_bytes: self.workspace_bytes,
            ranks: 0,
        }
    }

    fn encode_fixed<E: TiledMapEncoder>(&self, encoder: &E, at: &Tables, maps: &mut [TensorMap]) -> Result<()> {
        let groups = self.problem.groups().len() as u32;
        let nvfp4 = self.problem.tokens() == TokenKind::Nvfp4;
        for (g, s) in self.problem.groups().iter().enumerate() {
            if s.m == 0 {
                // No tile reads this group's maps.
                continue;
            }
            let (m, n, k) = (s.m as u32, s.n as u32, s.k as u32);
            // W4A4's tokens are in the plan's workspace; W4A16's in the call's activations.
            let tokens = if nvfp4 { at.workspace + self.workspace_offsets[g] } else { PLACEHOLDER_BASE };
            maps[sm90::token_map_index(g as u32)] = encoder.encode(&sm90::token_map(self.config, m, k), tokens)?;
            maps[sm90::tail_token_map_index(g as u32, groups)] =
                encoder.encode(&sm90::tail_token_map(self.config, m, k), tokens)?;
            maps[sm90::weight_map_index(g as u32)] =
                encoder.encode(&sm90::weight_map_for(self.config, n, k), PLACEHOLDER_BASE)?;
        }
        Ok(())
    }

    fn encode_call<E: TiledMapEncoder>(
        &self,
        encoder: &E,
        call: &[GroupBuffers],
        at: &Tables,
        groups: &mut [GroupParams],
        maps: &mut [TensorMap],
    ) -> Result<()> {
        let count = self.problem.groups().len() as u32;
        let dense = self.problem.tokens() != TokenKind::Nvfp4;
        for (g, (s, b)) in self.problem.groups().iter().zip(call).enumerate() {
            groups[g] = self.group_entry(g, b, at.workspace);
            if s.m == 0 {
                continue;
            }
            encoder.replace_address(&mut maps[sm90::weight_map_index(g as u32)], b.b_values.ptr)?;
            if dense {
                encoder.replace_address(&mut maps[sm90::token_map_index(g as u32)], b.a_values.ptr)?;
                encoder.replace_address(&mut maps[sm90::tail_token_map_index(g as u32, count)], b.a_values.ptr)?;
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
        if self.work.is_empty() {
            return;
        }
        let params = Params::of(&self.kernel_params(at));
        let mut gemm_start = Start::AfterPrevious;
        if self.dequant_grid > 0 {
            // The token dequantization writes the workspace the GEMM reads; the GEMM may start
            // before it ends and waits for it before its first token load.
            out.push(Launch {
                kernel: sm90::DEQUANT_KERNEL,
                geometry: self.dequant,
                start: Start::AfterPrevious,
                params,
            });
            gemm_start = GEMM_AFTER_DEQUANT;
        }
        out.push(Launch { kernel: self.gemm_kernel(), geometry: self.gemm, start: gemm_start, params });
    }

    fn call_independent_launches(&self) -> bool {
        true
    }

    fn describe(&self) -> (String, usize) {
        let words = format!(
            "{}: swap-AB wgmma m64nNk16, tile Nx{}{} (tokens x weights; N = {}), {} stages of K {}, {} CTA(s) per SM",
            self.gemm_kernel(),
            self.config.block_n,
            if self.config.block_n == sm90::BLOCK_N { "" } else { " (or 128, 64 where the host cuts N so)" },
            widths(self.config),
            self.config.stages,
            self.config.block_k(),
            self.config.ctas_per_sm()
        );
        (words, self.work.iter().filter(|w| !w.is_hole()).count())
    }

    fn alpha_field(&self) -> AlphaField {
        AlphaField::of::<GroupParams>(sm90::GROUP_ALPHA_OFFSET)
    }
}

/// How a GEMM launch that follows the token dequantization may start (`sm90::GEMM_STARTS_EARLY`).
pub(crate) const GEMM_AFTER_DEQUANT: Start = if sm90::GEMM_STARTS_EARLY { Start::Early } else { Start::AfterPrevious };

/// How a W4A16 GEMM launch that follows a device-sized plan's scheduler may start
/// (`sm90::w4a16::GEMM_WAITS_FIRST`).
pub(crate) const W4A16_GEMM_START: Start =
    if sm90::w4a16::GEMM_WAITS_FIRST { Start::Early } else { Start::AfterPrevious };

/// The token-tile widths of a variant, in words.
pub(crate) fn widths(c: sm90::GemmConfig) -> String {
    if c.narrow == c.block_m {
        format!("{}", c.block_m)
    } else if c.narrow == sm90::TAIL_TILE_M {
        format!("{}, or {} for a group's last tile when its rows fit", c.block_m, c.narrow)
    } else {
        format!("{} for groups of at most {} tokens, else {}", c.narrow, c.narrow, c.block_m)
    }
}

/// Lays `items` (each with its relative time) out for a persistent grid of `ctas` CTAs, where CTA
/// `b` takes the entries `b, b + ctas, ...`, and returns the list and the busiest CTA's total
/// time. Longest first, each to the CTA with the least time so
/// far (ties: the lowest index), so that the last CTA to finish is not much later than the
/// average; a CTA with fewer items than others gets holes ([`WorkItem::HOLE`]), which the kernel
/// skips. Items of equal time keep their order (group, weight tile, token tile), so neighbouring
/// CTAs run neighbouring tiles at the same time and share the weight tiles in L2. With
/// `ctas ≥ items` every CTA takes one item (no holes).
fn balance(mut items: Vec<(WorkItem, u64)>, ctas: u32) -> (Vec<WorkItem>, u64) {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    if ctas == 0 || items.len() <= ctas as usize {
        let makespan = items.iter().map(|&(_, c)| c).max().unwrap_or(0);
        return (items.into_iter().map(|(w, _)| w).collect(), makespan);
    }
    items.sort_by_key(|&(_, cost)| Reverse(cost)); // stable
    let mut queues: Vec<Vec<WorkItem>> = vec![vec![]; ctas as usize];
    let mut heap: BinaryHeap<Reverse<(u64, u32)>> = (0..ctas).map(|b| Reverse((0, b))).collect();
    for (w, cost) in items {
        let Reverse((load, b)) = heap.pop().expect("ctas > 0");
        queues[b as usize].push(w);
        heap.push(Reverse((load + cost, b)));
    }
    let depth = queues.iter().map(Vec::len).max().unwrap_or(0);
    let mut list = Vec::with_capacity(depth * ctas as usize);
    for j in 0..depth {
        for q in &queues {
            list.push(q.get(j).copied().unwrap_or(WorkItem::HOLE));
        }
    }
    while list.last().is_some_and(WorkItem::is_hole) {
        list.pop();
    }
    let makespan = heap.into_iter().map(|Reverse((load, _))| load).max().unwrap_or(0);
    (list, makespan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::encode_tables;
    use crate::engine::testing::{base, launches, FakeEncoder};
    use crate::problem::BufferView;
    use crate::problem::{GroupShape, OutputType};

    #[test]
    fn layout_of_a_small_problem() {
        let p = Problem::new(
            vec![GroupShape::new(96, 256, 512), GroupShape::new(0, 128, 256), GroupShape::new(200, 136, 128)],
            OutputType::F16,
        )
        .unwrap();
        let l = Sm90Layout::new(&p, 132);
        // group 0: 2 n-tiles × 1 m-tile; group 1: none; group 2: 2 × 2.
        assert_eq!(l.work.len(), 2 + 4);
        assert_eq!(l.work[0], WorkItem { group: 0, tile_m: 0, tile_n: 0 });
        assert_eq!(l.work[1], WorkItem { group: 0, tile_m: 0, tile_n: 1 });
        assert_eq!(l.work[2], WorkItem { group: 2, tile_m: 0, tile_n: 0 });
        assert_eq!(l.work[3], WorkItem { group: 2, tile_m: 1, tile_n: 0 });
        assert_eq!(l.workspace_offsets, vec![0, 96 * 512 * 2, 96 * 512 * 2]);
        // 96 rows × 8 chunks = 768 items = 6 CTAs of 128; group 1 has none; 200 × 2 = 400 → 4.
        assert_eq!(l.dequant_ctas, vec![(0, 6), (6, 0), (6, 4)]);
        // Five 41-KiB stages, ten mbarriers, two 8-KiB epilogue buffers from the next 128 bytes.
        assert_eq!(l.gemm, LaunchGeometry { grid: 6, block: 384, cluster: 1, smem_bytes: 226_432 });
        assert_eq!(l.dequant, LaunchGeometry { grid: 10, block: 256, cluster: 1, smem_bytes: 0 });
    }

    /// CTA loads (in `tile_cost` units) of a layout's persistent walk: CTA b takes b, b + G, ...
    fn cta_loads(l: &Sm90Layout, p: &Problem) -> Vec<u64> {
        let g = l.gemm.grid as usize;
        let cost = |w: &WorkItem| item_cost(l.config, &p.groups()[w.group as usize], w.tile_m, w.tile_n);
        (0..g).map(|b| l.work.iter().skip(b).step_by(g).filter(|w| !w.is_hole()).map(cost).sum()).collect()
    }

    fn same_nk(m: &[usize]) -> Problem {
        Problem::new(m.iter().map(|&m| GroupShape::new(m, 4096, 1024)).collect::<Vec<_>>(), OutputType::F16).unwrap()
    }

    #[test]
    fn tails_of_64_rows_take_the_64_128_variant() {
        // b0's token counts (K 1024 here: 8 stages): 8 tiles of 128 rows and 3 tails of ≤ 64 per
        // weight tile, against 11 of 128.
        let p = same_nk(&[80, 176, 128, 72, 64, 248, 96, 160]);
        let l = Sm90Layout::with_config(&p, 132, GemmConfig::T64).unwrap();
        // The cost model's own choice (the 192-row variant, `n192_spans_cover_every_row_once`),
        // and a variant that cannot run these groups.
        assert_eq!(Sm90Layout::new(&p, 132).config, GemmConfig::N192);
        assert!(Sm90Layout::with_config(&p, 132, GemmConfig::DECODE).is_none());
        let real: Vec<_> = l.work.iter().filter(|w| !w.is_hole()).collect();
        assert_eq!(real.len(), 32 * 11);
        let mut tiles: Vec<_> = real.iter().map(|w| (w.group, w.tile_n, w.tile_m)).collect();
        tiles.sort();
        tiles.dedup();
        assert_eq!(tiles.len(), 32 * 11, "every tile once");
        let loads = cta_loads(&l, &p);
        assert_eq!(loads.iter().sum::<u64>(), 32 * 8 * (8 * 228 + 3 * 164));
        // 256 long tiles and 96 tails on 132 CTAs: the busiest ends after two long tiles and a
        // tail, where `GENERAL` (352 long tiles) needs three long ones.
        assert_eq!(*loads.iter().max().unwrap(), 8 * (2 * 228 + 164));
        assert!(loads.iter().max().unwrap() < &(8 * 3 * 228));
    }

    #[test]
    fn n192_spans_cover_every_row_once() {
        // b0's token counts and N: 192- and 128-row spans (the split the cost model prefers),
        // every 64-row block of every token tile once, and a busiest CTA below `T64`'s.
        let p = same_nk(&[80, 176, 128, 72, 64, 248, 96, 160]);
        let l = Sm90Layout::new(&p, 132);
        assert_eq!(l.config, GemmConfig::N192);
        assert_eq!(l.gemm.block, 512);
        let mut blocks = vec![];
        for w in l.work.iter().filter(|w| !w.is_hole()) {
            let span = RowSpan::decode(w.tile_n);
            assert!((1..=3).contains(&span.warpgroups));
            blocks.extend((span.first..span.first + span.warpgroups).map(|b| (w.group, w.tile_m, b)));
        }
        blocks.sort();
        let expected: Vec<_> = (0..8u32)
            .flat_map(|g| {
                let m = p.groups()[g as usize].m as u32;
                (0..m.div_ceil(128)).flat_map(move |t| (0..64).map(move |b| (g, t, b)))
            })
            .collect();
        assert_eq!(blocks, expected);
        let t64 = Sm90Layout::with_config(&p, 132, GemmConfig::T64).unwrap();
        assert!(cta_loads(&l, &p).iter().max() < cta_loads(&t64, &p).iter().max());
    }

    #[test]
    fn bench_shapes_take_the_variant_measured_fastest() {
        // The default bench set's b-shapes on the H200's 132 SMs: b0 and b1 run `N192` (forced
        // on b1: 66.1 µs against `T64`'s 68.3 and `GENERAL`'s 77.7), b2 and b3
        // `GENERAL` (`N192` 30% / 22% slower there). A change of the cost model that flips one of
        // these must come with new measurements.
        let shapes: [(&[usize], usize, usize, GemmConfig); 4] = [
            (&[80, 176, 128, 72, 64, 248, 96, 160], 4096, 7168, GemmConfig::N192),
            (&[40, 76, 168, 72, 164, 148, 196, 160], 7168, 2048, GemmConfig::N192),
            (&[192, 320], 3072, 4096, GemmConfig::GENERAL),
            (&[128, 384], 4096, 1536, GemmConfig::GENERAL),
        ];
        for (m, n, k, expected) in shapes {
            let p =
                Problem::new(m.iter().map(|&m| GroupShape::new(m, n, k)).collect::<Vec<_>>(), OutputType::F16).unwrap();
            assert_eq!(Sm90Layout::new(&p, 132).config, expected, "groups {m:?}, N {n}, K {k}");
        }
    }

    #[test]
    fn small_groups_keep_the_16_128_variant() {
        // Four groups of ≤ 16 tokens beside one of 200: 16-row tiles (116) beat 64-row tails (164).
        let p = same_nk(&[4, 9, 16, 3, 200]);
        let l = Sm90Layout::new(&p, 132);
        assert_eq!(l.config, GemmConfig::GENERAL);
        let buffers = vec![crate::problem::fake_buffers(&p.groups()[0], 0, 1.0); 5];
        let (params, _) = encode_tables(&l, &FakeEncoder, &buffers[..], &Tables::default()).unwrap();
        assert_eq!(params.iter().map(|g| g.block_m).collect::<Vec<_>>(), [16, 16, 16, 16, 128]);
        // Per weight tile 2 long tiles, 4 short ones: 64 long + 128 short on 132 CTAs.
        let loads = cta_loads(&l, &p);
        assert_eq!(loads.iter().sum::<u64>(), 32 * 8 * (2 * 228 + 4 * 116));
        assert_eq!(*loads.iter().max().unwrap(), 8 * 2 * 116);
    }

    #[test]
    fn balance_lays_out_longest_first_with_holes() {
        let w = |g| WorkItem { group: g, tile_m: 0, tile_n: 0 };
        // Two CTAs; costs 5, 1, 1, 1, 1, 1: CTA 0 takes the 5, CTA 1 the five 1s.
        let items = vec![(w(0), 1), (w(1), 5), (w(2), 1), (w(3), 1), (w(4), 1), (w(5), 1)];
        let (list, makespan) = balance(items, 2);
        assert_eq!(makespan, 5);
        let h = WorkItem::HOLE;
        assert_eq!(list, vec![w(1), w(0), h, w(2), h, w(3), h, w(4), h, w(5)]);
        // As many CTAs as items: the list as given.
        assert_eq!(balance(vec![(w(0), 1), (w(1), 9)], 2), (vec![w(0), w(1)], 9));
        // Equal costs: round robin in the given order, no holes.
        let items: Vec<_> = (0..7).map(|g| (w(g), 3)).collect();
        assert_eq!(balance(items, 3), ((0..7).map(w).collect::<Vec<_>>(), 9));
    }

    #[test]
    fn group_and_kernel_params() {
        let p =
            Problem::new(vec![GroupShape::new(96, 256, 512), GroupShape::new(0, 128, 256)], OutputType::Bf16).unwrap();
        let l = Sm90Layout::new(&p, 132);
        let buffers: Vec<GroupBuffers> = p
            .groups()
            .iter()
            .enumerate()
            .map(|(g, s)| crate::problem::fake_buffers(s, 0x1000_0000 * g as u64, 0.5))
            .collect();
        let at =
            Tables { groups: 0x1000, maps: 0x2000, work: [0x3000, 0], workspace: 0x9000_0000, ..Tables::default() };
        let (params, maps) = encode_tables(&l, &FakeEncoder, &buffers[..], &at).unwrap();
        assert_eq!(params[0].workspace, 0x9000_0000);
        assert_eq!(params[1].workspace, 0x9000_0000 + 96 * 512 * 2);
        assert_eq!((params[0].dequant_first_cta, params[0].dequant_ctas), (0, 6));
        assert_eq!((params[0].alpha, params[0].b_scales), (0.5, buffers[0].b_scales.ptr));
        assert_eq!(base(&maps[sm90::token_map_index(0)]), 0x9000_0000, "W4A4 tokens: the workspace");
        assert_eq!(base(&maps[sm90::tail_token_map_index(0, 2)]), 0x9000_0000);
        assert_eq!(base(&maps[sm90::weight_map_index(0)]), buffers[0].b_values.ptr);
        assert_eq!(maps[sm90::weight_map_index(1)], TensorMap::ZERO, "a group without tokens has no maps");
        assert_eq!(
            l.kernel_params(&at),
            KernelParams {
                groups: 0x1000,
                tensor_maps: 0x2000,
                work: 0x3000,
                work_len: 2,
                group_count: 2,
                out_bf16: 1,
                reserved: 0,
                work_len_device: 0,
                epilogue: Default::default(),
            }
        );
        let names: Vec<_> = launches(&l, None, &at).iter().map(|l| l.kernel).collect();
        assert_eq!(names, ["sm90_dequant_tokens", l.config.kernel_name()]);

        // W4A16: the same variant and list; the token maps over each group's activations, its
        // `workspace` field the activations, no workspace, no dequantization.
        let dense = Problem::with_tokens(
            p.groups().to_vec(),
            OutputType::Bf16,
            TokenKind::Dense(sm90::w4a16::Activations::Bf16),
        )
        .unwrap();
        let w = Sm90Layout::new(&dense, 132);
        assert_eq!((w.config, &w.work, w.workspace_bytes, w.dequant_grid), (l.config, &l.work, 0, 0));
        let activations = |g: usize| 0x7000_0000 + 0x10_0000 * g as u64;
        let dense_buffers: Vec<GroupBuffers> = buffers
            .iter()
            .zip(p.groups())
            .enumerate()
            .map(|(g, (b, s))| GroupBuffers {
                a_kind: dense.tokens(),
                a_values: BufferView { ptr: activations(g), len: s.m * s.k },
                a_scales: BufferView { ptr: 0, len: 0 },
                ..*b
            })
            .collect();
        let (params, maps) = encode_tables(&w, &FakeEncoder, &dense_buffers[..], &at).unwrap();
        assert_eq!((params[0].workspace, params[0].a_values, params[0].dequant_ctas), (activations(0), 0, 0));
        assert_eq!(base(&maps[sm90::token_map_index(0)]), activations(0));
        assert_eq!(base(&maps[sm90::tail_token_map_index(0, 2)]), activations(0));
        let names: Vec<_> = launches(&w, None, &at).iter().map(|l| l.kernel).collect();
        assert_eq!(names, [l.config.w4a16_kernel_name(sm90::w4a16::Activations::Bf16)]);
    }
}
