//! The C interface (`host/include/nvfp4_gemm.h`): `extern "C"` functions over the library's typed
//! entries on buffers given as addresses and lengths ([`GemmPlan::run_views`],
//! [`GemmPlan::run_stacked_views`], [`MoePlan::run_views`], [`Quantizer::quantize_views`],
//! [`Quantizer::dequantize_views`], [`Quantizer::quantize_grouped_views`],
//! [`Prepacker::prepack_views`], [`ExpertBlock::run_views`]: the whole expert block planned from a
//! checkpoint's shards as stored), and the CPU weight prepack of W4A16 ([`crate::w4a16::prepack`]).
//!
//! Build a library exporting it with `cargo rustc -p nvfp4-gemm --release --crate-type cdylib`
//! (or `staticlib`). The header is written by hand and checked by `host/tests/c_header.rs`: every
//! function here has its prototype there with the same parameters and C types and the other way
//! round, every `#define NVFP4_*` equals the constant of the same name here, and a C compiler
//! asserts each struct's size and field offsets against these `#[repr(C)]` structs.
//!
//! What this module adds to the typed entries is only what C needs: handles (boxed
//! [`Nvfp4Device`], [`Nvfp4GemmPlan`], [`Nvfp4MoePlan`], [`Nvfp4ExpertBlock`]), codes for enums (`NVFP4_F16` …), null
//! checks, and status codes. Every call goes through the same validation as a Rust caller's
//! (lengths, alignment, overlaps, output and token type, finite host alphas) before anything is
//! launched; what no validation can check is that an address really is device memory of that
//! length, each function's `# Safety`.
//!
//! Buffers ([`RawBuffer`]) are device addresses with lengths in elements: bytes for NVFP4 values
//! and scales, 16-bit elements for f16/bf16 tensors (C, the quantizer's dense tensors, W4A16's
//! activations), `u32`s for MoE sizes, `f32`s for device alphas.
//!
//! W4A16 (sm_90a): a plan made with the token type [`NVFP4_TOKENS_F16`] or [`NVFP4_TOKENS_BF16`]
//! ([`nvfp4_gemm_plan_create_tokens`], [`nvfp4_moe_plan_create_tokens`]) takes 16-bit activations
//! as its token operand: `a.values` of [`RawGroupArgs`], [`RawStackedArgs`] and [`RawMoeArgs`]
//! holds them (length in 16-bit elements) and `a.scales` must be empty (length 0). Its weights
//! are prepacked once, on the host ([`nvfp4_w4a16_prepack`]) or on the GPU for a stack of experts
//! ([`nvfp4_w4a16_prepack_device`], the same bytes). On sm_100a such a plan, and the GPU prepack,
//! are [`NVFP4_UNSUPPORTED`].
//!
//! Streams are borrowed (`CUstream`, null for the legacy default stream, of the device's primary
//! context): never destroyed or synchronized by this library. Work is enqueued in stream order;
//! nothing synchronizes the host but plan creation (which waits for the plan's own memory). Plans
//! own device memory (tables, workspace) that every call uses: calls on different streams must be
//! ordered by the caller.
//!
//! Every function returning `int` returns a status ([`NVFP4_OK`] …; [`status_of`] maps the
//! library's [`Error`]s) and writes the error's text, NUL-terminated and truncated at a UTF-8
//! boundary, into `err`/`err_len` (may be null/0; an empty string on success). Nothing unwinds
//! into C: a panic becomes [`NVFP4_PANIC`].

use crate::device::Gpu;
use crate::error::{invalid, Error, Result};
use crate::moe::{MoeBuffers, MoePlan, MoeProblem, MoeTokens, TokenLayout};
use crate::moe_block::{
    load_checkpoint_experts, Activation, ActivationPlacement, BlockOptions, BlockPlan, BlockShape, BlockViews, Dense16,
    ExpertBlock, IdType, LoadedExperts, Precision, RouterWeightAt, WeightType,
};
use crate::plan::{GemmPlan, StackedViews};
use crate::problem::{Activations, BufferView, GroupBuffers, GroupShape, OutputType, Problem, TokenKind};
use crate::quantize::Quantizer;
use crate::w4a16::{PrepackViews, Prepacker, WeightStack};
use cudarc::driver::{sys, CudaContext, CudaStream, DevicePtr};
use nvfp4_format::checkpoint::{Convention, LoadOptions, Projections, Reconcile};
use nvfp4_format::Nvfp4Matrix;
use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

// Lengths and addresses cross as 64-bit values and become `usize`s unchanged.
const _: () = assert!(usize::BITS == 64);

/// Status: success.
pub const NVFP4_OK: i32 = 0;
/// Status: an argument, group or problem is invalid, or an argument has the wrong type (nothing
/// was launched).
pub const NVFP4_INVALID: i32 = 1;
/// Status: the device or operation is not supported, e.g. W4A16 on sm_100a (nothing was
/// launched).
pub const NVFP4_UNSUPPORTED: i32 = 2;
/// Status: no CUDA driver could be loaded.
pub const NVFP4_NO_DRIVER: i32 = 3;
/// Status: a CUDA driver call failed.
pub const NVFP4_DRIVER: i32 = 4;
/// Status: the library panicked (a bug); the handle should not be used again.
pub const NVFP4_PANIC: i32 = 5;
/// Status: the call was made inside a CUDA graph capture, where the plan cannot take it (it would
/// have to allocate: the first call after an earlier capture); nothing was captured. End the
/// capture, call the plan once outside capture, then capture again.
pub const NVFP4_CAPTURE: i32 = 6;

/// Element type code of C and of the quantizer's dense tensors: IEEE half.
pub const NVFP4_F16: u32 = 0;
/// Element type code of C and of the quantizer's dense tensors: bfloat16.
pub const NVFP4_BF16: u32 = 1;

/// MoE token layout code: contiguous (`bound` = `max_tokens`).
pub const NVFP4_CONTIGUOUS: u32 = 0;
/// MoE token layout code: masked (`bound` = `max_rows`).
pub const NVFP4_MASKED: u32 = 1;

/// Token type code of a plan: NVFP4 tokens (W4A4).
pub const NVFP4_TOKENS_NVFP4: u32 = 0;
/// Token type code of a plan: f16 activations (W4A16, weights prepacked for f16).
pub const NVFP4_TOKENS_F16: u32 = 1;
/// Token type code of a plan: bf16 activations (W4A16, weights prepacked for bf16).
pub const NVFP4_TOKENS_BF16: u32 = 2;

/// Checkpoint convention code: ModelOpt (`weight_scale_2`, `input_scale`: dequantization
/// multipliers).
pub const NVFP4_MODELOPT: u32 = 0;
/// Checkpoint convention code: compressed-tensors (`weight_global_scale`, `input_global_scale`:
/// their inverses).
pub const NVFP4_COMPRESSED_TENSORS: u32 = 1;

/// Projection names code: `w1`, `w3`, `w2`.
pub const NVFP4_PROJECTIONS_W1_W3_W2: u32 = 0;
/// Projection names code: `gate_proj`, `up_proj`, `down_proj`.
pub const NVFP4_PROJECTIONS_GATE_UP_DOWN: u32 = 1;

/// w1/w3 global scales that differ: refused.
pub const NVFP4_RECONCILE_REFUSE: u32 = 0;
/// w1/w3 global scales that differ: the larger kept, the other half's block scales rescaled
/// exactly (refused unless exact).
pub const NVFP4_RECONCILE_EXACT: u32 = 1;
/// w1/w3 global scales that differ: as exact, the block scales rounded to e4m3.
pub const NVFP4_RECONCILE_ROUND: u32 = 2;

/// The block's activation code: silu (gated).
pub const NVFP4_SILU: u32 = 0;
/// The block's activation code: gelu with the tanh approximation (gated).
pub const NVFP4_GELU_TANH: u32 = 1;
/// The block's activation code: `max(h, 0)²` (not gated).
pub const NVFP4_RELU2: u32 = 2;

/// The block's precision code: NVFP4 activations (quantized on the GPU).
pub const NVFP4_W4A4: u32 = 0;
/// The block's precision code: 16-bit activations times the NVFP4 weights (sm_90a).
pub const NVFP4_W4A16: u32 = 1;

/// Block flag: the router weight multiplies the input instead of the output.
pub const NVFP4_BLOCK_WEIGHT_AT_INPUT: u32 = 1;
/// Block flag: the activation in the first GEMM's epilogue (W4A4 on sm_90a).
pub const NVFP4_BLOCK_ACTIVATION_EPILOGUE: u32 = 2;

/// `topk_ids` type code: int32.
pub const NVFP4_IDS_I32: u32 = 0;
/// `topk_ids` type code: int64.
pub const NVFP4_IDS_I64: u32 = 1;
/// `topk_weights` type code: float32.
pub const NVFP4_WEIGHTS_F32: u32 = 0;
/// `topk_weights` type code: bfloat16.
pub const NVFP4_WEIGHTS_BF16: u32 = 1;

