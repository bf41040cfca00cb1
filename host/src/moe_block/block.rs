//! [`ExpertBlock`]: the whole MoE expert block on the GPU (docs/moe-block.md §7) — routing, the
//! tokens gathered (and quantized), the first grouped GEMM, the activation (and the
//! requantization), the second grouped GEMM and the weighted combine — planned once for a bound
//! on the tokens and run per step with every size the router decides read on the device: no
//! host synchronization, no device allocation per call, capturable in a CUDA graph.
//!
//! The arithmetic is the contract of `nvfp4_format::moe_block::reference`, with the options of
//! that module ([`BlockOptions`]); the GEMMs are two device-sized [`MoePlan`]s, one group per
//! local expert.

use super::route::{route_scratch_len, BlockKernels, CombineViews, IdType, RouteViews, Routing, WeightType};
use super::tokens::{BlockOutput, GatherInputs};
use crate::device::{Arch, Gpu};
use crate::device_sizes::MoeOptions;
use crate::error::{Error, Result};
use crate::moe::{
    interleave_w13_row, ActivatedOutput, MoeBuffers, MoePlan, MoeProblem, MoeTokens, ScheduledCall, TokenLayout,
};
use crate::moe_problem::GlobalScale;
use crate::plan::Nvfp4Operand;
use crate::problem::{Activations, BufferView, CallBuffers, OutputType, TokenKind};
use crate::quantize::{DenseFloat, Nvfp4OperandMut, Quantizer};
use crate::w4a16::{Prepacker, WeightStack};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DriverError};
use half::{bf16, f16};
use nvfp4_format::checkpoint::{Checkpoint, LoadOptions, LoadedExperts, PlainWeight};
use nvfp4_format::layout::plain_to_blocked;
pub use nvfp4_format::moe_block::{Activation, BlockOptions, Dense16, Precision, RouterWeightAt};
use nvfp4_gemm_abi::moe::block::Activation as KernelActivation;
use nvfp4_gemm_abi::sm90::TokenWorkspace;
use std::sync::Arc;

const CALL: &str = "ExpertBlock";

/// A driver error while the block is planned.
fn planning(e: DriverError) -> Error {
    Error::driver("planning the MoE expert block", e)
}

fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidArgument { call: CALL, field, reason: reason.into() }
}

/// The shape of a block: the rank's local experts, the layer's sizes, and the bound on the tokens
/// of one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockShape {
    /// The global id of local expert 0 (expert parallelism: a rank owns a slice).
    pub first_expert: i64,
    /// Local experts `E`.
    pub experts: usize,
    /// Hidden size `H` (a positive multiple of 64).
    pub hidden: usize,
    /// Intermediate size `I` (a positive multiple of 64).
    pub intermediate: usize,
    /// Experts per token.
    pub top_k: usize,
    /// The most tokens a call may pass.
    pub max_tokens: usize,
}

impl BlockShape {
    /// The shape of a block of `experts` (their first id and count, H and I from their weights)
    /// for `top_k` experts per token and at most `max_tokens` tokens; `None` without experts.
    pub fn of_experts(experts: &LoadedExperts, top_k: usize, max_tokens: usize) -> Option<BlockShape> {
        let first = experts.experts.first()?;
        Some(BlockShape {
            first_expert: experts.first_expert as i64,
            experts: experts.experts.len(),
            hidden: first.w13.k,
            intermediate: first.w2.k,
            top_k,
            max_tokens,
        })
    }
}

/// The experts `load` names, read from a checkpoint's safetensors `shards` by
/// `nvfp4_format::checkpoint` (every tensor's name, dtype, shape and scale checked), for the
/// bindings' checkpoint constructors. Errors: [`Error::InvalidArgument`] of `call`: `experts` for
/// an empty range, `shards` for whatever the loader refuses (its message names the tensor).
pub fn load_checkpoint_experts(call: &'static str, shards: &[&[u8]], load: &LoadOptions<'_>) -> Result<LoadedExperts> {
    if load.experts.is_empty() {
        return Err(crate::error::invalid(call, "experts", "an empty range; the block needs at least one expert"));
    }
    let refused = |e: nvfp4_format::checkpoint::CheckpointError| crate::error::invalid(call, "shards", e.to_string());
    Checkpoint::parse_shards(shards).map_err(refused)?.load_experts(load).map_err(refused)
}

/// A 16-bit device buffer of the block's type.
enum Dense {
    F16(CudaSlice<f16>),
    Bf16(CudaSlice<bf16>),
}

impl Dense {
    fn alloc(stream: &Arc<CudaStream>, dtype: Dense16, len: usize) -> Result<Dense> {
        // One element at least, so that every buffer has an address.
        let len = len.max(8);
        Ok(match dtype {
            Dense16::F16 => Dense::F16(stream.alloc_zeros::<f16>(len).map_err(planning)?),
            Dense16::Bf16 => Dense::Bf16(stream.alloc_zeros::<bf16>(len).map_err(planning)?),
        })
    }

