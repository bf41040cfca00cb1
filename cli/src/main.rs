//! `nvfp4-gemm`: run, check and inspect the NVFP4 grouped GEMM on groups stored in safetensors
//! files. See `nvfp4-gemm --help` and `nvfp4-gemm <command> --help`.

use clap::{Parser, Subcommand, ValueEnum};
use nvfp4_format::{InputDistribution, Tolerance};
use nvfp4_gemm::{reference_sm_count, Arch, OutputType};
use nvfp4_gemm_cli::commands::{self, plural, Planner};
use nvfp4_gemm_cli::file::ScaleLayout;
use nvfp4_gemm_cli::spec::{self, NamedShapes};
use nvfp4_gemm_cli::CliError;
use std::path::PathBuf;
use std::process::ExitCode;

// The help's sections, put together per command with `concat!`.
macro_rules! input_file {
    () => {
        "\
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
  (m = 0 skips the group); alpha finite. g{i}.c tensors are ignored; any other name is an error."
    };
}
macro_rules! output_file {
    () => {
        "\
OUTPUT FILE (run, ref)
  g{i}.c        F16 [m, n] (BF16 with --bf16), row-major"
    };
}
macro_rules! shape_specs {
    () => {
        "\
SHAPE SPECS (--shape)
  b0, b1, b2, b3 (the benchmark shapes), or key=value pairs: m, n, k each one integer or one per
  group joined by ':', optional g (group count) and name. Example: g=2,m=128:384,n=4096,k=1536"
    };
}
macro_rules! exit_status {
    () => {
        "\
EXIT STATUS
  0 success; 1 `check` found elements outside the tolerance; 2 error (arguments, file, GPU)."
    };
}

