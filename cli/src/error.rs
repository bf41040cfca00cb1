//! The tool's error type: every way a command can fail, with a message that names the file, the
//! tensor and what was expected.

use std::fmt;
use std::path::PathBuf;

/// Why a command failed. Nothing in this crate panics on bad input; it returns one of these.
#[derive(Debug)]
pub enum CliError {
    /// The command line is wrong.
    Usage(String),
    /// A file could not be read or written.
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        error: std::io::Error,
    },
    /// An error inside a given file (wraps the others with the file's name).
    InFile {
        /// The file.
        path: PathBuf,
        /// The error.
        error: Box<CliError>,
    },
    /// The bytes are not a safetensors file.
    NotSafetensors(String),
    /// A safetensors header whose tensors do not end where the file ends.
    Length {
        /// Bytes the header describes (header and tensor data).
        declared: usize,
        /// Bytes in the file.
        actual: usize,
    },
    /// The file holds no `g0.a` (no groups at all).
    NoGroups,
    /// A tensor name that is not part of the format.
    UnexpectedTensor {
        /// The name.
        name: String,
        /// What names are allowed.
        reason: String,
    },
    /// A required tensor is absent.
    MissingTensor {
        /// The name that was looked for.
        name: String,
        /// Its dtype and shape.
        expected: String,
    },
    /// A tensor has the wrong element type.
    WrongDtype {
        /// The tensor.
        name: String,
        /// Its dtype.
        got: String,
        /// The accepted dtypes.
        expected: String,
    },
    /// A tensor has the wrong shape.
    WrongShape {
        /// The tensor.
        name: String,
        /// Its shape.
        got: Vec<usize>,
        /// The accepted shapes, with the sizes filled in where known.
        expected: String,
    },
    /// A tensor's shape or value breaks a rule of the library (k a multiple of 64, n a multiple of
    /// 8, finite alpha, A and B sharing k).
    Invalid {
        /// The tensor (or group) at fault.
        name: String,
        /// The rule.
        reason: String,
    },
    /// No usable GPU on this machine.
    NoGpu(String),
    /// The GPU library failed.
    Gpu(String),
}

impl CliError {
    /// Attaches a file name.
    pub fn in_file(self, path: impl Into<PathBuf>) -> CliError {
        match self {
            e @ (CliError::Io { .. } | CliError::InFile { .. } | CliError::NoGpu(_) | CliError::Gpu(_)) => e,
            e => CliError::InFile { path: path.into(), error: Box::new(e) },
        }
    }

    /// The innermost error (without the file name).
    pub fn root(&self) -> &CliError {
        match self {
            CliError::InFile { error, .. } => error.root(),
            e => e,
        }
    }

    /// Process exit code: 2 for every error (1 is a failed comparison, 0 success).
    pub fn exit_code(&self) -> u8 {
        2
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Usage(m) => write!(f, "{m} (see `nvfp4-gemm --help`)"),
            CliError::Io { path, error } => write!(f, "{}: {error}", path.display()),
            CliError::InFile { path, error } => write!(f, "{}: {error}", path.display()),
            CliError::NotSafetensors(reason) => write!(f, "not a safetensors file: {reason}"),
            CliError::Length { declared, actual } if actual < declared => write!(
                f,
                "the file is truncated: its header describes {declared} bytes, the file has {actual} (an \
                 interrupted write or copy?)"
            ),
            CliError::Length { declared, actual } => {
                write!(f, "the file has {} bytes after the {declared} its header describes", actual - declared)
            }
            CliError::NoGroups => {
                write!(f, "no groups: the file has no tensor `g0.a` (see `nvfp4-gemm --help` for the format)")
            }
            CliError::UnexpectedTensor { name, reason } => write!(f, "unexpected tensor `{name}`: {reason}"),
            CliError::MissingTensor { name, expected } => write!(f, "missing tensor `{name}` (expected {expected})"),
            CliError::WrongDtype { name, got, expected } => {
                write!(f, "tensor `{name}` has dtype {got}; expected {expected}")
            }
            CliError::WrongShape { name, got, expected } => {
                write!(f, "tensor `{name}` has shape {got:?}; expected {expected}")
            }
            CliError::Invalid { name, reason } => write!(f, "`{name}`: {reason}"),
            CliError::NoGpu(reason) => write!(f, "no usable GPU: {reason}"),
            CliError::Gpu(reason) => write!(f, "GPU error: {reason}"),
        }
    }
}

impl std::error::Error for CliError {}
