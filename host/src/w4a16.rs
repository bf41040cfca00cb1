//! W4A16 on sm_90a: f16 or bf16 activations times NVFP4 weights (docs/w4a16.md). This module
//! holds the one-time step that prepares a weight matrix for it: [`prepack`] moves the K
//! permutation that W4A4 applies to the tokens into the weights, folds each block's scale sign
//! into its codes, and re-encodes the scales so that the kernel converts them to f16 or bf16 with
//! one instruction (`nvfp4_gemm_abi::sm90::w4a16`). The result has the sizes and the blocked scale
//! layout of the matrix it came from, so it uploads like any NVFP4 operand.
//!
//! The f16 kernels (`sm90_w4a16_gemm{,_t64,_n192,_decode}`) run the W4A4 kernels' tiles and
//! work lists ([`layout`]) on tables whose token maps point at the caller's activations
//! ([`tables_with`]); [`W4a16Plan`] launches them (one launch per call, no dequantization). The
//! bf16 kernels are not built (docs/w4a16.md): asking for them is [`Error::Unsupported`], as is
//! W4A16 on sm_100a, which multiplies NVFP4 operands natively.

use crate::device::{Arch, Gpu};
use crate::driver::launch::{launch, set_max_dynamic_smem};
use crate::driver::module::Kernel;
use crate::driver::tensor_map::{DriverEncoder, TiledMapEncoder};
use crate::error::{Error, Result};
use crate::overlap::{self, Span};
use crate::plan::{Nvfp4Operand, Output};
use crate::problem::{BufferView, CallBuffers, GroupBuffers, OutputType, Problem, BUFFER_ALIGN};
use crate::sm90::Sm90Layout;
use crate::tables::upload_tables;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use nvfp4_format::Nvfp4Matrix;
pub use nvfp4_gemm_abi::sm90::w4a16::Activations;
use nvfp4_gemm_abi::sm90::w4a16::{prepack_chunk_row, prepacked_scale};
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
/// sm_90a operand. f16: each chunk row's codes permuted, the scales as given; bf16: the codes
/// permuted with each block's scale sign folded in (a zero scale's codes zeroed), the scales
/// re-encoded (`nvfp4_gemm_abi::sm90::w4a16::prepacked_scale`).
pub fn prepack(m: &Nvfp4Matrix, activations: Activations) -> Result<W4a16Weights> {
    let (rows, k) = (m.rows(), m.k());
    if k % CHUNK_K as usize != 0 {
        return Err(Error::InvalidProblem(format!("k = {k} is not a multiple of {CHUNK_K}")));
    }
    let chunk_bytes = CHUNK_K as usize / 2;
    let mut values = vec![0u8; m.values().len()];
    for i in 0..rows {
        for c in 0..k / CHUNK_K as usize {
            let at = i * k / 2 + c * chunk_bytes;
            let row: &[u8; 32] = m.values()[at..at + chunk_bytes].try_into().expect("32 bytes");
            let scale = |b: usize| m.scale_code(i, 4 * c + b);
            let fold = activations == Activations::Bf16;
            let negate = core::array::from_fn(|b| fold && scale(b) & 0x80 != 0);
            let zero = core::array::from_fn(|b| fold && scale(b) & 0x7F == 0);
            values[at..at + chunk_bytes].copy_from_slice(&prepack_chunk_row(row, negate, zero));
        }
    }
    // Every byte of the blocked buffer, padding included (what padding holds reaches only rows
    // and columns that are never stored; re-encoded, a finite padding byte stays finite).
    let scales = match activations {
        Activations::F16 => m.scales().to_vec(),
        Activations::Bf16 => m.scales().iter().map(|&b| prepacked_scale(b)).collect(),
    };
    Ok(W4a16Weights { rows, k, values, scales, global_scale: m.global_scale() })
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

/// The W4A16 kernel (f16 activations) of a [`layout`].
pub fn kernel_name(layout: &Sm90Layout) -> &'static str {
    nvfp4_gemm_abi::sm90::w4a16::kernel_name(layout.config)
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

/// One group's buffers of a [`W4a16Plan::run`]. Borrowed for the call, never copied.
pub struct W4a16Args<'a> {
    /// The activations A, `m × K` f16, row-major in natural order (16-byte aligned).
    pub activations: &'a dyn DevicePtr<half::f16>,
    /// The weights B, prepacked by [`prepack`] for f16 and uploaded: values `n · K/2` bytes,
    /// scales in the blocked layout (the sizes of the NVFP4 matrix).
    pub weights: Nvfp4Operand<'a>,
    /// C, `m × n` elements of the problem's output type.
    pub c: Output<'a>,
    /// Multiplier of the fp32 accumulator: the weights' global scale times the caller's factor.
    pub alpha: f32,
}

