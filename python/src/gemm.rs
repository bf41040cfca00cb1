//! The grouped GEMM calls (`grouped_gemm`, `grouped_gemm_stacked`, `w4a16.grouped_gemm`,
//! `prepare`, `custom_kernel`) and the one plan cache behind them: plans by (device, problem), the
//! problem (shapes, output and token types) taken from the call's tensors by the library's rule
//! book (`nvfp4_gemm::tensor`), then run on the tensors' addresses (`GemmPlan::run_views`).

use crate::errors::{py_err, type_error, value_error, CaptureError};
use crate::{hooks, read};
use cudarc::driver::{sys, CudaContext, CudaStream};
use nvfp4_gemm::problem::{BufferView, GroupBuffers};
use nvfp4_gemm::tensor::{self, Arg, DType, GroupInputs, GroupNames, GroupTensors, SameDevice, TensorDesc};
use nvfp4_gemm::{GemmPlan, OutputType, Problem, StackedViews, TokenKind};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Most plans the cache keeps (the least recently used beyond it is freed).
const MAX_PLANS: usize = 64;

/// A plan with the last stream it ran on (borrowed from the caller).
pub struct Planned {
    plan: GemmPlan,
    ctx: Arc<CudaContext>,
    stream: Option<(u64, Arc<CudaStream>)>,
}

impl Planned {
    /// The caller's stream `handle`, borrowed.
    ///
    /// # Safety
    /// `handle` a live stream of the plan's context (or 0), alive while the plan uses it.
    unsafe fn stream(&mut self, handle: u64) -> Arc<CudaStream> {
        if self.stream.as_ref().map(|s| s.0) != Some(handle) {
            // SAFETY: the caller's contract.
            let s = unsafe { self.ctx.wrap_borrowed_stream(handle as sys::CUstream) };
            self.stream = Some((handle, s));
        }
        self.stream.as_ref().expect("set above").1.clone()
    }

    /// Runs the plan on `handle` with `groups` (stacked: `stacked`) and the alphas; returns
    /// whether the call was captured into a CUDA graph.
    ///
    /// # Safety
    /// The buffers: live device memory of the plan's device, of the lengths given, for the work.
    unsafe fn run(&mut self, handle: u64, call: Call<'_>) -> PyResult<bool> {
        // SAFETY: the caller's contract (the current stream of the tensors' device).
        let stream = unsafe { self.stream(handle) };
        let capturing = nvfp4_gemm::is_capturing(&stream).map_err(py_err)?;
        // SAFETY: the caller's contract.
        unsafe {
            match call {
                Call::Groups { groups, device_alphas } => self.plan.run_views(&stream, groups, device_alphas),
                Call::Stacked { views, alphas, device_alphas } => {
                    self.plan.run_stacked_views(&stream, views, alphas, device_alphas)
                }
            }
        }
        .map_err(py_err)?;
        Ok(capturing)
    }
}

/// What one run passes.
enum Call<'a> {
    Groups { groups: &'a [GroupBuffers], device_alphas: Option<BufferView> },
    Stacked { views: &'a StackedViews, alphas: &'a [f32], device_alphas: Option<BufferView> },
}

/// A plan shared by the cache and its callers.
type Shared = Arc<Mutex<Planned>>;

/// A cached plan's key: the device ordinal and the problem.
type PlanKey = (u32, Problem);

/// Device alphas: their view and their tensor (for the call's device check).
type DeviceAlphas = Option<(BufferView, TensorDesc)>;

/// One group's offsets in stacked buffers: `(a_values, a_scales, b_values, b_scales, c_elements)`.
type Offsets = (usize, usize, usize, usize, usize);

/// The plan cache: by (device ordinal, problem), most recently used kept; plans a CUDA graph
/// captured are kept apart and never freed (the graph reads their tables and workspace).
/// `last` is the plan of the latest call with its key and last use: a call of the same problem
/// finds it by one comparison, without hashing the problem's shapes (64 groups: ~1 µs).
#[derive(Default)]
struct Cache {
    plans: HashMap<PlanKey, (Shared, u64)>,
    tick: u64,
    captured: Vec<Arc<Mutex<Planned>>>,
    last: Option<(PlanKey, Shared, u64)>,
}

impl Cache {
    /// Makes `p` (`key`'s plan, used at `tick`) the latest; the one it replaces gets its last
    /// use written back to `plans`, so the least recently used stays the one evicted.
    fn remember(&mut self, key: PlanKey, p: Shared, tick: u64) {
        if let Some((old, _, used)) = self.last.take() {
            if let Some(entry) = self.plans.get_mut(&old) {
                entry.1 = used;
            }
        }
        self.last = Some((key, p, tick));
    }
}

static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

fn cache() -> MutexGuard<'static, Option<Cache>> {
    CACHE.lock().unwrap_or_else(|e| e.into_inner())
}

fn lock(p: &Mutex<Planned>) -> MutexGuard<'_, Planned> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// Drops every cached plan but those captured into graphs. Waits for each plan's device.
#[pyfunction]
pub fn clear_cache() {
    let dropped: Vec<Arc<Mutex<Planned>>> = match cache().as_mut() {
        Some(c) => {
            c.last = None;
            c.plans.drain().map(|(_, (p, _))| p).collect()
        }
        None => vec![],
    };
    for p in dropped {
        release(p);
    }
}

