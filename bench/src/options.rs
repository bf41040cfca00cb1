//! Command-line options of `nvfp4-bench` (clap), turned into [`Options`].

use crate::block::{
    BlockLayer, BlockPrecision, BLOCK_LAYERS, BLOCK_TOKENS, CHECK_TOKENS, MAX_BLOCK_TOKENS, QUICK_LAYERS, QUICK_TOKENS,
};
use crate::moe::MoeShape;
use crate::prepack::PrepackShape;
use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, ValueEnum};
use nvfp4_gemm::moe::{MoeKernels, MoeOptions};
use nvfp4_gemm::moe_block::{SchedulerPlacement, TokenDequantization};
use nvfp4_gemm_cli::spec::{self, NamedShapes};
use serde::Serialize;
use std::path::PathBuf;

/// The measurements and outputs, after the options in `--help`.
const DETAILS: &str = "\
MEASUREMENTS (per shape)
  competition   events around SETS back-to-back library calls, one per input set in turn (host
                overhead included), after an L2 flush; per-call time = total / SETS; median over
                REPS repetitions
  kernel-only   events around one call on the same buffers, L2 flushed before each; median of ITERS
                (5 rounds alternated with the new-tensor timing)
  host          CPU clock around HOST_CALLS calls (no synchronize inside), per call, median of
                HOST_BATCHES batches; `cached`: same buffers each call (the tables current),
                `rotating`: max(16, SETS) input sets in turn (the tables patched and uploaded)
  new tensors   events around one call after an L2 flush, as kernel-only, but on the next of the
                max(16, SETS) input sets every call (new addresses: the plan patches and uploads
                its tables); timed in 5 rounds alternating with kernel-only (same clock); the
                same for run_stacked (every set copied into stacked buffers, checked bit for bit
                against run) beside run_stacked's own kernel-only time
  cuBLAS        per-group bf16 cublasGemmEx (fp32 accumulate) on the dequantized set 0, timed as
                kernel-only
  floors        NVFP4 bytes (A, B values + scales, C) / measured copy bandwidth (1 GiB
                device-to-device copy, read + write bytes), FLOPs / measured bf16 tensor rate
                (cuBLAS 8192^3); floor = the larger

CEILINGS (once, at the start; also in the JSON's environment)
  copy          1 GiB device-to-device copy, (read + write bytes) / time, median of 20
  bf16 tensor   cuBLAS 8192^3 bf16 GEMM, median of 10 (needs cuBLAS)
  TMA           the kernel xfer_tma_bandwidth, one CTA per SM: one thread issues 2D TMA loads of
                the GEMM's boxes (f16 64x128 128B-swizzled 16 KiB token boxes, u8 64x128
                64B-swizzled 8 KiB weight boxes) into a 6-stage shared-memory ring; the consumer
                warps only wait and release. L2->SM: a 16 MiB buffer read 512 times per launch;
                DRAM->SM: a 2 GiB buffer read twice. Bytes into shared memory / time, events
                around each launch, median of 10 after 2 warm-ups; every CTA's box count checked

MOE ROWS (--moe, --moe-shapes, --moe-shape; run after the shapes above)
  Many experts, few tokens each, random routing (seeded by --seed), bf16 activations on the GPU:
    m0 = e=64,t=1-16,n=7168,k=2048   m1 = e=256,t=1-8,n=7168,k=2048
    m2 = e=64,t=1-16,n=4096,k=7168   m3 = e=256,t=1-8,n=4096,k=7168
  (e experts, each given a uniform count of tokens in t = lo-hi). Per MoE row, each checked once
  against the CPU reference, then timed like kernel-only (L2 flushed, events, median of ITERS):
  (a) quantize_grouped + GemmPlan::run (sizes known on the host), (b) quantize_grouped +
  MoePlan::run (contiguous layout, sizes read on the device; the plan told the row's total of
  rows, set_routed_rows, as an engine tells it T x top_k), (c) replay of a CUDA graph holding
  (b). Table: us and NVFP4 weight TB/s of each, PyTorch's best us and x_* = PyTorch us / ours
  (above 1: faster than PyTorch). New tensors: (b) on max(16, SETS) sets of activations,
  offsets, NVFP4 tokens and C in turn (weights fixed), timed alternated with (b), and its host
  time per call back-to-back (also for W4A16 with --w4a16).

