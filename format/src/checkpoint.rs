//! MoE expert weights from safetensors checkpoints, as stored by NVIDIA ModelOpt and by
//! compressed-tensors, turned into this library's operands once, at load.
//!
//! Both formats store, per expert and per projection (w1 = gate, w3 = up, w2 = down), the same
//! three things: packed e2m1 values `[N, K/2]` (uint8, element `2j` of a row in the LOW nibble of
//! byte `j`, as in this crate), e4m3 block scales `[N, K/16]` (one per 16 values along K, plain
//! row-major) and an fp32 per-tensor scale, plus an fp32 input (activation) scale. They differ in
//! the names and in the meaning of the fp32 scales:
//!
//! | | [`Convention::ModelOpt`] | [`Convention::CompressedTensors`] |
//! |---|---|---|
//! | values | `weight` | `weight_packed` |
//! | block scales | `weight_scale` | `weight_scale` |
//! | weight global scale | `weight_scale_2`: the dequantization multiplier, `amax / (6 * 448)` | `weight_global_scale`: its inverse, `6 * 448 / amax` |
//! | input scale | `input_scale`: dequantization multiplier | `input_global_scale`: its inverse |
//!
//! A weight element is `e2m1 * e4m3 * g` where `g` is ModelOpt's `weight_scale_2`, or `1 / x` for
//! compressed-tensors' `weight_global_scale` `x`. Reading one convention as the other multiplies
//! every output by `g⁻²` (or `g²`): for a tensor with amax near 1 that is about `2688²`, never a
//! crash. The loader therefore takes the convention as a required, typed argument and returns
//! every scale in ONE convention: the dequantization multiplier (ModelOpt's meaning), the factor
//! that goes into the GEMM's alpha.
//!
//! Sources (read to confirm names, shapes and conventions; no code is taken from them):
//! vLLM's `ModelOptNvFp4FusedMoE` (`vllm/model_executor/layers/quantization/modelopt.py`: the
//! `w13_weight_scale_2` / `w13_input_scale` parameters, `g1_alphas = input_scale * weight_scale_2`),
//! its `CompressedTensorsW4A4Fp4` scheme and `compressed_tensors_moe.py` (`weight_packed`,
//! `weight_global_scale`, `input_global_scale`, "take inverse of global scale saved to disk"), and
//! the nibble order of vLLM's `break_fp4_bytes` test helper. The URLs are in
//! `docs/checkpoints.md`.
//!
//! The fused first GEMM takes `w13` = the gate rows, then the up rows (vLLM's order), with ONE
//! global scale. When a checkpoint's w1 and w3 global scales differ, loading fails with
//! [`CheckpointError::GlobalScalesDiffer`] unless the caller picks a [`Reconcile`] policy.
//!
//! Under expert parallelism a rank loads only its experts ([`LoadOptions::experts`]); the tensors
//! of other experts, input scales included, are never read.

use std::fmt;
use std::ops::Range;

pub use safetensors;
use safetensors::{Dtype, SafeTensors};

use crate::codec::{e4m3_from_f64, e4m3_is_nan, e4m3_to_f32};
use crate::error::FormatError;
use crate::layout::SCALE_VEC;
use crate::matrix::Nvfp4Matrix;
use crate::reference::GEMM_K_MULTIPLE;

/// Which project's names and scale meaning a checkpoint uses (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Convention {
    /// NVIDIA ModelOpt's NVFP4 export: `weight`, `weight_scale`, `weight_scale_2`, `input_scale`;
    /// the fp32 scales are dequantization multipliers.
    ModelOpt,
    /// compressed-tensors' `nvfp4-pack-quantized`: `weight_packed`, `weight_scale`,
    /// `weight_global_scale`, `input_global_scale`; the fp32 scales are the INVERSE of the
    /// dequantization multipliers.
    CompressedTensors,
}

