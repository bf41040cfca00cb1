//! The raw entry: the library's calls on memory it does not own — device addresses with lengths
//! and a stream borrowed from the caller (`CUstream`) — for bindings (the Python package in
//! `python/`) and C (`host/include/nvfp4_gemm.h`).
//!
//! Nothing here has checks of its own: every call builds the same argument structs as a Rust
//! caller would ([`GroupArgs`], [`StackedArgs`], [`MoeArgs`], the [`Quantizer`] calls) over
//! [`RawSlice`]s and goes through the same validation (lengths, alignment, overlaps, output type,
//! finite host alphas) before anything is launched. What no validation can check is that an address
//! really is device memory of that length: that is the `unsafe` part, each function's
//! `# Safety`.
//!
//! Streams: the caller's stream is borrowed with [`borrow_stream`] (never destroyed by this
//! library). Work is enqueued on it in stream order; nothing synchronizes the host. Plans own
//! device memory (tables, workspace) that every call on any stream uses: calls on different
//! streams must be ordered by the caller, as for any memory shared between streams.
//!
//! The C functions (`nvfp4_*`, `extern "C"`) return a status code ([`STATUS_OK`] …) and write
//! the error's text, NUL-terminated and truncated to the buffer, into `err`/`err_len` (may be
//! null/0). They never unwind into C: a panic becomes [`STATUS_PANIC`].

use crate::device::Gpu;
use crate::error::{Error, Result};
use crate::moe::{MoeArgs, MoePlan, MoeProblem, TokenLayout};
use crate::plan::{GemmPlan, GroupArgs, Nvfp4Operand, Output, StackedArgs};
use crate::problem::{GroupShape, OutputType, Problem};
use crate::quantize::{DenseFloat, Nvfp4OperandMut, Quantizer};
use crate::w4a16::{Activations, W4a16Args, W4a16MoeArgs, W4a16MoePlan, W4a16Plan};
use cudarc::driver::{sys, CudaContext, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};
use half::{bf16, f16};
use std::marker::PhantomData;
use std::sync::Arc;

/// A device buffer given by address and length (in elements of the buffer's type: bytes for
/// NVFP4 values and scales, 16-bit elements for f16/bf16 tensors, `u32`s for MoE sizes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawBuffer {
    /// Device address (`CUdeviceptr`).
    pub ptr: u64,
    /// Length in elements.
    pub len: u64,
}

/// An NVFP4 operand: packed e2m1 values and e4m3 scales in the 128x4 blocked layout (bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawOperand {
    /// Packed values.
    pub values: RawBuffer,
    /// Blocked scales.
    pub scales: RawBuffer,
}

/// One group of [`gemm_run`]: as [`GroupArgs`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RawGroupArgs {
    /// A (`m × k`).
    pub a: RawOperand,
    /// B (`n × k`).
    pub b: RawOperand,
    /// C (`m × n` 16-bit elements of the call's output type).
    pub c: RawBuffer,
    /// The group's alpha.
    pub alpha: f32,
}

/// C's element type in the raw calls: IEEE half.
pub const OUTPUT_F16: u32 = 0;
/// C's element type in the raw calls: bfloat16.
pub const OUTPUT_BF16: u32 = 1;

/// The [`OutputType`] of a raw type code ([`OUTPUT_F16`], [`OUTPUT_BF16`]).
pub fn output_type(code: u32) -> Result<OutputType> {
    match code {
        OUTPUT_F16 => Ok(OutputType::F16),
        OUTPUT_BF16 => Ok(OutputType::Bf16),
        other => Err(Error::InvalidArgument {
            call: "raw",
            field: "c_type",
            reason: format!("{other} is not 0 (f16) or 1 (bf16)"),
        }),
    }
}

/// A borrowed device buffer as cudarc's [`DevicePtr`]/[`DevicePtrMut`], for the library's calls.
/// Its guards do nothing: ordering is the caller's (stream order).
pub struct RawSlice<'s, T> {
    ptr: u64,
    len: usize,
    stream: &'s Arc<CudaStream>,
    _t: PhantomData<T>,
}

impl<'s, T> RawSlice<'s, T> {
    /// The buffer `b` on `stream`.
    ///
    /// # Safety
    /// `b.ptr` must be device memory of at least `b.len` elements of `T` in `stream`'s context
    /// (or `b.len = 0`), alive and not otherwise accessed in ways that conflict with the call
    /// until the work enqueued with it has finished.
    pub unsafe fn new(b: RawBuffer, stream: &'s Arc<CudaStream>) -> RawSlice<'s, T> {
        RawSlice { ptr: b.ptr, len: b.len as usize, stream, _t: PhantomData }
    }
}

impl<T> DeviceSlice<T> for RawSlice<'_, T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
}

impl<T> DevicePtr<T> for RawSlice<'_, T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        // `Record(None)` records nothing when dropped: the caller orders its streams.
        (self.ptr, SyncOnDrop::Record(None))
    }
}

impl<T> DevicePtrMut<T> for RawSlice<'_, T> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}

