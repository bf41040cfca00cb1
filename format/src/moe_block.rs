//! The CPU reference of a whole MoE expert block: routing, both GEMMs, the activation and the
//! weighted combine, in `f64`, quantizing and rounding exactly where the block does
//! (docs/moe-block.md states the contract).
//!
//! For each token `t` and each of its `top_k` slots `k` whose expert `e = ids[t, k]` is held
//! locally, with router weight `w = weights[t, k]`:
//!
//! ```text
//! a    = dtype(x[t])                 or dtype(dtype(x[t]) · w) with RouterWeightAt::Input
//! h    = W13_e · A(a, w13_input)     dtype-rounded (the first GEMM's stored output)
//! z    = dtype(act(h))               gated: act(gate) · up, gate = h[..I], up = h[I..]
//! o    = W2_e · A(z, w2_input)       f64, not rounded
//! y[t] = Σ_k w · o                   k ascending, f64 (w = 1 with RouterWeightAt::Input)
//! ```
//!
//! where `A(v, s)` is `v` itself under W4A16 and, under W4A4, `v` quantized by this crate's
//! NVFP4 quantizer ([`quantize_with_global_scale`], bit-identical to the device's) with global
//! scale `s` and dequantized exactly. Slots whose id is outside the local range add nothing.
//! The result stays in `f64`; [`round_output`] rounds it once to the output type.

use core::fmt;

use half::{bf16, f16};
use rayon::prelude::*;

use crate::checkpoint::{ExpertWeights, LoadedExperts, PlainWeight};
use crate::codec::{f64_to_bf16, f64_to_f16, HostFloat};
use crate::error::FormatError;
use crate::quantize::quantize_with_global_scale;
use crate::reference::GEMM_K_MULTIPLE;

/// The activation between the two GEMMs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// Gated SiLU: `silu(gate) · up` with `silu(g) = g / (1 + e^(−g))`.
    Silu,
    /// Squared ReLU, not gated: `max(h, 0)²`; W13 holds W1 only (`I` rows).
    Relu2,
    /// Gated GELU, tanh approximation: `gelu(gate) · up` with
    /// `gelu(g) = g/2 · (1 + tanh(√(2/π) · (g + 0.044715 g³)))`.
    GeluTanh,
}

impl Activation {
    /// Whether W13 holds gate and up rows (`2I` rows, gate first, as vLLM's `w13`) rather than
    /// W1 alone (`I` rows).
    pub const fn gated(self) -> bool {
        matches!(self, Self::Silu | Self::GeluTanh)
    }

    /// The activation's scalar function (for a gated one, the function applied to the gate), in
    /// `f64`.
    pub fn apply(self, x: f64) -> f64 {
        match self {
            Self::Silu => x / (1.0 + (-x).exp()),
            Self::Relu2 => {
                let r = x.max(0.0);
                r * r
            }
            Self::GeluTanh => {
                // g/2 · (1 + tanh u) = g · σ(2u) = g / (1 + e^(−2u)): the same function without
                // the cancellation of 1 + tanh(u) for negative g.
                let c = (2.0 / core::f64::consts::PI).sqrt();
                let u = c * (x + 0.044715 * x * x * x);
                x / (1.0 + (-2.0 * u).exp())
            }
        }
    }
}

/// Where the router weight multiplies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RouterWeightAt {
    /// On each expert's output, at the combine (the usual MoE).
    #[default]
    Combine,
    /// On the token before the first GEMM (Llama-4 style); the combine then adds the expert
    /// outputs unweighted.
    Input,
}

/// A 16-bit floating-point storage type: the block's activations, its stored intermediates and
/// its output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dense16 {
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
}

impl Dense16 {
    /// `x` rounded once to this type (nearest, ties to even, overflow to ±∞), back as `f64`
    /// (exact).
    pub fn round(self, x: f64) -> f64 {
        match self {
            Self::F16 => f64_to_f16(x).to_f64(),
            Self::Bf16 => f64_to_bf16(x).to_f64(),
        }
    }
}

