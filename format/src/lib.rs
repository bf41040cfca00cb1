//! NVFP4 on the CPU.