/// The caller's stream `cu_stream` (null: the legacy default stream) in `ctx`, as cudarc's
/// stream type. Dropping it neither destroys nor synchronizes the stream.
///
/// # Safety
/// `cu_stream` must be a stream of `ctx` (or null) and stay alive while the returned value or
/// anything enqueued through it is in use.
pub unsafe fn borrow_stream(ctx: &Arc<CudaContext>, cu_stream: sys::CUstream) -> Arc<CudaStream> {
    // SAFETY: the caller's contract.
    unsafe { ctx.wrap_borrowed_stream(cu_stream) }
}

/// True when `stream` is being captured into a CUDA graph.
pub fn is_capturing(stream: &CudaStream) -> Result<bool> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: an out-pointer to a local; a live stream.
    unsafe { sys::cuStreamIsCapturing(stream.cu_stream(), &mut status) }
        .result()
        .map_err(|e| Error::driver("querying the stream's capture status", e))?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Every group's buffers stacked, for [`gemm_run_stacked`]: as [`StackedArgs`] without the alphas.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawStackedArgs {
    /// Every group's A, back to back ([`Problem::stacked_offsets`]).
    pub a: RawOperand,
    /// Every group's B.
    pub b: RawOperand,
    /// Every group's C (16-bit elements).
    pub c: RawBuffer,
}

/// The buffers of one [`moe_run`] besides the weights: as [`MoeArgs`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawMoeArgs {
    /// `offsets[G + 1]` or `counts[G]`, `u32` (an `int32` tensor has the same bits).
    pub sizes: RawBuffer,
    /// The token tensor A in the problem's layout.
    pub a: RawOperand,
    /// C (16-bit elements).
    pub c: RawBuffer,
}

/// A borrowed NVFP4 operand.
struct OperandSlices<'s> {
    values: RawSlice<'s, u8>,
    scales: RawSlice<'s, u8>,
}

impl<'s> OperandSlices<'s> {
    /// # Safety
    /// As [`RawSlice::new`] for both buffers.
    unsafe fn new(op: &RawOperand, stream: &'s Arc<CudaStream>) -> OperandSlices<'s> {
        // SAFETY: the caller's contract.
        unsafe { OperandSlices { values: RawSlice::new(op.values, stream), scales: RawSlice::new(op.scales, stream) } }
    }

    fn operand(&self) -> Nvfp4Operand<'_> {
        Nvfp4Operand { values: &self.values, scales: &self.scales }
    }

    fn operand_mut(&mut self) -> Nvfp4OperandMut<'_> {
        Nvfp4OperandMut { values: &mut self.values, scales: &mut self.scales }
    }
}

