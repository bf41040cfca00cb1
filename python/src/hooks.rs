//! What the binding asks of the Python package, through functions it registers at import
//! (`nvfp4_gemm._hooks`): the device handle of an ordinal, torch's current device and stream, and
//! torch allocations and conversions. The package keeps nothing else.

use crate::errors::type_error;
use crate::Device;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use std::sync::Mutex;

/// The registered hooks object (a module with the functions below).
static HOOKS: Mutex<Option<Py<PyAny>>> = Mutex::new(None);

/// Registers the package's hooks (called once by `nvfp4_gemm` at import).
#[pyfunction]
pub fn set_hooks(hooks: Py<PyAny>) {
    *HOOKS.lock().expect("not poisoned") = Some(hooks);
}

/// The hooks object.
fn hooks(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    HOOKS
        .lock()
        .expect("not poisoned")
        .as_ref()
        .map(|h| h.bind(py).clone())
        .ok_or_else(|| type_error("nvfp4_gemm._native: the package did not register its hooks".into()))
}

/// The package's device handle of CUDA device `ordinal` (opened once, by the package).
pub fn device(py: Python<'_>, ordinal: u32) -> PyResult<Py<Device>> {
    let d = hooks(py)?.call_method1(intern!(py, "device"), (ordinal,))?;
    d.extract::<Py<Device>>().map_err(Into::into)
}

/// The current CUDA device (torch's, or 0 when torch was not imported).
pub fn current_device(py: Python<'_>) -> PyResult<u32> {
    hooks(py)?.call_method0(intern!(py, "current_device"))?.extract()
}

/// `stream` as a `CUstream` handle: None (the current stream of device `ordinal`: torch's,
/// through its DLPack exchange table when it has one, else the package's hook), an int, or an
/// object with `.cuda_stream` (`torch.cuda.Stream`).
pub fn stream(py: Python<'_>, stream: Option<&Bound<'_, PyAny>>, ordinal: u32) -> PyResult<u64> {
    match stream.filter(|s| !s.is_none()) {
        None => match crate::dlpack::current_stream(py, ordinal) {
            Some(handle) => Ok(handle),
            None => hooks(py)?.call_method1(intern!(py, "current_stream"), (ordinal,))?.extract(),
        },
        Some(s) => {
            if let Ok(handle) = s.extract::<u64>() {
                return Ok(handle);
            }
            match s.getattr(intern!(py, "cuda_stream")) {
                Ok(h) => h.extract(),
                Err(_) => Err(type_error(format!(
                    "stream: {} is not a stream (an int or an object with .cuda_stream)",
                    s.get_type().name()?
                ))),
            }
        }
    }
}

/// A new torch tensor of `shape` and type `dtype` (a name) on CUDA device `ordinal`, zeroed when
/// `zeroed`; `like` is an input of the call (only torch tensors make allocations possible).
pub fn alloc<'py>(
    py: Python<'py>,
    like: &Bound<'py, PyAny>,
    shape: &[usize],
    dtype: &str,
    ordinal: u32,
    zeroed: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let shape = PyTuple::new(py, shape)?;
    let name = if zeroed { intern!(py, "zeros") } else { intern!(py, "empty") };
    hooks(py)?.call_method1(name, (like, shape, dtype, ordinal))
}

/// Plain scales `[rows, K/16]` converted to a flat blocked `uint8` tensor on the same device.
pub fn to_blocked<'py>(py: Python<'py>, plain: &Bound<'py, PyAny>, rows: usize) -> PyResult<Bound<'py, PyAny>> {
    hooks(py)?.call_method1(intern!(py, "to_blocked"), (plain, rows))
}

/// Every expert's plain scales `[E, N, K/16]` as blocked scales back to back (flat `uint8`).
pub fn experts_to_blocked<'py>(
    py: Python<'py>,
    plain: &Bound<'py, PyAny>,
    experts: usize,
) -> PyResult<Bound<'py, PyAny>> {
    hooks(py)?.call_method1(intern!(py, "experts_to_blocked"), (plain, experts))
}