    fn read<'s>(&'s self, call: &mut CallBuffers<'s>) -> BufferView {
        match self {
            Dense::F16(s) => call.read(s),
            Dense::Bf16(s) => call.read(s),
        }
    }

    fn write<'s>(&'s mut self, call: &mut CallBuffers<'s>) -> BufferView {
        match self {
            Dense::F16(s) => call.write(s),
            Dense::Bf16(s) => call.write(s),
        }
    }

    /// The buffer as a GEMM's 16-bit token operand (W4A16).
    fn tokens<'s>(&'s self, call: &mut CallBuffers<'s>) -> MoeTokens {
        let kind = match self {
            Dense::F16(_) => Activations::F16,
            Dense::Bf16(_) => Activations::Bf16,
        };
        MoeTokens::Dense { activations: self.read(call), kind }
    }
}

/// A GEMM's token operand: NVFP4 in the grouped layout, or 16-bit rows.
enum Tokens {
    Nvfp4 { values: CudaSlice<u8>, scales: CudaSlice<u8> },
    Dense(Dense),
}

impl Tokens {
    fn alloc(stream: &Arc<CudaStream>, p: &MoeProblem, options: &BlockOptions) -> Result<Tokens> {
        Ok(match options.precision {
            Precision::W4a4 => {
                let s = p.a_sizes();
                Tokens::Nvfp4 {
                    values: stream.alloc_zeros(s.values.max(16)).map_err(planning)?,
                    scales: stream.alloc_zeros(s.scales.max(16)).map_err(planning)?,
                }
            }
            Precision::W4a16 => Tokens::Dense(Dense::alloc(stream, options.dtype, p.token_rows() * p.k())?),
        })
    }

    /// The tokens as the GEMM that reads them takes them.
    fn operand<'s>(&'s self, call: &mut CallBuffers<'s>) -> MoeTokens {
        match self {
            Tokens::Nvfp4 { values, scales } => {
                MoeTokens::Nvfp4 { values: call.read(values), scales: call.read(scales) }
            }
            Tokens::Dense(d) => d.tokens(call),
        }
    }

    /// The output view of the kernel that writes these tokens (the quantizer's global scales for
    /// NVFP4, and the GEMM's token workspace when it is the writer's to fill).
    fn out<'s>(
        &'s mut self,
        p: &MoeProblem,
        call: &mut CallBuffers<'s>,
        global_scale: GlobalScale,
        workspace: Option<&'s mut CudaSlice<u8>>,
    ) -> BlockOutput {
        match self {
            Tokens::Nvfp4 { values, scales } => {
                let (v, s) = (call.write(values), call.write(scales));
                let a = p.a_sizes();
                let bytes = TokenWorkspace::bytes(p.token_rows(), p.k());
                BlockOutput::Nvfp4 {
                    values: BufferView { ptr: v.ptr, len: a.values },
                    scales: BufferView { ptr: s.ptr, len: a.scales },
                    global_scale,
                    workspace: workspace.map(|w| BufferView { ptr: call.write(w).ptr, len: bytes }),
                }
            }
            Tokens::Dense(d) => {
                let v = d.write(call);
                BlockOutput::Dense(BufferView { ptr: v.ptr, len: p.token_rows() * p.k() })
            }
        }
    }
}

/// One GEMM's weights of every local expert: values and blocked scales of each expert back to
/// back (W4A16: prepacked on the GPU), and each expert's alpha.
struct Weights {
    values: CudaSlice<u8>,
    scales: CudaSlice<u8>,
    per_values: usize,
    per_scales: usize,
    alphas: Vec<f32>,
}

impl Weights {
    /// Uploads `weights` (one per expert, `rows x k`), prepacking for W4A16 on the GPU; with
    /// `interleave = Some(I)` the rows in the order of the fused epilogue's W13
    /// ([`interleave_w13`]). Each expert's values go to the device as they are stored (through
    /// one expert's interleaved copy when asked) and its scales through one expert's blocked
    /// copy: the host holds no copy of the whole stack.
    fn upload(
        stream: &Arc<CudaStream>,
        prepacker: Option<(&Prepacker, Activations)>,
        weights: &[&PlainWeight],
        alphas: Vec<f32>,
        interleave: Option<usize>,
    ) -> Result<Weights> {
        let (rows, k) = (weights[0].rows, weights[0].k);
        let stack = WeightStack { experts: weights.len(), rows, k };
        let sizes = stack.sizes()?;
        let n = weights.len();
        let (per_values, per_scales) = (sizes.values / n, sizes.scales / n);
        let mut values = stream.alloc_zeros::<u8>(sizes.values).map_err(planning)?;
        let mut scales = stream.alloc_zeros::<u8>(sizes.scales).map_err(planning)?;
        let row_scales = k / 16;
        for (e, w) in weights.iter().enumerate() {
            if w.values.len() != per_values || w.plain_scales.len() != rows * row_scales {
                return Err(invalid(
                    "weights",
                    format!(
                        "expert {e}: {} value bytes and {} scales; {rows}x{k} needs {per_values} and {}",
                        w.values.len(),
                        w.plain_scales.len(),
                        rows * row_scales
                    ),
                ));
            }
            let moved = interleave.map(|inter| interleave_w13(w, inter));
            let (v, plain) = match &moved {
                None => (&w.values, &w.plain_scales),
                Some(m) => (&m.values, &m.plain_scales),
            };
            let blocked =
                plain_to_blocked(plain, rows, k).map_err(|err| invalid("weights", format!("expert {e}: {err}")))?;
            // Pageable copies: the driver has staged the bytes when each call returns, so the
            // host buffers may be dropped before the copies run.
            stream.memcpy_htod(v, &mut values.slice_mut(e * per_values..(e + 1) * per_values)).map_err(planning)?;
            stream
                .memcpy_htod(&blocked, &mut scales.slice_mut(e * per_scales..(e + 1) * per_scales))
                .map_err(planning)?;
        }
        let (values, scales) = match prepacker {
            None => (values, scales),
            Some((prepacker, activations)) => {
                let (mut pv, mut ps) = (
                    stream.alloc_zeros::<u8>(sizes.values).map_err(planning)?,
                    stream.alloc_zeros::<u8>(sizes.scales).map_err(planning)?,
                );
                prepacker.prepack(
                    stream,
                    Nvfp4Operand { values: &values, scales: &scales },
                    stack,
                    activations,
                    Nvfp4OperandMut { values: &mut pv, scales: &mut ps },
                )?;
                (pv, ps)
            }
        };
        Ok(Weights { values, scales, per_values, per_scales, alphas })
    }

