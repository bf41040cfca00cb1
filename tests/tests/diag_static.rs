//! Static checks of the committed modules on the CPU: the product modules (`host/kernels/`) hold
//! no diagnostic kernel, and the diagnostic modules (`diag/kernels/`, written by
//! `cargo xtask build-ptx` from `diag/kernel/`) hold exactly the diagnostic kernels of their
//! architecture and nothing of the product.

use nvfp4_gemm::Arch;
use nvfp4_gemm_diag::ceiling::TMA_BANDWIDTH_KERNEL;
use nvfp4_gemm_diag::kernels;
use nvfp4_gemm_diag::probe::ProbeKernel;
use std::collections::BTreeSet;

const ARCHES: [Arch; 2] = [Arch::Sm90a, Arch::Sm100a];

/// The names of a module's `.entry` functions.
fn entries(ptx: &str) -> BTreeSet<&str> {
    ptx.lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
        .map(|rest| rest.trim_end_matches('('))
        .collect()
}

/// The diagnostic kernels compiled for `arch`.
fn diagnostic_kernels(arch: Arch) -> BTreeSet<&'static str> {
    let probes = [
        ProbeKernel::Tma,
        ProbeKernel::Sync,
        ProbeKernel::WgmmaN16,
        ProbeKernel::WgmmaN128,
        ProbeKernel::Tmem,
        ProbeKernel::Umma,
        ProbeKernel::Tma4Multicast,
    ];
    let mut names: BTreeSet<&str> = probes.iter().filter(|p| p.arch() == arch).map(|p| p.name()).collect();
    names.insert("smoke_tma_cluster");
    match arch {
        Arch::Sm90a => names.insert(TMA_BANDWIDTH_KERNEL),
        Arch::Sm100a => names.insert("smoke_tmem"),
    };
    names
}

#[test]
fn diagnostic_modules_hold_exactly_the_diagnostic_kernels() {
    for arch in ARCHES {
        assert_eq!(entries(kernels::ptx(arch)), diagnostic_kernels(arch), "{}", arch.name());
    }
}

#[test]
fn product_modules_hold_no_diagnostic_kernel() {
    for arch in ARCHES {
        let product = entries(arch.ptx());
        assert!(!product.is_empty(), "{}: no entry", arch.name());
        let every_diagnostic: BTreeSet<&str> = ARCHES.iter().flat_map(|a| diagnostic_kernels(*a)).collect();
        let shared: Vec<&&str> = product.intersection(&every_diagnostic).collect();
        assert!(shared.is_empty(), "{}: diagnostic kernels in the product module: {shared:?}", arch.name());
    }
}

#[test]
fn both_modules_target_the_architecture() {
    for arch in ARCHES {
        let target = format!(".target {}", arch.name());
        for (module, ptx) in [("product", arch.ptx()), ("diagnostic", kernels::ptx(arch))] {
            assert!(ptx.lines().any(|l| l.trim() == target), "{module} module of {}", arch.name());
        }
        assert!(!kernels::cubin(arch).is_empty());
    }
}
