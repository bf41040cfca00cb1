//! The MoE expert block's own kernels around its two grouped GEMMs (docs/moe-block.md, "The GPU
//! block"), on [`Quantizer`]:
//!
//! - [`Quantizer::quantize_grouped_gather_views`] (contract steps 1–2): token rows of `x`
//!   gathered into the sorted layout of the first GEMM's [`MoeProblem`] (row `r` reads token
//!   `row_token[r]`), optionally multiplied by the row's router weight (`D(x · w)`, one rounding),
//!   then quantized into that layout (W4A4) or stored as 16-bit rows (W4A16);
//! - [`Quantizer::activate_grouped_views`] (steps 4–5): the first GEMM's output `h`
//!   (`[token_rows, 2I]` gated, gate columns first, or `[token_rows, I]`) → `z = D(act(gate) ·
//!   up)` or `D(act(h))`, quantized with the second GEMM's input scale into the second GEMM's
//!   token layout (W4A4) or stored as 16-bit (W4A16).
//!
//! Both read the same device sizes as the GEMMs, touch only rows of groups, and, like every
//! quantizer call, validate every argument before launching (typed errors, nothing launched on an
//! error), allocate nothing and never synchronise the host (capturable).

use crate::error::{invalid, Result};
use crate::moe_problem::GlobalScale;
use crate::overlap::{self, Span};
use crate::problem::{BufferView, BUFFER_ALIGN};
use crate::quantize::Quantizer;
use crate::MoeProblem;
use cudarc::driver::CudaStream;
pub use nvfp4_gemm_abi::moe::block::Activation;
use nvfp4_gemm_abi::moe::block::{activate_items, activate_parts, ActivateParams, Gather, ACTIVATE_PARTS};
use nvfp4_gemm_abi::moe::sm90::{QuantizeScheduleParams, Sm90ScheduleParams, SCHEDULE_CTAS};
use nvfp4_gemm_abi::moe::GroupedConvertParams;
use nvfp4_gemm_abi::quantize::{self as qabi, ConvertParams};
use nvfp4_gemm_abi::sm90::TokenWorkspace;

/// The inputs of a gather ([`Quantizer::quantize_grouped_gather_views`]).
#[derive(Debug, Clone, Copy)]
pub struct GatherInputs {
    /// The tokens `x`, `[tokens, K]` row-major, f16 or bf16 (16-byte aligned).
    pub x: BufferView,
    /// Rows of `x`.
    pub tokens: usize,
    /// `u32 row_token[token_rows]` (4-byte aligned): the token of each sorted row; `None`: row
    /// `r` is token `r` (then `tokens` must be the problem's token rows). A row of a group whose
    /// token id is `tokens` or more reads zeros.
    pub row_token: Option<BufferView>,
    /// `f32 row_weight[token_rows]` (4-byte aligned): each sorted row's router weight, applied
    /// at the input; `None`: no weight.
    pub row_weight: Option<BufferView>,
    /// The device sizes (`offsets[G + 1]` or `counts[G]`), as the GEMMs read them.
    pub sizes: BufferView,
}

/// Where a gather or an activation writes, and how.
#[derive(Debug, Clone, Copy)]
pub enum BlockOutput {
    /// W4A4: NVFP4 in the problem's grouped layout ([`MoeProblem::a_sizes`] bytes each),
    /// quantized with `global_scale`.
    Nvfp4 {
        /// Packed e2m1 values.
        values: BufferView,
        /// Blocked e4m3 scales.
        scales: BufferView,
        /// The quantizer's global scale(s).
        global_scale: GlobalScale,
        /// sm_90a: the GEMM's f16 token workspace ([`crate::MoePlan::token_workspace`],
        /// [`TokenWorkspace::bytes`]`(token_rows, K)` bytes, 16-byte aligned), where each
        /// quantized row is also written dequantized, so that the GEMM launches no
        /// dequantization; `None`: not written.
        workspace: Option<BufferView>,
    },
    /// W4A16: the 16-bit rows, `[token_rows, K]` of the input type (16-byte aligned).
    Dense(BufferView),
}

const GATHER: &str = "quantize_grouped_gather";
const ACTIVATE: &str = "activate_grouped";

