//! W4A16 on sm_90a: f16 or bf16 activations times NVFP4 weights (docs/w4a16.md). This module
//! holds the one-time step that prepares a weight matrix for it: [`prepack`] moves the K
//! permutation that W4A4 applies to the tokens into the weights, stores each code's bits where the
//! kernel's decoder finds them, folds each block's scale sign into its codes (bf16), and pairs
//! and re-encodes the scales so that the kernel converts them with one or two instructions per
//! k-step (`nvfp4_gemm_abi::sm90::w4a16`). The result has the sizes and the blocked scale layout
//! of the matrix it came from, so it uploads like any NVFP4 operand.
//!
//! The kernels (`sm90_w4a16_gemm*` for f16, `sm90_w4a16_bf16_gemm*` for bf16) run the W4A4
//! kernels' tiles and work lists ([`layout`]) on tables whose token maps point at the caller's
//! activations ([`tables_with`]); [`W4a16Plan`] and [`W4a16MoePlan`] launch them (no
//! dequantization). W4A16 on sm_100a, which multiplies NVFP4 operands natively, is
//! [`Error::Unsupported`].

use crate::device::{Arch, Gpu};
use crate::driver::launch::{launch, set_max_dynamic_smem};
use crate::driver::module::Kernel;
use crate::driver::tensor_map::{DriverEncoder, TiledMapEncoder};
use crate::error::{Error, Result};
use crate::moe::{MoeOptions, MoePlan, MoeProblem, MoeTokens, SizeStatus};
use crate::overlap::{self, Span};
use crate::plan::{check_stacked_lengths, Nvfp4Operand, Output};
use crate::problem::{stacked_parts, BufferSizes, BufferView, CallBuffers, GroupBuffers, Problem, BUFFER_ALIGN};
use crate::quantize::DenseFloat;
use crate::sm90::Sm90Layout;
use crate::summary::PlanSummary;
use crate::tables::upload_tables;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use nvfp4_format::layout::blocked_offset;
use nvfp4_format::Nvfp4Matrix;
pub use nvfp4_gemm_abi::sm90::w4a16::Activations;
use nvfp4_gemm_abi::sm90::w4a16::{prepack_chunk_row, prepacked_scale, scale_source, Decoder};
use nvfp4_gemm_abi::sm90::{GemmConfig, GroupParams, CHUNK_K};
use nvfp4_gemm_abi::tensor_map::TensorMap;
use std::sync::Arc;

/// A weight matrix prepacked for W4A16: values `rows × K/2` bytes (each 64-wide chunk row
/// permuted), scales in the 128x4 blocked layout (each byte re-encoded), and the matrix's global
/// scale.
#[derive(Debug, Clone, PartialEq)]
pub struct W4a16Weights {
    /// Rows (N).
    pub rows: usize,
    /// Reduction length (a multiple of 64).
    pub k: usize,
    /// The prepacked values.
    pub values: Vec<u8>,
    /// The prepacked scales, blocked layout.
    pub scales: Vec<u8>,
    /// The global scale of the matrix, unchanged.
    pub global_scale: f32,
}

/// Prepacks `m` for W4A16 with `activations` (CPU). K must be a multiple of 64, as for every
/// sm_90a operand. Each chunk row's code bits move to the places of the activation type's
/// decoder (`nvfp4_gemm_abi::sm90::w4a16::prepack_chunk_row`); the scale bytes of rows `r` and
/// `r + 8` are paired by k-step (`scale_source`). bf16 also folds each block's scale sign into
/// its codes (a zero scale's codes zeroed) and re-encodes the scales
/// (`nvfp4_gemm_abi::sm90::w4a16::prepacked_scale`).
pub fn prepack(m: &Nvfp4Matrix, activations: Activations) -> Result<W4a16Weights> {
    let (rows, k) = (m.rows(), m.k());
    if k % CHUNK_K as usize != 0 {
        return Err(Error::InvalidProblem(format!("k = {k} is not a multiple of {CHUNK_K}")));
    }
    let chunk_bytes = CHUNK_K as usize / 2;
    let layout = Decoder::of(activations).layout();
    let mut values = vec![0u8; m.values().len()];
    for i in 0..rows {
        for c in 0..k / CHUNK_K as usize {
            let at = i * k / 2 + c * chunk_bytes;
            let row: &[u8; 32] = m.values()[at..at + chunk_bytes].try_into().expect("32 bytes");
            let scale = |b: usize| m.scale_code(i, 4 * c + b);
            let fold = activations == Activations::Bf16;
            let negate = core::array::from_fn(|b| fold && scale(b) & 0x80 != 0);
            let zero = core::array::from_fn(|b| fold && scale(b) & 0x7F == 0);
            values[at..at + chunk_bytes].copy_from_slice(&prepack_chunk_row(row, negate, zero, &layout));
        }
    }
    Ok(W4a16Weights {
        rows,
        k,
        values,
        scales: prepack_scales(m.scales(), k, activations),
        global_scale: m.global_scale(),
    })
}

