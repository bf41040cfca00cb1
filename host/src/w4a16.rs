//! W4A16 on sm_90a: f16 or bf16 activations times NVFP4 weights (docs/w4a16.md). W4A16 is a
//! token kind of the problem ([`crate::TokenKind::Dense`]): [`crate::GemmPlan`] and
//! [`crate::MoePlan`] run it with the W4A4 kernels' tiles and work lists and the W4A16 twins of
//! the GEMM kernels (`sm90_w4a16_gemm*` for f16, `sm90_w4a16_bf16_gemm*` for bf16), their token
//! maps over the caller's activations (no dequantization). This module holds the one-time step
//! that prepares a weight matrix for it: [`prepack`] moves the K permutation that W4A4 applies to
//! the tokens into the weights, stores each code's bits where the kernel's decoder finds them,
//! folds each block's scale sign into its codes (bf16), and pairs and re-encodes the scales so
//! that the kernel converts them with one or two instructions per k-step
//! (`nvfp4_gemm_abi::sm90::w4a16`). The result has the sizes and the blocked scale layout of the
//! matrix it came from, so it uploads like any NVFP4 operand. W4A16 on sm_100a, which multiplies
//! NVFP4 operands natively, is [`crate::Error::Unsupported`].
//!
//! The prepack runs on the CPU ([`prepack`], a matrix in host memory: the reference) or on the
//! GPU ([`Prepacker`]: a stack of experts' matrices in device memory, on a stream, bit for bit
//! the CPU's result; `sm90_w4a16_prepack`, `nvfp4_gemm_abi::sm90::prepack`).
//!
//! ```no_run
//! use nvfp4_gemm::w4a16::{Activations, Prepacker, WeightStack};
//! use nvfp4_gemm::{DeviceNvfp4, Gpu, Nvfp4Operand};
//!
//! let gpu = Gpu::new(0)?;
//! let stream = gpu.context().default_stream();
//! let stack = WeightStack { experts: 8, rows: 2048, k: 7168 };
//! let sizes = stack.sizes()?;
//! let w = DeviceNvfp4::alloc_zeros_sized(&stream, sizes)?; // the experts' NVFP4 weights (filled elsewhere)
//! let mut packed = DeviceNvfp4::alloc_zeros_sized(&stream, sizes)?;
//! let prepacker = Prepacker::new(&gpu)?; // sm_90a only
//! let input = Nvfp4Operand { values: &w.values, scales: &w.scales };
//! prepacker.prepack(&stream, input, stack, Activations::Bf16, packed.operand_mut())?; // no sync
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::device::{Arch, Gpu};
use crate::driver::launch::launch;
use crate::driver::module::Kernel;
use crate::error::{Error, Result};
use crate::overlap::{self, Span};
use crate::plan::Nvfp4Operand;
use crate::problem::{BufferView, CallBuffers, Nvfp4Sizes, BUFFER_ALIGN};
use crate::quantize::{DenseFloat, Nvfp4OperandMut};
use cudarc::driver::CudaStream;
use nvfp4_format::layout::blocked_offset;
use nvfp4_format::Nvfp4Matrix;
use nvfp4_gemm_abi::sm90::prepack::{self as abi, folds, PrepackParams, PREPACK_KERNEL};
pub use nvfp4_gemm_abi::sm90::w4a16::Activations;
use nvfp4_gemm_abi::sm90::w4a16::{prepack_chunk_row, prepacked_scale, scale_source, Decoder};
use nvfp4_gemm_abi::sm90::CHUNK_K;
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
            let word = u32::from_le_bytes(core::array::from_fn(|b| m.scale_code(i, 4 * c + b)));
            let (negate, zero) = folds(word, activations);
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

