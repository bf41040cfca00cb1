//! `nvfp4_gemm._native`: typed bindings of the library for the pure-Python package
//! `nvfp4_gemm`. Each call reads its tensors once into the library's tensor descriptors
//! (`read`), hands them to the library's rule book (`nvfp4_gemm::tensor`), and runs the library's
//! typed calls on their addresses; the package supplies torch allocations, conversions and the
//! current stream through hooks it registers at import (`hooks`). Every rule is checked in the
//! library, once per call; its errors become Python exceptions with its text (`errors`).

mod block;
mod dlpack;
mod errors;
mod gemm;
mod hooks;
mod moe;
mod read;

use crate::errors::{py_err, value_error};
use cudarc::driver::sys;
use nvfp4_gemm::problem::BufferView;
use nvfp4_gemm::quantize::Quantizer;
use nvfp4_gemm::tensor::{self, Arg, DType, SameDevice};
use nvfp4_gemm::w4a16::{PrepackViews, Prepacker, WeightStack};
use nvfp4_gemm::{Gpu, OutputType};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

pub use errors::{CaptureError, CudaError, NoDriverError, UnsupportedError};

/// A GPU with this library's kernels and its quantizer.
#[pyclass(module = "nvfp4_gemm._native", frozen)]
pub struct Device {
    gpu: Gpu,
    quantizer: Quantizer,
    ordinal: usize,
}

impl Device {
    /// The GPU.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The quantizer.
    pub fn quantizer(&self) -> &Quantizer {
        &self.quantizer
    }
}

#[pymethods]
impl Device {
    /// Opens device `ordinal` (its primary context: the one PyTorch uses).
    #[new]
    fn new(ordinal: usize) -> PyResult<Device> {
        let gpu = Gpu::new(ordinal).map_err(py_err)?;
        let quantizer = Quantizer::new(&gpu).map_err(py_err)?;
        Ok(Device { gpu, quantizer, ordinal })
    }

    #[getter]
    fn ordinal(&self) -> usize {
        self.ordinal
    }

    #[getter]
    fn name(&self) -> String {
        self.gpu.name().to_string()
    }

    /// `"sm_90a"` or `"sm_100a"`.
    #[getter]
    fn arch(&self) -> &'static str {
        self.gpu.arch().name()
    }

    #[getter]
    fn sm_count(&self) -> u32 {
        self.gpu.sm_count()
    }

    /// Whether `stream` (a `CUstream` handle of this device) is being captured into a CUDA graph.
    fn is_capturing(&self, stream: u64) -> PyResult<bool> {
        // SAFETY: a stream handle from the caller (the package passes a current stream).
        let s = unsafe { self.gpu.context().wrap_borrowed_stream(stream as sys::CUstream) };
        nvfp4_gemm::is_capturing(&s).map_err(py_err)
    }
}

/// The stream `handle` of `device`, borrowed.
///
/// # Safety
/// `handle` a live stream of the device's context (or 0).
unsafe fn borrow(device: &Device, handle: u64) -> std::sync::Arc<cudarc::driver::CudaStream> {
    // SAFETY: the caller's contract.
    unsafe { device.gpu.context().wrap_borrowed_stream(handle as sys::CUstream) }
}

/// `quantize`: NVFP4-quantizes `x` (`[rows, K]` fp16/bf16) with `global_scale` into `values` and
/// `scales` (new when None); returns them.
#[pyfunction]
#[pyo3(signature = (x, global_scale=1.0, values=None, scales=None, stream=None))]
fn quantize<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    global_scale: f64,
    values: Option<&Bound<'py, PyAny>>,
    scales: Option<&Bound<'py, PyAny>>,
    stream: Option<&Bound<'py, PyAny>>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    const CALL: &str = "quantize";
    let tx = read::tensor(x, Arg::of(CALL, "x"))?;
    let (rows, k) = tensor::dense(&tx, Arg::of(CALL, "x")).map_err(py_err)?;
    let g = tensor::check_global_scale(CALL, "global_scale", global_scale).map_err(py_err)?;
    let mut device = SameDevice::new(None);
    device.check(&tx, Arg::of(CALL, "x")).map_err(py_err)?;
    let ordinal = match device.device() {
        Some(d) => d,
        None => hooks::current_device(py)?,
    };
    let values = match values.filter(|v| !v.is_none()) {
        Some(v) => v.clone(),
        None => hooks::alloc(py, x, &[rows, k / 2], "uint8", ordinal, false)?,
    };
    let scales = match scales.filter(|s| !s.is_none()) {
        Some(s) => s.clone(),
        None => hooks::alloc(py, x, &[nvfp4_gemm::rules::blocked_bytes(rows, k)], "uint8", ordinal, false)?,
    };
    let (tv, ts) = (read::tensor(&values, Arg::of(CALL, "values"))?, read::tensor(&scales, Arg::of(CALL, "scales"))?);
    let (v, s) = tensor::nvfp4_output(&tv, &ts, CALL, rows, k).map_err(py_err)?;
    device.check(&tv, Arg::of(CALL, "values")).map_err(py_err)?;
    device.check(&ts, Arg::of(CALL, "scales")).map_err(py_err)?;
    let dev = hooks::device(py, ordinal)?;
    let dev = dev.bind(py).borrow();
    let handle = hooks::stream(py, stream, ordinal)?;
    // SAFETY: live CUDA tensors of this device, checked; the caller's current stream.
    unsafe {
        let s_ = borrow(&dev, handle);
        dev.quantizer.quantize_views(&s_, tx.view(), tx.dtype == DType::Bf16, rows, k, g, v, s)
    }
    .map_err(py_err)?;
    Ok((values, scales))
}