PREPACK ROWS (--prepack, --prepack-shape; run after the shapes and the MoE rows)
  The GPU W4A16 weight prepack (nvfp4_gemm::w4a16::Prepacker) of a whole expert tensor:
    ds-w2 = e=256,n=7168,k=2048 (DeepSeek-V3's down projection)
    ds-w1 = e=256,n=2048,k=7168 (its gate and up projections, each)
  for f16 and bf16 activations. Per row and type: one checked call (experts 0 and e-1 against
  the CPU prepack, bit for bit), then events around one call after an L2 flush, median of
  ITERS. Table: ms, GB/s (values and scales read and written / time) and of_copy (GB/s / the
  copy ceiling). Device memory: the tensor twice (ds-w2, ds-w1: 2 x 2.1 GB).

BLOCK ROWS (--block, --block-shapes, --block-quick; run after the prepack rows)
  The whole MoE expert block (nvfp4_gemm::moe_block::ExpertBlock: route, gather (+ quantize),
  GEMM1, silu, GEMM2, combine), bf16 activations and output, random experts (seeded):
    ds      = DeepSeek-V3:   256 experts, top 8, hidden 7168, intermediate 2048 (6.34 GB NVFP4)
    qwen3   = Qwen3-30B-A3B: 128 experts, top 8, hidden 2048, intermediate 768 (0.34 GB)
    mixtral = Mixtral-8x7B:    8 experts, top 2, hidden 4096, intermediate 14336 (0.79 GB)
  at T = --block-tokens (1,8,64,512,4096), W4A4 (the activation kernel, and w4a4-epilogue: the
  activation in the first GEMM's epilogue) and W4A16 (--block-precision). Routing: per
  token top_k distinct experts drawn uniformly, weights the softmax of random logits (int32 ids,
  f32 weights). Per layer and precision ONE block planned for the largest T, checked once at
  --block-check-tokens tokens against the CPU reference, then per T: events around one run
  after an L2 flush, median of ITERS. Table: us, the byte floor (NVFP4 weights of the distinct
  experts touched + x and y bytes, at the copy ceiling), %floor and the target (T <= 64: >= 75%).
  PyTorch bf16 and the unfused composition: python/bench/bench.py --block.

OUTPUT
  stdout: one table row per shape (µs are medians):
    shape check comp_us kernel_us TB/s TFLOP/s cublas_us x_cublas floor_us %floor host_us stk_us
  TB/s = NVFP4 bytes / kernel-only time; TFLOP/s = 2*m*n*k summed / kernel-only time;
  x_cublas = cuBLAS time / kernel-only time (above 1: faster than cuBLAS); %floor = floor /
  kernel-only time; host_us = cached host overhead per call (GemmPlan::run, one buffer per
  operand and group); stk_us = the same through GemmPlan::run_stacked (one buffer per operand for
  all groups: input set 0 copied, its C checked bit for bit against run's).
  Then the new-tensor table, a row per shape and call (run, run_stacked, w4a16 f16/bf16):
    shape call kernel_us new_us new/kernel host_us host_new_us
  kernel_us = kernel-only (same tensors; for run_stacked its own), new_us = the same with new
  tensors every call, host_us / host_new_us = host time per call, same / new tensors.
  stderr: progress. Exit status: 0 all checks passed, 1 a check failed, 2 error.

cuBLAS
  cudarc (built against CUDA 12.9 bindings) looks for libcublas.so, libcublas.so.12, .11, ...
  but not libcublas.so.13. On a CUDA 13 machine run through run-bench.sh (beside this binary),
  which links libcublas.so to the installed libcublas.so.13 in a temporary folder put on
  LD_LIBRARY_PATH. Without cuBLAS the bench still runs and prints `baseline unavailable: <why>`.";

/// Times the NVFP4 grouped GEMM on GPU 0 (sm_90a) beside a cuBLAS bf16 baseline and the
/// measured floors, after checking each shape against the CPU reference.
#[derive(Parser, Debug)]
#[command(name = "nvfp4-bench", version, verbatim_doc_comment, after_long_help = DETAILS)]
struct Args {
    /// Shapes of the default set to run: comma-separated of b0,b1,b2,b3 (the
    /// benchmark shapes) and d0,d1,d2 (decode: few tokens per group), or `all`
    /// (default: all seven) or `none`
    #[arg(long, value_name = "LIST", value_parser = shape_list, verbatim_doc_comment)]
    shapes: Option<ShapeList>,
    /// An extra problem (repeatable): a name above, or key=value pairs: m, n, k each
    /// one integer or one per group joined by ':', optional g (group count) and name.
    /// Example: --shape g=2,m=128:384,n=4096,k=1536,name=mine
    /// d0 = g=64,m=4,n=7168,k=2048; d1 = g=8,m=1:2:3:4:5:6:7:8,n=7168,k=2048;
    /// d2 = g=32,m=16,n=4096,k=7168
    #[arg(long = "shape", value_name = "SPEC", value_parser = shape, verbatim_doc_comment)]
    extra: Vec<NamedShapes>,
    /// Input sets for the competition timing; the measurements with new tensors every
    /// call rotate over max(16, N) sets
    #[arg(long, value_name = "N", default_value_t = 15, value_parser = at_least::<1>, verbatim_doc_comment)]
    sets: usize,
    /// Competition repetitions
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = at_least::<1>)]
    reps: usize,
    /// Kernel-only iterations
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = at_least::<1>)]
    iters: usize,
    /// Calls per host-overhead batch
    #[arg(long = "host-calls", value_name = "N", default_value_t = 50, value_parser = at_least::<1>)]
    host_calls: usize,
    /// Host-overhead batches
    #[arg(long = "host-batches", value_name = "N", default_value_t = 20, value_parser = at_least::<1>)]
    host_batches: usize,
    /// L2 flush buffer, MiB
    #[arg(long = "flush-mib", value_name = "N", default_value_t = 256, value_parser = at_least::<256>)]
    flush_mib: usize,
    /// How the L2 is flushed before each kernel-only (and cuBLAS, MoE and PyTorch)
    /// sample and before each competition repetition: `write` sets the whole flush
    /// buffer (a memset), so the timed call starts with the L2 full of dirty lines
    /// that it has to write back; `read` reads the whole buffer with the TMA
    /// bandwidth kernel (sm_90a), so the L2 holds clean lines
    #[arg(long, value_name = "MODE", value_enum, default_value_t = Flush::Write, verbatim_doc_comment)]
    flush: Flush,
    /// Input seed
    #[arg(long, value_name = "N", default_value_t = 2222)]
    seed: u64,
    /// Skip the comparison with the CPU reference
    #[arg(long = "no-check")]
    no_check: bool,
    /// Skip cuBLAS (baseline and tensor-rate floor)
    #[arg(long = "no-baseline")]
    no_baseline: bool,
    /// Also time W4A16 on each shape (f16 activations: the checked set's A with its block
    /// scales applied; B prepacked), checked against the same reference; one line per shape
    /// after the table. On the MoE rows: a W4A16 MoePlan (the same activations as f16, read
    /// as they are; no quantization) and its graph replay, a line per row after the MoE table
    #[arg(long, verbatim_doc_comment)]
    w4a16: bool,
    /// Where the results go: nvfp4-bench.json and nvfp4-bench.svg for a run with
    /// shapes, nvfp4-bench-moe.json for MoE rows only (--shapes none),
    /// nvfp4-bench-prepack.json for prepack rows only, nvfp4-bench-block.json and
    /// nvfp4-bench-block.svg for block rows only, nvfp4-bench-ceilings.json for --ceilings
    #[arg(long, value_name = "DIR", default_value = "bench-results", verbatim_doc_comment)]
    out: PathBuf,
    /// Measure the ceilings only (copy, bf16 tensor rate, TMA), print and write the
    /// JSON, and exit (not with --shapes, --shape or the MoE options)
    #[arg(long, verbatim_doc_comment)]
    ceilings: bool,
    /// Add the MoE rows m0..m3 (below)
    #[arg(long)]
    moe: bool,
    /// Which of m0..m3 (comma-separated, `all` or `none`); implies --moe; also the decode
    /// shapes as MoE rows: d0 = e=64,t=4,n=7168,k=2048, d1 = e=8,t=1-8,n=7168,k=2048,
    /// d2 = e=32,t=16,n=4096,k=7168; and prefill-sized rows: p0 = e=8,t=64-248,n=4096,k=7168,
    /// p1 = e=8,t=40-196,n=7168,k=2048, p2 = e=64,t=32-128,n=7168,k=2048,
    /// p3 = e=32,t=100-300,n=4096,k=7168
    #[arg(long = "moe-shapes", value_name = "LIST", value_parser = moe_list)]
    moe_shapes: Option<MoeList>,
    /// An extra MoE problem (repeatable), e.g. e=128,t=0-4,n=2048,k=1024,name=mine
    #[arg(long = "moe-shape", value_name = "SPEC", value_parser = moe_shape)]
    moe_extra: Vec<MoeShape>,
    /// The MoePlan options each MoE row times (comma-separated; default `auto`), on
    /// sm_90a: `auto` (the default options: the decode kernel and the general one over
    /// 192-row weight spans, the scheduler picks per call), `auto-128` (the same with the
    /// 128-row general kernel), `decode` (the decode kernel only), `general` (the 128-row
    /// general kernel only), `auto-t64`, `general-t64` (the 128-row general kernel with
    /// 64-wide last tiles), `general-n192` (the 192-row-span kernel only),
    /// `auto-general-first` (as `auto`, the general kernel launched before the decode
    /// kernel); the first fills moe_us and graph_us, every one gets a line after the table
    #[arg(long = "moe-kernels", value_name = "LIST", value_parser = moe_kernels, verbatim_doc_comment)]
    moe_kernels: Option<MoeKernelList>,
    /// The PyTorch baseline of the MoE rows: `auto` (run torch_moe.py beside this
    /// binary with python3, or $NVFP4_BENCH_PYTHON, before opening the GPU; it writes
    /// DIR/torch-moe.json), `off`, or the path of a torch-moe.json to read
    #[arg(long, value_name = "WHAT", default_value = "auto", value_parser = torch, verbatim_doc_comment)]
    torch: Torch,
    /// Write the MoE rows' routings (JSON, for torch_moe.py) and exit; no GPU needed
    #[arg(long = "write-moe-routing", value_name = "FILE")]
    write_moe_routing: Option<PathBuf>,
    /// Draw the block rows of a bench JSON (nvfp4-bench-block.json) into an SVG beside it (the
    /// same name, .svg) and exit; no GPU needed
    #[arg(long = "block-svg", value_name = "JSON")]
    block_svg: Option<PathBuf>,
    /// Add the W4A16 prepack rows ds-w2 and ds-w1 (below)
    #[arg(long)]
    prepack: bool,
    /// An extra prepack row (repeatable), e.g. e=64,n=4096,k=7168,name=mine
    #[arg(long = "prepack-shape", value_name = "SPEC", value_parser = prepack_shape)]
    prepack_extra: Vec<PrepackShape>,
    /// Add the expert-block rows: ds, qwen3, mixtral (below)
    #[arg(long)]
    block: bool,
    /// Which block layers (comma-separated of ds, qwen3, mixtral, or `all` or `none`);
    /// implies --block
    #[arg(long = "block-shapes", value_name = "LIST", value_parser = block_list, verbatim_doc_comment)]
    block_shapes: Option<BlockList>,
    /// The block rows' token counts (comma-separated; default 1,8,64,512,4096)
    #[arg(long = "block-tokens", value_name = "LIST", value_parser = token_list)]
    block_tokens: Option<TokenList>,
    /// The block rows' precisions (comma-separated of w4a4, w4a4-epilogue, w4a16, or `all`, the
    /// default)
    #[arg(long = "block-precision", value_name = "LIST", value_parser = precision_list)]
    block_precision: Option<PrecisionList>,
    /// Where the block's GEMM schedulers run on sm_90a: `quantization` (both in the token
    /// quantization's launch, the default) or `launches` (each its own launch)
    #[arg(long = "block-schedulers", value_name = "WHERE", default_value = "quantization", value_parser = scheduler_placement, verbatim_doc_comment)]
    block_schedulers: SchedulerPlacement,
    /// Where the block's W4A4 tokens are dequantized for the sm_90a GEMMs: `launches` (each
    /// GEMM's own launch, the default) or `quantizers` (by the gather and the activation as they
    /// quantize)
    #[arg(long = "block-dequant", value_name = "WHERE", default_value = "launches", value_parser = token_dequantization, verbatim_doc_comment)]
    block_dequant: TokenDequantization,
    /// Tokens of each block's check against the CPU reference (few: the reference decodes
    /// every expert they touch)
    #[arg(long = "block-check-tokens", value_name = "N", default_value_t = CHECK_TOKENS, value_parser = at_least::<1>, verbatim_doc_comment)]
    block_check_tokens: usize,
    /// The quicker block subset: qwen3 and mixtral at T = 1,64,4096 (unless
    /// --block-shapes or --block-tokens say otherwise); implies --block
    #[arg(long = "block-quick", verbatim_doc_comment)]
    block_quick: bool,
}

