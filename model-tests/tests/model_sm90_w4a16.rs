//! W4A16 on sm_90a (`nvfp4_gemm::w4a16`): f16 activations times prepacked NVFP4 weights, run in
//! the device model on the tables the library's layout code builds. The activations are each
//! group's A with its block scales applied (exact in f16), so the result compares with the same
//! fp64 reference as the W4A4 tests: `C = alpha · A · Bᵀ` (A's global scale in alpha).

use nvfp4_format::InputDistribution;
use nvfp4_gemm::layout::Sm90Layout;
use nvfp4_gemm::moe::{MoeKernels, MoeOptions, MoeProblem, TokenLayout};
use nvfp4_gemm::w4a16::Activations;
use nvfp4_gemm::OutputType::{self, Bf16, F16};
use nvfp4_gemm::Problem;
use nvfp4_gemm_abi::sm90::GemmConfig;
use nvfp4_gemm_model_tests::*;

/// The layout of `problem`'s shapes with `activations` as the tokens on `sm_count` SMs (the
/// W4A4 layout's variant and work list: every W4A4 variant has its W4A16 twin).
fn layout(problem: &Problem, activations: Activations, sm_count: u32) -> Sm90Layout {
    Sm90Layout::new(&w4a16_problem(problem, activations), sm_count)
}

/// [`layout`] with the variant `config`.
fn layout_with(problem: &Problem, activations: Activations, sm_count: u32, config: GemmConfig) -> Option<Sm90Layout> {
    Sm90Layout::with_config(&w4a16_problem(problem, activations), sm_count, config)
}

/// Tails everywhere: M = 0, M not a multiple of 16 or 128, N = 8 and 8·odd, K = 64 and a K tail
/// (K % 128 = 64), f16 and bf16 out; the general kernel (a group above 16 tokens).
#[test]
fn model_sm90_w4a16_general_with_tails() {
    let shapes = z(&[0, 1, 17, 130, 40], &[8, 136, 128, 264, 72], &[64, 320, 128, 192, 64]);
    let groups = groups(&shapes, InputDistribution::Competition, 1);
    for out in [F16, Bf16] {
        let ran = run_and_check(&format!("w4a16 general {out:?}"), &groups, out, &ModelRun::default(), |ops, run| {
            run_sm90_w4a16_with(ops, 3, GemmConfig::GENERAL, run)
        });
        assert_eq!(ran[0].kernel, "sm90_w4a16_gemm");
    }
}

/// Every group at most 16 tokens: the decode kernel (256-K stages, so K = 320 ends inside a
/// stage), full-range values (subnormal block scales, so products reach down to 2⁻¹⁷ in f16).
#[test]
fn model_sm90_w4a16_decode_full_range() {
    let shapes = z(&[4, 16, 1, 0, 9], &[24, 128, 8, 40, 264], &[320, 512, 64, 128, 1024]);
    let groups = groups(&shapes, InputDistribution::FullRange, 2);
    let ran = run_and_check("w4a16 decode", &groups, F16, &ModelRun::default(), |ops, run| run_sm90_w4a16(ops, 2, run));
    assert_eq!(ran[0].kernel, "sm90_w4a16_gemm_decode");
}

/// Random problems (groups, M with zeros, N = 8·odd, K multiples of 64) under completion orders.
#[test]
fn model_sm90_w4a16_random_shapes() {
    for seed in 0..4u64 {
        let shapes = random_shapes(0x4A16 + seed, 4, 150, 200, 448);
        let groups = groups(&shapes, InputDistribution::Competition, seed);
        let order = [Completion::InOrder, Completion::Reversed, Completion::Random, Completion::InOrder][seed as usize];
        let run = ModelRun::ordered(order, seed);
        run_and_check(&format!("w4a16 random {seed}"), &groups, F16, &run, |ops, run| run_sm90_w4a16(ops, 2, run));
    }
}

/// The 64/128 and 192-row variants (what the cost model picks for the prefill bench shapes):
/// groups whose last tile fits 64 rows, spans of 192 and 128 rows with N a multiple of 64 and
/// not, K tails.
#[test]
fn model_sm90_w4a16_t64_and_n192() {
    let shapes = z(&[130, 64, 1, 200], &[328, 192, 64, 136], &[320, 128, 64, 192]);
    let groups = groups(&shapes, InputDistribution::Competition, 5);
    for (config, name) in [(GemmConfig::T64, "sm90_w4a16_gemm_t64"), (GemmConfig::N192, "sm90_w4a16_gemm_n192")] {
        let ran = run_and_check(&format!("w4a16 {name}"), &groups, F16, &ModelRun::default(), |ops, run| {
            run_sm90_w4a16_with(ops, 2, config, run)
        });
        assert_eq!(ran[0].kernel, name);
    }
}

