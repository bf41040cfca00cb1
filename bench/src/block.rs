//! The whole-expert-block rows (`--block`): `nvfp4_gemm::moe_block::ExpertBlock` on the MoE
//! layers of three models (DeepSeek-V3, Qwen3-30B-A3B, Mixtral-8x7B; silu, gated) at several
//! token counts, W4A4 and W4A16 with bf16 activations, against the byte floor of the experts the
//! routing actually touches. This module is the pure half — the layers, the seeded routing, the
//! random experts, the floor, the targets, the results and their table — and runs on any machine;
//! the GPU half is [`crate::block_measure`].
//!
//! PyTorch's bf16 block and the library's unfused composition are timed by the Python bench
//! (`python/bench/bench.py --block`), which prints the same rows with those columns.

use crate::report::aligned;
use crate::stats::Stats;
use nvfp4_format::checkpoint::{ExpertWeights, LoadedExperts, PlainWeight};
use nvfp4_format::SplitMix64;
use rayon::prelude::*;
use serde::Serialize;
use std::fmt::Write as _;

/// One MoE layer's expert block: the layer's experts and sizes (the activation is silu, gated:
/// W13 holds `2I` rows, the gate rows first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BlockLayer {
    /// Row name (`--block-shapes`).
    pub name: &'static str,
    /// The model the layer is from.
    pub model: &'static str,
    /// Experts `E`.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Hidden size `H`.
    pub hidden: usize,
    /// Intermediate size `I` (per expert).
    pub intermediate: usize,
}

/// The layers, in the order they run.
pub const BLOCK_LAYERS: [BlockLayer; 3] = [
    BlockLayer { name: "ds", model: "DeepSeek-V3", experts: 256, top_k: 8, hidden: 7168, intermediate: 2048 },
    BlockLayer { name: "qwen3", model: "Qwen3-30B-A3B", experts: 128, top_k: 8, hidden: 2048, intermediate: 768 },
    BlockLayer { name: "mixtral", model: "Mixtral-8x7B", experts: 8, top_k: 2, hidden: 4096, intermediate: 14336 },
];

/// The token counts of a run (`--block-tokens`).
pub const BLOCK_TOKENS: [usize; 5] = [1, 8, 64, 512, 4096];

/// `--block-quick`: the layers and token counts of the quicker subset (DeepSeek's 6.3 GB of
/// weights, drawn, uploaded and checked twice, are most of a full run's time).
pub const QUICK_LAYERS: [&str; 2] = ["qwen3", "mixtral"];
/// `--block-quick`'s token counts.
pub const QUICK_TOKENS: [usize; 3] = [1, 64, 4096];

/// Most tokens a row may have (`--block-tokens`): the block's rows (`T · top_k`) and its
/// buffers stay well inside the kernels' 32-bit indexing at every layer here.
pub const MAX_BLOCK_TOKENS: usize = 16384;

/// The tokens of the check (`--block-check-tokens`): few, so that the CPU reference decodes few
/// experts (at most `tokens · top_k`; DeepSeek's take ~44 M weights each).
pub const CHECK_TOKENS: usize = 2;

/// The check's bound on `‖got − ref‖ / ‖ref‖` (the GPU tests' bound for the block, which rounds
/// to bf16 at three points and, under W4A4, requantizes twice).
pub const CHECK_BOUND: f64 = 2e-2;

/// The weights' dequantization global scale is `WEIGHT_SCALE / sqrt(K)`, so that each GEMM's
/// outputs are of order 1 (random e2m1 codes have an rms of ~2.9, the block scales are 0.5–2,
/// the activations' magnitudes 0.5–2).
pub const WEIGHT_SCALE: f64 = 0.5;

/// Both GEMMs' input scale (the W4A4 quantizers' global scale), the same for every expert, as the
/// Python bench's unfused composition (one `MoE` layer per GEMM, one quantizer scale each) needs
/// to compute the same block: a 16-block's scale is `amax / 6 / s`, e4m3's normal range for amax
/// from ~0.004 to ~84.
pub const INPUT_SCALE: f32 = 1.0 / 32.0;

