//! Shared helpers for the integration tests.
//!
//! # GPU tests: ignored by default, never skipped silently
//!
//! Every test that needs a GPU carries one of these attributes, so that a plain `cargo test`
//! reports it as *ignored* (not run), never as passed:
//!
//! - `#[ignore = "needs an sm_90a GPU"]` (Hopper: H100, H200),
//! - `#[ignore = "needs an sm_100a GPU"]` (Blackwell: B200),
//! - `#[ignore = "needs an sm_90a or sm_100a GPU"]` (either),
//! - `#[ignore = "needs a CUDA driver"]` (a driver, whatever the GPU).
//!
//! The GPU bundle (`cargo xtask bundle`, then `bundle/run-gpu-tests.sh` on the GPU machine) runs
//! the test binaries with `--include-ignored`, and leaves out (with `--skip`, counted as *not run*
//! in its summary) the tests whose reason names an architecture other than the machine's: an H200
//! does not run the `"needs an sm_100a GPU"` tests. The reasons are those exact strings because the
//! bundle reads them.
//!
//! Inside the test, [`require_gpu`] (or [`require_any_gpu`]) opens the GPU. A test only reaches it
//! when it was asked for explicitly, so a missing or different GPU is a failure that says why,
//! not a silent pass.
//!
//! [`run_case`] runs one problem end to end for either output type ([`OutputElement`]: fp16 or
//! bf16); [`cases`] holds the problem lists, the random-problem generator and the test bodies that
//! both architectures' GPU test files share.

pub mod cases;
pub mod guarded;
pub mod moe;
pub mod ptx_text;
mod run;
pub mod w4a16;

pub use run::{
    abs_reference, accumulation_allowance, run_case, run_case_with, CaseReport, Mismatch, OutputElement, GUARD, POISON,
};

use nvfp4_format::{Group, GroupShape, InputDistribution};
use nvfp4_gemm::{Arch, Error, Gpu};

/// GPU 0, which must have architecture `want`; panics with the reason otherwise (no driver, no
/// GPU, a GPU of another architecture). For tests marked `#[ignore = "needs an sm_90a GPU"]` (or
/// sm_100a): see the crate docs.
#[track_caller]
pub fn require_gpu(want: Arch) -> Gpu {
    open(want, "this test")
}

/// GPU 0, of any architecture the library supports (sm_90a or sm_100a); panics with the reason
/// otherwise.
#[track_caller]
pub fn require_any_gpu() -> Gpu {
    match Gpu::new(0) {
        Ok(gpu) => gpu,
        Err(e) => panic!("this test needs an sm_90a or sm_100a GPU: {}", no_gpu_reason(&e)),
    }
}

/// [`require_gpu`] in the form `let Some(gpu) = gpu_or_skip(test, arch) else { return };` that
/// the test bodies use. It never returns `None`: a GPU test without its GPU fails, naming `test`.
#[track_caller]
pub fn gpu_or_skip(test: &str, want: Arch) -> Option<Gpu> {
    Some(open(want, test))
}

#[track_caller]
fn open(want: Arch, test: &str) -> Gpu {
    match Gpu::new(0) {
        Ok(gpu) if gpu.arch() == want => gpu,
        Ok(gpu) => panic!(
            "{test} needs an {} GPU; GPU 0 here is {} ({}). Run it on such a GPU, or leave it out \
             (it is ignored unless asked for)",
            want.name(),
            gpu.name(),
            gpu.arch().name()
        ),
        Err(e) => panic!("{test} needs an {} GPU: {}", want.name(), no_gpu_reason(&e)),
    }
}

fn no_gpu_reason(e: &Error) -> String {
    match e {
        Error::NoDriver => "no CUDA driver on this machine".to_owned(),
        e => e.to_string(),
    }
}

/// Random groups of the given shapes and distribution; full-range inputs get a small alpha so the
/// outputs stay inside the f16 range.
pub fn make_groups(shapes: &[GroupShape], dist: InputDistribution, seed: u64) -> Vec<Group> {
    let mut groups = nvfp4_format::random_groups(shapes, dist, seed).expect("generate");
    if dist == InputDistribution::FullRange {
        for g in &mut groups {
            g.alpha = 1.0 / 65536.0;
        }
    }
    groups
}
