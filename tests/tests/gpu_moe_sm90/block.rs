//! The whole MoE expert block on an sm_90a GPU (`nvfp4_gemm::moe_block::ExpertBlock`) against
//! the fp64 reference of its contract (`nvfp4_format::moe_block::reference`, docs/moe-block.md):
//! random experts and routings (ids out of the local range, −1, repeated ids, an expert with no
//! tokens), every activation, W4A4 and W4A16, the router weight at the combine and at the input,
//! T = 0, 1, the bound and 4096; the output poisoned before each call; two runs bit for bit equal;
//! arguments refused before any launch.

use cudarc::driver::CudaSlice;
use half::bf16;
use nvfp4_format::checkpoint::{ExpertWeights, LoadedExperts, PlainWeight};
use nvfp4_format::moe_block::{reference, round_output_as, Routing};
use nvfp4_format::{random_matrix, InputDistribution, SplitMix64};
use nvfp4_gemm::moe_block::{
    Activation, ActivationPlacement, BlockOptions, BlockPlan, BlockShape, Dense16, ExpertBlock, Precision,
    RouterWeightAt, TopkIds, TopkWeights,
};
use nvfp4_gemm::{Arch, Error};
use nvfp4_gemm_tests::require_gpu;

const H: usize = 128;
const I: usize = 64;
const E: usize = 4;
const FIRST: usize = 2;
const TOP_K: usize = 3;
const MAX_TOKENS: usize = 40;

/// A random weight `rows x k` with block scales around 1 and global scale `g`.
fn weight(rows: usize, k: usize, g: f32, rng: &mut SplitMix64) -> PlainWeight {
    let m = random_matrix(rows, k, InputDistribution::Competition, rng).unwrap();
    let mut w = PlainWeight::from(&m);
    w.global_scale = g;
    w
}

/// `E` experts from `FIRST`, each with input scales of its own (as a calibrated checkpoint has).
fn experts(gated: bool, rng: &mut SplitMix64) -> LoadedExperts {
    let n1 = if gated { 2 * I } else { I };
    let experts = (0..E)
        .map(|e| ExpertWeights {
            expert: FIRST + e,
            w13: weight(n1, H, 0.05 + 0.01 * e as f32, rng),
            w2: weight(H, I, 0.04 + 0.01 * e as f32, rng),
            w13_input_scale: 0.02 * (1.0 + 0.3 * e as f32),
            w2_input_scale: 0.015 * (1.0 + 0.45 * e as f32),
        })
        .collect();
    LoadedExperts { first_expert: FIRST, experts }
}

/// Random ids over `0..E + 4` global experts (so some are another rank's), some −1, one token
/// routed twice to one expert.
fn routing(tokens: usize, rng: &mut SplitMix64) -> Routing {
    let mut ids: Vec<i64> = (0..tokens * TOP_K).map(|_| rng.below(E as u64 + 4) as i64 - 1).collect();
    // Expert FIRST + E - 1 gets no token.
    for id in &mut ids {
        if *id == (FIRST + E - 1) as i64 {
            *id = FIRST as i64;
        }
    }
    if tokens > 0 {
        ids[1.min(TOP_K - 1)] = ids[0];
    }
    let weights = (0..tokens * TOP_K).map(|_| 0.1 + 0.9 * rng.next_f64() as f32).collect();
    Routing { ids, weights, top_k: TOP_K }
}

/// The test blocks' shape: `E` experts from `FIRST`, H, I, top-`TOP_K`, at most `max_tokens`.
fn block_shape(max_tokens: usize) -> BlockShape {
    BlockShape { first_expert: FIRST as i64, experts: E, hidden: H, intermediate: I, top_k: TOP_K, max_tokens }
}

fn norm(v: impl Iterator<Item = f64>) -> f64 {
    v.map(|x| x * x).sum::<f64>().sqrt()
}