/// The C status of an error: [`Error::NoDriver`] [`NVFP4_NO_DRIVER`];
/// [`Error::UnsupportedArch`] and [`Error::Unsupported`] [`NVFP4_UNSUPPORTED`];
/// [`Error::Driver`] [`NVFP4_DRIVER`]; [`Error::Capture`] [`NVFP4_CAPTURE`]; every other error
/// (invalid problems, groups and arguments, wrong types, overlaps, limits) [`NVFP4_INVALID`].
pub fn status_of(e: &Error) -> i32 {
    match e {
        Error::NoDriver => NVFP4_NO_DRIVER,
        Error::UnsupportedArch { .. } | Error::Unsupported(_) => NVFP4_UNSUPPORTED,
        Error::Driver { .. } => NVFP4_DRIVER,
        Error::Capture(_) => NVFP4_CAPTURE,
        _ => NVFP4_INVALID,
    }
}

/// A device buffer (C `nvfp4_buffer`): address and length in elements of the buffer's type.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawBuffer {
    /// Device address (`CUdeviceptr`).
    pub ptr: u64,
    /// Length in elements.
    pub len: u64,
}

/// An NVFP4 operand (C `nvfp4_operand`): packed e2m1 values and e4m3 scales in the 128x4 blocked
/// layout (bytes). As a W4A16 plan's token operand: the activations in `values` (16-bit
/// elements), `scales` empty.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawOperand {
    /// Packed values (or W4A16's activations).
    pub values: RawBuffer,
    /// Blocked scales (empty for W4A16's activations).
    pub scales: RawBuffer,
}

/// One group's buffers of [`nvfp4_gemm_run`] (C `nvfp4_group_args`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RawGroupArgs {
    /// A (`m × k`): NVFP4 tokens, or a W4A16 plan's activations.
    pub a: RawOperand,
    /// B (`n × k`; prepacked for a W4A16 plan).
    pub b: RawOperand,
    /// C (`m × n` 16-bit elements of the call's output type).
    pub c: RawBuffer,
    /// The group's alpha (not read with device alphas).
    pub alpha: f32,
}

/// Every group's buffers stacked, for [`nvfp4_gemm_run_stacked`] (C `nvfp4_stacked_args`):
/// each buffer holds every group's part back to back ([`Problem::stacked_offsets`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawStackedArgs {
    /// Every group's A (or a W4A16 plan's activations).
    pub a: RawOperand,
    /// Every group's B.
    pub b: RawOperand,
    /// Every group's C (16-bit elements).
    pub c: RawBuffer,
}

/// The buffers of one [`nvfp4_moe_run`] besides the weights (C `nvfp4_moe_args`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawMoeArgs {
    /// `offsets[G + 1]` or `counts[G]`, `u32` (an `int32` tensor has the same bits).
    pub sizes: RawBuffer,
    /// The token tensor A in the problem's layout (or a W4A16 plan's activations).
    pub a: RawOperand,
    /// C (16-bit elements).
    pub c: RawBuffer,
}

/// One group's shape for [`nvfp4_gemm_plan_create`] (C `nvfp4_shape`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawShape {
    /// Rows of A and C (tokens); 0 skips the group.
    pub m: u64,
    /// Rows of B, columns of C: a positive multiple of 8.
    pub n: u64,
    /// The reduction length: a positive multiple of 64.
    pub k: u64,
}

/// An opened device (C handle `nvfp4_device`): the GPU with this library's kernels loaded, and
/// its quantizer.
pub struct Nvfp4Device {
    gpu: Gpu,
    quantizer: Quantizer,
}

/// A grouped GEMM plan with its device's context (C handle `nvfp4_gemm_plan`).
pub struct Nvfp4GemmPlan {
    ctx: Arc<CudaContext>,
    plan: GemmPlan,
}

/// A MoE plan with its device's context (C handle `nvfp4_moe_plan`).
pub struct Nvfp4MoePlan {
    ctx: Arc<CudaContext>,
    plan: MoePlan,
}

/// Host bytes (C `nvfp4_host_bytes`): one safetensors shard's contents.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawHostBytes {
    /// The first byte (may be null when `len` is 0).
    pub data: *const u8,
    /// Bytes.
    pub len: usize,
}

/// The expert block's shape and options as codes (C `nvfp4_block_desc`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawBlockDesc {
    /// The global id of the rank's first expert (the checkpoint's numbering).
    pub first_expert: u64,
    /// The rank's experts.
    pub experts: u64,
    /// Experts per token.
    pub top_k: u64,
    /// The most tokens a call may pass.
    pub max_tokens: u64,
    /// [`NVFP4_SILU`], [`NVFP4_GELU_TANH`], [`NVFP4_RELU2`].
    pub activation: u32,
    /// [`NVFP4_W4A4`], [`NVFP4_W4A16`].
    pub precision: u32,
    /// The activations', intermediates' and output's type: [`NVFP4_F16`], [`NVFP4_BF16`].
    pub dtype: u32,
    /// [`NVFP4_BLOCK_WEIGHT_AT_INPUT`] | [`NVFP4_BLOCK_ACTIVATION_EPILOGUE`], or 0.
    pub flags: u32,
}

/// The whole expert block with its device's context (C handle `nvfp4_expert_block`).
pub struct Nvfp4ExpertBlock {
    ctx: Arc<CudaContext>,
    block: ExpertBlock,
}

/// What an expert block is made of, from the C codes: the experts read from the shards, the
/// shape, the options and the plan. Pure: runs on the CPU.
pub fn block_inputs(
    call: &'static str,
    shards: &[&[u8]],
    prefix: &str,
    convention: u32,
    projections: u32,
    reconcile: u32,
    desc: &RawBlockDesc,
) -> Result<(LoadedExperts, BlockShape, BlockOptions, BlockPlan)> {
    let convention = match convention {
        NVFP4_MODELOPT => Convention::ModelOpt,
        NVFP4_COMPRESSED_TENSORS => Convention::CompressedTensors,
        other => return Err(invalid(call, "convention", format!("{other} is not a convention code"))),
    };
    let projections = match projections {
        NVFP4_PROJECTIONS_W1_W3_W2 => Projections::W1_W3_W2,
        NVFP4_PROJECTIONS_GATE_UP_DOWN => Projections::GATE_UP_DOWN,
        other => return Err(invalid(call, "projections", format!("{other} is not a projections code"))),
    };
    let reconcile = match reconcile {
        NVFP4_RECONCILE_REFUSE => Reconcile::Refuse,
        NVFP4_RECONCILE_EXACT => Reconcile::Exact,
        NVFP4_RECONCILE_ROUND => Reconcile::Round,
        other => return Err(invalid(call, "reconcile", format!("{other} is not a reconcile code"))),
    };
    let activation = match desc.activation {
        NVFP4_SILU => Activation::Silu,
        NVFP4_GELU_TANH => Activation::GeluTanh,
        NVFP4_RELU2 => Activation::Relu2,
        other => return Err(invalid(call, "desc.activation", format!("{other} is not an activation code"))),
    };
    let precision = match desc.precision {
        NVFP4_W4A4 => Precision::W4a4,
        NVFP4_W4A16 => Precision::W4a16,
        other => return Err(invalid(call, "desc.precision", format!("{other} is not a precision code"))),
    };
    let dtype = match output_type(call, "desc.dtype", desc.dtype)? {
        OutputType::F16 => Dense16::F16,
        OutputType::Bf16 => Dense16::Bf16,
    };
    let known = NVFP4_BLOCK_WEIGHT_AT_INPUT | NVFP4_BLOCK_ACTIVATION_EPILOGUE;
    if desc.flags & !known != 0 {
        return Err(invalid(call, "desc.flags", format!("{:#x} has bits that are no flag", desc.flags)));
    }
    let (first, experts) = (desc.first_expert as usize, desc.experts as usize);
    if experts == 0 {
        return Err(invalid(call, "desc.experts", "0; the block needs at least one expert"));
    }
    let options = LoadOptions::new(prefix, convention, first..first + experts)
        .with_projections(projections)
        .with_reconcile(reconcile);
    let loaded = load_checkpoint_experts(call, shards, &options)?;
    let shape = BlockShape::of_experts(&loaded, desc.top_k as usize, desc.max_tokens as usize)
        .ok_or_else(|| invalid(call, "desc.experts", "no expert was loaded"))?;
    let mut block_options = BlockOptions::new(activation, precision, dtype);
    if desc.flags & NVFP4_BLOCK_WEIGHT_AT_INPUT != 0 {
        block_options = block_options.with_router_weight_at(RouterWeightAt::Input);
    }
    let placement = if desc.flags & NVFP4_BLOCK_ACTIVATION_EPILOGUE != 0 {
        ActivationPlacement::FirstGemmEpilogue
    } else {
        ActivationPlacement::Kernel
    };
    Ok((loaded, shape, block_options, BlockPlan { activation: placement, ..BlockPlan::default() }))
}

fn null_error(call: &'static str, field: &'static str) -> Error {
    invalid(call, field, "is a null pointer")
}

/// The [`OutputType`] of an element type code ([`NVFP4_F16`], [`NVFP4_BF16`]).
pub fn output_type(call: &'static str, field: &'static str, code: u32) -> Result<OutputType> {
    match code {
        NVFP4_F16 => Ok(OutputType::F16),
        NVFP4_BF16 => Ok(OutputType::Bf16),
        other => Err(invalid(call, field, format!("{other} is not {NVFP4_F16} (f16) or {NVFP4_BF16} (bf16)"))),
    }
}

