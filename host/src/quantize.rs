//! NVFP4 quantization on the GPU: f16/bf16 `[rows, K]` → packed e2m1 values + e4m3 scales in the
//! 128x4 blocked layout (ready for [`crate::GemmPlan::run`]), and the reverse for checks.
//!
//! The result is bit for bit that of [`nvfp4_format::quantize_with_global_scale`] on the same
//! values and global scale `g` (NVFP4's two-level recipe: block scale `e4m3(amax / 6 / g)`, values
//! `e2m1(x / (scale * g))`), including the padding rows of the scale layout, written as zero.
//! The global scale is an argument (serving code calibrates it; for one tensor
//! [`nvfp4_format::global_scale_for_amax`] gives the recipe's `amax / (6 * 448)`); pass
//! `g_a * g_b` as the GEMM's alpha (record `g` in [`DeviceNvfp4::global_scale`] and
//! [`crate::GroupArgs::new`] does). NaN and infinities in the input cannot be reported without a
//! host synchronisation, so they have defined results: a block holding a NaN gets the NaN scale
//! `0x7F` (it dequantizes to NaN, and so do the GEMM rows that read it); `±inf` saturates (scale
//! 448, value `±6`). See `nvfp4_gemm_abi::quantize` for the arithmetic.
//!
//! ```no_run
//! use nvfp4_gemm::quantize::Quantizer;
//! use nvfp4_gemm::{DeviceNvfp4, Gpu};
//!
//! let gpu = Gpu::new(0)?;
//! let stream = gpu.context().default_stream();
//! let quantizer = Quantizer::new(&gpu)?; // once
//! let (rows, k) = (300, 2048);
//! let x = stream.alloc_zeros::<half::bf16>(rows * k)?; // activations on the device
//! let mut a = DeviceNvfp4::alloc_zeros(&stream, rows, k)?; // once, reused
//! let g = 0.01; // the global scale (calibrated)
//! quantizer.quantize(&stream, &x, rows, k, g, a.operand_mut())?; // no allocation, no sync
//! a.global_scale = g; // for `GroupArgs::new`, which multiplies the operands' global scales
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::device::{Arch, Gpu};
use crate::driver::launch::{launch, launch_with};
use crate::driver::module::Kernel;
use crate::error::{invalid, Error, Result};
use crate::moe::{AFTER_GEMM_START, CHAIN_START};
use crate::overlap::{self, Span};
use crate::plan::{Nvfp4Operand, TokenOperand};
use crate::problem::Activations;
use crate::problem::{BufferView, CallBuffers, BUFFER_ALIGN};
use crate::upload::DeviceNvfp4;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};
use half::{bf16, f16};
use nvfp4_gemm_abi::quantize::{self as abi, ConvertParams};
use nvfp4_gemm_abi::scale_layout::blocked_bytes;
use std::sync::Arc;

mod sealed {
    pub trait Sealed {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// The 16-bit float types the quantizer reads and the dequantizer writes: `f16` and `bf16`.
pub trait DenseFloat: sealed::Sealed + DeviceRepr + Copy {
    /// True for bf16.
    const BF16: bool;
    /// The type as W4A16's activations.
    const ACTIVATIONS: Activations;

    /// A tensor of this type as a call's token operand (W4A16's activations).
    fn tokens(x: &dyn DevicePtr<Self>) -> TokenOperand<'_>;
}

impl DenseFloat for f16 {
    const BF16: bool = false;
    const ACTIVATIONS: Activations = Activations::F16;

    fn tokens(x: &dyn DevicePtr<f16>) -> TokenOperand<'_> {
        TokenOperand::F16(x)
    }
}

impl DenseFloat for bf16 {
    const BF16: bool = true;
    const ACTIVATIONS: Activations = Activations::Bf16;

    fn tokens(x: &dyn DevicePtr<bf16>) -> TokenOperand<'_> {
        TokenOperand::Bf16(x)
    }
}

/// One NVFP4 tensor being written: packed e2m1 values (`rows · k / 2` bytes) and blocked e4m3
/// scales ([`Nvfp4Sizes::scales`] bytes).
pub struct Nvfp4OperandMut<'a> {
    /// Packed values.
    pub values: &'a mut dyn DevicePtrMut<u8>,
    /// Blocked scales.
    pub scales: &'a mut dyn DevicePtrMut<u8>,
}

