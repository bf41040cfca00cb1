//! `MoeBlock`: the whole MoE expert block (`nvfp4_gemm::moe_block::ExpertBlock`) for the package's
//! `MoEBlock`. The experts come as host bytes, borrowed from Python's `bytes`: stacked tensors
//! (packed values, plain e4m3 scales, one global scale per weight, the input scales) with the
//! sizes from the package, or safetensors images of a checkpoint's layer read by
//! `nvfp4_format::checkpoint` (`MoeBlock::from_checkpoint`, `checkpoint_experts`); each call
//! reads its tensors once and runs the block on the current stream.

use crate::errors::{py_err, value_error};
use crate::{hooks, read, Device};
use cudarc::driver::{sys, CudaStream};
use nvfp4_gemm::format::checkpoint::{Convention, LoadOptions, Projections, Reconcile};
use nvfp4_gemm::moe_block::{
    load_checkpoint_experts, Activation, ActivationPlacement, BlockOptions, BlockPlan, BlockShape, BlockViews, Dense16,
    ExpertBlock, ExpertWeights, IdType, LoadedExperts, PlainWeight, Precision, RouterWeightAt, WeightType,
};
use nvfp4_gemm::tensor::{self, Arg, DType, SameDevice};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::sync::{Arc, Mutex};

const CALL: &str = "MoEBlock";

/// The block and the last stream it ran on (borrowed from the caller).
struct Inner {
    block: ExpertBlock,
    stream: Option<(u64, Arc<CudaStream>)>,
}

/// The whole expert block planned for one GPU (the package's `MoEBlock` documents it).
#[pyclass(module = "nvfp4_gemm._native")]
pub struct MoeBlock {
    inner: Mutex<Inner>,
    device: Py<Device>,
    ordinal: u32,
    dtype: DType,
    hidden: usize,
    top_k: usize,
    max_tokens: usize,
}

/// One weight per expert from its stacked bytes: `experts` matrices `rows x k` back to back.
fn weights(values: &[u8], scales: &[u8], globals: &[f32], rows: usize, k: usize) -> PyResult<Vec<PlainWeight>> {
    let experts = globals.len();
    let (per_v, per_s) = (rows * k / 2, rows * k / 16);
    if values.len() != experts * per_v || scales.len() != experts * per_s {
        return Err(value_error(format!(
            "{CALL}: {} value and {} scale bytes for {experts} experts of {rows} x {k} (expected {} and {})",
            values.len(),
            scales.len(),
            experts * per_v,
            experts * per_s
        )));
    }
    Ok((0..experts)
        .map(|e| PlainWeight {
            rows,
            k,
            values: values[e * per_v..(e + 1) * per_v].to_vec(),
            plain_scales: scales[e * per_s..(e + 1) * per_s].to_vec(),
            global_scale: globals[e],
        })
        .collect())
}

/// The block's options from the package's arguments.
struct BlockKind {
    options: BlockOptions,
    dtype: DType,
}

impl BlockKind {
    fn parse(activation: &str, w4a16: bool, dtype: &Bound<'_, PyAny>, weight_at_input: bool) -> PyResult<BlockKind> {
        let activation = match activation {
            "silu" => Activation::Silu,
            "gelu_tanh" | "gelu" => Activation::GeluTanh,
            "relu2" => Activation::Relu2,
            other => {
                return Err(value_error(format!("activation: '{other}'; expected 'silu', 'gelu_tanh' or 'relu2'")))
            }
        };
        let dtype = read::dtype_arg(Some(dtype))?.unwrap_or(DType::Bf16);
        let dense = match dtype {
            DType::F16 => Dense16::F16,
            DType::Bf16 => Dense16::Bf16,
            other => return Err(value_error(format!("dtype: {}; expected float16 or bfloat16", other.name()))),
        };
        let precision = if w4a16 { Precision::W4a16 } else { Precision::W4a4 };
        let mut options = BlockOptions::new(activation, precision, dense);
        if weight_at_input {
            options = options.with_router_weight_at(RouterWeightAt::Input);
        }
        Ok(BlockKind { options, dtype })
    }
}