/// A W4A16 problem planned for one sm_90a GPU (f16 activations): the layout (the W4A4 tiles and
/// work list), the kernel, and the device tables, allocated once. A call validates every buffer,
/// uploads the tables when an address or alpha changed since the previous call, and launches the
/// GEMM — no dequantization, no host synchronization.
pub struct W4a16Plan {
    problem: Problem,
    layout: Sm90Layout,
    gemm: Kernel,
    groups: CudaSlice<u8>,
    maps: CudaSlice<u8>,
    work: CudaSlice<u8>,
    /// Activation, weight and C addresses and alphas of the last upload.
    signature: Vec<u64>,
}

/// The buffers of a group, in the order of the overlap check's ids.
const W4A16_FIELDS: [&str; 4] = ["activations", "b.values", "b.scales", "c"];

impl W4a16Plan {
    /// Plans `problem` for `gpu` with `activations` of that type. Errors: sm_100a (W4A16 is an
    /// sm_90a path: Blackwell multiplies NVFP4 operands natively) and bf16 activations (not built
    /// yet), both [`Error::Unsupported`], before any allocation.
    pub fn new(gpu: &Gpu, problem: Problem, activations: Activations) -> Result<W4a16Plan> {
        if gpu.arch() != Arch::Sm90a {
            return Err(Error::Unsupported(format!(
                "W4A16 runs on sm_90a; this GPU is {:?}, which multiplies NVFP4 operands natively (GemmPlan)",
                gpu.arch()
            )));
        }
        if activations == Activations::Bf16 {
            return Err(Error::Unsupported("W4A16 with bf16 activations is not built yet (docs/w4a16.md)".into()));
        }
        let layout = layout(&problem, gpu.sm_count());
        let stream = gpu.context().default_stream();
        let d = |e| Error::driver("allocating the plan's device tables", e);
        let gemm = gpu.function(kernel_name(&layout))?;
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
            gemm,
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
        kernel_name(&self.layout)
    }

