//! Device-resident group sizes: the grouped GEMM of a mixture-of-experts layer whose per-expert
//! token counts live on the GPU, planned once for upper bounds and run without any host
//! synchronisation, so that quantization and GEMM can be captured in one CUDA graph and replayed
//! for every routing.
//!
//! - [`MoeProblem`]: `G` groups (experts) of the same `N` and `K`, the token layout
//!   ([`TokenLayout::Contiguous`]: `[T, K]` tokens sorted by expert with `offsets[G + 1]` on the
//!   device; [`TokenLayout::Masked`]: `[G, M_max, K]` with `counts[G]` on the device), the output
//!   type, and every buffer size that follows.
//! - [`Quantizer::quantize_grouped`]: bf16/f16 tokens → NVFP4 in that layout (each group's block
//!   scales at a 128-row-aligned offset, `nvfp4_gemm_abi::moe` defines it), reading the same
//!   device sizes.
//! - [`MoePlan`]: a call launches a one-CTA scheduling kernel that reads the sizes and writes the
//!   group parameters, the work list and its length into plan-owned memory, then (sm_90a) the
//!   token dequantization and the GEMM, or (sm_100a) the GEMM, which read the length from device
//!   memory. Nothing is allocated and nothing waits for the host. ⚠ The sm_100a path has run only
//!   in the CPU model of the device (`model-tests/`), never on a B200.
//!
//! Sizes beyond the bounds are clamped (offsets to `T`, counts to `M_max`), so no kernel reads or
//! writes outside the tensors; each clamp raises a bit of the plan's sticky status word, which
//! [`MoePlan::read_status`] returns later and [`MoePlan::clear_status`] resets
//! ([`SizeStatus`]).
//!
//! ```no_run
//! use nvfp4_gemm::moe::{MoeArgs, MoePlan, MoeProblem, TokenLayout};
//! use nvfp4_gemm::quantize::Quantizer;
//! use nvfp4_gemm::{DeviceNvfp4, Gpu, Output, OutputType};
//! use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
//!
//! let gpu = Gpu::new(0)?;
//! // Capture needs a stream of its own; one stream and no cross-stream events here.
//! unsafe { gpu.context().disable_event_tracking() };
//! let stream = gpu.context().new_stream()?;
//! let (experts, n, k, max_tokens) = (64, 4096, 7168, 2048);
//! let problem = MoeProblem::new(experts, n, k, TokenLayout::Contiguous { max_tokens }, OutputType::Bf16)?;
//! let quantizer = Quantizer::new(&gpu)?;
//! let mut plan = MoePlan::new(&gpu, problem.clone())?;
//!
//! // Buffers, allocated once: the router's sorted bf16 activations and expert offsets, the
//! // NVFP4 tokens, the experts' NVFP4 weights, the output.
//! let x = stream.alloc_zeros::<half::bf16>(problem.token_rows() * k)?;
//! let offsets = stream.alloc_zeros::<u32>(problem.sizes_len())?;
//! let mut a = DeviceNvfp4::alloc_zeros_sized(&stream, problem.a_sizes())?;
//! let weights: Vec<DeviceNvfp4> =
//!     (0..experts).map(|_| DeviceNvfp4::alloc_zeros(&stream, n, k)).collect::<Result<_, _>>()?;
//! let mut c = stream.alloc_zeros::<half::bf16>(problem.c_elements())?;
//! let (g_x, alphas) = (0.01f32, vec![0.01f32 * 0.02; experts]);
//! let b: Vec<_> = weights.iter().map(|w| w.operand()).collect();
//!
//! let mut layer = |plan: &mut MoePlan, a: &mut DeviceNvfp4, c: &mut cudarc::driver::CudaSlice<half::bf16>| {
//!     quantizer.quantize_grouped(&stream, &x, &problem, &offsets, g_x, a.operand_mut())?;
//!     let mut args = MoeArgs { sizes: &offsets, a: a.operand(), weights: &b, alphas: &alphas, c: Output::Bf16(c) };
//!     plan.run(&stream, &mut args)
//! };
//! layer(&mut plan, &mut a, &mut c)?; // once outside capture: uploads the weights' tables
//! stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
//! layer(&mut plan, &mut a, &mut c)?;
//! let graph = stream.end_capture(CUgraphInstantiate_flags(0))?.expect("a graph");
//! // Per step: the router rewrites `x` and `offsets` on the device; replay.
//! graph.launch()?;
//! assert!(plan.read_status(&stream)?.is_ok()); // synchronizes; no size was beyond the bounds
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::device::{Arch, Gpu};
pub use crate::device_sizes::{MoeKernels, MoeOptions};
use crate::error::{BufferName, Error, Result};
use crate::overlap::{self, Span};
use crate::plan::{Nvfp4Operand, Output, PlanSummary};
use crate::problem::{BufferView, CallBuffers, OutputType, BUFFER_ALIGN};
use crate::quantize::{DenseFloat, Nvfp4OperandMut, Nvfp4Sizes, Quantizer};
use crate::rules::{self, Limit};
use crate::sm100::Sm100DevicePlan;
use crate::sm90::Sm90DevicePlan;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
pub use nvfp4_gemm_abi::moe::GroupRows;
use nvfp4_gemm_abi::moe::{self as abi, DeviceSizes, GroupedConvertParams};
use nvfp4_gemm_abi::quantize::{self as qabi, ConvertParams};
use nvfp4_gemm_abi::scale_layout::blocked_bytes;
use std::fmt;
use std::sync::Arc;

