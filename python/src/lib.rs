//! `nvfp4_gemm._native`: the library's plans and quantizer over device addresses and the
//! caller's stream (`nvfp4_gemm::raw`), for the pure-Python package `nvfp4_gemm`, which reads
//! the tensors, validates them and passes integers here. Every call goes through the library's
//! own validation before any launch; its errors become Python exceptions with the same text.
//!
//! Buffers arrive as flat lists of `u64`: `(address, length in elements)` pairs, an operand as
//! four values (values, scales), a group as ten (A, B, C).

use cudarc::driver::{sys, CudaContext, CudaStream, DevicePtr};
use nvfp4_gemm::moe::{MoeProblem, SizeStatus};
use nvfp4_gemm::raw::{
    self, Nvfp4Device, RawBuffer, RawGroupArgs, RawMoeArgs, RawOperand, RawStackedArgs, RawW4a16Args,
};
use nvfp4_gemm::w4a16::Activations;
use nvfp4_gemm::{Error, GroupShape, OutputType, Problem};
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::{Arc, Mutex, MutexGuard};

create_exception!(_native, CudaError, PyRuntimeError, "A CUDA driver call failed.");
create_exception!(_native, NoDriverError, PyRuntimeError, "No CUDA driver (libcuda.so.1) could be loaded.");
create_exception!(_native, UnsupportedError, PyRuntimeError, "The device or operation is not supported.");
create_exception!(
    _native,
    CaptureError,
    PyRuntimeError,
    "A call inside CUDA graph capture would have to upload tables: run it once outside capture first."
);

/// The library's error as the Python exception of its kind, with the same text.
fn py_err(e: Error) -> PyErr {
    let text = e.to_string();
    match e {
        Error::NoDriver => NoDriverError::new_err(text),
        Error::UnsupportedArch { .. } | Error::Unsupported(_) => UnsupportedError::new_err(text),
        Error::Driver { .. } => CudaError::new_err(text),
        _ => PyValueError::new_err(text),
    }
}

fn value_error(text: String) -> PyErr {
    PyValueError::new_err(text)
}

fn output_type(bf16: bool) -> OutputType {
    if bf16 {
        OutputType::Bf16
    } else {
        OutputType::F16
    }
}

fn buffer(pair: (u64, u64)) -> RawBuffer {
    RawBuffer { ptr: pair.0, len: pair.1 }
}

fn operand(v: &[u64]) -> RawOperand {
    RawOperand { values: RawBuffer { ptr: v[0], len: v[1] }, scales: RawBuffer { ptr: v[2], len: v[3] } }
}

fn group_args(v: &[u64], alpha: f32) -> RawGroupArgs {
    RawGroupArgs { a: operand(&v[0..4]), b: operand(&v[4..8]), c: RawBuffer { ptr: v[8], len: v[9] }, alpha }
}

/// The argument sets of a per-group call: `buffers` ten values per group; `alphas` one per group
/// from the host, or none when `device_alphas` (address, `f32` count) holds them on the device
/// (the sets' alphas are then NaN: not read).
fn group_list(buffers: &[u64], alphas: &[f32], device_alphas: Option<(u64, u64)>) -> PyResult<Vec<RawGroupArgs>> {
    let groups = buffers.len() / 10;
    let want = if device_alphas.is_some() { 0 } else { groups };
    if !buffers.len().is_multiple_of(10) || alphas.len() != want {
        return Err(value_error(format!(
            "{} buffer values and {} host alphas (10 per group, and one alpha per group unless on the device)",
            buffers.len(),
            alphas.len()
        )));
    }
    let alpha = |g: usize| if device_alphas.is_some() { f32::NAN } else { alphas[g] };
    Ok(buffers.chunks_exact(10).enumerate().map(|(g, b)| group_args(b, alpha(g))).collect())
}

fn lock<T>(m: &Mutex<T>) -> PyResult<MutexGuard<'_, T>> {
    m.lock().map_err(|_| PyRuntimeError::new_err("a previous call panicked while holding this object"))
}

/// The last stream a plan was called on, borrowed (`raw::borrow_stream`).
struct Streams {
    ctx: Arc<CudaContext>,
    last: Option<(u64, Arc<CudaStream>)>,
}

impl Streams {
    fn new(ctx: Arc<CudaContext>) -> Streams {
        Streams { ctx, last: None }
    }

    /// The caller's stream `s`.
    ///
    /// # Safety
    /// `s` a live stream of this context (or 0), alive while plans use it.
    unsafe fn get(&mut self, s: u64) -> &Arc<CudaStream> {
        if self.last.as_ref().map(|l| l.0) != Some(s) {
            // SAFETY: the caller's contract.
            let stream = unsafe { raw::borrow_stream(&self.ctx, s as sys::CUstream) };
            self.last = Some((s, stream));
        }
        &self.last.as_ref().expect("set above").1
    }

