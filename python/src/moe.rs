//! The mixture-of-experts layer's grouped GEMM with the routing on the GPU (`nvfp4_gemm.MoE`):
//! the experts' weights checked and planned once (`MoeLayer`), then per call the routed
//! activations quantized (W4A4) or read as they are (W4A16) and the GEMM run with the group sizes
//! read on the device (`MoePlan::run_views`).

use crate::errors::{py_err, type_error, value_error};
use crate::{hooks, read, Device};
use cudarc::driver::{sys, CudaStream};
use nvfp4_gemm::moe::{MoeBuffers, MoePlan, MoeProblem, MoeTokens, TokenLayout};
use nvfp4_gemm::problem::BufferView;
use nvfp4_gemm::tensor::{self, Arg, DType, SameDevice, TensorDesc};
use nvfp4_gemm::{OutputType, TokenKind};
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};

const CALL: &str = "MoE";

/// Sizes of a MoE problem: `(token_rows, scale_rows, sizes_len, a_values, a_scales, b_values,
/// b_scales, c_elements)`.
type MoeSizes = (usize, usize, usize, usize, usize, usize, usize, usize);

/// Sizes of a MoE problem, checked by the library (no GPU needed): `token_rows`, `scale_rows`,
/// `sizes_len`, `a_values`, `a_scales`, `b_values`, `b_scales`, `c_elements`.
#[pyfunction]
pub fn moe_sizes(groups: usize, n: usize, k: usize, masked: bool, bound: usize) -> PyResult<MoeSizes> {
    let layout =
        if masked { TokenLayout::Masked { max_rows: bound } } else { TokenLayout::Contiguous { max_tokens: bound } };
    let p = MoeProblem::new(groups, n, k, layout, OutputType::F16).map_err(py_err)?;
    let (a, b) = (p.a_sizes(), p.b_sizes());
    Ok((p.token_rows(), p.scale_rows(), p.sizes_len(), a.values, a.scales, b.values, b.scales, p.c_elements()))
}

/// The plan with the last stream it ran on, and the buffers of a call (their memory reused).
struct Inner {
    plan: MoePlan,
    stream: Option<(u64, Arc<CudaStream>)>,
    weights: Vec<(BufferView, BufferView)>,
    alphas: Vec<f32>,
}

/// A mixture-of-experts layer: the experts' weights planned once (see the package's `MoE`).
#[pyclass(module = "nvfp4_gemm._native")]
pub struct MoeLayer {
    inner: Mutex<Inner>,
    device: Py<Device>,
    problem: MoeProblem,
    /// W4A4: the layer's NVFP4 token buffers (values, scales).
    tokens: Option<(Py<PyAny>, Py<PyAny>, BufferView, BufferView)>,
    input_global_scale: f32,
    dtype: DType,
    w4a16: Option<DType>,
    ordinal: u32,
    group_experts: Vec<usize>,
    experts: usize,
    kernel: String,
    /// The weights, scales and conversions the views point into.
    _keep: Vec<Py<PyAny>>,
}

/// A positive int bound of the layout.
fn bound(obj: Option<&Bound<'_, PyAny>>, name: &str, layout: &str) -> PyResult<usize> {
    let value = obj
        .filter(|o| !o.is_none() && !o.is_instance_of::<pyo3::types::PyBool>())
        .and_then(|o| o.extract::<i64>().ok());
    match value {
        Some(v) if v >= 1 => Ok(v as usize),
        _ => {
            let shown = match obj {
                Some(o) => o.repr()?.to_string(),
                None => "None".into(),
            };
            Err(value_error(format!("{name}: {shown}; the {layout} layout needs a positive int")))
        }
    }
}

/// The experts each group runs (None: one group per expert).
fn parse_group_experts(obj: Option<&Bound<'_, PyAny>>, experts: usize) -> PyResult<Vec<usize>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok((0..experts).collect()) };
    let not_ints =
        || -> PyResult<PyErr> { Ok(type_error(format!("group_experts: {} is not a sequence of ints", obj.repr()?))) };
    let Ok(items) = obj.try_iter() else { return Err(not_ints()?) };
    let mut out = vec![];
    for x in items {
        let x = x?;
        if !x.is_instance_of::<pyo3::types::PyInt>() {
            return Err(not_ints()?);
        }
        out.push(x.extract::<i64>()?);
    }
    if out.is_empty() {
        return Err(value_error("group_experts: empty; at least one group is needed".into()));
    }
    for (g, &e) in out.iter().enumerate() {
        if e < 0 || e as usize >= experts {
            return Err(value_error(format!(
                "group_experts: group {g} runs expert {e}; the weights hold experts 0..{}",
                experts - 1
            )));
        }
    }
    Ok(out.into_iter().map(|e| e as usize).collect())
}

