//! Device-resident group sizes on sm_90a (`nvfp4_gemm::moe`), run in the device model on the
//! tables `Sm90DeviceLayout` (the library's planning code) builds, with the maps encoded by the
//! model: `sm90_schedule`, `sm90_dequant_tokens`, then every GEMM kernel the plan launches (the
//! one the scheduler did not choose finds a length of 0). Checked: C of every group against the
//! CPU reference, rows of no group untouched, the guards around C, the status bits — and that the
//! scheduler built exactly what the host-sized planner builds for the same (clamped) sizes: the
//! kernel (decode when no group has more than 16 rows), the work list item for item (the plain
//! order, or the general kernel's LPT order with its holes; for `N192`, whose weight spans the
//! device fixes from N where the host planner searches for them, the same items), and each
//! group's tile heights, box heights and dequantization CTAs. The same path runs on the H200 in `gpu_moe_sm90`.

use nvfp4_gemm::layout::Sm90Layout;
use nvfp4_gemm::moe::{GroupRows, MoeKernels, MoeOptions, MoeProblem, TokenLayout};
use nvfp4_gemm::OutputType::{self, Bf16, F16};
use nvfp4_gemm::{GroupShape, Problem};
use nvfp4_gemm_abi::moe::sm90::{chosen_config, runs_decode, GroupTiles, WeightTiles};
use nvfp4_gemm_abi::moe::{STATUS_COUNT_OVER_BOUND, STATUS_OFFSETS_DECREASING, STATUS_ROWS_OVER_BOUND};
use nvfp4_gemm_abi::sm90::{tail_box_rows, GemmConfig, GroupParams, WorkItem, SMALL_TILE_M};
use nvfp4_gemm_model_tests::*;

fn problem(groups: usize, n: usize, k: usize, layout: TokenLayout, out: OutputType) -> MoeProblem {
    MoeProblem::new(groups, n, k, layout, out).unwrap()
}

const AUTO: MoeOptions =
    MoeOptions { kernels: MoeKernels::Auto, tail64: false, spans192: false, caller_dequantizes: false };

/// What the host-sized planner builds for `rows` (the clamped sizes) with the kernel the device
/// plan's scheduler must choose, on `sm_count` SMs: the configuration and the work list. A group
/// of more than 16 rows on the decode kernel (a plan that launches only that one) has no
/// host-sized counterpart; the list is then the plain order of its 16-row tiles, the order the
/// host's LPT keeps for items of one cost.
fn host_plan(
    problem: &MoeProblem,
    rows: &[GroupRows],
    sm_count: u32,
    layout: &nvfp4_gemm::layout::Sm90DeviceLayout,
) -> (GemmConfig, Vec<WorkItem>, Option<Sm90Layout>) {
    let wide = rows.iter().any(|r| r.rows > SMALL_TILE_M);
    let config = chosen_config(runs_decode(layout.kernels, wide), layout.general);
    let shapes: Vec<GroupShape> =
        rows.iter().map(|r| GroupShape::new(r.rows as usize, problem.n(), problem.k())).collect();
    let host = Problem::new(shapes, problem.output()).expect("the clamped groups form a host problem");
    if config == GemmConfig::N192 {
        // The device's spans are fixed from N (`weight_tile`) where the host planner searches
        // for the split: the same items, compared as a set (`check_schedule`).
        let tiles = WeightTiles::new(config, problem.n() as u32);
        let list = rows
            .iter()
            .enumerate()
            .flat_map(|(g, r)| {
                let mt = GroupTiles::new(config, r.rows).m_tiles;
                (0..tiles.count()).flat_map(move |j| {
                    (0..mt).map(move |tile_m| WorkItem { group: g as u32, tile_m, tile_n: tiles.tile_n(j) })
                })
            })
            .collect();
        return (config, list, Sm90Layout::with_config(&host, sm_count, config));
    }
    match Sm90Layout::with_config(&host, sm_count, config) {
        Some(l) => (config, l.work.clone(), Some(l)),
        None => {
            let weight_tiles = (problem.n() as u32).div_ceil(128);
            let list = rows
                .iter()
                .enumerate()
                .flat_map(|(g, r)| {
                    let mt = GroupTiles::new(config, r.rows).m_tiles;
                    (0..weight_tiles)
                        .flat_map(move |tile_n| (0..mt).map(move |tile_m| WorkItem { group: g as u32, tile_m, tile_n }))
                })
                .collect();
            (config, list, None)
        }
    }
}