    /// Each expert's values and scales as views for one call.
    fn views<'s>(&'s self, call: &mut CallBuffers<'s>) -> Vec<(BufferView, BufferView)> {
        let (v, s) = (call.read(&self.values), call.read(&self.scales));
        (0..self.alphas.len())
            .map(|e| {
                (
                    BufferView { ptr: v.ptr + (e * self.per_values) as u64, len: self.per_values },
                    BufferView { ptr: s.ptr + (e * self.per_scales) as u64, len: self.per_scales },
                )
            })
            .collect()
    }
}

/// The router's outputs, as [`ExpertBlock::run`] reads them.
#[derive(Clone, Copy)]
pub enum TopkIds<'a> {
    /// int32 `[T, top_k]`.
    I32(&'a dyn DevicePtr<i32>),
    /// int64 `[T, top_k]`.
    I64(&'a dyn DevicePtr<i64>),
}

/// The router's weights `[T, top_k]`.
#[derive(Clone, Copy)]
pub enum TopkWeights<'a> {
    /// f32.
    F32(&'a dyn DevicePtr<f32>),
    /// bf16.
    Bf16(&'a dyn DevicePtr<bf16>),
}

/// Where a W4A4 block on sm_90a computes the activation between its GEMMs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ActivationPlacement {
    /// The activation kernel (`moe_activate`) between the two GEMMs: every architecture and
    /// precision.
    #[default]
    Kernel,
    /// In the first GEMM's epilogue (sm_90a, W4A4): the GEMM's output `h` never reaches memory,
    /// one launch fewer; the first GEMM then runs the general kernels at every T (not the
    /// 16-token decode kernel). The same output bit for bit ([`crate::moe::ActivationEpilogue`]).
    FirstGemmEpilogue,
}

/// Where a block runs its two GEMMs' device schedulers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SchedulerPlacement {
    /// Each GEMM's own scheduler launch before its kernels (`sm90_schedule`, `sm100_schedule`).
    Launches,
    /// On sm_90a both in the token quantization's launch (`sm90_quantize_schedule`): two
    /// launches fewer per call, the schedulers' time behind the quantization's; the same output
    /// bit for bit (the same tables and lists). sm_100a has no such kernel: there each scheduler
    /// has its own launch. The default (docs/moe-block.md §8 gives its measured cost).
    #[default]
    InQuantization,
}

/// Where a block's NVFP4 tokens become the f16 operand its sm_90a GEMMs read (W4A4; W4A16's
/// GEMMs read the 16-bit tokens, sm_100a's the NVFP4 ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TokenDequantization {
    /// Each GEMM's own `sm90_dequant_tokens` launch, from the NVFP4 tokens in memory.
    #[default]
    Launches,
    /// In the kernels that quantize them (the gather for the first GEMM, the activation for the
    /// second), as they quantize (`nvfp4_gemm_abi::sm90::TokenWorkspace`): one launch fewer
    /// per GEMM, the same bytes. The second GEMM keeps its launch when the activation is in the
    /// first GEMM's epilogue. No effect where the block has no dequantization (W4A16, sm_100a).
    /// Not the default: it saves time at some sizes and costs it at others (docs/moe-block.md §8).
    InQuantizers,
}

/// How [`ExpertBlock::with_plan`] builds the block beyond its shape and options.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BlockPlan {
    /// Where the activation runs (W4A4 on sm_90a; [`ActivationPlacement::Kernel`] otherwise).
    pub activation: ActivationPlacement,
    /// Where the GEMMs' schedulers run.
    pub schedulers: SchedulerPlacement,
    /// Where the tokens are dequantized for the GEMMs (W4A4 on sm_90a).
    pub dequantization: TokenDequantization,
}