#[pymethods]
impl MoeLayer {
    /// Checks the experts' weights and the layer's options and plans the layer (the package's
    /// `MoE` documents the arguments).
    #[new]
    #[pyo3(signature = (weights, weight_scales, alphas=None, layout="contiguous", max_tokens=None, max_rows=None, out_dtype=None, input_global_scale=1.0, scale_layout="blocked", group_experts=None, w4a16=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        weights: &Bound<'_, PyAny>,
        weight_scales: &Bound<'_, PyAny>,
        alphas: Option<&Bound<'_, PyAny>>,
        layout: &str,
        max_tokens: Option<&Bound<'_, PyAny>>,
        max_rows: Option<&Bound<'_, PyAny>>,
        out_dtype: Option<&Bound<'_, PyAny>>,
        input_global_scale: f64,
        scale_layout: &str,
        group_experts: Option<&Bound<'_, PyAny>>,
        w4a16: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<MoeLayer> {
        let w4a16 = read::dtype_arg(w4a16)?;
        if let Some(t) = w4a16 {
            if t.activations().is_none() {
                return Err(type_error(format!(
                    "w4a16: {}; expected float16 or bfloat16 (the activations' type)",
                    t.name()
                )));
            }
        }
        let mut device = SameDevice::new(None);
        let tw = read::tensor(weights, Arg::of(CALL, "weights"))?;
        let (experts, n, k) = tensor::experts(&tw, Arg::of(CALL, "weights")).map_err(py_err)?;
        device.check(&tw, Arg::of(CALL, "weights")).map_err(py_err)?;
        let mut keep: Vec<Py<PyAny>> = vec![weights.clone().unbind(), weight_scales.clone().unbind()];
        let mut ts = read::tensor(weight_scales, Arg::of(CALL, "weight_scales"))?;
        let mut blocked_obj = weight_scales.clone();
        match scale_layout {
            "blocked" => {}
            "plain" => {
                tensor::expert_plain_scales(&ts, Arg::of(CALL, "weight_scales"), experts, n, k).map_err(py_err)?;
                let blocked = hooks::experts_to_blocked(py, weight_scales, experts)?;
                ts = read::tensor(&blocked, Arg::of(CALL, "weight_scales"))?;
                keep.push(blocked.clone().unbind());
                blocked_obj = blocked;
            }
            other => return Err(value_error(format!("scale_layout: '{other}'; expected 'blocked' or 'plain'"))),
        }
        let scales = tensor::expert_scales(&ts, Arg::of(CALL, "weight_scales"), experts, n, k).map_err(py_err)?;
        device.check(&ts, Arg::of(CALL, "weight_scales")).map_err(py_err)?;
        if alphas.is_some_and(read::is_tensor) {
            return Err(type_error(
                "alphas: a device tensor is not supported here: the MoE layer's alphas are uploaded with its weights, \
                 so pass Python floats (a list, one per expert); grouped_gemm, prepare and grouped_gemm_stacked take a \
                 device tensor"
                    .into(),
            ));
        }
        let expert_alphas = read::floats(alphas, experts, "alphas")?;
        tensor::check_alphas(CALL, "alphas", &expert_alphas).map_err(py_err)?;
        let group_experts = parse_group_experts(group_experts, experts)?;
        let groups = group_experts.len();
        let token_layout = match layout {
            "contiguous" => TokenLayout::Contiguous { max_tokens: bound(max_tokens, "max_tokens", layout)? },
            "masked" => TokenLayout::Masked { max_rows: bound(max_rows, "max_rows", layout)? },
            other => return Err(value_error(format!("layout: '{other}'; expected 'contiguous' or 'masked'"))),
        };
        let g = input_global_scale;
        if !(g > 0.0 && g.is_finite()) {
            return Err(value_error(format!(
                "input_global_scale: {} is not finite and positive",
                tensor::float_words(g)
            )));
        }
        let dtype = tensor::output_type(CALL, read::dtype_arg(out_dtype)?, DType::Bf16).map_err(|e| match e {
            nvfp4_gemm::Error::WrongType { reason, .. } => type_error(format!("out_dtype: {reason}")),
            other => py_err(other),
        })?;
        let mut problem = MoeProblem::new(groups, n, k, token_layout, dtype).map_err(py_err)?;
        if let Some(a) = w4a16.and_then(DType::activations) {
            problem = problem.with_tokens(TokenKind::Dense(a));
        }
        let ordinal = match device.device() {
            Some(d) => d,
            None => hooks::current_device(py)?,
        };
        let dev = hooks::device(py, ordinal)?;
        // W4A16's weights prepacked once, here, on the GPU and the current stream (the layer
        // keeps the prepacked copy).
        let (values_base, scales_base) = match w4a16 {
            Some(t) => {
                let stack = nvfp4_gemm::w4a16::WeightStack { experts, rows: n, k };
                let act = t.activations().expect("checked");
                let (pv, ps) = crate::prepack_on_device(py, weights, &blocked_obj, stack, act, None)?;
                // Complete before the layer exists, whichever stream its calls run on (as the
                // plan's own memory is): the construction's one synchronization.
                let handle = hooks::stream(py, None, ordinal)?;
                let d = dev.bind(py).borrow();
                // SAFETY: the current stream of the layer's device.
                unsafe { crate::borrow(&d, handle) }.synchronize().map_err(|error| {
                    py_err(nvfp4_gemm::Error::Driver {
                        during: "waiting for the W4A16 prepack",
                        error,
                        detail: String::new(),
                    })
                })?;
                let (v, s) = (
                    read::tensor(&pv, Arg::of(CALL, "weights"))?.ptr,
                    read::tensor(&ps, Arg::of(CALL, "weight_scales"))?.ptr,
                );
                keep.push(pv.unbind());
                keep.push(ps.unbind());
                (v, s)
            }
            None => (tw.ptr, scales.ptr),
        };
        let b = problem.b_sizes();
        let weights_views: Vec<(BufferView, BufferView)> = group_experts
            .iter()
            .map(|&e| {
                (
                    BufferView { ptr: values_base + (e * b.values) as u64, len: b.values },
                    BufferView { ptr: scales_base + (e * b.scales) as u64, len: b.scales },
                )
            })
            .collect();
        let alphas: Vec<f32> = group_experts.iter().map(|&e| expert_alphas[e]).collect();
        let plan = {
            let d = dev.bind(py).borrow();
            MoePlan::new(d.gpu(), problem.clone()).map_err(py_err)?
        };
        let kernel = plan.summary().kernel.clone();
        let tokens = if w4a16.is_some() {
            None
        } else {
            // The quantized tokens: owned by the layer, so their address never changes.
            let a = problem.a_sizes();
            let v = hooks::alloc(py, weights, &[a.values.max(16)], "uint8", ordinal, true)?;
            let s = hooks::alloc(py, weights, &[a.scales.max(16)], "uint8", ordinal, true)?;
            let (pv, ps) =
                (read::tensor(&v, Arg::of(CALL, "a_values"))?.ptr, read::tensor(&s, Arg::of(CALL, "a_scales"))?.ptr);
            Some((v.unbind(), s.unbind(), BufferView { ptr: pv, len: a.values }, BufferView { ptr: ps, len: a.scales }))
        };
        Ok(MoeLayer {
            inner: Mutex::new(Inner { plan, stream: None, weights: weights_views, alphas }),
            device: dev,
            problem,
            tokens,
            input_global_scale: g as f32,
            dtype: DType::of_output(dtype),
            w4a16,
            ordinal,
            group_experts,
            experts,
            kernel,
            _keep: keep,
        })
    }

