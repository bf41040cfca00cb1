//! The sm_90a part of a plan for device-resident group sizes (`crate::moe`,
//! `crate::device_sizes`): [`Sm90DeviceLayout`], no driver calls.
//!
//! A call launches `sm90_schedule` (one CTA), `sm90_dequant_tokens` (a grid of at most
//! `DEQUANT_GRID_CTAS_PER_SM` CTAs per SM, grid-strided over the CTAs the scheduler gave the
//! groups), then the plan's GEMM kernels: the decode kernel, the
//! general one, or both ([`MoeKernels`]), each over a persistent grid sized for its list's
//! capacity and walking the length the scheduler wrote (`KernelParams::work_len_device`). With
//! both, the scheduler gives the call to the decode kernel when no group has more than 16 rows
//! and to the general one otherwise (a length of 0 for the other) — the choice host-sized plans
//! make for the same sizes — and builds the list host-sized plans build for that kernel: the
//! plain order, or the general kernel's LPT order over its grid. Every launch after the scheduler
//! may start early (programmatic dependent launch) and waits for the one before it where it reads
//! what that one wrote.
//!
//! Tensor maps: `[2g + 1]` group `g`'s weights (as in host-sized plans; `[2g]` unused), then maps
//! over the whole f16 workspace `[token_rows, K]` with boxes of every height `h` from 1 to the
//! launched kernels' tallest tile, at `[2G + h − 1]`. A plan pairing the decode kernel with
//! `N192` has one map more in front and two weight maps per group (`map_shift`): `N192`'s
//! (192-row boxes) at `[2g + 1]`, the decode kernel's (128-row boxes) at `[2g + 2]`, which its
//! launch, reading the table from one map further, sees as `[2g + 1]`; the token maps follow at
//! `[2G + h]`, and the scheduler writes each group's map indices for the base of the kernel
//! that takes the call. A group's token tiles start at its first row
//! in those maps (`GroupParams::token_row`), and its full tiles and last tile take the maps of the
//! heights a host-sized plan's own maps have (`block_m`, `tail_rows`), so every tile loads the
//! same rows as there.

use super::cost::stage_cost;
use crate::device::Arch;
use crate::device_sizes::{schedule_common, schedule_geometry, MoeKernels, MoeOptions};
use crate::driver::launch::{LaunchGeometry, Params, Start};
use crate::driver::tensor_map::TiledMapEncoder;
use crate::engine::{AlphaField, Launch, Layout, Memory, Tables, WorkList, PLACEHOLDER_BASE};
use crate::error::{Error, Result};
use crate::moe_problem::{GlobalScale, MoeBuffers, MoeProblem};
use nvfp4_gemm_abi::moe::block::ActivationEpilogue as ActivationEpilogueParams;
use nvfp4_gemm_abi::moe::schedule::{lpt_fits_u32, lpt_list_capacity, LPT_MAX_CTAS};
use nvfp4_gemm_abi::moe::sm90::{
    general_config, kernel_slot, Sm90ScheduleParams, WeightTiles, KERNELS_AUTO, KERNELS_DECODE, KERNELS_GENERAL,
};
use nvfp4_gemm_abi::moe::{self as abi, DeviceSizes};
use nvfp4_gemm_abi::sm90::w4a16::Activations;
use nvfp4_gemm_abi::sm90::{self, GemmConfig, GroupParams, TokenWorkspace, WorkItem, SMALL_TILE_M};
use nvfp4_gemm_abi::tensor_map::{TensorMap, TENSOR_MAP_BYTES};
use nvfp4_gemm_abi::work::KernelParams;

/// One GEMM launch of a device-sized sm_90a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sm90DeviceGemm {
    /// Its configuration.
    pub config: GemmConfig,
    /// The most items any sizes within the bounds give it.
    pub max_items: u32,
    /// Its list's capacity (holes included): its `KernelParams::work_len`.
    pub max_list: u32,
    /// Its launch (a persistent grid for the capacity).
    pub launch: LaunchGeometry,
}

/// Everything about a device-sized problem that does not depend on buffer addresses.
#[derive(Debug, Clone, PartialEq)]
pub struct Sm90DeviceLayout {
    /// The problem (its bounds).
    pub problem: MoeProblem,
    /// The scheduler's kernel choice (`abi::moe::sm90::KERNELS_*`): the decode kernel alone when
    /// the bounds keep every group at 16 rows or fewer.
    pub kernels: u32,
    /// The general configuration's index (`abi::moe::sm90::GENERAL_CONFIGS`).
    pub general: u32,
    /// The sizes' layout (address 0).
    pub sizes: DeviceSizes,
    /// The launched GEMMs, `[decode, general]`.
    pub gemms: [Option<Sm90DeviceGemm>; 2],
    /// CTAs the general list is balanced over (0: the plain order).
    pub lpt_grid: u32,
    /// The general configuration's class costs per stage, `[wide, narrow]`.
    pub costs: [u32; 2],
    /// Workspace maps of every box height from 1 to this.
    pub token_heights: u32,
    /// Most dequantization CTAs any sizes within the bounds give.
    pub max_dequant_ctas: u32,
    /// Bytes of the f16 token workspace (`token_rows × K` f16).
    pub workspace_bytes: usize,
    /// `sm90_dequant_tokens`' launch (sized for the bounds).
    pub dequant: LaunchGeometry,
    /// NVFP4 tokens: the caller writes the workspace (`MoeOptions::caller_dequantizes`), the
    /// plan launches no dequantization.
    pub caller_dequantizes: bool,
    /// W4A16 (a problem of 16-bit activations): their type. The tokens are then the call's
    /// activations `[token_rows, K]`, read through the token maps as they are: no dequantization
    /// launch, no workspace, the W4A16 twins of the GEMM kernels.
    pub activations: Option<Activations>,
    /// The calls that follow route at most 16 rows in all ([`Self::set_routed_rows`]): a plan of
    /// both kernels launches the decode kernel alone, which the scheduler would give every such
    /// call anyway, and not the general kernel only to find no work.
    pub decode_alone: bool,
    /// Both kernels launched, the general one first (`MoeKernels::AutoGeneralFirst`).
    pub general_first: bool,
    /// The calls that follow route more than 16 rows per group on average
    /// ([`Self::set_routed_rows`]): where all of them are routed, some group has more than 16
    /// and the general kernel does the work, so a plan of both kernels launches it first (the
    /// decode kernel's launch after it finds no work), as `general_first` does.
    pub prefill_sized: bool,
}

