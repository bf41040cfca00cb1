//! What the device-sized layouts of both architectures share (`sm90::Sm90DeviceLayout`,
//! `sm100::Sm100DeviceLayout`): the options of a device-sized plan and the scheduler's common
//! parameters and geometry (the launches after it take `Tables::kernel_params`).

use crate::engine::Tables;
use crate::moe_problem::{MoeBuffers, MoeProblem};
use nvfp4_gemm_abi::launch::LaunchGeometry;
use nvfp4_gemm_abi::moe::schedule::{smem, ScheduleCommon, SCHEDULE_THREADS};

/// Which sm_90a GEMM kernels a device-sized plan launches (sm_100a runs one list whatever this
/// says). The kernels are fixed when the plan is made (a captured graph replays them); which one
/// does the work is decided on the device, per call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
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
    /// As [`MoeKernels::Auto`], the general kernel launched first: the launch that finds no work
    /// is then the decode kernel's after a prefill-sized call, the general kernel's before a
    /// decode-sized one (with `Auto` the other way round), for plans that serve mostly
    /// prefill-sized calls. `Auto` takes this order by itself for the calls it is told route
    /// more than 16 rows per group (`MoePlan::set_routed_rows`).
    AutoGeneralFirst,
}

/// Options of a device-sized plan ([`crate::moe::MoePlan::with_options`]). The default: both
/// sm_90a kernels, the general one over 192-row weight spans (`spans192`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MoeOptions {
    /// sm_90a: which GEMM kernels the plan launches.
    pub kernels: MoeKernels,
    /// sm_90a: the general kernel runs a group's last token tile 64 wide when its rows fit 64
    /// (`sm90_grouped_gemm_t64`: every other tile 128 wide), instead of 16-token tiles for
    /// groups of at most 16 tokens and 128-token tiles for the others (`sm90_grouped_gemm`).
    pub tail64: bool,
    /// sm_90a: the general kernel is `sm90_grouped_gemm_n192` (its W4A16 twin for 16-bit
    /// tokens): the 64/128 token tiles of `tail64` over weight spans of 192 rows (128 for the
    /// first one or two, fixed from N: `nvfp4_gemm_abi::moe::sm90::WeightTiles`), three consumer
    /// warpgroups, 512 threads — the configuration host-sized plans pick for most prefill-sized
    /// problems. Takes precedence over `tail64`. Beside the decode kernel (`kernels: Auto`) the
    /// plan keeps two weight maps per group (192- and 128-row boxes). A problem with the
    /// activation epilogue runs the 128-row general kernel whatever this says (the epilogue is in
    /// those kernels only). Default: on.
    pub spans192: bool,
    /// sm_90a, NVFP4 tokens: the plan launches no token dequantization; every call's tokens are
    /// in the plan's f16 workspace before the call's GEMM runs ([`crate::MoePlan::token_workspace`]),
    /// written by the kernel that quantized them (the MoE block's gather and activation). The
    /// GEMM then starts after the launch before it ends. Default: off.
    pub caller_dequantizes: bool,
}

impl Default for MoeOptions {
    fn default() -> Self {
        MoeOptions { kernels: MoeKernels::Auto, tail64: false, spans192: true, caller_dequantizes: false }
    }
}

/// The scheduler parameters both architectures share, for these buffers and the plan's memory.
pub fn schedule_common(problem: &MoeProblem, buffers: &MoeBuffers, at: &Tables) -> ScheduleCommon {
    ScheduleCommon {
        sizes: problem.device_sizes(buffers.sizes.ptr),
        groups: at.groups,
        work: at.work[0],
        status: at.status,
        a_scales: buffers.a.scales(),
        c: buffers.c.ptr,
        k: problem.k() as u32,
        n: problem.n() as u32,
    }
}

/// The scheduler's launch for `groups` groups: one CTA, its shared memory for them.
pub fn schedule_geometry(groups: u32) -> LaunchGeometry {
    LaunchGeometry { grid: 1, block: SCHEDULE_THREADS, cluster: 1, smem_bytes: smem::bytes(groups) }
}
