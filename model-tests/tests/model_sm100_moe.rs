//! Device-resident group sizes on sm_100a (`nvfp4_gemm::moe`, docs/moe.md), run in
//! the device model: `sm100_schedule` reads the sizes and writes the group table, the work list
//! and its length and the status word; then the GEMM variant the library's layout chose walks that
//! list. Both run on the tables `Sm100DeviceLayout` (the library's planning code) builds, with
//! the maps encoded by the model. Checked: C of every group against the CPU reference, rows of no
//! group untouched, the guards around C, the status bits, and that the list the device built is
//! exactly the host-built list for the same (clamped) sizes — for the 256-wide cluster kernel
//! that includes its padding to multiples of 4.
//!
//! Nothing of this has run on a B200 (none is available): the model's reading of the PTX ISA is
//! the only check of these kernels beyond ptxas.

use nvfp4_gemm::moe::{GroupRows, MoeProblem, TokenLayout};
use nvfp4_gemm::OutputType::{self, Bf16, F16};
use nvfp4_gemm_abi::moe::{
    STATUS_COUNT_OVER_BOUND, STATUS_OFFSETS_DECREASING, STATUS_ROWS_OVER_BOUND, STATUS_WORK_OVERFLOW,
};
use nvfp4_gemm_abi::sm100::params::{
    GroupParams as Sm100GroupParams, N128_DEEP_KERNEL, N128_SHALLOW_KERNEL, N256_CLUSTER4_KERNEL,
};
use nvfp4_gemm_abi::sm100::BlockN;
use nvfp4_gemm_model_tests::*;

fn contiguous(groups: usize, n: usize, k: usize, max_tokens: usize, out: OutputType) -> MoeProblem {
    MoeProblem::new(groups, n, k, TokenLayout::Contiguous { max_tokens }, out).unwrap()
}

fn masked(groups: usize, n: usize, k: usize, max_rows: usize, out: OutputType) -> MoeProblem {
    MoeProblem::new(groups, n, k, TokenLayout::Masked { max_rows }, out).unwrap()
}

/// Runs one call in the model, checks C, the status word and the device-built list; returns the
/// kernel that ran.
fn check(name: &str, problem: MoeProblem, sizes: &[u32], seed: u64, residency: Residency) -> &'static str {
    let ops = MoeOperands::new(problem, sizes.to_vec(), seed);
    let t = std::time::Instant::now();
    let (launched, outcome, layout) =
        run_sm100_moe(&ops, residency, &ModelRun::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
    if let Err(e) = ops.check() {
        panic!("{name}: wrong result: {e}");
    }
    assert_eq!(outcome.status, ops.status.0, "{name}: status word");
    let expected = expected_device_list(&layout, &ops.problem, &ops.rows);
    assert_eq!(outcome.work_len as usize, expected.len(), "{name}: work length");
    assert_eq!(outcome.work, expected, "{name}: the device list differs from the host order");
    if layout.block_n == BlockN::N256 {
        assert_eq!(outcome.work_len % 4, 0, "{name}: a cluster list must be a multiple of 4");
    }
    for (g, (p, r)) in outcome.groups.iter().zip(&ops.rows).enumerate() {
        assert_eq!((p.m, p.token_row), (r.rows, r.first), "{name}: group {g}");
    }
    eprintln!(
        "{name}: ok in {:.2?} ({} items of capacity {}; {})",
        t.elapsed(),
        outcome.work_len,
        layout.max_work,
        launched
            .iter()
            .map(|l| format!("{} grid {}: {} instr", l.kernel, l.geometry.grid, l.stats.instructions))
            .collect::<Vec<_>>()
            .join("; ")
    );
    launched[1].kernel
}

const DEEP: &str = N128_DEEP_KERNEL.kernel_name();
const SHALLOW: &str = N128_SHALLOW_KERNEL.kernel_name();
const CLUSTER4: &str = N256_CLUSTER4_KERNEL.kernel_name();

/// Contiguous layout, 128-wide tiles on the 6-stage kernel (3 resident CTAs: persistent): empty
/// groups (first, middle, last), a group of 7 rows, a group of 133 rows starting at row 7 (two M
/// tiles, neither aligned to 128, the second reading other groups' rows), N = 136 (a partial N
/// tile), K = 320 (2D map, a K tail); then one expert taking every token, K = 256 (3D map), bf16.
#[test]
fn model_sm100_moe_device_sizes_contiguous_n128_deep() {
    let p = contiguous(6, 136, 320, 300, F16);
    let ran = check("contiguous deep", p, &[0, 0, 7, 7, 140, 300, 300], 1, Residency::deep(3));
    assert_eq!(ran, DEEP);
    let p = contiguous(4, 136, 256, 300, Bf16);
    let ran = check("contiguous deep: one expert takes every token", p, &[0, 0, 300, 300, 300], 2, Residency::deep(3));
    assert_eq!(ran, DEEP);
}

/// Masked layout on the 3-stage kernel (two CTAs on one SM; the capacity of 12 items is more
/// than two waves of the 6-stage kernel): counts 0, M_max, 1, 17; then one expert taking M_max
/// tokens and the others none. N = 264 (3 N tiles, the last partial), K = 192 (one stage, box
/// wider than K).
#[test]
fn model_sm100_moe_device_sizes_masked_n128_shallow() {
    let p = masked(4, 264, 192, 40, F16);
    assert_eq!(check("masked shallow", p.clone(), &[0, 40, 1, 17], 3, Residency::shallow(1)), SHALLOW);
    assert_eq!(check("masked shallow: one expert", p, &[0, 40, 0, 0], 4, Residency::shallow(1)), SHALLOW);
}

