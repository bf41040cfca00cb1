//! The Hopper grouped GEMM against the CPU reference, on the H200: the competition's test shapes,
//! the benchmark shapes, both input distributions, and 200 seeded random problems with tails.
//! Each case poisons C (and guard elements around it) before each of two runs, then checks every
//! element against the fp64 reference (atol = rtol = 1e-3), the guards, and bitwise determinism.
//! Full-range inputs additionally get the fp32-accumulation allowance of
//! `nvfp4_gemm_tests::accumulation_allowance` (their partial sums are not exact in fp32); the
//! competition's inputs do not (theirs are, and the results match bit for bit).
//! Skipped with a printed reason without an sm_90 GPU.

use nvfp4_format::{GroupShape, InputDistribution, SplitMix64, Tolerance};
use nvfp4_gemm::Arch;
use nvfp4_gemm_tests::cases::{self, with_dists, DISTS};
use nvfp4_gemm_tests::{gpu_or_skip, make_groups};

fn run_all(test: &str, cases: &[(Vec<GroupShape>, InputDistribution)], seed: u64) {
    cases::run_all(test, Arch::Sm90a, cases, seed);
}

#[test]
fn competition_shapes() {
    run_all("competition_shapes", &with_dists(cases::competition()), 1111);
}

#[test]
fn benchmark_shapes() {
    run_all("benchmark_shapes", &with_dists(cases::benchmark()), 2222);
}

/// 200 problems: G in 1..=16, M in 0..=600 (any value), N a multiple of 8 up to 8192, K a multiple
/// of 64 up to 8192, half of them full-range inputs. The work per problem is capped so that the CPU reference stays fast.
#[test]
fn random_shapes() {
    let mut rng = SplitMix64::new(0x5EED_0001);
    let mut cases = vec![];
    while cases.len() < 200 {
        let g = 1 + rng.below(16) as usize;
        let shapes: Vec<GroupShape> = (0..g)
            .map(|_| {
                let m = if rng.below(10) == 0 { 0 } else { rng.below(601) as usize };
                let n = 8 * (1 + rng.below(1024)) as usize;
                let k = 64 * (1 + rng.below(128)) as usize;
                GroupShape::new(m, n, k)
            })
            .collect();
        let work: usize = shapes.iter().map(|s| s.m * s.n * s.k).sum();
        if work <= 4 << 30 {
            // Alternate the two input distributions.
            cases.push((shapes, DISTS[cases.len() % 2]));
        }
    }
    run_all("random_shapes", &cases, 3333);
}

/// bf16 output on four competition shapes; C is poisoned first.
#[test]
fn bf16_output() {
    cases::run_bf16("bf16_output", Arch::Sm90a, &cases::competition()[..4], 40);
}

/// M = 0 groups are skipped, a problem of only such groups (or of no groups) launches nothing,
/// and a buffer of the wrong size is a typed error with C left untouched.
#[test]
fn empty_groups_and_bad_buffers() {
    use nvfp4_gemm::{DeviceNvfp4, Error, GemmPlan, GroupArgs, Output, OutputType, Problem};
    let Some(gpu) = gpu_or_skip("empty_groups_and_bad_buffers", Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let mut none = GemmPlan::new(&gpu, Problem::new(vec![], OutputType::F16).unwrap()).unwrap();
    none.run(&stream, &mut []).unwrap();

    let shapes = vec![GroupShape::new(0, 256, 512), GroupShape::new(24, 136, 192)];
    let groups = make_groups(&shapes, InputDistribution::Competition, 5);
    let dev: Vec<_> = groups
        .iter()
        .map(|g| (DeviceNvfp4::upload(&stream, &g.a).unwrap(), DeviceNvfp4::upload(&stream, &g.b).unwrap()))
        .collect();
    let mut plan = GemmPlan::new(&gpu, Problem::new(shapes.clone(), OutputType::F16).unwrap()).unwrap();
    let poison = half::f16::from_bits(0x7FFF);
    let mut c0 = stream.clone_htod(&[poison; 16]).unwrap();
    let mut c1 = stream.clone_htod(&vec![poison; 24 * 136]).unwrap();
    // Wrong: group 1's C one row short.
    let mut short = stream.clone_htod(&vec![poison; 23 * 136]).unwrap();
    {
        let mut args = vec![
            GroupArgs { a: dev[0].0.operand(), b: dev[0].1.operand(), c: Output::F16(&mut c0), alpha: 1.0 },
            GroupArgs { a: dev[1].0.operand(), b: dev[1].1.operand(), c: Output::F16(&mut short), alpha: 1.0 },
        ];
        let err = plan.run(&stream, &mut args).unwrap_err();
        assert!(matches!(err, Error::InvalidGroup { group: 1, field: "c", .. }), "{err}");
    }
    stream.synchronize().unwrap();
    assert!(stream.clone_dtoh(&short).unwrap().iter().all(|x| x.to_bits() == 0x7FFF), "C written despite the error");
    {
        let mut args = vec![
            GroupArgs { a: dev[0].0.operand(), b: dev[0].1.operand(), c: Output::F16(&mut c0), alpha: 1.0 },
            GroupArgs { a: dev[1].0.operand(), b: dev[1].1.operand(), c: Output::F16(&mut c1), alpha: 1.0 },
        ];
        plan.run(&stream, &mut args).unwrap();
    }
    let got = vec![stream.clone_dtoh(&c0).unwrap()[..0].to_vec(), stream.clone_dtoh(&c1).unwrap()];
    let cmp =
        nvfp4_format::compare(&got, &nvfp4_format::reference_grouped_gemm(&groups).unwrap(), Tolerance::COMPETITION)
            .unwrap();
    println!("CASE empty_groups {cmp}");
    assert!(cmp.passed(), "{cmp}");
}