/// One block against the reference over several token counts.
fn check(activation: Activation, precision: Precision, at: RouterWeightAt, seed: u64) {
    let gpu = require_gpu(Arch::Sm90a);
    let stream = gpu.context().default_stream();
    let mut rng = SplitMix64::new(seed);
    let loaded = experts(activation.gated(), &mut rng);
    let options = BlockOptions::new(activation, precision, Dense16::Bf16).with_router_weight_at(at);
    let shape = block_shape(MAX_TOKENS);
    let mut block = ExpertBlock::new(&gpu, &stream, shape, options, &loaded).unwrap();
    for tokens in [0, 1, 17, MAX_TOKENS] {
        let what = format!("{activation:?} {precision:?} {at:?} T={tokens}");
        let x: Vec<bf16> = (0..tokens * H).map(|_| bf16::from_f64(rng.normal())).collect();
        let r = routing(tokens, &mut rng);
        let x64: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
        let want = round_output_as(&reference(&x64, H, &r, &loaded, &options).unwrap(), Dense16::Bf16);
        let x_dev = stream.clone_htod(&x).unwrap();
        let ids32: Vec<i32> = r.ids.iter().map(|&i| i as i32).collect();
        let (ids_dev, ids64_dev) = (stream.clone_htod(&ids32).unwrap(), stream.clone_htod(&r.ids).unwrap());
        let w_dev = stream.clone_htod(&r.weights).unwrap();
        let mut outs: Vec<Vec<bf16>> = vec![];
        for (i, ids) in [TopkIds::I32(&ids_dev), TopkIds::I64(&ids64_dev)].into_iter().enumerate() {
            let mut y: CudaSlice<bf16> = stream.clone_htod(&vec![bf16::NAN; tokens * H]).unwrap();
            block.run(&stream, &x_dev, tokens, ids, TopkWeights::F32(&w_dev), &mut y).unwrap();
            let got = stream.clone_dtoh(&y).unwrap();
            assert!(got.iter().all(|v| v.is_finite()), "{what} run {i}: a non-finite output");
            outs.push(got);
        }
        assert!(
            outs[0].iter().zip(&outs[1]).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: int32 and int64 ids gave different bits"
        );
        let got: Vec<f64> = outs[0].iter().map(|v| v.to_f64()).collect();
        let err = norm(got.iter().zip(&want).map(|(g, w)| g - w));
        let scale = norm(want.iter().copied());
        println!("CASE {what}: ‖got − ref‖ / ‖ref‖ = {:.3e}", if scale > 0.0 { err / scale } else { err });
        assert!(
            err <= 2e-2 * scale.max(1e-30) || (scale == 0.0 && err == 0.0),
            "{what}: ‖got − ref‖ / ‖ref‖ = {}",
            err / scale
        );
        // Tokens with no local slot are exactly zero.
        for t in 0..tokens {
            let local = (0..TOP_K).any(|k| (FIRST as i64..(FIRST + E) as i64).contains(&r.ids[t * TOP_K + k]));
            if !local {
                assert!(got[t * H..(t + 1) * H].iter().all(|&v| v == 0.0), "{what}: token {t} has no local slot");
            }
        }
    }
    // Arguments refused before any launch: more tokens than planned; the wrong element type.
    let x_dev = stream.clone_htod(&vec![bf16::ZERO; (MAX_TOKENS + 1) * H]).unwrap();
    let ids = stream.clone_htod(&vec![0i32; (MAX_TOKENS + 1) * TOP_K]).unwrap();
    let w = stream.clone_htod(&vec![1f32; (MAX_TOKENS + 1) * TOP_K]).unwrap();
    let mut y = stream.clone_htod(&vec![bf16::NAN; (MAX_TOKENS + 1) * H]).unwrap();
    let e = block.run(&stream, &x_dev, MAX_TOKENS + 1, TopkIds::I32(&ids), TopkWeights::F32(&w), &mut y);
    assert!(matches!(e, Err(Error::InvalidArgument { field: "tokens", .. })), "{e:?}");
    assert!(stream.clone_dtoh(&y).unwrap().iter().all(|v| v.is_nan()), "a refused call wrote its output");
}

#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_block_silu_w4a4() {
    check(Activation::Silu, Precision::W4a4, RouterWeightAt::Combine, 1);
}

#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_block_gelu_tanh_w4a4_weight_at_input() {
    check(Activation::GeluTanh, Precision::W4a4, RouterWeightAt::Input, 2);
}

#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_block_relu2_w4a4() {
    check(Activation::Relu2, Precision::W4a4, RouterWeightAt::Combine, 3);
}

#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_block_silu_w4a16() {
    check(Activation::Silu, Precision::W4a16, RouterWeightAt::Combine, 4);
}