    /// The GEMM kernels the plan runs (for people).
    #[getter]
    fn kernel(&self) -> String {
        self.kernel.clone()
    }

    /// `(token_rows, scale_rows, sizes_len, c_elements, experts, groups, n, k)`.
    #[getter]
    fn sizes(&self) -> MoeSizes {
        let p = &self.problem;
        (p.token_rows(), p.scale_rows(), p.sizes_len(), p.c_elements(), self.experts, p.groups(), p.n(), p.k())
    }

    /// The experts each group runs.
    #[getter]
    fn group_experts(&self) -> Vec<usize> {
        self.group_experts.clone()
    }

    /// The layer's NVFP4 token buffers `(values, scales)` (W4A4), or None.
    #[getter]
    fn token_buffers(&self, py: Python<'_>) -> Option<(Py<PyAny>, Py<PyAny>)> {
        self.tokens.as_ref().map(|(v, s, _, _)| (v.clone_ref(py), s.clone_ref(py)))
    }

    /// One call of the layer: `x` (the routed activations) quantized into the layer's token
    /// buffers (W4A4) or read as they are (W4A16), then the grouped GEMM into `out` (new, zeroed,
    /// when None) with the sizes `sizes` read on the device. Returns `out`.
    #[pyo3(signature = (x, sizes, out=None, stream=None))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        sizes: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
        stream: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let tx = read::tensor(x, Arg::of(CALL, "x"))?;
        let allowed: &[DType] = match &self.w4a16 {
            Some(t) => std::slice::from_ref(t),
            None => tensor::DENSE,
        };
        let x_view =
            tensor::exact(&tx, Arg::of(CALL, "x"), allowed, &self.x_shape(), "the layer takes").map_err(py_err)?;
        let (sizes_view, out, c, mut device) = self.common(py, x, &tx, sizes, out)?;
        device.check(&tx, Arg::of(CALL, "x")).map_err(py_err)?;
        let dev = self.device.bind(py).borrow();
        let handle = hooks::stream(py, stream, self.ordinal)?;
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the caller's current stream of the layer's device.
        let s = unsafe { inner.stream(&dev, handle) };
        let a = match (&self.tokens, self.w4a16) {
            (Some((_, _, values, scales)), _) => {
                // SAFETY: live CUDA tensors of this device, checked; the layer's own buffers.
                unsafe {
                    dev.quantizer().quantize_grouped_views(
                        &s,
                        x_view,
                        tx.dtype == DType::Bf16,
                        &self.problem,
                        sizes_view,
                        self.input_global_scale,
                        *values,
                        *scales,
                    )
                }
                .map_err(py_err)?;
                MoeTokens::Nvfp4 { values: *values, scales: *scales }
            }
            (None, Some(t)) => MoeTokens::Dense { activations: x_view, kind: t.activations().expect("checked") },
            (None, None) => unreachable!("a W4A4 layer has token buffers"),
        };
        self.gemm_on(&mut inner, &s, sizes_view, a, c)?;
        Ok(out)
    }

    /// The grouped GEMM alone on tokens already quantized in the library's layout (W4A4).
    #[pyo3(signature = (a_values, a_scales, sizes, out=None, stream=None))]
    fn gemm<'py>(
        &self,
        py: Python<'py>,
        a_values: &Bound<'py, PyAny>,
        a_scales: &Bound<'py, PyAny>,
        sizes: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
        stream: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if self.w4a16.is_some() {
            return Err(type_error("gemm: a W4A16 layer takes 16-bit activations: call the layer itself".into()));
        }
        let ta = read::tensor(a_values, Arg::of(CALL, "a_values"))?;
        let tsa = read::tensor(a_scales, Arg::of(CALL, "a_scales"))?;
        let a = self.problem.a_sizes();
        let what = "the layer's tokens need";
        let values = tensor::bytes(&ta, Arg::of(CALL, "a_values"), tensor::VALUES, a.values, what).map_err(py_err)?;
        let scales = tensor::bytes(&tsa, Arg::of(CALL, "a_scales"), tensor::SCALES, a.scales, what).map_err(py_err)?;
        let (sizes_view, out, c, mut device) = self.common(py, a_values, &ta, sizes, out)?;
        device.check(&ta, Arg::of(CALL, "a_values")).map_err(py_err)?;
        device.check(&tsa, Arg::of(CALL, "a_scales")).map_err(py_err)?;
        let dev = self.device.bind(py).borrow();
        let handle = hooks::stream(py, stream, self.ordinal)?;
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the caller's current stream of the layer's device.
        let s = unsafe { inner.stream(&dev, handle) };
        self.gemm_on(&mut inner, &s, sizes_view, MoeTokens::Nvfp4 { values, scales }, c)?;
        Ok(out)
    }

    /// The sticky status word `(bits, text)`; synchronizes the stream.
    #[pyo3(signature = (stream=None))]
    fn status(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<(u32, String)> {
        let dev = self.device.bind(py).borrow();
        let handle = hooks::stream(py, stream, self.ordinal)?;
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the caller's current stream of the layer's device.
        let s = unsafe { inner.stream(&dev, handle) };
        let status = inner.plan.read_status(&s).map_err(py_err)?;
        Ok((status.0, status.to_string()))
    }

    /// Tells the plan that the calls that follow route at most `rows` rows in all their groups
    /// together (None: no bound beyond the layout's); the package's `MoE.set_routed_rows`.
    fn set_routed_rows(&self, rows: &Bound<'_, PyAny>) -> PyResult<()> {
        let rows = if rows.is_none() {
            None
        } else {
            match read::exact_int(rows) {
                Some(v) if v >= 0 => Some(v as usize),
                Some(v) => return Err(value_error(format!("rows: {v}; needs None or an int >= 0"))),
                None => return Err(type_error(format!("rows: {}; needs None or an int >= 0", rows.repr()?))),
            }
        };
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).plan.set_routed_rows(rows);
        Ok(())
    }

    /// Zeroes the status word on the stream (capturable).
    #[pyo3(signature = (stream=None))]
    fn clear_status(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let dev = self.device.bind(py).borrow();
        let handle = hooks::stream(py, stream, self.ordinal)?;
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the caller's current stream of the layer's device.
        let s = unsafe { inner.stream(&dev, handle) };
        inner.plan.clear_status(&s).map_err(py_err)
    }
}