pub use crate::problem::Nvfp4Sizes;

impl Nvfp4Sizes {
    /// The sizes for `rows x k` (`k` a positive multiple of 64).
    pub fn of(rows: usize, k: usize) -> Result<Nvfp4Sizes> {
        let (r, k32) = check_shape("quantize", rows, k)?;
        Ok(Nvfp4Sizes { values: rows * k / 2, scales: blocked_bytes(r, k32) })
    }
}

impl DeviceNvfp4 {
    /// Zeroed device buffers for an NVFP4 tensor of `rows x k` (`k` a positive multiple of 64),
    /// e.g. for [`Quantizer::quantize`]'s output; an empty tensor gets 16-byte placeholders.
    /// Global scale 1.
    pub fn alloc_zeros(stream: &Arc<CudaStream>, rows: usize, k: usize) -> Result<DeviceNvfp4> {
        DeviceNvfp4::alloc_zeros_sized(stream, Nvfp4Sizes::of(rows, k)?)
    }

    /// Zeroed device buffers of the given sizes (e.g. [`crate::MoeProblem::a_sizes`]); empty
    /// buffers get 16-byte placeholders. Global scale 1.
    pub fn alloc_zeros_sized(stream: &Arc<CudaStream>, sizes: Nvfp4Sizes) -> Result<DeviceNvfp4> {
        let d = |e| Error::driver("allocating an NVFP4 tensor", e);
        Ok(DeviceNvfp4 {
            values: stream.alloc_zeros::<u8>(sizes.values.max(16)).map_err(d)?,
            scales: stream.alloc_zeros::<u8>(sizes.scales.max(16)).map_err(d)?,
            global_scale: 1.0,
        })
    }

    /// The output view [`Quantizer::quantize`] takes (it writes the values and scales; record
    /// the global scale it quantized with in [`DeviceNvfp4::global_scale`]).
    pub fn operand_mut(&mut self) -> Nvfp4OperandMut<'_> {
        Nvfp4OperandMut { values: &mut self.values, scales: &mut self.scales }
    }
}

/// The quantization kernels of a [`Gpu`], loaded once. Calls validate every argument first
/// (nothing is launched on an error), allocate nothing and never synchronise the host, so they
/// can be captured in a CUDA graph.
#[derive(Debug)]
pub struct Quantizer {
    quantize: Kernel,
    dequantize: Kernel,
    /// `nvfp4_quantize_grouped` (device-sized layouts, `crate::moe`).
    quantize_grouped: Kernel,
    /// `moe_activate` (the MoE block's activation, `crate::moe_block`: four threads per block of
    /// 16 outputs).
    activate: Kernel,
    /// `moe_activate_blocks` (the same, one thread per block: calls of many blocks).
    activate_blocks: Kernel,
    /// `sm90_quantize_schedule` (sm_90a: the block's quantization with its GEMMs' schedulers).
    quantize_schedule: Option<Kernel>,
    max_ctas: u32,
}

/// Resident CTAs per SM the quantizers' and the activation's grids are sized for (the threads
/// grid-stride beyond).
pub const CTAS_PER_SM: u32 = 8;

impl Quantizer {
    /// Looks up the kernels in `gpu`'s image.
    pub fn new(gpu: &Gpu) -> Result<Quantizer> {
        Ok(Quantizer {
            quantize: gpu.function("nvfp4_quantize")?,
            dequantize: gpu.function("nvfp4_dequantize")?,
            quantize_grouped: gpu.function("nvfp4_quantize_grouped")?,
            activate: gpu.function("moe_activate")?,
            activate_blocks: gpu.function("moe_activate_blocks")?,
            quantize_schedule: match gpu.arch() {
                Arch::Sm90a => Some(gpu.function(nvfp4_gemm_abi::moe::sm90::QUANTIZE_SCHEDULE_KERNEL)?),
                Arch::Sm100a => None,
            },
            max_ctas: gpu.sm_count().max(1) * CTAS_PER_SM,
        })
    }

