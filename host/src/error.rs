//! The library's error type: every failure is a value that says what was wrong and where.

use crate::rules::Limit;
use cudarc::driver::DriverError;
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
    /// A CUDA driver call failed ([`std::error::Error::source`]: the driver's error).
    Driver {
        /// What the library was doing.
        during: &'static str,
        /// The driver's error.
        error: DriverError,
        /// What the call was given, where that helps (e.g. a tensor map's parameters), or empty.
        detail: String,
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
    /// A shape exceeds a limit of the library ([`crate::rules`]: what the kernels index, what a
    /// device holds, what the planner takes on); nothing was planned.
    TooLarge {
        /// The group at fault (`None` for a problem-wide field such as the group count).
        group: Option<usize>,
        /// The field at fault (`"m"`, `"c"`, `"tiles"`, ...).
        field: &'static str,
        /// Its value (for running totals such as bytes or tiles: the total up to this group).
        value: u64,
        /// The limit it exceeds.
        limit: Limit,
    },
    /// An output of a call shares bytes with another buffer of the call (an input, or another
    /// output of any group); nothing was launched. Inputs may share memory with each other.
    Overlap {
        /// The call (`"run"`, `"run_stacked"`, `"moe run"`, `"quantize"`, ...).
        call: &'static str,
        /// The output.
        output: BufferName,
        /// The buffer it overlaps.
        other: BufferName,
    },
    /// An argument has the wrong type (a tensor of another element type, a value of another
    /// kind); nothing was launched.
    WrongType {
        /// The call.
        call: &'static str,
        /// The group, for per-group arguments.
        group: Option<usize>,
        /// The argument.
        field: &'static str,
        /// What it is and what was expected.
        reason: String,
    },
    /// A call inside a CUDA graph capture that the plan cannot take there (it would have to
    /// allocate); nothing was captured. Call the plan once outside capture first.
    Capture(String),
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

/// One buffer of a call, as errors name it: its group (for per-group buffers) and its field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferName {
    /// The group, for per-group buffers.
    pub group: Option<usize>,
    /// The field (`"c"`, `"a.values"`, `"scales"`, ...).
    pub field: &'static str,
}

impl fmt::Display for BufferName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.group {
            Some(g) => write!(f, "group {g} `{}`", self.field),
            None => write!(f, "`{}`", self.field),
        }
    }
}

/// [`Error::InvalidArgument`]: `call`'s argument `field`, and why it is refused.
pub(crate) fn invalid(call: &'static str, field: &'static str, reason: impl Into<String>) -> Error {
    Error::InvalidArgument { call, field, reason: reason.into() }
}

impl Error {
    pub(crate) fn driver(during: &'static str, error: DriverError) -> Self {
        Error::Driver { during, error, detail: String::new() }
    }

    pub(crate) fn driver_detail(during: &'static str, error: DriverError, detail: String) -> Self {
        Error::Driver { during, error, detail }
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
            Error::Driver { during, error, detail } => {
                write!(f, "CUDA driver error while {during}: {error}")?;
                if !detail.is_empty() {
                    write!(f, " ({detail})")?;
                }
                Ok(())
            }
            Error::InvalidGroup { group, field, reason } => write!(f, "group {group}: `{field}`: {reason}"),
            Error::InvalidProblem(reason) => write!(f, "invalid problem: {reason}"),
            Error::Unsupported(what) => write!(f, "unsupported: {what}"),
            Error::Capture(why) => write!(f, "inside CUDA graph capture: {why}"),
            Error::WrongType { group: Some(g), field, reason, .. } => write!(f, "group {g}: `{field}`: {reason}"),
            Error::WrongType { call, group: None, field, reason } => write!(f, "{call}: `{field}`: {reason}"),
            Error::InvalidArgument { call, field, reason } => write!(f, "{call}: `{field}`: {reason}"),
            Error::TooLarge { group, field, value, limit } => {
                if let Some(g) = group {
                    write!(f, "group {g}: ")?;
                }
                let what = if limit.is_total() { "brings the problem's total to" } else { "is" };
                write!(f, "`{field}` {what} {value}; {limit}")
            }
            Error::Overlap { call, output, other } => {
                write!(f, "{call}: the output {output} overlaps {other} (an output may share no byte with another buffer)")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Driver { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// Shorthand for this library's results.
pub type Result<T> = std::result::Result<T, Error>;

/// `Ok` when `value` is within `limit`, else [`Error::TooLarge`] naming `group` and `field`.
pub(crate) fn within(group: Option<usize>, field: &'static str, value: u64, limit: Limit) -> Result<()> {
    if value <= limit.max() {
        Ok(())
    } else {
        Err(Error::TooLarge { group, field, value, limit })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys::CUresult;
    use std::error::Error as _;

    /// (Formatting a `DriverError` asks the driver for its text, so this test does not.)
    #[test]
    fn driver_errors_keep_their_source() {
        let code = DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        let e = Error::driver("allocating", code);
        assert_eq!(e.source().and_then(|s| s.downcast_ref::<DriverError>()), Some(&code));
        let d = Error::driver_detail("encoding a tensor map", code, "box 64 x 128".into());
        assert!(matches!(&d, Error::Driver { detail, .. } if detail == "box 64 x 128"));
        assert_eq!(d.source().and_then(|s| s.downcast_ref::<DriverError>()), Some(&code));
        assert!(Error::InvalidProblem("x".into()).source().is_none());
    }
}
