//! The kernels' own code on the CPU: the kernel crate built for the host (its `ptx` wrappers call
//! the device model, `nvfp4-gemm-model`), launched by the model on problems planned by the
//! library's own layout code (`nvfp4_gemm::layout`: work lists, group tables, tensor-map
//! descriptions, launch geometry), with the tensor maps encoded by the model instead of the driver.
//! The result is compared with the CPU reference (`nvfp4-format`), with C poisoned before the run
//! and guarded on both sides.
//!
//! Global memory is host memory: every "device buffer" is a 16-byte aligned host allocation
//! ([`DeviceBuf`]) whose address goes into the tables, as a device address would.
//!
//! A run either completes (then [`Outputs::check`] compares) or the model stops it with a
//! [`ModelError`]: the instruction, thread and kernel line, and the state of every barrier, warp
//! and in-flight asynchronous operation.

use half::{bf16, f16};
use nvfp4_format::{compare, Group, GroupOutput, GroupShape, HostFloat, InputDistribution, Tolerance};
use nvfp4_gemm::driver::launch::Start;
use nvfp4_gemm::driver::tensor_map::TiledMapEncoder;
use nvfp4_gemm::layout::{
    encode_tables, schedule_geometry, Launch, Layout, Sm100DeviceLayout, Sm100Layout, Sm90DeviceLayout, Sm90Layout,
    Tables, WorkList,
};
use nvfp4_gemm::moe::{validate_moe_buffers, GroupRows, MoeBuffers, MoeOptions, MoeTokens};
use nvfp4_gemm::problem::{BufferView, GroupBuffers};
use nvfp4_gemm::w4a16::Activations;
use nvfp4_gemm::{MoeProblem, SizeStatus, TokenKind};
use nvfp4_gemm::{OutputType, Problem};
use nvfp4_gemm_abi::launch::LaunchGeometry;
use nvfp4_gemm_abi::moe::schedule::Sm100ScheduleParams;
use nvfp4_gemm_abi::moe::sm90::Sm90ScheduleParams;
use nvfp4_gemm_abi::sm100::params::GroupParams as Sm100GroupParams;
use nvfp4_gemm_abi::sm100::params::{
    KernelLayout, KERNELS, N128_DEEP_KERNEL, N128_SHALLOW_KERNEL, N256_CLUSTER4_KERNEL,
};
use nvfp4_gemm_abi::sm100::{build_work_list, slots_per_m_tile, work_list_len, GroupShape as AbiGroupShape, WorkItem};
use nvfp4_gemm_abi::tensor_map::{TensorMap, TensorMapDataType, TensorMapSwizzle, TiledMap};
use nvfp4_gemm_abi::work::KernelParams;
use nvfp4_gemm_model::tensor_map::{encode_tiled, ElementType, Interleave, OobFill, Swizzle};
pub use nvfp4_gemm_model::{Arch, Completion, ErrorKind, LaunchConfig, ModelError, RunStats, Schedule, TmemPlacement};

/// Bit pattern written into C and its guards before a run: NaN in fp16 and bf16, so an element
/// the kernel never wrote fails the comparison.
pub const POISON: u16 = 0x7FFF;
/// Poisoned elements before and after each C buffer, checked untouched after the run.
pub const GUARD: usize = 64;
/// The bf16 check: one rounding to 8 significant bits (rtol 4e-3), atol as the competition's.
pub const BF16_TOLERANCE: Tolerance = Tolerance::new(1e-3, 4e-3);

/// The model's tensor-map encoder in place of `cuTensorMapEncodeTiled`: the library's map
/// descriptions become the model's 128-byte encoding, which its TMA decodes (and rejects loudly
/// where the driver would, or where the model does not implement a field).
#[derive(Debug, Clone, Copy, Default)]
pub struct ModelEncoder;

impl TiledMapEncoder for ModelEncoder {
    fn encode<const R: usize>(&self, map: &TiledMap<R>, base: u64) -> nvfp4_gemm::Result<TensorMap> {
        let (element, swizzle) = model_element_and_swizzle(map);
        encode_tiled(
            element,
            R,
            base,
            &map.dims,
            &map.strides_bytes[..R - 1],
            &map.box_dims,
            &[1; R],
            Interleave::None,
            swizzle,
            OobFill::Zero,
        )
        .map(TensorMap)
        .map_err(|e| nvfp4_gemm::Error::InvalidProblem(format!("model tensor map {map:?}: {e}")))
    }

    fn replace_address(&self, map: &mut TensorMap, base: u64) -> nvfp4_gemm::Result<()> {
        nvfp4_gemm_model::tensor_map::replace_address(&mut map.0, base)
            .map_err(|e| nvfp4_gemm::Error::InvalidProblem(format!("model tensor map at {base:#x}: {e}")))
    }
}

/// The model's names for a map's element type and swizzle (cuda.h's enums).
fn model_element_and_swizzle<const R: usize>(map: &TiledMap<R>) -> (ElementType, Swizzle) {
    let element = match map.element {
        TensorMapDataType::U8 => ElementType::U8,
        TensorMapDataType::F16 => ElementType::F16,
        TensorMapDataType::U4x16Align8B => ElementType::U4x16Align8,
    };
    let swizzle = match map.swizzle {
        TensorMapSwizzle::None => Swizzle::None,
        TensorMapSwizzle::B32 => Swizzle::B32,
        TensorMapSwizzle::B64 => Swizzle::B64,
        TensorMapSwizzle::B128 => Swizzle::B128,
    };
    (element, swizzle)
}

/// A 16-byte aligned host allocation standing in for a device buffer. Its address is taken once,
/// at creation; kernels write through it while the test holds no reference into it.
pub struct DeviceBuf {
    words: Vec<u128>,
    bytes: usize,
    addr: u64,
}

impl DeviceBuf {
    /// `bytes` zero bytes (at least 16 are allocated, as the library's placeholders).
    pub fn zeroed(bytes: usize) -> Self {
        let mut words = vec![0u128; bytes.max(16).div_ceil(16)];
        let addr = words.as_mut_ptr() as u64;
        DeviceBuf { words, bytes, addr }
    }

    /// A copy of `data`.
    pub fn from_bytes(data: &[u8]) -> Self {
        let mut b = Self::zeroed(data.len());
        b.bytes_mut()[..data.len()].copy_from_slice(data);
        b
    }

    /// The "device address".
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Its contents.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `bytes` initialized bytes; no launch is running.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.bytes) }
    }

    /// Its contents, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `bytes`.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr() as *mut u8, self.bytes) }
    }

    /// A view of `len` elements at the start, for the library's buffer validation.
    pub fn view(&self, len: usize) -> BufferView {
        BufferView { ptr: self.addr, len }
    }
}

/// The operands of a problem and its outputs (with guards), in "device" memory.
pub struct Operands {
    /// The problem's shapes and output type.
    pub problem: Problem,
    a_values: Vec<DeviceBuf>,
    a_scales: Vec<DeviceBuf>,
    b_values: Vec<DeviceBuf>,
    b_scales: Vec<DeviceBuf>,
    /// C of each group: `GUARD + m·n + GUARD` elements.
    c: Vec<DeviceBuf>,
    alphas: Vec<f32>,
}

impl Operands {
    /// Copies the groups' operands and allocates poisoned outputs.
    pub fn new(groups: &[Group], out: OutputType) -> Self {
        let shapes: Vec<GroupShape> = groups.iter().map(|g| GroupShape::new(g.m(), g.n(), g.k())).collect();
        let problem = Problem::new(shapes, out).expect("a valid problem");
        let mut o = Operands {
            problem,
            a_values: groups.iter().map(|g| DeviceBuf::from_bytes(g.a.values())).collect(),
            a_scales: groups.iter().map(|g| DeviceBuf::from_bytes(g.a.scales())).collect(),
            b_values: groups.iter().map(|g| DeviceBuf::from_bytes(g.b.values())).collect(),
            b_scales: groups.iter().map(|g| DeviceBuf::from_bytes(g.b.scales())).collect(),
            c: groups.iter().map(|g| DeviceBuf::zeroed(2 * (g.m() * g.n() + 2 * GUARD))).collect(),
            alphas: groups.iter().map(|g| g.effective_alpha_f32()).collect(),
        };
        o.poison();
        o
    }