/// What the GEMMs read as their token operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// NVFP4 activations: each GEMM's input quantized with that GEMM's input scale.
    W4a4,
    /// 16-bit activations (the block's [`Dense16`] type) times NVFP4 weights.
    W4a16,
}

/// How the block computes: the activation, where the router weight goes, the token operand's
/// precision, and the 16-bit type of the activations, the stored intermediates and the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockOptions {
    /// The activation.
    pub activation: Activation,
    /// Where the router weight multiplies.
    pub router_weight_at: RouterWeightAt,
    /// The token operand's precision.
    pub precision: Precision,
    /// The 16-bit storage type.
    pub dtype: Dense16,
}

impl BlockOptions {
    /// Options with the router weight at the combine.
    pub const fn new(activation: Activation, precision: Precision, dtype: Dense16) -> Self {
        Self { activation, router_weight_at: RouterWeightAt::Combine, precision, dtype }
    }

    /// The same options with the router weight applied at `at`.
    pub const fn with_router_weight_at(self, at: RouterWeightAt) -> Self {
        Self { router_weight_at: at, ..self }
    }
}

/// The router's choice per token: `ids` and `weights` are `T x top_k`, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    /// Global expert ids; any id outside the local range (−1, another rank's expert) adds
    /// nothing.
    pub ids: Vec<i64>,
    /// Router weights, as the router emits them (`f32`).
    pub weights: Vec<f32>,
    /// Experts per token.
    pub top_k: usize,
}

impl Routing {
    /// The tokens routed: `ids.len() / top_k` (0 when `top_k` is 0).
    pub fn tokens(&self) -> usize {
        self.ids.len().checked_div(self.top_k).unwrap_or(0)
    }

    fn validate(&self) -> Result<usize, MoeBlockError> {
        if self.top_k == 0 {
            return Err(MoeBlockError::TopKZero);
        }
        if self.ids.len() % self.top_k != 0 {
            return Err(MoeBlockError::RoutingShape { what: "ids", len: self.ids.len(), top_k: self.top_k });
        }
        if self.weights.len() != self.ids.len() {
            return Err(MoeBlockError::RoutingShape { what: "weights", len: self.weights.len(), top_k: self.top_k });
        }
        if let Some(i) = self.weights.iter().position(|w| !w.is_finite()) {
            return Err(MoeBlockError::NonFiniteWeight {
                token: i / self.top_k,
                slot: i % self.top_k,
                value: self.weights[i],
            });
        }
        Ok(self.tokens())
    }
}

/// Why [`reference()`] rejected its input. It never panics on bad input.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum MoeBlockError {
    /// `top_k` is zero.
    TopKZero,
    /// `ids` is not a whole number of rows of `top_k`, or `weights` is not as long as `ids`.
    RoutingShape {
        /// `"ids"` or `"weights"`.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The routing's `top_k`.
        top_k: usize,
    },
    /// A router weight is NaN or infinite.
    NonFiniteWeight {
        /// The token.
        token: usize,
        /// The slot within the token's `top_k`.
        slot: usize,
        /// The weight.
        value: f32,
    },
    /// `x` is not `T x H` long (or `T x H` overflows).
    XLength {
        /// `T x H`, or `usize::MAX` when it overflows.
        expected: usize,
        /// `x.len()`.
        actual: usize,
    },
    /// H or I is not a positive multiple of [`GEMM_K_MULTIPLE`] (K of the first or second GEMM).
    BadK {
        /// `"H"` or `"I"`.
        what: &'static str,
        /// The value.
        k: usize,
        /// The multiple it must be.
        multiple: usize,
    },
    /// A gated activation with a W13 of odd row count (it must be gate rows then up rows).
    OddGatedRows {
        /// The expert's global index.
        expert: usize,
        /// W13's rows.
        rows: usize,
    },
    /// An expert's shape disagrees with H or with the other experts' I.
    InconsistentExpert {
        /// The expert's global index.
        expert: usize,
        /// Which dimension: `"w13 K (H)"`, `"w2 rows (H)"`, `"w13 rows (I)"`, `"w2 K (I)"`.
        what: &'static str,
        /// The value required.
        expected: usize,
        /// The value found.
        actual: usize,
    },
    /// The experts are not numbered `first_expert, first_expert + 1, ...`.
    ExpertOrder {
        /// Position in [`LoadedExperts::experts`].
        position: usize,
        /// The global index expected there.
        expected: usize,
        /// The index found.
        found: usize,
    },
    /// A weight global scale or an input scale that is not finite and positive.
    BadScale {
        /// The expert's global index.
        expert: usize,
        /// Which scale.
        what: &'static str,
        /// The value.
        value: f32,
    },
    /// An expert's weight buffers do not match its shape.
    Weight {
        /// The expert's global index.
        expert: usize,
        /// The matrix constructor's error.
        error: FormatError,
    },
}