    /// Runs the GEMM on `stream`. Every buffer is validated first (typed errors naming the group
    /// and field); on any error nothing is launched.
    pub fn run<'s>(&mut self, stream_arc: &'s Arc<CudaStream>, args: &'s mut [W4a16Args<'_>]) -> Result<()> {
        let stream: &CudaStream = stream_arc;
        let groups = self.problem.groups();
        if args.len() != groups.len() {
            return Err(Error::InvalidArgument {
                call: "w4a16 run",
                field: "args",
                reason: format!("{} groups given for {}", args.len(), groups.len()),
            });
        }
        let mut call = CallBuffers::new(stream);
        let mut buffers = Vec::with_capacity(args.len());
        let mut tokens = Vec::with_capacity(args.len());
        for (g, (a, s)) in args.iter_mut().zip(groups).enumerate() {
            let act = call.read(a.activations);
            let (b_values, b_scales) = (call.read(a.weights.values), call.read(a.weights.scales));
            let (c, c_type) = match &mut a.c {
                Output::F16(c) => (call.write(&mut **c), OutputType::F16),
                Output::Bf16(c) => (call.write(&mut **c), OutputType::Bf16),
            };
            let w = nvfp4_gemm_abi::scale_layout::blocked_bytes(s.n as u32, s.k as u32);
            let checks = [
                ("activations", act, s.m * s.k),
                ("b.values", b_values, s.n * s.k / 2),
                ("b.scales", b_scales, w),
                ("c", c, s.m * s.n),
            ];
            for (field, view, len) in checks {
                // A group without tokens reads and writes nothing: its buffers are not looked at
                // (as `GemmPlan::run`'s rules), only its output type and alpha.
                if s.m == 0 {
                    continue;
                }
                if view.len != len {
                    return Err(Error::group(
                        g,
                        field,
                        format!("has {} elements; the group needs exactly {len}", view.len),
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
            if c_type != self.problem.output() {
                return Err(Error::group(
                    g,
                    "c",
                    format!("is {c_type:?}; the problem's output is {:?}", self.problem.output()),
                ));
            }
            if !a.alpha.is_finite() {
                return Err(Error::group(g, "alpha", format!("{} is not finite", a.alpha)));
            }
            tokens.push(act.ptr);
            let none = BufferView { ptr: 0, len: 0 };
            buffers.push(GroupBuffers {
                a_values: none,
                a_scales: none,
                b_values,
                b_scales,
                c,
                c_type,
                alpha: a.alpha,
            });
        }
        let mut spans = Vec::with_capacity(4 * buffers.len());
        for (g, (b, (&t, s))) in buffers.iter().zip(tokens.iter().zip(groups)).enumerate() {
            if s.m == 0 {
                continue;
            }
            let id = 4 * g as u32;
            spans.extend([
                Span::new(id, BufferView { ptr: t, len: s.m * s.k }, 2, false),
                Span::new(id + 1, b.b_values, 1, false),
                Span::new(id + 2, b.b_scales, 1, false),
                Span::new(id + 3, b.c, 2, true),
            ]);
        }
        overlap::check("w4a16 run", &mut spans, overlap::group_fields(&W4A16_FIELDS))?;
        let signature: Vec<u64> = buffers
            .iter()
            .zip(&tokens)
            .flat_map(|(b, &t)| [t, b.b_values.ptr, b.b_scales.ptr, b.c.ptr, u64::from(b.alpha.to_bits())])
            .collect();
        if signature != self.signature {
            let (params, maps) = tables_with(&self.layout, &DriverEncoder, &self.problem, &buffers, &tokens)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use nvfp4_format::codec::{e2m1_to_f32, e4m3_to_f32};
    use nvfp4_format::layout::blocked_offset;
    use nvfp4_format::{random_matrix, InputDistribution, SplitMix64};
    use nvfp4_gemm_abi::sm90::w4a16::{packed_column, scale_bf16_bits, BF16_PRODUCT_EXPONENT};

    fn bf16(bits: u16) -> f64 {
        half::bf16::from_bits(bits).to_f64()
    }

    /// What a consumer thread of the W4A16 kernels computes from the prepacked bytes — thread `q`'s
    /// 8 bytes of each chunk row, decoder pair `p` (nibbles `p % 4` and `+ 4` of word `p / 4`), the
    /// scale of block `p / 2` — equals, for the natural column the pair stands for, the matrix's
    /// `code · scale` (times 2⁻¹⁴ through the f16 decode, 2⁻⁷ through the bf16 one), exactly in
    /// the 16-bit type; over random matrices whose scales include negative, zero and subnormal
    /// codes.
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
            assert_eq!(f.scales, m.scales(), "f16: the scales as given");
            assert_eq!((w.values.len(), w.scales.len()), (m.values().len(), m.scales().len()));
            // What thread `q` decodes from a prepacked buffer: pair `p` of its 8 bytes (nibbles
            // `p % 4` and `+ 4` of word `p / 4`), the natural column each value stands for, and
            // the scale byte of block `p / 2`.
            let view = |w: &W4a16Weights, i: usize, c: usize, q: u32, p: u32, nibble: u32| {
                let bytes = &w.values[i * k / 2 + c * 32 + 8 * q as usize..][..8];
                let word = u32::from_le_bytes(bytes[4 * (p / 4) as usize..][..4].try_into().unwrap());
                let code = ((word >> (4 * nibble)) & 0xF) as u8;
                let col = 64 * c + packed_column(q, p / 4, nibble) as usize;
                (e2m1_to_f32(code) as f64, col, w.scales[blocked_offset(i, 4 * c + (p / 2) as usize, k)])
            };
            for i in 0..rows {
                for c in 0..k / 64 {
                    for q in 0..4u32 {
                        for p in 0..8u32 {
                            for (u, nibble) in [(0, p % 4), (1, p % 4 + 4)] {
                                let exact = |col: usize| m.block_scaled_value(i, col) as f64;
                                // f16: the decoder's value ×2⁻¹⁴ times the e4m3 scale, as W4A4.
                                let (value, col, sbyte) = view(&f, i, c, q, p, nibble);
                                assert_eq!(col % 2, u, "the pair's low value is its even column");
                                let via_f16 = value * 2f64.powi(-14) * e4m3_to_f32(sbyte) as f64;
                                let want = exact(col) * 2f64.powi(-14);
                                assert_eq!(via_f16, want, "f16: case {case} row {i} col {col}");
                                assert_eq!(half::f16::from_f64(want).to_f64(), want, "exact in f16");
                                // bf16: the decoder's value ×2⁻¹²⁶ times the re-encoded scale.
                                let (value, col, sbyte) = view(&w, i, c, q, p, nibble);
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
