//! The block reference on hand-computed cases, routing edge cases, the router weight's two
//! places, the two precisions, bad input, and experts that come from the checkpoint loader.

use safetensors::serialize;
use safetensors::tensor::TensorView;
use safetensors::Dtype;

use super::*;
use crate::checkpoint::{Checkpoint, Convention, LoadOptions};
use crate::codec::E4M3_ONE;
use crate::matrix::Nvfp4Matrix;
use crate::quantize::global_scale_for_amax;
use crate::reference::{reference_grouped_gemm_f64, Group};
use crate::rng::SplitMix64;

const H: usize = 64;
const I: usize = 64;

/// Every element the e2m1 `code` (1 = 0.5, 2 = 1.0) times block scale 1 times `global`.
fn uniform(rows: usize, k: usize, code: u8, global: f32) -> PlainWeight {
    PlainWeight {
        rows,
        k,
        values: vec![code | code << 4; rows * k / 2],
        plain_scales: vec![E4M3_ONE; rows * k / 16],
        global_scale: global,
    }
}

/// The hand case's expert: gate elements 0.5 · 2⁻⁶, up elements 1.0 · 2⁻⁶ (W1 only when not
/// gated), W2 elements 2⁻⁴, both input scales 0.25.
fn hand_expert(expert: usize, gated: bool) -> ExpertWeights {
    let mut w13 = uniform(I, H, 1, 2f32.powi(-6));
    if gated {
        let up = uniform(I, H, 2, 2f32.powi(-6));
        w13.rows += I;
        w13.values.extend(up.values);
        w13.plain_scales.extend(up.plain_scales);
    }
    ExpertWeights { expert, w13, w2: uniform(H, I, 2, 2f32.powi(-4)), w13_input_scale: 0.25, w2_input_scale: 0.25 }
}

fn one(expert: ExpertWeights) -> LoadedExperts {
    LoadedExperts { first_expert: expert.expert, experts: vec![expert] }
}

fn routing(ids: &[i64], weights: &[f32], top_k: usize) -> Routing {
    Routing { ids: ids.to_vec(), weights: weights.to_vec(), top_k }
}

fn bf16_round(x: f64) -> f64 {
    Dense16::Bf16.round(x)
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

#[test]
fn silu_w4a4_by_hand() {
    // x = 6 quantizes exactly with input scale 0.25: block scale e4m3(6 / 6 / 0.25) = 4, unit
    // 4 · 0.25 = 1, code 6. h_gate = 64 · 6 · 0.5 · 2⁻⁶ = 3, h_up = 64 · 6 · 1 · 2⁻⁶ = 6.
    let z = bf16_round(silu(3.0) * 6.0);
    assert_eq!(z, 17.125); // 17.146… to bf16's step of 1/8 in [16, 32)
                           // z quantized with 0.25: block scale e4m3(17.125 / 6 / 0.25 = 11.42) = 11, unit 2.75,
                           // z / unit = 6.23 → code 6, so z becomes 16.5.
    let zq = 6.0 * 11.0 * 0.25;
    // o = 64 · 16.5 · 2⁻⁴ = 66; y = 0.5 · 66.
    let expected = 0.5 * 64.0 * zq * 2f64.powi(-4);
    assert_eq!(expected, 33.0);
    let options = BlockOptions::new(Activation::Silu, Precision::W4a4, Dense16::Bf16);
    let y = reference(&[6.0; H], H, &routing(&[0], &[0.5], 1), &one(hand_expert(0, true)), &options).unwrap();
    assert_eq!(y, vec![expected; H]);
    // W4A16 keeps z = 17.125: o = 64 · 17.125 · 2⁻⁴.
    let y16 = reference(
        &[6.0; H],
        H,
        &routing(&[0], &[0.5], 1),
        &one(hand_expert(0, true)),
        &BlockOptions { precision: Precision::W4a16, ..options },
    )
    .unwrap();
    assert_eq!(y16[0], 0.5 * 4.0 * 17.125);
}

#[test]
fn silu_w4a16_by_hand() {
    // h_gate = 64 · 6 · 0.5 · 2⁻⁶ = 3, h_up = 64 · 6 · 2⁻⁶ = 6.
    let z = bf16_round(silu(3.0) * 6.0);
    let expected = 0.5 * 64.0 * z * 2f64.powi(-4);
    let options = BlockOptions::new(Activation::Silu, Precision::W4a16, Dense16::Bf16);
    let y = reference(&[6.0; H], H, &routing(&[0], &[0.5], 1), &one(hand_expert(0, true)), &options).unwrap();
    assert_eq!(y, vec![expected; H]);
    // f16 keeps more of silu(3) · 6 than bf16 does.
    let z16 = Dense16::F16.round(silu(3.0) * 6.0);
    let y16 = reference(
        &[6.0; H],
        H,
        &routing(&[0], &[0.5], 1),
        &one(hand_expert(0, true)),
        &BlockOptions { dtype: Dense16::F16, ..options },
    )
    .unwrap();
    assert_eq!(y16[0], 0.5 * 64.0 * z16 * 2f64.powi(-4));
    assert_ne!(z, z16);
}

#[test]
fn gelu_tanh_by_hand() {
    let gelu = |g: f64| 0.5 * g * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g)).tanh());
    let z = bf16_round(gelu(3.0) * 6.0);
    let options = BlockOptions::new(Activation::GeluTanh, Precision::W4a16, Dense16::Bf16);
    let y = reference(&[6.0; H], H, &routing(&[0], &[1.0], 1), &one(hand_expert(0, true)), &options).unwrap();
    assert_eq!(y[7], 64.0 * z * 2f64.powi(-4));
}