#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_block_relu2_w4a16_weight_at_input() {
    check(Activation::Relu2, Precision::W4a16, RouterWeightAt::Input, 5);
}

/// One CUDA graph of the block, captured once at T = 24, replays changing routings (ids, weights
/// and tokens rewritten in place between replays): each replay within the tolerance of the
/// reference, and bit for bit the same call run eagerly.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_block_graph_replays_routings() {
    graph_replays(BlockPlan::default());
}

/// [`gpu_moe_block_graph_replays_routings`] with each GEMM's scheduler in a launch of its own.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_block_graph_replays_routings_schedulers_launched() {
    use nvfp4_gemm::moe_block::SchedulerPlacement;
    graph_replays(BlockPlan { schedulers: SchedulerPlacement::Launches, ..BlockPlan::default() });
}

/// [`gpu_moe_block_graph_replays_routings`] with the GEMMs' schedulers in the quantization's
/// launch and the tokens dequantized by the gather and the activation.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_block_graph_replays_routings_dequantization_in_quantizers() {
    use nvfp4_gemm::moe_block::{SchedulerPlacement, TokenDequantization};
    graph_replays(BlockPlan {
        schedulers: SchedulerPlacement::InQuantization,
        dequantization: TokenDequantization::InQuantizers,
        ..BlockPlan::default()
    });
}

fn graph_replays(plan: BlockPlan) {
    use nvfp4_gemm_tests::moe::{capture, with_capture_stream};
    let gpu = require_gpu(Arch::Sm90a);
    with_capture_stream(&gpu, |stream| {
        let mut rng = SplitMix64::new(0xB10C);
        let loaded = experts(true, &mut rng);
        let options = BlockOptions::new(Activation::Silu, Precision::W4a4, Dense16::Bf16);
        let shape = block_shape(MAX_TOKENS);
        let mut block = ExpertBlock::with_plan(&gpu, stream, shape, options, &loaded, plan).unwrap();
        let tokens = 24;
        let mut x_dev = stream.clone_htod(&vec![bf16::ZERO; tokens * H]).unwrap();
        let mut ids_dev = stream.clone_htod(&vec![-1i32; tokens * TOP_K]).unwrap();
        let mut w_dev = stream.clone_htod(&vec![0f32; tokens * TOP_K]).unwrap();
        let mut y: CudaSlice<bf16> = stream.clone_htod(&vec![bf16::NAN; tokens * H]).unwrap();
        // A first call outside the capture uploads the GEMMs' tables.
        block.run(stream, &x_dev, tokens, TopkIds::I32(&ids_dev), TopkWeights::F32(&w_dev), &mut y).unwrap();
        stream.synchronize().unwrap();
        let (graph, ()) = capture(stream, || {
            block.run(stream, &x_dev, tokens, TopkIds::I32(&ids_dev), TopkWeights::F32(&w_dev), &mut y).unwrap();
        });
        for round in 0..4 {
            let x: Vec<bf16> = (0..tokens * H).map(|_| bf16::from_f64(rng.normal())).collect();
            let mut r = routing(tokens, &mut rng);
            if round == 2 {
                // Every slot on one expert.
                r.ids.iter_mut().for_each(|id| *id = FIRST as i64 + 1);
            }
            let ids32: Vec<i32> = r.ids.iter().map(|&i| i as i32).collect();
            stream.memcpy_htod(&x, &mut x_dev).unwrap();
            stream.memcpy_htod(&ids32, &mut ids_dev).unwrap();
            stream.memcpy_htod(&r.weights, &mut w_dev).unwrap();
            stream.memcpy_htod(&vec![bf16::NAN; tokens * H], &mut y).unwrap();
            graph.launch().unwrap();
            stream.synchronize().unwrap();
            let replayed = stream.clone_dtoh(&y).unwrap();
            let x64: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
            let want = round_output_as(&reference(&x64, H, &r, &loaded, &options).unwrap(), Dense16::Bf16);
            let got: Vec<f64> = replayed.iter().map(|v| v.to_f64()).collect();
            let err = norm(got.iter().zip(&want).map(|(g, w)| g - w)) / norm(want.iter().copied());
            assert!(err <= 2e-2, "replay {round}: ‖got − ref‖ / ‖ref‖ = {err}");
            let mut eager: CudaSlice<bf16> = stream.clone_htod(&vec![bf16::NAN; tokens * H]).unwrap();
            block.run(stream, &x_dev, tokens, TopkIds::I32(&ids_dev), TopkWeights::F32(&w_dev), &mut eager).unwrap();
            let eager = stream.clone_dtoh(&eager).unwrap();
            assert!(
                replayed.iter().zip(&eager).all(|(a, b)| a.to_bits() == b.to_bits()),
                "replay {round}: the graph and the eager call differ"
            );
        }
    });
}

