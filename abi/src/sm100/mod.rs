//! sm_100a (Blackwell) encodings: descriptors, TMEM plan, TMA coordinates, work-list order.
//!
//! Everything the `tcgen05` kernel and its host launcher must agree on, as typed values and
//! `const fn`s checked on the host against the seed kernel's hardware-proven constants
//! (where each comes from: docs/provenance.md; the hardware facts: docs/sm100.md):
//! - [`desc`]: shared-memory matrix descriptors (operands, scale blocks);
//! - [`instr`]: the `kind::mxf4nvf4` instruction descriptor and MMA shape;
//! - [`tmem`]: TMEM addresses and the accumulator / scale column plan;
//! - [`scale`]: which scale blocks a stage copies;
//! - [`tma`]: FP4 tensor-map parameters and box coordinates;
//! - [`config`]: the kernel variants (tiles, stages, cluster, warp roles, smem map, launch);
//! - [`schedule`]: the persistent work list;
//! - [`params`]: the kernel parameters and the kernel's additions to [`config`] (accumulator
//!   barriers, per-stage scale columns in TMEM).

pub mod config;
pub mod desc;
pub mod instr;
pub mod params;
pub mod scale;
pub mod schedule;
pub mod tma;
pub mod tmem;

/// Whether `d` divides `x` (`false` for `d = 0`). Spelled with `checked_rem` because
/// `u32::is_multiple_of` needs Rust 1.87 and the workspace declares rust-version 1.85, while
/// clippy (which does not see that rust-version from this crate) flags a bare `x % d == 0`.
pub(crate) const fn divides(d: u32, x: u32) -> bool {
    matches!(x.checked_rem(d), Some(0))
}

pub use config::{
    choose_block_n, for_block_n, select_n128, BlockN, ConfigError, KernelConfig, WarpRole, N128_DEEP, N128_SHALLOW,
    N256_CLUSTER4,
};
pub use desc::{LboMode, SmemDescriptor, SmemDescriptorFields, SmemSwizzle};
pub use instr::{InstrDescriptor, MmaShape, MmaShapeError, ScaleType};
pub use scale::{scale_block_offset, sfa_stage_copy, sfb_stage_copies, ScaleBulkCopy};
pub use schedule::{
    build_work_list, device_item_index, slot_tile_n, slots_per_m_tile, work_list_len, GroupShape, WorkItem,
    WorkListTooSmall,
};
pub use tma::{Fp4MapLayout, Fp4TensorMap, TensorMapError, TmaCoords};
pub use tmem::{ColumnRange, ScaleCopy, TmemAddress, TmemPlan, TmemPlanError};