/// The device-sized W4A16 call (a `MoePlan` of W4A16 tokens): the scheduler, then the W4A16
/// GEMMs reading the activations `[token_rows, K]` through maps over the whole tensor (rows of no
/// group are NaN), no dequantization. Checks C against the reference on every group's rows, rows of no group and
/// C's guards untouched, the status word, and which kernels ran.
#[allow(clippy::too_many_arguments)]
fn check_device_sized(
    name: &str,
    problem: MoeProblem,
    sizes: &[u32],
    seed: u64,
    sm_count: u32,
    options: &MoeOptions,
    run: &ModelRun,
    kind: Activations,
) -> GemmConfig {
    let ops = MoeOperands::new(problem, sizes.to_vec(), seed);
    let inputs = ops.w4a16_inputs(kind);
    let (launched, outcome, layout) =
        run_sm90_moe_w4a16(&ops, &inputs, sm_count, options, run).unwrap_or_else(|e| panic!("{name}: {e}"));
    if let Err(e) = ops.check() {
        panic!("{name}: wrong result: {e}");
    }
    assert_eq!(outcome.status, ops.status.0, "{name}: status word");
    let names: Vec<&str> = launched.iter().map(|l| l.kernel).collect();
    assert_eq!(names[0], "sm90_schedule", "{name}");
    let gemms: Vec<&str> = layout.gemms.iter().flatten().map(|g| g.config.w4a16_kernel_name(kind)).collect();
    assert_eq!(&names[1..], &gemms[..], "{name}: the W4A16 GEMMs follow the scheduler, no dequantization");
    let slot = (outcome.work_lens[1] > 0) as usize;
    let config = layout.gemms[slot].expect("the kernel that got the call is launched").config;
    assert_eq!(outcome.work_lens[1 - slot], 0, "{name}: the other launch gets no work");
    config
}

const AUTO: MoeOptions =
    MoeOptions { kernels: MoeKernels::Auto, tail64: false, spans192: false, caller_dequantizes: false };

fn moe(groups: usize, n: usize, k: usize, layout: TokenLayout, out: OutputType) -> MoeProblem {
    MoeProblem::new(groups, n, k, layout, out).unwrap()
}

/// Contiguous offsets: an empty expert, groups not starting at a multiple of 128, one expert with
/// two 128-row tiles (the second a 9-row box), K with a 64-tail, N = 8·odd; the general kernel's
/// LPT list over 2 CTAs; then the same sizes with offsets past T (clamped, flagged) on the 64/128
/// kernel, bf16 activations and output.
#[test]
fn model_sm90_w4a16_device_sizes_contiguous() {
    let p = moe(4, 136, 320, TokenLayout::Contiguous { max_tokens: 150 }, F16);
    let config =
        check_device_sized("contiguous", p, &[0, 3, 3, 140, 150], 1, 2, &AUTO, &ModelRun::default(), Activations::F16);
    assert_eq!(config, GemmConfig::GENERAL);
    let p = moe(4, 136, 320, TokenLayout::Contiguous { max_tokens: 150 }, Bf16);
    let tail64 = MoeOptions { kernels: MoeKernels::General, tail64: true, spans192: false, caller_dequantizes: false };
    let run = ModelRun::ordered(Completion::Reversed, 2);
    let config =
        check_device_sized("contiguous over T", p, &[0, 3, 3, 140, 1000], 2, 3, &tail64, &run, Activations::Bf16);
    assert_eq!(config, GemmConfig::T64);
}

/// Masked counts: with M_max = 16 the decode kernel alone (bf16 activations), a count over the
/// bound clamped and flagged, an empty group; a bound above 16 whose sizes stay at 16 or fewer (the decode kernel
/// takes the call); and a plan of the decode kernel alone given groups of 40 and 17 rows.
#[test]
fn model_sm90_w4a16_device_sizes_masked() {
    let p = moe(4, 24, 1024, TokenLayout::Masked { max_rows: 16 }, Bf16);
    let run = ModelRun::ordered(Completion::Random, 3);
    assert_eq!(
        check_device_sized("masked 16", p, &[16, 0, 5, 40], 3, 2, &AUTO, &run, Activations::Bf16),
        GemmConfig::DECODE
    );
    let p = moe(5, 24, 256, TokenLayout::Masked { max_rows: 60 }, F16);
    let config =
        check_device_sized("masked auto", p, &[4, 0, 16, 1, 9], 4, 2, &AUTO, &ModelRun::default(), Activations::F16);
    assert_eq!(config, GemmConfig::DECODE);
    let p = moe(3, 40, 128, TokenLayout::Masked { max_rows: 48 }, F16);
    let decode = MoeOptions { kernels: MoeKernels::Decode, tail64: false, spans192: false, caller_dequantizes: false };
    let config =
        check_device_sized("decode only", p, &[40, 0, 17], 5, 2, &decode, &ModelRun::default(), Activations::F16);
    assert_eq!(config, GemmConfig::DECODE);
}

