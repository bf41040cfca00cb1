//! The reusable plan: a problem bound to a device, with its configuration, work list, parameter
//! tables and workspace; and the launch.

use crate::device::{Arch, Gpu};
use crate::engine::{Alphas, Engine};
use crate::error::{Error, Result};
use crate::problem::{
    stacked_parts, validate_device_alphas, BufferCache, BufferSizes, BufferView, CallBuffers, GroupBuffers, OutputType,
    Problem, TokenKind, DEVICE_ALPHA_PLACEHOLDER,
};
use crate::sm100::{resident_ctas, Sm100Layout};
use crate::sm90::Sm90Layout;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use half::{bf16, f16};
use nvfp4_gemm_abi::sm90::w4a16::Activations;
use std::sync::Arc;

pub use crate::summary::{KernelLaunch, PlanSummary};

/// One NVFP4 operand on the device: packed e2m1 values (two per byte, low nibble first; a row of K
/// values is K/2 bytes) and e4m3 block scales in the 128x4 blocked layout.
#[derive(Clone, Copy)]
pub struct Nvfp4Operand<'a> {
    /// Packed values, `rows · k / 2` bytes.
    pub values: &'a dyn DevicePtr<u8>,
    /// Blocked scales, `ceil(rows/128)·128 · k/16` bytes (see `nvfp4_format::layout`).
    pub scales: &'a dyn DevicePtr<u8>,
}

/// The token operand A of a call: NVFP4 tokens, or W4A16's 16-bit activations (row-major, used as
/// they are), as the problem's [`TokenKind`] says.
#[derive(Clone, Copy)]
pub enum TokenOperand<'a> {
    /// NVFP4 tokens.
    Nvfp4(Nvfp4Operand<'a>),
    /// f16 activations.
    F16(&'a dyn DevicePtr<f16>),
    /// bf16 activations.
    Bf16(&'a dyn DevicePtr<bf16>),
}

impl<'a> From<Nvfp4Operand<'a>> for TokenOperand<'a> {
    fn from(op: Nvfp4Operand<'a>) -> TokenOperand<'a> {
        TokenOperand::Nvfp4(op)
    }
}

impl<'s> TokenOperand<'s> {
    /// What the operand is, and the views of its buffers (A's values and scales, or the
    /// activations and an empty view) for a call on `call`'s stream.
    #[inline(always)]
    pub(crate) fn views(self, call: &mut CallBuffers<'s>) -> (TokenKind, BufferView, BufferView) {
        const NONE: BufferView = BufferView { ptr: 0, len: 0 };
        match self {
            TokenOperand::Nvfp4(op) => (TokenKind::Nvfp4, call.read(op.values), call.read(op.scales)),
            TokenOperand::F16(x) => (TokenKind::Dense(Activations::F16), call.read(x), NONE),
            TokenOperand::Bf16(x) => (TokenKind::Dense(Activations::Bf16), call.read(x), NONE),
        }
    }
}

/// The output buffer of one group, `m · n` elements, row-major.
pub enum Output<'a> {
    /// fp16 output.
    F16(&'a mut dyn DevicePtrMut<f16>),
    /// bf16 output.
    Bf16(&'a mut dyn DevicePtrMut<bf16>),
}

/// The device buffers of one group. Borrowed for the call, never copied.
pub struct GroupArgs<'a> {
    /// A (`m × k`, tokens): NVFP4, or activations for a W4A16 problem.
    pub a: TokenOperand<'a>,
    /// B (`n × k`, weights; for W4A16 prepacked by [`crate::w4a16::prepack`]).
    pub b: Nvfp4Operand<'a>,
    /// C (`m × n`).
    pub c: Output<'a>,
    /// Multiplier applied to the fp32 accumulator (NVFP4's global scale); 1.0 for none. Not read
    /// by [`GemmPlan::run_with_device_alphas`].
    pub alpha: f32,
}

/// Choices a plan makes that a caller may take over (the default: the library's own).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct PlanOptions {
    /// The sm_90a GEMM kernel to run instead of the cost model's choice, by its exported name
    /// (`sm90_grouped_gemm`, `sm90_grouped_gemm_t64`, `sm90_grouped_gemm_n192`, or
    /// `sm90_grouped_gemm_decode` where every group has at most 16 tokens; a W4A16 problem runs
    /// the named variant's W4A16 twin), for measuring one variant against another on the same
    /// problem. A name that is no sm_90a GEMM kernel, or a variant that cannot run the problem,
    /// is an error of [`GemmPlan::with_options`]. Ignored on sm_100a.
    pub sm90_kernel: Option<String>,
}

impl PlanOptions {
    /// These options with [`PlanOptions::sm90_kernel`] set to `kernel`.
    pub fn with_sm90_kernel(mut self, kernel: impl Into<String>) -> PlanOptions {
        self.sm90_kernel = Some(kernel.into());
        self
    }
}

/// Every group's buffers in one allocation per operand (*stacked*), for
/// [`GemmPlan::run_stacked`]: the groups' parts back to back in group order, group `g`'s at
/// [`Problem::stacked_offsets`]`()[g]`, each buffer exactly as long as all parts together. This
/// is how a mixture-of-experts layer usually holds its operands: the experts' weights as one
/// `[G, N, K/2]` tensor with one tensor of their scales, the tokens sorted by expert, C as one
/// `[T, N]` tensor.
pub struct StackedArgs<'a> {
    /// Every group's A: values `Σ m·k/2` bytes, scales `Σ ceil(m/128)·128·k/16` bytes; or W4A16's
    /// activations, `Σ m·k` elements.
    pub a: TokenOperand<'a>,
    /// Every group's B: values `Σ n·k/2` bytes, scales `Σ ceil(n/128)·128·k/16` bytes.
    pub b: Nvfp4Operand<'a>,
    /// Every group's C: `Σ m·n` elements.
    pub c: Output<'a>,
    /// One alpha per group. Not read by [`GemmPlan::run_stacked_with_device_alphas`].
    pub alphas: &'a [f32],
}