fn to_u32(items: u64, what: &str) -> Result<u32> {
    u32::try_from(items).map_err(|_| Error::InvalidProblem(format!("{items} {what} exceed the work list's indexing")))
}

impl Sm90DeviceLayout {
    /// Maps before the table's first weight map: 1 when the plan pairs the decode kernel with
    /// `N192`, whose weight maps (192-row boxes) cannot be the decode kernel's (128-row boxes): the
    /// `N192` launch reads the table from its start, where group `g`'s weight map `[2g + 1]` holds
    /// 192-row boxes, and the decode launch from one map further, where its `[2g + 1]` is the
    /// table's `[2g + 2]`, a 128-row one. Else 0: one base, one weight map per group.
    pub fn map_shift(&self) -> u32 {
        match self.gemms {
            [Some(_), Some(g)] if g.config.block_n != sm90::BLOCK_N => 1,
            _ => 0,
        }
    }

    /// Maps between the table's start and launch `slot`'s base (`[decode, general]`).
    pub fn map_base(&self, slot: usize) -> u32 {
        if slot == kernel_slot(true) {
            self.map_shift()
        } else {
            0
        }
    }

    /// The layout of `problem`'s bounds on a device with `sm_count` SMs (W4A16 for a problem of
    /// 16-bit activations: the same tiles and work list, the tokens the call's activations).
    pub fn new(problem: &MoeProblem, sm_count: u32, options: &MoeOptions) -> Result<Sm90DeviceLayout> {
        let activations = problem.tokens().activations();
        let sizes = problem.device_sizes(0);
        let (g, n, k) = (sizes.groups as u64, problem.n() as u32, problem.k() as u32);
        // The most rows any group can have within the bounds (`M_max`, or all `T` tokens): when
        // that fits a 16-token tile the decode kernel serves every routing.
        problem.check_epilogue()?;
        let kernels = if problem.activation_epilogue().is_some() {
            // The activation epilogue is in the general kernels only (`GENERAL_CONFIGS`; the
            // decode kernel's registers do not hold it).
            KERNELS_GENERAL
        } else if sizes.rows <= SMALL_TILE_M {
            KERNELS_DECODE
        } else {
            match options.kernels {
                MoeKernels::Auto | MoeKernels::AutoGeneralFirst => KERNELS_AUTO,
                MoeKernels::Decode => KERNELS_DECODE,
                MoeKernels::General => KERNELS_GENERAL,
            }
        };
        // The activation epilogue is in the 128-row general kernels only.
        let general =
            if options.spans192 && problem.activation_epilogue().is_none() { 2 } else { options.tail64 as u32 };
        let decode = match kernels {
            KERNELS_GENERAL => None,
            // The decode kernel takes a call of the automatic choice only when every group has
            // at most 16 rows: one tile per non-empty group.
            KERNELS_AUTO => Some(abi::max_busy_groups(&sizes)),
            _ => Some(abi::max_tiles(&sizes, SMALL_TILE_M)),
        };
        let decode = match decode {
            None => None,
            Some(tiles) => {
                let max_items = to_u32(tiles * WeightTiles::new(GemmConfig::DECODE, n).count() as u64, "decode tiles")?;
                let launch = sm90::gemm_launch(GemmConfig::DECODE, max_items, sm_count);
                Some(Sm90DeviceGemm { config: GemmConfig::DECODE, max_items, max_list: max_items, launch })
            }
        };
        let config = general_config(general);
        let wgs = config.consumer_warpgroups();
        let costs = [stage_cost(config, config.block_m, wgs), stage_cost(config, config.narrow, wgs)];
        let (mut lpt_grid, mut general_gemm) = (0, None);
        if kernels != KERNELS_DECODE {
            let max_items =
                to_u32(abi::max_m_tiles(&sizes) * WeightTiles::new(config, n).count() as u64, "output tiles")?;
            // Host-sized plans balance over the grid `gemm_launch` gives their items: this one for
            // any list longer than it.
            let grid = sm90::gemm_launch(config, max_items, sm_count).grid;
            if grid <= LPT_MAX_CTAS && lpt_fits_u32(max_items, grid, costs) {
                lpt_grid = grid;
            }
            let max_list = to_u32(lpt_list_capacity(max_items, lpt_grid, costs), "list entries")?;
            let launch = sm90::gemm_launch(config, max_list, sm_count);
            debug_assert!(lpt_grid == 0 || launch.grid == lpt_grid);
            general_gemm = Some(Sm90DeviceGemm { config, max_items, max_list, launch });
        }
        let max_dequant_ctas = if activations.is_some() {
            0
        } else if sizes.layout == abi::LAYOUT_MASKED {
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
        Ok(Sm90DeviceLayout {
            problem: problem.clone(),
            kernels,
            general,
            sizes,
            token_heights: if general_gemm.is_some() { config.block_m } else { SMALL_TILE_M },
            gemms: [decode, general_gemm],
            lpt_grid,
            costs,
            max_dequant_ctas,
            workspace_bytes: if activations.is_some() {
                0
            } else {
                TokenWorkspace::bytes(problem.token_rows(), problem.k())
            },
            // The kernel takes the scheduled CTAs grid-strided: at most what the GPU holds at once.
            dequant: sm90::dequant_launch(
                max_dequant_ctas.min(sm_count.saturating_mul(sm90::DEQUANT_GRID_CTAS_PER_SM)),
            ),
            caller_dequantizes: options.caller_dequantizes && activations.is_none(),
            activations,
            decode_alone: false,
            prefill_sized: false,
            general_first: kernels == KERNELS_AUTO && options.kernels == MoeKernels::AutoGeneralFirst,
        })
    }

    /// Tells the layout that the calls that follow have at most `rows` rows in all their groups
    /// together (`None`: no bound beyond the problem's). At most 16 rows keep every group within
    /// one decode tile, so a plan of both kernels launches the decode kernel alone (and its
    /// scheduler with the decode kernel's choice); above that, both: the general kernel first
    /// when `rows` exceeds 16 per group, else the decode kernel first (or as the options say).
    pub fn set_routed_rows(&mut self, rows: Option<usize>) {
        let auto = self.kernels == KERNELS_AUTO;
        self.decode_alone = auto && rows.is_some_and(|r| r <= SMALL_TILE_M as usize);
        let per_group = SMALL_TILE_M as usize * self.sizes.groups as usize;
        self.prefill_sized = auto && rows.is_some_and(|r| r > per_group);
    }

    /// The scheduler's kernel choice for the calls that follow.
    fn call_kernels(&self) -> u32 {
        if self.decode_alone {
            KERNELS_DECODE
        } else {
            self.kernels
        }
    }

    /// The GEMM kernel of configuration `config` (its W4A16 twin for W4A16).
    pub fn gemm_kernel(&self, config: GemmConfig) -> &'static str {
        match self.activations {
            None => config.kernel_name(),
            Some(activations) => config.w4a16_kernel_name(activations),
        }
    }

