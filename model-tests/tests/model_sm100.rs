//! The sm_100a entry points (`sm100_gemm_n128_deep`, `sm100_gemm_n128_shallow`,
//! `sm100_gemm_n256_cluster4`) run in the device model on problems the library plans, against the
//! CPU reference: the competition's test shapes (unscaled: the model runs them in seconds), the
//! K tails (K % 256 ≠ 0 takes the 2D map; K = 64/128/192 is narrower than the 256-value box), M not
//! a multiple of 128, N = 8·odd, empty groups, random problems, several completion orders, both
//! TMEM placements, and persistent grids (several tiles per CTA, so rings wrap and the
//! accumulator is handed over between tiles).
//!
//! The 256-wide variant runs only where the library chooses it (N ≥ 4096, K ≥ 2048, N % 256 = 0),
//! so its problems are the smallest such: M is small.

use nvfp4_format::GroupShape;
use nvfp4_format::InputDistribution::{Competition, FullRange};
use nvfp4_gemm::OutputType::{self, Bf16, F16};
use nvfp4_gemm_abi::sm100::params::{N128_DEEP_KERNEL, N128_SHALLOW_KERNEL, N256_CLUSTER4_KERNEL};
use nvfp4_gemm_model_tests::*;

/// The competition's 10 test shapes and one with K = 128 and 384.
fn competition() -> Vec<Vec<GroupShape>> {
    nvfp4_format::generate::shapes::competition()
}

/// The tails: K = 64/128/192 (one stage, box wider than K), K % 256 ≠ 0 after full stages, M not a
/// multiple of 128 (and M < 16, so an epilogue warp's second half is skipped), N = 8·odd (a
/// partial 128-column chunk and a partial last tile), an empty group.
fn tails() -> Vec<GroupShape> {
    z(&[100, 8, 130, 0, 200], &[136, 24, 264, 128, 8], &[64, 192, 320, 256, 128])
}

/// Runs `shapes` on sm_100a with `residency` and checks that exactly the `expected` kernels ran.
fn check_sm100(
    name: &str,
    shapes: &[GroupShape],
    seed: u64,
    out: OutputType,
    residency: Residency,
    run: &ModelRun,
    expected: &[&str],
) {
    let g = groups(shapes, Competition, seed);
    let launched = run_and_check(name, &g, out, run, |o, r| run_sm100(o, residency, r));
    let names: Vec<&str> = launched.iter().map(|l| l.kernel).collect();
    assert_eq!(names, expected, "{name}: the layout chose other kernels");
}

const DEEP: &str = N128_DEEP_KERNEL.kernel_name();
const SHALLOW: &str = N128_SHALLOW_KERNEL.kernel_name();
const CLUSTER4: &str = N256_CLUSTER4_KERNEL.kernel_name();

/// The orders the model completes asynchronous operations in: oldest first, newest first, and
/// seeded random orders.
fn orders() -> Vec<(Completion, u64)> {
    vec![(Completion::InOrder, 1), (Completion::Reversed, 2), (Completion::Random, 3), (Completion::Random, 4)]
}

#[test]
fn model_n128_deep_competition_shapes() {
    for (i, s) in competition().iter().enumerate() {
        // 3 resident CTAs: persistent grids (up to 9 tiles per CTA).
        check_sm100(
            &format!("n128_deep competition {i}"),
            s,
            i as u64,
            F16,
            Residency::deep(3),
            &ModelRun::default(),
            &[DEEP],
        );
    }
}

#[test]
fn model_n128_deep_k_tails_and_box_wider_than_k() {
    check_sm100("n128_deep tails", &tails(), 11, F16, Residency::deep(2), &ModelRun::default(), &[DEEP]);
    // One CTA per tile (no persistence), bf16 output.
    check_sm100("n128_deep tails bf16", &tails(), 12, Bf16, Residency::deep(64), &ModelRun::default(), &[DEEP]);
}

#[test]
fn model_n128_deep_random_shapes() {
    for seed in 0..6 {
        let shapes = random_shapes(100 + seed, 4, 300, 400, 640);
        let expected: &[&str] = if shapes.iter().all(|s| s.m == 0) { &[] } else { &[DEEP] };
        check_sm100(
            &format!("n128_deep random {seed} {shapes:?}"),
            &shapes,
            seed,
            F16,
            Residency::deep(3),
            &ModelRun::default(),
            expected,
        );
    }
}

/// K = 1600 is 7 stages of 256 in the 6-stage ring (a refill within one tile); the other group
/// has 3 × 2 tiles with K < 256, so with 2 CTAs the accumulator is handed over several times.
#[test]
fn model_n128_deep_completion_orders() {
    let shapes = z(&[40, 200], &[136, 264], &[1600, 192]);
    for (order, seed) in orders() {
        let run = ModelRun::ordered(order, seed);
        check_sm100(&format!("n128_deep {order:?} seed {seed}"), &shapes, 7, F16, Residency::deep(2), &run, &[DEEP]);
    }
    // Operations also completing while threads could run (not only when all wait).
    let mut run = ModelRun::ordered(Completion::Random, 5);
    run.schedule.eager_permille = 100;
    check_sm100("n128_deep eager completions", &shapes, 7, F16, Residency::deep(2), &run, &[DEEP]);
}