/// [`prepack`] of every matrix of a stack held as [`Prepacker::prepack`] takes it (values and
/// blocked scales of each matrix back to back): the CPU reference of the GPU prepack. Errors as
/// [`WeightStack::sizes`], and [`Error::InvalidProblem`] when a buffer is not the stack's size.
pub fn prepack_stack(
    stack: WeightStack,
    values: &[u8],
    scales: &[u8],
    activations: Activations,
) -> Result<(Vec<u8>, Vec<u8>)> {
    let sizes = stack.sizes()?;
    if values.len() != sizes.values || scales.len() != sizes.scales {
        return Err(Error::InvalidProblem(format!(
            "{stack:?}: {} value and {} scale bytes, expected {} and {}",
            values.len(),
            scales.len(),
            sizes.values,
            sizes.scales
        )));
    }
    let (mut v, mut s) = (Vec::with_capacity(sizes.values), Vec::with_capacity(sizes.scales));
    if stack.experts == 0 {
        return Ok((v, s));
    }
    let (per_v, per_s) = (sizes.values / stack.experts, sizes.scales / stack.experts);
    for (mv, ms) in values.chunks_exact(per_v.max(1)).zip(scales.chunks_exact(per_s.max(1))) {
        let m = Nvfp4Matrix::new(stack.rows, stack.k, mv.to_vec(), ms.to_vec(), 1.0)
            .map_err(|e| Error::InvalidProblem(format!("{stack:?}: {e}")))?;
        let w = prepack(&m, activations)?;
        v.extend_from_slice(&w.values);
        s.extend_from_slice(&w.scales);
    }
    Ok((v, s))
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

/// The shape of a stack of weight matrices as the library stores an expert tensor: `experts`
/// matrices of `rows × k`, values `experts × rows × k/2` bytes (each matrix's rows back to back),
/// scales `experts × blocked_bytes(rows, k)` bytes (each matrix's 128x4 blocked scales, padding
/// rows included, back to back). One matrix is `experts = 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightStack {
    /// Matrices in the stack.
    pub experts: usize,
    /// Rows (N) of each.
    pub rows: usize,
    /// Values per row (K, a positive multiple of 64).
    pub k: usize,
}

impl WeightStack {
    /// The stack's buffer sizes in bytes (`k` a positive multiple of 64).
    pub fn sizes(&self) -> Result<Nvfp4Sizes> {
        if crate::rules::k_rule(self.k).is_some() {
            return Err(invalid("k", k_reason(self.k)));
        }
        let too_large = |_| invalid("experts", format!("{self:?} does not fit this machine's address space"));
        // In u128 (no product of three usizes overflows it), then back.
        let (e, r, k) = (self.experts as u128, self.rows as u128, self.k as u128);
        let values = usize::try_from(e * r * k / 2).map_err(too_large)?;
        // `rules::blocked_bytes`: rows padded to 128, scale columns (k/16) to 4.
        let scales = usize::try_from(e * r.div_ceil(128) * k.div_ceil(64) * 512).map_err(too_large)?;
        Ok(Nvfp4Sizes { values, scales })
    }
}

/// The buffers of a GPU prepack as addresses and lengths in bytes: the typed entry of bindings
/// ([`Prepacker::prepack_views`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrepackViews {
    /// The stack's packed values.
    pub values: BufferView,
    /// The stack's blocked scales.
    pub scales: BufferView,
    /// The prepacked values (written).
    pub out_values: BufferView,
    /// The prepacked scales (written).
    pub out_scales: BufferView,
}

/// The call's name in errors.
const CALL: &str = "w4a16 prepack";

fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidArgument { call: CALL, field, reason: reason.into() }
}

fn k_reason(k: usize) -> String {
    crate::rules::k_rule(k).unwrap_or_else(|| format!("{k} is too large"))
}