/// Length and alignment of one argument.
fn check_view(call: &'static str, field: &'static str, view: BufferView, len: usize, align: u64) -> Result<()> {
    if view.len != len {
        return Err(invalid(call, field, format!("has {} elements; the call needs exactly {len}", view.len)));
    }
    if view.ptr % align != 0 {
        return Err(invalid(call, field, format!("address {:#x} is not {align}-byte aligned", view.ptr)));
    }
    Ok(())
}

/// An output's kernel parameters.
struct OutputParams {
    /// Packed values or the dense output.
    values: u64,
    /// Blocked scales (0 for a dense output).
    scales: u64,
    global_scale: f32,
    /// Per-group scales (0: `global_scale`).
    group_scales: u64,
    quantize: bool,
    /// The f16 token workspace (0: none).
    workspace: u64,
}

/// The output's checks; its spans (ids 5 (per-group scales, read), 8, 9) and parameters.
fn check_output(call: &'static str, p: &MoeProblem, out: BlockOutput) -> Result<(Vec<Span>, OutputParams)> {
    match out {
        BlockOutput::Nvfp4 { values, scales, global_scale, workspace } => {
            let a = p.a_sizes();
            check_view(call, "values", values, a.values, BUFFER_ALIGN)?;
            check_view(call, "scales", scales, a.scales, BUFFER_ALIGN)?;
            let mut spans = vec![Span::new(8, values, 1, true), Span::new(9, scales, 1, true)];
            if let Some(w) = workspace {
                check_view(call, "workspace", w, TokenWorkspace::bytes(p.token_rows(), p.k()), BUFFER_ALIGN)?;
                spans.push(Span::new(10, w, 1, true));
            }
            let (global_scale, group_scales) = match global_scale {
                GlobalScale::Tensor(s) => {
                    if !(s.is_finite() && s > 0.0) {
                        return Err(invalid(call, "global_scale", format!("{s} is not finite and positive")));
                    }
                    (s, 0)
                }
                GlobalScale::PerGroup(v) => {
                    check_view(call, "global_scale", v, p.groups(), 4)?;
                    spans.push(Span::new(5, v, 4, false));
                    (1.0, v.ptr)
                }
            };
            Ok((
                spans,
                OutputParams {
                    values: values.ptr,
                    scales: scales.ptr,
                    global_scale,
                    group_scales,
                    quantize: true,
                    workspace: workspace.map_or(0, |w| w.ptr),
                },
            ))
        }
        BlockOutput::Dense(dense) => {
            check_view(call, "output", dense, p.token_rows() * p.k(), BUFFER_ALIGN)?;
            Ok((
                vec![Span::new(8, dense, 2, true)],
                OutputParams {
                    values: dense.ptr,
                    scales: 0,
                    global_scale: 1.0,
                    group_scales: 0,
                    quantize: false,
                    workspace: 0,
                },
            ))
        }
    }
}

/// The names of the spans, by id, of a call writing `out`.
fn name_of(out: BlockOutput) -> impl Fn(u32) -> crate::error::BufferName {
    overlap::fields(match out {
        BlockOutput::Dense(_) => &["x", "row_token", "row_weight", "sizes", "h", "", "", "", "output", "scales"],
        BlockOutput::Nvfp4 { .. } => {
            &["x", "row_token", "row_weight", "sizes", "h", "global_scale", "", "", "values", "scales", "workspace"]
        }
    })
}