/// Random bounds and sizes (both layouts, some sizes beyond the bounds, empty groups, f16 and
/// bf16 activations) against the reference.
#[test]
fn model_sm90_w4a16_device_sizes_random() {
    let mut rng = nvfp4_format::SplitMix64::new(0x4A16_3300);
    for case in 0..4 {
        let groups = 1 + rng.below(6) as usize;
        let (n, k) = (8 * (1 + 2 * rng.below(12) as usize), 64 * (1 + rng.below(5) as usize));
        let bound = 1 + rng.below(90) as usize;
        let (layout, sizes) = if case % 2 == 0 {
            let mut offsets = vec![0u32];
            for _ in 0..groups {
                let next = offsets.last().unwrap() + rng.below(bound as u64 / 2 + 2) as u32;
                offsets.push(next);
            }
            (TokenLayout::Contiguous { max_tokens: bound }, offsets)
        } else {
            let counts = (0..groups).map(|_| rng.below(bound as u64 + 3) as u32).collect();
            (TokenLayout::Masked { max_rows: bound }, counts)
        };
        let out = if case < 2 { F16 } else { Bf16 };
        let p = moe(groups, n, k, layout, out);
        let sms = 1 + rng.below(4) as u32;
        let run = ModelRun::ordered(Completion::Random, case);
        check_device_sized(
            &format!("random {case}: {layout:?} {sizes:?} n {n} k {k}"),
            p,
            &sizes,
            case,
            sms,
            &AUTO,
            &run,
            [Activations::F16, Activations::Bf16][case as usize % 2],
        );
    }
}

/// bf16 activations (the weights prepacked for them: signs folded into the codes, scales
/// re-encoded; the bf16 decoder, `wgmma ... .bf16.bf16`, the epilogue's 2⁷): tails on the general
/// kernel with f16 and bf16 output, the decode kernel on full-range inputs (subnormal block
/// scales, and code 0.5 decoded to the subnormal bf16 2⁻¹²⁷), the 64/128 and 192-row twins.
#[test]
fn model_sm90_w4a16_bf16_activations() {
    let bf16 = Activations::Bf16;
    let shapes = z(&[0, 17, 130, 40], &[8, 136, 264, 72], &[64, 320, 192, 64]);
    let general = groups(&shapes, InputDistribution::Competition, 11);
    for out in [F16, Bf16] {
        let ran =
            run_and_check(&format!("w4a16 bf16 general {out:?}"), &general, out, &ModelRun::default(), |ops, run| {
                let l = layout_with(&ops.problem, bf16, 3, GemmConfig::GENERAL).expect("general");
                run_sm90_w4a16_typed(ops, l, run)
            });
        assert_eq!(ran[0].kernel, "sm90_w4a16_bf16_gemm");
    }
    let shapes = z(&[4, 16, 1, 9], &[24, 128, 8, 264], &[320, 512, 64, 1024]);
    let full = groups(&shapes, InputDistribution::FullRange, 12);
    let run = ModelRun::ordered(Completion::Random, 12);
    let ran = run_and_check("w4a16 bf16 decode", &full, F16, &run, |ops, run| {
        run_sm90_w4a16_typed(ops, layout(&ops.problem, bf16, 2), run)
    });
    assert_eq!(ran[0].kernel, "sm90_w4a16_bf16_gemm_decode");
    let shapes = z(&[130, 1, 200], &[328, 64, 136], &[320, 64, 192]);
    let wide = groups(&shapes, InputDistribution::Competition, 13);
    for (config, name) in
        [(GemmConfig::T64, "sm90_w4a16_bf16_gemm_t64"), (GemmConfig::N192, "sm90_w4a16_bf16_gemm_n192")]
    {
        let ran = run_and_check(&format!("w4a16 bf16 {name}"), &wide, Bf16, &ModelRun::default(), |ops, run| {
            run_sm90_w4a16_typed(ops, layout_with(&ops.problem, bf16, 2, config).expect("the variant"), run)
        });
        assert_eq!(ran[0].kernel, name);
    }
}