impl Convention {
    /// The packed-values tensor's suffix.
    pub const fn values_suffix(self) -> &'static str {
        match self {
            Self::ModelOpt => "weight",
            Self::CompressedTensors => "weight_packed",
        }
    }

    /// The block-scales tensor's suffix (the same in both).
    pub const fn block_scales_suffix(self) -> &'static str {
        "weight_scale"
    }

    /// The weight global scale's suffix.
    pub const fn weight_global_suffix(self) -> &'static str {
        match self {
            Self::ModelOpt => "weight_scale_2",
            Self::CompressedTensors => "weight_global_scale",
        }
    }

    /// The input (activation) scale's suffix.
    pub const fn input_scale_suffix(self) -> &'static str {
        match self {
            Self::ModelOpt => "input_scale",
            Self::CompressedTensors => "input_global_scale",
        }
    }

    /// A stored fp32 scale as a dequantization multiplier: itself (ModelOpt) or its reciprocal
    /// (compressed-tensors, rounded once to `f32`).
    pub fn dequantization_scale(self, stored: f32) -> f32 {
        match self {
            Self::ModelOpt => stored,
            Self::CompressedTensors => (1.0 / f64::from(stored)) as f32,
        }
    }
}

/// What to do when an expert's w1 (gate) and w3 (up) weight global scales differ, since the fused
/// `w13` carries one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reconcile {
    /// Fail with [`CheckpointError::GlobalScalesDiffer`] (the default).
    #[default]
    Refuse,
    /// Use the larger dequantization scale `G` for both halves and multiply the other half's
    /// block scales by `g / G` (≤ 1). Fails with [`CheckpointError::NotExact`] unless every new
    /// block scale is exactly an e4m3 value, so the dequantized weights are bit-for-bit those
    /// stored (true for a power-of-two ratio while the scales stay normal).
    Exact,
    /// As [`Reconcile::Exact`], but each new block scale is rounded to the nearest e4m3 value
    /// (ties to even). A block scale `s · g / G` moves by at most half an e4m3 step: at most
    /// `2⁻⁴` of itself when it is at least `2⁻⁶` (normal), at most `2⁻¹⁰` absolutely below; it
    /// can round to zero. The dequantized weights of that half move by the same factor.
    Round,
}

/// The projection names under each expert, `{prefix}.experts.{e}.{name}.{suffix}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Projections<'a> {
    /// The gate projection (first half of `w13`).
    pub gate: &'a str,
    /// The up projection (second half of `w13`).
    pub up: &'a str,
    /// The down projection (`w2`).
    pub down: &'a str,
}

impl Projections<'static> {
    /// Mixtral-style names: `w1` (gate), `w3` (up), `w2` (down).
    pub const W1_W3_W2: Self = Self { gate: "w1", up: "w3", down: "w2" };
    /// Llama/DeepSeek/Qwen-style names: `gate_proj`, `up_proj`, `down_proj`.
    pub const GATE_UP_DOWN: Self = Self { gate: "gate_proj", up: "up_proj", down: "down_proj" };
}

/// What [`Checkpoint::load_experts`] reads and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadOptions<'a> {
    /// The MoE block's prefix, e.g. `model.layers.3.block_sparse_moe`; tensors are
    /// `{prefix}.experts.{e}.{projection}.{suffix}`.
    pub prefix: &'a str,
    /// The checkpoint's convention.
    pub convention: Convention,
    /// The global indices of the experts this rank holds (expert parallelism); `0..E` for all.
    pub experts: Range<usize>,
    /// The projection names.
    pub projections: Projections<'a>,
    /// The policy for differing w1 / w3 global scales.
    pub reconcile: Reconcile,
}

impl<'a> LoadOptions<'a> {
    /// Options with [`Projections::W1_W3_W2`] and [`Reconcile::Refuse`].
    pub fn new(prefix: &'a str, convention: Convention, experts: Range<usize>) -> Self {
        Self { prefix, convention, experts, projections: Projections::W1_W3_W2, reconcile: Reconcile::Refuse }
    }