    /// Index of the token map with 1-row boxes (`h` rows: `+ h − 1`) in the table of launch
    /// `slot` (`[decode, general]`), which starts [`Self::map_base`] maps in.
    pub fn token_maps(&self, slot: usize) -> u32 {
        self.map_shift() + 2 * self.sizes.groups - self.map_base(slot)
    }

    /// Where the token map with 1-row boxes is in the whole table.
    fn first_token_map(&self) -> usize {
        (self.map_shift() + 2 * self.sizes.groups) as usize
    }

    /// Maps in the table.
    pub fn map_count(&self) -> usize {
        self.first_token_map() + self.token_heights as usize
    }

    /// Where group `g`'s weight map for launch `slot` is in the whole table.
    fn weight_map(&self, slot: usize, g: u32) -> usize {
        self.map_base(slot) as usize + sm90::weight_map_index(g)
    }

    /// The address the token maps cover: the plan's f16 workspace, or for W4A16 the call's
    /// activations.
    fn token_base(&self, buffers: &MoeBuffers, at: &Tables) -> u64 {
        match self.activations {
            None => at.workspace,
            Some(_) => buffers.a.base(),
        }
    }

    /// The GEMMs' activation epilogue for `call` (all zero without one: C is stored).
    pub fn epilogue_params(&self, call: Option<&MoeBuffers>) -> ActivationEpilogueParams {
        match (self.problem.activation_epilogue(), call.and_then(|b| b.activated)) {
            (Some(e), Some(out)) => {
                let (global_scale, group_scales) = match out.global_scale {
                    GlobalScale::Tensor(s) => (s, 0),
                    GlobalScale::PerGroup(v) => (1.0, v.ptr),
                };
                ActivationEpilogueParams {
                    values: out.values.ptr,
                    scales: out.scales.ptr,
                    group_scales,
                    global_scale,
                    activation: e.activation as u32,
                    gated: e.gated as u32,
                    reserved: 0,
                }
            }
            _ => ActivationEpilogueParams::default(),
        }
    }

    /// The scheduler's parameters for `buffers` over the memory at `at`.
    pub fn schedule_params(&self, buffers: &MoeBuffers, at: &Tables) -> Sm90ScheduleParams {
        let per_kernel = |f: &dyn Fn(&Sm90DeviceGemm) -> u32| self.gemms.map(|g| g.as_ref().map_or(0, f));
        Sm90ScheduleParams {
            common: schedule_common(&self.problem, buffers, at),
            // Unused for W4A16 (the GEMM reads the activations through the token maps only).
            a_values: if self.activations.is_some() { 0 } else { buffers.a.base() },
            workspace: self.token_base(buffers, at),
            work_len: [0, 1].map(|slot| if self.gemms[slot].is_some() { at.work_len[slot] } else { 0 }),
            ranks: at.ranks,
            kernels: self.call_kernels(),
            general: self.general,
            token_maps: [0, 1].map(|slot| self.token_maps(slot)),
            lpt_grid: self.lpt_grid,
            max_items: per_kernel(&|g| g.max_items),
            max_list: per_kernel(&|g| g.max_list),
            costs: self.costs,
            reserved: 0,
        }
    }
}

/// The scheduler's exported name.
pub const SCHEDULE: &str = "sm90_schedule";

/// A device-sized sm_90a plan: the group table's size-independent fields and the weight and
/// token maps from the host; the scheduler writes the rest per call.
impl Layout for Sm90DeviceLayout {
    type Group = GroupParams;
    type Call = MoeBuffers;
    const ARCH: Arch = Arch::Sm90a;

    fn memory(&self) -> Memory {
        let work_items = self.gemms.iter().flatten().map(|g| g.max_list as usize).max().unwrap_or(0);
        Memory {
            groups: self.sizes.groups as usize,
            maps: self.map_count(),
            work: [WorkList::Capacity(work_items * size_of::<WorkItem>()), WorkList::None],
            workspace_bytes: self.workspace_bytes,
            ranks: if self.lpt_grid > 0 { self.gemms[1].map_or(0, |g| g.max_items as usize) } else { 0 },
        }
    }

