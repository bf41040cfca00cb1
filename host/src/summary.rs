//! What a plan reports about itself: the launches a call makes and the kernel in words. Every
//! architecture's plan (`sm90/`, `sm100/`, host- or device-sized) builds one; [`crate::plan`] and
//! [`crate::moe`] hand it to the caller.

use crate::device::Arch;
use nvfp4_gemm_abi::launch::LaunchGeometry;

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
