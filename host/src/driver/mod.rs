//! What cudarc's safe layer lacks, wrapped once at the `sys` level: the kernel image loaded
//! through the module API, cluster launches through `cuLaunchKernelEx`, tensor maps through
//! `cuTensorMapEncodeTiled`, and a fixed chain of kernels as one CUDA graph.

pub mod graph;
pub mod launch;
pub mod module;
pub mod tensor_map;
