//! The commands. `check`, `ref`, `gen` and `info --arch` run on the CPU; `run` needs an sm_90a GPU
//! and says so clearly when there is none.

use crate::error::CliError;
use crate::file::{self, GroupsFile, Outputs, ScaleLayout};
use crate::spec::NamedShapes;
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use half::{bf16, f16};
use nvfp4_format::{compare, reference_grouped_gemm_f64, Comparison, Group, GroupShape, InputDistribution, Tolerance};
use nvfp4_gemm::{
    driver_present, plan_summary, Arch, Error, GemmPlan, Gpu, GroupArgs, Nvfp4Operand, Output, OutputType, PlanSummary,
    Problem,
};
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// What `check` found: one comparison per group and one over all groups.
#[derive(Debug, Clone)]
pub struct CheckReport {
    /// Output element type found in the file.
    pub output: OutputType,
    /// The shapes.
    pub shapes: Vec<GroupShape>,
    /// Per group.
    pub groups: Vec<Comparison>,
    /// Over all groups.
    pub overall: Comparison,
    /// Reference elements that are NaN, per group (NaN scale codes in the input make them).
    pub nan_expected: Vec<usize>,
}

impl CheckReport {
    /// Every element passed.
    pub fn passed(&self) -> bool {
        self.overall.passed()
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (c, s)) in self.groups.iter().zip(&self.shapes).enumerate() {
            let status = if c.passed() { "PASS" } else { "FAIL" };
            writeln!(
                f,
                "group {i:>3}  m={:<5} n={:<5} k={:<5} {status}  {}/{} outside, normalized error {:.3e}",
                s.m, s.n, s.k, c.failed, c.checked, c.normalized_error
            )?;
        }
        write!(f, "overall ({:?} output): {}", self.output, self.overall)?;
        let nan: usize = self.nan_expected.iter().sum();
        if nan > 0 {
            let first = self.nan_expected.iter().position(|&n| n > 0).unwrap_or(0);
            write!(
                f,
                "\nnote: the reference itself is NaN at {} (first in group {first}): the input holds NaN \
                 scales (e4m3 codes 0x7F/0xFF), and every product with one is NaN, so no output can \
                 match there",
                plural(nan, "element")
            )?;
        }
        Ok(())
    }
}