/// Checks a gather's arguments (those of [`Quantizer::quantize_grouped_gather_views`]) and returns
/// the kernel parameters and work items the call launches with. Pure: runs on the CPU (the
/// device-model tests launch the kernel with them).
pub fn gather_params(
    p: &MoeProblem,
    bf16: bool,
    inputs: &GatherInputs,
    out: BlockOutput,
) -> Result<(GroupedConvertParams, u64)> {
    let (rows, k) = (p.token_rows(), p.k());
    if inputs.row_token.is_none() && inputs.tokens != rows {
        return Err(invalid(
            GATHER,
            "tokens",
            format!("is {}; without row_token it must be the {rows} token rows", inputs.tokens),
        ));
    }
    let tokens = u32::try_from(inputs.tokens)
        .map_err(|_| invalid(GATHER, "tokens", format!("{} is too large", inputs.tokens)))?;
    let x_len = inputs.tokens.checked_mul(k).ok_or_else(|| invalid(GATHER, "tokens", "x is too large"))?;
    check_view(GATHER, "x", inputs.x, x_len, BUFFER_ALIGN)?;
    check_view(GATHER, "sizes", inputs.sizes, p.sizes_len(), 4)?;
    let mut spans = vec![Span::new(0, inputs.x, 2, false), Span::new(3, inputs.sizes, 4, false)];
    if let Some(t) = inputs.row_token {
        check_view(GATHER, "row_token", t, rows, 4)?;
        spans.push(Span::new(1, t, 4, false));
    }
    if let Some(w) = inputs.row_weight {
        check_view(GATHER, "row_weight", w, rows, 4)?;
        spans.push(Span::new(2, w, 4, false));
    }
    let (out_spans, OutputParams { values, scales, global_scale, group_scales, quantize, workspace }) =
        check_output(GATHER, p, out)?;
    spans.extend(out_spans);
    overlap::check(GATHER, &mut spans, name_of(out))?;
    let params = GroupedConvertParams {
        convert: ConvertParams {
            dense: inputs.x.ptr,
            values,
            scales,
            rows: rows as u32,
            k: k as u32,
            global_scale,
            bf16: bf16 as u32,
        },
        sizes: p.device_sizes(inputs.sizes.ptr),
        gather: Gather {
            row_token: inputs.row_token.map_or(0, |v| v.ptr),
            row_weight: inputs.row_weight.map_or(0, |v| v.ptr),
            tokens,
            dense_output: !quantize as u32,
            group_scales,
            workspace,
        },
    };
    Ok((params, rows as u64 * (k as u64 / qabi::BLOCK as u64)))
}

/// Checks an activation's arguments (those of [`Quantizer::activate_grouped_views`]; `p`: the
/// second GEMM's problem, `K = I`) and returns the kernel parameters, the work items the call
/// launches with and the threads per block of 16 outputs, which name the kernel
/// ([`activate_parts`] of the rows at most `routed` of the problem's token rows hold: 1
/// `moe_activate_blocks`, else `moe_activate`; both take the same parameters and give the same
/// outputs). Pure, as [`gather_params`].
#[allow(clippy::too_many_arguments)]
pub fn activate_params(
    p: &MoeProblem,
    activation: Activation,
    gated: bool,
    bf16: bool,
    h: BufferView,
    sizes: BufferView,
    out: BlockOutput,
    routed: usize,
) -> Result<(ActivateParams, u64, u32)> {
    let (rows, inter) = (p.token_rows(), p.k());
    let n1 = if gated { 2 * inter } else { inter };
    // The four-thread kernel's count bounds both kernels'.
    let most_items = activate_items(rows as u32, inter as u32, ACTIVATE_PARTS);
    if most_items >= qabi::MAX_ITEMS {
        return Err(invalid(ACTIVATE, "h", format!("{rows} x {inter} is too large (at most 2^33 values per call)")));
    }
    check_view(ACTIVATE, "h", h, rows * n1, BUFFER_ALIGN)?;
    check_view(ACTIVATE, "sizes", sizes, p.sizes_len(), 4)?;
    let mut spans = vec![Span::new(4, h, 2, false), Span::new(3, sizes, 4, false)];
    let (out_spans, OutputParams { values, scales, global_scale, group_scales, quantize, workspace }) =
        check_output(ACTIVATE, p, out)?;
    spans.extend(out_spans);
    overlap::check(ACTIVATE, &mut spans, name_of(out))?;
    let parts = activate_parts(routed.min(rows) as u32, inter as u32, quantize);
    let items = activate_items(rows as u32, inter as u32, parts);
    let params = ActivateParams {
        h: h.ptr,
        out: values,
        scales,
        sizes: p.device_sizes(sizes.ptr),
        inter: inter as u32,
        activation: activation as u32,
        gated: gated as u32,
        bf16: bf16 as u32,
        quantize: quantize as u32,
        global_scale,
        group_scales,
        workspace,
    };
    Ok((params, items, parts))
}

