//! sm_90a (Hopper) kernels: the exact NVFP4 grouped GEMM through f16 wgmma (see
//! `nvfp4_gemm_abi::sm90` for the design and the shared parameters).

pub mod gemm;