/// The whole MoE expert block for one GPU (module docs): planned once by [`ExpertBlock::new`]
/// (weights uploaded, and prepacked on the GPU for W4A16; every buffer allocated for
/// [`BlockShape::max_tokens`]), run per step by [`ExpertBlock::run`].
///
/// Checked on an H100 against `nvfp4_format::moe_block::reference` (the module `block` of the
/// `gpu_moe_sm90` tests); on sm_100a built and its kernels run in the device model only.
///
/// ```no_run
/// use nvfp4_format::checkpoint::{Checkpoint, Convention, LoadOptions};
/// use nvfp4_gemm::moe_block::{Activation, BlockOptions, BlockShape, Dense16, ExpertBlock, Precision};
/// use nvfp4_gemm::moe_block::{TopkIds, TopkWeights};
/// use nvfp4_gemm::Gpu;
///
/// let gpu = Gpu::new(0)?;
/// let stream = gpu.context().default_stream();
/// // A ModelOpt NVFP4 checkpoint as stored; this rank holds experts 0..64 of layer 3.
/// let file = std::fs::read("model-00001.safetensors")?;
/// let checkpoint = Checkpoint::parse(&file)?;
/// let options = LoadOptions::new("model.layers.3.mlp", Convention::ModelOpt, 0..64);
/// let experts = checkpoint.load_experts(&options)?;
/// let shape = BlockShape { first_expert: 0, experts: 64, hidden: 2048, intermediate: 768, top_k: 8, max_tokens: 256 };
/// let block_options = BlockOptions::new(Activation::Silu, Precision::W4a4, Dense16::Bf16);
/// let mut block = ExpertBlock::new(&gpu, &stream, shape, block_options, &experts)?; // once
///
/// // Per step: the tokens and the router's choice, on the device.
/// let tokens = 100;
/// let x = stream.alloc_zeros::<half::bf16>(tokens * 2048)?;
/// let ids = stream.alloc_zeros::<i32>(tokens * 8)?;
/// let weights = stream.alloc_zeros::<f32>(tokens * 8)?;
/// let mut y = stream.alloc_zeros::<half::bf16>(tokens * 2048)?;
/// block.run(&stream, &x, tokens, TopkIds::I32(&ids), TopkWeights::F32(&weights), &mut y)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ExpertBlock {
    shape: BlockShape,
    options: BlockOptions,
    kernels: BlockKernels,
    quantizer: Quantizer,
    gemm1: MoePlan,
    gemm2: MoePlan,
    w13: Weights,
    w2: Weights,
    /// The activation runs in the first GEMM's epilogue ([`ActivationPlacement`]).
    fused: bool,
    /// The GEMMs' schedulers run in the quantization's launch ([`SchedulerPlacement`]).
    schedulers_in_quantization: bool,
    /// Each local expert's input scales (the W4A4 quantizers' global scales; 1 under W4A16, where
    /// nothing reads them): the first GEMM's, the second's.
    input_scales: (CudaSlice<f32>, CudaSlice<f32>),
    offsets: CudaSlice<u32>,
    slot_row: CudaSlice<u32>,
    row_token: CudaSlice<u32>,
    row_weight: CudaSlice<f32>,
    /// The multi-CTA routing's scratch, for `max_tokens` (`route_scratch_len`).
    route_scratch: CudaSlice<u32>,
    a: Tokens,
    h: Dense,
    z: Tokens,
    o: Dense,
}

impl ExpertBlock {
    /// Plans the block for `shape` and `options` on `gpu`, with the rank's local experts as the
    /// checkpoint loader returns them (`nvfp4_format::checkpoint`), on `stream` (used to upload
    /// and prepack; the call returns when the weights are on the device).
    ///
    /// Errors: [`Error::InvalidArgument`] for a shape or experts that do not match (H, I, the
    /// experts' count and numbering, a gated activation's W13 rows), scales that are not finite
    /// and positive; [`Error::Unsupported`] for W4A16 on sm_100a;
    /// the plans' and the driver's errors.
    pub fn new(
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        shape: BlockShape,
        options: BlockOptions,
        experts: &LoadedExperts,
    ) -> Result<ExpertBlock> {
        Self::with_plan(gpu, stream, shape, options, experts, BlockPlan::default())
    }