/// A borrowed 16-bit float buffer of a given type.
enum DenseSlice<'s> {
    F16(RawSlice<'s, f16>),
    Bf16(RawSlice<'s, bf16>),
}

impl<'s> DenseSlice<'s> {
    /// # Safety
    /// As [`RawSlice::new`].
    unsafe fn new(b: RawBuffer, t: OutputType, stream: &'s Arc<CudaStream>) -> DenseSlice<'s> {
        // SAFETY: the caller's contract.
        unsafe {
            match t {
                OutputType::F16 => DenseSlice::F16(RawSlice::new(b, stream)),
                OutputType::Bf16 => DenseSlice::Bf16(RawSlice::new(b, stream)),
            }
        }
    }

    fn output(&mut self) -> Output<'_> {
        match self {
            DenseSlice::F16(c) => Output::F16(c),
            DenseSlice::Bf16(c) => Output::Bf16(c),
        }
    }
}

/// [`GemmPlan::run`] on raw buffers: one [`RawGroupArgs`] per group, C of type `c_type`; with
/// `device_alphas` (`G` `f32`s on the device), [`GemmPlan::run_with_device_alphas`] (each
/// [`RawGroupArgs::alpha`] is then not read).
///
/// # Safety
/// Every buffer as [`RawSlice::new`] on `stream` (the validation checks lengths, alignment and
/// overlaps against the plan's problem, not that the memory exists).
pub unsafe fn gemm_run(
    plan: &mut GemmPlan,
    stream: &Arc<CudaStream>,
    groups: &[RawGroupArgs],
    c_type: OutputType,
    device_alphas: Option<RawBuffer>,
) -> Result<()> {
    // SAFETY: the caller's contract, buffer by buffer.
    let mut slices: Vec<(OperandSlices, OperandSlices, DenseSlice)> = groups
        .iter()
        .map(|g| unsafe {
            (OperandSlices::new(&g.a, stream), OperandSlices::new(&g.b, stream), DenseSlice::new(g.c, c_type, stream))
        })
        .collect();
    let mut args: Vec<GroupArgs> = slices
        .iter_mut()
        .zip(groups)
        .map(|((a, b, c), g)| GroupArgs { a: a.operand(), b: b.operand(), c: c.output(), alpha: g.alpha })
        .collect();
    match device_alphas {
        // SAFETY: the caller's contract.
        Some(alphas) => {
            plan.run_with_device_alphas(stream, &mut args, &unsafe { RawSlice::<f32>::new(alphas, stream) })
        }
        None => plan.run(stream, &mut args),
    }
}

/// [`GemmPlan::run_stacked`] on raw buffers; with `device_alphas` (`G` `f32`s on the device),
/// [`GemmPlan::run_stacked_with_device_alphas`] (`alphas` is then not read).
///
/// # Safety
/// As [`gemm_run`].
pub unsafe fn gemm_run_stacked(
    plan: &mut GemmPlan,
    stream: &Arc<CudaStream>,
    args: &RawStackedArgs,
    alphas: &[f32],
    c_type: OutputType,
    device_alphas: Option<RawBuffer>,
) -> Result<()> {
    // SAFETY: the caller's contract.
    let (a, b, mut c) = unsafe {
        (
            OperandSlices::new(&args.a, stream),
            OperandSlices::new(&args.b, stream),
            DenseSlice::new(args.c, c_type, stream),
        )
    };
    let mut stacked = StackedArgs { a: a.operand(), b: b.operand(), c: c.output(), alphas };
    match device_alphas {
        Some(d) => {
            // SAFETY: the caller's contract.
            let d = unsafe { RawSlice::<f32>::new(d, stream) };
            plan.run_stacked_with_device_alphas(stream, &mut stacked, &d)
        }
        None => plan.run_stacked(stream, &mut stacked),
    }
}

/// [`MoePlan::run`] on raw buffers: `weights` and `alphas` one per group.
///
/// # Safety
/// As [`gemm_run`].
pub unsafe fn moe_run(
    plan: &mut MoePlan,
    stream: &Arc<CudaStream>,
    args: &RawMoeArgs,
    weights: &[RawOperand],
    alphas: &[f32],
    c_type: OutputType,
) -> Result<()> {
    // SAFETY: the caller's contract.
    let (sizes, a, mut c, w) = unsafe {
        (
            RawSlice::<u32>::new(args.sizes, stream),
            OperandSlices::new(&args.a, stream),
            DenseSlice::new(args.c, c_type, stream),
            weights.iter().map(|w| OperandSlices::new(w, stream)).collect::<Vec<_>>(),
        )
    };
    let weights: Vec<Nvfp4Operand> = w.iter().map(OperandSlices::operand).collect();
    let mut moe = MoeArgs { sizes: &sizes, a: a.operand(), weights: &weights, alphas, c: c.output() };
    plan.run(stream, &mut moe)
}

/// One group of [`w4a16_run`]: as [`W4a16Args`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RawW4a16Args {
    /// The activations (`m × k` 16-bit elements of the plan's activation type).
    pub activations: RawBuffer,
    /// The weights, prepacked for the plan's activations (`n × k`).
    pub b: RawOperand,
    /// C (`m × n` 16-bit elements of the call's output type).
    pub c: RawBuffer,
    /// The group's alpha.
    pub alpha: f32,
}

/// [`W4a16Plan::run`] on raw buffers: one [`RawW4a16Args`] per group, activations of the plan's
/// type, C of type `c_type`.
///
/// # Safety
/// As [`gemm_run`].
pub unsafe fn w4a16_run(
    plan: &mut W4a16Plan,
    stream: &Arc<CudaStream>,
    groups: &[RawW4a16Args],
    c_type: OutputType,
) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe {
        match plan.activations() {
            Activations::F16 => w4a16_run_as::<f16>(plan, stream, groups, c_type),
            Activations::Bf16 => w4a16_run_as::<bf16>(plan, stream, groups, c_type),
        }
    }
}

/// [`w4a16_run`] with activations of type `T`.
///
/// # Safety
/// As [`gemm_run`].
unsafe fn w4a16_run_as<T: DenseFloat>(
    plan: &mut W4a16Plan,
    stream: &Arc<CudaStream>,
    groups: &[RawW4a16Args],
    c_type: OutputType,
) -> Result<()> {
    // SAFETY: the caller's contract, buffer by buffer.
    let mut slices: Vec<(RawSlice<T>, OperandSlices, DenseSlice)> = groups
        .iter()
        .map(|g| unsafe {
            (
                RawSlice::new(g.activations, stream),
                OperandSlices::new(&g.b, stream),
                DenseSlice::new(g.c, c_type, stream),
            )
        })
        .collect();
    let mut args: Vec<W4a16Args<T>> = slices
        .iter_mut()
        .zip(groups)
        .map(|((x, b, c), g)| W4a16Args { activations: x, weights: b.operand(), c: c.output(), alpha: g.alpha })
        .collect();
    plan.run(stream, &mut args)
}

/// [`W4a16MoePlan::run`] on raw buffers: `activations` (`token_rows × k` 16-bit elements of the
/// plan's activation type), `weights` (prepacked for them) and `alphas` one per group.
///
/// # Safety
/// As [`gemm_run`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn w4a16_moe_run(
    plan: &mut W4a16MoePlan,
    stream: &Arc<CudaStream>,
    sizes: RawBuffer,
    activations: RawBuffer,
    weights: &[RawOperand],
    alphas: &[f32],
    c: RawBuffer,
    c_type: OutputType,
) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe {
        match plan.activations() {
            Activations::F16 => w4a16_moe_run_as::<f16>(plan, stream, sizes, activations, weights, alphas, c, c_type),
            Activations::Bf16 => w4a16_moe_run_as::<bf16>(plan, stream, sizes, activations, weights, alphas, c, c_type),
        }
    }
}

