//! The sm_90a kernels (`sm90_dequant_tokens`, then `sm90_grouped_gemm`) run in the device model on
//! problems the library plans, against the CPU reference.
//!
//! The Hopper GEMM is the expensive one to model (every `wgmma` is a 128-thread meeting, 8 per
//! 128-K stage and consumer warpgroup), so the competition's shapes are scaled down in N and K,
//! keeping what makes them hard: M not a multiple of the 128-token tile, K % 128 ≠ 0 (a stage with
//! one 64-chunk), K < 128, N = 8·odd (a partial weight tile), an empty group.

use nvfp4_format::GroupShape;
use nvfp4_format::InputDistribution::{Competition, FullRange};
use nvfp4_gemm::OutputType::{self, Bf16, F16};
use nvfp4_gemm_abi::sm90::{GemmConfig, RowSpan, DECODE_UNSCALE};
use nvfp4_gemm_model_tests::*;

/// The competition's groups (M as in the competition, N ≤ 136, K ≤ 320), with every tail.
fn competition_scaled() -> Vec<Vec<GroupShape>> {
    vec![
        // (96,128,256)/(128,256,512): N → 8·17 (two weight tiles, the second 8 rows), K tail.
        z(&[96, 128], &[136, 128], &[256, 320]),
        // (256,72)/(512,384)/(256,256): two token tiles; K < 128.
        z(&[256, 72], &[40, 120], &[64, 192]),
        // (80,128,256)/(384,256,128)/(256,512,256), an empty group.
        z(&[80, 0, 40], &[24, 128, 56], &[128, 256, 384]),
        // (40,56,384,512)/(512,384,256,128): tiny M, several groups.
        z(&[40, 56, 8], &[72, 8, 136], &[64, 128, 192]),
    ]
}

fn check_sm90(name: &str, shapes: &[GroupShape], seed: u64, out: OutputType, sms: u32, run: &ModelRun) {
    let g = groups(shapes, Competition, seed);
    run_and_check(name, &g, out, run, |o, r| run_sm90(o, sms, r));
}

#[test]
fn model_sm90_competition_shapes_scaled() {
    for (i, s) in competition_scaled().iter().enumerate() {
        // 2 SMs: persistent grids, rings wrap across tiles.
        check_sm90(&format!("sm90 competition {i}"), s, i as u64, F16, 2, &ModelRun::default());
    }
}

#[test]
fn model_sm90_bf16_and_full_range() {
    check_sm90("sm90 bf16", &z(&[130], &[72], &[192]), 10, Bf16, 2, &ModelRun::default());
    let g = groups(&z(&[33], &[24], &[320]), FullRange, 11);
    run_and_check("sm90 full range", &g, F16, &ModelRun::default(), |o, r| run_sm90(o, 1, r));
}

/// An alpha so large that 2¹⁴·alpha overflows f32: every nonzero sum becomes ±inf in f16, and the
/// second group, whose tokens are all zero, must store zeros — not 0·inf = NaN, which an epilogue
/// multiplying by the folded factor 2¹⁴·alpha would store (PERF.md #39b; this test fails with that
/// fold). Both epilogues: the decode variant's (every group ≤ 16 tokens) and a general one's.
#[test]
fn model_sm90_alpha_beyond_the_folded_factor() {
    for (name, shapes) in
        [("general", z(&[24, 40], &[24, 16], &[128, 64])), ("decode", z(&[5, 7], &[24, 16], &[128, 64]))]
    {
        let mut g = groups(&shapes, Competition, 21);
        for x in &mut g {
            x.alpha = 2f32.powi(126);
            x.a.set_global_scale(1.0);
            x.b.set_global_scale(1.0);
            assert!(x.effective_alpha_f32().is_finite() && !(DECODE_UNSCALE * x.effective_alpha_f32()).is_finite());
        }
        g[1].a.values_mut().fill(0);
        run_and_check(&format!("sm90 {name} alpha 2^126"), &g, F16, &ModelRun::default(), |o, r| run_sm90(o, 2, r));
    }
}

#[test]
fn model_sm90_random_shapes() {
    for seed in 0..3 {
        let shapes = random_shapes(300 + seed, 3, 150, 144, 256);
        check_sm90(&format!("sm90 random {seed} {shapes:?}"), &shapes, seed, F16, 2, &ModelRun::default());
    }
}