impl fmt::Display for MoeBlockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TopKZero => write!(f, "top_k must be positive"),
            Self::RoutingShape { what, len, top_k } => {
                write!(f, "routing {what} has {len} entries, which is not T x top_k (top_k = {top_k}) with ids and weights alike")
            }
            Self::NonFiniteWeight { token, slot, value } => {
                write!(f, "router weight of token {token}, slot {slot} is {value}, not finite")
            }
            Self::XLength { expected, actual } => write!(f, "x has {actual} elements, expected T x H = {expected}"),
            Self::BadK { what, k, multiple } => write!(f, "{what} = {k} must be a positive multiple of {multiple}"),
            Self::OddGatedRows { expert, rows } => {
                write!(f, "expert {expert}: a gated activation needs gate and up rows, but W13 has {rows} rows")
            }
            Self::InconsistentExpert { expert, what, expected, actual } => {
                write!(f, "expert {expert}: {what} is {actual}, expected {expected}")
            }
            Self::ExpertOrder { position, expected, found } => {
                write!(f, "local expert {position} has global index {found}, expected {expected}")
            }
            Self::BadScale { expert, what, value } => {
                write!(f, "expert {expert}: {what} = {value} is not finite and positive")
            }
            Self::Weight { expert, error } => write!(f, "expert {expert}: {error}"),
        }
    }
}

impl std::error::Error for MoeBlockError {}

/// One expert's weights decoded for the reference: block-scaled values (`e2m1 · e4m3`, exact) and
/// the scales that multiply each GEMM's exact sum.
struct Decoded {
    /// `rows13 x H`.
    w13: Vec<f64>,
    /// `H x I`.
    w2: Vec<f64>,
    w13_global: f64,
    w2_global: f64,
    w13_input: f32,
    w2_input: f32,
}

fn check_scale(expert: usize, what: &'static str, value: f32) -> Result<(), MoeBlockError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(MoeBlockError::BadScale { expert, what, value })
    }
}

fn check_k(what: &'static str, k: usize) -> Result<(), MoeBlockError> {
    if k > 0 && k % GEMM_K_MULTIPLE == 0 {
        Ok(())
    } else {
        Err(MoeBlockError::BadK { what, k, multiple: GEMM_K_MULTIPLE })
    }
}