/// [`w4a16_moe_run`] with activations of type `T`.
///
/// # Safety
/// As [`gemm_run`].
#[allow(clippy::too_many_arguments)]
unsafe fn w4a16_moe_run_as<T: DenseFloat>(
    plan: &mut W4a16MoePlan,
    stream: &Arc<CudaStream>,
    sizes: RawBuffer,
    activations: RawBuffer,
    weights: &[RawOperand],
    alphas: &[f32],
    c: RawBuffer,
    c_type: OutputType,
) -> Result<()> {
    // SAFETY: the caller's contract.
    let (sizes, x, mut c, w) = unsafe {
        (
            RawSlice::<u32>::new(sizes, stream),
            RawSlice::<T>::new(activations, stream),
            DenseSlice::new(c, c_type, stream),
            weights.iter().map(|w| OperandSlices::new(w, stream)).collect::<Vec<_>>(),
        )
    };
    let weights: Vec<Nvfp4Operand> = w.iter().map(OperandSlices::operand).collect();
    let mut args = W4a16MoeArgs { sizes: &sizes, activations: &x, weights: &weights, alphas, c: c.output() };
    plan.run(stream, &mut args)
}

/// [`Quantizer::quantize`] on raw buffers: `input` (`rows × k` elements of `input_type`) into
/// `out`.
///
/// # Safety
/// As [`gemm_run`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn quantize(
    q: &Quantizer,
    stream: &Arc<CudaStream>,
    input: RawBuffer,
    input_type: OutputType,
    rows: usize,
    k: usize,
    global_scale: f32,
    out: &RawOperand,
) -> Result<()> {
    // SAFETY: the caller's contract.
    let (x, mut o) = unsafe { (DenseSlice::new(input, input_type, stream), OperandSlices::new(out, stream)) };
    match &x {
        DenseSlice::F16(x) => q.quantize(stream, x, rows, k, global_scale, o.operand_mut()),
        DenseSlice::Bf16(x) => q.quantize(stream, x, rows, k, global_scale, o.operand_mut()),
    }
}

/// [`Quantizer::dequantize`] on raw buffers: `input` (`rows × k` NVFP4) into `output`
/// (`rows × k` elements of `output_type`).
///
/// # Safety
/// As [`gemm_run`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn dequantize(
    q: &Quantizer,
    stream: &Arc<CudaStream>,
    input: &RawOperand,
    rows: usize,
    k: usize,
    global_scale: f32,
    output: RawBuffer,
    output_type: OutputType,
) -> Result<()> {
    // SAFETY: the caller's contract.
    let (x, mut y) = unsafe { (OperandSlices::new(input, stream), DenseSlice::new(output, output_type, stream)) };
    match &mut y {
        DenseSlice::F16(y) => q.dequantize(stream, x.operand(), rows, k, global_scale, y),
        DenseSlice::Bf16(y) => q.dequantize(stream, x.operand(), rows, k, global_scale, y),
    }
}

/// [`Quantizer::quantize_grouped`] on raw buffers: the token tensor of `problem` (`input`,
/// elements of `input_type`) into `out` in the problem's layout, group sizes from `sizes`.
///
/// # Safety
/// As [`gemm_run`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn quantize_grouped(
    q: &Quantizer,
    stream: &Arc<CudaStream>,
    input: RawBuffer,
    input_type: OutputType,
    problem: &MoeProblem,
    sizes: RawBuffer,
    global_scale: f32,
    out: &RawOperand,
) -> Result<()> {
    // SAFETY: the caller's contract.
    let (x, s, mut o) = unsafe {
        (
            DenseSlice::new(input, input_type, stream),
            RawSlice::<u32>::new(sizes, stream),
            OperandSlices::new(out, stream),
        )
    };
    match &x {
        DenseSlice::F16(x) => q.quantize_grouped(stream, x, problem, &s, global_scale, o.operand_mut()),
        DenseSlice::Bf16(x) => q.quantize_grouped(stream, x, problem, &s, global_scale, o.operand_mut()),
    }
}

// ---------------------------------------------------------------------------------------------
// The C interface (`host/include/nvfp4_gemm.h`). Build a library that exports it with
// `cargo rustc -p nvfp4-gemm --release --crate-type cdylib` (or `staticlib`).

/// Status of a C call: success.
pub const STATUS_OK: i32 = 0;
/// Status of a C call: an argument, group or problem is invalid (nothing was launched).
pub const STATUS_INVALID: i32 = 1;
/// Status of a C call: the device or operation is not supported (nothing was launched).
pub const STATUS_UNSUPPORTED: i32 = 2;
/// Status of a C call: no CUDA driver could be loaded.
pub const STATUS_NO_DRIVER: i32 = 3;
/// Status of a C call: a CUDA driver call failed.
pub const STATUS_DRIVER: i32 = 4;
/// Status of a C call: the library panicked (a bug); the handle should not be used again.
pub const STATUS_PANIC: i32 = 5;

