//! The toolchain proven end to end on hardware: Rust device code → PTX → ptxas cubin, loaded by the
//! host, launched as 2-CTA clusters through `cuLaunchKernelEx`, with mbarriers, a remote (DSMEM)
//! arrival and a 128-byte-swizzled TMA load from a host-encoded tensor map.

use nvfp4_gemm::Arch;
use nvfp4_gemm_diag::smoke::run_smoke;
use nvfp4_gemm_tests::gpu_or_skip;

#[test]
#[ignore = "needs an sm_90a GPU"]
fn smoke_tma_cluster_on_sm90() {
    let Some(gpu) = gpu_or_skip("smoke_tma_cluster_on_sm90", Arch::Sm90a) else {
        return;
    };
    let report = run_smoke(&gpu).expect("smoke launch");
    println!("{report:?}");
    assert!(report.passed(), "{report:?}");
}

#[test]
#[ignore = "needs an sm_100a GPU"]
fn smoke_tma_cluster_on_sm100() {
    let Some(gpu) = gpu_or_skip("smoke_tma_cluster_on_sm100", Arch::Sm100a) else {
        return;
    };
    let report = run_smoke(&gpu).expect("smoke launch");
    assert!(report.passed(), "{report:?}");
}

#[test]
fn no_gpu_is_an_error_not_a_panic() {
    // Whatever this machine has, opening a device returns a value instead of panicking.
    let r = std::panic::catch_unwind(|| nvfp4_gemm::Gpu::new(0).map(|g| g.arch()));
    assert!(r.is_ok(), "Gpu::new panicked");
}