/// `dequantize`: `e2m1 · e4m3 · global_scale` of an NVFP4 tensor, rounded once to fp16/bf16 into
/// `out` (new when None); returns it.
#[pyfunction]
#[pyo3(signature = (values, scales, global_scale=1.0, out=None, out_dtype=None, scale_layout="blocked", stream=None))]
#[allow(clippy::too_many_arguments)]
fn dequantize<'py>(
    py: Python<'py>,
    values: &Bound<'py, PyAny>,
    scales: &Bound<'py, PyAny>,
    global_scale: f64,
    out: Option<&Bound<'py, PyAny>>,
    out_dtype: Option<&Bound<'py, PyAny>>,
    scale_layout: &str,
    stream: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    const CALL: &str = "dequantize";
    let tv = read::tensor(values, Arg::of(CALL, "values"))?;
    let (rows, k) = tensor::values(&tv, Arg::of(CALL, "values"), None, None).map_err(py_err)?;
    let mut ts = read::tensor(scales, Arg::of(CALL, "scales"))?;
    let mut _keep = None;
    match scale_layout {
        "blocked" => {}
        "plain" => {
            tensor::plain_scales(&ts, Arg::of(CALL, "scales"), rows, k).map_err(py_err)?;
            let blocked = hooks::to_blocked(py, scales, rows)?;
            ts = read::tensor(&blocked, Arg::of(CALL, "scales"))?;
            _keep = Some(blocked);
        }
        other => return Err(value_error(format!("scale_layout: '{other}'; expected 'blocked' or 'plain'"))),
    }
    let s = tensor::blocked_scales(&ts, Arg::of(CALL, "scales"), rows, k).map_err(py_err)?;
    let g = tensor::check_global_scale(CALL, "global_scale", global_scale).map_err(py_err)?;
    let tout = match out.filter(|o| !o.is_none()) {
        Some(o) => Some(read::tensor(o, Arg::of(CALL, "out"))?),
        None => None,
    };
    let default =
        tout.as_ref().map_or(DType::Bf16, |t| if tensor::DENSE.contains(&t.dtype) { t.dtype } else { DType::Bf16 });
    let dtype = tensor::output_type(CALL, read::dtype_arg(out_dtype)?, default).map_err(|e| match e {
        nvfp4_gemm::Error::WrongType { reason, .. } => errors::type_error(format!("out_dtype: {reason}")),
        other => py_err(other),
    })?;
    let mut device = SameDevice::new(None);
    for (t, name) in [(&tv, "values"), (&ts, "scales")] {
        device.check(t, Arg::of(CALL, name)).map_err(py_err)?;
    }
    let ordinal = match device.device() {
        Some(d) => d,
        None => hooks::current_device(py)?,
    };
    let (out, y) = match (out.filter(|o| !o.is_none()), tout) {
        (Some(o), Some(t)) => {
            let y = tensor::output(&t, Arg::of(CALL, "out"), rows, k, DType::of_output(dtype)).map_err(py_err)?;
            device.check(&t, Arg::of(CALL, "out")).map_err(py_err)?;
            (o.clone(), y)
        }
        _ => {
            let o = hooks::alloc(py, values, &[rows, k], DType::of_output(dtype).name(), ordinal, false)?;
            let y = read::tensor(&o, Arg::of(CALL, "out"))?.view();
            (o, y)
        }
    };
    let dev = hooks::device(py, ordinal)?;
    let dev = dev.bind(py).borrow();
    let handle = hooks::stream(py, stream, ordinal)?;
    // SAFETY: live CUDA tensors of this device, checked; the caller's current stream.
    unsafe {
        let s_ = borrow(&dev, handle);
        dev.quantizer.dequantize_views(&s_, tv.view_bytes(), s, rows, k, g, y, dtype == OutputType::Bf16)
    }
    .map_err(py_err)?;
    Ok(out)
}