/// The smallest e4m3 scale code drawn (0.5) and how many codes from it (to 0x40 = 2.0): finite,
/// positive scales only.
const SCALE_CODE_LO: u8 = 0x30;
const SCALE_CODES: u8 = 17;

/// Salts of the seeded streams (XORed with `--seed`).
const ROUTING_SALT: u64 = 0xB10C_0000_0000_0001;
const WEIGHT_SALT: u64 = 0xB10C_0000_0000_0002;
/// The activations' salt ([`crate::block_measure`]).
pub const ACTIVATION_SALT: u64 = 0xB10C_0000_0000_0003;
/// The check's salt, so that its routing is not a timed row's.
pub const CHECK_SALT: u64 = 0xB10C_0000_0000_0004;

impl BlockLayer {
    /// A layer by name.
    pub fn named(name: &str) -> Option<BlockLayer> {
        BLOCK_LAYERS.iter().find(|l| l.name == name).copied()
    }

    /// W13's rows: gate and up (`2I`).
    pub fn n1(&self) -> usize {
        2 * self.intermediate
    }

    /// One expert's NVFP4 bytes: W13 and W2, packed values and blocked scales (no padding at
    /// these sizes: rows are multiples of 128 and K of 64).
    pub fn expert_bytes(&self) -> u64 {
        let matrix = |rows: usize, k: usize| (rows * k / 2 + rows.div_ceil(128) * 128 * k.div_ceil(64) * 4) as u64;
        matrix(self.n1(), self.hidden) + matrix(self.hidden, self.intermediate)
    }

    /// Every expert's NVFP4 bytes (the device memory of the block's weights).
    pub fn weight_bytes(&self) -> u64 {
        self.experts as u64 * self.expert_bytes()
    }

    /// The floor's bytes of a call on `tokens` tokens that touches `touched` distinct experts:
    /// their weights, plus the bf16 activations read and the bf16 output written (`T x H` each).
    pub fn floor_bytes(&self, tokens: usize, touched: usize) -> u64 {
        touched as u64 * self.expert_bytes() + 2 * (2 * tokens * self.hidden) as u64
    }

    /// `e=256,top_k=8,h=7168,i=2048,silu`.
    pub fn to_spec(&self) -> String {
        format!("e={},top_k={},h={},i={},silu", self.experts, self.top_k, self.hidden, self.intermediate)
    }
}

/// The token operand's precision of a block row (`--block-precision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BlockPrecision {
    /// NVFP4 activations, quantized on the GPU (`Precision::W4a4`).
    W4a4,
    /// W4A4 with the activation and requantization in the first GEMM's epilogue
    /// (`ActivationPlacement::FirstGemmEpilogue`, sm_90a).
    #[serde(rename = "w4a4-epilogue")]
    W4a4Epilogue,
    /// bf16 activations times the weights prepacked on the GPU (`Precision::W4a16`).
    W4a16,
}

impl BlockPrecision {
    /// Every one, in the order they run.
    pub const ALL: [BlockPrecision; 3] = [BlockPrecision::W4a4, BlockPrecision::W4a4Epilogue, BlockPrecision::W4a16];

    /// `w4a4`, `w4a4-epilogue` or `w4a16`.
    pub fn name(self) -> &'static str {
        match self {
            BlockPrecision::W4a4 => "w4a4",
            BlockPrecision::W4a4Epilogue => "w4a4-epilogue",
            BlockPrecision::W4a16 => "w4a16",
        }
    }

    /// By name.
    pub fn named(name: &str) -> Option<BlockPrecision> {
        BlockPrecision::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// The router's choice for `T` tokens, as an engine passes it: `ids` and `weights` `T x top_k`,
/// row-major, int32 and f32.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockRouting {
    /// Expert ids, `top_k` distinct ones per token.
    pub ids: Vec<i32>,
    /// Router weights: positive, each token's summing to 1.
    pub weights: Vec<f32>,
    /// Experts per token.
    pub top_k: usize,
}