/// Every group's buffers stacked ([`StackedArgs`]) as addresses and lengths, for
/// [`GemmPlan::run_stacked_views`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StackedViews {
    /// What A is.
    pub a_kind: TokenKind,
    /// A's values (bytes) or activations (elements).
    pub a_values: BufferView,
    /// A's scales (bytes; empty for activations).
    pub a_scales: BufferView,
    /// B's values (bytes).
    pub b_values: BufferView,
    /// B's scales (bytes).
    pub b_scales: BufferView,
    /// C (elements).
    pub c: BufferView,
    /// C's type.
    pub c_type: OutputType,
}

/// [`Error::InvalidArgument`] of `call` for the first stacked buffer `(field, length, the
/// groups' total, unit)` whose length is not its groups' total.
pub(crate) fn check_stacked_lengths(call: &'static str, lengths: &[(&'static str, usize, usize, &str)]) -> Result<()> {
    for &(field, len, want, unit) in lengths {
        if len != want {
            let reason = format!("has {len} {unit}; the stacked groups need exactly {want}");
            return Err(Error::InvalidArgument { call, field, reason });
        }
    }
    Ok(())
}

impl<'s> CallBuffers<'s> {
    /// The view of C and its type, for this call.
    #[inline(always)]
    pub(crate) fn output(&mut self, c: &'s mut Output<'_>) -> (BufferView, OutputType) {
        match c {
            Output::F16(c) => (self.write(&mut **c), OutputType::F16),
            Output::Bf16(c) => (self.write(&mut **c), OutputType::Bf16),
        }
    }
}

/// One architecture's plan: the engine over its host-sized layout. Both are `Send`, so that a
/// [`GemmPlan`] can move between threads (bindings hand it to whichever thread calls).
// One per plan, made once: the variants' sizes differ by a few hundred bytes, not worth a box.
#[allow(clippy::large_enum_variant)]
enum ArchPlan {
    Sm90(Engine<Sm90Layout>),
    Sm100(Engine<Sm100Layout>),
}