    /// Releases a plan's device memory: after the device is idle, or never if the last stream is
    /// being captured (a synchronization or a free then would break the capture).
    fn release<T>(&self, value: T) {
        let capturing = self.last.as_ref().map(|(_, s)| raw::is_capturing(s).unwrap_or(true)).unwrap_or(false);
        if capturing {
            std::mem::forget(value);
        } else {
            // Work enqueued on the caller's streams may still read the plan's tables.
            let _ = self.ctx.synchronize();
            drop(value);
        }
    }
}

/// Waits for the null stream, where every plan allocates, zeroes and fills its device memory, so
/// that the caller's streams (not ordered after it: torch's side streams are non-blocking) find
/// the plan ready at its first call.
fn plan_memory_ready(gpu: &nvfp4_gemm::Gpu) -> PyResult<()> {
    gpu.context().default_stream().synchronize().map_err(|e| CudaError::new_err(e.to_string()))
}

/// A GPU with this library's kernels and its quantizer (`raw::Nvfp4Device`).
#[pyclass(module = "nvfp4_gemm._native", frozen)]
struct Device {
    dev: Nvfp4Device,
    ordinal: usize,
}

#[pymethods]
impl Device {
    /// Opens device `ordinal` (its primary context: the one PyTorch uses).
    #[new]
    fn new(ordinal: usize) -> PyResult<Device> {
        Ok(Device { dev: Nvfp4Device::open(ordinal).map_err(py_err)?, ordinal })
    }

    #[getter]
    fn ordinal(&self) -> usize {
        self.ordinal
    }

    #[getter]
    fn name(&self) -> String {
        self.dev.gpu().name().to_string()
    }

    /// `"sm_90a"` or `"sm_100a"`.
    #[getter]
    fn arch(&self) -> &'static str {
        self.dev.gpu().arch().name()
    }

    #[getter]
    fn sm_count(&self) -> u32 {
        self.dev.gpu().sm_count()
    }

    /// Whether `stream` is being captured into a CUDA graph.
    fn is_capturing(&self, stream: u64) -> PyResult<bool> {
        // SAFETY: a stream handle from the caller (the Python layer passes the current stream).
        let s = unsafe { self.dev.stream(stream as sys::CUstream) };
        raw::is_capturing(&s).map_err(py_err)
    }

    /// Quantizes `x` (`rows × k` f16 or bf16) with `global_scale` into `values` and `scales`.
    #[allow(clippy::too_many_arguments)]
    fn quantize(
        &self,
        stream: u64,
        x: (u64, u64),
        bf16: bool,
        rows: usize,
        k: usize,
        global_scale: f32,
        values: (u64, u64),
        scales: (u64, u64),
    ) -> PyResult<()> {
        let out = RawOperand { values: buffer(values), scales: buffer(scales) };
        // SAFETY: the Python layer passes live device tensors of the current device and its
        // current stream; lengths and overlaps are validated by the library.
        unsafe {
            let s = self.dev.stream(stream as sys::CUstream);
            raw::quantize(self.dev.quantizer(), &s, buffer(x), output_type(bf16), rows, k, global_scale, &out)
        }
        .map_err(py_err)
    }

    /// Dequantizes (`values`, `scales`: `rows × k` NVFP4) with `global_scale` into `y` (f16 or
    /// bf16).
    #[allow(clippy::too_many_arguments)]
    fn dequantize(
        &self,
        stream: u64,
        values: (u64, u64),
        scales: (u64, u64),
        rows: usize,
        k: usize,
        global_scale: f32,
        y: (u64, u64),
        bf16: bool,
    ) -> PyResult<()> {
        let input = RawOperand { values: buffer(values), scales: buffer(scales) };
        // SAFETY: as in `quantize`.
        unsafe {
            let s = self.dev.stream(stream as sys::CUstream);
            raw::dequantize(self.dev.quantizer(), &s, &input, rows, k, global_scale, buffer(y), output_type(bf16))
        }
        .map_err(py_err)
    }
}

/// The shapes of a problem, checked by the library (no GPU needed).
fn problem(shapes: &[(usize, usize, usize)], bf16: bool) -> PyResult<Problem> {
    let shapes: Vec<GroupShape> = shapes.iter().map(|&(m, n, k)| GroupShape::new(m, n, k)).collect();
    Problem::new(shapes, output_type(bf16)).map_err(py_err)
}

/// One group's offsets in stacked buffers: `(a_values, a_scales, b_values, b_scales, c_elements)`.
type Offsets = (usize, usize, usize, usize, usize);