#[test]
fn relu2_reads_w1_only_and_silu_reads_gate_and_up() {
    let x = [6.0; H];
    let r = routing(&[0], &[1.0], 1);
    let relu2 = BlockOptions::new(Activation::Relu2, Precision::W4a16, Dense16::Bf16);
    // h = 3, relu(3)² = 9, o = 64 · 9 · 2⁻⁴ = 36.
    assert_eq!(reference(&x, H, &r, &one(hand_expert(0, false)), &relu2).unwrap(), vec![36.0; H]);
    // Negative pre-activations give zero.
    let y = reference(&[-6.0; H], H, &r, &one(hand_expert(0, false)), &relu2).unwrap();
    assert!(y.iter().all(|&v| v == 0.0));
    // A gated expert under relu2 has 2I rows, which is 128 = I' for a W2 of K = 64: rejected.
    let err = reference(&x, H, &r, &one(hand_expert(0, true)), &relu2).unwrap_err();
    assert_eq!(err, MoeBlockError::InconsistentExpert { expert: 0, what: "w2 K (I)", expected: 128, actual: 64 });
    // Silu on the gated expert: silu(3) · 6 against relu2's 3².
    let silu_y =
        reference(&x, H, &r, &one(hand_expert(0, true)), &BlockOptions { activation: Activation::Silu, ..relu2 })
            .unwrap();
    assert_eq!(silu_y[0], 64.0 * bf16_round(silu(3.0) * 6.0) * 2f64.powi(-4));
}

/// Random experts `first..first + n` with H = 128, I = 64, gated, recipe global scales.
fn random_experts(first: usize, n: usize, seed: u64) -> LoadedExperts {
    let (h, i) = (128, 64);
    let mut rng = SplitMix64::new(seed);
    let mut normal =
        |len: usize, amplitude: f64| -> Vec<f32> { (0..len).map(|_| (rng.normal() * amplitude) as f32).collect() };
    let experts = (0..n)
        .map(|e| {
            let w13 = normal(2 * i * h, 0.1);
            let w2 = normal(h * i, 0.1);
            let amax = |v: &[f32]| v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let q13 = quantize_with_global_scale(&w13, 2 * i, h, global_scale_for_amax(amax(&w13))).unwrap();
            let q2 = quantize_with_global_scale(&w2, h, i, global_scale_for_amax(amax(&w2))).unwrap();
            ExpertWeights {
                expert: first + e,
                w13: PlainWeight::from(&q13),
                w2: PlainWeight::from(&q2),
                // Calibrated for input amaxes of 4 (x) and 8 (the activated intermediate).
                w13_input_scale: 4.0 / 2688.0,
                w2_input_scale: 8.0 / 2688.0,
            }
        })
        .collect();
    LoadedExperts { first_expert: first, experts }
}