    /// Writes [`POISON`] over every C and its guards.
    pub fn poison(&mut self) {
        for c in &mut self.c {
            for pair in c.bytes_mut().chunks_exact_mut(2) {
                pair.copy_from_slice(&POISON.to_le_bytes());
            }
        }
    }

    /// The library's view of the buffers (C past its leading guard), validated as the library
    /// validates a call's buffers.
    pub fn buffers(&self) -> Vec<GroupBuffers> {
        let b: Vec<GroupBuffers> = self
            .problem
            .groups()
            .iter()
            .enumerate()
            .map(|(g, s)| GroupBuffers {
                a_kind: TokenKind::Nvfp4,
                a_values: self.a_values[g].view(self.a_values[g].bytes),
                a_scales: self.a_scales[g].view(self.a_scales[g].bytes),
                b_values: self.b_values[g].view(self.b_values[g].bytes),
                b_scales: self.b_scales[g].view(self.b_scales[g].bytes),
                c: BufferView { ptr: self.c[g].addr() + 2 * GUARD as u64, len: s.m * s.n },
                c_type: self.problem.output(),
                alpha: self.alphas[g],
            })
            .collect();
        nvfp4_gemm::problem::validate_buffers(&self.problem, &b).expect("valid buffers");
        b
    }

    /// C of every group (bit patterns), and the number of guard elements that changed.
    pub fn outputs(&self) -> Outputs {
        let mut guard_corruptions = 0;
        let c = self
            .c
            .iter()
            .map(|c| {
                let all: Vec<u16> = c.bytes().chunks_exact(2).map(|p| u16::from_le_bytes([p[0], p[1]])).collect();
                let n = all.len();
                guard_corruptions += all[..GUARD].iter().chain(&all[n - GUARD..]).filter(|&&x| x != POISON).count();
                all[GUARD..n - GUARD].to_vec()
            })
            .collect();
        Outputs { c, guard_corruptions, out: self.problem.output() }
    }
}

/// What a run left in C.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outputs {
    /// Each group's C, row-major bit patterns.
    pub c: Vec<Vec<u16>>,
    /// Guard elements around the C buffers that changed.
    pub guard_corruptions: usize,
    /// The element type.
    pub out: OutputType,
}

impl Outputs {
    /// Compares with the CPU reference rounded to the output type (competition tolerance for
    /// fp16, [`BF16_TOLERANCE`] for bf16) and checks the guards; `Err` says what failed.
    pub fn check(&self, groups: &[Group]) -> Result<(), String> {
        if self.guard_corruptions > 0 {
            return Err(format!("{} guard elements around C were written", self.guard_corruptions));
        }
        let exact = nvfp4_format::reference_grouped_gemm_f64(groups).map_err(|e| e.to_string())?;
        match self.out {
            OutputType::F16 => self.compare::<f16>(&exact, Tolerance::COMPETITION, f16::from_bits),
            OutputType::Bf16 => self.compare::<bf16>(&exact, BF16_TOLERANCE, bf16::from_bits),
        }
    }

    fn compare<T: HostFloat>(
        &self,
        exact: &[GroupOutput<f64>],
        tol: Tolerance,
        from_bits: fn(u16) -> T,
    ) -> Result<(), String> {
        let got: Vec<Vec<T>> = self.c.iter().map(|g| g.iter().map(|&b| from_bits(b)).collect()).collect();
        let expected: Vec<GroupOutput<T>> = exact.iter().map(GroupOutput::rounded).collect();
        let c = compare(&got, &expected, tol).map_err(|e| e.to_string())?;
        if c.passed() {
            return Ok(());
        }
        // The first few failing elements, for the report.
        let mut lines = vec![c.to_string()];
        'outer: for (g, (x, e)) in got.iter().zip(&expected).enumerate() {
            for (i, (x, e)) in x.iter().zip(&e.data).enumerate() {
                if !tol.accepts(x.to_f64(), e.to_f64()) {
                    lines.push(format!(
                        "  group {g} row {} col {}: got {} expected {}",
                        i / expected[g].cols.max(1),
                        i % expected[g].cols.max(1),
                        x.to_f64(),
                        e.to_f64()
                    ));
                    if lines.len() > 8 {
                        break 'outer;
                    }
                }
            }
        }
        Err(lines.join("\n"))
    }
}

/// The model's choices for every launch of a run.
#[derive(Clone, Copy, Debug)]
pub struct ModelRun {
    /// Scheduling and completion order.
    pub schedule: Schedule,
    /// Where `tcgen05.alloc` places columns.
    pub tmem: TmemPlacement,
    /// What shared memory holds before it is written (`LaunchConfig::smem_fill`).
    pub smem_fill: u8,
}

impl Default for ModelRun {
    fn default() -> Self {
        ModelRun { schedule: Schedule::default(), tmem: TmemPlacement::Highest, smem_fill: 0xA5 }
    }
}

impl ModelRun {
    /// The default run with completions in `order`, seeded by `seed`.
    pub fn ordered(order: Completion, seed: u64) -> Self {
        ModelRun { schedule: Schedule { seed, completion: order, ..Schedule::default() }, ..Self::default() }
    }
}

/// The model's launch of a library [`LaunchGeometry`].
pub fn launch_config(arch: Arch, g: LaunchGeometry, ctas_per_sm: u32, run: &ModelRun) -> LaunchConfig {
    let mut cfg =
        LaunchConfig::new(arch, g.grid, g.block, g.smem_bytes).with_cluster(g.cluster).with_schedule(run.schedule);
    cfg.ctas_per_sm = ctas_per_sm;
    cfg.tmem_placement = run.tmem;
    cfg.smem_fill = run.smem_fill;
    cfg
}

/// What one launch of a run did.
#[derive(Clone, Debug)]
pub struct Launched {
    /// The kernel's name.
    pub kernel: &'static str,
    /// Its geometry.
    pub geometry: LaunchGeometry,
    /// The model's counters.
    pub stats: RunStats,
}

/// A model failure, with the kernel it stopped.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The kernel that failed.
    pub kernel: &'static str,
    /// The model's report.
    pub error: ModelError,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed in the model: {}", self.kernel, self.error)
    }
}

fn launch_one(
    kernel: &'static str,
    cfg: &LaunchConfig,
    geometry: LaunchGeometry,
    params: KernelParams,
    entry: unsafe fn(KernelParams),
) -> Result<Launched, Failure> {
    // SAFETY: the tables `params` points to live for the launch and are what the library's layout
    // code computes for validated buffers; the model checks every device access.
    nvfp4_gemm_model::launch(cfg, || unsafe { entry(params) })
        .map(|stats| Launched { kernel, geometry, stats })
        .map_err(|error| Failure { kernel, error })
}

/// The register count an sm_90a kernel is launched with (its `.maxnreg`, from the abi's table), so
/// that the model checks its `setmaxnreg` requests against the CTA's pool.
pub fn sm90_registers(kernel: &str) -> u32 {
    nvfp4_gemm_abi::sm90::REGISTER_CAPS.iter().find(|(name, _)| *name == kernel).map_or(0, |&(_, r)| r)
}

/// Runs both sm_90a kernels on `ops` as [`Sm90Layout`] plans them for `sm_count` SMs.
pub fn run_sm90(ops: &Operands, sm_count: u32, run: &ModelRun) -> Result<Vec<Launched>, Failure> {
    run_sm90_layout(ops, Sm90Layout::new(&ops.problem, sm_count), run)
}

/// Runs both sm_90a kernels on `ops` with the GEMM variant `config` (`Sm90Layout::with_config`).
pub fn run_sm90_with(
    ops: &Operands,
    sm_count: u32,
    config: nvfp4_gemm_abi::sm90::GemmConfig,
    run: &ModelRun,
) -> Result<Vec<Launched>, Failure> {
    let layout = Sm90Layout::with_config(&ops.problem, sm_count, config).expect("the variant runs the problem");
    run_sm90_layout(ops, layout, run)
}

fn run_sm90_layout(ops: &Operands, layout: Sm90Layout, run: &ModelRun) -> Result<Vec<Launched>, Failure> {
    assert_eq!(layout.problem, ops.problem, "the layout plans the operands' problem");
    let buffers = ops.buffers();
    run_sm90_host_sized(&layout, &buffers, run)
}