    /// [`ExpertBlock::new`] built as `plan` says. Errors as there, and [`Error::Unsupported`]
    /// for [`ActivationPlacement::FirstGemmEpilogue`] other than W4A4 on sm_90a.
    pub fn with_plan(
        gpu: &Gpu,
        stream: &Arc<CudaStream>,
        shape: BlockShape,
        options: BlockOptions,
        experts: &LoadedExperts,
        plan: BlockPlan,
    ) -> Result<ExpertBlock> {
        let BlockShape { experts: e, hidden, intermediate, top_k, max_tokens, first_expert } = shape;
        if e == 0 || experts.experts.len() != e {
            return Err(invalid("experts", format!("{} experts loaded for a block of {e}", experts.experts.len())));
        }
        if experts.first_expert as i64 != first_expert {
            return Err(invalid(
                "first_expert",
                format!("{first_expert}; the experts start at {}", experts.first_expert),
            ));
        }
        if top_k == 0 {
            return Err(invalid("top_k", "must be at least 1"));
        }
        let gated = options.activation.gated();
        let n1 = if gated { 2 * intermediate } else { intermediate };
        for (i, x) in experts.experts.iter().enumerate() {
            if (x.w13.rows, x.w13.k) != (n1, hidden) || (x.w2.rows, x.w2.k) != (hidden, intermediate) {
                return Err(invalid(
                    "experts",
                    format!(
                        "expert {i}: w13 {}x{}, w2 {}x{}; the shape needs w13 {n1}x{hidden}, w2 {hidden}x{intermediate}",
                        x.w13.rows, x.w13.k, x.w2.rows, x.w2.k
                    ),
                ));
            }
        }
        let w4a4 = options.precision == Precision::W4a4;
        let fused = plan.activation == ActivationPlacement::FirstGemmEpilogue;
        if fused && !(w4a4 && gpu.arch() == Arch::Sm90a) {
            return Err(Error::Unsupported(format!(
                "the activation in the first GEMM's epilogue is built for W4A4 on sm_90a; this block is {:?} on {:?}",
                options.precision,
                gpu.arch()
            )));
        }
        let schedulers_in_quantization =
            plan.schedulers == SchedulerPlacement::InQuantization && gpu.arch() == Arch::Sm90a;
        // The GEMMs read the tokens their quantizers wrote into their workspaces (W4A4, sm_90a).
        let in_quantizers =
            plan.dequantization == TokenDequantization::InQuantizers && w4a4 && gpu.arch() == Arch::Sm90a;
        let gemm_options = |caller_dequantizes| MoeOptions { caller_dequantizes, ..MoeOptions::default() };
        // W4A4: each expert's input scales (the quantizers' global scales, one per row's expert);
        // W4A16 reads none.
        let input_scales = |v: Vec<f32>, field| -> Result<Vec<f32>> {
            if !w4a4 {
                return Ok(vec![1.0; v.len()]);
            }
            for (x, s) in experts.experts.iter().zip(&v) {
                if !(s.is_finite() && *s > 0.0) {
                    return Err(invalid(field, format!("expert {}: {s} is not finite and positive", x.expert)));
                }
            }
            Ok(v)
        };
        let s13 = input_scales(experts.w13_input_scales(), "w13_input_scale")?;
        let s2 = input_scales(experts.w2_input_scales(), "w2_input_scale")?;
        let rows = max_tokens
            .checked_mul(top_k)
            .ok_or_else(|| invalid("max_tokens", format!("{max_tokens} × {top_k} rows overflow")))?;
        let output = match options.dtype {
            Dense16::F16 => OutputType::F16,
            Dense16::Bf16 => OutputType::Bf16,
        };
        let activations = match options.dtype {
            Dense16::F16 => Activations::F16,
            Dense16::Bf16 => Activations::Bf16,
        };
        let tokens = if w4a4 { TokenKind::Nvfp4 } else { TokenKind::Dense(activations) };
        let layout = TokenLayout::Contiguous { max_tokens: rows };
        let mut p1 = MoeProblem::new(e, n1, hidden, layout, output)?.with_tokens(tokens);
        if fused {
            p1 = p1.with_activation_epilogue(kernel_activation(options.activation), gated)?;
        }
        let p2 = MoeProblem::new(e, hidden, intermediate, layout, output)?.with_tokens(tokens);
        let prepacker = if w4a4 { None } else { Some((Prepacker::new(gpu)?, activations)) };
        let prepack = prepacker.as_ref().map(|(p, a)| (p, *a));
        let w13: Vec<&PlainWeight> = experts.experts.iter().map(|x| &x.w13).collect();
        let w2: Vec<&PlainWeight> = experts.experts.iter().map(|x| &x.w2).collect();
        let alphas = |g: &dyn Fn(&nvfp4_format::checkpoint::ExpertWeights, f32) -> f32,
                      s: &[f32]|
         -> Result<Vec<f32>> {
            experts
                .experts
                .iter()
                .zip(s)
                .map(|(x, &s)| {
                    let a = g(x, s);
                    if a.is_finite() && a > 0.0 {
                        Ok(a)
                    } else {
                        Err(invalid("experts", format!("expert {}: alpha {a} is not finite and positive", x.expert)))
                    }
                })
                .collect()
        };
        // The fused epilogue's W13: each 64-row slice the gate rows of 32 columns, then their up
        // rows (`interleave_w13_row`).
        let interleave = (fused && gated).then_some(intermediate);
        let w13 = Weights::upload(stream, prepack, &w13, alphas(&|x, s| x.w13.global_scale * s, &s13)?, interleave)?;
        let w2 = Weights::upload(stream, prepack, &w2, alphas(&|x, s| x.w2.global_scale * s, &s2)?, None)?;
        let block = ExpertBlock {
            shape,
            options,
            kernels: BlockKernels::new(gpu)?,
            quantizer: Quantizer::new(gpu)?,
            gemm1: MoePlan::with_options(gpu, p1.clone(), &gemm_options(in_quantizers))?,
            gemm2: MoePlan::with_options(gpu, p2.clone(), &gemm_options(in_quantizers && !fused))?,
            w13,
            w2,
            input_scales: (stream.clone_htod(&s13).map_err(planning)?, stream.clone_htod(&s2).map_err(planning)?),
            offsets: stream.alloc_zeros(e + 1).map_err(planning)?,
            slot_row: stream.alloc_zeros(rows.max(4)).map_err(planning)?,
            row_token: stream.alloc_zeros(rows.max(4)).map_err(planning)?,
            row_weight: stream.alloc_zeros(rows.max(4)).map_err(planning)?,
            route_scratch: stream
                .alloc_zeros(route_scratch_len(Routing { tokens: max_tokens, top_k, first_expert, experts: e }).max(4))
                .map_err(planning)?,
            a: Tokens::alloc(stream, &p1, &options)?,
            // The fused epilogue stores no `h`.
            h: Dense::alloc(stream, options.dtype, if fused { 0 } else { rows * n1 })?,
            fused,
            schedulers_in_quantization,
            z: Tokens::alloc(stream, &p2, &options)?,
            o: Dense::alloc(stream, options.dtype, rows * hidden)?,
        };
        stream.synchronize().map_err(planning)?;
        Ok(block)
    }