/// The [`TokenKind`] of a token type code ([`NVFP4_TOKENS_NVFP4`], [`NVFP4_TOKENS_F16`],
/// [`NVFP4_TOKENS_BF16`]).
pub fn token_kind(call: &'static str, code: u32) -> Result<TokenKind> {
    match code {
        NVFP4_TOKENS_NVFP4 => Ok(TokenKind::Nvfp4),
        NVFP4_TOKENS_F16 => Ok(TokenKind::Dense(Activations::F16)),
        NVFP4_TOKENS_BF16 => Ok(TokenKind::Dense(Activations::Bf16)),
        other => Err(invalid(
            call,
            "token_type",
            format!(
                "{other} is not {NVFP4_TOKENS_NVFP4} (NVFP4), {NVFP4_TOKENS_F16} (f16 activations) or \
                 {NVFP4_TOKENS_BF16} (bf16 activations)"
            ),
        )),
    }
}

/// The [`TokenLayout`] of a layout code ([`NVFP4_CONTIGUOUS`], [`NVFP4_MASKED`]) and its bound.
pub fn token_layout(call: &'static str, layout: u32, bound: u64) -> Result<TokenLayout> {
    match layout {
        NVFP4_CONTIGUOUS => Ok(TokenLayout::Contiguous { max_tokens: bound as usize }),
        NVFP4_MASKED => Ok(TokenLayout::Masked { max_rows: bound as usize }),
        other => Err(invalid(
            call,
            "layout",
            format!("{other} is not {NVFP4_CONTIGUOUS} (contiguous) or {NVFP4_MASKED} (masked)"),
        )),
    }
}

/// A C buffer as the library's view.
fn view(b: RawBuffer) -> BufferView {
    BufferView { ptr: b.ptr, len: b.len as usize }
}

/// The view of a token operand's scales: NVFP4 tokens' scales, or, for a W4A16 plan's
/// activations, an empty view (`scales` must be empty: activations have none).
fn token_scales(call: &'static str, tokens: TokenKind, scales: RawBuffer) -> Result<BufferView> {
    match tokens {
        TokenKind::Nvfp4 => Ok(view(scales)),
        TokenKind::Dense(_) if scales.len == 0 => Ok(BufferView { ptr: 0, len: 0 }),
        TokenKind::Dense(a) => Err(invalid(
            call,
            "a.scales",
            format!("has {} elements; a W4A16 plan's tokens are {a:?} activations, which have no scales", scales.len),
        )),
    }
}

/// Writes `msg` NUL-terminated into `err` (at most `len` bytes, truncated at a UTF-8 boundary).
///
/// # Safety
/// `err` null or valid for `len` bytes of writes.
unsafe fn write_message(err: *mut c_char, len: usize, msg: &str) {
    if err.is_null() || len == 0 {
        return;
    }
    let mut n = msg.len().min(len - 1);
    while !msg.is_char_boundary(n) {
        n -= 1;
    }
    // SAFETY: `n + 1 <= len` bytes into the caller's buffer.
    unsafe {
        std::ptr::copy_nonoverlapping(msg.as_ptr(), err.cast::<u8>(), n);
        *err.add(n) = 0;
    }
}

/// Runs `f`, turning its error or panic into a status code and message.
///
/// # Safety
/// As [`write_message`].
unsafe fn ffi(err: *mut c_char, err_len: usize, f: impl FnOnce() -> Result<()>) -> i32 {
    let (status, msg) = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => (NVFP4_OK, String::new()),
        Ok(Err(e)) => (status_of(&e), e.to_string()),
        Err(_) => (NVFP4_PANIC, "the library panicked (a bug); see stderr".to_string()),
    };
    // SAFETY: the caller's contract.
    unsafe { write_message(err, err_len, &msg) };
    status
}

/// A slice from a C pointer and count (null allowed when `count = 0`).
///
/// # Safety
/// `ptr` valid for `count` reads of `T` when non-null.
unsafe fn c_slice<'a, T>(call: &'static str, ptr: *const T, count: usize, field: &'static str) -> Result<&'a [T]> {
    if count == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(null_error(call, field));
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, count) })
}

/// # Safety
/// `ptr` null or valid for one read of `T` for the returned lifetime.
unsafe fn handle<'a, T>(call: &'static str, ptr: *const T, field: &'static str) -> Result<&'a T> {
    // SAFETY: the caller's contract.
    unsafe { ptr.as_ref() }.ok_or_else(|| null_error(call, field))
}

/// # Safety
/// `ptr` null or a live handle of this type, not used elsewhere during the call.
unsafe fn handle_mut<'a, T>(call: &'static str, ptr: *mut T, field: &'static str) -> Result<&'a mut T> {
    // SAFETY: the caller's contract.
    unsafe { ptr.as_mut() }.ok_or_else(|| null_error(call, field))
}

/// Boxes `value` into the caller's out-pointer `out`.
fn into_handle<T>(call: &'static str, value: T, out: *mut *mut T) -> Result<()> {
    if out.is_null() {
        return Err(null_error(call, "out"));
    }
    // SAFETY: a non-null out-pointer the caller provides for one handle.
    unsafe { *out = Box::into_raw(Box::new(value)) };
    Ok(())
}

/// Drops a handle made by [`into_handle`] (null: nothing); a panic in a destructor is swallowed
/// (it must not unwind into C).
///
/// # Safety
/// `ptr` null or a live handle of this type, not used afterwards.
unsafe fn destroy<T>(ptr: *mut T) {
    if !ptr.is_null() {
        // SAFETY: the caller's contract: a handle from `into_handle`.
        let value = unsafe { Box::from_raw(ptr) };
        let _ = catch_unwind(AssertUnwindSafe(move || drop(value)));
    }
}

/// The caller's stream `cu_stream` (null: the legacy default stream) in `ctx`. Dropping it
/// neither destroys nor synchronizes the stream.
///
/// # Safety
/// `cu_stream` null or a live stream of `ctx`, alive while the work enqueued on it runs.
unsafe fn borrow_stream(ctx: &Arc<CudaContext>, cu_stream: sys::CUstream) -> Arc<CudaStream> {
    // SAFETY: the caller's contract.
    unsafe { ctx.wrap_borrowed_stream(cu_stream) }
}

/// Waits for the device's null stream (where plans allocate and zero their memory).
fn synchronize(gpu: &Gpu) -> Result<()> {
    gpu.context().default_stream().synchronize().map_err(|e| Error::driver("waiting for the new plan's memory", e))
}

/// Opens device `ordinal` (its primary context, the one the CUDA runtime uses) into `*out`, with
/// its kernels loaded (close it with [`nvfp4_device_close`]).
///
/// # Safety
/// `out` valid for one write; `err` null or valid for `err_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn nvfp4_device_open(
    ordinal: i32,
    out: *mut *mut Nvfp4Device,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    const CALL: &str = "nvfp4_device_open";
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let ordinal =
                usize::try_from(ordinal).map_err(|_| invalid(CALL, "ordinal", format!("{ordinal} is negative")))?;
            let gpu = Gpu::new(ordinal)?;
            let quantizer = Quantizer::new(&gpu)?;
            into_handle(CALL, Nvfp4Device { gpu, quantizer }, out)
        })
    }
}

/// Closes a device opened by [`nvfp4_device_open`] (null: nothing). Plans made on it must be
/// destroyed first.
///
/// # Safety
/// `dev` null or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn nvfp4_device_close(dev: *mut Nvfp4Device) {
    // SAFETY: the caller's contract.
    unsafe { destroy(dev) }
}

/// Plans `groups` shapes with C of type `c_type` ([`NVFP4_F16`], [`NVFP4_BF16`]) and NVFP4 tokens
/// into `*out`: [`nvfp4_gemm_plan_create_tokens`] with [`NVFP4_TOKENS_NVFP4`].
///
/// # Safety
/// As [`nvfp4_gemm_plan_create_tokens`].
#[no_mangle]
pub unsafe extern "C" fn nvfp4_gemm_plan_create(
    dev: *const Nvfp4Device,
    shapes: *const RawShape,
    groups: usize,
    c_type: u32,
    out: *mut *mut Nvfp4GemmPlan,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    // SAFETY: the caller's contract.
    unsafe {
        gemm_plan_create("nvfp4_gemm_plan_create", dev, shapes, groups, c_type, NVFP4_TOKENS_NVFP4, out, err, err_len)
    }
}

/// Plans `groups` shapes with C of type `c_type` ([`NVFP4_F16`], [`NVFP4_BF16`]) and the token
/// type `token_type` ([`NVFP4_TOKENS_NVFP4`]; W4A16: [`NVFP4_TOKENS_F16`], [`NVFP4_TOKENS_BF16`])
/// into `*out` (destroy it with [`nvfp4_gemm_plan_destroy`]). Allocates device memory on the
/// device's null stream and waits for it, so the plan may be used on any stream at once.
///
/// # Safety
/// `dev` a live handle; `shapes` valid for `groups` reads; `out` valid for one write; `err` null
/// or valid for `err_len` bytes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn nvfp4_gemm_plan_create_tokens(
    dev: *const Nvfp4Device,
    shapes: *const RawShape,
    groups: usize,
    c_type: u32,
    token_type: u32,
    out: *mut *mut Nvfp4GemmPlan,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    // SAFETY: the caller's contract.
    unsafe {
        gemm_plan_create("nvfp4_gemm_plan_create_tokens", dev, shapes, groups, c_type, token_type, out, err, err_len)
    }
}

