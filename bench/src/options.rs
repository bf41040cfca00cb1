//! Command-line options of `nvfp4-bench`.

use crate::moe::MoeShape;
use nvfp4_gemm::moe::{MoeKernels, MoeOptions};
use nvfp4_gemm_cli::spec::{self, NamedShapes};
use serde::Serialize;
use std::path::PathBuf;

/// The help text.
pub const HELP: &str = "\
nvfp4-bench: times the NVFP4 grouped GEMM on GPU 0 (sm_90a) beside a cuBLAS bf16 baseline and the
measured floors, after checking each shape against the CPU reference.

USAGE
  nvfp4-bench [--shapes LIST] [--shape SPEC]... [--out DIR] [options]

SHAPES
  --shapes LIST     shapes of the default set to run: comma-separated of b0,b1,b2,b3 (the
                    benchmark shapes) and d0,d1,d2 (decode: few tokens per group), or `all`
                    (default: all seven) or `none`
  --shape SPEC      an extra problem (repeatable): a name above, or key=value pairs: m, n, k each
                    one integer or one per group joined by ':', optional g (group count) and name.
                    Example: --shape g=2,m=128:384,n=4096,k=1536,name=mine
                    d0 = g=64,m=4,n=7168,k=2048; d1 = g=8,m=1:2:3:4:5:6:7:8,n=7168,k=2048;
                    d2 = g=32,m=16,n=4096,k=7168

MEASUREMENTS (per shape)
  competition   events around SETS back-to-back library calls, one per input set in turn (host
                overhead included), after an L2 flush; per-call time = total / SETS; median over
                REPS repetitions
  kernel-only   events around one call on the same buffers, L2 flushed before each; median of ITERS
  host          CPU clock around HOST_CALLS calls (no synchronize inside), per call, median of
                HOST_BATCHES batches; `cached`: same buffers each call (no re-encoding),
                `rotating`: the input sets in turn (tensor maps re-encoded and uploaded)
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

OPTIONS
  --sets N          input sets for the competition timing (default 15)
  --reps N          competition repetitions (default 20)
  --iters N         kernel-only iterations (default 50)
  --host-calls N    calls per host-overhead batch (default 50)
  --host-batches N  host-overhead batches (default 20)
  --flush-mib N     L2 flush buffer, MiB, at least 256 (default 256)
  --flush MODE      how the L2 is flushed before each kernel-only (and cuBLAS, MoE and PyTorch)
                    sample and before each competition repetition: `write` (default) sets the
                    whole flush buffer (a memset), so the timed call starts with the L2 full of
                    dirty lines that it has to write back; `read` reads the whole buffer with the
                    TMA bandwidth kernel (sm_90a), so the L2 holds clean lines (every older dirty
                    line written back during the flush)
  --seed N          input seed (default 2222)
  --no-check        skip the comparison with the CPU reference
  --no-baseline     skip cuBLAS (baseline and tensor-rate floor)
  --w4a16           also time W4A16 on each shape (f16 activations: the checked set's A with its
                    block scales applied; B prepacked), checked against the same reference; one
                    line per shape after the table
  --out DIR         where the results go (default: bench-results): nvfp4-bench.json and
                    nvfp4-bench.svg for a run with shapes, nvfp4-bench-moe.json for MoE rows
                    only (--shapes none), nvfp4-bench-ceilings.json for --ceilings
  --ceilings        measure the ceilings only (copy, bf16 tensor rate, TMA), print and write the
                    JSON, and exit (no shapes; not with --shapes, --shape or the MoE options)
  -h, --help        this text