/// The GEMMs' schedulers in the quantization's launch (`SchedulerPlacement::InQuantization`, the
/// default): the same output bit for bit as the schedulers' own launches, W4A4 with the
/// activation kernel and with the epilogue, and W4A16, at T = 0, 1, 17 and the bound (the decode
/// and the general GEMMs), each within the tolerance of the reference; the output poisoned first.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_block_schedulers_in_quantization() {
    use nvfp4_gemm::moe_block::SchedulerPlacement;
    same_as_separate_launches("schedulers in the quantization", 0x5C4E, |activation| BlockPlan {
        activation,
        schedulers: SchedulerPlacement::InQuantization,
        ..BlockPlan::default()
    });
}

/// The tokens dequantized by the gather and the activation into the GEMMs' workspaces
/// (`TokenDequantization::InQuantizers`), alone and with the schedulers in the quantization's
/// launch: the same output bit for bit as the separate launches, in the cases of
/// [`gpu_moe_block_schedulers_in_quantization`] (W4A16 and the epilogue's second GEMM keep
/// their plans' own paths).
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_block_dequantization_in_quantizers() {
    use nvfp4_gemm::moe_block::{SchedulerPlacement, TokenDequantization};
    same_as_separate_launches("dequantization in the quantizers", 0xDE0A, |activation| BlockPlan {
        activation,
        schedulers: SchedulerPlacement::Launches,
        dequantization: TokenDequantization::InQuantizers,
    });
    same_as_separate_launches("both in the quantization", 0xDE0B, |activation| BlockPlan {
        activation,
        schedulers: SchedulerPlacement::InQuantization,
        dequantization: TokenDequantization::InQuantizers,
    });
}

/// A block planned as `variant` says (given the case's activation placement) against the same
/// block with every scheduler and dequantization in a launch of its own: the output bit for bit, W4A4 with the activation kernel
/// and with the epilogue, and W4A16, at T = 0, 1, 17 and the bound, each within the tolerance of
/// the reference; the output poisoned first.
fn same_as_separate_launches(label: &str, seed: u64, variant: impl Fn(ActivationPlacement) -> BlockPlan) {
    use nvfp4_gemm::moe_block::{SchedulerPlacement, TokenDequantization};
    let gpu = require_gpu(Arch::Sm90a);
    let stream = gpu.context().default_stream();
    let shape = block_shape(MAX_TOKENS);
    let mut rng = SplitMix64::new(seed);
    let cases = [
        (Precision::W4a4, ActivationPlacement::Kernel),
        (Precision::W4a4, ActivationPlacement::FirstGemmEpilogue),
        (Precision::W4a16, ActivationPlacement::Kernel),
    ];
    for (precision, activation) in cases {
        let loaded = experts(true, &mut rng);
        let options = BlockOptions::new(Activation::Silu, precision, Dense16::Bf16);
        let separate = BlockPlan {
            activation,
            schedulers: SchedulerPlacement::Launches,
            dequantization: TokenDequantization::Launches,
        };
        let mut base = ExpertBlock::with_plan(&gpu, &stream, shape, options, &loaded, separate).unwrap();
        let mut other = ExpertBlock::with_plan(&gpu, &stream, shape, options, &loaded, variant(activation)).unwrap();
        for tokens in [0, 1, 17, MAX_TOKENS] {
            let what = format!("{label}: {precision:?} {activation:?} T={tokens}");
            let x: Vec<bf16> = (0..tokens * H).map(|_| bf16::from_f64(rng.normal())).collect();
            let r = routing(tokens, &mut rng);
            let ids: Vec<i32> = r.ids.iter().map(|&i| i as i32).collect();
            let (x_dev, ids_dev) = (stream.clone_htod(&x).unwrap(), stream.clone_htod(&ids).unwrap());
            let w_dev = stream.clone_htod(&r.weights).unwrap();
            let run = |block: &mut ExpertBlock| {
                let mut y: CudaSlice<bf16> = stream.clone_htod(&vec![bf16::NAN; tokens * H]).unwrap();
                block.run(&stream, &x_dev, tokens, TopkIds::I32(&ids_dev), TopkWeights::F32(&w_dev), &mut y).unwrap();
                stream.clone_dtoh(&y).unwrap()
            };
            let (want_bits, got) = (run(&mut base), run(&mut other));
            assert!(
                got.iter().zip(&want_bits).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: the plan changed the output"
            );
            let x64: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
            let want = round_output_as(&reference(&x64, H, &r, &loaded, &options).unwrap(), Dense16::Bf16);
            let got: Vec<f64> = got.iter().map(|v| v.to_f64()).collect();
            let err = norm(got.iter().zip(&want).map(|(g, w)| g - w));
            let scale = norm(want.iter().copied());
            println!("CASE {what}: = the separate launches bit for bit; ‖got − ref‖ = {err:.3e} of {scale:.3e}");
            assert!(err <= 2e-2 * scale.max(1e-30) || (scale == 0.0 && err == 0.0), "{what}: {err} of {scale}");
        }
    }
}

