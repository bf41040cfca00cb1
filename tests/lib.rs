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
use nvfp4_format::{compare, Comparison, Group, GroupOutput, GroupShape, InputDistribution, Tolerance};
use nvfp4_gemm::{DeviceGroup, GemmPlan, GroupArgs, Output, OutputType, Problem};
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
    /// Elements outside the strict tolerance that were accepted under [`accumulation_allowance`]
    /// (only for cases run with the allowance).
    pub within_allowance: usize,
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

/// How far fp32 accumulation may move a result: `(K/16 + 2) · 2⁻²¹ · Σ|a_k·b_k| · |alpha|`.
///
/// wgmma adds 16 exact products at a time to an fp32 accumulator, truncating each sum to about
/// 24 bits, so each of the K/16 steps can lose ~2⁻²³ of the running sum of magnitudes; we allow 4×
/// that. With the competition's inputs every partial sum is exactly representable in fp32 (small
/// multiples of 1/64), so those cases get no such allowance and must match to atol = rtol = 1e-3
/// (in practice bit-exactly). Full-range inputs span 2⁻¹⁸..7·10⁶ per product and cancel heavily;
/// no fp32-accumulating kernel can meet a pure 1e-3 bound there.
pub fn accumulation_allowance(k: usize, abs_sum: f64) -> f64 {
    (k as f64 / 16.0 + 2.0) * (-21f64).exp2() * abs_sum
}