/// The experts `first .. first + count` of a checkpoint's shards (`nvfp4_format::checkpoint`:
/// every name, dtype, shape and scale checked there; its errors become `ValueError`s).
fn load(
    shards: &[Bound<'_, PyBytes>],
    prefix: &str,
    convention: &str,
    first: usize,
    count: usize,
    projections: &(String, String, String),
    reconcile: &str,
) -> PyResult<LoadedExperts> {
    let convention = match convention {
        "modelopt" => Convention::ModelOpt,
        "compressed-tensors" | "compressed_tensors" => Convention::CompressedTensors,
        other => {
            return Err(value_error(format!("convention: '{other}'; expected 'modelopt' or 'compressed-tensors'")))
        }
    };
    let reconcile = match reconcile {
        "refuse" => Reconcile::Refuse,
        "exact" => Reconcile::Exact,
        "round" => Reconcile::Round,
        other => return Err(value_error(format!("reconcile: '{other}'; expected 'refuse', 'exact' or 'round'"))),
    };
    // Borrowed from Python's `bytes` (immutable, kept alive by the caller's list).
    let bytes: Vec<&[u8]> = shards.iter().map(|s| s.as_bytes()).collect();
    let (gate, up, down) = projections;
    let options = LoadOptions::new(prefix, convention, first..first + count)
        .with_projections(Projections { gate, up, down })
        .with_reconcile(reconcile);
    load_checkpoint_experts(CALL, &bytes, &options).map_err(py_err)
}

/// What a checkpoint's experts hold, read as [`MoeBlock::from_checkpoint`] reads them (no GPU):
/// the sizes and every scale as a dequantization multiplier.
#[pyfunction]
#[pyo3(signature = (shards, prefix, convention, first_expert, experts, projections, reconcile))]
#[allow(clippy::too_many_arguments)]
pub fn checkpoint_experts<'py>(
    py: Python<'py>,
    shards: Vec<Bound<'py, PyBytes>>,
    prefix: &str,
    convention: &str,
    first_expert: usize,
    experts: usize,
    projections: (String, String, String),
    reconcile: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let loaded = load(&shards, prefix, convention, first_expert, experts, &projections, reconcile)?;
    let first = &loaded.experts[0];
    let d = PyDict::new(py);
    d.set_item("first_expert", loaded.first_expert)?;
    d.set_item("experts", loaded.experts.len())?;
    d.set_item("hidden", first.w13.k)?;
    d.set_item("intermediate", first.w2.k)?;
    d.set_item("w13_rows", first.w13.rows)?;
    d.set_item("w13_global_scales", loaded.experts.iter().map(|x| x.w13.global_scale).collect::<Vec<_>>())?;
    d.set_item("w2_global_scales", loaded.experts.iter().map(|x| x.w2.global_scale).collect::<Vec<_>>())?;
    d.set_item("w13_input_scales", loaded.w13_input_scales())?;
    d.set_item("w2_input_scales", loaded.w2_input_scales())?;
    Ok(d)
}

/// Plans the block for `loaded` on device `ordinal` (the caller's stream of it).
fn plan(
    py: Python<'_>,
    loaded: &LoadedExperts,
    shape: BlockShape,
    kind: BlockKind,
    ordinal: u32,
    stream: Option<&Bound<'_, PyAny>>,
    activation_epilogue: bool,
) -> PyResult<MoeBlock> {
    let device = hooks::device(py, ordinal)?;
    let handle = hooks::stream(py, stream, ordinal)?;
    let block = {
        let dev = device.bind(py).borrow();
        // SAFETY: the caller's current stream of this device, alive through the planning.
        let s = unsafe { dev.gpu().context().wrap_borrowed_stream(handle as sys::CUstream) };
        let activation =
            if activation_epilogue { ActivationPlacement::FirstGemmEpilogue } else { ActivationPlacement::Kernel };
        let plan = BlockPlan { activation, ..BlockPlan::default() };
        let block = ExpertBlock::with_plan(dev.gpu(), &s, shape, kind.options, loaded, plan).map_err(py_err)?;
        Inner { block, stream: Some((handle, s)) }
    };
    let (hidden, top_k, max_tokens) = (shape.hidden, shape.top_k, shape.max_tokens);
    Ok(MoeBlock { inner: Mutex::new(block), device, ordinal, dtype: kind.dtype, hidden, top_k, max_tokens })
}