/// `n` and the noun, plural when `n` is not 1: "1 group", "2 groups".
pub fn plural(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// Compares given outputs with the CPU reference (fp64 accumulation, one rounding to the
/// output's type).
pub fn check_outputs(groups: &[Group], outputs: &Outputs, tol: Tolerance) -> Result<CheckReport, CliError> {
    let reference = reference_grouped_gemm_f64(groups)
        .map_err(|e| CliError::Invalid { name: "groups".into(), reason: e.to_string() })?;
    let shapes: Vec<GroupShape> = groups.iter().map(|g| GroupShape::new(g.m(), g.n(), g.k())).collect();
    let err = |e: nvfp4_format::FormatError| CliError::Invalid { name: "output".into(), reason: e.to_string() };
    // Round the fp64 reference once to the output's type, as the competition's reference does, and
    // compare each group and all groups together.
    fn compare_rounded<T: nvfp4_format::HostFloat>(
        reference: &[nvfp4_format::GroupOutput<f64>],
        got: &[Vec<T>],
        tol: Tolerance,
    ) -> Result<(Vec<Comparison>, Comparison), nvfp4_format::FormatError> {
        let expected: Vec<nvfp4_format::GroupOutput<T>> = reference.iter().map(|r| r.rounded()).collect();
        let per = got
            .iter()
            .zip(&expected)
            .map(|(g, e)| compare(std::slice::from_ref(g), std::slice::from_ref(e), tol))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((per, compare(got, &expected, tol)?))
    }
    let (per_group, overall) = match outputs {
        Outputs::F16(got) => compare_rounded(&reference, got, tol),
        Outputs::Bf16(got) => compare_rounded(&reference, got, tol),
    }
    .map_err(err)?;
    let nan_expected = reference.iter().map(|r| r.data.iter().filter(|x| x.is_nan()).count()).collect();
    Ok(CheckReport { output: outputs.output_type(), shapes, groups: per_group, overall, nan_expected })
}

/// `check <in> <out>`: reads both files and compares.
pub fn check(input: &Path, output: &Path, tol: Tolerance) -> Result<CheckReport, CliError> {
    let groups = file::read_groups(input)?;
    let outputs = file::read_outputs(output, &groups.shapes())?;
    check_outputs(&groups.groups, &outputs, tol)
}

/// The CPU reference of `groups` (exact products, fp64 sums) rounded once to `out_type`: what
/// `check` compares with.
pub fn reference_outputs(groups: &[Group], out_type: OutputType) -> Result<Outputs, CliError> {
    let err = |e: nvfp4_format::FormatError| CliError::Invalid { name: "groups".into(), reason: e.to_string() };
    let reference = reference_grouped_gemm_f64(groups).map_err(err)?;
    Ok(match out_type {
        OutputType::F16 => Outputs::F16(reference.iter().map(|r| r.rounded::<f16>().data).collect()),
        OutputType::Bf16 => Outputs::Bf16(reference.iter().map(|r| r.rounded::<bf16>().data).collect()),
    })
}

/// `ref <in> <out>`: writes the CPU reference of `input`'s groups in `run`'s output format; returns
/// the number of groups.
pub fn reference(input: &Path, output: &Path, out_type: OutputType) -> Result<usize, CliError> {
    let groups = file::read_groups(input)?;
    let outputs = reference_outputs(&groups.groups, out_type).map_err(|e| e.in_file(input))?;
    file::write_outputs(output, &outputs, &groups.shapes())?;
    Ok(groups.groups.len())
}

/// `gen <out>`: random groups of the given shapes (the competition's distribution or full
/// range), written with scales in `layout`.
pub fn generate(
    output: &Path,
    shapes: &[GroupShape],
    dist: InputDistribution,
    seed: u64,
    layout: ScaleLayout,
    alpha: f32,
) -> Result<(), CliError> {
    Problem::new(shapes.to_vec(), OutputType::F16)
        .map_err(|e| CliError::Invalid { name: "--shape".into(), reason: e.to_string() })?;
    if !alpha.is_finite() {
        return Err(CliError::Usage(format!("--alpha {alpha} is not finite")));
    }
    let mut groups = nvfp4_format::random_groups(shapes, dist, seed)
        .map_err(|e| CliError::Invalid { name: "--shape".into(), reason: e.to_string() })?;
    for g in &mut groups {
        g.alpha = alpha;
    }
    file::write_groups(output, &groups, layout)
}

/// Opens GPU 0, turning "no driver" and "wrong architecture" into [`CliError::NoGpu`].
pub fn open_gpu() -> Result<Gpu, CliError> {
    if !driver_present() {
        return Err(CliError::NoGpu(
            "no NVIDIA driver on this machine (libcuda.so.1 could not be loaded); `run` needs an sm_90a GPU \
             (H100/H200). `ref`, `check`, `gen` and `info` work without one."
                .into(),
        ));
    }
    Gpu::new(0).map_err(|e| match e {
        Error::NoDriver | Error::UnsupportedArch { .. } => CliError::NoGpu(e.to_string()),
        e => CliError::Gpu(e.to_string()),
    })
}

fn gpu_err(during: &'static str) -> impl Fn(cudarc::driver::DriverError) -> CliError {
    move |e| CliError::Gpu(format!("{during}: {e}"))
}

fn upload(stream: &Arc<CudaStream>, bytes: &[u8]) -> Result<CudaSlice<u8>, CliError> {
    if bytes.is_empty() {
        // A zero-length allocation has no address; empty groups are skipped by the kernels.
        return stream.alloc_zeros::<u8>(16).map_err(gpu_err("allocating"));
    }
    stream.clone_htod(bytes).map_err(gpu_err("uploading the inputs"))
}

struct DeviceGroup {
    a_values: CudaSlice<u8>,
    a_scales: CudaSlice<u8>,
    b_values: CudaSlice<u8>,
    b_scales: CudaSlice<u8>,
}

/// What `run` did.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// The device.
    pub device: String,
    /// The planner's choice.
    pub summary: nvfp4_gemm::PlanSummary,
    /// Groups computed.
    pub groups: usize,
    /// Milliseconds of the GEMM call (host clock around the call and a synchronize; first call,
    /// so it includes the parameter upload; not a benchmark).
    pub gemm_ms: f64,
}

impl fmt::Display for RunReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "device: {}", self.device)?;
        writeln!(f, "kernel: {}", self.summary.kernel)?;
        write!(
            f,
            "{}, {}, first call {:.3} ms (not a benchmark; see nvfp4-bench)",
            plural(self.groups, "group"),
            plural(self.summary.tiles, "tile"),
            self.gemm_ms
        )
    }
}

fn run_typed<T: DeviceRepr + ValidAsZeroBits + Copy>(
    stream: &Arc<CudaStream>,
    plan: &mut GemmPlan,
    inputs: &[DeviceGroup],
    groups: &[Group],
    wrap: for<'a> fn(&'a mut CudaSlice<T>) -> Output<'a>,
) -> Result<(Vec<Vec<T>>, f64), CliError> {
    let mut cs: Vec<CudaSlice<T>> = groups
        .iter()
        .map(|g| stream.alloc_zeros::<T>((g.m() * g.n()).max(8)).map_err(gpu_err("allocating C")))
        .collect::<Result<_, _>>()?;
    let start = Instant::now();
    {
        let mut args: Vec<GroupArgs> = inputs
            .iter()
            .zip(cs.iter_mut())
            .zip(groups)
            .map(|((d, c), g)| GroupArgs {
                a: Nvfp4Operand { values: &d.a_values, scales: &d.a_scales }.into(),
                b: Nvfp4Operand { values: &d.b_values, scales: &d.b_scales },
                c: wrap(c),
                alpha: g.effective_alpha_f32(),
            })
            .collect();
        plan.run(stream, &mut args).map_err(|e| CliError::Gpu(e.to_string()))?;
    }
    stream.synchronize().map_err(gpu_err("running the GEMM"))?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let out = cs
        .iter()
        .zip(groups)
        .map(|(c, g)| {
            let mut host = stream.clone_dtoh(c).map_err(gpu_err("downloading C"))?;
            host.truncate(g.m() * g.n());
            Ok(host)
        })
        .collect::<Result<_, CliError>>()?;
    Ok((out, ms))
}