/// Prepacks one weight matrix (`values`: `rows × k/2` packed bytes, `scales`: its blocked scales)
/// for W4A16 with bf16 (`bf16`) or f16 activations, on the CPU: `(values, scales)` bytes.
#[pyfunction]
fn prepack_w4a16<'py>(
    py: Python<'py>,
    values: &[u8],
    scales: &[u8],
    rows: usize,
    k: usize,
    bf16: bool,
) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
    let m = nvfp4_gemm::format::Nvfp4Matrix::new(rows, k, values.to_vec(), scales.to_vec(), 1.0)
        .map_err(|e| value_error(format!("prepack_w4a16: {e}")))?;
    let act = if bf16 { nvfp4_gemm::Activations::Bf16 } else { nvfp4_gemm::Activations::F16 };
    let w = nvfp4_gemm::w4a16::prepack(&m, act).map_err(py_err)?;
    Ok((PyBytes::new(py, &w.values), PyBytes::new(py, &w.scales)))
}

/// A stack of `experts` weight matrices of `n × k` in CUDA memory (`values`: their packed bytes
/// back to back, `scales`: their blocked scales back to back; any contiguous shapes) prepacked
/// for W4A16 on the GPU (`nvfp4_gemm::w4a16::Prepacker`) on the stream `stream`: new `uint8`
/// tensors `[experts, n, k/2]` and flat scales on the weights' device, bit for bit what the CPU
/// prepack makes. `UnsupportedError` on sm_100a.
pub(crate) fn prepack_on_device<'py>(
    py: Python<'py>,
    values: &Bound<'py, PyAny>,
    scales: &Bound<'py, PyAny>,
    stack: WeightStack,
    activations: nvfp4_gemm::Activations,
    stream: Option<&Bound<'py, PyAny>>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    const CALL: &str = "prepack";
    let sizes = stack.sizes().map_err(py_err)?;
    let what = format!("{} matrices of N={}, K={} need", stack.experts, stack.rows, stack.k);
    let (tv, ts) = (read::tensor(values, Arg::of(CALL, "values"))?, read::tensor(scales, Arg::of(CALL, "scales"))?);
    let v = tensor::bytes(&tv, Arg::of(CALL, "values"), tensor::VALUES, sizes.values, &what).map_err(py_err)?;
    let s = tensor::bytes(&ts, Arg::of(CALL, "scales"), tensor::SCALES, sizes.scales, &what).map_err(py_err)?;
    let mut device = SameDevice::new(None);
    device.check(&tv, Arg::of(CALL, "values")).map_err(py_err)?;
    device.check(&ts, Arg::of(CALL, "scales")).map_err(py_err)?;
    let ordinal = match device.device() {
        Some(d) => d,
        None => hooks::current_device(py)?,
    };
    let dev = hooks::device(py, ordinal)?;
    let dev = dev.bind(py).borrow();
    let prepacker = Prepacker::new(&dev.gpu).map_err(py_err)?;
    let out_v = hooks::alloc(py, values, &[stack.experts, stack.rows, stack.k / 2], "uint8", ordinal, false)?;
    let out_s = hooks::alloc(py, values, &[sizes.scales], "uint8", ordinal, false)?;
    let views = PrepackViews {
        values: v,
        scales: s,
        out_values: BufferView { ptr: read::tensor(&out_v, Arg::of(CALL, "out_values"))?.ptr, len: sizes.values },
        out_scales: BufferView { ptr: read::tensor(&out_s, Arg::of(CALL, "out_scales"))?.ptr, len: sizes.scales },
    };
    let handle = hooks::stream(py, stream, ordinal)?;
    // SAFETY: live CUDA tensors of this device, checked (the outputs new); the caller's stream.
    unsafe {
        let s_ = borrow(&dev, handle);
        prepacker.prepack_views(&s_, stack, activations, views)
    }
    .map_err(py_err)?;
    Ok((out_v, out_s))
}

/// `prepack` of CUDA tensors: a stack of `experts` weight matrices of `n × k` prepacked for W4A16
/// with bf16 (`bf16`) or f16 activations on the GPU, on `stream` (None: the current stream):
/// `(values [experts, n, k/2], scales)`, new `uint8` tensors on the weights' device.
#[pyfunction]
#[pyo3(signature = (values, scales, experts, n, k, bf16, stream=None))]
#[allow(clippy::too_many_arguments)]
fn prepack_w4a16_device<'py>(
    py: Python<'py>,
    values: &Bound<'py, PyAny>,
    scales: &Bound<'py, PyAny>,
    experts: usize,
    n: usize,
    k: usize,
    bf16: bool,
    stream: Option<&Bound<'py, PyAny>>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let act = if bf16 { nvfp4_gemm::Activations::Bf16 } else { nvfp4_gemm::Activations::F16 };
    prepack_on_device(py, values, scales, WeightStack { experts, rows: n, k }, act, stream)
}

