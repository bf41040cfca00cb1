pub mod gemm;
