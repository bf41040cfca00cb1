//! The Blackwell grouped GEMM against the CPU reference, on an sm_100 GPU (B200): the
//! competition's test shapes, the benchmark shapes, shapes chosen to reach every kernel path
//! (3-stage variant, 256-wide clusters with and without a K tail, K < 256, M/N tails, empty
//! groups), bf16 output, and seeded random problems. Each case poisons C (and guard elements
//! around it) before each of two runs, then checks every element against the fp64 reference
//! (atol = rtol = 1e-3), the guards, and bitwise determinism; full-range inputs additionally get
//! the fp32-accumulation allowance of `nvfp4_gemm_tests::accumulation_allowance`.
//!
//! Skipped with a printed reason without an sm_100 GPU. None of these has run yet: there is no
//! B200 in this project's reach. Until `GemmPlan` is wired to the sm_100a kernels, planning fails
//! with `InvalidProblem` and every test here fails on a B200 instead of passing vacuously.

use nvfp4_format::{GroupShape, InputDistribution, SplitMix64, Tolerance};
use nvfp4_gemm::Arch;
use nvfp4_gemm_tests::{gpu_or_skip, make_groups, run_case};

const DISTS: [InputDistribution; 2] = [InputDistribution::Competition, InputDistribution::FullRange];

fn z(m: &[usize], n: &[usize], k: &[usize]) -> Vec<GroupShape> {
    GroupShape::zip(m, n, k).unwrap()
}

fn competition_cases() -> Vec<Vec<GroupShape>> {
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
        // An older revision of the task used K = 128 and 384: the flat (2D) tensor map and a last
        // stage with fewer than 4 MMAs.
        z(&[96, 40], &[128, 256], &[128, 384]),
    ]
}

fn benchmark_cases() -> Vec<Vec<GroupShape>> {
    use nvfp4_format::generate::shapes::*;
    vec![B0.to_vec(), B1.to_vec(), B2.to_vec(), B3.to_vec()]
}

/// One case per kernel path the shapes above may not reach.
fn path_cases() -> Vec<Vec<GroupShape>> {
    vec![
        // 320 items of 128 columns (> 2 waves of 148): the 3-stage, two-CTAs-per-SM kernel; the
        // second with K = 192 (< 256, flat map, 3 MMAs).
        z(&[640], &[8192], &[128]),
        z(&[640], &[8192], &[192]),
        // 256-wide clusters with a K tail (2D multicast of A, last stage of 1 MMA), N = 17 tiles of
        // 256 (3 padding items per M tile), M tail.
        z(&[200, 72], &[4352, 4096], &[2112, 2240]),
        // Both launches in one problem, with an empty group in between.
        z(&[130, 0, 64], &[4096, 4096, 520], &[2048, 2048, 320]),
        // M = 1 and N = 8: one row, one 8-column pair per thread group.
        z(&[1, 3], &[8, 136], &[64, 64]),
    ]
}

fn with_dists(cases: Vec<Vec<GroupShape>>) -> Vec<(Vec<GroupShape>, InputDistribution)> {
    cases.into_iter().flat_map(|c| DISTS.map(|d| (c.clone(), d))).collect()
}

