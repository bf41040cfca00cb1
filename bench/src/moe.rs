//! The mixture-of-experts rows (`--moe`): shapes with many experts and few tokens each, their
//! seeded routings, the bf16 activations the rows quantize on the GPU, what a row found, its table,
//! and the routing file / PyTorch JSON exchanged with `torch_moe.py`. Pure: runs on any machine
//! (the GPU half is [`crate::measure`]'s `Bench::moe_shape`).

use crate::stats::Stats;
use half::bf16;
use nvfp4_format::SplitMix64;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;

/// The default MoE set, by name and spec: DeepSeek-V3-sized expert projections (hidden 7168,
/// expert width 2048: the down projection is N = 7168, K = 2048; gate and up together N = 4096,
/// K = 7168) with 64 or 256 experts and a decode-sized routing.
pub const MOE_SHAPES: [(&str, &str); 4] = [
    ("m0", "e=64,t=1-16,n=7168,k=2048"),
    ("m1", "e=256,t=1-8,n=7168,k=2048"),
    ("m2", "e=64,t=1-16,n=4096,k=7168"),
    ("m3", "e=256,t=1-8,n=4096,k=7168"),
];

/// The decode shapes d0..d2 as MoE rows (`--moe-shapes d0,d1,d2`): the same experts, N and K,
/// the tokens routed as a MoE row routes them (d1: 1 to 8 tokens per expert, drawn).
pub const DECODE_MOE_SHAPES: [(&str, &str); 3] =
    [("d0", "e=64,t=4,n=7168,k=2048"), ("d1", "e=8,t=1-8,n=7168,k=2048"), ("d2", "e=32,t=16,n=4096,k=7168")];

/// Prefill-sized MoE rows (`--moe-shapes p0,p1,p2,p3`): a few to a few hundred tokens per expert,
/// where a device-sized plan runs the general kernel (the decode kernel finding no work).
pub const PREFILL_MOE_SHAPES: [(&str, &str); 4] = [
    ("p0", "e=8,t=64-248,n=4096,k=7168"),
    ("p1", "e=8,t=40-196,n=7168,k=2048"),
    ("p2", "e=64,t=32-128,n=7168,k=2048"),
    ("p3", "e=32,t=100-300,n=4096,k=7168"),
];

/// Most experts of a MoE shape (the library's `moe::MAX_GROUPS`).
pub const MAX_EXPERTS: usize = 4096;

/// One MoE problem: `experts` experts of the same `n x k` weights, each receiving a number of
/// tokens drawn uniformly from `tokens.0 ..= tokens.1` (seeded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MoeShape {
    /// Label.
    pub name: String,
    /// Experts (groups).
    pub experts: usize,
    /// Tokens per expert, lowest and highest (inclusive).
    pub tokens: (usize, usize),
    /// Weights per expert (columns of C).
    pub n: usize,
    /// Reduction length.
    pub k: usize,
}

impl MoeShape {
    /// A shape of the default set by name (`m0`..`m3`), a decode shape (`d0`..`d2`) or a
    /// prefill-sized one (`p0`..`p3`).
    pub fn named(name: &str) -> Option<MoeShape> {
        let (name, text) =
            MOE_SHAPES.iter().chain(&DECODE_MOE_SHAPES).chain(&PREFILL_MOE_SHAPES).find(|(n, _)| *n == name)?;
        let mut s = MoeShape::parse(text).expect("the default MoE specs are valid");
        s.name = (*name).to_owned();
        Some(s)
    }

    /// The default set, in order.
    pub fn defaults() -> Vec<MoeShape> {
        MOE_SHAPES.iter().map(|(n, _)| MoeShape::named(n).expect("a default name")).collect()
    }

