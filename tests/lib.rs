//! Shared helpers for the integration tests.
//!
//! GPU tests call [`gpu_or_skip`]: on a machine without a suitable GPU it prints why the test is
//! skipped — straight to stderr, so the reason shows even though the harness captures test output —
//! and the test returns without asserting anything else.

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