/// Runs the GEMM on GPU 0 for the groups of `input`; returns the outputs.
pub fn compute(input: &GroupsFile, output: OutputType) -> Result<(Outputs, RunReport), CliError> {
    let shapes = input.shapes();
    let problem =
        Problem::new(shapes, output).map_err(|e| CliError::Invalid { name: "groups".into(), reason: e.to_string() })?;
    let gpu = open_gpu()?;
    let stream = gpu.context().default_stream();
    let mut plan = GemmPlan::new(&gpu, problem).map_err(|e| CliError::Gpu(e.to_string()))?;
    let inputs: Vec<DeviceGroup> = input
        .groups
        .iter()
        .map(|g| {
            Ok(DeviceGroup {
                a_values: upload(&stream, g.a.values())?,
                a_scales: upload(&stream, g.a.scales())?,
                b_values: upload(&stream, g.b.values())?,
                b_scales: upload(&stream, g.b.scales())?,
            })
        })
        .collect::<Result<_, CliError>>()?;
    let (outputs, ms) = match output {
        OutputType::F16 => {
            let (c, ms) = run_typed::<f16>(&stream, &mut plan, &inputs, &input.groups, |c| Output::F16(c))?;
            (Outputs::F16(c), ms)
        }
        OutputType::Bf16 => {
            let (c, ms) = run_typed::<bf16>(&stream, &mut plan, &inputs, &input.groups, |c| Output::Bf16(c))?;
            (Outputs::Bf16(c), ms)
        }
    };
    let report =
        RunReport { device: describe(&gpu), summary: plan.summary().clone(), groups: input.groups.len(), gemm_ms: ms };
    Ok((outputs, report))
}

/// `run <in> <out>`.
pub fn run(input: &Path, output: &Path, out_type: OutputType) -> Result<RunReport, CliError> {
    let groups = file::read_groups(input)?;
    let (outputs, report) = compute(&groups, out_type)?;
    file::write_outputs(output, &outputs, &groups.shapes())?;
    Ok(report)
}

/// One line about the device.
pub fn describe(gpu: &Gpu) -> String {
    format!("{} ({}, {} SMs)", gpu.name(), gpu.arch().name(), gpu.sm_count())
}

/// Whose planner `info` asks: the GPU's, or the CPU's for an architecture and SM count.
pub enum Planner<'a> {
    /// A plan on this GPU (the driver's occupancy answers included).
    Gpu(&'a Gpu),
    /// [`nvfp4_gemm::plan_summary`]: no GPU needed.
    Arch {
        /// The architecture.
        arch: Arch,
        /// Its SM count.
        sm_count: u32,
    },
}

impl Planner<'_> {
    fn summary(&self, problem: Problem) -> Result<PlanSummary, CliError> {
        match self {
            Planner::Gpu(gpu) => {
                Ok(GemmPlan::new(gpu, problem).map_err(|e| CliError::Gpu(e.to_string()))?.summary().clone())
            }
            Planner::Arch { arch, sm_count } => plan_summary(*arch, *sm_count, &problem)
                .map_err(|e| CliError::Invalid { name: "plan".into(), reason: e.to_string() }),
        }
    }
}

/// The planner's choice for one problem, as text.
pub fn plan_text(planner: &Planner<'_>, named: &NamedShapes, output: OutputType) -> Result<String, CliError> {
    let problem = Problem::new(named.shapes.clone(), output)
        .map_err(|e| CliError::Invalid { name: named.name.clone(), reason: e.to_string() })?;
    let (flops, bytes) = (problem.flops(), problem.bytes());
    let s = planner.summary(problem)?;
    let mut text = format!(
        "{}: {}\n  {:.3} GFLOP, {:.3} MB NVFP4 in + C out\n  kernel: {}\n  tiles: {}",
        named.name,
        named.to_spec(),
        flops / 1e9,
        bytes / 1e6,
        s.kernel,
        s.tiles,
    );
    for l in &s.launches {
        let g = l.geometry;
        text += &format!(
            "\n  {}: grid {} x block {} (cluster {}), {} B dynamic shared memory",
            l.kernel, g.grid, g.block, g.cluster, g.smem_bytes
        );
    }
    Ok(text)
}