/// `--block-shapes`: the listed layers.
#[derive(Debug, Clone)]
struct BlockList(Vec<BlockLayer>);

/// `--block-tokens`: the listed token counts.
#[derive(Debug, Clone)]
struct TokenList(Vec<usize>);

/// `--block-precision`: the listed precisions.
#[derive(Debug, Clone)]
struct PrecisionList(Vec<BlockPrecision>);

fn block_list(v: &str) -> Result<BlockList, String> {
    Ok(BlockList(match v {
        "all" => BLOCK_LAYERS.to_vec(),
        "none" => vec![],
        _ => v
            .split(',')
            .map(|s| BlockLayer::named(s.trim()).ok_or_else(|| format!("unknown layer `{s}` (ds, qwen3, mixtral)")))
            .collect::<Result<_, _>>()?,
    }))
}

fn token_list(v: &str) -> Result<TokenList, String> {
    let tokens: Vec<usize> = v
        .split(',')
        .map(|s| {
            let n: usize = s.trim().parse().map_err(|_| format!("`{s}` is not a whole number"))?;
            if n == 0 || n > MAX_BLOCK_TOKENS {
                return Err(format!("{n} tokens: 1 to {MAX_BLOCK_TOKENS}"));
            }
            Ok(n)
        })
        .collect::<Result<_, _>>()?;
    Ok(TokenList(tokens))
}