/// A grouped GEMM problem planned for one GPU. Build it once per set of shapes and call
/// [`GemmPlan::run`] as often as needed: a call whose buffer addresses and alphas equal the
/// previous call's only launches; a call with other buffers patches the plan's tables on the host
/// and copies them to the device on the stream first (one copy of a few kilobytes, staged by the
/// driver at the call). Alphas may also live on the device ([`GemmPlan::run_with_device_alphas`]):
/// each call then copies them into the tables on the stream, so a captured graph reads new values
/// at every replay. No call allocates device memory or synchronizes the host (but the first one
/// outside capture after a capture, which gives the plan new tables: the captured graph keeps the
/// old ones).
///
/// The token operand is the problem's ([`Problem::with_tokens`]): NVFP4 tokens (W4A4), or on
/// sm_90a 16-bit activations times weights prepacked by [`crate::w4a16::prepack`] (W4A16; the
/// same tiles and work list, no token dequantization).
pub struct GemmPlan {
    problem: Problem,
    plan: ArchPlan,
    /// The last valid call's buffers, to skip validating unchanged ones.
    cache: BufferCache,
    /// [`Problem::stacked_offsets`], for [`GemmPlan::run_stacked`].
    stacked: Vec<BufferSizes>,
}

impl GemmPlan {
    /// Plans `problem` for `gpu`: chooses the kernel configuration, builds the work list, and
    /// allocates the tables and the workspace (once).
    pub fn new(gpu: &Gpu, problem: Problem) -> Result<GemmPlan> {
        GemmPlan::with_options(gpu, problem, PlanOptions::default())
    }

    /// [`GemmPlan::new`] with the choices `options` takes over.
    pub fn with_options(gpu: &Gpu, problem: Problem, options: PlanOptions) -> Result<GemmPlan> {
        let plan = match gpu.arch() {
            Arch::Sm90a => {
                let layout = Sm90Layout::named(&problem, gpu.sm_count(), options.sm90_kernel.as_deref())?;
                ArchPlan::Sm90(Engine::new(gpu, layout)?)
            }
            // Built and statically checked (ptxas, PTX/SASS contents, host-tested encodings);
            // never run: there is no B200 here.
            Arch::Sm100a => {
                // W4A16 is refused before the driver is asked anything.
                if problem.tokens() != TokenKind::Nvfp4 {
                    return Err(w4a16_unsupported(gpu.arch()));
                }
                let resident = resident_ctas(gpu)?;
                let layout =
                    Sm100Layout::new(&problem, |k| resident.iter().find(|(x, _)| *x == k).map_or(0, |(_, c)| *c))?;
                ArchPlan::Sm100(Engine::new(gpu, layout)?)
            }
        };
        let cache = BufferCache::new(problem.groups().len());
        let stacked = problem.stacked_offsets();
        Ok(GemmPlan { problem, plan, cache, stacked })
    }

    /// The problem this plan was built for.
    pub fn problem(&self) -> &Problem {
        &self.problem
    }

    /// What the planner chose.
    pub fn summary(&self) -> &PlanSummary {
        match &self.plan {
            ArchPlan::Sm90(e) => e.summary(),
            ArchPlan::Sm100(e) => e.summary(),
        }
    }