    /// Quantizes `input` (`rows x k` row-major f16 or bf16, exactly `rows · k` elements) with the
    /// global scale `global_scale` into `out` (exactly [`Nvfp4Sizes::of`]`(rows, k)` bytes each),
    /// on `stream`. Every byte of both outputs is written (scale padding rows as zero).
    ///
    /// Errors (before any launch): [`Error::InvalidArgument`] for `k` not a positive multiple of
    /// 64, a size too large for the kernels' 32-bit indexing, `global_scale` not finite and
    /// positive, a buffer of the wrong length or not 16-byte aligned; [`Error::Overlap`] for an
    /// output overlapping another buffer (the inputs may share memory). `rows = 0` launches
    /// nothing (the buffers are not checked).
    pub fn quantize<T: DenseFloat>(
        &self,
        stream: &Arc<CudaStream>,
        input: &dyn DevicePtr<T>,
        rows: usize,
        k: usize,
        global_scale: f32,
        out: Nvfp4OperandMut<'_>,
    ) -> Result<()> {
        let mut call = CallBuffers::new(stream);
        let buffers =
            Buffers { dense: call.read(input), values: call.write(out.values), scales: call.write(out.scales) };
        let Some((params, items)) = validate(Direction::Quantize, rows, k, global_scale, T::BF16, &buffers)? else {
            return Ok(());
        };
        // SAFETY: `validate` checked the shape, lengths, alignment and disjointness the kernel
        // relies on (its `# Safety`); the guards keep the buffers alive past the launch.
        unsafe { self.launch(&self.quantize, stream, params, items) }
    }

    /// Dequantizes `input` (an NVFP4 tensor of `rows x k`: exactly [`Nvfp4Sizes::of`]`(rows, k)`
    /// bytes each) with the global scale `global_scale` into `output` (exactly `rows · k` f16 or
    /// bf16 elements): `e2m1 · e4m3 · g`, exact in `f64`, rounded once to nearest even (overflow
    /// to ±inf, a NaN scale gives NaN), on `stream`. Errors as for [`Quantizer::quantize`].
    pub fn dequantize<T: DenseFloat>(
        &self,
        stream: &Arc<CudaStream>,
        input: Nvfp4Operand<'_>,
        rows: usize,
        k: usize,
        global_scale: f32,
        output: &mut dyn DevicePtrMut<T>,
    ) -> Result<()> {
        let mut call = CallBuffers::new(stream);
        let buffers =
            Buffers { values: call.read(input.values), scales: call.read(input.scales), dense: call.write(output) };
        let Some((params, items)) = validate(Direction::Dequantize, rows, k, global_scale, T::BF16, &buffers)? else {
            return Ok(());
        };
        // SAFETY: as in `quantize`.
        unsafe { self.launch(&self.dequantize, stream, params, items) }
    }