impl Inner {
    /// The caller's stream `handle` of `dev`, borrowed.
    ///
    /// # Safety
    /// `handle` a live stream of the device's context (or 0).
    unsafe fn stream(&mut self, dev: &Device, handle: u64) -> Arc<CudaStream> {
        if self.stream.as_ref().map(|s| s.0) != Some(handle) {
            // SAFETY: the caller's contract.
            let s = unsafe { dev.gpu().context().wrap_borrowed_stream(handle as sys::CUstream) };
            self.stream = Some((handle, s));
        }
        self.stream.as_ref().expect("set above").1.clone()
    }
}

impl MoeLayer {
    /// The shape of the activations `x`.
    fn x_shape(&self) -> Vec<usize> {
        let p = &self.problem;
        match p.layout() {
            TokenLayout::Masked { max_rows } => vec![p.groups(), max_rows, p.k()],
            TokenLayout::Contiguous { max_tokens } => vec![max_tokens, p.k()],
        }
    }

    /// The shape of C.
    fn out_shape(&self) -> Vec<usize> {
        let p = &self.problem;
        match p.layout() {
            TokenLayout::Masked { max_rows } => vec![p.groups(), max_rows, p.n()],
            TokenLayout::Contiguous { max_tokens } => vec![max_tokens, p.n()],
        }
    }

