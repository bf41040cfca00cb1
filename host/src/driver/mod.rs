//! What cudarc's safe layer lacks, wrapped once at the `sys` level: cluster launches through
//! `cuLaunchKernelEx` and tensor maps through `cuTensorMapEncodeTiled`.

pub mod launch;
pub mod tensor_map;