/// Most groups of a [`MoeProblem`].
pub use crate::rules::MAX_GROUPS;

/// Where the groups' tokens are in the token tensor A (and their outputs in C).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenLayout {
    /// A is `[max_tokens, K]`, C `[max_tokens, N]`; the device array `offsets[G + 1]` (`u32`)
    /// says group `g` owns rows `offsets[g] .. offsets[g + 1]` (a router's sort). Offsets above
    /// `max_tokens` are clamped to it, a decreasing offset empties its group (both flagged).
    Contiguous {
        /// The bound `T` on the total number of tokens (rows of A and C).
        max_tokens: usize,
    },
    /// A is `[G, max_rows, K]`, C `[G, max_rows, N]`; the device array `counts[G]` (`u32`) says
    /// group `g` owns its first `counts[g]` rows. Counts above `max_rows` are clamped (flagged).
    Masked {
        /// The bound `M_max` on each group's tokens.
        max_rows: usize,
    },
}

/// A grouped GEMM with device-resident group sizes: `G` groups of `N` weights and reduction
/// length `K` (the same for every group), tokens in a [`TokenLayout`].
///
/// Rules ([`crate::rules`], checked by [`MoeProblem::new`]): `1 ≤ G ≤` [`MAX_GROUPS`]; `K` a
/// positive multiple of 64; `N` a positive multiple of 8; the layout's bound at least 1; `K`, `N` and the bound at
/// most [`crate::rules::MAX_DIM`]; A, C and the work list's capacity small enough for the
/// kernels' 32-bit indexing (`token_rows · K`, `scale_rows · K`, `token_rows · N` and the most
/// output tiles below `2^31`); every buffer together within [`crate::rules::MAX_DEVICE_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoeProblem {
    groups: usize,
    n: usize,
    k: usize,
    layout: TokenLayout,
    output: OutputType,
}

fn problem_error(reason: String) -> Error {
    Error::InvalidProblem(reason)
}

impl MoeProblem {
    /// Validates the shape, in constant time. Errors: [`Error::InvalidProblem`] for a shape
    /// against the rules, [`Error::TooLarge`] for a limit exceeded ([`crate::rules`]).
    pub fn new(groups: usize, n: usize, k: usize, layout: TokenLayout, output: OutputType) -> Result<MoeProblem> {
        if groups == 0 {
            return Err(problem_error("0 groups; a device-sized problem needs at least 1".into()));
        }
        rules::within(None, "groups", groups as u64, Limit::Groups)?;
        if let Some(reason) = rules::k_rule(k) {
            return Err(problem_error(format!("k: {reason}")));
        }
        if let Some(reason) = rules::n_rule(n) {
            return Err(problem_error(format!("n: {reason}")));
        }
        let (bound_field, bound) = match layout {
            TokenLayout::Contiguous { max_tokens } => ("max_tokens", max_tokens),
            TokenLayout::Masked { max_rows } => ("max_rows", max_rows),
        };
        if bound == 0 {
            return Err(problem_error(format!("{bound_field} = 0; the token bound must be at least 1")));
        }
        for (field, v) in [("k", k), ("n", n), (bound_field, bound)] {
            rules::within(None, field, v as u64, Limit::Dim)?;
        }
        // Token rows in 64 bits (`G · M_max` may not fit the abi's `u32` until checked).
        let rows = match layout {
            TokenLayout::Contiguous { max_tokens } => max_tokens as u64,
            TokenLayout::Masked { max_rows } => groups as u64 * max_rows as u64,
        };
        let (k64, n64) = (k as u64, n as u64);
        rules::within(None, "a.values", rows * k64, Limit::Index32)?;
        rules::within(None, "c", rows * n64, Limit::Index32)?;
        // From here every row count fits the abi's `u32` formulas (rows < 2^25, G ≤ 2^12).
        let p = MoeProblem { groups, n, k, layout, output };
        let scale_rows = p.scale_rows() as u64;
        rules::within(None, "a.scales", scale_rows * k64, Limit::Index32)?;
        let tiles = abi::max_m_tiles(&p.device_sizes(0)) * nvfp4_gemm_abi::sm90::n_tiles(n as u32) as u64;
        rules::within(None, "tiles", tiles, Limit::Index32)?;
        let b = p.b_sizes();
        let parts = [
            ("sizes", 4 * p.sizes_len() as u64),
            ("a.values", rows * k64 / 2),
            ("a.scales", scale_rows * k64 / 16),
            ("c", 2 * rows * n64),
            ("weights", groups as u64 * (b.values + b.scales) as u64),
            ("workspace", 2 * rows * k64),
        ];
        let mut bytes = 0;
        for (field, part) in parts {
            bytes += part;
            rules::within(None, field, bytes, Limit::DeviceBytes)?;
        }
        Ok(p)
    }

    /// Groups `G`.
    pub fn groups(&self) -> usize {
        self.groups
    }
    /// Weights per group `N` (columns of C).
    pub fn n(&self) -> usize {
        self.n
    }
    /// Reduction length `K`.
    pub fn k(&self) -> usize {
        self.k
    }
    /// The token layout.
    pub fn layout(&self) -> TokenLayout {
        self.layout
    }
    /// The output type.
    pub fn output(&self) -> OutputType {
        self.output
    }