/// An expert's input scale that is not finite and positive is refused by the constructor, named
/// by its field and expert, under W4A4 (W4A16 reads no input scale).
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_block_refuses_bad_input_scales() {
    let gpu = require_gpu(Arch::Sm90a);
    let stream = gpu.context().default_stream();
    let shape = block_shape(8);
    for (bad, field) in [(f32::NAN, "w13_input_scale"), (0.0, "w2_input_scale"), (-1.0, "w13_input_scale")] {
        let mut loaded = experts(true, &mut SplitMix64::new(7));
        if field == "w13_input_scale" {
            loaded.experts[2].w13_input_scale = bad;
        } else {
            loaded.experts[2].w2_input_scale = bad;
        }
        let w4a4 = BlockOptions::new(Activation::Silu, Precision::W4a4, Dense16::Bf16);
        match ExpertBlock::new(&gpu, &stream, shape, w4a4, &loaded) {
            Err(Error::InvalidArgument { field: f, reason, .. }) => {
                assert_eq!(f, field);
                assert!(reason.contains(&format!("expert {}", FIRST + 2)), "{reason}");
            }
            other => panic!("{bad} accepted: {:?}", other.map(|_| ())),
        }
        let w4a16 = BlockOptions::new(Activation::Silu, Precision::W4a16, Dense16::Bf16);
        assert!(ExpertBlock::new(&gpu, &stream, shape, w4a16, &loaded).is_ok(), "W4A16 reads no input scale");
    }
}