/// Sizes of a MoE problem: `(token_rows, scale_rows, sizes_len, a_values, a_scales, b_values,
/// b_scales, c_elements)`.
type MoeSizes = (usize, usize, usize, usize, usize, usize, usize, usize);

/// Checks a grouped GEMM's shapes as the library does (no GPU needed) and returns the stacked
/// buffers' offsets: one `(a_values, a_scales, b_values, b_scales, c_elements)` per group and
/// the totals last.
#[pyfunction]
fn check_problem(shapes: Vec<(usize, usize, usize)>, bf16: bool) -> PyResult<Vec<Offsets>> {
    let p = problem(&shapes, bf16)?;
    Ok(p.stacked_offsets().iter().map(|o| (o.a_values, o.a_scales, o.b_values, o.b_scales, o.c_elements)).collect())
}

/// What a grouped GEMM call does with its tables, for the capture rule: the signature of the
/// last call that succeeded (buffers, and the alphas' bits or the device alphas' buffer).
#[derive(Default)]
struct LastCall {
    signature: Vec<u64>,
}

impl LastCall {
    fn signature(buffers: &[u64], alphas: &[f32], device_alphas: Option<(u64, u64)>, stacked: bool) -> Vec<u64> {
        let mut s = Vec::with_capacity(buffers.len() + alphas.len() + 3);
        s.push(stacked as u64 | (device_alphas.is_some() as u64) << 1);
        s.extend_from_slice(buffers);
        match device_alphas {
            // The values are read on the device: only the buffer is part of the tables' state.
            Some((ptr, len)) => s.extend([ptr, len]),
            None => s.extend(alphas.iter().map(|a| a.to_bits() as u64)),
        }
        s
    }

    /// Refuses a call inside capture whose buffers differ from the last call's (the plan would
    /// upload tables from the host inside the capture).
    fn check_capture(&self, capturing: bool, signature: &[u64]) -> PyResult<()> {
        if capturing && self.signature != signature {
            return Err(CaptureError::new_err(
                "inside CUDA graph capture with tensors or alphas other than the last call's: \
                 call once outside capture with exactly these tensors first (the plan's tables are \
                 uploaded from the host then)",
            ));
        }
        Ok(())
    }
}

/// A host-sized plan (`P`: a `GemmPlan` or a `W4a16Plan`) with the streams it was called on, its
/// output type and the capture rule's state.
struct Planned<P> {
    plan: Option<P>,
    streams: Streams,
    c_type: OutputType,
    last: LastCall,
}

impl<P> Drop for Planned<P> {
    fn drop(&mut self) {
        if let Some(plan) = self.plan.take() {
            self.streams.release(plan);
        }
    }
}

impl<P> Planned<P> {
    fn new(plan: P, gpu: &nvfp4_gemm::Gpu, c_type: OutputType) -> Planned<P> {
        Planned { plan: Some(plan), streams: Streams::new(gpu.context().clone()), c_type, last: LastCall::default() }
    }

    fn plan(&mut self) -> &mut P {
        self.plan.as_mut().expect("present until dropped")
    }

    /// Runs `f` on the plan and the stream `s` under the capture rule; returns whether the call
    /// was captured.
    ///
    /// # Safety
    /// `s` as `Streams::get`; the buffers in `f` as `raw::gemm_run`.
    unsafe fn call(
        &mut self,
        s: u64,
        signature: Vec<u64>,
        f: impl FnOnce(&mut P, &Arc<CudaStream>, OutputType) -> nvfp4_gemm::Result<()>,
    ) -> PyResult<bool> {
        // SAFETY: the caller's contract.
        let stream = unsafe { self.streams.get(s) }.clone();
        let capturing = raw::is_capturing(&stream).map_err(py_err)?;
        self.last.check_capture(capturing, &signature)?;
        let c_type = self.c_type;
        let result = f(self.plan(), &stream, c_type);
        match result {
            Ok(()) => {
                self.last.signature = signature;
                Ok(capturing)
            }
            Err(e) => Err(py_err(e)),
        }
    }
}

struct GemmInner {
    planned: Planned<nvfp4_gemm::GemmPlan>,
    /// Arguments bound by `bind` (argument sets, device alphas, signature), launched by
    /// `launch`.
    bound: Option<(Vec<RawGroupArgs>, Option<RawBuffer>, Vec<u64>)>,
}

/// A `nvfp4_gemm::GemmPlan` for one set of shapes and output type.
#[pyclass(module = "nvfp4_gemm._native", frozen)]
struct GemmPlan {
    inner: Mutex<GemmInner>,
    groups: usize,
    kernel: String,
}