    /// The sizes the device kernels read (`sizes`: the device address of the sizes array).
    pub(crate) fn device_sizes(&self, sizes: u64) -> DeviceSizes {
        let (layout, rows) = match self.layout {
            TokenLayout::Contiguous { max_tokens } => (abi::LAYOUT_CONTIGUOUS, max_tokens),
            TokenLayout::Masked { max_rows } => (abi::LAYOUT_MASKED, max_rows),
        };
        DeviceSizes { sizes, layout, groups: self.groups as u32, rows: rows as u32, reserved: 0 }
    }

    /// Rows of the token tensor A and of C: `T`, or `G · M_max`.
    pub fn token_rows(&self) -> usize {
        self.device_sizes(0).token_rows() as usize
    }

    /// Rows of A's blocked scale tensor (each group's rows start a new 128-row block):
    /// `128 · (⌈T/128⌉ + G)` or `G · ⌈M_max/128⌉ · 128`.
    pub fn scale_rows(&self) -> usize {
        self.device_sizes(0).scale_rows() as usize
    }

    /// `u32` entries of the device sizes array: `G + 1` offsets or `G` counts.
    pub fn sizes_len(&self) -> usize {
        self.device_sizes(0).sizes_len() as usize
    }

    /// Sizes of the token tensor A: values `token_rows · K/2` bytes, scales `scale_rows · K/16`.
    pub fn a_sizes(&self) -> Nvfp4Sizes {
        Nvfp4Sizes { values: self.token_rows() * self.k / 2, scales: self.scale_rows() * self.k / 16 }
    }

    /// Sizes of one group's weights B (`N x K`).
    pub fn b_sizes(&self) -> Nvfp4Sizes {
        Nvfp4Sizes { values: self.n * self.k / 2, scales: blocked_bytes(self.n as u32, self.k as u32) }
    }

    /// Elements of C: `token_rows · N`.
    pub fn c_elements(&self) -> usize {
        self.token_rows() * self.n
    }

    /// The rows of every group for the sizes array `sizes` (host copy), clamped exactly as the
    /// device does, and the status bits the device would raise: for references and tests.
    pub fn group_rows(&self, sizes: &[u32]) -> Result<(Vec<GroupRows>, SizeStatus)> {
        if sizes.len() != self.sizes_len() {
            return Err(invalid(
                "group_rows",
                "sizes",
                format!("has {} entries, needs {}", sizes.len(), self.sizes_len()),
            ));
        }
        let s = self.device_sizes(0);
        let rows: Vec<GroupRows> = (0..self.groups as u32).map(|g| s.group(g, |i| sizes[i as usize])).collect();
        let status = rows.iter().fold(0, |acc, r| acc | r.status);
        Ok((rows, SizeStatus(status)))
    }
}

fn invalid(call: &'static str, field: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidArgument { call, field, reason: reason.into() }
}

/// The plan's sticky status word: which sizes were beyond the plan's bounds since the last
/// [`MoePlan::clear_status`] (each was clamped; see [`TokenLayout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SizeStatus(pub u32);

impl SizeStatus {
    /// No size was beyond the bounds.
    pub fn is_ok(self) -> bool {
        self.0 == 0
    }
    /// An offset was above `max_tokens` (contiguous).
    pub fn rows_over_bound(self) -> bool {
        self.0 & abi::STATUS_ROWS_OVER_BOUND != 0
    }
    /// An offset was below the previous one (contiguous).
    pub fn offsets_decreasing(self) -> bool {
        self.0 & abi::STATUS_OFFSETS_DECREASING != 0
    }
    /// A count was above `max_rows` (masked).
    pub fn count_over_bound(self) -> bool {
        self.0 & abi::STATUS_COUNT_OVER_BOUND != 0
    }
    /// The schedule did not fit the work list (never for sizes within the bounds).
    pub fn work_overflow(self) -> bool {
        self.0 & abi::STATUS_WORK_OVERFLOW != 0
    }
}

impl fmt::Display for SizeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_ok() {
            return write!(f, "ok");
        }
        let names = [
            (self.rows_over_bound(), "offsets above max_tokens"),
            (self.offsets_decreasing(), "decreasing offsets"),
            (self.count_over_bound(), "counts above max_rows"),
            (self.work_overflow(), "work list overflow"),
        ];
        let list: Vec<&str> = names.iter().filter(|(on, _)| *on).map(|(_, n)| *n).collect();
        write!(f, "sizes clamped: {}", list.join(", "))
    }
}

/// The device buffers of one [`MoePlan::run`]. Borrowed for the call, never copied.
pub struct MoeArgs<'a> {
    /// `offsets[G + 1]` or `counts[G]` ([`MoeProblem::sizes_len`] `u32`s), read on the device.
    pub sizes: &'a dyn DevicePtr<u32>,
    /// The token tensor A in the problem's layout ([`MoeProblem::a_sizes`]), e.g. written by
    /// [`Quantizer::quantize_grouped`] with the same sizes.
    pub a: Nvfp4Operand<'a>,
    /// Each group's weights B (`N x K`, [`MoeProblem::b_sizes`]), `G` of them.
    pub weights: &'a [Nvfp4Operand<'a>],
    /// Each group's alpha (`g_a · g_b`), `G` finite values.
    pub alphas: &'a [f32],
    /// C, [`MoeProblem::c_elements`] elements of the problem's output type. Rows of no group are
    /// left as they are.
    pub c: Output<'a>,
}