/// Full-range inputs (every e2m1 code, every finite scale): the model's MMA sums exactly and
/// rounds once, so even these match the reference to the competition tolerance.
#[test]
fn model_n128_deep_full_range_inputs() {
    let shapes = z(&[100, 40], &[136, 8], &[320, 64]);
    let g = groups(&shapes, FullRange, 21);
    run_and_check("n128_deep full range", &g, F16, &ModelRun::default(), |o, r| run_sm100(o, Residency::deep(2), r));
}

#[test]
fn model_n128_shallow_competition_shapes() {
    // 1 SM: two shallow CTAs share its TMEM; every list longer than 2 items runs shallow.
    for (i, s) in competition().iter().enumerate() {
        check_sm100(
            &format!("n128_shallow competition {i}"),
            s,
            50 + i as u64,
            F16,
            Residency::shallow(1),
            &ModelRun::default(),
            &[SHALLOW],
        );
    }
}

#[test]
fn model_n128_shallow_tails_random_and_orders() {
    check_sm100("n128_shallow tails", &tails(), 31, F16, Residency::shallow(1), &ModelRun::default(), &[SHALLOW]);
    for seed in 0..4 {
        let mut shapes = random_shapes(200 + seed, 4, 300, 400, 640);
        // At least 3 tiles, so that the shallow kernel is chosen.
        shapes.push(GroupShape::new(129, 264, 192));
        check_sm100(
            &format!("n128_shallow random {seed} {shapes:?}"),
            &shapes,
            seed,
            F16,
            Residency::shallow(1),
            &ModelRun::default(),
            &[SHALLOW],
        );
    }
    for (order, seed) in orders() {
        let run = ModelRun::ordered(order, seed);
        check_sm100(
            &format!("n128_shallow {order:?} seed {seed}"),
            &tails(),
            8,
            F16,
            Residency::shallow(1),
            &run,
            &[SHALLOW],
        );
    }
}

/// Two shallow CTAs per SM allocate 256 TMEM columns each: whichever placement the allocator
/// picks, one of them gets base column 256, so a kernel assuming base 0 would read or write the
/// other CTA's columns. Both placements must give the right result.
#[test]
fn model_n128_shallow_tmem_base_not_zero() {
    for tmem in [TmemPlacement::Highest, TmemPlacement::Lowest] {
        let run = ModelRun { tmem, ..ModelRun::default() };
        check_sm100(&format!("n128_shallow TMEM {tmem:?}"), &tails(), 9, F16, Residency::shallow(1), &run, &[SHALLOW]);
    }
}

/// The smallest problems the library runs 256-wide: K = 2048 (3D map) and K = 2112 (2D map, a
/// last stage of one K = 64 step), M tails, one and two clusters; and the cluster padding (N =
/// 4352: 17 tiles of 256 padded to 20).
#[test]
fn model_n256_cluster4_shapes() {
    check_sm100(
        "n256_cluster4 2D K tail",
        &z(&[40], &[4096], &[2112]),
        41,
        F16,
        Residency::deep(4),
        &ModelRun::default(),
        &[CLUSTER4],
    );
    check_sm100(
        "n256_cluster4 3D",
        &z(&[130], &[4096], &[2048]),
        42,
        F16,
        Residency::deep(8),
        &ModelRun::default(),
        &[CLUSTER4],
    );
    check_sm100(
        "n256_cluster4 padded",
        &z(&[9], &[4352], &[2048]),
        43,
        Bf16,
        Residency::deep(8),
        &ModelRun::default(),
        &[CLUSTER4],
    );
}

#[test]
fn model_n256_cluster4_completion_orders() {
    for (order, seed) in orders().into_iter().skip(1) {
        let run = ModelRun::ordered(order, seed);
        check_sm100(
            &format!("n256_cluster4 {order:?} seed {seed}"),
            &z(&[24], &[4096], &[2112]),
            44,
            F16,
            Residency::deep(4),
            &run,
            &[CLUSTER4],
        );
    }
}

/// A problem with both tile widths: two launches over one group table and one map table.
#[test]
fn model_n128_deep_and_n256_cluster4_in_one_problem() {
    let shapes = z(&[40, 96, 0], &[4096, 136, 4096], &[2112, 192, 2048]);
    check_sm100("mixed widths", &shapes, 45, F16, Residency::deep(4), &ModelRun::default(), &[DEEP, CLUSTER4]);
}

/// Host bugs the cluster kernel guards against (departure D6 of docs/provenance.md): a work list
/// whose length is not a multiple of the cluster, or whose clusters do not share rank 0's A tile,
/// must stop the kernel with `trap` rather than hang or multiply by another tile's A.
#[test]
fn model_n256_cluster4_traps_on_a_broken_work_list() {
    let g = groups(&z(&[130], &[4096], &[2048]), Competition, 46);
    let ops = Operands::new(&g, F16);
    type Edit = fn(&mut nvfp4_gemm::layout::Sm100Layout);
    let cases: [(&str, Edit); 2] = [
        ("list not a multiple of 4", |l| {
            l.launches[0].work.pop();
        }),
        // Items 0..16 are M tile 0, 16..32 M tile 1.
        ("cluster items with different A tiles", |l| l.launches[0].work.swap(1, 16)),
    ];
    for (what, edit) in cases {
        let err = run_sm100_with(&ops, Residency::deep(4), &ModelRun::default(), edit)
            .expect_err("the kernel must refuse the list");
        assert_eq!(err.error.kind, ErrorKind::Trap, "{what}: {err}");
        eprintln!("{what}: {}", err.error.message);
    }
}