#[pymethods]
impl GemmPlan {
    /// Plans `shapes` (`(m, n, k)` per group) on `device` with C in bf16 (`bf16`) or f16.
    #[new]
    fn new(device: &Device, shapes: Vec<(usize, usize, usize)>, bf16: bool) -> PyResult<GemmPlan> {
        let p = problem(&shapes, bf16)?;
        let gpu = device.dev.gpu();
        let plan = nvfp4_gemm::GemmPlan::new(gpu, p).map_err(py_err)?;
        plan_memory_ready(gpu)?;
        let kernel = plan.summary().kernel.clone();
        let inner = GemmInner { planned: Planned::new(plan, gpu, output_type(bf16)), bound: None };
        Ok(GemmPlan { inner: Mutex::new(inner), groups: shapes.len(), kernel })
    }

    #[getter]
    fn groups(&self) -> usize {
        self.groups
    }

    /// The kernel the planner chose (for people).
    #[getter]
    fn kernel(&self) -> String {
        self.kernel.clone()
    }

    /// One call with per-group buffers (`buffers`: ten values per group) and alphas, on the
    /// stream `stream`: `alphas` one per group, or none with `device_alphas` (address and
    /// length of a device `f32` buffer read at each call). Returns whether the call was captured
    /// into a CUDA graph.
    #[pyo3(signature = (stream, buffers, alphas, device_alphas=None))]
    fn run(
        &self,
        stream: u64,
        buffers: Vec<u64>,
        alphas: Vec<f32>,
        device_alphas: Option<(u64, u64)>,
    ) -> PyResult<bool> {
        let args = group_list(&buffers, &alphas, device_alphas)?;
        let signature = LastCall::signature(&buffers, &alphas, device_alphas, false);
        let device = device_alphas.map(buffer);
        let mut inner = lock(&self.inner)?;
        // SAFETY: the Python layer passes live device tensors of the plan's device and its current
        // stream; the library validates lengths, alignment and overlaps.
        unsafe { inner.planned.call(stream, signature, |plan, s, c| raw::gemm_run(plan, s, &args, c, device)) }
    }

    /// One call with every group's buffers stacked (`buffers`: ten values) and one alpha per
    /// group (or none, with `device_alphas`, as in `run`). Returns whether the call was
    /// captured.
    #[pyo3(signature = (stream, buffers, alphas, device_alphas=None))]
    fn run_stacked(
        &self,
        stream: u64,
        buffers: Vec<u64>,
        alphas: Vec<f32>,
        device_alphas: Option<(u64, u64)>,
    ) -> PyResult<bool> {
        if buffers.len() != 10 {
            return Err(value_error(format!("{} buffer values; stacked calls take 10", buffers.len())));
        }
        let args = RawStackedArgs {
            a: operand(&buffers[0..4]),
            b: operand(&buffers[4..8]),
            c: RawBuffer { ptr: buffers[8], len: buffers[9] },
        };
        let signature = LastCall::signature(&buffers, &alphas, device_alphas, true);
        let device = device_alphas.map(buffer);
        let mut inner = lock(&self.inner)?;
        // SAFETY: as in `run`.
        unsafe {
            inner
                .planned
                .call(stream, signature, |plan, s, c| raw::gemm_run_stacked(plan, s, &args, &alphas, c, device))
        }
    }

    /// Binds per-group buffers and alphas (as `run` takes them) for `launch` (checked at the
    /// first launch).
    #[pyo3(signature = (buffers, alphas, device_alphas=None))]
    fn bind(&self, buffers: Vec<u64>, alphas: Vec<f32>, device_alphas: Option<(u64, u64)>) -> PyResult<()> {
        let args = group_list(&buffers, &alphas, device_alphas)?;
        let signature = LastCall::signature(&buffers, &alphas, device_alphas, false);
        lock(&self.inner)?.bound = Some((args, device_alphas.map(buffer), signature));
        Ok(())
    }

    /// Runs the bound buffers on `stream`; returns whether the call was captured.
    fn launch(&self, stream: u64) -> PyResult<bool> {
        let mut inner = lock(&self.inner)?;
        let (args, device, signature) = inner.bound.take().ok_or_else(|| PyRuntimeError::new_err("nothing bound"))?;
        // SAFETY: as in `run`.
        let result = unsafe {
            inner.planned.call(stream, signature.clone(), |plan, s, c| raw::gemm_run(plan, s, &args, c, device))
        };
        inner.bound = Some((args, device, signature));
        result
    }
}