MOE ROWS (off unless asked for; run after the shapes above)
  --moe             add the MoE rows m0..m3: many experts, few tokens each, random routing
                    (seeded by --seed), bf16 activations on the GPU:
                    m0 = e=64,t=1-16,n=7168,k=2048   m1 = e=256,t=1-8,n=7168,k=2048
                    m2 = e=64,t=1-16,n=4096,k=7168   m3 = e=256,t=1-8,n=4096,k=7168
                    (e experts, each given a uniform count of tokens in t = lo-hi)
  --moe-shapes LIST which of m0..m3 (comma-separated, `all` or `none`); implies --moe; also the
                    decode shapes as MoE rows: d0 = e=64,t=4,n=7168,k=2048,
                    d1 = e=8,t=1-8,n=7168,k=2048, d2 = e=32,t=16,n=4096,k=7168
  --moe-shape SPEC  an extra MoE problem (repeatable), e.g. e=128,t=0-4,n=2048,k=1024,name=mine
  --moe-kernels LIST
                    the MoePlan options each MoE row times (comma-separated; default `auto`), on
                    sm_90a: `auto` (decode and general kernels, the scheduler picks per call),
                    `decode` (the decode kernel only), `general` (the general kernel only), and
                    `auto-t64`, `general-t64` (the general kernel with 64-wide last tiles); the
                    first fills moe_us and graph_us, every one gets a line after the table
  --torch WHAT      the PyTorch baseline of the MoE rows: `auto` (default: run torch_moe.py beside
                    this binary with python3, or $NVFP4_BENCH_PYTHON, before opening the GPU; it
                    writes DIR/torch-moe.json), `off`, or the path of a torch-moe.json to read
  --write-moe-routing FILE
                    write the MoE rows' routings (JSON, for torch_moe.py) and exit; no GPU needed
  Per MoE row, each checked once against the CPU reference, then timed like kernel-only (L2
  flushed, events, median of ITERS): (a) quantize_grouped + GemmPlan::run (sizes known on the
  host), (b) quantize_grouped + MoePlan::run (contiguous layout, sizes read on the device),
  (c) replay of a CUDA graph holding (b). Table: us and NVFP4 weight TB/s of each, PyTorch's best
  us and x_* = PyTorch us / ours (above 1: faster than PyTorch).

OUTPUT
  stdout: one table row per shape (µs are medians):
    shape check comp_us kernel_us TB/s TFLOP/s cublas_us x_cublas floor_us %floor host_us stk_us
  TB/s = NVFP4 bytes / kernel-only time; TFLOP/s = 2*m*n*k summed / kernel-only time;
  x_cublas = cuBLAS time / kernel-only time (above 1: faster than cuBLAS); %floor = floor /
  kernel-only time; host_us = cached host overhead per call (GemmPlan::run, one buffer per
  operand and group); stk_us = the same through GemmPlan::run_stacked (one buffer per operand for
  all groups: input set 0 copied, its C checked bit for bit against run's).
  stderr: progress. Exit status: 0 all checks passed, 1 a check failed, 2 error.

cuBLAS
  cudarc (built against CUDA 12.9 bindings) looks for libcublas.so, libcublas.so.12, .11, ...
  but not libcublas.so.13. On a CUDA 13 machine run through run-bench.sh (beside this binary),
  which links libcublas.so to the installed libcublas.so.13 in a temporary folder put on
  LD_LIBRARY_PATH. Without cuBLAS the bench still runs and prints `baseline unavailable: <why>`.
";

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
    /// Input sets (competition timing).
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
    /// Measure the ceilings only (`--ceilings`): no problems, no MoE rows.
    #[serde(skip)]
    pub ceilings_only: bool,
}

/// How the L2 is flushed before a timed sample (`--flush`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
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
            ceilings_only: false,
        }
    }
}

/// The `MoePlan` options of a `--moe-kernels` name.
pub fn moe_options(name: &str) -> Option<MoeOptions> {
    let (kernels, tail64) = match name {
        "auto" => (MoeKernels::Auto, false),
        "auto-t64" => (MoeKernels::Auto, true),
        "decode" => (MoeKernels::Decode, false),
        "general" => (MoeKernels::General, false),
        "general-t64" => (MoeKernels::General, true),
        _ => return None,
    };
    Some(MoeOptions { kernels, tail64 })
}

/// What the command line asked for.
#[derive(Debug)]
pub enum Parsed {
    /// Run with these options.
    Run(Box<Options>),
    /// Print the help.
    Help,
}

fn count(name: &str, v: &str, min: usize) -> Result<usize, String> {
    let n: usize = v.parse().map_err(|_| format!("--{name} {v}: not a whole number"))?;
    if n < min {
        return Err(format!("--{name} {v}: at least {min}"));
    }
    Ok(n)
}

