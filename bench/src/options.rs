//! Command-line options of `nvfp4-bench`.

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

OPTIONS
  --sets N          input sets for the competition timing (default 15)
  --reps N          competition repetitions (default 20)
  --iters N         kernel-only iterations (default 50)
  --host-calls N    calls per host-overhead batch (default 50)
  --host-batches N  host-overhead batches (default 20)
  --flush-mib N     L2 flush buffer, MiB, at least 256 (default 256)
  --seed N          input seed (default 2222)
  --no-check        skip the comparison with the CPU reference
  --no-baseline     skip cuBLAS (baseline and tensor-rate floor)
  --out DIR         where nvfp4-bench.json and nvfp4-bench.svg go (default: bench-results)
  -h, --help        this text

OUTPUT
  stdout: one table row per shape (µs are medians):
    shape check comp_us kernel_us TB/s TFLOP/s cublas_us x_cublas floor_us %floor host_us
  TB/s = NVFP4 bytes / kernel-only time; TFLOP/s = 2*m*n*k summed / kernel-only time;
  x_cublas = cuBLAS time / kernel-only time (above 1: faster than cuBLAS); %floor = floor /
  kernel-only time; host_us = cached host overhead per call.
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
    /// Input seed.
    pub seed: u64,
    /// Compare with the CPU reference.
    pub check: bool,
    /// Run cuBLAS.
    pub baseline: bool,
    /// Output folder.
    pub out: PathBuf,
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
            seed: 2222,
            check: true,
            baseline: true,
            out: PathBuf::from("bench-results"),
        }
    }
}

/// What the command line asked for.
#[derive(Debug)]
pub enum Parsed {
    /// Run with these options.
    Run(Options),
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
            "--seed" => o.seed = value()?.parse().map_err(|_| "--seed: not a whole number".to_owned())?,
            "--out" => o.out = PathBuf::from(value()?),
            "--no-check" | "--no-baseline" if inline.is_some() => return Err(format!("{name} takes no value")),
            "--no-check" => o.check = false,
            "--no-baseline" => o.baseline = false,
            other => return Err(format!("unknown argument `{other}` (see --help)")),
        }
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
    if problems.is_empty() {
        return Err("no shapes to run (--shapes none and no --shape)".into());
    }
    o.problems = problems;
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
}
