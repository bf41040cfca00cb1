//! Shared helpers for the integration tests.
//!
//! GPU tests call [`gpu_or_skip`]: on a machine without a suitable GPU it prints why the test is
//! skipped — straight to stderr, so the reason shows even though the harness captures test output —
//! and the test returns without asserting anything else.
//!
//! [`run_case`] runs one problem end to end for either output type ([`OutputElement`]: fp16 or
//! bf16); [`cases`] holds the problem lists, the random-problem generator and the test bodies that
//! both architectures' GPU test files share.

pub mod cases;
mod run;

pub use run::{
    abs_reference, accumulation_allowance, run_case, run_case_with, CaseReport, Mismatch, OutputElement, GUARD, POISON,
};

use nvfp4_format::{Group, GroupShape, InputDistribution};
use nvfp4_gemm::{Arch, Error, Gpu};
use std::io::Write;

/// Opens GPU 0 if it has architecture `want`; otherwise prints `SKIPPED <test>: <reason>` and
/// returns `None`.
pub fn gpu_or_skip(test: &str, want: Arch) -> Option<Gpu> {
    let reason = match Gpu::new(0) {
        Ok(gpu) if gpu.arch() == want => return Some(gpu),
        Ok(gpu) => format!("needs {}, found {} ({})", want.name(), gpu.name(), gpu.arch().name()),
        Err(Error::NoDriver) => format!("needs a {} GPU; no CUDA driver on this machine", want.name()),
        Err(e) => format!("needs a {} GPU; {e}", want.name()),
    };
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {reason}");
    None
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