/// The two GEMM plan constructors, for the C function `call`.
///
/// # Safety
/// As [`nvfp4_gemm_plan_create_tokens`].
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_plan_create(
    call: &'static str,
    dev: *const Nvfp4Device,
    shapes: *const RawShape,
    groups: usize,
    c_type: u32,
    token_type: u32,
    out: *mut *mut Nvfp4GemmPlan,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let dev = handle(call, dev, "dev")?;
            let shapes: Vec<GroupShape> = c_slice(call, shapes, groups, "shapes")?
                .iter()
                .map(|s| GroupShape::new(s.m as usize, s.n as usize, s.k as usize))
                .collect();
            let output = output_type(call, "c_type", c_type)?;
            let problem = Problem::with_tokens(shapes, output, token_kind(call, token_type)?)?;
            let plan = GemmPlan::new(&dev.gpu, problem)?;
            synchronize(&dev.gpu)?;
            into_handle(call, Nvfp4GemmPlan { ctx: dev.gpu.context().clone(), plan }, out)
        })
    }
}

/// Destroys a GEMM plan (null: nothing). The work enqueued with it must have finished.
///
/// # Safety
/// `plan` null or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn nvfp4_gemm_plan_destroy(plan: *mut Nvfp4GemmPlan) {
    // SAFETY: the caller's contract.
    unsafe { destroy(plan) }
}

/// Runs the plan on `stream` with `groups` argument sets (one per group) and C of type `c_type`
/// ([`GemmPlan::run_views`]). `device_alphas` null: each group's `alpha` from its argument set;
/// else a device buffer of `groups` `f32`s read on the device at each call (the argument sets'
/// alphas are not read; capturable; the values are not checked: NaN gives NaN). A W4A16 plan's
/// `a.values` are its activations, `a.scales` empty.
///
/// # Safety
/// `plan` a live handle; `args` valid for `groups` reads; `device_alphas` null or valid for one
/// read; every buffer device memory of its length in the plan's device's primary context, alive
/// and not otherwise written until the work enqueued now has finished (the validation checks
/// lengths, alignment and overlaps, not that the memory exists); `stream` null or a live stream
/// of that context; `err` null or valid for `err_len` bytes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn nvfp4_gemm_run(
    plan: *mut Nvfp4GemmPlan,
    stream: sys::CUstream,
    args: *const RawGroupArgs,
    groups: usize,
    c_type: u32,
    device_alphas: *const RawBuffer,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    const CALL: &str = "nvfp4_gemm_run";
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let p = handle_mut(CALL, plan, "plan")?;
            let args = c_slice(CALL, args, groups, "args")?;
            let c_type = output_type(CALL, "c_type", c_type)?;
            let tokens = p.plan.problem().tokens();
            let buffers = args
                .iter()
                .map(|g| {
                    Ok(GroupBuffers {
                        a_kind: tokens,
                        a_values: view(g.a.values),
                        a_scales: token_scales(CALL, tokens, g.a.scales)?,
                        b_values: view(g.b.values),
                        b_scales: view(g.b.scales),
                        c: view(g.c),
                        c_type,
                        alpha: g.alpha,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let device_alphas = device_alphas.as_ref().copied().map(view);
            let stream = borrow_stream(&p.ctx, stream);
            p.plan.run_views(&stream, &buffers, device_alphas)
        })
    }
}

/// Runs the plan on `stream` with every group's buffers stacked ([`GemmPlan::run_stacked_views`])
/// and `groups` alphas: from the host (`alphas`, `device_alphas` null) or read on the device
/// (`device_alphas`, a device buffer of `groups` `f32`s; `alphas` is then not read and may be
/// null).
///
/// # Safety
/// As [`nvfp4_gemm_run`]; `args` valid for one read, `alphas` for `groups` reads unless
/// `device_alphas` is given.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn nvfp4_gemm_run_stacked(
    plan: *mut Nvfp4GemmPlan,
    stream: sys::CUstream,
    args: *const RawStackedArgs,
    alphas: *const f32,
    groups: usize,
    c_type: u32,
    device_alphas: *const RawBuffer,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    const CALL: &str = "nvfp4_gemm_run_stacked";
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let p = handle_mut(CALL, plan, "plan")?;
            let args = handle(CALL, args, "args")?;
            let device_alphas = device_alphas.as_ref().copied().map(view);
            let alphas = if device_alphas.is_some() { &[] } else { c_slice(CALL, alphas, groups, "alphas")? };
            let tokens = p.plan.problem().tokens();
            let views = StackedViews {
                a_kind: tokens,
                a_values: view(args.a.values),
                a_scales: token_scales(CALL, tokens, args.a.scales)?,
                b_values: view(args.b.values),
                b_scales: view(args.b.scales),
                c: view(args.c),
                c_type: output_type(CALL, "c_type", c_type)?,
            };
            let stream = borrow_stream(&p.ctx, stream);
            p.plan.run_stacked_views(&stream, &views, alphas, device_alphas)
        })
    }
}

/// Plans a MoE problem with NVFP4 tokens: [`nvfp4_moe_plan_create_tokens`] with
/// [`NVFP4_TOKENS_NVFP4`].
///
/// # Safety
/// As [`nvfp4_moe_plan_create_tokens`].
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn nvfp4_moe_plan_create(
    dev: *const Nvfp4Device,
    groups: u64,
    n: u64,
    k: u64,
    layout: u32,
    bound: u64,
    c_type: u32,
    out: *mut *mut Nvfp4MoePlan,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    let shape = MoeShape { groups, n, k, layout, bound, c_type, token_type: NVFP4_TOKENS_NVFP4 };
    // SAFETY: the caller's contract.
    unsafe { moe_plan_create("nvfp4_moe_plan_create", dev, shape, out, err, err_len) }
}

/// Plans a [`MoeProblem`] (`groups`, `n`, `k`, `layout` ([`NVFP4_CONTIGUOUS`], [`NVFP4_MASKED`])
/// with its `bound`, C of type `c_type`, tokens of type `token_type` ([`NVFP4_TOKENS_NVFP4`];
/// W4A16: [`NVFP4_TOKENS_F16`], [`NVFP4_TOKENS_BF16`])) into `*out`; destroy it with
/// [`nvfp4_moe_plan_destroy`]. Waits for the plan's memory as [`nvfp4_gemm_plan_create_tokens`].
///
/// # Safety
/// `dev` a live handle; `out` valid for one write; `err` null or valid for `err_len` bytes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn nvfp4_moe_plan_create_tokens(
    dev: *const Nvfp4Device,
    groups: u64,
    n: u64,
    k: u64,
    layout: u32,
    bound: u64,
    c_type: u32,
    token_type: u32,
    out: *mut *mut Nvfp4MoePlan,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    let shape = MoeShape { groups, n, k, layout, bound, c_type, token_type };
    // SAFETY: the caller's contract.
    unsafe { moe_plan_create("nvfp4_moe_plan_create_tokens", dev, shape, out, err, err_len) }
}

/// The codes of a MoE problem, as the C constructors take them.
struct MoeShape {
    groups: u64,
    n: u64,
    k: u64,
    layout: u32,
    bound: u64,
    c_type: u32,
    token_type: u32,
}

impl MoeShape {
    /// The problem these codes describe, for the C function `call`.
    fn problem(&self, call: &'static str) -> Result<MoeProblem> {
        let layout = token_layout(call, self.layout, self.bound)?;
        let output = output_type(call, "c_type", self.c_type)?;
        let tokens = token_kind(call, self.token_type)?;
        Ok(MoeProblem::new(self.groups as usize, self.n as usize, self.k as usize, layout, output)?.with_tokens(tokens))
    }
}

/// The two MoE plan constructors, for the C function `call`.
///
/// # Safety
/// As [`nvfp4_moe_plan_create_tokens`].
unsafe fn moe_plan_create(
    call: &'static str,
    dev: *const Nvfp4Device,
    shape: MoeShape,
    out: *mut *mut Nvfp4MoePlan,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let dev = handle(call, dev, "dev")?;
            let plan = MoePlan::new(&dev.gpu, shape.problem(call)?)?;
            synchronize(&dev.gpu)?;
            into_handle(call, Nvfp4MoePlan { ctx: dev.gpu.context().clone(), plan }, out)
        })
    }
}

/// Destroys a MoE plan (null: nothing). The work enqueued with it must have finished.
///
/// # Safety
/// `plan` null or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn nvfp4_moe_plan_destroy(plan: *mut Nvfp4MoePlan) {
    // SAFETY: the caller's contract.
    unsafe { destroy(plan) }
}