    /// Parses `e=64,t=1-16,n=7168,k=2048[,name=x]` (`t`: one count, or `lo-hi`). Without a name,
    /// the shape is called `custom`.
    pub fn parse(spec: &str) -> Result<MoeShape, String> {
        let (mut e, mut t, mut n, mut k, mut name) = (None, None, None, None, None);
        for item in spec.split(',') {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| format!("MoE spec `{spec}`: `{item}` is not key=value (keys e, t, n, k, name)"))?;
            let (key, value) = (key.trim(), value.trim());
            let int = |v: &str| -> Result<usize, String> {
                v.parse().map_err(|_| format!("MoE spec `{spec}`: {key}={v} is not a whole number"))
            };
            match key {
                "e" => e = Some(int(value)?),
                "t" => {
                    t = Some(match value.split_once('-') {
                        Some((lo, hi)) => (int(lo)?, int(hi)?),
                        None => (int(value)?, int(value)?),
                    })
                }
                "n" => n = Some(int(value)?),
                "k" => k = Some(int(value)?),
                "name" if !value.is_empty() => name = Some(value.to_owned()),
                _ => return Err(format!("MoE spec `{spec}`: unknown key `{key}` (e, t, n, k, name)")),
            }
        }
        let missing = |what: &str| format!("MoE spec `{spec}`: missing {what}");
        let s = MoeShape {
            name: name.unwrap_or_else(|| "custom".into()),
            experts: e.ok_or_else(|| missing("e (experts)"))?,
            tokens: t.ok_or_else(|| missing("t (tokens per expert)"))?,
            n: n.ok_or_else(|| missing("n"))?,
            k: k.ok_or_else(|| missing("k"))?,
        };
        s.validate().map_err(|e| format!("MoE spec `{spec}`: {e}"))?;
        Ok(s)
    }

    fn validate(&self) -> Result<(), String> {
        if self.experts == 0 || self.experts > MAX_EXPERTS {
            return Err(format!("{} experts; 1 to {MAX_EXPERTS} are supported", self.experts));
        }
        let (lo, hi) = self.tokens;
        if lo > hi || hi == 0 || hi > 4096 {
            return Err(format!("tokens {lo}-{hi}: need lo <= hi, 1 <= hi <= 4096"));
        }
        if self.n == 0 || self.n % 8 != 0 || self.n > 1 << 16 {
            return Err(format!("n = {} is not a positive multiple of 8 up to 65536", self.n));
        }
        if self.k == 0 || self.k % 64 != 0 || self.k > 1 << 16 {
            return Err(format!("k = {} is not a positive multiple of 64 up to 65536", self.k));
        }
        Ok(())
    }

    /// The spec that [`MoeShape::parse`] reads back (without the name).
    pub fn to_spec(&self) -> String {
        let (lo, hi) = self.tokens;
        let t = if lo == hi { lo.to_string() } else { format!("{lo}-{hi}") };
        format!("e={},t={t},n={},k={}", self.experts, self.n, self.k)
    }

    /// Tokens per expert for `seed`: expert `e` gets `lo + below(hi - lo + 1)` from one
    /// SplitMix64 stream seeded with `seed ^ ROUTING_SALT`, drawn in expert order. The same seed
    /// gives the same routing on every machine (and in `torch_moe.py`, which reads it from the
    /// routing file rather than drawing it again).
    pub fn routing(&self, seed: u64) -> Vec<u32> {
        let mut rng = SplitMix64::new(seed ^ ROUTING_SALT);
        let (lo, hi) = self.tokens;
        (0..self.experts).map(|_| (lo as u64 + rng.below((hi - lo + 1) as u64)) as u32).collect()
    }

    /// Bytes of all experts' NVFP4 weights: packed values and blocked scales (padding included).
    pub fn weight_bytes(&self) -> f64 {
        let scales = self.n.div_ceil(128) * 128 * self.k.div_ceil(64) * 4;
        (self.experts * (self.n * self.k / 2 + scales)) as f64
    }
}

/// Mixed into the seed of the routings, so that they do not repeat the operands' streams.
pub const ROUTING_SALT: u64 = 0x4D6F_4552_6F75_7465;

/// Offsets `0, c0, c0 + c1, ...` (`counts.len() + 1` entries): the contiguous layout's sizes.
pub fn offsets_of(counts: &[u32]) -> Vec<u32> {
    let mut o = Vec::with_capacity(counts.len() + 1);
    o.push(0u32);
    for c in counts {
        o.push(o[o.len() - 1] + c);
    }
    o
}

/// `rows x k` bf16 activations that NVFP4 represents exactly with the global scale 1: in each
/// block of 16, a power-of-two scale `s` in {1/4, 1/2, 1}, values `±code · s` for random e2m1
/// magnitudes (0 … 6), and one value `±6 · s` so that the block's amax (hence its e4m3 scale) is
/// exactly `6 · s`. The quantizer then gives back exactly these codes and scales, and with the
/// competition's weights every partial sum of the GEMM is exact in fp32 (multiples of 2⁻⁴ below
/// 2¹⁷ for K ≤ 7168), so the checks are exact, as for the other rows. Rows are drawn in parallel,
/// row `r` from its own stream (`seed`, `r`).
pub fn exact_activations(rows: usize, k: usize, seed: u64) -> Vec<bf16> {
    const MAGNITUDES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let mut out = vec![bf16::ZERO; rows * k];
    out.par_chunks_mut(k.max(1)).enumerate().for_each(|(r, row)| {
        let mut rng = SplitMix64::new(seed ^ (r as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        for block in row.chunks_mut(16) {
            let (bits, signs) = (rng.next_u64(), rng.next_u64());
            let scale = [0.25f32, 0.5, 1.0][(bits % 3) as usize];
            let top = ((bits >> 2) & 15) as usize;
            for (i, v) in block.iter_mut().enumerate() {
                let code = if i == top { 7 } else { ((bits >> (6 + 3 * i)) & 7) as usize };
                let x = MAGNITUDES[code] * scale;
                *v = bf16::from_f32(if signs >> i & 1 == 1 { -x } else { x });
            }
        }
    });
    out
}

/// One routing for the PyTorch script: the shape and its tokens per expert.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Routing {
    /// The shape's name.
    pub name: String,
    /// Its spec.
    pub spec: String,
    /// Experts.
    pub experts: usize,
    /// Weights per expert.
    pub n: usize,
    /// Reduction length.
    pub k: usize,
    /// Tokens per expert (expert order; the tokens are sorted by expert).
    pub counts: Vec<u32>,
}

/// The routing file (`moe-routing.json`) `torch_moe.py` reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutingFile {
    /// The seed the routings were drawn with.
    pub seed: u64,
    /// One per MoE shape.
    pub shapes: Vec<Routing>,
}

