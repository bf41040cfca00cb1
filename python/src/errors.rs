//! The library's errors as Python exceptions, by kind, with the library's text.

use nvfp4_gemm::Error;
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::PyErr;

create_exception!(_native, CudaError, PyRuntimeError, "A CUDA driver call failed.");
create_exception!(_native, NoDriverError, PyRuntimeError, "No CUDA driver (libcuda.so.1) could be loaded.");
create_exception!(_native, UnsupportedError, PyRuntimeError, "The device or operation is not supported.");
create_exception!(
    _native,
    CaptureError,
    PyRuntimeError,
    "A call inside CUDA graph capture that would have to allocate: run it once outside capture first."
);

/// The library's error as the Python exception of its kind: a wrong type is a `TypeError`, a
/// wrong value a `ValueError`, the device's and the driver's failures their own exceptions.
pub fn py_err(e: Error) -> PyErr {
    let text = e.to_string();
    match e {
        Error::NoDriver => NoDriverError::new_err(text),
        Error::UnsupportedArch { .. } | Error::Unsupported(_) => UnsupportedError::new_err(text),
        Error::Driver { .. } => CudaError::new_err(text),
        Error::Capture(_) => CaptureError::new_err(text),
        Error::WrongType { .. } => PyTypeError::new_err(text),
        _ => PyValueError::new_err(text),
    }
}

/// A `ValueError` of the Python-level arguments (their count, their kind of value).
pub fn value_error(text: String) -> PyErr {
    PyValueError::new_err(text)
}

/// A `TypeError` of the Python-level arguments.
pub fn type_error(text: String) -> PyErr {
    PyTypeError::new_err(text)
}
