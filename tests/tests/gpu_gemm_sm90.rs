//! The Hopper grouped GEMM against the CPU reference, on the H200: the competition's test shapes,
//! the benchmark shapes, decode-sized problems, both input distributions, and 200 seeded random
//! problems with tails.
//! Each case, fp16 or bf16 output, poisons C (and guard elements around it) before each of two
//! runs, then checks every element against the reference rounded to the output type (fp16: atol =
//! rtol = 1e-3; bf16: rtol 4e-3), the guards, and bitwise determinism.
//! Full-range inputs additionally get the fp32-accumulation allowance of
//! `nvfp4_gemm_tests::accumulation_allowance` (their partial sums are not exact in fp32); the
//! competition's inputs do not (theirs are, and the results match bit for bit).
//! Ignored unless asked for: they need an sm_90a GPU (see `nvfp4_gemm_tests`).

use nvfp4_format::{GroupShape, InputDistribution};
use nvfp4_gemm::Arch;
use nvfp4_gemm_tests::cases::{self, with_dists, Multiples, RandomShapes};

fn run_all(test: &str, cases: &[(Vec<GroupShape>, InputDistribution)], seed: u64) {
    cases::run_all(test, Arch::Sm90a, cases, seed);
}

#[test]
#[ignore = "needs an sm_90a GPU"]
fn competition_shapes() {
    run_all("competition_shapes", &with_dists(cases::competition()), 1111);
}

#[test]
#[ignore = "needs an sm_90a GPU"]
fn benchmark_shapes() {
    run_all("benchmark_shapes", &with_dists(cases::benchmark()), 2222);
}

/// 200 problems: G in 1..=16, M in 0..=600 (any value), N a multiple of 8 up to 8192, K a multiple
/// of 64 up to 8192, half of them full-range inputs. The work per problem is capped so that the CPU
/// reference stays fast.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn random_shapes() {
    let cases = cases::random(&RandomShapes {
        seed: 0x5EED_0001,
        count: 200,
        max_groups: 16,
        empty_one_in: 10,
        m: Multiples::new(0, 1, 600),
        n: Multiples::new(8, 8, 8192),
        k: Multiples::new(64, 64, 8192),
        wide: None,
        max_work: 4 << 30,
    });
    run_all("random_shapes", &cases, 3333);
}

/// bf16 output on four competition shapes, with the guards and the determinism check.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn bf16_output() {
    cases::run_bf16("bf16_output", Arch::Sm90a, &cases::competition()[..4], 40);
}

/// M = 0 groups are skipped, a problem of no groups or only such groups writes nothing, and a
/// buffer of the wrong size or type is a typed error with C left untouched.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn empty_groups_and_bad_buffers() {
    cases::empty_groups_and_bad_buffers("empty_groups_and_bad_buffers", Arch::Sm90a);
}

/// Every group's buffers stacked in one allocation per operand (`GemmPlan::run_stacked`): the
/// same output as separate buffers, nothing written outside C, typed errors for a short buffer or
/// a wrong alpha count.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn stacked_buffers() {
    cases::stacked_buffers("stacked_buffers", Arch::Sm90a);
}

/// Decode-sized problems (every group at most 16 tokens: the two-CTAs-per-SM decode kernel) and
/// mixed ones (16-token tiles beside 128-token tiles in the general kernel): the three decode
/// benchmark shapes scaled down in K, K tails (K % 128 = 64, K = 64), N = 8·odd, empty groups,
/// and 60 random problems, both input distributions.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn decode_shapes() {
    let z = cases::z;
    let mut shapes = vec![
        z(&[4; 8], &[7168; 8], &[256; 8]),
        z(&[1, 2, 3, 4, 5, 6, 7, 8], &[7168; 8], &[2048; 8]),
        z(&[16; 4], &[4096; 4], &[1088; 4]),
        z(&[16, 0, 1, 9], &[8, 24, 136, 520], &[64, 192, 320, 1984]),
        z(&[0, 0], &[128, 256], &[64, 128]),
        // Mixed: small groups beside large ones.
        z(&[3, 200, 16, 17], &[264, 512, 1024, 128], &[448, 256, 640, 192]),
    ];
    shapes.extend(
        cases::random(&RandomShapes {
            seed: 0x5EED_0016,
            count: 60,
            max_groups: 24,
            empty_one_in: 6,
            m: Multiples::new(0, 1, 16),
            n: Multiples::new(8, 8, 4096),
            k: Multiples::new(64, 64, 4096),
            wide: None,
            max_work: 1 << 30,
        })
        .into_iter()
        .map(|(s, _)| s),
    );
    run_all("decode_shapes", &with_dists(shapes), 4444);
}
