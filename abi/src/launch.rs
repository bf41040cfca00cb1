//! Launch geometry, and the hardware sizes both architectures lay their CTAs out against: shared
//! memory per CTA and per SM, registers per SM, the size of an mbarrier.
//!
//! Every kernel's [`LaunchGeometry`] is built by a `const fn` of its architecture's module
//! ([`crate::sm90::gemm_launch`], [`crate::sm90::dequant_launch`],
//! [`crate::sm100::params::KernelLayout::launch`]; the diagnostic kernels' in `diag/abi/`); the
//! host only passes it to the driver.

/// Largest dynamic shared memory per CTA on sm_90 and sm_100: 227 KiB (the opt-in limit,
/// `CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`; CUTLASS `sm90_smem_capacity_bytes`,
/// `sm100_smem_capacity_bytes`).
pub const MAX_DYNAMIC_SMEM: u32 = 232_448;

/// Alignment the kernels need of the dynamic shared-memory base: one 128-byte-swizzle atom (8 rows
/// of 128 bytes), so that TMA boxes and matrix descriptors agree on the swizzle phase.
pub const DYNAMIC_SMEM_ALIGN: u32 = 1024;

/// Shared memory per SM: 228 KiB on sm_90 and sm_100 (docs/sm90.md §7, docs/sm100.md §7).
pub const SMEM_PER_SM: u32 = 233_472;

/// Shared memory the system reserves per resident CTA (1 KiB on sm_90 and sm_100).
pub const SMEM_RESERVED_PER_BLOCK: u32 = 1024;

/// 32-bit registers per SM on sm_90 and sm_100
/// (`CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR`): the pool the register caps
/// (`.maxnreg`) of a kernel's resident CTAs share.
pub const REGISTERS_PER_SM: u32 = 65536;

/// Bytes of one mbarrier object in shared memory (8-byte aligned; PTX ISA, "Size and alignment of
/// mbarrier object").
pub const MBARRIER_BYTES: u32 = 8;

/// Grid, block, cluster and dynamic shared memory of one launch (all along x).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchGeometry {
    /// CTAs along x (a multiple of `cluster`).
    pub grid: u32,
    /// Threads per CTA.
    pub block: u32,
    /// CTAs per cluster along x (1 = no cluster).
    pub cluster: u32,
    /// Dynamic shared memory per CTA in bytes.
    pub smem_bytes: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_is_227_kib() {
        assert_eq!(MAX_DYNAMIC_SMEM, 227 * 1024);
        assert_eq!(DYNAMIC_SMEM_ALIGN, 8 * 128);
        assert_eq!((REGISTERS_PER_SM, MBARRIER_BYTES), (64 * 1024, 8));
    }
}