/// Addresses and lengths of one call's buffers, as the validator sees them (and the layout code
/// of each architecture reads them; public for the device model's tests, `model-tests/`).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeBuffers {
    /// The sizes array (`u32` elements).
    pub sizes: BufferView,
    /// Packed values of A (bytes).
    pub a_values: BufferView,
    /// Blocked scales of A (bytes).
    pub a_scales: BufferView,
    /// Each group's weight values and scales (bytes).
    pub weights: Vec<(BufferView, BufferView)>,
    /// Each group's alpha.
    pub alphas: Vec<f32>,
    /// C (elements).
    pub c: BufferView,
    /// C's element type.
    pub c_type: OutputType,
}

/// Checks one call's buffers against the problem, as [`MoePlan::run`] does before any launch.
/// Pure: runs on the CPU.
pub fn validate_moe_buffers(p: &MoeProblem, b: &MoeBuffers) -> Result<()> {
    const CALL: &str = "moe run";
    let a = p.a_sizes();
    let checks = [
        ("sizes", b.sizes, p.sizes_len(), 4),
        ("a.values", b.a_values, a.values, BUFFER_ALIGN),
        ("a.scales", b.a_scales, a.scales, BUFFER_ALIGN),
        ("c", b.c, p.c_elements(), BUFFER_ALIGN),
    ];
    for (field, view, len, align) in checks {
        if view.len != len {
            return Err(invalid(CALL, field, format!("has {} elements; the problem needs exactly {len}", view.len)));
        }
        if view.ptr % align != 0 {
            return Err(invalid(CALL, field, format!("address {:#x} is not {align}-byte aligned", view.ptr)));
        }
    }
    if b.c_type != p.output {
        return Err(invalid(CALL, "c", format!("is {:?} but the problem's output is {:?}", b.c_type, p.output)));
    }
    if b.weights.len() != p.groups {
        return Err(invalid(CALL, "weights", format!("{} given for {} groups", b.weights.len(), p.groups)));
    }
    if b.alphas.len() != p.groups {
        return Err(invalid(CALL, "alphas", format!("{} given for {} groups", b.alphas.len(), p.groups)));
    }
    let w = p.b_sizes();
    for (g, ((values, scales), alpha)) in b.weights.iter().zip(&b.alphas).enumerate() {
        for (field, view, len) in [("b.values", values, w.values), ("b.scales", scales, w.scales)] {
            if view.len != len {
                return Err(Error::group(
                    g,
                    field,
                    format!("has {} elements; n={} k={} needs exactly {len}", view.len, p.n, p.k),
                ));
            }
            if view.ptr % BUFFER_ALIGN != 0 {
                return Err(Error::group(
                    g,
                    field,
                    format!("address {:#x} is not {BUFFER_ALIGN}-byte aligned", view.ptr),
                ));
            }
        }
        if !alpha.is_finite() {
            return Err(Error::group(g, "alpha", format!("{alpha} is not finite")));
        }
    }
    // C is the only output: it overlaps none of the inputs (which may share memory). Ids: 0..4
    // the call's buffers, then each group's weight values and scales.
    const FIELDS: [&str; 4] = ["c", "sizes", "a.values", "a.scales"];
    let inputs =
        [Span::new(1, b.sizes, 4, false), Span::new(2, b.a_values, 1, false), Span::new(3, b.a_scales, 1, false)];
    let weights = b.weights.iter().enumerate().flat_map(|(g, (values, scales))| {
        let id = 4 + 2 * g as u32;
        [Span::new(id, *values, 1, false), Span::new(id + 1, *scales, 1, false)]
    });
    let name = |id: u32| match id {
        0..4 => BufferName { group: None, field: FIELDS[id as usize] },
        _ => BufferName { group: Some((id as usize - 4) / 2), field: ["b.values", "b.scales"][id as usize % 2] },
    };
    overlap::check_one_output(CALL, Span::new(0, b.c, 2, true), inputs.into_iter().chain(weights), name)
}

/// One architecture's device-sized plan.
enum DevicePlan {
    Sm90(Sm90DevicePlan),
    Sm100(Sm100DevicePlan),
}

impl DevicePlan {
    fn summary(&self, output: OutputType) -> PlanSummary {
        match self {
            DevicePlan::Sm90(p) => p.summary(output),
            DevicePlan::Sm100(p) => p.summary(output),
        }
    }

    fn upload(&mut self, stream: &Arc<CudaStream>, problem: &MoeProblem, buffers: &MoeBuffers) -> Result<()> {
        match self {
            DevicePlan::Sm90(p) => p.upload(stream, problem, buffers),
            DevicePlan::Sm100(p) => p.upload(stream, problem, buffers),
        }
    }