/// Each token's `top_k` distinct experts drawn uniformly (by rejection) and its weights the
/// softmax of `top_k` standard normal logits, from one SplitMix64 stream seeded with `seed`,
/// `tokens` and the layer's size (so that every row has its own). `top_k` must not exceed
/// `experts`.
pub fn routing(tokens: usize, experts: usize, top_k: usize, seed: u64) -> BlockRouting {
    assert!(top_k >= 1 && top_k <= experts, "top_k {top_k} of {experts} experts");
    let mut rng = SplitMix64::new(
        seed ^ ROUTING_SALT ^ (tokens as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((experts as u64) << 40),
    );
    let mut ids = Vec::with_capacity(tokens * top_k);
    let mut weights = Vec::with_capacity(tokens * top_k);
    for _ in 0..tokens {
        let first = ids.len();
        while ids.len() < first + top_k {
            let e = rng.below(experts as u64) as i32;
            if !ids[first..].contains(&e) {
                ids.push(e);
            }
        }
        let logits: Vec<f64> = (0..top_k).map(|_| rng.normal()).collect();
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let exps: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
        let sum: f64 = exps.iter().sum();
        weights.extend(exps.iter().map(|e| (e / sum) as f32));
    }
    BlockRouting { ids, weights, top_k }
}

impl BlockRouting {
    /// The distinct experts in `0..experts` the routing touches.
    pub fn touched(&self, experts: usize) -> usize {
        let mut seen = vec![false; experts];
        for &id in &self.ids {
            if let Ok(i) = usize::try_from(id) {
                if i < experts {
                    seen[i] = true;
                }
            }
        }
        seen.iter().filter(|&&s| s).count()
    }

    /// The routing as the CPU reference takes it (`nvfp4_format::moe_block::Routing`).
    pub fn reference(&self) -> nvfp4_format::moe_block::Routing {
        nvfp4_format::moe_block::Routing {
            ids: self.ids.iter().map(|&i| i64::from(i)).collect(),
            weights: self.weights.clone(),
            top_k: self.top_k,
        }
    }
}

/// A random `rows x k` weight: every e2m1 code, e4m3 block scales from 0.5 to 2 (finite and
/// positive), global scale `WEIGHT_SCALE / sqrt(k)`; from one stream seeded with `seed`.
fn random_weight(rows: usize, k: usize, seed: u64) -> PlainWeight {
    let mut rng = SplitMix64::new(seed);
    let mut values = vec![0u8; rows * k / 2];
    rng.fill_bytes(&mut values);
    let mut plain_scales = vec![0u8; rows * k / 16];
    rng.fill_bytes(&mut plain_scales);
    for s in &mut plain_scales {
        *s = SCALE_CODE_LO + *s % SCALE_CODES;
    }
    PlainWeight { rows, k, values, plain_scales, global_scale: (WEIGHT_SCALE / (k as f64).sqrt()) as f32 }
}

/// `experts` random experts of a silu block of hidden size `hidden` and intermediate size
/// `intermediate`, numbered from 0, as the checkpoint loader returns them; drawn in parallel
/// (each matrix its own seeded stream), both input scales [`INPUT_SCALE`].
pub fn random_experts(experts: usize, hidden: usize, intermediate: usize, seed: u64) -> LoadedExperts {
    let stream =
        |e: usize, which: u64| seed ^ WEIGHT_SALT ^ ((e as u64) << 8 | which).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let experts = (0..experts)
        .into_par_iter()
        .map(|e| ExpertWeights {
            expert: e,
            w13: random_weight(2 * intermediate, hidden, stream(e, 1)),
            w2: random_weight(hidden, intermediate, stream(e, 2)),
            w13_input_scale: INPUT_SCALE,
            w2_input_scale: INPUT_SCALE,
        })
        .collect();
    LoadedExperts { first_expert: 0, experts }
}

/// The floor in µs: `bytes` at the copy rate (`copy_tb_s`: bytes read + written per second /
/// 1e12, as the ceilings measure it).
pub fn floor_us(bytes: u64, copy_tb_s: f64) -> f64 {
    bytes as f64 / (copy_tb_s * 1e12) * 1e6
}

/// The expert block's performance targets for one row; `None` where a target does not apply to
/// the row's token count or its measurement is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Targets {
    /// T ≤ 64: at least 75% of the byte floor (floor time / block time ≥ 0.75).
    pub floor: Option<bool>,
    /// T ≤ 64: at least 3× PyTorch's bf16 block; T = 4096: at least 1.1×.
    pub torch: Option<bool>,
    /// T ≤ 64: the fused block at most 0.75× the library's unfused composition.
    pub unfused: Option<bool>,
}