/// Runs every launch of a host-sized sm_90a `layout` (`sm90_dequant_tokens` when its tokens are
/// NVFP4, then the GEMM) on `buffers`, over plan memory and tables as the library's plan engine
/// lays them out ([`PlanTables`]).
fn run_sm90_host_sized(
    layout: &Sm90Layout,
    buffers: &[GroupBuffers],
    run: &ModelRun,
) -> Result<Vec<Launched>, Failure> {
    let tables = PlanTables::new(layout, buffers);
    let workspace = (tables.workspace.addr(), layout.workspace_bytes as u64);
    let mut launched = vec![];
    for l in plan_launches(layout, buffers, &tables) {
        let gemm = l.kernel != nvfp4_gemm_abi::sm90::DEQUANT_KERNEL;
        // The GEMM is the variant the layout chose (the decode one when every group has at most
        // 16 tokens), with its CTAs per SM and register cap.
        let ctas_per_sm = if gemm { layout.config.ctas_per_sm() } else { 1 };
        let mut cfg = launch_config(Arch::Sm90a, l.geometry, ctas_per_sm, run);
        if gemm {
            cfg.registers = sm90_registers(l.kernel);
            if l.start == Start::Early {
                // As the library launches it: the GEMM may start while the token dequantization
                // still writes the workspace.
                cfg.predecessor_writes = vec![workspace];
            }
        }
        launched.push(launch_one(l.kernel, &cfg, l.geometry, kernel_params_of(&l), sm90_entry(l.kernel))?);
    }
    drop(tables);
    Ok(launched)
}

/// `layout`'s launches of `call` over `tables`, as the plan engine makes them.
pub fn plan_launches<L: Layout>(layout: &L, call: &L::Call, tables: &PlanTables<L::Group>) -> Vec<Launch> {
    let mut launches = vec![];
    layout.launches(Some(call), &tables.addresses(), &mut launches);
    launches
}

/// The [`KernelParams`] of a launch that takes them (every GEMM and the dequantization).
fn kernel_params_of(l: &Launch) -> KernelParams {
    l.params
        .get::<KernelParams>()
        .unwrap_or_else(|| panic!("{}: parameters of another type ({:?})", l.kernel, l.params))
}

/// `problem` with W4A16's `activations` as its tokens (the same shapes and output).
pub fn w4a16_problem(problem: &Problem, activations: Activations) -> Problem {
    Problem::with_tokens(problem.groups().to_vec(), problem.output(), TokenKind::Dense(activations))
        .expect("a valid W4A16 problem")
}

/// Runs the sm_90a W4A16 GEMM (f16 activations, `nvfp4_gemm::w4a16`) on `ops` as its layout
/// plans it for `sm_count` SMs: each group's activations are its A with the block scales applied
/// (exact in f16; A's global scale stays in the group's alpha), its weights B prepacked. The
/// result compares with the same reference as W4A4's ([`Outputs::check`]).
pub fn run_sm90_w4a16(ops: &Operands, sm_count: u32, run: &ModelRun) -> Result<Vec<Launched>, Failure> {
    run_sm90_w4a16_typed(ops, Sm90Layout::new(&w4a16_problem(&ops.problem, Activations::F16), sm_count), run)
}

/// [`run_sm90_w4a16`] with the variant `config` whatever the cost model prefers.
pub fn run_sm90_w4a16_with(
    ops: &Operands,
    sm_count: u32,
    config: nvfp4_gemm_abi::sm90::GemmConfig,
    run: &ModelRun,
) -> Result<Vec<Launched>, Failure> {
    let problem = w4a16_problem(&ops.problem, Activations::F16);
    let layout = Sm90Layout::with_config(&problem, sm_count, config).expect("the variant runs the problem");
    run_sm90_w4a16_typed(ops, layout, run)
}

/// [`run_sm90_w4a16`] on `layout`, a layout of `ops`' shapes with W4A16 tokens
/// ([`w4a16_problem`]) of either type (bf16: A with its block scales applied as bf16, also exact,
/// and B prepacked for bf16).
pub fn run_sm90_w4a16_typed(ops: &Operands, layout: Sm90Layout, run: &ModelRun) -> Result<Vec<Launched>, Failure> {
    use nvfp4_format::Nvfp4Matrix;
    use nvfp4_gemm::w4a16::prepack;
    let problem = &layout.problem;
    let TokenKind::Dense(activations) = problem.tokens() else { panic!("not a W4A16 layout: {:?}", problem.tokens()) };
    assert_eq!(
        (problem.groups(), problem.output()),
        (ops.problem.groups(), ops.problem.output()),
        "the layout plans the operands' shapes"
    );
    let matrix = |rows: usize, k: usize, v: &DeviceBuf, s: &DeviceBuf| {
        Nvfp4Matrix::new(rows, k, v.bytes()[..rows * k / 2].to_vec(), s.bytes().to_vec(), 1.0).expect("an operand")
    };
    let (mut tokens_bufs, mut b_values, mut b_scales) = (vec![], vec![], vec![]);
    for (g, s) in problem.groups().iter().enumerate() {
        let act = if s.m == 0 {
            vec![]
        } else {
            dense_bytes(&matrix(s.m, s.k, &ops.a_values[g], &ops.a_scales[g]), activations)
        };
        tokens_bufs.push(if act.is_empty() { DeviceBuf::zeroed(16) } else { DeviceBuf::from_bytes(&act) });
        let w = prepack(&matrix(s.n, s.k, &ops.b_values[g], &ops.b_scales[g]), activations).expect("prepack");
        b_values.push(DeviceBuf::from_bytes(&w.values));
        b_scales.push(DeviceBuf::from_bytes(&w.scales));
    }
    // A W4A16 call's buffers: the activations as A (16-bit elements, no scales), the prepacked
    // weights as B, validated as the library validates them.
    let mut buffers = ops.buffers();
    for (g, (b, s)) in buffers.iter_mut().zip(problem.groups()).enumerate() {
        b.a_kind = problem.tokens();
        b.a_values = tokens_bufs[g].view(s.m * s.k);
        b.a_scales = BufferView { ptr: 0, len: 0 };
        b.b_values = b_values[g].view(b_values[g].bytes);
        b.b_scales = b_scales[g].view(b_scales[g].bytes);
    }
    nvfp4_gemm::problem::validate_buffers(problem, &buffers).expect("valid W4A16 buffers");
    let launched = run_sm90_host_sized(&layout, &buffers, run)?;
    assert!(
        launched.iter().all(|l| l.kernel == layout.gemm_kernel()),
        "a W4A16 call runs its GEMM alone: {:?}",
        launched.iter().map(|l| l.kernel).collect::<Vec<_>>()
    );
    drop((tokens_bufs, b_values, b_scales));
    Ok(launched)
}

/// The little-endian bytes of `a`'s elements with their block scales applied (no global scale) as
/// `activations` (both exact).
fn dense_bytes(a: &nvfp4_format::Nvfp4Matrix, activations: Activations) -> Vec<u8> {
    match activations {
        Activations::F16 => a.dequantize_block_scaled_f16().iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        Activations::Bf16 => a.dequantize_block_scaled_bf16().iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
    }
}

/// The entry point of an sm_100a variant.
pub fn sm100_entry(kernel: KernelLayout) -> unsafe fn(KernelParams) {
    use nvfp4_gemm_kernel::sm100::gemm::*;
    if kernel == N128_DEEP_KERNEL {
        sm100_gemm_n128_deep
    } else if kernel == N128_SHALLOW_KERNEL {
        sm100_gemm_n128_shallow
    } else if kernel == N256_CLUSTER4_KERNEL {
        sm100_gemm_n256_cluster4
    } else {
        panic!("no entry point for {kernel:?}")
    }
}

/// How many CTAs of each sm_100a variant are resident on the modelled device (what the library
/// asks the driver's occupancy calculator): decides the variant of the 128-wide list
/// (`select_n128`) and the persistent grids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Residency {
    /// Of `sm100_gemm_n128_deep` (one per SM).
    pub deep: u32,
    /// Of `sm100_gemm_n128_shallow` (two per SM).
    pub shallow: u32,
    /// Of `sm100_gemm_n256_cluster4` (a multiple of 4).
    pub cluster4: u32,
}