/// Checks a GPU prepack's arguments and returns the kernel's parameters, or `None` when the stack
/// is empty (`experts = 0` or `rows = 0`: nothing to do, the buffers unchecked). Pure (no GPU):
/// what [`Prepacker::prepack`] checks before its launch, and what the device-model tests launch
/// the kernel with.
///
/// Errors, each [`Error::InvalidArgument`] naming its field unless said otherwise: `k` not a
/// positive multiple of 64; a stack too large for the kernel's 32-bit item indices
/// (`nvfp4_gemm_abi::sm90::prepack::MAX_ITEMS`: field `experts`); a buffer whose length is not
/// exactly [`WeightStack::sizes`] or whose address is not 16-byte aligned; [`Error::Overlap`] for
/// an output sharing a byte with another buffer (the inputs may share memory, not in place).
pub fn prepack_params(
    stack: WeightStack,
    activations: Activations,
    views: PrepackViews,
) -> Result<Option<PrepackParams>> {
    let WeightStack { experts, rows, k } = stack;
    let sizes = stack.sizes()?;
    if experts == 0 || rows == 0 {
        return Ok(None);
    }
    let too_large = || invalid("experts", format!("{experts} × {rows} × {k} is too large for one launch"));
    let (e32, r32, k32) = (
        u32::try_from(experts).map_err(|_| too_large())?,
        u32::try_from(rows).map_err(|_| too_large())?,
        u32::try_from(k).map_err(|_| invalid("k", k_reason(k)))?,
    );
    if abi::items(e32, r32, k32) >= abi::MAX_ITEMS {
        return Err(too_large());
    }
    let checks = [
        ("values", views.values, sizes.values),
        ("scales", views.scales, sizes.scales),
        ("out_values", views.out_values, sizes.values),
        ("out_scales", views.out_scales, sizes.scales),
    ];
    for (field, view, len) in checks {
        if view.len != len {
            return Err(invalid(
                field,
                format!("has {} bytes; {experts} matrices of {rows} × {k} need exactly {len}", view.len),
            ));
        }
        if view.ptr % BUFFER_ALIGN != 0 {
            return Err(invalid(field, format!("address {:#x} is not {BUFFER_ALIGN}-byte aligned", view.ptr)));
        }
    }
    let mut spans = [
        Span::new(0, views.values, 1, false),
        Span::new(1, views.scales, 1, false),
        Span::new(2, views.out_values, 1, true),
        Span::new(3, views.out_scales, 1, true),
    ];
    overlap::check(CALL, &mut spans, overlap::fields(&["values", "scales", "out_values", "out_scales"]))?;
    Ok(Some(PrepackParams {
        values: views.values.ptr,
        scales: views.scales.ptr,
        out_values: views.out_values.ptr,
        out_scales: views.out_scales.ptr,
        rows: r32,
        k: k32,
        experts: e32,
        bf16: u32::from(activations == Activations::Bf16),
    }))
}

/// The GPU prepack of a [`Gpu`] (the kernel `sm90_w4a16_prepack`, looked up once): a stack of
/// experts' NVFP4 weights in device memory ([`WeightStack`]) into new buffers of the same sizes,
/// prepacked for f16 or bf16 activations, bit for bit what [`prepack`] makes of each matrix
/// (padding rows of the scales included). Out of place: the outputs may not overlap the inputs.
/// Calls check every argument first (nothing is launched on an error, nothing is written but the
/// outputs), allocate nothing and never synchronize the host, so they can be captured in a CUDA
/// graph. One launch, one pass over the weights (each byte read and written once).
#[derive(Debug)]
pub struct Prepacker {
    kernel: Kernel,
    sm_count: u32,
}

impl Prepacker {
    /// Looks up the kernel in `gpu`'s image. [`Error::Unsupported`] on sm_100a, where W4A16 does
    /// not run (it multiplies NVFP4 operands natively).
    pub fn new(gpu: &Gpu) -> Result<Prepacker> {
        if gpu.arch() != Arch::Sm90a {
            return Err(crate::plan::w4a16_unsupported(gpu.arch()));
        }
        Ok(Prepacker { kernel: gpu.function(PREPACK_KERNEL)?, sm_count: gpu.sm_count() })
    }

    /// Prepacks the stack `input` (exactly [`WeightStack::sizes`] bytes each) for `activations`
    /// into `out` (the same sizes) on `stream`. Errors (before any launch): as
    /// [`prepack_params`]. An empty stack launches nothing.
    pub fn prepack(
        &self,
        stream: &Arc<CudaStream>,
        input: Nvfp4Operand<'_>,
        stack: WeightStack,
        activations: Activations,
        out: Nvfp4OperandMut<'_>,
    ) -> Result<()> {
        let mut call = CallBuffers::new(stream);
        let views = PrepackViews {
            values: call.read(input.values),
            scales: call.read(input.scales),
            out_values: call.write(out.values),
            out_scales: call.write(out.scales),
        };
        // SAFETY: live device buffers of these lengths (cudarc's), kept alive by the guards past
        // the launch.
        unsafe { self.prepack_views(stream, stack, activations, views) }
    }