fn random_x(tokens: usize, h: usize, seed: u64) -> Vec<f64> {
    let mut rng = SplitMix64::new(seed);
    (0..tokens * h).map(|_| bf16_round(rng.normal())).collect()
}

const W4A4_SILU: BlockOptions = BlockOptions::new(Activation::Silu, Precision::W4a4, Dense16::Bf16);

#[test]
fn ids_outside_the_local_range_add_nothing() {
    let experts = random_experts(4, 2, 1);
    let x = random_x(2, 128, 2);
    let with_others = routing(&[-1, 3, 5, 6, 4, 100, i64::MIN, i64::MAX], &[0.3, 0.2, 0.4, 0.1, 0.9, 0.5, 0.5, 0.5], 4);
    let only_local = routing(&[5, 4], &[0.4, 0.9], 1);
    let a = reference(&x, 128, &with_others, &experts, &W4A4_SILU).unwrap();
    let b = reference(&x, 128, &only_local, &experts, &W4A4_SILU).unwrap();
    assert_eq!(a, b);
    assert!(a.iter().any(|&v| v != 0.0));
    let none = routing(&[-1, 0, 3, 6], &[1.0; 4], 2);
    assert_eq!(reference(&x, 128, &none, &experts, &W4A4_SILU).unwrap(), vec![0.0; 2 * 128]);
    // No local experts at all.
    let empty = LoadedExperts { first_expert: 0, experts: vec![] };
    assert_eq!(reference(&x, 128, &only_local, &empty, &W4A4_SILU).unwrap(), vec![0.0; 2 * 128]);
}

#[test]
fn a_repeated_id_adds_twice() {
    let experts = random_experts(0, 3, 3);
    let x = random_x(3, 128, 4);
    let twice = routing(&[2, 2, 1, 1, 0, 0], &[0.25; 6], 2);
    let once = routing(&[2, -1, 1, -1, 0, -1], &[0.25; 6], 2);
    let a = reference(&x, 128, &twice, &experts, &W4A4_SILU).unwrap();
    let b = reference(&x, 128, &once, &experts, &W4A4_SILU).unwrap();
    // 0 + w·o + w·o = 2·(w·o) exactly.
    assert_eq!(a, b.iter().map(|v| 2.0 * v).collect::<Vec<_>>());
}

#[test]
fn one_expert_taking_every_token_equals_token_by_token() {
    let experts = random_experts(0, 2, 5);
    let tokens = 5;
    let x = random_x(tokens, 128, 6);
    let weights: Vec<f32> = (0..tokens).map(|t| 0.1 + 0.2 * t as f32).collect();
    let all = reference(&x, 128, &routing(&vec![1; tokens], &weights, 1), &experts, &W4A4_SILU).unwrap();
    for t in 0..tokens {
        let single =
            reference(&x[t * 128..(t + 1) * 128], 128, &routing(&[1], &weights[t..t + 1], 1), &experts, &W4A4_SILU)
                .unwrap();
        assert_eq!(&all[t * 128..(t + 1) * 128], &single[..], "token {t}");
    }
}