impl Residency {
    /// `sms` SMs: `sms` deep CTAs, none of the shallow kernel (so the deep one runs),
    /// `sms / 4` clusters.
    pub const fn deep(sms: u32) -> Self {
        Residency { deep: sms, shallow: 0, cluster4: sms / 4 * 4 }
    }

    /// `sms` SMs with two shallow CTAs each (the shallow kernel runs past two waves of the deep).
    pub const fn shallow(sms: u32) -> Self {
        Residency { deep: sms, shallow: 2 * sms, cluster4: sms / 4 * 4 }
    }

    /// Resident CTAs of kernel `k`.
    pub fn of(self, k: KernelLayout) -> u32 {
        if k == N128_DEEP_KERNEL {
            self.deep
        } else if k == N128_SHALLOW_KERNEL {
            self.shallow
        } else {
            self.cluster4
        }
    }
}

/// Runs the sm_100a launches of `ops` as [`Sm100Layout`] plans them on a device with
/// `residency`; returns what ran.
pub fn run_sm100(ops: &Operands, residency: Residency, run: &ModelRun) -> Result<Vec<Launched>, Failure> {
    run_sm100_with(ops, residency, run, |_| {})
}

/// [`run_sm100`] with the layout changed by `edit` before the tables are written (to model a host
/// bug the kernels must survive or report).
pub fn run_sm100_with(
    ops: &Operands,
    residency: Residency,
    run: &ModelRun,
    edit: impl FnOnce(&mut Sm100Layout),
) -> Result<Vec<Launched>, Failure> {
    let mut layout = Sm100Layout::new(&ops.problem, |k| residency.of(k)).expect("sm100 layout");
    edit(&mut layout);
    let buffers = ops.buffers();
    let tables = PlanTables::new(&layout, &buffers[..]);
    let mut launched = vec![];
    for l in plan_launches(&layout, &buffers[..], &tables) {
        let kernel = sm100_kernel(l.kernel);
        let cfg = launch_config(Arch::Sm100a, l.geometry, kernel.config().max_ctas_per_sm(), run);
        launched.push(launch_one(l.kernel, &cfg, l.geometry, kernel_params_of(&l), sm100_entry(kernel))?);
    }
    drop(tables);
    Ok(launched)
}

/// The sm_100a GEMM variant exported as `name`.
pub fn sm100_kernel(name: &str) -> KernelLayout {
    KERNELS.into_iter().find(|k| k.kernel_name() == name).unwrap_or_else(|| panic!("no sm_100a GEMM kernel {name}"))
}

/// Random groups of `shapes` (competition distribution unless `dist` says otherwise).
pub fn groups(shapes: &[GroupShape], dist: InputDistribution, seed: u64) -> Vec<Group> {
    let mut g = nvfp4_format::random_groups(shapes, dist, seed).expect("generate");
    if dist == InputDistribution::FullRange {
        for x in &mut g {
            x.alpha = 1.0 / 65536.0;
        }
    }
    g
}

/// Groups from per-group lists of M, N and K.
pub fn z(m: &[usize], n: &[usize], k: &[usize]) -> Vec<GroupShape> {
    GroupShape::zip(m, n, k).expect("equal lengths")
}

/// Runs `f` (one architecture's runner) on `groups`, checks C, and panics with the model's report
/// or the comparison on failure. Returns what ran.
pub fn run_and_check(
    name: &str,
    groups: &[Group],
    out: OutputType,
    run: &ModelRun,
    f: impl Fn(&Operands, &ModelRun) -> Result<Vec<Launched>, Failure>,
) -> Vec<Launched> {
    let ops = Operands::new(groups, out);
    let t = std::time::Instant::now();
    let launched = f(&ops, run).unwrap_or_else(|e| panic!("{name}: {e}"));
    let outputs = ops.outputs();
    if let Err(e) = outputs.check(groups) {
        panic!("{name}: wrong result after {:?}:\n{e}", launched.iter().map(|l| l.kernel).collect::<Vec<_>>());
    }
    eprintln!(
        "{name}: ok in {:.2?} ({})",
        t.elapsed(),
        launched
            .iter()
            .map(|l| format!(
                "{} grid {}x{} cluster {}: {} instr, {} switches, {} async",
                l.kernel,
                l.geometry.grid,
                l.geometry.block,
                l.geometry.cluster,
                l.stats.instructions,
                l.stats.switches,
                l.stats.async_completed
            ))
            .collect::<Vec<_>>()
            .join("; ")
    );
    launched
}

/// A random problem of 1..=`max_groups` groups: M in `0..=max_m` (0 now and then), N = 8·odd up
/// to `max_n`, K a multiple of 64 up to `max_k` — the tails the kernels must handle.
pub fn random_shapes(seed: u64, max_groups: usize, max_m: usize, max_n: usize, max_k: usize) -> Vec<GroupShape> {
    let mut rng = nvfp4_format::SplitMix64::new(seed);
    let count = 1 + rng.below(max_groups as u64) as usize;
    (0..count)
        .map(|_| {
            let m = if rng.below(8) == 0 { 0 } else { 1 + rng.below(max_m as u64) as usize };
            let n = 8 * (2 * rng.below((max_n / 16) as u64) as usize + 1);
            let k = 64 * (1 + rng.below((max_k / 64) as u64) as usize);
            GroupShape::new(m, n, k)
        })
        .collect()
}

/// A device-sized (mixture-of-experts) problem in "device" memory: the sizes array, one token
/// tensor A in the problem's layout (each group's rows and block scales where
/// `nvfp4_gemm_abi::moe` puts them), each group's weights, and one poisoned C of `token_rows`
/// rows with guards. The reference groups are the groups after clamping: group `g`'s A is the
/// token rows the device assigns it.
pub struct MoeOperands {
    /// The problem (bounds, N, K, output).
    pub problem: MoeProblem,
    /// The sizes as the host wrote them (offsets or counts, possibly beyond the bounds).
    pub sizes: Vec<u32>,
    /// Each group's rows after clamping, and the status bits the device must raise.
    pub rows: Vec<GroupRows>,
    /// See [`Self::rows`].
    pub status: SizeStatus,
    /// The groups the reference multiplies (A: `rows[g].rows` rows).
    pub groups: Vec<Group>,
    sizes_buf: DeviceBuf,
    a_values: DeviceBuf,
    a_scales: DeviceBuf,
    b_values: Vec<DeviceBuf>,
    b_scales: Vec<DeviceBuf>,
    /// `GUARD + token_rows · n + GUARD` elements.
    c: DeviceBuf,
}

impl MoeOperands {
    /// Random groups (competition distribution, `seed`) for `sizes`, placed in the problem's
    /// layout. With overlapping groups (decreasing offsets) a later group's rows overwrite an
    /// earlier one's, and [`Self::overlapping`] is true.
    pub fn new(problem: MoeProblem, sizes: Vec<u32>, seed: u64) -> Self {
        let (rows, status) = problem.group_rows(&sizes).expect("sizes of the right length");
        let (n, k) = (problem.n(), problem.k());
        let shapes: Vec<GroupShape> = rows.iter().map(|r| GroupShape::new(r.rows as usize, n, k)).collect();
        let groups = groups(&shapes, InputDistribution::Competition, seed);
        let a = problem.a_sizes();
        let mut a_values = DeviceBuf::zeroed(a.values);
        let mut a_scales = DeviceBuf::zeroed(a.scales);
        for (r, g) in rows.iter().zip(&groups) {
            if r.rows == 0 {
                continue;
            }
            // Values: row `first + i` at `(first + i) · K/2`. Scales: the group's blocked scales
            // (whole 128-row blocks) from scale row `scale_first` (a multiple of 128) on.
            let v = r.first as usize * k / 2;
            a_values.bytes_mut()[v..v + g.a.values().len()].copy_from_slice(g.a.values());
            let s = r.scale_first as usize * k / 16;
            a_scales.bytes_mut()[s..s + g.a.scales().len()].copy_from_slice(g.a.scales());
        }
        let sizes_buf = DeviceBuf::from_bytes(&sizes.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
        let mut ops = MoeOperands {
            b_values: groups.iter().map(|g| DeviceBuf::from_bytes(g.b.values())).collect(),
            b_scales: groups.iter().map(|g| DeviceBuf::from_bytes(g.b.scales())).collect(),
            c: DeviceBuf::zeroed(2 * (problem.c_elements() + 2 * GUARD)),
            problem,
            sizes,
            rows,
            status,
            groups,
            sizes_buf,
            a_values,
            a_scales,
        };
        for pair in ops.c.bytes_mut().chunks_exact_mut(2) {
            pair.copy_from_slice(&POISON.to_le_bytes());
        }
        ops
    }

    /// Whether two non-empty groups share token rows (decreasing offsets): their results are
    /// unspecified.
    pub fn overlapping(&self) -> bool {
        let mut r: Vec<(u32, u32)> = self.rows.iter().filter(|r| r.rows > 0).map(|r| (r.first, r.rows)).collect();
        r.sort();
        r.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0)
    }