    /// Runs the grouped GEMM on `stream` with the given buffers (one entry per group, in order).
    /// Every buffer is validated against the problem first (lengths, alignment, types, alphas,
    /// and no C overlapping any other buffer of the call, [`Error::Overlap`]; the operands may
    /// share memory); on any error nothing is launched.
    ///
    /// A call with exactly the buffers (addresses, lengths, output types and alphas) of one of the
    /// last 16 valid calls costs comparisons on the host, and launches over tables encoded for
    /// them already (while one of the plan's 16 table sets still holds them): those buffers were
    /// validated before. Other buffers cost a validation and one upload of the tables.
    pub fn run<'s>(&mut self, stream_arc: &'s Arc<CudaStream>, groups: &'s mut [GroupArgs<'_>]) -> Result<()> {
        self.run_groups(stream_arc, groups, None, "run")
    }

    /// [`GemmPlan::run`] with the alphas read on the device: group `g`'s alpha is `alphas[g]` as
    /// it is when the call's work runs (each [`GroupArgs::alpha`] is not read). The call copies
    /// the `G` values into the plan's group table on `stream` before its launches (one strided
    /// device-to-device copy): no host synchronization, and capturable in a CUDA graph whose
    /// replays read the buffer's values at each replay. A call with the previous call's buffers
    /// (and device alphas) uploads nothing from the host, whatever the values.
    ///
    /// `alphas` must hold exactly `G` `f32`s, 4-byte aligned, sharing no byte with any group's C
    /// ([`Error::InvalidArgument`], [`Error::Overlap`]). Its values are not checked: a NaN or
    /// infinite alpha gives NaN or infinite outputs.
    pub fn run_with_device_alphas<'s>(
        &mut self,
        stream_arc: &'s Arc<CudaStream>,
        groups: &'s mut [GroupArgs<'_>],
        alphas: &'s dyn DevicePtr<f32>,
    ) -> Result<()> {
        self.run_groups(stream_arc, groups, Some(alphas), "run_with_device_alphas")
    }

    /// [`GemmPlan::run`] (`alphas` `None`) or [`GemmPlan::run_with_device_alphas`], as `call`.
    fn run_groups<'s>(
        &mut self,
        stream_arc: &'s Arc<CudaStream>,
        groups: &'s mut [GroupArgs<'_>],
        alphas: Option<&'s dyn DevicePtr<f32>>,
        call_name: &'static str,
    ) -> Result<()> {
        let stream: &CudaStream = stream_arc;
        crate::host_timing::start();
        // Holds the buffers' stream-ordering guards until the launches are enqueued.
        let mut call = CallBuffers::new(stream);
        let alphas = alphas.map(|a| call.read(a));
        let buffers = self.cache.start();
        for args in groups.iter_mut() {
            let (a_kind, a_values, a_scales) = args.a.views(&mut call);
            let (b_values, b_scales) = (call.read(args.b.values), call.read(args.b.scales));
            let (c, c_type) = call.output(&mut args.c);
            let alpha = if alphas.is_some() { DEVICE_ALPHA_PLACEHOLDER } else { args.alpha };
            buffers.push(GroupBuffers { a_kind, a_values, a_scales, b_values, b_scales, c, c_type, alpha });
        }
        crate::host_timing::mark(crate::host_timing::step::READ);
        let result = self.launch_checked(stream_arc, call_name, alphas);
        drop(call);
        crate::host_timing::mark(crate::host_timing::step::RELEASE);
        result
    }

    /// Runs the grouped GEMM on `stream` with every group's buffers stacked ([`StackedArgs`]):
    /// the same computation and checks as [`GemmPlan::run`] on each group's part, with five buffer
    /// accesses per call instead of five per group (the host time of a call of 64 groups is
    /// mostly those accesses). A buffer whose length is not the sum of its parts, or an alpha
    /// count other than the groups', is an error (`Error::InvalidArgument`), and so is C
    /// overlapping an operand buffer (`Error::Overlap`, naming the groups' parts that share
    /// bytes); on any error nothing is launched.
    ///
    /// ```no_run
    /// use nvfp4_gemm::format::{random_groups, Group, GroupShape, InputDistribution};
    /// use nvfp4_gemm::{GemmPlan, Gpu, Nvfp4Operand, Output, OutputType, Problem, StackedArgs};
    ///
    /// let gpu = Gpu::new(0)?;
    /// let stream = gpu.context().default_stream();
    /// let shapes = vec![GroupShape::new(4, 512, 256); 8]; // 8 experts, 4 tokens each
    /// let problem = Problem::new(shapes.clone(), OutputType::Bf16)?;
    /// let mut plan = GemmPlan::new(&gpu, problem.clone())?;
    /// // Host NVFP4 matrices, stacked in group order and uploaded as one buffer per operand.
    /// let groups = random_groups(&shapes, InputDistribution::Competition, 1)?;
    /// let cat = |part: fn(&Group) -> &[u8]| -> Vec<u8> { groups.iter().flat_map(part).copied().collect() };
    /// let a_values = stream.clone_htod(&cat(|g| g.a.values()))?;
    /// let a_scales = stream.clone_htod(&cat(|g| g.a.scales()))?; // blocked, per group
    /// let b_values = stream.clone_htod(&cat(|g| g.b.values()))?;
    /// let b_scales = stream.clone_htod(&cat(|g| g.b.scales()))?;
    /// let total = problem.stacked_offsets()[shapes.len()];
    /// assert_eq!(total.b_values, b_values.len());
    /// let mut c = stream.alloc_zeros::<half::bf16>(total.c_elements)?;
    /// let alphas: Vec<f32> = groups.iter().map(|g| g.effective_alpha_f32()).collect();
    /// let mut args = StackedArgs {
    ///     a: Nvfp4Operand { values: &a_values, scales: &a_scales }.into(),
    ///     b: Nvfp4Operand { values: &b_values, scales: &b_scales },
    ///     c: Output::Bf16(&mut c),
    ///     alphas: &alphas,
    /// };
    /// plan.run_stacked(&stream, &mut args)?; // group g's C at problem.stacked_offsets()[g].c_elements
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn run_stacked<'s>(&mut self, stream_arc: &'s Arc<CudaStream>, args: &'s mut StackedArgs<'_>) -> Result<()> {
        self.run_stacked_from(stream_arc, args, None, "run_stacked")
    }

    /// [`GemmPlan::run_stacked`] with the alphas read on the device, as
    /// [`GemmPlan::run_with_device_alphas`] reads them ([`StackedArgs::alphas`] is not read and
    /// may be empty).
    pub fn run_stacked_with_device_alphas<'s>(
        &mut self,
        stream_arc: &'s Arc<CudaStream>,
        args: &'s mut StackedArgs<'_>,
        alphas: &'s dyn DevicePtr<f32>,
    ) -> Result<()> {
        self.run_stacked_from(stream_arc, args, Some(alphas), "run_stacked_with_device_alphas")
    }

    /// [`GemmPlan::run_stacked`] (`alphas` `None`) or
    /// [`GemmPlan::run_stacked_with_device_alphas`], as `call`.
    fn run_stacked_from<'s>(
        &mut self,
        stream_arc: &'s Arc<CudaStream>,
        args: &'s mut StackedArgs<'_>,
        alphas: Option<&'s dyn DevicePtr<f32>>,
        call_name: &'static str,
    ) -> Result<()> {
        let stream: &CudaStream = stream_arc;
        let mut call = CallBuffers::new(stream);
        let (a_kind, a_values, a_scales) = args.a.views(&mut call);
        let (b_values, b_scales) = (call.read(args.b.values), call.read(args.b.scales));
        let (c, c_type) = call.output(&mut args.c);
        let alphas = alphas.map(|a| call.read(a));
        let views = StackedViews { a_kind, a_values, a_scales, b_values, b_scales, c, c_type };
        self.stacked_call(stream_arc, &views, args.alphas, alphas, call_name)
    }

    /// A stacked call (`call`): its buffers' lengths checked against the groups' totals, each
    /// group's parts validated and run (alphas from `host_alphas`, or `device_alphas`).
    fn stacked_call(
        &mut self,
        stream: &Arc<CudaStream>,
        v: &StackedViews,
        host_alphas: &[f32],
        device_alphas: Option<BufferView>,
        call: &'static str,
    ) -> Result<()> {
        let groups = self.problem.groups().len();
        let total = self.stacked[groups];
        let nvfp4 = v.a_kind == TokenKind::Nvfp4;
        let lengths = [
            (
                if nvfp4 { "a.values" } else { "activations" },
                v.a_values.len,
                total.a_values,
                if nvfp4 { "bytes" } else { "elements" },
            ),
            ("a.scales", v.a_scales.len, total.a_scales, "bytes"),
            ("b.values", v.b_values.len, total.b_values, "bytes"),
            ("b.scales", v.b_scales.len, total.b_scales, "bytes"),
            ("c", v.c.len, total.c_elements, "elements"),
        ];
        if v.a_kind == self.problem.tokens() {
            check_stacked_lengths(call, &lengths)?;
        }
        if device_alphas.is_none() && host_alphas.len() != groups {
            let reason = format!("{} alphas for {groups} groups", host_alphas.len());
            return Err(Error::InvalidArgument { call, field: "alphas", reason });
        }
        let whole = [v.a_values, v.a_scales, v.b_values, v.b_scales];
        let buffers = self.cache.start();
        match device_alphas {
            None => stacked_parts(&self.stacked, v.a_kind, whole, v.c, v.c_type, host_alphas.iter().copied(), buffers),
            Some(_) => {
                let placeholders = std::iter::repeat(DEVICE_ALPHA_PLACEHOLDER);
                stacked_parts(&self.stacked, v.a_kind, whole, v.c, v.c_type, placeholders, buffers)
            }
        }
        self.launch_checked(stream, call, device_alphas)
    }

    /// [`GemmPlan::run`] (or, with `device_alphas`, [`GemmPlan::run_with_device_alphas`]) on
    /// buffers given as addresses and lengths: the typed entry of bindings (the Python package,
    /// the C interface), with the same checks. With device alphas each group's `alpha` is not
    /// read.
    ///
    /// # Safety
    /// Every view must be device memory of its length (in elements of its buffer's type) in
    /// `stream`'s context, alive and not written by anything else until the work enqueued now has
    /// completed; the checks cover lengths, alignment and overlaps, not that the memory exists.
    pub unsafe fn run_views(
        &mut self,
        stream: &Arc<CudaStream>,
        groups: &[GroupBuffers],
        device_alphas: Option<BufferView>,
    ) -> Result<()> {
        let buffers = self.cache.start();
        buffers.extend_from_slice(groups);
        if device_alphas.is_some() {
            buffers.iter_mut().for_each(|b| b.alpha = DEVICE_ALPHA_PLACEHOLDER);
        }
        let call = if device_alphas.is_some() { "run_with_device_alphas" } else { "run" };
        self.launch_checked(stream, call, device_alphas)
    }

    /// [`GemmPlan::run_stacked`] (or [`GemmPlan::run_stacked_with_device_alphas`]) on buffers
    /// given as addresses and lengths, as [`GemmPlan::run_views`].
    ///
    /// # Safety
    /// As [`GemmPlan::run_views`].
    pub unsafe fn run_stacked_views(
        &mut self,
        stream: &Arc<CudaStream>,
        views: &StackedViews,
        host_alphas: &[f32],
        device_alphas: Option<BufferView>,
    ) -> Result<()> {
        let call = if device_alphas.is_some() { "run_stacked_with_device_alphas" } else { "run_stacked" };
        self.stacked_call(stream, views, host_alphas, device_alphas, call)
    }

    /// The common end of a call (`call`) whose buffers are in `self.cache`'s current list:
    /// validation (or the cache's shortcut), the check of the device alphas `alphas` (if any), and
    /// the engine's run (the tables uploaded when the buffers changed, the device alphas copied,
    /// the launches).
    fn launch_checked(
        &mut self,
        stream: &Arc<CudaStream>,
        call: &'static str,
        alphas: Option<BufferView>,
    ) -> Result<()> {
        self.cache.check(&self.problem, call)?;
        if let Some(alphas) = alphas {
            validate_device_alphas(call, &self.problem, alphas, self.cache.buffers())?;
        }
        crate::host_timing::mark(crate::host_timing::step::CHECK);
        let alphas = alphas.map_or(Alphas::Host, |a| Alphas::Device(a.ptr));
        let buffers = self.cache.buffers();
        // SAFETY: the buffers were validated against the problem (lengths, alignment, overlaps);
        // their guards (held by the caller's `CallBuffers`) keep them alive until the launches
        // are enqueued, and stream order keeps them alive for the work.
        unsafe {
            match &mut self.plan {
                ArchPlan::Sm90(e) if e.has_work() => e.run(stream, buffers, alphas),
                ArchPlan::Sm100(e) if e.has_work() => e.run(stream, buffers, alphas),
                _ => Ok(()),
            }
        }
    }
}