    fn encode_fixed<E: TiledMapEncoder>(&self, encoder: &E, at: &Tables, maps: &mut [TensorMap]) -> Result<()> {
        let (rows, n, k) = (self.problem.token_rows() as u32, self.problem.n() as u32, self.problem.k() as u32);
        for (slot, gemm) in self.gemms.iter().enumerate() {
            if let Some(gemm) = gemm {
                for g in 0..self.sizes.groups {
                    maps[self.weight_map(slot, g)] =
                        encoder.encode(&sm90::weight_map_for(gemm.config, n, k), PLACEHOLDER_BASE)?;
                }
            }
        }
        // W4A4's tokens are in the plan's workspace; W4A16's in the call's activations.
        let tokens = if self.activations.is_none() { at.workspace } else { PLACEHOLDER_BASE };
        for h in 1..=self.token_heights {
            maps[self.first_token_map() + h as usize - 1] =
                encoder.encode(&sm90::token_map_with_box(rows, k, h), tokens)?;
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
        let (n, k) = (self.problem.n() as u32, self.problem.k() as u32);
        for (g, ((values, scales), &alpha)) in call.weights.iter().zip(&call.alphas).enumerate() {
            groups[g] = GroupParams { n, k, alpha, b_scales: scales.ptr, ..GroupParams::default() };
            for slot in [0, 1].into_iter().filter(|&s| self.gemms[s].is_some()) {
                encoder.replace_address(&mut maps[self.weight_map(slot, g as u32)], values.ptr)?;
            }
        }
        if self.activations.is_some() {
            for h in 1..=self.token_heights {
                encoder.replace_address(&mut maps[self.first_token_map() + h as usize - 1], call.a.base())?;
            }
        }
        Ok(())
    }

    fn signature(&self, call: &MoeBuffers, out: &mut Vec<u64>) {
        for ((values, scales), alpha) in call.weights.iter().zip(&call.alphas) {
            out.extend([values.ptr, scales.ptr, u64::from(alpha.to_bits())]);
        }
        if self.activations.is_some() {
            // The token maps hold the activations' address.
            out.push(call.a.base());
        }
    }

    fn launches(&self, call: Option<&MoeBuffers>, at: &Tables, out: &mut Vec<Launch>) {
        let (groups, output) = (self.sizes.groups, self.problem.output());
        let schedule = match call {
            Some(b) => self.schedule_params(b, at),
            None => Sm90ScheduleParams::default(),
        };
        // The scheduler executes `griddepcontrol.wait` before it reads anything.
        out.push(Launch {
            kernel: SCHEDULE,
            geometry: schedule_geometry(groups),
            start: Start::Early,
            params: Params::of(&schedule),
        });
        if self.activations.is_none() && !self.caller_dequantizes {
            // The dequantization reads the scheduler's table after its `griddepcontrol.wait`.
            out.push(Launch {
                kernel: sm90::DEQUANT_KERNEL,
                geometry: self.dequant,
                start: Start::Early,
                params: Params::of(&at.kernel_params(0, 0, 0, groups as usize, output)),
            });
        }
        let epilogue = self.epilogue_params(call);
        let mut first_gemm = true;
        // Either order is safe: each GEMM reads the scheduler's tables only after a launch that
        // started after the scheduler ended (below), and waits before its first token load.
        let general_first = self.general_first || self.prefill_sized;
        let order = [kernel_slot(!general_first), kernel_slot(general_first)];
        for slot in order {
            if self.decode_alone && slot == kernel_slot(false) {
                continue;
            }
            if let Some(gemm) = &self.gemms[slot] {
                let mut params = KernelParams {
                    epilogue,
                    ..at.kernel_params(0, gemm.max_list, at.work_len[slot], groups as usize, output)
                };
                params.tensor_maps += u64::from(self.map_base(slot)) * TENSOR_MAP_BYTES as u64;
                // The GEMM may start while the launch before it runs. W4A4: the scheduler's
                // tables it reads first were complete before the dequantization's wait returned
                // (or, with the caller's dequantization, before the first GEMM started: that one
                // starts after the scheduler ends), and it waits before its first token load.
                // W4A16: it waits before reading anything (`w4a16::GEMM_WAITS_FIRST`).
                let start = if self.activations.is_some() {
                    super::W4A16_GEMM_START
                } else if self.caller_dequantizes && first_gemm {
                    Start::AfterPrevious
                } else {
                    super::GEMM_AFTER_DEQUANT
                };
                first_gemm = false;
                out.push(Launch {
                    kernel: self.gemm_kernel(gemm.config),
                    geometry: gemm.launch,
                    start,
                    params: Params::of(&params),
                });
            }
        }
        debug_assert_eq!(kernel_slot(true), 0);
    }

    fn call_independent_launches(&self) -> bool {
        // The scheduler's parameters hold the call's sizes, tokens and C.
        false
    }

    fn describe(&self) -> (String, usize) {
        let words: Vec<String> = self
            .gemms
            .iter()
            .flatten()
            .map(|g| {
                format!(
                    "{}: swap-AB wgmma m64nNk16, tile Nx{} (N = {}), {} stages of K {}",
                    self.gemm_kernel(g.config),
                    sm90::BLOCK_N,
                    super::widths(g.config),
                    g.config.stages,
                    g.config.block_k()
                )
            })
            .collect();
        let choice = if words.len() > 1 { " (the decode one when no group has more than 16 tokens)" } else { "" };
        let tiles = self.gemms.iter().flatten().map(|g| g.max_items as usize).max().unwrap_or(0);
        (format!("{SCHEDULE} (device sizes → work list) + {}{choice}", words.join(" or ")), tiles)
    }

    fn alpha_field(&self) -> AlphaField {
        AlphaField::of::<GroupParams>(sm90::GROUP_ALPHA_OFFSET)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::encode_tables;
    use crate::engine::testing::{base, launches, FakeEncoder};
    use crate::moe_problem::{MoeProblem, MoeTokens, TokenLayout};
    use crate::problem::BufferView;
    use crate::problem::OutputType;
    use nvfp4_gemm_abi::moe::sm90::GENERAL_CONFIGS;
    use nvfp4_gemm_abi::sm90::KernelParams;

    fn layout(problem: &MoeProblem, kernels: MoeKernels, tail64: bool) -> Sm90DeviceLayout {
        Sm90DeviceLayout::new(problem, 132, &MoeOptions { kernels, tail64, spans192: false, caller_dequantizes: false })
            .unwrap()
    }

    /// The dequantization bound holds for every split of the tokens (exhaustive on small cases).
    #[test]
    fn dequant_bound_is_an_upper_bound() {
        for (groups, t, k) in [(3usize, 700usize, 64usize), (5, 300, 4096), (2, 40, 8192)] {
            let p =
                MoeProblem::new(groups, 128, k, TokenLayout::Contiguous { max_tokens: t }, OutputType::F16).unwrap();
            let l = layout(&p, MoeKernels::Auto, false);
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
        assert_eq!(layout(&m, MoeKernels::Auto, false).max_dequant_ctas, 4 * sm90::dequant_ctas(8, 7168));
    }

    /// Bounds under which no group can exceed 16 tokens launch the decode kernel alone; others
    /// what the options say.
    #[test]
    fn kernels_follow_the_bounds_and_options() {
        let p = |layout| MoeProblem::new(64, 256, 512, layout, OutputType::F16).unwrap();
        let kinds = |l: &Sm90DeviceLayout| l.gemms.map(|g| g.map(|g| g.config));
        let masked16 = layout(&p(TokenLayout::Masked { max_rows: 16 }), MoeKernels::General, false);
        assert_eq!((masked16.kernels, kinds(&masked16)), (KERNELS_DECODE, [Some(GemmConfig::DECODE), None]));
        let g = masked16.gemms[0].unwrap();
        assert_eq!((g.max_items, g.launch), (64 * 2, sm90::gemm_launch(GemmConfig::DECODE, 128, 132)));
        assert_eq!(masked16.token_heights, 16);
        let contiguous = p(TokenLayout::Contiguous { max_tokens: 553 });
        let auto = layout(&contiguous, MoeKernels::Auto, false);
        assert_eq!((auto.kernels, kinds(&auto)), (KERNELS_AUTO, [Some(GemmConfig::DECODE), Some(GemmConfig::GENERAL)]));
        // Auto: the decode kernel runs only when every group has ≤ 16 rows: one tile per
        // non-empty group; forced, every group in 16-row tiles.
        assert_eq!(auto.gemms[0].unwrap().max_items, 64 * 2);
        let decode = layout(&contiguous, MoeKernels::Decode, false);
        assert_eq!((decode.kernels, kinds(&decode)), (KERNELS_DECODE, [Some(GemmConfig::DECODE), None]));
        assert_eq!(decode.gemms[0].unwrap().max_items, (64 + (553 - 64) / 16) * 2);
        let general = layout(&contiguous, MoeKernels::General, true);
        assert_eq!((general.kernels, kinds(&general)), (KERNELS_GENERAL, [None, Some(GemmConfig::T64)]));
        assert_eq!(general.token_heights, 128);
        assert_eq!(GENERAL_CONFIGS[general.general as usize], GemmConfig::T64);
        assert_eq!(general.costs, [228, 164]);
        assert_eq!(auto.costs, [228, 116]);
    }

    #[test]
    fn general_list_capacity_and_grid() {
        // 64 + (553 − 64)/128 = 67 token tiles × 2 weight tiles = 134 items > 132 CTAs: balanced.
        let p = MoeProblem::new(64, 256, 512, TokenLayout::Contiguous { max_tokens: 553 }, OutputType::F16).unwrap();
        let l = layout(&p, MoeKernels::Auto, false);
        let g = l.gemms[1].unwrap();
        assert_eq!((g.max_items, l.lpt_grid), (134, 132));
        assert_eq!(g.max_list as u64, lpt_list_capacity(134, 132, [228, 116]));
        assert_eq!(g.launch, sm90::gemm_launch(GemmConfig::GENERAL, g.max_list, 132));
        assert_eq!(l.memory().work[0], WorkList::Capacity(g.max_list as usize * size_of::<WorkItem>()));
        assert_eq!(l.memory().ranks, 134);
        // Fewer items than CTAs: the plain order.
        let p = MoeProblem::new(4, 256, 512, TokenLayout::Contiguous { max_tokens: 300 }, OutputType::F16).unwrap();
        let l = layout(&p, MoeKernels::General, false);
        assert_eq!((l.gemms[1].unwrap().max_items, l.gemms[1].unwrap().max_list), (12, 12));
        assert_eq!(l.gemms[1].unwrap().launch.grid, 12);
    }

    /// `spans192`: the general kernel is `N192` over N's fixed spans (7168 rows: two of 128, 36 of
    /// 192); not with the activation epilogue. Beside the decode kernel:
    /// `paired_decode_and_n192_tables`.
    #[test]
    fn spans192_runs_n192_over_fixed_spans() {
        use nvfp4_gemm_abi::moe::block::Activation;
        let p = MoeProblem::new(8, 7168, 2048, TokenLayout::Contiguous { max_tokens: 1000 }, OutputType::Bf16).unwrap();
        let options =
            MoeOptions { kernels: MoeKernels::General, tail64: true, spans192: true, caller_dequantizes: false };
        let l = Sm90DeviceLayout::new(&p, 132, &options).unwrap();
        let general = l.gemms[1].unwrap();
        assert!(l.gemms[0].is_none());
        assert_eq!((general_config(l.general), general.config), (GemmConfig::N192, GemmConfig::N192));
        assert_eq!(general.max_items as u64, abi::max_m_tiles(&l.sizes) * 38);
        assert_eq!((general.launch.block, l.token_heights, l.map_shift()), (512, 128, 0));
        // Bounds the decode kernel holds alone: no general kernel.
        let auto = MoeOptions { kernels: MoeKernels::Auto, ..options };
        let small =
            MoeProblem::new(8, 7168, 2048, TokenLayout::Contiguous { max_tokens: 16 }, OutputType::Bf16).unwrap();
        let s = Sm90DeviceLayout::new(&small, 132, &auto).unwrap();
        assert_eq!((s.kernels, s.map_shift()), (KERNELS_DECODE, 0));
        let wgs = GemmConfig::N192.consumer_warpgroups();
        assert_eq!(l.costs, [stage_cost(GemmConfig::N192, 128, wgs), stage_cost(GemmConfig::N192, 64, wgs)]);
        assert!(l.describe().0.contains("sm90_grouped_gemm_n192"), "{}", l.describe().0);
        // The activation epilogue keeps the 128-row kernel (`tail64` then applies).
        let fused = p.with_activation_epilogue(Activation::Silu, true).unwrap();
        let l = Sm90DeviceLayout::new(&fused, 132, &options).unwrap();
        assert_eq!((l.gemms[1].unwrap().config, l.map_shift()), (GemmConfig::T64, 0));
        assert!(MoeOptions::default().spans192 && MoeOptions::default().kernels == MoeKernels::Auto);
    }

    /// `Auto` with `spans192`: one map more in front; `N192`'s weight maps (192-row boxes) at
    /// `[2g + 1]`, the decode kernel's (128-row) at `[2g + 2]`, which its launch (one map further
    /// in) reads as `[2g + 1]`; the token maps after them, at the index each launch's scheduler
    /// parameters say.
    #[test]
    fn paired_decode_and_n192_tables() {
        let p = MoeProblem::new(4, 320, 512, TokenLayout::Contiguous { max_tokens: 300 }, OutputType::Bf16).unwrap();
        let options =
            MoeOptions { kernels: MoeKernels::Auto, tail64: false, spans192: true, caller_dequantizes: false };
        let l = Sm90DeviceLayout::new(&p, 132, &options).unwrap();
        assert_eq!(l.gemms.map(|g| g.map(|g| g.config)), [Some(GemmConfig::DECODE), Some(GemmConfig::N192)]);
        assert_eq!((l.map_shift(), l.map_base(0), l.map_base(1)), (1, 1, 0));
        assert_eq!((l.token_maps(0), l.token_maps(1), l.map_count()), (8, 9, 1 + 8 + 128));
        let buffers = four_groups(&p);
        let tables =
            Tables { groups: 1, maps: 0x1000, work: [3, 0], work_len: [4, 8], status: 5, ranks: 6, workspace: 7 };
        let (_, maps) = encode_tables(&l, &FakeEncoder, &buffers, &tables).unwrap();
        let map = |m: nvfp4_gemm_abi::tensor_map::TiledMap<2>, at: u64| FakeEncoder.encode(&m, at).unwrap();
        for g in 0..4usize {
            let at = 0x10_0000 * (g as u64 + 1);
            assert!(maps[2 * g + 1] == map(sm90::weight_map_for(GemmConfig::N192, 320, 512), at), "group {g}");
            assert!(maps[2 * g + 2] == map(sm90::weight_map_for(GemmConfig::DECODE, 320, 512), at), "group {g}");
        }
        assert!(maps[0] == TensorMap::ZERO, "the spare map in front");
        assert!((1..=128).all(|h| maps[8 + h] == map(sm90::token_map_with_box(300, 512, h as u32), 7)), "token maps");
        assert_eq!(l.schedule_params(&buffers, &tables).token_maps, [8, 9]);
        let all = launches(&l, Some(&buffers), &tables);
        let kp = |i: usize| all[i].params.get::<KernelParams>().unwrap();
        assert_eq!((all[2].kernel, all[3].kernel), ("sm90_grouped_gemm_decode", "sm90_grouped_gemm_n192"));
        assert_eq!((kp(2).tensor_maps, kp(3).tensor_maps), (0x1000 + 128, 0x1000));
        // Each launch's token index lands on the same map of the table.
        assert_eq!(l.map_base(0) + l.token_maps(0), l.map_base(1) + l.token_maps(1));
    }

    /// An activation-epilogue problem runs the general kernel alone (also for bounds a decode
    /// tile holds), its GEMM launches carry the epilogue's outputs and scales, the
    /// dequantization's none.
    #[test]
    fn activation_epilogue_parameters() {
        use crate::moe_problem::ActivatedOutput;
        use nvfp4_gemm_abi::moe::block::Activation;
        let small = MoeProblem::new(4, 256, 512, TokenLayout::Contiguous { max_tokens: 16 }, OutputType::Bf16).unwrap();
        assert_eq!(layout(&small, MoeKernels::Auto, false).kernels, KERNELS_DECODE);
        let fused = small.with_activation_epilogue(Activation::GeluTanh, true).unwrap();
        for tail64 in [false, true] {
            let l = layout(&fused, MoeKernels::Decode, tail64);
            assert_eq!(l.kernels, KERNELS_GENERAL);
            assert!(l.gemms[0].is_none() && l.gemms[1].is_some_and(|g| g.config == general_config(tail64 as u32)));
        }
        let l = layout(&fused, MoeKernels::Auto, false);
        let (a, w, z) = (fused.a_sizes(), fused.b_sizes(), fused.activated_sizes().unwrap());
        let v = |ptr: u64, len| BufferView { ptr, len };
        let buffers = MoeBuffers {
            sizes: v(0x100, 5),
            a: MoeTokens::Nvfp4 { values: v(0x1000, a.values), scales: v(0x2_0000, a.scales) },
            weights: (0..4)
                .map(|g| (v(0x100_0000 * (g + 1), w.values), v(0x100_0000 * (g + 1) + 0x8_0000, w.scales)))
                .collect(),
            alphas: vec![1.0; 4],
            c: v(0x3000, 0),
            c_type: OutputType::Bf16,
            activated: Some(ActivatedOutput {
                values: v(0x5_0000, z.values),
                scales: v(0x6_0000, z.scales),
                global_scale: GlobalScale::PerGroup(v(0x7_0000, 4)),
            }),
        };
        crate::moe_problem::validate_moe_buffers(&fused, &buffers).unwrap();
        let tables = Tables { groups: 1, maps: 2, work: [3, 0], work_len: [4, 8], status: 5, ranks: 6, workspace: 7 };
        let all = launches(&l, Some(&buffers), &tables);
        let names: Vec<_> = all.iter().map(|l| l.kernel).collect();
        assert_eq!(names, ["sm90_schedule", "sm90_dequant_tokens", "sm90_grouped_gemm"]);
        let kp = |i: usize| all[i].params.get::<KernelParams>().unwrap();
        assert_eq!(kp(1).epilogue, ActivationEpilogueParams::default());
        assert_eq!(
            kp(2).epilogue,
            ActivationEpilogueParams {
                values: 0x5_0000,
                scales: 0x6_0000,
                group_scales: 0x7_0000,
                global_scale: 1.0,
                activation: Activation::GeluTanh as u32,
                gated: 1,
                reserved: 0,
            }
        );
        let one = MoeBuffers {
            activated: buffers.activated.map(|o| ActivatedOutput { global_scale: GlobalScale::Tensor(0.25), ..o }),
            ..buffers.clone()
        };
        let e = l.epilogue_params(Some(&one));
        assert_eq!((e.group_scales, e.global_scale), (0, 0.25));
        assert_eq!(l.epilogue_params(None), ActivationEpilogueParams::default());
    }

    /// Buffers of a 4-group W4A4 call of `p` (bf16 C): sizes at 0x100, A at 0x1000 / 0x2000,
    /// group `g`'s weights at `0x10_0000 · (g + 1)` and its scales 0x8000 after, C at 0x3000.
    fn four_groups(p: &MoeProblem) -> MoeBuffers {
        let a = p.a_sizes();
        let v = |ptr: u64, len| BufferView { ptr, len };
        MoeBuffers {
            sizes: v(0x100, 5),
            a: MoeTokens::Nvfp4 { values: v(0x1000, a.values), scales: v(0x2000, a.scales) },
            weights: (0..4).map(|g| (v(0x10_0000 * (g + 1), 0), v(0x10_0000 * (g + 1) + 0x8000, 0))).collect(),
            alphas: vec![0.5, 1.0, 2.0, 4.0],
            c: v(0x3000, p.c_elements()),
            c_type: OutputType::Bf16,
            activated: None,
        }
    }

    #[test]
    fn tables_and_parameters() {
        let p = MoeProblem::new(4, 256, 512, TokenLayout::Contiguous { max_tokens: 300 }, OutputType::Bf16).unwrap();
        let l = layout(&p, MoeKernels::Auto, false);
        assert_eq!((l.token_maps(0), l.token_maps(1), l.map_shift(), l.map_count()), (8, 8, 0, 8 + 128));
        assert_eq!(l.workspace_bytes, 300 * 512 * 2);
        let buffers = four_groups(&p);
        let tables = Tables { groups: 1, maps: 2, work: [3, 0], work_len: [4, 8], status: 5, ranks: 6, workspace: 7 };
        let (groups, maps) = encode_tables(&l, &FakeEncoder, &buffers, &tables).unwrap();
        assert_eq!(
            groups[2],
            GroupParams { n: 256, k: 512, alpha: 2.0, b_scales: 0x30_8000, ..GroupParams::default() }
        );
        assert_eq!(base(&maps[sm90::weight_map_index(2)]), 0x30_0000);
        assert!((1..=128).all(|h| base(&maps[(l.token_maps(0) + h - 1) as usize]) == 7), "token maps: the workspace");
        let s = l.schedule_params(&buffers, &tables);
        assert_eq!(
            s.common.sizes,
            DeviceSizes { sizes: 0x100, layout: abi::LAYOUT_CONTIGUOUS, groups: 4, rows: 300, reserved: 0 }
        );
        assert_eq!((s.common.groups, s.common.work, s.common.status, s.ranks, s.workspace), (1, 3, 5, 6, 7));
        assert_eq!((s.a_values, s.common.a_scales, s.common.c), (0x1000, 0x2000, 0x3000));
        assert_eq!(
            (s.work_len, s.kernels, s.token_maps, s.common.k, s.common.n),
            ([4, 8], KERNELS_AUTO, [8, 8], 512, 256)
        );
        // Decode: one tile per non-empty group (4), general: min(4, 300) + 296/128 = 6 token tiles;
        // × 2 weight tiles, fewer than the CTAs: the plain order.
        assert_eq!((s.max_items, s.max_list, s.lpt_grid), ([8, 12], [8, 12], 12));
        let all = launches(&l, Some(&buffers), &tables);
        let names: Vec<_> = all.iter().map(|l| l.kernel).collect();
        assert_eq!(names, ["sm90_schedule", "sm90_dequant_tokens", "sm90_grouped_gemm_decode", "sm90_grouped_gemm"]);
        assert_eq!(all[0].params.get::<Sm90ScheduleParams>(), Some(s));
        let kp = |i: usize| all[i].params.get::<KernelParams>().unwrap();
        assert!(all[2..].iter().all(|l| l.start == super::super::GEMM_AFTER_DEQUANT));
        assert_eq!((kp(2).work_len, kp(2).work_len_device), (8, 4));
        assert_eq!((kp(3).work_len, kp(3).work_len_device, kp(3).out_bf16), (12, 8, 1));
        assert_eq!(kp(1).work_len_device, 0);
        let decode_only = layout(&p, MoeKernels::Decode, false).schedule_params(&buffers, &tables);
        assert_eq!((decode_only.work_len, decode_only.kernels), ([4, 0], KERNELS_DECODE));

        // Calls of at most 16 routed rows: the decode kernel alone, its scheduler told so; the
        // same lists' bounds. More rows, or no bound: both kernels again.
        let mut bounded = l.clone();
        let names =
            |l: &Sm90DeviceLayout| launches(l, Some(&buffers), &tables).iter().map(|l| l.kernel).collect::<Vec<_>>();
        for rows in [Some(0), Some(1), Some(16)] {
            bounded.set_routed_rows(rows);
            assert_eq!(
                names(&bounded),
                ["sm90_schedule", "sm90_dequant_tokens", "sm90_grouped_gemm_decode"],
                "{rows:?}"
            );
            let b = bounded.schedule_params(&buffers, &tables);
            assert_eq!(b, Sm90ScheduleParams { kernels: KERNELS_DECODE, ..s }, "{rows:?}");
        }
        for rows in [Some(17), None] {
            bounded.set_routed_rows(rows);
            assert_eq!(names(&bounded), names(&l), "{rows:?}");
            assert_eq!(bounded.schedule_params(&buffers, &tables), s, "{rows:?}");
        }
        // The general kernel first: the same launches and parameters, the two GEMMs swapped;
        // the scheduler told the same. With 16 routed rows or fewer, the decode kernel alone.
        let mut first = layout(&p, MoeKernels::AutoGeneralFirst, false);
        assert_eq!((first.kernels, first.general_first, &first.gemms), (KERNELS_AUTO, true, &l.gemms));
        assert_eq!(first.schedule_params(&buffers, &tables), s);
        let swapped = launches(&first, Some(&buffers), &tables);
        let order = |v: &[Launch]| v.iter().map(|l| (l.kernel, l.start, l.params)).collect::<Vec<_>>();
        let mut want = order(&all);
        want.swap(2, 3);
        assert_eq!(order(&swapped), want);
        first.set_routed_rows(Some(16));
        assert_eq!(names(&first), ["sm90_schedule", "sm90_dequant_tokens", "sm90_grouped_gemm_decode"]);
        // Told of more than 16 routed rows per group (4 groups here): the general kernel first,
        // as that option orders them; up to 16 per group, the decode kernel first.
        bounded.set_routed_rows(Some(64));
        assert_eq!(order(&launches(&bounded, Some(&buffers), &tables)), order(&all));
        bounded.set_routed_rows(Some(65));
        assert_eq!(order(&launches(&bounded, Some(&buffers), &tables)), want);
        assert_eq!(bounded.schedule_params(&buffers, &tables), s);
        // Paired with `N192` (two weight maps per group): each GEMM keeps its table base.
        let paired = |kernels| {
            let l = Sm90DeviceLayout::new(&p, 132, &MoeOptions { kernels, ..MoeOptions::default() }).unwrap();
            let bases: Vec<_> = launches(&l, Some(&buffers), &tables)[2..]
                .iter()
                .map(|g| (g.kernel, g.params.get::<KernelParams>().unwrap().tensor_maps))
                .collect();
            (l.map_shift(), bases)
        };
        let (shift, mut bases) = paired(MoeKernels::Auto);
        assert_eq!(shift, 1);
        bases.reverse();
        assert_eq!(paired(MoeKernels::AutoGeneralFirst), (1, bases));
        // Bounds that keep every group within one decode tile: the decode kernel alone.
        let small = MoeProblem::new(4, 256, 512, TokenLayout::Contiguous { max_tokens: 16 }, OutputType::Bf16).unwrap();
        let small = layout(&small, MoeKernels::AutoGeneralFirst, false);
        assert_eq!((small.kernels, small.general_first), (KERNELS_DECODE, false));

        // A plan of one kernel keeps it.
        let mut general = layout(&p, MoeKernels::General, false);
        let before = names(&general);
        general.set_routed_rows(Some(1));
        assert_eq!((names(&general), general.decode_alone), (before.clone(), false));
        general.set_routed_rows(Some(100_000));
        assert_eq!((names(&general), general.prefill_sized), (before, false));

        // The caller dequantizes: the same tables, lists and workspace, no dequantization launch;
        // the first GEMM launch starts after the scheduler ends, the one after it early. Told to
        // run the decode kernel alone, that one starts after the scheduler. W4A16 has nothing to
        // dequantize: the option changes nothing there.
        let options = MoeOptions {
            kernels: MoeKernels::Auto,
            spans192: false,
            caller_dequantizes: true,
            ..MoeOptions::default()
        };
        let mut caller = Sm90DeviceLayout::new(&p, 132, &options).unwrap();
        assert!(caller.caller_dequantizes);
        assert_eq!((&caller.gemms, caller.workspace_bytes), (&l.gemms, l.workspace_bytes));
        assert_eq!(caller.schedule_params(&buffers, &tables), s);
        let all = launches(&caller, Some(&buffers), &tables);
        let starts: Vec<_> = all.iter().map(|l| (l.kernel, l.start)).collect();
        assert_eq!(
            starts,
            [
                ("sm90_schedule", Start::Early),
                ("sm90_grouped_gemm_decode", Start::AfterPrevious),
                ("sm90_grouped_gemm", super::super::GEMM_AFTER_DEQUANT)
            ]
        );
        caller.set_routed_rows(Some(16));
        let starts: Vec<_> = launches(&caller, Some(&buffers), &tables).iter().map(|l| (l.kernel, l.start)).collect();
        assert_eq!(starts, [("sm90_schedule", Start::Early), ("sm90_grouped_gemm_decode", Start::AfterPrevious)]);
        let dense = Sm90DeviceLayout::new(
            &p.clone().with_tokens(crate::problem::TokenKind::Dense(Activations::F16)),
            132,
            &options,
        )
        .unwrap();
        assert!(!dense.caller_dequantizes);

        // W4A16: the same tiles and lists; the token maps and the scheduler's token base are the
        // activations, no workspace, no dequantization, the W4A16 twins started early.
        let dense_problem = |a| p.clone().with_tokens(crate::problem::TokenKind::Dense(a));
        let w = layout(&dense_problem(Activations::F16), MoeKernels::Auto, false);
        assert_eq!((&w.gemms, w.token_heights, w.workspace_bytes, w.memory().workspace_bytes), (&l.gemms, 128, 0, 0));
        let dense = MoeBuffers {
            a: MoeTokens::Dense { activations: BufferView { ptr: 0x4000, len: 300 * 512 }, kind: Activations::F16 },
            ..buffers.clone()
        };
        let ws = w.schedule_params(&dense, &tables);
        assert_eq!((ws.a_values, ws.common.a_scales, ws.workspace), (0, 0, 0x4000));
        assert_eq!((ws.max_items, ws.max_list, ws.work_len), (s.max_items, s.max_list, s.work_len));
        let (_, maps) = encode_tables(&w, &FakeEncoder, &dense, &tables).unwrap();
        assert!(
            (1..=128).all(|h| base(&maps[(w.token_maps(0) + h - 1) as usize]) == 0x4000),
            "token maps: the activations"
        );
        let all = launches(&w, Some(&dense), &tables);
        let names: Vec<_> = all.iter().map(|l| l.kernel).collect();
        assert_eq!(names, ["sm90_schedule", "sm90_w4a16_gemm_decode", "sm90_w4a16_gemm"]);
        assert!(all.iter().all(|l| l.start == Start::Early));
        let lens: Vec<_> = all[1..]
            .iter()
            .map(|l| l.params.get::<KernelParams>().map(|p| (p.work_len, p.work_len_device)).unwrap())
            .collect();
        assert_eq!(lens, [(8, 4), (12, 8)]);
        assert!(w.describe().0.contains("sm90_w4a16_gemm_decode"));
        let bf16 = layout(&dense_problem(Activations::Bf16), MoeKernels::Auto, false);
        let names: Vec<_> = launches(&bf16, None, &tables).iter().map(|l| l.kernel).collect();
        assert_eq!(names, ["sm90_schedule", "sm90_w4a16_bf16_gemm_decode", "sm90_w4a16_bf16_gemm"]);
    }
}