    /// The library's view of the buffers, validated as `MoePlan::run` validates them.
    pub fn buffers(&self) -> MoeBuffers {
        let b = MoeBuffers {
            sizes: self.sizes_buf.view(self.sizes.len()),
            a: MoeTokens::Nvfp4 {
                values: self.a_values.view(self.a_values.bytes),
                scales: self.a_scales.view(self.a_scales.bytes),
            },
            weights: self
                .b_values
                .iter()
                .zip(&self.b_scales)
                .map(|(v, s)| (v.view(v.bytes), s.view(s.bytes)))
                .collect(),
            alphas: self.groups.iter().map(|g| g.effective_alpha_f32()).collect(),
            c: BufferView { ptr: self.c.addr() + 2 * GUARD as u64, len: self.problem.c_elements() },
            c_type: self.problem.output(),
            activated: None,
        };
        validate_moe_buffers(&self.problem, &b).expect("valid buffers");
        b
    }

    /// Checks C: each group's rows against the reference (unless groups overlap), every row of
    /// no group still poisoned, the guards untouched.
    pub fn check(&self) -> Result<(), String> {
        let all: Vec<u16> = self.c.bytes().chunks_exact(2).map(|p| u16::from_le_bytes([p[0], p[1]])).collect();
        let len = all.len();
        let guard_corruptions = all[..GUARD].iter().chain(&all[len - GUARD..]).filter(|&&x| x != POISON).count();
        let c = &all[GUARD..len - GUARD];
        let n = self.problem.n();
        let mut owned = vec![false; self.problem.token_rows()];
        for r in &self.rows {
            owned[r.first as usize..(r.first + r.rows) as usize].iter_mut().for_each(|o| *o = true);
        }
        let stray =
            owned.iter().enumerate().filter(|(row, o)| !**o && c[row * n..(row + 1) * n].iter().any(|&x| x != POISON));
        let stray: Vec<usize> = stray.map(|(row, _)| row).collect();
        if !stray.is_empty() {
            return Err(format!("rows of no group were written: {stray:?}"));
        }
        if self.overlapping() {
            return if guard_corruptions > 0 {
                Err(format!("{guard_corruptions} guard elements written"))
            } else {
                Ok(())
            };
        }
        let per_group =
            self.rows.iter().map(|r| c[r.first as usize * n..(r.first + r.rows) as usize * n].to_vec()).collect();
        Outputs { c: per_group, guard_corruptions, out: self.problem.output() }.check(&self.groups)
    }
}

/// W4A16's inputs for a [`MoeOperands`] ([`MoeOperands::w4a16_inputs`]).
pub struct W4a16MoeInputs {
    activations: DeviceBuf,
    kind: Activations,
    weights: Vec<(DeviceBuf, DeviceBuf)>,
}

impl MoeOperands {
    /// W4A16's inputs for these operands with `kind` activations: the activations
    /// `[token_rows, K]` — each group's A with its block scales applied (exact in f16 and bf16;
    /// A's global scale stays in alpha) at the group's rows, later groups over earlier ones as in
    /// A, every other row NaN (tiles that read a row of no group must not spread it into a group's
    /// rows) — and each group's weights prepacked for them.
    pub fn w4a16_inputs(&self, kind: Activations) -> W4a16MoeInputs {
        let k = self.problem.k();
        // NaN's bits in both types.
        let mut bytes = [0xFFu8, 0x7F].repeat(self.problem.token_rows() * k);
        for (r, g) in self.rows.iter().zip(&self.groups) {
            if r.rows > 0 {
                let first = 2 * r.first as usize * k;
                bytes[first..first + 2 * r.rows as usize * k].copy_from_slice(&dense_bytes(&g.a, kind));
            }
        }
        let weights = self
            .groups
            .iter()
            .map(|g| {
                let w = nvfp4_gemm::w4a16::prepack(&g.b, kind).expect("prepack");
                (DeviceBuf::from_bytes(&w.values), DeviceBuf::from_bytes(&w.scales))
            })
            .collect();
        W4a16MoeInputs { activations: DeviceBuf::from_bytes(&bytes), kind, weights }
    }

    /// [`Self::buffers`] with W4A16's `inputs`: the activations as A, the prepacked weights.
    pub fn w4a16_buffers(&self, inputs: &W4a16MoeInputs) -> MoeBuffers {
        let act = &inputs.activations;
        let b = MoeBuffers {
            a: MoeTokens::Dense { activations: act.view(act.bytes / 2), kind: inputs.kind },
            weights: inputs.weights.iter().map(|(v, s)| (v.view(v.bytes), s.view(s.bytes))).collect(),
            ..self.buffers()
        };
        validate_moe_buffers(&self.w4a16_problem(inputs.kind), &b).expect("valid buffers");
        b
    }

    /// The problem with W4A16's `kind` activations as its tokens (the same bounds, N, K and
    /// output).
    pub fn w4a16_problem(&self, kind: Activations) -> MoeProblem {
        self.problem.clone().with_tokens(TokenKind::Dense(kind))
    }
}

/// What a scheduler wrote, read back after its launch.
#[derive(Clone, Debug)]
pub struct ScheduleOutcome<G> {
    /// The group table (host fields and the scheduler's).
    pub groups: Vec<G>,
    /// The work list of the launch that got the call, `work_len` items.
    pub work: Vec<WorkItem>,
    /// The work length of the launch that got the call (the other's is 0).
    pub work_len: u32,
    /// The work-length words of both launches (sm_90a: `[decode, general]`; sm_100a: the first).
    pub work_lens: [u32; 2],
    /// The status word (it was 0 before).
    pub status: u32,
}

/// A plan's memory (either architecture, host- or device-sized) in "device" memory, laid out as
/// the library's plan engine asks for it (`Layout::memory`): the group table and maps as
/// `encode_tables` writes them for the call (with the model's encoder: the maps no call changes,
/// then the call's group entries and map addresses), the work lists (host-built ones as the layout
/// gives them; a list a scheduler writes filled with `u32::MAX` so that unwritten items show),
/// the work-length and status words, the scheduler's scratch and the sm_90a token workspace.
pub struct PlanTables<G> {
    /// The group table.
    pub groups: Vec<G>,
    /// The tensor maps.
    pub maps: Vec<TensorMap>,
    work: [DeviceBuf; 2],
    work_len: DeviceBuf,
    status: DeviceBuf,
    ranks: DeviceBuf,
    /// sm_90a: the f16 token workspace.
    pub workspace: DeviceBuf,
}

/// The tables of a device-sized plan.
pub type MoeTables<G> = PlanTables<G>;