    /// The same options with other projection names.
    pub fn with_projections(self, projections: Projections<'a>) -> Self {
        Self { projections, ..self }
    }

    /// The same options with another reconcile policy.
    pub fn with_reconcile(self, reconcile: Reconcile) -> Self {
        Self { reconcile, ..self }
    }
}

/// One weight matrix as this library takes it: `rows x k`, K-major, packed e2m1 values (element
/// `2j` in the low nibble of byte `j`), e4m3 block scales in the PLAIN `[rows, k/16]` row-major
/// layout, and the dequantization global scale.
#[derive(Clone, Debug, PartialEq)]
pub struct PlainWeight {
    /// Rows (N, output features).
    pub rows: usize,
    /// Values per row (K, input features), a multiple of [`GEMM_K_MULTIPLE`].
    pub k: usize,
    /// `rows * k / 2` bytes.
    pub values: Vec<u8>,
    /// `rows * k / 16` e4m3 codes.
    pub plain_scales: Vec<u8>,
    /// The dequantization multiplier (ModelOpt's meaning, whatever the file's convention).
    pub global_scale: f32,
}

impl PlainWeight {
    /// The matrix with its scales in the device's 128x4 blocked layout.
    pub fn to_matrix(&self) -> Result<Nvfp4Matrix, FormatError> {
        Nvfp4Matrix::from_plain_scales(self.rows, self.k, self.values.clone(), &self.plain_scales, self.global_scale)
    }
}

impl From<&Nvfp4Matrix> for PlainWeight {
    /// The matrix's values, its scales in the plain layout and its global scale.
    fn from(m: &Nvfp4Matrix) -> Self {
        Self {
            rows: m.rows(),
            k: m.k(),
            values: m.values().to_vec(),
            plain_scales: m.plain_scales(),
            global_scale: m.global_scale(),
        }
    }
}

/// One expert's prepared weights.
#[derive(Clone, Debug, PartialEq)]
pub struct ExpertWeights {
    /// The expert's global index.
    pub expert: usize,
    /// `[2I, H]`: the gate rows, then the up rows, one global scale.
    pub w13: PlainWeight,
    /// `[H, I]`.
    pub w2: PlainWeight,
    /// The first GEMM's input dequantization scale: the larger of w1's and w3's (one quantizer
    /// feeds both, and the larger scale's range covers both calibrations).
    pub w13_input_scale: f32,
    /// The second GEMM's input dequantization scale.
    pub w2_input_scale: f32,
}

/// The experts one rank loaded, in order of global index.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadedExperts {
    /// The global index of `experts[0]`.
    pub first_expert: usize,
    /// One entry per loaded expert.
    pub experts: Vec<ExpertWeights>,
}

impl LoadedExperts {
    /// The first GEMM's input scales, one per local expert.
    pub fn w13_input_scales(&self) -> Vec<f32> {
        self.experts.iter().map(|e| e.w13_input_scale).collect()
    }

    /// The second GEMM's input scales, one per local expert.
    pub fn w2_input_scales(&self) -> Vec<f32> {
        self.experts.iter().map(|e| e.w2_input_scale).collect()
    }

    /// Each expert's `w13` alpha contribution (weight global scale times input scale).
    pub fn w13_alphas(&self) -> Vec<f32> {
        self.experts.iter().map(|e| e.w13.global_scale * e.w13_input_scale).collect()
    }

    /// Each expert's `w2` alpha contribution (weight global scale times input scale).
    pub fn w2_alphas(&self) -> Vec<f32> {
        self.experts.iter().map(|e| e.w2.global_scale * e.w2_input_scale).collect()
    }
}