/// The C status code of an error.
pub fn status_of(e: &Error) -> i32 {
    match e {
        Error::NoDriver => STATUS_NO_DRIVER,
        Error::UnsupportedArch { .. } | Error::Unsupported(_) => STATUS_UNSUPPORTED,
        Error::Driver { .. } => STATUS_DRIVER,
        _ => STATUS_INVALID,
    }
}

/// Writes `msg` NUL-terminated into `err` (at most `len` bytes, truncated at a UTF-8 boundary).
///
/// # Safety
/// `err` null or valid for `len` bytes of writes.
unsafe fn write_message(err: *mut std::ffi::c_char, len: usize, msg: &str) {
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
unsafe fn ffi(err: *mut std::ffi::c_char, err_len: usize, f: impl FnOnce() -> Result<()>) -> i32 {
    let (status, msg) = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => (STATUS_OK, String::new()),
        Ok(Err(e)) => (status_of(&e), e.to_string()),
        Err(_) => (STATUS_PANIC, "the library panicked (a bug); see stderr".to_string()),
    };
    // SAFETY: the caller's contract.
    unsafe { write_message(err, err_len, &msg) };
    status
}

fn null_error(field: &'static str) -> Error {
    Error::InvalidArgument { call: "raw", field, reason: "is a null pointer".into() }
}

/// A slice from a C pointer and count (null allowed when `count = 0`).
///
/// # Safety
/// `ptr` valid for `count` reads of `T` when non-null.
unsafe fn c_slice<'a, T>(ptr: *const T, count: usize, field: &'static str) -> Result<&'a [T]> {
    if count == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(null_error(field));
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, count) })
}

/// An opened device (C handle `nvfp4_device`): the GPU with this library's kernels loaded and
/// its quantizer.
pub struct Nvfp4Device {
    gpu: Gpu,
    quantizer: Quantizer,
}

impl Nvfp4Device {
    /// Opens device `ordinal` (its primary context, the one the CUDA runtime uses).
    pub fn open(ordinal: usize) -> Result<Nvfp4Device> {
        let gpu = Gpu::new(ordinal)?;
        let quantizer = Quantizer::new(&gpu)?;
        Ok(Nvfp4Device { gpu, quantizer })
    }

    /// The GPU.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Its quantizer.
    pub fn quantizer(&self) -> &Quantizer {
        &self.quantizer
    }

    /// The caller's stream `cu_stream` in this device's context.
    ///
    /// # Safety
    /// As [`borrow_stream`].
    pub unsafe fn stream(&self, cu_stream: sys::CUstream) -> Arc<CudaStream> {
        // SAFETY: the caller's contract.
        unsafe { borrow_stream(self.gpu.context(), cu_stream) }
    }
}

/// A handle the C functions return: a boxed value.
fn into_handle<T>(value: T, out: *mut *mut T) -> Result<()> {
    if out.is_null() {
        return Err(null_error("out"));
    }
    // SAFETY: a non-null out-pointer the caller provides for one handle.
    unsafe { *out = Box::into_raw(Box::new(value)) };
    Ok(())
}

/// # Safety
/// `ptr` null or a live handle of this type.
unsafe fn handle<'a, T>(ptr: *const T, field: &'static str) -> Result<&'a T> {
    // SAFETY: the caller's contract.
    unsafe { ptr.as_ref() }.ok_or_else(|| null_error(field))
}

/// # Safety
/// `ptr` null or a live handle of this type, not used elsewhere during the call.
unsafe fn handle_mut<'a, T>(ptr: *mut T, field: &'static str) -> Result<&'a mut T> {
    // SAFETY: the caller's contract.
    unsafe { ptr.as_mut() }.ok_or_else(|| null_error(field))
}

/// Opens device `ordinal` into `*out` (close it with [`nvfp4_device_close`]).
///
/// # Safety
/// `out` valid for one write; `err` as the module says.
#[no_mangle]
pub unsafe extern "C" fn nvfp4_device_open(
    ordinal: i32,
    out: *mut *mut Nvfp4Device,
    err: *mut std::ffi::c_char,
    err_len: usize,
) -> i32 {
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let ordinal = usize::try_from(ordinal).map_err(|_| Error::InvalidArgument {
                call: "raw",
                field: "ordinal",
                reason: format!("{ordinal} is negative"),
            })?;
            into_handle(Nvfp4Device::open(ordinal)?, out)
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
    if !dev.is_null() {
        // SAFETY: the caller's contract: a handle from `nvfp4_device_open`.
        drop(unsafe { Box::from_raw(dev) });
    }
}

/// One group's shape for [`nvfp4_gemm_plan_create`].
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

/// A grouped GEMM plan with its device's context (C handle `nvfp4_gemm_plan`).
pub struct Nvfp4GemmPlan {
    ctx: Arc<CudaContext>,
    plan: GemmPlan,
}