    /// The sizes and C of a call (C new and zeroed when `out` is None, allocated like `like`),
    /// checked; the call's device check so far.
    fn common<'py>(
        &self,
        py: Python<'py>,
        like: &Bound<'py, PyAny>,
        like_desc: &TensorDesc,
        sizes: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(BufferView, Bound<'py, PyAny>, BufferView, SameDevice)> {
        let _ = like_desc;
        let mut device = SameDevice::new(Some(self.ordinal));
        let ts = read::tensor(sizes, Arg::of(CALL, "sizes"))?;
        let what = match self.problem.layout() {
            TokenLayout::Contiguous { .. } => "the contiguous layout takes expert_offsets [E + 1] =",
            TokenLayout::Masked { .. } => "the masked layout takes counts [E] =",
        };
        let sizes_view = tensor::sizes(&ts, Arg::of(CALL, "sizes"), self.problem.sizes_len(), what).map_err(py_err)?;
        device.check(&ts, Arg::of(CALL, "sizes")).map_err(py_err)?;
        let out = match out.filter(|o| !o.is_none()) {
            Some(o) => o.clone(),
            None => hooks::alloc(py, like, &self.out_shape(), self.dtype.name(), self.ordinal, true)?,
        };
        let tc = read::tensor(&out, Arg::of(CALL, "out"))?;
        let c =
            tensor::exact(&tc, Arg::of(CALL, "out"), &[self.dtype], &self.out_shape(), "expected").map_err(py_err)?;
        device.check(&tc, Arg::of(CALL, "out")).map_err(py_err)?;
        Ok((sizes_view, out, c, device))
    }

    /// The grouped GEMM on tokens `a` into C at `c`, the sizes at `sizes`.
    fn gemm_on(
        &self,
        inner: &mut Inner,
        stream: &Arc<CudaStream>,
        sizes: BufferView,
        a: MoeTokens,
        c: BufferView,
    ) -> PyResult<()> {
        let c_type = self.dtype.output().expect("a 16-bit output type");
        let (weights, alphas) = (std::mem::take(&mut inner.weights), std::mem::take(&mut inner.alphas));
        let buffers = MoeBuffers { sizes, a, weights, alphas, c, c_type, activated: None };
        // SAFETY: live CUDA tensors of this device (checked), the layer's weights kept alive.
        let result = unsafe { inner.plan.run_views(stream, &buffers) }.map_err(py_err);
        (inner.weights, inner.alphas) = (buffers.weights, buffers.alphas);
        result
    }
}
