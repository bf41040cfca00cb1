//! `nvfp4-gemm`: run, check and inspect the NVFP4 grouped GEMM on groups stored in safetensors
//! files. See `nvfp4-gemm --help`.

use nvfp4_format::{InputDistribution, Tolerance};
use nvfp4_gemm::OutputType;
use nvfp4_gemm_cli::commands;
use nvfp4_gemm_cli::file::ScaleLayout;
use nvfp4_gemm_cli::spec::{self, NamedShapes};
use nvfp4_gemm_cli::CliError;
use std::path::PathBuf;
use std::process::ExitCode;

const HELP: &str = "\
nvfp4-gemm: the NVFP4 block-scaled grouped GEMM C_i = alpha_i * A_i * B_i^T on groups stored in a
safetensors file (A: m x k, B: n x k, both NVFP4 = packed e2m1 values + e4m3 scales per 16 values).

USAGE
  nvfp4-gemm run   <in.safetensors> <out.safetensors> [--bf16]
  nvfp4-gemm check <in.safetensors> <out.safetensors> [--atol X] [--rtol X]
  nvfp4-gemm info  [<in.safetensors>] [--shape SPEC]...
  nvfp4-gemm gen   <out.safetensors> [--shape SPEC] [--seed N] [--dist competition|full]
                   [--scales plain|blocked] [--alpha X]
  nvfp4-gemm --help | --version

COMMANDS
  run    Computes every group on GPU 0 (an sm_90a GPU: H100/H200) and writes C to <out>.
         C is fp16 (--bf16: bf16). Without a usable GPU it says so and exits with status 2.
  check  Compares the C tensors of <out> with the CPU reference (exact products, fp64 sums, one
         rounding to C's type): |got - ref| <= atol + rtol*|ref| per element (default 1e-3 each,
         the competition's check); prints a line per group and the overall result. No GPU needed.
  info   Prints the device and, for each problem, the kernel and configuration the planner picks:
         the groups of <in> if given, the --shape specs if given, else the benchmark shapes b0..b3.
  gen    Writes random groups (default: the competition's distribution, seed 1, plain scales,
         alpha 1, shape b3) so the other commands can be tried without Python.

INPUT FILE (tensor names, dtypes, shapes; i = 0, 1, ..., G-1 without gaps)
  g{i}.a        U8 [m, k/2]   packed e2m1 values, element 2j in the LOW nibble of byte j
                (or F4 [m, k], torch.float4_e2m1fn_x2)
  g{i}.a_scale  F8_E4M3 (torch.float8_e4m3fn; U8 raw codes accepted), one scale per 16 values:
                  2-D [m, k/16]  plain row-major, or
                  1-D [ceil(m/128)*128 * ceil(k/64)*4]  the 128x4 blocked layout the GPU reads:
                  offset(r, j) = ((r/128)*ceil(k/64) + j/4)*512 + (r%32)*16 + ((r%128)/32)*4 + j%4
                The rank tells which layout it is.
  g{i}.b        U8 [n, k/2] (or F4 [n, k])
  g{i}.b_scale  as g{i}.a_scale, with n rows
  g{i}.alpha    F32 [] or [1], optional (default 1.0): multiplies the fp32 accumulator
  Rules: k a positive multiple of 64, equal for A and B; n a positive multiple of 8; m >= 0
  (m = 0 skips the group); alpha finite. g{i}.c tensors are ignored; any other name is an error.

OUTPUT FILE
  g{i}.c        F16 [m, n] (BF16 with run --bf16), row-major

SHAPE SPECS (--shape)
  b0, b1, b2, b3 (the benchmark shapes), or key=value pairs: m, n, k each one integer or one per
  group joined by ':', optional g (group count) and name. Example: g=2,m=128:384,n=4096,k=1536

EXIT STATUS
  0 success; 1 `check` found elements outside the tolerance; 2 error (arguments, file, GPU).
";

/// Options of one command: (name, takes a value).
type OptionSpec = &'static [(&'static str, bool)];

struct Parsed {
    positional: Vec<String>,
    options: Vec<(String, Option<String>)>,
}

impl Parsed {
    fn value(&self, name: &str) -> Option<&str> {
        self.options.iter().rev().find(|(n, _)| n == name).and_then(|(_, v)| v.as_deref())
    }

    fn values(&self, name: &str) -> Vec<&str> {
        self.options.iter().filter(|(n, _)| n == name).filter_map(|(_, v)| v.as_deref()).collect()
    }

    fn flag(&self, name: &str) -> bool {
        self.options.iter().any(|(n, _)| n == name)
    }
}

fn parse_args(args: &[String], known: OptionSpec) -> Result<Parsed, CliError> {
    let mut out = Parsed { positional: vec![], options: vec![] };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if let Some(name) = a.strip_prefix("--") {
            let (name, inline) = match name.split_once('=') {
                Some((n, v)) => (n, Some(v.to_owned())),
                None => (name, None),
            };
            let Some(&(_, takes_value)) = known.iter().find(|(n, _)| *n == name) else {
                return Err(CliError::Usage(format!("unknown option --{name}")));
            };
            let value = match (takes_value, inline) {
                (true, Some(v)) => Some(v),
                (true, None) => {
                    Some(it.next().ok_or_else(|| CliError::Usage(format!("--{name} needs a value")))?.clone())
                }
                (false, Some(_)) => return Err(CliError::Usage(format!("--{name} takes no value"))),
                (false, None) => None,
            };
            out.options.push((name.to_owned(), value));
        } else {
            out.positional.push(a.clone());
        }
    }
    Ok(out)
}

