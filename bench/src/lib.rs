//! The NVFP4 grouped GEMM benchmark (`nvfp4-bench`), as a library so that its CPU parts (options,
//! statistics, table, JSON, SVG) are unit-tested on any machine. [`measure`] holds the GPU work.
#![warn(missing_docs)]

pub mod measure;
pub mod options;
pub mod report;
pub mod stats;
