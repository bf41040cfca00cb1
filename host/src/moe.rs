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
//!     let mut args = MoeArgs { sizes: &offsets, a: a.operand().into(), weights: &b, alphas: &alphas, c: Output::Bf16(c) };
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
use crate::driver::launch::Start;
use crate::engine::{Alphas, Engine, Prepared};
use crate::error::{invalid, Error, Result};
use crate::overlap::{self, Span};
use crate::plan::{w4a16_unsupported, Nvfp4Operand, Output, TokenOperand};
use crate::problem::{BufferView, CallBuffers, TokenKind, BUFFER_ALIGN};
use crate::quantize::{DenseFloat, Nvfp4OperandMut, Quantizer};
use crate::sm100::{resident_ctas, Sm100DeviceLayout};
use crate::sm90::Sm90DeviceLayout;
use crate::summary::PlanSummary;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use nvfp4_gemm_abi::moe::sm90::Sm90ScheduleParams;
pub use nvfp4_gemm_abi::moe::GroupRows;
use nvfp4_gemm_abi::moe::GroupedConvertParams;
use nvfp4_gemm_abi::quantize::{self as qabi, ConvertParams};
#[cfg(doc)]
use nvfp4_gemm_abi::sm90::TokenWorkspace;
use std::sync::Arc;

/// How the grouped quantizer and the block's routing start: early, while the kernel before them
/// runs (`nvfp4_gemm_abi::moe::STARTS_EARLY`: they wait for it before touching memory).
pub(crate) const CHAIN_START: Start =
    if nvfp4_gemm_abi::moe::STARTS_EARLY { Start::Early } else { Start::AfterPrevious };

/// How the activation and the combine start: once the GEMM before them has ended. They would be
/// correct launched early (they wait first), but a GEMM lets its dependents be scheduled at its
/// start (`sm90::GEMM_RELEASES_AT_START`), and their grids, placed on the SMs while a large
/// GEMM's last tiles still ran, made large calls slower than the plain launch does.
pub(crate) const AFTER_GEMM_START: Start = Start::AfterPrevious;

pub use crate::moe_problem::{
    interleave_w13_row, validate_moe_buffers, ActivatedOutput, ActivationEpilogue, GlobalScale, MoeBuffers, MoeProblem,
    MoeTokens, SizeStatus, TokenLayout,
};
/// Most groups of a [`MoeProblem`].
pub use crate::rules::MAX_GROUPS;

/// The device buffers of one [`MoePlan::run`]. Borrowed for the call, never copied.
pub struct MoeArgs<'a> {
    /// `offsets[G + 1]` or `counts[G]` ([`MoeProblem::sizes_len`] `u32`s), read on the device.
    pub sizes: &'a dyn DevicePtr<u32>,
    /// The token tensor A in the problem's layout: NVFP4 ([`MoeProblem::a_sizes`], e.g. written by
    /// [`Quantizer::quantize_grouped`] with the same sizes), or for a W4A16 problem its 16-bit
    /// activations `[token_rows, K]`.
    pub a: TokenOperand<'a>,
    /// Each group's weights B (`N x K`, [`MoeProblem::b_sizes`]; for W4A16 prepacked), `G` of
    /// them.
    pub weights: &'a [Nvfp4Operand<'a>],
    /// Each group's alpha (`g_a · g_b`), `G` finite values.
    pub alphas: &'a [f32],
    /// C, [`MoeProblem::c_elements`] elements of the problem's output type. Rows of no group are
    /// left as they are.
    pub c: Output<'a>,
}

/// One architecture's device-sized plan: the engine over its layout.
enum DevicePlan {
    Sm90(Engine<Sm90DeviceLayout>),
    Sm100(Engine<Sm100DeviceLayout>),
}

/// A call of an sm_90a [`MoePlan`] prepared for a scheduler the caller launches
/// ([`MoePlan::prepare_scheduled`]).
#[must_use = "a prepared call is launched by `MoePlan::launch_scheduled`"]
pub(crate) struct ScheduledCall {
    prepared: Prepared,
    /// The scheduler's parameters.
    pub schedule: Sm90ScheduleParams,
}

