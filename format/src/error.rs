//! The crate's error type.

use core::fmt;

/// Why a shape, buffer or input was rejected. Every fallible function in this crate returns this
/// instead of panicking on bad input.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum FormatError {
    /// `k` (values per row) is zero or not a multiple of `multiple` (16 for an NVFP4 matrix, one
    /// scale per 16 values; 64 for the grouped GEMM, one 4-scale word per 64 values).
    BadK {
        /// The rejected K.
        k: usize,
        /// The multiple K must be.
        multiple: usize,
    },
    /// A buffer has the wrong length for its shape.
    BadLength {
        /// Which buffer.
        what: &'static str,
        /// The length the shape implies.
        expected: usize,
        /// The length given.
        actual: usize,
    },
    /// A dimension is too large (the scale-layout arithmetic is 32-bit, as on the device).
    TooLarge {
        /// Which dimension.
        what: &'static str,
        /// Its value.
        value: usize,
    },
    /// In one group of a grouped GEMM, A and B have different K.
    KMismatch {
        /// The group's index.
        group: usize,
        /// A's K.
        a_k: usize,
        /// B's K.
        b_k: usize,
    },
    /// Two lists that must correspond (results and references, say) differ in length or shape.
    ShapeMismatch {
        /// What was being compared.
        what: &'static str,
        /// The group, where it applies.
        group: Option<usize>,
        /// The expected size.
        expected: usize,
        /// The size given.
        actual: usize,
    },
    /// The quantizer's input holds a NaN or an infinity (at this flat index).
    NonFinite {
        /// Row-major index of the first non-finite value.
        index: usize,
    },
    /// A global scale that is not finite and positive.
    BadGlobalScale {
        /// The rejected value.
        value: f32,
    },
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadK { k, multiple } => {
                write!(f, "K = {k} must be a positive multiple of {multiple}")
            }
            Self::BadLength { what, expected, actual } => {
                write!(f, "{what}: expected {expected} bytes/elements, got {actual}")
            }
            Self::TooLarge { what, value } => {
                write!(f, "{what} = {value} is too large (must fit in u32)")
            }
            Self::KMismatch { group, a_k, b_k } => {
                write!(f, "group {group}: A has K = {a_k} but B has K = {b_k}")
            }
            Self::ShapeMismatch { what, group, expected, actual } => {
                write!(f, "{what}")?;
                if let Some(g) = group {
                    write!(f, " (group {g})")?;
                }
                write!(f, ": expected {expected}, got {actual}")
            }
            Self::NonFinite { index } => {
                write!(f, "input element {index} is not finite")
            }
            Self::BadGlobalScale { value } => {
                write!(f, "global scale {value} is not finite and positive")
            }
        }
    }
}

impl std::error::Error for FormatError {}