/// Checks every expert against H, I, the activation and (W4A4 only: W4A16 reads no input scale)
/// the input scales; returns I (0 when there are none).
fn validate_experts(experts: &LoadedExperts, hidden: usize, options: &BlockOptions) -> Result<usize, MoeBlockError> {
    let activation = options.activation;
    let mut intermediate = None;
    for (position, e) in experts.experts.iter().enumerate() {
        let expected = experts.first_expert.saturating_add(position);
        if e.expert != expected {
            return Err(MoeBlockError::ExpertOrder { position, expected, found: e.expert });
        }
        let id = e.expert;
        if activation.gated() && e.w13.rows % 2 != 0 {
            return Err(MoeBlockError::OddGatedRows { expert: id, rows: e.w13.rows });
        }
        let rows_i = if activation.gated() { e.w13.rows / 2 } else { e.w13.rows };
        check_k("I", rows_i)?;
        let mismatch =
            |what, expected, actual| MoeBlockError::InconsistentExpert { expert: id, what, expected, actual };
        if e.w13.k != hidden {
            return Err(mismatch("w13 K (H)", hidden, e.w13.k));
        }
        if e.w2.rows != hidden {
            return Err(mismatch("w2 rows (H)", hidden, e.w2.rows));
        }
        let i = *intermediate.get_or_insert(rows_i);
        if rows_i != i {
            return Err(mismatch("w13 rows (I)", i, rows_i));
        }
        if e.w2.k != i {
            return Err(mismatch("w2 K (I)", i, e.w2.k));
        }
        check_scale(id, "w13 global scale", e.w13.global_scale)?;
        check_scale(id, "w2 global scale", e.w2.global_scale)?;
        if options.precision == Precision::W4a4 {
            check_scale(id, "w13 input scale", e.w13_input_scale)?;
            check_scale(id, "w2 input scale", e.w2_input_scale)?;
        }
    }
    Ok(intermediate.unwrap_or(0))
}

fn block_scaled(expert: usize, w: &PlainWeight) -> Result<Vec<f64>, MoeBlockError> {
    let m = w.to_matrix().map_err(|error| MoeBlockError::Weight { expert, error })?;
    Ok(m.dequantize_block_scaled().into_iter().map(f64::from).collect())
}

fn decode(e: &ExpertWeights) -> Result<Decoded, MoeBlockError> {
    Ok(Decoded {
        w13: block_scaled(e.expert, &e.w13)?,
        w2: block_scaled(e.expert, &e.w2)?,
        w13_global: f64::from(e.w13.global_scale),
        w2_global: f64::from(e.w2.global_scale),
        w13_input: e.w13_input_scale,
        w2_input: e.w2_input_scale,
    })
}

/// A GEMM's token operand for one row: under W4A4 the row quantized with global scale `input`,
/// block-scaled (`e2m1 · e4m3`, exact), with `input` as the factor still to apply; under W4A16
/// the row itself with factor 1.
fn token_operand(row: &[f64], precision: Precision, input: f32) -> Result<(Vec<f64>, f64), FormatError> {
    Ok(match precision {
        Precision::W4a16 => (row.to_vec(), 1.0),
        Precision::W4a4 => {
            let q = quantize_with_global_scale(row, 1, row.len(), input)?;
            (q.dequantize_block_scaled().into_iter().map(f64::from).collect(), f64::from(input))
        }
    })
}

/// `out[n] = scale · Σ_c a[c] · w[n, c]`, `c` ascending, in `f64`.
fn gemm_row(a: &[f64], w: &[f64], scale: f64, out: &mut [f64]) {
    for (o, w_row) in out.iter_mut().zip(w.chunks_exact(a.len())) {
        let sum: f64 = a.iter().zip(w_row).fold(0.0, |s, (x, y)| s + x * y);
        *o = sum * scale;
    }
}