impl Quantizer {
    /// The MoE block's gather + quantization (contract steps 1–2; module docs): `problem` is the
    /// first GEMM's (`K = H`, its token layout and sizes), `bf16` the type of `x` (f16 when
    /// false). Rows of no group, and padding scale rows, are not written.
    ///
    /// Errors (before any launch): [`crate::Error::InvalidArgument`] for a buffer of the wrong length
    /// or alignment, `tokens` not the token rows without `row_token`, a global scale not finite
    /// and positive; [`crate::Error::Overlap`] for an output overlapping another buffer (the inputs may
    /// share memory).
    ///
    /// # Safety
    /// As [`crate::GemmPlan::run_views`], for every buffer.
    pub unsafe fn quantize_grouped_gather_views(
        &self,
        stream: &CudaStream,
        problem: &MoeProblem,
        bf16: bool,
        inputs: &GatherInputs,
        out: BlockOutput,
    ) -> Result<()> {
        let (params, items) = gather_params(problem, bf16, inputs, out)?;
        // SAFETY: validated (lengths, alignment, overlap: the kernel's `# Safety`); the caller's
        // contract for the memory.
        unsafe { self.launch_grouped(stream, items, &params) }
    }

    /// [`Quantizer::quantize_grouped_gather_views`] and, in the same launch (sm_90a), the
    /// schedulers of the block's two GEMMs (`schedules`, from `MoePlan::prepare_scheduled`):
    /// `sm90_quantize_schedule`. The same checks; `Error::Unsupported` off sm_90a.
    ///
    /// # Safety
    /// As [`Quantizer::quantize_grouped_gather_views`]; `schedules` are the prepared calls'.
    pub(crate) unsafe fn quantize_schedule_gather_views(
        &self,
        stream: &CudaStream,
        problem: &MoeProblem,
        bf16: bool,
        inputs: &GatherInputs,
        out: BlockOutput,
        schedules: [Sm90ScheduleParams; SCHEDULE_CTAS as usize],
    ) -> Result<()> {
        let (quantize, items) = gather_params(problem, bf16, inputs, out)?;
        // The shared memory of the scheduler of the most groups.
        let groups = schedules.iter().map(|s| s.common.sizes.groups).max().unwrap_or(0);
        let params = QuantizeScheduleParams { quantize, schedules };
        // SAFETY: validated as for the quantization alone; the schedulers' parameters are their
        // plans' (the caller's contract), and write only those plans' memory.
        unsafe { self.launch_quantize_schedule(stream, items, groups, &params) }
    }