    /// # Safety
    /// As the architectures' `launch`.
    unsafe fn launch(&mut self, stream: &CudaStream, problem: &MoeProblem, buffers: &MoeBuffers) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe {
            match self {
                DevicePlan::Sm90(p) => p.launch(stream, problem, buffers),
                DevicePlan::Sm100(p) => p.launch(stream, problem, buffers),
            }
        }
    }

    fn status(&self) -> &CudaSlice<u32> {
        match self {
            DevicePlan::Sm90(p) => p.status(),
            DevicePlan::Sm100(p) => p.status(),
        }
    }

    fn clear_status(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        match self {
            DevicePlan::Sm90(p) => p.clear_status(stream),
            DevicePlan::Sm100(p) => p.clear_status(stream),
        }
    }
}

/// A [`MoeProblem`] planned for one GPU: kernels, the group table, the tensor maps, the work
/// list for the bounds, the work-length and status words (and on sm_90a the f16 token
/// workspace) — all allocated once by [`MoePlan::new`].
///
/// [`MoePlan::run`] launches the scheduler (sizes → group table, work list, work length,
/// status), then on sm_90a the token dequantization and the GEMM, on sm_100a the GEMM (which
/// reads A through a tensor map). A call whose weights and alphas (and on sm_100a A's address)
/// are those of the previous call copies nothing from the host, so it can be captured in a CUDA
/// graph (run once before capturing); the sizes and C (and on sm_90a A) are kernel parameters
/// and may change freely.
///
/// ⚠ The sm_100a path has never run on a GPU (no B200 was available): its kernels are checked
/// by ptxas and run in the CPU model of the device (`model-tests/`), not on hardware.
pub struct MoePlan {
    problem: MoeProblem,
    plan: DevicePlan,
    summary: PlanSummary,
    /// Weight addresses and alphas of the last call, to skip re-uploading.
    signature: Vec<u64>,
}

impl MoePlan {
    /// Plans `problem` for `gpu` and allocates everything a call needs.
    pub fn new(gpu: &Gpu, problem: MoeProblem) -> Result<MoePlan> {
        Self::with_options(gpu, problem, &MoeOptions::default())
    }

    /// [`MoePlan::new`] with `options` (on sm_90a: which GEMM kernels a call may run).
    pub fn with_options(gpu: &Gpu, problem: MoeProblem, options: &MoeOptions) -> Result<MoePlan> {
        let plan = match gpu.arch() {
            Arch::Sm90a => DevicePlan::Sm90(Sm90DevicePlan::with_options(gpu, &problem, options)?),
            Arch::Sm100a => DevicePlan::Sm100(Sm100DevicePlan::with_options(gpu, &problem, options)?),
        };
        let summary = plan.summary(problem.output());
        Ok(MoePlan { problem, plan, summary, signature: vec![] })
    }

    /// The problem this plan was built for.
    pub fn problem(&self) -> &MoeProblem {
        &self.problem
    }

    /// What the planner chose (`tiles`: the work list's capacity).
    pub fn summary(&self) -> &PlanSummary {
        &self.summary
    }

    /// Runs the grouped GEMM on `stream` for the sizes in `args.sizes` as they are when the
    /// kernels run. Every buffer is validated first; on any error nothing is launched.
    pub fn run<'s>(&mut self, stream_arc: &'s Arc<CudaStream>, args: &'s mut MoeArgs<'_>) -> Result<()> {
        let stream: &CudaStream = stream_arc;
        // Holds the buffers' stream-ordering guards until the launches are enqueued.
        let mut call = CallBuffers::new(stream);
        let sizes = call.read(args.sizes);
        let a_values = call.read(args.a.values);
        let a_scales = call.read(args.a.scales);
        let weights: Vec<(BufferView, BufferView)> =
            args.weights.iter().map(|w| (call.read(w.values), call.read(w.scales))).collect();
        let (c, c_type) = match &mut args.c {
            Output::F16(c) => (call.write(&mut **c), OutputType::F16),
            Output::Bf16(c) => (call.write(&mut **c), OutputType::Bf16),
        };
        let buffers = MoeBuffers { sizes, a_values, a_scales, weights, alphas: args.alphas.to_vec(), c, c_type };
        validate_moe_buffers(&self.problem, &buffers)?;
        let mut signature: Vec<u64> = buffers
            .weights
            .iter()
            .zip(&buffers.alphas)
            .flat_map(|((v, s), a)| [v.ptr, s.ptr, a.to_bits() as u64])
            .collect();
        if let DevicePlan::Sm100(_) = self.plan {
            // The token map holds A's address.
            signature.push(buffers.a_values.ptr);
        }
        if signature != self.signature {
            self.plan.upload(stream_arc, &self.problem, &buffers)?;
            self.signature = signature;
        }
        // SAFETY: the tables hold these validated weights (uploaded now, or by an earlier call with
        // the same addresses and alphas); A, C and the sizes were validated against the problem.
        unsafe { self.plan.launch(stream, &self.problem, &buffers) }
    }

    /// The plan's status word on the device (`u32`, [`SizeStatus`] bits), e.g. to copy it inside
    /// a graph.
    pub fn status(&self) -> &CudaSlice<u32> {
        self.plan.status()
    }

    /// Copies the status word to the host. Synchronizes `stream` (call it outside capture, when
    /// the results are wanted anyway).
    pub fn read_status(&self, stream: &Arc<CudaStream>) -> Result<SizeStatus> {
        let d = |e| Error::driver("reading the plan's status word", e);
        let v = stream.clone_dtoh(self.plan.status()).map_err(d)?;
        stream.synchronize().map_err(d)?;
        Ok(SizeStatus(v[0]))
    }

    /// Resets the status word on `stream` (an asynchronous memset: capturable).
    pub fn clear_status(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        self.plan.clear_status(stream)
    }
}