/// The error of a W4A16 problem on an architecture other than sm_90a.
pub(crate) fn w4a16_unsupported(arch: Arch) -> Error {
    Error::Unsupported(format!(
        "W4A16 runs on sm_90a; this GPU is {arch:?}, which multiplies NVFP4 operands natively (NVFP4 tokens)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upload::DeviceGroup;
    use nvfp4_format::{random_groups, GroupShape, InputDistribution};

    /// On an sm_90a GPU (skipped elsewhere): one plan called with changing buffers and alphas
    /// writes, call after call, bit for bit what a fresh plan writes for the same buffers, and
    /// only into the call's C: a changed address or alpha is seen (the tables are encoded again),
    /// an unchanged call reuses them.
    #[test]
    #[ignore = "needs an sm_90a GPU"]
    fn changed_buffers_between_calls_are_used() {
        let gpu = match Gpu::new(0) {
            Ok(gpu) if gpu.arch() == Arch::Sm90a => gpu,
            Ok(gpu) => panic!("this test needs an sm_90a GPU; GPU 0 is {}", gpu.name()),
            Err(e) => panic!("this test needs an sm_90a GPU: {e}"),
        };
        let stream = gpu.context().default_stream();
        let shapes = vec![GroupShape::new(24, 256, 256), GroupShape::new(0, 128, 128), GroupShape::new(130, 136, 192)];
        let problem = Problem::new(shapes.clone(), OutputType::F16).unwrap();
        let sets: Vec<Vec<DeviceGroup>> = (0..2)
            .map(|s| {
                let groups = random_groups(&shapes, InputDistribution::Competition, 11 + s).unwrap();
                groups.iter().map(|g| DeviceGroup::upload(&stream, g).unwrap()).collect()
            })
            .collect();
        let poison = f16::from_bits(0x7E01);
        let new_cs = || -> Vec<cudarc::driver::CudaSlice<f16>> {
            shapes.iter().map(|s| stream.clone_htod(&vec![poison; (s.m * s.n).max(16)]).unwrap()).collect()
        };
        let (mut c0, mut c1, mut fresh_c) = (new_cs(), new_cs(), new_cs());
        // One call: input set, which C, alpha factor of group 2.
        let mut calls = vec![(0, 0, 1.0f32), (0, 0, 1.0), (0, 1, 1.0), (1, 1, 1.0), (1, 1, 0.5), (1, 1, -0.5)];
        calls.extend([(1, 1, -0.5), (0, 0, 1.0), (0, 0, 1.0), (1, 0, 2.0)]);
        let mut plan = GemmPlan::new(&gpu, problem.clone()).unwrap();
        let poison_all = |cs: &mut [cudarc::driver::CudaSlice<f16>]| {
            for c in cs.iter_mut() {
                stream.memcpy_htod(&vec![poison; c.len()], c).unwrap();
            }
        };
        let run = |plan: &mut GemmPlan, set: &[DeviceGroup], cs: &mut [cudarc::driver::CudaSlice<f16>], factor: f32| {
            let mut args: Vec<GroupArgs> = set
                .iter()
                .zip(cs.iter_mut())
                .enumerate()
                .map(|(g, (d, c))| {
                    let mut a = d.args(Output::F16(c));
                    if g == 2 {
                        a.alpha *= factor;
                    }
                    a
                })
                .collect();
            plan.run(&stream, &mut args).unwrap();
            drop(args);
            cs.iter()
                .map(|c| stream.clone_dtoh(c).unwrap().iter().map(|x| x.to_bits()).collect())
                .collect::<Vec<Vec<u16>>>()
        };
        for (i, &(set, c, factor)) in calls.iter().enumerate() {
            poison_all(&mut c0);
            poison_all(&mut c1);
            poison_all(&mut fresh_c);
            let cs = if c == 0 { &mut c0 } else { &mut c1 };
            let got = run(&mut plan, &sets[set], cs, factor);
            let want = run(&mut GemmPlan::new(&gpu, problem.clone()).unwrap(), &sets[set], &mut fresh_c, factor);
            assert_eq!(got, want, "call {i}: set {set}, C {c}, alpha factor {factor}");
            let other = if c == 0 { &c1 } else { &c0 };
            for (g, o) in other.iter().enumerate() {
                let host = stream.clone_dtoh(o).unwrap();
                // Bitwise: the poison is a NaN.
                assert!(
                    host.iter().all(|x| x.to_bits() == poison.to_bits()),
                    "call {i}: the other C of group {g} was written"
                );
            }
        }
    }
}