/// Checks what the scheduler wrote against the host planner: the kernel that got the call, its
/// list, and each group's fields.
fn check_schedule(
    name: &str,
    problem: &MoeProblem,
    rows: &[GroupRows],
    sm_count: u32,
    layout: &nvfp4_gemm::layout::Sm90DeviceLayout,
    outcome: &ScheduleOutcome<GroupParams>,
) -> GemmConfig {
    let (config, expected, host) = host_plan(problem, rows, sm_count, layout);
    let slot = (config != GemmConfig::DECODE) as usize;
    assert!(layout.gemms[slot].is_some(), "{name}: the chosen kernel is launched");
    assert_eq!(outcome.work_lens[1 - slot], 0, "{name}: the other launch gets no work");
    if config == GemmConfig::N192 {
        let sorted = |w: &[WorkItem]| {
            let mut v: Vec<(u32, u32, u32)> =
                w.iter().filter(|w| !w.is_hole()).map(|w| (w.group, w.tile_n, w.tile_m)).collect();
            v.sort_unstable();
            v
        };
        assert!(outcome.work_lens[slot] as usize >= expected.len(), "{name}: list length");
        assert!(sorted(&outcome.work) == sorted(&expected), "{name}: the device list's items differ ({config:?})");
    } else {
        assert_eq!(outcome.work_lens[slot] as usize, expected.len(), "{name}: list length");
        assert!(outcome.work == expected, "{name}: the device list differs from the host planner's ({config:?})");
    }
    let token_maps = layout.token_maps(slot);
    for (g, (p, r)) in outcome.groups.iter().zip(rows).enumerate() {
        let block_m = config.tile_rows(r.rows);
        let tail = tail_box_rows(r.rows, block_m);
        assert_eq!((p.m, p.token_row, p.block_m, p.tail_rows), (r.rows, r.first, block_m, tail), "{name}: group {g}");
        assert_eq!(
            (p.token_map, p.tail_token_map),
            (token_maps + block_m - 1, token_maps + tail - 1),
            "{name}: group {g}"
        );
        if let Some(h) = &host {
            assert_eq!((p.dequant_first_cta, p.dequant_ctas), h.dequant_ctas[g], "{name}: group {g}");
            assert_eq!(h.config.tile_rows(r.rows), block_m);
        }
    }
    config
}

/// Runs one call in the model and checks it; returns the configuration that did the work.
fn check(
    name: &str,
    problem: MoeProblem,
    sizes: &[u32],
    seed: u64,
    sm_count: u32,
    options: &MoeOptions,
    run: &ModelRun,
) -> GemmConfig {
    let ops = MoeOperands::new(problem, sizes.to_vec(), seed);
    let t = std::time::Instant::now();
    let (launched, outcome, layout) =
        run_sm90_moe(&ops, sm_count, options, run).unwrap_or_else(|e| panic!("{name}: {e}"));
    if let Err(e) = ops.check() {
        panic!("{name}: wrong result: {e}");
    }
    assert_eq!(outcome.status, ops.status.0, "{name}: status word");
    let config = check_schedule(name, &ops.problem, &ops.rows, sm_count, &layout, &outcome);
    eprintln!(
        "{name}: ok in {:.2?} ({config:?}, {} of {:?} list entries; {})",
        t.elapsed(),
        outcome.work_len,
        layout.gemms.map(|g| g.map(|g| g.max_list)),
        launched.iter().map(|l| format!("{} grid {}", l.kernel, l.geometry.grid)).collect::<Vec<_>>().join(", ")
    );
    config
}

/// Contiguous offsets: an empty expert, groups not starting at a multiple of 128, one expert with
/// most tokens (two 128-row tiles, the second with a 9-row box), K with a 64-tail, N = 8·odd; the
/// general kernel on 2 SMs, so that its 8 items are laid out longest first over 2 CTAs.
#[test]
fn model_sm90_moe_device_sizes_contiguous_general_balanced() {
    let p = problem(4, 136, 320, TokenLayout::Contiguous { max_tokens: 150 }, F16);
    assert_eq!(check("contiguous", p, &[0, 3, 3, 140, 150], 1, 2, &AUTO, &ModelRun::default()), GemmConfig::GENERAL);
}

/// The same sizes on the 64/128 kernel (the last tile of 137 rows runs 64 wide, from a 9-row
/// box), bf16, 3 SMs.
#[test]
fn model_sm90_moe_device_sizes_contiguous_tail64() {
    let p = problem(4, 136, 320, TokenLayout::Contiguous { max_tokens: 150 }, Bf16);
    let options = MoeOptions { kernels: MoeKernels::General, tail64: true, spans192: false, caller_dequantizes: false };
    assert_eq!(check("tail64", p, &[0, 3, 3, 140, 150], 2, 3, &options, &ModelRun::default()), GemmConfig::T64);
}

