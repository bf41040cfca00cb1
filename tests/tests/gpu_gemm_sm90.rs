//! The Hopper grouped GEMM against the CPU reference, on the H200: the competition's test shapes,
//! the benchmark shapes, both input distributions, and 200 seeded random problems with tails.
//! Each case poisons C (and guard elements around it) before each of two runs, then checks every
//! element against the fp64 reference (atol = rtol = 1e-3), the guards, and bitwise determinism.
//! Skipped with a printed reason without an sm_90 GPU.

use nvfp4_format::{GroupShape, InputDistribution, SplitMix64, Tolerance};
use nvfp4_gemm::Arch;
use nvfp4_gemm_tests::{gpu_or_skip, make_groups, run_case};

const DISTS: [InputDistribution; 2] = [InputDistribution::Competition, InputDistribution::FullRange];

fn competition_cases() -> Vec<Vec<GroupShape>> {
    let z = |m: &[usize], n: &[usize], k: &[usize]| GroupShape::zip(m, n, k).unwrap();
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
        // An older revision of the task used K = 128 and 384.
        z(&[96, 40], &[128, 256], &[128, 384]),
    ]
}

fn benchmark_cases() -> Vec<Vec<GroupShape>> {
    use nvfp4_format::generate::shapes::*;
    vec![B0.to_vec(), B1.to_vec(), B2.to_vec(), B3.to_vec()]
}

fn with_dists(cases: Vec<Vec<GroupShape>>) -> Vec<(Vec<GroupShape>, InputDistribution)> {
    cases.into_iter().flat_map(|c| DISTS.map(|d| (c.clone(), d))).collect()
}

fn run_all(test: &str, cases: &[(Vec<GroupShape>, InputDistribution)], seed: u64) {
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let mut failures = vec![];
    for (i, (shapes, dist)) in cases.iter().enumerate() {
        {
            let dist = *dist;
            let groups = make_groups(shapes, dist, seed + i as u64);
            let r = run_case(&gpu, &stream, &groups, Tolerance::COMPETITION);
            let ms: Vec<usize> = shapes.iter().map(|s| s.m).collect();
            let line = format!(
                "CASE {test}[{i}] {dist:?} g={} m={ms:?} n0={} k0={} guards={} deterministic={} {}",
                shapes.len(),
                shapes.first().map_or(0, |s| s.n),
                shapes.first().map_or(0, |s| s.k),
                r.guard_corruptions,
                r.deterministic,
                r.comparison
            );
            println!("{line}");
            if !r.passed() {
                failures.push(line);
            }
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