impl RoutingFile {
    /// The routings of `shapes` for `seed`.
    pub fn new(shapes: &[MoeShape], seed: u64) -> RoutingFile {
        let shapes = shapes
            .iter()
            .map(|s| Routing {
                name: s.name.clone(),
                spec: s.to_spec(),
                experts: s.experts,
                n: s.n,
                k: s.k,
                counts: s.routing(seed),
            })
            .collect();
        RoutingFile { seed, shapes }
    }

    /// Writes it as JSON.
    pub fn write(&self, path: &Path) -> Result<(), String> {
        let text = serde_json::to_string_pretty(self).map_err(|e| format!("encoding the routing: {e}"))?;
        std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// PyTorch's best time for one MoE routing, from `torch_moe.py`'s JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TorchRow {
    /// The fastest path (`grouped_mm`, `grouped_mm+graph`, `loop`, `loop+graph`).
    pub path: String,
    /// Its median µs.
    pub us: f64,
}

/// What `torch_moe.py` found (its JSON, kept whole in the report), or why there is none.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TorchBaseline {
    /// `torch-moe.json` as written by the script; `None` when unavailable.
    pub json: Option<serde_json::Value>,
    /// `loaded from PATH` or `unavailable: <why>`.
    pub note: String,
}

impl TorchBaseline {
    /// An unavailable baseline.
    pub fn unavailable(why: impl Into<String>) -> TorchBaseline {
        TorchBaseline { json: None, note: format!("unavailable: {}", why.into()) }
    }

    /// Parses the script's JSON (`text`), read from `from`. A JSON with an `unavailable` field
    /// (the script found no torch or no GPU) gives an unavailable baseline with its reason.
    pub fn parse(text: &str, from: &str) -> TorchBaseline {
        match serde_json::from_str::<serde_json::Value>(text) {
            Err(e) => TorchBaseline::unavailable(format!("{from}: not JSON: {e}")),
            Ok(v) => match v.get("unavailable").and_then(|u| u.as_str()) {
                Some(why) => TorchBaseline::unavailable(why.to_owned()),
                None => TorchBaseline { json: Some(v), note: format!("loaded from {from}") },
            },
        }
    }

    /// The best PyTorch time for `routing` (matched by name, sizes and tokens per expert), or why
    /// there is none.
    pub fn row(&self, routing: &Routing) -> Result<TorchRow, String> {
        let Some(json) = &self.json else { return Err(format!("PyTorch baseline {}", self.note)) };
        let shapes = json.get("shapes").and_then(|s| s.as_array()).ok_or("the PyTorch JSON has no `shapes`")?;
        let shape = shapes
            .iter()
            .find(|s| s.get("name").and_then(|n| n.as_str()) == Some(routing.name.as_str()))
            .ok_or_else(|| format!("no PyTorch row named {}", routing.name))?;
        let same = |key: &str, want: usize| shape.get(key).and_then(|v| v.as_u64()) == Some(want as u64);
        let counts: Option<Vec<u32>> = shape
            .get("counts")
            .and_then(|c| c.as_array())
            .map(|c| c.iter().map(|x| x.as_u64().unwrap_or(u64::MAX) as u32).collect());
        if !(same("experts", routing.experts) && same("n", routing.n) && same("k", routing.k))
            || counts.as_deref() != Some(&routing.counts[..])
        {
            return Err(format!("the PyTorch row {} has another shape or routing (another seed?)", routing.name));
        }
        if let Some(e) = shape.get("error").and_then(|e| e.as_str()) {
            return Err(format!("PyTorch failed: {e}"));
        }
        let path = shape.get("best").and_then(|b| b.as_str()).ok_or("the PyTorch row has no `best` path")?;
        let us = shape.get("best_us").and_then(|b| b.as_f64()).ok_or("the PyTorch row has no `best_us`")?;
        Ok(TorchRow { path: path.to_owned(), us })
    }
}