/// Plans `groups` shapes with C of type `c_type` ([`OUTPUT_F16`], [`OUTPUT_BF16`]) into `*out`
/// (destroy it with [`nvfp4_gemm_plan_destroy`]). Allocates device memory on the device's null
/// stream and waits for it, so the plan may be used on any stream at once.
///
/// # Safety
/// `dev` a live handle; `shapes` valid for `groups` reads; `out` valid for one write.
#[no_mangle]
pub unsafe extern "C" fn nvfp4_gemm_plan_create(
    dev: *const Nvfp4Device,
    shapes: *const RawShape,
    groups: usize,
    c_type: u32,
    out: *mut *mut Nvfp4GemmPlan,
    err: *mut std::ffi::c_char,
    err_len: usize,
) -> i32 {
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let dev = handle(dev, "dev")?;
            let shapes: Vec<GroupShape> = c_slice(shapes, groups, "shapes")?
                .iter()
                .map(|s| GroupShape::new(s.m as usize, s.n as usize, s.k as usize))
                .collect();
            let plan = GemmPlan::new(&dev.gpu, Problem::new(shapes, output_type(c_type)?)?)?;
            synchronize(&dev.gpu)?;
            into_handle(Nvfp4GemmPlan { ctx: dev.gpu.context().clone(), plan }, out)
        })
    }
}

/// Waits for the device's null stream (where plans allocate and zero their memory).
fn synchronize(gpu: &Gpu) -> Result<()> {
    gpu.context().default_stream().synchronize().map_err(|e| Error::driver("waiting for the new plan's memory", e))
}

/// Destroys a plan (null: nothing). The work enqueued with it must have finished.
///
/// # Safety
/// `plan` null or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn nvfp4_gemm_plan_destroy(plan: *mut Nvfp4GemmPlan) {
    if !plan.is_null() {
        // SAFETY: the caller's contract: a handle from `nvfp4_gemm_plan_create`.
        drop(unsafe { Box::from_raw(plan) });
    }
}

/// Runs the plan on `stream` with `groups` argument sets (one per group) and C of type `c_type`.
/// `device_alphas` null: each group's `alpha` from its argument set; else a device buffer of
/// `groups` `f32`s read on the device ([`GemmPlan::run_with_device_alphas`]; the argument sets'
/// alphas are not read).
///
/// # Safety
/// `plan` a live handle; `args` valid for `groups` reads; `device_alphas` null or valid for one
/// read; every buffer as [`gemm_run`]; `stream` a stream of the plan's device's primary context
/// (or null).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn nvfp4_gemm_run(
    plan: *mut Nvfp4GemmPlan,
    stream: sys::CUstream,
    args: *const RawGroupArgs,
    groups: usize,
    c_type: u32,
    device_alphas: *const RawBuffer,
    err: *mut std::ffi::c_char,
    err_len: usize,
) -> i32 {
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let p = handle_mut(plan, "plan")?;
            let args = c_slice(args, groups, "args")?;
            let stream = borrow_stream(&p.ctx, stream);
            gemm_run(&mut p.plan, &stream, args, output_type(c_type)?, device_alphas.as_ref().copied())
        })
    }
}

/// Runs the plan on `stream` with every group's buffers stacked and `groups` alphas: from the
/// host (`alphas`, `device_alphas` null) or read on the device (`device_alphas`, a device buffer
/// of `groups` `f32`s; `alphas` is then not read and may be null).
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
    err: *mut std::ffi::c_char,
    err_len: usize,
) -> i32 {
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let p = handle_mut(plan, "plan")?;
            let args = handle(args, "args")?;
            let device_alphas = device_alphas.as_ref().copied();
            let alphas = if device_alphas.is_some() { &[] } else { c_slice(alphas, groups, "alphas")? };
            let stream = borrow_stream(&p.ctx, stream);
            gemm_run_stacked(&mut p.plan, &stream, args, alphas, output_type(c_type)?, device_alphas)
        })
    }
}

/// Token layout code of [`nvfp4_moe_plan_create`]: contiguous (`bound` = `max_tokens`).
pub const LAYOUT_CONTIGUOUS: u32 = 0;
/// Token layout code of [`nvfp4_moe_plan_create`]: masked (`bound` = `max_rows`).
pub const LAYOUT_MASKED: u32 = 1;

/// A MoE plan with its device's context (C handle `nvfp4_moe_plan`).
pub struct Nvfp4MoePlan {
    ctx: Arc<CudaContext>,
    plan: MoePlan,
}

/// Plans a [`MoeProblem`] (`groups`, `n`, `k`, `layout` ([`LAYOUT_CONTIGUOUS`],
/// [`LAYOUT_MASKED`]) with its `bound`, C of type `c_type`) into `*out`; destroy it with
/// [`nvfp4_moe_plan_destroy`].
///
/// # Safety
/// `dev` a live handle; `out` valid for one write.
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
    err: *mut std::ffi::c_char,
    err_len: usize,
) -> i32 {
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let dev = handle(dev, "dev")?;
            let problem = MoeProblem::new(
                groups as usize,
                n as usize,
                k as usize,
                token_layout(layout, bound)?,
                output_type(c_type)?,
            )?;
            let plan = MoePlan::new(&dev.gpu, problem)?;
            synchronize(&dev.gpu)?;
            into_handle(Nvfp4MoePlan { ctx: dev.gpu.context().clone(), plan }, out)
        })
    }
}

