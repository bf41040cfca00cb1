//! Static checks of the committed sm_90a PTX (`host/kernels/sm_90a.ptx`, written by
//! `cargo xtask build-ptx`) against the abi's table of kernels, on the CPU: the module's GEMM
//! entry points are exactly the rows of `GEMM_KERNELS`, and every kernel of `REGISTER_CAPS` (and
//! the W4A16 prepack's, `prepack::REGISTER_CAPS`, and the schedulers', `REGISTER_CAPS_SM90`) has
//! its cap as the `.maxnreg` after its parameter list.

use nvfp4_gemm_abi::sm90::{GEMM_KERNELS, REGISTER_CAPS};
use nvfp4_gemm_tests::ptx_text::{body, first_before_any_access};
use std::collections::BTreeSet;

const PTX: &str = include_str!("../../host/kernels/sm_90a.ptx");

/// The names of the module's `.entry` functions.
fn entries() -> impl Iterator<Item = &'static str> {
    PTX.lines().filter_map(|l| l.trim().strip_prefix(".visible .entry ")).map(|rest| rest.trim_end_matches('('))
}

#[test]
fn gemm_entries_are_the_table() {
    let ptx: BTreeSet<&str> = entries().filter(|name| name.starts_with("sm90_") && name.contains("_gemm")).collect();
    let table: BTreeSet<&str> = GEMM_KERNELS.iter().map(|k| k.name).collect();
    assert_eq!(ptx, table, "the PTX's sm90 GEMM entries (left) against GEMM_KERNELS (right)");
}

#[test]
fn every_capped_kernel_has_its_maxnreg() {
    let caps = REGISTER_CAPS
        .iter()
        .chain(&nvfp4_gemm_abi::sm90::prepack::REGISTER_CAPS)
        .chain(&nvfp4_gemm_abi::moe::schedule::REGISTER_CAPS_SM90);
    for &(name, cap) in caps {
        let header = format!(".visible .entry {name}(");
        let start = PTX.find(&header).unwrap_or_else(|| panic!("no .entry {name} in sm_90a.ptx"));
        let after = &PTX[start..];
        let params_end = after.find("\n)\n").unwrap_or_else(|| panic!("{name}: no end of its parameters")) + 3;
        let directive = after[params_end..].lines().next().unwrap_or_default();
        assert_eq!(directive, format!(".maxnreg {cap}"), "{name}");
    }
}

#[test]
fn early_kernels_wait_before_they_branch_or_touch_memory() {
    const { assert!(nvfp4_gemm_abi::moe::STARTS_EARLY) };
    // The block's quantization with its GEMMs' schedulers (sm_90a only) starts early too.
    let sm90 = [nvfp4_gemm_abi::moe::sm90::QUANTIZE_SCHEDULE_KERNEL];
    for name in nvfp4_gemm_abi::moe::EARLY_KERNELS.iter().chain(&sm90) {
        nvfp4_gemm_tests::ptx_text::waits_then_releases(PTX, name).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn gemms_release_before_they_branch_or_touch_memory() {
    const { assert!(nvfp4_gemm_abi::sm90::GEMM_RELEASES_AT_START) };
    for k in GEMM_KERNELS.iter() {
        first_before_any_access(&body(PTX, k.name), "griddepcontrol.launch_dependents;")
            .unwrap_or_else(|e| panic!("{}: {e}", k.name));
    }
}