    /// [`Quantizer::quantize`] on buffers given as addresses and lengths (`input`: `rows × k`
    /// elements of f16, or bf16 when `bf16`; `values`, `scales` bytes): the typed entry of
    /// bindings, with the same checks.
    ///
    /// # Safety
    /// As [`crate::GemmPlan::run_views`], for every buffer.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn quantize_views(
        &self,
        stream: &CudaStream,
        input: BufferView,
        bf16: bool,
        rows: usize,
        k: usize,
        global_scale: f32,
        values: BufferView,
        scales: BufferView,
    ) -> Result<()> {
        let buffers = Buffers { dense: input, values, scales };
        let Some((params, items)) = validate(Direction::Quantize, rows, k, global_scale, bf16, &buffers)? else {
            return Ok(());
        };
        // SAFETY: validated; the caller's contract for the memory.
        unsafe { self.launch(&self.quantize, stream, params, items) }
    }

    /// [`Quantizer::dequantize`] on buffers given as addresses and lengths (`output`: `rows × k`
    /// elements of f16, or bf16 when `bf16`), as [`Quantizer::quantize_views`].
    ///
    /// # Safety
    /// As [`crate::GemmPlan::run_views`], for every buffer.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn dequantize_views(
        &self,
        stream: &CudaStream,
        values: BufferView,
        scales: BufferView,
        rows: usize,
        k: usize,
        global_scale: f32,
        output: BufferView,
        bf16: bool,
    ) -> Result<()> {
        let buffers = Buffers { dense: output, values, scales };
        let Some((params, items)) = validate(Direction::Dequantize, rows, k, global_scale, bf16, &buffers)? else {
            return Ok(());
        };
        // SAFETY: validated; the caller's contract for the memory.
        unsafe { self.launch(&self.dequantize, stream, params, items) }
    }

    /// Launches `nvfp4_quantize_grouped` over `items` work items (`crate::moe`).
    ///
    /// # Safety
    /// `params` must satisfy the kernel's `# Safety` contract.
    pub(crate) unsafe fn launch_grouped(
        &self,
        stream: &CudaStream,
        items: u64,
        params: &nvfp4_gemm_abi::moe::GroupedConvertParams,
    ) -> Result<()> {
        // SAFETY: one `GroupedConvertParams` by value, as the kernel takes; the caller vouches.
        unsafe { launch_with(&self.quantize_grouped, stream, abi::launch(items, self.max_ctas), CHAIN_START, params) }
    }

    /// Launches `sm90_quantize_schedule` for `items` quantization items: `params.quantize` as
    /// [`Quantizer::launch_grouped`]'s, and both schedulers, over `groups` groups
    /// (`abi::moe::sm90::quantize_schedule_launch`). `Error::Unsupported` off sm_90a.
    ///
    /// # Safety
    /// `params` must satisfy the kernel's `# Safety` contract.
    pub(crate) unsafe fn launch_quantize_schedule(
        &self,
        stream: &CudaStream,
        items: u64,
        groups: u32,
        params: &nvfp4_gemm_abi::moe::sm90::QuantizeScheduleParams,
    ) -> Result<()> {
        let Some(f) = &self.quantize_schedule else {
            return Err(Error::Unsupported("the quantization with the schedulers is an sm_90a kernel".into()));
        };
        let geometry = nvfp4_gemm_abi::moe::sm90::quantize_schedule_launch(items, self.max_ctas / CTAS_PER_SM, groups);
        // SAFETY: one `QuantizeScheduleParams` by value, as the kernel takes; the caller vouches.
        unsafe { launch_with(f, stream, geometry, CHAIN_START, params) }
    }

    /// Launches `moe_activate`, or `moe_activate_blocks` with `whole_blocks`, over `items` work
    /// items (`crate::moe_block`).
    ///
    /// # Safety
    /// `params` must satisfy the kernel's `# Safety` contract.
    pub(crate) unsafe fn launch_activate(
        &self,
        stream: &CudaStream,
        items: u64,
        whole_blocks: bool,
        params: &nvfp4_gemm_abi::moe::block::ActivateParams,
    ) -> Result<()> {
        let f = if whole_blocks { &self.activate_blocks } else { &self.activate };
        // SAFETY: one `ActivateParams` by value, as both kernels take; the caller vouches.
        unsafe { launch_with(f, stream, abi::launch(items, self.max_ctas), AFTER_GEMM_START, params) }
    }

    /// # Safety
    /// `params` must satisfy the kernel's `# Safety` contract.
    unsafe fn launch(&self, f: &Kernel, stream: &CudaStream, params: ConvertParams, items: u64) -> Result<()> {
        // SAFETY: one `ConvertParams` by value, as both kernels take; the caller vouches for it.
        unsafe { launch(f, stream, abi::launch(items, self.max_ctas), &params) }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Quantize,
    Dequantize,
}

impl Direction {
    fn call(self) -> &'static str {
        match self {
            Direction::Quantize => "quantize",
            Direction::Dequantize => "dequantize",
        }
    }
}

/// Addresses and lengths (elements) of one call's buffers.
#[derive(Debug, Clone, Copy)]
struct Buffers {
    dense: BufferView,
    values: BufferView,
    scales: BufferView,
}

