//! The whole MoE expert block on the GPU (docs/moe-block.md): [`ExpertBlock`] plans it once and
//! runs it per step; its kernels around the two grouped GEMMs are here as well, each over device
//! buffers given as views, for bindings and tests:
//!
//! - `route.rs`: [`BlockKernels`] — routing (`moe_route`, or the multi-CTA `moe_route_count` →
//!   `moe_route_scan` → `moe_route_scatter` for many slots: the router's `topk_ids` → rows sorted
//!   by local expert) and the weighted combine (`moe_combine`);
//! - `tokens.rs`: on [`crate::quantize::Quantizer`], the tokens gathered into the sorted rows
//!   (and quantized: W4A4) and the activation (and the requantization: W4A4);
//! - `block.rs`: [`ExpertBlock`], the chain route → tokens → first GEMM → activation → second
//!   GEMM → combine over buffers it allocates once.

mod block;
mod route;
mod tokens;

pub use crate::moe_problem::GlobalScale;
pub use block::{
    interleave_w13, load_checkpoint_experts, Activation, ActivationPlacement, BlockOptions, BlockPlan, BlockShape,
    BlockViews, Dense16, ExpertBlock, Precision, RouterWeightAt, SchedulerPlacement, TokenDequantization, TopkIds,
    TopkWeights,
};
/// The experts as the checkpoint loader returns them (`nvfp4_format::checkpoint`), what
/// [`ExpertBlock::new`] takes.
pub use nvfp4_format::checkpoint::{ExpertWeights, LoadedExperts, PlainWeight};
pub use route::{
    combine_params, route_chunks, route_params, route_params_on, route_scratch_len, BlockKernels, CombineViews, IdType,
    RouteViews, Routing, WeightType, COMBINE_CTAS_PER_SM,
};
pub use tokens::{activate_params, gather_params, Activation as KernelActivation, BlockOutput, GatherInputs};
