//! sm_90a (Hopper) kernels: configuration, parameters, and the encodings they rely on.
//!
//! Hopper has no FP4 tensor-core input, so the exact route is: dequantize both operands to f16 with
//! the block scale applied (exact: ≤ 6 significant bits), multiply with `wgmma` f16·f16→f32, apply
//! alpha in the epilogue. The kernel is *swap-AB*: it computes `C_gᵀ = B_g · A_gᵀ`, so weights (N)
//! fill wgmma's M = 64 slot and tokens (M_g, often small) become wgmma's N.
//!
//! Two launches per call:
//! 1. `sm90_dequant_tokens` turns the token operand A (small: ΣM·K) into f16 in a workspace, once,
//!    with K permuted inside each 64-wide chunk (see [`token_k_position`]);
//! 2. `sm90_grouped_gemm` streams the packed weights B through a TMA/mbarrier ring, dequantizes them
//!    in registers straight into wgmma A fragments, and reads the f16 tokens from 128-byte-swizzled
//!    shared memory as wgmma's B operand (`wgmma m64n128k16`: 128 tokens per tile, so each decoded
//!    weight fragment feeds twice the MMA work of a 64-token tile).
//!
//! The K permutation makes each thread's A fragment 16 consecutive FP4 values of one row — one scale
//! block, one 8-byte shared-memory load, one scale — at the price of storing the tokens permuted
//! identically. A dot product does not depend on the order of its terms (up to fp32 rounding, which
//! the MMA's own summation order already leaves unspecified).
//!
//! By topic (the items of all but `w4a16` and `prepack` are also re-exported here, as
//! `nvfp4_gemm_abi::sm90::*`):
//! - [`config`]: what a GEMM variant's configuration ([`GemmConfig`]) determines: tiles, stages,
//!   thread roles, register shares, the shared-memory map and the bytes each stage's copies credit;
//! - [`variants`]: the compiled variants, one table of the GEMM entry points (name, configuration,
//!   token operand), from which the kernel names and the register caps derive;
//! - [`params`]: the group table and the `N192` work item's row span;
//! - [`tokens`]: the token workspace's K permutation and the token dequantization (its name,
//!   register cap and work split);
//! - [`fragment`]: where a consumer thread's weight fragments and scale words lie in a stage;
//! - [`decode`]: the factor the e2m1 → f16 decoder's values lack;
//! - [`epilogue`]: the epilogue buffer's swizzle;
//! - [`desc`]: the wgmma shared-memory descriptor;
//! - [`tma`]: the tensor maps and their places in the table;
//! - [`launch`]: launch geometry and the GEMM's early start;
//! - [`w4a16`]: the prepacked weight format of W4A16 (f16/bf16 activations, docs/w4a16.md);
//! - [`prepack`]: the GPU prepack of W4A16 weights (its parameters, work items and launch).

pub mod config;
pub mod decode;
pub mod desc;
pub mod epilogue;
pub mod fragment;
pub mod launch;
pub mod params;
pub mod prepack;
pub mod tma;
pub mod tokens;
pub mod variants;
pub mod w4a16;

pub use config::*;
pub use decode::*;
pub use desc::*;
pub use epilogue::*;
pub use fragment::*;
pub use launch::*;
pub use params::*;
pub use tma::*;
pub use tokens::*;
pub use variants::*;