/// Bytes of `rows × K/16` scales in the 128x4 blocked layout (rows padded to 128, scale columns
/// to 4): the library's rule.
#[pyfunction]
fn blocked_bytes(rows: usize, k: usize) -> usize {
    nvfp4_gemm::rules::blocked_bytes(rows, k)
}

/// Strides (elements) of the GPU MODE task's permuted `(32, 4, rest_m, 4, rest_k)` view of the
/// blocked scales of `rows × k`.
#[pyfunction]
fn blocked_view_strides(rows: usize, k: usize) -> (i64, i64, i64, i64, i64) {
    let s = tensor::blocked_view_strides(rows, k);
    (s[0], s[1], s[2], s[3], s[4])
}

/// A tensor as `_describe_tensor` returns it: address, shape, strides, dtype name, device.
type Described = (u64, Vec<i64>, Vec<i64>, &'static str, Option<u32>);

/// What the package reads of a tensor, `(address, shape, strides, dtype name, device)`, read the
/// way `way` names (`"auto"`, `"exchange"`, `"to_dlpack"`, `"attributes"`; `None` when that DLPack
/// way does not read it): the readers compared by the GPU tests.
#[pyfunction]
#[pyo3(signature = (tensor, way="auto"))]
fn _describe_tensor(tensor: &Bound<'_, PyAny>, way: &str) -> PyResult<Option<Described>> {
    Ok(read::tensor_by(tensor, way)?
        .map(|d| (d.ptr, d.shape.get().to_vec(), d.strides.get().to_vec(), d.dtype.name(), d.device)))
}

/// How a `torch.Tensor` is read: `"exchange"` (torch's DLPack C exchange table), `"to_dlpack"`,
/// or None before torch is imported.
#[pyfunction]
fn _tensor_reader(py: Python<'_>) -> Option<&'static str> {
    dlpack::reader(py)
}

/// The stream a call without `stream=` runs on, on device `ordinal`: torch's current stream, as
/// the package reads it.
#[pyfunction]
fn _current_stream(py: Python<'_>, ordinal: u32) -> PyResult<u64> {
    hooks::stream(py, None, ordinal)
}

/// True when the CUDA driver library (libcuda.so.1) can be loaded.
#[pyfunction]
fn driver_present() -> bool {
    nvfp4_gemm::driver_present()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Device>()?;
    m.add_class::<gemm::Prepared>()?;
    m.add_class::<moe::MoeLayer>()?;
    m.add_class::<block::MoeBlock>()?;
    for f in [
        wrap_pyfunction!(gemm::grouped_gemm, m)?,
        wrap_pyfunction!(gemm::grouped_gemm_stacked, m)?,
        wrap_pyfunction!(gemm::w4a16_grouped_gemm, m)?,
        wrap_pyfunction!(gemm::prepare, m)?,
        wrap_pyfunction!(gemm::custom_kernel, m)?,
        wrap_pyfunction!(gemm::check_problem, m)?,
        wrap_pyfunction!(gemm::clear_cache, m)?,
        wrap_pyfunction!(moe::moe_sizes, m)?,
        wrap_pyfunction!(block::checkpoint_experts, m)?,
        wrap_pyfunction!(quantize, m)?,
        wrap_pyfunction!(dequantize, m)?,
        wrap_pyfunction!(prepack_w4a16, m)?,
        wrap_pyfunction!(prepack_w4a16_device, m)?,
        wrap_pyfunction!(blocked_bytes, m)?,
        wrap_pyfunction!(blocked_view_strides, m)?,
        wrap_pyfunction!(driver_present, m)?,
        wrap_pyfunction!(_describe_tensor, m)?,
        wrap_pyfunction!(_tensor_reader, m)?,
        wrap_pyfunction!(_current_stream, m)?,
        wrap_pyfunction!(hooks::set_hooks, m)?,
    ] {
        m.add_function(f)?;
    }
    // The rules the package's docs and checks quote, from the library (one book).
    m.add("K_MULTIPLE", nvfp4_gemm::rules::K_MULTIPLE)?;
    m.add("N_MULTIPLE", nvfp4_gemm::rules::N_MULTIPLE)?;
    m.add("ALIGN", nvfp4_gemm::rules::BUFFER_ALIGN)?;
    m.add("MAX_GROUPS", nvfp4_gemm::rules::MAX_GROUPS)?;
    m.add("CudaError", py.get_type::<CudaError>())?;
    m.add("NoDriverError", py.get_type::<NoDriverError>())?;
    m.add("UnsupportedError", py.get_type::<UnsupportedError>())?;
    m.add("CaptureError", py.get_type::<CaptureError>())?;
    Ok(())
}