/// The [`TokenLayout`] of a layout code and bound.
pub fn token_layout(layout: u32, bound: u64) -> Result<TokenLayout> {
    match layout {
        LAYOUT_CONTIGUOUS => Ok(TokenLayout::Contiguous { max_tokens: bound as usize }),
        LAYOUT_MASKED => Ok(TokenLayout::Masked { max_rows: bound as usize }),
        other => Err(Error::InvalidArgument {
            call: "raw",
            field: "layout",
            reason: format!("{other} is not 0 (contiguous) or 1 (masked)"),
        }),
    }
}

/// Destroys a MoE plan (null: nothing). The work enqueued with it must have finished.
///
/// # Safety
/// `plan` null or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn nvfp4_moe_plan_destroy(plan: *mut Nvfp4MoePlan) {
    if !plan.is_null() {
        // SAFETY: the caller's contract: a handle from `nvfp4_moe_plan_create`.
        drop(unsafe { Box::from_raw(plan) });
    }
}

/// Runs the MoE plan on `stream`: `weights` and `alphas` one per group (`groups` of each).
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
    err: *mut std::ffi::c_char,
    err_len: usize,
) -> i32 {
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let p = handle_mut(plan, "plan")?;
            let args = handle(args, "args")?;
            let weights = c_slice(weights, groups, "weights")?;
            let alphas = c_slice(alphas, groups, "alphas")?;
            let stream = borrow_stream(&p.ctx, stream);
            let c_type = p.plan.problem().output();
            moe_run(&mut p.plan, &stream, args, weights, alphas, c_type)
        })
    }
}

/// The device address of the MoE plan's status word (`u32`, `SizeStatus` bits), e.g. to copy it
/// on a stream; zero it with [`nvfp4_moe_clear_status`].
///
/// # Safety
/// `plan` a live handle.
#[no_mangle]
pub unsafe extern "C" fn nvfp4_moe_status_address(plan: *const Nvfp4MoePlan) -> u64 {
    // SAFETY: the caller's contract.
    match unsafe { plan.as_ref() } {
        Some(p) => {
            let stream = p.ctx.default_stream();
            let (ptr, _guard) = p.plan.status().device_ptr(&stream);
            ptr
        }
        None => 0,
    }
}

/// Zeroes the MoE plan's status word on `stream` (capturable).
///
/// # Safety
/// As [`nvfp4_gemm_run`].
#[no_mangle]
pub unsafe extern "C" fn nvfp4_moe_clear_status(
    plan: *mut Nvfp4MoePlan,
    stream: sys::CUstream,
    err: *mut std::ffi::c_char,
    err_len: usize,
) -> i32 {
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let p = handle_mut(plan, "plan")?;
            let stream = borrow_stream(&p.ctx, stream);
            p.plan.clear_status(&stream)
        })
    }
}

/// Quantizes `input` (`rows × k` elements of `input_type`: [`OUTPUT_F16`] or [`OUTPUT_BF16`])
/// with `global_scale` into `out` on `stream`.
///
/// # Safety
/// `dev` a live handle; `out` valid for one read; buffers as [`gemm_run`].
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
    err: *mut std::ffi::c_char,
    err_len: usize,
) -> i32 {
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let dev = handle(dev, "dev")?;
            let out = handle(out, "out")?;
            let stream = dev.stream(stream);
            quantize(
                &dev.quantizer,
                &stream,
                input,
                output_type(input_type)?,
                rows as usize,
                k as usize,
                global_scale,
                out,
            )
        })
    }
}

/// Dequantizes `input` (`rows × k` NVFP4) with `global_scale` into `output` (elements of
/// `output_type`) on `stream`.
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
    output_type_code: u32,
    err: *mut std::ffi::c_char,
    err_len: usize,
) -> i32 {
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let dev = handle(dev, "dev")?;
            let input = handle(input, "input")?;
            let stream = dev.stream(stream);
            dequantize(
                &dev.quantizer,
                &stream,
                input,
                rows as usize,
                k as usize,
                global_scale,
                output,
                output_type(output_type_code)?,
            )
        })
    }
}

