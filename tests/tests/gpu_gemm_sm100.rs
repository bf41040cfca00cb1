//! The Blackwell grouped GEMM against the CPU reference, on an sm_100 GPU (B200): the
//! competition's test shapes, the benchmark shapes, shapes chosen to reach every kernel path
//! (3-stage variant, 256-wide clusters with and without a K tail, K < 256, M/N tails, empty
//! groups), bf16 output, seeded random problems, and empty groups and bad buffers. Each case, fp16
//! or bf16 output, poisons C (and guard elements around it) before each of two runs, then checks
//! every element against the reference rounded to the output type (fp16: atol = rtol = 1e-3;
//! bf16: rtol 4e-3), the guards, and bitwise determinism; full-range inputs additionally get the
//! fp32-accumulation allowance of `nvfp4_gemm_tests::accumulation_allowance`.
//!
//! Ignored unless asked for: they need an sm_100a GPU (see `nvfp4_gemm_tests`). None of these has
//! run yet: there is no B200 in this project's reach.

use nvfp4_format::{GroupShape, InputDistribution};
use nvfp4_gemm::Arch;
use nvfp4_gemm_tests::cases::{self, with_dists, z, Multiples, RandomShapes, Wide};
use nvfp4_gemm_tests::gpu_or_skip;

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

fn run_all(test: &str, cases: &[(Vec<GroupShape>, InputDistribution)], seed: u64) {
    cases::run_all(test, Arch::Sm100a, cases, seed);
}

#[test]
#[ignore = "needs an sm_100a GPU"]
fn competition_shapes() {
    run_all("competition_shapes", &with_dists(cases::competition()), 1111);
}

#[test]
#[ignore = "needs an sm_100a GPU"]
fn benchmark_shapes() {
    run_all("benchmark_shapes", &with_dists(cases::benchmark()), 2222);
}

#[test]
#[ignore = "needs an sm_100a GPU"]
fn kernel_paths() {
    run_all("kernel_paths", &with_dists(path_cases()), 4444);
}

/// 100 problems: G in 1..=12, M in 0..=600, N a multiple of 8 up to 8192 (a third of them
/// multiples of 256 from 4096, to reach the cluster kernel), K a multiple of 64 up to 4096.
#[test]
#[ignore = "needs an sm_100a GPU"]
fn random_shapes() {
    let cases = cases::random(&RandomShapes {
        seed: 0x5EED_0100,
        count: 100,
        max_groups: 12,
        empty_one_in: 10,
        m: Multiples::new(0, 1, 600),
        n: Multiples::new(8, 8, 8192),
        k: Multiples::new(64, 64, 4096),
        wide: Some(Wide { one_in: 3, n: Multiples::new(4096, 256, 8192), k: Multiples::new(2048, 64, 4096) }),
        max_work: 4 << 30,
    });
    run_all("random_shapes", &cases, 3333);
}

/// bf16 output through both kernels, with the guards and the determinism check.
#[test]
#[ignore = "needs an sm_100a GPU"]
fn bf16_output() {
    let shapes = [cases::competition()[3].clone(), z(&[200, 64], &[4096, 256], &[2048, 512])];
    cases::run_bf16("bf16_output", Arch::Sm100a, &shapes, 40);
}

/// M = 0 groups are skipped, a problem of no groups or only such groups writes nothing, and a
/// buffer of the wrong size or type is a typed error with C left untouched.
#[test]
#[ignore = "needs an sm_100a GPU"]
fn empty_groups_and_bad_buffers() {
    cases::empty_groups_and_bad_buffers("empty_groups_and_bad_buffers", Arch::Sm100a);
}

#[test]
#[ignore = "needs an sm_100a GPU"]
fn plan_chooses_the_expected_kernels() {
    use nvfp4_gemm::{GemmPlan, OutputType, Problem};
    let Some(gpu) = gpu_or_skip("plan_chooses_the_expected_kernels", Arch::Sm100a) else { return };
    let expect = [
        (cases::competition()[0].clone(), vec!["sm100_gemm_n128_deep"]),
        (cases::benchmark()[0].clone(), vec!["sm100_gemm_n256_cluster4"]),
        (path_cases()[0].clone(), vec!["sm100_gemm_n128_shallow"]),
        (path_cases()[3].clone(), vec!["sm100_gemm_n128_deep", "sm100_gemm_n256_cluster4"]),
    ];
    for (shapes, kernels) in expect {
        let plan = GemmPlan::new(&gpu, Problem::new(shapes.clone(), OutputType::F16).unwrap()).unwrap();
        let s = plan.summary();
        println!("PLAN {:?}: {}", shapes.iter().map(|s| (s.m, s.n, s.k)).collect::<Vec<_>>(), s.kernel);
        assert_eq!(s.arch, Arch::Sm100a);
        assert_eq!(s.launches.iter().map(|l| l.kernel).collect::<Vec<_>>(), kernels);
    }
}