/// Why a checkpoint could not be loaded. Nothing in this module panics on a bad file.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum CheckpointError {
    /// A shard is not a safetensors file.
    Parse {
        /// The shard's index in the list given.
        shard: usize,
        /// The parser's message.
        reason: String,
    },
    /// A tensor the convention requires is absent from every shard.
    MissingTensor {
        /// The tensor's full name.
        name: String,
    },
    /// A tensor appears in more than one shard.
    DuplicateTensor {
        /// The tensor's full name.
        name: String,
    },
    /// A tensor has the wrong dtype.
    WrongDtype {
        /// The tensor's full name.
        name: String,
        /// The dtype required.
        expected: &'static str,
        /// The dtype found.
        found: String,
    },
    /// A tensor has the wrong shape.
    WrongShape {
        /// The tensor's full name.
        name: String,
        /// The shape required, in words.
        expected: String,
        /// The shape found.
        found: Vec<usize>,
    },
    /// K (values per row, twice the packed tensor's columns) is not a positive multiple of
    /// [`GEMM_K_MULTIPLE`].
    BadK {
        /// The packed-values tensor's full name.
        name: String,
        /// The K it implies.
        k: usize,
        /// The multiple K must be.
        multiple: usize,
    },
    /// A global or input scale that is not finite and positive (as stored).
    BadScale {
        /// The tensor's full name.
        name: String,
        /// The stored value.
        value: f32,
    },
    /// A block scale is an e4m3 NaN code.
    NanBlockScale {
        /// The tensor's full name.
        name: String,
        /// The row.
        row: usize,
        /// The scale column (values `16 col .. 16 col + 16`).
        col: usize,
    },
    /// w1's and w3's weight global scales differ and the policy is [`Reconcile::Refuse`]. Both
    /// as dequantization multipliers.
    GlobalScalesDiffer {
        /// The expert's global index.
        expert: usize,
        /// w1's (gate's) scale.
        w1: f32,
        /// w3's (up's) scale.
        w3: f32,
    },
    /// [`Reconcile::Exact`] could not rescale a block scale exactly.
    NotExact {
        /// The expert's global index.
        expert: usize,
        /// The block-scale tensor's full name.
        name: String,
        /// The row.
        row: usize,
        /// The scale column.
        col: usize,
    },
}

impl fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Parse { shard, reason } => write!(f, "shard {shard} is not a safetensors file: {reason}"),
            Self::MissingTensor { name } => write!(f, "tensor `{name}` is missing"),
            Self::DuplicateTensor { name } => write!(f, "tensor `{name}` appears in more than one shard"),
            Self::WrongDtype { name, expected, found } => {
                write!(f, "tensor `{name}` has dtype {found}, expected {expected}")
            }
            Self::WrongShape { name, expected, found } => {
                write!(f, "tensor `{name}` has shape {found:?}, expected {expected}")
            }
            Self::BadK { name, k, multiple } => {
                write!(f, "tensor `{name}` implies K = {k}, which must be a positive multiple of {multiple}")
            }
            Self::BadScale { name, value } => {
                write!(f, "tensor `{name}` holds {value}, which is not a finite positive scale")
            }
            Self::NanBlockScale { name, row, col } => {
                write!(f, "tensor `{name}` has a NaN block scale at row {row}, scale column {col}")
            }
            Self::GlobalScalesDiffer { expert, w1, w3 } => write!(
                f,
                "expert {expert}: w1 (gate) and w3 (up) weight global scales differ ({w1} vs {w3}, as \
                 dequantization multipliers); choose a Reconcile policy to load it"
            ),
            Self::NotExact { expert, name, row, col } => write!(
                f,
                "expert {expert}: block scale ({row}, {col}) of `{name}` is not exactly representable after \
                 rescaling to the shared global scale"
            ),
        }
    }
}

impl std::error::Error for CheckpointError {}

/// A borrowed tensor: dtype, shape and little-endian bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorRef<'data> {
    /// The stored dtype.
    pub dtype: Dtype,
    /// The shape.
    pub shape: Vec<usize>,
    /// The raw bytes.
    pub data: &'data [u8],
}

/// One or more parsed safetensors shards (a checkpoint split over files is one list of shards).
#[derive(Debug)]
pub struct Checkpoint<'data> {
    shards: Vec<SafeTensors<'data>>,
}