/// Frees a plan: after its device is idle (work enqueued on the caller's streams may still read
/// its tables).
fn release(p: Arc<Mutex<Planned>>) {
    let ctx = lock(&p).ctx.clone();
    let _ = ctx.synchronize();
    drop(p);
}

/// The cached plan of `problem` on device `ordinal`, planned now on a miss (which needs the device:
/// the package's handle, and refuses inside a capture: planning allocates).
fn plan(py: Python<'_>, ordinal: u32, problem: &Problem, handle: u64, what: &str) -> PyResult<Arc<Mutex<Planned>>> {
    {
        let mut guard = cache();
        let c = guard.get_or_insert_with(Cache::default);
        c.tick += 1;
        let tick = c.tick;
        if let Some((key, p, used)) = c.last.as_mut() {
            if key.0 == ordinal && key.1 == *problem {
                *used = tick;
                return Ok(p.clone());
            }
        }
        let key = (ordinal, problem.clone());
        if let Some((p, used)) = c.plans.get_mut(&key) {
            *used = tick;
            let p = p.clone();
            c.remember(key, p.clone(), tick);
            return Ok(p);
        }
    }
    let planned = Arc::new(Mutex::new(new_plan(py, ordinal, problem, handle, what)?));
    let evicted = {
        let mut guard = cache();
        let c = guard.get_or_insert_with(Cache::default);
        let key = (ordinal, problem.clone());
        c.plans.insert(key.clone(), (planned.clone(), c.tick));
        let tick = c.tick;
        c.remember(key, planned.clone(), tick);
        if c.plans.len() > MAX_PLANS {
            let oldest = c.plans.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| k.clone());
            oldest.and_then(|k| c.plans.remove(&k)).map(|(p, _)| p)
        } else {
            None
        }
    };
    if let Some(p) = evicted {
        release(p);
    }
    Ok(planned)
}

/// A plan of its own for `problem` on device `ordinal` (refused inside a capture on `handle`).
fn new_plan(py: Python<'_>, ordinal: u32, problem: &Problem, handle: u64, what: &str) -> PyResult<Planned> {
    let dev = hooks::device(py, ordinal)?;
    let dev = dev.bind(py).borrow();
    let ctx = dev.gpu().context().clone();
    // SAFETY: the caller's current stream of this device.
    let stream = unsafe { ctx.wrap_borrowed_stream(handle as sys::CUstream) };
    if nvfp4_gemm::is_capturing(&stream).map_err(py_err)? {
        return Err(CaptureError::new_err(format!(
            "{what} inside CUDA graph capture: a new plan allocates device memory; call once with these shapes \
             outside capture first"
        )));
    }
    let plan = GemmPlan::new(dev.gpu(), problem.clone()).map_err(py_err)?;
    Ok(Planned { plan, ctx, stream: Some((handle, stream)) })
}

/// After a captured call: the graph keeps the plan (its tables, its workspace); later calls of
/// these shapes get a plan of their own.
fn retire(ordinal: u32, problem: &Problem, p: &Arc<Mutex<Planned>>) {
    let mut guard = cache();
    let c = guard.get_or_insert_with(Cache::default);
    if c.last.as_ref().is_some_and(|(_, q, _)| Arc::ptr_eq(p, q)) {
        c.last = None;
    }
    let key = (ordinal, problem.clone());
    if c.plans.get(&key).is_some_and(|(q, _)| Arc::ptr_eq(p, q)) {
        c.plans.remove(&key);
    }
    c.captured.push(p.clone());
}

/// The device a call runs on: its tensors', or the current one when none says.
fn ordinal(py: Python<'_>, device: &SameDevice) -> PyResult<u32> {
    match device.device() {
        Some(d) => Ok(d),
        None => hooks::current_device(py),
    }
}

/// The output type of a call with outputs `out` (their first one's type, unless `out_dtype`
/// says), or without (`out_dtype`, else `default`).
fn out_type(
    call: &'static str,
    out_dtype: Option<DType>,
    first_out: Option<&TensorDesc>,
    default: DType,
) -> PyResult<OutputType> {
    let default = first_out.map_or(default, |t| if tensor::DENSE.contains(&t.dtype) { t.dtype } else { default });
    tensor::output_type(call, out_dtype, default).map_err(|e| match e {
        nvfp4_gemm::Error::WrongType { reason, .. } => type_error(format!("out_dtype: {reason}")),
        other => py_err(other),
    })
}

/// The alphas of a grouped call: a device tensor (`[G]` float32, read on the device: its view
/// and descriptor, for the device check with the call's other tensors), or host floats (None,
/// one number, one per group), checked.
fn alphas(call: &'static str, alpha: Option<&Bound<'_, PyAny>>, groups: usize) -> PyResult<(Vec<f32>, DeviceAlphas)> {
    if let Some(a) = alpha.filter(|a| !read::is_host_number_or_sequence(a) && read::is_tensor(a)) {
        let arg = Arg::of(call, "alpha");
        let t = read::tensor(a, arg)?;
        let view = tensor::device_alphas(&t, arg, groups).map_err(py_err)?;
        return Ok((vec![], Some((view, t))));
    }
    let values = read::floats(alpha, groups, "alpha")?;
    tensor::check_alphas(call, "alpha", &values).map_err(py_err)?;
    Ok((values, None))
}

