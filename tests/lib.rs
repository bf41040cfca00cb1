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

use cudarc::driver::{CudaSlice, CudaStream};
use half::f16;
use nvfp4_format::{compare, reference_grouped_gemm, Comparison, Group, GroupShape, InputDistribution, Tolerance};
use nvfp4_gemm::{GemmPlan, GroupArgs, Nvfp4Operand, Output, OutputType, Problem};
use std::sync::Arc;

/// f16 bit pattern written before every run: a NaN, so an element the kernel never wrote fails the
/// comparison.
pub const POISON: u16 = 0x7FFF;
/// Poisoned elements before and after each C buffer, checked untouched after the run.
pub const GUARD: usize = 64;

/// What one end-to-end case found.
pub struct CaseReport {
    /// Against the CPU reference.
    pub comparison: Comparison,
    /// Guard elements around C that changed.
    pub guard_corruptions: usize,
    /// True when a second run on the same inputs gave bitwise the same C.
    pub deterministic: bool,
}

impl CaseReport {
    /// Every check passed.
    pub fn passed(&self) -> bool {
        self.comparison.passed() && self.guard_corruptions == 0 && self.deterministic
    }
}

struct DeviceInputs {
    a_values: CudaSlice<u8>,
    a_scales: CudaSlice<u8>,
    b_values: CudaSlice<u8>,
    b_scales: CudaSlice<u8>,
}

/// Uploads `groups`, runs the plan twice (poisoning C first each time), checks the guards and the
/// determinism, and compares with the CPU reference (fp16 output, `tol`).
pub fn run_case(gpu: &nvfp4_gemm::Gpu, stream: &Arc<CudaStream>, groups: &[Group], tol: Tolerance) -> CaseReport {
    let shapes: Vec<GroupShape> = groups.iter().map(|g| GroupShape::new(g.m(), g.n(), g.k())).collect();
    let problem = Problem::new(shapes, OutputType::F16).expect("valid problem");
    let mut plan = GemmPlan::new(gpu, problem).expect("plan");
    let inputs: Vec<DeviceInputs> = groups
        .iter()
        .map(|g| DeviceInputs {
            a_values: upload(stream, g.a.values()),
            a_scales: upload(stream, g.a.scales()),
            b_values: upload(stream, g.b.values()),
            b_scales: upload(stream, g.b.scales()),
        })
        .collect();
    let mut cs: Vec<CudaSlice<f16>> =
        groups.iter().map(|g| stream.alloc_zeros::<f16>(g.m() * g.n() + 2 * GUARD).expect("alloc C")).collect();
    let mut outputs: Vec<Vec<Vec<u16>>> = vec![];
    let mut guard_corruptions = 0;
    for _ in 0..2 {
        for c in cs.iter_mut() {
            let poison = vec![f16::from_bits(POISON); c.len()];
            stream.memcpy_htod(&poison, c).expect("poison C");
        }
        {
            let mut views: Vec<_> = cs.iter_mut().map(|c| {
                let len = c.len() - 2 * GUARD;
                c.slice_mut(GUARD..GUARD + len)
            }).collect();
            let mut args: Vec<GroupArgs> = inputs
                .iter()
                .zip(views.iter_mut())
                .zip(groups)
                .map(|((d, c), g)| GroupArgs {
                    a: Nvfp4Operand { values: &d.a_values, scales: &d.a_scales },
                    b: Nvfp4Operand { values: &d.b_values, scales: &d.b_scales },
                    c: Output::F16(c),
                    alpha: g.effective_alpha_f32(),
                })
                .collect();
            plan.run(stream, &mut args).expect("run");
        }
        stream.synchronize().expect("synchronize");
        let mut run = vec![];
        for c in &cs {
            let host: Vec<u16> = stream.clone_dtoh(c).expect("download C").iter().map(|x| x.to_bits()).collect();
            let n = host.len();
            guard_corruptions += host[..GUARD].iter().chain(&host[n - GUARD..]).filter(|&&x| x != POISON).count();
            run.push(host[GUARD..n - GUARD].to_vec());
        }
        outputs.push(run);
    }
    let deterministic = outputs[0] == outputs[1];
    let got: Vec<Vec<f16>> = outputs[0].iter().map(|g| g.iter().map(|&b| f16::from_bits(b)).collect()).collect();
    let expected = reference_grouped_gemm(groups).expect("reference");
    let comparison = compare(&got, &expected, tol).expect("compare");
    CaseReport { comparison, guard_corruptions, deterministic }
}

fn upload(stream: &Arc<CudaStream>, bytes: &[u8]) -> CudaSlice<u8> {
    if bytes.is_empty() {
        return stream.alloc_zeros::<u8>(16).expect("alloc");
    }
    stream.clone_htod(bytes).expect("upload")
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