/// One projection of one expert, read and checked.
struct Projection {
    rows: usize,
    k: usize,
    values: Vec<u8>,
    plain_scales: Vec<u8>,
    scales_name: String,
    global: f32,
    input: f32,
}

impl<'data> Checkpoint<'data> {
    /// Parses one safetensors file's bytes.
    pub fn parse(bytes: &'data [u8]) -> Result<Self, CheckpointError> {
        Self::parse_shards(&[bytes])
    }

    /// Parses several shards; a tensor is looked up in all of them and must be in exactly one.
    pub fn parse_shards(shards: &[&'data [u8]]) -> Result<Self, CheckpointError> {
        let shards = shards
            .iter()
            .enumerate()
            .map(|(shard, bytes)| {
                SafeTensors::deserialize(bytes).map_err(|e| CheckpointError::Parse { shard, reason: e.to_string() })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { shards })
    }

    /// The tensor called `name`: `Ok(None)` when no shard has it, an error when several do.
    pub fn tensor(&self, name: &str) -> Result<Option<TensorRef<'data>>, CheckpointError> {
        let mut found = None;
        for shard in &self.shards {
            if let Ok(view) = shard.tensor(name) {
                if found.is_some() {
                    return Err(CheckpointError::DuplicateTensor { name: name.to_string() });
                }
                found = Some(TensorRef { dtype: view.dtype(), shape: view.shape().to_vec(), data: view.data() });
            }
        }
        Ok(found)
    }

    fn require(&self, name: &str, dtype: Dtype, expected: &'static str) -> Result<TensorRef<'data>, CheckpointError> {
        let t = self.tensor(name)?.ok_or_else(|| CheckpointError::MissingTensor { name: name.to_string() })?;
        if t.dtype != dtype {
            return Err(CheckpointError::WrongDtype { name: name.to_string(), expected, found: t.dtype.to_string() });
        }
        Ok(t)
    }

    /// A one-element fp32 tensor (shape `[]`, `[1]` or any shape of ones), converted to a
    /// dequantization multiplier.
    fn scalar(&self, name: &str, convention: Convention) -> Result<f32, CheckpointError> {
        let t = self.require(name, Dtype::F32, "F32")?;
        if t.shape.iter().product::<usize>() != 1 || t.data.len() != 4 {
            return Err(CheckpointError::WrongShape {
                name: name.to_string(),
                expected: "one element ([] or [1])".to_string(),
                found: t.shape,
            });
        }
        let value = f32::from_le_bytes([t.data[0], t.data[1], t.data[2], t.data[3]]);
        if !(value.is_finite() && value > 0.0) {
            return Err(CheckpointError::BadScale { name: name.to_string(), value });
        }
        let dequant = convention.dequantization_scale(value);
        if !(dequant.is_finite() && dequant > 0.0) {
            return Err(CheckpointError::BadScale { name: name.to_string(), value });
        }
        Ok(dequant)
    }

    fn projection(&self, base: &str, convention: Convention) -> Result<Projection, CheckpointError> {
        let values_name = format!("{base}.{}", convention.values_suffix());
        let values = self.require(&values_name, Dtype::U8, "U8")?;
        let [rows, packed_cols] = values.shape[..] else {
            return Err(CheckpointError::WrongShape {
                name: values_name,
                expected: "[N, K/2]".to_string(),
                found: values.shape,
            });
        };
        let k = 2 * packed_cols;
        if rows == 0 {
            return Err(CheckpointError::WrongShape {
                name: values_name,
                expected: "[N, K/2] with N > 0".to_string(),
                found: values.shape,
            });
        }
        if k == 0 || k % GEMM_K_MULTIPLE != 0 {
            return Err(CheckpointError::BadK { name: values_name, k, multiple: GEMM_K_MULTIPLE });
        }
        let scales_name = format!("{base}.{}", convention.block_scales_suffix());
        let scales = self.require(&scales_name, Dtype::F8_E4M3, "F8_E4M3")?;
        let cols = k / SCALE_VEC;
        if scales.shape != [rows, cols] {
            return Err(CheckpointError::WrongShape {
                name: scales_name,
                expected: format!("[N, K/16] = [{rows}, {cols}]"),
                found: scales.shape,
            });
        }
        if let Some(at) = scales.data.iter().position(|&c| e4m3_is_nan(c)) {
            return Err(CheckpointError::NanBlockScale { name: scales_name, row: at / cols, col: at % cols });
        }
        let global = self.scalar(&format!("{base}.{}", convention.weight_global_suffix()), convention)?;
        let input = self.scalar(&format!("{base}.{}", convention.input_scale_suffix()), convention)?;
        Ok(Projection {
            rows,
            k,
            values: values.data.to_vec(),
            plain_scales: scales.data.to_vec(),
            scales_name,
            global,
            input,
        })
    }

    /// Loads and prepares the experts `options.experts` of the MoE block `options.prefix`.
    ///
    /// Per expert: w1 and w3 must be `[I, H]` and w2 `[H, I]` (as values `[N, K/2]` uint8,
    /// block scales `[N, K/16]` F8_E4M3, fp32 one-element global and input scales), with H and I
    /// multiples of [`GEMM_K_MULTIPLE`]. The result's scales are all dequantization
    /// multipliers; see [`ExpertWeights`] for what each field holds.
    ///
    /// # Example
    ///
    /// A one-expert compressed-tensors file built in memory (block scales 1.0, values 0.5), read
    /// back with the dequantization scales ModelOpt would have stored:
    ///
    /// ```
    /// use nvfp4_format::checkpoint::{Checkpoint, Convention, LoadOptions};
    /// use nvfp4_format::checkpoint::safetensors::{serialize, tensor::TensorView, Dtype};
    ///
    /// let (i, h) = (64, 128); // intermediate and hidden sizes, multiples of 64
    /// let values_13 = vec![0x11u8; i * h / 2]; // e2m1 code 1 = 0.5 in both nibbles
    /// let values_2 = vec![0x11u8; h * i / 2];
    /// let one = 0x38u8; // e4m3 1.0
    /// let scales_13 = vec![one; i * h / 16];
    /// let scales_2 = vec![one; h * i / 16];
    /// let global = 2688.0f32.to_le_bytes(); // compressed-tensors stores 6 * 448 / amax
    /// let input = 4.0f32.to_le_bytes();
    /// let mut tensors = Vec::new();
    /// for (proj, values, scales, rows, k) in
    ///     [("w1", &values_13, &scales_13, i, h), ("w3", &values_13, &scales_13, i, h), ("w2", &values_2, &scales_2, h, i)]
    /// {
    ///     let base = format!("model.layers.0.mlp.experts.0.{proj}");
    ///     tensors.push((format!("{base}.weight_packed"), TensorView::new(Dtype::U8, vec![rows, k / 2], values)?));
    ///     tensors.push((format!("{base}.weight_scale"), TensorView::new(Dtype::F8_E4M3, vec![rows, k / 16], scales)?));
    ///     tensors.push((format!("{base}.weight_global_scale"), TensorView::new(Dtype::F32, vec![1], &global)?));
    ///     tensors.push((format!("{base}.input_global_scale"), TensorView::new(Dtype::F32, vec![1], &input)?));
    /// }
    /// let bytes = serialize(tensors, None)?;
    ///
    /// let checkpoint = Checkpoint::parse(&bytes)?;
    /// let options = LoadOptions::new("model.layers.0.mlp", Convention::CompressedTensors, 0..1);
    /// let loaded = checkpoint.load_experts(&options)?;
    /// let expert = &loaded.experts[0];
    /// assert_eq!((expert.w13.rows, expert.w13.k), (2 * i, h)); // gate rows, then up rows
    /// assert_eq!((expert.w2.rows, expert.w2.k), (h, i));
    /// assert_eq!(expert.w13.global_scale, 1.0 / 2688.0); // the dequantization multiplier
    /// assert_eq!(expert.w13_input_scale, 0.25);
    /// let w13 = expert.w13.to_matrix()?; // scales now in the device's blocked layout
    /// assert_eq!(w13.value(0, 0), 0.5 / 2688.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load_experts(&self, options: &LoadOptions<'_>) -> Result<LoadedExperts, CheckpointError> {
        let experts = options.experts.clone().map(|e| self.load_expert(options, e)).collect::<Result<Vec<_>, _>>()?;
        Ok(LoadedExperts { first_expert: options.experts.start, experts })
    }

    fn load_expert(&self, options: &LoadOptions<'_>, expert: usize) -> Result<ExpertWeights, CheckpointError> {
        let base = |proj: &str| format!("{}.experts.{expert}.{proj}", options.prefix);
        let p = options.projections;
        let convention = options.convention;
        let mut gate = self.projection(&base(p.gate), convention)?;
        let mut up = self.projection(&base(p.up), convention)?;
        let down = self.projection(&base(p.down), convention)?;
        let values_name = |proj: &str| format!("{}.{}", base(proj), convention.values_suffix());
        let (i, h) = (gate.rows, gate.k);
        if (up.rows, up.k) != (i, h) {
            return Err(CheckpointError::WrongShape {
                name: values_name(p.up),
                expected: format!("the gate's [I, H/2] = [{i}, {}]", h / 2),
                found: vec![up.rows, up.k / 2],
            });
        }
        if (down.rows, down.k) != (h, i) {
            return Err(CheckpointError::WrongShape {
                name: values_name(p.down),
                expected: format!("[H, I/2] = [{h}, {}]", i / 2),
                found: vec![down.rows, down.k / 2],
            });
        }
        let global = if gate.global == up.global {
            gate.global
        } else {
            let exact = match options.reconcile {
                Reconcile::Refuse => {
                    return Err(CheckpointError::GlobalScalesDiffer { expert, w1: gate.global, w3: up.global })
                }
                Reconcile::Exact => true,
                Reconcile::Round => false,
            };
            let shared = gate.global.max(up.global);
            let smaller = if gate.global < up.global { &mut gate } else { &mut up };
            rescale(smaller, shared, expert, exact)?;
            shared
        };
        let mut values = gate.values;
        values.extend_from_slice(&up.values);
        let mut plain_scales = gate.plain_scales;
        plain_scales.extend_from_slice(&up.plain_scales);
        Ok(ExpertWeights {
            expert,
            w13: PlainWeight { rows: 2 * i, k: h, values, plain_scales, global_scale: global },
            w13_input_scale: gate.input.max(up.input),
            w2: PlainWeight {
                rows: down.rows,
                k: down.k,
                values: down.values,
                plain_scales: down.plain_scales,
                global_scale: down.global,
            },
            w2_input_scale: down.input,
        })
    }
}

/// Moves `p` from its global scale `g` to `shared` (≥ `g`): each block scale `s` becomes
/// `s · g / shared` in e4m3, exactly (`exact`, else an error) or rounded to nearest.
fn rescale(p: &mut Projection, shared: f32, expert: usize, exact: bool) -> Result<(), CheckpointError> {
    let (g, big) = (f64::from(p.global), f64::from(shared));
    let cols = p.k / SCALE_VEC;
    for (at, code) in p.plain_scales.iter_mut().enumerate() {
        let s = f64::from(e4m3_to_f32(*code));
        let new = e4m3_from_f64(s * g / big);
        // Both products are exact in f64 (4 x 24 significant bits), so this compares the
        // dequantized block factors exactly.
        if exact && f64::from(e4m3_to_f32(new)) * big != s * g {
            return Err(CheckpointError::NotExact {
                expert,
                name: p.scales_name.clone(),
                row: at / cols,
                col: at % cols,
            });
        }
        *code = new;
    }
    p.global = shared;
    Ok(())
}

#[cfg(test)]
mod tests;