/// The device alphas' view, their tensor on the call's device.
fn check_device_alphas(
    call: &'static str,
    alphas: Option<(BufferView, TensorDesc)>,
    device: &mut SameDevice,
) -> PyResult<Option<BufferView>> {
    let Some((view, t)) = alphas else { return Ok(None) };
    device.check(&t, Arg::of(call, "alpha")).map_err(py_err)?;
    Ok(Some(view))
}

/// The `scale_layout` argument: blocked (false) or plain (true).
fn plain_layout(scale_layout: &str) -> PyResult<bool> {
    match scale_layout {
        "blocked" => Ok(false),
        "plain" => Ok(true),
        other => Err(value_error(format!("scale_layout: {other:?}; expected 'blocked' or 'plain'").replace('"', "'"))),
    }
}

/// The outputs of a grouped call: `out`'s tensors checked against the shapes, or new ones.
#[allow(clippy::too_many_arguments)]
fn outputs<'py>(
    py: Python<'py>,
    call: &'static str,
    name: &'static str,
    out: Option<Vec<Bound<'py, PyAny>>>,
    out_descs: &[TensorDesc],
    shapes: &[(usize, usize)],
    dtype: OutputType,
    like: Option<&Bound<'py, PyAny>>,
    device: &mut SameDevice,
) -> PyResult<(Vec<Bound<'py, PyAny>>, Vec<BufferView>)> {
    let dt = DType::of_output(dtype);
    match out {
        Some(out) => {
            let mut views = Vec::with_capacity(out.len());
            for (g, (t, &(m, n))) in out_descs.iter().zip(shapes).enumerate() {
                let arg = Arg::group(call, g, name);
                views.push(tensor::output(t, arg, m, n, dt).map_err(py_err)?);
                device.check(t, arg).map_err(py_err)?;
            }
            Ok((out, views))
        }
        None => {
            let like =
                like.ok_or_else(|| type_error("out: required when there is no input to allocate like".into()))?;
            let o = ordinal(py, device)?;
            let mut outs = Vec::with_capacity(shapes.len());
            let mut views = Vec::with_capacity(shapes.len());
            for &(m, n) in shapes {
                let t = hooks::alloc(py, like, &[m, n], dt.name(), o, false)?;
                let d = read::tensor(&t, Arg::of(call, "out"))?;
                views.push(d.view());
                outs.push(t);
            }
            Ok((outs, views))
        }
    }
}

/// One group's buffers from its checked views.
fn group_buffers(
    tokens: TokenKind,
    views: &[BufferView; 4],
    c: BufferView,
    c_type: OutputType,
    alpha: f32,
) -> GroupBuffers {
    GroupBuffers {
        a_kind: tokens,
        a_values: views[0],
        a_scales: views[1],
        b_values: views[2],
        b_scales: views[3],
        c,
        c_type,
        alpha,
    }
}