/// The block with its activation in the first GEMM's epilogue against the same block with the
/// activation kernel: the same output bit for bit (the epilogue computes what `moe_activate`
/// computes from the stored `h`), for every activation and both 16-bit types, T = 1 .. the
/// bound; and within the tolerance of the reference. W4A16 with the epilogue is refused.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_block_activation_epilogue_matches_the_kernel() {
    let gpu = require_gpu(Arch::Sm90a);
    let stream = gpu.context().default_stream();
    let shape = block_shape(MAX_TOKENS);
    let fused_plan = BlockPlan { activation: ActivationPlacement::FirstGemmEpilogue, ..BlockPlan::default() };
    let mut rng = SplitMix64::new(0xF05E);
    for activation in [Activation::Silu, Activation::GeluTanh, Activation::Relu2] {
        for dtype in [Dense16::Bf16, Dense16::F16] {
            let loaded = experts(activation.gated(), &mut rng);
            let options = BlockOptions::new(activation, Precision::W4a4, dtype);
            let mut separate = ExpertBlock::new(&gpu, &stream, shape, options, &loaded).unwrap();
            let mut fused = ExpertBlock::with_plan(&gpu, &stream, shape, options, &loaded, fused_plan).unwrap();
            for tokens in [1, 17, MAX_TOKENS] {
                let what = format!("{activation:?} {dtype:?} T={tokens}");
                let r = routing(tokens, &mut rng);
                let x64: Vec<f64> = (0..tokens * H).map(|_| bf16::from_f64(rng.normal()).to_f64()).collect();
                let want = round_output_as(&reference(&x64, H, &r, &loaded, &options).unwrap(), dtype);
                let ids: Vec<i32> = r.ids.iter().map(|&i| i as i32).collect();
                let (ids_dev, w_dev) = (stream.clone_htod(&ids).unwrap(), stream.clone_htod(&r.weights).unwrap());
                // Both blocks' outputs as bits and as f64, over the same x in the block's type.
                let run = |block: &mut ExpertBlock| -> (Vec<u16>, Vec<f64>) {
                    if dtype == Dense16::Bf16 {
                        let x: Vec<bf16> = x64.iter().map(|&v| bf16::from_f64(v)).collect();
                        let x_dev = stream.clone_htod(&x).unwrap();
                        let mut y = stream.clone_htod(&vec![bf16::NAN; tokens * H]).unwrap();
                        block
                            .run(&stream, &x_dev, tokens, TopkIds::I32(&ids_dev), TopkWeights::F32(&w_dev), &mut y)
                            .unwrap();
                        let y = stream.clone_dtoh(&y).unwrap();
                        (y.iter().map(|v| v.to_bits()).collect(), y.iter().map(|v| v.to_f64()).collect())
                    } else {
                        let x: Vec<half::f16> = x64.iter().map(|&v| half::f16::from_f64(v)).collect();
                        let x_dev = stream.clone_htod(&x).unwrap();
                        let mut y = stream.clone_htod(&vec![half::f16::NAN; tokens * H]).unwrap();
                        block
                            .run(&stream, &x_dev, tokens, TopkIds::I32(&ids_dev), TopkWeights::F32(&w_dev), &mut y)
                            .unwrap();
                        let y = stream.clone_dtoh(&y).unwrap();
                        (y.iter().map(|v| v.to_bits()).collect(), y.iter().map(|v| v.to_f64()).collect())
                    }
                };
                let (bits_separate, _) = run(&mut separate);
                let (bits_fused, got) = run(&mut fused);
                assert!(
                    bits_fused == bits_separate,
                    "{what}: the epilogue's output differs from the activation kernel's"
                );
                let err = norm(got.iter().zip(&want).map(|(g, w)| g - w)) / norm(want.iter().copied()).max(1e-30);
                println!("CASE {what}: fused = separate bit for bit; ‖got − ref‖ / ‖ref‖ = {err:.3e}");
                assert!(err <= 2e-2, "{what}: ‖got − ref‖ / ‖ref‖ = {err}");
            }
        }
    }
    let loaded = experts(true, &mut rng);
    let w4a16 = BlockOptions::new(Activation::Silu, Precision::W4a16, Dense16::Bf16);
    let refused = ExpertBlock::with_plan(&gpu, &stream, shape, w4a16, &loaded, fused_plan);
    assert!(matches!(refused, Err(Error::Unsupported(_))), "{:?}", refused.map(|_| ()));
}

