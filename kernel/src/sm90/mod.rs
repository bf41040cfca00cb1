//! sm_90a (Hopper) kernels: the exact NVFP4 grouped GEMM through f16 wgmma (see
//! `nvfp4_gemm_abi::sm90` for the design and the shared parameters).

pub mod dequant;
pub mod gemm;
pub mod schedule;

/// 16 bytes, so that loads and stores through it become `ld.v4`/`st.v4`.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub(crate) struct U32x4(pub [u32; 4]);
