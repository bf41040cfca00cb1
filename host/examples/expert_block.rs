//! The whole MoE expert block of one layer, as a serving engine calls it: the experts read from a
//! checkpoint as stored (here a ModelOpt NVFP4 file built in memory: 8 experts, H = 256, I = 128,
//! each expert with its own global and input scales), planned once for a token bound, then one
//! call per step with the router's `topk_ids` / `topk_weights` on the device. The output is
//! checked against the fp64 reference of the block (`nvfp4_format::moe_block::reference`).
//!
//! Run: `cargo run --release --example expert_block` (sm_90a; without a GPU it says why and runs
//! the CPU reference alone).

use half::bf16;
use nvfp4_gemm::format::checkpoint::safetensors::{serialize, tensor::TensorView, Dtype};
use nvfp4_gemm::format::checkpoint::{Checkpoint, Convention, LoadOptions};
use nvfp4_gemm::format::moe_block::{reference, round_output_as, Routing};
use nvfp4_gemm::format::SplitMix64;
use nvfp4_gemm::moe_block::{
    Activation, BlockOptions, BlockShape, Dense16, ExpertBlock, Precision, TopkIds, TopkWeights,
};
use nvfp4_gemm::Gpu;

const PREFIX: &str = "model.layers.0.mlp";
const EXPERTS: usize = 8;
const H: usize = 256;
const I: usize = 128;
const TOP_K: usize = 2;
const TOKENS: usize = 24;

/// A ModelOpt NVFP4 file of the layer's experts: random e2m1 values, block scales 0.5–2, a
/// weight global scale and an input scale per expert and projection.
fn checkpoint_file(rng: &mut SplitMix64) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let mut data: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = vec![];
    for e in 0..EXPERTS {
        for (proj, rows, k) in [("w1", I, H), ("w3", I, H), ("w2", H, I)] {
            let base = format!("{PREFIX}.experts.{e}.{proj}");
            let values: Vec<u8> = (0..rows * k / 2).map(|_| rng.below(256) as u8).collect();
            let scales: Vec<u8> = (0..rows * k / 16).map(|_| 0x30 + rng.below(17) as u8).collect();
            let global = (0.5 / (k as f32).sqrt()).to_le_bytes().to_vec();
            let input = (1.0 / (48.0 + e as f32)).to_le_bytes().to_vec();
            data.push((format!("{base}.weight"), Dtype::U8, vec![rows, k / 2], values));
            data.push((format!("{base}.weight_scale"), Dtype::F8_E4M3, vec![rows, k / 16], scales));
            data.push((format!("{base}.weight_scale_2"), Dtype::F32, vec![], global));
            data.push((format!("{base}.input_scale"), Dtype::F32, vec![1], input));
        }
    }
    let views = data
        .iter()
        .map(|(name, dtype, shape, bytes)| Ok((name.clone(), TensorView::new(*dtype, shape.clone(), bytes)?)))
        .collect::<Result<Vec<_>, Box<dyn std::error::Error>>>()?;
    Ok(serialize(views, None)?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut rng = SplitMix64::new(42);
    let file = checkpoint_file(&mut rng)?;
    // Load: every tensor's name, dtype, shape and scale is checked; the scales come back as
    // dequantization multipliers whatever the convention stored.
    let experts =
        Checkpoint::parse(&file)?.load_experts(&LoadOptions::new(PREFIX, Convention::ModelOpt, 0..EXPERTS))?;
    let options = BlockOptions::new(Activation::Silu, Precision::W4a4, Dense16::Bf16);

    // One step's inputs: tokens and the router's choice (top-2 distinct experts, weights that sum to 1).
    let x: Vec<bf16> = (0..TOKENS * H).map(|_| bf16::from_f64(rng.normal())).collect();
    let mut ids = Vec::with_capacity(TOKENS * TOP_K);
    let mut weights = Vec::with_capacity(TOKENS * TOP_K);
    for _ in 0..TOKENS {
        let a = rng.below(EXPERTS as u64) as i64;
        let b = (a + 1 + rng.below(EXPERTS as u64 - 1) as i64) % EXPERTS as i64;
        let w = 0.2 + 0.6 * rng.next_f64() as f32;
        ids.extend([a, b]);
        weights.extend([w, 1.0 - w]);
    }
    let routing = Routing { ids: ids.clone(), weights: weights.clone(), top_k: TOP_K };
    let x64: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let want = round_output_as(&reference(&x64, H, &routing, &experts, &options)?, Dense16::Bf16);

    let gpu = match Gpu::new(0) {
        Ok(gpu) => gpu,
        Err(e) => {
            let norm = want.iter().map(|v| v * v).sum::<f64>().sqrt();
            println!("No GPU run: {e}. The CPU reference of the block: ‖y‖ = {norm:.4} over {TOKENS} tokens.");
            return Ok(());
        }
    };
    let stream = gpu.context().default_stream();
    let shape =
        BlockShape { first_expert: 0, experts: EXPERTS, hidden: H, intermediate: I, top_k: TOP_K, max_tokens: 64 };
    // Once: weights uploaded, every buffer allocated for 64 tokens.
    let mut block = ExpertBlock::new(&gpu, &stream, shape, options, &experts)?;

    // Per step: device inputs, one call, no host synchronization inside it.
    let ids32: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
    let (x_dev, ids_dev, w_dev) = (stream.clone_htod(&x)?, stream.clone_htod(&ids32)?, stream.clone_htod(&weights)?);
    let mut y = stream.alloc_zeros::<bf16>(TOKENS * H)?;
    block.run(&stream, &x_dev, TOKENS, TopkIds::I32(&ids_dev), TopkWeights::F32(&w_dev), &mut y)?;
    let got = stream.clone_dtoh(&y)?;

    let err = got.iter().zip(&want).map(|(g, w)| (g.to_f64() - w).powi(2)).sum::<f64>().sqrt();
    let norm = want.iter().map(|v| v * v).sum::<f64>().sqrt();
    println!("{} on {TOKENS} tokens: ‖y − ref‖ / ‖ref‖ = {:.2e}", gpu.name(), err / norm);
    if err > 2e-2 * norm {
        return Err("the block is outside the reference's tolerance".into());
    }
    Ok(())
}