/// T = 4096 (12,288 slots: the multi-CTA routing) through a block planned for 4096 tokens, W4A4
/// with the activation kernel and with the epilogue, and W4A16: within the tolerance of the
/// reference, the two W4A4 placements bit for bit, the output poisoned first.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_block_4096_tokens() {
    let gpu = require_gpu(Arch::Sm90a);
    let stream = gpu.context().default_stream();
    let tokens = 4096;
    let shape = block_shape(tokens);
    let mut rng = SplitMix64::new(0x4096);
    let loaded = experts(true, &mut rng);
    let r = routing(tokens, &mut rng);
    let x: Vec<bf16> = (0..tokens * H).map(|_| bf16::from_f64(rng.normal())).collect();
    let x64: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let ids: Vec<i32> = r.ids.iter().map(|&i| i as i32).collect();
    let (x_dev, ids_dev, w_dev) =
        (stream.clone_htod(&x).unwrap(), stream.clone_htod(&ids).unwrap(), stream.clone_htod(&r.weights).unwrap());
    let mut w4a4_bits = vec![];
    for (precision, activation) in [
        (Precision::W4a4, ActivationPlacement::Kernel),
        (Precision::W4a4, ActivationPlacement::FirstGemmEpilogue),
        (Precision::W4a16, ActivationPlacement::Kernel),
    ] {
        let what = format!("{precision:?} {activation:?} T={tokens}");
        let options = BlockOptions::new(Activation::Silu, precision, Dense16::Bf16);
        let plan = BlockPlan { activation, ..BlockPlan::default() };
        let mut block = ExpertBlock::with_plan(&gpu, &stream, shape, options, &loaded, plan).unwrap();
        let mut y: CudaSlice<bf16> = stream.clone_htod(&vec![bf16::NAN; tokens * H]).unwrap();
        block.run(&stream, &x_dev, tokens, TopkIds::I32(&ids_dev), TopkWeights::F32(&w_dev), &mut y).unwrap();
        let got = stream.clone_dtoh(&y).unwrap();
        assert!(got.iter().all(|v| v.is_finite()), "{what}: a non-finite output");
        let want = round_output_as(&reference(&x64, H, &r, &loaded, &options).unwrap(), Dense16::Bf16);
        let err = norm(got.iter().zip(&want).map(|(g, w)| g.to_f64() - w)) / norm(want.iter().copied());
        println!("CASE {what}: ‖got − ref‖ / ‖ref‖ = {err:.3e}");
        assert!(err <= 2e-2, "{what}: ‖got − ref‖ / ‖ref‖ = {err}");
        if precision == Precision::W4a4 {
            w4a4_bits.push(got.iter().map(|v| v.to_bits()).collect::<Vec<u16>>());
        }
    }
    assert!(w4a4_bits[0] == w4a4_bits[1], "the epilogue's output differs from the activation kernel's at T = 4096");
}