/// Fraction of the floor a row must reach at T ≤ 64.
pub const FLOOR_TARGET: f64 = 0.75;
/// PyTorch time / block time a row must reach at T ≤ 64.
pub const TORCH_TARGET_DECODE: f64 = 3.0;
/// PyTorch time / block time a row must reach at T = 4096.
pub const TORCH_TARGET_PREFILL: f64 = 1.1;
/// Block time / unfused time a row must stay under at T ≤ 64.
pub const UNFUSED_TARGET: f64 = 0.75;

/// The targets of a row on `tokens` tokens: `of_floor` = floor time / block time, `x_torch` =
/// PyTorch time / block time, `of_unfused` = block time / unfused time.
pub fn targets(tokens: usize, of_floor: Option<f64>, x_torch: Option<f64>, of_unfused: Option<f64>) -> Targets {
    let decode = tokens <= 64;
    Targets {
        floor: if decode { of_floor.map(|f| f >= FLOOR_TARGET) } else { None },
        torch: match tokens {
            t if t <= 64 => x_torch.map(|x| x >= TORCH_TARGET_DECODE),
            4096 => x_torch.map(|x| x >= TORCH_TARGET_PREFILL),
            _ => None,
        },
        unfused: if decode { of_unfused.map(|r| r <= UNFUSED_TARGET) } else { None },
    }
}

/// A target's cell: `pass`, `MISS`, or `-` (not applicable or not measured).
pub fn target_cell(t: Option<bool>) -> &'static str {
    match t {
        Some(true) => "pass",
        Some(false) => "MISS",
        None => "-",
    }
}

/// One timed row: one token count on one block.
#[derive(Debug, Clone, Serialize)]
pub struct BlockRow {
    /// Tokens `T`.
    pub tokens: usize,
    /// Distinct experts the routing touches.
    pub touched: usize,
    /// The floor's bytes ([`BlockLayer::floor_bytes`]).
    pub floor_bytes: u64,
    /// `floor_bytes` at the copy rate, µs.
    pub floor_us: f64,
    /// `ExpertBlock::run`: events around one call after an L2 flush, µs.
    pub us: Stats,
    /// The same call captured once in a CUDA graph and replayed (as serving engines run decode
    /// steps): events around one replay after an L2 flush, µs.
    pub graph_us: Stats,
    /// The replay wrote the direct call's output bit for bit.
    pub graph_same: bool,
    /// `floor_us` / the graph replay's median (the targets judge the replay).
    pub of_floor: f64,
    /// The call's output was finite everywhere (read back after the timings).
    pub finite: bool,
    /// The targets the Rust bench can judge (the floor's; PyTorch's and the unfused
    /// composition's come from the Python bench).
    pub targets: Targets,
}