/// The prepacked scale buffer of a blocked scale buffer for reduction length `k`: every byte,
/// padding rows included (what padding holds reaches only rows and columns that are never
/// stored; re-encoded, a finite padding byte stays finite), moved within its 16-row group as
/// `scale_source` says and, for bf16, re-encoded.
fn prepack_scales(scales: &[u8], k: usize, activations: Activations) -> Vec<u8> {
    let blocks = k / 16;
    let mut out = vec![0u8; scales.len()];
    for row in 0..scales.len() / blocks {
        let second = (row % 16) / 8;
        // The pair's rows: `r` (`r % 16 < 8`) and `r + 8`.
        let r = row - 8 * second;
        for chunk in 0..k / CHUNK_K as usize {
            for byte in 0..4 {
                let (step, block) = scale_source(activations, second as u32, byte as u32);
                let from = blocked_offset(r + 8 * step as usize, 4 * chunk + block as usize, k);
                let b = scales[from];
                out[blocked_offset(row, 4 * chunk + byte, k)] = match activations {
                    Activations::F16 => b,
                    Activations::Bf16 => prepacked_scale(b),
                };
            }
        }
    }
    out
}

/// The layout of a W4A16 problem on `sm_count` SMs: the W4A4 layout (variant, work list, tiles,
/// grid) of the same shapes — every W4A4 variant has its W4A16 twin.
pub fn layout(problem: &Problem, sm_count: u32) -> Sm90Layout {
    Sm90Layout::new(problem, sm_count)
}

/// [`layout`] with the variant `config` (`None` where it cannot run the problem: the decode
/// variant needs every group at 16 tokens or fewer).
pub fn layout_with(problem: &Problem, sm_count: u32, config: GemmConfig) -> Option<Sm90Layout> {
    Sm90Layout::with_config(problem, sm_count, config)
}

/// The W4A16 kernel of a [`layout`] for `activations`.
pub fn kernel_name(layout: &Sm90Layout, activations: Activations) -> &'static str {
    nvfp4_gemm_abi::sm90::w4a16::kernel_name_of(layout.config, activations)
}

/// The activations' type of a 16-bit float type (`f16` or `bf16`).
pub fn activations_of<T: DenseFloat>() -> Activations {
    if T::BF16 {
        Activations::Bf16
    } else {
        Activations::F16
    }
}

/// [`Error::InvalidArgument`] unless the call's activations (`T`) are the plan's `want`.
fn check_activations<T: DenseFloat>(call: &'static str, want: Activations) -> Result<()> {
    if activations_of::<T>() != want {
        let reason = format!("{:?} activations for a plan of {want:?} ones", activations_of::<T>());
        return Err(Error::InvalidArgument { call, field: "activations", reason });
    }
    Ok(())
}

/// The group table and tensor maps of a W4A16 call: `buffers` as for W4A4 with `b_values` /
/// `b_scales` the prepacked weights (A's buffers unused), and group `g`'s tokens the f16
/// activations `[m, K]` at device address `tokens[g]` (natural order, read through the token
/// maps, 16-byte aligned).
pub fn tables_with(
    layout: &Sm90Layout,
    encoder: &impl TiledMapEncoder,
    problem: &Problem,
    buffers: &[GroupBuffers],
    tokens: &[u64],
) -> Result<(Vec<GroupParams>, Vec<TensorMap>)> {
    let mut params = layout.group_params(problem, buffers, 0);
    for (p, &t) in params.iter_mut().zip(tokens) {
        p.workspace = t;
    }
    let maps = layout.maps_with(encoder, problem, buffers, &params)?;
    Ok((params, maps))
}

/// One group's buffers of a [`W4a16Plan::run`], activations of type `T` (`f16` or `bf16`: the
/// plan's). Borrowed for the call, never copied.
pub struct W4a16Args<'a, T: DenseFloat = half::f16> {
    /// The activations A, `m × K`, row-major in natural order (16-byte aligned).
    pub activations: &'a dyn DevicePtr<T>,
    /// The weights B, prepacked by [`prepack`] for the plan's activations and uploaded: values
    /// `n · K/2` bytes, scales in the blocked layout (the sizes of the NVFP4 matrix).
    pub weights: Nvfp4Operand<'a>,
    /// C, `m × n` elements of the problem's output type.
    pub c: Output<'a>,
    /// Multiplier of the fp32 accumulator: the weights' global scale times the caller's factor.
    pub alpha: f32,
}