fn precision_list(v: &str) -> Result<PrecisionList, String> {
    if v == "all" {
        return Ok(PrecisionList(BlockPrecision::ALL.to_vec()));
    }
    let mut out: Vec<BlockPrecision> = vec![];
    for s in v.split(',') {
        let p = BlockPrecision::named(s.trim())
            .ok_or_else(|| format!("unknown precision `{s}` (w4a4, w4a4-epilogue, w4a16)"))?;
        if !out.contains(&p) {
            out.push(p);
        }
    }
    Ok(PrecisionList(out))
}

/// `--block-schedulers`.
fn scheduler_placement(v: &str) -> Result<SchedulerPlacement, String> {
    match v {
        "launches" => Ok(SchedulerPlacement::Launches),
        "quantization" => Ok(SchedulerPlacement::InQuantization),
        other => Err(format!("unknown scheduler placement `{other}` (launches, quantization)")),
    }
}

/// `--block-dequant`.
fn token_dequantization(v: &str) -> Result<TokenDequantization, String> {
    match v {
        "launches" => Ok(TokenDequantization::Launches),
        "quantizers" => Ok(TokenDequantization::InQuantizers),
        other => Err(format!("unknown dequantization placement `{other}` (launches, quantizers)")),
    }
}

/// `--shapes`: the listed shapes of the default set.
#[derive(Debug, Clone)]
struct ShapeList(Vec<NamedShapes>);

/// `--moe-shapes`: the listed MoE rows.
#[derive(Debug, Clone)]
struct MoeList(Vec<MoeShape>);

/// `--moe-kernels`: the listed `MoePlan` options, by name.
#[derive(Debug, Clone)]
struct MoeKernelList(Vec<(String, MoeOptions)>);

fn moe_kernels(v: &str) -> Result<MoeKernelList, String> {
    v.split(',')
        .map(|name| {
            let name = name.trim();
            moe_options(name).map(|opt| (name.to_owned(), opt)).ok_or_else(|| {
                let names: Vec<&str> = MOE_OPTIONS.iter().map(|(n, ..)| *n).collect();
                format!("unknown `{name}` ({})", names.join(", "))
            })
        })
        .collect::<Result<_, _>>()
        .map(MoeKernelList)
}

/// The `--moe-kernels` names: the kernels, `tail64` and `spans192` of each.
const MOE_OPTIONS: [(&str, MoeKernels, bool, bool); 8] = [
    ("auto", MoeKernels::Auto, false, true),
    ("decode", MoeKernels::Decode, false, false),
    ("general", MoeKernels::General, false, false),
    ("auto-128", MoeKernels::Auto, false, false),
    ("auto-t64", MoeKernels::Auto, true, false),
    ("general-t64", MoeKernels::General, true, false),
    ("general-n192", MoeKernels::General, false, true),
    ("auto-general-first", MoeKernels::AutoGeneralFirst, false, true),
];

/// The `MoePlan` options of a `--moe-kernels` name.
pub fn moe_options(name: &str) -> Option<MoeOptions> {
    let &(_, kernels, tail64, spans192) = MOE_OPTIONS.iter().find(|(n, ..)| *n == name)?;
    Some(MoeOptions { kernels, tail64, spans192, caller_dequantizes: false })
}

fn at_least<const MIN: usize>(v: &str) -> Result<usize, String> {
    let n: usize = v.parse().map_err(|_| "not a whole number".to_owned())?;
    if n < MIN {
        return Err(format!("at least {MIN}"));
    }
    Ok(n)
}

fn shape_list(v: &str) -> Result<ShapeList, String> {
    Ok(ShapeList(match v {
        "all" => default_shapes(),
        "none" => vec![],
        _ => v
            .split(',')
            .map(|s| named_shapes(s.trim()).ok_or_else(|| format!("unknown shape `{s}` (b0..b3, d0..d2)")))
            .collect::<Result<_, _>>()?,
    }))
}

fn shape(v: &str) -> Result<NamedShapes, String> {
    match named_shapes(v.trim()) {
        Some(named) => Ok(named),
        None => spec::parse(v).map_err(|e| e.to_string()),
    }
}

fn moe_list(v: &str) -> Result<MoeList, String> {
    Ok(MoeList(match v {
        "all" => MoeShape::defaults(),
        "none" => vec![],
        _ => v
            .split(',')
            .map(|s| MoeShape::named(s.trim()).ok_or_else(|| format!("unknown shape `{s}` (m0..m3, d0..d2, p0..p3)")))
            .collect::<Result<_, _>>()?,
    }))
}

fn moe_shape(v: &str) -> Result<MoeShape, String> {
    match MoeShape::named(v.trim()) {
        Some(s) => Ok(s),
        None => MoeShape::parse(v),
    }
}

fn prepack_shape(v: &str) -> Result<PrepackShape, String> {
    match PrepackShape::named(v.trim()) {
        Some(s) => Ok(s),
        None => PrepackShape::parse(v),
    }
}

fn torch(v: &str) -> Result<Torch, String> {
    Ok(match v {
        "auto" => Torch::Auto,
        "off" => Torch::Off,
        "" => return Err("auto, off or a file".into()),
        path => Torch::File(PathBuf::from(path)),
    })
}

/// The decode shapes of the default set (few tokens per expert, so the GEMM is bound by reading
/// the weights), by name and spec.
pub const DECODE_SHAPES: [(&str, &str); 3] = [
    ("d0", "g=64,m=4,n=7168,k=2048"),
    ("d1", "g=8,m=1:2:3:4:5:6:7:8,n=7168,k=2048"),
    ("d2", "g=32,m=16,n=4096,k=7168"),
];

/// A shape of the default set by name: `b0`..`b3` (`nvfp4_gemm_cli::spec::benchmark`) or
/// `d0`..`d2` ([`DECODE_SHAPES`]).
pub fn named_shapes(name: &str) -> Option<NamedShapes> {
    spec::benchmark(name).or_else(|| {
        let (name, text) = DECODE_SHAPES.iter().find(|(n, _)| *n == name)?;
        let shapes = spec::parse(text).expect("the decode specs are valid").shapes;
        Some(NamedShapes { name: (*name).to_owned(), shapes })
    })
}

/// The default set: b0..b3, then d0..d2.
pub fn default_shapes() -> Vec<NamedShapes> {
    let names = spec::BENCHMARK_NAMES.into_iter().chain(DECODE_SHAPES.map(|(n, _)| n));
    names.map(|n| named_shapes(n).expect("a name of the default set")).collect()
}