    /// [`Prepacker::prepack`] on buffers given as addresses and lengths in bytes: the typed entry
    /// of bindings, with the same checks.
    ///
    /// # Safety
    /// As [`crate::GemmPlan::run_views`], for every buffer.
    pub unsafe fn prepack_views(
        &self,
        stream: &CudaStream,
        stack: WeightStack,
        activations: Activations,
        views: PrepackViews,
    ) -> Result<()> {
        let Some(params) = prepack_params(stack, activations, views)? else { return Ok(()) };
        let geometry = abi::prepack_launch(abi::items(params.experts, params.rows, params.k), self.sm_count);
        // SAFETY: `prepack_params` checked the shape, lengths, alignment and disjointness the
        // kernel relies on (its `# Safety`); the caller's contract for the memory.
        unsafe { launch(&self.kernel, stream, geometry, &params) }
    }
}

/// The activations' type of a 16-bit float type (`f16` or `bf16`).
pub fn activations_of<T: DenseFloat>() -> Activations {
    T::ACTIVATIONS
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvfp4_format::codec::{e2m1_to_f32, e4m3_to_f32};
    use nvfp4_format::{random_matrix, InputDistribution, SplitMix64};
    use nvfp4_gemm_abi::sm90::w4a16::{packed_column, scale_bf16_bits, Decoder, BF16_PRODUCT_EXPONENT};

    fn views(stack: WeightStack) -> PrepackViews {
        let s = stack.sizes().unwrap();
        PrepackViews {
            values: BufferView { ptr: 0x1000_0000_0000, len: s.values },
            scales: BufferView { ptr: 0x2000_0000_0000, len: s.scales },
            out_values: BufferView { ptr: 0x3000_0000_0000, len: s.values },
            out_scales: BufferView { ptr: 0x4000_0000_0000, len: s.scales },
        }
    }

    fn field_of(e: Error) -> &'static str {
        match e {
            Error::InvalidArgument { call: CALL, field, .. } => field,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn the_stack_prepack_is_each_matrix_prepacked() {
        let stack = WeightStack { experts: 3, rows: 20, k: 128 };
        let sizes = stack.sizes().unwrap();
        let mut rng = SplitMix64::new(5);
        let mut values = vec![0u8; sizes.values];
        rng.fill_bytes(&mut values);
        let scales = rng.e4m3_bytes(sizes.scales);
        let (per_v, per_s) = (sizes.values / 3, sizes.scales / 3);
        for act in [Activations::F16, Activations::Bf16] {
            let (v, s) = prepack_stack(stack, &values, &scales, act).unwrap();
            for e in 0..3 {
                let (mv, ms) = (&values[e * per_v..][..per_v], &scales[e * per_s..][..per_s]);
                let w = prepack(&Nvfp4Matrix::new(20, 128, mv.to_vec(), ms.to_vec(), 1.0).unwrap(), act).unwrap();
                assert_eq!((&v[e * per_v..][..per_v], &s[e * per_s..][..per_s]), (&w.values[..], &w.scales[..]));
            }
        }
        assert!(prepack_stack(stack, &values[1..], &scales, Activations::F16).is_err());
        let empty = WeightStack { experts: 0, rows: 20, k: 128 };
        assert_eq!(prepack_stack(empty, &[], &[], Activations::F16).unwrap(), (vec![], vec![]));
    }

    #[test]
    fn stack_sizes_are_the_matrices_back_to_back() {
        let stack = WeightStack { experts: 3, rows: 130, k: 192 };
        let s = stack.sizes().unwrap();
        assert_eq!((s.values, s.scales), (3 * 130 * 96, 3 * crate::rules::blocked_bytes(130, 192)));
        assert_eq!(WeightStack { experts: 0, ..stack }.sizes().unwrap(), Nvfp4Sizes { values: 0, scales: 0 });
        assert_eq!(field_of(WeightStack { k: 100, ..stack }.sizes().unwrap_err()), "k");
        assert_eq!(field_of(WeightStack { experts: usize::MAX, ..stack }.sizes().unwrap_err()), "experts");
    }

    #[test]
    fn good_prepack_arguments_give_the_kernel_parameters() {
        let stack = WeightStack { experts: 3, rows: 130, k: 192 };
        let v = views(stack);
        let p = prepack_params(stack, Activations::Bf16, v).unwrap().unwrap();
        assert_eq!(
            p,
            PrepackParams {
                values: 0x1000_0000_0000,
                scales: 0x2000_0000_0000,
                out_values: 0x3000_0000_0000,
                out_scales: 0x4000_0000_0000,
                rows: 130,
                k: 192,
                experts: 3,
                bf16: 1
            }
        );
        assert_eq!(prepack_params(stack, Activations::F16, v).unwrap().unwrap().bf16, 0);
        // An empty stack: nothing to do, whatever the buffers.
        let junk = PrepackViews { values: BufferView { ptr: 3, len: 7 }, ..v };
        assert_eq!(prepack_params(WeightStack { experts: 0, ..stack }, Activations::F16, junk).unwrap(), None);
        assert_eq!(prepack_params(WeightStack { rows: 0, ..stack }, Activations::F16, junk).unwrap(), None);
        // The inputs may share memory.
        let shared = PrepackViews { scales: BufferView { ptr: v.values.ptr, len: v.scales.len }, ..v };
        assert!(prepack_params(stack, Activations::F16, shared).is_ok());
        // DeepSeek's tensors fit one launch.
        for (rows, k) in [(7168, 2048), (2048, 7168)] {
            let big = WeightStack { experts: 256, rows, k };
            assert!(prepack_params(big, Activations::Bf16, views(big)).unwrap().is_some());
        }
    }

    #[test]
    fn bad_prepack_arguments_are_typed_errors() {
        let stack = WeightStack { experts: 2, rows: 72, k: 128 };
        type Breaker = fn(&mut PrepackViews);
        let cases: [(&str, Breaker); 8] = [
            ("values", |v| v.values.len -= 1),
            ("scales", |v| v.scales.len = 2 * 72 * 8), // the plain layout's size, not padded
            ("out_values", |v| v.out_values.len += 16),
            ("out_scales", |v| v.out_scales.len -= 512),
            ("values", |v| v.values.ptr += 8),
            ("scales", |v| v.scales.ptr += 4),
            ("out_values", |v| v.out_values.ptr += 1),
            ("out_scales", |v| v.out_scales.ptr += 2),
        ];
        for (field, break_it) in cases {
            let mut v = views(stack);
            break_it(&mut v);
            assert_eq!(field_of(prepack_params(stack, Activations::F16, v).unwrap_err()), field, "{field}");
        }
        for k in [0, 48, 100] {
            let e = prepack_params(WeightStack { k, ..stack }, Activations::F16, views(stack)).unwrap_err();
            assert_eq!(field_of(e), "k");
        }
        let huge = WeightStack { experts: 1 << 12, rows: 1 << 14, k: 1 << 11 };
        assert_eq!(field_of(prepack_params(huge, Activations::F16, views(huge)).unwrap_err()), "experts");
        let wide = WeightStack { experts: 1, rows: 1, k: 1 << 33 };
        assert_eq!(field_of(prepack_params(wide, Activations::F16, views(wide)).unwrap_err()), "k");
        // Outputs overlapping an input or each other, in place included.
        let overlaps: [((&str, &str), Breaker); 4] = [
            (("out_values", "values"), |v| v.out_values.ptr = v.values.ptr),
            (("out_scales", "scales"), |v| v.out_scales.ptr = v.scales.ptr + 16),
            (("out_scales", "out_values"), |v| v.out_scales.ptr = v.out_values.ptr + 64),
            (("out_values", "scales"), |v| v.out_values.ptr = v.scales.ptr - 16),
        ];
        for (names, break_it) in overlaps {
            let mut v = views(stack);
            break_it(&mut v);
            match prepack_params(stack, Activations::Bf16, v).unwrap_err() {
                Error::Overlap { call: CALL, output, other } => assert_eq!((output.field, other.field), names),
                other => panic!("{names:?}: {other:?}"),
            }
        }
    }

    /// A W4A16 call's buffers for `p`, stacked from `base` (activations, then weights, then C,
    /// each part 16-byte aligned), as `run_stacked` splits them.
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