fn run_all(test: &str, cases: &[(Vec<GroupShape>, InputDistribution)], seed: u64) {
    let Some(gpu) = gpu_or_skip(test, Arch::Sm100a) else { return };
    let stream = gpu.context().default_stream();
    let mut failures = vec![];
    for (i, (shapes, dist)) in cases.iter().enumerate() {
        let dist = *dist;
        let groups = make_groups(shapes, dist, seed + i as u64);
        let r = run_case(&gpu, &stream, &groups, Tolerance::COMPETITION, dist == InputDistribution::FullRange);
        let dims: Vec<(usize, usize, usize)> = shapes.iter().map(|s| (s.m, s.n, s.k)).collect();
        let line = format!(
            "CASE {test}[{i}] {dist:?} groups(m,n,k)={dims:?} guards={} deterministic={} acc_ulps={:.1} fp32_allowed={} {}",
            r.guard_corruptions, r.deterministic, r.accumulation_ulps, r.within_allowance, r.comparison
        );
        println!("{line}");
        if !r.passed() {
            failures.push(line);
        }
    }
    assert!(failures.is_empty(), "{} failing cases:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn competition_shapes() {
    run_all("competition_shapes", &with_dists(competition_cases()), 1111);
}

#[test]
fn benchmark_shapes() {
    run_all("benchmark_shapes", &with_dists(benchmark_cases()), 2222);
}

#[test]
fn kernel_paths() {
    run_all("kernel_paths", &with_dists(path_cases()), 4444);
}

/// 100 problems: G in 1..=12, M in 0..=600, N a multiple of 8 up to 8192 (a third of them
/// multiples of 256 from 4096, to reach the cluster kernel), K a multiple of 64 up to 4096.
#[test]
fn random_shapes() {
    let mut rng = SplitMix64::new(0x5EED_0100);
    let mut cases = vec![];
    while cases.len() < 100 {
        let g = 1 + rng.below(12) as usize;
        let shapes: Vec<GroupShape> = (0..g)
            .map(|_| {
                let m = if rng.below(10) == 0 { 0 } else { rng.below(601) as usize };
                let wide = rng.below(3) == 0;
                let n = if wide { 4096 + 256 * rng.below(17) as usize } else { 8 * (1 + rng.below(1024)) as usize };
                let k = if wide { 2048 + 64 * rng.below(33) as usize } else { 64 * (1 + rng.below(64)) as usize };
                GroupShape::new(m, n, k)
            })
            .collect();
        let work: usize = shapes.iter().map(|s| s.m * s.n * s.k).sum();
        if work <= 4 << 30 {
            cases.push((shapes, DISTS[cases.len() % 2]));
        }
    }
    run_all("random_shapes", &cases, 3333);
}

/// bf16 output through both kernels: C is poisoned first, compared with the bf16 reference.
#[test]
fn bf16_output() {
    use half::bf16;
    use nvfp4_gemm::{DeviceNvfp4, GemmPlan, GroupArgs, Output, OutputType, Problem};
    let Some(gpu) = gpu_or_skip("bf16_output", Arch::Sm100a) else { return };
    let stream = gpu.context().default_stream();
    let cases = [competition_cases()[3].clone(), z(&[200, 64], &[4096, 256], &[2048, 512])];
    for (i, shapes) in cases.iter().enumerate() {
        let groups = make_groups(shapes, InputDistribution::Competition, 40 + i as u64);
        let mut plan = GemmPlan::new(&gpu, Problem::new(shapes.clone(), OutputType::Bf16).unwrap()).unwrap();
        let dev: Vec<_> = groups
            .iter()
            .map(|g| (DeviceNvfp4::upload(&stream, &g.a).unwrap(), DeviceNvfp4::upload(&stream, &g.b).unwrap()))
            .collect();
        let mut cs: Vec<_> =
            groups.iter().map(|g| stream.clone_htod(&vec![bf16::from_bits(0x7FFF); g.m() * g.n()]).unwrap()).collect();
        let mut args: Vec<GroupArgs> = dev
            .iter()
            .zip(cs.iter_mut())
            .zip(&groups)
            .map(|(((a, b), c), g)| GroupArgs { a: a.operand(), b: b.operand(), c: Output::Bf16(c), alpha: g.alpha })
            .collect();
        plan.run(&stream, &mut args).unwrap();
        drop(args);
        let got: Vec<Vec<bf16>> = cs.iter().map(|c| stream.clone_dtoh(c).unwrap()).collect();
        let expected = nvfp4_format::reference_grouped_gemm_bf16(&groups).unwrap();
        // bf16 keeps 8 significant bits: allow one rounding (2^-8 relative).
        let cmp = nvfp4_format::compare(&got, &expected, Tolerance::new(1e-3, 4e-3)).unwrap();
        println!("CASE bf16_output[{i}] {cmp}");
        assert!(cmp.passed(), "{cmp}");
    }
}

/// The plan's summary names the sm_100a kernels it chose for each path.
#[test]
fn plan_chooses_the_expected_kernels() {
    use nvfp4_gemm::{GemmPlan, OutputType, Problem};
    let Some(gpu) = gpu_or_skip("plan_chooses_the_expected_kernels", Arch::Sm100a) else { return };
    let expect = [
        (competition_cases()[0].clone(), vec!["sm100_gemm_n128_deep"]),
        (benchmark_cases()[0].clone(), vec!["sm100_gemm_n256_cluster4"]),
        (path_cases()[0].clone(), vec!["sm100_gemm_n128_shallow"]),
        (path_cases()[3].clone(), vec!["sm100_gemm_n128_deep", "sm100_gemm_n256_cluster4"]),
    ];
    for (shapes, kernels) in expect {
        let plan = GemmPlan::new(&gpu, Problem::new(shapes.clone(), OutputType::F16).unwrap()).unwrap();
        let s = plan.summary();
        println!("PLAN {:?}: {}", shapes.iter().map(|s| (s.m, s.n, s.k)).collect::<Vec<_>>(), s.kernel);
        assert_eq!(s.arch, Arch::Sm100a);
        for k in kernels {
            assert!(s.kernel.contains(k), "{} does not mention {k}", s.kernel);
        }
    }
}