/// Every group's buffers of a [`W4a16Plan::run_stacked`], one buffer per operand, the groups'
/// parts in group order ([`W4a16Plan::stacked_offsets`]): e.g. a MoE layer's sorted activations
/// `[T, K]`, its experts' prepacked weights stacked into one `[G, N, K/2]` tensor with one
/// tensor of their scales, C as one `[T, N]` tensor. Borrowed for the call, never copied.
pub struct W4a16StackedArgs<'a, T: DenseFloat = half::f16> {
    /// Every group's activations: `Σ m·K` elements of the plan's type.
    pub activations: &'a dyn DevicePtr<T>,
    /// Every group's prepacked weights: values `Σ n·K/2` bytes, scales `Σ ⌈n/128⌉·128·K/16` bytes
    /// (as for `GemmPlan::run_stacked`'s B).
    pub weights: Nvfp4Operand<'a>,
    /// Every group's C: `Σ m·n` elements.
    pub c: Output<'a>,
    /// One alpha per group.
    pub alphas: &'a [f32],
}

/// Checks a W4A16 call's buffers against the problem, as [`W4a16Plan::run`] does before any
/// launch: per group (`activations[g]`, 16-bit elements, and `buffers[g]`'s weights, C and
/// alpha; its A fields are not read) the output type, a finite alpha, the exact lengths and
/// 16-byte alignment, then no output overlapping another buffer of the call ([`Error::Overlap`]).
/// The buffers of a group with `m = 0`, which reads and writes nothing, are not checked. Pure:
/// runs on the CPU.
pub fn validate_w4a16_buffers(problem: &Problem, activations: &[BufferView], buffers: &[GroupBuffers]) -> Result<()> {
    const FIELDS: [&str; 4] = ["activations", "b.values", "b.scales", "c"];
    let groups = problem.groups();
    if activations.len() != groups.len() || buffers.len() != groups.len() {
        return Err(Error::InvalidProblem(format!(
            "the plan has {} groups but {} were passed",
            groups.len(),
            buffers.len().min(activations.len())
        )));
    }
    let mut spans = Vec::with_capacity(4 * groups.len());
    for (g, ((s, b), &act)) in groups.iter().zip(buffers).zip(activations).enumerate() {
        if b.c_type != problem.output() {
            let reason = format!("is {:?}; the problem's output is {:?}", b.c_type, problem.output());
            return Err(Error::group(g, "c", reason));
        }
        if !b.alpha.is_finite() {
            return Err(Error::group(g, "alpha", format!("{} is not finite", b.alpha)));
        }
        // A group without tokens reads and writes nothing: its buffers are not looked at (as
        // `GemmPlan::run`'s rules).
        if s.m == 0 {
            continue;
        }
        let w = BufferSizes::of(s);
        let checks = [(act, s.m * s.k), (b.b_values, w.b_values), (b.b_scales, w.b_scales), (b.c, w.c_elements)];
        for (field, (view, len)) in FIELDS.into_iter().zip(checks) {
            if view.len != len {
                let reason = format!("has {} elements; m={} n={} k={} needs exactly {len}", view.len, s.m, s.n, s.k);
                return Err(Error::group(g, field, reason));
            }
            if view.ptr % BUFFER_ALIGN != 0 {
                return Err(Error::group(
                    g,
                    field,
                    format!("address {:#x} is not {BUFFER_ALIGN}-byte aligned", view.ptr),
                ));
            }
        }
        let id = 4 * g as u32;
        spans.extend([
            Span::new(id, act, 2, false),
            Span::new(id + 1, b.b_values, 1, false),
            Span::new(id + 2, b.b_scales, 1, false),
            Span::new(id + 3, b.c, 2, true),
        ]);
    }
    overlap::check("w4a16 run", &mut spans, overlap::group_fields(&FIELDS))
}

/// A W4A16 problem planned for one sm_90a GPU (f16 or bf16 activations): the layout (the W4A4
/// tiles and work list), the kernel, and the device tables, allocated once. A call validates every buffer,
/// uploads the tables when an address or alpha changed since the previous call, and launches the
/// GEMM — no dequantization, no host synchronization.
pub struct W4a16Plan {
    problem: Problem,
    layout: Sm90Layout,
    activations: Activations,
    gemm: Kernel,
    groups: CudaSlice<u8>,
    maps: CudaSlice<u8>,
    work: CudaSlice<u8>,
    /// The groups' parts of stacked buffers.
    stacked: Vec<BufferSizes>,
    /// Activation, weight and C addresses and alphas of the last upload.
    signature: Vec<u64>,
}