impl Quantizer {
    /// Quantizes the token tensor of `problem` (`input`: [`MoeProblem::token_rows`] `x K`
    /// row-major f16/bf16) with the global scale `global_scale` into `out`
    /// ([`MoeProblem::a_sizes`] bytes each), in the problem's layout: the rows of group `g`
    /// (from the device array `sizes`, clamped like [`MoePlan::run`] clamps them) are quantized
    /// in place, and their block scales written from the group's scale offset on
    /// (`nvfp4_gemm_abi::moe`). Rows of no group, and padding scale rows, are not written.
    /// Bit for bit the CPU quantizer's result on each group's rows. No allocation, no host
    /// synchronisation: capturable.
    ///
    /// Errors (before any launch): [`Error::InvalidArgument`] for a buffer of the wrong length or
    /// not aligned (16 bytes; `sizes` 4), or `global_scale` not finite and positive;
    /// [`Error::Overlap`] for an output overlapping another buffer (the inputs may share memory).
    pub fn quantize_grouped<T: DenseFloat>(
        &self,
        stream: &Arc<CudaStream>,
        input: &dyn DevicePtr<T>,
        problem: &MoeProblem,
        sizes: &dyn DevicePtr<u32>,
        global_scale: f32,
        out: Nvfp4OperandMut<'_>,
    ) -> Result<()> {
        let mut call = CallBuffers::new(stream);
        let dense = call.read(input);
        let sizes_view = call.read(sizes);
        let values = call.write(out.values);
        let scales = call.write(out.scales);
        let params = validate_grouped_quantize(problem, dense, sizes_view, values, scales, global_scale, T::BF16)?;
        let items = params.convert.rows as u64 * (params.convert.k / qabi::BLOCK) as u64;
        // SAFETY: the validation checked every length, alignment and overlap the kernel relies on
        // (its `# Safety`); the guards keep the buffers alive past the launch.
        unsafe { self.launch_grouped(stream, items, &params) }
    }
}