impl<G: Copy + Default> PlanTables<G> {
    /// The memory `layout` asks for, its tables encoded for `call`.
    pub fn new<L: Layout<Group = G>>(layout: &L, call: &L::Call) -> Self {
        let memory = layout.memory();
        let work = [0, 1].map(|i| match &memory.work[i] {
            WorkList::Items(items) => DeviceBuf::from_bytes(items),
            WorkList::Capacity(bytes) => {
                let mut list = DeviceBuf::zeroed((*bytes).max(16));
                list.bytes_mut().fill(0xff);
                list
            }
            WorkList::None => DeviceBuf::zeroed(16),
        });
        let mut tables = PlanTables {
            // Allocated before the encoding, so that the addresses it is given are final.
            groups: vec![G::default(); memory.groups],
            maps: vec![TensorMap::ZERO; memory.maps],
            work,
            work_len: DeviceBuf::zeroed(8),
            status: DeviceBuf::zeroed(4),
            ranks: DeviceBuf::zeroed(4 * memory.ranks.max(1)),
            workspace: DeviceBuf::zeroed(memory.workspace_bytes.max(16)),
        };
        let (groups, maps) =
            encode_tables(layout, &ModelEncoder, call, &tables.addresses()).expect("the plan's tables");
        assert_eq!((groups.len(), maps.len()), (memory.groups, memory.maps), "tables of the sizes `memory` gives");
        tables.groups.copy_from_slice(&groups);
        tables.maps.copy_from_slice(&maps);
        tables
    }
}

impl<G: Copy> PlanTables<G> {
    /// Their addresses.
    pub fn addresses(&self) -> Tables {
        Tables {
            groups: self.groups.as_ptr() as u64,
            maps: self.maps.as_ptr() as u64,
            work: [self.work[0].addr(), self.work[1].addr()],
            work_len: [self.work_len.addr(), self.work_len.addr() + 4],
            status: self.status.addr(),
            ranks: self.ranks.addr(),
            workspace: self.workspace.addr(),
        }
    }

    /// What the scheduler wrote.
    pub fn outcome(&self) -> ScheduleOutcome<G> {
        let word = |b: &[u8], i: usize| u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap());
        let work_lens = [word(self.work_len.bytes(), 0), word(self.work_len.bytes(), 1)];
        let work_len = work_lens[0].max(work_lens[1]);
        let items: Vec<WorkItem> = self.work[0]
            .bytes()
            .chunks_exact(12)
            .take(work_len as usize)
            .map(|c| WorkItem { group: word(c, 0), tile_m: word(c, 1), tile_n: word(c, 2) })
            .collect();
        ScheduleOutcome {
            groups: self.groups.clone(),
            work: items,
            work_len,
            work_lens,
            status: word(self.status.bytes(), 0),
        }
    }
}

/// The list `sm100_schedule` must build for `ops`' clamped sizes: the host-built list of the same
/// groups (`build_work_list`), restricted to the first `capacity / slots` M tiles (all of them
/// unless the list overflowed).
pub fn expected_device_list(layout: &Sm100DeviceLayout, problem: &MoeProblem, rows: &[GroupRows]) -> Vec<WorkItem> {
    let (n, k) = (problem.n() as u32, problem.k() as u32);
    let shapes: Vec<AbiGroupShape> = rows.iter().map(|r| AbiGroupShape { m: r.rows, n, k }).collect();
    let mut list = vec![WorkItem::default(); work_list_len(&shapes, layout.block_n)];
    build_work_list(&shapes, layout.block_n, &mut list).expect("host list");
    let capacity_rows = layout.max_work / slots_per_m_tile(n, layout.block_n);
    let mut first_row = vec![0u32; shapes.len()];
    let mut row = 0;
    for (g, s) in shapes.iter().enumerate() {
        first_row[g] = row;
        row += s.tiles_m();
    }
    list.retain(|w| first_row[w.group as usize] + w.tile_m < capacity_rows);
    list
}

/// The scheduler's launch, the first of a device-sized plan's `launches`: `name`, one CTA with
/// the shared memory for `groups` groups.
fn scheduler_launch(launches: &[Launch], name: &str, groups: u32) -> Launch {
    let l = *launches.first().expect("a device-sized plan launches its scheduler first");
    assert_eq!((l.kernel, l.geometry), (name, schedule_geometry(groups)), "the first launch is the scheduler");
    l
}

/// Runs the scheduler launch `l` (`entry` with `params`, its parameters) in the model.
fn run_scheduler<S: Copy + Sync>(
    arch: nvfp4_gemm::Arch,
    l: &Launch,
    params: S,
    run: &ModelRun,
    entry: unsafe fn(S),
) -> Result<Launched, Failure> {
    let (kernel, geometry) = (l.kernel, l.geometry);
    let cfg = launch_config(model_arch(arch), geometry, 1, run);
    // SAFETY: the parameters point at live tables sized by the layout, and at the validated
    // buffers; the model checks every device access.
    nvfp4_gemm_model::launch(&cfg, || unsafe { entry(params) })
        .map(|stats| Launched { kernel, geometry, stats })
        .map_err(|error| Failure { kernel, error })
}

/// Runs `sm100_schedule` in the model for `buffers`' sizes, as [`Sm100DeviceLayout`] launches it
/// (the first launch of its call) on `tables`.
pub fn run_sm100_schedule(
    layout: &Sm100DeviceLayout,
    buffers: &MoeBuffers,
    tables: &MoeTables<Sm100GroupParams>,
    run: &ModelRun,
) -> Result<Launched, Failure> {
    let launches = plan_launches(layout, buffers, tables);
    run_sm100_schedule_launch(layout, buffers, tables, &launches, run)
}

fn run_sm100_schedule_launch(
    layout: &Sm100DeviceLayout,
    buffers: &MoeBuffers,
    tables: &MoeTables<Sm100GroupParams>,
    launches: &[Launch],
    run: &ModelRun,
) -> Result<Launched, Failure> {
    let l = scheduler_launch(launches, "sm100_schedule", layout.problem.groups() as u32);
    let params = l.params.get::<Sm100ScheduleParams>().expect("sm100_schedule's parameters");
    assert_eq!(params, layout.schedule_params(buffers, &tables.addresses()));
    run_scheduler(Sm100DeviceLayout::ARCH, &l, params, run, nvfp4_gemm_kernel::sm100::schedule::sm100_schedule)
}

/// Runs a device-sized sm_100a call in the model: the scheduler, then the GEMM variant the layout
/// chose for `residency`, on the library's tables. Returns what ran and what the scheduler wrote.
pub fn run_sm100_moe(ops: &MoeOperands, residency: Residency, run: &ModelRun) -> Result<Sm100MoeRun, Failure> {
    run_sm100_moe_on(&ops.problem, &ops.buffers(), residency, run)
}

/// What a device-sized sm_100a call in the model returns: what ran, what the scheduler wrote, and
/// the layout.
pub type Sm100MoeRun = (Vec<Launched>, ScheduleOutcome<Sm100GroupParams>, Sm100DeviceLayout);

/// [`run_sm100_moe`] on given buffers (validated by the caller, as `MoePlan::run` validates
/// them: `validate_moe_buffers`): the sizes, tokens, weights and C of a call whose buffers other
/// kernels wrote, such as the MoE block's chain.
pub fn run_sm100_moe_on(
    problem: &MoeProblem,
    buffers: &MoeBuffers,
    residency: Residency,
    run: &ModelRun,
) -> Result<Sm100MoeRun, Failure> {
    let layout = Sm100DeviceLayout::new(problem, |k| residency.of(k)).expect("sm100 device layout");
    let tables = MoeTables::new(&layout, buffers);
    let launches = plan_launches(&layout, buffers, &tables);
    let mut launched = vec![run_sm100_schedule_launch(&layout, buffers, &tables, &launches, run)?];
    for l in &launches[1..] {
        let kernel = sm100_kernel(l.kernel);
        assert_eq!(kernel, layout.kernel, "the GEMM the layout chose");
        let cfg = launch_config(Arch::Sm100a, l.geometry, kernel.config().max_ctas_per_sm(), run);
        launched.push(launch_one(l.kernel, &cfg, l.geometry, kernel_params_of(l), sm100_entry(kernel))?);
    }
    Ok((launched, tables.outcome(), layout))
}

/// The architecture the model runs a library architecture's kernels as.
pub fn model_arch(arch: nvfp4_gemm::Arch) -> Arch {
    match arch {
        nvfp4_gemm::Arch::Sm90a => Arch::Sm90a,
        nvfp4_gemm::Arch::Sm100a => Arch::Sm100a,
    }
}