/// Sizes of a MoE problem, checked by the library (no GPU needed): `token_rows`, `scale_rows`,
/// `sizes_len`, `a_values`, `a_scales`, `b_values`, `b_scales`, `c_elements`.
#[pyfunction]
fn moe_sizes(groups: usize, n: usize, k: usize, masked: bool, bound: usize) -> PyResult<MoeSizes> {
    let layout = raw::token_layout(masked as u32, bound as u64).map_err(py_err)?;
    let p = MoeProblem::new(groups, n, k, layout, OutputType::F16).map_err(py_err)?;
    let (a, b) = (p.a_sizes(), p.b_sizes());
    Ok((p.token_rows(), p.scale_rows(), p.sizes_len(), a.values, a.scales, b.values, b.scales, p.c_elements()))
}

/// A device-sized plan (`P`: a `MoePlan` or a `W4a16MoePlan`) with its weights and alphas and
/// the capture rule's state.
struct MoeInner<P> {
    plan: Option<P>,
    streams: Streams,
    weights: Vec<RawOperand>,
    alphas: Vec<f32>,
    /// The A values address of the last successful run (`None` before the first): the tables
    /// hold the weights from then on, and on sm_100a also A's address.
    last_a: Option<u64>,
    a_in_tables: bool,
}

impl<P> Drop for MoeInner<P> {
    fn drop(&mut self) {
        if let Some(plan) = self.plan.take() {
            self.streams.release(plan);
        }
    }
}

/// The status word of a device-sized plan (`MoePlan`, `W4a16MoePlan`).
trait StatusWord {
    fn clear_status(&mut self, stream: &Arc<CudaStream>) -> nvfp4_gemm::Result<()>;
    fn read_status(&self, stream: &Arc<CudaStream>) -> nvfp4_gemm::Result<SizeStatus>;
}

impl StatusWord for nvfp4_gemm::MoePlan {
    fn clear_status(&mut self, stream: &Arc<CudaStream>) -> nvfp4_gemm::Result<()> {
        nvfp4_gemm::MoePlan::clear_status(self, stream)
    }
    fn read_status(&self, stream: &Arc<CudaStream>) -> nvfp4_gemm::Result<SizeStatus> {
        nvfp4_gemm::MoePlan::read_status(self, stream)
    }
}

impl StatusWord for nvfp4_gemm::w4a16::W4a16MoePlan {
    fn clear_status(&mut self, stream: &Arc<CudaStream>) -> nvfp4_gemm::Result<()> {
        nvfp4_gemm::w4a16::W4a16MoePlan::clear_status(self, stream)
    }
    fn read_status(&self, stream: &Arc<CudaStream>) -> nvfp4_gemm::Result<SizeStatus> {
        nvfp4_gemm::w4a16::W4a16MoePlan::read_status(self, stream)
    }
}

impl<P: StatusWord> MoeInner<P> {
    /// Zeroes the status word on `stream` (capturable).
    fn clear_status(&mut self, stream: u64) -> PyResult<()> {
        // SAFETY: as in `GemmPlan::run`.
        let s = unsafe { self.streams.get(stream) }.clone();
        self.plan().clear_status(&s).map_err(py_err)
    }

    /// Reads the status word (synchronizes `stream`): its bits and their meaning.
    fn read_status(&mut self, stream: u64) -> PyResult<(u32, String)> {
        // SAFETY: as in `GemmPlan::run`.
        let s = unsafe { self.streams.get(stream) }.clone();
        let status = self.plan().read_status(&s).map_err(py_err)?;
        Ok((status.0, status.to_string()))
    }
}

impl<P> MoeInner<P> {
    /// `plan` on `gpu` with its weights (four values each) and alphas; `a_in_tables`: the tables
    /// hold the token tensor's address.
    fn new(plan: P, gpu: &nvfp4_gemm::Gpu, weights: &[u64], alphas: Vec<f32>, a_in_tables: bool) -> MoeInner<P> {
        MoeInner {
            plan: Some(plan),
            streams: Streams::new(gpu.context().clone()),
            weights: weights.chunks_exact(4).map(operand).collect(),
            alphas,
            last_a: None,
            a_in_tables,
        }
    }

    fn plan(&mut self) -> &mut P {
        self.plan.as_mut().expect("present until dropped")
    }

    /// The capture rule of a MoE run on A at `a`.
    fn check_capture(&self, capturing: bool, a: u64) -> PyResult<()> {
        let uploaded = match self.last_a {
            None => false,
            Some(last) => !self.a_in_tables || last == a,
        };
        if capturing && !uploaded {
            return Err(CaptureError::new_err(
                "the MoE layer's first call (or, on sm_100a, its first with this A) is inside CUDA \
                 graph capture: call it once outside capture first (the weights' tables are \
                 uploaded from the host then)",
            ));
        }
        Ok(())
    }
}