/// Runs the MoE plan on `stream` ([`MoePlan::run_views`]) for the sizes in `args.sizes` as they
/// are when the kernels run: `weights` and `alphas` one per group (`groups` of each), C of the
/// plan's output type. A W4A16 plan's `args.a.values` are its activations
/// (`token_rows × k` 16-bit elements), `args.a.scales` empty.
///
/// # Safety
/// As [`nvfp4_gemm_run`]; `args` valid for one read, `weights` and `alphas` for `groups` reads.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn nvfp4_moe_run(
    plan: *mut Nvfp4MoePlan,
    stream: sys::CUstream,
    args: *const RawMoeArgs,
    weights: *const RawOperand,
    alphas: *const f32,
    groups: usize,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    const CALL: &str = "nvfp4_moe_run";
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let p = handle_mut(CALL, plan, "plan")?;
            let args = handle(CALL, args, "args")?;
            let weights = c_slice(CALL, weights, groups, "weights")?;
            let alphas = c_slice(CALL, alphas, groups, "alphas")?;
            let problem = p.plan.problem();
            let a = match problem.tokens() {
                TokenKind::Nvfp4 => MoeTokens::Nvfp4 { values: view(args.a.values), scales: view(args.a.scales) },
                TokenKind::Dense(kind) => {
                    token_scales(CALL, problem.tokens(), args.a.scales)?;
                    MoeTokens::Dense { activations: view(args.a.values), kind }
                }
            };
            let buffers = MoeBuffers {
                sizes: view(args.sizes),
                a,
                weights: weights.iter().map(|w| (view(w.values), view(w.scales))).collect(),
                alphas: alphas.to_vec(),
                c: view(args.c),
                c_type: problem.output(),
                activated: None,
            };
            let stream = borrow_stream(&p.ctx, stream);
            p.plan.run_views(&stream, &buffers)
        })
    }
}

/// The device address of the MoE plan's status word (`u32`, `SizeStatus` bits), e.g. to copy it
/// on a stream; zero it with [`nvfp4_moe_clear_status`]. 0 for a null handle.
///
/// # Safety
/// `plan` null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn nvfp4_moe_status_address(plan: *const Nvfp4MoePlan) -> u64 {
    // SAFETY: the caller's contract.
    let Some(p) = (unsafe { plan.as_ref() }) else { return 0 };
    catch_unwind(AssertUnwindSafe(|| {
        let stream = p.ctx.default_stream();
        let (ptr, _guard) = p.plan.status().device_ptr(&stream);
        ptr
    }))
    .unwrap_or(0)
}

/// Zeroes the MoE plan's status word on `stream` (capturable).
///
/// # Safety
/// As [`nvfp4_gemm_run`].
#[no_mangle]
pub unsafe extern "C" fn nvfp4_moe_clear_status(
    plan: *mut Nvfp4MoePlan,
    stream: sys::CUstream,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    const CALL: &str = "nvfp4_moe_clear_status";
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let p = handle_mut(CALL, plan, "plan")?;
            let stream = borrow_stream(&p.ctx, stream);
            p.plan.clear_status(&stream)
        })
    }
}

/// Quantizes `input` (`rows × k` elements of `input_type`: [`NVFP4_F16`] or [`NVFP4_BF16`]) with
/// `global_scale` into `out` on `stream` ([`Quantizer::quantize_views`]).
///
/// # Safety
/// `dev` a live handle; `out` valid for one read; buffers and `stream` as [`nvfp4_gemm_run`], in
/// the device's primary context; `err` null or valid for `err_len` bytes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn nvfp4_quantize(
    dev: *const Nvfp4Device,
    stream: sys::CUstream,
    input: RawBuffer,
    input_type: u32,
    rows: u64,
    k: u64,
    global_scale: f32,
    out: *const RawOperand,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    const CALL: &str = "nvfp4_quantize";
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let dev = handle(CALL, dev, "dev")?;
            let out = handle(CALL, out, "out")?;
            let bf16 = output_type(CALL, "input_type", input_type)? == OutputType::Bf16;
            let stream = borrow_stream(dev.gpu.context(), stream);
            let (rows, k) = (rows as usize, k as usize);
            let (values, scales) = (view(out.values), view(out.scales));
            dev.quantizer.quantize_views(&stream, view(input), bf16, rows, k, global_scale, values, scales)
        })
    }
}

/// Dequantizes `input` (`rows × k` NVFP4) with `global_scale` into `output` (elements of
/// `output_type`: [`NVFP4_F16`] or [`NVFP4_BF16`]) on `stream` ([`Quantizer::dequantize_views`]).
///
/// # Safety
/// As [`nvfp4_quantize`]; `input` valid for one read.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn nvfp4_dequantize(
    dev: *const Nvfp4Device,
    stream: sys::CUstream,
    input: *const RawOperand,
    rows: u64,
    k: u64,
    global_scale: f32,
    output: RawBuffer,
    output_type: u32,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    const CALL: &str = "nvfp4_dequantize";
    let code = output_type;
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let dev = handle(CALL, dev, "dev")?;
            let input = handle(CALL, input, "input")?;
            let bf16 = self::output_type(CALL, "output_type", code)? == OutputType::Bf16;
            let stream = borrow_stream(dev.gpu.context(), stream);
            let (rows, k) = (rows as usize, k as usize);
            let (values, scales) = (view(input.values), view(input.scales));
            dev.quantizer.dequantize_views(&stream, values, scales, rows, k, global_scale, view(output), bf16)
        })
    }
}

/// Quantizes the token tensor of the MoE plan's problem (`input`, elements of `input_type`:
/// [`NVFP4_F16`] or [`NVFP4_BF16`]) with `global_scale` into `out` in the problem's layout, group
/// sizes read from `sizes` on the device ([`Quantizer::quantize_grouped_views`]).
///
/// # Safety
/// As [`nvfp4_quantize`]; `plan` a live handle.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn nvfp4_quantize_grouped(
    dev: *const Nvfp4Device,
    plan: *const Nvfp4MoePlan,
    stream: sys::CUstream,
    input: RawBuffer,
    input_type: u32,
    sizes: RawBuffer,
    global_scale: f32,
    out: *const RawOperand,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    const CALL: &str = "nvfp4_quantize_grouped";
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let dev = handle(CALL, dev, "dev")?;
            let plan = handle(CALL, plan, "plan")?;
            let out = handle(CALL, out, "out")?;
            let bf16 = output_type(CALL, "input_type", input_type)? == OutputType::Bf16;
            let stream = borrow_stream(dev.gpu.context(), stream);
            let (problem, values, scales) = (plan.plan.problem(), view(out.values), view(out.scales));
            dev.quantizer.quantize_grouped_views(
                &stream,
                view(input),
                bf16,
                problem,
                view(sizes),
                global_scale,
                values,
                scales,
            )
        })
    }
}

/// The W4A16 activation type of a token type code: [`NVFP4_TOKENS_F16`] or [`NVFP4_TOKENS_BF16`]
/// (NVFP4 tokens need no prepack).
fn prepack_activations(call: &'static str, token_type: u32) -> Result<Activations> {
    match token_kind(call, token_type)? {
        TokenKind::Dense(a) => Ok(a),
        TokenKind::Nvfp4 => Err(invalid(
            call,
            "token_type",
            format!(
                "{NVFP4_TOKENS_NVFP4} (NVFP4 tokens) needs no prepack; W4A16 is {NVFP4_TOKENS_F16} (f16) or \
                 {NVFP4_TOKENS_BF16} (bf16)"
            ),
        )),
    }
}

/// Prepacks, on the GPU, a stack of `experts` NVFP4 weight matrices of `rows × k` in device
/// memory (`input`: values `experts · rows · k/2` bytes, each matrix's rows back to back; scales
/// each matrix's 128x4 blocked bytes back to back) for a W4A16 plan of `token_type`
/// ([`NVFP4_TOKENS_F16`] or [`NVFP4_TOKENS_BF16`]) into `out` (the same lengths; not overlapping
/// the inputs) on `stream` ([`Prepacker::prepack_views`]): the bytes [`nvfp4_w4a16_prepack`] makes
/// of each matrix. No host synchronization. [`NVFP4_UNSUPPORTED`] on sm_100a.
///
/// # Safety
/// As [`nvfp4_quantize`]; `input` valid for one read.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn nvfp4_w4a16_prepack_device(
    dev: *const Nvfp4Device,
    stream: sys::CUstream,
    input: *const RawOperand,
    experts: u64,
    rows: u64,
    k: u64,
    token_type: u32,
    out: *const RawOperand,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    const CALL: &str = "nvfp4_w4a16_prepack_device";
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let dev = handle(CALL, dev, "dev")?;
            let input = handle(CALL, input, "input")?;
            let out = handle(CALL, out, "out")?;
            let activations = prepack_activations(CALL, token_type)?;
            let prepacker = Prepacker::new(&dev.gpu)?;
            let stream = borrow_stream(dev.gpu.context(), stream);
            let stack = WeightStack { experts: experts as usize, rows: rows as usize, k: k as usize };
            let views = PrepackViews {
                values: view(input.values),
                scales: view(input.scales),
                out_values: view(out.values),
                out_scales: view(out.scales),
            };
            prepacker.prepack_views(&stream, stack, activations, views)
        })
    }
}