    /// The block's shape.
    pub fn shape(&self) -> &BlockShape {
        &self.shape
    }

    /// The block's options.
    pub fn options(&self) -> &BlockOptions {
        &self.options
    }

    /// One step: `y = block(x)` for `tokens` tokens (`x` and `y` `[tokens, H]` of the block's
    /// 16-bit type `T`, `ids` and `weights` `[tokens, top_k]`) on `stream`. No device memory is
    /// allocated (per GEMM, two host vectors: the experts' views and alphas) and the host never
    /// waits: the call can be captured in a CUDA graph (run it once outside capture first, so
    /// that the GEMMs' tables hold the weights).
    ///
    /// Errors (before any launch): [`Error::InvalidArgument`] for `tokens` above the bound, a
    /// buffer of the wrong length, `T` not the block's type; the kernels' argument errors.
    pub fn run<T: DenseFloat>(
        &mut self,
        stream: &Arc<CudaStream>,
        x: &dyn DevicePtr<T>,
        tokens: usize,
        ids: TopkIds<'_>,
        weights: TopkWeights<'_>,
        y: &mut dyn DevicePtrMut<T>,
    ) -> Result<()> {
        let mut user = CallBuffers::new(stream);
        let x = user.read(x);
        let (ids, ids_type) = match ids {
            TopkIds::I32(p) => (user.read(p), IdType::I32),
            TopkIds::I64(p) => (user.read(p), IdType::I64),
        };
        let (weights, weights_type) = match weights {
            TopkWeights::F32(p) => (user.read(p), WeightType::F32),
            TopkWeights::Bf16(p) => (user.read(p), WeightType::Bf16),
        };
        let y = user.write(y);
        let views = BlockViews { x, bf16: T::BF16, tokens, ids, ids_type, weights, weights_type, y };
        // SAFETY: cudarc's live buffers of these lengths, kept alive and ordered by `user` until
        // the launches are enqueued.
        unsafe { self.run_views(stream, views) }
    }