/// One MoE row. Times in µs (medians of L2-flushed, event-timed calls).
#[derive(Debug, Clone, Serialize)]
pub struct MoeResult {
    /// Label.
    pub name: String,
    /// The shape's spec.
    pub spec: String,
    /// Experts.
    pub experts: usize,
    /// Weights per expert.
    pub n: usize,
    /// Reduction length.
    pub k: usize,
    /// Tokens in all (`T`, the plan's bound).
    pub tokens: usize,
    /// Tokens per expert.
    pub counts: Vec<u32>,
    /// NVFP4 weight bytes (values + blocked scales of all experts).
    pub weight_bytes: f64,
    /// 2·T·N·K.
    pub flops: f64,
    /// The host-sized plan's kernel.
    pub plan_kernel: String,
    /// The MoE plan's kernel (the first of `variants`).
    pub moe_kernel: String,
    /// The three checks against the CPU reference and the MoE plan's status word; `None` when
    /// skipped.
    pub check: Option<String>,
    /// All passed (`true` when skipped).
    pub check_passed: bool,
    /// (a) `quantize_grouped` + `GemmPlan::run` (sizes known on the host).
    pub plan_us: Stats,
    /// (b) `quantize_grouped` + `MoePlan::run` (sizes read on the device), the first of
    /// `variants`.
    pub moe_us: Stats,
    /// (c) replay of a CUDA graph holding (b), the first of `variants`.
    pub graph_us: Stats,
    /// (b) and (c) for every `MoePlan` option timed (`--moe-kernels`), in order.
    pub variants: Vec<MoeVariant>,
    /// Host time per call of (a), (b), (c): CPU clock, no synchronisation inside a batch.
    pub host_us: [Stats; 3],
    /// Sets of activations, offsets, NVFP4 tokens and C the new-tensor measurements rotate over
    /// (`max(16, --sets)`).
    pub rotating_sets: usize,
    /// (b) timed as `moe_us` (events around one `quantize_grouped` + `MoePlan::run` after an L2
    /// flush, alternated with it), but on the next rotating set every call (the weights fixed).
    pub moe_new_us: Stats,
    /// Host time per call of (b), the rotating sets in turn.
    pub host_new_us: Stats,
    /// W4A16 on the same routing (`--w4a16`): f16, then bf16 activations; empty when not timed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub w4a16: Vec<MoeW4a16>,
    /// PyTorch's best option for the same routing, when there is one.
    pub torch: Option<TorchRow>,
    /// Why there is no PyTorch time, or empty.
    pub torch_note: String,
}

impl MoeResult {
    /// The routing this row ran.
    pub fn routing(&self) -> Routing {
        Routing {
            name: self.name.clone(),
            spec: self.spec.clone(),
            experts: self.experts,
            n: self.n,
            k: self.k,
            counts: self.counts.clone(),
        }
    }

    /// NVFP4 weight bytes per second / 1e12 at `us`.
    pub fn tb_s(&self, us: f64) -> f64 {
        self.weight_bytes / us / 1e6
    }

    /// PyTorch's best time over `us` (above 1: faster than PyTorch).
    pub fn x_torch(&self, us: f64) -> Option<f64> {
        self.torch.as_ref().map(|t| t.us / us)
    }
}

/// One `MoePlan` option of a MoE row (`--moe-kernels`).
#[derive(Debug, Clone, Serialize)]
pub struct MoeVariant {
    /// The option's name (`auto`, `decode`, ...).
    pub name: String,
    /// The plan's kernels.
    pub kernel: String,
    /// (b) with this option.
    pub moe_us: Stats,
    /// (c) with this option.
    pub graph_us: Stats,
}

/// W4A16 on a MoE row (`--w4a16`): the same activations as f16 or bf16 `[T, K]`, read as they
/// are, the same experts' weights prepacked for them, through a `MoePlan` of a W4A16 problem
/// with the first `--moe-kernels` option (no quantization: the call is the scheduler and the
/// GEMMs).
#[derive(Debug, Clone, Serialize)]
pub struct MoeW4a16 {
    /// The activations' type: `f16` or `bf16`.
    pub activations: String,
    /// The plan's kernels.
    pub kernel: String,
    /// The call and its graph replay against the CPU reference, and the status word; `None`
    /// when skipped.
    pub check: Option<String>,
    /// The host-sized `GemmPlan` of the same W4A16 groups (sizes known on the host; each
    /// expert's rows of the activations, C of its own), same buffers every call.
    pub plan_us: Stats,
    /// `MoePlan::run` (sizes read on the device), same buffers every call.
    pub moe_us: Stats,
    /// Replay of a CUDA graph holding it.
    pub graph_us: Stats,
    /// Timed as `moe_us` (alternated with it), but on the next of the row's rotating sets of
    /// activations, offsets and C every call: the plan's tables hold the activations' addresses,
    /// so each call uploads them.
    pub moe_new_us: Stats,
    /// Host time per call, same buffers.
    pub host_cached_us: Stats,
    /// Host time per call, the rotating sets in turn.
    pub host_new_us: Stats,
}