/// Prepacks a `rows × k` NVFP4 weight matrix in host memory for a W4A16 plan of `token_type`
/// ([`NVFP4_TOKENS_F16`] or [`NVFP4_TOKENS_BF16`]; [`crate::w4a16::prepack`], on the CPU): `values`
/// (`rows · k / 2` bytes of packed e2m1) and `scales` (the 128x4 blocked layout's bytes) into
/// `out_values` and `out_scales`, of the same lengths. `k` must be a multiple of 64. The global
/// scale is unchanged by the prepack. The outputs may be the inputs (in place).
///
/// # Safety
/// `values` and `out_values` valid for `values_len` bytes (reads, writes), `scales` and
/// `out_scales` for `scales_len` bytes (null allowed with a length of 0); `err` null or valid for
/// `err_len` bytes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn nvfp4_w4a16_prepack(
    values: *const u8,
    values_len: usize,
    scales: *const u8,
    scales_len: usize,
    rows: u64,
    k: u64,
    token_type: u32,
    out_values: *mut u8,
    out_scales: *mut u8,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    const CALL: &str = "nvfp4_w4a16_prepack";
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let activations = prepack_activations(CALL, token_type)?;
            // Copied out first, so that the outputs may be the inputs.
            let values = c_slice(CALL, values, values_len, "values")?.to_vec();
            let scales = c_slice(CALL, scales, scales_len, "scales")?.to_vec();
            for (field, ptr, len) in [("out_values", out_values, values_len), ("out_scales", out_scales, scales_len)] {
                if ptr.is_null() && len != 0 {
                    return Err(null_error(CALL, field));
                }
            }
            let m = Nvfp4Matrix::new(rows as usize, k as usize, values, scales, 1.0)
                .map_err(|e| invalid(CALL, "values", e.to_string()))?;
            let w = crate::w4a16::prepack(&m, activations)?;
            debug_assert_eq!((w.values.len(), w.scales.len()), (values_len, scales_len));
            for (from, to) in [(&w.values, out_values), (&w.scales, out_scales)] {
                if !from.is_empty() {
                    // SAFETY: the caller's contract: `to` holds as many bytes as the input it
                    // came with, which the prepack keeps.
                    std::ptr::copy_nonoverlapping(from.as_ptr(), to, from.len());
                }
            }
            Ok(())
        })
    }
}

/// Plans the whole expert block ([`ExpertBlock::with_plan`]) of the MoE layer `prefix` (a
/// NUL-terminated UTF-8 string, e.g. `model.layers.3.mlp`) from a checkpoint's `shard_count`
/// safetensors shards as stored (each tensor in exactly one; `convention`
/// [`NVFP4_MODELOPT`] / [`NVFP4_COMPRESSED_TENSORS`], `projections`, `reconcile`; every tensor
/// checked by `nvfp4_format::checkpoint`) with the shape and options of `desc`, into `*out`:
/// weights uploaded on `stream` (and prepacked there for W4A16); returns when they are on the
/// device. Destroy it with [`nvfp4_expert_block_destroy`].
///
/// # Safety
/// `dev` a live handle; `shards` valid for `shard_count` reads, each `data` for `len` bytes;
/// `prefix` a NUL-terminated string; `desc` valid for one read; `out` for one write; `stream` as
/// [`nvfp4_gemm_run`]'s; `err` null or valid for `err_len` bytes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn nvfp4_expert_block_create(
    dev: *const Nvfp4Device,
    stream: sys::CUstream,
    shards: *const RawHostBytes,
    shard_count: usize,
    prefix: *const c_char,
    convention: u32,
    projections: u32,
    reconcile: u32,
    desc: *const RawBlockDesc,
    out: *mut *mut Nvfp4ExpertBlock,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    const CALL: &str = "nvfp4_expert_block_create";
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let dev = handle(CALL, dev, "dev")?;
            let desc = handle(CALL, desc, "desc")?;
            let raw = c_slice(CALL, shards, shard_count, "shards")?;
            let bytes = raw.iter().map(|b| c_slice(CALL, b.data, b.len, "shards")).collect::<Result<Vec<&[u8]>>>()?;
            if prefix.is_null() {
                return Err(null_error(CALL, "prefix"));
            }
            let prefix =
                std::ffi::CStr::from_ptr(prefix).to_str().map_err(|_| invalid(CALL, "prefix", "is not UTF-8"))?;
            let (loaded, shape, options, plan) =
                block_inputs(CALL, &bytes, prefix, convention, projections, reconcile, desc)?;
            let s = borrow_stream(dev.gpu.context(), stream);
            let block = ExpertBlock::with_plan(&dev.gpu, &s, shape, options, &loaded, plan)?;
            into_handle(CALL, Nvfp4ExpertBlock { ctx: dev.gpu.context().clone(), block }, out)
        })
    }
}

/// Destroys an expert block (null: nothing). The work enqueued with it must have finished.
///
/// # Safety
/// `block` null or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn nvfp4_expert_block_destroy(block: *mut Nvfp4ExpertBlock) {
    // SAFETY: the caller's contract.
    unsafe { destroy(block) }
}