/// The block through the C interface (`nvfp4_expert_block_create` from a ModelOpt file built in
/// memory, `nvfp4_expert_block_run`) against `ExpertBlock` planned from the same file: the same
/// output bit for bit; a bad id type is `NVFP4_INVALID` with the output unwritten.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_block_through_the_c_interface() {
    use cudarc::driver::DevicePtr;
    use nvfp4_format::checkpoint::safetensors::{serialize, tensor::TensorView, Dtype};
    use nvfp4_format::checkpoint::{Checkpoint, Convention, LoadOptions};
    use nvfp4_gemm::capi::*;
    let gpu = require_gpu(Arch::Sm90a);
    let stream = gpu.context().default_stream();
    let mut rng = SplitMix64::new(0xC0DE);
    let loaded = experts(true, &mut rng);
    // The experts as a ModelOpt checkpoint stores them: w13 split into w1 (gate) and w3 (up).
    let mut data: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = vec![];
    for x in &loaded.experts {
        let base = |p: &str| format!("model.layers.0.mlp.experts.{}.{p}", x.expert);
        let (vb, sb) = (H / 2, H / 16);
        for (p, rows) in [("w1", 0..I), ("w3", I..2 * I)] {
            let values = x.w13.values[rows.start * vb..rows.end * vb].to_vec();
            let scales = x.w13.plain_scales[rows.start * sb..rows.end * sb].to_vec();
            data.push((format!("{}.weight", base(p)), Dtype::U8, vec![I, H / 2], values));
            data.push((format!("{}.weight_scale", base(p)), Dtype::F8_E4M3, vec![I, H / 16], scales));
            data.push((
                format!("{}.weight_scale_2", base(p)),
                Dtype::F32,
                vec![],
                x.w13.global_scale.to_le_bytes().to_vec(),
            ));
            data.push((
                format!("{}.input_scale", base(p)),
                Dtype::F32,
                vec![],
                x.w13_input_scale.to_le_bytes().to_vec(),
            ));
        }
        data.push((format!("{}.weight", base("w2")), Dtype::U8, vec![H, I / 2], x.w2.values.clone()));
        data.push((format!("{}.weight_scale", base("w2")), Dtype::F8_E4M3, vec![H, I / 16], x.w2.plain_scales.clone()));
        data.push((
            format!("{}.weight_scale_2", base("w2")),
            Dtype::F32,
            vec![],
            x.w2.global_scale.to_le_bytes().to_vec(),
        ));
        data.push((format!("{}.input_scale", base("w2")), Dtype::F32, vec![], x.w2_input_scale.to_le_bytes().to_vec()));
    }
    let views: Vec<(String, TensorView<'_>)> =
        data.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    let file = serialize(views, None).unwrap();
    let checkpoint = Checkpoint::parse(&file).unwrap();
    let from_file = checkpoint
        .load_experts(&LoadOptions::new("model.layers.0.mlp", Convention::ModelOpt, FIRST..FIRST + E))
        .unwrap();
    let options = BlockOptions::new(Activation::Silu, Precision::W4a4, Dense16::Bf16);
    let mut rust = ExpertBlock::new(&gpu, &stream, block_shape(MAX_TOKENS), options, &from_file).unwrap();

    let tokens = 17;
    let r = routing(tokens, &mut rng);
    let x: Vec<bf16> = (0..tokens * H).map(|_| bf16::from_f64(rng.normal())).collect();
    let ids: Vec<i32> = r.ids.iter().map(|&i| i as i32).collect();
    let (x_dev, ids_dev, w_dev) =
        (stream.clone_htod(&x).unwrap(), stream.clone_htod(&ids).unwrap(), stream.clone_htod(&r.weights).unwrap());
    let mut want: CudaSlice<bf16> = stream.clone_htod(&vec![bf16::NAN; tokens * H]).unwrap();
    rust.run(&stream, &x_dev, tokens, TopkIds::I32(&ids_dev), TopkWeights::F32(&w_dev), &mut want).unwrap();
    let want = stream.clone_dtoh(&want).unwrap();
    let y: CudaSlice<bf16> = stream.clone_htod(&vec![bf16::NAN; tokens * H]).unwrap();
    let raw = |ptr: u64, len: usize| RawBuffer { ptr, len: len as u64 };
    let (xr, ir, wr, yr) = (
        raw(x_dev.device_ptr(&stream).0, tokens * H),
        raw(ids_dev.device_ptr(&stream).0, tokens * TOP_K),
        raw(w_dev.device_ptr(&stream).0, tokens * TOP_K),
        raw(y.device_ptr(&stream).0, tokens * H),
    );
    stream.synchronize().unwrap();
    let desc = RawBlockDesc {
        first_expert: FIRST as u64,
        experts: E as u64,
        top_k: TOP_K as u64,
        max_tokens: MAX_TOKENS as u64,
        activation: NVFP4_SILU,
        precision: NVFP4_W4A4,
        dtype: NVFP4_BF16,
        flags: 0,
    };
    let shard = RawHostBytes { data: file.as_ptr(), len: file.len() };
    let prefix = std::ffi::CString::new("model.layers.0.mlp").unwrap();
    let mut err = [0 as std::ffi::c_char; 512];
    let (e, n) = (err.as_mut_ptr(), err.len());
    let (mut dev, mut block) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: live host and device buffers of these lengths, the legacy default stream (null),
    // an error buffer of `n` bytes; the handles are destroyed at the end.
    unsafe {
        assert_eq!(nvfp4_device_open(0, &mut dev, e, n), NVFP4_OK);
        let null = std::ptr::null_mut();
        let status = nvfp4_expert_block_create(
            dev,
            null,
            &shard,
            1,
            prefix.as_ptr(),
            NVFP4_MODELOPT,
            NVFP4_PROJECTIONS_W1_W3_W2,
            NVFP4_RECONCILE_REFUSE,
            &desc,
            &mut block,
            e,
            n,
        );
        assert_eq!(status, NVFP4_OK, "{:?}", std::ffi::CStr::from_ptr(err.as_ptr()));
        let bad = nvfp4_expert_block_run(block, null, xr, tokens as u64, ir, 7, wr, NVFP4_WEIGHTS_F32, yr, e, n);
        assert_eq!(bad, NVFP4_INVALID);
        gpu.context().synchronize().unwrap();
        assert!(stream.clone_dtoh(&y).unwrap().iter().all(|v| v.is_nan()), "a refused call wrote its output");
        let status =
            nvfp4_expert_block_run(block, null, xr, tokens as u64, ir, NVFP4_IDS_I32, wr, NVFP4_WEIGHTS_F32, yr, e, n);
        assert_eq!(status, NVFP4_OK, "{:?}", std::ffi::CStr::from_ptr(err.as_ptr()));
        gpu.context().synchronize().unwrap();
        nvfp4_expert_block_destroy(block);
        nvfp4_device_close(dev);
    }
    let got = stream.clone_dtoh(&y).unwrap();
    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "the C block differs from the Rust block");
}