impl W4a16Plan {
    /// Plans `problem` for `gpu` with `activations` of that type (the weights prepacked for
    /// them). Errors: sm_100a (W4A16 is an sm_90a path: Blackwell multiplies NVFP4 operands
    /// natively), [`Error::Unsupported`] before any allocation.
    pub fn new(gpu: &Gpu, problem: Problem, activations: Activations) -> Result<W4a16Plan> {
        sm90_only(gpu)?;
        let layout = layout(&problem, gpu.sm_count());
        let stream = gpu.context().default_stream();
        let d = |e| Error::driver("allocating the plan's device tables", e);
        let gemm = gpu.function(kernel_name(&layout, activations))?;
        set_max_dynamic_smem(&gemm, layout.gemm.smem_bytes)?;
        let g = problem.groups().len().max(1);
        let work = if layout.work.is_empty() {
            stream.alloc_zeros::<u8>(16).map_err(d)?
        } else {
            stream.clone_htod(bytemuck::cast_slice::<_, u8>(&layout.work)).map_err(d)?
        };
        let plan = W4a16Plan {
            groups: stream.alloc_zeros::<u8>(g * size_of::<GroupParams>()).map_err(d)?,
            maps: stream
                .alloc_zeros::<u8>(nvfp4_gemm_abi::sm90::map_count(g as u32) * size_of::<TensorMap>())
                .map_err(d)?,
            work,
            layout,
            activations,
            gemm,
            stacked: problem.stacked_offsets(),
            problem,
            signature: vec![],
        };
        // The allocations above are on the default stream; a caller's stream must see them done.
        stream.synchronize().map_err(d)?;
        Ok(plan)
    }

    /// The problem.
    pub fn problem(&self) -> &Problem {
        &self.problem
    }