#[pymethods]
impl MoeBlock {
    /// Plans the block on device `ordinal` from the experts' bytes (module docs; the package's
    /// `MoEBlock` passes them).
    #[new]
    #[pyo3(signature = (w13, w13_scale, w13_global, w2, w2_scale, w2_global, w13_input_scale, w2_input_scale, hidden, intermediate, first_expert, top_k, max_tokens, activation, w4a16, dtype, weight_at_input, ordinal, stream=None, activation_epilogue=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        w13: &[u8],
        w13_scale: &[u8],
        w13_global: Vec<f32>,
        w2: &[u8],
        w2_scale: &[u8],
        w2_global: Vec<f32>,
        w13_input_scale: Vec<f32>,
        w2_input_scale: Vec<f32>,
        hidden: usize,
        intermediate: usize,
        first_expert: usize,
        top_k: usize,
        max_tokens: usize,
        activation: &str,
        w4a16: bool,
        dtype: &Bound<'_, PyAny>,
        weight_at_input: bool,
        ordinal: u32,
        stream: Option<&Bound<'_, PyAny>>,
        activation_epilogue: bool,
    ) -> PyResult<MoeBlock> {
        let experts = w13_global.len();
        let kind = BlockKind::parse(activation, w4a16, dtype, weight_at_input)?;
        let n1 = if kind.options.activation.gated() { 2 * intermediate } else { intermediate };
        let same = [w2_global.len(), w13_input_scale.len(), w2_input_scale.len()];
        if same.iter().any(|&n| n != experts) {
            return Err(value_error(format!(
                "{CALL}: {experts} w13 global scales but {:?} w2 global / input scales; one per expert each",
                same
            )));
        }
        let w13 = weights(w13, w13_scale, &w13_global, n1, hidden)?;
        let w2 = weights(w2, w2_scale, &w2_global, hidden, intermediate)?;
        let loaded = LoadedExperts {
            first_expert,
            experts: w13
                .into_iter()
                .zip(w2)
                .enumerate()
                .map(|(e, (w13, w2))| ExpertWeights {
                    expert: first_expert + e,
                    w13,
                    w2,
                    w13_input_scale: w13_input_scale[e],
                    w2_input_scale: w2_input_scale[e],
                })
                .collect(),
        };
        let shape = BlockShape { first_expert: first_expert as i64, experts, hidden, intermediate, top_k, max_tokens };
        plan(py, &loaded, shape, kind, ordinal, stream, activation_epilogue)
    }

    /// Plans the block from a checkpoint's experts as stored: `shards` hold safetensors bytes
    /// (whole files, or the package's extracts of the layer's tensors), read by
    /// `nvfp4_format::checkpoint` with `convention` (`"modelopt"`, `"compressed-tensors"`), the
    /// projection names and the w1/w3 `reconcile` policy (`"refuse"`, `"exact"`, `"round"`), for
    /// the experts `first_expert .. first_expert + experts`; H and I from the tensors.
    #[staticmethod]
    #[pyo3(signature = (shards, prefix, convention, first_expert, experts, projections, reconcile, top_k, max_tokens, activation, w4a16, dtype, weight_at_input, ordinal, stream=None, activation_epilogue=false))]
    #[allow(clippy::too_many_arguments)]
    fn from_checkpoint(
        py: Python<'_>,
        shards: Vec<Bound<'_, PyBytes>>,
        prefix: &str,
        convention: &str,
        first_expert: usize,
        experts: usize,
        projections: (String, String, String),
        reconcile: &str,
        top_k: usize,
        max_tokens: usize,
        activation: &str,
        w4a16: bool,
        dtype: &Bound<'_, PyAny>,
        weight_at_input: bool,
        ordinal: u32,
        stream: Option<&Bound<'_, PyAny>>,
        activation_epilogue: bool,
    ) -> PyResult<MoeBlock> {
        let kind = BlockKind::parse(activation, w4a16, dtype, weight_at_input)?;
        let loaded = load(&shards, prefix, convention, first_expert, experts, &projections, reconcile)?;
        let shape = BlockShape::of_experts(&loaded, top_k, max_tokens)
            .ok_or_else(|| value_error(format!("{CALL}: no expert was loaded")))?;
        plan(py, &loaded, shape, kind, ordinal, stream, activation_epilogue)
    }

    /// The hidden size `H` the block was planned for.
    #[getter]
    fn hidden(&self) -> usize {
        self.hidden
    }

    /// One step: `y = block(hidden_states)` with the router's `topk_weights` and `topk_ids`
    /// (`[T, top_k]`), into `out` (`[T, H]`) on `stream` (None: the current one). Returns `out`.
    #[pyo3(signature = (hidden_states, topk_weights, topk_ids, out, stream=None))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        hidden_states: &Bound<'py, PyAny>,
        topk_weights: &Bound<'py, PyAny>,
        topk_ids: &Bound<'py, PyAny>,
        out: &Bound<'py, PyAny>,
        stream: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let arg = |name| Arg::of(CALL, name);
        let tx = read::tensor(hidden_states, arg("hidden_states"))?;
        let tokens = match *tx.shape.get() {
            [t, _] if t >= 0 => t as usize,
            _ => {
                return Err(value_error(format!(
                    "`hidden_states`: shape {:?}; expected [tokens, {}]",
                    tx.shape.get(),
                    self.hidden
                )))
            }
        };
        if tokens > self.max_tokens {
            return Err(value_error(format!(
                "`hidden_states`: {tokens} tokens; the block was planned for at most {}",
                self.max_tokens
            )));
        }
        let (h, k) = (self.hidden, self.top_k);
        let tw = read::tensor(topk_weights, arg("topk_weights"))?;
        let ti = read::tensor(topk_ids, arg("topk_ids"))?;
        let to = read::tensor(out, arg("out"))?;
        let x =
            tensor::exact(&tx, arg("hidden_states"), &[self.dtype], &[tokens, h], "the block takes").map_err(py_err)?;
        let ids = tensor::exact(&ti, arg("topk_ids"), &[DType::I32, DType::I64], &[tokens, k], "the block takes")
            .map_err(py_err)?;
        let weights =
            tensor::exact(&tw, arg("topk_weights"), &[DType::F32, DType::Bf16], &[tokens, k], "the block takes")
                .map_err(py_err)?;
        let y = tensor::exact(&to, arg("out"), &[self.dtype], &[tokens, h], "the block writes").map_err(py_err)?;
        let mut device = SameDevice::new(Some(self.ordinal));
        for (t, name) in [(&tx, "hidden_states"), (&tw, "topk_weights"), (&ti, "topk_ids"), (&to, "out")] {
            device.check(t, arg(name)).map_err(py_err)?;
        }
        let views = BlockViews {
            x,
            bf16: self.dtype == DType::Bf16,
            tokens,
            ids,
            ids_type: if ti.dtype == DType::I64 { IdType::I64 } else { IdType::I32 },
            weights,
            weights_type: if tw.dtype == DType::Bf16 { WeightType::Bf16 } else { WeightType::F32 },
            y,
        };
        let handle = hooks::stream(py, stream, self.ordinal)?;
        let dev = self.device.bind(py).borrow();
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.stream.as_ref().map(|s| s.0) != Some(handle) {
            // SAFETY: the caller's current stream of the block's device.
            let s = unsafe { dev.gpu().context().wrap_borrowed_stream(handle as sys::CUstream) };
            inner.stream = Some((handle, s));
        }
        let s = inner.stream.as_ref().expect("set above").1.clone();
        // SAFETY: live CUDA tensors of this device, checked (dtype, shape, contiguity, alignment),
        // kept alive by the caller through the call; the stream is the caller's.
        unsafe { inner.block.run_views(&s, views) }.map_err(py_err)?;
        Ok(out.clone())
    }
}