fn positional(p: &Parsed, want: std::ops::RangeInclusive<usize>, usage: &str) -> Result<Vec<PathBuf>, CliError> {
    if !want.contains(&p.positional.len()) {
        return Err(CliError::Usage(format!("usage: {usage}")));
    }
    Ok(p.positional.iter().map(PathBuf::from).collect())
}

fn number<T: std::str::FromStr>(p: &Parsed, name: &str, default: T) -> Result<T, CliError> {
    match p.value(name) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|_| CliError::Usage(format!("--{name} {v}: not a number"))),
    }
}

fn shapes_of(p: &Parsed) -> Result<Vec<NamedShapes>, CliError> {
    p.values("shape").into_iter().map(|s| spec::parse(s).map_err(|e| CliError::Usage(e.to_string()))).collect()
}

fn main_inner(args: &[String]) -> Result<ExitCode, CliError> {
    let Some(command) = args.first() else {
        print!("{HELP}");
        return Err(CliError::Usage("no command given".into()));
    };
    let rest = &args[1..];
    match command.as_str() {
        "-h" | "--help" | "help" => {
            print!("{HELP}");
            Ok(ExitCode::SUCCESS)
        }
        "-V" | "--version" => {
            println!("nvfp4-gemm {}", env!("CARGO_PKG_VERSION"));
            Ok(ExitCode::SUCCESS)
        }
        "run" => {
            let p = parse_args(rest, &[("bf16", false)])?;
            let files = positional(&p, 2..=2, "nvfp4-gemm run <in.safetensors> <out.safetensors> [--bf16]")?;
            let out_type = if p.flag("bf16") { OutputType::Bf16 } else { OutputType::F16 };
            let report = commands::run(&files[0], &files[1], out_type)?;
            println!("{report}");
            println!("wrote {}", files[1].display());
            Ok(ExitCode::SUCCESS)
        }
        "check" => {
            let p = parse_args(rest, &[("atol", true), ("rtol", true)])?;
            let files =
                positional(&p, 2..=2, "nvfp4-gemm check <in.safetensors> <out.safetensors> [--atol X] [--rtol X]")?;
            let tol = Tolerance::new(
                number(&p, "atol", Tolerance::COMPETITION.atol)?,
                number(&p, "rtol", Tolerance::COMPETITION.rtol)?,
            );
            if !(tol.atol >= 0.0 && tol.rtol >= 0.0) {
                return Err(CliError::Usage("--atol and --rtol must be non-negative".into()));
            }
            let report = commands::check(&files[0], &files[1], tol)?;
            println!("{report}");
            Ok(if report.passed() { ExitCode::SUCCESS } else { ExitCode::from(1) })
        }
        "info" => {
            let p = parse_args(rest, &[("shape", true)])?;
            let files = positional(&p, 0..=1, "nvfp4-gemm info [<in.safetensors>] [--shape SPEC]...")?;
            let mut problems = shapes_of(&p)?;
            if let Some(f) = files.first() {
                let groups = nvfp4_gemm_cli::file::read_groups(f)?;
                problems.insert(0, NamedShapes { name: f.display().to_string(), shapes: groups.shapes() });
            }
            if problems.is_empty() {
                problems = spec::benchmarks();
            }
            let gpu = match commands::open_gpu() {
                Ok(gpu) => gpu,
                Err(e) => {
                    println!("device: none");
                    for named in &problems {
                        println!("{}: {}", named.name, named.to_spec());
                    }
                    return Err(e);
                }
            };
            println!("device: {}", commands::describe(&gpu));
            for named in &problems {
                println!("{}", commands::plan_text(&gpu, named, OutputType::F16)?);
            }
            Ok(ExitCode::SUCCESS)
        }
        "gen" => {
            let known: OptionSpec =
                &[("shape", true), ("seed", true), ("dist", true), ("scales", true), ("alpha", true)];
            let p = parse_args(rest, known)?;
            let files = positional(&p, 1..=1, "nvfp4-gemm gen <out.safetensors> [--shape SPEC] [--seed N] ...")?;
            let mut specs = shapes_of(&p)?;
            if specs.len() > 1 {
                return Err(CliError::Usage("gen takes one --shape".into()));
            }
            let shapes = specs.pop().unwrap_or_else(|| spec::benchmark("b3").expect("b3 exists")).shapes;
            let dist = match p.value("dist").unwrap_or("competition") {
                "competition" => InputDistribution::Competition,
                "full" => InputDistribution::FullRange,
                other => return Err(CliError::Usage(format!("--dist {other}: expected competition or full"))),
            };
            let layout = match p.value("scales").unwrap_or("plain") {
                "plain" => ScaleLayout::Plain,
                "blocked" => ScaleLayout::Blocked,
                other => return Err(CliError::Usage(format!("--scales {other}: expected plain or blocked"))),
            };
            let default_alpha = if dist == InputDistribution::FullRange { 1.0 / 65536.0 } else { 1.0 };
            let alpha = number(&p, "alpha", default_alpha)?;
            commands::generate(&files[0], &shapes, dist, number(&p, "seed", 1u64)?, layout, alpha)?;
            println!("wrote {} groups to {}", shapes.len(), files[0].display());
            Ok(ExitCode::SUCCESS)
        }
        other => Err(CliError::Usage(format!("unknown command `{other}`"))),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match main_inner(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nvfp4-gemm: error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