/// One expert applied to one (already weighted, if at the input) 16-bit token row: the expert's
/// `H` outputs before the combine.
/// The quantizer's errors (shape, scale) cannot occur after validation; they are passed on
/// rather than unwrapped.
fn expert_row(a: &[f64], d: &Decoded, i: usize, options: &BlockOptions) -> Result<Vec<f64>, FormatError> {
    let dtype = options.dtype;
    let (a_op, a_scale) = token_operand(a, options.precision, d.w13_input)?;
    let rows13 = d.w13.len() / a.len();
    let mut h = vec![0.0; rows13];
    gemm_row(&a_op, &d.w13, a_scale * d.w13_global, &mut h);
    for v in &mut h {
        *v = dtype.round(*v);
    }
    let z: Vec<f64> = if options.activation.gated() {
        let (gate, up) = h.split_at(i);
        gate.iter().zip(up).map(|(&g, &u)| dtype.round(options.activation.apply(g) * u)).collect()
    } else {
        h.iter().map(|&v| dtype.round(options.activation.apply(v))).collect()
    };
    let (z_op, z_scale) = token_operand(&z, options.precision, d.w2_input)?;
    let mut o = vec![0.0; a.len()];
    gemm_row(&z_op, &d.w2, z_scale * d.w2_global, &mut o);
    // The second GEMM stores its output in the 16-bit type, as the first does.
    for v in &mut o {
        *v = dtype.round(*v);
    }
    Ok(o)
}