/// The MoE part of the report (only present with `--moe`).
#[derive(Debug, Clone, Serialize)]
pub struct MoeReport {
    /// The seed of the routings and activations.
    pub seed: u64,
    /// The PyTorch baseline (`torch_moe.py`'s JSON, whole) or why there is none.
    pub torch: TorchBaseline,
    /// One entry per MoE shape.
    pub shapes: Vec<MoeResult>,
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "n/a".to_owned(), |x| format!("{x:.prec$}"))
}

/// The MoE table (`bench/README.md`, "MoE rows", for the columns), then one line per row.
pub fn table(moe: &MoeReport) -> String {
    let header = [
        "moe",
        "check",
        "tokens",
        "plan_us",
        "plan_TB/s",
        "moe_us",
        "moe_TB/s",
        "graph_us",
        "graph_TB/s",
        "torch_us",
        "x_plan",
        "x_moe",
        "x_graph",
    ];
    let rows: Vec<Vec<String>> = moe
        .shapes
        .iter()
        .map(|s| {
            let (a, b, c) = (s.plan_us.median, s.moe_us.median, s.graph_us.median);
            vec![
                s.name.clone(),
                match (&s.check, s.check_passed) {
                    (None, _) => "skip".into(),
                    (Some(_), true) => "PASS".into(),
                    (Some(_), false) => "FAIL".into(),
                },
                s.tokens.to_string(),
                format!("{a:.2}"),
                format!("{:.3}", s.tb_s(a)),
                format!("{b:.2}"),
                format!("{:.3}", s.tb_s(b)),
                format!("{c:.2}"),
                format!("{:.3}", s.tb_s(c)),
                opt(s.torch.as_ref().map(|t| t.us), 2),
                opt(s.x_torch(a), 2),
                opt(s.x_torch(b), 2),
                opt(s.x_torch(c), 2),
            ]
        })
        .collect();
    let mut out = format!("PyTorch baseline (torch_moe.py): {}\n", moe.torch.note);
    out += &crate::report::aligned(&header, &rows);
    for s in &moe.shapes {
        let torch = match &s.torch {
            Some(t) => format!("PyTorch {} {:.2} us", t.path, t.us),
            None => format!("PyTorch: {}", s.torch_note),
        };
        let _ = writeln!(
            out,
            "{}: {} ({} tokens) | host per call: plan {:.2} us, moe {:.2} us, graph {:.2} us | {torch}",
            s.name, s.spec, s.tokens, s.host_us[0].median, s.host_us[1].median, s.host_us[2].median
        );
        for w in &s.w4a16 {
            let (b, c) = (w.moe_us.median, w.graph_us.median);
            let _ = writeln!(
                out,
                "{} w4a16 ({} activations, no quantization): moe {b:.2} us ({:.3} x W4A16 plan, {:.3} x W4A4 moe, {} x PyTorch), graph {c:.2} us ({:.3} x W4A4 graph, {} x PyTorch) | {}",
                s.name,
                w.activations,
                b / w.plan_us.median,
                b / s.moe_us.median,
                opt(s.x_torch(b), 2),
                c / s.graph_us.median,
                opt(s.x_torch(c), 2),
                w.check.as_deref().unwrap_or("check skipped")
            );
        }
        for v in &s.variants {
            let (b, c) = (v.moe_us.median, v.graph_us.median);
            let _ = writeln!(
                out,
                "{} --moe-kernels {}: moe {b:.2} us ({:.3} x plan), graph {c:.2} us ({:.3} x plan)",
                s.name,
                v.name,
                b / s.plan_us.median,
                c / s.plan_us.median
            );
        }
    }
    if !moe.shapes.is_empty() {
        out.push('\n');
        out += &new_tensor_table(moe);
    }
    out
}