/// K = 1024 is 8 stages of 128 in a 5-stage ring: a stage is refilled within one tile, right after
/// the consumers release it (so releasing it while a wgmma still reads it is caught); the second
/// group adds a partial weight tile and K < 128.
#[test]
fn model_sm90_completion_orders() {
    let shapes = z(&[40, 8], &[24, 136], &[1024, 64]);
    for (order, seed) in [(Completion::InOrder, 1), (Completion::Reversed, 2), (Completion::Random, 3)] {
        let run = ModelRun::ordered(order, seed);
        check_sm90(&format!("sm90 {order:?} seed {seed}"), &shapes, 12, F16, 1, &run);
    }
}

/// Every group at most 16 tokens: the decode variant (`sm90_grouped_gemm_decode`: 16-token tiles
/// of stages of 256 K, two CTAs per SM, two producer warps after the consumer warpgroups), with
/// every K tail (K = 320, 64, 384, 192: a last stage with 1, 1, 2 and 3 chunks of data), K = 1280
/// (5 stages: the 4-stage ring wraps within a tile), an empty group and N = 8·odd, under three
/// completion orders.
#[test]
fn model_sm90_decode_variant() {
    let shapes = z(&[4, 16, 0, 1, 9, 3], &[136, 24, 8, 64, 8, 16], &[320, 1280, 64, 64, 384, 192]);
    for (order, seed) in [(Completion::InOrder, 1), (Completion::Reversed, 2), (Completion::Random, 3)] {
        let run = ModelRun::ordered(order, seed);
        check_sm90(&format!("sm90 decode {order:?} seed {seed}"), &shapes, 13, F16, 1, &run);
    }
}

/// 130 groups, most of them empty (no dequantization CTAs): the token dequantization finds each
/// CTA's group in rounds of 64 groups per warp — groups on both sides of a round's end (63, 64)
/// and in the third round (129) — and a group of two CTAs (16 tokens × K = 1024: 256 items);
/// decode variant, N = 8 and 24.
#[test]
fn model_sm90_many_groups() {
    let tokens = |g: usize| match g {
        3 => 16,
        40 => 3,
        63 => 1,
        64 => 7,
        100 => 5,
        129 => 9,
        _ => 0,
    };
    let m: Vec<usize> = (0..130).map(tokens).collect();
    let n: Vec<usize> = (0..130).map(|g| if g % 3 == 0 { 24 } else { 8 }).collect();
    let k: Vec<usize> = (0..130).map(|g| if g == 3 { 1024 } else { 64 }).collect();
    let shapes = z(&m, &n, &k);
    let problem = nvfp4_gemm::Problem::new(shapes.clone(), F16).unwrap();
    let layout = nvfp4_gemm::layout::Sm90Layout::new(&problem, 2);
    assert_eq!(layout.config, GemmConfig::DECODE);
    assert_eq!(layout.dequant_ctas[3].1, 2, "{:?}", layout.dequant_ctas[3]);
    assert_eq!(layout.dequant_ctas[129].1, 1);
    check_sm90("sm90 many groups", &shapes, 17, F16, 2, &ModelRun::ordered(Completion::Random, 7));
}

/// A work list balanced over 2 CTAs with holes (host `balance`): one CTA takes the long tile
/// (K = 1024, 8 stages of a 128-token tile), the other the four short ones (16-token tiles of
/// K = 320 and 128-token tiles of K = 64) and skips the holes beside them; K tails, N = 8·odd;
/// under two completion orders.
#[test]
fn model_sm90_balanced_list_with_holes() {
    let shapes = z(&[128, 8, 40], &[24, 136, 136], &[1024, 320, 64]);
    let problem = nvfp4_gemm::Problem::new(shapes.clone(), F16).unwrap();
    let layout = nvfp4_gemm::layout::Sm90Layout::new(&problem, 2);
    assert_eq!(layout.config.kernel_name(), "sm90_grouped_gemm");
    assert!(layout.work.iter().any(|w| w.is_hole()), "{:?}", layout.work);
    for (order, seed) in [(Completion::InOrder, 1), (Completion::Random, 3)] {
        let run = ModelRun::ordered(order, seed);
        check_sm90(&format!("sm90 balanced {order:?} seed {seed}"), &shapes, 14, F16, 2, &run);
    }
}

/// Groups whose last rows fit 64: the 64/128 variant (`sm90_grouped_gemm_t64`: 176 tokens as a
/// 128-row tile and a 64-wide tail, 40 as one 64-wide tile, 128 as one 128-row tile), with K tails
/// and N = 8·odd, on 2 CTAs, under two completion orders. The last tiles load boxes of 48, 40 and
/// 128 rows (`tail_box_rows`): the stage rows past a box keep older tokens or the model's 0xA5
/// fill, which must reach no stored element (and each stage's credited bytes must match what its
/// loads deliver, or the full barrier never completes: a deadlock report).
#[test]
fn model_sm90_t64_variant() {
    check_variant("sm90 t64", &z(&[176, 40, 128], &[136, 72, 24], &[320, 64, 192]), 15, GemmConfig::T64);
}