    /// [`ExpertBlock::run`] on buffers given as addresses and lengths (elements): the typed entry
    /// of bindings, with the same checks.
    ///
    /// # Safety
    /// As [`crate::GemmPlan::run_views`], for every buffer.
    pub unsafe fn run_views(&mut self, stream: &Arc<CudaStream>, v: BlockViews) -> Result<()> {
        let BlockShape { experts, first_expert, hidden, top_k, max_tokens, .. } = self.shape;
        let BlockViews { x: x_view, bf16, tokens, ids: ids_view, ids_type, weights: weights_view, weights_type, y } = v;
        if bf16 != (self.options.dtype == Dense16::Bf16) {
            return Err(invalid("x", format!("the block's type is {:?}", self.options.dtype)));
        }
        if tokens > max_tokens {
            return Err(invalid("tokens", format!("{tokens}; the block was planned for at most {max_tokens}")));
        }
        let slots = tokens * top_k;
        let at_input = self.options.router_weight_at == RouterWeightAt::Input;
        let gated = self.options.activation.gated();
        let activation = kernel_activation(self.options.activation);
        let p1 = self.gemm1.problem().clone();
        let p2 = self.gemm2.problem().clone();
        // The kernels check their own arguments before their launches; the tokens and the output
        // are checked here as well, so that a call with a wrong one launches nothing.
        for (field, view) in [("x", x_view), ("y", y)] {
            if view.len != tokens * hidden {
                let want = tokens * hidden;
                return Err(invalid(field, format!("has {} elements; [{tokens}, {hidden}] needs {want}", view.len)));
            }
        }
        // At most `slots` rows are routed: at T · top_k ≤ 16 the GEMMs launch their decode
        // kernel alone. Told before the calls are prepared: it picks their schedulers' kernels.
        self.gemm1.set_routed_rows(Some(slots));
        self.gemm2.set_routed_rows(Some(slots));
        // With the schedulers in the quantization's launch (they read only the routing's sizes),
        // both GEMMs' tables are prepared first and their launches enqueued later.
        let fused = self.fused;
        // Both prepared or neither (`with_plan` keeps the option to sm_90a, where a preparation
        // is never `None`).
        let scheduled = if self.schedulers_in_quantization {
            let out1 = first_out(&mut self.h, &mut self.z, &self.input_scales.1, fused);
            let io1 = GemmIo { offsets: &self.offsets, a: &self.a, weights: &self.w13, out: out1 };
            let s1 = prepare_gemm(&mut self.gemm1, stream, io1)?;
            let io2 = GemmIo { offsets: &self.offsets, a: &self.z, weights: &self.w2, out: GemmOut::C(&mut self.o) };
            s1.zip(prepare_gemm(&mut self.gemm2, stream, io2)?)
        } else {
            None
        };
        {
            let mut call = CallBuffers::new(stream);
            let offsets = call.write(&mut self.offsets);
            let slot_row = call.write(&mut self.slot_row);
            let row_token = call.write(&mut self.row_token);
            let row_weight = call.write(&mut self.row_weight);
            let route_scratch = call.write(&mut self.route_scratch);
            let cut = |v: BufferView, len: usize| BufferView { ptr: v.ptr, len };
            let routing = Routing { tokens, top_k, first_expert, experts };
            let route = RouteViews {
                ids: ids_view,
                ids_type,
                weights: at_input.then_some(weights_view),
                weights_type,
                offsets,
                slot_row: cut(slot_row, slots),
                row_token: cut(row_token, slots),
                row_weight: at_input.then(|| cut(row_weight, slots)),
                scratch: cut(route_scratch, route_scratch_len(routing)),
            };
            let gather = GatherInputs {
                x: x_view,
                tokens,
                row_token: Some(cut(row_token, p1.token_rows())),
                row_weight: at_input.then(|| cut(row_weight, p1.token_rows())),
                sizes: offsets,
            };
            let s13 = GlobalScale::PerGroup(call.read(&self.input_scales.0));
            let a_out = self.a.out(&p1, &mut call, s13, self.gemm1.token_workspace());
            // SAFETY: every view is a live buffer of this block or the caller's (the caller's
            // contract), of its length, kept alive until the launches are enqueued; the launches
            // run in stream order.
            unsafe {
                self.kernels.route(stream, routing, route)?;
                match &scheduled {
                    Some((s1, s2)) => {
                        let schedules = [s1.schedule, s2.schedule];
                        self.quantizer.quantize_schedule_gather_views(stream, &p1, bf16, &gather, a_out, schedules)?
                    }
                    None => self.quantizer.quantize_grouped_gather_views(stream, &p1, bf16, &gather, a_out)?,
                }
            }
        }
        let (s1, s2) = scheduled.unzip();
        let out1 = first_out(&mut self.h, &mut self.z, &self.input_scales.1, fused);
        run_gemm(
            &mut self.gemm1,
            stream,
            GemmIo { offsets: &self.offsets, a: &self.a, weights: &self.w13, out: out1 },
            s1,
        )?;
        if !fused {
            let mut call = CallBuffers::new(stream);
            let h = self.h.read(&mut call);
            let sizes = call.read(&self.offsets);
            let scale2 = GlobalScale::PerGroup(call.read(&self.input_scales.1));
            let z_out = self.z.out(&p2, &mut call, scale2, self.gemm2.token_workspace());
            // SAFETY: as above.
            unsafe {
                self.quantizer.activate_grouped_views(stream, &p2, activation, gated, bf16, h, sizes, z_out, slots)?;
            }
        }
        let io = GemmIo { offsets: &self.offsets, a: &self.z, weights: &self.w2, out: GemmOut::C(&mut self.o) };
        run_gemm(&mut self.gemm2, stream, io, s2)?;
        let mut call = CallBuffers::new(stream);
        let o = self.o.read(&mut call);
        let slot_row = call.read(&self.slot_row);
        let views = CombineViews {
            o,
            slot_row: BufferView { ptr: slot_row.ptr, len: slots },
            weights: (!at_input).then_some(weights_view),
            weights_type,
            y,
            bf16,
        };
        // SAFETY: as above.
        unsafe { self.kernels.combine(stream, tokens, top_k, hidden, views) }
    }
}

/// What the first GEMM writes: with the activation in its epilogue (`fused`), `z` quantized with
/// the second GEMM's input `scales`; else `h`.
fn first_out<'s>(h: &'s mut Dense, z: &'s mut Tokens, scales: &'s CudaSlice<f32>, fused: bool) -> GemmOut<'s> {
    if fused {
        GemmOut::Activated { c: h, z, scales }
    } else {
        GemmOut::C(h)
    }
}

/// What one of the block's GEMMs writes.
enum GemmOut<'s> {
    /// C, `[rows, N]` of the block's type.
    C(&'s mut Dense),
    /// With the activation in the first GEMM's epilogue: `z`, the second GEMM's NVFP4 tokens,
    /// quantized with each expert's input scale (`scales`); `c` only lends C's (empty) address.
    Activated { c: &'s mut Dense, z: &'s mut Tokens, scales: &'s CudaSlice<f32> },
}

/// One of the block's GEMMs' buffers: the device sizes, the tokens, the experts' weights, and
/// what it writes.
struct GemmIo<'s> {
    offsets: &'s CudaSlice<u32>,
    a: &'s Tokens,
    weights: &'s Weights,
    out: GemmOut<'s>,
}

