//! W4A16 on sm_90a (`nvfp4_gemm::w4a16`): f16 activations times prepacked NVFP4 weights, run in
//! the device model on the tables the library's layout code builds. The activations are each
//! group's A with its block scales applied (exact in f16), so the result compares with the same
//! fp64 reference as the W4A4 tests: `C = alpha · A · Bᵀ` (A's global scale in alpha).

use nvfp4_format::InputDistribution;
use nvfp4_gemm::OutputType::{Bf16, F16};
use nvfp4_gemm_abi::sm90::GemmConfig;
use nvfp4_gemm_model_tests::*;

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