/// Sizes beyond the bounds: clamped (the results of the clamped groups are still checked) and
/// flagged. Contiguous offsets above T; masked counts above M_max; decreasing offsets whose
/// overlapping groups also overflow the work list (only the status, the untouched rows and guards
/// are checked there: overlapping rows are unspecified).
#[test]
fn model_sm100_moe_device_sizes_over_bound_clamps_and_sets_status() {
    let p = contiguous(3, 72, 128, 300, F16);
    check("offsets above T", p, &[0, 50, 400, 500], 5, Residency::deep(2));
    let p = masked(2, 72, 128, 40, F16);
    check("counts above M_max", p, &[45, 3], 6, Residency::deep(2));
    let p = contiguous(3, 8, 64, 129, F16);
    let ops = MoeOperands::new(p, vec![0, 129, 0, 129], 7);
    assert_eq!(ops.status.0, STATUS_OFFSETS_DECREASING);
    assert!(ops.overlapping());
    let (_, outcome, layout) = run_sm100_moe(&ops, Residency::deep(2), &ModelRun::default()).unwrap();
    ops.check().unwrap();
    // Groups 0 and 2 take 2 M tiles each; the capacity is min(3, 129) + 126/128 = 3.
    assert_eq!(outcome.status, STATUS_OFFSETS_DECREASING | STATUS_WORK_OVERFLOW);
    assert_eq!((layout.max_work, outcome.work_len), (3, 3));
    assert_eq!(outcome.work, expected_device_list(&layout, &ops.problem, &ops.rows));
}

/// The 256-wide cluster kernel (the variant of the MoE shapes, N ≥ 4096 and K ≥ 2048):
/// N = 4352 has 17 N tiles, padded on the device to 20 per M tile; an empty group, a group of 9
/// rows and one of 31 rows starting at row 9. The capacity (3 M tiles · 20) is longer than the
/// list the device writes (2 · 20): the clusters walk the device length, a multiple of 4.
#[test]
fn model_sm100_moe_device_sizes_n256_cluster4_padded_on_the_device() {
    let p = contiguous(3, 4352, 2048, 40, Bf16);
    assert_eq!(check("n256 cluster4", p, &[0, 0, 9, 40], 8, Residency::deep(8)), CLUSTER4);
}

/// The scheduler alone, on many groups (several per thread) with random sizes: both layouts, both
/// list orders, within and beyond the bounds. The group table's size fields and the list must be
/// exactly what the host computes for the clamped sizes.
#[test]
fn model_sm100_moe_device_sizes_schedule_many_groups() {
    let mut rng = nvfp4_format::SplitMix64::new(9);
    let mut seen = 0;
    for case in 0..6 {
        let (n, k) = if case % 2 == 0 { (136, 64) } else { (4352, 2048) };
        let groups = 300 + rng.below(400) as usize;
        let (problem, sizes) = if case < 4 {
            let t = 200 + rng.below(3000) as usize;
            let mut offsets: Vec<u32> = (0..=groups).map(|_| rng.below(t as u64 + 20) as u32).collect();
            offsets.sort();
            if case < 2 {
                offsets.iter_mut().for_each(|o| *o = (*o).min(t as u32));
                offsets[0] = 0;
            }
            (contiguous(groups, n, k, t, F16), offsets)
        } else {
            let m = 1 + rng.below(300) as usize;
            let counts = (0..groups).map(|_| rng.below(m as u64 + 5) as u32).collect();
            (masked(groups, n, k, m, F16), counts)
        };
        let (rows, status) = problem.group_rows(&sizes).unwrap();
        let outcome = schedule_only(&problem, &sizes, &rows);
        assert_eq!(outcome.status, status.0, "case {case}");
        if case < 2 {
            assert_eq!(status.0, 0);
        }
        seen |= status.0;
    }
    assert_eq!(seen, STATUS_ROWS_OVER_BOUND | STATUS_COUNT_OVER_BOUND, "the random sizes went beyond both bounds");
}

/// Runs only `sm100_schedule` on `sizes` (the other buffers are addresses the scheduler only
/// computes with) and checks the table fields and the list; returns what it wrote.
fn schedule_only(problem: &MoeProblem, sizes: &[u32], rows: &[GroupRows]) -> ScheduleOutcome<Sm100GroupParams> {
    let t = std::time::Instant::now();
    let layout = nvfp4_gemm::layout::Sm100DeviceLayout::new(problem, |k| Residency::deep(148).of(k)).unwrap();
    let (_sizes_buf, buffers) = schedule_only_buffers(problem, sizes);
    let tables = MoeTables::new(&layout, &buffers);
    run_sm100_schedule(&layout, &buffers, &tables, &ModelRun::default()).unwrap();
    let outcome = tables.outcome();
    let k = problem.k() as u64;
    for (g, (p, r)) in outcome.groups.iter().zip(rows).enumerate() {
        assert_eq!((p.m, p.token_row), (r.rows, r.first), "group {g}");
        assert_eq!(p.a_scales, buffers.a.scales() + r.scale_first as u64 * k / 16, "group {g}");
        assert_eq!(p.c, buffers.c.ptr + r.first as u64 * problem.n() as u64 * 2, "group {g}");
        assert_eq!((p.n, p.k, p.ldc), (problem.n() as u32, k as u32, problem.n() as u32), "group {g}: host fields");
    }
    let expected = expected_device_list(&layout, problem, rows);
    assert_eq!(outcome.work_len as usize, expected.len());
    assert!(outcome.work == expected, "the device list differs from the host order");
    if layout.block_n == BlockN::N256 {
        assert_eq!(outcome.work_len % 4, 0);
    }
    eprintln!(
        "schedule {} groups, {:?}: {} items of {} in {:.2?}",
        problem.groups(),
        problem.layout(),
        outcome.work_len,
        layout.max_work,
        t.elapsed()
    );
    outcome
}