/// A device-sized problem of `groups` experts of `n × k` weights, checked by the library, with
/// four weight values and one alpha per expert.
#[allow(clippy::too_many_arguments)]
fn moe_problem(
    groups: usize,
    n: usize,
    k: usize,
    masked: bool,
    bound: usize,
    bf16: bool,
    weights: &[u64],
    alphas: &[f32],
) -> PyResult<MoeProblem> {
    let layout = raw::token_layout(masked as u32, bound as u64).map_err(py_err)?;
    let problem = MoeProblem::new(groups, n, k, layout, output_type(bf16)).map_err(py_err)?;
    if weights.len() != 4 * groups || alphas.len() != groups {
        return Err(value_error(format!(
            "{} weight values and {} alphas for {groups} experts (4 and 1 per expert)",
            weights.len(),
            alphas.len()
        )));
    }
    Ok(problem)
}

/// A `nvfp4_gemm::MoePlan` with its weights and alphas fixed.
#[pyclass(module = "nvfp4_gemm._native", frozen)]
struct MoePlan {
    inner: Mutex<MoeInner<nvfp4_gemm::MoePlan>>,
    problem: MoeProblem,
    kernel: String,
    status_address: u64,
}

#[pymethods]
impl MoePlan {
    /// Plans `groups` experts of `n × k` weights (`weights`: four values per expert, `alphas`
    /// one per expert), tokens contiguous (`bound` = max tokens) or masked (`bound` = max rows
    /// per expert), C bf16 or f16.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        device: &Device,
        groups: usize,
        n: usize,
        k: usize,
        masked: bool,
        bound: usize,
        bf16: bool,
        weights: Vec<u64>,
        alphas: Vec<f32>,
    ) -> PyResult<MoePlan> {
        let problem = moe_problem(groups, n, k, masked, bound, bf16, &weights, &alphas)?;
        let gpu = device.dev.gpu();
        let plan = nvfp4_gemm::MoePlan::new(gpu, problem.clone()).map_err(py_err)?;
        plan_memory_ready(gpu)?;
        let stream = gpu.context().default_stream();
        let status_address = plan.status().device_ptr(&stream).0;
        let kernel = plan.summary().kernel.clone();
        // On sm_100a the token map holds A's address.
        let inner = MoeInner::new(plan, gpu, &weights, alphas, gpu.arch() == nvfp4_gemm::Arch::Sm100a);
        Ok(MoePlan { inner: Mutex::new(inner), problem, kernel, status_address })
    }

    #[getter]
    fn kernel(&self) -> String {
        self.kernel.clone()
    }

    /// Device address of the status word (`u32`: bits of sizes beyond the bounds).
    #[getter]
    fn status_address(&self) -> u64 {
        self.status_address
    }

    /// The GEMM on quantized tokens `a` (four values) with sizes `sizes` into `c`, on `stream`.
    /// Returns whether the call was captured.
    fn run(&self, stream: u64, sizes: (u64, u64), a: Vec<u64>, c: (u64, u64)) -> PyResult<bool> {
        self.forward(stream, None, sizes, a, c)
    }

    /// Quantizes `x` (f16 or bf16 tokens in the problem's layout) with `global_scale` into `a`,
    /// then the GEMM into `c`: one call of the layer. Returns whether it was captured.
    #[allow(clippy::too_many_arguments)]
    fn quantize_run(
        &self,
        device: &Device,
        stream: u64,
        x: (u64, u64),
        x_bf16: bool,
        global_scale: f32,
        sizes: (u64, u64),
        a: Vec<u64>,
        c: (u64, u64),
    ) -> PyResult<bool> {
        self.forward(stream, Some((device, x, x_bf16, global_scale)), sizes, a, c)
    }

    /// Zeroes the status word on `stream` (capturable).
    fn clear_status(&self, stream: u64) -> PyResult<()> {
        lock(&self.inner)?.clear_status(stream)
    }

    /// Reads the status word (synchronizes `stream`).
    fn read_status(&self, stream: u64) -> PyResult<(u32, String)> {
        lock(&self.inner)?.read_status(stream)
    }
}

fn check_operand(a: &[u64]) -> PyResult<()> {
    if a.len() != 4 {
        return Err(value_error(format!("{} values for an operand; it takes 4", a.len())));
    }
    Ok(())
}

