//! NVFP4 block-scaled grouped GEMM for NVIDIA Hopper (sm_90a) and Blackwell (sm_100a), with device
//! code written in Rust.
//!
//! For groups `g`, `C_g[m, n] = alpha_g · A_g[m, k] · B_g[n, k]ᵀ`: A and B are NVFP4 (packed e2m1
//! values with one e4m3 scale per 16 values, in the 128x4 blocked scale layout), C is fp16 or bf16.
//! On Hopper the result is exact up to fp32 summation order (operands are dequantized to f16
//! exactly and multiplied with f16 wgmma).
//!
//! Three types: a [`Problem`] (shapes, validated), a [`GemmPlan`] (the problem bound to a [`Gpu`]:
//! configuration, work list, device tables; build once, reuse), and the per-call [`GroupArgs`]
//! (borrowed device buffers).
#![warn(missing_docs)]

pub mod device;
pub mod driver;
pub mod error;
pub mod plan;
pub mod problem;
mod sm90;
pub mod smoke;

pub use device::{driver_present, Arch, Gpu};
pub use error::{Error, Result};
pub use plan::{GemmPlan, GroupArgs, Nvfp4Operand, Output, PlanSummary};
pub use problem::{GroupShape, OutputType, Problem};