/// The general kernel over `N192` spans (`MoeOptions::spans192`): N = 320 is a 128-row span and
/// a 192-row one, the groups' last tiles 64 wide where they fit, 3 SMs (the LPT order); alone,
/// and beside the decode kernel (the table with both weight maps per group, each launch from its
/// own base), where groups of at most 16 rows go to the decode kernel; and the same with the
/// general kernel launched first (`MoeKernels::AutoGeneralFirst`).
#[test]
fn model_sm90_moe_device_sizes_spans192() {
    let p = || problem(4, 320, 256, TokenLayout::Contiguous { max_tokens: 150 }, Bf16);
    let general = MoeOptions { kernels: MoeKernels::General, tail64: false, spans192: true, caller_dequantizes: false };
    let auto = MoeOptions { kernels: MoeKernels::Auto, ..general };
    let run = ModelRun::default();
    assert_eq!(check("spans192", p(), &[0, 3, 3, 140, 150], 2, 3, &general, &run), GemmConfig::N192);
    assert_eq!(check("spans192 auto", p(), &[0, 3, 3, 140, 150], 4, 3, &auto, &run), GemmConfig::N192);
    assert_eq!(check("spans192 auto, small groups", p(), &[0, 5, 5, 21, 37], 5, 3, &auto, &run), GemmConfig::DECODE);
    let first = MoeOptions { kernels: MoeKernels::AutoGeneralFirst, ..general };
    assert_eq!(check("spans192 general first", p(), &[0, 3, 3, 140, 150], 4, 3, &first, &run), GemmConfig::N192);
    let small = check("spans192 general first, small groups", p(), &[0, 5, 5, 21, 37], 5, 3, &first, &run);
    assert_eq!(small, GemmConfig::DECODE);
}

/// A bound far above 16 tokens per group, sizes of at most 16: the decode kernel takes the call
/// (as a host-sized plan of these sizes would run), the general kernel launched after it finds
/// no work; the boxes are the groups' own rows.
#[test]
fn model_sm90_moe_device_sizes_auto_picks_the_decode_kernel() {
    let p = problem(5, 24, 256, TokenLayout::Contiguous { max_tokens: 60 }, F16);
    assert_eq!(check("auto decode", p, &[0, 4, 4, 20, 36, 37], 3, 2, &AUTO, &ModelRun::default()), GemmConfig::DECODE);
}

/// A plan of the decode kernel alone given a group of 40 rows (three 16-row tiles, the last an
/// 8-row box) and one of 17: still exact.
#[test]
fn model_sm90_moe_device_sizes_decode_only_takes_larger_groups() {
    let p = problem(3, 40, 128, TokenLayout::Masked { max_rows: 48 }, Bf16);
    let options = MoeOptions { kernels: MoeKernels::Decode, tail64: false, spans192: false, caller_dequantizes: false };
    assert_eq!(check("decode only", p, &[40, 0, 17], 4, 2, &options, &ModelRun::default()), GemmConfig::DECODE);
}

/// Masked counts with M_max = 16: the decode kernel alone, under three completion orders; a count
/// over the bound is clamped and flagged.
#[test]
fn model_sm90_moe_device_sizes_masked_decode_variant() {
    for (order, seed) in [(Completion::InOrder, 1), (Completion::Reversed, 2), (Completion::Random, 3)] {
        let p = problem(4, 24, 1024, TokenLayout::Masked { max_rows: 16 }, Bf16);
        let run = ModelRun::ordered(order, seed);
        let config = check(&format!("masked {order:?}"), p, &[16, 0, 5, 40], seed, 2, &AUTO, &run);
        assert_eq!(config, GemmConfig::DECODE);
    }
}

/// Over-bound sizes: offsets past T are clamped (status bit), nothing outside the tensors is
/// written; counts past M_max likewise.
#[test]
fn model_sm90_moe_device_sizes_over_bound_clamps_and_flags() {
    let p = problem(3, 40, 128, TokenLayout::Contiguous { max_tokens: 40 }, F16);
    check("offsets over T", p, &[0, 10, 30, 1000], 4, 2, &AUTO, &ModelRun::default());
    let p = problem(2, 40, 128, TokenLayout::Masked { max_rows: 20 }, F16);
    check("counts over M_max", p, &[21, 7], 5, 2, &AUTO, &ModelRun::default());
    // The expected status words, as the host predicts them, are non-zero here.
    let (_, s) =
        problem(3, 40, 128, TokenLayout::Contiguous { max_tokens: 40 }, F16).group_rows(&[0, 10, 30, 1000]).unwrap();
    assert_ne!(s.0 & STATUS_ROWS_OVER_BOUND, 0);
    let (_, s) = problem(2, 40, 128, TokenLayout::Masked { max_rows: 20 }, F16).group_rows(&[21, 7]).unwrap();
    assert_ne!(s.0 & STATUS_COUNT_OVER_BOUND, 0);
}