/// Parsed options.
#[derive(Debug, Clone, Serialize)]
pub struct Options {
    /// Problems to run, in order (in the JSON, each result carries its spec).
    #[serde(skip)]
    pub problems: Vec<NamedShapes>,
    /// Input sets of the competition timing (the first of [`Options::rotating_sets`]).
    pub sets: usize,
    /// Competition repetitions.
    pub reps: usize,
    /// Kernel-only iterations.
    pub iters: usize,
    /// Calls per host-overhead batch.
    pub host_calls: usize,
    /// Host-overhead batches.
    pub host_batches: usize,
    /// L2 flush buffer bytes.
    pub flush_bytes: usize,
    /// How the L2 is flushed.
    pub flush: Flush,
    /// Input seed.
    pub seed: u64,
    /// Compare with the CPU reference.
    pub check: bool,
    /// Run cuBLAS.
    pub baseline: bool,
    /// Also time W4A16 on each shape.
    pub w4a16: bool,
    /// Output folder.
    pub out: PathBuf,
    /// MoE rows to run after the problems (none unless asked for).
    #[serde(skip)]
    pub moe: Vec<MoeShape>,
    /// The `MoePlan` options each MoE row times (`--moe-kernels`), by name.
    #[serde(skip)]
    pub moe_kernels: Vec<(String, MoeOptions)>,
    /// Where the MoE rows' PyTorch baseline comes from.
    #[serde(skip)]
    pub torch: Torch,
    /// Write the MoE routings to this file and exit.
    #[serde(skip)]
    pub write_routing: Option<PathBuf>,
    /// Draw this JSON's block rows into an SVG beside it and exit (`--block-svg`).
    #[serde(skip)]
    pub block_svg: Option<PathBuf>,
    /// Measure the ceilings only (`--ceilings`): no problems, no MoE rows.
    #[serde(skip)]
    pub ceilings_only: bool,
    /// The W4A16 prepack rows to run after the MoE rows (none unless asked for).
    #[serde(skip)]
    pub prepack: Vec<PrepackShape>,
    /// The expert-block rows to run last (no layers unless asked for).
    #[serde(skip)]
    pub block: BlockSelection,
}

/// The expert-block rows a run asks for (`--block` and its options).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockSelection {
    /// Layers, in order (none: no block rows).
    pub layers: Vec<BlockLayer>,
    /// Token counts, in order.
    pub tokens: Vec<usize>,
    /// Precisions, in order.
    pub precisions: Vec<BlockPrecision>,
    /// Tokens of each block's check.
    pub check_tokens: usize,
    /// Where the block's GEMM schedulers run (sm_90a).
    pub schedulers: SchedulerPlacement,
    /// Where the block's W4A4 tokens are dequantized (sm_90a).
    pub dequantization: TokenDequantization,
}

impl Default for BlockSelection {
    fn default() -> Self {
        BlockSelection {
            layers: vec![],
            tokens: BLOCK_TOKENS.to_vec(),
            precisions: BlockPrecision::ALL.to_vec(),
            check_tokens: CHECK_TOKENS,
            schedulers: SchedulerPlacement::InQuantization,
            dequantization: TokenDequantization::Launches,
        }
    }
}

/// Fewest input sets the measurements with new tensors every call rotate over: the plan keeps
/// only the last call's tables, so any other set is new to it; 16 is the number of rotating
/// tensor sets the host-cost targets of a call with new tensors are stated for.
pub const MIN_ROTATING_SETS: usize = 16;

impl Options {
    /// Input sets a row makes and the new-tensor measurements rotate over: `--sets` (the
    /// competition timing's, the first ones), at least [`MIN_ROTATING_SETS`].
    pub fn rotating_sets(&self) -> usize {
        self.sets.max(MIN_ROTATING_SETS)
    }
}

/// How the L2 is flushed before a timed sample (`--flush`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Flush {
    /// Write the flush buffer (memset): the L2 ends full of dirty lines.
    #[default]
    Write,
    /// Read the flush buffer (TMA loads): the L2 ends with clean lines.
    Read,
}

impl Flush {
    /// Every mode.
    pub const ALL: [Flush; 2] = [Flush::Write, Flush::Read];

    /// The option's value: `write` or `read`.
    pub fn name(self) -> &'static str {
        match self {
            Flush::Write => "write",
            Flush::Read => "read",
        }
    }
}

/// Where the MoE rows' PyTorch baseline comes from (`--torch`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Torch {
    /// Run `torch_moe.py` beside the executable.
    #[default]
    Auto,
    /// No baseline.
    Off,
    /// Read this `torch-moe.json`.
    File(PathBuf),
}

impl std::fmt::Display for Torch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Torch::Auto => write!(f, "auto"),
            Torch::Off => write!(f, "off"),
            Torch::File(p) => write!(f, "{}", p.display()),
        }
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            problems: default_shapes(),
            sets: 15,
            reps: 20,
            iters: 50,
            host_calls: 50,
            host_batches: 20,
            flush_bytes: 256 << 20,
            flush: Flush::Write,
            seed: 2222,
            check: true,
            baseline: true,
            w4a16: false,
            out: PathBuf::from("bench-results"),
            moe: vec![],
            moe_kernels: vec![("auto".into(), MoeOptions::default())],
            torch: Torch::Auto,
            write_routing: None,
            block_svg: None,
            ceilings_only: false,
            prepack: vec![],
            block: BlockSelection::default(),
        }
    }
}

/// What the command line asked for.
// Made once per process: a box around the options would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Parsed {
    /// Run with these options.
    Run(Options),
    /// Print this (`--help` or `--version`) and exit successfully.
    Help(String),
}

/// Numbers the unnamed extra shapes `custom1`, `custom2`, … when there are several.
fn number_customs<T>(items: &mut [T], name: impl Fn(&mut T) -> &mut String) {
    let mut names: Vec<&mut String> = items.iter_mut().map(name).collect();
    if names.iter().filter(|n| n.as_str() == "custom").count() > 1 {
        for (k, n) in names.iter_mut().filter(|n| n.as_str() == "custom").enumerate() {
            **n = format!("custom{}", k + 1);
        }
    }
}

