//! Device-resident group sizes on sm_90a (`nvfp4_gemm::moe`), run in the device model on the
//! tables `Sm90DeviceLayout` (the library's planning code) builds, with the maps encoded by the
//! model: `sm90_schedule`, `sm90_dequant_tokens`, then the GEMM variant the layout chose (the
//! decode variant when the bounds keep every group at 16 tokens or fewer). Checked: C of every
//! group against the CPU reference, rows of no group untouched, the guards around C, the status
//! bits and the scheduler's table fields. The same path runs on the H200 in `gpu_moe_sm90`.

use nvfp4_gemm::moe::{MoeProblem, TokenLayout};
use nvfp4_gemm::OutputType::{self, Bf16, F16};
use nvfp4_gemm_abi::moe::{STATUS_COUNT_OVER_BOUND, STATUS_ROWS_OVER_BOUND};
use nvfp4_gemm_model_tests::*;

fn problem(groups: usize, n: usize, k: usize, layout: TokenLayout, out: OutputType) -> MoeProblem {
    MoeProblem::new(groups, n, k, layout, out).unwrap()
}

/// Runs one call in the model and checks it; returns the GEMM kernel that ran.
fn check(name: &str, problem: MoeProblem, sizes: &[u32], seed: u64, run: &ModelRun) -> &'static str {
    let ops = MoeOperands::new(problem, sizes.to_vec(), seed);
    let (_, outcome) = run_sm90_moe(&ops, 2, run).unwrap_or_else(|e| panic!("{name}: {e}"));
    if let Err(e) = ops.check() {
        panic!("{name}: wrong result: {e}");
    }
    assert_eq!(outcome.status, ops.status.0, "{name}: status word");
    for (g, (p, r)) in outcome.groups.iter().zip(&ops.rows).enumerate() {
        assert_eq!((p.m, p.token_row), (r.rows, r.first), "{name}: group {g}");
    }
    outcome.kernel
}

/// Contiguous offsets: an empty expert, groups not starting at a multiple of 128, one expert with
/// most tokens, K with a 64-tail, N = 8·odd; the general variant (T > 16).
#[test]
fn model_sm90_moe_device_sizes_contiguous() {
    let p = problem(4, 136, 320, TokenLayout::Contiguous { max_tokens: 150 }, F16);
    let kernel = check("contiguous", p, &[0, 3, 3, 140, 150], 1, &ModelRun::default());
    assert_eq!(kernel, "sm90_grouped_gemm");
}

/// Masked counts with M_max = 16: the decode variant, under three completion orders; a count over
/// the bound is clamped and flagged.
#[test]
fn model_sm90_moe_device_sizes_masked_decode_variant() {
    for (order, seed) in [(Completion::InOrder, 1), (Completion::Reversed, 2), (Completion::Random, 3)] {
        let p = problem(4, 24, 1024, TokenLayout::Masked { max_rows: 16 }, Bf16);
        let kernel = check(&format!("masked {order:?}"), p, &[16, 0, 5, 40], seed, &ModelRun::ordered(order, seed));
        assert_eq!(kernel, "sm90_grouped_gemm_decode");
    }
}

/// Over-bound sizes: offsets past T are clamped (status bit), nothing outside the tensors is
/// written; counts past M_max likewise.
#[test]
fn model_sm90_moe_device_sizes_over_bound_clamps_and_flags() {
    let p = problem(3, 40, 128, TokenLayout::Contiguous { max_tokens: 40 }, F16);
    check("offsets over T", p, &[0, 10, 30, 1000], 4, &ModelRun::default());
    let p = problem(2, 40, 128, TokenLayout::Masked { max_rows: 20 }, F16);
    check("counts over M_max", p, &[21, 7], 5, &ModelRun::default());
    // The expected status words, as the host predicts them, are non-zero here.
    let (_, s) =
        problem(3, 40, 128, TokenLayout::Contiguous { max_tokens: 40 }, F16).group_rows(&[0, 10, 30, 1000]).unwrap();
    assert_ne!(s.0 & STATUS_ROWS_OVER_BOUND, 0);
    let (_, s) = problem(2, 40, 128, TokenLayout::Masked { max_rows: 20 }, F16).group_rows(&[21, 7]).unwrap();
    assert_ne!(s.0 & STATUS_COUNT_OVER_BOUND, 0);
}