/// The scheduler alone on many groups (several per thread) with random sizes — both layouts,
/// within and beyond the bounds, every kernel choice, 2 to 132 SMs, up to 56 weight tiles — against
/// the host-sized planner for the same clamped sizes: the same kernel, the same list item for
/// item (LPT order and holes included), the same group fields.
#[test]
fn model_sm90_moe_device_sizes_schedule_matches_the_host_planner() {
    let mut rng = nvfp4_format::SplitMix64::new(11);
    let mut seen = 0;
    let (mut lpt_cases, mut decode_cases, mut two_class_cases) = (0, 0, 0);
    for case in 0..14 {
        let n = [136, 4096, 7168][case % 3];
        let k = 2048;
        let groups = 1 + rng.below(if case % 2 == 0 { 300 } else { 64 }) as usize;
        let small = case % 4 < 2;
        let per_group = if small { 17 } else { 300 };
        let (problem, sizes) = if case < 9 {
            let t = 1 + rng.below((groups * per_group) as u64) as usize;
            let mut offsets: Vec<u32> = (0..=groups).map(|_| rng.below(t as u64 + 20) as u32).collect();
            offsets.sort();
            if case < 6 {
                offsets.iter_mut().for_each(|o| *o = (*o).min(t as u32));
                offsets[0] = 0;
            }
            (problem(groups, n, k, TokenLayout::Contiguous { max_tokens: t.max(17) }, F16), offsets)
        } else {
            let m = 1 + rng.below(per_group as u64) as usize;
            let counts = (0..groups).map(|_| rng.below(m as u64 + 3) as u32).collect();
            (problem(groups, n, k, TokenLayout::Masked { max_rows: m }, F16), counts)
        };
        let options = MoeOptions {
            kernels: [MoeKernels::Auto, MoeKernels::Auto, MoeKernels::General, MoeKernels::Decode][case % 4],
            tail64: case % 5 == 1,
            spans192: case % 4 == 2 || case % 12 == 1,
            caller_dequantizes: false,
        };
        let sm_count = [132, 2, 16, 132, 7][case % 5];
        let (rows, status) = problem.group_rows(&sizes).unwrap();
        let t = std::time::Instant::now();
        let layout = nvfp4_gemm::layout::Sm90DeviceLayout::new(&problem, sm_count, &options).unwrap();
        let (_sizes_buf, buffers) = schedule_only_buffers(&problem, &sizes);
        let tables = MoeTables::new(&layout, &buffers);
        run_sm90_schedule(&layout, &buffers, &tables, &ModelRun::default()).unwrap();
        let outcome = tables.outcome();
        assert_eq!(outcome.status, status.0, "case {case}");
        let overlapping = status.0 & STATUS_OFFSETS_DECREASING != 0;
        if !overlapping {
            let config = check_schedule(&format!("case {case}"), &problem, &rows, sm_count, &layout, &outcome);
            decode_cases += (config == GemmConfig::DECODE) as u32;
            let lpt = outcome.work.iter().any(|w| w.is_hole());
            lpt_cases += lpt as u32;
            // The narrow class placed after the full-width one (`StepLoads::after_first`).
            let tiles: Vec<GroupTiles> = rows.iter().map(|r| GroupTiles::new(config, r.rows)).collect();
            two_class_cases += (lpt && tiles.iter().any(|t| t.wide > 0) && tiles.iter().any(|t| t.narrow() > 0)) as u32;
        }
        eprintln!(
            "case {case}: {} groups, {:?}, {options:?}, {sm_count} SMs: {} entries ({:?} launched) in {:.2?}",
            problem.groups(),
            problem.layout(),
            outcome.work_len,
            layout.gemms.map(|g| g.map(|g| g.config.kernel_name())),
            t.elapsed()
        );
        seen |= status.0;
    }
    assert_ne!(seen & STATUS_ROWS_OVER_BOUND, 0, "the random sizes went beyond the contiguous bound");
    assert_ne!(seen & STATUS_COUNT_OVER_BOUND, 0, "the random sizes went beyond the masked bound");
    assert!(lpt_cases > 0 && decode_cases > 0, "both kinds of list were checked ({lpt_cases}, {decode_cases})");
    assert!(two_class_cases > 0, "an LPT list with both classes was checked");
}