/// One block: a layer at one precision, checked once, then a row per token count.
#[derive(Debug, Clone, Serialize)]
pub struct BlockRun {
    /// The layer.
    pub layer: BlockLayer,
    /// The layer as `e=..,top_k=..,h=..,i=..,silu`.
    pub spec: String,
    /// `w4a4` or `w4a16`.
    pub precision: BlockPrecision,
    /// The block's bound on the tokens (the largest of the run's token counts and the check's).
    pub max_tokens: usize,
    /// Every expert's NVFP4 bytes on the device.
    pub weight_bytes: u64,
    /// Seconds of `ExpertBlock::new` (upload, and W4A16's prepack on the GPU).
    pub build_s: f64,
    /// What the check against the CPU reference found (`None`: skipped with `--no-check`).
    pub check: Option<String>,
    /// The check passed (or was skipped) and every row's output was finite.
    pub check_passed: bool,
    /// A row per token count.
    pub rows: Vec<BlockRow>,
}

/// The block rows of a run.
#[derive(Debug, Clone, Serialize)]
pub struct BlockReport {
    /// `--seed`.
    pub seed: u64,
    /// Timed samples per row (`--iters`).
    pub iters: usize,
    /// Tokens of each block's check.
    pub check_tokens: usize,
    /// The copy rate the floors use (bytes read + written per second / 1e12).
    pub copy_tb_s: f64,
    /// One entry per layer and precision.
    pub runs: Vec<BlockRun>,
}

impl BlockReport {
    /// Every block's check passed (or was skipped).
    pub fn passed(&self) -> bool {
        self.runs.iter().all(|r| r.check_passed)
    }
}