/// The MoE layer with new tensors every call (bench/README.md, "MoE rows"): a row per MoE row and
/// call (`w4a4`: `quantize_grouped` + `MoePlan::run`; each W4A16 type: `MoePlan::run`), its time
/// on the same buffers every call, the same call on the next rotating set every call, their
/// ratio, and the host time per call with the same and with new tensors.
fn new_tensor_table(moe: &MoeReport) -> String {
    let header = ["moe", "call", "moe_us", "new_us", "new/moe", "host_us", "host_new_us"];
    let row = |name: &str, call: String, same: &Stats, new: &Stats, host: &Stats, host_new: &Stats| {
        vec![
            name.to_owned(),
            call,
            format!("{:.2}", same.median),
            format!("{:.2}", new.median),
            format!("{:.3}", new.median / same.median),
            format!("{:.2}", host.median),
            format!("{:.2}", host_new.median),
        ]
    };
    let mut rows = vec![];
    for s in &moe.shapes {
        rows.push(row(&s.name, "w4a4".into(), &s.moe_us, &s.moe_new_us, &s.host_us[1], &s.host_new_us));
        for w in &s.w4a16 {
            let call = format!("w4a16 {}", w.activations);
            rows.push(row(&s.name, call, &w.moe_us, &w.moe_new_us, &w.host_cached_us, &w.host_new_us));
        }
    }
    let sets = moe.shapes.first().map_or(0, |s| s.rotating_sets);
    let mut out = format!(
        "MoE layer with new tensors every call ({sets} sets in turn of the activations, offsets, C and for w4a4 the NVFP4 tokens; weights fixed): new_us timed as moe_us (events around one call after an L2 flush, median), host_us / host_new_us = host time per call, same / new tensors\n"
    );
    out += &crate::report::aligned_left(&header, &rows, 2);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_shapes_and_specs() {
        let d = MoeShape::defaults();
        let names: Vec<&str> = d.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["m0", "m1", "m2", "m3"]);
        assert_eq!((d[0].experts, d[0].tokens, d[0].n, d[0].k), (64, (1, 16), 7168, 2048));
        assert_eq!((d[1].experts, d[1].tokens, d[1].n, d[1].k), (256, (1, 8), 7168, 2048));
        assert_eq!((d[2].experts, d[2].tokens, d[2].n, d[2].k), (64, (1, 16), 4096, 7168));
        assert_eq!((d[3].experts, d[3].tokens, d[3].n, d[3].k), (256, (1, 8), 4096, 7168));
        for s in &d {
            let mut back = MoeShape::parse(&s.to_spec()).unwrap();
            back.name = s.name.clone();
            assert_eq!(&back, s);
        }
        assert_eq!(MoeShape::named("m4"), None);
        let d0 = MoeShape::named("d0").unwrap();
        assert_eq!((d0.name.as_str(), d0.experts, d0.tokens, d0.n, d0.k), ("d0", 64, (4, 4), 7168, 2048));
        assert_eq!(MoeShape::named("d2").unwrap().to_spec(), "e=32,t=16,n=4096,k=7168");
        let p1 = MoeShape::named("p1").unwrap();
        assert_eq!((p1.name.as_str(), p1.experts, p1.tokens, p1.n, p1.k), ("p1", 8, (40, 196), 7168, 2048));
        // 64 experts of 7168 x 2048: values 7168 * 1024 bytes, scales 7168 * 128.
        assert_eq!(d[0].weight_bytes(), (64 * (7168 * 1024 + 7168 * 128)) as f64);
    }

    #[test]
    fn parse_custom_and_errors() {
        let s = MoeShape::parse("e=8, t=3, n=256, k=128, name=tiny").unwrap();
        assert_eq!((s.name.as_str(), s.experts, s.tokens, s.n, s.k), ("tiny", 8, (3, 3), 256, 128));
        assert_eq!(s.to_spec(), "e=8,t=3,n=256,k=128");
        assert_eq!(MoeShape::parse("e=2,t=0-4,n=8,k=64").unwrap().name, "custom");
        let err = |spec: &str| MoeShape::parse(spec).unwrap_err();
        assert!(err("e=2,t=1,n=8").contains("missing k"));
        assert!(err("e=2,n=8,k=64").contains("missing t"));
        assert!(err("e=0,t=1,n=8,k=64").contains("0 experts"));
        assert!(err("e=5000,t=1,n=8,k=64").contains("1 to 4096"));
        assert!(err("e=2,t=5-4,n=8,k=64").contains("lo <= hi"));
        assert!(err("e=2,t=0,n=8,k=64").contains("1 <= hi"));
        assert!(err("e=2,t=1,n=12,k=64").contains("multiple of 8"));
        assert!(err("e=2,t=1,n=8,k=100").contains("multiple of 64"));
        assert!(err("e=2,t=x,n=8,k=64").contains("not a whole number"));
        assert!(err("e=2,t=1,n=8,k=64,m=3").contains("unknown key `m`"));
        assert!(err("e=2,t").contains("`t` is not key=value"));
    }

    #[test]
    fn routing_is_seeded_uniform_and_in_range() {
        let s = MoeShape::named("m0").unwrap();
        let r = s.routing(2222);
        assert_eq!(r.len(), 64);
        assert!(r.iter().all(|&c| (1..=16).contains(&c)));
        assert_eq!(r, s.routing(2222), "deterministic");
        assert_ne!(r, s.routing(2223), "seeded");
        // The first draws, pinned: the routing file and the JSON depend on them.
        let mut rng = SplitMix64::new(2222 ^ ROUTING_SALT);
        let first: Vec<u32> = (0..4).map(|_| 1 + rng.below(16) as u32).collect();
        assert_eq!(r[..4], first[..]);
        // Roughly uniform over many experts.
        let big = MoeShape { experts: 4096, ..MoeShape::named("m1").unwrap() }.routing(7);
        let mut hist = [0usize; 9];
        big.iter().for_each(|&c| hist[c as usize] += 1);
        assert_eq!(hist[0], 0);
        assert!(hist[1..].iter().all(|&h| (400..630).contains(&h)), "{hist:?}");
        // A fixed count, and empty experts allowed with lo = 0.
        assert!(MoeShape::parse("e=9,t=4,n=8,k=64").unwrap().routing(1).iter().all(|&c| c == 4));
        let zeros = MoeShape::parse("e=200,t=0-1,n=8,k=64").unwrap().routing(1);
        assert!(zeros.contains(&0) && zeros.contains(&1));
        assert_eq!(offsets_of(&[3, 0, 2]), [0, 3, 3, 5]);
        assert_eq!(offsets_of(&[]), [0]);
    }

    #[test]
    fn activations_quantize_exactly() {
        let (rows, k) = (5, 256);
        let x = exact_activations(rows, k, 11);
        assert_eq!(x, exact_activations(rows, k, 11));
        let m = nvfp4_format::quantize_with_global_scale(&x, rows, k, 1.0).unwrap();
        let back = m.dequantize();
        for (i, (a, b)) in x.iter().zip(&back).enumerate() {
            assert_eq!(a.to_f32(), *b, "element {i}");
        }
        // Every block reaches its top value 6·s with s a power of two in {1/4, 1/2, 1}.
        for block in x.chunks(16) {
            let amax = block.iter().fold(0.0f32, |m, v| m.max(v.to_f32().abs()));
            assert!([1.5, 3.0, 6.0].contains(&amax), "{amax}");
        }
        let negative = x.iter().filter(|v| v.to_f32() < 0.0).count();
        assert!(negative > rows * k / 4 && negative < rows * k * 3 / 4, "{negative}");
    }

    fn stats(x: f64) -> Stats {
        Stats { median: x, min: x, max: x, mean: x, n: 1 }
    }

    fn sample_result(torch: Option<TorchRow>) -> MoeResult {
        let s = MoeShape::parse("e=2,t=1-3,n=256,k=128,name=tiny").unwrap();
        MoeResult {
            name: s.name.clone(),
            spec: s.to_spec(),
            experts: 2,
            n: 256,
            k: 128,
            tokens: 4,
            counts: vec![1, 3],
            weight_bytes: 2e6,
            flops: 2.0 * 4.0 * 256.0 * 128.0,
            plan_kernel: "sm90".into(),
            moe_kernel: "sm90 device sizes".into(),
            check: Some("PASS".into()),
            check_passed: true,
            plan_us: stats(20.0),
            moe_us: stats(10.0),
            graph_us: stats(8.0),
            variants: vec![MoeVariant {
                name: "auto".into(),
                kernel: "sm90 device sizes".into(),
                moe_us: stats(10.0),
                graph_us: stats(8.0),
            }],
            host_us: [stats(5.0), stats(3.0), stats(2.0)],
            rotating_sets: 16,
            moe_new_us: stats(10.5),
            host_new_us: stats(3.5),
            w4a16: vec![],
            torch,
            torch_note: String::new(),
        }
    }

    #[test]
    fn torch_json_rows_match_by_routing() {
        let r = sample_result(None).routing();
        let json = r#"{"tool": "torch_moe.py", "shapes": [
            {"name": "tiny", "experts": 2, "n": 256, "k": 128, "counts": [1, 3],
             "best": "grouped_mm+graph", "best_us": 16.0},
            {"name": "other", "experts": 2, "n": 256, "k": 128, "counts": [1, 3], "error": "boom"}]}"#;
        let t = TorchBaseline::parse(json, "x.json");
        assert_eq!(t.note, "loaded from x.json");
        assert_eq!(t.row(&r).unwrap(), TorchRow { path: "grouped_mm+graph".into(), us: 16.0 });
        let other = Routing { counts: vec![2, 2], ..r.clone() };
        assert!(t.row(&other).unwrap_err().contains("another shape or routing"));
        let missing = Routing { name: "nope".into(), ..r.clone() };
        assert!(t.row(&missing).unwrap_err().contains("no PyTorch row named nope"));
        let failed = Routing { name: "other".into(), ..r.clone() };
        assert!(t.row(&failed).unwrap_err().contains("boom"));
        let none = TorchBaseline::parse(r#"{"unavailable": "no module named torch"}"#, "x.json");
        assert_eq!(none.note, "unavailable: no module named torch");
        assert!(none.row(&r).unwrap_err().contains("no module named torch"));
        assert!(TorchBaseline::parse("{", "x.json").note.starts_with("unavailable: x.json: not JSON"));
    }

    #[test]
    fn table_rows_and_ratios() {
        let with = sample_result(Some(TorchRow { path: "grouped_mm".into(), us: 16.0 }));
        assert_eq!(with.x_torch(8.0), Some(2.0));
        assert_eq!(with.tb_s(8.0), 2e6 / 8.0 / 1e6);
        let report = MoeReport {
            seed: 1,
            torch: TorchBaseline { json: None, note: "loaded from t.json".into() },
            shapes: vec![with, MoeResult { torch_note: "unavailable: no torch".into(), ..sample_result(None) }],
        };
        let mut w4a16 = report.clone();
        w4a16.shapes[0].w4a16 = vec![MoeW4a16 {
            activations: "bf16".into(),
            kernel: "w".into(),
            check: Some("PASS".into()),
            plan_us: stats(4.0),
            moe_us: stats(5.0),
            graph_us: stats(4.0),
            moe_new_us: stats(5.1),
            host_cached_us: stats(2.5),
            host_new_us: stats(4.5),
        }];
        let text = table(&w4a16);
        let line = text.lines().find(|l| l.starts_with("tiny w4a16")).expect("a W4A16 line");
        assert_eq!(
            line,
            "tiny w4a16 (bf16 activations, no quantization): moe 5.00 us (1.250 x W4A16 plan, 0.500 x W4A4 moe, 3.20 x PyTorch), \
             graph 4.00 us (0.500 x W4A4 graph, 4.00 x PyTorch) | PASS"
        );
        let v = serde_json::to_value(&w4a16).unwrap();
        assert_eq!(v["shapes"][0]["w4a16"][0]["moe_us"]["median"], 5.0);
        assert_eq!(v["shapes"][0]["w4a16"][0]["moe_new_us"]["median"], 5.1);
        assert_eq!(v["shapes"][0]["w4a16"][0]["host_cached_us"]["median"], 2.5);
        assert_eq!(v["shapes"][0]["w4a16"][0]["host_new_us"]["median"], 4.5);
        // The new-tensor table: a row per MoE row and call.
        let new: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("MoE layer with new tensors")).collect();
        assert!(new[0].starts_with("MoE layer with new tensors every call (16 sets in turn"), "{text}");
        assert!(new[1].starts_with("moe   call") && new[1].ends_with("new/moe  host_us  host_new_us"), "{text}");
        let cells = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(cells(new[2]), ["tiny", "w4a4", "10.00", "10.50", "1.050", "3.00", "3.50"]);
        assert_eq!(cells(new[3]), ["tiny", "w4a16", "bf16", "5.00", "5.10", "1.020", "2.50", "4.50"]);
        assert_eq!(cells(new[4])[..2], ["tiny", "w4a4"]);
        assert_eq!(new.len(), 5);
        assert!(new[1..].iter().all(|l| l.len() == new[1].len()));
        let text = table(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "PyTorch baseline (torch_moe.py): loaded from t.json");
        assert!(lines[1].starts_with("moe") && lines[1].ends_with("x_graph"));
        assert!(lines[2].starts_with("tiny") && lines[2].ends_with("2.00") && lines[2].contains("0.80"));
        assert!(lines[3].ends_with("n/a"));
        assert_eq!(lines[1].len(), lines[2].len());
        assert!(lines[4].contains("PyTorch grouped_mm 16.00 us") && lines[4].contains("graph 2.00 us"));
        assert_eq!(lines[5], "tiny --moe-kernels auto: moe 10.00 us (0.500 x plan), graph 8.00 us (0.400 x plan)");
        assert!(lines[6].contains("PyTorch: unavailable: no torch"));
        let v = serde_json::to_value(&report).unwrap();
        assert_eq!(v["shapes"][0]["graph_us"]["median"], 8.0);
        assert_eq!(v["shapes"][0]["rotating_sets"], 16);
        assert_eq!(v["shapes"][0]["moe_new_us"]["median"], 10.5);
        assert_eq!(v["shapes"][0]["host_new_us"]["median"], 3.5);
        assert_eq!(v["shapes"][0]["torch"]["us"], 16.0);
        assert_eq!(v["shapes"][1]["torch"], serde_json::Value::Null);
    }

    #[test]
    fn routing_file_round_trip() {
        let shapes = MoeShape::defaults();
        let f = RoutingFile::new(&shapes, 5);
        assert_eq!(f.shapes.len(), 4);
        assert_eq!(f.shapes[1].counts, shapes[1].routing(5));
        assert_eq!(f.shapes[2].spec, "e=64,t=1-16,n=4096,k=7168");
        let path = std::env::temp_dir().join(format!("nvfp4-bench-routing-{}.json", std::process::id()));
        f.write(&path).unwrap();
        let back: RoutingFile = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(back, f);
        let _ = std::fs::remove_file(path);
    }
}