    /// The kernel a call launches.
    pub fn kernel(&self) -> &'static str {
        kernel_name(&self.layout, self.activations)
    }

    /// The activations' type.
    pub fn activations(&self) -> Activations {
        self.activations
    }

    /// Where group `g`'s parts of [`W4a16Plan::run_stacked`]'s buffers start (entry `G`: their
    /// total lengths): `b_values`, `b_scales` in bytes and `c_elements` as
    /// [`Problem::stacked_offsets`] gives them; the activations' offset in f16 elements is
    /// `2 · a_values` (`Σ m·K`).
    pub fn stacked_offsets(&self) -> &[BufferSizes] {
        &self.stacked
    }

    /// Runs the GEMM on `stream` with one [`W4a16Args`] per group, activations of the plan's type
    /// (else [`Error::InvalidArgument`]). Every buffer is validated first
    /// ([`validate_w4a16_buffers`]: typed errors naming the group and field); on any error
    /// nothing is launched.
    pub fn run<'s, T: DenseFloat>(
        &mut self,
        stream_arc: &'s Arc<CudaStream>,
        args: &'s mut [W4a16Args<'_, T>],
    ) -> Result<()> {
        check_activations::<T>("w4a16 run", self.activations)?;
        let groups = self.problem.groups().len();
        if args.len() != groups {
            let reason = format!("{} groups given for {groups}", args.len());
            return Err(Error::InvalidArgument { call: "w4a16 run", field: "args", reason });
        }
        let mut call = CallBuffers::new(stream_arc);
        let mut activations = Vec::with_capacity(groups);
        let mut buffers = Vec::with_capacity(groups);
        for a in args.iter_mut() {
            activations.push(call.read(a.activations));
            let (b_values, b_scales) = (call.read(a.weights.values), call.read(a.weights.scales));
            let (c, c_type) = call.output(&mut a.c);
            buffers.push(GroupBuffers {
                a_values: NONE,
                a_scales: NONE,
                b_values,
                b_scales,
                c,
                c_type,
                alpha: a.alpha,
            });
        }
        self.run_checked(stream_arc, &activations, &buffers)
    }

    /// Runs the GEMM on `stream` with every group's operands in one buffer each
    /// ([`W4a16StackedArgs`]). A buffer whose length is not the sum of its parts, or an alpha
    /// count other than the groups', is [`Error::InvalidArgument`]; then every group's parts are
    /// checked as [`W4a16Plan::run`] checks them. On any error nothing is launched.
    pub fn run_stacked<'s, T: DenseFloat>(
        &mut self,
        stream_arc: &'s Arc<CudaStream>,
        args: &'s mut W4a16StackedArgs<'_, T>,
    ) -> Result<()> {
        const CALL: &str = "w4a16 run_stacked";
        check_activations::<T>(CALL, self.activations)?;
        let mut call = CallBuffers::new(stream_arc);
        let act = call.read(args.activations);
        let (b_values, b_scales) = (call.read(args.weights.values), call.read(args.weights.scales));
        let (c, c_type) = call.output(&mut args.c);
        let total = self.stacked[self.problem.groups().len()];
        let lengths = [
            ("activations", act.len, 2 * total.a_values, "elements"),
            ("b.values", b_values.len, total.b_values, "bytes"),
            ("b.scales", b_scales.len, total.b_scales, "bytes"),
            ("c", c.len, total.c_elements, "elements"),
        ];
        check_stacked_lengths(CALL, &lengths)?;
        if args.alphas.len() != self.problem.groups().len() {
            let reason = format!("{} alphas for {} groups", args.alphas.len(), self.problem.groups().len());
            return Err(Error::InvalidArgument { call: CALL, field: "alphas", reason });
        }
        let mut buffers = Vec::with_capacity(args.alphas.len());
        stacked_parts(
            &self.stacked,
            [NONE, NONE, b_values, b_scales],
            c,
            c_type,
            args.alphas.iter().copied(),
            &mut buffers,
        );
        self.run_checked(stream_arc, &activation_parts(&self.stacked, act), &buffers)
    }

    /// Validates the call's buffers, uploads the tables when an address or alpha changed, and
    /// launches.
    fn run_checked(
        &mut self,
        stream_arc: &Arc<CudaStream>,
        activations: &[BufferView],
        buffers: &[GroupBuffers],
    ) -> Result<()> {
        validate_w4a16_buffers(&self.problem, activations, buffers)?;
        let stream: &CudaStream = stream_arc;
        let tokens: Vec<u64> = activations.iter().map(|a| a.ptr).collect();
        let signature: Vec<u64> = buffers
            .iter()
            .zip(&tokens)
            .flat_map(|(b, &t)| [t, b.b_values.ptr, b.b_scales.ptr, b.c.ptr, u64::from(b.alpha.to_bits())])
            .collect();
        if signature != self.signature {
            let (params, maps) = tables_with(&self.layout, &DriverEncoder, &self.problem, buffers, &tokens)?;
            upload_tables(stream_arc, &params, &mut self.groups, &maps, &mut self.maps)?;
            self.signature = signature;
        }
        if self.layout.work.is_empty() {
            return Ok(());
        }
        let (groups, _g1) = self.groups.device_ptr(stream);
        let (maps, _g2) = self.maps.device_ptr(stream);
        let (work, _g3) = self.work.device_ptr(stream);
        let params = self.layout.kernel_params(groups, maps, work, &self.problem);
        // SAFETY: the kernel takes one `KernelParams`; its tables hold these validated buffers
        // (uploaded now or by a call with the same addresses), the work list the plan's own.
        unsafe { launch(&self.gemm, stream, self.layout.gemm, &params) }
    }
}

/// Each group's part of stacked activations `act` ([`Problem::stacked_offsets`] `at`): group `g`
/// from element `Σ_{h<g} m_h·K` — twice the NVFP4 values' byte offset `Σ m_h·K/2` — for `m_g·K`
/// elements of 2 bytes, so the parts are adjacent and disjoint.
fn activation_parts(at: &[BufferSizes], act: BufferView) -> Vec<BufferView> {
    at.windows(2)
        .map(|w| BufferView { ptr: act.ptr + 4 * w[0].a_values as u64, len: 2 * (w[1].a_values - w[0].a_values) })
        .collect()
}

/// An empty view: W4A16's unused NVFP4 token fields.
const NONE: BufferView = BufferView { ptr: 0, len: 0 };

/// The device buffers of one [`W4a16MoePlan::run`], activations of type `T` (the plan's).
/// Borrowed for the call, never copied.
pub struct W4a16MoeArgs<'a, T: DenseFloat = half::f16> {
    /// `offsets[G + 1]` or `counts[G]` ([`MoeProblem::sizes_len`] `u32`s), read on the device.
    pub sizes: &'a dyn DevicePtr<u32>,
    /// The activations A, [`MoeProblem::token_rows`] `× K`, row-major in natural order, each
    /// group's rows where the problem's layout puts them (16-byte aligned). Read as they are.
    pub activations: &'a dyn DevicePtr<T>,
    /// Each group's weights B, prepacked by [`prepack`] for the plan's activations and uploaded
    /// ([`MoeProblem::b_sizes`]), `G` of them.
    pub weights: &'a [Nvfp4Operand<'a>],
    /// Each group's alpha (the weights' global scale times the caller's factor), `G` finite
    /// values.
    pub alphas: &'a [f32],
    /// C, [`MoeProblem::c_elements`] elements of the problem's output type. Rows of no group are
    /// left as they are.
    pub c: Output<'a>,
}