#[test]
fn router_weight_at_input_or_combine() {
    let x = [6.0; H];
    let relu2 = BlockOptions::new(Activation::Relu2, Precision::W4a16, Dense16::Bf16);
    let expert = one(hand_expert(0, false));
    let at_input = relu2.with_router_weight_at(RouterWeightAt::Input);
    // relu2 is homogeneous of degree 2: weight 0.5 at the input is weight 0.25 at the combine
    // (exact here: scaling by a power of two commutes with every rounding).
    let a = reference(&x, H, &routing(&[0], &[0.5], 1), &expert, &at_input).unwrap();
    let b = reference(&x, H, &routing(&[0], &[0.25], 1), &expert, &relu2).unwrap();
    assert_eq!(a, b);
    assert_eq!(a[0], 9.0); // h = 1.5, relu(1.5)² = 2.25, o = 64 · 2.25 · 2⁻⁴
                           // Weight 1: the two places agree for any activation and precision.
    let experts = random_experts(0, 2, 7);
    let x = random_x(2, 128, 8);
    let r = routing(&[0, 1], &[1.0, 1.0], 1);
    for options in [W4A4_SILU, BlockOptions::new(Activation::GeluTanh, Precision::W4a16, Dense16::F16)] {
        let a = reference(&x, 128, &r, &experts, &options.with_router_weight_at(RouterWeightAt::Input)).unwrap();
        let b = reference(&x, 128, &r, &experts, &options).unwrap();
        assert_eq!(a, b, "{options:?}");
    }
    // Silu is not homogeneous: weight 0.5 at the input differs from 0.5 at the combine.
    let w4a16 = BlockOptions { precision: Precision::W4a16, ..W4A4_SILU };
    let r = routing(&[0, 1], &[0.5, 0.5], 1);
    let a = reference(&x, 128, &r, &experts, &w4a16.with_router_weight_at(RouterWeightAt::Input)).unwrap();
    let b = reference(&x, 128, &r, &experts, &w4a16).unwrap();
    let diff = a.iter().zip(&b).map(|(p, q)| (p - q).abs()).fold(0.0, f64::max);
    let scale = b.iter().map(|v| v.abs()).fold(0.0, f64::max);
    assert!(diff > 0.01 * scale, "diff {diff}, max |y| {scale}");
    // The hand case: silu(3 · 0.5)·(6 · 0.5) against 0.5 · silu(3)·6.
    let gated = one(hand_expert(0, true));
    let silu_bf16 = BlockOptions { activation: Activation::Silu, ..relu2 };
    let a = reference(
        &[6.0; H],
        H,
        &routing(&[0], &[0.5], 1),
        &gated,
        &silu_bf16.with_router_weight_at(RouterWeightAt::Input),
    )
    .unwrap();
    assert_eq!(a[0], 64.0 * bf16_round(silu(1.5) * 3.0) * 2f64.powi(-4));
}

#[test]
fn w4a4_and_w4a16_differ_only_by_quantization() {
    let experts = random_experts(0, 3, 9);
    let tokens = 8;
    let x = random_x(tokens, 128, 10);
    let mut rng = SplitMix64::new(11);
    let ids: Vec<i64> = (0..tokens * 2).map(|_| rng.below(3) as i64).collect();
    let weights: Vec<f32> = (0..tokens * 2).map(|_| rng.next_f64() as f32).collect();
    let r = routing(&ids, &weights, 2);
    let a4 = reference(&x, 128, &r, &experts, &W4A4_SILU).unwrap();
    let a16 = reference(&x, 128, &r, &experts, &BlockOptions { precision: Precision::W4a16, ..W4A4_SILU }).unwrap();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let diff: Vec<f64> = a4.iter().zip(&a16).map(|(p, q)| p - q).collect();
    let relative = norm(&diff) / norm(&a16);
    // Two NVFP4 quantizations of the activations, each a few percent to 10% relative error
    // (about 16% together for this seed).
    assert!(relative > 0.0 && relative < 0.25, "normalized difference {relative}");
}

#[test]
fn w4a4_matches_the_grouped_reference_gemm() {
    // The same block assembled from quantize_with_global_scale and reference_grouped_gemm_f64
    // (which sums exact per-block terms, a different order): agreement to f64 rounding.
    let experts = random_experts(0, 1, 12);
    let e = &experts.experts[0];
    let x = random_x(1, 128, 13);
    let q = |v: &[f64], s: f32| quantize_with_global_scale(v, 1, v.len(), s).unwrap();
    let gemm = |a: Nvfp4Matrix, w: &PlainWeight| {
        reference_grouped_gemm_f64(&[Group::new(a, w.to_matrix().unwrap(), 1.0).unwrap()]).unwrap()[0].data.clone()
    };
    let h: Vec<f64> = gemm(q(&x, e.w13_input_scale), &e.w13).into_iter().map(bf16_round).collect();
    let z: Vec<f64> = (0..64).map(|j| bf16_round(silu(h[j]) * h[64 + j])).collect();
    let o: Vec<f64> = gemm(q(&z, e.w2_input_scale), &e.w2).into_iter().map(bf16_round).collect();
    let y = reference(&x, 128, &routing(&[0], &[0.75], 1), &experts, &W4A4_SILU).unwrap();
    for (c, (got, o)) in y.iter().zip(&o).enumerate() {
        let expected = 0.75 * o;
        assert!((got - expected).abs() <= 1e-12 * expected.abs().max(1e-3), "col {c}: got {got}, expected {expected}");
    }
}