/// The inputs of a grouped call, read and checked: lists `a`, `b`, `a_scales` (None: W4A16's
/// activations in `a`), `b_scales`, named by `names`; plain scales converted first.
#[allow(clippy::too_many_arguments)]
fn group_inputs<'py>(
    py: Python<'py>,
    names: &GroupNames,
    a: &[Bound<'py, PyAny>],
    b: &[Bound<'py, PyAny>],
    a_scales: Option<&[Bound<'py, PyAny>]>,
    b_scales: &[Bound<'py, PyAny>],
    plain: bool,
    device: &mut SameDevice,
    keep: &mut Vec<Bound<'py, PyAny>>,
) -> PyResult<GroupInputs> {
    let mut inputs = GroupInputs::default();
    inputs.shapes.reserve(a.len());
    inputs.views.reserve(a.len());
    for g in 0..a.len() {
        let arg = |name| Arg::group(names.call, g, name);
        let ta = read::tensor(&a[g], arg(names.a))?;
        let tb = read::tensor(&b[g], arg(names.b))?;
        let mut tsa = match a_scales {
            Some(s) => Some(read::tensor(&s[g], arg(names.a_scales))?),
            None => None,
        };
        let mut tsb = read::tensor(&b_scales[g], arg(names.b_scales))?;
        if plain {
            // The rows and K the plain scales must have come from the operands.
            let (m, k) = tensor::values(&ta, arg(names.a), None, None).map_err(py_err)?;
            let (n, _) = tensor::weights(&tb, arg(names.b), Some(k)).map_err(py_err)?;
            if let (Some(desc), Some(objs)) = (&tsa, a_scales) {
                tensor::plain_scales(desc, arg(names.a_scales), m, k).map_err(py_err)?;
                let blocked = hooks::to_blocked(py, &objs[g], m)?;
                tsa = Some(read::tensor(&blocked, arg(names.a_scales))?);
                keep.push(blocked);
            }
            tensor::plain_scales(&tsb, arg(names.b_scales), n, k).map_err(py_err)?;
            let blocked = hooks::to_blocked(py, &b_scales[g], n)?;
            tsb = read::tensor(&blocked, arg(names.b_scales))?;
            keep.push(blocked);
        }
        let t = GroupTensors { a: &ta, a_scales: tsa.as_ref(), b: &tb, b_scales: &tsb };
        tensor::group_inputs(g, &t, names, device, &mut inputs).map_err(py_err)?;
    }
    Ok(inputs)
}

/// The arguments of a call with one tensor per group in lists (`grouped_gemm`, `prepare`): read
/// and checked up to the outputs.
struct ListArgs<'py> {
    /// The call, as errors name it.
    call: &'static str,
    /// `a`, `b`, `a_scales`, `b_scales`, one entry per group each.
    operands: [Vec<Bound<'py, PyAny>>; 4],
    out: Option<Vec<Bound<'py, PyAny>>>,
    out_descs: Vec<TensorDesc>,
    dtype: OutputType,
    device: SameDevice,
    host_alphas: Vec<f32>,
    device_alphas: DeviceAlphas,
    inputs: GroupInputs,
    /// Tensors made for the call (blocked copies of plain scales), kept while it runs.
    keep: Vec<Bound<'py, PyAny>>,
    groups: usize,
}

/// A list call's outputs, problem and buffers ([`ListArgs::call`]).
struct ListCall<'py> {
    outs: Vec<Bound<'py, PyAny>>,
    problem: Problem,
    buffers: Vec<GroupBuffers>,
    device_alphas: Option<BufferView>,
    device: SameDevice,
    keep: Vec<Bound<'py, PyAny>>,
}

impl<'py> ListArgs<'py> {
    #[allow(clippy::too_many_arguments)]
    fn read(
        py: Python<'py>,
        call: &'static str,
        [a, b, a_scales, b_scales]: [&Bound<'py, PyAny>; 4],
        alpha: Option<&Bound<'py, PyAny>>,
        out: Option<&Bound<'py, PyAny>>,
        out_dtype: Option<&Bound<'py, PyAny>>,
        scale_layout: &str,
    ) -> PyResult<ListArgs<'py>> {
        let operands = [
            read::list(a, "a")?,
            read::list(b, "b")?,
            read::list(a_scales, "a_scales")?,
            read::list(b_scales, "b_scales")?,
        ];
        let [a, b, sa, sb] = &operands;
        let out = out.filter(|o| !o.is_none()).map(|o| read::list(o, "out")).transpose()?;
        let mut lengths = vec![("a", a.len()), ("b", b.len()), ("a_scales", sa.len()), ("b_scales", sb.len())];
        if let Some(o) = &out {
            lengths.push(("out", o.len()));
        }
        let groups = read::same_lengths(&lengths)?;
        let out_descs: Vec<TensorDesc> = match &out {
            Some(o) => o
                .iter()
                .enumerate()
                .map(|(g, t)| read::tensor(t, Arg::group(call, g, "out")))
                .collect::<PyResult<_>>()?,
            None => vec![],
        };
        let dtype = out_type(call, read::dtype_arg(out_dtype)?, out_descs.first(), DType::F16)?;
        let mut device = SameDevice::new(None);
        let (host_alphas, device_alphas) = alphas(call, alpha, groups)?;
        let plain = plain_layout(scale_layout)?;
        let names = GroupNames { call, a: "a", a_scales: "a_scales", b: "b", b_scales: "b_scales" };
        let mut keep = vec![];
        let inputs = group_inputs(py, &names, a, b, Some(sa), sb, plain, &mut device, &mut keep)?;
        Ok(ListArgs { call, operands, out, out_descs, dtype, device, host_alphas, device_alphas, inputs, keep, groups })
    }

    /// The outputs (the caller's, or new tensors), the device alphas checked, the problem and
    /// each group's buffers.
    fn call(self, py: Python<'py>) -> PyResult<ListCall<'py>> {
        let ListArgs {
            call,
            operands,
            out,
            out_descs,
            dtype,
            mut device,
            host_alphas,
            device_alphas,
            inputs,
            keep,
            groups,
        } = self;
        let shapes: Vec<(usize, usize)> = inputs.shapes.iter().map(|s| (s.m, s.n)).collect();
        let (outs, c) = outputs(py, call, "out", out, &out_descs, &shapes, dtype, operands[0].first(), &mut device)?;
        let device_alphas = check_device_alphas(call, device_alphas, &mut device)?;
        let problem = Problem::with_tokens(inputs.shapes.clone(), dtype, inputs.tokens).map_err(py_err)?;
        let buffers: Vec<GroupBuffers> = (0..groups)
            .map(|g| {
                group_buffers(inputs.tokens, &inputs.views[g], c[g], dtype, host_alphas.get(g).copied().unwrap_or(1.0))
            })
            .collect();
        Ok(ListCall { outs, problem, buffers, device_alphas, device, keep })
    }
}

/// `grouped_gemm`: `out[g] = alpha[g] · A_g · B_gᵀ` per group (the package's docs); returns the
/// outputs.
#[pyfunction]
#[pyo3(signature = (a, b, a_scales, b_scales, alpha=None, out=None, out_dtype=None, scale_layout="blocked", stream=None))]
#[allow(clippy::too_many_arguments)]
pub fn grouped_gemm<'py>(
    py: Python<'py>,
    a: &Bound<'py, PyAny>,
    b: &Bound<'py, PyAny>,
    a_scales: &Bound<'py, PyAny>,
    b_scales: &Bound<'py, PyAny>,
    alpha: Option<&Bound<'py, PyAny>>,
    out: Option<&Bound<'py, PyAny>>,
    out_dtype: Option<&Bound<'py, PyAny>>,
    scale_layout: &str,
    stream: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyList>> {
    const CALL: &str = "grouped_gemm";
    let args = ListArgs::read(py, CALL, [a, b, a_scales, b_scales], alpha, out, out_dtype, scale_layout)?;
    if args.groups == 0 {
        return PyList::new(py, args.out.unwrap_or_default());
    }
    let ListCall { outs, problem, buffers, device_alphas, device, keep, .. } = args.call(py)?;
    let ordinal = ordinal(py, &device)?;
    let handle = hooks::stream(py, stream, ordinal)?;
    let p = plan(py, ordinal, &problem, handle, "planning a grouped GEMM")?;
    // SAFETY: the tensors are live CUDA tensors of this device (checked: addresses, lengths), kept
    // alive by the caller through the call; the stream is the caller's.
    let captured = unsafe { lock(&p).run(handle, Call::Groups { groups: &buffers, device_alphas })? };
    if captured {
        retire(ordinal, &problem, &p);
    }
    drop(keep);
    PyList::new(py, outs)
}

/// `w4a16.grouped_gemm`: `out[g] = alpha[g] · x_g · B_gᵀ` with 16-bit activations and prepacked
/// weights; returns the outputs.
#[pyfunction]
#[pyo3(signature = (x, b, b_scales, alpha=None, out=None, out_dtype=None, stream=None))]
#[allow(clippy::too_many_arguments)]
pub fn w4a16_grouped_gemm<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    b: &Bound<'py, PyAny>,
    b_scales: &Bound<'py, PyAny>,
    alpha: Option<&Bound<'py, PyAny>>,
    out: Option<&Bound<'py, PyAny>>,
    out_dtype: Option<&Bound<'py, PyAny>>,
    stream: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyList>> {
    const CALL: &str = "w4a16.grouped_gemm";
    let (x, b, sb) = (read::list(x, "x")?, read::list(b, "b")?, read::list(b_scales, "b_scales")?);
    let out = out.filter(|o| !o.is_none()).map(|o| read::list(o, "out")).transpose()?;
    let mut lengths = vec![("x", x.len()), ("b", b.len()), ("b_scales", sb.len())];
    if let Some(o) = &out {
        lengths.push(("out", o.len()));
    }
    let groups = read::same_lengths(&lengths)?;
    if groups == 0 {
        return PyList::new(py, out.unwrap_or_default());
    }
    let x0 = read::tensor(&x[0], Arg::group(CALL, 0, "x"))?;
    let activations = x0.dtype;
    if activations.activations().is_none() {
        return Err(type_error(format!("group 0: `x`: {}; expected float16 or bfloat16", activations.name())));
    }
    let out_descs: Vec<TensorDesc> = match &out {
        Some(o) => {
            o.iter().enumerate().map(|(g, t)| read::tensor(t, Arg::group(CALL, g, "out"))).collect::<PyResult<_>>()?
        }
        None => vec![],
    };
    let dtype = out_type(CALL, read::dtype_arg(out_dtype)?, out_descs.first(), activations)?;
    let host_alphas = read::floats(alpha, groups, "alpha")?;
    tensor::check_alphas(CALL, "alpha", &host_alphas).map_err(py_err)?;
    let mut device = SameDevice::new(None);
    let names = GroupNames { call: CALL, a: "x", a_scales: "", b: "b", b_scales: "b_scales" };
    let mut keep = vec![];
    let inputs = group_inputs(py, &names, &x, &b, None, &sb, false, &mut device, &mut keep)?;
    let shapes: Vec<(usize, usize)> = inputs.shapes.iter().map(|s| (s.m, s.n)).collect();
    let (outs, c) = outputs(py, CALL, "out", out, &out_descs, &shapes, dtype, x.first(), &mut device)?;
    let problem = Problem::with_tokens(inputs.shapes.clone(), dtype, inputs.tokens).map_err(py_err)?;
    let buffers: Vec<GroupBuffers> =
        (0..groups).map(|g| group_buffers(inputs.tokens, &inputs.views[g], c[g], dtype, host_alphas[g])).collect();
    let ordinal = ordinal(py, &device)?;
    let handle = hooks::stream(py, stream, ordinal)?;
    let p = plan(py, ordinal, &problem, handle, "planning a W4A16 GEMM")?;
    // SAFETY: as in `grouped_gemm`.
    let captured = unsafe { lock(&p).run(handle, Call::Groups { groups: &buffers, device_alphas: None })? };
    if captured {
        retire(ordinal, &problem, &p);
    }
    PyList::new(py, outs)
}

/// `grouped_gemm_stacked`: every group's operands in one tensor each; returns `out`.
#[pyfunction]
#[pyo3(signature = (a, b, a_scales, b_scales, m_sizes, alpha=None, out=None, out_dtype=None, stream=None))]
#[allow(clippy::too_many_arguments)]
pub fn grouped_gemm_stacked<'py>(
    py: Python<'py>,
    a: &Bound<'py, PyAny>,
    b: &Bound<'py, PyAny>,
    a_scales: &Bound<'py, PyAny>,
    b_scales: &Bound<'py, PyAny>,
    m_sizes: &Bound<'py, PyAny>,
    alpha: Option<&Bound<'py, PyAny>>,
    out: Option<&Bound<'py, PyAny>>,
    out_dtype: Option<&Bound<'py, PyAny>>,
    stream: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    const CALL: &str = "grouped_gemm_stacked";
    if !(m_sizes.is_instance_of::<PyList>() || m_sizes.is_instance_of::<PyTuple>()) {
        return Err(type_error(format!(
            "m_sizes: {}; expected a list of ints (one per group)",
            m_sizes.get_type().name()?
        )));
    }
    let tb = read::tensor(b, Arg::of(CALL, "b"))?;
    let sizes = read::items(m_sizes).expect("a list or a tuple");
    let groups = match *tb.shape.get() {
        [g, _, _] if tb.dtype.bytes() == 1 => g as usize,
        _ => sizes.len(),
    };
    if tb.shape.get().len() == 3 && sizes.len() != groups {
        return Err(value_error(format!("m_sizes: {} sizes but `b` has {groups} groups", sizes.len())));
    }
    let mut ms = Vec::with_capacity(sizes.len());
    for (g, m) in sizes.iter().enumerate() {
        if let Some(v) = read::exact_int(m).filter(|&v| v >= 0) {
            ms.push(v as usize);
            continue;
        }
        match m.extract::<i64>() {
            Ok(v) if v >= 0 && !m.is_instance_of::<pyo3::types::PyBool>() => ms.push(v as usize),
            _ => return Err(value_error(format!("group {g}: `m_sizes`: {} is not a non-negative int", m.repr()?))),
        }
    }
    let ta = read::tensor(a, Arg::of(CALL, "a"))?;
    let tsa = read::tensor(a_scales, Arg::of(CALL, "a_scales"))?;
    let tsb = read::tensor(b_scales, Arg::of(CALL, "b_scales"))?;
    let tc = match out.filter(|o| !o.is_none()) {
        Some(o) => Some(read::tensor(o, Arg::of(CALL, "out"))?),
        None => None,
    };
    let mut device = SameDevice::new(None);
    let t = tensor::StackedTensors { a: &ta, a_scales: &tsa, b: &tb, b_scales: &tsb };
    let mut stacked = tensor::stacked_inputs(CALL, &t, &ms, &mut device).map_err(py_err)?;
    let dtype = out_type(CALL, read::dtype_arg(out_dtype)?, tc.as_ref(), DType::F16)?;
    let (host_alphas, device_alphas) = alphas(CALL, alpha, ms.len())?;
    let tokens: usize = ms.iter().sum();
    let n = stacked.n;
    let (out_obj, c) = match (out.filter(|o| !o.is_none()), &tc) {
        (Some(o), Some(t)) => {
            let arg = Arg::of(CALL, "out");
            let view = tensor::output(t, arg, tokens, n, DType::of_output(dtype)).map_err(py_err)?;
            device.check(t, arg).map_err(py_err)?;
            (o.clone(), view)
        }
        _ => {
            let o = ordinal(py, &device)?;
            let t = hooks::alloc(py, a, &[tokens, n], DType::of_output(dtype).name(), o, false)?;
            let view = read::tensor(&t, Arg::of(CALL, "out"))?.view();
            (t, view)
        }
    };
    let device_alphas = check_device_alphas(CALL, device_alphas, &mut device)?;
    let problem = Problem::new(std::mem::take(&mut stacked.shapes), dtype).map_err(py_err)?;
    let views = StackedViews {
        a_kind: TokenKind::Nvfp4,
        a_values: stacked.views[0],
        a_scales: stacked.views[1],
        b_values: stacked.views[2],
        b_scales: stacked.views[3],
        c,
        c_type: dtype,
    };
    let ordinal = ordinal(py, &device)?;
    let handle = hooks::stream(py, stream, ordinal)?;
    let p = plan(py, ordinal, &problem, handle, "planning a grouped GEMM")?;
    // SAFETY: as in `grouped_gemm`.
    let captured =
        unsafe { lock(&p).run(handle, Call::Stacked { views: &views, alphas: &host_alphas, device_alphas })? };
    if captured {
        retire(ordinal, &problem, &p);
    }
    Ok(out_obj)
}

/// A grouped GEMM bound to its tensors (`prepare`): a plan of its own whose calls only launch.
#[pyclass(module = "nvfp4_gemm._native")]
pub struct Prepared {
    planned: Mutex<Planned>,
    buffers: Vec<GroupBuffers>,
    device_alphas: Option<BufferView>,
    ordinal: u32,
    kernel: String,
    /// The tensors (and converted scales) the buffers point into, kept alive.
    _keep: Vec<Py<PyAny>>,
}

#[pymethods]
impl Prepared {
    /// The GEMM kernel the plan runs (for people).
    #[getter]
    fn kernel(&self) -> String {
        self.kernel.clone()
    }

    /// The device ordinal.
    #[getter]
    fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Launches on `stream` (None: the current stream); returns whether it was captured.
    #[pyo3(signature = (stream=None))]
    fn launch(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        let handle = hooks::stream(py, stream, self.ordinal)?;
        let mut p = self.planned.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the bound tensors are kept alive by this object (and their storage is the
        // caller's to keep, as documented).
        unsafe { p.run(handle, Call::Groups { groups: &self.buffers, device_alphas: self.device_alphas }) }
    }
}

/// `prepare`: `grouped_gemm`'s arguments checked once and bound to a plan of their own; returns
/// `(Prepared, outputs)`.
#[pyfunction]
#[pyo3(signature = (a, b, a_scales, b_scales, alpha=None, out=None, out_dtype=None, scale_layout="blocked", stream=None))]
#[allow(clippy::too_many_arguments)]
pub fn prepare<'py>(
    py: Python<'py>,
    a: &Bound<'py, PyAny>,
    b: &Bound<'py, PyAny>,
    a_scales: &Bound<'py, PyAny>,
    b_scales: &Bound<'py, PyAny>,
    alpha: Option<&Bound<'py, PyAny>>,
    out: Option<&Bound<'py, PyAny>>,
    out_dtype: Option<&Bound<'py, PyAny>>,
    scale_layout: &str,
    stream: Option<&Bound<'py, PyAny>>,
) -> PyResult<(Prepared, Bound<'py, PyList>)> {
    const CALL: &str = "prepare";
    let args = ListArgs::read(py, CALL, [a, b, a_scales, b_scales], alpha, out, out_dtype, scale_layout)?;
    let operands = args.operands.clone();
    let ListCall { outs, problem, buffers, device_alphas, device, keep } = args.call(py)?;
    let ordinal = ordinal(py, &device)?;
    let handle = hooks::stream(py, stream, ordinal)?;
    let planned = new_plan(py, ordinal, &problem, handle, "preparing a grouped GEMM")?;
    let kernel = planned.plan.summary().kernel.clone();
    let mut kept: Vec<Py<PyAny>> =
        operands.iter().flatten().chain(&outs).chain(&keep).map(|t| t.clone().unbind()).collect();
    if let Some(al) = alpha {
        kept.push(al.clone().unbind());
    }
    let prepared = Prepared { planned: Mutex::new(planned), buffers, device_alphas, ordinal, kernel, _keep: kept };
    Ok((prepared, PyList::new(py, outs)?))
}

/// `custom_kernel`: the GPU MODE `nvfp4_group_gemm` entry — `data = (abc_tensors,
/// sfasfb_tensors, sfasfb_reordered_tensors, problem_sizes)`; fills each group's `c` with
/// `a · bᵀ` (scales from the reordered views, alpha 1) on the current stream; returns the list
/// of `c`. The plan is the cache's for these shapes, whatever tensors `data` holds.
#[pyfunction]
pub fn custom_kernel<'py>(py: Python<'py>, data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
    const CALL: &str = "custom_kernel";
    let parts = read::items(data).unwrap_or_default();
    if parts.len() != 4 {
        return Err(type_error(
            "data: expected (abc_tensors, sfasfb_tensors, sfasfb_reordered_tensors, problem_sizes)".into(),
        ));
    }
    let entries = |obj: &Bound<'py, PyAny>, name: &str| -> PyResult<Vec<Bound<'py, PyAny>>> {
        if let Some(v) = read::items(obj) {
            return Ok(v);
        }
        Err(type_error(format!("{name}: {}; expected a list with one entry per group", obj.get_type().name()?)))
    };
    let abc = entries(&parts[0], "abc_tensors")?;
    let sfr = entries(&parts[2], "sfasfb_reordered_tensors")?;
    let sizes = entries(&parts[3], "problem_sizes")?;
    let groups = abc.len();
    for (name, v) in [("sfasfb_reordered_tensors", &sfr), ("problem_sizes", &sizes)] {
        if v.len() != groups {
            return Err(value_error(format!("{name}: {} entries but abc_tensors has {groups} groups", v.len())));
        }
    }
    let tuple = |obj: &Bound<'py, PyAny>, g: usize, name: &str, n: usize| -> PyResult<Vec<Bound<'py, PyAny>>> {
        let items = read::items(obj).unwrap_or_default();
        if items.len() != n {
            return Err(type_error(format!("group {g}: `{name}`: expected a tuple of {n}")));
        }
        Ok(items)
    };
    let (mut a, mut b, mut c, mut sa, mut sb) = (vec![], vec![], vec![], vec![], vec![]);
    let mut shapes = Vec::with_capacity(groups);
    let mut sizes_mnk = Vec::with_capacity(groups);
    for g in 0..groups {
        let t = tuple(&abc[g], g, "abc_tensors", 3)?;
        let s = tuple(&sfr[g], g, "sfasfb_reordered_tensors", 2)?;
        let size = tuple(&sizes[g], g, "problem_sizes", 4)?;
        let [m, n, k, l]: [usize; 4] = [0, 1, 2, 3].map(|i| size[i].extract::<usize>().unwrap_or(usize::MAX));
        if l != 1 {
            return Err(value_error(format!(
                "group {g}: `problem_sizes`: l = {}; only l = 1 is supported",
                size[3].repr()?
            )));
        }
        sizes_mnk.push((m, n, k));
        shapes.push((m, n));
        a.push(t[0].clone());
        b.push(t[1].clone());
        c.push(t[2].clone());
        sa.push(s[0].clone());
        sb.push(s[1].clone());
    }
    // Each tensor is read once: the shapes `problem_sizes` gives are checked against the
    // descriptors the rules read (a tensor is read again only to name a mismatch).
    let mismatch = |g: usize, name: &'static str, obj: &Bound<'py, PyAny>, want: [usize; 3]| -> PyResult<()> {
        let d = read::tensor(obj, Arg::group(CALL, g, name))?;
        if d.shape.get().iter().map(|&x| x as usize).ne(want) {
            let (m, n, k) = sizes_mnk[g];
            return Err(value_error(format!(
                "group {g}: `{name}`: shape {:?} but problem_sizes gives (m, n, k) = ({m}, {n}, {k})",
                d.shape.get()
            )));
        }
        Ok(())
    };
    let out_descs: Vec<TensorDesc> =
        c.iter().enumerate().map(|(g, t)| read::tensor(t, Arg::group(CALL, g, "c"))).collect::<PyResult<_>>()?;
    for (g, d) in out_descs.iter().enumerate() {
        let (m, n, _) = sizes_mnk[g];
        if d.shape.get().iter().map(|&x| x as usize).ne([m, n, 1]) {
            mismatch(g, "c", &c[g], [m, n, 1])?;
        }
    }
    let mut device = SameDevice::new(None);
    let names = GroupNames { call: CALL, a: "a", a_scales: "sfa", b: "b", b_scales: "sfb" };
    let mut keep = vec![];
    let inputs = match group_inputs(py, &names, &a, &b, Some(&sa), &sb, false, &mut device, &mut keep) {
        Ok(inputs) => inputs,
        Err(e) => {
            // A tensor against `problem_sizes` is named first, as that is the likelier mistake.
            for g in 0..groups {
                let (m, n, k) = sizes_mnk[g];
                mismatch(g, "a", &a[g], [m, k / 2, 1])?;
                mismatch(g, "b", &b[g], [n, k / 2, 1])?;
            }
            return Err(e);
        }
    };
    for g in 0..groups {
        let (m, n, k) = sizes_mnk[g];
        let s = inputs.shapes[g];
        if (s.m, s.n, s.k) != (m, n, k) {
            mismatch(g, "a", &a[g], [m, k / 2, 1])?;
            mismatch(g, "b", &b[g], [n, k / 2, 1])?;
        }
    }
    let dtype = OutputType::F16;
    let (outs, cv) = outputs(py, CALL, "c", Some(c), &out_descs, &shapes, dtype, None, &mut device)?;
    let problem = Problem::new(inputs.shapes.clone(), dtype).map_err(py_err)?;
    let buffers: Vec<GroupBuffers> =
        (0..groups).map(|g| group_buffers(TokenKind::Nvfp4, &inputs.views[g], cv[g], dtype, 1.0)).collect();
    if groups == 0 {
        return PyList::new(py, outs);
    }
    let ordinal = ordinal(py, &device)?;
    let handle = hooks::stream(py, None, ordinal)?;
    let p = plan(py, ordinal, &problem, handle, "planning custom_kernel's grouped GEMM")?;
    // SAFETY: as in `grouped_gemm`.
    let captured = unsafe { lock(&p).run(handle, Call::Groups { groups: &buffers, device_alphas: None })? };
    if captured {
        retire(ordinal, &problem, &p);
    }
    PyList::new(py, outs)
}

/// The shapes of a problem, checked by the library (no GPU needed), and the stacked buffers'
/// offsets: one `(a_values, a_scales, b_values, b_scales, c_elements)` per group, then the totals.
#[pyfunction]
pub fn check_problem(shapes: Vec<(usize, usize, usize)>, bf16: bool) -> PyResult<Vec<Offsets>> {
    let shapes: Vec<nvfp4_gemm::GroupShape> =
        shapes.iter().map(|&(m, n, k)| nvfp4_gemm::GroupShape::new(m, n, k)).collect();
    let p = Problem::new(shapes, if bf16 { OutputType::Bf16 } else { OutputType::F16 }).map_err(py_err)?;
    Ok(p.stacked_offsets().iter().map(|o| (o.a_values, o.a_scales, o.b_values, o.b_scales, o.c_elements)).collect())
}