/// `shapes` (seed `seed`) with the GEMM variant `config` on 2 CTAs, in order and in random order.
fn check_variant(name: &str, shapes: &[GroupShape], seed: u64, config: GemmConfig) {
    for (order, order_seed) in [(Completion::InOrder, 1), (Completion::Random, 3)] {
        let run = ModelRun::ordered(order, order_seed);
        let g = groups(shapes, Competition, seed);
        run_and_check(&format!("{name} {order:?} seed {order_seed}"), &g, F16, &run, |o, r| {
            run_sm90_with(o, 2, config, r)
        });
    }
}

/// The 192-weight-row variant (`sm90_grouped_gemm_n192`: three consumer warpgroups, 4 stages,
/// 160 registers per consumer thread from the CTA's pool): the list cuts N = 392 into spans of 3,
/// 3 and 1 warpgroups (the last 8 rows in scale block 3), N = 136 into one of 3, N = 264 into 3 and
/// 2 (starting at row 192, the middle of scale block 1), so every span size runs, with idle
/// warpgroups; a 64-wide tail (176 tokens), K tails and K = 1024 (8 stages in a 4-stage ring), on
/// 2 CTAs, under two completion orders.
#[test]
fn model_sm90_n192_variant() {
    let shapes = z(&[176, 40, 9], &[392, 136, 264], &[320, 1024, 64]);
    let problem = nvfp4_gemm::Problem::new(shapes.clone(), F16).unwrap();
    let layout = nvfp4_gemm::layout::Sm90Layout::with_config(&problem, 2, GemmConfig::N192).unwrap();
    let spans: Vec<_> = layout.work.iter().filter(|w| !w.is_hole()).map(|w| RowSpan::decode(w.tile_n)).collect();
    for warpgroups in 1..=3 {
        assert!(spans.iter().any(|s| s.warpgroups == warpgroups), "{spans:?}");
    }
    assert!(spans.iter().any(|s| s.row0() % 128 != 0), "{spans:?}");
    check_variant("sm90 n192", &shapes, 16, GemmConfig::N192);
}

/// Every variant with K tails (K = 64 and 320: a last stage with one chunk of data; the decode
/// variant's stages of four chunks also with two and three, K = 384 and 192) while shared
/// memory starts as 0xFF, so that every stale f16 token and e4m3 scale in it is a NaN. Each stage
/// is computed whole: the K tail's chunks past K must be the TMA's zero fill (tokens and weights)
/// under a copy of the stage's first scale block, or NaN reaches C. Stale token rows past a last
/// tile's box hold NaNs too: they may only reach columns of C that are not stored.
#[test]
fn model_sm90_k_tails_over_nan_filled_shared_memory() {
    let cases: [(&str, GemmConfig, Vec<GroupShape>); 4] = [
        ("general", GemmConfig::GENERAL, z(&[130, 8], &[72, 136], &[192, 320])),
        ("t64", GemmConfig::T64, z(&[176, 40], &[136, 72], &[320, 64])),
        ("n192", GemmConfig::N192, z(&[176, 9], &[392, 264], &[320, 64])),
        ("decode", GemmConfig::DECODE, z(&[4, 16, 1, 7], &[136, 24, 8, 16], &[320, 64, 192, 384])),
    ];
    for (i, (name, config, shapes)) in cases.iter().enumerate() {
        let run = ModelRun { smem_fill: 0xFF, ..ModelRun::ordered(Completion::Random, 5) };
        let g = groups(shapes, Competition, 20 + i as u64);
        run_and_check(&format!("sm90 {name} K tails, NaN-filled shared memory"), &g, F16, &run, |o, r| {
            run_sm90_with(o, 2, *config, r)
        });
    }
}

/// The competition's 10 test shapes and the K = 128/384 one, unscaled. About 60 s of one core in
/// the model (every tile-stage is 16 warpgroup meetings per consumer): too long for CI's budget,
/// so it runs on request (`cargo test -p nvfp4-gemm-model-tests -- --ignored`).
#[test]
#[ignore = "about 60 s; the scaled shapes above run in CI"]
fn model_sm90_competition_shapes_full() {
    let cases = nvfp4_format::generate::shapes::competition();
    for (i, s) in cases.iter().enumerate() {
        check_sm90(&format!("sm90 competition full {i}"), s, i as u64, F16, 3, &ModelRun::default());
    }
}