/// A [`MoeProblem`] planned for one GPU: kernels, the group table, the tensor maps, the work
/// list for the bounds, the work-length and status words (and on sm_90a the f16 token
/// workspace) — all allocated once by [`MoePlan::new`].
///
/// [`MoePlan::run`] launches the scheduler (sizes → group table, work list, work length,
/// status), then on sm_90a the token dequantization (NVFP4 tokens) and the GEMM, on sm_100a the
/// GEMM (which reads A through a tensor map). A call whose weights and alphas (and, where the
/// maps hold it, A's address: sm_100a, and W4A16's activations) are those of the previous call
/// copies nothing from the host; the sizes and C (and on sm_90a NVFP4 A) are kernel parameters
/// and may change freely. Inside a CUDA graph capture every call is captured; the graph keeps the
/// tables it read (run the plan once outside capture first, with the weights, so that the graph
/// needs no upload of its own).
///
/// ⚠ The sm_100a path has never run on a GPU (no B200 was available): its kernels are checked
/// by ptxas and run in the CPU model of the device (`model-tests/`), not on hardware.
pub struct MoePlan {
    problem: MoeProblem,
    plan: DevicePlan,
    /// The last call's weights and alphas, their memory reused so that a call allocates nothing.
    weights: Vec<(BufferView, BufferView)>,
    alphas: Vec<f32>,
}

impl MoePlan {
    /// Plans `problem` for `gpu` and allocates everything a call needs.
    pub fn new(gpu: &Gpu, problem: MoeProblem) -> Result<MoePlan> {
        Self::with_options(gpu, problem, &MoeOptions::default())
    }

    /// [`MoePlan::new`] with `options` (on sm_90a: which GEMM kernels a call may run).
    pub fn with_options(gpu: &Gpu, problem: MoeProblem, options: &MoeOptions) -> Result<MoePlan> {
        let plan = match gpu.arch() {
            Arch::Sm90a => {
                DevicePlan::Sm90(Engine::new(gpu, Sm90DeviceLayout::new(&problem, gpu.sm_count(), options)?)?)
            }
            Arch::Sm100a => {
                if problem.tokens() != TokenKind::Nvfp4 {
                    return Err(w4a16_unsupported(gpu.arch()));
                }
                if problem.activation_epilogue().is_some() {
                    return Err(Error::Unsupported(
                        "the activation epilogue is in the sm_90a GEMMs; on sm_100a the block runs its activation kernel"
                            .into(),
                    ));
                }
                let resident = resident_ctas(gpu)?;
                let layout = Sm100DeviceLayout::new(&problem, |k| {
                    resident.iter().find(|(x, _)| *x == k).map_or(0, |(_, c)| *c)
                })?;
                DevicePlan::Sm100(Engine::new(gpu, layout)?)
            }
        };
        let (weights, alphas) = (Vec::with_capacity(problem.groups()), Vec::with_capacity(problem.groups()));
        Ok(MoePlan { problem, plan, weights, alphas })
    }

    /// The problem this plan was built for.
    pub fn problem(&self) -> &MoeProblem {
        &self.problem
    }

    /// What the planner chose (`tiles`: the work list's capacity).
    pub fn summary(&self) -> &PlanSummary {
        match &self.plan {
            DevicePlan::Sm90(e) => e.summary(),
            DevicePlan::Sm100(e) => e.summary(),
        }
    }