/// The block rows' table: a row per layer, precision and token count, then a line per block.
pub fn table(report: &BlockReport) -> String {
    let header = ["block", "prec", "check", "T", "experts", "us", "graph_us", "floor_us", "%floor", "floor>=75%"];
    let mut cells: Vec<[String; 10]> = vec![];
    for run in &report.runs {
        let check = match (&run.check, run.check_passed) {
            (None, true) => "skip",
            (_, true) => "PASS",
            (_, false) => "FAIL",
        };
        for r in &run.rows {
            cells.push([
                run.layer.name.to_owned(),
                run.precision.name().to_owned(),
                check.to_owned(),
                r.tokens.to_string(),
                format!("{}/{}", r.touched, run.layer.experts),
                format!("{:.2}", r.us.median),
                format!("{:.2}", r.graph_us.median),
                format!("{:.2}", r.floor_us),
                format!("{:.0}%", 100.0 * r.of_floor),
                target_cell(r.targets.floor).to_owned(),
            ]);
        }
    }
    let mut out = format!(
        "MoE expert block (ExpertBlock::run, bf16 in and out; us: events around one call after an L2 flush, median of {}; graph_us: the call captured in a CUDA graph and replayed, timed likewise; floor = (NVFP4 weights of the distinct experts touched + x and y) / copy {:.2} TB/s; %floor = floor / graph_us; target T <= 64: >= 75% of the floor; PyTorch and unfused columns: python/bench/bench.py --block)\n",
        report.iters, report.copy_tb_s
    );
    out += &aligned(&header, &cells);
    for run in &report.runs {
        let _ = writeln!(
            out,
            "{} {} ({}: {}; {:.2} GB of weights, max_tokens {}, built in {:.1} s): {}",
            run.layer.name,
            run.precision.name(),
            run.layer.model,
            run.spec,
            run.weight_bytes as f64 / 1e9,
            run.max_tokens,
            run.build_s,
            run.check.as_deref().unwrap_or("check skipped (--no-check)")
        );
        for r in run.rows.iter().filter(|r| !r.finite) {
            let _ = writeln!(out, "{} {} T = {}: a non-finite output", run.layer.name, run.precision.name(), r.tokens);
        }
        for r in run.rows.iter().filter(|r| !r.graph_same) {
            let _ = writeln!(
                out,
                "{} {} T = {}: the graph replay's output differs from the direct call's",
                run.layer.name,
                run.precision.name(),
                r.tokens
            );
        }
    }
    let (met, of) = report
        .runs
        .iter()
        .flat_map(|r| &r.rows)
        .filter_map(|r| r.targets.floor)
        .fold((0, 0), |(m, n), ok| (m + usize::from(ok), n + 1));
    let _ = writeln!(out, "targets: floor {met}/{of} rows at >= 75% (T <= 64)");
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use nvfp4_format::moe_block::{reference, Activation, BlockOptions, Dense16, Precision};

    #[test]
    fn layers_and_bytes() {
        let names: Vec<&str> = BLOCK_LAYERS.iter().map(|l| l.name).collect();
        assert_eq!(names, ["ds", "qwen3", "mixtral"]);
        let ds = BlockLayer::named("ds").unwrap();
        assert_eq!((ds.experts, ds.top_k, ds.hidden, ds.intermediate, ds.n1()), (256, 8, 7168, 2048, 4096));
        // W13 4096 x 7168 and W2 7168 x 2048: values K/2 and scales K/16 bytes per row.
        assert_eq!(ds.expert_bytes(), 4096 * 7168 / 2 + 4096 * 448 + 7168 * 1024 + 7168 * 128);
        assert_eq!(ds.expert_bytes(), 24_772_608);
        assert_eq!(ds.weight_bytes(), 6_341_787_648);
        assert_eq!(BlockLayer::named("qwen3").unwrap().expert_bytes(), 2_654_208);
        assert_eq!(BlockLayer::named("qwen3").unwrap().weight_bytes(), 339_738_624);
        let mixtral = BlockLayer::named("mixtral").unwrap();
        assert_eq!((mixtral.experts, mixtral.top_k), (8, 2));
        assert_eq!(mixtral.expert_bytes(), 99_090_432);
        assert!(BlockLayer::named("dsv3").is_none());
        assert_eq!(ds.to_spec(), "e=256,top_k=8,h=7168,i=2048,silu");
        // The floor: the touched experts' weights, x and y in bf16.
        assert_eq!(ds.floor_bytes(1, 8), 8 * 24_772_608 + 2 * 2 * 7168);
        assert_eq!(mixtral.floor_bytes(4096, 8), 8 * 99_090_432 + 2 * 2 * 4096 * 4096);
        // 1 GB at 4 TB/s (read + write bytes per second) is 250 µs.
        assert!((floor_us(1_000_000_000, 4.0) - 250.0).abs() < 1e-9);
        assert_eq!(BlockPrecision::named("w4a16"), Some(BlockPrecision::W4a16));
        assert_eq!(BlockPrecision::named("w4a8"), None);
        assert_eq!(serde_json::to_value(BlockPrecision::W4a4).unwrap(), "w4a4");
    }

    #[test]
    fn routing_is_distinct_normalized_and_seeded() {
        for (tokens, experts, top_k) in [(1, 256, 8), (64, 128, 8), (512, 8, 2), (33, 8, 8)] {
            let r = routing(tokens, experts, top_k, 7);
            assert_eq!((r.ids.len(), r.weights.len(), r.top_k), (tokens * top_k, tokens * top_k, top_k));
            for t in 0..tokens {
                let ids = &r.ids[t * top_k..(t + 1) * top_k];
                assert!(ids.iter().all(|&i| (0..experts as i32).contains(&i)));
                let mut sorted = ids.to_vec();
                sorted.sort_unstable();
                sorted.dedup();
                assert_eq!(sorted.len(), top_k, "token {t}: {ids:?}");
                let w = &r.weights[t * top_k..(t + 1) * top_k];
                assert!(w.iter().all(|&x| x > 0.0 && x < 1.0 || top_k == 1));
                assert!((w.iter().map(|&x| f64::from(x)).sum::<f64>() - 1.0).abs() < 1e-6);
            }
            assert_eq!(r, routing(tokens, experts, top_k, 7));
            assert_ne!(r.ids, routing(tokens, experts, top_k, 8).ids);
        }
        // Every expert of 8 at top-8; the rows of two token counts differ.
        assert_eq!(routing(1, 8, 8, 1).touched(8), 8);
        assert_ne!(routing(8, 256, 8, 1).ids[..8], routing(1, 256, 8, 1).ids[..]);
        // Uniform: over 4096 tokens at top-8 of 256 each expert is chosen ~128 times.
        let r = routing(4096, 256, 8, 3);
        let mut counts = [0usize; 256];
        r.ids.iter().for_each(|&i| counts[i as usize] += 1);
        assert!(counts.iter().all(|&c| (64..=192).contains(&c)), "{counts:?}");
        assert_eq!(r.touched(256), 256);
        let few = BlockRouting { ids: vec![3, -1, 3, 9, 300], weights: vec![0.2; 5], top_k: 1 };
        assert_eq!(few.touched(256), 2);
        assert_eq!(few.reference().ids, [3, -1, 3, 9, 300]);
    }

    #[test]
    fn random_experts_are_valid_and_give_outputs_of_order_one() {
        let (e, h, i) = (4, 128, 64);
        let experts = random_experts(e, h, i, 5);
        assert_eq!(experts.experts.len(), e);
        for (n, x) in experts.experts.iter().enumerate() {
            assert_eq!(x.expert, n);
            assert_eq!((x.w13.rows, x.w13.k, x.w2.rows, x.w2.k), (2 * i, h, h, i));
            assert_eq!((x.w13.values.len(), x.w13.plain_scales.len()), (2 * i * h / 2, 2 * i * h / 16));
            // Finite, positive e4m3 codes: 0.5 (0x30) to 2.0 (0x40).
            for s in x.w13.plain_scales.iter().chain(&x.w2.plain_scales) {
                assert!((0x30..=0x40).contains(s), "{s:#x}");
            }
            assert!(x.w13.to_matrix().is_ok() && x.w2.to_matrix().is_ok());
            assert_eq!(x.w13_input_scale, INPUT_SCALE);
        }
        assert_ne!(experts.experts[0].w13.values, experts.experts[1].w13.values);
        assert_eq!(experts, random_experts(e, h, i, 5));
        // The CPU reference on them: finite, of order 1, the same activations' scale as the bench's.
        let r = routing(3, e, 2, 1).reference();
        let x: Vec<f64> = (0..3 * h).map(|j| if j % 3 == 0 { -1.25 } else { 0.75 }).collect();
        for precision in [Precision::W4a4, Precision::W4a16] {
            let options = BlockOptions::new(Activation::Silu, precision, Dense16::Bf16);
            let y = reference(&x, h, &r, &experts, &options).unwrap();
            let rms = (y.iter().map(|v| v * v).sum::<f64>() / y.len() as f64).sqrt();
            assert!(y.iter().all(|v| v.is_finite()) && (0.05..20.0).contains(&rms), "{precision:?}: rms {rms}");
        }
    }

    #[test]
    fn targets_by_token_count() {
        let t = targets(1, Some(0.8), Some(3.5), Some(0.6));
        assert_eq!(t, Targets { floor: Some(true), torch: Some(true), unfused: Some(true) });
        let t = targets(64, Some(0.74), Some(2.9), Some(0.76));
        assert_eq!(t, Targets { floor: Some(false), torch: Some(false), unfused: Some(false) });
        assert_eq!(targets(512, Some(0.9), Some(5.0), Some(0.5)), Targets::default());
        let t = targets(4096, Some(0.9), Some(1.1), Some(0.5));
        assert_eq!(t, Targets { floor: None, torch: Some(true), unfused: None });
        assert_eq!(targets(4096, None, Some(1.09), None).torch, Some(false));
        assert_eq!(targets(8, Some(0.75), None, None), Targets { floor: Some(true), torch: None, unfused: None });
        assert_eq!((target_cell(Some(true)), target_cell(Some(false)), target_cell(None)), ("pass", "MISS", "-"));
    }

    fn stats(x: f64) -> Stats {
        Stats { median: x, min: x, max: x, mean: x, n: 1 }
    }

    /// Two runs of `qwen3`: W4A4 checked, at T = 1 (80% of the floor) and 4096; W4A16 with a
    /// failed check at T = 1 (50%).
    pub(crate) fn sample() -> BlockReport {
        let layer = BlockLayer::named("qwen3").unwrap();
        let row = |tokens: usize, touched: usize, us: f64| {
            let floor_bytes = layer.floor_bytes(tokens, touched);
            let floor = floor_us(floor_bytes, 4.0);
            BlockRow {
                tokens,
                touched,
                floor_bytes,
                floor_us: floor,
                us: stats(us + 1.0),
                graph_us: stats(us),
                graph_same: true,
                of_floor: floor / us,
                finite: true,
                targets: targets(tokens, Some(floor / us), None, None),
            }
        };
        let floor1 = floor_us(layer.floor_bytes(1, 8), 4.0);
        let run = |precision, check: &str, passed, rows| BlockRun {
            layer,
            spec: layer.to_spec(),
            precision,
            max_tokens: 4096,
            weight_bytes: layer.weight_bytes(),
            build_s: 0.5,
            check: Some(check.into()),
            check_passed: passed,
            rows,
        };
        BlockReport {
            seed: 2222,
            iters: 50,
            check_tokens: CHECK_TOKENS,
            copy_tb_s: 4.0,
            runs: vec![
                run(BlockPrecision::W4a4, "PASS: test", true, vec![row(1, 8, floor1 / 0.8), row(4096, 128, 900.0)]),
                run(BlockPrecision::W4a16, "FAIL: test", false, vec![row(1, 8, floor1 / 0.5)]),
            ],
        }
    }

    #[test]
    fn table_rows_and_json() {
        let r = sample();
        assert!(!r.passed());
        let t = table(&r);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("MoE expert block") && lines[0].contains("median of 50"), "{t}");
        assert!(lines[0].contains("copy 4.00 TB/s"), "{t}");
        let cells = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(
            cells(lines[1]),
            ["block", "prec", "check", "T", "experts", "us", "graph_us", "floor_us", "%floor", "floor>=75%"]
        );
        // qwen3 T = 1: 8 experts' 2,654,208 bytes + 2 x 4096 bytes at 4 TB/s = 5.31 µs.
        assert_eq!(cells(lines[2]), ["qwen3", "w4a4", "PASS", "1", "8/128", "7.64", "6.64", "5.31", "80%", "pass"]);
        assert_eq!(cells(lines[3])[..5], ["qwen3", "w4a4", "PASS", "4096", "128/128"]);
        assert_eq!(cells(lines[3])[9], "-");
        assert_eq!(cells(lines[4]), ["qwen3", "w4a16", "FAIL", "1", "8/128", "11.62", "10.62", "5.31", "50%", "MISS"]);
        assert!(lines[1..5].iter().all(|l| l.len() == lines[1].len()), "{t}");
        assert!(lines[5].starts_with("qwen3 w4a4 (Qwen3-30B-A3B: e=128,top_k=8,h=2048,i=768,silu; 0.34 GB"), "{t}");
        assert!(lines[5].ends_with("built in 0.5 s): PASS: test"), "{t}");
        assert!(lines[6].starts_with("qwen3 w4a16") && lines[6].ends_with("FAIL: test"), "{t}");
        assert_eq!(lines[7], "targets: floor 1/2 rows at >= 75% (T <= 64)");
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["runs"][0]["layer"]["name"], "qwen3");
        assert_eq!(v["runs"][0]["precision"], "w4a4");
        assert_eq!(v["runs"][0]["rows"][0]["floor_bytes"], 2_654_208u64 * 8 + 8192);
        assert_eq!(v["runs"][0]["rows"][0]["targets"]["floor"], true);
        assert_eq!(v["runs"][0]["rows"][0]["targets"]["torch"], serde_json::Value::Null);
        assert_eq!(v["runs"][1]["rows"][0]["graph_us"]["median"], floor_us(2_654_208 * 8 + 8192, 4.0) / 0.5);
        assert_eq!(v["runs"][1]["rows"][0]["graph_same"], true);
    }
}