#[test]
fn zero_tokens() {
    let experts = random_experts(0, 2, 14);
    assert_eq!(reference(&[], 128, &routing(&[], &[], 4), &experts, &W4A4_SILU).unwrap(), Vec::<f64>::new());
}

#[test]
fn bad_input_is_an_error() {
    let experts = one(hand_expert(0, true));
    let x = [1.0; H];
    let r = routing(&[0], &[1.0], 1);
    let run =
        |x: &[f64], h: usize, r: &Routing, e: &LoadedExperts, o: &BlockOptions| reference(x, h, r, e, o).unwrap_err();
    assert_eq!(run(&x, H, &routing(&[0], &[1.0], 0), &experts, &W4A4_SILU), MoeBlockError::TopKZero);
    assert_eq!(
        run(&x, H, &routing(&[0, 0, 0], &[1.0; 3], 2), &experts, &W4A4_SILU),
        MoeBlockError::RoutingShape { what: "ids", len: 3, top_k: 2 }
    );
    assert_eq!(
        run(&x, H, &routing(&[0], &[1.0, 1.0], 1), &experts, &W4A4_SILU),
        MoeBlockError::RoutingShape { what: "weights", len: 2, top_k: 1 }
    );
    assert!(matches!(
        run(&x, H, &routing(&[0, 0], &[1.0, f32::NAN], 2), &experts, &W4A4_SILU),
        MoeBlockError::NonFiniteWeight { token: 0, slot: 1, .. }
    ));
    assert_eq!(run(&x[1..], H, &r, &experts, &W4A4_SILU), MoeBlockError::XLength { expected: H, actual: H - 1 });
    assert_eq!(run(&[1.0; 48], 48, &r, &experts, &W4A4_SILU), MoeBlockError::BadK { what: "H", k: 48, multiple: 64 });
    // W13 of 2·32 rows: I = 32.
    let mut small = hand_expert(0, true);
    small.w13.rows = 64;
    small.w13.values.truncate(64 * H / 2);
    small.w13.plain_scales.truncate(64 * H / 16);
    assert_eq!(run(&x, H, &r, &one(small), &W4A4_SILU), MoeBlockError::BadK { what: "I", k: 32, multiple: 64 });
    let mut odd = hand_expert(0, true);
    odd.w13.rows = 129;
    assert_eq!(run(&x, H, &r, &one(odd), &W4A4_SILU), MoeBlockError::OddGatedRows { expert: 0, rows: 129 });
    let mut wrong_h = hand_expert(0, true);
    wrong_h.w2.rows = 128;
    assert_eq!(
        run(&x, H, &r, &one(wrong_h), &W4A4_SILU),
        MoeBlockError::InconsistentExpert { expert: 0, what: "w2 rows (H)", expected: 64, actual: 128 }
    );
    let two = LoadedExperts {
        first_expert: 0,
        experts: vec![hand_expert(0, true), random_experts(1, 1, 1).experts.remove(0)],
    };
    assert_eq!(
        run(&x, H, &r, &two, &W4A4_SILU),
        MoeBlockError::InconsistentExpert { expert: 1, what: "w13 K (H)", expected: 64, actual: 128 }
    );
    let misnumbered = LoadedExperts { first_expert: 3, experts: vec![hand_expert(0, true)] };
    assert_eq!(
        run(&x, H, &r, &misnumbered, &W4A4_SILU),
        MoeBlockError::ExpertOrder { position: 0, expected: 3, found: 0 }
    );
    let mut bad_scale = hand_expert(0, true);
    bad_scale.w2_input_scale = 0.0;
    assert_eq!(
        run(&x, H, &r, &one(bad_scale), &W4A4_SILU),
        MoeBlockError::BadScale { expert: 0, what: "w2 input scale", value: 0.0 }
    );
    // W4A16 reads no input scale.
    let mut no_input = hand_expert(0, true);
    no_input.w13_input_scale = f32::NAN;
    let w4a16 = BlockOptions { precision: Precision::W4a16, ..W4A4_SILU };
    assert!(reference(&x, H, &r, &one(no_input), &w4a16).is_ok());
    let mut short = hand_expert(0, true);
    short.w2.values.pop();
    assert!(matches!(run(&x, H, &r, &one(short), &W4A4_SILU), MoeBlockError::Weight { expert: 0, .. }));
    // Messages name the problem.
    assert!(MoeBlockError::OddGatedRows { expert: 2, rows: 3 }.to_string().contains("expert 2"));
}