/// One of the block's grouped GEMMs over its own buffers. With `scheduled` (its call prepared,
/// its scheduler launched inside the quantization's launch) the launches after the scheduler
/// ([`MoePlan::launch_scheduled`]), else the whole call ([`MoePlan::run_views`]).
fn run_gemm(
    plan: &mut MoePlan,
    stream: &Arc<CudaStream>,
    io: GemmIo<'_>,
    scheduled: Option<ScheduledCall>,
) -> Result<()> {
    with_gemm_buffers(plan, stream, io, |plan, buffers| {
        // SAFETY: the block's own buffers, alive and ordered until the launches are enqueued; a
        // prepared call was prepared for these buffers.
        unsafe {
            match scheduled {
                Some(s) => plan.launch_scheduled(stream, buffers, s),
                None => plan.run_views(stream, buffers),
            }
        }
    })
}

/// [`MoePlan::prepare_scheduled`] for [`run_gemm`]'s call on the same buffers.
fn prepare_gemm(plan: &mut MoePlan, stream: &Arc<CudaStream>, io: GemmIo<'_>) -> Result<Option<ScheduledCall>> {
    // SAFETY: the block's own buffers, alive and ordered until the preparation's copies are
    // enqueued.
    with_gemm_buffers(plan, stream, io, |plan, buffers| unsafe { plan.prepare_scheduled(stream, buffers) })
}

/// `f` on one of the block's GEMMs and its buffers' views, their stream-ordering guards held
/// until it returns.
fn with_gemm_buffers<R>(
    plan: &mut MoePlan,
    stream: &Arc<CudaStream>,
    io: GemmIo<'_>,
    f: impl FnOnce(&mut MoePlan, &MoeBuffers) -> Result<R>,
) -> Result<R> {
    let mut call = CallBuffers::new(stream);
    let buffers = gemm_buffers(plan, &mut call, io)?;
    let result = f(plan, &buffers);
    drop(call);
    result
}

/// The views of one of the block's GEMMs' buffers, held by `call`.
fn gemm_buffers<'s>(plan: &MoePlan, call: &mut CallBuffers<'s>, io: GemmIo<'s>) -> Result<MoeBuffers> {
    let GemmIo { offsets, a, weights, out } = io;
    let (c, activated) = match out {
        GemmOut::C(c) => (c.write(call), None),
        GemmOut::Activated { c, z, scales } => {
            let Tokens::Nvfp4 { values, scales: z_scales } = z else {
                return Err(Error::Unsupported("the activation epilogue writes NVFP4 tokens (W4A4)".into()));
            };
            let sizes = plan.problem().activated_sizes().expect("an activation-epilogue problem");
            let (v, s) = (call.write(values), call.write(z_scales));
            let activated = ActivatedOutput {
                values: BufferView { ptr: v.ptr, len: sizes.values },
                scales: BufferView { ptr: s.ptr, len: sizes.scales },
                global_scale: GlobalScale::PerGroup(call.read(scales)),
            };
            (BufferView { len: 0, ..c.write(call) }, Some(activated))
        }
    };
    Ok(MoeBuffers {
        sizes: call.read(offsets),
        a: a.operand(call),
        weights: weights.views(call),
        alphas: weights.alphas.clone(),
        c,
        c_type: plan.problem().output(),
        activated,
    })
}

/// `w13` (`[2I, H]`, the gate rows then the up rows) with its rows in the order of the
/// activation epilogue's weights ([`interleave_w13_row`]): values and plain scales moved row by
/// row. `w13`'s values and scales must have its `rows x k` lengths.
pub fn interleave_w13(w13: &PlainWeight, inter: usize) -> PlainWeight {
    let (row_bytes, row_scales) = (w13.k / 2, w13.k / 16);
    let mut out = PlainWeight {
        values: Vec::with_capacity(w13.values.len()),
        plain_scales: Vec::with_capacity(w13.plain_scales.len()),
        ..*w13
    };
    for r in 0..w13.rows {
        let src = interleave_w13_row(r, inter, true);
        out.values.extend_from_slice(&w13.values[src * row_bytes..(src + 1) * row_bytes]);
        out.plain_scales.extend_from_slice(&w13.plain_scales[src * row_scales..(src + 1) * row_scales]);
    }
    out
}

/// One call's buffers as addresses and lengths in elements ([`ExpertBlock::run_views`]).
#[derive(Clone, Copy, Debug)]
pub struct BlockViews {
    /// The tokens `x`, `[tokens, H]` of the block's 16-bit type.
    pub x: BufferView,
    /// `x` and `y` are bf16 (else f16); must be the block's type.
    pub bf16: bool,
    /// Tokens `T` of this call (at most the block's bound).
    pub tokens: usize,
    /// `topk_ids`, `[T, top_k]`.
    pub ids: BufferView,
    /// Their type.
    pub ids_type: IdType,
    /// `topk_weights`, `[T, top_k]`.
    pub weights: BufferView,
    /// Their type.
    pub weights_type: WeightType,
    /// The output `y`, `[T, H]` of the block's 16-bit type.
    pub y: BufferView,
}

/// The kernels' activation of the contract's.
fn kernel_activation(a: Activation) -> KernelActivation {
    match a {
        Activation::Silu => KernelActivation::Silu,
        Activation::GeluTanh => KernelActivation::GeluTanh,
        Activation::Relu2 => KernelActivation::Relu2,
    }
}