impl MoePlan {
    fn forward(
        &self,
        stream: u64,
        quantize: Option<(&Device, (u64, u64), bool, f32)>,
        sizes: (u64, u64),
        a: Vec<u64>,
        c: (u64, u64),
    ) -> PyResult<bool> {
        check_operand(&a)?;
        let a_op = operand(&a);
        let mut guard = lock(&self.inner)?;
        let inner = &mut *guard;
        // SAFETY: as in `GemmPlan::run`.
        let s = unsafe { inner.streams.get(stream) }.clone();
        let capturing = raw::is_capturing(&s).map_err(py_err)?;
        inner.check_capture(capturing, a_op.values.ptr)?;
        let args = RawMoeArgs { sizes: buffer(sizes), a: a_op, c: buffer(c) };
        let c_type = self.problem.output();
        if let Some((device, x, x_bf16, global_scale)) = quantize {
            // Validate the GEMM's buffers first (the library's rules, on the CPU), so that an
            // error launches nothing at all.
            let sizes_len = self.problem.sizes_len() as u64;
            let want_c = self.problem.c_elements() as u64;
            if sizes.1 != sizes_len || c.1 != want_c {
                return Err(value_error(format!(
                    "moe run: sizes has {} elements (needs {sizes_len}), c {} (needs {want_c})",
                    sizes.1, c.1
                )));
            }
            // SAFETY: as in `GemmPlan::run`.
            unsafe {
                raw::quantize_grouped(
                    device.dev.quantizer(),
                    &s,
                    buffer(x),
                    output_type(x_bf16),
                    &self.problem,
                    buffer(sizes),
                    global_scale,
                    &a_op,
                )
            }
            .map_err(py_err)?;
        }
        let (weights, alphas) = (std::mem::take(&mut inner.weights), std::mem::take(&mut inner.alphas));
        // SAFETY: as in `GemmPlan::run`; the weights were given at construction and are kept
        // alive by the Python object.
        let result = unsafe { raw::moe_run(inner.plan(), &s, &args, &weights, &alphas, c_type) };
        (inner.weights, inner.alphas) = (weights, alphas);
        result.map_err(py_err)?;
        inner.last_a = Some(a_op.values.ptr);
        Ok(capturing)
    }
}

/// The activations' type of a W4A16 call.
fn activations(bf16: bool) -> Activations {
    if bf16 {
        Activations::Bf16
    } else {
        Activations::F16
    }
}

/// Prepacks one NVFP4 weight matrix for W4A16 on the CPU (`nvfp4_gemm::w4a16::prepack`): `values`
/// `rows × k/2` bytes, `scales` its blocked bytes, for bf16 (`bf16`) or f16 activations. Returns
/// the prepacked `(values, scales)`, the same sizes.
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
    let w = nvfp4_gemm::w4a16::prepack(&m, activations(bf16)).map_err(py_err)?;
    Ok((PyBytes::new(py, &w.values), PyBytes::new(py, &w.scales)))
}

/// A `nvfp4_gemm::w4a16::W4a16Plan` for one set of shapes, output type and activation type.
#[pyclass(module = "nvfp4_gemm._native", frozen)]
struct W4a16Plan {
    inner: Mutex<Planned<nvfp4_gemm::w4a16::W4a16Plan>>,
    kernel: String,
}

#[pymethods]
impl W4a16Plan {
    /// Plans `shapes` (`(m, n, k)` per group) on `device` with C in bf16 (`bf16`) or f16 and
    /// activations in bf16 (`bf16_activations`) or f16.
    #[new]
    fn new(
        device: &Device,
        shapes: Vec<(usize, usize, usize)>,
        bf16: bool,
        bf16_activations: bool,
    ) -> PyResult<W4a16Plan> {
        let p = problem(&shapes, bf16)?;
        let gpu = device.dev.gpu();
        let plan = nvfp4_gemm::w4a16::W4a16Plan::new(gpu, p, activations(bf16_activations)).map_err(py_err)?;
        plan_memory_ready(gpu)?;
        let kernel = plan.kernel().to_string();
        Ok(W4a16Plan { inner: Mutex::new(Planned::new(plan, gpu, output_type(bf16))), kernel })
    }

    /// The kernel a call launches.
    #[getter]
    fn kernel(&self) -> String {
        self.kernel.clone()
    }

    /// One call on `stream`: `buffers` eight values per group (activations, prepacked weight
    /// values, their scales, C: address and length each), `alphas` one per group. Returns
    /// whether the call was captured into a CUDA graph.
    fn run(&self, stream: u64, buffers: Vec<u64>, alphas: Vec<f32>) -> PyResult<bool> {
        if !buffers.len().is_multiple_of(8) || buffers.len() / 8 != alphas.len() {
            return Err(value_error(format!(
                "{} buffer values and {} alphas (8 and 1 per group)",
                buffers.len(),
                alphas.len()
            )));
        }
        let args: Vec<RawW4a16Args> = buffers
            .chunks_exact(8)
            .zip(&alphas)
            .map(|(b, &alpha)| RawW4a16Args {
                activations: RawBuffer { ptr: b[0], len: b[1] },
                b: operand(&b[2..6]),
                c: RawBuffer { ptr: b[6], len: b[7] },
                alpha,
            })
            .collect();
        let signature = LastCall::signature(&buffers, &alphas, None, false);
        let mut inner = lock(&self.inner)?;
        // SAFETY: as in `GemmPlan::run`.
        unsafe { inner.call(stream, signature, |plan, s, c| raw::w4a16_run(plan, s, &args, c)) }
    }
}