#[test]
fn experts_from_the_loader_feed_the_reference() {
    // A one-expert ModelOpt checkpoint in memory, built from the random expert's matrices.
    let source = random_experts(7, 1, 15);
    let e = &source.experts[0];
    let (i, h) = (64, 128);
    let w13 = e.w13.to_matrix().unwrap();
    let gate = w13.dequantize();
    let (gate, up) = gate.split_at(i * h);
    // Re-quantizing the dequantized halves with the same global scale gives the same codes.
    let g = e.w13.global_scale;
    let halves = [quantize_with_global_scale(gate, i, h, g).unwrap(), quantize_with_global_scale(up, i, h, g).unwrap()];
    let down = e.w2.to_matrix().unwrap();
    let prefix = "model.layers.0.mlp";
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (proj, m, input) in
        [("w1", &halves[0], e.w13_input_scale), ("w3", &halves[1], e.w13_input_scale), ("w2", &down, e.w2_input_scale)]
    {
        let base = format!("{prefix}.experts.7.{proj}");
        tensors.push((format!("{base}.weight"), Dtype::U8, vec![m.rows(), m.k() / 2], m.values().to_vec()));
        tensors.push((format!("{base}.weight_scale"), Dtype::F8_E4M3, vec![m.rows(), m.k() / 16], m.plain_scales()));
        tensors.push((format!("{base}.weight_scale_2"), Dtype::F32, vec![], m.global_scale().to_le_bytes().to_vec()));
        tensors.push((format!("{base}.input_scale"), Dtype::F32, vec![1], input.to_le_bytes().to_vec()));
    }
    let views =
        tensors.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect::<Vec<_>>();
    let bytes = serialize(views, None).unwrap();
    let loaded =
        Checkpoint::parse(&bytes).unwrap().load_experts(&LoadOptions::new(prefix, Convention::ModelOpt, 7..8)).unwrap();
    assert_eq!(loaded, source);
    let x = random_x(3, h, 16);
    let r = routing(&[7, 0, -1, 8, 7, 7], &[0.5, 0.5, 1.0, 0.25, 0.125, 1.0], 2);
    let y = reference(&x, h, &r, &loaded, &W4A4_SILU).unwrap();
    assert_eq!(y, reference(&x, h, &r, &source, &W4A4_SILU).unwrap());
    assert!(y[..h].iter().any(|&v| v != 0.0) && y[h..2 * h].iter().all(|&v| v == 0.0));
    assert!(y[2 * h..].iter().any(|&v| v != 0.0));
}

#[test]
fn output_rounding() {
    let y = [1.0 + 2f64.powi(-9), -3.0e5, 0.1];
    let bf: Vec<bf16> = round_output(&y);
    assert_eq!(bf[0].to_f64(), 1.0); // a tie, to even
    assert_eq!(round_output_as(&y, Dense16::Bf16), bf.iter().map(|v| v.to_f64()).collect::<Vec<_>>());
    let h: Vec<f16> = round_output(&y);
    assert!(h[1].is_infinite()); // beyond f16's 65504
    assert_eq!(round_output_as(&y, Dense16::F16)[2], f16::from_f32(0.1).to_f64());
}