/// The NVFP4 block-scaled grouped GEMM C_i = alpha_i * A_i * B_i^T on groups stored in a
/// safetensors file (A: m x k, B: n x k, both NVFP4: packed e2m1 values + one e4m3 scale per 16
/// values).
///
/// Try it without a GPU: `gen in.safetensors`, `ref in.safetensors out.safetensors`, `check
/// in.safetensors out.safetensors`, `info --arch sm_90a`.
#[derive(Parser)]
#[command(name = "nvfp4-gemm", version, verbatim_doc_comment)]
#[command(after_long_help = concat!(input_file!(), "\n\n", output_file!(), "\n\n", shape_specs!(), "\n\n", exit_status!()))]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Computes every group on GPU 0 (an sm_90a GPU: H100/H200) and writes C to OUT.
    ///
    /// Without a usable GPU it says so and exits with status 2.
    #[command(verbatim_doc_comment, after_long_help = concat!(input_file!(), "\n\n", output_file!()))]
    Run {
        /// The groups (see `nvfp4-gemm --help` for the format).
        input: PathBuf,
        /// Where C goes: one g{i}.c tensor per group.
        output: PathBuf,
        /// Write C as bf16 (default fp16).
        #[arg(long)]
        bf16: bool,
    },
    /// Writes the CPU reference of every group to OUT, in `run`'s format. No GPU needed.
    ///
    /// Exact products, fp64 sums, one rounding to C's type: what `check` compares with.
    #[command(name = "ref", verbatim_doc_comment)]
    #[command(after_long_help = concat!(input_file!(), "\n\n", output_file!()))]
    Reference {
        /// The groups.
        input: PathBuf,
        /// Where C goes.
        output: PathBuf,
        /// Write C as bf16 (default fp16).
        #[arg(long)]
        bf16: bool,
    },
    /// Compares the C tensors of OUT with the CPU reference. No GPU needed.
    ///
    /// Per element |got - ref| <= atol + rtol*|ref| against the reference (exact products, fp64
    /// sums, one rounding to C's type); prints a line per group and the overall result. Exit
    /// status 1 when an element is outside the tolerance.
    #[command(verbatim_doc_comment, after_long_help = concat!(input_file!(), "\n\n", exit_status!()))]
    Check {
        /// The groups.
        input: PathBuf,
        /// The output to check (from `run`, `ref` or another tool).
        output: PathBuf,
        /// Absolute tolerance (the competition's check: 1e-3).
        #[arg(long, default_value_t = Tolerance::COMPETITION.atol, value_parser = non_negative, allow_negative_numbers = true)]
        atol: f64,
        /// Relative tolerance (the competition's check: 1e-3).
        #[arg(long, default_value_t = Tolerance::COMPETITION.rtol, value_parser = non_negative, allow_negative_numbers = true)]
        rtol: f64,
    },
    /// Shows the kernels, tiles and launches the planner picks for each problem.
    ///
    /// Problems: the groups of INPUT if given, the --shape specs if given, else the benchmark
    /// shapes b0..b3. With --arch, the CPU plans for that architecture (no GPU needed); without
    /// it, GPU 0 plans, or, when there is none, both architectures on their reference GPUs.
    #[command(verbatim_doc_comment, after_long_help = shape_specs!())]
    Info {
        /// A groups file.
        input: Option<PathBuf>,
        /// A problem (repeatable): b0..b3 or key=value pairs (below).
        #[arg(long = "shape", value_name = "SPEC", value_parser = shape_spec)]
        shapes: Vec<NamedShapes>,
        /// Plan for this architecture on the CPU instead of asking GPU 0.
        #[arg(long, value_enum)]
        arch: Option<ArchName>,
        /// SMs of that GPU (default: 132 for sm_90a, an H200; 148 for sm_100a, a B200).
        #[arg(long, requires = "arch", value_parser = clap::value_parser!(u32).range(1..))]
        sms: Option<u32>,
    },
    /// Writes random groups, so the other commands can be tried without Python.
    #[command(verbatim_doc_comment, after_long_help = shape_specs!())]
    Gen {
        /// Where the groups go.
        output: PathBuf,
        /// The shapes (default b3).
        #[arg(long, value_name = "SPEC", value_parser = shape_spec)]
        shape: Option<NamedShapes>,
        /// Random seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Input distribution: the competition's, or full-range e2m1 values and scales.
        #[arg(long, value_enum, default_value_t = Dist::Competition)]
        dist: Dist,
        /// Scale layout in the file.
        #[arg(long, value_enum, default_value_t = Scales::Plain)]
        scales: Scales,
        /// Every group's alpha (default 1, or 2^-16 with --dist full so that C stays finite).
        #[arg(long)]
        alpha: Option<f32>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum ArchName {
    #[value(name = "sm_90a", alias = "sm90")]
    Sm90a,
    #[value(name = "sm_100a", alias = "sm100")]
    Sm100a,
}

impl From<ArchName> for Arch {
    fn from(a: ArchName) -> Arch {
        match a {
            ArchName::Sm90a => Arch::Sm90a,
            ArchName::Sm100a => Arch::Sm100a,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Dist {
    Competition,
    Full,
}

#[derive(Clone, Copy, ValueEnum)]
enum Scales {
    Plain,
    Blocked,
}

fn shape_spec(s: &str) -> Result<NamedShapes, String> {
    spec::parse(s).map_err(|e| e.to_string())
}

fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x >= 0.0 => Ok(x),
        _ => Err("expected a number >= 0".into()),
    }
}

fn output_type(bf16: bool) -> OutputType {
    if bf16 {
        OutputType::Bf16
    } else {
        OutputType::F16
    }
}

fn info(
    input: Option<PathBuf>,
    mut problems: Vec<NamedShapes>,
    arch: Option<ArchName>,
    sms: Option<u32>,
) -> Result<(), CliError> {
    if let Some(f) = input {
        let groups = nvfp4_gemm_cli::file::read_groups(&f)?;
        problems.insert(0, NamedShapes { name: f.display().to_string(), shapes: groups.shapes() });
    }
    if problems.is_empty() {
        problems = spec::benchmarks();
    }
    let print_all = |planner: &Planner<'_>| -> Result<(), CliError> {
        for named in &problems {
            println!("{}", commands::plan_text(planner, named, OutputType::F16)?);
        }
        Ok(())
    };
    let on_cpu = |arch: Arch, sm_count: u32| -> Result<(), CliError> {
        println!("planner: {} on {} SMs, on the CPU (the driver's occupancy answers assumed)", arch.name(), sm_count);
        print_all(&Planner::Arch { arch, sm_count })
    };
    if let Some(arch) = arch {
        let arch = Arch::from(arch);
        return on_cpu(arch, sms.unwrap_or_else(|| reference_sm_count(arch)));
    }
    match commands::open_gpu() {
        Ok(gpu) => {
            println!("device: {}", commands::describe(&gpu));
            print_all(&Planner::Gpu(&gpu))
        }
        Err(CliError::NoGpu(reason)) => {
            println!("device: none: {reason}");
            for arch in [Arch::Sm90a, Arch::Sm100a] {
                on_cpu(arch, reference_sm_count(arch))?;
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

fn main_inner(command: Command) -> Result<ExitCode, CliError> {
    match command {
        Command::Run { input, output, bf16 } => {
            let report = commands::run(&input, &output, output_type(bf16))?;
            println!("{report}");
            println!("wrote {}", output.display());
        }
        Command::Reference { input, output, bf16 } => {
            let groups = commands::reference(&input, &output, output_type(bf16))?;
            println!("wrote the CPU reference of {} to {}", plural(groups, "group"), output.display());
        }
        Command::Check { input, output, atol, rtol } => {
            let report = commands::check(&input, &output, Tolerance::new(atol, rtol))?;
            println!("{report}");
            return Ok(if report.passed() { ExitCode::SUCCESS } else { ExitCode::from(1) });
        }
        Command::Info { input, shapes, arch, sms } => info(input, shapes, arch, sms)?,
        Command::Gen { output, shape, seed, dist, scales, alpha } => {
            let shapes = shape.unwrap_or_else(|| spec::benchmark("b3").expect("b3 exists")).shapes;
            let dist = match dist {
                Dist::Competition => InputDistribution::Competition,
                Dist::Full => InputDistribution::FullRange,
            };
            let layout = match scales {
                Scales::Plain => ScaleLayout::Plain,
                Scales::Blocked => ScaleLayout::Blocked,
            };
            let default_alpha = if dist == InputDistribution::FullRange { 1.0 / 65536.0 } else { 1.0 };
            commands::generate(&output, &shapes, dist, seed, layout, alpha.unwrap_or(default_alpha))?;
            println!("wrote {} to {}", plural(shapes.len(), "group"), output.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match main_inner(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nvfp4-gemm: error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