/// `k` a positive multiple of 64; `rows`, `k` in `u32`; the quantizer's item count (the larger)
/// under the kernels' 32-bit limit.
fn check_shape(call: &'static str, rows: usize, k: usize) -> Result<(u32, u32)> {
    if let Some(reason) = crate::rules::k_rule(k) {
        return Err(invalid(call, "k", reason));
    }
    let k32 = u32::try_from(k).map_err(|_| invalid(call, "k", format!("{k} is too large")))?;
    let r32 = u32::try_from(rows).map_err(|_| invalid(call, "rows", format!("{rows} is too large")))?;
    if abi::quantize_items(r32, k32) >= abi::MAX_ITEMS {
        return Err(invalid(call, "rows", format!("{rows} x {k} is too large (at most 2^35 values per call)")));
    }
    Ok((r32, k32))
}

/// Checks one call's arguments; returns the kernel parameters and work items, or `None` when
/// there is nothing to do (`rows = 0`). Pure: runs on the CPU.
fn validate(
    dir: Direction,
    rows: usize,
    k: usize,
    global_scale: f32,
    bf16: bool,
    b: &Buffers,
) -> Result<Option<(ConvertParams, u64)>> {
    let call = dir.call();
    let (r32, k32) = check_shape(call, rows, k)?;
    if !(global_scale.is_finite() && global_scale > 0.0) {
        return Err(invalid(call, "global_scale", format!("{global_scale} is not finite and positive")));
    }
    if rows == 0 {
        return Ok(None);
    }
    let dense_name = if dir == Direction::Quantize { "input" } else { "output" };
    let sizes = Nvfp4Sizes { values: rows * k / 2, scales: blocked_bytes(r32, k32) };
    let checks =
        [(dense_name, b.dense, rows * k), ("values", b.values, sizes.values), ("scales", b.scales, sizes.scales)];
    for (field, view, len) in checks {
        if view.len != len {
            return Err(invalid(
                call,
                field,
                format!("has {} elements; rows={rows} k={k} needs exactly {len}", view.len),
            ));
        }
        if view.ptr % BUFFER_ALIGN != 0 {
            return Err(invalid(call, field, format!("address {:#x} is not {BUFFER_ALIGN}-byte aligned", view.ptr)));
        }
    }
    let dense_out = dir == Direction::Dequantize;
    let mut spans = [
        Span::new(0, b.dense, 2, dense_out),
        Span::new(1, b.values, 1, !dense_out),
        Span::new(2, b.scales, 1, !dense_out),
    ];
    overlap::check(call, &mut spans, overlap::fields(&[dense_name, "values", "scales"]))?;
    let items = match dir {
        Direction::Quantize => abi::quantize_items(r32, k32),
        Direction::Dequantize => abi::dequantize_items(r32, k32),
    };
    let params = ConvertParams {
        dense: b.dense.ptr,
        values: b.values.ptr,
        scales: b.scales.ptr,
        rows: r32,
        k: k32,
        global_scale,
        bf16: bf16 as u32,
    };
    Ok(Some((params, items)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::BufferName;

    fn good(rows: usize, k: usize) -> Buffers {
        let s = Nvfp4Sizes::of(rows, k).unwrap();
        Buffers {
            dense: BufferView { ptr: 0x10_0000, len: rows * k },
            values: BufferView { ptr: 0x4000_0000, len: s.values },
            scales: BufferView { ptr: 0x8000_0000, len: s.scales },
        }
    }

    fn field_of(e: Error) -> (&'static str, &'static str) {
        match e {
            Error::InvalidArgument { call, field, .. } => (call, field),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(Nvfp4Sizes::of(130, 128).unwrap(), Nvfp4Sizes { values: 130 * 64, scales: 256 * 8 });
        assert_eq!(Nvfp4Sizes::of(0, 64).unwrap(), Nvfp4Sizes { values: 0, scales: 0 });
        assert_eq!(field_of(Nvfp4Sizes::of(1, 48).unwrap_err()), ("quantize", "k"));
    }

    #[test]
    fn good_arguments_give_the_kernel_parameters() {
        let b = good(300, 256);
        let (p, items) = validate(Direction::Quantize, 300, 256, 0.5, true, &b).unwrap().unwrap();
        assert_eq!(
            p,
            ConvertParams {
                dense: 0x10_0000,
                values: 0x4000_0000,
                scales: 0x8000_0000,
                rows: 300,
                k: 256,
                global_scale: 0.5,
                bf16: 1
            }
        );
        assert_eq!(items, 384 * 16);
        let (_, items) = validate(Direction::Dequantize, 300, 256, 0.5, false, &b).unwrap().unwrap();
        assert_eq!(items, 300 * 16);
        // rows = 0: nothing to do, whatever the buffers.
        let empty = Buffers { dense: BufferView { ptr: 3, len: 7 }, ..b };
        assert_eq!(validate(Direction::Quantize, 0, 256, 1.0, false, &empty).unwrap(), None);
    }

    #[test]
    fn bad_arguments_are_typed_errors() {
        let (rows, k) = (72, 192);
        type Breaker = fn(&mut Buffers);
        let cases: [(&str, Breaker); 6] = [
            ("input", |b| b.dense.len -= 1),
            ("values", |b| b.values.len += 1),
            ("scales", |b| b.scales.len = 72 * 12), // the plain layout's size, not padded to 128 rows
            ("input", |b| b.dense.ptr += 2),
            ("values", |b| b.values.ptr += 8),
            ("scales", |b| b.scales.ptr += 4),
        ];
        for (field, break_it) in cases {
            let mut b = good(rows, k);
            break_it(&mut b);
            let e = validate(Direction::Quantize, rows, k, 1.0, false, &b).unwrap_err();
            assert_eq!(field_of(e), ("quantize", field), "{field}");
        }
        // Outputs overlapping an input or each other (named output first).
        let overlaps: [((&str, &str), Breaker); 4] = [
            (("values", "input"), |b| b.values.ptr = b.dense.ptr + 64),
            (("scales", "values"), |b| b.scales.ptr = b.values.ptr + 16),
            (("scales", "input"), |b| b.scales.ptr = b.dense.ptr - 16),
            (("values", "input"), |b| b.values.ptr = b.dense.ptr),
        ];
        for (names, break_it) in overlaps {
            let mut b = good(rows, k);
            break_it(&mut b);
            match validate(Direction::Quantize, rows, k, 1.0, false, &b).unwrap_err() {
                Error::Overlap { call: "quantize", output, other } => {
                    assert_eq!((output.field, other.field), names);
                    assert_eq!((output.group, other.group), (None, None));
                }
                other => panic!("{names:?}: {other:?}"),
            }
        }
        // Dequantizing: the output is the dense tensor; the NVFP4 inputs may share memory.
        let mut b = good(rows, k);
        b.scales.ptr = b.values.ptr + 16;
        assert!(validate(Direction::Dequantize, rows, k, 1.0, false, &b).is_ok());
        b.dense.ptr = b.values.ptr - 16;
        assert!(matches!(
            validate(Direction::Dequantize, rows, k, 1.0, false, &b),
            Err(Error::Overlap { call: "dequantize", output: BufferName { field: "output", .. }, .. })
        ));
        let mut b = good(rows, k);
        b.dense.len += 16;
        assert_eq!(
            field_of(validate(Direction::Dequantize, rows, k, 1.0, false, &b).unwrap_err()),
            ("dequantize", "output")
        );
        let b = good(rows, k);
        for g in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            let e = validate(Direction::Quantize, rows, k, g, false, &b).unwrap_err();
            assert_eq!(field_of(e), ("quantize", "global_scale"));
        }
        for bad_k in [0, 16, 48, 100] {
            assert_eq!(
                field_of(validate(Direction::Quantize, rows, bad_k, 1.0, false, &b).unwrap_err()),
                ("quantize", "k")
            );
        }
        assert_eq!(
            field_of(validate(Direction::Quantize, 1 << 22, 1 << 15, 1.0, false, &b).unwrap_err()),
            ("quantize", "rows")
        );
        assert_eq!(field_of(validate(Direction::Quantize, 1, 1 << 33, 1.0, false, &b).unwrap_err()), ("quantize", "k"));
        assert_eq!(
            field_of(validate(Direction::Quantize, 1 << 33, 64, 1.0, false, &b).unwrap_err()),
            ("quantize", "rows")
        );
    }
}
