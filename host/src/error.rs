//! The library's error type: every failure is a value that says what was wrong and where.

use std::fmt;

/// Everything that can go wrong before or during a launch.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// The CUDA driver library (`libcuda.so.1`) could not be loaded: no NVIDIA driver on this machine.
    NoDriver,
    /// The device is not one this library has kernels for (sm_90 Hopper or sm_100 Blackwell).
    UnsupportedArch {
        /// Compute capability major version.
        major: i32,
        /// Compute capability minor version.
        minor: i32,
        /// The device's name.
        name: String,
    },
    /// A CUDA driver call failed.
    Driver {
        /// What the library was doing.
        during: &'static str,
        /// The driver's error.
        error: String,
    },
    /// One group's description is invalid; nothing was launched.
    InvalidGroup {
        /// Index of the offending group.
        group: usize,
        /// The field at fault (`"a.values"`, `"k"`, ...).
        field: &'static str,
        /// Why it is rejected.
        reason: String,
    },
    /// The problem as a whole is invalid (e.g. too many groups); nothing was launched.
    InvalidProblem(String),
    /// The device does not support this operation (yet); nothing was launched.
    Unsupported(String),
    /// An argument of a single-tensor call (quantize, dequantize) is invalid; nothing was launched.
    InvalidArgument {
        /// The call (`"quantize"`, `"dequantize"`).
        call: &'static str,
        /// The argument at fault (`"k"`, `"scales"`, ...).
        field: &'static str,
        /// Why it is rejected.
        reason: String,
    },
}

impl Error {
    pub(crate) fn driver(during: &'static str, e: impl fmt::Display) -> Self {
        Error::Driver { during, error: e.to_string() }
    }

    pub(crate) fn group(group: usize, field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidGroup { group, field, reason: reason.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoDriver => write!(f, "no CUDA driver: libcuda.so.1 could not be loaded"),
            Error::UnsupportedArch { major, minor, name } => write!(
                f,
                "{name} has compute capability {major}.{minor}; this library has kernels for 9.0 (sm_90a) and 10.0 (sm_100a)"
            ),
            Error::Driver { during, error } => write!(f, "CUDA driver error while {during}: {error}"),
            Error::InvalidGroup { group, field, reason } => write!(f, "group {group}: `{field}`: {reason}"),
            Error::InvalidProblem(reason) => write!(f, "invalid problem: {reason}"),
            Error::Unsupported(what) => write!(f, "unsupported: {what}"),
            Error::InvalidArgument { call, field, reason } => write!(f, "{call}: `{field}`: {reason}"),
        }
    }
}

impl std::error::Error for Error {}

/// Shorthand for this library's results.
pub type Result<T> = std::result::Result<T, Error>;