/// Parses the arguments (without the program name). Errors are clap's, rendered with the usage.
pub fn parse(args: &[String]) -> Result<Parsed, clap::Error> {
    let a = match Args::try_parse_from(std::iter::once("nvfp4-bench".to_owned()).chain(args.iter().cloned())) {
        Ok(a) => a,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            return Ok(Parsed::Help(e.render().to_string()))
        }
        Err(e) => return Err(e),
    };
    let fail = |kind, message: &str| Err(Args::command().error(kind, message));
    let mut o = Options {
        problems: vec![],
        sets: a.sets,
        reps: a.reps,
        iters: a.iters,
        host_calls: a.host_calls,
        host_batches: a.host_batches,
        flush_bytes: a.flush_mib << 20,
        flush: a.flush,
        seed: a.seed,
        check: !a.no_check,
        baseline: !a.no_baseline,
        w4a16: a.w4a16,
        out: a.out,
        moe: vec![],
        moe_kernels: a.moe_kernels.map_or_else(|| vec![("auto".into(), MoeOptions::default())], |l| l.0),
        torch: a.torch,
        write_routing: a.write_moe_routing,
        block_svg: a.block_svg,
        ceilings_only: a.ceilings,
        prepack: vec![],
        block: BlockSelection::default(),
    };
    let block_asked =
        a.block || a.block_quick || a.block_shapes.is_some() || a.block_tokens.is_some() || a.block_precision.is_some();
    if o.ceilings_only {
        let asked = a.shapes.is_some()
            || !a.extra.is_empty()
            || a.moe
            || a.moe_shapes.is_some()
            || !a.moe_extra.is_empty()
            || o.write_routing.is_some()
            || a.prepack
            || !a.prepack_extra.is_empty()
            || block_asked;
        if asked {
            return fail(
                ErrorKind::ArgumentConflict,
                "--ceilings measures the ceilings only: no --shapes, --shape, MoE, prepack or block options",
            );
        }
        return Ok(Parsed::Run(o));
    }
    let mut extra = a.extra;
    number_customs(&mut extra, |s| &mut s.name);
    let mut problems = a.shapes.map_or_else(default_shapes, |l| l.0);
    problems.extend(extra);
    let mut moe_extra = a.moe_extra;
    number_customs(&mut moe_extra, |s| &mut s.name);
    let mut moe = a.moe_shapes.map(|l| l.0).unwrap_or_else(|| {
        if a.moe || (o.write_routing.is_some() && moe_extra.is_empty()) {
            MoeShape::defaults()
        } else {
            vec![]
        }
    });
    moe.extend(moe_extra);
    if o.write_routing.is_some() && moe.is_empty() {
        return fail(ErrorKind::InvalidValue, "--write-moe-routing: no MoE shapes (--moe-shapes none)");
    }
    let mut prepack = if a.prepack { PrepackShape::defaults() } else { vec![] };
    let mut prepack_extra = a.prepack_extra;
    number_customs(&mut prepack_extra, |s| &mut s.name);
    prepack.extend(prepack_extra);
    if block_asked && !(a.block || a.block_quick || a.block_shapes.is_some()) {
        return fail(
            ErrorKind::InvalidValue,
            "--block-tokens and --block-precision need --block, --block-quick or --block-shapes",
        );
    }
    let quick = |names: &[&str]| names.iter().map(|n| BlockLayer::named(n).expect("a block layer")).collect();
    let block = BlockSelection {
        layers: match a.block_shapes {
            Some(l) => l.0,
            None if a.block_quick => quick(&QUICK_LAYERS),
            None if a.block => BLOCK_LAYERS.to_vec(),
            None => vec![],
        },
        tokens: match a.block_tokens {
            Some(t) => t.0,
            None if a.block_quick => QUICK_TOKENS.to_vec(),
            None => BLOCK_TOKENS.to_vec(),
        },
        precisions: a.block_precision.map_or_else(|| BlockPrecision::ALL.to_vec(), |p| p.0),
        check_tokens: a.block_check_tokens,
        schedulers: a.block_schedulers,
        dequantization: a.block_dequant,
    };
    if problems.is_empty() && moe.is_empty() && prepack.is_empty() && block.layers.is_empty() {
        return fail(
            ErrorKind::InvalidValue,
            "no shapes to run (--shapes none and no --shape, --moe, --prepack or --block)",
        );
    }
    o.problems = problems;
    o.moe = moe;
    o.prepack = prepack;
    o.block = block;
    Ok(Parsed::Run(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    fn run(s: &str) -> Options {
        match parse(&args(s)).unwrap() {
            Parsed::Run(o) => o,
            Parsed::Help(_) => panic!("help"),
        }
    }

    #[test]
    fn defaults_are_the_four_benchmarks_and_the_three_decode_shapes() {
        let o = run("");
        let names: Vec<&str> = o.problems.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["b0", "b1", "b2", "b3", "d0", "d1", "d2"]);
        assert_eq!(o.problems[..4], spec::benchmarks()[..]);
        let same = |p: &NamedShapes, g: usize, m: &[usize], n: usize, k: usize| {
            assert_eq!(p.shapes.len(), g, "{}", p.name);
            for (i, s) in p.shapes.iter().enumerate() {
                assert_eq!((s.m, s.n, s.k), (m[i % m.len()], n, k), "{} group {i}", p.name);
            }
        };
        same(&o.problems[4], 64, &[4], 7168, 2048);
        same(&o.problems[5], 8, &[1, 2, 3, 4, 5, 6, 7, 8], 7168, 2048);
        same(&o.problems[6], 32, &[16], 4096, 7168);
        assert_eq!(o.problems[5].to_spec(), "g=8,m=1:2:3:4:5:6:7:8,n=7168,k=2048");
        assert_eq!((o.sets, o.reps, o.iters, o.flush_bytes), (15, 20, 50, 256 << 20));
        assert!(o.check && o.baseline);
    }

    #[test]
    fn shapes_and_options() {
        let o = run("--shapes b3,b1 --shape g=2,m=128:384,n=4096,k=1536 --shape m=8,n=8,k=64,name=tiny --sets=4 --no-baseline --out /tmp/x");
        let names: Vec<&str> = o.problems.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["b3", "b1", "custom", "tiny"]);
        assert_eq!(o.problems[2].shapes, o.problems[0].shapes);
        assert_eq!((o.sets, o.rotating_sets()), (4, 16));
        assert_eq!(run("--sets 40").rotating_sets(), 40);
        assert!(!o.baseline);
        assert_eq!(o.out, PathBuf::from("/tmp/x"));
        let o = run("--shapes none --shape m=8,n=8,k=64 --shape m=16,n=8,k=64");
        let names: Vec<&str> = o.problems.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["custom1", "custom2"]);
        match parse(&args("--help")) {
            Ok(Parsed::Help(text)) => {
                assert!(text.contains("--moe-shapes <LIST>") && text.contains("MEASUREMENTS"), "{text}")
            }
            other => panic!("{other:?}"),
        }
        let o = run("--shapes d1,b0 --shape d2 --shape b3");
        let names: Vec<&str> = o.problems.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["d1", "b0", "d2", "b3"]);
        assert_eq!(o.problems[2].shapes.len(), 32);
        assert_eq!(run("--shapes all").problems, run("").problems);
        assert_eq!(
            (run("").flush, run("--flush read").flush, run("--flush=write").flush),
            (Flush::Write, Flush::Read, Flush::Write)
        );
        assert!(parse(&args("--flush clean")).is_err());
        assert_eq!(serde_json::to_value(run("--flush read")).unwrap()["flush"], "read");
    }

    #[test]
    fn errors() {
        let err = |s: &str| parse(&args(s)).unwrap_err().to_string();
        assert!(err("--shapes b7").contains("unknown shape `b7`"));
        assert!(err("--shapes d3").contains("unknown shape `d3` (b0..b3, d0..d2)"));
        assert!(err("--shapes none").contains("no shapes"));
        assert!(err("--sets 0").contains("at least 1"));
        assert!(err("--flush-mib 64").contains("at least 256"));
        assert!(err("--reps").contains("a value is required for '--reps <N>'"));
        assert!(err("--frob").contains("unexpected argument '--frob'"));
        assert!(err("--shape m=1,n=8").contains("missing k"));
        assert!(err("--no-check=1").contains("unexpected value '1' for '--no-check'"));
        assert!(err("--flush clean").contains("[possible values: write, read]"));
    }

    #[test]
    fn ceilings_only() {
        let o = run("--ceilings --no-baseline --out /tmp/c");
        assert!(o.ceilings_only && o.problems.is_empty() && o.moe.is_empty() && !o.baseline);
        assert!(!run("").ceilings_only);
        let err = |s: &str| parse(&args(s)).unwrap_err().to_string();
        for s in [
            "--ceilings --shapes b0",
            "--ceilings --shape d1",
            "--ceilings --moe",
            "--moe-shapes m0 --ceilings",
            "--ceilings --prepack",
            "--ceilings --prepack-shape e=1,n=8,k=64",
        ] {
            assert!(err(s).contains("ceilings only"), "{s}");
        }
        assert!(err("--ceilings=1").contains("unexpected value '1' for '--ceilings'"));
    }

    #[test]
    fn prepack_rows_are_off_unless_asked_for() {
        assert!(run("").prepack.is_empty());
        let o = run("--prepack --shapes none");
        assert!(o.problems.is_empty() && o.moe.is_empty());
        let names: Vec<&str> = o.prepack.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["ds-w2", "ds-w1"]);
        let o = run("--shapes none --prepack-shape e=8,n=130,k=192 --prepack-shape ds-w1 --prepack-shape e=2,n=8,k=64");
        let names: Vec<&str> = o.prepack.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["custom1", "ds-w1", "custom2"]);
        assert_eq!((o.prepack[0].experts, o.prepack[0].n, o.prepack[0].k), (8, 130, 192));
        assert_eq!(run("--prepack").problems.len(), 7, "the default shapes stay");
        let err = |s: &str| parse(&args(s)).unwrap_err().to_string();
        assert!(err("--prepack-shape e=1,n=8,k=65").contains("multiple of 64"));
        assert!(err("--prepack=1").contains("unexpected value '1' for '--prepack'"));
        assert!(err("--shapes none").contains("--prepack"));
    }

    fn moe_names(o: &Options) -> Vec<&str> {
        o.moe.iter().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn moe_rows_are_off_unless_asked_for() {
        let o = run("");
        assert!(o.moe.is_empty() && o.write_routing.is_none());
        assert_eq!(o.torch, Torch::Auto);
        // The JSON's options are unchanged by the MoE options.
        let v = serde_json::to_value(&o).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "baseline",
                "check",
                "flush",
                "flush_bytes",
                "host_batches",
                "host_calls",
                "iters",
                "out",
                "reps",
                "seed",
                "sets",
                "w4a16"
            ]
        );
        assert!(!o.w4a16 && run("--w4a16").w4a16);
    }

    #[test]
    fn moe_options() {
        let o = run("--moe --shapes none --out /tmp/o");
        assert!(o.problems.is_empty());
        assert_eq!(moe_names(&o), ["m0", "m1", "m2", "m3"]);
        assert_eq!(o.moe[1].experts, 256);
        let o = run("--moe-shapes m2,m0 --moe-shape e=8,t=0-2,n=256,k=128 --moe-shape m3 --torch off");
        assert_eq!(o.problems.len(), 7, "the default shapes stay");
        assert_eq!(moe_names(&o), ["m2", "m0", "custom", "m3"]);
        assert_eq!((o.moe[2].experts, o.moe[2].tokens), (8, (0, 2)));
        assert_eq!(o.torch, Torch::Off);
        let o = run("--shapes none --moe-shape e=8,t=1,n=8,k=64 --moe-shape e=9,t=1,n=8,k=64,name=x --moe-shape e=2,t=1,n=8,k=64");
        assert_eq!(moe_names(&o), ["custom1", "x", "custom2"]);
        assert_eq!(run("--moe --moe-shapes none").moe, vec![]);
        assert_eq!(run("--moe-shapes all").moe, MoeShape::defaults());
        assert_eq!(run("--moe --torch=/tmp/t.json").torch, Torch::File(PathBuf::from("/tmp/t.json")));
        let o = run("--write-moe-routing /tmp/r.json --shapes none");
        assert_eq!(o.write_routing, Some(PathBuf::from("/tmp/r.json")));
        assert_eq!(moe_names(&o), ["m0", "m1", "m2", "m3"]);
        let o = run("--write-moe-routing /tmp/r.json --moe-shape e=2,t=1,n=8,k=64,name=only");
        assert_eq!(moe_names(&o), ["only"]);
        assert_eq!(run("--block-svg r/b.json").block_svg, Some(PathBuf::from("r/b.json")));
        let err = |s: &str| parse(&args(s)).unwrap_err().to_string();
        assert!(err("--moe-shapes m9").contains("unknown shape `m9` (m0..m3, d0..d2, p0..p3)"));
        assert_eq!(moe_names(&run("--shapes none --moe-shapes d0,m1,d2")), ["d0", "m1", "d2"]);
        assert_eq!(moe_names(&run("--shapes none --moe-shapes m0,p0,p3")), ["m0", "p0", "p3"]);
        assert_eq!(run("--moe").moe_kernels, vec![("auto".to_owned(), MoeOptions::default())]);
        assert_eq!(
            super::moe_options("general-n192"),
            Some(MoeOptions { kernels: MoeKernels::General, tail64: false, spans192: true, caller_dequantizes: false })
        );
        assert_eq!(
            super::moe_options("auto-general-first"),
            Some(MoeOptions { kernels: MoeKernels::AutoGeneralFirst, ..MoeOptions::default() })
        );
        let o = run("--moe --moe-kernels auto,decode,general-t64");
        let names: Vec<&str> = o.moe_kernels.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["auto", "decode", "general-t64"]);
        assert_eq!(
            o.moe_kernels[1].1,
            MoeOptions { kernels: MoeKernels::Decode, tail64: false, spans192: false, caller_dequantizes: false }
        );
        assert_eq!(
            o.moe_kernels[2].1,
            MoeOptions { kernels: MoeKernels::General, tail64: true, spans192: false, caller_dequantizes: false }
        );
        assert!(err("--moe --moe-kernels auto,fast").contains("unknown `fast`"));
        assert!(err("--moe-shape e=1,t=1,n=8").contains("missing k"));
        assert!(err("--moe=1").contains("unexpected value '1' for '--moe'"));
        assert!(err("--shapes none --moe-shapes none").contains("no shapes"));
        assert!(err("--write-moe-routing /tmp/r.json --moe-shapes none").contains("no MoE shapes"));
        assert!(err("--torch").contains("a value is required for '--torch <WHAT>'"));
    }

    #[test]
    fn block_rows_are_off_unless_asked_for() {
        assert!(run("").block.layers.is_empty());
        let o = run("--block --shapes none --out /tmp/b");
        assert!(o.problems.is_empty() && o.moe.is_empty() && o.prepack.is_empty());
        let names: Vec<&str> = o.block.layers.iter().map(|l| l.name).collect();
        assert_eq!(names, ["ds", "qwen3", "mixtral"]);
        assert_eq!(o.block.tokens, [1, 8, 64, 512, 4096]);
        assert_eq!(o.block.precisions, BlockPrecision::ALL);
        assert_eq!(o.block.check_tokens, 2);
        assert_eq!(run("--block").problems.len(), 7, "the default shapes stay");
        let o = run("--shapes none --block-shapes mixtral,ds --block-tokens 4096,1 --block-precision w4a16 --block-check-tokens 3");
        let names: Vec<&str> = o.block.layers.iter().map(|l| l.name).collect();
        assert_eq!(names, ["mixtral", "ds"]);
        assert_eq!((o.block.tokens.clone(), o.block.precisions.clone()), (vec![4096, 1], vec![BlockPrecision::W4a16]));
        assert_eq!(o.block.check_tokens, 3);
        assert_eq!(
            run("--block --block-precision w4a16,w4a4,w4a16").block.precisions,
            [BlockPrecision::W4a16, BlockPrecision::W4a4]
        );
        assert_eq!(run("--block --block-precision all").block.precisions, BlockPrecision::ALL);
        assert_eq!(run("--block").block.schedulers, SchedulerPlacement::InQuantization);
        assert_eq!(run("--block --block-schedulers launches").block.schedulers, SchedulerPlacement::Launches);
        assert_eq!(run("--block").block.dequantization, TokenDequantization::Launches);
        assert_eq!(run("--block --block-dequant quantizers").block.dequantization, TokenDequantization::InQuantizers);
        assert_eq!(run("--block-shapes all").block.layers, BLOCK_LAYERS);
        assert!(run("--block-shapes none").block.layers.is_empty());
        // The quick subset, unless the layers or the tokens are named.
        let o = run("--shapes none --block-quick");
        let names: Vec<&str> = o.block.layers.iter().map(|l| l.name).collect();
        assert_eq!((names, o.block.tokens.clone()), (vec!["qwen3", "mixtral"], vec![1, 64, 4096]));
        let o = run("--shapes none --block-quick --block-shapes ds --block-tokens 8");
        assert_eq!((o.block.layers[0].name, o.block.tokens.clone()), ("ds", vec![8]));
        // The JSON's options are unchanged by the block options.
        let keys = |o: &Options| serde_json::to_value(o).unwrap().as_object().unwrap().len();
        assert_eq!(keys(&run("--block --block-tokens 1")), keys(&run("")));
        let err = |s: &str| parse(&args(s)).unwrap_err().to_string();
        assert!(err("--block-shapes dsv3").contains("unknown layer `dsv3` (ds, qwen3, mixtral)"));
        assert!(err("--block --block-tokens 0").contains("0 tokens: 1 to 16384"));
        assert!(err("--block --block-tokens 1,x").contains("`x` is not a whole number"));
        assert!(err("--block --block-tokens 16385").contains("1 to 16384"));
        assert!(err("--block --block-precision w4a8").contains("unknown precision `w4a8` (w4a4, w4a4-epilogue, w4a16)"));
        assert!(err("--block --block-schedulers gemm")
            .contains("unknown scheduler placement `gemm` (launches, quantization)"));
        assert!(err("--block --block-dequant gemm")
            .contains("unknown dequantization placement `gemm` (launches, quantizers)"));
        assert!(err("--block --block-check-tokens 0").contains("at least 1"));
        assert!(err("--block-tokens 1").contains("need --block"));
        assert!(err("--block-precision w4a4 --shapes none").contains("need --block"));
        assert!(err("--shapes none --block-shapes none").contains("--block"));
        assert!(err("--ceilings --block").contains("ceilings only"));
        assert!(err("--ceilings --block-quick").contains("ceilings only"));
        assert!(err("--block=1").contains("unexpected value '1' for '--block'"));
        match parse(&args("--help")) {
            Ok(Parsed::Help(text)) => {
                assert!(text.contains("--block-shapes <LIST>") && text.contains("BLOCK ROWS"), "{text}")
            }
            other => panic!("{other:?}"),
        }
    }
}