/// One step of the block on `stream` ([`ExpertBlock::run_views`]): `x` and `y` `[tokens, H]` of
/// the block's type (16-bit elements), `topk_ids` `[tokens, top_k]` of `ids_type`
/// ([`NVFP4_IDS_I32`], [`NVFP4_IDS_I64`]), `topk_weights` of `weights_type`
/// ([`NVFP4_WEIGHTS_F32`], [`NVFP4_WEIGHTS_BF16`]); lengths in elements. No allocation, no host
/// synchronization: capturable (call it once outside capture first).
///
/// # Safety
/// As [`nvfp4_gemm_run`], for every buffer.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn nvfp4_expert_block_run(
    block: *mut Nvfp4ExpertBlock,
    stream: sys::CUstream,
    x: RawBuffer,
    tokens: u64,
    topk_ids: RawBuffer,
    ids_type: u32,
    topk_weights: RawBuffer,
    weights_type: u32,
    y: RawBuffer,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    const CALL: &str = "nvfp4_expert_block_run";
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let b = handle_mut(CALL, block, "block")?;
            let ids_type = match ids_type {
                NVFP4_IDS_I32 => IdType::I32,
                NVFP4_IDS_I64 => IdType::I64,
                other => return Err(invalid(CALL, "ids_type", format!("{other} is not an id type code"))),
            };
            let weights_type = match weights_type {
                NVFP4_WEIGHTS_F32 => WeightType::F32,
                NVFP4_WEIGHTS_BF16 => WeightType::Bf16,
                other => return Err(invalid(CALL, "weights_type", format!("{other} is not a weight type code"))),
            };
            let views = BlockViews {
                x: view(x),
                bf16: b.block.options().dtype == Dense16::Bf16,
                tokens: tokens as usize,
                ids: view(topk_ids),
                ids_type,
                weights: view(topk_weights),
                weights_type,
                y: view(y),
            };
            let stream = borrow_stream(&b.ctx, stream);
            b.block.run_views(&stream, views)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvfp4_format::{random_matrix, InputDistribution, SplitMix64};
    use std::ffi::CStr;
    use std::ptr::{null, null_mut};

    fn text(b: &[c_char]) -> String {
        // SAFETY: NUL-terminated by the call that wrote it.
        unsafe { CStr::from_ptr(b.as_ptr()) }.to_str().unwrap().to_string()
    }

    #[test]
    fn messages_are_truncated_and_terminated() {
        let mut buf = [b'x' as c_char; 8];
        // SAFETY: an 8-byte buffer.
        let status = unsafe { ffi(buf.as_mut_ptr(), buf.len(), || Err(null_error("call", "args"))) };
        assert_eq!(status, NVFP4_INVALID);
        assert_eq!(text(&buf), "call: `");
        // A multi-byte character is never cut.
        // SAFETY: as above.
        unsafe { write_message(buf.as_mut_ptr(), 3, "aé") };
        assert_eq!(text(&buf), "a");
        // SAFETY: success writes an empty string.
        assert_eq!(unsafe { ffi(buf.as_mut_ptr(), buf.len(), || Ok(())) }, NVFP4_OK);
        assert_eq!(text(&buf), "");
        // SAFETY: null buffer: nothing written.
        assert_eq!(unsafe { ffi(null_mut(), 0, || Ok(())) }, NVFP4_OK);
        // SAFETY: as above.
        assert_eq!(unsafe { ffi(buf.as_mut_ptr(), buf.len(), || panic!("test")) }, NVFP4_PANIC);
    }

    /// A ModelOpt file of `experts` experts (H = 128, I = 64) built in memory: global scales
    /// 0.01·(e+1), input scales 0.1·(e+1).
    fn modelopt_file(experts: usize) -> Vec<u8> {
        use nvfp4_format::checkpoint::safetensors::{serialize, tensor::TensorView, Dtype};
        let (h, i) = (128, 64);
        let mut data: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = vec![];
        for e in 0..experts {
            for (proj, rows, k) in [("w1", i, h), ("w3", i, h), ("w2", h, i)] {
                let base = format!("model.layers.0.mlp.experts.{e}.{proj}");
                let g = (0.01 * (e + 1) as f32).to_le_bytes().to_vec();
                let s = (0.1 * (e + 1) as f32).to_le_bytes().to_vec();
                data.push((format!("{base}.weight"), Dtype::U8, vec![rows, k / 2], vec![0x21; rows * k / 2]));
                data.push((
                    format!("{base}.weight_scale"),
                    Dtype::F8_E4M3,
                    vec![rows, k / 16],
                    vec![0x38; rows * k / 16],
                ));
                data.push((format!("{base}.weight_scale_2"), Dtype::F32, vec![], g));
                data.push((format!("{base}.input_scale"), Dtype::F32, vec![1], s));
            }
        }
        let views: Vec<(String, TensorView<'_>)> =
            data.iter().map(|(n, d, shape, b)| (n.clone(), TensorView::new(*d, shape.clone(), b).unwrap())).collect();
        serialize(views, None).unwrap()
    }

    /// The block's experts, shape, options and plan from the C codes, without a GPU; every bad
    /// code refused naming its argument.
    #[test]
    fn block_inputs_from_codes() {
        let file = modelopt_file(3);
        let shards = [file.as_slice()];
        let desc = RawBlockDesc {
            first_expert: 1,
            experts: 2,
            top_k: 2,
            max_tokens: 32,
            activation: NVFP4_GELU_TANH,
            precision: NVFP4_W4A4,
            dtype: NVFP4_F16,
            flags: NVFP4_BLOCK_WEIGHT_AT_INPUT | NVFP4_BLOCK_ACTIVATION_EPILOGUE,
        };
        let inputs = |desc: &RawBlockDesc, convention, projections, reconcile| {
            block_inputs("test", &shards, "model.layers.0.mlp", convention, projections, reconcile, desc)
        };
        let (loaded, shape, options, plan) =
            inputs(&desc, NVFP4_MODELOPT, NVFP4_PROJECTIONS_W1_W3_W2, NVFP4_RECONCILE_REFUSE).unwrap();
        assert_eq!((loaded.first_expert, loaded.experts.len()), (1, 2));
        assert_eq!(loaded.w13_input_scales(), vec![0.2, 0.3]);
        assert_eq!(
            shape,
            BlockShape { first_expert: 1, experts: 2, hidden: 128, intermediate: 64, top_k: 2, max_tokens: 32 }
        );
        assert_eq!(
            options,
            BlockOptions::new(Activation::GeluTanh, Precision::W4a4, Dense16::F16)
                .with_router_weight_at(RouterWeightAt::Input)
        );
        assert_eq!(plan.activation, ActivationPlacement::FirstGemmEpilogue);
        let field = |r: Result<(LoadedExperts, BlockShape, BlockOptions, BlockPlan)>| match r.err().unwrap() {
            Error::InvalidArgument { field, .. } => field,
            other => panic!("{other:?}"),
        };
        let (m, p, r) = (NVFP4_MODELOPT, NVFP4_PROJECTIONS_W1_W3_W2, NVFP4_RECONCILE_REFUSE);
        assert_eq!(field(inputs(&desc, 7, p, r)), "convention");
        assert_eq!(field(inputs(&desc, m, 7, r)), "projections");
        assert_eq!(field(inputs(&desc, m, p, 7)), "reconcile");
        assert_eq!(field(inputs(&RawBlockDesc { activation: 9, ..desc }, m, p, r)), "desc.activation");
        assert_eq!(field(inputs(&RawBlockDesc { precision: 9, ..desc }, m, p, r)), "desc.precision");
        assert_eq!(field(inputs(&RawBlockDesc { dtype: 9, ..desc }, m, p, r)), "desc.dtype");
        assert_eq!(field(inputs(&RawBlockDesc { flags: 4, ..desc }, m, p, r)), "desc.flags");
        assert_eq!(field(inputs(&RawBlockDesc { experts: 0, ..desc }, m, p, r)), "desc.experts");
        // The checkpoint's own errors name the tensor: expert 3 is not in the file; the other
        // convention's names are missing.
        let missing = inputs(&RawBlockDesc { experts: 3, ..desc }, m, p, r).err().unwrap().to_string();
        assert!(missing.contains("experts.3"), "{missing}");
        let other = inputs(&desc, NVFP4_COMPRESSED_TENSORS, p, r).err().unwrap().to_string();
        assert!(other.contains("weight_packed"), "{other}");
    }

    #[test]
    fn errors_map_to_statuses() {
        let wrong = Error::WrongType { call: "c", group: None, field: "a", reason: "f32".into() };
        assert_eq!(status_of(&wrong), NVFP4_INVALID);
        assert_eq!(status_of(&Error::Capture("x".into())), NVFP4_CAPTURE);
        assert_eq!(status_of(&Error::Unsupported("W4A16 on sm_100a".into())), NVFP4_UNSUPPORTED);
        assert_eq!(status_of(&Error::NoDriver), NVFP4_NO_DRIVER);
        assert_eq!(status_of(&Error::InvalidProblem("x".into())), NVFP4_INVALID);
    }

    #[test]
    fn codes_are_decoded_or_refused() {
        assert_eq!(output_type("f", "c_type", NVFP4_BF16).unwrap(), OutputType::Bf16);
        assert_eq!(output_type("f", "c_type", 2).unwrap_err().to_string(), "f: `c_type`: 2 is not 0 (f16) or 1 (bf16)");
        assert_eq!(token_kind("f", NVFP4_TOKENS_NVFP4).unwrap(), TokenKind::Nvfp4);
        assert_eq!(token_kind("f", NVFP4_TOKENS_F16).unwrap(), TokenKind::Dense(Activations::F16));
        assert_eq!(token_kind("f", NVFP4_TOKENS_BF16).unwrap(), TokenKind::Dense(Activations::Bf16));
        let e = token_kind("f", 3).unwrap_err();
        assert_eq!(
            (status_of(&e), e.to_string().starts_with("f: `token_type`: 3 is not 0 (NVFP4)")),
            (NVFP4_INVALID, true)
        );
        assert!(token_layout("f", 7, 1).is_err());
        assert_eq!(token_layout("f", NVFP4_MASKED, 9).unwrap(), TokenLayout::Masked { max_rows: 9 });
        assert_eq!(token_layout("f", NVFP4_CONTIGUOUS, 9).unwrap(), TokenLayout::Contiguous { max_tokens: 9 });
        // A W4A16 plan's token scales must be empty; NVFP4 tokens' are taken as given.
        let s = RawBuffer { ptr: 0x1000, len: 512 };
        assert_eq!(token_scales("f", TokenKind::Nvfp4, s).unwrap(), BufferView { ptr: 0x1000, len: 512 });
        let dense = TokenKind::Dense(Activations::Bf16);
        assert_eq!(token_scales("f", dense, RawBuffer { ptr: 0x1000, len: 0 }).unwrap(), BufferView { ptr: 0, len: 0 });
        assert!(token_scales("f", dense, s).unwrap_err().to_string().contains("`a.scales`: has 512 elements"));
        // The MoE codes, checked before any device is needed.
        let shape =
            |layout, c_type, token_type| MoeShape { groups: 4, n: 128, k: 256, layout, bound: 64, c_type, token_type };
        let p = shape(NVFP4_MASKED, NVFP4_BF16, NVFP4_TOKENS_F16).problem("f").unwrap();
        assert_eq!(
            (p.tokens(), p.output(), p.layout()),
            (TokenKind::Dense(Activations::F16), OutputType::Bf16, TokenLayout::Masked { max_rows: 64 })
        );
        assert!(shape(2, NVFP4_F16, NVFP4_TOKENS_NVFP4).problem("f").is_err());
        assert!(shape(NVFP4_MASKED, 2, NVFP4_TOKENS_NVFP4).problem("f").is_err());
        assert!(shape(NVFP4_MASKED, NVFP4_F16, 3).problem("f").is_err());
    }

    #[test]
    fn null_handles_are_errors() {
        let mut buf = [0 as c_char; 128];
        let err = buf.as_mut_ptr();
        // SAFETY (every call below): null handles are checked before any use; `buf` holds 128 bytes.
        let s = unsafe { nvfp4_gemm_run(null_mut(), null_mut(), null(), 0, 0, null(), err, 128) };
        assert_eq!((s, text(&buf).as_str()), (NVFP4_INVALID, "nvfp4_gemm_run: `plan`: is a null pointer"));
        let s = unsafe { nvfp4_gemm_run_stacked(null_mut(), null_mut(), null(), null(), 0, 0, null(), err, 128) };
        assert_eq!((s, text(&buf).as_str()), (NVFP4_INVALID, "nvfp4_gemm_run_stacked: `plan`: is a null pointer"));
        let s = unsafe { nvfp4_gemm_plan_create(null(), null(), 0, 0, null_mut(), err, 128) };
        assert_eq!((s, text(&buf).as_str()), (NVFP4_INVALID, "nvfp4_gemm_plan_create: `dev`: is a null pointer"));
        let s = unsafe { nvfp4_gemm_plan_create_tokens(null(), null(), 0, 0, NVFP4_TOKENS_BF16, null_mut(), err, 128) };
        assert_eq!(
            (s, text(&buf).as_str()),
            (NVFP4_INVALID, "nvfp4_gemm_plan_create_tokens: `dev`: is a null pointer")
        );
        let s = unsafe { nvfp4_moe_plan_create(null(), 4, 128, 256, NVFP4_MASKED, 64, 0, null_mut(), err, 128) };
        assert_eq!((s, text(&buf).as_str()), (NVFP4_INVALID, "nvfp4_moe_plan_create: `dev`: is a null pointer"));
        let s = unsafe {
            nvfp4_moe_plan_create_tokens(
                null(),
                4,
                128,
                256,
                NVFP4_MASKED,
                64,
                0,
                NVFP4_TOKENS_F16,
                null_mut(),
                err,
                128,
            )
        };
        assert_eq!((s, text(&buf).as_str()), (NVFP4_INVALID, "nvfp4_moe_plan_create_tokens: `dev`: is a null pointer"));
        let s = unsafe { nvfp4_moe_run(null_mut(), null_mut(), null(), null(), null(), 0, err, 128) };
        assert_eq!((s, text(&buf).as_str()), (NVFP4_INVALID, "nvfp4_moe_run: `plan`: is a null pointer"));
        let s = unsafe { nvfp4_moe_clear_status(null_mut(), null_mut(), err, 128) };
        assert_eq!((s, text(&buf).as_str()), (NVFP4_INVALID, "nvfp4_moe_clear_status: `plan`: is a null pointer"));
        let none = RawBuffer::default();
        let s = unsafe { nvfp4_quantize(null(), null_mut(), none, 0, 0, 0, 1.0, null(), err, 128) };
        assert_eq!((s, text(&buf).as_str()), (NVFP4_INVALID, "nvfp4_quantize: `dev`: is a null pointer"));
        let s = unsafe { nvfp4_dequantize(null(), null_mut(), null(), 0, 0, 1.0, none, 0, err, 128) };
        assert_eq!((s, text(&buf).as_str()), (NVFP4_INVALID, "nvfp4_dequantize: `dev`: is a null pointer"));
        let s = unsafe { nvfp4_quantize_grouped(null(), null(), null_mut(), none, 0, none, 1.0, null(), err, 128) };
        assert_eq!((s, text(&buf).as_str()), (NVFP4_INVALID, "nvfp4_quantize_grouped: `dev`: is a null pointer"));
        let s = unsafe {
            nvfp4_w4a16_prepack_device(null(), null_mut(), null(), 1, 8, 64, NVFP4_TOKENS_F16, null(), err, 128)
        };
        assert_eq!((s, text(&buf).as_str()), (NVFP4_INVALID, "nvfp4_w4a16_prepack_device: `dev`: is a null pointer"));
        // SAFETY: destroying null handles does nothing.
        unsafe {
            nvfp4_gemm_plan_destroy(null_mut());
            nvfp4_moe_plan_destroy(null_mut());
            nvfp4_device_close(null_mut());
            assert_eq!(nvfp4_moe_status_address(null()), 0);
        }
    }

    /// The C prepack is [`crate::w4a16::prepack`] of the matrix its bytes make, in place or not;
    /// wrong token types, lengths and null pointers are refused with nothing written.
    #[test]
    fn w4a16_prepack_is_the_library_prepack() {
        let mut rng = SplitMix64::new(0xC0A1);
        let (rows, k) = (130, 192);
        let m = random_matrix(rows, k, InputDistribution::FullRange, &mut rng).unwrap();
        let (values, scales) = (m.values().to_vec(), m.scales().to_vec());
        let mut buf = [0 as c_char; 256];
        let err = buf.as_mut_ptr();
        for (code, act) in [(NVFP4_TOKENS_F16, Activations::F16), (NVFP4_TOKENS_BF16, Activations::Bf16)] {
            let want = crate::w4a16::prepack(&m, act).unwrap();
            let (mut v, mut s) = (vec![0u8; values.len()], vec![0u8; scales.len()]);
            // SAFETY: every buffer as long as its length.
            let status = unsafe {
                nvfp4_w4a16_prepack(
                    values.as_ptr(),
                    values.len(),
                    scales.as_ptr(),
                    scales.len(),
                    rows as u64,
                    k as u64,
                    code,
                    v.as_mut_ptr(),
                    s.as_mut_ptr(),
                    err,
                    256,
                )
            };
            assert_eq!((status, text(&buf).as_str()), (NVFP4_OK, ""));
            assert_eq!((&v, &s), (&want.values, &want.scales), "{act:?}");
            // In place.
            let (mut v, mut s) = (values.clone(), scales.clone());
            let (vp, sp) = (v.as_mut_ptr(), s.as_mut_ptr());
            // SAFETY: as above; the outputs are the inputs.
            let status =
                unsafe { nvfp4_w4a16_prepack(vp, v.len(), sp, s.len(), rows as u64, k as u64, code, vp, sp, err, 256) };
            assert_eq!(status, NVFP4_OK);
            assert_eq!((&v, &s), (&want.values, &want.scales), "{act:?} in place");
        }
        let mut out = (vec![7u8; values.len()], vec![7u8; scales.len()]);
        let mut call = |values_len: usize, scales_len: usize, rows: u64, k: u64, code: u32, out_values: *mut u8| {
            // SAFETY: every pointer valid for its length or null.
            let s = unsafe {
                nvfp4_w4a16_prepack(
                    values.as_ptr(),
                    values_len,
                    scales.as_ptr(),
                    scales_len,
                    rows,
                    k,
                    code,
                    out_values,
                    out.1.as_mut_ptr(),
                    err,
                    256,
                )
            };
            (s, text(&buf))
        };
        let ov = out.0.as_mut_ptr();
        let (vl, sl, r, kk) = (values.len(), scales.len(), rows as u64, k as u64);
        let (s, msg) = call(vl, sl, r, kk, NVFP4_TOKENS_NVFP4, ov);
        assert_eq!(s, NVFP4_INVALID);
        assert!(msg.starts_with("nvfp4_w4a16_prepack: `token_type`: 0 (NVFP4 tokens) needs no prepack"), "{msg}");
        assert_eq!(call(vl, sl, r, kk, 9, ov).0, NVFP4_INVALID);
        let (s, msg) = call(vl - 16, sl, r, kk, NVFP4_TOKENS_F16, ov);
        assert!(s == NVFP4_INVALID && msg.contains("packed values"), "{msg}");
        assert_eq!(call(vl, sl, r + 1, kk, NVFP4_TOKENS_F16, ov).0, NVFP4_INVALID);
        // K a multiple of 16 but not of 64: a matrix, but not a W4A16 operand.
        let (s, msg) = call(rows * 16 / 2, 256 * 4, r, 16, NVFP4_TOKENS_F16, ov);
        assert!(s == NVFP4_INVALID && msg.contains("not a multiple of 64"), "{msg}");
        let (s, msg) = call(vl, sl, r, kk, NVFP4_TOKENS_F16, null_mut());
        assert_eq!((s, msg.as_str()), (NVFP4_INVALID, "nvfp4_w4a16_prepack: `out_values`: is a null pointer"));
        // SAFETY: a null input with a nonzero length is refused before any read.
        let s = unsafe { nvfp4_w4a16_prepack(null(), 8, null(), 0, 1, 16, NVFP4_TOKENS_F16, ov, null_mut(), err, 256) };
        assert_eq!((s, text(&buf).as_str()), (NVFP4_INVALID, "nvfp4_w4a16_prepack: `values`: is a null pointer"));
        assert!(out.0.iter().chain(&out.1).all(|&b| b == 7), "a refused prepack wrote its outputs");
    }

    /// Without a CUDA driver, opening a device is a typed error; with one, it opens.
    #[test]
    fn device_open_reports_a_missing_driver() {
        let mut buf = [0 as c_char; 128];
        let mut dev: *mut Nvfp4Device = null_mut();
        // SAFETY: valid out-pointers.
        let s = unsafe { nvfp4_device_open(0, &mut dev, buf.as_mut_ptr(), 128) };
        if crate::driver_present() {
            // With a driver: it opens (or names the unsupported device).
            assert!(s == NVFP4_OK || s == NVFP4_UNSUPPORTED, "status {s}");
            assert_eq!(dev.is_null(), s != NVFP4_OK);
            // SAFETY: a handle from `nvfp4_device_open`, or null.
            return unsafe { nvfp4_device_close(dev) };
        }
        assert_eq!(s, NVFP4_NO_DRIVER);
        assert!(dev.is_null());
        assert!(text(&buf).starts_with("no CUDA driver"));
        // SAFETY: as above.
        let s = unsafe { nvfp4_device_open(-1, &mut dev, buf.as_mut_ptr(), 128) };
        assert_eq!((s, text(&buf).as_str()), (NVFP4_INVALID, "nvfp4_device_open: `ordinal`: -1 is negative"));
        // SAFETY: a null out-pointer is refused (after the driver check, which fails first here).
        assert_eq!(unsafe { nvfp4_device_open(0, null_mut(), null_mut(), 0) }, NVFP4_NO_DRIVER);
    }
}