/// Parses the arguments (without the program name).
pub fn parse(args: &[String]) -> Result<Parsed, String> {
    let mut o = Options::default();
    let mut benchmarks: Option<Vec<NamedShapes>> = None;
    let mut extra = vec![];
    let (mut moe_flag, mut moe_list, mut moe_extra): (bool, Option<Vec<MoeShape>>, Vec<MoeShape>) =
        (false, None, vec![]);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_owned())),
            _ => (arg.as_str(), None),
        };
        let mut value = || -> Result<String, String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it.next().cloned().ok_or_else(|| format!("{name} needs a value")),
            }
        };
        match name {
            "-h" | "--help" => return Ok(Parsed::Help),
            "--shapes" => {
                let v = value()?;
                let list = match v.as_str() {
                    "all" => default_shapes(),
                    "none" => vec![],
                    _ => v
                        .split(',')
                        .map(|s| {
                            named_shapes(s.trim())
                                .ok_or_else(|| format!("--shapes: unknown shape `{s}` (b0..b3, d0..d2)"))
                        })
                        .collect::<Result<_, _>>()?,
                };
                benchmarks = Some(list);
            }
            "--shape" => {
                let v = value()?;
                extra.push(match named_shapes(v.trim()) {
                    Some(named) => named,
                    None => spec::parse(&v).map_err(|e| e.to_string())?,
                });
            }
            "--sets" => o.sets = count("sets", &value()?, 1)?,
            "--reps" => o.reps = count("reps", &value()?, 1)?,
            "--iters" => o.iters = count("iters", &value()?, 1)?,
            "--host-calls" => o.host_calls = count("host-calls", &value()?, 1)?,
            "--host-batches" => o.host_batches = count("host-batches", &value()?, 1)?,
            "--flush-mib" => o.flush_bytes = count("flush-mib", &value()?, 256)? << 20,
            "--flush" => {
                let v = value()?;
                o.flush = Flush::ALL
                    .into_iter()
                    .find(|f| f.name() == v)
                    .ok_or_else(|| format!("--flush {v}: `write` or `read`"))?;
            }
            "--seed" => o.seed = value()?.parse().map_err(|_| "--seed: not a whole number".to_owned())?,
            "--out" => o.out = PathBuf::from(value()?),
            "--moe-shapes" => {
                let v = value()?;
                moe_list = Some(match v.as_str() {
                    "all" => MoeShape::defaults(),
                    "none" => vec![],
                    _ => v
                        .split(',')
                        .map(|s| {
                            MoeShape::named(s.trim())
                                .ok_or_else(|| format!("--moe-shapes: unknown shape `{s}` (m0..m3, d0..d2)"))
                        })
                        .collect::<Result<_, _>>()?,
                });
            }
            "--moe-shape" => {
                let v = value()?;
                moe_extra.push(match MoeShape::named(v.trim()) {
                    Some(s) => s,
                    None => MoeShape::parse(&v)?,
                });
            }
            "--moe-kernels" => {
                o.moe_kernels = value()?
                    .split(',')
                    .map(|name| {
                        moe_options(name.trim()).map(|opt| (name.trim().to_owned(), opt)).ok_or_else(|| {
                            format!("--moe-kernels: unknown `{name}` (auto, decode, general, auto-t64, general-t64)")
                        })
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--torch" => {
                o.torch = match value()?.as_str() {
                    "auto" => Torch::Auto,
                    "off" => Torch::Off,
                    "" => return Err("--torch: auto, off or a file".into()),
                    path => Torch::File(PathBuf::from(path)),
                }
            }
            "--write-moe-routing" => o.write_routing = Some(PathBuf::from(value()?)),
            "--no-check" | "--no-baseline" | "--moe" | "--ceilings" | "--w4a16" if inline.is_some() => {
                return Err(format!("{name} takes no value"))
            }
            "--moe" => moe_flag = true,
            "--ceilings" => o.ceilings_only = true,
            "--no-check" => o.check = false,
            "--no-baseline" => o.baseline = false,
            "--w4a16" => o.w4a16 = true,
            other => return Err(format!("unknown argument `{other}` (see --help)")),
        }
    }
    if o.ceilings_only {
        let asked = benchmarks.is_some()
            || !extra.is_empty()
            || moe_flag
            || moe_list.is_some()
            || !moe_extra.is_empty()
            || o.write_routing.is_some();
        if asked {
            return Err("--ceilings measures the ceilings only: no --shapes, --shape or MoE options".into());
        }
        o.problems = vec![];
        o.moe = vec![];
        return Ok(Parsed::Run(Box::new(o)));
    }
    let mut problems = benchmarks.unwrap_or_else(default_shapes);
    let customs = extra.iter().filter(|s| s.name == "custom").count();
    let mut k = 0;
    for mut s in extra {
        if s.name == "custom" && customs > 1 {
            k += 1;
            s.name = format!("custom{k}");
        }
        problems.push(s);
    }
    let mut moe = moe_list.unwrap_or_else(|| {
        if moe_flag || (o.write_routing.is_some() && moe_extra.is_empty()) {
            MoeShape::defaults()
        } else {
            vec![]
        }
    });
    let customs = moe_extra.iter().filter(|s| s.name == "custom").count();
    let mut k = 0;
    for mut s in moe_extra {
        if s.name == "custom" && customs > 1 {
            k += 1;
            s.name = format!("custom{k}");
        }
        moe.push(s);
    }
    if o.write_routing.is_some() && moe.is_empty() {
        return Err("--write-moe-routing: no MoE shapes (--moe-shapes none)".into());
    }
    if problems.is_empty() && moe.is_empty() {
        return Err("no shapes to run (--shapes none and no --shape or --moe)".into());
    }
    o.problems = problems;
    o.moe = moe;
    Ok(Parsed::Run(Box::new(o)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    fn run(s: &str) -> Options {
        match parse(&args(s)).unwrap() {
            Parsed::Run(o) => *o,
            Parsed::Help => panic!("help"),
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
        assert_eq!(o.sets, 4);
        assert!(!o.baseline);
        assert_eq!(o.out, PathBuf::from("/tmp/x"));
        let o = run("--shapes none --shape m=8,n=8,k=64 --shape m=16,n=8,k=64");
        let names: Vec<&str> = o.problems.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["custom1", "custom2"]);
        assert!(matches!(parse(&args("--help")), Ok(Parsed::Help)));
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
        let err = |s: &str| parse(&args(s)).unwrap_err();
        assert!(err("--shapes b7").contains("unknown shape `b7`"));
        assert!(err("--shapes d3").contains("unknown shape `d3` (b0..b3, d0..d2)"));
        assert!(err("--shapes none").contains("no shapes"));
        assert!(err("--sets 0").contains("at least 1"));
        assert!(err("--flush-mib 64").contains("at least 256"));
        assert!(err("--reps").contains("needs a value"));
        assert!(err("--frob").contains("unknown argument"));
        assert!(err("--shape m=1,n=8").contains("missing k"));
        assert!(err("--no-check=1").contains("takes no value"));
    }

    #[test]
    fn ceilings_only() {
        let o = run("--ceilings --no-baseline --out /tmp/c");
        assert!(o.ceilings_only && o.problems.is_empty() && o.moe.is_empty() && !o.baseline);
        assert!(!run("").ceilings_only);
        let err = |s: &str| parse(&args(s)).unwrap_err();
        for s in ["--ceilings --shapes b0", "--ceilings --shape d1", "--ceilings --moe", "--moe-shapes m0 --ceilings"] {
            assert!(err(s).contains("ceilings only"), "{s}");
        }
        assert!(err("--ceilings=1").contains("takes no value"));
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
        let err = |s: &str| parse(&args(s)).unwrap_err();
        assert!(err("--moe-shapes m9").contains("unknown shape `m9` (m0..m3, d0..d2)"));
        assert_eq!(moe_names(&run("--shapes none --moe-shapes d0,m1,d2")), ["d0", "m1", "d2"]);
        assert_eq!(run("--moe").moe_kernels, vec![("auto".to_owned(), MoeOptions::default())]);
        let o = run("--moe --moe-kernels auto,decode,general-t64");
        let names: Vec<&str> = o.moe_kernels.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["auto", "decode", "general-t64"]);
        assert_eq!(o.moe_kernels[1].1, MoeOptions { kernels: MoeKernels::Decode, tail64: false });
        assert_eq!(o.moe_kernels[2].1, MoeOptions { kernels: MoeKernels::General, tail64: true });
        assert!(err("--moe --moe-kernels auto,fast").contains("unknown `fast`"));
        assert!(err("--moe-shape e=1,t=1,n=8").contains("missing k"));
        assert!(err("--moe=1").contains("takes no value"));
        assert!(err("--shapes none --moe-shapes none").contains("no shapes"));
        assert!(err("--write-moe-routing /tmp/r.json --moe-shapes none").contains("no MoE shapes"));
        assert!(err("--torch").contains("needs a value"));
    }
}