    /// The MoE block's activation (+ requantization) (contract steps 4–5; module docs):
    /// `problem` is the second GEMM's (`K = I`, a multiple of 64; its token layout and sizes),
    /// `h` the first GEMM's output (`[token_rows, 2I]` when `gated`, else `[token_rows, I]`, of
    /// f16, or bf16 when `bf16`), written to `out` as the second GEMM's token operand. Rows of
    /// no group are neither read nor written. `routed`: at most this many rows are in groups
    /// (the block's `T · top_k`; `usize::MAX` when unknown): it picks the kernel only
    /// ([`activate_params`]).
    ///
    /// Errors as for [`Quantizer::quantize_grouped_gather_views`].
    ///
    /// # Safety
    /// As [`crate::GemmPlan::run_views`], for every buffer.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn activate_grouped_views(
        &self,
        stream: &CudaStream,
        problem: &MoeProblem,
        activation: Activation,
        gated: bool,
        bf16: bool,
        h: BufferView,
        sizes: BufferView,
        out: BlockOutput,
        routed: usize,
    ) -> Result<()> {
        let (params, items, parts) = activate_params(problem, activation, gated, bf16, h, sizes, out, routed)?;
        // SAFETY: validated; the caller's contract for the memory.
        unsafe { self.launch_activate(stream, items, parts == 1, &params) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::moe::TokenLayout;
    use crate::problem::OutputType;

    fn field(r: Result<impl Sized>) -> &'static str {
        match r.err().unwrap() {
            Error::InvalidArgument { field, .. } => field,
            other => panic!("{other:?}"),
        }
    }

    fn overlap(r: Result<impl Sized>) -> (&'static str, &'static str) {
        match r.err().unwrap() {
            Error::Overlap { output, other, .. } => (output.field, other.field),
            other => panic!("{other:?}"),
        }
    }

    fn view(ptr: u64, len: usize) -> BufferView {
        BufferView { ptr, len }
    }

    #[test]
    fn gather_arguments() {
        let p = MoeProblem::new(3, 8, 128, TokenLayout::Contiguous { max_tokens: 40 }, OutputType::Bf16).unwrap();
        let a = p.a_sizes();
        let inputs = GatherInputs {
            x: view(0x10_0000, 7 * 128),
            tokens: 7,
            row_token: Some(view(0x20_0000, 40)),
            row_weight: Some(view(0x21_0000, 40)),
            sizes: view(0x22_0004, 4),
        };
        let nvfp4 = BlockOutput::Nvfp4 {
            values: view(0x30_0000, a.values),
            scales: view(0x40_0000, a.scales),
            global_scale: GlobalScale::Tensor(0.5),
            workspace: None,
        };
        let (params, items) = gather_params(&p, true, &inputs, nvfp4).unwrap();
        assert_eq!(items, 40 * 8);
        assert_eq!((params.convert.rows, params.convert.k, params.convert.bf16), (40, 128, 1));
        assert_eq!(
            (params.convert.values, params.convert.scales, params.convert.global_scale),
            (0x30_0000, 0x40_0000, 0.5)
        );
        assert_eq!(
            params.gather,
            Gather {
                row_token: 0x20_0000,
                row_weight: 0x21_0000,
                tokens: 7,
                dense_output: 0,
                group_scales: 0,
                workspace: 0
            }
        );
        assert_eq!(params.sizes, p.device_sizes(0x22_0004));
        let dense = BlockOutput::Dense(view(0x50_0000, 40 * 128));
        let (params, _) = gather_params(&p, false, &inputs, dense).unwrap();
        assert_eq!((params.gather.dense_output, params.convert.values, params.convert.scales), (1, 0x50_0000, 0));
        let identity =
            GatherInputs { row_token: None, row_weight: None, x: view(0x10_0000, 40 * 128), tokens: 40, ..inputs };
        let (params, _) = gather_params(&p, false, &identity, nvfp4).unwrap();
        assert_eq!(
            params.gather,
            Gather { row_token: 0, row_weight: 0, tokens: 40, dense_output: 0, group_scales: 0, workspace: 0 }
        );

        assert_eq!(field(gather_params(&p, false, &GatherInputs { tokens: 7, ..identity }, nvfp4)), "tokens");
        assert_eq!(field(gather_params(&p, false, &GatherInputs { tokens: 8, ..inputs }, nvfp4)), "x");
        assert_eq!(
            field(gather_params(&p, false, &GatherInputs { x: view(0x10_0008, 7 * 128), ..inputs }, nvfp4)),
            "x"
        );
        assert_eq!(
            field(gather_params(&p, false, &GatherInputs { row_token: Some(view(0x20_0000, 39)), ..inputs }, nvfp4)),
            "row_token"
        );
        assert_eq!(
            field(gather_params(&p, false, &GatherInputs { row_weight: Some(view(0x21_0002, 40)), ..inputs }, nvfp4)),
            "row_weight"
        );
        assert_eq!(
            field(gather_params(&p, false, &GatherInputs { sizes: view(0x22_0004, 3), ..inputs }, nvfp4)),
            "sizes"
        );
        let bad_scale = BlockOutput::Nvfp4 {
            values: view(0x30_0000, a.values),
            scales: view(0x40_0000, a.scales),
            global_scale: GlobalScale::Tensor(f32::NAN),
            workspace: None,
        };
        assert_eq!(field(gather_params(&p, false, &inputs, bad_scale)), "global_scale");
        let short = BlockOutput::Nvfp4 {
            values: view(0x30_0000, a.values - 1),
            scales: view(0x40_0000, a.scales),
            global_scale: GlobalScale::Tensor(1.0),
            workspace: None,
        };
        assert_eq!(field(gather_params(&p, false, &inputs, short)), "values");
        assert_eq!(field(gather_params(&p, false, &inputs, BlockOutput::Dense(view(0x50_0000, 7 * 128)))), "output");

        // Outputs overlap no input and no other output; inputs may share memory.
        let on_x = BlockOutput::Dense(view(0x10_0000 + 64, 40 * 128));
        assert_eq!(overlap(gather_params(&p, false, &inputs, on_x)), ("output", "x"));
        let on_weight = BlockOutput::Nvfp4 {
            values: view(0x30_0000, a.values),
            scales: view(0x21_0000, a.scales),
            global_scale: GlobalScale::Tensor(1.0),
            workspace: None,
        };
        assert_eq!(overlap(gather_params(&p, false, &inputs, on_weight)), ("scales", "row_weight"));
        let on_token = BlockOutput::Nvfp4 {
            values: view(0x20_0000, a.values),
            scales: view(0x40_0000, a.scales),
            global_scale: GlobalScale::Tensor(1.0),
            workspace: None,
        };
        assert_eq!(overlap(gather_params(&p, false, &inputs, on_token)), ("values", "row_token"));
        let on_values = BlockOutput::Nvfp4 {
            values: view(0x30_0000, a.values),
            scales: view(0x30_0010, a.scales),
            global_scale: GlobalScale::Tensor(1.0),
            workspace: None,
        };
        assert_eq!(overlap(gather_params(&p, false, &inputs, on_values)), ("scales", "values"));
        let shared = GatherInputs { row_weight: Some(view(0x20_0000, 40)), ..inputs };
        assert!(gather_params(&p, false, &shared, nvfp4).is_ok());

        // One global scale per group: an f32 per group, read like the inputs.
        let per_group = |scales: BufferView| BlockOutput::Nvfp4 {
            values: view(0x30_0000, a.values),
            scales: view(0x40_0000, a.scales),
            global_scale: GlobalScale::PerGroup(scales),
            workspace: None,
        };
        let (params, _) = gather_params(&p, true, &inputs, per_group(view(0x60_0000, 3))).unwrap();
        assert_eq!((params.gather.group_scales, params.convert.global_scale), (0x60_0000, 1.0));
        assert_eq!(field(gather_params(&p, true, &inputs, per_group(view(0x60_0000, 2)))), "global_scale");
        assert_eq!(field(gather_params(&p, true, &inputs, per_group(view(0x60_0002, 3)))), "global_scale");
        assert_eq!(
            overlap(gather_params(&p, true, &inputs, per_group(view(0x30_0000, 3)))),
            ("values", "global_scale")
        );
        assert!(gather_params(&p, true, &inputs, per_group(view(0x21_0000, 3))).is_ok(), "inputs may share memory");

        // The GEMM's token workspace: 40 rows of 128 f16, written.
        let with_workspace = |w: BufferView| BlockOutput::Nvfp4 {
            values: view(0x30_0000, a.values),
            scales: view(0x40_0000, a.scales),
            global_scale: GlobalScale::Tensor(1.0),
            workspace: Some(w),
        };
        let (params, _) = gather_params(&p, true, &inputs, with_workspace(view(0x70_0000, 40 * 128 * 2))).unwrap();
        assert_eq!(params.gather.workspace, 0x70_0000);
        assert_eq!(field(gather_params(&p, true, &inputs, with_workspace(view(0x70_0000, 40 * 128)))), "workspace");
        assert_eq!(field(gather_params(&p, true, &inputs, with_workspace(view(0x70_0008, 40 * 256)))), "workspace");
        assert_eq!(
            overlap(gather_params(&p, true, &inputs, with_workspace(view(0x10_0000, 40 * 256)))),
            ("workspace", "x")
        );
        assert_eq!(
            overlap(gather_params(&p, true, &inputs, with_workspace(view(0x40_0000, 40 * 256)))),
            ("workspace", "scales")
        );
    }

    #[test]
    fn activate_arguments() {
        let p = MoeProblem::new(2, 256, 128, TokenLayout::Masked { max_rows: 10 }, OutputType::F16).unwrap();
        let a = p.a_sizes();
        let (h, sizes) = (view(0x10_0000, 20 * 256), view(0x20_0000, 2));
        let silu = |out| activate_params(&p, Activation::Silu, true, false, h, sizes, out, usize::MAX);
        let nvfp4 = BlockOutput::Nvfp4 {
            values: view(0x30_0000, a.values),
            scales: view(0x40_0000, a.scales),
            global_scale: GlobalScale::Tensor(2.0),
            workspace: None,
        };
        let (params, items, parts) =
            activate_params(&p, Activation::GeluTanh, true, true, h, sizes, nvfp4, usize::MAX).unwrap();
        assert_eq!((items, parts), (20 * 8 * 4, 4), "20 rows of 8 blocks, 4 parts each");
        // 100 rows of 1024 blocks: one thread per block, unless at most 10 rows are routed.
        let big =
            MoeProblem::new(2, 32768, 16384, TokenLayout::Contiguous { max_tokens: 100 }, OutputType::F16).unwrap();
        let ab = big.a_sizes();
        let out = |s| BlockOutput::Nvfp4 {
            values: view(0x100_0000, ab.values),
            scales: view(0x200_0000, ab.scales),
            global_scale: GlobalScale::Tensor(s),
            workspace: None,
        };
        let call = |routed| {
            let (hb, sb) = (view(0x1000_0000, 100 * 32768), view(0x20_0000, 3));
            let (_, items, parts) =
                activate_params(&big, Activation::Silu, true, false, hb, sb, out(1.0), routed).unwrap();
            (items, parts)
        };
        assert_eq!(call(usize::MAX), (100 * 1024, 1));
        assert_eq!(call(1000), (100 * 1024, 1));
        assert_eq!(call(10), (100 * 1024 * 4, 4));
        assert_eq!(
            params,
            ActivateParams {
                h: 0x10_0000,
                out: 0x30_0000,
                scales: 0x40_0000,
                sizes: p.device_sizes(0x20_0000),
                inter: 128,
                activation: Activation::GeluTanh as u32,
                gated: 1,
                bf16: 1,
                quantize: 1,
                global_scale: 2.0,
                group_scales: 0,
                workspace: 0,
            }
        );
        let dense = BlockOutput::Dense(view(0x50_0000, 20 * 128));
        let h1 = view(0x10_0000, 20 * 128);
        let (params, _, _) =
            activate_params(&p, Activation::Relu2, false, false, h1, sizes, dense, usize::MAX).unwrap();
        assert_eq!((params.out, params.scales, params.quantize, params.gated), (0x50_0000, 0, 0, 0));

        assert_eq!(field(activate_params(&p, Activation::Silu, true, false, h1, sizes, dense, usize::MAX)), "h");
        assert_eq!(
            field(activate_params(
                &p,
                Activation::Silu,
                false,
                false,
                view(0x10_0004, 20 * 128),
                sizes,
                dense,
                usize::MAX
            )),
            "h"
        );
        assert_eq!(
            field(activate_params(&p, Activation::Silu, true, false, h, view(0x20_0000, 3), dense, usize::MAX)),
            "sizes"
        );
        let bad = BlockOutput::Nvfp4 {
            values: view(0x30_0000, a.values),
            scales: view(0x40_0000, a.scales),
            global_scale: GlobalScale::Tensor(0.0),
            workspace: None,
        };
        assert_eq!(field(silu(bad)), "global_scale");
        let short = BlockOutput::Nvfp4 {
            values: view(0x30_0000, a.values),
            scales: view(0x40_0000, a.scales + 1),
            global_scale: GlobalScale::Tensor(1.0),
            workspace: None,
        };
        assert_eq!(field(silu(short)), "scales");
        assert_eq!(overlap(silu(BlockOutput::Dense(view(0x10_0000 + 20 * 256 * 2 - 16, 20 * 128)))), ("output", "h"));
        let on_sizes = BlockOutput::Nvfp4 {
            values: view(0x30_0000, a.values),
            scales: view(0x20_0000, a.scales),
            global_scale: GlobalScale::Tensor(1.0),
            workspace: None,
        };
        assert_eq!(overlap(silu(on_sizes)), ("scales", "sizes"));
        let per_group = |scales: BufferView| BlockOutput::Nvfp4 {
            values: view(0x30_0000, a.values),
            scales: view(0x40_0000, a.scales),
            global_scale: GlobalScale::PerGroup(scales),
            workspace: None,
        };
        let (params, _, _) = silu(per_group(view(0x60_0000, 2))).unwrap();
        assert_eq!((params.group_scales, params.global_scale), (0x60_0000, 1.0));
        assert_eq!(field(silu(per_group(view(0x60_0000, 3)))), "global_scale");
        assert_eq!(overlap(silu(per_group(view(0x40_0000, 2)))), ("scales", "global_scale"));

        // The second GEMM's token workspace: 20 rows of I = 128 f16, written.
        let with_workspace = |w: BufferView| BlockOutput::Nvfp4 {
            values: view(0x30_0000, a.values),
            scales: view(0x40_0000, a.scales),
            global_scale: GlobalScale::Tensor(1.0),
            workspace: Some(w),
        };
        let (params, _, _) = silu(with_workspace(view(0x70_0000, 20 * 128 * 2))).unwrap();
        assert_eq!(params.workspace, 0x70_0000);
        assert_eq!(field(silu(with_workspace(view(0x70_0000, 20 * 128 * 2 + 1)))), "workspace");
        assert_eq!(overlap(silu(with_workspace(view(0x10_0000, 20 * 256)))), ("workspace", "h"));
    }
}