/// A [`MoeProblem`] planned for W4A16 on one sm_90a GPU: f16 or bf16 activations times prepacked
/// NVFP4 weights with the group sizes on the device (`crate::moe`, docs/moe.md). A call launches the
/// scheduler and the W4A16 GEMM kernels (the W4A4 plan's tiles, work list and kernel choice) — no
/// quantization and no dequantization: the GEMMs read the activations through tensor maps over
/// the whole `[token_rows, K]` tensor.
///
/// Capturable in a CUDA graph as [`MoePlan`] is (run once before capturing). The tensor maps hold
/// the activations' address: a call with other weights, alphas *or activations* than the
/// previous call's copies the tables from the host, so keep the activations' buffer fixed in a
/// captured graph (the sizes and C may change freely).
pub struct W4a16MoePlan {
    plan: MoePlan,
}

impl W4a16MoePlan {
    /// Plans `problem` for `gpu` with `activations` of that type and the default options.
    /// Errors: as [`Self::with_options`].
    pub fn new(gpu: &Gpu, problem: MoeProblem, activations: Activations) -> Result<W4a16MoePlan> {
        Self::with_options(gpu, problem, activations, &MoeOptions::default())
    }

    /// Plans `problem` with `options` (which GEMM kernels a call may run, as for [`MoePlan`]).
    /// Errors: sm_100a, [`Error::Unsupported`] before any allocation.
    pub fn with_options(
        gpu: &Gpu,
        problem: MoeProblem,
        activations: Activations,
        options: &MoeOptions,
    ) -> Result<W4a16MoePlan> {
        sm90_only(gpu)?;
        Ok(W4a16MoePlan { plan: MoePlan::w4a16(gpu, problem, options, activations)? })
    }

    /// The problem this plan was built for.
    pub fn problem(&self) -> &MoeProblem {
        self.plan.problem()
    }

    /// The activations' type.
    pub fn activations(&self) -> Activations {
        self.plan.activations().expect("a W4A16 plan's tokens are activations")
    }

    /// What the planner chose (`tiles`: the work list's capacity).
    pub fn summary(&self) -> &PlanSummary {
        self.plan.summary()
    }

    /// Runs the grouped GEMM on `stream` for the sizes in `args.sizes` as they are when the
    /// kernels run. Every buffer is validated first (typed errors; activations of another type
    /// than the plan's are [`Error::InvalidArgument`]); on any error nothing is launched.
    pub fn run<'s, T: DenseFloat>(
        &mut self,
        stream: &'s Arc<CudaStream>,
        args: &'s mut W4a16MoeArgs<'_, T>,
    ) -> Result<()> {
        // Holds the buffers' stream-ordering guards until the launches are enqueued.
        let mut call = CallBuffers::new(stream);
        let a = MoeTokens::Dense { activations: call.read(args.activations), kind: activations_of::<T>() };
        self.plan.run_with(stream, call, args.sizes, a, args.weights, args.alphas, &mut args.c)
    }

    /// The plan's status word on the device ([`MoePlan::status`]).
    pub fn status(&self) -> &CudaSlice<u32> {
        self.plan.status()
    }

    /// Copies the status word to the host; synchronizes `stream` ([`MoePlan::read_status`]).
    pub fn read_status(&self, stream: &Arc<CudaStream>) -> Result<SizeStatus> {
        self.plan.read_status(stream)
    }

    /// Resets the status word on `stream` ([`MoePlan::clear_status`]).
    pub fn clear_status(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        self.plan.clear_status(stream)
    }
}