/// Uploads `groups`, runs the plan twice (poisoning C first each time), checks the guards and the
/// determinism, and compares with the CPU reference (fp16 output, `tol`).
/// `fp32_allowance`: accept elements outside `tol` when they are within [`accumulation_allowance`]
/// (for inputs whose partial sums are not exact in fp32).
pub fn run_case(
    gpu: &nvfp4_gemm::Gpu,
    stream: &Arc<CudaStream>,
    groups: &[Group],
    tol: Tolerance,
    fp32_allowance: bool,
) -> CaseReport {
    let shapes: Vec<GroupShape> = groups.iter().map(|g| GroupShape::new(g.m(), g.n(), g.k())).collect();
    let problem = Problem::new(shapes, OutputType::F16).expect("valid problem");
    let mut plan = GemmPlan::new(gpu, problem).expect("plan");
    let inputs: Vec<DeviceGroup> = groups.iter().map(|g| DeviceGroup::upload(stream, g).expect("upload")).collect();
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
            let mut views: Vec<_> = cs
                .iter_mut()
                .map(|c| {
                    let len = c.len() - 2 * GUARD;
                    c.slice_mut(GUARD..GUARD + len)
                })
                .collect();
            let mut args: Vec<GroupArgs> =
                inputs.iter().zip(views.iter_mut()).map(|(d, c)| d.args(Output::F16(c))).collect();
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
    let exact = nvfp4_format::reference_grouped_gemm_f64(groups).expect("f64 reference");
    let expected: Vec<GroupOutput<f16>> = exact.iter().map(GroupOutput::rounded).collect();
    let mut comparison = compare(&got, &expected, tol).expect("compare");
    // Σ|a·b|·|alpha| per element: the reference on the operands with their sign bits cleared.
    let abs_groups: Vec<Group> = groups
        .iter()
        .map(|g| {
            let mut g = g.clone();
            g.a.values_mut().iter_mut().for_each(|v| *v &= 0x77);
            g.b.values_mut().iter_mut().for_each(|v| *v &= 0x77);
            g.alpha = g.alpha.abs();
            g
        })
        .collect();
    let abs = nvfp4_format::reference_grouped_gemm_f64(&abs_groups).expect("abs reference");
    let (mut failed, mut worst): (usize, Option<nvfp4_format::Element>) = (0, None);
    for (gi, ((g, e), a)) in got.iter().zip(&exact).zip(&abs).enumerate() {
        let k = groups[gi].k();
        for (idx, ((x, r), s)) in g.iter().zip(&e.data).zip(&a.data).enumerate() {
            let x = x.to_f64();
            let err = (x - r).abs();
            if fp32_allowance && !tol.accepts(x, *r) {
                // Strictly-failing elements are re-judged with the accumulation allowance; a NaN
                // or an error beyond it fails.
                let allowed = tol.atol + tol.rtol * r.abs() + accumulation_allowance(k, *s);
                if x.is_nan() || err > allowed {
                    failed += 1;
                    let excess = err / allowed;
                    if worst.is_none_or(|w| excess > w.excess) {
                        let (row, col) = (idx / e.cols, idx % e.cols);
                        worst = Some(nvfp4_format::Element { group: gi, row, col, got: x, expected: *r, excess });
                    }
                }
            }
        }
    }
    let within_allowance = if fp32_allowance { comparison.failed - failed } else { 0 };
    if fp32_allowance && !comparison.passed() {
        comparison.failed = failed;
        comparison.worst = worst;
    }
    CaseReport { comparison, within_allowance, guard_corruptions, deterministic }
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

/// The problem lists and the case runner both architectures' GPU tests share.
pub mod cases {
    use super::{gpu_or_skip, make_groups, run_case};
    use nvfp4_format::{GroupShape, InputDistribution, Tolerance};
    use nvfp4_gemm::Arch;

    /// Both input distributions.
    pub const DISTS: [InputDistribution; 2] = [InputDistribution::Competition, InputDistribution::FullRange];

    fn z(m: &[usize], n: &[usize], k: &[usize]) -> Vec<GroupShape> {
        GroupShape::zip(m, n, k).unwrap()
    }

    /// The competition's 10 test shapes (docs/measuring.md §1) and one with K = 128 and 384 (an older
    /// revision of the task).
    pub fn competition() -> Vec<Vec<GroupShape>> {
        vec![
            z(&[96, 128], &[128, 256], &[256, 512]),
            z(&[256, 72], &[512, 384], &[256, 256]),
            z(&[128, 128], &[128, 256], &[512, 256]),
            z(&[80, 128, 256], &[384, 256, 128], &[256, 512, 256]),
            z(&[64, 72, 96], &[128, 384, 512], &[512, 512, 256]),
            z(&[64, 256, 128], &[768, 128, 256], &[512, 256, 512]),
            z(&[128, 128, 64], &[256, 512, 512], &[768, 256, 768]),
            z(&[128; 4], &[128; 4], &[512, 256, 512, 256]),
            z(&[40, 56, 384, 512], &[512, 384, 256, 128], &[256; 4]),
            z(&[512, 384, 256, 128], &[256; 4], &[512, 768, 512, 768]),
            z(&[96, 40], &[128, 256], &[128, 384]),
        ]
    }

    /// The 4 benchmark shapes.
    pub fn benchmark() -> Vec<Vec<GroupShape>> {
        use nvfp4_format::generate::shapes::*;
        vec![B0.to_vec(), B1.to_vec(), B2.to_vec(), B3.to_vec()]
    }

    /// Each case once per input distribution.
    pub fn with_dists(cases: Vec<Vec<GroupShape>>) -> Vec<(Vec<GroupShape>, InputDistribution)> {
        cases.into_iter().flat_map(|c| DISTS.map(|d| (c.clone(), d))).collect()
    }

    /// Runs every case on GPU 0 (skipping with a printed reason unless it is `arch`), prints one
    /// `CASE` line each, and fails listing every failing case.
    pub fn run_all(test: &str, arch: Arch, cases: &[(Vec<GroupShape>, InputDistribution)], seed: u64) {
        let Some(gpu) = gpu_or_skip(test, arch) else { return };
        let stream = gpu.context().default_stream();
        let mut failures = vec![];
        for (i, (shapes, dist)) in cases.iter().enumerate() {
            let dist = *dist;
            let groups = make_groups(shapes, dist, seed + i as u64);
            let r = run_case(&gpu, &stream, &groups, Tolerance::COMPETITION, dist == InputDistribution::FullRange);
            let dims: Vec<(usize, usize, usize)> = shapes.iter().map(|s| (s.m, s.n, s.k)).collect();
            let line = format!(
                "CASE {test}[{i}] {dist:?} groups(m,n,k)={dims:?} guards={} deterministic={} fp32_allowed={} {}",
                r.guard_corruptions, r.deterministic, r.within_allowance, r.comparison
            );
            println!("{line}");
            if !r.passed() {
                failures.push(line);
            }
        }
        assert!(failures.is_empty(), "{} failing cases:\n{}", failures.len(), failures.join("\n"));
    }

    /// bf16 output: each problem is run with C poisoned (bf16 NaN) and compared with the bf16
    /// reference (one rounding, 8 significant bits: rtol 4e-3).
    pub fn run_bf16(test: &str, arch: Arch, shape_lists: &[Vec<GroupShape>], seed: u64) {
        use half::bf16;
        use nvfp4_gemm::{DeviceGroup, GemmPlan, GroupArgs, Output, OutputType, Problem};
        let Some(gpu) = gpu_or_skip(test, arch) else { return };
        let stream = gpu.context().default_stream();
        for (i, shapes) in shape_lists.iter().enumerate() {
            let groups = make_groups(shapes, InputDistribution::Competition, seed + i as u64);
            let mut plan = GemmPlan::new(&gpu, Problem::new(shapes.clone(), OutputType::Bf16).unwrap()).unwrap();
            let dev: Vec<_> = groups.iter().map(|g| DeviceGroup::upload(&stream, g).unwrap()).collect();
            let mut cs: Vec<_> = groups
                .iter()
                .map(|g| stream.clone_htod(&vec![bf16::from_bits(0x7FFF); g.m() * g.n()]).unwrap())
                .collect();
            let mut args: Vec<GroupArgs> =
                dev.iter().zip(cs.iter_mut()).map(|(d, c)| d.args(Output::Bf16(c))).collect();
            plan.run(&stream, &mut args).unwrap();
            drop(args);
            let got: Vec<Vec<bf16>> = cs.iter().map(|c| stream.clone_dtoh(c).unwrap()).collect();
            let expected = nvfp4_format::reference_grouped_gemm_bf16(&groups).unwrap();
            let cmp = nvfp4_format::compare(&got, &expected, Tolerance::new(1e-3, 4e-3)).unwrap();
            println!("CASE {test}[{i}] {cmp}");
            assert!(cmp.passed(), "{test}[{i}]: {cmp}");
        }
    }
}
