//! What cudarc's safe layer lacks, wrapped once at the `sys` level: the kernel image loaded
//! through the module API, cluster launches through `cuLaunchKernelEx`, tensor maps through
//! `cuTensorMapEncodeTiled`, a fixed chain of kernels as one CUDA graph, and strided copies
//! through `cuMemcpy2DAsync`.

pub mod copy;
pub mod graph;
pub mod launch;
pub mod module;
pub mod tensor_map;
