//! The NVFP4 grouped GEMM benchmark (`nvfp4-bench`), as a library so that its CPU parts (options,
//! statistics, table, JSON, SVG) are unit-tested on any machine. [`measure`] holds the GPU work
//! (with `cublas`, the baseline, and `inputs`, the inputs' generation and upload), [`ceiling`] the
//! TMA ceilings; [`moe`] the MoE rows (`moe_measure` their GPU half) and [`torch`] the PyTorch
//! baseline script's runner; [`prepack`] the W4A16 prepack rows; [`block`] the whole-expert-block
//! rows (`block_measure` their GPU half).
#![warn(missing_docs)]

pub mod block;
mod block_measure;
pub mod ceiling;
mod cublas;
mod inputs;
pub mod measure;
pub mod moe;
mod moe_measure;
pub mod options;
pub mod prepack;
pub mod report;
pub mod stats;
pub mod torch;
