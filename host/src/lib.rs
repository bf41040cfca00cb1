//! NVFP4 block-scaled grouped GEMM for NVIDIA Hopper (sm_90a) and Blackwell (sm_100a), with device
//! code written in Rust.
//!
//! For groups `g`, `C_g[m, n] = alpha_g · A_g[m, k] · B_g[n, k]ᵀ`: A and B are NVFP4 (packed e2m1
//! values with one e4m3 scale per 16 values, in the 128x4 blocked scale layout), C is fp16 or bf16.
//! On Hopper the result is exact up to fp32 summation order (operands are dequantized to f16
//! exactly and multiplied with f16 wgmma).
//!
//! Three types: a [`Problem`] (shapes, validated against [`rules`]), a [`GemmPlan`] (the problem
//! bound to a [`Gpu`]: configuration, work list, device tables; build once, reuse), and the
//! per-call [`GroupArgs`] (borrowed device buffers, and alpha: for quantized operands their global
//! scales' product, which [`GroupArgs::new`] takes from each [`DeviceNvfp4`]).
//!
//! ```no_run
//! use nvfp4_gemm::format::{random_groups, GroupShape, InputDistribution};
//! use nvfp4_gemm::{DeviceNvfp4, GemmPlan, Gpu, GroupArgs, Output, OutputType, Problem};
//!
//! let gpu = Gpu::new(0)?; // a typed error without a driver or on an unsupported GPU
//! let stream = gpu.context().default_stream();
//! let shapes = vec![GroupShape::new(96, 256, 512), GroupShape::new(40, 512, 256)];
//! let mut plan = GemmPlan::new(&gpu, Problem::new(shapes.clone(), OutputType::F16)?)?;
//! let groups = random_groups(&shapes, InputDistribution::Competition, 1)?; // host NVFP4 matrices
//! let dev = groups
//!     .iter()
//!     .map(|g| Ok((DeviceNvfp4::upload(&stream, &g.a)?, DeviceNvfp4::upload(&stream, &g.b)?)))
//!     .collect::<nvfp4_gemm::Result<Vec<_>>>()?; // values, scales and global scale of each
//! let mut cs = shapes.iter().map(|s| stream.alloc_zeros::<half::f16>(s.m * s.n)).collect::<Result<Vec<_>, _>>()?;
//! let mut args: Vec<GroupArgs> = dev
//!     .iter()
//!     .zip(cs.iter_mut())
//!     .map(|((a, b), c)| GroupArgs::new(a, b, Output::F16(c))) // alpha = g_a · g_b
//!     .collect();
//! plan.run(&stream, &mut args)?; // validates every buffer first; no allocation, no host sync
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

pub mod capi;
pub mod device;
mod device_sizes;
mod engine;
pub mod error;
#[doc(hidden)]
pub mod host_timing;
pub mod moe;
pub mod moe_block;
mod moe_problem;
mod overlap;
pub mod plan;
mod preview;
pub mod problem;
pub mod quantize;
pub mod rules;
mod sm100;
mod sm90;
mod summary;
pub mod tensor;
pub mod upload;
pub mod w4a16;

// Internals that this workspace's own tests, device-model tests, diagnostic crate (`diag/host/`)
// and benchmark reach into, behind the doc-hidden `testing` feature: not part of the library's API.
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod driver;
#[cfg(not(any(test, feature = "testing")))]
mod driver;

/// The pure half of each architecture's plan: work lists, group tables, tensor-map descriptions
/// and launch geometry, without driver calls ([`GemmPlan`] uploads what these compute), so that
/// the CPU model of the device (`model-tests/`) runs the kernels on exactly these tables, with
/// the maps encoded by the model (`driver::tensor_map::TiledMapEncoder`).
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod layout {
    pub use crate::device_sizes::{schedule_common, schedule_geometry};
    pub use crate::engine::{encode_tables, summary, Launch, Layout, Memory, Tables, WorkList, PLACEHOLDER_BASE};
    pub use crate::sm100::{Fp4Map, Sm100DeviceLayout, Sm100Launch, Sm100Layout};
    pub use crate::sm90::{Sm90DeviceLayout, Sm90Layout};
}

pub use device::{driver_present, is_capturing, Arch, Gpu};
pub use error::{BufferName, Error, Result};
pub use moe::{MoeArgs, MoeKernels, MoeOptions, MoePlan, MoeProblem, SizeStatus, TokenLayout};
pub use moe_block::BlockKernels;
pub use nvfp4_format as format;
pub use nvfp4_gemm_abi::launch::LaunchGeometry;
pub use plan::{
    GemmPlan, GroupArgs, KernelLaunch, Nvfp4Operand, Output, PlanOptions, PlanSummary, StackedArgs, StackedViews,
    TokenOperand,
};
pub use preview::{plan_summary, reference_sm_count};
pub use problem::{Activations, GroupShape, OutputType, Problem, TokenKind};
pub use upload::{DeviceGroup, DeviceNvfp4};