/// Quantizes the token tensor of the MoE plan's problem (`input`, elements of `input_type`)
/// with `global_scale` into `out` in the problem's layout, group sizes read from `sizes` on the
/// device.
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
    err: *mut std::ffi::c_char,
    err_len: usize,
) -> i32 {
    // SAFETY: the caller's contract.
    unsafe {
        ffi(err, err_len, || {
            let dev = handle(dev, "dev")?;
            let plan = handle(plan, "plan")?;
            let out = handle(out, "out")?;
            let stream = dev.stream(stream);
            let t = output_type(input_type)?;
            quantize_grouped(&dev.quantizer, &stream, input, t, plan.plan.problem(), sizes, global_scale, out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::{c_char, CStr};

    #[test]
    fn layouts_match_the_c_header() {
        use std::mem::{align_of, size_of};
        assert_eq!((size_of::<RawBuffer>(), align_of::<RawBuffer>()), (16, 8));
        assert_eq!(size_of::<RawOperand>(), 32);
        assert_eq!(size_of::<RawGroupArgs>(), 88);
        assert_eq!(size_of::<RawStackedArgs>(), 80);
        assert_eq!(size_of::<RawMoeArgs>(), 64);
        assert_eq!(size_of::<RawShape>(), 24);
        let header = include_str!("../include/nvfp4_gemm.h");
        for (name, value) in [
            ("NVFP4_OK", STATUS_OK),
            ("NVFP4_INVALID", STATUS_INVALID),
            ("NVFP4_UNSUPPORTED", STATUS_UNSUPPORTED),
            ("NVFP4_NO_DRIVER", STATUS_NO_DRIVER),
            ("NVFP4_DRIVER", STATUS_DRIVER),
            ("NVFP4_PANIC", STATUS_PANIC),
            ("NVFP4_F16", OUTPUT_F16 as i32),
            ("NVFP4_BF16", OUTPUT_BF16 as i32),
            ("NVFP4_CONTIGUOUS", LAYOUT_CONTIGUOUS as i32),
            ("NVFP4_MASKED", LAYOUT_MASKED as i32),
        ] {
            assert!(header.contains(&format!("#define {name} {value}\n")), "{name} = {value} in the header");
        }
    }

    #[test]
    fn messages_are_truncated_and_terminated() {
        let mut buf = [b'x' as c_char; 8];
        // SAFETY: an 8-byte buffer.
        let status = unsafe { ffi(buf.as_mut_ptr(), buf.len(), || Err(null_error("args"))) };
        assert_eq!(status, STATUS_INVALID);
        // SAFETY: NUL-terminated by `ffi`.
        assert_eq!(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap(), "raw: `a");
        // A multi-byte character is never cut.
        // SAFETY: as above.
        unsafe { write_message(buf.as_mut_ptr(), 3, "aé") };
        assert_eq!(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_bytes(), b"a");
        // SAFETY: null buffer: nothing written.
        assert_eq!(unsafe { ffi(std::ptr::null_mut(), 0, || Ok(())) }, STATUS_OK);
        // SAFETY: as above.
        assert_eq!(unsafe { ffi(buf.as_mut_ptr(), buf.len(), || panic!("test")) }, STATUS_PANIC);
    }

    #[test]
    fn null_handles_and_bad_codes_are_errors() {
        let mut buf = [0 as c_char; 128];
        let text = |b: &[c_char]| unsafe { CStr::from_ptr(b.as_ptr()) }.to_str().unwrap().to_string();
        // SAFETY: null handles are checked before any use.
        let s = unsafe {
            nvfp4_gemm_run(
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null(),
                0,
                0,
                std::ptr::null(),
                buf.as_mut_ptr(),
                128,
            )
        };
        assert_eq!((s, text(&buf).as_str()), (STATUS_INVALID, "raw: `plan`: is a null pointer"));
        // SAFETY: as above.
        let s = unsafe {
            nvfp4_gemm_plan_create(
                std::ptr::null(),
                std::ptr::null(),
                0,
                0,
                std::ptr::null_mut(),
                buf.as_mut_ptr(),
                128,
            )
        };
        assert_eq!(s, STATUS_INVALID);
        assert_eq!(output_type(2).unwrap_err().to_string(), "raw: `c_type`: 2 is not 0 (f16) or 1 (bf16)");
        assert!(token_layout(7, 1).is_err());
        assert_eq!(token_layout(LAYOUT_MASKED, 9).unwrap(), TokenLayout::Masked { max_rows: 9 });
        // SAFETY: destroying null handles does nothing.
        unsafe {
            nvfp4_gemm_plan_destroy(std::ptr::null_mut());
            nvfp4_moe_plan_destroy(std::ptr::null_mut());
            nvfp4_device_close(std::ptr::null_mut());
        }
        assert_eq!(unsafe { nvfp4_moe_status_address(std::ptr::null()) }, 0);
    }

    /// Without a CUDA driver, opening a device is a typed error; with one, it opens.
    #[test]
    fn device_open_reports_a_missing_driver() {
        let mut buf = [0 as c_char; 128];
        let mut dev: *mut Nvfp4Device = std::ptr::null_mut();
        // SAFETY: valid out-pointers.
        let s = unsafe { nvfp4_device_open(0, &mut dev, buf.as_mut_ptr(), 128) };
        if crate::driver_present() {
            // With a driver: it opens (or names the unsupported device).
            assert!(s == STATUS_OK || s == STATUS_UNSUPPORTED, "status {s}");
            assert_eq!(dev.is_null(), s != STATUS_OK);
            // SAFETY: a handle from `nvfp4_device_open`, or null.
            return unsafe { nvfp4_device_close(dev) };
        }
        assert_eq!(s, STATUS_NO_DRIVER);
        assert!(dev.is_null());
        // SAFETY: NUL-terminated.
        assert!(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap().starts_with("no CUDA driver"));
        // SAFETY: as above.
        assert_eq!(unsafe { nvfp4_device_open(-1, &mut dev, buf.as_mut_ptr(), 128) }, STATUS_INVALID);
    }
}