    /// Runs the grouped GEMM on `stream` for the sizes in `args.sizes` as they are when the
    /// kernels run. Every buffer is validated first; on any error nothing is launched.
    pub fn run<'s>(&mut self, stream_arc: &'s Arc<CudaStream>, args: &'s mut MoeArgs<'_>) -> Result<()> {
        crate::host_timing::start();
        // Holds the buffers' stream-ordering guards until the launches are enqueued.
        let mut call = CallBuffers::new(stream_arc);
        let a = match args.a.views(&mut call) {
            (TokenKind::Nvfp4, values, scales) => MoeTokens::Nvfp4 { values, scales },
            (TokenKind::Dense(kind), activations, _) => MoeTokens::Dense { activations, kind },
        };
        let sizes = call.read(args.sizes);
        self.weights.clear();
        for w in args.weights {
            self.weights.push((call.read(w.values), call.read(w.scales)));
        }
        let (c, c_type) = call.output(&mut args.c);
        self.alphas.clear();
        self.alphas.extend_from_slice(args.alphas);
        let (weights, alphas) = (std::mem::take(&mut self.weights), std::mem::take(&mut self.alphas));
        let buffers = MoeBuffers { sizes, a, weights, alphas, c, c_type, activated: None };
        crate::host_timing::mark(crate::host_timing::step::READ);
        // SAFETY: the guards in `call` keep the buffers alive until the launches are enqueued,
        // stream order for the work.
        let result = unsafe { self.run_views(stream_arc, &buffers) };
        (self.weights, self.alphas) = (buffers.weights, buffers.alphas);
        drop(call);
        crate::host_timing::mark(crate::host_timing::step::RELEASE);
        result
    }

    /// [`MoePlan::run`] on buffers given as addresses and lengths: the typed entry of bindings,
    /// with the same checks.
    ///
    /// # Safety
    /// As [`crate::GemmPlan::run_views`], for every buffer of `buffers`.
    pub unsafe fn run_views(&mut self, stream: &Arc<CudaStream>, buffers: &MoeBuffers) -> Result<()> {
        validate_moe_buffers(&self.problem, buffers)?;
        crate::host_timing::mark(crate::host_timing::step::CHECK);
        // SAFETY: validated against the problem; the caller's contract for the memory.
        unsafe {
            match &mut self.plan {
                DevicePlan::Sm90(e) => e.run(stream, buffers, Alphas::Host),
                DevicePlan::Sm100(e) => e.run(stream, buffers, Alphas::Host),
            }
        }
    }

    /// [`MoePlan::run_views`]' checks and tables on sm_90a, without its launches: the scheduler's
    /// parameters for the call, which the MoE block runs inside its quantization launch
    /// (`abi::moe::sm90::QUANTIZE_SCHEDULE_KERNEL`); [`MoePlan::launch_scheduled`] then enqueues
    /// the launches after the scheduler. `None` on sm_100a (nothing prepared: the call runs whole
    /// through [`MoePlan::run_views`]).
    ///
    /// # Safety
    /// As [`MoePlan::run_views`].
    pub(crate) unsafe fn prepare_scheduled(
        &mut self,
        stream: &Arc<CudaStream>,
        buffers: &MoeBuffers,
    ) -> Result<Option<ScheduledCall>> {
        let DevicePlan::Sm90(e) = &mut self.plan else { return Ok(None) };
        validate_moe_buffers(&self.problem, buffers)?;
        // SAFETY: validated against the problem; the caller's contract for the memory.
        let prepared = unsafe { e.prepare(stream, buffers, Alphas::Host)? };
        let schedule = e.layout.schedule_params(buffers, &e.tables_of(&prepared));
        Ok(Some(ScheduledCall { prepared, schedule }))
    }

    /// Enqueues the launches of a call [`MoePlan::prepare_scheduled`] prepared for the same
    /// `buffers`, after its scheduler (whose parameters it returned, run by the caller's launch
    /// already enqueued on `stream`).
    ///
    /// # Safety
    /// As [`MoePlan::run_views`]; the scheduler's launch enqueued before.
    pub(crate) unsafe fn launch_scheduled(
        &mut self,
        stream: &Arc<CudaStream>,
        buffers: &MoeBuffers,
        call: ScheduledCall,
    ) -> Result<()> {
        let DevicePlan::Sm90(e) = &mut self.plan else { unreachable!("prepare_scheduled prepares sm_90a plans only") };
        // SAFETY: prepared for `buffers`; the caller's contract (its scheduler, the layout's
        // first launch, enqueued).
        unsafe { e.launch(stream, buffers, call.prepared, &[crate::sm90::SCHEDULE]) }
    }

    /// Tells the plan that the calls that follow route at most `rows` rows in all their groups
    /// together (`None`, the default: no bound beyond the problem's), e.g. `T · top_k` of an MoE
    /// layer's step. On sm_90a a plan that may run both GEMM kernels ([`MoeKernels::Auto`])
    /// launches the decode kernel alone for at most 16 rows: the scheduler gives every such call
    /// to it anyway, and the general kernel's launch would find no work. Above 16 rows per group
    /// it launches the general kernel first, the one that does the work when they are all
    /// routed (the decode kernel's launch after it then finds none). A call with more rows than
    /// told is still computed (by the decode kernel), or flagged in the status word where the
    /// decode kernel's list cannot hold it; one with fewer is computed as without the hint.
    pub fn set_routed_rows(&mut self, rows: Option<usize>) {
        if let DevicePlan::Sm90(e) = &mut self.plan {
            e.layout.set_routed_rows(rows);
        }
    }

    /// The f16 token workspace a plan with [`MoeOptions::caller_dequantizes`] reads its tokens
    /// from, [`TokenWorkspace::bytes`]`(token_rows, K)` bytes at its start, which the caller's
    /// quantizing kernel writes (the MoE block's gather and activation,
    /// `nvfp4_gemm::moe_block::BlockOutput::Nvfp4`'s `workspace`); `None` for any other plan.
    pub fn token_workspace(&mut self) -> Option<&mut CudaSlice<u8>> {
        match &mut self.plan {
            DevicePlan::Sm90(e) if e.layout.caller_dequantizes => Some(e.workspace_mut()),
            _ => None,
        }
    }

    /// The plan's status word on the device (`u32`, [`SizeStatus`] bits), e.g. to copy it inside
    /// a graph.
    pub fn status(&self) -> &CudaSlice<u32> {
        match &self.plan {
            DevicePlan::Sm90(e) => e.status(),
            DevicePlan::Sm100(e) => e.status(),
        }
    }

    /// Copies the status word to the host. Synchronizes `stream` (call it outside capture, when
    /// the results are wanted anyway).
    pub fn read_status(&self, stream: &Arc<CudaStream>) -> Result<SizeStatus> {
        let d = |e| Error::driver("reading the plan's status word", e);
        let v = stream.clone_dtoh(self.status()).map_err(d)?;
        stream.synchronize().map_err(d)?;
        Ok(SizeStatus(v[0]))
    }

    /// Resets the status word on `stream` (an asynchronous memset: capturable).
    pub fn clear_status(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        match &mut self.plan {
            DevicePlan::Sm90(e) => e.clear_status(stream),
            DevicePlan::Sm100(e) => e.clear_status(stream),
        }
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

impl Quantizer {
    /// [`Quantizer::quantize_grouped`] on buffers given as addresses and lengths (`input`: f16, or
    /// bf16 when `bf16`), as [`Quantizer::quantize_views`].
    ///
    /// # Safety
    /// As [`crate::GemmPlan::run_views`], for every buffer.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn quantize_grouped_views(
        &self,
        stream: &CudaStream,
        input: BufferView,
        bf16: bool,
        problem: &MoeProblem,
        sizes: BufferView,
        global_scale: f32,
        values: BufferView,
        scales: BufferView,
    ) -> Result<()> {
        let params = validate_grouped_quantize(problem, input, sizes, values, scales, global_scale, bf16)?;
        let items = params.convert.rows as u64 * (params.convert.k / qabi::BLOCK) as u64;
        // SAFETY: validated; the caller's contract for the memory.
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
        ("input", dense, p.token_rows() * p.k(), BUFFER_ALIGN),
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
            k: p.k() as u32,
            global_scale,
            bf16: bf16 as u32,
        },
        sizes: p.device_sizes(sizes.ptr),
        gather: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::OutputType;

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