/// W4A16 is an sm_90a path: [`Error::Unsupported`] on any other GPU.
fn sm90_only(gpu: &Gpu) -> Result<()> {
    if gpu.arch() != Arch::Sm90a {
        return Err(Error::Unsupported(format!(
            "W4A16 runs on sm_90a; this GPU is {:?}, which multiplies NVFP4 operands natively (GemmPlan, MoePlan)",
            gpu.arch()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvfp4_format::codec::{e2m1_to_f32, e4m3_to_f32};
    use nvfp4_format::{random_matrix, InputDistribution, SplitMix64};
    use nvfp4_gemm_abi::sm90::w4a16::{packed_column, scale_bf16_bits, Decoder, BF16_PRODUCT_EXPONENT};

    /// A W4A16 call's buffers for `p`, stacked from `base` (activations, then weights, then C,
    /// each part 16-byte aligned), as `run_stacked` splits them.
    fn stacked(p: &Problem, base: u64) -> (Vec<BufferView>, Vec<GroupBuffers>) {
        let at = p.stacked_offsets();
        let total = at[p.groups().len()];
        let act = BufferView { ptr: base, len: 2 * total.a_values };
        let b_values = BufferView { ptr: base + 0x100_0000, len: total.b_values };
        let b_scales = BufferView { ptr: base + 0x200_0000, len: total.b_scales };
        let c = BufferView { ptr: base + 0x300_0000, len: total.c_elements };
        let none = BufferView { ptr: 0, len: 0 };
        let mut buffers = vec![];
        let alphas = (0..p.groups().len()).map(|g| g as f32);
        stacked_parts(&at, [none, none, b_values, b_scales], c, p.output(), alphas, &mut buffers);
        (activation_parts(&at, act), buffers)
    }

    /// Stacked activations split into each group's `m·K` elements, adjacent; the parts pass the
    /// checks, empty groups with any buffer too; each wrong length, misalignment, output type,
    /// alpha and overlap is a typed error naming the group and field.
    #[test]
    fn w4a16_buffers_are_checked_with_typed_errors() {
        use crate::problem::{GroupShape, OutputType};
        let shapes = [(3, 136, 192), (0, 256, 64), (130, 64, 128), (1, 8, 64)];
        let shapes: Vec<GroupShape> = shapes.iter().map(|&(m, n, k)| GroupShape::new(m, n, k)).collect();
        let p = Problem::new(shapes, OutputType::F16).unwrap();
        let (act, buffers) = stacked(&p, 0x1_0000_0000);
        assert_eq!(act.iter().map(|v| v.len).collect::<Vec<_>>(), [3 * 192, 0, 130 * 128, 64]);
        assert_eq!(act[2].ptr, 0x1_0000_0000 + 2 * 3 * 192);
        assert!(act.windows(2).all(|w| w[0].ptr + 2 * w[0].len as u64 == w[1].ptr), "adjacent");
        validate_w4a16_buffers(&p, &act, &buffers).unwrap();
        // A group of no rows: whatever its buffers (e.g. a placeholder allocation).
        let mut empty = act.clone();
        empty[1] = BufferView { ptr: 0x7, len: 8 };
        validate_w4a16_buffers(&p, &empty, &buffers).unwrap();
        type Edit = fn(&mut Vec<BufferView>, &mut Vec<GroupBuffers>);
        let cases: [(Edit, &str); 6] = [
            (|a, _| a[2].len -= 1, "activations"),
            (|a, _| a[2].ptr += 8, "activations"),
            (|_, b| b[2].b_scales.len += 1, "b.scales"),
            (|_, b| b[2].c_type = OutputType::Bf16, "c"),
            (|_, b| b[2].alpha = f32::NAN, "alpha"),
            (|_, b| b[2].b_values.ptr += 4, "b.values"),
        ];
        for (edit, field) in cases {
            let (mut a, mut b) = (act.clone(), buffers.clone());
            edit(&mut a, &mut b);
            match validate_w4a16_buffers(&p, &a, &b).unwrap_err() {
                Error::InvalidGroup { group: 2, field: f, .. } => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
        // Group 3's C over group 0's activations.
        let mut b = buffers.clone();
        b[3].c.ptr = act[0].ptr + 16;
        match validate_w4a16_buffers(&p, &act, &b).unwrap_err() {
            Error::Overlap { output, other, .. } => {
                assert_eq!((output.group, output.field), (Some(3), "c"));
                assert_eq!((other.group, other.field), (Some(0), "activations"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(validate_w4a16_buffers(&p, &act[..3], &buffers), Err(Error::InvalidProblem(_))));
    }

    fn bf16(bits: u16) -> f64 {
        half::bf16::from_bits(bits).to_f64()
    }

    /// What a consumer thread of the W4A16 kernels computes from the prepacked bytes — thread `q`'s
    /// 8 bytes of each chunk row, decoder pair `p` (elements `p % 4` and `+ 4` of word `p / 4`, their
    /// bits where the decoder reads them), the scale of k-step `p / 2` from the two scale words it
    /// loads (rows `r` and `r + 8`: k-steps 0, 1 in the first, 2, 3 in the second; f16 half-word
    /// `j % 2`, bf16 byte `j % 2` for row `r` and `2 + j % 2` for row `r + 8`) — equals, for the
    /// natural column the pair stands for, the matrix's `code · scale` (times 2⁻¹⁴ through the f16
    /// decode, 2⁻⁷ through the bf16 one), exactly in the 16-bit type; over random matrices whose
    /// scales include negative, zero and subnormal codes.
    #[test]
    fn the_kernels_view_of_the_prepacked_weights_is_the_matrix() {
        let mut rng = SplitMix64::new(0x4A16);
        for case in 0..6 {
            let (rows, k) = (1 + rng.below(140) as usize, 64 * (1 + rng.below(5) as usize));
            let mut m = random_matrix(rows, k, InputDistribution::FullRange, &mut rng).unwrap();
            // Negative, zero and subnormal scales in some blocks (no NaN: products would be NaN).
            for i in 0..rows {
                for j in 0..k / 16 {
                    let at = blocked_offset(i, j, k);
                    let s = &mut m.scales_mut()[at];
                    match rng.below(8) {
                        0 => *s |= 0x80,
                        1 => *s = 0,
                        2 => *s = 1 + rng.below(7) as u8,
                        _ if *s & 0x7F == 0x7F => *s = 0x38,
                        _ => {}
                    }
                }
            }
            let (w, f) = (prepack(&m, Activations::Bf16).unwrap(), prepack(&m, Activations::F16).unwrap());
            assert_eq!((w.values.len(), w.scales.len()), (m.values().len(), m.scales().len()));
            // What thread `q` decodes from a prepacked buffer for row `i`: the code of element
            // `e` of pair `p`, the natural column it stands for, and the scale byte of k-step
            // `p / 2`.
            let view = |w: &W4a16Weights, act: Activations, i: usize, c: usize, q: u32, p: u32, e: u32| {
                let bytes = &w.values[i * k / 2 + c * 32 + 8 * q as usize..][..8];
                let word = u32::from_le_bytes(bytes[4 * (p / 4) as usize..][..4].try_into().unwrap());
                let code = Decoder::of(act).layout().code(word, e) as u8;
                let col = 64 * c + packed_column(q, p / 4, e) as usize;
                let (j, second_row) = ((p / 2) as usize, i % 16 / 8);
                let word_row = i - 8 * second_row + 8 * (j / 2);
                let byte = match act {
                    Activations::F16 => 2 * (j % 2) + second_row,
                    Activations::Bf16 => j % 2 + 2 * second_row,
                };
                (e2m1_to_f32(code) as f64, col, w.scales[blocked_offset(word_row, 4 * c + byte, k)])
            };
            for i in 0..rows {
                for c in 0..k / 64 {
                    for q in 0..4u32 {
                        for p in 0..8u32 {
                            for (u, e) in [(0, p % 4), (1, p % 4 + 4)] {
                                let exact = |col: usize| m.block_scaled_value(i, col) as f64;
                                // f16: the decoder's value ×2⁻¹⁴ times the e4m3 scale, as W4A4.
                                let (value, col, sbyte) = view(&f, Activations::F16, i, c, q, p, e);
                                assert_eq!(col % 2, u, "the pair's low value is its even column");
                                let via_f16 = value * 2f64.powi(-14) * e4m3_to_f32(sbyte) as f64;
                                let want = exact(col) * 2f64.powi(-14);
                                assert_eq!(via_f16, want, "f16: case {case} row {i} col {col}");
                                assert_eq!(half::f16::from_f64(want).to_f64(), want, "exact in f16");
                                // bf16: the decoder's value ×2⁻¹²⁶ times the re-encoded scale.
                                let (value, col, sbyte) = view(&w, Activations::Bf16, i, c, q, p, e);
                                let via_bf16 = value * 2f64.powi(-126) * bf16(scale_bf16_bits(sbyte));
                                let want = exact(col) * 2f64.powi(-(BF16_PRODUCT_EXPONENT as i32));
                                assert_eq!(via_bf16, want, "bf16: case {case} row {i} col {col}");
                                assert_eq!(half::bf16::from_f64(want).to_f64(), want, "exact in bf16");
                                assert!(want == 0.0 || want.abs() >= f64::from(half::bf16::MIN_POSITIVE), "normal");
                            }
                        }
                    }
                }
            }
        }
        assert!(prepack(&nvfp4_format::Nvfp4Matrix::zeros(2, 32).unwrap(), Activations::F16).is_err());
    }
}