/// The MoE expert block on `T` tokens of `H = hidden` features, in `f64`, quantizing and rounding
/// where the block does (module docs; docs/moe-block.md): `T x H` row-major, before the final
/// rounding to the output type ([`round_output`]).
///
/// `x` is `T x H` (T = [`Routing::tokens`]); `experts` are the rank's local experts, numbered
/// `first_expert..first_expert + experts.len()`, as [`crate::checkpoint::Checkpoint::load_experts`]
/// returns them. Their scales are dequantization multipliers (the loader's convention), and the
/// W4A4 quantizer's global scale IS that multiplier: [`quantize_with_global_scale`] with
/// `w13_input_scale` gives block scales `e4m3(amax / 6 / w13_input_scale)` and values that
/// dequantize as `e2m1 · e4m3 · w13_input_scale`. Under W4A16 the input scales are not used.
///
/// Errors ([`MoeBlockError`]): routing shapes, a zero `top_k`, a non-finite router weight, `x`'s
/// length, H or I not a positive multiple of 64, a gated activation with odd W13 rows, experts of
/// inconsistent H or I or out of order, weight global scales (and, under W4A4, input scales) that
/// are not finite and positive, weight buffers
/// that do not match their shapes.
///
/// # Example
///
/// One token routed to expert 0 (weight 0.5) and to −1 (nothing), with values chosen so that
/// every step is exact:
///
/// ```
/// use nvfp4_format::checkpoint::{ExpertWeights, LoadedExperts, PlainWeight};
/// use nvfp4_format::codec::E4M3_ONE;
/// use nvfp4_format::moe_block::{reference, round_output, Activation, BlockOptions, Dense16, Precision, Routing};
///
/// let (h, i) = (64, 64);
/// // Every element the e2m1 `code` (1 = 0.5, 2 = 1.0) times block scale 1 times `global`.
/// let weight = |rows: usize, k: usize, code: u8, global: f32| PlainWeight {
///     rows,
///     k,
///     values: vec![code | code << 4; rows * k / 2],
///     plain_scales: vec![E4M3_ONE; rows * k / 16],
///     global_scale: global,
/// };
/// let expert = ExpertWeights {
///     expert: 0,
///     w13: weight(i, h, 1, 2f32.powi(-6)), // relu2 is not gated: W1 only, elements 2⁻⁷
///     w2: weight(h, i, 2, 2f32.powi(-4)),  // elements 2⁻⁴
///     w13_input_scale: 0.25,
///     w2_input_scale: 0.25,
/// };
/// let experts = LoadedExperts { first_expert: 0, experts: vec![expert] };
/// let routing = Routing { ids: vec![0, -1], weights: vec![0.5, 0.5], top_k: 2 };
/// let x = vec![6.0; h];
/// for precision in [Precision::W4a16, Precision::W4a4] {
///     let options = BlockOptions::new(Activation::Relu2, precision, Dense16::Bf16);
///     let y = reference(&x, h, &routing, &experts, &options)?;
///     // h = 64 · 6 · 2⁻⁷ = 3, relu(3)² = 9, o = 64 · 9 · 2⁻⁴ = 36, y = 0.5 · 36. Under W4A4,
///     // 6 and 9 quantize exactly (block scales 4 and 6 with input scale 0.25).
///     assert!(y.iter().all(|&v| v == 18.0), "{precision:?}");
///     assert_eq!(round_output::<half::bf16>(&y)[0].to_f32(), 18.0);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn reference(
    x: &[f64],
    hidden: usize,
    routing: &Routing,
    experts: &LoadedExperts,
    options: &BlockOptions,
) -> Result<Vec<f64>, MoeBlockError> {
    let tokens = routing.validate()?;
    check_k("H", hidden)?;
    let expected = tokens.saturating_mul(hidden);
    if x.len() != expected {
        return Err(MoeBlockError::XLength { expected, actual: x.len() });
    }
    let intermediate = validate_experts(experts, hidden, options)?;
    let top_k = routing.top_k;
    let first = experts.first_expert as i128;
    let count = experts.experts.len() as i128;
    let local = |id: i64| -> Option<usize> {
        let rel = i128::from(id) - first;
        (0..count).contains(&rel).then_some(rel as usize)
    };

    // Each (token, slot) with a local expert, its expert output; experts decoded one at a time.
    let mut outputs: Vec<Option<Vec<f64>>> = vec![None; tokens * top_k];
    for (position, e) in experts.experts.iter().enumerate() {
        let pairs: Vec<usize> = (0..tokens * top_k).filter(|&p| local(routing.ids[p]) == Some(position)).collect();
        if pairs.is_empty() {
            continue;
        }
        let d = decode(e)?;
        let rows: Vec<(usize, Vec<f64>)> = pairs
            .par_iter()
            .map(|&p| {
                let t = p / top_k;
                let row = &x[t * hidden..(t + 1) * hidden];
                let a: Vec<f64> = match options.router_weight_at {
                    RouterWeightAt::Combine => row.iter().map(|&v| options.dtype.round(v)).collect(),
                    RouterWeightAt::Input => {
                        let w = f64::from(routing.weights[p]);
                        row.iter().map(|&v| options.dtype.round(options.dtype.round(v) * w)).collect()
                    }
                };
                expert_row(&a, &d, intermediate, options).map(|o| (p, o))
            })
            .collect::<Result<_, _>>()
            .map_err(|error| MoeBlockError::Weight { expert: e.expert, error })?;
        for (p, o) in rows {
            outputs[p] = Some(o);
        }
    }

    let mut y = vec![0.0; tokens * hidden];
    if hidden > 0 {
        for (t, y_row) in y.chunks_exact_mut(hidden).enumerate() {
            for k in 0..top_k {
                let p = t * top_k + k;
                if let Some(o) = &outputs[p] {
                    let w = match options.router_weight_at {
                        RouterWeightAt::Combine => f64::from(routing.weights[p]),
                        RouterWeightAt::Input => 1.0,
                    };
                    for (acc, v) in y_row.iter_mut().zip(o) {
                        *acc += w * v;
                    }
                }
            }
        }
    }
    Ok(y)
}

/// The block's `f64` result rounded once to the output type (`f16` or `bf16`; also `f32`).
pub fn round_output<T: HostFloat>(y: &[f64]) -> Vec<T> {
    y.iter().map(|&v| T::from_f64(v)).collect()
}

/// [`round_output`] for a [`Dense16`] chosen at run time: the rounded values as `f64`.
pub fn round_output_as(y: &[f64], dtype: Dense16) -> Vec<f64> {
    match dtype {
        Dense16::F16 => round_output::<f16>(y).into_iter().map(f16::to_f64).collect(),
        Dense16::Bf16 => round_output::<bf16>(y).into_iter().map(bf16::to_f64).collect(),
    }
}

#[cfg(test)]
mod tests;