/// The entry point of an sm_90a kernel a plan launches: the token dequantization or a GEMM
/// (the kernel crate's `ENTRY_POINTS`, one per row of the abi's `GEMM_KERNELS`).
pub fn sm90_entry(kernel: &str) -> unsafe fn(KernelParams) {
    use nvfp4_gemm_kernel::sm90::{dequant::sm90_dequant_tokens, gemm::ENTRY_POINTS};
    if kernel == nvfp4_gemm_abi::sm90::DEQUANT_KERNEL {
        return sm90_dequant_tokens;
    }
    ENTRY_POINTS
        .into_iter()
        .find_map(|(name, entry)| (name == kernel).then_some(entry))
        .unwrap_or_else(|| panic!("no sm_90a entry point {kernel}"))
}

/// The sizes array `sizes` in "device" memory and every other buffer of a device-sized call as
/// addresses that only a scheduler computes with (nothing reads them), validated as a call's
/// buffers: for running a scheduler alone.
pub fn schedule_only_buffers(problem: &MoeProblem, sizes: &[u32]) -> (DeviceBuf, MoeBuffers) {
    let sizes_buf = DeviceBuf::from_bytes(&sizes.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
    let (a, w) = (problem.a_sizes(), problem.b_sizes());
    let fake = |i: u64, len| BufferView { ptr: 0x1000_0000_0000 * i, len };
    let buffers = MoeBuffers {
        sizes: sizes_buf.view(sizes.len()),
        a: MoeTokens::Nvfp4 { values: fake(1, a.values), scales: fake(2, a.scales) },
        weights: (0..problem.groups() as u64).map(|g| (fake(10 + g, w.values), fake(5000 + g, w.scales))).collect(),
        alphas: vec![1.0; problem.groups()],
        c: fake(3, problem.c_elements()),
        c_type: problem.output(),
        activated: None,
    };
    validate_moe_buffers(problem, &buffers).expect("valid buffers");
    (sizes_buf, buffers)
}

/// Runs `sm90_schedule` in the model for `buffers`' sizes, as `layout` launches it (the first
/// launch of its call) on `tables`.
pub fn run_sm90_schedule(
    layout: &Sm90DeviceLayout,
    buffers: &MoeBuffers,
    tables: &MoeTables<nvfp4_gemm_abi::sm90::GroupParams>,
    run: &ModelRun,
) -> Result<Launched, Failure> {
    let launches = plan_launches(layout, buffers, tables);
    run_sm90_schedule_launch(layout, buffers, tables, &launches, run)
}

fn run_sm90_schedule_launch(
    layout: &Sm90DeviceLayout,
    buffers: &MoeBuffers,
    tables: &MoeTables<nvfp4_gemm_abi::sm90::GroupParams>,
    launches: &[Launch],
    run: &ModelRun,
) -> Result<Launched, Failure> {
    let l = scheduler_launch(launches, "sm90_schedule", layout.problem.groups() as u32);
    let params = l.params.get::<Sm90ScheduleParams>().expect("sm90_schedule's parameters");
    assert_eq!(params, layout.schedule_params(buffers, &tables.addresses()));
    run_scheduler(Sm90DeviceLayout::ARCH, &l, params, run, nvfp4_gemm_kernel::sm90::schedule::sm90_schedule)
}

/// What a device-sized sm_90a call in the model returns: what ran, what the scheduler wrote, and
/// the layout.
pub type Sm90MoeRun = (Vec<Launched>, ScheduleOutcome<nvfp4_gemm_abi::sm90::GroupParams>, Sm90DeviceLayout);

/// Runs a device-sized sm_90a call in the model, as [`Sm90DeviceLayout`] plans it for `sm_count`
/// SMs and `options`: `sm90_schedule`, `sm90_dequant_tokens`, then every GEMM the layout
/// launches (the one the scheduler did not choose finds a length of 0).
pub fn run_sm90_moe(
    ops: &MoeOperands,
    sm_count: u32,
    options: &MoeOptions,
    run: &ModelRun,
) -> Result<Sm90MoeRun, Failure> {
    let layout = Sm90DeviceLayout::new(&ops.problem, sm_count, options).expect("sm90 device layout");
    run_sm90_device_sized(layout, &ops.buffers(), run)
}

/// [`run_sm90_moe`] for W4A16 (the layout of [`MoeOperands::w4a16_problem`], `inputs`'
/// activation type): `sm90_schedule`, then the W4A16 GEMMs on `inputs`
/// ([`MoeOperands::w4a16_inputs`]), no dequantization.
pub fn run_sm90_moe_w4a16(
    ops: &MoeOperands,
    inputs: &W4a16MoeInputs,
    sm_count: u32,
    options: &MoeOptions,
    run: &ModelRun,
) -> Result<Sm90MoeRun, Failure> {
    let layout = Sm90DeviceLayout::new(&ops.w4a16_problem(inputs.kind), sm_count, options).expect("w4a16 layout");
    assert_eq!(layout.activations, Some(inputs.kind));
    run_sm90_device_sized(layout, &ops.w4a16_buffers(inputs), run)
}

/// A device-sized sm_90a call in the model on given buffers (validated by the caller, as
/// `MoePlan::run` validates them: `validate_moe_buffers`), as [`Sm90DeviceLayout`] plans
/// `problem` (NVFP4 or W4A16 tokens) for `sm_count` SMs and `options`: the launches of
/// [`run_sm90_moe`] or [`run_sm90_moe_w4a16`] on the sizes, tokens, weights and C of a call whose
/// buffers other kernels wrote, such as the MoE block's chain.
pub fn run_sm90_moe_on(
    problem: &MoeProblem,
    buffers: &MoeBuffers,
    sm_count: u32,
    options: &MoeOptions,
    run: &ModelRun,
) -> Result<Sm90MoeRun, Failure> {
    run_sm90_moe_routed(problem, buffers, sm_count, options, None, run)
}

/// [`run_sm90_moe_on`] with the plan told that at most `routed` rows are routed
/// (`Sm90DeviceLayout::set_routed_rows`, as `MoePlan::set_routed_rows`).
pub fn run_sm90_moe_routed(
    problem: &MoeProblem,
    buffers: &MoeBuffers,
    sm_count: u32,
    options: &MoeOptions,
    routed: Option<usize>,
    run: &ModelRun,
) -> Result<Sm90MoeRun, Failure> {
    run_sm90_prepared(Sm90Prepared::routed(problem, buffers, sm_count, options, routed), buffers, run)
}

fn run_sm90_device_sized(
    layout: Sm90DeviceLayout,
    buffers: &MoeBuffers,
    run: &ModelRun,
) -> Result<Sm90MoeRun, Failure> {
    run_sm90_prepared(Sm90Prepared::new(layout, buffers), buffers, run)
}

/// A prepared call's scheduler, then the launches after it.
fn run_sm90_prepared(call: Sm90Prepared, buffers: &MoeBuffers, run: &ModelRun) -> Result<Sm90MoeRun, Failure> {
    let scheduler = run_sm90_schedule_launch(&call.layout, buffers, &call.tables, &call.launches, run)?;
    call.run_after_scheduler(vec![scheduler], run)
}

/// A device-sized sm_90a call whose tables are encoded and launches listed, its scheduler not run:
/// what `MoePlan::prepare_scheduled` leaves for the MoE block, whose `sm90_quantize_schedule` runs
/// the scheduler ([`Sm90Prepared::schedule_params`]) before [`Sm90Prepared::run_after_scheduler`].
pub struct Sm90Prepared {
    /// The plan.
    pub layout: Sm90DeviceLayout,
    tables: MoeTables<nvfp4_gemm_abi::sm90::GroupParams>,
    launches: Vec<Launch>,
}

impl Sm90Prepared {
    /// `layout`'s tables and launches for `buffers` (validated by the caller).
    pub fn new(layout: Sm90DeviceLayout, buffers: &MoeBuffers) -> Sm90Prepared {
        let tables = MoeTables::new(&layout, buffers);
        let launches = plan_launches(&layout, buffers, &tables);
        Sm90Prepared { layout, tables, launches }
    }

    /// [`run_sm90_moe_routed`]'s plan for a call prepared instead of run.
    pub fn routed(
        problem: &MoeProblem,
        buffers: &MoeBuffers,
        sm_count: u32,
        options: &MoeOptions,
        routed: Option<usize>,
    ) -> Sm90Prepared {
        let mut layout = Sm90DeviceLayout::new(problem, sm_count, options).expect("sm90 device layout");
        layout.set_routed_rows(routed);
        Sm90Prepared::new(layout, buffers)
    }

    /// The plan's f16 token workspace, every byte set to `poison` first: where a plan whose
    /// caller dequantizes (`MoeOptions::caller_dequantizes`) reads the tokens the block's gather
    /// or activation write.
    pub fn poisoned_workspace(&mut self, poison: u8) -> BufferView {
        self.tables.workspace.bytes_mut().fill(poison);
        self.tables.workspace.view(self.layout.workspace_bytes)
    }

    /// The scheduler's parameters (its launch's, the layout's first).
    pub fn schedule_params(&self) -> Sm90ScheduleParams {
        let l = scheduler_launch(&self.launches, "sm90_schedule", self.layout.problem.groups() as u32);
        l.params.get::<Sm90ScheduleParams>().expect("sm90_schedule's parameters")
    }

    /// Every launch after the scheduler, `launched` (what ran before, the scheduler's work
    /// included) followed by them; the outcome is what the scheduler wrote.
    pub fn run_after_scheduler(self, mut launched: Vec<Launched>, run: &ModelRun) -> Result<Sm90MoeRun, Failure> {
        let Sm90Prepared { layout, tables, launches } = self;
        // The schedule as it was before the other kernels ran (the dequantization writes nothing
        // the scheduler wrote; the outcome is read now so that a fault later still shows it).
        let outcome = tables.outcome();
        let workspace = (tables.workspace.addr(), layout.workspace_bytes as u64);
        for l in &launches[1..] {
            let gemm = l.kernel != nvfp4_gemm_abi::sm90::DEQUANT_KERNEL;
            let ctas_per_sm = if l.kernel.ends_with("_decode") { 2 } else { 1 };
            let mut cfg = launch_config(Arch::Sm90a, l.geometry, ctas_per_sm, run);
            if gemm {
                cfg.registers = sm90_registers(l.kernel);
                if l.start == Start::Early && layout.activations.is_none() {
                    // As the library launches it: while the launch before may still write the
                    // workspace (the dequantization, or for the second GEMM the chain through the
                    // first). W4A16 GEMMs read nothing a launch of the call writes but the
                    // scheduler's tables, after waiting first.
                    cfg.predecessor_writes = vec![workspace];
                }
            }
            launched.push(launch_one(l.kernel, &cfg, l.geometry, kernel_params_of(l), sm90_entry(l.kernel))?);
        }
        drop(tables);
        Ok((launched, outcome, layout))
    }
}

/// A 128-byte aligned host allocation for the probes (tensor maps need 64-byte alignment).
pub struct ProbeBuf {
    blocks: Vec<Block128>,
    len: usize,
    addr: u64,
}

#[derive(Clone, Copy)]
#[repr(C, align(128))]
struct Block128([u8; 128]);

/// The device model as a [`ProbeTarget`](nvfp4_gemm_diag::probe::ProbeTarget): "device" buffers are
/// host allocations, maps are the model's encoding ([`ModelEncoder`]), launches run the probe
/// kernels (`nvfp4_gemm_diag_kernel::probe` for sm_90a, `probe_sm100` for sm_100a, built for the host)
/// on their architecture, under the case's rules (strict mode unless the case tries, for the
/// hardware, a value strict mode rejects).
#[derive(Clone, Copy, Debug, Default)]
pub struct ModelTarget {
    /// The model's choices.
    pub run: ModelRun,
}

impl nvfp4_gemm_diag::probe::ProbeTarget for ModelTarget {
    type Buf = ProbeBuf;

    fn upload(&self, bytes: &[u8]) -> Result<ProbeBuf, String> {
        let mut blocks = vec![Block128([0; 128]); bytes.len().max(16).div_ceil(128)];
        let addr = blocks.as_mut_ptr() as u64;
        // SAFETY: `blocks` holds at least `bytes.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len()) };
        Ok(ProbeBuf { blocks, len: bytes.len(), addr })
    }

    fn addr(&self, buf: &ProbeBuf) -> u64 {
        buf.addr
    }

    fn download(&self, buf: &ProbeBuf) -> Result<Vec<u8>, String> {
        debug_assert_eq!(buf.addr, buf.blocks.as_ptr() as u64);
        // SAFETY: `blocks` holds at least `len` initialized bytes; no launch is running.
        Ok(unsafe { std::slice::from_raw_parts(buf.addr as *const u8, buf.len) }.to_vec())
    }

    fn encode<const R: usize>(&self, map: &TiledMap<R>, base: u64) -> Result<TensorMap, String> {
        ModelEncoder.encode(map, base).map_err(|e| e.to_string())
    }

    fn launch(
        &self,
        kernel: nvfp4_gemm_diag::probe::ProbeKernel,
        geometry: LaunchGeometry,
        params: nvfp4_gemm_diag::probe::ProbeParams,
        rules: nvfp4_gemm_diag::probe::ModelRules,
    ) -> Result<(), String> {
        use nvfp4_gemm_diag::probe::ProbeKernel;
        use nvfp4_gemm_diag_kernel::probe::*;
        use nvfp4_gemm_diag_kernel::probe_sm100::*;
        let entry: unsafe fn(nvfp4_gemm_diag::probe::ProbeParams) = match kernel {
            ProbeKernel::Tma => tma_probe,
            ProbeKernel::Sync => sync_probe,
            ProbeKernel::WgmmaN16 => wgmma_probe_n16,
            ProbeKernel::WgmmaN128 => wgmma_probe_n128,
            ProbeKernel::Tmem => tmem_probe,
            ProbeKernel::Umma => umma_probe,
            ProbeKernel::Tma4Multicast => tma4_multicast_probe,
        };
        let arch = match kernel.arch() {
            nvfp4_gemm::Arch::Sm90a => Arch::Sm90a,
            nvfp4_gemm::Arch::Sm100a => Arch::Sm100a,
        };
        let mut cfg = launch_config(arch, geometry, 1, &self.run);
        cfg.strict = rules == nvfp4_gemm_diag::probe::ModelRules::Strict;
        // SAFETY: the probe runners (`nvfp4_gemm_diag::probe`) allocate what each kernel's contract
        // asks for; the model checks every shared-memory and asynchronous access.
        nvfp4_gemm_model::launch(&cfg, || unsafe { entry(params) })
            .map(|_| ())
            .map_err(|e| format!("{} failed in the model: {e}", kernel.name()))
    }
}

/// What the device model reads from an sm_100a operand map the plans build: the map encoded by
/// [`ModelEncoder`] over the tensor at `base` and decoded as the model's TMA decodes it, checked
/// field by field against the parameters the host hands `cuTensorMapEncodeTiled` (the driver's
/// 128 bytes are opaque, so this is how the model learns every field: from the same
/// [`TiledMap`] through the library's one `TiledMapEncoder` call). Out-of-bounds fill: the model's
/// format holds only zero fill (`OOB_FILL_NONE`, the only fill the host encodes).
pub fn model_reading(
    map: &nvfp4_gemm::layout::Fp4Map,
    base: u64,
) -> Result<nvfp4_gemm_model::tensor_map::TensorMapDesc, String> {
    use nvfp4_gemm::layout::Fp4Map;
    fn check<const R: usize>(
        m: &TiledMap<R>,
        base: u64,
    ) -> Result<nvfp4_gemm_model::tensor_map::TensorMapDesc, String> {
        let encoded = ModelEncoder.encode(m, base).map_err(|e| e.to_string())?;
        let d = nvfp4_gemm_model::tensor_map::decode(&encoded.0)?;
        let (element, swizzle) = model_element_and_swizzle(m);
        let same = d.element == element
            && d.rank == R
            && d.base == base
            && d.dims[..R] == m.dims[..]
            && (1..R).all(|i| d.strides[i] == m.strides_bytes[i - 1])
            && d.box_dims[..R] == m.box_dims[..]
            && d.swizzle == swizzle;
        if same {
            Ok(d)
        } else {
            Err(format!("the model reads {d:?} from a map of {m:?} at {base:#x}"))
        }
    }
    match map {
        Fp4Map::Rank2(m) => check(m, base),
        Fp4Map::Rank3(m) => check(m, base),
    }
}