/// Checks a grouped quantization's arguments and returns the kernel parameters. Pure.
fn validate_grouped_quantize(
    p: &MoeProblem,
    dense: BufferView,
    sizes: BufferView,
    values: BufferView,
    scales: BufferView,
    global_scale: f32,
    bf16: bool,
) -> Result<GroupedConvertParams> {
    const CALL: &str = "quantize_grouped";
    if !(global_scale.is_finite() && global_scale > 0.0) {
        return Err(invalid(CALL, "global_scale", format!("{global_scale} is not finite and positive")));
    }
    let a = p.a_sizes();
    let checks = [
        ("input", dense, p.token_rows() * p.k, BUFFER_ALIGN),
        ("sizes", sizes, p.sizes_len(), 4),
        ("values", values, a.values, BUFFER_ALIGN),
        ("scales", scales, a.scales, BUFFER_ALIGN),
    ];
    for (field, view, len, align) in checks {
        if view.len != len {
            return Err(invalid(CALL, field, format!("has {} elements; the problem needs exactly {len}", view.len)));
        }
        if view.ptr % align != 0 {
            return Err(invalid(CALL, field, format!("address {:#x} is not {align}-byte aligned", view.ptr)));
        }
    }
    let mut spans = [
        Span::new(0, dense, 2, false),
        Span::new(1, sizes, 4, false),
        Span::new(2, values, 1, true),
        Span::new(3, scales, 1, true),
    ];
    overlap::check(CALL, &mut spans, overlap::fields(&["input", "sizes", "values", "scales"]))?;
    Ok(GroupedConvertParams {
        convert: ConvertParams {
            dense: dense.ptr,
            values: values.ptr,
            scales: scales.ptr,
            rows: p.token_rows() as u32,
            k: p.k as u32,
            global_scale,
            bf16: bf16 as u32,
        },
        sizes: p.device_sizes(sizes.ptr),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contiguous(groups: usize, t: usize) -> MoeProblem {
        MoeProblem::new(groups, 256, 512, TokenLayout::Contiguous { max_tokens: t }, OutputType::F16).unwrap()
    }

    #[test]
    fn problem_rules_and_sizes() {
        let p = contiguous(4, 300);
        assert_eq!((p.token_rows(), p.scale_rows(), p.sizes_len()), (300, 128 * 7, 5));
        assert_eq!(p.a_sizes(), Nvfp4Sizes { values: 300 * 256, scales: 128 * 7 * 32 });
        assert_eq!(p.b_sizes(), Nvfp4Sizes { values: 256 * 256, scales: 256 * 32 });
        assert_eq!(p.c_elements(), 300 * 256);
        let m = MoeProblem::new(3, 136, 64, TokenLayout::Masked { max_rows: 20 }, OutputType::Bf16).unwrap();
        assert_eq!((m.token_rows(), m.scale_rows(), m.sizes_len(), m.c_elements()), (60, 384, 3, 60 * 136));
        let bad = |g, n, k, layout| MoeProblem::new(g, n, k, layout, OutputType::F16).is_err();
        let c = TokenLayout::Contiguous { max_tokens: 8 };
        assert!(bad(0, 8, 64, c));
        assert!(bad(MAX_GROUPS + 1, 8, 64, c));
        assert!(bad(1, 8, 100, c));
        assert!(bad(1, 12, 64, c));
        assert!(bad(1, 8, 64, TokenLayout::Contiguous { max_tokens: 0 }));
        assert!(bad(1, 8, 64, TokenLayout::Masked { max_rows: 0 }));
        assert!(bad(1, 8, 1 << 20, TokenLayout::Contiguous { max_tokens: 4096 }), "32-bit indexing");
        assert!(!bad(MAX_GROUPS, 8, 64, c));
    }

    #[test]
    fn group_rows_clamp_like_the_device() {
        let p = contiguous(3, 100);
        let (rows, status) = p.group_rows(&[0, 40, 30, 120]).unwrap();
        assert_eq!(rows.iter().map(|r| (r.first, r.rows)).collect::<Vec<_>>(), vec![(0, 40), (40, 0), (30, 70)]);
        assert!(status.rows_over_bound() && status.offsets_decreasing() && !status.count_over_bound());
        assert_eq!(status.to_string(), "sizes clamped: offsets above max_tokens, decreasing offsets");
        assert!(p.group_rows(&[0, 1, 2]).is_err());
        let m = MoeProblem::new(2, 8, 64, TokenLayout::Masked { max_rows: 16 }, OutputType::F16).unwrap();
        let (rows, status) = m.group_rows(&[3, 17]).unwrap();
        assert_eq!(
            rows.iter().map(|r| (r.first, r.rows, r.scale_first)).collect::<Vec<_>>(),
            vec![(0, 3, 0), (16, 16, 128)]
        );
        assert!(status.count_over_bound());
        assert_eq!(SizeStatus(0).to_string(), "ok");
    }

    fn good_buffers(p: &MoeProblem) -> MoeBuffers {
        let a = p.a_sizes();
        let w = p.b_sizes();
        let v = |i: u64, len| BufferView { ptr: 0x1000_0000 * i, len };
        MoeBuffers {
            sizes: v(1, p.sizes_len()),
            a_values: v(2, a.values),
            a_scales: v(3, a.scales),
            weights: (0..p.groups() as u64).map(|g| (v(10 + 2 * g, w.values), v(11 + 2 * g, w.scales))).collect(),
            alphas: vec![1.0; p.groups()],
            c: v(4, p.c_elements()),
            c_type: p.output(),
        }
    }

    #[test]
    fn run_buffers_are_checked_with_typed_errors() {
        let p = contiguous(3, 300);
        assert!(validate_moe_buffers(&p, &good_buffers(&p)).is_ok());
        type Breaker = fn(&mut MoeBuffers);
        let argument_cases: [(&str, Breaker); 9] = [
            ("sizes", |b| b.sizes.len = 3),
            ("sizes", |b| b.sizes.ptr += 2),
            ("a.values", |b| b.a_values.len -= 1),
            ("a.scales", |b| b.a_scales.len = 300 * 32), // not the grouped scale tensor
            ("a.scales", |b| b.a_scales.ptr += 8),
            ("c", |b| b.c.len += 1),
            ("c", |b| b.c_type = OutputType::Bf16),
            ("weights", |b| {
                b.weights.pop();
            }),
            ("alphas", |b| b.alphas.push(1.0)),
        ];
        for (field, break_it) in argument_cases {
            let mut b = good_buffers(&p);
            break_it(&mut b);
            match validate_moe_buffers(&p, &b).unwrap_err() {
                Error::InvalidArgument { field: f, .. } => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
        let group_cases: [(&str, Breaker); 3] = [
            ("b.values", |b| b.weights[1].0.len += 1),
            ("b.scales", |b| b.weights[1].1.ptr += 4),
            ("alpha", |b| b.alphas[1] = f32::INFINITY),
        ];
        for (field, break_it) in group_cases {
            let mut b = good_buffers(&p);
            break_it(&mut b);
            match validate_moe_buffers(&p, &b).unwrap_err() {
                Error::InvalidGroup { group, field: f, .. } => assert_eq!((group, f), (1, field)),
                other => panic!("{field}: {other:?}"),
            }
        }
    }

    /// C (the only output) overlapping any input is refused, naming both; the inputs may share
    /// memory (every expert the same weights, A's values and scales in one allocation).
    #[test]
    fn run_buffers_do_not_overlap_c() {
        let p = contiguous(3, 300);
        let good = good_buffers(&p);
        let c_bytes = 2 * good.c.len as u64;
        type Edit = fn(&mut MoeBuffers, u64);
        let cases: [(Edit, (Option<usize>, &str)); 4] = [
            (|b, _| b.c.ptr = b.a_values.ptr, (None, "a.values")),
            (|b, n| b.c.ptr = b.a_scales.ptr - n + 16, (None, "a.scales")),
            (|b, _| b.c.ptr = b.sizes.ptr - 16, (None, "sizes")),
            (|b, _| b.weights[2].1.ptr = b.c.ptr + 32, (Some(2), "b.scales")),
        ];
        for (i, (edit, other)) in cases.into_iter().enumerate() {
            let mut b = good.clone();
            edit(&mut b, c_bytes);
            match validate_moe_buffers(&p, &b).unwrap_err() {
                Error::Overlap { call: "moe run", output, other: o } => {
                    assert_eq!((output.group, output.field), (None, "c"), "case {i}");
                    assert_eq!((o.group, o.field), other, "case {i}");
                }
                e => panic!("case {i}: {e:?}"),
            }
        }
        let mut shared = good.clone();
        shared.weights = vec![good.weights[0]; 3];
        shared.a_scales.ptr = shared.a_values.ptr;
        shared.sizes.ptr = shared.a_values.ptr + 64;
        shared.c.ptr = good.weights[0].1.ptr + (p.b_sizes().scales as u64).next_multiple_of(16);
        assert!(validate_moe_buffers(&p, &shared).is_ok());
    }

    /// Shapes beyond the kernels' indexing or any device's memory are refused in constant time,
    /// naming the field and the limit.
    #[test]
    fn problem_limits() {
        let too_large = |g, n, k, layout| match MoeProblem::new(g, n, k, layout, OutputType::F16).unwrap_err() {
            Error::TooLarge { group: None, field, limit, .. } => (field, limit),
            other => panic!("{other:?}"),
        };
        let c = |t| TokenLayout::Contiguous { max_tokens: t };
        assert_eq!(too_large(MAX_GROUPS + 1, 8, 64, c(8)), ("groups", Limit::Groups));
        assert_eq!(too_large(1, 8, rules::MAX_DIM + 64, c(8)), ("k", Limit::Dim));
        assert_eq!(too_large(1, rules::MAX_DIM + 8, 64, c(8)), ("n", Limit::Dim));
        assert_eq!(too_large(1, 8, 64, c(rules::MAX_DIM + 1)), ("max_tokens", Limit::Dim));
        assert_eq!(too_large(1, 8, 1 << 20, c(4096)), ("a.values", Limit::Index32));
        assert_eq!(too_large(1, 1 << 20, 64, c(4096)), ("c", Limit::Index32));
        // G · M_max beyond 32 bits: refused before the abi's u32 formulas see it.
        let masked = TokenLayout::Masked { max_rows: rules::MAX_DIM };
        assert_eq!(too_large(MAX_GROUPS, 8, 64, masked), ("a.values", Limit::Index32));
        // Every expert's weights together beyond any device.
        assert_eq!(too_large(512, 1 << 17, 1 << 14, c(16)), ("weights", Limit::DeviceBytes));
        assert!(MoeProblem::new(256, 4096, 7168, c(1 << 16), OutputType::Bf16).is_ok());
        let e = MoeProblem::new(512, 1 << 17, 1 << 14, c(16), OutputType::F16).unwrap_err().to_string();
        assert!(e.contains("`weights`") && e.contains("274877906944"), "{e}");
    }

    #[test]
    fn grouped_quantize_arguments() {
        let p = MoeProblem::new(2, 8, 128, TokenLayout::Masked { max_rows: 10 }, OutputType::F16).unwrap();
        let a = p.a_sizes();
        let dense = BufferView { ptr: 0x10_0000, len: 20 * 128 };
        let sizes = BufferView { ptr: 0x20_0004, len: 2 };
        let values = BufferView { ptr: 0x30_0000, len: a.values };
        let scales = BufferView { ptr: 0x40_0000, len: a.scales };
        let params = validate_grouped_quantize(&p, dense, sizes, values, scales, 0.5, true).unwrap();
        assert_eq!(params.convert.rows, 20);
        assert_eq!((params.convert.bf16, params.convert.global_scale), (1, 0.5));
        assert_eq!(params.sizes, p.device_sizes(0x20_0004));
        let field = |r: Result<GroupedConvertParams>| match r.unwrap_err() {
            Error::InvalidArgument { field, .. } => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(validate_grouped_quantize(&p, dense, sizes, values, scales, 0.0, true)), "global_scale");
        let short = BufferView { len: 19 * 128, ..dense };
        assert_eq!(field(validate_grouped_quantize(&p, short, sizes, values, scales, 1.0, true)), "input");
        let odd = BufferView { ptr: 0x20_0002, ..sizes };
        assert_eq!(field(validate_grouped_quantize(&p, dense, odd, values, scales, 1.0, true)), "sizes");
        let overlap = |r: Result<GroupedConvertParams>| match r.unwrap_err() {
            Error::Overlap { call: "quantize_grouped", output, other } => (output.field, other.field),
            other => panic!("{other:?}"),
        };
        let on_input = BufferView { ptr: dense.ptr + 64, ..values };
        assert_eq!(
            overlap(validate_grouped_quantize(&p, dense, sizes, on_input, scales, 1.0, true)),
            ("values", "input")
        );
        let on_values = BufferView { ptr: values.ptr + 16, ..scales };
        assert_eq!(
            overlap(validate_grouped_quantize(&p, dense, sizes, values, on_values, 1.0, true)),
            ("scales", "values")
        );
        let on_sizes = BufferView { ptr: sizes.ptr - 4, ..scales };
        assert_eq!(
            overlap(validate_grouped_quantize(&p, dense, sizes, values, on_sizes, 1.0, true)),
            ("scales", "sizes")
        );
        // The inputs may share memory (e.g. sizes inside the activations' allocation).
        let shared = BufferView { ptr: dense.ptr + 64, ..sizes };
        assert!(validate_grouped_quantize(&p, dense, shared, values, scales, 1.0, true).is_ok());
    }
}