/// A `nvfp4_gemm::w4a16::W4a16MoePlan` with its prepacked weights and alphas fixed.
#[pyclass(module = "nvfp4_gemm._native", frozen)]
struct W4a16MoePlan {
    inner: Mutex<MoeInner<nvfp4_gemm::w4a16::W4a16MoePlan>>,
    output: OutputType,
    kernel: String,
    status_address: u64,
}

#[pymethods]
impl W4a16MoePlan {
    /// Plans `groups` experts of `n × k` weights prepacked for bf16 (`bf16_activations`) or f16
    /// activations (`weights`: four values per expert, `alphas` one per expert), tokens
    /// contiguous (`bound` = max tokens) or masked (`bound` = max rows per expert), C bf16 or f16.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        device: &Device,
        groups: usize,
        n: usize,
        k: usize,
        masked: bool,
        bound: usize,
        bf16: bool,
        bf16_activations: bool,
        weights: Vec<u64>,
        alphas: Vec<f32>,
    ) -> PyResult<W4a16MoePlan> {
        let problem = moe_problem(groups, n, k, masked, bound, bf16, &weights, &alphas)?;
        let gpu = device.dev.gpu();
        let plan = nvfp4_gemm::w4a16::W4a16MoePlan::new(gpu, problem, activations(bf16_activations)).map_err(py_err)?;
        plan_memory_ready(gpu)?;
        let stream = gpu.context().default_stream();
        let status_address = plan.status().device_ptr(&stream).0;
        let kernel = plan.summary().kernel.clone();
        // The token maps hold the activations' address.
        let inner = MoeInner::new(plan, gpu, &weights, alphas, true);
        Ok(W4a16MoePlan { inner: Mutex::new(inner), output: output_type(bf16), kernel, status_address })
    }

    #[getter]
    fn kernel(&self) -> String {
        self.kernel.clone()
    }

    /// Device address of the status word (`u32`: bits of sizes beyond the bounds).
    #[getter]
    fn status_address(&self) -> u64 {
        self.status_address
    }

    /// The GEMM on the activations `x` with sizes `sizes` into `c`, on `stream`. Returns whether
    /// the call was captured.
    fn run(&self, stream: u64, sizes: (u64, u64), x: (u64, u64), c: (u64, u64)) -> PyResult<bool> {
        let mut guard = lock(&self.inner)?;
        let inner = &mut *guard;
        // SAFETY: as in `GemmPlan::run`.
        let s = unsafe { inner.streams.get(stream) }.clone();
        let capturing = raw::is_capturing(&s).map_err(py_err)?;
        inner.check_capture(capturing, x.0)?;
        let (weights, alphas) = (std::mem::take(&mut inner.weights), std::mem::take(&mut inner.alphas));
        // SAFETY: as in `MoePlan::run`.
        let result = unsafe {
            raw::w4a16_moe_run(inner.plan(), &s, buffer(sizes), buffer(x), &weights, &alphas, buffer(c), self.output)
        };
        (inner.weights, inner.alphas) = (weights, alphas);
        result.map_err(py_err)?;
        inner.last_a = Some(x.0);
        Ok(capturing)
    }

    /// Zeroes the status word on `stream` (capturable).
    fn clear_status(&self, stream: u64) -> PyResult<()> {
        lock(&self.inner)?.clear_status(stream)
    }

    /// Reads the status word (synchronizes `stream`).
    fn read_status(&self, stream: u64) -> PyResult<(u32, String)> {
        lock(&self.inner)?.read_status(stream)
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Device>()?;
    m.add_class::<GemmPlan>()?;
    m.add_class::<MoePlan>()?;
    m.add_class::<W4a16Plan>()?;
    m.add_class::<W4a16MoePlan>()?;
    m.add_function(wrap_pyfunction!(prepack_w4a16, m)?)?;
    m.add_function(wrap_pyfunction!(check_problem, m)?)?;
    m.add_function(wrap_pyfunction!(moe_sizes, m)?)?;
    m.add_function(wrap_pyfunction!(driver_present, m)?)?;
    m.add("CudaError", py.get_type::<CudaError>())?;
    m.add("NoDriverError", py.get_type::<NoDriverError>())?;
    m.add("UnsupportedError", py.get_type::<UnsupportedError>())?;
    m.add("CaptureError", py.get_type::<CaptureError>())?;
    Ok(())
}

/// True when the CUDA driver library can be loaded.
#[pyfunction]
fn driver_present() -> bool {
    nvfp4_gemm::driver_present()
}
